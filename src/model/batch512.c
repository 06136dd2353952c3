/*
 * The AVX-512 kernels for batches of rows (a draft verification's rows, batched decode), each
 * giving every row exactly the bits of the AVX2 + FMA / scalar code it replaces (forward.c), so
 * decode, verify and a response-cache hit stay identical whichever runs (tests/test_verify.c
 * compares them with the switch ikv__batch512_force on and off, and with decoding):
 *   - multi-row decode attention (ikv__attn_rows), below;
 *   - RMSNorm of 16 rows at once (ikv__rmsnorm_rows): lane j is row j, the sum of squares in the
 *     scalar loop's order per lane, then the row scaled 16 elements at a time;
 *   - SwiGLU on 16 lanes (ikv__swiglu512): swiglu_avx2's operations per element (the last
 *     n mod 16 elements under a lane mask);
 *   - the greedy argmax (ikv__argmax): the first index of the largest value, as the scalar
 *     loop `if (x[i] > x[best]) best = i` finds it (NaNs never win; x[0] NaN gives 0).
 * The weight-product kernels (16 batch rows as lanes, 4 x 4 tiles) live in linear.c, the seam of
 * every product. Measured on stories260K (a 128-row verify, 1 thread): 4.11 ms with the AVX2
 * kernels alone, 1.60 ms with these (attention 1.75 -> ~0.45 ms, weight products ~1.5 ->
 * ~0.7 ms); a one-row decode step is unchanged (docs/semantic.md).
 *
 * Multi-row attention. Why. A verify of R draft rows runs every row's attention over its own causal
 * prefix; on the bundled 8-dims-per-head model a per-row score is one 8-lane FMA followed by a
 * horizontal sum, the online softmax of a 16-key block is two short exp vectors whose polynomial is
 * one long dependency chain, and the value sums are one FMA per key and head: the per-row kernels
 * spend their time on reductions, latency and loop overhead, not arithmetic (43% of a 128-row
 * verify on stories260K). The rows of one sequence read the same K/V blocks, so here the vector
 * lanes are the ROWS: lane j of every register belongs to row j of a group of up to 16 rows, and a
 * key's or value's element is broadcast to all lanes. Each lane then performs, element for
 * element, the same operations in the same order as attn_chunk does for its row:
 *
 *   score of key i, head h:  acc_u = fma(q[c + u], k_i[c + u], acc_u) over the 8-float chunks c
 *                            of the head (acc_u from 0), then ((acc_0 + acc_1) + (acc_2 +
 *                            acc_3)) + ((acc_4 + acc_5) + (acc_6 + acc_7)), times 1/sqrt(hd)
 *                            (scores1_fma / scores2_fma: the same tree done by hadd);
 *   block maximum:           bm = s_0, then bm = s_i > bm ? s_i : bm in the order of i;
 *   online rescale:          if bm > M: (if M != -inf: a = exp(M - bm), O *= a, L *= a), M = bm;
 *   exps and their sum:      e_i = exp(s_i - M); 8 partial sums over i < cnt & ~7 (partial
 *                            i mod 8), their tree, then the tail i = cnt & ~7 .. cnt - 1 added
 *                            one by one; L += that sum (exp_shift_sum_avx2);
 *   value sums:              O[c] = fma(e_i, V_i[c], O[c]) in the order of i (pv1/pv2_fma).
 *
 * A row's key count in a block differs between rows (causality: row j sees positions
 * [0, pos_j]); the lanes of rows that do not see key i are masked out of every update (AVX-512
 * mask registers), which leaves their state exactly as the per-row loop, which never visits
 * that key, leaves it. exp is exp_neg16, operation for operation the scalar/8-lane exp of
 * forward.c. The chunk cut (IKV__DC_CHUNK blocks) and the per-(row, chunk, head) output
 * (O, M, L) in e->dpart are dc_attn's, so dc_merge and everything after are unchanged, and the
 * path is only a faster schedule: tests/test_verify.c compares a verify's logits with this
 * path on and off, and with decoding, bit for bit.
 *
 * Cost: per (16 rows, key, head) about 16 vector operations for the score, 2 for the maximum,
 * ~20 for the exp, hd/1 for the value sums: one lane's share is a fraction of the per-row
 * kernels' work. Rows of a group that see fewer keys waste lanes; groups of fewer than
 * IKV__AR_MIN rows (a lone decode row) keep the per-row kernels. Does not allocate.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AR_AVX512 1
#endif

#define AR_LANES 16
#define AR_HDMAX 64

static int ar_mode = -1; /* -1 detect, 0 off, 1 on where the CPU has AVX-512F */

