/*
 * isokv plan: the compute-latency walk of one request shape, and the router decision.
 *
 *   isokv plan [--model M] [--hw H] [--prompt N] [--output N] [--batch N] [--price $/GPU-h]
 *              [--value $/s] [--utility L:V,...] [--set key=value]... [--config file.json]
 *              [--json] [--plot out.svg] [--params]
 *   isokv plan route --class simple|medium|complex [--slo-ms X] [--budget GPU-s]
 *              [--allow-poll] [--frontier] [same scenario options] [--json]
 *   isokv plan --frontier | --jump J[,J...] | --measured [...]   (plan_views.c, plan_measured.c)
 *
 * The numbers come from plan/ on the cost/ roofline: they are simulated, and every output says
 * so. --plot writes the gnuplot data and script to a temporary directory, runs gnuplot (an
 * argument vector, no shell; user strings escaped by cli_gp_string), and renames the SVG and the
 * PNG next to it into place as one atomic output set (ikv_outset), so a failure never leaves a
 * partial file and a device or other non-regular target is refused.
 */
#include "cli.h"
#include "plan_cli.h"
#include "plan_plot.h"

#include "isokv/base.h"
#include "isokv/cost.h"
#include "isokv/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD       "plan"
#define MAX_CURVE 128

static void usage(FILE *f) {
    char models[256], hws[256];
    ikv_model_names(models, sizeof models);
    ikv_hw_names(hws, sizeof hws);
    fprintf(f,
            "usage: isokv plan [options]              the walk of seven steps, the knee\n"
            "       isokv plan route --class C [opts] the router's decision for one request\n"
            "\n"
            "Walks from a naive baseline through seven cumulative steps that buy latency with\n"
            "compute (1 kernels, 2 tp, 3 spec, 4 pp, 5 search, 6 hedge, 7 poll) and prints, per\n"
            "step, compute C (GPU-seconds per request, FLOPs), latency L (TTFT + output x TPOT,\n"
            "expected), dC, dL, MRTS = dC/(-dL) and the marginal net utility\n"
            "dU = value(-dL) - price x dC; then the knee and the hard cap. All figures are\n"
            "simulated on the isokv roofline cost model (docs/planner.md), not measured.\n"
            "\n"
            "scenario:\n"
            "  --model M         %s (default llama3-70b)\n"
            "  --hw H            %s (default h100)\n"
            "  --prompt N        prompt tokens (default 2048)\n"
            "  --output N        output tokens (default 256)\n"
            "  --batch N         requests sharing a replica's decode steps (default 16)\n"
            "  --price X         compute price, $ per GPU-hour (default 2.5)\n"
            "  --value X         value of latency, $ per second saved (default 0.01)\n"
            "  --utility L:V,..  utility curve instead: $ a request is worth at latency L s\n"
            "  --set KEY=VALUE   any parameter (repeatable); --params lists them\n"
            "  --config FILE     JSON object of parameters ({\"spec\": {\"alpha\": 0.7}}, may\n"
            "                    also give \"model\" and \"hw\"); flags given later override it\n"
            "output:\n"
            "  --json            one JSON object (steps, knee, hard_cap, curve)\n"
            "  --plot OUT.svg    C against L with the steps and the knee (and OUT.png)\n"
            "  --params          list every parameter with its default and source\n"
            "  --frontier        the efficient frontier of the whole configuration space (TP,\n"
            "                    nodes, draft length, branches, copies, batch, polling): its\n"
            "                    lower convex hull with MRTS per segment, the knee, and where\n"
            "                    the seven-step walk leaves it (with --json: `frontier`)\n"
            "  --jump J[,J...]   algorithmic jumps: w8 w4 kv8 kv4 gqa[:kv=N] swa[:w=N]\n"
            "                    draft[:alpha=A][:c=C] prefix:h=H prefix:sim=SIM.json[:run=I];\n"
            "                    the isoquant before and after, and the compute the same\n"
            "                    latency costs after\n"
            "measured (isokv's own engine on this machine, wall clock):\n"
            "  --measured        threads 1/2 x prefix-cache miss/hit, a batch (--batch B, 4),\n"
            "                    prompt-lookup speculation (--spec lookup|none) and a\n"
            "                    response-cache hit: measured walk and frontier, and the\n"
            "                    roofline's prediction from the engine's own sgemm and\n"
            "                    bandwidth probes; --prompt/--output set the request (384, 16)\n"
            "  --engine-model F  a llama2.c checkpoint (default: a generated model)\n"
            "  --engine-config C generated model shape (tiny, stories15m, small, base; small)\n"
            "  --repeat N        measurements per point, best kept (2)\n"
            "  --hit H           prefix hit ratio of the hit configurations (0.875)\n"
            "route:\n"
            "  --class C         simple | medium | complex (required)\n"
            "  --slo-ms X        latency target in ms\n"
            "  --budget X        compute budget, GPU-seconds per request\n"
            "  --allow-poll      allow step 7 (only a complex request may then reach it)\n"
            "  --frontier        route on the frontier of the levers the class may use\n"
            "\n"
            "Exit codes: 0 success, 1 bad input (the --config file: unreadable, malformed, an\n"
            "unknown name or a value out of range in it), 2 usage error (unknown option, a\n"
            "malformed value, or an unknown model, hardware or parameter named by a flag).\n",
            models, hws);
}

