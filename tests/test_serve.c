/*
 * Tests of isokv serve over real HTTP: the test starts `isokv serve --port 0` (the binary CTest
 * names in IKV_BIN) on loopback, reads the port it prints, waits for /health, talks to it with
 * libcurl, and stops it with SIGTERM in the group teardown (which runs also when a test fails;
 * the child also dies with the test process through PR_SET_PDEATHSIG). Covered: every endpoint,
 * plain and streamed answers, usage, every error status, tenants and public prefixes (isolation),
 * a resent prompt computing one position, disconnect cancelling, the drain exit code, a
 * bounded load test (64 concurrent streams, 2,000 requests); lower tiers (--tier mem and a file
 * tier shared by two servers), routing by class, and preemption (texts as alone).
 */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

/* ---- the server under test -------------------------------------------------------------- */

typedef tu_server server; /* pid, port, dir (the test's own files), banner */

static server S1; /* tenants, public prefix */

static const char *PUBLIC_TEXT =
    "You are a helpful assistant who tells short stories about animals, children and the "
    "sea. Keep every story simple and kind.";

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Starts isokv serve with extra arguments; fills sv. */
static int server_start(server *sv, const char *const *extra) {
    return tu_serve_start(sv, extra);
}

/* SIGTERM, then waits (at most 30 s, then SIGKILL); returns the exit status or -1. */
static int server_stop(server *sv) {
    return tu_serve_stop(sv, 30);
}

static long rss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) v = atol(line + 6);
    fclose(f);
    return v;
}

/* ---- HTTP ---------------------------------------------------------------------------------- */

typedef struct resp {
    long status;
    char *body;
    size_t len;
    char retry_after[32], allow[32], ctype[64];
    int abort_after; /* abort the transfer after this many bytes (0: never) */
} resp;

static size_t on_body(char *p, size_t sz, size_t nm, void *u) {
    resp *r = u;
    size_t k = sz * nm;
    r->body = realloc(r->body, r->len + k + 1);
    memcpy(r->body + r->len, p, k);
    r->len += k;
    r->body[r->len] = 0;
    if (r->abort_after && r->len >= (size_t)r->abort_after) return 0;
    return k;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *u) {
    resp *r = u;
    size_t k = sz * nm;
    char line[256];
    size_t n = k < sizeof line - 1 ? k : sizeof line - 1;
    memcpy(line, p, n);
    line[n] = 0;
    char *e = strpbrk(line, "\r\n");
    if (e) *e = 0;
    if (!strncasecmp(line, "Retry-After: ", 13)) snprintf(r->retry_after, 32, "%.31s", line + 13);
    if (!strncasecmp(line, "Allow: ", 7)) snprintf(r->allow, 32, "%.31s", line + 7);
    if (!strncasecmp(line, "Content-Type: ", 14)) snprintf(r->ctype, 64, "%.63s", line + 14);
    return k;
}

/* Prepares an easy handle for METHOD path with an optional body and API key. */
static CURL *prep(int port, const char *method, const char *path, const char *key, const char *body,
                  resp *r, struct curl_slist **hs) {
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    *hs = curl_slist_append(NULL, "Content-Type: application/json");
    if (key) {
        char h[128];
        snprintf(h, sizeof h, "Authorization: Bearer %s", key);
        *hs = curl_slist_append(*hs, h);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hs);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    return c;
}

static resp http(int port, const char *method, const char *path, const char *key,
                 const char *body) {
    resp r = {0};
    struct curl_slist *hs;
    CURL *c = prep(port, method, path, key, body, &r, &hs);
    CURLcode cc = curl_easy_perform(c);
    if (cc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(hs);
    curl_easy_cleanup(c);
    return r;
}

static cJSON *json_of(const resp *r) {
    cJSON *j = cJSON_Parse(r->body ? r->body : "");
    if (!j) fail_msg("not JSON (status %ld): %s", r->status, r->body ? r->body : "(none)");
    return j;
}

/* j[a][b]... by keys and array indices ("choices", "0", "text"), NULL-terminated. */
static cJSON *path_get(cJSON *j, ...) {
    va_list ap;
    va_start(ap, j);
    const char *k;
    while (j && (k = va_arg(ap, const char *)))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(k))
                             : cJSON_GetObjectItemCaseSensitive(j, k);
    va_end(ap);
    return j;
}
static double num(cJSON *j, ...) {
    va_list ap;
    va_start(ap, j);
    const char *k;
    while (j && (k = va_arg(ap, const char *)))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(k))
                             : cJSON_GetObjectItemCaseSensitive(j, k);
    va_end(ap);
    if (!cJSON_IsNumber(j)) fail_msg("expected a number");
    return j->valuedouble;
}
static const char *str(cJSON *j, ...) {
    va_list ap;
    va_start(ap, j);
    const char *k;
    while (j && (k = va_arg(ap, const char *)))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(k))
                             : cJSON_GetObjectItemCaseSensitive(j, k);
    va_end(ap);
    if (!cJSON_IsString(j)) fail_msg("expected a string");
    return j->valuestring;
}

/* An error answer: status, OpenAI error object, param (or NULL), a message containing `has`. */
static void expect_error(resp r, long status, const char *param, const char *has) {
    if (r.status != status) fail_msg("status %ld, expected %ld: %s", r.status, status, r.body);
    cJSON *j = json_of(&r);
    cJSON *e = path_get(j, "error", NULL);
    assert_non_null(e);
    assert_true(cJSON_IsString(path_get(e, "message", NULL)));
    assert_true(cJSON_IsString(path_get(e, "type", NULL)));
    assert_non_null(path_get(e, "code", NULL));
    cJSON *p = path_get(e, "param", NULL);
    assert_non_null(p);
    if (param) {
        assert_true(cJSON_IsString(p));
        assert_string_equal(p->valuestring, param);
    }
    if (has && !strstr(path_get(e, "message", NULL)->valuestring, has))
        fail_msg("message '%s' does not say '%s'", path_get(e, "message", NULL)->valuestring, has);
    cJSON_Delete(j);
    free(r.body);
}

