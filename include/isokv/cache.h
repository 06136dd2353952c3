/*
 * isokv cache core: a prefix index over 128-bit block keys, with pluggable eviction, locks,
 * pins, tenant scopes and tiers. Metadata only: the core never touches KV bytes; it says which
 * blocks are resident and in which tier, and tells the owner of the bytes (the engine, the
 * simulator) through a callback when a block moves or goes.
 *
 *                 (virtual root)
 *                 /            \
 *            [sys0]            [sysB0]        one node per cached block; a node's key names
 *            /    \               |           the whole prefix it ends (base.h), so a node's
 *       [u1m0]   [u2m0]        [x0]           parent is the block before it in the prompt
 *          |        |
 *       [u1q0]   [u2q0]   <- leaves: the only blocks that may be evicted
 *
 * Blocks are addressed by node ids (uint32_t, dense, < ikv_cache_node_limit()). A node id is
 * stable while the block is resident; once it is evicted the id may be reused. Hold ids only
 * while the blocks are locked.
 *
 * Rules (checked by ikv_cache_check):
 *  - Every resident block's parent is resident (or it is a first block).
 *  - Tier rule: a block's parent is in the same or a faster tier (tier index <=). So a prefix
 *    match reads tiers in non-decreasing order, and demotion from tier t starts at t's leaves:
 *    a block may leave tier t only when none of its children is in tier t.
 *  - Evictable in tier t = no child in tier t, lock count 0, not pinned. Only evictable blocks
 *    are on a policy's queue; policies choose victims only among them.
 *  - Eviction from tier t demotes the block to t+1 when t+1 exists and admits it (admission:
 *    always, or only blocks hit >= admit_min_hits times). A block with children in a slower
 *    tier is always demoted (dropping it would orphan them). Eviction from the last tier, or a
 *    refused admission of a childless block, drops it.
 *  - A hit on a block in a lower tier may promote the matched path to tier 0 (promote_on_hit).
 *
 * Cost: match is O(blocks) hash lookups; insert is O(blocks) plus O(1)/O(log n) per eviction,
 * depending on the policy. Nothing here allocates after ikv_cache_create().
 */
#ifndef ISOKV_CACHE_H
#define ISOKV_CACHE_H

#include "isokv/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define IKV_MAX_TIERS 4
/* The largest block, in tokens, anything in isokv accepts (gen, every trace reader, the cache:
 * node token counts are 16-bit). The one place this limit lives. */
#define IKV_MAX_BLOCK_TOKENS 65535u
#define IKV_NIL UINT32_MAX
#define IKV_NEVER UINT64_MAX /* next-use time of a block that is never used again */

typedef struct ikv_cache ikv_cache;

/* Recompute cost of one block: `ntokens` tokens at block depth `depth` (0 = first block), in
 * any consistent unit (FLOPs, seconds). Used by cost-aware policies (value, gdsf). */
typedef double (*ikv_cost_fn)(void *ctx, uint32_t depth, uint32_t ntokens);

/* Called when a block leaves a tier: to_tier is the tier it was demoted into, or -1 when it
 * was dropped from the cache (its node id is free again after the call returns). */
typedef void (*ikv_evict_fn)(void *ctx, uint32_t node, ikv_key key, int from_tier, int to_tier);

typedef struct ikv_tier_config {
    const char *name;         /* "hbm", "dram", "ssd", "remote"... (copied) */
    uint64_t capacity;        /* blocks; must be > 0 */
    const char *policy;       /* "NAME[:k=v,...]", e.g. "lru", "value:cost=0.5" (copied) */
    uint32_t admit_min_hits;  /* demotion INTO this tier admits blocks hit >= n times; 0 = all */
} ikv_tier_config;

typedef struct ikv_cache_config {
    uint32_t block_tokens;    /* tokens per full block (engine 16, Mooncake 512, WEKA 64) */
    size_t n_tiers;           /* 1..IKV_MAX_TIERS */
    ikv_tier_config tiers[IKV_MAX_TIERS];
    uint64_t node_limit;      /* node pool size; 0 = sum of tier capacities (may be smaller) */
    double pin_budget;        /* fraction of each tier's capacity that may be pinned (0..1) */
    int promote_on_hit;       /* promote hit paths in lower tiers to tier 0 */
    uint32_t softpin_scopes;  /* automatic soft pin: P distinct scopes ... (0 = off) */
    uint64_t softpin_window;  /* ... within this many time units */
    ikv_cost_fn cost;         /* NULL: cost = ntokens * (depth + 1) (attention-shaped) */
    void *cost_ctx;
    ikv_evict_fn on_evict;    /* may be NULL */
    void *evict_ctx;
} ikv_cache_config;

