/*
 * Tests of the simulator: trace readers, malformed input, replay against an independent
 * brute-force oracle, timed-mode invariants, load vs recompute, and the CLI's JSON and sweep.
 *
 * Golden numbers are not typed in: each is computed here by a deliberately naive replay that
 * shares no code with src/sim/ or the cache core — it parses the slice itself with cJSON, keeps
 * resident blocks in a flat array (id, parent, last use), finds blocks by linear scan and evicts
 * the least recently used leaf that the current request is not using. The simulator's hit tokens
 * and evictions must equal it exactly, at several capacities.
 *
 * Data: tests/data/mooncake_conv_300.jsonl (the first 300 lines of the Mooncake conversation
 * trace) and tests/data/weka_5conv.jsonl.gz (5 small WEKA conversations, one with subagents);
 * sources and licences in tests/data/README.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "isokv/gen.h"
#include "isokv/sim.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MOONCAKE "tests/data/mooncake_conv_300.jsonl"
#define WEKA "tests/data/weka_5conv.jsonl.gz"

static char tmpdir[256];

static int setup_all(void **state) {
    (void)state;
    const char *src = getenv("IKV_SOURCE_DIR");
    if (src && chdir(src) != 0) return -1;
    return tu_tmpdir(tmpdir, sizeof tmpdir, "sim");
}

static int teardown_all(void **state) {
    (void)state;
    return tu_rmtree(tmpdir);
}

static void tmp_path(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", tmpdir, name);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Reads a whole (gzip or plain) file. */
static char *slurp(const char *path, size_t *len) {
    gzFile g = gzopen(path, "rb");
    assert_non_null(g);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int k;
    while ((k = gzread(g, buf + n, (unsigned)(cap - n - 1))) > 0) {
        n += (size_t)k;
        if (cap - n < 2) buf = realloc(buf, cap *= 2);
    }
    gzclose(g);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- the independent workload model: requests as (namespace, id) chains -------------------- */

typedef struct oreq {
    double time;
    int conv, order;
    uint64_t in, out;
    uint64_t *ids; /* ns << 40 | id */
    size_t n;
} oreq;

typedef struct owork {
    oreq *r;
    size_t n, cap;
    uint32_t bt;
} owork;

static void push_req(owork *w, double time, int conv, int order, uint64_t in, uint64_t out,
                     const cJSON *ids, uint64_t ns) {
    if (w->n == w->cap) w->r = realloc(w->r, (w->cap = w->cap ? 2 * w->cap : 64) * sizeof *w->r);
    oreq *q = &w->r[w->n++];
    q->time = time;
    q->conv = conv;
    q->order = order;
    q->in = in;
    q->out = out;
    q->n = (size_t)cJSON_GetArraySize(ids);
    q->ids = malloc((q->n + 1) * sizeof *q->ids);
    for (size_t i = 0; i < q->n; i++)
        q->ids[i] = ns << 40 | (uint64_t)cJSON_GetArrayItem(ids, (int)i)->valuedouble;
}

static owork load_mooncake(void) {
    owork w = {.bt = 512};
    size_t len;
    char *text = slurp(MOONCAKE, &len);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        push_req(&w, cJSON_GetObjectItem(j, "timestamp")->valuedouble / 1000.0, 0, (int)w.n,
                 (uint64_t)cJSON_GetObjectItem(j, "input_length")->valuedouble,
                 (uint64_t)cJSON_GetObjectItem(j, "output_length")->valuedouble,
                 cJSON_GetObjectItem(j, "hash_ids"), 0);
        cJSON_Delete(j);
    }
    free(text);
    return w;
}

static void weka_walk(owork *w, const cJSON *reqs, double base, int conv, int *order) {
    const cJSON *r;
    cJSON_ArrayForEach(r, reqs) {
        double t = cJSON_GetObjectItem(r, "t")->valuedouble;
        const cJSON *type = cJSON_GetObjectItem(r, "type");
        if (type && !strcmp(type->valuestring, "subagent")) {
            weka_walk(w, cJSON_GetObjectItem(r, "requests"), base + t, conv, order);
            continue;
        }
        push_req(w, base + t, conv, (*order)++, (uint64_t)cJSON_GetObjectItem(r, "in")->valuedouble,
                 (uint64_t)cJSON_GetObjectItem(r, "out")->valuedouble,
                 cJSON_GetObjectItem(r, "hash_ids"), (uint64_t)conv + 1);
    }
}

static int cmp_oreq(const void *a, const void *b) {
    const oreq *x = a, *y = b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    if (x->conv != y->conv) return x->conv - y->conv;
    return x->order - y->order;
}

static owork load_weka(int max_conv, double window) {
    owork w = {.bt = 64};
    size_t len;
    char *text = slurp(WEKA, &len);
    int conv = 0;
    for (char *line = strtok(text, "\n"); line && (!max_conv || conv < max_conv);
         line = strtok(NULL, "\n"), conv++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        int order = 0;
        weka_walk(&w, cJSON_GetObjectItem(j, "requests"), 0, conv, &order);
        cJSON_Delete(j);
    }
    for (size_t i = 0; i < w.n; i++) w.r[i].time += w.r[i].conv * window / conv;
    qsort(w.r, w.n, sizeof *w.r, cmp_oreq);
    free(text);
    return w;
}

static void free_work(owork *w) {
    for (size_t i = 0; i < w->n; i++) free(w->r[i].ids);
    free(w->r);
}

/* ---- the brute-force LRU oracle ----------------------------------------------------------- */

typedef struct oracle_out {
    uint64_t hit_tokens, evictions, hit_blocks;
} oracle_out;

/* Order-mode replay with `cap` blocks: match the longest resident prefix, touch it, insert the
 * rest evicting least-recently-used leaves (never the block the request just placed); stop
 * inserting when no leaf is evictable. cap = 0: unlimited. */
static oracle_out oracle_lru(const owork *w, size_t cap) {
    size_t room = cap;
    if (!room)
        for (size_t i = 0; i < w->n; i++) room += w->r[i].n;
    uint64_t *id = malloc(room * sizeof *id);
    long *parent = malloc(room * sizeof *parent);
    uint64_t *last = malloc(room * sizeof *last);
    size_t *kids = calloc(room, sizeof *kids);
    int *live = calloc(room, sizeof *live);
    size_t used = 0; /* slots [0, used) are live until the cache is full, then all are */
    oracle_out o = {0};
    for (size_t r = 0; r < w->n; r++) {
        const oreq *q = &w->r[r];
        uint64_t now = r + 1;
        long prev = -1;
        size_t k = 0;
        for (; k < q->n; k++) {
            long f = -1;
            for (size_t s = 0; s < used && f < 0; s++)
                if (live[s] && id[s] == q->ids[k]) f = (long)s;
            if (f < 0) break;
            last[f] = now;
            prev = f;
        }
        uint64_t hit = k * (uint64_t)w->bt;
        o.hit_tokens += hit < q->in ? hit : q->in;
        o.hit_blocks += k;
        for (size_t i = k; i < q->n; i++) {
            long slot = -1;
            if (used < room) {
                slot = (long)used++;
            } else {
                long victim = -1; /* least recently used leaf, not the request's own tail */
                for (size_t s = 0; s < room; s++)
                    if (live[s] && (long)s != prev && kids[s] == 0 &&
                        (victim < 0 || last[s] < last[victim]))
                        victim = (long)s;
                if (victim < 0) break; /* everything left is this request's chain */
                if (parent[victim] >= 0) kids[parent[victim]]--;
                o.evictions++;
                slot = victim;
            }
            id[slot] = q->ids[i];
            parent[slot] = prev;
            last[slot] = now;
            live[slot] = 1;
            kids[slot] = 0;
            if (prev >= 0) kids[prev]++;
            prev = slot;
        }
    }
    free(id);
    free(parent);
    free(last);
    free(kids);
    free(live);
    return o;
}

/* ---- helpers around the library ----------------------------------------------------------- */

