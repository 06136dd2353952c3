/*
 * `isokv plan --frontier` and `isokv plan --jump`: reports over plan/'s frontier.
 *
 *   --frontier  the hull points cheapest first with their configurations, C, L, the segment
 *               MRTS (rising) and marginal utility; the knee and the MRTS threshold
 *               value/price it crosses; then the seven-step walk placed against the hull (on
 *               it, above it, dominated and by what, its excess compute at the same latency,
 *               out of order). JSON: the walk's `steps`, and `frontier` with a `steps`-shaped
 *               entry plus `configuration` per hull point. The plot: the cloud of feasible
 *               configurations (thinned to one per 1/100 decade cell so the SVG stays small),
 *               the hull, the walk and the knee.
 *   --jump      the frontier and the walk before and after the jumps, and for each old walk
 *               step and old hull point, the compute the new frontier needs for the same
 *               latency. The plot: both hulls and both walks.
 *
 * Everything here is simulated on the roofline (cost/), and says so.
 */
#include "cli.h"
#include "plan_cli.h"
#include "plan_plot.h"

#include "isokv/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIMULATED "isokv roofline (simulated, not measured)"

cJSON *plan_step_json(const ikv_plan_step *s, int first) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", s->step);
    cJSON_AddStringToObject(j, "name", s->name);
    cJSON_AddStringToObject(j, "config", s->config);
    cJSON_AddNumberToObject(j, "gpus", s->gpus);
    cJSON_AddBoolToObject(j, "fits", s->fits);
    cJSON_AddNumberToObject(j, "compute_gpu_s", s->compute_gpu_s);
    cJSON_AddNumberToObject(j, "flops", s->flops);
    cJSON_AddNumberToObject(j, "ttft_ms", s->ttft_s * 1e3);
    cJSON_AddNumberToObject(j, "tpot_ms", s->tpot_s * 1e3);
    cJSON_AddNumberToObject(j, "rounds", s->rounds);
    cJSON_AddNumberToObject(j, "latency_ms", s->latency_s * 1e3);
    cJSON_AddNumberToObject(j, "delta_compute_gpu_s", s->d_compute);
    cJSON_AddNumberToObject(j, "delta_latency_ms", s->d_latency * 1e3);
    if (first || isnan(s->mrts))
        cJSON_AddNullToObject(j, "mrts");
    else
        cJSON_AddNumberToObject(j, "mrts", s->mrts);
    cJSON_AddNumberToObject(j, "marginal_utility", s->d_utility);
    return j;
}

cJSON *plan_config_json(const ikv_plan_config *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "fused_kernels", c->kernels);
    cJSON_AddNumberToObject(j, "tp", c->tp);
    cJSON_AddNumberToObject(j, "nodes", c->nodes);
    cJSON_AddNumberToObject(j, "draft_tokens", c->gamma);
    cJSON_AddNumberToObject(j, "branches", c->branches);
    cJSON_AddNumberToObject(j, "copies", c->copies);
    cJSON_AddNumberToObject(j, "batch", c->batch);
    cJSON_AddBoolToObject(j, "poll", c->poll);
    return j;
}

static void fmt_num(char *b, size_t cap, double v) {
    if (isnan(v))
        snprintf(b, cap, "n/a");
    else
        snprintf(b, cap, "%.3g", v);
}

static void print_hull(const ikv_plan_frontier *f) {
    printf("%-5s %-8s %-48s %4s %9s %9s %8s %9s %10s\n", "point", "level", "configuration", "GPUs",
           "C GPU-s", "L ms", "TTFT ms", "MRTS", "dU $");
    for (size_t i = 0; i < f->n_hull; i++) {
        const ikv_plan_step *s = &f->hull[i];
        char mr[32];
        fmt_num(mr, sizeof mr, i ? s->mrts : NAN);
        printf("%-5zu %d %-6s %-48s %4u %9.3f %9.1f %8.1f %9s %+10.5f%s\n", i, s->step, s->name,
               s->config, s->gpus, s->compute_gpu_s, s->latency_s * 1e3, s->ttft_s * 1e3, mr,
               s->d_utility, (int)i == f->knee ? "  <- knee" : "");
    }
}

