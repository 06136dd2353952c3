/*
 * The engine: a KV block pool, the prefix cache over it, and the request flow.
 *
 * Pool. nblocks blocks of bt tokens each, allocated once (--kv-mem). One block holds, for
 * its bt positions, the K and V of every layer, laid out
 *
 *     [layer][k|v][kv_head][token][head_dim]     (fp32)
 *
 * so one (layer, K or V, kv head) of a block is a contiguous bt x head_dim matrix that
 * attention copies or reads in one piece. Per block the pool also keeps its state, its token
 * ids, its depth (block index in the prompt), the physical block before it, and (when cached)
 * its cache node and key.
 *
 *     state     owner           in the cache core?
 *     FREE      free stack      no
 *     PRIVATE   one sequence    no   (partial last block, decode blocks, uncacheable blocks)
 *     PENDING   cache           yes, locked by the sequence computing it
 *     READY     cache           yes; its KV is complete
 *
 * Capacity: the cache core holds at most `capacity` blocks; sequences hold private blocks out of
 * a budget of private_blocks (default max_seqs * max_blocks, max_blocks = ceil(seq_len / bt));
 * nblocks = capacity + private_blocks. Admission reserves, per sequence, the blocks it may
 * still need privately (its blocks up to prompt + max_new, minus the cached prefix it locks),
 * and refuses (IKV_EFULL) when the budget has no room (with ikv_request.reserve_new, only the
 * prompt and that many positions now; each later decode block is reserved one at a time by
 * ikv_seq_reserve_next, which fails when the budget is spent: the caller preempts). So a
 * sequence always finds free blocks for what it has reserved
 * once the core has made room: a block the core drops (on_evict, to_tier = -1) goes back to
 * the free stack at once, and parked blocks (below) are taken back when the stack is empty.
 *
 * Parked partial blocks. When a sequence ends, its last partial prompt block (n_prompt % bt
 * positions, computed by a prefill after a cached block) is parked instead of freed: a later
 * request whose prompt continues the same cached prefix with the same tokens copies those
 * positions' KV into its own block (copy-on-write) and computes only what follows; likewise a
 * prompt that ends exactly on a cached full block copies that block's first bt - 1 positions
 * and computes only its last one. So a resent identical prompt computes one position.
 *
 * Request (ikv_engine_begin):
 *   1. keys of the full prompt blocks, chained; blocks wholly inside the declared public
 *      prefix use the public scope, later ones the tenant's scope (base.h);
 *   2. ikv_cache_match -> longest resident prefix; each matched block is verified: READY,
 *      same depth, its previous block is the one matched before it, and the same token ids.
 *      The first block that fails ends the usable prefix (a hash collision costs a miss, never
 *      a wrong answer). At least one prompt position is always computed, so the last
 *      position's logits exist;
 *   3. lock the usable prefix, record the hit; insert the remaining full blocks, locked
 *      (only when the usable prefix is the whole resident one); give each new node a pool
 *      block (PENDING); the rest of the prompt gets PRIVATE blocks;
 *   4. copy-on-write of a cached or parked partial block's leading positions (above);
 *   5. prefill the uncached positions (forward.c), in one or more chunks (ikv_engine_step);
 *      mark each new block READY once its positions are computed;
 *   6. decode appends to PRIVATE blocks, batched across sequences (ikv_engine_step);
 *      ikv_engine_end unlocks, parks the partial block, frees the rest.
 * Steps 1-4 are ikv_engine_admit (no compute); ikv_engine_begin is admit + one step.
 *
 * Not thread-safe: one thread drives an engine (the server serializes on it).
 */
#include "internal.h"

#include "blas.h"
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

/* Tests: -1, or the only prefill scheme (0, 1) ikv_engine_create may pick. */
static int scheme_force = -1;

void ikv__prefill_scheme_force(int scheme) {
    scheme_force = scheme;
}

/* Tests/benchmarks: -1, or the int8 prefill scheme (1 int8 products, 0 dequantize + sgemm). */
static int q8_prefill_force = -1;

void ikv__q8_prefill_force(int mode) {
    q8_prefill_force = mode;
}

void ikv_engine_options_default(ikv_engine_options *o) {
    memset(o, 0, sizeof *o);
    o->block_tokens = 16;
    o->tile = 64;
    o->group = 8;
    o->max_seqs = 1;
    o->policy = "lru";
    o->key_seed = UINT64_C(0x69736f6b76656e67); /* "isokveng" */
}

static void pool_push(ikv_engine *e, uint32_t b) {
    IKV_ASSERT(e->state[b] != IKV__BLK_FREE && e->n_free < e->nblocks);
    e->state[b] = IKV__BLK_FREE;
    e->bnode[b] = IKV_NIL;
    e->free_stack[e->n_free++] = b;
}

/* Drops parked entry i (its block goes back to the free stack). */
static void park_drop(ikv_engine *e, uint32_t i) {
    IKV_ASSERT(i < e->n_parked && e->state[e->parked[i].blk] == IKV__BLK_PARKED);
    pool_push(e, e->parked[i].blk);
    e->parked[i] = e->parked[--e->n_parked];
}

/* The least recently parked or used entry, or IKV_NIL when none. */
static uint32_t park_oldest(const ikv_engine *e) {
    uint32_t best = IKV_NIL;
    for (uint32_t i = 0; i < e->n_parked; i++)
        if (e->state[e->parked[i].blk] == IKV__BLK_PARKED && /* not a source being copied */
            (best == IKV_NIL || e->parked[i].stamp < e->parked[best].stamp))
            best = i;
    return best;
}

/* A free block, reclaiming the oldest parked block when the free stack is empty; IKV_NIL if
 * neither is left. */
static uint32_t pool_pop(ikv_engine *e) {
    if (!e->n_free && e->n_parked) {
        uint32_t i = park_oldest(e);
        if (i != IKV_NIL) park_drop(e, i);
    }
    if (!e->n_free) return IKV_NIL;
    return e->free_stack[--e->n_free];
}

/* The cache core dropped or demoted a block: its KV bytes in the pool are free again. Moves
 * between lower tiers and promotions are the stores' business (tiers.c). */
static void on_evict(void *ctx, uint32_t node, ikv_key key, int from_tier, int to_tier) {
    ikv_engine *e = ctx;
    IKV_ASSERT(node < e->node_limit);
    if (e->tiers) ikv__tiers_on_evict(e, node, key, from_tier, to_tier);
    if (from_tier != 0) return;
    uint32_t b = e->node2blk[node];
    e->node2blk[node] = IKV_NIL;
    if (b == IKV_NIL) return;
    IKV_ASSERT(e->state[b] == IKV__BLK_READY || e->state[b] == IKV__BLK_PENDING);
    pool_push(e, b);
}

void ikv_engine_destroy(ikv_engine *e) {
    if (!e) return;
    ikv__pool_destroy(e->pool);
    ikv__tiers_destroy(e);
    ikv_cache_destroy(e->cache);
    if (e->seqs)
        for (uint32_t i = 0; i < e->opt.max_seqs; i++) {
            ikv_free(e->seqs[i].table);
            ikv_free(e->seqs[i].locked);
            ikv_free(e->seqs[i].logits);
            ikv_free(e->seqs[i].tok);
        }
    void *bufs[] = {e->kv,       e->state,      e->bnode,    e->bdepth, e->bparent, e->btokens,
                    e->bkey,     e->free_stack, e->node2blk, e->seqs,   e->keys,    e->nodes,
                    e->x,        e->xb,         e->q,        e->k,      e->v,       e->att,
                    e->hb,       e->hb2,        e->S,        e->qg,     e->Kc,      e->Vc,
                    e->rope_cos, e->rope_sin,   e->xn,       e->rinv,   e->dpart,   e->parked,
                    e->dseq,     e->dpos,       e->dtok,     e->dcoff,  e->dx,      e->dxn,
                    e->dxnt,     e->dxb,        e->dq,       e->dk,     e->dv,      e->datt,
                    e->dhb,      e->dhb2,       e->dlog,     e->vsave,  e->aq,      e->aa,
                    e->as,       e->ac,         e->wdq,      e->q8pack, e->q8sl};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        ikv_free(bufs[i]);
    ikv_free(e);
}

