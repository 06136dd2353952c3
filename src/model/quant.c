/*
 * Int8 kernels for llama2.c version-2 weights: activation quantization, matrix-vector products
 * and row dequantization, each in a portable C version and SIMD versions chosen once per
 * process (AVX2; AVX-512 VNNI on 256-bit vectors where the CPU has it).
 *
 * The arithmetic is runq.c's, so that the results are the reference's:
 *
 *   quantize x (per group of gs):  s = max|x| / 127,  q = round(x / s)   (half away from zero)
 *   y[r] = sum over groups g, in order from 0, of  ((float)I(r, g) * ws(r, g)) * xs(g)
 *          where I(r, g) = sum of q_w * q_x over the group, in int32
 *
 * I(r, g) is an exact integer whatever order or vector width computes it, and the float part
 * is the same sequence of roundings on every path (the SIMD kernels compute 8 groups' products
 * in 8 lanes, then add them to the row's sum one at a time, in order). So every path gives the
 * same bits, a row's result depends only on the row and x (never on which rows share the call,
 * nor on the thread), and the tests compare the paths bit for bit. Exact int32: |q| <= 127, so
 * a group's sum is below 2^31 for gs < 133000 (gs <= dim <= 65536 here).
 *
 * The SIMD dot products use the sign trick: |q_x| (u8) times sign(q_x) * q_w (s8), which is
 * exact because no value is -128 (the loader refuses weights of -128; quantization never makes
 * one). AVX2: maddubs to int16 pairs (|sum| <= 2 * 127 * 127 < 2^15, no saturation), madd to
 * int32. VNNI: vpdpbusd straight into int32. They need gs a multiple of 32 (one 32-byte vector
 * per group step); other group sizes (stories260K's 4) take the portable kernel, which is the
 * same arithmetic.
 *
 * Rows are computed one at a time, so the weights are read as one linear stream (what the
 * hardware prefetcher follows best; decode is bound by those bytes). Nothing here allocates.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_SIMD 1
#endif

static int q8_level = -1;

/* The highest level this CPU has: 3 (and 2) if AVX-512 VNNI and VL (and AVX2), 1 if AVX2,
 * else 0. Levels: 0 portable, 1 AVX2, 2 VNNI on 512-bit vectors (16-row blocks), 3 VNNI on
 * 256-bit vectors (8-row blocks); 2 and 3 are the same instructions at two widths. */
static int detect(void) {
#ifdef HAVE_X86_SIMD
    if (!__builtin_cpu_supports("avx2")) return 0;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f"))
        return 3;
    return 1;
#else
    return 0;
#endif
}

/* The level a process takes by default: with VNNI, the width that measured faster here for
 * these row lengths (docs/engine.md, "Int8 weights"): Q8_VNNI_DEFAULT. */
#define Q8_VNNI_DEFAULT 2

void ikv__q8_simd_force(int level) {
    int best = detect();
    q8_level = level < 0 ? -1 : level < best ? level : best;
}

int ikv__q8_simd_level(void) {
    if (q8_level < 0) {
        int best = detect();
        /* IKV_Q8_VNNI=256|512 picks the width (for measuring one against the other) */
        const char *w = getenv("IKV_Q8_VNNI");
        int dflt = w && !strcmp(w, "256") ? 3 : w && !strcmp(w, "512") ? 2 : Q8_VNNI_DEFAULT;
        q8_level = best == 3 ? dflt : best;
    }
    return q8_level;
}

int ikv__q8_simd_max(void) {
    return detect();
}

const char *ikv__q8_simd_name(void) {
    static const char *names[] = {"portable", "avx2", "avx512-vnni", "avx512-vnni-256"};
    return names[ikv__q8_simd_level()];
}

static inline float ld_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- activation quantization ---------------------------------------------------------------- */

/* One group of the portable version; returns its scale, *sum the sum of its q. */
static float quant_group(const float *x, int gs, int8_t *q, uint8_t *a, int32_t *sum) {
    float wmax = 0.0f;
    for (int i = 0; i < gs; i++) {
        float v = fabsf(x[i]);
        if (v > wmax) wmax = v;
    }
    const float scale = wmax / 127.0f;
    int32_t sq = 0;
    for (int i = 0; i < gs; i++) {
        /* runq.c: (int8_t)round(x / scale); an all-zero group (0 / 0 there) gives 0 */
        int8_t v = scale > 0.0f ? (int8_t)roundf(x[i] / scale) : 0;
        q[i] = v;
        a[i] = (uint8_t)(v < 0 ? -v : v);
        sq += v;
    }
    *sum = sq;
    return scale;
}

