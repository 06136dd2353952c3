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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isokv/base.h"
#include "isokv/cost.h"
#include "isokv/plan.h"
#include "testutil.h"

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

/* ---- the frontier ---- */

/* Is a dominated by b (b as cheap and as fast, and better in one)? */
static int dominated(double ca, double la, double cb, double lb) {
    return cb <= ca && lb <= la && (cb < ca || lb < la);
}

/* Differential fuzz: ikv_plan_pareto and ikv_plan_lower_hull against brute force on random
 * clouds with duplicates and ties (a coarse grid makes both common). */
static void test_pareto_fuzz(void **st) {
    (void)st;
    enum { N = 400 };
    ikv_plan_xy pts[N], orig[N];
    size_t hull[N];
    uint64_t seed = 12345;
    for (int round = 0; round < 60; round++) {
        size_t n = 1 + (size_t)(round * 7) % N;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            int grid = round % 3 == 0 ? 8 : 1000;
            orig[i].c = 1 + (double)((seed >> 20) % (uint64_t)grid);
            orig[i].l = 1 + (double)((seed >> 40) % (uint64_t)grid);
            orig[i].id = i;
        }
        memcpy(pts, orig, n * sizeof *pts);
        size_t k = ikv_plan_pareto(pts, n);
        /* brute force: every non-dominated point has an equal twin in pts[0..k) and every point
         * in pts[0..k) is non-dominated; no two of them are equal */
        for (size_t i = 0; i < n; i++) {
            int dom = 0;
            for (size_t j = 0; j < n && !dom; j++)
                dom = dominated(orig[i].c, orig[i].l, orig[j].c, orig[j].l);
            int in = 0;
            for (size_t j = 0; j < k; j++)
                in |= pts[j].c == orig[i].c && pts[j].l == orig[i].l;
            assert_int_equal(in, !dom);
        }
        for (size_t j = 1; j < k; j++) {
            assert_true(pts[j].c > pts[j - 1].c); /* cheapest first, strictly */
            assert_true(pts[j].l < pts[j - 1].l);
        }
        size_t h = ikv_plan_lower_hull(pts, k, hull);
        assert_true(h >= 1 && h <= k);
        assert_int_equal(hull[0], 0);         /* the cheapest point */
        assert_int_equal(hull[h - 1], k - 1); /* the fastest point */
        double prev = -INFINITY;
        for (size_t i = 1; i < h; i++) {
            const ikv_plan_xy *a = &pts[hull[i - 1]], *b = &pts[hull[i]];
            double mrts = (b->c - a->c) / (a->l - b->l);
            assert_true(mrts > prev); /* rises strictly */
            prev = mrts;
            /* no Pareto point lies below the segment (convexity, brute force) */
            for (size_t j = 0; j < k; j++)
                if (pts[j].l <= a->l && pts[j].l >= b->l) {
                    double t = (a->l - pts[j].l) / (a->l - b->l);
                    assert_true(pts[j].c >= a->c + t * (b->c - a->c) - 1e-9 * b->c);
                }
        }
    }
    assert_int_equal(ikv_plan_pareto(pts, 0), 0);
}

static void frontier(const ikv_plan_params *p, const char *model, const char *hw, int level,
                     ikv_plan_frontier *f) {
    const ikv_model_spec *m;
    const ikv_hw_spec *h;
    assert_int_equal(ikv_model_lookup(model, &m), 0);
    assert_int_equal(ikv_hw_lookup(hw, &h), 0);
    int rc = ikv_plan_frontier_build(p, m, h, level, f);
    if (rc) fail_msg("frontier failed: %s", ikv_errdetail());
    if (!ikv_plan_frontier_check(f)) fail_msg("frontier check: %s", ikv_errdetail());
}

