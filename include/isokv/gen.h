/*
 * isokv sim, part 2: structured prompts ("segments") and the synthetic multi-user generator.
 *
 * A segments trace (docs/segments.md) describes each request as an ordered list of segments
 * (system prompt, tool schema, memory items, retrieved documents, history, the query), each named
 * by its identity (kind, id, and the tenant unless the segment is public) and a token count. The
 * identity alone determines the segment's token ids, so the same document, memory item or system
 * prompt yields the same tokens wherever it appears:
 *
 *     identity = XXH3-64(seed 0x69736f6b76736567; kind ‖ 0 ‖ id ‖ 0 ‖ tenant-or-"" )
 *     token[j] = splitmix64(identity + (j + 1) * 0x9E3779B97F4A7C15) mod 32000
 *
 * A request's tokens are the concatenation of its segments; it is cut into blocks of
 * block_tokens (the last may be partial) and keyed with ikv_key_chain: blocks that lie wholly
 * inside the leading run of public segments under IKV_SCOPE_PUBLIC, every later block (including
 * one that straddles public and private content) under the tenant's scope salt. Each `doc`
 * segment also gets position-independent keys for chunk reuse (ikv_chunk in sim.h).
 *
 * The generator (ikv_gen_*) writes such traces for N users with shared apps, drifting personal
 * memory, Zipf-popular documents, multi-turn sessions and Poisson arrivals; see docs/segments.md
 * for every knob. Output is a pure function of the options (seed included).
 */
#ifndef ISOKV_GEN_H
#define ISOKV_GEN_H

#include "isokv/base.h"
#include "isokv/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- segments ---------------------------------------------------------------------------- */

#define IKV_SEG_VOCAB         32000u     /* token ids derived from identities lie in [0, this) */
#define IKV_SEG_MAX_TOKENS    (1u << 24) /* tokens per request, all segments together */
#define IKV_SEG_DEFAULT_BLOCK 16u        /* block size of a trace with no header */

typedef enum ikv_seg_kind {
    IKV_SEG_SYSTEM = 0,
    IKV_SEG_TOOL,
    IKV_SEG_MEMORY,
    IKV_SEG_DOC,
    IKV_SEG_HISTORY,
    IKV_SEG_QUERY,
    IKV_SEG_KIND_COUNT
} ikv_seg_kind;

/* "system", "tool", ...; NULL for an out-of-range kind. */
const char *ikv_seg_kind_name(ikv_seg_kind k);
/* Parses a kind name; 0 or IKV_EINVAL. */
int ikv_seg_kind_parse(const char *name, ikv_seg_kind *out);

typedef struct ikv_segment {
    ikv_seg_kind kind;
    const char *id;  /* any string; borrowed for the duration of the call that takes it */
    uint32_t tokens; /* > 0 */
    int is_public;   /* shared across tenants: identity excludes the tenant */
} ikv_segment;

/* The 64-bit identity of a segment (formula above); `tenant` is ignored for public segments. */
uint64_t ikv_seg_identity(ikv_seg_kind kind, const char *id, const char *tenant, int is_public);

/* Writes tokens [0, n) of the segment with this identity. Does not allocate. */
void ikv_seg_tokens(uint64_t identity, uint32_t *out, size_t n);

/* Turns lists of segments into block keys. The builder owns growing buffers, so building a
 * request allocates only when it is larger than every request before it. */
typedef struct ikv_seg_builder ikv_seg_builder;

/* Creates a builder for key seed `seed` and blocks of block_tokens (> 0). Returns 0, IKV_EINVAL
 * or IKV_ENOMEM. The caller frees it with ikv_seg_builder_destroy (which takes NULL). */
int ikv_seg_builder_create(uint64_t seed, uint32_t block_tokens, ikv_seg_builder **out);
void ikv_seg_builder_destroy(ikv_seg_builder *b);

/* Builds the blocks of one request of tenant `tenant` (non-empty) from segs[0..n): fills
 * req->input_tokens, n_blocks, keys, ntokens, n_chunks, chunks and n_public_blocks; leaves the
 * other fields of *req alone. The arrays belong to the builder and stay valid until its next
 * build or destroy. Chunks: one per `doc` segment that covers at least one whole block of the
 * request, with doc_keys = the first `count` keys of the document's own tokens cut into blocks
 * from the document's start, under IKV_SCOPE_PUBLIC for a public document and the tenant's
 * scope otherwise. Returns 0; IKV_EINVAL (no segments, a zero-token segment, empty tenant,
 * bad kind); IKV_ETOOLONG (more than IKV_SEG_MAX_TOKENS); IKV_ENOMEM. On error *req is
 * unchanged. */
