/* Tests for the segments format (segments.c), the synthetic generator (gen.c), the segments
 * reader (trace_segments.c) and `isokv gen`: determinism, knob effects that could go wrong,
 * scoping of keys, chunk keys, the reader round trip, malformed lines, allocation failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "isokv/gen.h"
#include "testutil.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* Generates into memory; returns a malloc'd NUL-terminated buffer. */
static char *gen_mem(const ikv_gen_opts *o, uint64_t *n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    int rc = ikv_gen_write(o, f, NULL, n);
    fclose(f);
    assert_int_equal(rc, 0);
    return buf;
}

/* Splits a buffer into lines (in place); returns the count, fills lines[] (at most max). */
static size_t split_lines(char *buf, char **lines, size_t max) {
    size_t n = 0;
    for (char *p = buf; *p && n < max;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        lines[n++] = p;
        if (!e) break;
        p = e + 1;
    }
    return n;
}

/* A parsed request line: the JSON (owns the strings) and the segment list. */
typedef struct line_req {
    cJSON *j;
    const char *tenant;
    uint64_t session, turn;
    double time;
    ikv_segment segs[512];
    size_t n;
} line_req;

static void parse_req(const char *line, line_req *r) {
    r->j = cJSON_Parse(line);
    assert_non_null(r->j);
    r->tenant = cJSON_GetObjectItem(r->j, "tenant")->valuestring;
    r->session = (uint64_t)cJSON_GetObjectItem(r->j, "session")->valuedouble;
    r->turn = (uint64_t)cJSON_GetObjectItem(r->j, "turn")->valuedouble;
    r->time = cJSON_GetObjectItem(r->j, "time")->valuedouble;
    const cJSON *it;
    r->n = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(r->j, "segments")) {
        assert_true(r->n < 512);
        ikv_segment *s = &r->segs[r->n++];
        assert_int_equal(ikv_seg_kind_parse(cJSON_GetObjectItem(it, "kind")->valuestring, &s->kind),
                         0);
        s->id = cJSON_GetObjectItem(it, "id")->valuestring;
        s->tokens = (uint32_t)cJSON_GetObjectItem(it, "tokens")->valuedouble;
        s->is_public = cJSON_IsTrue(cJSON_GetObjectItem(it, "public"));
    }
}

/* Leading blocks two key lists share. */
static size_t common_prefix(const ikv_key *a, size_t na, const ikv_key *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && ikv_key_eq(a[i], b[i]))
        i++;
    return i;
}

static ikv_key *copy_keys(const ikv_trace_request *r) {
    ikv_key *k = malloc(r->n_blocks * sizeof *k);
    memcpy(k, r->keys, r->n_blocks * sizeof *k);
    return k;
}

static void small_opts(ikv_gen_opts *o) {
    ikv_gen_opts_default(o);
    o->requests = 400;
    o->users = 20;
    o->system_tokens = 200;
    o->tool_tokens = 40;
    o->memory_tokens = 256;
    o->memory_item_tokens = 32;
    o->doc_tokens = 100;
    o->query_tokens = 20;
    o->output_tokens = 30;
    o->corpus = 500;
    o->intents = 50;
}

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "/tmp/ikv_test_gen_%ld_%s", (long)getpid(), name);
    return buf[k];
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* ---- segments core ----------------------------------------------------------------------- */

/* The token derivation documented in gen.h/docs, recomputed independently here. */
static void test_tokens_match_documented_formula(void **st) {
    (void)st;
    const char in[] = "doc\0d42\0"; /* public: tenant is "" */
    uint64_t id = XXH3_64bits_withSeed(in, sizeof in - 1, UINT64_C(0x69736f6b76736567));
    assert_true(id == ikv_seg_identity(IKV_SEG_DOC, "d42", "u9", 1));
    assert_true(id == ikv_seg_identity(IKV_SEG_DOC, "d42", NULL, 1));
    assert_true(id != ikv_seg_identity(IKV_SEG_DOC, "d42", "u9", 0));
    assert_true(id != ikv_seg_identity(IKV_SEG_MEMORY, "d42", NULL, 1));
    uint32_t t[100];
    ikv_seg_tokens(id, t, 100);
    for (uint64_t j = 0; j < 100; j++) {
        uint64_t z = id + (j + 1) * UINT64_C(0x9E3779B97F4A7C15);
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        z ^= z >> 31;
        assert_int_equal(t[j], (uint32_t)(z % IKV_SEG_VOCAB));
    }
    /* a private segment's identity includes the tenant */
    const char in2[] = "memory\0m0.v0\0u9";
    assert_true(XXH3_64bits_withSeed(in2, sizeof in2 - 1, UINT64_C(0x69736f6b76736567)) ==
                ikv_seg_identity(IKV_SEG_MEMORY, "m0.v0", "u9", 0));
}

