/*
 * `isokv plan --measured`: the compute-latency analysis on isokv's own engine on this
 * machine, wall clock, next to what the roofline predicts for the same configurations.
 *
 * The levers are the engine's real ones:
 *   threads   1 or 2 forward-pass threads (the CPU's tensor parallelism: each thread takes a
 *             fixed share of every matrix product);
 *   prefix    a prefix-cache miss (no_cache: the whole prompt is computed) or a hit of
 *             H x prompt tokens (a first request inserts the prefix; the measured one is a
 *             second tenant's request sharing it as a public prefix, the rest its own);
 *   batch     B requests admitted together, their prompts prefilled in one ikv_engine_step
 *             and their tokens decoded in batched steps (C per request = threads x L / B);
 *   spec      prompt-lookup speculative decoding (ikv_lookup_draft drafts, verified by
 *             ikv_engine_verify, through ikv_respcache_generate), on a miss and on a hit;
 *   response  a response-cache hit: the same prompt was answered before (untimed), so its
 *   cache     prefix is cached and its stored output is verified as a draft in one forward.
 *
 * One request shape (prompt P tokens, then O greedy tokens). Per configuration, best of R
 * repetitions (the machine is shared: other work only slows a run down):
 *   TTFT  wall time of the admission and the one prefill step (of all B prompts)
 *   TPOT  wall time of the generation after it / tokens generated
 *   L     TTFT + O TPOT
 *   C     threads x L / B: CPU-seconds of occupancy per request (the threads the request
 *         holds, shared by its batch, as GPU-seconds are for the modelled walk); the process
 *         CPU time per request is reported too
 * The walk: 1 thread miss -> 2 threads -> lookup speculation -> prefix hit -> response-cache
 * hit; the frontier: Pareto set and lower hull (plan/frontier.c) of every point.
 *
 * Prediction: the engine's own probes (src/model/bench.c via ikv_engine_bench on a tiny model:
 * best sgemm GFLOP/s and read GB/s at 1 and 2 threads) make a CPU "hardware" entry per thread
 * count (peak / threads per "GPU", efficiencies 1: the probes already are achieved rates);
 * the model's shapes, fp32 weights and KV, make the model entry; then the same roofline as
 * the modelled planner: TTFT = B x prefill_time(cached, new), TPOT = decode_time(B, P + O/2);
 * with drafts, the measured number of forward passes each at decode_time(mean rows per pass)
 * (acceptance is a property of the text, not of the hardware, so it is taken as measured).
 * The error of each point is (predicted - measured) / measured.
 */
#include "cli.h"
#include "plan_cli.h"
#include "plan_plot.h"

#include "isokv/base.h"
#include "isokv/cost.h"
#include "isokv/model.h"
#include "isokv/respcache.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXPTS          12
#define CORE_PRICE_HOUR 0.04 /* $ per core-hour: cloud vCPU list prices, $0.02-0.05 */
#define VALUE_PER_S     0.01 /* $ per second saved, as value.per_s */
#define LOOKUP_NGRAM    3    /* lookup drafts: longest n-gram (serve/run --spec default) */
#define LOOKUP_K        2    /* ... draft tokens per verify (the same default) */
#define LOOKUP_MIN      2    /* ... shortest match that drafts (the same default) */

enum { M_PLAIN = 0, M_SPEC, M_RCACHE };