/* Asks the kernel to back [p, p + n) with transparent huge pages where it can (the 2 MiB-
 * aligned part). Decode reads a sequence's K/V as one 4 KiB run per (block, layer, K|V, kv
 * head), each in another page: with 4 KiB pages nearly every run costs a TLB miss (a nested
 * page walk in a VM); 2 MiB pages cover 8 blocks each. Only advice: without THP (or on
 * failure) nothing changes. */
static void advise_huge(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), b = ((uintptr_t)p + n) & ~(huge - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

static size_t at_least1(size_t n) {
    return n ? n : 1;
}
#define ALLOC(p, n) ((p) = ikv_calloc(at_least1(n), sizeof *(p)), (p) != NULL)

int ikv_engine_create(const ikv_model *m, const ikv_engine_options *oin, ikv_engine **out) {
    ikv_engine_options o;
    if (oin)
        o = *oin;
    else
        ikv_engine_options_default(&o);
    if (!o.policy) o.policy = "lru";
    if (ikv_policy_offline(o.policy))
        return ikv_error(IKV_EPARAM,
                         "policy %s reads next-use times (the future of a known trace): only "
                         "`isokv sim` can run it",
                         o.policy);
    int brc = ikv__blas_load(); /* BLAS starts here, not when the binary loads (blas.h) */
    if (brc) return brc;
    const ikv_model_config *c = &m->cfg;
    if (o.block_tokens == 0 || o.block_tokens > 4096)
        return ikv_error(IKV_EINVAL, "block_tokens %u not in 1..4096", o.block_tokens);
    if (o.tile == 0 || o.tile > 4096)
        return ikv_error(IKV_EINVAL, "tile %u not in 1..4096", o.tile);
    if (o.group == 0 || o.group > 64)
        return ikv_error(IKV_EINVAL, "group %u not in 1..64", o.group);
    if (o.max_seqs == 0 || o.max_seqs > 4096)
        return ikv_error(IKV_EINVAL, "max_seqs %u not in 1..4096", o.max_seqs);
    if (o.threads < 0 || o.threads > 256)
        return ikv_error(IKV_EINVAL, "threads %d not in 0..256", o.threads);

    uint32_t bt = o.block_tokens;
    uint32_t max_blocks = (uint32_t)(((uint64_t)c->seq_len + bt - 1) / bt);
    uint64_t block_bytes = ikv_model_kv_bytes_per_token(c) * bt;
    uint64_t reserve = o.private_blocks ? o.private_blocks : (uint64_t)o.max_seqs * max_blocks;
    if (o.kv_mem == 0) o.kv_mem = (reserve + 4ull * max_blocks) * block_bytes;
    /* a pool larger than the machine would be overcommitted, then killed when touched below */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    if (phys && o.kv_mem > phys) {
        char want[32], have[32];
        ikv_fmt_count(want, sizeof want, (double)o.kv_mem);
        ikv_fmt_count(have, sizeof have, (double)phys);
        return ikv_error(IKV_ERANGE,
                         "kv-mem %sB (%llu bytes) is more than this machine's %sB of memory", want,
                         (unsigned long long)o.kv_mem, have);
    }
    uint64_t nblocks = o.kv_mem / block_bytes;
    if (nblocks < reserve + 1 || nblocks > UINT32_MAX - 1)
        return ikv_error(
            IKV_EINVAL,
            "kv-mem %llu bytes holds %llu blocks of %llu bytes; the engine needs %llu private "
            "blocks (default: %u sequences x %u blocks of %u tokens) plus at least 1 for the "
            "cache",
            (unsigned long long)o.kv_mem, (unsigned long long)nblocks,
            (unsigned long long)block_bytes, (unsigned long long)reserve, o.max_seqs, max_blocks,
            bt);

    ikv_engine *e = ikv_calloc(1, sizeof *e);
    if (!e) return ikv_error(IKV_ENOMEM, "engine");
    e->m = m;
    e->opt = o;
    e->opt.policy = NULL; /* not kept: the cache copies it */
    e->bt = bt;
    e->T = o.tile;
    e->TP = o.tile;
    /* a group never spans more tiles than a full-length sequence has */
    e->G = o.threads > 0 ? o.group : 1;
    if ((uint64_t)e->G * o.tile > (uint64_t)c->seq_len)
        e->G = (uint32_t)(((uint64_t)c->seq_len + o.tile - 1) / o.tile);
    e->max_blocks = max_blocks;
    e->Lmax = (uint32_t)(((uint64_t)c->seq_len + o.tile - 1) / o.tile * o.tile);
    e->nblocks = (uint32_t)nblocks;
    e->capacity = nblocks - reserve;
    e->block_floats = (size_t)(block_bytes / 4);
    e->nth = o.threads > 0 ? o.threads : 1;
    e->private_budget = reserve;
    e->n_parked_max = o.parked ? o.parked : o.max_seqs + 8;
    e->max_draft = o.max_draft ? o.max_draft : 64;
    if (e->max_draft > (uint32_t)c->seq_len) e->max_draft = (uint32_t)c->seq_len;
    e->dmax = o.max_seqs > e->max_draft + 1 ? o.max_seqs : e->max_draft + 1;

    ikv_cache_config cc;
    ikv_cache_config_default(&cc, e->capacity, o.policy);
    cc.block_tokens = bt;
    cc.on_evict = on_evict;
    cc.evict_ctx = e;
    if (o.n_tiers) ikv__tiers_config(e, &o, &cc);
    int rc = ikv_cache_create(&cc, &e->cache);
    if (rc) {
        ikv_free(e);
        return rc;
    }
    e->node_limit = ikv_cache_node_limit(e->cache);

    e->S_rows = (size_t)(c->n_heads / c->n_kv_heads) *
                (o.tile > (uint32_t)c->n_kv_heads ? o.tile : (uint32_t)c->n_kv_heads);
    size_t T = o.tile, P = (size_t)e->nth, D = (size_t)c->dim, hid = (size_t)c->hidden_dim,
           q = (size_t)m->q_dim;
    /* room for the widest tile pitch a prefill scheme may use (below) */
    const size_t TPmax = (T + 11) / 12 * 12, GT = (size_t)e->G * TPmax, ntiles = e->Lmax / T;
    size_t kvd = (size_t)m->kv_dim, hd = (size_t)m->head_dim, V = (size_t)c->vocab_size;
    int ok = ALLOC(e->kv, (size_t)nblocks * e->block_floats) && ALLOC(e->state, nblocks) &&
             ALLOC(e->bnode, nblocks) && ALLOC(e->bdepth, nblocks) && ALLOC(e->bparent, nblocks) &&
             ALLOC(e->btokens, (size_t)nblocks * bt) && ALLOC(e->bkey, nblocks) &&
             ALLOC(e->free_stack, nblocks) && ALLOC(e->node2blk, e->node_limit) &&
             ALLOC(e->seqs, o.max_seqs) && ALLOC(e->keys, max_blocks) &&
             ALLOC(e->nodes, max_blocks) && ALLOC(e->x, ntiles * TPmax * D) &&
             ALLOC(e->xb, GT * D) && ALLOC(e->q, GT * q) && ALLOC(e->k, GT * kvd) &&
             ALLOC(e->v, GT * kvd) && ALLOC(e->att, GT * q) && ALLOC(e->hb, GT * hid) &&
             ALLOC(e->hb2, GT * hid) && ALLOC(e->S, P * e->S_rows * e->Lmax) &&
             ALLOC(e->rinv, P * e->S_rows) &&
             ALLOC(e->qg, P * T * (size_t)(c->n_heads / c->n_kv_heads) * hd) &&
             ALLOC(e->Kc, (size_t)c->n_kv_heads * e->Lmax * hd) &&
             ALLOC(e->Vc, (size_t)c->n_kv_heads * e->Lmax * hd) &&
             ALLOC(e->rope_cos, (size_t)c->seq_len * hd / 2) &&
             ALLOC(e->rope_sin, (size_t)c->seq_len * hd / 2) && ALLOC(e->xn, P * D) &&
             ALLOC(e->dpart, (size_t)e->dmax *
                                 (((size_t)max_blocks + IKV__DC_CHUNK - 1) / IKV__DC_CHUNK) *
                                 (size_t)c->n_heads * (hd + 2)) &&
             ALLOC(e->parked, e->n_parked_max) && ALLOC(e->dseq, e->dmax) &&
             ALLOC(e->dpos, e->dmax) && ALLOC(e->dtok, e->dmax) &&
             ALLOC(e->dcoff, (size_t)e->dmax + 1) && ALLOC(e->dx, (size_t)e->dmax * D) &&
             ALLOC(e->dxn, (size_t)e->dmax * D) && ALLOC(e->dxb, (size_t)e->dmax * D) &&
             ALLOC(e->dxnt, m->gs ? (size_t)P * e->dmax * D : 0) &&
             ALLOC(e->dq, (size_t)e->dmax * q) && ALLOC(e->datt, (size_t)e->dmax * q) &&
             ALLOC(e->dk, (size_t)e->dmax * kvd) && ALLOC(e->dv, (size_t)e->dmax * kvd) &&
             ALLOC(e->dhb, (size_t)e->dmax * hid) && ALLOC(e->dhb2, (size_t)e->dmax * hid) &&
             ALLOC(e->dlog, (size_t)e->dmax * V) && ALLOC(e->vsave, e->dmax);
    /* int8 weights: per-thread quantized activations and dequantized prefill weight rows */
    e->act_w = m->gs ? (D > hid ? D : hid) : 0;
    e->q8_gemm = m->gs ? (q8_prefill_force >= 0 ? q8_prefill_force : 1) : 0;
    e->wdq_floats = ikv__prefill_wdq_floats(e);
    e->act_rows = m->gs ? (e->q8_gemm && GT > e->dmax ? GT : e->dmax) : 0;
    ok = ok && ALLOC(e->aq, P * e->act_rows * e->act_w) &&
         ALLOC(e->aa, P * e->act_rows * e->act_w) && ALLOC(e->as, P * e->act_rows * e->act_w) &&
         ALLOC(e->ac, P * e->act_rows * e->act_w) &&
         ALLOC(e->wdq, P * e->wdq_floats) &&
         ALLOC(e->q8sl, m->gs ? (size_t)c->n_layers * IKV__QM_KINDS * P : 0);
    if (ok && m->gs && e->q8_gemm) { /* int8 prefill: every call's weight rows packed once */
        size_t bytes = ikv__prefill_q8_prepack(e, NULL);
        if (bytes) {
            ok = ALLOC(e->q8pack, bytes);
            if (ok) ikv__prefill_q8_prepack(e, e->q8pack);
        }
    }
    for (uint32_t i = 0; ok && i < o.max_seqs; i++)
        ok = ALLOC(e->seqs[i].table, max_blocks) && ALLOC(e->seqs[i].locked, max_blocks) &&
             ALLOC(e->seqs[i].logits, V) && ALLOC(e->seqs[i].tok, (size_t)c->seq_len);
    if (!ok) {
        ikv_engine_destroy(e);
        return ikv_error(IKV_ENOMEM,
                         "out of memory allocating the KV pool (%llu bytes, %llu blocks) and the "
                         "engine's buffers: a smaller kv-mem may fit",
                         (unsigned long long)o.kv_mem, (unsigned long long)nblocks);
    }
    advise_huge(e->kv, sizeof(float) * (size_t)nblocks * e->block_floats);
    /* touch every page of the pool now: a page fault on first use would otherwise land in the
     * prefill that first writes a block (allocation on the hot path, in disguise) */
    memset(e->kv, 0, sizeof(float) * (size_t)nblocks * e->block_floats);
    for (uint32_t b = 0; b < e->nblocks; b++) {
        e->bnode[b] = IKV_NIL;
        e->free_stack[b] = e->nblocks - 1 - b; /* pop hands out block 0 first */
    }
    e->n_free = e->nblocks;
    for (uint64_t i = 0; i < e->node_limit; i++)
        e->node2blk[i] = IKV_NIL;
    if ((rc = ikv__pool_create(e->nth, &e->pool))) {
        ikv_engine_destroy(e);
        return rc;
    }
    ikv__rope_init(e);
    /* the forward pass splits work over its own threads, each calling single-threaded BLAS */
    if (o.threads > 0) openblas_set_num_threads(1);
    /* grouped projection calls only where they give every row the bits of its own tile's call
     * (docs/engine.md, "Exactness"); otherwise one call per tile */
    if (o.threads > 0) {
        size_t w = D > hid ? D : hid;
        float *X = ikv_malloc(sizeof(float) * GT * w), *Y1 = ikv_malloc(sizeof(float) * GT * w),
              *Y2 = ikv_malloc(sizeof(float) * GT * w);
        int ok = X && Y1 && Y2;
        /* schemes, in order of preference: tiles of T rows, trimmed in multiples of 16; tiles
         * padded to a multiple of 12 rows, trimmed in multiples of 12 (what OpenBLAS's
         * Haswell kernels need: rows of a call outside its full 12-row panels get other bits).
         * The first that gets both, else the one that gets more. */
        const uint32_t tp[2] = {(uint32_t)T, (uint32_t)TPmax},
                       qq[2] = {T % 16 == 0 ? 16u : 0u, 12u};
        int best = 0, got = -1, score = -1; /* score: 2 for group, 1 for trim */
        for (int i = 0; ok && i < 2 && score < 3; i++) {
            if (scheme_force >= 0 && i != scheme_force) continue;
            int r = ikv__prefill_group_check(e, e->G, tp[i], qq[i], X, Y1, Y2);
            if ((r & 1) * 2 + (r >> 1 & 1) > score)
                best = r, got = i, score = (r & 1) * 2 + (r >> 1 & 1);
        }
        ikv_free(X), ikv_free(Y1), ikv_free(Y2);
        if (score > 0) e->TP = tp[got];
        if (!(best & 1)) e->G = 1;
        e->Q = best & 2 ? qq[got] : 0;
    }
    if (o.n_tiers && (rc = ikv__tiers_create(e, &o))) {
        ikv_engine_destroy(e);
        return rc;
    }
    *out = e;
    return 0;
}

/* Returns a sequence's blocks: unlocks its cache path, frees its private blocks (a parked
 * block was taken out of its table before), gives back its reservation. */
static void seq_release(ikv_engine *e, ikv_seq *s) {
    if (s->n_locked) {
        int rc = ikv_cache_unlock(e->cache, s->locked, s->n_locked);
        IKV_ASSERT(rc == 0);
    }
    for (uint32_t j = 0; j < s->n_blocks; j++) {
        uint32_t b = s->table[j];
        if (b != IKV_NIL && e->state[b] == IKV__BLK_PRIVATE) pool_push(e, b);
    }
    IKV_ASSERT(e->reserved >= s->reserve);
    e->reserved -= s->reserve;
    s->reserve = 0;
    s->n_locked = 0;
    s->n_blocks = 0;
    s->n = 0;
    s->n_prompt = 0;
    s->pend0 = s->pend1 = 0;
    s->active = 0;
}

static uint32_t seq_private(const ikv_engine *e, const ikv_seq *s);

/* Takes a private block for block index j of s. */
static int add_private(ikv_engine *e, ikv_seq *s, uint32_t j) {
    uint32_t b = pool_pop(e);
    if (b == IKV_NIL) return ikv_error(IKV_EFULL, "KV pool exhausted (pool invariant broken)");
    e->state[b] = IKV__BLK_PRIVATE;
    e->bdepth[b] = j;
    e->bparent[b] = j ? s->table[j - 1] : IKV_NIL;
    s->table[j] = b;
    s->n_blocks = j + 1;
    return 0;
}

int ikv__seq_extend(ikv_engine *e, ikv_seq *s, const uint32_t *tokens, size_t n) {
    IKV_ASSERT(s->active && s->n == s->n_prompt && n <= s->limit);
    const uint32_t bt = e->bt, nblk = (uint32_t)((n + bt - 1) / bt);
    if (nblk > s->n_blocks && seq_private(e, s) + (nblk - s->n_blocks) > s->reserve)
        return ikv_error(IKV_EFULL, "extending to %zu positions exceeds the reservation", n);
    for (uint32_t j = s->n_blocks; j < nblk; j++) {
        int rc = add_private(e, s, j);
        if (rc) return rc;
    }
    for (size_t p = s->n; p < n; p++) {
        uint32_t b = s->table[p / bt];
        IKV_ASSERT(e->state[b] == IKV__BLK_PRIVATE);
        e->btokens[(size_t)b * bt + p % bt] = tokens[p];
        s->tok[p] = tokens[p];
    }
    return 0;
}

/* Is the cached block b exactly block j of this prompt, following block `parent`? */
static int block_matches(const ikv_engine *e, uint32_t b, uint32_t j, uint32_t parent,
                         const uint32_t *tokens) {
    return b != IKV_NIL && e->state[b] == IKV__BLK_READY && e->bdepth[b] == j &&
           e->bparent[b] == parent &&
           !memcmp(e->btokens + (size_t)b * e->bt, tokens + (size_t)j * e->bt,
                   sizeof(uint32_t) * e->bt);
}

/* Leading tokens a[0..n) and b[0..n) have in common. */
static uint32_t common_prefix(const uint32_t *a, const uint32_t *b, uint32_t n) {
    uint32_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Copies the K/V of slots [0, cnt) of block src into block dst, every layer and kv head. */
static void copy_kv(ikv_engine *e, uint32_t dst, uint32_t src, uint32_t cnt) {
    const struct ikv_model *m = e->m;
    const size_t hd = (size_t)m->head_dim;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int g = 0; g < m->cfg.n_kv_heads; g++)
                memcpy(ikv__kv_at(e, dst, l, kv, g, 0), ikv__kv_at(e, src, l, kv, g, 0),
                       sizeof(float) * cnt * hd);
}

/* The parked entry that shares the most leading tokens with block j of the prompt (tokens,
 * n positions) after the verified block `parent`, visible to a request of scope salt `tenant`
 * whose first public_tokens positions are public (pub: the public salt); at most `cap` tokens.
 * Sets *cnt to the tokens shared; returns the entry index or IKV_NIL. */
static uint32_t park_find(const ikv_engine *e, uint32_t j, uint32_t parent, const uint32_t *tokens,
                          uint32_t n, uint64_t tenant, uint64_t pub, size_t public_tokens,
                          uint32_t cap, uint32_t *cnt) {
    const uint32_t bt = e->bt;
    uint32_t best = IKV_NIL, bc = 0;
    uint32_t avail = n - j * bt < bt ? n - j * bt : bt;
    if (avail > cap) avail = cap;
    for (uint32_t i = 0; i < e->n_parked; i++) {
        const ikv__parked *p = &e->parked[i];
        if (p->parent != parent) continue;
        if (parent != IKV_NIL &&
            (e->state[parent] != IKV__BLK_READY || !ikv_key_eq(e->bkey[parent], p->pkey)))
            continue; /* the block it followed was evicted (and maybe reused) */
        uint32_t c = common_prefix(e->btokens + (size_t)p->blk * bt, tokens + (size_t)j * bt,
                                   p->ntok < avail ? p->ntok : avail);
        if (p->salt != tenant && !(p->salt == pub && (size_t)j * bt + c <= public_tokens))
            continue; /* another tenant's private tokens */
        if (c > bc) best = i, bc = c;
    }
    *cnt = bc;
    return best;
}

/* Parks the last partial prompt block of an ending sequence (see the top of the file). */
static void park_seq(ikv_engine *e, ikv_seq *s) {
    const uint32_t bt = e->bt, k0 = s->n_prompt % bt, j0 = s->n_prompt / bt;
    if (s->no_cache || e->n_parked_max == 0 || k0 == 0 || s->n < s->n_prompt || j0 >= s->n_blocks)
        return;
    const uint32_t b = s->table[j0];
    const uint32_t parent = j0 ? s->table[j0 - 1] : IKV_NIL;
    if (e->state[b] != IKV__BLK_PRIVATE) return;
    if (parent != IKV_NIL && e->state[parent] != IKV__BLK_READY) return;
    /* an entry for the same prefix and tokens is replaced (the newer block is as good) */
    for (uint32_t i = 0; i < e->n_parked; i++) {
        const ikv__parked *p = &e->parked[i];
        if (p->parent == parent && p->salt == s->salt && p->ntok == k0 &&
            !memcmp(e->btokens + (size_t)p->blk * bt, e->btokens + (size_t)b * bt,
                    sizeof(uint32_t) * k0)) {
            park_drop(e, i);
            break;
        }
    }
    if (e->n_parked == e->n_parked_max) park_drop(e, park_oldest(e));
    ikv__parked *p = &e->parked[e->n_parked++];
    p->blk = b, p->parent = parent, p->ntok = k0;
    p->pkey = parent != IKV_NIL ? e->bkey[parent] : (ikv_key){0, 0};
    p->salt = s->n_prompt <= s->public_tokens ? ikv_scope_salt(e->opt.key_seed, NULL) : s->salt;
    p->stamp = ++e->park_clock;
    e->state[b] = IKV__BLK_PARKED;
    e->bnode[b] = IKV_NIL;
    s->table[j0] = IKV_NIL;
}

/* Checks a request's input; 0 or the error (nothing changed). */
static int request_check(const ikv_engine *e, const ikv_request *r) {
    const ikv_model_config *c = &e->m->cfg;
    if (!r || !r->tokens || r->n == 0) return ikv_error(IKV_EINVAL, "empty prompt");
    if (r->n > (size_t)c->seq_len)
        return ikv_error(IKV_ETOOLONG, "prompt of %zu tokens is longer than the model's seq_len %d",
                         r->n, (int)c->seq_len);
    for (size_t i = 0; i < r->n; i++)
        if (r->tokens[i] >= (uint32_t)c->vocab_size)
            return ikv_error(IKV_EINVAL, "prompt token %zu is %u, outside the vocabulary of %d", i,
                             r->tokens[i], (int)c->vocab_size);
    return 0;
}

int ikv_engine_admit(ikv_engine *e, const ikv_request *r, ikv_seq **out, ikv_prefill_info *info) {
    double t_start = ikv_now();
    const ikv_model_config *c = &e->m->cfg;
    int rc = request_check(e, r);
    if (rc) return rc;
    ikv_seq *s = NULL;
    for (uint32_t i = 0; i < e->opt.max_seqs && !s; i++)
        if (!e->seqs[i].active) s = &e->seqs[i];
    if (!s) return ikv_error(IKV_EBUSY, "all %u sequences are in flight", e->opt.max_seqs);

    const uint32_t bt = e->bt, n = (uint32_t)r->n;
    const uint32_t nfull = n / bt, nblk = (n + bt - 1) / bt;
    uint64_t lim =
        r->max_new && r->max_new < (size_t)c->seq_len ? n + r->max_new : (uint64_t)c->seq_len;
    if (lim > (uint64_t)c->seq_len) lim = (uint64_t)c->seq_len;
    ikv_prefill_info inf;
    memset(&inf, 0, sizeof inf);
    const uint64_t tenant = ikv_scope_salt(e->opt.key_seed, r->tenant);
    const uint64_t pub = ikv_scope_salt(e->opt.key_seed, NULL);
    uint32_t m = 0, mv = 0, inserted = 0;
    uint32_t src = IKV_NIL, cow = 0, pk = IKV_NIL; /* copy-on-write source (below) */
    size_t core_m = 0;

    /* ---- match phase: keys, longest resident prefix, verification ---- */
    if (!r->no_cache && nfull > 0) {
        for (uint32_t j = 0; j < nfull; j++) {
            uint64_t salt = (uint64_t)(j + 1) * bt <= r->public_tokens ? pub : tenant;
            e->keys[j] = ikv_key_chain(e->opt.key_seed, j ? &e->keys[j - 1] : NULL,
                                       r->tokens + (size_t)j * bt, bt, salt);
        }
        ikv_cache_match(e->cache, e->keys, nfull, e->nodes, NULL, &core_m);
        inf.matched_blocks = core_m;
        uint32_t parent = IKV_NIL;
        while (m < core_m) {
            uint32_t b = e->node2blk[e->nodes[m]];
            if (!block_matches(e, b, m, parent, r->tokens)) break;
            parent = b;
            m++;
        }
        inf.rejected_blocks = core_m - m;
    }
    /* ---- end of the match phase ---- */

    mv = m;                                 /* verified blocks */
    if (m > (n - 1) / bt) m = (n - 1) / bt; /* keep >= 1 position to compute */
    /* reservation: every block up to the limit that is not a locked cached one (with
     * reserve_new: up to the prompt + reserve_new now, the rest block by block later) */
    const uint32_t total = (uint32_t)((lim + bt - 1) / bt), full_need = total - m;
    uint64_t now_lim = r->reserve_new && n + r->reserve_new < lim ? n + r->reserve_new : lim;
    const uint32_t need = (uint32_t)((now_lim + bt - 1) / bt) - m;
    if (full_need > e->private_budget)
        return ikv_error(IKV_ETOOLONG,
                         "request needs %u private blocks (%u tokens and %llu more), more than "
                         "the engine's %llu",
                         full_need, n, (unsigned long long)(lim - n),
                         (unsigned long long)e->private_budget);
    if (e->reserved + need > e->private_budget)
        return ikv_error(IKV_EFULL, "request needs %u private blocks, %llu of %llu are free", need,
                         (unsigned long long)(e->private_budget - e->reserved),
                         (unsigned long long)e->private_budget);
    s->active = 1, s->n = 0, s->n_blocks = 0, s->n_locked = 0;
    s->reserve = need, e->reserved += need;
    s->limit = (uint32_t)lim;
    s->salt = tenant, s->public_tokens = r->public_tokens, s->no_cache = r->no_cache;
    e->clock++;

    if (!r->no_cache && nfull > 0) {
        ikv_access acc = {.now = e->clock, .scope = 0, .next_use = NULL, .ntokens = NULL};
        if (m) {
            rc = ikv_cache_lock(e->cache, e->nodes, m);
            IKV_ASSERT(rc == 0);
            (void)ikv_cache_hit(e->cache, e->nodes, m,
                                &acc); /* EFULL: promotion only; still a hit */
            for (uint32_t j = 0; j < m; j++) {
                s->locked[j] = e->nodes[j];
                s->table[j] = e->node2blk[e->nodes[j]];
            }
            s->n_locked = m, s->n_blocks = m;
        }
        if (e->tiers) m = ikv__tiers_match(e, r, s, m, &core_m, nfull, &acc, &inf);
        if (m == core_m && m < nfull) {
            size_t ins = 0;
            rc = ikv_cache_insert(e->cache, e->keys, nfull, m, &acc, 1, e->nodes + m, &ins);
            if (rc && rc != IKV_EFULL) goto fail;
            rc = 0;
            for (uint32_t i = 0; i < (uint32_t)ins; i++) {
                uint32_t j = m + i, node = e->nodes[j];
                IKV_ASSERT(node < e->node_limit && e->node2blk[node] == IKV_NIL);
                s->locked[s->n_locked++] = node; /* locked by insert: unlocked at the end */
                uint32_t b = pool_pop(e);
                if (b == IKV_NIL) {
                    rc = ikv_error(IKV_EFULL, "KV pool exhausted (pool invariant broken)");
                    goto fail;
                }
                e->state[b] = IKV__BLK_PENDING;
                e->bnode[b] = node;
                e->bdepth[b] = j;
                e->bparent[b] = j ? s->table[j - 1] : IKV_NIL;
                e->bkey[b] = e->keys[j];
                memcpy(e->btokens + (size_t)b * bt, r->tokens + (size_t)j * bt,
                       sizeof(uint32_t) * bt);
                e->node2blk[node] = b;
                s->table[j] = b;
                s->n_blocks = j + 1;
            }
            inserted = (uint32_t)ins;
        }
    }
    s->pend0 = m, s->pend1 = m + inserted;
    s->tier_m = m, s->tier_ins = inserted, s->prefill_s = 0;
    /* copy-on-write source for block m, found before any block is taken: a verified full
     * block the prompt ends on (its first bt - 1 positions), or a parked partial block */
    if (!r->no_cache && m < nblk) {
        const uint32_t cap = n - 1 - m * bt; /* leave the last position to compute */
        if (mv > m) {
            src = e->node2blk[e->nodes[m]], cow = cap < bt ? cap : bt;
        } else {
            pk = park_find(e, m, m ? s->table[m - 1] : IKV_NIL, r->tokens, n, tenant, pub,
                           r->public_tokens, cap, &cow);
            if (pk != IKV_NIL) {
                src = e->parked[pk].blk;
                /* the source must survive pool_pop's reclaiming below: stamp it newest and
                 * keep it out of reach until copied */
                e->parked[pk].stamp = ++e->park_clock;
                e->state[src] = IKV__BLK_PRIVATE; /* not reclaimable while in use */
            }
        }
    }
    for (uint32_t j = m + inserted; j < nblk; j++)
        if ((rc = add_private(e, s, j))) goto fail;
    for (uint32_t j = m + inserted; j < nblk; j++) {
        size_t cnt = (size_t)(j + 1) * bt <= n ? bt : n - (size_t)j * bt;
        memcpy(e->btokens + (size_t)s->table[j] * bt, r->tokens + (size_t)j * bt,
               sizeof(uint32_t) * cnt);
    }
    if (pk != IKV_NIL) e->state[src] = IKV__BLK_PARKED;
    if (src != IKV_NIL && cow > 0) {
        copy_kv(e, s->table[m], src, cow);
        inf.partial_tokens = cow;
        e->n_partial_hits++;
    }
    if (r->reserve_new && now_lim < lim) {
        /* the blocks are in place: keep reserved only the private ones and those still to come
         * up to the prompt + reserve_new (full blocks the cache took are not private) */
        uint32_t keep = seq_private(e, s), upto = (uint32_t)((now_lim + bt - 1) / bt);
        keep += upto > s->n_blocks ? upto - s->n_blocks : 0;
        if (keep < s->reserve) e->reserved -= s->reserve - keep, s->reserve = keep;
    }
    memcpy(s->tok, r->tokens, sizeof(uint32_t) * n);
    s->n = m * bt + (src != IKV_NIL ? cow : 0);
    s->n_prompt = n;
    inf.cached_tokens = s->n;
    inf.computed_tokens = n - s->n;
    inf.inserted_blocks = inserted;
    e->n_requests++;
    e->n_cached_tokens += inf.cached_tokens;
    e->n_rejected += inf.rejected_blocks;
    inf.seconds = ikv_now() - t_start;
    if (info) *info = inf;
    *out = s;
    return 0;

fail:
    /* Blocks inserted but never computed stay PENDING in the cache: a later match rejects
     * them (not READY) and the policy evicts them in time. */
    if (pk != IKV_NIL && e->state[src] == IKV__BLK_PRIVATE) e->state[src] = IKV__BLK_PARKED;
    seq_release(e, s);
    return rc;
}

int ikv_engine_pin_public(ikv_engine *e, const uint32_t *tokens, size_t n_public, uint64_t ttl) {
    const uint32_t bt = e->bt;
    size_t nb = n_public / bt;
    if (nb > e->max_blocks) nb = e->max_blocks;
    if (nb == 0)
        return ikv_error(IKV_EINVAL, "a public prefix of %zu tokens has no full block", n_public);
    const uint64_t pub = ikv_scope_salt(e->opt.key_seed, NULL);
    for (size_t j = 0; j < nb; j++)
        e->keys[j] =
            ikv_key_chain(e->opt.key_seed, j ? &e->keys[j - 1] : NULL, tokens + j * bt, bt, pub);
    size_t got = 0;
    ikv_cache_match(e->cache, e->keys, nb, e->nodes, NULL, &got);
    for (size_t j = 0; j < got; j++) {
        uint32_t b = e->node2blk[e->nodes[j]];
        if (b == IKV_NIL || e->state[b] != IKV__BLK_READY) got = j;
    }
    if (got < nb)
        return ikv_error(IKV_ENOENT, "%zu of the %zu public blocks are cached and ready", got, nb);
    return ikv_cache_pin(e->cache, e->keys, nb, ttl ? e->clock + ttl : 0);
}

/* Private blocks in s's table. */
static uint32_t seq_private(const ikv_engine *e, const ikv_seq *s) {
    uint32_t k = 0;
    for (uint32_t j = 0; j < s->n_blocks; j++)
        k += e->state[s->table[j]] == IKV__BLK_PRIVATE;
    return k;
}

/* Blocks the next npos positions of s take beyond what its reservation covers. */
static uint32_t blocks_short(const ikv_engine *e, const ikv_seq *s, size_t npos) {
    size_t end = s->n + npos < s->limit ? s->n + npos : s->limit;
    uint32_t upto = (uint32_t)((end + e->bt - 1) / e->bt);
    uint32_t more = upto > s->n_blocks ? upto - s->n_blocks : 0;
    uint32_t have = seq_private(e, s);
    return have + more > s->reserve ? have + more - s->reserve : 0;
}

/* Whether the next decode of s takes a new block its reservation does not cover. */
static int needs_block(const ikv_engine *e, const ikv_seq *s) {
    return s->n < s->limit && blocks_short(e, s, 1) > 0;
}

int ikv_seq_reserve(ikv_engine *e, ikv_seq *s, size_t npos) {
    IKV_ASSERT(s && s->active);
    uint32_t k = ikv_seq_pending(s) ? 0 : blocks_short(e, s, npos);
    if (!k) return 0;
    if (e->reserved + k > e->private_budget)
        return ikv_error(IKV_EFULL, "%u more blocks: the private budget's %llu are reserved but "
                         "%llu", k, (unsigned long long)e->private_budget,
                         (unsigned long long)(e->private_budget - e->reserved));
    s->reserve += k, e->reserved += k;
    return 0;
}

int ikv_seq_reserve_next(ikv_engine *e, ikv_seq *s) {
    return ikv_seq_reserve(e, s, 1);
}

size_t ikv_seq_pending(const ikv_seq *s) {
    return s->n < s->n_prompt ? s->n_prompt - s->n : 0;
}

/* Computes the next cnt prompt positions of s (a prefill chunk); logits of the last prompt
 * position when the chunk ends the prompt, and of every computed position into logits_all
 * when given. Marks the inserted blocks whose positions are all computed READY. */
static void prefill_chunk(ikv_engine *e, ikv_seq *s, size_t cnt, float *logits_all) {
    const size_t first = s->n, end = first + cnt, V = (size_t)e->m->cfg.vocab_size;
    double t0 = ikv_now();
    ikv__prefill(e, s, s->tok, first, end);
    s->prefill_s += ikv_now() - t0;
    if (logits_all)
        for (size_t p = first; p < end; p++)
            ikv__logits_row(e, ikv__prefill_row(e, first, p), logits_all + p * V);
    if (end == s->n_prompt) {
        if (logits_all)
            memcpy(s->logits, logits_all + (end - 1) * V, sizeof(float) * V);
        else
            ikv__logits_row(e, ikv__prefill_row(e, first, end - 1), s->logits);
    }
    while (s->pend0 < s->pend1 && (size_t)(s->pend0 + 1) * e->bt <= end)
        e->state[s->table[s->pend0++]] = IKV__BLK_READY;
    s->n = (uint32_t)end;
    if (end == s->n_prompt && e->tiers) ikv__tiers_done(e, s, s->tier_m, s->tier_ins, s->prefill_s);
    e->n_computed_tokens += cnt;
}

/* The greedy token: argmax, the lowest index on ties (as ikv_sampler_sample). */
static uint32_t argmax_row(const float *x, size_t n) {
    return ikv__argmax(x, n);
}

size_t ikv_engine_max_rows(const ikv_engine *e) {
    return e->dmax;
}

/* Puts token t at the next row of the decode batch: position pos of s (its block taken if
 * new, the block's token id saved into e->vsave[row] and overwritten). */
static void place_row(ikv_engine *e, ikv_seq *s, size_t row, size_t pos, uint32_t t) {
    const uint32_t j = (uint32_t)(pos / e->bt);
    if (j >= s->n_blocks) {
        int rc = add_private(e, s, j);
        IKV_ASSERT(rc == 0); /* the reservation guarantees a block */
    }
    IKV_ASSERT(e->state[s->table[j]] == IKV__BLK_PRIVATE);
    uint32_t *slot = &e->btokens[(size_t)s->table[j] * e->bt + pos % e->bt];
    e->vsave[row] = *slot;
    *slot = t;
    s->tok[pos] = t;
    e->dseq[row] = s, e->dpos[row] = pos, e->dtok[row] = t;
}

/* After the batch: the draft of item `it`, whose rows start at r0 (its lead) of e->dlog, is
 * accepted in order (draft[a] against row r0 + a, the logits after the lead and a accepted);
 * the sequence keeps the lead and the accepted tokens, takes the logits after the last of
 * them, and rows past them are rolled back (token ids restored, blocks that hold no kept
 * position returned to the pool: their K/V is stale but never read, attention reads
 * positions below the length and the next decode overwrites a slot first). */
static void accept_rows(ikv_engine *e, ikv_step_item *it, size_t r0) {
    ikv_seq *s = it->seq;
    const size_t V = (size_t)e->m->cfg.vocab_size, bt = e->bt, R = 1 + it->k, n = s->n;
    ikv_sampler *sp =
        it->sampler && ikv_sampler_temperature(it->sampler) > 0.0f ? it->sampler : NULL;
    uint32_t tok = 0;
    size_t a = 0;
    int mismatch = 0;
    for (; a < it->k; a++) {
        const float *row = e->dlog + (r0 + a) * V;
        int ok = sp ? ikv_sampler_accept(sp, row, it->draft[a], &tok)
                    : (tok = argmax_row(row, V)) == it->draft[a];
        if (!ok) {
            mismatch = 1;
            break;
        }
    }
    const size_t keep = 1 + a;
    float *last = e->dlog + (r0 + keep - 1) * V;
    memcpy(s->logits, last, sizeof(float) * V);
    it->accepted = a;
    it->next = mismatch ? tok : sp ? ikv_sampler_sample(sp, last) : argmax_row(last, V);
    for (size_t r = R; r-- > keep;) {
        const size_t pos = n + r;
        e->btokens[(size_t)s->table[pos / bt] * bt + pos % bt] = e->vsave[r0 + r];
    }
    const uint32_t need = (uint32_t)((n + keep + bt - 1) / bt);
    while (s->n_blocks > s->vnb0 && s->n_blocks > need) {
        uint32_t j = --s->n_blocks;
        pool_push(e, s->table[j]);
        s->table[j] = IKV_NIL;
    }
    s->n = (uint32_t)(n + keep);
    it->done = keep;
}

int ikv_engine_step(ikv_engine *e, ikv_step_item *items, size_t n) {
    const ikv_model_config *c = &e->m->cfg;
    size_t rows = 0;
    /* check everything first: a rejected step runs nothing */
    for (size_t i = 0; i < n; i++) {
        ikv_seq *s = items[i].seq;
        if (!s || s < e->seqs || s >= e->seqs + e->opt.max_seqs || !s->active)
            return ikv_error(IKV_EINVAL, "step item %zu: not a sequence in flight", i);
        for (size_t j = 0; j < i; j++)
            if (items[j].seq == s)
                return ikv_error(IKV_EINVAL, "step items %zu and %zu: the same sequence", j, i);
        if (ikv_seq_pending(s)) continue;
        const size_t k = items[i].draft ? items[i].k : 0;
        if (items[i].token >= (uint32_t)c->vocab_size)
            return ikv_error(IKV_EINVAL, "step item %zu: token %u outside the vocabulary of %d", i,
                             items[i].token, (int)c->vocab_size);
        if (k > e->max_draft)
            return ikv_error(IKV_EINVAL,
                             "step item %zu: draft of %zu tokens, more than "
                             "max_draft %u",
                             i, k, e->max_draft);
        for (size_t d = 0; d < k; d++)
            if (items[i].draft[d] >= (uint32_t)c->vocab_size)
                return ikv_error(IKV_EINVAL,
                                 "step item %zu: draft token %zu is %u, outside the "
                                 "vocabulary of %d",
                                 i, d, items[i].draft[d], (int)c->vocab_size);
        if (s->n >= s->limit)
            return ikv_error(
                IKV_ETOOLONG, "step item %zu: sequence reached its limit of %u positions%s", i,
                s->limit, s->limit == (uint32_t)c->seq_len ? " (the model's seq_len)" : "");
        if (1 + k > ikv_seq_room(s))
            return ikv_error(IKV_ETOOLONG,
                             "step item %zu: 1 + %zu draft positions after %u do "
                             "not fit the sequence's limit of %u",
                             i, k, s->n, s->limit);
        if (k ? blocks_short(e, s, 1 + k) > 0 : needs_block(e, s))
            return ikv_error(IKV_EFULL,
                             "step item %zu: its next %zu positions need blocks it has not "
                             "reserved (ikv_seq_reserve_next / ikv_seq_reserve)",
                             i, 1 + k);
        rows += 1 + k;
        if (rows > e->dmax)
            return ikv_error(IKV_EINVAL,
                             "step item %zu: %zu decode rows, more than the %u the "
                             "engine takes (ikv_engine_max_rows)",
                             i, rows, e->dmax);
    }
    size_t nd = 0;
    for (size_t i = 0; i < n; i++) {
        ikv_seq *s = items[i].seq;
        size_t pend = ikv_seq_pending(s);
        items[i].done = 0;
        if (pend) {
            size_t cnt = items[i].n && items[i].n < pend ? items[i].n : pend;
            prefill_chunk(e, s, cnt, NULL);
            items[i].done = cnt;
            continue;
        }
        const size_t k = items[i].draft ? items[i].k : 0;
        s->vnb0 = s->n_blocks;
        place_row(e, s, nd++, s->n, items[i].token);
        for (size_t d = 0; d < k; d++)
            place_row(e, s, nd++, s->n + 1 + d, items[i].draft[d]);
    }
    if (nd) ikv__decode_batch(e, nd);
    for (size_t i = 0, r0 = 0; i < n && r0 < nd; i++) {
        ikv_step_item *it = &items[i];
        if (it->seq != e->dseq[r0]) continue;
        const size_t k = it->draft ? it->k : 0;
        if (k)
            accept_rows(e, it, r0);
        else {
            it->seq->n++;
            it->done = 1;
        }
        r0 += 1 + k;
    }
    return 0;
}

int ikv_engine_begin(ikv_engine *e, const ikv_request *r, ikv_seq **out, ikv_prefill_info *info) {
    double t_start = ikv_now();
    ikv_prefill_info inf;
    ikv_seq *s;
    int rc = ikv_engine_admit(e, r, &s, &inf);
    if (rc) return rc;
    prefill_chunk(e, s, ikv_seq_pending(s), r->logits_all);
    inf.seconds = ikv_now() - t_start;
    if (info) *info = inf;
    *out = s;
    return 0;
}

int ikv_engine_decode(ikv_engine *e, ikv_seq *s, uint32_t token, const float **logits) {
    IKV_ASSERT(s && s->active && !ikv_seq_pending(s));
    ikv_step_item it = {.seq = s, .token = token};
    int rc = ikv_engine_step(e, &it, 1);
    if (rc) return rc;
    if (logits) *logits = s->logits;
    return 0;
}

/* Draft verification: one ikv_engine_step item with a draft.
 *
 * Rows: r = 0 .. R-1 (R = has_lead + k) are the tokens [lead,] draft[0..k) at positions
 * n .. n + R - 1, n = s->n. ikv__decode_batch runs all R rows of the one sequence as one
 * batch: layer by layer it writes every row's K/V before any row's attention, and row r's
 * attention covers positions [0, n + r], so it sees exactly the K/V sequential decode would
 * have written before it, and every weight product is per-row exact (ikv__linear_rows). Row
 * r's logits are therefore those of decoding rows 0..r one by one.
 *
 * Without a lead, draft[0] is checked against the current logits first, before any forward
 * (a wrong first token costs no compute), and once accepted it leads the step's item. */
int ikv_engine_verify(ikv_engine *e, ikv_seq *s, ikv_verify *v) {
    const ikv_model_config *c = &e->m->cfg;
    const size_t V = (size_t)c->vocab_size;
    if (!v || !s || s < e->seqs || s >= e->seqs + e->opt.max_seqs || !s->active ||
        ikv_seq_pending(s))
        return ikv_error(IKV_EINVAL, "verify: not a sequence in flight with its prompt computed");
    if (v->k > e->max_draft)
        return ikv_error(IKV_EINVAL, "verify: draft of %zu tokens, more than max_draft %u", v->k,
                         e->max_draft);
    if (v->k && !v->draft) return ikv_error(IKV_EINVAL, "verify: no draft tokens");
    if (v->has_lead && v->lead >= (uint32_t)c->vocab_size)
        return ikv_error(IKV_EINVAL, "verify: lead token %u outside the vocabulary of %d", v->lead,
                         (int)c->vocab_size);
    for (size_t i = 0; i < v->k; i++)
        if (v->draft[i] >= (uint32_t)c->vocab_size)
            return ikv_error(IKV_EINVAL,
                             "verify: draft token %zu is %u, outside the vocabulary "
                             "of %d",
                             i, v->draft[i], (int)c->vocab_size);
    const size_t lead = v->has_lead ? 1 : 0, R = lead + v->k, n = s->n;
    if (R > ikv_seq_room(s))
        return ikv_error(IKV_ETOOLONG,
                         "verify: %zu positions after %zu do not fit the sequence's limit of %u", R,
                         n, s->limit);
    if (blocks_short(e, s, R))
        return ikv_error(IKV_EFULL, "verify: %zu positions need blocks the sequence has not "
                         "reserved (ikv_seq_reserve)", R);
    ikv_sampler *sp = v->sampler && ikv_sampler_temperature(v->sampler) > 0.0f ? v->sampler : NULL;
    uint32_t tok;
    v->accepted = 0, v->rows = 0;
    if (R == 0) { /* nothing to check: the next token from the current logits */
        float *tmp = e->dlog;
        memcpy(tmp, s->logits, sizeof(float) * V);
        v->next = sp ? ikv_sampler_sample(sp, tmp) : argmax_row(tmp, V);
        return 0;
    }
    if (!lead) {
        int ok = sp ? ikv_sampler_accept(sp, s->logits, v->draft[0], &tok)
                    : (tok = argmax_row(s->logits, V)) == v->draft[0];
        if (!ok) {
            v->next = tok;
            return 0;
        }
    }
    ikv_step_item it = {.seq = s,
                        .token = lead ? v->lead : v->draft[0],
                        .draft = v->draft + (1 - lead),
                        .k = R - 1,
                        .sampler = v->sampler};
    int rc = ikv_engine_step(e, &it, 1);
    IKV_ASSERT(rc == 0); /* checked above */
    v->rows = R;
    v->accepted = it.accepted + (1 - lead);
    if (v->logits_all) { /* a sample after a full acceptance overwrote the last kept row with
                            probabilities: that row is the sequence's logits */
        memcpy(v->logits_all, e->dlog, sizeof(float) * V * R);
        memcpy(v->logits_all + (lead + v->accepted - 1) * V, s->logits, sizeof(float) * V);
    }
    v->next = it.k ? it.next : sp ? ikv_sampler_sample(sp, e->dlog) : argmax_row(e->dlog, V);
    return 0;
}

size_t ikv_seq_room(const ikv_seq *s) {
    return s->n < s->limit ? s->limit - s->n : 0;
}

void ikv_engine_end(ikv_engine *e, ikv_seq *s) {
    if (!s || !s->active) return;
    park_seq(e, s);
    seq_release(e, s);
}

const float *ikv_seq_logits(const ikv_seq *s) {
    return s->logits;
}

size_t ikv_seq_len(const ikv_seq *s) {
    return s->n;
}

int ikv_seq_kv(const ikv_engine *e, const ikv_seq *s, size_t pos, int layer, float *k, float *v) {
    const struct ikv_model *m = e->m;
    if (pos >= s->n || layer < 0 || layer >= m->cfg.n_layers)
        return ikv_error(IKV_ERANGE, "position %zu / layer %d outside the sequence (%u positions)",
                         pos, layer, s->n);
    uint32_t b = s->table[pos / e->bt], slot = (uint32_t)(pos % e->bt);
    size_t hd = (size_t)m->head_dim;
    for (int g = 0; g < m->cfg.n_kv_heads; g++) {
        memcpy(k + (size_t)g * hd, ikv__kv_at(e, b, layer, 0, g, slot), sizeof(float) * hd);
        memcpy(v + (size_t)g * hd, ikv__kv_at(e, b, layer, 1, g, slot), sizeof(float) * hd);
    }
    return 0;
}

int ikv_engine_set_threads(ikv_engine *e, int k) {
    return ikv__pool_set_active(e->pool, k ? k : e->nth);
}

int ikv_engine_threads(const ikv_engine *e) {
    return ikv__pool_active(e->pool);
}

double ikv_engine_worker_cpu(const ikv_engine *e) {
    return ikv__pool_worker_cpu(e->pool);
}

void ikv_engine_stats_get(const ikv_engine *e, ikv_engine_stats *st) {
    memset(st, 0, sizeof *st);
    st->pool_blocks = e->nblocks;
    st->free_blocks = e->n_free + e->n_parked;
    st->parked_blocks = e->n_parked;
    for (uint32_t b = 0; b < e->nblocks; b++) {
        if (e->state[b] == IKV__BLK_PRIVATE)
            st->private_blocks++;
        else if (e->state[b] == IKV__BLK_PENDING || e->state[b] == IKV__BLK_READY)
            st->cached_blocks++;
    }
    st->partial_hits = e->n_partial_hits;
    st->private_budget = e->private_budget;
    st->reserved_blocks = e->reserved;
    st->block_bytes = e->block_floats * 4;
    st->cache_capacity = e->capacity;
    st->prefill_group = e->G;
    st->prefill_trim = e->Q > 0;
    st->prefill_pitch = e->TP;
    st->requests = e->n_requests;
    st->cached_tokens = e->n_cached_tokens;
    st->computed_tokens = e->n_computed_tokens;
    st->rejected_blocks = e->n_rejected;
}

ikv_cache *ikv_engine_cache(ikv_engine *e) {
    return e->cache;
}

const ikv_model *ikv_engine_model(const ikv_engine *e) {
    return e->m;
}

int ikv_engine_check(const ikv_engine *e) {
    uint64_t nfree = 0, npriv = 0, ncached = 0, nparked = 0;
    for (uint32_t b = 0; b < e->nblocks; b++) {
        switch (e->state[b]) {
        case IKV__BLK_FREE:
            nfree++;
            break;
        case IKV__BLK_PARKED:
            nparked++;
            break;
        case IKV__BLK_PRIVATE:
            npriv++;
            break;
        case IKV__BLK_PENDING:
        case IKV__BLK_READY: {
            ncached++;
            uint32_t node = e->bnode[b];
            if (node >= e->node_limit || e->node2blk[node] != b)
                return ikv_error(IKV_EINVAL, "cached block %u: node %u does not map back to it", b,
                                 node);
            if (ikv_cache_node_tier(e->cache, node) != 0)
                return ikv_error(IKV_EINVAL, "cached block %u: node %u is not resident in tier 0",
                                 b, node);
            if (!ikv_key_eq(ikv_cache_node_key(e->cache, node), e->bkey[b]))
                return ikv_error(IKV_EINVAL, "cached block %u: node %u has another key", b, node);
            break;
        }
        default:
            return ikv_error(IKV_EINVAL, "block %u: bad state %u", b, e->state[b]);
        }
    }
    if (nfree != e->n_free)
        return ikv_error(IKV_EINVAL, "%llu free blocks, free stack holds %u",
                         (unsigned long long)nfree, e->n_free);
    if (nparked != e->n_parked || e->n_parked > e->n_parked_max)
        return ikv_error(IKV_EINVAL, "%llu parked blocks, %u parked entries (at most %u)",
                         (unsigned long long)nparked, e->n_parked, e->n_parked_max);
    for (uint32_t i = 0; i < e->n_parked; i++) {
        const ikv__parked *p = &e->parked[i];
        if (p->blk >= e->nblocks || e->state[p->blk] != IKV__BLK_PARKED || p->ntok == 0 ||
            p->ntok >= e->bt)
            return ikv_error(IKV_EINVAL, "parked entry %u: block %u, %u tokens", i, p->blk,
                             p->ntok);
        for (uint32_t k = 0; k < i; k++)
            if (e->parked[k].blk == p->blk)
                return ikv_error(IKV_EINVAL, "parked entries %u and %u share block %u", k, i,
                                 p->blk);
    }
    for (uint32_t i = 0; i < e->n_free; i++)
        if (e->state[e->free_stack[i]] != IKV__BLK_FREE)
            return ikv_error(IKV_EINVAL, "free stack entry %u (block %u) is not free", i,
                             e->free_stack[i]);
    uint64_t mapped = 0;
    for (uint64_t nd = 0; nd < e->node_limit; nd++)
        if (e->node2blk[nd] != IKV_NIL) mapped++;
    if (mapped != ncached)
        return ikv_error(IKV_EINVAL, "%llu nodes map to blocks, %llu blocks cached",
                         (unsigned long long)mapped, (unsigned long long)ncached);
    if (ncached > e->capacity)
        return ikv_error(IKV_EINVAL, "%llu cached blocks exceed capacity %llu",
                         (unsigned long long)ncached, (unsigned long long)e->capacity);
    uint64_t owned = 0, reserved = 0;
    for (uint32_t i = 0; i < e->opt.max_seqs; i++) {
        const ikv_seq *s = &e->seqs[i];
        if (!s->active) continue;
        if (s->n_blocks < (s->n + e->bt - 1) / e->bt)
            return ikv_error(IKV_EINVAL, "sequence %u: block table shorter than its positions", i);
        if (s->n > s->limit || s->n_prompt > s->limit ||
            s->n_blocks < (s->n_prompt + e->bt - 1) / e->bt)
            return ikv_error(IKV_EINVAL,
                             "sequence %u: %u positions, %u prompt, limit %u, %u blocks", i, s->n,
                             s->n_prompt, s->limit, s->n_blocks);
        uint64_t mine = 0;
        for (uint32_t j = 0; j < s->n_blocks; j++)
            if (e->state[s->table[j]] == IKV__BLK_PRIVATE)
                owned++, mine++;
            else if (e->state[s->table[j]] == IKV__BLK_FREE ||
                     e->state[s->table[j]] == IKV__BLK_PARKED)
                return ikv_error(IKV_EINVAL, "sequence %u: block %u is free or parked", i,
                                 s->table[j]);
        if (mine > s->reserve)
            return ikv_error(IKV_EINVAL, "sequence %u: %llu private blocks, %u reserved", i,
                             (unsigned long long)mine, s->reserve);
        reserved += s->reserve;
        if (s->n_blocks > e->max_blocks)
            return ikv_error(IKV_EINVAL, "sequence %u: %u blocks", i, s->n_blocks);
    }
    if (owned != npriv)
        return ikv_error(IKV_EINVAL, "%llu private blocks, sequences own %llu",
                         (unsigned long long)npriv, (unsigned long long)owned);
    if (reserved != e->reserved || e->reserved > e->private_budget)
        return ikv_error(IKV_EINVAL, "sequences reserve %llu blocks, engine counts %llu of %llu",
                         (unsigned long long)reserved, (unsigned long long)e->reserved,
                         (unsigned long long)e->private_budget);
    return 1;
}

void ikv_engine_dump(const ikv_engine *e, FILE *f) {
    ikv_engine_stats st;
    ikv_engine_stats_get(e, &st);
    fprintf(f,
            "engine pool: %llu blocks of %u tokens (%llu bytes each): %llu free, %llu cached "
            "(capacity %llu), "
            "%llu private; tile %u, group %u%s; %llu requests, %llu cached / %llu computed tokens, "
            "%llu "
            "rejected blocks\n",
            (unsigned long long)st.pool_blocks, e->bt, (unsigned long long)st.block_bytes,
            (unsigned long long)st.free_blocks, (unsigned long long)st.cached_blocks,
            (unsigned long long)st.cache_capacity, (unsigned long long)st.private_blocks, e->T,
            e->G, e->Q ? ", trim" : "", (unsigned long long)st.requests,
            (unsigned long long)st.cached_tokens, (unsigned long long)st.computed_tokens,
            (unsigned long long)st.rejected_blocks);
    static const char *names[] = {"free", "private", "pending", "ready", "parked"};
    for (uint32_t i = 0; i < e->n_parked; i++)
        fprintf(f, "  parked %u: block %u after %d, %u tokens\n", i, e->parked[i].blk,
                e->parked[i].parent == IKV_NIL ? -1 : (int)e->parked[i].parent, e->parked[i].ntok);
    for (uint32_t b = 0; b < e->nblocks; b++) {
        if (e->state[b] != IKV__BLK_PENDING && e->state[b] != IKV__BLK_READY) continue;
        const uint32_t *t = e->btokens + (size_t)b * e->bt;
        fprintf(f, "  block %u %s node %u depth %u parent %d tokens %u %u %u ...\n", b,
                names[e->state[b]], e->bnode[b], e->bdepth[b],
                e->bparent[b] == IKV_NIL ? -1 : (int)e->bparent[b], t[0], e->bt > 1 ? t[1] : 0,
                e->bt > 2 ? t[2] : 0);
    }
    for (uint32_t i = 0; i < e->opt.max_seqs; i++) {
        const ikv_seq *s = &e->seqs[i];
        if (!s->active) continue;
        fprintf(f, "  sequence %u: %u positions, %u locked nodes, table:", i, s->n, s->n_locked);
        for (uint32_t j = 0; j < s->n_blocks; j++)
            fprintf(f, " %u%s", s->table[j], e->state[s->table[j]] == IKV__BLK_PRIVATE ? "p" : "");
        fprintf(f, "\n");
    }
}
