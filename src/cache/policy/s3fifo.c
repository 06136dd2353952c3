/*
 * s3fifo: S3-FIFO (J. Yang, Y. Zhang, Z. Qiu, Y. Yue, K. V. Rashmi, "FIFO queues are all you
 * need for cache eviction", SOSP'23, Algorithm 1).
 *
 * Three FIFO queues and a 2-bit frequency per block (capped at 3):
 *
 *     new block --(key not in G)--> S small, 10% --(freq >= 2)--> M main, 90% <--+
 *         |                          | (freq < 2)                   |  freq > 0: |
 *         +--(key in G)--------------|----------------------------->|  freq--,   |
 *                                    v                              |  reinsert -+
 *                                    G ghost (keys only)            v freq = 0: evict
 *
 * A hit only increments the frequency. To evict: if S holds at least `small` of the capacity,
 * look at S's tail — a block accessed at least `move` (2) times since it entered moves to M's
 * head with its count cleared, the first one that was not is evicted and its key remembered in
 * G; otherwise evict from M like FIFO-reinsertion (CLOCK with a 2-bit counter): a tail with
 * freq > 0 is reinserted at the head with freq - 1, the first with freq 0 goes. Most blocks are
 * accessed once and leave quickly through S ("quick demotion"); a key found in G on
 * re-insertion goes straight to M.
 *
 * Leaf-only adaptation. The queues hold only evictable blocks; a block's queue (S or M), its
 * frequency and its place (the sequence number of its last entry into that queue) live in the
 * node (pol.s.a, pol.s.b, pol.s.x), so they survive while the block is locked, pinned or has
 * children. A block that becomes evictable again goes back to the place its sequence number
 * gives in its own queue (a parent whose last child was just evicted is older than everything
 * left, so that is the tail: O(1)). The S/M split is judged on resident blocks (counted at
 * admit/leave), as in the paper; when the queue chosen has no evictable block the other one is
 * used. Moving a block from S to M never evicts by itself (the paper's fixed-size M may): the
 * tier's capacity is the only bound, and the core enforces it. Admission into the tier
 * (insert, demotion, promotion) is the paper's insert: G decides S or M, looked up when the
 * core announces the miss (the `miss` op, before it makes room), as libCacheSim looks it up
 * before it evicts (else the eviction made for a block could push its own ghost out first).
 *
 * Sizes as in libCacheSim's S3FIFO.c (the authors' implementation): S's size is
 * floor(small x capacity) blocks and M's the rest; eviction takes M when M holds more than
 * its size (or S has no evictable block), else S. In a full tier that is "S holds at least
 * floor(small x c)" (the paper's "S.size >= 10%", rounded down). G holds
 * floor(ghost x capacity) keys.
 *
 * Ghost: the keys of blocks evicted from S, exact by default (ghostq.h: a FIFO of
 * fingerprints with a hash index, a ghost hit frees its place; 24 bytes per key, so 21.6 bytes
 * per resident block with the defaults). `approx=1` selects the older bucketed fingerprint
 * table of ghost.h instead (4 bytes per key, 3.6 per block, but it forgets early: at load 1.0
 * in 8-way buckets a good share of its entries go before their time, which cost up to ~1 point
 * of miss ratio on the Mooncake traces). A block evicted from S is recognised as the one the
 * last victim() call returned when it leaves the tier (a block leaving by promotion is not
 * remembered).
 *
 * Parameters: small (fraction of capacity, default 0.1), ghost (fraction, 0..1, default 0.9),
 * move (accesses in S that earn M, 1..3, default 2), approx (0 or 1, default 0).
 * Cost: O(1) per event, victim O(1) amortized (each block moves S -> M once per admission;
 * each reinsertion in M spends a count that a hit paid for).
 */
#include "../internal.h"
#include "ghost.h"
#include "ghostq.h"

#include <stdlib.h>
#include <string.h>

enum { S = 0, M = 1 };

typedef struct s3fifo {
    ikv__list q[2];     /* evictable blocks of S and M, head = newest entry */
    uint64_t res[2];    /* resident blocks of S and M (evictable or not) */
    ikv__node *nodes;
    ikv__ghostq gq;     /* the exact ghost (default) */
    ikv__ghost ghost;   /* the approximate one (approx=1) */
    int approx;
    uint64_t cap;       /* tier capacity in blocks */
    uint64_t m_size;    /* cap - floor(small x cap): M is over its size above this */
    double small, ghost_frac;
    uint32_t move;
    uint64_t seq;       /* entries into a queue position so far */
    uint32_t pending;   /* the last victim returned, until it leaves */
    ikv_key x;          /* the announced miss (miss op) until its admit */
    int x_valid, x_ghost;
} s3fifo;

