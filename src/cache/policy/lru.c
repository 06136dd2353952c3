/*
 * lru: least recently used, restricted to evictable leaves.
 *
 * The queue holds evictable blocks ordered by last access time (head = newest). A hit moves a
 * queued block to the head; a block that becomes evictable later (its last child evicted, its
 * request finished) is put back at the position its own last-access time gives, so the order is
 * exactly LRU over the evictable set (see policy_util.c for why that walk is short). Victim: the
 * tail. O(1) per event in the common case.
 *
 * This is the policy of vLLM's and SGLang's prefix caches (SGLang's radix cache evicts leaves by
 * last access time) and of the Mooncake paper's Figure 9 analysis.
 */
#include "../internal.h"

typedef struct lru {
    ikv__list q;
    ikv__node *nodes;
} lru;

static uint64_t last_of(const ikv__node *n) {
    return n->last;
}

static int lru_create(const ikv__policy_env *env, const char *params, void **out) {
    if (params && *params) return ikv_error(IKV_EPARAM, "lru takes no parameters ('%s')", params);
    lru *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    ikv__list_init(&p->q);
    p->nodes = env->nodes;
    *out = p;
    return 0;
}

static void lru_destroy(void *s) {
    ikv_free(s);
}

static void lru_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)s, (void)id, (void)a, (void)pos;
}

static void lru_leave(void *s, uint32_t id) {
    (void)s, (void)id;
}

static void lru_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    lru *p = s;
    if (!(p->nodes[id].flags & IKV__QUEUED)) return;
    ikv__list_remove(&p->q, p->nodes, id);
    ikv__list_push_head(&p->q, p->nodes, id);
}

static void lru_queue(void *s, uint32_t id) {
    lru *p = s;
    ikv__list_insert_ordered(&p->q, p->nodes, id, last_of);
}

static void lru_dequeue(void *s, uint32_t id) {
    lru *p = s;
    ikv__list_remove(&p->q, p->nodes, id);
}

static uint32_t lru_victim(void *s) {
    return ((lru *)s)->q.tail;
}

static int lru_check(const void *s) {
    const lru *p = s;
    if (!ikv__list_check(&p->q, p->nodes, NULL)) return 0;
    for (uint32_t id = p->q.head; id != IKV_NIL; id = p->nodes[id].pol.s.next) {
        uint32_t nx = p->nodes[id].pol.s.next;
        if (nx != IKV_NIL && p->nodes[nx].last > p->nodes[id].last) return 0;
    }
    return 1;
}

static uint64_t lru_queued(const void *s) {
    return ((const lru *)s)->q.len;
}

static size_t lru_bytes(const void *s) {
    (void)s;
    return 0; /* no per-block array: all in the node */
}

const ikv_policy_ops ikv_policy_lru = {
    .name = "lru",
    .doc = "least recently used evictable leaf (vLLM/SGLang prefix caches)",
    .create = lru_create,
    .destroy = lru_destroy,
    .admit = lru_admit,
    .hit = lru_hit,
    .queue = lru_queue,
    .dequeue = lru_dequeue,
    .leave = lru_leave,
    .victim = lru_victim,
    .check = lru_check,
    .queued = lru_queued,
    .bytes = lru_bytes,
};
