/*
 * runq.c's attention and SwiGLU, bit for bit, for int8 models (m->gs > 0).
 *
 * The int8 matrix products are already runq.c's arithmetic (quant.c), and so are RMSNorm, RoPE,
 * the residual adds and the embedding (forward.c). What runq.c computes differently from the
 * fp32 engine is the attention (a score is a dot product summed in order over the head's
 * dimensions, divided by sqrtf(head_size); the softmax sums libm expf values in position order
 * and divides each by the sum; the weighted sum adds a * v position by position) and SwiGLU
 * (x * (1 / (1 + expf(-x))) * x3 with libm's expf). A last-bit difference there is small, but
 * the next projection quantizes its input to int8 per group, and a value that sits on a
 * rounding boundary then moves by a whole step: greedy outputs diverged after a few hundred
 * tokens on some prompts. So int8 models take these functions in decode and in prefill alike.
 *
 * Speed without changing an output's order: every output element is computed by the scalar
 * loop's sequence of roundings, and the vector code puts independent outputs side by side in
 * lanes. Scores: 8 positions in 8 lanes (an 8 x 8 transpose of their keys, then q[i] * k[i]
 * added in order of i in each lane); weighted sum: 8 head dimensions in 8 lanes, positions
 * added in order. Multiplies and adds are separate instructions (no FMA: runq.c as built by
 * scripts/parity_runc.sh, `cc -O2` without -march, has none either; this file is C11, so the
 * compiler contracts nothing). The scalar and the AVX2 versions give the same bits (tested).
 *
 * expf: runq.c calls libm's per element. Here, where the CPU has AVX-512, 16 at a time by
 * exp16 below, which gives libm's result for every input: it computes e^x in double precision
 * to about 2^-44 relative, and the float nearest that is the correctly rounded e^x unless the
 * double lies within 2^-31 (relative) of a midpoint between two floats; such lanes (about 1%)
 * and any input outside [-87, 88] (subnormal, infinite or NaN results) are recomputed by libm's
 * expf. That is libm's result because glibc's (and musl's) expf computes e^x in double with a
 * relative error below 1.7 * 2^-34 before its one rounding to float, so away from those windows
 * it returns the correctly rounded value too. tests/test_runq_ops.c compares exp16 with libm's
 * expf on millions of inputs (every 61st float of [-104, 89] and more). Without AVX-512,
 * libm's expf per element. Nothing here allocates.
 */
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RQ_AVX2 1
#endif

/* Whether the 16-row AVX-512 prefill kernel is used: the AVX2 paths are (ikv__use_avx2, which
 * tests may force off) and the CPU has AVX-512F. Decided once per process. */
#ifdef RQ_AVX2
static pthread_once_t rq_once = PTHREAD_ONCE_INIT;
static int avx512_mode;
static void exp_init(void);
static void rq_init(void) {
    exp_init();
    avx512_mode = __builtin_cpu_supports("avx512f") ? 1 : 0;
}
#endif
static int use_avx512(void) {
#ifdef RQ_AVX2
    pthread_once(&rq_once, rq_init);
    return avx512_mode && ikv__use_avx2();
#else
    return 0;
#endif
}

#ifdef RQ_AVX2
static double exp_tab[8];     /* 2^(j/8) */
static double exp_l1, exp_l2; /* ln2 / 8 = l1 + l2, l1 with its low 16 bits zero */

/* Fills exp16's constants (once per process, by use_avx512). */
static void exp_init(void) {
    for (int j = 0; j < 8; j++)
        exp_tab[j] = exp2((double)j / 8.0);
    const double L = 0.693147180559945309417232121458176568 / 8.0;
    uint64_t b;
    memcpy(&b, &L, 8);
    b &= ~(uint64_t)0xFFFF;
    memcpy(&exp_l1, &b, 8);
    exp_l2 = L - exp_l1;
}

/* e^x of 8 doubles (x in [-87, 88]) to about 2^-44 relative: x = (8 k + j) ln2/8 + r,
 * |r| <= ln2/16, e^x = 2^k 2^(j/8) e^r, e^r by its degree-6 Taylor polynomial (truncation
 * r^7/7! < 2^-44). n = 8 k + j comes from the 1.5 * 2^52 shift: the low bits of z + shift are
 * n + 2^51, so j is their low 3 bits and (their value >> 3) << 52, added to the bits of
 * 2^(j/8) e^r, multiplies it by 2^k (mod 2^64 the 2^51 offset vanishes). */
