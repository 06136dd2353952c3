/*
 * Tests of the load generator: the SSE parser, the OpenAI chunk reader, the block -> token
 * mapping, percentiles, atomic files and CSV quoting, and the driver end to end against a tiny
 * loopback HTTP responder (libmicrohttpd) started here on a free 127.0.0.1 port.
 *
 * The responder is a test fixture for the driver's error paths (4xx/5xx with OpenAI error
 * bodies, HTML, garbage events, streams without [DONE], a stall past the client's timeout, a
 * plain non-streamed reply, llama.cpp's timings field, a closed port) and for what the driver
 * sends (token prompts, cache_salt, Authorization, public prefix tokens). In its "good" mode it
 * answers with cached tokens computed by a brute-force prefix cache over token blocks of all
 * earlier prompts (unlimited capacity), which the sent-order trace replayed by `isokv sim`
 * must reproduce exactly. It is not the isokv server and not a fidelity measurement of one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "isokv/load.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MOONCAKE "tests/data/mooncake_conv_300.jsonl"
#define WEKA     "tests/data/weka_5conv.jsonl.gz"

static char tmpdir[256];

static int setup_all(void **state) {
    (void)state;
    const char *src = getenv("IKV_SOURCE_DIR");
    if (src && chdir(src) != 0) return -1;
    return tu_tmpdir(tmpdir, sizeof tmpdir, "load");
}

/* Runs argv (no shell), stdout to out_path (may be NULL), waits (at most 300 s); returns the
 * exit status. */
static int run_prog(char *const argv[], const char *out_path) {
    return tu_run((const char *const *)argv, out_path, NULL, 300);
}

static int teardown_all(void **state) {
    (void)state;
    return tu_rmtree(tmpdir);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, k;
    char *b = malloc(cap);
    while ((k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n < 2) b = realloc(b, cap *= 2);
    }
    fclose(f);
    b[n] = 0;
    return b;
}

/* ---- SSE ------------------------------------------------------------------------------------- */

typedef struct events {
    char data[16][256];
    int n;
} events;

static int collect(void *ctx, const char *d, size_t len) {
    events *e = ctx;
    assert_int_equal(strlen(d), len);
    if (e->n < 16) snprintf(e->data[e->n], sizeof e->data[0], "%s", d);
    e->n++;
    return 0;
}

static const char *STREAM = ": keep-alive\r\n"
                            "data: {\"a\":1}\r\n\r\n"
                            "event: x\n"
                            "data:first\n"
                            "data: second\n"
                            "id: 7\n"
                            "\n"
                            "data: [DONE]\r\r"
                            "data: tail-without-blank";

static void check_stream_events(const events *e) {
    assert_int_equal(e->n, 4);
    assert_string_equal(e->data[0], "{\"a\":1}");
    assert_string_equal(e->data[1], "first\nsecond");
    assert_string_equal(e->data[2], "[DONE]");
    assert_string_equal(e->data[3], "tail-without-blank");
}

/* The same events whether the stream comes whole, byte by byte, or cut at every position. */
static void test_sse_split(void **state) {
    (void)state;
    size_t n = strlen(STREAM);
    for (size_t cut = 0; cut <= n; cut++) {
        events e = {0};
        ikv_sse *s;
        assert_int_equal(ikv_sse_create(1024, collect, &e, &s), 0);
        assert_int_equal(ikv_sse_feed(s, STREAM, cut), 0);
        assert_int_equal(ikv_sse_feed(s, STREAM + cut, n - cut), 0);
        assert_int_equal(ikv_sse_finish(s), 0);
        assert_true(ikv_sse_saw_data(s));
        check_stream_events(&e);
        ikv_sse_destroy(s);
    }
    events e = {0};
    ikv_sse *s;
    assert_int_equal(ikv_sse_create(1024, collect, &e, &s), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ikv_sse_feed(s, STREAM + i, 1), 0);
        assert_true(ikv_sse_check(s));
    }
    assert_int_equal(ikv_sse_finish(s), 0);
    check_stream_events(&e);
    assert_int_equal(ikv_sse_bytes(s), n);
    ikv_sse_destroy(s);
}

/* An event or line longer than the bound is an error, not unbounded memory. */
static void test_sse_bound(void **state) {
    (void)state;
    events e = {0};
    ikv_sse *s;
    assert_int_equal(ikv_sse_create(64, collect, &e, &s), 0);
    char big[200];
    memset(big, 'x', sizeof big);
    memcpy(big, "data: ", 6);
    assert_int_equal(ikv_sse_feed(s, big, sizeof big), IKV_ETOOLONG);
    ikv_sse_destroy(s);
    /* no data field: a plain JSON body is told apart */
    assert_int_equal(ikv_sse_create(1024, collect, &e, &s), 0);
    assert_int_equal(ikv_sse_feed(s, "{\"x\":1}", 7), 0);
    assert_int_equal(ikv_sse_finish(s), 0);
    assert_false(ikv_sse_saw_data(s));
    ikv_sse_destroy(s);
}

static void test_reply_fields(void **state) {
    (void)state;
    ikv_load_reply r;
    ikv_load_reply_init(&r);
    const char *c1 = "{\"choices\":[{\"text\":\"\"}]}";
    assert_int_equal(ikv_load_reply_chunk(&r, c1, strlen(c1), 1.0), 0);
    assert_false(r.first_token_seen); /* an empty text is not a token */
    const char *c2 = "{\"choices\":[{\"text\":\"hi\"}]}";
    assert_int_equal(ikv_load_reply_chunk(&r, c2, strlen(c2), 2.0), 0);
    assert_true(r.first_token_seen);
    assert_true(r.first_token_time == 2.0);
    const char *c3 = "{\"choices\":[{\"text\":\"!\"}]}";
    assert_int_equal(ikv_load_reply_chunk(&r, c3, strlen(c3), 3.0), 0);
    assert_true(r.first_token_time == 2.0);
    const char *u = "{\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,"
                    "\"prompt_tokens_details\":{\"cached_tokens\":32}}}";
    assert_int_equal(ikv_load_reply_chunk(&r, u, strlen(u), 4.0), 0);
    assert_int_equal(r.prompt_tokens, 40);
    assert_int_equal(r.completion_tokens, 2);
    assert_int_equal(r.cached_tokens, 32);
    assert_int_equal(r.cached_src, IKV_CACHED_OPENAI);
    assert_int_equal(ikv_load_reply_chunk(&r, "[DONE]", 6, 5.0), 0);
    assert_true(r.done);
    assert_int_equal(ikv_load_reply_chunk(&r, c2, strlen(c2), 6.0), IKV_EFORMAT);

    /* llama.cpp: timings.cache_n; older vLLM: usage.num_cached_tokens */
    ikv_load_reply_init(&r);
    const char *l =
        "{\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1},"
        "\"timings\":{\"cache_n\":5,\"prompt_n\":4}}";
    assert_int_equal(ikv_load_reply_chunk(&r, l, strlen(l), 1.0), 0);
    assert_int_equal(r.cached_tokens, 5);
    assert_int_equal(r.cached_src, IKV_CACHED_LLAMACPP);
    /* llama.cpp without cache_n (b4700-era builds): prompt tokens minus those it evaluated */
    ikv_load_reply_init(&r);
    const char *l2 =
        "{\"choices\":[{\"text\":\"\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1},"
        "\"timings\":{\"prompt_n\":4}}";
    assert_int_equal(ikv_load_reply_chunk(&r, l2, strlen(l2), 1.0), 0);
    assert_int_equal(r.cached_tokens, 5);
    assert_int_equal(r.cached_src, IKV_CACHED_LLAMACPP_PROMPT_N);
    ikv_load_reply_init(&r);
    const char *v = "{\"usage\":{\"prompt_tokens\":9,\"num_cached_tokens\":3}}";
    assert_int_equal(ikv_load_reply_chunk(&r, v, strlen(v), 1.0), 0);
    assert_int_equal(r.cached_tokens, 3);
    assert_int_equal(r.cached_src, IKV_CACHED_VLLM_LEGACY);

    /* malformed: not JSON, not an object, no choices/usage, an error object, negative counts */
    const char *bad[] = {"not json", "[1,2]", "{\"x\":1}", "{\"error\":{\"message\":\"boom\"}}"};
    for (size_t i = 0; i < 4; i++) {
        ikv_load_reply_init(&r);
        assert_int_equal(ikv_load_reply_chunk(&r, bad[i], strlen(bad[i]), 1.0), IKV_EFORMAT);
        assert_true(r.error[0] != 0);
    }
    ikv_load_reply_init(&r);
    const char *neg =
        "{\"usage\":{\"prompt_tokens\":-3,\"prompt_tokens_details\":{\"cached_tokens\":1.5}}}";
    assert_int_equal(ikv_load_reply_chunk(&r, neg, strlen(neg), 1.0), 0);
    assert_int_equal(r.prompt_tokens, -1);
    assert_int_equal(r.cached_tokens, -1);
}