void ikv__batch512_force(int on) {
    ar_mode = on < 0 ? -1 : on ? 1 : 0;
}

int ikv__batch512_on(void) {
#ifdef AR_AVX512
    /* __builtin_cpu_supports reads what libgcc filled in before main: no lazy state here */
    return ar_mode != 0 && __builtin_cpu_supports("avx512f") && ikv__use_avx2();
#else
    return 0;
#endif
}

int ikv__attn_rows_usable(const struct ikv_engine *e) {
#ifdef AR_AVX512
    if (!ikv__batch512_on()) return 0;
    const int hd = e->m->head_dim;
    const size_t ss = e->bt < e->Lmax ? e->bt : e->Lmax;
    return !e->m->gs && hd % 8 == 0 && hd <= AR_HDMAX &&
           e->S_rows * e->Lmax >= (size_t)AR_LANES * (ss + (size_t)hd);
#else
    (void)e;
    return 0;
#endif
}

#ifdef AR_AVX512
/* exp_neg8 of forward.c on 16 lanes, operation for operation (the same fused multiply-adds,
 * each rounded once), so a value gets the same bits on any of the paths. */
__attribute__((target("avx512f,fma"))) static inline __m512 exp_neg16(__m512 r) {
    r = _mm512_max_ps(r, _mm512_set1_ps(-87.0f));
    r = _mm512_min_ps(r, _mm512_setzero_ps());
    const __m512 mag = _mm512_set1_ps(EXP_MAGIC);
    const __m512 nn = _mm512_sub_ps(_mm512_fmadd_ps(r, _mm512_set1_ps(EXP_LOG2E), mag), mag);
    __m512 f = _mm512_fnmadd_ps(nn, _mm512_set1_ps(EXP_C1), r);
    f = _mm512_fnmadd_ps(nn, _mm512_set1_ps(EXP_C2), f);
    __m512 p = _mm512_set1_ps(EXP_H0);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP_H1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP_H2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP_H3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP_H4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(EXP_H5));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(f, f), f), _mm512_set1_ps(1.0f));
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(nn), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

__attribute__((target("avx512f,fma"))) size_t ikv__exp_neg16_buf(const float *x, size_t n,
                                                                 float *o) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(o + i, exp_neg16(_mm512_loadu_ps(x + i)));
    return i;
}
#else
size_t ikv__exp_neg16_buf(const float *x, size_t n, float *o) {
    (void)x, (void)n, (void)o;
    return 0;
}
#endif

#ifdef AR_AVX512
/* ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), lane by lane. */
__attribute__((target("avx512f"))) static inline __m512 tree8(const __m512 *a) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])),
                         _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7])));
}

/* The 16 lanes' scores of key k (one head): dot products with the query's 8-float chunks in 8
 * accumulators, their tree, times the scale (scores1_fma's arithmetic per lane). */
__attribute__((target("avx512f,fma"), always_inline)) static inline __m512
score16(const __m512 *qv, const float *k, const int hd, const __m512 vscale) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int u = 0; u < 8; u++)
        acc[u] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < hd; c += 8)
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++)
            acc[u] = _mm512_fmadd_ps(qv[c + u], _mm512_set1_ps(k[c + u]), acc[u]);
    return _mm512_mul_ps(tree8(acc), vscale);
}

