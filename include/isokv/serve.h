/*
 * isokv serve: an OpenAI-compatible HTTP server over the engine (model.h), whose KV cache is
 * the isokv core. libmicrohttpd threads parse requests and stream answers; one scheduler thread
 * owns the engine and runs continuous batching: every step serves every running sequence (the
 * decode rows of all of them through the weights as one batched product, plus prefill chunks
 * under a token budget), admitting queued requests when their KV blocks fit.
 *
 *   POST /v1/completions        prompt: string | [string] | [int] (token ids) | [[int]]
 *   POST /v1/chat/completions   messages: system / user / assistant (template: docs/serve.md)
 *   GET  /v1/models   GET /health   GET /metrics (Prometheus text)
 *
 * Tenants: --api-keys maps Bearer keys to tenants (unknown key: 401); a request's cache_salt
 * further separates its private blocks; declared public text (--public-prefix, --public-system,
 * "isokv": {"public_prefix_tokens": N}) is shared across tenants. docs/serve.md is the manual.
 */
#ifndef ISOKV_SERVE_H
#define ISOKV_SERVE_H

#include "isokv/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ikv_serve ikv_serve;
struct ikv_model;
struct ikv_engine_options;

typedef struct ikv_serve_options {
    const char *model;         /* llama2.c checkpoint (data/models/stories260K/stories260K.bin) */
    const char *tokenizer;     /* llama2.c tokenizer.bin; NULL = byte-level */
    const char *host;          /* IPv4 address to bind ("127.0.0.1") */
    uint16_t port;             /* 0 = any free port (ikv_serve_port says which) */
    int threads;               /* engine forward threads (1) */
    uint64_t kv_mem;           /* KV pool bytes (0 = room for max_seqs full sequences + 4) */
    uint32_t block_tokens;     /* tokens per KV block (0 = the engine's 16) */
    const char *policy;        /* eviction policy ("lru") */
    const char *api_keys;      /* JSON file {"KEY": "tenant", ...}; NULL = everyone is "default" */
    uint32_t max_seqs;         /* sequences running at once (32) */
    uint32_t max_batch_tokens; /* positions per forward step: decode rows + prefill chunks (256) */
    uint32_t max_queue;        /* requests waiting for admission before 429 (4 x max_seqs) */
    const char *public_prefix; /* file whose text, when a prompt starts with it, is public */
    int public_system;         /* 1: a chat request's system messages are public */
    size_t max_body;           /* request body bytes before 413 (1 MiB) */
    /* Lower storage tiers (docs/store.md): called once, after the model is loaded and before
     * the engine is created, to open the stores and fill eo->tiers[], n_tiers, tier_dtype and
     * tokenizer_fp. Returns 0 or an IKV_E* code (the stores stay the caller's: close them after
     * ikv_serve_destroy). NULL: no lower tier. `isokv serve --tier` passes cli_tiers_open. */
    int (*open_tiers)(void *ctx, const struct ikv_model *m, struct ikv_engine_options *eo);
    void *tiers_ctx;
    /* Routing by request class (docs/serve.md, "Routing"): the planner's walk (docs/planner.md)
     * for route_model on route_hw (catalog names; "llama3-70b", "h100"), with the parameters of
     * route_config (a plan JSON file; NULL = defaults) and then route_set[] ("key=value", as
     * `isokv plan --set`): route.simple/medium/complex are the class caps, price.* the prices. */
    const char *route_config, *route_model, *route_hw;
    const char *const *route_set;
    size_t n_route_set;
    int route_frontier; /* 1: route on the efficient frontier of each class's levers
                           (ikv_plan_route_frontier, as `isokv plan route --frontier`) instead
                           of the seven-step walk */
    FILE *log;               /* one line per request (stderr) */
    uint32_t semantic_cache; /* response-cache entries (--semantic-cache[=SIZE]; 0 = off): a
                                finished response is kept and the most similar one of the same
                                tenant (or public) is verified as a draft for a new request */
    uint64_t semantic_cache_bytes; /* and at most these bytes of entries (0 = no byte bound;
                                      --semantic-cache=64M): ikv_respcache_options.max_bytes */
    /* --spec lookup[:n=N,k=K,m=M]: prompt-lookup drafts (K tokens after the latest match of
     * the last N..M tokens) for every request routed to step >= 3 (spec_k = 0: off; a request
     * may switch it with "isokv": {"spec": "lookup" | "off"}, which uses 3, 1, 2 here) */
    uint32_t spec_ngram, spec_k, spec_min;
} ikv_serve_options;

void ikv_serve_options_default(ikv_serve_options *o);

/* Loads the model and tokenizer, creates the engine, binds the socket and starts the HTTP and
 * scheduler threads. Returns 0 and *out, or IKV_EIO / IKV_EFORMAT / IKV_ETRUNC (model,
 * tokenizer, key or prefix file), IKV_EINVAL (options, an address that cannot be bound),
 * IKV_ENOMEM; ikv_errdetail() names the problem. */
int ikv_serve_create(const ikv_serve_options *o, ikv_serve **out);
/* The bound port. */
uint16_t ikv_serve_port(const ikv_serve *s);
/* A one-line description: model, shape, cache configuration (static until destroy). */
const char *ikv_serve_describe(const ikv_serve *s);
/* Stops accepting requests (they get 503) and waits until the running and queued ones have
 * finished or `seconds` have passed. Returns the number of requests still unfinished. */
size_t ikv_serve_drain(ikv_serve *s, double seconds);
/* Stops the threads (unfinished requests are cancelled) and frees everything. Takes NULL. */
void ikv_serve_destroy(ikv_serve *s);

#ifdef __cplusplus
}
#endif
#endif
