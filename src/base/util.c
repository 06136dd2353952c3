/*
 * Clock and progress bar.
 *
 * The progress bar redraws at most ten times a second, appears only after the work has run for
 * a second, and only on a terminal (or with IKV_PROGRESS=1), so scripted output stays clean.
 */
#include "isokv/base.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

double ikv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ikv_progress_init(ikv_progress *p, FILE *out, const char *label, uint64_t total) {
    const char *env = getenv("IKV_PROGRESS");
    p->out = out;
    p->label = label;
    p->total = total;
    p->done = 0;
    p->start = p->last_draw = ikv_now();
    p->drawn = 0;
    p->enabled = out && ((env && env[0] == '1') || (!env && isatty(fileno(out))));
}

static void draw(ikv_progress *p, double now) {
    double frac = p->total ? (double)p->done / (double)p->total : 0.0;
    if (frac > 1) frac = 1;
    int width = 30, fill = (int)(frac * width);
    double el = now - p->start;
    double eta = frac > 0 ? el * (1 - frac) / frac : 0;
    fprintf(p->out, "\r%-12s [", p->label ? p->label : "");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', p->out);
    fprintf(p->out, "] %5.1f%% %6.1fs eta %5.1fs", frac * 100, el, eta);
    fflush(p->out);
    p->drawn = 1;
    p->last_draw = now;
}

void ikv_progress_update(ikv_progress *p, uint64_t done) {
    p->done = done;
    if (!p->enabled) return;
    double now = ikv_now();
    if (now - p->start < 1.0 || now - p->last_draw < 0.1) return;
    draw(p, now);
}

void ikv_progress_done(ikv_progress *p) {
    if (!p->enabled || !p->drawn) return;
    p->done = p->total;
    draw(p, ikv_now());
    fputc('\n', p->out);
}
