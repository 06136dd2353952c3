/*
 * Lower tiers of the engine's KV cache: the stores (store.h) behind the KV pool.
 *
 * The cache core (cache.h) keeps the tier list as metadata: tier 0 is the pool, tiers 1..n
 * are the stores given in ikv_engine_options, fastest first. It decides; this file moves the
 * bytes when it says so (on_evict):
 *
 *     0 -> 1     demotion: the pool block is packed into a blob (store.h) and put in store 1
 *     t -> t+1   the blob is moved (get, put) and, from a private store (mem), deleted
 *     t -> -1    dropped from the last tier: deleted from its store
 *     t -> 0     promotion on a hit: the block adopts a pool block this file loaded just
 *                before (see below), or gets none and is recomputed by the engine
 *
 * A blob's payload is the block's K and V in the pool's per-layer order, [layer][k|v][kv head]
 * [token][head_dim] fp32, one memcpy per layer from/to the pool's layer-major layout.
 *
 * Lower-tier hits (ikv__tiers_match). After the engine's local longest match (m verified pool
 * blocks), the blocks that follow are candidates:
 *   1. the core's own lower-tier blocks [m, core_m) (the tier rule makes them a suffix);
 *   2. then, for shared stores (file, redis), keys this index has never seen: one exists call
 *      for the first key, then one run for the rest, per store; the leading run found counts.
 * For the candidate run [m, c) the engine loads [m, s) and recomputes [s, c), choosing s (at
 * a tier boundary, or m, or c) to minimise  sum over loaded blocks of the tier's measured
 * seconds per block  +  measured prefill seconds of positions [s bt, c bt). Tier speeds start
 * from a probe at create (a run of 8 blocks put and got) and follow a running average of real
 * transfers; the prefill estimate is a running average of seconds per FLOP (cost model below)
 * over the engine's own prefills, seeded by a probe prefill at create. Loads go into pool
 * blocks taken before the core is told (so a demotion the promotion causes cannot overwrite
 * a blob still to be read), then the hit promotes the core's blocks, which adopt them, and the
 * probed ones are inserted. The first load that fails (miss, corrupt, mismatch, down) ends the
 * loaded prefix; the rest is recomputed, and counted. Both outcomes are counted per tier, and
 * the recomputed hits by why: cheaper ([s, c)), failed (a failed load and the rest of its
 * run), no room (the pool had no free block to load into: that block and the rest of its run),
 * dropped (loaded, then not kept for the request: see below).
 *
 * Loaded blocks the core has no room for (a pool smaller than the prompt) still serve the
 * request as private blocks. After the prefill, the request's new full blocks (inserted, or
 * private for want of room) are written through to the shared stores, so other processes find
 * them by probing; demotions into tier 1 are queued and written in runs of CH.
 *
 * q8 (options.tier_dtype): a payload row of head_dim values (one token, one kv head, K or V,
 * one layer) is stored as a float scale max|x| / 127 and int8 round(x / scale): head_dim + 4
 * bytes instead of 4 head_dim. Lossy: pool blocks loaded from q8 are flagged, and every
 * request that uses them counts them in lossy_tokens. The dtype is part of the fingerprint, so
 * an fp32 engine never takes a q8 block.
 *
 * Fail closed: a blob is used only when its checksum, key, scope, fingerprint and token ids
 * hold (store.c). Keys in every store carry the tenant's scope salt, so a tenant never loads
 * another tenant's private block, even from a shared store.
 *
 * Cost model of a prefill of positions [a, b): per position 2 x (matrix parameters per token)
 * FLOPs plus attention 4 x layers x q_dim x (p + 1); its measured seconds per FLOP is what is
 * averaged, so the estimate follows the context length.
 */
#include "internal.h"

#include <math.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define CH             16  /* blocks per staged get run */
#define EMA            0.3 /* weight of a new measurement in the running averages */
#define LAYOUT_VERSION 1   /* the payload layout above */

typedef struct tier_counts {
    uint64_t loaded, recomputed, failed, probed, demoted, deleted;
    uint64_t rec_failed, rec_noroom, rec_dropped; /* recomputed hits by why (blocks) */
} tier_counts;

