/*
 * Tests for plan/: roofline bounds of the walk, the shape of the walk on the default
 * scenarios, the knee under changing price and value, the router, parameter overrides (text
 * and JSON), and the `isokv plan` CLI run through IKV_BIN with its JSON parsed back.
 */
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

#include "isokv/base.h"
#include "isokv/cost.h"
#include "isokv/plan.h"

static void walk(const ikv_plan_params *p, const char *model, const char *hw, ikv_plan_result *r) {
    const ikv_model_spec *m;
    const ikv_hw_spec *h;
    assert_int_equal(ikv_model_lookup(model, &m), 0);
    assert_int_equal(ikv_hw_lookup(hw, &h), 0);
    int rc = ikv_plan_walk(p, m, h, r);
    if (rc) fail_msg("walk failed: %s", ikv_errdetail());
}

/* No step can beat the roofline: a decode step reads every weight once, split over the GPUs of
 * one stage, and a prefill does at least 2 N n FLOPs split over them. */
static void test_roofline_bounds(void **st) {
    (void)st;
    const char *hws[] = {"h100", "h200"};
    for (int i = 0; i < 2; i++) {
        ikv_plan_params p;
        ikv_plan_params_default(&p);
        ikv_plan_result r;
        walk(&p, "llama3-70b", hws[i], &r);
        const ikv_hw_spec *h = r.hw;
        double w = ikv_model_weight_bytes(r.model);
        for (int k = 0; k < IKV_PLAN_STEPS; k++) {
            const ikv_plan_step *s = &r.steps[k];
            uint32_t per_stage = s->gpus / (k >= 4 ? 2 : 1);
            /* with speculation a target pass yields at most gamma + 1 tokens */
            double tokens = k >= 3 ? p.spec_gamma + 1 : 1;
            assert_true(s->tpot_s >= w / (per_stage * h->hbm_bw) / tokens);
            assert_true(s->ttft_s >= ikv_prefill_flops(r.model, 0, 2048) / (per_stage * h->flops) /
                                         (k >= 4 ? 2 : 1));
            assert_true(s->latency_s >= s->ttft_s + p.output * s->tpot_s * 0.999);
            assert_true(s->compute_gpu_s > 0 && s->flops > 0);
        }
        /* without speculation (steps 0..2) a TPOT is no better than W / (GPUs * bw): 42 ms on
         * one H100, so >= 5.3 ms on TP8; 29 ms on one H200, >= 3.7 ms on TP8 */
        assert_true(r.steps[2].tpot_s >= w / (8 * h->hbm_bw));
        assert_int_equal(r.steps[2].gpus, 8);
    }
}

/* 141 GB of weights plus KV do not fit in 80 GB: the baseline of llama3-70b on H100 needs
 * TP4 with the naive 60% KV waste; the H200 (141 GB) needs TP2. */
static void test_baseline_fit(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    ikv_plan_result r;
    walk(&p, "llama3-70b", "h100", &r);
    assert_int_equal(r.base_tp, 4);
    walk(&p, "llama3-70b", "h200", &r);
    assert_int_equal(r.base_tp, 2);
    walk(&p, "llama3-8b", "a100", &r);
    assert_int_equal(r.base_tp, 1);
    /* too long for one node: a clear error */
    assert_int_equal(ikv_plan_param_set(&p, "prompt", "100000"), 0);
    const ikv_model_spec *m;
    const ikv_hw_spec *h;
    ikv_model_lookup("llama3-70b", &m);
    ikv_hw_lookup("h100", &h);
    assert_int_equal(ikv_plan_walk(&p, m, h, &r), IKV_ERANGE);
    assert_non_null(strstr(ikv_errdetail(), "does not fit"));
}

/* The shape of the walk on the default scenarios (docs/planner.md, "What the walk shows"):
 * latency falls at every step; kernels (1) and speculation (3) are free lunches that lower
 * compute too; tensor parallelism (2) is the cheapest step that costs compute; every later
 * step that costs compute has a higher MRTS than step 2, and the dedicated, polling replica
 * (7) costs more per second saved than hedging (6). */
