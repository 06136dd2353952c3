/*
 * Tests for `isokv serve --semantic-cache`: two servers in this process on free loopback ports
 * (one with the response cache, one without), talked to over plain sockets:
 *   - over the story prompt pairs (tests/data/semantic/pairs_stories.tsv, both prompts of each),
 *     greedy answers with the cache are byte-identical to the answers without it, while some
 *     requests take cached tokens (usage.isokv.semantic_cache) and /metrics counts them;
 *   - a streamed full hit arrives as one burst (at most 2 SSE text chunks);
 *   - tenants (API keys): bob never gets a candidate from alice's private request; alice does;
 *   - --spec lookup (a third server): prompt-lookup drafts verified in the batched step give
 *     identical answers and accept tokens; the per-request switches ("isokv": {"spec",
 *     "semantic_cache"}) turn drafts on and off; bad switches are 400s naming the field;
 *   - a full hit and a fresh request at the same time (the hit's draft in the shared steps)
 *     both answer exactly as without the cache.
 * Both servers are destroyed at the end (also when an assertion fails, by the group teardown).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "isokv/serve.h"
#include "testutil.h"

static ikv_serve *with, *without, *lookup;
static char keys_path[] = "/tmp/ikv_test_semserve_keys_XXXXXX";

static int setup(void **st) {
    (void)st;
    int fd = mkstemp(keys_path);
    if (fd < 0) return -1;
    const char *k = "{\"ka\": \"alice\", \"kb\": \"bob\"}";
    if (write(fd, k, strlen(k)) != (ssize_t)strlen(k)) return -1;
    close(fd);
    ikv_serve_options o;
    ikv_serve_options_default(&o);
    o.port = 0;
    o.log = NULL;
    o.max_seqs = 4;
    o.api_keys = keys_path;
    if (ikv_serve_create(&o, &without)) return -1;
    o.spec_ngram = 3, o.spec_k = 4, o.spec_min = 2; /* --spec lookup */
    if (ikv_serve_create(&o, &lookup)) return -1;
    o.spec_ngram = 0, o.spec_k = 0;
    o.semantic_cache = 256;
    o.semantic_cache_bytes = 2000000; /* --semantic-cache=2M: the byte bound in serve */
    if (ikv_serve_create(&o, &with)) return -1;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    ikv_serve_destroy(with);
    ikv_serve_destroy(without);
    ikv_serve_destroy(lookup);
    unlink(keys_path);
    return 0;
}

/* POSTs body to path on the server's port with Bearer key; returns the malloc'd response body
 * (after the headers). Bounded: 10 s receive timeout. */
static char *post(ikv_serve *s, const char *path, const char *key, const char *body) {
    return tu_http_body(ikv_serve_port(s), path, key, body, 10);
}

static char *request_json(const char *prompt, int n, int stream) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", "stories260K");
    cJSON_AddStringToObject(j, "prompt", prompt);
    cJSON_AddNumberToObject(j, "max_tokens", n);
    cJSON_AddNumberToObject(j, "temperature", 0);
    if (stream) cJSON_AddBoolToObject(j, "stream", 1);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* The answer's text and its usage.isokv.semantic_cache numbers (-1 when absent). */
static char *complete(ikv_serve *s, const char *key, const char *prompt, int n, int *cands,
                      int *accepted) {
    char *body = request_json(prompt, n, 0);
    char *resp = post(s, "/v1/completions", key, body);
    free(body);
    cJSON *j = cJSON_Parse(resp);
    if (!j) fail_msg("not JSON: %s", resp);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_non_null(ch);
    char *text = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(ch, "text")));
    cJSON *sc = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "isokv"),
                                    "semantic_cache");
    *cands = sc ? (int)cJSON_GetNumberValue(cJSON_GetObjectItem(sc, "candidates")) : -1;
    *accepted = sc ? (int)cJSON_GetNumberValue(cJSON_GetObjectItem(sc, "accepted_tokens")) : -1;
    cJSON_Delete(j);
    free(resp);
    return text;
}

/* A greedy completion with an "isokv" object (JSON text, or NULL): its text (NULL when the
 * status is not 200: *status then holds the error object's param, if any) and
 * usage.isokv.speculative's draft_steps and accepted_tokens. */
