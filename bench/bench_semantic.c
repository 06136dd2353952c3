/*
 * bench_semantic: the verified response cache against a threshold-only semantic cache, and the
 * latency of a fully verified hit against a full decode. Measured, wall clock, on this machine.
 *
 *   bench_semantic pairs [--model M.bin --tokenizer T.bin | --config tiny|small] FILE [-n N]
 *       For each pair (cached prompt a, new prompt b) of FILE (tests/data/semantic/, TSV):
 *       greedy outputs of a and b (N tokens); exact Jaccard J of their prompt 3-grams. A
 *       threshold cache at tau serves a's output when J >= tau: a hit; a false hit when that
 *       output differs from b's. The verified cache (respcache + ikv_engine_verify) serves b
 *       with a's output as the candidate: its output is compared with b's plain output (a
 *       difference would be a false hit: counted, never expected), its accepted tokens and
 *       the decode time saved (best of R runs, plain vs cached, same warm prefix).
 *   bench_semantic lookup [--model ...] [-n N] [-r R]
 *       Prompt-lookup decoding (n-gram n, k draft tokens) vs plain greedy decoding of N tokens
 *       on a few story openings: decode time (best of R), forward passes, tokens accepted;
 *       the outputs must be identical (else exit 1).
 *   bench_semantic latency [--model ... | --config small] [-r R]
 *       Per output length 32, 128, 256: end-to-end time of a request (warm prompt prefix) that
 *       decodes N tokens vs one whose response is a full verified hit of N tokens (one
 *       verify), best of R; and the decode part alone.
 */
#include "isokv/model.h"
#include "isokv/respcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct ctx {
    ikv_model *m;
    ikv_tokenizer *tok;
    ikv_engine *e;
    int V, seq_len;
} ctx;

static void die(const char *what) {
    fprintf(stderr, "bench_semantic: %s: %s\n", what, ikv_errdetail());
    exit(1);
}

static void setup(ctx *c, const char *model, const char *tokp, const char *config, int threads) {
    memset(c, 0, sizeof *c);
    if (model) {
        if (ikv_model_load(model, &c->m)) die("model");
    } else {
        ikv_model_config mc;
        if (ikv_model_config_named(config, &mc)) die("config");
        if (ikv_model_random(&mc, 7, &c->m)) die("model");
    }
    const ikv_model_config *mc = ikv_model_cfg(c->m);
    c->V = mc->vocab_size, c->seq_len = mc->seq_len;
    if (tokp) {
        if (ikv_tokenizer_load(tokp, (uint32_t)c->V, &c->tok)) die("tokenizer");
    } else {
        char path[] = "/tmp/bench_semantic_tok_XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) die("temp file");
        close(fd);
        if (ikv_tokenizer_write_synthetic(path, (uint32_t)c->V, 1) ||
            ikv_tokenizer_load(path, (uint32_t)c->V, &c->tok))
            die("synthetic tokenizer");
        unlink(path);
    }
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = threads;
    o.max_draft = 256;
    o.kv_mem = 0;
    if (ikv_engine_create(c->m, &o, &c->e)) die("engine");
}

/* One request: prefill (warm after the first), generate n tokens with the given candidates.
 * Returns the output in hist + np; *dec = decode seconds, *tot = end-to-end seconds. */
static size_t request(ctx *c, const uint32_t *p, size_t np, size_t n, const ikv_respcache_hit *h,
                      size_t nh, uint32_t *hist, ikv_gen_result *gr, double *tot) {
    double t0 = ikv_now();
    ikv_sampler *sp;
    if (ikv_sampler_create((uint32_t)c->V, 0.0f, 0.0f, 1, &sp)) die("sampler");
    ikv_request rq = {.tokens = p, .n = np, .tenant = "bench"};
    ikv_seq *s;
    if (ikv_engine_begin(c->e, &rq, &s, NULL)) die("begin");
    memcpy(hist, p, sizeof *p * np);
    ikv_gen_options go = {.max_tokens = n, .cands = h, .n_cands = nh, .max_draft = 256};
    if (ikv_respcache_generate(c->e, s, sp, &go, hist, np, gr)) die("generate");
    ikv_engine_end(c->e, s);
    ikv_sampler_destroy(sp);
    *tot = ikv_now() - t0;
    return gr->n_out;
}