static void test_walk_shape(void **st) {
    (void)st;
    const char *hws[] = {"h100", "h200"};
    for (int i = 0; i < 2; i++) {
        ikv_plan_params p;
        ikv_plan_params_default(&p);
        ikv_plan_result r;
        walk(&p, "llama3-70b", hws[i], &r);
        for (int k = 1; k < IKV_PLAN_STEPS; k++)
            assert_true(r.steps[k].d_latency < 0);
        assert_true(r.steps[1].d_compute < 0 && r.steps[3].d_compute < 0);
        assert_true(r.steps[1].mrts < 0 && r.steps[3].mrts < 0);
        double m2 = r.steps[2].mrts;
        assert_true(m2 > 0);
        for (int k = 3; k < IKV_PLAN_STEPS; k++)
            if (r.steps[k].d_compute > 0) assert_true(r.steps[k].mrts > m2);
        assert_true(r.steps[6].mrts > 0 && r.steps[7].mrts > r.steps[6].mrts);
        /* FLOPs never fall: each step adds work or leaves it (speculation, branches, copies) */
        for (int k = 1; k < IKV_PLAN_STEPS; k++)
            assert_true(r.steps[k].flops >= r.steps[k - 1].flops * (1 - 1e-9));
        /* the default knee is interior: past step 2, before step 7 */
        assert_true(r.knee >= 2 && r.knee < 7);
        assert_int_equal(r.hard_cap, 7);
    }
}

/* Speculative decoding follows Leviathan et al.: no acceptance, no gain (the draft only
 * costs); high acceptance, tokens per pass approach gamma + 1. */
static void test_spec_acceptance(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    ikv_plan_result r;
    assert_int_equal(ikv_plan_param_set(&p, "spec.alpha", "0"), 0);
    walk(&p, "llama3-70b", "h100", &r);
    assert_true(r.steps[3].tpot_s > r.steps[2].tpot_s);
    assert_true(r.steps[3].d_latency > 0);
    assert_true(isnan(r.steps[3].mrts));
    assert_int_equal(ikv_plan_param_set(&p, "spec.alpha", "0.95"), 0);
    walk(&p, "llama3-70b", "h100", &r);
    double hi = r.steps[2].tpot_s / r.steps[3].tpot_s;
    assert_int_equal(ikv_plan_param_set(&p, "spec.alpha", "0.6"), 0);
    walk(&p, "llama3-70b", "h100", &r);
    double lo = r.steps[2].tpot_s / r.steps[3].tpot_s;
    assert_true(hi > lo && lo > 1);
    assert_true(hi < p.spec_gamma + 1);
}

/* The knee under a changing price and value. Cumulative utility is U_k = V_k - price C'_k, so
 * raising the price can only move the knee to a step of no more compute, and raising the value
 * of latency only to a step of no more latency. At price 0 the knee is the last step that
 * lowers latency; at value 0 it is the cheapest step. */
static void test_knee_moves(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    ikv_plan_result r;
    double prev_c = INFINITY;
    int moved = 0, first = -1;
    const double prices[] = {0, 0.5, 1, 2.5, 5, 10, 25, 100, 1000};
    for (size_t i = 0; i < sizeof prices / sizeof prices[0]; i++) {
        p.price_gpu_hour = prices[i];
        walk(&p, "llama3-70b", "h100", &r);
        if (i == 0) assert_int_equal(r.knee, 7);
        double c = r.steps[r.knee].compute_gpu_s;
        assert_true(c <= prev_c);
        if (first >= 0 && r.knee != first) moved = 1;
        if (first < 0) first = r.knee;
        prev_c = c;
    }
    assert_true(moved);
    ikv_plan_params_default(&p);
    double prev_l = INFINITY;
    const double values[] = {0, 1e-4, 1e-3, 1e-2, 0.1, 1, 10};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        p.value_per_s = values[i];
        walk(&p, "llama3-70b", "h200", &r);
        double l = r.steps[r.knee].latency_s;
        assert_true(l <= prev_l);
        prev_l = l;
        if (i == 0) {
            int cheapest = 0;
            for (int k = 1; k < IKV_PLAN_STEPS; k++)
                if (r.steps[k].compute_gpu_s < r.steps[cheapest].compute_gpu_s) cheapest = k;
            assert_int_equal(r.knee, cheapest);
        }
    }
    assert_int_equal(r.knee, 7);
}

/* A utility curve: a request is worth $0.05 up to 1 s and nothing after 10 s. The value of a
 * latency change is the difference on the curve, flat outside it. */
