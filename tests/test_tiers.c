/*
 * Tests for the engine's lower tiers (src/model/tiers.c) on the bundled real model
 * (data/models/stories260K): a KV pool too small for two prompts with a mem or file tier
 * below it, so the second visit of a prompt loads its blocks from the tier, with logits, K/V
 * and greedy tokens bit-identical to a no-cache run; both outcomes of load-vs-recompute (the
 * tier's speed estimate forced), counted; two processes sharing a file tier (the second reuses
 * what the first wrote); a flipped byte in a stored payload detected, counted and recomputed;
 * tenant scopes in the stores; Redis as a shared tier across two processes, killed in the
 * middle of a run of requests (every request succeeds, misses counted) and restarted (used
 * again); a three-master Redis Cluster tier.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isokv/model.h"
#include "isokv/store.h"
#include "model/internal.h"
#include "engine_testutil.h"
#include "redis_helper.h"
#include "testutil.h"

static char tmpdir[256];
static ikv_model *M;

static const char *tmp_path(const char *name) {
    return tu_path(tmpdir, name);
}

static int setup_all(void **st) {
    (void)st;
    if (tu_tmpdir(tmpdir, sizeof tmpdir, "tiers")) return -1;
    const char *src = getenv("IKV_SOURCE_DIR");
    char path[600];
    snprintf(path, sizeof path, "%s/data/models/stories260K/stories260K.bin", src ? src : ".");
    return ikv_model_load(path, &M) ? -1 : 0;
}

static int teardown_all(void **st) {
    (void)st;
    rh_kill_all();
    ikv_model_destroy(M);
    return tu_rmtree(tmpdir);
}

static int teardown_redis(void **st) {
    (void)st;
    rh_kill_all();
    return 0;
}

static void make_prompt(uint32_t *t, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 7;
    t[0] = 1;
    for (size_t i = 1; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t[i] = 3 + (uint32_t)(x % 500);
    }
}

#define DEC 8
typedef struct out {
    float *logits; /* [n + DEC][V] */
    uint32_t gen[DEC];
    ikv_prefill_info info;
} out;

/* The lower-tier hits recomputed, by tier and why, add up to recomputed_tier_tokens (none for
 * the pool, index 0). */
static void check_recomputed_by_why(const ikv_prefill_info *i) {
    size_t sum = 0;
    assert_int_equal(i->tier_cheaper_tokens[0] + i->tier_failed_tokens[0] +
                         i->tier_noroom_tokens[0] + i->tier_dropped_tokens[0],
                     0);
    for (size_t t = 1; t < IKV_MAX_TIERS; t++)
        sum += i->tier_cheaper_tokens[t] + i->tier_failed_tokens[t] + i->tier_noroom_tokens[t] +
               i->tier_dropped_tokens[t];
    assert_int_equal(sum, i->recomputed_tier_tokens);
}

/* Runs a request (prefill, DEC greedy decode steps); the engine must stay consistent. */
static void run(ikv_engine *e, const uint32_t *t, size_t n, const char *tenant, size_t pub,
                int no_cache, out *o) {
    int V = M->cfg.vocab_size;
    o->logits = calloc((n + DEC) * (size_t)V, 4);
    ikv_request rq = {.tokens = t,
                      .n = n,
                      .tenant = tenant,
                      .public_tokens = pub,
                      .no_cache = no_cache,
                      .logits_all = o->logits};
    ikv_seq *s;
    assert_int_equal(ikv_engine_begin(e, &rq, &s, &o->info), 0);
    check_recomputed_by_why(&o->info);
    assert_true(ikv_engine_check(e));
    assert_true(ikv_cache_check(ikv_engine_cache(e)));
    uint32_t next = tu_argmax(ikv_seq_logits(s), V);
    for (int d = 0; d < DEC; d++) {
        const float *lg;
        o->gen[d] = next;
        assert_int_equal(ikv_engine_decode(e, s, next, &lg), 0);
        memcpy(o->logits + (n + (size_t)d) * (size_t)V, lg, sizeof(float) * (size_t)V);
        next = tu_argmax(lg, V);
    }
    ikv_engine_end(e, s);
    assert_true(ikv_engine_check(e));
}

