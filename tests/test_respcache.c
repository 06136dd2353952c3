/*
 * Tests for respcache/: the response cache and generation with drafts.
 *   - similarity: lookup's scores are the exact Jaccard of the 3-gram sets (checked against a
 *     brute-force oracle over sets of token triples), an identical prompt is the first
 *     candidate with similarity 1, the floor and the count bound hold;
 *   - bounds and eviction: never more than capacity entries (cache-core LRU: a used entry
 *     survives), replacement of the same request, ikv_respcache_check after every operation,
 *     an allocation failure in put changes nothing;
 *   - tenant isolation: a tenant never gets another tenant's private response, public ones are
 *     shared, and a verified request of tenant B is not sped up by tenant A's response;
 *   - the promise: over every prompt pair of tests/data/semantic (story openings on the bundled
 *     stories260K, instruction-like prompts on a generated model), in both directions and with
 *     every other response in the cache too, the greedy output with the cache is byte-identical
 *     to the output without it; prompt-lookup decoding likewise; a sampled request through a
 *     candidate stays valid (tokens in the vocabulary, the pool invariant);
 *   - the byte budget (max_bytes): accounted bytes never above it, eviction by the policy,
 *     refusal of an entry too big alone;
 *   - the CLI: `isokv run --semantic-cache --prompts FILE` and `--spec lookup` print what plain
 *     runs print; bad flags exit 2, a missing prompts file 1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isokv/model.h"
#include "isokv/respcache.h"
#include "testutil.h"

/* ---- similarity, bounds, eviction, isolation --------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Exact Jaccard of the sets of token triples (the oracle: no hashing). */
static double oracle_jaccard(const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
    size_t ia = na >= 3 ? na - 2 : 1, ib = nb >= 3 ? nb - 2 : 1, inter = 0, ua = 0, ub = 0;
    /* distinct triples of a, then of b, then those in both */
    for (size_t i = 0; i < ia; i++) {
        int dup = 0;
        for (size_t j = 0; j < i && !dup; j++)
            dup = !memcmp(a + i, a + j, sizeof(uint32_t) * (na >= 3 ? 3 : na));
        if (dup) continue;
        ua++;
        int in = 0;
        for (size_t j = 0; j < ib && !in; j++)
            in = na >= 3 && nb >= 3 ? !memcmp(a + i, b + j, sizeof(uint32_t) * 3)
                                    : na == nb && !memcmp(a, b, sizeof(uint32_t) * na);
        inter += in;
    }
    for (size_t i = 0; i < ib; i++) {
        int dup = 0;
        for (size_t j = 0; j < i && !dup; j++)
            dup = !memcmp(b + i, b + j, sizeof(uint32_t) * (nb >= 3 ? 3 : nb));
        ub += !dup;
    }
    return (double)inter / (double)(ua + ub - inter);
}

static void test_similarity(void **st) {
    (void)st;
    ikv_respcache_options o;
    ikv_respcache_options_default(&o);
    o.min_similarity = 0.0;
    ikv_respcache *rc;
    assert_int_equal(ikv_respcache_create(&o, &rc), 0);
    enum { NE = 40, L = 30 };
    uint32_t p[NE][L], out[4] = {5, 6, 7, 8};
    for (int i = 0; i < NE; i++) {
        /* families of prompts: a shared stem with random edits */
        for (int j = 0; j < L; j++)
            p[i][j] = (uint32_t)(j * 7 + (i % 4) * 100) % 60;
        for (int e = 0; e < i % 9; e++)
            p[i][rnd(L)] = rnd(60);
        assert_int_equal(ikv_respcache_put(rc, "T", 0, p[i], L, out, 4, NULL), 0);
        assert_true(ikv_respcache_check(rc));
    }
    for (int q = 0; q < NE; q++) {
        ikv_respcache_hit h[3];
        size_t n = ikv_respcache_lookup(rc, "T", p[q], L, h, 3);
        assert_true(n >= 1 && n <= 3);
        assert_true(h[0].similarity == 1.0); /* itself (or an identical prompt) */
        assert_memory_equal(h[0].prompt, p[q], sizeof p[q]);
        for (size_t i = 0; i < n; i++) {
            double want = oracle_jaccard(p[q], L, h[i].prompt, h[i].n_prompt);
            assert_true(h[i].similarity > want - 1e-12 && h[i].similarity < want + 1e-12);
            assert_true(ikv_respcache_jaccard(p[q], L, h[i].prompt, h[i].n_prompt, 3) ==
                        h[i].similarity);
            if (i) assert_true(h[i].similarity <= h[i - 1].similarity);
        }
    }
    /* a prompt sharing nothing: no candidate; short prompts are one shingle */
    uint32_t far[L];
    for (int j = 0; j < L; j++)
        far[j] = 1000 + (uint32_t)j;
    ikv_respcache_hit h[3];
    assert_int_equal(ikv_respcache_lookup(rc, "T", far, L, h, 3), 0);
    uint32_t two[2] = {1, 2};
    assert_int_equal(ikv_respcache_put(rc, "T", 0, two, 2, out, 1, NULL), 0);
    assert_int_equal(ikv_respcache_lookup(rc, "T", two, 2, h, 3), 1);
    assert_true(h[0].similarity == 1.0 && h[0].n_output == 1);
    ikv_respcache_destroy(rc);
}