typedef struct opts {
    const char *model, *hw, *plot, *jump;
    int json, params, route, allow_poll, have_class, frontier, measured;
    plan_measured_opts mo;
    int prompt_set, output_set, batch_set, spec_set;
    ikv_req_class cls;
    double slo_ms, budget;
} opts;

static int print_params(void) {
    ikv_plan_params d;
    ikv_plan_params_default(&d);
    printf("%-20s %-10s %-22s %s\n", "parameter", "default", "unit", "source");
    for (size_t i = 0; i < ikv_plan_param_count(); i++) {
        const ikv_plan_param_info *in = ikv_plan_param_at(i);
        char def[32];
        if (in->is_string)
            snprintf(def, sizeof def, "%s", d.spec_draft);
        else
            snprintf(def, sizeof def, "%g", in->def);
        printf("%-20s %-10s %-22s %s\n", in->key, def, in->unit, in->source);
    }
    printf("%-20s %-10s %-22s %s\n", "utility", "(none)", "L:V,... s:$",
           "user's utility curve; without it value.per_s is used");
    return IKV_EXIT_OK;
}

/* Pre-scan for --config and --model/--hw inside it, so later flags override the file. */
static int load_config(const char *path, ikv_plan_params *p, opts *o, char *model, char *hw,
                       size_t cap) {
    int rc = ikv_plan_params_load_json(p, path);
    if (rc) return rc;
    /* read model / hw from the file too (the library ignores them) */
    FILE *f = fopen(path, "rb");
    if (!f) return ikv_error(IKV_EIO, "%s: %s", path, strerror(errno));
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf);
    if (root) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "hw");
        if (cJSON_IsString(m)) {
            snprintf(model, cap, "%s", m->valuestring);
            o->model = model;
        }
        if (cJSON_IsString(h)) {
            snprintf(hw, cap, "%s", h->valuestring);
            o->hw = hw;
        }
        cJSON_Delete(root);
    }
    return 0;
}

static void fmt_mrts(char *buf, size_t cap, double v) {
    if (isnan(v))
        snprintf(buf, cap, "n/a");
    else
        snprintf(buf, cap, "%.3g", v);
}

