/*
 * mem: a host-memory slab of fixed slots, allocated (and touched) once at open.
 *
 * Placement is set-associative: the slots form nsets sets of W ways (W = 8, fewer when the
 * slab is tiny); a block lives in the set its (key, scope) hashes to. A put replaces the block
 * with the same (key, scope) in its set, else takes an empty way, else evicts the way written
 * longest ago (counted in `evictions`). So a full store evicts by write age within a set, and
 * a block can be evicted before the cache core would drop it when its set is full: that costs
 * a miss, never a wrong answer. Per slot an index entry (key, scope, write sequence, length)
 * sits apart from the slab so a lookup reads W small entries, not W slots.
 *
 * Cost: put/get O(W) plus one memcpy of the blob; nothing allocates after open.
 */
#include "internal.h"

#include <string.h>

#define WAYS 8

typedef struct entry {
    ikv_key key;
    uint64_t scope;
    uint64_t seq; /* 0 = empty */
    uint32_t len;
} entry;

typedef struct mem {
    uint8_t *slab; /* [nslots][slot_bytes] */
    entry *ix;     /* [nslots] */
    size_t slot_bytes;
    uint64_t nslots, nsets, ways, seq, resident, evictions;
} mem;

static int mem_open(const char *rest, const ikv_store_params *p, void **impl, uint64_t *cap) {
    uint64_t size;
    if (ikv_parse_size(rest, &size) || size == 0)
        return ikv_error(IKV_EPARAM, "tier mem:%s: expected mem:SIZE with SIZE > 0 (k/M/G)", rest);
    uint64_t nslots = size / p->slot_bytes;
    if (nslots == 0)
        return ikv_error(IKV_EPARAM, "tier mem:%s: %llu bytes hold no slot of %zu bytes", rest,
                         (unsigned long long)size, p->slot_bytes);
    mem *m = ikv_calloc(1, sizeof *m);
    if (!m) return ikv_error(IKV_ENOMEM, "mem store");
    m->ways = nslots < WAYS ? nslots : WAYS;
    m->nsets = nslots / m->ways;
    m->nslots = m->nsets * m->ways;
    m->slot_bytes = p->slot_bytes;
    m->slab = ikv_malloc(m->nslots * m->slot_bytes);
    m->ix = ikv_calloc(m->nslots, sizeof *m->ix);
    if (!m->slab || !m->ix) {
        ikv_free(m->slab), ikv_free(m->ix), ikv_free(m);
        return ikv_error(IKV_ENOMEM, "tier mem:%s: cannot allocate %llu bytes", rest,
                         (unsigned long long)(nslots * p->slot_bytes));
    }
    memset(m->slab, 0, m->nslots * m->slot_bytes); /* touch every page now, not on a put */
    *impl = m;
    *cap = m->nslots;
    return 0;
}

static void mem_close(void *impl) {
    mem *m = impl;
    if (!m) return;
    ikv_free(m->slab), ikv_free(m->ix), ikv_free(m);
}

/* The slot holding (key, scope), or UINT64_MAX; *set gets its set's first slot. */
static uint64_t find(const mem *m, ikv_key key, uint64_t scope, uint64_t *set) {
    uint64_t s0 = ikv__store_set(key, scope, m->nsets) * m->ways;
    if (set) *set = s0;
    for (uint64_t w = 0; w < m->ways; w++) {
        const entry *e = &m->ix[s0 + w];
        if (e->seq && ikv_key_eq(e->key, key) && e->scope == scope) return s0 + w;
    }
    return UINT64_MAX;
}

static void mem_put(void *impl, const ikv_key *keys, const uint64_t *scopes,
                    const void *const *blobs, const size_t *lens, size_t n, int *rcs) {
    mem *m = impl;
    for (size_t i = 0; i < n; i++) {
        uint64_t s0, slot = find(m, keys[i], scopes[i], &s0);
        if (slot == UINT64_MAX) {
            uint64_t oldest = UINT64_MAX;
            for (uint64_t w = 0; w < m->ways; w++) {
                uint64_t sq = m->ix[s0 + w].seq;
                if (sq < oldest) oldest = sq, slot = s0 + w;
            }
            if (oldest)
                m->evictions++;
            else
                m->resident++;
        }
        memcpy(m->slab + slot * m->slot_bytes, blobs[i], lens[i]);
        m->ix[slot] =
            (entry){.key = keys[i], .scope = scopes[i], .seq = ++m->seq, .len = (uint32_t)lens[i]};
        rcs[i] = 0;
    }
}

static void mem_get(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                    void *const *bufs, size_t cap, size_t *lens, int *rcs) {
    mem *m = impl;
    for (size_t i = 0; i < n; i++) {
        uint64_t slot = find(m, keys[i], scopes[i], NULL);
        if (slot == UINT64_MAX) {
            rcs[i] = IKV_ENOENT;
            continue;
        }
        if (m->ix[slot].len > cap) {
            rcs[i] = IKV_ECORRUPT;
            continue;
        }
        lens[i] = m->ix[slot].len;
        memcpy(bufs[i], m->slab + slot * m->slot_bytes, lens[i]);
        rcs[i] = 0;
    }
}

static int mem_exists(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                      uint8_t *found) {
    const mem *m = impl;
    for (size_t i = 0; i < n; i++)
        found[i] = find(m, keys[i], scopes[i], NULL) != UINT64_MAX;
    return 0;
}

static int mem_del(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n) {
    mem *m = impl;
    for (size_t i = 0; i < n; i++) {
        uint64_t slot = find(m, keys[i], scopes[i], NULL);
        if (slot == UINT64_MAX) continue;
        memset(&m->ix[slot], 0, sizeof m->ix[slot]);
        memset(m->slab + slot * m->slot_bytes, 0, IKV_BLOB_HDR);
        m->resident--;
    }
    return 0;
}

static void mem_stats(void *impl, ikv_store_stats *st) {
    const mem *m = impl;
    st->resident = m->resident;
    st->evictions = m->evictions;
}

/* Every used index entry names the blob in its slot, in the right set; resident adds up. */
static int mem_check(void *impl) {
    const mem *m = impl;
    uint64_t used = 0;
    for (uint64_t i = 0; i < m->nslots; i++) {
        const entry *e = &m->ix[i];
        if (!e->seq) continue;
        used++;
        ikv_key k;
        uint64_t sc;
        if (!ikv__blob_ident(m->slab + i * m->slot_bytes, &k, &sc, NULL) ||
            !ikv_key_eq(k, e->key) || sc != e->scope)
            return ikv_error(IKV_EINVAL,
                             "mem store: slot %llu holds another blob than its index says",
                             (unsigned long long)i);
        if (ikv__store_set(k, sc, m->nsets) != i / m->ways)
            return ikv_error(IKV_EINVAL, "mem store: slot %llu is outside its set",
                             (unsigned long long)i);
    }
    if (used != m->resident)
        return ikv_error(IKV_EINVAL, "mem store: %llu used slots, resident says %llu",
                         (unsigned long long)used, (unsigned long long)m->resident);
    return 1;
}

const ikv__store_ops ikv__store_mem = {
    .scheme = "mem",
    .doc = "mem:SIZE  host-memory slab of fixed slots (set-associative, oldest write evicted)",
    .shared = 0,
    .open = mem_open,
    .close = mem_close,
    .put = mem_put,
    .get = mem_get,
    .exists = mem_exists,
    .del = mem_del,
    .stats = mem_stats,
    .check = mem_check,
};
