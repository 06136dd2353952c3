/*
 * The hit-density model of LHD (N. Beckmann, H. Chen, A. Cidon, "LHD: Improving Cache Hit Rate
 * by Maximizing Hit Density", NSDI'18), shared by `lhd` and `value:t1hd=1`: per class of
 * blocks, decayed counts of the ages (time since last access) at which blocks were hit or
 * evicted, and from them the expected hits per unit of space-time of a block of that class at
 * each age:
 *
 *     D[c][a] = sum_{x >= a} H[c][x]  /  sum_{x >= a} (H[c][x] + E[c][x]) * (x - a + 1)
 *
 * (the hits a block that reached age a can still expect, over the space-time it is expected to
 * occupy until its next hit or its eviction). Every `period` events the counts are decayed by
 * `decay` and D is recomputed, O(classes x bins); between recomputations D is a fixed table.
 * A class with fewer than `pool` (decayed) events takes the D of all classes pooled, so a class
 * not seen yet is not evicted for lack of evidence. Ages are logical time >> shift, in
 * IKV__HD_NB bins; shift adapts at each recomputation so that the 95th percentile of the
 * events' ages stays between NB/8 and NB/2 bins (LHD's age coarsening). Before the first
 * recomputation D[c][a] = 1 / (a + 1): LRU.
 *
 * Ghost feedback (`unevict`): a block evicted at age e and asked for again at age a would have
 * been a hit at age a; its eviction is taken back and the hit counted, so ages beyond those at
 * which the policy evicts still get evidence (the histograms otherwise only see hits at ages
 * the policy let blocks reach, and a class evicted young stays evicted young).
 *
 * Classes: hits bucket (0, 1, 2, 3-4, 5-8, 9+) x IKV__HD_NFL flag combinations, which each
 * policy defines (16). Memory: about 480 KiB per model (fixed, not per block). Nothing allocates.
 */
#ifndef ISOKV_CACHE_POLICY_HDMODEL_H
#define ISOKV_CACHE_POLICY_HDMODEL_H

#include "../internal.h"

#define IKV__HD_NB   256 /* age bins */
#define IKV__HD_NHB  6   /* hits buckets */
#define IKV__HD_NFL  16  /* flag combinations per hits bucket */
#define IKV__HD_NCLS (IKV__HD_NHB * IKV__HD_NFL)

typedef struct ikv__hd {
    double hits[IKV__HD_NCLS][IKV__HD_NB], evs[IKV__HD_NCLS][IKV__HD_NB];
    float dens[IKV__HD_NCLS][IKV__HD_NB];
    unsigned shift;       /* age bin = age >> shift */
    uint64_t events;      /* since the last recomputation */
    uint64_t recomputes;
    double period, decay, pool;
} ikv__hd;

/* Clears the counts and sets the LRU prior. */
void ikv__hd_init(ikv__hd *m, double period, double decay, double pool);

/* The class of a block with `hits` hits and flags f (< IKV__HD_NFL). */
static inline uint32_t ikv__hd_class(unsigned hits, uint32_t f) {
    uint32_t hb = hits <= 2 ? hits : hits <= 4 ? 3 : hits <= 8 ? 4 : 5;
    return hb * IKV__HD_NFL + f;
}

static inline uint32_t ikv__hd_bin(const ikv__hd *m, uint64_t age) {
    age >>= m->shift;
    return age < IKV__HD_NB ? (uint32_t)age : IKV__HD_NB - 1;
}

/* The learned density of class c at this age. */
static inline float ikv__hd_density(const ikv__hd *m, uint32_t c, uint64_t age) {
    return m->dens[c][ikv__hd_bin(m, age)];
}

/* Evidence: a block of class c hit, or evicted, at this age (one event each; every `period`
 * events D is recomputed). */
void ikv__hd_hit(ikv__hd *m, uint32_t c, uint64_t age);
void ikv__hd_evict(ikv__hd *m, uint32_t c, uint64_t age);

/* Ghost feedback: a block of class c evicted at age `eage` is asked for again at age `age`. */
void ikv__hd_unevict(ikv__hd *m, uint32_t c, uint64_t eage, uint64_t age);

/* Counts and densities finite and non-negative, the shift in range. */
int ikv__hd_check(const ikv__hd *m);

#endif