#define QID(n) ((n)->pol.s.a)  /* S or M */
#define FREQ(n) ((n)->pol.s.b) /* 0..3 */
#define SEQ(n) ((n)->pol.s.x)  /* order of entry into its queue position */

static uint64_t seq_of(const ikv__node *n) {
    return SEQ(n);
}

static int set_param(void *ctx, const char *k, const char *v) {
    s3fifo *p = ctx;
    if (!strcmp(k, "small")) {
        int rc = ikv__param_double("s3fifo", k, v, 0, 1, &p->small);
        if (!rc && (p->small <= 0 || p->small >= 1))
            rc = ikv_error(IKV_EPARAM, "s3fifo: small=%s must be a fraction in (0, 1)", v);
        return rc;
    }
    if (!strcmp(k, "ghost")) return ikv__param_double("s3fifo", k, v, 0, 1, &p->ghost_frac);
    if (!strcmp(k, "move")) {
        double m;
        int rc = ikv__param_double("s3fifo", k, v, 1, 3, &m);
        if (!rc && m != (double)(uint32_t)m)
            rc = ikv_error(IKV_EPARAM, "s3fifo: move=%s must be an integer in [1, 3]", v);
        p->move = (uint32_t)m;
        return rc;
    }
    if (!strcmp(k, "approx")) {
        double a;
        int rc = ikv__param_double("s3fifo", k, v, 0, 1, &a);
        if (!rc && a != 0 && a != 1)
            rc = ikv_error(IKV_EPARAM, "s3fifo: approx=%s must be 0 or 1", v);
        p->approx = a == 1;
        return rc;
    }
    return ikv_error(IKV_EPARAM,
                     "s3fifo: unknown parameter '%s' (small, ghost, move, approx)", k);
}

static int s3fifo_create(const ikv__policy_env *env, const char *params, void **out) {
    s3fifo *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->small = 0.1;
    p->ghost_frac = 0.9;
    p->move = 2;
    int rc = ikv__params_each(params, set_param, p);
    uint64_t gcap = (uint64_t)(p->ghost_frac * (double)env->capacity);
    if (!rc) rc = p->approx ? ikv__ghost_init(&p->ghost, gcap) : ikv__ghostq_init(&p->gq, gcap);
    if (rc) {
        ikv_free(p);
        return rc;
    }
    ikv__list_init(&p->q[S]);
    ikv__list_init(&p->q[M]);
    p->nodes = env->nodes;
    p->cap = env->capacity;
    p->m_size = p->cap - (uint64_t)(p->small * (double)p->cap);
    p->pending = IKV_NIL;
    *out = p;
    return 0;
}

static void s3fifo_destroy(void *s) {
    s3fifo *p = s;
    if (!p) return;
    ikv__ghost_free(&p->ghost);
    ikv__ghostq_free(&p->gq);
    ikv_free(p);
}

/* Looks k up in G; if it is there, forgets it and returns 1. */
static int ghost_take(s3fifo *p, ikv_key k) {
    return (p->approx ? ikv__ghost_take(&p->ghost, k) : ikv__ghostq_take(&p->gq, k)) >= 0;
}

/* A miss is announced before the core makes room: G is looked up now, as libCacheSim does
 * (its find runs before the eviction), so the eviction made for this block cannot push the
 * block's own ghost entry out first. */
static void s3fifo_miss(void *s, ikv_key k) {
    s3fifo *p = s;
    p->x = k;
    p->x_valid = 1;
    p->x_ghost = ghost_take(p, k);
}

/* The paper's insert: M if the key was remembered in G, else S. */
static void s3fifo_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    s3fifo *p = s;
    ikv__node *n = &p->nodes[id];
    if (!p->x_valid || !ikv_key_eq(p->x, n->key)) s3fifo_miss(p, n->key);
    uint32_t q = p->x_ghost ? M : S;
    p->x_valid = 0;
    QID(n) = q;
    FREQ(n) = 0;
    SEQ(n) = ++p->seq;
    p->res[q]++;
}

static void s3fifo_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    s3fifo *p = s;
    ikv__node *n = &p->nodes[id];
    if (FREQ(n) < 3) FREQ(n)++;
}

