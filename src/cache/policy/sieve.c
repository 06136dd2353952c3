/*
 * sieve: SIEVE (Y. Zhang, J. Yang, Y. Yue, Y. Vigfusson, K. V. Rashmi, "SIEVE is Simpler than
 * LRU: an Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI'24).
 *
 * One FIFO queue, one "visited" bit per block and a hand. New blocks go in at the head; a hit
 * only sets the visited bit (no queue movement). To evict, the hand walks from where it stopped
 * towards the head (wrapping to the tail): a visited block has its bit cleared and is passed
 * over, the first unvisited block is the victim, and the hand stays at the victim's newer
 * neighbour. Old blocks that keep being hit therefore settle near the tail while new ones
 * are sifted quickly ("lazy promotion, quick demotion").
 *
 *     tail (oldest) [o] [o] [v] [o] [v] ... [v] [o] head (newest)
 *                          ^ hand moves this way ->         new blocks in here
 *
 * Leaf-only adaptation. The queue holds only evictable blocks. The visited bit and a "fresh"
 * bit live in the node (pol.s.b), so they survive while the block is off the queue (a hit on a
 * locked block still marks it visited). A block's first queueing in a tier goes to the head, as
 * in SIEVE. A block that becomes evictable again (a parent whose last child was evicted, a
 * request's path unlocked, a pin expired) is linked in right at the hand, so it is the next one
 * the hand examines: an exposed parent is an old block, and the hand looks at it as SIEVE looks
 * at the oldest unexamined block — kept (bit cleared) if it was visited since, evicted if not.
 * When the core takes a block off the queue while the hand points at it, the hand steps to the
 * block's newer neighbour, exactly where SIEVE leaves it after an eviction.
 *
 * Cost: queue, dequeue, hit O(1); victim O(1) amortized (each step of the hand clears a
 * visited bit that a hit or an admission paid for). No memory beyond the node.
 */
#include "../internal.h"

typedef struct sieve {
    ikv__list q;     /* evictable blocks, head = newest */
    ikv__node *nodes;
    uint32_t hand;   /* next block to examine; IKV_NIL = start at the tail */
} sieve;

#define FLAGS(n) ((n)->pol.s.b)
#define VISITED 1u
#define FRESH 2u /* admitted to this tier and not queued yet: goes to the head */

static int sieve_create(const ikv__policy_env *env, const char *params, void **out) {
    if (params && *params)
        return ikv_error(IKV_EPARAM, "sieve takes no parameters ('%s')", params);
    sieve *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    ikv__list_init(&p->q);
    p->nodes = env->nodes;
    p->hand = IKV_NIL;
    *out = p;
    return 0;
}

static void sieve_destroy(void *s) {
    ikv_free(s);
}

static void sieve_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    sieve *p = s;
    FLAGS(&p->nodes[id]) = FRESH;
}

static void sieve_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    sieve *p = s;
    FLAGS(&p->nodes[id]) |= VISITED;
}

static void sieve_queue(void *s, uint32_t id) {
    sieve *p = s;
    ikv__node *nodes = p->nodes, *n = &nodes[id];
    if (FLAGS(n) & FRESH) {
        FLAGS(n) &= ~FRESH;
        ikv__list_push_head(&p->q, nodes, id);
        return;
    }
    if (p->hand == IKV_NIL) { /* the hand starts at the tail: be the tail */
        ikv__list_push_tail(&p->q, nodes, id);
        return;
    }
    /* Link id between the hand and its older neighbour, and point the hand at it. */
    uint32_t h = p->hand, older = nodes[h].pol.s.next;
    n->pol.s.prev = h;
    n->pol.s.next = older;
    nodes[h].pol.s.next = id;
    if (older != IKV_NIL) nodes[older].pol.s.prev = id;
    else p->q.tail = id;
    p->q.len++;
    p->hand = id;
}

static void sieve_dequeue(void *s, uint32_t id) {
    sieve *p = s;
    if (p->hand == id) p->hand = p->nodes[id].pol.s.prev; /* newer neighbour, or wrap */
    ikv__list_remove(&p->q, p->nodes, id);
}

static void sieve_leave(void *s, uint32_t id) {
    (void)s, (void)id;
}

static uint32_t sieve_victim(void *s) {
    sieve *p = s;
    if (!p->q.len) return IKV_NIL;
    uint32_t h = p->hand != IKV_NIL ? p->hand : p->q.tail;
    while (FLAGS(&p->nodes[h]) & VISITED) {
        FLAGS(&p->nodes[h]) &= ~VISITED;
        h = p->nodes[h].pol.s.prev;
        if (h == IKV_NIL) h = p->q.tail;
    }
    p->hand = h;
    return h;
}

static int sieve_check(const void *s) {
    const sieve *p = s;
    if (!ikv__list_check(&p->q, p->nodes, NULL)) return 0;
    int hand_found = p->hand == IKV_NIL;
    for (uint32_t id = p->q.head; id != IKV_NIL; id = p->nodes[id].pol.s.next) {
        if (FLAGS(&p->nodes[id]) & ~VISITED) return 0; /* no queued block is still fresh */
        hand_found |= id == p->hand;
    }
    return hand_found; /* the hand points into this queue */
}

static uint64_t sieve_queued(const void *s) {
    return ((const sieve *)s)->q.len;
}

static size_t sieve_bytes(const void *s) {
    (void)s;
    return 0; /* no per-block array: all in the node */
}

const ikv_policy_ops ikv_policy_sieve = {
    .name = "sieve",
    .doc = "SIEVE (NSDI'24): FIFO with a visited bit and a moving hand",
    .create = sieve_create,
    .destroy = sieve_destroy,
    .admit = sieve_admit,
    .hit = sieve_hit,
    .queue = sieve_queue,
    .dequeue = sieve_dequeue,
    .leave = sieve_leave,
    .victim = sieve_victim,
    .check = sieve_check,
    .queued = sieve_queued,
    .bytes = sieve_bytes,
};
