/*
 * Tests for the `lrb` policy (src/cache/policy/lrb.c, learned relaxed Belady) and its table
 * model (lrbmodel.{h,c}): the model's quantization, labels, back-off and halving against
 * numbers computed by hand; the policy learning on hand-built streams what LRU and its own
 * unlearned order cannot (the live conversations' new tails kept over dead chains); the duel;
 * determinism and the invariant walker after every request; bad parameters rejected with a
 * message naming them. test_cache.c has test_lrb_learns_periodic (a periodically re-read block
 * kept over once-read ones, on the stream lhd's test uses) and the registry-wide tests
 * (differential fuzz against the brute-force oracle, golden counts, bytes per block,
 * allocation failure), which cover lrb too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isokv/cache.h"
#include "../src/cache/policy/lrbmodel.h"

static ikv_cache *make(uint64_t cap, const char *policy) {
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, cap, policy);
    ikv_cache *c = NULL;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    return c;
}

#define CHECKED(c)                                                                                 \
    do {                                                                                           \
        if (!ikv_cache_check(c)) fail_msg("invariant: %s", ikv_errdetail());                       \
    } while (0)

static void chain(const uint32_t *ids, size_t n, ikv_key *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = ikv_key_chain(7, i ? &out[i - 1] : NULL, &ids[i], 1, 0);
}

/* One request for the chain ids[0..n) at time now; returns the blocks matched. Checks the
 * invariants (lrb's walker included) after it. */
static size_t req(ikv_cache *c, const uint32_t *ids, size_t n, uint64_t now) {
    ikv_key k[8];
    chain(ids, n, k);
    ikv_access acc = {.now = now};
    ikv_access_result r;
    assert_int_equal(ikv_cache_access(c, k, n, &acc, &r), 0);
    CHECKED(c);
    return r.matched;
}

/* ---- the model ---------------------------------------------------------------------------- */

/* Half-octave codes and bins against the boundary, by hand; labels into a cell and its
 * back-off levels; a cell with fewer than `pool` labels reads the next coarser level; every
 * `period` labels the counts halve; the walker notices a corrupt count. */
