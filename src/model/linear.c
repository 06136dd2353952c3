/*
 * The seam every matrix-vector product of decode and the classifier goes through:
 *
 *     Y[b][r] = W[r] . X[b]      rows r in [r0, r1) of W [N][K], batch rows b in [0, nx)
 *
 * Decode of a batch of sequences (ikv_engine_step) calls it once per weight matrix, thread
 * share and step, with one X row per sequence, so each weight row is read from memory once per
 * step and then from L1 for every other row of the batch: the batched product whose cost per
 * step grows with the batch only by the arithmetic, not by the weight bytes.
 *
 * Bits. Each output element is one dot product computed by one loop in one fixed order that
 * depends only on K (the lane split and the final combination are documented on the kernels
 * below), never on nx, on r0/r1 or on which thread calls: a sequence's decode gives the same
 * bits alone or in a batch of any size, at any thread count (tests/test_model.c checks it on the
 * real bundled model). A variant with other weights (int8) belongs behind this same seam and
 * must keep that property.
 *
 * Two kernels: 8-lane FMA (AVX2 + FMA) and 4-lane SSE2 (plain multiply-add elsewhere), chosen
 * once per process by ikv__use_avx2(); results are comparable only within one choice. On an
 * AVX-512 CPU batches of >= 4 rows go through kernels that give every product the 8-lane
 * kernel's exact bits (ikv__batch512_on; tests/test_verify.c checks them against one-row
 * products): groups of 16 batch rows as the vector lanes (rows_t16) where the call's weight
 * rows are many and in cache, 4 x 4 tiles (dot44_512) otherwise.
 * Does not allocate.
 */
#include "internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LINEAR_AVX2 1
#endif

#ifdef LINEAR_AVX2
/* w . x with four 8-lane FMA partial sums (elements i mod 32 in four groups of 8), then 8-wide
 * steps into the first, a scalar tail; combined as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) +
 * (s6 + s7)) + tail over the lanes of (a0 + a1) + (a2 + a3). */
__attribute__((target("avx2,fma"))) static float dot_avx2(const float *w, const float *x,
                                                          size_t K) {
    const size_t k32 = K & ~(size_t)31, k8 = K & ~(size_t)7;
    size_t i = 0;
    float tail = 0.0f, l[8];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i < k32; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i < k8; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    _mm256_storeu_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < K; i++)
        tail += w[i] * x[i];
    return (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) + tail;
}

/* w . x0 and w . x1 at once: each with exactly dot_avx2's accumulators, steps and final
 * combination (so each result has dot_avx2's bits), sharing the loads of w and running 8 FMA
 * chains instead of 4 (measured: the one-row loop is bound by its 4 chains once w is in L1). */
__attribute__((target("avx2,fma"))) static void
dot2_avx2(const float *w, const float *x0, const float *x1, size_t K, float *y0, float *y1) {
    const size_t k32 = K & ~(size_t)31, k8 = K & ~(size_t)7;
    size_t i = 0;
    float t0 = 0.0f, t1 = 0.0f, l[8], m[8];
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    for (; i < k32; i += 32) {
        __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8),
               w2 = _mm256_loadu_ps(w + i + 16), w3 = _mm256_loadu_ps(w + i + 24);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a0);
        c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), c0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + i + 8), a1);
        c1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + i + 8), c1);
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x0 + i + 16), a2);
        c2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x1 + i + 16), c2);
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x0 + i + 24), a3);
        c3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x1 + i + 24), c3);
    }
    for (; i < k8; i += 8) {
        __m256 w0 = _mm256_loadu_ps(w + i);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + i), a0);
        c0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + i), c0);
    }
    _mm256_storeu_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    _mm256_storeu_ps(m, _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
    for (; i < K; i++) {
        t0 += w[i] * x0[i];
        t1 += w[i] * x1[i];
    }
    *y0 = (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) + t0;
    *y1 = (((m[0] + m[1]) + (m[2] + m[3])) + ((m[4] + m[5]) + (m[6] + m[7]))) + t1;
}

