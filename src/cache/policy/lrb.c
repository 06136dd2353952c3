/*
 * lrb: learned relaxed Belady (Z. Song, D. S. Berger, K. Li, W. Lloyd, "Learning Relaxed Belady
 * for Content Distribution Network Caching", NSDI'20), adapted to a prefix cache: issue 15's
 * per-block learned candidate (docs/policies.md, "lrb").
 *
 * Relaxed Belady: any block whose next access lies beyond the Belady boundary B (about how
 * long the cache can keep an unused block anyway) is as good a victim as Belady's. LRB learns,
 * from each block's own access history, whether its next access falls within B, and evicts
 * among a random sample of blocks the one least likely to come back within B:
 *
 *     victim = argmin over `sample` evictable blocks of P(access within B | features)
 *              (ties: the oldest last access, then the lower id)
 *
 * Features (lrbmodel.h): the block's age and its last gap, both against B, the gap before it,
 * its access count, and root / fork / back-from-ghost flags. In a prefix cache every turn of a
 * conversation re-reads its whole chain, so a block's gaps are its conversation's turn gaps;
 * a block inserted under a parent accessed in the same request (a conversation's new tail)
 * starts with its parent's history (inherit=1), and a block back from the ghost with its own.
 *
 * Labels, online as LRB makes them: at every eviction `train` of the sampled blocks without a
 * pending sample are sampled: their cell (features now) and a deadline now + B are kept with
 * them. The sample is labelled positive if the block is accessed by its deadline — hit while
 * resident, or missed while its key is in the ghost — and negative if it is accessed after it,
 * evicted after it, or forgotten by the ghost first.
 *
 * The boundary B (bound=0, default) is the cache's characteristic time by Little's law:
 * capacity / eviction rate (blocks evicted per unit of logical time, over windows of
 * max(64, c/64) evictions, smoothed 1/4 per window); bound=1 uses a running mean (weight 2^-8)
 * of the victims' ages instead. bmul scales it. 0 until the first window closes (every
 * prediction then has an age >= B: the model starts from the count and flags alone).
 *
 *     node id ->  side[id]  { pending cell, deadline, gap codes g1 g2 g3, count, flags }
 *     ghost slot -> gd[s]   { pending cell, deadline, last access, gap codes, count }
 *     set[]       the evictable blocks (position in the node's hpos, swap-remove, as lhd)
 *
 * Leaf-only eviction: only evictable blocks (the core's queue) are sampled; an exposed parent
 * is sampled with its own age and history. Memory: 16 bytes per node of the pool (side),
 * 4 per block (set), 24 + 16 per ghost key (ghost x c keys); a fixed ~285 KiB model. Cost:
 * admit, hit, queue, dequeue, leave, miss O(1) (expected, for the ghost); victim O(sample);
 * a label O(1), halving O(cells) every `period` labels. Nothing allocated after create.
 *
 * Parameters: sample (64), train (1), period (32768), pool (8), bmul (1), bound (0), ghost (1),
 * inherit (1).
 */
#include "../internal.h"
#include "ghostq.h"
#include "lrbmodel.h"

#include <string.h>

/* What lrb keeps per node id (16 bytes). */
typedef struct lrb_side {
    uint32_t cell;  /* pending sample's cell, IKV_NIL when none */
    uint32_t dl;    /* its deadline (low 32 bits of the logical time) */
    uint8_t g[3];   /* half-octave codes of the last three gaps, newest first (0 = none) */
    uint8_t cnt;    /* accesses (own, or inherited with the parent's history), saturating */
    uint8_t fl;     /* IKV__LRB_ROOT | FORK | BACK */
    uint8_t valid;  /* 1 while the block is in this tier */
    uint8_t pad[2];
} lrb_side;

/* What the ghost keeps of an evicted block, per ghost slot (16 bytes). */
typedef struct lrb_gdata {
    uint32_t cell, dl; /* its pending sample (cell IKV_NIL: none) */
    uint32_t last;     /* low 32 bits of its last access */
    uint8_t g[3], cnt;
} lrb_gdata;