static void test_lrb_model(void **st) {
    (void)st;
    assert_int_equal(ikv__lrb_code(0), 0);
    assert_int_equal(ikv__lrb_code(1), 1);
    assert_int_equal(ikv__lrb_code(2), 3);
    assert_int_equal(ikv__lrb_code(3), 4);
    assert_int_equal(ikv__lrb_code(4), 5);
    assert_int_equal(ikv__lrb_code(6), 6);
    assert_int_equal(ikv__lrb_code(1u << 20), 41);
    assert_int_equal(ikv__lrb_code(UINT64_MAX), 128);
    uint32_t cb = ikv__lrb_code(100);
    assert_int_equal(ikv__lrb_rel(cb, cb), 8);                  /* age = B */
    assert_int_equal(ikv__lrb_rel(ikv__lrb_code(200), cb), 10); /* 2 B: two half-octaves */
    assert_int_equal(ikv__lrb_rel(0, cb), 0);                   /* clamped */
    assert_int_equal(ikv__lrb_rel(128, cb), IKV__LRB_NA - 1);
    /* two cells that differ only in the gap before the last one share levels 1-3 */
    uint32_t a = ikv__lrb_cell(ikv__lrb_code(50), ikv__lrb_code(80), ikv__lrb_code(80), 3, 0, cb);
    uint32_t b = ikv__lrb_cell(ikv__lrb_code(50), ikv__lrb_code(80), ikv__lrb_code(8), 3, 0, cb);
    uint32_t o = ikv__lrb_cell(ikv__lrb_code(800), ikv__lrb_code(80), 0, 1, IKV__LRB_ROOT, cb);
    assert_true(a != b && a < IKV__LRB_NCELL && b < IKV__LRB_NCELL && o < IKV__LRB_NCELL);
    ikv__lrbm *m = malloc(sizeof *m);
    assert_non_null(m);
    ikv__lrbm_init(m, 1000, 4);
    assert_float_equal(ikv__lrbm_predict(m, a), 0.5, 1e-6); /* nothing known */
    for (int i = 0; i < 9; i++)
        ikv__lrbm_label(m, a, i < 6); /* 6 of 9 positive */
    assert_float_equal(ikv__lrbm_predict(m, a), 6.5 / 10, 1e-6);
    /* b has no labels of its own: its level-1 cell (age, gap, count) is a's */
    assert_float_equal(ikv__lrbm_predict(m, b), 6.5 / 10, 1e-6);
    for (int i = 0; i < 4; i++)
        ikv__lrbm_label(m, b, 0); /* now b has pool = 4 labels */
    assert_float_equal(ikv__lrbm_predict(m, b), 0.5 / 5, 1e-6);
    assert_float_equal(ikv__lrbm_predict(m, a), 6.5 / 10, 1e-6);
    /* o (another age bin) shares no level with a or b */
    assert_float_equal(ikv__lrbm_predict(m, o), 0.5, 1e-6);
    assert_true(ikv__lrbm_check(m));
    assert_int_equal(m->total, 13);
    assert_int_equal(m->total_pos, 6);
    /* halving: after 1000 labels the counts halve: a 9 -> 4.5 (6 -> 3 positive), still its
     * own; b 4 -> 2, below the pool: read from level 1, a's and b's halved: 3 of 6.5 */
    for (int i = 13; i < 1000; i++)
        ikv__lrbm_label(m, o, 1);
    assert_float_equal(ikv__lrbm_predict(m, a), 3.5 / 5.5, 1e-6);
    assert_float_equal(ikv__lrbm_predict(m, b), 3.5 / 7.5, 1e-6);
    assert_int_equal(m->labels, 0);
    assert_true(ikv__lrbm_check(m));
    /* the walkers notice a corrupt count: the full one anywhere, the coarse one (lrb's, after
     * every request) in the coarse levels */
    m->l0[a].pos = m->l0[a].n + 1;
    assert_false(ikv__lrbm_check(m));
    assert_true(ikv__lrbm_check_coarse(m));
    m->l0[a].pos = 0;
    assert_true(ikv__lrbm_check(m));
    m->l2[3].pos = m->l2[3].n + 1;
    assert_false(ikv__lrbm_check(m));
    assert_false(ikv__lrbm_check_coarse(m));
    free(m);
}

/* ---- the policy --------------------------------------------------------------------------- */

/* Conversations and dead chains: 8 live conversations, each re-read every round as a chain
 * that grows by one block per turn (so each turn's new tail is a once-seen block under a
 * reused chain: T1 in ARC's split), interleaved with a fresh 2-block chain per turn that never
 * comes back. Returns the hit blocks of the last half of `rounds`. */
static uint64_t convs(ikv_cache *c, int rounds) {
    uint64_t t = 1, hits = 0;
    uint32_t fresh = 100000;
    for (int r = 0; r < rounds; r++)
        for (uint32_t v = 0; v < 8; v++) {
            uint32_t ids[8];
            size_t n = (size_t)(r % 6) + 1; /* a conversation restarts every 6 turns */
            for (size_t i = 0; i < n; i++)
                ids[i] = v * 1000 + (uint32_t)(r / 6) * 10 + (uint32_t)i;
            size_t m = req(c, ids, n, t++);
            if (r >= rounds / 2) hits += m;
            uint32_t d[2] = {fresh, fresh + 1};
            fresh += 2;
            req(c, d, 2, t++);
        }
    return hits;
}

/* The default lrb (ARC's classes, T1 by the learned order, T2 by the sample's oldest) keeps
 * the live conversations' new tails, which inherit their chain's turn gaps, over the dead
 * chains' blocks in T1; lrb:order=0 (both classes by the sample's oldest: a sampled ARC) and
 * lru cannot tell them apart, and without the inheritance (inherit=0) a new tail looks like a
 * dead chain's block. Two caches agree request for request (the sampling is seeded). */