static void test_utility_curve(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    assert_int_equal(ikv_plan_param_set(&p, "utility", "1:0.05,10:0"), 0);
    assert_int_equal(p.n_util, 2);
    assert_true(fabs(ikv_plan_value(&p, 10, 1) - 0.05) < 1e-12);
    assert_true(fabs(ikv_plan_value(&p, 20, 15)) < 1e-12);
    assert_true(fabs(ikv_plan_value(&p, 5.5, 1) - 0.025) < 1e-12);
    assert_true(fabs(ikv_plan_value(&p, 0.5, 0.1)) < 1e-12);
    ikv_plan_result r;
    walk(&p, "llama3-70b", "h100", &r);
    double u = 0;
    for (int k = 1; k <= r.knee; k++)
        u += r.steps[k].d_utility;
    assert_true(u >= 0);
    /* bad curves */
    assert_int_equal(ikv_plan_param_set(&p, "utility", "1:0.05"), IKV_EPARAM);
    assert_int_equal(ikv_plan_param_set(&p, "utility", "2:1,1:0"), IKV_ERANGE);
    assert_int_equal(ikv_plan_param_set(&p, "utility", "1:x,2:0"), IKV_EPARAM);
    assert_int_equal(p.n_util, 2); /* unchanged by the failures */
}

/* The router: class caps 2/4/6, 7 only when allowed, the knee lowers any cap, the SLO picks the
 * cheapest step meeting it, the budget bounds the compute. */
static void test_router(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    p.price_gpu_hour = 0; /* knee = 7, so the class caps decide */
    ikv_plan_result r;
    walk(&p, "llama3-70b", "h100", &r);
    assert_int_equal(r.knee, 7);
    ikv_route_decision d;
    ikv_route_req q = {IKV_CLASS_SIMPLE, 0, 0, 0};
    ikv_plan_route(&p, &r, &q, &d);
    assert_int_equal(d.max_step, 2);
    assert_int_equal(d.step, 2);
    q.cls = IKV_CLASS_MEDIUM;
    ikv_plan_route(&p, &r, &q, &d);
    assert_int_equal(d.step, 4);
    q.cls = IKV_CLASS_COMPLEX;
    ikv_plan_route(&p, &r, &q, &d);
    assert_int_equal(d.step, 6);
    q.allow_poll = 1;
    ikv_plan_route(&p, &r, &q, &d);
    assert_int_equal(d.step, 7);
    q.cls = IKV_CLASS_MEDIUM; /* allowing 7 does not lift a medium request */
    ikv_plan_route(&p, &r, &q, &d);
    assert_int_equal(d.step, 4);
    /* even if the table says so, nothing reaches 7 without allow_poll */
    p.route_simple = 7;
    q.cls = IKV_CLASS_SIMPLE;
    q.allow_poll = 0;
    ikv_plan_route(&p, &r, &q, &d);
    assert_int_equal(d.step, 6);
    p.route_simple = 2;

    /* the knee lowers any class cap above it: at a high price the knee falls to the cheapest
     * step (a free lunch, so not below it), under the medium and complex caps */
    p.price_gpu_hour = 1000;
    walk(&p, "llama3-70b", "h100", &r);
    assert_true(r.knee < 4);
    for (int c = 0; c < 3; c++) {
        q.cls = (ikv_req_class)c;
        ikv_plan_route(&p, &r, &q, &d);
        assert_true(d.step <= r.knee);
        if (c > 0) assert_int_equal(d.max_step, r.knee);
        assert_non_null(strstr(d.why, "knee"));
    }

    /* SLO: the cheapest step within the cap that meets it */
    ikv_plan_params_default(&p);
    p.price_gpu_hour = 0;
    walk(&p, "llama3-70b", "h100", &r);
    q = (ikv_route_req){IKV_CLASS_COMPLEX, r.steps[3].latency_s * 1.01, 0, 0};
    ikv_plan_route(&p, &r, &q, &d);
    assert_true(d.slo_met);
    assert_true(r.steps[d.step].latency_s <= q.slo_s);
    for (int k = 0; k <= d.max_step; k++)
        if (r.steps[k].latency_s <= q.slo_s)
            assert_true(r.steps[k].compute_gpu_s >= r.steps[d.step].compute_gpu_s);
    /* unreachable SLO: the fastest allowed step, flagged */
    q.slo_s = 1e-3;
    ikv_plan_route(&p, &r, &q, &d);
    assert_false(d.slo_met);
    assert_int_equal(d.step, 6);
    assert_non_null(strstr(d.why, "no step"));
    /* budget */
    q = (ikv_route_req){IKV_CLASS_COMPLEX, 0, r.steps[3].compute_gpu_s * 1.001, 0};
    ikv_plan_route(&p, &r, &q, &d);
    assert_true(r.steps[d.step].compute_gpu_s <= q.budget_gpu_s);
    assert_true(d.budget_cap >= 3);

    ikv_req_class c;
    assert_int_equal(ikv_req_class_parse("medium", &c), 0);
    assert_int_equal(c, IKV_CLASS_MEDIUM);
    assert_int_equal(ikv_req_class_parse("urgent", &c), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "urgent"));
}

