/*
 * lhd: hit density, learned online (N. Beckmann, H. Chen, A. Cidon, "LHD: Improving Cache Hit
 * Rate by Maximizing Hit Density", NSDI'18), adapted to a prefix cache, with ghost feedback
 * and an optional weight for the recompute cost a hit saves: issue 15's learned candidate for
 * `value` (docs/policies.md, "Learned: hit density").
 *
 * A block's worth is its expected hits per unit of cache space-time from now on, D[c][a] for a
 * block of class c at age a (time since its last access), learned from the ages at which
 * blocks of its class were hit or evicted (hdmodel.h). Its density is D[c][a] * w(b), w(b) =
 * tokens(b) * (1 + cost * ln(c(b) / c0)): the tokens a hit saves, and (cost > 0) dearer blocks
 * (deeper in the context, by the cache's cost callback) weighed up, as `value`'s credit does.
 * The victim is the block of least density among `sample` evictable blocks drawn at random
 * (LHD's associativity; all of them when no more are queued; ties to the older block, then the
 * lower id). D only changes at a recomputation, so nothing is re-keyed: a block's density
 * moves with its age alone.
 *
 * Classes (LHD classifies by reference history; here by what a prefix cache knows):
 *   hits bucket   the core's hit count at the block's last access: 0, 1, 2, 3-4, 5-8, 9+;
 *   tail bit      (tail=1) admitted as the only resident child of a parent that had been hit:
 *                 a conversation's new tail under a reused chain, learned apart from fresh
 *                 chains and forks;
 *   root bit      (root=1) a first block (depth 0): system prompts and other shared roots;
 *   back bit      admitted on a ghost hit: evicted recently and asked for again.
 * A hit is counted in the class the block had while its age ran; then the block moves to the
 * bucket of its new hit count.
 *
 * Ghost feedback (ghost=G > 0, default 1): an exact ghost (ghostq.h) of the last G x c evicted
 * keys, and per ghost slot the block's class, last access and age at eviction; a missed key
 * found there turns that eviction into the hit it would have been (ikv__hd_unevict). Without
 * it (ghost=0) LHD only sees hits at the ages it lets blocks reach, and on the grid it is
 * LRU-like (scenario B personal-first 100,000 users: 0.167 against 0.313 with it).
 *
 * Leaf-only eviction: only evictable blocks (the core's queue) are sampled, so a chain goes
 * from its leaf up; an exposed parent is sampled with its own age and class like any block.
 *
 * Node fields: pol.u32[0] class, pol.u32[1] w(b) (float), pol.u32[3] TAG (a block from a tier
 * run by another policy starts with flags 0 in its hits bucket). The evictable set is a dense
 * array of node ids with the position in the node's hpos (swap-remove): 4 bytes per block;
 * the ghost 24 + 8 bytes per remembered key. Cost: queue, dequeue, hit, leave, miss O(1)
 * (expected, for the ghost); victim O(sample); a recomputation O(96 x 256) every `period`
 * events. Nothing allocated after create.
 *
 * Parameters: sample (64), period (65536 events), decay (0.9), pool (16), cost (0; 0.1 measured
 * lower on the grid), tail (1), root (1), ghost (1).
 */
#include "../internal.h"
#include "ghostq.h"
#include "hdmodel.h"

#include <math.h>
#include <string.h>

#define TAG    0x6c68643au /* "lhd:" */
#define F_TAIL 1u
#define F_ROOT 2u
#define F_BACK 4u

/* What the ghost keeps of an evicted block, per ghost slot: enough to turn its eviction into
 * the hit it would have been. */
typedef struct lhd_gdata {
    uint32_t last;     /* low 32 bits of its last access time (ages are taken mod 2^32) */
    uint32_t eage_cls; /* age at eviction (24 bits, saturating) << 8 | class */
} lhd_gdata;

typedef struct lhd {
    ikv__node *nodes;
    ikv_cost_fn cost_fn;
    void *cost_ctx;
    const uint64_t *now;
    uint32_t block_tokens;
    double c0; /* cost per token of a first full block */
    double sample, period, decay, pool, cost, tail, root, ghostw;
    uint32_t *set; /* the evictable blocks; a block's position is its hpos */
    uint64_t len, cap;
    uint32_t pending; /* the last victim returned, until it leaves */
    uint64_t rng;     /* xorshift64*, fixed seed: runs are deterministic */
    ikv__ghostq g;    /* ghost > 0: keys of recently evicted blocks */
    lhd_gdata *gd;    /* per ghost slot */
    ikv_key x;        /* the announced miss, and whether the ghost had it */
    int x_valid, x_back;
    uint64_t ghost_hits;
    ikv__hd m; /* last: large */
} lhd;

#define CLS(n) ((n)->pol.u32[0])
static inline float *w_of(ikv__node *n) {
    return (float *)&n->pol.u32[1];
}

