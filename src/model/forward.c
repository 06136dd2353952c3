/*
 * The forward pass: batched prefill on fixed row tiles, and single-token decode.
 *
 * Prefill works on tiles of T rows aligned to absolute positions: tile k holds positions
 * [kT, kT + T). A prefill of positions [s, n) visits tiles floor(s/T) .. floor((n-1)/T); in
 * each, rows outside [s, n) are zero padding. Every BLAS call of a tile has the same shape
 * whatever s and n are (M = T rows; attention K/V width L = kT + T), and a row's position
 * inside the call is its absolute position mod T. OpenBLAS's result for one output row depends
 * on the call's shape, the thread count and the row's place in the call (its micro-kernels treat
 * edge rows differently; measured: a row moved within a call, or a call with a different row
 * count, can change the last bits), but never on the values in other rows. So a position gets
 * bit-identical activations, K/V and logits whether it was computed in a cold prefill of the
 * whole prompt or in a warm prefill that starts after a cached prefix. Pad rows stay exactly
 * zero through every layer (RMSNorm of 0 is 0, SwiGLU of 0 is 0, their attention rows are
 * zeroed), so they cost FLOPs but never produce NaNs.
 *
 * Two refinements of the projections (Q|K|V, Wo, W1|W3, W2: 70% of a cold prefill's time at
 * M = T = 64, where OpenBLAS reaches about 75% of its square-matrix rate) keep that argument
 * but rest on a property of the BLAS that the engine checks at creation for its exact calls
 * (ikv__prefill_group_check: each thread's calls, random rows, bit comparison) and uses only
 * where it holds; otherwise it makes one whole-tile call per tile as above:
 *  - group: G whole tiles (8) in one call per thread and projection (M = G T, ~95% of the
 *    square rate), used where each row gets the bits of its own tile's call;
 *  - trim: a tile alone (the first one when it starts with cached rows, the last one, a warm
 *    prefill's only one) on its computed rows rounded out to multiples of 16, used where each
 *    row gets the bits of its whole tile's call. Its other rows are then not computed (stale
 *    values, never read by a computed row: attention zeroes their score rows).
 * Attention stays tile by tile on whole tiles. The prefill goes layer by layer, and within a
 * layer tile by tile in position order (the K/V a tile's attention reads were written by the
 * tiles before it in the same layer).
 *
 * Threads. Both passes run on the engine's worker pool (pool.c: nth threads, the caller being
 * thread 0) as a fixed sequence of fork-join regions; in each, thread t takes a share of the
 * work given only by (t, nth) and the shapes, never by timing, and calls single-threaded
 * BLAS on it. So for a fixed thread count every call has a fixed shape and every row a fixed
 * place in its call, and the argument above holds per thread count. Per group of tiles and layer
 * (regions separated by ---; "cols" = output columns of the sgemm split in nth contiguous
 * ranges, "rows" = the group's rows split likewise, "heads" = kv heads split likewise):
 *
 *   rows:  (layer 0: embedding rows) xb = RMSNorm(x)
 *   ---
 *   cols of [q|k|v], at head boundaries:     q, k, v = xb Wq^T, xb Wk^T, xb Wv^T (sgemm, M = G T)
 *   ---
 *   for each tile of the group, a region:
 *   heads: for each kv head g of the thread, with its kvmul = n_heads / n_kv_heads query heads:
 *     RoPE(q heads of g, k head g) at each computed row's position
 *     K/V of g of computed rows -> their blocks, through the sequence's block table
 *     Kc, Vc = K/V of g at positions [0, kT+T), gathered through the block table (from the
 *              blocks, whether cached or just written); zero past the last computed row
 *     S = (Q_g Kc^T) / sqrt(head_dim)        sgemm, (kvmul T) x (kT + T), the query heads stacked
 *     causal softmax of each computed row    fixed-order loops (softmax_row); masked and pad
 *                                            entries exactly 0
 *     att_g = S Vc                           sgemm
 *   ---
 *   cols:  x += att Wo^T
 *   ---
 *   rows:  xb = RMSNorm(x)
 *   ---
 *   cols:  hb = silu(xb W1^T) * (xb W3^T)    two sgemm on the same columns, SwiGLU on them
 *   ---
 *   cols:  x += hb W2^T
 *
 * (6 + G regions per group and layer: about 1.3 us each with 2 threads on this machine,
 * against ~4 ms of work per tile.) RoPE rotates pairs within a head, so doing it head by head is
 * the same arithmetic as doing it row by row.
 *
 * Decode is one position: matrix-vector products by gemv_rows (8-lane FMA on the AVX2 path,
 * 4-lane SSE2 otherwise) with one fixed summation order per row, split by output rows;
 * attention (dc_attn) split by chunks of positions of a fixed size, each chunk an online
 * softmax over its blocks that reads a block's K and V of every head of the layer in one pass,
 * the chunks merged in order before Wo. Each output element is computed the same way whichever
 * thread computes it, so given the same K/V decode gives the same bits at any thread count
 * (tested). The RMSNorm before a projection, and the merge of the attention chunks, are
 * computed by every thread into its own buffer (the same bits everywhere), which saves
 * regions. Per layer:
 *
 *   rows of [q|k|v] at head boundaries: RMSNorm; q, k, v; RoPE; K/V -> the block
 *   --- chunks of positions: attention --- rows of dim: merge; x += Wo att --- rows of hidden:
 *   RMSNorm, W1, W3, SwiGLU --- rows of dim: x += W2 hb
 *
 * then the final RMSNorm and the classifier split by vocabulary rows. Nothing here allocates.
 *
 * Batches of >= 4 rows on an AVX-512 CPU (a draft verification is one sequence's 1 + k rows in
 * one such step) take batch kernels with exactly the per-row arithmetic above, only scheduled
 * across rows (batch512.c, linear.c; ikv__batch512_on): the weight products in 4 x 4 tiles, the
 * attention of each group of up to 16 rows of one sequence with the rows as vector lanes
 * (dc_attn_rows: units of (group, chunk) split between threads by cost), RMSNorm of 16 rows and
 * a 16-lane SwiGLU. A one-row step keeps the 8-lane kernels (faster there, measured).
 *
 * Int8 weights (llama2.c version 2, m->gs > 0): every weight product goes through one dispatch,
 * `matvec` in decode and `proj_mul` in prefill, to quant.c's kernels (runq.c's arithmetic: the
 * input row quantized per group, int32 group sums scaled and added in group order), which give
 * a row the same bits whatever rows share the call; the embedding row is dequantized. The
 * shapes, partitions and regions above stay as they are, and so does every exactness argument
 * (the int8 prefill projections make no BLAS call at all). See docs/engine.md, "Int8 weights".
 */
#include "internal.h"

#include "blas.h"
#include <math.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- softmax ------------------------------------------------------------------------------
 * exp(r) for r <= 0 as 2^n * e^f, n = round(r / ln 2), f = r - n ln 2 (Cody-Waite split), e^f
 * by a degree-7 polynomial (Cephes expf coefficients; relative error ~1e-7 on [-ln2/2, ln2/2]);
 * r is clamped to [-87, 0] (e^-87 ~ 1.6e-38, nothing next to the row maximum's 1; the upper
 * clamp and the NaN -> -87 rule only matter for a corrupt checkpoint's inf/NaN weights, whose
 * conversion to int would otherwise be undefined; found by tests/fuzz/fuzz_checkpoint.c). The SSE2
 * lanes and the scalar tail do the same operations in the same order (C11 mode: no FMA
 * contraction), so a value's result does not depend on which path computed it. libm's expf costs a
 * call per attention entry; this is 4 entries per few instructions. The AVX2 + FMA path uses the
 * same algorithm with fused multiply-adds on every one of its lanes (exp_neg8, exp_neg_fma1,
 * batch512.c's exp_neg16; exp_neg picks the one-lane exp of the path in use). Both versions are
 * within 1 ulp of the double-precision exp on [-87, 0] (tests/test_verify.c, test_exp_paths:
 * 0.969 and 0.979 ulp at most over every 256th float of the range). The constants are
 * internal.h's EXP_*, shared with batch512.c. */

static inline float exp_neg_scalar(float r) {
    r = r > -87.0f ? r : -87.0f; /* NaN too: a NaN never reaches the int conversion below */
    r = r < 0.0f ? r : 0.0f;     /* +inf (a row of infinities in a corrupt checkpoint) too */
    float n = (r * EXP_LOG2E + EXP_MAGIC) - EXP_MAGIC;
    float f = (r - n * EXP_C1) - n * EXP_C2;
    float p = EXP_H0;
    p = p * f + EXP_H1;
    p = p * f + EXP_H2;
    p = p * f + EXP_H3;
    p = p * f + EXP_H4;
    p = p * f + EXP_H5;
    p = (p * (f * f) + f) + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float sc;
    memcpy(&sc, &e, sizeof sc);
    return p * sc;
}

#if defined(__SSE2__)
/* exp_neg_scalar on 4 lanes, operation for operation. */
static inline __m128 exp_neg4(__m128 r) {
    r = _mm_max_ps(r, _mm_set1_ps(-87.0f));
    r = _mm_min_ps(r, _mm_setzero_ps());
    const __m128 mag = _mm_set1_ps(EXP_MAGIC);
    __m128 nn = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(r, _mm_set1_ps(EXP_LOG2E)), mag), mag);
    __m128 f = _mm_sub_ps(_mm_sub_ps(r, _mm_mul_ps(nn, _mm_set1_ps(EXP_C1))),
                          _mm_mul_ps(nn, _mm_set1_ps(EXP_C2)));
    __m128 p = _mm_set1_ps(EXP_H0);
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(EXP_H1));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(EXP_H2));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(EXP_H3));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(EXP_H4));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(EXP_H5));
    p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(p, _mm_mul_ps(f, f)), f), _mm_set1_ps(1.0f));
    __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(nn), _mm_set1_epi32(127)), 23);
    return _mm_mul_ps(p, _mm_castsi128_ps(e));
}
#endif

/* row[0..n) = exp(row[i] - max(row)) in place; returns their sum. Max and sum use 4 partial
 * lanes combined in a fixed order: deterministic for a given n. Does not allocate. */
static float softmax_exp_sse(float *row, size_t n) {
    size_t i = 0;
    float mx = row[0], sum = 0.0f;
#if defined(__SSE2__)
    if (n >= 8) {
        __m128 m4 = _mm_loadu_ps(row);
        for (i = 4; i + 4 <= n; i += 4)
            m4 = _mm_max_ps(m4, _mm_loadu_ps(row + i));
        float l[4];
        _mm_storeu_ps(l, m4);
        mx = l[0] > l[1] ? l[0] : l[1];
        mx = mx > l[2] ? mx : l[2];
        mx = mx > l[3] ? mx : l[3];
    }
    for (; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    const __m128 vmx = _mm_set1_ps(mx);
    __m128 s4 = _mm_setzero_ps();
    for (i = 0; i + 4 <= n; i += 4) {
        __m128 v = exp_neg4(_mm_sub_ps(_mm_loadu_ps(row + i), vmx));
        _mm_storeu_ps(row + i, v);
        s4 = _mm_add_ps(s4, v);
    }
    float l[4];
    _mm_storeu_ps(l, s4);
    sum = (l[0] + l[1]) + (l[2] + l[3]);
#else
    for (i = 1; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    i = 0;
#endif
    for (; i < n; i++) {
        row[i] = exp_neg_scalar(row[i] - mx);
        sum += row[i];
    }
    return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
/* The AVX2 + FMA path's exp (exp_neg_scalar's algorithm with fused multiply-adds: n =
 * fma(r, log2 e, 1.5 2^23) - 1.5 2^23, f = fnma(n, C2, fnma(n, C1, r)), Horner steps
 * p = fma(p, f, c), p = fma(p, f * f, f) + 1, times 2^n built in the exponent bits): 18 vector
 * operations instead of 30, so the exp that every (row, key, head) of attention pays is about
 * half the work (measured: attention of a 128-row verify on stories260K ~10% faster). Every
 * path of the AVX2 mode takes it: 8 lanes here, 16 lanes in batch512.c (exp_neg16) and one
 * lane (exp_neg_fma1) for the tails and the online softmax's rescales, each FMA rounded once
 * as on the others, so a value's exp has the same bits on all of them (tests/test_verify.c,
 * test_exp_paths, compares them on 4.4 million inputs of [-87, 0]). Accuracy, measured there
 * against the double exp of the same input: at most 0.979 ulp (the no-FMA version: 0.969). */
__attribute__((target("avx2,fma"))) static inline __m256 exp_neg8(__m256 r) {
    r = _mm256_max_ps(r, _mm256_set1_ps(-87.0f));
    r = _mm256_min_ps(r, _mm256_setzero_ps());
    const __m256 mag = _mm256_set1_ps(EXP_MAGIC);
    const __m256 nn = _mm256_sub_ps(_mm256_fmadd_ps(r, _mm256_set1_ps(EXP_LOG2E), mag), mag);
    __m256 f = _mm256_fnmadd_ps(nn, _mm256_set1_ps(EXP_C1), r);
    f = _mm256_fnmadd_ps(nn, _mm256_set1_ps(EXP_C2), f);
    __m256 p = _mm256_set1_ps(EXP_H0);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP_H1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP_H2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP_H3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP_H4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP_H5));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(f, f), f), _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(nn), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* exp_neg8 on one lane (scalar SSE operations with FMA), operation for operation. */
__attribute__((target("avx2,fma"))) static inline float exp_neg_fma1(float x) {
    __m128 r = _mm_set_ss(x);
    r = _mm_max_ss(r, _mm_set_ss(-87.0f)); /* NaN -> -87, as maxps with the NaN first */
    r = _mm_min_ss(r, _mm_setzero_ps());
    const __m128 mag = _mm_set_ss(EXP_MAGIC);
    const __m128 nn = _mm_sub_ss(_mm_fmadd_ss(r, _mm_set_ss(EXP_LOG2E), mag), mag);
    __m128 f = _mm_fnmadd_ss(nn, _mm_set_ss(EXP_C1), r);
    f = _mm_fnmadd_ss(nn, _mm_set_ss(EXP_C2), f);
    __m128 p = _mm_set_ss(EXP_H0);
    p = _mm_fmadd_ss(p, f, _mm_set_ss(EXP_H1));
    p = _mm_fmadd_ss(p, f, _mm_set_ss(EXP_H2));
    p = _mm_fmadd_ss(p, f, _mm_set_ss(EXP_H3));
    p = _mm_fmadd_ss(p, f, _mm_set_ss(EXP_H4));
    p = _mm_fmadd_ss(p, f, _mm_set_ss(EXP_H5));
    p = _mm_add_ss(_mm_fmadd_ss(p, _mm_mul_ss(f, f), f), _mm_set_ss(1.0f));
    const __m128i e =
        _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(nn), _mm_set1_epi32(127)), 23);
    return _mm_cvtss_f32(_mm_mul_ss(p, _mm_castsi128_ps(e)));
}

