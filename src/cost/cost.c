/*
 * The roofline cost model: FLOPs, bytes and seconds of transformer inference steps.
 *
 * Notation: L layers, d hidden, H query heads, Hkv KV heads, dh head dim, f MLP width,
 * V vocab, P total params, s bytes per parameter (2 for BF16), g GPUs (tensor parallel).
 *
 *   P_layers   = L (d H dh + 2 d Hkv dh + H dh d + 3 d f)    matrices of the blocks
 *   W          = P s                                          weight bytes
 *   kv/token   = 2 L Hkv dh e                                 K and V, e bytes each (BF16: 2;
 *                                                             llama3-70b: 327,680)
 *
 *   n new tokens after a cached prefix of p tokens (causal: token i of the n attends p + i keys):
 *   attn(p, n) = 4 L H dh (n p + n (n + 1) / 2)               QK^T and AV, 2 FLOPs per MAC each
 *   kv(p, n)   = 2 n P_layers + attn(p, n)                    FLOPs to produce the KV
 *   prefill    = kv(p, n) + 2 V d                             plus the last token's logits
 *   bytes_pre  = W + (p + n) kv/token                         weights, prefix read, new written
 *
 *   one decode step, batch b, each sequence with ctx cached tokens:
 *   decode     = b (2 P_layers + 2 V d + 4 L H dh (ctx + 1))
 *   bytes_dec  = W + b (ctx + 1) kv/token
 *
 *   with an attention window w (sliding-window attention, Beltagy et al. 2020; Mistral 7B,
 *   Jiang et al. 2023) token i attends min(p + i, w) keys and a sequence keeps min(ctx, w)
 *   tokens of KV; w = 0 is full attention.
 *
 *   time(F, B) = max(F / (peak_flops mfu g), B / (hbm_bw mbu g))      the roofline
 *
 *   load of k blocks from tier t = lat(t) + k * block bytes / (g * bw(t) * eff(t))
 *       hbm: bw = hbm_bw, eff = mbu, counting read + write (2x bytes);
 *       dram: host_bw; ssd: min(ssd_bw, host_bw); remote: net_bw (GPUDirect RDMA); eff = link.
 *
 * What is left out, on purpose, because it is small at the shapes of interest or belongs to
 * another layer: embeddings lookup, norms, RoPE, softmax, activations traffic (< 1% of FLOPs
 * and bytes for d >= 4096), kernel launch overhead, and all communication between GPUs
 * (tensor-parallel all-reduces are charged by plan/, where TP is a step of the walk).
 *
 * Default efficiencies (IKV_COST_DEFAULT_*), see docs/planner.md for the discussion:
 *   mfu 0.50  large prefill GEMMs reach 50-70% of dense BF16 peak on A100/H100 (cuBLAS
 *             GEMM benchmarks; FlashAttention-2, Dao 2023, reaches 50-73% of peak on A100 for
 *             the attention forward); end-to-end serving prefill measures lower, so 0.5.
 *   mbu 0.80  HBM stream benchmarks reach ~85-90% of peak; the well-tuned decode kernels of
 *             TensorRT-LLM/vLLM report MBU in the 60-80% range (Databricks, "LLM Inference
 *             Performance Engineering: Best Practices", 2023, introduced the MBU metric).
 *   link 0.80 pinned-memory cudaMemcpy reaches ~25 of 32 GB/s on PCIe Gen4 and ~50-55 of
 *             64 GB/s on Gen5; RDMA and NVMe reach a similar share of line rate.
 * Tier access latencies (orders of magnitude, one batched request): hbm 5 us (a kernel
 * launch), dram 10 us (async copy launch + DMA setup), ssd 100 us (NVMe 4 KiB random read
 * latency in enterprise Gen4 drive datasheets is 70-100 us), remote 10 us (RDMA read round
 * trip of a few us plus the transfer engine's bookkeeping).
 *
 * All functions are pure and allocation-free.
 */
#include "isokv/base.h"
#include "isokv/cost.h"

#include <math.h>
#include <string.h>

static const char *const tier_names[IKV_TIER_COUNT] = {"hbm", "dram", "ssd", "remote"};
static const double tier_lat[IKV_TIER_COUNT] = {5e-6, 10e-6, 100e-6, 10e-6};

const char *ikv_tier_name(ikv_tier t) {
    return (unsigned)t < IKV_TIER_COUNT ? tier_names[t] : "?";
}

