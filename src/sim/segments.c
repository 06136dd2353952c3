/*
 * Structured prompts to block keys (the core of the segments trace format, docs/segments.md).
 *
 * A request is an ordered list of segments. Each segment's tokens are a pure function of its
 * identity, so the same document or memory item gives the same tokens in every request:
 *
 *     identity = XXH3-64(seed SEG_ID_SEED; kind ‖ 0 ‖ id ‖ 0 ‖ tenant-or-"")
 *     token[j] = splitmix64(identity + (j + 1) * GOLDEN) mod IKV_SEG_VOCAB   (counter mode)
 *
 * The request's tokens are cut into blocks of B tokens over the concatenation:
 *
 *     | system (pub) | tool (pub) | memory ... | doc d7 ... | history | query |
 *     |--B--|--B--|--B--|--B--|--B--|--B--|--B--|--B--|--B--|--B--|--B--|--B--|-p-|
 *      public blocks  ^ straddles: private               ^^^^^ chunk of d7 (whole blocks only)
 *
 * Block i is keyed under IKV_SCOPE_PUBLIC when all its tokens lie in the leading run of public
 * segments, and under the tenant's salt otherwise; the keys chain through the scope change, so
 * a private block still names the public prefix before it. A public segment after a private one
 * is keyed privately (its position depends on private content).
 *
 * Chunks (for chunk reuse): a `doc` segment's doc_keys are the keys of the document's own tokens
 * cut from the document's start (so they do not depend on where the document sits), under the
 * public scope for a public document and the tenant's otherwise. A chunk lists the request
 * blocks wholly inside the document; there are at most floor(doc tokens / B) of them, and
 * doc_keys holds that many of the document's own keys.
 *
 * Cost: one splitmix per token and one XXH3-128 per block (plus one per doc block). The builder
 * keeps its buffers between requests, so it allocates only when a request is the largest yet.
 */
#include "isokv/gen.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: never allocates */
#include <xxhash.h>

#define SEG_ID_SEED UINT64_C(0x69736f6b76736567) /* "isokvseg" */
#define GOLDEN      UINT64_C(0x9E3779B97F4A7C15)

static const char *const kind_names[IKV_SEG_KIND_COUNT] = {"system", "tool",    "memory",
                                                           "doc",    "history", "query"};

const char *ikv_seg_kind_name(ikv_seg_kind k) {
    return (unsigned)k < IKV_SEG_KIND_COUNT ? kind_names[k] : NULL;
}

int ikv_seg_kind_parse(const char *name, ikv_seg_kind *out) {
    for (int k = 0; k < IKV_SEG_KIND_COUNT; k++)
        if (name && !strcmp(name, kind_names[k])) {
            *out = (ikv_seg_kind)k;
            return 0;
        }
    return IKV_EINVAL;
}

uint64_t ikv_seg_identity(ikv_seg_kind kind, const char *id, const char *tenant, int is_public) {
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, SEG_ID_SEED);
    const char *kn = ikv_seg_kind_name(kind);
    if (!kn) kn = "";
    if (!id) id = "";
    if (is_public || !tenant) tenant = "";
    static const char zero = 0;
    XXH3_64bits_update(&st, kn, strlen(kn));
    XXH3_64bits_update(&st, &zero, 1);
    XXH3_64bits_update(&st, id, strlen(id));
    XXH3_64bits_update(&st, &zero, 1);
    XXH3_64bits_update(&st, tenant, strlen(tenant));
    return XXH3_64bits_digest(&st);
}

static inline uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

void ikv_seg_tokens(uint64_t identity, uint32_t *out, size_t n) {
    for (size_t j = 0; j < n; j++)
        out[j] = (uint32_t)(splitmix64(identity + (uint64_t)(j + 1) * GOLDEN) % IKV_SEG_VOCAB);
}

struct ikv_seg_builder {
    uint64_t seed;
    uint32_t block_tokens;
    uint32_t *tok; /* (input_tokens) concatenated tokens of the last build */
    size_t tok_cap;
    ikv_key *keys; /* (n_blocks) */
    size_t key_cap;
    uint32_t *ntok; /* (n_blocks) */
    size_t ntok_cap;
    ikv_chunk *chunks; /* (n_chunks) */
    size_t chunk_cap;
    ikv_key *doc_keys; /* (sum of chunk counts), chunks point into it */
    size_t dk_cap;
};

int ikv_seg_builder_create(uint64_t seed, uint32_t block_tokens, ikv_seg_builder **out) {
    if (!block_tokens || !out) return ikv_error(IKV_EINVAL, "segments: block size must be > 0");
    ikv_seg_builder *b = ikv_calloc(1, sizeof *b);
    if (!b) return IKV_ENOMEM;
    b->seed = seed;
    b->block_tokens = block_tokens;
    *out = b;
    return 0;
}