/* Fills a config with defaults: one tier "hbm" of `capacity` blocks under `policy`, block size
 * 16, pin budget 0.5, promotion on. */
void ikv_cache_config_default(ikv_cache_config *cfg, uint64_t capacity, const char *policy);

/* Creates a cache. Returns 0 and sets *out, or IKV_EINVAL (zero capacity or block size, bad
 * tier count), IKV_EPOLICY (unknown policy name), IKV_EPARAM (malformed policy parameters),
 * IKV_ENOMEM. The caller owns *out and frees it with ikv_cache_destroy (which takes NULL). */
int ikv_cache_create(const ikv_cache_config *cfg, ikv_cache **out);
void ikv_cache_destroy(ikv_cache *c);

/* What the caller knows, when a request's response ends, about the next read of its chain
 * (ikv_access.hint). A response that ended in a tool call (OpenAI finish_reason "tool_calls",
 * an agent's "tool_use" stop) is followed within seconds by the client's next turn carrying
 * the tool's result; one that ended the turn waits for a person, or is the conversation's
 * last. Online information a server has; a policy may use it (value: hint=W) or ignore it. */
typedef enum ikv_hint {
    IKV_HINT_NONE = 0, /* unknown */
    IKV_HINT_SOON = 1, /* a tool call is pending: the client returns soon */
    IKV_HINT_TURN = 2  /* the turn ended: the next read waits for a person, or never comes */
} ikv_hint;

/* Per-access information supplied by the caller. */
typedef struct ikv_access {
    uint64_t now;             /* logical time of this access (monotonic; ms, request index...) */
    uint64_t scope;           /* scope or session id, for automatic soft pins; 0 = none */
    const uint64_t *next_use; /* per block: time of the next access to that block, IKV_NEVER if
                                 none; needed only by the opt policy (NULL otherwise) */
    const uint32_t *ntokens;  /* per block token count; NULL = all full blocks */
    int hint;                 /* ikv_hint of this request's response; 0 = unknown */
    uint64_t clock_ms;        /* wall clock when the request arrived, ms (any epoch; 0 =
                                 unknown; the simulator: the trace's arrival time + 1 ms) */
} ikv_access;

/* Finds the longest resident prefix of keys[0..n). Writes its length to *matched, and for each
 * matched block its node id to nodes[i] and its tier to tiers[i] (either array may be NULL).
 * Pure lookup: changes nothing, does not allocate. */
void ikv_cache_match(const ikv_cache *c, const ikv_key *keys, size_t n, uint32_t *nodes,
                     uint8_t *tiers, size_t *matched);

/* Records a hit on the matched blocks nodes[0..n) (a path from the first block): the policies
 * see a hit, hit counts grow, soft-pin tracking is updated, and with promote_on_hit blocks in
 * lower tiers are promoted to tier 0 (which may evict). Returns 0, or IKV_EFULL if promotion
 * found no room (the blocks then stay where they are: still a hit). */
int ikv_cache_hit(ikv_cache *c, const uint32_t *nodes, size_t n, const ikv_access *a);

/* Inserts blocks keys[start..n) as a chain under keys[start-1] (which must be resident, when
 * start > 0) into tier 0, evicting as needed. Blocks already resident are skipped over (their
 * node ids are reported). Writes node ids of keys[start..start+*inserted) to nodes (may be NULL).
 * If `lock` is non-zero the new blocks are locked as they are inserted (so the caller's path
 * cannot be evicted under it). Returns 0 when all were inserted, IKV_EFULL when tier 0 ran out
 * of evictable blocks (*inserted then says how many made it; those stay inserted), IKV_ENOENT
 * if keys[start-1] is not resident, IKV_EINVAL for a bad range. */
int ikv_cache_insert(ikv_cache *c, const ikv_key *keys, size_t n, size_t start,
                     const ikv_access *a, int lock, uint32_t *nodes, size_t *inserted);