/* ---- block -> token mapping ------------------------------------------------------------------ */

typedef struct kept {
    ikv_key *keys;
    uint32_t *ntok;
    size_t n;
    ikv_trace_request q;
} kept;

static size_t read_all(const char *path, kept *out, size_t max, uint32_t *bt) {
    ikv_trace_opts to = {0};
    ikv_trace *t;
    assert_int_equal(ikv_trace_open(path, &to, &t), 0);
    *bt = ikv_trace_block_tokens(t);
    size_t n = 0;
    ikv_trace_request q;
    while (n < max && ikv_trace_next(t, &q) == 1) {
        kept *k = &out[n++];
        k->q = q;
        k->n = q.n_blocks;
        k->keys = malloc((q.n_blocks + 1) * sizeof *k->keys);
        k->ntok = malloc((q.n_blocks + 1) * sizeof *k->ntok);
        memcpy(k->keys, q.keys, q.n_blocks * sizeof *k->keys);
        for (size_t i = 0; i < q.n_blocks; i++)
            k->ntok[i] = q.ntokens ? q.ntokens[i] : *bt;
        k->q.keys = k->keys;
        k->q.ntokens = k->ntok;
    }
    ikv_trace_close(t);
    return n;
}

static size_t common_keys(const kept *a, const kept *b) {
    size_t i = 0;
    while (i < a->n && i < b->n && ikv_key_eq(a->keys[i], b->keys[i]) && a->ntok[i] == b->ntok[i])
        i++;
    return i;
}

/* Oracle: two requests' token prompts share exactly the tokens of their common key prefix
 * (to the first differing token after it), on the Mooncake slice at scale 32 and WEKA at 4. */
static void check_mapping(const char *path, uint32_t scale, size_t max) {
    kept *ks = calloc(max, sizeof *ks);
    uint32_t bt;
    size_t n = read_all(path, ks, max, &bt);
    assert_true(n > 10);
    ikv_load_map m;
    ikv_load_map_default(&m);
    m.scale = scale;
    uint32_t bs = bt / scale;
    ikv_load_prompt_buf *pb = calloc(n, sizeof *pb);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ikv_load_prompt(&m, &ks[i].q, bt, &pb[i]), 0);
        assert_int_equal(pb[i].block_tokens, bs);
        for (size_t j = 0; j < pb[i].n; j++) {
            assert_true(pb[i].tokens[j] >= m.first_token);
            assert_true(pb[i].tokens[j] < m.vocab);
        }
        /* length: blocks scaled, the rest of the input floor(rest / K) */
        uint64_t inb = 0, expect = 0;
        for (size_t b = 0; b < ks[i].n; b++) {
            inb += ks[i].ntok[b];
            expect += ks[i].ntok[b] >= bt ? bs : ks[i].ntok[b] / scale;
        }
        expect += (ks[i].q.input_tokens - inb) / scale;
        assert_int_equal(pb[i].n, expect);
    }
    size_t shared_pairs = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            size_t c = common_keys(&ks[i], &ks[j]);
            size_t lcp = 0;
            while (lcp < pb[i].n && lcp < pb[j].n && pb[i].tokens[lcp] == pb[j].tokens[lcp])
                lcp++;
            size_t ctok = 0;
            for (size_t b = 0; b < c; b++)
                ctok += ks[i].ntok[b] >= bt ? bs : ks[i].ntok[b] / scale;
            if (c) shared_pairs++;
            /* the common token prefix covers the common blocks and ends inside the next block */
            assert_true(lcp >= ctok);
            assert_true(lcp < ctok + bs || (lcp == pb[i].n || lcp == pb[j].n));
        }
    assert_true(shared_pairs > 0);
    /* deterministic; another seed gives other tokens */
    ikv_load_prompt_buf again = {0};
    assert_int_equal(ikv_load_prompt(&m, &ks[3].q, bt, &again), 0);
    assert_int_equal(again.n, pb[3].n);
    assert_memory_equal(again.tokens, pb[3].tokens, again.n * sizeof *again.tokens);
    m.seed = 1;
    assert_int_equal(ikv_load_prompt(&m, &ks[3].q, bt, &again), 0);
    assert_true(memcmp(again.tokens, pb[3].tokens, bs * sizeof *again.tokens) != 0);
    /* a scale that does not divide the block is refused */
    m.scale = 7;
    assert_int_equal(ikv_load_prompt(&m, &ks[3].q, bt, &again), IKV_EINVAL);
    ikv_load_prompt_free(&again);
    for (size_t i = 0; i < n; i++) {
        ikv_load_prompt_free(&pb[i]);
        free(ks[i].keys);
        free(ks[i].ntok);
    }
    free(pb);
    free(ks);
}

static void test_mapping_mooncake(void **state) {
    (void)state;
    check_mapping(MOONCAKE, 32, 120);
}

static void test_mapping_weka(void **state) {
    (void)state;
    check_mapping(WEKA, 4, 86);
}

static void test_max_tokens(void **state) {
    (void)state;
    ikv_load_map m;
    ikv_load_map_default(&m);
    m.scale = 4;
    ikv_key k = {1, 2};
    uint32_t nt = 64;
    ikv_trace_request q = {
        .input_tokens = 64, .output_tokens = 10, .n_blocks = 1, .keys = &k, .ntokens = &nt};
    ikv_load_prompt_buf b = {0};
    assert_int_equal(ikv_load_prompt(&m, &q, 64, &b), 0);
    assert_int_equal(b.max_tokens, 3); /* round(10 / 4) */
    assert_int_equal(b.full_blocks, 1);
    q.output_tokens = 0;
    assert_int_equal(ikv_load_prompt(&m, &q, 64, &b), 0);
    assert_int_equal(b.max_tokens, 1);
    q.output_tokens = 4000;
    m.max_output = 16;
    assert_int_equal(ikv_load_prompt(&m, &q, 64, &b), 0);
    assert_int_equal(b.max_tokens, 16);
    q.n_public_blocks = 1;
    assert_int_equal(ikv_load_prompt(&m, &q, 64, &b), 0);
    assert_int_equal(b.public_tokens, 16);
    ikv_load_prompt_free(&b);
}