typedef struct lrb {
    ikv__node *nodes;
    const uint64_t *now;
    uint64_t cap, node_limit;
    double sample, train, period, pool, bmul, bound, ghostw, inherit;
    uint32_t *set; /* the evictable blocks; a block's position is its hpos */
    uint64_t len;
    lrb_side *side; /* node_limit */
    uint32_t pending; /* the last victim returned, until it leaves */
    uint64_t rng;     /* xorshift64*, fixed seed: runs are deterministic */
    ikv__ghostq g;
    lrb_gdata *gd;
    ikv_key x; /* the announced miss, and what the ghost had of it */
    int x_valid, x_back;
    lrb_gdata xd;
    /* the boundary */
    double B;          /* in logical time */
    uint32_t cb;       /* ikv__lrb_code(B) */
    uint64_t win_ev;   /* evictions in the current window */
    uint64_t win_t0;   /* its start time */
    uint64_t evictions, ghost_hits, samples;
    ikv__lrbm m; /* last: large */
} lrb;

static int set_param(void *ctx, const char *k, const char *v) {
    lrb *p = ctx;
    if (!strcmp(k, "sample")) return ikv__param_whole("lrb", k, v, 1, 1024, &p->sample);
    if (!strcmp(k, "train")) return ikv__param_whole("lrb", k, v, 0, 64, &p->train);
    if (!strcmp(k, "period")) return ikv__param_whole("lrb", k, v, 16, 1e12, &p->period);
    if (!strcmp(k, "pool")) return ikv__param_double("lrb", k, v, 0, 1e9, &p->pool);
    if (!strcmp(k, "bmul")) return ikv__param_double("lrb", k, v, 0.01, 100, &p->bmul);
    if (!strcmp(k, "bound")) return ikv__param_whole("lrb", k, v, 0, 1, &p->bound);
    if (!strcmp(k, "ghost")) return ikv__param_double("lrb", k, v, 0, 4, &p->ghostw);
    if (!strcmp(k, "inherit")) return ikv__param_whole("lrb", k, v, 0, 1, &p->inherit);
    return ikv_error(IKV_EPARAM,
                     "lrb: unknown parameter '%s' (sample, train, period, pool, bmul, bound, "
                     "ghost, inherit)",
                     k);
}

static void lrb_destroy(void *s) {
    lrb *p = s;
    if (!p) return;
    ikv__ghostq_free(&p->g);
    ikv_free(p->gd);
    ikv_free(p->side);
    ikv_free(p->set);
    ikv_free(p);
}

static int lrb_create(const ikv__policy_env *env, const char *params, void **out) {
    lrb *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->sample = 64;
    p->train = 1;
    p->period = 32768;
    p->pool = 8;
    p->bmul = 1;
    p->bound = 0;
    p->ghostw = 1;
    p->inherit = 1;
    int rc = ikv__params_each(params, set_param, p);
    p->cap = env->capacity ? env->capacity : 1;
    p->node_limit = env->node_limit ? env->node_limit : 1;
    if (!rc && !(p->set = ikv_calloc(p->cap, sizeof *p->set))) rc = IKV_ENOMEM;
    if (!rc && !(p->side = ikv_calloc(p->node_limit, sizeof *p->side))) rc = IKV_ENOMEM;
    uint64_t gcap = (uint64_t)(p->ghostw * (double)env->capacity);
    if (!rc && gcap > 0 &&
        (ikv__ghostq_init(&p->g, gcap) || !(p->gd = ikv_calloc(gcap, sizeof *p->gd))))
        rc = IKV_ENOMEM;
    if (rc) {
        lrb_destroy(p);
        return rc;
    }
    for (uint64_t i = 0; i < gcap; i++) p->gd[i].cell = IKV_NIL;
    for (uint64_t i = 0; i < p->node_limit; i++) p->side[i].cell = IKV_NIL;
    ikv__lrbm_init(&p->m, p->period, p->pool);
    p->nodes = env->nodes;
    p->now = env->now;
    p->pending = IKV_NIL;
    p->rng = 0x9e3779b97f4a7c15ull;
    *out = p;
    return 0;
}