static void test_bounds_and_eviction(void **st) {
    (void)st;
    ikv_respcache_options o;
    ikv_respcache_options_default(&o);
    o.capacity = 8;
    o.max_tokens = 16;
    ikv_respcache *rc;
    assert_int_equal(ikv_respcache_create(&o, &rc), 0);
    uint32_t p[32], out[32];
    for (int j = 0; j < 32; j++)
        out[j] = (uint32_t)j;
    ikv_respcache_hit h[2];
    uint32_t keep = UINT32_MAX;
    for (uint32_t i = 0; i < 40; i++) {
        for (int j = 0; j < 32; j++)
            p[j] = i * 1000 + (uint32_t)j;
        assert_int_equal(ikv_respcache_put(rc, "T", 0, p, 32, out, 32, NULL), 0);
        if (i == 0) {
            assert_int_equal(ikv_respcache_lookup(rc, "T", p, 32, h, 2), 1);
            assert_int_equal(h[0].n_prompt, 16); /* cut to max_tokens */
            assert_int_equal(h[0].n_output, 16);
            keep = h[0].id;
        }
        ikv_respcache_used(rc, keep, 5); /* LRU: the entry in use stays */
        assert_true(ikv_respcache_check(rc));
        ikv_respcache_stats s;
        ikv_respcache_stats_get(rc, &s);
        assert_true(s.entries <= 8);
    }
    for (int j = 0; j < 32; j++)
        p[j] = (uint32_t)j;
    assert_int_equal(ikv_respcache_lookup(rc, "T", p, 32, h, 2), 1);
    assert_int_equal(h[0].id, keep);
    /* the same request again replaces its entry */
    out[0] = 99;
    assert_int_equal(ikv_respcache_put(rc, "T", 0, p, 32, out, 3, NULL), 0);
    assert_int_equal(ikv_respcache_lookup(rc, "T", p, 32, h, 2), 1);
    assert_int_equal(h[0].output[0], 99);
    assert_int_equal(h[0].n_output, 3);
    ikv_respcache_stats s;
    ikv_respcache_stats_get(rc, &s);
    assert_int_equal(s.entries, 8);
    assert_int_equal(s.evictions, 40 - 8);
    assert_int_equal(s.replaced, 1);
    /* allocation failure: nothing changes */
    p[0] = 123456;
    for (size_t k = 0; k < 3; k++) {
        ikv_alloc_fail_after(k);
        int r = ikv_respcache_put(rc, "T", 0, p, 32, out, 3, NULL);
        ikv_alloc_fail_after(SIZE_MAX);
        if (r == 0) break;
        assert_int_equal(r, IKV_ENOMEM);
        ikv_respcache_stats s2;
        ikv_respcache_stats_get(rc, &s2);
        assert_int_equal(s2.puts, s.puts);
        assert_true(ikv_respcache_check(rc));
    }
    /* bad input */
    assert_int_equal(ikv_respcache_put(rc, "T", 0, p, 0, out, 3, NULL), IKV_EINVAL);
    assert_int_equal(ikv_respcache_put(rc, "T", 0, p, 3, out, 0, NULL), IKV_EINVAL);
    ikv_respcache_destroy(rc);
    o.capacity = 0;
    assert_int_equal(ikv_respcache_create(&o, &rc), IKV_EINVAL);
    o.capacity = 4;
    o.policy = "no-such-policy";
    assert_int_equal(ikv_respcache_create(&o, &rc), IKV_EPOLICY);
    o.policy = "sieve";
    assert_int_equal(ikv_respcache_create(&o, &rc), 0);
    ikv_respcache_destroy(rc);
}