__attribute__((target("avx512f"))) static inline __m512d exp8d(__m512d x) {
    const __m512d shift = _mm512_set1_pd(0x1.8p52);
    const __m512d kd = _mm512_add_pd(_mm512_mul_pd(x, _mm512_set1_pd(11.541560327111707)), shift);
    const __m512d n = _mm512_sub_pd(kd, shift); /* 8 / ln2 above */
    __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(exp_l1), x);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(exp_l2), r);
    __m512d p = _mm512_set1_pd(1.0 / 720.0);
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 120.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    const __m512i ni = _mm512_castpd_si512(kd);
    const __m512d t = _mm512_permutexvar_pd(ni, _mm512_loadu_pd(exp_tab)); /* low 3 bits */
    return _mm512_castsi512_pd(_mm512_add_epi64(_mm512_castpd_si512(_mm512_mul_pd(p, t)),
                                                _mm512_slli_epi64(_mm512_srli_epi64(ni, 3), 52)));
}

/* The lanes of 8 doubles y (e^x to 2^-44, normal floats) whose nearest float may not be libm's:
 * y within 2^21 units of its last place (at most 2^-31 y) of a midpoint between two floats,
 * i.e. the 29 bits that the conversion to float drops within 2^21 of 2^28. */
__attribute__((target("avx512f"))) static inline __mmask8 near_mid(__m512d y) {
    const __m512i low = _mm512_and_si512(_mm512_castpd_si512(y), _mm512_set1_epi64(0x1FFFFFFF));
    const __m512i d = _mm512_abs_epi64(_mm512_sub_epi64(low, _mm512_set1_epi64(0x10000000)));
    return _mm512_cmplt_epu64_mask(d, _mm512_set1_epi64(1 << 21));
}

/* libm's expf of the 16 lanes of x (see the top of the file). */
__attribute__((target("avx512f"))) static __m512 exp16(__m512 x) {
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_LE_OQ);
    const __m512 xs = _mm512_maskz_mov_ps(ok, x); /* out-of-range lanes computed as 0 */
    const __m256 x0 = _mm512_castps512_ps256(xs),
                 x1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(xs), 1));
    const __m512d y0 = exp8d(_mm512_cvtps_pd(x0)), y1 = exp8d(_mm512_cvtps_pd(x1));
    const __m256 f0 = _mm512_cvtpd_ps(y0), f1 = _mm512_cvtpd_ps(y1);
    const __mmask16 bad = (__mmask16)(~ok | near_mid(y0) | ((unsigned)near_mid(y1) << 8));
    __m512 f = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(f0)), _mm256_castps_pd(f1), 1));
    if (bad) {
        float xv[16], fv[16];
        _mm512_storeu_ps(xv, x), _mm512_storeu_ps(fv, f);
        for (int i = 0; i < 16; i++)
            if (bad >> i & 1) fv[i] = expf(xv[i]);
        f = _mm512_loadu_ps(fv);
    }
    return f;
}

__attribute__((target("avx512f"))) static size_t swiglu_avx512(float *hb, const float *hb2,
                                                               size_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 val = _mm512_loadu_ps(hb + i);
        const __m512 e = exp16(_mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(val), _mm512_set1_epi32((int)0x80000000u))));
        val = _mm512_mul_ps(val, _mm512_div_ps(one, _mm512_add_ps(one, e)));
        _mm512_storeu_ps(hb + i, _mm512_mul_ps(val, _mm512_loadu_ps(hb2 + i)));
    }
    return i;
}

/* att[0..n) = expf(att[i] - mx), 16 at a time; returns how many it did. */
__attribute__((target("avx512f"))) static size_t exp_shift_avx512(float *att, size_t n, float mx) {
    const __m512 vm = _mm512_set1_ps(mx);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(att + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(att + i), vm)));
    return i;
}
#endif

void ikv__runq_swiglu(float *hb, const float *hb2, size_t n) {
    size_t i0 = 0;
#ifdef RQ_AVX2
    if (use_avx512()) i0 = swiglu_avx512(hb, hb2, n);
#endif
    for (size_t i = i0; i < n; i++) {
        float val = hb[i];
        val *= (1.0f / (1.0f + expf(-val)));
        val *= hb2[i];
        hb[i] = val;
    }
}