static size_t encode(ctx *c, const char *t, uint32_t *out, size_t max) {
    size_t n;
    if (ikv_tokenizer_encode(c->tok, t, 1, 0, out, max, &n)) die("encode");
    return n;
}

static int cmd_pairs(ctx *c, const char *file, size_t N, int R) {
    FILE *f = fopen(file, "r");
    if (!f) {
        fprintf(stderr, "bench_semantic: cannot open %s\n", file);
        return 1;
    }
    static const double taus[4] = {0.7, 0.8, 0.9, 0.95};
    size_t pairs = 0, th_hit[4] = {0}, th_false[4] = {0}, v_hit = 0, v_false = 0;
    size_t same_answer = 0;
    double acc_frac = 0, dec_plain = 0, dec_cached = 0;
    char line[4096];
    uint32_t *pa = malloc(sizeof(uint32_t) * 2048), *pb = malloc(sizeof(uint32_t) * 2048);
    uint32_t *ha = malloc(sizeof(uint32_t) * 4096), *hb = malloc(sizeof(uint32_t) * 4096),
             *hc = malloc(sizeof(uint32_t) * 4096);
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\r\n")] = 0;
        char *kind = strtok(line, "\t"), *a = strtok(NULL, "\t"), *b = strtok(NULL, "\t");
        if (!kind || !a || !b) continue;
        size_t na = encode(c, a, pa, 2048), nb = encode(c, b, pb, 2048);
        ikv_gen_result gr;
        double tot, best_plain = 1e9, best_cached = 1e9;
        size_t oa = request(c, pa, na, N, NULL, 0, ha, &gr, &tot);
        size_t ob = 0;
        for (int r = 0; r < R; r++) {
            ob = request(c, pb, nb, N, NULL, 0, hb, &gr, &tot);
            if (gr.seconds < best_plain) best_plain = gr.seconds;
        }
        double J = ikv_respcache_jaccard(pa, na, pb, nb, 3);
        int same = oa == ob && !memcmp(ha + na, hb + nb, sizeof(uint32_t) * oa);
        same_answer += same;
        for (int t = 0; t < 4; t++)
            if (J >= taus[t]) th_hit[t]++, th_false[t] += !same;
        /* the verified cache: a fresh response cache holding a's response */
        ikv_respcache *rc;
        ikv_respcache_options ro;
        ikv_respcache_options_default(&ro);
        if (ikv_respcache_create(&ro, &rc)) die("respcache");
        if (ikv_respcache_put(rc, "bench", 0, pa, na, ha + na, oa, NULL)) die("put");
        ikv_respcache_hit h[3];
        size_t nh = ikv_respcache_lookup(rc, "bench", pb, nb, h, 3);
        size_t oc = 0, accepted = 0;
        for (int r = 0; r < R; r++) {
            oc = request(c, pb, nb, N, h, nh, hc, &gr, &tot);
            accepted = gr.cache_accepted;
            if (gr.seconds < best_cached) best_cached = gr.seconds;
        }
        int ok = oc == ob && !memcmp(hc + nb, hb + nb, sizeof(uint32_t) * ob);
        v_false += !ok;
        v_hit += accepted > 0;
        acc_frac += ob ? (double)accepted / (double)ob : 0.0;
        dec_plain += best_plain, dec_cached += best_cached;
        printf("%-10s J=%.3f same-answer=%d verified: accepted %3zu/%3zu identical=%d "
               "decode %.3f -> %.3f ms\n",
               kind, J, same, accepted, ob, ok, best_plain * 1e3, best_cached * 1e3);
        ikv_respcache_destroy(rc);
        pairs++;
    }
    fclose(f);
    printf("\n%zu pairs, %zu tokens each (greedy), %zu pairs whose answers are identical\n", pairs,
           N, same_answer);
    printf("| cache | hit rate | false-hit rate | mean accepted fraction | decode time |\n");
    printf("|---|---|---|---|---|\n");
    for (int t = 0; t < 4; t++)
        printf("| threshold-only, tau = %.2f | %.2f | %.2f | (whole answer served) | 0 (served "
               "without the model) |\n",
               taus[t], (double)th_hit[t] / pairs, (double)th_false[t] / pairs);
    printf("| verified (isokv) | %.2f | %.2f | %.2f | %.2f ms vs %.2f ms plain (%.0f%% saved) "
           "|\n",
           (double)v_hit / pairs, (double)v_false / pairs, acc_frac / pairs, dec_cached * 1e3,
           dec_plain * 1e3, dec_plain > 0 ? 100.0 * (1 - dec_cached / dec_plain) : 0.0);
    free(pa), free(pb), free(ha), free(hb), free(hc);
    return v_false ? 1 : 0;
}

