/*
 * Internals shared by the files of the model module (not a public header).
 *
 * The model struct holds pointers into one fp32 image laid out exactly like a llama2.c
 * checkpoint (header, then weights), either mmapped from a file or allocated and filled
 * with random weights. Matrices are row-major (out, in), as llama2.c stores them, so a
 * linear layer is y = W x and a batch is Y = X W^T.
 */
#ifndef ISOKV_MODEL_INTERNAL_H
#define ISOKV_MODEL_INTERNAL_H

#include "isokv/model.h"

#define IKV__CKPT_HEADER_BYTES 28 /* 7 x int32 */

typedef struct ikv__weights {
    const float *emb;       /* (vocab, dim) */
    const float *rms_att;   /* (layer, dim) */
    const float *wq;        /* (layer, n_heads * head_dim, dim) */
    const float *wk;        /* (layer, n_kv_heads * head_dim, dim) */
    const float *wv;        /* (layer, n_kv_heads * head_dim, dim) */
    const float *wo;        /* (layer, dim, n_heads * head_dim) */
    const float *rms_ffn;   /* (layer, dim) */
    const float *w1;        /* (layer, hidden, dim) */
    const float *w2;        /* (layer, dim, hidden) */
    const float *w3;        /* (layer, hidden, dim) */
    const float *rms_final; /* (dim) */
    const float *wcls;      /* (vocab, dim); == emb when shared */
} ikv__weights;

/* The int8 matrices of a llama2.c version-2 checkpoint (checkpoint_q8.c), in file order. */
enum {
    IKV__QM_EMB, /* (vocab, dim) token embedding, also the classifier when shared */
    IKV__QM_Q,
    IKV__QM_K,
    IKV__QM_V,
    IKV__QM_O,
    IKV__QM_1,
    IKV__QM_2,
    IKV__QM_3,
    IKV__QM_CLS, /* (vocab, dim); the embedding's when shared */
    IKV__QM_KINDS
};

/* One int8 matrix kind [rows][cols] per layer: layer l's values start at q + l * stride, then
 * rows * cols / gs fp32 scales (one per group of gs consecutive values of a row; gs divides
 * cols), which need not be 4-byte aligned in the file (read them with memcpy or unaligned
 * loads). */
typedef struct ikv__qmat {
    const int8_t *q;
    size_t stride; /* bytes from one layer's values to the next's */
    size_t rows, cols;
} ikv__qmat;

struct ikv_model {
    ikv_model_config cfg;
    ikv__weights w; /* fp32 weights; with gs > 0 only the norms are set */
    int gs;         /* 0: fp32 weights; > 0: int8 weights in groups of gs (llama2.c version 2) */
    ikv__qmat qm[IKV__QM_KINDS]; /* the int8 matrices when gs > 0 */
    int head_dim, q_dim, kv_dim; /* head_dim = dim / n_heads; q_dim = dim; kv_dim */
    void *image;                 /* the whole checkpoint image */
    size_t image_bytes;
    int mapped; /* 1: image is an mmap; 0: ikv_malloc'd */
};

/* Number of fp32 values in each section, for a valid config (u64, cannot overflow for
 * configs within ikv_model_config_check's limits). */
uint64_t ikv__ckpt_floats(const ikv_model_config *c);

/* Sets m->w and the derived sizes from an image whose header was already validated. */
void ikv__model_bind(struct ikv_model *m, const ikv_model_config *c);

/* ikv_tokenizer_encode with the merge loop chosen: naive = 1 is llama2.c's O(n^2) rescan, 0 the
 * heap (same result, O(n log n)); the naive one is the tests' oracle. (tokenizer.c) */
int ikv__tokenizer_encode_with(const ikv_tokenizer *t, const char *text, int bos, int eos,
                               uint32_t *out, size_t max, size_t *n, int naive);

/* ---- int8 weights (checkpoint_q8.c: format; quant.c: kernels) ------------------------------ */

#define IKV__CKPT_Q8_HEADER_BYTES 256
#define IKV__CKPT_Q8_MAGIC        0x616b3432u /* "ak42" read as a little-endian uint32 */

/* Parses and checks a version-2 image (magic already seen), binds m->w's norms and m->qm.
 * Returns 0 or IKV_EFORMAT/IKV_ETRUNC naming `path` and the problem. (checkpoint_q8.c) */