static int set_param(void *ctx, const char *k, const char *v) {
    lhd *p = ctx;
    if (!strcmp(k, "sample")) return ikv__param_double("lhd", k, v, 1, 1024, &p->sample);
    if (!strcmp(k, "period")) return ikv__param_double("lhd", k, v, 16, 1e12, &p->period);
    if (!strcmp(k, "decay")) return ikv__param_double("lhd", k, v, 0, 1, &p->decay);
    if (!strcmp(k, "pool")) return ikv__param_double("lhd", k, v, 0, 1e12, &p->pool);
    if (!strcmp(k, "cost")) return ikv__param_double("lhd", k, v, 0, 1e3, &p->cost);
    if (!strcmp(k, "ghost")) return ikv__param_double("lhd", k, v, 0, 4, &p->ghostw);
    if (!strcmp(k, "tail")) return ikv__param_whole("lhd", k, v, 0, 1, &p->tail);
    if (!strcmp(k, "root")) return ikv__param_whole("lhd", k, v, 0, 1, &p->root);
    return ikv_error(IKV_EPARAM,
                     "lhd: unknown parameter '%s' (sample, period, decay, pool, cost, tail, "
                     "root, ghost)",
                     k);
}

static void lhd_destroy(void *s) {
    lhd *p = s;
    if (!p) return;
    ikv__ghostq_free(&p->g);
    ikv_free(p->gd);
    ikv_free(p->set);
    ikv_free(p);
}

static int lhd_create(const ikv__policy_env *env, const char *params, void **out) {
    lhd *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->sample = 64;
    p->period = 65536;
    p->decay = 0.9;
    p->pool = 16;
    p->cost = 0;
    p->tail = 1;
    p->root = 1;
    p->ghostw = 1;
    int rc = ikv__params_each(params, set_param, p);
    p->cap = env->capacity ? env->capacity : 1;
    if (!rc && !(p->set = ikv_calloc(p->cap, sizeof *p->set))) rc = IKV_ENOMEM;
    uint64_t gcap = (uint64_t)(p->ghostw * (double)env->capacity);
    if (!rc && gcap > 0 &&
        (ikv__ghostq_init(&p->g, gcap) || !(p->gd = ikv_calloc(gcap, sizeof *p->gd))))
        rc = IKV_ENOMEM;
    if (rc) {
        lhd_destroy(p);
        return rc;
    }
    ikv__hd_init(&p->m, p->period, p->decay, p->pool);
    p->nodes = env->nodes;
    p->cost_fn = env->cost;
    p->cost_ctx = env->cost_ctx;
    p->now = env->now;
    p->block_tokens = env->block_tokens ? env->block_tokens : 1;
    p->c0 = p->cost_fn(p->cost_ctx, 0, p->block_tokens) / p->block_tokens;
    if (!(p->c0 > 0)) p->c0 = 1;
    p->pending = IKV_NIL;
    p->rng = 0x9e3779b97f4a7c15ull;
    *out = p;
    return 0;
}

static inline uint64_t age_of(const lhd *p, const ikv__node *n) {
    uint64_t now = *p->now;
    return now > n->last ? now - n->last : 0;
}

/* Ghost feedback: a missed key found among the recently evicted was a hit that the eviction
 * cost; the model is told so, and the block comes back with the back bit. */
static void lhd_miss(void *s, ikv_key k) {
    lhd *p = s;
    uint32_t slot;
    p->x = k;
    p->x_valid = 1;
    p->x_back = ikv__ghostq_take_slot(&p->g, k, &slot) >= 0;
    if (!p->x_back) return;
    p->ghost_hits++;
    lhd_gdata d = p->gd[slot];
    ikv__hd_unevict(&p->m, d.eage_cls & 0xffu, d.eage_cls >> 8,
                    (uint32_t)((uint32_t)*p->now - d.last));
}

/* A new block takes its weight (tokens x cost factor) and its tail, root and back bits; a
 * block moving between tiers that both run lhd keeps its fields. */
static void lhd_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    lhd *p = s;
    ikv__node *n = &p->nodes[id];
    int back = p->x_valid && p->x_back && ikv_key_eq(p->x, n->key);
    p->x_valid = 0;
    if (!a && n->pol.u32[3] == TAG) return;
    uint32_t ntok = a && a->ntokens ? a->ntokens[pos] : p->block_tokens;
    if (!ntok) ntok = 1;
    double r = p->cost_fn(p->cost_ctx, n->depth, ntok) / (double)ntok / p->c0;
    *w_of(n) = (float)(ntok * (1 + (p->cost > 0 && r > 1 ? p->cost * log(r) : 0)));
    uint32_t f = back ? F_BACK : 0;
    if (p->root > 0 && n->depth == 0) f |= F_ROOT;
    if (p->tail > 0 && n->parent != IKV_NIL) {
        const ikv__node *pa = &p->nodes[n->parent];
        /* pa->nchild counts n already: exactly 1 means n continues its parent's chain */
        if (pa->tier == n->tier && pa->hits > 0 && pa->nchild[n->tier] == 1) f |= F_TAIL;
    }
    CLS(n) = ikv__hd_class(n->hits, f);
    n->pol.u32[3] = TAG;
}

/* A hit is evidence for the class the block had while its age ran; then it moves to the
 * bucket of its new hit count (the core counted this hit already). */