static void print_table(const ikv_plan_params *p, const ikv_plan_result *r) {
    printf("isokv plan: %s on %s, prompt %.0f, output %.0f, batch %.0f; price $%.2f/GPU-h, ",
           r->model->name, r->hw->name, p->prompt, p->output, p->batch, p->price_gpu_hour);
    if (p->n_util)
        printf("utility curve of %zu points\n", p->n_util);
    else
        printf("latency value $%.4g/s\n", p->value_per_s);
    printf(
        "(simulated on the isokv roofline cost model, not measured; baseline holds %u GPU%s)\n\n",
        r->base_tp, r->base_tp > 1 ? "s" : "");
    printf("%-4s %-8s %-47s %4s %9s %9s %8s %7s %9s %9s %9s %9s %10s\n", "step", "name",
           "configuration", "GPUs", "C GPU-s", "FLOPs", "TTFT ms", "TPOT ms", "L ms", "dC GPU-s",
           "dL ms", "MRTS", "dU $");
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        const ikv_plan_step *s = &r->steps[k];
        char mr[32];
        fmt_mrts(mr, sizeof mr, s->mrts);
        printf("%-4d %-8s %-47s %4u %9.3f %9.3g %8.1f %7.2f %9.1f", s->step, s->name, s->config,
               s->gpus, s->compute_gpu_s, s->flops, s->ttft_s * 1e3, s->tpot_s * 1e3,
               s->latency_s * 1e3);
        if (k == 0)
            printf(" %9s %9s %9s %10s", "", "", "", "");
        else
            printf(" %+9.3f %+9.1f %9s %+10.5f", s->d_compute, s->d_latency * 1e3, mr,
                   s->d_utility);
        printf("%s%s\n", s->fits ? "" : "  (does not fit in memory)",
               k == r->knee ? "  <- knee" : "");
    }
    printf("\nknee: step %d (%s), the step of highest cumulative net utility; "
           "hard cap: step %d (%s)\n",
           r->knee, r->steps[r->knee].name, r->hard_cap, r->steps[r->hard_cap].name);
    printf("MRTS is GPU-seconds of compute per second of latency saved; negative means the step "
           "saves both (a free lunch), n/a that it saves no latency.\n");
}

static cJSON *to_json(const ikv_plan_params *p, const ikv_plan_result *r, const ikv_plan_point *pts,
                      size_t npts) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "cost_model", "isokv roofline (simulated, not measured)");
    cJSON_AddStringToObject(o, "model", r->model->name);
    cJSON_AddStringToObject(o, "hw", r->hw->name);
    cJSON *sc = cJSON_AddObjectToObject(o, "scenario");
    cJSON_AddNumberToObject(sc, "prompt", p->prompt);
    cJSON_AddNumberToObject(sc, "output", p->output);
    cJSON_AddNumberToObject(sc, "batch", p->batch);
    cJSON_AddNumberToObject(sc, "price_gpu_hour", p->price_gpu_hour);
    cJSON_AddNumberToObject(sc, "value_per_s", p->value_per_s);
    cJSON_AddNumberToObject(sc, "utility_points", (double)p->n_util);
    cJSON_AddNumberToObject(o, "base_tp", r->base_tp);
    cJSON *steps = cJSON_AddArrayToObject(o, "steps");
    for (int k = 0; k < IKV_PLAN_STEPS; k++)
        cJSON_AddItemToArray(steps, plan_step_json(&r->steps[k], k == 0));
    cJSON_AddNumberToObject(o, "knee", r->knee);
    cJSON_AddNumberToObject(o, "hard_cap", r->hard_cap);
    cJSON *cv = cJSON_AddArrayToObject(o, "curve");
    for (size_t i = 0; i < npts; i++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "step", pts[i].step);
        cJSON_AddStringToObject(j, "label", pts[i].label);
        cJSON_AddNumberToObject(j, "compute_gpu_s", pts[i].compute_gpu_s);
        cJSON_AddNumberToObject(j, "latency_ms", pts[i].latency_s * 1e3);
        cJSON_AddItemToArray(cv, j);
    }
    return o;
}