static int replay_file(const char *path, const ikv_trace_opts *to, const ikv_replay_opts *ro,
                       ikv_replay_result *r) {
    ikv_trace *t;
    int rc = ikv_trace_open(path, to, &t);
    if (rc) return rc;
    rc = ikv_replay(t, ro, r);
    ikv_trace_close(t);
    return rc;
}

/* ---- readers ------------------------------------------------------------------------------ */

static void test_mooncake_reader(void **state) {
    (void)state;
    owork w = load_mooncake();
    ikv_trace *t;
    ikv_trace_opts to = {0};
    assert_int_equal(ikv_trace_open(MOONCAKE, &to, &t), 0);
    assert_int_equal(ikv_trace_format_of(t), IKV_TRACE_MOONCAKE);
    assert_int_equal(ikv_trace_block_tokens(t), 512);
    ikv_trace_request q;
    size_t n = 0;
    int rc;
    while ((rc = ikv_trace_next(t, &q)) == 1) {
        const oreq *o = &w.r[n];
        assert_int_equal(q.index, n);
        assert_int_equal(q.input_tokens, o->in);
        assert_int_equal(q.output_tokens, o->out);
        assert_int_equal(q.n_blocks, o->n);
        assert_true(fabs(q.time - o->time) < 1e-9);
        uint32_t sum = 0;
        for (size_t i = 0; i < q.n_blocks; i++) {
            ikv_key k = ikv_key_from_id(0, 0, o->ids[i] & ((1ull << 40) - 1));
            assert_true(ikv_key_eq(q.keys[i], k));
            sum += q.ntokens[i];
        }
        assert_int_equal(sum, q.input_tokens); /* last block partial */
        n++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, 300);
    assert_int_equal(ikv_trace_skipped(t), 0);
    /* rewind gives the same first request */
    assert_int_equal(ikv_trace_rewind(t), 0);
    assert_int_equal(ikv_trace_next(t, &q), 1);
    assert_int_equal(q.index, 0);
    assert_int_equal(q.input_tokens, w.r[0].in);
    ikv_trace_close(t);
    free_work(&w);
}

static void test_weka_reader(void **state) {
    (void)state;
    for (int nconv = 0; nconv <= 3; nconv += 3) {
        owork w = load_weka(nconv, 600);
        ikv_trace *t;
        ikv_trace_opts to = {.conversations = (uint64_t)nconv, .window = 600};
        assert_int_equal(ikv_trace_open(WEKA, &to, &t), 0);
        assert_int_equal(ikv_trace_format_of(t), IKV_TRACE_WEKA);
        assert_int_equal(ikv_trace_block_tokens(t), 64);
        assert_int_equal(ikv_trace_tenants(t), nconv ? 3 : 5);
        assert_int_equal(ikv_trace_count_hint(t), w.n);
        ikv_trace_request q;
        size_t n = 0;
        while (ikv_trace_next(t, &q) == 1) {
            const oreq *o = &w.r[n];
            assert_true(fabs(q.time - o->time) < 1e-9);
            assert_int_equal(q.tenant, o->conv);
            assert_int_equal(q.input_tokens, o->in);
            assert_int_equal(q.n_blocks, o->n);
            assert_int_equal(q.n_blocks, q.input_tokens / 64); /* only full blocks */
            for (size_t i = 0; i < q.n_blocks; i++)
                assert_true(ikv_key_eq(q.keys[i], ikv_key_from_id(0, (uint64_t)o->conv + 1,
                                                                  o->ids[i] & ((1ull << 40) - 1))));
            n++;
        }
        assert_int_equal(n, w.n);
        ikv_trace_close(t);
        free_work(&w);
    }
    /* the slice's subagent requests are there: conversation 4 has nested requests */
    owork all = load_weka(0, 3600);
    assert_true(all.n > 80);
    free_work(&all);
}

/* ---- malformed, empty, truncated ---------------------------------------------------------- */

static const char *good1 = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n";
static const char *good2 = "{\"timestamp\": 10, \"input_length\": 512, \"output_length\": 5, \"hash_ids\": [1]}\n";

static void test_malformed_lines(void **state) {
    (void)state;
    char path[512], text[2048];
    tmp_path(path, sizeof path, "bad.jsonl");
    snprintf(text, sizeof text, "%s%s%s%s%s%s", good1,
             "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2\n", /* 2: bad JSON */
             "{\"timestamp\": 6, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1]}\n", /* 3: count */
             "\n",                                                                                   /* 4: blank */
             "{\"timestamp\": 7, \"input_length\": 600, \"hash_ids\": [1, 2]}\n",                   /* 5: field */
             good2);
    write_file(path, text);
    ikv_trace *t;
    ikv_trace_opts to = {0};
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    ikv_trace_request q;
    int n = 0, rc;
    while ((rc = ikv_trace_next(t, &q)) == 1) n++;
    assert_int_equal(rc, 0);
    assert_int_equal(n, 2);
    assert_int_equal(ikv_trace_skipped(t), 3);
    char want[600];
    snprintf(want, sizeof want, "%s:2: invalid JSON", path);
    assert_non_null(strstr(ikv_trace_first_error(t), want));
    ikv_trace_close(t);

    /* --strict: the first malformed line is fatal, with file:line */
    to.strict = 1;
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    assert_int_equal(ikv_trace_next(t, &q), 1);
    assert_int_equal(ikv_trace_next(t, &q), IKV_EFORMAT);
    snprintf(want, sizeof want, "%s:2:", path);
    assert_non_null(strstr(ikv_errdetail(), want));
    ikv_trace_close(t);

    /* the id-count check names the line */
    snprintf(text, sizeof text, "%s%s", good1,
             "{\"timestamp\": 6, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1]}\n");
    write_file(path, text);
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    assert_int_equal(ikv_trace_next(t, &q), 1);
    assert_int_equal(ikv_trace_next(t, &q), IKV_EFORMAT);
    snprintf(want, sizeof want, "%s:2: 1 hash_ids for input_length 600", path);
    assert_non_null(strstr(ikv_errdetail(), want));
    ikv_trace_close(t);

    /* weka: a broken conversation is skipped whole, the others replayed */
    size_t len;
    char *wk = slurp(WEKA, &len);
    char *second = strchr(wk, '\n') + 1;
    char *p = strstr(second, "\"hash_ids\":[");
    assert_non_null(p);
    p[12] = 'x'; /* a non-number inside conversation 2's first id array */
    tmp_path(path, sizeof path, "bad_weka.jsonl");
    write_file(path, wk);
    free(wk);
    to.strict = 0;
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    assert_int_equal(ikv_trace_skipped(t), 1);
    assert_int_equal(ikv_trace_tenants(t), 4);
    snprintf(want, sizeof want, "%s:2: hash_ids", path);
    assert_non_null(strstr(ikv_trace_first_error(t), want));
    ikv_trace_close(t);
    to.strict = 1;
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), want));
}

static void test_empty_and_truncated(void **state) {
    (void)state;
    char path[512];
    ikv_trace *t = NULL;
    ikv_trace_opts to = {0};
    tmp_path(path, sizeof path, "empty.jsonl");
    write_file(path, "");
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EEMPTY);
    assert_non_null(strstr(ikv_errdetail(), "empty"));
    write_file(path, "\n  \n\n");
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EEMPTY);
    to.format = IKV_TRACE_WEKA;
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EEMPTY);
    to.format = IKV_TRACE_AUTO;
    assert_int_equal(ikv_trace_open("/nonexistent/x.jsonl", &to, &t), IKV_EIO);
    write_file(path, "hello world\n");
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EFORMAT);
    write_file(path, "{\"something\": 1}\n");
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "cannot detect"));

    /* a plain file cut inside its last line: the line is reported as truncated */
    char text[1024];
    snprintf(text, sizeof text, "%s{\"timestamp\": 10, \"input_len", good1);
    write_file(path, text);
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    ikv_trace_request q;
    assert_int_equal(ikv_trace_next(t, &q), 1);
    assert_int_equal(ikv_trace_next(t, &q), 0);
    assert_int_equal(ikv_trace_skipped(t), 1);
    assert_non_null(strstr(ikv_trace_first_error(t), "truncated"));
    ikv_trace_close(t);

    /* a gzip stream cut in half: IKV_ETRUNC, never a silent short trace */
    FILE *f = fopen(WEKA, "rb");
    assert_non_null(f);
    static unsigned char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    tmp_path(path, sizeof path, "cut.jsonl.gz");
    f = fopen(path, "wb");
    fwrite(buf, 1, n / 2, f);
    fclose(f);
    int rc = ikv_trace_open(path, &to, &t);
    if (rc == 0) { /* detection read only the start: the error comes while reading */
        while ((rc = ikv_trace_next(t, &q)) == 1) {
        }
        ikv_trace_close(t);
    }
    assert_int_equal(rc, IKV_ETRUNC);
    assert_non_null(strstr(ikv_errdetail(), "truncated"));
}

