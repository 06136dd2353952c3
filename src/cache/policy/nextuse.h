/*
 * A per-block next-use predictor for `value:nu=1` (issue 15): relaxed Belady in the spirit of
 * LRB (Song, Berger, Li, Lloyd, "Learning Relaxed Belady for Content Distribution Network
 * Caching", NSDI'20) — what matters is not the exact order of next uses but whether a block
 * comes back before the cache would drop it anyway.
 *
 * Per node (side arrays indexed by node id, sized for the node pool at creation, because the
 * node's 24-byte pol area is full):
 *
 *     t[id][0..3]  the logical times of its last 4 accesses, newest first (0 = none)   16 B
 *     dl[id]       its overdue deadline: last access + k x predicted gap (UINT32_MAX none) 4 B
 *     hpos[id]     its position in the overdue heap (IKV_NIL: not on it)                4 B
 *
 * (dl, hpos and the heap only with the overdue rule, value:nuk > 0).
 * With nusess=1 also a direct-mapped table of sessions (ikv_access.scope, "scope or session
 * id"): per entry the session id and its last two request times (16 bytes; as many entries as
 * the tier has blocks, rounded up to a power of two, within 2^12 and 2^20). A block with no gap of
 * its own (a first block, a chain re-inserted after its eviction) is predicted by its session's
 * last turn gap: the block's own gap had it stayed. A session whose entry another one took is
 * unknown again (no chaining: the table's budget is fixed).
 *
 * and one binary min-heap of (deadline, id) over the evictable blocks with a deadline, 8 bytes
 * per slot, sized for the tier's capacity. 16 bytes per node; with the overdue rule 24 per
 * node plus 8 per block of capacity.
 *
 * In a prefix cache a conversation's turn re-reads its whole prefix chain, so a block's own
 * inter-access gaps are its conversation's turn gaps; a new tail inserted with its parent in
 * the same request shares the parent's future, so it takes a copy of the parent's history
 * (ikv__nu_inherit). The predicted gap is one of: the last gap, the largest or the mean of the
 * last up to 3 gaps (mode); value decides with it whether the block comes back within its
 * class's eviction horizon (else it is doomed: evicted first), and ikv__nu_overdue names an
 * evictable block whose age passed k x its predicted gap (its conversation probably ended).
 *
 * Clock: value's logical clock (ikv_access.now: the request index in the simulator), cut to
 * 32 bits (times are differences of recent accesses). Cost: O(1) per access, O(log n) per
 * queue / dequeue / deadline change; nothing allocates after ikv__nu_init.
 */
#ifndef ISOKV_CACHE_POLICY_NEXTUSE_H
#define ISOKV_CACHE_POLICY_NEXTUSE_H

#include "../internal.h"

#define IKV__NU_HIST     4           /* access times kept per block */
#define IKV__NU_NONE     0xffffffffu /* no deadline */
#define IKV__NU_SESS_MIN 4096u       /* session table entries: the power of two >= the capacity, */
#define IKV__NU_SESS_MAX (1u << 20)  /* within these bounds (64 KiB to 16 MiB) */

enum { IKV__NU_LAST = 0, IKV__NU_MAX = 1, IKV__NU_MEAN = 2, IKV__NU_MIN = 3 };

typedef struct ikv__nu_slot {
    uint32_t dl, id;
} ikv__nu_slot;

typedef struct ikv__nu_sess {
    uint64_t scope;  /* session id, 0 = empty */
    uint32_t t0, t1; /* its latest and previous request times (0 = none) */
} ikv__nu_sess;

typedef struct ikv__nu {
    uint32_t (*t)[IKV__NU_HIST]; /* per node: last access times, newest first, 0 = none */
    uint32_t *dl;                /* per node: overdue deadline, IKV__NU_NONE = none */
    uint32_t *hpos;              /* per node: overdue-heap position, IKV_NIL = not on it */
    ikv__nu_slot *slot;          /* the overdue heap: cap slots, len used */
    uint64_t len, cap, nodes;
    int mode;  /* IKV__NU_LAST / MAX / MEAN / MIN: how the gaps make the prediction */
    int ngaps; /* gaps used (1..3) */
    /* sessions (nusess=1): direct-mapped table of the last two request times per session id
     * (ikv_access.scope), for blocks with no history of their own */
    ikv__nu_sess *sess;
    uint64_t nsess; /* entries (power of two; 0 = no table) */
    uint64_t taken; /* overdue victims handed out (tests, docs) */
} ikv__nu;

/* Sizes the history for `nodes` node ids; overdue != 0 adds the deadlines, heap positions and
 * the heap for `capacity` evictable blocks (without them the deadline and queue calls do
 * nothing and nothing is ever overdue); sessions != 0 adds a session table of the power of
 * two >= capacity entries (2^12 to 2^20).
 * 0 or IKV_ENOMEM (then nothing is held). */
int ikv__nu_init(ikv__nu *u, uint64_t nodes, uint64_t capacity, int mode, int ngaps, int sessions,
                 int overdue);
void ikv__nu_free(ikv__nu *u);

/* A block's first access at `now`: no gap is known. Does not allocate. */
void ikv__nu_start(ikv__nu *u, uint32_t id, uint64_t now);
/* A block inserted with its parent in one request takes the parent's access history. */
void ikv__nu_inherit(ikv__nu *u, uint32_t id, uint32_t parent);
/* A block back after its eviction takes the two access times its ghost kept (t[0] newest; 0 =
 * none) as its history; the caller then records the new access. */
void ikv__nu_resume(ikv__nu *u, uint32_t id, const uint32_t t[2]);
/* A new access of the block at `now` (a hit): shifts it into the history. */
void ikv__nu_access(ikv__nu *u, uint32_t id, uint64_t now);
/* The predicted gap to the block's next use (time units), < 0 when no gap is known. O(1). */
double ikv__nu_gap(const ikv__nu *u, uint32_t id);
/* The block's latest access time as the history has it (0 = none). */
static inline uint32_t ikv__nu_last(const ikv__nu *u, uint32_t id) {
    return u->t[id][0];
}
/* The session's last turn gap: now minus its previous request time (a request of the session
 * at `now` is recorded first; accesses within one request count once), or -1 when unknown
 * (scope 0, no table, a first request, or the entry was taken by another session). O(1). */
double ikv__nu_session(ikv__nu *u, uint64_t scope, uint64_t now);
/* Sets the block's overdue deadline (IKV__NU_NONE: none); `queued`: the block is evictable,
 * so its heap entry follows. O(log n). */
void ikv__nu_set_deadline(ikv__nu *u, uint32_t id, uint32_t dl, int queued);
/* The block became evictable / stopped being evictable. O(log n). */
void ikv__nu_queue(ikv__nu *u, uint32_t id);
void ikv__nu_dequeue(ikv__nu *u, uint32_t id);
/* The evictable block with the earliest deadline if that deadline is before `now`, else
 * IKV_NIL. O(1). */
uint32_t ikv__nu_overdue(const ikv__nu *u, uint64_t now);
size_t ikv__nu_bytes(const ikv__nu *u);
/* 1 if the heap is ordered, its positions and the nodes' hpos agree, every history is newest
 * first. `queued(ctx, id)` says whether id is evictable (each heap entry must be). O(nodes). */
int ikv__nu_check(const ikv__nu *u, int (*queued)(const void *ctx, uint32_t id), const void *ctx);

#endif
