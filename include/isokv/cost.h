/*
 * isokv cost: a roofline cost model of transformer inference on real hardware.
 *
 * Two catalogs and a handful of pure functions. The catalogs hold published figures of a few
 * models (layer count and shapes, parameter count) and GPUs (dense BF16 FLOP/s, HBM capacity
 * and bandwidth, host link, SSD and network bandwidth), each number with its source in
 * src/cost/catalog.c. The functions turn a model, a GPU and a request shape into FLOPs, bytes
 * moved and seconds, on the roofline:
 *
 *     time = max(FLOPs / (peak FLOP/s * mfu * gpus), bytes / (peak HBM B/s * mbu * gpus))
 *
 * The formulas are written out at the top of src/cost/cost.c and in docs/planner.md. The same
 * model is used by the simulator (to charge simulated time for a prefill, a decode step or a
 * tier load), by the cache's cost-aware eviction (recompute FLOPs of a block) and by the
 * planner (the seven steps are configuration changes on top of it).
 *
 * Every function is pure: no allocation, no global state, safe from any thread. Catalog
 * entries are static and live for the whole program.
 */
#ifndef ISOKV_COST_H
#define ISOKV_COST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A decoder-only transformer (Llama architecture: RMSNorm, RoPE, GQA, SwiGLU MLP). */
typedef struct ikv_model_spec {
    const char *name;       /* catalog key, e.g. "llama3-70b" */
    uint32_t layers;        /* transformer blocks */
    uint32_t hidden;        /* model width d */
    uint32_t heads;         /* query heads */
    uint32_t kv_heads;      /* key/value heads (GQA groups) */
    uint32_t head_dim;      /* per-head width */
    uint32_t ffn;           /* SwiGLU intermediate width */
    uint32_t vocab;         /* vocabulary size */
    int tied_embeddings;    /* 1 if the LM head shares the embedding matrix */
    double params;          /* published total parameter count (embeddings included) */
    double bytes_per_param; /* 2 for BF16 */
    const char *source;     /* where the shapes come from */
    /* Optional (0 = the default), set by the planner's algorithmic jumps (plan.h) and by its
     * measured mode for an fp32 CPU engine: */
    double kv_bytes_per_elem; /* bytes of one K or V element: 0 = 2 (BF16), 1 = FP8, 4 = fp32 */
    uint32_t attn_window;     /* sliding attention window, tokens: a token attends to at most
                                 this many keys and a sequence keeps at most this many tokens of
                                 KV; 0 = full causal attention */
} ikv_model_spec;

/* One GPU as deployed in an 8-GPU server (per-GPU shares of node resources). Bandwidths are
 * in bytes per second in ONE direction, capacities in bytes. */
typedef struct ikv_hw_spec {
    const char *name;   /* catalog key, e.g. "h100" */
    double flops;       /* dense BF16 tensor-core peak, FLOP/s (no sparsity) */
    double hbm_bytes;   /* device memory capacity, bytes */
    double hbm_bw;      /* device memory bandwidth, B/s */
    double host_bw;     /* host link (PCIe) bandwidth, B/s, one direction */
    double ssd_bw;      /* local NVMe read bandwidth available to one GPU, B/s */
    double net_bw;      /* scale-out NIC bandwidth per GPU, B/s, one direction */
    double nvlink_bw;   /* intra-node GPU-GPU bandwidth per GPU, B/s, one direction */
    double tdp_w;       /* board power, W */
    const char *source; /* datasheets the figures come from */
} ikv_hw_spec;

/* Storage tiers a KV block can be loaded from. */
typedef enum ikv_tier {
    IKV_TIER_HBM = 0, /* already on the device: a device-to-device copy */
    IKV_TIER_DRAM,    /* host memory, over the host link */
    IKV_TIER_SSD,     /* local NVMe, then the host link */
    IKV_TIER_REMOTE,  /* another server's memory, over the network (RDMA) */
    IKV_TIER_COUNT
} ikv_tier;