/* ---- reports --------------------------------------------------------------------------------- */

static void test_percentile(void **state) {
    (void)state;
    double v[] = {5, 1, 4, 2, 3};
    assert_true(fabs(ikv_load_percentile(v, 5, 50) - 3) < 1e-12);
    assert_true(fabs(ikv_load_percentile(v, 5, 0) - 1) < 1e-12);
    assert_true(fabs(ikv_load_percentile(v, 5, 100) - 5) < 1e-12);
    assert_true(fabs(ikv_load_percentile(v, 5, 90) - 4.6) < 1e-12);
    assert_true(ikv_load_percentile(v, 0, 50) == 0);
}

static void test_atomic(void **state) {
    (void)state;
    char p[512], d[512], l[512], fifo[512];
    snprintf(p, sizeof p, "%s/a.csv", tmpdir);
    assert_int_equal(ikv_load_write_atomic(p, "one\n", 4), 0);
    assert_int_equal(ikv_load_write_atomic(p, "two\n", 4), 0);
    char *s = slurp(p);
    assert_string_equal(s, "two\n");
    free(s);
    /* refuse a directory, a symlink and a FIFO under the final name */
    snprintf(d, sizeof d, "%s/dir.csv", tmpdir);
    assert_int_equal(mkdir(d, 0755), 0);
    assert_int_equal(ikv_load_write_atomic(d, "x", 1), IKV_EINVAL);
    snprintf(l, sizeof l, "%s/link.csv", tmpdir);
    assert_int_equal(symlink(p, l), 0);
    assert_int_equal(ikv_load_write_atomic(l, "x", 1), IKV_EINVAL);
    s = slurp(p);
    assert_string_equal(s, "two\n"); /* not written through the link */
    free(s);
    snprintf(fifo, sizeof fifo, "%s/fifo.csv", tmpdir);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    assert_int_equal(ikv_load_write_atomic(fifo, "x", 1), IKV_EINVAL);
    /* an unwritable directory: an error, and nothing under the final name */
    char nd[512];
    snprintf(nd, sizeof nd, "%s/missing/sub/x.csv", tmpdir);
    assert_int_equal(ikv_load_write_atomic(nd, "x", 1), IKV_EIO);
    assert_true(strstr(ikv_errdetail(), "missing") != NULL);
}

static void test_csv_quoting(void **state) {
    (void)state;
    ikv_load_record rec[2];
    memset(rec, 0, sizeof rec);
    for (int i = 0; i < 2; i++) {
        rec[i].index = (uint64_t)i;
        rec[i].sent_order = (uint64_t)i;
        rec[i].server_prompt_tokens = rec[i].cached_tokens = rec[i].completion_tokens = -1;
        rec[i].first_token = -1;
    }
    rec[1].err = IKV_LOAD_HTTP;
    rec[1].status = 400;
    snprintf(rec[1].detail, sizeof rec[1].detail, "bad \"prompt\", line\nbreak");
    ikv_load_result r = {.records = rec, .n = 2};
    char *csv = ikv_load_requests_csv(&r);
    assert_non_null(csv);
    assert_non_null(strstr(csv, ",400,http,\"bad \"\"prompt\"\", line break\"\n"));
    /* every row has the header's column count outside quotes */
    int lines = 0;
    for (char *p = csv; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 3);
    ikv_free(csv);
}

/* ---- the loopback responder -------------------------------------------------------------------
 */

enum mode {
    M_GOOD,
    M_500,
    M_429,
    M_HTML,
    M_GARBAGE,
    M_NODONE,
    M_STALL,
    M_PLAIN,
    M_LLAMA,
    M_NOUSAGE,
    M_TRAILER
};

typedef struct fixture {
    struct MHD_Daemon *d;
    uint16_t port;
    pthread_mutex_t mu;
    enum mode mode;
    /* every prompt seen, in arrival order (GOOD mode's cache) */
    uint32_t **prompts;
    size_t *plen, n, cap;
    /* the last request's fields */
    char salt[64], auth[128];
    int64_t public_tokens, max_tokens;
    int stream, include_usage, requests;
} fixture;

static fixture fx;

typedef struct conn {
    char *body;
    size_t len, cap;
} conn;

typedef struct stream {
    char *text;
    size_t len;
    int stall;
} stream;

/* Hands out the prepared text 7 bytes at a time (so the client parses split events); a stalled
 * stream sends its first piece and then nothing for 3 s, then fails. */
static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    stream *s = cls;
    if (s->stall && pos > 0) {
        struct timespec ts = {0, 20 * 1000000L};
        for (int i = 0; i < 150; i++)
            nanosleep(&ts, NULL);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (pos >= s->len) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t n = s->len - pos < 7 ? s->len - pos : 7;
    if (n > max) n = max;
    memcpy(buf, s->text + pos, n);
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *s = cls;
    free(s->text);
    free(s);
}

/* Brute-force prefix cache, as servers cache: the leading whole 16-token blocks equal, block
 * for block, to the blocks of some earlier prompt (a partial last block is never cached). */
static size_t cached_of(const uint32_t *p, size_t n) {
    size_t best = 0;
    for (size_t k = 0; k < fx.n; k++) {
        const uint32_t *q = fx.prompts[k];
        size_t m = fx.plen[k], got = 0;
        for (size_t lo = 0; lo + 16 <= n && lo + 16 <= m; lo += 16) {
            if (memcmp(p + lo, q + lo, 16 * sizeof *p)) break;
            got = lo + 16;
        }
        if (got > best) best = got;
    }
    return best;
}

