/*
 * isokv model: a Llama-architecture transformer (RMSNorm, RoPE, grouped-query attention, SwiGLU,
 * tied or separate classifier; fp32) whose attention KV lives in fixed-size blocks of a pool
 * that the cache core (cache.h) manages, so that a prompt prefix computed once is reused by
 * every later request that starts with it, exactly.
 *
 * Pieces, in the order a request meets them:
 *
 *   checkpoint   llama2.c "legacy" format (7 x int32 header, then fp32 weights), or its int8
 *                version 2 ("ak42"), loaded by mmap; every size is checked against the file
 *                length before use.
 *   tokenizer    llama2.c tokenizer.bin (max_token_length, then per token: score, length,
 *                bytes); BPE merges by score, byte fallback; or plain bytes when none given.
 *   engine       the KV block pool (sized at start), the prefix cache over it, batched
 *                prefill (BLAS sgemm on fixed row tiles) and matrix-vector decode.
 *   sampler      greedy, temperature, top-p; seeded.
 *
 * Request flow (ikv_engine_begin): tokens -> block keys (tenant scope; leading public tokens
 * in the public scope) -> longest resident prefix -> verify each matched block's stored token
 * ids, depth and parent block (a mismatch is a miss) -> lock -> insert the new full blocks,
 * locked -> prefill only the uncached positions -> decode (ikv_engine_decode) -> unlock
 * (ikv_engine_end). Blocks the core drops return to the pool. See docs/engine.md.
 *
 * Exactness: for the same engine options (tile size, thread count), a prompt gives bit-
 * identical logits at every computed position and identical greedy tokens whether its prefix
 * came from the cache (fully, partly) or was computed. docs/engine.md says how.
 */
#ifndef ISOKV_MODEL_H
#define ISOKV_MODEL_H

#include "isokv/base.h"
#include "isokv/cache.h"
#include "isokv/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model shape and checkpoints --------------------------------------------------------- */

typedef struct ikv_model_config {
    int32_t dim;        /* residual stream width */
    int32_t hidden_dim; /* SwiGLU inner width */
    int32_t n_layers;
    int32_t n_heads;           /* query heads; head_dim = dim / n_heads */
    int32_t n_kv_heads;        /* key/value heads (divides n_heads) */
    int32_t vocab_size;        /* always positive here; the file stores it negated when the
                                  classifier is separate (shared_classifier == 0) */
    int32_t seq_len;           /* maximum positions */
    int32_t shared_classifier; /* 1: the classifier is the token embedding (tied) */
} ikv_model_config;

/* The named configurations: "tiny" (tests), "stories15m", "small", "base". Returns 0, or
 * IKV_EMODEL for an unknown name. */
int ikv_model_config_named(const char *name, ikv_model_config *out);
/* "tiny, stories15m, small, base" (for --help). */
const char *ikv_model_config_names(void);

/* Checks a shape: every field positive and within sane limits, heads divide dim, kv heads
 * divide heads, even head_dim. Returns 0 or IKV_EFORMAT with a message naming the field. */
int ikv_model_config_check(const ikv_model_config *c);

uint64_t ikv_model_params(const ikv_model_config *c);             /* weights, classifier included */
uint64_t ikv_model_file_bytes(const ikv_model_config *c);         /* exact checkpoint size */
uint64_t ikv_model_kv_bytes_per_token(const ikv_model_config *c); /* K and V, all layers, fp32 */
/* Bytes of weights one decode step reads: every matrix, norms, the classifier and one
 * embedding row (the memory-bandwidth bound of decode is this over the read bandwidth). */
uint64_t ikv_model_decode_bytes(const ikv_model_config *c);

typedef struct ikv_model ikv_model;

/* Maps a llama2.c checkpoint read-only. Returns 0 and *out, or IKV_EIO (cannot open/map),
 * IKV_ETRUNC (shorter than its header says), IKV_EFORMAT (bad header field, trailing bytes,
 * a version-1/2 export), IKV_ENOMEM; ikv_errdetail() names the file and the problem. */
int ikv_model_load(const char *path, ikv_model **out);

/* Builds a model in memory with deterministic random weights (same bytes as the file
 * ikv_model_write_random writes). Weights are uniform with variance 1/fan_in, residual
 * output projections further scaled by 1/sqrt(2 * n_layers), norms 1, so activations stay
 * of order one through all layers. */
int ikv_model_random(const ikv_model_config *c, uint64_t seed, ikv_model **out);

/* Writes that checkpoint to `path` as an atomic output file (ikv_outset: a temporary file
 * renamed at the end, so a failure leaves no partial file; a device or other non-regular
 * target is refused). Returns 0, IKV_EIO, IKV_EINVAL or IKV_ENOMEM. */
int ikv_model_write_random(const char *path, const ikv_model_config *c, uint64_t seed);
/* The same bytes written to an open stream (e.g. one of an ikv_outset); 0, IKV_EIO, IKV_ENOMEM. */
int ikv_model_write_random_stream(FILE *f, const ikv_model_config *c, uint64_t seed);

void ikv_model_destroy(ikv_model *m);
const ikv_model_config *ikv_model_cfg(const ikv_model *m);

/* ---- int8 weights: llama2.c version-2 checkpoints ---------------------------------------- */
/* ikv_model_load also reads llama2.c's int8 export (export.py --version 2, what runq.c runs):
 * the 256-byte "ak42" header, fp32 norms, each matrix as int8 values and fp32 scales per group
 * of `group` values. Such a model decodes and prefills with int8 weights (activations quantized
 * per group as runq.c does); the KV stays fp32. See docs/engine.md. */