/* Every table key can be set and read back; bad keys and values are refused and leave the
 * parameters unchanged. */
static void test_params(void **st) {
    (void)st;
    ikv_plan_params p, before;
    ikv_plan_params_default(&p);
    assert_int_equal(ikv_plan_params_check(&p), 0);
    for (size_t i = 0; i < ikv_plan_param_count(); i++) {
        const ikv_plan_param_info *in = ikv_plan_param_at(i);
        if (in->is_string) {
            assert_int_equal(ikv_plan_param_set(&p, in->key, "llama3-70b"), 0);
            assert_string_equal(p.spec_draft, "llama3-70b");
            assert_int_equal(ikv_plan_param_set(&p, in->key, "nope"), IKV_EMODEL);
            continue;
        }
        assert_true(in->def >= in->min && in->def <= in->max);
        char buf[64];
        snprintf(buf, sizeof buf, "%.17g", in->max);
        assert_int_equal(ikv_plan_param_set(&p, in->key, buf), 0);
        snprintf(buf, sizeof buf, "%.17g", in->max * 2 + 1);
        before = p;
        assert_int_equal(ikv_plan_param_set(&p, in->key, buf), IKV_ERANGE);
        assert_non_null(strstr(ikv_errdetail(), in->key));
        assert_memory_equal(&p, &before, sizeof p);
    }
    ikv_plan_params_default(&p);
    before = p;
    assert_int_equal(ikv_plan_param_set(&p, "spec.beta", "1"), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "spec.beta"));
    assert_int_equal(ikv_plan_param_set(&p, "spec.alpha", "0.7x"), IKV_EPARAM);
    assert_int_equal(ikv_plan_param_set(&p, "spec.gamma", "2.5"), IKV_ERANGE);
    assert_int_equal(ikv_plan_param_set(&p, "spec.alpha", ""), IKV_EPARAM);
    assert_memory_equal(&p, &before, sizeof p);
    p.tp_size = 6;
    assert_int_equal(ikv_plan_params_check(&p), IKV_ERANGE);
    assert_non_null(strstr(ikv_errdetail(), "power of two"));
    assert_null(ikv_plan_param_at(ikv_plan_param_count()));
}

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/ikv-plan-test-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_json_config(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    char *path = write_tmp("{\"model\": \"llama3-8b\", \"spec\": {\"alpha\": 0.7, \"gamma\": 3},\n"
                           " \"price.gpu_hour\": 4, \"utility\": [[0.5, 0.1], [5, 0]]}\n");
    assert_int_equal(ikv_plan_params_load_json(&p, path), 0);
    assert_true(p.spec_alpha == 0.7 && p.spec_gamma == 3 && p.price_gpu_hour == 4);
    assert_int_equal(p.n_util, 2);
    unlink(path);
    path = write_tmp("{\"spec\": {\"alfa\": 0.7}}");
    assert_int_equal(ikv_plan_params_load_json(&p, path), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "spec.alfa"));
    unlink(path);
    path = write_tmp("{\n\"spec.alpha\": 0.7,\n\"batch\": }\n");
    assert_int_equal(ikv_plan_params_load_json(&p, path), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), ":3:"));
    unlink(path);
    path = write_tmp("{\"batch\": \"many\"}");
    assert_int_equal(ikv_plan_params_load_json(&p, path), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "batch"));
    unlink(path);
    path = write_tmp("[1, 2]");
    assert_int_equal(ikv_plan_params_load_json(&p, path), IKV_EFORMAT);
    unlink(path);
    assert_int_equal(ikv_plan_params_load_json(&p, "/nonexistent/plan.json"), IKV_EIO);
    /* allocation failure while reading: a clean error */
    path = write_tmp("{\"batch\": 8}");
    ikv_alloc_fail_after(0);
    int rc = ikv_plan_params_load_json(&p, path);
    ikv_alloc_fail_after(SIZE_MAX);
    assert_int_equal(rc, IKV_ENOMEM);
    unlink(path);
}

