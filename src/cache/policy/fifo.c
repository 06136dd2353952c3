/*
 * fifo: first in, first out — evict the evictable leaf that entered this tier first.
 *
 * The textbook baseline (e.g. Belady's 1966 study; the FIFO of every OS and CDN cache, and the
 * building block of S3-FIFO and SIEVE). Hits change nothing.
 *
 * Leaf-only adaptation: each block gets a sequence number when it enters the tier (insert,
 * demotion or promotion), kept in pol.s.x so that it survives the block's time off the queue.
 * The queue holds the evictable blocks ordered by that number (head = newest); a block that
 * becomes evictable again (its last child evicted, its request unlocked, its pin expired) goes
 * back to the place its number gives. So the victim is always the oldest insertion among the
 * evictable leaves — exactly FIFO restricted to what may be evicted (the fuzz test's oracle
 * checks that victim by brute force).
 *
 * Cost: victim O(1) (the tail). The common re-queue after an eviction is O(1): a parent entered
 * the tier before its children, and its last child was the oldest evictable block, so the
 * parent goes to the tail. A block unlocked later is placed by walking from the nearer end of
 * the list (ikv__list_insert_ordered). No memory beyond the node.
 */
#include "../internal.h"

typedef struct fifo {
    ikv__list q;     /* evictable blocks, head = newest insertion */
    ikv__node *nodes;
    uint64_t seq;    /* insertions into this tier so far */
} fifo;

#define SEQ(n) ((n)->pol.s.x) /* order of entry into this tier */

static uint64_t seq_of(const ikv__node *n) {
    return SEQ(n);
}

static int fifo_create(const ikv__policy_env *env, const char *params, void **out) {
    if (params && *params)
        return ikv_error(IKV_EPARAM, "fifo takes no parameters ('%s')", params);
    fifo *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    ikv__list_init(&p->q);
    p->nodes = env->nodes;
    *out = p;
    return 0;
}

static void fifo_destroy(void *s) {
    ikv_free(s);
}

static void fifo_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    fifo *p = s;
    SEQ(&p->nodes[id]) = ++p->seq;
}

static void fifo_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)s, (void)id, (void)a, (void)pos;
}

static void fifo_queue(void *s, uint32_t id) {
    fifo *p = s;
    ikv__list_insert_ordered(&p->q, p->nodes, id, seq_of);
}

static void fifo_dequeue(void *s, uint32_t id) {
    fifo *p = s;
    ikv__list_remove(&p->q, p->nodes, id);
}

static void fifo_leave(void *s, uint32_t id) {
    (void)s, (void)id;
}

static uint32_t fifo_victim(void *s) {
    return ((fifo *)s)->q.tail;
}

static int fifo_check(const void *s) {
    const fifo *p = s;
    if (!ikv__list_check(&p->q, p->nodes, NULL)) return 0;
    for (uint32_t id = p->q.head; id != IKV_NIL; id = p->nodes[id].pol.s.next) {
        uint32_t nx = p->nodes[id].pol.s.next;
        if (SEQ(&p->nodes[id]) > p->seq) return 0;
        if (nx != IKV_NIL && SEQ(&p->nodes[nx]) >= SEQ(&p->nodes[id])) return 0;
    }
    return 1;
}

static uint64_t fifo_queued(const void *s) {
    return ((const fifo *)s)->q.len;
}

static size_t fifo_bytes(const void *s) {
    (void)s;
    return 0; /* no per-block array: all in the node */
}

const ikv_policy_ops ikv_policy_fifo = {
    .name = "fifo",
    .doc = "first in, first out among evictable leaves",
    .create = fifo_create,
    .destroy = fifo_destroy,
    .admit = fifo_admit,
    .hit = fifo_hit,
    .queue = fifo_queue,
    .dequeue = fifo_dequeue,
    .leave = fifo_leave,
    .victim = fifo_victim,
    .check = fifo_check,
    .queued = fifo_queued,
    .bytes = fifo_bytes,
};
