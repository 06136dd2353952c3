/*
 * isokv plan: the compute-latency isoquant of one request shape, walked in seven steps.
 *
 * Starting from a baseline (naive kernels, the fewest GPUs of one node that hold the model),
 * seven configuration changes are applied cumulatively, each buying latency with compute:
 *
 *   1 kernels  fused attention, paged KV, CUDA graphs: higher achieved MFU/MBU, less overhead
 *   2 tp       tensor parallelism up to tp.size GPUs of the node (all-reduces, efficiency loss)
 *   3 spec     speculative decoding with a draft model (Leviathan et al. 2023)
 *   4 pp       pipeline parallelism across pp.nodes nodes (chunked pipelined prefill, hops)
 *   5 search   search.branches parallel branches of a retry-until-verified task
 *   6 hedge    hedge.copies duplicate requests on independent replicas (Dean & Barroso 2013)
 *   7 poll     dedicated, fully resident replica with busy-polling host threads
 *
 * For each step it gives the compute C (GPU-seconds per request and FLOPs), the expected
 * latency L (TTFT + output x TPOT, times the expected rounds and straggler factor), the
 * differences to the previous step, the marginal rate of technical substitution
 * MRTS = dC / (-dL) in GPU-seconds per second, the marginal net utility
 * dU = value(-dL) - price x dC, the knee and the hard cap. All on the roofline model of
 * cost/ ("simulated", never measured). The formulas and every default with its source are in
 * src/plan/plan.c and docs/planner.md.
 *
 * Beyond the fixed walk (frontier.c, jump.c):
 *   frontier  every combination of the steps' levers (plus batch), the non-dominated ones and
 *             their lower convex hull of C against L, along which MRTS rises; its knee; where
 *             the seven steps leave it; the router on it (ikv_plan_route_frontier);
 *   jumps     changes that move the whole curve (quantized weights or KV, fewer KV heads, an
 *             attention window, a better draft, a prefix-cache hit ratio), as transformations
 *             of the model spec and the parameters.
 *
 * Pure computation, no globals; allocation only in ikv_plan_params_load_json (cJSON), the
 * frontier's cloud and hull, and reading an `isokv sim` file for a prefix jump.
 */
#ifndef ISOKV_PLAN_H
#define ISOKV_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "isokv/cost.h"

