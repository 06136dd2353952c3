/*
 * The cache core: prefix index, tiers, locks, pins and soft pins over a fixed node pool.
 *
 * Storage. All nodes live in one array sized at creation (node_limit). The hash map key -> node
 * is chained, but its links live outside the nodes, in two compact uint32 arrays: buckets
 * (node_limit of them, so chains average at most one node) and hnext (one per node id). Each
 * link is a tagged entry, the node id in the low `idbits` bits and, above them, a tag taken
 * from the key's high word (14 bits at 2^17 blocks, 7 at 2^24). A lookup walks the chain
 * comparing tags and reads a node only when its tag matches; unlinking a victim walks only the
 * arrays. The node pool is far larger than the CPU caches, so each node read is a miss,
 * while the two link arrays (8 bytes a block) stay mostly cached: a miss (every insert checks
 * that its key is new) and an unlink (every eviction) cost no node reads. The bucket is the top
 * half of the key's low word scaled to the bucket count (a multiply: no power-of-two rounding,
 * exactly 4 bytes a block). Free nodes are chained through hnext with plain ids. Nothing
 * allocates after ikv_cache_create(), except the pin list on the first pin.
 *
 * Insert prefetches the bucket and first link of the keys a few blocks ahead, and eviction
 * prefetches the victim's parent and bucket before the policy's bookkeeping, so the misses
 * that remain overlap.
 *
 * Evictability. A block is evictable from its tier t when no child is in tier t (children are
 * never in a faster tier), it is not locked and not pinned. After every change that can affect
 * that predicate the core calls refresh(), which sends queue/dequeue to the tier's policy, so
 * a policy's queue holds exactly the evictable blocks of its tier (ikv_cache_check verifies it).
 *
 * Eviction from tier t (make_room): the policy picks a victim among its queued blocks. It is
 * demoted to t+1 if that tier exists and admits it (a block with children in slower tiers is
 * always demoted: dropping it would orphan them), after making room there in turn; otherwise
 * it is dropped. Demotion keeps the tier rule (parent tier <= child tier) because a victim has
 * no child in tier t, so all its children are already in t+1 or slower.
 *
 * Promotion (a hit in a lower tier, a pin, an insert under a block in a lower tier) moves a path
 * to tier 0 from the top down, holding the path with temporary locks so making room cannot
 * evict the part already moved.
 */
#include "internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define HITS_MAX UINT8_MAX
#define LOCK_MAX UINT16_MAX

typedef struct tier {
    char name[16];
    char policy_spec[64];
    uint64_t capacity;
    uint64_t resident;
    uint64_t pinned;
    uint32_t admit_min_hits;
    const ikv_policy_ops *ops;
    void *pol;
    ikv__policy_env env;
} tier;

struct ikv_cache {
    ikv__node *nodes;
    uint32_t *buckets; /* tagged entry of each chain's first node; id bits all ones if empty */
    uint32_t *hnext;   /* per node id: tagged entry of the next node in its chain; free list */
    uint64_t nbuckets; /* = node_limit */
    uint32_t id_mask;  /* low bits of an entry: the node id; all ones = no node */
    uint64_t node_limit;
    uint32_t free_head;
    uint64_t used;
    uint64_t now;
    uint32_t block_tokens;
    size_t n_tiers;
    tier tiers[IKV_MAX_TIERS];
    double pin_budget;
    int promote_on_hit;
    ikv_cost_fn cost;
    void *cost_ctx;
    ikv_evict_fn on_evict;
    void *evict_ctx;
    /* explicit pins: node ids and expiries (0 = none), allocated at the first pin */
    uint32_t *pins;
    uint64_t *pin_exp;
    uint64_t n_pins, pins_cap, next_expiry;
    /* soft pins: per-node scope bitmap and window index (allocated when enabled) */
    uint32_t softpin_scopes;
    uint64_t softpin_window, cur_window;
    uint64_t *sp_bits;
    uint32_t *sp_epoch;
    uint64_t locked;
    ikv_cache_stats st;
};

static double default_cost(void *ctx, uint32_t depth, uint32_t ntokens) {
    (void)ctx;
    return (double)ntokens * ((double)depth + 1.0);
}

void ikv_cache_config_default(ikv_cache_config *cfg, uint64_t capacity, const char *policy) {
    memset(cfg, 0, sizeof *cfg);
    cfg->block_tokens = 16;
    cfg->n_tiers = 1;
    cfg->tiers[0].name = "hbm";
    cfg->tiers[0].capacity = capacity;
    cfg->tiers[0].policy = policy ? policy : "lru";
    cfg->pin_budget = 0.5;
    cfg->promote_on_hit = 1;
}

/* ---- creation ------------------------------------------------------------------------------- */

static int setup_tier(ikv_cache *c, size_t t, const ikv_tier_config *tc) {
    tier *tr = &c->tiers[t];
    if (tc->capacity == 0)
        return ikv_error(IKV_EINVAL, "tier %zu (%s): capacity must be > 0 blocks", t,
                         tc->name ? tc->name : "?");
    const char *spec = tc->policy ? tc->policy : "lru";
    if (strlen(spec) >= sizeof tr->policy_spec)
        return ikv_error(IKV_EPARAM, "policy spec too long: '%s'", spec);
    snprintf(tr->name, sizeof tr->name, "%s", tc->name ? tc->name : "tier");
    snprintf(tr->policy_spec, sizeof tr->policy_spec, "%s", spec);
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    tr->ops = ikv__policy_find(spec, nlen);
    if (!tr->ops) return ikv_error(IKV_EPOLICY, "unknown eviction policy '%.*s'", (int)nlen, spec);
    tr->capacity = tc->capacity;
    tr->admit_min_hits = tc->admit_min_hits;
    tr->env.nodes = c->nodes;
    tr->env.capacity = tc->capacity < c->node_limit ? tc->capacity : c->node_limit;
    tr->env.node_limit = c->node_limit;
    tr->env.block_tokens = c->block_tokens;
    tr->env.cost = c->cost;
    tr->env.cost_ctx = c->cost_ctx;
    tr->env.now = &c->now;
    return tr->ops->create(&tr->env, colon ? colon + 1 : "", &tr->pol);
}

