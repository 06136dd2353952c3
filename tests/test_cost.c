/*
 * Tests for cost/: the catalogs reproduce published figures, and the roofline functions agree
 * with first-principles bounds worked out by hand (see the comment on each test).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "isokv/base.h"
#include "isokv/cost.h"

static const ikv_model_spec *model(const char *name) {
    const ikv_model_spec *m = NULL;
    assert_int_equal(ikv_model_lookup(name, &m), 0);
    assert_non_null(m);
    return m;
}

static const ikv_hw_spec *hw(const char *name) {
    const ikv_hw_spec *h = NULL;
    assert_int_equal(ikv_hw_lookup(name, &h), 0);
    assert_non_null(h);
    return h;
}

static void assert_near(double got, double want, double rel) {
    if (fabs(got - want) > rel * fabs(want))
        fail_msg("got %.6g, want %.6g (relative tolerance %g)", got, want, rel);
}

/* The shapes reproduce each published parameter count (matrices + embedding + LM head),
 * within 0.5% (norms and biases are left out). */
static void test_shapes_match_param_count(void **st) {
    (void)st;
    assert_int_equal(ikv_model_count(), 3);
    for (size_t i = 0; i < ikv_model_count(); i++) {
        const ikv_model_spec *m = ikv_model_at(i);
        double emb = (m->tied_embeddings ? 1.0 : 2.0) * m->vocab * (double)m->hidden;
        assert_near(ikv_model_layer_params(m) + emb, m->params, 0.005);
        assert_int_equal(m->heads * m->head_dim, m->hidden);
    }
    assert_null(ikv_model_at(ikv_model_count()));
    assert_null(ikv_hw_at(ikv_hw_count()));
}

/* llama3-70b in BF16 is about 141 GB of weights; KV is 2*80*8*128*2 = 327,680 B per token. */
static void test_sizes(void **st) {
    (void)st;
    const ikv_model_spec *m = model("llama3-70b");
    assert_near(ikv_model_weight_bytes(m), 141e9, 0.01);
    assert_true(ikv_kv_bytes_per_token(m) == 327680.0);
    assert_true(ikv_kv_bytes_per_block(m, 16) == 16 * 327680.0);
    assert_true(ikv_kv_bytes_per_token(model("llama3-8b")) == 131072.0);
    assert_true(ikv_kv_bytes_per_token(model("qwen2-72b")) == 327680.0);
    assert_near(ikv_model_weight_bytes(model("llama3-8b")), 16.06e9, 0.01);
}

/* Decode at batch 1 reads every weight once per token: at full bandwidth 141.1 GB over
 * 3.35 TB/s is 42.1 ms on an H100 and over 4.8 TB/s 29.4 ms on an H200. No efficiency can beat
 * it, and the default efficiency (mbu 0.8) is slower. */
static void test_decode_bandwidth_bound(void **st) {
    (void)st;
    const ikv_model_spec *m = model("llama3-70b");
    ikv_cost_cfg c;
    ikv_cost_cfg_init(&c, m, hw("h100"));
    c.mfu = c.mbu = 1.0;
    double t = ikv_decode_time(&c, 1, 0);
    assert_true(t >= 0.042);
    assert_near(t, 141.1e9 / 3.35e12, 0.01);
    ikv_cost_cfg_init(&c, m, hw("h200"));
    c.mfu = c.mbu = 1.0;
    assert_near(ikv_decode_time(&c, 1, 0), 0.0294, 0.01);
    ikv_cost_cfg_init(&c, m, hw("h100"));
    assert_true(ikv_decode_time(&c, 1, 0) > 0.042 / IKV_COST_DEFAULT_MBU * 0.99);
    /* the KV of a long context adds to the bytes: 8192 tokens = 2.7 GB more */
    assert_true(ikv_decode_time(&c, 1, 8192) > ikv_decode_time(&c, 1, 0));
    /* two GPUs (ideal split) halve it */
    double t1 = ikv_decode_time(&c, 1, 1024);
    c.gpus = 2;
    assert_near(ikv_decode_time(&c, 1, 1024), t1 / 2, 1e-12);
    assert_true(ikv_decode_time(&c, 0, 1024) == 0);
}

/* At small batch a decode step is bandwidth-bound (time barely moves with b); past the ridge
 * batch it is compute-bound and grows linearly in b. */
