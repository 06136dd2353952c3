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
 * Class split (split=1, the default). Plain LRB (split=0) lost to LRU on WEKA (docs): when
 * many similar conversations compete, which ones the cache keeps must be a stable choice, and
 * a per-block estimate of "back within B" flips between near-equal chains. So by default the
 * blocks are split as ARC splits them (FAST'03 Fig. 4, exactly as arc.c: T1 not hit since
 * admission, T2 hit or back from the ghosts B1/B2, the target p adapted on ghost hits before
 * REPLACE, the tie and directory rules) and the model only orders the victims within a class:
 * order=1 (default) T1 by the model and T2 by the oldest of the sample; order bit 0 / bit 1 turn
 * the model on for T1 / T2 (order=0: a sampled ARC, no model; order=3 both). With cbound=1 (the
 * default with the split) each class has its own boundary and the class is a feature: a T1
 * block is asked whether it comes back before T1 would drop it.
 *
 * Features (lrbmodel.h): the block's age and its last gap, both against B, the gap before it,
 * its access count, and root / fork / back-from-ghost / hit / class flags. In a prefix cache
 * every turn of a conversation re-reads its whole chain, so a block's gaps are its
 * conversation's turn gaps; a block inserted under a parent accessed in the same request (a
 * conversation's new tail) starts with its parent's history (inherit=1), and a block back from
 * the ghost with its own.
 *
 * Labels, online as LRB makes them: at every eviction `train` of the sampled blocks without a
 * pending sample are sampled: their cell (features now) and a deadline now + B are kept with
 * them. The sample is labelled positive if the block is accessed by its deadline — hit while
 * resident, or missed while its key is in the ghost — and negative if it is accessed after it,
 * evicted after it, or forgotten by the ghost first.
 *
 * The boundary B (bound=0, default) is a characteristic time by Little's law: the blocks of the
 * class (cbound=1) or of the tier over their eviction rate, measured over the last ~16 windows
 * of c/16 evictions; bound=1 uses a running mean (weight 2^-8) of the victims' ages instead.
 * bmul scales it. 0 until the first window closes (every age is then >= B: the model starts from
 * the gaps, count and flags alone).
 *
 *     node id ->  side[id]  { pending cell, deadline, gap codes g1 g2 g3, count, flags, class }
 *     ghost slot -> gd[s]   { pending cell, deadline, last access, gap codes, count }
 *     set[l]      the evictable blocks of class l (position in the node's hpos, swap-remove)
 *
 * Duel (duel=BITS, off by default; issue 15): in the classes of duel's bits (1: T1, 2: T2) both
 * orders pick from the same sample, the class's own (order's bit) and the other (the model
 * where the class goes by the oldest, and back). They share all bookkeeping (ARC's split, p,
 * the sample, the labels): only the victim differs. Where they disagree the two candidates
 * race: the kept one is tagged on its node, the victim on its ghost slot, and the first of
 * them accessed again was the worse victim (its order lost the race); a race open after c
 * more disagreements is dropped (neither came back: no evidence). Since the race is decided
 * whichever order was followed, neither needs exploring (unlike LeCaR / CACHEUS, whose
 * experts only learn from their own victims). The other order's candidate goes only while
 * the own order has lost clearly more of the class's recent races: lost(own) - lost(other) >
 * dz x sqrt(races), counts decayed by 1 - 1/dwin a race. duel=2 is the measured choice
 * (docs/policies.md): in T1 the two orders' races came out even (49-51% lost each) on the
 * four cells inspected, so the T1 duel only adds noise; in T2 they did not (the model won on
 * scenario B personal-first 100,000, the oldest on WEKA 2M / 64 and Mooncake synthetic).
 *
 *     race r (ring of c)    { seq, class }          node id -> dn[id], ghost slot -> dg[s]:
 *                                                     seq << 1 | (0 own order's, 1 other's)
 *
 * Leaf-only eviction: only evictable blocks (the core's queue) are sampled; an exposed parent
 * is sampled with its own age and history; if the class REPLACE chooses has no evictable block
 * the other class's pick goes instead (as arc.c). Memory: 16 bytes per node of the pool (side),
 * 4 per block per class set (8 with the split), 24 + 16 per ghost key (c keys with the split,
 * ghost x c without); a fixed ~1.1 MiB model per tier; with duel 8 per race (c races), 4 per
 * node and 4 per ghost slot more. Cost: admit, hit, queue, dequeue, leave,
 * miss O(1) (expected, for the ghost); victim O(sample); a label O(1), halving O(cells) every
 * `period` labels. Nothing allocated after create. The node's own pol area is not used (the
 * side arrays would let another policy carry the model).
 *
 * Parameters: sample (16), train (1), period (32768), pool (8), bmul (1), bound (0), ghost (1,
 * without the split), inherit (1), hitw (0: a bonus added to P of blocks hit since admission),
 * split (1), order (1), cbound (1 with the split), pq (0: P rounded down to steps of pq, so more
 * victims fall to the oldest; measured worse), hint (0; 1: a sampled block whose latest access
 * came with IKV_HINT_TURN, its turn ended, is taken first: P = -1), duel (0; bits 1: T1, 2: T2,
 * needs the split), dwin (16384), dz (0).
 */
