/*
 * Structured requests and position-independent chunk reuse (CacheBlend family).
 *
 * Chunk store. A reusable segment's K/V (every layer, every token) is kept under
 * XXH3-64(tokens; seed = model fingerprint ^ scope salt), the scope being IKV_SCOPE_PUBLIC for a
 * public segment and the tenant's ikv_scope_salt otherwise, with its token ids and the offset it
 * was computed at. A hit verifies the tokens and the salt (a collision is a miss). Entries are
 * allocated when stored (once per document, not per token) and the oldest go when the byte
 * budget is exceeded.
 *
 * Keys: stored as computed (RoPE'd at their original offset a) and re-rotated on placement at b:
 * each (2i, 2i+1) pair is rotated by the angle (b - a) * freq_i, computed in double. We chose
 * re-rotation over storing pre-RoPE keys because the stored keys are then byte for byte the
 * pool's keys (copied out of the blocks after an ordinary prefill, no change to the forward
 * pass's hot loop) and a placement at the same offset is the identity; the price is one
 * rotation per reused key, far cheaper than the projections it saves. Rounding: fresh keys use
 * the float tables at b; re-rotated ones differ by a few ulps (tested).
 *
 * Jobs (ikv_chunks_admit / _advance / _job_end; ikv_chunks_begin runs them in a row). With no
 * hit, or r >= 1, the whole prompt is admitted as an ordinary request (exact, prefix cache as
 * usual). Else the exact part — the positions before the first hit segment, at least one — is
 * admitted through the prefix cache (token-exact blocks, the leading public segments public)
 * and prefilled by the engine (ikv_engine_step, in chunks if the caller likes), so a cached
 * system prompt is taken from the cache and the blended request's K/V there are exact (its full
 * blocks are inserted as any prefill's). Then the blend pass, in units (a stage of a layer over a
 * row range) if asked:
 *
 *      [ exact part: prefix cache + engine prefill ][ hit doc | computed | hit doc | query ]
 *                                                   ^ blend pass: every row on layer 0 and the
 *                                                     selection layer, then the selected rows
 *
 * The rest's blocks are taken (private: blended K/V never enter the prefix cache) and the hit
 * segments' K/V written there, re-rotated. Layer 0 runs on every row of the rest (its K/V depend
 * only on token and position, so the reused ones equal fresh ones up to rounding; its outputs
 * are the next layer's inputs). Layer 1, the selection layer, computes fresh K/V for every row;
 * for each reused position the relative deviation |[K;V]fresh - [K;V]reused| / |[K;V]fresh| is
 * measured. Kept active: every non-reused position, each hit segment's first `first_tokens`,
 * the ceil(r x reused) most deviating ones, and any whose deviation exceeds max_dev (the
 * guard). The other reused positions keep their stored K/V and leave the pass; from there on
 * only active rows run, in every layer, attending to all positions. If every reused position
 * ends up active, the pass is abandoned: the rest becomes pending prompt positions for the
 * ordinary exact prefill (chunk-invariant, so "up to full" is exact). One pass at a time holds
 * the scratch (c->owner).
 *
 * int8 models: the projections run ikv__q8_gemm (each row quantized per group, runq.c's
 * arithmetic) on rows of a per-row activation scratch; the embedding is dequantized; K/V stay
 * fp32.
 *
 * Threads: the engine's worker pool; projections split by rows (one single-threaded sgemm per
 * thread), attention by (head, 64-row chunk). Scratch is allocated at create for seq_len rows.
 */
#include "blas.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define CH_ROWS 64 /* attention rows per work item */

typedef struct chunk {
    uint64_t hash, salt, stamp;
    uint32_t n, off;
    uint32_t *tok;
    float *kv; /* [layer][k|v][n][kv_dim] */
    size_t bytes;
} chunk;

typedef struct devpair {
    float dev;
    uint32_t row;
} devpair;

struct ikv_chunks {
    ikv_engine *e;
    ikv_chunks_options o;
    uint64_t fp;
    chunk *ent;
    size_t n_ent, cap_ent;
    uint64_t bytes, clock;
    /* scratch, seq_len rows */
    uint32_t *tok, *pos, *reused; /* reused[p]: 1 + index of hit entry, 0 if computed */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* [rows][dim|q_dim|kv_dim|hidden] */
    float *Kc, *Vc;                             /* [n_kv_heads][seq_len][head_dim] */
    float *S;                                   /* [nth][CH_ROWS][seq_len] */
    float *kvtmp;                               /* [2][kv_dim] */
    devpair *dp;                                /* [seq_len] */
    double *rc, *rs;                            /* [head_dim / 2] */
    /* int8 models: activation rows quantized for ikv__q8_gemm, [seq_len][max(dim, hidden)] */
    ikv__q8act act;
    size_t act_cols;
    ikv_blend_job *jobs; /* [max_seqs] */
    size_t n_jobs;
    ikv_blend_job *owner; /* the job whose blend pass holds the scratch (one at a time) */
};

enum { JOB_FREE = 0, JOB_LEAD, JOB_BLEND, JOB_EXACT, JOB_DONE };

/* One structured request from admission to its first token's logits. */
struct ikv_blend_job {
    int state;
    ikv_seq *s;
    ikv_blend_request r; /* segs, tenant and hits are the caller's, alive until job_end */
    size_t n, lead;      /* prompt positions; [0, lead) prefilled exactly (prefix cache) */
    size_t pub;          /* leading public tokens */
    uint64_t tsalt;
    float ratio, max_dev;
    int l;      /* blend pass: layer */
    int stage;  /* 0: Q/K/V of the active rows, 1: attention and FFN */
    size_t row; /* next active row of the stage */
    size_t na;  /* blend pass: active rows */
    double t0;
    ikv_blend_info inf;
    uint8_t hit[256]; /* segment i was found in the store at admission */
    long seg_off[256];
};

/* Context of one pool region of the blend pass. */
typedef struct bctx {
    ikv_chunks *c;
    ikv_seq *s;
    int l, phase;
    size_t na, n;  /* active rows, prompt positions */
    size_t lo, hi; /* the active rows [lo, hi) this region computes */
} bctx;

