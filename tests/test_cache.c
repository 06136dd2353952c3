/*
 * Tests for the cache core (src/cache/): the prefix index, locks, pins, soft pins, scopes and
 * tiers, and every registered policy.
 *
 * The centrepiece is a differential fuzz test against a brute-force oracle: the oracle keeps
 * the resident blocks as a plain array of {key, parent, tier, lock, pinned} records and checks
 * with linear scans, at every move the core reports (on_evict), that the block moved was allowed
 * to move (a leaf of its tier, not locked, not pinned, parent in the same or a faster tier),
 * then applies the move. After every operation the core's match() must agree with the oracle's
 * residency and tiers, and ikv_cache_check() must hold. For lru, opt, fifo and lfu the oracle
 * also checks the exact victim the policy chose (one tier).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isokv/cache.h"
#include "../src/cache/policy/hdmodel.h"
#include "../src/cache/policy/nextuse.h"
#include "../src/cache/policy/sketch.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* auto's policy for traffic without hints (src/cache/policy/auto.c's LRB_SPEC) */
#define AUTO_LRB "lrb:hint=1,duel=2,dwin=4096,pool=2"

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static uint64_t rndn(uint64_t n) {
    return rnd() % n;
}

/* Chain keys for a sequence of block "tokens" (one id per block) under a scope. */
static void chain(const uint32_t *ids, size_t n, uint64_t salt, ikv_key *out) {
    for (size_t i = 0; i < n; i++) out[i] = ikv_key_chain(7, i ? &out[i - 1] : NULL, &ids[i], 1, salt);
}

static ikv_cache *make(uint64_t cap, const char *policy) {
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, cap, policy);
    ikv_cache *c = NULL;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    return c;
}

/* Every spec of bad[0..n) is refused with IKV_EPARAM. */
static void assert_rejected(const char *const *bad, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ikv_cache_config cfg;
        ikv_cache_config_default(&cfg, 16, bad[i]);
        ikv_cache *c = NULL;
        if (ikv_cache_create(&cfg, &c) != IKV_EPARAM) fail_msg("%s accepted", bad[i]);
    }
}

#define CHECKED(c)                                                                              \
    do {                                                                                       \
        if (!ikv_cache_check(c)) fail_msg("invariant: %s", ikv_errdetail());                   \
    } while (0)

/* ---- basic behaviour ---------------------------------------------------------------------- */

/* ikv_cache_evict: the policy's victim (LRU: the least recently used leaf), never a locked
 * block, IKV_EFULL once nothing is evictable, IKV_EINVAL for a tier that does not exist. */
static void test_evict_one(void **st) {
    (void)st;
    ikv_cache *c = make(8, "lru");
    ikv_key k[3];
    uint32_t node[3];
    for (uint32_t i = 0; i < 3; i++) {
        chain(&i, 1, 0, &k[i]);
        ikv_access acc = {.now = i + 1};
        size_t ins;
        assert_int_equal(ikv_cache_insert(c, &k[i], 1, 0, &acc, 0, &node[i], &ins), 0);
    }
    ikv_access acc = {.now = 10};
    assert_int_equal(ikv_cache_hit(c, &node[0], 1, &acc), 0); /* 0 is now the most recent */
    assert_int_equal(ikv_cache_lock(c, &node[2], 1), 0);
    size_t m;
    assert_int_equal(ikv_cache_evict(c, 0), 0); /* 1: least recent */
    ikv_cache_match(c, &k[1], 1, NULL, NULL, &m);
    assert_int_equal(m, 0);
    ikv_cache_match(c, &k[0], 1, NULL, NULL, &m);
    assert_int_equal(m, 1);
    CHECKED(c);
    assert_int_equal(ikv_cache_evict(c, 0), 0); /* 0 (2 is locked) */
    ikv_cache_match(c, &k[0], 1, NULL, NULL, &m);
    assert_int_equal(m, 0);
    assert_int_equal(ikv_cache_evict(c, 0), IKV_EFULL); /* only the locked one left */
    ikv_cache_match(c, &k[2], 1, NULL, NULL, &m);
    assert_int_equal(m, 1);
    assert_int_equal(ikv_cache_evict(c, 1), IKV_EINVAL);
    CHECKED(c);
    ikv_cache_destroy(c);
}

/* Keys that share a bucket and a tag (the index links chains by tagged ids and reads a node
 * only on a tag match): lookups must still tell them apart by the whole key, and unlinking one
 * from the middle of its chain must keep the others. Bucket = high half of key.lo, tag = high
 * bits of key.hi; the keys differ only in the low bits of key.hi. */
static void test_hash_tag_collisions(void **st) {
    (void)st;
    enum { N = 6 };
    ikv_cache *c = make(4, "lru");
    ikv_key k[N];
    for (int i = 0; i < N; i++) k[i] = (ikv_key){.lo = 0x123456789abcdefull, .hi = 0xfeed0000ull + i};
    ikv_access acc = {0};
    ikv_access_result r;
    for (int i = 0; i < N; i++) {
        acc.now = (uint64_t)i + 1;
        assert_int_equal(ikv_cache_access(c, &k[i], 1, &acc, &r), 0);
        assert_int_equal(r.matched, 0); /* a tag twin is not a hit */
        assert_int_equal(r.inserted, 1);
        CHECKED(c);
    }
    /* capacity 4, LRU: keys 2..5 are resident, 0 and 1 were evicted */
    for (int i = 0; i < N; i++) {
        size_t m;
        ikv_cache_match(c, &k[i], 1, NULL, NULL, &m);
        assert_int_equal(m, i >= 2 ? 1 : 0);
    }
    /* touch 2 and 4, then insert a twin: 3 (middle of the chain) goes */
    acc.now = 10;
    assert_int_equal(ikv_cache_access(c, &k[2], 1, &acc, &r), 0);
    assert_int_equal(ikv_cache_access(c, &k[4], 1, &acc, &r), 0);
    acc.now = 11;
    assert_int_equal(ikv_cache_access(c, &k[0], 1, &acc, &r), 0);
    CHECKED(c);
    size_t m;
    ikv_cache_match(c, &k[3], 1, NULL, NULL, &m);
    assert_int_equal(m, 0);
    for (int i = 0; i < N; i++)
        if (i != 3 && i != 1) {
            ikv_cache_match(c, &k[i], 1, NULL, NULL, &m);
            assert_int_equal(m, 1);
        }
    ikv_cache_destroy(c);
}

static void test_match_insert(void **st) {
    (void)st;
    ikv_cache *c = make(100, "lru");
    uint32_t a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 2, 9, 9, 9};
    ikv_key ka[5], kb[5];
    chain(a, 5, 1, ka);
    chain(b, 5, 1, kb);
    size_t m;
    ikv_cache_match(c, ka, 5, NULL, NULL, &m);
    assert_int_equal(m, 0);
    ikv_access acc = {.now = 1};
    ikv_access_result r;
    assert_int_equal(ikv_cache_access(c, ka, 5, &acc, &r), 0);
    assert_int_equal(r.matched, 0);
    assert_int_equal(r.inserted, 5);
    CHECKED(c);
    acc.now = 2;
    assert_int_equal(ikv_cache_access(c, kb, 5, &acc, &r), 0);
    assert_int_equal(r.matched, 2); /* shared prefix of two blocks */
    assert_int_equal(r.hits_by_tier[0], 2);
    assert_int_equal(r.inserted, 3);
    CHECKED(c);
    uint32_t nodes[5];
    uint8_t tiers[5];
    ikv_cache_match(c, ka, 5, nodes, tiers, &m);
    assert_int_equal(m, 5);
    assert_int_equal(tiers[4], 0);
    ikv_cache_stats s;
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.resident[0], 8);
    assert_int_equal(s.evictable[0], 2); /* two leaves */
    ikv_cache_destroy(c);
}

static void test_bad_input(void **st) {
    (void)st;
    ikv_cache_config cfg;
    ikv_cache *c = NULL;
    ikv_cache_config_default(&cfg, 0, "lru");
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EINVAL);
    assert_null(c);
    ikv_cache_config_default(&cfg, 10, "nosuch");
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EPOLICY);
    assert_non_null(strstr(ikv_errdetail(), "nosuch"));
    ikv_cache_config_default(&cfg, 10, "value:new");
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 10, "value:new=abc");
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 10, "value:gamma=1");
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 10, "lru:x=1");
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 10, "lru");
    cfg.block_tokens = 0;
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EINVAL);
    cfg.block_tokens = 16;
    cfg.n_tiers = 0;
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EINVAL);
    cfg.n_tiers = 1;
    cfg.pin_budget = 2;
    assert_int_equal(ikv_cache_create(&cfg, &c), IKV_EINVAL);
    assert_null(c);

    c = make(10, "lru");
    uint32_t a[3] = {1, 2, 3};
    ikv_key k[3];
    chain(a, 3, 1, k);
    uint32_t nodes[3];
    size_t n;
    assert_int_equal(ikv_cache_insert(c, k, 3, 0, NULL, 0, nodes, &n), 0);
    /* unlock without lock: error, nothing changes */
    assert_int_equal(ikv_cache_unlock(c, nodes, 3), IKV_ENOTLOCKED);
    CHECKED(c);
    assert_int_equal(ikv_cache_lock(c, nodes, 1), 0);
    uint32_t twice[2] = {nodes[0], nodes[0]};
    assert_int_equal(ikv_cache_unlock(c, twice, 2), IKV_ENOTLOCKED);
    assert_int_equal(ikv_cache_unlock(c, nodes, 1), 0);
    assert_int_equal(ikv_cache_unlock(c, nodes, 1), IKV_ENOTLOCKED);
    CHECKED(c);
    /* insert under a parent that is not resident */
    uint32_t b[2] = {5, 6};
    ikv_key kb[2];
    chain(b, 2, 1, kb);
    assert_int_equal(ikv_cache_insert(c, kb, 2, 1, NULL, 0, NULL, &n), IKV_ENOENT);
    assert_int_equal(ikv_cache_insert(c, kb, 2, 3, NULL, 0, NULL, &n), IKV_EINVAL);
    /* pin of a block that is not resident */
    assert_int_equal(ikv_cache_pin(c, kb, 2, 0), IKV_ENOENT);
    assert_int_equal(ikv_cache_unpin(c, k, 1), IKV_ENOENT);
    CHECKED(c);
    ikv_cache_destroy(c);
    ikv_cache_destroy(NULL);
}

/* Locked blocks are never evicted; with everything locked, insert reports EFULL. */
static void test_locks(void **st) {
    (void)st;
    ikv_cache *c = make(4, "lru");
    uint32_t a[4] = {1, 2, 3, 4}, b[2] = {7, 8};
    ikv_key ka[4], kb[2];
    chain(a, 4, 1, ka);
    chain(b, 2, 1, kb);
    uint32_t nodes[4];
    size_t n;
    assert_int_equal(ikv_cache_insert(c, ka, 4, 0, NULL, 1, nodes, &n), 0);
    assert_int_equal(n, 4);
    CHECKED(c);
    assert_int_equal(ikv_cache_insert(c, kb, 2, 0, NULL, 0, NULL, &n), IKV_EFULL);
    assert_int_equal(n, 0);
    CHECKED(c);
    /* release the leaf only: one block can go (the leaf), then the parent chain stays locked */
    assert_int_equal(ikv_cache_unlock(c, nodes + 3, 1), 0);
    assert_int_equal(ikv_cache_insert(c, kb, 2, 0, NULL, 0, NULL, &n), IKV_EFULL);
    assert_int_equal(n, 1);
    CHECKED(c);
    size_t m;
    ikv_cache_match(c, ka, 4, NULL, NULL, &m);
    assert_int_equal(m, 3);
    assert_int_equal(ikv_cache_unlock(c, nodes, 3), 0);
    CHECKED(c);
    ikv_cache_destroy(c);
}

/* ikv_policy_offline: opt and nonzero oracle diagnostics read the future; nothing else does. */
static void test_policy_offline(void **st) {
    (void)st;
    assert_true(ikv_policy_offline("opt"));
    assert_true(ikv_policy_offline("opt:"));
    assert_true(ikv_policy_offline("value:oracle=1"));
    assert_true(ikv_policy_offline("value:split=0,oracle=4"));
    assert_true(ikv_policy_offline("value:oracle=0.5"));
    assert_false(ikv_policy_offline("value:oracle=0"));
    assert_false(ikv_policy_offline("value:oracle=0.0,pred=0.25"));
    assert_false(ikv_policy_offline("value"));
    assert_false(ikv_policy_offline("optx"));
    assert_false(ikv_policy_offline("lru"));
    assert_false(ikv_policy_offline("value:xoracle=1"));
    assert_false(ikv_policy_offline(NULL));
}

/* LRU evicts leaves in last-use order; a parent whose children went becomes a leaf. */
static void test_lru_order(void **st) {
    (void)st;
    ikv_cache *c = make(6, "lru");
    uint32_t a[3] = {1, 2, 3}, b[3] = {4, 5, 6}, d[3] = {7, 8, 9};
    ikv_key ka[3], kb[3], kd[3];
    chain(a, 3, 0, ka);
    chain(b, 3, 0, kb);
    chain(d, 3, 0, kd);
    ikv_access acc = {.now = 1};
    ikv_access_result r;
    ikv_cache_access(c, ka, 3, &acc, &r);
    acc.now = 2;
    ikv_cache_access(c, kb, 3, &acc, &r);
    acc.now = 3;
    ikv_cache_access(c, ka, 3, &acc, &r); /* a is now the most recent */
    assert_int_equal(r.matched, 3);
    acc.now = 4;
    ikv_cache_access(c, kd, 3, &acc, &r); /* evicts b's chain leaf-first */
    CHECKED(c);
    size_t m;
    ikv_cache_match(c, kb, 3, NULL, NULL, &m);
    assert_int_equal(m, 0);
    ikv_cache_match(c, ka, 3, NULL, NULL, &m);
    assert_int_equal(m, 3);
    ikv_cache_match(c, kd, 3, NULL, NULL, &m);
    assert_int_equal(m, 3);
    ikv_cache_destroy(c);
}

/* Scopes: identical prompts under two tenants never share blocks; a public prefix is shared. */
static void test_scopes(void **st) {
    (void)st;
    ikv_cache *c = make(100, "lru");
    uint32_t sys[2] = {10, 11}, q[2] = {20, 21};
    ikv_key pub[2], alice[4], bob[4];
    chain(sys, 2, IKV_SCOPE_PUBLIC, pub);
    uint64_t sa = ikv_scope_salt(7, "alice"), sb = ikv_scope_salt(7, "bob");
    memcpy(alice, pub, sizeof pub);
    memcpy(bob, pub, sizeof pub);
    for (int i = 0; i < 2; i++) {
        alice[2 + i] = ikv_key_chain(7, &alice[1 + i], &q[i], 1, sa);
        bob[2 + i] = ikv_key_chain(7, &bob[1 + i], &q[i], 1, sb);
    }
    ikv_access acc = {.now = 1};
    ikv_access_result r;
    ikv_cache_access(c, alice, 4, &acc, &r);
    assert_int_equal(r.matched, 0);
    acc.now = 2;
    ikv_cache_access(c, bob, 4, &acc, &r);
    assert_int_equal(r.matched, 2); /* only the public system prompt */
    acc.now = 3;
    ikv_cache_access(c, alice, 4, &acc, &r);
    assert_int_equal(r.matched, 4);
    CHECKED(c);
    ikv_cache_destroy(c);
}