int ikv__q8_bind(struct ikv_model *m, const char *path, const void *image, size_t bytes);

/* Layer l's values and scales of matrix kind k. */
static inline const int8_t *ikv__qm_q(const struct ikv_model *m, int k, int l) {
    return m->qm[k].q + (size_t)l * m->qm[k].stride;
}
static inline const uint8_t *ikv__qm_s(const struct ikv_model *m, int k, int l) {
    return (const uint8_t *)ikv__qm_q(m, k, l) + m->qm[k].rows * m->qm[k].cols;
}

/* An activation row quantized as llama2.c's runq.c does: per group of gs values, scale =
 * max |x| / 127 and q = round(x / scale) (half away from zero; 0 when the group is all zero);
 * a = |q| (for the AVX2 kernels' unsigned operand); c[g] = -128 * (sum of group g's q), where
 * the VNNI kernels' integer sums start (quant.c). Buffers of n, n, n / gs and n / gs entries;
 * c may be NULL (then not written), but the packed VNNI products need it. */
typedef struct ikv__q8act {
    int8_t *q;
    uint8_t *a;
    float *s;
    int32_t *c;
} ikv__q8act;

/* Quantizes x[0..n) (gs divides n) into act. Same bits on every kernel path. Does not
 * allocate. (quant.c) */
void ikv__q8_quantize(const float *x, size_t n, int gs, const ikv__q8act *act);
/* y[r] = sum over groups g of ((float)(int32 dot of row r's group g with x's) * w_scale) *
 * x_scale, accumulated in group order from 0 (runq.c's matmul), for rows [r0, r1) of matrix
 * kind k of layer l. A row's result depends only on the row and x (same bits whatever range it
 * is computed in, on every kernel path). Does not allocate. (quant.c) */
void ikv__q8_matvec(const struct ikv_model *m, int k, int l, const ikv__q8act *x, float *y,
                    size_t r0, size_t r1);
/* Packs weight rows [n0, n1) of kind k, layer l into `out` in the layout the current kernel
 * level's int8 matrix product wants (super-blocks of 64 rows for AVX-512 VNNI, blocks of 8 rows
 * for AVX2; none for the portable level). Returns the bytes it takes (0: no packing at this level);
 * out NULL only measures. (quant.c) */
size_t ikv__q8_pack(const struct ikv_model *m, int k, int l, size_t n0, size_t n1, uint8_t *out);
/* Y[i][r] for rows i < M of X (stride cols) and weight rows r in [n0, n1) of kind k, layer l:
 * each X row quantized into row i of buf (room for M rows: M * cols values, M * cols / gs
 * scales), then the int8 product with runq.c's arithmetic, so every output gets the bits
 * ikv__q8_matvec gives that row alone (whatever M, n0, n1 and kernel path). `packed` holds
 * ikv__q8_pack(m, k, l, n0, n1) (or NULL: the matvec kernel row by row). Y has row stride ldy.
 * Does not allocate. (quant.c) */
void ikv__q8_gemm(const struct ikv_model *m, int k, int l, const float *X, size_t M,
                  const ikv__q8act *buf, const uint8_t *packed, float *Y, size_t ldy, size_t n0,
                  size_t n1);
/* Tests and benchmarks: the prefill scheme of engines created next for int8 models (1 int8
 * products, 0 dequantize + sgemm, -1 the default). (engine.c) */
void ikv__q8_prefill_force(int mode);
/* out[(r - r0) * cols + j] = q[r][j] * scale of its group, rows [r0, r1) of kind k, layer l
 * (runq.c's dequantize). Does not allocate. */
void ikv__q8_dequant_rows(const struct ikv_model *m, int k, int l, size_t r0, size_t r1,
                          float *out);
/* Forces the int8 kernels: 0 portable C, 1 AVX2, 2 AVX-512 VNNI with 512-bit matrix-product
 * kernels, 3 the same on 256-bit vectors, or -1 detection (the default width where the CPU has
 * VNNI). A level the CPU lacks falls back to the best below it. Tests only, before any engine
 * runs. Not thread-safe. */
void ikv__q8_simd_force(int level);
/* The kernel level in use (0..3) and its name ("portable", "avx2", "avx512-vnni",
 * "avx512-vnni-256"); the highest level this CPU can take. */
int ikv__q8_simd_level(void);
const char *ikv__q8_simd_name(void);
int ikv__q8_simd_max(void);