/* ---- golden hit ratios against the oracle ------------------------------------------------- */

static void check_golden(const char *path, owork *w, const uint64_t *caps, size_t ncap,
                         const ikv_trace_opts *to) {
    for (size_t i = 0; i < ncap; i++) {
        ikv_replay_opts ro;
        ikv_replay_opts_default(&ro);
        ro.capacity_tokens = caps[i];
        ro.check_every = 25;
        ikv_replay_result r;
        assert_int_equal(replay_file(path, to, &ro, &r), 0);
        oracle_out o = oracle_lru(w, caps[i] / w->bt);
        printf("  %s cap %llu tokens: sim hit %llu evict %llu | oracle hit %llu evict %llu\n", path,
               (unsigned long long)caps[i], (unsigned long long)r.prefix_hit_tokens,
               (unsigned long long)r.evictions, (unsigned long long)o.hit_tokens,
               (unsigned long long)o.evictions);
        assert_int_equal(r.requests, w->n);
        assert_int_equal(r.prefix_hit_tokens, o.hit_tokens);
        assert_int_equal(r.hit_blocks, o.hit_blocks);
        assert_int_equal(r.evictions, o.evictions);
        uint64_t in = 0;
        for (size_t k = 0; k < w->n; k++) in += w->r[k].in;
        assert_int_equal(r.input_tokens, in);
        assert_true(fabs(r.token_hit_ratio - (double)o.hit_tokens / (double)in) < 1e-12);
        ikv_replay_result_free(&r);
    }
}

static void test_golden_lru_mooncake(void **state) {
    (void)state;
    owork w = load_mooncake();
    const uint64_t caps[] = {1000000, 1500000, 3000000, 0};
    ikv_trace_opts to = {0};
    check_golden(MOONCAKE, &w, caps, 4, &to);
    /* the capacities give different answers (the test can tell them apart) */
    oracle_out a = oracle_lru(&w, 1000000 / 512), b = oracle_lru(&w, 3000000 / 512);
    assert_true(a.hit_tokens < b.hit_tokens);
    free_work(&w);
}

static void test_golden_lru_weka(void **state) {
    (void)state;
    owork w = load_weka(0, 3600);
    const uint64_t caps[] = {20000, 50000, 100000, 0};
    ikv_trace_opts to = {0};
    check_golden(WEKA, &w, caps, 4, &to);
    oracle_out a = oracle_lru(&w, 20000 / 64), b = oracle_lru(&w, 100000 / 64);
    assert_true(a.hit_tokens < b.hit_tokens);
    free_work(&w);
}

/* Every registered policy replays the slices with the core's invariants intact, never beats
 * the unlimited cache, and opt does at least as well as lru. */
static void test_policies(void **state) {
    (void)state;
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_result r, unl, lru, opt;
    ikv_replay_opts_default(&ro);
    assert_int_equal(replay_file(WEKA, &to, &ro, &unl), 0);
    ro.capacity_tokens = 50000;
    ro.check_every = 10;
    for (size_t i = 0; i < ikv_policy_count(); i++) {
        ro.policy = ikv_policy_name(i);
        assert_int_equal(replay_file(WEKA, &to, &ro, &r), 0);
        assert_true(r.hit_tokens <= unl.hit_tokens);
        if (!strcmp(ro.policy, "lru")) lru = r;
        else if (!strcmp(ro.policy, "opt")) opt = r;
        else ikv_replay_result_free(&r);
    }
    assert_true(opt.hit_tokens >= lru.hit_tokens);
    ikv_replay_result_free(&lru);
    ikv_replay_result_free(&opt);
    ikv_replay_result_free(&unl);
    ro.policy = "nosuchpolicy";
    assert_int_equal(replay_file(WEKA, &to, &ro, &r), IKV_EPOLICY);
}

/* ---- timed mode --------------------------------------------------------------------------- */

typedef struct timed_check {
    size_t n;
    double last_start;
    uint64_t lower, loaded, recomputed;
} timed_check;

static void on_timed(void *ctx, const ikv_trace_request *q, const ikv_request_outcome *o) {
    timed_check *c = ctx;
    (void)q;
    assert_true(o->queue >= 0);
    assert_true(o->prefill > 0);
    assert_true(o->ttft >= o->prefill);
    assert_true(fabs(o->ttft - (o->queue + o->prefill)) < 1e-9);
    assert_true(o->start >= o->arrival);
    assert_true(o->start >= c->last_start); /* FIFO */
    assert_true(o->decode >= 0);
    assert_true(o->lower_loaded + o->lower_recomputed <= o->matched);
    c->last_start = o->start;
    c->loaded += o->lower_loaded;
    c->recomputed += o->lower_recomputed;
    c->n++;
}

static void test_timed_invariants(void **state) {
    (void)state;
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.mode = IKV_REPLAY_TIMED;
    ro.capacity_tokens = 1500000;
    ro.check_every = 20;
    ro.on_request = on_timed;
    double prev_p50 = INFINITY;
    uint64_t hits_order = 0;
    {
        ikv_replay_opts oo;
        ikv_replay_opts_default(&oo);
        oo.capacity_tokens = ro.capacity_tokens;
        ikv_replay_result r;
        assert_int_equal(replay_file(MOONCAKE, &to, &oo, &r), 0);
        hits_order = r.prefix_hit_tokens;
        ikv_replay_result_free(&r);
    }
    for (uint32_t s = 1; s <= 16; s *= 2) {
        timed_check c = {0};
        ro.servers = s;
        ro.on_request_ctx = &c;
        ikv_replay_result r;
        assert_int_equal(replay_file(MOONCAKE, &to, &ro, &r), 0);
        assert_int_equal(c.n, 300);
        assert_true(r.ttft_p50 <= r.ttft_p90 && r.ttft_p90 <= r.ttft_p99);
        assert_true(r.queue_p50 >= 0 && r.queue_p50 <= r.queue_p99);
        assert_true(r.ttft_p50 > 0);
        /* more servers never increase the median TTFT on a fixed trace */
        assert_true(r.ttft_p50 <= prev_p50 + 1e-12);
        prev_p50 = r.ttft_p50;
        /* with one server every prefill ends before the next starts, so the cache sees the
         * accesses of order mode; with more, requests that meet a block another one is still
         * computing (pending cuts) lose those hits (on this trace and capacity, never more
         * than the evictions they avoid give back) */
        if (s == 1) {
            assert_int_equal(r.pending_cuts, 0);
            assert_int_equal(r.prefix_hit_tokens, hits_order);
        } else {
            assert_true(r.prefix_hit_tokens <= hits_order);
            assert_true(r.prefix_hit_tokens == hits_order || r.pending_cuts > 0);
        }
        ikv_replay_result_free(&r);
    }
}

/* ---- timed mode with measured service times: locks held and blocks pending --------------- */

typedef struct matched_log {
    size_t n, matched[8];
} matched_log;

static void on_matched(void *ctx, const ikv_trace_request *q, const ikv_request_outcome *o) {
    (void)q;
    matched_log *m = ctx;
    if (m->n < 8) m->matched[m->n] = o->matched;
    m->n++;
}

/* Replays `path` (one-token blocks, `cap` blocks) in order mode or timed mode with the trace's
 * service times; fills the per-request matched blocks and returns the result. */
