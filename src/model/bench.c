/*
 * The engine benchmark behind `isokv bench engine` and bench/bench_engine: everything it
 * reports is measured on this machine, wall clock.
 *
 *   sgemm peak      the better of: OpenBLAS on P threads, square 1536^3 sgemm; and P threads of
 *                   the engine's worker pool each running a single-threaded 1536^3 sgemm of
 *                   its own at once (the way the engine uses BLAS); best of 3 calls each
 *   read bandwidth  the best of: each of P pool threads streaming its share of 256 MiB with a
 *                   4-lane SSE2 sum (the engine's gemv loop without the multiply); the same
 *                   shares through single-threaded cblas_sasum; cblas_sasum on P OpenBLAS
 *                   threads over the whole buffer (3 passes each). The best is the fairest
 *                   bound: the decode bound only gets harder to meet as it rises
 *   TTFT cold       prefill of P shared (public) + Q private tokens that miss the cache
 *   TTFT warm       another tenant's P + Q: the P-token prefix comes from the cache
 *   prefill rate    cold tokens / cold TTFT; GFLOP/s counts useful FLOPs only (2 per
 *                   multiply-add of every weight per token, causal attention QK^T and PV,
 *                   the classifier for the last row), not the padding rows of the tiles
 *   decode rate     D greedy decode steps after the warm prefill; its bound is the measured
 *                   read bandwidth over the bytes one step reads (the weights it uses and the
 *                   KV of its context), and applies only when those bytes exceed the
 *                   last-level cache: otherwise the steps read cache and the bound is reported
 *                   as not applying, never as a percentage above 100
 *   TTFT from tier  with lower tiers: a pool that holds one request's blocks, a request with
 *                   another prefix that pushes the first prefix into the tiers, then a third
 *                   tenant's P + Q: its prefix loaded from the tiers (or recomputed, where the
 *                   engine measured that to be cheaper; both counted)
 *
 * With `repeat` R > 1 the whole set (probes and requests, in that order, each repetition with
 * a fresh random prefix, so its cold request misses) runs R times per thread count and each
 * figure is the best of the R (the machine is shared: other work only ever slows a run down);
 * the ratios are of those bests. The engine's worker pool has P threads (the engine sets
 * OpenBLAS to one thread); the OpenBLAS-threaded probes set it to P first. The model is built in
 * memory with random weights (no file). Library code: it returns numbers; the caller prints
 * them.
 */
#include "internal.h"

#include "blas.h"
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SGEMM_N 1536

/* What the probe regions share: per-thread matrices or buffer shares, and results. */
typedef struct probe {
    float *a[256], *b[256], *c[256]; /* sgemm: each thread's own n x n matrices */
    int n;
    const float *buf; /* read: the buffer, in P shares */
    size_t nf;
    int use_sasum;
    double sink[256];
} probe;

static void sgemm_task(void *vp, int t, int P) {
    probe *p = vp;
    (void)P;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, p->n, p->n, p->n, 1.0f, p->a[t], p->n,
                p->b[t], p->n, 0.0f, p->c[t], p->n);
}

/* Sum of n floats with four 4-lane accumulators: a streaming read. */
static float stream_sum(const float *x, size_t n) {
    size_t i = 0;
    float r = 0.0f;
#if defined(__SSE2__)
    __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm_add_ps(s0, _mm_loadu_ps(x + i));
        s1 = _mm_add_ps(s1, _mm_loadu_ps(x + i + 4));
        s2 = _mm_add_ps(s2, _mm_loadu_ps(x + i + 8));
        s3 = _mm_add_ps(s3, _mm_loadu_ps(x + i + 12));
    }
    float l[4];
    _mm_storeu_ps(l, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
    r = (l[0] + l[1]) + (l[2] + l[3]);
#endif
    for (; i < n; i++)
        r += x[i];
    return r;
}

static void read_task(void *vp, int t, int P) {
    probe *p = vp;
    size_t a = p->nf * (size_t)t / (size_t)P, b = p->nf * (size_t)(t + 1) / (size_t)P;
    p->sink[t] +=
        p->use_sasum ? cblas_sasum((blasint)(b - a), p->buf + a, 1) : stream_sum(p->buf + a, b - a);
}

