/*
 * `isokv plan --measured`: the compute-latency analysis on isokv's own engine on this
 * machine, wall clock, next to what the roofline predicts for the same configurations.
 *
 * The levers are the ones the engine has on main today:
 *   threads   1 or 2 forward-pass threads (the CPU's tensor parallelism: each thread takes a
 *             fixed share of every matrix product);
 *   prefix    a prefix-cache miss (no_cache: the whole prompt is computed) or a hit of
 *             H x prompt tokens (a first request inserts the prefix; the measured one is a
 *             second tenant's request sharing it as a public prefix, the rest its own).
 * Not available yet, so not measured: batch size (no batched decode step on main),
 * prompt-lookup speculative decoding and the verified response cache (not on main).
 *
 * One request shape (prompt P tokens, then O greedy decode steps). Per configuration, best of
 * R repetitions (the machine is shared: other work only slows a run down):
 *   TTFT  wall time of ikv_engine_begin (prefill)
 *   TPOT  wall time of the O decode steps / O
 *   L     TTFT + O TPOT
 *   C     threads x L: CPU-seconds of occupancy (the threads the request holds, as GPU-seconds
 *         are for the modelled walk); the process CPU time of the request is reported too
 * The walk: 1 thread miss -> 2 threads miss -> 2 threads hit; the frontier: Pareto set and
 * lower hull (plan/frontier.c) of the four points.
 *
 * Prediction: the engine's own probes (src/model/bench.c via ikv_engine_bench on a tiny model:
 * best sgemm GFLOP/s and read GB/s at 1 and 2 threads) make a CPU "hardware" entry per thread
 * count (peak / threads per "GPU", efficiencies 1: the probes already are achieved rates);
 * the model's shapes, fp32 weights and KV, make the model entry; then the same roofline as
 * the modelled planner: TTFT = prefill_time(cached, new), TPOT = decode_time(batch 1, P + O/2).
 * The error of each point is (predicted - measured) / measured.
 */
#include "cli.h"
#include "plan_cli.h"
#include "plan_plot.h"

#include "isokv/base.h"
#include "isokv/cost.h"
#include "isokv/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NPTS            4
#define CORE_PRICE_HOUR 0.04 /* $ per core-hour: cloud vCPU list prices, $0.02-0.05 */
#define VALUE_PER_S     0.01 /* $ per second saved, as value.per_s */

typedef struct mpoint {
    int threads;
    int hit; /* 0 miss, 1 hit */
    const char *label;
    double ttft, tpot, l, c, cpu_s;  /* measured, best of R */
    size_t cached;                   /* tokens the hit took from the cache */
    double p_ttft, p_tpot, p_l, p_c; /* roofline prediction */
} mpoint;

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fill_prompt(uint32_t *t, size_t n, uint64_t seed, uint32_t vocab) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
        t[i] = 3 + (uint32_t)((seed >> 33) % (vocab - 3));
    }
}

/* Measures one request on e: *ttft, *tpot (s), *cpu (process CPU s), *cached tokens. */
static int measure(ikv_engine *e, const uint32_t *tok, size_t n, size_t pub, int no_cache,
                   uint32_t out, uint32_t vocab, double *ttft, double *tpot, double *cpu,
                   size_t *cached) {
    ikv_request r = {
        .tokens = tok, .n = n, .tenant = "measured", .public_tokens = pub, .no_cache = no_cache};
    ikv_seq *s;
    ikv_prefill_info info;
    double c0 = cpu_now();
    int rc = ikv_engine_begin(e, &r, &s, &info);
    if (rc) return rc;
    const float *lg = ikv_seq_logits(s);
    double t = ikv_now();
    for (uint32_t d = 0; d < out && !rc; d++) {
        uint32_t next = 0;
        for (uint32_t i = 1; i < vocab; i++)
            if (lg[i] > lg[next]) next = i;
        rc = ikv_engine_decode(e, s, next, &lg);
    }
    t = ikv_now() - t;
    *cpu = cpu_now() - c0;
    ikv_engine_end(e, s);
    *ttft = info.seconds;
    *tpot = out ? t / out : 0;
    *cached = info.cached_tokens;
    return rc;
}

