/*
 * isokv: one command, many subcommands.
 *
 *     isokv <subcommand> [options]      isokv <subcommand> --help
 *
 * Exit codes: 0 success, 1 the work failed (bad input, I/O), 2 usage error.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static int cmd_version(int argc, char **argv) {
    if (argc > 1 && !cli_wants_help(argc, argv))
        return cli_usage_error("version", "unknown option '%s'", argv[1]);
    printf("isokv 0.1.0\n");
    return IKV_EXIT_OK;
}

static const command commands[] = {
    {"version", cmd_version, "print the version"},
    {"gen", ikv_cmd_gen, "write a synthetic multi-user segments trace"},
    {"sim", ikv_cmd_sim, "replay a trace through the cache core; sweeps (hit ratio vs users)"},
    {"trace", ikv_cmd_trace, "export a trace's block stream (libCacheSim oracleGeneral)"},
    {"plan", ikv_cmd_plan, "compute-latency walk, MRTS, knee, router (simulated)"},
    {"model", ikv_cmd_model, "write a random-weight checkpoint, or describe one"},
    {"run", ikv_cmd_run, "generate text with the paged-KV engine through the prefix cache"},
    {"serve", ikv_cmd_serve,
     "OpenAI-compatible HTTP server: continuous batching, SSE, tenants, metrics"},
    {"load", ikv_cmd_load,
     "replay a trace against an OpenAI-compatible server (measured hit ratio, TTFT)"},
    {"bench", ikv_cmd_bench,
     "built-in benchmarks (engine: TTFT cold/warm, prefill, decode; measured)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: isokv <subcommand> [options]\n\nsubcommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'isokv <subcommand> --help' describes each one.\n"
               "Exit codes: 0 success, 1 failure, 2 usage error.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return IKV_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return IKV_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "isokv: unknown subcommand '%s'\n\n", argv[1]);
    usage(stderr);
    return IKV_EXIT_USAGE;
}