static void replay_live(const char *path, uint64_t cap, int timed, matched_log *m,
                        ikv_replay_result *r) {
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.capacity_tokens = cap;
    ro.check_every = 1;
    ro.mode = timed ? IKV_REPLAY_TIMED : IKV_REPLAY_ORDER;
    ro.service_trace = timed;
    memset(m, 0, sizeof *m);
    ro.on_request = on_matched;
    ro.on_request_ctx = m;
    assert_int_equal(replay_file(path, &to, &ro, r), 0);
    assert_int_equal(m->n, 3);
}

#define SEGREQ(t, sess, ttft, lat, segs)                                                        \
    "{\"time\":" #t ",\"tenant\":\"u\",\"session\":" #sess ",\"output\":1,\"ttft_s\":" #ttft     \
    ",\"latency_s\":" #lat ",\"segments\":[" segs "]}\n"
#define SEG(id) "{\"kind\":\"history\",\"id\":\"" id "\",\"tokens\":1}"

static void test_timed_locks_and_pending(void **state) {
    (void)state;
    char path[512];
    matched_log m;
    ikv_replay_result r;
    /* Locks: A runs until t = 10 holding [a, ab] in a 3-block cache. B's insertion finds one
     * free block (the rest of its prompt is not cached: insert_full) instead of evicting A's
     * prefix, so C, sharing A's prefix, hits both blocks. In order mode B evicts part of A's
     * chain and C hits less. */
    tmp_path(path, sizeof path, "locks.jsonl");
    write_file(path, "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":1}\n"
                     SEGREQ(0, 1, 0.1, 10, SEG("a") "," SEG("b"))
                     SEGREQ(1, 2, 0.1, 0.2, SEG("c") "," SEG("d"))
                     SEGREQ(2, 3, 0.1, 0.2, SEG("a") "," SEG("b") "," SEG("e")));
    replay_live(path, 3, 0, &m, &r);
    size_t order_c = m.matched[2];
    assert_true(order_c < 2);
    ikv_replay_result_free(&r);
    replay_live(path, 3, 1, &m, &r);
    assert_int_equal(m.matched[2], 2);
    assert_int_equal(r.insert_full, 1);
    assert_int_equal(r.pending_cuts, 0);
    ikv_replay_result_free(&r);
    /* Pending: B arrives while A (same prefix) is still in prefill (A's first token at t = 5):
     * A's blocks are in the cache but not computed, so B hits nothing and inserts nothing; C,
     * after both, hits A's 3 blocks but not B's fourth (never cached). Order mode: 3 and 4. */
    tmp_path(path, sizeof path, "pending.jsonl");
    write_file(path, "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":1}\n"
                     SEGREQ(0, 1, 5, 6, SEG("x") "," SEG("y") "," SEG("z"))
                     SEGREQ(1, 2, 0.5, 1, SEG("x") "," SEG("y") "," SEG("z") "," SEG("w"))
                     SEGREQ(7, 3, 0.5, 1,
                            SEG("x") "," SEG("y") "," SEG("z") "," SEG("w") "," SEG("v")));
    replay_live(path, 100, 0, &m, &r);
    assert_int_equal(m.matched[1], 3);
    assert_int_equal(m.matched[2], 4);
    ikv_replay_result_free(&r);
    replay_live(path, 100, 1, &m, &r);
    assert_int_equal(m.matched[1], 0);
    assert_int_equal(m.matched[2], 3);
    assert_int_equal(r.pending_cuts, 1);
    assert_true(fabs(r.ttft_p99 - 5) < 1e-9); /* the trace's measured TTFTs */
    ikv_replay_result_free(&r);
    /* once A's prefill is done (B at t = 5.5 instead of 1), B hits A's blocks */
    tmp_path(path, sizeof path, "ready.jsonl");
    write_file(path, "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":1}\n"
                     SEGREQ(0, 1, 5, 6, SEG("x") "," SEG("y") "," SEG("z"))
                     SEGREQ(5.5, 2, 0.5, 1, SEG("x") "," SEG("y") "," SEG("z") "," SEG("w"))
                     SEGREQ(7, 3, 0.5, 1,
                            SEG("x") "," SEG("y") "," SEG("z") "," SEG("w") "," SEG("v")));
    replay_live(path, 100, 1, &m, &r);
    assert_int_equal(m.matched[1], 3);
    assert_int_equal(m.matched[2], 4);
    assert_int_equal(r.pending_cuts, 0);
    ikv_replay_result_free(&r);
    /* the same when B arrived at t = 1 but the server admitted it (looked its prefix up) only
     * after A's prefill: queue_s 4.6 of its ttft_s 5 */
    write_file(path, "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":1}\n"
                     SEGREQ(0, 1, 5, 6, SEG("x") "," SEG("y") "," SEG("z"))
                     "{\"time\":1,\"tenant\":\"u\",\"session\":2,\"output\":1,\"ttft_s\":5,"
                     "\"latency_s\":5.5,\"queue_s\":4.6,\"segments\":[" SEG("x") "," SEG("y") ","
                     SEG("z") "," SEG("w") "]}\n"
                     SEGREQ(7, 3, 0.5, 1,
                            SEG("x") "," SEG("y") "," SEG("z") "," SEG("w") "," SEG("v")));
    replay_live(path, 100, 1, &m, &r);
    assert_int_equal(m.matched[1], 3);
    assert_int_equal(m.matched[2], 4);
    assert_true(fabs(r.queue_p99 - 4.6) < 1e-9);
    ikv_replay_result_free(&r);
    /* a request without measured times is an error naming it; half a pair is malformed */
    tmp_path(path, sizeof path, "notimes.jsonl");
    write_file(path, "{\"time\":0,\"tenant\":\"u\",\"segments\":[" SEG("x") "]}\n");
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.mode = IKV_REPLAY_TIMED;
    ro.service_trace = 1;
    assert_int_equal(replay_file(path, &to, &ro, &r), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "request 0 has no measured"));
    write_file(path, "{\"time\":0,\"tenant\":\"u\",\"ttft_s\":1,\"segments\":[" SEG("x") "]}\n"
                     "{\"time\":1,\"tenant\":\"u\",\"ttft_s\":2,\"latency_s\":1,\"segments\":["
                     SEG("x") "]}\n");
    to.strict = 1;
    assert_int_equal(replay_file(path, &to, &ro, &r), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "come together"));
}

/* Lower-tier hits: loaded when loading beats recomputing on the cost model, counted both ways. */
static void test_load_vs_recompute(void **state) {
    (void)state;
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.mode = IKV_REPLAY_TIMED;
    ro.n_tiers = 2;
    snprintf(ro.tiers[0].name, sizeof ro.tiers[0].name, "hbm");
    ro.tiers[0].capacity_tokens = 20000;
    ro.tiers[1].capacity_tokens = 2000000;
    ro.check_every = 10;
    ro.on_request = on_timed;
    /* dram over the host link: a 64-token block of llama3-70b KV loads far faster than it
     * recomputes, so every lower-tier hit is loaded */
    snprintf(ro.tiers[1].name, sizeof ro.tiers[1].name, "dram");
    timed_check c = {0};
    ro.on_request_ctx = &c;
    ikv_replay_result r;
    assert_int_equal(replay_file(WEKA, &to, &ro, &r), 0);
    assert_true(r.hits_by_tier[1] > 0);
    assert_int_equal(r.lower_loaded_blocks + r.lower_recomputed_blocks, r.hits_by_tier[1]);
    assert_int_equal(r.lower_loaded_blocks, c.loaded);
    assert_true(r.lower_loaded_blocks > 0);
    ikv_replay_result_free(&r);
    /* Lower-tier runs are normally deep suffixes (the tier rule keeps ancestors in faster
     * tiers), where attention makes recomputing dear. A first block pushed down to ssd is the
     * other case: one 64-token block of llama3-8b at depth 0 on 8 GPUs recomputes in ~0.23 ms
     * but loads from NVMe in ~0.29 ms (100 us latency + 1 MB per GPU at 5.6 GB/s). */
    char path[512];
    tmp_path(path, sizeof path, "shallow.jsonl");
    write_file(path, "{\"id\":\"c\",\"block_size\":64,\"requests\":["
                     "{\"t\":0,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1]},"
                     "{\"t\":1,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[2]},"
                     "{\"t\":2,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[3]},"
                     "{\"t\":3,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1]},"
                     "{\"t\":4,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[2]}]}\n");
    ro.tiers[0].capacity_tokens = 64;
    snprintf(ro.tiers[1].name, sizeof ro.tiers[1].name, "ssd");
    ro.tiers[1].capacity_tokens = 6400;
    ro.model = "llama3-8b";
    ro.gpus = 8;
    timed_check c2 = {0};
    ro.on_request_ctx = &c2;
    assert_int_equal(replay_file(path, &to, &ro, &r), 0);
    assert_int_equal(r.hits_by_tier[1], 2);
    assert_int_equal(r.lower_recomputed_blocks, 2);
    assert_int_equal(r.lower_loaded_blocks, 0);
    assert_int_equal(c2.recomputed, 2);
    ikv_replay_result_free(&r);
    /* the same blocks of llama3-70b (2.5x the KV per token, 9x the FLOPs) are loaded */
    ro.model = "llama3-70b";
    memset(&c2, 0, sizeof c2);
    assert_int_equal(replay_file(path, &to, &ro, &r), 0);
    assert_int_equal(r.lower_loaded_blocks, 2);
    assert_int_equal(r.lower_recomputed_blocks, 0);
    ikv_replay_result_free(&r);
}