int ikv_cache_create(const ikv_cache_config *cfg, ikv_cache **out) {
    if (!cfg || !out) return ikv_error(IKV_EINVAL, "NULL config or output");
    if (cfg->block_tokens == 0 || cfg->block_tokens > IKV_MAX_BLOCK_TOKENS)
        return ikv_error(IKV_EINVAL, "block size must be 1..%u tokens, got %u",
                         IKV_MAX_BLOCK_TOKENS, cfg->block_tokens);
    if (cfg->n_tiers < 1 || cfg->n_tiers > IKV_MAX_TIERS)
        return ikv_error(IKV_EINVAL, "tier count must be 1..%d, got %zu", IKV_MAX_TIERS,
                         cfg->n_tiers);
    if (!(cfg->pin_budget >= 0 && cfg->pin_budget <= 1))
        return ikv_error(IKV_EINVAL, "pin budget must be a fraction in [0, 1]");
    if (cfg->softpin_scopes && (cfg->softpin_window == 0 || cfg->softpin_scopes > 64))
        return ikv_error(IKV_EINVAL, "soft pin needs 1..64 scopes and a window > 0");
    uint64_t sum = 0;
    for (size_t t = 0; t < cfg->n_tiers; t++) {
        if (cfg->tiers[t].capacity == 0)
            return ikv_error(IKV_EINVAL, "tier %zu: capacity must be > 0 blocks", t);
        sum += cfg->tiers[t].capacity;
    }
    uint64_t limit = cfg->node_limit && cfg->node_limit < sum ? cfg->node_limit : sum;
    if (limit >= IKV_NIL) return ikv_error(IKV_ERANGE, "node pool of %" PRIu64 " too large", limit);

    ikv_cache *c = ikv_calloc(1, sizeof *c);
    if (!c) return IKV_ENOMEM;
    c->node_limit = limit;
    c->block_tokens = cfg->block_tokens;
    c->n_tiers = cfg->n_tiers;
    c->pin_budget = cfg->pin_budget;
    c->promote_on_hit = cfg->promote_on_hit;
    c->cost = cfg->cost ? cfg->cost : default_cost;
    c->cost_ctx = cfg->cost_ctx;
    c->on_evict = cfg->on_evict;
    c->evict_ctx = cfg->evict_ctx;
    c->softpin_scopes = cfg->softpin_scopes;
    c->softpin_window = cfg->softpin_window;
    uint64_t nb = limit;
    c->nbuckets = nb;
    c->id_mask = 1;
    while (c->id_mask < limit) c->id_mask = c->id_mask << 1 | 1; /* limit < 2^32 - 1 */
    c->nodes = ikv_malloc((size_t)limit * sizeof *c->nodes);
    c->buckets = ikv_malloc((size_t)nb * sizeof *c->buckets);
    c->hnext = ikv_malloc((size_t)limit * sizeof *c->hnext);
    if (!c->nodes || !c->buckets || !c->hnext) goto nomem;
    if (c->softpin_scopes) {
        c->sp_bits = ikv_calloc((size_t)limit, sizeof *c->sp_bits);
        c->sp_epoch = ikv_calloc((size_t)limit, sizeof *c->sp_epoch);
        if (!c->sp_bits || !c->sp_epoch) goto nomem;
    }
    memset(c->buckets, 0xff, (size_t)nb * sizeof *c->buckets);
    for (uint64_t i = 0; i < limit; i++) {
        c->nodes[i].tier = IKV__FREE;
        c->nodes[i].flags = 0;
        c->hnext[i] = i + 1 < limit ? (uint32_t)(i + 1) : IKV_NIL;
    }
    c->free_head = 0;
    for (size_t t = 0; t < cfg->n_tiers; t++) {
        int rc = setup_tier(c, t, &cfg->tiers[t]);
        if (rc) {
            ikv_cache_destroy(c);
            return rc;
        }
    }
    *out = c;
    return 0;
nomem:
    ikv_cache_destroy(c);
    return ikv_error(IKV_ENOMEM, "cannot allocate a cache of %" PRIu64 " blocks", limit);
}

void ikv_cache_destroy(ikv_cache *c) {
    if (!c) return;
    for (size_t t = 0; t < c->n_tiers; t++)
        if (c->tiers[t].pol) c->tiers[t].ops->destroy(c->tiers[t].pol);
    ikv_free(c->nodes);
    ikv_free(c->buckets);
    ikv_free(c->hnext);
    ikv_free(c->pins);
    ikv_free(c->pin_exp);
    ikv_free(c->sp_bits);
    ikv_free(c->sp_epoch);
    ikv_free(c);
}

/* ---- hash map --------------------------------------------------------------------------- */

static inline uint64_t bucket_of(const ikv_cache *c, ikv_key k) {
    return ((k.lo >> 32) * c->nbuckets) >> 32; /* nbuckets < 2^32 */
}

/* A chain entry: the node id under id_mask, the key's tag above it. An entry whose id bits are
 * all ones names no node (ids < node_limit <= id_mask); create fills the buckets with them. */

static inline uint32_t tag_of(const ikv_cache *c, ikv_key k) {
    return (uint32_t)(k.hi >> 32) & ~c->id_mask;
}

static inline int entry_nil(const ikv_cache *c, uint32_t e) {
    return (e & c->id_mask) == c->id_mask;
}