/* The int8 group size of a model loaded from a version-2 checkpoint; 0 for fp32 weights. */
int ikv_model_group(const ikv_model *m);
/* 0 if `group` can quantize every matrix of shape c (it divides dim and hidden_dim, the input
 * widths), else IKV_EINVAL with the reason and the group sizes that would do. */
int ikv_model_q8_group_check(const ikv_model_config *c, int group);
/* Exact size of a version-2 checkpoint of shape c (for a valid group). */
uint64_t ikv_model_q8_file_bytes(const ikv_model_config *c, int group);
/* Bytes of weights one int8 decode step reads (values and scales of every matrix and the
 * classifier, norms, one embedding row). */
uint64_t ikv_model_q8_decode_bytes(const ikv_model_config *c, int group);
/* Writes the fp32 model m as a version-2 checkpoint with groups of `group` (export.py's
 * quantization: scale = max|w| / 127, round half to even) as an atomic output file (ikv_outset:
 * a temporary renamed at the end, so a failure leaves no partial file; a device, directory or
 * other non-regular target is refused). Returns 0, IKV_EINVAL (bad group, or m already int8;
 * the reason in ikv_errdetail; or a refused target), IKV_EIO, IKV_ENOMEM. */
int ikv_model_write_q8(const ikv_model *m, const char *path, int group);
/* The same quantization into a new in-memory int8 model *out (validated as a loaded file is);
 * m is not changed. Returns 0, IKV_EINVAL, IKV_ENOMEM. */
int ikv_model_quantize(const ikv_model *m, int group, ikv_model **out);

/* ---- tokenizer --------------------------------------------------------------------------- */

typedef struct ikv_tokenizer ikv_tokenizer;

#define IKV_TOK_UNK   0u
#define IKV_TOK_BOS   1u
#define IKV_TOK_EOS   2u
#define IKV_TOK_BYTE0 3u /* byte b is token 3 + b (llama2.c / sentencepiece byte fallback) */

/* Loads a llama2.c tokenizer.bin for a model of vocab_size tokens. Returns 0, IKV_EIO,
 * IKV_ETRUNC, IKV_EFORMAT (negative or absurd lengths, a piece longer than the declared
 * maximum, trailing bytes, a vocabulary without the 256 byte pieces), IKV_ENOMEM. */
int ikv_tokenizer_load(const char *path, uint32_t vocab_size, ikv_tokenizer **out);

/* A byte-level tokenizer: byte b <-> token 3 + b, no merges. Needs vocab_size >= 259
 * (IKV_EINVAL otherwise). Tokens above 258 decode to "<tokN>". */
int ikv_tokenizer_bytes(uint32_t vocab_size, ikv_tokenizer **out);

/* Writes a deterministic synthetic tokenizer.bin of vocab_size pieces (the 3 specials, the 256
 * byte pieces, printable ASCII, then merges built from frequent English letters), so generated
 * models have a matching vocabulary. An atomic output file (ikv_outset), as above; the _stream
 * form writes the same bytes to an open stream. */
int ikv_tokenizer_write_synthetic(const char *path, uint32_t vocab_size, uint64_t seed);
int ikv_tokenizer_write_synthetic_stream(FILE *f, uint32_t vocab_size, uint64_t seed);

void ikv_tokenizer_destroy(ikv_tokenizer *t);
uint32_t ikv_tokenizer_vocab(const ikv_tokenizer *t);

/* Encodes UTF-8 text as llama2.c does: optional BOS, a dummy-prefix space, code points looked
 * up as pieces (bytes through byte fallback), then the highest-scoring adjacent merge
 * repeatedly; optional EOS. Writes at most max tokens; *n gets the count. Returns 0 or
 * IKV_ETOOLONG (more than max tokens), IKV_ENOMEM. Cost O(n log n log V) in the text length. */
int ikv_tokenizer_encode(const ikv_tokenizer *t, const char *text, int bos, int eos, uint32_t *out,
                         size_t max, size_t *n);

/* The text of `token` following `prev` (a leading space is dropped after BOS; byte pieces
 * "<0xHH>" become the byte). Sets *len (a byte piece may be a NUL byte). The pointer stays
 * valid while the tokenizer lives. */
const char *ikv_tokenizer_decode(const ikv_tokenizer *t, uint32_t prev, uint32_t token,
                                 size_t *len);

/* ---- sampler ----------------------------------------------------------------------------- */

typedef struct ikv_sampler ikv_sampler;

/* temperature 0 = greedy (argmax, lowest index on ties); topp in (0,1) = nucleus sampling,
 * otherwise plain sampling from the softmax. Seeded xorshift64*: the same seed and logits give
 * the same tokens. Returns 0, IKV_EINVAL (negative temperature, zero vocab), IKV_ENOMEM. */
int ikv_sampler_create(uint32_t vocab, float temperature, float topp, uint64_t seed,
                       ikv_sampler **out);
void ikv_sampler_destroy(ikv_sampler *s);
/* Picks a token from logits[vocab]. Overwrites logits with probabilities when temperature > 0.
 * Does not allocate. */
uint32_t ikv_sampler_sample(ikv_sampler *s, float *logits);
float ikv_sampler_temperature(const ikv_sampler *s);

/* The distribution ikv_sampler_sample draws from for these logits, into probs[vocab]: softmax
 * at the temperature, restricted to the top-p nucleus and renormalised when top-p is in (0, 1);
 * greedy: 1 on the argmax. Does not allocate. */
void ikv_sampler_dist(ikv_sampler *s, const float *logits, float *probs);

/* Draft acceptance at one position (the speculative-sampling rule for a deterministic draft:
 * Leviathan et al. 2023, Chen et al. 2023). Greedy: *out = argmax, returns 1 iff it is `draft`.
 * Otherwise, with p = ikv_sampler_dist(logits): returns 1 with probability p(draft) (*out =
 * draft), else 0 with *out drawn from p with `draft` removed and renormalised, so *out is
 * distributed exactly as ikv_sampler_sample(logits) would be. Uses one or two coins of the
 * sampler's stream. Does not allocate. */
