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
 * Pure computation: no allocation except in ikv_plan_params_load_json (cJSON), no globals.
 */
#ifndef ISOKV_PLAN_H
#define ISOKV_PLAN_H

#include <stddef.h>
#include <stdint.h>

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
    double prompt; /* prompt tokens (none cached) */
    double output; /* output tokens */
    double batch;  /* concurrent requests sharing one replica's decode steps */
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

#ifdef __cplusplus
}
#endif
#endif