/* now is past the deadline dl (both taken mod 2^32). */
static inline int past(uint64_t now, uint32_t dl) {
    return (int32_t)((uint32_t)now - dl) > 0;
}

/* Records an access after a gap: the codes shift, the count grows. */
static inline void push_gap(uint8_t *g, uint8_t *cnt, uint64_t gap) {
    g[2] = g[1], g[1] = g[0], g[0] = (uint8_t)ikv__lrb_code(gap);
    if (*cnt < 255) (*cnt)++;
}

/* A pending sample is decided: accessed now (by its deadline or not). */
static inline void resolve(lrb *p, uint32_t *cell, uint32_t dl) {
    if (*cell == IKV_NIL) return;
    ikv__lrbm_label(&p->m, *cell, !past(*p->now, dl));
    *cell = IKV_NIL;
}

/* A missed key found in the ghost was accessed again: its pending sample is labelled, and
 * what the ghost kept of it is handed to the admit that follows. */
static void lrb_miss(void *s, ikv_key k) {
    lrb *p = s;
    uint32_t slot;
    p->x = k;
    p->x_valid = 1;
    p->x_back = ikv__ghostq_take_slot(&p->g, k, &slot) >= 0;
    if (!p->x_back) return;
    p->ghost_hits++;
    p->xd = p->gd[slot];
    p->gd[slot].cell = IKV_NIL;
    resolve(p, &p->xd.cell, p->xd.dl);
}

/* A block entering the tier takes its history: its own from the ghost (plus this access), its
 * parent's when the parent was accessed in the same request (inherit=1), else none. */
static void lrb_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    lrb *p = s;
    ikv__node *n = &p->nodes[id];
    lrb_side *sd = &p->side[id];
    int back = p->x_valid && p->x_back && ikv_key_eq(p->x, n->key);
    p->x_valid = 0;
    memset(sd, 0, sizeof *sd);
    sd->cell = IKV_NIL;
    sd->valid = 1;
    uint64_t now = *p->now;
    if (back) {
        memcpy(sd->g, p->xd.g, sizeof sd->g);
        sd->cnt = p->xd.cnt;
        push_gap(sd->g, &sd->cnt, (uint32_t)((uint32_t)now - p->xd.last));
        sd->fl |= IKV__LRB_BACK;
    } else if (p->inherit > 0 && n->parent != IKV_NIL) {
        const ikv__node *pa = &p->nodes[n->parent];
        const lrb_side *ps = &p->side[n->parent];
        if (pa->tier == n->tier && ps->valid && pa->last == now) {
            memcpy(sd->g, ps->g, sizeof sd->g);
            sd->cnt = ps->cnt;
        } else {
            sd->cnt = 1;
        }
    } else {
        sd->cnt = 1;
    }
    if (n->depth == 0) sd->fl |= IKV__LRB_ROOT;
    if (n->parent != IKV_NIL) {
        const ikv__node *pa = &p->nodes[n->parent];
        /* pa->nchild counts n already: more than 1 means n was admitted beside a sibling */
        if (pa->tier == n->tier && pa->nchild[n->tier] > 1) sd->fl |= IKV__LRB_FORK;
    }
}

/* A hit decides the block's pending sample and adds the gap to its history (node->last is
 * still the previous access). */
static void lrb_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    lrb *p = s;
    ikv__node *n = &p->nodes[id];
    lrb_side *sd = &p->side[id];
    resolve(p, &sd->cell, sd->dl);
    uint64_t now = *p->now;
    push_gap(sd->g, &sd->cnt, now > n->last ? now - n->last : 0);
}