int ikv_sampler_accept(ikv_sampler *s, const float *logits, uint32_t draft, uint32_t *out);

/* ---- engine ------------------------------------------------------------------------------ */

typedef struct ikv_engine ikv_engine;
typedef struct ikv_seq ikv_seq;

typedef struct ikv_engine_options {
    uint64_t kv_mem;       /* bytes of KV pool; 0 = room for max_seqs sequences + 4 cached
                              full-length sequences */
    uint32_t block_tokens; /* tokens per KV block (16) */
    uint32_t tile;         /* prefill tile rows: the unit of the prefill's calls; tiles are
                              aligned to absolute positions (64) */
    uint32_t group;        /* tiles whose rows go through one projection sgemm call in a
                              prefill (8; 1..64). Used only where BLAS gives every row the same
                              bits in a call of `group` tiles as in a call of its one tile,
                              checked at create (otherwise 1, one call per tile); with
                              threads = 0 always 1 */
    uint32_t max_seqs;     /* sequences in flight at once (1) */
    const char *policy;    /* cache eviction policy, "NAME[:k=v]" ("lru") */
    int threads;           /* forward-pass threads (the caller + threads - 1 workers started
                              at create), each calling single-threaded BLAS on a fixed share
                              of every step; sets OpenBLAS to 1 thread (process-wide).
                              0 = one thread, OpenBLAS's own thread setting left alone */
    uint64_t key_seed;     /* secret seed of block keys and scope salts */
    /* Lower tiers, fastest first, after the KV pool (tier 0): opened stores (the caller owns
     * them; open them with ikv_engine_store_params; they must outlive the engine) and the
     * blocks the cache core gives each (0 = the store's capacity). See src/model/tiers.c. */
    ikv_store *tiers[IKV_MAX_TIERS - 1];
    uint64_t tier_blocks[IKV_MAX_TIERS - 1];
    size_t n_tiers;
    uint64_t tokenizer_fp; /* hash of the tokenizer, part of the model fingerprint (0 = none) */
    int tier_dtype;        /* lower tiers' payload: IKV_BLOB_DTYPE_F32 (0, exact) or
                              IKV_BLOB_DTYPE_Q8 (int8 with a scale per token and kv head: about
                              4x fewer bytes, lossy; hits from such a tier are reported) */
    uint64_t private_blocks; /* pool blocks set aside for sequences' private blocks (partial
                                last blocks, decode blocks); admission reserves from them.
                                0 = max_seqs x ceil(seq_len / block_tokens), room for every
                                sequence to reach seq_len. The cache gets the rest. */
    uint32_t parked;         /* ended sequences' partial last blocks kept for reuse (0 =
                                max_seqs + 8); they take only blocks that are free */
    uint32_t max_draft;      /* draft tokens one ikv_engine_verify takes at most (0 = 64;
                                at most seq_len): sizes the decode scratch to max_draft + 1
                                rows */
} ikv_engine_options;

void ikv_engine_options_default(ikv_engine_options *o);

/* Creates an engine over a model (which must outlive it): allocates the KV pool, the prefix
 * cache (single tier, capacity = pool blocks minus max_seqs full sequences of private blocks)
 * and every scratch buffer the forward pass uses. Returns 0, IKV_EINVAL (bad options, a pool
 * smaller than the private reserve plus one cached block), IKV_EPOLICY/IKV_EPARAM (policy),
 * IKV_ENOMEM. */
int ikv_engine_create(const ikv_model *m, const ikv_engine_options *o, ikv_engine **out);
void ikv_engine_destroy(ikv_engine *e);

typedef struct ikv_request {
    const uint32_t *tokens; /* prompt token ids, each < vocab */
    size_t n;               /* 1..seq_len */
    const char *tenant;     /* scope of private blocks; NULL or "" = public scope */
    size_t public_tokens;   /* leading tokens declared public (shared across tenants) */
    int no_cache;           /* 1: neither look up nor insert (the cold reference) */
    float *logits_all;      /* optional [n][vocab]: logits of every position computed by this
                               prefill are written to their rows (others untouched);
                               ikv_engine_begin only */
    size_t max_new;         /* positions the sequence may add after the prompt (0 = up to
                               seq_len): admission reserves private blocks for them */
    size_t reserve_new;     /* 0: reserve blocks for all max_new positions at admission (a
                               sequence then never needs more). N > 0: reserve only the prompt's
                               blocks and N positions after it; each later block is reserved
                               by ikv_seq_reserve_next before the decode that needs it (so a
                               server can preempt when the budget is spent). Admission still
                               refuses (IKV_ETOOLONG) a request whose full limit could never
                               fit in the private budget alone. */
} ikv_request;