/* softmax_exp_sse on 8 lanes: max over 8 partial lanes, exp, sum over 8 partial lanes, each
 * combined in a fixed order, then the scalar tail. Deterministic for a given n (a different
 * function from the SSE2 one: a machine uses one of them for everything). */
__attribute__((target("avx2,fma"))) static float softmax_exp_avx2(float *row, size_t n) {
    size_t i = 0;
    float mx = row[0], sum = 0.0f, l[8];
    if (n >= 16) {
        __m256 m8 = _mm256_loadu_ps(row);
        for (i = 8; i + 8 <= n; i += 8)
            m8 = _mm256_max_ps(m8, _mm256_loadu_ps(row + i));
        _mm256_storeu_ps(l, m8);
        mx = l[0];
        for (int j = 1; j < 8; j++)
            mx = mx > l[j] ? mx : l[j];
    }
    for (; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(row + i), vmx));
        _mm256_storeu_ps(row + i, v);
        s8 = _mm256_add_ps(s8, v);
    }
    _mm256_storeu_ps(l, s8);
    sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++) {
        row[i] = exp_neg_fma1(row[i] - mx);
        sum += row[i];
    }
    return sum;
}
#endif

/* Whether this CPU takes the AVX2 paths: decided once per process (so every row of every run
 * takes the same path), or forced by ikv__simd_force (tests, before any engine runs). */
static int avx2_mode = -1;

void ikv__simd_force(int avx2) {
    avx2_mode = avx2 < 0 ? -1 : avx2 ? 1 : 0;
}

int ikv__use_avx2(void) {
#ifdef HAVE_AVX2_PATH
    if (avx2_mode < 0)
        avx2_mode = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
    return avx2_mode;
#else
    return 0;
#endif
}

static int use_avx2(void) {
    return ikv__use_avx2();
}

/* exp(r) for r <= 0 as the path in use computes it: exp_neg_fma1 on the AVX2 path (the bits of
 * its 8- and 16-lane exps), exp_neg_scalar on the SSE2 one (the bits of exp_neg4). */
static inline float exp_neg(float r) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return exp_neg_fma1(r);
#endif
    return exp_neg_scalar(r);
}

#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2,fma"))) static size_t exp_neg8_buf(const float *x, size_t n,
                                                                float *o) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, exp_neg8(_mm256_loadu_ps(x + i)));
    return i;
}
#endif

void ikv__exp_neg_paths(const float *x, size_t n, float *o1, float *o8) {
    size_t i = 0;
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) i = exp_neg8_buf(x, n, o8);
#endif
#if defined(__SSE2__)
    if (!use_avx2())
        for (; i + 4 <= n; i += 4)
            _mm_storeu_ps(o8 + i, exp_neg4(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++)
        o8[i] = exp_neg(x[i]);
    for (i = 0; i < n; i++)
        o1[i] = exp_neg(x[i]);
}

/* row[0..n) = exp(row - max) unnormalized; returns the sum. */
static float softmax_exp(float *row, size_t n) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return softmax_exp_avx2(row, n);
#endif
    return softmax_exp_sse(row, n);
}

/* row[0..n) = exp(row - mx) for a given mx >= every row[i]; returns their sum. The exps are
 * exp_neg8 / exp_neg4 lanes and the scalar tail (the same bits for a value on any of them); the
 * sum, 8 (AVX2) or 4 (SSE2) partial lanes combined in a fixed order, then the tail: one fixed
 * order for a given n. Decode's online softmax, a block of scores at a time. */
#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2,fma"))) static float exp_shift_sum_avx2(float *row, size_t n,
                                                                    float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(row + i), vmx));
        _mm256_storeu_ps(row + i, v);
        s8 = _mm256_add_ps(s8, v);
    }
    float l[8], sum;
    _mm256_storeu_ps(l, s8);
    sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++) {
        row[i] = exp_neg_fma1(row[i] - mx);
        sum += row[i];
    }
    return sum;
}
#endif

static float exp_shift_sum(float *row, size_t n, float mx) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) return exp_shift_sum_avx2(row, n, mx);
#endif
    size_t i = 0;
    float sum = 0.0f;
#if defined(__SSE2__)
    const __m128 vmx = _mm_set1_ps(mx);
    __m128 s4 = _mm_setzero_ps();
    for (; i + 4 <= n; i += 4) {
        __m128 v = exp_neg4(_mm_sub_ps(_mm_loadu_ps(row + i), vmx));
        _mm_storeu_ps(row + i, v);
        s4 = _mm_add_ps(s4, v);
    }
    float l[4];
    _mm_storeu_ps(l, s4);
    sum = (l[0] + l[1]) + (l[2] + l[3]);
#endif
    for (; i < n; i++) {
        row[i] = exp_neg_scalar(row[i] - mx);
        sum += row[i];
    }
    return sum;
}

void ikv__rope_init(struct ikv_engine *e) {
    const struct ikv_model *m = e->m;
    int hs = m->head_dim;
    for (int pos = 0; pos < m->cfg.seq_len; pos++)
        for (int i = 0; i < hs; i += 2) {
            /* the same float arithmetic as llama2.c's run.c */
            float freq = 1.0f / powf(10000.0f, (float)i / (float)hs);
            float val = (float)pos * freq;
            e->rope_cos[(size_t)pos * (size_t)(hs / 2) + (size_t)(i / 2)] = cosf(val);
            e->rope_sin[(size_t)pos * (size_t)(hs / 2) + (size_t)(i / 2)] = sinf(val);
        }
}

/* Dot product of n floats: 16 partial sums (4 vectors of 4 lanes) combined in a fixed order. */
static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    float r = 0.0f;
#if defined(__SSE2__)
    /* four independent accumulators: the add latency chain is what bounds a short dot */
    __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps(), s2 = _mm_setzero_ps(),
           s3 = _mm_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i)));
        s1 = _mm_add_ps(s1, _mm_mul_ps(_mm_loadu_ps(a + i + 4), _mm_loadu_ps(b + i + 4)));
        s2 = _mm_add_ps(s2, _mm_mul_ps(_mm_loadu_ps(a + i + 8), _mm_loadu_ps(b + i + 8)));
        s3 = _mm_add_ps(s3, _mm_mul_ps(_mm_loadu_ps(a + i + 12), _mm_loadu_ps(b + i + 12)));
    }
    for (; i + 4 <= n; i += 4)
        s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i)));
    __m128 s4 = _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3));
    float l[4];
    _mm_storeu_ps(l, s4);
    r = (l[0] + l[1]) + (l[2] + l[3]);
#endif
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* dot(a0, b, n) and dot(a1, b, n) at once, sharing each load of b: the same operations in the
 * same order as dot() for each, so the same bits. */
static inline void dot2_sse(const float *a0, const float *a1, const float *b, int n, float *r0,
                            float *r1) {
    int i = 0;
    float x0 = 0.0f, x1 = 0.0f;
#if defined(__SSE2__)
    __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;
    for (; i + 16 <= n; i += 16) {
        __m128 b0 = _mm_loadu_ps(b + i), b1 = _mm_loadu_ps(b + i + 4), b2 = _mm_loadu_ps(b + i + 8),
               b3 = _mm_loadu_ps(b + i + 12);
        s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_loadu_ps(a0 + i), b0));
        s1 = _mm_add_ps(s1, _mm_mul_ps(_mm_loadu_ps(a0 + i + 4), b1));
        s2 = _mm_add_ps(s2, _mm_mul_ps(_mm_loadu_ps(a0 + i + 8), b2));
        s3 = _mm_add_ps(s3, _mm_mul_ps(_mm_loadu_ps(a0 + i + 12), b3));
        t0 = _mm_add_ps(t0, _mm_mul_ps(_mm_loadu_ps(a1 + i), b0));
        t1 = _mm_add_ps(t1, _mm_mul_ps(_mm_loadu_ps(a1 + i + 4), b1));
        t2 = _mm_add_ps(t2, _mm_mul_ps(_mm_loadu_ps(a1 + i + 8), b2));
        t3 = _mm_add_ps(t3, _mm_mul_ps(_mm_loadu_ps(a1 + i + 12), b3));
    }
    for (; i + 4 <= n; i += 4) {
        __m128 b0 = _mm_loadu_ps(b + i);
        s0 = _mm_add_ps(s0, _mm_mul_ps(_mm_loadu_ps(a0 + i), b0));
        t0 = _mm_add_ps(t0, _mm_mul_ps(_mm_loadu_ps(a1 + i), b0));
    }
    float l[4];
    _mm_storeu_ps(l, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
    x0 = (l[0] + l[1]) + (l[2] + l[3]);
    _mm_storeu_ps(l, _mm_add_ps(_mm_add_ps(t0, t1), _mm_add_ps(t2, t3)));
    x1 = (l[0] + l[1]) + (l[2] + l[3]);
#endif
    for (; i < n; i++)
        x0 += a0[i] * b[i], x1 += a1[i] * b[i];
    *r0 = x0, *r1 = x1;
}

/* o[0..n) += p[i] * V[i][0..n) for i = 0..cnt-1 in that order (V rows of stride ld): the
 * weighted sum of one block's values. Sixteen (then four) columns at a time stay in registers
 * across the block's rows instead of being stored and reloaded per row; per element it is
 * o = o + p[i] * v, in the order of i, whichever path handles the column. */
static inline void pv_block(float *o, const float *p, const float *V, size_t cnt, int n, int ld) {
    int c = 0;
#if defined(__SSE2__)
    for (; c + 16 <= n; c += 16) {
        __m128 o0 = _mm_loadu_ps(o + c), o1 = _mm_loadu_ps(o + c + 4), o2 = _mm_loadu_ps(o + c + 8),
               o3 = _mm_loadu_ps(o + c + 12);
        for (size_t i = 0; i < cnt; i++) {
            const float *v = V + i * (size_t)ld + c;
            __m128 a = _mm_set1_ps(p[i]);
            o0 = _mm_add_ps(o0, _mm_mul_ps(a, _mm_loadu_ps(v)));
            o1 = _mm_add_ps(o1, _mm_mul_ps(a, _mm_loadu_ps(v + 4)));
            o2 = _mm_add_ps(o2, _mm_mul_ps(a, _mm_loadu_ps(v + 8)));
            o3 = _mm_add_ps(o3, _mm_mul_ps(a, _mm_loadu_ps(v + 12)));
        }
        _mm_storeu_ps(o + c, o0), _mm_storeu_ps(o + c + 4, o1);
        _mm_storeu_ps(o + c + 8, o2), _mm_storeu_ps(o + c + 12, o3);
    }
    for (; c + 4 <= n; c += 4) {
        __m128 o0 = _mm_loadu_ps(o + c);
        for (size_t i = 0; i < cnt; i++)
            o0 =
                _mm_add_ps(o0, _mm_mul_ps(_mm_set1_ps(p[i]), _mm_loadu_ps(V + i * (size_t)ld + c)));
        _mm_storeu_ps(o + c, o0);
    }
#endif
    for (; c < n; c++) {
        float o0 = o[c];
        for (size_t i = 0; i < cnt; i++)
            o0 = o0 + p[i] * V[i * (size_t)ld + (size_t)c];
        o[c] = o0;
    }
}

/* pv_block for two outputs with their own weights over the same value rows, sharing each load
 * of V: per element the same operations in the same order as pv_block. */
static inline void pv_block2_sse(float *o, float *u, const float *p, const float *pu,
                                 const float *V, size_t cnt, int n) {
    int c = 0;
#if defined(__SSE2__)
    for (; c + 16 <= n; c += 16) {
        __m128 o0 = _mm_loadu_ps(o + c), o1 = _mm_loadu_ps(o + c + 4), o2 = _mm_loadu_ps(o + c + 8),
               o3 = _mm_loadu_ps(o + c + 12);
        __m128 u0 = _mm_loadu_ps(u + c), u1 = _mm_loadu_ps(u + c + 4), u2 = _mm_loadu_ps(u + c + 8),
               u3 = _mm_loadu_ps(u + c + 12);
        for (size_t i = 0; i < cnt; i++) {
            const float *v = V + i * (size_t)n + c;
            __m128 a = _mm_set1_ps(p[i]), b = _mm_set1_ps(pu[i]);
            __m128 v0 = _mm_loadu_ps(v), v1 = _mm_loadu_ps(v + 4), v2 = _mm_loadu_ps(v + 8),
                   v3 = _mm_loadu_ps(v + 12);
            o0 = _mm_add_ps(o0, _mm_mul_ps(a, v0));
            o1 = _mm_add_ps(o1, _mm_mul_ps(a, v1));
            o2 = _mm_add_ps(o2, _mm_mul_ps(a, v2));
            o3 = _mm_add_ps(o3, _mm_mul_ps(a, v3));
            u0 = _mm_add_ps(u0, _mm_mul_ps(b, v0));
            u1 = _mm_add_ps(u1, _mm_mul_ps(b, v1));
            u2 = _mm_add_ps(u2, _mm_mul_ps(b, v2));
            u3 = _mm_add_ps(u3, _mm_mul_ps(b, v3));
        }
        _mm_storeu_ps(o + c, o0), _mm_storeu_ps(o + c + 4, o1);
        _mm_storeu_ps(o + c + 8, o2), _mm_storeu_ps(o + c + 12, o3);
        _mm_storeu_ps(u + c, u0), _mm_storeu_ps(u + c + 4, u1);
        _mm_storeu_ps(u + c + 8, u2), _mm_storeu_ps(u + c + 12, u3);
    }
#endif
    if (c < n) {
        pv_block(o + c, p, V + c, cnt, n - c, n);
        pv_block(u + c, pu, V + c, cnt, n - c, n);
    }
}

