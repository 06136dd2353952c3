/*
 * Tests for routing inside `isokv serve` by the levers a routed step really changes: the
 * request's forward threads (src/serve/route.c) and, with --route frontier, the frontier
 * router. Two servers in this process on free loopback ports, each with a two-thread engine:
 *   - walk router, route.simple=1: simple requests (step 1) and complex ones (step 5) sent at
 *     once, several running together. The hard cap holds: every simple answer says its steps
 *     ran on one thread (threads_used, the engine's count at each of its steps) and never above
 *     step 1; every complex one ran on two. Greedy texts are identical for both classes and
 *     to each prompt's answer alone (the engine gives the same bits at any thread count, and
 *     mixed batches are split into one step per thread count). /metrics: steps on 1 and on 2
 *     threads, requests per class and thread count (none simple on 2), CPU and thread-seconds
 *     per class;
 *   - speculation (--spec lookup, --semantic-cache): a simple request asking for both gets
 *     neither (no draft, no response-cache lookup), a complex one drafts; same text;
 *   - frontier router: each class's decision (point, step, the levers) equals what the
 *     planner library gives for the same frontier (ikv_plan_frontier_build at the class cap,
 *     ikv_plan_route_frontier), with and without an SLO; the threads follow the point's TP.
 * Both servers are destroyed at the end (also when an assertion fails: group teardown).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "isokv/plan.h"
#include "isokv/serve.h"
#include "testutil.h"

static ikv_serve *walk_srv, *front_srv;

static int setup(void **st) {
    (void)st;
    ikv_serve_options o;
    ikv_serve_options_default(&o);
    o.port = 0;
    o.log = NULL;
    o.max_seqs = 8;
    o.threads = 2;
    static const char *const sets[] = {"route.simple=1"};
    o.route_set = sets;
    o.n_route_set = 1;
    o.spec_ngram = 3, o.spec_k = 2, o.spec_min = 2; /* --spec lookup */
    o.semantic_cache = 64;
    if (ikv_serve_create(&o, &walk_srv)) return -1;
    o.spec_k = 0, o.semantic_cache = 0;
    o.route_set = NULL;
    o.n_route_set = 0;
    o.route_frontier = 1;
    if (ikv_serve_create(&o, &front_srv)) return -1;
    return 0;
}

static int teardown(void **st) {
    (void)st;
    ikv_serve_destroy(walk_srv);
    ikv_serve_destroy(front_srv);
    return 0;
}

/* Sends a request (body NULL: GET) and returns the malloc'd response body. Bounded: 20 s. */
static char *http(ikv_serve *s, const char *path, const char *body) {
    return tu_http_body(ikv_serve_port(s), path, NULL, body, 20);
}

/* A value of /metrics (-1 when the series is absent). */
static double metric(ikv_serve *s, const char *series) {
    char *m = http(s, "/metrics", NULL);
    double v = -1;
    size_t L = strlen(series);
    for (char *p = m; (p = strstr(p, series)); p += L)
        if ((p == m || p[-1] == '\n') && p[L] == ' ') {
            v = atof(p + L + 1);
            break;
        }
    free(m);
    return v;
}

static const char *PROMPTS[3] = {"Once upon a time", "The little dog ran to the park",
                                 "Lily had a red ball and"};

typedef struct answer {
    char text[2048];
    char cls[16];
    char spec[16];          /* usage.isokv.speculative.spec */
    int semantic, sem_seen; /* its semantic_cache switch; a semantic_cache object present */
    int spec_allowed;
    double draft_tokens;
    int step, class_cap, threads, threads_used, point;
    double cpu_ms, thread_ms;
    char router[16];
} answer;

/* A greedy completion of PROMPTS[p] as class cls (NULL: none) with slo_ms (0: none) and,
 * when ask, "isokv": {"spec": "lookup", "semantic_cache": true}. */