/* CPU seconds of the last gen_lookup (its generation). */
static double last_cpu;

static double gen_lookup(ctx *c, const uint32_t *p, size_t np, size_t N, uint32_t ng, uint32_t k,
                         uint32_t mn, uint32_t *hist, ikv_gen_result *gr) {
    ikv_sampler *sp;
    if (ikv_sampler_create((uint32_t)c->V, 0.0f, 0.0f, 1, &sp)) die("sampler");
    ikv_request rq = {.tokens = p, .n = np, .tenant = "bench"};
    ikv_seq *s;
    if (ikv_engine_begin(c->e, &rq, &s, NULL)) die("begin");
    memcpy(hist, p, sizeof *p * np);
    ikv_gen_options go = {
        .max_tokens = N, .lookup_ngram = ng, .lookup_k = k, .lookup_min = mn, .max_draft = 256};
    if (ikv_respcache_generate(c->e, s, sp, &go, hist, np, gr)) die("generate");
    ikv_engine_end(c->e, s);
    ikv_sampler_destroy(sp);
    last_cpu = gr->cpu_seconds;
    return gr->seconds;
}

static int cmd_lookup(ctx *c, size_t N, int R) {
    static const char *prompts[] = {"", "Once upon a time, there was a little girl named Lily.",
                                    "Tom had a big red ball. He liked to throw it high.",
                                    "One day, a cat and a dog went to the park."};
    /* n, k, m: n-gram, draft tokens, shortest match that drafts; the first row is plain */
    static const uint32_t cfg[][3] = {{0, 0, 0}, {3, 8, 1}, {3, 8, 2}, {3, 4, 2},
                                      {3, 2, 2}, {3, 1, 2}, {4, 2, 2}, {3, 2, 3}};
    enum { NC = sizeof cfg / sizeof cfg[0], NP = sizeof prompts / sizeof prompts[0] };
    uint32_t p[128], *h = malloc(sizeof(uint32_t) * 4096), *ref = malloc(sizeof(uint32_t) * 4096);
    double best[NC][NP], bcpu[NC][NP];
    size_t fw[NC] = {0}, acc[NC] = {0}, prop[NC] = {0};
    /* interleaved: every round runs every setting on every prompt, best of R per pair (the
     * machine is shared: a slow stretch hits all settings alike) */
    for (int r = 0; r < R; r++)
        for (size_t ci = 0; ci < NC; ci++)
            for (size_t pi = 0; pi < NP; pi++) {
                size_t np = encode(c, prompts[pi], p, 128);
                ikv_gen_result gr;
                double t = gen_lookup(c, p, np, N, cfg[ci][0], cfg[ci][1], cfg[ci][2], h, &gr);
                if (r == 0 || t < best[ci][pi]) best[ci][pi] = t;
                if (r == 0 || last_cpu < bcpu[ci][pi]) bcpu[ci][pi] = last_cpu;
                if (ci == 0 && r == 0)
                    memcpy(ref + pi * 1024, h + np, sizeof(uint32_t) * gr.n_out);
                else if (memcmp(ref + pi * 1024, h + np, sizeof(uint32_t) * gr.n_out)) {
                    fprintf(stderr, "bench_semantic: lookup decoding changed the output\n");
                    return 1;
                }
                if (r == 0)
                    fw[ci] += gr.forwards, acc[ci] += gr.lookup_accepted,
                        prop[ci] += gr.lookup_drafted;
            }
    printf("| setting | decode ms (sum of %d prompts, best of %d interleaved) | forward passes | "
           "draft tokens accepted / proposed | speed-up | CPU ms | speed-up (CPU) |\n"
           "|---|---|---|---|---|---|---|\n",
           (int)NP, R);
    double base = 0, cbase = 0;
    for (size_t ci = 0; ci < NC; ci++) {
        double tsum = 0, csum = 0;
        for (size_t pi = 0; pi < NP; pi++)
            tsum += best[ci][pi], csum += bcpu[ci][pi];
        if (ci == 0) base = tsum, cbase = csum;
        char name[64];
        if (ci == 0)
            snprintf(name, sizeof name, "plain decode");
        else
            snprintf(name, sizeof name, "lookup n=%u k=%u m=%u", cfg[ci][0], cfg[ci][1],
                     cfg[ci][2]);
        printf("| %s | %.3f | %zu | %zu / %zu | %.2fx | %.3f | %.2fx |\n", name, tsum * 1e3, fw[ci],
               acc[ci], prop[ci], base / tsum, csum * 1e3, cbase / csum);
    }
    free(h), free(ref);
    return 0;
}