/* Name of a tier ("hbm", "dram", "ssd", "remote"); "?" for anything else. */
const char *ikv_tier_name(ikv_tier t);
/* Parses a tier name; 0 on success, IKV_EINVAL (with detail) for an unknown name. */
int ikv_tier_parse(const char *name, ikv_tier *out);

/* ---- catalogs ---------------------------------------------------------------------------- */

/* Looks a model up by name (case-sensitive). Returns 0 and sets *out, or IKV_EMODEL with a
 * detail naming the unknown model and listing the known ones. */
int ikv_model_lookup(const char *name, const ikv_model_spec **out);
/* Looks a GPU up by name. Returns 0 and sets *out, or IKV_EHW (detail lists known names). */
int ikv_hw_lookup(const char *name, const ikv_hw_spec **out);

/* Catalog iteration for --help: the count, and entry i (NULL when i >= count). */
size_t ikv_model_count(void);
const ikv_model_spec *ikv_model_at(size_t i);
size_t ikv_hw_count(void);
const ikv_hw_spec *ikv_hw_at(size_t i);

/* Writes the catalog names joined by ", " into buf (always NUL-terminated when cap > 0,
 * truncated if too small). Returns the length the full list needs, like snprintf. */
size_t ikv_model_names(char *buf, size_t cap);
size_t ikv_hw_names(char *buf, size_t cap);

/* ---- configuration ----------------------------------------------------------------------- */

/* Achieved fractions of peak, the only tuning knobs of the roofline. The defaults are
 * documented with their sources in src/cost/cost.c. */
#define IKV_COST_DEFAULT_MFU  0.50 /* fraction of peak FLOP/s a large GEMM-bound prefill gets */
#define IKV_COST_DEFAULT_MBU  0.80 /* fraction of peak HBM bandwidth a decode step gets */
#define IKV_COST_DEFAULT_LINK 0.80 /* fraction of peak host-link/NIC/SSD bandwidth achieved */

/* What the roofline functions need. Callers own it (put it on the stack); fill it with
 * ikv_cost_cfg_init() and change fields as needed. */
typedef struct ikv_cost_cfg {
    const ikv_model_spec *model;
    const ikv_hw_spec *hw;
    double mfu;    /* achieved / peak FLOP/s, in (0, 1] */
    double mbu;    /* achieved / peak HBM bandwidth, in (0, 1] */
    double link;   /* achieved / peak for host link, SSD and NIC, in (0, 1] */
    uint32_t gpus; /* GPUs the model is split across, work divided evenly (tensor parallel);
                      communication is NOT charged here (the planner adds it). >= 1 */
} ikv_cost_cfg;

/* Fills cfg with model, hw, the default efficiencies and one GPU. */
void ikv_cost_cfg_init(ikv_cost_cfg *cfg, const ikv_model_spec *model, const ikv_hw_spec *hw);

/* Checks a configuration: model and hw set, efficiencies in (0, 1], gpus >= 1. Returns 0 or
 * IKV_EINVAL / IKV_ERANGE with a detail naming the field. */
int ikv_cost_cfg_check(const ikv_cost_cfg *cfg);

/* ---- sizes ------------------------------------------------------------------------------- */

/* Parameters of the transformer blocks (attention and MLP matrices, from the shapes; norms
 * and biases are left out: < 0.1%). */
double ikv_model_layer_params(const ikv_model_spec *m);
/* Bytes of all weights: params * bytes_per_param (llama3-70b BF16: 141.1e9). */
double ikv_model_weight_bytes(const ikv_model_spec *m);
/* KV bytes per token: 2 (K and V) * layers * kv_heads * head_dim * kv_bytes_per_elem (2 bytes,
 * BF16, when the field is 0). */
double ikv_kv_bytes_per_token(const ikv_model_spec *m);
/* KV bytes of one block of block_tokens tokens. */
double ikv_kv_bytes_per_block(const ikv_model_spec *m, uint32_t block_tokens);

/* ---- FLOPs ------------------------------------------------------------------------------- */

