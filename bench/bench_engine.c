/*
 * bench_engine: the engine benchmark as a stand-alone program (same as `isokv bench engine`).
 *
 *     bench_engine [CONFIG [PREFIX [SUFFIX [DECODE [REPEAT]]]]] [--json]
 *                                                           defaults: small 2048 32 32 3
 *
 * Measures, at 1 and 2 BLAS threads: TTFT cold vs warm for a PREFIX-token shared public prefix
 * plus a SUFFIX-token private suffix (the warm request is another tenant's), prefill tokens/s
 * and useful GFLOP/s against the measured sgemm peak, decode tokens/s against the bandwidth
 * bound; each figure the best of REPEAT repetitions. All figures are measured wall-clock times
 * on this machine (core count printed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isokv/model.h"

int main(int argc, char **argv) {
    ikv_engine_bench_options o = {.config = "small",
                                  .prefix = 2048,
                                  .suffix = 32,
                                  .decode = 32,
                                  .threads = {1, 2},
                                  .seed = 1,
                                  .repeat = 3};
    int json = 0, pos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: bench_engine [CONFIG [PREFIX [SUFFIX [DECODE [REPEAT]]]]] [--json]\n");
            return 0;
        }
        if (argv[i][0] == '-') {
            fprintf(stderr, "bench_engine: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
        if (pos == 0) {
            o.config = argv[i];
            pos++;
            continue;
        }
        uint64_t x;
        if (pos > 4 || ikv_parse_count(argv[i], &x) || x == 0 || x > 1000000) {
            fprintf(stderr, "bench_engine: %s '%s' (PREFIX SUFFIX DECODE REPEAT are counts >= 1)\n",
                    pos > 4 ? "too many arguments at" : "bad count", argv[i]);
            return 2;
        }
        uint32_t *dst[] = {NULL, &o.prefix, &o.suffix, &o.decode, &o.repeat};
        *dst[pos++] = (uint32_t)x;
    }
    ikv_engine_bench_result r;
    if (ikv_engine_bench(&o, &r)) {
        fprintf(stderr, "bench_engine: %s\n", ikv_errdetail());
        return ikv_model_config_named(o.config, &(ikv_model_config){0}) ? 2 : 1;
    }
    ikv_engine_bench_print(&r, stdout, json);
    return 0;
}
