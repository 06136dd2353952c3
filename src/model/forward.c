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
 * Per tile and layer:
 *
 *   xb = RMSNorm(x)                          all T rows
 *   q, k, v = xb Wq^T, xb Wk^T, xb Wv^T      sgemm, M = T
 *   RoPE(q, k) at each row's position        computed rows only
 *   K/V of computed rows -> their blocks     through the sequence's block table
 *   Kc, Vc = K/V of positions [0, kT+T)      gathered through the block table (from the
 *                                            blocks, whether cached or just written); zero
 *                                            past the last computed row
 *   for each kv head g, with the query heads that share it stacked (kvmul = n_heads / n_kv_heads):
 *     S = (Q_g Kc^T) / sqrt(head_dim)        sgemm, (kvmul T) x (kT + T)
 *     causal softmax of each computed row    fixed-order loops (softmax_row); masked and pad
 *                                            entries exactly 0
 *     att_g = S Vc                           sgemm
 *   x += att Wo^T ; x += W2 (silu(xb W1^T) * (xb W3^T)) with xb = RMSNorm(x)
 *
 * Decode is one position: matrix-vector products (sgemv) for every weight; attention reads
 * each key and value once, block by block through the table, for all the query heads that
 * share its kv head (4-lane SSE2 dot products and axpys in a fixed order; BLAS sgemv on a
 * 16 x head_dim block costs more in call overhead than it saves). Nothing here allocates.
 */
#include "internal.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- softmax ------------------------------------------------------------------------------
 * exp(r) for r <= 0 as 2^n * e^f, n = round(r / ln 2), f = r - n ln 2 (Cody-Waite split), e^f
 * by a degree-7 polynomial (Cephes expf coefficients; relative error ~1e-7 on [-ln2/2, ln2/2]);
 * r is clamped at -87 (e^-87 ~ 1.6e-38, nothing next to the row maximum's 1). The SSE2 lanes
 * and the scalar tail do the same operations in the same order (C11 mode: no FMA contraction),
 * so a value's result does not depend on which path computed it. libm's expf costs a call per
 * attention entry; this is 4 entries per few instructions. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define EXP_C1    0.693359375f
#define EXP_C2    -2.12194440e-4f

static inline float exp_neg_scalar(float r) {
    r = r > -87.0f ? r : -87.0f;
    float n = (r * EXP_LOG2E + EXP_MAGIC) - EXP_MAGIC;
    float f = (r - n * EXP_C1) - n * EXP_C2;
    float p = 1.9875691500e-4f;
    p = p * f + 1.3981999507e-3f;
    p = p * f + 8.3334519073e-3f;
    p = p * f + 4.1665795894e-2f;
    p = p * f + 1.6666665459e-1f;
    p = p * f + 5.0000001201e-1f;
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
    const __m128 mag = _mm_set1_ps(EXP_MAGIC);
    __m128 nn = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(r, _mm_set1_ps(EXP_LOG2E)), mag), mag);
    __m128 f = _mm_sub_ps(_mm_sub_ps(r, _mm_mul_ps(nn, _mm_set1_ps(EXP_C1))),
                          _mm_mul_ps(nn, _mm_set1_ps(EXP_C2)));
    __m128 p = _mm_set1_ps(1.9875691500e-4f);
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(1.3981999507e-3f));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(8.3334519073e-3f));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(4.1665795894e-2f));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(1.6666665459e-1f));
    p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(5.0000001201e-1f));
    p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(p, _mm_mul_ps(f, f)), f), _mm_set1_ps(1.0f));
    __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(nn), _mm_set1_epi32(127)), 23);
    return _mm_mul_ps(p, _mm_castsi128_ps(e));
}
#endif

/* row[0..n) = softmax(row[0..n)) in place. Max and sum use 4 partial lanes combined in a
 * fixed order: deterministic for a given n. Does not allocate. */