#ifdef HAVE_AVX2_PATH
/* Horizontal sum of 8 lanes in a fixed order. */
__attribute__((target("avx2"))) static inline float hsum8(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* dot2 on 8 lanes: per product, 4 partial sums of 8 lanes (elements i mod 32), 8-wide steps
 * into the first, a scalar tail. Decode's scores on an AVX2 machine; one path per process. */
__attribute__((target("avx2"))) static void dot2_avx2(const float *a0, const float *a1,
                                                      const float *b, int n, float *r0, float *r1) {
    int i = 0;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, t0 = s0, t1 = s0, t2 = s0, t3 = s0;
    for (; i + 32 <= n; i += 32) {
        __m256 b0 = _mm256_loadu_ps(b + i), b1 = _mm256_loadu_ps(b + i + 8),
               b2 = _mm256_loadu_ps(b + i + 16), b3 = _mm256_loadu_ps(b + i + 24);
        s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(a0 + i), b0));
        s1 = _mm256_add_ps(s1, _mm256_mul_ps(_mm256_loadu_ps(a0 + i + 8), b1));
        s2 = _mm256_add_ps(s2, _mm256_mul_ps(_mm256_loadu_ps(a0 + i + 16), b2));
        s3 = _mm256_add_ps(s3, _mm256_mul_ps(_mm256_loadu_ps(a0 + i + 24), b3));
        t0 = _mm256_add_ps(t0, _mm256_mul_ps(_mm256_loadu_ps(a1 + i), b0));
        t1 = _mm256_add_ps(t1, _mm256_mul_ps(_mm256_loadu_ps(a1 + i + 8), b1));
        t2 = _mm256_add_ps(t2, _mm256_mul_ps(_mm256_loadu_ps(a1 + i + 16), b2));
        t3 = _mm256_add_ps(t3, _mm256_mul_ps(_mm256_loadu_ps(a1 + i + 24), b3));
    }
    for (; i + 8 <= n; i += 8) {
        __m256 b0 = _mm256_loadu_ps(b + i);
        s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(a0 + i), b0));
        t0 = _mm256_add_ps(t0, _mm256_mul_ps(_mm256_loadu_ps(a1 + i), b0));
    }
    float x0 = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    float x1 = hsum8(_mm256_add_ps(_mm256_add_ps(t0, t1), _mm256_add_ps(t2, t3)));
    for (; i < n; i++)
        x0 += a0[i] * b[i], x1 += a1[i] * b[i];
    *r0 = x0, *r1 = x1;
}

/* pv_block2 on 8 lanes, 32 then 8 columns at a time; per element the same operations in the
 * same order as pv_block (o = o + p[i] * v, no FMA), so the same bits as the SSE2 path. */
__attribute__((target("avx2"))) static void pv_block2_avx2(float *o, float *u, const float *p,
                                                           const float *pu, const float *V,
                                                           size_t cnt, int n) {
    int c = 0;
    for (; c + 32 <= n; c += 32) {
        __m256 o0 = _mm256_loadu_ps(o + c), o1 = _mm256_loadu_ps(o + c + 8),
               o2 = _mm256_loadu_ps(o + c + 16), o3 = _mm256_loadu_ps(o + c + 24);
        __m256 u0 = _mm256_loadu_ps(u + c), u1 = _mm256_loadu_ps(u + c + 8),
               u2 = _mm256_loadu_ps(u + c + 16), u3 = _mm256_loadu_ps(u + c + 24);
        for (size_t i = 0; i < cnt; i++) {
            const float *v = V + i * (size_t)n + c;
            __m256 a = _mm256_set1_ps(p[i]), b = _mm256_set1_ps(pu[i]);
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8),
                   v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
            o0 = _mm256_add_ps(o0, _mm256_mul_ps(a, v0));
            o1 = _mm256_add_ps(o1, _mm256_mul_ps(a, v1));
            o2 = _mm256_add_ps(o2, _mm256_mul_ps(a, v2));
            o3 = _mm256_add_ps(o3, _mm256_mul_ps(a, v3));
            u0 = _mm256_add_ps(u0, _mm256_mul_ps(b, v0));
            u1 = _mm256_add_ps(u1, _mm256_mul_ps(b, v1));
            u2 = _mm256_add_ps(u2, _mm256_mul_ps(b, v2));
            u3 = _mm256_add_ps(u3, _mm256_mul_ps(b, v3));
        }
        _mm256_storeu_ps(o + c, o0), _mm256_storeu_ps(o + c + 8, o1);
        _mm256_storeu_ps(o + c + 16, o2), _mm256_storeu_ps(o + c + 24, o3);
        _mm256_storeu_ps(u + c, u0), _mm256_storeu_ps(u + c + 8, u1);
        _mm256_storeu_ps(u + c + 16, u2), _mm256_storeu_ps(u + c + 24, u3);
    }
    for (; c + 8 <= n; c += 8) {
        __m256 o0 = _mm256_loadu_ps(o + c), u0 = _mm256_loadu_ps(u + c);
        for (size_t i = 0; i < cnt; i++) {
            __m256 v0 = _mm256_loadu_ps(V + i * (size_t)n + c);
            o0 = _mm256_add_ps(o0, _mm256_mul_ps(_mm256_set1_ps(p[i]), v0));
            u0 = _mm256_add_ps(u0, _mm256_mul_ps(_mm256_set1_ps(pu[i]), v0));
        }
        _mm256_storeu_ps(o + c, o0), _mm256_storeu_ps(u + c, u0);
    }
    if (c < n) {
        pv_block(o + c, p, V + c, cnt, n - c, n);
        pv_block(u + c, pu, V + c, cnt, n - c, n);
    }
}
#endif

#ifdef HAVE_AVX2_PATH
/* Decode scores on the AVX2 path, with FMA: for NQ query heads (1 or 2) against a block's
 * key rows K[0..cnt) (row stride hd, hd a multiple of 8), out_h[i] = scale * (q_h . K[i]).
 * Keys go 8 (one head) or 4 (two heads) at a time, each (head, key) pair in its own 8-lane
 * accumulator (an FMA chain over the 8-float chunks of hd), so the 8 accumulators are reduced
 * together by one hadd tree into a vector of 8 scores instead of one horizontal sum per key:
 * per score ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) over its lanes, the same for every
 * key wherever it sits in its group (a last group shorter than 4 or 8 reuses the last key row
 * for the missing ones and drops their results). Given q and K, the same bits on any thread. */
__attribute__((target("avx2,fma"))) static inline __m256
hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

__attribute__((target("avx2,fma"))) static void
scores1_fma(const float *q, const float *K, size_t cnt, int hd, float scale, float *out) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (size_t j = 0; j < cnt; j += 8) {
        const float *k[8];
        for (size_t i = 0; i < 8; i++)
            k[i] = K + (j + i < cnt ? j + i : cnt - 1) * (size_t)hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
               a7 = a0;
        for (int c = 0; c < hd; c += 8) {
            __m256 x = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[0] + c), a0);
            a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[1] + c), a1);
            a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[2] + c), a2);
            a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[3] + c), a3);
            a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[4] + c), a4);
            a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[5] + c), a5);
            a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[6] + c), a6);
            a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[7] + c), a7);
        }
        __m256 v = _mm256_mul_ps(hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7), sc);
        if (j + 8 <= cnt) {
            _mm256_storeu_ps(out + j, v);
        } else {
            float t[8];
            _mm256_storeu_ps(t, v);
            memcpy(out + j, t, sizeof(float) * (cnt - j));
        }
    }
}

__attribute__((target("avx2,fma"))) static void scores2_fma(const float *q0, const float *q1,
                                                            const float *K, size_t cnt, int hd,
                                                            float scale, float *out0, float *out1) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (size_t j = 0; j < cnt; j += 4) {
        const float *k[4];
        for (size_t i = 0; i < 4; i++)
            k[i] = K + (j + i < cnt ? j + i : cnt - 1) * (size_t)hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
               b3 = a0;
        for (int c = 0; c < hd; c += 8) {
            __m256 x = _mm256_loadu_ps(q0 + c), y = _mm256_loadu_ps(q1 + c);
            __m256 kk = _mm256_loadu_ps(k[0] + c);
            a0 = _mm256_fmadd_ps(x, kk, a0), b0 = _mm256_fmadd_ps(y, kk, b0);
            kk = _mm256_loadu_ps(k[1] + c);
            a1 = _mm256_fmadd_ps(x, kk, a1), b1 = _mm256_fmadd_ps(y, kk, b1);
            kk = _mm256_loadu_ps(k[2] + c);
            a2 = _mm256_fmadd_ps(x, kk, a2), b2 = _mm256_fmadd_ps(y, kk, b2);
            kk = _mm256_loadu_ps(k[3] + c);
            a3 = _mm256_fmadd_ps(x, kk, a3), b3 = _mm256_fmadd_ps(y, kk, b3);
        }
        /* lanes 0..3: head 0, keys j..j+3; lanes 4..7: head 1 */
        __m256 v = _mm256_mul_ps(hsum8x8(a0, a1, a2, a3, b0, b1, b2, b3), sc);
        float t[8];
        _mm256_storeu_ps(t, v);
        size_t m = cnt - j < 4 ? cnt - j : 4;
        memcpy(out0 + j, t, sizeof(float) * m);
        memcpy(out1 + j, t + 4, sizeof(float) * m);
    }
}

/* Decode's weighted sum of a block's values on the AVX2 path, with FMA, for NQ = 1 or 2 query
 * heads: o_h[c] = fma(p_h[i], V[i][c], o_h[c]) for i = 0..cnt-1 in order (hd a multiple of 8),
 * 32 then 8 columns at a time held in registers across the block's rows. */
__attribute__((target("avx2,fma"))) static void pv1_fma(float *o, const float *p, const float *V,
                                                        size_t cnt, int hd) {
    int c = 0;
    for (; c + 32 <= hd; c += 32) {
        __m256 o0 = _mm256_loadu_ps(o + c), o1 = _mm256_loadu_ps(o + c + 8),
               o2 = _mm256_loadu_ps(o + c + 16), o3 = _mm256_loadu_ps(o + c + 24);
        for (size_t i = 0; i < cnt; i++) {
            const float *v = V + i * (size_t)hd + c;
            __m256 a = _mm256_set1_ps(p[i]);
            o0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v), o0);
            o1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 8), o1);
            o2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 16), o2);
            o3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + 24), o3);
        }
        _mm256_storeu_ps(o + c, o0), _mm256_storeu_ps(o + c + 8, o1);
        _mm256_storeu_ps(o + c + 16, o2), _mm256_storeu_ps(o + c + 24, o3);
    }
    for (; c < hd; c += 8) {
        __m256 o0 = _mm256_loadu_ps(o + c);
        for (size_t i = 0; i < cnt; i++)
            o0 = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), _mm256_loadu_ps(V + i * (size_t)hd + c), o0);
        _mm256_storeu_ps(o + c, o0);
    }
}

__attribute__((target("avx2,fma"))) static void
pv2_fma(float *o, float *u, const float *p, const float *pu, const float *V, size_t cnt, int hd) {
    int c = 0;
    for (; c + 32 <= hd; c += 32) {
        __m256 o0 = _mm256_loadu_ps(o + c), o1 = _mm256_loadu_ps(o + c + 8),
               o2 = _mm256_loadu_ps(o + c + 16), o3 = _mm256_loadu_ps(o + c + 24);
        __m256 u0 = _mm256_loadu_ps(u + c), u1 = _mm256_loadu_ps(u + c + 8),
               u2 = _mm256_loadu_ps(u + c + 16), u3 = _mm256_loadu_ps(u + c + 24);
        for (size_t i = 0; i < cnt; i++) {
            const float *v = V + i * (size_t)hd + c;
            __m256 a = _mm256_set1_ps(p[i]), b = _mm256_set1_ps(pu[i]);
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8),
                   v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
            o0 = _mm256_fmadd_ps(a, v0, o0), u0 = _mm256_fmadd_ps(b, v0, u0);
            o1 = _mm256_fmadd_ps(a, v1, o1), u1 = _mm256_fmadd_ps(b, v1, u1);
            o2 = _mm256_fmadd_ps(a, v2, o2), u2 = _mm256_fmadd_ps(b, v2, u2);
            o3 = _mm256_fmadd_ps(a, v3, o3), u3 = _mm256_fmadd_ps(b, v3, u3);
        }
        _mm256_storeu_ps(o + c, o0), _mm256_storeu_ps(o + c + 8, o1);
        _mm256_storeu_ps(o + c + 16, o2), _mm256_storeu_ps(o + c + 24, o3);
        _mm256_storeu_ps(u + c, u0), _mm256_storeu_ps(u + c + 8, u1);
        _mm256_storeu_ps(u + c + 16, u2), _mm256_storeu_ps(u + c + 24, u3);
    }
    for (; c < hd; c += 8) {
        __m256 o0 = _mm256_loadu_ps(o + c), u0 = _mm256_loadu_ps(u + c);
        for (size_t i = 0; i < cnt; i++) {
            __m256 v0 = _mm256_loadu_ps(V + i * (size_t)hd + c);
            o0 = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), v0, o0);
            u0 = _mm256_fmadd_ps(_mm256_set1_ps(pu[i]), v0, u0);
        }
        _mm256_storeu_ps(o + c, o0), _mm256_storeu_ps(u + c, u0);
    }
}
#endif

/* The two-query kernels of decode attention, on the path this CPU takes. */
static inline void dot2(const float *a0, const float *a1, const float *b, int n, float *r0,
                        float *r1) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        dot2_avx2(a0, a1, b, n, r0, r1);
        return;
    }
#endif
    dot2_sse(a0, a1, b, n, r0, r1);
}

static inline void pv_block2(float *o, float *u, const float *p, const float *pu, const float *V,
                             size_t cnt, int n) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        pv_block2_avx2(o, u, p, pu, V, cnt, n);
        return;
    }
#endif
    pv_block2_sse(o, u, p, pu, V, cnt, n);
}

/* RMSNorm of one row: o = w * (x / sqrt(mean(x^2) + 1e-5)). */
static void rmsnorm(float *o, const float *x, const float *w, int n) {
    float ss = 0.0f;
    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss /= (float)n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

#ifdef HAVE_AVX2_PATH
/* rope for head sizes and widths that are multiples of 8, 8 floats (4 pairs) at a time: lane
 * 2j gets v0 c - v1 s as v0 c + v1 (-s) (the same bits: the negation is exact), lane 2j + 1
 * gets v1 c + v0 s (the scalar loop's v0 s + v1 c: addition commutes), each product and sum
 * rounded once as in the scalar loop (no FMA). */
__attribute__((target("avx2"))) static void rope_avx2(float *vec, int width, int hs,
                                                      const float *c, const float *sn) {
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256 sgn = _mm256_setr_ps(-1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f);
    for (int k = 0; k < hs; k += 8) { /* pairs k / 2 .. k / 2 + 3 of every head */
        const __m256 c8 = _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_loadu_ps(c + k / 2)), dup);
        const __m256 s8 = _mm256_mul_ps(
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + k / 2)), dup),
            sgn);
        for (int h0 = 0; h0 < width; h0 += hs) {
            float *v = vec + h0 + k;
            const __m256 x = _mm256_loadu_ps(v), xs = _mm256_permute_ps(x, 0xB1);
            _mm256_storeu_ps(v, _mm256_add_ps(_mm256_mul_ps(x, c8), _mm256_mul_ps(xs, s8)));
        }
    }
}
#endif