static enum MHD_Result respond_text(struct MHD_Connection *c, unsigned code, const char *type,
                                    const char *text) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con) {
    (void)cls;
    (void)version;
    conn *k = *con;
    if (!k) {
        k = calloc(1, sizeof *k);
        *con = k;
        return MHD_YES;
    }
    if (*upload_size) {
        if (k->len + *upload_size + 1 > k->cap) {
            k->cap = (k->len + *upload_size + 1) * 2;
            k->body = realloc(k->body, k->cap);
        }
        memcpy(k->body + k->len, upload, *upload_size);
        k->len += *upload_size;
        k->body[k->len] = 0;
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, "POST") || strcmp(url, "/v1/completions"))
        return respond_text(c, 404, "application/json",
                            "{\"error\":{\"message\":\"no such route\"}}");
    pthread_mutex_lock(&fx.mu);
    enum mode mode = fx.mode;
    fx.requests++;
    cJSON *j = k->body ? cJSON_Parse(k->body) : NULL;
    const cJSON *pr = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
    size_t n = cJSON_IsArray(pr) ? (size_t)cJSON_GetArraySize(pr) : 0;
    uint32_t *toks = malloc((n + 1) * sizeof *toks);
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, pr) toks[i++] = (uint32_t)it->valuedouble;
    const cJSON *salt = j ? cJSON_GetObjectItemCaseSensitive(j, "cache_salt") : NULL;
    snprintf(fx.salt, sizeof fx.salt, "%s", cJSON_IsString(salt) ? salt->valuestring : "");
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    snprintf(fx.auth, sizeof fx.auth, "%s", auth ? auth : "");
    const cJSON *iso = j ? cJSON_GetObjectItemCaseSensitive(j, "isokv") : NULL;
    const cJSON *pub = iso ? cJSON_GetObjectItemCaseSensitive(iso, "public_prefix_tokens") : NULL;
    fx.public_tokens = cJSON_IsNumber(pub) ? (int64_t)pub->valuedouble : -1;
    const cJSON *mt = j ? cJSON_GetObjectItemCaseSensitive(j, "max_tokens") : NULL;
    fx.max_tokens = cJSON_IsNumber(mt) ? (int64_t)mt->valuedouble : -1;
    fx.stream = j && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "stream"));
    const cJSON *so = j ? cJSON_GetObjectItemCaseSensitive(j, "stream_options") : NULL;
    fx.include_usage = so && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    size_t cached = cached_of(toks, n);
    if (fx.n == fx.cap) {
        fx.cap = fx.cap ? fx.cap * 2 : 64;
        fx.prompts = realloc(fx.prompts, fx.cap * sizeof *fx.prompts);
        fx.plen = realloc(fx.plen, fx.cap * sizeof *fx.plen);
    }
    fx.prompts[fx.n] = toks;
    fx.plen[fx.n++] = n;
    pthread_mutex_unlock(&fx.mu);
    cJSON_Delete(j);

    switch (mode) {
    case M_500:
        return respond_text(
            c, 500, "application/json",
            "{\"error\":{\"message\":\"engine on fire\",\"type\":\"server_error\"}}");
    case M_429:
        return respond_text(c, 429, "application/json", "{\"error\":{\"message\":\"queue full\"}}");
    case M_HTML:
        return respond_text(c, 200, "text/html", "<html><body>hello</body></html>");
    case M_PLAIN: {
        char b[256];
        snprintf(b, sizeof b,
                 "{\"choices\":[{\"text\":\"ok\"}],\"usage\":{\"prompt_tokens\":%zu,"
                 "\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":%zu}}}",
                 n, cached);
        return respond_text(c, 200, "application/json", b);
    }
    default:
        break;
    }
    stream *s = calloc(1, sizeof *s);
    s->text = malloc(1024);
    int len = 0;
    if (mode == M_GARBAGE)
        len = snprintf(s->text, 1024, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: <oops>\n\n");
    else {
        len = snprintf(s->text, 1024,
                       "data: {\"choices\":[{\"text\":\"a\"}]}\n\n: ping\n\ndata: "
                       "{\"choices\":[{\"text\":\"b\"}]}\n\n");
        if (mode == M_LLAMA)
            len += snprintf(s->text + len, 1024 - len,
                            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%zu,"
                            "\"completion_tokens\":2},\"timings\":{\"cache_n\":%zu}}\n\n",
                            n, cached);
        else if (mode != M_NOUSAGE)
            len += snprintf(s->text + len, 1024 - len,
                            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%zu,"
                            "\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":%"
                            "zu}}}\r\n\r\n",
                            n, cached);
        if (mode != M_NODONE) len += snprintf(s->text + len, 1024 - len, "data: [DONE]\n\n");
        if (mode == M_TRAILER) len += snprintf(s->text + len, 1024 - len, "data: {\"choices\":[]}");
    }
    s->len = (size_t)len;
    s->stall = mode == M_STALL;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 256, reader, s, stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con,
                      enum MHD_RequestTerminationCode t) {
    (void)cls;
    (void)c;
    (void)t;
    conn *k = *con;
    if (k) {
        free(k->body);
        free(k);
    }
    *con = NULL;
}

static void fixture_reset(enum mode m) {
    pthread_mutex_lock(&fx.mu);
    for (size_t i = 0; i < fx.n; i++)
        free(fx.prompts[i]);
    fx.n = 0;
    fx.mode = m;
    fx.requests = 0;
    pthread_mutex_unlock(&fx.mu);
}

static int fixture_start(void **state) {
    (void)state;
    memset(&fx, 0, sizeof fx);
    pthread_mutex_init(&fx.mu, NULL);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    fx.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0,
                            NULL, NULL, handler, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!fx.d) return -1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(fx.d, MHD_DAEMON_INFO_BIND_PORT);
    fx.port = info ? info->port : 0;
    return fx.port ? 0 : -1;
}

static int fixture_stop(void **state) {
    (void)state;
    if (fx.d) MHD_stop_daemon(fx.d);
    fixture_reset(M_GOOD);
    free(fx.prompts);
    free(fx.plen);
    return 0;
}

static int setup(void **state) {
    if (setup_all(state)) return -1;
    return fixture_start(state);
}

static int teardown(void **state) {
    fixture_stop(state);
    return teardown_all(state);
}

/* Per-request timeout of the fixture tests: generous (a loaded machine under ASan answers a
 * 15,000-token WEKA prompt slowly); the stall test uses 0.5 s. */
static const double request_timeout = 20;

static void opts_for(ikv_load_opts *o, char *url, size_t cap) {
    ikv_load_opts_default(o);
    snprintf(url, cap, "http://127.0.0.1:%u", fx.port);
    o->url = url;
    o->closed_loop = 1;
    o->concurrency = 1;
    o->timeout = request_timeout;
    o->connect_timeout = 2;
}

static void run_load(const char *trace, uint64_t max_requests, uint32_t scale, ikv_load_opts *o,
                     ikv_load_result *r) {
    ikv_trace_opts to = {0};
    to.max_requests = max_requests;
    ikv_trace *t;
    assert_int_equal(ikv_trace_open(trace, &to, &t), 0);
    o->map.scale = scale;
    assert_int_equal(ikv_load_run(t, o, r), 0);
    ikv_trace_close(t);
}

/* GOOD: every request succeeds; what was sent is what the prompt builder makes; the measured
 * hit ratio equals the fixture's brute-force cache and `isokv sim` on the sent-order trace. */
static void test_good_and_sim(void **state) {
    (void)state;
    fixture_reset(M_GOOD);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    o.concurrency = 4;
    ikv_load_result r;
    run_load(MOONCAKE, 60, 32, &o, &r);
    assert_int_equal(r.n, 60);
    assert_int_equal(r.ok, 60);
    assert_int_equal(r.sent, 60);
    assert_int_equal(fx.requests, 60);
    assert_int_equal(r.reported, 60);
    assert_int_equal(r.cached_src, IKV_CACHED_OPENAI);
    assert_true(r.cached_tokens > 0 && r.cached_tokens < r.prompt_tokens);
    assert_true(fx.stream && fx.include_usage);
    assert_string_equal(fx.salt, "tenant-0");
    assert_string_equal(fx.auth, "");
    uint64_t sum_prompt = 0;
    for (size_t i = 0; i < r.n; i++) {
        const ikv_load_record *e = &r.records[i];
        assert_int_equal(e->server_prompt_tokens, e->prompt_tokens);
        assert_true(e->first_token >= e->send && e->end >= e->first_token);
        assert_int_equal(e->completion_tokens, 2);
        sum_prompt += e->prompt_tokens;
    }
    assert_int_equal(sum_prompt, r.prompt_tokens);
    /* the prompts the fixture got, in arrival order, are the builder's for the sent order */
    char *sent = ikv_load_sent_trace(&r);
    assert_non_null(sent);
    char path[512], out[512];
    snprintf(path, sizeof path, "%s/sent.jsonl", tmpdir);
    assert_int_equal(ikv_load_write_atomic(path, sent, strlen(sent)), 0);
    ikv_free(sent);
    const char *bin = getenv("IKV_BIN");
    if (bin) {
        snprintf(out, sizeof out, "%s/sim.json", tmpdir);
        char b[512];
        snprintf(b, sizeof b, "%s", bin);
        char *const argv[] = {b, "sim", path, "--mode", "order", "--json", NULL};
        assert_int_equal(run_prog(argv, out), 0);
        char *js = slurp(out);
        cJSON *j = cJSON_Parse(js);
        assert_non_null(j);
        /* unlimited capacity both sides: the same tokens hit, exactly */
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "hit_tokens");
        assert_true(cJSON_IsNumber(h));
        assert_true(h->valuedouble == (double)r.cached_tokens);
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "requests");
        assert_true(cJSON_IsNumber(q) && q->valuedouble == 60);
        cJSON_Delete(j);
        free(js);
    }
    /* and the simulator on the original trace (trace tokens) is within the scaling's rounding */
    ikv_trace_opts to = {0};
    to.max_requests = 60;
    ikv_trace *t;
    assert_int_equal(ikv_trace_open(MOONCAKE, &to, &t), 0);
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ikv_replay_result rr;
    assert_int_equal(ikv_replay(t, &ro, &rr), 0);
    assert_true(fabs(rr.token_hit_ratio - r.token_hit_ratio) < 0.02);
    ikv_replay_result_free(&rr);
    ikv_trace_close(t);
    ikv_load_result_free(&r);
}