typedef struct ikv_prefill_info {
    size_t cached_tokens;   /* prompt positions taken from the cache (full blocks, and a
                               partial block's positions copied from a cached or parked one) */
    size_t partial_tokens;  /* of which copied from a partial block (copy-on-write) */
    size_t computed_tokens; /* prompt positions computed */
    size_t matched_blocks;  /* blocks the index matched */
    size_t rejected_blocks; /* matched blocks refused (token ids, depth or parent differ) */
    size_t inserted_blocks; /* new full blocks put in the cache */
    size_t tier_tokens[IKV_MAX_TIERS]; /* prompt positions taken from each tier (0 = pool;
                                          1.. = the lower tiers, loaded) */
    size_t recomputed_tier_tokens;     /* positions found in a lower tier but recomputed
                                          (for one of the four reasons below) */
    /* recomputed_tier_tokens by tier (1.. as in tier_tokens; they add up to it) and why:
     * cheaper: not loaded, recomputing was estimated cheaper (the split);
     * failed: a load failed (miss, corrupt, mismatch, down): that block and the rest of its run;
     * noroom: the pool had no free block to load into: that block and the rest of its run;
     * dropped: loaded, then not kept for the request (recomputed into fresh blocks) */
    size_t tier_cheaper_tokens[IKV_MAX_TIERS];
    size_t tier_failed_tokens[IKV_MAX_TIERS];
    size_t tier_noroom_tokens[IKV_MAX_TIERS];
    size_t tier_dropped_tokens[IKV_MAX_TIERS];
    size_t lossy_tokens;               /* cached positions whose K/V went through a lossy (q8)
                                          tier, now or when a pool block was loaded */
    double seconds;         /* wall time of the call (measured) */
} ikv_prefill_info;

/* Starts a request: ikv_engine_admit, then one step computing all its prompt positions. On success
 * *seq is an in-flight sequence whose last-position logits are ikv_seq_logits(). Returns 0,
 * IKV_EINVAL (empty prompt, token >= vocab), IKV_ETOOLONG (prompt longer than seq_len),
 * IKV_EBUSY (max_seqs sequences already in flight), IKV_EFULL (no pool block: cannot happen
 * while the pool invariant holds). A call rejected for its input changes nothing; one that fails
 * after inserting blocks (IKV_EFULL, or an unexpected cache error) releases the sequence but
 * leaves those blocks in the cache as pending, never matched, until evicted. Does not allocate. */
int ikv_engine_begin(ikv_engine *e, const ikv_request *r, ikv_seq **seq, ikv_prefill_info *info);

/* Admission without compute: validates the request, takes a sequence slot, matches the
 * prompt's blocks, locks the usable prefix, inserts the remaining full blocks (pending until
 * computed), reserves private blocks for the rest of the prompt and max_new positions, and
 * copies into a private (or pending) block the KV of a partial block that is already cached or
 * parked (copy-on-write), so the sequence starts with every cached position present and
 * ikv_seq_pending() prompt positions to compute with ikv_engine_step. info->computed_tokens is
 * the positions still to compute; seconds the time of the admission. Returns 0, IKV_EINVAL,
 * IKV_ETOOLONG, IKV_EBUSY (no free sequence slot), IKV_EFULL (the private blocks it needs are
 * not free now: retry once sequences end; nothing changed), or a cache error. Does not
 * allocate. */
int ikv_engine_admit(ikv_engine *e, const ikv_request *r, ikv_seq **seq, ikv_prefill_info *info);

/* One item of a forward step: a sequence and its next positions. While the sequence has
 * prompt positions pending, the step computes the next min(n, pending) of them (a prefill
 * chunk; n = 0: all); once none is pending, it decodes `token` at the next position (n
 * ignored). */
typedef struct ikv_step_item {
    ikv_seq *seq;
    uint32_t token; /* decode: the token appended */
    size_t n;       /* prefill: positions of the prompt to compute (0 = all remaining) */
    size_t done;    /* out: positions computed by this step (decode: 1 + accepted) */
    /* decode with a draft (speculative decoding inside the batched step): k tokens proposed for
     * the positions after `token`, verified in this same step as extra rows of the batch, with
     * ikv_engine_verify's arithmetic and acceptance (has_lead = 1). NULL / 0: a plain decode. */
    const uint32_t *draft;
    size_t k; /* 0..max_draft; the step's rows (1 + k per decode) <= ikv_engine_max_rows */
    ikv_sampler *sampler; /* the acceptance rule: NULL or temperature 0 greedy, else
                             ikv_sampler_accept's (its coins are drawn) */
    size_t accepted;      /* out (k > 0): leading draft tokens accepted, kept in the sequence */
    uint32_t next;        /* out (k > 0): the token for the position after them, not in the
                             sequence yet (ikv_verify.next); k = 0: untouched, sample the logits */
} ikv_step_item;

/* Runs ONE forward step for items[0..n) (distinct sequences): each prefill chunk on its
 * tiles, then the decode rows of all decoding sequences through every weight matrix as one
 * batched product (ikv__linear_rows). Afterwards ikv_seq_logits() of a sequence with nothing
 * pending is its last position's logits. A sequence's tokens, K/V and logits are bit-identical
 * whatever else is in the step and however its prompt was chunked or cached
 * (docs/engine.md, "Batches"). A decode with a draft (k > 0) runs 1 + k rows of its sequence
 * and keeps 1 + accepted positions: its tokens, logits and K/V are those of ikv_engine_verify
 * of the same lead and draft, and of decoding the kept tokens one by one; the rest is rolled
 * back. Returns 0, IKV_EFULL (a decode whose new blocks are not reserved: see
 * ikv_seq_reserve_next / ikv_seq_reserve; nothing runs), IKV_EINVAL (a sequence not in flight
 * or twice, a token >= vocab, k > max_draft, more rows than ikv_engine_max_rows; nothing
 * runs), IKV_ETOOLONG (a decode, or its draft, past the sequence's limit; nothing runs). Does
 * not allocate. */
int ikv_engine_step(ikv_engine *e, ikv_step_item *items, size_t n);

/* Threads the following forward passes (ikv_engine_step, _begin, _decode, _verify, the chunk
 * store's) run on: 1..options.threads (0 = all of them, the default after create). The work
 * stays cut into options.threads fixed shares; with k threads, thread t runs shares t, t + k,
 * ... one after the other, so every result is the same bits at any k (tested), only slower;
 * threads k.. sleep (no spinning). Call between steps. Returns 0 or IKV_EINVAL (k out of range;
 * nothing changed). Does not allocate. */