#include "../internal.h"
#include "ghostq.h"
#include "lrbmodel.h"

#include <math.h>
#include <string.h>

/* What lrb keeps per node id (16 bytes). */
typedef struct lrb_side {
    uint32_t cell; /* pending sample's cell, IKV_NIL when none */
    uint32_t dl;   /* its deadline (low 32 bits of the logical time) */
    uint8_t g[3];  /* half-octave codes of the last three gaps, newest first (0 = none) */
    uint8_t cnt;   /* accesses (own, or inherited with the parent's history), saturating */
    uint8_t fl;    /* IKV__LRB_ROOT | FORK | BACK | HIT */
    uint8_t valid; /* 1 while the block is in this tier */
    uint8_t cls;   /* split=1: ARC's class, 0 = T1, 1 = T2 (0 without the split) */
    uint8_t hint;  /* ikv_hint of its latest access (hint=1 uses it) */
} lrb_side;

/* duel: a race between the two candidates of one disagreement in class cls (8 bytes): the
 * first of them accessed again was the worse victim. seq 0: resolved or never used. */
typedef struct lrb_race {
    uint32_t seq;
    uint8_t cls;
    uint8_t pad[3];
} lrb_race;

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
    double sample, train, period, pool, bmul, bound, ghostw, inherit, hitw, split, order, cbound,
        pq, hint, duel, dwin, dz;
    uint32_t *set[2]; /* the evictable blocks of each class; a block's position is its hpos */
    uint64_t len[2];
    uint64_t res[2];   /* split=1: resident blocks of T1 and T2 */
    double p_arc;      /* split=1: ARC's target size of T1 */
    int pending_ghost; /* whether the pending victim is remembered when it leaves */
    lrb_side *side;    /* node_limit */
    uint32_t pending;  /* the last victim returned, until it leaves */
    uint64_t rng;      /* xorshift64*, fixed seed: runs are deterministic */
    ikv__ghostq g;
    lrb_gdata *gd;
    ikv_key x;                   /* the announced miss, and what the ghost had of it */
    int x_valid, x_back, x_from; /* x_from: -1 new, else the ghost list it was found in */
    lrb_gdata xd;
    /* the boundary, per class with cbound=1 (else only [0]) */
    double B[2];                           /* in logical time */
    uint32_t cb[2];                        /* ikv__lrb_code(B x bmul) */
    uint64_t snap_t[2][16], snap_e[2][16]; /* bound=0: (time, evictions) every c/16 evictions */
    uint32_t snap_n[2];
    uint64_t t0[2], cev[2]; /* the time of the first eviction, the evictions */
    uint64_t evictions, ghost_hits, samples;
    /* duel: the races (one per disagreement, a ring of dring), the race tag of each node and
     * ghost slot (race seq << 1 | candidate: 0 the class's own order's, 1 the other order's;
     * 0: none), per class the decayed counts of resolved races and of those each order's
     * candidate lost (was accessed first) */
    lrb_race *dr;
    uint32_t *dn, *dg;
    uint64_t dring;
    uint32_t dseq;     /* the last race's seq (30 bits, never 0) */
    uint32_t pend_tag; /* the race tag the pending victim takes into the ghost */
    double dtri[2], dloss[2][2];
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
    if (!strcmp(k, "hitw")) return ikv__param_double("lrb", k, v, 0, 10, &p->hitw);
    if (!strcmp(k, "split")) return ikv__param_whole("lrb", k, v, 0, 1, &p->split);
    if (!strcmp(k, "order")) return ikv__param_whole("lrb", k, v, 0, 3, &p->order);
    if (!strcmp(k, "cbound")) return ikv__param_whole("lrb", k, v, 0, 1, &p->cbound);
    if (!strcmp(k, "pq")) return ikv__param_double("lrb", k, v, 0, 1, &p->pq);
    if (!strcmp(k, "hint")) return ikv__param_whole("lrb", k, v, 0, 1, &p->hint);
    if (!strcmp(k, "duel")) return ikv__param_whole("lrb", k, v, 0, 3, &p->duel);
    if (!strcmp(k, "dz")) return ikv__param_double("lrb", k, v, 0, 100, &p->dz);
    if (!strcmp(k, "dwin")) return ikv__param_whole("lrb", k, v, 16, 1e9, &p->dwin);
    return ikv_error(IKV_EPARAM,
                     "lrb: unknown parameter '%s' (sample, train, period, pool, bmul, bound, "
                     "ghost, inherit, hitw, split, order, cbound, pq, hint, duel, dwin, dz)",
                     k);
}