static int cmd_latency(ctx *c, int R) {
    static const size_t lens[3] = {32, 128, 256};
    uint32_t p[64], *h = malloc(sizeof(uint32_t) * 8192), *out = malloc(sizeof(uint32_t) * 512);
    size_t np = encode(c, "Once upon a time, there was a little girl named Lily.", p, 64);
    printf("| output tokens | full decode: end-to-end ms | decode ms | verified full hit: "
           "end-to-end ms | verify ms | hit / decode (decode part) | decode / verify CPU ms | "
           "hit / decode (CPU) |\n|---|---|---|---|---|---|---|---|\n");
    for (int li = 0; li < 3; li++) {
        size_t N = lens[li];
        if (np + N + 1 > (size_t)c->seq_len) continue;
        ikv_gen_result gr;
        double tot, bt_plain = 1e9, bd_plain = 1e9, bt_hit = 1e9, bd_hit = 1e9;
        double bc_plain = 1e9, bc_hit = 1e9; /* CPU seconds of the generation */
        /* the reference output, N tokens (the model may stop earlier: then fewer) */
        size_t no = request(c, p, np, N, NULL, 0, h, &gr, &tot);
        memcpy(out, h + np, sizeof(uint32_t) * no);
        ikv_respcache_hit hit = {.output = out, .n_output = no, .similarity = 1.0};
        for (int r = 0; r < R; r++) {
            request(c, p, np, N, NULL, 0, h, &gr, &tot);
            if (tot < bt_plain) bt_plain = tot;
            if (gr.seconds < bd_plain) bd_plain = gr.seconds;
            if (gr.cpu_seconds < bc_plain) bc_plain = gr.cpu_seconds;
            request(c, p, np, N, &hit, 1, h, &gr, &tot);
            if (gr.cache_accepted != no || memcmp(h + np, out, sizeof(uint32_t) * no)) {
                fprintf(stderr, "bench_semantic: a full hit gave another output\n");
                return 1;
            }
            if (tot < bt_hit) bt_hit = tot;
            if (gr.seconds < bd_hit) bd_hit = gr.seconds;
            if (gr.cpu_seconds < bc_hit) bc_hit = gr.cpu_seconds;
        }
        printf("| %zu%s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f / %.3f | %.3f |\n", no,
               no < N ? " (model stopped)" : "", bt_plain * 1e3, bd_plain * 1e3, bt_hit * 1e3,
               bd_hit * 1e3, bd_hit / bd_plain, bc_plain * 1e3, bc_hit * 1e3, bc_hit / bc_plain);
    }
    free(h), free(out);
    return 0;
}