#ifdef HAVE_X86_SIMD
/* The AVX2 version (gs a multiple of 8): max over 8 lanes (max is exact and order-free),
 * division in lanes (IEEE, the same as scalar), round half away from zero as trunc(v) plus
 * sign(v) where |v - trunc(v)| >= 0.5 (v - trunc(v) is exact), which is roundf's result. */
__attribute__((target("avx2"))) static void quant_avx2(const float *x, size_t n, int gs,
                                                       const ikv__q8act *act) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    for (size_t g = 0; g < n / (size_t)gs; g++) {
        const float *xg = x + g * (size_t)gs;
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < gs; i += 8)
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xg + i), absm), m);
        float l[8];
        _mm256_storeu_ps(l, m);
        float wmax = 0.0f;
        for (int i = 0; i < 8; i++)
            wmax = l[i] > wmax ? l[i] : wmax;
        const float scale = wmax / 127.0f;
        act->s[g] = scale;
        int8_t *q = act->q + g * (size_t)gs;
        uint8_t *a = act->a + g * (size_t)gs;
        if (!(scale > 0.0f)) {
            memset(q, 0, (size_t)gs), memset(a, 0, (size_t)gs);
            if (act->c) act->c[g] = 0;
            continue;
        }
        const __m256 vs = _mm256_set1_ps(scale);
        __m256i sum = _mm256_setzero_si256();
        for (int i = 0; i < gs; i += 8) {
            __m256 v = _mm256_div_ps(_mm256_loadu_ps(xg + i), vs);
            __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256 d = _mm256_and_ps(_mm256_sub_ps(v, t), absm);
            __m256 sgn = _mm256_or_ps(_mm256_andnot_ps(absm, v), one); /* +-1 */
            __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(d, half, _CMP_GE_OQ), sgn));
            __m256i i32 = _mm256_cvttps_epi32(r);
            sum = _mm256_add_epi32(sum, i32);
            __m128i p16 =
                _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
            __m128i p8 = _mm_packs_epi16(p16, p16);
            _mm_storel_epi64((__m128i *)(q + i), p8);
            _mm_storel_epi64((__m128i *)(a + i), _mm_abs_epi8(p8));
        }
        if (act->c) {
            int32_t l8[8], t = 0;
            _mm256_storeu_si256((__m256i *)l8, sum);
            for (int i = 0; i < 8; i++)
                t += l8[i];
            act->c[g] = -128 * t;
        }
    }
}
#endif

void ikv__q8_quantize(const float *x, size_t n, int gs, const ikv__q8act *act) {
#ifdef HAVE_X86_SIMD
    if (ikv__q8_simd_level() >= 1 && gs % 8 == 0) {
        quant_avx2(x, n, gs, act);
        return;
    }
#endif
    for (size_t g = 0; g < n / (size_t)gs; g++) {
        int32_t sum;
        act->s[g] = quant_group(x + g * (size_t)gs, gs, act->q + g * (size_t)gs,
                                act->a + g * (size_t)gs, &sum);
        if (act->c) act->c[g] = -128 * sum;
    }
}

/* ---- matrix-vector products ----------------------------------------------------------------- */

/* runq.c's matmul for rows [r0, r1). */
static void matvec_portable(const int8_t *W, const uint8_t *S, size_t K, int gs,
                            const ikv__q8act *x, float *y, size_t r0, size_t r1) {
    const size_t ng = K / (size_t)gs;
    for (size_t r = r0; r < r1; r++) {
        const int8_t *w = W + r * K;
        const uint8_t *ws = S + 4 * r * ng;
        float val = 0.0f;
        for (size_t g = 0; g < ng; g++) {
            int32_t iv = 0;
            const int8_t *wg = w + g * (size_t)gs, *xg = x->q + g * (size_t)gs;
            for (int k = 0; k < gs; k++)
                iv += (int32_t)xg[k] * (int32_t)wg[k];
            val += ((float)iv * ld_f32(ws + 4 * g)) * x->s[g];
        }
        y[r] = val;
    }
}

#ifdef HAVE_X86_SIMD
/* Lane b of the result = the sum of the 8 int32 lanes of a_b. */
__attribute__((target("avx2"))) static inline __m256i hsum8x8_i32(__m256i a0, __m256i a1,
                                                                  __m256i a2, __m256i a3,
                                                                  __m256i a4, __m256i a5,
                                                                  __m256i a6, __m256i a7) {
    __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(a4, a5), _mm256_hadd_epi32(a6, a7));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* The float part of 8 groups: lanes ((float)I * ws) * xs, added to val in lane order (nb <= 8
 * lanes valid). ws/xs hold at least nb scales; only nb are read. */