static void lrb_queue(void *s, uint32_t id) {
    lrb *p = s;
    p->nodes[id].hpos = (uint32_t)p->len;
    p->set[p->len++] = id;
}

static void lrb_dequeue(void *s, uint32_t id) {
    lrb *p = s;
    uint32_t i = p->nodes[id].hpos, last = p->set[--p->len];
    p->set[i] = last;
    p->nodes[last].hpos = i;
}

/* The boundary after one more eviction of a block of this age. */
static void boundary_step(lrb *p, uint64_t age) {
    uint64_t now = *p->now;
    p->evictions++;
    if (p->bound > 0) {
        p->B = p->evictions == 1 ? (double)age : p->B + ((double)age - p->B) / 256.0;
    } else {
        uint64_t w = p->cap / 64 > 64 ? p->cap / 64 : 64;
        if (++p->win_ev >= w) {
            double b = (double)p->cap * (double)(now - p->win_t0) / (double)p->win_ev;
            p->B = p->B > 0 ? 0.75 * p->B + 0.25 * b : b;
            p->win_ev = 0;
            p->win_t0 = now;
        }
    }
    double bm = p->B * p->bmul;
    p->cb = ikv__lrb_code(bm < 1.8e19 ? (uint64_t)bm : UINT64_MAX);
}

/* An evicted block goes to the ghost with its history and its pending sample (labelled
 * negative at once if its deadline has passed); a block leaving otherwise (promotion) drops
 * its sample unlabelled. The ghost slot's previous entry, if the ghost forgot it, is labelled
 * negative: it did not come back while remembered. */
static void lrb_leave(void *s, uint32_t id) {
    lrb *p = s;
    ikv__node *n = &p->nodes[id];
    lrb_side *sd = &p->side[id];
    if (id == p->pending) {
        uint64_t now = *p->now;
        boundary_step(p, now > n->last ? now - n->last : 0);
        if (sd->cell != IKV_NIL && past(now, sd->dl)) resolve(p, &sd->cell, sd->dl);
        uint32_t slot = ikv__ghostq_add(&p->g, n->key, 0);
        if (slot != IKV_NIL) {
            lrb_gdata *d = &p->gd[slot];
            if (d->cell != IKV_NIL) ikv__lrbm_label(&p->m, d->cell, 0);
            *d = (lrb_gdata){sd->cell, sd->dl, (uint32_t)n->last, {sd->g[0], sd->g[1], sd->g[2]},
                             sd->cnt};
        } else if (sd->cell != IKV_NIL) {
            ikv__lrbm_label(&p->m, sd->cell, 0); /* no ghost: it cannot be seen coming back */
        }
    }
    sd->cell = IKV_NIL;
    sd->valid = 0;
    p->pending = IKV_NIL;
}

/* A uniform index below n from the policy's xorshift64* stream. */
static uint64_t next_index(lrb *p, uint64_t n) {
    p->rng ^= p->rng >> 12, p->rng ^= p->rng << 25, p->rng ^= p->rng >> 27;
    return ((p->rng * 2685821657736338717ull) >> 11) % n;
}

static inline uint32_t cell_of(const lrb *p, const ikv__node *n, const lrb_side *sd) {
    uint64_t now = *p->now;
    return ikv__lrb_cell(ikv__lrb_code(now > n->last ? now - n->last : 0), sd->g[0], sd->g[1],
                         sd->cnt, sd->fl, p->cb);
}

/* The least likely to come back within the boundary among `sample` evictable blocks (all of
 * them when no more are queued); ties go to the older block, then the lower id. `train` of the
 * sampled blocks without a pending sample become samples (their cell now, deadline now + B).
 * The sampled slots and their nodes are prefetched in batches of up to 64. O(sample), does not
 * allocate. */