/* Tiers in order mode: hits spread over tiers, the core's tier rules hold throughout. */
static void test_tiers_order(void **state) {
    (void)state;
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.n_tiers = 3;
    const char *names[] = {"hbm", "dram", "ssd"};
    const uint64_t caps[] = {10000, 30000, 100000};
    for (int i = 0; i < 3; i++) {
        snprintf(ro.tiers[i].name, sizeof ro.tiers[i].name, "%s", names[i]);
        ro.tiers[i].capacity_tokens = caps[i];
    }
    ro.check_every = 5;
    ikv_replay_result r, one;
    assert_int_equal(replay_file(WEKA, &to, &ro, &r), 0);
    assert_true(r.hits_by_tier[0] > 0 && r.hits_by_tier[1] + r.hits_by_tier[2] > 0);
    assert_true(r.demotions > 0);
    /* more total capacity than the hbm tier alone: at least as many hits */
    ikv_replay_opts_default(&ro);
    ro.capacity_tokens = 10000;
    assert_int_equal(replay_file(WEKA, &to, &ro, &one), 0);
    assert_true(r.hit_tokens >= one.hit_tokens);
    ikv_replay_result_free(&r);
    ikv_replay_result_free(&one);
    /* a bad tier name is an error, not a crash */
    ikv_replay_opts_default(&ro);
    ro.n_tiers = 1;
    snprintf(ro.tiers[0].name, sizeof ro.tiers[0].name, "tape");
    ro.tiers[0].capacity_tokens = 1000;
    assert_int_not_equal(replay_file(WEKA, &to, &ro, &r), 0);
}

/* ---- the CLI ------------------------------------------------------------------------------ */

/* Runs `isokv ARGS` (the words of args, no shell); returns its stdout then its stderr (malloc'd)
 * and its exit status in *status. */
static char *run_cmd(const char *args, int *status) {
    size_t cap = 1 << 20;
    char *out = malloc(cap);
    assert_non_null(out);
    *status = tu_isokv_line(args, out, cap, NULL, 0, 1, 300);
    return out;
}

static void test_cli_json(void **state) {
    (void)state;
    int st;
    char *out = run_cmd("sim " MOONCAKE " --json --capacity-tokens 1.5M", &st);
    assert_int_equal(st, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    const char *fields[] = {"requests", "input_tokens", "hit_tokens", "token_hit_ratio",
                            "block_hit_ratio", "hits_by_tier", "evictions", "thrash_ratio",
                            "prefill_flops_saved", "cost_model", "measured"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        assert_non_null(cJSON_GetObjectItem(j, fields[i]));
    owork w = load_mooncake();
    oracle_out o = oracle_lru(&w, 1500000 / 512);
    assert_int_equal((uint64_t)cJSON_GetObjectItem(j, "requests")->valuedouble, 300);
    assert_int_equal((uint64_t)cJSON_GetObjectItem(j, "hit_tokens")->valuedouble, o.hit_tokens);
    assert_int_equal((uint64_t)cJSON_GetObjectItem(j, "evictions")->valuedouble, o.evictions);
    free_work(&w);
    cJSON_Delete(j);
    free(out);

    out = run_cmd("sim " WEKA " --json --mode timed --servers 2 --capacity-tokens 50k", &st);
    assert_int_equal(st, 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    const cJSON *tm = cJSON_GetObjectItem(j, "timed");
    assert_non_null(tm);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(tm, "simulated")));
    assert_true(cJSON_GetObjectItem(tm, "ttft_p99")->valuedouble >=
                cJSON_GetObjectItem(tm, "ttft_p50")->valuedouble);
    cJSON_Delete(j);
    free(out);

    out = run_cmd("sim " MOONCAKE " --capacity-tokens 1M", &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "token hit ratio"));
    assert_non_null(strstr(out, "simulated"));
    assert_non_null(strstr(out, "MEASURED"));
    free(out);

    out = run_cmd("sim --help", &st);
    assert_int_equal(st, 0);
    free(out);
    out = run_cmd("sim " MOONCAKE " --policy nosuch", &st);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "registered: lru"));
    free(out);
    out = run_cmd("sim /nonexistent.jsonl", &st);
    assert_int_equal(st, 1);
    assert_non_null(strstr(out, "/nonexistent.jsonl"));
    free(out);
    out = run_cmd("sim " MOONCAKE " --capacity-tokens lots", &st);
    assert_int_equal(st, 2);
    free(out);
}

static void test_cli_sweep(void **state) {
    (void)state;
    char dir[512], args[2048];
    tmp_path(dir, sizeof dir, "sweep");
    snprintf(args, sizeof args,
             "sim sweep " WEKA " --vary conversations=1,3,5 --policy lru,opt --capacity-tokens 20k,50k "
             "--out %s --jobs 2 --no-plot",
             dir);
    int st;
    char *out = run_cmd(args, &st);
    assert_int_equal(st, 0);
    free(out);
    char path[600];
    snprintf(path, sizeof path, "%s/sweep.json", dir);
    size_t len;
    char *text = slurp(path, &len);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    const cJSON *runs = cJSON_GetObjectItem(j, "runs");
    assert_int_equal(cJSON_GetArraySize(runs), 12);
    /* each run equals a single replay with the same options */
    const cJSON *r0 = cJSON_GetArrayItem(runs, 0);
    ikv_trace_opts to = {.conversations = 1};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.capacity_tokens = 20000;
    ikv_replay_result r;
    assert_int_equal(replay_file(WEKA, &to, &ro, &r), 0);
    assert_true(fabs(cJSON_GetObjectItem(r0, "hit_tokens")->valuedouble - r.hit_tokens) < 0.5);
    ikv_replay_result_free(&r);
    cJSON_Delete(j);
    free(text);
    snprintf(path, sizeof path, "%s/sweep.csv", dir);
    text = slurp(path, &len);
    size_t lines = 0;
    for (char *p = text; *p; p++) lines += *p == '\n';
    assert_int_equal(lines, 13);
    free(text);

    out = run_cmd("sim sweep " WEKA " --policy lru,nosuch --out /tmp", &st);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "unknown eviction policy 'nosuch'"));
    free(out);
    if (tu_in_path("gnuplot")) {
        snprintf(args, sizeof args, "sim sweep " WEKA " --vary conversations=1,5 --capacity-tokens 50k --out %s",
                 dir);
        out = run_cmd(args, &st);
        assert_int_equal(st, 0);
        free(out);
        struct stat sb;
        snprintf(path, sizeof path, "%s/sweep.png", dir);
        assert_int_equal(stat(path, &sb), 0);
        assert_true(sb.st_size > 1000);
        snprintf(path, sizeof path, "%s/sweep.svg", dir);
        assert_int_equal(stat(path, &sb), 0);
    }
}

/* ---- segments traces: pins, chunk reuse, tenants ------------------------------------------ */

