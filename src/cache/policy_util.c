/*
 * Building blocks shared by the eviction policies: an intrusive doubly linked list of node ids
 * (threaded through pol.s.prev/next), an indexed 4-ary min-heap of node ids with float keys, and
 * "k=v,k=v" parameter parsing.
 *
 * Ordered list insertion. Only evictable blocks sit on a queue, and a block becomes evictable
 * again at a time that is not "now" (its last child was evicted, its request unlocked it, its pin
 * expired). ikv__list_insert_ordered puts it back where its own timestamp says, walking from the
 * nearer end. In a prefix tree this is cheap: a parent whose last child was just evicted was last
 * used no later than that child's newest sibling, and the child was the oldest block on the
 * queue, so the walk from the tail stops at once in the common case; an unlocked block was used
 * recently, so the walk from the head is short.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

void ikv__list_init(ikv__list *l) {
    l->head = l->tail = IKV_NIL;
    l->len = 0;
}

void ikv__list_push_head(ikv__list *l, ikv__node *nodes, uint32_t id) {
    ikv__node *n = &nodes[id];
    n->pol.s.prev = IKV_NIL;
    n->pol.s.next = l->head;
    if (l->head != IKV_NIL) nodes[l->head].pol.s.prev = id;
    else l->tail = id;
    l->head = id;
    l->len++;
}

void ikv__list_push_tail(ikv__list *l, ikv__node *nodes, uint32_t id) {
    ikv__node *n = &nodes[id];
    n->pol.s.next = IKV_NIL;
    n->pol.s.prev = l->tail;
    if (l->tail != IKV_NIL) nodes[l->tail].pol.s.next = id;
    else l->head = id;
    l->tail = id;
    l->len++;
}

/* Links id right after `prev` (towards the tail); prev may be IKV_NIL for the head. */
static void list_insert_after(ikv__list *l, ikv__node *nodes, uint32_t prev, uint32_t id) {
    if (prev == IKV_NIL) {
        ikv__list_push_head(l, nodes, id);
        return;
    }
    uint32_t next = nodes[prev].pol.s.next;
    if (next == IKV_NIL) {
        ikv__list_push_tail(l, nodes, id);
        return;
    }
    nodes[id].pol.s.prev = prev;
    nodes[id].pol.s.next = next;
    nodes[prev].pol.s.next = id;
    nodes[next].pol.s.prev = id;
    l->len++;
}

void ikv__list_remove(ikv__list *l, ikv__node *nodes, uint32_t id) {
    ikv__node *n = &nodes[id];
    if (n->pol.s.prev != IKV_NIL) nodes[n->pol.s.prev].pol.s.next = n->pol.s.next;
    else l->head = n->pol.s.next;
    if (n->pol.s.next != IKV_NIL) nodes[n->pol.s.next].pol.s.prev = n->pol.s.prev;
    else l->tail = n->pol.s.prev;
    n->pol.s.prev = n->pol.s.next = IKV_NIL;
    l->len--;
}

void ikv__list_insert_ordered(ikv__list *l, ikv__node *nodes, uint32_t id,
                              uint64_t (*key)(const ikv__node *)) {
    uint64_t k = key(&nodes[id]);
    if (l->head == IKV_NIL || key(&nodes[l->head]) <= k) {
        ikv__list_push_head(l, nodes, id);
        return;
    }
    if (key(&nodes[l->tail]) >= k) {
        ikv__list_push_tail(l, nodes, id);
        return;
    }
    /* Strictly inside: walk from whichever end's neighbour is closer in key. */
    uint64_t kh = key(&nodes[l->head]), kt = key(&nodes[l->tail]);
    if (kh - k <= k - kt) {
        uint32_t p = l->head; /* key(p) > k; find the last such p */
        while (nodes[p].pol.s.next != IKV_NIL && key(&nodes[nodes[p].pol.s.next]) > k)
            p = nodes[p].pol.s.next;
        list_insert_after(l, nodes, p, id);
    } else {
        uint32_t q = l->tail; /* key(q) < k; find the first (towards head) with key >= k */
        while (nodes[q].pol.s.prev != IKV_NIL && key(&nodes[nodes[q].pol.s.prev]) < k)
            q = nodes[q].pol.s.prev;
        list_insert_after(l, nodes, nodes[q].pol.s.prev, id);
    }
}

int ikv__list_check(const ikv__list *l, const ikv__node *nodes, uint64_t *count) {
    uint64_t n = 0;
    uint32_t prev = IKV_NIL;
    for (uint32_t id = l->head; id != IKV_NIL; id = nodes[id].pol.s.next) {
        if (nodes[id].pol.s.prev != prev) return 0;
        if (!(nodes[id].flags & IKV__QUEUED)) return 0;
        prev = id;
        if (++n > l->len) return 0;
    }
    if (prev != l->tail || n != l->len) return 0;
    if (count) *count += n;
    return 1;
}

/* ---- heap --------------------------------------------------------------------------------- */

int ikv__heap_init(ikv__heap *h, const ikv__policy_env *env) {
    uint64_t cap = env->capacity;
    h->slot = ikv_malloc((size_t)(cap ? cap : 1) * sizeof *h->slot);
    if (!h->slot) return IKV_ENOMEM;
    h->len = 0;
    h->cap = cap;
    return 0;
}

void ikv__heap_free(ikv__heap *h) {
    ikv_free(h->slot);
    h->slot = NULL;
    h->len = h->cap = 0;
}

/* Float keys order the heap; rounding to float is monotone, so only equal floats can hide an
 * order, and those are decided by the exact double key in the node (then by id). Exact order
 * at the price of a node read on float ties only (opt's next-use times past 2^24 tie often). */
