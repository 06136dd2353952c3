/*
 * Exact ghost lists shared by s3fifo and arc: two doubly linked FIFO lists of fingerprints in
 * one slot pool, with a chained hash index. See ghostq.h for the layout, the memory and the
 * cost.
 */
#include "ghostq.h"

#include <string.h>

/* The entry's list is the fingerprint's lowest bit (63 bits of the key's high word remain). */
static inline uint32_t bucket_of(const ikv__ghostq *g, uint64_t fp) {
    return (uint32_t)(((fp >> 32) * (uint64_t)g->nbuckets) >> 32);
}

static inline uint64_t fp_at(const ikv__ghostq *g, uint32_t i) {
    return (uint64_t)g->slot[i].fp[1] << 32 | g->slot[i].fp[0];
}

static inline int list_of(const ikv__ghostq *g, uint32_t i) {
    return (int)(g->slot[i].fp[0] & 1);
}

int ikv__ghostq_init(ikv__ghostq *g, uint64_t cap) {
    memset(g, 0, sizeof *g);
    g->head[0] = g->head[1] = g->tail[0] = g->tail[1] = g->free = IKV_NIL;
    if (cap == 0) return 0;
    if (cap >= IKV_NIL) return IKV_ENOMEM;
    g->cap = (uint32_t)cap;
    g->nbuckets = (uint32_t)cap;
    g->slot = ikv_malloc((size_t)cap * sizeof *g->slot);
    g->bucket = ikv_malloc((size_t)cap * sizeof *g->bucket);
    if (!g->slot || !g->bucket) {
        ikv__ghostq_free(g);
        return IKV_ENOMEM;
    }
    for (uint32_t i = 0; i < g->cap; i++) {
        g->bucket[i] = IKV_NIL;
        g->slot[i].next = i + 1 < g->cap ? i + 1 : IKV_NIL;
    }
    g->free = 0;
    return 0;
}

void ikv__ghostq_free(ikv__ghostq *g) {
    ikv_free(g->slot);
    ikv_free(g->bucket);
    g->slot = NULL;
    g->bucket = NULL;
    g->cap = 0;
}

/* Unlinks slot i from its list and its hash chain and puts it on the free list. */
static void release(ikv__ghostq *g, uint32_t i) {
    ikv__gslot *s = &g->slot[i];
    int l = list_of(g, i);
    if (s->prev != IKV_NIL)
        g->slot[s->prev].next = s->next;
    else
        g->head[l] = s->next;
    if (s->next != IKV_NIL)
        g->slot[s->next].prev = s->prev;
    else
        g->tail[l] = s->prev;
    g->n[l]--;
    uint32_t *link = &g->bucket[bucket_of(g, fp_at(g, i))];
    while (*link != i) {
        IKV_ASSERT(*link != IKV_NIL);
        link = &g->slot[*link].hnext;
    }
    *link = s->hnext;
    s->next = g->free;
    g->free = i;
}

int ikv__ghostq_drop_oldest(ikv__ghostq *g, int list) {
    if (g->tail[list] == IKV_NIL) return 0;
    release(g, g->tail[list]);
    return 1;
}

uint32_t ikv__ghostq_add(ikv__ghostq *g, ikv_key k, int list) {
    if (!g->cap) return IKV_NIL;
    if (g->free == IKV_NIL) {
        if (!ikv__ghostq_drop_oldest(g, list)) ikv__ghostq_drop_oldest(g, !list);
        g->forced++;
    }
    uint32_t i = g->free;
    ikv__gslot *s = &g->slot[i];
    g->free = s->next;
    uint64_t fp = (k.hi & ~(uint64_t)1) | (uint64_t)(list != 0);
    s->fp[0] = (uint32_t)fp;
    s->fp[1] = (uint32_t)(fp >> 32);
    uint32_t *b = &g->bucket[bucket_of(g, fp)];
    s->hnext = *b;
    *b = i;
    s->prev = IKV_NIL;
    s->next = g->head[list];
    if (g->head[list] != IKV_NIL)
        g->slot[g->head[list]].prev = i;
    else
        g->tail[list] = i;
    g->head[list] = i;
    g->n[list]++;
    return i;
}