/* The byte budget: entries of 1264 accounted bytes (32 + 32 tokens, 30 shingles) under 5000
 * bytes: at most 3 at a time, evicted by the policy (LRU: the entry in use stays); the count
 * is the sum over the entries (ikv_respcache_check); a replacement that grows its entry over
 * the budget evicts others, never itself; an entry above the budget alone is refused, nothing
 * changed; mixed sizes never exceed the budget. */
static void test_byte_budget(void **st) {
    (void)st;
    ikv_respcache_options o;
    ikv_respcache_options_default(&o);
    o.capacity = 1000;
    o.max_bytes = 5000;
    ikv_respcache *rc;
    assert_int_equal(ikv_respcache_create(&o, &rc), 0);
    const uint64_t one = IKV_RESPCACHE_ENTRY_BYTES + 4 * 64 + 8 * 30;
    uint32_t p[32], out[1200];
    for (int j = 0; j < 1200; j++)
        out[j] = (uint32_t)j;
    ikv_respcache_hit h[2];
    uint32_t keep = UINT32_MAX;
    ikv_respcache_stats s;
    for (uint32_t i = 0; i < 20; i++) {
        for (int j = 0; j < 32; j++)
            p[j] = i * 1000 + (uint32_t)j;
        assert_int_equal(ikv_respcache_put(rc, "T", 0, p, 32, out, 32, NULL), 0);
        if (i == 0) {
            assert_int_equal(ikv_respcache_lookup(rc, "T", p, 32, h, 2), 1);
            keep = h[0].id;
        }
        ikv_respcache_used(rc, keep, 5);
        assert_true(ikv_respcache_check(rc));
        ikv_respcache_stats_get(rc, &s);
        assert_int_equal(s.entries, i < 3 ? i + 1 : 3);
        assert_int_equal(s.bytes, s.entries * one);
        assert_true(s.bytes <= 5000);
    }
    assert_int_equal(s.evictions, 20 - 3);
    assert_int_equal(s.max_bytes, 5000);
    for (int j = 0; j < 32; j++)
        p[j] = (uint32_t)j;
    assert_int_equal(ikv_respcache_lookup(rc, "T", p, 32, h, 2), 1);
    assert_int_equal(h[0].id, keep);
    /* the kept entry grows to 32 + 500 tokens (3136 bytes): one other goes, it stays */
    assert_int_equal(ikv_respcache_put(rc, "T", 0, p, 32, out, 500, NULL), 0);
    assert_true(ikv_respcache_check(rc));
    ikv_respcache_stats_get(rc, &s);
    assert_int_equal(s.entries, 2);
    assert_int_equal(s.bytes, IKV_RESPCACHE_ENTRY_BYTES + 4 * 532 + 8 * 30 + one);
    assert_int_equal(ikv_respcache_lookup(rc, "T", p, 32, h, 2), 1);
    assert_int_equal(h[0].n_output, 500);
    /* alone above the budget: refused, nothing changed */
    p[0] = 777777;
    const uint64_t puts = s.puts, bytes = s.bytes;
    assert_int_equal(ikv_respcache_put(rc, "T", 0, p, 32, out, 1200, NULL), IKV_EFULL);
    ikv_respcache_stats_get(rc, &s);
    assert_int_equal(s.puts, puts);
    assert_int_equal(s.bytes, bytes);
    assert_int_equal(s.too_big, 1);
    /* mixed sizes, pseudo-random: always within the budget and consistent */
    uint64_t x = 12345;
    for (uint32_t i = 0; i < 300; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        size_t np = 1 + (x >> 33) % 32, no = 1 + (x >> 45) % 200;
        for (size_t j = 0; j < np; j++)
            p[j] = 50000 + i * 40 + (uint32_t)j;
        int r = ikv_respcache_put(rc, "T", 0, p, np, out, no, NULL);
        assert_true(r == 0 || r == IKV_EFULL);
        assert_true(ikv_respcache_check(rc));
        ikv_respcache_stats_get(rc, &s);
        assert_true(s.bytes <= 5000);
    }
    ikv_respcache_destroy(rc);
}

