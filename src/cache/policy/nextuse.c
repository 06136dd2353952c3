/*
 * The per-block next-use predictor of `value:nu=1` (nextuse.h): access histories in side
 * arrays indexed by node id and a binary min-heap of overdue deadlines over evictable blocks.
 *
 *     heap (array, 8-byte slots)        slot[i] = (deadline, id), hpos[id] = i
 *              (dl 7, #12)               parent of i: (i - 1) / 2; ties by id
 *            /            \
 *     (dl 9, #3)       (dl 40, #8)       top: the evictable block that went overdue first
 *
 * Invariants (ikv__nu_check): the heap is ordered by (dl, id); hpos[slot[i].id] == i for every
 * slot and hpos is IKV_NIL for every node not on it; every entry has a deadline; every
 * history is newest first with its unknown entries (0) at the end.
 */
#include "nextuse.h"

#include <string.h>

int ikv__nu_init(ikv__nu *u, uint64_t nodes, uint64_t capacity, int mode, int ngaps, int sessions,
                 int overdue) {
    memset(u, 0, sizeof *u);
    if (!nodes) nodes = 1;
    if (!capacity) capacity = 1;
    u->t = ikv_calloc(nodes, sizeof *u->t);
    if (overdue) {
        u->dl = ikv_malloc(nodes * sizeof *u->dl);
        u->hpos = ikv_malloc(nodes * sizeof *u->hpos);
        u->slot = ikv_malloc(capacity * sizeof *u->slot);
    }
    if (sessions) {
        uint64_t n = IKV__NU_SESS_MIN;
        while (n < capacity && n < IKV__NU_SESS_MAX)
            n <<= 1;
        u->sess = ikv_calloc(n, sizeof *u->sess);
        u->nsess = n;
    }
    if (!u->t || (overdue && (!u->dl || !u->hpos || !u->slot)) || (sessions && !u->sess)) {
        ikv__nu_free(u);
        return IKV_ENOMEM;
    }
    for (uint64_t i = 0; overdue && i < nodes; i++)
        u->dl[i] = IKV__NU_NONE, u->hpos[i] = IKV_NIL;
    u->nodes = nodes;
    u->cap = overdue ? capacity : 0;
    u->mode = mode;
    u->ngaps = ngaps < 1 ? 1 : ngaps > IKV__NU_HIST - 1 ? IKV__NU_HIST - 1 : ngaps;
    return 0;
}

void ikv__nu_free(ikv__nu *u) {
    ikv_free(u->t);
    ikv_free(u->dl);
    ikv_free(u->hpos);
    ikv_free(u->slot);
    ikv_free(u->sess);
    memset(u, 0, sizeof *u);
}

/* A time as the history stores it: 32 bits, never 0 (0 marks "no access"). */
static inline uint32_t t32(uint64_t now) {
    uint32_t t = (uint32_t)now;
    return t ? t : 1;
}

void ikv__nu_start(ikv__nu *u, uint32_t id, uint64_t now) {
    memset(u->t[id], 0, sizeof u->t[id]);
    u->t[id][0] = t32(now);
}

void ikv__nu_inherit(ikv__nu *u, uint32_t id, uint32_t parent) {
    memcpy(u->t[id], u->t[parent], sizeof u->t[id]);
}

void ikv__nu_resume(ikv__nu *u, uint32_t id, const uint32_t t[2]) {
    memset(u->t[id], 0, sizeof u->t[id]);
    u->t[id][0] = t[0];
    u->t[id][1] = t[0] ? t[1] : 0;
}

void ikv__nu_access(ikv__nu *u, uint32_t id, uint64_t now) {
    uint32_t *t = u->t[id], n = t32(now);
    if (t[0] == n) return; /* a second access in the same tick adds no gap */
    memmove(t + 1, t, (IKV__NU_HIST - 1) * sizeof *t);
    t[0] = n;
}

double ikv__nu_gap(const ikv__nu *u, uint32_t id) {
    const uint32_t *t = u->t[id];
    int n = u->mode == IKV__NU_LAST ? 1 : u->ngaps;
    double best = -1, sum = 0;
    int k = 0;
    for (; k < n && t[k + 1]; k++) {
        double g = (double)(uint32_t)(t[k] - t[k + 1]);
        if (k == 0 || (u->mode == IKV__NU_MAX && g > best) || (u->mode == IKV__NU_MIN && g < best))
            best = g;
        sum += g;
    }
    if (!k) return -1;
    return u->mode == IKV__NU_MEAN ? sum / k : best;
}