static inline uint32_t find(const ikv_cache *c, ikv_key k) {
    uint32_t tag = tag_of(c, k);
    for (uint32_t e = c->buckets[bucket_of(c, k)]; !entry_nil(c, e);) {
        uint32_t id = e & c->id_mask;
        if ((e & ~c->id_mask) == tag) {
            const ikv__node *n = &c->nodes[id];
            if (n->key.lo == k.lo && n->key.hi == k.hi) return id;
        }
        e = c->hnext[id];
    }
    return IKV_NIL;
}

/* Prefetches: the bucket of key k, and the first node of its chain (read the bucket first, so
 * call this a few keys after prefetch_bucket for the same key). The hash walks are cache misses
 * into a node array far larger than the caches; issuing them ahead lets them overlap. */
static inline void prefetch_bucket(const ikv_cache *c, ikv_key k) {
    __builtin_prefetch(&c->buckets[bucket_of(c, k)]);
}

static inline void prefetch_chain(const ikv_cache *c, ikv_key k) {
    uint32_t e = c->buckets[bucket_of(c, k)];
    if (!entry_nil(c, e)) __builtin_prefetch(&c->hnext[e & c->id_mask]);
}

/* For a lookup that will likely hit: the chain's first link, and its node if the tag matches. */
static inline void prefetch_hit(const ikv_cache *c, ikv_key k) {
    uint32_t e = c->buckets[bucket_of(c, k)];
    if (entry_nil(c, e)) return;
    if ((e & ~c->id_mask) == tag_of(c, k)) __builtin_prefetch(&c->nodes[e & c->id_mask]);
    else __builtin_prefetch(&c->hnext[e & c->id_mask]);
}

static void hash_insert(ikv_cache *c, uint32_t id, ikv_key k) {
    uint32_t *slot = &c->buckets[bucket_of(c, k)];
    c->hnext[id] = *slot;
    *slot = tag_of(c, k) | id;
}

static void hash_remove(ikv_cache *c, uint32_t id) {
    uint32_t *slot = &c->buckets[bucket_of(c, c->nodes[id].key)];
    while ((*slot & c->id_mask) != id) slot = &c->hnext[*slot & c->id_mask];
    *slot = c->hnext[id];
}

/* ---- evictability ------------------------------------------------------------------------- */

static inline int evictable(const ikv__node *n) {
    return n->lock == 0 && !(n->flags & (IKV__PINNED | IKV__SOFTPIN)) && n->nchild[n->tier] == 0;
}

/* Brings the policy queue in line with the evictability predicate of node id. */
static void refresh(ikv_cache *c, uint32_t id) {
    ikv__node *n = &c->nodes[id];
    int want = evictable(n), has = (n->flags & IKV__QUEUED) != 0;
    if (want == has) return;
    tier *tr = &c->tiers[n->tier];
    if (want) {
        n->flags |= IKV__QUEUED;
        tr->ops->queue(tr->pol, id);
    } else {
        tr->ops->dequeue(tr->pol, id);
        n->flags &= (uint8_t)~IKV__QUEUED;
    }
}

static inline void lock_node(ikv_cache *c, uint32_t id) {
    if (c->nodes[id].lock++ == 0) c->locked++;
    refresh(c, id);
}

static inline void unlock_node(ikv_cache *c, uint32_t id) {
    if (--c->nodes[id].lock == 0) c->locked--;
    refresh(c, id);
}

static inline int is_pinned(const ikv__node *n) {
    return (n->flags & (IKV__PINNED | IKV__SOFTPIN)) != 0;
}

/* ---- moving blocks between tiers ---------------------------------------------------------- */

static int make_room(ikv_cache *c, size_t t);

/* Tells tier t's policy that a block with key k is about to be admitted (before make_room). */
static inline void announce(ikv_cache *c, size_t t, ikv_key k) {
    tier *tr = &c->tiers[t];
    if (tr->ops->miss) tr->ops->miss(tr->pol, k);
}

/* Takes a (not queued) node out of its tier's accounting and policy. */
static void leave_tier(ikv_cache *c, uint32_t id) {
    ikv__node *n = &c->nodes[id];
    tier *tr = &c->tiers[n->tier];
    tr->ops->leave(tr->pol, id);
    tr->resident--;
    if (is_pinned(n)) tr->pinned--;
    if (n->parent != IKV_NIL) c->nodes[n->parent].nchild[n->tier]--;
}

/* Puts a node into tier t's accounting and policy (not queued yet; the caller refreshes). */
static void enter_tier(ikv_cache *c, uint32_t id, size_t t, const ikv_access *a, size_t pos) {
    ikv__node *n = &c->nodes[id];
    tier *tr = &c->tiers[t];
    n->tier = (uint8_t)t;
    tr->resident++;
    if (is_pinned(n)) tr->pinned++;
    if (n->parent != IKV_NIL) c->nodes[n->parent].nchild[t]++;
    tr->ops->admit(tr->pol, id, a, pos);
}

static void free_node(ikv_cache *c, uint32_t id) {
    ikv__node *n = &c->nodes[id];
    n->tier = IKV__FREE;
    n->flags = 0;
    c->hnext[id] = c->free_head;
    c->free_head = id;
    c->used--;
}

/* Evicts victim `id` from its tier t: demote to t+1 or drop. The victim is queued on entry.
 * Returns 0, or IKV_EFULL if it could neither be demoted nor dropped (it stays queued). */
