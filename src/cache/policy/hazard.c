/*
 * hazard: which idle conversation is least likely to be back within the next h milliseconds
 * (issue 15; docs/policies.md, "Ranking by when the client comes back (`hazard`)").
 *
 * In an agent's conversation every request re-reads the whole chain, so a prefix cache's real
 * choice is which conversations to keep, and the right one to drop is the one that comes back
 * last. What a server knows of that is how the conversation's last response ended
 * (ikv_access.hint: a tool call pending, or the turn over) and how long ago that request came.
 * This policy learns, per hint class (none, tool call pending, turn ended), the distribution of
 * the gap between a request's arrival and its session's next request, and evicts the block
 * whose class makes a return within h (default 20 s) least likely given the time since its
 * last access:
 *
 *     P(back within h | class, idle a) = (F(a + h) - F(a)) / (n - F(a) + 1)
 *
 * where F(x) counts the class's observed gaps <= x (n in all; the + 1 is a pseudo-observation
 * of a client that never came back, so an idle time longer than any seen gives 0). The gap
 * includes the response's own time, so P is low both just after a request (its response and
 * the tool still run) and long after (abandoned): the candidates are both ends of each class's
 * LRU list of evictable blocks. O(1) per event, O(bins) to refresh a class's cumulative counts
 * after it learned a gap.
 *
 * Inside ARC's lists (arc=1, the default; arc.c, FAST'03 Fig. 4): every block is also in T1
 * or T2 (pol.s.b), with exact ghosts B1/B2 and the target p adapted on ghost hits; ARC's
 * directory rules and REPLACE choose the list (ikv__ghostq_arc_directory,
 * ikv__ghostq_arc_replace_list, shared with arc.c) and the ranking the block within it, so a
 * conversation hit since it entered keeps ARC's protection against the one-off chains (WEKA 2M /
 * 355: 45% of the lru -> opt gap against 35% for arc=0). arc=0: one set of lists, the ranking
 * alone.
 *
 * Clock: ikv_access.clock_ms; a caller that gives none falls back to the logical clock
 * (ikv_access.now), and h is then in its units. Sessions: ikv_access.scope; a direct-mapped
 * table (the power of two >= an eighth of the tier's capacity, within 2^12 and 2^20 entries,
 * 32 bytes each: at most 8 bytes a block from 2^15 blocks) keeps each session's last request
 * time and class; a session whose entry another took starts over (no chaining: the budget is
 * fixed). A request's first access learns the gap since its session's previous request.
 *
 * The ranking starts with the first hinted access: before it (traffic that never says how its
 * responses end: the Mooncake and synthetic traces, the golden slice) every P counts as 0 and
 * the oldest candidate goes, so the policy is exactly arc (arc=0: lru; test_golden_mooncake and
 * test_hazard_without_hints hold it to that). Ranking such traffic by one class's gaps was
 * measured and lost to ARC's recency (docs/policies.md). Parameters: h (ms, default 20000),
 * arc (1; 0). Gaps are binned 4 per octave of milliseconds up to 2^28 ms (3 days), linear within
 * a bin.
 * Node fields: pol.s.prev/next (its list), pol.s.a (the class), pol.s.b (bit 0: T1 or T2; LISTED:
 * on a list), pol.s.x (the clock of its last access). Membership is the policy's own bit, not the
 * core's IKV__QUEUED: `auto` (auto.c) keeps this policy unqueued while another one chooses. Memory:
 * the session table, and with arc=1 24 bytes of ghost per block. Nothing allocated after create.
 */
#include "../internal.h"
#include "ghostq.h"

#include <math.h>
#include <string.h>

#define NCLS     3            /* ikv_hint: none, soon, turn */
#define NBIN     (1 + 4 * 28) /* bin 0: [0, 1) ms; bin b >= 1: [2^((b-1)/4), 2^(b/4)) ms */
#define SESS_MIN 4096u
#define SESS_MAX (1u << 20)
#define LISTED   2u                  /* pol.s.b: the block is on one of this policy's lists */
#define ARCL(n)  ((n)->pol.s.b & 1u) /* its ARC list: 0 T1, 1 T2 (0 with arc=0) */

typedef struct hz_sess {
    uint64_t scope; /* 0 = empty */
    uint64_t t;     /* the clock of the session's last request */
    uint64_t req;   /* ikv_access.now of that request (accesses of one request count once) */
    uint64_t cls;   /* the class of that response */
} hz_sess;