/* Tenants as API keys; a WEKA trace keeps each conversation's turns in order. */
static void test_keys_and_sessions(void **state) {
    (void)state;
    fixture_reset(M_GOOD);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/",
             fx.port); /* ".../v1": /completions added */
    o.tenant_mode = IKV_TENANT_KEY;
    o.tenant_prefix = "k";
    o.concurrency = 3;
    ikv_load_result r;
    run_load(WEKA, 0, 4, &o, &r);
    assert_int_equal(r.n, 86);
    assert_int_equal(r.ok, 86);
    assert_int_equal(strncmp(fx.auth, "Bearer k", 8), 0);
    assert_string_equal(fx.salt, "");
    assert_true(fx.public_tokens == -1); /* WEKA has no public segments: field not sent */
    /* within a session, a turn is sent only after the one before it ended */
    for (size_t i = 0; i < r.n; i++)
        for (size_t j = i + 1; j < r.n; j++)
            if (r.records[i].session == r.records[j].session) {
                assert_true(r.records[j].sent_order > r.records[i].sent_order);
                assert_true(r.records[j].send >= r.records[i].end);
            }
    assert_true(r.token_hit_ratio > 0.5); /* multi-turn sessions reuse their prefixes */
    ikv_load_result_free(&r);
}

static void expect_all_t(enum mode m, ikv_load_err err, long status, const char *detail_part,
                         double timeout) {
    fixture_reset(m);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    o.timeout = timeout;
    o.concurrency = 2;
    ikv_load_result r;
    run_load(MOONCAKE, 4, 32, &o, &r);
    assert_int_equal(r.n, 4);
    assert_int_equal(r.ok, 0);
    assert_int_equal(r.errors_by[err], 4);
    for (size_t i = 0; i < r.n; i++) {
        assert_int_equal(r.records[i].err, err);
        if (status >= 0) assert_int_equal(r.records[i].status, status);
        if (detail_part && !strstr(r.records[i].detail, detail_part))
            fail_msg("detail '%s' lacks '%s'", r.records[i].detail, detail_part);
    }
    char *js = ikv_load_summary_json(&r, &o, MOONCAKE, NULL);
    assert_non_null(js);
    cJSON *j = cJSON_Parse(js);
    const cJSON *eb = cJSON_GetObjectItemCaseSensitive(j, "errors_by_status");
    char key[32];
    if (err == IKV_LOAD_HTTP)
        snprintf(key, sizeof key, "%ld", status);
    else
        snprintf(key, sizeof key, "%s", ikv_load_err_name(err));
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(eb, key);
    assert_true(cJSON_IsNumber(c) && c->valuedouble == 4);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "token_hit_ratio")));
    cJSON_Delete(j);
    ikv_free(js);
    ikv_load_result_free(&r);
}

static void expect_all(enum mode m, ikv_load_err err, long status, const char *detail_part) {
    expect_all_t(m, err, status, detail_part, request_timeout);
}

static void test_errors_http(void **state) {
    (void)state;
    expect_all(M_500, IKV_LOAD_HTTP, 500, "engine on fire");
    expect_all(M_429, IKV_LOAD_HTTP, 429, "queue full");
}

static void test_errors_bodies(void **state) {
    (void)state;
    expect_all(M_HTML, IKV_LOAD_BAD_REPLY, 200, "not an OpenAI completion");
    expect_all(M_GARBAGE, IKV_LOAD_BAD_REPLY, 200, "not a JSON object");
    expect_all(M_NODONE, IKV_LOAD_BAD_REPLY, 200, "[DONE]");
    /* an event after [DONE], cut off by the end of the body (no blank line): still seen */
    expect_all(M_TRAILER, IKV_LOAD_BAD_REPLY, 200, "after [DONE]");
}

/* A stream that stalls is cut at the per-request timeout (0.5 s), long before it would end. */
static void test_errors_stall(void **state) {
    (void)state;
    expect_all_t(M_STALL, IKV_LOAD_TIMEOUT, -1, "0.5", 0.5);
}

static void test_plain_and_llama(void **state) {
    (void)state;
    fixture_reset(M_PLAIN);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    ikv_load_result r;
    run_load(MOONCAKE, 10, 32, &o, &r);
    assert_int_equal(r.ok, 10);
    assert_int_equal(r.cached_src, IKV_CACHED_OPENAI);
    double plain = r.token_hit_ratio;
    ikv_load_result_free(&r);
    fixture_reset(M_LLAMA);
    run_load(MOONCAKE, 10, 32, &o, &r);
    assert_int_equal(r.ok, 10);
    assert_int_equal(r.cached_src, IKV_CACHED_LLAMACPP);
    assert_true(fabs(r.token_hit_ratio - plain) < 1e-12);
    ikv_load_result_free(&r);
    /* a stream without usage: the requests succeed, no ratio is claimed */
    fixture_reset(M_NOUSAGE);
    run_load(MOONCAKE, 10, 32, &o, &r);
    assert_int_equal(r.ok, 10);
    assert_int_equal(r.reported, 0);
    assert_int_equal(r.cached_src, IKV_CACHED_NONE);
    char *js = ikv_load_summary_json(&r, &o, MOONCAKE, NULL);
    assert_non_null(strstr(js, "\"token_hit_ratio\":\tnull"));
    ikv_free(js);
    ikv_load_result_free(&r);
}

/* Nothing listens: every request is a connect error, and the run still ends. */
static void test_unreachable(void **state) {
    (void)state;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    getsockname(s, (struct sockaddr *)&a, &al);
    close(s); /* bound once, now free: nothing listens there */
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/", ntohs(a.sin_port));
    ikv_load_result r;
    run_load(MOONCAKE, 5, 32, &o, &r);
    assert_int_equal(r.errors_by[IKV_LOAD_CONNECT], 5);
    assert_int_equal(r.ok, 0);
    ikv_load_result_free(&r);
}

