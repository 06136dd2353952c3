/*
 * Small helpers shared by the subcommands: error printing, strict number parsing, running a
 * child program and writing user text into gnuplot scripts.
 * Numbers must use their whole string ("12x" is rejected), so a typo never becomes a silent 12.
 * Child programs (gnuplot) get an argument vector through posix_spawnp, never a shell: no user
 * string is ever parsed as a command.
 */
#include "cli.h"

#include "isokv/base.h"

#include <errno.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

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

int cli_parse_semcache(const char *v, uint64_t *entries, uint64_t *bytes) {
    uint64_t x;
    const size_t L = strlen(v);
    *bytes = 0;
    if (L && strchr("kKmMgGtT", v[L - 1])) { /* a byte budget */
        if (ikv_parse_count(v, &x) || x < 4096) return -1;
        *bytes = x;
        /* entries: room for entries of 2 KiB on average, 16 .. 1000000 */
        *entries = x / 2048 < 16 ? 16 : x / 2048 > 1000000 ? 1000000 : x / 2048;
        return 0;
    }
    if (ikv_parse_count(v, &x) || x == 0 || x > 1000000) return -1;
    *entries = x;
    return 0;
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

/* ---- child programs and gnuplot scripts -------------------------------------------------- */

int cli_find_program(const char *name) {
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/bin:/bin";
    size_t nl = strlen(name);
    while (*path) {
        size_t dl = strcspn(path, ":");
        char buf[4096];
        if (dl + nl + 2 <= sizeof buf) {
            if (dl)
                snprintf(buf, sizeof buf, "%.*s/%s", (int)dl, path, name);
            else
                snprintf(buf, sizeof buf, "./%s", name); /* an empty entry is the cwd */
            if (access(buf, X_OK) == 0) return 1;
        }
        path += dl;
        if (*path == ':') path++;
    }
    return 0;
}

int cli_spawn_wait(char *const argv[]) {
    pid_t pid;
    int err = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
    if (err) {
        errno = err;
        return -1;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* A gnuplot string literal is data only when it is single-quoted (no backquote command
 * substitution, no backslash escapes) and holds no quote and no control byte. Any other byte is
 * spelled as a double-quoted octal escape ("\047"), which gnuplot decodes to that byte and
 * nothing else, and the pieces are joined with gnuplot's '.' operator inside parentheses. */
void cli_gp_string(FILE *f, const char *s) {
    fputc('(', f);
    int open = 0, pieces = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = *p >= 0x20 && *p != 0x7f && *p != '\'';
        if (plain) {
            if (!open) fputs(pieces++ ? ".'" : "'", f), open = 1;
            fputc(*p, f);
        } else {
            if (open) fputc('\'', f), open = 0;
            fprintf(f, "%s\"\\%03o\"", pieces++ ? "." : "", *p);
        }
    }
    if (open) fputc('\'', f);
    if (!pieces) fputs("''", f);
    fputc(')', f);
}

/* Creates a file (cli.h) for writing in dir whose name nobody else uses ("x" mode: O_EXCL); *path
 * gets its name. NULL (errno set) when it cannot. */
FILE *cli_private_file(const char *dir, const char *ext, char *path, size_t n) {
    static unsigned counter;
    for (int tries = 0; tries < 100; tries++) {
        snprintf(path, n, "%s/.sweep.%ld.%u.%s", dir, (long)getpid(), counter++, ext);
        FILE *f = fopen(path, "wx");
        if (f || errno != EEXIST) return f;
    }
    return NULL;
}