/* The four dot products of weight rows w0, w1 with batch rows x0, x1 (pairs p = (w0,x0),
 * (w0,x1), (w1,x0), (w1,x1)), each with exactly dot_avx2's arithmetic: the same four
 * accumulators a0..a3 per pair (a0 also taking the 8-wide steps after the 32-wide ones), the
 * same combination ((a0 + a1) + (a2 + a3)) and, over its lanes, ((l0 + l1) + (l2 + l3)) +
 * ((l4 + l5) + (l6 + l7)) + tail, so each result has dot_avx2's bits. What differs is only the
 * schedule: the accumulators are run in two phases (a0, a1 of all four pairs, then a2, a3), so
 * 8 chains are in flight with every loaded vector used twice (8 loads per 8 FMAs, against 12
 * in dot2_avx2 and 16 in two dot_avx2), and the lane sums of the four pairs are done at once
 * by horizontal adds (hadd(a, b) lane i is a[2i] + b[2i]... in the order above) instead of
 * 4 x 7 scalar adds. */
__attribute__((target("avx2,fma"))) static void dot22_avx2(const float *w0, const float *w1,
                                                           const float *x0, const float *x1,
                                                           size_t K, float *y00, float *y01,
                                                           float *y10, float *y11) {
    const size_t k32 = K & ~(size_t)31, k8 = K & ~(size_t)7;
    const __m256 z = _mm256_setzero_ps();
    __m256 a00 = z, a01 = z, a10 = z, a11 = z; /* accumulator 0 of the pairs */
    __m256 b00 = z, b01 = z, b10 = z, b11 = z; /* accumulator 1 */
    for (size_t i = 0; i < k32; i += 32) {
        const __m256 u0 = _mm256_loadu_ps(w0 + i), u1 = _mm256_loadu_ps(w1 + i);
        const __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i);
        a00 = _mm256_fmadd_ps(u0, v0, a00), a01 = _mm256_fmadd_ps(u0, v1, a01);
        a10 = _mm256_fmadd_ps(u1, v0, a10), a11 = _mm256_fmadd_ps(u1, v1, a11);
        const __m256 s0 = _mm256_loadu_ps(w0 + i + 8), s1 = _mm256_loadu_ps(w1 + i + 8);
        const __m256 t0 = _mm256_loadu_ps(x0 + i + 8), t1 = _mm256_loadu_ps(x1 + i + 8);
        b00 = _mm256_fmadd_ps(s0, t0, b00), b01 = _mm256_fmadd_ps(s0, t1, b01);
        b10 = _mm256_fmadd_ps(s1, t0, b10), b11 = _mm256_fmadd_ps(s1, t1, b11);
    }
    for (size_t i = k32; i < k8; i += 8) {
        const __m256 u0 = _mm256_loadu_ps(w0 + i), u1 = _mm256_loadu_ps(w1 + i);
        const __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i);
        a00 = _mm256_fmadd_ps(u0, v0, a00), a01 = _mm256_fmadd_ps(u0, v1, a01);
        a10 = _mm256_fmadd_ps(u1, v0, a10), a11 = _mm256_fmadd_ps(u1, v1, a11);
    }
    a00 = _mm256_add_ps(a00, b00), a01 = _mm256_add_ps(a01, b01); /* a0 + a1 */
    a10 = _mm256_add_ps(a10, b10), a11 = _mm256_add_ps(a11, b11);
    __m256 c00 = z, c01 = z, c10 = z, c11 = z; /* accumulator 2 */
    __m256 d00 = z, d01 = z, d10 = z, d11 = z; /* accumulator 3 */
    for (size_t i = 0; i < k32; i += 32) {
        const __m256 u0 = _mm256_loadu_ps(w0 + i + 16), u1 = _mm256_loadu_ps(w1 + i + 16);
        const __m256 v0 = _mm256_loadu_ps(x0 + i + 16), v1 = _mm256_loadu_ps(x1 + i + 16);
        c00 = _mm256_fmadd_ps(u0, v0, c00), c01 = _mm256_fmadd_ps(u0, v1, c01);
        c10 = _mm256_fmadd_ps(u1, v0, c10), c11 = _mm256_fmadd_ps(u1, v1, c11);
        const __m256 s0 = _mm256_loadu_ps(w0 + i + 24), s1 = _mm256_loadu_ps(w1 + i + 24);
        const __m256 t0 = _mm256_loadu_ps(x0 + i + 24), t1 = _mm256_loadu_ps(x1 + i + 24);
        d00 = _mm256_fmadd_ps(s0, t0, d00), d01 = _mm256_fmadd_ps(s0, t1, d01);
        d10 = _mm256_fmadd_ps(s1, t0, d10), d11 = _mm256_fmadd_ps(s1, t1, d11);
    }
    /* (a0 + a1) + (a2 + a3) of each pair */
    const __m256 S0 = _mm256_add_ps(a00, _mm256_add_ps(c00, d00));
    const __m256 S1 = _mm256_add_ps(a01, _mm256_add_ps(c01, d01));
    const __m256 S2 = _mm256_add_ps(a10, _mm256_add_ps(c10, d10));
    const __m256 S3 = _mm256_add_ps(a11, _mm256_add_ps(c11, d11));
    /* lanes: h = [S0 01, S0 23, S1 01, S1 23 | S0 45, S0 67, S1 45, S1 67] (ij = li + lj),
     * then [S0 (01+23), S1 .., S2 .., S3 .. | S0 (45+67), ..], then low + high halves */
    const __m256 h01 = _mm256_hadd_ps(S0, S1), h23 = _mm256_hadd_ps(S2, S3);
    const __m256 q = _mm256_hadd_ps(h01, h23);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1));
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t i = k8; i < K; i++) {
        t[0] += w0[i] * x0[i], t[1] += w0[i] * x1[i];
        t[2] += w1[i] * x0[i], t[3] += w1[i] * x1[i];
    }
    r = _mm_add_ps(r, _mm_loadu_ps(t));
    float o[4];
    _mm_storeu_ps(o, r);
    *y00 = o[0], *y01 = o[1], *y10 = o[2], *y11 = o[3];
}

