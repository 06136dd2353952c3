/*
 * The walk along the compute-latency isoquant: seven cumulative configuration changes on the
 * roofline of cost/, each evaluated for compute C and latency L of one request.
 *
 * A configuration (struct state) is: achieved MFU/MBU and host overhead per forward (kernels),
 * KV waste, TP degree t inside a node, pipeline stages s across nodes, speculative decoding
 * (draft length g, acceptance a), search branches n, hedged copies h, dedicated replica with
 * busy polling, batch b (ikv_plan_config: the walk sets them step by step, the frontier freely).
 * Its evaluation, with b = the configuration's batch (1 when dedicated), P = prompt, O = output,
 * ctx = P + O / 2 (mean decode context), W = weight bytes, k = KV bytes per token (a sequence
 * keeps at most the model's attention window of them), h = prefix.hit:
 *
 *   fwd(q seqs, context c, m new tokens each)      one forward pass on t GPUs
 *      = max(F / (peak mfu' t), (W + q (c + m) k) / (bw mbu' t))
 *        + 2 L allreduce(q m d 2 bytes, t) + max(0, overhead - poll)
 *      F = q kv_flops(c, m) + logits;  mfu' = mfu tp_eff^log2(t), likewise mbu'
 *   allreduce(S, t) = launch + 2 (t - 1) hop + 2 (t - 1) / t * S / (nvlink_bw link)  (ring)
 *
 *   TTFT   = fwd(1, hP, (1-h)P) (the cached hP are not recomputed); with s stages and
 *            M = s chunks_per_stage chunks of (1-h)P / M tokens, pipelined:
 *            (M + s - 1) fwd(1, hP + (1-h)P/2, (1-h)P/M) / s + (s - 1) (hop + chunk bytes / net)
 *   TPOT   = fwd(b n, ctx, 1) [+ (s - 1) (hop + b n d 2 / net)]
 *   spec:    TPOT = (g T_draft + fwd(b n, ctx, g + 1)) / E,  E = (1 - a^(g+1)) / (1 - a)
 *            (Leviathan et al. 2023, eq. 1), T_draft = the draft model's fwd on the same GPUs
 *            or c x the target's decode step
 *   rounds   R = 1 / (1 - (1 - q)^n)  (expected rounds of retry-until-verified with n branches
 *            per round, q = pass probability of one branch); later rounds hit the prefix cache
 *            and pay TTFT_c = fwd(1, P, 1)
 *   L      = (TTFT + (R - 1) TTFT_c + R O TPOT) (1 + p_slow^h (slow - 1))
 *   C      = h t s (TTFT + (R - 1) TTFT_c + R O TPOT / b)           GPU-seconds per request
 *   FLOPs  = h (prefill + (R - 1) cached prefill + R O n FLOPs per token incl. rejected drafts)
 *
 * C is occupancy: the GPUs a request holds, for as long as it holds them, divided among the
 * b requests that share its decode steps. On the roofline a memory-bound decode step costs
 * the same whatever it computes, so steps that add FLOPs without adding time (speculative
 * decoding at small batch) can lower C: the walk reports that as a negative MRTS (a free
 * lunch) rather than hiding it. docs/planner.md discusses it.
 */
#include "isokv/base.h"
#include "isokv/plan.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct state {
    double mfu, mbu;   /* before the TP efficiency loss */
    double overhead_s; /* host overhead per forward */
    double kv_waste;
    uint32_t tp, nodes, branches, copies, gamma, batch;
    int kernels, spec, dedicated;
    double poll_s;
} state;

typedef struct eval {
    double c, flops, ttft, tpot, rounds, latency;
    uint32_t gpus;
    int fits;
} eval;

typedef ikv__plan_ctx ctx;

/* Tokens of KV a sequence of `tokens` keeps (the attention window bounds it). */
static double kv_tok(const ikv_model_spec *m, double tokens) {
    return m->attn_window && tokens > m->attn_window ? (double)m->attn_window : tokens;
}

static double tp_factor(const ikv_plan_params *p, uint32_t tp) {
    return pow(p->tp_eff, log2((double)tp));
}