static char *complete_x(ikv_serve *s, const char *prompt, int n, const char *isokv, int *steps,
                        int *accepted, char *param, size_t pn) {
    char *body = request_json(prompt, n, 0);
    if (isokv) { /* splice "isokv": {...} into the object */
        char *b2 = malloc(strlen(body) + strlen(isokv) + 16);
        sprintf(b2, "{\"isokv\":%s,%s", isokv, body + 1);
        free(body);
        body = b2;
    }
    char *resp = post(s, "/v1/completions", "ka", body);
    free(body);
    cJSON *j = cJSON_Parse(resp);
    if (!j) fail_msg("not JSON: %s", resp);
    free(resp);
    cJSON *err = cJSON_GetObjectItem(j, "error");
    if (err) {
        const char *pv = cJSON_GetStringValue(cJSON_GetObjectItem(err, "param"));
        snprintf(param, pn, "%s", pv ? pv : "");
        cJSON_Delete(j);
        return NULL;
    }
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    assert_non_null(ch);
    char *text = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(ch, "text")));
    cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "isokv"),
                                    "speculative");
    assert_non_null(sp);
    *steps = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(sp, "draft_steps"));
    *accepted = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(sp, "accepted_tokens"));
    cJSON_Delete(j);
    return text;
}

static void test_identical_answers(void **st) {
    (void)st;
    FILE *f = fopen("tests/data/semantic/pairs_stories.tsv", "r");
    assert_non_null(f);
    char line[1200];
    int requests = 0, hits = 0, acc_total = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        line[strcspn(line, "\r\n")] = 0;
        char *k = strtok(line, "\t"), *a = strtok(NULL, "\t"), *b = strtok(NULL, "\t");
        assert_non_null(k), assert_non_null(a), assert_non_null(b);
        const char *ps[2] = {a, b};
        for (int i = 0; i < 2; i++) {
            int c0, a0, c1, a1;
            char *plain = complete(without, "ka", ps[i], 40, &c0, &a0);
            char *cached = complete(with, "ka", ps[i], 40, &c1, &a1);
            assert_int_equal(c0, -1); /* no response cache there */
            assert_true(c1 >= 0);
            assert_string_equal(cached, plain);
            requests++, hits += a1 > 0, acc_total += a1;
            free(plain), free(cached);
        }
    }
    fclose(f);
    assert_true(requests >= 40);
    assert_true(hits >= 5); /* repeated openings across pairs and paraphrases take tokens */
    char *m = post(with, "/metrics", "ka", NULL);
    const char *p = strstr(m, "\nisokv_semcache_accepted_tokens_total ");
    assert_non_null(p);
    assert_int_equal(atoi(p + strlen("\nisokv_semcache_accepted_tokens_total ")), acc_total);
    p = strstr(m, "\nisokv_semcache_bytes ");
    assert_non_null(p);
    const long bytes = atol(p + strlen("\nisokv_semcache_bytes "));
    assert_true(bytes > 0 && bytes <= 2000000);
    p = strstr(m, "\nisokv_semcache_max_bytes ");
    assert_non_null(p);
    assert_int_equal(atol(p + strlen("\nisokv_semcache_max_bytes ")), 2000000);
    free(m);
}

/* SSE chunks carrying text in a streamed answer. */
static int text_chunks(ikv_serve *s, const char *key, const char *prompt) {
    char *body = request_json(prompt, 48, 1);
    char *resp = post(s, "/v1/completions", key, body);
    free(body);
    int n = 0;
    for (char *q = resp; (q = strstr(q, "\"text\":\"")); q += 8)
        n += q[8] != '"';
    free(resp);
    return n;
}

static void test_stream_burst(void **st) {
    (void)st;
    const char *p = "Once upon a time, there was a happy frog named Fred.";
    int c, a;
    free(complete(with, "ka", p, 48, &c, &a)); /* now cached */
    int plain = text_chunks(without, "ka", p), hit = text_chunks(with, "ka", p);
    /* the accepted tokens are committed under one lock: at most the burst and a tail chunk
     * (a plain stream of this small model coalesces too when the client reads slower than
     * it decodes, so its count is only reported) */
    print_message("text chunks: plain %d, full hit %d\n", plain, hit);
    assert_true(plain >= 1);
    assert_true(hit >= 1 && hit <= 2);
}

static void test_tenants(void **st) {
    (void)st;
    const char *p = "Alice had a secret garden with seven red roses and a blue door.";
    int c, a;
    free(complete(with, "ka", p, 30, &c, &a));
    free(complete(with, "kb", p, 30, &c, &a));
    assert_int_equal(c, 0); /* bob sees none of alice's private responses */
    assert_int_equal(a, 0);
    free(complete(with, "ka", p, 30, &c, &a));
    assert_true(c >= 1);
    assert_int_equal(a, 30);
}

/* --spec lookup: prompt-lookup drafts verified inside the step give byte-identical greedy
 * answers and accept tokens on the stories (they repeat themselves); the per-request switch
 * turns it off on that server and on on a server without --spec; a bad switch is a 400
 * naming the field. */
