/*
 * The engine benchmark behind `isokv bench engine` and bench/bench_engine: everything it
 * reports is measured on this machine, wall clock.
 *
 *   sgemm peak      best of 3 square 1536^3 sgemm calls (OpenBLAS) at the thread count
 *   read bandwidth  best of 3 cblas_sasum passes over 256 MiB (a streaming read)
 *   TTFT cold       prefill of P shared (public) + Q private tokens on an empty cache
 *   TTFT warm       another tenant's P + Q: the P-token prefix comes from the cache
 *   prefill rate    cold tokens / cold TTFT; GFLOP/s counts useful FLOPs only (2 per
 *                   multiply-add of every weight per token, causal attention QK^T and PV,
 *                   the classifier for the last row), not the padding rows of the tiles
 *   decode rate     D greedy decode steps after the warm prefill; its bound is the measured
 *                   read bandwidth over the bytes of weights one step reads
 *
 * The model is built in memory with random weights (no file). Thread counts are set with
 * openblas_set_num_threads. Library code: it returns numbers; the caller prints them.
 */
#include "internal.h"

#include <cblas.h>
#include <string.h>
#include <unistd.h>

static double best_sgemm(int n) {
    size_t nn = (size_t)n * (size_t)n;
    float *a = ikv_malloc(sizeof(float) * nn), *b = ikv_malloc(sizeof(float) * nn),
          *c = ikv_malloc(sizeof(float) * nn);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < nn; i++)
            a[i] = (float)(i % 13) * 0.01f, b[i] = (float)(i % 7) * 0.02f;
        for (int r = 0; r < 4; r++) {
            double t = ikv_now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                        c, n);
            t = ikv_now() - t;
            double g = 2.0 * n * (double)n * n / t / 1e9;
            if (r && g > best) best = g; /* the first call warms up threads and pages */
        }
    }
    ikv_free(a), ikv_free(b), ikv_free(c);
    return best;
}

static double best_read_gbs(void) {
    size_t n = (size_t)64 << 20; /* 64 Mi floats = 256 MiB */
    float *x = ikv_malloc(sizeof(float) * n);
    if (!x) return 0;
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f;
    double best = 0;
    volatile float sink = 0;
    for (int r = 0; r < 3; r++) {
        double t = ikv_now();
        sink += cblas_sasum((blasint)n, x, 1);
        t = ikv_now() - t;
        double g = (double)n * 4 / t / 1e9;
        if (g > best) best = g;
    }
    (void)sink;
    ikv_free(x);
    return best;
}

/* Useful FLOPs of a prefill of positions [0, n) with logits for the last row only. */
static double prefill_flops(const ikv_model_config *c, size_t n) {
    double d = c->dim, hid = c->hidden_dim, hd = (double)(c->dim / c->n_heads);
    double kv = hd * c->n_kv_heads, L = c->n_layers;
    double per_tok = 2.0 * L * (d * d + 2 * kv * d + d * d + 3 * d * hid);
    double pairs = (double)n * ((double)n + 1) / 2; /* causal (query, key) pairs */
    double attn = L * c->n_heads * pairs * hd * 4;
    return per_tok * (double)n + attn + 2.0 * c->vocab_size * d;
}

static void prompt(uint32_t *t, size_t n, uint64_t seed, uint32_t vocab) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
        t[i] = 3 + (uint32_t)((seed >> 33) % (vocab - 3));
    }
}

int ikv_engine_bench(const ikv_engine_bench_options *o, ikv_engine_bench_result *r) {
    memset(r, 0, sizeof *r);
    int rc = ikv_model_config_named(o->config, &r->cfg);
    if (rc) return rc;
    r->prefix = o->prefix, r->suffix = o->suffix, r->decode = o->decode;
    r->cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = (size_t)o->prefix + o->suffix;
    if (o->suffix == 0) return ikv_error(IKV_EINVAL, "bench: need a suffix of at least one token");
    if (n + o->decode > (size_t)r->cfg.seq_len)
        return ikv_error(IKV_ETOOLONG,
                         "bench: %zu prompt + %u decode tokens exceed seq_len %d of '%s'", n,
                         o->decode, (int)r->cfg.seq_len, o->config);
    ikv_model *m;
    if ((rc = ikv_model_random(&r->cfg, o->seed, &m))) return rc;
    uint32_t *a = ikv_malloc(sizeof(uint32_t) * n), *b = ikv_malloc(sizeof(uint32_t) * n);
    if (!a || !b) {
        rc = ikv_error(IKV_ENOMEM, "bench prompts");
        goto out;
    }
    uint32_t V = (uint32_t)r->cfg.vocab_size;
    prompt(a, o->prefix, o->seed + 1, V);
    memcpy(b, a, sizeof(uint32_t) * o->prefix);
    prompt(a + o->prefix, o->suffix, o->seed + 2, V);
    prompt(b + o->prefix, o->suffix, o->seed + 3, V);
    double flops = prefill_flops(&r->cfg, n);
    for (int ti = 0; ti < 2 && o->threads[ti] > 0; ti++) {
        ikv_engine_bench_row *row = &r->rows[r->n_rows];
        row->threads = o->threads[ti];
        openblas_set_num_threads(row->threads);
        row->sgemm_peak_gflops = best_sgemm(1536);
        row->read_gbs = best_read_gbs();
        ikv_engine_options eo;
        ikv_engine_options_default(&eo);
        eo.threads = row->threads;
        ikv_engine *e;
        if ((rc = ikv_engine_create(m, &eo, &e))) goto out;
        ikv_request ra = {.tokens = a, .n = n, .tenant = "A", .public_tokens = o->prefix};
        ikv_request rb = {.tokens = b, .n = n, .tenant = "B", .public_tokens = o->prefix};
        ikv_seq *s;
        ikv_prefill_info ia, ib;
        if ((rc = ikv_engine_begin(e, &ra, &s, &ia))) goto out_e;
        ikv_engine_end(e, s);
        if ((rc = ikv_engine_begin(e, &rb, &s, &ib))) goto out_e;
        row->ttft_cold_s = ia.seconds;
        row->ttft_warm_s = ib.seconds;
        row->warm_cached_tokens = ib.cached_tokens;
        row->prefill_tok_s = (double)n / ia.seconds;
        row->prefill_gflops = flops / ia.seconds / 1e9;
        const float *lg = ikv_seq_logits(s);
        double t = ikv_now();
        for (uint32_t d = 0; d < o->decode && !rc; d++) {
            uint32_t next = 0;
            for (uint32_t i = 1; i < V; i++)
                if (lg[i] > lg[next]) next = i;
            rc = ikv_engine_decode(e, s, next, &lg);
        }
        t = ikv_now() - t;
        ikv_engine_end(e, s);
        row->decode_tok_s = o->decode ? (double)o->decode / t : 0;
        row->decode_bound_tok_s = row->read_gbs * 1e9 / (double)ikv_model_decode_bytes(&r->cfg);
        r->n_rows++;
    out_e:
        ikv_engine_destroy(e);
        if (rc) goto out;
    }
out:
    ikv_free(a), ikv_free(b);
    ikv_model_destroy(m);
    return rc;
}