static const char *const kind_names[IKV_PSEG_KINDS] = {"system", "tool",    "memory",
                                                       "doc",    "history", "query"};

const char *ikv_pseg_kind_name(int kind) {
    return kind >= 0 && kind < IKV_PSEG_KINDS ? kind_names[kind] : "?";
}

int ikv_pseg_kind_parse(const char *name, int *kind) {
    for (int i = 0; i < IKV_PSEG_KINDS; i++)
        if (name && !strcmp(name, kind_names[i])) return *kind = i, 0;
    return ikv_error(IKV_EINVAL, "\"%s\" is not one of system, tool, memory, doc, history, query",
                     name ? name : "");
}

/* Stable partition: movable shared (public or reusable) segments first among the movable
 * slots, then the movable personal ones; non-movable segments stay where they are. */
size_t ikv_psegs_shared_first(const ikv_prompt_seg *in, size_t n, ikv_prompt_seg *out) {
    size_t w = 0, moved = 0;
    size_t slot[256], ns = 0; /* indices of movable slots (requests have <= 256 segments) */
    for (size_t i = 0; i < n; i++) {
        out[i] = in[i];
        if (in[i].movable && ns < 256) slot[ns++] = i;
    }
    for (int pass = 0; pass < 2; pass++)
        for (size_t j = 0; j < ns; j++) {
            const ikv_prompt_seg *g = &in[slot[j]];
            int shared = g->is_public || g->reusable;
            if (shared == (pass == 0)) {
                if (slot[w] != slot[j]) moved++;
                out[slot[w++]] = *g;
            }
        }
    return moved;
}

void ikv_chunks_options_default(ikv_chunks_options *o) {
    o->mem = 64ull << 20;
    o->ratio = IKV_BLEND_RATIO;
    o->max_dev = IKV_BLEND_MAX_DEV;
    o->first_tokens = 4;
}

void ikv_chunks_destroy(ikv_chunks *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_ent; i++)
        ikv_free(c->ent[i].tok), ikv_free(c->ent[i].kv);
    ikv_free(c->ent);
    ikv_free(c->tok), ikv_free(c->pos), ikv_free(c->reused);
    ikv_free(c->x), ikv_free(c->xb), ikv_free(c->q), ikv_free(c->k), ikv_free(c->v),
        ikv_free(c->att), ikv_free(c->hb), ikv_free(c->hb2), ikv_free(c->Kc), ikv_free(c->Vc),
        ikv_free(c->S), ikv_free(c->kvtmp), ikv_free(c->dp), ikv_free(c->rc), ikv_free(c->rs);
    ikv_free(c->act.q), ikv_free(c->act.a), ikv_free(c->act.s), ikv_free(c->jobs);
    ikv_free(c);
}

int ikv_chunks_create(ikv_engine *e, const ikv_chunks_options *o, ikv_chunks **out) {
    ikv_chunks_options d;
    ikv_chunks_options_default(&d);
    if (!o) o = &d;
    if (!e || o->ratio < 0 || o->ratio > 1 || !(o->max_dev == o->max_dev))
        return ikv_error(IKV_EINVAL, "chunks: ratio must be in [0, 1] and max_dev a number");
    const ikv_model *m = e->m;
    const size_t L = (size_t)m->cfg.seq_len, D = (size_t)m->cfg.dim, H = (size_t)m->cfg.hidden_dim,
                 QD = (size_t)m->q_dim, KD = (size_t)m->kv_dim, hd = (size_t)m->head_dim;
    ikv_chunks *c = ikv_calloc(1, sizeof *c);
    if (!c) return ikv_error(IKV_ENOMEM, "chunks: out of memory");
    c->e = e, c->o = *o;
    c->fp = ikv_engine_fingerprint(m, &e->opt);
    c->cap_ent = 64;
    c->ent = ikv_calloc(c->cap_ent, sizeof *c->ent);
    c->tok = ikv_malloc(L * sizeof *c->tok), c->pos = ikv_malloc(L * sizeof *c->pos);
    c->reused = ikv_malloc(L * sizeof *c->reused);
    c->x = ikv_malloc(L * D * 4), c->xb = ikv_malloc(L * D * 4), c->q = ikv_malloc(L * QD * 4);
    c->k = ikv_malloc(L * KD * 4), c->v = ikv_malloc(L * KD * 4), c->att = ikv_malloc(L * QD * 4);
    c->hb = ikv_malloc(L * H * 4), c->hb2 = ikv_malloc(L * H * 4);
    c->Kc = ikv_malloc(L * KD * 4), c->Vc = ikv_malloc(L * KD * 4);
    c->S = ikv_malloc((size_t)e->nth * CH_ROWS * L * 4), c->kvtmp = ikv_malloc(2 * KD * 4);
    c->dp = ikv_malloc(L * sizeof *c->dp);
    c->rc = ikv_malloc(hd / 2 * sizeof(double)), c->rs = ikv_malloc(hd / 2 * sizeof(double));
    c->n_jobs = e->opt.max_seqs;
    c->jobs = ikv_calloc(c->n_jobs, sizeof *c->jobs);
    int q8ok = 1;
    if (m->gs) { /* int8 weights: the projections quantize their input rows (runq.c's way) */
        size_t w = D > H ? D : H;
        w = w > QD ? w : QD;
        c->act_cols = w;
        c->act.q = ikv_malloc(L * w), c->act.a = ikv_malloc(L * w);
        c->act.s = ikv_malloc(L * w / (size_t)m->gs * sizeof(float));
        q8ok = c->act.q && c->act.a && c->act.s;
    }
    if (!q8ok || !c->jobs || !c->ent || !c->tok || !c->pos || !c->reused || !c->x || !c->xb ||
        !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2 || !c->Kc || !c->Vc || !c->S ||
        !c->kvtmp || !c->dp || !c->rc || !c->rs) {
        ikv_chunks_destroy(c);
        return ikv_error(IKV_ENOMEM, "chunks: out of memory for the blend scratch");
    }
    *out = c;
    return 0;
}