/* Rotates the (2i, 2i+1) pairs of every head of vec (width `width`) by position pos. */
static void rope(const struct ikv_engine *e, float *vec, int width, size_t pos) {
    int hs = e->m->head_dim;
    const float *c = e->rope_cos + pos * (size_t)(hs / 2),
                *sn = e->rope_sin + pos * (size_t)(hs / 2);
#ifdef HAVE_AVX2_PATH
    if (hs % 8 == 0 && width % hs == 0 && use_avx2()) {
        rope_avx2(vec, width, hs, c, sn);
        return;
    }
#endif
    /* head by head (no division per pair): pair j of every head turns by angle j */
    for (int h0 = 0; h0 < width; h0 += hs)
        for (int j = 0; 2 * j < hs && h0 + 2 * j < width; j++) {
            float *v = vec + h0 + 2 * j;
            float v0 = v[0], v1 = v[1];
            v[0] = v0 * c[j] - v1 * sn[j];
            v[1] = v0 * sn[j] + v1 * c[j];
        }
}

/* ---- matrix products ------------------------------------------------------------------------ */

/* Y[:, n0:n1) = X W[n0:n1)^T for X [M][K] and W [N][K] (row-major (out, in), as stored), given
 * Wn0 = W's row n0; Y has row stride ldy. One single-threaded BLAS call of shape
 * M x (n1 - n0) x K. */
static void gemm_cols(int M, int K, const float *X, const float *Wn0, size_t n0, size_t n1,
                      float *Y, int ldy) {
    if (n1 <= n0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, (int)(n1 - n0), K, 1.0f, X, K, Wn0, K,
                0.0f, Y + n0, ldy);
}

/* ---- weight products: fp32 or int8, one dispatch per matrix -------------------------------- */

/* Layer l of fp32 weight kind k (IKV__QM_*). */
static const float *fp32_w(const struct ikv_model *m, int k, int l) {
    const ikv__weights *w = &m->w;
    const size_t D = (size_t)m->cfg.dim, H = (size_t)m->cfg.hidden_dim, L = (size_t)l;
    const size_t nq = (size_t)m->q_dim, nkv = (size_t)m->kv_dim;
    switch (k) {
    case IKV__QM_Q: return w->wq + L * nq * D;
    case IKV__QM_K: return w->wk + L * nkv * D;
    case IKV__QM_V: return w->wv + L * nkv * D;
    case IKV__QM_O: return w->wo + L * D * nq;
    case IKV__QM_1: return w->w1 + L * H * D;
    case IKV__QM_2: return w->w2 + L * D * H;
    case IKV__QM_3: return w->w3 + L * H * D;
    case IKV__QM_EMB: return w->emb;
    default: return w->wcls;
    }
}

/* Thread t's buffers for a quantized activation row (int8 models). */
static inline ikv__q8act act_buf(const struct ikv_engine *e, int t) {
    const size_t n = e->act_rows * e->act_w;
    ikv__q8act a = {e->aq + (size_t)t * n, e->aa + (size_t)t * n, e->as + (size_t)t * n,
                    e->ac + (size_t)t * n};
    return a;
}

/* Prepares x[0..n) as the input of weight products on thread t: for an int8 model, quantizes
 * it into the thread's buffers (runq.c's per-group quantization); nothing for fp32. */
static inline ikv__q8act act_prep(const struct ikv_engine *e, int t, const float *x, size_t n) {
    ikv__q8act a = act_buf(e, t);
    if (e->m->gs) ikv__q8_quantize(x, n, e->m->gs, &a);
    return a;
}

static void gemv_rows(const float *W, const float *x, float *y, size_t r0, size_t r1, int K);

/* Thread t's packed rows of weight kind k, layer l (int8 models with packing), or NULL. */
static inline const ikv__q8slice *q8slice(const struct ikv_engine *e, int k, int l, int t) {
    if (!e->q8pack) return NULL;
    const ikv__q8slice *sl =
        &e->q8sl[((size_t)l * IKV__QM_KINDS + (size_t)k) * (size_t)e->nth + (size_t)t];
    return sl->n1 > sl->n0 ? sl : NULL;
}

/* y[r0..r1) = W x for weight kind k of layer l on thread t: fp32 gemv_rows on x, or the int8
 * product on xa (x after act_prep): from the thread's packed rows when [r0, r1) lies in them at
 * a block boundary (the matrix-product kernel on one row: the same bits), else the file's
 * layout. Per row the same arithmetic whatever range is computed. */
static inline void matvec(const struct ikv_engine *e, int t, int k, int l, const float *x,
                          const ikv__q8act *xa, float *y, size_t r0, size_t r1) {
    const struct ikv_model *m = e->m;
    const ikv__q8slice *sl = m->gs ? q8slice(e, k, l, t) : NULL;
    if (sl && r0 >= sl->n0 && r1 <= sl->n1 &&
        ikv__q8_gemv_packed(m, k, e->q8pack + sl->off, sl->n0, sl->n1, xa, y, r0, r1))
        return;
    if (m->gs)
        ikv__q8_matvec(m, k, l, xa, y, r0, r1);
    else
        gemv_rows(fp32_w(m, k, l), x, y, r0, r1, k == IKV__QM_2 ? m->cfg.hidden_dim : m->cfg.dim);
}

/* Prepares rows X[i] (i < nb, row stride ldx, n values each) as the inputs of weight products
 * on thread t: for an int8 model, row i quantized into row i of the thread's buffers (stride n);
 * nothing for fp32. */
static inline ikv__q8act act_prep_rows(const struct ikv_engine *e, int t, const float *X,
                                       size_t ldx, size_t nb, size_t n) {
    ikv__q8act a = act_buf(e, t);
    if (e->m->gs) {
        IKV_ASSERT(nb <= e->act_rows);
        for (size_t i = 0; i < nb; i++) {
            const size_t ng = n / (size_t)e->m->gs;
            ikv__q8act r = {a.q + i * n, a.a + i * n, a.s + i * ng, a.c + i * ng};
            ikv__q8_quantize(X + i * ldx, n, e->m->gs, &r);
        }
    }
    return a;
}

/* Y[i][r0..r1) = W X[i] for nb rows and weight kind k of layer l on thread t (batched decode):
 * fp32 ikv__linear_rows on X, or the int8 product on xa (X after act_prep_rows), from the
 * thread's packed rows where [r0, r1) lies in them at a block boundary, else row by row on the
 * file's layout. A row's bits do not depend on nb, the range or the path. */
static inline void linear(const struct ikv_engine *e, int t, int k, int l, const float *X,
                          size_t ldx, const ikv__q8act *xa, size_t nb, float *Y, size_t ldy,
                          size_t r0, size_t r1) {
    const struct ikv_model *m = e->m;
    const size_t K = k == IKV__QM_2 ? (size_t)m->cfg.hidden_dim : (size_t)m->cfg.dim;
    if (!m->gs) {
        ikv__linear_rows(fp32_w(m, k, l), K, r0, r1, X, ldx, nb, Y, ldy);
        return;
    }
    const ikv__q8slice *sl = q8slice(e, k, l, t);
    if (sl && r0 >= sl->n0 && r1 <= sl->n1 &&
        ikv__q8_linear_packed(m, k, e->q8pack + sl->off, sl->n0, sl->n1, xa, nb, Y, ldy, r0, r1))
        return;
    for (size_t i = 0; i < nb; i++) {
        ikv__q8act r = {xa->q + i * K, xa->a + i * K, xa->s + i * K / (size_t)m->gs, NULL};
        ikv__q8_matvec(m, k, l, &r, Y + i * ldy, r0, r1);
    }
}

/* x[0..dim) = the token embedding row of `token` (dequantized for an int8 model). */
static inline void embed_row(const struct ikv_model *m, uint32_t token, float *x) {
    const size_t D = (size_t)m->cfg.dim;
    if (m->gs)
        ikv__q8_dequant_rows(m, IKV__QM_EMB, 0, token, (size_t)token + 1, x);
    else
        memcpy(x, m->w.emb + (size_t)token * D, sizeof(float) * D);
}

/* y[r] = W[r] . x for rows r in [r0, r1) of W [N][K] (decode and logits): the batched seam
 * (linear.c) with one row. One row of W at a time, so W is read as one linear stream, which the
 * hardware prefetcher follows (measured here: 4 rows at a time, sharing each load of x, made 4
 * short streams and read at 14-19 GB/s against 27-31 for this loop and for a plain streaming
 * sum; OpenBLAS's sgemv reached 19-27). A row's result depends only on the row and x, never on
 * the range it was computed in, so decode gives the same bits at any thread count. Does not
 * allocate. */
static void gemv_rows(const float *W, const float *x, float *y, size_t r0, size_t r1, int K) {
    ikv__linear_rows(W, (size_t)K, r0, r1, x, 0, 1, y, 0);
}

/* hb = silu(hb) * hb2, silu(a) = a * sigmoid(a), with sigmoid from t = e^-|a| <= 1 (never
 * overflows): 1 / (1 + t) for a >= 0, t / (1 + t) otherwise. SSE2 lanes and the scalar tail do
 * the same operations. */
#ifdef HAVE_AVX2_PATH
/* swiglu's lanes on 8 lanes (the same operations per element); returns how many it did. */
__attribute__((target("avx2,fma"))) static size_t swiglu_avx2(float *hb, const float *hb2,
                                                               size_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(),
                 sign = _mm256_set1_ps(-0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(hb + i);
        __m256 t = exp_neg8(_mm256_sub_ps(zero, _mm256_andnot_ps(sign, a)));
        __m256 d = _mm256_div_ps(one, _mm256_add_ps(one, t));
        __m256 pos = _mm256_cmp_ps(a, zero, _CMP_GE_OQ);
        __m256 sig =
            _mm256_or_ps(_mm256_and_ps(pos, d), _mm256_andnot_ps(pos, _mm256_mul_ps(t, d)));
        _mm256_storeu_ps(hb + i, _mm256_mul_ps(_mm256_mul_ps(a, sig), _mm256_loadu_ps(hb2 + i)));
    }
    return i;
}
#endif

/* wide: use the 16-lane kernel (batches only where ikv__batch512_on: in a one-row decode step
 * it made the step slower, measured: 5.0 -> 5.4 ms for 128 tokens on stories260K). */
static void swiglu_n(float *hb, const float *hb2, size_t n, int wide) {
    size_t i = 0;
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) {
        if (wide) i = ikv__swiglu512(hb, hb2, n);
        i += swiglu_avx2(hb + i, hb2 + i, n - i);
    }
#endif
#if defined(__SSE2__)
    /* SSE2 path only: exp_neg4 has the bits of exp_neg_scalar, not of the AVX2 path's exp */
    const __m128 one = _mm_set1_ps(1.0f), zero = _mm_setzero_ps(), sign = _mm_set1_ps(-0.0f);
    for (; !use_avx2() && i + 4 <= n; i += 4) {
        __m128 a = _mm_loadu_ps(hb + i);
        __m128 t = exp_neg4(_mm_sub_ps(zero, _mm_andnot_ps(sign, a)));
        __m128 d = _mm_div_ps(one, _mm_add_ps(one, t));
        __m128 pos = _mm_cmpge_ps(a, zero);
        __m128 sig = _mm_or_ps(_mm_and_ps(pos, d), _mm_andnot_ps(pos, _mm_mul_ps(t, d)));
        _mm_storeu_ps(hb + i, _mm_mul_ps(_mm_mul_ps(a, sig), _mm_loadu_ps(hb2 + i)));
    }
#endif
    for (; i < n; i++) {
        float a = hb[i];
        float t = exp_neg(0.0f - fabsf(a));
        float d = 1.0f / (1.0f + t);
        float sig = a >= 0.0f ? d : t * d;
        hb[i] = (a * sig) * hb2[i];
    }
}

/* swiglu on the 8 / 4-lane kernels (prefill, one-row decode). */
static void swiglu(float *hb, const float *hb2, size_t n) {
    swiglu_n(hb, hb2, n, 0);
}

/* ---- fixed partitions ----------------------------------------------------------------------- */

/* Part t of P of [0, n): [n t / P, n (t+1) / P), inner boundaries rounded down to a multiple of
 * `align`. Depends only on (n, t, P, align), never on timing. */
static inline void part(size_t n, int t, int P, size_t align, size_t *a, size_t *b) {
    *a = t == 0 ? 0 : n * (size_t)t / (size_t)P / align * align;
    *b = t == P - 1 ? n : n * (size_t)(t + 1) / (size_t)P / align * align;
}

/* What a region needs: the call's arguments. */
typedef struct fwd {
    struct ikv_engine *e;
    struct ikv_seq *s;
    const uint32_t *tokens;
    size_t t0, lo, hi; /* prefill group: row i is position t0 + i; positions [lo, hi) computed */
    size_t r0, r1;     /* prefill: the rows that go through the projections and row-wise steps */
    size_t tile;       /* prefill attention: the tile's index in the group */
    float *x;          /* prefill: the group's residual rows [rows][dim] */
    size_t pos;        /* decode position */
    size_t nb;         /* decode: batch rows */
    int l;             /* layer */
    const float *xrow; /* logits: residual row */
    float *out;        /* logits: [vocab] */
} fwd;

/* Position p's block and slot in a sequence. */
static inline uint32_t blk_of(const struct ikv_engine *e, const struct ikv_seq *s, size_t p) {
    return s->table[p / e->bt];
}

/* ---- prefill projections ----------------------------------------------------------------------
 */

/* One projection sgemm: Y[:, n0:n1) = X W[n0:n1)^T for X [rows][K] and W [N][K]; Y has row
 * stride ldy. */
typedef struct proj {
    int K, ldy;
    int wk, wl; /* weight kind (IKV__QM_*) and layer */
    const float *X;
    float *Y;
    size_t n0, n1;
} proj;

/* Row n0 of the call's weights as fp32: the model's own rows, or (int8 model) rows [n0, n1)
 * dequantized into thread t's buffer. */
