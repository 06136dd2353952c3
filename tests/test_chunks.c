/*
 * Tests of structured requests and position-independent chunk reuse (src/model/chunks.c):
 * re-rotation of keys to a new offset against keys computed there (layer 0), r = 1 and the
 * no-hit fallback bit-identical to the ordinary prefill, tenant scopes of reusable segments,
 * the quality guard (a tight bound forces the exact prefill; any bound holds for the tokens
 * left reused), reuse of documents in a new order, the shared-first layout, and the engine and
 * store invariants after every request. On the generated `tiny` model and the bundled
 * stories260K (for a run with real text).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isokv/model.h"
#include "testutil.h"

static ikv_model *tiny(void) {
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 11, &m), 0);
    return m;
}

static void fill(uint32_t *t, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        t[i] = 3 + (x >> 8) % 500;
    }
}

static ikv_engine *mk_engine(const ikv_model *m, int threads) {
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = threads;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    return e;
}

/* Logits of the ordinary prefill of tokens on a fresh engine. */
static void ref_logits(const ikv_model *m, int threads, const uint32_t *t, size_t n, float *out) {
    ikv_engine *e = mk_engine(m, threads);
    ikv_request rq = {.tokens = t, .n = n};
    ikv_seq *s;
    assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
    memcpy(out, ikv_seq_logits(s), sizeof(float) * (size_t)ikv_model_cfg(m)->vocab_size);
    ikv_engine_end(e, s);
    ikv_engine_destroy(e);
}

static size_t concat(const ikv_prompt_seg *g, size_t n, uint32_t *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        memcpy(out + k, g[i].tokens, g[i].n * 4), k += g[i].n;
    return k;
}

/* Runs a structured request, checks the invariants, returns its last logits in out. */
static ikv_blend_info run(ikv_engine *e, ikv_chunks *c, const ikv_prompt_seg *g, size_t n,
                          const char *tenant, float ratio, float max_dev, float *out) {
    ikv_blend_request r = {
        .segs = g, .n_segs = n, .tenant = tenant, .ratio = ratio, .max_dev = max_dev};
    ikv_seq *s;
    ikv_blend_info inf;
    assert_int_equal(ikv_chunks_begin(c, &r, &s, &inf), 0);
    if (out)
        memcpy(out, ikv_seq_logits(s),
               sizeof(float) * (size_t)ikv_model_cfg(ikv_engine_model(e))->vocab_size);
    assert_true(ikv_engine_check(e));
    /* decode works on a blended sequence */
    const float *lg;
    assert_int_equal(ikv_engine_decode(e, s, 5, &lg), 0);
    ikv_engine_end(e, s);
    assert_true(ikv_engine_check(e));
    assert_true(ikv_chunks_check(c));
    return inf;
}

/* A document's layer-0 keys computed at offset a, re-rotated by b - a, equal (to float
 * rounding) its keys computed at offset b: layer 0 has no cross-attention. */