static void test_segments_remedies(void **state) {
    (void)state;
    char path[512], args[1024];
    tmp_path(path, sizeof path, "gen.jsonl");
    snprintf(args, sizeof args, "gen -o %s --users 20 --requests 400 --duration 3600", path);
    int st;
    char *out = run_cmd(args, &st);
    assert_int_equal(st, 0);
    free(out);
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_result base, chunk, pin, tight;
    ikv_replay_opts_default(&ro);
    ro.capacity_tokens = 100000;
    ro.check_every = 50;
    assert_int_equal(replay_file(path, &to, &ro, &base), 0);
    assert_true(base.n_tenants <= 20 && base.n_tenants > 1);
    uint64_t reqs = 0, in = 0;
    for (uint32_t i = 0; i < base.n_tenants; i++) {
        reqs += base.tenant_requests[i];
        in += base.tenant_input_tokens[i];
    }
    assert_int_equal(reqs, base.requests);
    assert_int_equal(in, base.input_tokens);
    assert_int_equal(base.chunk_hit_blocks, 0);
    /* chunk reuse: doc chunks hit at other positions, (1 - R) of their tokens counted */
    ro.chunk_reuse = 0.15;
    assert_int_equal(replay_file(path, &to, &ro, &chunk), 0);
    assert_true(chunk.chunk_hit_blocks > 0);
    assert_true(chunk.chunk_hit_tokens > 0);
    assert_true(fabs(chunk.hit_tokens - ((double)chunk.prefix_hit_tokens + chunk.chunk_hit_tokens)) < 1e-6);
    assert_true(chunk.chunk_hit_tokens <= 0.85 * (double)chunk.chunk_hit_blocks * 16 + 1e-6);
    assert_true(chunk.token_hit_ratio > base.token_hit_ratio);
    /* pins: the public prefixes are pinned once each; a tiny budget is counted, not fatal */
    ro.chunk_reuse = -1;
    ro.pin_public = 1;
    assert_int_equal(replay_file(path, &to, &ro, &pin), 0);
    assert_true(pin.pins > 0);
    assert_int_equal(pin.pin_budget_errors, 0);
    ro.pin_budget = 0.0001;
    assert_int_equal(replay_file(path, &to, &ro, &tight), 0);
    assert_int_equal(tight.pins, 0);
    assert_true(tight.pin_budget_errors > 0);
    assert_int_equal(tight.requests, base.requests);
    ikv_replay_result_free(&base);
    ikv_replay_result_free(&chunk);
    ikv_replay_result_free(&pin);
    ikv_replay_result_free(&tight);
    /* the CLI lists tenants for segments traces */
    snprintf(args, sizeof args, "sim %s --json --capacity-tokens 100k --chunk-reuse", path);
    out = run_cmd(args, &st);
    assert_int_equal(st, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_true(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tenants")) > 1);
    assert_true(cJSON_GetObjectItem(j, "chunk_hit_blocks")->valuedouble > 0);
    cJSON_Delete(j);
    free(out);
}

/* ---- regressions: hostile input (issue 9), one test per defect ----------------------------- */

static void write_bytes(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Reads every request of path with opts to; returns the count, *skipped and the first error. */
static int read_all(const char *path, const ikv_trace_opts *to, uint64_t *skipped, char *first,
                    size_t cap) {
    ikv_trace *t;
    int rc = ikv_trace_open(path, to, &t);
    if (rc) return rc;
    ikv_trace_request q;
    int n = 0;
    while ((rc = ikv_trace_next(t, &q)) == 1)
        n++;
    *skipped = ikv_trace_skipped(t);
    snprintf(first, cap, "%s", ikv_trace_first_error(t) ? ikv_trace_first_error(t) : "");
    ikv_trace_close(t);
    return rc < 0 ? rc : n;
}

/* A NUL byte inside line 2 used to end the line for strlen, so line 3 was glued onto it and
 * lost; now line 2 alone is malformed, named, and line 3 is read. */
static void test_regress_nul_byte_in_line(void **state) {
    (void)state;
    char path[512], buf[1024], first[512], want[1400];
    tmp_path(path, sizeof path, "nul.jsonl");
    size_t n = 0;
    n += (size_t)snprintf(buf + n, sizeof buf - n, "%s", good1);
    n += (size_t)snprintf(buf + n, sizeof buf - n, "{\"timestamp\": 5, \"input_length\": 1");
    buf[n++] = 0;
    n += (size_t)snprintf(buf + n, sizeof buf - n, ", \"output_length\": 1, \"hash_ids\": [7]}\n%s",
                          good2);
    write_bytes(path, buf, n);
    ikv_trace_opts to = {0};
    uint64_t sk;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), 2);
    assert_int_equal(sk, 1);
    snprintf(want, sizeof want, "%s:2: NUL byte at column 35", path);
    assert_non_null(strstr(first, want));
    to.strict = 1;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), want));
}

/* Content after the JSON object on the same line was ignored, even with --strict. */
static void test_regress_trailing_content(void **state) {
    (void)state;
    char path[512], text[1024], first[512], want[1400];
    tmp_path(path, sizeof path, "trailing.jsonl");
    snprintf(text, sizeof text, "%s%.*s {\"more\": 1}\n%s", good1, (int)strlen(good2) - 1, good2,
             good2);
    write_file(path, text);
    ikv_trace_opts to = {0};
    uint64_t sk;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), 2);
    assert_int_equal(sk, 1);
    snprintf(want, sizeof want, "%s:2: trailing content after the JSON object at column", path);
    assert_non_null(strstr(first, want));
    to.strict = 1;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), want));
}

/* A trace whose every line is malformed: the error names the file and the first reason. */
static void test_regress_all_malformed_names_file(void **state) {
    (void)state;
    char path[512], want[1400];
    tmp_path(path, sizeof path, "allbad.jsonl");
    write_file(path,
               "{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n"
               "{\"timestamp\": 1}\n");
    ikv_trace_opts to = {.format = IKV_TRACE_MOONCAKE};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ikv_replay_result r;
    assert_int_equal(replay_file(path, &to, &ro, &r), IKV_EEMPTY);
    snprintf(want, sizeof want,
             "%s: no valid request to replay: 2 malformed lines skipped; the "
             "first: %s:1: \"timestamp\"",
             path, path);
    assert_non_null(strstr(ikv_errdetail(), want));
}

/* Absurd numbers were accepted: a timestamp of 1e308 ms, an output length of 2^32 - 1. */
static void test_regress_absurd_numbers(void **state) {
    (void)state;
    char path[512], text[1024], first[512], want[1400];
    tmp_path(path, sizeof path, "absurd.jsonl");
    snprintf(
        text, sizeof text, "%s%s%s%s", good1,
        "{\"timestamp\": 1e308, \"input_length\": 1, \"output_length\": 5, \"hash_ids\": [0]}\n",
        "{\"timestamp\": 2, \"input_length\": 1, \"output_length\": 4294967295, \"hash_ids\": "
        "[0]}\n",
        good2);
    write_file(path, text);
    ikv_trace_opts to = {.strict = 1};
    ikv_trace *t;
    ikv_trace_request q;
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    assert_int_equal(ikv_trace_next(t, &q), 1);
    assert_int_equal(ikv_trace_next(t, &q), IKV_EFORMAT);
    snprintf(want, sizeof want, "%s:2: \"timestamp\" 1e+308 ms is more than 1e12 ms", path);
    assert_non_null(strstr(ikv_errdetail(), want));
    ikv_trace_close(t);
    to.strict = 0;
    uint64_t sk;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), 2);
    assert_int_equal(sk, 2);
    /* the output length: the limit is named, and it is configurable */
    snprintf(text, sizeof text, "%s%s", good1,
             "{\"timestamp\": 2, \"input_length\": 1, \"output_length\": 4294967295, \"hash_ids\": "
             "[0]}\n");
    write_file(path, text);
    to.strict = 1;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), IKV_EFORMAT);
    snprintf(want, sizeof want,
             "%s:2: \"output_length\" 4294967295 is more than the limit of "
             "2097152 tokens (--max-request-tokens)",
             path);
    assert_non_null(strstr(ikv_errdetail(), want));
    to.max_request_tokens = 100;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), IKV_EFORMAT);
    snprintf(want, sizeof want, "%s:1: \"input_length\" 600 is more than the limit of 100", path);
    assert_non_null(strstr(ikv_errdetail(), want));
}

