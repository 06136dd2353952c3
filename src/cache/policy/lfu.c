/*
 * lfu: least frequently used — evict the evictable leaf with the fewest accesses, the least
 * recently used of them on a tie.
 *
 * The classic in-cache LFU: frequency counted while the block is cached, forgotten when it is
 * dropped. Under the independent reference model the optimal realizable policy evicts the page
 * of lowest reference probability (Aho, Denning & Ullman, "Principles of optimal page
 * replacement", JACM 18(1), 1971); LFU estimates that probability by counting. No aging: a
 * block that was popular once stays until blocks of equal or lower count run out, which is
 * LFU's known weakness and the reason for gdsf and value. The structure is the O(1) LFU of
 * Shah, Mitra & Matani ("An O(1) algorithm for implementing the LFU cache eviction scheme",
 * 2010): one list per frequency, the victim at the tail of the lowest non-empty one.
 *
 *     freq 1: head [..] [..] [..] tail  <- victim (lowest non-empty frequency, its LRU end)
 *     freq 2: head [..] tail
 *     ...                               a bitmap of non-empty lists finds the lowest in O(1)
 *
 * Frequency: accesses since the block entered the cache = the core's hit count + 1 (the
 * insertion), which the core keeps in the node across tiers and times off the queue, so a
 * block needs no policy state of its own for it, and one demoted from a tier run by another
 * policy arrives with its true count. The core's counter saturates at 255 hits, so frequencies
 * above 256 tie and are ordered by recency.
 *
 * Leaf-only adaptation: the lists hold only evictable blocks, each ordered by last access
 * (node->last; head = most recent). A hit moves a queued block to the head of the next list; a
 * block that becomes evictable again goes to its frequency's list at the place its last access
 * gives (ikv__list_insert_ordered, as lru).
 *
 * Cost: O(1) per event apart from that ordered re-insertion; 256 list heads and a 256-bit map
 * per tier (4 KiB, under 0.1 byte per block at 64K blocks).
 */
#include "../internal.h"

#define NFREQ 256 /* frequencies 1..256 in lists 0..255 */

typedef struct lfu {
    ikv__list f[NFREQ];  /* evictable blocks by frequency - 1, head = most recent */
    uint64_t nonempty[NFREQ / 64];
    uint64_t len;
    ikv__node *nodes;
} lfu;

static inline unsigned freq_idx(const ikv__node *n) {
    return n->hits; /* frequency - 1, 0..255 */
}

static uint64_t last_of(const ikv__node *n) {
    return n->last;
}

static int lfu_create(const ikv__policy_env *env, const char *params, void **out) {
    if (params && *params) return ikv_error(IKV_EPARAM, "lfu takes no parameters ('%s')", params);
    lfu *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    for (int i = 0; i < NFREQ; i++) ikv__list_init(&p->f[i]);
    p->nodes = env->nodes;
    *out = p;
    return 0;
}

static void lfu_destroy(void *s) {
    ikv_free(s);
}

static void lfu_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)s, (void)id, (void)a, (void)pos;
}

static void lfu_leave(void *s, uint32_t id) {
    (void)s, (void)id;
}

static void mark(lfu *p, unsigned i) {
    if (p->f[i].len) p->nonempty[i / 64] |= UINT64_C(1) << (i % 64);
    else p->nonempty[i / 64] &= ~(UINT64_C(1) << (i % 64));
}

static void unlink_from(lfu *p, unsigned i, uint32_t id) {
    ikv__list_remove(&p->f[i], p->nodes, id);
    p->len--;
    mark(p, i);
}

/* The core has already counted this hit in node->hits: the block belongs one list up (unless
 * the counter was saturated), at its head. */
static void lfu_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)a, (void)pos;
    lfu *p = s;
    ikv__node *n = &p->nodes[id];
    if (!(n->flags & IKV__QUEUED)) return;
    unsigned i = freq_idx(n);
    unlink_from(p, n->pol.s.b, id); /* the list it was on: i - 1, or i when saturated */
    ikv__list_push_head(&p->f[i], p->nodes, id);
    n->pol.s.b = i;
    p->len++;
    mark(p, i);
}

static void lfu_queue(void *s, uint32_t id) {
    lfu *p = s;
    ikv__node *n = &p->nodes[id];
    unsigned i = freq_idx(n);
    ikv__list_insert_ordered(&p->f[i], p->nodes, id, last_of);
    n->pol.s.b = i; /* the list the block is on */
    p->len++;
    mark(p, i);
}

static void lfu_dequeue(void *s, uint32_t id) {
    lfu *p = s;
    unlink_from(p, p->nodes[id].pol.s.b, id);
}

static uint32_t lfu_victim(void *s) {
    lfu *p = s;
    for (int w = 0; w < NFREQ / 64; w++)
        if (p->nonempty[w]) return p->f[w * 64 + __builtin_ctzll(p->nonempty[w])].tail;
    return IKV_NIL;
}

static int lfu_check(const void *s) {
    const lfu *p = s;
    uint64_t total = 0;
    for (unsigned i = 0; i < NFREQ; i++) {
        if (!ikv__list_check(&p->f[i], p->nodes, &total)) return 0;
        if (!!(p->nonempty[i / 64] & (UINT64_C(1) << (i % 64))) != (p->f[i].len > 0)) return 0;
        for (uint32_t id = p->f[i].head; id != IKV_NIL; id = p->nodes[id].pol.s.next) {
            const ikv__node *n = &p->nodes[id];
            if (freq_idx(n) != i || n->pol.s.b != i) return 0;
            uint32_t nx = n->pol.s.next;
            if (nx != IKV_NIL && p->nodes[nx].last > n->last) return 0;
        }
    }
    return total == p->len;
}

static uint64_t lfu_queued(const void *s) {
    return ((const lfu *)s)->len;
}

static size_t lfu_bytes(const void *s) {
    (void)s;
    return 0; /* no per-block array: all in the node */
}

const ikv_policy_ops ikv_policy_lfu = {
    .name = "lfu",
    .doc = "least frequently used evictable leaf, least recent on ties (O(1) frequency lists)",
    .create = lfu_create,
    .destroy = lfu_destroy,
    .admit = lfu_admit,
    .hit = lfu_hit,
    .queue = lfu_queue,
    .dequeue = lfu_dequeue,
    .leave = lfu_leave,
    .victim = lfu_victim,
    .check = lfu_check,
    .queued = lfu_queued,
    .bytes = lfu_bytes,
};