/* Bad options are refused before anything is sent. */
static void test_bad_options(void **state) {
    (void)state;
    fixture_reset(M_GOOD);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    ikv_trace_opts to = {0};
    ikv_trace *t;
    ikv_load_result r;
    assert_int_equal(ikv_trace_open(MOONCAKE, &to, &t), 0);
    o.map.scale = 3; /* does not divide 512 */
    assert_int_equal(ikv_load_run(t, &o, &r), IKV_EINVAL);
    o.map.scale = 32;
    o.url = "ftp://127.0.0.1/";
    assert_int_equal(ikv_load_run(t, &o, &r), IKV_EINVAL);
    ikv_trace_close(t);
    assert_int_equal(fx.requests, 0);
}

/* Requests in the sent-order trace (each is one {"time": ...} line). */
static size_t count_requests(const ikv_load_result *r) {
    char *sent = ikv_load_sent_trace(r);
    assert_non_null(sent);
    size_t n = 0;
    for (const char *p = sent; (p = strstr(p, "{\"time\":")); p++)
        n++;
    ikv_free(sent);
    return n;
}

/* Open loop: requests leave at trace time / rate (30 Mooncake requests at 0, 3, 6 and 9 s, run
 * 20x faster: 0, 0.15, 0.3, 0.45 s), and --duration stops sending. */
static void test_open_loop(void **state) {
    (void)state;
    fixture_reset(M_GOOD);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    o.closed_loop = 0;
    o.concurrency = 0;
    o.rate = 20;
    ikv_load_result r;
    run_load(MOONCAKE, 30, 32, &o, &r);
    assert_int_equal(r.ok, 30);
    for (size_t i = 0; i < r.n; i++)
        assert_true(r.records[i].send + 1e-9 >= r.records[i].trace_time / 20);
    assert_true(r.records[29].send >= 0.45);
    ikv_load_result_free(&r);
    /* at rate 2 the requests are due at 0, 1.5, 3 and 4.5 s: stopping after 2.2 s sends those
     * due at 0 and 1.5 s and not the rest, with 0.7 s of slack either side for a busy machine
     * (the stop is a wall-clock rule; at rate 20 the same cut left 0.05 s and once failed) */
    o.rate = 2;
    o.duration = 2.2;
    run_load(MOONCAKE, 30, 32, &o, &r);
    assert_int_equal(r.ok, 26);
    assert_int_equal(r.errors_by[IKV_LOAD_NOT_SENT], 4);
    assert_int_equal(r.sent, 26);
    assert_int_equal(count_requests(&r), 26);
    ikv_load_result_free(&r);
}

/* --max-context: requests too long for the model are counted, not sent, and left out of the
 * sent-order trace; a session's later turns still go. */
static void test_max_context(void **state) {
    (void)state;
    fixture_reset(M_GOOD);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    o.max_context = 512;
    ikv_load_result r;
    run_load(MOONCAKE, 40, 32, &o, &r);
    uint64_t too_long = 0;
    for (size_t i = 0; i < r.n; i++) {
        const ikv_load_record *e = &r.records[i];
        if (e->prompt_tokens + e->max_tokens > 512) {
            assert_int_equal(e->err, IKV_LOAD_TOO_LONG);
            assert_true(e->sent_order == UINT64_MAX);
            too_long++;
        } else {
            assert_int_equal(e->err, IKV_LOAD_OK);
        }
    }
    assert_true(too_long > 0 && too_long < 40);
    assert_int_equal(r.errors_by[IKV_LOAD_TOO_LONG], too_long);
    assert_int_equal((uint64_t)fx.requests, 40 - too_long);
    assert_int_equal(count_requests(&r), 40 - too_long);
    ikv_load_result_free(&r);
}

/* Allocation failures anywhere in a run give IKV_ENOMEM and leak nothing (ASan checks), until
 * enough allocations succeed for the run to complete. */
static void test_alloc_failure(void **state) {
    (void)state;
    fixture_reset(M_GOOD);
    ikv_load_opts o;
    char url[64];
    opts_for(&o, url, sizeof url);
    o.map.scale = 32;
    o.concurrency = 2;
    int completed_run = 0;
    for (size_t n = 0; n < 400 && !completed_run; n++) {
        ikv_trace_opts to = {0};
        to.max_requests = 3;
        ikv_trace *t;
        assert_int_equal(ikv_trace_open(MOONCAKE, &to, &t), 0);
        ikv_load_result r;
        ikv_alloc_fail_after(n);
        int rc = ikv_load_run(t, &o, &r);
        char *csv = rc == 0 ? ikv_load_requests_csv(&r) : NULL;
        char *sent = rc == 0 ? ikv_load_sent_trace(&r) : NULL;
        ikv_alloc_fail_after(SIZE_MAX);
        if (rc == 0) {
            assert_int_equal(r.n, 3);
            if (csv && sent) {
                completed_run = 1;
                assert_int_equal(r.ok, 3);
            }
            ikv_free(csv);
            ikv_free(sent);
            ikv_load_result_free(&r);
        } else {
            assert_int_equal(rc, IKV_ENOMEM);
        }
        ikv_trace_close(t);
    }
    assert_true(completed_run);
    /* the prompt builder leaves its buffer valid when growing fails */
    ikv_load_map m;
    ikv_load_map_default(&m);
    ikv_key k[4] = {{1, 1}, {2, 2}, {3, 3}, {4, 4}};
    ikv_trace_request q = {.input_tokens = 2048, .n_blocks = 4, .keys = k};
    ikv_load_prompt_buf b = {0};
    ikv_alloc_fail_after(0);
    assert_int_equal(ikv_load_prompt(&m, &q, 512, &b), IKV_ENOMEM);
    ikv_alloc_fail_after(SIZE_MAX);
    assert_null(b.tokens);
    assert_int_equal(ikv_load_prompt(&m, &q, 512, &b), 0);
    assert_int_equal(b.n, 2048);
    ikv_load_prompt_free(&b);
}

/* The CLI: files written, exit codes, and a sweep with its CSV (plots with --no-plot off only
 * when gnuplot is installed). */