typedef struct hazard {
    ikv__list q[2][NCLS]; /* evictable blocks per ARC list (arc=1; else 0) and class */
    /* arc=1: ARC's lists around the ranking (arc.c): T1/T2 membership in pol.s.b */
    double arc;
    ikv__ghostq ghost;
    uint64_t res[2], c;
    double p_t1;
    uint32_t pending;
    int pending_ghost;
    ikv_key x;
    int x_valid, x_from;
    ikv__node *nodes;
    const uint64_t *now;
    double h;       /* the horizon, clock units */
    uint64_t clock; /* the latest access's clock */
    int wall;       /* an access gave clock_ms: the clock is the wall clock from then on */
    int hinted;     /* an access came with a hint: the traffic says how responses end */
    hz_sess *sess;
    uint64_t nsess;             /* entries, a power of two */
    double cnt[NCLS][NBIN];     /* observed idle gaps per class and bin */
    double cum[NCLS][NBIN + 1]; /* prefix sums of cnt (valid unless dirty) */
    double edge[NBIN + 1];      /* bin b is [edge[b], edge[b + 1]) ms */
    double tot[NCLS];
    int dirty[NCLS];
} hazard;

static uint32_t bin_of(double g) {
    if (g < 1) return 0;
    double b = 1 + floor(4 * log2(g));
    return b >= NBIN - 1 ? NBIN - 1 : (uint32_t)b;
}

/* The bins' edges: 0, then 2^((b-1)/4) for b >= 1 (computed once: the victim reads them). */
static void init_edges(double *edge) {
    edge[0] = 0;
    for (uint32_t b = 1; b <= NBIN; b++) edge[b] = exp2((double)(b - 1) / 4);
}

/* F(x): the class's observed gaps <= x, linear within x's bin. */
static double cdf(hazard *p, int c, double x) {
    if (p->dirty[c]) {
        p->cum[c][0] = 0;
        for (uint32_t b = 0; b < NBIN; b++)
            p->cum[c][b + 1] = p->cum[c][b] + p->cnt[c][b];
        p->dirty[c] = 0;
    }
    if (x < 0) return 0;
    uint32_t b = bin_of(x);
    double lo = p->edge[b], hi = p->edge[b + 1];
    double f = x >= hi ? 1 : x <= lo ? 0 : (x - lo) / (hi - lo);
    return p->cum[c][b] + p->cnt[c][b] * f;
}

/* P(back within h | class c, idle a), as in the header. */
static double p_back(hazard *p, int c, double a) {
    double fa = cdf(p, c, a);
    return (cdf(p, c, a + p->h) - fa) / (p->tot[c] - fa + 1);
}

static int set_param(void *ctx, const char *k, const char *v) {
    hazard *p = ctx;
    if (!strcmp(k, "h")) return ikv__param_double("hazard", k, v, 1, 1e9, &p->h);
    if (!strcmp(k, "arc")) return ikv__param_whole("hazard", k, v, 0, 1, &p->arc);
    return ikv_error(IKV_EPARAM, "hazard: unknown parameter '%s' (h, arc)", k);
}

static void hazard_destroy(void *s) {
    hazard *p = s;
    if (!p) return;
    ikv_free(p->sess);
    if (p->arc > 0) ikv__ghostq_free(&p->ghost);
    ikv_free(p);
}

static int hazard_create(const ikv__policy_env *env, const char *params, void **out) {
    hazard *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->h = 20000;
    p->arc = 1;
    int rc = ikv__params_each(params, set_param, p);
    uint64_t n = SESS_MIN;
    while (n < env->capacity / 8 && n < SESS_MAX)
        n *= 2; /* sessions hold many blocks each */
    if (!rc && !(p->sess = ikv_calloc(n, sizeof *p->sess))) rc = IKV_ENOMEM;
    if (!rc && p->arc > 0 && ikv__ghostq_init(&p->ghost, env->capacity)) rc = IKV_ENOMEM;
    if (rc) {
        hazard_destroy(p);
        return rc;
    }
    p->c = env->capacity;
    p->pending = IKV_NIL;
    p->x_from = -1;
    p->nsess = n;
    init_edges(p->edge);
    for (int l = 0; l < 2; l++)
        for (int c = 0; c < NCLS; c++)
            ikv__list_init(&p->q[l][c]);
    p->nodes = env->nodes;
    p->now = env->now;
    *out = p;
    return 0;
}

static inline int class_of(const ikv_access *a) {
    return a && (a->hint == IKV_HINT_SOON || a->hint == IKV_HINT_TURN) ? a->hint : IKV_HINT_NONE;
}

/* An access of node n by request a: the request's first access learns its session's gap (since
 * the session's previous request, in that request's class) and records this request; the node
 * takes the request's class and clock. An access without clock_ms in traffic that has one
 * takes the latest wall time seen (not the logical time, which would look hours old). */