static int evict_one(ikv_cache *c, uint32_t id) {
    ikv__node *n = &c->nodes[id];
    size_t t = n->tier;
    /* the parent's counts and the victim's hash chain are needed after the policy's dequeue */
    if (n->parent != IKV_NIL) __builtin_prefetch(&c->nodes[n->parent]);
    prefetch_bucket(c, n->key);
    int has_children = 0;
    for (size_t u = t + 1; u < c->n_tiers; u++) has_children |= n->nchild[u] != 0;
    int demote = t + 1 < c->n_tiers &&
                 (has_children || n->hits >= c->tiers[t + 1].admit_min_hits);
    /* Hold the victim while room is made below: it must not be picked twice. */
    if (demote) {
        lock_node(c, id);
        announce(c, t + 1, n->key);
        int rc = make_room(c, t + 1);
        unlock_node(c, id);
        if (rc) {
            if (has_children) return IKV_EFULL;
            demote = 0;
        }
    }
    refresh(c, id); /* still the victim: queued again by unlock_node */
    tier *tr = &c->tiers[t];
    tr->ops->dequeue(tr->pol, id);
    n->flags &= (uint8_t)~IKV__QUEUED;
    leave_tier(c, id);
    c->st.evictions[t]++;
    uint32_t parent = n->parent;
    if (demote) {
        enter_tier(c, id, t + 1, NULL, 0);
        c->st.demotions++;
        refresh(c, id);
        if (c->on_evict) c->on_evict(c->evict_ctx, id, n->key, (int)t, (int)t + 1);
    } else {
        hash_remove(c, id);
        c->st.drops++;
        ikv_key key = n->key;
        free_node(c, id);
        if (c->on_evict) c->on_evict(c->evict_ctx, id, key, (int)t, -1);
    }
    if (parent != IKV_NIL) refresh(c, parent);
    return 0;
}

/* Evicts from tier t until it has a free slot (and the pool has a free node when t == 0).
 * Returns IKV_EFULL if the tier has no evictable block left. */
static int make_room(ikv_cache *c, size_t t) {
    tier *tr = &c->tiers[t];
    while (tr->resident >= tr->capacity || (t == 0 && c->free_head == IKV_NIL)) {
        size_t vt = tr->resident >= tr->capacity ? t : c->n_tiers - 1;
        /* The pool can only run dry when node_limit < sum of capacities: free a node by
         * evicting from the slowest tier that has a victim. */
        uint32_t v = IKV_NIL;
        for (;;) {
            v = c->tiers[vt].ops->victim(c->tiers[vt].pol);
            if (v != IKV_NIL || vt == t) break;
            vt--;
        }
        if (v == IKV_NIL) return IKV_EFULL;
        if (evict_one(c, v)) return IKV_EFULL;
    }
    return 0;
}

int ikv_cache_evict(ikv_cache *c, size_t t) {
    if (t >= c->n_tiers) return ikv_error(IKV_EINVAL, "evict: no tier %zu", t);
    uint32_t v = c->tiers[t].ops->victim(c->tiers[t].pol);
    if (v == IKV_NIL) return ikv_error(IKV_EFULL, "evict: tier %zu has no evictable block", t);
    return evict_one(c, v) ? ikv_error(IKV_EFULL, "evict: the victim cannot leave tier %zu", t) : 0;
}

/* Moves node id (in a tier > 0, parent already in tier 0) to tier 0. The caller holds it
 * locked, so it is not queued. */
static int promote_one(ikv_cache *c, uint32_t id) {
    ikv__node *n = &c->nodes[id];
    int from = n->tier;
    announce(c, 0, n->key);
    int rc = make_room(c, 0);
    if (rc) return rc;
    leave_tier(c, id);
    enter_tier(c, id, 0, NULL, 0);
    c->st.promotions++;
    if (c->on_evict) c->on_evict(c->evict_ctx, id, n->key, from, 0);
    return 0;
}

/* Promotes the chain path[0..n) to tier 0, top down. path[0]'s parent, if any, must be in
 * tier 0; it is held too, so making room cannot demote it under its promoted child. */
static int promote_path(ikv_cache *c, const uint32_t *path, size_t n) {
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (c->nodes[path[i]].tier != 0) first = i;
    if (first == n) return 0;
    uint32_t top = c->nodes[path[0]].parent;
    if (top != IKV_NIL) lock_node(c, top);
    for (size_t i = 0; i < n; i++) lock_node(c, path[i]);
    int rc = 0;
    for (size_t i = first; i < n && !rc; i++)
        if (c->nodes[path[i]].tier != 0) rc = promote_one(c, path[i]);
    for (size_t i = 0; i < n; i++) unlock_node(c, path[i]);
    if (top != IKV_NIL) unlock_node(c, top);
    return rc;
}

/* Promotes the resident chain named by keys[0..n) to tier 0. By the tier rule the blocks
 * outside tier 0 form a suffix of the chain; it is promoted in pieces of up to 256 blocks
 * (each piece's parent is in tier 0 by then). */
static int promote_keys(ikv_cache *c, const ikv_key *keys, size_t n) {
    size_t first = n;
    while (first > 0 && c->nodes[find(c, keys[first - 1])].tier != 0) first--;
    uint32_t ids[256];
    for (size_t i = first; i < n; i += 256) {
        size_t k = n - i < 256 ? n - i : 256;
        for (size_t j = 0; j < k; j++) ids[j] = find(c, keys[i + j]);
        int rc = promote_path(c, ids, k);
        if (rc) return rc;
    }
    return 0;
}

/* ---- soft pins ---------------------------------------------------------------------------- */

static void softpin_set(ikv_cache *c, uint32_t id, int on) {
    ikv__node *n = &c->nodes[id];
    int was = is_pinned(n);
    if (on) n->flags |= IKV__SOFTPIN;
    else n->flags &= (uint8_t)~IKV__SOFTPIN;
    int now = is_pinned(n);
    if (was != now) {
        if (now) c->tiers[n->tier].pinned++;
        else c->tiers[n->tier].pinned--;
    }
    refresh(c, id);
}

static uint64_t pin_budget(const ikv_cache *c, size_t t) {
    return (uint64_t)(c->pin_budget * (double)c->tiers[t].capacity);
}

