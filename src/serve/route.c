/*
 * Routing inside the server: which step of the planner a request may use, what that step
 * changes in the request's real configuration, and the forward steps run accordingly.
 *
 * Decision (at parse, ikv__route_request): the walk router (ikv_plan_route on the walk computed
 * at start) or, with --route frontier, the frontier router (ikv_plan_route_frontier on the
 * frontier of the levers the request's class may use, one frontier per class built at start:
 * a simple request's frontier only has levers of steps 0..route.simple, so the hard cap holds
 * by construction; the knee and the SLO choose the point, as `isokv plan route --frontier`).
 *
 * Levers (srv_levers), the engine's real configuration for this request:
 *
 *   lever              walk router             frontier router
 *   threads = all      step >= 2 (tp)          the point's TP above the baseline's
 *   threads = 1        below                   otherwise
 *   speculation        step >= 3 (spec)        the point uses speculative decoding (gamma > 0)
 *     (--spec lookup: prompt-lookup drafts; --semantic-cache: the verified response cache,
 *     a cached answer as the draft; both verified as extra rows of the batched step)
 *
 * The lever of a step is never used below it, so no request runs past its class's step: the
 * request's own "isokv" switches (spec, semantic_cache) may turn speculation off, never on
 * past its step (http.c).
 *
 * Steps (ikv__route_step_run, mu released): the scheduler's one batched step is split into one
 * ikv_engine_step per thread count among its requests, ascending, each after
 * ikv_engine_set_threads(k). The engine's results are the same bits at any thread count, so a
 * request's output does not depend on its class or on the others. The cost of a mixed batch is
 * a second pass over the weights (the decode rows of each group go through every matrix
 * separately) and a park/unpark of the workers (a futex wake-up); a batch of one class is one
 * step as before.
 *
 * Accounting (ikv__route_step_account, mu held): per group, the CPU seconds of the scheduler
 * thread (CLOCK_THREAD_CPUTIME_ID) plus the engine's worker threads (their CPU clocks) over
 * the step, and the thread-seconds (wall time x threads: the occupancy, as GPU-seconds are in
 * the planner), are shared among the group's items by the rows each computed (a decode 1 plus
 * its draft rows, a prefill chunk its length). A request's cpu_s, thread_s and threads_max (the
 * most threads the engine ran any of its steps on) add up over its steps.
 */
#include "internal.h"

#include <string.h>
#include <time.h>

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double ikv__route_cpu_now(const ikv_serve *s) {
    return thread_cpu() + ikv_engine_worker_cpu(s->engine);
}

int ikv__route_setup_frontier(ikv_serve *s, const ikv_model_spec *m, const ikv_hw_spec *hw) {
    for (int c = 0; c < 3; c++) {
        ikv_route_req rq = {.cls = (ikv_req_class)c};
        int rc =
            ikv_plan_frontier_build(&s->plan, m, hw, ikv_plan_class_cap(&s->plan, &rq), &s->fr[c]);
        if (rc) return rc;
        s->n_fr = (size_t)c + 1;
        if (s->fr[c].n_hull == 0)
            return ikv_error(IKV_ERANGE, "--route frontier: no feasible configuration for class %s",
                             ikv_req_class_name((ikv_req_class)c));
    }
    return 0;
}

void ikv__route_free(ikv_serve *s) {
    for (size_t c = 0; c < s->n_fr; c++)
        ikv_plan_frontier_free(&s->fr[c]);
    s->n_fr = 0;
}