/* Pins: pinned blocks stay; the budget is enforced; ttl expires. */
static void test_pins(void **st) {
    (void)st;
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 4, "lru");
    cfg.pin_budget = 0.5; /* 2 blocks */
    ikv_cache *c;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    uint32_t a[2] = {1, 2}, b[3] = {3, 4, 5}, d[3] = {6, 7, 8};
    ikv_key ka[2], kb[3], kd[3];
    chain(a, 2, 0, ka);
    chain(b, 3, 0, kb);
    chain(d, 3, 0, kd);
    ikv_access acc = {.now = 1};
    ikv_access_result r;
    ikv_cache_access(c, ka, 2, &acc, &r);
    assert_int_equal(ikv_cache_pin(c, ka, 2, 10), 0);
    CHECKED(c);
    ikv_cache_access(c, kb, 3, &acc, &r);
    assert_int_equal(ikv_cache_pin(c, kb, 1, 0), IKV_EBUDGET); /* 3 > 2 */
    CHECKED(c);
    acc.now = 2;
    ikv_cache_access(c, kd, 3, &acc, &r); /* b goes, a stays pinned */
    CHECKED(c);
    size_t m;
    ikv_cache_match(c, ka, 2, NULL, NULL, &m);
    assert_int_equal(m, 2);
    ikv_cache_match(c, kb, 3, NULL, NULL, &m);
    assert_int_equal(m, 0);
    /* after the ttl the pin expires and a is evictable again */
    ikv_cache_set_time(c, 11);
    CHECKED(c);
    ikv_cache_stats s;
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.pinned[0], 0);
    acc.now = 12;
    ikv_cache_access(c, kb, 3, &acc, &r);
    CHECKED(c);
    ikv_cache_match(c, ka, 2, NULL, NULL, &m);
    assert_int_equal(m, 0);
    /* unpin */
    assert_int_equal(ikv_cache_pin(c, kb, 2, 0), 0);
    assert_int_equal(ikv_cache_unpin(c, kb, 2), 0);
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.pinned[0], 0);
    CHECKED(c);
    ikv_cache_destroy(c);
}

/* Soft pin: a block reached by P distinct scopes within the window stays while hot. */
static void test_softpin(void **st) {
    (void)st;
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 3, "lru");
    cfg.softpin_scopes = 2;
    cfg.softpin_window = 100;
    ikv_cache *c;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    uint32_t a[1] = {1}, b[1] = {2}, d[1] = {3}, e[1] = {4};
    ikv_key ka[1], kb[1], kd[1], ke[1];
    chain(a, 1, 0, ka);
    chain(b, 1, 0, kb);
    chain(d, 1, 0, kd);
    chain(e, 1, 0, ke);
    ikv_access acc = {.now = 1, .scope = 11};
    ikv_access_result r;
    ikv_cache_access(c, ka, 1, &acc, &r);
    acc.scope = 12;
    acc.now = 2;
    ikv_cache_access(c, ka, 1, &acc, &r); /* second distinct scope: soft pinned */
    ikv_cache_stats s;
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.pinned[0], 1);
    acc.now = 3;
    ikv_cache_access(c, kb, 1, &acc, &r);
    acc.now = 4;
    ikv_cache_access(c, kd, 1, &acc, &r);
    acc.now = 5;
    ikv_cache_access(c, ke, 1, &acc, &r); /* a is the LRU block but soft pinned: b goes */
    CHECKED(c);
    size_t m;
    ikv_cache_match(c, ka, 1, NULL, NULL, &m);
    assert_int_equal(m, 1);
    ikv_cache_match(c, kb, 1, NULL, NULL, &m);
    assert_int_equal(m, 0);
    /* two windows later without use the soft pin lapses */
    ikv_cache_set_time(c, 250);
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.pinned[0], 0);
    CHECKED(c);
    ikv_cache_destroy(c);
}

/* Tiers: eviction demotes; a hit in a lower tier promotes; admission by hit count. */
static void test_tiers(void **st) {
    (void)st;
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 2, "lru");
    cfg.n_tiers = 2;
    cfg.tiers[1].name = "dram";
    cfg.tiers[1].capacity = 4;
    cfg.tiers[1].policy = "lru";
    ikv_cache *c;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    uint32_t a[2] = {1, 2}, b[2] = {3, 4};
    ikv_key ka[2], kb[2];
    chain(a, 2, 0, ka);
    chain(b, 2, 0, kb);
    ikv_access acc = {.now = 1};
    ikv_access_result r;
    ikv_cache_access(c, ka, 2, &acc, &r);
    acc.now = 2;
    ikv_cache_access(c, kb, 2, &acc, &r); /* a demoted to dram */
    CHECKED(c);
    uint8_t tiers[2];
    size_t m;
    ikv_cache_match(c, ka, 2, NULL, tiers, &m);
    assert_int_equal(m, 2);
    assert_int_equal(tiers[0], 1);
    assert_int_equal(tiers[1], 1);
    acc.now = 3;
    ikv_cache_access(c, ka, 2, &acc, &r);
    assert_int_equal(r.matched, 2);
    assert_int_equal(r.hits_by_tier[1], 2);
    ikv_cache_match(c, ka, 2, NULL, tiers, &m);
    assert_int_equal(tiers[0], 0); /* promoted */
    ikv_cache_match(c, kb, 2, NULL, tiers, &m);
    assert_int_equal(m, 2);
    assert_int_equal(tiers[0], 1);
    CHECKED(c);
    ikv_cache_stats s;
    ikv_cache_stats_get(c, &s);
    assert_true(s.demotions >= 4 && s.promotions == 2);
    ikv_cache_destroy(c);

    /* admission: dram admits only blocks hit >= 1 time; b was never hit, so it is dropped */
    cfg.tiers[1].admit_min_hits = 1;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    acc.now = 1;
    ikv_cache_access(c, kb, 2, &acc, &r);
    acc.now = 2;
    ikv_cache_access(c, ka, 2, &acc, &r);
    ikv_cache_match(c, kb, 2, NULL, NULL, &m);
    assert_int_equal(m, 0);
    CHECKED(c);
    ikv_cache_destroy(c);
}

/* ---- per-policy behaviour (fifo, lfu, gdsf, sieve, s3fifo, arc) ------------------------- */

/* One-block request for block `id` (its own chain) at time now; returns the blocks matched. */
static size_t req1(ikv_cache *c, uint32_t id, uint64_t now) {
    ikv_key k;
    chain(&id, 1, 0, &k);
    ikv_access acc = {.now = now};
    ikv_access_result r;
    int rc = ikv_cache_access(c, &k, 1, &acc, &r);
    assert_true(rc == 0);
    CHECKED(c);
    return r.matched;
}

static int resident1(const ikv_cache *c, uint32_t id) {
    ikv_key k;
    chain(&id, 1, 0, &k);
    size_t m;
    ikv_cache_match(c, &k, 1, NULL, NULL, &m);
    return m == 1;
}

/* fifo ignores hits: the first block in goes first even if it was just hit (lru would keep it). */
static void test_fifo_order(void **st) {
    (void)st;
    ikv_cache *c = make(3, "fifo");
    req1(c, 1, 1), req1(c, 2, 2), req1(c, 3, 3);
    assert_int_equal(req1(c, 1, 4), 1); /* hit on the oldest */
    req1(c, 4, 5);
    assert_false(resident1(c, 1));
    assert_true(resident1(c, 2) && resident1(c, 3) && resident1(c, 4));
    req1(c, 5, 6);
    assert_false(resident1(c, 2));
    ikv_cache_destroy(c);
}

/* lfu: the least frequently used leaf goes; among equals, the least recent. */
static void test_lfu_order(void **st) {
    (void)st;
    ikv_cache *c = make(3, "lfu");
    req1(c, 1, 1), req1(c, 2, 2), req1(c, 3, 3);
    req1(c, 1, 4), req1(c, 1, 5), req1(c, 3, 6); /* freq: 1 -> 3, 2 -> 1, 3 -> 2 */
    req1(c, 4, 7);                               /* 2 (freq 1) goes although 1 is older */
    assert_false(resident1(c, 2));
    assert_true(resident1(c, 1) && resident1(c, 3));
    req1(c, 5, 8); /* 4 has freq 1, the lowest: it goes before 3 (freq 2) and 1 (freq 3) */
    assert_false(resident1(c, 4));
    assert_true(resident1(c, 1) && resident1(c, 3) && resident1(c, 5));
    req1(c, 5, 9), req1(c, 6, 10); /* 5 and 3 now both have freq 2: 3 is less recent */
    assert_false(resident1(c, 3));
    assert_true(resident1(c, 5));
    ikv_cache_destroy(c);
}

/* A cost callback that makes blocks of chain "dear" 10x dearer per token. */
static double cost_by_depth(void *ctx, uint32_t depth, uint32_t ntokens) {
    (void)ctx;
    return (double)ntokens * (depth == 0 ? 1.0 : 10.0);
}

/* gdsf: the leaf with the higher recompute cost per token survives, until frequency and the
 * inflation clock L outweigh it. */
static void test_gdsf_cost(void **st) {
    (void)st;
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 3, "gdsf");
    cfg.cost = cost_by_depth;
    ikv_cache *c;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    uint32_t x[2] = {1, 2};
    ikv_key kx[2];
    chain(x, 2, 0, kx);
    ikv_access acc = {.now = 1};
    ikv_access_result r;
    assert_int_equal(ikv_cache_access(c, kx, 2, &acc, &r), 0); /* x1 at depth 1: cost 10/token */
    req1(c, 7, 2);                                              /* depth 0: cost 1/token */
    req1(c, 8, 3);  /* evicts 7 (H = 1), not x1 (H = 10), though x1 is older */
    assert_false(resident1(c, 7));
    size_t m;
    ikv_cache_match(c, kx, 2, NULL, NULL, &m);
    assert_int_equal(m, 2);
    CHECKED(c);
    ikv_cache_destroy(c);

    /* cost=unit ignores the callback: every block costs 1, so the older leaf x1 goes on the
     * node-id tie ... unless frequency decides: hit 7 twice, then x1 (freq 1) goes first. */
    cfg.tiers[0].policy = "gdsf:cost=unit";
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);
    assert_int_equal(ikv_cache_access(c, kx, 2, &acc, &r), 0);
    req1(c, 7, 2), req1(c, 7, 3), req1(c, 7, 4);
    req1(c, 8, 5);
    ikv_cache_match(c, kx, 2, NULL, NULL, &m);
    assert_int_equal(m, 1); /* x1 evicted, x0 stays (now a leaf) */
    assert_true(resident1(c, 7));
    ikv_cache_destroy(c);
}

/* sieve: a visited block survives the hand's pass (its bit is cleared), an unvisited one
 * behind it goes; then, unvisited, it is the next to go when the hand wraps round. */
static void test_sieve_visited(void **st) {
    (void)st;
    ikv_cache *c = make(3, "sieve");
    req1(c, 1, 1), req1(c, 2, 2), req1(c, 3, 3);
    req1(c, 1, 4); /* visited */
    req1(c, 4, 5); /* hand at the tail (1): visited, cleared, passed; 2 goes */
    assert_true(resident1(c, 1));
    assert_false(resident1(c, 2));
    req1(c, 5, 6); /* hand at 3: unvisited, goes */
    assert_false(resident1(c, 3));
    assert_true(resident1(c, 1));
    req1(c, 4, 7); /* 4 visited */
    req1(c, 6, 8); /* hand at 4 (visited: passes), 5 goes; 1 (cleared) is next after the wrap */
    assert_false(resident1(c, 5));
    req1(c, 7, 9);
    assert_false(resident1(c, 1));
    assert_true(resident1(c, 4) && resident1(c, 6) && resident1(c, 7));
    ikv_cache_destroy(c);
}

/* value:ghost=1: a block that misses while its key is among the recently evicted comes back
 * proven (ordered by recency), not unproven (predicted 4 mean gaps away and evicted first).
 * Times are explicit so the mean gap (100) dwarfs the eviction horizon. */
static void test_value_ghost_feedback(void **st) {
    (void)st;
    for (int ghost = 1; ghost >= 0; ghost--) {
        ikv_cache *c = make(2, ghost ? "value:split=0,ghost=1" : "value:split=0");
        req1(c, 1, 1);
        assert_int_equal(req1(c, 1, 101), 1); /* gap 100: the mean gap is 100 */
        req1(c, 2, 102);                     /* unproven: key 102 - 400 */
        req1(c, 3, 103);                     /* 2 goes (and into the ghost) */
        assert_false(resident1(c, 2));
        req1(c, 2, 104); /* 1 goes; 2 returns: from the ghost it is proven */
        assert_false(resident1(c, 1));
        req1(c, 4, 105); /* unproven 2 goes first, a returning (proven) 2 outlives 3 */
        assert_int_equal(resident1(c, 2), ghost);
        assert_int_equal(resident1(c, 3), !ghost);
        ikv_cache_destroy(c);
    }
}

/* value (split=1, the default) keyed by last access in both classes is ARC: on a seeded stream
 * of one-block requests over 100 ids (skewed: id = r^2 / 100 for r uniform below 100) with 12
 * blocks, the two agree on
 * every hit and on the resident set after every request (ARC's adaptation of p, its tie rule
 * and its directory rules included), and value's own invariants hold throughout. */
static void test_value_split_is_arc(void **st) {
    (void)st;
    ikv_cache *a = make(12, "arc");
    ikv_cache *v = make(12, "value:split=1,t1key=0,new=0,lru2=0,cost=0");
    uint64_t rng = 12345, hits = 0;
    for (uint64_t t = 1; t <= 3000; t++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t r = (uint32_t)(rng >> 33) % 100;
        uint32_t id = r * r / 100 + 1;
        size_t ha = req1(a, id, t), hv = req1(v, id, t);
        assert_int_equal(ha, hv);
        hits += ha;
        for (uint32_t k = 1; k <= 100; k++) assert_int_equal(resident1(a, k), resident1(v, k));
    }
    assert_true(hits > 300 && hits < 2700); /* the stream does exercise eviction */
    ikv_cache_destroy(a);
    ikv_cache_destroy(v);
}

/* value's class split resists a scan: two blocks hit twice (T2) survive a run of 20 one-hit
 * blocks through a 6-block cache (T1 absorbs them), while the single-heap value
 * (split=0), ordering them by recency once the horizon covers their gaps, loses them as lru does. */
static void test_value_split_scan(void **st) {
    (void)st;
    for (int split = 0; split < 2; split++) {
        ikv_cache *c = make(6, split ? "value" : "value:split=0");
        uint64_t t = 1;
        req1(c, 1, t++), req1(c, 2, t++);
        assert_int_equal(req1(c, 1, t++), 1);
        assert_int_equal(req1(c, 2, t++), 1);
        for (uint32_t id = 100; id < 120; id++) req1(c, id, t++);
        assert_int_equal(resident1(c, 1), split);
        assert_int_equal(resident1(c, 2), split);
        ikv_cache_destroy(c);
    }
}

/* t1key=1 (default): inside T1 a block that inherits its chain's reuse gap outlives an older-
 * keyed unproven one only by what the gap prediction says, i.e. T1 is ordered by value's key,
 * not by recency. Chain P(1) -> Q(2) is reused (both proven, in T2); Q's new child X inherits
 * Q's gap and goes to T1 keyed by recency (the gap is inside the horizon); an unproven fork
 * U (a new root) is predicted new * gbar away. With t1key=0 (recency) the older X goes first;
 * with t1key=1 the unproven U goes first although it is newer. */
static void test_value_t1key(void **st) {
    (void)st;
    for (int t1key = 0; t1key < 2; t1key++) {
        ikv_cache *c = make(4, t1key ? "value:new=100" : "value:new=100,t1key=0");
        uint32_t pq[3] = {1, 2, 3};
        ikv_key k[3];
        ikv_access_result r;
        chain(pq, 3, 0, k);
        ikv_access a1 = {.now = 1}, a2 = {.now = 2};
        assert_int_equal(ikv_cache_access(c, k, 2, &a1, &r), 0);
        assert_int_equal(ikv_cache_access(c, k, 2, &a2, &r), 0); /* P, Q proven (gap 1) */
        assert_int_equal(r.matched, 2);
        ikv_access a3 = {.now = 3};
        assert_int_equal(ikv_cache_access(c, k, 3, &a3, &r), 0); /* X = 3 under Q */
        CHECKED(c);
        req1(c, 50, 4); /* U: unproven root, T1 */
        req1(c, 51, 5); /* full (P Q X U): something from T1 goes */
        assert_int_equal(resident1(c, 50), !t1key);
        size_t m;
        ikv_cache_match(c, k, 3, NULL, NULL, &m);
        assert_int_equal(m == 3, t1key);
        ikv_cache_destroy(c);
    }
}