/* JSON nested too deeply was reported as "not a JSON object". */
static void test_regress_deep_nesting(void **state) {
    (void)state;
    char path[512], first[512], want[1400];
    static char text[8192];
    tmp_path(path, sizeof path, "deep.jsonl");
    size_t n = (size_t)snprintf(text, sizeof text, "%s{\"timestamp\": 1, \"hash_ids\": ", good1);
    for (int i = 0; i < 1200; i++)
        text[n++] = '[';
    for (int i = 0; i < 1200; i++)
        text[n++] = ']';
    n += (size_t)snprintf(text + n, sizeof text - n, "}\n%s", good2);
    write_bytes(path, text, n);
    ikv_trace_opts to = {0};
    uint64_t sk;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), 2);
    snprintf(want, sizeof want, "%s:2: JSON nested deeper than 1000 levels", path);
    assert_non_null(strstr(first, want));
    /* on the first line, where the format is detected */
    write_bytes(path, text + strlen(good1), n - strlen(good1));
    ikv_trace *t;
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "JSON nested deeper than 1000 levels"));
    assert_null(strstr(ikv_errdetail(), "not a JSON object"));
}

/* A WEKA conversation with zero requests reached qsort(NULL, 0) (undefined; the sanitizer
 * build aborted). It is skipped with a reason; alone, the trace has nothing to replay. */
static void test_regress_weka_zero_requests(void **state) {
    (void)state;
    char path[512], first[512], want[1400];
    tmp_path(path, sizeof path, "weka0.jsonl");
    write_file(path,
               "{\"id\":\"a\",\"block_size\":64,\"hash_id_scope\":\"local\",\"requests\":[]}\n");
    ikv_trace_opts to = {0};
    ikv_trace *t;
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EEMPTY);
    snprintf(want, sizeof want, "%s:1: the conversation has no requests", path);
    assert_non_null(strstr(ikv_errdetail(), want));
    write_file(path,
               "{\"id\":\"a\",\"block_size\":64,\"hash_id_scope\":\"local\",\"requests\":[]}\n"
               "{\"id\":\"b\",\"block_size\":64,\"requests\":[{\"t\":0,\"type\":\"n\",\"in\":64,"
               "\"out\":1,\"hash_ids\":[3]}]}\n");
    uint64_t sk;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), 1);
    assert_int_equal(sk, 1);
    assert_non_null(strstr(first, want));
}

/* WEKA's "stop" becomes the request's hint (how its response ended: a pending tool call, the
 * end of the turn, unknown for anything else or a missing field), including in a subagent. */
static void test_weka_stop_hint(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof path, "weka_stop.jsonl");
    write_file(path,
               "{\"id\":\"a\",\"block_size\":64,\"requests\":["
               "{\"t\":0,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":\"tool_use\"},"
               "{\"t\":1,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":\"end_turn\"},"
               "{\"t\":2,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1]},"
               "{\"t\":3,\"type\":\"subagent\",\"requests\":["
               "{\"t\":0,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[2],\"stop\":\"end_turn\"}]},"
               "{\"t\":4,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":\"max_tokens\"},"
               "{\"t\":5,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":7}]}\n");
    ikv_trace_opts to = {0};
    ikv_trace *t;
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    const int want[] = {IKV_HINT_SOON, IKV_HINT_TURN, IKV_HINT_NONE, IKV_HINT_TURN, IKV_HINT_NONE,
                        IKV_HINT_NONE};
    ikv_trace_request q;
    size_t n = 0;
    while (ikv_trace_next(t, &q) == 1) {
        assert_true(n < 6);
        if (q.hint != want[n]) fail_msg("request %zu: hint %d, want %d", n, q.hint, want[n]);
        n++;
    }
    assert_int_equal(n, 6);
    ikv_trace_close(t);
}

/* The replay hands the policies the trace's wall clock (ikv_access.clock_ms): `hazard:arc=0`
 * (the ranking over plain LRU lists; ARC's T2 would keep the chains hit twice) ranks by seconds
 * since each conversation's last request. Conversation a leaves tool calls pending
 * every 10 s, b ends a turn and is back 100 s later; at 200 s a new 2-block chain (e) needs two
 * blocks of the five: c (tool call pending for 60 s, longer than any such gap: abandoned) and a
 * (100 s) have no chance of being back within 20 s and go; d and b (turns ended 95 and 100 s
 * ago) are about due and stay, so b's and d's returns hit and c's misses. lru keeps the newer c
 * and d and drops a and b's tail. Were the clock the request index, every gap would be a few
 * units, far within h, and it would drop the oldest, as lru does. */
static size_t hz_hits[8][2]; /* per conversation: its last two requests' matched blocks */
static void hz_record(void *ctx, const ikv_trace_request *q, const struct ikv_request_outcome *o) {
    (void)ctx;
    if (q->tenant < 8) {
        hz_hits[q->tenant][0] = hz_hits[q->tenant][1];
        hz_hits[q->tenant][1] = o->matched;
    }
}

static void replay_hazard(const char *path, const char *policy) {
    ikv_trace_opts to = {.window = 1e-6};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.policy = policy;
    ro.capacity_tokens = 5 * 64;
    ro.check_every = 1;
    ro.on_request = hz_record;
    ikv_replay_result r;
    memset(hz_hits, 0, sizeof hz_hits);
    assert_int_equal(replay_file(path, &to, &ro, &r), 0);
    ikv_replay_result_free(&r);
}

static void test_replay_hazard_clock(void **state) {
    (void)state;
    char path[512], text[4096];
    tmp_path(path, sizeof path, "weka_hazard.jsonl");
    size_t n = (size_t)snprintf(text, sizeof text, "{\"id\":\"a\",\"block_size\":64,\"requests\":[");
    for (int i = 0; i <= 10; i++)
        n += (size_t)snprintf(text + n, sizeof text - n,
                              "%s{\"t\":%d,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],"
                              "\"stop\":\"tool_use\"}",
                              i ? "," : "", 10 * i);
    snprintf(text + n, sizeof text - n,
             "]}\n"
             "{\"id\":\"b\",\"block_size\":64,\"requests\":["
             "{\"t\":0,\"type\":\"n\",\"in\":128,\"out\":1,\"hash_ids\":[1,2],\"stop\":\"end_turn\"},"
             "{\"t\":100,\"type\":\"n\",\"in\":128,\"out\":1,\"hash_ids\":[1,2],\"stop\":\"end_turn\"},"
             "{\"t\":215,\"type\":\"n\",\"in\":128,\"out\":1,\"hash_ids\":[1,2],\"stop\":\"end_turn\"}]}\n"
             "{\"id\":\"c\",\"block_size\":64,\"requests\":["
             "{\"t\":140,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":\"tool_use\"},"
             "{\"t\":210,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":\"tool_use\"}]}\n"
             "{\"id\":\"d\",\"block_size\":64,\"requests\":["
             "{\"t\":105,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":\"end_turn\"},"
             "{\"t\":205,\"type\":\"n\",\"in\":64,\"out\":1,\"hash_ids\":[1],\"stop\":\"end_turn\"}]}\n"
             "{\"id\":\"e\",\"block_size\":64,\"requests\":["
             "{\"t\":200,\"type\":\"n\",\"in\":128,\"out\":1,\"hash_ids\":[1,2],\"stop\":\"end_turn\"}]}\n");
    write_file(path, text);
    replay_hazard(path, "hazard:arc=0");
    assert_int_equal(hz_hits[1][1], 2); /* b */
    assert_int_equal(hz_hits[2][1], 0); /* c */
    assert_int_equal(hz_hits[3][1], 1); /* d */
    replay_hazard(path, "lru");
    assert_int_equal(hz_hits[1][1], 1);
    assert_int_equal(hz_hits[2][1], 1);
    assert_int_equal(hz_hits[3][1], 1);
}

