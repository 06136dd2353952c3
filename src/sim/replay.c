/*
 * Replay: drive a trace through the cache core, the way the engine would, and measure.
 *
 * Order mode (the Mooncake paper's analysis, FAST'25 §4 / Figure 9): requests in trace order,
 * no timing. For each request: the longest resident prefix is matched, its blocks count as hits
 * (and are touched), the rest is inserted — one ikv_cache_access() call. Logical time is the
 * request's index + 1, so recency, opt's next-use times and the value policy's clock all count
 * requests.
 *
 * Timed mode: requests arrive at their trace times and queue FIFO for a pool of `servers`
 * prefill servers (Mooncake-style disaggregation: decode runs on separate instances and does
 * not hold a prefill server). When a request starts:
 *   1. its prefix is matched; for each run of matched blocks in a lower tier (dram, ssd, ...)
 *      the cost model decides: load it (ikv_load_time) if that is faster than recomputing its
 *      tokens (their KV FLOPs at the achieved FLOP rate), else recompute; both are counted;
 *   2. the matched path is hit and locked, the rest inserted locked (ikv_cache_insert lock=1),
 *      so nothing the request uses is evicted while it runs;
 *   3. the server is busy for prefill(reused prefix, new tokens) + loads (simulated seconds on
 *      the roofline of src/cost/), TTFT = queueing + that;
 *   4. decode takes output_tokens x the per-token step time at batch `decode_batch`; the
 *      request's blocks are unlocked when decode ends.
 * Blocks a request inserts are PENDING until its prefill has computed them (as in the engine,
 * where they are in the cache but not READY): inserted block j of n is ready at start +
 * prefill x (j + 1) x block / computed tokens (the prefill goes through the prompt in order,
 * chunk by chunk, at an even pace: an approximation). A later request whose match reaches a
 * block not yet ready uses the prefix before it, computes the rest itself and inserts nothing
 * (the engine inserts only when its usable prefix is the whole resident one); counted in
 * pending_cuts. With service_trace the times are not modelled but taken from the trace (a live
 * run's measured ttft_s, latency_s and, from isokv serve, queue_s in `isokv load`'s
 * sent.jsonl): a request starts when the server admitted it (arrival + queue_s; no prefill
 * servers), its prefill lasts until arrival + ttft_s and its blocks are unlocked at arrival +
 * latency_s. Ends are processed in time order before each start; starts are in trace order,
 * so a request admitted after a later arrival is still replayed in arrival order.
 *
 * Metrics (see ikv_replay_result in sim.h). Thrash: a block dropped from the cache goes into a
 * ghost FIFO of the last W dropped keys (W = thrash_window, default the cache's total capacity
 * in blocks); a later miss on a key still in the ghost counts as thrash. So thrash_ratio is the
 * fraction of drops that a cache twice as large would have turned into hits soon after —
 * evicted blocks requested again "within a window" of W further drops. The ghost's memory
 * follows the drops (it grows as it fills), so a large W costs only what the trace drops.
 *
 * Chunk reuse (segments traces, R >= 0): after the prefix match stops at block k, every doc
 * chunk reaching beyond k is looked up by its position-independent doc keys (a chain of its
 * own); its leading resident doc blocks beyond k count as chunk hits worth (1 - R) of their
 * tokens (R of them is recomputed to repair cross-attention, as in CacheBlend); the doc chain is
 * inserted on a miss. Pins (pin_public): after insertion the request's leading public blocks are
 * pinned without ttl; pinned prefixes are remembered so each is pinned once; budget errors are
 * counted, not fatal.
 *
 * Opt needs next-use times: a first pass over the trace (ikv_trace_rewind) records, for every
 * block occurrence, the index of the next request that uses the same key (one uint32 per
 * occurrence: 160 MB for the whole WEKA file). The same pass counts distinct keys, which sizes
 * an "unlimited" cache so that it never evicts.
 *
 * Cost: O(blocks) hash lookups per request plus the policy's per-event cost; allocations only
 * when a request is larger than every one before it (scratch growth) and for tenant tables.
 */
#include "isokv/cost.h"
#include "isokv/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NEVER32 UINT32_MAX

/* ---- an open-addressing map from 128-bit keys to uint64 ------------------------------------ */

typedef struct kmap {
    ikv_key *k;
    uint64_t *v;
    uint64_t cap, len; /* cap: power of two; key {0,0} marks an empty slot */
} kmap;

static int kmap_init(kmap *m, uint64_t cap) {
    uint64_t c = 1024;
    while (c < cap * 2) c <<= 1;
    m->k = ikv_calloc((size_t)c, sizeof *m->k);
    m->v = ikv_malloc((size_t)c * sizeof *m->v);
    m->cap = c;
    m->len = 0;
    return m->k && m->v ? 0 : IKV_ENOMEM;
}

static void kmap_free(kmap *m) {
    ikv_free(m->k);
    ikv_free(m->v);
    memset(m, 0, sizeof *m);
}

static inline ikv_key kfix(ikv_key k) {
    if (!k.lo && !k.hi) k.hi = 1; /* the empty marker (probability 2^-128) */
    return k;
}

/* Returns the slot of k (occupied by k, or the empty slot where it would go). */
static inline uint64_t kmap_slot(const kmap *m, ikv_key k) {
    uint64_t mask = m->cap - 1, i = (k.lo ^ (k.hi >> 7)) & mask;
    while ((m->k[i].lo || m->k[i].hi) && !ikv_key_eq(m->k[i], k)) i = (i + 1) & mask;
    return i;
}

static int kmap_grow(kmap *m) {
    kmap n;
    if (kmap_init(&n, m->cap)) {
        kmap_free(&n);
        return IKV_ENOMEM;
    }
    for (uint64_t i = 0; i < m->cap; i++)
        if (m->k[i].lo || m->k[i].hi) {
            uint64_t s = kmap_slot(&n, m->k[i]);
            n.k[s] = m->k[i];
            n.v[s] = m->v[i];
            n.len++;
        }
    kmap_free(m);
    *m = n;
    return 0;
}

