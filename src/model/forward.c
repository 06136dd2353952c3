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
 *   for each query head h (kv head h / (n_heads / n_kv_heads)):
 *     S = (q_h Kc^T) / sqrt(head_dim)        sgemm, T x (kT + T)
 *     causal softmax of each computed row    a scalar loop in key order; masked and pad
 *                                            entries exactly 0
 *     att_h = S Vc                           sgemm
 *   x += att Wo^T ; x += W2 (silu(xb W1^T) * (xb W3^T)) with xb = RMSNorm(x)
 *
 * Decode is one position: matrix-vector products (sgemv) for every weight, and attention as a
 * scalar loop over the keys in block order read through the block table (as llama2.c's run.c
 * computes it, with K/V in blocks instead of a contiguous array). Nothing here allocates.
 */
#include "internal.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

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

/* RMSNorm of one row: o = w * (x / sqrt(mean(x^2) + 1e-5)). */
static void rmsnorm(float *o, const float *x, const float *w, int n) {
    float ss = 0.0f;
    for (int j = 0; j < n; j++) ss += x[j] * x[j];
    ss /= (float)n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < n; j++) o[j] = w[j] * (ss * x[j]);
}

/* Rotates the (2i, 2i+1) pairs of every head of vec (width `width`) by position pos. */
static void rope(const struct ikv_engine *e, float *vec, int width, size_t pos) {
    int hs = e->m->head_dim;
    const float *c = e->rope_cos + pos * (size_t)(hs / 2), *sn = e->rope_sin + pos * (size_t)(hs / 2);
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

static void swiglu(float *hb, const float *hb2, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float a = hb[i];
        hb[i] = a * (1.0f / (1.0f + expf(-a))) * hb2[i];
    }
}

/* Position p's block and slot in a sequence. */
static inline uint32_t blk_of(const struct ikv_engine *e, const struct ikv_seq *s, size_t p) {
    return s->table[p / e->bt];
}