static void print_knee(const ikv_plan_params *p, const ikv_plan_frontier *f) {
    const ikv_plan_step *k = &f->hull[f->knee];
    printf("knee: point %d (%s), %.1f ms for %.3f GPU-s: ", f->knee, k->config, k->latency_s * 1e3,
           k->compute_gpu_s);
    if (p->n_util)
        printf("the highest cumulative utility on the curve of %zu points (where the segment "
               "MRTS crosses the utility curve's slope / price)\n",
               p->n_util);
    else
        printf("the segment MRTS crosses value/price = %.3g GPU-s per second saved\n",
               f->mrts_threshold);
}

/* One cell per 1/100 decade in (log L, log C): a thinned cloud for the plot. */
typedef struct cell {
    long key;
    size_t i;
} cell;
static int cmp_cell(const void *a, const void *b) {
    const cell *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* Writes the feasible cloud, one point per cell, into x/y (allocated, n returned). */
static size_t thin_cloud(const ikv_plan_frontier *f, double **xo, double **yo) {
    cell *c = ikv_malloc((f->n_cloud + 1) * sizeof *c);
    double *x = ikv_malloc((f->n_cloud + 1) * sizeof *x),
           *y = ikv_malloc((f->n_cloud + 1) * sizeof *y);
    size_t n = 0, m = 0;
    if (!c || !x || !y) {
        ikv_free(c), ikv_free(x), ikv_free(y);
        *xo = *yo = NULL;
        return 0;
    }
    for (size_t i = 0; i < f->n_cloud; i++) {
        const ikv_plan_cloud_pt *q = &f->cloud[i];
        if (!q->feasible) continue;
        long a = lround(100 * log10(q->latency_s)), b = lround(100 * log10(q->compute_gpu_s));
        c[n].key = a * 100000 + b;
        c[n++].i = i;
    }
    qsort(c, n, sizeof *c, cmp_cell);
    for (size_t i = 0; i < n; i++)
        if (i == 0 || c[i].key != c[i - 1].key) {
            x[m] = f->cloud[c[i].i].latency_s * 1e3;
            y[m++] = f->cloud[c[i].i].compute_gpu_s;
        }
    ikv_free(c);
    *xo = x;
    *yo = y;
    return m;
}

/* Hull, walk and knee series of one scenario into caller arrays (n_hull and 8 entries). */
static void series_xy(const ikv_plan_frontier *f, const ikv_plan_result *w, double *hx, double *hy,
                      double *wx, double *wy) {
    for (size_t i = 0; i < f->n_hull; i++) {
        hx[i] = f->hull[i].latency_s * 1e3;
        hy[i] = f->hull[i].compute_gpu_s;
    }
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        wx[k] = w->steps[k].latency_s * 1e3;
        wy[k] = w->steps[k].compute_gpu_s;
    }
}

static int frontier_plot(const char *cmd, const char *out, const ikv_plan_frontier *f,
                         const ikv_plan_result *w) {
    double *cx, *cy;
    size_t nc = thin_cloud(f, &cx, &cy);
    double *hx = ikv_malloc((f->n_hull + 1) * sizeof *hx);
    double *hy = ikv_malloc((f->n_hull + 1) * sizeof *hy);
    if (!cx || !hx || !hy) {
        ikv_free(cx), ikv_free(cy), ikv_free(hx), ikv_free(hy);
        return cli_fail(cmd, "out of memory");
    }
    double wx[IKV_PLAN_STEPS], wy[IKV_PLAN_STEPS];
    series_xy(f, w, hx, hy, wx, wy);
    char lab[IKV_PLAN_STEPS][32];
    const char *labels[IKV_PLAN_STEPS];
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        snprintf(lab[k], sizeof lab[k], "%d %s", k, w->steps[k].name);
        labels[k] = lab[k];
    }
    double kx = hx[f->knee], ky = hy[f->knee];
    plan_series s[] = {
        {"feasible configurations", "points pt 7 ps 0.2 lc rgb '#c8c8c8'", nc, cx, cy, NULL},
        {"efficient frontier (lower convex hull)", "linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c'",
         f->n_hull, hx, hy, NULL},
        {"seven-step walk", "linespoints lw 1.5 pt 5 ps 1 lc rgb '#1f77b4'", IKV_PLAN_STEPS, wx, wy,
         NULL},
        {NULL, "labels offset char 1,1 left font ',9'", IKV_PLAN_STEPS, wx, wy, labels},
        {"knee of the frontier", "points pt 6 ps 3 lw 2 lc rgb '#d62728'", 1, &kx, &ky, NULL},
    };
    char title[256];
    snprintf(title, sizeof title, "%s on %s: configuration space, frontier and walk (simulated)",
             w->model->name, w->hw->name);
    int rc = plan_plot(cmd, out, title, "expected latency L per request (ms)",
                       "compute C (GPU-seconds per request)", s, sizeof s / sizeof s[0]);
    ikv_free(cx), ikv_free(cy), ikv_free(hx), ikv_free(hy);
    return rc;
}

