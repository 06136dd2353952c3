/*
 * The planner's parameters: one table that gives every tunable its key, default, range, unit
 * and source, and the two ways to override them (key=value text from the command line, and a
 * JSON file read with cJSON). The table is the single place a default lives; docs/planner.md
 * repeats it with the discussion.
 *
 * Invariant: every numeric field of ikv_plan_params except the utility curve has exactly one
 * row here (checked by test_plan's table test, which sets each key and reads the field back).
 */
#include "isokv/base.h"
#include "isokv/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct row {
    ikv_plan_param_info info;
    size_t off; /* offset of the double (or char array) in ikv_plan_params */
} row;

#define NUM(k, field, d, lo, hi, integ, unit, src)                                                 \
    { {k, 0, d, lo, hi, integ, unit, src}, offsetof(ikv_plan_params, field) }

static const row table[] = {
    NUM("prompt", prompt, 2048, 1, 1e7, 1, "tokens", "request shape: a 2k-token prompt"),
    NUM("output", output, 256, 1, 1e6, 1, "tokens", "request shape"),
    NUM("batch", batch, 16, 1, 4096, 1, "requests",
        "a moderately loaded interactive replica; vLLM's max_num_seqs default is 256"),
    NUM("prefix.hit", prefix_hit, 0, 0, 0.999, 0, "fraction",
        "prompt share found in the prefix cache; measure it with isokv sim (--jump prefix:sim=)"),
    NUM("base.mfu", base_mfu, 0.30, 1e-3, 1, 0, "fraction",
        "eager PyTorch/HF transformers prefill: unfused attention and small kernels"),
    NUM("base.mbu", base_mbu, 0.50, 1e-3, 1, 0, "fraction",
        "eager decode: unfused attention re-reads, padded KV; cf. MBU figures of 50-60% in "
        "Databricks 2023"),
    NUM("base.overhead_ms", base_overhead_ms, 4.0, 0, 1e3, 0, "ms",
        "eager launch of ~10 kernels per layer at ~5 us each, 80 layers (CUDA graphs motivation, "
        "PyTorch 'Accelerating PyTorch with CUDA Graphs' 2021)"),
    NUM("base.kv_waste", base_kv_waste, 0.60, 0, 0.95, 0, "fraction",
        "Kwon et al. 2023 (vLLM/PagedAttention): 60-80% of KV memory wasted in earlier systems"),
    NUM("mem.usable", mem_usable, 0.90, 0.1, 1, 0, "fraction",
        "vLLM gpu_memory_utilization default 0.9"),
    NUM("kernels.mfu", k_mfu, IKV_COST_DEFAULT_MFU, 1e-3, 1, 0, "fraction",
        "cost model default (FlashAttention-2, Dao 2023; cuBLAS GEMM efficiency)"),
    NUM("kernels.mbu", k_mbu, IKV_COST_DEFAULT_MBU, 1e-3, 1, 0, "fraction",
        "cost model default (tuned decode kernels, 60-80% MBU)"),
    NUM("kernels.overhead_ms", k_overhead_ms, 0.05, 0, 1e3, 0, "ms",
        "one CUDA graph launch plus a stream sync per forward"),
    NUM("kernels.kv_waste", k_kv_waste, 0.04, 0, 0.95, 0, "fraction",
        "Kwon et al. 2023: under 4% waste with paged KV"),
    NUM("tp.size", tp_size, 8, 1, 8, 1, "GPUs", "GPUs per HGX/DGX node"),
    NUM("tp.eff", tp_eff, 0.95, 0.1, 1, 0, "fraction per doubling",
        "assumption: smaller per-GPU GEMMs; see the TP-scaling comparison in docs/planner.md"),
    NUM("tp.ar_launch_us", ar_launch_us, 5, 0, 1e4, 0, "us",
        "kernel launch + sync of one all-reduce (one-shot custom all-reduce in vLLM/TRT-LLM)"),
    NUM("tp.ar_hop_us", ar_hop_us, 0.5, 0, 1e4, 0, "us",
        "NVLink/NVSwitch per-hop latency, ring model 2(g-1) hops (NCCL small-message latency "
        "~10-15 us at 8 GPUs)"),
    {{"spec.draft", 1, 0, 0, 0, 0, "model", "Llama 3 8B drafting for 70B is the common pairing"},
     offsetof(ikv_plan_params, spec_draft)},
    NUM("spec.alpha", spec_alpha, 0.80, 0, 0.999, 0, "probability",
        "Leviathan et al. 2023 report 0.5-0.9; 8B drafting for 70B measures 0.7-0.85"),
    NUM("spec.gamma", spec_gamma, 4, 1, 64, 1, "tokens", "Leviathan et al. 2023 use 3-7"),
    NUM("spec.c", spec_c, 0, 0, 10, 0, "ratio", "0: draft step time from the cost model"),
    NUM("pp.nodes", pp_nodes, 2, 1, 64, 1, "nodes", "smallest multi-node pipeline"),
    NUM("pp.chunks", pp_chunks, 8, 1, 1024, 1, "chunks per stage",
        "chunked pipelined prefill (Mooncake CPP, Qin et al. 2024; TeraPipe, Li et al. 2021)"),
    NUM("pp.hop_us", pp_hop_us, 10, 0, 1e5, 0, "us",
        "InfiniBand NDR RDMA ~1-2 us on the wire plus send/recv software, ~10 us"),
    NUM("search.branches", search_branches, 4, 1, 1024, 1, "branches", "assumption"),
    NUM("search.pass", search_pass, 0.5, 0.001, 1, 0, "probability",
        "assumption: pass@1 of an agentic coding task (SWE-bench class, 2024 agents 0.3-0.6); 1 "
        "turns the step off"),
    NUM("hedge.copies", hedge_copies, 2, 1, 64, 1, "copies",
        "Dean & Barroso 2013, hedged requests"),
    NUM("hedge.p_slow", hedge_p_slow, 0.05, 0, 1, 0, "probability",
        "assumption: 1 in 20 requests hits preemption, queueing or a cold cache"),
    NUM("hedge.slow_factor", hedge_slow_factor, 3, 1, 1e3, 0, "x",
        "assumption: a straggler takes 3x (Dean & Barroso 2013: p99.9 tails 10-100x median)"),
    NUM("poll.saved_us", poll_saved_us, 20, 0, 1e5, 0, "us",
        "blocking-sync wake-up vs spinning (cudaDeviceScheduleBlockingSync vs Spin)"),
    NUM("price.gpu_hour", price_gpu_hour, 2.5, 0, 1e4, 0, "$/GPU-h",
        "H100 on-demand cloud list prices 2024, roughly $2-4 per GPU-hour"),
    NUM("value.per_s", value_per_s, 0.01, 0, 1e6, 0, "$/s",
        "assumption: an interactive request loses 1 cent per second of waiting"),
    NUM("cap.max_gpus", cap_max_gpus, 64, 1, 1e6, 1, "GPUs", "eight 8-GPU nodes"),
    NUM("route.simple", route_simple, 2, 0, 7, 1, "step",
        "router policy: simple requests stop at step 2 (tp)"),
    NUM("route.medium", route_medium, 4, 0, 7, 1, "step",
        "router policy: medium requests stop at step 4 (pp)"),
    NUM("route.complex", route_complex, 6, 0, 7, 1, "step",
        "router policy: complex requests may go to step 6 (hedge); 7 only when allowed"),
    NUM("frontier.max_nodes", fr_max_nodes, 4, 1, 64, 1, "nodes",
        "frontier sweep: pipeline stages 1..max(pp.nodes, this)"),
    NUM("frontier.max_gamma", fr_max_gamma, 8, 1, 64, 1, "tokens",
        "frontier sweep: draft length 0 (off)..max(spec.gamma, this)"),
    NUM("frontier.max_branches", fr_max_branches, 8, 1, 1024, 1, "branches",
        "frontier sweep: search branches 1..max(search.branches, this)"),
    NUM("frontier.max_copies", fr_max_copies, 4, 1, 64, 1, "copies",
        "frontier sweep: hedged copies 1..max(hedge.copies, this)"),
};