/* A 139-byte segments line could make the reader derive and hash 2^24 tokens; tokens per
 * segment and per request are capped (configurable), the line named with the limit. */
static void test_regress_segment_token_caps(void **state) {
    (void)state;
    char path[512], first[512], want[1400];
    tmp_path(path, sizeof path, "segbig.jsonl");
    const char *big = "{\"time\":0,\"tenant\":\"u\",\"segments\":[{\"kind\":\"doc\",\"id\":\"d\","
                      "\"tokens\":16777216}]}\n";
    write_file(path, big);
    ikv_trace_opts to = {.format = IKV_TRACE_SEGMENTS, .strict = 1};
    uint64_t sk;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), IKV_EFORMAT);
    snprintf(want, sizeof want,
             "%s:1: segments[0] has 16777216 tokens, more than the limit of "
             "1048576 per segment (--max-segment-tokens)",
             path);
    assert_non_null(strstr(ikv_errdetail(), want));
    write_file(path, "{\"time\":0,\"tenant\":\"u\",\"segments\":[{\"kind\":\"doc\",\"id\":\"d\","
                     "\"tokens\":60},{\"kind\":\"query\",\"id\":\"q\",\"tokens\":60}]}\n");
    to.max_request_tokens = 100;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), IKV_EFORMAT);
    snprintf(want, sizeof want, "%s:1: the request has more than the limit of 100 tokens", path);
    assert_non_null(strstr(ikv_errdetail(), want));
    to.max_request_tokens = 120;
    to.max_segment_tokens = 50;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), IKV_EFORMAT);
    assert_non_null(
        strstr(ikv_errdetail(), "segments[0] has 60 tokens, more than the limit of 50"));
    to.max_segment_tokens = 60;
    assert_int_equal(read_all(path, &to, &sk, first, sizeof first), 1);
}

/* --thrash-window 1G allocated 4 GB up front for a 300-request trace (and 10G failed with
 * "success"): the ghost now grows with the drops, so the largest window runs in the memory of
 * the drops, and a window beyond the 32-bit ring is a range error with its reason. */
static void test_regress_thrash_window_bounded(void **state) {
    (void)state;
    ikv_trace_opts to = {0};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.capacity_tokens = 100000;
    ikv_replay_result small, huge;
    ro.thrash_window = 1u << 20; /* far more than this trace drops */
    assert_int_equal(replay_file(MOONCAKE, &to, &ro, &small), 0);
    ro.thrash_window = IKV_REPLAY_MAX_THRASH_WINDOW; /* 68 GB if allocated up front */
    assert_int_equal(replay_file(MOONCAKE, &to, &ro, &huge), 0);
    assert_true(small.evictions > 0);
    assert_int_equal(small.thrash_reused, huge.thrash_reused);
    assert_int_equal(huge.thrash_window, IKV_REPLAY_MAX_THRASH_WINDOW);
    ikv_replay_result_free(&small);
    ikv_replay_result_free(&huge);
    ro.thrash_window = IKV_REPLAY_MAX_THRASH_WINDOW + 1;
    assert_int_equal(replay_file(MOONCAKE, &to, &ro, &huge), IKV_ERANGE);
    assert_non_null(strstr(ikv_errdetail(), "thrash window"));
}

/* --tiers accepted slower-before-faster and duplicate tiers silently. */
static void test_regress_tiers_spec(void **state) {
    (void)state;
    ikv_replay_tier tiers[IKV_MAX_TIERS];
    size_t n = 99;
    assert_int_equal(ikv_replay_tiers_parse("dram=1M,hbm=100k", tiers, &n), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "'hbm' comes after the slower 'dram'"));
    assert_int_equal(ikv_replay_tiers_parse("hbm=1M,hbm=100k", tiers, &n), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "tier 'hbm' is given twice"));
    assert_int_equal(ikv_replay_tiers_parse("hbm=1M,ssd=2M,dram=3M", tiers, &n), IKV_EPARAM);
    /* "faster" is the cost model's load time: RDMA (remote) beats NVMe (ssd) */
    assert_int_equal(ikv_replay_tiers_parse("dram=1M,ssd=2M,remote=3M", tiers, &n), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "'remote' comes after the slower 'ssd'"));
    assert_int_equal(ikv_replay_tiers_parse("hbm=0", tiers, &n), IKV_EPARAM);
    assert_int_equal(ikv_replay_tiers_parse("hbm=1M,", tiers, &n), IKV_EPARAM);
    assert_int_equal(ikv_replay_tiers_parse("tape=1M", tiers, &n), IKV_EPARAM);
    assert_int_equal(n, 99); /* untouched on error */
    assert_int_equal(ikv_replay_tiers_parse("hbm=1k,dram=2k,remote=3k,ssd=4k", tiers, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ikv_replay_tiers_parse("hbm=2M,dram=16M,ssd=1.5G", tiers, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(tiers[2].name, "ssd");
    assert_int_equal(tiers[0].capacity_tokens, 2000000);
    assert_int_equal(tiers[2].capacity_tokens, 1500000000ull);
}

/* gen accepted 65536-token blocks that sim (the cache) then refused: one limit now. */
static void test_regress_block_size_limit(void **state) {
    (void)state;
    ikv_gen_opts g;
    ikv_gen_opts_default(&g);
    g.block_tokens = IKV_MAX_BLOCK_TOKENS + 1;
    assert_int_not_equal(ikv_gen_opts_check(&g), 0);
    assert_non_null(strstr(ikv_errdetail(), "1..65535"));
    g.block_tokens = IKV_MAX_BLOCK_TOKENS;
    g.system_tokens = 70000; /* at least one full block */
    assert_int_equal(ikv_gen_opts_check(&g), 0);
    char path[512];
    tmp_path(path, sizeof path, "bt.jsonl");
    write_file(path, "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":65536}\n"
                     "{\"time\":0,\"tenant\":\"u\",\"segments\":[{\"kind\":\"query\",\"id\":\"q\","
                     "\"tokens\":20}]}\n");
    ikv_trace_opts to = {0};
    ikv_trace *t;
    assert_int_equal(ikv_trace_open(path, &to, &t), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "must be 1..65535"));
    write_file(path, "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":65535}\n"
                     "{\"time\":0,\"tenant\":\"u\",\"segments\":[{\"kind\":\"query\",\"id\":\"q\","
                     "\"tokens\":70000}]}\n");
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ikv_replay_result r;
    assert_int_equal(replay_file(path, &to, &ro, &r), 0);
    assert_int_equal(r.block_tokens, 65535);
    assert_int_equal(r.blocks, 2);
    ikv_replay_result_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mooncake_reader),
        cmocka_unit_test(test_weka_reader),
        cmocka_unit_test(test_malformed_lines),
        cmocka_unit_test(test_empty_and_truncated),
        cmocka_unit_test(test_golden_lru_mooncake),
        cmocka_unit_test(test_golden_lru_weka),
        cmocka_unit_test(test_policies),
        cmocka_unit_test(test_timed_invariants),
        cmocka_unit_test(test_timed_locks_and_pending),
        cmocka_unit_test(test_load_vs_recompute),
        cmocka_unit_test(test_tiers_order),
        cmocka_unit_test(test_cli_json),
        cmocka_unit_test(test_cli_sweep),
        cmocka_unit_test(test_segments_remedies),
        cmocka_unit_test(test_regress_nul_byte_in_line),
        cmocka_unit_test(test_regress_trailing_content),
        cmocka_unit_test(test_regress_all_malformed_names_file),
        cmocka_unit_test(test_regress_absurd_numbers),
        cmocka_unit_test(test_regress_deep_nesting),
        cmocka_unit_test(test_regress_weka_zero_requests),
        cmocka_unit_test(test_weka_stop_hint),
        cmocka_unit_test(test_replay_hazard_clock),
        cmocka_unit_test(test_regress_segment_token_caps),
        cmocka_unit_test(test_regress_thrash_window_bounded),
        cmocka_unit_test(test_regress_tiers_spec),
        cmocka_unit_test(test_regress_block_size_limit),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