/* One head of one chunk for the group's lanes: the state (O, M, L) after the chunk's blocks.
 * hd is a constant where the caller knows it (always_inline), so O stays in registers. */
__attribute__((target("avx512f,fma"), always_inline)) static inline void
head_chunk(const struct ikv_engine *e, const struct ikv_seq *s, int l, int g, size_t jb0,
           size_t jb1, const float *qT, __m512i vnk, size_t nkmax, float *S, const int hd,
           __m512 *Oout, __m512 *Mout, __m512 *Lout) {
    const size_t bt = e->bt, H = (size_t)hd;
    const __m512 vscale = _mm512_set1_ps(1.0f / sqrtf((float)hd));
    const __m512i zi = _mm512_setzero_si512();
    __m512 O[AR_HDMAX];
#pragma GCC unroll 64
    for (int c = 0; c < hd; c++)
        O[c] = _mm512_setzero_ps();
    __m512 M = _mm512_set1_ps(-INFINITY), L = _mm512_setzero_ps();
    __m512 qv[AR_HDMAX]; /* the query in registers (S's stores could alias qT for the compiler) */
#pragma GCC unroll 64
    for (int c = 0; c < hd; c++)
        qv[c] = _mm512_loadu_ps(qT + (size_t)c * AR_LANES);
    for (size_t jb = jb0; jb < jb1; jb++) {
        const size_t p0 = jb * bt, cntmax = nkmax - p0 < bt ? nkmax - p0 : bt;
        const __m512i vc = _mm512_min_epi32(
            _mm512_max_epi32(_mm512_sub_epi32(vnk, _mm512_set1_epi32((int)p0)), zi),
            _mm512_set1_epi32((int)bt));
        const __m512i vc8 = _mm512_and_si512(vc, _mm512_set1_epi32(~7));
        const __mmask16 act = _mm512_cmpgt_epi32_mask(vc, zi);
        const uint32_t blk = s->table[jb];
        const float *kb = ikv__kv_at(e, blk, l, 0, g, 0), *vb = ikv__kv_at(e, blk, l, 1, g, 0);
        /* keys [0, lo) are seen by every active lane, [0, lo8) are in every active lane's
         * 8-wide partial sums: there a key's lane mask is act, computed once (lo8 <= lo) */
        const size_t lo = (size_t)_mm512_mask_reduce_min_epi32(act, vc);
        const size_t lo8 = (size_t)_mm512_mask_reduce_min_epi32(act, vc8);
        /* scores, and each lane's block maximum over its keys in key order */
        __m512 bm = score16(qv, kb, hd, vscale);
        _mm512_storeu_ps(S, bm);
        size_t i = 1;
        for (; i < lo; i++) {
            const __m512 si = score16(qv, kb + i * H, hd, vscale);
            _mm512_storeu_ps(S + i * AR_LANES, si);
            bm = _mm512_mask_mov_ps(bm, _mm512_mask_cmp_ps_mask(act, si, bm, _CMP_GT_OQ), si);
        }
        for (; i < cntmax; i++) {
            const __m512 si = score16(qv, kb + i * H, hd, vscale);
            _mm512_storeu_ps(S + i * AR_LANES, si);
            const __mmask16 mi = _mm512_cmplt_epi32_mask(_mm512_set1_epi32((int)i), vc);
            bm = _mm512_mask_mov_ps(bm, _mm512_mask_cmp_ps_mask(mi, si, bm, _CMP_GT_OQ), si);
        }
        /* raise M; rescale O and L where M was finite */
        const __mmask16 upd = act & _mm512_cmp_ps_mask(bm, M, _CMP_GT_OQ);
        const __mmask16 resc = upd & _mm512_cmp_ps_mask(M, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
        if (resc) {
            const __m512 a = exp_neg16(_mm512_sub_ps(M, bm));
#pragma GCC unroll 64
            for (int c = 0; c < hd; c++)
                O[c] = _mm512_mask_mul_ps(O[c], resc, O[c], a);
            L = _mm512_mask_mul_ps(L, resc, L, a);
        }
        M = _mm512_mask_mov_ps(M, upd, bm);
        /* weights e^(s - M): 8 partial sums, their tree, the tail one by one */
        __m512 part[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++)
            part[u] = _mm512_setzero_ps();
        /* in one pass over the keys: the weight, its partial sum, O += weight x value row (in
         * key order); then the sums' tree and the tail (from the lowest tail start of a lane) */
        for (i = 0; i < lo8; i++) { /* masks act; the weight is not needed again */
            const __m512 ev = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(S + i * AR_LANES), M));
            part[i & 7] = _mm512_mask_add_ps(part[i & 7], act, part[i & 7], ev);
            const float *v = vb + i * H;
#pragma GCC unroll 64
            for (int c = 0; c < hd; c++)
                O[c] = _mm512_mask3_fmadd_ps(ev, _mm512_set1_ps(v[c]), O[c], act);
        }
        for (; i < cntmax; i++) {
            const __m512i vi = _mm512_set1_epi32((int)i);
            const __m512 ev = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(S + i * AR_LANES), M));
            _mm512_storeu_ps(S + i * AR_LANES, ev);
            const __mmask16 m8 = _mm512_cmplt_epi32_mask(vi, vc8);
            part[i & 7] = _mm512_mask_add_ps(part[i & 7], m8, part[i & 7], ev);
            const __mmask16 mi = _mm512_cmplt_epi32_mask(vi, vc);
            const float *v = vb + i * H;