/* The TinyLFU sketch (value:tlfu): counts are never below the truth (count-min), exact for a
 * few keys in a wide sketch, saturate at 15, and are halved after 10 w increments (aging). */
static void test_sketch_counts_and_aging(void **st) {
    (void)st;
    ikv__sketch s;
    assert_int_equal(ikv__sketch_init(&s, 100), 0);
    assert_int_equal(s.w, 128);
    ikv_key k[8];
    uint32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int i = 0; i < 8; i++) chain(&ids[i], 1, 0, &k[i]);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j <= i; j++) ikv__sketch_add(&s, k[i]); /* key i counted i + 1 times */
    for (int i = 0; i < 8; i++) assert_true(ikv__sketch_estimate(&s, k[i]) >= (unsigned)i + 1);
    assert_int_equal(ikv__sketch_estimate(&s, k[0]), 1); /* 4 rows of 128: no full collision */
    assert_true(ikv__sketch_check(&s));
    for (int j = 0; j < 40; j++) ikv__sketch_add(&s, k[7]);
    assert_int_equal(ikv__sketch_estimate(&s, k[7]), IKV__SKETCH_MAX); /* saturates */
    /* aging: the next increment after 10 w = 1280 halves every counter first */
    uint64_t done = 36 + 40;
    uint32_t other = 1000;
    ikv_key ko;
    while (done < 1280) {
        chain(&other, 1, 0, &ko);
        ikv__sketch_add(&s, ko);
        other++, done++;
    }
    assert_int_equal(s.resets, 0);
    unsigned before = ikv__sketch_estimate(&s, k[7]);
    ikv__sketch_add(&s, k[0]);
    assert_int_equal(s.resets, 1);
    assert_int_equal(ikv__sketch_estimate(&s, k[7]), before / 2);
    assert_true(ikv__sketch_check(&s));
    s.ctr[5] = 16; /* out of range: the walker must notice */
    assert_false(ikv__sketch_check(&s));
    ikv__sketch_free(&s);
}

/* value:tlfu=T sends a block whose key the sketch has seen T times into T2 (protected) even
 * after its ghost entry is gone: block 1, accessed twice, is pushed out of T2 and then out of
 * B2 by 30 other twice-used blocks; back, it goes into T2 with tlfu=2 and survives a scan of
 * one-hit blocks (T1 absorbs it), and into T1 without the sketch, where the scan takes it. */
static void test_value_tlfu(void **st) {
    (void)st;
    for (int tl = 0; tl < 2; tl++) {
        ikv_cache *c = make(4, tl ? "value:tlfu=2" : "value");
        uint64_t t = 1;
        req1(c, 1, t++);
        assert_int_equal(req1(c, 1, t++), 1); /* 1 in T2, counted twice */
        for (uint32_t id = 200; id < 230; id++) req1(c, id, t++), req1(c, id, t++);
        if (resident1(c, 1)) fail_msg("block 1 should have been evicted by now");
        req1(c, 1, t++); /* back: T2 with the sketch, T1 without */
        for (uint32_t id = 300; id < 306; id++) req1(c, id, t++);
        assert_int_equal(resident1(c, 1), tl);
        ikv_cache_destroy(c);
    }
}

/* s3fifo: a block inserted and never hit leaves through the small queue before an older block
 * that was hit twice (which moves to main); a key remembered by the ghost comes back into main
 * and outlives the one-hit blocks inserted after it, unless the ghost is off. */
static void test_s3fifo_small_and_ghost(void **st) {
    (void)st;
    static const char *const cfg[] = {"s3fifo", "s3fifo:approx=1", "s3fifo:ghost=0"};
    for (int k = 0; k < 3; k++) {
        int ghost = k < 2;
        ikv_cache *c = make(10, cfg[k]);
        uint64_t t = 1;
        req1(c, 100, t++);
        req1(c, 100, t++), req1(c, 100, t++); /* 100 hit twice: freq 2 */
        req1(c, 101, t++);                    /* one-hit block */
        for (uint32_t id = 1; id <= 8; id++) req1(c, id, t++); /* cache full (10) */
        req1(c, 9, t++); /* evictS: 100 (freq 2) moves to main, 101 (freq 0) is the victim */
        assert_true(resident1(c, 100));
        assert_false(resident1(c, 101));
        req1(c, 101, t++); /* miss; in the ghost -> main; block 1 leaves small */
        assert_false(resident1(c, 1));
        for (uint32_t id = 20; id < 30; id++) req1(c, id, t++);
        /* small stays over its 10% share, so only small blocks go: 100 and 101 stay in main */
        assert_true(resident1(c, 100));
        assert_int_equal(resident1(c, 101), ghost);
        ikv_cache_destroy(c);
    }
}

/* value:mix (LeCaR-style experts): a miss on a key that expert 0 (the split, here exactly ARC)
 * evicted moves weight to expert 1 (the single heap, here exactly LRU: new=0,lru2=0,cost=0), and
 * the next eviction follows LRU where ARC alone would follow T1. mix=2 follows the heavier
 * expert (expert 0 on a tie), so the stream is deterministic. */
static void test_value_mix_regret(void **st) {
    (void)st;
    for (int mix = 0; mix <= 2; mix += 2) {
        ikv_cache *c = make(4, mix ? "value:t1key=0,new=0,lru2=0,cost=0,mix=2"
                                   : "value:t1key=0,new=0,lru2=0,cost=0");
        req1(c, 1, 1), req1(c, 1, 2), req1(c, 2, 3), req1(c, 2, 4); /* T2 = 1 2 */
        req1(c, 3, 5), req1(c, 4, 6);                               /* T1 = 3 4 */
        req1(c, 5, 7); /* tie: expert 0 (ARC) evicts T1's LRU, 3; LRU would evict 1 */
        assert_false(resident1(c, 3));
        assert_true(resident1(c, 1));
        /* 3 comes back: a regret for expert 0, whose weight falls below expert 1's. ARC alone
         * evicts T1's LRU (4, since |T1| = 2 > p = 1); the mix follows LRU and evicts 1 */
        req1(c, 3, 8);
        assert_int_equal(resident1(c, 1), !mix);
        assert_int_equal(resident1(c, 4), mix != 0);
        assert_true(resident1(c, 2) && resident1(c, 3) && resident1(c, 5));
        ikv_cache_destroy(c);
    }
}

/* Hot blocks 1, 2, 3, each asked for every 6 requests, between one-shot blocks that never
 * come back, through a 4-block cache: LRU (5 distinct blocks between two uses of a hot one)
 * never hits. Returns the hits on hot blocks in the last 100 rounds of `rounds`, and checks
 * at the end that after a one-shot insert the hot blocks are all resident. */
static uint64_t hot_and_oneshots(ikv_cache *c, int rounds, int *hot_resident, uint64_t *tp) {
    uint64_t t = 1, hits = 0;
    uint32_t one = 1000;
    for (int r = 0; r < rounds; r++)
        for (uint32_t h = 1; h <= 3; h++) {
            size_t m = req1(c, h, t++);
            if (r >= rounds - 100) hits += m;
            req1(c, one++, t++);
        }
    *hot_resident = resident1(c, 1) && resident1(c, 2) && resident1(c, 3);
    *tp = t;
    return hits;
}

/* lhd learns from its ghost that the hot blocks come back at age 6 and the one-shots never
 * do: once the model has seen a few periods, a one-shot evicts the previous one-shot (the
 * newest block but one) instead of the oldest hot block, and the hot blocks hit on nearly
 * every request (LRU: never). Without the ghost (ghost=0) the hot blocks are always evicted
 * before their first hit, so the model never sees one hit and stays LRU. */
static void test_lhd_learns_hot_blocks(void **st) {
    (void)st;
    int res;
    uint64_t t;
    ikv_cache *lru = make(4, "lru");
    assert_int_equal(hot_and_oneshots(lru, 400, &res, &t), 0);
    ikv_cache_destroy(lru);
    ikv_cache *c = make(4, "lhd:period=64");
    uint64_t hits = hot_and_oneshots(c, 400, &res, &t);
    if (hits < 290) fail_msg("lhd: %" PRIu64 " hot hits of 300 in the last 100 rounds", hits);
    assert_true(res);
    /* one more one-shot: its victim is the last one-shot (1000 + 1199, inserted just before,
     * density 0: never seen hit) and not hot block 1, the oldest (age 5: its hits come at 6) */
    assert_true(resident1(c, 2199));
    req1(c, 5000, t++);
    assert_false(resident1(c, 2199));
    assert_true(resident1(c, 5000) && resident1(c, 1) && resident1(c, 2) && resident1(c, 3));
    ikv_cache_destroy(c);
    ikv_cache *ng = make(4, "lhd:period=64,ghost=0");
    assert_int_equal(hot_and_oneshots(ng, 400, &res, &t), 0);
    ikv_cache_destroy(ng);
}

/* The default lrb learns that a block with a gap of 6 comes back within the boundary and a
 * one-shot (count 1, no gap) does not: the hot blocks hit on nearly every request once labels
 * have come in, and a new one-shot evicts the previous one-shot, not the oldest hot block.
 * LRU never hits, nor does lrb:order=0 (ARC's classes with both ordered by the sample's
 * oldest, no model): the learned order in T1 is what keeps them. Plain LRB (split=0, one
 * sampled set) learns it too once the boundary covers the gap (bmul=2); at bmul=1 its
 * boundary is the LRU-like cache's characteristic time, 4 requests, shorter than the hot
 * gap, so no sample is ever labelled positive and it stays a sampled LRU (a failure mode,
 * kept visible). */
static void test_lrb_learns_periodic(void **st) {
    (void)st;
    int res;
    uint64_t t;
    static const struct {
        const char *spec;
        uint64_t lo, hi;
    } cases[] = {
        {"lru", 0, 0},
        {"lrb:order=0", 0, 0},
        {"lrb:split=0,period=256", 0, 0},
        {"lrb:split=0,period=256,bmul=2", 250, 300},
        {"lrb:period=256", 280, 300},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ikv_cache *c = make(4, cases[i].spec);
        uint64_t hits = hot_and_oneshots(c, 400, &res, &t);
        if (hits < cases[i].lo || hits > cases[i].hi)
            fail_msg("%s: %" PRIu64 " hot hits of 300 in the last 100 rounds (want %" PRIu64
                     "-%" PRIu64 ")",
                     cases[i].spec, hits, cases[i].lo, cases[i].hi);
        if (i + 1 < sizeof cases / sizeof cases[0]) {
            ikv_cache_destroy(c);
            continue;
        }
        assert_true(resident1(c, 1000 + 1199)); /* the last one-shot */
        req1(c, 5000, t++);
        assert_false(resident1(c, 1000 + 1199));
        assert_true(resident1(c, 1) && resident1(c, 2) && resident1(c, 3) && resident1(c, 5000));
        ikv_cache_destroy(c);
    }
}

/* The hit-density model itself: a class hit at age 5 (and never evicted) is denser at every
 * age up to 5 than a class evicted at age 1 and never hit, whose density is 0; the prior before
 * any recomputation is LRU (1 / (age + 1)); a class with fewer events than `pool` takes the
 * pooled density; a ghost hit (unevict) takes an eviction back and counts the hit; ages that
 * overflow the bins coarsen them (shift grows) and the densities stay sane. */
static void test_hd_model(void **st) {
    (void)st;
    ikv__hd *m = malloc(sizeof *m);
    assert_non_null(m);
    ikv__hd_init(m, 100, 1.0, 3);
    uint32_t a = ikv__hd_class(1, 0), b = ikv__hd_class(0, 0), rare = ikv__hd_class(9, 0);
    assert_true(ikv__hd_density(m, a, 0) > ikv__hd_density(m, a, 3)); /* prior: LRU */
    for (int i = 0; i < 50; i++) ikv__hd_hit(m, a, 5), ikv__hd_evict(m, b, 1);
    assert_int_equal(m->recomputes, 1);
    for (uint64_t age = 0; age <= 5; age++)
        assert_true(ikv__hd_density(m, a, age) > ikv__hd_density(m, b, age));
    assert_true(ikv__hd_density(m, b, 0) == 0.0f);
    /* a: one hit per 6 units of space-time at age 0, per (5 - age + 1) later */
    assert_float_equal(ikv__hd_density(m, a, 0), 1.0 / 6, 1e-6);
    assert_float_equal(ikv__hd_density(m, a, 5), 1.0, 1e-6);
    /* the rare class (no events) has the pooled density: 50 hits over 50 x 6 + 50 x 2 */
    assert_float_equal(ikv__hd_density(m, rare, 0), 50.0 / 400, 1e-6);
    /* b's evictions at age 1 were hits at age 9 after all: b now expects hits */
    for (int i = 0; i < 50; i++) ikv__hd_unevict(m, b, 1, 9);
    assert_true(m->evs[b][1] == 0 && m->hits[b][9] == 50);
    for (int i = 0; i < 100; i++) ikv__hd_hit(m, a, 5); /* next recomputation */
    assert_true(ikv__hd_density(m, b, 0) > 0);
    assert_true(ikv__hd_check(m));
    /* events beyond the bins: the resolution halves until they fit */
    unsigned s0 = m->shift;
    for (int i = 0; i < 1000; i++) ikv__hd_hit(m, a, 10000);
    assert_true(m->shift > s0);
    assert_true(ikv__hd_bin(m, 10000) < IKV__HD_NB - 1);
    assert_true(ikv__hd_check(m));
    m->hits[a][3] = -1; /* the walker notices a corrupt count */
    assert_false(ikv__hd_check(m));
    free(m);
}

/* A stream of conversations (docs/policies.md, "What the WEKA gap is made of"): 6 live ones,
 * each re-read every round as a chain that grows by a block a turn up to 5, interleaved with
 * dead ones, a fresh 3-block chain per live turn that never comes back. Through `cap` blocks,
 * returns the hit blocks of the last half of `rounds` and, via *dead_res (may be NULL), how
 * many of the dead chains' blocks are resident at the end. With `future` the accesses carry
 * what the simulator hands the oracle diagnostics: each block's next use (a live
 * conversation's blocks are re-read 12 accesses later, the dead chains never) and a session id
 * per conversation. req-level CHECKED (value's walker included). */
static uint64_t convs_and_dead(ikv_cache *c, int rounds, uint64_t *dead_res, int future) {
    uint64_t t = 1, hits = 0;
    uint32_t fresh = 100000;
    for (int r = 0; r < rounds; r++)
        for (uint32_t v = 0; v < 6; v++) {
            uint32_t ids[5];
            uint64_t next[5], never[3] = {IKV_NEVER, IKV_NEVER, IKV_NEVER};
            size_t n = r + 1 < 5 ? (size_t)r + 1 : 5;
            for (size_t i = 0; i < n; i++) {
                ids[i] = v * 100 + (uint32_t)i;
                next[i] = r + 1 < rounds ? t + 12 : IKV_NEVER;
            }
            ikv_key k[5];
            chain(ids, n, 0, k);
            ikv_access acc = {.now = t++};
            if (future) acc.scope = v + 1, acc.next_use = next;
            ikv_access_result ar;
            assert_int_equal(ikv_cache_access(c, k, n, &acc, &ar), 0);
            CHECKED(c);
            if (r >= rounds / 2) hits += ar.matched;
            uint32_t d[3] = {fresh, fresh + 1, fresh + 2};
            chain(d, 3, 0, k);
            acc.now = t++;
            if (future) acc.scope = 1000 + fresh, acc.next_use = never;
            fresh += 3;
            assert_int_equal(ikv_cache_access(c, k, 3, &acc, &ar), 0);
            CHECKED(c);
        }
    if (!dead_res) return hits;
    *dead_res = 0;
    for (uint32_t id = 100000; id < fresh; id += 3) {
        uint32_t d[3] = {id, id + 1, id + 2};
        ikv_key k[3];
        chain(d, 3, 0, k);
        size_t m;
        ikv_cache_match(c, k, 3, NULL, NULL, &m);
        *dead_res += m;
    }
    return hits;
}