static void lrb_destroy(void *s) {
    lrb *p = s;
    if (!p) return;
    ikv__ghostq_free(&p->g);
    ikv_free(p->gd);
    ikv_free(p->dr);
    ikv_free(p->dn);
    ikv_free(p->dg);
    ikv_free(p->side);
    ikv_free(p->set[0]);
    ikv_free(p->set[1]);
    ikv_free(p);
}

static int lrb_create(const ikv__policy_env *env, const char *params, void **out) {
    lrb *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->sample = 16;
    p->train = 1;
    p->period = 32768;
    p->pool = 8;
    p->bmul = 1;
    p->bound = 0;
    p->ghostw = 1;
    p->inherit = 1;
    p->split = 1;
    p->order = 1;
    p->cbound = -1; /* unset: on with the split */
    p->dwin = 16384;
    int rc = ikv__params_each(params, set_param, p);
    p->cap = env->capacity ? env->capacity : 1;
    p->node_limit = env->node_limit ? env->node_limit : 1;
    for (int l = 0; l < 1 + (p->split > 0); l++)
        if (!rc && !(p->set[l] = ikv_calloc(p->cap, sizeof *p->set[l]))) rc = IKV_ENOMEM;
    if (!rc && !(p->side = ikv_calloc(p->node_limit, sizeof *p->side))) rc = IKV_ENOMEM;
    /* the split's B1 + B2 hold at most c keys (ARC's directory rules) */
    uint64_t gcap = p->split > 0 ? env->capacity : (uint64_t)(p->ghostw * (double)env->capacity);
    if (!rc && gcap > 0 &&
        (ikv__ghostq_init(&p->g, gcap) || !(p->gd = ikv_calloc(gcap, sizeof *p->gd))))
        rc = IKV_ENOMEM;
    if (!rc && p->cbound > 0 && !(p->split > 0))
        rc = ikv_error(IKV_EPARAM, "lrb: cbound=1 needs the class split (split=1)");
    if (!rc && p->duel > 0 && !(p->split > 0))
        rc = ikv_error(IKV_EPARAM, "lrb: duel=%g needs the class split (split=1)", p->duel);
    p->dring = p->cap > 16 ? p->cap : 16;
    if (!rc && p->duel > 0 &&
        (!(p->dr = ikv_calloc(p->dring, sizeof *p->dr)) ||
         !(p->dn = ikv_calloc(p->node_limit, sizeof *p->dn)) ||
         !(p->dg = ikv_calloc(gcap ? gcap : 1, sizeof *p->dg))))
        rc = IKV_ENOMEM;
    if (p->cbound < 0) p->cbound = p->split;
    if (rc) {
        lrb_destroy(p);
        return rc;
    }
    for (uint64_t i = 0; i < gcap; i++)
        p->gd[i].cell = IKV_NIL;
    for (uint64_t i = 0; i < p->node_limit; i++)
        p->side[i].cell = IKV_NIL;
    ikv__lrbm_init(&p->m, p->period, p->pool);
    p->nodes = env->nodes;
    p->now = env->now;
    p->pending = IKV_NIL;
    p->x_from = -1;
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

/* duel: a block with race tag *tag is accessed again. If its race is still open it was the
 * first of the two candidates back, the worse victim: the race's class has one more resolved
 * race, the order that proposed this candidate one more lost one (both counts decay by
 * 1 - 1/dwin per race). The tag is cleared. O(1). */
static void race_end(lrb *p, uint32_t *tag) {
    uint32_t t = *tag;
    *tag = 0;
    if (!t) return;
    lrb_race *r = &p->dr[(t >> 1) % p->dring];
    if (r->seq != t >> 1) return; /* resolved, or overwritten */
    r->seq = 0;
    unsigned l = r->cls;
    double keep = 1.0 - 1.0 / p->dwin;
    p->dtri[l] = p->dtri[l] * keep + 1;
    p->dloss[l][0] *= keep, p->dloss[l][1] *= keep;
    p->dloss[l][t & 1] += 1;
}

/* A missed key found in the ghost was accessed again: its pending sample is labelled, and
 * what the ghost kept of it is handed to the admit that follows. */
static void lrb_miss(void *s, ikv_key k) {
    lrb *p = s;
    uint32_t slot;
    p->x = k;
    p->x_valid = 1;
    p->x_from = p->split > 0
                    ? ikv__ghostq_arc_adapt_slot(&p->g, k, (double)p->cap, &p->p_arc, &slot)
                    : ikv__ghostq_take_slot(&p->g, k, &slot);
    p->x_back = p->x_from >= 0;
    if (!p->x_back) return;
    p->ghost_hits++;
    if (p->dg) race_end(p, &p->dg[slot]);
    p->xd = p->gd[slot];
    p->gd[slot].cell = IKV_NIL;
    resolve(p, &p->xd.cell, p->xd.dl);
}

static void lrb_queue(void *s, uint32_t id) {
    lrb *p = s;
    uint32_t l = p->side[id].cls;
    p->nodes[id].hpos = (uint32_t)p->len[l];
    p->set[l][p->len[l]++] = id;
}

static void lrb_dequeue(void *s, uint32_t id) {
    lrb *p = s;
    uint32_t l = p->side[id].cls;
    uint32_t i = p->nodes[id].hpos, last = p->set[l][--p->len[l]];
    p->set[l][i] = last;
    p->nodes[last].hpos = i;
}

/* A block entering the tier takes its history: its own from the ghost (plus this access), its
 * parent's when the parent was accessed in the same request (inherit=1), else none. */
static void lrb_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)pos;
    lrb *p = s;
    ikv__node *n = &p->nodes[id];
    lrb_side *sd = &p->side[id];
    int announced = p->x_valid && ikv_key_eq(p->x, n->key);
    if (!announced) lrb_miss(p, n->key); /* no core path admits unannounced today */
    int back = p->x_back;
    p->x_valid = 0;
    p->x_from = -1;
    memset(sd, 0, sizeof *sd);
    sd->cell = IKV_NIL;
    sd->valid = 1;
    if (p->dn) p->dn[id] = 0;
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
            sd->fl |= ps->fl & IKV__LRB_HIT;
        } else {
            sd->cnt = 1;
        }
    } else {
        sd->cnt = 1;
    }
    if (n->depth == 0) sd->fl |= IKV__LRB_ROOT;
    sd->hint = a ? (uint8_t)a->hint : 0;
    if (p->split > 0) sd->cls = back ? 1 : 0, p->res[sd->cls]++;
    if (n->parent != IKV_NIL) {
        const ikv__node *pa = &p->nodes[n->parent];
        /* pa->nchild counts n already: more than 1 means n was admitted beside a sibling */
        if (pa->tier == n->tier && pa->nchild[n->tier] > 1) sd->fl |= IKV__LRB_FORK;
    }
}

