/*
 * bench_batch: one engine forward step (ikv_engine_step) of B decoding sequences, B = 1, 4,
 * 16, 64, in process (no HTTP): the batched weight products' gain over one sequence per step.
 *
 *     bench_batch [CONFIG [THREADS [CONTEXT [REPEAT]]]]        defaults: small 1 64 24
 *
 * Builds the model in memory (random weights), admits B sequences with CONTEXT-token prompts
 * (no cache), then times REPEAT decode steps of all B and prints the best step's time and
 * B / time as tokens/s. Measured wall-clock time on this machine (core count printed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "isokv/model.h"

#define USAGE                                                                                      \
    "usage: bench_batch [CONFIG [THREADS [CONTEXT [REPEAT]]]]        defaults: small 1 64 24\n"

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%s", USAGE);
            return 0;
        }
        if (argv[i][0] == '-') {
            fprintf(stderr, "bench_batch: unknown option '%s'\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (argc > 5) {
        fprintf(stderr, "bench_batch: too many arguments\n%s", USAGE);
        return 2;
    }
    const char *cfgname = argc > 1 ? argv[1] : "small";
    int th = argc > 2 ? atoi(argv[2]) : 1, ctx = argc > 3 ? atoi(argv[3]) : 64,
        rep = argc > 4 ? atoi(argv[4]) : 24;
    ikv_model_config c;
    if (ikv_model_config_named(cfgname, &c) || th < 1 || ctx < 1 || rep < 1 ||
        ctx + rep >= c.seq_len) {
        fprintf(stderr, "bench_batch: bad argument\n%s", USAGE);
        return 2;
    }
    ikv_model *m;
    if (ikv_model_random(&c, 1, &m)) return 1;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.max_seqs = 64;
    o.threads = th;
    uint32_t per = (uint32_t)((ctx + rep + 15) / 16);
    o.private_blocks = 64ull * per;
    o.kv_mem = (o.private_blocks + 16) * ikv_model_kv_bytes_per_token(&c) * 16;
    ikv_engine *e;
    if (ikv_engine_create(m, &o, &e)) {
        fprintf(stderr, "bench_batch: %s\n", ikv_errdetail());
        return 1;
    }
    printf("bench_batch: %s, %d threads, context %d, best of %d steps; %ld cores; measured\n",
           cfgname, th, ctx, rep, sysconf(_SC_NPROCESSORS_ONLN));
    static const int Bs[] = {1, 4, 16, 64};
    double one = 0;
    uint32_t *p = malloc(sizeof(uint32_t) * (size_t)ctx);
    for (int bi = 0; bi < 4; bi++) {
        const int B = Bs[bi];
        ikv_seq *s[64];
        ikv_step_item it[64];
        for (int k = 0; k < B; k++) {
            for (int i = 0; i < ctx; i++)
                p[i] = 3 + (uint32_t)((i * 7 + k * 131) % (uint32_t)(c.vocab_size - 3));
            ikv_request r = {.tokens = p, .n = (size_t)ctx, .max_new = (size_t)rep, .no_cache = 1};
            if (ikv_engine_begin(e, &r, &s[k], NULL)) {
                fprintf(stderr, "bench_batch: %s\n", ikv_errdetail());
                return 1;
            }
        }
        double best = 1e30;
        for (int r = 0; r < rep; r++) {
            for (int k = 0; k < B; k++)
                it[k] = (ikv_step_item){.seq = s[k], .token = 5};
            double t0 = ikv_now();
            if (ikv_engine_step(e, it, (size_t)B)) return 1;
            double t = ikv_now() - t0;
            best = t < best ? t : best;
        }
        if (B == 1) one = 1 / best;
        printf("  B %2d: step %8.2f ms  %8.1f tok/s  (x%.2f of B = 1)\n", B, best * 1e3, B / best,
               B / best / one);
        for (int k = 0; k < B; k++)
            ikv_engine_end(e, s[k]);
    }
    free(p);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
    return 0;
}
