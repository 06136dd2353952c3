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
 * once per process by ikv__use_avx2(); results are comparable only within one choice.
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

/* Weight rows per block: as many as fit in 16 KiB (1..16), so a block stays in L1 while every
 * batch row passes over it, and each batch row is read from L2 once per block rather than
 * once per weight row. */
static size_t row_block(size_t K) {
    size_t rb = 16384 / (K * sizeof(float) + 1);
    return rb < 1 ? 1 : rb > 16 ? 16 : rb;
}

/* Rows [r0, r1) of W against nx rows of X, AVX2 kernel: weight rows in blocks (each read from
 * memory once), batch rows two at a time over the block. */
__attribute__((target("avx2,fma"))) static void rows_avx2(const float *W, size_t K, size_t r0,
                                                          size_t r1, const float *X, size_t ldx,
                                                          size_t nx, float *Y, size_t ldy) {
    const size_t rb = nx > 2 ? row_block(K) : 1;
    for (size_t q0 = r0; q0 < r1; q0 += rb) {
        const size_t q1 = q0 + rb < r1 ? q0 + rb : r1;
        size_t b = 0;
        for (; b + 2 <= nx; b += 2)
            for (size_t r = q0; r < q1; r++)
                dot2_avx2(W + r * K, X + b * ldx, X + (b + 1) * ldx, K, &Y[b * ldy + r],
                          &Y[(b + 1) * ldy + r]);
        if (b < nx)
            for (size_t r = q0; r < q1; r++)
                Y[b * ldy + r] = dot_avx2(W + r * K, X + b * ldx, K);
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