/* One thread's packed share of a weight matrix: rows [n0, n1) at q8pack + off (n1 == n0: none). */
typedef struct ikv__q8slice {
    size_t off, n0, n1;
} ikv__q8slice;

/* y[r0..r1) from rows packed by ikv__q8_pack(m, k, l, pn0, pn1) at `packed`, when [r0, r1)
 * lies in [pn0, pn1) and the packing of this level has r0 - pn0 on a block boundary (64 rows
 * for VNNI, 8 for AVX2): the matrix-product kernel on one row, the same bits as ikv__q8_matvec.
 * Returns 1 if it computed them, 0 if the caller must (no packing at this level, an unaligned
 * r0, or no x->c for VNNI). Does not allocate. (quant.c) */
int ikv__q8_gemv_packed(const struct ikv_model *m, int k, const uint8_t *packed, size_t pn0,
                        size_t pn1, const ikv__q8act *x, float *y, size_t r0, size_t r1);
/* The same for M quantized rows of x (row i at x->q + i * cols, x->s + i * cols / gs) into
 * Y[i * ldy + r]: batched decode. Same bits per row as one row alone. (quant.c) */
int ikv__q8_linear_packed(const struct ikv_model *m, int k, const uint8_t *packed, size_t pn0,
                          size_t pn1, const ikv__q8act *x, size_t M, float *Y, size_t ldy,
                          size_t r0, size_t r1);

/* ---- worker pool (pool.c) ----------------------------------------------------------------- */

/* One fork-join region: fn(ctx, t, n) runs on every thread t of n; t = 0 is the caller. */
typedef void (*ikv__task)(void *ctx, int tid, int nthreads);
typedef struct ikv__pool ikv__pool;

/* Starts n - 1 worker threads (n in 1..256; n = 1 starts none). Returns 0, IKV_EINVAL,
 * IKV_ENOMEM (allocation or pthread_create failed; nothing is left running). */
int ikv__pool_create(int n, ikv__pool **out);
/* Stops and joins the workers. Takes NULL. */
void ikv__pool_destroy(ikv__pool *p);
/* Runs one region and returns when every thread has finished it. Not reentrant: one caller
 * thread drives a pool. Does not allocate. */
void ikv__pool_run(ikv__pool *p, ikv__task fn, void *ctx);
int ikv__pool_size(const ikv__pool *p);
/* Lets threads 0..k-1 run the following regions (thread t runs shares t, t + k, ...: the same
 * bits at any k); the others park without spinning. Between regions only. Returns 0 or
 * IKV_EINVAL (k outside 1..n; nothing changed). Does not allocate. */
int ikv__pool_set_active(ikv__pool *p, int k);
/* Inside a region fn(ctx, t, P): returns once all P threads have called it (a barrier between
 * the phases of one region). Only where every share runs on its own thread: P equal to the
 * pool's size and ikv__pool_active (asserted). Spins, then yields; does not allocate. */
void ikv__pool_barrier(ikv__pool *p, int P);
int ikv__pool_active(const ikv__pool *p);
/* Regions thread t has run shares in since create (for tests). */
uint64_t ikv__pool_ran(const ikv__pool *p, int t);
/* CPU seconds the worker threads (not the caller) have used since they started. */
double ikv__pool_worker_cpu(const ikv__pool *p);

/* ---- engine internals (engine.c: pool and request flow; forward.c: the math) ------------ */

/* PARKED: the last partial prompt block of an ended sequence, kept (outside the cache core)
 * so that a later request continuing the same prefix copies its KV instead of recomputing it;
 * reclaimed, oldest first, whenever the free stack is empty (so it counts as free). */
enum { IKV__BLK_FREE = 0, IKV__BLK_PRIVATE, IKV__BLK_PENDING, IKV__BLK_READY, IKV__BLK_PARKED };

/* A parked partial block: its first ntok token positions hold prompt KV computed by a prefill
 * after the cached block `parent` (IKV_NIL: it is the first block) whose key was pkey, under
 * scope salt `salt`. */
typedef struct ikv__parked {
    uint32_t blk, parent, ntok;
    ikv_key pkey;
    uint64_t salt, stamp;
} ikv__parked;