/* ---- AVX-512: 4 weight rows x 4 batch rows at a time (batches of >= 4 rows) ------------------
 * Each of the 16 products gets exactly dot_avx2's arithmetic: per product the four 8-lane
 * accumulators a0..a3 over the 32-wide steps, the 8-wide steps into a0, (a0 + a1) + (a2 + a3),
 * the lane tree ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) and the scalar tail added last.
 * What differs is the packing: one 16-lane register holds the same accumulator of two
 * products, weight rows r and r + 1 in its two halves against one batch row broadcast to both,
 * so every FMA does two products' 8-lane steps (the same per-lane operation as the 8-lane FMA),
 * each weight pair is built once per chunk for 4 batch rows, and the 16 lane trees are done
 * together by in-lane shuffles (the hadd pairing) and one cross-lane step. The accumulators run
 * in two phases (a0, a1 of all 16 products, then a2, a3), so 16 + 8 registers hold them. */
#define LIN512_ON 1
__attribute__((target("avx512f,avx2,fma"))) static inline __m512 hadd512(__m512 a, __m512 b) {
    /* per 128-bit lane [a0 + a1, a2 + a3, b0 + b1, b2 + b3]: _mm256_hadd_ps's pairing */
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

__attribute__((target("avx512f,avx2,fma"))) static inline __m512 wpair(const float *w0,
                                                                       const float *w1) {
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(w0))),
                           _mm256_castps_pd(_mm256_loadu_ps(w1)), 1));
}

__attribute__((target("avx512f,avx2,fma"))) static inline __m512 xbcast(const float *x) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
}