static void test_decode_ridge(void **st) {
    (void)st;
    ikv_cost_cfg c;
    ikv_cost_cfg_init(&c, model("llama3-70b"), hw("h100"));
    double r = ikv_decode_ridge_batch(&c, 0);
    /* ridge of H100 at 0.5/0.8 efficiency: (989.5e12*0.5)/(3.35e12*0.8) = 185 FLOP/B; one
     * sequence does 2 FLOPs per weight of 2 bytes, so b ~ 185 */
    assert_true(r > 150 && r < 220);
    uint32_t lo = (uint32_t)floor(r), hi = (uint32_t)ceil(r) + 1;
    double bm = c.hw->hbm_bw * c.mbu, fc = c.hw->flops * c.mfu;
    assert_near(ikv_decode_time(&c, lo, 0), ikv_decode_bytes(c.model, lo, 0) / bm, 1e-12);
    assert_near(ikv_decode_time(&c, hi, 0), ikv_decode_flops(c.model, hi, 0) / fc, 1e-12);
    /* batch 8 costs almost the same step time as batch 1 (shared weight read) */
    assert_true(ikv_decode_time(&c, 8, 0) < 1.01 * ikv_decode_time(&c, 1, 0));
    /* at a very long context the KV bytes per sequence outweigh its FLOPs: never compute-bound */
    assert_true(isinf(ikv_decode_ridge_batch(&c, 100000000)));
}

/* For a short prompt the attention term is negligible and prefill FLOPs are ~2 * N * n with N
 * the non-embedding parameters (Kaplan et al. 2020's convention: the embedding lookup is not a
 * matmul and the LM head runs for the last token only). For the 70B-class models the
 * embeddings are 3% of the parameters, so 2 * params * n is within 3.5% too; for llama3-8b they
 * are 13%. */
static void test_prefill_flops_short(void **st) {
    (void)st;
    for (size_t i = 0; i < ikv_model_count(); i++) {
        const ikv_model_spec *m = ikv_model_at(i);
        double emb = 2.0 * m->vocab * (double)m->hidden;
        assert_near(ikv_prefill_flops(m, 0, 256), 2 * (m->params - emb) * 256, 0.01);
    }
    assert_near(ikv_prefill_flops(model("llama3-70b"), 0, 256), 2 * 70.55e9 * 256, 0.035);
    assert_near(ikv_prefill_flops(model("qwen2-72b"), 0, 256), 2 * 72.71e9 * 256, 0.035);
    assert_true(ikv_prefill_flops(model("llama3-8b"), 100, 0) == 0);
    assert_true(ikv_prefill_bytes(model("llama3-8b"), 100, 0) == 0);
}

/* The attention term grows with the cached prefix: each of the n new tokens attends p more
 * keys, 4 L H dh per key (QK^T and AV), so the difference is exactly 4 L H dh n p. */
static void test_attention_grows_with_prefix(void **st) {
    (void)st;
    const ikv_model_spec *m = model("llama3-70b");
    uint64_t n = 128, p = 8192;
    double d = ikv_prefill_flops(m, p, n) - ikv_prefill_flops(m, 0, n);
    assert_near(d, 4.0 * 80 * 64 * 128 * (double)n * (double)p, 1e-9);
    assert_true(ikv_attn_flops(m, 2 * p, n) > ikv_attn_flops(m, p, n));
    /* causal self-attention within the new tokens: n(n+1)/2 pairs */
    assert_near(ikv_attn_flops(m, 0, 4), 4.0 * 80 * 64 * 128 * 10, 1e-12);
}

/* Computing a prompt block by block (each block after the previous ones) costs exactly what
 * computing it at once costs: the per-block recompute cost adds up. */
static void test_block_cost_additive(void **st) {
    (void)st;
    ikv_cost_block_ctx ctx = {model("llama3-8b"), hw("a100"), 16};
    double sum = 0;
    for (uint32_t d = 0; d < 64; d++)
        sum += ikv_cost_block_flops(&ctx, d, 16);
    assert_near(sum, ikv_kv_flops(ctx.model, 0, 64 * 16), 1e-12);
    /* deeper blocks cost more, a partial block less */
    assert_true(ikv_cost_block_flops(&ctx, 10, 16) > ikv_cost_block_flops(&ctx, 9, 16));
    assert_true(ikv_cost_block_flops(&ctx, 10, 8) < ikv_cost_block_flops(&ctx, 10, 16));
    double s = ikv_cost_block_seconds(&ctx, 0, 16);
    assert_near(s, ikv_kv_flops(ctx.model, 0, 16) / (312e12 * IKV_COST_DEFAULT_MFU), 1e-12);
    assert_true(ikv_cost_block_seconds(&ctx, 4000, 16) > s);
}