static const float *proj_w(const struct ikv_engine *e, const proj *p, int t) {
    const struct ikv_model *m = e->m;
    if (!m->gs) return fp32_w(m, p->wk, p->wl) + p->n0 * (size_t)p->K;
    if (e->q8_gemm) return NULL; /* int8 products: nothing to dequantize */
    float *buf = e->wdq + (size_t)t * e->wdq_floats;
    IKV_ASSERT((p->n1 - p->n0) * (size_t)p->K <= e->wdq_floats);
    ikv__q8_dequant_rows(m, p->wk, p->wl, p->n0, p->n1, buf);
    return buf;
}

enum { PROJ_QKV, PROJ_WO, PROJ_W13, PROJ_W2, PROJ_KINDS };

/* The sgemm calls thread t of P makes for projection `kind` of layer l (from the engine's
 * scratch rows to its scratch rows): q|k|v split at head boundaries (up to 3 calls), Wo and W2
 * by columns of dim, W1 and W3 on the same columns of hidden (2 calls). The forward pass and
 * the check at engine creation (ikv__prefill_group_check) both take their calls from here.
 * Returns the number of calls. */
static int proj_calls(const struct ikv_engine *e, int kind, int l, int t, int P, proj out[3]) {
    const struct ikv_model *m = e->m;
    const int dim = m->cfg.dim, hid = m->cfg.hidden_dim, qd = m->q_dim, kvd = m->kv_dim;
    const size_t D = (size_t)dim, H = (size_t)hid, nq = (size_t)qd, nkv = (size_t)kvd;
    size_t a, b;
    int n = 0;
    switch (kind) {
    case PROJ_QKV: {
        part(nq + 2 * nkv, t, P, (size_t)m->head_dim, &a, &b);
        size_t qa = a < nq ? a : nq, qb = b < nq ? b : nq;
        size_t ka = a > nq ? a - nq : 0, kb = b > nq ? b - nq : 0;
        ka = ka < nkv ? ka : nkv, kb = kb < nkv ? kb : nkv;
        size_t va = a > nq + nkv ? a - nq - nkv : 0, vb = b > nq + nkv ? b - nq - nkv : 0;
        if (qb > qa) out[n++] = (proj){dim, qd, IKV__QM_Q, l, e->xb, e->q, qa, qb};
        if (kb > ka) out[n++] = (proj){dim, kvd, IKV__QM_K, l, e->xb, e->k, ka, kb};
        if (vb > va) out[n++] = (proj){dim, kvd, IKV__QM_V, l, e->xb, e->v, va, vb};
        break;
    }
    case PROJ_WO:
        part(D, t, P, 16, &a, &b);
        out[n++] = (proj){qd, dim, IKV__QM_O, l, e->att, e->xb, a, b};
        break;
    case PROJ_W13:
        part(H, t, P, 16, &a, &b);
        out[n++] = (proj){dim, hid, IKV__QM_1, l, e->xb, e->hb, a, b};
        out[n++] = (proj){dim, hid, IKV__QM_3, l, e->xb, e->hb2, a, b};
        break;
    default:
        part(D, t, P, 16, &a, &b);
        out[n++] = (proj){hid, dim, IKV__QM_2, l, e->hb, e->xb, a, b};
        break;
    }
    return n;
}

/* Y[:, n0:n1) of call p for M rows X on thread t: sgemm on fp32 weight rows Wn0 (proj_w), or
 * for an int8 model with e->q8_gemm, runq.c's arithmetic row by row (ikv__q8_gemm: each row
 * quantized, then the int8 product; a row's bits do not depend on the call). */
static void proj_mul(const struct ikv_engine *e, const proj *p, int t, const float *Wn0, int M,
                     const float *X, float *Y) {
    if (e->m->gs && e->q8_gemm) {
        ikv__q8act a = act_buf(e, t);
        IKV_ASSERT((size_t)M <= e->act_rows);
        const ikv__q8slice *sl = q8slice(e, p->wk, p->wl, t);
        const uint8_t *pk = sl && sl->n0 == p->n0 && sl->n1 == p->n1 ? e->q8pack + sl->off : NULL;
        ikv__q8_gemm(e->m, p->wk, p->wl, X, (size_t)M, &a, pk, Y, (size_t)p->ldy, p->n0, p->n1);
        return;
    }
    gemm_cols(M, p->K, X, Wn0, p->n0, p->n1, Y, p->ldy);
}

/* Runs the calls of projection `kind` for thread t on rows [r0, r1); leaves them in pc. */
static void proj_run(const struct ikv_engine *e, int kind, int l, int t, int P, size_t r0,
                     size_t r1, proj pc[3]) {
    int n = proj_calls(e, kind, l, t, P, pc);
    for (int i = 0; i < n; i++)
        proj_mul(e, &pc[i], t, proj_w(e, &pc[i], t), (int)(r1 - r0),
                 pc[i].X + r0 * (size_t)pc[i].K, pc[i].Y + r0 * (size_t)pc[i].ldy);
}

size_t ikv__prefill_wdq_floats(const struct ikv_engine *e) {
    size_t mx = 0;
    if (!e->m->gs || e->q8_gemm) return 0;
    for (int t = 0; t < e->nth; t++)
        for (int kind = 0; kind < PROJ_KINDS; kind++) {
            proj pc[3];
            int n = proj_calls(e, kind, 0, t, e->nth, pc);
            for (int i = 0; i < n; i++) {
                size_t f = (pc[i].n1 - pc[i].n0) * (size_t)pc[i].K;
                mx = f > mx ? f : mx;
            }
        }
    return mx;
}

/* Packs (or with dst NULL lays out) one slice: weight rows [n0, n1) of kind k, layer l, thread t. */
static size_t prepack_one(struct ikv_engine *e, int k, int l, int t, size_t n0, size_t n1,
                          uint8_t *dst, size_t off) {
    ikv__q8slice *sl = &e->q8sl[((size_t)l * IKV__QM_KINDS + (size_t)k) * (size_t)e->nth + (size_t)t];
    if (dst) {
        IKV_ASSERT(sl->off == off && sl->n0 == n0 && sl->n1 == n1);
        ikv__q8_pack(e->m, k, l, n0, n1, dst + off);
    } else {
        *sl = (ikv__q8slice){off, n0, n1};
    }
    off += ikv__q8_pack(e->m, k, l, n0, n1, NULL);
    return (off + 63) / 64 * 64;
}

size_t ikv__prefill_q8_prepack(struct ikv_engine *e, uint8_t *dst) {
    size_t off = 0;
    if (!e->m->gs || !e->q8_gemm) return 0;
    for (int l = 0; l < e->m->cfg.n_layers; l++)
        for (int kind = 0; kind < PROJ_KINDS; kind++)
            for (int t = 0; t < e->nth; t++) {
                proj pc[3];
                int n = proj_calls(e, kind, l, t, e->nth, pc);
                for (int i = 0; i < n; i++)
                    off = prepack_one(e, pc[i].wk, l, t, pc[i].n0, pc[i].n1, dst, off);
            }
    /* the classifier, in the rows logits_task gives each thread */
    for (int t = 0; t < e->nth; t++) {
        size_t a, b;
        part((size_t)e->m->cfg.vocab_size, t, e->nth, 16, &a, &b);
        if (b > a) off = prepack_one(e, IKV__QM_CLS, 0, t, a, b, dst, off);
    }
    return off;
}

int ikv__prefill_group_check(const struct ikv_engine *e, uint32_t G, uint32_t TP, uint32_t Q,
                             float *X, float *Y1, float *Y2) {
    const size_t R = (size_t)G * TP;
    int ok = (G > 1 ? 1 : 0) | (Q && TP % Q == 0 && TP > Q ? 2 : 0);
    for (int t = 0; t < e->nth && ok; t++)
        for (int kind = 0; kind < PROJ_KINDS && ok; kind++) {
            proj pc[3];
            int n = proj_calls(e, kind, 0, t, e->nth, pc);
            for (int i = 0; i < n && ok; i++) {
                const proj *c = &pc[i];
                const size_t K = (size_t)c->K, ld = (size_t)c->ldy, w = c->n1 - c->n0;
                const float *W = proj_w(e, c, t);
                uint64_t z = UINT64_C(0x9e3779b97f4a7c15) * (uint64_t)(kind * 3 + i + 1);
                for (size_t j = 0; j < R * K; j++) {
                    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
                    X[j] = (float)(int32_t)(uint32_t)(z >> 32) * (1.0f / 2147483648.0f);
                }
                /* the reference: each tile's TP rows in their own call */
                for (size_t g = 0; g < G; g++)
                    proj_mul(e, c, t, W, (int)TP, X + g * TP * K, Y1 + g * TP * ld);
                if (ok & 1) { /* all G tiles in one call */
                    proj_mul(e, c, t, W, (int)R, X, Y2);
                    for (size_t r = 0; r < R && (ok & 1); r++)
                        if (memcmp(Y1 + r * ld + c->n0, Y2 + r * ld + c->n0, sizeof(float) * w))
                            ok &= ~1;
                }
                /* rows [a, b) of the first tile alone, for a < b multiples of Q */
                for (size_t a = 0; a < TP && (ok & 2); a += Q)
                    for (size_t b = a + Q; b <= TP && (ok & 2); b += Q) {
                        if (a == 0 && b == TP) continue;
                        proj_mul(e, c, t, W, (int)(b - a), X + a * K, Y2 + a * ld);
                        for (size_t r = a; r < b; r++)
                            if (memcmp(Y1 + r * ld + c->n0, Y2 + r * ld + c->n0, sizeof(float) * w))
                                ok &= ~2;
                    }
            }
        }
    return ok;
}

/* ---- prefill regions (one group of tiles, layer c->l) -----------------------------------------
 */

/* Rows split: (layer 0: embedding rows, zero for padding) xb = RMSNorm(x) with rms_att. */
static void pf_norm_att(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim;
    const size_t T = e->T, TP = e->TP;
    size_t a, b;
    part(c->r1 - c->r0, t, P, 1, &a, &b);
    for (size_t i = c->r0 + a; i < c->r0 + b; i++) {
        float *x = c->x + i * D;
        if (c->l == 0) {
            /* row i: tile i / TP of the group, its row i % TP (rows T..TP-1 are padding) */
            size_t p = c->t0 + i / TP * T + i % TP;
            if (i % TP < T && p >= c->lo && p < c->hi)
                embed_row(m, c->tokens[p], x);
            else
                memset(x, 0, sizeof(float) * D);
        }
        rmsnorm(e->xb + i * D, x, m->w.rms_att + (size_t)c->l * D, (int)D);
    }
}

/* Columns of [q | k | v] split (at head boundaries): q, k, v = xb Wq^T, xb Wk^T, xb Wv^T. */
static void pf_qkv(void *vc, int t, int P) {
    const fwd *c = vc;
    proj pc[3];
    proj_run(c->e, PROJ_QKV, c->l, t, P, c->r0, c->r1, pc);
}

/* Kv heads split, one tile (c->tile of the group, positions [t0, t0 + T)): for each kv head g
 * of this thread, RoPE its query heads and its key at each computed row, write its K/V of the
 * computed rows into their blocks, gather its K/V of positions [0, hi) (zero up to t0 + T),
 * then scores, causal softmax and P V for the stacked query heads of g; results into att. */
static void pf_attn(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const int T = (int)e->T, nh = m->cfg.n_heads, nkv = m->cfg.n_kv_heads, hd = m->head_dim;
    const int qd = m->q_dim, kvd = m->kv_dim, kvmul = nh / nkv, l = c->l;
    const size_t H = (size_t)hd, bt = e->bt, r0 = c->tile * e->TP;
    const size_t t0 = c->t0 + c->tile * (size_t)T, lo = c->lo > t0 ? c->lo : t0,
                 hi = c->hi < t0 + (size_t)T ? c->hi : t0 + (size_t)T;
    float *q = e->q + r0 * (size_t)qd, *kk = e->k + r0 * (size_t)kvd;
    const float *vv = e->v + r0 * (size_t)kvd;
    float *att = e->att + r0 * (size_t)qd;
    const int W = (int)(t0 + (size_t)T); /* attention width: keys [0, t0 + T) */
    const int M = kvmul * T;
    const float scale = 1.0f / sqrtf((float)hd);
    float *rinv = e->rinv + (size_t)t * e->S_rows; /* 1 / softmax sum of each row */
    float *S = e->S + (size_t)t * e->S_rows * e->Lmax, *qg = e->qg + (size_t)t * (size_t)M * H;
    size_t g0, g1;
    part((size_t)nkv, t, P, 1, &g0, &g1);
    for (size_t gi = g0; gi < g1; gi++) {
        const int g = (int)gi;
        /* the tile's padding rows T..TP-1 (pitch > T): zero, as a padding row's output is */
        for (size_t i = (size_t)T; i < e->TP; i++)
            memset(att + i * (size_t)qd + gi * (size_t)kvmul * H, 0,
                   sizeof(float) * (size_t)kvmul * H);
        for (size_t p = lo; p < hi; p++) {
            size_t i = p - t0;
            for (int j = 0; j < kvmul; j++)
                rope(e, q + i * (size_t)qd + (size_t)(g * kvmul + j) * H, hd, p);
            float *kr = kk + i * (size_t)kvd + (size_t)g * H;
            rope(e, kr, hd, p);
            uint32_t b = blk_of(e, c->s, p), slot = (uint32_t)(p % bt);
            memcpy(ikv__kv_at(e, b, l, 0, g, slot), kr, sizeof(float) * H);
            memcpy(ikv__kv_at(e, b, l, 1, g, slot), vv + i * (size_t)kvd + (size_t)g * H,
                   sizeof(float) * H);
        }
        if (m->gs) { /* int8 model: runq.c's attention, row by row (runq_ops.c) */
            for (int j = 0; j < kvmul; j++) {
                const size_t hoff = (size_t)(g * kvmul + j) * H;
                for (size_t i = 0; i < (size_t)T; i++)
                    if (t0 + i < lo || t0 + i >= hi)
                        memset(att + i * (size_t)qd + hoff, 0, sizeof(float) * H);
                for (size_t p = lo; p < hi; p += 16) {
                    const int nr = hi - p < 16 ? (int)(hi - p) : 16;
                    ikv__runq_attn_rows(e, c->s, l, g, q + (p - t0) * (size_t)qd + hoff,
                                        (size_t)qd, p, nr, att + (p - t0) * (size_t)qd + hoff,
                                        (size_t)qd, S, e->S_rows * e->Lmax);
                }
            }
            continue;
        }
        float *kc = e->Kc + gi * e->Lmax * H, *vc2 = e->Vc + gi * e->Lmax * H;
        for (size_t p0 = 0; p0 < hi; p0 += bt) {
            size_t cnt = hi - p0 < bt ? hi - p0 : bt;
            uint32_t b = blk_of(e, c->s, p0);
            memcpy(kc + p0 * H, ikv__kv_at(e, b, l, 0, g, 0), sizeof(float) * cnt * H);
            memcpy(vc2 + p0 * H, ikv__kv_at(e, b, l, 1, g, 0), sizeof(float) * cnt * H);
        }
        memset(kc + hi * H, 0, sizeof(float) * ((size_t)W - hi) * H);
        memset(vc2 + hi * H, 0, sizeof(float) * ((size_t)W - hi) * H);
        for (int j = 0; j < kvmul; j++)
            for (int i = 0; i < T; i++)
                memcpy(qg + ((size_t)j * (size_t)T + (size_t)i) * H,
                       q + (size_t)i * (size_t)qd + (size_t)(g * kvmul + j) * H, sizeof(float) * H);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, W, hd, scale, qg, hd, kc, hd, 0.0f,
                    S, W);
        for (int r = 0; r < M; r++) {
            float *row = S + (size_t)r * (size_t)W;
            size_t p = t0 + (size_t)(r % T);
            if (p < lo || p >= hi) {
                memset(row, 0, sizeof(float) * (size_t)W);
                rinv[r] = 0.0f;
                continue;
            }
            size_t nk = p + 1; /* keys 0..p */
            rinv[r] = 1.0f / softmax_exp(row, nk);
            memset(row + nk, 0, sizeof(float) * ((size_t)W - nk));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, W, 1.0f, S, W, vc2, hd, 0.0f,
                    qg, hd);
        /* the softmax's normalization, applied to the head_dim outputs of a row instead of to
         * its up to seq_len probabilities */
        for (int j = 0; j < kvmul; j++)
            for (int i = 0; i < T; i++) {
                float *dst = att + (size_t)i * (size_t)qd + (size_t)(g * kvmul + j) * H;
                const float *src = qg + ((size_t)j * (size_t)T + (size_t)i) * H;
                const float inv = rinv[j * T + i];
                for (size_t d = 0; d < H; d++)
                    dst[d] = src[d] * inv;
            }
    }
}