static void test_public_prefix_and_straddle(void **st) {
    (void)st;
    ikv_seg_builder *b;
    assert_int_equal(ikv_seg_builder_create(7, 16, &b), 0);
    /* 20 public + 20 private tokens: block 0 public, block 1 (16..32) straddles -> private */
    ikv_segment s[2] = {{IKV_SEG_SYSTEM, "sys", 20, 1}, {IKV_SEG_MEMORY, "m", 20, 0}};
    ikv_trace_request ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    assert_int_equal(ikv_seg_build(b, "alice", s, 2, &ra), 0);
    assert_int_equal(ra.input_tokens, 40);
    assert_int_equal(ra.n_blocks, 3);
    assert_int_equal(ra.ntokens[0], 16);
    assert_int_equal(ra.ntokens[2], 8);
    assert_int_equal(ra.n_public_blocks, 1);
    ikv_key *ka = copy_keys(&ra);
    assert_int_equal(ikv_seg_build(b, "bob", s, 2, &rb), 0);
    assert_true(ikv_key_eq(ka[0], rb.keys[0]));  /* public: shared */
    assert_false(ikv_key_eq(ka[1], rb.keys[1])); /* straddling: private */
    assert_false(ikv_key_eq(ka[2], rb.keys[2]));
    /* keys are exactly the chain over the tokens with the documented salts */
    const uint32_t *tok = ikv_seg_builder_tokens(b);
    ikv_key k0 = ikv_key_chain(7, NULL, tok, 16, IKV_SCOPE_PUBLIC);
    ikv_key k1 = ikv_key_chain(7, &k0, tok + 16, 16, ikv_scope_salt(7, "bob"));
    assert_true(ikv_key_eq(k0, rb.keys[0]));
    assert_true(ikv_key_eq(k1, rb.keys[1]));
    /* a public segment after a private one is keyed privately */
    ikv_segment s2[3] = {
        {IKV_SEG_SYSTEM, "sys", 32, 1}, {IKV_SEG_MEMORY, "m", 16, 0}, {IKV_SEG_DOC, "d", 32, 1}};
    assert_int_equal(ikv_seg_build(b, "alice", s2, 3, &ra), 0);
    assert_int_equal(ra.n_public_blocks, 2);
    /* an all-public request: every block public, including the partial last */
    ikv_segment s3[1] = {{IKV_SEG_SYSTEM, "sys", 40, 1}};
    assert_int_equal(ikv_seg_build(b, "alice", s3, 1, &ra), 0);
    assert_int_equal(ra.n_public_blocks, 3);
    free(ka);
    ikv_seg_builder_destroy(b);
}

static void test_private_segments_never_share_keys(void **st) {
    (void)st;
    ikv_seg_builder *b;
    assert_int_equal(ikv_seg_builder_create(1, 16, &b), 0);
    ikv_segment s[4] = {{IKV_SEG_MEMORY, "m0.v0", 64, 0},
                        {IKV_SEG_DOC, "d1", 64, 0},
                        {IKV_SEG_HISTORY, "s1.a0", 50, 0},
                        {IKV_SEG_QUERY, "q1", 20, 0}};
    ikv_trace_request ra, rb;
    assert_int_equal(ikv_seg_build(b, "u1", s, 4, &ra), 0);
    ikv_key *ka = copy_keys(&ra);
    size_t na = ra.n_blocks;
    assert_int_equal(ra.n_public_blocks, 0);
    assert_int_equal(ikv_seg_build(b, "u2", s, 4, &rb), 0);
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < rb.n_blocks; j++)
            assert_false(ikv_key_eq(ka[i], rb.keys[j]));
    /* and the private doc's position-independent keys differ too */
    assert_int_equal(rb.n_chunks, 1);
    ikv_key dk = rb.chunks[0].doc_keys[0];
    assert_int_equal(ikv_seg_build(b, "u1", s, 4, &ra), 0);
    assert_false(ikv_key_eq(dk, ra.chunks[0].doc_keys[0]));
    free(ka);
    ikv_seg_builder_destroy(b);
}

static void test_chunk_doc_keys_position_independent(void **st) {
    (void)st;
    ikv_seg_builder *b;
    assert_int_equal(ikv_seg_builder_create(3, 16, &b), 0);
    /* doc d1 (100 tokens) at offset 16 (aligned) and at offset 45 (not aligned) */
    ikv_segment s1[3] = {
        {IKV_SEG_SYSTEM, "a", 16, 1}, {IKV_SEG_DOC, "d1", 100, 1}, {IKV_SEG_QUERY, "q", 10, 0}};
    ikv_segment s2[4] = {{IKV_SEG_SYSTEM, "b", 40, 1},
                         {IKV_SEG_MEMORY, "m", 5, 0},
                         {IKV_SEG_DOC, "d1", 100, 1},
                         {IKV_SEG_QUERY, "q", 10, 0}};
    ikv_trace_request r1, r2;
    assert_int_equal(ikv_seg_build(b, "x", s1, 3, &r1), 0);
    assert_int_equal(r1.n_chunks, 1);
    assert_int_equal(r1.chunks[0].first, 1);
    assert_int_equal(r1.chunks[0].count, 6); /* 16..112: blocks 1..6 */
    assert_int_equal(r1.chunks[0].tokens, 100);
    ikv_key d1[6], own1[6];
    memcpy(d1, r1.chunks[0].doc_keys, sizeof d1);
    memcpy(own1, r1.keys + 1, sizeof own1);
    assert_int_equal(ikv_seg_build(b, "y", s2, 4, &r2), 0);
    assert_int_equal(r2.n_chunks, 1);
    assert_int_equal(r2.chunks[0].first, 3); /* doc spans 45..145: whole blocks 3..8 */
    assert_int_equal(r2.chunks[0].count, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_true(ikv_key_eq(d1[i], r2.chunks[0].doc_keys[i]));
        assert_false(ikv_key_eq(own1[i], r2.keys[3 + i])); /* prefix keys depend on position */
    }
    /* doc_keys are the document's own tokens cut from its start, public scope */
    uint32_t tok[100];
    ikv_seg_tokens(ikv_seg_identity(IKV_SEG_DOC, "d1", NULL, 1), tok, 100);
    ikv_key ref[6];
    ikv_keys_of_tokens(3, tok, 100, 16, IKV_SCOPE_PUBLIC, 0, ref, 6);
    for (size_t i = 0; i < 6; i++)
        assert_true(ikv_key_eq(ref[i], d1[i]));
    /* a doc shorter than a block, or covering no whole block, has no chunk */
    ikv_segment s3[2] = {{IKV_SEG_SYSTEM, "a", 10, 1}, {IKV_SEG_DOC, "d2", 20, 1}};
    assert_int_equal(ikv_seg_build(b, "x", s3, 2, &r1), 0);
    assert_int_equal(r1.n_chunks, 0);
    ikv_seg_builder_destroy(b);
}

