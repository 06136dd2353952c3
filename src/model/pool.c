/*
 * A small persistent worker pool for the forward pass: n - 1 threads started once, at engine
 * creation, plus the calling thread as thread 0. ikv__pool_run(fn, ctx) runs fn(ctx, t, n) on
 * every thread t = 0..n-1 and returns when all have finished (a fork-join region); the
 * forward pass is a fixed sequence of such regions, each with a fixed partition of its work
 * by thread index, so which thread computes what never depends on timing and results are
 * the same bits run after run.
 *
 *     caller (t = 0)            workers (t = 1..n-1)
 *     fn, ctx; gen++   ----->   see gen change (spin, then sleep on work_cv)
 *     fn(ctx, 0, n)             fn(ctx, t, n); pending--
 *     wait pending == 0 <-----  the last one wakes the caller if it sleeps
 *
 * Waiting spins for a bounded number of pause instructions first (regions are short: tens of
 * microseconds to milliseconds, and a futex wake costs several microseconds), then yields the
 * CPU a bounded number of times (more threads than free cores: the thread waited for may need
 * this CPU), then sleeps on a condition variable, so an idle engine burns no CPU. Measured here
 * on 2 cores: about 1.3 us per empty region with 2 threads. Posting a region and finishing one cost
 * a few atomic operations; the mutex is taken only when someone sleeps: a sleeper first
 * announces itself in an atomic counter and then rechecks under the mutex, and the other side
 * publishes (gen or pending) before it reads that counter, both sequentially consistent, so a
 * wake-up cannot be lost. ikv__pool_run does not allocate.
 *
 * Shares and active threads. The work of a region is always cut into n shares (fn(ctx, s, n),
 * s = 0..n-1, n fixed at create); ikv__pool_set_active(k) lets only threads 0..k-1 run them,
 * thread t the shares t, t + k, t + 2k, ... in that order, one after the other. A share's
 * arithmetic depends only on (s, n) and the shapes, never on which thread runs it or what ran
 * before on that thread (each share has its own scratch), so the results are the same bits at
 * every k: fewer threads only means the shares run in sequence. Threads k..n-1 park on park_cv
 * (no spinning: an idle share of the CPU is really idle):
 *
 *     shrink to k: active = k, a region with no work (fn NULL) to the current threads;
 *                  those with t >= k finish it, then wait on park_cv while active <= t
 *     grow to k:   active = k, unparking = the parked threads now below k, broadcast park_cv;
 *                  the caller waits (mu, done_cv) until each of them has taken the current
 *                  gen as seen, so none mistakes an older region for new work
 *
 * Both happen only between regions, from the one caller thread.
 *
 * Barriers inside a region (ikv__pool_barrier). A region whose phases depend on each other's
 * results (decode's fused verify pass: projections, then attention over every row's K/V, then
 * the next layer) can run as ONE region with barriers between the phases instead of one region
 * per phase: a barrier is one atomic add per thread and a spin on a phase counter (the last
 * thread to arrive resets the count, then bumps the phase, both sequentially consistent, so a
 * thread that leaves and reaches the next barrier first cannot count twice). Waiting pauses
 * BAR_PAUSES rounds, then yields (never sleeps: a region is short, and every thread of it is
 * running or runnable). Only where every share has its own thread (active == n): with fewer
 * threads, shares run one after another on a thread and a barrier inside one would wait for a
 * share that cannot start.
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SPIN_PAUSES 4000 /* pause instructions before yielding (~50-200 us) */
#define SPIN_YIELDS 50   /* sched_yield calls before sleeping */
/* In-region barrier: pauses before yielding. Short: on a quiet machine the threads of a
 * fused pass reach a barrier within a few microseconds of each other, and a yield with
 * nothing else runnable returns at once, so polling by yields costs nothing there; with other
 * jobs on the cores, a long spin is what a waiting thread burns while the one it waits for
 * is off-CPU (measured, 128-row verify of stories260K, 2 threads, load average 4-5 from
 * niced jobs: best of 9 1.69-0.96 ms at 30 pauses, 1.70-1.78 at 300, 1.82-1.85 at 1000,
 * 2.19-2.27 at 4000; 1.58 on one thread). */