/* Columns of dim split: x += att Wo^T on this thread's columns. */
static void pf_wo(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const size_t D = (size_t)e->m->cfg.dim;
    proj pc[3];
    proj_run(e, PROJ_WO, c->l, t, P, c->r0, c->r1, pc);
    for (size_t i = c->r0; i < c->r1; i++)
        for (size_t j = pc[0].n0; j < pc[0].n1; j++)
            c->x[i * D + j] += e->xb[i * D + j];
}

/* Rows split: xb = RMSNorm(x) with rms_ffn. */
static void pf_norm_ffn(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const size_t D = (size_t)e->m->cfg.dim;
    size_t a, b;
    part(c->r1 - c->r0, t, P, 1, &a, &b);
    for (size_t i = c->r0 + a; i < c->r0 + b; i++)
        rmsnorm(e->xb + i * D, c->x + i * D, e->m->w.rms_ffn + (size_t)c->l * D, (int)D);
}

/* Columns of hidden split: hb = silu(xb W1^T) * (xb W3^T) on this thread's columns. */
static void pf_ffn13(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const size_t H = (size_t)e->m->cfg.hidden_dim;
    proj pc[3];
    proj_run(e, PROJ_W13, c->l, t, P, c->r0, c->r1, pc);
    for (size_t i = c->r0; i < c->r1; i++)
        (e->m->gs ? ikv__runq_swiglu : swiglu)(e->hb + i * H + pc[0].n0, e->hb2 + i * H + pc[0].n0,
                                               pc[0].n1 - pc[0].n0);
}

/* Columns of dim split: x += hb W2^T on this thread's columns. */
static void pf_w2(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const size_t D = (size_t)e->m->cfg.dim;
    proj pc[3];
    proj_run(e, PROJ_W2, c->l, t, P, c->r0, c->r1, pc);
    for (size_t i = c->r0; i < c->r1; i++)
        for (size_t j = pc[0].n0; j < pc[0].n1; j++)
            c->x[i * D + j] += e->xb[i * D + j];
}

void ikv__prefill(struct ikv_engine *e, struct ikv_seq *s, const uint32_t *tokens, size_t first,
                  size_t n) {
    const size_t T = e->T, TP = e->TP, Q = e->Q, D = (size_t)e->m->cfg.dim;
    const size_t tfirst = first / T * T, ntiles = (n - tfirst + T - 1) / T;
    /* Layer by layer; within a layer, tiles in position order: tile k at layer l needs its own
     * rows from layer l - 1 and the K/V of layer l at positions below its own, which the tiles
     * before it have just written. Projections: a first tile with cached rows at its front
     * alone; then groups of G whole tiles, one sgemm call per thread and projection for the
     * group; the rest tile by tile. A tile takes TP >= T rows of the buffers (its T rows, then
     * padding). A tile alone goes through the projections on its rows [a, b), the computed ones
     * rounded out to multiples of Q, when Q > 0 (else all TP). Attention: tile by tile, on
     * whole tiles. */
    for (int l = 0; l < e->m->cfg.n_layers; l++)
        for (size_t k = 0; k < ntiles;) {
            size_t g = (k > 0 || first == tfirst) && ntiles - k >= e->G ? e->G : 1;
            fwd c = {.e = e, .s = s, .tokens = tokens, .l = l, .r0 = 0, .r1 = g * TP};
            c.t0 = tfirst + k * T;
            c.lo = first > c.t0 ? first : c.t0;
            c.hi = n < c.t0 + g * T ? n : c.t0 + g * T;
            c.x = e->x + k * TP * D;
            if (g == 1 && Q) {
                c.r0 = (c.lo - c.t0) / Q * Q;
                c.r1 = c.r0 + (c.hi - c.t0 - c.r0 + Q - 1) / Q * Q;
            }
            ikv__pool_run(e->pool, pf_norm_att, &c);
            ikv__pool_run(e->pool, pf_qkv, &c);
            for (c.tile = 0; c.tile < g; c.tile++)
                ikv__pool_run(e->pool, pf_attn, &c);
            ikv__pool_run(e->pool, pf_wo, &c);
            ikv__pool_run(e->pool, pf_norm_ffn, &c);
            ikv__pool_run(e->pool, pf_ffn13, &c);
            ikv__pool_run(e->pool, pf_w2, &c);
            k += g;
        }
}

const float *ikv__prefill_row(const struct ikv_engine *e, size_t first, size_t p) {
    const size_t T = e->T, k = (p - first / T * T) / T;
    return e->x + (k * e->TP + p % T) * (size_t)e->m->cfg.dim;
}

/* ---- logits --------------------------------------------------------------------------------- */

/* Vocabulary rows split: each thread normalizes the row into its own buffer (the same bits on
 * every thread) and computes its rows of the classifier. */
static void logits_task(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim;
    float *xn = e->xn + (size_t)t * D;
    size_t a, b;
    part((size_t)m->cfg.vocab_size, t, P, 16, &a, &b);
    rmsnorm(xn, c->xrow, m->w.rms_final, (int)D);
    const ikv__q8act xa = act_prep(e, t, xn, D);
    matvec(e, t, IKV__QM_CLS, 0, xn, &xa, c->out, a, b);
}

void ikv__logits_row(struct ikv_engine *e, const float *xrow, float *out) {
    fwd c = {.e = e, .xrow = xrow, .out = out};
    ikv__pool_run(e->pool, logits_task, &c);
}

/* ---- decode regions (a batch of nb rows, one per sequence; layer c->l) ---------------------
 *
 * Row b of the batch is sequence e->dseq[b] at position e->dpos[b]; its residual row is
 * e->dx[b]. Every region splits its work by a fixed partition of (weight rows | batch rows |
 * attention chunks of all rows) over the threads, and every output element is computed by one
 * loop in one order whichever thread and whichever batch computes it: a sequence's decode gives
 * the same bits alone or batched with any others, at any thread count. */

/* xn[i] = RMSNorm(x[i]) for batch rows i in [a, b) with the weights w. */
static void norm_rows(struct ikv_engine *e, size_t a, size_t b, const float *w) {
    const size_t D = (size_t)e->m->cfg.dim;
    if (b - a >= IKV__AR_LANES && ikv__batch512_on()) /* 16 rows at a time, the same bits */
        for (; a + IKV__AR_LANES <= b; a += IKV__AR_LANES)
            ikv__rmsnorm_rows(e->dxn + a * D, e->dx + a * D, w, D, IKV__AR_LANES, D);
    for (size_t i = a; i < b; i++)
        rmsnorm(e->dxn + i * D, e->dx + i * D, w, (int)D);
}

/* Batch rows split: xn[b] = RMSNorm(x[b]) with the weights c->xrow (rms_att, rms_ffn of the
 * layer, or rms_final). */
static void dc_norm(void *vc, int t, int P) {
    const fwd *c = vc;
    size_t a, b;
    part(c->nb, t, P, 1, &a, &b);
    norm_rows(c->e, a, b, c->xrow);
}

/* The normed rows (weights c->xrow) of every batch row as thread t's products take them: for an
 * int8 model, thread t norms them itself into its own rows of e->dxnt (each thread needs only
 * its quantized copy, so no region of its own and no join before the products: the same
 * rmsnorm on the same rows, so the same bits); for fp32, e->dxn, which dc_norm filled. */
static const float *normed_rows(const fwd *c, int t) {
    struct ikv_engine *e = c->e;
    if (!e->m->gs) return e->dxn;
    const size_t D = (size_t)e->m->cfg.dim;
    float *xn = e->dxnt + (size_t)t * e->dmax * D;
    for (size_t i = 0; i < c->nb; i++)
        rmsnorm(xn + i * D, e->dx + i * D, c->xrow, (int)D);
    return xn;
}

/* x[0..n) += y[0..n), element by element (the residual adds of decode), 8 at a time on AVX2:
 * the same single rounding per element. */
#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2"))) static size_t add_row_avx2(float *x, const float *y, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    return i;
}
#endif

static inline void add_row(float *x, const float *y, size_t n) {
    size_t i = 0;
#ifdef HAVE_AVX2_PATH
    if (use_avx2()) i = add_row_avx2(x, y, n);
#endif
    for (; i < n; i++)
        x[i] += y[i];
}

/* dst[0..n) = src[0..n): a head's K or V row, inline (a libc call per 8 floats cost more than
 * the copy: 5000 calls in a 128-row verify). */
static inline void copy_row(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i];
}

/* x limited to [lo, hi]. */
static inline size_t clampz(size_t x, size_t lo, size_t hi) {
    return x < lo ? lo : x > hi ? hi : x;
}

/* Rows of [q | k | v] split at head boundaries: q, k, v of every batch row; RoPE on its heads;
 * K and V heads written into each row's block. */
static void dc_qkv(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, H = (size_t)m->head_dim, l = (size_t)c->l;
    const size_t nq = (size_t)m->q_dim, nkv = (size_t)m->kv_dim, nb = c->nb;
    size_t a, b;
    part(nq + 2 * nkv, t, P, H, &a, &b);
    const float *xn = normed_rows(c, t);
    const ikv__q8act xa = act_prep_rows(e, t, xn, D, nb, D);
    /* the share's query, key and value rows, each in one product call (a call's shape does
     * not change a row's bits), then RoPE and the K/V writes head by head */
    const size_t qa = clampz(a, 0, nq), qb = clampz(b, 0, nq);
    const size_t ka = clampz(a, nq, nq + nkv) - nq, kb = clampz(b, nq, nq + nkv) - nq;
    const size_t va = clampz(a, nq + nkv, nq + 2 * nkv) - nq - nkv,
                 vb = clampz(b, nq + nkv, nq + 2 * nkv) - nq - nkv;
    if (qb > qa) {
        linear(e, t, IKV__QM_Q, c->l, xn, D, &xa, nb, e->dq, nq, qa, qb);
        for (size_t i = 0; i < nb; i++)
            rope(e, e->dq + i * nq + qa, (int)(qb - qa), e->dpos[i]);
    }
    if (kb > ka) {
        linear(e, t, IKV__QM_K, c->l, xn, D, &xa, nb, e->dk, nkv, ka, kb);
        for (size_t i = 0; i < nb; i++) {
            const size_t pos = e->dpos[i];
            const uint32_t blk = blk_of(e, e->dseq[i], pos), slot = (uint32_t)(pos % e->bt);
            float *kr = e->dk + i * nkv + ka;
            rope(e, kr, (int)(kb - ka), pos);
            for (size_t r = ka; r < kb; r += H)
                copy_row(ikv__kv_at(e, blk, (int)l, 0, (int)(r / H), slot), e->dk + i * nkv + r,
                         H);
        }
    }
    if (vb > va) {
        linear(e, t, IKV__QM_V, c->l, xn, D, &xa, nb, e->dv, nkv, va, vb);
        for (size_t i = 0; i < nb; i++) {
            const size_t pos = e->dpos[i];
            const uint32_t blk = blk_of(e, e->dseq[i], pos), slot = (uint32_t)(pos % e->bt);
            for (size_t r = va; r < vb; r += H)
                copy_row(ikv__kv_at(e, blk, (int)l, 1, (int)(r / H), slot), e->dv + i * nkv + r,
                         H);
        }
    }
}

/* Decode attention.
 *
 * dc_attn, chunks of every batch row split: the positions [0, pos] are cut into chunks of
 * IKV__DC_CHUNK blocks, a cut that depends only on the position, and each thread takes a contiguous
 * range of chunks (a fixed partition). For each of its chunks, block by block, it reads the layer's
 * K of all kv heads (on `small` 16 KiB in one run) and then their V (the next 16 KiB), and keeps
 * per query head an online softmax: the running maximum M, the running sum L of e^(s - M) and the
 * running weighted sum O of value rows, both rescaled by e^(M_old - M) when a block raises M.
 * It leaves (M, L, O) per chunk and head in e->dpart. Reading one block's K and V of every head
 * in one pass is what makes it fast: the blocks lie scattered in the pool, and on this machine
 * a read of 4 KiB runs (one (K|V, head) of a block, what a split by kv heads reads) ran at
 * 9-10 GB/s on one thread, 32 KiB runs at 18, a linear read at 31 (measured; software
 * prefetching did not change it).
 *
 * dc_merge then merges the chunks of every head (attn_merge) and dc_wo applies Wo.
 *
 * Scores and value sums use the FMA kernels above on the AVX2 path (head_dim a multiple of 8),
 * the SSE2 dot products and pv_block otherwise. Every output depends only on the position, the
 * K/V and q (the chunk cut, the order of blocks in a chunk and of chunks in the merge are
 * fixed), never on which thread computed which chunk: given the same K/V, the same bits at any
 * thread count. */
