/*
 * gdsf: GreedyDual-Size-Frequency (L. Cherkasova, "Improving WWW Proxies Performance with
 * Greedy-Dual-Size-Frequency Caching Policy", HP Labs TR HPL-98-69, 1998; after Cao & Irani's
 * GreedyDual-Size, USITS'97, and Young's GreedyDual, 1994).
 *
 *     H(b) = L + freq(b) * cost(b) / size(b)
 *
 *   freq   accesses since the block entered the cache (the core's hit count + 1);
 *   cost   the cache's cost callback (recompute cost of the block's tokens at its depth), or 1
 *          with cost=unit (Cherkasova's GDSF(1), which maximises the hit ratio);
 *   size   the block's tokens;
 *   L      the inflation value: on each eviction L rises to the victim's H, so blocks that are
 *          not accessed fall behind the ones priced later (aging without touching them).
 * H is recomputed at every access and at admission into the tier (with that tier's L).
 * Victim: the evictable leaf with the smallest H.
 *
 * This is the published algorithm, unchanged. The project's `value` policy (value.c) used to be
 * GDSF with extra parameters; it now predicts next use from chain reuse gaps and keeps only
 * GreedyDual's cost credit, so `gdsf` is the reference point for the GreedyDual family.
 *
 * Leaf-only adaptation: the heap holds only evictable blocks; H is kept in the node
 * (pol.f64[2]) while a block is off the heap (locked, pinned, or with children), so a block
 * that becomes evictable again competes with the H of its last access, as in GreedyDual. The
 * frequency is the core's hit counter + 1, which survives tiers and times off the queue (it
 * saturates at 256: above that, blocks compete on cost and age only). cost/size is computed
 * once at insertion and kept in the node (pol.u32[1], a float, tagged in pol.u32[3] so that a
 * block demoted from a tier run by another policy is recognised and priced afresh from a full
 * block's size, since the core does not keep token counts).
 *
 * Parameters: cost=callback (default) | unit.
 * Cost: O(log n) per event (the core's 4-ary heap, float keys, ties by node id); 8 bytes per
 * block of heap.
 */
#include "../internal.h"

#include <string.h>

typedef struct gdsf {
    ikv__heap_policy hp; /* first: the shared heap ops (ikv__hp_*) take the state as this */
    ikv_cost_fn cost;
    void *cost_ctx;
    uint32_t block_tokens;
    double L;
    int unit; /* cost=unit: every block costs 1 */
} gdsf;

/* pol: u32[1] = cost per token (float), u32[3] = TAG when this policy wrote it, f64[2] = H
 * (the heap position is the node's hpos). */
#define TAG 0x67647366u /* "gdsf" */
static inline float *cpt_of(ikv__node *n) {
    return (float *)&n->pol.u32[1];
}

static int set_param(void *ctx, const char *k, const char *v) {
    gdsf *p = ctx;
    if (strcmp(k, "cost"))
        return ikv_error(IKV_EPARAM, "gdsf: unknown parameter '%s' (cost)", k);
    if (!strcmp(v, "callback")) p->unit = 0;
    else if (!strcmp(v, "unit")) p->unit = 1;
    else return ikv_error(IKV_EPARAM, "gdsf: cost=%s must be 'callback' or 'unit'", v);
    return 0;
}

static int gdsf_create(const ikv__policy_env *env, const char *params, void **out) {
    gdsf *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    int rc = ikv__params_each(params, set_param, p);
    if (!rc && ikv__heap_init(&p->hp.h, env)) rc = IKV_ENOMEM;
    if (rc) {
        ikv_free(p);
        return rc;
    }
    p->hp.nodes = env->nodes;
    p->cost = env->cost;
    p->cost_ctx = env->cost_ctx;
    p->block_tokens = env->block_tokens ? env->block_tokens : 1;
    *out = p;
    return 0;
}

static void gdsf_destroy(void *s) {
    gdsf *p = s;
    if (!p) return;
    ikv__heap_free(&p->hp.h);
    ikv_free(p);
}

static double priority(const gdsf *p, ikv__node *n) {
    return p->L + ((double)n->hits + 1.0) * (double)*cpt_of(n);
}

/* Prices the block (cost per token) at insertion, or on arrival from a tier run by another
 * policy; a block demoted from a gdsf tier keeps its price. */
static void gdsf_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    gdsf *p = s;
    ikv__node *n = &p->hp.nodes[id];
    if (a || n->pol.u32[3] != TAG) {
        uint32_t ntok = a && a->ntokens ? a->ntokens[pos] : p->block_tokens;
        if (!ntok) ntok = 1;
        double cost = p->unit ? 1.0 : p->cost(p->cost_ctx, n->depth, ntok);
        *cpt_of(n) = (float)(cost / (double)ntok);
        n->pol.u32[3] = TAG;
    }
    IKV__HKEY(n) = priority(p, n);
}

/* The core has already counted this hit in node->hits. */
static void gdsf_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    gdsf *p = s;
    ikv__node *n = &p->hp.nodes[id];
    double h = priority(p, n);
    if (n->flags & IKV__QUEUED) ikv__heap_update(&p->hp.h, p->hp.nodes, id, h);
    else IKV__HKEY(n) = h;
}

/* The smallest H; L rises to it (the core evicts the block it is given). */
static uint32_t gdsf_victim(void *s) {
    gdsf *p = s;
    uint32_t v = ikv__heap_top(&p->hp.h);
    if (v != IKV_NIL && IKV__HKEY(&p->hp.nodes[v]) > p->L) p->L = IKV__HKEY(&p->hp.nodes[v]);
    return v;
}

static size_t gdsf_bytes(const void *s) {
    const gdsf *p = s;
    return (size_t)p->hp.h.cap * sizeof(ikv__hslot);
}

const ikv_policy_ops ikv_policy_gdsf = {
    .name = "gdsf",
    .doc = "GreedyDual-Size-Frequency: L + freq * cost / size (param cost=callback|unit)",
    .create = gdsf_create,
    .destroy = gdsf_destroy,
    .admit = gdsf_admit,
    .hit = gdsf_hit,
    .queue = ikv__hp_queue,
    .dequeue = ikv__hp_dequeue,
    .leave = ikv__hp_leave,
    .victim = gdsf_victim,
    .check = ikv__hp_check,
    .queued = ikv__hp_queued,
    .bytes = gdsf_bytes,
};