/* Evicts one block from tier t: the victim its policy picks among the evictable blocks
 * (demoted to t + 1 or dropped, as a full tier would; on_evict is called). For a caller that
 * bounds something the core does not count (the response cache's bytes). Returns 0, IKV_EFULL
 * (no evictable block in tier t), IKV_EINVAL (no tier t). */
int ikv_cache_evict(ikv_cache *c, size_t t);

/* Lock / unlock a path of blocks (counted: a block locked twice needs two unlocks). A locked
 * block is never evicted or demoted. unlock returns IKV_ENOTLOCKED, changing nothing, if any of
 * the blocks is not locked. */
int ikv_cache_lock(ikv_cache *c, const uint32_t *nodes, size_t n);
int ikv_cache_unlock(ikv_cache *c, const uint32_t *nodes, size_t n);

/* Pins the resident blocks of keys[0..n) until now + ttl (ttl = 0: until unpinned), promoting
 * them to tier 0 first. Returns IKV_ENOENT if not all n blocks are resident, IKV_EBUDGET if the
 * pinned blocks would exceed pin_budget of tier 0's capacity (nothing is pinned then). Pinning a
 * pinned block extends its ttl. */
int ikv_cache_pin(ikv_cache *c, const ikv_key *keys, size_t n, uint64_t ttl);
int ikv_cache_unpin(ikv_cache *c, const ikv_key *keys, size_t n);

/* Advances the logical clock: expires pins whose ttl ran out and soft pins whose window passed
 * without P distinct scopes. */
void ikv_cache_set_time(ikv_cache *c, uint64_t now);

/* Convenience for replay (order mode): match, hit the matched path, insert the rest. Fills
 * *r; hits_by_tier counts matched blocks per tier before promotion. */
typedef struct ikv_access_result {
    size_t matched;                       /* leading blocks found */
    size_t inserted;                      /* blocks inserted */
    uint64_t hits_by_tier[IKV_MAX_TIERS];
} ikv_access_result;
int ikv_cache_access(ikv_cache *c, const ikv_key *keys, size_t n, const ikv_access *a,
                     ikv_access_result *r);

typedef struct ikv_cache_stats {
    uint64_t resident[IKV_MAX_TIERS];     /* blocks per tier */
    uint64_t evictable[IKV_MAX_TIERS];
    uint64_t locked;                      /* blocks with lock count > 0 */
    uint64_t pinned[IKV_MAX_TIERS];       /* explicit + soft */
    uint64_t inserts, hits, evictions[IKV_MAX_TIERS], drops, demotions, promotions;
} ikv_cache_stats;
void ikv_cache_stats_get(const ikv_cache *c, ikv_cache_stats *s);

/* Accessors. */
size_t ikv_cache_tiers(const ikv_cache *c);
uint64_t ikv_cache_capacity(const ikv_cache *c, size_t tier);
uint64_t ikv_cache_node_limit(const ikv_cache *c);
const char *ikv_cache_policy_name(const ikv_cache *c, size_t tier);
ikv_key ikv_cache_node_key(const ikv_cache *c, uint32_t node);
int ikv_cache_node_tier(const ikv_cache *c, uint32_t node);  /* -1 if free */

/* Metadata bytes per block of the node pool: node, hash bucket, heap position (heap-ordered
 * policies), the policies' per-block arrays (heap slots, ghost tables), soft-pin and pin
 * state. What does not grow with capacity (the cache's and the policies' fixed structs, about
 * 2 KB) is not spread over the blocks. */
double ikv_cache_bytes_per_block(const ikv_cache *c);

/* Walks every invariant; returns 1 if all hold, 0 (and an ikv_errdetail message) if not. */
int ikv_cache_check(const ikv_cache *c);
void ikv_cache_dump(const ikv_cache *c, FILE *f);

/* The registered policies, for --help and sweeps: name and one-line description. */
size_t ikv_policy_count(void);
const char *ikv_policy_name(size_t i);
const char *ikv_policy_doc(size_t i);

/* 1 if the policy spec ("name[:k=v,...]") reads next-use times, which only a replay of a known
 * trace can give (opt; value with a nonzero oracle= diagnostic: each policy says so through
 * its ops), else 0. A live cache (the engine, the server) refuses such a spec instead of
 * running it without its future. */
int ikv_policy_offline(const char *spec);

#ifdef __cplusplus
}
#endif
#endif