/* A long prefill is compute-bound: 70B, 2048 tokens is ~2.9e14 FLOPs, 0.58 s on one H100
 * at 50% MFU; the weight read (42 ms) hides under it. */
static void test_prefill_time(void **st) {
    (void)st;
    ikv_cost_cfg c;
    ikv_cost_cfg_init(&c, model("llama3-70b"), hw("h100"));
    assert_int_equal(ikv_cost_cfg_check(&c), 0);
    double f = ikv_prefill_flops(c.model, 0, 2048);
    assert_near(f, 2.86e14, 0.02);
    double t = ikv_prefill_time(&c, 0, 2048);
    assert_near(t, f / (989.5e12 * 0.5), 1e-12);
    /* a one-token prefill is bandwidth-bound like a decode step */
    assert_near(ikv_prefill_time(&c, 0, 1), ikv_prefill_bytes(c.model, 0, 1) / (3.35e12 * 0.8),
                1e-12);
    /* a cached prefix saves most of the time */
    assert_true(ikv_prefill_time(&c, 1920, 128) < 0.1 * t);
    assert_true(ikv_prefill_time(&c, 5, 0) == 0);
}

/* Tier loads: bytes over the tier's bandwidth plus a fixed latency; the order of the tiers
 * is the order of their speed. */
static void test_load_time(void **st) {
    (void)st;
    ikv_cost_cfg c;
    ikv_cost_cfg_init(&c, model("llama3-70b"), hw("h100"));
    double bytes = 100 * ikv_kv_bytes_per_block(c.model, 16);
    assert_near(ikv_load_time(&c, IKV_TIER_DRAM, 100, 16),
                ikv_tier_latency(IKV_TIER_DRAM) + bytes / (64e9 * 0.8), 1e-12);
    assert_near(ikv_load_time(&c, IKV_TIER_SSD, 100, 16),
                ikv_tier_latency(IKV_TIER_SSD) + bytes / (7e9 * 0.8), 1e-12);
    assert_near(ikv_load_time(&c, IKV_TIER_REMOTE, 100, 16),
                ikv_tier_latency(IKV_TIER_REMOTE) + bytes / (50e9 * 0.8), 1e-12);
    double h = ikv_load_time(&c, IKV_TIER_HBM, 100, 16);
    assert_true(h < ikv_load_time(&c, IKV_TIER_DRAM, 100, 16));
    assert_true(ikv_load_time(&c, IKV_TIER_DRAM, 100, 16) <
                ikv_load_time(&c, IKV_TIER_SSD, 100, 16));
    assert_true(ikv_load_time(&c, IKV_TIER_SSD, 0, 16) == 0);
    /* loading a 2048-token prefix from DRAM (0.67 GB) beats recomputing it on an H100 */
    assert_true(ikv_load_time(&c, IKV_TIER_DRAM, 128, 16) < ikv_prefill_time(&c, 0, 2048));
    ikv_tier t;
    assert_int_equal(ikv_tier_parse("ssd", &t), 0);
    assert_int_equal(t, IKV_TIER_SSD);
    assert_string_equal(ikv_tier_name(IKV_TIER_REMOTE), "remote");
    assert_int_equal(ikv_tier_parse("tape", &t), IKV_EINVAL);
    assert_non_null(strstr(ikv_errdetail(), "tape"));
}

/* Unknown names are errors that name the culprit and list what is known. */
static void test_unknown_names(void **st) {
    (void)st;
    const ikv_model_spec *m = NULL;
    const ikv_hw_spec *h = NULL;
    assert_int_equal(ikv_model_lookup("gpt-5", &m), IKV_EMODEL);
    assert_null(m);
    assert_non_null(strstr(ikv_errdetail(), "gpt-5"));
    assert_non_null(strstr(ikv_errdetail(), "llama3-70b"));
    assert_int_equal(ikv_hw_lookup("tpu-v5", &h), IKV_EHW);
    assert_null(h);
    assert_non_null(strstr(ikv_errdetail(), "tpu-v5"));
    assert_non_null(strstr(ikv_errdetail(), "h200"));
    assert_int_equal(ikv_model_lookup(NULL, &m), IKV_EMODEL);
    assert_int_equal(ikv_hw_lookup("H100", &h), IKV_EHW); /* case-sensitive */
}