#ifndef BAR_PAUSES
#define BAR_PAUSES 30
#endif

struct worker {
    struct ikv__pool *pool;
    int tid;
};

struct ikv__pool {
    int n; /* threads, the caller included */
    pthread_t *th;
    struct worker *w;
    int started; /* worker threads running */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_uint gen;     /* region counter: a change means new work (or stop) */
    atomic_int pending;  /* workers that have not finished the current region */
    atomic_int sleepers; /* workers about to sleep or sleeping on work_cv */
    atomic_int caller_asleep;
    atomic_int stop;
    atomic_int active; /* threads running shares, 1..n (the rest park) */
    int unparking;     /* (mu) parked workers woken by a grow that have not resumed yet */
    pthread_cond_t park_cv;
    uint64_t *ran; /* [n] regions each thread ran shares in (its own slot only) */
    atomic_int bar_count;  /* threads arrived at the current barrier (ikv__pool_barrier) */
    atomic_uint bar_phase; /* barriers passed */
    ikv__task fn;  /* current region (NULL: a shrink with no work); written before gen++ */
    void *ctx;
};

/* Runs the shares of thread t of the current region: t, t + k, ... < n. */
static void run_shares(struct ikv__pool *p, int t, int k) {
    for (int sh = t; sh < p->n; sh += k)
        p->fn(p->ctx, sh, p->n);
    p->ran[t]++;
}

/* One round of waiting: a pause for the first SPIN_PAUSES rounds, then sched_yield (with more
 * threads than free cores, the thread being waited for may be off-CPU: spinning would only
 * delay it). Returns 0 once the caller should sleep instead. */
static inline int relax(int round) {
    if (round < SPIN_PAUSES) {
#if defined(__SSE2__)
        _mm_pause();
#endif
        return 1;
    }
    if (round < SPIN_PAUSES + SPIN_YIELDS) {
        sched_yield();
        return 1;
    }
    return 0;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct ikv__pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load(&p->gen);
        for (int i = 0; g == seen && relax(i); i++)
            g = atomic_load(&p->gen);
        if (g == seen) {
            atomic_fetch_add(&p->sleepers, 1);
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen)
                pthread_cond_wait(&p->work_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        /* read before finishing the region: the caller changes active only after it */
        const int act = atomic_load(&p->active);
        if (p->fn && w->tid < act) run_shares(p, w->tid, act);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
        if (w->tid >= act) { /* parked until a grow includes this thread */
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->active) <= w->tid && !atomic_load(&p->stop))
                pthread_cond_wait(&p->park_cv, &p->mu);
            if (atomic_load(&p->stop)) {
                pthread_mutex_unlock(&p->mu);
                return NULL;
            }
            seen = atomic_load(&p->gen); /* no region is posted before unparking reaches 0 */
            if (--p->unparking == 0) pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Publishes a new generation and wakes sleeping workers. */
static void post(struct ikv__pool *p) {
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Waits until every worker of the current region has finished it. */
static void wait_pending(struct ikv__pool *p) {
    for (int i = 0; atomic_load(&p->pending) && relax(i); i++)
        ;
    if (atomic_load(&p->pending)) {
        atomic_store(&p->caller_asleep, 1);
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending))
            pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
        atomic_store(&p->caller_asleep, 0);
    }
}

void ikv__pool_run(struct ikv__pool *p, ikv__task fn, void *ctx) {
    const int k = atomic_load(&p->active);
    p->fn = fn;
    p->ctx = ctx;
    if (k == 1) { /* every share here, in order */
        run_shares(p, 0, 1);
        return;
    }
    atomic_store(&p->pending, k - 1);
    post(p);
    run_shares(p, 0, k);
    wait_pending(p);
}