void ikv__route_request(ikv_serve *s, srq *r, ikv_req_class cls) {
    ikv_route_req rq = {.cls = cls, .slo_s = r->slo_ms / 1e3};
    const int all = s->max_threads;
    if (s->opt.route_frontier) {
        const ikv_plan_frontier *f = &s->fr[cls];
        int rc = ikv_plan_route_frontier(&s->plan, f, &rq, &r->route);
        IKV_ASSERT(rc == 0 && r->route.point >= 0); /* built per class cap, non-empty */
        const ikv_plan_config *cfg = &f->hull_cfg[r->route.point];
        r->lv.threads = cfg->tp > f->base_tp ? all : 1;
        r->lv.spec = cfg->gamma > 0;
    } else {
        ikv_plan_route(&s->plan, &s->walk, &rq, &r->route);
        r->lv.threads = r->route.step >= 2 ? all : 1;
        r->lv.spec = r->route.step >= 3;
    }
    r->lv.rcache = r->lv.spec && s->rcache;
    IKV_ASSERT(r->route.step <= r->route.class_cap); /* the hard cap */
    IKV_ASSERT(r->lv.threads == 1 || r->route.step >= 2);
    IKV_ASSERT(!r->lv.spec || r->route.step >= 3);
}

const char *ikv__route_step_name(const ikv_serve *s, const srq *r) {
    if (s->opt.route_frontier) return s->fr[r->cls].hull[r->route.point].name;
    return s->walk.steps[r->route.step].name;
}

const char *ikv__route_config(const ikv_serve *s, const srq *r) {
    if (s->opt.route_frontier) return s->fr[r->cls].hull[r->route.point].config;
    return s->walk.steps[r->route.step].config;
}

/* Rows an item computed: a decode with a draft its lead and every draft row (accepted or not),
 * otherwise its positions (a decode 1, a prefill chunk its length). */
static size_t item_rows(const ikv_step_item *it) {
    return it->k ? 1 + it->k : it->done;
}

void ikv__route_step_run(ikv_serve *s, ikv_step_item *items, srq **map, size_t n, srv_acct *acct) {
    /* stable insertion sort by thread count (n <= max_seqs): groups in ascending order */
    for (size_t i = 1; i < n; i++) {
        ikv_step_item it = items[i];
        srq *r = map[i];
        size_t j = i;
        while (j > 0 && map[j - 1]->lv.threads > r->lv.threads) {
            items[j] = items[j - 1];
            map[j] = map[j - 1];
            j--;
        }
        items[j] = it;
        map[j] = r;
    }
    for (size_t g0 = 0; g0 < n;) {
        size_t g1 = g0;
        while (g1 < n && map[g1]->lv.threads == map[g0]->lv.threads)
            g1++;
        int rc = ikv_engine_set_threads(s->engine, map[g0]->lv.threads);
        IKV_ASSERT(rc == 0); /* 1 or the engine's own count */
        const int k = ikv_engine_threads(s->engine);
        const double t0 = ikv_now(), c0 = ikv__route_cpu_now(s);
        rc = ikv_engine_step(s->engine, items + g0, g1 - g0);
        IKV_ASSERT(rc == 0); /* items are built from running sequences within their limits */
        const double wall = ikv_now() - t0, cpu = ikv__route_cpu_now(s) - c0;
        size_t rows = 0;
        for (size_t i = g0; i < g1; i++)
            rows += item_rows(&items[i]);
        for (size_t i = g0; i < g1; i++) {
            const double share = rows ? (double)item_rows(&items[i]) / (double)rows : 0;
            acct[i] = (srv_acct){
                .cpu_s = cpu * share, .thread_s = wall * k * share, .threads = k, .first = i == g0};
        }
        g0 = g1;
    }
}

void ikv__route_step_account(ikv_serve *s, srq **map, size_t n, const srv_acct *acct) {
    for (size_t i = 0; i < n; i++) {
        srq *r = map[i];
        r->cpu_s += acct[i].cpu_s;
        r->thread_s += acct[i].thread_s;
        if (acct[i].threads > r->threads_max) r->threads_max = acct[i].threads;
        if (acct[i].first) {
            int t = acct[i].threads < SRV_MAX_THREADS ? acct[i].threads : SRV_MAX_THREADS;
            s->met.steps_by_threads[t]++;
        }
    }
}
