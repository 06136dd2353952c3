/*
 * Trace blocks -> token ids, deterministically.
 *
 * A trace gives a request as a chain of 128-bit block keys (src/sim: Mooncake and WEKA ids are
 * prefix ids mapped by ikv_key_from_id, segments keys are chained over tokens and scope). A key
 * already names the whole prefix its block ends, so the tokens of block i are a pure function
 * of (seed, keys[i], position in the block):
 *
 *     token(i, j) = first + mix(seed, keys[i], j) mod (vocab - first)
 *
 *     keys:    k0        k1        k2'          (request A: k0 k1 k2, request B: k0 k1 k2')
 *     tokens:  t(k0)...  t(k1)...  t(k2')...    -> A and B share exactly 2 blocks of tokens
 *
 * Equal key prefixes give equal token prefixes, and two requests diverge at the first block
 * whose keys differ (by the first token, with probability 1 - 1/(vocab - first), and over a
 * block of B/K tokens with probability 1 - (vocab - first)^-(B/K)). A server that hashes token
 * blocks of B/K tokens therefore sees the trace's block structure, and its prefix hits equal
 * the simulator's block matches.
 *
 * Scaling: a trace block of B tokens becomes B/K tokens (K must divide B, so the server's
 * blocks line up with the trace's), a partial block of n tokens floor(n/K); the input beyond
 * the hashed blocks (WEKA hashes only whole blocks) becomes floor(rest/K) tokens drawn from the
 * request's own index, so they never hit, as in the simulator.
 *
 * Cost: O(tokens) per request, no allocation once the buffer is large enough.
 */
#include "isokv/load.h"

#include <math.h>
#include <string.h>

void ikv_load_map_default(ikv_load_map *m) {
    memset(m, 0, sizeof *m);
    m->vocab = 512;
    m->first_token = 3;
    m->scale = 1;
    m->seed = 0;
    m->out_scale = 1.0;
    m->max_output = 0;
}

/* splitmix64's finaliser: a bijective 64-bit mixer. */
static uint64_t mix64(uint64_t x) {
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static uint32_t token_of(const ikv_load_map *m, uint64_t a, uint64_t b, uint32_t j) {
    uint64_t h = mix64(a ^ mix64(b ^ mix64(m->seed ^ ((uint64_t)j << 32 | j))));
    return m->first_token + (uint32_t)(h % (uint64_t)(m->vocab - m->first_token));
}

static int grow(ikv_load_prompt_buf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    uint32_t *p = ikv_realloc(b->tokens, cap * sizeof *p);
    if (!p) return ikv_error(IKV_ENOMEM, "prompt of %zu tokens", need);
    b->tokens = p;
    b->cap = cap;
    return 0;
}

int ikv_load_prompt(const ikv_load_map *m, const ikv_trace_request *q, uint32_t block_tokens,
                    ikv_load_prompt_buf *buf) {
    if (!m->scale || m->vocab <= m->first_token + 1)
        return ikv_error(IKV_EINVAL, "token map: scale %u, vocab %u, first token %u", m->scale,
                         m->vocab, m->first_token);
    if (!block_tokens || block_tokens % m->scale)
        return ikv_error(IKV_EINVAL, "--scale %u does not divide the trace's %u-token blocks",
                         m->scale, block_tokens);
    uint32_t bs = block_tokens / m->scale;
    uint64_t in_blocks = 0;
    size_t need = 0;
    for (size_t i = 0; i < q->n_blocks; i++) {
        uint32_t nt = q->ntokens ? q->ntokens[i] : block_tokens;
        in_blocks += nt;
        need += nt >= block_tokens ? bs : nt / m->scale;
    }
    uint64_t rest = q->input_tokens > in_blocks ? q->input_tokens - in_blocks : 0;
    size_t tail = (size_t)(rest / m->scale);
    need += tail;
    int rc = grow(buf, need ? need : 1);
    if (rc) return rc;
    size_t n = 0;
    uint32_t full = 0;
    for (size_t i = 0; i < q->n_blocks; i++) {
        uint32_t nt = q->ntokens ? q->ntokens[i] : block_tokens;
        uint32_t k = nt >= block_tokens ? bs : nt / m->scale;
        if (k == bs && full == i) full++;
        for (uint32_t j = 0; j < k; j++)
            buf->tokens[n++] = token_of(m, q->keys[i].lo, q->keys[i].hi, j);
    }
    /* the tail: drawn from the request's index under a domain of its own ("tail") */
    for (size_t j = 0; j < tail; j++)
        buf->tokens[n++] = token_of(m, q->index ^ UINT64_C(0x7461696c00000000),
                                    UINT64_C(0x5a5a5a5a5a5a5a5a), (uint32_t)j);
    IKV_ASSERT(n == need);
    buf->n = n;
    buf->block_tokens = bs;
    buf->full_blocks = full;
    uint64_t pub = (uint64_t)q->n_public_blocks * bs;
    buf->public_tokens = (uint32_t)(pub < n ? pub : n);
    double out = floor((double)q->output_tokens / m->scale * m->out_scale + 0.5);
    if (out < 1) out = 1;
    if (m->max_output && out > m->max_output) out = m->max_output;
    if (out > 1e9) out = 1e9;
    buf->max_tokens = (uint32_t)out;
    return 0;
}

void ikv_load_prompt_free(ikv_load_prompt_buf *buf) {
    if (!buf) return;
    ikv_free(buf->tokens);
    memset(buf, 0, sizeof *buf);
}