static void touch(hazard *p, ikv__node *n, const ikv_access *a) {
    if (a && a->clock_ms) p->wall = 1;
    uint64_t clock = a && a->clock_ms ? a->clock_ms : p->wall ? p->clock : *p->now;
    int c = class_of(a);
    if (clock > p->clock) p->clock = clock;
    if (c != IKV_HINT_NONE) p->hinted = 1;
    if (a && a->scope) {
        uint64_t i = (a->scope * 0x9e3779b97f4a7c15ull) >> 32 & (p->nsess - 1);
        hz_sess *e = &p->sess[i];
        if (e->scope != a->scope || e->req != a->now) {
            if (e->scope == a->scope && e->t) {
                double g = clock > e->t ? (double)(clock - e->t) : 0;
                p->cnt[e->cls][bin_of(g)] += 1;
                p->tot[e->cls] += 1;
                p->dirty[e->cls] = 1;
            }
            *e = (hz_sess){.scope = a->scope, .t = clock, .req = a->now, .cls = (uint64_t)c};
        }
    }
    n->pol.s.a = (uint32_t)c;
    n->pol.s.x = clock;
}

/* The list a node is queued on: its ARC list's (arc=1), its class's. */
static inline ikv__list *list_of(hazard *p, const ikv__node *n) {
    return &p->q[ARCL(n)][n->pol.s.a];
}

/* arc=1: ARC's cases II and III (arc.c): a ghost hit adapts p before REPLACE. */
static void hazard_miss(void *s, ikv_key k) {
    hazard *p = s;
    if (p->arc <= 0) return;
    p->x_from = ikv__ghostq_arc_adapt(&p->ghost, k, (double)p->c, &p->p_t1);
    p->x = k;
    p->x_valid = 1;
}

static uint64_t last_of(const ikv__node *n) {
    return n->last;
}

/* A block entering the tier: its ARC list (arc=1: T2 if the announced miss was a ghost hit),
 * and from the request its class and clock. A block moved from another tier (a = NULL) starts
 * in class none, idle from now: that tier's policy fields may be another policy's, and a
 * hazard there cannot be told from one that is not (a promotion right after a hinted hit in
 * the lower tier so loses that hit's class; the next access sets it again). */
static void hazard_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)pos;
    hazard *p = s;
    ikv__node *n = &p->nodes[id];
    n->pol.s.b = 0;
    if (p->arc > 0) {
        if (!p->x_valid || !ikv_key_eq(p->x, n->key)) hazard_miss(p, n->key);
        n->pol.s.b = p->x_from >= 0 ? 1 : 0;
        p->res[ARCL(n)]++;
        p->x_valid = 0;
        p->x_from = -1;
    }
    if (a) {
        touch(p, n, a);
    } else {
        n->pol.s.a = IKV_HINT_NONE;
        n->pol.s.x = p->clock;
    }
}

/* A hit: the block takes the request's class and clock, moves to its (new) list's head if it is
 * listed, and with arc=1 to T2 (ARC's case I). */
static void hazard_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    (void)pos;
    hazard *p = s;
    ikv__node *n = &p->nodes[id];
    int queued = (n->pol.s.b & LISTED) != 0;
    if (queued) ikv__list_remove(list_of(p, n), p->nodes, id);
    touch(p, n, a);
    if (p->arc > 0 && ARCL(n) == 0) { /* ARC case I: a hit moves the block to T2 */
        p->res[0]--;
        p->res[1]++;
        n->pol.s.b |= 1u;
    }
    if (queued) ikv__list_push_head(list_of(p, n), p->nodes, id);
}

/* Evictable: onto its list at the place its last access gives (ordered, as lru's). */
static void hazard_queue(void *s, uint32_t id) {
    hazard *p = s;
    ikv__list_insert_ordered(list_of(p, &p->nodes[id]), p->nodes, id, last_of);
    p->nodes[id].pol.s.b |= LISTED;
}

/* No longer evictable: off its list. */
static void hazard_dequeue(void *s, uint32_t id) {
    hazard *p = s;
    ikv__list_remove(list_of(p, &p->nodes[id]), p->nodes, id);
    p->nodes[id].pol.s.b &= ~LISTED;
}

/* Leaving the tier (arc=1): the resident counts, and the victim's key into B1 or B2 (arc.c). */
static void hazard_leave(void *s, uint32_t id) {
    hazard *p = s;
    if (p->arc <= 0) return;
    ikv__node *n = &p->nodes[id];
    p->res[ARCL(n)]--;
    if (id != p->pending) return;
    p->pending = IKV_NIL;
    if (p->pending_ghost) ikv__ghostq_add(&p->ghost, n->key, (int)ARCL(n));
}

/* Of the oldest and newest evictable block of each class of ARC list l, the one least likely
 * to be back within h; ties to the older block. IKV_NIL if l has none. */