/* Y[b][r0 + r] = W[r0 + r] . X[b] for r, b in 0..3 (W rows w, stride K; X rows x, stride ldx). */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
dot44_512(const float *w, size_t K, const float *x, size_t ldx, float *y, size_t ldy) {
    const size_t k32 = K & ~(size_t)31, k8 = K & ~(size_t)7;
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    const __m512 z = _mm512_setzero_ps();
    /* p = pw * 4 + b: lanes 0..7 product (2 pw, b), lanes 8..15 product (2 pw + 1, b) */
    __m512 A[8], B[8], S[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        A[p] = z, B[p] = z;
#define STEP(ACC, o)                                                                               \
    do {                                                                                           \
        const __m512 u0 = wpair(w0 + (o), w1 + (o)), u1 = wpair(w2 + (o), w3 + (o));               \
        __m512 v = xbcast(x0 + (o));                                                               \
        ACC[0] = _mm512_fmadd_ps(u0, v, ACC[0]), ACC[4] = _mm512_fmadd_ps(u1, v, ACC[4]);          \
        v = xbcast(x1 + (o));                                                                      \
        ACC[1] = _mm512_fmadd_ps(u0, v, ACC[1]), ACC[5] = _mm512_fmadd_ps(u1, v, ACC[5]);          \
        v = xbcast(x2 + (o));                                                                      \
        ACC[2] = _mm512_fmadd_ps(u0, v, ACC[2]), ACC[6] = _mm512_fmadd_ps(u1, v, ACC[6]);          \
        v = xbcast(x3 + (o));                                                                      \
        ACC[3] = _mm512_fmadd_ps(u0, v, ACC[3]), ACC[7] = _mm512_fmadd_ps(u1, v, ACC[7]);          \
    } while (0)
    for (size_t i = 0; i < k32; i += 32) {
        STEP(A, i);
        STEP(B, i + 8);
    }
    for (size_t i = k32; i < k8; i += 8)
        STEP(A, i);
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        S[p] = _mm512_add_ps(A[p], B[p]), A[p] = z, B[p] = z; /* a0 + a1 */
    for (size_t i = 0; i < k32; i += 32) {
        STEP(A, i + 16);
        STEP(B, i + 24);
    }
#undef STEP
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        S[p] = _mm512_add_ps(S[p], _mm512_add_ps(A[p], B[p])); /* (a0 + a1) + (a2 + a3) */
    /* lane trees: G0 128-bit lanes = [A0..A3 (l0123), A0..A3 (l4567), B0..B3 (l0123), ..] of
     * products 0..3, G1 of products 4..7 (A = low half, B = high half of each register) */
    const __m512 G0 = hadd512(hadd512(S[0], S[1]), hadd512(S[2], S[3]));
    const __m512 G1 = hadd512(hadd512(S[4], S[5]), hadd512(S[6], S[7]));
    /* lane 4 r + b = product (weight row r, batch row b) */
    __m512 R =
        _mm512_add_ps(_mm512_shuffle_f32x4(G0, G1, 0x88), _mm512_shuffle_f32x4(G0, G1, 0xDD));
    if (k8 < K) { /* the tails, t[4 r + b] += w_r[i] * x_b[i] in the order of i, 16 at once */
        const __m512i rep = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        __m512 t = z;
        for (size_t i = k8; i < K; i++) {
            const __m512 wv = _mm512_permutexvar_ps(
                rep, _mm512_castps128_ps512(_mm_set_ps(w3[i], w2[i], w1[i], w0[i])));
            const __m512 xv = _mm512_broadcast_f32x4(_mm_set_ps(x3[i], x2[i], x1[i], x0[i]));
            t = _mm512_add_ps(t, _mm512_mul_ps(wv, xv));
        }
        R = _mm512_add_ps(R, t);
    }
    /* to lane 4 b + r: each batch row's 4 outputs contiguous */
    const __m512i tr = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    R = _mm512_permutexvar_ps(tr, R);
    _mm_storeu_ps(y, _mm512_castps512_ps128(R));
    _mm_storeu_ps(y + ldy, _mm512_extractf32x4_ps(R, 1));
    _mm_storeu_ps(y + 2 * ldy, _mm512_extractf32x4_ps(R, 2));
    _mm_storeu_ps(y + 3 * ldy, _mm512_extractf32x4_ps(R, 3));
}
/* Rows [q0, q1) of W against the batch rows in fours (4 x 4 tiles; leftover weight rows by
 * dot2_avx2, the same bits); returns the batch rows done (nx rounded down to 4). */
__attribute__((target("avx512f,avx2,fma"))) static size_t tiles44(const float *W, size_t K,
                                                                  size_t q0, size_t q1,
                                                                  const float *X, size_t ldx,
                                                                  size_t nx, float *Y, size_t ldy) {
    size_t b = 0;
    for (; b + 4 <= nx; b += 4) {
        const float *x = X + b * ldx;
        float *y = Y + b * ldy;
        size_t r = q0;
        for (; r + 4 <= q1; r += 4)
            dot44_512(W + r * K, K, x, ldx, y + r, ldy);
        for (; r < q1; r++) {
            dot2_avx2(W + r * K, x, x + ldx, K, &y[r], &y[ldy + r]);
            dot2_avx2(W + r * K, x + 2 * ldx, x + 3 * ldx, K, &y[2 * ldy + r], &y[3 * ldy + r]);
        }
    }
    return b;
}

/* ---- AVX-512, the lanes being 16 batch rows (>= 16 rows, the weight rows in cache) ---------
 * The 16 batch rows are transposed once per call (16 x 16 blocks in registers: xT[i] = element
 * i of every row), then each weight row's 32 accumulators of dot_avx2 (accumulator c of lane l
 * sums the elements i = 32 j + 8 c + l, and accumulator 0 the 8-wide steps) run as FMA chains
 * with w[i] broadcast, the 16 batch rows at once, and are combined exactly as dot_avx2 does:
 * (a0 + a1) + (a2 + a3) per lane, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), then
 * the tail added one element at a time. No horizontal sums: 10-15% faster than the 4 x 4 tiles
 * here (1.25-1.35 against 1.45 ns a product at K = 64, 3.1 against 3.65 at K = 172, 128 batch
 * rows). Every group of 16 batch rows sweeps all the call's weight rows, so it is used only
 * where they fit in cache (T16_BYTES), for K <= T16_KMAX (xT lives on the stack), and for calls
 * of >= T16_MIN_ROWS weight rows (decode's Q|K|V calls are one head, 8 rows, on stories260K). */
#define T16_KMAX     512
#define T16_BYTES    (512u * 1024u)
#define T16_MIN_ROWS 32 /* fewer weight rows do not pay for the transposition (measured) */

/* r[0..16) := its transpose (r[c] lane j = old r[j] lane c): moves only, no arithmetic. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void tr16(__m512 *r) {
    __m512 t[16], u[16];
#pragma GCC unroll 16
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    /* u[4 g + e], 128-bit lane q: old rows 4 g .. 4 g + 3, element 4 q + e */
#pragma GCC unroll 16
    for (int g = 0; g < 4; g++) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
#pragma GCC unroll 16
    for (int e = 0; e < 4; e++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88);
        const __m512 v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xDD);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88);
        const __m512 w1 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xDD);
        r[e] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[8 + e] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[4 + e] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + e] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}