int ikv_tier_parse(const char *name, ikv_tier *out) {
    for (int i = 0; name && i < IKV_TIER_COUNT; i++)
        if (!strcmp(name, tier_names[i])) {
            *out = (ikv_tier)i;
            return 0;
        }
    return ikv_error(IKV_EINVAL, "unknown tier '%s' (known: hbm, dram, ssd, remote)",
                     name ? name : "(null)");
}

double ikv_tier_latency(ikv_tier t) {
    return (unsigned)t < IKV_TIER_COUNT ? tier_lat[t] : 0.0;
}

void ikv_cost_cfg_init(ikv_cost_cfg *cfg, const ikv_model_spec *model, const ikv_hw_spec *hw) {
    cfg->model = model;
    cfg->hw = hw;
    cfg->mfu = IKV_COST_DEFAULT_MFU;
    cfg->mbu = IKV_COST_DEFAULT_MBU;
    cfg->link = IKV_COST_DEFAULT_LINK;
    cfg->gpus = 1;
}

static int frac_ok(double x) {
    return x > 0 && x <= 1;
}

int ikv_cost_cfg_check(const ikv_cost_cfg *cfg) {
    if (!cfg || !cfg->model) return ikv_error(IKV_EINVAL, "cost config: no model");
    if (!cfg->hw) return ikv_error(IKV_EINVAL, "cost config: no hardware");
    if (!frac_ok(cfg->mfu))
        return ikv_error(IKV_ERANGE, "cost config: mfu %g not in (0, 1]", cfg->mfu);
    if (!frac_ok(cfg->mbu))
        return ikv_error(IKV_ERANGE, "cost config: mbu %g not in (0, 1]", cfg->mbu);
    if (!frac_ok(cfg->link))
        return ikv_error(IKV_ERANGE, "cost config: link efficiency %g not in (0, 1]", cfg->link);
    if (cfg->gpus < 1) return ikv_error(IKV_ERANGE, "cost config: gpus must be >= 1");
    return 0;
}

/* ---- sizes ---- */

double ikv_model_layer_params(const ikv_model_spec *m) {
    double d = m->hidden, qd = (double)m->heads * m->head_dim,
           kvd = (double)m->kv_heads * m->head_dim;
    double per_layer = d * qd + 2 * d * kvd + qd * d + 3 * d * (double)m->ffn;
    return per_layer * m->layers;
}

double ikv_model_weight_bytes(const ikv_model_spec *m) {
    return m->params * m->bytes_per_param;
}

double ikv_kv_bytes_per_token(const ikv_model_spec *m) {
    double elem = m->kv_bytes_per_elem > 0 ? m->kv_bytes_per_elem : 2.0;
    return 2.0 * m->layers * m->kv_heads * m->head_dim * elem;
}

/* Tokens of KV a sequence of `tokens` keeps: all of them, or the window. */
static double kv_tokens(const ikv_model_spec *m, double tokens) {
    return m->attn_window && tokens > m->attn_window ? (double)m->attn_window : tokens;
}

double ikv_kv_bytes_per_block(const ikv_model_spec *m, uint32_t block_tokens) {
    return ikv_kv_bytes_per_token(m) * block_tokens;
}

/* ---- FLOPs ---- */

/* The key count sum over the new tokens i = 1..n of min(p + i, w) is split at the first token
 * whose p + i reaches w: full causal attention before, w keys each after. */
double ikv_attn_flops(const ikv_model_spec *m, uint64_t p, uint64_t n) {
    double nn = (double)n, pp = (double)p, keys;
    double w = m->attn_window;
    if (!m->attn_window || pp + nn <= w) {
        keys = nn * pp + nn * (nn + 1) / 2;
    } else {
        double k = pp >= w ? 0 : w - pp; /* tokens before the window is full */
        keys = k * pp + k * (k + 1) / 2 + (nn - k) * w;
    }
    return 4.0 * m->layers * m->heads * m->head_dim * keys;
}

double ikv_kv_flops(const ikv_model_spec *m, uint64_t p, uint64_t n) {
    return 2.0 * (double)n * ikv_model_layer_params(m) + ikv_attn_flops(m, p, n);
}

static double logits_flops(const ikv_model_spec *m) {
    return 2.0 * m->vocab * (double)m->hidden;
}

double ikv_prefill_flops(const ikv_model_spec *m, uint64_t p, uint64_t n) {
    if (n == 0) return 0;
    return ikv_kv_flops(m, p, n) + logits_flops(m);
}

double ikv_decode_flops(const ikv_model_spec *m, uint32_t b, uint64_t ctx) {
    double per_seq = 2.0 * ikv_model_layer_params(m) + logits_flops(m) +
                     4.0 * m->layers * m->heads * m->head_dim * kv_tokens(m, (double)ctx + 1);
    return b * per_seq;
}