static cJSON *frontier_json(const ikv_plan_params *p, const ikv_plan_frontier *f,
                            const ikv_plan_result *w) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "cost_model", SIMULATED);
    cJSON_AddStringToObject(o, "model", w->model->name);
    cJSON_AddStringToObject(o, "hw", w->hw->name);
    cJSON *sc = cJSON_AddObjectToObject(o, "scenario");
    cJSON_AddNumberToObject(sc, "prompt", p->prompt);
    cJSON_AddNumberToObject(sc, "output", p->output);
    cJSON_AddNumberToObject(sc, "batch", p->batch);
    cJSON_AddNumberToObject(sc, "prefix_hit", p->prefix_hit);
    cJSON_AddNumberToObject(sc, "price_gpu_hour", p->price_gpu_hour);
    cJSON_AddNumberToObject(sc, "value_per_s", p->value_per_s);
    cJSON_AddNumberToObject(o, "base_tp", w->base_tp);
    cJSON_AddNumberToObject(o, "configurations", (double)f->n_cloud);
    cJSON_AddNumberToObject(o, "feasible", (double)f->n_feasible);
    cJSON_AddNumberToObject(o, "non_dominated", (double)f->n_pareto);
    cJSON *st = cJSON_AddArrayToObject(o, "steps");
    for (int k = 0; k < IKV_PLAN_STEPS; k++)
        cJSON_AddItemToArray(st, plan_step_json(&w->steps[k], k == 0));
    cJSON_AddNumberToObject(o, "knee", w->knee);
    cJSON *fr = cJSON_AddArrayToObject(o, "frontier");
    for (size_t i = 0; i < f->n_hull; i++) {
        cJSON *j = plan_step_json(&f->hull[i], i == 0);
        cJSON_AddNumberToObject(j, "point", (double)i);
        cJSON_AddItemToObject(j, "configuration", plan_config_json(&f->hull_cfg[i]));
        cJSON_AddItemToArray(fr, j);
    }
    cJSON_AddNumberToObject(o, "frontier_knee", f->knee);
    if (isfinite(f->mrts_threshold))
        cJSON_AddNumberToObject(o, "mrts_threshold", f->mrts_threshold);
    else
        cJSON_AddNullToObject(o, "mrts_threshold");
    cJSON *wv = cJSON_AddArrayToObject(o, "walk_vs_frontier");
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "step", k);
        cJSON_AddStringToObject(j, "name", w->steps[k].name);
        cJSON_AddStringToObject(j, "where", ikv_plan_where_name(f->walk_where[k]));
        if (isnan(f->walk_excess[k]))
            cJSON_AddNullToObject(j, "excess_compute_gpu_s");
        else
            cJSON_AddNumberToObject(j, "excess_compute_gpu_s", f->walk_excess[k]);
        cJSON_AddBoolToObject(j, "out_of_order", f->walk_out_of_order[k]);
        if (f->walk_dominated_by[k] >= 0) {
            const ikv_plan_cloud_pt *q = &f->cloud[f->walk_dominated_by[k]];
            cJSON *d = cJSON_AddObjectToObject(j, "dominated_by");
            cJSON_AddNumberToObject(d, "compute_gpu_s", q->compute_gpu_s);
            cJSON_AddNumberToObject(d, "latency_ms", q->latency_s * 1e3);
            cJSON_AddItemToObject(d, "configuration", plan_config_json(&q->cfg));
        } else {
            cJSON_AddNullToObject(j, "dominated_by");
        }
        cJSON_AddItemToArray(wv, j);
    }
    return o;
}