__attribute__((target("avx2"))) static inline float
groups_add(float val, __m256i iv, const uint8_t *ws, const float *xs, size_t nb) {
    float w8[8], x8[8], t[8];
    if (nb == 8) {
        memcpy(w8, ws, sizeof w8);
        memcpy(x8, xs, sizeof x8);
    } else {
        memset(w8, 0, sizeof w8), memset(x8, 0, sizeof x8);
        memcpy(w8, ws, 4 * nb);
        memcpy(x8, xs, 4 * nb);
    }
    __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(iv), _mm256_loadu_ps(w8)),
                             _mm256_loadu_ps(x8));
    _mm256_storeu_ps(t, f);
    for (size_t b = 0; b < nb; b++)
        val += t[b];
    return val;
}

/* The dot products of one group step, AVX2: |x| (u8) x sign(x) w (s8) -> int16 pairs ->
 * int32. */
#define DOT_AVX2(acc, off)                                                                         \
    do {                                                                                           \
        __m256i w_ = _mm256_loadu_si256((const __m256i *)(w + (off)));                             \
        __m256i sw_ = _mm256_sign_epi8(w_, _mm256_loadu_si256((const __m256i *)(xq + (off))));     \
        __m256i p_ = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(xa + (off))), sw_); \
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p_, ones));                                  \
    } while (0)

/* The same with VNNI: u8 x s8 products summed by 4 straight into int32. */
#define DOT_VNNI(acc, off)                                                                         \
    do {                                                                                           \
        __m256i w_ = _mm256_loadu_si256((const __m256i *)(w + (off)));                             \
        __m256i sw_ = _mm256_sign_epi8(w_, _mm256_loadu_si256((const __m256i *)(xq + (off))));     \
        acc = _mm256_dpbusd_epi32(acc, _mm256_loadu_si256((const __m256i *)(xa + (off))), sw_);    \
    } while (0)

/* One kernel per dot flavour: rows one at a time; per row, groups 8 at a time (each group gs/32
 * vector steps into its own accumulator), the 8 group sums reduced together into one vector,
 * then groups_add. A last batch of fewer than 8 groups leaves the other accumulators zero and
 * adds only its own lanes. */
#define MATVEC_KERNEL(name, target_, DOT)                                                          \
    __attribute__((target(target_))) static void name(const int8_t *W, const uint8_t *S, size_t K, \
                                                      int gs, const ikv__q8act *x, float *y,       \
                                                      size_t r0, size_t r1) {                      \
        const size_t ng = K / (size_t)gs, G = (size_t)gs;                                          \
        const int8_t *xq = x->q;                                                                   \
        const uint8_t *xa = x->a;                                                                  \
        const __m256i ones = _mm256_set1_epi16(1);                                                 \
        (void)ones;                                                                                \
        for (size_t r = r0; r < r1; r++) {                                                         \
            const int8_t *w = W + r * K;                                                           \
            const uint8_t *ws = S + 4 * r * ng;                                                    \
            float val = 0.0f;                                                                      \
            size_t g = 0;                                                                          \
            for (; g + 8 <= ng; g += 8) {                                                          \
                __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,  \
                        a6 = a0, a7 = a0;                                                          \
                for (size_t c = 0; c < G; c += 32) {                                               \
                    const size_t o = g * G + c;                                                    \
                    DOT(a0, o);                                                                    \
                    DOT(a1, o + G);                                                                \
                    DOT(a2, o + 2 * G);                                                            \
                    DOT(a3, o + 3 * G);                                                            \
                    DOT(a4, o + 4 * G);                                                            \
                    DOT(a5, o + 5 * G);                                                            \
                    DOT(a6, o + 6 * G);                                                            \
                    DOT(a7, o + 7 * G);                                                            \
                }                                                                                  \
                val = groups_add(val, hsum8x8_i32(a0, a1, a2, a3, a4, a5, a6, a7), ws + 4 * g,     \
                                 x->s + g, 8);                                                     \
            }                                                                                      \
            if (g < ng) {                                                                          \
                __m256i acc[8];                                                                    \
                for (size_t b = 0; b < 8; b++)                                                     \
                    acc[b] = _mm256_setzero_si256();                                               \
                for (size_t b = 0; g + b < ng; b++)                                                \
                    for (size_t c = 0; c < G; c += 32)                                             \
                        DOT(acc[b], (g + b) * G + c);                                              \
                val = groups_add(                                                                  \
                    val,                                                                           \
                    hsum8x8_i32(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]),   \
                    ws + 4 * g, x->s + g, ng - g);                                                 \
            }                                                                                      \
            y[r] = val;                                                                            \
        }                                                                                          \
    }

MATVEC_KERNEL(matvec_avx2, "avx2", DOT_AVX2)
MATVEC_KERNEL(matvec_vnni, "avx2,avx512vnni,avx512vl", DOT_VNNI)
#endif

