/*
 * isokv bench: built-in benchmarks that need no input files. Targets:
 *
 *     isokv bench engine [--config small] [--prefix 2048] [--suffix 32] [--decode 32]
 *                        [--threads 1,2] [--repeat 3] [--tile 64] [--group 8] [--seed S]
 *                        [--json] [--tier SPEC]...
 *
 * Every figure is measured (wall clock) on this machine; see docs/benchmarks.md.
 */
#include "cli.h"
#include "isokv/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fputs("usage: isokv bench engine [--config small] [--prefix 2048] [--suffix 32] [--decode 32]\n"
          "                          [--threads 1,2] [--repeat 3] [--tile 64] [--group 8]\n"
          "                          [--seed S] [--json] [--tier SPEC]...\n"
          "                          [--tier-dtype q8]\n"
          "       isokv bench engine --chunks [...]   (chunk reuse vs exact prefill; --chunks --help)\n\n"
          "engine: builds a random-weight model of the config in memory and measures, at each\n"
          "thread count, TTFT cold vs warm for a P-token shared public prefix + Q-token private\n"
          "suffix (the warm request is another tenant's, reusing the prefix from the cache),\n"
          "prefill tokens/s and GFLOP/s against the measured sgemm peak, and decode tokens/s\n"
          "against the memory-bandwidth bound (weight bytes per token over the measured read\n"
          "bandwidth). All figures measured. --repeat R runs the probes and requests R times per\n"
          "thread count and reports the best of each figure (the machine may be shared). --tile\n"
          "sets the prefill tile rows; --group the tiles per projection call (the engine uses 1\n"
          "where its check finds that BLAS would not give every row the same bits; printed).\n"
          "With --tier, the pool holds one request, a request with another prefix pushes the\n"
          "first prefix into the tiers, and a third tenant's request takes it from there: its\n"
          "TTFT is printed next to cold and warm.\n",
          f);
    fputs(cli_tiers_help, f);
}

static int engine(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--chunks")) return ikv_cmd_bench_chunks(argc, argv);
    ikv_engine_bench_options o = {.config = "small",
                                  .prefix = 2048,
                                  .suffix = 32,
                                  .decode = 32,
                                  .threads = {1, 2},
                                  .seed = 1,
                                  .repeat = 3};
    int json = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t x;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        static const char *const valued[] = {"--config", "--prefix", "--suffix",
                                             "--decode", "--seed",   "--repeat",
                                             "--tile",   "--group",  "--threads",
                                             "--tier",   "--tier-dtype"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("bench", "unknown option '%s'", a);
        if (!v) return cli_usage_error("bench", "option '%s' needs a value", a);
        if (!strcmp(a, "--config"))
            o.config = v;
        else if (!strcmp(a, "--tier")) {
            if (o.n_tiers == IKV_MAX_TIERS - 1)
                return cli_usage_error("bench", "at most %d --tier options", IKV_MAX_TIERS - 1);
            o.tiers[o.n_tiers++] = v;
        } else if (!strcmp(a, "--tier-dtype")) {
            cli_tiers t = {0};
            if (cli_tiers_dtype(&t, "bench", v)) return IKV_EXIT_USAGE;
            o.tier_dtype = t.dtype;
        }
        else if (!strcmp(a, "--prefix") || !strcmp(a, "--suffix") || !strcmp(a, "--decode") ||
                 !strcmp(a, "--seed") || !strcmp(a, "--repeat") || !strcmp(a, "--tile") ||
                 !strcmp(a, "--group")) {
            if (cli_parse_u64(v, &x) || (strcmp(a, "--seed") && x > 1000000))
                return cli_usage_error("bench", "bad value '%s' for %s", v, a);
            /* a zero prefix has nothing to reuse, a zero decode nothing to time */
            if (x == 0 &&
                (!strcmp(a, "--prefix") || !strcmp(a, "--decode") || !strcmp(a, "--suffix")))
                return cli_usage_error("bench", "%s must be at least 1, got '%s'", a, v);
            if (!strcmp(a, "--prefix"))
                o.prefix = (uint32_t)x;
            else if (!strcmp(a, "--suffix"))
                o.suffix = (uint32_t)x;
            else if (!strcmp(a, "--decode"))
                o.decode = (uint32_t)x;
            else if (!strcmp(a, "--repeat")) {
                if (x == 0 || x > 100)
                    return cli_usage_error("bench", "--repeat wants 1..100, got '%s'", v);
                o.repeat = (uint32_t)x;
            } else if (!strcmp(a, "--tile")) {
                if (x == 0 || x > 4096)
                    return cli_usage_error("bench", "--tile wants 1..4096, got '%s'", v);
                o.tile = (uint32_t)x;
            } else if (!strcmp(a, "--group")) {
                if (x == 0 || x > 64)
                    return cli_usage_error("bench", "--group wants 1..64, got '%s'", v);
                o.group = (uint32_t)x;
            } else
                o.seed = x;
        } else if (!strcmp(a, "--threads")) {
            char *end;
            long t1 = strtol(v, &end, 10), t2 = 0;
            if (*end == ',') t2 = strtol(end + 1, &end, 10);
            if (*end || t1 <= 0 || t1 > 256 || t2 < 0 || t2 > 256)
                return cli_usage_error("bench", "--threads wants N or N,M (e.g. 1,2), got '%s'", v);
            o.threads[0] = (int)t1, o.threads[1] = (int)t2;
        } else
            return cli_usage_error("bench", "unknown option '%s'", a);
        i++;
    }
    ikv_engine_bench_result r;
    int rc = ikv_engine_bench(&o, &r);
    if (rc == IKV_EMODEL || rc == IKV_EINVAL || rc == IKV_EPARAM) /* --config names no config; sizes that do not fit */
        return cli_usage_error("bench", "%s", ikv_errdetail_for(rc));
    if (rc) return cli_fail("bench", "%s", ikv_errdetail_for(rc));
    ikv_engine_bench_print(&r, stdout, json);
    return IKV_EXIT_OK;
}

int ikv_cmd_bench(int argc, char **argv) {
    for (int i = 2; argc > 1 && !strcmp(argv[1], "engine") && i < argc; i++)
        if (!strcmp(argv[i], "--chunks")) return ikv_cmd_bench_chunks(argc, argv); /* own help */
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return IKV_EXIT_OK;
    }
    if (argc < 2) return cli_usage_error("bench", "expected a target: engine");
    if (!strcmp(argv[1], "engine")) return engine(argc, argv);
    return cli_usage_error("bench", "unknown target '%s' (engine)", argv[1]);
}
