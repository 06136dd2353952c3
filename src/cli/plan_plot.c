/*
 * gnuplot for `isokv plan --plot`: the walk, the frontier cloud and hull, a jump's two
 * isoquants, the measured points.
 *
 *   1. the series go to data files s0.dat, s1.dat, ... in a mkdtemp directory; labels are
 *      written double-quoted with any '"', '\' or control character replaced by '_';
 *   2. two empty files are made by mkstemp next to OUT.svg and OUT.png (same directory, so
 *      the final rename is atomic), after refusing targets that exist and are not regular
 *      files (a directory, a device, a FIFO, a symlink): a rename over them would replace or
 *      misdirect something that is not ours;
 *   3. the script names every path and title in gnuplot single quotes, where the only special
 *      character is the quote itself (written twice); a control character in a title becomes a
 *      space (a newline would end the string's line), names holding one are refused;
 *   4. gnuplot runs by fork + execvp("gnuplot", {"gnuplot", script}): no shell sees any of it;
 *   5. on success the temporary files are renamed onto OUT.svg and OUT.png; on any failure
 *      they are removed, so no partial output is ever left.
 */
#include "plan_plot.h"

#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SERIES 16

/* Writes s into f as a gnuplot single-quoted string: a quote is written twice, a control
 * character (which could end the script line inside the string) becomes a space. Paths never
 * reach here with one (has_control refuses them). */
static void put_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc((unsigned char)*s < 0x20 || *s == 0x7f ? ' ' : *s, f);
    }
    fputc('\'', f);
}

static int has_control(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
    return 0;
}

/* Writes a label as a double-quoted data-file string, unsafe characters replaced. */
static void put_label(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++)
        fputc(*s == '"' || *s == '\\' || (unsigned char)*s < 0x20 ? '_' : *s, f);
    fputc('"', f);
}

/* Refuses an existing non-regular target; 0 when it is absent or a regular file. */
static int target_ok(const char *cmd, const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return cli_fail(cmd, "--plot: %s exists and is not a regular file; not replacing it", path);
    if (has_control(path))
        return cli_fail(cmd, "--plot: the file name must not hold control characters");
    return 0;
}

/* Makes an empty temporary file next to path (path.XXXXXX); 0 or -1. */
static int make_sibling(const char *path, char *tmp, size_t cap) {
    if ((size_t)snprintf(tmp, cap, "%s.XXXXXX", path) >= cap) return -1;
    int fd = mkstemp(tmp);
    if (fd < 0) return -1;
    mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, 0666 & ~mask); /* mkstemp makes 0600; the image gets the usual mode */
    close(fd);
    return 0;
}