static void test_cli(void **state) {
    (void)state;
    const char *bin = getenv("IKV_BIN");
    if (!bin) skip();
    fixture_reset(M_GOOD);
    char b[512], url[64], out[512], f[600];
    snprintf(b, sizeof b, "%s", bin);
    snprintf(url, sizeof url, "http://127.0.0.1:%u", fx.port);
    snprintf(out, sizeof out, "%s/cli", tmpdir);
    char *const argv[] = {
        b,   "load",          MOONCAKE,        "--url", url,     "--scale", "32", "--max-requests",
        "8", "--closed-loop", "--concurrency", "2",     "--out", out,       NULL};
    assert_int_equal(run_prog(argv, NULL), 0);
    const char *names[] = {"requests.csv", "summary.json", "sent.jsonl"};
    for (int i = 0; i < 3; i++) {
        snprintf(f, sizeof f, "%s/%s", out, names[i]);
        char *s = slurp(f);
        assert_non_null(s);
        if (i == 0) {
            int lines = 0;
            for (char *p = s; *p; p++)
                lines += *p == '\n';
            assert_int_equal(lines, 9);
        }
        free(s);
    }
    /* usage errors: exit 2; the server failing every request: exit 1 */
    char *const bad[] = {b, "load", MOONCAKE, "--scale", "3x", "--out", out, NULL};
    assert_int_equal(run_prog(bad, NULL), 2);
    char *const noout[] = {b, "load", MOONCAKE, NULL};
    assert_int_equal(run_prog(noout, NULL), 2);
    fixture_reset(M_500);
    assert_int_equal(run_prog(argv, NULL), 1);
    fixture_reset(M_GOOD);
    snprintf(out, sizeof out, "%s/sweep", tmpdir);
    char *const sw[] = {b,   "load",          WEKA,     "--url",       url,     "--scale",
                        "4", "--closed-loop", "--vary", "users=1,2,5", "--out", out,
                        NULL};
    assert_int_equal(run_prog(sw, NULL), 0);
    snprintf(f, sizeof f, "%s/sweep.csv", out);
    char *s = slurp(f);
    assert_non_null(s);
    assert_non_null(strstr(s, "\n5,86,86,0,"));
    free(s);
    snprintf(f, sizeof f, "%s/users-2/summary.json", out);
    s = slurp(f);
    assert_non_null(s);
    free(s);
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        snprintf(f, sizeof f, "%s/sweep_hit.svg", out);
        struct stat st;
        assert_int_equal(stat(f, &st), 0);
        assert_true(st.st_size > 0);
        /* A plot target that is not a regular file is refused before gnuplot runs, and no plot
         * of the set appears; the title reaches gnuplot as data (a backquote is not run). */
        snprintf(out, sizeof out, "%s/sweep2", tmpdir);
        assert_int_equal(mkdir(out, 0755), 0);
        snprintf(f, sizeof f, "%s/sweep_ttft.png", out);
        assert_int_equal(mkdir(f, 0755), 0);
        char title[] = "it's `echo PWNED` $(x)";
        char *const sw2[] = {
            b,        "load",      WEKA,      "--url", url,     "--scale", "4", "--closed-loop",
            "--vary", "users=1,2", "--title", title,   "--out", out,       NULL};
        assert_int_equal(run_prog(sw2, NULL), 1);
        snprintf(f, sizeof f, "%s/sweep.csv", out);
        assert_int_equal(stat(f, &st), 0);
        snprintf(f, sizeof f, "%s/sweep_hit.svg", out);
        assert_int_equal(stat(f, &st), -1);
        snprintf(f, sizeof f, "%s/sweep_ttft.png", out);
        assert_int_equal(rmdir(f), 0);
        assert_int_equal(run_prog(sw2, NULL), 0);
        snprintf(f, sizeof f, "%s/sweep_hit.svg", out);
        s = slurp(f);
        assert_non_null(s);
        assert_non_null(strstr(s, "`echo PWNED` $(x) (measured)"));
        assert_null(strstr(s, ">PWNED"));
        free(s);
        /* no private data or script file is left behind */
        DIR *dir = opendir(out);
        assert_non_null(dir);
        for (struct dirent *e; (e = readdir(dir));)
            assert_null(strstr(e->d_name, ".sweep"));
        closedir(dir);
    }
}

/* ---- against the real server (isokv serve), when this build has it --------------------------- */

typedef struct live {
    tu_server sv;
    uint16_t port;
    uint64_t cache_blocks;
    char trace[512];
    const char *policy;
} live;

static live lv;

static size_t on_body(char *p, size_t size, size_t n, void *ctx) {
    char **buf = ctx;
    size_t old = *buf ? strlen(*buf) : 0;
    *buf = realloc(*buf, old + size * n + 1);
    memcpy(*buf + old, p, size * n);
    (*buf)[old + size * n] = 0;
    return size * n;
}

/* GET url's body (NULL on failure), bounded to 5 s. */
static char *http_get(const char *url) {
    CURL *h = curl_easy_init();
    char *body = NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) {
        free(body);
        return NULL;
    }
    return body;
}

/* Sum of the samples of a Prometheus counter over all its label sets. */
static double metric_sum(const char *text, const char *name) {
    double sum = 0;
    size_t nl = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, name, nl) || (p[nl] != '{' && p[nl] != ' ')) continue;
        const char *sp = strchr(p, ' ');
        const char *eol = strchr(p, '\n');
        if (sp && (!eol || sp < eol)) sum += strtod(sp + 1, NULL);
    }
    return sum;
}

static int have_serve(const char *bin) {
    char b[512];
    snprintf(b, sizeof b, "%s", bin);
    char *const argv[] = {b, "serve", "--help", NULL};
    return run_prog(argv, NULL) == 0;
}

/* Starts `isokv serve` on a free port (--port 0; the port is read from what it prints), with a
 * cache small enough that the load evicts, and a small synthetic trace from `isokv gen`. */
static int live_start_keys(const char *policy, int keys);

static int live_start(const char *policy) {
    return live_start_keys(policy, 0);
}

static int live_start_keys(const char *policy, int keys) {
    memset(&lv, 0, sizeof lv);
    lv.policy = policy;
    const char *bin = getenv("IKV_BIN");
    if (!bin || !have_serve(bin)) return 0; /* the test skips */
    char b[512];
    snprintf(b, sizeof b, "%s", bin);
    snprintf(lv.trace, sizeof lv.trace, "%s/live_%s.jsonl", tmpdir, policy);
    char *const gen[] = {b,        "gen",
                         "-q",     "-o",
                         lv.trace, "--users",
                         "8",      "--apps",
                         "2",      "--system-tokens",
                         "64",     "--tool-tokens",
                         "0",      "--memory-tokens",
                         "48",     "--memory-item-tokens",
                         "16",     "--docs",
                         "1",      "--corpus",
                         "40",     "--doc-tokens",
                         "32",     "--turns",
                         "3",      "--think",
                         "1",      "--rate",
                         "20",     "--duration",
                         "100000", "--requests",
                         "48",     "--query-tokens",
                         "16",     "--output-tokens",
                         "4",      NULL};
    if (run_prog(gen, NULL) != 0) return -1;
    char keyfile[600];
    snprintf(keyfile, sizeof keyfile, "%s/keys_%s.json", tmpdir, policy);
    if (keys) { /* the key file `isokv load --tenants key` needs, written by the CLI */
        char *const wk[] = {b, "load", lv.trace, "--write-keys", keyfile, NULL};
        if (run_prog(wk, NULL) != 0) return -1;
    }
    const char *argv[] = {"--model",
                          "data/models/stories260K/stories260K.bin",
                          "--tokenizer",
                          "data/models/stories260K/tok512.bin",
                          "--threads",
                          "1",
                          "--kv-mem",
                          "2M",
                          "--policy",
                          policy,
                          keys ? "--api-keys" : NULL,
                          keyfile,
                          NULL};
    if (tu_serve_start(&lv.sv, argv)) return -1;
    lv.port = (uint16_t)lv.sv.port;
    const char *c = strstr(lv.sv.banner, "cache ");
    while (c && !(c[6] >= '0' && c[6] <= '9'))
        c = strstr(c + 1, "cache ");
    if (c) lv.cache_blocks = strtoull(c + 6, NULL, 10);
    return lv.cache_blocks ? 0 : -1;
}

static int live_lru(void **state) {
    (void)state;
    return live_start("lru");
}

static int live_keys(void **state) {
    (void)state;
    return live_start_keys("lru", 1);
}

static int live_value(void **state) {
    (void)state;
    return live_start("value");
}

/* SIGTERM (the server drains and exits 0), SIGKILL after 15 s; also runs when the test failed. */
static int live_stop(void **state) {
    (void)state;
    if (lv.sv.pid <= 0) return 0;
    return tu_serve_stop(&lv.sv, 15) == 0 ? 0 : -1;
}

/* A small load against the real server: every request succeeds, the cached tokens the answers
 * report equal the server's own metrics, and the hit ratio matches `isokv sim --mode order` on
 * the same requests in the same order with the server's cache size and policy (within 0.02,
 * the bound; at concurrency 1 it has been exact). Then three in flight. */