/* A hit decides the block's pending sample and adds the gap to its history (node->last is
 * still the previous access). */
static void lrb_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)pos;
    lrb *p = s;
    ikv__node *n = &p->nodes[id];
    lrb_side *sd = &p->side[id];
    resolve(p, &sd->cell, sd->dl);
    if (p->dn) race_end(p, &p->dn[id]);
    if (p->split > 0 && sd->cls == 0) { /* ARC: a hit moves the block to T2 */
        int queued = (n->flags & IKV__QUEUED) != 0;
        if (queued) lrb_dequeue(p, id);
        sd->cls = 1;
        p->res[0]--, p->res[1]++;
        if (queued) lrb_queue(p, id);
    }
    uint64_t now = *p->now;
    push_gap(sd->g, &sd->cnt, now > n->last ? now - n->last : 0);
    sd->fl |= IKV__LRB_HIT;
    sd->hint = a ? (uint8_t)a->hint : 0;
}

/* The boundary after one more eviction of a block of this age. bound=0: capacity x the time
 * the last ~c evictions took / their number (Little's law over one turnover of the cache; a
 * snapshot of (time, evictions) is kept every c/16 evictions in a ring of 16). bound=1: a
 * running mean of the victims' ages. */
static void boundary_step(lrb *p, int l, uint64_t age) {
    uint64_t now = *p->now;
    p->evictions++;
    if (!(p->cbound > 0)) l = 0;
    uint64_t ev = ++p->cev[l];
    if (ev == 1) p->t0[l] = now;
    if (p->bound > 0) {
        p->B[l] = ev == 1 ? (double)age : p->B[l] + ((double)age - p->B[l]) / 256.0;
    } else {
        uint64_t w = p->cap / 16 > 1 ? p->cap / 16 : 1;
        if (ev % w == 0) {
            uint32_t k = p->snap_n[l]++;
            p->snap_t[l][k % 16] = now;
            p->snap_e[l][k % 16] = ev;
            uint32_t o = (k + 1) % 16; /* the oldest snapshot, once the ring is full */
            uint64_t dt = now - p->snap_t[l][o], de = ev - p->snap_e[l][o];
            if (k < 16) dt = now - p->t0[l], de = ev;
            /* Little's law: the blocks of the class (of the tier) over their eviction rate */
            double size = p->cbound > 0 ? (double)p->res[l] + 1 : (double)p->cap;
            if (de) p->B[l] = size * (double)dt / (double)de;
        }
    }
    double bm = p->B[l] * p->bmul;
    p->cb[l] = ikv__lrb_code(bm < 1.8e19 ? (uint64_t)bm : UINT64_MAX);
}