/* Sets *slot to k's slot, inserting k (value `fresh`) when absent. Returns 1 if k was present,
 * 0 if inserted, IKV_ENOMEM. */
static int kmap_upsert(kmap *m, ikv_key k, uint64_t fresh, uint64_t *slot) {
    k = kfix(k);
    if ((m->len + 1) * 2 > m->cap && kmap_grow(m)) return IKV_ENOMEM;
    uint64_t s = kmap_slot(m, k);
    *slot = s;
    if (m->k[s].lo || m->k[s].hi) return 1;
    m->k[s] = k;
    m->v[s] = fresh;
    m->len++;
    return 0;
}

static int kmap_has(const kmap *m, ikv_key k) {
    if (!m->cap) return 0;
    k = kfix(k);
    uint64_t s = kmap_slot(m, k);
    return m->k[s].lo || m->k[s].hi;
}

/* ---- ghost FIFO of dropped keys (thrash) --------------------------------------------------- */

typedef struct ghost {
    ikv_key *keys;    /* ring of cap entries, allocated up to `alloc` as drops arrive */
    uint32_t *next;   /* bucket chain through ring positions */
    uint8_t *live;
    uint32_t *bucket; /* nb buckets, IKV_NIL = empty */
    uint64_t cap;     /* W, the window: the ring's logical size */
    uint64_t alloc;   /* entries allocated (<= cap) */
    uint64_t nb, pos;
    int nomem; /* a growth failed (on_evict cannot return it; checked per request) */
} ghost;

/* The window is W entries, but memory follows the drops: the ring starts small and doubles
 * while it fills (it only fills before its first wrap, so positions never move), so W = 1G
 * over a 300-request trace costs what its few hundred drops need, not 25 GB up front.
 * W must fit the 32-bit ring positions (checked by setup). */
static int ghost_init(ghost *g, uint64_t cap) {
    memset(g, 0, sizeof *g);
    g->cap = cap < 1 ? 1 : cap;
    return 0;
}

/* Grows the ring to min(cap, 2 x alloc) entries and rehashes into a table of at least that many
 * buckets. 0 or IKV_ENOMEM (the ghost unchanged). */
static int ghost_grow(ghost *g) {
    uint64_t n = g->alloc ? g->alloc * 2 : 1024;
    if (n > g->cap) n = g->cap;
    ikv_key *k = ikv_realloc(g->keys, (size_t)n * sizeof *k);
    if (!k) return IKV_ENOMEM;
    g->keys = k;
    uint32_t *nx = ikv_realloc(g->next, (size_t)n * sizeof *nx);
    if (!nx) return IKV_ENOMEM;
    g->next = nx;
    uint8_t *lv = ikv_realloc(g->live, (size_t)n);
    if (!lv) return IKV_ENOMEM;
    g->live = lv;
    memset(g->live + g->alloc, 0, (size_t)(n - g->alloc));
    uint64_t nb = 1;
    while (nb < n)
        nb <<= 1;
    if (nb != g->nb) {
        uint32_t *b = ikv_malloc((size_t)nb * sizeof *b);
        if (!b) return IKV_ENOMEM;
        memset(b, 0xff, (size_t)nb * sizeof *b);
        for (uint64_t p = 0; p < g->alloc; p++)
            if (g->live[p]) {
                uint32_t *h = &b[g->keys[p].lo & (nb - 1)];
                g->next[p] = *h;
                *h = (uint32_t)p;
            }
        ikv_free(g->bucket);
        g->bucket = b;
        g->nb = nb;
    }
    g->alloc = n;
    return 0;
}

static void ghost_free(ghost *g) {
    ikv_free(g->keys);
    ikv_free(g->next);
    ikv_free(g->live);
    ikv_free(g->bucket);
    memset(g, 0, sizeof *g);
}

static void ghost_unlink(ghost *g, uint32_t p) {
    uint32_t *s = &g->bucket[g->keys[p].lo & (g->nb - 1)];
    while (*s != p) s = &g->next[*s];
    *s = g->next[p];
    g->live[p] = 0;
}

static void ghost_add(ghost *g, ikv_key k) {
    if (g->pos == g->alloc && ghost_grow(g)) {
        g->nomem = 1;
        return;
    }
    uint32_t p = (uint32_t)g->pos;
    if (g->live[p]) ghost_unlink(g, p);
    g->keys[p] = k;
    uint32_t *b = &g->bucket[k.lo & (g->nb - 1)];
    g->next[p] = *b;
    *b = p;
    g->live[p] = 1;
    g->pos = (g->pos + 1) % g->cap;
}

/* 1 (and forgets it) if k was dropped within the window. */
static int ghost_take(ghost *g, ikv_key k) {
    if (!g->nb) return 0;
    for (uint32_t p = g->bucket[k.lo & (g->nb - 1)]; p != IKV_NIL; p = g->next[p])
        if (ikv_key_eq(g->keys[p], k)) {
            ghost_unlink(g, p);
            return 1;
        }
    return 0;
}

/* ---- replay state -------------------------------------------------------------------------- */

typedef struct running {
    double end;   /* simulated seconds when decode finishes */
    uint32_t slot;
} running;

typedef struct lockbuf {
    uint32_t *ids;
    size_t n, cap;
} lockbuf;

