/*
 * isokv response cache: finished responses (tenant scope, prompt tokens, output tokens,
 * sampling parameters), found again for a new prompt by similarity, and used ONLY as a draft
 * that the model verifies (ikv_engine_verify): similarity proposes, the model decides. So a
 * served token is always one the model itself would produce (greedy: bit-identical output to
 * decoding without the cache; sampling: the model's distribution), whatever the threshold.
 *
 * Similarity: MinHash (Broder 1997) over the prompt's token n-grams (shingles; n = 3 by
 * default) with 64 hash functions estimates the Jaccard similarity of two prompts' shingle
 * sets; a flat scan of the signatures of every visible entry keeps the best few, which are
 * rescored by the exact Jaccard of their sorted shingle sets. Why this and not an embedding:
 * the engine's models are small (stories260K) and their hidden states are poor sentence
 * embeddings; n-gram overlap is what makes a cached output a good draft (the same names,
 * numbers, phrases); it is exact and cheap to recheck; and since correctness never depends on
 * the score, a cheap score that ranks well is all that is needed. Debian has no C vector index.
 *
 * Scope: an entry is visible to the tenant whose scope salt stored it, or to everyone when it
 * was stored as public (the caller does that only for a prompt wholly declared public). Two
 * tenants never see each other's private responses (tests/test_respcache.c).
 *
 * Bounds: at most `capacity` entries, prompt and output each at most max_tokens tokens (longer
 * ones are cut), and, with max_bytes, at most max_bytes accounted bytes (each entry: a fixed
 * IKV_RESPCACHE_ENTRY_BYTES, 4 per prompt and output token, 8 per prompt shingle); entries are
 * evicted by a policy of the cache core's registry (cache.h): each entry is one first-level
 * block of an ikv_cache of that capacity, a put is an insert, a use of a candidate is a hit,
 * a put over the byte budget first evicts the policy's victims (ikv_cache_evict) until the new
 * entry fits, and the core's on_evict frees the entry. Without max_bytes memory is bounded by
 * capacity x (2 max_tokens x 4 + max_tokens x 8 + 64 x 8) bytes.
 *
 * Allocation: create sizes the lookup scratch; a put allocates its entry's token and shingle
 * arrays (after a request finished, off the decode path); lookup does not allocate.
 * Not thread-safe: one thread (the server's scheduler) drives it.
 */
#ifndef ISOKV_RESPCACHE_H
#define ISOKV_RESPCACHE_H

#include "isokv/base.h"
#include "isokv/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ikv_respcache ikv_respcache;

typedef struct ikv_respcache_options {
    uint32_t capacity;     /* entries (1024) */
    uint64_t max_bytes;    /* bytes of entries at most (0 = entries bound alone): an entry
                              counts IKV_RESPCACHE_ENTRY_BYTES + 4 per prompt and output token +
                              8 per prompt shingle; puts evict (policy) until under it */
    const char *policy;    /* eviction policy of the cache core's registry, "NAME[:k=v]" ("lru") */
    uint32_t ngram;        /* shingle length in tokens (3; 1..16) */
    uint32_t max_tokens;   /* longest prompt and output kept, tokens (4096) */
    double min_similarity; /* exact Jaccard a candidate needs (0.2; 0 = any overlap) */
    uint64_t key_seed;     /* secret seed of scope salts and keys */
} ikv_respcache_options;

void ikv_respcache_options_default(ikv_respcache_options *o);

/* Sampling parameters a response was produced with (stored with it, returned with hits). */
typedef struct ikv_respcache_params {
    float temperature, top_p;
    uint64_t seed;
} ikv_respcache_params;

/* Creates a response cache. Returns 0, IKV_EINVAL (zero capacity, ngram out of range),
 * IKV_EPOLICY/IKV_EPARAM (policy), IKV_ENOMEM. */
int ikv_respcache_create(const ikv_respcache_options *o, ikv_respcache **out);
void ikv_respcache_destroy(ikv_respcache *rc); /* takes NULL */

/* Stores a finished response of `tenant` (NULL or "" = the public scope; public = 1 makes it
 * visible to every tenant). An entry with the same scope, prompt and parameters is replaced.
 * May evict (policy; by entries and by bytes). Returns 0, IKV_EINVAL (empty prompt or output),
 * IKV_ENOMEM (nothing changed), IKV_EFULL (the entry alone is above max_bytes: not stored,
 * nothing changed; or no evictable entry). */
int ikv_respcache_put(ikv_respcache *rc, const char *tenant, int public_, const uint32_t *prompt,
                      size_t np, const uint32_t *output, size_t no,
                      const ikv_respcache_params *params);