static void test_rerotation(void **st) {
    (void)st;
    ikv_model *m = tiny();
    const ikv_model_config *cf = ikv_model_cfg(m);
    ikv_engine *e = mk_engine(m, 1);
    ikv_chunks *c;
    assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
    const size_t kd = (size_t)(cf->dim / cf->n_heads * cf->n_kv_heads), nd = 40;
    uint32_t t[256];
    float *ka = malloc(nd * kd * 4), *kb = malloc(nd * kd * 4), *v = malloc(kd * 4);
    size_t offs[][2] = {{3, 150}, {150, 3}, {17, 18}};
    for (size_t z = 0; z < 3; z++) {
        size_t a = offs[z][0], b = offs[z][1];
        float *dst[2] = {ka, kb};
        for (int w = 0; w < 2; w++) {
            size_t off = w ? b : a;
            fill(t, off, 100 + (uint32_t)w); /* different text before */
            fill(t + off, nd, 7);            /* the same document */
            ikv_request rq = {.tokens = t, .n = off + nd + 1, .no_cache = 1};
            t[off + nd] = 9;
            ikv_seq *s;
            assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
            for (size_t p = 0; p < nd; p++)
                assert_int_equal(ikv_seq_kv(e, s, off + p, 0, dst[w] + p * kd, v), 0);
            ikv_engine_end(e, s);
        }
        /* without re-rotation they differ (positions differ) */
        double raw = 0, err = 0, mag = 0;
        for (size_t i = 0; i < nd * kd; i++)
            raw = fmax(raw, fabs(ka[i] - kb[i]));
        ikv_chunks_rerotate(c, ka, nd, (long)b - (long)a);
        for (size_t i = 0; i < nd * kd; i++)
            err = fmax(err, fabs(ka[i] - kb[i])), mag = fmax(mag, fabs(kb[i]));
        assert_true(raw > 1e-2 * mag);
        assert_true(err <= 1e-5 * (mag > 1 ? mag : 1));
    }
    free(ka), free(kb), free(v);
    ikv_chunks_destroy(c);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* Docs reused in a new order: hits, the ratio honoured, r = 1 and a tight guard give the
 * ordinary prefill's logits bit for bit; any guard bound holds for the tokens left reused. */
static void test_reorder_ratio_guard(void **st) {
    (void)st;
    ikv_model *m = tiny();
    const size_t V = (size_t)ikv_model_cfg(m)->vocab_size;
    ikv_engine *e = mk_engine(m, 2);
    ikv_chunks *c;
    ikv_chunks_options co;
    ikv_chunks_options_default(&co);
    assert_int_equal(ikv_chunks_create(e, &co, &c), 0);
    uint32_t sys[20], d[3][50], q[8], all[256];
    fill(sys, 20, 1), fill(d[0], 50, 2), fill(d[1], 50, 3), fill(d[2], 50, 4), fill(q, 8, 5);
    ikv_prompt_seg g1[5] = {{IKV_PSEG_SYSTEM, sys, 20, 1, 0, 0},
                            {IKV_PSEG_DOC, d[0], 50, 1, 1, 1},
                            {IKV_PSEG_DOC, d[1], 50, 1, 1, 1},
                            {IKV_PSEG_DOC, d[2], 50, 1, 1, 1},
                            {IKV_PSEG_QUERY, q, 8, 0, 0, 0}};
    float *lg = malloc(V * 4), *ref = malloc(V * 4);
    /* nothing stored: the ordinary prefill, bit for bit; the docs get stored */
    ikv_blend_info inf = run(e, c, g1, 5, "u1", -1, -1, lg);
    assert_int_equal(inf.full, 1);
    assert_int_equal(inf.miss_segments, 3);
    assert_int_equal(inf.stored_segments, 3);
    ref_logits(m, 2, all, concat(g1, 5, all), ref);
    assert_memory_equal(lg, ref, V * 4);
    /* new order: 3, 1, 2 */
    ikv_prompt_seg g2[5] = {g1[0], g1[3], g1[1], g1[2], g1[4]};
    size_t n2 = concat(g2, 5, all);
    ref_logits(m, 2, all, n2, ref);
    inf = run(e, c, g2, 5, "u1", 0.2f, 0, lg);
    assert_int_equal(inf.full, 0);
    assert_int_equal(inf.hit_segments, 3);
    assert_int_equal(inf.reusable_tokens, 150);
    /* recomputed: 4 first tokens of each doc plus ceil(0.2 x 150) = 30 */
    assert_int_equal(inf.recomputed_tokens, 12 + 30);
    assert_int_equal(inf.reused_tokens, 150 - 42);
    assert_true(inf.deviation_max > 0);
    /* close to the exact logits, not equal */
    double dmax = 0;
    for (size_t i = 0; i < V; i++)
        dmax = fmax(dmax, fabs(lg[i] - ref[i]));
    assert_true(dmax > 0);
    /* r = 1: the ordinary prefill, bit for bit */
    inf = run(e, c, g2, 5, "u1", 1.0f, 0, lg);
    assert_int_equal(inf.full, 1);
    assert_memory_equal(lg, ref, V * 4);
    /* a bound below every deviation: up to full, exact */
    inf = run(e, c, g2, 5, "u1", 0.1f, 1e-9f, lg);
    assert_int_equal(inf.full, 1);
    assert_memory_equal(lg, ref, V * 4);
    /* a bound between: every token left reused is within it, and it recomputed more */
    ikv_blend_info r0 = run(e, c, g2, 5, "u1", 0.1f, 0, NULL);
    float mid = (float)(r0.deviation_max * 0.5);
    inf = run(e, c, g2, 5, "u1", 0.1f, mid, NULL);
    assert_int_equal(inf.full, 0);
    assert_true(inf.deviation_max <= mid);
    assert_true(inf.guard_tokens > 0);
    assert_true(inf.recomputed_tokens > r0.recomputed_tokens);
    /* the same order as stored: the placed K/V are what a fresh prefill computes (up to the
     * tiling's rounding), so the deviation is tiny */
    inf = run(e, c, g1, 5, "u1", 0.0f, 0, NULL);
    assert_int_equal(inf.hit_segments, 3);
    assert_true(inf.deviation_max < 1e-4);
    free(lg), free(ref);
    ikv_chunks_destroy(c);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* A private reusable segment is keyed under its tenant's scope; a public one is shared. */
static void test_scopes(void **st) {
    (void)st;
    ikv_model *m = tiny();
    ikv_engine *e = mk_engine(m, 1);
    ikv_chunks *c;
    assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
    uint32_t a[30], b[40], d[60], q[5];
    fill(a, 30, 21), fill(b, 40, 22), fill(d, 60, 23), fill(q, 5, 24);
    ikv_prompt_seg pa[3] = {{IKV_PSEG_MEMORY, a, 30, 0, 0, 1},
                            {IKV_PSEG_DOC, d, 60, 0, 1, 1},
                            {IKV_PSEG_QUERY, q, 5, 0, 0, 0}};
    ikv_prompt_seg pb[3] = {{IKV_PSEG_MEMORY, b, 40, 0, 0, 1},
                            {IKV_PSEG_DOC, d, 60, 0, 1, 1},
                            {IKV_PSEG_QUERY, q, 5, 0, 0, 0}};
    ikv_blend_info inf = run(e, c, pa, 3, "alice", -1, -1, NULL);
    assert_int_equal(inf.stored_segments, 1);
    inf = run(e, c, pb, 3, "bob", -1, -1, NULL); /* private doc: bob misses */
    assert_int_equal(inf.hit_segments, 0);
    assert_int_equal(inf.full, 1);
    assert_int_equal(inf.stored_segments, 1);       /* bob's own copy */
    inf = run(e, c, pb, 3, "alice", 0.1f, 0, NULL); /* alice hits hers behind another context */
    assert_int_equal(inf.hit_segments, 1);
    assert_int_equal(inf.full, 0);
    size_t ent;
    ikv_chunks_stats(c, &ent, NULL);
    assert_int_equal(ent, 2);
    /* public: stored once, carol hits it */
    pa[1].is_public = pb[1].is_public = 1;
    inf = run(e, c, pa, 3, "alice", -1, -1, NULL);
    assert_int_equal(inf.stored_segments, 1);
    inf = run(e, c, pb, 3, "carol", 0.1f, 0, NULL);
    assert_int_equal(inf.hit_segments, 1);
    assert_true(inf.reused_tokens > 0);
    ikv_chunks_destroy(c);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* Bad requests are refused naming the problem; a reusable last segment is never reused. */
static void test_errors_and_last(void **st) {
    (void)st;
    ikv_model *m = tiny();
    ikv_engine *e = mk_engine(m, 1);
    ikv_chunks *c;
    assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
    uint32_t d[30], q[4] = {3, 4, 5, 600};
    fill(d, 30, 31);
    ikv_prompt_seg g[2] = {{IKV_PSEG_QUERY, q, 4, 0, 0, 0}, {IKV_PSEG_DOC, d, 30, 0, 1, 0}};
    ikv_blend_request r = {.segs = g, .n_segs = 2, .ratio = -1, .max_dev = -1};
    ikv_seq *s;
    assert_int_equal(ikv_chunks_begin(c, &r, &s, NULL), IKV_EINVAL); /* 600 >= vocab 512 */
    assert_non_null(strstr(ikv_errdetail(), "segments[0] token 3"));
    q[3] = 6;
    g[0].n = 0;
    assert_int_equal(ikv_chunks_begin(c, &r, &s, NULL), IKV_EINVAL);
    assert_non_null(strstr(ikv_errdetail(), "segments[0] (query) has no tokens"));
    g[0].n = 4;
    r.n_segs = 0;
    assert_int_equal(ikv_chunks_begin(c, &r, &s, NULL), IKV_EINVAL);
    r.n_segs = 2;
    /* the doc is last: computed, not stored, never looked up */
    ikv_blend_info inf = run(e, c, g, 2, NULL, -1, -1, NULL);
    assert_int_equal(inf.stored_segments, 0);
    inf = run(e, c, g, 2, NULL, -1, -1, NULL);
    assert_int_equal(inf.hit_segments, 0);
    int k;
    assert_int_equal(ikv_pseg_kind_parse("doc", &k), 0);
    assert_int_equal(k, IKV_PSEG_DOC);
    assert_int_equal(ikv_pseg_kind_parse("docs", &k), IKV_EINVAL);
    ikv_chunks_destroy(c);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* Leading segments in the prefix cache: a structured request whose system prompt (public) is
 * cached takes its full blocks from the prefix cache (reported), the rest is blended; the
 * blended logits are bit-identical to the same request on an engine whose prefix cache did not
 * hold the system prompt (the leading part is prefilled exactly either way); r = 1 equals the
 * full prefill bit for bit, with the same cached count. */
static void test_prefix_cached_lead(void **st) {
    (void)st;
    ikv_model *m = tiny();
    const size_t V = (size_t)ikv_model_cfg(m)->vocab_size;
    uint32_t sys[40], m1[20], m2[24], d[50], q[8], all[256];
    fill(sys, 40, 51), fill(m1, 20, 52), fill(m2, 24, 53), fill(d, 50, 54), fill(q, 8, 55);
    ikv_prompt_seg a[4] = {{IKV_PSEG_SYSTEM, sys, 40, 1, 0, 0},
                           {IKV_PSEG_MEMORY, m1, 20, 0, 0, 0},
                           {IKV_PSEG_DOC, d, 50, 1, 1, 0},
                           {IKV_PSEG_QUERY, q, 8, 0, 0, 0}};
    ikv_prompt_seg b[4] = {a[0], {IKV_PSEG_MEMORY, m2, 24, 0, 0, 0}, a[2], a[3]};
    float *lg1 = malloc(V * 4), *lg2 = malloc(V * 4), *ref = malloc(V * 4);
    ikv_blend_info i1, i2;
    for (int w = 0; w < 2; w++) {
        ikv_engine *e = mk_engine(m, 2);
        ikv_chunks *c;
        assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
        /* w = 0: request a fills the prefix cache (system prompt) and stores the doc; w = 1:
         * the same doc K/V stored by a cold request that leaves the prefix cache empty */
        ikv_blend_request ra = {
            .segs = a, .n_segs = 4, .tenant = "u1", .ratio = -1, .max_dev = -1, .no_cache = w};
        ikv_seq *s;
        ikv_blend_info ia;
        assert_int_equal(ikv_chunks_begin(c, &ra, &s, &ia), 0);
        assert_int_equal(ia.stored_segments, 1);
        ikv_engine_end(e, s);
        /* another tenant, another memory: the public system prompt's 2 full blocks (32 of its
         * 40 tokens; block 2 holds private tokens too) come from the prefix cache (w = 0) */
        uint8_t hits[4] = {9, 9, 9, 9};
        ikv_blend_request rb = {
            .segs = b, .n_segs = 4, .tenant = "u2", .ratio = 0.2f, .max_dev = 0, .hits = hits};
        ikv_blend_info *ib = w ? &i2 : &i1;
        assert_int_equal(ikv_chunks_begin(c, &rb, &s, ib), 0);
        memcpy(w ? lg2 : lg1, ikv_seq_logits(s), V * 4);
        assert_true(ikv_engine_check(e));
        ikv_engine_end(e, s);
        assert_int_equal(ib->full, 0);
        assert_int_equal(ib->hit_segments, 1);
        assert_int_equal(hits[0] + hits[1] + hits[3], 0);
        assert_int_equal(hits[2], 1);
        assert_int_equal(ib->prefix_cached_tokens, w ? 0 : 32);
        assert_int_equal(ib->prefill.cached_tokens, ib->prefix_cached_tokens + ib->reused_tokens);
        assert_int_equal(ib->prefill.computed_tokens + ib->prefill.cached_tokens, 40 + 24 + 50 + 8);
        if (!w) {
            /* r = 1: the full prefill, bit for bit; the blended request's exact leading part
             * (system + u2's memory, 64 tokens = 4 blocks) went into the prefix cache */
            ikv_blend_info ir = run(e, c, b, 4, "u2", 1.0f, 0, ref);
            assert_int_equal(ir.full, 1);
            assert_int_equal(ir.prefill.cached_tokens, 64);
            float *exact = malloc(V * 4);
            ref_logits(m, 2, all, concat(b, 4, all), exact);
            assert_memory_equal(ref, exact, V * 4);
            free(exact);
        }
        ikv_chunks_destroy(c);
        ikv_engine_destroy(e);
    }
    assert_int_equal(i1.reused_tokens, i2.reused_tokens);
    assert_memory_equal(lg1, lg2, V * 4);
    free(lg1), free(lg2), free(ref);
    ikv_model_destroy(m);
}

/* int8 weights: the blend pass runs the int8 products (the KV stays fp32): r = 1 and a guard
 * below every deviation are bit-identical to the int8 model's full prefill; a blend at r = 0.5
 * is near it (the same model; a wrong int8 product would be far) and differs from the fp32
 * model's blend. */
static void test_int8(void **st) {
    (void)st;
    ikv_model *f = tiny(), *m;
    assert_int_equal(ikv_model_quantize(f, 8, &m), 0);
    assert_int_equal(ikv_model_group(m), 8);
    const size_t V = (size_t)ikv_model_cfg(m)->vocab_size;
    uint32_t sys[20], d[2][60], q[8], all[256];
    fill(sys, 20, 61), fill(d[0], 60, 62), fill(d[1], 60, 63), fill(q, 8, 64);
    ikv_prompt_seg g1[4] = {{IKV_PSEG_SYSTEM, sys, 20, 1, 0, 0},
                            {IKV_PSEG_DOC, d[0], 60, 1, 1, 1},
                            {IKV_PSEG_DOC, d[1], 60, 1, 1, 1},
                            {IKV_PSEG_QUERY, q, 8, 0, 0, 0}};
    ikv_prompt_seg g2[4] = {g1[0], g1[2], g1[1], g1[3]};
    const size_t n2 = concat(g2, 4, all);
    float *lg = malloc(V * 4), *ref = malloc(V * 4), *lf = malloc(V * 4), *lq = malloc(V * 4);
    ref_logits(m, 2, all, n2, ref);
    float spread = 0;
    for (size_t i = 0; i < V; i++)
        spread = fmaxf(spread, fabsf(ref[i] - ref[0]));
    for (int z = 0; z < 2; z++) {
        ikv_model *mm = z ? f : m;
        ikv_engine *e = mk_engine(mm, 2);
        ikv_chunks *c;
        assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
        ikv_blend_info inf = run(e, c, g1, 4, NULL, -1, -1, NULL);
        assert_int_equal(inf.stored_segments, 2);
        inf = run(e, c, g2, 4, NULL, 0.5f, 0, z ? lf : lg);
        assert_int_equal(inf.full, 0);
        assert_int_equal(inf.hit_segments, 2);
        assert_true(inf.reused_tokens > 0);
        if (!z) {
            memcpy(lq, lg, V * 4);
            double dmax = 0;
            for (size_t i = 0; i < V; i++)
                dmax = fmax(dmax, fabs(lg[i] - ref[i]));
            assert_true(dmax > 0);
            assert_true(dmax < 0.25 * spread + 1e-3);
            inf = run(e, c, g2, 4, NULL, 1.0f, 0, lg); /* r = 1 */
            assert_int_equal(inf.full, 1);
            assert_memory_equal(lg, ref, V * 4);
            inf = run(e, c, g2, 4, NULL, 0.1f, 1e-9f, lg); /* the guard: up to full, exact */
            assert_int_equal(inf.full, 1);
            assert_memory_equal(lg, ref, V * 4);
        }
        ikv_chunks_destroy(c);
        ikv_engine_destroy(e);
    }
    assert_memory_not_equal(lq, lf, V * 4); /* the int8 blend is not the fp32 one */
    free(lg), free(ref), free(lf), free(lq);
    ikv_model_destroy(m);
    ikv_model_destroy(f);
}

/* Regression: the int8 blend pass's activation scratch was indexed by row x the projection's
 * input width, so two threads at different projections (dim vs hidden wide) overlapped and the
 * blended logits came out different from run to run. The int8 products give every row the
 * same bits whatever rows share a call and the attention is split by fixed chunks, so the blend
 * must be bit-identical at 1 and 2 threads, every time. */
static void test_int8_threads_regression(void **st) {
    (void)st;
    ikv_model *f = tiny(), *m;
    assert_int_equal(ikv_model_quantize(f, 8, &m), 0);
    const size_t V = (size_t)ikv_model_cfg(m)->vocab_size;
    uint32_t ctx[30], d[2][70], q[6];
    fill(ctx, 30, 91), fill(d[0], 70, 92), fill(d[1], 70, 93), fill(q, 6, 94);
    ikv_prompt_seg g1[3] = {{IKV_PSEG_DOC, d[0], 70, 1, 1, 1},
                            {IKV_PSEG_DOC, d[1], 70, 1, 1, 1},
                            {IKV_PSEG_QUERY, q, 6, 0, 0, 0}};
    ikv_prompt_seg g2[4] = {{IKV_PSEG_MEMORY, ctx, 30, 0, 0, 0}, g1[1], g1[0], g1[2]};
    float *lg[2] = {malloc(V * 4), malloc(V * 4)};
    for (int rep = 0; rep < 8; rep++) /* the race showed in about one run of 8 */
        for (int t = 0; t < 2; t++) {
            ikv_engine *e = mk_engine(m, t + 1);
            ikv_chunks *c;
            assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
            run(e, c, g1, 3, NULL, -1, -1, NULL);
            ikv_blend_info inf = run(e, c, g2, 4, NULL, 0.3f, 0, lg[t]);
            assert_int_equal(inf.full, 0);
            ikv_chunks_destroy(c);
            ikv_engine_destroy(e);
            if (t) assert_memory_equal(lg[0], lg[1], V * 4);
        }
    free(lg[0]), free(lg[1]);
    ikv_model_destroy(m);
    ikv_model_destroy(f);
}

/* The job API as the server drives it: the exact part prefilled in chunks of 7 positions
 * inside steps that also decode another sequence, the blend pass in units of 8 rows with the
 * invariants checked between; the logits equal the same job's driven alone bit for bit
 * (prefill and decode are chunk- and batch-invariant, the units the same), and
 * ikv_chunks_begin's (one unit per stage) within 1e-4 of the logit spread. A job ended half way
 * releases the pass to the next; the guard's abandon makes the rest pending prefill, exact. */
static void test_job_steps(void **st) {
    (void)st;
    ikv_model *m = tiny();
    const size_t V = (size_t)ikv_model_cfg(m)->vocab_size;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = 2, o.max_seqs = 3;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    ikv_chunks *c;
    assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
    uint32_t ctx[37], d[2][40], q[5], all[256];
    fill(ctx, 37, 101), fill(d[0], 40, 102), fill(d[1], 40, 103), fill(q, 5, 104);
    ikv_prompt_seg g1[3] = {{IKV_PSEG_DOC, d[0], 40, 1, 1, 1},
                            {IKV_PSEG_DOC, d[1], 40, 1, 1, 1},
                            {IKV_PSEG_QUERY, q, 5, 0, 0, 0}};
    ikv_prompt_seg g2[4] = {{IKV_PSEG_MEMORY, ctx, 37, 0, 0, 0}, g1[1], g1[0], g1[2]};
    float *ref = malloc(V * 4), *exact = malloc(V * 4);
    run(e, c, g1, 3, NULL, -1, -1, NULL);                         /* stores both documents */
    ikv_blend_info rinf = run(e, c, g2, 4, "t", 0.25f, 0, exact); /* all at once */
    assert_int_equal(rinf.full, 0);
    { /* the reference: the same job alone, units of 8 rows */
        ikv_blend_request br = {
            .segs = g2, .n_segs = 4, .tenant = "t", .ratio = 0.25f, .no_cache = 1};
        ikv_blend_job *j;
        assert_int_equal(ikv_chunks_admit(c, &br, &j), 0);
        ikv_seq *s = ikv_chunks_job_seq(j);
        int rc;
        while ((rc = ikv_chunks_advance(c, j, 8)) == 0)
            if (ikv_seq_pending(s)) {
                ikv_step_item it = {.seq = s};
                assert_int_equal(ikv_engine_step(e, &it, 1), 0);
            }
        assert_int_equal(rc, 1);
        memcpy(ref, ikv_seq_logits(s), V * 4);
        ikv_chunks_job_end(c, j);
        ikv_engine_end(e, s);
        /* split into units the bits may differ (which rows share a product), not the result */
        float spread = 0, dmax = 0;
        for (size_t i = 0; i < V; i++)
            spread = fmaxf(spread, fabsf(exact[i] - exact[0])),
            dmax = fmaxf(dmax, fabsf(exact[i] - ref[i]));
        assert_true(dmax <= 1e-4f * spread);
    }
    /* another sequence decoding all along */
    uint32_t other[9];
    fill(other, 9, 105);
    ikv_request orq = {.tokens = other, .n = 9};
    ikv_seq *os;
    assert_int_equal(ikv_engine_begin(e, &orq, &os, NULL), 0);
    for (int abort_first = 1; abort_first >= 0; abort_first--) {
        /* no_cache: the exact part computed here (the run above cached it), in chunks */
        ikv_blend_request br = {
            .segs = g2, .n_segs = 4, .tenant = "t", .ratio = 0.25f, .no_cache = 1};
        ikv_blend_job *j, *j2 = NULL;
        assert_int_equal(ikv_chunks_admit(c, &br, &j), 0);
        ikv_seq *s = ikv_chunks_job_seq(j);
        assert_int_equal(ikv_seq_pending(s), 37); /* the exact part: the memory */
        if (abort_first) {                        /* a second job waits for the pass */
            assert_int_equal(ikv_chunks_admit(c, &br, &j2), 0);
        }
        int rc, layers = 0, decodes = 0;
        while ((rc = ikv_chunks_advance(c, j, 8)) == 0) {
            assert_true(ikv_chunks_check(c));
            if (!ikv_seq_pending(s)) {
                layers++;
                if (abort_first && layers == 3) break;
                if (!j2) continue;
            }
            ikv_step_item it[3] = {{.seq = os, .token = 7}, {.seq = s, .n = 7}};
            size_t ni = 1;
            if (ikv_seq_pending(s)) ni = 2;
            if (j2 && ikv_seq_pending(ikv_chunks_job_seq(j2)))
                it[ni++] = (ikv_step_item){.seq = ikv_chunks_job_seq(j2), .n = 7};
            assert_int_equal(ikv_engine_step(e, it, ni), 0);
            decodes++;
            if (j2 && layers >= 1 && !ikv_seq_pending(ikv_chunks_job_seq(j2)))
                assert_int_equal(ikv_chunks_advance(c, j2, 8), 0); /* j holds the pass */
        }
        if (abort_first) { /* end it half way: j2 takes the pass */
            ikv_chunks_job_end(c, j);
            ikv_engine_end(e, s);
            assert_true(ikv_chunks_check(c));
            j = j2, s = ikv_chunks_job_seq(j2);
            while ((rc = ikv_chunks_advance(c, j, 8)) == 0)
                if (ikv_seq_pending(s)) {
                    ikv_step_item it = {.seq = s};
                    assert_int_equal(ikv_engine_step(e, &it, 1), 0);
                }
        }
        assert_int_equal(rc, 1);
        assert_true(decodes >= 6); /* 37 positions in chunks of 7, each step with a decode */
        ikv_blend_info inf;
        ikv_chunks_job_info(j, &inf);
        assert_int_equal(inf.blend_layers, ikv_model_cfg(m)->n_layers);
        assert_int_equal(inf.reused_tokens, rinf.reused_tokens);
        assert_memory_equal(ikv_seq_logits(s), ref, V * 4);
        ikv_chunks_job_end(c, j);
        ikv_engine_end(e, s);
        assert_true(ikv_chunks_check(c));
        assert_true(ikv_engine_check(e));
    }
    /* the guard selects every reused token: the rest becomes pending, then exact */
    ikv_blend_request br = {
        .segs = g2, .n_segs = 4, .tenant = "t", .ratio = 0.1f, .max_dev = 1e-9f};
    ikv_blend_job *j;
    assert_int_equal(ikv_chunks_admit(c, &br, &j), 0);
    ikv_seq *s = ikv_chunks_job_seq(j);
    int rc, pending_again = 0;
    while ((rc = ikv_chunks_advance(c, j, 8)) == 0)
        if (ikv_seq_pending(s)) {
            pending_again += ikv_seq_len(s) >= 37;
            ikv_step_item it = {.seq = s, .n = 11};
            assert_int_equal(ikv_engine_step(e, &it, 1), 0);
        }
    assert_int_equal(rc, 1);
    assert_true(pending_again > 0);
    ikv_blend_info inf;
    ikv_chunks_job_info(j, &inf);
    assert_int_equal(inf.full, 1);
    ref_logits(m, 2, all, concat(g2, 4, all), exact);
    assert_memory_equal(ikv_seq_logits(s), exact, V * 4);
    ikv_chunks_job_end(c, j);
    ikv_engine_end(e, s);
    ikv_engine_end(e, os);
    assert_true(ikv_chunks_check(c));
    assert_true(ikv_engine_check(e));
    free(ref), free(exact);
    ikv_chunks_destroy(c);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

static void test_shared_first(void **st) {
    (void)st;
    uint32_t t[1] = {5};
    ikv_prompt_seg in[5] = {{IKV_PSEG_SYSTEM, t, 1, 1, 0, 0},
                            {IKV_PSEG_MEMORY, t, 2, 0, 0, 1},
                            {IKV_PSEG_DOC, t, 3, 1, 1, 1},
                            {IKV_PSEG_DOC, t, 4, 0, 1, 1},
                            {IKV_PSEG_QUERY, t, 5, 0, 0, 0}};
    ikv_prompt_seg out[5];
    size_t moved = ikv_psegs_shared_first(in, 5, out);
    size_t want[5] = {1, 3, 4, 2, 5};
    for (int i = 0; i < 5; i++)
        assert_int_equal(out[i].n, want[i]);
    assert_int_equal(moved, 3);
    assert_int_equal(ikv_psegs_shared_first(out, 5, in), 0);
}

/* The bundled model, real text: documents reused in another order keep the greedy next token
 * at r = 0.5 most of the time is not asserted (quality is measured, docs/chunks.md); here: the
 * pass runs on a real checkpoint and r = 1 is exact. */
static void test_stories260k(void **st) {
    (void)st;
    ikv_model *m;
    if (ikv_model_load("data/models/stories260K/stories260K.bin", &m)) skip();
    ikv_tokenizer *tk;
    assert_int_equal(ikv_tokenizer_load("data/models/stories260K/tok512.bin", 512, &tk), 0);
    const char *txt[3] = {"Lily went to the park with her mom. She saw a big red ball.",
                          "Tom had a little dog. The dog liked to run and jump.",
                          "One day, a bird sat on a tree. It sang a happy song."};
    uint32_t d[3][96], q[64];
    size_t nd[3], nq;
    for (int i = 0; i < 3; i++)
        assert_int_equal(ikv_tokenizer_encode(tk, txt[i], i == 0, 0, d[i], 96, &nd[i]), 0);
    assert_int_equal(ikv_tokenizer_encode(tk, "Once upon a time", 0, 0, q, 64, &nq), 0);
    ikv_engine *e = mk_engine(m, 1);
    ikv_chunks *c;
    assert_int_equal(ikv_chunks_create(e, NULL, &c), 0);
    ikv_prompt_seg g[4] = {{IKV_PSEG_DOC, d[0], nd[0], 1, 1, 1},
                           {IKV_PSEG_DOC, d[1], nd[1], 1, 1, 1},
                           {IKV_PSEG_DOC, d[2], nd[2], 1, 1, 1},
                           {IKV_PSEG_QUERY, q, nq, 0, 0, 0}};
    run(e, c, g, 4, NULL, -1, -1, NULL);
    ikv_prompt_seg g2[4] = {g[2], g[0], g[1], g[3]};
    ikv_blend_info inf = run(e, c, g2, 4, NULL, 0.3f, 0, NULL);
    assert_int_equal(inf.hit_segments, 3);
    assert_int_equal(inf.full, 0);
    float ref[512], lg[512];
    uint32_t all[256];
    ref_logits(m, 1, all, concat(g2, 4, all), ref);
    run(e, c, g2, 4, NULL, 1.0f, 0, lg);
    assert_memory_equal(lg, ref, sizeof ref);
    ikv_chunks_destroy(c);
    ikv_engine_destroy(e);
    ikv_tokenizer_destroy(tk);
    ikv_model_destroy(m);
}

/* Runs $IKV_BIN with argv[1..] (stdout and stderr to files under dir); returns the exit code
 * and the stderr text in err. */
static int run_cli(const char *dir, char **argv, char *err, size_t errn) {
    char op[512], ep[512];
    snprintf(op, sizeof op, "%s/out", dir), snprintf(ep, sizeof ep, "%s/err", dir);
    argv[0] = (char *)tu_bin();
    int rc = tu_run((const char *const *)argv, op, ep, 120);
    FILE *f = fopen(ep, "rb");
    size_t k = f ? fread(err, 1, errn - 1, f) : 0;
    err[k] = 0;
    if (f) fclose(f);
    return rc;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* isokv run --segments: a second request with the documents reordered reuses them; bad files
 * are refused naming the field (exit 1), bad flags are usage errors (exit 2). */
static void test_cli_segments(void **st) {
    (void)st;
    char dir[64], path[600], err[8192];
    assert_int_equal(tu_tmpdir(dir, sizeof dir, "chunks"), 0);
    snprintf(path, sizeof path, "%s/req.json", dir);
    put(path, "[{\"tenant\":\"u1\",\"segments\":[{\"kind\":\"system\",\"text\":\"A story.\","
              "\"public\":true},{\"kind\":\"doc\",\"text\":\"Lily went to the park with her mom. "
              "She saw a big red ball.\",\"reusable\":true,\"movable\":true},{\"kind\":\"doc\","
              "\"text\":\"Tom had a little dog. The dog liked to run.\",\"reusable\":true,"
              "\"movable\":true},{\"kind\":\"query\",\"text\":\"Once upon a time\"}]},"
              "{\"tenant\":\"u1\",\"segments\":[{\"kind\":\"system\",\"text\":\"A story.\","
              "\"public\":true},{\"kind\":\"doc\",\"text\":\"Tom had a little dog. The dog liked "
              "to run.\",\"reusable\":true},{\"kind\":\"doc\",\"text\":\"Lily went to the park "
              "with her mom. She saw a big red ball.\",\"reusable\":true},{\"kind\":\"query\","
              "\"text\":\"Once upon a time\"}]}]");
    char *a1[] = {NULL, "run", "--segments", path, "-n", "8", "--blend-ratio", "0.2", NULL};
    assert_int_equal(run_cli(dir, a1, err, sizeof err), 0);
    assert_non_null(strstr(err, "(0 hit, 2 missed, 2 stored)"));
    assert_non_null(strstr(err, "(2 hit, 0 missed, 0 stored)"));
    assert_non_null(strstr(err, "blended"));
    char *a2[] = {NULL, "run", "--segments", path, "--prompt", "x", NULL};
    assert_int_equal(run_cli(dir, a2, err, sizeof err), 2);
    char *a3[] = {NULL, "run", "--segments", path, "--layout", "random", NULL};
    assert_int_equal(run_cli(dir, a3, err, sizeof err), 2);
    char *a4[] = {NULL, "run", "--segments", path, "--blend-ratio", "1.5", NULL};
    assert_int_equal(run_cli(dir, a4, err, sizeof err), 2);
    const char *bad[][2] = {
        {"{\"segments\":[{\"kind\":\"doc\",\"tokens\":[1,2,700]}]}",
         "request.segments[0].tokens[2]: not a token id"},
        {"[{\"segments\":[]}]", "requests[0].segments: required"},
        {"{\"segments\":[{\"kind\":\"dox\",\"text\":\"a\"}]}", "segments[0].kind: \"dox\""},
        {"{\"segments\":[{\"kind\":\"doc\"}]}", "exactly one of \"text\" or \"tokens\""},
        {"{\"segments\":[{\"kind\":\"doc\",\"text\":\"a\",\"reusable\":1}]}",
         "segments[0].reusable: must be true or false"},
        {"{\"segments\":[{\"kind\":\"doc\",\"text\":\"a\"}],\"blend_ratio\":2}",
         "request.blend_ratio"},
        {"[{\"segments\":", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put(path, bad[i][0]);
        char *a[] = {NULL, "run", "--segments", path, NULL};
        assert_int_equal(run_cli(dir, a, err, sizeof err), 1);
        if (!strstr(err, bad[i][1])) fail_msg("case %zu: %s", i, err);
    }
    char *a5[] = {NULL, "run", "--segments", "/nonexistent/req.json", NULL};
    assert_int_equal(run_cli(dir, a5, err, sizeof err), 1);
    assert_non_null(strstr(err, "cannot open"));
    assert_int_equal(tu_rmtree(dir), 0);
}

/* bench engine --chunks on tiny: r = 1 is the exact prefill (agreement 1, KL 0 exactly); a
 * prompt that does not fit is a usage error. */
static void test_cli_bench(void **st) {
    (void)st;
    char dir[64], err[8192], path[600];
    assert_int_equal(tu_tmpdir(dir, sizeof dir, "chunks"), 0);
    char *a[] = {NULL,        "bench", "engine",       "--chunks", "--model",   "tiny",
                 "--prompts", "2",     "--repeat",     "1",        "--next",    "4",
                 "--ratios",  "0,1",   "--doc-tokens", "40",       "--context", "16",
                 "--threads", "1",     "--json",       NULL};
    assert_int_equal(run_cli(dir, a, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/out", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char out[4096];
    size_t k = fread(out, 1, sizeof out - 1, f);
    out[k] = 0;
    fclose(f);
    assert_non_null(strstr(out, "{\"r\":1,\"agreement\":1.0000,\"mean_kl\":0.000000,"));
    assert_non_null(strstr(out, "{\"r\":0,"));
    char *b[] = {NULL,   "bench",        "engine", "--chunks", "--model",
                 "tiny", "--doc-tokens", "100",    NULL};
    assert_int_equal(run_cli(dir, b, err, sizeof err), 2);
    assert_non_null(strstr(err, "exceed seq_len"));
    assert_int_equal(tu_rmtree(dir), 0);
}

/* One try of ikv_chunks_create for tu_alloc_fail_each. */
typedef struct chunks_try {
    ikv_engine *e;
    ikv_chunks *c;
} chunks_try;

static int try_chunks(void *ctx) {
    chunks_try *t = ctx;
    t->c = NULL;
    return ikv_chunks_create(t->e, NULL, &t->c);
}

/* Allocation failures: create fails cleanly at every allocation (ASan checks for leaks); a
 * store that cannot allocate leaves the request working and the segment unstored. */
static void test_alloc_failures(void **st) {
    (void)st;
    ikv_model *m = tiny();
    ikv_engine *e = mk_engine(m, 1);
    chunks_try t = {e, NULL};
    tu_alloc_fail_each(try_chunks, &t, 100);
    ikv_chunks *c = t.c;
    { /* an int8 model's create (its activation scratch too) */
        ikv_model *q8;
        assert_int_equal(ikv_model_quantize(m, 8, &q8), 0);
        chunks_try t8 = {mk_engine(q8, 1), NULL};
        tu_alloc_fail_each(try_chunks, &t8, 100);
        ikv_chunks_destroy(t8.c);
        ikv_engine_destroy(t8.e);
        ikv_model_destroy(q8);
    }
    uint32_t d[30], q[4];
    fill(d, 30, 41), fill(q, 4, 42);
    ikv_prompt_seg g[2] = {{IKV_PSEG_DOC, d, 30, 1, 1, 1}, {IKV_PSEG_QUERY, q, 4, 0, 0, 0}};
    ikv_alloc_fail_after(0);
    ikv_blend_request r = {.segs = g, .n_segs = 2, .ratio = -1, .max_dev = -1};
    ikv_seq *s;
    ikv_blend_info inf;
    int rc = ikv_chunks_begin(c, &r, &s, &inf);
    ikv_alloc_fail_after(SIZE_MAX);
    assert_int_equal(rc, 0);
    assert_int_equal(inf.stored_segments, 0);
    ikv_engine_end(e, s);
    assert_true(ikv_chunks_check(c));
    ikv_blend_info i2 = run(e, c, g, 2, NULL, -1, -1, NULL);
    assert_int_equal(i2.stored_segments, 1);
    ikv_chunks_dump(c, stderr);
    ikv_chunks_destroy(c);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rerotation),     cmocka_unit_test(test_reorder_ratio_guard),
        cmocka_unit_test(test_scopes),         cmocka_unit_test(test_errors_and_last),
        cmocka_unit_test(test_shared_first),   cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_cli_segments),   cmocka_unit_test(test_cli_bench),
        cmocka_unit_test(test_alloc_failures), cmocka_unit_test(test_prefix_cached_lead),
        cmocka_unit_test(test_int8),           cmocka_unit_test(test_int8_threads_regression),
        cmocka_unit_test(test_job_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
