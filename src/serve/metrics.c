/*
 * Prometheus text exposition (format 0.0.4), written by hand: Debian has no C client library.
 * Every metric is named isokv_*, with a HELP and a TYPE line; docs/serve.md lists them.
 * Counters kept per tenant (up to SRV_MAX_TENANTS distinct names, the rest under "other"),
 * histograms with fixed buckets in seconds; engine and cache figures are the snapshot the
 * scheduler takes after each step (the engine belongs to its thread alone).
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int ikv__status_codes[8] = {200, 400, 401, 404, 413, 429, 503, 0};

int ikv__status_slot(int status) {
    for (int i = 0; i < 7; i++)
        if (ikv__status_codes[i] == status) return i;
    return 7;
}

static const double buckets[SRV_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                 0.25,  0.5,    1,     2.5,  5,     10,   30};

static void hist_add(srv_hist *h, double v) {
    size_t i = 0;
    while (i < SRV_HIST_BUCKETS && v > buckets[i])
        i++;
    h->count[i]++;
    h->sum += v;
    h->n++;
}

/* The stats of tenant `name`, created on first use ("other" once the table is full). */
static srv_tenant_stats *tenant_stats(srv_metrics *m, const char *name) {
    if (!name) name = "none"; /* /health, /metrics, rejected before a tenant is known */
    for (size_t i = 0; i < m->n_tenants; i++)
        if (!strcmp(m->tenants[i].name, name)) return &m->tenants[i];
    if (m->n_tenants == SRV_MAX_TENANTS) {
        srv_tenant_stats *o = &m->tenants[SRV_MAX_TENANTS];
        if (!o->name[0]) snprintf(o->name, sizeof o->name, "other");
        return o;
    }
    srv_tenant_stats *t = &m->tenants[m->n_tenants++];
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

void ikv__metrics_response(ikv_serve *s, const char *tenant, int status) {
    s->met.http_by_status[ikv__status_slot(status)]++;
    tenant_stats(&s->met, tenant)->req_by_status[ikv__status_slot(status)]++;
}

void ikv__metrics_request(ikv_serve *s, const srq *r) {
    srv_metrics *m = &s->met;
    if (r->status != 200 || r->cancelled) return; /* the HTTP side records the status */
    srv_tenant_stats *t = tenant_stats(m, r->tenant);
    t->prompt_tokens += r->n;
    t->cached_tokens += r->cached;
    for (size_t k = 0; k <= s->n_tiers; k++)
        t->cached_by_tier[k] += r->tier_tokens[k];
    t->completion_tokens += r->ntok;
    if (r->t_first > 0) hist_add(&m->ttft, r->t_first - r->t_arrive);
    if (r->ntok > 1 && r->t_first > 0)
        hist_add(&m->tpot, (r->t_done - r->t_first) / (double)(r->ntok - 1));
    hist_add(&m->e2e, r->t_done - r->t_arrive);
    m->route_req[r->cls][r->route.step]++;
    m->route_n[r->cls]++;
    m->route_e2e_s[r->cls] += r->t_done - r->t_arrive;
    m->route_cpu_s[r->cls] += r->cpu_s;
    m->route_thread_s[r->cls] += r->thread_s;
    m->route_threads[r->cls][r->threads_max < SRV_MAX_THREADS ? r->threads_max : SRV_MAX_THREADS]++;
}

typedef struct buf {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)k;
        char *q = ikv_realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
}

static void head(buf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One unlabelled sample with its HELP and TYPE lines. */
static void scalar(buf *b, const char *name, const char *type, const char *help,
                   unsigned long long v) {
    head(b, name, type, help);
    put(b, "%s %llu\n", name, v);
}

static void hist(buf *b, const char *name, const char *help, const srv_hist *h) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < SRV_HIST_BUCKETS; i++) {
        cum += h->count[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, buckets[i], (unsigned long long)cum);
    }
    cum += h->count[SRV_HIST_BUCKETS];
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
        (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
}