/* The default frontier: convex, non-dominated, MRTS rising, the walk placed consistently. */
static void test_frontier_default(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    const char *hws[] = {"h100", "h200"};
    for (int v = 0; v < 2; v++) {
        ikv_plan_frontier f;
        frontier(&p, "llama3-70b", hws[v], 7, &f);
        ikv_plan_result w;
        walk(&p, "llama3-70b", hws[v], &w);
        assert_true(f.n_hull >= 3 && f.n_pareto >= f.n_hull && f.n_feasible >= f.n_pareto);
        for (size_t i = 2; i < f.n_hull; i++)
            assert_true(f.hull[i].mrts > f.hull[i - 1].mrts);
        for (size_t i = 0; i < f.n_hull; i++) {
            /* the hull point is its configuration, re-evaluated */
            ikv_plan_step s;
            assert_int_equal(ikv_plan_eval(&p, w.model, w.hw, &f.hull_cfg[i], &s), 0);
            assert_true(s.compute_gpu_s == f.hull[i].compute_gpu_s);
            assert_true(fabs(ikv_plan_frontier_compute_at(&f, s.latency_s) - s.compute_gpu_s) <=
                        1e-9 * s.compute_gpu_s);
            assert_true(s.step == ikv_plan_config_level(&p, f.base_tp, &f.hull_cfg[i]));
        }
        /* every walk step configuration is in the cloud; a step is never below the hull */
        for (int k = 0; k < IKV_PLAN_STEPS; k++) {
            const ikv_plan_step *s = &w.steps[k];
            if (!isnan(f.walk_excess[k])) assert_true(f.walk_excess[k] >= -1e-9 * s->compute_gpu_s);
            if (f.walk_where[k] == IKV_PLAN_DOMINATED) {
                const ikv_plan_cloud_pt *q = &f.cloud[f.walk_dominated_by[k]];
                assert_true(q->feasible && q->pareto);
                assert_true(
                    dominated(s->compute_gpu_s, s->latency_s, q->compute_gpu_s, q->latency_s));
            } else {
                assert_int_equal(f.walk_dominated_by[k], -1);
            }
            if (f.walk_where[k] == IKV_PLAN_ON_HULL)
                assert_true(f.walk_excess[k] <= 1e-9 * s->compute_gpu_s);
        }
        /* on these defaults the naive baseline is dominated (fused kernels are a free lunch),
         * and step 5's negative MRTS after step 4's 145 is out of order */
        assert_int_equal(f.walk_where[0], IKV_PLAN_DOMINATED);
        assert_int_equal(f.walk_out_of_order[5], 1);
        assert_int_equal(f.walk_out_of_order[1], 0);
        /* the frontier reaches at least as low a latency as the walk, and as low a compute */
        double minc = INFINITY, minl = INFINITY;
        for (int k = 0; k < IKV_PLAN_STEPS; k++)
            if (w.steps[k].fits) {
                minc = fmin(minc, w.steps[k].compute_gpu_s);
                minl = fmin(minl, w.steps[k].latency_s);
            }
        assert_true(f.hull[0].compute_gpu_s <= minc);
        assert_true(f.hull[f.n_hull - 1].latency_s <= minl);
        ikv_plan_frontier_free(&f);
        ikv_plan_frontier_free(&f); /* idempotent */
    }
}

/* A small space where an O(n^2) check of every cloud point's Pareto flag is cheap. */
static void test_frontier_bruteforce(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    const char *set[][2] = {{"tp.size", "4"},
                            {"pp.nodes", "2"},
                            {"frontier.max_nodes", "2"},
                            {"spec.gamma", "2"},
                            {"frontier.max_gamma", "2"},
                            {"search.branches", "2"},
                            {"frontier.max_branches", "3"},
                            {"hedge.copies", "2"},
                            {"frontier.max_copies", "2"},
                            {"batch", "4"}};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        assert_int_equal(ikv_plan_param_set(&p, set[i][0], set[i][1]), 0);
    ikv_plan_frontier f;
    frontier(&p, "llama3-8b", "a100", 7, &f);
    assert_int_equal(f.n_cloud, 2 * 3 * 2 * 3 * 3 * 2 * (3 + 1));
    size_t pareto = 0;
    for (size_t i = 0; i < f.n_cloud; i++) {
        const ikv_plan_cloud_pt *a = &f.cloud[i];
        if (!a->feasible) {
            assert_int_equal(a->pareto, 0);
            continue;
        }
        int dom = 0, twin = 0;
        for (size_t j = 0; j < f.n_cloud; j++) {
            const ikv_plan_cloud_pt *b = &f.cloud[j];
            if (!b->feasible || j == i) continue;
            dom |= dominated(a->compute_gpu_s, a->latency_s, b->compute_gpu_s, b->latency_s);
            twin |=
                b->pareto && b->compute_gpu_s == a->compute_gpu_s && b->latency_s == a->latency_s;
        }
        if (dom)
            assert_int_equal(a->pareto, 0);
        else
            assert_true(a->pareto || twin);
        pareto += a->pareto;
    }
    assert_int_equal(pareto, f.n_pareto);
    /* no feasible point below the hull */
    for (size_t i = 0; i < f.n_cloud; i++)
        if (f.cloud[i].feasible) {
            double c = ikv_plan_frontier_compute_at(&f, f.cloud[i].latency_s);
            if (!isnan(c)) assert_true(f.cloud[i].compute_gpu_s >= c * (1 - 1e-9));
        }
    ikv_plan_frontier_free(&f);
}

/* The knee: with a linear value it is where the segment MRTS crosses value * 3600 / price;
 * comparative statics as for the walk's knee. */
