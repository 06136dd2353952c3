/*
 * arc: Adaptive Replacement Cache (N. Megiddo, D. S. Modha, "ARC: A Self-Tuning, Low Overhead
 * Replacement Cache", FAST'03, Fig. 4).
 *
 * Two LRU lists of resident blocks — T1 (seen once since admission: recency) and T2 (seen at
 * least twice: frequency) — and two ghost lists of recently evicted keys, B1 (evicted from T1)
 * and B2 (evicted from T2). A target size p for T1 adapts to the workload:
 *
 *     B1 <-evict- [ T1 lru ... mru ] | [ mru ... lru T2 ] -evict-> B2
 *                 <------- p ------->
 *
 *   hit in T1 or T2         -> MRU of T2
 *   miss, key in B1         -> p += max(1, |B2|/|B1|) (recency was evicted too early), T2
 *   miss, key in B2         -> p -= max(1, |B1|/|B2|) (frequency was), T2
 *   miss, key in neither    -> T1
 *   REPLACE                 -> evict T1's LRU if |T1| > p, else T2's LRU
 *   directory bounds        -> |T1| + |B1| <= c, |T1| + |T2| + |B1| + |B2| <= 2c
 *
 * The algorithm is Fig. 4 of the paper, step by step, for a miss on key x:
 *
 *   II  x in B1: p = min(p + max(|B2|/|B1|, 1), c), REPLACE(x, p), x to T2's MRU
 *   III x in B2: p = max(p - max(|B1|/|B2|, 1), 0), REPLACE(x, p), x to T2's MRU
 *   IV  x in neither:
 *       A  |T1| + |B1| = c: if |T1| < c, delete B1's LRU and REPLACE(x, p);
 *                           else delete T1's LRU (no ghost: it leaves the directory)
 *       B  |T1| + |B1| < c and |T1|+|T2|+|B1|+|B2| >= c: if that total = 2c delete B2's LRU;
 *                           REPLACE(x, p)
 *       x to T1's MRU
 *   REPLACE(x, p): if |T1| >= 1 and (|T1| > p or (x in B2 and |T1| = p)): T1's LRU to B1's MRU,
 *                  else T2's LRU to B2's MRU
 *
 * The adaptation of p and the ghost lookup happen in `miss`, which the core sends before it
 * makes room, so REPLACE sees the p of this miss and the tie rule knows whether x was in B2;
 * case IV's directory deletions happen in victim, i.e. exactly when the paper's cache is full
 * (the paper's cases A and B only act then). |T1| and |T2| are resident counts (evictable or
 * not), as in the paper; like libCacheSim's ARC, REPLACE takes T1 when T2 is empty and "= c"
 * is tested as ">= c".
 *
 * Leaf-only adaptation, only where the prefix rule forces it. T1/T2 membership lives in the
 * node (pol.s.a) and the queues hold only evictable blocks, each ordered by last access
 * (node->last) like lru: a block that becomes evictable again goes back to the place its last
 * access gives. When the list REPLACE chooses has no evictable block (its blocks are locked,
 * pinned or have children), its LRU evictable block is taken from the other list instead; in
 * case IV A with |T1| = c and no evictable block in T1 the same fallback applies. On a flat
 * block stream (every block a leaf, nothing held) neither can happen and the policy is Fig. 4
 * exactly; tests/test_policy_ref.c holds it to a brute-force model miss for miss. A "miss" is
 * any admission into the tier (insert, demotion from a faster tier, promotion from a slower
 * one). A block leaving the tier is remembered in B1/B2 only when it is the victim the last
 * victim() call returned (not when it leaves by promotion).
 *
 * Ghosts: B1 and B2 are the exact lists of ghostq.h in one pool of c keys (|B1| + |B2| <= c
 * follows from the directory rules whenever victims come from a full tier; a pool that is full
 * anyway forgets the oldest entry of the list being added to and counts it).
 *
 * No parameters. Cost: O(1) per event, plus the lru-style ordered re-insertion of a block that
 * becomes evictable again (O(1) for a parent exposed by an eviction). Memory: 24 bytes per
 * block of ghost lists.
 */
#include "../internal.h"
#include "ghostq.h"

enum { T1 = 0, T2 = 1 };

typedef struct arc {
    ikv__list t[2];    /* evictable blocks of T1 and T2, head = most recent */
    uint64_t res[2];   /* resident blocks of T1 and T2 */
    ikv__node *nodes;
    ikv__ghostq ghost; /* list 0 = B1, list 1 = B2 */
    uint64_t c;        /* tier capacity in blocks */
    double p;          /* target size of T1, 0..c */
    uint32_t pending;  /* the last victim returned, until it leaves */
    int pending_ghost; /* whether that victim is remembered in B1/B2 when it leaves */
    /* the miss being served (from `miss` until its admit) */
    ikv_key x;
    int x_valid;       /* a miss was announced and not admitted yet */
    int x_from;        /* -1 new, 0 found in B1, 1 found in B2 */
} arc;

#define LIST(n) ((n)->pol.s.a)

static uint64_t last_of(const ikv__node *n) {
    return n->last;
}