static void s3fifo_queue(void *s, uint32_t id) {
    s3fifo *p = s;
    ikv__list_insert_ordered(&p->q[QID(&p->nodes[id])], p->nodes, id, seq_of);
}

static void s3fifo_dequeue(void *s, uint32_t id) {
    s3fifo *p = s;
    ikv__list_remove(&p->q[QID(&p->nodes[id])], p->nodes, id);
}

static void s3fifo_leave(void *s, uint32_t id) {
    s3fifo *p = s;
    ikv__node *n = &p->nodes[id];
    p->res[QID(n)]--;
    if (id == p->pending && QID(n) == S) {
        if (p->approx) ikv__ghost_add(&p->ghost, n->key, 0);
        else ikv__ghostq_add(&p->gq, n->key, 0);
    }
    p->pending = IKV_NIL;
}

/* Moves queued block id to the head of queue q (a new position in it). */
static void requeue_head(s3fifo *p, uint32_t id, uint32_t q) {
    ikv__node *n = &p->nodes[id];
    ikv__list_remove(&p->q[QID(n)], p->nodes, id);
    p->res[QID(n)]--;
    QID(n) = q;
    p->res[q]++;
    SEQ(n) = ++p->seq;
    ikv__list_push_head(&p->q[q], p->nodes, id);
}

static uint32_t s3fifo_victim(void *s) {
    s3fifo *p = s;
    if (!(p->res[M] > p->m_size) || !p->q[M].len) {
        /* evictS: promote S's tail while it earned M, else it is the victim */
        while (p->q[S].len) {
            uint32_t t = p->q[S].tail;
            ikv__node *n = &p->nodes[t];
            if (FREQ(n) < p->move) return p->pending = t;
            FREQ(n) = 0;
            requeue_head(p, t, M);
        }
    }
    /* evictM: FIFO-reinsertion with a 2-bit count */
    while (p->q[M].len) {
        uint32_t t = p->q[M].tail;
        ikv__node *n = &p->nodes[t];
        if (FREQ(n) == 0) return p->pending = t;
        FREQ(n)--;
        requeue_head(p, t, M);
    }
    /* both empty: evictS moves S's blocks to M, so M is empty only if S is too */
    return IKV_NIL;
}

static int s3fifo_check(const void *s) {
    const s3fifo *p = s;
    for (uint32_t q = S; q <= M; q++) {
        if (!ikv__list_check(&p->q[q], p->nodes, NULL) || p->q[q].len > p->res[q]) return 0;
        for (uint32_t id = p->q[q].head; id != IKV_NIL; id = p->nodes[id].pol.s.next) {
            const ikv__node *n = &p->nodes[id];
            uint32_t nx = n->pol.s.next;
            if (QID(n) != q || FREQ(n) > 3 || SEQ(n) > p->seq) return 0;
            if (nx != IKV_NIL && SEQ(&p->nodes[nx]) >= SEQ(n)) return 0;
        }
    }
    if (p->approx) return p->res[S] + p->res[M] <= p->cap && ikv__ghost_check(&p->ghost) &&
                          ikv__ghost_len(&p->ghost, 1) == 0;
    return p->res[S] + p->res[M] <= p->cap && ikv__ghostq_check(&p->gq) &&
           ikv__ghostq_len(&p->gq, 1) == 0 &&
           ikv__ghostq_len(&p->gq, 0) <= (uint64_t)(p->ghost_frac * (double)p->cap);
}

static uint64_t s3fifo_queued(const void *s) {
    const s3fifo *p = s;
    return p->q[S].len + p->q[M].len;
}

static size_t s3fifo_bytes(const void *s) {
    const s3fifo *p = s;
    return p->approx ? ikv__ghost_bytes(&p->ghost) : ikv__ghostq_bytes(&p->gq);
}

const ikv_policy_ops ikv_policy_s3fifo = {
    .name = "s3fifo",
    .doc = "S3-FIFO (SOSP'23): small + main FIFO, 2-bit counts, exact ghost of small's "
           "evictions (params small, ghost, move, approx)",
    .create = s3fifo_create,
    .destroy = s3fifo_destroy,
    .miss = s3fifo_miss,
    .admit = s3fifo_admit,
    .hit = s3fifo_hit,
    .queue = s3fifo_queue,
    .dequeue = s3fifo_dequeue,
    .leave = s3fifo_leave,
    .victim = s3fifo_victim,
    .check = s3fifo_check,
    .queued = s3fifo_queued,
    .bytes = s3fifo_bytes,
};