void ikv__q8_matvec(const struct ikv_model *m, int k, int l, const ikv__q8act *x, float *y,
                    size_t r0, size_t r1) {
    const int8_t *W = ikv__qm_q(m, k, l);
    const uint8_t *S = ikv__qm_s(m, k, l);
    const size_t K = m->qm[k].cols;
#ifdef HAVE_X86_SIMD
    if (m->gs % 32 == 0) {
        int lv = ikv__q8_simd_level();
        if (lv >= 2) {
            matvec_vnni(W, S, K, m->gs, x, y, r0, r1);
            return;
        }
        if (lv == 1) {
            matvec_avx2(W, S, K, m->gs, x, y, r0, r1);
            return;
        }
    }
#endif
    matvec_portable(W, S, K, m->gs, x, y, r0, r1);
}

/* ---- int8 matrix products (prefill) ----------------------------------------------------------
 *
 * Y = X W^T for M activation rows at once. The weight rows of the call are first packed in
 * blocks of 8 rows: for each group g and each 4 consecutive k of it, the 4 bytes of each of the
 * 8 rows side by side (32 bytes), and the 8 rows' scales of group g side by side. Then a 32-bit
 * lane j of a vector is row j of the block: one vpdpbusd (or maddubs + madd) step multiplies 4
 * k of all 8 rows by the same 4 activation bytes (broadcast) and adds them into the lane, so
 * after a group's gs / 4 steps lane j holds I(r_j, g) exactly, and the float part
 * v_j = v_j + ((float)I * ws_j) * xs runs in the lanes in group order: per row the very sequence
 * of the matvec above (and of runq.c), with no horizontal sums. Four blocks (32 weight rows)
 * share each activation broadcast. */

/* Packs weight rows [n0, n1) of (W, S) (K columns, groups of gs) into pk: blocks of 8 rows (the
 * last padded with zero rows), each K * 8 bytes of values then ng * 8 scales. */
static void pack_rows(const int8_t *W, const uint8_t *S, size_t K, int gs, size_t n0, size_t n1,
                      uint8_t *pk) {
    const size_t ng = K / (size_t)gs, nblk = (n1 - n0 + 7) / 8;
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *o = pk + b * (8 * K + 32 * ng);
        for (size_t j = 0; j < 8; j++) {
            const size_t r = n0 + b * 8 + j;
            if (r < n1) {
                const int8_t *w = W + r * K;
                for (size_t k4 = 0; k4 < K / 4; k4++)
                    memcpy(o + k4 * 32 + j * 4, w + k4 * 4, 4);
                for (size_t g = 0; g < ng; g++)
                    memcpy(o + 8 * K + (g * 8 + j) * 4, S + 4 * (r * ng + g), 4);
            } else {
                for (size_t k4 = 0; k4 < K / 4; k4++)
                    memset(o + k4 * 32 + j * 4, 0, 4);
                for (size_t g = 0; g < ng; g++)
                    memset(o + 8 * K + (g * 8 + j) * 4, 0, 4);
            }
        }
    }
}

#ifdef HAVE_X86_SIMD
#define PDOT_AVX2(acc, w_, xa4, xq4)                                                               \
    acc = _mm256_add_epi32(                                                                        \
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(xa4, _mm256_sign_epi8(w_, xq4)), ones))

/* Rows [0, M) of the activations against nb <= 4 packed blocks at pk (block stride bs bytes);
 * writes Y[i][c0 + 8 b + j] for the valid columns (< c1). */
