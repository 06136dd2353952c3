/*
 * The efficient frontier of the compute-latency trade: instead of the seven steps in a fixed
 * order, every combination of their levers, evaluated on the same roofline (walk.c).
 *
 *   cloud    kernels {naive, fused} x TP {1, 2, .., tp.size} x nodes {1..Nmax} x draft length
 *            {off, 1..Gmax} x branches {1..Bmax} x copies {1..Hmax} x batch {b, b/2, .., 1}
 *            x polling {off, on at batch 1}: ~55,000 points at the defaults, each one
 *            evaluation (about a microsecond); infeasible points (weights + KV do not fit, more
 *            GPUs than cap.max_gpus, a lever above max_level) are kept but flagged.
 *   Pareto   sort by (L, C); a point survives when its C is below every C seen so far: the
 *            survivors are the non-dominated points, L rising and C falling. O(n log n).
 *   hull     the lower convex hull of C against L of those points (Andrew's monotone chain,
 *            1979, on the lower side only): the cheapest compute at which each latency can be
 *            bought by mixing configurations. Along it the MRTS dC / (-dL) of consecutive
 *            segments rises strictly, by construction: a point above a chord is dropped, and so
 *            are collinear ones.
 *
 *      C |  x        x   x
 *        |   o x  x     x          o hull vertices, fastest (left) to cheapest (right);
 *        |    \    x  x  x         the hull is reported cheapest first
 *        |     o.   x  x
 *        |        o-----o----o
 *        +---------------------- L
 *
 *   knee     the hull point of highest cumulative net utility value(-dL) - price dC from the
 *            cheapest point (ties: the cheaper). With a linear value of latency it is where the
 *            segment MRTS first exceeds value_per_s * 3600 / price; with a utility curve, where
 *            the MRTS crosses the curve's slope.
 *   walk     each step of the seven-step walk is then placed against the hull: a vertex (or on
 *            a segment), above it (undominated but a mix of neighbours is cheaper), dominated
 *            (another configuration is as cheap and as fast, and better in one), or infeasible;
 *            its excess compute over the hull at its latency; and whether its MRTS is below an
 *            earlier step's (out of order: it should have come first).
 *
 * Memory: the cloud (48 bytes a point) and a scratch array of the same count, allocated
 * through ikv_malloc and freed by ikv_plan_frontier_free; nothing else allocates.
 */
#include "isokv/base.h"
#include "isokv/plan.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const where_names[] = {"on hull", "above hull", "dominated", "infeasible"};

const char *ikv_plan_where_name(ikv_plan_where w) {
    return (unsigned)w < 4 ? where_names[w] : "?";
}