static int plot(const char *out, const ikv_plan_result *r, const ikv_plan_point *pts, size_t npts) {
    double cx[MAX_CURVE], cy[MAX_CURVE], sx[IKV_PLAN_STEPS], sy[IKV_PLAN_STEPS], kx, ky;
    char lab[IKV_PLAN_STEPS][48];
    const char *labels[IKV_PLAN_STEPS];
    for (size_t i = 0; i < npts; i++) {
        cx[i] = pts[i].latency_s * 1e3;
        cy[i] = pts[i].compute_gpu_s;
    }
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        sx[k] = r->steps[k].latency_s * 1e3;
        sy[k] = r->steps[k].compute_gpu_s;
        snprintf(lab[k], sizeof lab[k], "%d %s", k, r->steps[k].name);
        labels[k] = lab[k];
    }
    kx = sx[r->knee];
    ky = sy[r->knee];
    plan_series s[] = {
        {"walk, parameters swept", "linespoints lc rgb '#888888' pt 1", npts, cx, cy, NULL},
        {"steps", "points pt 7 ps 1.3 lc rgb '#1f77b4'", IKV_PLAN_STEPS, sx, sy, NULL},
        {NULL, "labels offset char 1,1 left font ',9'", IKV_PLAN_STEPS, sx, sy, labels},
        {"knee", "points pt 6 ps 3 lw 2 lc rgb '#d62728'", 1, &kx, &ky, NULL},
    };
    char title[256];
    snprintf(title, sizeof title,
             "%s on %s: compute vs latency along the walk (simulated, isokv roofline model)",
             r->model->name, r->hw->name);
    return plan_plot(CMD, out, title, "expected latency L per request (ms)",
                     "compute C (GPU-seconds per request)", s, sizeof s / sizeof s[0]);
}

static int parse_num_flag(const char *flag, const char *v, double *out) {
    if (cli_parse_double(v, out))
        return cli_usage_error(CMD, "%s needs a number, got '%s'", flag, v);
    return 0;
}

/* plan route --frontier: the frontier of the levers the class may use, and the router on it. */
static int route_frontier(const ikv_plan_params *p, const ikv_model_spec *m, const ikv_hw_spec *hw,
                          const opts *o) {
    ikv_route_req req = {.cls = o->cls,
                         .slo_s = o->slo_ms * 1e-3,
                         .budget_gpu_s = o->budget,
                         .allow_poll = o->allow_poll};
    ikv_plan_frontier f;
    if (ikv_plan_frontier_build(p, m, hw, ikv_plan_class_cap(p, &req), &f))
        return cli_fail(CMD, "%s", ikv_errdetail());
    ikv_route_decision d;
    if (ikv_plan_route_frontier(p, &f, &req, &d)) {
        ikv_plan_frontier_free(&f);
        return cli_fail(CMD, "%s", ikv_errdetail());
    }
    const ikv_plan_step *s = &f.hull[d.point];
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "cost_model", "isokv roofline (simulated, not measured)");
        cJSON_AddStringToObject(j, "model", m->name);
        cJSON_AddStringToObject(j, "hw", hw->name);
        cJSON_AddStringToObject(j, "class", ikv_req_class_name(o->cls));
        cJSON_AddStringToObject(j, "router", "frontier");
        if (o->slo_ms > 0)
            cJSON_AddNumberToObject(j, "slo_ms", o->slo_ms);
        else
            cJSON_AddNullToObject(j, "slo_ms");
        cJSON_AddNumberToObject(j, "point", d.point);
        cJSON_AddNumberToObject(j, "step", d.step);
        cJSON_AddStringToObject(j, "step_name", s->name);
        cJSON_AddStringToObject(j, "config", s->config);
        cJSON_AddItemToObject(j, "configuration", plan_config_json(&f.hull_cfg[d.point]));
        cJSON_AddNumberToObject(j, "class_cap", d.class_cap);
        cJSON_AddNumberToObject(j, "knee", d.knee);
        cJSON_AddNumberToObject(j, "budget_cap", d.budget_cap);
        cJSON_AddNumberToObject(j, "frontier_points", (double)f.n_hull);
        cJSON_AddBoolToObject(j, "slo_met", d.slo_met);
        cJSON_AddNumberToObject(j, "latency_ms", s->latency_s * 1e3);
        cJSON_AddNumberToObject(j, "compute_gpu_s", s->compute_gpu_s);
        cJSON_AddStringToObject(j, "why", d.why);
        char *t = cJSON_Print(j);
        cJSON_Delete(j);
        ikv_plan_frontier_free(&f);
        if (!t) return cli_fail(CMD, "out of memory");
        printf("%s\n", t);
        cJSON_free(t);
        return IKV_EXIT_OK;
    }
    printf("isokv plan route --frontier: %s request, %s on %s -> frontier point %d (levers up to "
           "step %d, %s): %s\n",
           ikv_req_class_name(o->cls), m->name, hw->name, d.point, d.step, s->name, s->config);
    printf("  simulated latency %.1f ms, compute %.3f GPU-s per request (isokv roofline "
           "model)%s\n",
           s->latency_s * 1e3, s->compute_gpu_s, d.slo_met ? "" : "; SLO NOT met");
    printf("  why: %s\n", d.why);
    ikv_plan_frontier_free(&f);
    return IKV_EXIT_OK;
}

