/*
 * value: cost-aware eviction for prefix KV caches — keep the blocks whose loss would cost the
 * most recomputation per byte, weighted by how often they are reused, and let stale ones age out.
 *
 * Priority of a block b, set at every access (insert or hit):
 *
 *     H(b) = L + f(b)^beta * cost(b) / size(b)
 *
 *   cost(b)  recompute cost of b: the prefill FLOPs of its tokens at its depth, from the cache's
 *            cost callback (the simulator and engine pass the roofline model's FLOPs). Attention
 *            makes a block at depth d cost ~ linear + d * attention, so deep blocks of long shared
 *            prefixes are dearer to lose than shallow ones of the same size.
 *   size(b)  the block's tokens (KV bytes are proportional to tokens).
 *   f(b)     decayed reuse frequency: f <- f * 2^(-(now - last)/halflife) + 1 at each hit
 *            (1 at insert); halflife = 0 turns decay off (plain counts, as GDSF).
 *   L        the GreedyDual "inflation" clock: on every eviction L rises to the victim's H. A
 *            block not touched for a while keeps its old, low H while new accesses are priced
 *            from the higher L, so stale blocks go first even when they were once valuable
 *            (recency), without touching every block at every eviction.
 *
 * Victim: the evictable leaf with the smallest H (min-heap, O(log n) per event).
 *
 * This is GreedyDual-Size-Frequency (Cherkasova, "Improving WWW Proxies Performance with
 * Greedy-Dual-Size-Frequency Caching Policy", HP Labs TR 98-69, 1998; Young's GreedyDual, 1994)
 * with a depth-aware recompute cost in place of the fetch cost and an exponentially decayed
 * frequency so that yesterday's popularity fades.
 *
 * Parameters: beta (frequency exponent, default 1), halflife (time units of ikv_access.now,
 * default 0 = no decay), fmax (cap on f, default 0 = none), cexp (cost exponent: cost^cexp
 * replaces cost, default 1; 0 prices every token alike).
 *
 * Why fmax and cexp (measured on the WEKA agentic-coding trace, docs/simulator.md): there,
 * every request of a conversation re-hits its whole prefix, so f grows with the conversation's
 * length and a finished conversation's chain keeps an H far above the clock L long after its
 * last use; and the depth-aware cost (up to ~3.4x more per token at 128 k tokens of context for
 * llama3-70b) protects the deep tails of long conversations over the recency signal. Both make
 * the defaults (= GDSF) lose to LRU in token hit ratio once the interleaved working set
 * exceeds the cache. Capping f at 3 (a block re-referenced a couple of times is protected a
 * little longer, popularity stops accumulating) and cexp = 0 beat LRU, S3-FIFO and SIEVE at
 * 64-355 interleaved conversations in 0.5 M and 2 M tokens; "value:fmax=3,cexp=0" is that
 * tuned setting. The defaults stay GDSF-equivalent (tests/test_cache.c pins them).
 */
#include "../internal.h"

#include <math.h>
#include <string.h>

typedef struct value {
    ikv__heap h;
    ikv__node *nodes;
    ikv_cost_fn cost;
    void *cost_ctx;
    const uint64_t *now;
    uint32_t block_tokens;
    double L;
    double beta, halflife;
    double fmax;  /* frequency cap (0 = none) */
    double cexp;  /* cost exponent: cost^cexp (1 = cost as is, 0 = every block the same) */
} value;

/* pol: u32[0] = decayed frequency (float), u32[1] = recompute cost per token (float), s.a =
 * heap position, f64[2] = H (the heap key). */
static inline float *freq_of(ikv__node *n) {
    return (float *)&n->pol.u32[0];
}
static inline float *cost_of(ikv__node *n) {
    return (float *)&n->pol.u32[1];
}

static int set_param(void *ctx, const char *k, const char *v) {
    value *p = ctx;
    if (!strcmp(k, "beta")) return ikv__param_double("value", k, v, 0, 8, &p->beta);
    if (!strcmp(k, "halflife")) return ikv__param_double("value", k, v, 0, 1e18, &p->halflife);
    if (!strcmp(k, "fmax")) return ikv__param_double("value", k, v, 0, 1e9, &p->fmax);
    if (!strcmp(k, "cexp")) return ikv__param_double("value", k, v, 0, 4, &p->cexp);
    return ikv_error(IKV_EPARAM, "value: unknown parameter '%s' (beta, halflife, fmax, cexp)", k);
}