/* Records that scope `scope` reached block id; soft-pins it at P distinct scopes. */
static void softpin_touch(ikv_cache *c, uint32_t id, uint64_t scope) {
    if (!c->softpin_scopes || !scope) return;
    uint32_t w = (uint32_t)(c->now / c->softpin_window);
    if (c->sp_epoch[id] != w) {
        c->sp_epoch[id] = w;
        c->sp_bits[id] = 0;
    }
    uint64_t h = scope * UINT64_C(0x9e3779b97f4a7c15);
    c->sp_bits[id] |= UINT64_C(1) << (h >> 58);
    ikv__node *n = &c->nodes[id];
    if (!(n->flags & IKV__SOFTPIN) &&
        (uint32_t)__builtin_popcountll(c->sp_bits[id]) >= c->softpin_scopes &&
        c->tiers[n->tier].pinned < pin_budget(c, n->tier))
        softpin_set(c, id, 1);
}

/* At a window boundary: a soft pin stays only if its block reached P scopes in the window
 * that just ended or in the current one. O(nodes), once per window. */
static void softpin_roll(ikv_cache *c) {
    uint64_t w = c->now / c->softpin_window;
    if (w == c->cur_window) return;
    c->cur_window = w;
    for (uint64_t i = 0; i < c->node_limit; i++) {
        ikv__node *n = &c->nodes[i];
        if (n->tier == IKV__FREE || !(n->flags & IKV__SOFTPIN)) continue;
        int hot = (c->sp_epoch[i] == w || c->sp_epoch[i] + 1 == w) &&
                  (uint32_t)__builtin_popcountll(c->sp_bits[i]) >= c->softpin_scopes;
        if (!hot) softpin_set(c, (uint32_t)i, 0);
    }
}

/* ---- explicit pins ------------------------------------------------------------------------ */

/* Removes pin-list entry i (swap with the last) and unpins its block. */
static void pin_release(ikv_cache *c, uint64_t i) {
    uint32_t id = c->pins[i];
    ikv__node *n = &c->nodes[id];
    n->flags &= (uint8_t)~IKV__PINNED;
    if (!is_pinned(n)) c->tiers[n->tier].pinned--;
    c->pins[i] = c->pins[c->n_pins - 1];
    c->pin_exp[i] = c->pin_exp[c->n_pins - 1];
    c->n_pins--;
    refresh(c, id);
}

static void pins_expire(ikv_cache *c) {
    uint64_t next = 0;
    for (uint64_t i = 0; i < c->n_pins;) {
        if (c->pin_exp[i] && c->pin_exp[i] <= c->now) {
            pin_release(c, i);
            continue;
        }
        if (c->pin_exp[i] && (!next || c->pin_exp[i] < next)) next = c->pin_exp[i];
        i++;
    }
    c->next_expiry = next;
}

void ikv_cache_set_time(ikv_cache *c, uint64_t now) {
    c->now = now;
    if (c->next_expiry && now >= c->next_expiry) pins_expire(c);
    if (c->softpin_scopes) softpin_roll(c);
}

static int64_t pin_slot(const ikv_cache *c, uint32_t id) {
    for (uint64_t i = 0; i < c->n_pins; i++)
        if (c->pins[i] == id) return (int64_t)i;
    return -1;
}

int ikv_cache_pin(ikv_cache *c, const ikv_key *keys, size_t n, uint64_t ttl) {
    if (n == 0) return 0;
    uint64_t fresh = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = find(c, keys[i]);
        if (id == IKV_NIL)
            return ikv_error(IKV_ENOENT, "pin: block %zu of %zu is not resident", i, n);
        if (!(c->nodes[id].flags & IKV__PINNED)) fresh++;
    }
    uint64_t budget = pin_budget(c, 0);
    if (c->tiers[0].pinned + fresh > budget)
        return ikv_error(IKV_EBUDGET,
                         "pin: %" PRIu64 " more pinned blocks would exceed the budget of %" PRIu64
                         " (%.0f%% of tier %s)",
                         fresh, budget, c->pin_budget * 100, c->tiers[0].name);
    if (!c->pins) {
        c->pins_cap = budget + 1;
        c->pins = ikv_malloc((size_t)c->pins_cap * sizeof *c->pins);
        c->pin_exp = ikv_malloc((size_t)c->pins_cap * sizeof *c->pin_exp);
        if (!c->pins || !c->pin_exp) {
            ikv_free(c->pins);
            ikv_free(c->pin_exp);
            c->pins = NULL;
            c->pin_exp = NULL;
            return IKV_ENOMEM;
        }
    }
    int rc = promote_keys(c, keys, n);
    if (rc) return ikv_error(rc, "pin: no room in tier %s to bring the prefix up", c->tiers[0].name);
    uint64_t exp = ttl ? c->now + ttl : 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = find(c, keys[i]);
        ikv__node *nd = &c->nodes[id];
        int64_t slot = pin_slot(c, id);
        if (slot < 0) {
            if (!is_pinned(nd)) c->tiers[nd->tier].pinned++;
            nd->flags |= IKV__PINNED;
            slot = (int64_t)c->n_pins++;
            c->pins[slot] = id;
        }
        c->pin_exp[slot] = exp;
        if (exp && (!c->next_expiry || exp < c->next_expiry)) c->next_expiry = exp;
        refresh(c, id);
    }
    return 0;
}

int ikv_cache_unpin(ikv_cache *c, const ikv_key *keys, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t id = find(c, keys[i]);
        if (id == IKV_NIL || !(c->nodes[id].flags & IKV__PINNED))
            return ikv_error(IKV_ENOENT, "unpin: block %zu of %zu is not pinned", i, n);
    }
    for (size_t i = 0; i < n; i++) {
        int64_t slot = pin_slot(c, find(c, keys[i]));
        if (slot >= 0) pin_release(c, (uint64_t)slot); /* a repeated key is released once */
    }
    return 0;
}