static void test_frontier_knee(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    ikv_plan_frontier f;
    const char *prices[] = {"0.5", "2.5", "10", "40"};
    size_t last = SIZE_MAX;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ikv_plan_param_set(&p, "price.gpu_hour", prices[i]), 0);
        frontier(&p, "llama3-70b", "h100", 7, &f);
        size_t k = (size_t)f.knee;
        double thr = f.mrts_threshold;
        assert_true(fabs(thr - p.value_per_s * 3600 / p.price_gpu_hour) < 1e-9 * thr);
        if (k > 0) assert_true(f.hull[k].mrts <= thr);
        if (k + 1 < f.n_hull) assert_true(f.hull[k + 1].mrts > thr);
        assert_true(k <= last); /* dearer compute: never a faster, dearer knee */
        last = k;
        ikv_plan_frontier_free(&f);
    }
    assert_int_equal(ikv_plan_param_set(&p, "price.gpu_hour", "0"), 0);
    frontier(&p, "llama3-70b", "h100", 7, &f);
    assert_int_equal(f.knee, (int)f.n_hull - 1); /* free compute: the fastest point */
    assert_true(isinf(f.mrts_threshold));
    ikv_plan_frontier_free(&f);
    ikv_plan_params_default(&p);
    assert_int_equal(ikv_plan_param_set(&p, "value.per_s", "0"), 0);
    frontier(&p, "llama3-70b", "h100", 7, &f);
    assert_int_equal(f.knee, 0); /* worthless latency: the cheapest point */
    ikv_plan_frontier_free(&f);
}

/* One try of ikv_plan_frontier_build for tu_alloc_fail_each: a failed build leaves nothing
 * to free. */
typedef struct frontier_try {
    const ikv_plan_params *p;
    const ikv_model_spec *m;
    const ikv_hw_spec *h;
    ikv_plan_frontier *f;
} frontier_try;

static int try_frontier(void *ctx) {
    frontier_try *t = ctx;
    int rc = ikv_plan_frontier_build(t->p, t->m, t->h, 7, t->f);
    if (rc) assert_null(t->f->cloud), assert_null(t->f->hull);
    return rc;
}

/* The router on the frontier: the class cap holds for every candidate, the SLO picks the
 * cheapest point meeting it, the budget caps, and a frontier with too many levers is refused. */
static void test_route_frontier(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    for (int cls = 0; cls < 3; cls++) {
        ikv_route_req req = {.cls = (ikv_req_class)cls};
        int cap = ikv_plan_class_cap(&p, &req);
        ikv_plan_frontier f;
        frontier(&p, "llama3-70b", "h100", cap, &f);
        for (size_t i = 0; i < f.n_hull; i++)
            assert_true(f.hull[i].step <= cap);
        ikv_route_decision d;
        assert_int_equal(ikv_plan_route_frontier(&p, &f, &req, &d), 0);
        assert_int_equal(d.point, f.knee);
        assert_true(d.step <= cap);
        /* an SLO between two hull points' latencies picks the first that meets it */
        if (f.knee >= 1) {
            req.slo_s = (f.hull[1].latency_s + f.hull[0].latency_s) / 2;
            assert_int_equal(ikv_plan_route_frontier(&p, &f, &req, &d), 0);
            assert_int_equal(d.point, 1);
            assert_int_equal(d.slo_met, 1);
        }
        req.slo_s = 1e-6;
        assert_int_equal(ikv_plan_route_frontier(&p, &f, &req, &d), 0);
        assert_int_equal(d.slo_met, 0);
        assert_int_equal(d.point, f.knee);
        req.slo_s = 0;
        req.budget_gpu_s = f.hull[0].compute_gpu_s;
        assert_int_equal(ikv_plan_route_frontier(&p, &f, &req, &d), 0);
        assert_int_equal(d.point, 0);
        ikv_plan_frontier_free(&f);
    }
    ikv_plan_frontier f;
    /* a space too large to evaluate is refused before anything is allocated */
    ikv_plan_params big = p;
    assert_int_equal(ikv_plan_param_set(&big, "frontier.max_branches", "1024"), 0);
    assert_int_equal(ikv_plan_param_set(&big, "frontier.max_copies", "64"), 0);
    {
        const ikv_model_spec *m;
        const ikv_hw_spec *h;
        ikv_model_lookup("llama3-70b", &m);
        ikv_hw_lookup("h100", &h);
        assert_int_equal(ikv_plan_frontier_build(&big, m, h, 7, &f), IKV_ERANGE);
        assert_non_null(strstr(ikv_errdetail(), "frontier.max_"));
        assert_null(f.cloud);
    }
    frontier(&p, "llama3-70b", "h100", 7, &f);
    ikv_route_req req = {.cls = IKV_CLASS_SIMPLE};
    ikv_route_decision d;
    assert_int_equal(ikv_plan_route_frontier(&p, &f, &req, &d), IKV_EINVAL);
    ikv_plan_frontier_free(&f);
    /* allocation failure at each allocation in turn: a clean error, nothing to free (ASan's
     * leak check sees the rest) */
    const ikv_model_spec *m;
    const ikv_hw_spec *h;
    ikv_model_lookup("llama3-70b", &m);
    ikv_hw_lookup("h100", &h);
    frontier_try t = {&p, m, h, &f};
    size_t k = tu_alloc_fail_each(try_frontier, &t, 16);
    assert_true(k >= 3); /* cloud, scratch, hull indices, hull, configurations */
    ikv_plan_frontier_free(&f);
}