/* value:pred learns from hits and evictions that unproven one-turn chains are not reused
 * within the horizon and dooms them (evicted first, from either class): on the stream above
 * through 24 blocks it hits more than lru (which never hits: 48 blocks between two turns of a
 * conversation) and at least as much as value without the predictor, and at the end holds
 * fewer dead blocks than value. Bad parameters are IKV_EPARAM. */
static void test_value_pred(void **st) {
    (void)st;
    const char *specs[] = {"lru", "value", "value:pred=0.25,prperiod=1024",
                           "value:pred=0.25,prdepth=1,prperiod=1024"};
    uint64_t hits[4], dead[4];
    for (int i = 0; i < 4; i++) {
        ikv_cache *c = make(24, specs[i]);
        hits[i] = convs_and_dead(c, 200, &dead[i], 0);
        ikv_cache_destroy(c);
    }
    /* measured: lru 0, value 86, pred 170 and 170 hits; dead blocks resident 9, 3, 3, 3 */
    assert_int_equal(hits[0], 0);
    assert_true(hits[1] > 0);
    for (int i = 2; i < 4; i++) {
        if (hits[i] <= hits[1])
            fail_msg("%s: %" PRIu64 " hits, value %" PRIu64, specs[i], hits[i], hits[1]);
        assert_true(dead[i] <= dead[1] && dead[i] < dead[0]);
    }
    /* the evidence fades fast (prperiod=64): every class looks equally bad and nothing is
     * learned in time: no better than value here (a failure mode, kept visible) */
    ikv_cache *f = make(24, "value:pred=0.25,prperiod=64");
    uint64_t d64;
    assert_true(convs_and_dead(f, 200, &d64, 0) <= hits[1]);
    ikv_cache_destroy(f);
    const char *bad[] = {"value:pred=0.5,split=0", "value:pred=0.5,hd=1", "value:pred=2",
                         "value:prperiod=1", "value:prcls=4", "value:prcls=1.5",
                         "value:oracle=4", "value:oracle=8", "value:oracle=1.5"};
    assert_rejected(bad, sizeof bad / sizeof bad[0]);
}

/* value:oracle=7, the feature-limited oracle (docs/policies.md): per bucket of the online
 * features it learns from the future's horizon bits, counted once each request ends, that
 * the one-turn chains (no hit, no session gap) are doomed and the conversations (a session
 * gap of 12) are not, so it hits more than value on that stream (measured: 1,613 hits against
 * 86). With obt=1 it never dooms and is value exactly. Without nu's histories, and with
 * parameters out of range, it is IKV_EPARAM. */
static void test_value_oracle7(void **st) {
    (void)st;
    ikv_cache *v = make(24, "value"), *o = make(24, "value:nu=1,nusess=1,num=0,oracle=7");
    ikv_cache *b = make(24, "value:nu=1,nusess=1,num=0,oracle=7,obt=1");
    uint64_t hv = convs_and_dead(v, 200, NULL, 1), ho = convs_and_dead(o, 200, NULL, 1);
    uint64_t hb = convs_and_dead(b, 200, NULL, 1);
    ikv_cache_destroy(v);
    ikv_cache_destroy(o);
    ikv_cache_destroy(b);
    /* obt=1 never dooms: nu with num=0 changes nothing, so it is value exactly */
    assert_int_equal(hb, hv);
    if (ho <= hv) fail_msg("oracle=7: %" PRIu64 " hits, value %" PRIu64, ho, hv);
    const char *bad[] = {"value:oracle=7,nu=1", "value:oracle=7,nusess=1",
                         "value:oracle=8,nu=1,nusess=1", "value:oracle=7,nu=1,nusess=1,obt=2",
                         "value:oracle=7,nu=1,nusess=1,obsess=2"};
    assert_rejected(bad, sizeof bad / sizeof bad[0]);
}

/* Destroys c after reading how many blocks of chains a and b (n each) stay resident, which must
 * be `both` in all; returns a's. */
static size_t kept_of_a(ikv_cache *c, const ikv_key *ka, const ikv_key *kb, size_t n, size_t both) {
    size_t ma = 0, mb = 0;
    ikv_cache_match(c, ka, n, NULL, NULL, &ma);
    ikv_cache_match(c, kb, n, NULL, NULL, &mb);
    ikv_cache_destroy(c);
    assert_int_equal(ma + mb, both);
    return ma;
}

/* value:hint=1: a chain whose last request ended its turn (IKV_HINT_TURN) goes before one whose
 * client is expected back (a pending tool call), even when it is the more recent of the two;
 * without the hint (value, and value:hint=1 fed no hints) the older chain goes, as by recency. */
static uint64_t hint_run(const char *spec, int use_hints) {
    ikv_cache *c = make(8, spec);
    uint32_t a[3] = {1, 2, 3}, b[3] = {4, 5, 6}, d[3] = {7, 8, 9};
    ikv_key ka[3], kb[3], kd[3];
    chain(a, 3, 0, ka);
    chain(b, 3, 0, kb);
    chain(d, 3, 0, kd);
    ikv_access_result r;
    /* b first (its client will be back), then a (its turn ended): both reread once (T2) */
    for (uint64_t round = 0; round < 2; round++) {
        ikv_access acc = {.now = 10 * round + 1, .hint = use_hints ? IKV_HINT_SOON : 0};
        assert_int_equal(ikv_cache_access(c, kb, 3, &acc, &r), 0);
        acc = (ikv_access){.now = 10 * round + 2, .hint = use_hints ? IKV_HINT_TURN : 0};
        assert_int_equal(ikv_cache_access(c, ka, 3, &acc, &r), 0);
        CHECKED(c);
    }
    /* a new 3-block chain needs 1 more block than is free (8 - 6 = 2): one leaf goes */
    ikv_access acc = {.now = 30};
    assert_int_equal(ikv_cache_access(c, kd, 3, &acc, &r), 0);
    CHECKED(c);
    return kept_of_a(c, ka, kb, 3, 5); /* 2: a lost its tail, 3: b did */
}

/* hazard: sessions that leave a tool call pending come back 10 s after their response ended,
 * sessions whose turn ended 100 s after. Once it has learned that, a chain whose tool call has
 * been pending for 60 s (longer than any such gap seen: abandoned) goes before a chain whose
 * turn ended 95 s ago (about due), though the latter is older; lru drops the older one, and
 * value:hint=1 the ended turn. Returns how many blocks of the abandoned chain stay. */
static size_t hazard_run(const char *spec) {
    ikv_cache *c = make(16, spec);
    ikv_access_result r;
    uint64_t now = 1;
    /* learning: 40 rounds of a SOON session (gap 10 s) and a TURN session (gap 100 s), one
     * block each, so neither fills the cache */
    for (uint64_t i = 0; i < 40; i++) {
        uint32_t ids[1] = {1};
        ikv_key k[1];
        chain(ids, 1, 0, k);
        uint64_t t = 1000000 + i * 10000; /* ms: every 10 s */
        ikv_access acc = {.now = now++, .scope = 1, .hint = IKV_HINT_SOON, .clock_ms = t};
        assert_int_equal(ikv_cache_access(c, k, 1, &acc, &r), 0);
        if (i % 10 == 0) {
            ids[0] = 2;
            chain(ids, 1, 0, k);
            acc = (ikv_access){.now = now++, .scope = 2, .hint = IKV_HINT_TURN, .clock_ms = t};
            assert_int_equal(ikv_cache_access(c, k, 1, &acc, &r), 0);
        }
        CHECKED(c);
    }
    /* b: turn ended at t0; a: tool call pending since t0 + 35 s; both 6 blocks */
    uint32_t a[6] = {10, 11, 12, 13, 14, 15}, b[6] = {20, 21, 22, 23, 24, 25};
    ikv_key ka[6], kb[6];
    chain(a, 6, 0, ka);
    chain(b, 6, 0, kb);
    uint64_t t0 = 2000000;
    ikv_access acc = {.now = now++, .scope = 20, .hint = IKV_HINT_TURN, .clock_ms = t0};
    assert_int_equal(ikv_cache_access(c, kb, 6, &acc, &r), 0);
    acc = (ikv_access){.now = now++, .scope = 10, .hint = IKV_HINT_SOON, .clock_ms = t0 + 35000};
    assert_int_equal(ikv_cache_access(c, ka, 6, &acc, &r), 0);
    CHECKED(c);
    /* the learning sessions' blocks come back under new sessions at t0 + 90 s (nothing
     * learned: first requests), so they are the newest and likely back (5 s idle, gaps 10 s) */
    for (uint32_t i = 1; i <= 2; i++) {
        ikv_key k[1];
        chain(&i, 1, 0, k);
        acc = (ikv_access){.now = now++, .scope = 100 + i, .hint = IKV_HINT_SOON,
                           .clock_ms = t0 + 90000};
        assert_int_equal(ikv_cache_access(c, k, 1, &acc, &r), 0);
    }
    /* at t0 + 95 s a new 6-block chain needs 4 more blocks than are free (16 - 14 = 2) */
    uint32_t d[6] = {30, 31, 32, 33, 34, 35};
    ikv_key kd[6];
    chain(d, 6, 0, kd);
    acc = (ikv_access){.now = now++, .scope = 30, .clock_ms = t0 + 95000};
    assert_int_equal(ikv_cache_access(c, kd, 6, &acc, &r), 0);
    CHECKED(c);
    return kept_of_a(c, ka, kb, 6, 8);
}

/* Runs one seeded stream (sessions, a wall clock, hints from access `hints` on; 0: none) through
 * x and y, checking x's invariants at every access; returns 1 if their resident sets ever
 * differed, and via *first_diff the first access where they did. */
static int hazard_stream(ikv_cache *x, ikv_cache *y, uint64_t hints, uint64_t *first_diff) {
    uint64_t rng = 777, hits = 0;
    int differ = 0;
    for (uint64_t t = 1; t <= 3000; t++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t r = (uint32_t)(rng >> 33) % 100;
        uint32_t id = r * r / 100 + 1;
        ikv_key k;
        chain(&id, 1, 0, &k);
        ikv_access acc = {.now = t, .scope = id % 7 + 1, .clock_ms = t * 1000 + (rng >> 60) * 700,
                          .hint = hints && t >= hints ? (id % 2 ? IKV_HINT_SOON : IKV_HINT_TURN)
                                                      : 0};
        ikv_access_result rx, ry;
        assert_int_equal(ikv_cache_access(x, &k, 1, &acc, &rx), 0);
        assert_int_equal(ikv_cache_access(y, &k, 1, &acc, &ry), 0);
        hits += rx.matched;
        CHECKED(x);
        for (uint32_t j = 1; j <= 100 && !differ; j++)
            if (resident1(x, j) != resident1(y, j)) differ = 1, *first_diff = t;
    }
    assert_true(hits > 300 && hits < 2700); /* the stream does exercise eviction */
    return differ;
}

/* hazard ranks only traffic that says how its responses end: with sessions and a wall clock
 * but no hints it is arc exactly, block for block (arc=0: lru); with hints it is not. auto is
 * AUTO_LRB on the stream without hints and hazard on the one with them, block for
 * block; on one whose hints start halfway it is AUTO_LRB until then and parts from it
 * after, its invariants (hazard's lists holding every evictable block in order) checked
 * throughout. */
static void test_hazard_without_hints(void **st) {
    (void)st;
    const struct {
        const char *x, *y;
        uint64_t hints;
        int differ;
    } runs[] = {{"hazard", "arc", 0, 0},          {"hazard", "arc", 1, 1},
                {"hazard:arc=0", "lru", 0, 0},    {"hazard:arc=0", "lru", 1, 1},
                {"auto", AUTO_LRB, 0, 0},         {"auto", "hazard", 1, 0},
                {"auto", "hazard", 0, 1},         {"auto", AUTO_LRB, 1500, 1}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        ikv_cache *x = make(12, runs[i].x), *y = make(12, runs[i].y);
        uint64_t first = 0;
        if (hazard_stream(x, y, runs[i].hints, &first) != runs[i].differ)
            fail_msg("%s against %s, hints from %" PRIu64 ": differ is not %d", runs[i].x,
                     runs[i].y, runs[i].hints, runs[i].differ);
        /* the switch: lrb:hint=1's choices until the first hint (its rule is idle without
         * hints), hazard's after */
        if (runs[i].hints > 1) assert_true(first >= runs[i].hints);
        ikv_cache_destroy(x);
        ikv_cache_destroy(y);
    }
}

static void test_hazard(void **st) {
    (void)st;
    assert_int_equal(hazard_run("hazard"), 2);       /* the abandoned tool call loses 4 */
    assert_int_equal(hazard_run("lru"), 6);          /* the older chain does */
    assert_int_equal(hazard_run("value:hint=1"), 6); /* the ended turn does */
    assert_int_equal(hazard_run("hazard:h=1"), 2);   /* 1 ms: a ties the new blocks, is older */
    assert_int_equal(hazard_run("hazard:arc=0"), 2); /* the same without ARC's lists */
    const char *bad[] = {"hazard:h=0", "hazard:h=x", "hazard:k=1", "hazard:arc=2",
                         "hazard:arc=0.5"};
    assert_rejected(bad, sizeof bad / sizeof bad[0]);
}

/* Regression (value:hint=1 before 2026-12-01 20:50 UTC): a hint-doomed block went first only
 * when REPLACE chose its own class, and a doomed victim moved that class's horizon to its
 * key (-1e15), so the doom did not reach across classes as documented. Here a (hit: T2) ends
 * its turn; b (new: T1) is a client expected back; REPLACE picks T1 (|T1| = 1 > p = 0): the
 * doomed a must go all the same, b stays. Without hints b goes. */
static void test_value_hint_either_class(void **st) {
    (void)st;
    for (int hint = 0; hint < 2; hint++) {
        ikv_cache *c = make(2, "value:hint=1");
        uint32_t ids[3] = {1, 2, 3};
        ikv_key k[3];
        for (int i = 0; i < 3; i++) chain(&ids[i], 1, 0, &k[i]);
        ikv_access_result r;
        ikv_access acc = {.now = 1, .hint = hint ? IKV_HINT_SOON : 0};
        assert_int_equal(ikv_cache_access(c, &k[0], 1, &acc, &r), 0); /* a */
        acc = (ikv_access){.now = 2, .hint = hint ? IKV_HINT_TURN : 0};
        assert_int_equal(ikv_cache_access(c, &k[0], 1, &acc, &r), 0); /* a hit: T2, turn ended */
        assert_int_equal(r.matched, 1);
        acc = (ikv_access){.now = 3, .hint = hint ? IKV_HINT_SOON : 0};
        assert_int_equal(ikv_cache_access(c, &k[1], 1, &acc, &r), 0); /* b: T1 */
        acc.now = 4;
        assert_int_equal(ikv_cache_access(c, &k[2], 1, &acc, &r), 0); /* c: needs room */
        CHECKED(c);
        assert_int_equal(resident1(c, 1), !hint);
        assert_int_equal(resident1(c, 2), hint);
        ikv_cache_destroy(c);
    }
}