static void test_build_rejects_bad_input(void **st) {
    (void)st;
    ikv_seg_builder *b;
    assert_int_equal(ikv_seg_builder_create(1, 0, &b), IKV_EINVAL);
    assert_int_equal(ikv_seg_builder_create(1, 16, &b), 0);
    ikv_trace_request r;
    memset(&r, 0, sizeof r);
    ikv_segment ok = {IKV_SEG_QUERY, "q", 5, 0}, zero = {IKV_SEG_QUERY, "q", 0, 0};
    ikv_segment big[2] = {{IKV_SEG_DOC, "a", IKV_SEG_MAX_TOKENS, 0}, {IKV_SEG_DOC, "b", 1, 0}};
    assert_int_equal(ikv_seg_build(b, "t", &ok, 0, &r), IKV_EINVAL);
    assert_int_equal(ikv_seg_build(b, "", &ok, 1, &r), IKV_EINVAL);
    assert_int_equal(ikv_seg_build(b, "t", &zero, 1, &r), IKV_EINVAL);
    assert_int_equal(ikv_seg_build(b, "t", big, 2, &r), IKV_ETOOLONG);
    assert_int_equal(r.n_blocks, 0); /* untouched */
    ikv_seg_builder_destroy(b);
    ikv_seg_builder_destroy(NULL);
}

/* Every allocation failure in build returns IKV_ENOMEM and leaves the request unchanged; a
 * later build with memory succeeds. */
static void test_build_alloc_failure(void **st) {
    (void)st;
    ikv_segment s[3] = {
        {IKV_SEG_SYSTEM, "a", 300, 1}, {IKV_SEG_DOC, "d", 500, 1}, {IKV_SEG_QUERY, "q", 30, 0}};
    for (size_t n = 0;; n++) {
        ikv_seg_builder *b = NULL;
        ikv_alloc_fail_after(n);
        int rc = ikv_seg_builder_create(1, 16, &b);
        ikv_trace_request r;
        memset(&r, 0, sizeof r);
        if (rc == 0) rc = ikv_seg_build(b, "t", s, 3, &r);
        ikv_alloc_fail_after(SIZE_MAX);
        if (rc == 0) {
            assert_int_equal(r.n_blocks, (830 + 15) / 16);
            ikv_seg_builder_destroy(b);
            assert_true(n > 2);
            break;
        }
        assert_int_equal(rc, IKV_ENOMEM);
        assert_int_equal(r.n_blocks, 0);
        if (b) { /* the builder still works */
            assert_int_equal(ikv_seg_build(b, "t", s, 3, &r), 0);
            assert_int_equal(r.n_chunks, 1);
        }
        ikv_seg_builder_destroy(b);
    }
}

/* ---- generator --------------------------------------------------------------------------- */

static void test_determinism(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    uint64_t n1, n2, n3;
    char *a = gen_mem(&o, &n1), *b = gen_mem(&o, &n2);
    assert_int_equal(n1, 400);
    assert_int_equal(n2, 400);
    assert_string_equal(a, b);
    o.seed = 2;
    char *c = gen_mem(&o, &n3);
    assert_string_not_equal(a, c);
    /* header, then n requests in non-decreasing time */
    char **lines = calloc(1000, sizeof *lines);
    size_t nl = split_lines(a, lines, 1000);
    assert_int_equal(nl, 401);
    cJSON *h = cJSON_Parse(lines[0]);
    assert_string_equal(cJSON_GetObjectItem(h, "format")->valuestring, "isokv-segments");
    assert_int_equal((int)cJSON_GetObjectItem(h, "block_tokens")->valuedouble, 16);
    cJSON_Delete(h);
    double prev = 0;
    for (size_t i = 1; i < nl; i++) {
        line_req r;
        parse_req(lines[i], &r);
        assert_true(r.time >= prev);
        prev = r.time;
        cJSON_Delete(r.j);
    }
    free(lines);
    free(a);
    free(b);
    free(c);
}

/* The first R requests do not depend on how many more are generated after them. */
static void test_request_count_is_a_prefix(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.think = 200; /* sessions long compared with inter-arrival times: the bound matters */
    o.requests = 150;
    char *a = gen_mem(&o, NULL);
    o.requests = 600;
    char *b = gen_mem(&o, NULL);
    char **la = calloc(1000, sizeof *la), **lb = calloc(1000, sizeof *lb);
    assert_int_equal(split_lines(a, la, 1000), 151);
    assert_int_equal(split_lines(b, lb, 1000), 601);
    for (size_t i = 1; i <= 150; i++)
        assert_string_equal(la[i], lb[i]);
    /* duration: every request before it, none after */
    o.requests = 0;
    o.duration = 30;
    char *c = gen_mem(&o, NULL);
    char **lc = calloc(100000, sizeof *lc);
    size_t nc = split_lines(c, lc, 100000);
    assert_true(nc > 50);
    line_req r;
    parse_req(lc[nc - 1], &r);
    assert_true(r.time < 30);
    cJSON_Delete(r.j);
    for (size_t i = 1; i < nc && i <= 600; i++) {
        parse_req(lb[i], &r);
        int before = r.time < 30;
        cJSON_Delete(r.j);
        if (before)
            assert_string_equal(lc[i], lb[i]);
        else
            assert_int_equal(nc, i);
    }
    free(la);
    free(lb);
    free(lc);
    free(a);
    free(b);
    free(c);
}