/* With a utility curve the knee is the hull point of highest u(L) - price C (the MRTS crossing
 * the curve's slope); the dump names it. */
static void test_frontier_utility(void **st) {
    (void)st;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    assert_int_equal(ikv_plan_param_set(&p, "utility", "1:0.08,2:0.05,4:0.02,20:0"), 0);
    ikv_plan_frontier f;
    frontier(&p, "llama3-70b", "h100", 7, &f);
    double best = -INFINITY;
    size_t arg = 0;
    for (size_t i = 0; i < f.n_hull; i++) {
        double u = ikv_plan_value(&p, f.hull[0].latency_s, f.hull[i].latency_s) -
                   p.price_gpu_hour / 3600 * (f.hull[i].compute_gpu_s - f.hull[0].compute_gpu_s);
        if (u > best + 1e-15) best = u, arg = i;
    }
    assert_int_equal(f.knee, (int)arg);
    char buf[8192] = "";
    FILE *mem = fmemopen(buf, sizeof buf - 1, "w");
    assert_non_null(mem);
    ikv_plan_frontier_dump(&f, mem);
    fclose(mem);
    char want[64];
    snprintf(want, sizeof want, "knee %d", f.knee);
    assert_non_null(strstr(buf, want));
    assert_non_null(strstr(buf, "walk step 7"));
    ikv_plan_frontier_free(&f);
}

/* ---- jumps ---- */

static void test_jump_parse(void **st) {
    (void)st;
    ikv_plan_jumps j, before;
    memset(&before, 0x5a, sizeof before);
    j = before;
    assert_int_equal(ikv_plan_jumps_parse("w4,kv8,gqa:kv=2,swa:w=1024,draft:alpha=0.95:c=0.05,"
                                          "prefix:h=0.6",
                                          &j),
                     0);
    assert_int_equal(j.n, 6);
    assert_int_equal(j.j[0].kind, IKV_JUMP_W4);
    assert_int_equal(j.j[2].kind, IKV_JUMP_GQA);
    assert_true(j.j[2].a == 2);
    assert_true(j.j[3].a == 1024);
    assert_true(j.j[4].a == 0.95 && j.j[4].b == 0.05);
    assert_true(j.j[5].a == 0.6);
    const char *bad[] = {"w3",
                         "",
                         "w4,",
                         "gqa:kv=0",
                         "gqa:heads=2",
                         "swa:w=x",
                         "prefix",
                         "prefix:h=1",
                         "prefix:h=-0.1",
                         "draft:alpha=1.5",
                         "kv8:x=1",
                         "prefix:sim=/nonexistent.json",
                         "w8,w8,w8,w8,w8,w8,w8,w8,w8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = before;
        assert_true(ikv_plan_jumps_parse(bad[i], &j) < 0);
        assert_memory_equal(&j, &before, sizeof j);
    }
    assert_int_equal(ikv_plan_jumps_parse("w3", &j), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "w3"));
    assert_int_equal(ikv_plan_jumps_parse("prefix:sim=/nonexistent.json", &j), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "/nonexistent.json"));
    for (int k = 0; k < IKV_JUMP_COUNT; k++) {
        const ikv_plan_jump_info *in = ikv_plan_jump_info_at((ikv_jump_kind)k);
        assert_non_null(in);
        assert_true(*in->source && *in->quality);
    }
    assert_null(ikv_plan_jump_info_at(IKV_JUMP_COUNT));
}

static char *write_tmp(const char *text);