double ikv__nu_session(ikv__nu *u, uint64_t scope, uint64_t now) {
    if (!scope || !u->nsess) return -1;
    ikv__nu_sess *e = &u->sess[(scope * 0x9e3779b97f4a7c15ull >> 32) & (u->nsess - 1)];
    uint32_t t = t32(now);
    if (e->scope != scope) {
        e->scope = scope;
        e->t0 = t, e->t1 = 0;
    } else if (e->t0 != t) {
        e->t1 = e->t0, e->t0 = t;
    }
    return e->t1 ? (double)(uint32_t)(t - e->t1) : -1;
}

/* ---- the overdue heap ----------------------------------------------------------------------- */

static inline int before(ikv__nu_slot a, ikv__nu_slot b) {
    return a.dl < b.dl || (a.dl == b.dl && a.id < b.id);
}

static inline void put(ikv__nu *u, uint64_t i, ikv__nu_slot s) {
    u->slot[i] = s;
    u->hpos[s.id] = (uint32_t)i;
}

static void up(ikv__nu *u, uint64_t i) {
    ikv__nu_slot s = u->slot[i];
    while (i > 0) {
        uint64_t pa = (i - 1) / 2;
        if (!before(s, u->slot[pa])) break;
        put(u, i, u->slot[pa]);
        i = pa;
    }
    put(u, i, s);
}

static void down(ikv__nu *u, uint64_t i) {
    ikv__nu_slot s = u->slot[i];
    for (;;) {
        uint64_t c = 2 * i + 1;
        if (c >= u->len) break;
        if (c + 1 < u->len && before(u->slot[c + 1], u->slot[c])) c++;
        if (!before(u->slot[c], s)) break;
        put(u, i, u->slot[c]);
        i = c;
    }
    put(u, i, s);
}

static void heap_del(ikv__nu *u, uint32_t id) {
    uint64_t i = u->hpos[id];
    u->hpos[id] = IKV_NIL;
    if (--u->len == i) return;
    ikv__nu_slot s = u->slot[u->len];
    put(u, i, s);
    up(u, i);
    if (u->hpos[s.id] == i) down(u, i);
}

void ikv__nu_set_deadline(ikv__nu *u, uint32_t id, uint32_t dl, int queued) {
    if (!u->dl || u->dl[id] == dl) return;
    if (u->hpos[id] != IKV_NIL) heap_del(u, id);
    u->dl[id] = dl;
    if (queued) ikv__nu_queue(u, id);
}

void ikv__nu_queue(ikv__nu *u, uint32_t id) {
    if (!u->dl || u->dl[id] == IKV__NU_NONE || u->hpos[id] != IKV_NIL || u->len >= u->cap) return;
    u->slot[u->len].dl = u->dl[id];
    u->slot[u->len].id = id;
    u->hpos[id] = (uint32_t)u->len;
    u->len++;
    up(u, u->len - 1);
}

void ikv__nu_dequeue(ikv__nu *u, uint32_t id) {
    if (u->hpos && u->hpos[id] != IKV_NIL) heap_del(u, id);
}

uint32_t ikv__nu_overdue(const ikv__nu *u, uint64_t now) {
    if (!u->len || (uint64_t)u->slot[0].dl >= (uint64_t)t32(now)) return IKV_NIL;
    return u->slot[0].id;
}

size_t ikv__nu_bytes(const ikv__nu *u) {
    return (size_t)u->nodes * (sizeof *u->t + (u->dl ? sizeof *u->dl + sizeof *u->hpos : 0)) +
           (size_t)u->cap * sizeof *u->slot + (size_t)u->nsess * sizeof *u->sess;
}

int ikv__nu_check(const ikv__nu *u, int (*queued)(const void *ctx, uint32_t id), const void *ctx) {
    if (u->len > u->cap) return 0;
    for (uint64_t i = 0; i < u->len; i++) {
        ikv__nu_slot s = u->slot[i];
        if (s.id >= u->nodes || u->hpos[s.id] != i || s.dl != u->dl[s.id] || s.dl == IKV__NU_NONE)
            return 0;
        if (i > 0 && before(s, u->slot[(i - 1) / 2])) return 0;
        if (queued && !queued(ctx, s.id)) return 0;
    }
    uint64_t on = 0;
    for (uint64_t id = 0; id < u->nodes; id++) {
        if (u->hpos && u->hpos[id] != IKV_NIL) on++;
        const uint32_t *t = u->t[id];
        for (int k = 0; k + 1 < IKV__NU_HIST; k++)
            if (!t[k] && t[k + 1]) return 0;
    }
    for (uint64_t i = 0; i < u->nsess; i++) {
        const ikv__nu_sess *e = &u->sess[i];
        if ((!e->scope && (e->t0 || e->t1)) || (e->scope && !e->t0)) return 0;
    }
    return on == u->len;
}