static void test_tenant_isolation(void **st) {
    (void)st;
    ikv_respcache *rc;
    assert_int_equal(ikv_respcache_create(NULL, &rc), 0);
    uint32_t p[20], out[5] = {9, 9, 9, 9, 9};
    for (int j = 0; j < 20; j++)
        p[j] = (uint32_t)j + 3;
    ikv_respcache_hit h[4];
    assert_int_equal(ikv_respcache_put(rc, "alice", 0, p, 20, out, 5, NULL), 0);
    assert_int_equal(ikv_respcache_lookup(rc, "alice", p, 20, h, 4), 1);
    assert_int_equal(ikv_respcache_lookup(rc, "bob", p, 20, h, 4), 0);
    assert_int_equal(ikv_respcache_lookup(rc, NULL, p, 20, h, 4), 0);
    assert_int_equal(ikv_respcache_lookup(rc, "alice2", p, 20, h, 4), 0);
    /* a public entry is seen by everyone */
    p[19] = 77;
    assert_int_equal(ikv_respcache_put(rc, "alice", 1, p, 20, out, 5, NULL), 0);
    assert_int_equal(ikv_respcache_lookup(rc, "bob", p, 20, h, 4), 1);
    assert_int_equal(h[0].similarity, 1.0);
    /* bob's own copy of alice's private prompt is bob's */
    p[19] = 22;
    assert_int_equal(ikv_respcache_put(rc, "bob", 0, p, 20, out, 2, NULL), 0);
    size_t n = ikv_respcache_lookup(rc, "bob", p, 20, h, 4);
    for (size_t i = 0; i < n; i++)
        assert_true(h[i].n_output == 2 || h[i].prompt[19] == 77); /* bob's, or the public one */
    assert_true(ikv_respcache_check(rc));
    ikv_respcache_destroy(rc);
}

/* ---- outputs with the cache == outputs without it ---------------------------------------- */

typedef struct pair {
    char kind[16], a[512], b[512];
} pair;

static size_t read_pairs(const char *path, pair *out, size_t max) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1200];
    size_t n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\r\n")] = 0;
        char *k = strtok(line, "\t"), *a = strtok(NULL, "\t"), *b = strtok(NULL, "\t");
        assert_non_null(k), assert_non_null(a), assert_non_null(b);
        snprintf(out[n].kind, sizeof out[n].kind, "%s", k);
        snprintf(out[n].a, sizeof out[n].a, "%s", a);
        snprintf(out[n].b, sizeof out[n].b, "%s", b);
        n++;
    }
    fclose(f);
    return n;
}

/* One request: greedy (or sampled) generation of n tokens with the given candidates or
 * prompt-lookup drafts; returns the token count, tokens at hist + np. */
static size_t gen(ikv_engine *e, const char *tenant, const uint32_t *p, size_t np, size_t n,
                  const ikv_respcache_hit *h, size_t nh, uint32_t lookup, float temp,
                  uint32_t *hist, ikv_gen_result *gr) {
    const int V = ikv_model_cfg(ikv_engine_model(e))->vocab_size;
    ikv_sampler *sp;
    assert_int_equal(ikv_sampler_create((uint32_t)V, temp, 0.9f, 5, &sp), 0);
    ikv_request rq = {.tokens = p, .n = np, .tenant = tenant};
    ikv_seq *s;
    assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
    memcpy(hist, p, sizeof *p * np);
    ikv_gen_options go = {.max_tokens = n,
                          .cands = h,
                          .n_cands = nh,
                          .lookup_ngram = lookup,
                          .lookup_k = 8,
                          .max_draft = 64};
    assert_int_equal(ikv_respcache_generate(e, s, sp, &go, hist, np, gr), 0);
    ikv_engine_end(e, s);
    ikv_sampler_destroy(sp);
    assert_true(ikv_engine_check(e));
    return gr->n_out;
}