void ikv_chunks_stats(const ikv_chunks *c, size_t *entries, uint64_t *bytes) {
    if (entries) *entries = c->n_ent;
    if (bytes) *bytes = c->bytes;
}

int ikv_chunks_check(const ikv_chunks *c) {
    uint64_t b = 0;
    for (size_t i = 0; i < c->n_ent; i++) {
        const chunk *h = &c->ent[i];
        if (!h->tok || !h->kv || h->n == 0 || h->off + h->n > (uint32_t)c->e->m->cfg.seq_len)
            return ikv_error(IKV_EINVAL, "chunks: entry %zu malformed", i), 0;
        b += h->bytes;
    }
    if (b != c->bytes)
        return ikv_error(IKV_EINVAL, "chunks: entries hold %llu bytes, counted %llu",
                         (unsigned long long)b, (unsigned long long)c->bytes),
               0;
    if (c->n_ent > c->cap_ent) return ikv_error(IKV_EINVAL, "chunks: entry count"), 0;
    for (size_t i = 0; i < c->n_jobs; i++) {
        const ikv_blend_job *j = &c->jobs[i];
        if (j->state == JOB_FREE) {
            if (c->owner == j) return ikv_error(IKV_EINVAL, "chunks: a free job holds the pass"), 0;
            continue;
        }
        if (!j->s || j->lead == 0 || j->lead > j->n || j->n > (size_t)c->e->m->cfg.seq_len)
            return ikv_error(IKV_EINVAL, "chunks: job %zu malformed", i), 0;
        if ((c->owner == j) != (j->state == JOB_BLEND))
            return ikv_error(IKV_EINVAL, "chunks: job %zu: state %d, %s the pass", i, j->state,
                             c->owner == j ? "holds" : "does not hold"),
                   0;
    }
    return 1;
}

void ikv_chunks_dump(const ikv_chunks *c, FILE *f) {
    fprintf(f, "chunk store: %zu entries, %llu of %llu bytes\n", c->n_ent,
            (unsigned long long)c->bytes, (unsigned long long)c->o.mem);
    for (size_t i = 0; i < c->n_jobs; i++)
        if (c->jobs[i].state != JOB_FREE)
            fprintf(f, "  job %zu: state %d, %zu positions, exact part %zu, layer %d, %zu rows%s\n",
                    i, c->jobs[i].state, c->jobs[i].n, c->jobs[i].lead, c->jobs[i].l, c->jobs[i].na,
                    c->owner == &c->jobs[i] ? " (holds the pass)" : "");
    for (size_t i = 0; i < c->n_ent; i++) {
        const chunk *h = &c->ent[i];
        fprintf(f,
                "  [%zu] hash %016llx salt %016llx tokens %u at offset %u, stamp %llu, first %u\n",
                i, (unsigned long long)h->hash, (unsigned long long)h->salt, h->n, h->off,
                (unsigned long long)h->stamp, h->tok[0]);
    }
}

/* Key hash of a segment's tokens under salt (the fingerprint is the seed). */
static uint64_t seg_hash(const ikv_chunks *c, const uint32_t *t, size_t n, uint64_t salt) {
    return XXH3_64bits_withSeed(t, n * sizeof *t, c->fp ^ salt);
}

static long find(const ikv_chunks *c, const uint32_t *t, size_t n, uint64_t salt) {
    uint64_t h = seg_hash(c, t, n, salt);
    for (size_t i = 0; i < c->n_ent; i++) {
        const chunk *q = &c->ent[i];
        if (q->hash == h && q->salt == salt && q->n == n && !memcmp(q->tok, t, n * sizeof *t))
            return (long)i;
    }
    return -1;
}

/* Drops entry i (swap with the last). */
static void drop(ikv_chunks *c, size_t i) {
    c->bytes -= c->ent[i].bytes;
    ikv_free(c->ent[i].tok), ikv_free(c->ent[i].kv);
    c->ent[i] = c->ent[--c->n_ent];
}

/* Stores positions [off, off + n) of s (every layer) under salt. 0 stored, 1 not (too big or
 * out of memory: the store is a cache, a failed insert is a miss later). */
static int store(ikv_chunks *c, ikv_seq *s, const uint32_t *t, size_t off, size_t n,
                 uint64_t salt) {
    const ikv_model *m = c->e->m;
    const size_t KD = (size_t)m->kv_dim, NL = (size_t)m->cfg.n_layers;
    size_t bytes = n * 4 + NL * 2 * n * KD * 4;
    if (bytes > c->o.mem) return 1;
    while (c->n_ent && (c->bytes + bytes > c->o.mem || c->n_ent == c->cap_ent)) {
        size_t old = 0;
        for (size_t i = 1; i < c->n_ent; i++)
            if (c->ent[i].stamp < c->ent[old].stamp) old = i;
        drop(c, old);
    }
    chunk h = {.hash = seg_hash(c, t, n, salt),
               .salt = salt,
               .stamp = ++c->clock,
               .n = (uint32_t)n,
               .off = (uint32_t)off,
               .bytes = bytes};
    h.tok = ikv_malloc(n * 4), h.kv = ikv_malloc(NL * 2 * n * KD * 4);
    if (!h.tok || !h.kv) return ikv_free(h.tok), ikv_free(h.kv), 1;
    memcpy(h.tok, t, n * 4);
    for (size_t l = 0; l < NL; l++)
        for (size_t p = 0; p < n; p++)
            ikv_seq_kv(c->e, s, off + p, (int)l, h.kv + ((l * 2 + 0) * n + p) * KD,
                       h.kv + ((l * 2 + 1) * n + p) * KD);
    c->ent[c->n_ent++] = h;
    c->bytes += bytes;
    return 0;
}

/* Sets the rotation by delta positions of each pair of a head. */
static void rot_set(ikv_chunks *c, long delta) {
    const int hs = c->e->m->head_dim;
    for (int i = 0; i < hs; i += 2) {
        float freq = 1.0f / powf(10000.0f, (float)i / (float)hs); /* as ikv__rope_init */
        double a = (double)delta * (double)freq;
        c->rc[i / 2] = cos(a), c->rs[i / 2] = sin(a);
    }
}