/* Best sgemm GFLOP/s at P threads (see the top); *how says which way won. */
static double best_sgemm(ikv__pool *pool, int P, const char **how) {
    const int n = SGEMM_N;
    size_t nn = (size_t)n * (size_t)n;
    probe *p = ikv_calloc(1, sizeof *p);
    double best = 0;
    *how = "none";
    if (!p) return 0;
    p->n = n;
    int ok = 1;
    for (int t = 0; t < P && ok; t++) {
        p->a[t] = ikv_malloc(sizeof(float) * nn), p->b[t] = ikv_malloc(sizeof(float) * nn);
        p->c[t] = ikv_malloc(sizeof(float) * nn);
        ok = p->a[t] && p->b[t] && p->c[t];
        for (size_t i = 0; ok && i < nn; i++)
            p->a[t][i] = (float)(i % 13) * 0.01f, p->b[t][i] = (float)(i % 7) * 0.02f;
    }
    const double flop = 2.0 * n * (double)n * n;
    if (ok) {
        /* OpenBLAS's own threads; the first call warms up threads and pages */
        openblas_set_num_threads(P);
        for (int r = 0; r < 4; r++) {
            double t = ikv_now();
            sgemm_task(p, 0, 1);
            t = ikv_now() - t;
            if (r && flop / t / 1e9 > best) best = flop / t / 1e9, *how = "OpenBLAS threads";
        }
        /* P single-threaded calls at once on the pool */
        openblas_set_num_threads(1);
        for (int r = 0; r < 4; r++) {
            double t = ikv_now();
            ikv__pool_run(pool, sgemm_task, p);
            t = ikv_now() - t;
            double g = flop * P / t / 1e9;
            if (r && g > best) best = g, *how = "concurrent 1-thread calls";
        }
    }
    for (int t = 0; t < P; t++)
        ikv_free(p->a[t]), ikv_free(p->b[t]), ikv_free(p->c[t]);
    ikv_free(p);
    return best;
}