static void softmax_row(float *row, size_t n) {
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
    float inv = 1.0f / sum;
    for (i = 0; i < n; i++)
        row[i] *= inv;
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

/* y[0..n) += a * x[0..n). */
static inline void axpy(float *y, float a, const float *x, int n) {
    int i = 0;
#if defined(__SSE2__)
    __m128 a4 = _mm_set1_ps(a);
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(y + i, _mm_add_ps(_mm_loadu_ps(y + i), _mm_mul_ps(a4, _mm_loadu_ps(x + i))));
#endif
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* Asks for the n floats at p to be brought into cache: the next KV block lies elsewhere in the
 * pool, where the hardware prefetcher does not follow. */
static inline void prefetch_chunk(const float *p, size_t n) {
    for (size_t i = 0; i < n; i += 16)
        __builtin_prefetch(p + i, 0, 3);
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

/* Rotates the (2i, 2i+1) pairs of every head of vec (width `width`) by position pos. */
static void rope(const struct ikv_engine *e, float *vec, int width, size_t pos) {
    int hs = e->m->head_dim;
    const float *c = e->rope_cos + pos * (size_t)(hs / 2),
                *sn = e->rope_sin + pos * (size_t)(hs / 2);
    for (int i = 0; i < width; i += 2) {
        int j = (i % hs) / 2;
        float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * c[j] - v1 * sn[j];
        vec[i + 1] = v0 * sn[j] + v1 * c[j];
    }
}

/* Y[M][N] = X[M][K] W[N][K]^T (W row-major (out, in), as stored). */
static void gemm_xwt(int M, int N, int K, const float *X, const float *W, float *Y) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, X, K, W, K, 0.0f, Y, N);
}

/* y[N] = W[N][K] x[K]. */
static void gemv(int N, int K, const float *W, const float *x, float *y) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, W, K, x, 1, 0.0f, y, 1);
}

/* hb = silu(hb) * hb2, silu(a) = a * sigmoid(a), with sigmoid from t = e^-|a| <= 1 (never
 * overflows): 1 / (1 + t) for a >= 0, t / (1 + t) otherwise. SSE2 lanes and the scalar tail do
 * the same operations. */
static void swiglu(float *hb, const float *hb2, size_t n) {
    size_t i = 0;
#if defined(__SSE2__)
    const __m128 one = _mm_set1_ps(1.0f), zero = _mm_setzero_ps(), sign = _mm_set1_ps(-0.0f);
    for (; i + 4 <= n; i += 4) {
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
        float t = exp_neg_scalar(0.0f - fabsf(a));
        float d = 1.0f / (1.0f + t);
        float sig = a >= 0.0f ? d : t * d;
        hb[i] = (a * sig) * hb2[i];
    }
}

/* Position p's block and slot in a sequence. */
static inline uint32_t blk_of(const struct ikv_engine *e, const struct ikv_seq *s, size_t p) {
    return s->table[p / e->bt];
}