static int key_cmp(const void *x, const void *y) {
    const ikv_key *a = x, *b = y;
    if (a->hi != b->hi) return a->hi < b->hi ? -1 : 1;
    return (a->lo > b->lo) - (a->lo < b->lo);
}

/* Distinct private and public block keys in a generated trace, read with the test's own
 * parser and the builder. */
static void count_blocks(const ikv_gen_opts *o, size_t *n_private, size_t *n_public,
                         size_t *n_tenants) {
    char *buf = gen_mem(o, NULL);
    size_t cap = 200000;
    char **lines = calloc(cap, sizeof *lines);
    size_t nl = split_lines(buf, lines, cap);
    ikv_seg_builder *b;
    assert_int_equal(ikv_seg_builder_create(o->seed, o->block_tokens, &b), 0);
    size_t kcap = 1 << 22, nk = 0, np = 0;
    ikv_key *priv = malloc(kcap * sizeof *priv), *pub = malloc(kcap * sizeof *pub);
    char(*tenants)[16] = calloc(nl, 16);
    size_t nt = 0;
    for (size_t i = 1; i < nl; i++) {
        line_req r;
        parse_req(lines[i], &r);
        ikv_trace_request q;
        assert_int_equal(ikv_seg_build(b, r.tenant, r.segs, r.n, &q), 0);
        for (size_t k = 0; k < q.n_blocks; k++) {
            if (k < q.n_public_blocks) {
                assert_true(np < kcap);
                pub[np++] = q.keys[k];
            } else {
                assert_true(nk < kcap);
                priv[nk++] = q.keys[k];
            }
        }
        size_t t = 0;
        while (t < nt && strcmp(tenants[t], r.tenant))
            t++;
        if (t == nt) snprintf(tenants[nt++], 16, "%s", r.tenant);
        cJSON_Delete(r.j);
    }
    /* distinct: sort and count */
    size_t counts[2];
    ikv_key *arrs[2] = {priv, pub};
    size_t lens[2] = {nk, np};
    for (int a = 0; a < 2; a++) {
        qsort(arrs[a], lens[a], sizeof(ikv_key), key_cmp);
        size_t d = 0;
        for (size_t k = 0; k < lens[a]; k++)
            if (!k || !ikv_key_eq(arrs[a][k], arrs[a][k - 1])) d++;
        counts[a] = d;
    }
    *n_private = counts[0];
    *n_public = counts[1];
    *n_tenants = nt;
    free(tenants);
    free(priv);
    free(pub);
    ikv_seg_builder_destroy(b);
    free(lines);
    free(buf);
}

static void test_more_users_more_private_blocks(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.requests = 600;
    /* isolate the per-user content: no documents, no drift, single turns, 5 intents */
    o.docs_per_query = 0;
    o.drift = 0;
    o.turns = 1;
    o.intents = 5;
    o.novelty = 0;
    size_t p10, pub10, t10, p1k, pub1k, t1k;
    o.users = 10;
    count_blocks(&o, &p10, &pub10, &t10);
    o.users = 1000;
    count_blocks(&o, &p1k, &pub1k, &t1k);
    print_message("private blocks: %zu (10 users) %zu (1000 users)\n", p10, p1k);
    assert_int_equal(t10, 10);
    assert_true(t1k > 100);
    /* per user: 16 memory blocks + 2 query blocks per intent; 10 users reuse theirs */
    assert_true(p10 <= 10 * (16 + 5 * 2));
    assert_true(p10 >= 10 * 16);
    assert_true(p1k > 10 * p10);
    /* public blocks are the system + tool prefix of each app (15 blocks): not per user */
    assert_int_equal(pub10 % 15, 0);
    assert_int_equal(pub1k, 4 * 15);
    assert_true(pub10 <= pub1k);
}

/* With one app, one intent and no novelty, every request shares the public system + tool
 * prefix; shared-first also shares the documents; personal-first diverges right after the
 * public prefix between tenants. Within a session, personal-first keeps the memory in the
 * common prefix of two turns with different documents; shared-first does not. */