#define GEMM_KERNEL(name, target_, PDOT)                                                           \
    __attribute__((target(target_))) static void name(                                             \
        const uint8_t *pk, size_t bs, size_t nb, size_t K, int gs, const ikv__q8act *x, size_t M,  \
        float *Y, size_t ldy, size_t c0, size_t c1) {                                              \
        const size_t ng = K / (size_t)gs, G4 = (size_t)gs / 4;                                     \
        const __m256i ones = _mm256_set1_epi16(1);                                                 \
        (void)ones;                                                                                \
        for (size_t i = 0; i < M; i++) {                                                           \
            const int8_t *xq = x->q + i * K;                                                       \
            const uint8_t *xa = x->a + i * K;                                                      \
            const float *xs = x->s + i * ng;                                                       \
            __m256 v0 = _mm256_setzero_ps(), v1 = v0, v2 = v0, v3 = v0;                            \
            for (size_t g = 0; g < ng; g++) {                                                      \
                __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;                    \
                const uint8_t *w = pk + g * G4 * 32;                                               \
                for (size_t k4 = 0; k4 < G4; k4++) {                                               \
                    int32_t q4, u4;                                                                \
                    memcpy(&q4, xq + (g * G4 + k4) * 4, 4);                                        \
                    memcpy(&u4, xa + (g * G4 + k4) * 4, 4);                                        \
                    const __m256i xq4 = _mm256_set1_epi32(q4), xa4 = _mm256_set1_epi32(u4);        \
                    const uint8_t *wk = w + k4 * 32;                                               \
                    PDOT(a0, _mm256_loadu_si256((const __m256i *)wk), xa4, xq4);                   \
                    if (nb > 1)                                                                    \
                        PDOT(a1, _mm256_loadu_si256((const __m256i *)(wk + bs)), xa4, xq4);        \
                    if (nb > 2)                                                                    \
                        PDOT(a2, _mm256_loadu_si256((const __m256i *)(wk + 2 * bs)), xa4, xq4);    \
                    if (nb > 3)                                                                    \
                        PDOT(a3, _mm256_loadu_si256((const __m256i *)(wk + 3 * bs)), xa4, xq4);    \
                }                                                                                  \
                const __m256 sx = _mm256_set1_ps(xs[g]);                                           \
                const float *ws = (const float *)(const void *)(pk + 8 * K) + g * 8;               \
                v0 = _mm256_add_ps(                                                                \
                    v0, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a0), _mm256_loadu_ps(ws)),  \
                                      sx));                                                        \
                if (nb > 1)                                                                        \
                    v1 = _mm256_add_ps(v1,                                                         \
                                       _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a1),         \
                                                                   _mm256_loadu_ps(ws + bs / 4)),  \
                                                     sx));                                         \
                if (nb > 2)                                                                        \
                    v2 = _mm256_add_ps(                                                            \
                        v2, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a2),                    \
                                                        _mm256_loadu_ps(ws + 2 * bs / 4)),         \
                                          sx));                                                    \
                if (nb > 3)                                                                        \
                    v3 = _mm256_add_ps(                                                            \
                        v3, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a3),                    \
                                                        _mm256_loadu_ps(ws + 3 * bs / 4)),         \
                                          sx));                                                    \
            }                                                                                      \
            float t[32];                                                                           \
            _mm256_storeu_ps(t, v0), _mm256_storeu_ps(t + 8, v1);                                  \
            _mm256_storeu_ps(t + 16, v2), _mm256_storeu_ps(t + 24, v3);                            \
            float *y = Y + i * ldy;                                                                \
            for (size_t j = 0; j < 8 * nb && c0 + j < c1; j++)                                     \
                y[c0 + j] = t[j];                                                                  \
        }                                                                                          \
    }

GEMM_KERNEL(gemm_avx2, "avx2", PDOT_AVX2)
#undef GEMM_KERNEL

/* The VNNI paths: blocks of R weight rows (R = 16 lanes of a 512-bit vector at level 2, 8 of a
 * 256-bit vector at level 3; the last block of a packing padded with zero rows). A block holds,
 * per group g and each 4 consecutive k of the group, the 4 bytes of each of its R rows side by
 * side (R * 4 bytes), then the R rows' scales of every group (R * 4 bytes per group): the rows'
 * file bytes and nothing more. A kernel call reads up to 4 (8) blocks side by side, each its
 * own linear stream (measured here: for decode, several long streams read faster than one).
 * The weight bytes are stored as w + 128 (unsigned, vpdpbusd's first operand) and the
 * activation bytes q are the signed operand, broadcast 4 at a time: a lane's sum of (w + 128) q
 * over the group is sum(w q) + 128 sum(q), so each group's accumulators start at
 * -128 * sum(q) (act->c, computed once per activation row by ikv__q8_quantize) and end at I
 * exactly (int32: |sums| < 2^31). Padding lanes (w = 0, scale 0) are computed, never stored. */

/* Packs weight rows [n0, n1) into blocks of R rows. */
static void pack_blocks(const int8_t *W, const uint8_t *S, size_t K, int gs, size_t n0, size_t n1,
                        uint8_t *pk, size_t R) {
    const size_t ng = K / (size_t)gs, nblk = (n1 - n0 + R - 1) / R;
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *o = pk + b * R * (K + 4 * ng);
        for (size_t j = 0; j < R; j++) {
            const size_t r = n0 + b * R + j;
            for (size_t k4 = 0; k4 < K / 4; k4++)
                for (size_t u = 0; u < 4; u++)
                    o[(k4 * R + j) * 4 + u] =
                        r < n1 ? (uint8_t)((int)W[r * K + k4 * 4 + u] + 128) : 128;
            for (size_t g = 0; g < ng; g++) {
                if (r < n1)
                    memcpy(o + R * K + (g * R + j) * 4, S + 4 * (r * ng + g), 4);
                else
                    memset(o + R * K + (g * R + j) * 4, 0, 4);
            }
        }
    }
}

/* Bytes of pack_blocks's layout for rows rows. */
static size_t pack_blocks_bytes(size_t rows, size_t K, int gs, size_t R) {
    return (rows + R - 1) / R * R * (K + 4 * (K / (size_t)gs));
}