static double allreduce(const ctx *x, double bytes, uint32_t t) {
    if (t <= 1) return 0;
    const ikv_plan_params *p = x->p;
    double g = t;
    return (p->ar_launch_us + 2 * (g - 1) * p->ar_hop_us) * 1e-6 +
           2 * (g - 1) / g * bytes / (x->hw->nvlink_bw * IKV_COST_DEFAULT_LINK);
}

/* One forward pass of model m over q sequences at context c with mnew new tokens each, the
 * logits of `logit_rows` tokens, on st->tp GPUs. Returns seconds; *flops gets its FLOPs. */
static double fwd(const ctx *x, const ikv_model_spec *m, const state *st, double q, double c,
                  double mnew, double logit_rows, double *flops) {
    double f = q * ikv_kv_flops(m, (uint64_t)c, (uint64_t)mnew) +
               logit_rows * 2.0 * m->vocab * (double)m->hidden;
    double bytes = ikv_model_weight_bytes(m) + q * kv_tok(m, c + mnew) * ikv_kv_bytes_per_token(m);
    double k = tp_factor(x->p, st->tp), t = st->tp;
    double tc = f / (x->hw->flops * st->mfu * k * t);
    double tm = bytes / (x->hw->hbm_bw * st->mbu * k * t);
    double ar = 2.0 * m->layers * allreduce(x, q * mnew * m->hidden * 2.0, st->tp);
    double ov = st->overhead_s - st->poll_s;
    if (flops) *flops = f;
    return (tc > tm ? tc : tm) + ar + (ov > 0 ? ov : 0);
}

/* Seconds to hand activations of `tokens` tokens to the next node. */
static double hop(const ctx *x, double tokens) {
    return x->p->pp_hop_us * 1e-6 +
           tokens * x->m->hidden * 2.0 / (x->hw->net_bw * IKV_COST_DEFAULT_LINK);
}

/* Do the weights and the KV of all live sequences fit the GPUs held? */
static int fits(const ctx *x, const state *st) {
    const ikv_plan_params *p = x->p;
    double seqs = (double)st->batch * st->branches;
    double per_seq = kv_tok(x->m, p->prompt + p->output) * ikv_kv_bytes_per_token(x->m);
    double need = ikv_model_weight_bytes(x->m) + seqs * per_seq / (1 - st->kv_waste);
    if (st->spec)
        need += ikv_model_weight_bytes(x->draft) * st->nodes +
                seqs * kv_tok(x->draft, p->prompt + p->output) * ikv_kv_bytes_per_token(x->draft);
    return need <= x->hw->hbm_bytes * p->mem_usable * st->tp * st->nodes;
}

static void evaluate(const ctx *x, const state *st, eval *e) {
    const ikv_plan_params *p = x->p;
    const ikv_model_spec *m = x->m;
    double P = p->prompt, O = p->output, b = st->batch;
    double seqs = b * st->branches, c = P + O / 2, s = st->nodes;
    double f_pre, f_cached, f_tok;
    /* a prefix-cache hit of h: only the last (1 - h) of the prompt is computed */
    double Pc = floor(P * p->prefix_hit), Pn = P - Pc;

    /* prefill, pipelined across stages when s > 1 */
    double ttft = fwd(x, m, st, 1, Pc, Pn, 1, &f_pre);
    if (st->nodes > 1) {
        double M = s * p->pp_chunks, chunk = ceil(Pn / M);
        double t_chunk = fwd(x, m, st, 1, Pc + Pn / 2, chunk, 1, NULL) / s;
        ttft = (M + s - 1) * t_chunk + (s - 1) * hop(x, chunk);
    }
    double ttft_c = fwd(x, m, st, 1, P, 1, 1, &f_cached) + (s - 1) * (s > 1 ? hop(x, 1) : 0);

    /* decode */
    double f_step, tpot;
    double t_step = fwd(x, m, st, seqs, c, 1, seqs, &f_step);
    double pp_hop = s > 1 ? (s - 1) * hop(x, seqs) : 0;
    if (st->spec) {
        double g = st->gamma, a = p->spec_alpha;
        double E = (1 - pow(a, g + 1)) / (1 - a);
        double f_draft = 0, f_ver;
        double t_draft =
            p->spec_c > 0 ? p->spec_c * t_step : fwd(x, x->draft, st, seqs, c, 1, seqs, &f_draft);
        if (p->spec_c > 0) f_draft = ikv_decode_flops(x->draft, 1, (uint64_t)c) * seqs;
        double t_ver = fwd(x, m, st, seqs, c, g + 1, seqs * (g + 1), &f_ver);
        tpot = (g * t_draft + t_ver + pp_hop) / E;
        f_tok = (g * f_draft + f_ver) / seqs / E;
    } else {
        tpot = t_step + pp_hop;
        f_tok = f_step / seqs;
    }

    double q = p->search_pass, n = st->branches;
    double R = 1 / (1 - pow(1 - q, n));
    double h = st->copies;
    double l_nom = ttft + (R - 1) * ttft_c + R * O * tpot;
    e->gpus = st->tp * st->nodes;
    e->ttft = ttft;
    e->tpot = tpot;
    e->rounds = R;
    e->latency = l_nom * (1 + pow(p->hedge_p_slow, h) * (p->hedge_slow_factor - 1));
    e->c = h * e->gpus * (ttft + (R - 1) * ttft_c + R * O * tpot / b);
    e->flops = h * (f_pre + (R - 1) * f_cached + R * O * n * f_tok);
    e->fits = fits(x, st);
}