struct ikv__tiers {
    size_t n; /* lower tiers */
    ikv_store *st[IKV_MAX_TIERS - 1];
    uint64_t fp;
    size_t payload, blob; /* bytes */
    uint8_t *stage;       /* [CH][blob] */
    void *stage_p[CH];
    uint8_t *dq; /* [CH][blob] demotions into tier 1 not yet written */
    void *dq_p[CH];
    size_t dq_n;
    size_t lens[CH];
    int rcs[CH];
    ikv_block_want want[CH];
    uint64_t *nscope; /* [node_limit] scope salt of each resident node */
    uint8_t *mtier;   /* [max_blocks] tiers from a match */
    uint8_t *src;     /* [max_blocks] source tier (1..n) of candidate j */
    uint32_t *pre;    /* [max_blocks] pool block loaded for j, IKV_NIL if none */
    uint64_t *salt;   /* [max_blocks] scope salt of block j of the current request */
    uint8_t *found;   /* [max_blocks] */
    ikv_key *pkeys;   /* [max_blocks] */
    uint64_t *pscopes;
    /* adoption window of a promotion: blocks [adopt_a, adopt_b) of the current request */
    int adopting;
    uint32_t adopt_a, adopt_b;
    const uint32_t *adopt_tokens;
    struct ikv_seq *adopt_seq;
    double load_s[IKV_MAX_TIERS - 1], put_s[IKV_MAX_TIERS - 1]; /* seconds per block */
    double s_per_flop;                                          /* prefill, 0 = unknown */
    int pinned[IKV_MAX_TIERS - 1];                              /* tests: load_s fixed */
    int dtype;                                                  /* IKV_BLOB_DTYPE_* */
    uint8_t *blossy; /* [nblocks] 1: the pool block's K/V went through a q8 tier */
    tier_counts cnt[IKV_MAX_TIERS - 1];
};

typedef struct ikv__tiers tiers;

/* ---- fingerprint, params ------------------------------------------------------------------- */

uint64_t ikv_engine_fingerprint(const ikv_model *m, const ikv_engine_options *o) {
    uint64_t h = XXH3_64bits(m->image, m->image_bytes);
    uint64_t v[5] = {h, o ? o->tokenizer_fp : 0, o && o->block_tokens ? o->block_tokens : 16,
                     o ? (uint64_t)o->tier_dtype : 0, LAYOUT_VERSION};
    return XXH3_64bits(v, sizeof v);
}

/* Payload bytes of a block: fp32 K and V, or per (layer, K|V, kv head, token) a float scale
 * and head_dim int8 values (q8). */
static size_t payload_bytes(const ikv_model *m, uint32_t bt, int dtype) {
    if (dtype == IKV_BLOB_DTYPE_Q8)
        return (size_t)m->cfg.n_layers * 2 * (size_t)m->cfg.n_kv_heads * bt *
               ((size_t)m->head_dim + 4);
    return (size_t)ikv_model_kv_bytes_per_token(&m->cfg) * bt;
}

void ikv_engine_store_params(const ikv_model *m, const ikv_engine_options *o, ikv_store_params *p) {
    uint32_t bt = o && o->block_tokens ? o->block_tokens : 16;
    memset(p, 0, sizeof *p);
    p->slot_bytes = ikv_blob_bytes(bt, payload_bytes(m, bt, o ? o->tier_dtype : 0));
    p->fingerprint = ikv_engine_fingerprint(m, o);
}

/* ---- pool blocks (the same discipline as engine.c's free stack) ---------------------------- */

static uint32_t pop(ikv_engine *e) {
    if (!e->n_free) return IKV_NIL;
    uint32_t b = e->free_stack[--e->n_free];
    e->state[b] = IKV__BLK_PRIVATE; /* held by this file until adopted or returned */
    return b;
}

static void push(ikv_engine *e, uint32_t b) {
    IKV_ASSERT(e->state[b] != IKV__BLK_FREE && e->n_free < e->nblocks);
    e->state[b] = IKV__BLK_FREE;
    e->bnode[b] = IKV_NIL;
    e->free_stack[e->n_free++] = b;
}

/* ---- pack / unpack -------------------------------------------------------------------------- */

static size_t layer_floats(const ikv_engine *e) {
    return e->block_floats / (size_t)e->m->cfg.n_layers;
}

/* Packs pool block b (key, scope, token ids, K/V) into blob, as fp32 or q8: each row of
 * head_dim values (one token of one kv head of K or V of one layer) becomes a float scale
 * max|x| / 127 and round(x / scale) as int8 (all zeros: scale 0). Does not allocate. */