static inline int32_t ld_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* NB 16-row blocks at pk (block stride bs) against NR (1 or 2) activation rows from row i:
 * Y[i + r][c0 + j] for the lanes j with c0 + j < c1. Inlined with constant NB and NR, so the
 * accumulators stay in registers; the two rows share every weight load. Per lane the float
 * steps are the matvec's: v = v + ((float)I * ws) * xs, in group order. */
#define Q8_ALWAYS_INLINE static inline __attribute__((always_inline))

/* acc + vpdpbusd(u, s) as one instruction on acc's register: written as inline assembly because
 * GCC, given the intrinsic on an unrolled array of accumulators, copied every accumulator to a
 * new register at every step (16 register moves per 8 products in the two-row kernel). */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) Q8_ALWAYS_INLINE __m512i
dpbusd512(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) Q8_ALWAYS_INLINE void
blk512(const uint8_t *pk, size_t bs, const int NB, const int NR, size_t K, int gs,
       const ikv__q8act *x, size_t i, float *Y, size_t ldy, size_t c0, size_t c1) {
    const size_t ng = K / (size_t)gs, G4 = (size_t)gs / 4;
    const int8_t *xq[2] = {x->q + i * K, x->q + (i + (size_t)(NR - 1)) * K};
    const float *xs[2] = {x->s + i * ng, x->s + (i + (size_t)(NR - 1)) * ng};
    const int32_t *xc[2] = {x->c + i * ng, x->c + (i + (size_t)(NR - 1)) * ng};
    __m512 v[2][4];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++)
        v[u / 4][u % 4] = _mm512_setzero_ps();
    for (size_t g = 0; g < ng; g++) {
        const uint8_t *w = pk + g * G4 * 64;
        const float *ws = (const float *)(const void *)(pk + 16 * K) + g * 16;
        __m512i a[2][4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512i c = _mm512_set1_epi32(xc[r][g]);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++)
                a[r][b] = c;
        }
        for (size_t k4 = 0; k4 < G4; k4++) {
            const uint8_t *wk = w + k4 * 64;
            __m512i q[2];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++)
                q[r] = _mm512_set1_epi32(ld_i32(xq[r] + (g * G4 + k4) * 4));
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) {
                const __m512i wv = _mm512_loadu_si512(wk + bs * (size_t)b);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++)
                    a[r][b] = dpbusd512(a[r][b], wv, q[r]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const __m512 sx = _mm512_set1_ps(xs[r][g]);
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++)
                v[r][b] = _mm512_add_ps(
                    v[r][b], _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a[r][b]),
                                                         _mm512_loadu_ps(ws + bs / 4 * (size_t)b)),
                                           sx));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        float t[64];
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++)
            _mm512_storeu_ps(t + 16 * b, v[r][b]);
        float *y = Y + (i + (size_t)r) * ldy;
        for (size_t j = 0; j < 16 * (size_t)NB && c0 + j < c1; j++)
            y[c0 + j] = t[j];
    }
}