/* y[r] lane b = w_r . (batch row b) for the 4 weight rows w[0..4) against xT ([K][16]). */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
t16_four(const float *w0, const float *w1, const float *w2, const float *w3, size_t K,
         const float *xT, __m512 *y) {
    const float *const w[4] = {w0, w1, w2, w3};
    const size_t k32 = K & ~(size_t)31, k8 = K & ~(size_t)7;
    const __m512 z = _mm512_setzero_ps();
    __m512 P[4][3]; /* the lane tree of each row, built as the lanes come */
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++) {
        __m512 a[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            a[r][0] = a[r][1] = a[r][2] = a[r][3] = z;
        for (size_t j = 0; j < k32; j += 32) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const size_t i = j + 8 * (size_t)c + (size_t)l;
                const __m512 v = _mm512_loadu_ps(xT + i * 16);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][i]), v, a[r][c]);
            }
        }
        for (size_t j = k32; j < k8; j += 8) {
            const size_t i = j + (size_t)l;
            const __m512 v = _mm512_loadu_ps(xT + i * 16);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                a[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][i]), v, a[r][0]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512 S =
                _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]), _mm512_add_ps(a[r][2], a[r][3]));
            if ((l & 1) == 0) /* S_l, kept for its pair */
                P[r][0] = S;
            else if (l == 1 || l == 5) /* S0 + S1, S4 + S5 */
                P[r][1] = _mm512_add_ps(P[r][0], S);
            else if (l == 3) /* (S0 + S1) + (S2 + S3) */
                P[r][2] = _mm512_add_ps(P[r][1], _mm512_add_ps(P[r][0], S));
            else /* ((S0 + S1) + (S2 + S3)) + ((S4 + S5) + (S6 + S7)) */
                P[r][1] = _mm512_add_ps(P[r][2], _mm512_add_ps(P[r][1], _mm512_add_ps(P[r][0], S)));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __m512 R = P[r][1];
        if (k8 < K) {
            __m512 t = z;
            for (size_t i = k8; i < K; i++)
                t = _mm512_add_ps(
                    t, _mm512_mul_ps(_mm512_set1_ps(w[r][i]), _mm512_loadu_ps(xT + i * 16)));
            R = _mm512_add_ps(R, t);
        }
        y[r] = R;
    }
}