/* prefix:sim= reads the token hit ratio of an `isokv sim --json` output (and of a sweep's run). */
static void test_jump_sim_file(void **st) {
    (void)st;
    ikv_plan_jumps j;
    char spec[256];
    char *path = write_tmp("{\"policy\": \"lru\", \"token_hit_ratio\": 0.625}");
    snprintf(spec, sizeof spec, "prefix:sim=%s", path);
    assert_int_equal(ikv_plan_jumps_parse(spec, &j), 0);
    assert_true(j.j[0].a == 0.625);
    unlink(path);
    path = write_tmp("{\"runs\": [{\"token_hit_ratio\": 0.3}, {\"token_hit_ratio\": 0.9}]}");
    snprintf(spec, sizeof spec, "prefix:sim=%s:run=1", path);
    assert_int_equal(ikv_plan_jumps_parse(spec, &j), 0);
    assert_true(j.j[0].a == 0.9);
    snprintf(spec, sizeof spec, "prefix:sim=%s:run=2", path);
    assert_int_equal(ikv_plan_jumps_parse(spec, &j), IKV_ERANGE);
    unlink(path);
    path = write_tmp("{\"token_hit\": 0.5}");
    snprintf(spec, sizeof spec, "prefix:sim=%s", path);
    assert_int_equal(ikv_plan_jumps_parse(spec, &j), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "token_hit_ratio"));
    unlink(path);
    path = write_tmp("{not json");
    snprintf(spec, sizeof spec, "prefix:sim=%s", path);
    assert_int_equal(ikv_plan_jumps_parse(spec, &j), IKV_EFORMAT);
    unlink(path);
}

/* Applies jumps to llama3-70b on h100; returns the new frontier in *nf and walk in *nw. */
static void jumped(const char *spec, ikv_plan_params *np, ikv_model_spec *nm, char *name,
                   ikv_plan_frontier *nf, ikv_plan_result *nw) {
    ikv_plan_jumps j;
    assert_int_equal(ikv_plan_jumps_parse(spec, &j), 0);
    const ikv_model_spec *m;
    const ikv_hw_spec *h;
    ikv_model_lookup("llama3-70b", &m);
    ikv_hw_lookup("h100", &h);
    ikv_plan_params_default(np);
    assert_int_equal(ikv_plan_jumps_apply(&j, m, np, nm, name, 256), 0);
    assert_int_equal(ikv_plan_walk(np, nm, h, nw), 0);
    assert_int_equal(ikv_plan_frontier_build(np, nm, h, 7, nf), 0);
    assert_true(ikv_plan_frontier_check(nf));
}

/* Each jump moves the curve the way its transformation says; lossless jumps on a shape they do
 * not touch leave it exactly where it was. */