#define NROWS (sizeof table / sizeof table[0])

size_t ikv_plan_param_count(void) {
    return NROWS;
}

const ikv_plan_param_info *ikv_plan_param_at(size_t i) {
    return i < NROWS ? &table[i].info : NULL;
}

void ikv_plan_params_default(ikv_plan_params *p) {
    memset(p, 0, sizeof *p);
    for (size_t i = 0; i < NROWS; i++)
        if (!table[i].info.is_string) *(double *)((char *)p + table[i].off) = table[i].info.def;
    snprintf(p->spec_draft, sizeof p->spec_draft, "%s", "llama3-8b");
}

/* Prefixes the current error detail (copied first: ikv_error writes the buffer it reads). */
static int rewrap(int rc, const char *prefix) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", ikv_errdetail());
    return ikv_error(rc, "%s: %s", prefix, tmp);
}

static const row *find(const char *key) {
    for (size_t i = 0; i < NROWS; i++)
        if (!strcmp(table[i].info.key, key)) return &table[i];
    return NULL;
}

/* Parses "L1:V1,L2:V2,..." into the utility curve. */
static int parse_utility(ikv_plan_params *p, const char *s) {
    double lat[IKV_PLAN_MAX_UTIL], val[IKV_PLAN_MAX_UTIL];
    size_t n = 0;
    const char *q = s;
    while (*q) {
        char *end;
        if (n == IKV_PLAN_MAX_UTIL)
            return ikv_error(IKV_EPARAM, "utility: more than %d points", IKV_PLAN_MAX_UTIL);
        errno = 0;
        lat[n] = strtod(q, &end);
        if (end == q || *end != ':' || errno)
            return ikv_error(IKV_EPARAM, "utility: expected 'latency_s:value' at '%s'", q);
        q = end + 1;
        val[n] = strtod(q, &end);
        if (end == q || (*end && *end != ',') || errno)
            return ikv_error(IKV_EPARAM, "utility: expected a value after ':' at '%s'", q);
        if (!isfinite(lat[n]) || !isfinite(val[n]) || lat[n] < 0)
            return ikv_error(IKV_ERANGE, "utility: point %zu is not finite and >= 0", n + 1);
        if (n && lat[n] <= lat[n - 1])
            return ikv_error(IKV_ERANGE, "utility: latencies must increase (point %zu)", n + 1);
        n++;
        q = *end ? end + 1 : end;
    }
    if (n < 2) return ikv_error(IKV_EPARAM, "utility: need at least 2 points 'L1:V1,L2:V2'");
    memcpy(p->util_latency_s, lat, sizeof lat);
    memcpy(p->util_value, val, sizeof val);
    p->n_util = n;
    return 0;
}