struct ikv_seq {
    int active;
    uint32_t n;        /* positions written so far */
    uint32_t n_blocks; /* entries used in table */
    uint32_t *table;   /* [max_blocks] physical block of each block index */
    uint32_t *locked;  /* [max_blocks] cache node ids this sequence holds locked */
    uint32_t n_locked;
    float *logits;         /* [vocab] logits of the last position */
    uint32_t *tok;         /* [seq_len] token ids of positions 0..n_prompt and decoded */
    uint32_t n_prompt;     /* prompt positions; positions [n, n_prompt) still to prefill */
    uint32_t limit;        /* positions this sequence may reach (prompt + max_new, <= seq_len) */
    uint32_t reserve;      /* private blocks reserved for it at admission */
    uint32_t pend0, pend1; /* block indices [pend0, pend1) inserted, not yet computed */
    uint64_t salt;         /* scope salt of its private blocks */
    size_t public_tokens;
    int no_cache;
    /* lower tiers: the blocks taken from the cache and inserted at admission, and the time
     * its prefill chunks took, for ikv__tiers_done when the prompt is complete */
    uint32_t tier_m, tier_ins;
    double prefill_s;
    uint32_t vnb0; /* ikv_engine_step with a draft: n_blocks before its rows (roll-back) */
};

struct ikv_engine {
    const ikv_model *m;
    ikv_engine_options opt;
    uint32_t bt;         /* tokens per block */
    uint32_t T;          /* prefill tile rows */
    uint32_t G;          /* tiles per projection call in a prefill (1 unless the check passed) */
    uint32_t TP;         /* rows a tile takes in the prefill buffers: T, or T rounded up */
    uint32_t Q;          /* a tile alone: projections on its computed rows rounded out to
                            multiples of Q (0: on all TP rows) */
    uint32_t max_blocks; /* blocks of one full-length sequence: ceil(seq_len / bt) */
    uint32_t Lmax;       /* seq_len rounded up to a multiple of T: widest attention row */

    /* KV pool: nblocks blocks of block_floats floats, laid out layer by layer as
     * [layer][block][k|v][kv_head][token (bt)][head_dim]: a block's K and V of one layer are
     * one run (32 KiB on `small`), and blocks next to each other in the pool are next to each
     * other in every layer. */
    float *kv;
    uint32_t nblocks;
    size_t block_floats;
    uint8_t *state;       /* [nblocks] IKV__BLK_* */
    uint32_t *bnode;      /* [nblocks] cache node of a cached block */
    uint32_t *bdepth;     /* [nblocks] block index in its sequence */
    uint32_t *bparent;    /* [nblocks] physical block of the previous block (IKV_NIL for 0) */
    uint32_t *btokens;    /* [nblocks][bt] token ids the block holds */
    ikv_key *bkey;        /* [nblocks] key of a cached block */
    uint32_t *free_stack; /* [nblocks] */
    uint32_t n_free;
    uint32_t *node2blk; /* [node_limit] physical block of each cache node, IKV_NIL if none */
    uint64_t node_limit;

    ikv_cache *cache;
    uint64_t clock;    /* logical time: one tick per request */
    uint64_t capacity; /* cache capacity, blocks */

    ikv_seq *seqs;   /* [max_seqs] */
    ikv_key *keys;   /* [max_blocks] request scratch */
    uint32_t *nodes; /* [max_blocks] */

