/*
 * `isokv bench engine --chunks`: quality and TTFT of chunk reuse (CacheBlend) against the exact
 * prefill, as the blend ratio r goes from 0 to 1.
 *
 * Setup. Each document is first computed on its own (BOS, the document, one token) and so
 * stored in the chunk store at offset 1, as a retrieval system precomputes its chunks. Each
 * test prompt is [BOS + a private context][the documents in a permuted order][a query]; its
 * reference is the exact prefill without any cache (ikv_engine_begin, no_cache). For each r the
 * prompt runs through ikv_chunks_begin (r < 1: the documents hit at new offsets behind a new
 * context), then both sequences are teacher-forced with the reference's greedy continuation for
 * --next steps: agreement = the fraction of steps (the first token included) where the blended
 * argmax equals the reference's; KL = mean KL(reference || blended) of the next-token
 * distributions over those steps. TTFT: wall time of the request's prefill (the best of
 * --repeat runs), blended against the exact cold prefill, measured on this machine.
 *
 * Models: --model stories260K (the bundled trained model and tokenizer; the documents are
 * short story passages, 3 or 4 per prompt within its 512 positions) or --model CONFIG (random
 * weights, e.g. small; documents of --doc-tokens random tokens behind --context).
 */
#include "cli.h"
#include "isokv/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef IKV_DATA_DIR
#define IKV_DATA_DIR "data"
#endif

static const char *const passages[] = {
    "Lily went to the park with her mom. She saw a big red ball under a tree. She ran to get it "
    "and kicked it high into the sky.",
    "Tom had a little dog named Max. Max liked to run and jump in the garden. One day Max found "
    "a bone and dug a big hole.",
    "There was a small bird who lived in a nest. Every morning the bird sang a happy song for "
    "the sun and the flowers.",
    "Sue wanted to bake a cake for her dad. She got flour, eggs and milk. Her mom helped her mix "
    "it all in a big bowl.",
    "Ben and Anna played in the snow. They made a snowman with a carrot nose and a warm hat. "
    "They laughed and threw snowballs.",
    "A little fish swam in the blue sea. It met a kind turtle who showed it a cave full of "
    "shiny shells and pretty stones.",
};
static const char *const contexts[] = {
    "Sam is a shy boy who likes cats.", "Mia loves to draw pictures of the moon.",
    "Jack is sad because he lost his toy.", "Zoe has a new red bike."};

typedef struct bench {
    const ikv_model *m;
    ikv_engine *e;
    ikv_chunks *c;
    size_t V, next;
    unsigned repeat;
    float *ref, *blend; /* [next][V] */
    uint32_t *cont;     /* [next] the reference's greedy continuation */
} bench;

static uint32_t argmax(const float *x, size_t n) {
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (uint32_t)b;
}

/* KL(p || q) of the softmaxes of logits a (reference) and b. */
static double kl(const float *a, const float *b, size_t n) {
    double ma = a[0], mb = b[0], sa = 0, sb = 0, k = 0;
    for (size_t i = 1; i < n; i++)
        ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (size_t i = 0; i < n; i++)
        sa += exp(a[i] - ma), sb += exp(b[i] - mb);
    for (size_t i = 0; i < n; i++) {
        double lp = a[i] - ma - log(sa), lq = b[i] - mb - log(sb);
        k += exp(lp) * (lp - lq);
    }
    return k > 0 ? k : 0;
}

/* Teacher-forces s with cont[0..next-1) after its prompt, writing every step's logits into
 * out (row 0: the prompt's). Ends s. */
static int follow(bench *b, ikv_seq *s, float *out) {
    memcpy(out, ikv_seq_logits(s), b->V * 4);
    for (size_t t = 1; t < b->next; t++) {
        const float *lg;
        int rc = ikv_engine_decode(b->e, s, b->cont[t - 1], &lg);
        if (rc) return ikv_engine_end(b->e, s), rc;
        memcpy(out + t * b->V, lg, b->V * 4);
    }
    ikv_engine_end(b->e, s);
    return 0;
}

typedef struct point {
    double agree, kl, ttft, ttft_full, reused, recomputed, dev;
    size_t n, full;
} point;

