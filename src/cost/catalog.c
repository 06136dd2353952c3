/*
 * The model and hardware catalogs of the cost model, with the source of every number.
 *
 * Models: shapes from each model's published config.json (Hugging Face model cards) and the
 * parameter count from its model card. The shapes reproduce the published count: for
 * llama3-70b, per layer q,o 2*8192*8192 + k,v 2*8192*1024 + MLP 3*8192*28672 = 855.6M, times
 * 80 layers = 68.45B, plus embedding and (untied) LM head 2*128256*8192 = 2.10B: 70.55B.
 *
 * Hardware: one GPU of an 8-GPU SXM server. Peak figures are the vendor datasheets' dense
 * numbers: the datasheets print BF16 tensor throughput "with sparsity" (2x); we halve it.
 * Node resources (NICs, NVMe drives) are given as the share one GPU gets in the matching DGX
 * system. Achieved fractions of these peaks are not in the catalog but in ikv_cost_cfg.
 *
 *   a100: NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB, 2021): BF16 312 TFLOPS dense,
 *         80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (bidirectional; 300 GB/s each way),
 *         PCIe Gen4 x16 64 GB/s bidirectional (32 GB/s each way), 400 W.
 *         DGX A100 datasheet: 8x ConnectX-6 HDR 200 Gb/s compute NICs (25 GB/s per GPU),
 *         4x 3.84 TB U.2 NVMe Gen4 for 8 GPUs (~7 GB/s sequential read each, so ~3.5 GB/s
 *         per GPU).
 *   h100: NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB, 2023): BF16 1,979 TFLOPS with
 *         sparsity, so 989.5 dense, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s bidirectional
 *         (450 GB/s each way), PCIe Gen5 x16 128 GB/s bidirectional (64 each way), 700 W.
 *         DGX H100 datasheet: 8x ConnectX-7 400 Gb/s (NDR) compute NICs, one per GPU
 *         (50 GB/s), 8x 3.84 TB U.2 NVMe data drives, one per GPU (Gen4 class, ~7 GB/s).
 *   h200: NVIDIA H200 Tensor Core GPU datasheet (SXM, 2024): same GH100 die and clocks as
 *         H100 (BF16 989.5 TFLOPS dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s, PCIe
 *         Gen5 128 GB/s bidirectional, up to 700 W. DGX H200: same NIC and drive layout as
 *         DGX H100.
 */
#include "isokv/base.h"
#include "isokv/cost.h"

#include <stdio.h>
#include <string.h>

#define G 1e9
#define T 1e12

static const ikv_model_spec models[] = {
    {.name = "llama3-8b",
     .layers = 32,
     .hidden = 4096,
     .heads = 32,
     .kv_heads = 8,
     .head_dim = 128,
     .ffn = 14336,
     .vocab = 128256,
     .tied_embeddings = 0,
     .params = 8.03e9,
     .bytes_per_param = 2.0,
     .source = "meta-llama/Meta-Llama-3-8B config.json and model card (8.03B)"},
    {.name = "llama3-70b",
     .layers = 80,
     .hidden = 8192,
     .heads = 64,
     .kv_heads = 8,
     .head_dim = 128,
     .ffn = 28672,
     .vocab = 128256,
     .tied_embeddings = 0,
     .params = 70.55e9,
     .bytes_per_param = 2.0,
     .source = "meta-llama/Meta-Llama-3-70B config.json and model card (70.6B)"},
    {.name = "qwen2-72b",
     .layers = 80,
     .hidden = 8192,
     .heads = 64,
     .kv_heads = 8,
     .head_dim = 128,
     .ffn = 29568,
     .vocab = 152064,
     .tied_embeddings = 0,
     .params = 72.71e9,
     .bytes_per_param = 2.0,
     .source = "Qwen/Qwen2-72B config.json and model card (72.7B)"},
};

static const ikv_hw_spec hws[] = {
    {.name = "a100",
     .flops = 312 * T,
     .hbm_bytes = 80 * G,
     .hbm_bw = 2039 * G,
     .host_bw = 32 * G,
     .ssd_bw = 3.5 * G,
     .net_bw = 25 * G,
     .nvlink_bw = 300 * G,
     .tdp_w = 400,
     .source = "NVIDIA A100 datasheet (SXM4 80GB); DGX A100 datasheet"},
    {.name = "h100",
     .flops = 989.5 * T,
     .hbm_bytes = 80 * G,
     .hbm_bw = 3350 * G,
     .host_bw = 64 * G,
     .ssd_bw = 7 * G,
     .net_bw = 50 * G,
     .nvlink_bw = 450 * G,
     .tdp_w = 700,
     .source = "NVIDIA H100 datasheet (SXM5 80GB); DGX H100 datasheet"},
    {.name = "h200",
     .flops = 989.5 * T,
     .hbm_bytes = 141 * G,
     .hbm_bw = 4800 * G,
     .host_bw = 64 * G,
     .ssd_bw = 7 * G,
     .net_bw = 50 * G,
     .nvlink_bw = 450 * G,
     .tdp_w = 700,
     .source = "NVIDIA H200 datasheet (SXM 141GB); DGX H200 datasheet"},
};

#define NMODELS (sizeof models / sizeof models[0])
#define NHWS    (sizeof hws / sizeof hws[0])

size_t ikv_model_count(void) {
    return NMODELS;
}

const ikv_model_spec *ikv_model_at(size_t i) {
    return i < NMODELS ? &models[i] : NULL;
}

size_t ikv_hw_count(void) {
    return NHWS;
}

const ikv_hw_spec *ikv_hw_at(size_t i) {
    return i < NHWS ? &hws[i] : NULL;
}

/* Joins n names taken from an array of structs (stride bytes apart, name first) into buf. */
static size_t join_names(char *buf, size_t cap, const void *base, size_t n, size_t stride) {
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const char *name = *(const char *const *)((const char *)base + i * stride);
        int w = snprintf(cap > len ? buf + len : NULL, cap > len ? cap - len : 0, "%s%s",
                         i ? ", " : "", name);
        len += (size_t)w;
    }
    return len;
}

size_t ikv_model_names(char *buf, size_t cap) {
    return join_names(buf, cap, models, NMODELS, sizeof models[0]);
}

size_t ikv_hw_names(char *buf, size_t cap) {
    return join_names(buf, cap, hws, NHWS, sizeof hws[0]);
}

int ikv_model_lookup(const char *name, const ikv_model_spec **out) {
    for (size_t i = 0; name && i < NMODELS; i++)
        if (!strcmp(models[i].name, name)) {
            *out = &models[i];
            return 0;
        }
    char known[256];
    ikv_model_names(known, sizeof known);
    return ikv_error(IKV_EMODEL, "unknown model '%s' (known: %s)", name ? name : "(null)", known);
}

int ikv_hw_lookup(const char *name, const ikv_hw_spec **out) {
    for (size_t i = 0; name && i < NHWS; i++)
        if (!strcmp(hws[i].name, name)) {
            *out = &hws[i];
            return 0;
        }
    char known[256];
    ikv_hw_names(known, sizeof known);
    return ikv_error(IKV_EHW, "unknown hardware '%s' (known: %s)", name ? name : "(null)", known);
}