/* Orders by latency, then compute: the sweep order of the Pareto filter. */
static int cmp_lc(const void *a, const void *b) {
    const ikv_plan_xy *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    if (x->c != y->c) return x->c < y->c ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

size_t ikv_plan_pareto(ikv_plan_xy *pts, size_t n) {
    if (n == 0) return 0;
    qsort(pts, n, sizeof *pts, cmp_lc);
    size_t k = 0;
    double best_c = INFINITY;
    for (size_t i = 0; i < n; i++)
        if (pts[i].c < best_c) {
            best_c = pts[i].c;
            ikv_plan_xy t = pts[k];
            pts[k++] = pts[i];
            pts[i] = t;
        }
    /* L ascending, C descending -> reverse: cheapest first */
    for (size_t i = 0; i < k / 2; i++) {
        ikv_plan_xy t = pts[i];
        pts[i] = pts[k - 1 - i];
        pts[k - 1 - i] = t;
    }
    return k;
}

/* z of (a - o) x (b - o) in the (L, C) plane. */
static double cross(const ikv_plan_xy *o, const ikv_plan_xy *a, const ikv_plan_xy *b) {
    return (a->l - o->l) * (b->c - o->c) - (a->c - o->c) * (b->l - o->l);
}

size_t ikv_plan_lower_hull(const ikv_plan_xy *pts, size_t k, size_t *hull) {
    /* monotone chain over L ascending (the Pareto order reversed): keep left turns only */
    size_t h = 0;
    for (size_t j = k; j-- > 0;) {
        while (h >= 2 && cross(&pts[hull[h - 2]], &pts[hull[h - 1]], &pts[j]) <= 0)
            h--;
        hull[h++] = j;
    }
    /* fastest first -> cheapest first */
    for (size_t i = 0; i < h / 2; i++) {
        size_t t = hull[i];
        hull[i] = hull[h - 1 - i];
        hull[h - 1 - i] = t;
    }
    return h;
}

/* The batch sizes of the sweep: b, b/2, ..., 1 (n written, at most 32). */
static size_t batches(uint32_t b, uint32_t *out) {
    size_t n = 0;
    for (; b >= 1 && n < 32; b /= 2)
        out[n++] = b;
    if (out[n - 1] != 1 && n < 32) out[n++] = 1;
    return n;
}

static uint32_t umax(double a, double b) {
    return (uint32_t)(a > b ? a : b);
}

void ikv_plan_frontier_free(ikv_plan_frontier *f) {
    if (!f) return;
    ikv_free(f->cloud);
    ikv_free(f->hull);
    ikv_free(f->hull_cfg);
    memset(f, 0, sizeof *f);
}

double ikv_plan_frontier_compute_at(const ikv_plan_frontier *f, double l) {
    if (!f->n_hull) return NAN;
    const ikv_plan_step *h = f->hull;
    if (l >= h[0].latency_s) return h[0].compute_gpu_s;
    for (size_t i = 0; i + 1 < f->n_hull; i++)
        if (l >= h[i + 1].latency_s) {
            double t = (h[i].latency_s - l) / (h[i].latency_s - h[i + 1].latency_s);
            return h[i].compute_gpu_s + t * (h[i + 1].compute_gpu_s - h[i].compute_gpu_s);
        }
    return NAN;
}

/* Places the seven-step walk against the hull (see the top). */
static void place_walk(const ikv_plan_params *p, const ikv_plan_result *w, ikv_plan_frontier *f) {
    double max_mrts = -INFINITY;
    for (int k = 0; k < IKV_PLAN_STEPS; k++) {
        const ikv_plan_step *s = &w->steps[k];
        double C = s->compute_gpu_s, L = s->latency_s;
        f->walk_dominated_by[k] = -1;
        f->walk_excess[k] = C - ikv_plan_frontier_compute_at(f, L);
        if (!s->fits || s->gpus > p->cap_max_gpus) {
            f->walk_where[k] = IKV_PLAN_INFEASIBLE;
        } else {
            double best = INFINITY;
            for (size_t i = 0; i < f->n_cloud; i++) {
                const ikv_plan_cloud_pt *q = &f->cloud[i];
                if (!q->pareto || q->compute_gpu_s > C || q->latency_s > L) continue;
                if (!(q->compute_gpu_s < C || q->latency_s < L)) continue;
                if (q->compute_gpu_s < best) {
                    best = q->compute_gpu_s;
                    f->walk_dominated_by[k] = (long)i;
                }
            }
            if (f->walk_dominated_by[k] >= 0)
                f->walk_where[k] = IKV_PLAN_DOMINATED;
            else
                f->walk_where[k] =
                    f->walk_excess[k] <= 1e-9 * C ? IKV_PLAN_ON_HULL : IKV_PLAN_ABOVE_HULL;
        }
        if (k > 0 && !isnan(s->mrts)) {
            f->walk_out_of_order[k] = s->mrts < max_mrts;
            if (s->mrts > max_mrts) max_mrts = s->mrts;
        }
    }
}

int ikv_plan_frontier_build(const ikv_plan_params *p, const ikv_model_spec *model,
                            const ikv_hw_spec *hw, int max_level, ikv_plan_frontier *out) {
    memset(out, 0, sizeof *out);
    ikv__plan_ctx x;
    int rc = ikv__plan_setup(p, model, hw, &x);
    if (rc) return rc;
    if (max_level < 0 || max_level > 7)
        return ikv_error(IKV_ERANGE, "frontier: max_level %d is not a step 0..7", max_level);
    uint32_t bs[32];
    size_t nb = batches((uint32_t)p->batch, bs);
    uint32_t n_tp = 0;
    for (uint32_t t = 1; t <= (uint32_t)p->tp_size; t *= 2)
        n_tp++;
    uint32_t nmax = umax(p->pp_nodes, p->fr_max_nodes), gmax = umax(p->spec_gamma, p->fr_max_gamma);
    uint32_t bmax = umax(p->search_branches, p->fr_max_branches);
    uint32_t hmax = umax(p->hedge_copies, p->fr_max_copies);
    size_t n = 2 * (size_t)n_tp * nmax * (gmax + 1) * bmax * hmax * (nb + 1);
    if (n > IKV_PLAN_MAX_CLOUD)
        return ikv_error(IKV_ERANGE,
                         "frontier: %zu configurations exceed the limit of %d; lower "
                         "frontier.max_nodes/max_gamma/max_branches/max_copies",
                         n, IKV_PLAN_MAX_CLOUD);
    ikv_plan_frontier f = {.base_tp = x.base_tp, .max_level = max_level};
    f.cloud = ikv_malloc(n * sizeof *f.cloud);
    ikv_plan_xy *xy = ikv_malloc(n * sizeof *xy);
    if (!f.cloud || !xy) {
        ikv_free(f.cloud);
        ikv_free(xy);
        return ikv_error(IKV_ENOMEM, "frontier: %zu configurations", n);
    }
    size_t m = 0, nf = 0;
    ikv_plan_config c;
    memset(&c, 0, sizeof c);
    for (c.kernels = 0; c.kernels <= 1; c.kernels++)
        for (c.tp = 1; c.tp <= (uint32_t)p->tp_size; c.tp *= 2)
            for (c.nodes = 1; c.nodes <= nmax; c.nodes++)
                for (c.gamma = 0; c.gamma <= gmax; c.gamma++)
                    for (c.branches = 1; c.branches <= bmax; c.branches++)
                        for (c.copies = 1; c.copies <= hmax; c.copies++)
                            for (size_t bi = 0; bi < nb; bi++)
                                for (c.poll = 0; c.poll <= (bs[bi] == 1); c.poll++) {
                                    c.batch = bs[bi];
                                    ikv_plan_step s;
                                    ikv__plan_eval(&x, &c, &s);
                                    IKV_ASSERT(m < n);
                                    ikv_plan_cloud_pt *q = &f.cloud[m];
                                    q->cfg = c;
                                    q->compute_gpu_s = s.compute_gpu_s;
                                    q->latency_s = s.latency_s;
                                    q->level = (uint8_t)s.step;
                                    q->pareto = 0;
                                    q->feasible = s.fits && s.gpus <= p->cap_max_gpus &&
                                                  s.step <= max_level && isfinite(s.latency_s) &&
                                                  isfinite(s.compute_gpu_s);
                                    if (q->feasible) {
                                        xy[nf].c = q->compute_gpu_s;
                                        xy[nf].l = q->latency_s;
                                        xy[nf].id = m;
                                        nf++;
                                    }
                                    m++;
                                }
    f.n_cloud = m;
    f.n_feasible = nf;
    f.n_pareto = ikv_plan_pareto(xy, nf);
    for (size_t i = 0; i < f.n_pareto; i++)
        f.cloud[xy[i].id].pareto = 1;
    /* the hull indices reuse the scratch behind the Pareto points: hull[] needs n_pareto
     * slots, taken as size_t from a separate allocation for clarity */
    size_t *hidx = ikv_malloc((f.n_pareto ? f.n_pareto : 1) * sizeof *hidx);
    if (!hidx) {
        ikv_free(xy);
        ikv_free(f.cloud);
        return ikv_error(IKV_ENOMEM, "frontier: hull of %zu points", f.n_pareto);
    }
    f.n_hull = ikv_plan_lower_hull(xy, f.n_pareto, hidx);
    f.hull = ikv_malloc((f.n_hull ? f.n_hull : 1) * sizeof *f.hull);
    f.hull_cfg = ikv_malloc((f.n_hull ? f.n_hull : 1) * sizeof *f.hull_cfg);
    if (!f.hull || !f.hull_cfg) {
        ikv_free(hidx);
        ikv_free(xy);
        ikv_plan_frontier_free(&f);
        return ikv_error(IKV_ENOMEM, "frontier: hull of %zu points", f.n_hull);
    }
    double u = 0, best_u = 0;
    for (size_t i = 0; i < f.n_hull; i++) {
        const ikv_plan_cloud_pt *q = &f.cloud[xy[hidx[i]].id];
        ikv_plan_step *s = &f.hull[i];
        f.hull_cfg[i] = q->cfg;
        ikv__plan_eval(&x, &q->cfg, s);
        if (i == 0) continue;
        const ikv_plan_step *prev = &f.hull[i - 1];
        s->d_compute = s->compute_gpu_s - prev->compute_gpu_s;
        s->d_latency = s->latency_s - prev->latency_s;
        s->mrts = s->d_compute / -s->d_latency;
        s->d_utility = ikv_plan_value(p, prev->latency_s, s->latency_s) -
                       p->price_gpu_hour / 3600.0 * s->d_compute;
        u += s->d_utility;
        if (u > best_u) {
            best_u = u;
            f.knee = (int)i;
        }
    }
    ikv_free(hidx);
    ikv_free(xy);
    f.mrts_threshold = p->price_gpu_hour > 0 ? p->value_per_s * 3600 / p->price_gpu_hour : INFINITY;
    if (max_level == 7) {
        ikv_plan_result w;
        rc = ikv_plan_walk(p, model, hw, &w);
        if (rc) {
            ikv_plan_frontier_free(&f);
            return rc;
        }
        place_walk(p, &w, &f);
    }
    *out = f;
    return 0;
}

int ikv_plan_frontier_check(const ikv_plan_frontier *f) {
    if (f->n_hull == 0)
        return f->n_feasible == 0 ? 1 : (ikv_error(IKV_EINVAL, "frontier: no hull"), 0);
    if (f->knee < 0 || (size_t)f->knee >= f->n_hull)
        return ikv_error(IKV_EINVAL, "frontier: knee %d outside the hull", f->knee), 0;
    for (size_t i = 0; i < f->n_hull; i++) {
        const ikv_plan_step *h = &f->hull[i];
        if (i > 0) {
            const ikv_plan_step *g = &f->hull[i - 1];
            if (!(h->latency_s < g->latency_s && h->compute_gpu_s > g->compute_gpu_s))
                return ikv_error(IKV_EINVAL, "frontier: hull point %zu not faster and dearer", i),
                       0;
            if (i > 1 && !(h->mrts > f->hull[i - 1].mrts))
                return ikv_error(IKV_EINVAL, "frontier: MRTS falls at hull point %zu", i), 0;
        }
        for (size_t j = 0; j < f->n_cloud; j++) {
            const ikv_plan_cloud_pt *q = &f->cloud[j];
            if (!q->feasible) continue;
            if (q->compute_gpu_s <= h->compute_gpu_s && q->latency_s <= h->latency_s &&
                (q->compute_gpu_s < h->compute_gpu_s || q->latency_s < h->latency_s))
                return ikv_error(IKV_EINVAL, "frontier: hull point %zu dominated by cloud %zu", i,
                                 j),
                       0;
        }
    }
    return 1;
}

void ikv_plan_frontier_dump(const ikv_plan_frontier *f, FILE *out) {
    fprintf(out,
            "frontier: %zu configurations, %zu feasible, %zu not dominated, %zu on the hull, "
            "levers up to step %d, base TP%u, knee %d, MRTS threshold %g\n",
            f->n_cloud, f->n_feasible, f->n_pareto, f->n_hull, f->max_level, f->base_tp, f->knee,
            f->mrts_threshold);
    for (size_t i = 0; i < f->n_hull; i++)
        fprintf(out, "  hull %zu: level %d %-44s C %.6g GPU-s L %.6g s MRTS %g\n", i,
                f->hull[i].step, f->hull[i].config, f->hull[i].compute_gpu_s, f->hull[i].latency_s,
                i ? f->hull[i].mrts : NAN);
    if (f->max_level == 7)
        for (int k = 0; k < IKV_PLAN_STEPS; k++)
            fprintf(out, "  walk step %d: %s, excess %g GPU-s%s, dominated by cloud %ld\n", k,
                    ikv_plan_where_name(f->walk_where[k]), f->walk_excess[k],
                    f->walk_out_of_order[k] ? ", out of order" : "", f->walk_dominated_by[k]);
}