static int print_json(const char *cmd, cJSON *o) {
    char *s = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!s) return cli_fail(cmd, "out of memory");
    printf("%s\n", s);
    cJSON_free(s);
    return IKV_EXIT_OK;
}

/* Words for a dominating configuration. */
static void cfg_words(const ikv_plan_config *c, char *b, size_t cap) {
    snprintf(b, cap, "%s TP%u PP%u g=%u n=%u h=%u b=%u%s", c->kernels ? "fused" : "naive", c->tp,
             c->nodes, c->gamma, c->branches, c->copies, c->batch, c->poll ? " poll" : "");
}

static void print_walk_vs(const ikv_plan_frontier *f, const ikv_plan_result *w) {
    printf("\nthe seven-step walk against the frontier (excess: C above the hull at the step's "
           "L):\n");
    printf("%-4s %-8s %9s %9s %9s %-11s %12s %-12s %s\n", "step", "name", "C GPU-s", "L ms", "MRTS",
           "where", "excess GPU-s", "order", "dominated by");
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        const ikv_plan_step *s = &w->steps[k];
        char mr[32], ex[32], dom[160] = "";
        fmt_num(mr, sizeof mr, k ? s->mrts : NAN);
        if (isnan(f->walk_excess[k]))
            snprintf(ex, sizeof ex, "n/a");
        else
            snprintf(ex, sizeof ex, "%.3f", f->walk_excess[k]);
        if (f->walk_dominated_by[k] >= 0) {
            const ikv_plan_cloud_pt *q = &f->cloud[f->walk_dominated_by[k]];
            char cw[128];
            cfg_words(&q->cfg, cw, sizeof cw);
            snprintf(dom, sizeof dom, "%s (%.3f GPU-s, %.1f ms)", cw, q->compute_gpu_s,
                     q->latency_s * 1e3);
        }
        printf("%-4d %-8s %9.3f %9.1f %9s %-11s %12s %-12s %s\n", k, s->name, s->compute_gpu_s,
               s->latency_s * 1e3, mr, ikv_plan_where_name(f->walk_where[k]), ex,
               f->walk_out_of_order[k] ? "OUT OF ORDER" : "", dom);
    }
}

int plan_frontier_main(const char *cmd, const ikv_plan_params *p, const ikv_model_spec *m,
                       const ikv_hw_spec *hw, int json, const char *plot) {
    ikv_plan_result w;
    if (ikv_plan_walk(p, m, hw, &w)) return cli_fail(cmd, "%s", ikv_errdetail());
    ikv_plan_frontier f;
    if (ikv_plan_frontier_build(p, m, hw, 7, &f)) return cli_fail(cmd, "%s", ikv_errdetail());
    int rc = IKV_EXIT_OK;
    if (f.n_hull == 0) {
        ikv_plan_frontier_free(&f);
        return cli_fail(cmd, "no feasible configuration (memory, cap.max_gpus)");
    }
    if (plot) rc = frontier_plot(cmd, plot, &f, &w);
    if (!rc) {
        if (json) {
            rc = print_json(cmd, frontier_json(p, &f, &w));
        } else {
            printf("isokv plan --frontier: %s on %s, prompt %.0f, output %.0f, batch %.0f, "
                   "prefix hit %.2f; price $%.2f/GPU-h\n",
                   m->name, hw->name, p->prompt, p->output, p->batch, p->prefix_hit,
                   p->price_gpu_hour);
            printf("(simulated on the isokv roofline cost model, not measured)\n");
            printf("configurations: %zu evaluated, %zu feasible, %zu not dominated, %zu on the "
                   "lower convex hull (cheapest first; MRTS rises along it)\n\n",
                   f.n_cloud, f.n_feasible, f.n_pareto, f.n_hull);
            print_hull(&f);
            printf("\n");
            print_knee(p, &f);
            print_walk_vs(&f, &w);
            if (plot) printf("plot: %s (and its .png)\n", plot);
        }
    }
    ikv_plan_frontier_free(&f);
    return rc;
}