static void rot_apply(const ikv_chunks *c, float *k, size_t width) {
    const size_t hs = (size_t)c->e->m->head_dim;
    for (size_t i = 0; i < width; i += 2) {
        size_t j = (i % hs) / 2;
        double k0 = k[i], k1 = k[i + 1];
        k[i] = (float)(k0 * c->rc[j] - k1 * c->rs[j]);
        k[i + 1] = (float)(k0 * c->rs[j] + k1 * c->rc[j]);
    }
}

void ikv_chunks_rerotate(const ikv_chunks *c, float *k, size_t n, long delta) {
    rot_set((ikv_chunks *)c, delta);
    const size_t KD = (size_t)c->e->m->kv_dim;
    for (size_t p = 0; p < n; p++)
        rot_apply(c, k + p * KD, KD);
}

/* Pointer to K (kv 0) or V of position p, layer l, kv head g in s's blocks. */
static float *kvp(const ikv_chunks *c, const ikv_seq *s, size_t p, int l, int kv, int g) {
    const ikv_engine *e = c->e;
    return ikv__kv_at(e, s->table[p / e->bt], l, kv, g, (uint32_t)(p % e->bt));
}

/* Writes entry h's K/V, re-rotated from h->off to off, into positions [off, off + n) of s,
 * those from `from` on (the ones before were prefilled exactly and stay). */
static void place(ikv_chunks *c, ikv_seq *s, const chunk *h, size_t off, size_t from) {
    const ikv_model *m = c->e->m;
    const size_t KD = (size_t)m->kv_dim, hd = (size_t)m->head_dim, n = h->n;
    rot_set(c, (long)off - (long)h->off);
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (size_t p = from > off ? from - off : 0; p < n; p++) {
            float *kt = c->kvtmp;
            memcpy(kt, h->kv + (((size_t)l * 2) * n + p) * KD, KD * 4);
            if (off != h->off) rot_apply(c, kt, KD);
            const float *vt = h->kv + (((size_t)l * 2 + 1) * n + p) * KD;
            for (int g = 0; g < m->cfg.n_kv_heads; g++) {
                memcpy(kvp(c, s, off + p, l, 0, g), kt + (size_t)g * hd, hd * 4);
                memcpy(kvp(c, s, off + p, l, 1, g), vt + (size_t)g * hd, hd * 4);
            }
        }
}

