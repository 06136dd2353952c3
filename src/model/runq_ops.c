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
 * expf is libm's, called per element, as runq.c does (glibc picks one implementation per
 * process, for both programs alike). Nothing here allocates.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RQ_AVX2 1
#endif

void ikv__runq_swiglu(float *hb, const float *hb2, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float val = hb[i];
        val *= (1.0f / (1.0f + expf(-val)));
        val *= hb2[i];
        hb[i] = val;
    }
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
__attribute__((target("avx2"))) static void scores_avx2(const float *q, const float *kb,
                                                        size_t cnt, int hd, float sq, float *out) {
    const size_t H = (size_t)hd;
    const __m256 vsq = _mm256_set1_ps(sq);
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
        _mm256_storeu_ps(out + j, _mm256_div_ps(acc, vsq));
    }
    if (j < cnt) scores_scalar(q, kb + j * H, cnt - j, hd, sq, out + j);
}

/* wsum_scalar, 8 head dimensions per 8 lanes (hd a multiple of 8, at most 256). */
__attribute__((target("avx2"))) static void wsum_avx2(const float *a, const float *vb,
                                                      size_t cnt, int hd, float *out) {
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

void ikv__runq_attn_head(const struct ikv_engine *e, const struct ikv_seq *s, int l, int g,
                         const float *q, size_t pos, float *att, float *out) {
    const int hd = e->m->head_dim;
    const size_t bt = e->bt, nk = pos + 1;
    /* runq.c: score /= sqrtf(head_size), head_size an int */
    const float sq = sqrtf((float)hd);
#ifdef RQ_AVX2
    const int vec = ikv__use_avx2() && hd % 8 == 0;
#else
    const int vec = 0;
#endif
    for (size_t p0 = 0; p0 < nk; p0 += bt) {
        const size_t cnt = nk - p0 < bt ? nk - p0 : bt;
        const float *kb = ikv__kv_at(e, s->table[p0 / bt], l, 0, g, 0);
#ifdef RQ_AVX2
        if (vec) {
            scores_avx2(q, kb, cnt, hd, sq, att + p0);
            continue;
        }
#endif
        scores_scalar(q, kb, cnt, hd, sq, att + p0);
    }
    /* runq.c's softmax over positions 0..pos */
    float mx = att[0];
    for (size_t i = 1; i < nk; i++)
        if (att[i] > mx) mx = att[i];
    float sum = 0.0f;
    for (size_t i = 0; i < nk; i++) {
        att[i] = expf(att[i] - mx);
        sum += att[i];
    }
    for (size_t i = 0; i < nk; i++)
        att[i] /= sum;
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (size_t p0 = 0; p0 < nk; p0 += bt) {
        const size_t cnt = nk - p0 < bt ? nk - p0 : bt;
        const float *vb = ikv__kv_at(e, s->table[p0 / bt], l, 1, g, 0);
#ifdef RQ_AVX2
        if (vec) {
            wsum_avx2(att + p0, vb, cnt, hd, out);
            continue;
        }
#endif
        wsum_scalar(att + p0, vb, cnt, hd, out);
    }
}