/* The value of a metric line "name{labels} value" (labels exactly as given, or none). */
static double metric(int port, const char *series) {
    resp r = http(port, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    double v = -1;
    size_t sl = strlen(series);
    for (char *line = r.body; line && *line;) {
        char *nl = strchr(line, '\n');
        if (!strncmp(line, series, sl) && line[sl] == ' ') v = atof(line + sl + 1);
        line = nl ? nl + 1 : NULL;
    }
    free(r.body);
    return v;
}

/* Parses an SSE body: concatenated text (text or delta.content), chunk count, the usage
 * object (a copy, or NULL), the finish reason; checks the data: framing and final [DONE]. */
typedef struct sse {
    char text[8192];
    int chunks, done;
    cJSON *usage;
    char finish[16];
} sse;

static void parse_sse(const char *body, sse *o) {
    memset(o, 0, sizeof *o);
    const char *p = body;
    while (p && *p) {
        const char *nl = strstr(p, "\n\n");
        assert_non_null(nl); /* every event ends with a blank line */
        assert_memory_equal(p, "data: ", 6);
        size_t len = (size_t)(nl - p) - 6;
        char *d = strndup(p + 6, len);
        if (!strcmp(d, "[DONE]")) {
            o->done = 1;
            assert_string_equal(nl + 2, ""); /* nothing after [DONE] */
        } else {
            assert_false(o->done);
            cJSON *j = cJSON_Parse(d);
            assert_non_null(j);
            assert_non_null(path_get(j, "id", NULL));
            cJSON *c0 = path_get(j, "choices", "0", NULL);
            if (c0) {
                cJSON *t = path_get(c0, "text", NULL);
                if (!t) t = path_get(c0, "delta", "content", NULL);
                if (cJSON_IsString(t))
                    strncat(o->text, t->valuestring, sizeof o->text - strlen(o->text) - 1);
                cJSON *f = path_get(c0, "finish_reason", NULL);
                if (cJSON_IsString(f)) snprintf(o->finish, sizeof o->finish, "%s", f->valuestring);
            }
            cJSON *u = path_get(j, "usage", NULL);
            if (cJSON_IsObject(u)) o->usage = cJSON_Duplicate(u, 1);
            o->chunks++;
            cJSON_Delete(j);
        }
        free(d);
        p = nl + 2;
    }
}

/* ---- setup ------------------------------------------------------------------------------ */

static int setup(void **st) {
    (void)st;
    curl_global_init(CURL_GLOBAL_ALL);
    if (tu_tmpdir(S1.dir, sizeof S1.dir, "serve")) return -1;
    char keys[128], pub[128];
    snprintf(keys, sizeof keys, "%s/keys.json", S1.dir);
    snprintf(pub, sizeof pub, "%s/public.txt", S1.dir);
    write_file(keys, "{\"key-a\": \"alice\", \"key-b\": \"bob\"}");
    write_file(pub, PUBLIC_TEXT);
    const char *extra[] = {"--api-keys",  keys, "--public-prefix", pub,   "--max-seqs", "8",
                           "--max-queue", "4",  "--kv-mem",        "16M", "--drain-s",  "20",
                           NULL};
    return server_start(&S1, extra);
}

static int teardown(void **st) {
    (void)st;
    int rc = server_stop(&S1);
    tu_rmtree(S1.dir);
    curl_global_cleanup();
    if (rc != 0) fprintf(stderr, "server exit status %d after SIGTERM (expected 0)\n", rc);
    return rc == 0 ? 0 : -1;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

static void test_health_models_metrics(void **st) {
    (void)st;
    resp r = http(S1.port, "GET", "/health", NULL, NULL);
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    assert_string_equal(str(j, "status", NULL), "ok");
    cJSON_Delete(j), free(r.body);
    r = http(S1.port, "GET", "/v1/models", "key-a", NULL);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_string_equal(str(j, "object", NULL), "list");
    assert_string_equal(str(j, "data", "0", "id", NULL), "stories260K");
    assert_string_equal(str(j, "data", "0", "object", NULL), "model");
    cJSON_Delete(j), free(r.body);
    r = http(S1.port, "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.ctype, "text/plain"));
    const char *names[] = {"isokv_requests_total",
                           "isokv_prompt_tokens_total",
                           "isokv_cached_prompt_tokens_total",
                           "isokv_prefix_cache_hit_ratio",
                           "isokv_blocks_inserted_total",
                           "isokv_blocks_evicted_total",
                           "isokv_blocks_demoted_total",
                           "isokv_blocks_promoted_total",
                           "isokv_tier_loads_total",
                           "isokv_recomputed_blocks_total",
                           "isokv_running_sequences",
                           "isokv_queued_requests",
                           "isokv_kv_pool_blocks_used",
                           "isokv_ttft_seconds",
                           "isokv_time_per_output_token_seconds",
                           "isokv_e2e_latency_seconds"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char t[128];
        snprintf(t, sizeof t, "# TYPE %s ", names[i]);
        if (!strstr(r.body, t)) fail_msg("metrics lack %s", names[i]);
    }
    assert_non_null(strstr(r.body, "isokv_ttft_seconds_bucket{le=\"+Inf\"}"));
    free(r.body);
}

/* A completion, checked field by field; returns the text (malloc'd) and usage numbers. */
static char *complete(const char *key, const char *body, double *prompt, double *cached,
                      double *completion) {
    resp r = http(S1.port, "POST", "/v1/completions", key, body);
    if (r.status != 200) fail_msg("status %ld: %s", r.status, r.body);
    cJSON *j = json_of(&r);
    assert_string_equal(str(j, "object", NULL), "text_completion");
    assert_memory_equal(str(j, "id", NULL), "cmpl-", 5);
    assert_true(num(j, "created", NULL) > 1.6e9);
    assert_string_equal(str(j, "model", NULL), "stories260K");
    assert_int_equal((int)num(j, "choices", "0", "index", NULL), 0);
    const char *fr = str(j, "choices", "0", "finish_reason", NULL);
    assert_true(!strcmp(fr, "stop") || !strcmp(fr, "length"));
    double p = num(j, "usage", "prompt_tokens", NULL),
           c = num(j, "usage", "completion_tokens", NULL);
    assert_true(num(j, "usage", "total_tokens", NULL) == p + c);
    double ca = num(j, "usage", "prompt_tokens_details", "cached_tokens", NULL);
    assert_true(num(j, "usage", "isokv", "cached_tokens_by_tier", "pool", NULL) == ca);
    assert_true(num(j, "usage", "isokv", "ttft_ms", NULL) > 0);
    assert_true(ca < p);
    if (prompt) *prompt = p;
    if (cached) *cached = ca;
    if (completion) *completion = c;
    char *t = strdup(str(j, "choices", "0", "text", NULL));
    cJSON_Delete(j), free(r.body);
    return t;
}

static void test_completions(void **st) {
    (void)st;
    double p, c, n;
    const char *body = "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time, there was a "
                       "big dog named Max. Max liked to run\",\"max_tokens\":12,\"temperature\":0}";
    char *t1 = complete("key-a", body, &p, &c, &n);
    assert_int_equal((int)n, 12);
    assert_true(strlen(t1) > 0);
    /* the same prompt again: greedy gives the same text, and only the last position is
     * computed (full blocks plus the parked partial block) */
    char *t2 = complete("key-a", body, &p, &c, &n);
    assert_string_equal(t1, t2);
    assert_int_equal((int)c, (int)p - 1);
    free(t2);
    /* a list of one string is the same prompt */
    const char *body1 = "{\"prompt\":[\"Once upon a time, there was a big dog named Max. Max liked "
                        "to run\"],\"max_tokens\":12,\"temperature\":0}";
    t2 = complete("key-a", body1, &p, &c, &n);
    assert_string_equal(t1, t2);
    free(t2), free(t1);
    /* token ids, the form load generators send */
    t1 = complete("key-a",
                  "{\"prompt\":[1,403,407,261,378,267,419],\"max_tokens\":5,\"temperature\":0}", &p,
                  &c, &n);
    assert_int_equal((int)p, 7);
    assert_int_equal((int)n, 5);
    free(t1);
    t1 = complete("key-a", "{\"prompt\":[[1,403,407,261]],\"max_tokens\":3,\"temperature\":0}", &p,
                  &c, &n);
    assert_int_equal((int)p, 4);
    free(t1);
    /* a stop string ends the text before it */
    t1 = complete("key-a", "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0}",
                  &p, &c, &n);
    char stop[8] = {0};
    size_t L = strlen(t1);
    assert_true(L > 12);
    memcpy(stop, t1 + 8, 4); /* four bytes from the middle of the greedy text */
    char body2[256];
    snprintf(
        body2, sizeof body2,
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,\"stop\":[\"%s\"]}",
        stop);
    resp r = http(S1.port, "POST", "/v1/completions", "key-a", body2);
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    const char *txt = str(j, "choices", "0", "text", NULL);
    assert_true(strlen(txt) <= 8);
    assert_memory_equal(txt, t1, strlen(txt));
    assert_null(strstr(txt, stop));
    assert_string_equal(str(j, "choices", "0", "finish_reason", NULL), "stop");
    cJSON_Delete(j), free(r.body), free(t1);
    /* seeded sampling is reproducible */
    const char *sb = "{\"prompt\":\"The cat\",\"max_tokens\":10,\"temperature\":0.9,\"top_p\":0.9,"
                     "\"seed\":42}";
    t1 = complete("key-a", sb, NULL, NULL, NULL);
    t2 = complete("key-a", sb, NULL, NULL, NULL);
    assert_string_equal(t1, t2);
    free(t1), free(t2);
}

/* A list of prompts: one choice per prompt (index i), each the text that prompt gets alone
 * (greedy), usage summed; streamed, the chunks of each index add up to the same texts. */
static void test_multi_prompt(void **st) {
    (void)st;
    double p0, p1, n0, n1;
    char *a =
        complete("key-a", "{\"prompt\":\"The little bird\",\"max_tokens\":9,\"temperature\":0}",
                 &p0, NULL, &n0);
    char *b =
        complete("key-a", "{\"prompt\":\"Sam and his dad\",\"max_tokens\":9,\"temperature\":0}",
                 &p1, NULL, &n1);
    const char *body = "{\"prompt\":[\"The little bird\",\"Sam and his dad\"],\"max_tokens\":9,"
                       "\"temperature\":0}";
    resp r = http(S1.port, "POST", "/v1/completions", "key-a", body);
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    assert_int_equal(cJSON_GetArraySize(path_get(j, "choices", NULL)), 2);
    assert_int_equal((int)num(j, "choices", "1", "index", NULL), 1);
    assert_string_equal(str(j, "choices", "0", "text", NULL), a);
    assert_string_equal(str(j, "choices", "1", "text", NULL), b);
    assert_true(num(j, "usage", "prompt_tokens", NULL) == p0 + p1);
    assert_true(num(j, "usage", "completion_tokens", NULL) == n0 + n1);
    cJSON_Delete(j), free(r.body);
    const char *sb =
        "{\"prompt\":[\"The little bird\",\"Sam and his dad\"],\"max_tokens\":9,"
        "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    r = http(S1.port, "POST", "/v1/completions", "key-a", sb);
    assert_int_equal(r.status, 200);
    char t[2][512] = {"", ""};
    int fin[2] = {0, 0};
    double usage_ct = -1;
    for (char *line = strstr(r.body, "data: "); line; line = strstr(line + 1, "data: ")) {
        char *end = strstr(line, "\n\n");
        assert_non_null(end);
        if (!strncmp(line + 6, "[DONE]", 6)) break;
        char *d = strndup(line + 6, (size_t)(end - line - 6));
        cJSON *c = cJSON_Parse(d);
        assert_non_null(c);
        cJSON *c0 = path_get(c, "choices", "0", NULL);
        if (c0) {
            int k = (int)num(c0, "index", NULL);
            assert_true(k == 0 || k == 1);
            strcat(t[k], str(c0, "text", NULL));
            if (cJSON_IsString(path_get(c0, "finish_reason", NULL))) fin[k]++;
        } else {
            usage_ct = num(c, "usage", "completion_tokens", NULL);
        }
        cJSON_Delete(c), free(d);
    }
    assert_string_equal(t[0], a);
    assert_string_equal(t[1], b);
    assert_true(fin[0] == 1 && fin[1] == 1);
    assert_true(usage_ct == n0 + n1);
    free(r.body), free(a), free(b);
}

static void test_chat(void **st) {
    (void)st;
    const char *body = "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"system\",\"content\":"
                       "\"Tell a story.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                       "\"text\":\"A dog\"}]}],\"max_tokens\":8,\"temperature\":0,\"user\":\"u1\"}";
    resp r = http(S1.port, "POST", "/v1/chat/completions", "key-b", body);
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    assert_string_equal(str(j, "object", NULL), "chat.completion");
    assert_memory_equal(str(j, "id", NULL), "chatcmpl-", 9);
    assert_string_equal(str(j, "choices", "0", "message", "role", NULL), "assistant");
    const char *content = str(j, "choices", "0", "message", "content", NULL);
    assert_int_equal((int)num(j, "usage", "completion_tokens", NULL), 8);
    assert_string_equal(str(j, "choices", "0", "finish_reason", NULL), "length");
    char *plain = strdup(content);
    cJSON_Delete(j), free(r.body);
    /* streamed: role chunk, content chunks, finish chunk, usage chunk, [DONE]; same text */
    char sbody[512];
    snprintf(sbody, sizeof sbody,
             "%.*s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             (int)strlen(body) - 1, body);
    r = http(S1.port, "POST", "/v1/chat/completions", "key-b", sbody);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.ctype, "text/event-stream"));
    sse o;
    parse_sse(r.body, &o);
    assert_true(o.done);
    assert_string_equal(o.text, plain);
    assert_string_equal(o.finish, "length");
    assert_non_null(o.usage);
    assert_int_equal((int)num(o.usage, "completion_tokens", NULL), 8);
    assert_true(num(o.usage, "prompt_tokens_details", "cached_tokens", NULL) > 0); /* resent */
    assert_non_null(strstr(r.body, "\"role\":\"assistant\""));
    cJSON_Delete(o.usage), free(r.body), free(plain);
}

static void test_stream_completions(void **st) {
    (void)st;
    const char *b = "{\"prompt\":\"Lily went to the park with her mom.\",\"max_tokens\":20,"
                    "\"temperature\":0}";
    char *plain = complete("key-b", b, NULL, NULL, NULL);
    const char *sb = "{\"prompt\":\"Lily went to the park with her mom.\",\"max_tokens\":20,"
                     "\"temperature\":0,\"stream\":true}";
    resp r = http(S1.port, "POST", "/v1/completions", "key-b", sb);
    assert_int_equal(r.status, 200);
    sse o;
    parse_sse(r.body, &o);
    assert_true(o.done);
    assert_true(o.chunks >= 2); /* text (pieces made meanwhile travel together), finish */
    assert_null(o.usage);       /* no include_usage: no usage chunk */
    assert_string_equal(o.text, plain);
    assert_null(strstr(r.body, "\"usage\""));
    free(r.body), free(plain);
}

static void test_errors(void **st) {
    (void)st;
    const int P = S1.port;
    expect_error(http(P, "POST", "/v1/completions", "key-a", "{\"prompt\": \"x\""), 400, NULL,
                 "JSON");
    expect_error(http(P, "POST", "/v1/completions", "key-a", "[1,2]"), 400, NULL, "object");
    expect_error(http(P, "POST", "/v1/completions", "key-a", "{\"max_tokens\":3}"), 400, "prompt",
                 "required");
    expect_error(
        http(P, "POST", "/v1/completions", "key-a", "{\"prompt\":\"a\",\"temperature\":\"hot\"}"),
        400, "temperature", "temperature");
    expect_error(http(P, "POST", "/v1/completions", "key-a", "{\"prompt\":\"a\",\"n\":2}"), 400,
                 "n", NULL);
    expect_error(http(P, "POST", "/v1/completions", "key-a", "{\"prompt\":\"a\",\"echo\":true}"),
                 400, "echo", "not supported");
    expect_error(http(P, "POST", "/v1/completions", "key-a", "{\"prompt\":\"a\",\"max_tokens\":0}"),
                 400, "max_tokens", NULL);
    {
        char many[256] = "{\"prompt\":[";
        for (int i = 0; i < 17; i++)
            strcat(many, i ? ",\"a\"" : "\"a\"");
        strcat(many, "]}");
        expect_error(http(P, "POST", "/v1/completions", "key-a", many), 400, "prompt",
                     "at most 16");
    }
    expect_error(http(P, "POST", "/v1/completions", "key-a", "{\"prompt\":[1,99999]}"), 400,
                 "prompt", "vocabulary");
    expect_error(http(P, "POST", "/v1/completions", "key-a", "{\"prompt\":\"a\",\"stop\":5}"), 400,
                 "stop", NULL);
    expect_error(http(P, "POST", "/v1/chat/completions", "key-a",
                      "{\"messages\":[{\"role\":\"wizard\","
                      "\"content\":\"x\"}]}"),
                 400, "messages", "role");
    expect_error(
        http(P, "POST", "/v1/completions", "key-a", "{\"prompt\":\"a\",\"model\":\"gpt-9\"}"), 404,
        "model", "gpt-9");
    /* a prompt longer than the context: both lengths in the message */
    char big[8192] = "{\"prompt\":[";
    for (int i = 0; i < 600; i++)
        strcat(big, i ? ",300" : "1");
    strcat(big, "]}");
    expect_error(http(P, "POST", "/v1/completions", "key-a", big), 400, "prompt", "600 tokens");
    expect_error(http(P, "POST", "/v1/completions", "key-a", big), 400, "prompt", "512");
    /* keys */
    expect_error(http(P, "POST", "/v1/completions", NULL, "{\"prompt\":\"a\"}"), 401, NULL,
                 "API key");
    expect_error(http(P, "POST", "/v1/completions", "key-x", "{\"prompt\":\"a\"}"), 401, NULL,
                 NULL);
    expect_error(http(P, "GET", "/v1/models", "nope", NULL), 401, NULL, NULL);
    /* routes and methods */
    expect_error(http(P, "GET", "/v2/things", "key-a", NULL), 404, NULL, "/v2/things");
    resp r = http(P, "GET", "/v1/completions", "key-a", NULL);
    assert_string_equal(r.allow, "POST");
    expect_error(r, 405, NULL, "POST");
    r = http(P, "DELETE", "/health", NULL, NULL);
    assert_string_equal(r.allow, "GET");
    expect_error(r, 405, NULL, NULL);
    /* a body over 1 MiB */
    size_t n = (1 << 20) + 100;
    char *huge = malloc(n + 1);
    memset(huge, ' ', n);
    memcpy(huge, "{\"prompt\":\"", 11);
    huge[n - 2] = '"', huge[n - 1] = '}', huge[n] = 0;
    expect_error(http(P, "POST", "/v1/completions", "key-a", huge), 413, NULL, "larger");
    free(huge);
}

/* Tenants: A never hits B's private blocks; both hit the shared (public) prefix. */
static void test_tenant_isolation(void **st) {
    (void)st;
    char body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":\"%s Tom found a small red boat by the river and wanted to sail it to "
             "the other side with his sister.\",\"max_tokens\":4,\"temperature\":0}",
             PUBLIC_TEXT);
    resp r = http(S1.port, "POST", "/v1/completions", "key-a", body);
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    double pub = num(j, "usage", "isokv", "public_prompt_tokens", NULL);
    double n = num(j, "usage", "prompt_tokens", NULL);
    assert_true(pub >= 16 && n > pub + 16);
    cJSON_Delete(j), free(r.body);
    const double pubblocks = (double)((long)pub / 16 * 16);
    /* bob, same prompt: the public blocks only */
    double p, c;
    free(complete("key-b", body, &p, &c, NULL));
    assert_true(c == pubblocks);
    /* alice again: her own blocks as well */
    free(complete("key-a", body, &p, &c, NULL));
    assert_true(c == n - 1);
    /* bob again: now his own */
    free(complete("key-b", body, &p, &c, NULL));
    assert_true(c == n - 1);
    /* alice with a cache_salt: a new private scope, the public blocks still shared */
    char salted[1100];
    snprintf(salted, sizeof salted, "%.*s,\"cache_salt\":\"s1\"}", (int)strlen(body) - 1, body);
    free(complete("key-a", salted, &p, &c, NULL));
    assert_true(c == pubblocks);
    /* a prompt declaring none of it public shares nothing across tenants */
    char nopub[1100];
    snprintf(nopub, sizeof nopub,
             "%.*s,\"isokv\":{\"public_prefix_tokens\":0},\"cache_salt\":\"s2\"}",
             (int)strlen(body) - 1, body);
    free(complete("key-b", nopub, &p, &c, NULL));
    assert_true(c == 0);
    /* the public prefix's blocks are pinned */
    assert_true(metric(S1.port, "isokv_pinned_blocks") >= pubblocks / 16);
    /* per-tenant metrics */
    assert_true(metric(S1.port, "isokv_requests_total{tenant=\"alice\",status=\"200\"}") >= 3);
    assert_true(metric(S1.port, "isokv_cached_prompt_tokens_total{tenant=\"bob\",tier=\"pool\"}") >=
                pubblocks + n - 1);
}


/* "isokv": {"segments": [...]}: reusable documents stored on a miss, reused in another order
 * (usage.isokv reports it), private ones only within their tenant; bad segments are 400s. */
static void test_segments(void **st) {
    (void)st;
    const char *d1 = "{\"kind\":\"doc\",\"text\":\"Lily went to the park with her mom. She saw a "
                     "big red ball under a tree.\",\"reusable\":true}",
               *d2 = "{\"kind\":\"doc\",\"text\":\"Tom had a little dog. The dog liked to run "
                     "and jump in the garden.\",\"reusable\":true}",
               *q = "{\"kind\":\"query\",\"text\":\"Once upon a time\"}";
    char b1[1024], b2[1024];
    snprintf(b1, sizeof b1, "{\"max_tokens\":4,\"temperature\":0,\"isokv\":{\"blend_ratio\":0.2,"
             "\"segments\":[%s,%s,%s]}}", d1, d2, q);
    snprintf(b2, sizeof b2, "{\"max_tokens\":4,\"temperature\":0,\"isokv\":{\"blend_ratio\":0.2,"
             "\"segments\":[%s,%s,%s]}}", d2, d1, q);
    const char *who[4] = {"key-a", "key-b", "key-a", "key-a"};
    const char *body[4] = {b1, b2, b2, b1};
    double hits[4] = {0, 0, 2, 2};
    for (int i = 0; i < 4; i++) {
        resp r = http(S1.port, "POST", "/v1/completions", who[i], body[i]);
        if (r.status != 200) fail_msg("request %d: status %ld: %s", i, r.status, r.body);
        cJSON *j = json_of(&r);
        if (num(j, "usage", "isokv", "chunk_hits", NULL) != hits[i])
            fail_msg("request %d: %s", i, r.body);
        double reused = num(j, "usage", "isokv", "reused_tokens", NULL),
               rec = num(j, "usage", "isokv", "recomputed_tokens", NULL),
               reus = num(j, "usage", "isokv", "reusable_tokens", NULL);
        assert_true(reus > 20 && reused + rec == reus);
        assert_true(hits[i] ? reused > 0 : reused == 0);
        assert_true(cJSON_IsTrue(path_get(j, "usage", "isokv", "blended", NULL)) == (hits[i] > 0));
        /* the blend pass ran one unit per scheduler turn, each after a batched step of the
         * other sequences, never all in one: stories260K has 5 layers, and these prompts'
         * rows fit one unit per stage (Q/K/V; attention + FFN), so 2 x 5 turns */
        assert_true(num(j, "usage", "isokv", "blend_turns", NULL) == (hits[i] ? 10 : 0));
        assert_true(strlen(str(j, "choices", "0", "text", NULL)) > 0);
        cJSON_Delete(j), free(r.body);
    }
    expect_error(http(S1.port, "POST", "/v1/completions", "key-a",
                      "{\"prompt\":\"x\",\"isokv\":{\"segments\":[{\"kind\":\"doc\",\"text\":\"a\"}]}}"),
                 400, "isokv.segments", "replaces prompt");
    expect_error(http(S1.port, "POST", "/v1/completions", "key-a",
                      "{\"isokv\":{\"segments\":[{\"kind\":\"dox\",\"text\":\"a\"}]}}"),
                 400, "isokv.segments", "segments[0].kind");
    expect_error(http(S1.port, "POST", "/v1/completions", "key-a",
                      "{\"isokv\":{\"segments\":[{\"kind\":\"doc\",\"tokens\":[1,99999]}]}}"),
                 400, "isokv.segments", "segments[0].tokens[1]");
    expect_error(http(S1.port, "POST", "/v1/completions", "key-a",
                      "{\"isokv\":{\"blend_ratio\":3,\"segments\":[{\"kind\":\"doc\",\"text\":\"a\"}]}}"),
                 400, "isokv.blend_ratio", NULL);
}

/* A JSON list of n token ids from seed (ids 3..502: below stories260K's vocab of 512). */
static void ids_json(char *out, size_t cap, size_t n, unsigned seed) {
    size_t k = (size_t)snprintf(out, cap, "[");
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n && k < cap; i++) {
        x = x * 1103515245u + 12345u;
        k += (size_t)snprintf(out + k, cap - k, "%s%u", i ? "," : "", 3 + (x >> 8) % 500);
    }
    snprintf(out + k, cap - k, "]");
}

