/*
 * Cache core internals shared by index.c and the policy plug-ins.
 *
 * Node layout (80 bytes; with its hash bucket and chain link (8 bytes, in the core's compact
 * arrays) and a heap slot (8 bytes) where a policy keeps a heap, a cached block costs at most
 * 96 bytes of metadata):
 *
 *     key      16  128-bit prefix key
 *     parent    4  node id of the previous block, IKV_NIL for a first block
 *     hpos      4  heap position (heap-ordered policies; unused by the others)
 *     nchild   16  resident children per tier (children are in the same or a slower tier)
 *     last      8  logical time of the last access (insert or hit)
 *     depth     4  block index in its sequence (0 = first block)
 *     lock      2  lock count
 *     hits      1  hits, saturating at 255 (admission rules count up to that)
 *     tier:3    .  tier index, IKV__FREE when the node is on the free list
 *     flags:5   .  IKV__PINNED, IKV__SOFTPIN, IKV__QUEUED
 *     pol      24  the owning tier's policy's fields
 *
 * A block's token count is not kept in the node: policies that weigh by size get it at admit
 * (a->ntokens[pos], or env->block_tokens when a or a->ntokens is NULL) and keep what they
 * need in pol.
 *
 * Policies see only evictable blocks on their queues (IKV__QUEUED), and the core tells them
 * every change through the ops below.
 */
#ifndef ISOKV_CACHE_INTERNAL_H
#define ISOKV_CACHE_INTERNAL_H

#include "isokv/cache.h"

#define IKV__FREE 7 /* tier value of a free node (tier is 3 bits) */
#define IKV__PINNED 0x01  /* explicit pin (ikv_cache_pin) */
#define IKV__SOFTPIN 0x02 /* automatic soft pin (shared by >= P scopes) */
#define IKV__QUEUED 0x04  /* on its tier policy's eviction queue */

typedef union ikv__pol {
    uint32_t u32[6];
    uint64_t u64[3];
    double f64[3];
    struct {
        uint32_t prev, next; /* list policies */
        uint32_t a, b;       /* per-policy: queue id, frequency, visited bit, heap position */
        uint64_t x;          /* per-policy: priority, next use, insertion time */
    } s;
} ikv__pol;

typedef struct ikv__node {
    ikv_key key;
    uint32_t parent;
    uint32_t hpos;
    uint32_t nchild[IKV_MAX_TIERS];
    uint64_t last;
    uint32_t depth;
    uint16_t lock;
    uint8_t hits;
    uint8_t tier : 3;
    uint8_t flags : 5;
    ikv__pol pol;
} ikv__node;

/* What a policy instance sees of the cache: the node array and the cost callback. */
typedef struct ikv__policy_env {
    ikv__node *nodes;       /* the node pool, indexed by node id */
    uint64_t capacity;      /* this tier's capacity in blocks (upper bound of queued nodes) */
    uint64_t node_limit;    /* size of the node pool */
    uint32_t block_tokens;  /* tokens of a full block (when an access gives no ntokens) */
    ikv_cost_fn cost;
    void *cost_ctx;
    const uint64_t *now;    /* the cache's logical clock */
} ikv__policy_env;

/*
 * A policy plug-in: one const table per file, listed once in policy.c's registry.
 * Events for a block in this policy's tier, in the order the core sends them:
 *   miss       (optional, may be NULL) a block with this key is about to be admitted into the
 *              tier, before the core makes room for it (victim calls may follow, then admit).
 *              A policy whose victim choice depends on the incoming key (arc: FAST'03 adapts p
 *              and applies its directory rules before REPLACE) learns it here. Not every miss
 *              is followed by an admit (a demotion that finds no room drops the block instead).
 *   admit      the block entered this tier (new insert, demotion or promotion); a = NULL for
 *              demotions and promotions, else pos is the block's index in the caller's key array
 *              (for a->next_use, a->ntokens). Initialise the block's pol fields; do not queue it.
 *              The core does not clear pol between tiers: a policy that finds a = NULL may keep
 *              what the same policy wrote in the previous tier (opt keeps the next use).
 *   hit        the block was hit (queued or not); node->last is still the previous access
 *              time (the core sets it to now right after), *env->now is the hit's time.
 *   queue      the block became evictable: put it on the eviction queue.
 *   dequeue    the block stopped being evictable (locked, pinned, got a child in this tier):
 *              take it off the queue.
 *   leave      the block leaves this tier (it is not queued then).
 *   victim     choose an evictable (queued) block to evict, or IKV_NIL if none; the core then
 *              sends dequeue and leave. Must be O(1) amortized or O(log n).
 * parse may reject parameters with IKV_EPARAM (and an ikv_error detail).
 */