/* Rows [r0, r1) of W against the 16 batch rows X[0..16) (stride ldx), into Y (stride ldy):
 * 16 weight rows at a time, their results transposed back so that each batch row's outputs
 * are stored contiguously. */
__attribute__((target("avx512f,avx2,fma"))) static void rows_t16(const float *W, size_t K,
                                                                 size_t r0, size_t r1,
                                                                 const float *X, size_t ldx,
                                                                 float *Y, size_t ldy) {
    float xT[T16_KMAX * 16];
    __m512 blk[16];
    for (size_t c0 = 0; c0 < K; c0 += 16) {
        const size_t nc = K - c0 < 16 ? K - c0 : 16;
        const __mmask16 mk = (__mmask16)((1u << nc) - 1);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++)
            blk[j] = _mm512_maskz_loadu_ps(mk, X + (size_t)j * ldx + c0);
        tr16(blk);
        for (size_t c = 0; c < nc; c++)
            _mm512_storeu_ps(xT + (c0 + c) * 16, blk[c]);
    }
    for (size_t q = r0; q < r1; q += 16) {
        const size_t nr = r1 - q < 16 ? r1 - q : 16;
        for (size_t k = 0; k < 16; k += 4) {
            if (k >= nr) { /* past r1: nothing to compute, the store drops these lanes */
                blk[k] = blk[k + 1] = blk[k + 2] = blk[k + 3] = _mm512_setzero_ps();
                continue;
            }
            const float *w[4]; /* rows past r1 repeat the last one; their results are dropped */
            for (size_t r = 0; r < 4; r++)
                w[r] = W + (q + (k + r < nr ? k + r : nr - 1)) * K;
            if (K == 64) /* the bundled model's dim: loops unrolled by the compiler */
                t16_four(w[0], w[1], w[2], w[3], 64, xT, &blk[k]);
            else
                t16_four(w[0], w[1], w[2], w[3], K, xT, &blk[k]);
        }
        tr16(blk);
        const __mmask16 mr = (__mmask16)((1u << nr) - 1);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++)
            _mm512_mask_storeu_ps(Y + (size_t)j * ldy + q, mr, blk[j]);
    }
}

/* Weight rows per block: as many as fit in 16 KiB (2..16), so a block stays in L1 while every
 * batch row passes over it, and each batch row is read from L2 once per block rather than
 * once per weight row. */
static size_t row_block(size_t K) {
    size_t rb = 16384 / (K * sizeof(float) + 1);
    return rb < 2 ? 2 : rb > 16 ? 16 : rb; /* at least a pair for the two-row kernels */
}

/* Rows [r0, r1) of W against nx rows of X, AVX2 kernel: weight rows in blocks (each read from
 * memory once), batch rows two at a time over the block (dot22_avx2 on two weight rows at a
 * time), and an odd last batch row against two weight rows at a time: dot2_avx2 with the roles
 * swapped (x shared, w0 and w1 the two "rows"), which gives each product exactly dot_avx2's
 * bits, w[i] * x[i] and fma(w, x, a) being the same as with the operands exchanged. */