static void pairs_identical(ikv_model *m, ikv_tokenizer *tk, const char *file, size_t N) {
    enum { MAXP = 32 };
    pair *pr = malloc(sizeof(pair) * MAXP);
    size_t np = read_pairs(file, pr, MAXP);
    assert_true(np >= 10);
    ikv_engine_options eo;
    ikv_engine_options_default(&eo);
    eo.max_draft = 64;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &eo, &e), 0);
    ikv_respcache *all;
    assert_int_equal(ikv_respcache_create(NULL, &all), 0);
    static uint32_t pa[256], pb[256], ha[1024], hb[1024], hc[1024];
    size_t hits = 0, accepted = 0, kinds_hit[4] = {0};
    for (size_t i = 0; i < np; i++)
        for (int dir = 0; dir < 2; dir++) {
            const char *ta = dir ? pr[i].b : pr[i].a, *tb = dir ? pr[i].a : pr[i].b;
            size_t na, nb;
            assert_int_equal(ikv_tokenizer_encode(tk, ta, 1, 0, pa, 256, &na), 0);
            assert_int_equal(ikv_tokenizer_encode(tk, tb, 1, 0, pb, 256, &nb), 0);
            ikv_gen_result gr;
            size_t oa = gen(e, "T", pa, na, N, NULL, 0, 0, 0.0f, ha, &gr);
            size_t ob = gen(e, "T", pb, nb, N, NULL, 0, 0, 0.0f, hb, &gr);
            /* one cache with only a's response, one with everything so far */
            ikv_respcache *one;
            assert_int_equal(ikv_respcache_create(NULL, &one), 0);
            assert_int_equal(ikv_respcache_put(one, "T", 0, pa, na, ha + na, oa, NULL), 0);
            assert_int_equal(ikv_respcache_put(all, "T", 0, pa, na, ha + na, oa, NULL), 0);
            for (int w = 0; w < 2; w++) {
                ikv_respcache_hit h[3];
                size_t nh = ikv_respcache_lookup(w ? all : one, "T", pb, nb, h, 3);
                size_t oc = gen(e, "T", pb, nb, N, h, nh, 0, 0.0f, hc, &gr);
                if (oc != ob || memcmp(hc + nb, hb + nb, sizeof(uint32_t) * ob))
                    fail_msg("%s pair %zu (%s): output with the cache differs", file, i,
                             pr[i].kind);
                if (w == 0 && gr.cache_accepted) {
                    hits++, accepted += gr.cache_accepted;
                    kinds_hit[pr[i].kind[0] == 'p' ? 0 : pr[i].kind[0] == 'n' ? 1 : 2]++;
                }
                assert_true(gr.forwards <= ob); /* never more passes than plain decoding */
            }
            /* another tenant gets nothing from T's responses */
            ikv_respcache_hit h[3];
            assert_int_equal(ikv_respcache_lookup(all, "U", pb, nb, h, 3), 0);
            /* prompt-lookup drafts: the same output */
            size_t ol = gen(e, "T", pb, nb, N, NULL, 0, 3, 0.0f, hc, &gr);
            assert_int_equal(ol, ob);
            assert_memory_equal(hc + nb, hb + nb, sizeof(uint32_t) * ob);
            /* sampling through a candidate: valid tokens, the pool invariant (gen checks) */
            ikv_respcache_hit h1[1];
            size_t n1 = ikv_respcache_lookup(one, "T", pb, nb, h1, 1);
            size_t os = gen(e, "T", pb, nb, N, h1, n1, 0, 0.8f, hc, &gr);
            for (size_t t = 0; t < os; t++)
                assert_true(hc[nb + t] < (uint32_t)ikv_model_cfg(m)->vocab_size);
            ikv_respcache_destroy(one);
        }
    assert_true(ikv_respcache_check(all));
    /* the set is not trivial: some candidates were accepted in part */
    assert_true(hits > 0 && accepted > 0);
    print_message("%s: %zu of %zu requests took >= 1 cached token (%zu tokens)\n", file, hits,
                  2 * np, accepted);
    ikv_respcache_destroy(all);
    ikv_engine_destroy(e);
    free(pr);
}

static void test_pairs_real_model(void **st) {
    (void)st;
    ikv_model *m;
    ikv_tokenizer *tk;
    if (ikv_model_load("data/models/stories260K/stories260K.bin", &m))
        fail_msg("bundled model: %s", ikv_errdetail());
    assert_int_equal(ikv_tokenizer_load("data/models/stories260K/tok512.bin", 512, &tk), 0);
    pairs_identical(m, tk, "tests/data/semantic/pairs_stories.tsv", 48);
    ikv_tokenizer_destroy(tk);
    ikv_model_destroy(m);
}

static void test_pairs_generated_model(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 7, &m), 0);
    char path[] = "/tmp/ikv_test_respcache_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ikv_tokenizer_write_synthetic(path, 512, 1), 0);
    ikv_tokenizer *tk;
    assert_int_equal(ikv_tokenizer_load(path, 512, &tk), 0);
    unlink(path);
    pairs_identical(m, tk, "tests/data/semantic/pairs_generated.tsv", 40);
    ikv_tokenizer_destroy(tk);
    ikv_model_destroy(m);
}