int ikv__ghostq_take(ikv__ghostq *g, ikv_key k) {
    uint32_t slot;
    return ikv__ghostq_take_slot(g, k, &slot);
}

int ikv__ghostq_take_slot(ikv__ghostq *g, ikv_key k, uint32_t *slot) {
    *slot = IKV_NIL;
    if (!g->cap) return -1;
    uint64_t want = k.hi & ~(uint64_t)1;
    for (uint32_t i = g->bucket[bucket_of(g, want)]; i != IKV_NIL; i = g->slot[i].hnext)
        if ((fp_at(g, i) & ~(uint64_t)1) == want) {
            int l = list_of(g, i);
            release(g, i);
            *slot = i;
            return l;
        }
    return -1;
}

size_t ikv__ghostq_bytes(const ikv__ghostq *g) {
    return (size_t)g->cap * (sizeof *g->slot + sizeof *g->bucket);
}

int ikv__ghostq_check(const ikv__ghostq *g) {
    if (!g->cap) return g->n[0] == 0 && g->n[1] == 0;
    uint64_t listed = 0;
    for (int l = 0; l < 2; l++) {
        uint64_t n = 0;
        uint32_t prev = IKV_NIL;
        for (uint32_t i = g->head[l]; i != IKV_NIL; i = g->slot[i].next) {
            if (i >= g->cap || g->slot[i].prev != prev || list_of(g, i) != l) return 0;
            /* the slot is on its bucket's chain */
            uint32_t j = g->bucket[bucket_of(g, fp_at(g, i))];
            uint64_t steps = 0;
            while (j != IKV_NIL && j != i && steps++ < g->cap)
                j = g->slot[j].hnext;
            if (j != i) return 0;
            prev = i;
            if (++n > g->cap) return 0;
        }
        if (prev != g->tail[l] || n != g->n[l]) return 0;
        listed += n;
    }
    uint64_t nfree = 0;
    for (uint32_t i = g->free; i != IKV_NIL; i = g->slot[i].next)
        if (i >= g->cap || ++nfree > g->cap) return 0;
    if (listed + nfree != g->cap) return 0;
    /* every chain entry is a listed slot in the right bucket: chain lengths sum to listed */
    uint64_t chained = 0;
    for (uint32_t b = 0; b < g->nbuckets; b++)
        for (uint32_t j = g->bucket[b]; j != IKV_NIL; j = g->slot[j].hnext) {
            if (j >= g->cap || bucket_of(g, fp_at(g, j)) != b || ++chained > listed) return 0;
        }
    return chained == listed;
}

int ikv__ghostq_arc_directory(ikv__ghostq *g, uint64_t t1, uint64_t t2, uint64_t c, int x_from) {
    if (x_from >= 0) return 0; /* cases II and III: REPLACE only */
    uint64_t b1 = ikv__ghostq_len(g, 0), total = t1 + t2 + b1 + ikv__ghostq_len(g, 1);
    if (t1 + b1 >= c) {
        if (!b1) return 1;
        ikv__ghostq_drop_oldest(g, 0);
        return 0;
    }
    if (total >= 2 * c) ikv__ghostq_drop_oldest(g, 1);
    return 0;
}

int ikv__ghostq_arc_adapt(ikv__ghostq *g, ikv_key k, double c, double *p) {
    uint32_t slot;
    return ikv__ghostq_arc_adapt_slot(g, k, c, p, &slot);
}

int ikv__ghostq_arc_adapt_slot(ikv__ghostq *g, ikv_key k, double c, double *p, uint32_t *slot) {
    int l = ikv__ghostq_take_slot(g, k, slot);
    double b1 = (double)ikv__ghostq_len(g, 0) + (l == 0);
    double b2 = (double)ikv__ghostq_len(g, 1) + (l == 1);
    if (l == 0) {
        double d = b2 / b1 > 1.0 ? b2 / b1 : 1.0;
        *p = *p + d < c ? *p + d : c;
    } else if (l == 1) {
        double d = b1 / b2 > 1.0 ? b1 / b2 : 1.0;
        *p = *p - d > 0 ? *p - d : 0;
    }
    return l;
}