static void rmsnorm(float *o, const float *x, const float *w, int n) {
    float ss = 0.0f;
    for (int j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss = 1.0f / sqrtf(ss / (float)n + 1e-5f);
    for (int j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* Y[a:b] = X[a:b] W^T, W [N][K]. */
static void mm(const float *X, size_t a, size_t b, const float *W, int N, int K, float *Y) {
    if (b <= a) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(b - a), N, K, 1.0f,
                X + a * (size_t)K, K, W, K, 0.0f, Y + a * (size_t)N, N);
}

/* Y[a:b] = X[a:b] W^T for matrix kind `kind` of layer l, W [N][K]: the fp32 sgemm, or on an
 * int8 model the int8 product of the engine's arithmetic (runq.c's: each row quantized per
 * group into its own slice of the activation scratch). */
static void lin(const ikv_chunks *c, int kind, int l, const float *W, const float *X, size_t a,
                size_t b, int N, int K, float *Y) {
    const ikv_model *m = c->e->m;
    if (b <= a) return;
    if (!m->gs) {
        mm(X, a, b, W + (size_t)l * (size_t)N * (size_t)K, N, K, Y);
        return;
    }
    /* rows [a, b) own [a, b) x act_cols of the scratch whatever K: threads at different
     * projections (different K) never overlap */
    const size_t k = (size_t)K, w = c->act_cols;
    ikv__q8act act = {c->act.q + a * w, c->act.a + a * w, c->act.s + a * w / (size_t)m->gs, NULL};
    ikv__q8_gemm(m, kind, l, X + a * k, b - a, &act, NULL, Y + a * (size_t)N, (size_t)N, 0,
                 (size_t)N);
}

static void rows_of(size_t n, int t, int P, size_t *a, size_t *b) {
    *a = n * (size_t)t / (size_t)P, *b = n * (size_t)(t + 1) / (size_t)P;
}

/* Phase 0: norm and Q/K/V of the active rows, RoPE'd at their positions. Phase 1: attention
 * output projection, residual, FFN, residual. */
static void rows_task(void *vc, int t, int P) {
    bctx *b = vc;
    ikv_chunks *c = b->c;
    const ikv_model *m = c->e->m;
    const ikv__weights *w = &m->w;
    const int D = m->cfg.dim, H = m->cfg.hidden_dim, QD = m->q_dim, KD = m->kv_dim, l = b->l;
    const struct ikv_engine *e = c->e;
    size_t r0, r1;
    rows_of(b->hi - b->lo, t, P, &r0, &r1);
    r0 += b->lo, r1 += b->lo;
    if (b->phase == 0) {
        for (size_t i = r0; i < r1; i++)
            rmsnorm(c->xb + i * D, c->x + i * D, w->rms_att + (size_t)l * D, D);
        lin(c, IKV__QM_Q, l, w->wq, c->xb, r0, r1, QD, D, c->q);
        lin(c, IKV__QM_K, l, w->wk, c->xb, r0, r1, KD, D, c->k);
        lin(c, IKV__QM_V, l, w->wv, c->xb, r0, r1, KD, D, c->v);
        const size_t h2 = (size_t)m->head_dim / 2;
        for (size_t i = r0; i < r1; i++) {
            const float *cs = e->rope_cos + c->pos[i] * h2, *sn = e->rope_sin + c->pos[i] * h2;
            for (int which = 0; which < 2; which++) {
                float *vec = which ? c->k + i * KD : c->q + i * QD;
                int width = which ? KD : QD;
                for (int j = 0; j < width; j += 2) {
                    size_t z = (size_t)(j % m->head_dim) / 2;
                    float v0 = vec[j], v1 = vec[j + 1];
                    vec[j] = v0 * cs[z] - v1 * sn[z];
                    vec[j + 1] = v0 * sn[z] + v1 * cs[z];
                }
            }
        }
    } else {
        lin(c, IKV__QM_O, l, w->wo, c->att, r0, r1, D, QD, c->xb);
        for (size_t i = r0 * D; i < r1 * D; i++)
            c->x[i] += c->xb[i];
        for (size_t i = r0; i < r1; i++)
            rmsnorm(c->xb + i * D, c->x + i * D, w->rms_ffn + (size_t)l * D, D);
        lin(c, IKV__QM_1, l, w->w1, c->xb, r0, r1, H, D, c->hb);
        lin(c, IKV__QM_3, l, w->w3, c->xb, r0, r1, H, D, c->hb2);
        for (size_t i = r0 * H; i < r1 * H; i++) {
            float a = c->hb[i];
            c->hb[i] = a / (1.0f + expf(-a)) * c->hb2[i];
        }
        lin(c, IKV__QM_2, l, w->w2, c->hb, r0, r1, D, H, c->xb);
        for (size_t i = r0 * D; i < r1 * D; i++)
            c->x[i] += c->xb[i];
    }
}

/* Writes the active rows' K/V of layer l into the blocks and gathers layer l's K/V of all
 * positions into Kc/Vc (split by kv head). */
static void kv_task(void *vc, int t, int P) {
    bctx *b = vc;
    ikv_chunks *c = b->c;
    const ikv_model *m = c->e->m;
    const size_t hd = (size_t)m->head_dim, KD = (size_t)m->kv_dim, NKV = (size_t)m->cfg.n_kv_heads;
    size_t r0, r1;
    rows_of(b->hi - b->lo, t, P, &r0, &r1);
    r0 += b->lo, r1 += b->lo;
    for (size_t i = r0; i < r1; i++)
        for (size_t g = 0; g < NKV; g++) {
            memcpy(kvp(c, b->s, c->pos[i], b->l, 0, (int)g), c->k + i * KD + g * hd, hd * 4);
            memcpy(kvp(c, b->s, c->pos[i], b->l, 1, (int)g), c->v + i * KD + g * hd, hd * 4);
        }
}

static void gather_task(void *vc, int t, int P) {
    bctx *b = vc;
    ikv_chunks *c = b->c;
    const ikv_engine *e = c->e;
    const size_t hd = (size_t)e->m->head_dim, NKV = (size_t)e->m->cfg.n_kv_heads, bt = e->bt,
                 L = (size_t)e->m->cfg.seq_len, nb = (b->n + bt - 1) / bt;
    for (size_t it = (size_t)t; it < NKV * nb; it += (size_t)P) {
        size_t g = it / nb, j = it % nb, cnt = (j + 1) * bt <= b->n ? bt : b->n - j * bt;
        memcpy(c->Kc + (g * L + j * bt) * hd, kvp(c, b->s, j * bt, b->l, 0, (int)g), cnt * hd * 4);
        memcpy(c->Vc + (g * L + j * bt) * hd, kvp(c, b->s, j * bt, b->l, 1, (int)g), cnt * hd * 4);
    }
}

/* Causal attention of the active rows over every position, per (head, chunk of rows). */
static void attn_task(void *vc, int t, int P) {
    bctx *b = vc;
    ikv_chunks *c = b->c;
    const ikv_model *m = c->e->m;
    const size_t hd = (size_t)m->head_dim, QD = (size_t)m->q_dim, L = (size_t)m->cfg.seq_len,
                 NH = (size_t)m->cfg.n_heads, kvmul = NH / (size_t)m->cfg.n_kv_heads,
                 nch = (b->hi - b->lo + CH_ROWS - 1) / CH_ROWS;
    float *S = c->S + (size_t)t * CH_ROWS * L;
    const float scale = 1.0f / sqrtf((float)hd);
    for (size_t it = (size_t)t; it < NH * nch; it += (size_t)P) {
        size_t h = it / nch, i0 = b->lo + (it % nch) * CH_ROWS,
               i1 = i0 + CH_ROWS < b->hi ? i0 + CH_ROWS : b->hi, g = h / kvmul;
        size_t span = (size_t)c->pos[i1 - 1] + 1, rows = i1 - i0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)span, (int)hd, scale,
                    c->q + i0 * QD + h * hd, (int)QD, c->Kc + g * L * hd, (int)hd, 0.0f, S,
                    (int)span);
        for (size_t r = 0; r < rows; r++) {
            float *row = S + r * span;
            size_t lim = (size_t)c->pos[i0 + r] + 1;
            float mx = row[0];
            for (size_t j = 1; j < lim; j++)
                mx = row[j] > mx ? row[j] : mx;
            float sum = 0.0f;
            for (size_t j = 0; j < lim; j++)
                sum += (row[j] = expf(row[j] - mx));
            float inv = 1.0f / sum;
            for (size_t j = 0; j < lim; j++)
                row[j] *= inv;
            for (size_t j = lim; j < span; j++)
                row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)span, 1.0f,
                    S, (int)span, c->Vc + g * L * hd, (int)hd, 0.0f, c->att + i0 * QD + h * hd,
                    (int)QD);
    }
}

