/*
 * value: the cost-aware eviction policy of isokv — evict the block whose next use is predicted
 * farthest away, where a block's prediction comes from the reuse gaps of its own chain, a chain
 * that has never been reused is predicted far, and a dearer block is predicted a little nearer.
 *
 * Key of a block b, set at every access (insert or hit); the victim is the evictable leaf with
 * the smallest key (min-heap, O(log n) per event):
 *
 *     K(b) = last(b) - gap(b) + cost * gbar * ln(c(b) / c0)
 *
 *   last(b)  the time of b's last access (ikv_access.now).
 *   gap(b)   b's predicted inter-reference gap: at each hit, gap <- (1 - smooth) * gap +
 *            smooth * (now - last) (the first hit sets it). A block inserted as part of a chain
 *            inherits its parent's gap at admission: in a prefix cache the next use of a
 *            conversation's new tail is that conversation's next request, which re-reads the
 *            whole chain, so the chain's history is the tail's best predictor. A block whose
 *            chain shows no reuse yet (a first block, or the new blocks under one) is
 *            "unproven" and gets gap = new * gbar.
 *   gbar     running mean of observed gaps, over all hit blocks (exponential, weight 2^-10 per
 *            block hit: in a trace of long chains, the gaps of the last one or two requests).
 *   c(b)/c0  b's recompute cost per token (the cache's cost callback at b's depth) over that of
 *            a first full block: >= 1 with attention-shaped costs (up to ~3.4 at 128 k tokens of
 *            context for llama3-70b on the roofline model; depth + 1 with the core's default).
 *   cost     weight of the cost term (default 0.1): a block k times dearer per token is kept as
 *            if it had been used cost * ln(k) mean gaps later.
 *
 * Why. last - gap is the time of the block's previous-but-one use, smoothed: ordering by it is
 * LRU-2 (O'Neil, O'Neil & Weikum, "The LRU-K page replacement algorithm", SIGMOD'93), read
 * here as a Belady estimate (evict the farthest next use; Belady 1966) with next use = last +
 * gap and a gap that is less trusted the older the block. On the WEKA agentic-coding trace
 * (docs/simulator.md) the measured signal is mostly in the unproven/proven split, not in the
 * gap's size: successive gaps of a conversation correlate weakly (0.2 in log), but when many
 * ~100 k-token conversations interleave in a cache that holds a few, admitting every re-inserted
 * chain at the front (LRU) makes every conversation lose; predicting unproven chains 4 mean gaps
 * away keeps a stable set of conversations that keep coming back, as ARC's T1/T2 split and
 * LIRS's HIR/LIR split do (Megiddo & Modha, FAST'03; Jiang & Zhang, SIGMETRICS'02), while the
 * inherited gap keeps the new tails of those conversations with their chains (ARC would put
 * them in T1 and evict them first). The cost term is GreedyDual's idea (Young 1994; Cao &
 * Irani's GreedyDual-Size 1997; Cherkasova's GDSF 1998, which `gdsf` implements) in time
 * units, with a logarithm so that a deep block's price buys bounded extra life: the previous
 * `value` (GDSF with the depth cost) let deep tails of long conversations outlive live ones.
 *
 * Measured (simulated, token hit ratio, WEKA order mode; docs/simulator.md): above lru, s3fifo
 * and sieve at 0.5 M tokens for 64-355 conversations and at 2 M for 128-355; below lru at 2 M /
 * 64 (capacity barely short) and below arc in places; opt is 3-18 points higher.
 *
 * Tried and rejected on the same cells: ordering by last + gap (farthest predicted use first:
 * overdue, finished chains are then kept; 0.09 at 2 M / 355); GreedyDual with 1/gap as the
 * price (lru-like); the unproven penalty as a multiple of the cache's eviction age instead of
 * gbar (it shrinks with itself: lru-like); adapting `new` from ghost hits, ARC-style (it drifts
 * to the wrong end); a smoother gbar (weight 2^-14 or 2^-17 per block hit, or one sample per
 * request: 0.36-0.39 at 2 M / 355 instead of 0.415, so the result depends on gbar following the
 * last requests' gaps closely); the cost as a divisor of the gap, or as a credit in units of the
 * eviction horizon (up to 10 and 6 points of token hits lost at 2 M / 355).
 *
 * Parameters: new (unproven gap in mean gaps, default 4; 0 = no penalty), smooth (default
 * 0.5; 1 = last gap only), cost (default 0.1; 0 = cost ignored), lru2 (weight of gap(b) for
 * proven blocks, default 1; 0 orders proven blocks by recency alone).
 *
 * Node fields: pol.u32[0] = gap (float, time units; -1 = unproven), pol.u32[1] = cost per token
 * (float), pol.u32[3] = TAG when this policy wrote them (a block demoted from a tier run by
 * another policy is recognised and starts unproven), pol.f64[2] = K (the heap position is the
 * node's hpos).
 * Cost: O(log n) per event; 8 bytes of heap per block; nothing allocated after create.
 */
#include "../internal.h"

#include <math.h>
#include <string.h>

#define TAG      0x76616c75u  /* "valu" */
#define UNPROVEN (-1.0f)      /* gap of a block whose chain shows no reuse yet */
#define GBAR_W   (1.0 / 1024) /* weight of one block hit's gap in gbar */