/* Leading segments in the prefix cache: a public system prompt (48 tokens) before a private
 * memory and a reused document comes from the prefix cache for another tenant, reported in
 * usage (prefix_cached_tokens, and cached_tokens = prefix-cached + reused); at blend_ratio 1
 * the structured request answers exactly what the plain prompt of the same tokens answers. */
static void test_segments_prefix(void **st) {
    (void)st;
    char sys[600], m1[300], m2[300], doc[600], q[100], plain[2100], b[4][2400];
    ids_json(sys, sizeof sys, 48, 71), ids_json(m1, sizeof m1, 20, 72);
    ids_json(m2, sizeof m2, 20, 73), ids_json(doc, sizeof doc, 60, 74),
        ids_json(q, sizeof q, 6, 75);
    const char *mem[4] = {m1, m2, m2, m2};
    const char *ratio[4] = {"0.2", "0.2", "1", "0.2"};
    for (int i = 0; i < 4; i++)
        snprintf(b[i], sizeof b[i],
                 "{\"max_tokens\":8,\"temperature\":0,\"isokv\":{\"blend_ratio\":%s,\"segments\":["
                 "{\"kind\":\"system\",\"tokens\":%s,\"public\":true},"
                 "{\"kind\":\"memory\",\"tokens\":%s},"
                 "{\"kind\":\"doc\",\"tokens\":%s,\"reusable\":true,\"public\":true},"
                 "{\"kind\":\"query\",\"tokens\":%s}]}}",
                 ratio[i], sys, mem[i], doc, q);
    /* the plain prompt of request 2's tokens */
    char all[2000];
    snprintf(all, sizeof all, "%.*s,%.*s,%.*s,%s", (int)strlen(sys) - 1, sys, (int)strlen(m2) - 2,
             m2 + 1, (int)strlen(doc) - 2, doc + 1, q + 1);
    snprintf(plain, sizeof plain, "{\"max_tokens\":8,\"temperature\":0,\"prompt\":%s}", all);
    const char *who[4] = {"key-a", "key-b", "key-b", "key-b"};
    char *text[4] = {0};
    for (int i = 0; i < 4; i++) {
        resp r = http(S1.port, "POST", "/v1/completions", who[i], b[i]);
        if (r.status != 200) fail_msg("request %d: status %ld: %s", i, r.status, r.body);
        cJSON *j = json_of(&r);
        double pc = num(j, "usage", "isokv", "prefix_cached_tokens", NULL),
               reused = num(j, "usage", "isokv", "reused_tokens", NULL),
               cached = num(j, "usage", "prompt_tokens_details", "cached_tokens", NULL);
        int blended = cJSON_IsTrue(path_get(j, "usage", "isokv", "blended", NULL));
        if (i == 0 && (blended || reused != 0)) fail_msg("request 0: %s", r.body);
        if (i == 1 && !(blended && pc >= 32 && reused > 0 && cached == pc + reused))
            fail_msg("request 1 (bob, the doc reused, system from the prefix cache): %s", r.body);
        if (i == 2 && (blended || cached < 48 + 20))
            fail_msg("request 2 (r = 1: exact, bob's system + memory cached): %s", r.body);
        if (i == 3 && !(blended && pc >= 48 + 16)) fail_msg("request 3: %s", r.body);
        text[i] = strdup(str(j, "choices", "0", "text", NULL));
        cJSON_Delete(j), free(r.body);
    }
    resp r = http(S1.port, "POST", "/v1/completions", "key-b", plain);
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    assert_string_equal(str(j, "choices", "0", "text", NULL), text[2]);
    cJSON_Delete(j), free(r.body);
    assert_string_equal(text[1], text[3]); /* the same blend, whatever was cached before it */
    for (int i = 0; i < 4; i++)
        free(text[i]);
}