typedef struct ikv_policy_ops {
    const char *name;
    const char *doc;
    int (*create)(const ikv__policy_env *env, const char *params, void **state);
    void (*destroy)(void *state);
    void (*miss)(void *s, ikv_key key);
    void (*admit)(void *s, uint32_t id, const ikv_access *a, size_t pos);
    void (*hit)(void *s, uint32_t id, const ikv_access *a, size_t pos);
    void (*queue)(void *s, uint32_t id);
    void (*dequeue)(void *s, uint32_t id);
    void (*leave)(void *s, uint32_t id);
    uint32_t (*victim)(void *s);
    int (*check)(const void *s);           /* 1 if the policy's own invariants hold */
    uint64_t (*queued)(const void *s);     /* blocks on the eviction queue(s) */
    size_t (*bytes)(const void *s);        /* bytes of the policy's per-block arrays (heap
                                              slots, ghosts), not its fixed-size state */
    int (*offline)(const char *params);    /* 1 if with these params it reads next-use times
                                              (ikv_policy_offline); NULL: never */
} ikv_policy_ops;

/* The registry (policy.c). */
const ikv_policy_ops *ikv__policy_find(const char *name, size_t len);

/* Parameter parsing for "k=v,k=v" strings: calls fn(ctx, key, value) per pair; fn returns 0
 * or an error. Keys and values are NUL-terminated copies valid during the call. */
int ikv__params_each(const char *params, int (*fn)(void *ctx, const char *k, const char *v),
                     void *ctx);
int ikv__param_double(const char *policy, const char *k, const char *v, double lo, double hi,
                      double *out);
/* As ikv__param_double, and the number must be whole (a switch or a choice among lo..hi). */
int ikv__param_whole(const char *policy, const char *k, const char *v, double lo, double hi,
                     double *out);

/* ---- shared queue helpers (policy_util.c) ------------------------------------------------ */

/* A doubly linked list of node ids threaded through pol.s.prev/next. head = newest. */
typedef struct ikv__list {
    uint32_t head, tail;
    uint64_t len;
} ikv__list;

void ikv__list_init(ikv__list *l);
void ikv__list_push_head(ikv__list *l, ikv__node *nodes, uint32_t id);
void ikv__list_push_tail(ikv__list *l, ikv__node *nodes, uint32_t id);
void ikv__list_remove(ikv__list *l, ikv__node *nodes, uint32_t id);
/* Inserts id so that key(id) stays ordered: head has the largest key. Walks from the nearer
 * end (the head when id is at least as new as the head's neighbour), so placing a just-used
 * block is O(1) and placing an old block back is O(distance from the tail). */
void ikv__list_insert_ordered(ikv__list *l, ikv__node *nodes, uint32_t id,
                              uint64_t (*key)(const ikv__node *));
int ikv__list_check(const ikv__list *l, const ikv__node *nodes, uint64_t *count);

/* An indexed 4-ary min-heap of node ids. Each slot holds the id and a float copy of its key
 * (8 bytes a slot), so sifting reads only the heap array: four children share a cache line.
 * Equal floats are ordered by the exact key in the node, then by node id. A node's heap
 * position is its hpos field. Policies keep the exact (double) key in the node, IKV__HKEY,
 * which ikv__heap_push/update also set. Capacity (env->capacity) fixed at creation. */
#define IKV__HKEY(n) ((n)->pol.f64[2])
typedef struct ikv__hslot {
    float key;
    uint32_t id;
} ikv__hslot;
typedef struct ikv__heap {
    ikv__hslot *slot;
    uint64_t len, cap;
} ikv__heap;

int ikv__heap_init(ikv__heap *h, const ikv__policy_env *env);
void ikv__heap_free(ikv__heap *h);
void ikv__heap_push(ikv__heap *h, ikv__node *nodes, uint32_t id, double key);
void ikv__heap_remove(ikv__heap *h, ikv__node *nodes, uint32_t id);
void ikv__heap_update(ikv__heap *h, ikv__node *nodes, uint32_t id, double key);
static inline uint32_t ikv__heap_top(const ikv__heap *h) {
    return h->len ? h->slot[0].id : IKV_NIL;
}
int ikv__heap_check(const ikv__heap *h, const ikv__node *nodes);

/* The head of every heap-ordered policy's state (value, gdsf, opt): the policy's struct starts
 * with it, so these ops serve them all. A block's heap key is IKV__HKEY, which the policy sets
 * at admit and hit; queue pushes it, dequeue removes it. */
typedef struct ikv__heap_policy {
    ikv__heap h;
    ikv__node *nodes;
} ikv__heap_policy;

void ikv__hp_queue(void *s, uint32_t id);
void ikv__hp_dequeue(void *s, uint32_t id);
void ikv__hp_leave(void *s, uint32_t id);
uint32_t ikv__hp_victim(void *s);
int ikv__hp_check(const void *s);
uint64_t ikv__hp_queued(const void *s);

#endif