    /* forward pass: nth threads (the caller and nth - 1 pool workers), each with its own
     * slice of the per-thread scratch below; forward.c partitions every region by thread
     * index with fixed boundaries */
    int nth;
    ikv__pool *pool;
    /* forward scratch (T rows each unless said) */
    float *x; /* [Lmax / T tiles][TP][dim] residual rows of a prefill's tiles (decode: row 0) */
    float *xb, *q, *k, *v, *att, *hb, *hb2; /* [G TP][dim|q_dim|kv_dim|hidden] */
    float *S;       /* [nth][S_rows][Lmax] attention scores / probabilities, per thread */
    size_t S_rows;  /* kvmul * max(T, n_kv_heads): a prefill tile's or a decode step's rows */
    float *rinv;    /* [nth][S_rows] 1 / softmax sum of each prefill score row, per thread */
    float *qg;      /* [nth][kvmul * T][head_dim] stacked queries (then outputs) of one kv head */
    float *Kc, *Vc; /* [n_kv_heads][Lmax][head_dim] K/V gathered through the table */
    float *rope_cos, *rope_sin; /* [seq_len][head_dim / 2] */
    float *xn;                  /* [nth][dim] each thread's copy of a normed row (decode, logits) */
    float *dpart; /* decode attention: [dmax x chunks][n_heads][head_dim + 2] (O, M, L) per chunk */
    /* int8 models (m->gs > 0): each thread's quantized activation row (act_w = max(dim,
     * hidden) values, act_w scales room), and its buffer for the weight rows of a prefill
     * projection call dequantized to fp32 (wdq_floats each) */
    int8_t *aq;   /* [nth][act_rows][act_w] */
    uint8_t *aa;  /* [nth][act_rows][act_w] |aq| */
    float *as;    /* [nth][act_rows][act_w] (act_w / gs used per row) */
    int32_t *ac;  /* [nth][act_rows][act_w] (act_w / gs used per row): ikv__q8act.c */
    size_t act_w;
    float *wdq; /* [nth][wdq_floats] */
    size_t wdq_floats;
    uint8_t *q8pack;    /* the int8 weight rows of every thread's share of every projection
                           and of the classifier, packed once at create (ikv__q8_pack) */
    ikv__q8slice *q8sl; /* [layer][IKV__QM kind][thread] where each share lies in q8pack */
    size_t act_rows; /* rows of each thread's activation buffers (prefill: a call's rows) */
    int q8_gemm; /* int8 model: 1 = prefill projections by int8 products (runq.c's arithmetic,
                    the same bits as decode's), 0 = weight rows dequantized for sgemm */

    /* admission: private blocks set aside for sequences (nblocks = capacity + private_budget)
     * and the part reserved by admitted sequences */
    uint64_t private_budget, reserved;
    ikv__parked *parked; /* [n_parked_max] */
    uint32_t n_parked, n_parked_max;
    uint64_t park_clock;

    /* batched decode (ikv__decode_batch): up to dmax rows, one per sequence */
    uint32_t dmax;
    struct ikv_seq **dseq;      /* [dmax] */
    size_t *dpos;               /* [dmax] position of each row */
    uint32_t *dtok;             /* [dmax] token of each row */
    size_t *dcoff;              /* [dmax + 1] first attention chunk of each row */
    float *dx, *dxn, *dxb;      /* [dmax][dim] residual, normed, projection out */
    float *dxnt;                /* int8 models: [nth][dmax][dim] each thread's normed rows */
    float *dq, *dk, *dv, *datt; /* [dmax][q_dim | kv_dim | kv_dim | q_dim] */
    float *dhb, *dhb2;          /* [dmax][hidden] */
    float *dlog;                /* [dmax][vocab] */
    uint32_t max_draft; /* ikv_engine_verify: draft tokens at most (dmax >= max_draft + 1) */
    uint32_t *vsave;    /* [dmax] block token ids a verify overwrote (restored on roll-back) */

    uint64_t n_requests, n_cached_tokens, n_computed_tokens, n_rejected, n_partial_hits;
    struct ikv__tiers *tiers; /* lower tiers (tiers.c); NULL without any */
};

/* ---- lower tiers (tiers.c) ---------------------------------------------------------------- */

/* Adds the lower tiers of o to the cache config (before the cache is created). */
void ikv__tiers_config(const struct ikv_engine *e, const ikv_engine_options *o,
                       ikv_cache_config *cc);
/* Allocates the tier state, probes every store's speed and the prefill rate. 0 or an error. */
int ikv__tiers_create(struct ikv_engine *e, const ikv_engine_options *o);
void ikv__tiers_destroy(struct ikv_engine *e);
/* The core moved a block (from_tier -> to_tier; -1 = dropped): write, move, delete, adopt. */
void ikv__tiers_on_evict(struct ikv_engine *e, uint32_t node, ikv_key key, int from_tier,
                         int to_tier);
/* After the local longest match: m verified pool blocks of s are locked; *core_m blocks are
 * resident. Loads the lower-tier blocks that follow (from the core's tiers and, probing shared
 * stores, blocks this index never saw) into fresh pool blocks, or leaves them to be
 * recomputed, whichever is cheaper; locks and records the loaded ones in s. Returns the
 * usable prefix and sets *core_m so the engine inserts the rest from there. */
uint32_t ikv__tiers_match(struct ikv_engine *e, const ikv_request *r, struct ikv_seq *s,
                          uint32_t m, size_t *core_m, uint32_t nfull, const ikv_access *acc,
                          ikv_prefill_info *inf);