static uint32_t pick(hazard *p, int l) {
    uint32_t best = IKV_NIL;
    double bp = 0;
    for (int c = 0; c < NCLS; c++)
        for (int end = 0; end < 2; end++) {
            uint32_t t = end ? p->q[l][c].head : p->q[l][c].tail;
            if (t == IKV_NIL) continue;
            const ikv__node *n = &p->nodes[t];
            double idle = p->clock > n->pol.s.x ? (double)(p->clock - n->pol.s.x) : 0;
            double pb = p->hinted ? p_back(p, c, idle) : 0; /* no hints: by recency */
            if (best == IKV_NIL || pb < bp || (pb == bp && n->last < p->nodes[best].last))
                best = t, bp = pb;
        }
    return best;
}

/* arc=1: REPLACE(x, p) (arc.c) chooses the list; the ranking chooses the block in it. */
static uint32_t replace(hazard *p) {
    int l =
        ikv__ghostq_arc_replace_list(p->res[0], p->res[1], p->p_t1, p->x_valid ? p->x_from : -1);
    uint32_t id = pick(p, l);
    if (id == IKV_NIL) id = pick(p, !l);
    p->pending_ghost = 1;
    return p->pending = id;
}

/* arc=0: the ranking's pick of all lists. arc=1: ARC's case IV directory rules, then REPLACE
 * (arc.c), the ranking choosing within the list. */
static uint32_t hazard_victim(void *s) {
    hazard *p = s;
    if (p->arc <= 0) return pick(p, 0);
    if (ikv__ghostq_arc_directory(&p->ghost, p->res[0], p->res[1], p->c,
                                  p->x_valid ? p->x_from : -1)) {
        uint32_t id = pick(p, 0); /* T1's choice leaves the directory (no ghost) */
        if (id != IKV_NIL) {
            p->pending_ghost = 0;
            return p->pending = id;
        }
    }
    return replace(p);
}

/* Each class's counts add up; every listed block is on the list of its class and ARC list, in
 * last-access order; with arc=1 ARC's counts, target and ghosts are within their bounds. */
static int hazard_check(const void *s) {
    const hazard *p = s;
    for (int c = 0; c < NCLS; c++) {
        double t = 0;
        for (uint32_t b = 0; b < NBIN; b++)
            t += p->cnt[c][b];
        if (t != p->tot[c]) return 0;
        for (uint32_t l = 0; l < 2; l++) {
            if (!ikv__list_check(&p->q[l][c], p->nodes, NULL)) return 0;
            if (p->arc <= 0 && l == 1 && p->q[l][c].len) return 0;
            for (uint32_t id = p->q[l][c].head; id != IKV_NIL; id = p->nodes[id].pol.s.next) {
                uint32_t nx = p->nodes[id].pol.s.next;
                const ikv__node *n = &p->nodes[id];
                if (n->pol.s.a != (uint32_t)c || ARCL(n) != l || !(n->pol.s.b & LISTED)) return 0;
                if (nx != IKV_NIL && p->nodes[nx].last > p->nodes[id].last) return 0;
            }
        }
    }
    if (p->arc > 0) {
        uint64_t ghosts = ikv__ghostq_len(&p->ghost, 0) + ikv__ghostq_len(&p->ghost, 1);
        if (p->res[0] + p->res[1] > p->c || ghosts > p->c || p->p_t1 < 0 ||
            p->p_t1 > (double)p->c || !ikv__ghostq_check(&p->ghost))
            return 0;
    }
    return 1;
}

/* Blocks on the lists (the core's evictable blocks, unless auto keeps this policy passive). */
static uint64_t hazard_queued(const void *s) {
    const hazard *p = s;
    uint64_t n = 0;
    for (int l = 0; l < 2; l++)
        for (int c = 0; c < NCLS; c++)
            n += p->q[l][c].len;
    return n;
}

/* The session table and, with arc=1, ARC's ghost lists. */
static size_t hazard_bytes(const void *s) {
    const hazard *p = s;
    return (size_t)p->nsess * sizeof(hz_sess) + (p->arc > 0 ? ikv__ghostq_bytes(&p->ghost) : 0);
}

const ikv_policy_ops ikv_policy_hazard = {
    .name = "hazard",
    .doc = "ARC's lists, and in them the conversation least likely back within h (learned gaps "
           "per hint; h=MS, default 20000; arc=0: without ARC)",
    .create = hazard_create,
    .destroy = hazard_destroy,
    .miss = hazard_miss,
    .admit = hazard_admit,
    .hit = hazard_hit,
    .queue = hazard_queue,
    .dequeue = hazard_dequeue,
    .leave = hazard_leave,
    .victim = hazard_victim,
    .check = hazard_check,
    .queued = hazard_queued,
    .bytes = hazard_bytes,
};