static void test_value_hint(void **st) {
    (void)st;
    assert_int_equal(hint_run("value:hint=1", 1), 2); /* the finished turn goes */
    assert_int_equal(hint_run("value:hint=3", 1), 2); /* both are in T2 */
    assert_int_equal(hint_run("value:hint=2", 1), 3); /* T1 only: recency decides in T2 */
    assert_int_equal(hint_run("value:hint=1", 0), 3); /* no hints: the older (b) goes */
    assert_int_equal(hint_run("value", 1), 3);        /* hints ignored by default */
    /* lrb:hint=1 the same within the class REPLACE chose (T2 by the oldest of the sample) */
    assert_int_equal(hint_run("lrb:hint=1", 1), 2);
    assert_int_equal(hint_run("lrb:hint=1", 0), 3);
    assert_int_equal(hint_run("lrb", 1), 3);
    const char *bad[] = {"value:hint=4", "value:hint=0.5", "value:hint=-1"};
    assert_rejected(bad, sizeof bad / sizeof bad[0]);
}

/* value:hd=1 keeps ARC's split and orders T1 by the learned density (sampled): on a seeded
 * stream of 2-block chains (a skewed root, then one of 3 children) through 16 blocks, two caches
 * agree request for request (the sampling is seeded), the invariant walk holds after every
 * request (req-level CHECKED: the model, the class bits, the heaps), and the model changes
 * decisions: value:hd=1 and value differ in hits. A bad mode, hd without the split, or a bad
 * lhd parameter is IKV_EPARAM. */
static void test_value_hd(void **st) {
    (void)st;
    ikv_cache *a = make(16, "value:hd=1,hdperiod=32");
    ikv_cache *b = make(16, "value:hd=1,hdperiod=32");
    ikv_cache *v = make(16, "value");
    uint64_t rng = 4242, ha = 0, hv = 0;
    for (uint64_t t = 1; t <= 4000; t++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t r = (uint32_t)(rng >> 33) % 60;
        uint32_t ids[2] = {r * r / 60 + 1, 100 + (uint32_t)(rng >> 20) % 3};
        ikv_key k[2];
        chain(ids, 2, 0, k);
        ikv_access acc = {.now = t};
        ikv_access_result ra, rb, rv;
        assert_int_equal(ikv_cache_access(a, k, 2, &acc, &ra), 0);
        assert_int_equal(ikv_cache_access(b, k, 2, &acc, &rb), 0);
        assert_int_equal(ikv_cache_access(v, k, 2, &acc, &rv), 0);
        assert_int_equal(ra.matched, rb.matched);
        ha += ra.matched, hv += rv.matched;
        CHECKED(a);
    }
    if (ha == hv) fail_msg("value:hd=1 decided exactly as value (%" PRIu64 " hits)", ha);
    assert_true(ha > 500 && ha < 7500); /* the stream does exercise eviction */
    ikv_cache_destroy(a);
    ikv_cache_destroy(b);
    ikv_cache_destroy(v);
    ikv_cache_config cfg;
    ikv_cache *bad = NULL;
    ikv_cache_config_default(&cfg, 8, "value:hd=4");
    assert_int_equal(ikv_cache_create(&cfg, &bad), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 8, "value:hd=1.5");
    assert_int_equal(ikv_cache_create(&cfg, &bad), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 8, "value:split=0,hd=1");
    assert_int_equal(ikv_cache_create(&cfg, &bad), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 8, "lhd:tail=2");
    assert_int_equal(ikv_cache_create(&cfg, &bad), IKV_EPARAM);
    ikv_cache_config_default(&cfg, 8, "lhd:nope=1");
    assert_int_equal(ikv_cache_create(&cfg, &bad), IKV_EPARAM);
    assert_null(bad);
}

/* value:mix=1 draws the expert from a seeded stream, and expert 1 samples the evictable blocks:
 * two caches given the same stream agree block for block, and every access passes the
 * invariant walk (req1 checks it: weights >= 0.001 summing to 1, the experts' ghost lists). */
static void test_value_mix_deterministic(void **st) {
    (void)st;
    ikv_cache *a = make(24, "value:mix=1,sample=4");
    ikv_cache *b = make(24, "value:mix=1,sample=4");
    ikv_cache *v = make(24, "value");
    uint64_t rng = 777, hits = 0, differ = 0;
    for (uint64_t t = 1; t <= 4000; t++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t r = (uint32_t)(rng >> 33) % 120;
        uint32_t id = r * r / 120 + 1;
        size_t ha = req1(a, id, t);
        assert_int_equal(ha, req1(b, id, t));
        req1(v, id, t);
        hits += ha;
        for (uint32_t k = 1; k <= 120; k++) {
            assert_int_equal(resident1(a, k), resident1(b, k));
            differ += resident1(a, k) != resident1(v, k);
        }
    }
    assert_true(hits > 400 && hits < 3600); /* the stream does exercise eviction */
    assert_true(differ > 0);                /* and the mix is not just the split */
    ikv_cache_destroy(a);
    ikv_cache_destroy(b);
    ikv_cache_destroy(v);
}

/* arc: a ghost hit in B1 grows p (T2's LRU goes instead of T1's), one in B2 shrinks it. */
static void test_arc_adapts(void **st) {
    (void)st;
    ikv_cache *c = make(4, "arc");
    req1(c, 1, 1), req1(c, 2, 2), req1(c, 3, 3), req1(c, 4, 4); /* T1 = 1 2 3 4, p = 0 */
    req1(c, 1, 5), req1(c, 2, 6);                               /* T2 = 1 2, T1 = 3 4 */
    req1(c, 5, 7); /* |T1| = 2 > p = 0: T1's LRU (3) goes to B1 */
    assert_false(resident1(c, 3));
    req1(c, 3, 8); /* room first: 4 goes (T1's LRU); then 3 is found in B1: p = 1, 3 -> T2 */
    assert_false(resident1(c, 4));
    assert_true(resident1(c, 5));
    req1(c, 6, 9); /* |T1| = 1 (5) is not > p = 1: T2's LRU (1) goes to B2; with p = 0, 5 would */
    assert_false(resident1(c, 1));
    assert_true(resident1(c, 5));
    req1(c, 1, 10); /* room: |T1| = 2 (5 6) > 1: 5 goes to B1; 1 found in B2: p = 1 - 2 -> 0 */
    assert_false(resident1(c, 5));
    req1(c, 7, 11); /* |T1| = 1 (6) > p = 0: 6 goes; with p still 1, T2's LRU (2) would */
    assert_false(resident1(c, 6));
    assert_true(resident1(c, 2) && resident1(c, 3) && resident1(c, 1) && resident1(c, 7));
    ikv_cache_destroy(c);
}

static void test_policy_params(void **st) {
    (void)st;
    static const char *bad[] = {
        "fifo:x=1",        "lfu:x=1",        "sieve:x=1",           "arc:p=1",
        "gdsf:cost=flops", "gdsf:beta=1",    "s3fifo:small=0",      "s3fifo:small=1",
        "s3fifo:small=x",  "s3fifo:ghost=2", "s3fifo:move=4",       "s3fifo:move=1.5",
        "s3fifo:approx=2", "value:ghost=-1",
        "s3fifo:size=0.1", "s3fifo:small",   "s3fifo:small=0.1,,x", "value:beta=1",
        "value:new=-1",    "value:smooth=0", "value:cost=x",        "value:lru2=1e9",
        "value:mix=3",     "value:mix=0.5",  "value:split=0,mix=1", "value:lr=0",
        "value:sample=0",
        "value:fork=0.5",  "value:fork=2",   "value:horizon=-1",
        "value:split=2",   "value:split=0.5", "value:t2in=3",       "value:tlfu=16",
        "value:t1key=2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ikv_cache_config cfg;
        ikv_cache_config_default(&cfg, 10, bad[i]);
        ikv_cache *c = NULL;
        if (ikv_cache_create(&cfg, &c) != IKV_EPARAM) fail_msg("%s was accepted", bad[i]);
        assert_null(c);
        assert_true(strlen(ikv_errdetail()) > 0);
    }
    static const char *good[] = {"s3fifo:small=0.2,ghost=0.5,move=1", "s3fifo:ghost=0",
                                 "gdsf:cost=unit", "gdsf:cost=callback",
                                 "value:new=0,smooth=1,cost=2,lru2=0", "value:horizon=0,fork=0",
                                 "value:horizon=2,fork=1", "s3fifo:approx=1", "value:ghost=1"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ikv_cache *c = make(10, good[i]);
        CHECKED(c);
        ikv_cache_destroy(c);
    }
}

/* ---- golden hit counts on a Mooncake trace slice ---------------------------------------- */

/* tests/data/mooncake_conv_300.jsonl: the first 300 records of Mooncake's conversation trace
 * (see tests/data/README.md): 300 requests, 8490 blocks of 512 tokens, 7814 distinct. Each
 * record's hash_ids name its blocks; an id names the whole prefix it ends (a block's parent
 * is the id before it in its record, and that is the same in every record). */
#define GT_MAX_BLOCKS 10000
#define GT_MAX_RECS 400
typedef struct gtrace {
    uint32_t ids[GT_MAX_BLOCKS];
    uint64_t next[GT_MAX_BLOCKS]; /* time (record index + 1) of the id's next use, or NEVER */
    size_t off[GT_MAX_RECS + 1];  /* record r is ids[off[r]..off[r+1]) */
    size_t n;                     /* records */
} gtrace;

static gtrace GT;

/* A tiny parser for the hash_ids arrays: enough for this file, strict about what it reads. */
static void gt_load(void) {
    char path[1024];
    const char *src = getenv("IKV_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/data/mooncake_conv_300.jsonl", src ? src : ".");
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    char *line = NULL;
    size_t cap = 0, nb = 0;
    GT.n = 0;
    while (getline(&line, &cap, f) > 0) {
        const char *q = strstr(line, "\"hash_ids\"");
        assert_non_null(q);
        q = strchr(q, '[');
        assert_non_null(q);
        assert_true(GT.n < GT_MAX_RECS);
        GT.off[GT.n] = nb;
        for (q++;;) {
            while (*q == ' ') q++;
            if (*q == ']') break;
            char *end;
            unsigned long v = strtoul(q, &end, 10);
            assert_true(end != q && v < UINT32_MAX && nb < GT_MAX_BLOCKS);
            GT.ids[nb++] = (uint32_t)v;
            q = end;
            while (*q == ' ') q++;
            if (*q == ',') q++;
        }
        GT.n++;
    }
    GT.off[GT.n] = nb;
    free(line);
    fclose(f);
    assert_int_equal(GT.n, 300);
    assert_int_equal(nb, 8490);
    /* next use: scan backwards remembering each id's latest record */
    uint64_t *seen = calloc(GT_MAX_BLOCKS, sizeof *seen); /* ids are < 7814 here */
    assert_non_null(seen);
    for (size_t r = GT.n; r-- > 0;)
        for (size_t i = GT.off[r]; i < GT.off[r + 1]; i++) {
            assert_true(GT.ids[i] < GT_MAX_BLOCKS);
            GT.next[i] = seen[GT.ids[i]] ? seen[GT.ids[i]] : IKV_NEVER;
            seen[GT.ids[i]] = r + 1;
        }
    free(seen);
}

/* Replays the slice in trace order through the core (one tier of `cap` blocks, time = record
 * index + 1) and returns the blocks hit. */
static uint64_t gt_core(const char *policy, uint64_t cap) {
    ikv_cache *c = make(cap, policy);
    uint64_t hits = 0;
    ikv_key keys[GT_MAX_BLOCKS];
    for (size_t r = 0; r < GT.n; r++) {
        size_t n = GT.off[r + 1] - GT.off[r];
        for (size_t i = 0; i < n; i++) keys[i] = ikv_key_from_id(0, 0, GT.ids[GT.off[r] + i]);
        ikv_access acc = {.now = r + 1, .next_use = &GT.next[GT.off[r]]};
        ikv_access_result res;
        int rc = ikv_cache_access(c, keys, n, &acc, &res);
        assert_true(rc == 0 || rc == IKV_EFULL); /* a record longer than the cache fills it */
        hits += res.matched;
    }
    CHECKED(c);
    ikv_cache_destroy(c);
    return hits;
}

/* The same replay by brute force, written from the rules alone: an array of resident blocks
 * {id, parent, last use, next use, insertion order, hits} and linear scans. A block may be
 * evicted only if no resident block has it as parent, and not while it is the tail of the
 * chain being inserted (the core holds it). The victim is the evictable block with the
 * smallest last use (lru), the farthest next use (opt), the earliest insertion (fifo), or the
 * fewest accesses then the smallest last use (lfu). For lru, fifo and lfu the victim is unique
 * (two evictable blocks never share a last use: all blocks used at one time are one chain);
 * for opt only blocks never used again can tie, and which of those goes first does not change
 * the hits (their descendants are never used again either, so they all go before any block
 * that will be used). */
typedef struct gblock {
    uint32_t id, parent; /* parent UINT32_MAX for a first block */
    uint32_t kids;       /* resident blocks whose parent this is */
    uint64_t last, next, ins, hits;
} gblock;

static size_t g_find(const gblock *res, size_t nres, uint32_t id) {
    size_t j = 0;
    while (j < nres && res[j].id != id) j++;
    return j;
}

/* value: the block whose predicted next use (last access + its smoothed reuse gap) is nearer
 * survives, although it is the less recent one (lru evicts it): in the single heap (split=0)
 * and in T2 keyed by the prediction (t2key=1); the default T2 is ARC's, by recency, like lru. */
/* The next-use predictor's own structures against brute force (nextuse.h): random queue,
 * dequeue and deadline changes over 64 nodes; after every step the overdue block is the
 * queued one with the earliest deadline before now (ties: lower id) or none, and the walker
 * holds. Then the gap modes on one history, and the session table. */