static inline int less(const ikv__node *nodes, ikv__hslot a, ikv__hslot b) {
    if (a.key != b.key) return a.key < b.key;
    double ea = IKV__HKEY(&nodes[a.id]), eb = IKV__HKEY(&nodes[b.id]);
    return ea < eb || (ea == eb && a.id < b.id);
}

static inline void place(ikv__heap *h, ikv__node *nodes, uint64_t i, ikv__hslot s) {
    h->slot[i] = s;
    nodes[s.id].hpos = (uint32_t)i;
}

static void sift_up(ikv__heap *h, ikv__node *nodes, uint64_t i) {
    ikv__hslot s = h->slot[i];
    while (i > 0) {
        uint64_t p = (i - 1) / 4;
        if (!less(nodes, s, h->slot[p])) break;
        place(h, nodes, i, h->slot[p]);
        i = p;
    }
    place(h, nodes, i, s);
}

static void sift_down(ikv__heap *h, ikv__node *nodes, uint64_t i) {
    ikv__hslot s = h->slot[i];
    for (;;) {
        uint64_t c = 4 * i + 1;
        if (c >= h->len) break;
        uint64_t end = c + 4 < h->len ? c + 4 : h->len, best = c;
        for (uint64_t k = c + 1; k < end; k++)
            if (less(nodes, h->slot[k], h->slot[best])) best = k;
        if (!less(nodes, h->slot[best], s)) break;
        place(h, nodes, i, h->slot[best]);
        i = best;
    }
    place(h, nodes, i, s);
}

void ikv__heap_push(ikv__heap *h, ikv__node *nodes, uint32_t id, double key) {
    IKV_ASSERT(h->len < h->cap);
    IKV__HKEY(&nodes[id]) = key;
    ikv__hslot s = {(float)key, id};
    place(h, nodes, h->len++, s);
    sift_up(h, nodes, h->len - 1);
}

void ikv__heap_remove(ikv__heap *h, ikv__node *nodes, uint32_t id) {
    uint64_t i = nodes[id].hpos;
    IKV_ASSERT(i < h->len && h->slot[i].id == id);
    ikv__hslot last = h->slot[--h->len];
    if (i == h->len) return;
    place(h, nodes, i, last);
    sift_down(h, nodes, i);
    sift_up(h, nodes, nodes[last.id].hpos);
}

void ikv__heap_update(ikv__heap *h, ikv__node *nodes, uint32_t id, double key) {
    IKV__HKEY(&nodes[id]) = key;
    uint64_t i = nodes[id].hpos;
    h->slot[i].key = (float)key;
    sift_down(h, nodes, i);
    sift_up(h, nodes, nodes[id].hpos);
}

int ikv__heap_check(const ikv__heap *h, const ikv__node *nodes) {
    for (uint64_t i = 0; i < h->len; i++) {
        ikv__hslot s = h->slot[i];
        if (nodes[s.id].hpos != i || !(nodes[s.id].flags & IKV__QUEUED)) return 0;
        if (s.key != (float)IKV__HKEY(&nodes[s.id])) return 0;
        if (i > 0 && less(nodes, s, h->slot[(i - 1) / 4])) return 0;
    }
    return 1;
}

/* ---- heap-ordered policies ------------------------------------------------------------------ */

void ikv__hp_queue(void *s, uint32_t id) {
    ikv__heap_policy *p = s;
    ikv__heap_push(&p->h, p->nodes, id, IKV__HKEY(&p->nodes[id]));
}

void ikv__hp_dequeue(void *s, uint32_t id) {
    ikv__heap_policy *p = s;
    ikv__heap_remove(&p->h, p->nodes, id);
}

void ikv__hp_leave(void *s, uint32_t id) {
    (void)s, (void)id;
}

uint32_t ikv__hp_victim(void *s) {
    return ikv__heap_top(&((ikv__heap_policy *)s)->h);
}

int ikv__hp_check(const void *s) {
    const ikv__heap_policy *p = s;
    return ikv__heap_check(&p->h, p->nodes);
}

uint64_t ikv__hp_queued(const void *s) {
    return ((const ikv__heap_policy *)s)->h.len;
}

/* ---- parameters ---------------------------------------------------------------------------- */

int ikv__params_each(const char *params, int (*fn)(void *ctx, const char *k, const char *v),
                     void *ctx) {
    if (!params || !*params) return 0;
    char buf[256];
    size_t n = strlen(params);
    if (n >= sizeof buf) return ikv_error(IKV_EPARAM, "policy parameters too long: '%s'", params);
    memcpy(buf, params, n + 1);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv || !eq[1])
            return ikv_error(IKV_EPARAM, "policy parameter '%s' is not key=value", kv);
        *eq = 0;
        int rc = fn(ctx, kv, eq + 1);
        if (rc) return rc;
    }
    return 0;
}

int ikv__param_double(const char *policy, const char *k, const char *v, double lo, double hi,
                      double *out) {
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end || !(d >= lo && d <= hi))
        return ikv_error(IKV_EPARAM, "%s: parameter %s=%s must be a number in [%g, %g]", policy,
                         k, v, lo, hi);
    *out = d;
    return 0;
}

int ikv__param_whole(const char *policy, const char *k, const char *v, double lo, double hi,
                     double *out) {
    double d;
    int rc = ikv__param_double(policy, k, v, lo, hi, &d);
    if (!rc && d != (double)(long long)d)
        rc = ikv_error(IKV_EPARAM, "%s: parameter %s=%s must be a whole number in [%g, %g]",
                       policy, k, v, lo, hi);
    if (!rc) *out = d;
    return rc;
}