static void test_lookup(void **st) {
    (void)st;
    FILE *f = fopen("tests/data/semantic/pairs_stories.tsv", "r");
    assert_non_null(f);
    char line[1200], param[64];
    int requests = 0, acc_total = 0, steps, acc;
    while (fgets(line, sizeof line, f) && requests < 12) {
        if (line[0] == '#') continue;
        line[strcspn(line, "\r\n")] = 0;
        strtok(line, "\t");
        char *a = strtok(NULL, "\t");
        assert_non_null(a);
        int c0, a0;
        char *plain = complete(without, "ka", a, 96, &c0, &a0);
        char *spec = complete_x(lookup, a, 96, NULL, &steps, &acc, param, sizeof param);
        assert_non_null(spec);
        assert_string_equal(spec, plain);
        acc_total += acc;
        if (requests < 3) { /* the switches */
            char *off =
                complete_x(lookup, a, 96, "{\"spec\":\"off\"}", &steps, &acc, param, sizeof param);
            assert_non_null(off);
            assert_string_equal(off, plain);
            assert_int_equal(steps, 0);
            char *on = complete_x(without, a, 96, "{\"spec\":\"lookup\"}", &steps, &acc, param,
                                  sizeof param);
            assert_non_null(on);
            assert_string_equal(on, plain);
            assert_true(steps > 0);
            free(off), free(on);
        }
        free(plain), free(spec);
        requests++;
    }
    fclose(f);
    assert_int_equal(requests, 12);
    assert_true(acc_total > 0);
    char *m = post(lookup, "/metrics", "ka", NULL);
    const char *p = strstr(m, "\nisokv_spec_lookup_accepted_tokens_total ");
    assert_non_null(p);
    assert_true(atoi(p + strlen("\nisokv_spec_lookup_accepted_tokens_total ")) >= acc_total);
    free(m);
    /* sampled (temperature 1, seed 5) with drafts: the acceptance rule's path answers */
    char *body = strdup("{\"model\":\"stories260K\",\"prompt\":\"Once upon a time, Tom and Tom\","
                        "\"max_tokens\":80,\"temperature\":1,\"seed\":5,\"isokv\":{\"spec\":"
                        "\"lookup\"}}");
    char *resp = post(lookup, "/v1/completions", "ka", body);
    cJSON *j = cJSON_Parse(resp);
    assert_non_null(j);
    assert_null(cJSON_GetObjectItem(j, "error"));
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(u, "completion_tokens")) >= 1);
    cJSON_Delete(j);
    free(resp), free(body);
    assert_null(complete_x(lookup, "Once", 8, "{\"spec\":3}", &steps, &acc, param, sizeof param));
    assert_string_equal(param, "isokv.spec");
    assert_null(
        complete_x(lookup, "Once", 8, "{\"spec\":\"medusa\"}", &steps, &acc, param, sizeof param));
    assert_string_equal(param, "isokv.spec");
    assert_null(complete_x(with, "Once", 8, "{\"semantic_cache\":\"yes\"}", &steps, &acc, param,
                           sizeof param));
    assert_string_equal(param, "isokv.semantic_cache");
}

/* Two requests at once on the cached server, a full hit and a fresh prompt: the hit's draft
 * rides in the same batched steps as the other's decode, and both answers equal the answers
 * without the cache; "semantic_cache": false turns the cache off for one request. */
typedef struct job {
    const char *prompt;
    int n;
    char *text;
    int steps, accepted;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    char param[64];
    j->text = complete_x(with, j->prompt, j->n, NULL, &j->steps, &j->accepted, param, sizeof param);
    return NULL;
}

static void test_concurrent_hit(void **st) {
    (void)st;
    const char *p1 = "Once upon a time, a little dog named Max found a red ball in the park.";
    const char *p2 = "One day, Sue and her mom went to the big lake to see the ducks.";
    int c, a, steps, acc;
    char param[64];
    char *r1 = complete(without, "ka", p1, 64, &c, &a),
         *r2 = complete(without, "ka", p2, 64, &c, &a);
    free(complete(with, "ka", p1, 64, &c, &a)); /* now cached */
    char *off =
        complete_x(with, p1, 64, "{\"semantic_cache\":false}", &steps, &acc, param, sizeof param);
    assert_non_null(off);
    assert_string_equal(off, r1);
    assert_int_equal(acc, 0);
    free(off);
    for (int round = 0; round < 3; round++) {
        job j1 = {.prompt = p1, .n = 64}, j2 = {.prompt = p2, .n = 64};
        pthread_t t1, t2;
        assert_int_equal(pthread_create(&t2, NULL, run_job, &j2), 0);
        assert_int_equal(pthread_create(&t1, NULL, run_job, &j1), 0);
        pthread_join(t1, NULL), pthread_join(t2, NULL);
        assert_non_null(j1.text), assert_non_null(j2.text);
        assert_string_equal(j1.text, r1);
        assert_string_equal(j2.text, r2);
        assert_true(j1.steps >= 1);
        assert_true(j1.accepted >= 60); /* the whole cached answer, in one or a few steps */
        free(j1.text), free(j2.text);
    }
    free(r1), free(r2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_answers), cmocka_unit_test(test_stream_burst),
        cmocka_unit_test(test_tenants),           cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_concurrent_hit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