void ikv__prefill_tile(struct ikv_engine *e, struct ikv_seq *s, const uint32_t *tokens, size_t t0,
                       size_t lo, size_t hi) {
    const struct ikv_model *m = e->m;
    const ikv__weights *w = &m->w;
    const int T = (int)e->T, dim = m->cfg.dim, hid = m->cfg.hidden_dim, L = m->cfg.n_layers;
    const int nh = m->cfg.n_heads, nkv = m->cfg.n_kv_heads, hd = m->head_dim;
    const int qd = m->q_dim, kvd = m->kv_dim, kvmul = nh / nkv;
    const int W = (int)(t0 + (size_t)T); /* attention width: keys [0, t0 + T) */
    const float scale = 1.0f / sqrtf((float)hd);
    const size_t D = (size_t)dim;

    memset(e->x, 0, sizeof(float) * (size_t)T * D);
    for (size_t p = lo; p < hi; p++)
        memcpy(e->x + (p - t0) * D, w->emb + (size_t)tokens[p] * D, sizeof(float) * D);

    for (int l = 0; l < L; l++) {
        for (int i = 0; i < T; i++)
            rmsnorm(e->xb + (size_t)i * D, e->x + (size_t)i * D, w->rms_att + (size_t)l * D, dim);
        gemm_xwt(T, qd, dim, e->xb, w->wq + (size_t)l * (size_t)qd * D, e->q);
        gemm_xwt(T, kvd, dim, e->xb, w->wk + (size_t)l * (size_t)kvd * D, e->k);
        gemm_xwt(T, kvd, dim, e->xb, w->wv + (size_t)l * (size_t)kvd * D, e->v);
        for (size_t p = lo; p < hi; p++) {
            size_t i = p - t0;
            rope(e, e->q + i * (size_t)qd, qd, p);
            rope(e, e->k + i * (size_t)kvd, kvd, p);
            uint32_t b = blk_of(e, s, p), slot = (uint32_t)(p % e->bt);
            for (int g = 0; g < nkv; g++) {
                memcpy(ikv__kv_at(e, b, l, 0, g, slot),
                       e->k + i * (size_t)kvd + (size_t)g * (size_t)hd, sizeof(float) * (size_t)hd);
                memcpy(ikv__kv_at(e, b, l, 1, g, slot),
                       e->v + i * (size_t)kvd + (size_t)g * (size_t)hd, sizeof(float) * (size_t)hd);
            }
        }
        /* gather K/V of positions [0, hi) block by block; zero [hi, W) */
        for (int g = 0; g < nkv; g++) {
            float *kc = e->Kc + (size_t)g * e->Lmax * (size_t)hd,
                  *vc = e->Vc + (size_t)g * e->Lmax * (size_t)hd;
            for (size_t p0 = 0; p0 < hi; p0 += e->bt) {
                size_t cnt = hi - p0 < e->bt ? hi - p0 : e->bt;
                uint32_t b = blk_of(e, s, p0);
                memcpy(kc + p0 * (size_t)hd, ikv__kv_at(e, b, l, 0, g, 0),
                       sizeof(float) * cnt * (size_t)hd);
                memcpy(vc + p0 * (size_t)hd, ikv__kv_at(e, b, l, 1, g, 0),
                       sizeof(float) * cnt * (size_t)hd);
            }
            memset(kc + hi * (size_t)hd, 0, sizeof(float) * ((size_t)W - hi) * (size_t)hd);
            memset(vc + hi * (size_t)hd, 0, sizeof(float) * ((size_t)W - hi) * (size_t)hd);
        }
        /* per kv head: the kvmul query heads that share it are stacked into one sgemm */
        for (int g = 0; g < nkv; g++) {
            const float *kc = e->Kc + (size_t)g * e->Lmax * (size_t)hd,
                        *vc = e->Vc + (size_t)g * e->Lmax * (size_t)hd;
            const int M = kvmul * T;
            for (int j = 0; j < kvmul; j++)
                for (int i = 0; i < T; i++)
                    memcpy(e->qg + ((size_t)j * (size_t)T + (size_t)i) * (size_t)hd,
                           e->q + (size_t)i * (size_t)qd + (size_t)(g * kvmul + j) * (size_t)hd,
                           sizeof(float) * (size_t)hd);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, W, hd, scale, e->qg, hd, kc, hd,
                        0.0f, e->S, W);
            for (int r = 0; r < M; r++) {
                float *row = e->S + (size_t)r * (size_t)W;
                size_t p = t0 + (size_t)(r % T);
                if (p < lo || p >= hi) {
                    memset(row, 0, sizeof(float) * (size_t)W);
                    continue;
                }
                size_t nk = p + 1; /* keys 0..p */
                softmax_row(row, nk);
                memset(row + nk, 0, sizeof(float) * ((size_t)W - nk));
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, W, 1.0f, e->S, W, vc, hd,
                        0.0f, e->qg, hd);
            for (int j = 0; j < kvmul; j++)
                for (int i = 0; i < T; i++)
                    memcpy(e->att + (size_t)i * (size_t)qd + (size_t)(g * kvmul + j) * (size_t)hd,
                           e->qg + ((size_t)j * (size_t)T + (size_t)i) * (size_t)hd,
                           sizeof(float) * (size_t)hd);
        }
        gemm_xwt(T, dim, qd, e->att, w->wo + (size_t)l * D * (size_t)qd, e->xb);
        for (size_t i = 0; i < (size_t)T * D; i++)
            e->x[i] += e->xb[i];

        for (int i = 0; i < T; i++)
            rmsnorm(e->xb + (size_t)i * D, e->x + (size_t)i * D, w->rms_ffn + (size_t)l * D, dim);
        gemm_xwt(T, hid, dim, e->xb, w->w1 + (size_t)l * (size_t)hid * D, e->hb);
        gemm_xwt(T, hid, dim, e->xb, w->w3 + (size_t)l * (size_t)hid * D, e->hb2);
        swiglu(e->hb, e->hb2, (size_t)T * (size_t)hid);
        gemm_xwt(T, dim, hid, e->hb, w->w2 + (size_t)l * D * (size_t)hid, e->xb);
        for (size_t i = 0; i < (size_t)T * D; i++)
            e->x[i] += e->xb[i];
    }
}

void ikv__logits_row(struct ikv_engine *e, const float *xrow, float *out) {
    const struct ikv_model *m = e->m;
    rmsnorm(e->xfinal, xrow, m->w.rms_final, m->cfg.dim);
    gemv(m->cfg.vocab_size, m->cfg.dim, m->w.wcls, e->xfinal, out);
}