static void test_nextuse_fuzz(void **st) {
    (void)st;
    enum { N = 64 };
    ikv__nu u;
    assert_int_equal(ikv__nu_init(&u, N, N, IKV__NU_MAX, 3, 0, 1), 0);
    uint32_t dl[N];
    int q[N] = {0};
    for (int i = 0; i < N; i++) dl[i] = IKV__NU_NONE;
    for (int step = 0; step < 20000; step++) {
        uint32_t id = (uint32_t)rndn(N);
        uint64_t now = 1 + rndn(1000);
        switch (rndn(3)) {
        case 0:
            if (!q[id]) ikv__nu_queue(&u, id), q[id] = 1;
            break;
        case 1:
            if (q[id]) ikv__nu_dequeue(&u, id), q[id] = 0;
            break;
        default:
            dl[id] = rndn(4) ? 1 + (uint32_t)rndn(1000) : IKV__NU_NONE;
            ikv__nu_set_deadline(&u, id, dl[id], q[id]);
        }
        uint32_t want = IKV_NIL;
        for (uint32_t i = 0; i < N; i++)
            if (q[i] && dl[i] != IKV__NU_NONE && dl[i] < now &&
                (want == IKV_NIL || dl[i] < dl[want]))
                want = i;
        assert_int_equal(ikv__nu_overdue(&u, now), want);
        assert_true(ikv__nu_check(&u, NULL, NULL));
    }
    /* accesses at 10, 14, 30, 31 (gaps 4, 16, 1, newest last) */
    ikv__nu_start(&u, 5, 10);
    assert_true(ikv__nu_gap(&u, 5) < 0);
    ikv__nu_access(&u, 5, 14);
    ikv__nu_access(&u, 5, 30);
    ikv__nu_access(&u, 5, 31);
    ikv__nu_access(&u, 5, 31); /* the same tick again adds no gap */
    const double want[4] = {1, 16, 7, 1};
    for (int m = 0; m < 4; m++) {
        u.mode = m;
        assert_true(fabs(ikv__nu_gap(&u, 5) - want[m]) < 1e-9);
    }
    u.mode = IKV__NU_MAX, u.ngaps = 1;
    assert_true(ikv__nu_gap(&u, 5) == 1); /* only the last gap */
    ikv__nu_inherit(&u, 6, 5);
    assert_true(ikv__nu_gap(&u, 6) == 1 && ikv__nu_last(&u, 6) == 31);
    assert_true(ikv__nu_session(&u, 77, 100) < 0); /* no session table */
    assert_true(ikv__nu_check(&u, NULL, NULL));
    ikv__nu_free(&u);
    /* sessions: unknown at the first request, then the last turn gap; one request counts once;
     * a session whose entry another one took starts over */
    assert_int_equal(ikv__nu_init(&u, N, N, IKV__NU_MAX, 3, 1, 1), 0);
    assert_int_equal(u.nsess, IKV__NU_SESS_MIN);
    assert_true(ikv__nu_session(&u, 77, 100) < 0);
    assert_true(ikv__nu_session(&u, 77, 100) < 0);
    assert_true(ikv__nu_session(&u, 77, 130) == 30);
    assert_true(ikv__nu_session(&u, 77, 130) == 30);
    assert_true(ikv__nu_session(&u, 77, 135) == 5);
    assert_true(ikv__nu_session(&u, 0, 140) < 0); /* no session id */
    uint64_t twin = 78;
    while (((twin * 0x9e3779b97f4a7c15ull >> 32) & (u.nsess - 1)) !=
           ((77 * 0x9e3779b97f4a7c15ull >> 32) & (u.nsess - 1)))
        twin++;
    assert_true(ikv__nu_session(&u, twin, 150) < 0);
    assert_true(ikv__nu_session(&u, 77, 160) < 0);
    assert_true(ikv__nu_check(&u, NULL, NULL));
    ikv__nu_free(&u);
    /* allocation failure leaves nothing behind (the allocator seam) */
    for (size_t ok = 0; ok <= 5; ok++) {
        ikv_alloc_fail_after(ok);
        ikv__nu v;
        int rc = ikv__nu_init(&v, N, N, IKV__NU_LAST, 1, 1, 1);
        ikv_alloc_fail_after(SIZE_MAX);
        if (ok < 5) assert_int_equal(rc, IKV_ENOMEM); /* 5 arrays: any failure is reported */
        else assert_int_equal(rc, 0);
        ikv__nu_free(&v);
    }
}

/* One block request under a session id (scope). */
static size_t req1s(ikv_cache *c, uint32_t id, uint64_t now, uint64_t scope) {
    ikv_key k;
    chain(&id, 1, 0, &k);
    ikv_access acc = {.now = now, .scope = scope};
    ikv_access_result r;
    assert_int_equal(ikv_cache_access(c, &k, 1, &acc, &r), 0);
    CHECKED(c);
    return r.matched;
}

/* value:nu=1,nuk=2: a block older than twice its own gap is overdue and goes before the block
 * that recency (ARC's T2, value's default) would pick. A (gaps of 1) was last used at 15, B
 * (a gap of 10) at 11; at 30 a new block needs room: value evicts B, the least recent; the
 * predictor evicts A, overdue since 18 (B's deadline, 32, has not passed). */
static void test_value_nu_overdue(void **st) {
    (void)st;
    for (int nu = 0; nu < 2; nu++) {
        ikv_cache *c = make(2, nu ? "value:nu=1,nuk=2,num=0,numode=0" : "value");
        req1(c, 2, 1);                                  /* B */
        assert_int_equal(req1(c, 2, 11), 1);            /* B: gap 10 */
        req1(c, 1, 12);                                 /* A */
        for (uint64_t t = 13; t <= 15; t++) assert_int_equal(req1(c, 1, t), 1); /* A: gaps 1 */
        req1(c, 3, 30);
        assert_int_equal(resident1(c, 1), !nu);
        assert_int_equal(resident1(c, 2), nu);
        assert_true(resident1(c, 3));
        ikv_cache_destroy(c);
    }
}

/* value:nu=1,nusess=1: a conversation back after a turn gap far beyond the eviction horizon
 * (the cache turns over every 2 requests; its gap is 49) is predicted not to come back in time:
 * its new block is doomed and evicted before the older block of a fresh session, which value
 * keeps by recency. Without a session id nothing is known and nu behaves as value. */
static void test_value_nu_session(void **st) {
    (void)st;
    for (int k = 0; k < 3; k++) {
        ikv_cache *c = make(2, k == 0 ? "value" : "value:nu=1,nusess=1");
        uint64_t conv = k == 2 ? 0 : 1; /* k == 2: the requests carry no session id */
        req1s(c, 1, 1, conv);
        for (uint32_t t = 2; t < 50; t++) req1s(c, 1000 + t, t, 1000 + t); /* one-off sessions */
        req1s(c, 2, 50, conv); /* the conversation's next turn: a new tail block */
        req1s(c, 3, 51, 5000); /* needs room */
        int doomed = k == 1;
        if (resident1(c, 2) != !doomed || resident1(c, 1049) != doomed)
            fail_msg("k %d: block 2 resident %d, block 1049 %d", k, resident1(c, 2),
                     resident1(c, 1049));
        assert_int_equal(resident1(c, 1049), doomed);
        ikv_cache_destroy(c);
    }
}

/* value:nu on the stream of test_value_pred (6 live conversations re-read every round,
 * one-turn dead chains between them, 24 blocks, invariants after every request) against
 * value, and bad parameters (IKV_EPARAM). */
static void test_value_nu(void **st) {
    (void)st;
    const char *specs[] = {"value",
                           "value:nu=1",
                           "value:nu=1,nusess=1,num=1.5,nuown=0",
                           "value:nu=1,nuk=4,numode=2,nugaps=2",
                           "value:nu=1,nusess=1,nuadapt=0.1",
                           "value:nu=1,nughost=1,num=1.25,nucls=1"};
    uint64_t hits[6], dead[6];
    for (int i = 0; i < 6; i++) {
        ikv_cache *c = make(24, specs[i]);
        hits[i] = convs_and_dead(c, 200, &dead[i], 0);
        ikv_cache_destroy(c);
    }
    print_message("nu stream: hits %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
                  " %" PRIu64 ", dead %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
                  " %" PRIu64 "\n",
                  hits[0], hits[1], hits[2], hits[3], hits[4], hits[5], dead[0], dead[1],
                  dead[2], dead[3], dead[4], dead[5]);
    /* measured: 86 0 86 0 0. The session-only doom in T2 with a T1 doom past 1.5 horizons
     * (no session ids here) loses nothing against value; dooming by own gaps in T2 loses the
     * live conversations (a failure mode, kept visible: docs/policies.md) */
    assert_true(hits[0] > 0);
    assert_true(hits[2] >= hits[0]);
    assert_true(hits[1] < hits[0]);
    const char *bad[] = {"value:nu=1,split=0", "value:nu=2",         "value:numode=4",
                         "value:nugaps=0",     "value:nugaps=4",     "value:nucls=0",
                         "value:nuk=-1",       "value:nuadapt=0.1",  "value:nu=1,nuadapt=2",
                         "value:nu=1,nuadapt=0.1,pred=0.25", "value:nuown=2", "value:nusess=0.5",
                         "value:nughost=1", "value:nu=1,nughost=1,hd=1"};
    assert_rejected(bad, sizeof bad / sizeof bad[0]);
}

static void test_value_predicted_reuse(void **st) {
    (void)st;
    static const char *const cfg[] = {"value:split=0", "value:t2key=1", "lru", "value"};
    for (int k = 0; k < 4; k++) {
        int use_lru = k >= 2;
        ikv_cache *c = make(2, cfg[k]);
        req1(c, 1, 1);                       /* A */
        req1(c, 2, 18), req1(c, 2, 19);      /* B: reused after 1 -> next use predicted at 20 */
        assert_int_equal(req1(c, 1, 20), 1); /* A: reused after 19 -> next use predicted at 39 */
        req1(c, 3, 21);                      /* needs room: A (value) or B (lru, less recent) */
        assert_int_equal(resident1(c, 1), use_lru);
        assert_int_equal(resident1(c, 2), !use_lru);
        ikv_cache_destroy(c);
    }
}

/* value: a block inserted under a reused chain inherits the chain's gap, so it outlives a newer
 * block whose chain has shown no reuse (predicted `new` = 4 mean gaps away); lru keeps the newer
 * one. Without the inheritance the tail would be unproven too and go first. */
static void test_value_unproven_and_inherited(void **st) {
    (void)st;
    for (int use_lru = 0; use_lru < 2; use_lru++) {
        ikv_cache *c = make(3, use_lru ? "lru" : "value:split=0");
        uint32_t a[2] = {1, 2};
        ikv_key ka[2];
        chain(a, 2, 0, ka);
        ikv_access_result r;
        ikv_access acc = {.now = 1};
        assert_int_equal(ikv_cache_access(c, ka, 1, &acc, &r), 0); /* a0 */
        acc.now = 2;
        assert_int_equal(ikv_cache_access(c, ka, 1, &acc, &r), 0); /* a0 reused: gap 1 */
        acc.now = 3;
        assert_int_equal(ikv_cache_access(c, ka, 2, &acc, &r), 0); /* a0 hit, a1 inherits */
        assert_int_equal(r.matched, 1);
        req1(c, 9, 4);  /* X: unproven, key 4 - 4 * 1 = 0 < a1's 3 - 1 = 2 */
        req1(c, 10, 5); /* needs room: X (value) or a1 (lru, less recent) */
        size_t m;
        ikv_cache_match(c, ka, 2, NULL, NULL, &m);
        assert_int_equal(m, use_lru ? 1 : 2);
        assert_int_equal(resident1(c, 9), use_lru);
        CHECKED(c);
        ikv_cache_destroy(c);
    }
}

/* value: a block inserted beside a resident sibling (a fork) starts unproven: its parent's reuse
 * is shared by all its children, so the parent's gap says nothing about this one. Under a0
 * (reused every tick), b1 extends the chain and inherits the gap 1; c1 forks beside b1 and is
 * predicted 4 mean gaps away, so it goes first although it is newer (lru and value:fork=0 evict
 * b1, the older one). */
static void test_value_fork(void **st) {
    (void)st;
    for (int fork = 0; fork < 2; fork++) {
        ikv_cache *c = make(3, fork ? "value:split=0" : "value:split=0,fork=0");
        uint32_t b[2] = {1, 2}, cc[2] = {1, 3};
        ikv_key kb[2], kc[2];
        chain(b, 2, 0, kb);
        chain(cc, 2, 0, kc);
        ikv_access_result r;
        ikv_access acc = {.now = 1};
        assert_int_equal(ikv_cache_access(c, kb, 1, &acc, &r), 0); /* a0 */
        acc.now = 2;
        assert_int_equal(ikv_cache_access(c, kb, 1, &acc, &r), 0); /* a0 reused: gap 1 */
        acc.now = 3;
        assert_int_equal(ikv_cache_access(c, kb, 2, &acc, &r), 0); /* b1 inherits gap 1 */
        acc.now = 4;
        assert_int_equal(ikv_cache_access(c, kc, 2, &acc, &r), 0); /* c1: a fork */
        assert_int_equal(r.matched, 1);
        req1(c, 9, 5); /* needs room: c1 (key 4 - 4 = 0) or b1 (3 - 1 = 2 < c1's 4 - 1 = 3) */
        size_t mb, mc;
        ikv_cache_match(c, kb, 2, NULL, NULL, &mb);
        ikv_cache_match(c, kc, 2, NULL, NULL, &mc);
        assert_int_equal(mb, fork ? 2 : 1);
        assert_int_equal(mc, fork ? 1 : 2);
        CHECKED(c);
        ikv_cache_destroy(c);
    }
}

/* value: a predicted gap counts only beyond the eviction horizon. After A (last used at 3, key
 * 3 - 2 = 1) is evicted, the frontier stands at key 1, so at time 5 a block is kept about
 * 5 - 1 = 4 ticks. B's gap 3 is inside that: B is ordered by recency (key 5) and outlives C
 * (key 4), as under lru. With horizon=0 the gap counts in full (key 5 - 3 = 2) and B goes
 * first. new=0,cost=0 leave the gap as the only difference from recency. */
static void test_value_horizon(void **st) {
    (void)st;
    for (int hz = 0; hz < 2; hz++) {
        ikv_cache *c =
            make(2, hz ? "value:split=0,new=0,cost=0" : "value:split=0,new=0,cost=0,horizon=0");
        req1(c, 1, 1);                      /* A */
        req1(c, 2, 2);                      /* B */
        assert_int_equal(req1(c, 1, 3), 1); /* A reused after 2: key 1 */
        req1(c, 3, 4);                      /* C: evicts A (key 1 < B's 2) in both */
        assert_int_equal(resident1(c, 1), 0);
        assert_int_equal(req1(c, 2, 5), 1); /* B reused after 3 */
        req1(c, 4, 6);                      /* D: needs room: C (horizon) or B (horizon=0) */
        assert_int_equal(resident1(c, 2), hz);
        assert_int_equal(resident1(c, 3), !hz);
        ikv_cache_destroy(c);
    }
}

/* value: the recompute cost matters. With cost=1 the older but 10x dearer (per token) leaf x1
 * outlives a cheaper newer one; with cost=0 age alone decides and x1 goes. The same inside the
 * class split's T1 (the default). */
static void test_value_cost(void **st) {
    (void)st;
    /* the single heap, and the default split, where all three blocks are in T1 (never hit) */
    static const char *const cfgs[] = {"value:split=0,cost=0", "value:split=0,cost=1",
                                       "value:cost=0", "value:cost=1"};
    for (int k = 0; k < 4; k++) {
        int priced = k & 1;
        ikv_cache_config cfg;
        ikv_cache_config_default(&cfg, 3, cfgs[k]);
        cfg.cost = cost_by_depth;
        ikv_cache *c;
        assert_int_equal(ikv_cache_create(&cfg, &c), 0);
        uint32_t x[2] = {1, 2};
        ikv_key kx[2];
        chain(x, 2, 0, kx);
        ikv_access acc = {.now = 1};
        ikv_access_result r;
        assert_int_equal(ikv_cache_access(c, kx, 2, &acc, &r), 0); /* x1: 10 per token */
        req1(c, 7, 2);                                             /* 1 per token */
        req1(c, 8, 3); /* key x1 = 1 + ln 10 = 3.3 > 7's 2 when priced; 1 < 2 when not */
        size_t m;
        ikv_cache_match(c, kx, 2, NULL, NULL, &m);
        assert_int_equal(m, priced ? 2 : 1);
        assert_int_equal(resident1(c, 7), !priced);
        CHECKED(c);
        ikv_cache_destroy(c);
    }
}

static uint64_t gt_brute(const char *policy, uint64_t cap) {
    gblock *res = calloc(cap, sizeof *res);
    assert_non_null(res);
    size_t nres = 0;
    uint64_t hits = 0, ins = 0;
    for (size_t r = 0; r < GT.n; r++) {
        const uint32_t *ids = &GT.ids[GT.off[r]];
        const uint64_t *next = &GT.next[GT.off[r]];
        size_t n = GT.off[r + 1] - GT.off[r], m = 0;
        uint64_t now = r + 1;
        for (; m < n; m++) { /* longest resident prefix, and the hit on it */
            size_t j = g_find(res, nres, ids[m]);
            if (j == nres) break;
            res[j].last = now;
            res[j].next = next[m];
            res[j].hits++;
        }
        hits += m;
        for (size_t i = m; i < n; i++) {
            uint32_t parent = i ? ids[i - 1] : UINT32_MAX;
            if (nres == cap) {
                size_t v = nres;
                for (size_t j = 0; j < nres; j++) {
                    if (res[j].id == parent || res[j].kids) continue; /* held, or not a leaf */
                    if (v == nres) {
                        v = j;
                        continue;
                    }
                    const gblock *a = &res[j], *b = &res[v];
                    int better = !strcmp(policy, "lru")    ? a->last < b->last
                                 : !strcmp(policy, "opt")  ? a->next > b->next
                                 : !strcmp(policy, "fifo") ? a->ins < b->ins
                                 : a->hits < b->hits || (a->hits == b->hits && a->last < b->last);
                    if (better) v = j;
                }
                if (v == nres) break; /* nothing evictable: the core reports IKV_EFULL */
                size_t pv = g_find(res, nres, res[v].parent);
                if (pv < nres) res[pv].kids--;
                res[v] = res[--nres];
            }
            size_t pi = g_find(res, nres, parent);
            if (pi < nres) res[pi].kids++;
            res[nres++] = (gblock){ids[i], parent, 0, now, next[i], ++ins, 0};
        }
    }
    free(res);
    return hits;
}