#pragma GCC unroll 64
            for (int c = 0; c < hd; c++)
                O[c] = _mm512_mask3_fmadd_ps(ev, _mm512_set1_ps(v[c]), O[c], mi);
        }
        __m512 sum = tree8(part);
        for (i = lo8; i < cntmax; i++) {
            const __m512i vi = _mm512_set1_epi32((int)i);
            const __mmask16 mt =
                _mm512_cmplt_epi32_mask(vi, vc) & ~_mm512_cmplt_epi32_mask(vi, vc8);
            if (mt) sum = _mm512_mask_add_ps(sum, mt, sum, _mm512_loadu_ps(S + i * AR_LANES));
        }
        L = _mm512_mask_add_ps(L, act, L, sum);
    }
#pragma GCC unroll 64
    for (int c = 0; c < hd; c++)
        Oout[c] = O[c];
    *Mout = M, *Lout = L;
}

__attribute__((target("avx512f,fma"))) void ikv__attn_rows(const struct ikv_engine *e,
                                                       const struct ikv_seq *s, int l, size_t ch0,
                                                       size_t ch1, int h0, int h1, size_t nr,
                                                       const float *q, size_t qstride,
                                                       const size_t *pos, float *const *out,
                                                       size_t ostride, float *scratch) {
    const struct ikv_model *m = e->m;
    const int nh = m->cfg.n_heads, kvmul = nh / m->cfg.n_kv_heads, hd = m->head_dim;
    const size_t bt = e->bt, H = (size_t)hd, pstride = H + 2;
    const size_t ss = bt < e->Lmax ? bt : e->Lmax;
    float *S = scratch, *qT = scratch + (size_t)AR_LANES * ss;
    IKV_ASSERT(nr >= 1 && nr <= AR_LANES);
    IKV_ASSERT(0 <= h0 && h0 <= h1 && h1 <= nh);
    /* lane j: row j's keys (0: no row); rows without chunk ch have no key in it, so their
     * lanes are inactive there and their outputs are not written */
    int32_t nk[AR_LANES];
    size_t nkmax = 0, nch[AR_LANES];
    for (size_t j = 0; j < AR_LANES; j++) {
        nk[j] = j < nr && out[j] ? (int32_t)(pos[j] + 1) : 0;
        nch[j] = ((size_t)nk[j] + bt * IKV__DC_CHUNK - 1) / (bt * IKV__DC_CHUNK);
        if ((size_t)nk[j] > nkmax) nkmax = (size_t)nk[j];
    }
    if (!nkmax) return;
    const __m512i vnk = _mm512_loadu_si512(nk);
    const size_t nbmax = (nkmax + bt - 1) / bt;
    for (int h = h0; h < h1; h++) {
        /* the head's queries with the rows as lanes, once for all the chunks */
        for (size_t c = 0; c < H; c++)
            for (size_t j = 0; j < AR_LANES; j++)
                qT[c * AR_LANES + j] = j < nr ? q[j * qstride + (size_t)h * H + c] : 0.0f;
        for (size_t ch = ch0; ch < ch1; ch++) {
            const size_t jb0 = ch * IKV__DC_CHUNK;
            const size_t jb1 = jb0 + IKV__DC_CHUNK < nbmax ? jb0 + IKV__DC_CHUNK : nbmax;
            if (jb0 >= jb1) break;
            __m512 O[AR_HDMAX], M, L;
            if (hd == 8)
                head_chunk(e, s, l, h / kvmul, jb0, jb1, qT, vnk, nkmax, S, 8, O, &M, &L);
            else
                head_chunk(e, s, l, h / kvmul, jb0, jb1, qT, vnk, nkmax, S, hd, O, &M, &L);
            float t[AR_LANES];
            const size_t off = ch * ostride + (size_t)h * pstride;
            for (size_t c = 0; c < H; c++) {
                _mm512_storeu_ps(t, O[c]);
                for (size_t j = 0; j < nr; j++)
                    if (ch < nch[j]) out[j][off + c] = t[j];
            }
            _mm512_storeu_ps(t, M);
            for (size_t j = 0; j < nr; j++)
                if (ch < nch[j]) out[j][off + H] = t[j];
            _mm512_storeu_ps(t, L);
            for (size_t j = 0; j < nr; j++)
                if (ch < nch[j]) out[j][off + H + 1] = t[j];
        }
    }
}
#else
void ikv__attn_rows(const struct ikv_engine *e, const struct ikv_seq *s, int l, size_t ch0,
                    size_t ch1, int h0, int h1, size_t nr, const float *q, size_t qstride,
                    const size_t *pos, float *const *out, size_t ostride, float *scratch) {
    (void)e, (void)s, (void)l, (void)ch0, (void)ch1, (void)h0, (void)h1, (void)nr, (void)q,
        (void)qstride, (void)pos, (void)out, (void)ostride, (void)scratch;
    IKV_ASSERT(0 && "ikv__attn_rows without AVX-512 support compiled in");
}
#endif

