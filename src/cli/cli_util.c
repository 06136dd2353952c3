/*
 * Small helpers shared by the subcommands: error printing and strict number parsing.
 * Numbers must use their whole string ("12x" is rejected), so a typo never becomes a silent 12.
 */
#include "cli.h"

#include "isokv/base.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void vreport(const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "isokv %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try 'isokv %s --help'.\n", cmd);
    return IKV_EXIT_USAGE;
}

int cli_fail(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
    return IKV_EXIT_FAIL;
}

/* All three go through the one parser in src/base/number.c, so every count flag of every
 * subcommand takes the same k/M/G suffixes and rejects the same typos. */
int cli_parse_double(const char *s, double *out) {
    return ikv_parse_double(s, out);
}

int cli_parse_u64(const char *s, uint64_t *out) {
    return ikv_parse_count(s, out);
}

int cli_parse_count(const char *s, uint64_t *out) {
    return ikv_parse_count(s, out);
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}