static int value_create(const ikv__policy_env *env, const char *params, void **out) {
    value *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->beta = 1.0;
    p->halflife = 0;
    p->fmax = 0;
    p->cexp = 1.0;
    int rc = ikv__params_each(params, set_param, p);
    if (!rc && ikv__heap_init(&p->h, env->capacity)) rc = IKV_ENOMEM;
    if (rc) {
        ikv_free(p);
        return rc;
    }
    p->nodes = env->nodes;
    p->cost = env->cost;
    p->cost_ctx = env->cost_ctx;
    p->now = env->now;
    p->block_tokens = env->block_tokens;
    *out = p;
    return 0;
}

static void value_destroy(void *s) {
    value *p = s;
    if (!p) return;
    ikv__heap_free(&p->h);
    ikv_free(p);
}

static double priority(const value *p, ikv__node *n) {
    double f = *freq_of(n);
    if (p->fmax > 0 && f > p->fmax) f = p->fmax;
    if (p->beta != 1.0) f = pow(f, p->beta);
    double c = *cost_of(n);
    if (p->cexp != 1.0) c = pow(c, p->cexp);
    return p->L + f * c;
}

/* The per-token recompute cost is computed once, when the block is inserted; a block that
 * moves between tiers keeps it (and its frequency) when both tiers run this policy. */
static void value_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    value *p = s;
    ikv__node *n = &p->nodes[id];
    if (a) {
        uint32_t ntok = a->ntokens ? a->ntokens[pos] : p->block_tokens;
        if (!ntok) ntok = 1;
        *freq_of(n) = 1.0f;
        *cost_of(n) = (float)(p->cost(p->cost_ctx, n->depth, ntok) / (double)ntok);
    } else if (!(*freq_of(n) >= 1.0f && *cost_of(n) > 0)) {
        /* moved in from a tier run by another policy: its fields are not ours */
        *freq_of(n) = 1.0f;
        *cost_of(n) = (float)(p->cost(p->cost_ctx, n->depth, p->block_tokens) / p->block_tokens);
    }
    IKV__HKEY(n) = priority(p, n);
}

static void value_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    value *p = s;
    ikv__node *n = &p->nodes[id];
    /* node->last is still the previous access (the core sets it after this call) */
    if (p->halflife > 0 && *p->now > n->last)
        *freq_of(n) *= (float)exp2(-(double)(*p->now - n->last) / p->halflife);
    *freq_of(n) += 1.0f;
    double h = priority(p, n);
    if (n->flags & IKV__QUEUED) ikv__heap_update(&p->h, p->nodes, id, h);
    else IKV__HKEY(n) = h;
}

static void value_queue(void *s, uint32_t id) {
    value *p = s;
    ikv__heap_push(&p->h, p->nodes, id, IKV__HKEY(&p->nodes[id]));
}

static void value_dequeue(void *s, uint32_t id) {
    value *p = s;
    ikv__heap_remove(&p->h, p->nodes, id);
}

static void value_leave(void *s, uint32_t id) {
    (void)s, (void)id;
}

static uint32_t value_victim(void *s) {
    value *p = s;
    uint32_t v = ikv__heap_top(&p->h);
    if (v != IKV_NIL && IKV__HKEY(&p->nodes[v]) > p->L) p->L = IKV__HKEY(&p->nodes[v]);
    return v;
}

static int value_check(const void *s) {
    const value *p = s;
    return ikv__heap_check(&p->h, p->nodes);
}

static uint64_t value_queued(const void *s) {
    return ((const value *)s)->h.len;
}

static size_t value_bytes(const void *s) {
    const value *p = s;
    return sizeof *p + (size_t)p->h.cap * sizeof(ikv__hslot);
}

const ikv_policy_ops ikv_policy_value = {
    .name = "value",
    .doc = "cost-aware: L + freq^beta * recompute cost / size, GreedyDual aging "
           "(params beta, halflife)",
    .create = value_create,
    .destroy = value_destroy,
    .admit = value_admit,
    .hit = value_hit,
    .queue = value_queue,
    .dequeue = value_dequeue,
    .leave = value_leave,
    .victim = value_victim,
    .check = value_check,
    .queued = value_queued,
    .bytes = value_bytes,
};