static void pack(const ikv_engine *e, const tiers *T, uint32_t b, ikv_key key, uint64_t scope,
                 void *blob) {
    ikv_blob_desc d = {.key = key,
                       .scope = scope,
                       .ntok = e->bt,
                       .payload_bytes = (uint32_t)T->payload,
                       .dtype = (uint8_t)T->dtype};
    void *pay;
    uint32_t *tok = ikv_blob_init(blob, &d, &pay);
    memcpy(tok, e->btokens + (size_t)b * e->bt, sizeof(uint32_t) * e->bt);
    size_t lf = layer_floats(e);
    if (T->dtype == IKV_BLOB_DTYPE_F32) {
        for (int l = 0; l < e->m->cfg.n_layers; l++)
            memcpy((float *)pay + (size_t)l * lf, ikv__kv_at(e, b, l, 0, 0, 0), sizeof(float) * lf);
        return;
    }
    size_t hd = (size_t)e->m->head_dim, rows = lf / hd;
    uint8_t *q = pay;
    for (int l = 0; l < e->m->cfg.n_layers; l++) {
        const float *x = ikv__kv_at(e, b, l, 0, 0, 0);
        for (size_t r = 0; r < rows; r++, x += hd, q += hd + 4) {
            float mx = 0;
            for (size_t i = 0; i < hd; i++)
                mx = fabsf(x[i]) > mx ? fabsf(x[i]) : mx;
            float sc = mx / 127.0f, inv = mx > 0 ? 127.0f / mx : 0;
            memcpy(q, &sc, 4);
            for (size_t i = 0; i < hd; i++)
                ((int8_t *)q)[4 + i] = (int8_t)lrintf(x[i] * inv);
        }
    }
}

/* Copies a verified blob's token ids and K/V (dequantized if q8) into pool block b. */
static void unpack(ikv_engine *e, const void *blob, uint32_t b) {
    memcpy(e->btokens + (size_t)b * e->bt, ikv_blob_tokens(blob), sizeof(uint32_t) * e->bt);
    const int dtype = ((const uint8_t *)blob)[6]; /* store.h: the header's dtype byte */
    size_t lf = layer_floats(e);
    e->tiers->blossy[b] = dtype == IKV_BLOB_DTYPE_Q8;
    if (dtype == IKV_BLOB_DTYPE_F32) {
        const float *pay = ikv_blob_payload(blob);
        for (int l = 0; l < e->m->cfg.n_layers; l++)
            memcpy(ikv__kv_at(e, b, l, 0, 0, 0), pay + (size_t)l * lf, sizeof(float) * lf);
        return;
    }
    size_t hd = (size_t)e->m->head_dim, rows = lf / hd;
    const uint8_t *q = ikv_blob_payload(blob);
    for (int l = 0; l < e->m->cfg.n_layers; l++) {
        float *x = ikv__kv_at(e, b, l, 0, 0, 0);
        for (size_t r = 0; r < rows; r++, x += hd, q += hd + 4) {
            float sc;
            memcpy(&sc, q, 4);
            for (size_t i = 0; i < hd; i++)
                x[i] = sc * (float)((const int8_t *)q)[4 + i];
        }
    }
}

/* ---- cost model ---------------------------------------------------------------------------- */

/* FLOPs of prefilling positions [a, b) (see the top). */
static double prefill_flops(const ikv_engine *e, size_t a, size_t b) {
    const ikv_model_config *c = &e->m->cfg;
    double L = c->n_layers, D = c->dim, H = c->hidden_dim, q = e->m->q_dim, kv = e->m->kv_dim;
    double per_tok = 2.0 * L * (D * (q + 2 * kv) + q * D + 3 * D * H);
    double n = (double)(b - a);
    /* sum over p in [a, b) of (p + 1) */
    double att = ((double)b * (double)(b + 1) - (double)a * (double)(a + 1)) / 2.0;
    return per_tok * n + 4.0 * L * q * att;
}

double ikv_engine_prefill_estimate(const ikv_engine *e, size_t a, size_t b) {
    if (!e->tiers || b <= a) return 0;
    return e->tiers->s_per_flop * prefill_flops(e, a, b);
}