/* Chat messages as segments: a document message flagged reusable is stored, then reused by
 * another tenant's chat behind another history (usage.isokv reports it); the mapping renders
 * each message as the chat template does (the same answer as the explicit segments list of
 * those texts); an explicit isokv.segments list works in chat too; bad flags are 400s naming
 * the message. */
static void test_chat_segments(void **st) {
    (void)st;
    const char *doc = "{\"role\":\"user\",\"content\":\"Lily went to the park with her mom. She "
                      "saw a big red ball under a tree and a dog that liked to run.\","
                      "\"isokv\":{\"kind\":\"doc\",\"reusable\":true,\"public\":true}}";
    char b1[1024], b2[1024];
    snprintf(b1, sizeof b1,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},"
             "%s,{\"role\":\"user\",\"content\":\"What did Lily see?\"}],\"max_tokens\":6,"
             "\"temperature\":0,\"isokv\":{\"blend_ratio\":0.2}}",
             doc);
    snprintf(b2, sizeof b2,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},"
             "{\"role\":\"user\",\"content\":\"I like cats.\"},{\"role\":\"assistant\","
             "\"content\":\"Cats are nice.\"},%s,{\"role\":\"user\",\"content\":\"What did "
             "Lily see?\"}],\"max_tokens\":6,\"temperature\":0,\"isokv\":{\"blend_ratio\":0.2}}",
             doc);
    const char *who[2] = {"key-a", "key-b"}, *body[2] = {b1, b2};
    for (int i = 0; i < 2; i++) {
        resp r = http(S1.port, "POST", "/v1/chat/completions", who[i], body[i]);
        if (r.status != 200) fail_msg("chat %d: status %ld: %s", i, r.status, r.body);
        cJSON *j = json_of(&r);
        assert_string_equal(str(j, "object", NULL), "chat.completion");
        assert_true(num(j, "usage", "isokv", "reusable_tokens", NULL) > 20);
        if (num(j, "usage", "isokv", "chunk_hits", NULL) != i ||
            (num(j, "usage", "isokv", "reused_tokens", NULL) > 0) != i)
            fail_msg("chat %d: %s", i, r.body);
        assert_true(strlen(str(j, "choices", "0", "message", "content", NULL)) > 0);
        cJSON_Delete(j), free(r.body);
    }
    /* the mapping's texts, as an explicit list on /v1/completions: the same answer */
    const char *mapped = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                         "{\"role\":\"user\",\"content\":\"A dog\"}],\"max_tokens\":8,"
                         "\"temperature\":0,\"isokv\":{\"segments\":\"messages\"}}",
               *listed = "{\"max_tokens\":8,\"temperature\":0,\"isokv\":{\"segments\":["
                         "{\"kind\":\"system\",\"text\":\"Be brief.\\n\\n\"},"
                         "{\"kind\":\"query\",\"text\":\"User: A dog\\nAssistant:\"}]}}";
    resp r = http(S1.port, "POST", "/v1/chat/completions", "key-a", mapped);
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    char *a = strdup(str(j, "choices", "0", "message", "content", NULL));
    assert_true(num(j, "usage", "isokv", "reusable_tokens", NULL) == 0); /* a structured one */
    cJSON_Delete(j), free(r.body);
    r = http(S1.port, "POST", "/v1/completions", "key-a", listed);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_string_equal(str(j, "choices", "0", "text", NULL), a);
    cJSON_Delete(j), free(r.body);
    /* the explicit list on chat: a chat answer */
    char lc[512];
    snprintf(lc, sizeof lc, "%s", listed);
    r = http(S1.port, "POST", "/v1/chat/completions", "key-a", lc);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_string_equal(str(j, "choices", "0", "message", "content", NULL), a);
    cJSON_Delete(j), free(r.body), free(a);
    expect_error(http(S1.port, "POST", "/v1/chat/completions", "key-a",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                      "\"isokv\":{\"segments\":\"msgs\"}}"),
                 400, "isokv.segments", "\"messages\"");
    expect_error(http(S1.port, "POST", "/v1/completions", "key-a",
                      "{\"prompt\":\"a\",\"isokv\":{\"segments\":\"messages\"}}"),
                 400, "isokv.segments", "list of segments");
    expect_error(http(S1.port, "POST", "/v1/chat/completions", "key-a",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                      "\"content\":\"b\",\"isokv\":{\"kind\":\"dox\"}}]}"),
                 400, "messages.isokv", "messages[1].isokv");
    expect_error(http(S1.port, "POST", "/v1/chat/completions", "key-a",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"isokv\":"
                      "{\"reusable\":1}}]}"),
                 400, "messages.isokv", "messages[0].isokv.reusable");
    expect_error(http(S1.port, "POST", "/v1/chat/completions", "key-a",
                      "{\"messages\":[{\"role\":\"robot\",\"content\":\"a\",\"isokv\":{}}]}"),
                 400, "messages", "messages[0].role");
    expect_error(http(S1.port, "POST", "/v1/chat/completions", "key-a",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"isokv\":"
                      "{\"segments\":[{\"kind\":\"doc\",\"text\":\"a\"}]}}"),
                 400, "isokv.segments", "replaces messages");
}

/* A client that goes away mid-stream cancels its request and releases its sequence. */
static void test_disconnect_cancels(void **st) {
    (void)st;
    double before = metric(S1.port, "isokv_cancelled_total");
    resp r = {0};
    r.abort_after = 300; /* a few chunks, then hang up */
    struct curl_slist *hs;
    CURL *c =
        prep(S1.port, "POST", "/v1/completions", "key-a",
             "{\"prompt\":\"Once\",\"max_tokens\":500,\"temperature\":0,\"stream\":true}", &r, &hs);
    CURLcode cc = curl_easy_perform(c);
    assert_int_equal(cc, CURLE_WRITE_ERROR);
    curl_slist_free_all(hs), curl_easy_cleanup(c), free(r.body);
    int ok = 0;
    for (int i = 0; i < 500 && !ok; i++) { /* bounded: the scheduler notices within a step */
        ok = metric(S1.port, "isokv_cancelled_total") >= before + 1 &&
             metric(S1.port, "isokv_running_sequences") == 0;
        if (!ok) usleep(20 * 1000);
    }
    assert_true(ok);
    /* the server keeps serving */
    free(complete("key-a", "{\"prompt\":\"Hi\",\"max_tokens\":2}", NULL, NULL, NULL));
}

/* More requests than --max-seqs 8 + --max-queue 4 at once: each one succeeds or gets a 429 with
 * Retry-After and a rate_limit_error. */
static void test_queue_full_429(void **st) {
    (void)st;
    enum { N = 40 };
    CURLM *m = curl_multi_init();
    CURL *h[N];
    resp r[N];
    struct curl_slist *hs[N];
    memset(r, 0, sizeof r);
    /* first the 8 running + 4 queued, as streams (their headers come at once), then the rest
     * while those still run (490 tokens each) */
    int running = 1;
    for (int i = 0; i < N; i++) {
        h[i] =
            prep(S1.port, "POST", "/v1/completions", "key-b",
                 i < 12 ? "{\"prompt\":\"Once upon a time\",\"max_tokens\":490,\"temperature\":1,"
                          "\"seed\":3,\"ignore_eos\":true,\"stream\":true}"
                        : "{\"prompt\":\"Once upon a time\",\"max_tokens\":490,\"temperature\":1,"
                          "\"seed\":3,\"ignore_eos\":true}",
                 &r[i], &hs[i]);
        curl_multi_add_handle(m, h[i]);
        if (i < 8) {
            /* one at a time until it streams (admitted and running), so the scheduler's pace
             * (slow under a sanitizer) cannot turn one of the first 8 into a 429 */
            for (int k = 0; k < 3000 && running && r[i].len == 0 && !r[i].status; k++) {
                curl_multi_perform(m, &running);
                if (r[i].len == 0) curl_multi_poll(m, NULL, 0, 10, NULL);
            }
        }
        if (i == 11) {
            int all = 0;
            for (int k = 0; k < 3000 && !all && running; k++) {
                curl_multi_perform(m, &running);
                all = 1;
                for (int q = 0; q < 12; q++)
                    all &= r[q].ctype[0] != 0;
                if (!all) curl_multi_poll(m, NULL, 0, 10, NULL);
            }
        }
    }
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        if (r[i].status == 200) ok++;
        if (r[i].status == 429) {
            busy++;
            assert_string_equal(r[i].retry_after, "1");
            cJSON *j = json_of(&r[i]);
            assert_string_equal(str(j, "error", "type", NULL), "rate_limit_error");
            cJSON_Delete(j);
        }
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        curl_slist_free_all(hs[i]);
        free(r[i].body);
    }
    curl_multi_cleanup(m);
    assert_int_equal(ok + busy, N);
    if (!(ok >= 8 && busy >= 1)) fail_msg("%d answered, %d got 429 (of %d)", ok, busy, N);
}

/* ---- load ------------------------------------------------------------------------------------ */

static server S2;

static int setup_load(void **st) {
    (void)st;
    if (tu_tmpdir(S2.dir, sizeof S2.dir, "serve_load")) return -1;
    char keys[128], pub[128];
    snprintf(keys, sizeof keys, "%s/keys.json", S2.dir);
    snprintf(pub, sizeof pub, "%s/public.txt", S2.dir);
    write_file(keys, "{\"k0\":\"t0\",\"k1\":\"t1\",\"k2\":\"t2\",\"k3\":\"t3\",\"k4\":\"t4\","
                     "\"k5\":\"t5\",\"k6\":\"t6\",\"k7\":\"t7\"}");
    write_file(pub, PUBLIC_TEXT);
    const char *extra[] = {"--api-keys",  keys, "--public-prefix", pub,  "--max-seqs", "32",
                           "--max-queue", "48", "--kv-mem",        "8M", "--drain-s",  "20",
                           NULL};
    return server_start(&S2, extra);
}

static int S2_exit = -1; /* set by test_drain, which stops S2 itself */

static int teardown_load(void **st) {
    (void)st;
    int rc = S2.pid ? server_stop(&S2) : S2_exit;
    tu_rmtree(S2.dir);
    return rc == 0 ? 0 : -1;
}

/* 64 concurrent streaming clients send 2,000 requests (8 tenants, a shared public prefix, 4
 * private contexts per tenant, 5 questions): every request gets 200 (a complete stream with
 * usage and [DONE]) or 429; the cached tokens the answers report add up to what the engine
 * counted; the server's RSS stays under the KV pool + model + a stated margin (64 MiB; 1 GiB
 * under AddressSanitizer, whose shadow memory and quarantine count in RSS). */