#ifdef AR_AVX512
__attribute__((target("avx512f"))) void ikv__rmsnorm_rows(float *o, const float *x, const float *w,
                                                          size_t n, size_t nr, size_t ld) {
    IKV_ASSERT(nr <= AR_LANES && n >= 1);
    const __mmask16 rows = (__mmask16)((1u << nr) - 1);
    int32_t off[AR_LANES];
    for (size_t j = 0; j < AR_LANES; j++)
        off[j] = j < nr ? (int32_t)(j * ld) : 0;
    const __m512i vo = _mm512_loadu_si512(off);
    /* ss += x[j] * x[j] in the order of j, per lane (row) */
    __m512 ss = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), rows, vo, x + j, 4);
        ss = _mm512_add_ps(ss, _mm512_mul_ps(v, v));
    }
    ss = _mm512_div_ps(ss, _mm512_set1_ps((float)n));
    ss = _mm512_add_ps(ss, _mm512_set1_ps(1e-5f));
    ss = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(ss));
    float sc[AR_LANES];
    _mm512_storeu_ps(sc, ss);
    /* o[j] = w[j] * (ss * x[j]) */
    for (size_t r = 0; r < nr; r++) {
        const float *xr = x + r * ld;
        float *orow = o + r * ld;
        const __m512 vs = _mm512_set1_ps(sc[r]);
        size_t j = 0;
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_ps(orow + j, _mm512_mul_ps(_mm512_loadu_ps(w + j),
                                                     _mm512_mul_ps(vs, _mm512_loadu_ps(xr + j))));
        if (j < n) {
            const __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
            _mm512_mask_storeu_ps(
                orow + j, k,
                _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + j),
                              _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k, xr + j))));
        }
    }
}