static void lhd_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    lhd *p = s;
    ikv__node *n = &p->nodes[id];
    ikv__hd_hit(&p->m, CLS(n), age_of(p, n));
    CLS(n) = ikv__hd_class(n->hits, CLS(n) % IKV__HD_NFL);
}

static void lhd_queue(void *s, uint32_t id) {
    lhd *p = s;
    p->nodes[id].hpos = (uint32_t)p->len;
    p->set[p->len++] = id;
}

static void lhd_dequeue(void *s, uint32_t id) {
    lhd *p = s;
    uint32_t i = p->nodes[id].hpos, last = p->set[--p->len];
    p->set[i] = last;
    p->nodes[last].hpos = i;
}

/* An evicted block is evidence at its age, and goes to the ghost with what is known of it. */
static void lhd_leave(void *s, uint32_t id) {
    lhd *p = s;
    if (id == p->pending) {
        ikv__node *n = &p->nodes[id];
        uint64_t age = age_of(p, n);
        ikv__hd_evict(&p->m, CLS(n), age);
        uint32_t slot = ikv__ghostq_add(&p->g, n->key, 0);
        if (slot != IKV_NIL)
            p->gd[slot] = (lhd_gdata){(uint32_t)n->last,
                                      (uint32_t)(age < 0xffffff ? age : 0xffffff) << 8 | CLS(n)};
    }
    p->pending = IKV_NIL;
}

/* A uniform index below n from the policy's xorshift64* stream. */
static uint64_t next_index(lhd *p, uint64_t n) {
    p->rng ^= p->rng >> 12, p->rng ^= p->rng << 25, p->rng ^= p->rng >> 27;
    return ((p->rng * 2685821657736338717ull) >> 11) % n;
}

/* The least dense of `sample` evictable blocks (all of them when no more are queued); ties go
 * to the older block, then the lower id. The sampled slots and then their nodes are
 * prefetched in batches of up to 64, so the random reads overlap instead of queueing. */
static uint32_t lhd_victim(void *s) {
    lhd *p = s;
    uint64_t n = p->len, k = (uint64_t)p->sample;
    uint32_t best = IKV_NIL;
    double bd = 0;
    if (n <= k) k = n;
    for (uint64_t i0 = 0; i0 < k; i0 += 64) {
        uint32_t idx[64];
        uint64_t m = k - i0 < 64 ? k - i0 : 64;
        for (uint64_t j = 0; j < m; j++) {
            idx[j] = (uint32_t)(n == k ? i0 + j : next_index(p, n));
            __builtin_prefetch(&p->set[idx[j]]);
        }
        for (uint64_t j = 0; j < m; j++) __builtin_prefetch(&p->nodes[p->set[idx[j]]].last);
        for (uint64_t j = 0; j < m; j++) {
            uint32_t id = p->set[idx[j]];
            ikv__node *nd = &p->nodes[id];
            double d = (double)ikv__hd_density(&p->m, CLS(nd), age_of(p, nd)) * *w_of(nd);
            if (best == IKV_NIL || d < bd ||
                (d == bd && (nd->last < p->nodes[best].last ||
                             (nd->last == p->nodes[best].last && id < best))))
                best = id, bd = d;
        }
    }
    return p->pending = best;
}

/* Every queued block is in the set at its hpos, queued, of this policy and of a valid class;
 * the model's counts and densities are sane; the ghost is consistent and uses one list. */
static int lhd_check(const void *s) {
    const lhd *p = s;
    if (p->len > p->cap) return 0;
    for (uint64_t i = 0; i < p->len; i++) {
        const ikv__node *n = &p->nodes[p->set[i]];
        if (n->hpos != i || !(n->flags & IKV__QUEUED) || n->pol.u32[3] != TAG ||
            CLS(n) >= IKV__HD_NCLS)
            return 0;
    }
    return ikv__hd_check(&p->m) && ikv__ghostq_check(&p->g) && ikv__ghostq_len(&p->g, 1) == 0;
}

static uint64_t lhd_queued(const void *s) {
    return ((const lhd *)s)->len;
}

static size_t lhd_bytes(const void *s) {
    const lhd *p = s;
    return (size_t)p->cap * sizeof *p->set + ikv__ghostq_bytes(&p->g) +
           (size_t)p->g.cap * sizeof *p->gd;
}

const ikv_policy_ops ikv_policy_lhd = {
    .name = "lhd",
    .doc = "hit density (LHD, NSDI'18): evict the least of `sample` evictable blocks by expected "
           "hits per space-time, learned per class (hits, chain tail, root, back from the "
           "ghost) from the ages of past hits and evictions, ghost misses counted as the hits "
           "they would have been (params sample, period, decay, pool, cost, tail, root, ghost)",
    .create = lhd_create,
    .destroy = lhd_destroy,
    .miss = lhd_miss,
    .admit = lhd_admit,
    .hit = lhd_hit,
    .queue = lhd_queue,
    .dequeue = lhd_dequeue,
    .leave = lhd_leave,
    .victim = lhd_victim,
    .check = lhd_check,
    .queued = lhd_queued,
    .bytes = lhd_bytes,
};