void ikv__decode_step(struct ikv_engine *e, struct ikv_seq *s, uint32_t token, size_t pos) {
    const struct ikv_model *m = e->m;
    const ikv__weights *w = &m->w;
    const int dim = m->cfg.dim, hid = m->cfg.hidden_dim, L = m->cfg.n_layers;
    const int nh = m->cfg.n_heads, nkv = m->cfg.n_kv_heads, hd = m->head_dim;
    const int qd = m->q_dim, kvd = m->kv_dim, kvmul = nh / nkv;
    const size_t D = (size_t)dim, bt = e->bt;
    const float scale = 1.0f / sqrtf((float)hd);
    float *x = e->x, *xb = e->xb, *q = e->q, *k = e->k, *v = e->v, *att = e->att, *sc = e->S;

    memcpy(x, w->emb + (size_t)token * D, sizeof(float) * D);
    uint32_t b = blk_of(e, s, pos), slot = (uint32_t)(pos % bt);
    for (int l = 0; l < L; l++) {
        rmsnorm(xb, x, w->rms_att + (size_t)l * D, dim);
        gemv(qd, dim, w->wq + (size_t)l * (size_t)qd * D, xb, q);
        gemv(kvd, dim, w->wk + (size_t)l * (size_t)kvd * D, xb, k);
        gemv(kvd, dim, w->wv + (size_t)l * (size_t)kvd * D, xb, v);
        rope(e, q, qd, pos);
        rope(e, k, kvd, pos);
        for (int g = 0; g < nkv; g++) {
            memcpy(ikv__kv_at(e, b, l, 0, g, slot), k + (size_t)g * (size_t)hd,
                   sizeof(float) * (size_t)hd);
            memcpy(ikv__kv_at(e, b, l, 1, g, slot), v + (size_t)g * (size_t)hd,
                   sizeof(float) * (size_t)hd);
        }
        /* attention, per kv head: scores of its query heads against each key, read block by
         * block through the table; softmax; then the weighted sum of the values */
        const size_t nk = pos + 1;
        for (int g = 0; g < nkv; g++) {
            for (size_t p0 = 0; p0 < nk; p0 += bt) {
                size_t cnt = nk - p0 < bt ? nk - p0 : bt;
                const float *kb = ikv__kv_at(e, blk_of(e, s, p0), l, 0, g, 0);
                if (p0 + bt < nk)
                    prefetch_chunk(ikv__kv_at(e, blk_of(e, s, p0 + bt), l, 0, g, 0),
                                   bt * (size_t)hd);
                for (size_t t = 0; t < cnt; t++)
                    for (int j = 0; j < kvmul; j++)
                        sc[(size_t)j * e->Lmax + p0 + t] =
                            dot(q + (size_t)(g * kvmul + j) * (size_t)hd, kb + t * (size_t)hd, hd) *
                            scale;
            }
            for (int j = 0; j < kvmul; j++) {
                softmax_row(sc + (size_t)j * e->Lmax, nk);
                memset(att + (size_t)(g * kvmul + j) * (size_t)hd, 0, sizeof(float) * (size_t)hd);
            }
            for (size_t p0 = 0; p0 < nk; p0 += bt) {
                size_t cnt = nk - p0 < bt ? nk - p0 : bt;
                const float *vb = ikv__kv_at(e, blk_of(e, s, p0), l, 1, g, 0);
                if (p0 + bt < nk)
                    prefetch_chunk(ikv__kv_at(e, blk_of(e, s, p0 + bt), l, 1, g, 0),
                                   bt * (size_t)hd);
                for (size_t t = 0; t < cnt; t++)
                    for (int j = 0; j < kvmul; j++)
                        axpy(att + (size_t)(g * kvmul + j) * (size_t)hd,
                             sc[(size_t)j * e->Lmax + p0 + t], vb + t * (size_t)hd, hd);
            }
        }
        gemv(dim, qd, w->wo + (size_t)l * D * (size_t)qd, att, xb);
        for (size_t i = 0; i < D; i++)
            x[i] += xb[i];
        rmsnorm(xb, x, w->rms_ffn + (size_t)l * D, dim);
        gemv(hid, dim, w->w1 + (size_t)l * (size_t)hid * D, xb, e->hb);
        gemv(hid, dim, w->w3 + (size_t)l * (size_t)hid * D, xb, e->hb2);
        swiglu(e->hb, e->hb2, (size_t)hid);
        gemv(dim, hid, w->w2 + (size_t)l * D * (size_t)hid, e->hb, xb);
        for (size_t i = 0; i < D; i++)
            x[i] += xb[i];
    }
    ikv__logits_row(e, x, s->logits);
}