/* Whether x / sq can be computed as x * (1 / sq) with the same bits for every x: when sq is a
 * power of two (sqrtf(head_dim) for head_dim 4, 16, 64, 256, ...), 1 / sq is exact, and x * (1 /
 * sq) and x / sq are the same real number, which both operations round once, the same way
 * (subnormal, infinite and NaN results included). A vector division costs several times a
 * multiply, and prefill divides every score. */
static int exact_recip(float sq) {
    int ex;
    return sq > 0.0f && isfinite(sq) && frexpf(sq, &ex) == 0.5f;
}

/* out[j] = (sum over i in order of q[i] * k_j[i]) / sq for the cnt keys k_j = kb + j hd. */
static void scores_scalar(const float *q, const float *kb, size_t cnt, int hd, float sq,
                          float *out) {
    for (size_t j = 0; j < cnt; j++) {
        const float *k = kb + j * (size_t)hd;
        float score = 0.0f;
        for (int i = 0; i < hd; i++)
            score += q[i] * k[i];
        score /= sq;
        out[j] = score;
    }
}

/* out[0..hd) += a_j * v_j, j in order, for the cnt value rows v_j = vb + j hd. */
static void wsum_scalar(const float *a, const float *vb, size_t cnt, int hd, float *out) {
    for (size_t j = 0; j < cnt; j++) {
        const float *v = vb + j * (size_t)hd;
        const float aj = a[j];
        for (int i = 0; i < hd; i++)
            out[i] += aj * v[i];
    }
}

#ifdef RQ_AVX2
/* scores_scalar, 8 keys per 8 lanes (hd a multiple of 8); the tail by the scalar loop. */
__attribute__((target("avx2"))) static void scores_avx2(const float *q, const float *kb, size_t cnt,
                                                        int hd, float sq, float *out) {
    const size_t H = (size_t)hd;
    const __m256 vsq = _mm256_set1_ps(sq), vinv = _mm256_set1_ps(1.0f / sq);
    const int mul = exact_recip(sq);
    size_t j = 0;
    for (; j + 8 <= cnt; j += 8) {
        const float *k = kb + j * H;
        __m256 acc = _mm256_setzero_ps();
        for (size_t d = 0; d < H; d += 8) {
            __m256 r0 = _mm256_loadu_ps(k + d), r1 = _mm256_loadu_ps(k + H + d),
                   r2 = _mm256_loadu_ps(k + 2 * H + d), r3 = _mm256_loadu_ps(k + 3 * H + d),
                   r4 = _mm256_loadu_ps(k + 4 * H + d), r5 = _mm256_loadu_ps(k + 5 * H + d),
                   r6 = _mm256_loadu_ps(k + 6 * H + d), r7 = _mm256_loadu_ps(k + 7 * H + d);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                   t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                   t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                   u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                   u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                   u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            /* c_i: lane j = key j's element d + i */
            __m256 c0 = _mm256_permute2f128_ps(u0, u4, 0x20),
                   c1 = _mm256_permute2f128_ps(u1, u5, 0x20),
                   c2 = _mm256_permute2f128_ps(u2, u6, 0x20),
                   c3 = _mm256_permute2f128_ps(u3, u7, 0x20),
                   c4 = _mm256_permute2f128_ps(u0, u4, 0x31),
                   c5 = _mm256_permute2f128_ps(u1, u5, 0x31),
                   c6 = _mm256_permute2f128_ps(u2, u6, 0x31),
                   c7 = _mm256_permute2f128_ps(u3, u7, 0x31);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d]), c0));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + 1]), c1));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + 2]), c2));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + 3]), c3));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + 4]), c4));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + 5]), c5));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + 6]), c6));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[d + 7]), c7));
        }
        _mm256_storeu_ps(out + j, mul ? _mm256_mul_ps(acc, vinv) : _mm256_div_ps(acc, vsq));
    }
    if (j < cnt) scores_scalar(q, kb + j * H, cnt - j, hd, sq, out + j);
}