/* Rows [0, M) of the activations against nb <= 4 blocks at pk (block stride bs; the first row
 * is column c0 of Y, columns from c1 on are not written): rows two at a time, then one. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
gemm_vnni512(const uint8_t *pk, size_t bs, size_t nb, size_t K, int gs, const ikv__q8act *x,
             size_t M, float *Y, size_t ldy, size_t c0, size_t c1) {
    size_t i = 0;
#define BLK_CASE(NB_)                                                                              \
    case NB_:                                                                                      \
        for (; i + 2 <= M; i += 2)                                                                 \
            blk512(pk, bs, NB_, 2, K, gs, x, i, Y, ldy, c0, c1);                                   \
        for (; i < M; i++)                                                                         \
            blk512(pk, bs, NB_, 1, K, gs, x, i, Y, ldy, c0, c1);                                   \
        break
    switch (nb) {
        BLK_CASE(4);
        BLK_CASE(3);
        BLK_CASE(2);
    default:
        BLK_CASE(1);
    }
#undef BLK_CASE
}

/* nb <= 8 8-row blocks on 256-bit vectors (AVX-512 VL), one activation row at a time: the same
 * integer sums and float steps per lane, so the same bits. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void
gemm_vnni256(const uint8_t *pk, size_t bs, size_t nb, size_t K, int gs, const ikv__q8act *x,
             size_t M, float *Y, size_t ldy, size_t c0, size_t c1) {
    const size_t ng = K / (size_t)gs, G4 = (size_t)gs / 4;
    for (size_t i = 0; i < M; i++) {
        const int8_t *xq = x->q + i * K;
        const float *xs = x->s + i * ng;
        const int32_t *xc = x->c + i * ng;
        __m256 v0 = _mm256_setzero_ps(), v1 = v0, v2 = v0, v3 = v0, v4 = v0, v5 = v0, v6 = v0,
               v7 = v0;
        for (size_t g = 0; g < ng; g++) {
            const uint8_t *w = pk + g * G4 * 32;
            const uint8_t *ws = pk + 8 * K + g * 32;
            const __m256i c = _mm256_set1_epi32(xc[g]);
            __m256i a0 = c, a1 = c, a2 = c, a3 = c, a4 = c, a5 = c, a6 = c, a7 = c;
            for (size_t k4 = 0; k4 < G4; k4++) {
                const __m256i q4 = _mm256_set1_epi32(ld_i32(xq + (g * G4 + k4) * 4));
                const uint8_t *wk = w + k4 * 32;
#define DP(a, b_)                                                                                  \
    if (nb > (b_))                                                                                 \
    a = _mm256_dpbusd_epi32(a, _mm256_loadu_si256((const __m256i *)(wk + (b_)*bs)), q4)
                DP(a0, 0);
                DP(a1, 1);
                DP(a2, 2);
                DP(a3, 3);
                DP(a4, 4);
                DP(a5, 5);
                DP(a6, 6);
                DP(a7, 7);
#undef DP
            }
            const __m256 sx = _mm256_set1_ps(xs[g]);
#define EPI(v, a, b_)                                                                              \
    if (nb > (b_))                                                                                 \
    v = _mm256_add_ps(                                                                             \
        v,                                                                                         \
        _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a),                                         \
                                    _mm256_loadu_ps((const float *)(const void *)(ws + (b_)*bs))), \
                      sx))
            EPI(v0, a0, 0);
            EPI(v1, a1, 1);
            EPI(v2, a2, 2);
            EPI(v3, a3, 3);
            EPI(v4, a4, 4);
            EPI(v5, a5, 5);
            EPI(v6, a6, 6);
            EPI(v7, a7, 7);
#undef EPI
        }
        float t[64];
        _mm256_storeu_ps(t, v0), _mm256_storeu_ps(t + 8, v1), _mm256_storeu_ps(t + 16, v2);
        _mm256_storeu_ps(t + 24, v3), _mm256_storeu_ps(t + 32, v4), _mm256_storeu_ps(t + 40, v5);
        _mm256_storeu_ps(t + 48, v6), _mm256_storeu_ps(t + 56, v7);
        float *y = Y + i * ldy;
        for (size_t j = 0; j < 8 * nb && c0 + j < c1; j++)
            y[c0 + j] = t[j];
    }
}

/* Rows [r0, r1) of a packing of rows [pn0, ...) at pk in blocks of R rows (r0 - pn0 a multiple
 * of R), for M activation rows: 4 (512-bit) or 8 (256-bit) blocks per kernel call. */
static void vnni_run(int lv, const uint8_t *pk, size_t pn0, size_t K, int gs, const ikv__q8act *x,
                     size_t M, float *Y, size_t ldy, size_t r0, size_t r1) {
    const size_t R = lv == 2 ? 16 : 8, per = lv == 2 ? 4 : 8;
    const size_t bs = R * (K + 4 * (K / (size_t)gs)), nblk = (r1 - r0 + R - 1) / R;
    const uint8_t *p = pk + (r0 - pn0) / R * bs;
    for (size_t b = 0; b < nblk; b += per) {
        const size_t nb = nblk - b < per ? nblk - b : per;
        if (lv == 2)
            gemm_vnni512(p + b * bs, bs, nb, K, gs, x, M, Y, ldy, r0 + b * R, r1);
        else
            gemm_vnni256(p + b * bs, bs, nb, K, gs, x, M, Y, ldy, r0 + b * R, r1);
    }
}
#endif

size_t ikv__q8_pack(const struct ikv_model *m, int k, int l, size_t n0, size_t n1, uint8_t *out) {
    const size_t K = m->qm[k].cols;
    const int lv = ikv__q8_simd_level();
    if (lv == 0 || m->gs % 4 || n1 <= n0) return 0;
#ifdef HAVE_X86_SIMD
    if (lv >= 2) {
        const size_t R = lv == 2 ? 16 : 8;
        if (out) pack_blocks(ikv__qm_q(m, k, l), ikv__qm_s(m, k, l), K, m->gs, n0, n1, out, R);
        return pack_blocks_bytes(n1 - n0, K, m->gs, R);
    }
    if (out) pack_rows(ikv__qm_q(m, k, l), ikv__qm_s(m, k, l), K, m->gs, n0, n1, out);
    return (n1 - n0 + 7) / 8 * (8 * K + 32 * (K / (size_t)m->gs));
#else
    (void)out;
    return 0;
#endif
}