static void test_load(void **st) {
    (void)st;
    enum { TOTAL = 2000, CONC = 64 };
    static const char *ctx[4] = {"Ben had a green kite and a little brother who liked to run.",
                                 "The old tree in the garden was home to three small birds.",
                                 "Sara baked a cake for her friend and put red berries on it.",
                                 "A boy named Sam lived near the sea and loved big ships."};
    static const char *q[5] = {"What happened next?", "Who was happy?", "Where did they go?",
                               "Why was it fun?", "What did they eat?"};
    CURLM *m = curl_multi_init();
    CURL *h[CONC] = {0};
    resp r[CONC];
    struct curl_slist *hs[CONC];
    char *bodies[CONC];
    memset(r, 0, sizeof r);
    int next = 0, done = 0, ok = 0, busy = 0, active = 0;
    double cached_sum = 0;
    while (done < TOTAL) {
        for (int k = 0; k < CONC && next < TOTAL; k++) {
            if (h[k]) continue;
            int i = next++, t = i % 8, c = (i / 8) % 4;
            char key[8];
            snprintf(key, sizeof key, "k%d", t);
            bodies[k] = malloc(1024);
            snprintf(
                bodies[k], 1024,
                "{\"prompt\":\"%s Tenant %d says: %s %s\",\"max_tokens\":%d,"
                "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                PUBLIC_TEXT, t, ctx[(c + t) % 4], q[i % 5], 4 + i % 5);
            memset(&r[k], 0, sizeof r[k]);
            h[k] = prep(S2.port, "POST", "/v1/completions", key, bodies[k], &r[k], &hs[k]);
            curl_multi_add_handle(m, h[k]);
            active++;
        }
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            int k = 0;
            while (h[k] != msg->easy_handle)
                k++;
            if (msg->data.result != CURLE_OK)
                fail_msg("request failed: %s", curl_easy_strerror(msg->data.result));
            curl_easy_getinfo(h[k], CURLINFO_RESPONSE_CODE, &r[k].status);
            if (r[k].status == 200) {
                sse o;
                parse_sse(r[k].body, &o);
                assert_true(o.done);
                assert_non_null(o.usage);
                cached_sum += num(o.usage, "prompt_tokens_details", "cached_tokens", NULL);
                cJSON_Delete(o.usage);
                ok++;
            } else if (r[k].status == 429) {
                busy++;
            } else {
                fail_msg("status %ld: %s", r[k].status, r[k].body);
            }
            curl_multi_remove_handle(m, h[k]);
            curl_easy_cleanup(h[k]);
            curl_slist_free_all(hs[k]);
            free(r[k].body), free(bodies[k]);
            h[k] = NULL;
            active--;
            done++;
        }
        if (done < TOTAL) curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    curl_multi_cleanup(m);
    assert_int_equal(ok + busy, TOTAL);
    assert_true(ok >= TOTAL / 2);
    double eng = metric(S2.port, "isokv_engine_cached_tokens_total");
    if (eng != cached_sum)
        fail_msg("answers report %.0f cached tokens, the engine %.0f", cached_sum, eng);
    assert_true(cached_sum > 0);
    assert_true(metric(S2.port, "isokv_running_sequences") == 0);
    long rss = rss_kib(S2.pid);
#ifdef IKV_SANITIZE
    const long margin = 1024L * 1024;
#else
    const long margin = 64L * 1024;
#endif
    const long bound = 8L * 1000 * 1000 / 1024 + 1200 /* model file, KiB */ + margin;
    fprintf(stderr, "load: %d ok, %d 429, %.0f cached tokens; server RSS %ld KiB (bound %ld)\n", ok,
            busy, cached_sum, rss, bound);
    assert_true(rss > 0 && rss < bound);
}

/* SIGTERM while streams run: /health and new requests get 503, the running streams finish
 * (exactly max_tokens, ignore_eos), the server exits 0. */
static void test_drain(void **st) {
    (void)st;
    enum { N = 8 };
    CURLM *m = curl_multi_init();
    CURL *h[N];
    resp r[N];
    struct curl_slist *hs[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) {
        h[i] = prep(S2.port, "POST", "/v1/completions", "k1",
                    "{\"prompt\":[1,403],\"max_tokens\":500,\"temperature\":0,\"ignore_eos\":true,"
                    "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                    &r[i], &hs[i]);
        curl_multi_add_handle(m, h[i]);
    }
    int running = 1, started = 0;
    while (running && !started) { /* until every stream has sent something */
        curl_multi_perform(m, &running);
        started = 1;
        for (int i = 0; i < N; i++)
            started &= r[i].len > 0;
        if (!started) curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    assert_true(started);
    kill(S2.pid, SIGTERM);
    int saw503 = 0;
    for (int k = 0; k < 400 && !saw503; k++) {
        resp hr = http(S2.port, "GET", "/health", NULL, NULL);
        saw503 = hr.status == 503;
        free(hr.body);
        curl_multi_perform(m, &running);
    }
    assert_true(saw503);
    expect_error(http(S2.port, "POST", "/v1/completions", "k1", "{\"prompt\":\"a\"}"), 503, NULL,
                 "shutting down");
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    for (int i = 0; i < N; i++) {
        curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        assert_int_equal(r[i].status, 200);
        sse o;
        parse_sse(r[i].body, &o);
        assert_true(o.done);
        assert_string_equal(o.finish, "length");
        assert_int_equal((int)num(o.usage, "completion_tokens", NULL), 500);
        cJSON_Delete(o.usage);
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        curl_slist_free_all(hs[i]);
        free(r[i].body);
    }
    curl_multi_cleanup(m);
    S2_exit = tu_wait(S2.pid, 30); /* -1: killed by a signal, or still running after 30 s */
    S2.pid = 0;
    assert_int_equal(S2_exit, 0);
}

/* ---- lower tiers (--tier) ------------------------------------------------------------------ */

static server TREF, TMEM, TF1, TF2; /* reference (no tier), mem tier, two sharing a file tier */
static char tier_dir[64] = "", tier_file[128];

static int setup_tiers(void **st) {
    (void)st;
    if (tu_tmpdir(tier_dir, sizeof tier_dir, "serve_tiers")) return -1;
    char spec[192];
    snprintf(tier_file, sizeof tier_file, "%s/kv.store", tier_dir);
    snprintf(spec, sizeof spec, "file:%s:4M", tier_file);
    /* 200k: 9 blocks of 16 tokens, 5 for the cache: too few for two of the prompts below */
    const char *ref[] = {"--max-seqs", "4", NULL};
    const char *mem[] = {"--kv-mem", "200k", "--max-seqs", "2", "--tier", "mem:1M", NULL};
    const char *file[] = {"--kv-mem", "200k", "--max-seqs", "2", "--tier", spec, NULL};
    if (server_start(&TREF, ref) || server_start(&TMEM, mem) || server_start(&TF1, file))
        return -1;
    return server_start(&TF2, file);
}

static int teardown_tiers(void **st) {
    (void)st;
    int bad = 0;
    server *all[] = {&TREF, &TMEM, &TF1, &TF2};
    for (int i = 0; i < 4; i++)
        if (all[i]->pid && server_stop(all[i]) != 0) bad = 1;
    tu_rmtree(tier_dir);
    return bad ? -1 : 0;
}

/* Three prompts of 2-3 full blocks with distinct first blocks (33, 50, 42 tokens). */
static const char *TIER_PROMPTS[3] = {
    "Once upon a time there was a little girl named Lily who loved to play in the park with "
    "her friends every day",
    "The dog ran quickly across the big green field to find the ball that the boy had thrown "
    "far away",
    "A small bird sat on the tree and sang a happy song to the sun in the morning sky above"};

/* POSTs n completion bodies at once (curl multi: several sequences in flight); fills r[]. */
static void post_all(int port, char *const *bodies, int n, resp *r) {
    CURLM *m = curl_multi_init();
    CURL *h[8];
    struct curl_slist *hs[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) {
        memset(&r[i], 0, sizeof r[i]);
        h[i] = prep(port, "POST", "/v1/completions", NULL, bodies[i], &r[i], &hs[i]);
        curl_multi_add_handle(m, h[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    for (int i = 0; i < n; i++) {
        curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        curl_slist_free_all(hs[i]);
    }
    curl_multi_cleanup(m);
}

static char *tier_body(int i) {
    char *b = malloc(512);
    snprintf(b, 512, "{\"prompt\":\"%s\",\"max_tokens\":12,\"temperature\":0}", TIER_PROMPTS[i]);
    return b;
}

/* One greedy completion of prompt i; returns its answer (JSON) and checks the usage adds up:
 * cached_tokens == the sum over cached_tokens_by_tier. */
static cJSON *tier_complete(int port, int i) {
    char *b = tier_body(i);
    resp r = http(port, "POST", "/v1/completions", NULL, b);
    free(b);
    if (r.status != 200) fail_msg("status %ld: %s", r.status, r.body);
    cJSON *j = json_of(&r);
    free(r.body);
    double sum = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, path_get(j, "usage", "isokv", "cached_tokens_by_tier", NULL))
        sum += t->valuedouble;
    assert_true(sum == num(j, "usage", "prompt_tokens_details", "cached_tokens", NULL));
    return j;
}

/* The texts of the three prompts on the reference server, each its first request there (so
 * nothing cached: the no-cache run). */
static char *REF_TEXT[3];
static void reference_texts(void) {
    for (int i = 0; i < 3; i++) {
        if (REF_TEXT[i]) continue;
        cJSON *j = tier_complete(TREF.port, i);
        assert_true(num(j, "usage", "prompt_tokens_details", "cached_tokens", NULL) == 0);
        assert_true(num(j, "usage", "prompt_tokens", NULL) >= 32);
        REF_TEXT[i] = strdup(str(j, "choices", "0", "text", NULL));
        cJSON_Delete(j);
    }
}

/* mem tier under a pool too small for two prompts: prompt 0, then 1 and 2 together (they push
 * 0's blocks down), then 0 again: its prefix comes from the mem tier, its text is the
 * no-cache text; then all three at once, twice, each equal to its reference; the metrics
 * count the tier's demotions, loads and cached tokens by tier. */
static void test_tier_mem(void **st) {
    (void)st;
    reference_texts();
    cJSON *j = tier_complete(TMEM.port, 0);
    assert_string_equal(str(j, "choices", "0", "text", NULL), REF_TEXT[0]);
    assert_true(num(j, "usage", "isokv", "cached_tokens_by_tier", "mem", NULL) == 0);
    /* the answers' tier_recomputed_tokens, over every request to TMEM */
    double recomputed = num(j, "usage", "isokv", "tier_recomputed_tokens", NULL);
    cJSON_Delete(j);
    char *bodies[3] = {tier_body(1), tier_body(2), tier_body(0)};
    resp r[3];
    post_all(TMEM.port, bodies, 2, r);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r[i].status, 200);
        cJSON *a = json_of(&r[i]);
        assert_string_equal(str(a, "choices", "0", "text", NULL), REF_TEXT[i + 1]);
        recomputed += num(a, "usage", "isokv", "tier_recomputed_tokens", NULL);
        cJSON_Delete(a), free(r[i].body);
    }
    j = tier_complete(TMEM.port, 0);
    assert_string_equal(str(j, "choices", "0", "text", NULL), REF_TEXT[0]);
    recomputed += num(j, "usage", "isokv", "tier_recomputed_tokens", NULL);
    double mem = num(j, "usage", "isokv", "cached_tokens_by_tier", "mem", NULL);
    if (mem < 16) fail_msg("prompt 0 again took %g tokens from the mem tier", mem);
    cJSON_Delete(j);
    for (int round = 0; round < 2; round++) {
        post_all(TMEM.port, bodies, 3, r);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(r[i].status, 200);
            cJSON *a = json_of(&r[i]);
            assert_string_equal(str(a, "choices", "0", "text", NULL), REF_TEXT[(i + 1) % 3]);
            recomputed += num(a, "usage", "isokv", "tier_recomputed_tokens", NULL);
            cJSON_Delete(a), free(r[i].body);
        }
    }
    for (int i = 0; i < 3; i++)
        free(bodies[i]);
    assert_true(metric(TMEM.port, "isokv_blocks_demoted_total{tier=\"mem\"}") >= 1);
    assert_true(metric(TMEM.port, "isokv_tier_loads_total{tier=\"mem\"}") >= 1);
    assert_true(metric(TMEM.port, "isokv_blocks_promoted_total{tier=\"mem\"}") >= 1);
    assert_true(metric(TMEM.port, "isokv_cached_prompt_tokens_total{tenant=\"default\","
                                  "tier=\"mem\"}") >= mem);
    assert_true(metric(TMEM.port, "isokv_tier_recomputes_total{tier=\"mem\",why=\"failed\"}") ==
                0);
    /* one family, labelled by tier and why; its blocks are the tokens the answers reported */
    double by_why = 0;
    const char *why[] = {"cheaper", "failed", "no_room", "dropped"};
    for (int w = 0; w < 4; w++) {
        char series[128];
        snprintf(series, sizeof series, "isokv_tier_recomputes_total{tier=\"mem\",why=\"%s\"}",
                 why[w]);
        double v = metric(TMEM.port, series);
        if (v < 0) fail_msg("no series %s", series);
        by_why += v;
    }
    if (by_why * 16 != recomputed)
        fail_msg("%g blocks recomputed by why, %g tokens in the answers", by_why, recomputed);
    resp mt = http(TMEM.port, "GET", "/metrics", NULL, NULL);
    const char *p = mt.body, *type = "# TYPE isokv_tier_recomputes_total counter\n";
    int types = 0;
    while ((p = strstr(p, type)))
        types++, p++;
    assert_int_equal(types, 1);
    free(mt.body);
    /* the reference server has no lower tier: no tier series, pool only */
    assert_true(metric(TREF.port, "isokv_blocks_demoted_total{tier=\"mem\"}") == -1);
    assert_true(metric(TREF.port, "isokv_cached_prompt_tokens_total{tenant=\"default\","
                                  "tier=\"pool\"}") >= 0);
}

/* Two server processes on one file tier: what the first computed (written through), the
 * second loads, with the no-cache text. */
static void test_tier_file_shared(void **st) {
    (void)st;
    reference_texts();
    cJSON *j = tier_complete(TF1.port, 1);
    assert_string_equal(str(j, "choices", "0", "text", NULL), REF_TEXT[1]);
    assert_true(num(j, "usage", "isokv", "cached_tokens_by_tier", "file", NULL) == 0);
    cJSON_Delete(j);
    j = tier_complete(TF2.port, 1);
    assert_string_equal(str(j, "choices", "0", "text", NULL), REF_TEXT[1]);
    double f = num(j, "usage", "isokv", "cached_tokens_by_tier", "file", NULL);
    if (f < 32) fail_msg("the second server took %g tokens from the shared file tier", f);
    assert_true(num(j, "usage", "isokv", "lossy_cached_tokens", NULL) == 0);
    cJSON_Delete(j);
    assert_true(metric(TF2.port, "isokv_tier_loads_total{tier=\"file\"}") >= 2);
    assert_true(metric(TF1.port, "isokv_blocks_demoted_total{tier=\"file\"}") >= 2);
}

/* Runs `isokv serve --port 0 ARGS...` to its exit (it must fail before listening, within
 * 30 s); returns the exit status. */
static int serve_exit_code(const char *const *args) {
    const char *argv[16] = {"serve", "--port", "0"};
    int n = 3;
    for (int i = 0; args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int rc = tu_run_isokv(argv, NULL, NULL, 30);
    if (rc < 0) fail_msg("serve %s did not exit", args[0]);
    return rc;
}

/* Bad --tier values: a malformed spec is a usage error (2), an unwritable file a failure (1),
 * each before anything listens. */
static void test_tier_errors(void **st) {
    (void)st;
    const char *c1[] = {"--tier", "file:noSize", NULL}, *c2[] = {"--tier", "bogus:1M", NULL},
               *c3[] = {"--tier", "file:/nonexistent-dir/x/kv.store:1M", NULL},
               *c4[] = {"--tier", "mem:1M", "--tier-dtype", "q4", NULL};
    assert_int_equal(serve_exit_code(c1), 2);
    assert_int_equal(serve_exit_code(c2), 2);
    assert_int_equal(serve_exit_code(c3), 1);
    assert_int_equal(serve_exit_code(c4), 2);
}


/* ---- routing by class ---------------------------------------------------------------------- */

static server TR; /* --route-set route.simple=1, one sequence at a time */

static int setup_route(void **st) {
    (void)st;
    const char *extra[] = {"--route-set", "route.simple=1", "--max-seqs", "1", "--max-queue",
                           "64", "--semantic-cache", NULL};
    return server_start(&TR, extra);
}

static int teardown_route(void **st) {
    (void)st;
    return TR.pid && server_stop(&TR) != 0 ? -1 : 0;
}

/* A completion with optional X-Isokv-Class / X-Isokv-Slo-Ms headers; returns the answer. */
static resp post_hdr(int port, const char *body, const char *cls, const char *slo) {
    resp r = {0};
    struct curl_slist *hs;
    CURL *c = prep(port, "POST", "/v1/completions", NULL, body, &r, &hs);
    char h1[64], h2[64];
    if (cls) snprintf(h1, sizeof h1, "X-Isokv-Class: %s", cls), hs = curl_slist_append(hs, h1);
    if (slo) snprintf(h2, sizeof h2, "X-Isokv-Slo-Ms: %s", slo), hs = curl_slist_append(hs, h2);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(hs);
    curl_easy_cleanup(c);
    return r;
}

/* The route object of an answer: step, class; the hard cap (step <= class cap) checked. */
static int route_step(resp *r, const char *want_class) {
    if (r->status != 200) fail_msg("status %ld: %s", r->status, r->body);
    cJSON *j = json_of(r);
    assert_string_equal(str(j, "usage", "isokv", "route", "class", NULL), want_class);
    int step = (int)num(j, "usage", "isokv", "route", "step", NULL);
    assert_true(step <= (int)num(j, "usage", "isokv", "route", "class_cap", NULL));
    assert_true(step <= (int)num(j, "usage", "isokv", "route", "max_step", NULL));
    assert_true(num(j, "usage", "isokv", "route", "priority", NULL) == step);
    assert_true(num(j, "usage", "isokv", "cpu_ms", NULL) > 0);
    cJSON_Delete(j), free(r->body);
    return step;
}

/* Classes from the field and the header, the default, the caps (route.simple=1 set on the
 * command line), an SLO picking a cheaper step, an unmeetable SLO not lifting the cap, bad
 * values, and the per-class metrics. */
static void test_route_classes(void **st) {
    (void)st;
    const char *b = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0%s}";
    char body[256];
    double before = metric(TR.port, "isokv_route_requests_total{class=\"simple\",step=\"1\"}");
    if (before < 0) before = 0;
    snprintf(body, sizeof body, b, ",\"isokv\":{\"class\":\"simple\"}");
    resp r = post_hdr(TR.port, body, NULL, NULL);
    assert_int_equal(route_step(&r, "simple"), 1); /* the cap set by --route-set */
    snprintf(body, sizeof body, b, "");
    r = post_hdr(TR.port, body, "simple", "1"); /* an SLO no step meets: still at most 1 */
    assert_int_equal(route_step(&r, "simple"), 1);
    r = post_hdr(TR.port, body, NULL, NULL); /* no class: medium */
    int medium = route_step(&r, "medium");
    assert_int_equal(medium, 4); /* the planner's default cap and the default walk's knee (5) */
    r = post_hdr(TR.port, body, "complex", NULL);
    assert_int_equal(route_step(&r, "complex"), 5); /* the knee, below complex's cap 6 */
    r = post_hdr(TR.port, body, "medium", "100000"); /* a loose SLO: a cheaper step meets it */
    assert_true(route_step(&r, "medium") < medium);
    snprintf(body, sizeof body, b, ",\"isokv\":{\"class\":\"complex\"}");
    r = post_hdr(TR.port, body, "simple", NULL); /* the field wins over the header */
    assert_int_equal(route_step(&r, "complex"), 5);
    snprintf(body, sizeof body, b, "");
    expect_error(post_hdr(TR.port, body, "urgent", NULL), 400, "X-Isokv-Class", "urgent");
    expect_error(post_hdr(TR.port, body, NULL, "-3"), 400, "X-Isokv-Slo-Ms", "positive");
    snprintf(body, sizeof body, b, ",\"isokv\":{\"class\":7}");
    expect_error(post_hdr(TR.port, body, NULL, NULL), 400, "isokv.class", "string");
    snprintf(body, sizeof body, b, ",\"isokv\":{\"slo_ms\":0}");
    expect_error(post_hdr(TR.port, body, NULL, NULL), 400, "isokv.slo_ms", "positive");
    assert_true(metric(TR.port, "isokv_route_requests_total{class=\"simple\",step=\"1\"}") ==
                before + 2);
    assert_true(metric(TR.port, "isokv_route_requests_total{class=\"complex\",step=\"5\"}") >= 2);
    assert_true(metric(TR.port, "isokv_route_cpu_seconds_total{class=\"medium\"}") > 0);
    /* no simple request ever ran above its cap */
    for (int k = 2; k < 8; k++) {
        char series[96];
        snprintf(series, sizeof series, "isokv_route_requests_total{class=\"simple\",step=\"%d\"}",
                 k);
        assert_true(metric(TR.port, series) == -1);
    }
}

/* The response cache is the step-3 lever: the same greedy prompt again, as a complex request
 * (step 5) takes the cached answer as a verified draft; as a simple one (step 1) it does not
 * look (no semantic_cache object), and its text is the same. */
static void test_route_response_cache(void **st) {
    (void)st;
    const char *b = "{\"prompt\":\"Ben had a small boat on the lake\",\"max_tokens\":24,"
                    "\"temperature\":0,\"isokv\":{\"class\":\"%s\"}}";
    char body[256];
    char *texts[3];
    const char *cls[3] = {"complex", "complex", "simple"};
    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof body, b, cls[i]);
        resp r = post_hdr(TR.port, body, NULL, NULL);
        if (r.status != 200) fail_msg("status %ld: %s", r.status, r.body);
        cJSON *j = json_of(&r);
        cJSON *sc = path_get(j, "usage", "isokv", "semantic_cache", NULL);
        if (i == 1) {
            assert_non_null(sc);
            assert_true(num(sc, "accepted_tokens", NULL) >= 1);
        }
        if (i == 2) assert_null(sc); /* step 1: below the lever */
        texts[i] = strdup(str(j, "choices", "0", "text", NULL));
        cJSON_Delete(j), free(r.body);
    }
    assert_string_equal(texts[0], texts[1]);
    assert_string_equal(texts[0], texts[2]);
    for (int i = 0; i < 3; i++)
        free(texts[i]);
}