/* Checks and stores one number for a table row. */
static int set_number(ikv_plan_params *p, const row *r, double v) {
    const ikv_plan_param_info *in = &r->info;
    if (!isfinite(v) || v < in->min || v > in->max)
        return ikv_error(IKV_ERANGE, "parameter %s = %g is outside [%g, %g] (%s)", in->key, v,
                         in->min, in->max, in->unit);
    if (in->integer && v != floor(v))
        return ikv_error(IKV_ERANGE, "parameter %s = %g must be a whole number", in->key, v);
    *(double *)((char *)p + r->off) = v;
    return 0;
}

static int set_string(ikv_plan_params *p, const row *r, const char *value) {
    const ikv_model_spec *m;
    int rc = ikv_model_lookup(value, &m);
    if (rc) return rewrap(rc, r->info.key);
    snprintf((char *)p + r->off, IKV_PLAN_NAME_MAX, "%s", m->name);
    return 0;
}

int ikv_plan_param_set(ikv_plan_params *p, const char *key, const char *value) {
    if (!key || !value) return ikv_error(IKV_EPARAM, "parameter: missing key or value");
    if (!strcmp(key, "utility")) return parse_utility(p, value);
    const row *r = find(key);
    if (!r)
        return ikv_error(IKV_EPARAM, "unknown parameter '%s' (isokv plan --params lists them)",
                         key);
    if (r->info.is_string) return set_string(p, r, value);
    /* a number, or a count with a k/M/G suffix ("2k" prompt tokens), like every other flag */
    double v;
    uint64_t u;
    if (ikv_parse_double(value, &v)) {
        if (ikv_parse_count(value, &u))
            return ikv_error(IKV_EPARAM, "parameter %s: '%s' is not a number", key, value);
        v = (double)u;
    }
    return set_number(p, r, v);
}

