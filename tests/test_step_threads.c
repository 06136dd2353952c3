/*
 * Tests for the per-step thread count (ikv_engine_set_threads): the server runs each request
 * class's sequences at its routed step's threads, so the engine must give the same bits at
 * every thread count, and the threads it leaves out must really do nothing.
 *   - exactness: three requests prefilled in chunks and decoded together through
 *     ikv_engine_step, and a draft verified with ikv_engine_verify, with the thread count
 *     changed before every step in a fixed pattern over 1..3 (and over 1..2 on a two-thread
 *     engine), give logits bit-identical to the run at the engine's full count, on a generated
 *     `tiny` model and on the bundled stories260K; a prefix cached at one count and reused at
 *     another too;
 *   - parking: after set_threads(k) the workers k.. run no region (the pool's per-thread
 *     region counters), those below k run every one;
 *   - errors: a count above the engine's, or negative, is IKV_EINVAL and changes nothing; 0
 *     means all; an engine created with threads = 0 has one;
 *   - a regression run of many shrinks and grows between tiny steps (lost wake-ups would hang
 *     it, a stale region would break the bits).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isokv/model.h"
#include "model/internal.h"
#include "engine_testutil.h"

enum { NSEQ = 3, DEC = 12 };

static void make_prompt(uint32_t *t, size_t n, uint64_t seed, uint32_t vocab) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        t[i] = 3 + (uint32_t)((seed >> 33) % (vocab - 3));
    }
}

/* One scripted run: NSEQ prompts (the third shares the first's first 40 tokens) prefilled in
 * chunks of 13 through batched steps, then DEC greedy decode steps of all three, then a
 * verify of a 5-token draft (the first two tokens the reference's own, then wrong ones) on
 * sequence 0. Before every step the thread count is pattern[step % np] (0: leave it). The
 * logits of every sequence after every step go to out ([steps][NSEQ][V], zeros where none). */
static size_t scripted(const ikv_model *m, int threads, const int *pattern, size_t np, float *out,
                       size_t cap_steps) {
    const int V = m->cfg.vocab_size;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = threads;
    o.max_seqs = NSEQ;
    o.tile = 16;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    uint32_t p[NSEQ][96];
    size_t n[NSEQ] = {70, 45, 83};
    for (int i = 0; i < NSEQ; i++)
        make_prompt(p[i], n[i], 11 + (uint64_t)i, (uint32_t)V);
    memcpy(p[2], p[0], 40 * sizeof(uint32_t));
    ikv_seq *s[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        ikv_request rq = {.tokens = p[i], .n = n[i], .max_new = DEC + 8};
        ikv_prefill_info info;
        assert_int_equal(ikv_engine_admit(e, &rq, &s[i], &info), 0);
    }
    size_t step = 0;
    uint32_t next[NSEQ] = {0};
    memset(out, 0, sizeof(float) * cap_steps * NSEQ * (size_t)V);
    for (int d = -1; d < DEC;) {
        if (pattern[step % np]) assert_int_equal(ikv_engine_set_threads(e, pattern[step % np]), 0);
        ikv_step_item it[NSEQ];
        size_t ni = 0;
        int pending = 0;
        for (int i = 0; i < NSEQ; i++) {
            if (ikv_seq_pending(s[i])) {
                it[ni++] = (ikv_step_item){.seq = s[i], .n = 13};
                pending = 1;
            } else if (d >= 0)
                it[ni++] = (ikv_step_item){.seq = s[i], .token = next[i]};
        }
        if (!pending && d < 0) { /* every prompt is done: decode from here */
            d = 0;
            continue;
        }
        assert_int_equal(ikv_engine_step(e, it, ni), 0);
        assert_true(step < cap_steps);
        for (int i = 0; i < NSEQ; i++)
            if (!ikv_seq_pending(s[i])) {
                memcpy(out + (step * NSEQ + (size_t)i) * (size_t)V, ikv_seq_logits(s[i]),
                       sizeof(float) * (size_t)V);
                next[i] = tu_argmax(ikv_seq_logits(s[i]), V);
            }
        step++;
        if (!pending) d++;
    }
    /* a verify on sequence 0: lead = its next token, then a draft */
    if (pattern[step % np]) assert_int_equal(ikv_engine_set_threads(e, pattern[step % np]), 0);
    uint32_t draft[5] = {1, 2, 3, 4, 5};
    float *all = out + step * NSEQ * (size_t)V; /* rows 0..5 of this slot and the next two */
    ikv_verify v = {.has_lead = 1, .lead = next[0], .draft = draft, .k = 5, .logits_all = all};
    assert_int_equal(ikv_seq_reserve(e, s[0], 6), 0);
    assert_int_equal(ikv_engine_verify(e, s[0], &v), 0);
    step += 2;
    assert_true(step <= cap_steps);
    for (int i = 0; i < NSEQ; i++)
        ikv_engine_end(e, s[i]);
    /* a warm request over the first prompt's cached blocks, at whatever count the pattern
     * says now: its logits equal the cold run's */
    if (pattern[step % np]) assert_int_equal(ikv_engine_set_threads(e, pattern[step % np]), 0);
    ikv_request rq = {.tokens = p[0], .n = n[0]};
    ikv_prefill_info info;
    ikv_seq *w;
    assert_int_equal(ikv_engine_begin(e, &rq, &w, &info), 0);
    assert_true(info.cached_tokens >= 64);
    assert_true(step < cap_steps);
    memcpy(out + step * NSEQ * (size_t)V, ikv_seq_logits(w), sizeof(float) * (size_t)V);
    step++;
    ikv_engine_end(e, w);
    assert_int_equal(ikv_engine_check(e), 1);
    ikv_engine_destroy(e);
    return step;
}