/* The cost-model entry of an engine model: its shapes, fp32 weights and KV. */
static void model_spec(const ikv_model_config *c, ikv_model_spec *m) {
    memset(m, 0, sizeof *m);
    m->name = "engine model (fp32)";
    m->layers = (uint32_t)c->n_layers;
    m->hidden = (uint32_t)c->dim;
    m->heads = (uint32_t)c->n_heads;
    m->kv_heads = (uint32_t)c->n_kv_heads;
    m->head_dim = (uint32_t)(c->dim / c->n_heads);
    m->ffn = (uint32_t)c->hidden_dim;
    m->vocab = (uint32_t)c->vocab_size;
    m->tied_embeddings = c->shared_classifier;
    m->params = (double)ikv_model_params(c);
    m->bytes_per_param = 4;
    m->kv_bytes_per_elem = 4;
    m->source = "the engine's checkpoint header";
}

static void step_of(const mpoint *q, int k, const char *name, ikv_plan_step *s) {
    memset(s, 0, sizeof *s);
    s->step = k;
    s->name = name;
    snprintf(s->config, sizeof s->config, "%s", q->label);
    s->gpus = (uint32_t)q->threads;
    s->fits = 1;
    s->compute_gpu_s = q->c;
    s->ttft_s = q->ttft;
    s->tpot_s = q->tpot;
    s->rounds = 1;
    s->latency_s = q->l;
    s->mrts = NAN;
}

/* Fills the d_* fields, MRTS and marginal utility of s against prev. */
static void delta(ikv_plan_step *s, const ikv_plan_step *prev) {
    s->d_compute = s->compute_gpu_s - prev->compute_gpu_s;
    s->d_latency = s->latency_s - prev->latency_s;
    if (-s->d_latency > 0) s->mrts = s->d_compute / -s->d_latency;
    s->d_utility = VALUE_PER_S * -s->d_latency - CORE_PRICE_HOUR / 3600 * s->d_compute;
}