static void test_jump_effects(void **st) {
    (void)st;
    ikv_plan_params p, np;
    ikv_plan_params_default(&p);
    ikv_plan_frontier of, nf;
    ikv_plan_result ow, nw;
    ikv_model_spec nm;
    char name[256];
    frontier(&p, "llama3-70b", "h100", 7, &of);
    walk(&p, "llama3-70b", "h100", &ow);

    /* 4-bit weights: a quarter of the bytes, the baseline fits on one GPU, and every latency
     * of the old walk costs less compute on the new frontier */
    jumped("w4", &np, &nm, name, &nf, &nw);
    assert_string_equal(nm.name, "llama3-70b+w4");
    assert_true(fabs(ikv_model_weight_bytes(&nm) / ikv_model_weight_bytes(ow.model) -
                     (0.5 + 2.0 / 128) / 2) < 1e-12);
    assert_true(nw.base_tp < ow.base_tp);
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        double c = ikv_plan_frontier_compute_at(&nf, ow.steps[k].latency_s);
        assert_false(isnan(c));
        assert_true(c < ikv_plan_frontier_compute_at(&of, ow.steps[k].latency_s));
    }
    assert_true(nf.hull[nf.n_hull - 1].latency_s < of.hull[of.n_hull - 1].latency_s);
    ikv_plan_frontier_free(&nf);

    /* KV at one byte: exactly half the KV bytes per token; weights untouched */
    jumped("kv8", &np, &nm, name, &nf, &nw);
    assert_true(ikv_kv_bytes_per_token(&nm) * 2 == ikv_kv_bytes_per_token(ow.model));
    assert_true(ikv_model_weight_bytes(&nm) == ikv_model_weight_bytes(ow.model));
    assert_true(nw.steps[1].tpot_s < ow.steps[1].tpot_s);
    ikv_plan_frontier_free(&nf);

    /* a window longer than prompt + output changes nothing, bit for bit */
    jumped("swa:w=8192", &np, &nm, name, &nf, &nw);
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        assert_true(nw.steps[k].compute_gpu_s == ow.steps[k].compute_gpu_s);
        assert_true(nw.steps[k].latency_s == ow.steps[k].latency_s);
    }
    assert_int_equal(nf.n_hull, of.n_hull);
    ikv_plan_frontier_free(&nf);
    /* one shorter than the prompt bounds attention and KV: less work */
    jumped("swa:w=512", &np, &nm, name, &nf, &nw);
    assert_true(nw.steps[1].flops < ow.steps[1].flops);
    assert_true(nw.steps[1].tpot_s < ow.steps[1].tpot_s);
    ikv_plan_frontier_free(&nf);

    /* fewer KV heads: KV and k,v projections shrink in proportion */
    jumped("gqa:kv=2", &np, &nm, name, &nf, &nw);
    assert_int_equal(nm.kv_heads, 2);
    assert_true(ikv_kv_bytes_per_token(&nm) * 4 == ikv_kv_bytes_per_token(ow.model));
    assert_true(fabs(ow.model->params - nm.params - 2.0 * 80 * 8192 * 6 * 128) < 1);
    ikv_plan_frontier_free(&nf);

    /* a better draft lowers TPOT from step 3 on and leaves steps 0..2 alone */
    jumped("draft:alpha=0.95", &np, &nm, name, &nf, &nw);
    assert_true(np.spec_alpha == 0.95);
    assert_true(nw.steps[2].latency_s == ow.steps[2].latency_s);
    assert_true(nw.steps[3].tpot_s < ow.steps[3].tpot_s);
    ikv_plan_frontier_free(&nf);

    /* a prefix hit of 0.75: TTFT falls, decode does not change; FLOPs of the first prefill fall
     * by at least 2 N x 0.75 P */
    jumped("prefix:h=0.75", &np, &nm, name, &nf, &nw);
    assert_true(np.prefix_hit == 0.75);
    assert_true(nw.steps[1].ttft_s < ow.steps[1].ttft_s);
    assert_true(nw.steps[1].tpot_s == ow.steps[1].tpot_s);
    assert_true(ow.steps[1].flops - nw.steps[1].flops >=
                2 * ikv_model_layer_params(ow.model) * 1536 * 0.999);
    ikv_plan_frontier_free(&nf);

    /* a jump that does not fit the model: a clear error, nothing changed */
    ikv_plan_jumps j;
    assert_int_equal(ikv_plan_jumps_parse("gqa:kv=3", &j), 0);
    ikv_plan_params q = p;
    assert_int_equal(ikv_plan_jumps_apply(&j, ow.model, &q, &nm, name, sizeof name), IKV_ERANGE);
    assert_memory_equal(&q, &p, sizeof q);
    ikv_plan_frontier_free(&of);
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

/* --frontier --json: the hull as `frontier`, each entry a `steps` entry plus its
 * configuration, equal to the library's; --jump and route --frontier; plots and bad targets. */