/* FLOPs to compute the KV of n new tokens that follow a cached prefix of p tokens (all
 * layers; no logits): 2 n P_layers + 4 L H d_h (n p + n (n + 1) / 2). */
double ikv_kv_flops(const ikv_model_spec *m, uint64_t p, uint64_t n);
/* FLOPs of the attention part alone (QK^T and AV, causal) of ikv_kv_flops. With an attention
 * window w, new token i (1-based) attends to min(p + i, w) keys instead of p + i. */
double ikv_attn_flops(const ikv_model_spec *m, uint64_t p, uint64_t n);
/* FLOPs of a prefill of n new tokens after a cached prefix of p: ikv_kv_flops plus the
 * logits of the last token (2 vocab hidden). 0 when n = 0. */
double ikv_prefill_flops(const ikv_model_spec *m, uint64_t p, uint64_t n);
/* FLOPs of one decode step of a batch of b sequences, each with ctx tokens already in its
 * KV cache: b (2 P_layers + 2 vocab hidden + 4 L H d_h (ctx + 1)). */
double ikv_decode_flops(const ikv_model_spec *m, uint32_t b, uint64_t ctx);

/* ---- times (seconds, on the roofline of cfg) ---------------------------------------------- */

/* Bytes a prefill of n after p moves through HBM: the weights once, the prefix KV read, the
 * new KV written (at most attn_window tokens of it when the model has a window). */
double ikv_prefill_bytes(const ikv_model_spec *m, uint64_t p, uint64_t n);
/* Seconds of a prefill of n new tokens after a cached prefix of p (0 when n = 0). */
double ikv_prefill_time(const ikv_cost_cfg *cfg, uint64_t p, uint64_t n);
/* Bytes one decode step of batch b at context ctx moves: the weights once, every sequence's
 * KV read, one new token of KV written per sequence. */
double ikv_decode_bytes(const ikv_model_spec *m, uint32_t b, uint64_t ctx);
/* Seconds of one decode step of batch b at context ctx, i.e. the time per output token each
 * sequence sees. */
double ikv_decode_time(const ikv_cost_cfg *cfg, uint32_t b, uint64_t ctx);
/* Batch size at which a decode step turns compute-bound at context ctx (the roofline ridge
 * point); a batch below it is bandwidth-bound. */
double ikv_decode_ridge_batch(const ikv_cost_cfg *cfg, uint64_t ctx);

/* Seconds to bring `blocks` KV blocks of block_tokens tokens from tier t into HBM: a fixed
 * access latency plus bytes over the tier's bandwidth (times cfg->link for the off-device
 * tiers). With gpus > 1 each GPU loads its shard over its own link in parallel. 0 blocks: 0. */
double ikv_load_time(const ikv_cost_cfg *cfg, ikv_tier t, uint64_t blocks, uint32_t block_tokens);
/* The fixed per-access latency of a tier, seconds (documented in cost.c). */
double ikv_tier_latency(ikv_tier t);

/* ---- the cache's recompute-cost callback --------------------------------------------------- */

/* Context for ikv_cost_block_flops / ikv_cost_block_seconds. Callers own it. */
typedef struct ikv_cost_block_ctx {
    const ikv_model_spec *model;
    const ikv_hw_spec *hw; /* used by ikv_cost_block_seconds only */
    uint32_t block_tokens; /* tokens per full block; the depth unit */
} ikv_cost_block_ctx;

/* FLOPs to recompute the KV of one block of `ntokens` tokens that sits at block depth `depth`
 * (0 = first block, so the prefix before it is depth * block_tokens tokens). ctx points to an
 * ikv_cost_block_ctx. Matches ikv_cost_fn in cache.h. Does not allocate. */
double ikv_cost_block_flops(void *ctx, uint32_t depth, uint32_t ntokens);
/* The same in seconds on one GPU of ctx->hw at the default MFU/MBU (prefill roofline without
 * the weight read, which a batched prefill shares among blocks). */
double ikv_cost_block_seconds(void *ctx, uint32_t depth, uint32_t ntokens);

#ifdef __cplusplus
}
#endif
#endif