int ikv_engine_set_threads(ikv_engine *e, int k);
/* Threads the next forward pass runs on. */
int ikv_engine_threads(const ikv_engine *e);
/* CPU seconds the engine's worker threads (threads 1.., not the calling thread) have used
 * since create, from their CPU clocks (measured; spinning while they wait for work counts). */
double ikv_engine_worker_cpu(const ikv_engine *e);
/* Decode rows one ikv_engine_step can take: the sum over its decode items of 1 + k. */
size_t ikv_engine_max_rows(const ikv_engine *e);

/* Pins the cached blocks wholly inside the first n_public tokens of `tokens` (the public
 * scope: a shared system prompt) for ttl requests (0 = until the engine ends), so eviction
 * leaves them. Returns 0, IKV_ENOENT (not all of them are cached and ready), IKV_EBUDGET (the
 * cache's pin budget is spent; nothing pinned), IKV_EINVAL (fewer than one block). */
int ikv_engine_pin_public(ikv_engine *e, const uint32_t *tokens, size_t n_public, uint64_t ttl);

/* Reserves, from the private budget, the block the next decode of s needs when that decode
 * starts a block beyond the sequence's reservation (requests admitted with reserve_new).
 * Returns 0 (nothing needed, or reserved), IKV_EFULL (the budget is spent: end or preempt
 * another sequence first; nothing changed). ikv_engine_step returns IKV_EFULL (nothing runs)
 * for a decode whose block is not reserved. Does not allocate. */
int ikv_seq_reserve_next(ikv_engine *e, ikv_seq *s);
/* The same for the next npos positions (a draft to verify): reserves every block they need
 * beyond the reservation at once, or nothing (IKV_EFULL). ikv_engine_verify returns IKV_EFULL
 * (nothing changes) when its rows need blocks not reserved. */
int ikv_seq_reserve(ikv_engine *e, ikv_seq *s, size_t npos);

/* Prompt positions of s not computed yet. */
size_t ikv_seq_pending(const ikv_seq *s);

/* Appends `token` at the next position and runs one decode step (matrix-vector products).
 * Sets *logits (valid until the next call on this sequence). Returns 0, IKV_ETOOLONG at
 * seq_len, IKV_EINVAL (token >= vocab). Does not allocate. */
int ikv_engine_decode(ikv_engine *e, ikv_seq *s, uint32_t token, const float **logits);

/* Draft verification (ikv_engine_verify). The caller's fields: lead, draft, k, sampler,
 * logits_all; the rest are set by the call. */
typedef struct ikv_verify {
    int has_lead;         /* 1: `lead` is the token already chosen for the next position (it
                             is appended unconditionally, as ikv_engine_decode would) */
    uint32_t lead;
    const uint32_t *draft; /* k proposed tokens for the positions after it */
    size_t k;              /* 0..max_draft */
    ikv_sampler *sampler;  /* NULL or temperature 0: greedy acceptance; otherwise the
                              speculative-sampling rule (ikv_sampler_accept) with its coins */
    float *logits_all;     /* optional [has_lead + k][vocab]: each forward row's logits (rows
                              run, below; the others untouched) */
    size_t accepted;       /* out: leading draft tokens accepted, 0..k */
    uint32_t next;         /* out: the token for the position after them: the sampler's choice
                              at the first mismatch (greedy: the argmax; sampling: drawn with the
                              rejected token removed), or after a fully accepted draft a plain
                              sample; it is not in the sequence yet (decode it, or lead the next
                              verify with it) */
    size_t rows;           /* out: rows the forward ran: has_lead + k, or 0 when, without a
                              lead, the first draft token was refused by the current logits */
} ikv_verify;

/* Verifies a draft in ONE batched forward: rows [lead,] draft[0..k) at the next positions,
 * with decode arithmetic (every weight product through ikv__linear_rows, whose bits do not
 * depend on the row count; each row's attention by the decode kernel over its own causal
 * prefix, the earlier rows' K/V written first, layer by layer), so each row's logits are
 * bit-identical to what ikv_engine_decode of the same tokens one by one would give. draft[i] is
 * checked against the logits before it (the current ikv_seq_logits for draft[0] without a lead,
 * else the previous row's); the first refused token ends the accepted prefix. Afterwards the
 * sequence holds the lead and the accepted tokens, ikv_seq_logits() is the logits after the
 * last of them (the mismatch position's), and positions past them are rolled back: their block
 * token ids restored, blocks taken only for them returned to the pool (their K/V slots are
 * overwritten by the next write). Returns 0, IKV_EINVAL (a sequence not in flight or with
 * prompt pending, k > max_draft, a token >= vocab; nothing changes), IKV_ETOOLONG (has_lead + k
 * positions do not fit the sequence's limit: ikv_seq_room; nothing changes). Does not
 * allocate. */
int ikv_engine_verify(ikv_engine *e, ikv_seq *s, ikv_verify *v);

/* A prompt-lookup draft: the up to k tokens that followed the latest earlier occurrence of
 * the last m tokens of hist[0..len), for the largest m in ngram..min_ngram (0 counts as 1)
 * that has one; written to out, returns how many (0: no match). Does not allocate. */
size_t ikv_lookup_draft(const uint32_t *hist, size_t len, uint32_t ngram, uint32_t min_ngram,
                        size_t k, uint32_t *out);

/* Positions the sequence may still add (its limit minus its length). */
size_t ikv_seq_room(const ikv_seq *s);

/* Ends a request: unlocks its cached blocks and returns its private blocks to the pool. */
void ikv_engine_end(ikv_engine *e, ikv_seq *s);

const float *ikv_seq_logits(const ikv_seq *s); /* [vocab] of the last position */
size_t ikv_seq_len(const ikv_seq *s);          /* positions so far */