/* ---- jumps ---- */

/* The compute the same latency costs: the old walk step's own C, the old frontier's and the
 * new frontier's at its latency; the ratio is new frontier / old frontier (the jump alone, not
 * the walk's distance from its frontier). */
static void same_latency(const ikv_plan_frontier *of, const ikv_plan_frontier *nf, double l,
                         double *c_old, double *c_new) {
    *c_old = ikv_plan_frontier_compute_at(of, l);
    *c_new = ikv_plan_frontier_compute_at(nf, l);
}

static void print_jump_rows(const ikv_plan_frontier *nf, const ikv_plan_result *ow,
                            const ikv_plan_frontier *of) {
    printf("\ncompute for the same latency, before and after the jump (GPU-s per request):\n");
    printf("%-14s %9s %10s %14s %14s %8s\n", "old point", "L ms", "walk C", "frontier before",
           "frontier after", "ratio");
    for (int k = 0; k <= IKV_PLAN_STEPS; k++) {
        const ikv_plan_step *s = k < IKV_PLAN_STEPS ? &ow->steps[k] : &of->hull[of->knee];
        double co, cn;
        same_latency(of, nf, s->latency_s, &co, &cn);
        char name[32], wc[32], b[32], a[32], r[32];
        if (k < IKV_PLAN_STEPS) {
            snprintf(name, sizeof name, "step %d %s", k, s->name);
            snprintf(wc, sizeof wc, "%.3f", s->compute_gpu_s);
        } else {
            snprintf(name, sizeof name, "old knee");
            snprintf(wc, sizeof wc, "-");
        }
        fmt_num(b, sizeof b, co);
        fmt_num(a, sizeof a, cn);
        fmt_num(r, sizeof r, cn / co);
        printf("%-14s %9.1f %10s %14s %14s %8s\n", name, s->latency_s * 1e3, wc, b, a, r);
    }
    printf("(ratio: after / before on the frontiers; n/a: the frontier cannot reach that "
           "latency)\n");
}