typedef struct value {
    ikv__heap_policy hp; /* first: the shared heap ops (ikv__hp_*) take the state as this */
    ikv_cost_fn cost_fn;
    void *cost_ctx;
    const uint64_t *now;
    uint32_t block_tokens;
    double c0;     /* cost per token of a first full block (> 0) */
    double gbar;   /* running mean of observed gaps (time units); 0 until the first hit */
    double newg;   /* unproven gap, in mean gaps */
    double smooth; /* weight of the latest gap */
    double cost;   /* weight of ln(c / c0), in mean gaps */
    double lru2;   /* weight of a proven block's own gap */
} value;

static inline float *gap_of(ikv__node *n) {
    return (float *)&n->pol.u32[0];
}
static inline float *cpt_of(ikv__node *n) {
    return (float *)&n->pol.u32[1];
}

static int set_param(void *ctx, const char *k, const char *v) {
    value *p = ctx;
    if (!strcmp(k, "new")) return ikv__param_double("value", k, v, 0, 1e6, &p->newg);
    if (!strcmp(k, "smooth")) return ikv__param_double("value", k, v, 0.001, 1, &p->smooth);
    if (!strcmp(k, "cost")) return ikv__param_double("value", k, v, 0, 1e3, &p->cost);
    if (!strcmp(k, "lru2")) return ikv__param_double("value", k, v, 0, 1e3, &p->lru2);
    return ikv_error(IKV_EPARAM, "value: unknown parameter '%s' (new, smooth, cost, lru2)", k);
}

static int value_create(const ikv__policy_env *env, const char *params, void **out) {
    value *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->newg = 4;
    p->smooth = 0.5;
    p->cost = 0.1;
    p->lru2 = 1;
    int rc = ikv__params_each(params, set_param, p);
    if (!rc && ikv__heap_init(&p->hp.h, env)) rc = IKV_ENOMEM;
    if (rc) {
        ikv_free(p);
        return rc;
    }
    p->hp.nodes = env->nodes;
    p->cost_fn = env->cost;
    p->cost_ctx = env->cost_ctx;
    p->now = env->now;
    p->block_tokens = env->block_tokens;
    p->c0 = p->cost_fn(p->cost_ctx, 0, p->block_tokens) / p->block_tokens;
    if (!(p->c0 > 0)) p->c0 = 1;
    *out = p;
    return 0;
}

static void value_destroy(void *s) {
    value *p = s;
    if (!p) return;
    ikv__heap_free(&p->hp.h);
    ikv_free(p);
}

/* K(b) for a block last accessed at `last` (see the header). */
static double key_of(const value *p, ikv__node *n, uint64_t last) {
    double g = *gap_of(n);
    g = g < 0 ? p->newg * p->gbar : p->lru2 * g;
    double k = (double)last - g;
    double r = *cpt_of(n) / p->c0;
    if (p->cost > 0 && r > 1) k += p->cost * (p->gbar > 1 ? p->gbar : 1) * log(r);
    return k;
}

/* A new block (a != NULL) takes its cost per token from the callback and its gap from its
 * parent when that is in this tier under this policy (chains are inserted top down, so the
 * parent was just hit or inserted), else starts unproven. A block moving between tiers that
 * both run this policy keeps both fields. */
static void value_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    value *p = s;
    ikv__node *n = &p->hp.nodes[id];
    if (a) {
        uint32_t ntok = a->ntokens ? a->ntokens[pos] : p->block_tokens;
        if (!ntok) ntok = 1;
        *cpt_of(n) = (float)(p->cost_fn(p->cost_ctx, n->depth, ntok) / (double)ntok);
        float g = UNPROVEN;
        if (n->parent != IKV_NIL) {
            ikv__node *pa = &p->hp.nodes[n->parent];
            if (pa->pol.u32[3] == TAG && pa->tier == n->tier) g = *gap_of(pa);
        }
        *gap_of(n) = g;
        n->pol.u32[3] = TAG;
    } else if (n->pol.u32[3] != TAG) {
        *gap_of(n) = UNPROVEN;
        *cpt_of(n) = (float)(p->cost_fn(p->cost_ctx, n->depth, p->block_tokens) / p->block_tokens);
        n->pol.u32[3] = TAG;
    }
    IKV__HKEY(n) = key_of(p, n, n->last);
}

static void value_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    value *p = s;
    ikv__node *n = &p->hp.nodes[id];
    /* node->last is still the previous access (the core sets it after this call) */
    uint64_t now = *p->now;
    double gap = now > n->last ? (double)(now - n->last) : 0;
    float g = *gap_of(n);
    *gap_of(n) = g < 0 ? (float)gap : (float)((1 - p->smooth) * g + p->smooth * gap);
    p->gbar = p->gbar == 0 ? gap : (1 - GBAR_W) * p->gbar + GBAR_W * gap;
    double k = key_of(p, n, now);
    if (n->flags & IKV__QUEUED)
        ikv__heap_update(&p->hp.h, p->hp.nodes, id, k);
    else
        IKV__HKEY(n) = k;
}

static size_t value_bytes(const void *s) {
    const value *p = s;
    return (size_t)p->hp.h.cap * sizeof(ikv__hslot);
}

const ikv_policy_ops ikv_policy_value = {
    .name = "value",
    .doc = "cost-aware predicted next use: last - chain reuse gap (unproven chains: 4 mean "
           "gaps) + cost * mean gap * ln(recompute cost/token) (params new, smooth, cost, lru2)",
    .create = value_create,
    .destroy = value_destroy,
    .admit = value_admit,
    .hit = value_hit,
    .queue = ikv__hp_queue,
    .dequeue = ikv__hp_dequeue,
    .leave = ikv__hp_leave,
    .victim = ikv__hp_victim,
    .check = ikv__hp_check,
    .queued = ikv__hp_queued,
    .bytes = value_bytes,
};