/* Copies the K and V vectors ([n_kv_heads * head_dim] each) of position `pos` at `layer` of a
 * sequence out of its blocks (for tests and tools). Returns 0 or IKV_ERANGE. */
int ikv_seq_kv(const ikv_engine *e, const ikv_seq *s, size_t pos, int layer, float *k, float *v);

typedef struct ikv_engine_stats {
    uint64_t pool_blocks, free_blocks, cached_blocks, private_blocks;
    uint64_t block_bytes;    /* KV bytes of one block */
    uint64_t cache_capacity; /* blocks */
    uint64_t requests, cached_tokens, computed_tokens, rejected_blocks;
    uint64_t partial_hits;  /* admissions that copied a partial block's KV */
    uint64_t parked_blocks; /* partial blocks parked for reuse (counted in free_blocks too:
                               reclaimed at once when a block is needed) */
    uint64_t private_budget, reserved_blocks; /* admission: blocks set aside, reserved now */
    uint32_t prefill_group; /* tiles per projection call in use (options.group if the check at
                               create passed, else 1) */
    int prefill_trim;       /* 1: a tile alone goes through the projections on its rows only */
    uint32_t prefill_pitch; /* rows a tile takes in a projection call (the tile, or the tile
                               padded to what the BLAS needs for the above to hold) */
} ikv_engine_stats;
void ikv_engine_stats_get(const ikv_engine *e, ikv_engine_stats *s);

ikv_cache *ikv_engine_cache(ikv_engine *e); /* the prefix cache (owned by the engine) */

/* ---- lower tiers (tiers.c) ----------------------------------------------------------------- */

/* The model fingerprint: XXH3-64 of the checkpoint image, the tokenizer hash, the block size,
 * the KV dtype and the block layout version. Every stored block carries it. */
uint64_t ikv_engine_fingerprint(const ikv_model *m, const ikv_engine_options *o);

/* The parameters a store needs to hold this engine's blocks (slot size, fingerprint). */
void ikv_engine_store_params(const ikv_model *m, const ikv_engine_options *o,
                             ikv_store_params *p);

typedef struct ikv_engine_tier_stats {
    const char *spec;         /* the store's spec */
    uint64_t capacity;        /* blocks the cache core gives the tier */
    uint64_t resident;        /* blocks the core holds in it now */
    uint64_t loaded_blocks;   /* lower-tier hits loaded into the pool */
    uint64_t recomputed_blocks; /* lower-tier hits recomputed because that was cheaper */
    uint64_t failed_blocks;   /* loads that failed (miss, corrupt, mismatch, down): recomputed */
    /* lower-tier hits recomputed for another reason than recomputed_blocks' (as the prefill
     * info's tier_*_tokens): a load failed (that block and the rest of its run), no free pool
     * block to load into, loaded then not kept */
    uint64_t recomputed_failed_blocks, recomputed_noroom_blocks, recomputed_dropped_blocks;
    uint64_t probed_blocks;   /* blocks found by probing keys this index had never seen */
    uint64_t demoted_blocks;  /* blocks written into the tier */
    uint64_t deleted_blocks;  /* blocks deleted (dropped by the core, moved away) */
    double load_s_per_block;  /* current estimate: probe at start, then a running average */
    double put_s_per_block;
    ikv_store_stats store;
} ikv_engine_tier_stats;

/* Fills st for lower tier t (1..n_tiers). Returns 0 or IKV_ERANGE. */
int ikv_engine_tier_stats_get(const ikv_engine *e, size_t t, ikv_engine_tier_stats *st);
/* The engine's measured prefill time for positions [a, b) (seconds; the running average of
 * its prefills at the cost model in tiers.c), 0 before anything was measured. */
double ikv_engine_prefill_estimate(const ikv_engine *e, size_t a, size_t b);
const ikv_model *ikv_engine_model(const ikv_engine *e);

/* Walks the pool invariants (every block free, private to one sequence, or cached under the
 * node that maps to it; counts add up; cached blocks are resident in the core with the same
 * key). Returns 1 if they hold, 0 with an ikv_errdetail message if not. */
int ikv_engine_check(const ikv_engine *e);
/* Writes the pool (blocks per state, capacity), the cached blocks (node, depth, parent, first
 * tokens) and the live sequences' block tables to f, for debugging. */
void ikv_engine_dump(const ikv_engine *e, FILE *f);


/* ---- structured requests and position-independent chunk reuse (chunks.c) --------------------
 *
 * A request as segments (system, tool, memory, doc, history, query). A `reusable` segment's KV
 * is kept in a chunk store keyed by its own tokens (and the model fingerprint, and the tenant's
 * scope unless the segment is public), not by the prefix before it, and is placed at any new
 * offset by re-rotating its keys (RoPE at p + d is the rotation by d of RoPE at p). The reused
 * tokens lack attention to what now precedes them, so a fraction r of them is recomputed in
 * every layer (CacheBlend): those whose K/V deviate most on a selection layer (reused against
 * freshly computed), plus each segment's first tokens; a deviation bound raises the count, up
 * to a full prefill. r = 1 is the ordinary exact prefill. See docs/chunks.md. */

enum { IKV_PSEG_SYSTEM = 0, IKV_PSEG_TOOL, IKV_PSEG_MEMORY, IKV_PSEG_DOC, IKV_PSEG_HISTORY,
       IKV_PSEG_QUERY, IKV_PSEG_KINDS };

/* "system", "tool", ... ("?" out of range); parse: 0 or IKV_EINVAL. */
const char *ikv_pseg_kind_name(int kind);
int ikv_pseg_kind_parse(const char *name, int *kind);