/* The curve passes through every step of the walk and sweeps the TP degrees in between. */
static void test_curve(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    ikv_plan_result r;
    walk(&p, "llama3-70b", "h100", &r);
    ikv_plan_point pts[64];
    int n = ikv_plan_curve(&p, r.model, r.hw, pts, 64);
    assert_true(n > IKV_PLAN_STEPS && n <= 64);
    int seen = 0, tp_pts = 0;
    for (int i = 0; i < n; i++) {
        if (pts[i].label[0] == (char)('0' + pts[i].step) && pts[i].label[1] == ' ') {
            const ikv_plan_step *s = &r.steps[pts[i].step];
            assert_true(fabs(pts[i].compute_gpu_s - s->compute_gpu_s) < 1e-9 * s->compute_gpu_s);
            assert_true(fabs(pts[i].latency_s - s->latency_s) < 1e-9 * s->latency_s);
            seen++;
        }
        if (pts[i].step == 2 && !strcmp(pts[i].label, "TP4")) tp_pts++;
    }
    assert_int_equal(seen, IKV_PLAN_STEPS);
    assert_int_equal(tp_pts, 0); /* baseline is already TP4 on H100: no point in between */
    assert_int_equal(ikv_plan_curve(&p, r.model, r.hw, pts, 2), n); /* count beyond max */
}

/* ---- the CLI, through IKV_BIN ---- */

/* Runs the isokv binary with args, capturing stdout into out (cap bytes); returns the exit
 * status, or -1 when IKV_BIN is not set (the test is then skipped). */