/* ---- lookups, hits, inserts, locks -------------------------------------------------------- */

void ikv_cache_match(const ikv_cache *c, const ikv_key *keys, size_t n, uint32_t *nodes,
                     uint8_t *tiers, size_t *matched) {
    size_t i = 0;
    for (; i < n; i++) {
        /* keys of a prefix are looked up independently: start the next ones' misses now */
        if (i + 8 < n) prefetch_bucket(c, keys[i + 8]);
        if (i + 4 < n) prefetch_hit(c, keys[i + 4]);
        uint32_t id = find(c, keys[i]);
        if (id == IKV_NIL) break;
        if (nodes) nodes[i] = id;
        if (tiers) tiers[i] = c->nodes[id].tier;
    }
    *matched = i;
}

int ikv_cache_hit(ikv_cache *c, const uint32_t *nodes, size_t n, const ikv_access *a) {
    if (a) c->now = a->now > c->now ? a->now : c->now;
    int lower = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = nodes[i];
        ikv__node *nd = &c->nodes[id];
        IKV_ASSERT(nd->tier != IKV__FREE);
        if (nd->hits < HITS_MAX) nd->hits++;
        tier *tr = &c->tiers[nd->tier];
        tr->ops->hit(tr->pol, id, a, i);
        nd->last = c->now;
        lower |= nd->tier != 0;
        if (a) softpin_touch(c, id, a->scope);
    }
    c->st.hits += n;
    if (lower && c->promote_on_hit) return promote_path(c, nodes, n);
    return 0;
}

int ikv_cache_lock(ikv_cache *c, const uint32_t *nodes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (nodes[i] >= c->node_limit || c->nodes[nodes[i]].tier == IKV__FREE)
            return ikv_error(IKV_EINVAL, "lock: block %zu is not resident", i);
        if (c->nodes[nodes[i]].lock == LOCK_MAX)
            return ikv_error(IKV_EBUSY, "lock: block %zu is locked %u times", i, LOCK_MAX);
    }
    for (size_t i = 0; i < n; i++) lock_node(c, nodes[i]);
    return 0;
}

int ikv_cache_unlock(ikv_cache *c, const uint32_t *nodes, size_t n) {
    /* Take the counts down first and roll back at the first block that is not locked (a
     * repeated id counts twice), so a bad call changes nothing; O(n). Queues are refreshed
     * only once the whole call is known to be valid (refresh is idempotent). */
    for (size_t i = 0; i < n; i++) {
        uint32_t id = nodes[i];
        if (id >= c->node_limit || c->nodes[id].tier == IKV__FREE || c->nodes[id].lock == 0) {
            for (size_t j = 0; j < i; j++)
                if (c->nodes[nodes[j]].lock++ == 0) c->locked++;
            return ikv_error(IKV_ENOTLOCKED, "unlock: block %zu of %zu is not locked", i, n);
        }
        if (--c->nodes[id].lock == 0) c->locked--;
    }
    for (size_t i = 0; i < n; i++) refresh(c, nodes[i]);
    return 0;
}

/* Inserts keys[start..n) as a chain under `prev` (a resident tier-0 node, or IKV_NIL when
 * start == 0). See ikv_cache_insert. */
static int insert_chain(ikv_cache *c, uint32_t prev, const ikv_key *keys, size_t n, size_t start,
                        const ikv_access *a, int lock, uint32_t *nodes, size_t *inserted) {
    size_t done = 0;
    if (prev != IKV_NIL) lock_node(c, prev); /* hold the chain's tail while we make room */
    int rc = 0;
    for (size_t i = start; i < n; i++) {
        /* the duplicate checks of the next keys are independent of this one: start them now */
        if (i + 8 < n) prefetch_bucket(c, keys[i + 8]);
        if (i + 4 < n) prefetch_chain(c, keys[i + 4]);
        uint32_t id = find(c, keys[i]);
        if (id != IKV_NIL) {
            if (c->nodes[id].parent != prev) {
                rc = ikv_error(IKV_EEXIST,
                               "insert: block %zu is resident under a different parent "
                               "(keys must name whole prefixes)",
                               i);
                break;
            }
            lock_node(c, id);
            if (c->nodes[id].tier != 0 && (rc = promote_one(c, id))) {
                unlock_node(c, id);
                break;
            }
        } else {
            announce(c, 0, keys[i]);
            if ((rc = make_room(c, 0))) break;
            id = c->free_head;
            ikv__node *nd = &c->nodes[id];
            c->free_head = c->hnext[id];
            c->used++;
            memset(nd, 0, sizeof *nd);
            nd->key = keys[i];
            nd->parent = prev;
            nd->last = c->now;
            nd->depth = (uint32_t)i;
            hash_insert(c, id, keys[i]);
            enter_tier(c, id, 0, a, i);
            c->st.inserts++;
            if (c->softpin_scopes) {
                c->sp_epoch[id] = (uint32_t)(c->now / c->softpin_window);
                c->sp_bits[id] = 0;
                if (a) softpin_touch(c, id, a->scope);
            }
            lock_node(c, id);
            if (prev != IKV_NIL) refresh(c, prev);
        }
        if (lock) lock_node(c, id);
        if (nodes) nodes[i - start] = id;
        if (prev != IKV_NIL) unlock_node(c, prev);
        prev = id;
        done++;
    }
    if (prev != IKV_NIL) unlock_node(c, prev);
    if (inserted) *inserted = done;
    if (rc == IKV_EFULL)
        return ikv_error(IKV_EFULL, "insert: tier %s has no evictable block left (%zu of %zu "
                                    "blocks inserted)",
                         c->tiers[0].name, done, n - start);
    return rc;
}