static cJSON *jump_json(const ikv_plan_params *p, const ikv_plan_params *np,
                        const ikv_plan_jumps *j, const ikv_plan_frontier *of,
                        const ikv_plan_result *ow, const ikv_plan_frontier *nf,
                        const ikv_plan_result *nw) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "cost_model", SIMULATED);
    cJSON *ja = cJSON_AddArrayToObject(o, "jumps");
    for (size_t i = 0; i < j->n; i++) {
        const ikv_plan_jump_info *in = ikv_plan_jump_info_at(j->j[i].kind);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "jump", j->j[i].text);
        cJSON_AddStringToObject(x, "what", in->what);
        cJSON_AddStringToObject(x, "source", in->source);
        cJSON_AddStringToObject(x, "quality", in->quality);
        cJSON_AddItemToArray(ja, x);
    }
    const ikv_plan_result *ws[2] = {ow, nw};
    const ikv_plan_frontier *fs[2] = {of, nf};
    const ikv_plan_params *ps[2] = {p, np};
    const char *names[2] = {"before", "after"};
    for (int v = 0; v < 2; v++) {
        cJSON *b = cJSON_AddObjectToObject(o, names[v]);
        cJSON_AddStringToObject(b, "model", ws[v]->model->name);
        cJSON_AddNumberToObject(b, "base_tp", ws[v]->base_tp);
        cJSON_AddNumberToObject(b, "prefix_hit", ps[v]->prefix_hit);
        cJSON_AddNumberToObject(b, "spec_alpha", ps[v]->spec_alpha);
        cJSON *st = cJSON_AddArrayToObject(b, "steps");
        for (int k = 0; k < IKV_PLAN_STEPS; k++)
            cJSON_AddItemToArray(st, plan_step_json(&ws[v]->steps[k], k == 0));
        cJSON_AddNumberToObject(b, "knee", ws[v]->knee);
        cJSON *fr = cJSON_AddArrayToObject(b, "frontier");
        for (size_t i = 0; i < fs[v]->n_hull; i++) {
            cJSON *x = plan_step_json(&fs[v]->hull[i], i == 0);
            cJSON_AddItemToObject(x, "configuration", plan_config_json(&fs[v]->hull_cfg[i]));
            cJSON_AddItemToArray(fr, x);
        }
        cJSON_AddNumberToObject(b, "frontier_knee", fs[v]->knee);
    }
    cJSON *same = cJSON_AddArrayToObject(o, "same_latency");
    for (int k = 0; k <= IKV_PLAN_STEPS; k++) {
        const ikv_plan_step *s = k < IKV_PLAN_STEPS ? &ow->steps[k] : &of->hull[of->knee];
        double co, cn;
        same_latency(of, nf, s->latency_s, &co, &cn);
        cJSON *x = cJSON_CreateObject();
        if (k < IKV_PLAN_STEPS) {
            cJSON_AddNumberToObject(x, "step", k);
            cJSON_AddNumberToObject(x, "walk_compute_gpu_s", s->compute_gpu_s);
        } else {
            cJSON_AddStringToObject(x, "point", "old frontier knee");
        }
        cJSON_AddNumberToObject(x, "latency_ms", s->latency_s * 1e3);
        if (isnan(co))
            cJSON_AddNullToObject(x, "compute_before_gpu_s");
        else
            cJSON_AddNumberToObject(x, "compute_before_gpu_s", co);
        if (isnan(cn) || isnan(co)) {
            if (isnan(cn))
                cJSON_AddNullToObject(x, "compute_after_gpu_s");
            else
                cJSON_AddNumberToObject(x, "compute_after_gpu_s", cn);
            cJSON_AddNullToObject(x, "ratio");
        } else {
            cJSON_AddNumberToObject(x, "compute_after_gpu_s", cn);
            cJSON_AddNumberToObject(x, "ratio", cn / co);
        }
        cJSON_AddItemToArray(same, x);
    }
    return o;
}

static int jump_plot(const char *cmd, const char *out, const ikv_plan_frontier *of,
                     const ikv_plan_result *ow, const ikv_plan_frontier *nf,
                     const ikv_plan_result *nw) {
    double *ox = ikv_malloc((of->n_hull + 1) * sizeof(double));
    double *oy = ikv_malloc((of->n_hull + 1) * sizeof(double));
    double *nx = ikv_malloc((nf->n_hull + 1) * sizeof(double));
    double *ny = ikv_malloc((nf->n_hull + 1) * sizeof(double));
    if (!ox || !oy || !nx || !ny) {
        ikv_free(ox), ikv_free(oy), ikv_free(nx), ikv_free(ny);
        return cli_fail(cmd, "out of memory");
    }
    double owx[IKV_PLAN_STEPS], owy[IKV_PLAN_STEPS], nwx[IKV_PLAN_STEPS], nwy[IKV_PLAN_STEPS];
    series_xy(of, ow, ox, oy, owx, owy);
    series_xy(nf, nw, nx, ny, nwx, nwy);
    char t_old[160], t_new[300];
    snprintf(t_old, sizeof t_old, "frontier before (%s)", ow->model->name);
    snprintf(t_new, sizeof t_new, "frontier after (%s)", nw->model->name);
    plan_series s[] = {
        {t_old, "linespoints lw 2 pt 7 ps 0.6 lc rgb '#888888'", of->n_hull, ox, oy, NULL},
        {t_new, "linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c'", nf->n_hull, nx, ny, NULL},
        {"walk before", "linespoints dt 2 pt 5 lc rgb '#888888'", IKV_PLAN_STEPS, owx, owy, NULL},
        {"walk after", "linespoints dt 2 pt 5 lc rgb '#1f77b4'", IKV_PLAN_STEPS, nwx, nwy, NULL},
    };
    char title[400];
    snprintf(title, sizeof title, "%s on %s: the isoquant before and after the jump (simulated)",
             nw->model->name, nw->hw->name);
    int rc = plan_plot(cmd, out, title, "expected latency L per request (ms)",
                       "compute C (GPU-seconds per request)", s, sizeof s / sizeof s[0]);
    ikv_free(ox), ikv_free(oy), ikv_free(nx), ikv_free(ny);
    return rc;
}