typedef struct replay {
    const ikv_replay_opts *o;
    ikv_replay_result *r;
    ikv_cache *c;
    ikv_cost_cfg cost;
    ikv_cost_block_ctx bctx;
    uint32_t bt;
    ghost g;
    kmap pinned;
    /* opt */
    int need_next;
    uint32_t *nu;            /* next-use request (index + 1) per occurrence */
    uint64_t nu_len, occ;
    size_t nu_cap;
    uint64_t *next_buf;
    size_t next_cap;
    /* oracle diagnostics (value:oracle=2; docs/policies.md): every block of a request
     * gets its conversation's next request (index + 1) instead of its own next use */
    int conv_next;
    uint32_t *ns;            /* per request: the next request of the same session, NEVER32 */
    uint64_t ns_len, qn;
    size_t ns_cap;
    /* scratch */
    uint32_t *ids;
    uint8_t *tiers;
    size_t ids_cap, tiers_cap;
    size_t tenant_cap;
    /* timed */
    double *free_at;         /* per server */
    running *heap;
    size_t heap_len, heap_cap;
    lockbuf *slots;
    uint32_t *free_slots;
    size_t n_slots, n_free;
    double *ttft, *queue;
    size_t n_lat, ttft_cap, queue_cap;
    double *ready_at;        /* per cache node id: when its KV is computed (0: long ago; a
                                stale entry of an evicted node is always in the past) */
    size_t ready_cap;
    double last_start;       /* service_trace: the previous request's start */
    ikv_tier kind[IKV_MAX_TIERS];
} replay;

static void on_evict(void *ctx, uint32_t node, ikv_key key, int from, int to) {
    (void)node, (void)from;
    replay *s = ctx;
    if (to < 0) ghost_add(&s->g, key);
}

/* Grows array p (element type from p) to hold `need` elements, doubling; on failure runs
 * `fail` (p unchanged). */
#define GROW(p, cap, need, fail)                                                                \
    do {                                                                                       \
        if ((size_t)(need) > (cap)) {                                                          \
            size_t c_ = (cap) ? (cap) : 64;                                                    \
            while (c_ < (size_t)(need)) c_ *= 2;                                               \
            void *q_ = ikv_realloc((p), c_ * sizeof *(p));                                     \
            if (!q_) fail;                                                                     \
            (p) = q_;                                                                          \
            (cap) = c_;                                                                        \
        }                                                                                      \
    } while (0)

static int ensure_scratch(replay *s, size_t n) {
    GROW(s->ids, s->ids_cap, n, return IKV_ENOMEM);
    GROW(s->tiers, s->tiers_cap, n, return IKV_ENOMEM);
    return 0;
}

static int ensure_tenant(replay *s, uint32_t tenant) {
    ikv_replay_result *r = s->r;
    if (tenant < r->n_tenants) return 0;
    size_t need = (size_t)tenant + 1;
    if (need > s->tenant_cap) {
        size_t c = s->tenant_cap ? s->tenant_cap : 16;
        while (c < need) c *= 2;
        uint64_t *a = ikv_realloc(r->tenant_requests, c * sizeof *a);
        if (!a) return IKV_ENOMEM;
        r->tenant_requests = a;
        uint64_t *b = ikv_realloc(r->tenant_input_tokens, c * sizeof *b);
        if (!b) return IKV_ENOMEM;
        r->tenant_input_tokens = b;
        double *h = ikv_realloc(r->tenant_hit_tokens, c * sizeof *h);
        if (!h) return IKV_ENOMEM;
        r->tenant_hit_tokens = h;
        s->tenant_cap = c;
    }
    for (size_t i = r->n_tenants; i < need; i++) {
        r->tenant_requests[i] = 0;
        r->tenant_input_tokens[i] = 0;
        r->tenant_hit_tokens[i] = 0;
    }
    r->n_tenants = (uint32_t)need;
    return 0;
}

void ikv_replay_opts_default(ikv_replay_opts *o) {
    memset(o, 0, sizeof *o);
    o->mode = IKV_REPLAY_ORDER;
    o->policy = "lru";
    o->model = "llama3-70b";
    o->hw = "h100";
    o->gpus = 8;
    o->servers = 4;
    o->decode_batch = 16;
    o->pin_budget = 0.5;
    o->chunk_reuse = -1;
}

const char *ikv_replay_mode_name(ikv_replay_mode m) {
    return m == IKV_REPLAY_TIMED ? "timed" : "order";
}

double ikv_replay_tenant_ratio(const ikv_replay_result *r, uint32_t i) {
    if (i >= r->n_tenants || !r->tenant_input_tokens[i]) return 0;
    return r->tenant_hit_tokens[i] / (double)r->tenant_input_tokens[i];
}

void ikv_replay_result_free(ikv_replay_result *r) {
    if (!r) return;
    ikv_free(r->tenant_requests);
    ikv_free(r->tenant_input_tokens);
    ikv_free(r->tenant_hit_tokens);
    r->tenant_requests = r->tenant_input_tokens = NULL;
    r->tenant_hit_tokens = NULL;
    r->n_tenants = 0;
}

/* ---- first pass ------------------------------------------------------------------------------ */

/* Counts requests and distinct keys (doc keys too, with chunk reuse) and, for opt, records the
 * next use of every occurrence. Leaves the trace rewound. */