static void attn_chunk(const struct ikv_engine *e, const struct ikv_seq *s, const float *q,
                       size_t pos, int l, size_t ch, float *pc, float *sc) {
    const struct ikv_model *m = e->m;
    const int nh = m->cfg.n_heads, nkv = m->cfg.n_kv_heads, hd = m->head_dim;
    const int kvmul = nh / nkv;
    const size_t bt = e->bt, H = (size_t)hd, nk = pos + 1;
    const size_t nb = (nk + bt - 1) / bt;
    const size_t pstride = H + 2; /* per chunk and head: O[hd], M, L */
    const float scale = 1.0f / sqrtf((float)hd);
    /* [nh][ss] scores of a block: a block has at most min(bt, seq_len) keys, and the thread's
     * S slice holds S_rows >= n_heads rows of Lmax >= seq_len */
    const size_t ss = bt < e->Lmax ? bt : e->Lmax;
#ifdef HAVE_AVX2_PATH
    const int fma = use_avx2() && hd % 8 == 0;
#else
    const int fma = 0;
#endif
    {
        for (int h = 0; h < nh; h++) {
            float *ph = pc + (size_t)h * pstride;
            memset(ph, 0, sizeof(float) * H);
            ph[H] = -INFINITY, ph[H + 1] = 0.0f;
        }
        const size_t jb1 = (ch + 1) * IKV__DC_CHUNK < nb ? (ch + 1) * IKV__DC_CHUNK : nb;
        for (size_t jb = ch * IKV__DC_CHUNK; jb < jb1; jb++) {
            const size_t p0 = jb * bt, cnt = nk - p0 < bt ? nk - p0 : bt;
            const uint32_t blk = s->table[jb];
            /* scores of every query head against the block's keys */
            for (int g = 0; g < nkv; g++) {
                const float *kb = ikv__kv_at(e, blk, l, 0, g, 0);
                int j = 0;
                for (; j + 2 <= kvmul; j += 2) {
                    const int h = g * kvmul + j;
                    const float *q0 = q + (size_t)h * H, *q1 = q0 + H;
                    float *o0 = sc + (size_t)h * ss, *o1 = o0 + ss;
#ifdef HAVE_AVX2_PATH
                    if (fma) {
                        scores2_fma(q0, q1, kb, cnt, hd, scale, o0, o1);
                        continue;
                    }
#endif
                    for (size_t i = 0; i < cnt; i++) {
                        float r0, r1;
                        dot2(q0, q1, kb + i * H, hd, &r0, &r1);
                        o0[i] = r0 * scale, o1[i] = r1 * scale;
                    }
                }
                if (j < kvmul) {
                    const int h = g * kvmul + j;
#ifdef HAVE_AVX2_PATH
                    if (fma) {
                        scores1_fma(q + (size_t)h * H, kb, cnt, hd, scale, sc + (size_t)h * ss);
                        continue;
                    }
#endif
                    for (size_t i = 0; i < cnt; i++)
                        sc[(size_t)h * ss + i] = dot(q + (size_t)h * H, kb + i * H, hd) * scale;
                }
            }
            /* online softmax: raise M, rescale O and L, weights e^(s - M), L += their sum */
            for (int h = 0; h < nh; h++) {
                float *ph = pc + (size_t)h * pstride, *sh = sc + (size_t)h * ss;
                float bm = sh[0];
                for (size_t i = 1; i < cnt; i++)
                    bm = sh[i] > bm ? sh[i] : bm;
                if (bm > ph[H]) {
                    if (ph[H] != -INFINITY) {
                        const float a = exp_neg(ph[H] - bm);
                        for (size_t d = 0; d < H; d++)
                            ph[d] *= a;
                        ph[H + 1] *= a;
                    }
                    ph[H] = bm;
                }
                ph[H + 1] += exp_shift_sum(sh, cnt, ph[H]);
            }
            /* O += weights x the block's value rows */
            for (int g = 0; g < nkv; g++) {
                const float *vb = ikv__kv_at(e, blk, l, 1, g, 0);
                int j = 0;
                for (; j + 2 <= kvmul; j += 2) {
                    const int h = g * kvmul + j;
                    float *o0 = pc + (size_t)h * pstride, *o1 = o0 + pstride;
                    const float *p0w = sc + (size_t)h * ss, *p1w = p0w + ss;
#ifdef HAVE_AVX2_PATH
                    if (fma) {
                        pv2_fma(o0, o1, p0w, p1w, vb, cnt, hd);
                        continue;
                    }
#endif
                    pv_block2(o0, o1, p0w, p1w, vb, cnt, hd);
                }
                if (j < kvmul) {
                    const int h = g * kvmul + j;
                    float *o0 = pc + (size_t)h * pstride;
                    const float *pw = sc + (size_t)h * ss;
#ifdef HAVE_AVX2_PATH
                    if (fma) {
                        pv1_fma(o0, pw, vb, cnt, hd);
                        continue;
                    }
#endif
                    pv_block(o0, pw, vb, cnt, hd, hd);
                }
            }
        }
    }
}

/* The end of the group of batch rows starting at b for the multi-row kernel: the run of rows
 * of b's sequence after it, at most IKV__AR_LANES. */
static size_t ar_group_end(const struct ikv_engine *e, size_t b, size_t nb) {
    size_t g = b + 1;
    while (g < nb && g - b < IKV__AR_LANES && e->dseq[g] == e->dseq[b])
        g++;
    return g;
}

/* dc_attn with the multi-row kernel (batch512.c): the work units are, in batch order, each
 * group of >= IKV__AR_MIN rows of one sequence with all its chunks (the most any of its rows
 * has; one call, so each head's queries are transposed once for all of them), and each chunk
 * of a row outside such groups. Every thread runs every group for its share of the query
 * heads (part(n_heads, t, P): the heads of a group cost the same, so the split is even
 * whatever the groups' sizes; a split of whole (group, chunk) units by cost left one of two
 * threads 30% more work on a 128-row verify, measured). The row units differ in cost (a
 * chunk's blocks) and are split by it: unit u goes to thread floor(P (C_u + c_u / 2) / C), C_u
 * the cost of the row units before it, c_u its own, C their total. Both are fixed partitions
 * given the shapes (no output depends on them). */
static size_t ar_chunk_blocks(const struct ikv_engine *e, size_t pos, size_t ch) {
    const size_t nb = (pos + 1 + e->bt - 1) / e->bt, b0 = ch * IKV__DC_CHUNK;
    return nb <= b0 ? 0 : nb - b0 < IKV__DC_CHUNK ? nb - b0 : IKV__DC_CHUNK;
}

/* The largest position among rows [b, g), and so the most chunks any of them has. */
static size_t ar_max_pos(const struct ikv_engine *e, size_t b, size_t g) {
    size_t mx = 0;
    for (size_t i = b; i < g; i++)
        mx = e->dpos[i] > mx ? e->dpos[i] : mx;
    return mx;
}

static void dc_attn_rows(const fwd *c, int t, int P, float *sc) {
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t nh = (size_t)m->cfg.n_heads, H = (size_t)m->head_dim, qd = (size_t)m->q_dim;
    const size_t nb = c->nb, pd = nh * (H + 2);
    size_t h0, h1;
    part(nh, t, P, 1, &h0, &h1);
    uint64_t total = 0; /* pass 0 runs the group units and adds up the row units' costs, pass 1
                           runs this thread's row units */
    for (int pass = 0; pass < 2; pass++) {
        uint64_t acc = 0;
        for (size_t b = 0, g; b < nb; b = g) {
            g = ar_group_end(e, b, nb);
            if (g - b >= IKV__AR_MIN) {
                if (pass || h1 == h0) continue;
                const size_t mp = ar_max_pos(e, b, g);
                const size_t span = e->bt * IKV__DC_CHUNK, nch = (mp + span) / span;
                float *out[IKV__AR_LANES];
                for (size_t i = b; i < g; i++)
                    out[i - b] = e->dpart + e->dcoff[i] * pd;
                ikv__attn_rows(e, e->dseq[b], c->l, 0, nch, (int)h0, (int)h1, g - b,
                               e->dq + b * qd, qd, e->dpos + b, out, pd, sc);
            } else {
                for (size_t i = b; i < g; i++)
                    for (size_t ch = 0; ch < e->dcoff[i + 1] - e->dcoff[i]; ch++) {
                        const uint64_t cu = ar_chunk_blocks(e, e->dpos[i], ch);
                        if (pass && (int)((uint64_t)P * (2 * acc + cu) / (2 * total)) == t)
                            attn_chunk(e, e->dseq[i], e->dq + i * qd, e->dpos[i], c->l, ch,
                                       e->dpart + (e->dcoff[i] + ch) * pd, sc);
                        acc += cu;
                    }
            }
        }
        total = acc;
        if (!total) return;
    }
}

/* Attention chunks of all batch rows split: item i is chunk i - dcoff[b] of row b (or the
 * multi-row kernel's units, above, where it applies). */
static void dc_attn(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t nh = (size_t)m->cfg.n_heads, H = (size_t)m->head_dim, qd = (size_t)m->q_dim;
    float *sc = e->S + (size_t)t * e->S_rows * e->Lmax;
    if (c->nb >= IKV__AR_MIN && ikv__attn_rows_usable(e)) {
        dc_attn_rows(c, t, P, sc);
        return;
    }
    size_t i0, i1, b = 0;
    part(e->dcoff[c->nb], t, P, 1, &i0, &i1);
    for (size_t i = i0; i < i1; i++) {
        while (e->dcoff[b + 1] <= i)
            b++;
        attn_chunk(e, e->dseq[b], e->dq + b * qd, e->dpos[b], c->l, i - e->dcoff[b],
                   e->dpart + i * nh * (H + 2), sc);
    }
}

/* Int8 model: query heads split (a thread's heads of every batch row), runq.c's attention
 * (runq_ops.c) straight into att[b] (no chunks, no merge). */
static void dc_attn_runq(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t nh = (size_t)m->cfg.n_heads, H = (size_t)m->head_dim, qd = (size_t)m->q_dim;
    float *sc = e->S + (size_t)t * e->S_rows * e->Lmax;
    size_t h0, h1;
    part(nh, t, P, 1, &h0, &h1);
    IKV_ASSERT((h1 - h0) * e->Lmax <= e->S_rows * e->Lmax);
    for (size_t b = 0; b < c->nb && h1 > h0; b++)
        ikv__runq_attn_heads(e, e->dseq[b], c->l, (int)h0, (int)h1, e->dq + b * qd + h0 * H,
                             e->dpos[b], sc, e->datt + b * qd + h0 * H);
}

/* att_h = sum_c O_c e^(M_c - M) / sum_c L_c e^(M_c - M), M = max_c M_c, over the chunks
 * part[0..nch) of dc_attn in order, for every query head h, into out [n_heads][head_dim]. */
#ifdef HAVE_AVX2_PATH
/* The chunk loop of attn_merge for one head on 8 lanes (H a multiple of 8): per element the
 * same operations in the same order (o = o + O_c * a, no FMA; then o * (1 / sum)). */
__attribute__((target("avx2,fma"))) static void merge_head_avx2(const float *ph0, size_t nch,
                                                                size_t cstride, size_t H,
                                                                float mx, float *o) {
    float sum = 0.0f;
    if (H == 8) { /* one register */
        __m256 acc = _mm256_setzero_ps();
        for (size_t ch = 0; ch < nch; ch++) {
            const float *ph = ph0 + ch * cstride;
            const float a = exp_neg_fma1(ph[H] - mx);
            sum += ph[H + 1] * a;
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(ph), _mm256_set1_ps(a)));
        }
        _mm256_storeu_ps(o, _mm256_mul_ps(acc, _mm256_set1_ps(1.0f / sum)));
        return;
    }
    for (size_t d = 0; d < H; d += 8)
        _mm256_storeu_ps(o + d, _mm256_setzero_ps());
    for (size_t ch = 0; ch < nch; ch++) {
        const float *ph = ph0 + ch * cstride;
        const float a = exp_neg_fma1(ph[H] - mx);
        sum += ph[H + 1] * a;
        const __m256 va = _mm256_set1_ps(a);
        for (size_t d = 0; d < H; d += 8)
            _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_loadu_ps(o + d),
                                                  _mm256_mul_ps(_mm256_loadu_ps(ph + d), va)));
    }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (size_t d = 0; d < H; d += 8)
        _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), inv));
}
#endif

static void attn_merge(const struct ikv_engine *e, const float *part_, size_t nch, float *out) {
    const struct ikv_model *m = e->m;
    const size_t nh = (size_t)m->cfg.n_heads, H = (size_t)m->head_dim, pstride = H + 2;
#ifdef HAVE_AVX2_PATH
    const int vec = use_avx2() && H % 8 == 0;
#endif
    for (size_t h = 0; h < nh; h++) {
        float *o = out + h * H, mx = -INFINITY, sum = 0.0f;
        for (size_t ch = 0; ch < nch; ch++) {
            const float mc = part_[(ch * nh + h) * pstride + H];
            mx = mc > mx ? mc : mx;
        }
#ifdef HAVE_AVX2_PATH
        if (vec) { /* o from 0 in registers, written once */
            merge_head_avx2(part_ + h * pstride, nch, nh * pstride, H, mx, o);
            continue;
        }
#endif
        memset(o, 0, sizeof(float) * H);
        for (size_t ch = 0; ch < nch; ch++) {
            const float *ph = part_ + (ch * nh + h) * pstride;
            const float a = exp_neg(ph[H] - mx);
            sum += ph[H + 1] * a;
            for (size_t d = 0; d < H; d++)
                o[d] += ph[d] * a;
        }
        const float inv = 1.0f / sum;
        for (size_t d = 0; d < H; d++)
            o[d] *= inv;
    }
}

