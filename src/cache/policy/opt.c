/*
 * opt: Belady's offline optimum (L. A. Belady, "A study of replacement algorithms for a
 * virtual-storage computer", IBM Systems Journal 5(2), 1966): evict the block whose next use
 * is farthest in the future.
 *
 * The caller supplies next-use times (ikv_access.next_use, IKV_NEVER for none), usually from a
 * first pass over a trace; a block's next use is refreshed at every insert and hit. Victims are
 * chosen only among evictable leaves, like every policy, so this is the optimum under the same
 * leaf-only and lock rules (in a prefix tree a parent is used whenever its child is, so its next
 * use is never later than its children's: the leaf restriction costs little). Heap keyed by
 * -next_use: O(log n) per event. A demoted block keeps its next use when the slower tier also
 * runs opt.
 */
#include "../internal.h"

typedef struct opt {
    ikv__heap_policy hp; /* first: the shared heap ops (ikv__hp_*) take the state as this */
} opt;

#define NEXT(n) ((n)->pol.u64[0])

static int opt_create(const ikv__policy_env *env, const char *params, void **out) {
    if (params && *params) return ikv_error(IKV_EPARAM, "opt takes no parameters ('%s')", params);
    opt *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    if (ikv__heap_init(&p->hp.h, env)) {
        ikv_free(p);
        return IKV_ENOMEM;
    }
    p->hp.nodes = env->nodes;
    *out = p;
    return 0;
}

static void opt_destroy(void *s) {
    opt *p = s;
    if (!p) return;
    ikv__heap_free(&p->hp.h);
    ikv_free(p);
}

static double key_of(uint64_t next) {
    return -(double)next;
}

static void opt_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    opt *p = s;
    ikv__node *n = &p->hp.nodes[id];
    if (a) NEXT(n) = a->next_use ? a->next_use[pos] : IKV_NEVER;
    IKV__HKEY(n) = key_of(NEXT(n));
}

static void opt_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    opt *p = s;
    ikv__node *n = &p->hp.nodes[id];
    NEXT(n) = a && a->next_use ? a->next_use[pos] : IKV_NEVER;
    if (n->flags & IKV__QUEUED) ikv__heap_update(&p->hp.h, p->hp.nodes, id, key_of(NEXT(n)));
    else IKV__HKEY(n) = key_of(NEXT(n));
}

static size_t opt_bytes(const void *s) {
    const opt *p = s;
    return (size_t)p->hp.h.cap * sizeof(ikv__hslot);
}

/* opt always reads next-use times. */
static int opt_offline(const char *params) {
    (void)params;
    return 1;
}

const ikv_policy_ops ikv_policy_opt = {
    .name = "opt",
    .doc = "Belady's offline optimum: farthest next use (needs next-use times)",
    .create = opt_create,
    .destroy = opt_destroy,
    .admit = opt_admit,
    .hit = opt_hit,
    .queue = ikv__hp_queue,
    .dequeue = ikv__hp_dequeue,
    .leave = ikv__hp_leave,
    .victim = ikv__hp_victim,
    .check = ikv__hp_check,
    .queued = ikv__hp_queued,
    .bytes = opt_bytes,
    .offline = opt_offline,
};