static int prepass(replay *s, ikv_trace *t, uint64_t *distinct, uint64_t *requests) {
    kmap m, sm;
    memset(&sm, 0, sizeof sm);
    int rc = kmap_init(&m, 1 << 16);
    if (!rc) rc = kmap_init(&sm, s->conv_next ? 1 << 12 : 1);
    if (rc) {
        kmap_free(&m);
        kmap_free(&sm);
        return rc;
    }
    ikv_trace_request req;
    uint64_t n = 0, p = 0;
    while ((rc = ikv_trace_next(t, &req)) == 1) {
        uint32_t now = (uint32_t)(req.index + 1 < NEVER32 ? req.index + 1 : NEVER32 - 1);
        if (s->conv_next) {
            GROW(s->ns, s->ns_cap, n + 1, { rc = IKV_ENOMEM; goto out; });
            s->ns[n] = NEVER32;
            if (req.session) {
                uint64_t slot;
                ikv_key sk = {.lo = req.session, .hi = 0x5e5510e5ull};
                int had = kmap_upsert(&sm, sk, n, &slot);
                if (had < 0) {
                    rc = had;
                    goto out;
                }
                if (had) s->ns[sm.v[slot]] = now;
                sm.v[slot] = n;
            }
        }
        if (s->need_next) GROW(s->nu, s->nu_cap, p + req.n_blocks, { rc = IKV_ENOMEM; goto out; });
        for (size_t i = 0; i < req.n_blocks; i++, p++) {
            uint64_t slot;
            int had = kmap_upsert(&m, req.keys[i], p, &slot);
            if (had < 0) {
                rc = had;
                goto out;
            }
            if (s->need_next) {
                s->nu[p] = NEVER32;
                if (had) s->nu[m.v[slot]] = now;
                m.v[slot] = p;
            }
        }
        if (s->o->chunk_reuse >= 0)
            for (size_t c = 0; c < req.n_chunks; c++)
                for (size_t i = 0; i < req.chunks[c].count; i++) {
                    uint64_t slot;
                    int had = kmap_upsert(&m, req.chunks[c].doc_keys[i], UINT64_MAX, &slot);
                    if (had < 0) {
                        rc = had;
                        goto out;
                    }
                }
        n++;
    }
    if (rc < 0) goto out;
    *distinct = m.len;
    *requests = n;
    s->nu_len = p;
    s->ns_len = s->conv_next ? n : 0;
    rc = ikv_trace_rewind(t);
out:
    kmap_free(&m);
    kmap_free(&sm);
    return rc;
}

/* ---- timed mode helpers ---------------------------------------------------------------------- */

static int ev_less(running a, running b) {
    return a.end < b.end;
}

static void heap_push(replay *s, running x) {
    size_t i = s->heap_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_less(x, s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = x;
}

static running heap_pop(replay *s) {
    running top = s->heap[0], x = s->heap[--s->heap_len];
    size_t i = 0, n = s->heap_len;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && ev_less(s->heap[l], x)) m = l;
        if (l + 1 < n && ev_less(s->heap[l + 1], m == i ? x : s->heap[m])) m = l + 1;
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n) s->heap[i] = x;
    return top;
}

/* Grows ready_at to cover node ids below n (the new entries 0: ready). */
static int grow_ready(replay *s, size_t n) {
    if (n <= s->ready_cap) return 0;
    size_t c = s->ready_cap ? s->ready_cap : 1024;
    while (c < n) c *= 2;
    double *p = ikv_realloc(s->ready_at, c * sizeof *p);
    if (!p) return IKV_ENOMEM;
    for (size_t i = s->ready_cap; i < c; i++) p[i] = 0;
    s->ready_at = p, s->ready_cap = c;
    return 0;
}

/* Ends every running request whose decode finished by time `until`: unlocks its blocks. */
static int finish_until(replay *s, double until) {
    while (s->heap_len && s->heap[0].end <= until) {
        running x = heap_pop(s);
        lockbuf *b = &s->slots[x.slot];
        /* In pieces of 64: ikv_cache_unlock's argument check counts repeated ids in O(n^2)
         * before it decides that a long path has none (index.c); 64-block pieces keep it
         * linear. The pieces are disjoint parts of one chain. */
        for (size_t i = 0; i < b->n; i += 64) {
            size_t k = b->n - i < 64 ? b->n - i : 64;
            if (ikv_cache_unlock(s->c, b->ids + i, k))
                return ikv_error(IKV_EINVAL, "replay: unlock failed (%s)", ikv_errdetail());
        }
        b->n = 0;
        s->free_slots[s->n_free++] = x.slot;
    }
    return 0;
}