static void test_lrb_keeps_live_tails(void **st) {
    (void)st;
    const char *specs[] = {"lru", "lrb:order=0", "lrb", "lrb:inherit=0"};
    uint64_t hits[4];
    for (int i = 0; i < 4; i++) {
        ikv_cache *c = make(40, specs[i]);
        hits[i] = convs(c, 300);
        ikv_cache_destroy(c);
    }
    /* measured: lru 750, lrb:order=0 1425, lrb 1825, lrb:inherit=0 1475 */
    if (hits[2] < hits[1] + hits[1] / 8 || hits[2] <= hits[0] || hits[2] <= hits[3])
        fail_msg("lrb %" PRIu64 " hits, lrb:order=0 %" PRIu64 ", lru %" PRIu64
                 ", lrb:inherit=0 %" PRIu64,
                 hits[2], hits[1], hits[0], hits[3]);
    ikv_cache *a = make(40, "lrb:period=64"), *b = make(40, "lrb:period=64");
    assert_int_equal(convs(a, 100), convs(b, 100));
    ikv_cache_destroy(a);
    ikv_cache_destroy(b);
}

/* Periodic blocks among twice-read dead ones, all in T2: each round reads one of `nhot` hot
 * blocks (so each comes back every nhot rounds) and `ndead` fresh blocks twice each (a hit:
 * T2), which never come back. Returns the hot hits of the last half of `rounds`. */
static uint64_t hot_in_t2(ikv_cache *c, int rounds, uint32_t nhot, uint32_t ndead) {
    uint64_t t = 1, hits = 0;
    uint32_t fresh = 100000;
    for (int r = 0; r < rounds; r++) {
        uint32_t h = (uint32_t)r % nhot + 1;
        size_t m = req(c, &h, 1, t++);
        if (r >= rounds / 2) hits += m;
        for (uint32_t d = 0; d < ndead; d++, fresh++) {
            req(c, &fresh, 1, t++);
            req(c, &fresh, 1, t++);
        }
    }
    return hits;
}

/* Phases: each round reads the `nh` blocks of the phase's hot set (a new set every `k` rounds)
 * and one of `nold` blocks of the previous sets, so once-hot blocks keep a frequent history. */
static uint64_t phases(ikv_cache *c, int rounds, uint32_t nh, int k, uint32_t extra) {
    uint64_t t = 1, hits = 0;
    uint32_t fresh = 500000;
    for (int r = 0; r < rounds; r++) {
        uint32_t base = (uint32_t)(r / k) * 100;
        for (uint32_t i = 0; i < nh; i++) {
            uint32_t id = base + i + 1;
            size_t m = req(c, &id, 1, t++);
            if (r >= rounds / 2) hits += m;
        }
        for (uint32_t d = 0; d < extra; d++, fresh++) {
            req(c, &fresh, 1, t++);
            req(c, &fresh, 1, t++);
        }
    }
    return hits;
}

/* hits of `spec` at capacity cap on stream 0 (hot_in_t2: 4 hot blocks, 2 dead pairs a round)
 * or 1 (phases: 3 hot blocks a phase of 6 rounds, 1 dead pair a round) */
static uint64_t duel_run(const char *spec, uint64_t cap, int stream) {
    ikv_cache *c = make(cap, spec);
    uint64_t h = stream ? phases(c, 1200, 3, 6, 1) : hot_in_t2(c, 2000, 4, 2);
    ikv_cache_destroy(c);
    return h;
}