void ikv__q8_gemm(const struct ikv_model *m, int k, int l, const float *X, size_t M,
                  const ikv__q8act *buf, const uint8_t *packed, float *Y, size_t ldy, size_t n0,
                  size_t n1) {
    const size_t K = m->qm[k].cols, ng = K / (size_t)m->gs;
    if (n1 <= n0) return;
    /* every row quantized once, into rows of the buffers */
    for (size_t i = 0; i < M; i++) {
        ikv__q8act r = {buf->q + i * K, buf->a + i * K, buf->s + i * ng,
                        buf->c ? buf->c + i * ng : NULL};
        ikv__q8_quantize(X + i * K, K, m->gs, &r);
    }
    if (packed && ikv__q8_linear_packed(m, k, packed, n0, n1, buf, M, Y, ldy, n0, n1)) return;
    for (size_t i = 0; i < M; i++) {
        ikv__q8act r = {buf->q + i * K, buf->a + i * K, buf->s + i * ng, NULL};
        ikv__q8_matvec(m, k, l, &r, Y + i * ldy, n0, n1);
    }
}

int ikv__q8_linear_packed(const struct ikv_model *m, int k, const uint8_t *packed, size_t pn0,
                          size_t pn1, const ikv__q8act *x, size_t M, float *Y, size_t ldy,
                          size_t r0, size_t r1) {
#ifdef HAVE_X86_SIMD
    const size_t K = m->qm[k].cols, ng = K / (size_t)m->gs;
    const int lv = ikv__q8_simd_level();
    if (m->gs % 4 || r1 <= r0 || r0 < pn0 || r1 > pn1) return 0;
    if (lv >= 2) {
        if ((r0 - pn0) % (lv == 2 ? 16 : 8) || !x->c) return 0;
        vnni_run(lv, packed, pn0, K, m->gs, x, M, Y, ldy, r0, r1);
        return 1;
    }
    if (lv == 1 && (r0 - pn0) % 8 == 0) {
        const size_t bs = 8 * K + 32 * ng, nblk = (r1 - r0 + 7) / 8;
        const uint8_t *p = packed + (r0 - pn0) / 8 * bs;
        for (size_t b = 0; b < nblk; b += 4) {
            const size_t nb = nblk - b < 4 ? nblk - b : 4;
            gemm_avx2(p + b * bs, bs, nb, K, m->gs, x, M, Y, ldy, r0 + b * 8, r1);
        }
        return 1;
    }
#else
    (void)m, (void)k, (void)packed, (void)pn0, (void)pn1, (void)x, (void)M, (void)Y, (void)ldy,
        (void)r0, (void)r1;
#endif
    return 0;
}

int ikv__q8_gemv_packed(const struct ikv_model *m, int k, const uint8_t *packed, size_t pn0,
                        size_t pn1, const ikv__q8act *x, float *y, size_t r0, size_t r1) {
    return ikv__q8_linear_packed(m, k, packed, pn0, pn1, x, 1, y, 0, r0, r1);
}

/* ---- dequantization ---------------------------------------------------------------------------
 */

#ifdef HAVE_X86_SIMD
/* gs a multiple of 8: (float)q * scale in lanes, one rounding each, as the scalar loop. */
__attribute__((target("avx2"))) static void dequant_avx2(const int8_t *q, const uint8_t *s,
                                                         size_t n, int gs, float *out) {
    for (size_t g = 0; g < n / (size_t)gs; g++) {
        const __m256 sc = _mm256_set1_ps(ld_f32(s + 4 * g));
        for (int i = 0; i < gs; i += 8) {
            size_t o = g * (size_t)gs + (size_t)i;
            __m128i b8 = _mm_loadl_epi64((const __m128i *)(q + o));
            __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8));
            _mm256_storeu_ps(out + o, _mm256_mul_ps(f, sc));
        }
    }
}
#endif

void ikv__q8_dequant_rows(const struct ikv_model *m, int k, int l, size_t r0, size_t r1,
                          float *out) {
    const size_t K = m->qm[k].cols, gs = (size_t)m->gs;
    const int8_t *q = ikv__qm_q(m, k, l) + r0 * K;
    const uint8_t *s = ikv__qm_s(m, k, l) + 4 * (r0 * K / gs);
    const size_t n = (r1 - r0) * K;
#ifdef HAVE_X86_SIMD
    if (ikv__q8_simd_level() >= 1 && gs % 8 == 0) {
        dequant_avx2(q, s, n, (int)gs, out);
        return;
    }
#endif
    for (size_t g = 0; g < n / gs; g++) {
        const float sc = ld_f32(s + 4 * g);
        for (size_t i = 0; i < gs; i++)
            out[g * gs + i] = (float)q[g * gs + i] * sc;
    }
}