/* One prompt: the reference, then every ratio. */
static int one_prompt(bench *b, const ikv_prompt_seg *g, size_t ng, const double *ratios, size_t nr,
                      float max_dev, point *pts) {
    uint32_t *all = malloc(sizeof(uint32_t) * 8192);
    size_t n = 0;
    for (size_t i = 0; i < ng; i++)
        memcpy(all + n, g[i].tokens, g[i].n * 4), n += g[i].n;
    int rc;
    double best_full = 1e30;
    for (unsigned k = 0; k < b->repeat; k++) {
        ikv_request rq = {.tokens = all, .n = n, .no_cache = 1, .max_new = b->next};
        ikv_seq *s;
        ikv_prefill_info pi;
        if ((rc = ikv_engine_begin(b->e, &rq, &s, &pi))) return free(all), rc;
        best_full = fmin(best_full, pi.seconds);
        if (k + 1 < b->repeat) {
            ikv_engine_end(b->e, s);
            continue;
        }
        /* greedy continuation of the reference, teacher-forced into itself */
        memcpy(b->ref, ikv_seq_logits(s), b->V * 4);
        for (size_t t = 0; t < b->next; t++) {
            b->cont[t] = argmax(b->ref + t * b->V, b->V);
            if (t + 1 < b->next) {
                const float *lg;
                if ((rc = ikv_engine_decode(b->e, s, b->cont[t], &lg)))
                    return ikv_engine_end(b->e, s), free(all), rc;
                memcpy(b->ref + (t + 1) * b->V, lg, b->V * 4);
            }
        }
        ikv_engine_end(b->e, s);
    }
    free(all);
    for (size_t j = 0; j < nr; j++) {
        ikv_blend_request br = {.segs = g,
                                .n_segs = ng,
                                .tenant = "bench",
                                .ratio = (float)ratios[j],
                                .max_dev = max_dev,
                                .max_new = b->next,
                                .no_store = 1,
                                .no_cache = 1};
        double best = 1e30;
        ikv_blend_info bi;
        for (unsigned k = 0; k < b->repeat; k++) {
            ikv_seq *s;
            if ((rc = ikv_chunks_begin(b->c, &br, &s, &bi))) return rc;
            best = fmin(best, bi.seconds);
            if (k + 1 < b->repeat)
                ikv_engine_end(b->e, s);
            else if ((rc = follow(b, s, b->blend)))
                return rc;
        }
        double ag = 0, kk = 0;
        for (size_t t = 0; t < b->next; t++) {
            ag += argmax(b->blend + t * b->V, b->V) == b->cont[t];
            kk += kl(b->ref + t * b->V, b->blend + t * b->V, b->V);
        }
        point *p = &pts[j];
        p->agree += ag / (double)b->next, p->kl += kk / (double)b->next;
        p->ttft += best, p->ttft_full += best_full;
        p->reused += (double)bi.reused_tokens, p->recomputed += (double)bi.recomputed_tokens;
        p->dev += bi.deviation_mean, p->full += (size_t)bi.full, p->n++;
    }
    return 0;
}

/* Stores each document: [BOS][doc][one token], the doc reusable. */
static int prime(bench *b, uint32_t *const *docs, const size_t *nd, size_t ndocs) {
    static const uint32_t bos = IKV_TOK_BOS, one = 13;
    for (size_t i = 0; i < ndocs; i++) {
        ikv_prompt_seg g[3] = {{IKV_PSEG_SYSTEM, &bos, 1, 1, 0, 0},
                               {IKV_PSEG_DOC, docs[i], nd[i], 1, 1, 1},
                               {IKV_PSEG_QUERY, &one, 1, 0, 0, 0}};
        ikv_blend_request br = {.segs = g, .n_segs = 3, .ratio = 1, .max_dev = -1};
        ikv_seq *s;
        ikv_blend_info bi;
        int rc = ikv_chunks_begin(b->c, &br, &s, &bi);
        if (rc) return rc;
        ikv_engine_end(b->e, s);
        if (bi.stored_segments != 1)
            return ikv_error(IKV_ENOMEM, "document %zu did not fit in the chunk store", i);
    }
    return 0;
}