/* lrb:duel=2 races the two orders inside T2 (the sample's oldest, lrb's own, against the
 * model) and follows the one whose candidates were accessed first less often. On hot_in_t2
 * the hot blocks (T2, back every 4 rounds) are older than the twice-read dead blocks (T2
 * too), so T2 by the oldest keeps none of them and the model keeps them all; on phases the
 * once-hot blocks of earlier phases keep a frequent history the model trusts, and the oldest
 * is right. The duel does as well as the better order on each (measured: stream 0 lrb 0,
 * order=3 1000, duel=2 1000; stream 1 lrb 1500, order=3 100, duel=2 1500); with dz=100 it never
 * leaves lrb's own order. Two caches agree request for request. */
static void test_lrb_duel(void **st) {
    (void)st;
    uint64_t own0 = duel_run("lrb", 9, 0), mod0 = duel_run("lrb:order=3", 9, 0),
             duel0 = duel_run("lrb:duel=2", 9, 0);
    uint64_t own1 = duel_run("lrb", 6, 1), mod1 = duel_run("lrb:order=3", 6, 1),
             duel1 = duel_run("lrb:duel=2", 6, 1);
    /* the streams tell the orders apart, opposite ways */
    if (!(mod0 >= own0 + 500 && own1 >= mod1 + 500))
        fail_msg("streams do not separate the orders: %" PRIu64 "/%" PRIu64 ", %" PRIu64
                 "/%" PRIu64,
                 own0, mod0, own1, mod1);
    if (duel0 + duel0 / 10 < mod0 || duel1 + duel1 / 10 < own1)
        fail_msg("duel=2 %" PRIu64 " (model %" PRIu64 "), %" PRIu64 " (oldest %" PRIu64 ")",
                 duel0, mod0, duel1, own1);
    assert_int_equal(duel_run("lrb:duel=2,dz=100", 9, 0), own0);
    /* the T1 duel (duel=1) changes nothing in T2: the same as lrb on stream 0 */
    assert_true(duel_run("lrb:duel=1", 9, 0) < mod0 / 2);
    ikv_cache *a = make(40, "lrb:duel=3,period=64"), *b = make(40, "lrb:duel=3,period=64");
    assert_int_equal(convs(a, 100), convs(b, 100));
    ikv_cache_destroy(a);
    ikv_cache_destroy(b);
}

/* Every bad parameter is IKV_EPARAM with a message naming it. */
static void test_lrb_bad_params(void **st) {
    (void)st;
    static const struct {
        const char *spec, *word;
    } bad[] = {
        {"lrb:nope=1", "nope"},
        {"lrb:split=2", "split"},
        {"lrb:split=0.5", "split"},
        {"lrb:sample=0", "sample"},
        {"lrb:bmul=0", "bmul"},
        {"lrb:order=4", "order"},
        {"lrb:period=8", "period"},
        {"lrb:ghost=-1", "ghost"},
        {"lrb:train=x", "train"},
        {"lrb:bound=3", "bound"},
        {"lrb:inherit=2", "inherit"},
        {"lrb:pool=", "pool"},
        {"lrb:split=0,cbound=1", "cbound"},
        {"lrb:hint=2", "hint"},
        {"lrb:duel=4", "duel"},
        {"lrb:duel=0.5", "duel"},
        {"lrb:split=0,duel=2", "duel"},
        {"lrb:dwin=8", "dwin"},
        {"lrb:dz=-1", "dz"},
        {"lrb:dz=x", "dz"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ikv_cache_config cfg;
        ikv_cache_config_default(&cfg, 16, bad[i].spec);
        ikv_cache *c = NULL;
        if (ikv_cache_create(&cfg, &c) != IKV_EPARAM) fail_msg("%s accepted", bad[i].spec);
        assert_null(c);
        if (!strstr(ikv_errdetail(), bad[i].word))
            fail_msg("%s: message '%s' does not name '%s'", bad[i].spec, ikv_errdetail(),
                     bad[i].word);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lrb_model),
        cmocka_unit_test(test_lrb_keeps_live_tails),
        cmocka_unit_test(test_lrb_bad_params),
        cmocka_unit_test(test_lrb_duel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
