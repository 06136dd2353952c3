/*
 * Exact ghost lists for s3fifo and arc: FIFO (LRU, since ghosts are never reordered) lists of
 * the fingerprints of recently evicted keys, with a hash index, in one pool of slots sized at
 * creation.
 *
 * S3-FIFO remembers the blocks evicted from its small queue in one list G; ARC remembers the
 * blocks evicted from T1 and T2 in two lists B1 and B2 and must delete the LRU entry of one of
 * them at a time (FAST'03 Fig. 4, case IV). Both need exactly what the papers' lists do: a key
 * is remembered until it is taken (a ghost hit frees its place at once) or until it is the
 * oldest entry of its list and the list must shrink. No generations, no early forgetting.
 *
 *     list 0   head (newest) <-> ... <-> tail (oldest)      slots: fp | prev | next | hnext
 *     list 1   head <-> ... <-> tail                        bucket[b]: first slot of chain b
 *     free     chained through next
 *
 * Layout: per slot (20 bytes, so a lookup touches one line per chain entry) a 64-bit
 * fingerprint (the key's high word with its lowest bit replaced by the entry's list), prev
 * and next slot ids (the list) and the next slot of its hash chain; one 32-bit chain head per
 * slot. 24 bytes per remembered key: s3fifo (0.9 x capacity keys) costs 21.6
 * bytes per resident block, arc (capacity keys: |B1| + |B2| <= c) 24. A false ghost hit needs
 * two keys whose high words agree in 63 bits (the bucket is a function of the fingerprint):
 * about n / 2^63 per lookup, which only makes a policy treat a new block as a returning one.
 *
 * Cost: add, take, drop O(1) expected (a chain averages < 1 entry at full load; a drop walks
 * the chain of the slot it frees). Nothing allocates after ikv__ghostq_init.
 */
#ifndef ISOKV_CACHE_POLICY_GHOSTQ_H
#define ISOKV_CACHE_POLICY_GHOSTQ_H

#include "../internal.h"

typedef struct ikv__gslot {
    uint32_t fp[2];      /* fingerprint, low and high words (4-byte alignment: 20-byte slots) */
    uint32_t prev, next; /* list links (IKV_NIL at the ends); next also chains free slots */
    uint32_t hnext;      /* next slot in the hash chain (IKV_NIL at the end) */
} ikv__gslot;

typedef struct ikv__ghostq {
    ikv__gslot *slot; /* cap slots */
    uint32_t *bucket; /* nbuckets chain heads (IKV_NIL = empty) */
    uint32_t cap;     /* keys remembered at most (0: remembers nothing) */
    uint32_t nbuckets;
    uint32_t free; /* first free slot */
    uint32_t head[2], tail[2];
    uint64_t n[2];   /* keys per list */
    uint64_t forced; /* entries dropped because every slot was in use (see add) */
} ikv__ghostq;

/* Sizes a ghost for at most `cap` keys (0: a ghost that remembers nothing; cap < 2^32 - 1).
 * Returns 0 or IKV_ENOMEM. */
int ikv__ghostq_init(ikv__ghostq *g, uint64_t cap);
void ikv__ghostq_free(ikv__ghostq *g);

/* Remembers key k as the newest entry of list 0 or 1. When every slot is in use the oldest
 * entry of `list` (of the other list if `list` is empty) is forgotten first and `forced` is
 * counted: s3fifo's FIFO of fixed size works that way; arc keeps its lists within the pool by
 * its directory rules, so there it is a safety valve. Returns the entry's slot (below cap; a
 * caller may keep data of its own per slot, as lhd does), IKV_NIL for a ghost of cap 0. O(1),
 * does not allocate. */
uint32_t ikv__ghostq_add(ikv__ghostq *g, ikv_key k, int list);

/* Looks k up; if it is remembered, forgets it (its slot is free again) and returns its list
 * (0 or 1), else -1. O(1) expected, does not allocate. */
int ikv__ghostq_take(ikv__ghostq *g, ikv_key k);
/* The same, and *slot is the slot the key had (what ikv__ghostq_add returned for it). */
int ikv__ghostq_take_slot(ikv__ghostq *g, ikv_key k, uint32_t *slot);

/* ARC's cases II and III (Megiddo & Modha, FAST'03, Fig. 4) for a missed key k: takes k out of
 * B1 (list 0) or B2 (list 1) and adapts the target size *p of T1 within [0, c] by the ratio of
 * the ghost lists' sizes as they were before the take (up by max(|B2|/|B1|, 1) on a B1 hit,
 * down by max(|B1|/|B2|, 1) on a B2 hit). Returns the list k was in, or -1 (case IV: nothing
 * changes). Shared by arc and value's split classes. O(1) expected, does not allocate. */
int ikv__ghostq_arc_adapt(ikv__ghostq *g, ikv_key k, double c, double *p);
/* The same, and *slot is the slot k had (IKV_NIL when it was in neither list). */
int ikv__ghostq_arc_adapt_slot(ikv__ghostq *g, ikv_key k, double c, double *p, uint32_t *slot);

/* ARC's REPLACE(x, p) list (FAST'03 Fig. 4) with |T1| = t1 and |T2| = t2 resident and the miss x
 * found in B1 (x_from 0), B2 (1) or neither (-1): T1 (0) if t1 >= 1 and (t1 > p, or x was in B2
 * and t1 = p), or if T2 is empty; else T2 (1). Shared by arc and hazard:arc=1. */
static inline int ikv__ghostq_arc_replace_list(uint64_t t1, uint64_t t2, double p, int x_from) {
    return (t1 >= 1 && ((double)t1 > p || (x_from == 1 && (double)t1 == p))) || t2 == 0 ? 0 : 1;
}

/* ARC's case IV directory rules before REPLACE, for a miss x that was in neither ghost list
 * (x_from < 0; otherwise nothing happens) in a tier of c blocks: |T1| + |B1| >= c drops B1's
 * oldest, or, B1 being empty, returns 1: T1's LRU must leave the directory (evicted without a
 * ghost); else |T1| + |T2| + |B1| + |B2| >= 2c drops B2's oldest. Returns 0 when REPLACE
 * follows. Shared by arc and hazard:arc=1. */
int ikv__ghostq_arc_directory(ikv__ghostq *g, uint64_t t1, uint64_t t2, uint64_t c, int x_from);

/* Forgets the oldest entry of `list`. 1 if one was dropped, 0 if the list is empty. */
int ikv__ghostq_drop_oldest(ikv__ghostq *g, int list);

static inline uint64_t ikv__ghostq_len(const ikv__ghostq *g, int list) {
    return g->n[list];
}

/* Bytes of the arrays (fingerprints, slots, buckets). */
size_t ikv__ghostq_bytes(const ikv__ghostq *g);

/* Walks both lists, the free list and every hash chain and checks them against each other and
 * the counts. 1 if consistent. O(cap). */
int ikv__ghostq_check(const ikv__ghostq *g);

#endif