int ikv_cmd_plan(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return IKV_EXIT_OK;
    }
    opts o = {.model = "llama3-70b", .hw = "h100"};
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    int i = 1;
    if (argc > 1 && !strcmp(argv[1], "route")) {
        o.route = 1;
        i = 2;
    }
    /* the config file first, so that flags override it wherever they appear */
    static char cmodel[64], chw[64];
    for (int j = i; j < argc - 1; j++)
        if (!strcmp(argv[j], "--config")) {
            if (load_config(argv[j + 1], &p, &o, cmodel, chw, sizeof cmodel))
                return cli_fail(CMD, "%s", ikv_errdetail());
        }
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        /* flags that map to a parameter key */
        const char *key = !strcmp(a, "--prompt")    ? "prompt"
                          : !strcmp(a, "--output")  ? "output"
                          : !strcmp(a, "--batch")   ? "batch"
                          : !strcmp(a, "--price")   ? "price.gpu_hour"
                          : !strcmp(a, "--value")   ? "value.per_s"
                          : !strcmp(a, "--utility") ? "utility"
                                                    : NULL;
        if (key) {
            if (!v) return cli_usage_error(CMD, "%s needs a value", a);
            o.prompt_set |= !strcmp(key, "prompt");
            o.output_set |= !strcmp(key, "output");
            o.batch_set |= !strcmp(key, "batch");
            if (ikv_plan_param_set(&p, key, v))
                return cli_usage_error(CMD, "%s: %s", a, ikv_errdetail());
            i++;
        } else if (!strcmp(a, "--set")) {
            if (!v) return cli_usage_error(CMD, "--set needs KEY=VALUE");
            char kbuf[128];
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof kbuf)
                return cli_usage_error(CMD, "--set needs KEY=VALUE, got '%s'", v);
            memcpy(kbuf, v, (size_t)(eq - v));
            kbuf[eq - v] = '\0';
            if (ikv_plan_param_set(&p, kbuf, eq + 1))
                return cli_usage_error(CMD, "--set: %s", ikv_errdetail());
            i++;
        } else if (!strcmp(a, "--config")) {
            if (!v) return cli_usage_error(CMD, "--config needs a file");
            i++;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--hw") || !strcmp(a, "--plot")) {
            if (!v) return cli_usage_error(CMD, "%s needs a value", a);
            if (!strcmp(a, "--model"))
                o.model = v;
            else if (!strcmp(a, "--hw"))
                o.hw = v;
            else
                o.plot = v;
            i++;
        } else if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--frontier")) {
            o.frontier = 1;
        } else if (!o.route && !strcmp(a, "--jump")) {
            if (!v) return cli_usage_error(CMD, "--jump needs NAME[,NAME...]");
            o.jump = v;
            i++;
        } else if (!o.route && !strcmp(a, "--measured")) {
            o.measured = 1;
        } else if (!o.route && !strcmp(a, "--spec")) {
            if (!v || (strcmp(v, "lookup") && strcmp(v, "none")))
                return cli_usage_error(CMD, "--spec needs lookup or none");
            o.mo.spec = strcmp(v, "lookup") ? -1 : 0;
            o.spec_set = 1;
            i++;
        } else if (!o.route && (!strcmp(a, "--engine-model") || !strcmp(a, "--engine-config"))) {
            if (!v) return cli_usage_error(CMD, "%s needs a value", a);
            if (!strcmp(a, "--engine-model"))
                o.mo.engine_model = v;
            else
                o.mo.engine_config = v;
            i++;
        } else if (!o.route && (!strcmp(a, "--repeat") || !strcmp(a, "--hit"))) {
            double x;
            if (!v) return cli_usage_error(CMD, "%s needs a number", a);
            int rc = parse_num_flag(a, v, &x);
            if (rc) return rc;
            if (!strcmp(a, "--repeat")) {
                if (x < 1 || x > 100 || x != floor(x))
                    return cli_usage_error(CMD, "--repeat must be a whole number in 1..100");
                o.mo.repeat = (uint32_t)x;
            } else {
                if (!(x > 0 && x < 1)) return cli_usage_error(CMD, "--hit must be in (0, 1)");
                o.mo.hit = x;
            }
            i++;
        } else if (!strcmp(a, "--params")) {
            o.params = 1;
        } else if (o.route && !strcmp(a, "--class")) {
            if (!v) return cli_usage_error(CMD, "--class needs simple, medium or complex");
            if (ikv_req_class_parse(v, &o.cls)) return cli_usage_error(CMD, "%s", ikv_errdetail());
            o.have_class = 1;
            i++;
        } else if (o.route && !strcmp(a, "--slo-ms")) {
            if (!v) return cli_usage_error(CMD, "--slo-ms needs a number");
            int rc = parse_num_flag(a, v, &o.slo_ms);
            if (rc) return rc;
            if (o.slo_ms <= 0) return cli_usage_error(CMD, "--slo-ms must be > 0");
            i++;
        } else if (o.route && !strcmp(a, "--budget")) {
            if (!v) return cli_usage_error(CMD, "--budget needs a number");
            int rc = parse_num_flag(a, v, &o.budget);
            if (rc) return rc;
            if (o.budget <= 0) return cli_usage_error(CMD, "--budget must be > 0");
            i++;
        } else if (o.route && !strcmp(a, "--allow-poll")) {
            o.allow_poll = 1;
        } else {
            return cli_usage_error(CMD, "unknown option '%s'", a);
        }
    }
    if (o.params) return print_params();
    if (o.route && !o.have_class) return cli_usage_error(CMD, "route needs --class");
    if (o.route && o.plot) return cli_usage_error(CMD, "--plot is for the walk, not route");
    if (o.frontier + o.measured + (o.jump != NULL) > 1)
        return cli_usage_error(CMD, "--frontier, --jump and --measured are separate reports");
    if (!o.measured && (o.mo.engine_model || o.mo.engine_config || o.mo.repeat || o.mo.hit ||
                        o.spec_set))
        return cli_usage_error(CMD, "--engine-model, --engine-config, --repeat, --hit and --spec "
                                    "go with --measured");
    if (o.measured) {
        if (o.mo.engine_model && o.mo.engine_config)
            return cli_usage_error(CMD, "--engine-model or --engine-config, not both");
        o.mo.prompt = o.prompt_set ? (uint32_t)p.prompt : 0;
        o.mo.output = o.output_set ? (uint32_t)p.output : 0;
        if (o.batch_set && (p.batch < 1 || p.batch > 8 || p.batch != floor(p.batch)))
            return cli_usage_error(CMD, "--measured: --batch must be a whole number in 1..8");
        o.mo.batch = o.batch_set ? (uint32_t)p.batch : 0;
        return plan_measured_main(CMD, &o.mo, o.json, o.plot);
    }

    const ikv_model_spec *m;
    const ikv_hw_spec *hw;
    /* a name from a flag is a usage error; from the --config file, a bad input */
    if (ikv_model_lookup(o.model, &m))
        return o.model == cmodel ? cli_fail(CMD, "%s: %s", "--config", ikv_errdetail())
                                 : cli_usage_error(CMD, "--model: %s", ikv_errdetail());
    if (ikv_hw_lookup(o.hw, &hw))
        return o.hw == chw ? cli_fail(CMD, "%s: %s", "--config", ikv_errdetail())
                           : cli_usage_error(CMD, "--hw: %s", ikv_errdetail());
    if (o.jump) {
        ikv_plan_jumps js;
        if (ikv_plan_jumps_parse(o.jump, &js))
            return cli_usage_error(CMD, "--jump: %s", ikv_errdetail());
        return plan_jump_main(CMD, &p, m, hw, &js, o.json, o.plot);
    }
    if (o.frontier && !o.route) return plan_frontier_main(CMD, &p, m, hw, o.json, o.plot);
    ikv_plan_result r;
    if (ikv_plan_walk(&p, m, hw, &r)) return cli_fail(CMD, "%s", ikv_errdetail());

    if (o.route && o.frontier) return route_frontier(&p, m, hw, &o);
    if (o.route) {
        ikv_route_req req = {.cls = o.cls,
                             .slo_s = o.slo_ms * 1e-3,
                             .budget_gpu_s = o.budget,
                             .allow_poll = o.allow_poll};
        ikv_route_decision d;
        ikv_plan_route(&p, &r, &req, &d);
        if (o.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "cost_model", "isokv roofline (simulated, not measured)");
            cJSON_AddStringToObject(j, "model", m->name);
            cJSON_AddStringToObject(j, "hw", hw->name);
            cJSON_AddStringToObject(j, "class", ikv_req_class_name(o.cls));
            if (o.slo_ms > 0)
                cJSON_AddNumberToObject(j, "slo_ms", o.slo_ms);
            else
                cJSON_AddNullToObject(j, "slo_ms");
            cJSON_AddNumberToObject(j, "step", d.step);
            cJSON_AddStringToObject(j, "step_name", r.steps[d.step].name);
            cJSON_AddNumberToObject(j, "max_step", d.max_step);
            cJSON_AddNumberToObject(j, "class_cap", d.class_cap);
            cJSON_AddNumberToObject(j, "knee", d.knee);
            cJSON_AddNumberToObject(j, "hard_cap", d.hard_cap);
            cJSON_AddNumberToObject(j, "budget_cap", d.budget_cap);
            cJSON_AddBoolToObject(j, "slo_met", d.slo_met);
            cJSON_AddNumberToObject(j, "latency_ms", r.steps[d.step].latency_s * 1e3);
            cJSON_AddNumberToObject(j, "compute_gpu_s", r.steps[d.step].compute_gpu_s);
            cJSON_AddStringToObject(j, "why", d.why);
            char *s = cJSON_Print(j);
            cJSON_Delete(j);
            if (!s) return cli_fail(CMD, "out of memory");
            printf("%s\n", s);
            cJSON_free(s);
        } else {
            printf("isokv plan route: %s request, %s on %s -> step %d (%s): %s\n",
                   ikv_req_class_name(o.cls), m->name, hw->name, d.step, r.steps[d.step].name,
                   r.steps[d.step].config);
            printf("  simulated latency %.1f ms, compute %.3f GPU-s per request (isokv roofline "
                   "model)%s\n",
                   r.steps[d.step].latency_s * 1e3, r.steps[d.step].compute_gpu_s,
                   d.slo_met ? "" : "; SLO NOT met");
            printf("  why: %s\n", d.why);
        }
        return IKV_EXIT_OK;
    }

    ikv_plan_point pts[MAX_CURVE];
    int np = ikv_plan_curve(&p, m, hw, pts, MAX_CURVE);
    if (np < 0) return cli_fail(CMD, "%s", ikv_errdetail());
    size_t npts = (size_t)np < MAX_CURVE ? (size_t)np : MAX_CURVE;
    if (o.plot) {
        int rc = plot(o.plot, &r, pts, npts);
        if (rc) return rc;
    }
    if (o.json) {
        cJSON *j = to_json(&p, &r, pts, npts);
        char *s = j ? cJSON_Print(j) : NULL;
        cJSON_Delete(j);
        if (!s) return cli_fail(CMD, "out of memory");
        printf("%s\n", s);
        cJSON_free(s);
    } else {
        print_table(&p, &r);
        if (o.plot) printf("plot: %s (and its .png)\n", o.plot);
    }
    return IKV_EXIT_OK;
}
