/*
 * gnuplot for `isokv plan --plot`: the walk, the frontier cloud and hull, a jump's two
 * isoquants, the measured points.
 *
 *   1. OUT.svg and OUT.png form one atomic output set (ikv_outset, src/base/outfile.c): a
 *      device, directory, FIFO or other non-regular target is refused up front, gnuplot
 *      writes the set's temporary files, and both are renamed into place only when gnuplot
 *      succeeded; on any failure they are removed, so no partial output is ever left;
 *   2. the series go to data files s0.dat, s1.dat, ... in a mkdtemp directory; labels are
 *      written double-quoted with any '"', '\\' or control character replaced by '_';
 *   3. every path and title in the script is written by cli_gp_string, which gnuplot reads
 *      back as exactly those bytes and never as code (quotes, backquotes, '@', newlines);
 *   4. gnuplot runs through cli_spawn_wait(argv): an argument vector, no shell.
 */
#include "plan_plot.h"

#include "cli.h"

#include "isokv/base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SERIES 16

/* Writes a label as a double-quoted data-file string, unsafe characters replaced. */
static void put_label(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++)
        fputc(*s == '"' || *s == '\\' || (unsigned char)*s < 0x20 ? '_' : *s, f);
    fputc('"', f);
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
    /* the two outputs, checked and given temporary files before any work */
    ikv_outset *outs = NULL;
    const char *tsvg = NULL, *tpng = NULL;
    int rc = ikv_outset_create(&outs);
    if (!rc) rc = ikv_outset_add(outs, out, NULL, &tsvg);
    if (!rc) rc = ikv_outset_add(outs, png, NULL, &tpng);
    if (rc) {
        ikv_outset_destroy(outs);
        return cli_fail(cmd, "--plot: %s", ikv_errdetail());
    }

    const char *td = getenv("TMPDIR");
    char dir[4096];
    if (!td || !*td || strlen(td) >= 3000) td = "/tmp";
    snprintf(dir, sizeof dir, "%s/isokv-plot-XXXXXX", td);
    if (!mkdtemp(dir)) {
        ikv_outset_destroy(outs);
        return cli_fail(cmd, "cannot create a temporary directory: %s", strerror(errno));
    }

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
    snprintf(path, sizeof path, "%s/plot.gp", dir);
    FILE *g = bad ? NULL : fopen(path, "w");
    if (g) {
        fputs("set termoption noenhanced\n"
              "set terminal svg size 1000,680 dynamic background rgb 'white'\nset output ",
              g);
        cli_gp_string(g, tsvg);
        fputs("\nset title ", g);
        cli_gp_string(g, title);
        fputs("\nset xlabel ", g);
        cli_gp_string(g, xlabel);
        fputs("\nset ylabel ", g);
        cli_gp_string(g, ylabel);
        fputs("\nset logscale xy\nset grid\nset key top right noenhanced\n"
              "set datafile separator whitespace\nplot ",
              g);
        for (size_t i = 0; i < ns; i++) {
            char dat[4200];
            snprintf(dat, sizeof dat, "%s/s%zu.dat", dir, i);
            if (i) fputs(", \\\n     ", g);
            cli_gp_string(g, dat);
            fprintf(g, " using 1:2%s with %s ", s[i].labels ? ":3" : "", s[i].with);
            if (s[i].title) {
                fputs("title ", g);
                cli_gp_string(g, s[i].title);
            } else {
                fputs("notitle", g);
            }
        }
        fputs("\nset terminal pngcairo size 1000,680 background rgb 'white'\nset output ", g);
        cli_gp_string(g, tpng);
        fputs("\nreplot\nset output\n", g);
        bad |= ferror(g) != 0;
        bad |= fclose(g) != 0;
    } else {
        bad = 1;
    }
    if (bad) {
        remove_dir(dir, ns);
        ikv_outset_destroy(outs);
        return cli_fail(cmd, "cannot write the plot data and script in %s", td);
    }
    fflush(stdout);
    char *argv[] = {"gnuplot", path, NULL};
    rc = cli_spawn_wait(argv);
    int e = errno;
    remove_dir(dir, ns);
    if (rc) {
        ikv_outset_destroy(outs);
        if (rc < 0 && e == ENOENT)
            return cli_fail(cmd,
                            "gnuplot not found on PATH: install gnuplot-nox (scripts/deps.sh)");
        if (rc < 0) return cli_fail(cmd, "cannot run gnuplot: %s", strerror(e));
        return cli_fail(cmd, "gnuplot failed (exit %d)", rc);
    }
    rc = ikv_outset_commit(outs);
    ikv_outset_destroy(outs);
    if (rc) return cli_fail(cmd, "--plot: %s", ikv_errdetail());
    return IKV_EXIT_OK;
}