/* Batch rows split (by chunks): att[b] = the merge of row b's attention chunks. */
static void dc_merge(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t nh = (size_t)m->cfg.n_heads, H = (size_t)m->head_dim, qd = (size_t)m->q_dim;
    /* rows split by their chunks (a verify's later rows have more): row i goes to thread
     * floor(P (dcoff[i] + dcoff[i + 1]) / (2 dcoff[nb])), a fixed partition */
    const uint64_t tot = 2 * (uint64_t)e->dcoff[c->nb];
    for (size_t i = 0; i < c->nb; i++)
        if ((int)((uint64_t)P * (e->dcoff[i] + e->dcoff[i + 1]) / tot) == t)
            attn_merge(e, e->dpart + e->dcoff[i] * nh * (H + 2), e->dcoff[i + 1] - e->dcoff[i],
                       e->datt + i * qd);
}

/* Rows of dim split: x[b] += Wo att[b] on this thread's rows. */
static void dc_wo(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, qd = (size_t)m->q_dim;
    size_t a, b;
    part(D, t, P, 16, &a, &b);
    const ikv__q8act xa = act_prep_rows(e, t, e->datt, qd, c->nb, qd);
    linear(e, t, IKV__QM_O, c->l, e->datt, qd, &xa, c->nb, e->dxb, D, a, b);
    for (size_t i = 0; i < c->nb; i++)
        add_row(e->dx + i * D + a, e->dxb + i * D + a, b - a);
}

/* Rows of hidden split: hb = silu(W1 xn) * (W3 xn) on this thread's rows, every batch row. */
static void dc_ffn13(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, Hd = (size_t)m->cfg.hidden_dim;
    size_t a, b;
    /* a multiple of 4 rows per share (the AVX-512 tiles); 16 on int8 (its packed blocks) */
    part(Hd, t, P, m->gs ? 16 : 4, &a, &b);
    const float *xn = normed_rows(c, t);
    const ikv__q8act xa = act_prep_rows(e, t, xn, D, c->nb, D);
    linear(e, t, IKV__QM_1, c->l, xn, D, &xa, c->nb, e->dhb, Hd, a, b);
    linear(e, t, IKV__QM_3, c->l, xn, D, &xa, c->nb, e->dhb2, Hd, a, b);
    const int wide = c->nb >= IKV__AR_MIN && ikv__batch512_on();
    for (size_t i = 0; i < c->nb; i++)
        if (m->gs)
            ikv__runq_swiglu(e->dhb + i * Hd + a, e->dhb2 + i * Hd + a, b - a);
        else
            swiglu_n(e->dhb + i * Hd + a, e->dhb2 + i * Hd + a, b - a, wide);
}

/* Rows of dim split: x[b] += W2 hb[b] on this thread's rows. */
static void dc_w2(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, Hd = (size_t)m->cfg.hidden_dim;
    size_t a, b;
    part(D, t, P, 16, &a, &b);
    const ikv__q8act xa = act_prep_rows(e, t, e->dhb, Hd, c->nb, Hd);
    linear(e, t, IKV__QM_2, c->l, e->dhb, Hd, &xa, c->nb, e->dxb, D, a, b);
    for (size_t i = 0; i < c->nb; i++)
        add_row(e->dx + i * D + a, e->dxb + i * D + a, b - a);
}

/* Vocabulary rows split: the classifier on every batch row's normed final row. */
static void dc_logits(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, V = (size_t)m->cfg.vocab_size;
    size_t a, b;
    part(V, t, P, 16, &a, &b);
    const float *xn = normed_rows(c, t);
    const ikv__q8act xa = act_prep_rows(e, t, xn, D, c->nb, D);
    linear(e, t, IKV__QM_CLS, 0, xn, D, &xa, c->nb, e->dlog, V, a, b);
}

/* Steps of fewer multiply-adds than this (rows x (weights + attention)) run on the calling
 * thread alone: on the bundled 260K-weight model a one-row decode step is about 0.3M of them,
 * split into 42 regions of a few microseconds each, where a region's wake and join (about
 * 1.3 us on 2 idle cores, far more on a loaded machine where the worker is off-CPU) cost more
 * than the second thread saves (measured: 128 decode steps took 6 ms on 1 thread and 1.1 s on
 * 2 busy cores). Larger steps (verifies, batches, bigger models) use the pool. */
#define DC_INLINE_MACS (UINT64_C(1) << 20)

/* Runs region fn: inline on the calling thread (inl) or on the pool. */
static void region(struct ikv_engine *e, int inl, ikv__task fn, fwd *c) {
    if (inl)
        fn(c, 0, 1);
    else
        ikv__pool_run(e->pool, fn, c);
}

/* ---- the fused pass: a whole batched step in one region ------------------------------------
 *
 * The regions above split every weight product by its OUTPUT rows, which is what a model whose
 * weights stream from memory needs (each weight read once per step). On a model whose weights
 * sit in cache (the bundled stories260K: 1 MB, in each core's L2) a verify of 128 rows is
 * compute bound and that split costs: 42 regions a pass, every product's 128 input rows read
 * (and, in the AVX-512 kernel, transposed) by both threads, each row's data moving between the
 * cores' caches at every region (measured, 2 threads, per region: Wo and W2 no faster than on
 * one thread, 1.45x on the whole pass). The fused pass splits the BATCH ROWS instead: thread t
 * owns rows [a, b) (part(nb, t, P, 16)) and runs everything that is row-local on them, and the
 * threads meet only where a row needs other rows' results, the K/V of the layer:
 *
 *     rows [a, b): RMSNorm, q | k | v, RoPE, K/V -> the blocks      (layer l)
 *     --- barrier ---  attention: dc_attn (group units split by heads, row units by cost)
 *     --- barrier ---  rows [a, b): merge, x += Wo att, RMSNorm, W1 | W3, SwiGLU, x += W2 hb,
 *                      then layer l + 1's first phase ... and after the last layer the final
 *                      RMSNorm and the classifier
 *
 * one pool region and 2 barriers per layer (ikv__pool_barrier) instead of 8 regions. Every
 * output element is still computed by the same kernel call on the same inputs (a product's row
 * bits do not depend on the rows or the range of the call, linear.c; attention's units write
 * disjoint (row, chunk, head) outputs), so the results are the bits of the region path and of
 * sequential decoding (tests/test_verify.c runs both paths, 1-3 threads). Used for fp32
 * models whose weights fit FZ_WEIGHT_BYTES, steps of >= FZ_MIN_ROWS rows, and only when every
 * pool share has its own thread (a barrier needs that); ikv__fused_force for tests. */
#define FZ_MIN_ROWS     32
#define FZ_WEIGHT_BYTES (UINT64_C(8) << 20) /* larger models keep the output-row split */

static int fz_mode = -1; /* -1: where it applies, 0: never, 1: wherever it can run */

void ikv__fused_force(int on) {
    fz_mode = on < 0 ? -1 : on ? 1 : 0;
}

/* Layer l's first phase on batch rows [a, b): xn = RMSNorm(x), q, k, v, RoPE, K/V written. */
static void fz_qkv(struct ikv_engine *e, int t, int l, size_t a, size_t b) {
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, H = (size_t)m->head_dim, L = (size_t)l;
    const size_t nq = (size_t)m->q_dim, nkv = (size_t)m->kv_dim, n = b - a;
    const ikv__q8act xa = act_buf(e, t); /* unused: fp32 */
    norm_rows(e, a, b, m->w.rms_att + L * D);
    const float *xn = e->dxn + a * D;
    linear(e, t, IKV__QM_Q, l, xn, D, &xa, n, e->dq + a * nq, nq, 0, nq);
    linear(e, t, IKV__QM_K, l, xn, D, &xa, n, e->dk + a * nkv, nkv, 0, nkv);
    linear(e, t, IKV__QM_V, l, xn, D, &xa, n, e->dv + a * nkv, nkv, 0, nkv);
    for (size_t i = a; i < b; i++) {
        const size_t pos = e->dpos[i];
        const uint32_t blk = blk_of(e, e->dseq[i], pos), slot = (uint32_t)(pos % e->bt);
        float *kr = e->dk + i * nkv, *vr = e->dv + i * nkv;
        rope(e, e->dq + i * nq, (int)nq, pos);
        rope(e, kr, (int)nkv, pos);
        for (size_t r = 0; r < nkv; r += H) {
            copy_row(ikv__kv_at(e, blk, l, 0, (int)(r / H), slot), kr + r, H);
            copy_row(ikv__kv_at(e, blk, l, 1, (int)(r / H), slot), vr + r, H);
        }
    }
}

/* Layer l's second phase on batch rows [a, b) of nb: att = the merge of the row's chunks,
 * x += Wo att, xn = RMSNorm(x), hb = SwiGLU(W1 xn, W3 xn), x += W2 hb. */
static void fz_out(struct ikv_engine *e, int t, int l, size_t a, size_t b, size_t nb) {
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, Hd = (size_t)m->cfg.hidden_dim, L = (size_t)l;
    const size_t nh = (size_t)m->cfg.n_heads, H = (size_t)m->head_dim, qd = (size_t)m->q_dim;
    const size_t n = b - a;
    const ikv__q8act xa = act_buf(e, t); /* unused: fp32 */
    for (size_t i = a; i < b; i++)
        attn_merge(e, e->dpart + e->dcoff[i] * nh * (H + 2), e->dcoff[i + 1] - e->dcoff[i],
                   e->datt + i * qd);
    linear(e, t, IKV__QM_O, l, e->datt + a * qd, qd, &xa, n, e->dxb + a * D, D, 0, D);
    for (size_t i = a; i < b; i++)
        add_row(e->dx + i * D, e->dxb + i * D, D);
    norm_rows(e, a, b, m->w.rms_ffn + L * D);
    const float *xn = e->dxn + a * D;
    linear(e, t, IKV__QM_1, l, xn, D, &xa, n, e->dhb + a * Hd, Hd, 0, Hd);
    linear(e, t, IKV__QM_3, l, xn, D, &xa, n, e->dhb2 + a * Hd, Hd, 0, Hd);
    const int wide = nb >= IKV__AR_MIN && ikv__batch512_on();
    for (size_t i = a; i < b; i++)
        swiglu_n(e->dhb + i * Hd, e->dhb2 + i * Hd, Hd, wide);
    linear(e, t, IKV__QM_2, l, e->dhb + a * Hd, Hd, &xa, n, e->dxb + a * D, D, 0, D);
    for (size_t i = a; i < b; i++)
        add_row(e->dx + i * D, e->dxb + i * D, D);
}

/* The whole step as one region (above). */
static void dc_fused(void *vc, int t, int P) {
    const fwd *c = vc;
    struct ikv_engine *e = c->e;
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, V = (size_t)m->cfg.vocab_size;
    size_t a, b;
    part(c->nb, t, P, IKV__AR_LANES, &a, &b);
    fwd lc = *c;
    for (lc.l = 0; lc.l < m->cfg.n_layers; lc.l++) {
        if (b > a) fz_qkv(e, t, lc.l, a, b);
        ikv__pool_barrier(e->pool, P); /* every row's K/V of the layer written */
        dc_attn(&lc, t, P);
        ikv__pool_barrier(e->pool, P); /* every row's attention chunks done */
        if (b > a) fz_out(e, t, lc.l, a, b, c->nb);
    }
    if (b == a) return;
    const ikv__q8act xa = act_buf(e, t);
    norm_rows(e, a, b, m->w.rms_final);
    linear(e, t, IKV__QM_CLS, 0, e->dxn + a * D, D, &xa, b - a, e->dlog + a * V, V, 0, V);
}

/* Whether a step of nb rows takes the fused pass (inl: it would run on the calling thread). */
static int fused_use(const struct ikv_engine *e, size_t nb, int inl) {
    const struct ikv_model *m = e->m;
    if (m->gs || fz_mode == 0 || ikv__pool_active(e->pool) != ikv__pool_size(e->pool)) return 0;
    if (fz_mode == 1) return 1;
    return !inl && nb >= FZ_MIN_ROWS &&
           ikv_model_params(&m->cfg) * sizeof(float) <= FZ_WEIGHT_BYTES;
}

void ikv__decode_batch(struct ikv_engine *e, size_t nb) {
    const struct ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim, V = (size_t)m->cfg.vocab_size;
    const size_t bt = e->bt;
    fwd c = {.e = e, .nb = nb};
    IKV_ASSERT(nb >= 1 && nb <= e->dmax);
    /* a small step runs on the calling thread alone (same bits: no output depends on the
     * partition); fp32 only, int8 products use per-thread packed weight shares */
    const int inl = !m->gs && (uint64_t)nb * (ikv_model_params(&m->cfg) +
                                              (uint64_t)m->cfg.n_layers * e->dpos[nb - 1] *
                                                  (uint64_t)m->q_dim * 2) <
                                  DC_INLINE_MACS;
    e->dcoff[0] = 0;
    for (size_t i = 0; i < nb; i++) {
        const size_t nblk = (e->dpos[i] + 1 + bt - 1) / bt;
        e->dcoff[i + 1] = e->dcoff[i] + (nblk + IKV__DC_CHUNK - 1) / IKV__DC_CHUNK;
        embed_row(m, e->dtok[i], e->dx + i * D);
    }
    if (fused_use(e, nb, inl)) {
        ikv__pool_run(e->pool, dc_fused, &c);
    } else {
        for (c.l = 0; c.l < m->cfg.n_layers; c.l++) {
            c.xrow = m->w.rms_att + (size_t)c.l * D;
            if (!m->gs) region(e, inl, dc_norm, &c); /* int8: each thread norms (normed_rows) */
            region(e, inl, dc_qkv, &c);
            if (m->gs) {
                region(e, inl, dc_attn_runq, &c);
            } else {
                region(e, inl, dc_attn, &c);
                region(e, inl, dc_merge, &c);
            }
            region(e, inl, dc_wo, &c);
            c.xrow = m->w.rms_ffn + (size_t)c.l * D;
            if (!m->gs) region(e, inl, dc_norm, &c);
            region(e, inl, dc_ffn13, &c);
            region(e, inl, dc_w2, &c);
        }
        c.xrow = m->w.rms_final;
        if (!m->gs) region(e, inl, dc_norm, &c);
        region(e, inl, dc_logits, &c);
    }
    /* each sequence's logits are its last row's (a verify's earlier rows stay in e->dlog for
     * the acceptance; copying them all, as the same sequence's buffer, was 127 wasted copies
     * of a 128-row verify) */
    for (size_t i = 0; i < nb; i++)
        if (i + 1 == nb || e->dseq[i + 1] != e->dseq[i])
            memcpy(e->dseq[i]->logits, e->dlog + i * V, sizeof(float) * V);
}

void ikv__decode_step(struct ikv_engine *e, struct ikv_seq *s, uint32_t token, size_t pos) {
    e->dseq[0] = s, e->dpos[0] = pos, e->dtok[0] = token;
    ikv__decode_batch(e, 1);
}
