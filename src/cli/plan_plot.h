/*
 * The planner's plots: series of (latency, compute) points drawn by gnuplot on log-log axes.
 * See plan_plot.c for how the files are written and gnuplot is run.
 */
#ifndef ISOKV_CLI_PLAN_PLOT_H
#define ISOKV_CLI_PLAN_PLOT_H

#include <stddef.h>

typedef struct plan_series {
    const char *title; /* legend entry (escaped when written); NULL: no legend entry */
    const char *with;  /* gnuplot style after 'with', a constant of ours ("points pt 7 ...") */
    size_t n;
    const double *x, *y;       /* [n] latency (ms) and compute (GPU-s or CPU-s) */
    const char *const *labels; /* [n] point labels drawn next to the points, or NULL */
} plan_series;

/* Draws the series into `out` (SVG) and its .png sibling, one atomic output set (ikv_outset:
 * both appear or neither; a non-regular target is refused): data and script in a fresh
 * temporary directory, every string in the script written by cli_gp_string, gnuplot run by
 * cli_spawn_wait with an argument vector. Prints the reason and returns IKV_EXIT_FAIL on
 * failure (nothing left behind), IKV_EXIT_OK on success. */
int plan_plot(const char *cmd, const char *out, const char *title, const char *xlabel,
              const char *ylabel, const plan_series *s, size_t ns);

#endif