static void test_cli_frontier(void **st) {
    (void)st;
    static char out[1 << 20];
    int rc = run_cli("plan --frontier --json", out, sizeof out);
    if (rc < 0) skip();
    assert_int_equal(rc, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *fr = cJSON_GetObjectItem(j, "frontier");
    assert_true(cJSON_IsArray(fr));
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    ikv_plan_frontier f;
    frontier(&p, "llama3-70b", "h100", 7, &f);
    assert_int_equal(cJSON_GetArraySize(fr), (int)f.n_hull);
    cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "steps"), 0);
    for (size_t i = 0; i < f.n_hull; i++) {
        cJSON *e = cJSON_GetArrayItem(fr, (int)i);
        for (cJSON *field = s0->child; field; field = field->next) /* all of a steps entry */
            assert_non_null(cJSON_GetObjectItem(e, field->string));
        double c = cJSON_GetObjectItem(e, "compute_gpu_s")->valuedouble;
        assert_true(fabs(c - f.hull[i].compute_gpu_s) < 1e-6 * c);
        cJSON *cf = cJSON_GetObjectItem(e, "configuration");
        assert_non_null(cf);
        assert_int_equal(cJSON_GetObjectItem(cf, "tp")->valueint, (int)f.hull_cfg[i].tp);
        assert_int_equal(cJSON_GetObjectItem(cf, "batch")->valueint, (int)f.hull_cfg[i].batch);
        if (i) assert_true(cJSON_IsNumber(cJSON_GetObjectItem(e, "mrts")));
    }
    assert_int_equal(cJSON_GetObjectItem(j, "frontier_knee")->valueint, f.knee);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "walk_vs_frontier")),
                     IKV_PLAN_STEPS);
    cJSON_Delete(j);
    ikv_plan_frontier_free(&f);

    assert_int_equal(run_cli("plan --frontier", out, sizeof out), 0);
    assert_non_null(strstr(out, "<- knee"));
    assert_non_null(strstr(out, "simulated"));
    assert_int_equal(run_cli("plan --jump w4,prefix:h=0.5 --json", out, sizeof out), 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "jumps")), 2);
    cJSON *same = cJSON_GetObjectItem(j, "same_latency");
    assert_int_equal(cJSON_GetArraySize(same), IKV_PLAN_STEPS + 1);
    double r = cJSON_GetObjectItem(cJSON_GetArrayItem(same, 3), "ratio")->valuedouble;
    assert_true(r > 0 && r < 1);
    cJSON_Delete(j);
    assert_int_equal(run_cli("plan --jump w3", out, sizeof out), 2); /* usage error (main 7e62504) */
    assert_non_null(strstr(read_err(), "unknown jump 'w3'"));
    assert_int_equal(run_cli("plan --jump", out, sizeof out), 2);
    assert_int_equal(run_cli("plan --frontier --measured", out, sizeof out), 2);
    assert_int_equal(run_cli("plan route --frontier --class simple --json", out, sizeof out), 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_true(cJSON_GetObjectItem(j, "step")->valueint <= 2);
    assert_string_equal(cJSON_GetObjectItem(j, "router")->valuestring, "frontier");
    cJSON_Delete(j);

    /* plots: written when asked, refused onto a directory, names with quotes survive */
    char dir[] = "/tmp/ikv-plan-fr-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char args[512], svg[256], png[256];
    snprintf(svg, sizeof svg, "%s/it's \"a\" plot.svg", dir);
    snprintf(png, sizeof png, "%s/it's \"a\" plot.png", dir);
    snprintf(args, sizeof args, "plan --frontier --plot '%s/it'\\''s \"a\" plot.svg'", dir);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_int_equal(access(svg, R_OK), 0);
    assert_int_equal(access(png, R_OK), 0);
    unlink(svg);
    unlink(png);
    /* a title with a quote and a newline (from the jump's sim file name) stays a title */
    char simf[256];
    snprintf(simf, sizeof simf, "%s/s'i\nm.json", dir);
    FILE *sf = fopen(simf, "w");
    assert_non_null(sf);
    fputs("{\"token_hit_ratio\": 0.5}", sf);
    fclose(sf);
    snprintf(svg, sizeof svg, "%s/j.svg", dir);
    snprintf(png, sizeof png, "%s/j.png", dir);
    snprintf(args, sizeof args, "plan --jump 'prefix:sim=%s/s'\\''i\nm.json' --plot %s", dir, svg);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_int_equal(access(svg, R_OK), 0);
    assert_int_equal(access(png, R_OK), 0);
    unlink(svg);
    unlink(png);
    unlink(simf);
    snprintf(svg, sizeof svg, "%s/sub.svg", dir);
    assert_int_equal(mkdir(svg, 0700), 0);
    snprintf(args, sizeof args, "plan --jump kv8 --plot %s", svg);
    assert_int_equal(run_cli(args, out, sizeof out), 1);
    assert_non_null(strstr(read_err(), "not a regular file"));
    rmdir(svg);
    /* nothing else was left in the directory (no temporary files) */
    assert_int_equal(rmdir(dir), 0);
}

/* --measured on a tiny generated model: per thread count a prefix miss and hit, a batch of 3,
 * lookup speculation on a miss and a hit and a response-cache hit (12 points); hits take
 * tokens from the cache, misses none; speculation drafts tokens and every accepted one was
 * drafted; the response-cache hit accepts its whole stored answer (greedy: the same tokens)
 * in fewer forward passes than tokens; a batch's C per request is threads x L / 3; every
 * figure positive; the frontier's points undominated among all; the walk has 5 steps.
 * --spec none and --batch 1 leave those points out. */