/* ---- times ---- */

static double roofline(const ikv_cost_cfg *c, double flops, double bytes) {
    double g = c->gpus ? c->gpus : 1;
    double tc = flops / (c->hw->flops * c->mfu * g);
    double tm = bytes / (c->hw->hbm_bw * c->mbu * g);
    return tc > tm ? tc : tm;
}

double ikv_prefill_bytes(const ikv_model_spec *m, uint64_t p, uint64_t n) {
    if (n == 0) return 0;
    return ikv_model_weight_bytes(m) +
           kv_tokens(m, (double)p + (double)n) * ikv_kv_bytes_per_token(m);
}

double ikv_prefill_time(const ikv_cost_cfg *cfg, uint64_t p, uint64_t n) {
    if (n == 0) return 0;
    return roofline(cfg, ikv_prefill_flops(cfg->model, p, n), ikv_prefill_bytes(cfg->model, p, n));
}

double ikv_decode_bytes(const ikv_model_spec *m, uint32_t b, uint64_t ctx) {
    return ikv_model_weight_bytes(m) +
           (double)b * kv_tokens(m, (double)ctx + 1) * ikv_kv_bytes_per_token(m);
}

double ikv_decode_time(const ikv_cost_cfg *cfg, uint32_t b, uint64_t ctx) {
    if (b == 0) return 0;
    return roofline(cfg, ikv_decode_flops(cfg->model, b, ctx),
                    ikv_decode_bytes(cfg->model, b, ctx));
}

/* Compute time grows as b * F1 / Fc, memory time as (W + b * K1) / Bm; they cross at
 * b = (W / Bm) / (F1 / Fc - K1 / Bm), and never when the per-sequence FLOPs take less time than
 * the per-sequence KV bytes (very long contexts). */
double ikv_decode_ridge_batch(const ikv_cost_cfg *cfg, uint64_t ctx) {
    double g = cfg->gpus ? cfg->gpus : 1;
    double fc = cfg->hw->flops * cfg->mfu * g, bm = cfg->hw->hbm_bw * cfg->mbu * g;
    double f1 = ikv_decode_flops(cfg->model, 1, ctx);
    double k1 = kv_tokens(cfg->model, (double)ctx + 1) * ikv_kv_bytes_per_token(cfg->model);
    double den = f1 / fc - k1 / bm;
    if (den <= 0) return INFINITY;
    return (ikv_model_weight_bytes(cfg->model) / bm) / den;
}

double ikv_load_time(const ikv_cost_cfg *cfg, ikv_tier t, uint64_t blocks, uint32_t block_tokens) {
    if (blocks == 0 || (unsigned)t >= IKV_TIER_COUNT) return 0;
    const ikv_hw_spec *hw = cfg->hw;
    double g = cfg->gpus ? cfg->gpus : 1;
    double bytes = (double)blocks * ikv_kv_bytes_per_block(cfg->model, block_tokens) / g;
    double bw;
    switch (t) {
    case IKV_TIER_HBM:
        bw = hw->hbm_bw * cfg->mbu / 2;
        break; /* read + write */
    case IKV_TIER_DRAM:
        bw = hw->host_bw * cfg->link;
        break;
    case IKV_TIER_SSD:
        bw = fmin(hw->ssd_bw, hw->host_bw) * cfg->link;
        break;
    default:
        bw = hw->net_bw * cfg->link;
        break;
    }
    return tier_lat[t] + bytes / bw;
}

/* ---- the cache's recompute-cost callback ---- */

double ikv_cost_block_flops(void *ctx, uint32_t depth, uint32_t ntokens) {
    const ikv_cost_block_ctx *c = ctx;
    uint64_t p = (uint64_t)depth * c->block_tokens;
    return ikv_kv_flops(c->model, p, ntokens);
}

double ikv_cost_block_seconds(void *ctx, uint32_t depth, uint32_t ntokens) {
    const ikv_cost_block_ctx *c = ctx;
    uint64_t p = (uint64_t)depth * c->block_tokens;
    double kvb = ikv_kv_bytes_per_token(c->model);
    double tc = ikv_kv_flops(c->model, p, ntokens) / (c->hw->flops * IKV_COST_DEFAULT_MFU);
    double tm = ((double)p + ntokens) * kvb / (c->hw->hbm_bw * IKV_COST_DEFAULT_MBU);
    return tc > tm ? tc : tm;
}