int ikv_seg_build(ikv_seg_builder *b, const char *tenant, const ikv_segment *segs, size_t n,
                  ikv_trace_request *req);

/* The tokens of the last successful build (input_tokens of them). */
const uint32_t *ikv_seg_builder_tokens(const ikv_seg_builder *b);

/* ---- generator --------------------------------------------------------------------------- */

typedef enum ikv_gen_layout {
    IKV_LAYOUT_PERSONAL_FIRST = 0, /* system, tool, memory, docs, history, query */
    IKV_LAYOUT_SHARED_FIRST,       /* system, tool, docs, memory, history, query */
} ikv_gen_layout;

const char *ikv_gen_layout_name(ikv_gen_layout l);
int ikv_gen_layout_parse(const char *name, ikv_gen_layout *out);

/* Knobs; ikv_gen_opts_default() gives the defaults named in brackets. All token counts are
 * tokens, all times seconds. */
typedef struct ikv_gen_opts {
    uint64_t seed;               /* [1] every random choice derives from it */
    uint32_t block_tokens;       /* [16] written to the header; readers cut blocks with it */
    uint64_t users;              /* [100] tenants u0..u(N-1) */
    double user_alpha;           /* [0] Zipf exponent of user activity (0 = uniform) */
    uint32_t apps;               /* [4] user u belongs to app hash(u) mod A */
    uint32_t system_tokens;      /* [2048] per-app public system prompt */
    uint32_t tool_tokens;        /* [256] per-app public tool schema (0 = none) */
    uint32_t memory_tokens;      /* [1024] per-user memory (0 = none) ... */
    uint32_t memory_item_tokens; /* [128] ... in items of this size (the last may be shorter) */
    double drift;                /* [0.25] fraction of memory items rewritten per new session */
    uint32_t docs_per_query;     /* [4] k documents retrieved per query (0 = none) */
    uint64_t corpus;             /* [10000] V documents */
    uint32_t doc_tokens;         /* [512] tokens per document */
    double doc_alpha;            /* [1.0] Zipf exponent of document popularity */
    int private_docs;            /* [0] 1: documents are per-tenant, not public */
    uint32_t turns;              /* [4] turns per session; history grows with each */
    double think;                /* [30] mean think time between turns (exponential) */
    double rate;                 /* [10] mean requests per second (sessions start at rate/T) */
    double user_rate;            /* [0] > 0: requests per user per hour; then the total rate
                                    is users * user_rate / 3600 (load grows with users) and
                                    `rate` is ignored */
    double duration;             /* [0] keep requests arriving before this time (0 = no bound) */
    uint64_t requests;           /* [10000 if duration is 0, else 0] keep the first R requests */
    uint64_t intents;            /* [1000] Zipf head of query intents ... */
    double intent_alpha;         /* [1.0] ... with this exponent ... */
    double novelty;              /* [0.2] ... and this probability of a new, unique intent */
    uint32_t query_tokens;       /* [64] tokens per query */
    uint32_t output_tokens;      /* [256] tokens per answer (output length) */
    ikv_gen_layout layout;       /* [personal-first] */
} ikv_gen_opts;

void ikv_gen_opts_default(ikv_gen_opts *o);

/* Checks the knobs; 0 or IKV_EPARAM with a detail naming the knob and its allowed range. */
int ikv_gen_opts_check(const ikv_gen_opts *o);

/* Writes the header and every request as segments JSONL to f, in arrival order. `progress`
 * (may be NULL) is updated with requests written. Writes *n_requests (may be NULL). Returns 0,
 * IKV_EPARAM (bad knobs), IKV_ENOMEM, or IKV_EIO (write failed). */
int ikv_gen_write(const ikv_gen_opts *o, FILE *f, ikv_progress *progress, uint64_t *n_requests);

/* The same into `path` as an atomic output file (ikv_outset in base.h: written to a temporary
 * beside it and renamed, so a failure never leaves a partial file; a device, directory or other
 * non-regular target is refused, IKV_EINVAL). Returns as ikv_gen_write, and IKV_EIO naming the
 * path when it cannot be created or renamed. */
int ikv_gen_write_file(const ikv_gen_opts *o, const char *path, ikv_progress *progress,
                       uint64_t *n_requests);

#ifdef __cplusplus
}
#endif
#endif