/* The lever: a higher step is admitted first. One sequence at a time; a blocker of 16 long
 * medium prompts (step 4) holds the engine while three simple requests (step 1) and then one
 * complex (step 5) queue: the complex one completes before the blocker's request, the simple
 * ones after it. The blocker opts out of the semantic cache and prompt lookup (this server
 * has both): its similar prompts would otherwise be verified from each other's cached
 * answers in a few passes, and it could drain before the complex request arrives. */
static void test_route_priority(void **st) {
    (void)st;
    char blocker[4096];
    int k = snprintf(blocker, sizeof blocker, "{\"prompt\":[");
    for (int i = 0; i < 16; i++)
        k += snprintf(blocker + k, sizeof blocker - (size_t)k, "%s\"Tom had a red ball %d\"",
                      i ? "," : "", i);
    snprintf(blocker + k, sizeof blocker - (size_t)k,
             "],\"max_tokens\":480,\"ignore_eos\":true,\"temperature\":0,"
             "\"isokv\":{\"semantic_cache\":false,\"spec\":\"off\"}}");
    const char *simple = "{\"prompt\":\"Once\",\"max_tokens\":2,\"isokv\":{\"class\":\"simple\"}}";
    const char *complex =
        "{\"prompt\":\"Once\",\"max_tokens\":2,\"isokv\":{\"class\":\"complex\"}}";
    CURLM *m = curl_multi_init();
    CURL *h[5];
    resp r[5];
    struct curl_slist *hs[5];
    memset(r, 0, sizeof r);
    const char *bodies[5] = {blocker, simple, simple, simple, complex};
    int running = 0, order[5], nord = 0;
    for (int i = 0; i < 5; i++) {
        h[i] = prep(TR.port, "POST", "/v1/completions", NULL, bodies[i], &r[i], &hs[i]);
        curl_multi_add_handle(m, h[i]);
        /* let the server queue it before the next: the blocker's prompts, then each simple
         * (bounded at 2000 polls of >= 5 ms: a loaded ASan run needed more than 200) */
        for (int w = 0; w < 2000; w++) {
            curl_multi_perform(m, &running);
            curl_multi_poll(m, NULL, 0, 5, NULL);
            double q = metric(TR.port, "isokv_queued_requests");
            if (i == 0 ? q >= 10 : (i < 4 ? q >= 10 + i : 1)) break;
        }
        if (i == 4) assert_true(metric(TR.port, "isokv_queued_requests") >= 4); /* still busy */
    }
    do {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left)))
            if (msg->msg == CURLMSG_DONE)
                for (int i = 0; i < 5; i++)
                    if (h[i] == msg->easy_handle) order[nord++] = i;
        if (running) curl_multi_poll(m, NULL, 0, 20, NULL);
    } while (running || nord < 5);
    for (int i = 0; i < 5; i++) {
        curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        assert_int_equal(r[i].status, 200);
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        curl_slist_free_all(hs[i]);
        free(r[i].body);
    }
    curl_multi_cleanup(m);
    int pos[5];
    for (int i = 0; i < 5; i++)
        pos[order[i]] = i;
    if (!(pos[4] < pos[0] && pos[0] < pos[1] && pos[0] < pos[2] && pos[0] < pos[3]))
        fail_msg("completion order %d %d %d %d %d (0 blocker, 1-3 simple, 4 complex)", order[0],
                 order[1], order[2], order[3], order[4]);
}