double ikv_plan_value(const ikv_plan_params *p, double l_old, double l_new) {
    if (p->n_util < 2) return p->value_per_s * (l_old - l_new);
    const double *L = p->util_latency_s, *V = p->util_value;
    size_t n = p->n_util;
    double u[2], ls[2] = {l_old, l_new};
    for (int k = 0; k < 2; k++) {
        double l = ls[k];
        if (l <= L[0])
            u[k] = V[0];
        else if (l >= L[n - 1])
            u[k] = V[n - 1];
        else {
            size_t i = 1;
            while (L[i] < l)
                i++;
            u[k] = V[i - 1] + (V[i] - V[i - 1]) * (l - L[i - 1]) / (L[i] - L[i - 1]);
        }
    }
    return u[1] - u[0];
}

static const char *const step_names[IKV_PLAN_STEPS] = {"baseline", "kernels", "tp",    "spec",
                                                       "pp",       "search",  "hedge", "poll"};

ikv_plan_config ikv_plan_walk_config(const ikv_plan_params *p, uint32_t base_tp, int k) {
    ikv_plan_config c = {
        .tp = base_tp, .nodes = 1, .branches = 1, .copies = 1, .batch = (uint32_t)p->batch};
    if (k >= 1) c.kernels = 1;
    if (k >= 2 && (uint32_t)p->tp_size > c.tp) c.tp = (uint32_t)p->tp_size;
    if (k >= 3) c.gamma = (uint32_t)p->spec_gamma;
    if (k >= 4) c.nodes = (uint32_t)p->pp_nodes;
    if (k >= 5) c.branches = (uint32_t)p->search_branches;
    if (k >= 6) c.copies = (uint32_t)p->hedge_copies;
    if (k >= 7) {
        c.poll = 1;
        c.batch = 1;
    }
    return c;
}

int ikv_plan_config_level(const ikv_plan_params *p, uint32_t base_tp, const ikv_plan_config *c) {
    if (c->poll || c->batch < (uint32_t)p->batch) return 7;
    if (c->copies > 1) return 6;
    if (c->branches > 1) return 5;
    if (c->nodes > 1) return 4;
    if (c->gamma > 0) return 3;
    if (c->tp != base_tp) return 2;
    return c->kernels ? 1 : 0;
}