/* An evicted block goes to the ghost with its history and its pending sample (labelled
 * negative at once if its deadline has passed); a block leaving otherwise (promotion) drops
 * its sample unlabelled. The ghost slot's previous entry, if the ghost forgot it, is labelled
 * negative: it did not come back while remembered. */
static void lrb_leave(void *s, uint32_t id) {
    lrb *p = s;
    ikv__node *n = &p->nodes[id];
    lrb_side *sd = &p->side[id];
    if (p->split > 0) p->res[sd->cls]--;
    if (id == p->pending) {
        uint64_t now = *p->now;
        boundary_step(p, sd->cls, now > n->last ? now - n->last : 0);
        if (sd->cell != IKV_NIL && past(now, sd->dl)) resolve(p, &sd->cell, sd->dl);
        uint32_t slot = p->pending_ghost ? ikv__ghostq_add(&p->g, n->key, sd->cls) : IKV_NIL;
        if (slot != IKV_NIL) {
            lrb_gdata *d = &p->gd[slot];
            if (d->cell != IKV_NIL) ikv__lrbm_label(&p->m, d->cell, 0);
            if (p->dg) p->dg[slot] = p->pend_tag ? p->pend_tag : p->dn[id];
            *d = (lrb_gdata){
                sd->cell, sd->dl, (uint32_t)n->last, {sd->g[0], sd->g[1], sd->g[2]}, sd->cnt};
        } else if (sd->cell != IKV_NIL) {
            ikv__lrbm_label(&p->m, sd->cell, 0); /* not remembered: cannot be seen coming back */
        }
    }
    sd->cell = IKV_NIL;
    sd->valid = 0;
    p->pending = IKV_NIL;
    if (p->dn) p->dn[id] = 0, p->pend_tag = 0;
}

