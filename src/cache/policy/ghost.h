/*
 * The APPROXIMATE ghost table, used only by s3fifo:approx=1 (the default ghosts of s3fifo and
 * arc are the exact lists of ghostq.h). Kept as an explicit option because it costs 4 bytes a
 * key instead of 24; it forgets early (below), which cost S3-FIFO up to ~1 point of miss ratio
 * on the Mooncake traces against the published algorithm (docs/policies.md).
 *
 * A bounded memory of recently evicted keys, with no data.
 *
 * S3-FIFO remembers the blocks evicted from its small queue (a key found there on re-insertion
 * goes straight to the main queue); ARC remembers the blocks evicted from T1 and T2 in two ghost
 * lists B1 and B2 (a key found there steers the target size p). Both only ask "was this key
 * evicted recently, and from which list?", and both forget in FIFO order.
 *
 * Layout: the S3-FIFO authors' suggestion ("the ghost FIFO queue can be implemented as part of
 * the indexing structure ... store the fingerprint and eviction time of ghost entries in a
 * bucket-based hash table", Yang et al., SOSP'23, and s3fifo.com). One array of 32-bit entries
 * in buckets of 8 (32 bytes each, half a cache line), one entry per remembered key:
 *
 *     bit  31 ........... 6   5    4 ... 0
 *          fingerprint (26)  list  generation mod 32        0 = empty slot
 *
 * Time is counted in generations of gen_len = ceil(cap / 16) insertions. An entry is live while
 * its generation is >= lo[list] (the oldest live generation of its list) and at most 16
 * generations old, so the ghost remembers between 15/16 and all of the last `cap` insertions:
 * FIFO order at a granularity of cap/16. A list can also be trimmed (arc) by dropping its oldest
 * whole generations (never the current one) in O(1) each: lo[list]++ and the per-generation
 * count tells how many entries went. Dead entries stay in their slots until reused, or until
 * the incremental sweep (one bucket per insertion, so the whole table every ~2 generations)
 * clears them; every entry is therefore cleared long before its 5-bit generation could alias a
 * live one (an entry is dead at 16 generations of age and cleared by 19 < 32).
 *
 * Insertion into a full bucket evicts that bucket's oldest entry early; with 8-way buckets at
 * load <= 1 that makes the effective memory a little shorter than cap, never longer.
 *
 * Cost: add, take O(1) (one bucket of 8 slots, one swept bucket); trim O(1) per generation
 * dropped; memory 4 bytes per remembered key (8 * ceil(cap / 8) slots). A false ghost hit needs
 * a 26-bit fingerprint collision in one bucket (< 8 / 2^25 per lookup): it can only make a
 * policy treat a new block as a returning one, never break an invariant.
 */
#ifndef ISOKV_CACHE_POLICY_GHOST_H
#define ISOKV_CACHE_POLICY_GHOST_H

#include "../internal.h"

#define IKV__GHOST_WAYS 8
#define IKV__GHOST_GENS 32  /* generation counter modulus (5 bits in the entry) */
#define IKV__GHOST_LIVE 16  /* generations an entry stays live at most */

typedef struct ikv__ghost {
    uint32_t *slots;     /* nbuckets * IKV__GHOST_WAYS entries, 0 = empty */
    uint64_t nbuckets;   /* 0: the ghost remembers nothing */
    uint64_t cap;        /* keys remembered (target) */
    uint64_t gen_len;    /* insertions per generation */
    uint64_t gen_fill;   /* insertions into the current generation so far */
    uint64_t cur;        /* current generation (absolute) */
    uint64_t lo[2];      /* oldest live generation per list */
    uint64_t cnt[2][IKV__GHOST_GENS]; /* live entries per list and generation (mod 32) */
    uint64_t n[2];       /* live entries per list */
    uint64_t sweep;      /* next bucket the incremental sweep clears */
} ikv__ghost;

/* Sizes a ghost for `cap` keys (0: a ghost that remembers nothing). Returns 0 or IKV_ENOMEM. */
int ikv__ghost_init(ikv__ghost *g, uint64_t cap);
void ikv__ghost_free(ikv__ghost *g);

/* Remembers key k in list 0 or 1. O(1), does not allocate. */
void ikv__ghost_add(ikv__ghost *g, ikv_key k, int list);

/* Looks k up; if it is remembered, forgets it and returns its list (0 or 1), else -1. O(1). */
int ikv__ghost_take(ikv__ghost *g, ikv_key k);

/* Drops the oldest whole generations of `list` (never the current one) while it holds more
 * than `max` keys. O(1) per generation dropped. */
void ikv__ghost_trim(ikv__ghost *g, int list, uint64_t max);

static inline uint64_t ikv__ghost_len(const ikv__ghost *g, int list) {
    return g->n[list];
}

size_t ikv__ghost_bytes(const ikv__ghost *g);

/* Recounts the live entries and checks them against the counters. 1 if consistent. */
int ikv__ghost_check(const ikv__ghost *g);

#endif