static int take_slot(replay *s, uint32_t *slot) {
    if (s->n_free) {
        *slot = s->free_slots[--s->n_free];
        return 0;
    }
    size_t cap = s->n_slots;
    lockbuf *nb = ikv_realloc(s->slots, (cap + 1) * sizeof *nb);
    if (!nb) return IKV_ENOMEM;
    s->slots = nb;
    memset(&s->slots[cap], 0, sizeof *nb);
    uint32_t *fs = ikv_realloc(s->free_slots, (cap + 1) * sizeof *fs);
    if (!fs) return IKV_ENOMEM;
    s->free_slots = fs;
    GROW(s->heap, s->heap_cap, cap + 1, return IKV_ENOMEM);
    s->n_slots = cap + 1;
    *slot = (uint32_t)cap;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static double pct(const double *v, size_t n, double p) {
    if (!n) return 0;
    size_t k = (size_t)ceil(p * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}

/* ---- one request --------------------------------------------------------------------------- */

/* Chunk reuse for request q whose prefix match stopped at block k: returns the effective reused
 * tokens it adds (hit tokens x (1 - R)). */
static int chunks(replay *s, const ikv_trace_request *q, size_t k, const ikv_access *a,
                  double *gain) {
    ikv_replay_result *r = s->r;
    double R = s->o->chunk_reuse;
    *gain = 0;
    for (size_t c = 0; c < q->n_chunks; c++) {
        const ikv_chunk *ch = &q->chunks[c];
        if (!ch->count || ch->first + ch->count <= k) continue;
        ikv_access da = *a;
        da.next_use = NULL; /* opt: doc keys get no next use (treated as never reused) */
        da.ntokens = NULL;
        ikv_access_result ar;
        int rc = ikv_cache_access(s->c, ch->doc_keys, ch->count, &da, &ar);
        r->block_ops += ch->count;
        if (rc == IKV_EFULL) r->insert_full++;
        else if (rc == IKV_EEXIST) r->chain_conflicts++;
        else if (rc < 0) return rc;
        size_t from = k > ch->first ? k - ch->first : 0;
        for (size_t j = from; j < ar.matched; j++) {
            r->chunk_hit_blocks++;
            double tok = q->ntokens ? q->ntokens[ch->first + j] : s->bt;
            *gain += tok * (1 - R);
        }
    }
    r->chunk_hit_tokens += *gain;
    return 0;
}

static int pin_public(replay *s, const ikv_trace_request *q) {
    ikv_replay_result *r = s->r;
    size_t np = q->n_public_blocks < q->n_blocks ? q->n_public_blocks : q->n_blocks;
    if (!np || kmap_has(&s->pinned, q->keys[np - 1])) return 0;
    int rc = ikv_cache_pin(s->c, q->keys, np, 0);
    if (rc == 0) {
        uint64_t slot;
        r->pins++;
        return kmap_upsert(&s->pinned, q->keys[np - 1], 0, &slot) < 0 ? IKV_ENOMEM : 0;
    }
    if (rc == IKV_EBUDGET) r->pin_budget_errors++;
    else if (rc == IKV_ENOMEM) return rc;
    else r->pin_failures++;
    return 0;
}

/* Next-use times of q's blocks from the first pass (opt), or NULL. */
static const uint64_t *next_uses(replay *s, const ikv_trace_request *q) {
    if (!s->need_next) return NULL;
    GROW(s->next_buf, s->next_cap, q->n_blocks ? q->n_blocks : 1, return NULL);
    for (size_t i = 0; i < q->n_blocks; i++) {
        uint64_t p = s->occ + i;
        s->next_buf[i] = p < s->nu_len && s->nu[p] != NEVER32 ? s->nu[p] : IKV_NEVER;
    }
    if (s->conv_next) {
        uint64_t v = s->qn < s->ns_len && s->ns[s->qn] != NEVER32 ? s->ns[s->qn] : IKV_NEVER;
        for (size_t i = 0; i < q->n_blocks; i++) s->next_buf[i] = v;
        s->qn++;
    }
    s->occ += q->n_blocks;
    return s->next_buf;
}

static void account(replay *s, const ikv_trace_request *q, size_t k, double gain) {
    ikv_replay_result *r = s->r;
    uint64_t hit = (uint64_t)k * s->bt;
    if (hit > q->input_tokens) hit = q->input_tokens;
    r->requests++;
    r->input_tokens += q->input_tokens;
    r->blocks += q->n_blocks;
    r->hit_blocks += k;
    r->prefix_hit_tokens += hit;
    r->tenant_requests[q->tenant]++;
    r->tenant_input_tokens[q->tenant] += q->input_tokens;
    r->tenant_hit_tokens[q->tenant] += (double)hit + gain;
    double reused = (double)hit + gain;
    if (reused > q->input_tokens) reused = q->input_tokens;
    const ikv_model_spec *m = s->cost.model;
    double all = ikv_prefill_flops(m, 0, q->input_tokens);
    uint64_t ru = (uint64_t)reused;
    r->prefill_flops += all;
    r->prefill_flops_saved += all - ikv_prefill_flops(m, ru, q->input_tokens - ru);
}

static void thrash(replay *s, const ikv_trace_request *q, size_t k) {
    for (size_t i = k; i < q->n_blocks; i++)
        if (ghost_take(&s->g, q->keys[i])) s->r->thrash_reused++;
}

/* The cache's view of request q: its logical time (the replay index), session, block sizes,
 * how its response ended, and its arrival on the wall clock (ms + 1: 0 means unknown). */
static ikv_access access_of(const ikv_trace_request *q) {
    return (ikv_access){.now = q->index + 1, .scope = q->session, .ntokens = q->ntokens,
                        .hint = q->hint, .clock_ms = (uint64_t)llround(q->time * 1000) + 1};
}

static int order_one(replay *s, const ikv_trace_request *q) {
    ikv_replay_result *r = s->r;
    ikv_access a = access_of(q);
    a.next_use = next_uses(s, q);
    if (s->need_next && !a.next_use) return IKV_ENOMEM;
    ikv_access_result ar;
    int rc = ikv_cache_access(s->c, q->keys, q->n_blocks, &a, &ar);
    if (rc == IKV_EFULL) r->insert_full++;
    else if (rc == IKV_EEXIST) r->chain_conflicts++;
    else if (rc < 0) return rc;
    r->block_ops += q->n_blocks;
    r->inserted_blocks += ar.inserted;
    for (size_t t = 0; t < IKV_MAX_TIERS; t++) r->hits_by_tier[t] += ar.hits_by_tier[t];
    thrash(s, q, ar.matched);
    double gain = 0;
    if (s->o->chunk_reuse >= 0 && q->n_chunks && (rc = chunks(s, q, ar.matched, &a, &gain)))
        return rc;
    if (s->o->pin_public && (rc = pin_public(s, q))) return rc;
    account(s, q, ar.matched, gain);
    if (s->o->on_request) {
        ikv_request_outcome oc = {.matched = ar.matched, .chunk_tokens = gain, .inserted = ar.inserted};
        uint64_t hit = (uint64_t)ar.matched * s->bt;
        oc.hit_tokens = hit < q->input_tokens ? hit : q->input_tokens;
        s->o->on_request(s->o->on_request_ctx, q, &oc);
    }
    return 0;
}

static int timed_one(replay *s, const ikv_trace_request *q, double *last_arrival) {
    ikv_replay_result *r = s->r;
    const ikv_replay_opts *o = s->o;
    double arr = q->time > *last_arrival ? q->time : *last_arrival;
    *last_arrival = arr;
    uint32_t sv = 0;
    double start = arr;
    if (o->service_trace) {
        if (!q->has_service)
            return ikv_error(IKV_EFORMAT,
                             "request %llu has no measured ttft_s / latency_s, which timed "
                             "replay with trace service times needs",
                             (unsigned long long)q->index);
        start = arr + q->service_queue; /* admitted (prefix looked up) after its wait; the */
        if (start < s->last_start) start = s->last_start; /* server admits in arrival order */
        s->last_start = start;
    } else {
        for (uint32_t i = 1; i < o->servers; i++)
            if (s->free_at[i] < s->free_at[sv]) sv = i;
        if (s->free_at[sv] > start) start = s->free_at[sv];
    }
    int rc = finish_until(s, start);
    if (rc) return rc;
    if ((rc = ensure_scratch(s, q->n_blocks ? q->n_blocks : 1))) return rc;

    ikv_access a = access_of(q);
    a.next_use = next_uses(s, q);
    if (s->need_next && !a.next_use) return IKV_ENOMEM;
    ikv_cache_set_time(s->c, a.now);
    size_t k;
    ikv_cache_match(s->c, q->keys, q->n_blocks, s->ids, s->tiers, &k);
    /* a block still being computed by another request ends the usable prefix */
    int cut = 0;
    for (size_t i = 0; i < k; i++)
        if (s->ids[i] < s->ready_cap && s->ready_at[s->ids[i]] > start) {
            k = i, cut = 1;
            break;
        }
    r->pending_cuts += (uint64_t)cut;

    /* Lower-tier runs: load or recompute, whichever the cost model says is faster. */
    double load_s = 0, reused = 0;
    size_t loaded = 0, recomputed = 0;
    const ikv_model_spec *m = s->cost.model;
    double rate = s->cost.hw->flops * s->cost.mfu * (s->cost.gpus ? s->cost.gpus : 1);
    for (size_t i = 0; i < k;) {
        size_t j = i;
        while (j < k && s->tiers[j] == s->tiers[i]) j++;
        uint64_t t0 = (uint64_t)i * s->bt, t1 = (uint64_t)j * s->bt;
        if (t1 > q->input_tokens) t1 = q->input_tokens;
        if (t0 > t1) t0 = t1;
        r->hits_by_tier[s->tiers[i]] += j - i;
        if (s->tiers[i] == 0) {
            reused += (double)(t1 - t0);
        } else {
            double ld = ikv_load_time(&s->cost, s->kind[s->tiers[i]], j - i, s->bt);
            double rc_s = ikv_kv_flops(m, t0, t1 - t0) / rate;
            if (ld < rc_s) {
                load_s += ld;
                reused += (double)(t1 - t0);
                r->lower_loaded_blocks += j - i;
                loaded += j - i;
            } else {
                r->lower_recomputed_blocks += j - i;
                recomputed += j - i;
            }
        }
        i = j;
    }

    uint32_t slot;
    if ((rc = take_slot(s, &slot))) return rc;
    lockbuf *b = &s->slots[slot];
    GROW(b->ids, b->cap, q->n_blocks ? q->n_blocks : 1, return IKV_ENOMEM);
    b->n = 0;
    if (k) {
        ikv_cache_hit(s->c, s->ids, k, &a); /* IKV_EFULL: promotion found no room: still a hit */
        if (ikv_cache_lock(s->c, s->ids, k) == 0) {
            memcpy(b->ids, s->ids, k * sizeof *b->ids);
            b->n = k;
        } else {
            r->lock_failures++;
        }
    }
    size_t ins = 0;
    if (k < q->n_blocks && !cut) {
        rc = ikv_cache_insert(s->c, q->keys, q->n_blocks, k, &a, 1, b->ids + b->n, &ins);
        if (rc == IKV_EFULL) r->insert_full++;
        else if (rc == IKV_EEXIST) r->chain_conflicts++;
        else if (rc < 0) return rc;
        b->n += ins;
    }
    r->inserted_blocks += ins;
    r->block_ops += q->n_blocks;
    thrash(s, q, k);
    double gain = 0;
    if (o->chunk_reuse >= 0 && q->n_chunks && (rc = chunks(s, q, k, &a, &gain))) return rc;
    if (o->pin_public && (rc = pin_public(s, q))) return rc;
    account(s, q, k, gain);
    reused += gain;
    if (reused > q->input_tokens) reused = q->input_tokens;

    uint64_t ru = (uint64_t)reused;
    double prefill, decode;
    if (o->service_trace) {
        prefill = arr + q->service_ttft - start; /* >= 0: start <= arr + ttft unless clamped */
        if (prefill < 0) prefill = 0;
        decode = q->service_latency - q->service_ttft;
    } else {
        prefill = ikv_prefill_time(&s->cost, ru, q->input_tokens - ru) + load_s;
        decode = (double)q->output_tokens *
                 ikv_decode_time(&s->cost, o->decode_batch, q->input_tokens + q->output_tokens / 2);
        s->free_at[sv] = start + prefill;
    }
    /* the inserted blocks b->ids[b->n - ins ..) become ready as the prefill reaches them */
    uint64_t computed = q->input_tokens > (uint64_t)k * s->bt ? q->input_tokens - (uint64_t)k * s->bt : 1;
    for (size_t j = 0; j < ins; j++) {
        uint32_t id = b->ids[b->n - ins + j];
        if ((rc = grow_ready(s, (size_t)id + 1))) return rc;
        double f = (double)(j + 1) * s->bt / (double)computed;
        s->ready_at[id] = start + prefill * (f < 1 ? f : 1);
    }
    running x = {start + prefill + decode, slot};
    heap_push(s, x);
    if (x.end > r->makespan) r->makespan = x.end;
    GROW(s->ttft, s->ttft_cap, s->n_lat + 1, return IKV_ENOMEM);
    GROW(s->queue, s->queue_cap, s->n_lat + 1, return IKV_ENOMEM);
    s->ttft[s->n_lat] = start - arr + prefill;
    s->queue[s->n_lat] = start - arr;
    s->n_lat++;
    r->prefill_mean += prefill;
    r->decode_mean += decode;
    if (o->on_request) {
        ikv_request_outcome oc = {.matched = k, .chunk_tokens = gain, .inserted = ins,
                                  .lower_loaded = loaded, .lower_recomputed = recomputed,
                                  .arrival = arr, .start = start, .queue = start - arr,
                                  .prefill = prefill, .ttft = start - arr + prefill, .decode = decode};
        uint64_t hit = (uint64_t)k * s->bt;
        oc.hit_tokens = hit < q->input_tokens ? hit : q->input_tokens;
        o->on_request(o->on_request_ctx, q, &oc);
    }
    return 0;
}

/* ---- setup and the loop -------------------------------------------------------------------- */

static int setup(replay *s, ikv_trace *t, uint64_t *total) {
    const ikv_replay_opts *o = s->o;
    ikv_replay_result *r = s->r;
    const ikv_model_spec *model;
    const ikv_hw_spec *hw;
    int rc;
    if ((rc = ikv_model_lookup(o->model ? o->model : "llama3-70b", &model))) return rc;
    if ((rc = ikv_hw_lookup(o->hw ? o->hw : "h100", &hw))) return rc;
    ikv_cost_cfg_init(&s->cost, model, hw);
    s->cost.gpus = o->gpus ? o->gpus : 1;
    if ((rc = ikv_cost_cfg_check(&s->cost))) return rc;
    s->bt = ikv_trace_block_tokens(t);
    s->bctx.model = model;
    s->bctx.hw = hw;
    s->bctx.block_tokens = s->bt;
    const char *policy = o->policy && *o->policy ? o->policy : "lru";
    if (strlen(policy) >= sizeof r->policy)
        return ikv_error(IKV_EPARAM, "policy spec too long: '%s'", policy);
    if (o->mode == IKV_REPLAY_TIMED && (o->servers < 1 || o->decode_batch < 1))
        return ikv_error(IKV_EINVAL, "timed replay needs >= 1 server and a decode batch >= 1");
    if (o->n_tiers > IKV_MAX_TIERS)
        return ikv_error(IKV_EINVAL, "at most %d tiers, got %zu", IKV_MAX_TIERS, o->n_tiers);
    if (!(o->pin_budget >= 0 && o->pin_budget <= 1))
        return ikv_error(IKV_EINVAL, "pin budget must be in [0, 1]");
    if (o->chunk_reuse > 1)
        return ikv_error(IKV_ERANGE, "chunk reuse fraction R must be in [0, 1], got %g", o->chunk_reuse);
    s->need_next = !strncmp(policy, "opt", 3) && (policy[3] == 0 || policy[3] == ':');
    /* value:oracle=N (diagnostic only, docs/policies.md): reads the future like opt; 2 sees
     * its conversation's next turn instead of each block's next use */
    const char *orc = strstr(policy, "oracle=");
    if (orc && orc[7] >= '1' && orc[7] <= '9') {
        s->need_next = 1;
        s->conv_next = orc[7] == '2';
    }
    snprintf(r->policy, sizeof r->policy, "%s", policy);
    snprintf(r->model, sizeof r->model, "%s", model->name);
    snprintf(r->hw, sizeof r->hw, "%s", hw->name);
    r->mode = o->mode;
    r->block_tokens = s->bt;
    r->servers = o->mode == IKV_REPLAY_TIMED ? o->servers : 0;
    r->gpus = s->cost.gpus;

    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 1, policy);
    cfg.block_tokens = s->bt;
    cfg.pin_budget = o->pin_budget;
    cfg.cost = ikv_cost_block_flops;
    cfg.cost_ctx = &s->bctx;
    cfg.on_evict = on_evict;
    cfg.evict_ctx = s;
    int unlimited = o->n_tiers == 0 && o->capacity_tokens == 0;
    *total = ikv_trace_count_hint(t);
    if (unlimited || s->need_next) {
        double t0 = ikv_now();
        uint64_t distinct = 0, reqs = 0;
        if ((rc = prepass(s, t, &distinct, &reqs))) return rc;
        r->prepass_seconds = ikv_now() - t0;
        if (unlimited) {
            cfg.tiers[0].capacity = distinct + 1;
            r->unlimited = 1;
        }
        *total = reqs;
    }
    if (o->n_tiers) {
        if ((rc = ikv_replay_tiers_check(o->tiers, o->n_tiers, &s->cost))) return rc;
        cfg.n_tiers = o->n_tiers;
        for (size_t i = 0; i < o->n_tiers; i++) {
            const ikv_replay_tier *rt = &o->tiers[i];
            if ((rc = ikv_tier_parse(rt->name, &s->kind[i]))) return rc;
            uint64_t blocks = rt->capacity_tokens / s->bt;
            if (!blocks)
                return ikv_error(IKV_EINVAL, "tier %s: %llu tokens is less than one %u-token block",
                                 rt->name, (unsigned long long)rt->capacity_tokens, s->bt);
            cfg.tiers[i].name = rt->name;
            cfg.tiers[i].capacity = blocks;
            cfg.tiers[i].policy = policy;
        }
    } else if (!unlimited) {
        uint64_t blocks = o->capacity_tokens / s->bt;
        if (!blocks)
            return ikv_error(IKV_EINVAL, "capacity of %llu tokens is less than one %u-token block",
                             (unsigned long long)o->capacity_tokens, s->bt);
        cfg.tiers[0].capacity = blocks;
    }
    if (!o->n_tiers) s->kind[0] = IKV_TIER_HBM;
    uint64_t sum = 0;
    r->n_tiers = cfg.n_tiers;
    for (size_t i = 0; i < cfg.n_tiers; i++) {
        snprintf(r->tier_name[i], sizeof r->tier_name[i], "%s", cfg.tiers[i].name);
        r->tier_capacity_blocks[i] = cfg.tiers[i].capacity;
        sum += cfg.tiers[i].capacity;
    }
    if ((rc = ikv_cache_create(&cfg, &s->c))) return rc;
    r->thrash_window = o->thrash_window                     ? o->thrash_window
                       : sum < IKV_REPLAY_MAX_THRASH_WINDOW ? sum
                                                            : IKV_REPLAY_MAX_THRASH_WINDOW;
    if (r->thrash_window > IKV_REPLAY_MAX_THRASH_WINDOW)
        return ikv_error(IKV_ERANGE,
                         "thrash window of %llu blocks is more than the %llu the ghost "
                         "list can index",
                         (unsigned long long)r->thrash_window,
                         (unsigned long long)IKV_REPLAY_MAX_THRASH_WINDOW);
    if ((rc = ghost_init(&s->g, r->thrash_window))) return rc;
    if (o->pin_public && (rc = kmap_init(&s->pinned, 1024))) return rc;
    if (o->mode == IKV_REPLAY_TIMED) {
        s->free_at = ikv_calloc(o->servers, sizeof *s->free_at);
        if (!s->free_at) return IKV_ENOMEM;
    }
    return 0;
}

static void teardown(replay *s) {
    ikv_cache_destroy(s->c);
    ghost_free(&s->g);
    kmap_free(&s->pinned);
    ikv_free(s->nu);
    ikv_free(s->ns);
    ikv_free(s->next_buf);
    ikv_free(s->ids);
    ikv_free(s->tiers);
    ikv_free(s->free_at);
    ikv_free(s->heap);
    for (size_t i = 0; i < s->n_slots; i++) ikv_free(s->slots[i].ids);
    ikv_free(s->slots);
    ikv_free(s->free_slots);
    ikv_free(s->ttft);
    ikv_free(s->queue);
    ikv_free(s->ready_at);
}

static void finish(replay *s, ikv_trace *t) {
    ikv_replay_result *r = s->r;
    ikv_cache_stats st;
    ikv_cache_stats_get(s->c, &st);
    r->evictions = st.drops;
    r->demotions = st.demotions;
    r->promotions = st.promotions;
    for (size_t i = 0; i < IKV_MAX_TIERS; i++) r->evictions_by_tier[i] = st.evictions[i];
    r->hit_tokens = (double)r->prefix_hit_tokens + r->chunk_hit_tokens;
    r->token_hit_ratio = r->input_tokens ? r->hit_tokens / (double)r->input_tokens : 0;
    r->block_hit_ratio = r->blocks ? (double)(r->hit_blocks + r->chunk_hit_blocks) / (double)r->blocks : 0;
    r->thrash_ratio = r->evictions ? (double)r->thrash_reused / (double)r->evictions : 0;
    r->skipped_lines = ikv_trace_skipped(t);
    r->block_ops_per_s = r->replay_seconds > 0 ? (double)r->block_ops / r->replay_seconds : 0;
    if (s->n_lat) {
        double n = (double)s->n_lat, sum_t = 0, sum_q = 0;
        for (size_t i = 0; i < s->n_lat; i++) {
            sum_t += s->ttft[i];
            sum_q += s->queue[i];
        }
        qsort(s->ttft, s->n_lat, sizeof *s->ttft, cmp_double);
        qsort(s->queue, s->n_lat, sizeof *s->queue, cmp_double);
        r->ttft_p50 = pct(s->ttft, s->n_lat, 0.50);
        r->ttft_p90 = pct(s->ttft, s->n_lat, 0.90);
        r->ttft_p99 = pct(s->ttft, s->n_lat, 0.99);
        r->queue_p50 = pct(s->queue, s->n_lat, 0.50);
        r->queue_p90 = pct(s->queue, s->n_lat, 0.90);
        r->queue_p99 = pct(s->queue, s->n_lat, 0.99);
        r->ttft_mean = sum_t / n;
        r->queue_mean = sum_q / n;
        r->prefill_mean /= n;
        r->decode_mean /= n;
    }
}

int ikv_replay(ikv_trace *t, const ikv_replay_opts *o, ikv_replay_result *r) {
    memset(r, 0, sizeof *r);
    ikv_replay_opts def;
    if (!o) {
        ikv_replay_opts_default(&def);
        o = &def;
    }
    replay s;
    memset(&s, 0, sizeof s);
    s.o = o;
    s.r = r;
    uint64_t total = 0;
    int rc = setup(&s, t, &total);
    if (rc) goto out;
    double t0 = ikv_now(), last_arrival = 0;
    ikv_trace_request q;
    while ((rc = ikv_trace_next(t, &q)) == 1) {
        if ((rc = ensure_tenant(&s, q.tenant))) break;
        rc = o->mode == IKV_REPLAY_TIMED ? timed_one(&s, &q, &last_arrival) : order_one(&s, &q);
        if (rc) break;
        if (s.g.nomem) {
            rc = ikv_error(IKV_ENOMEM, "thrash ghost list at %llu of %llu entries: out of memory",
                           (unsigned long long)s.g.alloc, (unsigned long long)s.g.cap);
            break;
        }
        if (o->check_every && (q.index + 1) % (uint64_t)o->check_every == 0 &&
            !ikv_cache_check(s.c)) {
            rc = ikv_error(IKV_EINVAL, "cache check failed after request %llu: %s",
                           (unsigned long long)q.index, ikv_errdetail());
            break;
        }
        if (o->progress && (q.index & 255) == 0) o->progress(o->progress_ctx, q.index, total);
    }
    if (rc < 0) goto out;
    if (o->mode == IKV_REPLAY_TIMED && (rc = finish_until(&s, INFINITY))) goto out;
    if (o->check_every && !ikv_cache_check(s.c)) {
        rc = ikv_error(IKV_EINVAL, "cache check failed at the end: %s", ikv_errdetail());
        goto out;
    }
    r->replay_seconds = ikv_now() - t0;
    if (r->requests == 0) {
        uint64_t sk = ikv_trace_skipped(t);
        const char *first = ikv_trace_first_error(t);
        if (first)
            rc = ikv_error(IKV_EEMPTY,
                           "%s: no valid request to replay: %llu malformed line%s skipped; the "
                           "first: %s",
                           ikv_trace_path(t), (unsigned long long)sk, sk == 1 ? "" : "s", first);
        else
            rc = ikv_error(IKV_EEMPTY, "%s: no request to replay", ikv_trace_path(t));
        goto out;
    }
    finish(&s, t);
    if (o->progress) o->progress(o->progress_ctx, total, total);
    rc = 0;
out:
    teardown(&s);
    if (rc) ikv_replay_result_free(r);
    return rc;
}