#ifdef __cplusplus
extern "C" {
#endif

#define IKV_PLAN_STEPS    8 /* baseline (0) and steps 1..7 */
#define IKV_PLAN_MAX_UTIL 16
#define IKV_PLAN_NAME_MAX 32

/* Every tunable of the walk. Callers own it: fill it with ikv_plan_params_default() and change
 * it through ikv_plan_param_set()/ikv_plan_params_load_json() (which check ranges), or directly.
 * Units are in the field comments; the defaults and their sources are in the parameter table
 * (ikv_plan_param_at) and docs/planner.md. */
typedef struct ikv_plan_params {
    /* the request shape */
    double prompt;     /* prompt tokens (none cached) */
    double output;     /* output tokens */
    double batch;      /* concurrent requests sharing one replica's decode steps */
    double prefix_hit; /* fraction of the prompt found in the prefix cache (0: none) */
    /* baseline (step 0) */
    double base_mfu, base_mbu; /* achieved fractions of peak with naive kernels */
    double base_overhead_ms;   /* host overhead per forward pass (eager launches), ms */
    double base_kv_waste;      /* fraction of reserved KV memory wasted (fragmentation) */
    double mem_usable;         /* fraction of HBM available to weights + KV */
    /* step 1: kernels */
    double k_mfu, k_mbu, k_overhead_ms, k_kv_waste;
    /* step 2: tensor parallelism */
    double tp_size;      /* GPUs of one node, power of two */
    double tp_eff;       /* kept fraction of MFU/MBU per doubling of TP */
    double ar_launch_us; /* fixed cost of one all-reduce, us */
    double ar_hop_us;    /* per-hop latency inside the node, us */
    /* step 3: speculative decoding */
    double spec_alpha; /* acceptance rate of a draft token */
    double spec_gamma; /* draft tokens per target pass */
    double spec_c;     /* draft/target step-time ratio; 0: derive from spec_draft */
    char spec_draft[IKV_PLAN_NAME_MAX]; /* draft model (catalog name) */
    /* step 4: pipeline across nodes */
    double pp_nodes;  /* nodes (pipeline stages), each a TP group of tp_size GPUs */
    double pp_chunks; /* prefill chunks per stage in the pipelined prefill */
    double pp_hop_us; /* inter-node activation hand-off latency, us */
    /* step 5: parallel search */
    double search_branches; /* branches sampled at once */
    double search_pass;     /* probability that one branch's answer passes the verifier */
    /* step 6: hedging */
    double hedge_copies;      /* duplicates on independent replicas */
    double hedge_p_slow;      /* probability a replica straggles */
    double hedge_slow_factor; /* latency multiplier of a straggler */
    /* step 7: residency and busy polling */
    double poll_saved_us; /* wake-up latency saved per forward pass by spinning, us */
    /* economics */
    double price_gpu_hour; /* $ per GPU-hour */
    double value_per_s;    /* $ per second of latency saved (used when no utility curve) */
    size_t n_util;         /* points of the utility curve (0: linear value_per_s) */
    double util_latency_s[IKV_PLAN_MAX_UTIL]; /* increasing latencies, s */
    double util_value[IKV_PLAN_MAX_UTIL];     /* $ a request is worth at that latency */
    /* hard cap and router */
    double cap_max_gpus; /* no step may hold more GPUs per request copy */
    double route_simple, route_medium, route_complex; /* highest step per class */
    /* the configuration space of the frontier: each lever is swept from off to
     * max(its walk value, this bound) */
    double fr_max_nodes, fr_max_gamma, fr_max_branches, fr_max_copies;
} ikv_plan_params;

/* Sets every field to its documented default. */
void ikv_plan_params_default(ikv_plan_params *p);

/* One row of the parameter table (for --help, --params and error messages). */
typedef struct ikv_plan_param_info {
    const char *key;      /* "spec.alpha" */
    int is_string;        /* 1: a catalog name, 0: a number */
    double def, min, max; /* default and accepted range (numbers) */
    int integer;          /* 1: must be a whole number */
    const char *unit;
    const char *source; /* where the default comes from */
} ikv_plan_param_info;

size_t ikv_plan_param_count(void);
const ikv_plan_param_info *ikv_plan_param_at(size_t i);

/* Sets parameter `key` from text. "utility" takes "L1:V1,L2:V2,..." (seconds:$, increasing
 * latencies). Returns 0, IKV_EPARAM for an unknown key or malformed value, IKV_ERANGE for a
 * value outside the range, IKV_EMODEL for an unknown draft model; the detail names the key.
 * On error *p is unchanged. */
int ikv_plan_param_set(ikv_plan_params *p, const char *key, const char *value);

/* Applies a JSON file: one object whose members are parameter keys, either flat
 * ({"spec.alpha": 0.7}) or nested ({"spec": {"alpha": 0.7}}); "utility" is an array of
 * [latency_s, value] pairs; "model", "hw" are ignored here (the CLI reads them). Returns 0,
 * IKV_EIO, IKV_EFORMAT (detail: file and problem), or what ikv_plan_param_set returns. On error
 * *p may be partly updated (the CLI then exits). */
int ikv_plan_params_load_json(ikv_plan_params *p, const char *path);

/* Checks cross-field constraints (utility latencies increasing, tp a power of two...). */
int ikv_plan_params_check(const ikv_plan_params *p);

/* One step of the walk. */
typedef struct ikv_plan_step {
    int step;             /* 0..7 */
    const char *name;     /* "baseline", "kernels", "tp", ... */
    char config[96];      /* the configuration in words, e.g. "TP8 + spec g=4 a=0.80" */
    uint32_t gpus;        /* GPUs held by one copy of the request */
    int fits;             /* weights + KV fit in the GPUs' memory */
    double compute_gpu_s; /* C: GPU-seconds per request */
    double flops;         /* FLOPs per request, wasted ones included */
    double ttft_s;        /* time to first token of the first round */
    double tpot_s;        /* time per output token */
    double rounds;        /* expected sequential rounds (search) */
    double latency_s;     /* L: expected end-to-end latency */
    double d_compute;     /* C - C(previous) */
    double d_latency;     /* L - L(previous) */
    double mrts;          /* d_compute / -d_latency; NAN when -d_latency <= 0 */
    double d_utility;     /* value(-dL) - price * dC, $ per request */
} ikv_plan_step;

typedef struct ikv_plan_result {
    const ikv_model_spec *model;
    const ikv_hw_spec *hw;
    uint32_t base_tp; /* GPUs of the baseline (fewest that hold the model) */
    ikv_plan_step steps[IKV_PLAN_STEPS];
    int knee;     /* step with the highest cumulative utility (ties: the lower) */
    int hard_cap; /* last step of the longest prefix of feasible steps that lower L */
} ikv_plan_result;

/* Walks the seven steps. Returns 0, IKV_ERANGE if the model does not fit in one node even
 * at tp.size GPUs (detail says by how much), or a parameter check error. */
int ikv_plan_walk(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                  ikv_plan_result *out);

/* The continuous curve: the walk with each step's parameter swept (TP 1,2,4,8; draft length
 * 1..gamma; nodes 2..; branches 2..; copies 2..). Writes at most max points; returns the
 * number the curve has (may exceed max), or a negative error as ikv_plan_walk. */
typedef struct ikv_plan_point {
    int step;       /* the step this point belongs to */
    char label[32]; /* e.g. "TP4", "g=2" */
    double compute_gpu_s, latency_s;
} ikv_plan_point;
int ikv_plan_curve(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                   ikv_plan_point *pts, size_t max);

/* ---- the configuration space and its efficient frontier ---- */

/* One point of the configuration space: the levers of the seven steps, each free. */
typedef struct ikv_plan_config {
    uint8_t kernels;   /* 1: fused kernels (step 1's efficiencies), 0: naive (step 0's) */
    uint8_t poll;      /* 1: dedicated replica with busy polling (batch 1 only) */
    uint32_t tp;       /* GPUs of one node per pipeline stage, power of two */
    uint32_t nodes;    /* pipeline stages (nodes) */
    uint32_t gamma;    /* draft tokens per target pass; 0 = no speculative decoding */
    uint32_t branches; /* parallel search branches */
    uint32_t copies;   /* hedged copies */
    uint32_t batch;    /* requests sharing one replica's decode steps */
} ikv_plan_config;

/* The configuration of step k of the walk (baseline on base_tp GPUs). */
ikv_plan_config ikv_plan_walk_config(const ikv_plan_params *p, uint32_t base_tp, int k);

/* The highest walk step whose lever cfg moves away from the baseline (kernels 1, TP 2, spec 3,
 * nodes 4, branches 5, copies 6, polling or a smaller batch 7): the step a router's class cap is
 * compared with. */
int ikv_plan_config_level(const ikv_plan_params *p, uint32_t base_tp, const ikv_plan_config *c);

/* Evaluates one configuration into *out (step = its level, name = that step's name, or "batch"
 * for level 7 reached by a smaller batch without polling; the d_*
 * fields, mrts and d_utility are zero/NAN: they need a previous point). Returns 0 or an error
 * as ikv_plan_walk (the baseline must fit). Does not allocate. */
int ikv_plan_eval(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                  const ikv_plan_config *c, ikv_plan_step *out);

/* A (C, L) point of any origin (modelled or measured) for the hull. id is the caller's. */
typedef struct ikv_plan_xy {
    double c, l;
    size_t id;
} ikv_plan_xy;

/* Reorders pts so that its first k entries are the points no other point dominates (none has
 * C <= and L <= with one of them <), each once (of exact duplicates the first in (L, C) order),
 * sorted by C ascending (so L descending: from the cheapest to the fastest); returns k.
 * O(n log n), in place, does not allocate. */
size_t ikv_plan_pareto(ikv_plan_xy *pts, size_t n);

/* The lower convex hull of C against L of k Pareto points in ikv_plan_pareto's order: writes
 * the indices (into pts) of its vertices to hull[], in the same order (cheapest first), and
 * returns their count. Collinear points are left out, so the MRTS of consecutive segments,
 * (C[i+1] - C[i]) / (L[i] - L[i+1]), strictly rises. hull needs room for k. O(k). */
size_t ikv_plan_lower_hull(const ikv_plan_xy *pts, size_t k, size_t *hull);

/* One configuration of the cloud. */
typedef struct ikv_plan_cloud_pt {
    ikv_plan_config cfg;
    double compute_gpu_s, latency_s;
    uint8_t feasible; /* fits in memory, within cap.max_gpus, level allowed */
    uint8_t pareto;   /* not dominated by any feasible point */
    uint8_t level;    /* ikv_plan_config_level */
} ikv_plan_cloud_pt;

/* Where a step of the seven-step walk stands against the frontier. */
typedef enum ikv_plan_where {
    IKV_PLAN_ON_HULL = 0, /* a vertex of the hull (or on a hull segment) */
    IKV_PLAN_ABOVE_HULL,  /* not dominated, but above the hull (a mix of neighbours beats it) */
    IKV_PLAN_DOMINATED,   /* some configuration is both cheaper and faster (or as good in one) */
    IKV_PLAN_INFEASIBLE   /* does not fit, or holds more than cap.max_gpus */
} ikv_plan_where;
const char *ikv_plan_where_name(ikv_plan_where w);

/* The efficient frontier of one scenario. Callers own the struct (zero it or let
 * ikv_plan_frontier_build fill it) and free it with ikv_plan_frontier_free. */
typedef struct ikv_plan_frontier {
    uint32_t base_tp;
    int max_level;            /* levers of steps above it were not allowed */
    size_t n_cloud;           /* configurations evaluated */
    size_t n_feasible;        /* of which feasible */
    size_t n_pareto;          /* of which not dominated */
    ikv_plan_cloud_pt *cloud; /* [n_cloud], owned */
    size_t n_hull;
    ikv_plan_step *hull;       /* [n_hull]: cheapest first; d_*, mrts and d_utility relative
                                  to the previous hull point; owned */
    ikv_plan_config *hull_cfg; /* [n_hull], owned */
    int knee;                  /* hull index of the highest cumulative utility (ties: lower) */
    double mrts_threshold;     /* value_per_s * 3600 / price (GPU-s per s) the segment MRTS is
                                  compared with when there is no utility curve; INFINITY at
                                  price 0 */
    /* the walk of ikv_plan_walk against the hull (filled when max_level = 7) */
    ikv_plan_where walk_where[IKV_PLAN_STEPS];
    double walk_excess[IKV_PLAN_STEPS];        /* C - hull's C at the step's L, GPU-s; NAN when L is
                                                  below every feasible latency */
    long walk_dominated_by[IKV_PLAN_STEPS];    /* cloud index of a Pareto point that dominates the
                                                  step, -1 if none */
    uint8_t walk_out_of_order[IKV_PLAN_STEPS]; /* its MRTS is below an earlier step's */
} ikv_plan_frontier;

#define IKV_PLAN_MAX_CLOUD 4000000 /* configurations one frontier may evaluate (~200 MB) */

/* Evaluates the whole configuration space (kernels naive/fused; TP 1, 2, .. tp.size; nodes
 * 1..max(pp.nodes, frontier.max_nodes); draft length 0..max(spec.gamma, frontier.max_gamma);
 * branches, copies likewise; batch = batch, batch/2, .., 1; polling at batch 1), keeps the
 * feasible points whose level is at most max_level (7: all; a router class cap otherwise),
 * finds the non-dominated ones, the lower convex hull, the knee and, for max_level 7, where
 * the seven-step walk leaves the hull. Allocates the cloud and hull (through ikv_malloc).
 * Returns 0, IKV_ENOMEM, IKV_ERANGE (more than IKV_PLAN_MAX_CLOUD configurations), or an error
 * as ikv_plan_walk; on error *out holds nothing to free. */
int ikv_plan_frontier_build(const ikv_plan_params *p, const ikv_model_spec *model,
                            const ikv_hw_spec *hw, int max_level, ikv_plan_frontier *out);
void ikv_plan_frontier_free(ikv_plan_frontier *f);

/* The hull's compute at latency l: linear between the hull vertices around l, the cheapest
 * vertex's C when l is slower than it, NAN when l is faster than the fastest vertex. */
double ikv_plan_frontier_compute_at(const ikv_plan_frontier *f, double l);

/* Checks the frontier's invariants: hull vertices feasible, not dominated by any feasible
 * cloud point, L strictly falling and C strictly rising, MRTS strictly rising, knee in range.
 * Returns 1, or 0 with an ikv_errdetail message. O(n_cloud x n_hull). */
int ikv_plan_frontier_check(const ikv_plan_frontier *f);
/* Writes the counts, the hull (configuration, C, L, MRTS) and the walk's placement to out. */
void ikv_plan_frontier_dump(const ikv_plan_frontier *f, FILE *out);

/* ---- algorithmic jumps: changes that move the whole isoquant ---- */

typedef enum ikv_jump_kind {
    IKV_JUMP_W8 = 0, /* 8-bit weights: 1 byte per parameter */
    IKV_JUMP_W4,     /* 4-bit weights, group-128 FP16 scales: 0.5156 bytes per parameter */
    IKV_JUMP_KV8,    /* 8-bit KV cache: 1 byte per element */
    IKV_JUMP_KV4,    /* 4-bit KV cache: 0.5 byte per element */
    IKV_JUMP_GQA,    /* fewer KV heads (a = the new count; default half) */
    IKV_JUMP_SWA,    /* sliding-window attention (a = window tokens; default 4096) */
    IKV_JUMP_DRAFT,  /* a better draft (a = acceptance, default 0.9; b = draft/target cost) */
    IKV_JUMP_PREFIX, /* prefix-cache hit ratio a (given, or the token hit ratio of an
                        `isokv sim --json` output) */
    IKV_JUMP_COUNT
} ikv_jump_kind;

typedef struct ikv_plan_jump {
    ikv_jump_kind kind;
    double a, b;   /* the kind's arguments (0: its default) */
    char text[96]; /* how it was given, for reports */
} ikv_plan_jump;

#define IKV_PLAN_MAX_JUMPS 8
typedef struct ikv_plan_jumps {
    size_t n;
    ikv_plan_jump j[IKV_PLAN_MAX_JUMPS];
} ikv_plan_jumps;

/* The catalogue (for --help and docs): name, what it changes, its source, its quality cost. */
typedef struct ikv_plan_jump_info {
    const char *name, *syntax, *what, *source, *quality;
} ikv_plan_jump_info;
const ikv_plan_jump_info *ikv_plan_jump_info_at(ikv_jump_kind k); /* NULL past the end */

/* Parses "NAME[:k=v[:k=v]][,NAME...]": w8, w4, kv8, kv4, gqa[:kv=N], swa[:w=N],
 * draft[:alpha=A][:c=C], prefix:h=H, prefix:sim=FILE[:run=I] (FILE an `isokv sim --json`
 * output: its token_hit_ratio, or that of runs[I] of a sweep). Returns 0, IKV_EPARAM (unknown
 * jump or argument, malformed number; the detail names it), IKV_ERANGE, or IKV_EIO /
 * IKV_EFORMAT for the sim file (detail: file and problem). *out is unchanged on error. */
int ikv_plan_jumps_parse(const char *spec, ikv_plan_jumps *out);

/* Applies the jumps in order to a copy of model (written to *m_out, its name "M+jump+...",
 * kept in name[cap]) and to *p (draft acceptance, prefix hit). Returns 0, or IKV_ERANGE when a
 * jump does not fit the model (gqa:kv not dividing the heads or above the current count);
 * on error *p and *m_out are unchanged. */
int ikv_plan_jumps_apply(const ikv_plan_jumps *j, const ikv_model_spec *model, ikv_plan_params *p,
                         ikv_model_spec *m_out, char *name, size_t cap);

/* The value of a latency change: value(L_old) - value(L_new) on the utility curve, or
 * value_per_s * (L_old - L_new) without one. $ per request. */
double ikv_plan_value(const ikv_plan_params *p, double l_old, double l_new);

/* ---- router ---- */

typedef enum ikv_req_class {
    IKV_CLASS_SIMPLE = 0,
    IKV_CLASS_MEDIUM,
    IKV_CLASS_COMPLEX
} ikv_req_class;

/* Parses "simple" | "medium" | "complex"; IKV_EPARAM with detail otherwise. */
int ikv_req_class_parse(const char *s, ikv_req_class *out);
const char *ikv_req_class_name(ikv_req_class c);

typedef struct ikv_route_req {
    ikv_req_class cls;
    double slo_s;        /* latency target, s; 0 = none */
    double budget_gpu_s; /* compute budget per request, GPU-s; 0 = none */
    int allow_poll;      /* step 7 allowed (only then may a complex request reach it) */
} ikv_route_req;

typedef struct ikv_route_decision {
    int point;    /* with ikv_plan_route_frontier: the hull index chosen; -1 otherwise */
    int max_step; /* the highest step the request may use: min(class, knee, hard cap, budget) */
    int step;     /* the step to use: the cheapest step <= max_step meeting the SLO, else
                     max_step's fastest step */
    int class_cap, knee, hard_cap, budget_cap;
    int slo_met;   /* 1 if latency(step) <= slo (or no SLO) */
    char why[320]; /* one sentence per limit that applied */
} ikv_route_decision;

/* The router policy: decides for one request on a computed walk. Does not allocate. */
void ikv_plan_route(const ikv_plan_params *p, const ikv_plan_result *walk, const ikv_route_req *req,
                    ikv_route_decision *out);

/* The router on a frontier built with max_level = the request's class cap (7 only when
 * allow_poll and the class is complex; see ikv_plan_route): the candidates are the hull points
 * up to the knee within the compute budget; step is the chosen point's level, point its hull
 * index (cheapest meeting the SLO, else the fastest candidate; with no SLO the knee).
 * knee and budget_cap are hull indices, hard_cap is -1 (infeasible points are never in the
 * hull). Returns 0, or IKV_EINVAL when f allows levers above the class cap (build it with
 * max_level = ikv_plan_class_cap). Does not allocate. */
int ikv_plan_route_frontier(const ikv_plan_params *p, const ikv_plan_frontier *f,
                            const ikv_route_req *req, ikv_route_decision *out);

/* The class cap of a request (route.simple/medium/complex; 7 for an allowed complex request,
 * never above 6 otherwise). */
int ikv_plan_class_cap(const ikv_plan_params *p, const ikv_route_req *req);

#ifdef __cplusplus
}
#endif
#endif
