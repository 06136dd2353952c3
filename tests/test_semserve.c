/*
 * Tests for `isokv serve --semantic-cache`: two servers in this process on free loopback ports
 * (one with the response cache, one without), talked to over plain sockets:
 *   - over the story prompt pairs (tests/data/semantic/pairs_stories.tsv, both prompts of each),
 *     greedy answers with the cache are byte-identical to the answers without it, while some
 *     requests take cached tokens (usage.isokv.semantic_cache) and /metrics counts them;
 *   - a streamed full hit arrives as one burst (at most 2 SSE text chunks);
 *   - tenants (API keys): bob never gets a candidate from alice's private request; alice does.
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
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "isokv/serve.h"

static ikv_serve *with, *without;
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
    o.semantic_cache = 256;
    if (ikv_serve_create(&o, &with)) return -1;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    ikv_serve_destroy(with);
    ikv_serve_destroy(without);
    unlink(keys_path);
    return 0;
}

/* POSTs body to path on the server's port with Bearer key; returns the malloc'd response body
 * (after the headers). Bounded: 10 s receive timeout. */
static char *post(ikv_serve *s, const char *path, const char *key, const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ikv_serve_port(s))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      body ? "POST" : "GET", path, key, body ? strlen(body) : 0);
    assert_int_equal(write(fd, head, (size_t)hn), hn);
    if (body) assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    char *b = strstr(buf, "\r\n\r\n");
    assert_non_null(b);
    char *out = strdup(b + 4);
    free(buf);
    return out;
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_answers),
        cmocka_unit_test(test_stream_burst),
        cmocka_unit_test(test_tenants),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
