/*
 * Chained 128-bit block keys (XXH3-128, libxxhash).
 *
 * key(i) = XXH3-128(seed; key(i-1) ‖ tokens(i) ‖ salt). The input is laid out in a stack
 * buffer when it fits (the common case: up to 1024 tokens per block) and streamed otherwise,
 * so hashing never allocates. Trace ids are hashed with a distinct domain tag so they can never
 * equal a token key except by a 128-bit collision.
 */
#include "isokv/base.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: hashing never allocates */
#include <xxhash.h>

#define KEY_STACK_TOKENS 1024
#define DOMAIN_TOKENS UINT64_C(0x746f6b656e730001) /* "tokens" */
#define DOMAIN_IDS UINT64_C(0x7472616365690002)    /* "tracei" */
#define DOMAIN_SCOPE UINT64_C(0x73636f7065000003)  /* "scope" */

static ikv_key from128(XXH128_hash_t h) {
    ikv_key k = {h.low64, h.high64};
    return k;
}

ikv_key ikv_key_chain(uint64_t seed, const ikv_key *parent, const uint32_t *tokens, size_t n,
                      uint64_t salt) {
    uint64_t head[3] = {parent ? parent->lo : DOMAIN_TOKENS, parent ? parent->hi : 0, salt};
    if (n <= KEY_STACK_TOKENS) {
        unsigned char buf[sizeof head + KEY_STACK_TOKENS * sizeof(uint32_t)];
        memcpy(buf, head, sizeof head);
        if (n) memcpy(buf + sizeof head, tokens, n * sizeof(uint32_t));
        return from128(XXH3_128bits_withSeed(buf, sizeof head + n * sizeof(uint32_t), seed));
    }
    XXH3_state_t st;
    XXH3_128bits_reset_withSeed(&st, seed);
    XXH3_128bits_update(&st, head, sizeof head);
    XXH3_128bits_update(&st, tokens, n * sizeof(uint32_t));
    return from128(XXH3_128bits_digest(&st));
}

size_t ikv_keys_of_tokens(uint64_t seed, const uint32_t *tokens, size_t n, size_t block_tokens,
                          uint64_t salt, int with_partial, ikv_key *out, size_t max) {
    if (block_tokens == 0) return 0;
    size_t nblocks = with_partial ? (n + block_tokens - 1) / block_tokens : n / block_tokens;
    ikv_key prev;
    for (size_t i = 0; i < nblocks && i < max; i++) {
        size_t len = n - i * block_tokens < block_tokens ? n - i * block_tokens : block_tokens;
        prev = ikv_key_chain(seed, i ? &prev : NULL, tokens + i * block_tokens, len, salt);
        out[i] = prev;
    }
    return nblocks;
}

uint64_t ikv_scope_salt(uint64_t seed, const char *tenant) {
    if (!tenant || !tenant[0]) return IKV_SCOPE_PUBLIC;
    uint64_t h = XXH3_64bits_withSeed(tenant, strlen(tenant), seed ^ DOMAIN_SCOPE);
    return h == IKV_SCOPE_PUBLIC ? h + 1 : h;
}

ikv_key ikv_key_from_id(uint64_t seed, uint64_t ns, uint64_t id) {
    uint64_t in[3] = {DOMAIN_IDS, ns, id};
    return from128(XXH3_128bits_withSeed(in, sizeof in, seed));
}