static int dev_cmp(const void *a, const void *b) {
    const devpair *x = a, *y = b;
    if (x->dev != y->dev) return x->dev > y->dev ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* Selection on layer l (the active rows are all positions, fresh K/V in c->k/c->v): measures
 * each reused position's deviation against the blocks (the placed K/V), marks the recomputed
 * ones, compacts the active rows. Returns 1 when every reused position must be recomputed. */
static int select_rows(ikv_chunks *c, bctx *b, float ratio, float max_dev, ikv_blend_info *inf) {
    const ikv_model *m = c->e->m;
    const size_t KD = (size_t)m->kv_dim, hd = (size_t)m->head_dim, D = (size_t)m->cfg.dim,
                 QD = (size_t)m->q_dim, NKV = (size_t)m->cfg.n_kv_heads;
    size_t nd = 0, nreused = 0;
    double dsum = 0;
    for (size_t i = 0; i < b->na; i++) { /* active row i is position c->pos[i] */
        const size_t p = c->pos[i];
        if (!c->reused[p]) continue;
        nreused++;
        double num = 0, den = 0;
        for (size_t g = 0; g < NKV; g++)
            for (int kv = 0; kv < 2; kv++) {
                const float *st = kvp(c, b->s, p, b->l, kv, (int)g),
                            *fr = (kv ? c->v : c->k) + i * KD + g * hd;
                for (size_t z = 0; z < hd; z++) {
                    double dd = (double)fr[z] - st[z];
                    num += dd * dd, den += (double)fr[z] * fr[z];
                }
            }
        float dev = (float)sqrt(den > 0 ? num / den : num);
        dsum += dev;
        c->dp[nd++] = (devpair){dev, (uint32_t)p};
    }
    inf->deviation_mean = nreused ? dsum / (double)nreused : 0;
    qsort(c->dp, nd, sizeof *c->dp, dev_cmp);
    /* the first tokens of each hit segment: reused[p] holds 1 + (offset within the segment) */
    size_t want = (size_t)ceil((double)ratio * (double)nreused - 1e-6), sel = 0, guard = 0;
    for (size_t i = 0; i < nd; i++) {
        uint32_t p = c->dp[i].row;
        int first = c->reused[p] - 1 < c->o.first_tokens;
        int by_ratio = sel < want;
        int by_guard = max_dev > 0 && isfinite(max_dev) && c->dp[i].dev > max_dev;
        if (first || by_ratio || by_guard) {
            if (!first && !by_ratio) guard++;
            if (!first) sel++;
            c->reused[p] = 0; /* recomputed from here on */
        }
    }
    inf->guard_tokens = guard;
    double dmax = 0;
    size_t left = 0;
    for (size_t i = 0; i < nd; i++)
        if (c->reused[c->dp[i].row]) {
            left++;
            if (c->dp[i].dev > dmax) dmax = c->dp[i].dev;
        }
    inf->deviation_max = dmax;
    inf->reused_tokens = left;
    if (left == 0) return 1;
    /* compact: keep the rows whose position is computed */
    size_t w = 0;
    for (size_t i = 0; i < b->na; i++) {
        if (c->reused[c->pos[i]]) continue;
        if (w != i) {
            c->pos[w] = c->pos[i];
            memmove(c->x + w * D, c->x + i * D, D * 4);
            memmove(c->q + w * QD, c->q + i * QD, QD * 4);
            memmove(c->k + w * KD, c->k + i * KD, KD * 4);
            memmove(c->v + w * KD, c->v + i * KD, KD * 4);
        }
        w++;
    }
    b->na = w;
    return 0;
}

/* The embedding row of token t into x (dequantized on an int8 model). */
static void embed(const ikv_chunks *c, uint32_t t, float *x) {
    const ikv_model *m = c->e->m;
    const size_t D = (size_t)m->cfg.dim;
    if (m->gs)
        ikv__q8_dequant_rows(m, IKV__QM_EMB, 0, t, (size_t)t + 1, x);
    else
        memcpy(x, m->w.emb + (size_t)t * D, D * 4);
}

/* The segments of j concatenated into c->tok (validated at admission). */
static void job_tokens(ikv_chunks *c, const ikv_blend_job *j) {
    size_t n = 0;
    for (size_t i = 0; i < j->r.n_segs; i++)
        memcpy(c->tok + n, j->r.segs[i].tokens, j->r.segs[i].n * 4), n += j->r.segs[i].n;
}

static uint64_t seg_salt(const ikv_blend_job *j, size_t i) {
    return j->r.segs[i].is_public ? IKV_SCOPE_PUBLIC : j->tsalt;
}

/* Starts the blend pass of j (its leading positions prefilled): takes the blocks of the rest,
 * places the hit segments still in the store (re-rotated), sets the active rows to every
 * position from j->lead on. Returns 0, or IKV_ENOENT when a segment the request must reuse
 * (r.hits_in) is no longer stored. Does not allocate. */
static int blend_start(ikv_chunks *c, ikv_blend_job *j) {
    ikv_engine *e = c->e;
    const size_t D = (size_t)e->m->cfg.dim, n = j->n, K = j->lead;
    ikv_seq *s = j->s;
    job_tokens(c, j);
    int rc = ikv__seq_extend(e, s, c->tok, n);
    IKV_ASSERT(rc == 0); /* admission reserved the blocks up to n + max_new */
    memset(c->reused, 0, n * sizeof *c->reused);
    size_t hits = 0;
    for (size_t i = 0; i < j->r.n_segs; i++) {
        if (!j->hit[i]) continue;
        const ikv_prompt_seg *g = &j->r.segs[i];
        long h = find(c, g->tokens, g->n, seg_salt(j, i));
        if (h < 0) { /* dropped by another request's store since admission */
            if (j->r.hits_in)
                return ikv_error(IKV_ENOENT,
                                 "segments[%zu] (%s): its stored K/V, reused at admission, are "
                                 "no longer in the chunk store",
                                 i, ikv_pseg_kind_name(g->kind));
            j->hit[i] = 0;
            continue;
        }
        hits++;
        place(c, s, &c->ent[h], (size_t)j->seg_off[i], K);
        for (size_t q = 0; q < g->n; q++)
            if ((size_t)j->seg_off[i] + q >= K)
                c->reused[(size_t)j->seg_off[i] + q] = (uint32_t)q + 1;
    }
    j->inf.hit_segments = hits;
    if (j->r.hits)
        for (size_t i = 0; i < j->r.n_segs; i++)
            j->r.hits[i] = j->hit[i];
    for (size_t p = K; p < n; p++) {
        c->pos[p - K] = (uint32_t)p;
        embed(c, c->tok[p], c->x + (p - K) * D);
    }
    j->na = n - K, j->l = 0, j->stage = 0, j->row = 0;
    return 0;
}

/* Runs the next unit of j's blend pass: stage 0 (Q/K/V, RoPE, and K/V into the blocks) of the
 * next rows of layer j->l, or stage 1 (attention over every position, output projection, FFN)
 * of the next rows; at most `rows` active rows per unit for stage 1 and 8 x rows for stage 0
 * (about a sixth of the work per row; 0: all). On the selection layer, once stage 0 is done for
 * every row, the selection compacts the rows before their K/V are written. Returns 0 (more
 * units), 1 (the last layer ran: logits set), 2 (the selection recomputes every reused token:
 * abandoned). Rows are independent within a stage, so the split changes no result's meaning;
 * its bits depend on the split only through which rows share a product. Does not allocate. */
static int blend_unit(ikv_chunks *c, ikv_blend_job *j, size_t rows) {
    ikv_engine *e = c->e;
    const ikv_model *m = e->m;
    const size_t D = (size_t)m->cfg.dim;
    const int NL = m->cfg.n_layers, sel_layer = NL > 1 ? 1 : 0;
    bctx b = {.c = c, .s = j->s, .n = j->n, .na = j->na, .l = j->l};
    j->inf.blend_units++;
    size_t R = rows ? (j->stage ? rows : 8 * rows) : j->na;
    b.lo = j->row, b.hi = j->row + R < j->na ? j->row + R : j->na;
    if (j->stage == 0) {
        b.phase = 0;
        ikv__pool_run(e->pool, rows_task, &b);
        if (j->l != sel_layer) ikv__pool_run(e->pool, kv_task, &b);
        if ((j->row = b.hi) < j->na) return 0;
        if (j->l == sel_layer) {
            if (select_rows(c, &b, j->ratio, j->max_dev, &j->inf)) return 2;
            j->na = b.na, b.lo = 0, b.hi = b.na;
            ikv__pool_run(e->pool, kv_task, &b);
        }
        b.hi = j->na;
        ikv__pool_run(e->pool, gather_task, &b);
        j->stage = 1, j->row = 0;
        return 0;
    }
    ikv__pool_run(e->pool, attn_task, &b);
    b.phase = 1;
    ikv__pool_run(e->pool, rows_task, &b);
    if ((j->row = b.hi) < j->na) return 0;
    j->stage = 0, j->row = 0;
    j->inf.blend_layers++;
    if (j->l == NL - 1) e->n_computed_tokens += j->na;
    if (++j->l < NL) return 0;
    /* the last position is never reused (see admission), so it is the last active row */
    ikv__logits_row(e, c->x + (j->na - 1) * D, j->s->logits);
    j->s->n = (uint32_t)j->n;
    return 1;
}

/* Stores the reusable segments of j that missed (j's sequence holds their K/V). */
static void job_store(ikv_chunks *c, ikv_blend_job *j) {
    if (j->r.no_store) return;
    for (size_t i = 0; i < j->r.n_segs; i++) {
        const ikv_prompt_seg *g = &j->r.segs[i];
        if (!g->reusable || j->hit[i] || (size_t)j->seg_off[i] + g->n >= j->n) continue;
        uint64_t salt = seg_salt(j, i);
        if (find(c, g->tokens, g->n, salt) < 0 &&
            !store(c, j->s, g->tokens, (size_t)j->seg_off[i], g->n, salt))
            j->inf.stored_segments++;
    }
}

int ikv_chunks_admit(ikv_chunks *c, const ikv_blend_request *r, ikv_blend_job **out) {
    ikv_engine *e = c->e;
    const ikv_model *m = e->m;
    const size_t L = (size_t)m->cfg.seq_len;
    double t0 = ikv_now();
    if (!r || !r->segs || r->n_segs == 0)
        return ikv_error(IKV_EINVAL, "a structured request needs at least one segment");
    if (r->n_segs > 256)
        return ikv_error(IKV_EINVAL, "%zu segments: at most 256 per request", r->n_segs);
    float ratio = r->ratio < 0 ? c->o.ratio : r->ratio;
    float max_dev = r->max_dev < 0 ? c->o.max_dev : r->max_dev;
    if (!(ratio >= 0 && ratio <= 1))
        return ikv_error(IKV_EINVAL, "blend ratio %g is not in [0, 1]", (double)ratio);
    ikv_blend_job *j = NULL;
    for (size_t i = 0; i < c->n_jobs && !j; i++)
        if (c->jobs[i].state == JOB_FREE) j = &c->jobs[i];
    if (!j) return ikv_error(IKV_EBUSY, "all %zu structured requests are in flight", c->n_jobs);
    memset(&j->inf, 0, sizeof j->inf);
    size_t n = 0, pub = 0;
    int lead_pub = 1;
    for (size_t i = 0; i < r->n_segs; i++) {
        const ikv_prompt_seg *g = &r->segs[i];
        if (g->kind < 0 || g->kind >= IKV_PSEG_KINDS)
            return ikv_error(IKV_EINVAL, "segments[%zu]: bad kind %d", i, g->kind);
        if (g->n == 0 || !g->tokens)
            return ikv_error(IKV_EINVAL, "segments[%zu] (%s) has no tokens", i,
                             ikv_pseg_kind_name(g->kind));
        if (g->n > L - n)
            return ikv_error(IKV_ETOOLONG,
                             "the segments exceed the model's seq_len %zu at "
                             "segments[%zu]",
                             L, i);
        for (size_t q = 0; q < g->n; q++)
            if (g->tokens[q] >= (uint32_t)m->cfg.vocab_size)
                return ikv_error(IKV_EINVAL, "segments[%zu] token %zu: id %u >= vocab %d", i, q,
                                 g->tokens[q], (int)m->cfg.vocab_size);
        memcpy(c->tok + n, g->tokens, g->n * 4);
        if (lead_pub && g->is_public)
            pub += g->n;
        else
            lead_pub = 0;
        j->seg_off[i] = (long)n;
        n += g->n;
    }
    j->r = *r, j->n = n, j->pub = pub, j->ratio = ratio, j->max_dev = max_dev, j->t0 = t0;
    j->tsalt = ikv_scope_salt(e->opt.key_seed, r->tenant);
    j->inf.prompt_tokens = n;
    /* look up the reusable segments (never the one holding the last position: its logits must
     * be computed, and a final reusable segment is recomputed in full); with hits_in, exactly
     * the segments given */
    size_t hits = 0, first_hit = n;
    for (size_t i = 0; i < r->n_segs; i++) {
        const ikv_prompt_seg *g = &r->segs[i];
        j->hit[i] = 0;
        if (!g->reusable) continue;
        j->inf.reusable_tokens += g->n;
        int want = r->hits_in ? r->hits[i] != 0 : 1;
        long h = want && (size_t)j->seg_off[i] + g->n < n ? find(c, g->tokens, g->n, seg_salt(j, i))
                                                          : -1;
        if (h >= 0) {
            j->hit[i] = 1, hits++, c->ent[h].stamp = ++c->clock;
            if ((size_t)j->seg_off[i] < first_hit) first_hit = (size_t)j->seg_off[i];
        } else if (want && r->hits_in) {
            return ikv_error(IKV_ENOENT,
                             "segments[%zu] (%s): its K/V, reused at the first admission, are "
                             "no longer in the chunk store",
                             i, ikv_pseg_kind_name(g->kind));
        } else {
            j->inf.miss_segments++;
        }
    }
    j->inf.hit_segments = hits;
    const int full = hits == 0 || ratio >= 1.0f;
    /* exact part: the whole prompt (full), else the positions before the first hit (at least
     * one, so the sequence exists), through the prefix cache and the engine's chunked prefill */
    size_t lead = full ? n : (first_hit ? first_hit : 1);
    ikv_request rq = {.tokens = c->tok,
                      .n = lead,
                      .tenant = r->tenant,
                      .public_tokens = pub < lead ? pub : lead,
                      .max_new = r->max_new ? r->max_new + (n - lead) : 0,
                      .reserve_new = r->reserve_new ? r->reserve_new + (n - lead) : 0,
                      .no_cache = r->no_cache};
    int rc = ikv_engine_admit(e, &rq, &j->s, &j->inf.prefill);
    if (rc) return rc;
    j->lead = lead;
    j->state = full ? JOB_EXACT : JOB_LEAD;
    j->inf.full = full;
    if (r->hits && !full)
        for (size_t i = 0; i < r->n_segs; i++)
            r->hits[i] = j->hit[i];
    if (r->hits && full) memset(r->hits, 0, r->n_segs);
    *out = j;
    return 0;
}

ikv_seq *ikv_chunks_job_seq(const ikv_blend_job *j) {
    return j->s;
}

void ikv_chunks_job_info(const ikv_blend_job *j, ikv_blend_info *info) {
    *info = j->inf;
}

int ikv_chunks_advance(ikv_chunks *c, ikv_blend_job *j, size_t max_rows) {
    if (j->state == JOB_DONE) return 1;
    if (ikv_seq_pending(j->s)) return 0; /* the caller's prefill steps first */
    if (j->state == JOB_EXACT) {         /* the exact prefill is done (or abandoned blend's) */
        j->inf.reused_tokens = 0, j->inf.recomputed_tokens = j->inf.reusable_tokens;
        j->inf.deviation_max = 0;
        j->inf.prefix_cached_tokens = j->inf.prefill.cached_tokens;
        j->inf.prefill.computed_tokens = j->n - j->inf.prefill.cached_tokens;
        j->inf.seconds = ikv_now() - j->t0;
        job_store(c, j);
        j->state = JOB_DONE;
        return 1;
    }
    if (j->state == JOB_LEAD) {                  /* leading positions exact: the blend pass next */
        if (c->owner && c->owner != j) return 0; /* another request's pass holds the scratch */
        c->owner = j;
        int rc = blend_start(c, j);
        if (rc) {
            c->owner = NULL;
            return rc;
        }
        j->state = JOB_BLEND;
    }
    for (;;) {
        int rc = blend_unit(c, j, max_rows);
        if (rc == 0) {
            if (max_rows) return 0; /* one unit per call */
            continue;
        }
        c->owner = NULL;
        if (rc == 2) { /* every reused token selected: the exact prefill of the rest */
            j->s->n_prompt = (uint32_t)j->n; /* [lead, n) pending, prefilled like any prompt */
            j->state = JOB_EXACT;
            j->inf.full = 1;
            return 0;
        }
        j->inf.recomputed_tokens = j->inf.reusable_tokens - j->inf.reused_tokens;
        j->inf.prefix_cached_tokens = j->inf.prefill.cached_tokens;
        j->inf.prefill.computed_tokens = j->n - j->inf.prefix_cached_tokens - j->inf.reused_tokens;
        j->inf.prefill.cached_tokens = j->inf.prefix_cached_tokens + j->inf.reused_tokens;
        j->inf.seconds = ikv_now() - j->t0;
        job_store(c, j);
        j->state = JOB_DONE;
        return 1;
    }
    return 0;
}

void ikv_chunks_job_end(ikv_chunks *c, ikv_blend_job *j) {
    if (!j) return;
    if (c->owner == j) c->owner = NULL;
    j->state = JOB_FREE;
    j->s = NULL;
}

int ikv_chunks_begin(ikv_chunks *c, const ikv_blend_request *r, ikv_seq **seq,
                     ikv_blend_info *info) {
    ikv_blend_job *j;
    int rc = ikv_chunks_admit(c, r, &j);
    if (rc) return rc;
    while ((rc = ikv_chunks_advance(c, j, 0)) == 0)
        if (ikv_seq_pending(j->s)) {
            ikv_step_item it = {.seq = j->s};
            rc = ikv_engine_step(c->e, &it, 1);
            IKV_ASSERT(rc == 0); /* a pending prefill within its limits */
        }
    if (rc < 0) {
        ikv_engine_end(c->e, j->s);
        ikv_chunks_job_end(c, j);
        return rc;
    }
    if (info) ikv_chunks_job_info(j, info);
    *seq = j->s;
    ikv_chunks_job_end(c, j);
    return 0;
}