/* ---- CLI ---------------------------------------------------------------------------------- */

/* Runs the isokv binary with argv (no shell), stdout to `out` (a file); returns the exit
 * status. */
static int run_cli(char *const argv[], const char *out) {
    return tu_run((const char *const *)argv, out, NULL, 120);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[3][65536];
    static int k;
    k = (k + 1) % 3;
    size_t n = fread(buf[k], 1, sizeof buf[k] - 1, f);
    buf[k][n] = 0;
    fclose(f);
    return buf[k];
}

static void test_cli(void **st) {
    (void)st;
    const char *bin = getenv("IKV_BIN");
    if (!bin) skip();
    char pf[] = "/tmp/ikv_test_rc_prompts_XXXXXX";
    int fd = mkstemp(pf);
    assert_true(fd >= 0);
    const char *text = "Once upon a time, there was a little girl named Lily.\n"
                       "Once upon a time there was a little girl named Lily.\n"
                       "Tom had two red balls.\n"
                       "Once upon a time, there was a little girl named Lily.\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char o1[] = "/tmp/ikv_test_rc_o1_XXXXXX", o2[] = "/tmp/ikv_test_rc_o2_XXXXXX";
    close(mkstemp(o1)), close(mkstemp(o2));
    char *plain[] = {(char *)bin, "run", "-n", "80", "--prompts", pf, NULL};
    char *cached[] = {(char *)bin, "run", "-n", "80", "--prompts", pf, "--semantic-cache=64", NULL};
    assert_int_equal(run_cli(plain, o1), 0);
    assert_int_equal(run_cli(cached, o2), 0);
    char *a = slurp(o1), *b = slurp(o2);
    assert_true(strlen(a) > 200);
    assert_string_equal(a, b);
    /* a byte budget (64k): the same text as plain */
    char *plain_text = strdup(a);
    char *bytes[] = {(char *)bin, "run", "-n", "80", "--prompts", pf, "--semantic-cache=64k", NULL};
    assert_int_equal(run_cli(bytes, o1), 0);
    assert_string_equal(slurp(o1), plain_text);
    free(plain_text);
    char *lk[] = {(char *)bin, "run", "-n", "200", "--spec", "lookup:n=2,k=6", NULL};
    char *pl[] = {(char *)bin, "run", "-n", "200", NULL};
    assert_int_equal(run_cli(lk, o1), 0);
    assert_int_equal(run_cli(pl, o2), 0);
    a = slurp(o1), b = slurp(o2);
    assert_string_equal(a, b);
    char *bad1[] = {(char *)bin, "run", "--spec", "tree", NULL};
    char *bad2[] = {(char *)bin, "run", "--spec", "lookup:n=0", NULL};
    char *bad3[] = {(char *)bin, "run", "--semantic-cache=x", NULL};
    char *bad4[] = {(char *)bin, "run", "--semantic-cache=2k", NULL};
    char *bad5[] = {(char *)bin, "serve", "--semantic-cache=2k", NULL};
    char *bad6[] = {(char *)bin, "serve", "--spec", "lookup:k=0", NULL};
    char *bad7[] = {(char *)bin, "serve", "--semantic-cache=", NULL};
    assert_int_equal(run_cli(bad4, o1), 2);
    assert_int_equal(run_cli(bad5, o1), 2);
    assert_int_equal(run_cli(bad6, o1), 2);
    assert_int_equal(run_cli(bad7, o1), 2);
    char *miss[] = {(char *)bin, "run", "--prompts", "/nonexistent/prompts.txt", NULL};
    assert_int_equal(run_cli(bad1, o1), 2);
    assert_int_equal(run_cli(bad2, o1), 2);
    assert_int_equal(run_cli(bad3, o1), 2);
    assert_int_equal(run_cli(miss, o1), 1);
    unlink(pf), unlink(o1), unlink(o2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_similarity),
        cmocka_unit_test(test_bounds_and_eviction),
        cmocka_unit_test(test_byte_budget),
        cmocka_unit_test(test_tenant_isolation),
        cmocka_unit_test(test_pairs_real_model),
        cmocka_unit_test(test_pairs_generated_model),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