typedef struct ikv_prompt_seg {
    int kind;               /* IKV_PSEG_* */
    const uint32_t *tokens; /* token ids (< vocab) */
    size_t n;               /* >= 1 */
    int is_public;          /* shared across tenants (its chunk key has no tenant scope) */
    int reusable;           /* its KV may be reused at any position (chunk store) */
    int movable;            /* --layout shared-first may move it */
} ikv_prompt_seg;

/* Layout "shared-first": writes the n segments to out (distinct from in) with the movable
 * segments that are public or reusable moved, in their order, before the first movable
 * personal one; segments that are not movable keep their index. Returns the number of segments
 * whose index changed. */
size_t ikv_psegs_shared_first(const ikv_prompt_seg *in, size_t n, ikv_prompt_seg *out);

typedef struct ikv_chunks_options {
    uint64_t mem;          /* bytes of chunk store (64 MiB) */
    float ratio;           /* default fraction of reused tokens recomputed (IKV_BLEND_RATIO) */
    float max_dev;         /* quality guard: every reused token's relative K/V deviation on the
                              selection layer must be <= max_dev, else it is recomputed
                              (IKV_BLEND_MAX_DEV; <= 0 or inf: off) */
    uint32_t first_tokens; /* first tokens of each reused segment always recomputed (4) */
} ikv_chunks_options;

#define IKV_BLEND_RATIO   0.15f /* measured default: docs/chunks.md */
#define IKV_BLEND_MAX_DEV 0.25f /* chosen from measurements: docs/chunks.md */

void ikv_chunks_options_default(ikv_chunks_options *o);

typedef struct ikv_chunks ikv_chunks;

/* Creates the chunk store and the blend scratch (sized for seq_len rows) over an engine, which
 * must outlive it. 0, IKV_EINVAL, IKV_ENOMEM. */
int ikv_chunks_create(ikv_engine *e, const ikv_chunks_options *o, ikv_chunks **out);
void ikv_chunks_destroy(ikv_chunks *c);

typedef struct ikv_blend_request {
    const ikv_prompt_seg *segs;
    size_t n_segs;
    const char *tenant; /* scope of private reusable segments (and of private blocks) */
    float ratio;        /* < 0: the store's default; 1: full prefill */
    float max_dev;      /* < 0: the store's default */
    size_t max_new;     /* as ikv_request.max_new */
    size_t reserve_new; /* as ikv_request.reserve_new (0: blocks up to max_new reserved now) */
    int no_store;       /* 1: do not put this request's missing reusable segments in the store */
    int no_cache;       /* 1: neither use nor fill the prefix cache (a cold reference) */
    uint8_t *hits;      /* optional [n_segs]: out, 1 for each segment whose stored K/V were
                           reused; with hits_in, in: reuse exactly these (IKV_ENOENT if one is
                           no longer stored), so a re-admitted request gets the same K/V */
    int hits_in;
} ikv_blend_request;

typedef struct ikv_blend_info {
    size_t prompt_tokens;
    size_t reusable_tokens;   /* tokens of reusable segments */
    size_t reused_tokens;     /* of which K/V taken from the store (not recomputed) */
    size_t recomputed_tokens; /* reusable tokens computed: misses, and selected hit tokens */
    size_t hit_segments, miss_segments, stored_segments;
    size_t guard_tokens;   /* tokens the deviation bound added beyond the ratio */
    double deviation_max;  /* selection layer: largest deviation among tokens left reused */
    double deviation_mean; /* mean over the hit segments' tokens */
    int full;              /* 1: ran the ordinary exact prefill (no hit, r = 1, or the guard) */
    size_t prefix_cached_tokens; /* leading positions found in the exact prefix cache */
    size_t blend_layers;         /* layers the blend pass ran (0 on the exact path) */
    size_t blend_units;          /* its units (ikv_chunks_advance: a stage of a row range) */
    ikv_prefill_info prefill; /* of the exact prefill; cached_tokens = prefix-cached + reused,
                                 computed_tokens = the rest */
    double seconds;           /* wall time (measured), time to the first token's logits */
} ikv_blend_info;

/* A structured request in flight, from admission to its first token's logits (chunks.c owns
 * it; one per engine sequence). */
typedef struct ikv_blend_job ikv_blend_job;

/* Admits a structured request: concatenates the segments, looks up each reusable one in the
 * store. With no hit (or r >= 1) the whole prompt is admitted as an ordinary request (exact,
 * prefix cache as usual); else the positions before the first hit are (token-exact prefix
 * blocks with their scopes, the leading public segments public), and the rest waits for the
 * blend pass. Either way the admitted positions are pending prefill, run by ikv_engine_step in
 * chunks like any prompt (ikv_chunks_job_seq). Returns 0, IKV_EINVAL (no segment, empty
 * segment, token >= vocab, bad kind), IKV_ETOOLONG, IKV_ENOENT (hits_in: a segment to reuse is
 * gone), IKV_EBUSY / IKV_EFULL (as ikv_engine_admit: retry later), nothing admitted on error.
 * The request's segs, tenant and hits stay the caller's and must live until job_end. */
int ikv_chunks_admit(ikv_chunks *c, const ikv_blend_request *r, ikv_blend_job **job);
ikv_seq *ikv_chunks_job_seq(const ikv_blend_job *job);
/* Advances a job once its sequence has no pending prefill: starts the blend pass (places the
 * hit segments' K/V re-rotated to their offsets), then runs ONE unit of it: a layer's Q/K/V
 * stage for up to 8 x max_rows active rows, or its attention + FFN stage for up to max_rows
 * (max_rows = 0: the whole pass in this call). Returns 1 when the first token's logits are in
 * the sequence (the missing reusable segments then stored), 0 when more is to do (more units;
 * prefill positions pending again — the guard abandoned the pass for the exact prefill of the
 * rest; or another job's pass holds the scratch: call again after a step), IKV_ENOENT
 * (hits_in, a segment was dropped meanwhile). One blend pass runs at a time. The result's bits
 * depend on max_rows (which rows share a product), never on other sequences. Allocates only
 * when storing a segment. */