static void live_body(void) {
    if (!lv.port) skip();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", lv.port);
    double prompt_before = 0, cached_before = 0;
    for (int conc = 1; conc <= 3; conc += 2) {
        ikv_load_opts o;
        ikv_load_opts_default(&o);
        o.url = url;
        o.closed_loop = 1;
        o.concurrency = (uint32_t)conc;
        o.timeout = 60;
        o.map.seed = (uint64_t)conc; /* the second load's tokens never meet the first's */
        ikv_load_result r;
        run_load(lv.trace, 0, 1, &o, &r);
        assert_int_equal(r.n, 48);
        assert_int_equal(r.ok, 48);
        assert_int_equal(r.reported, 48);
        assert_int_equal(r.cached_src, IKV_CACHED_OPENAI);
        assert_true(r.cached_tokens > 0);
        for (size_t i = 0; i < r.n; i++)
            assert_int_equal(r.records[i].server_prompt_tokens, r.records[i].prompt_tokens);
        /* the server's own counters moved by exactly what its answers said */
        char murl[96];
        snprintf(murl, sizeof murl, "%s/metrics", url);
        char *m = http_get(murl);
        assert_non_null(m);
        double prompt = metric_sum(m, "isokv_prompt_tokens_total");
        double cached = metric_sum(m, "isokv_cached_prompt_tokens_total");
        free(m);
        assert_true(prompt - prompt_before == (double)r.prompt_tokens);
        assert_true(cached - cached_before == (double)r.cached_tokens);
        prompt_before = prompt;
        cached_before = cached;
        if (conc > 1) { /* the first load's blocks are still cached: the sim cannot start empty */
            ikv_load_result_free(&r);
            continue;
        }
        /* the simulator on the sent order, with the server's cache */
        char path[512], out[512], cap[32], pol[32], b[512];
        snprintf(path, sizeof path, "%s/live_sent_%s.jsonl", tmpdir, lv.policy);
        char *sent = ikv_load_sent_trace(&r);
        assert_non_null(sent);
        assert_int_equal(ikv_load_write_atomic(path, sent, strlen(sent)), 0);
        ikv_free(sent);
        snprintf(out, sizeof out, "%s/live_sim_%s.json", tmpdir, lv.policy);
        snprintf(cap, sizeof cap, "%llu", (unsigned long long)lv.cache_blocks * r.block_tokens);
        snprintf(pol, sizeof pol, "%s", lv.policy);
        snprintf(b, sizeof b, "%s", getenv("IKV_BIN"));
        /* the server pins public prefixes (within half the cache): --pin-public does the same */
        char *const argv[] = {b,       "sim",          path,     "--mode",
                              "order", "--policy",     pol,      "--capacity-tokens",
                              cap,     "--pin-public", "--json", NULL};
        assert_int_equal(run_prog(argv, out), 0);
        char *js = slurp(out);
        cJSON *j = cJSON_Parse(js);
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "hit_tokens");
        assert_true(cJSON_IsNumber(h));
        double sim_ratio = h->valuedouble / (double)r.prompt_tokens;
        print_message(
            "live %s: cache %llu blocks, measured %.6f (%llu cached), isokv sim %.6f (%.0f)\n",
            lv.policy, (unsigned long long)lv.cache_blocks, r.token_hit_ratio,
            (unsigned long long)r.cached_tokens, sim_ratio, h->valuedouble);
        assert_true(fabs(sim_ratio - r.token_hit_ratio) <= 0.02);
        /* the cache really was too small: the simulator evicted */
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "evictions");
        assert_true(cJSON_IsNumber(ev) && ev->valuedouble > 0);
        /* the timed mode on the measured service times (ttft_s, latency_s and the server's
         * queue_s in sent.jsonl): one request in flight never overlaps another, so locks and
         * pending blocks change nothing and it equals order mode to the token */
        for (size_t i = 0; i < r.n; i++)
            assert_true(r.records[i].server_queue >= 0);
        char *sj = slurp(path);
        assert_non_null(strstr(sj, "\"queue_s\": "));
        assert_non_null(strstr(sj, "\"ttft_s\": "));
        free(sj);
        char out2[512];
        snprintf(out2, sizeof out2, "%s/live_sim_timed_%s.json", tmpdir, lv.policy);
        char *const argv2[] = {
            b,           "sim",          path,       "--mode", "timed",
            "--service", "trace",        "--policy", pol,      "--capacity-tokens",
            cap,         "--pin-public", "--json",   NULL};
        assert_int_equal(run_prog(argv2, out2), 0);
        char *js2 = slurp(out2);
        cJSON *j2 = cJSON_Parse(js2);
        const cJSON *h2 = cJSON_GetObjectItemCaseSensitive(j2, "hit_tokens");
        assert_true(cJSON_IsNumber(h2));
        assert_true(h2->valuedouble == h->valuedouble);
        cJSON_Delete(j2);
        free(js2);
        cJSON_Delete(j);
        free(js);
        ikv_load_result_free(&r);
    }
}

/* Tenants as API keys against a server started with the key file `isokv load --write-keys`
 * wrote: with those keys every request succeeds; with keys the server does not know, every
 * request is a counted 401 and the run still ends. */
static void test_live_serve_keys(void **state) {
    (void)state;
    if (!lv.port) skip();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", lv.port);
    ikv_load_opts o;
    ikv_load_opts_default(&o);
    o.url = url;
    o.closed_loop = 1;
    o.concurrency = 2;
    o.tenant_mode = IKV_TENANT_KEY;
    ikv_load_result r;
    run_load(lv.trace, 12, 1, &o, &r);
    assert_int_equal(r.ok, 12);
    assert_true(r.cached_tokens > 0);
    ikv_load_result_free(&r);
    o.tenant_prefix = "stranger-";
    run_load(lv.trace, 12, 1, &o, &r);
    assert_int_equal(r.ok, 0);
    assert_int_equal(r.errors_by[IKV_LOAD_HTTP], 12);
    for (size_t i = 0; i < r.n; i++)
        assert_int_equal(r.records[i].status, 401);
    ikv_load_result_free(&r);
}

static void test_live_serve_lru(void **state) {
    (void)state;
    live_body();
}

static void test_live_serve_value(void **state) {
    (void)state;
    live_body();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_split),
        cmocka_unit_test(test_sse_bound),
        cmocka_unit_test(test_reply_fields),
        cmocka_unit_test(test_mapping_mooncake),
        cmocka_unit_test(test_mapping_weka),
        cmocka_unit_test(test_max_tokens),
        cmocka_unit_test(test_percentile),
        cmocka_unit_test(test_atomic),
        cmocka_unit_test(test_csv_quoting),
        cmocka_unit_test(test_good_and_sim),
        cmocka_unit_test(test_keys_and_sessions),
        cmocka_unit_test(test_errors_http),
        cmocka_unit_test(test_errors_bodies),
        cmocka_unit_test(test_errors_stall),
        cmocka_unit_test(test_plain_and_llama),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_open_loop),
        cmocka_unit_test(test_max_context),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_cli),
        cmocka_unit_test_setup_teardown(test_live_serve_lru, live_lru, live_stop),
        cmocka_unit_test_setup_teardown(test_live_serve_value, live_value, live_stop),
        cmocka_unit_test_setup_teardown(test_live_serve_keys, live_keys, live_stop),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