/* A uniform index below n from the policy's xorshift64* stream. */
static uint64_t next_index(lrb *p, uint64_t n) {
    p->rng ^= p->rng >> 12, p->rng ^= p->rng << 25, p->rng ^= p->rng >> 27;
    return ((p->rng * 2685821657736338717ull) >> 11) % n;
}

/* The block's cell now, against its class's boundary (cbound=1, with the class as a flag) or
 * the tier's. */
static inline uint32_t cell_of(const lrb *p, const ikv__node *n, const lrb_side *sd) {
    uint64_t now = *p->now;
    int l = p->cbound > 0 ? sd->cls : 0;
    return ikv__lrb_cell(ikv__lrb_code(now > n->last ? now - n->last : 0), sd->g[0], sd->g[1],
                         sd->cnt, sd->fl | (l ? IKV__LRB_T2 : 0u), p->cb[l]);
}

/* Whether block a goes before block b by the sample's oldest (hint=1: a block whose turn
 * ended first): the older last access, then the lower id. */
static inline int older(const lrb *p, uint32_t a, uint32_t b) {
    if (b == IKV_NIL) return 1;
    if (p->hint > 0) {
        int ha = p->side[a].hint == IKV_HINT_TURN, hb = p->side[b].hint == IKV_HINT_TURN;
        if (ha != hb) return ha;
    }
    const ikv__node *na = &p->nodes[a], *nb = &p->nodes[b];
    return na->last < nb->last || (na->last == nb->last && a < b);
}

/* The least likely to come back within the boundary among `sample` evictable blocks of class
 * l (all of them when no more are queued), or with learned = 0 the oldest of them; ties go to
 * the older block, then the lower id. With train, `train` of the sampled blocks without a
 * pending sample become samples (their cell now, deadline now + B). With oldest, the oldest
 * of the same sample (older()) is stored there too (duel). The sampled slots and their nodes
 * are prefetched in batches of up to 64. O(sample), does not allocate. */
static uint32_t pick(lrb *p, int l, int learned, int train, uint32_t *oldest) {
    uint64_t n = p->len[l], k = (uint64_t)p->sample;
    const uint32_t *set = p->set[l];
    uint32_t best = IKV_NIL;
    float bp = 0;
    if (n <= k) k = n;
    uint64_t now = *p->now;
    uint32_t dl = (uint32_t)(now + (uint64_t)(p->B[p->cbound > 0 ? l : 0] * p->bmul));
    uint64_t want = train ? (uint64_t)p->train : 0;
    uint32_t bo = IKV_NIL;
    for (uint64_t i0 = 0; i0 < k; i0 += 64) {
        uint32_t idx[64];
        uint64_t m = k - i0 < 64 ? k - i0 : 64;
        for (uint64_t j = 0; j < m; j++) {
            idx[j] = (uint32_t)(n == k ? i0 + j : next_index(p, n));
            __builtin_prefetch(&set[idx[j]]);
        }
        for (uint64_t j = 0; j < m; j++) {
            uint32_t id = set[idx[j]];
            __builtin_prefetch(&p->nodes[id].last);
            __builtin_prefetch(&p->side[id]);
        }
        for (uint64_t j = 0; j < m; j++) {
            uint32_t id = set[idx[j]];
            ikv__node *nd = &p->nodes[id];
            lrb_side *sd = &p->side[id];
            uint32_t cell = cell_of(p, nd, sd);
            if (want && sd->cell == IKV_NIL) {
                sd->cell = cell, sd->dl = dl;
                want--, p->samples++;
            }
            float pr = 0;
            if (learned) {
                pr = ikv__lrbm_predict(&p->m, cell);
                if (p->pq > 0) pr = floorf(pr / (float)p->pq); /* coarser: more ties, by age */
                if (sd->fl & IKV__LRB_HIT) pr += (float)p->hitw;
            }
            if (p->hint > 0 && sd->hint == IKV_HINT_TURN) pr = -1; /* its turn ended */
            if (best == IKV_NIL || pr < bp ||
                (pr == bp && (nd->last < p->nodes[best].last ||
                              (nd->last == p->nodes[best].last && id < best))))
                best = id, bp = pr;
            if (oldest && older(p, id, bo)) bo = id;
        }
    }
    if (oldest) *oldest = bo;
    return best;
}