static void test_layout_moves_divergence(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.apps = 1;
    o.intents = 1;
    o.novelty = 0;
    o.turns = 1;
    o.requests = 60;
    const size_t B = 16, pub_pf = (200 + 40) / B, pub_sf = (200 + 40 + 4 * 100) / B;
    for (int layout = 0; layout < 2; layout++) {
        o.layout = (ikv_gen_layout)layout;
        char *buf = gen_mem(&o, NULL);
        char *lines[100];
        size_t nl = split_lines(buf, lines, 100);
        ikv_seg_builder *b;
        assert_int_equal(ikv_seg_builder_create(1, 16, &b), 0);
        ikv_key *first = NULL;
        size_t nfirst = 0;
        const char *t0 = NULL;
        line_req r0;
        memset(&r0, 0, sizeof r0);
        int checked = 0;
        for (size_t i = 1; i < nl; i++) {
            line_req r;
            parse_req(lines[i], &r);
            ikv_trace_request q;
            assert_int_equal(ikv_seg_build(b, r.tenant, r.segs, r.n, &q), 0);
            size_t want = layout == IKV_LAYOUT_SHARED_FIRST ? pub_sf : pub_pf;
            assert_int_equal(q.n_public_blocks, want);
            if (!first) {
                first = copy_keys(&q);
                nfirst = q.n_blocks;
                r0 = r;
                t0 = r0.tenant;
                continue;
            }
            if (strcmp(r.tenant, t0)) {
                assert_int_equal(common_prefix(first, nfirst, q.keys, q.n_blocks), want);
                checked++;
            }
            cJSON_Delete(r.j);
        }
        assert_true(checked > 10);
        cJSON_Delete(r0.j);
        free(first);
        ikv_seg_builder_destroy(b);
        free(buf);
    }
    /* within a session, documents change every turn (all intents novel) */
    o.intents = 1000;
    o.novelty = 1;
    o.turns = 3;
    o.corpus = 1000000;
    o.doc_alpha = 0;
    o.users = 2;
    o.requests = 30;
    for (int layout = 0; layout < 2; layout++) {
        o.layout = (ikv_gen_layout)layout;
        char *buf = gen_mem(&o, NULL);
        char *lines[100];
        size_t nl = split_lines(buf, lines, 100);
        ikv_seg_builder *b;
        assert_int_equal(ikv_seg_builder_create(1, 16, &b), 0);
        /* turn 0 and turn 1 of session 1 */
        ikv_key *k0 = NULL;
        size_t n0 = 0;
        int found = 0;
        for (size_t i = 1; i < nl && found < 2; i++) {
            line_req r;
            parse_req(lines[i], &r);
            if (r.session == 1) {
                ikv_trace_request q;
                assert_int_equal(ikv_seg_build(b, r.tenant, r.segs, r.n, &q), 0);
                if (r.turn == 0) {
                    k0 = copy_keys(&q);
                    n0 = q.n_blocks;
                } else if (r.turn == 1 && k0) {
                    size_t cp = common_prefix(k0, n0, q.keys, q.n_blocks);
                    if (layout == IKV_LAYOUT_PERSONAL_FIRST)
                        assert_int_equal(cp, (200 + 40 + 256) / B); /* through memory */
                    else
                        assert_int_equal(cp, (200 + 40) / B); /* docs differ first */
                }
                found++;
            }
            cJSON_Delete(r.j);
        }
        assert_int_equal(found, 2);
        free(k0);
        ikv_seg_builder_destroy(b);
        free(buf);
    }
}

/* Between two consecutive sessions of a user exactly round(drift * items) memory items change
 * version; the first session is all v0; item sizes add up to memory_tokens. */
static void test_memory_drift_fraction(void **st) {
    (void)st;
    const double drifts[3] = {0.0, 0.25, 0.5};
    for (int d = 0; d < 3; d++) {
        ikv_gen_opts o;
        small_opts(&o);
        o.users = 5;
        o.turns = 1;
        o.requests = 100;
        o.memory_tokens = 1000; /* 10 items of 100: the last one too */
        o.memory_item_tokens = 100;
        o.drift = drifts[d];
        o.layout = d == 2 ? IKV_LAYOUT_SHARED_FIRST : IKV_LAYOUT_PERSONAL_FIRST;
        char *buf = gen_mem(&o, NULL);
        char *lines[200];
        size_t nl = split_lines(buf, lines, 200);
        char prev[5][10][32];
        int seen[5] = {0};
        size_t pairs = 0;
        for (size_t i = 1; i < nl; i++) {
            line_req r;
            parse_req(lines[i], &r);
            int u = atoi(r.tenant + 1);
            assert_true(u >= 0 && u < 5);
            char cur[10][32];
            size_t items = 0, mem_tokens = 0;
            for (size_t k = 0; k < r.n; k++)
                if (r.segs[k].kind == IKV_SEG_MEMORY) {
                    assert_true(items < 10);
                    snprintf(cur[items++], 32, "%s", r.segs[k].id);
                    mem_tokens += r.segs[k].tokens;
                }
            assert_int_equal(items, 10);
            assert_int_equal(mem_tokens, 1000);
            if (!seen[u]) {
                for (size_t k = 0; k < 10; k++)
                    assert_non_null(strstr(cur[k], ".v0"));
            } else {
                size_t changed = 0;
                for (size_t k = 0; k < 10; k++)
                    changed += strcmp(cur[k], prev[u][k]) != 0;
                assert_int_equal(changed, (size_t)floor(drifts[d] * 10 + 0.5));
                pairs++;
            }
            seen[u] = 1;
            memcpy(prev[u], cur, sizeof cur);
            cJSON_Delete(r.j);
        }
        assert_true(pairs > 50);
        free(buf);
    }
    /* uneven items: 1000 tokens in items of 128 -> 8 items, the last 104 */
    ikv_gen_opts o;
    small_opts(&o);
    o.memory_tokens = 1000;
    o.memory_item_tokens = 128;
    o.requests = 5;
    char *buf = gen_mem(&o, NULL);
    char *lines[10];
    split_lines(buf, lines, 10);
    line_req r;
    parse_req(lines[1], &r);
    size_t items = 0;
    for (size_t k = 0; k < r.n; k++)
        if (r.segs[k].kind == IKV_SEG_MEMORY) {
            items++;
            assert_int_equal(r.segs[k].tokens, items == 8 ? 104 : 128);
        }
    assert_int_equal(items, 8);
    cJSON_Delete(r.j);
    free(buf);
}

/* History grows: turn t repeats the t earlier queries verbatim, each followed by its answer. */
static void test_history_grows(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.turns = 5;
    o.requests = 200;
    char *buf = gen_mem(&o, NULL);
    char **lines = calloc(300, sizeof *lines);
    size_t nl = split_lines(buf, lines, 300);
    size_t checked = 0;
    for (size_t i = 1; i < nl; i++) {
        line_req r;
        parse_req(lines[i], &r);
        size_t nh = 0, nq = 0;
        for (size_t k = 0; k < r.n; k++) {
            nh += r.segs[k].kind == IKV_SEG_HISTORY;
            nq += r.segs[k].kind == IKV_SEG_QUERY;
        }
        assert_int_equal(nh, r.turn);
        assert_int_equal(nq, r.turn + 1);
        assert_int_equal(r.segs[r.n - 1].kind, IKV_SEG_QUERY);
        checked += r.turn > 1;
        cJSON_Delete(r.j);
    }
    assert_true(checked > 20);
    free(lines);
    free(buf);
}

