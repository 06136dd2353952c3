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
 * Leaf-only adaptation. T1/T2 membership lives in the node (pol.s.a) and the queues hold only
 * evictable blocks, each ordered by last access (node->last) like lru: a block that becomes
 * evictable again goes back to the place its last access gives. |T1| and |T2| are the resident
 * counts (evictable or not, kept at admit/leave), as in the paper; REPLACE picks its list by p
 * and falls back to the other list when the chosen one has no evictable block. A "miss" is any
 * admission into the tier (insert, demotion from a faster tier, promotion from a slower one);
 * the core makes room before it admits, so the p update of a ghost hit steers the next
 * eviction rather than the one made for this block, and REPLACE's tie rule (evict from T1 when
 * |T1| = p and the missed key is in B2) is left out for the same reason. A block leaving the
 * tier is remembered in B1/B2 only when it is the victim the last victim() call returned
 * (not when it leaves by promotion).
 *
 * Ghosts: B1 and B2 share one bucketed fingerprint table of c keys (ghost.h: 4 bytes a key,
 * FIFO forgetting, which is LRU order for ghosts since ARC never reorders them). The bounds
 * above are kept by dropping a list's oldest generation of c/16 keys at a time (never the
 * newest generation), so |B1| may exceed c - |T1| by less than c/16 until the next
 * generation starts, and a key may be forgotten slightly early when its bucket overflows.
 *
 * No parameters. Cost: O(1) per event, plus the lru-style ordered re-insertion of a block that
 * becomes evictable again (O(1) for a parent exposed by an eviction). Memory: 4 bytes per block
 * of ghost table.
 */
#include "../internal.h"
#include "ghost.h"

enum { T1 = 0, T2 = 1 };

typedef struct arc {
    ikv__list t[2];    /* evictable blocks of T1 and T2, head = most recent */
    uint64_t res[2];   /* resident blocks of T1 and T2 */
    ikv__node *nodes;
    ikv__ghost ghost;  /* list 0 = B1, list 1 = B2 */
    uint64_t c;        /* tier capacity in blocks */
    double p;          /* target size of T1, 0..c */
    uint32_t pending;  /* the last victim returned, until it leaves */
} arc;

#define LIST(n) ((n)->pol.s.a)

static uint64_t last_of(const ikv__node *n) {
    return n->last;
}

static int arc_create(const ikv__policy_env *env, const char *params, void **out) {
    if (params && *params) return ikv_error(IKV_EPARAM, "arc takes no parameters ('%s')", params);
    arc *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    if (ikv__ghost_init(&p->ghost, env->capacity)) {
        ikv_free(p);
        return IKV_ENOMEM;
    }
    ikv__list_init(&p->t[T1]);
    ikv__list_init(&p->t[T2]);
    p->nodes = env->nodes;
    p->c = env->capacity;
    p->pending = IKV_NIL;
    *out = p;
    return 0;
}

static void arc_destroy(void *s) {
    arc *p = s;
    if (!p) return;
    ikv__ghost_free(&p->ghost);
    ikv_free(p);
}

/* A miss in ARC's terms: adapt p on a ghost hit and choose T1 or T2. */
static void arc_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    arc *p = s;
    ikv__node *n = &p->nodes[id];
    int g = ikv__ghost_take(&p->ghost, n->key);
    /* |B1| and |B2| as they were before the key was taken out */
    double b1 = (double)ikv__ghost_len(&p->ghost, 0) + (g == 0);
    double b2 = (double)ikv__ghost_len(&p->ghost, 1) + (g == 1);
    if (g == 0) {
        double d = b1 >= b2 ? 1.0 : b2 / b1;
        p->p = p->p + d < (double)p->c ? p->p + d : (double)p->c;
    } else if (g == 1) {
        double d = b2 >= b1 ? 1.0 : b1 / b2;
        p->p = p->p - d > 0 ? p->p - d : 0;
    }
    LIST(n) = g >= 0 ? T2 : T1;
    p->res[LIST(n)]++;
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

/* An evicted block's key goes to B1 or B2; then the directory bounds are restored. */
static void arc_leave(void *s, uint32_t id) {
    arc *p = s;
    ikv__node *n = &p->nodes[id];
    int l = (int)LIST(n);
    p->res[l]--;
    if (id != p->pending) return;
    p->pending = IKV_NIL;
    ikv__ghost_add(&p->ghost, n->key, l);
    uint64_t t1 = p->res[T1], t12 = p->res[T1] + p->res[T2];
    ikv__ghost_trim(&p->ghost, 0, t1 < p->c ? p->c - t1 : 0); /* |T1| + |B1| <= c */
    uint64_t room = t12 < 2 * p->c ? 2 * p->c - t12 : 0;       /* all four <= 2c */
    uint64_t b1 = ikv__ghost_len(&p->ghost, 0);
    ikv__ghost_trim(&p->ghost, 1, room > b1 ? room - b1 : 0);
}

/* REPLACE: T1's LRU if |T1| > p, else T2's; the other list if the chosen one has no
 * evictable block. */
static uint32_t arc_victim(void *s) {
    arc *p = s;
    int l = p->res[T1] > 0 && (double)p->res[T1] > p->p ? T1 : T2;
    if (!p->t[l].len) l = !l;
    p->pending = p->t[l].tail;
    return p->pending;
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
    return p->res[T1] + p->res[T2] <= p->c && p->p >= 0 && p->p <= (double)p->c &&
           ikv__ghost_check(&p->ghost);
}

static uint64_t arc_queued(const void *s) {
    const arc *p = s;
    return p->t[T1].len + p->t[T2].len;
}

static size_t arc_bytes(const void *s) {
    const arc *p = s;
    return ikv__ghost_bytes(&p->ghost);
}

const ikv_policy_ops ikv_policy_arc = {
    .name = "arc",
    .doc = "ARC (FAST'03): recency T1 + frequency T2, ghosts B1/B2, adaptive target p",
    .create = arc_create,
    .destroy = arc_destroy,
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
