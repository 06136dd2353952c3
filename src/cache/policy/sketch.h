/*
 * A count-min sketch of access frequencies with periodic aging: TinyLFU's frequency estimate
 * (G. Einziger, R. Friedman, B. Manes, "TinyLFU: A Highly Efficient Cache Admission Policy",
 * ACM TOS 2017), for `value:tlfu=T`.
 *
 *     row 0  [ c c c c ... c ]     4 rows of w counters (w = a power of two >= the tier's
 *     row 1  [ c c c c ... c ]     capacity), 4 bits of range each (saturate at 15), one
 *     row 2  [ c c c c ... c ]     byte of storage each; a key increments one counter per row
 *     row 3  [ c c c c ... c ]     (its 128 bits give the four indices); the estimate is the
 *                                  minimum of its four counters (never below the true count
 *                                  since the last aging, except by saturation)
 *
 * Aging ("reset"): after `sample` = 10 w increments every counter is halved (integer shift),
 * so the sketch estimates frequency over a recent window, as TinyLFU does. The halving is
 * O(w) once per 10 w increments: O(1) amortized per increment. No doorkeeper (TinyLFU's Bloom
 * filter in front of the counters only saves memory; here a counter is one byte). Memory: 4 w
 * bytes, 4-8 bytes per block of capacity. Nothing allocates after init.
 */
#ifndef ISOKV_CACHE_POLICY_SKETCH_H
#define ISOKV_CACHE_POLICY_SKETCH_H

#include "../internal.h"

#define IKV__SKETCH_MAX 15 /* 4-bit counters */

typedef struct ikv__sketch {
    uint8_t *ctr;    /* 4 rows of w counters, row-major */
    uint64_t w;      /* counters per row (power of two); 0 = not initialised */
    uint64_t ops;    /* increments since the last halving */
    uint64_t sample; /* increments between halvings (10 w) */
    uint64_t resets; /* halvings so far */
} ikv__sketch;

/* Sizes the sketch for a tier of `capacity` blocks. 0 or IKV_ENOMEM. */
int ikv__sketch_init(ikv__sketch *s, uint64_t capacity);
void ikv__sketch_free(ikv__sketch *s);
/* The estimated count of k since the last halving (min over the rows). O(1). */
unsigned ikv__sketch_estimate(const ikv__sketch *s, ikv_key k);
/* Counts one access of k (each row's counter + 1, saturating), halving every counter first
 * when `sample` increments have been counted. O(1) amortized, does not allocate. */
void ikv__sketch_add(ikv__sketch *s, ikv_key k);
size_t ikv__sketch_bytes(const ikv__sketch *s);
/* 1 if the counters are in range and the op count is below the sample size. O(w). */
int ikv__sketch_check(const ikv__sketch *s);

#endif