/* The evaluation state of a configuration: step 0's or step 1's efficiencies, the levers. */
static state state_of(const ikv_plan_params *p, const ikv_plan_config *c) {
    state st = {.mfu = p->base_mfu,
                .mbu = p->base_mbu,
                .overhead_s = p->base_overhead_ms * 1e-3,
                .kv_waste = p->base_kv_waste,
                .tp = c->tp,
                .nodes = c->nodes,
                .branches = c->branches,
                .copies = c->copies,
                .gamma = c->gamma ? c->gamma : (uint32_t)p->spec_gamma,
                .batch = c->batch ? c->batch : 1,
                .spec = c->gamma > 0,
                .dedicated = c->poll};
    if (c->kernels) {
        st.kernels = 1;
        st.mfu = p->k_mfu;
        st.mbu = p->k_mbu;
        st.overhead_s = p->k_overhead_ms * 1e-3;
        st.kv_waste = p->k_kv_waste;
    }
    if (c->poll) {
        st.batch = 1;
        st.poll_s = p->poll_saved_us * 1e-6;
    }
    return st;
}

/* The cumulative state after step k (k = 0: baseline on base_tp GPUs). */
static state state_at(const ikv_plan_params *p, uint32_t base_tp, int k) {
    ikv_plan_config c = ikv_plan_walk_config(p, base_tp, k);
    return state_of(p, &c);
}

static void describe(const ikv_plan_params *p, const state *st, char *buf, size_t cap) {
    size_t len = 0;
#define ADD(...)                                                                                   \
    len += (size_t)snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__)
    ADD("%s TP%u", st->kernels ? "fused" : "naive", st->tp);
    if (st->nodes > 1) ADD("xPP%u", st->nodes);
    if (st->spec) ADD(" spec%u@%.2f", st->gamma, p->spec_alpha);
    if (st->branches > 1) ADD(" n=%u", st->branches);
    if (st->copies > 1) ADD(" h=%u", st->copies);
    if (st->dedicated)
        ADD(" dedicated+poll");
    else if (st->batch != (uint32_t)p->batch)
        ADD(" batch %u", st->batch);
#undef ADD
}

int ikv__plan_setup(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                    ikv__plan_ctx *x) {
    int rc = ikv_plan_params_check(p);
    if (rc) return rc;
    if (!model || !hw) return ikv_error(IKV_EINVAL, "plan: model and hardware are required");
    x->p = p;
    x->m = model;
    x->hw = hw;
    rc = ikv_model_lookup(p->spec_draft, &x->draft);
    if (rc) return rc;
    for (uint32_t t = 1; t <= (uint32_t)p->tp_size; t *= 2) {
        state st = state_at(p, t, 0);
        if (fits(x, &st)) {
            x->base_tp = t;
            return 0;
        }
    }
    double need = ikv_model_weight_bytes(model) + p->batch * (p->prompt + p->output) *
                                                      ikv_kv_bytes_per_token(model) /
                                                      (1 - p->base_kv_waste);
    return ikv_error(IKV_ERANGE,
                     "%s (%.0f GB of weights and KV for batch %.0f) does not fit in %.0f x %s "
                     "(%.0f GB usable)",
                     model->name, need / 1e9, p->batch, p->tp_size, hw->name,
                     hw->hbm_bytes * p->mem_usable * p->tp_size / 1e9);
}

static int setup(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                 ctx *x, uint32_t *base_tp) {
    int rc = ikv__plan_setup(p, model, hw, x);
    *base_tp = x->base_tp;
    return rc;
}

/* Fills the fields of a step that one configuration determines. */
static void fill_step(const ctx *x, const state *st, int k, ikv_plan_step *s) {
    eval e;
    evaluate(x, st, &e);
    memset(s, 0, sizeof *s);
    s->step = k;
    s->name = step_names[k];
    describe(x->p, st, s->config, sizeof s->config);
    s->gpus = e.gpus;
    s->fits = e.fits;
    s->compute_gpu_s = e.c;
    s->flops = e.flops;
    s->ttft_s = e.ttft;
    s->tpot_s = e.tpot;
    s->rounds = e.rounds;
    s->latency_s = e.latency;
    s->mrts = NAN;
}

void ikv__plan_eval(const ikv__plan_ctx *x, const ikv_plan_config *c, ikv_plan_step *out) {
    state st = state_of(x->p, c);
    int level = ikv_plan_config_level(x->p, x->base_tp, c);
    fill_step(x, &st, level, out);
    if (level == 7 && !c->poll) out->name = "batch"; /* step 7's lever without the polling */
}