/* Applies one JSON member named `key` (already prefixed by its parent object's name). */
static int apply_json(ikv_plan_params *p, const char *path, const char *key, const cJSON *it) {
    if (!strcmp(key, "model") || !strcmp(key, "hw")) return 0;
    if (!strcmp(key, "utility")) {
        double lat[IKV_PLAN_MAX_UTIL], val[IKV_PLAN_MAX_UTIL];
        size_t n = 0;
        const cJSON *pt;
        if (!cJSON_IsArray(it))
            return ikv_error(IKV_EFORMAT, "%s: utility must be an array of [latency_s, value]",
                             path);
        cJSON_ArrayForEach(pt, it) {
            if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 ||
                !cJSON_IsNumber(cJSON_GetArrayItem(pt, 0)) ||
                !cJSON_IsNumber(cJSON_GetArrayItem(pt, 1)))
                return ikv_error(IKV_EFORMAT, "%s: utility point %zu is not [latency_s, value]",
                                 path, n + 1);
            if (n == IKV_PLAN_MAX_UTIL)
                return ikv_error(IKV_EPARAM, "%s: utility has more than %d points", path,
                                 IKV_PLAN_MAX_UTIL);
            lat[n] = cJSON_GetArrayItem(pt, 0)->valuedouble;
            val[n] = cJSON_GetArrayItem(pt, 1)->valuedouble;
            n++;
        }
        /* reuse the text parser's checks by formatting the points */
        char buf[IKV_PLAN_MAX_UTIL * 64];
        size_t len = 0;
        for (size_t i = 0; i < n; i++)
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%.17g:%.17g", i ? "," : "",
                                    lat[i], val[i]);
        int rc = parse_utility(p, buf);
        return rc ? rewrap(rc, path) : 0;
    }
    if (cJSON_IsObject(it)) {
        const cJSON *ch;
        cJSON_ArrayForEach(ch, it) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.%s", key, ch->string);
            int rc = apply_json(p, path, sub, ch);
            if (rc) return rc;
        }
        return 0;
    }
    const row *r = find(key);
    if (!r) return ikv_error(IKV_EPARAM, "%s: unknown parameter '%s'", path, key);
    int rc;
    if (r->info.is_string) {
        if (!cJSON_IsString(it))
            return ikv_error(IKV_EFORMAT, "%s: parameter %s must be a string", path, key);
        rc = set_string(p, r, it->valuestring);
    } else {
        if (!cJSON_IsNumber(it))
            return ikv_error(IKV_EFORMAT, "%s: parameter %s must be a number", path, key);
        rc = set_number(p, r, it->valuedouble);
    }
    return rc ? rewrap(rc, path) : 0;
}

int ikv_plan_params_load_json(ikv_plan_params *p, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return ikv_error(IKV_EIO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 8192;
            if (ncap > (size_t)16 << 20) {
                rc = ikv_error(IKV_ETOOLONG, "%s: larger than 16 MiB", path);
                break;
            }
            char *nb = ikv_realloc(buf, ncap);
            if (!nb) {
                rc = ikv_error(IKV_ENOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) rc = ikv_error(IKV_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc) {
        ikv_free(buf);
        return rc;
    }
    buf[len] = '\0';
    const char *errp = NULL;
    cJSON *root = cJSON_ParseWithOpts(buf, &errp, 1);
    if (!root) {
        size_t off = errp ? (size_t)(errp - buf) : 0, line = 1;
        for (size_t i = 0; i < off && i < len; i++)
            line += buf[i] == '\n';
        /* say why when it is cJSON's nesting limit, not a syntax error */
        size_t depth = 0, max = 0;
        for (size_t i = 0; i < len && max <= CJSON_NESTING_LIMIT; i++) {
            if (buf[i] == '"') {
                for (i++; i < len && buf[i] != '"'; i++)
                    if (buf[i] == '\\') i++;
            } else if (buf[i] == '{' || buf[i] == '[') {
                if (++depth > max) max = depth;
            } else if ((buf[i] == '}' || buf[i] == ']') && depth) {
                depth--;
            }
        }
        ikv_free(buf);
        if (max > CJSON_NESTING_LIMIT)
            return ikv_error(IKV_EFORMAT, "%s:%zu: JSON nested deeper than %d levels", path, line,
                             CJSON_NESTING_LIMIT);
        return ikv_error(IKV_EFORMAT, "%s:%zu: malformed JSON", path, line);
    }
    ikv_free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ikv_error(IKV_EFORMAT, "%s: expected one JSON object", path);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        rc = apply_json(p, path, it->string, it);
        if (rc) break;
    }
    cJSON_Delete(root);
    return rc;
}

int ikv_plan_params_check(const ikv_plan_params *p) {
    for (size_t i = 0; i < NROWS; i++) {
        const ikv_plan_param_info *in = &table[i].info;
        if (in->is_string) continue;
        double v = *(const double *)((const char *)p + table[i].off);
        if (!isfinite(v) || v < in->min || v > in->max || (in->integer && v != floor(v)))
            return ikv_error(IKV_ERANGE, "parameter %s = %g is outside [%g, %g]", in->key, v,
                             in->min, in->max);
    }
    unsigned tp = (unsigned)p->tp_size;
    if (tp & (tp - 1)) return ikv_error(IKV_ERANGE, "tp.size = %u is not a power of two", tp);
    if (p->n_util == 1 || p->n_util > IKV_PLAN_MAX_UTIL)
        return ikv_error(IKV_ERANGE, "utility curve needs 2..%d points", IKV_PLAN_MAX_UTIL);
    for (size_t i = 1; i < p->n_util; i++)
        if (!(p->util_latency_s[i] > p->util_latency_s[i - 1]))
            return ikv_error(IKV_ERANGE, "utility latencies must increase (point %zu)", i + 1);
    const ikv_model_spec *m;
    if (ikv_model_lookup(p->spec_draft, &m)) return rewrap(IKV_EMODEL, "spec.draft");
    return 0;
}