int plan_measured_main(const char *cmd, const plan_measured_opts *o, int json, const char *plot) {
    const char *cfgname = o->engine_config ? o->engine_config : "small";
    uint32_t P = o->prompt ? o->prompt : 384, O = o->output ? o->output : 16;
    uint32_t R = o->repeat ? o->repeat : 2;
    double H = o->hit > 0 ? o->hit : 0.875;
    ikv_model *model = NULL;
    int rc;
    if (o->engine_model) {
        rc = ikv_model_load(o->engine_model, &model);
    } else {
        ikv_model_config mc;
        rc = ikv_model_config_named(cfgname, &mc);
        if (!rc) rc = ikv_model_random(&mc, 1, &model);
    }
    if (rc) return cli_fail(cmd, "--measured: %s", ikv_errdetail());
    const ikv_model_config *mc = ikv_model_cfg(model);
    uint32_t V = (uint32_t)mc->vocab_size;
    if ((uint64_t)P + O > (uint64_t)mc->seq_len) {
        int seq_len = (int)mc->seq_len; /* mc lives in the model */
        ikv_model_destroy(model);
        return cli_fail(cmd,
                        "--measured: prompt %u + output %u exceed the model's seq_len %d (use "
                        "--prompt/--output)",
                        P, O, seq_len);
    }
    if (V < 4) {
        ikv_model_destroy(model);
        return cli_fail(cmd, "--measured: vocabulary of %u tokens is too small", V);
    }

    /* the engine's own probes, at 1 and 2 threads */
    ikv_progress prog;
    ikv_progress_init(&prog, stderr, "plan --measured", 2 + (uint64_t)NPTS * R);
    ikv_engine_bench_options bo = {.config = "tiny",
                                   .prefix = 16,
                                   .suffix = 16,
                                   .decode = 1,
                                   .threads = {1, 2},
                                   .seed = 7,
                                   .repeat = 1};
    ikv_engine_bench_result br;
    if ((rc = ikv_engine_bench(&bo, &br)) || br.n_rows != 2) {
        ikv_model_destroy(model);
        return cli_fail(cmd, "--measured: probes: %s", rc ? ikv_errdetail() : "missing rows");
    }
    ikv_progress_update(&prog, 2);

    mpoint pts[NPTS] = {{.threads = 1, .hit = 0, .label = "1 thread, prefix miss"},
                        {.threads = 2, .hit = 0, .label = "2 threads, prefix miss"},
                        {.threads = 1, .hit = 1, .label = "1 thread, prefix hit"},
                        {.threads = 2, .hit = 1, .label = "2 threads, prefix hit"}};
    uint32_t *a = ikv_malloc(sizeof(uint32_t) * P), *b = ikv_malloc(sizeof(uint32_t) * P);
    if (!a || !b) {
        ikv_free(a), ikv_free(b);
        ikv_model_destroy(model);
        return cli_fail(cmd, "out of memory");
    }
    size_t shared = (size_t)floor(H * P);
    uint64_t done = 2;
    for (int ti = 0; ti < 2 && !rc; ti++) {
        ikv_engine_options eo;
        ikv_engine_options_default(&eo);
        eo.threads = ti + 1;
        ikv_engine *e;
        if ((rc = ikv_engine_create(model, &eo, &e))) break;
        for (uint32_t rep = 0; rep < R && !rc; rep++)
            for (int hi = 0; hi < 2 && !rc; hi++) {
                mpoint *q = &pts[hi * 2 + ti];
                double ttft, tpot, cpu;
                size_t cached;
                uint64_t seed = 1000 + 10 * (uint64_t)rep + (uint64_t)hi;
                fill_prompt(a, P, seed, V);
                if (hi) {
                    /* a first tenant inserts the shared prefix (not timed) */
                    memcpy(b, a, sizeof(uint32_t) * shared);
                    fill_prompt(b + shared, P - shared, seed + 5, V);
                    ikv_request w = {
                        .tokens = b, .n = P, .tenant = "warm", .public_tokens = shared};
                    ikv_seq *s;
                    ikv_prefill_info wi;
                    if ((rc = ikv_engine_begin(e, &w, &s, &wi))) break;
                    ikv_engine_end(e, s);
                }
                rc = measure(e, a, P, hi ? shared : 0, !hi, O, V, &ttft, &tpot, &cpu, &cached);
                if (rc) break;
                double l = ttft + O * tpot;
                if (!q->l || l < q->l) {
                    q->ttft = ttft, q->tpot = tpot, q->l = l, q->cpu_s = cpu, q->cached = cached;
                    q->c = q->threads * l;
                }
                ikv_progress_update(&prog, ++done);
            }
        ikv_engine_destroy(e);
    }
    ikv_progress_done(&prog);
    ikv_free(a), ikv_free(b);
    if (rc) {
        ikv_model_destroy(model);
        return cli_fail(cmd, "--measured: %s", ikv_errdetail());
    }

    /* the roofline's prediction on the probes' CPU entries */
    ikv_model_spec ms;
    model_spec(mc, &ms);
    ikv_hw_spec hw[2];
    for (int t = 0; t < 2; t++) {
        memset(&hw[t], 0, sizeof hw[t]);
        hw[t].name = t ? "this CPU, 2 threads" : "this CPU, 1 thread";
        hw[t].flops = br.rows[t].sgemm_peak_gflops * 1e9 / (t + 1);
        hw[t].hbm_bw = br.rows[t].read_gbs * 1e9 / (t + 1);
        hw[t].hbm_bytes = 1e12;
        hw[t].source = "src/model/bench.c probes, measured now";
    }
    for (int i = 0; i < NPTS; i++) {
        mpoint *q = &pts[i];
        ikv_cost_cfg cc;
        ikv_cost_cfg_init(&cc, &ms, &hw[q->threads - 1]);
        cc.mfu = cc.mbu = 1;
        cc.gpus = (uint32_t)q->threads;
        uint64_t pc = q->hit ? q->cached : 0;
        q->p_ttft = ikv_prefill_time(&cc, pc, P - pc);
        q->p_tpot = ikv_decode_time(&cc, 1, (uint64_t)P + O / 2);
        q->p_l = q->p_ttft + O * q->p_tpot;
        q->p_c = q->threads * q->p_l;
    }

    /* walk: 1 thread miss -> 2 threads miss -> 2 threads hit */
    ikv_plan_step walk[3], pwalk[3];
    const int wi[3] = {0, 1, 3};
    const char *wn[3] = {"baseline", "tp", "prefix"};
    for (int k = 0; k < 3; k++) {
        step_of(&pts[wi[k]], k, wn[k], &walk[k]);
        mpoint pq = pts[wi[k]];
        pq.ttft = pq.p_ttft, pq.tpot = pq.p_tpot, pq.l = pq.p_l, pq.c = pq.p_c;
        step_of(&pq, k, wn[k], &pwalk[k]);
        if (k) delta(&walk[k], &walk[k - 1]), delta(&pwalk[k], &pwalk[k - 1]);
    }
    /* frontier of the measured and of the predicted points */
    ikv_plan_step hull[2][NPTS];
    size_t nh[2], knee[2] = {0, 0};
    for (int v = 0; v < 2; v++) {
        ikv_plan_xy xy[NPTS];
        size_t hidx[NPTS];
        for (int i = 0; i < NPTS; i++) {
            xy[i].c = v ? pts[i].p_c : pts[i].c;
            xy[i].l = v ? pts[i].p_l : pts[i].l;
            xy[i].id = (size_t)i;
        }
        size_t k = ikv_plan_pareto(xy, NPTS);
        nh[v] = ikv_plan_lower_hull(xy, k, hidx);
        for (size_t i = 0; i < nh[v]; i++) {
            mpoint q = pts[xy[hidx[i]].id];
            if (v) q.ttft = q.p_ttft, q.tpot = q.p_tpot, q.l = q.p_l, q.c = q.p_c;
            step_of(&q, (int)xy[hidx[i]].id, q.label, &hull[v][i]);
            if (i) delta(&hull[v][i], &hull[v][i - 1]);
        }
        /* the knee: highest cumulative utility from the cheapest point (ties: the cheaper) */
        double u = 0, best = 0;
        for (size_t i = 1; i < nh[v]; i++) {
            u += hull[v][i].d_utility;
            if (u > best) best = u, knee[v] = i;
        }
    }

    char what[256];
    if (o->engine_model)
        snprintf(what, sizeof what, "%s", o->engine_model);
    else
        snprintf(what, sizeof what, "generated '%s' (random weights)", cfgname);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (plot) {
        double mx[NPTS], my[NPTS], px[NPTS], py[NPTS], hx[NPTS], hy[NPTS];
        const char *labels[NPTS];
        for (int i = 0; i < NPTS; i++) {
            mx[i] = pts[i].l * 1e3, my[i] = pts[i].c;
            px[i] = pts[i].p_l * 1e3, py[i] = pts[i].p_c;
            labels[i] = pts[i].label;
        }
        double wx[3], wy[3];
        for (int k = 0; k < 3; k++)
            wx[k] = walk[k].latency_s * 1e3, wy[k] = walk[k].compute_gpu_s;
        for (size_t i = 0; i < nh[0]; i++)
            hx[i] = hull[0][i].latency_s * 1e3, hy[i] = hull[0][i].compute_gpu_s;
        plan_series s[] = {
            {"measured", "points pt 7 ps 1.5 lc rgb '#1f77b4'", NPTS, mx, my, NULL},
            {NULL, "labels offset char 1,1 left font ',9'", NPTS, mx, my, labels},
            {"measured walk", "lines lw 1.5 lc rgb '#1f77b4'", 3, wx, wy, NULL},
            {"measured frontier", "linespoints lw 2 dt 2 pt 4 ps 2.5 lc rgb '#2ca02c'", nh[0], hx,
             hy, NULL},
            {"roofline prediction", "points pt 6 ps 1.5 lc rgb '#d62728'", NPTS, px, py, NULL},
        };
        char title[400];
        snprintf(title, sizeof title,
                 "isokv engine on this machine (%ld cores), %s: prompt %u, output %u (measured)",
                 cores, what, P, O);
        rc = plan_plot(cmd, plot, title, "latency L per request (ms, wall clock)",
                       "compute C (CPU-seconds per request: threads x L)", s,
                       sizeof s / sizeof s[0]);
        if (rc) {
            ikv_model_destroy(model);
            return rc;
        }
    }

    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "what", "measured, wall clock, on isokv's engine");
        cJSON_AddNumberToObject(j, "cores", (double)cores);
        cJSON_AddStringToObject(j, "engine_model", what);
        cJSON_AddNumberToObject(j, "params", (double)ikv_model_params(mc));
        cJSON_AddNumberToObject(j, "prompt", P);
        cJSON_AddNumberToObject(j, "output", O);
        cJSON_AddNumberToObject(j, "repeat", R);
        cJSON_AddNumberToObject(j, "hit_ratio_asked", H);
        cJSON *pr = cJSON_AddArrayToObject(j, "probes");
        for (int t = 0; t < 2; t++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "threads", t + 1);
            cJSON_AddNumberToObject(x, "sgemm_peak_gflops", br.rows[t].sgemm_peak_gflops);
            cJSON_AddNumberToObject(x, "read_gbs", br.rows[t].read_gbs);
            cJSON_AddItemToArray(pr, x);
        }
        cJSON *pa = cJSON_AddArrayToObject(j, "points");
        for (int i = 0; i < NPTS; i++) {
            const mpoint *q = &pts[i];
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "config", q->label);
            cJSON_AddNumberToObject(x, "threads", q->threads);
            cJSON_AddNumberToObject(x, "cached_tokens", (double)(q->hit ? q->cached : 0));
            cJSON_AddNumberToObject(x, "ttft_ms", q->ttft * 1e3);
            cJSON_AddNumberToObject(x, "tpot_ms", q->tpot * 1e3);
            cJSON_AddNumberToObject(x, "latency_ms", q->l * 1e3);
            cJSON_AddNumberToObject(x, "compute_cpu_s", q->c);
            cJSON_AddNumberToObject(x, "process_cpu_s", q->cpu_s);
            cJSON_AddNumberToObject(x, "predicted_ttft_ms", q->p_ttft * 1e3);
            cJSON_AddNumberToObject(x, "predicted_tpot_ms", q->p_tpot * 1e3);
            cJSON_AddNumberToObject(x, "predicted_latency_ms", q->p_l * 1e3);
            cJSON_AddNumberToObject(x, "latency_error", (q->p_l - q->l) / q->l);
            cJSON_AddItemToArray(pa, x);
        }
        cJSON *ws = cJSON_AddArrayToObject(j, "steps");
        for (int k = 0; k < 3; k++)
            cJSON_AddItemToArray(ws, plan_step_json(&walk[k], k == 0));
        cJSON *fr = cJSON_AddArrayToObject(j, "frontier");
        for (size_t i = 0; i < nh[0]; i++)
            cJSON_AddItemToArray(fr, plan_step_json(&hull[0][i], i == 0));
        cJSON_AddNumberToObject(j, "frontier_knee", (double)knee[0]);
        cJSON_AddNumberToObject(j, "mrts_threshold", VALUE_PER_S * 3600 / CORE_PRICE_HOUR);
        cJSON *pf = cJSON_AddArrayToObject(j, "predicted_frontier");
        for (size_t i = 0; i < nh[1]; i++)
            cJSON_AddItemToArray(pf, plan_step_json(&hull[1][i], i == 0));
        cJSON_AddStringToObject(j, "not_measured",
                                "batch size (no batched step on main), speculative decoding and "
                                "the response cache (not on main)");
        char *s = cJSON_Print(j);
        cJSON_Delete(j);
        ikv_model_destroy(model);
        if (!s) return cli_fail(cmd, "out of memory");
        printf("%s\n", s);
        cJSON_free(s);
        return IKV_EXIT_OK;
    }

    printf("isokv plan --measured: isokv's engine on this machine (%ld cores), %s, %llu "
           "parameters, fp32\n",
           cores, what, (unsigned long long)ikv_model_params(mc));
    printf("prompt %u tokens, output %u greedy tokens; measured, wall clock, best of %u; C = "
           "threads x L (CPU-seconds held)\n",
           P, O, R);
    printf("probes (src/model/bench.c): sgemm %.1f / %.1f GFLOP/s, read %.1f / %.1f GB/s at 1 / "
           "2 threads\n\n",
           br.rows[0].sgemm_peak_gflops, br.rows[1].sgemm_peak_gflops, br.rows[0].read_gbs,
           br.rows[1].read_gbs);
    printf("%-24s %7s %9s %9s %9s %9s %9s | %9s %9s %9s %8s\n", "configuration", "cached",
           "TTFT ms", "TPOT ms", "L ms", "C CPU-s", "CPU s", "TTFT pred", "TPOT pred", "L pred",
           "L error");
    for (int i = 0; i < NPTS; i++) {
        const mpoint *q = &pts[i];
        printf("%-24s %7zu %9.2f %9.3f %9.1f %9.3f %9.3f | %9.2f %9.3f %9.1f %+7.0f%%\n", q->label,
               q->hit ? q->cached : 0, q->ttft * 1e3, q->tpot * 1e3, q->l * 1e3, q->c, q->cpu_s,
               q->p_ttft * 1e3, q->p_tpot * 1e3, q->p_l * 1e3, 100 * (q->p_l - q->l) / q->l);
    }
    printf("\nmeasured walk (MRTS: CPU-s per second saved):\n");
    for (int k = 0; k < 3; k++) {
        char mr[32];
        if (k && !isnan(walk[k].mrts))
            snprintf(mr, sizeof mr, "%.3g", walk[k].mrts);
        else
            snprintf(mr, sizeof mr, "n/a");
        printf("  %d %-9s %-24s C %8.3f  L %9.1f ms  MRTS %-8s (roofline: C %8.3f  L %9.1f)\n", k,
               walk[k].name, walk[k].config, walk[k].compute_gpu_s, walk[k].latency_s * 1e3, mr,
               pwalk[k].compute_gpu_s, pwalk[k].latency_s * 1e3);
    }
    for (int v = 0; v < 2; v++) {
        printf("%s frontier (cheapest first):\n", v ? "roofline's" : "measured");
        for (size_t i = 0; i < nh[v]; i++) {
            char mr[32];
            if (i && !isnan(hull[v][i].mrts))
                snprintf(mr, sizeof mr, "%.3g", hull[v][i].mrts);
            else
                snprintf(mr, sizeof mr, "n/a");
            printf("  %-24s C %8.3f  L %9.1f ms  MRTS %s%s\n", hull[v][i].config,
                   hull[v][i].compute_gpu_s, hull[v][i].latency_s * 1e3, mr,
                   i == knee[v] ? "  <- knee" : "");
        }
    }
    printf("knee: highest cumulative utility at $%.2f per core-hour and $%.2f per second saved "
           "(segment MRTS crossing %.0f CPU-s per s)\n",
           CORE_PRICE_HOUR, VALUE_PER_S, VALUE_PER_S * 3600 / CORE_PRICE_HOUR);
    printf("not measured (not on main yet): batch size, speculative decoding, response cache\n");
    if (plot) printf("plot: %s (and its .png)\n", plot);
    ikv_model_destroy(model);
    return IKV_EXIT_OK;
}