/* wsum_scalar, 8 head dimensions per 8 lanes (hd a multiple of 8, at most 256). */
__attribute__((target("avx2"))) static void wsum_avx2(const float *a, const float *vb, size_t cnt,
                                                      int hd, float *out) {
    const size_t H = (size_t)hd;
    for (size_t d0 = 0; d0 < H; d0 += 64) {
        const size_t nv = (H - d0) / 8 < 8 ? (H - d0) / 8 : 8;
        __m256 o[8];
        for (size_t v = 0; v < nv; v++)
            o[v] = _mm256_loadu_ps(out + d0 + 8 * v);
        for (size_t j = 0; j < cnt; j++) {
            const __m256 aj = _mm256_set1_ps(a[j]);
            const float *v_ = vb + j * H + d0;
            for (size_t v = 0; v < nv; v++)
                o[v] = _mm256_add_ps(o[v], _mm256_mul_ps(aj, _mm256_loadu_ps(v_ + 8 * v)));
        }
        for (size_t v = 0; v < nv; v++)
            _mm256_storeu_ps(out + d0 + 8 * v, o[v]);
    }
}
#endif

#ifdef RQ_AVX2
/* scores_scalar, 16 keys per 16 lanes (hd a multiple of 16): per 16 dimensions a 16 x 16
 * transpose of the keys (4 stages of 16 shuffles), then q[i] * k[i] added in order of i in each
 * lane; the tail (< 16 keys) by scores_avx2. */
__attribute__((target("avx512f"))) static void
scores_avx512(const float *q, const float *kb, size_t cnt, int hd, float sq, float *out) {
    const size_t H = (size_t)hd;
    const __m512 vsq = _mm512_set1_ps(sq), vinv = _mm512_set1_ps(1.0f / sq);
    const int mul = exact_recip(sq);
    size_t j = 0;
    for (; j + 16 <= cnt; j += 16) {
        const float *k = kb + j * H;
        __m512 acc = _mm512_setzero_ps();
        for (size_t d = 0; d < H; d += 16) {
            __m512 r[16], t[16], u[16];
            for (int i = 0; i < 16; i++)
                r[i] = _mm512_loadu_ps(k + (size_t)i * H + d);
            for (int i = 0; i < 16; i += 2) {
                t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
            }
            /* u[4G + c], 128-bit lane k: dimension 4k + c of keys 4G .. 4G + 3 */
            for (int G = 0; G < 4; G++) {
                u[4 * G] = _mm512_shuffle_ps(t[4 * G], t[4 * G + 2], 0x44);
                u[4 * G + 1] = _mm512_shuffle_ps(t[4 * G], t[4 * G + 2], 0xEE);
                u[4 * G + 2] = _mm512_shuffle_ps(t[4 * G + 1], t[4 * G + 3], 0x44);
                u[4 * G + 3] = _mm512_shuffle_ps(t[4 * G + 1], t[4 * G + 3], 0xEE);
            }
            __m512 cI[16]; /* cI[i]: lane j = key j's dimension d + i */
            for (int c = 0; c < 4; c++) {
                const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88),
                             v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD),
                             v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88),
                             v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
                cI[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
                cI[8 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
                cI[4 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
                cI[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
            }
            for (int i = 0; i < 16; i++)
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(q[d + (size_t)i]), cI[i]));
        }
        _mm512_storeu_ps(out + j, mul ? _mm512_mul_ps(acc, vinv) : _mm512_div_ps(acc, vsq));
    }
    if (j < cnt) scores_avx2(q, kb + j * H, cnt - j, hd, sq, out + j);
}

/* wsum_scalar, 16 head dimensions per 16 lanes (hd a multiple of 16). */
__attribute__((target("avx512f"))) static void wsum_avx512(const float *a, const float *vb,
                                                           size_t cnt, int hd, float *out) {
    const size_t H = (size_t)hd;
    for (size_t d0 = 0; d0 < H; d0 += 128) {
        const size_t nv = (H - d0) / 16 < 8 ? (H - d0) / 16 : 8;
        __m512 o[8];
        for (size_t v = 0; v < nv; v++)
            o[v] = _mm512_loadu_ps(out + d0 + 16 * v);
        for (size_t j = 0; j < cnt; j++) {
            const __m512 aj = _mm512_set1_ps(a[j]);
            const float *v_ = vb + j * H + d0;
            for (size_t v = 0; v < nv; v++)
                o[v] = _mm512_add_ps(o[v], _mm512_mul_ps(aj, _mm512_loadu_ps(v_ + 16 * v)));
        }
        for (size_t v = 0; v < nv; v++)
            _mm512_storeu_ps(out + d0 + 16 * v, o[v]);
    }
}
#endif