/* Bit-identical from position `from` on (the computed prompt rows), decode rows and tokens. */
static void same(const out *a, const out *b, size_t n, size_t from) {
    size_t V = (size_t)M->cfg.vocab_size;
    assert_memory_equal(a->logits + from * V, b->logits + from * V, (n + DEC - from) * V * 4);
    assert_memory_equal(a->gen, b->gen, sizeof a->gen);
}

static void freeo(out *o) {
    free(o->logits);
}

/* Options of an engine whose cache holds `cap` blocks of 16 tokens, with the given stores. */
static ikv_engine_options opts(uint64_t cap, ikv_store **st, size_t n) {
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    uint64_t bb = ikv_model_kv_bytes_per_token(&M->cfg) * 16;
    uint32_t maxb = (uint32_t)((M->cfg.seq_len + 15) / 16);
    o.kv_mem = (maxb + cap) * bb;
    for (size_t i = 0; i < n; i++)
        o.tiers[i] = st[i];
    o.n_tiers = n;
    return o;
}

static ikv_store *open_store(const char *spec) {
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    ikv_store_params p;
    ikv_engine_store_params(M, &o, &p);
    ikv_store *s = NULL;
    if (ikv_store_open(spec, &p, &s)) fprintf(stderr, "open %s: %s\n", spec, ikv_errdetail());
    assert_non_null(s);
    return s;
}

/* A and B (100 tokens, 6 full blocks each) through a cache of 8 blocks: B pushes 4 of A's
 * blocks into the tier; A again loads them, and equals the no-cache run bit for bit. */