/* With user_rate the load grows with the number of users: ten times the users, about ten
 * times the arrival rate (same request count, so about a tenth of the time span). */
static void test_user_rate_scales_load(void **st) {
    (void)st;
    double span[2];
    for (int k = 0; k < 2; k++) {
        ikv_gen_opts o;
        small_opts(&o);
        o.rate = 1000; /* ignored when user_rate is set */
        o.user_rate = 36;
        o.users = k ? 1000 : 100; /* 1 or 10 requests per second */
        o.requests = 2000;
        char *buf = gen_mem(&o, NULL);
        char **lines = calloc(2100, sizeof *lines);
        size_t nl = split_lines(buf, lines, 2100);
        assert_int_equal(nl, 2001);
        line_req r;
        parse_req(lines[nl - 1], &r);
        span[k] = r.time;
        cJSON_Delete(r.j);
        free(lines);
        free(buf);
    }
    /* 2000 requests at 1/s and 10/s: about 2000 s and 200 s (Poisson noise is a few %) */
    assert_true(span[0] > 1500 && span[0] < 2600);
    assert_true(span[1] > 150 && span[1] < 260);
}

static void test_bad_knobs(void **st) {
    (void)st;
    ikv_gen_opts o;
    ikv_gen_opts_default(&o);
    assert_int_equal(ikv_gen_opts_check(&o), 0);
    o.drift = 1.5;
    assert_int_equal(ikv_gen_opts_check(&o), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "drift"));
    ikv_gen_opts_default(&o);
    o.docs_per_query = 20;
    o.corpus = 10;
    assert_int_equal(ikv_gen_opts_check(&o), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "corpus"));
    ikv_gen_opts_default(&o);
    o.requests = 0;
    assert_int_equal(ikv_gen_opts_check(&o), IKV_EPARAM);
    ikv_gen_opts_default(&o);
    o.users = 0;
    assert_int_equal(ikv_gen_write(&o, stdout, NULL, NULL), IKV_EPARAM);
}

/* A tiny corpus with a steep Zipf still yields k distinct documents per query. */
static void test_docs_distinct(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.corpus = 5;
    o.docs_per_query = 5;
    o.doc_alpha = 6;
    o.requests = 50;
    char *buf = gen_mem(&o, NULL);
    char *lines[100];
    size_t nl = split_lines(buf, lines, 100);
    for (size_t i = 1; i < nl; i++) {
        line_req r;
        parse_req(lines[i], &r);
        int seen[5] = {0};
        for (size_t k = 0; k < r.n; k++)
            if (r.segs[k].kind == IKV_SEG_DOC) {
                int d = atoi(r.segs[k].id + 1);
                assert_true(d >= 0 && d < 5);
                assert_int_equal(seen[d], 0);
                seen[d] = 1;
            }
        for (int d = 0; d < 5; d++)
            assert_int_equal(seen[d], 1);
        cJSON_Delete(r.j);
    }
    free(buf);
}

/* One try of ikv_gen_write into memory for tu_alloc_fail_each. */
static int try_gen_write(void *ctx) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = ikv_gen_write(ctx, f, NULL, NULL);
    fclose(f);
    free(buf);
    return rc;
}

static void test_gen_alloc_failure(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.requests = 50;
    tu_alloc_fail_each(try_gen_write, &o, SIZE_MAX);
}

static void test_write_file_atomic(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.requests = 10;
    const char *p = tmp_path("atomic.jsonl");
    uint64_t n = 0;
    assert_int_equal(ikv_gen_write_file(&o, p, NULL, &n), 0);
    assert_int_equal(n, 10);
    assert_int_equal(access(p, R_OK), 0);
    /* bad knobs: the old file stays as it was */
    o.users = 0;
    assert_int_equal(ikv_gen_write_file(&o, p, NULL, NULL), IKV_EPARAM);
    assert_int_equal(access(p, R_OK), 0);
    unlink(p);
    o.users = 5;
    assert_int_equal(ikv_gen_write_file(&o, "/nonexistent-dir/x.jsonl", NULL, NULL), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "/nonexistent-dir/x.jsonl"));
}

/* ---- reader ------------------------------------------------------------------------------ */