static void test_names_and_check(void **st) {
    (void)st;
    char buf[64];
    size_t need = ikv_model_names(buf, sizeof buf);
    assert_string_equal(buf, "llama3-8b, llama3-70b, qwen2-72b");
    assert_int_equal(need, strlen(buf));
    char small[8];
    assert_int_equal(ikv_hw_names(small, sizeof small), strlen("a100, h100, h200"));
    assert_int_equal(strlen(small), 7);
    ikv_cost_cfg c;
    ikv_cost_cfg_init(&c, model("llama3-8b"), hw("a100"));
    c.mfu = 0;
    assert_int_equal(ikv_cost_cfg_check(&c), IKV_ERANGE);
    assert_non_null(strstr(ikv_errdetail(), "mfu"));
    c.mfu = 0.5;
    c.mbu = 1.5;
    assert_int_equal(ikv_cost_cfg_check(&c), IKV_ERANGE);
    c.mbu = 0.8;
    c.gpus = 0;
    assert_int_equal(ikv_cost_cfg_check(&c), IKV_ERANGE);
    c.gpus = 1;
    c.hw = NULL;
    assert_int_equal(ikv_cost_cfg_check(&c), IKV_EINVAL);
}

/* The optional fields of a model spec: KV element width scales KV bytes; an attention window
 * gives each new token min(p + i, w) keys (checked against the sum done token by token) and
 * caps the KV a sequence keeps; a window no shorter than the context changes nothing. */
static void test_kv_width_and_window(void **st) {
    (void)st;
    ikv_model_spec m = *model("llama3-8b");
    double kv2 = ikv_kv_bytes_per_token(&m);
    m.kv_bytes_per_elem = 1;
    assert_true(ikv_kv_bytes_per_token(&m) * 2 == kv2);
    m.kv_bytes_per_elem = 4;
    assert_true(ikv_kv_bytes_per_token(&m) == kv2 * 2);
    m.kv_bytes_per_elem = 0;
    const uint64_t cases[][2] = {{0, 10},    {0, 700},  {100, 50}, {300, 400},
                                 {600, 300}, {1000, 7}, {0, 512},  {512, 1}};
    for (uint32_t w = 1; w <= 1024; w = w * 4 + 1) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            uint64_t p = cases[c][0], n = cases[c][1];
            double keys = 0;
            for (uint64_t i = 1; i <= n; i++)
                keys += (double)(p + i < w ? p + i : w);
            m.attn_window = w;
            assert_near(ikv_attn_flops(&m, p, n), 4.0 * m.layers * m.heads * m.head_dim * keys,
                        1e-12);
            m.attn_window = 0;
        }
        m.attn_window = w;
        double kvt = ikv_kv_bytes_per_token(&m);
        assert_near(ikv_decode_bytes(&m, 2, 5000) - ikv_model_weight_bytes(&m), 2.0 * w * kvt,
                    1e-12);
        m.attn_window = 0;
    }
    ikv_model_spec full = *model("llama3-8b");
    m.attn_window = 4096;
    assert_true(ikv_prefill_flops(&m, 1000, 2000) == ikv_prefill_flops(&full, 1000, 2000));
    assert_true(ikv_decode_flops(&m, 4, 4000) == ikv_decode_flops(&full, 4, 4000));
    assert_true(ikv_decode_flops(&m, 4, 9000) < ikv_decode_flops(&full, 4, 9000));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes_match_param_count),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_decode_bandwidth_bound),
        cmocka_unit_test(test_decode_ridge),
        cmocka_unit_test(test_prefill_flops_short),
        cmocka_unit_test(test_attention_grows_with_prefix),
        cmocka_unit_test(test_block_cost_additive),
        cmocka_unit_test(test_prefill_time),
        cmocka_unit_test(test_load_time),
        cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_names_and_check),
        cmocka_unit_test(test_kv_width_and_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