/* Forgets the oldest key of ghost list l, labelling its pending sample negative. */
static void ghost_drop(lrb *p, int l) {
    uint32_t slot = p->g.tail[l];
    if (slot == IKV_NIL) return;
    if (p->gd[slot].cell != IKV_NIL) ikv__lrbm_label(&p->m, p->gd[slot].cell, 0);
    p->gd[slot].cell = IKV_NIL;
    ikv__ghostq_drop_oldest(&p->g, l);
}

/* The victim of class l by the class's order (order bit l: the model, else the sample's
 * oldest). With duel bit l both orders pick from the same sample; where they disagree, the
 * other order's candidate goes only while its candidates have lost clearly fewer races in
 * this class: lost(own) - lost(other) > dz x sqrt(races) (a binomial's z-score; the races
 * decay by 1 - 1/dwin each). With fb (the victim goes to the ghost, where its return is
 * seen) the disagreement becomes a race: the kept candidate is tagged on its node, the victim
 * on its ghost slot when it leaves, and the first of them accessed again ends it
 * (race_end). The race is decided whichever order was followed: neither needs exploring. A
 * race still open after dring more is overwritten (neither candidate came back: no evidence
 * either way). O(sample). */
static uint32_t choose(lrb *p, int l, int fb) {
    int learned = ((int)p->order >> l) & 1;
    p->pend_tag = 0;
    if (!(((int)p->duel >> l) & 1)) return pick(p, l, learned, 1, NULL);
    uint32_t c[2];
    c[!learned] = pick(p, l, 1, 1, &c[learned]); /* c[0] the class's own order's */
    if (c[0] == c[1]) return c[0];
    double d = p->dloss[l][0] - p->dloss[l][1];
    int alt = d > 0 && d > p->dz * sqrt(p->dtri[l]);
    if (!fb) return c[alt];
    if (++p->dseq >= 1u << 30) p->dseq = 1;
    lrb_race *r = &p->dr[p->dseq % p->dring];
    r->seq = p->dseq;
    r->cls = (uint8_t)l;
    p->pend_tag = p->dseq << 1 | (uint32_t)alt;
    p->dn[c[!alt]] = p->dseq << 1 | (uint32_t)!alt;
    return c[alt];
}

/* split=1: ARC's REPLACE (arc.c) chooses the class, the model the block within it. */
static uint32_t replace(lrb *p) {
    uint64_t t1 = p->res[0];
    int x_in_b2 = p->x_valid && p->x_from == 1;
    int l = (t1 >= 1 && ((double)t1 > p->p_arc || (x_in_b2 && (double)t1 == p->p_arc))) ||
                    p->res[1] == 0
                ? 0
                : 1;
    if (!p->len[l]) l = !l;
    p->pending_ghost = 1;
    return choose(p, l, 1);
}

/* The victim: without the split the model's pick among all evictable blocks; with it ARC's
 * case analysis (FAST'03 Fig. 4, as arc.c) and the model's pick within the class. */