int ikv_cache_insert(ikv_cache *c, const ikv_key *keys, size_t n, size_t start,
                     const ikv_access *a, int lock, uint32_t *nodes, size_t *inserted) {
    if (inserted) *inserted = 0;
    if (start > n) return ikv_error(IKV_EINVAL, "insert: start %zu > n %zu", start, n);
    if (a && a->now > c->now) c->now = a->now;
    uint32_t prev = IKV_NIL;
    if (start > 0) {
        if (find(c, keys[start - 1]) == IKV_NIL)
            return ikv_error(IKV_ENOENT, "insert: parent block %zu is not resident", start - 1);
        int rc = promote_keys(c, keys, start);
        if (rc) return ikv_error(rc, "insert: no room to bring the parent path to tier 0");
        prev = find(c, keys[start - 1]);
    }
    return insert_chain(c, prev, keys, n, start, a, lock, nodes, inserted);
}

int ikv_cache_access(ikv_cache *c, const ikv_key *keys, size_t n, const ikv_access *a,
                     ikv_access_result *r) {
    memset(r, 0, sizeof *r);
    if (a && a->now > c->now) ikv_cache_set_time(c, a->now);
    /* Match and hit in pieces of up to 256 blocks, so ids stay on the stack. */
    uint32_t ids[256];
    size_t m = 0;
    for (;;) {
        size_t k = 0;
        for (; k < 256 && m + k < n; k++) {
            if (m + k + 8 < n) prefetch_bucket(c, keys[m + k + 8]);
            if (m + k + 4 < n) prefetch_hit(c, keys[m + k + 4]);
            ids[k] = find(c, keys[m + k]);
            if (ids[k] == IKV_NIL) break;
            r->hits_by_tier[c->nodes[ids[k]].tier]++;
        }
        if (k) {
            ikv_access sub;
            const ikv_access *ap = NULL;
            if (a) {
                sub = *a;
                if (a->next_use) sub.next_use = a->next_use + m;
                if (a->ntokens) sub.ntokens = a->ntokens + m;
                ap = &sub;
            }
            ikv_cache_hit(c, ids, k, ap); /* IKV_EFULL: no room to promote, still a hit */
        }
        m += k;
        if (k < 256 || m == n) break;
    }
    r->matched = m;
    if (m == n) return 0;
    /* the common case: the matched path is resident in tier 0, its tail is ids[k-1] */
    uint32_t prev = m ? ids[(m - 1) % 256] : IKV_NIL;
    if (prev != IKV_NIL && (c->nodes[prev].tier != 0 || !ikv_key_eq(c->nodes[prev].key, keys[m - 1])))
        return ikv_cache_insert(c, keys, n, m, a, 0, NULL, &r->inserted);
    return insert_chain(c, prev, keys, n, m, a, 0, NULL, &r->inserted);
}

/* ---- introspection ------------------------------------------------------------------------ */

void ikv_cache_stats_get(const ikv_cache *c, ikv_cache_stats *s) {
    *s = c->st;
    memset(s->resident, 0, sizeof s->resident);
    memset(s->evictable, 0, sizeof s->evictable);
    memset(s->pinned, 0, sizeof s->pinned);
    for (size_t t = 0; t < c->n_tiers; t++) {
        s->resident[t] = c->tiers[t].resident;
        s->evictable[t] = c->tiers[t].ops->queued(c->tiers[t].pol);
        s->pinned[t] = c->tiers[t].pinned;
    }
    s->locked = c->locked;
}

size_t ikv_cache_tiers(const ikv_cache *c) {
    return c->n_tiers;
}
uint64_t ikv_cache_capacity(const ikv_cache *c, size_t t) {
    return t < c->n_tiers ? c->tiers[t].capacity : 0;
}
uint64_t ikv_cache_node_limit(const ikv_cache *c) {
    return c->node_limit;
}
const char *ikv_cache_policy_name(const ikv_cache *c, size_t t) {
    return t < c->n_tiers ? c->tiers[t].policy_spec : NULL;
}
ikv_key ikv_cache_node_key(const ikv_cache *c, uint32_t id) {
    return c->nodes[id].key;
}
int ikv_cache_node_tier(const ikv_cache *c, uint32_t id) {
    if (id >= c->node_limit || c->nodes[id].tier == IKV__FREE) return -1;
    return c->nodes[id].tier;
}

double ikv_cache_bytes_per_block(const ikv_cache *c) {
    double total = (double)c->node_limit * (sizeof(ikv__node) + sizeof *c->hnext) +
                   (double)c->nbuckets * sizeof *c->buckets;
    for (size_t t = 0; t < c->n_tiers; t++) total += (double)c->tiers[t].ops->bytes(c->tiers[t].pol);
    if (c->sp_bits) total += (double)c->node_limit * (sizeof(uint64_t) + sizeof(uint32_t));
    if (c->pins) total += (double)c->pins_cap * (sizeof(uint32_t) + sizeof(uint64_t));
    return total / (double)c->node_limit;
}

#define CHECK(cond, ...)                                                                        \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            ikv_error(IKV_EINVAL, __VA_ARGS__);                                                \
            ok = 0;                                                                            \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