void ikv__prefill_tile(struct ikv_engine *e, struct ikv_seq *s, const uint32_t *tokens, size_t t0, size_t lo,
                       size_t hi) {
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
        for (int i = 0; i < T; i++) rmsnorm(e->xb + (size_t)i * D, e->x + (size_t)i * D, w->rms_att + (size_t)l * D, dim);
        gemm_xwt(T, qd, dim, e->xb, w->wq + (size_t)l * (size_t)qd * D, e->q);
        gemm_xwt(T, kvd, dim, e->xb, w->wk + (size_t)l * (size_t)kvd * D, e->k);
        gemm_xwt(T, kvd, dim, e->xb, w->wv + (size_t)l * (size_t)kvd * D, e->v);
        for (size_t p = lo; p < hi; p++) {
            size_t i = p - t0;
            rope(e, e->q + i * (size_t)qd, qd, p);
            rope(e, e->k + i * (size_t)kvd, kvd, p);
            uint32_t b = blk_of(e, s, p), slot = (uint32_t)(p % e->bt);
            for (int g = 0; g < nkv; g++) {
                memcpy(ikv__kv_at(e, b, l, 0, g, slot), e->k + i * (size_t)kvd + (size_t)g * (size_t)hd,
                       sizeof(float) * (size_t)hd);
                memcpy(ikv__kv_at(e, b, l, 1, g, slot), e->v + i * (size_t)kvd + (size_t)g * (size_t)hd,
                       sizeof(float) * (size_t)hd);
            }
        }
        /* gather K/V of positions [0, hi) block by block; zero [hi, W) */
        for (int g = 0; g < nkv; g++) {
            float *kc = e->Kc + (size_t)g * e->Lmax * (size_t)hd, *vc = e->Vc + (size_t)g * e->Lmax * (size_t)hd;
            for (size_t p0 = 0; p0 < hi; p0 += e->bt) {
                size_t cnt = hi - p0 < e->bt ? hi - p0 : e->bt;
                uint32_t b = blk_of(e, s, p0);
                memcpy(kc + p0 * (size_t)hd, ikv__kv_at(e, b, l, 0, g, 0), sizeof(float) * cnt * (size_t)hd);
                memcpy(vc + p0 * (size_t)hd, ikv__kv_at(e, b, l, 1, g, 0), sizeof(float) * cnt * (size_t)hd);
            }
            memset(kc + hi * (size_t)hd, 0, sizeof(float) * ((size_t)W - hi) * (size_t)hd);
            memset(vc + hi * (size_t)hd, 0, sizeof(float) * ((size_t)W - hi) * (size_t)hd);
        }
        for (int h = 0; h < nh; h++) {
            int g = h / kvmul;
            const float *kc = e->Kc + (size_t)g * e->Lmax * (size_t)hd, *vc = e->Vc + (size_t)g * e->Lmax * (size_t)hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, W, hd, scale, e->q + (size_t)h * (size_t)hd, qd, kc,
                        hd, 0.0f, e->S, W);
            for (int i = 0; i < T; i++) {
                float *row = e->S + (size_t)i * (size_t)W;
                size_t p = t0 + (size_t)i;
                if (p < lo || p >= hi) {
                    memset(row, 0, sizeof(float) * (size_t)W);
                    continue;
                }
                size_t nk = p + 1; /* keys 0..p */
                float mx = row[0];
                for (size_t j = 1; j < nk; j++)
                    if (row[j] > mx) mx = row[j];
                float sum = 0.0f;
                for (size_t j = 0; j < nk; j++) {
                    row[j] = expf(row[j] - mx);
                    sum += row[j];
                }
                float inv = 1.0f / sum;
                for (size_t j = 0; j < nk; j++) row[j] *= inv;
                memset(row + nk, 0, sizeof(float) * ((size_t)W - nk));
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, W, 1.0f, e->S, W, vc, hd, 0.0f,
                        e->att + (size_t)h * (size_t)hd, qd);
        }
        gemm_xwt(T, dim, qd, e->att, w->wo + (size_t)l * D * (size_t)qd, e->xb);
        for (size_t i = 0; i < (size_t)T * D; i++) e->x[i] += e->xb[i];

        for (int i = 0; i < T; i++) rmsnorm(e->xb + (size_t)i * D, e->x + (size_t)i * D, w->rms_ffn + (size_t)l * D, dim);
        gemm_xwt(T, hid, dim, e->xb, w->w1 + (size_t)l * (size_t)hid * D, e->hb);
        gemm_xwt(T, hid, dim, e->xb, w->w3 + (size_t)l * (size_t)hid * D, e->hb2);
        swiglu(e->hb, e->hb2, (size_t)T * (size_t)hid);
        gemm_xwt(T, dim, hid, e->hb, w->w2 + (size_t)l * D * (size_t)hid, e->xb);
        for (size_t i = 0; i < (size_t)T * D; i++) e->x[i] += e->xb[i];
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
            memcpy(ikv__kv_at(e, b, l, 0, g, slot), k + (size_t)g * (size_t)hd, sizeof(float) * (size_t)hd);
            memcpy(ikv__kv_at(e, b, l, 1, g, slot), v + (size_t)g * (size_t)hd, sizeof(float) * (size_t)hd);
        }
        for (int h = 0; h < nh; h++) {
            int g = h / kvmul;
            const float *qh = q + (size_t)h * (size_t)hd;
            for (size_t p0 = 0; p0 <= pos; p0 += bt) {
                const float *kb = ikv__kv_at(e, blk_of(e, s, p0), l, 0, g, 0);
                size_t cnt = pos + 1 - p0 < bt ? pos + 1 - p0 : bt;
                for (size_t t = 0; t < cnt; t++) {
                    const float *kt = kb + t * (size_t)hd;
                    float dot = 0.0f;
                    for (int i = 0; i < hd; i++) dot += qh[i] * kt[i];
                    sc[p0 + t] = dot * scale;
                }
            }
            float mx = sc[0];
            for (size_t t = 1; t <= pos; t++)
                if (sc[t] > mx) mx = sc[t];
            float sum = 0.0f;
            for (size_t t = 0; t <= pos; t++) {
                sc[t] = expf(sc[t] - mx);
                sum += sc[t];
            }
            float inv = 1.0f / sum;
            float *oh = att + (size_t)h * (size_t)hd;
            memset(oh, 0, sizeof(float) * (size_t)hd);
            for (size_t p0 = 0; p0 <= pos; p0 += bt) {
                const float *vb = ikv__kv_at(e, blk_of(e, s, p0), l, 1, g, 0);
                size_t cnt = pos + 1 - p0 < bt ? pos + 1 - p0 : bt;
                for (size_t t = 0; t < cnt; t++) {
                    float a = sc[p0 + t] * inv;
                    const float *vt = vb + t * (size_t)hd;
                    for (int i = 0; i < hd; i++) oh[i] += a * vt[i];
                }
            }
        }
        gemv(dim, qd, w->wo + (size_t)l * D * (size_t)qd, att, xb);
        for (size_t i = 0; i < D; i++) x[i] += xb[i];
        rmsnorm(xb, x, w->rms_ffn + (size_t)l * D, dim);
        gemv(hid, dim, w->w1 + (size_t)l * (size_t)hid * D, xb, e->hb);
        gemv(hid, dim, w->w3 + (size_t)l * (size_t)hid * D, xb, e->hb2);
        swiglu(e->hb, e->hb2, (size_t)hid);
        gemv(dim, hid, w->w2 + (size_t)l * D * (size_t)hid, e->hb, xb);
        for (size_t i = 0; i < D; i++) x[i] += xb[i];
    }
    ikv__logits_row(e, x, s->logits);
}