static void help(FILE *f) {
    fputs("usage: isokv bench engine --chunks [--model stories260K|CONFIG] [--docs 4]\n"
          "         [--doc-tokens 920] [--context 256] [--query 16] [--prompts 3] [--next 32]\n"
          "         [--ratios 0,0.05,0.1,0.15,0.2,0.3,0.5,1] [--max-dev D] [--threads 2]\n"
          "         [--repeat 3] [--seed 1] [--q8 GROUP] [--json]\n\n"
          "Chunk reuse against the exact prefill (docs/chunks.md): documents stored once, then\n"
          "reused in permuted orders behind a private context; per blend ratio r: greedy\n"
          "agreement and mean KL over the next --next tokens (teacher-forced), TTFT (best of\n"
          "--repeat, measured) blended vs exact. stories260K: the bundled model, story\n"
          "passages (3 or 4 per prompt, alternating); CONFIG: random weights, random documents.\n"
          "--max-dev: the quality guard for every point (default 0: off, the raw curve).\n"
          "--q8 GROUP: the model quantized to int8 in groups of GROUP (as `isokv model\n"
          "quantize`): the blend pass and the reference both run the int8 weights.\n",
          f);
}

int ikv_cmd_bench_chunks(int argc, char **argv) {
    const char *model = "small";
    uint64_t ndocs = 4, dtok = 920, ctx = 256, qtok = 16, prompts = 3, next = 32, threads = 2,
             repeat = 3, seed = 1, q8 = 0;
    double max_dev = 0, ratios[32] = {0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1};
    size_t nr = 8;
    int json = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--chunks")) continue;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return help(stdout), IKV_EXIT_OK;
        if (!v) return cli_usage_error("bench", "option '%s' needs a value", a);
        int bad = 0;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--docs"))
            bad = cli_parse_u64(v, &ndocs) || ndocs == 0 || ndocs > 16;
        else if (!strcmp(a, "--doc-tokens"))
            bad = cli_parse_u64(v, &dtok) || dtok == 0 || dtok > 65536;
        else if (!strcmp(a, "--context"))
            bad = cli_parse_u64(v, &ctx) || ctx == 0 || ctx > 65536;
        else if (!strcmp(a, "--query"))
            bad = cli_parse_u64(v, &qtok) || qtok == 0 || qtok > 4096;
        else if (!strcmp(a, "--prompts"))
            bad = cli_parse_u64(v, &prompts) || prompts == 0 || prompts > 64;
        else if (!strcmp(a, "--next"))
            bad = cli_parse_u64(v, &next) || next == 0 || next > 1024;
        else if (!strcmp(a, "--threads"))
            bad = cli_parse_u64(v, &threads) || threads == 0 || threads > 256;
        else if (!strcmp(a, "--repeat"))
            bad = cli_parse_u64(v, &repeat) || repeat == 0 || repeat > 100;
        else if (!strcmp(a, "--seed"))
            bad = cli_parse_u64(v, &seed);
        else if (!strcmp(a, "--q8"))
            bad = cli_parse_u64(v, &q8) || q8 == 0 || q8 > 4096;
        else if (!strcmp(a, "--max-dev"))
            bad = cli_parse_double(v, &max_dev) || !(max_dev >= 0);
        else if (!strcmp(a, "--ratios")) {
            nr = 0;
            char buf[512];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *sv, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
                if (nr == 32 || cli_parse_double(t, &ratios[nr]) ||
                    !(ratios[nr] >= 0 && ratios[nr] <= 1))
                    return cli_usage_error("bench",
                                           "--ratios: '%s' is not a list of up to 32 "
                                           "numbers in [0, 1]",
                                           v);
                nr++;
            }
            bad = nr == 0;
        } else
            return cli_usage_error("bench", "unknown option '%s'", a);
        if (bad) return cli_usage_error("bench", "bad value '%s' for %s", v, a);
        i++;
    }
    int real = !strcmp(model, "stories260K");
    ikv_model *m = NULL;
    ikv_tokenizer *tk = NULL;
    int rc = 0;
    if (real) {
        const char *dd = getenv("IKV_DATA_DIR");
        char p1[4096], p2[4096];
        snprintf(p1, sizeof p1, "%s/models/stories260K/stories260K.bin",
                 dd && *dd ? dd : IKV_DATA_DIR);
        snprintf(p2, sizeof p2, "%s/models/stories260K/tok512.bin", dd && *dd ? dd : IKV_DATA_DIR);
        if (ikv_model_load(p1, &m) || ikv_tokenizer_load(p2, 512, &tk)) {
            ikv_model_destroy(m);
            return cli_fail("bench", "%s", ikv_errdetail());
        }
    } else {
        ikv_model_config cf;
        if (ikv_model_config_named(model, &cf))
            return cli_usage_error("bench", "--model: '%s' is stories260K or one of %s", model,
                                   ikv_model_config_names());
        if ((rc = ikv_model_random(&cf, seed, &m))) return cli_fail("bench", "%s", ikv_errdetail());
    }
    if (q8) { /* int8 weights: the same model quantized, as `isokv model quantize` writes it */
        ikv_model *q = NULL;
        if (ikv_model_q8_group_check(ikv_model_cfg(m), (int)q8) ||
            ikv_model_quantize(m, (int)q8, &q)) {
            ikv_model_destroy(m), ikv_tokenizer_destroy(tk);
            return cli_usage_error("bench", "--q8 %llu: %s", (unsigned long long)q8,
                                   ikv_errdetail());
        }
        ikv_model_destroy(m);
        m = q;
    }
    const ikv_model_config *cf = ikv_model_cfg(m);
    const size_t V = (size_t)cf->vocab_size, L = (size_t)cf->seq_len;
    size_t nd_real = sizeof passages / sizeof passages[0];
    if (real) ndocs = ndocs > nd_real ? nd_real : ndocs;
    uint32_t *docs[16] = {0}, *ctxt[64] = {0}, *query = NULL;
    size_t nd[16], nc[64], nq = 0;
    ikv_engine *e = NULL;
    ikv_chunks *ch = NULL;
    point pts[32];
    memset(pts, 0, sizeof pts);
    bench b = {.m = m, .V = V, .next = next, .repeat = (unsigned)repeat};
    b.ref = malloc(next * V * 4), b.blend = malloc(next * V * 4), b.cont = malloc(next * 4);
    query = malloc(4096 * 4);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < (real ? nd_real : ndocs); i++) {
        docs[i] = malloc(65536 * 4);
        if (real)
            ikv_tokenizer_encode(tk, passages[i], 0, 0, docs[i], 65536, &nd[i]);
        else
            for (nd[i] = 0; nd[i] < dtok; nd[i]++)
                x = x * 6364136223846793005ull + 1442695040888963407ull,
                docs[i][nd[i]] = 3 + (uint32_t)((x >> 33) % (V - 3));
    }
    for (size_t p = 0; p < prompts; p++) {
        ctxt[p] = malloc(65536 * 4);
        if (real) {
            ikv_tokenizer_encode(tk, contexts[p % 4], 1, 0, ctxt[p], 65536, &nc[p]);
        } else {
            ctxt[p][0] = IKV_TOK_BOS;
            for (nc[p] = 1; nc[p] < ctx; nc[p]++)
                x = x * 6364136223846793005ull + 1442695040888963407ull,
                ctxt[p][nc[p]] = 3 + (uint32_t)((x >> 33) % (V - 3));
        }
    }
    if (real)
        ikv_tokenizer_encode(tk, "One day,", 0, 0, query, 4096, &nq);
    else
        for (nq = 0; nq < qtok; nq++)
            x = x * 6364136223846793005ull + 1442695040888963407ull,
            query[nq] = 3 + (uint32_t)((x >> 33) % (V - 3));
    ikv_engine_options eo;
    ikv_engine_options_default(&eo);
    eo.threads = (int)threads;
    if ((rc = ikv_engine_create(m, &eo, &e))) goto fail;
    ikv_chunks_options co;
    ikv_chunks_options_default(&co);
    co.mem = 1ull << 30;
    if ((rc = ikv_chunks_create(e, &co, &ch))) goto fail;
    b.e = e, b.c = ch;
    if ((rc = prime(&b, docs, nd, real ? nd_real : ndocs))) goto fail;
    size_t total_docs = 0;
    for (size_t p = 0; p < prompts; p++) {
        /* documents: 3 or 4 (alternating, stories260K) in a rotated, reversed-on-odd order */
        size_t k = real ? (p % 2 ? 3 : 4) : ndocs, pool = real ? nd_real : ndocs;
        ikv_prompt_seg g[20];
        size_t ng = 0, n = nc[p] + nq;
        g[ng++] = (ikv_prompt_seg){IKV_PSEG_MEMORY, ctxt[p], nc[p], 0, 0, 0};
        for (size_t j = 0; j < k; j++) {
            size_t d = (p * 2 + (p % 2 ? k - 1 - j : j)) % pool;
            g[ng++] = (ikv_prompt_seg){IKV_PSEG_DOC, docs[d], nd[d], 1, 1, 1};
            n += nd[d];
        }
        g[ng++] = (ikv_prompt_seg){IKV_PSEG_QUERY, query, nq, 0, 0, 0};
        if (n + next > L) {
            rc = ikv_error(IKV_ETOOLONG,
                           "a prompt of %zu tokens and %zu next ones exceed "
                           "seq_len %zu",
                           n, (size_t)next, L);
            goto fail;
        }
        total_docs += k;
        if ((rc = one_prompt(&b, g, ng, ratios, nr, (float)max_dev, pts))) goto fail;
    }
    if (json)
        printf("{\"model\":\"%s\",\"threads\":%llu,\"prompts\":%llu,\"next\":%llu,"
               "\"docs_per_prompt\":%.2f,\"points\":[",
               model, (unsigned long long)threads, (unsigned long long)prompts,
               (unsigned long long)next, (double)total_docs / (double)prompts);
    else
        printf("chunk reuse on %s (%s weights), %llu prompts of %.1f documents behind a private "
               "context, %llu thread(s), TTFT best of %llu (measured, wall clock), agreement "
               "and KL over the next %llu tokens (teacher-forced), guard %s\n"
               "%6s %8s %10s %9s %9s %7s %8s %8s %7s\n",
               model, real ? "trained" : "random", (unsigned long long)prompts,
               (double)total_docs / (double)prompts, (unsigned long long)threads,
               (unsigned long long)repeat, (unsigned long long)next, max_dev > 0 ? "on" : "off",
               "r", "agree", "meanKL", "ttft_ms", "full_ms", "speedup", "reused", "recomp", "dev");
    for (size_t j = 0; j < nr; j++) {
        point *p = &pts[j];
        double k = (double)p->n;
        if (json)
            printf("%s{\"r\":%g,\"agreement\":%.4f,\"mean_kl\":%.6f,\"ttft_s\":%.6f,"
                   "\"ttft_full_s\":%.6f,\"speedup\":%.3f,\"reused\":%.1f,\"recomputed\":%.1f,"
                   "\"deviation_mean\":%.5f,\"full\":%zu}",
                   j ? "," : "", ratios[j], p->agree / k, p->kl / k, p->ttft / k, p->ttft_full / k,
                   p->ttft_full / p->ttft, p->reused / k, p->recomputed / k, p->dev / k, p->full);
        else
            printf("%6.3f %8.4f %10.6f %9.2f %9.2f %6.2fx %8.1f %8.1f %7.4f\n", ratios[j],
                   p->agree / k, p->kl / k, p->ttft / k * 1e3, p->ttft_full / k * 1e3,
                   p->ttft_full / p->ttft, p->reused / k, p->recomputed / k, p->dev / k);
    }
    if (json) printf("]}\n");
    rc = 0;
fail:
    for (size_t i = 0; i < 16; i++)
        free(docs[i]);
    for (size_t i = 0; i < 64; i++)
        free(ctxt[i]);
    free(query), free(b.ref), free(b.blend), free(b.cont);
    ikv_chunks_destroy(ch);
    ikv_engine_destroy(e);
    ikv_tokenizer_destroy(tk);
    ikv_model_destroy(m);
    if (rc == IKV_ETOOLONG) return cli_usage_error("bench", "%s", ikv_errdetail_for(rc));
    if (rc) return cli_fail("bench", "%s", ikv_errdetail_for(rc));
    return IKV_EXIT_OK;
}