/* A candidate: pointers valid until the next put or destroy. */
typedef struct ikv_respcache_hit {
    uint32_t id;       /* entry id, for ikv_respcache_used */
    double similarity; /* exact Jaccard of the shingle sets */
    double estimate;   /* MinHash estimate that ranked it */
    const uint32_t *prompt, *output;
    size_t n_prompt, n_output;
    ikv_respcache_params params;
} ikv_respcache_hit;

/* Up to max candidates for a prompt of `tenant`, best first (exact Jaccard >= min_similarity),
 * from that tenant's entries and public ones. Returns how many were written. O(entries x 64)
 * for the scan plus O(n log n) per rescored candidate; does not allocate. */
size_t ikv_respcache_lookup(ikv_respcache *rc, const char *tenant, const uint32_t *prompt,
                            size_t np, ikv_respcache_hit *hits, size_t max);

/* Records that candidate `id` was used as a draft and `accepted` of its tokens were accepted
 * (a hit for the eviction policy when accepted > 0). */
void ikv_respcache_used(ikv_respcache *rc, uint32_t id, size_t accepted);

typedef struct ikv_respcache_stats {
    uint64_t entries, capacity, puts, replaced, evictions, lookups, candidates, used_hits;
    uint64_t bytes, max_bytes; /* accounted bytes of the entries held; the bound (0: none) */
    uint64_t too_big;          /* puts refused: one entry above max_bytes alone */
} ikv_respcache_stats;

/* The fixed bytes one entry counts: its record (ids, scope, key, 64 MinHash values, params)
 * plus the cache core's node and hash slot. */
#define IKV_RESPCACHE_ENTRY_BYTES 768
void ikv_respcache_stats_get(const ikv_respcache *rc, ikv_respcache_stats *s);

/* Walks the invariants (every entry is a resident core block with its key, shingles sorted and
 * unique, sizes within bounds, counts add up). 1 if they hold, 0 with ikv_errdetail if not. */
int ikv_respcache_check(const ikv_respcache *rc);
void ikv_respcache_dump(const ikv_respcache *rc, FILE *f);

/* The exact Jaccard similarity of two prompts' n-gram shingle sets (for tools and the
 * threshold-only baseline in bench/). Allocates scratch; returns -1 on allocation failure. */
double ikv_respcache_jaccard(const uint32_t *a, size_t na, const uint32_t *b, size_t nb,
                             uint32_t ngram);

/* ---- generation with drafts (run, bench, tests; the server drives its own loop) ---------- */

typedef struct ikv_gen_options {
    size_t max_tokens;              /* tokens to generate at most */
    int stop_eos;                   /* stop at EOS too (always at BOS) */
    const ikv_respcache_hit *cands; /* response-cache candidates, best first (may be NULL) */
    size_t n_cands;
    uint32_t lookup_ngram; /* prompt-lookup drafts: n-gram length (0 = off) */
    uint32_t lookup_k;     /* ... draft tokens per verify */
    uint32_t lookup_min;   /* ... shortest match that drafts (0 = 1) */
    uint32_t max_draft;    /* the engine's max_draft */
    /* called with each burst of emitted tokens (accepted drafts come as one burst) */
    void (*emit)(void *ctx, const uint32_t *toks, size_t n);
    void *emit_ctx;
} ikv_gen_options;

typedef struct ikv_gen_result {
    size_t n_out;          /* tokens generated (at out + prompt length) */
    size_t forwards;       /* forward passes after the prefill (decode steps or verifies) */
    int cand_used;         /* index of the candidate verified, -1 if none */
    size_t cand_verified;  /* candidate drafts verified (0 or 1 per request) */
    size_t cache_accepted; /* candidate tokens accepted */
    size_t cache_rejected; /* candidate tokens proposed and not accepted */
    size_t lookup_drafted, lookup_accepted;
    double seconds; /* measured wall time of the generation (after the prefill) */
    double cpu_seconds; /* CPU time of the calling thread meanwhile (with one engine thread:
                           all of the generation's compute; unlike wall time, not inflated
                           while the thread waits for a CPU on a shared machine) */
} ikv_gen_result;

/* Generates after the prompt of s (prefilled, logits ready) with sampler sp: first, when
 * candidates are given, one verify of a candidate's output as a draft (greedy: the first
 * candidate whose first token is the argmax, so a useless draft costs nothing; sampling: the
 * best one), then decoding in which every step is ikv_engine_verify with the pending token as
 * its lead and a draft from the same candidate while the output still follows it, else from
 * prompt lookup when enabled, else none (a plain decode step). Greedy output is identical to
 * plain decoding (ikv_engine_verify's bits); sampled output has the model's distribution.
 * `hist` holds the prompt (np tokens) and gets the output after it (room np + max_tokens).
 * Returns 0 or an engine error. */
int ikv_respcache_generate(ikv_engine *e, ikv_seq *s, ikv_sampler *sp, const ikv_gen_options *o,
                           uint32_t *hist, size_t np, ikv_gen_result *r);

#ifdef __cplusplus
}
#endif
#endif
