/*
 * bench_tier_q8: the measured effect of a q8 lower tier (--tier-dtype q8) on the output, against
 * fp32: for each prompt, a no-cache fp32 reference, then the same prompt through an engine whose
 * pool keeps one block and whose file tier holds the rest as q8 (written by a first run, loaded
 * by the second). Compared on the positions the second run computes and on D decode steps fed
 * the reference's own greedy tokens (teacher forcing, so every step compares the same context):
 *
 *   agreement   fraction of those positions where the argmax (greedy token) is the same
 *   KL          mean and max KL(p_fp32 || p_q8) of the next-token distribution, in nats
 *   free run    greedy tokens generated identically before the first difference (mean), when
 *               each run decodes its own tokens
 *
 *     bench_tier_q8 [--models stories260K,small] [--prompts 8] [--len 256] [--decode 32]
 *
 * stories260K is the bundled trained model (prompts: its tokenizer on story sentences);
 * `small` is generated (random weights, random token prompts).
 */
#include "isokv/model.h"
#include "isokv/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *sentences[] = {
    "Once upon a time, there was a little girl named Lily. ",
    "She loved to play outside in the park with her friends. ",
    "One day, she found a big red ball under a tree. ",
    "Her mom said it was time to go home for dinner. ",
    "Tom was a small dog who liked to run and jump. ",
    "The sun was shining and the birds were singing. ",
    "They went to the store to buy some milk and bread. ",
    "Ben wanted to build a tall tower with his blocks. ",
};

static uint32_t argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (uint32_t)b;
}

/* KL(p || q) of the softmaxes of logits a (p) and b (q), in nats. */
static double kl(const float *a, const float *b, int n) {
    double ma = a[0], mb = b[0], sa = 0, sb = 0;
    for (int i = 1; i < n; i++)
        ma = a[i] > ma ? a[i] : ma, mb = b[i] > mb ? b[i] : mb;
    for (int i = 0; i < n; i++)
        sa += exp(a[i] - ma), sb += exp(b[i] - mb);
    double k = 0;
    for (int i = 0; i < n; i++) {
        double lp = a[i] - ma - log(sa), lq = b[i] - mb - log(sb);
        k += exp(lp) * (lp - lq);
    }
    return k;
}

/* Prefill t[0..n) then decode `dec` steps: forced tokens if `force`, else own greedy tokens
 * (written to gen). Rows of logits for positions [from, n) and the decode steps go to rows. */
static int run(ikv_engine *e, const uint32_t *t, size_t n, int no_cache, size_t dec,
               const uint32_t *force, uint32_t *gen, float *rows, size_t *cached, size_t *lossy) {
    int V = ikv_model_cfg(ikv_engine_model(e))->vocab_size;
    float *all = calloc((n + 1) * (size_t)V, 4);
    ikv_request rq = {.tokens = t, .n = n, .no_cache = no_cache, .logits_all = all};
    ikv_seq *s;
    ikv_prefill_info inf;
    if (ikv_engine_begin(e, &rq, &s, &inf)) {
        free(all);
        return -1;
    }
    if (cached) *cached = inf.cached_tokens;
    if (lossy) *lossy = inf.lossy_tokens;
    memcpy(rows, all + (n - 1) * (size_t)V, sizeof(float) * (size_t)V);
    const float *lg = ikv_seq_logits(s);
    for (size_t d = 0; d < dec; d++) {
        uint32_t next = force ? force[d] : argmax(lg, V);
        if (gen) gen[d] = next;
        if (ikv_engine_decode(e, s, next, &lg)) break;
        memcpy(rows + (d + 1) * (size_t)V, lg, sizeof(float) * (size_t)V);
    }
    ikv_engine_end(e, s);
    free(all);
    return 0;
}

#define USAGE                                                                                      \
    "usage: bench_tier_q8 [--models stories260K,small] [--prompts 8] [--len 256] [--decode 32]\n"