/* ---- preemption ---------------------------------------------------------------------------- */

static server TP, TPREF; /* a private budget of 10 blocks; a reference with room for all */

static int setup_preempt(void **st) {
    (void)st;
    /* 20 blocks of 20480 bytes: 10 private (admission), 10 for the cache */
    const char *small[] = {"--kv-mem", "409600", "--max-seqs", "4", NULL};
    const char *ref[] = {"--max-seqs", "4", NULL};
    if (server_start(&TP, small)) return -1;
    return server_start(&TPREF, ref);
}

static int teardown_preempt(void **st) {
    (void)st;
    int bad = 0;
    if (TP.pid && server_stop(&TP) != 0) bad = 1;
    if (TPREF.pid && server_stop(&TPREF) != 0) bad = 1;
    return bad ? -1 : 0;
}

/* Four requests of 100 tokens each (7 blocks each alone) on a budget of 10 private blocks:
 * admission reserves the prompt and 16 positions, so all four start, and as they grow the
 * newest are preempted and re-admitted with their tokens. Every request completes with the
 * text it gets alone on a server with room (greedy, and seeded sampling: the sampler's state
 * survives), and the preemptions are counted. */
static void test_preempt_same_text(void **st) {
    (void)st;
    static const char *prompts[4] = {"Once upon a time", "The little dog", "Lily and Ben went",
                                     "A big red ball"};
    char *bodies[4];
    for (int i = 0; i < 4; i++) {
        bodies[i] = malloc(256);
        snprintf(bodies[i], 256,
                 "{\"prompt\":\"%s\",\"max_tokens\":100,\"ignore_eos\":true,%s}", prompts[i],
                 i % 2 ? "\"temperature\":1,\"seed\":7" : "\"temperature\":0");
    }
    char *ref[4];
    for (int i = 0; i < 4; i++) { /* alone, on the reference server */
        resp r = http(TPREF.port, "POST", "/v1/completions", NULL, bodies[i]);
        if (r.status != 200) fail_msg("reference: status %ld: %s", r.status, r.body);
        cJSON *j = json_of(&r);
        assert_int_equal((int)num(j, "usage", "isokv", "preemptions", NULL), 0);
        ref[i] = strdup(str(j, "choices", "0", "text", NULL));
        cJSON_Delete(j), free(r.body);
    }
    double before = metric(TP.port, "isokv_preempted_total");
    int preemptions = 0;
    char *streamed[4]; /* the same requests as streams (round 1): the chunks add up the same */
    for (int i = 0; i < 4; i++) {
        streamed[i] = malloc(300);
        size_t L = strlen(bodies[i]);
        snprintf(streamed[i], 300, "%.*s,\"stream\":true,\"stream_options\":"
                 "{\"include_usage\":true}}", (int)(L - 1), bodies[i]);
    }
    for (int round = 0; round < 2; round++) {
        resp r[4];
        post_all(TP.port, round ? streamed : bodies, 4, r);
        for (int i = 0; i < 4; i++) {
            if (r[i].status != 200) fail_msg("status %ld: %s", r[i].status, r[i].body);
            if (round) {
                sse o;
                parse_sse(r[i].body, &o);
                assert_true(o.done);
                assert_string_equal(o.text, ref[i]);
                assert_non_null(o.usage);
                assert_int_equal((int)num(o.usage, "completion_tokens", NULL), 100);
                preemptions += (int)num(o.usage, "isokv", "preemptions", NULL);
                cJSON_Delete(o.usage), free(r[i].body);
                continue;
            }
            cJSON *j = json_of(&r[i]);
            assert_string_equal(str(j, "choices", "0", "text", NULL), ref[i]);
            assert_int_equal((int)num(j, "usage", "completion_tokens", NULL), 100);
            preemptions += (int)num(j, "usage", "isokv", "preemptions", NULL);
            cJSON_Delete(j), free(r[i].body);
        }
    }
    for (int i = 0; i < 4; i++)
        free(streamed[i]);
    if (preemptions < 1) fail_msg("no request was preempted");
    assert_true(metric(TP.port, "isokv_preempted_total") == before + preemptions);
    double reserved = -1; /* the snapshot the scheduler takes once idle */
    for (int k = 0; k < 100 && reserved != 0; k++)
        if ((reserved = metric(TP.port, "isokv_kv_reserved_blocks")) != 0) usleep(20 * 1000);
    assert_true(reserved == 0);
    assert_true(metric(TP.port, "isokv_running_sequences") == 0);
    /* a request whose whole limit cannot fit the budget alone is refused up front (400) */
    expect_error(http(TP.port, "POST", "/v1/completions", NULL,
                      "{\"prompt\":\"Once\",\"max_tokens\":400}"),
                 400, NULL, "private blocks");
    for (int i = 0; i < 4; i++)
        free(bodies[i]), free(ref[i]);
}

/* Structured requests are preempted like plain ones (admitted with the same headroom) and
 * re-admitted with the chunks they reused: four requests reusing one stored document, each
 * behind its own memory, 100 tokens each on the budget of 10 private blocks, answer exactly
 * what they answer one at a time on a server with room; preemptions among them are counted. */
static void test_preempt_segments(void **st) {
    (void)st;
    char doc[300], q[60], mem[5][120], bodies[5][1200];
    ids_json(doc, sizeof doc, 24, 81), ids_json(q, sizeof q, 4, 82);
    for (int i = 0; i < 5; i++) {
        ids_json(mem[i], sizeof mem[i], 8, 83 + (unsigned)i);
        snprintf(bodies[i], sizeof bodies[i],
                 "{\"max_tokens\":100,\"ignore_eos\":true,\"temperature\":0,\"isokv\":{"
                 "\"blend_ratio\":0.2,\"segments\":[{\"kind\":\"memory\",\"tokens\":%s},"
                 "{\"kind\":\"doc\",\"tokens\":%s,\"reusable\":true,\"public\":true},"
                 "{\"kind\":\"query\",\"tokens\":%s}]}}",
                 mem[i], doc, q);
    }
    char *ref[4];
    const server *sv[2] = {&TPREF, &TP};
    for (int k = 0; k < 2; k++) { /* request 4 stores the document on both servers */
        resp r = http(sv[k]->port, "POST", "/v1/completions", NULL, bodies[4]);
        if (r.status != 200) fail_msg("warm-up: status %ld: %s", r.status, r.body);
        free(r.body);
    }
    for (int i = 0; i < 4; i++) { /* alone, on the reference server */
        resp r = http(TPREF.port, "POST", "/v1/completions", NULL, bodies[i]);
        if (r.status != 200) fail_msg("reference: status %ld: %s", r.status, r.body);
        cJSON *j = json_of(&r);
        assert_true(cJSON_IsTrue(path_get(j, "usage", "isokv", "blended", NULL)));
        ref[i] = strdup(str(j, "choices", "0", "text", NULL));
        cJSON_Delete(j), free(r.body);
    }
    char *b[4] = {bodies[0], bodies[1], bodies[2], bodies[3]};
    resp r[4];
    post_all(TP.port, b, 4, r);
    int preemptions = 0;
    for (int i = 0; i < 4; i++) {
        if (r[i].status != 200) fail_msg("status %ld: %s", r[i].status, r[i].body);
        cJSON *j = json_of(&r[i]);
        assert_true(cJSON_IsTrue(path_get(j, "usage", "isokv", "blended", NULL)));
        assert_string_equal(str(j, "choices", "0", "text", NULL), ref[i]);
        assert_int_equal((int)num(j, "usage", "completion_tokens", NULL), 100);
        preemptions += (int)num(j, "usage", "isokv", "preemptions", NULL);
        cJSON_Delete(j), free(r[i].body);
    }
    if (preemptions < 1) fail_msg("no structured request was preempted");
    for (int i = 0; i < 4; i++)
        free(ref[i]);
}

/* The error object of a request refused before anything started: status 400 with a JSON body
 * (not a 200 event stream carrying an error event), OpenAI's invalid_request_error naming
 * param, code context_length_exceeded, and a message containing has. */
static void expect_never_fits(resp r, const char *param, const char *has) {
    assert_non_null(strstr(r.ctype, "application/json"));
    assert_null(strstr(r.body ? r.body : "", "data:"));
    cJSON *j = json_of(&r);
    assert_string_equal(str(j, "error", "type", NULL), "invalid_request_error");
    assert_string_equal(str(j, "error", "code", NULL), "context_length_exceeded");
    cJSON_Delete(j);
    expect_error(r, 400, param, has);
}

/* A request that could never fit (prompt + max_tokens beyond the private KV budget, 160
 * positions on TP, or beyond the model's context of 512 on TPREF) is a 400 before any stream
 * starts, for plain and streamed requests alike; defaults are cut to what fits instead; nothing
 * was queued or reserved for a refused request. */
