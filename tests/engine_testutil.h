/*
 * Helpers for the tests that drive the engine directly (test_model, test_verify, test_quant,
 * test_step_threads, test_tiers): the greedy pick and the greedy reference of one request alone
 * on a fresh engine, which those tests compare batched, cached, verified or re-threaded runs
 * against bit for bit. Header-only (static inline), so a test that includes it and uses only
 * part of it compiles without unused-function warnings. Needs cmocka.h and model/internal.h
 * included before it (the reference reads m->cfg).
 */
#ifndef IKV_ENGINE_TESTUTIL_H
#define IKV_ENGINE_TESTUTIL_H

#include <stdint.h>
#include <string.h>

/* The index of the largest of l[0..n) (the first on a tie): greedy decoding's choice. */
static inline uint32_t tu_argmax(const float *l, int n) {
    uint32_t b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = (uint32_t)i;
    return b;
}

/* Greedy reference of one request (p[0..n), tenant "T") alone on a fresh engine made with o:
 * the logits of its last prompt position and after each of `dec` decode steps, [dec + 1][V],
 * and the dec tokens it picked. */
static inline void tu_greedy_ref(const ikv_model *m, const ikv_engine_options *o,
                                 const uint32_t *p, size_t n, int dec, float *logits,
                                 uint32_t *gen) {
    const int V = m->cfg.vocab_size;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, o, &e), 0);
    ikv_request rq = {.tokens = p, .n = n, .tenant = "T"};
    ikv_seq *s;
    assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
    memcpy(logits, ikv_seq_logits(s), sizeof(float) * (size_t)V);
    for (int d = 0; d < dec; d++) {
        const float *lg;
        gen[d] = tu_argmax(logits + (size_t)d * V, V);
        assert_int_equal(ikv_engine_decode(e, s, gen[d], &lg), 0);
        memcpy(logits + (size_t)(d + 1) * V, lg, sizeof(float) * (size_t)V);
    }
    ikv_engine_end(e, s);
    ikv_engine_destroy(e);
}

#endif