int ikv_plan_eval(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                  const ikv_plan_config *c, ikv_plan_step *out) {
    ctx x;
    int rc = ikv__plan_setup(p, model, hw, &x);
    if (rc) return rc;
    if (!c->tp || (c->tp & (c->tp - 1)) || !c->nodes || !c->branches || !c->copies || !c->batch)
        return ikv_error(IKV_ERANGE,
                         "plan: configuration with a zero lever or TP %u not a power "
                         "of two",
                         c->tp);
    ikv__plan_eval(&x, c, out);
    return 0;
}

int ikv_plan_walk(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                  ikv_plan_result *out) {
    ctx x;
    uint32_t base_tp;
    int rc = setup(p, model, hw, &x, &base_tp);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    out->model = model;
    out->hw = hw;
    out->base_tp = base_tp;
    double u = 0, best_u = 0;
    int prefix_ok = 1;
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        state st = state_at(p, base_tp, k);
        ikv_plan_step *s = &out->steps[k];
        fill_step(&x, &st, k, s);
        if (k == 0) continue;
        const ikv_plan_step *prev = &out->steps[k - 1];
        s->d_compute = s->compute_gpu_s - prev->compute_gpu_s;
        s->d_latency = s->latency_s - prev->latency_s;
        if (-s->d_latency > 1e-12 * prev->latency_s) s->mrts = s->d_compute / -s->d_latency;
        s->d_utility = ikv_plan_value(p, prev->latency_s, s->latency_s) -
                       p->price_gpu_hour / 3600.0 * s->d_compute;
        u += s->d_utility;
        if (u > best_u) {
            best_u = u;
            out->knee = k;
        }
        /* hard cap: the longest prefix of steps that fit and stay within cap.max_gpus; within
         * it, the last step that still lowers latency */
        if (prefix_ok && (!s->fits || s->gpus > p->cap_max_gpus)) prefix_ok = 0;
        if (prefix_ok && s->d_latency < 0) out->hard_cap = k;
    }
    return 0;
}

int ikv_plan_curve(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                   ikv_plan_point *pts, size_t max) {
    ctx x;
    uint32_t base_tp;
    int rc = setup(p, model, hw, &x, &base_tp);
    if (rc) return rc;
    size_t n = 0;
#define EMIT(stepno, stp, ...)                                                                     \
    do {                                                                                           \
        eval e_;                                                                                   \
        evaluate(&x, stp, &e_);                                                                    \
        if (n < max) {                                                                             \
            pts[n].step = stepno;                                                                  \
            snprintf(pts[n].label, sizeof pts[n].label, __VA_ARGS__);                              \
            pts[n].compute_gpu_s = e_.c;                                                           \
            pts[n].latency_s = e_.latency;                                                         \
        }                                                                                          \
        n++;                                                                                       \
    } while (0)
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        state st = state_at(p, base_tp, k - 1 >= 0 ? k - 1 : 0);
        state fin = state_at(p, base_tp, k);
        switch (k) {
        case 2:
            for (uint32_t t = st.tp * 2; t < fin.tp; t *= 2) {
                st.tp = t;
                EMIT(k, &st, "TP%u", t);
            }
            break;
        case 3:
            st.spec = 1;
            for (uint32_t g = 1; g < fin.gamma; g++) {
                st.gamma = g;
                EMIT(k, &st, "g=%u", g);
            }
            break;
        case 4:
            for (uint32_t s = 2; s < fin.nodes; s++) {
                st.nodes = s;
                EMIT(k, &st, "PP%u", s);
            }
            break;
        case 5:
            for (uint32_t b = 2; b < fin.branches; b++) {
                st.branches = b;
                EMIT(k, &st, "n=%u", b);
            }
            break;
        case 6:
            for (uint32_t h = 2; h < fin.copies; h++) {
                st.copies = h;
                EMIT(k, &st, "h=%u", h);
            }
            break;
        default:
            break;
        }
        EMIT(k, &fin, "%d %s", k, step_names[k]);
    }
#undef EMIT
    return n > (size_t)0x7fffffff ? 0x7fffffff : (int)n;
}