static int run_gnuplot(const char *script) {
    char *const argv[] = {"gnuplot", (char *)script, NULL};
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execvp("gnuplot", argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Removes dir/s<i>.dat for i < ns, dir/plot.gp and dir. */
static void remove_dir(const char *dir, size_t ns) {
    char path[4200];
    for (size_t i = 0; i < ns; i++) {
        snprintf(path, sizeof path, "%s/s%zu.dat", dir, i);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/plot.gp", dir);
    unlink(path);
    rmdir(dir);
}

int plan_plot(const char *cmd, const char *out, const char *title, const char *xlabel,
              const char *ylabel, const plan_series *s, size_t ns) {
    if (ns > MAX_SERIES) return cli_fail(cmd, "--plot: too many series");
    size_t ol = strlen(out);
    if (ol == 0 || ol >= 4000) return cli_fail(cmd, "--plot: empty or too long file name");
    char png[4096];
    if (ol > 4 && !strcmp(out + ol - 4, ".svg"))
        snprintf(png, sizeof png, "%.*s.png", (int)(ol - 4), out);
    else
        snprintf(png, sizeof png, "%s.png", out);
    if (target_ok(cmd, out) || target_ok(cmd, png)) return IKV_EXIT_FAIL;

    const char *td = getenv("TMPDIR");
    char dir[4096];
    if (!td || !*td || strlen(td) >= 3000 || has_control(td)) td = "/tmp";
    snprintf(dir, sizeof dir, "%s/isokv-plot-XXXXXX", td);
    if (!mkdtemp(dir))
        return cli_fail(cmd, "cannot create a temporary directory: %s", strerror(errno));

    int bad = 0;
    char path[4200];
    for (size_t i = 0; i < ns && !bad; i++) {
        snprintf(path, sizeof path, "%s/s%zu.dat", dir, i);
        FILE *f = fopen(path, "w");
        if (!f) {
            bad = 1;
            break;
        }
        size_t written = 0;
        for (size_t k = 0; k < s[i].n; k++) {
            if (!(s[i].x[k] > 0) || !(s[i].y[k] > 0)) continue; /* log axes: drop <= 0, NAN */
            fprintf(f, "%.6g %.6g ", s[i].x[k], s[i].y[k]);
            put_label(f, s[i].labels ? s[i].labels[k] : "");
            fputc('\n', f);
            written++;
        }
        if (!written) fprintf(f, "NaN NaN \"\"\n"); /* gnuplot refuses an empty file */
        bad |= ferror(f) != 0;
        bad |= fclose(f) != 0;
    }
    char tsvg[4200], tpng[4200];
    if (bad) {
        remove_dir(dir, ns);
        return cli_fail(cmd, "cannot write the plot data in %s", dir);
    }
    if (make_sibling(out, tsvg, sizeof tsvg)) {
        int e = errno;
        remove_dir(dir, ns);
        return cli_fail(cmd, "cannot write %s: %s", out, strerror(e));
    }
    if (make_sibling(png, tpng, sizeof tpng)) {
        int e = errno;
        unlink(tsvg);
        remove_dir(dir, ns);
        return cli_fail(cmd, "cannot write %s: %s", png, strerror(e));
    }

    snprintf(path, sizeof path, "%s/plot.gp", dir);
    FILE *g = fopen(path, "w");
    if (g) {
        fputs("set terminal svg size 1000,680 dynamic background rgb 'white'\nset output ", g);
        put_quoted(g, tsvg);
        fputs("\nset title ", g);
        put_quoted(g, title);
        fputs(" noenhanced\nset xlabel ", g);
        put_quoted(g, xlabel);
        fputs("\nset ylabel ", g);
        put_quoted(g, ylabel);
        fputs("\nset logscale xy\nset grid\nset key top right noenhanced\n"
              "set datafile separator whitespace\nplot ",
              g);
        for (size_t i = 0; i < ns; i++) {
            char dat[4200];
            snprintf(dat, sizeof dat, "%s/s%zu.dat", dir, i);
            if (i) fputs(", \\\n     ", g);
            put_quoted(g, dat);
            fprintf(g, " using 1:2%s with %s ", s[i].labels ? ":3" : "", s[i].with);
            if (s[i].title) {
                fputs("title ", g);
                put_quoted(g, s[i].title);
            } else {
                fputs("notitle", g);
            }
        }
        fputs("\nset terminal pngcairo size 1000,680 background rgb 'white'\nset output ", g);
        put_quoted(g, tpng);
        fputs("\nreplot\nset output\n", g);
        bad |= ferror(g) != 0;
        bad |= fclose(g) != 0;
    } else {
        bad = 1;
    }
    int rc = bad ? -2 : run_gnuplot(path);
    remove_dir(dir, ns);
    if (rc) {
        unlink(tsvg);
        unlink(tpng);
        if (rc == -2) return cli_fail(cmd, "cannot write the gnuplot script");
        return cli_fail(cmd, "gnuplot failed (exit %d); is gnuplot installed (scripts/deps.sh)?",
                        rc);
    }
    if (rename(tsvg, out)) {
        int e = errno;
        unlink(tsvg);
        unlink(tpng);
        return cli_fail(cmd, "cannot write %s: %s", out, strerror(e));
    }
    if (rename(tpng, png)) {
        int e = errno;
        unlink(tpng);
        return cli_fail(cmd, "cannot write %s: %s", png, strerror(e));
    }
    return IKV_EXIT_OK;
}