static void test_never_fits_400(void **st) {
    (void)st;
    double before = metric(TP.port, "isokv_requests_total{tenant=\"default\",status=\"400\"}");
    if (before < 0) before = 0; /* no 400 yet: no series */
    expect_never_fits(http(TP.port, "POST", "/v1/completions", NULL,
                           "{\"prompt\":\"Once\",\"max_tokens\":200,\"stream\":true}"),
                      "max_tokens", "private blocks");
    expect_never_fits(http(TP.port, "POST", "/v1/chat/completions", NULL,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                           "\"max_completion_tokens\":300,\"stream\":true}"),
                      "max_completion_tokens", "at most 160 positions");
    /* a prompt alone of 160 token ids leaves no room for a generated token */
    char body[2048];
    int k = snprintf(body, sizeof body, "{\"stream\":true,\"prompt\":[1");
    for (int i = 1; i < 160; i++)
        k += snprintf(body + k, sizeof body - (size_t)k, ",%d", 300 + i % 100);
    snprintf(body + k, sizeof body - (size_t)k, "]}");
    expect_never_fits(http(TP.port, "POST", "/v1/completions", NULL, body), "prompt", "160 tokens");
    /* beyond the model's context on a server whose budget is larger */
    expect_never_fits(http(TPREF.port, "POST", "/v1/completions", NULL,
                           "{\"prompt\":\"Once\",\"max_tokens\":511,\"stream\":true}"),
                      "max_tokens", "the model's context");
    /* exactly what fits is served: the prompt and max_tokens fill the 160 positions */
    resp r = http(TP.port, "POST", "/v1/completions", NULL,
                  "{\"prompt\":\"Once\",\"max_tokens\":1,\"temperature\":0}");
    assert_int_equal(r.status, 200);
    cJSON *j = json_of(&r);
    double pt = num(j, "usage", "prompt_tokens", NULL);
    cJSON_Delete(j), free(r.body);
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true}",
             160 - (int)pt);
    r = http(TP.port, "POST", "/v1/completions", NULL, body);
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_true(num(j, "usage", "total_tokens", NULL) == 160);
    cJSON_Delete(j), free(r.body);
    /* a chat request without a limit gets the rest of what fits, not a refusal */
    r = http(TP.port, "POST", "/v1/chat/completions", NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0,"
             "\"ignore_eos\":true}");
    assert_int_equal(r.status, 200);
    j = json_of(&r);
    assert_true(num(j, "usage", "total_tokens", NULL) == 160);
    cJSON_Delete(j), free(r.body);
    /* the refusals were counted as 400s, and nothing stayed queued or reserved */
    assert_true(metric(TP.port, "isokv_requests_total{tenant=\"default\",status=\"400\"}") >=
                before + 3);
    assert_true(metric(TP.port, "isokv_queued_requests") == 0);
}

/* Bad routing flags: an unknown or out-of-range plan key, an unknown model or GPU are usage
 * errors (2); a missing config file a failure (1). */
static void test_route_flags(void **st) {
    (void)st;
    const char *c1[] = {"--route-set", "route.simple=9", NULL},
               *c2[] = {"--route-set", "no.such=1", NULL}, *c3[] = {"--route-set", "x", NULL},
               *c4[] = {"--route-model", "no-such-model", NULL},
               *c5[] = {"--route-hw", "no-such-gpu", NULL},
               *c6[] = {"--route-config", "/nonexistent-dir/route.json", NULL},
               *c7[] = {"--route", "shortest", NULL};
    assert_int_equal(serve_exit_code(c1), 2);
    assert_int_equal(serve_exit_code(c2), 2);
    assert_int_equal(serve_exit_code(c3), 2);
    assert_int_equal(serve_exit_code(c4), 2);
    assert_int_equal(serve_exit_code(c5), 2);
    assert_int_equal(serve_exit_code(c6), 1);
    assert_int_equal(serve_exit_code(c7), 2); /* --route is walk or frontier */
    /* a config file (nested keys, as `isokv plan --config`) sets the caps */
    char path[64];
    snprintf(path, sizeof path, "/tmp/ikv_route_%d.json", (int)getpid());
    write_file(path, "{\"route\": {\"simple\": 0, \"medium\": 3}, \"price.gpu_hour\": 4}");
    server sv = {0};
    const char *extra[] = {"--route-config", path, NULL};
    int started = server_start(&sv, extra);
    unlink(path);
    assert_int_equal(started, 0);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":2}";
    resp r = post_hdr(sv.port, body, "simple", NULL);
    int simple = r.status == 200 ? route_step(&r, "simple") : -1;
    r = post_hdr(sv.port, body, NULL, NULL);
    int medium = r.status == 200 ? route_step(&r, "medium") : -1;
    assert_int_equal(server_stop(&sv), 0);
    assert_int_equal(simple, 0);
    assert_int_equal(medium, 3);
}

/* ---- an int8 checkpoint (isokv model quantize) ------------------------------------------- */

static server SQ8;

/* Quantizes the bundled stories260K (group 4, llama2.c's version-2 format) and serves it. */
static int setup_q8(void **st) {
    (void)st;
    const char *bin = getenv("IKV_BIN"), *src = getenv("IKV_SOURCE_DIR");
    if (!bin || !src) return -1;
    snprintf(SQ8.dir, sizeof SQ8.dir, "/tmp/ikv_serve_q8XXXXXX");
    if (!mkdtemp(SQ8.dir)) return -1;
    static char fp[512], q8[128], tok[512];
    snprintf(fp, sizeof fp, "%s/data/models/stories260K/stories260K.bin", src);
    snprintf(tok, sizeof tok, "%s/data/models/stories260K/tok512.bin", src);
    snprintf(q8, sizeof q8, "%s/q8.bin", SQ8.dir);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null) dup2(fileno(null), 1);
        execl(bin, bin, "model", "quantize", fp, "-o", q8, "--group", "4", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) return -1;
    const char *extra[] = {"--model", q8, "--tokenizer", tok, "--threads", "2", NULL};
    return server_start(&SQ8, extra);
}

static int teardown_q8(void **st) {
    (void)st;
    int rc = server_stop(&SQ8);
    char path[160];
    snprintf(path, sizeof path, "%s/q8.bin", SQ8.dir);
    unlink(path);
    rmdir(SQ8.dir);
    return rc == 0 ? 0 : -1;
}

/* isokv serve --model q8.bin: greedy completions are llama2.c runq.c's text for the same int8
 * checkpoint (tests/data/runq/stories260K_bin_p*_n512.txt: prompt + generated text), alone, again
 * and three at once (batched decode); the model is listed; isokv.segments (chunk reuse, fp32
 * only) gets a 400 that says so. */
static void test_serve_q8(void **st) {
    (void)st;
    static const char *prompts[3] = {"Once upon a time", "The little dog ran to the park.",
                                     "Zo\xc3\xab had a red ball"};
    /* how runq.c echoes each prompt: its safe_printf drops the byte-fallback pieces of the
     * non-ASCII letter */
    static const char *echo[3] = {"Once upon a time", "The little dog ran to the park.",
                                  "Zo had a red ball"};
    const char *src = getenv("IKV_SOURCE_DIR");
    assert_non_null(src);
    char *bodies[3], *want[3];
    for (int i = 0; i < 3; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/tests/data/runq/stories260K_bin_p%d_n512.txt", src, i + 1);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        want[i] = calloc(1, 8192);
        size_t n = fread(want[i], 1, 8191, f);
        fclose(f);
        assert_true(n > 200);
        bodies[i] = malloc(512);
        snprintf(bodies[i], 512, "{\"prompt\":\"%s\",\"max_tokens\":80,\"temperature\":0}",
                 prompts[i]);
    }
    /* prompt + text must be runq.c's output's first bytes */
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 3; i++) {
            resp r = http(SQ8.port, "POST", "/v1/completions", NULL, bodies[i]);
            if (r.status != 200) fail_msg("status %ld: %s", r.status, r.body);
            cJSON *j = json_of(&r);
            free(r.body);
            const char *t = str(j, "choices", "0", "text", NULL);
            assert_true(num(j, "usage", "completion_tokens", NULL) == 80);
            const size_t pl = strlen(echo[i]), tl = strlen(t);
            assert_true(tl > 40);
            if (memcmp(want[i], echo[i], pl) || memcmp(want[i] + pl, t, tl))
                fail_msg("prompt %d: serve's text is not runq.c's: %s", i + 1, t);
            cJSON_Delete(j);
        }
    resp r[3];
    post_all(SQ8.port, bodies, 3, r);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].status, 200);
        cJSON *j = json_of(&r[i]);
        const char *t = str(j, "choices", "0", "text", NULL);
        if (memcmp(want[i] + strlen(echo[i]), t, strlen(t)))
            fail_msg("prompt %d batched: serve's text is not runq.c's: %s", i + 1, t);
        cJSON_Delete(j), free(r[i].body);
        free(bodies[i]), free(want[i]);
    }
    resp m = http(SQ8.port, "GET", "/v1/models", NULL, NULL);
    assert_int_equal(m.status, 200);
    free(m.body);
    /* chunk reuse needs fp32 weights: a structured request is refused, naming why */
    expect_error(http(SQ8.port, "POST", "/v1/completions", NULL,
                      "{\"isokv\":{\"segments\":[{\"kind\":\"system\",\"text\":\"Hi.\"}]},"
                      "\"max_tokens\":4}"),
                 400, "isokv.segments", "int8");
}

int main(void) {
    const struct CMUnitTest api[] = {
        cmocka_unit_test(test_health_models_metrics), cmocka_unit_test(test_completions),
        cmocka_unit_test(test_multi_prompt),          cmocka_unit_test(test_chat),
        cmocka_unit_test(test_stream_completions),    cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tenant_isolation),      cmocka_unit_test(test_disconnect_cancels),
        cmocka_unit_test(test_queue_full_429),        cmocka_unit_test(test_segments),
        cmocka_unit_test(test_segments_prefix),       cmocka_unit_test(test_chat_segments),
    };
    const struct CMUnitTest load[] = {cmocka_unit_test(test_load), cmocka_unit_test(test_drain)};
    int rc = cmocka_run_group_tests_name("serve_api", api, setup, teardown);
    rc |= cmocka_run_group_tests_name("serve_load", load, setup_load, teardown_load);
    const struct CMUnitTest tiers[] = {cmocka_unit_test(test_tier_mem),
                                       cmocka_unit_test(test_tier_file_shared),
                                       cmocka_unit_test(test_tier_errors)};
    rc |= cmocka_run_group_tests_name("serve_tiers", tiers, setup_tiers, teardown_tiers);
    const struct CMUnitTest route[] = {cmocka_unit_test(test_route_classes),
                                       cmocka_unit_test(test_route_response_cache),
                                       cmocka_unit_test(test_route_priority),
                                       cmocka_unit_test(test_route_flags)};
    rc |= cmocka_run_group_tests_name("serve_route", route, setup_route, teardown_route);
    const struct CMUnitTest preempt[] = {cmocka_unit_test(test_preempt_same_text),
                                         cmocka_unit_test(test_preempt_segments),
                                         cmocka_unit_test(test_never_fits_400)};
    rc |= cmocka_run_group_tests_name("serve_preempt", preempt, setup_preempt, teardown_preempt);
    const struct CMUnitTest q8[] = {cmocka_unit_test(test_serve_q8)};
    rc |= cmocka_run_group_tests_name("serve_q8", q8, setup_q8, teardown_q8);
    for (int i = 0; i < 3; i++)
        free(REF_TEXT[i]);
    return rc;
}