/* Golden hit counts (blocks) of every policy on the slice, at 1000, 3000 and 5000 blocks. At
 * most 8490 - 7814 = 676 blocks can hit (the rest are first uses); 299 of them are the first
 * block, shared by every request. The slice's conversation turns come back more than 1000
 * blocks later, so up to 1000 blocks (and at 200) every online policy hits only that shared
 * block while opt, which knows what returns, already gets all 676; 3000 and 5000 blocks are
 * where the online policies part.
 *
 * How the numbers were checked. lru, opt, fifo and lfu are recomputed right here by the
 * brute-force replay above, which must agree. value with its prediction switched off
 * (value:new=0,lru2=0,cost=0: key = last access) must equal lru, so value's numbers differ from
 * lru's only by what the gap prediction (with its horizon and fork rules) and the cost term
 * decide; on this slice (every turn comes back more than 1000 blocks later, few blocks are
 * ever reused) they decide nothing.
 * sieve, s3fifo and arc were replayed by tests/tools/policy_model.py, an independent Python
 * model of each algorithm under the same leaf-only rules (plain lists, exact ghost lists
 * instead of the bucketed ghost table), which gives the same numbers at 1000-6000 blocks.
 * lhd's and lrb's numbers (issue 15) are recorded from the implementation, not from an independent
 * model: its sampled victims and learned densities have no simpler equivalent; what is
 * checked independently is its model (test_hd_model) and its decisions on a hand-built
 * stream (test_lhd_learns_hot_blocks). hazard's are arc's (no hints on the slice: nothing is
 * ranked) and auto's are those of its lrb:hint=1,duel=2,dwin=4096,pool=2 (no hints), both
 * checked here against those policies.
 * Every online policy stays below opt. A change to any policy's decisions changes these
 * numbers: update them only with an explanation. */
static const struct {
    const char *policy;
    uint64_t hits[3]; /* at GT_CAPS */
} GOLDEN[] = {
    {"lru", {299, 360, 464}},    {"value", {299, 364, 464}}, {"opt", {676, 676, 676}},
    {"fifo", {299, 360, 464}},   {"lfu", {299, 364, 464}},   {"s3fifo", {299, 356, 464}},
    {"sieve", {299, 410, 596}},  {"arc", {299, 364, 464}},   {"gdsf", {299, 336, 563}},
    {"lhd", {299, 356, 461}},    {"lrb", {301, 401, 608}},    {"hazard", {299, 364, 464}},
    {"auto", {324, 406, 598}},
};
static const uint64_t GT_CAPS[3] = {1000, 3000, 5000};

/* value:oracle=N (simulator-only diagnostics, docs/policies.md) read the slice's next uses as
 * opt does: oracle=4 (one heap by the farthest next use) is opt exactly, and the doom bits
 * (1: no future use; 3: no use within the horizon) never lose to value and never pass opt. */
static void test_value_oracle(void **st) {
    (void)st;
    gt_load();
    for (int k = 0; k < 3; k++) {
        uint64_t cap = GT_CAPS[k], v = gt_core("value", cap), o = gt_core("opt", cap);
        assert_int_equal(gt_core("value:split=0,oracle=4", cap), o);
        for (int m = 1; m <= 3; m += 2) {
            char spec[32];
            snprintf(spec, sizeof spec, "value:oracle=%d", m);
            uint64_t h = gt_core(spec, cap);
            if (h < v || h > o)
                fail_msg("%s at %" PRIu64 ": %" PRIu64 " (value %" PRIu64 ", opt %" PRIu64 ")",
                         spec, cap, h, v, o);
        }
    }
}

static void test_golden_mooncake(void **st) {
    (void)st;
    gt_load();
    assert_int_equal(sizeof GOLDEN / sizeof GOLDEN[0], ikv_policy_count());
    for (size_t p = 0; p < ikv_policy_count(); p++) {
        const char *name = ikv_policy_name(p);
        size_t g = 0;
        while (g < ikv_policy_count() && strcmp(GOLDEN[g].policy, name)) g++;
        if (g == ikv_policy_count()) fail_msg("no golden numbers for policy %s", name);
        const uint64_t *caps = GT_CAPS, *want = GOLDEN[g].hits;
        for (int k = 0; k < 3; k++) {
            uint64_t got = gt_core(name, caps[k]);
            assert_true(got <= GOLDEN[2].hits[k]); /* never above opt */
            if (!strcmp(name, "value")) {
                /* one heap keyed by last access is lru; the class split keyed so is arc */
                assert_int_equal(gt_core("value:split=0,new=0,lru2=0,cost=0", caps[k]),
                                 gt_core("lru", caps[k]));
                assert_int_equal(gt_core("value:split=1,t1key=0,new=0,lru2=0,cost=0", caps[k]),
                                 gt_core("arc", caps[k]));
            }
            /* auto is AUTO_LRB until a hint comes */
            if (!strcmp(name, "auto")) assert_int_equal(got, gt_core(AUTO_LRB, caps[k]));
            /* without hints hazard ranks nothing: it is arc (arc=0: lru) */
            if (!strcmp(name, "hazard")) {
                assert_int_equal(got, gt_core("arc", caps[k]));
                assert_int_equal(gt_core("hazard:arc=0", caps[k]), gt_core("lru", caps[k]));
            }
            if (!strcmp(name, "lru") || !strcmp(name, "opt") || !strcmp(name, "fifo") ||
                !strcmp(name, "lfu")) {
                uint64_t brute = gt_brute(name, caps[k]);
                if (got != brute)
                    fail_msg("%s at %lu blocks: core %lu hits, brute force %lu", name,
                             (unsigned long)caps[k], (unsigned long)got, (unsigned long)brute);
            }
            if (got != want[k])
                fail_msg("%s at %lu blocks: %lu hits, golden %lu", name, (unsigned long)caps[k],
                         (unsigned long)got, (unsigned long)want[k]);
        }
    }
}

/* ---- differential fuzz against a brute-force oracle ---------------------------------------- */

#define O_MAX 4096
typedef struct oblock {
    ikv_key key;
    int parent; /* index into oracle, -1 for a first block */
    int tier;   /* -1 = gone */
    int lock;
    int pinned;
    uint64_t last;
    uint64_t next_use;
    uint64_t ins;  /* order of insertion (fifo) */
    int hits;      /* hits since insertion (lfu) */
} oblock;

typedef struct oracle {
    oblock b[O_MAX];
    int n;
    int n_tiers;
    uint64_t cap[IKV_MAX_TIERS];
    const char *policy;
    int exact;     /* check the exact victim (lru, opt, single tier, no temp holds) */
    int holds[2];  /* blocks the core holds during the current operation */
    long moves;
    uint64_t ins_seq;
} oracle;

static oracle O;

static int o_find(ikv_key k) {
    for (int i = 0; i < O.n; i++)
        if (O.b[i].tier >= 0 && ikv_key_eq(O.b[i].key, k)) return i;
    return -1;
}

static int o_has_child_in(int i, int t) {
    for (int j = 0; j < O.n; j++)
        if (O.b[j].tier == t && O.b[j].parent == i) return 1;
    return 0;
}

static int o_evictable(int i) {
    const oblock *b = &O.b[i];
    return b->tier >= 0 && !b->lock && !b->pinned && !o_has_child_in(i, b->tier) &&
           i != O.holds[0] && i != O.holds[1];
}

static void on_move(void *ctx, uint32_t node, ikv_key key, int from, int to) {
    (void)ctx, (void)node;
    int i = o_find(key);
    if (i < 0) fail_msg("core moved a block the oracle does not hold");
    oblock *b = &O.b[i];
    assert_int_equal(b->tier, from);
    O.moves++;
    if (to >= 0 && to < from) { /* promotion: parent must already be in a tier <= to */
        if (b->parent >= 0) assert_true(O.b[b->parent].tier <= to);
        b->tier = to;
        return;
    }
    /* eviction from `from`: must be an evictable leaf of that tier */
    assert_false(b->lock);
    assert_false(b->pinned);
    assert_false(o_has_child_in(i, from));
    if (to < 0)
        for (int j = 0; j < O.n; j++) assert_false(O.b[j].tier >= 0 && O.b[j].parent == i);
    if (O.exact) {
        for (int j = 0; j < O.n; j++) {
            if (j == i || O.b[j].tier != from || !o_evictable(j)) continue;
            if (!strcmp(O.policy, "lru") && O.b[j].last < b->last)
                fail_msg("lru evicted last=%lu but last=%lu was evictable",
                         (unsigned long)b->last, (unsigned long)O.b[j].last);
            if (!strcmp(O.policy, "opt") && O.b[j].next_use > b->next_use)
                fail_msg("opt evicted next=%lu but next=%lu was evictable",
                         (unsigned long)b->next_use, (unsigned long)O.b[j].next_use);
            if (!strcmp(O.policy, "fifo") && O.b[j].ins < b->ins)
                fail_msg("fifo evicted insertion %lu but insertion %lu was evictable",
                         (unsigned long)b->ins, (unsigned long)O.b[j].ins);
            /* lfu: fewest accesses (insert + hits, the core counts up to 255 hits), then the
             * least recent; two evictable leaves never share a last-access time here */
            int fj = O.b[j].hits < 255 ? O.b[j].hits : 255, fb = b->hits < 255 ? b->hits : 255;
            if (!strcmp(O.policy, "lfu") && (fj < fb || (fj == fb && O.b[j].last < b->last)))
                fail_msg("lfu evicted (hits %d, last %lu) but (hits %d, last %lu) was evictable",
                         fb, (unsigned long)b->last, fj, (unsigned long)O.b[j].last);
        }
    }
    b->tier = to;
}

static void o_compare(ikv_cache *c) {
    CHECKED(c);
    uint64_t res[IKV_MAX_TIERS] = {0};
    for (int i = 0; i < O.n; i++) {
        if (O.b[i].tier < 0) continue;
        res[O.b[i].tier]++;
        size_t m;
        uint8_t tier;
        uint32_t node;
        ikv_cache_match(c, &O.b[i].key, 1, &node, &tier, &m);
        assert_int_equal(m, 1);
        assert_int_equal(tier, O.b[i].tier);
        if (O.b[i].parent >= 0) assert_true(O.b[O.b[i].parent].tier >= 0);
    }
    ikv_cache_stats s;
    ikv_cache_stats_get(c, &s);
    for (int t = 0; t < O.n_tiers; t++) {
        assert_int_equal(s.resident[t], res[t]);
        assert_true(res[t] <= O.cap[t]);
    }
}

/* One fuzz run: random chains over a small alphabet (so prefixes are shared), with locks held
 * across operations, pins, ttl expiry, and tiers. */
/* From this step on (0: never) fuzz_one's requests carry a random hint and a wall clock, as
 * agent traffic does, so hazard's ranking and auto's switch run among tiers, locks and pins. */
static int fuzz_hints_from;

static void fuzz_one(const char *policy, int n_tiers, int steps, uint64_t seed) {
    memset(&O, 0, sizeof O);
    O.policy = policy;
    O.n_tiers = n_tiers;
    O.holds[0] = O.holds[1] = -1;
    rng_state = seed;
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 12 + rndn(20), policy);
    cfg.n_tiers = (size_t)n_tiers;
    for (int t = 1; t < n_tiers; t++) {
        cfg.tiers[t].name = t == 1 ? "dram" : "ssd";
        cfg.tiers[t].capacity = 8 + rndn(24);
        cfg.tiers[t].policy = policy;
        cfg.tiers[t].admit_min_hits = (uint32_t)rndn(2);
    }
    for (int t = 0; t < n_tiers; t++) O.cap[t] = cfg.tiers[t].capacity;
    cfg.pin_budget = 0.3;
    cfg.on_evict = on_move;
    ikv_cache *c;
    assert_int_equal(ikv_cache_create(&cfg, &c), 0);

    /* held requests: node paths locked across steps */
    uint32_t held[4][16];
    ikv_key heldk[4][16];
    size_t held_n[4] = {0};
    uint64_t now = 0;
    for (int step = 0; step < steps; step++) {
        now += 1 + rndn(3);
        ikv_cache_set_time(c, now);
        for (int i = 0; i < O.n; i++) /* mirror ttl expiry */
            if (O.b[i].pinned > 1 && (uint64_t)O.b[i].pinned <= now) O.b[i].pinned = 0;
        int op = (int)rndn(100);
        size_t len = 1 + rndn(12);
        uint32_t toks[16];
        for (size_t i = 0; i < len; i++) toks[i] = (uint32_t)(i < 3 ? rndn(2) : rndn(4));
        ikv_key keys[16];
        chain(toks, len, rndn(3), keys);
        uint64_t next[16];
        for (size_t i = 0; i < len; i++) next[i] = now + 1 + rndn(200);
        ikv_access acc = {.now = now, .next_use = next, .scope = 1 + rndn(5)};
        if (fuzz_hints_from && step >= fuzz_hints_from) {
            acc.hint = (int)rndn(3);
            acc.clock_ms = now * 1000 + rndn(900);
        }
        O.exact = n_tiers == 1;
        if (op < 60) {
            /* a request: match, hit, insert the rest (optionally holding it locked) */
            int hold = op < 20;
            int slot = -1;
            if (hold)
                for (int h = 0; h < 4; h++)
                    if (!held_n[h]) slot = h;
            uint32_t nodes[16];
            uint8_t tiers[16];
            size_t m;
            ikv_cache_match(c, keys, len, nodes, tiers, &m);
            for (size_t i = 0; i < m; i++) {
                int oi = o_find(keys[i]);
                assert_true(oi >= 0);
                assert_int_equal(tiers[i], O.b[oi].tier);
                O.b[oi].last = now;
                O.b[oi].next_use = next[i];
                O.b[oi].hits++;
            }
            if (slot >= 0 && m) {
                assert_int_equal(ikv_cache_lock(c, nodes, m), 0);
                for (size_t i = 0; i < m; i++) O.b[o_find(keys[i])].lock++;
            }
            /* during hit's promotion the core holds the path; the oracle sees the locks */
            O.exact = 0;
            ikv_cache_hit(c, nodes, m, &acc);
            o_compare(c);
            /* Insert block by block, so the oracle knows each block before the core can evict
             * it. The core holds the chain's tail (the parent) and the block in flight. */
            size_t ins = 0;
            for (size_t i = m; i < len && O.n < O_MAX; i++) {
                int parent = i ? o_find(keys[i - 1]) : -1;
                if (i && parent < 0) break; /* the chain's tail was evicted meanwhile */
                oblock *b = &O.b[O.n];
                memset(b, 0, sizeof *b);
                b->key = keys[i];
                b->parent = parent;
                b->tier = 0;
                b->last = now;
                b->next_use = next[i];
                b->ins = ++O.ins_seq;
                O.holds[0] = parent;
                O.holds[1] = O.n++;
                O.exact = n_tiers == 1;
                size_t one = 0;
                int rc = ikv_cache_insert(c, keys, i + 1, i, &acc, slot >= 0, nodes + i, &one);
                O.holds[0] = O.holds[1] = -1;
                if (rc == IKV_EFULL) {
                    assert_int_equal(one, 0);
                    b->tier = -1;
                    break;
                }
                assert_int_equal(rc, 0);
                assert_int_equal(one, 1);
                if (slot >= 0) b->lock++;
                ins++;
            }
            if (slot >= 0 && m + ins > 0) {
                held_n[slot] = m + ins;
                memcpy(held[slot], nodes, (m + ins) * sizeof nodes[0]);
                memcpy(heldk[slot], keys, (m + ins) * sizeof keys[0]);
            }
        } else if (op < 80) {
            /* finish a held request */
            int h = (int)rndn(4);
            if (held_n[h]) {
                assert_int_equal(ikv_cache_unlock(c, held[h], held_n[h]), 0);
                for (size_t i = 0; i < held_n[h]; i++) O.b[o_find(heldk[h][i])].lock--;
                held_n[h] = 0;
            }
        } else if (op < 90) {
            /* pin the resident prefix of a chain, sometimes with a ttl */
            size_t m;
            ikv_cache_match(c, keys, len, NULL, NULL, &m);
            if (m) {
                uint64_t ttl = rndn(2) ? 0 : 5 + rndn(20);
                O.exact = 0;
                int rc = ikv_cache_pin(c, keys, m, ttl);
                assert_true(rc == 0 || rc == IKV_EBUDGET || rc == IKV_EFULL);
                if (rc == 0)
                    for (size_t i = 0; i < m; i++) {
                        oblock *b = &O.b[o_find(keys[i])];
                        /* pinned: 1 = forever, > 1 = expiry time (re-pin replaces) */
                        b->pinned = ttl ? (int)(now + ttl) : 1;
                    }
            }
        } else {
            /* unpin a pinned chain prefix */
            size_t m;
            ikv_cache_match(c, keys, len, NULL, NULL, &m);
            int all = m > 0;
            for (size_t i = 0; i < m; i++) all &= O.b[o_find(keys[i])].pinned != 0;
            int rc = ikv_cache_unpin(c, keys, m);
            if (all) {
                assert_int_equal(rc, 0);
                for (size_t i = 0; i < m; i++) O.b[o_find(keys[i])].pinned = 0;
            } else if (m) {
                assert_int_equal(rc, IKV_ENOENT);
            }
        }
        o_compare(c);
    }
    for (int h = 0; h < 4; h++)
        if (held_n[h]) assert_int_equal(ikv_cache_unlock(c, held[h], held_n[h]), 0);
    CHECKED(c);
    ikv_cache_destroy(c);
}

