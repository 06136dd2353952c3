/*
 * Algorithmic jumps: changes that move the whole compute-latency isoquant instead of walking
 * along it. Each is a transformation of the model spec (weight bytes, KV bytes, KV heads,
 * attention window) or of the request/parameters (draft acceptance, prefix-cache hit), after
 * which the walk and the frontier are computed again on the same roofline:
 *
 *   w8      bytes_per_param 2 -> 1            decode reads half the weight bytes; FLOPs kept
 *   w4      bytes_per_param 2 -> 0.5 + 2/128  4-bit weights plus an FP16 scale per 128
 *   kv8     kv_bytes_per_elem 2 -> 1          KV reads and KV memory halved
 *   kv4     kv_bytes_per_elem 2 -> 0.5
 *   gqa:kv=N  kv_heads -> N                   KV / N-th; k,v projection params shrink
 *   swa:w=N   attn_window = N                 attention keys and KV per sequence <= N
 *   draft:alpha=A[:c=C]  spec.alpha = A (spec.c = C)   more tokens per target pass
 *   prefix:h=H | prefix:sim=FILE[:run=I]     prefix.hit = H: prefill of (1 - H) P only
 *
 * Weight-only quantization keeps the compute in BF16 (dequantize in the kernel), so FLOPs and
 * prefill's compute-bound time do not change; only bytes do. The draft model is not
 * transformed (a quantized target usually gets a quantized draft too: then give draft:c=).
 * Sources and quality costs: the table below and docs/planner.md section 7.
 */
#include "isokv/base.h"
#include "isokv/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ikv_plan_jump_info infos[IKV_JUMP_COUNT] = {
    {"w8", "w8", "8-bit weights: 1 byte per parameter (decode reads half the bytes)",
     "Dettmers et al. 2022 (LLM.int8()); Xiao et al. 2023 (SmoothQuant, W8A8)",
     "small: LLM.int8() reports no perplexity loss up to 175B parameters"},
    {"w4", "w4", "4-bit weights, FP16 scale per 128: 0.516 bytes per parameter",
     "Frantar et al. 2023 (GPTQ); Lin et al. 2024 (AWQ)",
     "lossy: roughly +0.1-0.3 WikiText-2 perplexity at 70B scale (group 128), more for small "
     "models; check on the task"},
    {"kv8", "kv8", "8-bit KV cache (FP8 E4M3 or INT8): 1 byte per K/V element",
     "FP8 KV caches of vLLM and TensorRT-LLM; Hooper et al. 2024 (KVQuant)",
     "small but model-dependent; measure on the task"},
    {"kv4", "kv4", "4-bit KV cache: 0.5 byte per K/V element",
     "Hooper et al. 2024 (KVQuant: < 0.1 perplexity loss at 3 bits); Liu et al. 2024 (KIVI, "
     "2 bits)",
     "lossy: needs per-channel keys / outlier handling as in those papers"},
    {"gqa", "gqa[:kv=N]", "fewer KV heads (default half): KV bytes and k,v projections shrink",
     "Ainslie et al. 2023 (GQA: uptraining with 5% of the pre-training compute); Shazeer 2019 "
     "(MQA)",
     "lossy and not free: the model must be uptrained; GQA keeps quality close to multi-head, "
     "MQA (kv=1) loses more"},
    {"swa", "swa[:w=N]",
     "sliding-window attention of N tokens (default 4096): attention keys and KV per sequence "
     "bounded",
     "Beltagy et al. 2020 (Longformer); Jiang et al. 2023 (Mistral 7B, window 4096)",
     "lossy beyond the window (tokens further back reach a token only through the layers); the "
     "model must be trained with it; no effect on prompts shorter than N"},
    {"draft", "draft[:alpha=A][:c=C]",
     "a better draft: acceptance A (default 0.9), optional draft/target step cost C",
     "Leviathan et al. 2023, Chen et al. 2023 (lossless speculative sampling); Cai et al. 2024 "
     "(Medusa), Li et al. 2024 (EAGLE): draft heads with higher acceptance",
     "none: speculative sampling keeps the target's output distribution"},
    {"prefix", "prefix:h=H | prefix:sim=FILE[:run=I]",
     "prefix-cache hit ratio H: only the last (1 - H) of the prompt is prefilled",
     "Kwon et al. 2023 (vLLM prefix caching); Zheng et al. 2024 (SGLang RadixAttention); H as "
     "`isokv sim` measures it on a trace",
     "none: an exact hit gives the same output (isokv's engine checks it bit for bit)"},
};

const ikv_plan_jump_info *ikv_plan_jump_info_at(ikv_jump_kind k) {
    return (unsigned)k < IKV_JUMP_COUNT ? &infos[k] : NULL;
}