#define USAGE                                                                                      \
    "usage: bench_semantic pairs|latency|lookup [--model M --tokenizer T | --config NAME]\n"       \
    "                      [--threads T] [-n N] [-r R] [FILE]\n"

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%s", USAGE);
            return 0;
        }
    if (argc >= 2 && argv[1][0] == '-' && strcmp(argv[1], "--model") &&
        strcmp(argv[1], "--tokenizer") && strcmp(argv[1], "--config") &&
        strcmp(argv[1], "--threads") && strcmp(argv[1], "-n") && strcmp(argv[1], "-r")) {
        fprintf(stderr, "bench_semantic: unknown option '%s'\n%s", argv[1], USAGE);
        return 2;
    }
    if (argc < 2 ||
        (strcmp(argv[1], "pairs") && strcmp(argv[1], "latency") && strcmp(argv[1], "lookup"))) {
        fprintf(stderr, "bench_semantic: want pairs, latency or lookup first\n%s", USAGE);
        return 2;
    }
    const char *model = NULL, *tokp = NULL, *config = "tiny", *file = NULL;
    size_t N = 64;
    int R = 3, threads = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            file = a;
            continue;
        }
        static const char *const valued[] = {"--model", "--tokenizer", "--config", "--threads",
                                             "-n",      "-r",          NULL};
        int known = 0;
        for (int k = 0; valued[k]; k++)
            known |= !strcmp(a, valued[k]);
        if (!known) {
            fprintf(stderr, "bench_semantic: unknown option '%s'\n%s", a, USAGE);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_semantic: option '%s' needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--tokenizer"))
            tokp = v;
        else if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "-n"))
            N = (size_t)atoi(v);
        else if (!strcmp(a, "-r"))
            R = atoi(v);
        else {
            fprintf(stderr, "bench_semantic: unknown option '%s'\n%s", a, USAGE);
            return 2;
        }
    }
    if (!strcmp(argv[1], "pairs") && !file) {
        fprintf(stderr, "bench_semantic: pairs needs a FILE (tests/data/semantic/*.tsv)\n%s",
                USAGE);
        return 2;
    }
    if (R < 1 || N < 1 || N > 1024 || threads < 1) {
        fprintf(stderr, "bench_semantic: -r wants >= 1, -n 1..1024, --threads >= 1\n");
        return 2;
    }
    ctx c;
    setup(&c, model, tokp, config, threads);
    const ikv_model_config *mc = ikv_model_cfg(c.m);
    printf("bench_semantic %s: model %s (dim %d, layers %d, vocab %d), %d thread(s), %ld cores, "
           "best of %d, measured wall clock\n\n",
           argv[1], model ? model : config, mc->dim, mc->n_layers, mc->vocab_size, threads,
           sysconf(_SC_NPROCESSORS_ONLN), R);
    int rc = !strcmp(argv[1], "pairs")    ? (file ? cmd_pairs(&c, file, N, R) : 2)
             : !strcmp(argv[1], "lookup") ? cmd_lookup(&c, N, R)
                                          : cmd_latency(&c, R);
    ikv_engine_destroy(c.e);
    ikv_tokenizer_destroy(c.tok);
    ikv_model_destroy(c.m);
    return rc;
}