static void test_reader_round_trip(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.block_tokens = 32;
    o.requests = 300;
    const char *p = tmp_path("rt.jsonl");
    assert_int_equal(ikv_gen_write_file(&o, p, NULL, NULL), 0);
    char *buf = gen_mem(&o, NULL);
    char **lines = calloc(400, sizeof *lines);
    size_t nl = split_lines(buf, lines, 400);
    assert_int_equal(nl, 301);

    ikv_trace_opts to;
    memset(&to, 0, sizeof to);
    to.seed = 1;
    ikv_trace *t = NULL;
    assert_int_equal(ikv_trace_open(p, &to, &t), 0); /* auto-detected */
    assert_int_equal(ikv_trace_format_of(t), IKV_TRACE_SEGMENTS);
    assert_int_equal(ikv_trace_block_tokens(t), 32);
    ikv_seg_builder *b;
    assert_int_equal(ikv_seg_builder_create(1, 32, &b), 0);
    ikv_trace_request q;
    size_t i = 0;
    int rc;
    char tenants[400][16];
    size_t nt = 0;
    while ((rc = ikv_trace_next(t, &q)) == 1) {
        assert_true(i + 1 < nl);
        line_req r;
        parse_req(lines[i + 1], &r);
        uint32_t sum = 0;
        for (size_t k = 0; k < r.n; k++)
            sum += r.segs[k].tokens;
        assert_int_equal(q.index, i);
        assert_int_equal(q.input_tokens, sum);
        assert_int_equal(q.output_tokens, o.output_tokens);
        assert_true(fabs(q.time - r.time) < 1e-9);
        assert_int_equal(q.session, r.session);
        /* blocks: ceil(tokens / B), all full but the last; leading public = floor(pub / B) */
        assert_int_equal(q.n_blocks, (sum + 31) / 32);
        uint32_t s2 = 0;
        for (size_t k = 0; k < q.n_blocks; k++) {
            if (k + 1 < q.n_blocks) assert_int_equal(q.ntokens[k], 32);
            s2 += q.ntokens[k];
        }
        assert_int_equal(s2, sum);
        assert_int_equal(q.n_public_blocks, (200 + 40) / 32);
        /* one chunk per doc (100 tokens >= 32), floor or floor-1 whole blocks */
        assert_int_equal(q.n_chunks, o.docs_per_query);
        for (size_t c = 0; c < q.n_chunks; c++) {
            assert_true(q.chunks[c].count == 3 || q.chunks[c].count == 2);
            assert_int_equal(q.chunks[c].tokens, 100);
        }
        /* keys as the builder makes them (same seed) */
        ikv_key *k1 = copy_keys(&q);
        ikv_trace_request q2;
        assert_int_equal(ikv_seg_build(b, r.tenant, r.segs, r.n, &q2), 0);
        for (size_t k = 0; k < q.n_blocks; k++)
            assert_true(ikv_key_eq(k1[k], q2.keys[k]));
        free(k1);
        /* dense tenant indices in order of first appearance */
        size_t ti = 0;
        while (ti < nt && strcmp(tenants[ti], r.tenant))
            ti++;
        if (ti == nt) snprintf(tenants[nt++], 16, "%s", r.tenant);
        assert_int_equal(q.tenant, ti);
        cJSON_Delete(r.j);
        i++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(i, 300);
    assert_int_equal(ikv_trace_tenants(t), nt);
    assert_int_equal(ikv_trace_skipped(t), 0);
    /* rewind gives the same first request */
    assert_int_equal(ikv_trace_rewind(t), 0);
    assert_int_equal(ikv_trace_next(t, &q), 1);
    assert_int_equal(q.index, 0);
    line_req r;
    parse_req(lines[1], &r);
    assert_true(fabs(q.time - r.time) < 1e-9);
    cJSON_Delete(r.j);
    ikv_trace_close(t);
    ikv_seg_builder_destroy(b);
    free(lines);
    free(buf);
    unlink(p);
}

static const char *good =
    "{\"time\":1,\"tenant\":\"a\",\"session\":1,\"output\":5,\"segments\":[{\"kind\":\"system\","
    "\"id\":\"s\",\"tokens\":40,\"public\":true},{\"kind\":\"query\",\"id\":\"q\",\"tokens\":9}]}"
    "\n";

static void expect_strict_error(const char *text, const char *where, const char *what) {
    const char *p = tmp_path("bad.jsonl");
    write_file(p, text);
    ikv_trace_opts to;
    memset(&to, 0, sizeof to);
    to.format = IKV_TRACE_SEGMENTS;
    to.strict = 1;
    ikv_trace *t = NULL;
    int rc = ikv_trace_open(p, &to, &t);
    ikv_trace_request q;
    if (rc == 0) {
        while ((rc = ikv_trace_next(t, &q)) == 1) {
        }
        ikv_trace_close(t);
    }
    assert_int_equal(rc, IKV_EFORMAT);
    char want[300];
    snprintf(want, sizeof want, "%s%s", p, where);
    if (!strstr(ikv_errdetail(), want) || !strstr(ikv_errdetail(), what))
        fail_msg("expected '%s' ... '%s' in '%s'", want, what, ikv_errdetail());
    unlink(p);
}

static void test_malformed_lines(void **st) {
    (void)st;
    char text[4096];
    const char *hdr = "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":16}\n";
    struct {
        const char *line, *what;
    } cases[] = {
        {"{\"time\":2,\"tenant\":\"a\",\"segments\":[{\"kind\":\"blob\",\"id\":\"x\",\"tokens\":3}]"
         "}",
         "\"kind\""},
        {"{\"time\":2,\"tenant\":\"a\",\"segments\":[{\"kind\":\"doc\",\"id\":\"x\",\"tokens\":0}]"
         "}",
         "segments[0] \"tokens\""},
        {"{\"time\":2,\"tenant\":\"a\",\"segments\":[{\"kind\":\"doc\",\"tokens\":4}]}", "\"id\""},
        {"{\"time\":2,\"segments\":[{\"kind\":\"doc\",\"id\":\"x\",\"tokens\":4}]}", "\"tenant\""},
        {"{\"time\":0.5,\"tenant\":\"a\",\"segments\":[{\"kind\":\"doc\",\"id\":\"x\",\"tokens\":4}"
         "]}",
         "goes back"},
        {"{\"time\":2,\"tenant\":\"a\",\"segments\":[]}", "empty"},
        {"{\"time\":2,\"tenant\":\"a\",\"segments\":[{\"kind\":\"doc\",\"id\":\"x\",\"tokens\":4,"
         "\"public\":1}]}",
         "\"public\""},
        {"{\"time\":2,\"tenant\":\"a\",\"segments\":[{\"kind\":\"doc\",\"id\":\"x\",\"tokens\":9,",
         "JSON"},
        {"{\"format\":\"isokv-segments\",\"version\":1}", "header"},
        {"{\"time\":-1,\"tenant\":\"a\",\"segments\":[{\"kind\":\"doc\",\"id\":\"x\",\"tokens\":4}]"
         "}",
         "\"time\""},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        /* header (1), good (2), bad (3) */
        snprintf(text, sizeof text, "%s%s%s\n%s", hdr, good, cases[c].line, good);
        expect_strict_error(text, ":3:", cases[c].what);
    }
    /* a bad header is fatal at open, with its line */
    expect_strict_error("{\"format\":\"isokv-segments\",\"version\":2}\n", ":1:", "version");

    /* default mode: skipped and counted, the first message kept */
    snprintf(text, sizeof text, "%s%s%s\n%s%s\n", good, good, cases[0].line, good, cases[3].line);
    const char *p = tmp_path("skip.jsonl");
    write_file(p, text);
    ikv_trace *t = NULL;
    assert_int_equal(ikv_trace_open(p, NULL, &t), 0); /* no header: detected by "segments" */
    assert_int_equal(ikv_trace_block_tokens(t), 16);
    ikv_trace_request q;
    int n = 0, rc;
    while ((rc = ikv_trace_next(t, &q)) == 1)
        n++;
    assert_int_equal(rc, 0);
    assert_int_equal(n, 3);
    assert_int_equal(ikv_trace_skipped(t), 2);
    char want[300];
    snprintf(want, sizeof want, "%s:3:", p);
    assert_non_null(strstr(ikv_trace_first_error(t), want));
    ikv_trace_close(t);
    unlink(p);
}