/* Parses a number argument "v" of `what`; 0 or IKV_EPARAM. */
static int num(const char *v, const char *what, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !isfinite(x))
        return ikv_error(IKV_EPARAM, "jump %s: '%s' is not a number", what, v);
    *out = x;
    return 0;
}

/* Reads the token hit ratio of an `isokv sim --json` output (runs[run] of a sweep). */
static int sim_hit(const char *path, long run, double *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return ikv_error(IKV_EIO, "jump prefix:sim=%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = ikv_malloc(cap);
    int rc = 0;
    while (buf) {
        if (len + 1 >= cap) {
            if (cap >= (size_t)64 << 20) {
                rc = ikv_error(IKV_ETOOLONG, "jump prefix:sim=%s: larger than 64 MiB", path);
                break;
            }
            char *nb = ikv_realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (!got) break;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return ikv_error(IKV_ENOMEM, "jump prefix:sim=%s", path);
    if (!rc && err) rc = ikv_error(IKV_EIO, "jump prefix:sim=%s: read error", path);
    if (rc) {
        ikv_free(buf);
        return rc;
    }
    buf[len] = '\0';
    cJSON *root = cJSON_Parse(buf);
    ikv_free(buf);
    if (!root) return ikv_error(IKV_EFORMAT, "jump prefix:sim=%s: not JSON", path);
    const cJSON *o = root, *runs = cJSON_GetObjectItemCaseSensitive(root, "runs");
    if (cJSON_IsArray(runs)) {
        int n = cJSON_GetArraySize(runs);
        if (run < 0 || run >= n) {
            cJSON_Delete(root);
            return ikv_error(IKV_ERANGE, "jump prefix:sim=%s: run %ld of %d runs", path, run, n);
        }
        o = cJSON_GetArrayItem(runs, (int)run);
    } else if (run > 0) {
        cJSON_Delete(root);
        return ikv_error(IKV_ERANGE, "jump prefix:sim=%s: one result, no run %ld", path, run);
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "token_hit_ratio");
    if (!cJSON_IsNumber(h)) {
        cJSON_Delete(root);
        return ikv_error(IKV_EFORMAT,
                         "jump prefix:sim=%s: no token_hit_ratio (an `isokv sim "
                         "--json` output is expected)",
                         path);
    }
    *out = h->valuedouble;
    cJSON_Delete(root);
    return 0;
}

/* Parses one jump "name[:k=v...]" of len bytes. */
static int parse_one(const char *s, size_t len, ikv_plan_jump *j) {
    char tok[4200];
    if (len == 0) return ikv_error(IKV_EPARAM, "jump: empty name in the list");
    if (len >= sizeof tok) return ikv_error(IKV_EPARAM, "jump: '%.40s...' too long", s);
    memcpy(tok, s, len);
    tok[len] = '\0';
    memset(j, 0, sizeof *j);
    snprintf(j->text, sizeof j->text, "%.*s", (int)(sizeof j->text - 1), tok);
    char *colon = strchr(tok, ':');
    char *args = colon ? colon + 1 : NULL;
    if (colon) *colon = '\0';
    int k = -1;
    for (int i = 0; i < IKV_JUMP_COUNT; i++)
        if (!strcmp(tok, infos[i].name)) k = i;
    if (k < 0)
        return ikv_error(IKV_EPARAM,
                         "unknown jump '%s' (known: w8, w4, kv8, kv4, gqa, swa, draft, prefix)",
                         tok);
    j->kind = (ikv_jump_kind)k;
    int rc;
    if (j->kind == IKV_JUMP_PREFIX) {
        if (!args) return ikv_error(IKV_EPARAM, "jump prefix needs h=H or sim=FILE");
        if (!strncmp(args, "h=", 2)) {
            if ((rc = num(args + 2, "prefix:h", &j->a))) return rc;
        } else if (!strncmp(args, "sim=", 4)) {
            char *path = args + 4;
            long run = 0;
            char *r = strstr(path, ":run=");
            if (r) {
                char *end;
                errno = 0;
                run = strtol(r + 5, &end, 10);
                if (end == r + 5 || *end || errno || run < 0)
                    return ikv_error(IKV_EPARAM, "jump prefix: bad run index '%s'", r + 5);
                *r = '\0';
            }
            if ((rc = sim_hit(path, run, &j->a))) return rc;
        } else {
            return ikv_error(IKV_EPARAM, "jump prefix: expected h=H or sim=FILE, got '%s'", args);
        }
        if (!(j->a >= 0 && j->a < 1))
            return ikv_error(IKV_ERANGE, "jump prefix: hit ratio %g is not in [0, 1)", j->a);
        return 0;
    }
    while (args && *args) {
        char *next = strchr(args, ':');
        if (next) *next++ = '\0';
        char *eq = strchr(args, '=');
        if (!eq) return ikv_error(IKV_EPARAM, "jump %s: expected key=value, got '%s'", tok, args);
        *eq = '\0';
        const char *key = args, *val = eq + 1;
        double v;
        if ((rc = num(val, key, &v))) return rc;
        if (j->kind == IKV_JUMP_GQA && !strcmp(key, "kv")) {
            if (v < 1 || v != floor(v) || v > 1024)
                return ikv_error(IKV_ERANGE, "jump gqa: kv=%g must be a whole number >= 1", v);
            j->a = v;
        } else if (j->kind == IKV_JUMP_SWA && !strcmp(key, "w")) {
            if (v < 1 || v != floor(v) || v > 1e8)
                return ikv_error(IKV_ERANGE, "jump swa: w=%g must be a whole number >= 1", v);
            j->a = v;
        } else if (j->kind == IKV_JUMP_DRAFT && !strcmp(key, "alpha")) {
            if (!(v > 0 && v <= 0.999))
                return ikv_error(IKV_ERANGE, "jump draft: alpha=%g is not in (0, 0.999]", v);
            j->a = v;
        } else if (j->kind == IKV_JUMP_DRAFT && !strcmp(key, "c")) {
            if (!(v > 0 && v <= 10))
                return ikv_error(IKV_ERANGE, "jump draft: c=%g is not in (0, 10]", v);
            j->b = v;
        } else {
            return ikv_error(IKV_EPARAM, "jump %s: unknown argument '%s' (syntax: %s)", tok, key,
                             infos[k].syntax);
        }
        args = next;
    }
    return 0;
}

int ikv_plan_jumps_parse(const char *spec, ikv_plan_jumps *out) {
    if (!spec || !*spec) return ikv_error(IKV_EPARAM, "jump: empty list");
    ikv_plan_jumps js;
    memset(&js, 0, sizeof js);
    const char *s = spec;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (js.n == IKV_PLAN_MAX_JUMPS)
            return ikv_error(IKV_EPARAM, "jump: more than %d jumps", IKV_PLAN_MAX_JUMPS);
        int rc = parse_one(s, len, &js.j[js.n]);
        if (rc) return rc;
        js.n++;
        if (!comma) break;
        s = comma + 1;
    }
    *out = js;
    return 0;
}

int ikv_plan_jumps_apply(const ikv_plan_jumps *j, const ikv_model_spec *model, ikv_plan_params *p,
                         ikv_model_spec *m_out, char *name, size_t cap) {
    ikv_model_spec m = *model;
    ikv_plan_params q = *p;
    size_t len = (size_t)snprintf(name, cap, "%s", model->name);
    for (size_t i = 0; i < j->n; i++) {
        const ikv_plan_jump *x = &j->j[i];
        switch (x->kind) {
        case IKV_JUMP_W8:
            m.bytes_per_param = 1.0;
            break;
        case IKV_JUMP_W4:
            m.bytes_per_param = 0.5 + 2.0 / 128;
            break;
        case IKV_JUMP_KV8:
            m.kv_bytes_per_elem = 1.0;
            break;
        case IKV_JUMP_KV4:
            m.kv_bytes_per_elem = 0.5;
            break;
        case IKV_JUMP_GQA: {
            uint32_t kv = x->a > 0 ? (uint32_t)x->a : (m.kv_heads > 1 ? m.kv_heads / 2 : 1);
            if (kv > m.kv_heads || m.heads % kv)
                return ikv_error(IKV_ERANGE,
                                 "jump gqa: %u KV heads must divide the %u query heads and not "
                                 "exceed the %u KV heads %s has",
                                 kv, m.heads, m.kv_heads, model->name);
            /* the k and v projections shrink with the KV heads */
            m.params -= 2.0 * m.layers * m.hidden * (double)(m.kv_heads - kv) * m.head_dim;
            m.kv_heads = kv;
            break;
        }
        case IKV_JUMP_SWA:
            m.attn_window = x->a > 0 ? (uint32_t)x->a : 4096;
            break;
        case IKV_JUMP_DRAFT:
            q.spec_alpha = x->a > 0 ? x->a : 0.9;
            if (x->b > 0) q.spec_c = x->b;
            break;
        case IKV_JUMP_PREFIX:
            q.prefix_hit = x->a;
            break;
        default:
            return ikv_error(IKV_EPARAM, "jump: kind %d", (int)x->kind);
        }
        if (len < cap) len += (size_t)snprintf(name + len, cap - len, "+%s", x->text);
    }
    m.name = name;
    *m_out = m;
    *p = q;
    return 0;
}
