/*
 * Small helpers shared by the subcommands: error printing and strict number parsing.
 * Numbers must use their whole string ("12x" is rejected), so a typo never becomes a silent 12.
 */
#include "cli.h"

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

int cli_parse_double(const char *s, double *out) {
    char *end;
    if (!s || !*s) return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int cli_parse_u64(const char *s, uint64_t *out) {
    char *end;
    if (!s || !*s || *s == '-') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

int cli_parse_count(const char *s, uint64_t *out) {
    char *end;
    if (!s || !*s || *s == '-') return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return -1;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1e3; break;
        case 'm': case 'M': mul = 1e6; break;
        case 'g': case 'G': mul = 1e9; break;
        default: return -1;
        }
        if (end[1]) return -1;
    }
    v *= mul;
    if (v != floor(v) || v > 1.8e19) return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}