/* When the prefill of s's prompt positions [m * bt, n_prompt) is complete (the last chunk of
 * ikv_engine_step): records the scopes of the inserted blocks [m, m + inserted) and the
 * measured prefill time, flushes queued demotions, and writes the request's computed full
 * blocks through to the shared stores. Recomputes the prompt's block keys from s->tok (other
 * admissions have reused the engine's key scratch since). */
void ikv__tiers_done(struct ikv_engine *e, struct ikv_seq *s, uint32_t m, uint32_t inserted,
                     double prefill_s);

/* Tests: pins lower tier t's (1..n) load estimate at s seconds per block (no running average
 * updates it after); s < 0 unpins. */
void ikv__tiers_pin_load_s(struct ikv_engine *e, size_t t, double s);

/* K (kv = 0) or V (kv = 1) of `layer`, kv head `g`, slot `slot` of physical block b. */
static inline float *ikv__kv_at(const struct ikv_engine *e, uint32_t b, int layer, int kv, int g,
                                uint32_t slot) {
    const struct ikv_model *m = e->m;
    size_t hd = (size_t)m->head_dim, nkv = (size_t)m->cfg.n_kv_heads;
    return e->kv +
           (((((size_t)layer * e->nblocks + b) * 2 + (size_t)kv) * nkv + (size_t)g) * e->bt +
            slot) *
               hd;
}

/* Prefill positions [first, n) on the tiles of T rows that cover them (tile k: positions
 * [kT, kT + T), rows outside [first, n) zero padding); writes their K/V through s->table;
 * leaves the final residual rows in e->x (ikv__prefill_row finds a position's). Does not
 * allocate. (forward.c) */
void ikv__prefill(struct ikv_engine *e, struct ikv_seq *s, const uint32_t *tokens, size_t first,
                  size_t n);
/* Blocks per chunk of decode attention: the unit of its split over threads (forward.c). */
#define IKV__DC_CHUNK 4

/* Checks, for every projection sgemm call of a prefill (each thread's, on layer 0's weights,
 * with random rows), whether each row gets the same bits as in a call of its own tile's TP
 * rows: bit 0, in a call of G tiles of TP rows each (G > 1); bit 1, in a call of rows [a, b)
 * of its tile, a < b multiples of Q (Q > 0, TP a multiple of Q). Returns the bits that held.
 * X holds G TP x max(dim, hidden) floats, Y1 and Y2 as many (scratch, overwritten). Does not
 * allocate. (forward.c) */
int ikv__prefill_group_check(const struct ikv_engine *e, uint32_t G, uint32_t TP, uint32_t Q,
                             float *X, float *Y1, float *Y2);
/* The fp32 floats the largest prefill projection call's weight rows take (the dequantization
 * buffer per thread of an int8 model); 0 for fp32 models. (forward.c) */
size_t ikv__prefill_wdq_floats(const struct ikv_engine *e);
/* Lays out (dst NULL: fills e->q8pk_off, returns the total bytes) or fills (dst = e->q8pack) the
 * packed int8 weight rows of every prefill projection call: per layer, kind, thread and call.
 * (forward.c) */
size_t ikv__prefill_q8_prepack(struct ikv_engine *e, uint8_t *dst);
/* Tests: restricts ikv_engine_create to prefill scheme 0 (tiles of T rows, trims of 16) or 1
 * (tiles padded to a multiple of 12 rows, trims of 12), or -1 (both, the default). */
void ikv__prefill_scheme_force(int scheme);
/* Takes the blocks of positions [s->n, n) of s (from its reservation) and records their token
 * ids tokens[s->n..n) (tokens indexed by position), with no prefill pending. The caller writes
 * their K/V (chunks.c's blend pass) and advances s->n, or makes them prompt positions
 * (s->n_prompt = n) for the ordinary prefill. 0, or IKV_EFULL beyond the reservation (nothing
 * changed). Does not allocate. (engine.c) */
