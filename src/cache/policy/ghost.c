/*
 * The approximate ghost table (s3fifo:approx=1 only): fingerprints with coarse insertion times in a
 * bucketed hash table. See ghost.h for the layout, the invariants and the cost.
 */
#include "ghost.h"

#include <string.h>

#define GEN_MASK (IKV__GHOST_GENS - 1)
#define LIST_BIT 0x20u
#define FP_SHIFT 6

/* Bucket from the low 32 bits of key.hi (fast range reduction), fingerprint from its top 26
 * bits with the lowest one forced on, so that an entry is never 0. */
static inline uint64_t bucket_of(const ikv__ghost *g, ikv_key k) {
    return ((k.hi & 0xffffffffu) * g->nbuckets) >> 32;
}

static inline uint32_t fp_of(ikv_key k) {
    return ((uint32_t)(k.hi >> 38) | 1u) << FP_SHIFT;
}

/* Absolute generation of an entry, valid for entries at most 31 generations old (ghost.h). */
static inline uint64_t gen_of(const ikv__ghost *g, uint32_t e) {
    return g->cur - ((g->cur - (e & GEN_MASK)) & GEN_MASK);
}

static inline int list_of(uint32_t e) {
    return (e & LIST_BIT) != 0;
}

static inline int live(const ikv__ghost *g, uint32_t e) {
    return e != 0 && gen_of(g, e) >= g->lo[list_of(e)];
}

/* Forgets a live entry: its generation's count and its list's count go down. */
static void forget(ikv__ghost *g, uint32_t *slot) {
    uint32_t e = *slot;
    int l = list_of(e);
    g->cnt[l][e & GEN_MASK]--;
    g->n[l]--;
    *slot = 0;
}

int ikv__ghost_init(ikv__ghost *g, uint64_t cap) {
    memset(g, 0, sizeof *g);
    if (cap == 0) return 0;
    g->cap = cap;
    g->nbuckets = (cap + IKV__GHOST_WAYS - 1) / IKV__GHOST_WAYS;
    if (g->nbuckets > UINT32_MAX) g->nbuckets = UINT32_MAX;
    g->gen_len = (cap + IKV__GHOST_LIVE - 1) / IKV__GHOST_LIVE;
    g->slots = ikv_calloc((size_t)(g->nbuckets * IKV__GHOST_WAYS), sizeof *g->slots);
    if (!g->slots) {
        g->nbuckets = 0;
        return IKV_ENOMEM;
    }
    return 0;
}

void ikv__ghost_free(ikv__ghost *g) {
    ikv_free(g->slots);
    g->slots = NULL;
    g->nbuckets = 0;
}

/* Drops the oldest live generation of list l (the caller makes sure it is not the current). */
static void drop_oldest(ikv__ghost *g, int l) {
    uint64_t *c = &g->cnt[l][g->lo[l] & GEN_MASK];
    g->n[l] -= *c;
    *c = 0;
    g->lo[l]++;
}

void ikv__ghost_add(ikv__ghost *g, ikv_key k, int list) {
    if (!g->nbuckets) return;
    /* Incremental sweep: clear the dead entries of one bucket. */
    uint32_t *s = &g->slots[g->sweep * IKV__GHOST_WAYS];
    for (int i = 0; i < IKV__GHOST_WAYS; i++)
        if (s[i] && !live(g, s[i])) s[i] = 0;
    if (++g->sweep == g->nbuckets) g->sweep = 0;
    /* A new generation every gen_len insertions; at most IKV__GHOST_LIVE stay live. */
    if (g->gen_fill == g->gen_len) {
        g->cur++;
        g->gen_fill = 0;
        for (int l = 0; l < 2; l++) {
            while (g->lo[l] + IKV__GHOST_LIVE <= g->cur) drop_oldest(g, l);
            IKV_ASSERT(g->cnt[l][g->cur & GEN_MASK] == 0);
        }
    }
    /* A free or dead slot in k's bucket, else the bucket's oldest entry makes way. */
    uint32_t *b = &g->slots[bucket_of(g, k) * IKV__GHOST_WAYS];
    uint32_t *slot = NULL;
    for (int i = 0; i < IKV__GHOST_WAYS && !slot; i++)
        if (!live(g, b[i])) slot = &b[i];
    if (!slot) {
        slot = &b[0];
        for (int i = 1; i < IKV__GHOST_WAYS; i++)
            if (gen_of(g, b[i]) < gen_of(g, *slot)) slot = &b[i];
        forget(g, slot);
    }
    *slot = fp_of(k) | (list ? LIST_BIT : 0) | (uint32_t)(g->cur & GEN_MASK);
    g->cnt[list][g->cur & GEN_MASK]++;
    g->n[list]++;
    g->gen_fill++;
}

int ikv__ghost_take(ikv__ghost *g, ikv_key k) {
    if (!g->nbuckets) return -1;
    uint32_t fp = fp_of(k);
    uint32_t *b = &g->slots[bucket_of(g, k) * IKV__GHOST_WAYS];
    for (int i = 0; i < IKV__GHOST_WAYS; i++) {
        if ((b[i] & ~(LIST_BIT | GEN_MASK)) != fp || !live(g, b[i])) continue;
        int l = list_of(b[i]);
        forget(g, &b[i]);
        return l;
    }
    return -1;
}

void ikv__ghost_trim(ikv__ghost *g, int list, uint64_t max) {
    while (g->n[list] > max && g->lo[list] < g->cur) drop_oldest(g, list);
}

size_t ikv__ghost_bytes(const ikv__ghost *g) {
    return (size_t)(g->nbuckets * IKV__GHOST_WAYS) * sizeof *g->slots;
}

int ikv__ghost_check(const ikv__ghost *g) {
    uint64_t cnt[2][IKV__GHOST_GENS] = {{0}};
    if (!g->nbuckets) return g->n[0] == 0 && g->n[1] == 0;
    if (g->gen_fill > g->gen_len || g->sweep >= g->nbuckets) return 0;
    for (int l = 0; l < 2; l++)
        if (g->lo[l] > g->cur || g->lo[l] + IKV__GHOST_LIVE <= g->cur) return 0;
    for (uint64_t i = 0; i < g->nbuckets * IKV__GHOST_WAYS; i++) {
        uint32_t e = g->slots[i];
        if (e && live(g, e)) cnt[list_of(e)][e & GEN_MASK]++;
    }
    for (int l = 0; l < 2; l++) {
        uint64_t n = 0;
        for (int i = 0; i < IKV__GHOST_GENS; i++) {
            uint64_t gi = g->cur - ((g->cur - (uint64_t)i) & GEN_MASK);
            int is_live = gi >= g->lo[l] && gi <= g->cur;
            if (cnt[l][i] != (is_live ? g->cnt[l][i] : 0)) return 0;
            if (!is_live && g->cnt[l][i]) return 0;
            n += cnt[l][i];
        }
        if (n != g->n[l]) return 0;
    }
    return 1;
}