void ikv_seg_builder_destroy(ikv_seg_builder *b) {
    if (!b) return;
    ikv_free(b->tok);
    ikv_free(b->keys);
    ikv_free(b->ntok);
    ikv_free(b->chunks);
    ikv_free(b->doc_keys);
    ikv_free(b);
}

const uint32_t *ikv_seg_builder_tokens(const ikv_seg_builder *b) {
    return b->tok;
}

/* Grows *p (elements of `size` bytes, capacity *cap) to hold at least `need`. On failure the
 * old buffer is kept. */
static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = ikv_realloc(*p, n * size);
    if (!q) return IKV_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

int ikv_seg_build(ikv_seg_builder *b, const char *tenant, const ikv_segment *segs, size_t n,
                  ikv_trace_request *req) {
    if (!n) return ikv_error(IKV_EINVAL, "segments: a request needs at least one segment");
    if (!tenant || !tenant[0]) return ikv_error(IKV_EINVAL, "segments: empty tenant");
    const size_t B = b->block_tokens;
    size_t total = 0, pub_end = 0, n_docs = 0, dk_need = 0;
    int leading = 1;
    for (size_t i = 0; i < n; i++) {
        if (!ikv_seg_kind_name(segs[i].kind))
            return ikv_error(IKV_EINVAL, "segments: segment %zu has a bad kind", i);
        if (!segs[i].tokens)
            return ikv_error(IKV_EINVAL, "segments: segment %zu has zero tokens", i);
        if (segs[i].tokens > IKV_SEG_MAX_TOKENS || total + segs[i].tokens > IKV_SEG_MAX_TOKENS)
            return ikv_error(IKV_ETOOLONG, "segments: request longer than %u tokens",
                             IKV_SEG_MAX_TOKENS);
        total += segs[i].tokens;
        if (leading && segs[i].is_public)
            pub_end = total;
        else
            leading = 0;
        if (segs[i].kind == IKV_SEG_DOC && segs[i].tokens >= B) {
            n_docs++;
            dk_need += segs[i].tokens / B;
        }
    }
    size_t nblocks = (total + B - 1) / B;
    if (grow((void **)&b->tok, &b->tok_cap, total, sizeof *b->tok) ||
        grow((void **)&b->keys, &b->key_cap, nblocks, sizeof *b->keys) ||
        grow((void **)&b->ntok, &b->ntok_cap, nblocks, sizeof *b->ntok) ||
        grow((void **)&b->chunks, &b->chunk_cap, n_docs, sizeof *b->chunks) ||
        grow((void **)&b->doc_keys, &b->dk_cap, dk_need, sizeof *b->doc_keys))
        return IKV_ENOMEM;

    uint64_t salt = ikv_scope_salt(b->seed, tenant);
    size_t off = 0, n_chunks = 0, dk = 0;
    for (size_t i = 0; i < n; i++) {
        const ikv_segment *s = &segs[i];
        uint64_t id = ikv_seg_identity(s->kind, s->id, tenant, s->is_public);
        ikv_seg_tokens(id, b->tok + off, s->tokens);
        if (s->kind == IKV_SEG_DOC && s->tokens >= B) {
            size_t first = (off + B - 1) / B, end = (off + s->tokens) / B;
            size_t count = end > first ? end - first : 0;
            if (count) {
                uint64_t dsalt = s->is_public ? IKV_SCOPE_PUBLIC : salt;
                ikv_keys_of_tokens(b->seed, b->tok + off, s->tokens, B, dsalt, 0, b->doc_keys + dk,
                                   count);
                ikv_chunk *c = &b->chunks[n_chunks++];
                c->first = first;
                c->count = count;
                c->doc_keys = b->doc_keys + dk;
                c->tokens = s->tokens;
                dk += count;
            }
        }
        off += s->tokens;
    }
    size_t n_pub = 0;
    for (size_t i = 0; i < nblocks; i++) {
        size_t start = i * B, len = total - start < B ? total - start : B;
        int pub = start + len <= pub_end;
        if (pub) n_pub++;
        b->keys[i] = ikv_key_chain(b->seed, i ? &b->keys[i - 1] : NULL, b->tok + start, len,
                                   pub ? IKV_SCOPE_PUBLIC : salt);
        b->ntok[i] = (uint32_t)len;
    }
    req->input_tokens = (uint32_t)total;
    req->n_blocks = nblocks;
    req->keys = b->keys;
    req->ntokens = b->ntok;
    req->n_chunks = n_chunks;
    req->chunks = b->chunks;
    req->n_public_blocks = n_pub;
    return 0;
}