static int run_cli(const char *args, char *out, size_t cap) {
    const char *bin = getenv("IKV_BIN");
    if (!bin || access(bin, X_OK)) return -1;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>/tmp/ikv-plan-test.err", bin, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

static char *read_err(void) {
    static char buf[4096];
    FILE *f = fopen("/tmp/ikv-plan-test.err", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    return buf;
}

static void test_cli_json(void **st) {
    (void)st;
    static char out[1 << 18];
    int rc = run_cli("plan --model llama3-70b --hw h200 --prompt 2048 --output 256 --json", out,
                     sizeof out);
    if (rc < 0) skip();
    assert_int_equal(rc, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *steps = cJSON_GetObjectItem(j, "steps");
    assert_true(cJSON_IsArray(steps));
    assert_int_equal(cJSON_GetArraySize(steps), IKV_PLAN_STEPS);
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    ikv_plan_result r;
    walk(&p, "llama3-70b", "h200", &r);
    assert_int_equal(cJSON_GetObjectItem(j, "knee")->valueint, r.knee);
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        cJSON *s = cJSON_GetArrayItem(steps, k);
        assert_int_equal(cJSON_GetObjectItem(s, "step")->valueint, k);
        assert_string_equal(cJSON_GetObjectItem(s, "name")->valuestring, r.steps[k].name);
        double c = cJSON_GetObjectItem(s, "compute_gpu_s")->valuedouble;
        double l = cJSON_GetObjectItem(s, "latency_ms")->valuedouble;
        assert_true(fabs(c - r.steps[k].compute_gpu_s) < 1e-6 * c);
        assert_true(fabs(l - r.steps[k].latency_s * 1e3) < 1e-6 * l);
        cJSON *m = cJSON_GetObjectItem(s, "mrts");
        assert_non_null(m);
        if (k == 0) assert_true(cJSON_IsNull(m));
        assert_non_null(cJSON_GetObjectItem(s, "marginal_utility"));
    }
    assert_non_null(strstr(cJSON_GetObjectItem(j, "cost_model")->valuestring, "simulated"));
    cJSON_Delete(j);

    rc = run_cli("plan route --class medium --slo-ms 800 --json", out, sizeof out);
    assert_int_equal(rc, 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_true(cJSON_GetObjectItem(j, "step")->valueint <= 4);
    assert_true(cJSON_GetObjectItem(j, "max_step")->valueint <= 4);
    cJSON_Delete(j);
}

static void test_cli_errors(void **st) {
    (void)st;
    static char out[1 << 16];
    /* one exit-code rule (issue 9): a name or value given by a flag that is unknown or
     * malformed is a usage error (2); a bad --config file is a failed input (1) */
    int rc = run_cli("plan --model gpt-9", out, sizeof out);
    if (rc < 0) skip();
    assert_int_equal(rc, 2);
    assert_non_null(strstr(read_err(), "unknown model 'gpt-9'"));
    assert_int_equal(run_cli("plan --hw tpu", out, sizeof out), 2);
    assert_non_null(strstr(read_err(), "unknown hardware 'tpu'"));
    assert_int_equal(run_cli("plan --set spec.beta=2", out, sizeof out), 2);
    assert_non_null(strstr(read_err(), "spec.beta"));
    assert_int_equal(run_cli("plan --set spec.alpha=2", out, sizeof out), 2);
    assert_int_equal(run_cli("plan --prompt -5", out, sizeof out), 2);
    {
        char cfg[512], args[600];
        snprintf(cfg, sizeof cfg, "/tmp/ikv_test_plan_cfg.%ld.json", (long)getpid());
        FILE *f = fopen(cfg, "w");
        assert_non_null(f);
        fputs("{\"spec\": {\"beta\": 2}}\n", f);
        fclose(f);
        snprintf(args, sizeof args, "plan --config %s", cfg);
        assert_int_equal(run_cli(args, out, sizeof out), 1);
        assert_non_null(strstr(read_err(), "unknown parameter 'spec.beta'"));
        f = fopen(cfg, "w");
        assert_non_null(f);
        fputs("{\"model\": \"gpt-9\"}\n", f);
        fclose(f);
        assert_int_equal(run_cli(args, out, sizeof out), 1);
        unlink(cfg);
    }
    assert_int_equal(run_cli("plan --frobnicate", out, sizeof out), 2);
    assert_int_equal(run_cli("plan route", out, sizeof out), 2);
    assert_int_equal(run_cli("plan route --class urgent", out, sizeof out), 2);
    assert_int_equal(run_cli("plan --config /nonexistent.json", out, sizeof out), 1);
    assert_int_equal(run_cli("plan --help", out, sizeof out), 0);
    assert_non_null(strstr(out, "usage: isokv plan"));
    assert_int_equal(run_cli("plan --params", out, sizeof out), 0);
    assert_non_null(strstr(out, "spec.alpha"));
    assert_null(strstr(out, "issue")); /* regression: sources cited the issue that asked */
    /* --plot writes the SVG and the PNG, or fails cleanly naming the file */
    char dir[] = "/tmp/ikv-plan-plot-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char args[256], svg[128], png[128];
    snprintf(svg, sizeof svg, "%s/walk.svg", dir);
    snprintf(png, sizeof png, "%s/walk.png", dir);
    snprintf(args, sizeof args, "plan --hw h200 --plot %s", svg);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_int_equal(access(svg, R_OK), 0);
    assert_int_equal(access(png, R_OK), 0);
    unlink(svg);
    unlink(png);
    rmdir(dir);
    assert_int_equal(run_cli("plan --plot /nonexistent-dir/walk.svg", out, sizeof out), 1);
    assert_non_null(strstr(read_err(), "/nonexistent-dir/walk.svg"));
    rc = run_cli("plan --prompt 4096", out, sizeof out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "knee: step"));
    assert_non_null(strstr(out, "simulated"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roofline_bounds), cmocka_unit_test(test_baseline_fit),
        cmocka_unit_test(test_walk_shape),      cmocka_unit_test(test_spec_acceptance),
        cmocka_unit_test(test_knee_moves),      cmocka_unit_test(test_utility_curve),
        cmocka_unit_test(test_router),          cmocka_unit_test(test_params),
        cmocka_unit_test(test_json_config),     cmocka_unit_test(test_curve),
        cmocka_unit_test(test_cli_json),        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