static void complete_ask(ikv_serve *s, int p, const char *cls, double slo_ms, int ask,
                         answer *out) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "prompt", PROMPTS[p]);
    cJSON_AddNumberToObject(j, "max_tokens", 24);
    cJSON_AddNumberToObject(j, "temperature", 0);
    cJSON *x = cJSON_AddObjectToObject(j, "isokv");
    if (cls) cJSON_AddStringToObject(x, "class", cls);
    if (slo_ms > 0) cJSON_AddNumberToObject(x, "slo_ms", slo_ms);
    if (ask) {
        cJSON_AddStringToObject(x, "spec", "lookup");
        cJSON_AddBoolToObject(x, "semantic_cache", 1);
    }
    char *body = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    char *resp = http(s, "/v1/completions", body);
    free(body);
    cJSON *a = cJSON_Parse(resp);
    if (!a || !cJSON_GetObjectItem(a, "choices")) fail_msg("answer: %s", resp);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(a, "choices"), 0);
    snprintf(out->text, sizeof out->text, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItem(ch, "text")));
    cJSON *ix = cJSON_GetObjectItem(cJSON_GetObjectItem(a, "usage"), "isokv");
    cJSON *ro = cJSON_GetObjectItem(ix, "route");
    assert_non_null(ro);
    snprintf(out->cls, sizeof out->cls, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItem(ro, "class")));
    snprintf(out->router, sizeof out->router, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItem(ro, "router")));
    out->step = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ro, "step"));
    out->class_cap = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ro, "class_cap"));
    out->threads = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ro, "threads"));
    out->threads_used = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ro, "threads_used"));
    cJSON *pt = cJSON_GetObjectItem(ro, "point");
    out->point = pt ? (int)cJSON_GetNumberValue(pt) : -1;
    out->cpu_ms = cJSON_GetNumberValue(cJSON_GetObjectItem(ix, "cpu_ms"));
    out->thread_ms = cJSON_GetNumberValue(cJSON_GetObjectItem(ro, "thread_ms"));
    out->spec_allowed = cJSON_IsTrue(cJSON_GetObjectItem(ro, "speculation_allowed"));
    cJSON *sp = cJSON_GetObjectItem(ix, "speculative");
    assert_non_null(sp);
    snprintf(out->spec, sizeof out->spec, "%s",
             cJSON_GetStringValue(cJSON_GetObjectItem(sp, "spec")));
    out->semantic = cJSON_IsTrue(cJSON_GetObjectItem(sp, "semantic_cache"));
    out->draft_tokens = cJSON_GetNumberValue(cJSON_GetObjectItem(sp, "draft_tokens"));
    out->sem_seen = cJSON_GetObjectItem(ix, "semantic_cache") != NULL;
    cJSON_Delete(a);
    free(resp);
}

static void complete(ikv_serve *s, int p, const char *cls, double slo_ms, answer *out) {
    complete_ask(s, p, cls, slo_ms, 0, out);
}

typedef struct job {
    ikv_serve *s;
    int prompt;
    const char *cls;
    answer a;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    complete(j->s, j->prompt, j->cls, 0, &j->a);
    return NULL;
}

static void test_threads_by_class(void **st) {
    (void)st;
    answer ref[3];
    for (int p = 0; p < 3; p++) /* alone, as medium (step 4: two threads) */
        complete(walk_srv, p, NULL, 0, &ref[p]);
    enum { NJ = 12 };
    job jobs[NJ];
    pthread_t th[NJ];
    for (int i = 0; i < NJ; i++) {
        jobs[i] = (job){.s = walk_srv, .prompt = i % 3, .cls = i % 2 ? "complex" : "simple"};
        assert_int_equal(pthread_create(&th[i], NULL, run_job, &jobs[i]), 0);
    }
    for (int i = 0; i < NJ; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < NJ; i++) {
        const answer *a = &jobs[i].a;
        assert_string_equal(a->router, "walk");
        assert_string_equal(a->cls, jobs[i].cls);
        assert_true(a->step <= a->class_cap); /* the hard cap */
        assert_string_equal(a->text, ref[jobs[i].prompt].text);
        assert_true(a->cpu_ms > 0 && a->thread_ms > 0);
        if (i % 2 == 0) { /* simple: step 1, one thread at every step */
            assert_int_equal(a->step, 1);
            assert_int_equal(a->threads, 1);
            assert_int_equal(a->threads_used, 1);
        } else {
            assert_int_equal(a->step, 5);
            assert_int_equal(a->threads, 2);
            assert_int_equal(a->threads_used, 2);
        }
    }
    assert_true(metric(walk_srv, "isokv_steps_by_threads_total{threads=\"1\"}") > 0);
    assert_true(metric(walk_srv, "isokv_steps_by_threads_total{threads=\"2\"}") > 0);
    assert_true(
        metric(walk_srv, "isokv_route_threads_requests_total{class=\"simple\",threads=\"1\"}") ==
        NJ / 2);
    assert_true(metric(walk_srv,
                       "isokv_route_threads_requests_total{class=\"simple\",threads=\"2\"}") == -1);
    assert_true(
        metric(walk_srv, "isokv_route_threads_requests_total{class=\"complex\",threads=\"2\"}") ==
        NJ / 2);
    assert_true(metric(walk_srv, "isokv_route_requests_total{class=\"simple\",step=\"1\"}") ==
                NJ / 2);
    assert_true(metric(walk_srv, "isokv_route_cpu_seconds_total{class=\"simple\"}") > 0);
    assert_true(metric(walk_srv, "isokv_route_thread_seconds_total{class=\"complex\"}") > 0);
}