typedef struct mpoint {
    int threads;
    int hit;   /* 0 prefix miss (no_cache), 1 hit of H x prompt */
    int batch; /* sequences prefilled and decoded together */
    int mode;  /* M_PLAIN, M_SPEC (prompt-lookup drafts), M_RCACHE (response-cache hit) */
    char label[64];
    double ttft, tpot, l, c, cpu_s;            /* measured, best of R */
    size_t cached;                             /* prompt tokens taken from the cache */
    size_t n_out, forwards, drafted, accepted; /* generation after the prefill (best run) */
    double p_ttft, p_tpot, p_l, p_c;           /* roofline prediction */
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

static uint32_t argmax_of(const float *lg, uint32_t vocab) {
    uint32_t next = 0;
    for (uint32_t i = 1; i < vocab; i++)
        if (lg[i] > lg[next]) next = i;
    return next;
}

/* Buffers of one measurement: q->batch prompts of P tokens, a warm-up prompt, the history a
 * generation writes after its prompt (P + O). */
typedef struct mbufs {
    uint32_t *pr[8], *warm, *hist;
    ikv_seq *seq[8];
} mbufs;

/* Greedy generation of O tokens after s with drafts from cands (response cache) and, when
 * lookup, prompt lookup; hist holds the prompt. */
static int gen_drafts(ikv_engine *e, ikv_seq *s, uint32_t V, uint32_t O, uint32_t max_draft,
                      const ikv_respcache_hit *cands, size_t nc, int lookup, uint32_t *hist,
                      size_t P, ikv_gen_result *gr) {
    ikv_sampler *sp;
    int rc = ikv_sampler_create(V, 0, 1, 0, &sp);
    if (rc) return rc;
    ikv_gen_options go = {.max_tokens = O,
                          .cands = cands,
                          .n_cands = nc,
                          .lookup_ngram = lookup ? LOOKUP_NGRAM : 0,
                          .lookup_k = LOOKUP_K,
                          .lookup_min = LOOKUP_MIN,
                          .max_draft = max_draft};
    rc = ikv_respcache_generate(e, s, sp, &go, hist, P, gr);
    ikv_sampler_destroy(sp);
    return rc;
}

/* Measures one repetition of point q on e (max_seqs >= batch): the untimed warm-up its
 * configuration needs (a hit: a first tenant inserts the shared prefix; the response cache:
 * the same prompt answered once and its output stored), then, timed, the admission and one
 * batched prefill step of the batch's prompts (TTFT) and the O tokens after them (plain
 * batched decode steps, or ikv_respcache_generate with drafts). Fills the measured fields of
 * *out. */
static int measure(ikv_engine *e, uint32_t max_draft, const mpoint *q, uint32_t P, uint32_t O,
                   uint32_t V, size_t shared, uint64_t seed, mbufs *b, mpoint *out) {
    int rc = 0;
    ikv_respcache *cache = NULL;
    ikv_respcache_hit hits[2];
    size_t nh = 0;
    for (int i = 0; i < q->batch; i++)
        fill_prompt(b->pr[i], P, seed + 7 * (uint64_t)i, V);
    for (int i = 0; q->hit && i < q->batch && !rc; i++) {
        memcpy(b->warm, b->pr[i], sizeof(uint32_t) * shared);
        fill_prompt(b->warm + shared, P - shared, seed + 5 + 7 * (uint64_t)i, V);
        ikv_request w = {.tokens = b->warm, .n = P, .tenant = "warm", .public_tokens = shared};
        ikv_seq *s;
        if (!(rc = ikv_engine_begin(e, &w, &s, NULL))) ikv_engine_end(e, s);
    }
    if (q->mode == M_RCACHE && !rc) {
        ikv_respcache_options ro;
        ikv_respcache_options_default(&ro);
        ro.capacity = 4;
        if ((rc = ikv_respcache_create(&ro, &cache))) return rc;
        ikv_request w = {.tokens = b->pr[0], .n = P, .tenant = "measured", .max_new = O + 8};
        ikv_seq *s;
        ikv_gen_result gr = {0};
        memcpy(b->hist, b->pr[0], sizeof(uint32_t) * P);
        if (!(rc = ikv_engine_begin(e, &w, &s, NULL))) {
            rc = gen_drafts(e, s, V, O, max_draft, NULL, 0, 0, b->hist, P, &gr);
            ikv_engine_end(e, s);
        }
        ikv_respcache_params pa = {.temperature = 0, .top_p = 1};
        if (!rc && gr.n_out)
            rc = ikv_respcache_put(cache, "measured", 0, b->pr[0], P, b->hist + P, gr.n_out, &pa);
        if (!rc) nh = ikv_respcache_lookup(cache, "measured", b->pr[0], P, hits, 2);
    }
    if (rc) {
        ikv_respcache_destroy(cache);
        return rc;
    }
    /* timed */
    const double c0 = cpu_now(), t0 = ikv_now();
    ikv_step_item it[8];
    int admitted = 0;
    ikv_prefill_info info0 = {0};
    for (int i = 0; i < q->batch && !rc; i++) {
        ikv_request r = {.tokens = b->pr[i],
                         .n = P,
                         .tenant = "measured",
                         .public_tokens = q->hit ? shared : 0,
                         .no_cache = !q->hit && q->mode != M_RCACHE,
                         .max_new = O + 8};
        ikv_prefill_info info;
        if ((rc = ikv_engine_admit(e, &r, &b->seq[i], &info))) break;
        if (i == 0) info0 = info;
        admitted++;
        it[i] = (ikv_step_item){.seq = b->seq[i]};
    }
    if (!rc) rc = ikv_engine_step(e, it, (size_t)admitted);
    const double ttft = ikv_now() - t0;
    double dec = 0;
    size_t n_out = O, forwards = O, drafted = 0, accepted = 0;
    if (!rc && q->mode == M_PLAIN) {
        const double t1 = ikv_now();
        for (uint32_t d = 0; d < O && !rc; d++) {
            for (int i = 0; i < q->batch; i++)
                it[i] = (ikv_step_item){.seq = b->seq[i],
                                        .token = argmax_of(ikv_seq_logits(b->seq[i]), V)};
            rc = ikv_engine_step(e, it, (size_t)q->batch);
        }
        dec = ikv_now() - t1;
    } else if (!rc) {
        ikv_gen_result gr;
        memcpy(b->hist, b->pr[0], sizeof(uint32_t) * P);
        rc =
            gen_drafts(e, b->seq[0], V, O, max_draft, hits, nh, q->mode == M_SPEC, b->hist, P, &gr);
        dec = gr.seconds, n_out = gr.n_out, forwards = gr.forwards;
        drafted = gr.lookup_drafted + gr.cache_accepted + gr.cache_rejected;
        accepted = gr.lookup_accepted + gr.cache_accepted;
    }
    const double cpu = cpu_now() - c0;
    for (int i = 0; i < admitted; i++)
        ikv_engine_end(e, b->seq[i]);
    ikv_respcache_destroy(cache);
    if (rc) return rc;
    /* a generation that stopped early (BOS) is scaled to O tokens */
    out->ttft = ttft;
    out->tpot = n_out ? dec / (double)n_out : 0;
    out->l = ttft + O * out->tpot;
    out->c = q->threads * out->l / q->batch;
    out->cpu_s = cpu / q->batch;
    out->cached = info0.cached_tokens;
    out->n_out = n_out, out->forwards = forwards, out->drafted = drafted;
    out->accepted = accepted;
    return 0;
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

/* The configurations measured: per thread count (1, 2), a prefix miss and hit, a batch of
 * B misses (B > 1), prompt-lookup speculation on a miss and a hit (spec), and a response-cache
 * hit (the same prompt answered before: its prefix cached and its output verified as a draft). */
static size_t build_points(uint32_t B, int spec, mpoint *pts) {
    size_t n = 0;
    for (int t = 1; t <= 2; t++) {
        const char *th = t == 1 ? "1 thread" : "2 threads";
        mpoint base = {.threads = t, .batch = 1};
        mpoint v[6];
        size_t k = 0;
        v[k] = base, v[k].hit = 0, v[k].mode = M_PLAIN, k++;
        v[k] = base, v[k].hit = 1, v[k].mode = M_PLAIN, k++;
        if (B > 1) v[k] = base, v[k].batch = (int)B, v[k].mode = M_PLAIN, k++;
        if (spec) {
            v[k] = base, v[k].mode = M_SPEC, k++;
            v[k] = base, v[k].hit = 1, v[k].mode = M_SPEC, k++;
        }
        v[k] = base, v[k].mode = M_RCACHE, k++;
        for (size_t i = 0; i < k; i++) {
            mpoint *q = &pts[n++];
            *q = v[i];
            char bat[32] = "";
            if (q->batch > 1) snprintf(bat, sizeof bat, ", batch %d", q->batch);
            snprintf(q->label, sizeof q->label, "%s, %s%s%s", th,
                     q->mode == M_RCACHE ? "response cache hit"
                     : q->hit            ? "prefix hit"
                                         : "prefix miss",
                     q->mode == M_SPEC ? ", lookup spec" : "", bat);
        }
    }
    return n;
}

/* Index of the point with these levers, or -1. */
static int find_point(const mpoint *pts, size_t n, int threads, int hit, int batch, int mode) {
    for (size_t i = 0; i < n; i++)
        if (pts[i].threads == threads && pts[i].hit == hit && pts[i].batch == batch &&
            pts[i].mode == mode)
            return (int)i;
    return -1;
}

int plan_measured_main(const char *cmd, const plan_measured_opts *o, int json, const char *plot) {
    const char *cfgname = o->engine_config ? o->engine_config : "small";
    uint32_t P = o->prompt ? o->prompt : 384, O = o->output ? o->output : 16;
    uint32_t R = o->repeat ? o->repeat : 2;
    uint32_t B = o->batch ? o->batch : 4;
    const int spec = o->spec >= 0; /* -1: --spec none */
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
    if ((uint64_t)P + O + 8 > (uint64_t)mc->seq_len) {
        int seq_len = (int)mc->seq_len; /* mc lives in the model */
        ikv_model_destroy(model);
        return cli_fail(cmd,
                        "--measured: prompt %u + output %u + 8 exceed the model's seq_len %d "
                        "(use --prompt/--output)",
                        P, O, seq_len);
    }
    if (V < 4) {
        ikv_model_destroy(model);
        return cli_fail(cmd, "--measured: vocabulary of %u tokens is too small", V);
    }

    mpoint pts[MAXPTS];
    const size_t NP = build_points(B, spec, pts);
    /* the engine's own probes, at 1 and 2 threads */
    ikv_progress prog;
    ikv_progress_init(&prog, stderr, "plan --measured", 2 + (uint64_t)NP * R);
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

    mbufs b;
    memset(&b, 0, sizeof b);
    int oom = !(b.warm = ikv_malloc(sizeof(uint32_t) * P)) ||
              !(b.hist = ikv_malloc(sizeof(uint32_t) * ((size_t)P + O)));
    for (uint32_t i = 0; i < B && !oom; i++)
        oom = !(b.pr[i] = ikv_malloc(sizeof(uint32_t) * P));
    if (oom) {
        for (int i = 0; i < 8; i++)
            ikv_free(b.pr[i]);
        ikv_free(b.warm), ikv_free(b.hist);
        ikv_model_destroy(model);
        return cli_fail(cmd, "out of memory");
    }
    size_t shared = (size_t)floor(H * P);
    uint64_t done = 2;
    const uint32_t max_draft = O + 8 < 256 ? O + 8 : 256;
    for (int ti = 0; ti < 2 && !rc; ti++) {
        ikv_engine_options eo;
        ikv_engine_options_default(&eo);
        eo.threads = ti + 1;
        eo.max_seqs = B;
        eo.max_draft = max_draft;
        ikv_engine *e;
        if ((rc = ikv_engine_create(model, &eo, &e))) break;
        for (uint32_t rep = 0; rep < R && !rc; rep++)
            for (size_t i = 0; i < NP && !rc; i++) {
                mpoint *q = &pts[i];
                if (q->threads != ti + 1) continue;
                mpoint m;
                uint64_t seed = 1000 + 100 * (uint64_t)rep + 10 * (uint64_t)i;
                if ((rc = measure(e, max_draft, q, P, O, V, shared, seed, &b, &m))) break;
                if (!q->l || m.l < q->l) {
                    q->ttft = m.ttft, q->tpot = m.tpot, q->l = m.l, q->c = m.c;
                    q->cpu_s = m.cpu_s, q->cached = m.cached, q->n_out = m.n_out;
                    q->forwards = m.forwards, q->drafted = m.drafted, q->accepted = m.accepted;
                }
                ikv_progress_update(&prog, ++done);
            }
        ikv_engine_destroy(e);
    }
    ikv_progress_done(&prog);
    for (int i = 0; i < 8; i++)
        ikv_free(b.pr[i]);
    ikv_free(b.warm), ikv_free(b.hist);
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
    for (size_t i = 0; i < NP; i++) {
        mpoint *q = &pts[i];
        ikv_cost_cfg cc;
        ikv_cost_cfg_init(&cc, &ms, &hw[q->threads - 1]);
        cc.mfu = cc.mbu = 1;
        cc.gpus = (uint32_t)q->threads;
        const uint64_t pc = q->cached, ctx = (uint64_t)P + O / 2;
        q->p_ttft = q->batch * ikv_prefill_time(&cc, pc, P - pc);
        if (q->mode == M_PLAIN || !q->forwards || !q->n_out) {
            q->p_tpot = ikv_decode_time(&cc, (uint32_t)q->batch, ctx);
        } else {
            /* the measured passes, each of its mean rows (a lead and its draft) */
            double rows = (double)(q->forwards + q->drafted) / (double)q->forwards;
            uint32_t r = (uint32_t)ceil(rows);
            q->p_tpot = (double)q->forwards * ikv_decode_time(&cc, r, ctx) / (double)q->n_out;
        }
        q->p_l = q->p_ttft + O * q->p_tpot;
        q->p_c = q->threads * q->p_l / q->batch;
    }

    /* the walk, cumulative where the levers combine: 1 thread miss -> 2 threads -> lookup
     * speculation -> prefix hit -> response-cache hit (the same prompt answered before) */
    int wi[5], nw = 0;
    const char *wn[5];
    wi[nw] = find_point(pts, NP, 1, 0, 1, M_PLAIN), wn[nw++] = "baseline";
    wi[nw] = find_point(pts, NP, 2, 0, 1, M_PLAIN), wn[nw++] = "tp";
    if (spec) wi[nw] = find_point(pts, NP, 2, 0, 1, M_SPEC), wn[nw++] = "spec";
    wi[nw] = find_point(pts, NP, 2, 1, 1, spec ? M_SPEC : M_PLAIN), wn[nw++] = "prefix";
    wi[nw] = find_point(pts, NP, 2, 0, 1, M_RCACHE), wn[nw++] = "response cache";
    ikv_plan_step walk[5], pwalk[5];
    for (int k = 0; k < nw; k++) {
        IKV_ASSERT(wi[k] >= 0);
        step_of(&pts[wi[k]], k, wn[k], &walk[k]);
        mpoint pq = pts[wi[k]];
        pq.ttft = pq.p_ttft, pq.tpot = pq.p_tpot, pq.l = pq.p_l, pq.c = pq.p_c;
        step_of(&pq, k, wn[k], &pwalk[k]);
        if (k) delta(&walk[k], &walk[k - 1]), delta(&pwalk[k], &pwalk[k - 1]);
    }
    /* frontier of the measured and of the predicted points */
    ikv_plan_step hull[2][MAXPTS];
    size_t nh[2], knee[2] = {0, 0};
    for (int v = 0; v < 2; v++) {
        ikv_plan_xy xy[MAXPTS];
        size_t hidx[MAXPTS];
        for (size_t i = 0; i < NP; i++) {
            xy[i].c = v ? pts[i].p_c : pts[i].c;
            xy[i].l = v ? pts[i].p_l : pts[i].l;
            xy[i].id = i;
        }
        size_t k = ikv_plan_pareto(xy, NP);
        nh[v] = ikv_plan_lower_hull(xy, k, hidx);
        for (size_t i = 0; i < nh[v]; i++) {
            mpoint q = pts[xy[hidx[i]].id];
            if (v) q.ttft = q.p_ttft, q.tpot = q.p_tpot, q.l = q.p_l, q.c = q.p_c;
            step_of(&q, (int)xy[hidx[i]].id, pts[xy[hidx[i]].id].label, &hull[v][i]);
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
        double mx[MAXPTS], my[MAXPTS], px[MAXPTS], py[MAXPTS], hx[MAXPTS], hy[MAXPTS];
        const char *labels[MAXPTS];
        for (size_t i = 0; i < NP; i++) {
            mx[i] = pts[i].l * 1e3, my[i] = pts[i].c;
            px[i] = pts[i].p_l * 1e3, py[i] = pts[i].p_c;
            labels[i] = pts[i].label;
        }
        double wx[5], wy[5];
        for (int k = 0; k < nw; k++)
            wx[k] = walk[k].latency_s * 1e3, wy[k] = walk[k].compute_gpu_s;
        for (size_t i = 0; i < nh[0]; i++)
            hx[i] = hull[0][i].latency_s * 1e3, hy[i] = hull[0][i].compute_gpu_s;
        plan_series sr[] = {
            {"measured", "points pt 7 ps 1.5 lc rgb '#1f77b4'", NP, mx, my, NULL},
            {NULL, "labels offset char 1,1 left font ',8'", NP, mx, my, labels},
            {"measured walk", "lines lw 1.5 lc rgb '#1f77b4'", (size_t)nw, wx, wy, NULL},
            {"measured frontier", "linespoints lw 2 dt 2 pt 4 ps 2.5 lc rgb '#2ca02c'", nh[0], hx,
             hy, NULL},
            {"roofline prediction", "points pt 6 ps 1.5 lc rgb '#d62728'", NP, px, py, NULL},
        };
        char title[400];
        snprintf(title, sizeof title,
                 "isokv engine on this machine (%ld cores), %s: prompt %u, output %u (measured)",
                 cores, what, P, O);
        rc = plan_plot(cmd, plot, title, "latency L per request (ms, wall clock)",
                       "compute C (CPU-seconds per request: threads x L / batch)", sr,
                       sizeof sr / sizeof sr[0]);
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
        cJSON_AddNumberToObject(j, "batch", B);
        cJSON_AddStringToObject(j, "spec", spec ? "lookup" : "none");
        cJSON_AddNumberToObject(j, "hit_ratio_asked", H);
        cJSON *pr = cJSON_AddArrayToObject(j, "probes");
        for (int t = 0; t < 2; t++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "threads", t + 1);
            cJSON_AddNumberToObject(x, "sgemm_peak_gflops", br.rows[t].sgemm_peak_gflops);
            cJSON_AddNumberToObject(x, "read_gbs", br.rows[t].read_gbs);
            cJSON_AddItemToArray(pr, x);
        }
        static const char *const modes[] = {"plain", "lookup", "response_cache"};
        cJSON *pa = cJSON_AddArrayToObject(j, "points");
        for (size_t i = 0; i < NP; i++) {
            const mpoint *q = &pts[i];
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "config", q->label);
            cJSON_AddNumberToObject(x, "threads", q->threads);
            cJSON_AddNumberToObject(x, "batch", q->batch);
            cJSON_AddBoolToObject(x, "prefix_hit", q->hit);
            cJSON_AddStringToObject(x, "decode", modes[q->mode]);
            cJSON_AddNumberToObject(x, "cached_tokens", (double)q->cached);
            cJSON_AddNumberToObject(x, "forwards", (double)q->forwards);
            cJSON_AddNumberToObject(x, "draft_tokens", (double)q->drafted);
            cJSON_AddNumberToObject(x, "accepted_tokens", (double)q->accepted);
            cJSON_AddNumberToObject(x, "ttft_ms", q->ttft * 1e3);
            cJSON_AddNumberToObject(x, "tpot_ms", q->tpot * 1e3);
            cJSON_AddNumberToObject(x, "latency_ms", q->l * 1e3);
            cJSON_AddNumberToObject(x, "compute_cpu_s", q->c);
            cJSON_AddNumberToObject(x, "process_cpu_s", q->cpu_s);
            cJSON_AddNumberToObject(x, "predicted_ttft_ms", q->p_ttft * 1e3);
            cJSON_AddNumberToObject(x, "predicted_tpot_ms", q->p_tpot * 1e3);
            cJSON_AddNumberToObject(x, "predicted_latency_ms", q->p_l * 1e3);
            cJSON_AddNumberToObject(x, "predicted_compute_cpu_s", q->p_c);
            cJSON_AddNumberToObject(x, "latency_error", (q->p_l - q->l) / q->l);
            cJSON_AddItemToArray(pa, x);
        }
        cJSON *ws = cJSON_AddArrayToObject(j, "steps");
        for (int k = 0; k < nw; k++)
            cJSON_AddItemToArray(ws, plan_step_json(&walk[k], k == 0));
        cJSON *fr = cJSON_AddArrayToObject(j, "frontier");
        for (size_t i = 0; i < nh[0]; i++)
            cJSON_AddItemToArray(fr, plan_step_json(&hull[0][i], i == 0));
        cJSON_AddNumberToObject(j, "frontier_knee", (double)knee[0]);
        cJSON_AddNumberToObject(j, "mrts_threshold", VALUE_PER_S * 3600 / CORE_PRICE_HOUR);
        cJSON *pf = cJSON_AddArrayToObject(j, "predicted_frontier");
        for (size_t i = 0; i < nh[1]; i++)
            cJSON_AddItemToArray(pf, plan_step_json(&hull[1][i], i == 0));
        char *out = cJSON_Print(j);
        cJSON_Delete(j);
        ikv_model_destroy(model);
        if (!out) return cli_fail(cmd, "out of memory");
        printf("%s\n", out);
        cJSON_free(out);
        return IKV_EXIT_OK;
    }

    printf("isokv plan --measured: isokv's engine on this machine (%ld cores), %s, %llu "
           "parameters, fp32\n",
           cores, what, (unsigned long long)ikv_model_params(mc));
    printf("prompt %u tokens, output %u greedy tokens; measured, wall clock, best of %u; C = "
           "threads x L / batch (CPU-seconds held per request)\n",
           P, O, R);
    printf("probes (src/model/bench.c): sgemm %.1f / %.1f GFLOP/s, read %.1f / %.1f GB/s at 1 / "
           "2 threads\n\n",
           br.rows[0].sgemm_peak_gflops, br.rows[1].sgemm_peak_gflops, br.rows[0].read_gbs,
           br.rows[1].read_gbs);
    printf("%-46s %6s %6s %8s %8s %8s %8s %7s | %8s %8s %8s %7s\n", "configuration", "cached",
           "acc/dr", "TTFT ms", "TPOT ms", "L ms", "C CPU-s", "CPU s", "TTFT prd", "TPOT prd",
           "L pred", "L err");
    for (size_t i = 0; i < NP; i++) {
        const mpoint *q = &pts[i];
        char ad[24] = "-";
        if (q->mode != M_PLAIN) snprintf(ad, sizeof ad, "%zu/%zu", q->accepted, q->drafted);
        printf("%-46s %6zu %6s %8.2f %8.3f %8.1f %8.3f %7.3f | %8.2f %8.3f %8.1f %+6.0f%%\n",
               q->label, q->cached, ad, q->ttft * 1e3, q->tpot * 1e3, q->l * 1e3, q->c, q->cpu_s,
               q->p_ttft * 1e3, q->p_tpot * 1e3, q->p_l * 1e3, 100 * (q->p_l - q->l) / q->l);
    }
    printf("\nmeasured walk (MRTS: CPU-s per second saved):\n");
    for (int k = 0; k < nw; k++) {
        char mr[32];
        if (k && !isnan(walk[k].mrts))
            snprintf(mr, sizeof mr, "%.3g", walk[k].mrts);
        else
            snprintf(mr, sizeof mr, "n/a");
        printf("  %d %-14s %-40s C %8.3f  L %9.1f ms  MRTS %-8s (roofline: C %8.3f  L %9.1f)\n", k,
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
            printf("  %-46s C %8.3f  L %9.1f ms  MRTS %s%s\n", hull[v][i].config,
                   hull[v][i].compute_gpu_s, hull[v][i].latency_s * 1e3, mr,
                   i == knee[v] ? "  <- knee" : "");
        }
    }
    printf("knee: highest cumulative utility at $%.2f per core-hour and $%.2f per second saved "
           "(segment MRTS crossing %.0f CPU-s per s)\n",
           CORE_PRICE_HOUR, VALUE_PER_S, VALUE_PER_S * 3600 / CORE_PRICE_HOUR);
    if (plot) printf("plot: %s (and its .png)\n", plot);
    ikv_model_destroy(model);
    return IKV_EXIT_OK;
}
