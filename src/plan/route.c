/*
 * The router policy: which step of the walk one request may use.
 *
 *   max_step = min(class cap, knee, hard cap, budget cap)
 *     class cap: route.simple (2), route.medium (4), route.complex (6); step 7 only when the
 *                request allows it, and then a complex request may reach it;
 *     knee:      the step of highest cumulative marginal utility on this walk;
 *     hard cap:  the last feasible step that still lowers latency;
 *     budget:    the highest step whose compute fits the request's GPU-second budget.
 *   step = the cheapest (least GPU-seconds) step <= max_step that meets the latency SLO; if
 *          none does, the fastest step <= max_step (slo_met = 0); with no SLO, max_step.
 *
 * Pure and allocation-free: the server calls it per request on a walk computed at start.
 */
#include "isokv/base.h"
#include "isokv/plan.h"

#include <stdio.h>
#include <string.h>

static const char *const class_names[] = {"simple", "medium", "complex"};

int ikv_req_class_parse(const char *s, ikv_req_class *out) {
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, class_names[i])) {
            *out = (ikv_req_class)i;
            return 0;
        }
    return ikv_error(IKV_EPARAM, "unknown request class '%s' (known: simple, medium, complex)",
                     s ? s : "(null)");
}

const char *ikv_req_class_name(ikv_req_class c) {
    return (unsigned)c < 3 ? class_names[c] : "?";
}

static int imin(int a, int b) {
    return a < b ? a : b;
}

int ikv_plan_class_cap(const ikv_plan_params *p, const ikv_route_req *req) {
    double caps[3] = {p->route_simple, p->route_medium, p->route_complex};
    int cls = (unsigned)req->cls < 3 ? (int)req->cls : 2;
    int class_cap = (int)caps[cls];
    if (req->allow_poll && req->cls == IKV_CLASS_COMPLEX) class_cap = 7;
    if (!req->allow_poll) class_cap = imin(class_cap, 6);
    return class_cap;
}

void ikv_plan_route(const ikv_plan_params *p, const ikv_plan_result *w, const ikv_route_req *req,
                    ikv_route_decision *out) {
    memset(out, 0, sizeof *out);
    out->point = -1;
    int cls = (unsigned)req->cls < 3 ? (int)req->cls : 2;
    int class_cap = ikv_plan_class_cap(p, req);
    int budget_cap = IKV_PLAN_STEPS - 1;
    if (req->budget_gpu_s > 0) {
        budget_cap = 0;
        for (int k = 0; k < IKV_PLAN_STEPS; k++)
            if (w->steps[k].compute_gpu_s <= req->budget_gpu_s) budget_cap = k;
    }
    out->class_cap = class_cap;
    out->knee = w->knee;
    out->hard_cap = w->hard_cap;
    out->budget_cap = budget_cap;
    int max_step = imin(imin(class_cap, w->knee), imin(w->hard_cap, budget_cap));
    out->max_step = max_step;

    size_t len = 0;
    char *b = out->why;
    size_t cap = sizeof out->why;
#define WHY(...)                                                                                   \
    len += (size_t)snprintf(len < cap ? b + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__)
    WHY("class %s allows step %d%s; knee at step %d; hard cap %d", class_names[cls], class_cap,
        req->allow_poll ? " (step 7 allowed)" : "", w->knee, w->hard_cap);
    if (req->budget_gpu_s > 0)
        WHY("; budget %.3g GPU-s allows step %d", req->budget_gpu_s, budget_cap);
    WHY("; so at most step %d", max_step);

    if (req->slo_s <= 0) {
        out->step = max_step;
        out->slo_met = 1;
        WHY(".");
    } else {
        int best = -1, fastest = 0;
        for (int k = 0; k <= max_step; k++) {
            const ikv_plan_step *s = &w->steps[k];
            if (s->latency_s < w->steps[fastest].latency_s) fastest = k;
            if (s->latency_s <= req->slo_s &&
                (best < 0 || s->compute_gpu_s < w->steps[best].compute_gpu_s))
                best = k;
        }
        if (best >= 0) {
            out->step = best;
            out->slo_met = 1;
            WHY("; step %d is the cheapest meeting the %.0f ms SLO (%.0f ms, %.3g GPU-s).", best,
                req->slo_s * 1e3, w->steps[best].latency_s * 1e3, w->steps[best].compute_gpu_s);
        } else {
            out->step = fastest;
            out->slo_met = 0;
            WHY("; no step up to %d meets the %.0f ms SLO, the fastest is step %d (%.0f ms).",
                max_step, req->slo_s * 1e3, fastest, w->steps[fastest].latency_s * 1e3);
        }
    }
#undef WHY
}

int ikv_plan_route_frontier(const ikv_plan_params *p, const ikv_plan_frontier *f,
                            const ikv_route_req *req, ikv_route_decision *out) {
    memset(out, 0, sizeof *out);
    int cls = (unsigned)req->cls < 3 ? (int)req->cls : 2;
    int class_cap = ikv_plan_class_cap(p, req);
    if (f->max_level > class_cap)
        return ikv_error(IKV_EINVAL,
                         "router: the frontier allows levers up to step %d, class %s only %d",
                         f->max_level, class_names[cls], class_cap);
    out->point = -1;
    out->class_cap = class_cap;
    out->hard_cap = -1;
    out->knee = f->knee;
    if (f->n_hull == 0)
        return ikv_error(IKV_ERANGE, "router: no feasible configuration up to step %d", class_cap);
    int budget_cap = (int)f->n_hull - 1;
    if (req->budget_gpu_s > 0) {
        budget_cap = 0;
        for (size_t i = 0; i < f->n_hull; i++)
            if (f->hull[i].compute_gpu_s <= req->budget_gpu_s) budget_cap = (int)i;
    }
    out->budget_cap = budget_cap;
    int max_i = imin(f->knee, budget_cap);
    size_t len = 0;
    char *b = out->why;
    size_t cap = sizeof out->why;
#define WHY(...)                                                                                   \
    len += (size_t)snprintf(len < cap ? b + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__)
    WHY("class %s: the frontier of levers up to step %d has %zu points, knee at point %d",
        class_names[cls], class_cap, f->n_hull, f->knee);
    if (req->budget_gpu_s > 0)
        WHY("; budget %.3g GPU-s allows point %d", req->budget_gpu_s, budget_cap);
    int pick = max_i;
    out->slo_met = 1;
    if (req->slo_s > 0) {
        /* along the hull L falls and C rises: the first point meeting the SLO is the cheapest */
        pick = -1;
        for (int i = 0; i <= max_i && pick < 0; i++)
            if (f->hull[i].latency_s <= req->slo_s) pick = i;
        if (pick >= 0) {
            WHY("; point %d is the cheapest meeting the %.0f ms SLO (%.0f ms, %.3g GPU-s).", pick,
                req->slo_s * 1e3, f->hull[pick].latency_s * 1e3, f->hull[pick].compute_gpu_s);
        } else {
            pick = max_i;
            out->slo_met = 0;
            WHY("; no point up to %d meets the %.0f ms SLO, the fastest is point %d (%.0f ms).",
                max_i, req->slo_s * 1e3, pick, f->hull[pick].latency_s * 1e3);
        }
    } else {
        WHY("; so point %d.", pick);
    }
#undef WHY
    out->point = pick;
    out->step = f->hull[pick].step;
    out->max_step = class_cap;
    return 0;
}