int ikv_cache_check(const ikv_cache *c) {
    int ok = 1;
    uint64_t n_tiers = c->n_tiers;
    uint32_t *kids = calloc((size_t)c->node_limit * n_tiers + 1, sizeof *kids);
    if (!kids) return ikv_error(IKV_ENOMEM, "check: no memory"), 0;
    uint64_t resident[IKV_MAX_TIERS] = {0}, queued[IKV_MAX_TIERS] = {0},
             pinned[IKV_MAX_TIERS] = {0}, locked = 0, used = 0, free_count = 0;
    for (uint32_t id = c->free_head; id != IKV_NIL; id = c->hnext[id]) {
        CHECK(c->nodes[id].tier == IKV__FREE, "free list holds used node %u", id);
        CHECK(++free_count <= c->node_limit, "free list has a cycle");
    }
    for (uint64_t i = 0; i < c->node_limit; i++) {
        const ikv__node *n = &c->nodes[i];
        if (n->tier == IKV__FREE) continue;
        used++;
        CHECK(n->tier < n_tiers, "node %" PRIu64 " has tier %u", i, n->tier);
        CHECK(find(c, n->key) == i, "node %" PRIu64 " is not found by its key", i);
        if (n->parent != IKV_NIL) {
            const ikv__node *p = &c->nodes[n->parent];
            CHECK(p->tier != IKV__FREE, "node %" PRIu64 " has a parent that is not resident", i);
            CHECK(p->tier <= n->tier, "node %" PRIu64 " (tier %u) is faster than its parent (%u)",
                  i, (unsigned)n->tier, (unsigned)p->tier);
            kids[(uint64_t)n->parent * n_tiers + n->tier]++;
        }
        resident[n->tier]++;
        if (n->flags & IKV__QUEUED) queued[n->tier]++;
        if (is_pinned(n)) pinned[n->tier]++;
        if (n->lock) locked++;
        CHECK(!!(n->flags & IKV__QUEUED) == evictable(n),
              "node %" PRIu64 " queued=%d but evictable=%d (lock %u, flags %x)", i,
              !!(n->flags & IKV__QUEUED), evictable(n), n->lock, n->flags);
    }
    CHECK(used == c->used && used + free_count == c->node_limit,
          "node counts: used %" PRIu64 " (tracked %" PRIu64 ") free %" PRIu64 " limit %" PRIu64,
          used, c->used, free_count, c->node_limit);
    uint64_t linked = 0; /* every chain entry names a used node of its bucket, with its tag */
    for (uint64_t b = 0; b < c->nbuckets; b++)
        for (uint32_t e = c->buckets[b]; !entry_nil(c, e); e = c->hnext[e & c->id_mask]) {
            uint32_t id = e & c->id_mask;
            CHECK(id < c->node_limit && c->nodes[id].tier != IKV__FREE,
                  "bucket %" PRIu64 " links a free or invalid node %u", b, id);
            CHECK(bucket_of(c, c->nodes[id].key) == b && (e & ~c->id_mask) ==
                  tag_of(c, c->nodes[id].key), "node %u is linked in bucket %" PRIu64
                  " with a wrong bucket or tag", id, b);
            CHECK(++linked <= used, "hash chains have a cycle or a node twice");
        }
    CHECK(linked == used, "hash chains link %" PRIu64 " nodes, %" PRIu64 " are used", linked,
          used);
    for (uint64_t i = 0; i < c->node_limit; i++) {
        const ikv__node *n = &c->nodes[i];
        if (n->tier == IKV__FREE) continue;
        for (uint64_t t = 0; t < n_tiers; t++)
            CHECK(n->nchild[t] == kids[i * n_tiers + t],
                  "node %" PRIu64 " counts %u children in tier %" PRIu64 ", has %u", i,
                  n->nchild[t], t, kids[i * n_tiers + t]);
    }
    CHECK(locked == c->locked, "locked blocks %" PRIu64 " != tracked %" PRIu64, locked, c->locked);
    for (size_t t = 0; t < n_tiers; t++) {
        const tier *tr = &c->tiers[t];
        CHECK(resident[t] == tr->resident, "tier %zu resident %" PRIu64 " != tracked %" PRIu64, t,
              resident[t], tr->resident);
        CHECK(tr->resident <= tr->capacity, "tier %zu over capacity", t);
        CHECK(pinned[t] == tr->pinned, "tier %zu pinned %" PRIu64 " != tracked %" PRIu64, t,
              pinned[t], tr->pinned);
        CHECK(queued[t] == tr->ops->queued(tr->pol),
              "tier %zu: %" PRIu64 " evictable blocks but policy %s queues %" PRIu64, t,
              queued[t], tr->ops->name, tr->ops->queued(tr->pol));
        CHECK(tr->ops->check(tr->pol), "tier %zu: policy %s invariants broken", t, tr->ops->name);
    }
    for (uint64_t i = 0; i < c->n_pins; i++)
        CHECK(c->nodes[c->pins[i]].flags & IKV__PINNED, "pin list holds unpinned node %u",
              c->pins[i]);
out:
    free(kids);
    return ok;
}

void ikv_cache_dump(const ikv_cache *c, FILE *f) {
    fprintf(f, "cache: %" PRIu64 "/%" PRIu64 " nodes, %" PRIu64 " locked, now %" PRIu64 "\n",
            c->used, c->node_limit, c->locked, c->now);
    for (size_t t = 0; t < c->n_tiers; t++)
        fprintf(f, "  tier %zu %-6s %-16s %" PRIu64 "/%" PRIu64 " resident, %" PRIu64
                   " evictable, %" PRIu64 " pinned\n",
                t, c->tiers[t].name, c->tiers[t].policy_spec, c->tiers[t].resident,
                c->tiers[t].capacity, c->tiers[t].ops->queued(c->tiers[t].pol), c->tiers[t].pinned);
    for (uint64_t i = 0; i < c->node_limit; i++) {
        const ikv__node *n = &c->nodes[i];
        if (n->tier == IKV__FREE) continue;
        fprintf(f, "  #%" PRIu64 " key %016" PRIx64 " parent %d depth %u tier %u lock %u hits %u%s%s%s\n",
                i, n->key.lo, n->parent == IKV_NIL ? -1 : (int)n->parent, n->depth, n->tier,
                n->lock, n->hits, n->flags & IKV__PINNED ? " pinned" : "",
                n->flags & IKV__SOFTPIN ? " softpin" : "", n->flags & IKV__QUEUED ? " queued" : "");
    }
}