char *ikv__metrics_text(ikv_serve *s, size_t *len) {
    const srv_metrics *m = &s->met;
    buf b = {ikv_malloc(8192), 0, 8192, 0};
    if (!b.p) return NULL;
    b.p[0] = 0;
    size_t nt = m->n_tenants + (m->tenants[SRV_MAX_TENANTS].name[0] ? 1 : 0);
#define TENANT(i) (i < m->n_tenants ? &m->tenants[i] : &m->tenants[SRV_MAX_TENANTS])
    head(&b, "isokv_requests_total", "counter", "HTTP responses by tenant and status code");
    for (size_t i = 0; i < nt; i++)
        for (int k = 0; k < 8; k++)
            if (TENANT(i)->req_by_status[k])
                put(&b, "isokv_requests_total{tenant=\"%s\",status=\"%s%d\"} %llu\n",
                    TENANT(i)->name, k == 7 ? "other" : "", k == 7 ? 0 : ikv__status_codes[k],
                    (unsigned long long)TENANT(i)->req_by_status[k]);
    head(&b, "isokv_prompt_tokens_total", "counter", "prompt tokens of completed requests");
    for (size_t i = 0; i < nt; i++)
        put(&b, "isokv_prompt_tokens_total{tenant=\"%s\"} %llu\n", TENANT(i)->name,
            (unsigned long long)TENANT(i)->prompt_tokens);
    head(&b, "isokv_cached_prompt_tokens_total", "counter",
         "prompt tokens taken from the KV cache, by tenant and tier");
    for (size_t i = 0; i < nt; i++)
        for (size_t t = 0; t <= s->n_tiers; t++)
            put(&b, "isokv_cached_prompt_tokens_total{tenant=\"%s\",tier=\"%s\"} %llu\n",
                TENANT(i)->name, s->tier_name[t], (unsigned long long)TENANT(i)->cached_by_tier[t]);
    head(&b, "isokv_completion_tokens_total", "counter", "generated tokens of completed requests");
    for (size_t i = 0; i < nt; i++)
        put(&b, "isokv_completion_tokens_total{tenant=\"%s\"} %llu\n", TENANT(i)->name,
            (unsigned long long)TENANT(i)->completion_tokens);
#undef TENANT
    const ikv_engine_stats *e = &m->eng;
    const ikv_cache_stats *c = &m->cache;
    double total = (double)(e->cached_tokens + e->computed_tokens);
    head(&b, "isokv_prefix_cache_hit_ratio", "gauge",
         "prompt positions taken from the cache over all prompt positions admitted (engine)");
    put(&b, "isokv_prefix_cache_hit_ratio %.6f\n",
        total > 0 ? (double)e->cached_tokens / total : 0.0);
    scalar(&b, "isokv_engine_cached_tokens_total", "counter",
           "prompt positions the engine took from the cache (the core's count)", e->cached_tokens);
    scalar(&b, "isokv_engine_computed_tokens_total", "counter", "prompt positions computed",
           e->computed_tokens);
    scalar(&b, "isokv_engine_requests_total", "counter", "sequences admitted by the engine",
           e->requests);
    if (s->rcache) {
        static const struct {
            const char *name, *help;
        } sm[6] = {
            {"isokv_semcache_lookups_total", "requests that looked up the response cache"},
            {"isokv_semcache_candidates_verified_total", "cached responses verified as a draft"},
            {"isokv_semcache_accepted_tokens_total", "draft tokens the model accepted (served)"},
            {"isokv_semcache_rejected_tokens_total", "draft tokens the model refused"},
            {"isokv_semcache_decode_steps_saved_total",
             "decode steps replaced (accepted draft tokens, verified inside the batched step)"},
            {"isokv_semcache_hits_total", "requests with at least one accepted cached token"},
        };
        const uint64_t v[6] = {m->sem_lookups,  m->sem_verified, m->sem_accepted,
                               m->sem_rejected, m->sem_saved,    m->sem_hits};
        for (int i = 0; i < 6; i++) {
            head(&b, sm[i].name, "counter", sm[i].help);
            put(&b, "%s %llu\n", sm[i].name, (unsigned long long)v[i]);
        }
        scalar(&b, "isokv_semcache_entries", "gauge", "responses held by the response cache",
               m->sem.entries);
        scalar(&b, "isokv_semcache_evictions_total", "counter", "responses evicted (policy)",
               m->sem.evictions);
        scalar(&b, "isokv_semcache_bytes", "gauge",
               "accounted bytes of the responses held (tokens and a fixed part per entry)",
               m->sem.bytes);
        scalar(&b, "isokv_semcache_max_bytes", "gauge", "the byte budget (0: entries alone)",
               m->sem.max_bytes);
    }
    scalar(&b, "isokv_spec_steps_total", "counter",
           "decode rows that carried a draft (response cache or prompt lookup)", m->spec_steps);
    scalar(&b, "isokv_spec_draft_tokens_total", "counter", "draft tokens verified in steps",
           m->spec_draft_tokens);
    scalar(&b, "isokv_spec_accepted_tokens_total", "counter",
           "draft tokens accepted (each a decode step not run)", m->spec_accepted_tokens);
    scalar(&b, "isokv_spec_lookup_accepted_tokens_total", "counter",
           "of them from prompt-lookup drafts", m->spec_lookup_accepted);
    scalar(&b, "isokv_partial_block_hits_total", "counter",
           "admissions that copied a cached or parked partial block (copy-on-write)",
           e->partial_hits);
    scalar(&b, "isokv_pinned_blocks", "gauge", "cached blocks pinned (public prefixes)",
           c->pinned[0]);
    scalar(&b, "isokv_blocks_inserted_total", "counter", "blocks inserted into the cache core",
           c->inserts);
    head(&b, "isokv_blocks_evicted_total", "counter",
         "blocks evicted, by tier (from the pool: demoted or dropped; from the last: dropped)");
    for (size_t t = 0; t <= s->n_tiers; t++)
        put(&b, "isokv_blocks_evicted_total{tier=\"%s\"} %llu\n", s->tier_name[t],
            (unsigned long long)c->evictions[t]);
    /* lower tiers: one series per tier (none without --tier) */
    head(&b, "isokv_blocks_demoted_total", "counter",
         "blocks written into a lower tier (demotions and write-through), by tier");
    for (size_t t = 0; t < s->n_tiers; t++)
        put(&b, "isokv_blocks_demoted_total{tier=\"%s\"} %llu\n", s->tier_name[t + 1],
            (unsigned long long)m->tiers[t].demoted_blocks);
    head(&b, "isokv_blocks_promoted_total", "counter",
         "blocks loaded from a lower tier into the pool on a hit, by tier");
    for (size_t t = 0; t < s->n_tiers; t++)
        put(&b, "isokv_blocks_promoted_total{tier=\"%s\"} %llu\n", s->tier_name[t + 1],
            (unsigned long long)m->tiers[t].loaded_blocks);
    head(&b, "isokv_tier_loads_total", "counter",
         "lower-tier hits loaded instead of recomputed, by tier (blocks)");
    for (size_t t = 0; t < s->n_tiers; t++)
        put(&b, "isokv_tier_loads_total{tier=\"%s\"} %llu\n", s->tier_name[t + 1],
            (unsigned long long)m->tiers[t].loaded_blocks);
    head(&b, "isokv_tier_recomputes_total", "counter",
         "lower-tier hits recomputed, by tier and why (cheaper: the measured choice; failed: a "
         "load failed, miss, corrupt, mismatch or down, and the rest of its run; no_room: no "
         "free pool block to load into, and the rest of the run; dropped: loaded, then not "
         "kept) (blocks)");
    for (size_t t = 0; t < s->n_tiers; t++) {
        const ikv_engine_tier_stats *x = &m->tiers[t];
        const char *tn = s->tier_name[t + 1];
        put(&b,
            "isokv_tier_recomputes_total{tier=\"%s\",why=\"cheaper\"} %llu\n"
            "isokv_tier_recomputes_total{tier=\"%s\",why=\"failed\"} %llu\n"
            "isokv_tier_recomputes_total{tier=\"%s\",why=\"no_room\"} %llu\n"
            "isokv_tier_recomputes_total{tier=\"%s\",why=\"dropped\"} %llu\n",
            tn, (unsigned long long)x->recomputed_blocks, tn,
            (unsigned long long)x->recomputed_failed_blocks, tn,
            (unsigned long long)x->recomputed_noroom_blocks, tn,
            (unsigned long long)x->recomputed_dropped_blocks);
    }
    head(&b, "isokv_tier_resident_blocks", "gauge", "blocks the cache core holds in a lower tier");
    for (size_t t = 0; t < s->n_tiers; t++)
        put(&b, "isokv_tier_resident_blocks{tier=\"%s\"} %llu\n", s->tier_name[t + 1],
            (unsigned long long)m->tiers[t].resident);
    scalar(&b, "isokv_recomputed_blocks_total", "counter",
           "matched blocks refused (token ids, depth or parent differ) and recomputed",
           e->rejected_blocks);
    head(&b, "isokv_running_sequences", "gauge", "sequences running in the engine");
    put(&b, "isokv_running_sequences %zu\n", s->nrunning);
    head(&b, "isokv_queued_requests", "gauge", "requests waiting for admission");
    put(&b, "isokv_queued_requests %zu\n", s->nqueue);
    head(&b, "isokv_kv_pool_blocks", "gauge", "KV pool blocks by state");
    put(&b,
        "isokv_kv_pool_blocks{state=\"cached\"} %llu\nisokv_kv_pool_blocks{state=\"private\"} "
        "%llu\nisokv_kv_pool_blocks{state=\"parked\"} %llu\nisokv_kv_pool_blocks{state=\"free\"} "
        "%llu\n",
        (unsigned long long)e->cached_blocks, (unsigned long long)e->private_blocks,
        (unsigned long long)e->parked_blocks,
        (unsigned long long)(e->free_blocks - e->parked_blocks));
    scalar(&b, "isokv_kv_pool_blocks_used", "gauge", "KV pool blocks cached or private",
           (e->cached_blocks + e->private_blocks));
    scalar(&b, "isokv_kv_pool_blocks_total", "gauge", "KV pool size in blocks", e->pool_blocks);
    scalar(&b, "isokv_kv_reserved_blocks", "gauge",
           "private blocks reserved by admitted sequences, of isokv_kv_private_budget_blocks",
           e->reserved_blocks);
    scalar(&b, "isokv_kv_private_budget_blocks", "gauge", "private blocks admission reserves from",
           e->private_budget);
    scalar(&b, "isokv_steps_total", "counter", "forward steps run", m->steps);
    scalar(&b, "isokv_step_sequences_total", "counter",
           "sequences served by forward steps (over isokv_steps_total: mean batch)", m->step_rows);
    scalar(&b, "isokv_step_prefill_tokens_total", "counter", "prompt positions computed in steps",
           m->step_prefill_tokens);
    scalar(&b, "isokv_cancelled_total", "counter", "requests cancelled by a client disconnect",
           m->cancelled);
    head(&b, "isokv_route_requests_total", "counter",
         "completed requests by class and the step the router gave them");
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < IKV_PLAN_STEPS; k++)
            if (m->route_req[c][k])
                put(&b, "isokv_route_requests_total{class=\"%s\",step=\"%d\"} %llu\n",
                    ikv_req_class_name((ikv_req_class)c), k,
                    (unsigned long long)m->route_req[c][k]);
    head(&b, "isokv_route_e2e_seconds_total", "counter",
         "arrival-to-last-token seconds of completed requests, summed by class");
    for (int c = 0; c < 3; c++)
        put(&b, "isokv_route_e2e_seconds_total{class=\"%s\"} %.6f\n",
            ikv_req_class_name((ikv_req_class)c), m->route_e2e_s[c]);
    head(&b, "isokv_route_cpu_seconds_total", "counter",
         "CPU seconds (scheduler thread + engine workers) of the forward steps, shared by "
         "positions, summed by class");
    for (int c = 0; c < 3; c++)
        put(&b, "isokv_route_cpu_seconds_total{class=\"%s\"} %.6f\n",
            ikv_req_class_name((ikv_req_class)c), m->route_cpu_s[c]);
    head(&b, "isokv_route_thread_seconds_total", "counter",
         "thread-seconds (wall x threads) of the forward steps, shared by positions, by class");
    for (int c = 0; c < 3; c++)
        put(&b, "isokv_route_thread_seconds_total{class=\"%s\"} %.6f\n",
            ikv_req_class_name((ikv_req_class)c), m->route_thread_s[c]);
    head(&b, "isokv_route_threads_requests_total", "counter",
         "completed requests by class and the most threads any of their steps ran on");
    for (int c = 0; c < 3; c++)
        for (int k = 0; k <= SRV_MAX_THREADS; k++)
            if (m->route_threads[c][k])
                put(&b, "isokv_route_threads_requests_total{class=\"%s\",threads=\"%d\"} %llu\n",
                    ikv_req_class_name((ikv_req_class)c), k,
                    (unsigned long long)m->route_threads[c][k]);
    head(&b, "isokv_steps_by_threads_total", "counter",
         "engine forward steps by the thread count they ran on (a mixed batch is one per count)");
    for (int k = 0; k <= SRV_MAX_THREADS; k++)
        if (m->steps_by_threads[k])
            put(&b, "isokv_steps_by_threads_total{threads=\"%d\"} %llu\n", k,
                (unsigned long long)m->steps_by_threads[k]);
    head(&b, "isokv_route_completed_total", "counter", "completed requests by class");
    for (int c = 0; c < 3; c++)
        put(&b, "isokv_route_completed_total{class=\"%s\"} %llu\n",
            ikv_req_class_name((ikv_req_class)c), (unsigned long long)m->route_n[c]);
    scalar(&b, "isokv_preempted_total", "counter",
           "sequences preempted (a decode block did not fit; re-admitted with their tokens)",
           m->preempted);
    hist(&b, "isokv_ttft_seconds", "time to first token (arrival to first token)", &m->ttft);
    hist(&b, "isokv_time_per_output_token_seconds", "mean time between output tokens", &m->tpot);
    hist(&b, "isokv_e2e_latency_seconds", "arrival to last token", &m->e2e);
    if (b.oom) {
        ikv_free(b.p);
        return NULL;
    }
    *len = b.n;
    return b.p;
}