static uint32_t lrb_victim(void *s) {
    lrb *p = s;
    uint64_t n = p->len, k = (uint64_t)p->sample;
    uint32_t best = IKV_NIL;
    float bp = 0;
    if (n <= k) k = n;
    uint64_t now = *p->now;
    uint32_t dl = (uint32_t)(now + (uint64_t)(p->B * p->bmul));
    uint64_t want = (uint64_t)p->train;
    for (uint64_t i0 = 0; i0 < k; i0 += 64) {
        uint32_t idx[64];
        uint64_t m = k - i0 < 64 ? k - i0 : 64;
        for (uint64_t j = 0; j < m; j++) {
            idx[j] = (uint32_t)(n == k ? i0 + j : next_index(p, n));
            __builtin_prefetch(&p->set[idx[j]]);
        }
        for (uint64_t j = 0; j < m; j++) {
            uint32_t id = p->set[idx[j]];
            __builtin_prefetch(&p->nodes[id].last);
            __builtin_prefetch(&p->side[id]);
        }
        for (uint64_t j = 0; j < m; j++) {
            uint32_t id = p->set[idx[j]];
            ikv__node *nd = &p->nodes[id];
            lrb_side *sd = &p->side[id];
            uint32_t cell = cell_of(p, nd, sd);
            if (want && sd->cell == IKV_NIL) {
                sd->cell = cell, sd->dl = dl;
                want--, p->samples++;
            }
            float pr = ikv__lrbm_predict(&p->m, cell);
            if (best == IKV_NIL || pr < bp ||
                (pr == bp && (nd->last < p->nodes[best].last ||
                              (nd->last == p->nodes[best].last && id < best))))
                best = id, bp = pr;
        }
    }
    return p->pending = best;
}

/* Every queued block is in the set at its hpos, queued and known to lrb; every pending cell
 * (per node and per ghost slot) is a valid cell; the model and the ghost are consistent. */
static int lrb_check(const void *s) {
    const lrb *p = s;
    if (p->len > p->cap) return 0;
    for (uint64_t i = 0; i < p->len; i++) {
        const ikv__node *n = &p->nodes[p->set[i]];
        if (n->hpos != i || !(n->flags & IKV__QUEUED) || !p->side[p->set[i]].valid) return 0;
    }
    for (uint64_t i = 0; i < p->node_limit; i++) {
        const lrb_side *sd = &p->side[i];
        if (sd->cell != IKV_NIL && (sd->cell >= IKV__LRB_NCELL || !sd->valid)) return 0;
        if (sd->valid && p->nodes[i].tier == IKV__FREE) return 0;
    }
    for (uint64_t i = 0; i < p->g.cap; i++)
        if (p->gd[i].cell != IKV_NIL && p->gd[i].cell >= IKV__LRB_NCELL) return 0;
    return ikv__lrbm_check(&p->m) && ikv__ghostq_check(&p->g) && ikv__ghostq_len(&p->g, 1) == 0 &&
           p->B >= 0;
}

static uint64_t lrb_queued(const void *s) {
    return ((const lrb *)s)->len;
}

static size_t lrb_bytes(const void *s) {
    const lrb *p = s;
    return (size_t)p->cap * sizeof *p->set + (size_t)p->node_limit * sizeof *p->side +
           ikv__ghostq_bytes(&p->g) + (size_t)p->g.cap * sizeof *p->gd;
}

const ikv_policy_ops ikv_policy_lrb = {
    .name = "lrb",
    .doc = "learned relaxed Belady (LRB, NSDI'20): evict the least likely of `sample` evictable "
           "blocks to be accessed within the boundary (the cache's characteristic time), "
           "learned online from each block's gaps, age, count and flags, with labels from "
           "sampled blocks and the ghost (params sample, train, period, pool, bmul, bound, "
           "ghost, inherit)",
    .create = lrb_create,
    .destroy = lrb_destroy,
    .miss = lrb_miss,
    .admit = lrb_admit,
    .hit = lrb_hit,
    .queue = lrb_queue,
    .dequeue = lrb_dequeue,
    .leave = lrb_leave,
    .victim = lrb_victim,
    .check = lrb_check,
    .queued = lrb_queued,
    .bytes = lrb_bytes,
};