/* Best read GB/s at P threads (see the top); *how says which probe won. */
static double best_read_gbs(ikv__pool *pool, int P, const char **how) {
    size_t n = (size_t)64 << 20; /* 64 Mi floats = 256 MiB */
    float *x = ikv_malloc(sizeof(float) * n);
    probe *p = ikv_calloc(1, sizeof *p);
    double best = 0;
    *how = "none";
    if (x && p) {
        for (size_t i = 0; i < n; i++)
            x[i] = 1.0f;
        p->buf = x, p->nf = n;
        static const char *names[] = {"SSE2 sum on the pool", "1-thread sasum on the pool",
                                      "OpenBLAS-threaded sasum"};
        for (int way = 0; way < 3; way++) {
            openblas_set_num_threads(way == 2 ? P : 1);
            for (int r = 0; r < 3; r++) {
                double t = ikv_now();
                if (way < 2) {
                    p->use_sasum = way;
                    ikv__pool_run(pool, read_task, p);
                } else {
                    p->sink[0] += cblas_sasum((blasint)n, x, 1);
                }
                t = ikv_now() - t;
                double g = (double)n * 4 / t / 1e9;
                if (g > best) best = g, *how = names[way];
            }
        }
        openblas_set_num_threads(1);
    }
    ikv_free(p);
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

/* The largest cache level this machine reports (L3, else L2), bytes; 0 if unknown. */
static uint64_t llc_bytes(void) {
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return v > 0 ? (uint64_t)v : 0;
}

int ikv_engine_bench(const ikv_engine_bench_options *o, ikv_engine_bench_result *r) {
    memset(r, 0, sizeof *r);
    int rc = ikv__blas_load();
    if (!rc) rc = ikv_model_config_named(o->config, &r->cfg);
    if (rc) return rc;
    r->prefix = o->prefix, r->suffix = o->suffix, r->decode = o->decode;
    r->llc_bytes = llc_bytes();
    r->repeat = o->repeat ? o->repeat : 1;
    {
        ikv_engine_options d;
        ikv_engine_options_default(&d);
        r->tile = o->tile ? o->tile : d.tile;
        r->group = o->group ? o->group : d.group;
    }
    r->cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = (size_t)o->prefix + o->suffix;
    if (o->suffix == 0) return ikv_error(IKV_EINVAL, "bench: need a suffix of at least one token");
    if (o->prefix == 0) return ikv_error(IKV_EINVAL, "bench: need a prefix of at least one token");
    if (o->decode == 0) return ikv_error(IKV_EINVAL, "bench: need at least one decode step");
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
    double flops = prefill_flops(&r->cfg, n);
    for (int ti = 0; ti < 2 && o->threads[ti] > 0; ti++) {
        ikv_engine_bench_row *row = &r->rows[r->n_rows];
        memset(row, 0, sizeof *row);
        row->threads = o->threads[ti];
        ikv_engine_options eo;
        ikv_engine_options_default(&eo);
        eo.threads = row->threads;
        eo.tile = r->tile;
        eo.group = r->group;
        ikv_store *st[IKV_MAX_TIERS - 1] = {0};
        if (o->n_tiers) {
            /* the pool: the private reserve plus one request's full blocks and a little */
            uint64_t bb = ikv_model_kv_bytes_per_token(&r->cfg) * eo.block_tokens;
            uint64_t maxb = ((uint64_t)r->cfg.seq_len + eo.block_tokens - 1) / eo.block_tokens;
            eo.kv_mem = (maxb + n / eo.block_tokens + 2) * bb;
            eo.tier_dtype = o->tier_dtype;
            ikv_store_params sp;
            ikv_engine_store_params(m, &eo, &sp);
            for (size_t t = 0; t < o->n_tiers && t < IKV_MAX_TIERS - 1 && !rc; t++)
                if (!(rc = ikv_store_open(o->tiers[t], &sp, &st[t]))) eo.tiers[t] = st[t];
            eo.n_tiers = o->n_tiers;
        }
        ikv_engine *e = NULL;
        if (rc || (rc = ikv_engine_create(m, &eo, &e))) {
            for (size_t t = 0; t < IKV_MAX_TIERS - 1; t++) ikv_store_close(st[t]);
            goto out;
        }
        row->group = e->G;
        row->trim = e->Q > 0;
        row->pitch = e->TP;
        for (uint32_t rep = 0; rep < r->repeat && !rc; rep++) {
            const char *how_p, *how_r;
            double peak = best_sgemm(e->pool, row->threads, &how_p);
            double gbs = best_read_gbs(e->pool, row->threads, &how_r);
            if (peak > row->sgemm_peak_gflops) row->sgemm_peak_gflops = peak, row->peak_how = how_p;
            if (gbs > row->read_gbs) row->read_gbs = gbs, row->read_how = how_r;
            openblas_set_num_threads(1); /* as the engine runs it */
            /* a fresh prefix each repetition: the cold request misses */
            uint64_t seed = o->seed + 16 * (uint64_t)rep;
            prompt(a, o->prefix, seed + 1, V);
            memcpy(b, a, sizeof(uint32_t) * o->prefix);
            prompt(a + o->prefix, o->suffix, seed + 2, V);
            prompt(b + o->prefix, o->suffix, seed + 3, V);
            ikv_request ra = {.tokens = a, .n = n, .tenant = "A", .public_tokens = o->prefix};
            ikv_request rb = {.tokens = b, .n = n, .tenant = "B", .public_tokens = o->prefix};
            ikv_seq *s;
            ikv_prefill_info ia, ib;
            if ((rc = ikv_engine_begin(e, &ra, &s, &ia))) break;
            ikv_engine_end(e, s);
            if ((rc = ikv_engine_begin(e, &rb, &s, &ib))) break;
            if (ia.cached_tokens != 0) {
                ikv_engine_end(e, s);
                rc = ikv_error(IKV_EINVAL, "bench: the cold request hit the cache");
                break;
            }
            if (!row->ttft_cold_s || ia.seconds < row->ttft_cold_s) row->ttft_cold_s = ia.seconds;
            if (!row->ttft_warm_s || ib.seconds < row->ttft_warm_s) row->ttft_warm_s = ib.seconds;
            row->warm_cached_tokens = ib.cached_tokens;
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
            double dr = o->decode ? (double)o->decode / t : 0;
            if (dr > row->decode_tok_s) row->decode_tok_s = dr;
            if (o->n_tiers && !rc) {
                /* another prefix pushes A's down; tenant C then finds it in the tiers */
                uint32_t *x = ikv_malloc(sizeof(uint32_t) * n);
                if (!x) {
                    rc = ikv_error(IKV_ENOMEM, "bench prompt");
                    break;
                }
                prompt(x, n, seed + 4, V);
                ikv_request rx = {.tokens = x, .n = n, .tenant = "X", .public_tokens = o->prefix};
                ikv_request rcq = {.tokens = b, .n = n, .tenant = "C", .public_tokens = o->prefix};
                ikv_prefill_info ix, ic;
                if (!(rc = ikv_engine_begin(e, &rx, &s, &ix))) {
                    ikv_engine_end(e, s);
                    if (!(rc = ikv_engine_begin(e, &rcq, &s, &ic))) {
                        ikv_engine_end(e, s);
                        if (!row->ttft_tier_s || ic.seconds < row->ttft_tier_s) {
                            row->ttft_tier_s = ic.seconds;
                            row->tier_loaded_tokens = ic.cached_tokens - ic.tier_tokens[0];
                            row->tier_recomputed_tokens = ic.recomputed_tier_tokens;
                        }
                    }
                }
                ikv_free(x);
            }
        }
        ikv_engine_destroy(e);
        for (size_t t = 0; t < IKV_MAX_TIERS - 1; t++) ikv_store_close(st[t]);
        if (rc) goto out;
        row->prefill_tok_s = (double)n / row->ttft_cold_s;
        row->prefill_gflops = flops / row->ttft_cold_s / 1e9;
        /* what a step reads: the weights, and K and V of every earlier position (n + d at
         * step d: n + D/2 on average); when that fits in the last-level cache the steps run
         * from cache and a memory-bandwidth bound says nothing (a 40M-parameter model on a
         * 480 MB L3 read "222%" of it) */
        row->step_bytes =
            (double)ikv_model_decode_bytes(&r->cfg) +
            (double)ikv_model_kv_bytes_per_token(&r->cfg) * ((double)n + (double)o->decode / 2);
        row->bound_applies = !(r->llc_bytes && row->step_bytes <= (double)r->llc_bytes);
        row->decode_bound_tok_s = row->bound_applies ? row->read_gbs * 1e9 / row->step_bytes : 0;
        r->n_rows++;
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
                "\"prefix\": %u, \"suffix\": %u, \"decode\": %u, \"repeat\": %u, \"tile\": %u, "
                "\"group\": %u, \"rows\": [",
                r->cores, (int)c->dim, (int)c->hidden_dim, (int)c->n_layers, (int)c->n_heads,
                (int)c->n_kv_heads, (int)c->vocab_size, (int)c->seq_len,
                (unsigned long long)ikv_model_params(c), r->prefix, r->suffix, r->decode, r->repeat,
                r->tile, r->group);
        for (size_t i = 0; i < r->n_rows; i++) {
            const ikv_engine_bench_row *w = &r->rows[i];
            char bound[32] = "null", over[32] = "null";
            if (w->bound_applies) {
                snprintf(bound, sizeof bound, "%.2f", w->decode_bound_tok_s);
                snprintf(over, sizeof over, "%.4f", w->decode_tok_s / w->decode_bound_tok_s);
            }
            fprintf(
                f,
                "%s{\"threads\": %d, \"group\": %u, \"trim\": %d, \"pitch\": %u, "
                "\"ttft_cold_s\": %.6f, "
                "\"ttft_warm_s\": %.6f, "
                "\"warm_over_cold\": %.5f, "
                "\"warm_cached_tokens\": %zu, \"prefill_tok_s\": %.1f, \"prefill_gflops\": %.2f, "
                "\"sgemm_peak_gflops\": %.2f, \"prefill_over_peak\": %.4f, \"decode_tok_s\": %.2f, "
                "\"read_gbs\": %.2f, \"step_bytes\": %.0f, \"bound_applies\": %s, "
                "\"decode_bound_tok_s\": %s, \"decode_over_bound\": %s, "
                "\"sgemm_peak_by\": \"%s\", \"read_by\": \"%s\", \"ttft_tier_s\": %.6f, "
                "\"tier_loaded_tokens\": %zu, \"tier_recomputed_tokens\": %zu}",
                i ? ", " : "", w->threads, w->group, w->trim, w->pitch, w->ttft_cold_s,
                w->ttft_warm_s, w->ttft_warm_s / w->ttft_cold_s, w->warm_cached_tokens,
                w->prefill_tok_s, w->prefill_gflops, w->sgemm_peak_gflops,
                w->prefill_gflops / w->sgemm_peak_gflops, w->decode_tok_s, w->read_gbs,
                w->step_bytes, w->bound_applies ? "true" : "false", bound, over, w->peak_how,
                w->read_how, w->ttft_tier_s, w->tier_loaded_tokens, w->tier_recomputed_tokens);
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
            "request: %u-token shared public prefix + %u-token private suffix; %u decode steps; "
            "prefill tiles of %u rows, projection calls of up to %u tiles; each figure the best "
            "of %u repetition(s)\n",
            r->prefix, r->suffix, r->decode, r->tile, r->group, r->repeat);
    for (size_t i = 0; i < r->n_rows; i++) {
        const ikv_engine_bench_row *w = &r->rows[i];
        fprintf(f, "threads %d (projection calls of %u tile(s) of %u rows%s):\n", w->threads,
                w->group, w->pitch, w->trim ? ", a tile alone on its computed rows" : "");
        fprintf(
            f,
            "  TTFT cold %.1f ms, warm %.1f ms (%zu tokens from the cache): warm/cold = 1/%.1f\n",
            w->ttft_cold_s * 1e3, w->ttft_warm_s * 1e3, w->warm_cached_tokens,
            w->ttft_cold_s / w->ttft_warm_s);
        fprintf(f,
                "  prefill %.0f tok/s, %.1f GFLOP/s useful = %.0f%% of the measured sgemm peak "
                "%.1f GFLOP/s (%s)\n",
                w->prefill_tok_s, w->prefill_gflops, 100 * w->prefill_gflops / w->sgemm_peak_gflops,
                w->sgemm_peak_gflops, w->peak_how);
        if (!w->bound_applies)
            fprintf(f,
                    "  decode %.1f tok/s; no bandwidth bound applies: the %.1f MB a step reads "
                    "(weights + KV) fit in the %.0f MB last-level cache, so steps read cache, "
                    "not memory\n",
                    w->decode_tok_s, w->step_bytes / 1e6, (double)r->llc_bytes / 1e6);
        else
            fprintf(f,
                    "  decode %.1f tok/s = %.0f%% of the bandwidth bound %.1f tok/s (%.1f GB/s "
                    "measured read, %s; %.1f MB per step: %.1f MB of weights + KV)%s\n",
                    w->decode_tok_s, 100 * w->decode_tok_s / w->decode_bound_tok_s,
                    w->decode_bound_tok_s, w->read_gbs, w->read_how, w->step_bytes / 1e6,
                    (double)ikv_model_decode_bytes(c) / 1e6,
                    w->decode_tok_s > w->decode_bound_tok_s
                        ? " (above the bound: caches hold part of what a step reads)"
                        : "");
        if (w->ttft_tier_s > 0)
            fprintf(f,
                    "  TTFT with the prefix in the lower tiers %.1f ms (%zu tokens loaded, %zu "
                    "recomputed as cheaper): tier/cold = 1/%.1f\n",
                    w->ttft_tier_s * 1e3, w->tier_loaded_tokens, w->tier_recomputed_tokens,
                    w->ttft_cold_s / w->ttft_tier_s);
    }
}