/* The kernels a head takes (by head_dim and CPU): 2 AVX-512, 1 AVX2, 0 scalar. */
static int attn_path(int hd) {
#ifdef RQ_AVX2
    if (!ikv__use_avx2() || hd % 8) return 0;
    return hd % 16 == 0 && use_avx512() ? 2 : 1;
#else
    (void)hd;
    return 0;
#endif
}

/* Scores of query q against the cnt keys at kb into out (runq.c's loop, see scores_scalar). */
static void scores_any(int path, const float *q, const float *kb, size_t cnt, int hd, float sq,
                       float *out) {
#ifdef RQ_AVX2
    if (path == 2) return scores_avx512(q, kb, cnt, hd, sq, out);
    if (path == 1) return scores_avx2(q, kb, cnt, hd, sq, out);
#endif
    (void)path;
    scores_scalar(q, kb, cnt, hd, sq, out);
}

static void wsum_any(int path, const float *a, const float *vb, size_t cnt, int hd, float *out) {
#ifdef RQ_AVX2
    if (path == 2) return wsum_avx512(a, vb, cnt, hd, out);
    if (path == 1) return wsum_avx2(a, vb, cnt, hd, out);
#endif
    (void)path;
    wsum_scalar(a, vb, cnt, hd, out);
}

/* runq.c's softmax over att[0..nk): max, expf(x - max), the sum in order, divide. */
static void softmax_runq(float *att, size_t nk) {
    float mx = att[0];
    for (size_t i = 1; i < nk; i++)
        if (att[i] > mx) mx = att[i];
    float sum = 0.0f;
    size_t i0 = 0;
#ifdef RQ_AVX2
    if (use_avx512()) i0 = exp_shift_avx512(att, nk, mx);
#endif
    for (size_t i = i0; i < nk; i++)
        att[i] = expf(att[i] - mx);
    for (size_t i = 0; i < nk; i++)
        sum += att[i];
    for (size_t i = 0; i < nk; i++)
        att[i] /= sum;
}

void ikv__runq_attn_head(const struct ikv_engine *e, const struct ikv_seq *s, int l, int g,
                         const float *q, size_t pos, float *att, float *out) {
    const int hd = e->m->head_dim, path = attn_path(hd);
    const size_t bt = e->bt, nk = pos + 1;
    /* runq.c: score /= sqrtf(head_size), head_size an int */
    const float sq = sqrtf((float)hd);
    for (size_t p0 = 0; p0 < nk; p0 += bt) {
        const size_t cnt = nk - p0 < bt ? nk - p0 : bt;
        scores_any(path, q, ikv__kv_at(e, s->table[p0 / bt], l, 0, g, 0), cnt, hd, sq, att + p0);
    }
    softmax_runq(att, nk);
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (size_t p0 = 0; p0 < nk; p0 += bt) {
        const size_t cnt = nk - p0 < bt ? nk - p0 : bt;
        wsum_any(path, att + p0, ikv__kv_at(e, s->table[p0 / bt], l, 1, g, 0), cnt, hd, out);
    }
}

void ikv__runq_attn_heads(const struct ikv_engine *e, const struct ikv_seq *s, int l, int h0,
                          int h1, const float *q, size_t pos, float *att, float *out) {
    const struct ikv_model *m = e->m;
    const int hd = m->head_dim, path = attn_path(hd), kvmul = m->cfg.n_heads / m->cfg.n_kv_heads;
    const size_t H = (size_t)hd, bt = e->bt, nk = pos + 1;
    const float sq = sqrtf((float)hd);
    /* block by block, every head of the range (their keys are one run in the block) */
    for (size_t p0 = 0; p0 < nk; p0 += bt) {
        const size_t cnt = nk - p0 < bt ? nk - p0 : bt;
        const uint32_t b = s->table[p0 / bt];
        for (int h = h0; h < h1; h++)
            scores_any(path, q + (size_t)(h - h0) * H, ikv__kv_at(e, b, l, 0, h / kvmul, 0), cnt,
                       hd, sq, att + (size_t)(h - h0) * nk + p0);
    }
    for (int h = h0; h < h1; h++)
        softmax_runq(att + (size_t)(h - h0) * nk, nk);
    memset(out, 0, sizeof(float) * H * (size_t)(h1 - h0));
    for (size_t p0 = 0; p0 < nk; p0 += bt) {
        const size_t cnt = nk - p0 < bt ? nk - p0 : bt;
        const uint32_t b = s->table[p0 / bt];
        for (int h = h0; h < h1; h++)
            wsum_any(path, att + (size_t)(h - h0) * nk + p0, ikv__kv_at(e, b, l, 1, h / kvmul, 0),
                     cnt, hd, out + (size_t)(h - h0) * H);
    }
}