int main(int argc, char **argv) {
    const char *models = "stories260K,small";
    size_t prompts = 8, len = 256, dec = 32;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%s", USAGE);
            return 0;
        }
        static const char *const valued[] = {"--models", "--prompts", "--len", "--decode", NULL};
        int known = 0;
        for (int k = 0; valued[k]; k++)
            known |= !strcmp(argv[i], valued[k]);
        if (!known) {
            fprintf(stderr, "bench_tier_q8: unknown option '%s'\n%s", argv[i], USAGE);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_tier_q8: option '%s' needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--models"))
            models = argv[i + 1];
        else if (!strcmp(argv[i], "--prompts"))
            prompts = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--len"))
            len = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode"))
            dec = (size_t)atol(argv[i + 1]);
        else {
            fprintf(stderr, "bench_tier_q8: unknown option '%s'\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (prompts == 0 || prompts > 1000 || len < 32 || len > 4000 || dec == 0 || dec > 1000) {
        fprintf(stderr, "bench_tier_q8: --prompts 1..1000, --len 32..4000, --decode 1..1000\n");
        return 2;
    }
    printf("bench_tier_q8: q8 lower tier vs fp32, measured on this machine (%ld cores): %zu "
           "prompts of %zu tokens, %zu decode steps\n",
           sysconf(_SC_NPROCESSORS_ONLN), prompts, len, dec);
    char list[256];
    snprintf(list, sizeof list, "%s", models);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        ikv_model *m = NULL;
        ikv_tokenizer *tok = NULL;
        const char *src = getenv("IKV_SOURCE_DIR");
        if (!strcmp(name, "stories260K")) {
            char p[600], q[600];
            snprintf(p, sizeof p, "%s/data/models/stories260K/stories260K.bin", src ? src : ".");
            snprintf(q, sizeof q, "%s/data/models/stories260K/tok512.bin", src ? src : ".");
            if (ikv_model_load(p, &m) || ikv_tokenizer_load(q, 512, &tok)) {
                fprintf(stderr, "bench_tier_q8: %s\n", ikv_errdetail());
                return 1;
            }
        } else {
            ikv_model_config c;
            if (ikv_model_config_named(name, &c) || ikv_model_random(&c, 3, &m)) {
                fprintf(stderr, "bench_tier_q8: %s\n", ikv_errdetail());
                return 1;
            }
        }
        const ikv_model_config *c = ikv_model_cfg(m);
        int V = c->vocab_size;
        size_t n = len + dec + 1 > (size_t)c->seq_len ? (size_t)c->seq_len - dec - 1 : len;
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.tier_dtype = IKV_BLOB_DTYPE_Q8;
        ikv_store_params p8, p32;
        ikv_engine_store_params(m, &o, &p8);
        o.tier_dtype = IKV_BLOB_DTYPE_F32;
        ikv_engine_store_params(m, &o, &p32);
        double ksum = 0, kmax = 0, agree = 0, cnt = 0, free_run = 0;
        size_t lossy_total = 0;
        uint32_t *t = malloc(sizeof(uint32_t) * (n + 64));
        uint32_t *g_ref = malloc(sizeof(uint32_t) * dec), *g_q8 = malloc(sizeof(uint32_t) * dec);
        float *r_ref = malloc(sizeof(float) * (dec + 1) * (size_t)V),
              *r_q8 = malloc(sizeof(float) * (dec + 1) * (size_t)V);
        for (size_t pi = 0; pi < prompts; pi++) {
            size_t got = 0;
            if (tok) {
                /* sentences in a per-prompt order, encoded; text grows until it has n tokens */
                char text[8192] = "";
                int rc = 0;
                for (size_t k = 0; (rc || got < n) && strlen(text) < sizeof text - 100; k++) {
                    strcat(text, sentences[(pi * 3 + k * (pi + 1)) % 8]);
                    rc = ikv_tokenizer_encode(tok, text, 1, 0, t, n + 64, &got);
                    if (rc == IKV_ETOOLONG) break;
                }
                if (got < n) {
                    fprintf(stderr, "bench_tier_q8: prompt %zu has %zu < %zu tokens\n", pi, got, n);
                    return 1;
                }
            } else {
                uint64_t x = pi * 0x9e3779b97f4a7c15ull + 1;
                t[0] = 1;
                for (size_t i = 1; i < n; i++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    t[i] = 3 + (uint32_t)(x % (uint64_t)(V - 3));
                }
            }
            char spec[256];
            snprintf(spec, sizeof spec, "file:/tmp/bench_q8_%d.store:%zu", (int)getpid(),
                     (n / 16 + 64) * p8.slot_bytes * 4);
            char path[256];
            snprintf(path, sizeof path, "/tmp/bench_q8_%d.store", (int)getpid());
            unlink(path);
            ikv_store *st;
            if (ikv_store_open(spec, &p8, &st)) {
                fprintf(stderr, "bench_tier_q8: %s\n", ikv_errdetail());
                return 1;
            }
            ikv_engine_options oq;
            ikv_engine_options_default(&oq);
            oq.tier_dtype = IKV_BLOB_DTYPE_Q8;
            uint64_t bb = ikv_model_kv_bytes_per_token(c) * 16;
            oq.kv_mem = (((uint64_t)c->seq_len + 15) / 16 + 1) * bb; /* one cacheable block */
            oq.tiers[0] = st, oq.n_tiers = 1;
            ikv_engine *e;
            if (ikv_engine_create(m, &oq, &e)) {
                fprintf(stderr, "bench_tier_q8: %s\n", ikv_errdetail());
                return 1;
            }
            size_t cached = 0, lossy = 0;
            run(e, t, n, 1, dec, NULL, g_ref, r_ref, NULL, NULL);     /* fp32 reference */
            run(e, t, n, 0, 0, NULL, NULL, r_q8, NULL, NULL);         /* writes q8 blocks */
            run(e, t, n, 0, dec, g_ref, NULL, r_q8, &cached, &lossy); /* q8, forced */
            lossy_total += lossy;
            for (size_t d = 0; d <= dec; d++) {
                const float *a = r_ref + d * (size_t)V, *b = r_q8 + d * (size_t)V;
                double k = kl(a, b, V);
                ksum += k, kmax = k > kmax ? k : kmax;
                agree += argmax(a, V) == argmax(b, V);
                cnt++;
            }
            run(e, t, n, 0, dec, NULL, g_q8, r_q8, NULL, NULL); /* q8, free running */
            size_t same = 0;
            while (same < dec && g_q8[same] == g_ref[same])
                same++;
            free_run += (double)same;
            ikv_engine_destroy(e);
            ikv_store_close(st);
            unlink(path);
            (void)cached;
        }
        printf("\nmodel %s (%s): block %zu bytes fp32, %zu q8 (%.2fx fewer); %zu of %zu prompt "
               "tokens per request came through q8\n",
               name, tok ? "trained, bundled" : "generated, random weights", p32.slot_bytes,
               p8.slot_bytes, (double)p32.slot_bytes / (double)p8.slot_bytes, lossy_total / prompts,
               n);
        printf("  greedy agreement %.4f over %.0f positions; KL(fp32 || q8) mean %.2e, max %.2e "
               "nats; free-running greedy: %.1f of %zu tokens identical before the first "
               "difference (mean)\n",
               agree / cnt, cnt, ksum / cnt, kmax, free_run / (double)prompts, dec);
        free(t), free(g_ref), free(g_q8), free(r_ref), free(r_q8);
        ikv_tokenizer_destroy(tok);
        ikv_model_destroy(m);
    }
    return 0;
}