__attribute__((target("avx512f,fma"))) size_t ikv__swiglu512(float *hb, const float *hb2,
                                                              size_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    /* 16 at a time, the last (n mod 16) under a lane mask (lanes are independent) */
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 a = _mm512_maskz_loadu_ps(k, hb + i);
        /* 0 - |a| (andnot of the sign bit, as swiglu_avx2) */
        const __m512 t = exp_neg16(_mm512_sub_ps(
            zero, _mm512_castsi512_ps(_mm512_andnot_si512(
                      _mm512_castps_si512(_mm512_set1_ps(-0.0f)), _mm512_castps_si512(a)))));
        const __m512 d = _mm512_div_ps(one, _mm512_add_ps(one, t));
        const __mmask16 pos = _mm512_cmp_ps_mask(a, zero, _CMP_GE_OQ);
        const __m512 sig = _mm512_mask_mov_ps(_mm512_mul_ps(t, d), pos, d);
        _mm512_mask_storeu_ps(
            hb + i, k, _mm512_mul_ps(_mm512_mul_ps(a, sig), _mm512_maskz_loadu_ps(k, hb2 + i)));
    }
    return n;
}

__attribute__((target("avx512f"))) static float max_nonnan512(const float *x, size_t n,
                                                              float init) {
    __m512 m0 = _mm512_set1_ps(init), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    /* max_ps(v, m) returns m where v is NaN: NaNs are skipped */
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
        m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), m1);
        m2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 32), m2);
        m3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 48), m3);
    }
    for (; i + 16 <= n; i += 16)
        m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    float l[AR_LANES], m;
    _mm512_storeu_ps(l, _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
    m = l[0];
    for (size_t j = 1; j < AR_LANES; j++)
        m = l[j] > m ? l[j] : m;
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}
/* The first i with x[i] == m (one exists), 16 comparisons at a time: == as the scalar test
 * (+0 == -0, NaN never equal). */
__attribute__((target("avx512f"))) static uint32_t first_equal512(const float *x, size_t n,
                                                                  float m) {
    const __m512 vm = _mm512_set1_ps(m);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vm, _CMP_EQ_OQ);
        if (k) return (uint32_t)(i + (size_t)__builtin_ctz((unsigned)k));
    }
    for (; i < n; i++)
        if (x[i] == m) return (uint32_t)i;
    IKV_ASSERT(0 && "the maximum is one of the values");
    return 0;
}
#else
void ikv__rmsnorm_rows(float *o, const float *x, const float *w, size_t n, size_t nr, size_t ld) {
    (void)o, (void)x, (void)w, (void)n, (void)nr, (void)ld;
    IKV_ASSERT(0 && "ikv__rmsnorm_rows without AVX-512 support compiled in");
}

size_t ikv__swiglu512(float *hb, const float *hb2, size_t n) {
    (void)hb, (void)hb2, (void)n;
    return 0;
}
#endif

uint32_t ikv__argmax(const float *x, size_t n) {
    if (n == 0 || x[0] != x[0]) return 0; /* the scalar loop keeps index 0 when x[0] is NaN */
#ifdef AR_AVX512
    if (n >= 64 && ikv__batch512_on()) {
        /* the largest non-NaN value (values that compare equal, +0 and -0, are the same
         * maximum), then its first index: what the strict > scan returns */
        const float m = max_nonnan512(x, n, x[0]);
        return first_equal512(x, n, m);
    }
#endif
    uint32_t best = 0;
    for (uint32_t i = 1; i < (uint32_t)n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}