void ikv_engine_bench_print(const ikv_engine_bench_result *r, FILE *f, int json) {
    const ikv_model_config *c = &r->cfg;
    if (json) {
        fprintf(f,
                "{\"what\": \"measured, wall clock\", \"cores\": %ld, \"model\": {\"dim\": %d, "
                "\"hidden\": %d, "
                "\"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"vocab\": %d, \"seq_len\": %d, "
                "\"params\": %llu}, "
                "\"prefix\": %u, \"suffix\": %u, \"decode\": %u, \"rows\": [",
                r->cores, (int)c->dim, (int)c->hidden_dim, (int)c->n_layers, (int)c->n_heads,
                (int)c->n_kv_heads, (int)c->vocab_size, (int)c->seq_len,
                (unsigned long long)ikv_model_params(c), r->prefix, r->suffix, r->decode);
        for (size_t i = 0; i < r->n_rows; i++) {
            const ikv_engine_bench_row *w = &r->rows[i];
            fprintf(
                f,
                "%s{\"threads\": %d, \"ttft_cold_s\": %.6f, \"ttft_warm_s\": %.6f, "
                "\"warm_over_cold\": %.5f, "
                "\"warm_cached_tokens\": %zu, \"prefill_tok_s\": %.1f, \"prefill_gflops\": %.2f, "
                "\"sgemm_peak_gflops\": %.2f, \"prefill_over_peak\": %.4f, \"decode_tok_s\": %.2f, "
                "\"read_gbs\": %.2f, \"decode_bound_tok_s\": %.2f, \"decode_over_bound\": %.4f}",
                i ? ", " : "", w->threads, w->ttft_cold_s, w->ttft_warm_s,
                w->ttft_warm_s / w->ttft_cold_s, w->warm_cached_tokens, w->prefill_tok_s,
                w->prefill_gflops, w->sgemm_peak_gflops, w->prefill_gflops / w->sgemm_peak_gflops,
                w->decode_tok_s, w->read_gbs, w->decode_bound_tok_s,
                w->decode_tok_s / w->decode_bound_tok_s);
        }
        fprintf(f, "]}\n");
        return;
    }
    fprintf(f,
            "engine benchmark (measured, wall clock, on %ld cores): model dim %d, hidden %d, %d "
            "layers, "
            "%d heads / %d kv heads, vocab %d (%.1fM params, random weights)\n",
            r->cores, (int)c->dim, (int)c->hidden_dim, (int)c->n_layers, (int)c->n_heads,
            (int)c->n_kv_heads, (int)c->vocab_size, (double)ikv_model_params(c) / 1e6);
    fprintf(f,
            "request: %u-token shared public prefix + %u-token private suffix; %u decode steps\n",
            r->prefix, r->suffix, r->decode);
    for (size_t i = 0; i < r->n_rows; i++) {
        const ikv_engine_bench_row *w = &r->rows[i];
        fprintf(f, "threads %d:\n", w->threads);
        fprintf(
            f,
            "  TTFT cold %.1f ms, warm %.1f ms (%zu tokens from the cache): warm/cold = 1/%.1f\n",
            w->ttft_cold_s * 1e3, w->ttft_warm_s * 1e3, w->warm_cached_tokens,
            w->ttft_cold_s / w->ttft_warm_s);
        fprintf(f,
                "  prefill %.0f tok/s, %.1f GFLOP/s useful = %.0f%% of the measured sgemm peak "
                "%.1f GFLOP/s\n",
                w->prefill_tok_s, w->prefill_gflops, 100 * w->prefill_gflops / w->sgemm_peak_gflops,
                w->sgemm_peak_gflops);
        fprintf(f,
                "  decode %.1f tok/s = %.0f%% of the bandwidth bound %.1f tok/s (%.1f GB/s "
                "measured read, %.1f MB "
                "of weights per token)\n",
                w->decode_tok_s, 100 * w->decode_tok_s / w->decode_bound_tok_s,
                w->decode_bound_tok_s, w->read_gbs, (double)ikv_model_decode_bytes(c) / 1e6);
    }
}
