/*
 * The learned model of `lrb` (after Z. Song, D. S. Berger, K. Li, W. Lloyd, "Learning Relaxed
 * Belady for Content Distribution Network Caching", NSDI'20): P(a block is accessed again within
 * the Belady boundary B | the block's access-history features), as decayed counts of labelled
 * samples per quantized feature tuple. A table model instead of LRB's gradient-boosted trees:
 * no external library, O(1) per prediction and per label, deterministic.
 *
 * Features of a block at a moment (all times in the cache's logical clock, relative to B in
 * half-octave bins, so that the same tuple means the same thing as B moves):
 *
 *     A   its age (now - last access) / B            16 bins: 2^-4 .. 2^4, clamped
 *     D1  its last gap between two accesses / B     0 = none known, else 1 + the age's bins
 *     C   its access count                          1, 2, 3, 4+ (0: never seen accessed)
 *     D2  the gap before it, against D1             none, shorter (< D1 / 1.4), alike, longer
 *     F   flags: root (depth 0), fork (admitted beside a resident sibling), back (from the
 *         ghost), hit (hit since admission, or under a parent hit in the same request), T2
 *         (ARC's class, with lrb's cbound=1)
 *
 * One cell per tuple (16 x 17 x 4 x 4 x 32 = 139,264), and coarser tables over (A, D1, C), (A, D1)
 * and (A) alone for back-off: a prediction uses the finest level whose cell holds at least
 * `pool` (decayed) labels, as (pos + 1/2) / (n + 1). Every `period` labels all counts are
 * halved (LRB's sliding training window). Memory: about 1.1 MiB per model (fixed, not per
 * block). Nothing allocates.
 *
 * Gaps are kept per block as 8-bit half-octave codes of the absolute gap (code 0 = none), so a
 * block's history costs 3 bytes and is compared with B at prediction time.
 */
#ifndef ISOKV_CACHE_POLICY_LRBMODEL_H
#define ISOKV_CACHE_POLICY_LRBMODEL_H

#include "../internal.h"

#define IKV__LRB_NA    16 /* age bins */
#define IKV__LRB_ND1   17 /* 0 = no gap known, 1 + age bins */
#define IKV__LRB_NC    4
#define IKV__LRB_ND2   4
#define IKV__LRB_NF    32
#define IKV__LRB_NL1   (IKV__LRB_NA * IKV__LRB_ND1 * IKV__LRB_NC)
#define IKV__LRB_NL2   (IKV__LRB_NA * IKV__LRB_ND1)
#define IKV__LRB_NCELL (IKV__LRB_NL1 * IKV__LRB_ND2 * IKV__LRB_NF)

#define IKV__LRB_ROOT 1u
#define IKV__LRB_FORK 2u
#define IKV__LRB_BACK 4u
#define IKV__LRB_HIT  8u
#define IKV__LRB_T2   16u

typedef struct ikv__lrb_cnt {
    float pos, n; /* decayed labels: positive, all */
} ikv__lrb_cnt;

typedef struct ikv__lrbm {
    ikv__lrb_cnt l0[IKV__LRB_NCELL], l1[IKV__LRB_NL1], l2[IKV__LRB_NL2], l3[IKV__LRB_NA];
    uint64_t labels; /* since the last halving */
    uint64_t total;  /* all labels ever, and of them positive */
    uint64_t total_pos;
    double period, pool;
} ikv__lrbm;

/* The half-octave code of x >= 0: 0 for 0, else 1 + 2 floor(log2 x) + (x's next bit), so that
 * codes of x and 1.41 x differ by about one. At most 128. */
static inline uint32_t ikv__lrb_code(uint64_t x) {
    if (!x) return 0;
    unsigned b = 63u - (unsigned)__builtin_clzll(x);
    return 1u + 2u * b + (b ? (unsigned)(x >> (b - 1)) & 1u : 0u);
}

/* The bin of a code against the boundary's code: 8 + (c - cb), clamped to 0..15 (so 2^-4 B
 * and below is bin 0, B is bin 8, 2^3.5 B and beyond bin 15). */
static inline uint32_t ikv__lrb_rel(uint32_t c, uint32_t cb) {
    int r = (int)c - (int)cb + IKV__LRB_NA / 2;
    return r < 0 ? 0u : r >= IKV__LRB_NA ? IKV__LRB_NA - 1u : (uint32_t)r;
}

/* The cell of a block: age code ca, its last two gaps' codes g1, g2 (0 = none), its access
 * count and flags, against the boundary's code cb. */
static inline uint32_t ikv__lrb_cell(uint32_t ca, uint32_t g1, uint32_t g2, unsigned count,
                                     uint32_t flags, uint32_t cb) {
    uint32_t a = ikv__lrb_rel(ca, cb);
    uint32_t d1 = g1 ? 1u + ikv__lrb_rel(g1, cb) : 0u;
    uint32_t c = count <= 1 ? 0u : count >= 4 ? 3u : count - 1u;
    uint32_t d2 = !g1 || !g2 ? 0u : g2 + 1 < g1 ? 1u : g2 > g1 + 1 ? 3u : 2u;
    return (((a * IKV__LRB_ND1 + d1) * IKV__LRB_NC + c) * IKV__LRB_ND2 + d2) * IKV__LRB_NF +
           (flags & (IKV__LRB_NF - 1u));
}

/* Clears the counts. */
void ikv__lrbm_init(ikv__lrbm *m, double period, double pool);

/* A label for a sample of this cell: the block was (pos = 1) or was not (0) accessed again
 * within the boundary that held when it was sampled. Every `period` labels the counts halve.
 * O(1), O(cells) once per period. */
void ikv__lrbm_label(ikv__lrbm *m, uint32_t cell, int pos);

/* P(accessed again within the boundary) for a block in this cell, from the finest level with
 * at least `pool` labels (1/2 before any). O(1). */
float ikv__lrbm_predict(const ikv__lrbm *m, uint32_t cell);

/* Counts finite, non-negative, pos <= n in every cell; the totals consistent. O(cells): also
 * asserted (IKV_ASSERT) at every halving, which costs as much. */
int ikv__lrbm_check(const ikv__lrbm *m);
/* The same for the coarse levels and the totals only (1,376 cells), for lrb's walker, which
 * the tests run after every request. */
int ikv__lrbm_check_coarse(const ikv__lrbm *m);

#endif