int ikv_chunks_advance(ikv_chunks *c, ikv_blend_job *job, size_t max_rows);
/* What the job did so far (final once advance returned 1). */
void ikv_chunks_job_info(const ikv_blend_job *job, ikv_blend_info *info);
/* Frees the job (its sequence is the caller's to end, before or after). Takes NULL. */
void ikv_chunks_job_end(ikv_chunks *c, ikv_blend_job *job);

/* admit + the prefill steps + advance to the end: on success *seq is in flight as after
 * ikv_engine_begin (decode, ikv_engine_end). Errors as ikv_chunks_admit. */
int ikv_chunks_begin(ikv_chunks *c, const ikv_blend_request *r, ikv_seq **seq,
                     ikv_blend_info *info);

/* The chunk store's entries and bytes. */
void ikv_chunks_stats(const ikv_chunks *c, size_t *entries, uint64_t *bytes);
/* Invariants of the store (bytes add up, entries well-formed). 1 or 0 with ikv_errdetail. */
int ikv_chunks_check(const ikv_chunks *c);
/* Writes the store's entries (hash, scope salt, length, offset, age) to f, for debugging. */
void ikv_chunks_dump(const ikv_chunks *c, FILE *f);

/* Tests: re-rotates keys k[n][kv_dim] (RoPE'd at positions a..a+n) in place to positions
 * b..b+n, as placement does. */
void ikv_chunks_rerotate(const ikv_chunks *c, float *k, size_t n, long delta);

/* ---- benchmark ----------------------------------------------------------------------------- */

typedef struct ikv_engine_bench_options {
    const char *config; /* model config name ("small") */
    uint32_t prefix;    /* P: shared public prefix tokens (2048) */
    uint32_t suffix;    /* Q: private suffix tokens per tenant (32) */
    uint32_t decode;    /* decode steps measured (32) */
    int threads[2];     /* thread counts to measure (1, 2); 0 ends the list */
    uint64_t seed;
    uint32_t repeat; /* repetitions per thread count; each figure is the best (0 = 1) */
    uint32_t tile;   /* prefill tile rows (0 = the engine's default, 64) */
    uint32_t group;  /* tiles per projection call (0 = the engine's default, 8) */
    int q8;          /* > 0: the model quantized to int8 in groups of q8 (ikv_model_quantize) */
    int q8_prefill;  /* int8 model's prefill: -1 default, 1 int8 products, 0 dequantize+sgemm */
    /* lower tiers (store specs, fastest first): with any, the pool is sized to hold one
     * request's blocks, a third request with another prefix pushes the first prefix down, and
     * a fourth (another tenant, the first prefix) takes it from the tiers: TTFT from the tier */
    const char *tiers[IKV_MAX_TIERS - 1];
    size_t n_tiers;
    int tier_dtype; /* IKV_BLOB_DTYPE_F32 or _Q8 */
} ikv_engine_bench_options;

typedef struct ikv_engine_bench_row {
    int threads;
    uint32_t group; /* tiles per projection call the engine used (1 if its check failed) */
    int trim;       /* whether a tile alone went through the projections on its rows only */
    uint32_t pitch; /* rows a tile took in a projection call (the tile, or padded) */
    double ttft_cold_s, ttft_warm_s; /* measured, wall clock */
    size_t warm_cached_tokens;
    double prefill_tok_s, prefill_gflops; /* cold prefill, useful FLOPs only */
    double sgemm_peak_gflops; /* measured: square 1536^3 sgemm, OpenBLAS-threaded or one per
                                 pool thread at once, the better */
    double decode_tok_s;
    double read_gbs;           /* measured read bandwidth over 256 MiB: the best of a streaming
                                  sum per pool thread, sasum per pool thread, threaded sasum */
    double decode_bound_tok_s; /* read_gbs / step_bytes; 0 when the bound does not apply */
    double step_bytes;         /* bytes one decode step reads: the weights it uses plus the KV
                                  of the mean context over the decode steps */
    int bound_applies;         /* 0 when step_bytes fit in the last-level cache: the steps then
                                  read cache, not memory, and no memory bound holds */
    double ttft_tier_s;        /* with tiers: TTFT of the request whose prefix is in them */
    size_t tier_loaded_tokens, tier_recomputed_tokens; /* that request's, by the decision */
    const char *peak_how, *read_how; /* which probe gave the peak / the bandwidth (static) */
} ikv_engine_bench_row;

typedef struct ikv_engine_bench_result {
    ikv_model_config cfg;
    uint32_t prefix, suffix, decode, repeat, tile, group;
    int q8;         /* int8 group size, 0 for fp32 weights */
    int q8_gemm;    /* int8 prefill by int8 products (1) or dequantize + sgemm (0) */
    const char *q8_kernels; /* the int8 kernel level in use ("avx512-vnni", ...) */
    long cores;
    uint64_t llc_bytes; /* the last-level cache this machine reports (0: unknown) */
    size_t n_rows;
    ikv_engine_bench_row rows[2];
} ikv_engine_bench_result;

/* Runs the engine benchmark (builds the model in memory; no file). Returns 0 or an error. */
int ikv_engine_bench(const ikv_engine_bench_options *o, ikv_engine_bench_result *r);
/* Writes the result as text or JSON to f (what was measured, on what, core count). */
void ikv_engine_bench_print(const ikv_engine_bench_result *r, FILE *f, int json);

#ifdef __cplusplus
}
#endif
#endif