static void two_prompts(ikv_store *st) {
    ikv_engine_options o = opts(8, &st, 1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    /* the decision itself is test_load_or_recompute's: here loading must win */
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    uint32_t a[100], b[100];
    make_prompt(a, 100, 1), make_prompt(b, 100, 2);
    out ref, o1, o2, o3;
    run(e, a, 100, NULL, 0, 1, &ref);
    run(e, a, 100, NULL, 0, 0, &o1);
    assert_int_equal(o1.info.inserted_blocks, 6);
    run(e, b, 100, NULL, 0, 0, &o2);
    ikv_cache_stats cs;
    ikv_cache_stats_get(ikv_engine_cache(e), &cs);
    assert_int_equal(cs.resident[0], 8);
    assert_int_equal(cs.resident[1], 4);
    run(e, a, 100, NULL, 0, 0, &o3);
    assert_int_equal(o3.info.cached_tokens, 96);
    assert_int_equal(o3.info.tier_tokens[0], 32); /* only leaves are demoted: A's last four */
    assert_int_equal(o3.info.tier_tokens[1], 64);
    same(&o3, &ref, 100, 96);
    ikv_engine_tier_stats ts;
    assert_int_equal(ikv_engine_tier_stats_get(e, 1, &ts), 0);
    assert_int_equal(ts.loaded_blocks, 4);
    assert_true(ts.demoted_blocks >= 4);
    assert_true(ts.load_s_per_block > 0);
    assert_int_equal(ikv_engine_tier_stats_get(e, 2, &ts), IKV_ERANGE);
    freeo(&ref), freeo(&o1), freeo(&o2), freeo(&o3);
    ikv_engine_destroy(e);
}

static void test_mem_tier(void **st) {
    (void)st;
    ikv_store *s = open_store("mem:4M");
    two_prompts(s);
    ikv_store_close(s);
}

static void test_file_tier(void **st) {
    (void)st;
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s:4M", tmp_path("t1.store"));
    ikv_store *s = open_store(spec);
    two_prompts(s);
    ikv_store_close(s);
}

/* Load or recompute, decided from the speeds measured: a tier made to look very slow is not
 * loaded from (recomputed, counted), a fast one is; the output is the same either way. */
static void test_load_or_recompute(void **st) {
    (void)st;
    ikv_store *s = open_store("mem:4M");
    ikv_engine_options o = opts(8, &s, 1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    assert_true(ikv_engine_prefill_estimate(e, 0, 64) > 0); /* the probe at create */
    uint32_t a[100], b[100];
    make_prompt(a, 100, 3), make_prompt(b, 100, 4);
    out ref, x, y;
    run(e, a, 100, NULL, 0, 1, &ref);
    run(e, a, 100, NULL, 0, 0, &x), freeo(&x);
    run(e, b, 100, NULL, 0, 0, &x), freeo(&x);
    ikv__tiers_pin_load_s(e, 1, 1e3); /* 1000 s a block: recompute */
    run(e, a, 100, NULL, 0, 0, &x);
    assert_int_equal(x.info.tier_tokens[1], 0);
    assert_int_equal(x.info.recomputed_tier_tokens, 64);
    assert_int_equal(x.info.tier_cheaper_tokens[1], 64); /* why: the estimate, nothing failed */
    assert_int_equal(x.info.tier_failed_tokens[1] + x.info.tier_noroom_tokens[1] +
                         x.info.tier_dropped_tokens[1],
                     0);
    assert_int_equal(x.info.computed_tokens, 68); /* A's first two blocks are in the pool */
    same(&x, &ref, 100, 32);
    ikv_engine_tier_stats ts;
    ikv_engine_tier_stats_get(e, 1, &ts);
    assert_int_equal(ts.recomputed_blocks, 4);
    assert_int_equal(ts.loaded_blocks, 0);
    assert_int_equal(ts.failed_blocks + ts.recomputed_failed_blocks + ts.recomputed_noroom_blocks +
                         ts.recomputed_dropped_blocks,
                     0);
    /* recomputed blocks went back to the pool; B's now in the tier; a fast tier is loaded */
    run(e, b, 100, NULL, 0, 0, &y), freeo(&y);
    run(e, a, 100, NULL, 0, 0, &y), freeo(&y); /* pushes B down */
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    run(e, b, 100, NULL, 0, 0, &y);
    assert_true(y.info.tier_tokens[1] > 0);
    ikv_engine_tier_stats_get(e, 1, &ts);
    assert_true(ts.loaded_blocks > 0);
    freeo(&ref), freeo(&x), freeo(&y);
    ikv_engine_destroy(e);
    ikv_store_close(s);
}

/* With the speeds this machine measures: whichever way it goes, both outcomes add up and the
 * output is the same. */
static void test_measured_decision(void **st) {
    (void)st;
    ikv_store *s = open_store("mem:4M");
    ikv_engine_options o = opts(8, &s, 1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    uint32_t a[100], b[100];
    make_prompt(a, 100, 5), make_prompt(b, 100, 6);
    out ref, x;
    run(e, a, 100, NULL, 0, 1, &ref);
    run(e, a, 100, NULL, 0, 0, &x), freeo(&x);
    run(e, b, 100, NULL, 0, 0, &x), freeo(&x);
    run(e, a, 100, NULL, 0, 0, &x);
    ikv_engine_tier_stats ts;
    ikv_engine_tier_stats_get(e, 1, &ts);
    assert_int_equal(ts.loaded_blocks + ts.recomputed_blocks, 4);
    assert_int_equal(x.info.tier_tokens[1], 16 * ts.loaded_blocks);
    assert_int_equal(x.info.cached_tokens + x.info.computed_tokens, 100);
    same(&x, &ref, 100, x.info.cached_tokens);
    freeo(&ref), freeo(&x);
    ikv_engine_destroy(e);
    ikv_store_close(s);
}

/* A pool too small for the prompt itself (2 cacheable blocks, 12 full blocks): the blocks it
 * had no room for go to the file tier, the second request loads them as private blocks. */
static void test_pool_smaller_than_prompt(void **st) {
    (void)st;
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s:4M", tmp_path("small.store"));
    ikv_store *s = open_store(spec);
    ikv_engine_options o = opts(2, &s, 1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    uint32_t a[200];
    make_prompt(a, 200, 12);
    out ref, x;
    run(e, a, 200, NULL, 0, 1, &ref);
    run(e, a, 200, NULL, 0, 0, &x);
    assert_int_equal(x.info.inserted_blocks, 2);
    freeo(&x);
    run(e, a, 200, NULL, 0, 0, &x);
    assert_int_equal(x.info.tier_tokens[0], 32);
    assert_int_equal(x.info.tier_tokens[1], 160);
    assert_int_equal(x.info.cached_tokens, 192);
    same(&x, &ref, 200, 192);
    freeo(&x), freeo(&ref);
    ikv_engine_destroy(e);
    ikv_store_close(s);
}

/* --tier-dtype q8: blocks about 2.7x smaller on stories260K (head_dim 8; 3.8x at head_dim 64),
 * hits from the tier reported as lossy, logits close to fp32 (not equal), and an fp32 engine
 * never takes a q8 block (the fingerprint carries the dtype). */
static void test_q8_tier(void **st) {
    (void)st;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    ikv_store_params p32, p8;
    ikv_engine_store_params(M, &o, &p32);
    o.tier_dtype = IKV_BLOB_DTYPE_Q8;
    ikv_engine_store_params(M, &o, &p8);
    assert_true(p8.slot_bytes * 5 < p32.slot_bytes * 2);
    assert_true(p8.fingerprint != p32.fingerprint);
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s:4M", tmp_path("q8.store"));
    ikv_store *s = NULL;
    assert_int_equal(ikv_store_open(spec, &p8, &s), 0);
    o = opts(2, &s, 1);
    o.tier_dtype = IKV_BLOB_DTYPE_Q8;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    uint32_t a[200];
    make_prompt(a, 200, 13);
    out ref, x;
    run(e, a, 200, NULL, 0, 1, &ref);
    run(e, a, 200, NULL, 0, 0, &x);
    assert_int_equal(x.info.lossy_tokens, 0);
    freeo(&x);
    run(e, a, 200, NULL, 0, 0, &x);
    assert_int_equal(x.info.tier_tokens[1], 160);
    assert_int_equal(x.info.lossy_tokens, 160);
    /* close, not equal: max abs logit difference small against the logits' spread */
    size_t V = (size_t)M->cfg.vocab_size;
    double maxd = 0, spread = 0;
    for (size_t i = 192 * V; i < 200 * V; i++) {
        double d = fabs((double)x.logits[i] - ref.logits[i]);
        maxd = d > maxd ? d : maxd;
        spread = fabs(ref.logits[i]) > spread ? fabs(ref.logits[i]) : spread;
    }
    assert_true(maxd > 0);
    assert_true(maxd < 0.1 * spread);
    freeo(&x);
    ikv_engine_destroy(e);
    ikv_store_close(s);
    /* an fp32 engine cannot even open that file (other slot size); over Redis-like shared
     * names it would find nothing: the fingerprint differs */
    assert_int_equal(ikv_store_open(spec, &p32, &s), IKV_EIO);
    freeo(&ref);
}

/* One try of ikv_engine_create for tu_alloc_fail_each: a failed create leaves *e NULL. */
typedef struct engine_try {
    const ikv_engine_options *o;
    ikv_engine *e;
} engine_try;

static int try_engine(void *ctx) {
    engine_try *t = ctx;
    t->e = NULL;
    int rc = ikv_engine_create(M, t->o, &t->e);
    if (rc) assert_null(t->e);
    return rc;
}

/* Every allocation failing in turn while creating an engine with a tier: a clean IKV_ENOMEM,
 * nothing left behind (ASan's leak check), and an engine that works once it succeeds. */
static void test_alloc_failure(void **st) {
    (void)st;
    ikv_store *s = open_store("mem:1M");
    ikv_engine_options o = opts(8, &s, 1);
    engine_try t = {&o, NULL};
    tu_alloc_fail_each(try_engine, &t, 400);
    uint32_t a[40];
    make_prompt(a, 40, 14);
    out x;
    run(t.e, a, 40, NULL, 0, 0, &x);
    freeo(&x);
    ikv_engine_destroy(t.e);
    ikv_store_close(s);
}

/* Two sequences in flight at once (max_seqs 2), both loading from the tier: the pool's
 * reserve covers the blocks loaded before the core takes them; outputs stay exact. */
static void test_two_sequences(void **st) {
    (void)st;
    ikv_store *s = open_store("mem:4M");
    ikv_engine_options o = opts(6, &s, 1);
    uint64_t bb = ikv_model_kv_bytes_per_token(&M->cfg) * 16;
    o.max_seqs = 2;
    o.kv_mem += 32 * bb; /* a second sequence's private reserve */
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    uint32_t a[100], b[100], c[100];
    make_prompt(a, 100, 15), make_prompt(b, 100, 16), make_prompt(c, 100, 17);
    out ra, rb, x;
    run(e, a, 100, NULL, 0, 1, &ra);
    run(e, b, 100, NULL, 0, 1, &rb);
    run(e, a, 100, NULL, 0, 0, &x), freeo(&x);
    run(e, b, 100, NULL, 0, 0, &x), freeo(&x);
    run(e, c, 100, NULL, 0, 0, &x), freeo(&x); /* a and b are mostly in the tier now */
    size_t V = (size_t)M->cfg.vocab_size;
    float *la = calloc(100 * V, 4), *lb = calloc(100 * V, 4);
    ikv_request qa = {.tokens = a, .n = 100, .logits_all = la};
    ikv_request qb = {.tokens = b, .n = 100, .logits_all = lb};
    ikv_seq *sa, *sb;
    ikv_prefill_info ia, ib;
    assert_int_equal(ikv_engine_begin(e, &qa, &sa, &ia), 0);
    assert_true(ikv_engine_check(e));
    assert_int_equal(ikv_engine_begin(e, &qb, &sb, &ib), 0);
    assert_true(ikv_engine_check(e));
    assert_true(ia.tier_tokens[1] + ib.tier_tokens[1] > 0);
    assert_memory_equal(la + ia.cached_tokens * V, ra.logits + ia.cached_tokens * V,
                        (100 - ia.cached_tokens) * V * 4);
    assert_memory_equal(lb + ib.cached_tokens * V, rb.logits + ib.cached_tokens * V,
                        (100 - ib.cached_tokens) * V * 4);
    ikv_engine_end(e, sa);
    ikv_engine_end(e, sb);
    assert_true(ikv_engine_check(e));
    free(la), free(lb), freeo(&ra), freeo(&rb);
    ikv_engine_destroy(e);
    ikv_store_close(s);
}

/* Writes prompt t through an engine with a file tier in a child process that then exits. */
static void child_writes(const char *spec, const uint32_t *t, size_t n, const char *tenant,
                         uint64_t cap) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ikv_store *s = NULL;
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        ikv_store_params p;
        ikv_engine_store_params(M, &o, &p);
        if (ikv_store_open(spec, &p, &s)) _exit(2);
        o = opts(cap, &s, 1);
        ikv_engine *e;
        if (ikv_engine_create(M, &o, &e)) _exit(3);
        ikv_request rq = {.tokens = t, .n = n, .tenant = tenant};
        ikv_seq *q;
        ikv_prefill_info inf;
        if (ikv_engine_begin(e, &rq, &q, &inf)) _exit(4);
        ikv_engine_end(e, q);
        ikv_engine_destroy(e);
        ikv_store_close(s);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Two processes: the first writes A's blocks to a file tier and exits; the second, with an
 * index that never saw them, probes the file, loads them, and equals the no-cache run. Then a
 * flipped payload byte: detected, counted, recomputed, same output. */
static void test_two_processes_file(void **st) {
    (void)st;
    char spec[600];
    const char *path = tmp_path("shared.store");
    snprintf(spec, sizeof spec, "file:%s:4M", path);
    uint32_t a[100];
    make_prompt(a, 100, 7);
    child_writes(spec, a, 100, "alice", 8);
    ikv_store *s = open_store(spec);
    ikv_store_stats ss;
    ikv_store_stats_get(s, &ss);
    assert_int_equal(ss.recovered, 6); /* written through when computed */
    ikv_engine_options o = opts(8, &s, 1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    out ref, x, y;
    run(e, a, 100, "alice", 0, 1, &ref);
    /* tenant bob never loads alice's blocks, from any tier */
    run(e, a, 100, "bob", 0, 0, &y);
    assert_int_equal(y.info.cached_tokens, 0);
    assert_int_equal(y.info.tier_tokens[1], 0);
    same(&y, &ref, 100, 0);
    freeo(&y);
    run(e, a, 100, "alice", 0, 0, &x);
    assert_int_equal(x.info.tier_tokens[1], 96);
    assert_int_equal(x.info.cached_tokens, 96);
    same(&x, &ref, 100, 96);
    ikv_engine_tier_stats ts;
    ikv_engine_tier_stats_get(e, 1, &ts);
    assert_int_equal(ts.probed_blocks, 6);
    assert_int_equal(ts.loaded_blocks, 6);
    freeo(&x);
    ikv_engine_destroy(e);
    ikv_store_close(s);

    /* flip one payload byte of every slot in the file, then a fresh process-like engine */
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t sb[4096];
    assert_int_equal(pread(fd, sb, sizeof sb, 0), 4096);
    uint64_t nslots = 0, data_off = 0, slot = 0;
    for (int i = 7; i >= 0; i--)
        nslots = nslots << 8 | sb[24 + i];
    for (int i = 7; i >= 0; i--)
        data_off = data_off << 8 | sb[32 + i];
    for (int i = 7; i >= 0; i--)
        slot = slot << 8 | sb[16 + i];
    size_t flipped = 0;
    for (uint64_t k = 0; k < nslots; k++) {
        uint8_t h[4];
        assert_int_equal(pread(fd, h, 4, (off_t)(4096 + k * 64)), 4);
        if (memcmp(h, "IKVB", 4)) continue;
        uint8_t c;
        off_t off = (off_t)(data_off + k * (slot - 64) + 16 * 4 + 777);
        assert_int_equal(pread(fd, &c, 1, off), 1);
        c ^= 0x40;
        assert_int_equal(pwrite(fd, &c, 1, off), 1);
        flipped++;
    }
    close(fd);
    assert_true(flipped >= 6);
    s = open_store(spec); /* reopening drops them... */
    ikv_store_stats_get(s, &ss);
    assert_int_equal(ss.recovered, 0);
    ikv_store_close(s);
    /* ...so flip them while open instead: write, flip under the open store, read */
    s = open_store(spec);
    o = opts(8, &s, 1);
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    run(e, a, 100, "alice", 0, 0, &x); /* computes, writes through */
    freeo(&x);
    ikv_engine_destroy(e);
    fd = open(path, O_RDWR);
    for (uint64_t k = 0; k < nslots; k++) {
        uint8_t h[4];
        assert_int_equal(pread(fd, h, 4, (off_t)(4096 + k * 64)), 4);
        if (memcmp(h, "IKVB", 4)) continue;
        uint8_t c;
        off_t off = (off_t)(data_off + k * (slot - 64) + 16 * 4 + 777);
        assert_int_equal(pread(fd, &c, 1, off), 1);
        c ^= 0x40;
        assert_int_equal(pwrite(fd, &c, 1, off), 1);
    }
    close(fd);
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    run(e, a, 100, "alice", 0, 0, &x);
    assert_int_equal(x.info.cached_tokens, 0);
    same(&x, &ref, 100, 0);
    ikv_engine_tier_stats_get(e, 1, &ts);
    assert_int_equal(ts.store.corrupt, 6); /* every block of the run is verified */
    assert_int_equal(ts.failed_blocks, 1);
    /* the failed load and the five after it are recomputed because of it, not as cheaper */
    assert_int_equal(x.info.recomputed_tier_tokens, 96);
    assert_int_equal(x.info.tier_failed_tokens[1], 96);
    assert_int_equal(ts.recomputed_failed_blocks, 6);
    assert_int_equal(ts.recomputed_blocks + ts.recomputed_noroom_blocks, 0);
    freeo(&x), freeo(&ref);
    ikv_engine_destroy(e);
    ikv_store_close(s);
}

/* Redis shared by two processes; then killed in the middle of a run of requests and
 * restarted. */
static void test_redis_tier(void **st) {
    (void)st;
    int port = rh_free_port();
    assert_true(rh_start(0, port, NULL) > 0);
    char spec[128];
    snprintf(spec, sizeof spec, "redis://127.0.0.1:%d:64M", port);
    uint32_t a[100], b[100];
    make_prompt(a, 100, 8), make_prompt(b, 100, 9);
    child_writes(spec, a, 100, NULL, 8);
    ikv_store *s = open_store(spec);
    ikv_engine_options o = opts(8, &s, 1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    out refa, refb, x;
    run(e, a, 100, NULL, 0, 1, &refa);
    run(e, b, 100, NULL, 0, 1, &refb);
    run(e, a, 100, NULL, 0, 0, &x);
    assert_int_equal(x.info.tier_tokens[1], 96); /* written by the other process */
    same(&x, &refa, 100, 96);
    freeo(&x);
    /* a flipped byte in every stored value: detected, counted, recomputed, same output */
    redisReply *keys = rh_cmd(port, "KEYS ikv:*");
    assert_non_null(keys);
    assert_true(keys->elements >= 6);
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *r =
            rh_cmd(port, "SETRANGE %s 5000 %b", keys->element[i]->str, "\x7f", (size_t)1);
        assert_non_null(r);
        freeReplyObject(r);
    }
    freeReplyObject(keys);
    {
        ikv_engine *e2;
        assert_int_equal(ikv_engine_create(M, &o, &e2), 0);
        ikv__tiers_pin_load_s(e2, 1, 1e-12);
        run(e2, a, 100, NULL, 0, 0, &x);
        assert_int_equal(x.info.cached_tokens, 0);
        same(&x, &refa, 100, 0);
        freeo(&x);
        ikv_engine_tier_stats ts2;
        ikv_engine_tier_stats_get(e2, 1, &ts2);
        assert_int_equal(ts2.failed_blocks, 1);
        assert_true(ts2.store.corrupt >= 1);
        ikv_engine_destroy(e2);
    }
    /* a run of requests with Redis killed in the middle */
    rh_stop(0);
    for (int i = 0; i < 6; i++) {
        const uint32_t *t = i % 2 ? a : b;
        run(e, t, 100, NULL, 0, 0, &x);
        same(&x, i % 2 ? &refa : &refb, 100, x.info.cached_tokens);
        freeo(&x);
    }
    ikv_engine_tier_stats ts;
    ikv_engine_tier_stats_get(e, 1, &ts);
    assert_true(ts.store.down > 0);
    /* restarted (empty): the tier is used again once the backoff passes */
    assert_true(rh_start(0, port, NULL) > 0);
    int used = 0;
    for (int i = 0; i < 60 && !used; i++) {
        run(e, i % 2 ? a : b, 100, NULL, 0, 0, &x);
        freeo(&x);
        ikv_engine_tier_stats_get(e, 1, &ts);
        used = ts.store.reconnects > 0 && ts.store.puts > 0;
        if (!used) rh_sleep(0.1);
    }
    assert_true(used);
    /* what this engine writes now, another process finds */
    uint64_t before = ts.store.puts;
    uint32_t c[100];
    make_prompt(c, 100, 10);
    run(e, c, 100, NULL, 0, 0, &x);
    freeo(&x);
    ikv_engine_tier_stats_get(e, 1, &ts);
    assert_true(ts.store.puts >= before + 6);
    freeo(&refa), freeo(&refb);
    ikv_engine_destroy(e);
    ikv_store_close(s);
    rh_stop(0);
}

/* A three-master cluster as the shared tier: blocks load back across nodes. */
static void test_cluster_tier(void **st) {
    (void)st;
    int ports[3];
    assert_true(rh_cluster(tmp_path("cl"), ports));
    char spec[256];
    snprintf(spec, sizeof spec, "redis-cluster://127.0.0.1:%d:64M", ports[0]);
    uint32_t a[300];
    make_prompt(a, 300, 11);
    child_writes(spec, a, 300, NULL, 32);
    for (int i = 0; i < 3; i++) {
        redisReply *r = rh_cmd(ports[i], "DBSIZE");
        assert_non_null(r);
        assert_true(r->integer > 0); /* 18 blocks over three masters */
        freeReplyObject(r);
    }
    ikv_store *s = open_store(spec);
    ikv_engine_options o = opts(32, &s, 1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    out ref, x;
    run(e, a, 300, NULL, 0, 1, &ref);
    run(e, a, 300, NULL, 0, 0, &x);
    assert_int_equal(x.info.tier_tokens[1], 288);
    same(&x, &ref, 300, 288);
    freeo(&x);
    /* a master killed: no request fails, the blocks still on the others load, same output */
    rh_stop(3);
    ikv_engine_destroy(e);
    assert_int_equal(ikv_engine_create(M, &o, &e), 0);
    ikv__tiers_pin_load_s(e, 1, 1e-12);
    run(e, a, 300, NULL, 0, 0, &x);
    same(&x, &ref, 300, x.info.cached_tokens);
    assert_true(x.info.cached_tokens < 288);
    freeo(&x), freeo(&ref);
    ikv_engine_destroy(e);
    ikv_store_close(s);
}

/* Runs isokv (IKV_BIN) with argv, stdout and stderr to files; returns the exit status. */
static int run_cli(const char *const *args, const char *outp, const char *errp) {
    return tu_run_isokv(args, outp, errp, 120);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

/* isokv run twice (two processes) over one file tier: the same text, and the second run's
 * prompt comes from the tier. Bad --tier values exit 2 (malformed) or 1 (unwritable). */
static void test_cli_two_runs(void **st) {
    (void)st;
    const char *src = getenv("IKV_SOURCE_DIR");
    char model[600], tok[600], spec[600];
    snprintf(model, sizeof model, "%s/data/models/stories260K/stories260K.bin", src ? src : ".");
    snprintf(tok, sizeof tok, "%s/data/models/stories260K/tok512.bin", src ? src : ".");
    snprintf(spec, sizeof spec, "file:%s:8M", tmp_path("cli.store"));
    const char *args[] = {"run",
                          "--model",
                          model,
                          "--tokenizer",
                          tok,
                          "--prompt",
                          "Once upon a time, there was a little girl named Lily. She loved to "
                          "play outside in the park.",
                          "-n",
                          "30",
                          "--tier",
                          spec,
                          NULL};
    const char *o1 = tmp_path("o1"), *e1 = tmp_path("e1");
    assert_int_equal(run_cli(args, o1, e1), 0);
    char *t1 = slurp(o1);
    const char *o2 = tmp_path("o2"), *e2 = tmp_path("e2");
    assert_int_equal(run_cli(args, o2, e2), 0);
    char *t2 = slurp(o2), *err2 = slurp(e2);
    assert_string_equal(t1, t2);
    assert_true(strlen(t1) > 40);
    char want[700];
    snprintf(want, sizeof want, "%s 16", spec); /* 16 cached tokens from the file tier */
    assert_non_null(strstr(err2, want));
    assert_non_null(strstr(err2, "16 from the cache"));
    free(t1), free(t2), free(err2);
    /* bench engine --tier: the request whose prefix was pushed down takes it from the tier */
    const char *bench[] = {"bench",    "engine", "--config", "tiny",    "--prefix",  "128",
                           "--suffix", "16",     "--decode", "2",       "--threads", "1",
                           "--repeat", "1",      "--tier",   "mem:16M", "--json",    NULL};
    assert_int_equal(run_cli(bench, o1, e1), 0);
    char *js = slurp(o1);
    const char *k = strstr(js, "\"tier_loaded_tokens\": ");
    assert_non_null(k);
    assert_true(atoi(k + strlen("\"tier_loaded_tokens\": ")) > 0);
    free(js);
    const char *bad[] = {"run", "--model", model, "--prompt", "hi", "--tier", "nvme:1G", NULL};
    assert_int_equal(run_cli(bad, o1, e1), 2);
    char *e = slurp(e1);
    assert_non_null(strstr(e, "unknown scheme"));
    free(e);
    const char *bad2[] = {
        "run", "--model", model, "--prompt", "hi", "--tier", "file:/nonexistent-dir/x.store:1M",
        NULL};
    assert_int_equal(run_cli(bad2, o1, e1), 1);
    e = slurp(e1);
    assert_non_null(strstr(e, "cannot open"));
    free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mem_tier),
        cmocka_unit_test(test_file_tier),
        cmocka_unit_test(test_load_or_recompute),
        cmocka_unit_test(test_measured_decision),
        cmocka_unit_test(test_pool_smaller_than_prompt),
        cmocka_unit_test(test_q8_tier),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_two_sequences),
        cmocka_unit_test(test_two_processes_file),
        cmocka_unit_test(test_cli_two_runs),
        cmocka_unit_test_teardown(test_redis_tier, teardown_redis),
        cmocka_unit_test_teardown(test_cluster_tier, teardown_redis),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