/* One try of opening and reading a whole trace for tu_alloc_fail_each; got counts requests. */
typedef struct read_try {
    const char *path;
    uint64_t got;
} read_try;

static int try_read(void *ctx) {
    read_try *r = ctx;
    ikv_trace *t = NULL;
    ikv_trace_request q;
    r->got = 0;
    int rc = ikv_trace_open(r->path, NULL, &t);
    while (rc == 0 && (rc = ikv_trace_next(t, &q)) == 1) {
        r->got++;
        rc = 0;
    }
    ikv_trace_close(t);
    return rc;
}

/* Every allocation failure while opening or reading gives IKV_ENOMEM (never a crash, never a
 * wrong request), and a run with memory reads everything. */
static void test_reader_alloc_failure(void **st) {
    (void)st;
    ikv_gen_opts o;
    small_opts(&o);
    o.requests = 40;
    const char *p = tmp_path("oom.jsonl");
    assert_int_equal(ikv_gen_write_file(&o, p, NULL, NULL), 0);
    read_try r = {p, 0};
    size_t n = tu_alloc_fail_each(try_read, &r, SIZE_MAX);
    assert_int_equal(r.got, 40);
    assert_true(n > 3);
    unlink(p);
}

/* ---- CLI --------------------------------------------------------------------------------- */

/* Runs isokv (IKV_BIN) with the arguments, no shell, output to /dev/null; returns its exit
 * status. */
#define run_cli(...) tu_run_isokv((const char *const[]){__VA_ARGS__, NULL}, NULL, NULL, 60)

static void test_cli(void **st) {
    (void)st;
    const char *p = tmp_path("cli.jsonl");
    assert_int_equal(run_cli("gen", "--help"), 0);
    assert_int_equal(run_cli("gen"), 2);                                      /* no -o */
    assert_int_equal(run_cli("gen", "-o", "/tmp/x", "--users"), 2);           /* missing value */
    assert_int_equal(run_cli("gen", "-o", "/tmp/x", "--users", "12x"), 2);    /* bad number */
    assert_int_equal(run_cli("gen", "-o", "/tmp/x", "--frobnicate", "3"), 2); /* unknown knob */
    assert_int_equal(run_cli("gen", "-o", "/tmp/x", "--drift", "2"), 2);      /* out of range */
    assert_int_equal(run_cli("gen", "-o", "/tmp/x", "--layout", "sideways"), 2);
    assert_int_equal(run_cli("gen", "-q", "-o", "/nonexistent-dir/x.jsonl", "--requests", "5"), 1);
    assert_int_equal(run_cli("gen", "-q", "-o", p, "--users", "1k", "--requests", "50",
                             "--layout=shared-first", "--private-docs"),
                     0);
    /* the file is what the library writes for the same knobs */
    ikv_gen_opts o;
    ikv_gen_opts_default(&o);
    o.users = 1000;
    o.requests = 50;
    o.layout = IKV_LAYOUT_SHARED_FIRST;
    o.private_docs = 1;
    char *want = gen_mem(&o, NULL);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    size_t cap = strlen(want) + 16;
    char *got = calloc(1, cap);
    size_t n = fread(got, 1, cap - 1, f);
    fclose(f);
    assert_int_equal(n, strlen(want));
    assert_string_equal(got, want);
    free(got);
    free(want);
    unlink(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens_match_documented_formula),
        cmocka_unit_test(test_public_prefix_and_straddle),
        cmocka_unit_test(test_private_segments_never_share_keys),
        cmocka_unit_test(test_chunk_doc_keys_position_independent),
        cmocka_unit_test(test_build_rejects_bad_input),
        cmocka_unit_test(test_build_alloc_failure),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_request_count_is_a_prefix),
        cmocka_unit_test(test_more_users_more_private_blocks),
        cmocka_unit_test(test_layout_moves_divergence),
        cmocka_unit_test(test_memory_drift_fraction),
        cmocka_unit_test(test_history_grows),
        cmocka_unit_test(test_user_rate_scales_load),
        cmocka_unit_test(test_bad_knobs),
        cmocka_unit_test(test_docs_distinct),
        cmocka_unit_test(test_gen_alloc_failure),
        cmocka_unit_test(test_write_file_atomic),
        cmocka_unit_test(test_reader_round_trip),
        cmocka_unit_test(test_malformed_lines),
        cmocka_unit_test(test_reader_alloc_failure),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