static void ema(double *avg, double x) {
    *avg = *avg > 0 ? (1 - EMA) * *avg + EMA * x : x;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

void ikv__tiers_config(const ikv_engine *e, const ikv_engine_options *o, ikv_cache_config *cc) {
    (void)e;
    size_t n = o->n_tiers < IKV_MAX_TIERS - 1 ? o->n_tiers : IKV_MAX_TIERS - 1;
    for (size_t t = 0; t < n; t++) {
        if (!o->tiers[t]) continue;
        ikv_tier_config *tc = &cc->tiers[1 + t];
        tc->name = ikv_store_scheme(o->tiers[t]);
        tc->capacity = o->tier_blocks[t] ? o->tier_blocks[t] : ikv_store_capacity(o->tiers[t]);
        tc->policy = cc->tiers[0].policy;
        tc->admit_min_hits = 0;
    }
    cc->n_tiers = 1 + n;
    cc->promote_on_hit = 1;
}

static void flush(tiers *T);

void ikv__tiers_destroy(ikv_engine *e) {
    tiers *T = e->tiers;
    if (!T) return;
    flush(T);
    void *bufs[] = {T->stage, T->dq,   T->blossy, T->nscope, T->mtier,  T->src,
                    T->pre,   T->salt, T->found,  T->pkeys,  T->pscopes};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        ikv_free(bufs[i]);
    ikv_free(T);
    e->tiers = NULL;
}

/* Measures store t: a run of 8 probe blocks put, got and deleted (keys of their own domain,
 * unique to this process). */
static void probe_store(ikv_engine *e, tiers *T, size_t t) {
    enum { NP = 8 };
    ikv_key keys[NP];
    uint64_t scopes[NP];
    void *bl[NP];
    uint8_t *buf = ikv_malloc(NP * T->blob);
    if (!buf) return;
    for (int i = 0; i < NP; i++) {
        keys[i] = ikv_key_from_id(e->opt.key_seed, UINT64_C(0x70726f6265) /* "probe" */,
                                  (uint64_t)getpid() << 8 | (uint64_t)i);
        scopes[i] = 0;
        bl[i] = buf + (size_t)i * T->blob;
        ikv_blob_desc d = {.key = keys[i], .ntok = e->bt, .payload_bytes = (uint32_t)T->payload};
        void *pay;
        uint32_t *tok = ikv_blob_init(bl[i], &d, &pay);
        memset(tok, 0, sizeof(uint32_t) * e->bt);
        memset(pay, 0, T->payload);
    }
    int rcs[NP];
    double t0 = ikv_now();
    size_t put = ikv_store_put_run(T->st[t], bl, NP, rcs);
    double t1 = ikv_now();
    ikv_block_want w[NP];
    size_t lens[NP];
    for (int i = 0; i < NP; i++)
        w[i] = (ikv_block_want){.key = keys[i], .scope = 0};
    size_t got = ikv_store_get_run(T->st[t], w, NP, bl, T->blob, lens, rcs);
    double t2 = ikv_now();
    (void)ikv_store_del_run(T->st[t], keys, scopes, NP);
    if (put == NP) T->put_s[t] = (t1 - t0) / NP;
    if (got == NP) T->load_s[t] = (t2 - t1) / NP;
    ikv_free(buf);
}

/* Measures the prefill: positions [0, L) of a dummy prompt on free pool blocks (nothing is
 * cached; the blocks stay free), L = two tiles or the model's seq_len. */
static void probe_prefill(ikv_engine *e) {
    struct ikv_seq *s = &e->seqs[0];
    size_t L = 2 * (size_t)e->T;
    if (L > (size_t)e->m->cfg.seq_len) L = (size_t)e->m->cfg.seq_len;
    uint32_t nb = (uint32_t)((L + e->bt - 1) / e->bt);
    if (nb > e->n_free) return;
    uint32_t *toks = ikv_calloc(L, sizeof *toks);
    if (!toks) return;
    for (uint32_t j = 0; j < nb; j++)
        s->table[j] = e->free_stack[e->n_free - 1 - j];
    s->n_blocks = nb;
    double t0 = ikv_now();
    ikv__prefill(e, s, toks, 0, L);
    double dt = ikv_now() - t0;
    s->n_blocks = 0;
    ikv_free(toks);
    if (dt > 0) e->tiers->s_per_flop = dt / prefill_flops(e, 0, L);
}

static size_t at_least1(size_t n) {
    return n ? n : 1;
}
#define TALLOC(p, n) ((p) = ikv_calloc(at_least1(n), sizeof *(p)), (p) != NULL)

int ikv__tiers_create(ikv_engine *e, const ikv_engine_options *o) {
    if (o->n_tiers > IKV_MAX_TIERS - 1)
        return ikv_error(IKV_EINVAL, "%zu lower tiers: at most %d", o->n_tiers, IKV_MAX_TIERS - 1);
    tiers *T = ikv_calloc(1, sizeof *T);
    if (!T) return ikv_error(IKV_ENOMEM, "tiers");
    e->tiers = T;
    T->n = o->n_tiers;
    ikv_store_params p;
    ikv_engine_store_params(e->m, o, &p);
    T->fp = p.fingerprint;
    if (o->tier_dtype != IKV_BLOB_DTYPE_F32 && o->tier_dtype != IKV_BLOB_DTYPE_Q8)
        return ikv_error(IKV_EINVAL, "tier dtype %d: expected fp32 (0) or q8 (1)", o->tier_dtype);
    T->dtype = o->tier_dtype;
    T->payload = payload_bytes(e->m, e->bt, T->dtype);
    T->blob = p.slot_bytes;
    size_t mb = e->max_blocks;
    if (!TALLOC(T->stage, CH * T->blob) || !TALLOC(T->dq, CH * T->blob) ||
        !TALLOC(T->nscope, e->node_limit) || !TALLOC(T->blossy, e->nblocks) ||
        !TALLOC(T->mtier, mb) || !TALLOC(T->src, mb) || !TALLOC(T->pre, mb) ||
        !TALLOC(T->salt, mb) || !TALLOC(T->found, mb) || !TALLOC(T->pkeys, mb) ||
        !TALLOC(T->pscopes, mb))
        return ikv_error(IKV_ENOMEM, "tier buffers");
    for (size_t i = 0; i < CH; i++)
        T->stage_p[i] = T->stage + i * T->blob;
    for (size_t i = 0; i < CH; i++)
        T->dq_p[i] = T->dq + i * T->blob;
    for (size_t j = 0; j < mb; j++)
        T->pre[j] = IKV_NIL;
    for (size_t t = 0; t < T->n; t++) {
        if (!o->tiers[t]) return ikv_error(IKV_EINVAL, "lower tier %zu: no store", t + 1);
        T->st[t] = o->tiers[t];
    }
    for (size_t t = 0; t < T->n; t++)
        probe_store(e, T, t);
    probe_prefill(e);
    return 0;
}

/* ---- the core's moves ---------------------------------------------------------------------- */

/* Writes the queued demotions into tier 1 in one run (one pipelined round trip for Redis). */
static void flush(tiers *T) {
    if (!T->dq_n) return;
    double t0 = ikv_now();
    size_t ok = ikv_store_put_run(T->st[0], T->dq_p, T->dq_n, T->rcs);
    if (ok == T->dq_n) ema(&T->put_s[0], (ikv_now() - t0) / (double)T->dq_n);
    T->cnt[0].demoted += ok;
    T->dq_n = 0;
}

/* A promoted node of the current request adopts the pool block loaded for it. */
static void adopt(ikv_engine *e, tiers *T, uint32_t node, uint32_t j) {
    uint32_t b = T->pre[j];
    T->pre[j] = IKV_NIL;
    e->state[b] = IKV__BLK_READY;
    e->bnode[b] = node;
    e->bdepth[b] = j;
    e->bparent[b] =
        j ? (j - 1 < T->adopt_seq->n_blocks ? T->adopt_seq->table[j - 1] : IKV_NIL) : IKV_NIL;
    e->bkey[b] = e->keys[j];
    e->node2blk[node] = b;
    T->nscope[node] = T->salt[j];
    struct ikv_seq *s = T->adopt_seq;
    s->table[j] = b;
    s->n_blocks = j + 1;
}

void ikv__tiers_on_evict(ikv_engine *e, uint32_t node, ikv_key key, int from, int to) {
    tiers *T = e->tiers;
    if (from == 0 && to == 1) {
        /* demotion: write the pool block's bytes (a block never computed is not written) */
        uint32_t b = e->node2blk[node];
        if (b == IKV_NIL || e->state[b] != IKV__BLK_READY) return;
        pack(e, T, b, key, T->nscope[node], T->dq_p[T->dq_n++]);
        if (T->dq_n == CH) flush(T);
    } else if (from > 0 && to > from) {
        flush(T); /* the block may still be queued */
        /* a lower tier's block moves down: get, put, and delete from a private store */
        size_t a = (size_t)from - 1, z = (size_t)to - 1;
        ikv_block_want w = {.key = key, .scope = T->nscope[node]};
        if (ikv_store_get_run(T->st[a], &w, 1, T->stage_p, T->blob, T->lens, T->rcs) == 1 &&
            ikv_store_put_run(T->st[z], T->stage_p, 1, T->rcs) == 1)
            T->cnt[z].demoted++;
        if (!ikv_store_shared(T->st[a]) && !ikv_store_del_run(T->st[a], &key, &w.scope, 1))
            T->cnt[a].deleted++;
    } else if (from > 0 && to < 0) {
        size_t a = (size_t)from - 1;
        if (a == 0) flush(T);
        if (!ikv_store_del_run(T->st[a], &key, &T->nscope[node], 1)) T->cnt[a].deleted++;
    } else if (from > 0 && to == 0) {
        if (from == 1) flush(T);
        /* promotion: adopt the block loaded for it, if this is the current request's */
        if (T->adopting)
            for (uint32_t j = T->adopt_a; j < T->adopt_b; j++)
                if (ikv_key_eq(e->keys[j], key)) {
                    if (T->pre[j] != IKV_NIL) adopt(e, T, node, j);
                    break;
                }
        size_t a = (size_t)from - 1;
        if (!ikv_store_shared(T->st[a]) && !ikv_store_del_run(T->st[a], &key, &T->nscope[node], 1))
            T->cnt[a].deleted++;
    }
}

/* ---- lower-tier hits ------------------------------------------------------------------------- */

/* Probes the shared stores for keys [a, nfull) this index does not hold; sets T->src[j] for
 * the leading run found and returns its end. */
static uint32_t probe(ikv_engine *e, tiers *T, uint32_t a, uint32_t nfull) {
    uint32_t end = a;
    for (uint32_t j = a; j < nfull; j++)
        T->src[j] = 0;
    for (size_t t = 0; t < T->n && end < nfull; t++) {
        if (!ikv_store_shared(T->st[t])) continue;
        /* one call for the first key still missing, then one run for the rest */
        if (!ikv_store_exists_run(T->st[t], &e->keys[end], &T->salt[end], 1, T->found)) continue;
        T->src[end] = (uint8_t)(t + 1);
        if (end + 1 < nfull) {
            (void)ikv_store_exists_run(T->st[t], &e->keys[end + 1], &T->salt[end + 1],
                                       nfull - end - 1, T->found);
            for (uint32_t j = end + 1; j < nfull; j++)
                if (!T->src[j] && T->found[j - end - 1]) T->src[j] = (uint8_t)(t + 1);
        }
        while (end < nfull && T->src[end])
            end++;
    }
    return end;
}

/* Loads candidates [m, s) (T->src gives each one's tier) into fresh pool blocks (T->pre);
 * returns the end of the loaded prefix (the first failure, or s). *noroom is 1 when it ended
 * because the pool had no free block to load into (not a store failure). */
static uint32_t load(ikv_engine *e, tiers *T, const ikv_request *r, uint32_t m, uint32_t s,
                     int *noroom) {
    *noroom = 0;
    uint32_t j = m;
    while (j < s) {
        size_t t = (size_t)T->src[j] - 1;
        uint32_t k = 0;
        while (j + k < s && k < CH && T->src[j + k] == t + 1) {
            T->want[k] = (ikv_block_want){.key = e->keys[j + k],
                                          .scope = T->salt[j + k],
                                          .tokens = r->tokens + (size_t)(j + k) * e->bt,
                                          .ntok = e->bt};
            k++;
        }
        double t0 = ikv_now();
        ikv_store_get_run(T->st[t], T->want, k, T->stage_p, T->blob, T->lens, T->rcs);
        for (uint32_t i = 0; i < k; i++) {
            if (T->rcs[i] != 0) {
                T->cnt[t].failed++;
                return j + i;
            }
            uint32_t b = pop(e);
            if (b == IKV_NIL) { /* no free block: seen in serve with a small --kv-mem */
                *noroom = 1;
                return j + i;
            }
            unpack(e, T->stage_p[i], b);
            T->pre[j + i] = b;
        }
        if (!T->pinned[t]) ema(&T->load_s[t], (ikv_now() - t0) / k);
        j += k;
    }
    return s;
}

uint32_t ikv__tiers_match(ikv_engine *e, const ikv_request *r, struct ikv_seq *s, uint32_t m,
                          size_t *core_m, uint32_t nfull, const ikv_access *acc,
                          ikv_prefill_info *inf) {
    tiers *T = e->tiers;
    const uint32_t bt = e->bt, limit = (uint32_t)((r->n - 1) / bt);
    inf->tier_tokens[0] = (size_t)m * bt;
    flush(T); /* what the last request demoted is readable before anything is looked up */
    size_t cm = 0;
    ikv_cache_match(e->cache, e->keys, nfull, NULL, T->mtier, &cm);
    IKV_ASSERT(cm == *core_m);
    if (m < cm && T->mtier[m] == 0) { /* a rejected pool block: no tier past it */
        for (uint32_t j = 0; j < m; j++)
            inf->lossy_tokens += T->blossy[s->table[j]] ? bt : 0;
        return m;
    }
    if (m < cm) inf->rejected_blocks = 0; /* they were lower-tier hits, not rejections */
    uint64_t tenant = ikv_scope_salt(e->opt.key_seed, r->tenant);
    uint64_t pub = ikv_scope_salt(e->opt.key_seed, NULL);
    for (uint32_t j = 0; j < nfull; j++)
        T->salt[j] = (uint64_t)(j + 1) * bt <= r->public_tokens ? pub : tenant;
    for (uint32_t j = m; j < cm; j++)
        T->src[j] = T->mtier[j];
    uint32_t lo_end = (uint32_t)cm, cand = lo_end;
    if (cand < nfull && cand < limit) {
        cand = probe(e, T, lo_end, nfull);
        for (uint32_t j = lo_end; j < cand; j++)
            T->cnt[T->src[j] - 1].probed++;
    }
    if (cand > limit) cand = limit;
    if (lo_end > cand) lo_end = cand;
    if (cand <= m) {
        if (cm > m) *core_m = m; /* recompute the lower-tier blocks into fresh ones */
        for (uint32_t j = 0; j < m; j++)
            inf->lossy_tokens += T->blossy[s->table[j]] ? bt : 0;
        return m;
    }
    /* the split: load [m, sp), recompute [sp, cand) */
    uint32_t sp = m;
    double best = -1, load_s = 0;
    for (uint32_t x = m;; x++) {
        if (x == m || x == cand || T->src[x] != T->src[x - 1]) {
            double cost =
                load_s + ikv_engine_prefill_estimate(e, (size_t)x * bt, (size_t)cand * bt);
            if (T->s_per_flop <= 0 && x < cand) cost = 1e300; /* nothing measured: load */
            if (best < 0 || cost < best) best = cost, sp = x;
        }
        if (x == cand) break;
        size_t t = (size_t)T->src[x] - 1;
        load_s += T->load_s[t] > 0 ? T->load_s[t] : 0;
    }
    for (uint32_t j = sp; j < cand; j++) {
        T->cnt[T->src[j] - 1].recomputed++;
        inf->tier_cheaper_tokens[T->src[j]] += bt;
    }
    int noroom;
    uint32_t got = load(e, T, r, m, sp, &noroom); /* counts a failed load itself in failed */
    for (uint32_t j = got; j < sp; j++) { /* the load that stopped and the rest of the run */
        if (noroom)
            T->cnt[T->src[j] - 1].rec_noroom++, inf->tier_noroom_tokens[T->src[j]] += bt;
        else
            T->cnt[T->src[j] - 1].rec_failed++, inf->tier_failed_tokens[T->src[j]] += bt;
    }
    /* promote the core's blocks [m, min(got, lo_end)): they adopt the loaded pool blocks */
    uint32_t u = m, core_end = got < lo_end ? got : lo_end;
    if (core_end > m) {
        T->adopting = 1, T->adopt_a = m, T->adopt_b = core_end, T->adopt_seq = s;
        (void)ikv_cache_hit(e->cache, e->nodes + m, core_end - m, acc); /* EFULL: fewer */
        T->adopting = 0;
        while (u < core_end && T->pre[u] == IKV_NIL && e->node2blk[e->nodes[u]] != IKV_NIL &&
               e->state[e->node2blk[e->nodes[u]]] == IKV__BLK_READY &&
               e->bnode[e->node2blk[e->nodes[u]]] == e->nodes[u] &&
               ikv_cache_node_tier(e->cache, e->nodes[u]) == 0)
            u++;
    }
    if (u > m) {
        /* lock the promoted blocks [m, u) for the request (the hit held them only briefly) */
        int rc = ikv_cache_lock(e->cache, e->nodes + m, u - m);
        IKV_ASSERT(rc == 0);
        for (uint32_t j = m; j < u; j++)
            s->locked[s->n_locked++] = e->nodes[j];
    }
    /* insert the probed blocks [lo_end, got) under them, locked; they adopt their blocks */
    if (u == lo_end && got > lo_end) {
        size_t ins = 0;
        int rc = ikv_cache_insert(e->cache, e->keys, got, lo_end, acc, 1, e->nodes + lo_end, &ins);
        if (rc && rc != IKV_EFULL) ins = 0;
        T->adopt_seq = s;
        for (uint32_t i = 0; i < (uint32_t)ins; i++) {
            uint32_t j = lo_end + i, node = e->nodes[j];
            IKV_ASSERT(e->node2blk[node] == IKV_NIL);
            adopt(e, T, node, j);
            s->locked[s->n_locked++] = node;
        }
        u = lo_end + (uint32_t)ins;
    }
    /* loaded blocks the core had no room for still serve this request, as private blocks */
    uint32_t v = u;
    while (v < cand && T->pre[v] != IKV_NIL) {
        uint32_t b = T->pre[v];
        T->pre[v] = IKV_NIL;
        e->bdepth[b] = v;
        e->bparent[b] = v ? s->table[v - 1] : IKV_NIL;
        s->table[v] = b;
        s->n_blocks = ++v;
    }
    for (uint32_t j = m; j < v; j++) {
        size_t t = (size_t)T->src[j] - 1;
        T->cnt[t].loaded++;
        inf->tier_tokens[t + 1] += bt;
    }
    for (uint32_t j = 0; j < v; j++)
        inf->lossy_tokens += T->blossy[s->table[j]] ? bt : 0;
    /* loaded but not adopted (no room in the core): back to the pool, to be recomputed */
    for (uint32_t j = m; j < cand; j++)
        if (T->pre[j] != IKV_NIL) {
            push(e, T->pre[j]);
            T->pre[j] = IKV_NIL;
        }
    /* [m, got) was loaded; [v, got) of it is not the request's (m <= v <= got <= sp <= cand) */
    for (uint32_t j = v; j < got; j++) {
        T->cnt[T->src[j] - 1].rec_dropped++;
        inf->tier_dropped_tokens[T->src[j]] += bt;
    }
    inf->recomputed_tier_tokens = (size_t)(cand - v) * bt;
    /* the engine inserts [u, nfull) (lower-tier ones are promoted and recomputed) unless
     * private loaded blocks follow u: then nothing is inserted (*core_m != v) */
    *core_m = u;
    return v;
}

void ikv__tiers_done(ikv_engine *e, struct ikv_seq *s, uint32_t m, uint32_t inserted,
                     double prefill_s) {
    tiers *T = e->tiers;
    const uint64_t tenant = s->salt, pub = ikv_scope_salt(e->opt.key_seed, NULL);
    const size_t public_tokens = s->public_tokens, n = s->n_prompt;
    for (uint32_t j = m; j < s->n_blocks; j++)
        T->blossy[s->table[j]] = 0; /* computed: exact */
    for (uint32_t j = m; j < m + inserted; j++) {
        uint32_t b = s->table[j];
        if (b != IKV_NIL && e->bnode[b] != IKV_NIL)
            T->nscope[e->bnode[b]] = (uint64_t)(j + 1) * e->bt <= public_tokens ? pub : tenant;
    }
    flush(T); /* this request's demotions, in one run */
    /* write-through to shared stores, so other engines find the new blocks at once: the
     * inserted blocks, and the full blocks computed as private because the pool had no room
     * (a later request finds them by probing) */
    uint32_t nfull = s->no_cache ? 0 : (uint32_t)(n / e->bt); /* no keys without the cache */
    for (uint32_t j = 0; j < nfull; j++) {
        T->salt[j] = (uint64_t)(j + 1) * e->bt <= public_tokens ? pub : tenant;
        e->keys[j] = ikv_key_chain(e->opt.key_seed, j ? &e->keys[j - 1] : NULL,
                                   s->tok + (size_t)j * e->bt, e->bt, T->salt[j]);
    }
    for (size_t t = 0; t < T->n; t++) {
        if (!ikv_store_shared(T->st[t])) continue;
        for (uint32_t j0 = m; j0 < nfull; j0 += CH) {
            uint32_t k = nfull - j0 < CH ? nfull - j0 : CH;
            for (uint32_t i = 0; i < k; i++) {
                uint32_t j = j0 + i, b = s->table[j];
                pack(e, T, b, e->keys[j], T->salt[j], T->stage_p[i]);
            }
            double t0 = ikv_now();
            size_t ok = ikv_store_put_run(T->st[t], T->stage_p, k, T->rcs);
            if (ok == k) ema(&T->put_s[t], (ikv_now() - t0) / k);
            T->cnt[t].demoted += ok;
        }
    }
    size_t first = (size_t)m * e->bt;
    if (n > first && prefill_s > 0) ema(&T->s_per_flop, prefill_s / prefill_flops(e, first, n));
}

void ikv__tiers_pin_load_s(ikv_engine *e, size_t t, double s) {
    IKV_ASSERT(e->tiers && t >= 1 && t <= e->tiers->n);
    e->tiers->pinned[t - 1] = s >= 0;
    if (s >= 0) e->tiers->load_s[t - 1] = s;
}

int ikv_engine_tier_stats_get(const ikv_engine *e, size_t t, ikv_engine_tier_stats *st) {
    memset(st, 0, sizeof *st);
    const tiers *T = e->tiers;
    if (!T || t < 1 || t > T->n) return ikv_error(IKV_ERANGE, "no lower tier %zu", t);
    const tier_counts *c = &T->cnt[t - 1];
    st->spec = ikv_store_spec(T->st[t - 1]);
    st->capacity = ikv_cache_capacity(e->cache, t);
    ikv_cache_stats cs;
    ikv_cache_stats_get(e->cache, &cs);
    st->resident = cs.resident[t];
    st->loaded_blocks = c->loaded;
    st->recomputed_blocks = c->recomputed;
    st->failed_blocks = c->failed;
    st->recomputed_failed_blocks = c->rec_failed;
    st->recomputed_noroom_blocks = c->rec_noroom;
    st->recomputed_dropped_blocks = c->rec_dropped;
    st->probed_blocks = c->probed;
    st->demoted_blocks = c->demoted;
    st->deleted_blocks = c->deleted;
    st->load_s_per_block = T->load_s[t - 1];
    st->put_s_per_block = T->put_s[t - 1];
    ikv_store_stats_get(T->st[t - 1], &st->store);
    return 0;
}