static int arc_create(const ikv__policy_env *env, const char *params, void **out) {
    if (params && *params) return ikv_error(IKV_EPARAM, "arc takes no parameters ('%s')", params);
    arc *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    if (ikv__ghostq_init(&p->ghost, env->capacity)) {
        ikv_free(p);
        return IKV_ENOMEM;
    }
    ikv__list_init(&p->t[T1]);
    ikv__list_init(&p->t[T2]);
    p->nodes = env->nodes;
    p->c = env->capacity;
    p->pending = IKV_NIL;
    p->x_from = -1;
    *out = p;
    return 0;
}

static void arc_destroy(void *s) {
    arc *p = s;
    if (!p) return;
    ikv__ghostq_free(&p->ghost);
    ikv_free(p);
}

/* Cases II and III: a ghost hit takes x out of B1 or B2 and adapts p with the list sizes as
 * they were before. Case IV (not found) changes nothing yet. */
static void arc_miss(void *s, ikv_key k) {
    arc *p = s;
    int g = ikv__ghostq_arc_adapt(&p->ghost, k, (double)p->c, &p->p);
    p->x = k;
    p->x_valid = 1;
    p->x_from = g;
}

/* Goes to T2 if the announced miss for this key was a ghost hit, else T1. An admission that was
 * not announced (no core path does that today) looks the ghost up itself. */
static void arc_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    arc *p = s;
    ikv__node *n = &p->nodes[id];
    if (!p->x_valid || !ikv_key_eq(p->x, n->key)) arc_miss(p, n->key);
    LIST(n) = p->x_from >= 0 ? T2 : T1;
    p->res[LIST(n)]++;
    p->x_valid = 0;
    p->x_from = -1;
}

static void arc_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    arc *p = s;
    ikv__node *n = &p->nodes[id];
    int queued = (n->flags & IKV__QUEUED) != 0;
    if (queued) ikv__list_remove(&p->t[LIST(n)], p->nodes, id);
    if (LIST(n) == T1) {
        p->res[T1]--;
        p->res[T2]++;
        LIST(n) = T2;
    }
    if (queued) ikv__list_push_head(&p->t[T2], p->nodes, id);
}

static void arc_queue(void *s, uint32_t id) {
    arc *p = s;
    ikv__list_insert_ordered(&p->t[LIST(&p->nodes[id])], p->nodes, id, last_of);
}

static void arc_dequeue(void *s, uint32_t id) {
    arc *p = s;
    ikv__list_remove(&p->t[LIST(&p->nodes[id])], p->nodes, id);
}

/* The victim's key goes to the MRU end of B1 or B2 (unless case IV A dropped it). */
static void arc_leave(void *s, uint32_t id) {
    arc *p = s;
    ikv__node *n = &p->nodes[id];
    int l = (int)LIST(n);
    p->res[l]--;
    if (id != p->pending) return;
    p->pending = IKV_NIL;
    if (p->pending_ghost) ikv__ghostq_add(&p->ghost, n->key, l);
}

/* REPLACE(x, p): the list, then its LRU evictable block (the other list's if it has none). */
static uint32_t replace(arc *p) {
    int l = ikv__ghostq_arc_replace_list(p->res[T1], p->res[T2], p->p, p->x_valid ? p->x_from : -1);
    if (!p->t[l].len) l = !l;
    p->pending_ghost = 1;
    return p->pending = p->t[l].tail;
}

static uint32_t arc_victim(void *s) {
    arc *p = s;
    /* case IV's directory rules (also for a victim asked for without an announced miss) */
    if (ikv__ghostq_arc_directory(&p->ghost, p->res[T1], p->res[T2], p->c, p->x_valid ? p->x_from : -1) &&
        p->t[T1].len) {
        p->pending_ghost = 0; /* T1's LRU leaves the directory */
        return p->pending = p->t[T1].tail;
    }
    return replace(p);
}

static int arc_check(const void *s) {
    const arc *p = s;
    for (uint32_t l = T1; l <= T2; l++) {
        if (!ikv__list_check(&p->t[l], p->nodes, NULL) || p->t[l].len > p->res[l]) return 0;
        for (uint32_t id = p->t[l].head; id != IKV_NIL; id = p->nodes[id].pol.s.next) {
            uint32_t nx = p->nodes[id].pol.s.next;
            if (LIST(&p->nodes[id]) != l) return 0;
            if (nx != IKV_NIL && p->nodes[nx].last > p->nodes[id].last) return 0;
        }
    }
    uint64_t ghosts = ikv__ghostq_len(&p->ghost, 0) + ikv__ghostq_len(&p->ghost, 1);
    return p->res[T1] + p->res[T2] <= p->c && ghosts <= p->c && p->p >= 0 &&
           p->p <= (double)p->c && ikv__ghostq_check(&p->ghost);
}

static uint64_t arc_queued(const void *s) {
    const arc *p = s;
    return p->t[T1].len + p->t[T2].len;
}

static size_t arc_bytes(const void *s) {
    const arc *p = s;
    return ikv__ghostq_bytes(&p->ghost);
}

const ikv_policy_ops ikv_policy_arc = {
    .name = "arc",
    .doc = "ARC (FAST'03 Fig. 4): recency T1 + frequency T2, exact ghosts B1/B2, adaptive target p",
    .create = arc_create,
    .destroy = arc_destroy,
    .miss = arc_miss,
    .admit = arc_admit,
    .hit = arc_hit,
    .queue = arc_queue,
    .dequeue = arc_dequeue,
    .leave = arc_leave,
    .victim = arc_victim,
    .check = arc_check,
    .queued = arc_queued,
    .bytes = arc_bytes,
};