static void exact_on(const ikv_model *m) {
    const size_t cap = 64, V = (size_t)m->cfg.vocab_size, sz = cap * NSEQ * V;
    float *ref = malloc(sizeof(float) * sz), *got = malloc(sizeof(float) * sz);
    assert_non_null(ref);
    assert_non_null(got);
    const int full[] = {0};
    const int pat3[] = {1, 3, 2, 2, 1, 1, 3};
    const int pat2[] = {2, 1, 1, 2};
    size_t n3 = scripted(m, 3, full, 1, ref, cap);
    size_t g3 = scripted(m, 3, pat3, 7, got, cap);
    assert_int_equal(g3, n3);
    assert_memory_equal(got, ref, sizeof(float) * n3 * NSEQ * V);
    const int one[] = {1};
    assert_int_equal(scripted(m, 3, one, 1, got, cap), n3);
    assert_memory_equal(got, ref, sizeof(float) * n3 * NSEQ * V);
    /* a two-thread engine: its own reference (the share count is part of the arithmetic) */
    size_t n2 = scripted(m, 2, full, 1, ref, cap);
    assert_int_equal(scripted(m, 2, pat2, 4, got, cap), n2);
    assert_memory_equal(got, ref, sizeof(float) * n2 * NSEQ * V);
    free(ref);
    free(got);
}

static void test_exact_tiny(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 5, &m), 0);
    exact_on(m);
    ikv_model_destroy(m);
}

static void test_exact_stories(void **st) {
    (void)st;
    ikv_model *m;
    if (ikv_model_load("data/models/stories260K/stories260K.bin", &m))
        fail_msg("bundled model: %s", ikv_errdetail());
    exact_on(m);
    ikv_model_destroy(m);
}

/* After set_threads(k) the workers k.. run no region, the others every one. */
static void test_parking(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 3, &m), 0);
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = 3;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    assert_int_equal(ikv_engine_threads(e), 3);
    uint32_t p[50];
    make_prompt(p, 50, 9, (uint32_t)c.vocab_size);
    ikv_request rq = {.tokens = p, .n = 50, .no_cache = 1};
    ikv_seq *s;
    int ks[] = {1, 2, 3, 1, 3, 2};
    for (int round = 0; round < 6; round++) {
        const int k = ks[round];
        assert_int_equal(ikv_engine_set_threads(e, k), 0);
        assert_int_equal(ikv_engine_threads(e), k);
        uint64_t before[3], after[3];
        for (int t = 0; t < 3; t++)
            before[t] = ikv__pool_ran(e->pool, t);
        assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
        const float *lg;
        for (int d = 0; d < 5; d++)
            assert_int_equal(ikv_engine_decode(e, s, 7, &lg), 0);
        ikv_engine_end(e, s);
        for (int t = 0; t < 3; t++)
            after[t] = ikv__pool_ran(e->pool, t);
        assert_true(after[0] > before[0]);
        for (int t = 1; t < 3; t++) {
            if (t < k)
                assert_int_equal(after[t] - before[t], after[0] - before[0]);
            else
                assert_int_equal(after[t], before[t]);
        }
    }
    assert_true(ikv_engine_worker_cpu(e) >= 0);
    /* errors change nothing; 0 = all */
    assert_int_equal(ikv_engine_set_threads(e, 2), 0);
    assert_int_equal(ikv_engine_set_threads(e, 4), IKV_EINVAL);
    assert_int_equal(ikv_engine_set_threads(e, -1), IKV_EINVAL);
    assert_int_equal(ikv_engine_threads(e), 2);
    assert_int_equal(ikv_engine_set_threads(e, 0), 0);
    assert_int_equal(ikv_engine_threads(e), 3);
    ikv_engine_destroy(e);
    /* threads = 0: one thread, nothing else allowed */
    o.threads = 0;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    assert_int_equal(ikv_engine_threads(e), 1);
    assert_int_equal(ikv_engine_set_threads(e, 1), 0);
    assert_int_equal(ikv_engine_set_threads(e, 2), IKV_EINVAL);
    assert_int_equal(ikv_engine_worker_cpu(e), 0);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* Regression guard for the park/unpark handshake: 600 changes of the count, each followed by
 * one short decode, on a four-thread engine; every decode's logits equal the first one's
 * (the same position is decoded again after each rollback-free restart). */
static void test_regress_park_handshake(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 4, &m), 0);
    const int V = c.vocab_size;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = 4;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    uint32_t p[20];
    make_prompt(p, 20, 2, (uint32_t)V);
    ikv_request rq = {.tokens = p, .n = 20};
    float *first = malloc(sizeof(float) * (size_t)V);
    uint64_t x = 99;
    for (int i = 0; i < 600; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        assert_int_equal(ikv_engine_set_threads(e, 1 + (int)((x >> 40) % 4)), 0);
        ikv_seq *s;
        assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
        const float *lg;
        assert_int_equal(ikv_engine_decode(e, s, 5, &lg), 0);
        if (i == 0)
            memcpy(first, lg, sizeof(float) * (size_t)V);
        else
            assert_memory_equal(lg, first, sizeof(float) * (size_t)V);
        ikv_engine_end(e, s);
    }
    free(first);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_tiny),
        cmocka_unit_test(test_exact_stories),
        cmocka_unit_test(test_parking),
        cmocka_unit_test(test_regress_park_handshake),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