int plan_jump_main(const char *cmd, const ikv_plan_params *p, const ikv_model_spec *m,
                   const ikv_hw_spec *hw, const ikv_plan_jumps *j, int json, const char *plot) {
    ikv_plan_params np = *p;
    ikv_model_spec nm;
    char name[512];
    if (ikv_plan_jumps_apply(j, m, &np, &nm, name, sizeof name))
        return cli_fail(cmd, "%s", ikv_errdetail());
    ikv_plan_result ow, nw;
    if (ikv_plan_walk(p, m, hw, &ow)) return cli_fail(cmd, "before the jump: %s", ikv_errdetail());
    if (ikv_plan_walk(&np, &nm, hw, &nw))
        return cli_fail(cmd, "after the jump: %s", ikv_errdetail());
    ikv_plan_frontier of, nf;
    if (ikv_plan_frontier_build(p, m, hw, 7, &of)) return cli_fail(cmd, "%s", ikv_errdetail());
    if (ikv_plan_frontier_build(&np, &nm, hw, 7, &nf)) {
        ikv_plan_frontier_free(&of);
        return cli_fail(cmd, "%s", ikv_errdetail());
    }
    int rc = IKV_EXIT_OK;
    if (!of.n_hull || !nf.n_hull)
        rc = cli_fail(cmd, "no feasible configuration %s the jump (memory, cap.max_gpus)",
                      of.n_hull ? "after" : "before");
    if (!rc && plot) rc = jump_plot(cmd, plot, &of, &ow, &nf, &nw);
    if (!rc && json) {
        rc = print_json(cmd, jump_json(p, &np, j, &of, &ow, &nf, &nw));
    } else if (!rc) {
        printf("isokv plan --jump: %s -> %s on %s, prompt %.0f, output %.0f, batch %.0f\n", m->name,
               nm.name, hw->name, p->prompt, p->output, p->batch);
        printf("(simulated on the isokv roofline cost model, not measured)\n");
        for (size_t i = 0; i < j->n; i++) {
            const ikv_plan_jump_info *in = ikv_plan_jump_info_at(j->j[i].kind);
            printf("  %s: %s\n    source: %s\n    quality: %s\n", j->j[i].text, in->what,
                   in->source, in->quality);
        }
        printf("\nbefore: baseline TP%u; frontier of %zu points, knee at %zu\n", ow.base_tp,
               of.n_hull, (size_t)of.knee);
        print_hull(&of);
        printf("\nafter: baseline TP%u; frontier of %zu points, knee at %zu\n", nw.base_tp,
               nf.n_hull, (size_t)nf.knee);
        print_hull(&nf);
        printf("\nthe walk after the jump:\n");
        for (int k = 0; k < IKV_PLAN_STEPS; k++)
            printf("  step %d %-8s %-44s C %9.3f GPU-s  L %9.1f ms (before: %9.3f, %9.1f)\n", k,
                   nw.steps[k].name, nw.steps[k].config, nw.steps[k].compute_gpu_s,
                   nw.steps[k].latency_s * 1e3, ow.steps[k].compute_gpu_s,
                   ow.steps[k].latency_s * 1e3);
        print_jump_rows(&nf, &ow, &of);
        if (plot) printf("plot: %s (and its .png)\n", plot);
    }
    ikv_plan_frontier_free(&of);
    ikv_plan_frontier_free(&nf);
    return rc;
}