int ikv__seq_extend(struct ikv_engine *e, struct ikv_seq *s, const uint32_t *tokens, size_t n);
/* The final residual row of position p after ikv__prefill(e, s, tokens, first, n). */
const float *ikv__prefill_row(const struct ikv_engine *e, size_t first, size_t p);
/* Final RMSNorm of one residual row and the classifier (matrix-vector). */
void ikv__logits_row(struct ikv_engine *e, const float *xrow, float *out);
/* One decode step of `token` at position pos = s->n (its block already in the table). */
void ikv__decode_step(struct ikv_engine *e, struct ikv_seq *s, uint32_t token, size_t pos);
/* Decode of rows [0, nb) of the batch: row i is token e->dtok[i] of sequence e->dseq[i] at
 * position e->dpos[i] (its block already in the table; distinct sequences). Leaves each
 * sequence's logits. The weight products go through ikv__linear_rows with all nb rows, so
 * every weight row is read once per step; each row's bits do not depend on nb. (forward.c) */
void ikv__decode_batch(struct ikv_engine *e, size_t nb);
/* The acceptance rule of ikv_sampler_accept with its two uniforms given (u1 decides
 * acceptance: u1 < probs[draft]; u2 picks from the rest): the arithmetic, for tests. Returns 1
 * (accepted, *out = draft) or 0 (*out drawn from probs without draft, renormalised). */
int ikv__sampler_accept_coins(const float *probs, uint32_t n, uint32_t draft, float u1, float u2,
                              uint32_t *out);
/* Y[b * ldy + r] = W[r] . X[b * ldx] for r in [r0, r1), b in [0, nx); W is [N][K] row-major.
 * Each element's bits depend only on K, W[r] and X[b] (linear.c). Does not allocate. */
void ikv__linear_rows(const float *W, size_t K, size_t r0, size_t r1, const float *X, size_t ldx,
                      size_t nx, float *Y, size_t ldy);
/* Whether the AVX2 + FMA kernels are in use (decided once per process; forward.c). */
int ikv__use_avx2(void);
/* Forces the SSE2 (avx2 = 0) or AVX2 (1, only where the CPU has AVX2 and FMA) kernels of
 * softmax, SwiGLU and decode's matrix-vector products and attention, or back to detection (-1). For
 * tests, before any engine runs: results are only comparable within one setting. Not thread-safe.
 */
void ikv__simd_force(int avx2);
/* The AVX-512 batch kernels (a verify's rows, batches of >= 4 rows), which give every row
 * exactly the bits of the AVX2 + FMA kernels: the 4 x 4 weight-product tiles of linear.c and
 * the multi-row decode attention of batch512.c. ikv__batch512_on: whether they are in use (the
 * CPU has AVX-512F, the AVX2 path is in use, not forced off). ikv__batch512_force(0 / 1 / -1):
 * off, on where the CPU has them, back to the default (on where it has them); for tests,
 * between steps. */
int ikv__batch512_on(void);
void ikv__batch512_force(int on);
/* Batched decode steps as one pool region with the batch rows split between threads
 * (forward.c, "the fused pass"; the same bits as the region-per-phase path):
 * ikv__fused_force(0) never, (1) for every fp32 step the pool can run it on (even small ones),
 * (-1) the default (fp32 models of <= 8 MB, steps of >= 32 rows). For tests, between steps. */
void ikv__fused_force(int on);
/* Multi-row decode attention (batch512.c): groups of at least IKV__AR_MIN consecutive batch
 * rows of one sequence (a verify's rows) take the kernel whose vector lanes are rows.
 * ikv__attn_rows_usable: whether engine e takes it (ikv__batch512_on, fp32, head_dim a
 * multiple of 8 and <= 64, the thread scratch large enough). */
#define IKV__AR_MIN   4
#define IKV__AR_LANES 16
int ikv__attn_rows_usable(const struct ikv_engine *e);
/* RMSNorm of nr (1..16) rows x[j * ld .. + n) into o (same stride) with weights w: each row
 * the bits of forward.c's rmsnorm (only where ikv__batch512_on). Does not allocate. */
void ikv__rmsnorm_rows(float *o, const float *x, const float *w, size_t n, size_t nr, size_t ld);
/* hb[i] = silu(hb[i]) * hb2[i] for the n elements (16 at a time, the rest under a lane mask),
 * with swiglu_avx2's operations per element; returns how many it did (n; 0 without AVX-512
 * compiled in; call only where ikv__batch512_on). */
size_t ikv__swiglu512(float *hb, const float *hb2, size_t n);
/* The greedy pick: the first index of the largest of x[0..n) by the strict > scan (NaNs never
 * chosen, 0 when x[0] is NaN or n is 0), vectorized where ikv__batch512_on. */
