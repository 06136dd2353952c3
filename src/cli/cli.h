/*
 * The isokv command: shared helpers for subcommands.
 *
 * Each subcommand lives in src/cli/cmd_<name>.c and exports one function
 *     int ikv_cmd_<name>(int argc, char **argv);
 * that receives argv starting at the subcommand's name, and returns an exit code:
 * IKV_EXIT_OK, IKV_EXIT_FAIL (the work failed: bad input, I/O) or IKV_EXIT_USAGE (bad flags).
 * Adding a subcommand is one file plus one line in the table in main.c.
 * Only cli/ prints and exits; library code returns error codes.
 */
#ifndef ISOKV_CLI_H
#define ISOKV_CLI_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

enum { IKV_EXIT_OK = 0, IKV_EXIT_FAIL = 1, IKV_EXIT_USAGE = 2 };

/* Print "isokv <cmd>: message" to stderr and return IKV_EXIT_USAGE / IKV_EXIT_FAIL. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse a count with an optional suffix k/K (1e3), M (1e6), G (1e9), T (1e12): "2M" -> 2000000.
 * Returns 0 on success, -1 if the text is not a whole non-negative number. cli_parse_u64 is
 * the same parser (ikv_parse_count): every count flag takes the suffixes. */
int cli_parse_count(const char *s, uint64_t *out);
/* "lookup[:n=N,k=K,m=M]" (--spec of isokv run and serve): sets *ng, *k and *mn (the shortest
 * match that drafts) when given (1..256 each). Returns 0, or -1 for anything else; the caller
 * checks m <= n. (cmd_run.c) */
int cli_parse_spec(const char *v, uint64_t *ng, uint64_t *k, uint64_t *mn);
/* --semantic-cache=SIZE: digits alone are entries (1..1000000; *bytes = 0); a k/M/G/T suffix
 * makes it a byte budget of at least 4k (*bytes; *entries then room for 2 KiB entries, 16 ..
 * 1000000). Returns 0 or -1. (cli_util.c) */
int cli_parse_semcache(const char *v, uint64_t *entries, uint64_t *bytes);

/* Parse a finite double / a non-negative integer that must use the whole string. */
int cli_parse_double(const char *s, double *out);
int cli_parse_u64(const char *s, uint64_t *out);

/* True if argv holds -h or --help. */
int cli_wants_help(int argc, char **argv);

/* True if an executable `name` is on PATH (what posix_spawnp would find). */
int cli_find_program(const char *name);

/* Runs argv[0] (looked up on PATH) with the argument vector argv (NULL-terminated), no shell,
 * stdin/stdout/stderr inherited, and waits. Returns its exit status (128 + signal when killed),
 * or -1 with errno set when it could not be started (ENOENT: not found). */
int cli_spawn_wait(char *const argv[]);

/* Writes s into a gnuplot script as a string expression that gnuplot reads back as exactly the
 * bytes of s, and never as code: quotes, backquotes, backslashes, '@' and newlines included. */
void cli_gp_string(FILE *f, const char *s);

/* Creates a file for writing in dir whose name nobody else uses (".sweep.<pid>.<n>.<ext>", "x"
 * mode: O_EXCL, so never through an existing file or link); *path gets its name. NULL (errno set)
 * when it cannot. */
FILE *cli_private_file(const char *dir, const char *ext, char *path, size_t n);

/* Lower tiers (cli_tiers.c): --tier SPEC flags, repeatable, fastest first. */
struct ikv_engine_options;
struct ikv_model;
struct ikv_engine;
struct ikv_store;
#define CLI_MAX_TIERS 3
typedef struct cli_tiers {
    const char *specs[CLI_MAX_TIERS];
    size_t n;
    struct ikv_store *st[CLI_MAX_TIERS];
    int dtype; /* --tier-dtype: 0 fp32, 1 q8 */
} cli_tiers;
/* Parses a --tier-dtype value (f32, q8); IKV_EXIT_USAGE with a message if neither. */
int cli_tiers_dtype(cli_tiers *t, const char *cmd, const char *v);
/* Records one --tier value; IKV_EXIT_USAGE (with a message) past CLI_MAX_TIERS. */
int cli_tiers_add(cli_tiers *t, const char *cmd, const char *spec);
/* Opens the stores for the model and sets eo's tier list (tokenizer: its file, or NULL).
 * Returns IKV_EXIT_OK, or IKV_EXIT_USAGE (a malformed spec) / IKV_EXIT_FAIL (unreachable,
 * unwritable) after printing why. */
int cli_tiers_open(cli_tiers *t, const char *cmd, const struct ikv_model *m, const char *tokenizer,
                   struct ikv_engine_options *eo);
/* Prints each tier's figures (measured) to stderr. */
void cli_tiers_report(const cli_tiers *t, const struct ikv_engine *e, const char *cmd);
void cli_tiers_close(cli_tiers *t);
/* The usage lines of --tier, for help texts. */
extern const char cli_tiers_help[];

/* Subcommands (one line each). */
int ikv_cmd_gen(int argc, char **argv);
int ikv_cmd_sim(int argc, char **argv);
int ikv_cmd_plan(int argc, char **argv);
int ikv_cmd_model(int argc, char **argv);
int ikv_cmd_run(int argc, char **argv);
int ikv_cmd_bench(int argc, char **argv);
int ikv_cmd_bench_chunks(int argc, char **argv); /* bench engine --chunks (cmd_bench_chunks.c) */
int ikv_cmd_trace(int argc, char **argv);
int ikv_cmd_serve(int argc, char **argv);
int ikv_cmd_load(int argc, char **argv);

#endif