static void test_fuzz_all_policies(void **st) {
    (void)st;
    for (size_t p = 0; p < ikv_policy_count(); p++)
        for (int tiers = 1; tiers <= 3; tiers++)
            for (uint64_t seed = 1; seed <= 6; seed++)
                fuzz_one(ikv_policy_name(p), tiers, 700, seed * 7919 + (uint64_t)tiers * 31 + p);
    /* the learned options with a model that recomputes often and samples few blocks */
    static const char *const learned[] = {"lhd:period=32,sample=4", "value:hd=3,hdperiod=32,hdsample=4",
                                          "value:hd=1,hdperiod=32", "lrb:period=32,sample=4,order=3",
                                          "lrb:split=0,period=32,sample=4",
                                          /* lrb's races in both classes, decided fast */
                                          "lrb:duel=3,dwin=16,hint=1,period=32,sample=4",
                                          /* the next-use predictor with every rule on */
                                          "value:nu=1,nusess=1,nuk=2,num=0.5,nughost=1",
                                          "value:nu=1,nuk=1,numode=3,nuadapt=0.5"};
    for (size_t i = 0; i < sizeof learned / sizeof learned[0]; i++)
        for (int tiers = 1; tiers <= 3; tiers++)
            for (uint64_t seed = 1; seed <= 4; seed++)
                fuzz_one(learned[i], tiers, 700, seed * 104729 + (uint64_t)tiers * 17 + i);
    /* agent traffic: hazard ranking from the start, and auto switching to it halfway */
    static const char *const hinted[] = {"hazard", "hazard:arc=0", "hazard:h=100", "auto"};
    static const int from[] = {1, 350};
    for (size_t i = 0; i < sizeof hinted / sizeof hinted[0]; i++)
        for (int f = 0; f < 2; f++)
            for (int tiers = 1; tiers <= 3; tiers++)
                for (uint64_t seed = 1; seed <= 3; seed++) {
                    fuzz_hints_from = from[f];
                    fuzz_one(hinted[i], tiers, 700, seed * 15485863 + (uint64_t)tiers * 13 + i);
                }
    fuzz_hints_from = 0;
}

/* One try of ikv_cache_create for tu_alloc_fail_each: a failed create leaves *c NULL. */
typedef struct create_try {
    const ikv_cache_config *cfg;
    ikv_cache *c;
} create_try;

static int try_create(void *ctx) {
    create_try *t = ctx;
    t->c = NULL;
    int rc = ikv_cache_create(t->cfg, &t->c);
    if (rc) assert_null(t->c);
    return rc;
}

/* Allocation failure at every point of create leaves nothing behind (ASan checks leaks). */
static void test_alloc_failure(void **st) {
    (void)st;
    for (size_t p = 0; p < ikv_policy_count(); p++) {
        ikv_cache_config cfg;
        ikv_cache_config_default(&cfg, 64, ikv_policy_name(p));
        cfg.n_tiers = 2;
        cfg.tiers[1].name = "dram";
        cfg.tiers[1].capacity = 64;
        cfg.tiers[1].policy = ikv_policy_name(p);
        cfg.softpin_scopes = 2;
        cfg.softpin_window = 10;
        create_try t = {&cfg, NULL};
        tu_alloc_fail_each(try_create, &t, 64);
        CHECKED(t.c);
        ikv_cache_destroy(t.c);
    }
    /* the first pin allocates the pin list: failing it changes nothing */
    ikv_cache *c = make(16, "lru");
    uint32_t a[2] = {1, 2};
    ikv_key k[2];
    chain(a, 2, 0, k);
    size_t n;
    ikv_cache_insert(c, k, 2, 0, NULL, 0, NULL, &n);
    ikv_alloc_fail_after(0);
    assert_int_equal(ikv_cache_pin(c, k, 2, 0), IKV_ENOMEM);
    ikv_alloc_fail_after(SIZE_MAX);
    ikv_cache_stats s;
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.pinned[0], 0);
    CHECKED(c);
    assert_int_equal(ikv_cache_pin(c, k, 2, 0), 0);
    CHECKED(c);
    ikv_cache_destroy(c);
}

/* hazard's session table entries for capacity c (hazard.c). */
static uint64_t sess_entries(uint64_t c) {
    uint64_t n = 4096;
    while (n < c / 8 && n < (1u << 20)) n *= 2;
    return n;
}

/* Metadata per block: at most 96 bytes (node, bucket, chain link, a heap slot), plus the exact
 * ghost lists of arc (24 bytes a key, c keys) and s3fifo (0.9 c keys), which docs/cache.md
 * states: those two must cost exactly that much more than lru, s3fifo:approx=1 4 bytes a key. */
static void test_bytes_per_block(void **st) {
    (void)st;
    /* a power of two and a capacity just above one (no rounding of the bucket array) */
    static const uint64_t caps[] = {1 << 16, (1 << 16) + 1, 100003};
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        ikv_cache *lru = make(caps[k], "lru");
        double base = ikv_cache_bytes_per_block(lru);
        ikv_cache_destroy(lru);
        for (size_t p = 0; p < ikv_policy_count(); p++) {
            const char *name = ikv_policy_name(p);
            ikv_cache *c = make(caps[k], name);
            double b = ikv_cache_bytes_per_block(c);
            /* value: ARC's exact ghosts and a second heap (T1) of 8 bytes a slot */
            double ghost = !strcmp(name, "value")    ? 24.0 + 8.0
                           : !strcmp(name, "lhd")    ? 24.0 + 8.0 /* and its class data */
                           /* lrb: B1/B2, 16 bytes of data per ghost slot, 16 per node */
                           : !strcmp(name, "lrb")    ? 24.0 + 16.0 + 16.0
                           : !strcmp(name, "arc")    ? 24.0
                           /* hazard: ARC's ghosts and its session table, 32 bytes an entry,
                              the power of two >= c / 8 entries (at least 4096): 4 to 8 bytes
                              a block here */
                           : !strcmp(name, "hazard") ? 24.0 + 32.0 * (double)sess_entries(caps[k]) /
                                                                  (double)caps[k]
                           /* auto: hazard's and lrb's together (lrb:duel=2: 8 a race, 4 a
                              node, 4 a ghost slot more), and its own evictable set, merge
                              buffer and positions (4 + 4 a block, 4 a node) */
                           : !strcmp(name, "auto") ? 24.0 + 32.0 * (double)sess_entries(caps[k]) /
                                                                (double)caps[k] +
                                                         24.0 + 16.0 + 16.0 + 16.0 + 12.0
                           : !strcmp(name, "s3fifo") ? 24.0 * (double)(uint64_t)(0.9 * (double)caps[k]) /
                                                           (double)caps[k]
                                                     : 0.0;
            if (b > 96.0 + ghost)
                fail_msg("policy %s at %" PRIu64 " blocks: %.2f bytes per block > %.2f", name,
                         caps[k], b, 96.0 + ghost);
            /* value's main heap (as gdsf's); lhd's evictable set, 4 bytes a block */
            double heap = !strcmp(name, "value") ? 8.0
                          : !strcmp(name, "lhd") ? 4.0
                          : !strcmp(name, "lrb") ? 8.0 /* two evictable sets */
                          : !strcmp(name, "auto") ? 8.0 /* lrb's */
                                                 : 0.0;
            if (ghost > 0 && fabs(b - base - heap - ghost) > 1e-9)
                fail_msg("policy %s at %" PRIu64 " blocks: ghost costs %.4f bytes per block, "
                         "not %.4f", name, caps[k], b - base - heap, ghost);
            assert_true(b >= 84.0); /* node and bucket at least */
            ikv_cache_destroy(c);
        }
        /* value:hd=1: 8 bytes more per ghost slot (c slots) than value */
        ikv_cache *vh = make(caps[k], "value:hd=1"), *v0 = make(caps[k], "value");
        assert_true(fabs(ikv_cache_bytes_per_block(vh) - ikv_cache_bytes_per_block(v0) - 8.0) < 1e-9);
        ikv_cache_destroy(vh);
        ikv_cache_destroy(v0);
        ikv_cache *a = make(caps[k], "s3fifo:approx=1");
        double b = ikv_cache_bytes_per_block(a);
        assert_true(b - base >= 0.9 * 4 - 0.01 && b - base <= 0.9 * 4 + 8.0 / (double)caps[k] * 4);
        ikv_cache_destroy(a);
    }
}

/* Regression: heap slots hold float keys; opt's next-use times past 2^24 round to equal floats
 * and the tie used to fall to the node id, evicting the nearer use. */
static void test_regress_opt_float_ties(void **st) {
    (void)st;
    ikv_cache *c = make(2, "opt");
    uint32_t a = 1, b = 2, d = 3;
    ikv_key ka, kb, kd;
    chain(&a, 1, 0, &ka);
    chain(&b, 1, 0, &kb);
    chain(&d, 1, 0, &kd);
    uint64_t na = 100000001, nb = 100000003, nd = IKV_NEVER;
    ikv_access acc = {.now = 1, .next_use = &na};
    ikv_access_result r;
    ikv_cache_access(c, &ka, 1, &acc, &r);
    acc.now = 2;
    acc.next_use = &nb;
    ikv_cache_access(c, &kb, 1, &acc, &r);
    acc.now = 3;
    acc.next_use = &nd;
    ikv_cache_access(c, &kd, 1, &acc, &r);
    CHECKED(c);
    size_t m;
    ikv_cache_match(c, &ka, 1, NULL, NULL, &m);
    assert_int_equal(m, 1); /* a is used next, at 100000001: kept */
    ikv_cache_match(c, &kb, 1, NULL, NULL, &m);
    assert_int_equal(m, 0); /* b's next use is farther: evicted */
    ikv_cache_destroy(c);
}

/* Regression: unlock used to count repeated ids in O(n^2) and skipped the repeat check past 64
 * blocks. Now a long path with a bad id at its end changes nothing, and repeats count twice. */
static void test_regress_unlock_long_path(void **st) {
    (void)st;
    enum { N = 300 };
    ikv_cache *c = make(N + 10, "lru");
    uint32_t toks[N], nodes[N + 1];
    ikv_key k[N];
    for (int i = 0; i < N; i++) toks[i] = (uint32_t)i;
    chain(toks, N, 0, k);
    size_t n;
    assert_int_equal(ikv_cache_insert(c, k, N, 0, NULL, 1, nodes, &n), 0);
    assert_int_equal(n, N);
    nodes[N] = nodes[0]; /* nodes[0] twice: its single lock cannot be released twice */
    assert_int_equal(ikv_cache_unlock(c, nodes, N + 1), IKV_ENOTLOCKED);
    ikv_cache_stats s;
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.locked, N);
    assert_int_equal(s.evictable[0], 0);
    CHECKED(c);
    assert_int_equal(ikv_cache_unlock(c, nodes, N), 0);
    ikv_cache_stats_get(c, &s);
    assert_int_equal(s.locked, 0);
    assert_int_equal(s.evictable[0], 1);
    CHECKED(c);
    ikv_cache_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_insert),
        cmocka_unit_test(test_evict_one),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_locks),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_policy_offline),
        cmocka_unit_test(test_scopes),
        cmocka_unit_test(test_pins),
        cmocka_unit_test(test_softpin),
        cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_fuzz_all_policies),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_bytes_per_block),
        cmocka_unit_test(test_hash_tag_collisions),
        cmocka_unit_test(test_regress_opt_float_ties),
        cmocka_unit_test(test_regress_unlock_long_path),
        cmocka_unit_test(test_fifo_order),
        cmocka_unit_test(test_lfu_order),
        cmocka_unit_test(test_gdsf_cost),
        cmocka_unit_test(test_value_predicted_reuse),
        cmocka_unit_test(test_value_unproven_and_inherited),
        cmocka_unit_test(test_value_cost),
        cmocka_unit_test(test_value_fork),
        cmocka_unit_test(test_value_horizon),
        cmocka_unit_test(test_sieve_visited),
        cmocka_unit_test(test_s3fifo_small_and_ghost),
        cmocka_unit_test(test_value_ghost_feedback),
        cmocka_unit_test(test_value_split_is_arc),
        cmocka_unit_test(test_value_split_scan),
        cmocka_unit_test(test_value_t1key),
        cmocka_unit_test(test_sketch_counts_and_aging),
        cmocka_unit_test(test_value_tlfu),
        cmocka_unit_test(test_arc_adapts),
        cmocka_unit_test(test_value_mix_regret),
        cmocka_unit_test(test_value_mix_deterministic),
        cmocka_unit_test(test_lhd_learns_hot_blocks),
        cmocka_unit_test(test_lrb_learns_periodic),
        cmocka_unit_test(test_hd_model),
        cmocka_unit_test(test_value_hd),
        cmocka_unit_test(test_value_pred),
        cmocka_unit_test(test_nextuse_fuzz),
        cmocka_unit_test(test_value_nu_overdue),
        cmocka_unit_test(test_value_nu_session),
        cmocka_unit_test(test_value_nu),
        cmocka_unit_test(test_value_hint),
        cmocka_unit_test(test_value_hint_either_class),
        cmocka_unit_test(test_policy_params),
        cmocka_unit_test(test_golden_mooncake),
        cmocka_unit_test(test_value_oracle),
        cmocka_unit_test(test_value_oracle7),
        cmocka_unit_test(test_hazard),
        cmocka_unit_test(test_hazard_without_hints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