#ifdef RQ_AVX2
/* ikv__runq_attn_rows on AVX-512: lane r of every vector is row r. sc holds qT [hd][16] then
 * S [nk][16] (nk = p0 + nr keys). Lane r takes key t only if t <= p0 + r (mask mk(t)); a
 * masked-off lane is left as it is by every operation, so each lane runs exactly
 * ikv__runq_attn_head's sequence for its row. */
__attribute__((target("avx512f"))) static void
attn_rows_avx512(const struct ikv_engine *e, const struct ikv_seq *s, int l, int g, const float *q,
                 size_t ldq, size_t p0, int nr, float *out, size_t ldo, float *sc) {
    const size_t H = (size_t)e->m->head_dim, bt = e->bt, nk = p0 + (size_t)nr;
    const __mmask16 full = (__mmask16)((1u << nr) - 1u);
#define MK(t) ((t) <= p0 ? full : (__mmask16)(full & (0xFFFFu << ((t)-p0))))
    float *qT = sc, *S = sc + 16 * H;
    for (size_t d = 0; d < H; d++)
        for (int r = 0; r < 16; r++)
            qT[d * 16 + (size_t)r] = r < nr ? q[(size_t)r * ldq + d] : 0.0f;
    const float sq = sqrtf((float)H);
    const __m512 vsq = _mm512_set1_ps(sq), vinv = _mm512_set1_ps(1.0f / sq);
    const int mul = exact_recip(sq);
    /* scores, 16 keys at a time (16 independent sums in flight; a block's last group repeats
     * its last key, not stored) */
    for (size_t b0 = 0; b0 < nk; b0 += bt) {
        const size_t cnt = nk - b0 < bt ? nk - b0 : bt;
        const float *kb = ikv__kv_at(e, s->table[b0 / bt], l, 0, g, 0);
        for (size_t j = 0; j < cnt; j += 16) {
            const float *k[16];
            for (size_t u = 0; u < 16; u++)
                k[u] = kb + (j + u < cnt ? j + u : cnt - 1) * H;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
                   a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0,
                   a15 = a0;
            for (size_t d = 0; d < H; d++) {
                const __m512 qd = _mm512_loadu_ps(qT + d * 16);
#define SC(a, u) a = _mm512_add_ps(a, _mm512_mul_ps(qd, _mm512_set1_ps(k[u][d])))
                SC(a0, 0), SC(a1, 1), SC(a2, 2), SC(a3, 3), SC(a4, 4), SC(a5, 5), SC(a6, 6);
                SC(a7, 7), SC(a8, 8), SC(a9, 9), SC(a10, 10), SC(a11, 11), SC(a12, 12);
                SC(a13, 13), SC(a14, 14), SC(a15, 15);
#undef SC
            }
            const __m512 acc[16] = {a0, a1, a2,  a3,  a4,  a5,  a6,  a7,
                                    a8, a9, a10, a11, a12, a13, a14, a15};
            for (size_t u = 0; u < 16 && j + u < cnt; u++)
                _mm512_storeu_ps(S + (b0 + j + u) * 16,
                                 mul ? _mm512_mul_ps(acc[u], vinv) : _mm512_div_ps(acc[u], vsq));
        }
    }
    /* softmax per lane: max, libm expf, sum in key order, divide */
    __m512 mx = _mm512_loadu_ps(S);
    for (size_t t = 1; t < nk; t++)
        mx = _mm512_mask_max_ps(mx, MK(t), mx, _mm512_loadu_ps(S + t * 16));
    __m512 sum = _mm512_setzero_ps();
    for (size_t t = 0; t < nk; t++) {
        const __mmask16 m = MK(t);
        const __m512 ex =
            _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_loadu_ps(S + t * 16), mx)));
        _mm512_storeu_ps(S + t * 16, ex);
        sum = _mm512_mask_add_ps(sum, m, sum, ex);
    }
    for (size_t t = 0; t < nk; t++) {
        const __m512 v = _mm512_loadu_ps(S + t * 16);
        _mm512_storeu_ps(S + t * 16, _mm512_mask_div_ps(v, MK(t), v, sum));
    }
    /* weighted sums, 16 head dimensions at a time: acc[dd] lane r = out of row r, dim d + dd */
    for (size_t d = 0; d < H; d += 16) {
        __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
               c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0,
               c15 = c0;
        for (size_t b0 = 0; b0 < nk; b0 += bt) {
            const size_t cnt = nk - b0 < bt ? nk - b0 : bt;
            const float *vb = ikv__kv_at(e, s->table[b0 / bt], l, 1, g, 0) + d;
            for (size_t j = 0; j < cnt; j++) {
                const size_t t = b0 + j;
                const __mmask16 m = MK(t);
                const __m512 a = _mm512_loadu_ps(S + t * 16);
                const float *v = vb + j * H;
#define ACC(c, dd) c = _mm512_mask_add_ps(c, m, c, _mm512_mul_ps(a, _mm512_set1_ps(v[dd])))
                ACC(c0, 0), ACC(c1, 1), ACC(c2, 2), ACC(c3, 3), ACC(c4, 4), ACC(c5, 5);
                ACC(c6, 6), ACC(c7, 7), ACC(c8, 8), ACC(c9, 9), ACC(c10, 10), ACC(c11, 11);
                ACC(c12, 12), ACC(c13, 13), ACC(c14, 14), ACC(c15, 15);
#undef ACC
            }
        }
        float tmp[16][16];
        _mm512_storeu_ps(tmp[0], c0), _mm512_storeu_ps(tmp[1], c1);
        _mm512_storeu_ps(tmp[2], c2), _mm512_storeu_ps(tmp[3], c3);
        _mm512_storeu_ps(tmp[4], c4), _mm512_storeu_ps(tmp[5], c5);
        _mm512_storeu_ps(tmp[6], c6), _mm512_storeu_ps(tmp[7], c7);
        _mm512_storeu_ps(tmp[8], c8), _mm512_storeu_ps(tmp[9], c9);
        _mm512_storeu_ps(tmp[10], c10), _mm512_storeu_ps(tmp[11], c11);
        _mm512_storeu_ps(tmp[12], c12), _mm512_storeu_ps(tmp[13], c13);
        _mm512_storeu_ps(tmp[14], c14), _mm512_storeu_ps(tmp[15], c15);
        for (int r = 0; r < nr; r++)
            for (int dd = 0; dd < 16; dd++)
                out[(size_t)r * ldo + d + (size_t)dd] = tmp[dd][r];
    }
#undef MK
}
#endif

void ikv__runq_attn_rows(const struct ikv_engine *e, const struct ikv_seq *s, int l, int g,
                         const float *q, size_t ldq, size_t p0, int nr, float *out, size_t ldo,
                         float *sc, size_t sc_floats) {
    const size_t H = (size_t)e->m->head_dim;
#ifdef RQ_AVX2
    if (use_avx512() && H % 16 == 0 && 16 * (H + p0 + (size_t)nr) <= sc_floats) {
        attn_rows_avx512(e, s, l, g, q, ldq, p0, nr, out, ldo, sc);
        return;
    }
#endif
    (void)sc_floats;
    for (int r = 0; r < nr; r++)
        ikv__runq_attn_head(e, s, l, g, q + (size_t)r * ldq, p0 + (size_t)r, sc,
                            out + (size_t)r * ldo);
}

void ikv__runq_expf_buf(float *x, size_t n) {
    size_t i = 0;
#ifdef RQ_AVX2
    if (use_avx512()) i = exp_shift_avx512(x, n, 0.0f);
#endif
    for (; i < n; i++)
        x[i] = expf(x[i]);
}

int ikv__runq_vector_exp(void) {
    return use_avx512();
}