static uint32_t lrb_victim(void *s) {
    lrb *p = s;
    if (p->split <= 0) {
        p->pending_ghost = 1;
        return p->pending = pick(p, 0, 1, 1, NULL);
    }
    if (p->x_valid && p->x_from >= 0) return p->pending = replace(p); /* cases II, III */
    uint64_t t1 = p->res[0], b1 = ikv__ghostq_len(&p->g, 0);
    uint64_t total = t1 + p->res[1] + b1 + ikv__ghostq_len(&p->g, 1);
    if (t1 + b1 >= p->cap) {
        if (b1 > 0) {
            ghost_drop(p, 0);
            return p->pending = replace(p);
        }
        if (p->len[0]) {
            p->pending_ghost = 0; /* T1's victim leaves the directory */
            return p->pending = choose(p, 0, 0);
        }
        return p->pending = replace(p);
    }
    if (total >= 2 * p->cap) ghost_drop(p, 1);
    return p->pending = replace(p);
}

/* Every queued block is in the set at its hpos, queued and known to lrb; every pending cell
 * (per node and per ghost slot) is a valid cell; the model and the ghost are consistent. */
static int lrb_check(const void *s) {
    const lrb *p = s;
    if (p->len[0] + p->len[1] > p->cap) return 0;
    for (int l = 0; l < 2; l++)
        for (uint64_t i = 0; i < p->len[l]; i++) {
            uint32_t id = p->set[l][i];
            const ikv__node *n = &p->nodes[id];
            if (n->hpos != i || !(n->flags & IKV__QUEUED) || !p->side[id].valid ||
                p->side[id].cls != l)
                return 0;
        }
    uint64_t res[2] = {0, 0};
    for (uint64_t i = 0; i < p->node_limit; i++) {
        const lrb_side *sd = &p->side[i];
        if (sd->cell != IKV_NIL && (sd->cell >= IKV__LRB_NCELL || !sd->valid)) return 0;
        if (sd->valid && p->nodes[i].tier == IKV__FREE) return 0;
        if (sd->valid) res[sd->cls]++;
        if (sd->cls > (p->split > 0)) return 0;
    }
    if (p->split > 0 &&
        (res[0] != p->res[0] || res[1] != p->res[1] || p->p_arc < 0 || p->p_arc > (double)p->cap))
        return 0;
    for (uint64_t i = 0; i < p->g.cap; i++)
        if (p->gd[i].cell != IKV_NIL && p->gd[i].cell >= IKV__LRB_NCELL) return 0;
    for (int l = 0; l < 2; l++)
        if (!(p->dloss[l][0] >= 0) || !(p->dloss[l][1] >= 0) ||
            !(p->dtri[l] >= p->dloss[l][0] + p->dloss[l][1] - 1e-6 * p->dtri[l]))
            return 0;
    if (p->dn)
        for (uint64_t i = 0; i < p->node_limit; i++)
            if (p->dn[i] && !p->side[i].valid) return 0;
    return ikv__lrbm_check_coarse(&p->m) && ikv__ghostq_check(&p->g) &&
           (p->split > 0 || ikv__ghostq_len(&p->g, 1) == 0) && p->B[0] >= 0 && p->B[1] >= 0;
}

static uint64_t lrb_queued(const void *s) {
    return ((const lrb *)s)->len[0] + ((const lrb *)s)->len[1];
}

static size_t lrb_bytes(const void *s) {
    const lrb *p = s;
    return (size_t)p->cap * sizeof *p->set[0] * (p->split > 0 ? 2 : 1) +
           (size_t)p->node_limit * sizeof *p->side + ikv__ghostq_bytes(&p->g) +
           (size_t)p->g.cap * sizeof *p->gd + (p->dr ? p->dring * sizeof *p->dr + (size_t)p->node_limit * sizeof *p->dn +
                      (size_t)(p->g.cap ? p->g.cap : 1) * sizeof *p->dg
                : 0);
}

const ikv_policy_ops ikv_policy_lrb = {
    .name = "lrb",
    .doc = "learned relaxed Belady (LRB, NSDI'20) inside ARC's classes: REPLACE picks T1 or "
           "T2 as ARC does, then the least likely of `sample` evictable blocks of T1 to be "
           "accessed within its class's boundary (Little's law) goes, learned online from each "
           "block's gaps, age, count and flags with labels from sampled blocks and the ghosts "
           "(params sample, train, period, pool, bmul, bound, ghost, inherit, hitw, split, "
           "order, cbound, pq, hint, duel, dwin, dz)",
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