static void test_cli_measured(void **st) {
    (void)st;
    static char out[1 << 18];
    int rc = run_cli("plan --measured --engine-config tiny --prompt 128 --output 6 --repeat 1 "
                     "--batch 3 --json",
                     out, sizeof out);
    if (rc < 0) skip();
    assert_int_equal(rc, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_non_null(strstr(cJSON_GetObjectItem(j, "what")->valuestring, "measured"));
    cJSON *pts = cJSON_GetObjectItem(j, "points");
    const int n = cJSON_GetArraySize(pts);
    assert_int_equal(n, 12);
    double c[12], l[12];
    int seen_batch = 0, seen_spec = 0, seen_rc = 0;
    for (int i = 0; i < n; i++) {
        cJSON *q = cJSON_GetArrayItem(pts, i);
        double cached = cJSON_GetObjectItem(q, "cached_tokens")->valuedouble;
        const char *dec = cJSON_GetObjectItem(q, "decode")->valuestring;
        int hit = cJSON_IsTrue(cJSON_GetObjectItem(q, "prefix_hit"));
        double batch = cJSON_GetObjectItem(q, "batch")->valuedouble;
        double threads = cJSON_GetObjectItem(q, "threads")->valuedouble;
        double drafted = cJSON_GetObjectItem(q, "draft_tokens")->valuedouble;
        double accepted = cJSON_GetObjectItem(q, "accepted_tokens")->valuedouble;
        double fw = cJSON_GetObjectItem(q, "forwards")->valuedouble;
        l[i] = cJSON_GetObjectItem(q, "latency_ms")->valuedouble;
        c[i] = cJSON_GetObjectItem(q, "compute_cpu_s")->valuedouble;
        assert_true(l[i] > 0 && c[i] > 0);
        assert_true(cJSON_GetObjectItem(q, "predicted_latency_ms")->valuedouble > 0);
        assert_true(accepted <= drafted);
        if (!strcmp(dec, "response_cache")) {
            seen_rc++;
            assert_true(cached >= 112); /* the same prompt: all its full blocks */
            assert_true(accepted >= 5); /* the stored greedy answer (6 tokens; the last is
                                           sampled after the accepted draft) */
            assert_true(fw < 6);
        } else if (hit) {
            assert_true(cached >= 64 && cached <= 112); /* 0.875 x 128, whole blocks */
        } else {
            assert_true(cached == 0);
        }
        if (!strcmp(dec, "lookup")) seen_spec++;
        if (!strcmp(dec, "plain")) assert_true(drafted == 0 && fw == 6);
        if (batch > 1) {
            seen_batch++;
            assert_true(batch == 3);
            assert_true(fabs(c[i] - threads * l[i] / 1e3 / 3) <= 1e-9 + 1e-6 * c[i]);
        }
    }
    assert_int_equal(seen_batch, 2);
    assert_int_equal(seen_spec, 4);
    assert_int_equal(seen_rc, 2);
    cJSON *fr = cJSON_GetObjectItem(j, "frontier");
    assert_true(cJSON_GetArraySize(fr) >= 1);
    cJSON *e;
    cJSON_ArrayForEach(e, fr) {
        double fc = cJSON_GetObjectItem(e, "compute_gpu_s")->valuedouble;
        double fl = cJSON_GetObjectItem(e, "latency_ms")->valuedouble;
        for (int i = 0; i < n; i++)
            assert_false(dominated(fc, fl, c[i], l[i]));
    }
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "steps")), 5);
    cJSON_Delete(j);
    rc = run_cli("plan --measured --engine-config tiny --prompt 64 --output 2 --repeat 1 "
                 "--batch 1 --spec none --json",
                 out, sizeof out);
    assert_int_equal(rc, 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "points")), 6);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "steps")), 4);
    cJSON_Delete(j);
    assert_int_equal(run_cli("plan --measured --spec draft", out, sizeof out), 2);
    assert_int_equal(run_cli("plan --measured --batch 9", out, sizeof out), 2);
    assert_int_equal(run_cli("plan --spec lookup", out, sizeof out), 2);
    assert_int_equal(run_cli("plan --measured --engine-config huge", out, sizeof out), 1);
    assert_int_equal(run_cli("plan --measured --engine-model /nonexistent.bin", out, sizeof out),
                     1);
    assert_non_null(strstr(read_err(), "/nonexistent.bin"));
    /* regression: this error message once read the model's seq_len after freeing the model
     * (caught by ASan here) */
    assert_int_equal(run_cli("plan --measured --engine-config tiny --prompt 300", out, sizeof out),
                     1);
    assert_non_null(strstr(read_err(), "seq_len"));
    assert_int_equal(run_cli("plan --hit 0.5", out, sizeof out), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roofline_bounds),
        cmocka_unit_test(test_baseline_fit),
        cmocka_unit_test(test_walk_shape),
        cmocka_unit_test(test_spec_acceptance),
        cmocka_unit_test(test_knee_moves),
        cmocka_unit_test(test_utility_curve),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_params),
        cmocka_unit_test(test_json_config),
        cmocka_unit_test(test_curve),
        cmocka_unit_test(test_cli_json),
        cmocka_unit_test(test_cli_errors),
        cmocka_unit_test(test_pareto_fuzz),
        cmocka_unit_test(test_frontier_default),
        cmocka_unit_test(test_frontier_bruteforce),
        cmocka_unit_test(test_frontier_knee),
        cmocka_unit_test(test_route_frontier),
        cmocka_unit_test(test_frontier_utility),
        cmocka_unit_test(test_jump_parse),
        cmocka_unit_test(test_jump_sim_file),
        cmocka_unit_test(test_jump_effects),
        cmocka_unit_test(test_cli_frontier),
        cmocka_unit_test(test_cli_measured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