void ikv__pool_barrier(struct ikv__pool *p, int P) {
    if (P <= 1) return;
    IKV_ASSERT(P == atomic_load(&p->active) && P == p->n);
    const unsigned ph = atomic_load(&p->bar_phase);
    if (atomic_fetch_add(&p->bar_count, 1) == P - 1) {
        atomic_store(&p->bar_count, 0);
        atomic_fetch_add(&p->bar_phase, 1);
        return;
    }
    for (int i = 0; atomic_load(&p->bar_phase) == ph; i++) {
        if (i < BAR_PAUSES) {
#if defined(__SSE2__)
            _mm_pause();
#endif
        } else {
            sched_yield();
            i = BAR_PAUSES; /* no overflow, keep yielding */
        }
    }
}

int ikv__pool_set_active(struct ikv__pool *p, int k) {
    if (k < 1 || k > p->n)
        return ikv_error(IKV_EINVAL, "%d threads requested, the engine has 1..%d", k, p->n);
    const int old = atomic_load(&p->active);
    if (k < old) {
        /* a region without work to the old threads; those >= k park after it */
        p->fn = NULL;
        atomic_store(&p->active, k);
        atomic_store(&p->pending, old - 1);
        post(p);
        wait_pending(p);
    } else if (k > old) {
        pthread_mutex_lock(&p->mu);
        p->unparking = k - old;
        atomic_store(&p->active, k);
        pthread_cond_broadcast(&p->park_cv);
        while (p->unparking)
            pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    return 0;
}

int ikv__pool_active(const struct ikv__pool *p) {
    return atomic_load(&((struct ikv__pool *)p)->active);
}

uint64_t ikv__pool_ran(const struct ikv__pool *p, int t) {
    return t >= 0 && t < p->n ? p->ran[t] : 0;
}

double ikv__pool_worker_cpu(const struct ikv__pool *p) {
    double sum = 0;
    for (int i = 0; i < p->started; i++) {
        clockid_t cid;
        struct timespec ts;
        if (pthread_getcpuclockid(p->th[i], &cid) || clock_gettime(cid, &ts)) continue;
        sum += (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    }
    return sum;
}

int ikv__pool_size(const struct ikv__pool *p) {
    return p->n;
}

void ikv__pool_destroy(struct ikv__pool *p) {
    if (!p) return;
    if (p->started) {
        atomic_store(&p->stop, 1);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->work_cv);
        pthread_cond_broadcast(&p->park_cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->started; i++)
            pthread_join(p->th[i], NULL);
    }
    pthread_cond_destroy(&p->park_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    ikv_free(p->th);
    ikv_free(p->w);
    ikv_free(p->ran);
    ikv_free(p);
}

int ikv__pool_create(int n, struct ikv__pool **out) {
    if (n < 1 || n > 256) return ikv_error(IKV_EINVAL, "pool of %d threads not in 1..256", n);
    struct ikv__pool *p = ikv_calloc(1, sizeof *p);
    if (!p) return ikv_error(IKV_ENOMEM, "worker pool");
    p->n = n;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_asleep, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->active, n);
    atomic_init(&p->bar_count, 0);
    atomic_init(&p->bar_phase, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    pthread_cond_init(&p->park_cv, NULL);
    if (!(p->ran = ikv_calloc((size_t)n, sizeof *p->ran))) {
        ikv__pool_destroy(p);
        return ikv_error(IKV_ENOMEM, "worker pool of %d threads", n);
    }
    if (n > 1) {
        p->th = ikv_calloc((size_t)n - 1, sizeof *p->th);
        p->w = ikv_calloc((size_t)n - 1, sizeof *p->w);
        if (!p->th || !p->w) {
            ikv__pool_destroy(p);
            return ikv_error(IKV_ENOMEM, "worker pool of %d threads", n);
        }
        for (int i = 0; i < n - 1; i++) {
            p->w[i].pool = p;
            p->w[i].tid = i + 1;
            if (pthread_create(&p->th[i], NULL, worker_main, &p->w[i])) {
                ikv__pool_destroy(p);
                return ikv_error(IKV_ENOMEM, "cannot start worker thread %d of %d", i + 1, n);
            }
            p->started = i + 1;
        }
    }
    *out = p;
    return 0;
}