uint32_t ikv__argmax(const float *x, size_t n);
/* The constants of the attention exp (forward.c's exp_neg_scalar and its 4-, 8- and 1-lane
 * forms, batch512.c's 16-lane exp_neg16): n = round(r log2 e) by the 1.5 2^23 trick, f = r - n
 * ln 2 in two parts, and the Horner coefficients of e^f, highest degree first. Every path reads
 * these, so a value's exp has the same bits on all of them. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define EXP_C1    0.693359375f
#define EXP_C2    -2.12194440e-4f
#define EXP_H0    1.9875691500e-4f
#define EXP_H1    1.3981999507e-3f
#define EXP_H2    8.3334519073e-3f
#define EXP_H3    4.1665795894e-2f
#define EXP_H4    1.6666665459e-1f
#define EXP_H5    5.0000001201e-1f

/* The exps of the decode path, for tests: o1[i] one lane at a time, o8 by the widest vector of
 * forward.c's path in use (8 lanes on the AVX2 path, 4 on SSE2; the tail one by one)
 * (forward.c); ikv__exp_neg16_buf: the 16-lane exp of batch512.c on the first n & ~15 values,
 * returning how many it did (0 without AVX-512 compiled in; call only where
 * ikv__batch512_on). Inputs are exponents r <= 0 (larger ones give exp(0)). */
void ikv__exp_neg_paths(const float *x, size_t n, float *o1, float *o8);
size_t ikv__exp_neg16_buf(const float *x, size_t n, float *o);
/* Chunks [ch0, ch1) of dc_attn for nr (1..16) rows of sequence s in layer l, query heads
 * [h0, h1): row j's query is q + j * qstride ([n_heads][head_dim], after RoPE), its position
 * pos[j]; its (O, M, L) per head of chunk ch go to out[j] + ch * ostride ([n_heads][head_dim +
 * 2], dc_attn's layout) where row j has chunk ch; only heads [h0, h1) are written, so threads
 * may split a group by heads; out[j] NULL: row j is left out. scratch: 16 * (min(bt, Lmax) +
 * head_dim) floats. Does not allocate. */
void ikv__attn_rows(const struct ikv_engine *e, const struct ikv_seq *s, int l, size_t ch0,
                    size_t ch1, int h0, int h1, size_t nr, const float *q, size_t qstride,
                    const size_t *pos, float *const *out, size_t ostride, float *scratch);
/* Fills the RoPE tables. */
void ikv__rope_init(struct ikv_engine *e);

/* runq.c's arithmetic for int8 models (runq_ops.c): hb = silu(hb) * hb2 with libm's expf, and
 * one query head's attention at position pos (keys/values 0..pos of kv head g, layer l, through
 * s->table) into out[head_dim], att[pos + 1] being scratch. Bits depend only on the inputs. */
void ikv__runq_swiglu(float *hb, const float *hb2, size_t n);
void ikv__runq_attn_head(const struct ikv_engine *e, const struct ikv_seq *s, int l, int g,
                         const float *q, size_t pos, float *att, float *out);
/* ikv__runq_attn_head for query heads [h0, h1) at q (head h0's query; head_dim apart) into out
 * (likewise), reading each block's keys of all those heads in one run; att: (h1 - h0) (pos + 1)
 * floats of scratch. The same bits per head as ikv__runq_attn_head. */
void ikv__runq_attn_heads(const struct ikv_engine *e, const struct ikv_seq *s, int l, int h0,
                          int h1, const float *q, size_t pos, float *att, float *out);
/* ikv__runq_attn_head for nr <= 16 consecutive rows: query r at q + r ldq is at position p0 + r,
 * its output goes to out + r ldo (the same bits as the row alone). sc: sc_floats of scratch. */
void ikv__runq_attn_rows(const struct ikv_engine *e, const struct ikv_seq *s, int l, int g,
                         const float *q, size_t ldq, size_t p0, int nr, float *out, size_t ldo,
                         float *sc, size_t sc_floats);
/* x[i] = expf(x[i]) by the path the functions above take (exp16 where the CPU has AVX-512, which
 * must equal libm's expf on every input; tests), and whether that is the vector path. */
void ikv__runq_expf_buf(float *x, size_t n);
int ikv__runq_vector_exp(void);

#endif