/* The speculation levers (--spec lookup, --semantic-cache) hold the hard cap too: a simple
 * request (step 1) that asks for both runs without either (no draft, no response-cache
 * lookup), a complex one (step 5) drafts; the same greedy text either way. */
static void test_spec_cap(void **st) {
    (void)st;
    answer s1, c1, c2;
    complete_ask(walk_srv, 2, "complex", 0, 1, &c1); /* answered once: now in the cache */
    complete_ask(walk_srv, 2, "complex", 0, 1, &c2);
    complete_ask(walk_srv, 2, "simple", 0, 1, &s1);
    assert_string_equal(c1.spec, "lookup");
    assert_true(c1.spec_allowed && c1.semantic);
    assert_true(c2.draft_tokens > 0 && c2.sem_seen);
    assert_int_equal(s1.step, 1);
    assert_false(s1.spec_allowed);
    assert_string_equal(s1.spec, "off");
    assert_false(s1.semantic);
    assert_false(s1.sem_seen);
    assert_true(s1.draft_tokens == 0);
    assert_string_equal(s1.text, c1.text);
    assert_string_equal(c2.text, c1.text);
}

/* The server's frontier decision for class c (cap given by the defaults) and slo equals the
 * library's on the same frontier; the threads follow the chosen point's TP. */
static void check_frontier(int c, double slo_ms) {
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    const ikv_model_spec *m;
    const ikv_hw_spec *hw;
    assert_int_equal(ikv_model_lookup("llama3-70b", &m), 0);
    assert_int_equal(ikv_hw_lookup("h100", &hw), 0);
    ikv_route_req rq = {.cls = (ikv_req_class)c, .slo_s = slo_ms / 1e3};
    ikv_plan_frontier f;
    assert_int_equal(ikv_plan_frontier_build(&p, m, hw, ikv_plan_class_cap(&p, &rq), &f), 0);
    ikv_route_decision d;
    assert_int_equal(ikv_plan_route_frontier(&p, &f, &rq, &d), 0);
    answer a;
    complete(front_srv, 0, ikv_req_class_name((ikv_req_class)c), slo_ms, &a);
    assert_string_equal(a.router, "frontier");
    assert_int_equal(a.point, d.point);
    assert_int_equal(a.step, d.step);
    assert_true(a.step <= a.class_cap);
    assert_int_equal(a.threads, f.hull_cfg[d.point].tp > f.base_tp ? 2 : 1);
    assert_int_equal(a.threads_used, a.threads);
    ikv_plan_frontier_free(&f);
}

static void test_frontier_router(void **st) {
    (void)st;
    for (int c = 0; c < 3; c++) {
        check_frontier(c, 0);
        check_frontier(c, 10000); /* a loose SLO: the cheapest point meeting it */
        check_frontier(c, 1);     /* none meets it: the fastest up to the knee */
    }
    /* a loose SLO picks the cheapest point of simple's frontier (TP of the baseline: one
     * thread), no SLO its knee (TP8: two) */
    answer a, b;
    complete(front_srv, 1, "simple", 10000, &a);
    complete(front_srv, 1, "simple", 0, &b);
    assert_true(a.point < b.point);
    assert_int_equal(a.threads, 1);
    assert_int_equal(b.threads, 2);
    assert_string_equal(a.text, b.text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_by_class),
        cmocka_unit_test(test_spec_cap),
        cmocka_unit_test(test_frontier_router),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