__attribute__((target("avx2,fma"))) static void rows_avx2(const float *W, size_t K, size_t r0,
                                                          size_t r1, const float *X, size_t ldx,
                                                          size_t nx, float *Y, size_t ldy) {
    size_t b0 = 0; /* batch rows done by the transposed kernel over all of [r0, r1) */
    if (nx >= 16 && r1 - r0 >= T16_MIN_ROWS && K <= T16_KMAX &&
        (r1 - r0) * K * sizeof(float) <= T16_BYTES && ikv__batch512_on())
        for (; b0 + 16 <= nx; b0 += 16)
            rows_t16(W, K, r0, r1, X + b0 * ldx, ldx, Y + b0 * ldy, ldy);
    X += b0 * ldx, Y += b0 * ldy, nx -= b0;
    const size_t rb = row_block(K);
    for (size_t q0 = r0; q0 < r1 && nx; q0 += rb) {
        const size_t q1 = q0 + rb < r1 ? q0 + rb : r1;
        size_t b = 0;
        if (nx >= 4 && ikv__batch512_on()) /* 4 x 4 tiles, then the rest below */
            b = tiles44(W, K, q0, q1, X, ldx, nx, Y, ldy);
        for (; b + 2 <= nx; b += 2) {
            const float *x0 = X + b * ldx, *x1 = x0 + ldx;
            float *y0 = Y + b * ldy, *y1 = y0 + ldy;
            size_t r = q0;
            for (; r + 2 <= q1; r += 2)
                dot22_avx2(W + r * K, W + (r + 1) * K, x0, x1, K, &y0[r], &y1[r], &y0[r + 1],
                           &y1[r + 1]);
            if (r < q1) dot2_avx2(W + r * K, x0, x1, K, &y0[r], &y1[r]);
        }
        if (b < nx) {
            const float *x = X + b * ldx;
            float *y = Y + b * ldy;
            size_t r = q0;
            for (; r + 2 <= q1; r += 2)
                dot2_avx2(x, W + r * K, W + (r + 1) * K, K, &y[r], &y[r + 1]);
            if (r < q1) y[r] = dot_avx2(W + r * K, x, K);
        }
    }
}
#endif

/* w . x with four 4-lane partial sums (elements i mod 16 in 0..3, 4..7, 8..11, 12..15), then
 * 4-wide steps into the first, a scalar tail, combined as ((s0 + s1) + (s2 + s3)) + tail over
 * the lanes of (a0 + a1) + (a2 + a3). */
static float dot_sse(const float *w, const float *x, size_t K) {
    const size_t k16 = K & ~(size_t)15, k4 = K & ~(size_t)3;
    size_t i = 0;
    float tail = 0.0f, l[4];
#if defined(__SSE2__)
    __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i < k16; i += 16) {
        a0 = _mm_add_ps(a0, _mm_mul_ps(_mm_loadu_ps(w + i), _mm_loadu_ps(x + i)));
        a1 = _mm_add_ps(a1, _mm_mul_ps(_mm_loadu_ps(w + i + 4), _mm_loadu_ps(x + i + 4)));
        a2 = _mm_add_ps(a2, _mm_mul_ps(_mm_loadu_ps(w + i + 8), _mm_loadu_ps(x + i + 8)));
        a3 = _mm_add_ps(a3, _mm_mul_ps(_mm_loadu_ps(w + i + 12), _mm_loadu_ps(x + i + 12)));
    }
    for (; i < k4; i += 4)
        a0 = _mm_add_ps(a0, _mm_mul_ps(_mm_loadu_ps(w + i), _mm_loadu_ps(x + i)));
    _mm_storeu_ps(l, _mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)));
#else
    float a[4][4] = {{0}};
    for (; i < k16; i += 16)
        for (int u = 0; u < 4; u++)
            for (int j = 0; j < 4; j++)
                a[u][j] += w[i + 4 * (size_t)u + (size_t)j] * x[i + 4 * (size_t)u + (size_t)j];
    for (; i < k4; i += 4)
        for (int j = 0; j < 4; j++)
            a[0][j] += w[i + (size_t)j] * x[i + (size_t)j];
    for (int j = 0; j < 4; j++)
        l[j] = (a[0][j] + a[1][j]) + (a[2][j] + a[3][j]);
#endif
    for (; i < K; i++)
        tail += w[i] * x[i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + tail;
}

void ikv__linear_rows(const float *W, size_t K, size_t r0, size_t r1, const float *X, size_t ldx,
                      size_t nx, float *Y, size_t ldy) {
#ifdef LINEAR_AVX2
    if (ikv__use_avx2()) {
        rows_avx2(W, K, r0, r1, X, ldx, nx, Y, ldy);
        return;
    }
#endif
    for (size_t r = r0; r < r1; r++) {
        const float *w = W + r * K;
        for (size_t b = 0; b < nx; b++)
            Y[b * ldy + r] = dot_sse(w, X + b * ldx, K);
    }
}
