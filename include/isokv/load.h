/*
 * isokv load: replays a trace (the simulator's readers) against any OpenAI-compatible server
 * and measures what the simulator predicts: token hit ratio from the server's own usage, TTFT,
 * latency and errors.
 *
 *   trace --ikv_trace_next--> ikv_trace_request --ikv_load_prompt--> tokens --HTTP/SSE--> record
 *   (src/sim readers)         block keys           (this module)    libcurl multi     (CSV/JSON)
 *
 * Pieces (one file each under src/load/):
 *   prompt.c  block keys -> token ids. A block's tokens are a pure function of its 128-bit key
 *             (which already names the whole prefix the block ends), so equal prefixes give
 *             equal token prefixes and different ids diverge at their block; `scale` K maps a
 *             trace block of B tokens to B/K tokens.
 *   sse.c     an incremental server-sent-events parser and the OpenAI chunk reader (text,
 *             usage, cached tokens from OpenAI/vLLM, llama.cpp or isokv fields).
 *   run.c     the driver: one thread, libcurl's multi interface, open loop at trace times or
 *             closed loop, per-request timeouts; it never waits on a server without a bound.
 *   report.c  percentiles, requests.csv, summary.json, sweep tables and gnuplot plots, every
 *             file written under a temporary name and renamed, never over a non-regular file.
 *
 * Library code never prints: the CLI (src/cli/cmd_load.c) does.
 */
#ifndef ISOKV_LOAD_H
#define ISOKV_LOAD_H

#include "isokv/base.h"
#include "isokv/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- block keys -> token ids (prompt.c) ----------------------------------------------------- */

/* How trace blocks become tokens (caller-owned). */
typedef struct ikv_load_map {
    uint32_t vocab;       /* the target model's vocabulary size (default 512: stories260K) */
    uint32_t first_token; /* lowest id used (default 3: skips <unk>, BOS, EOS of llama vocabs) */
    uint32_t scale;       /* K >= 1: a block of B trace tokens becomes B/K tokens */
    uint64_t seed;        /* token seed: different seeds give disjoint token streams */
    double out_scale;     /* max_tokens = max(1, round(output / K * out_scale)) (default 1) */
    uint32_t max_output;  /* cap on max_tokens (0 = none) */
} ikv_load_map;

void ikv_load_map_default(ikv_load_map *m);

/* A request as it is sent: owned by the caller (ikv_load_prompt fills it and grows tokens). */
typedef struct ikv_load_prompt_buf {
    uint32_t *tokens; /* (n) token ids */
    size_t n, cap;
    uint32_t block_tokens;  /* scaled block size B/K (the server's KV block should equal it) */
    uint32_t full_blocks;   /* leading whole scaled blocks (the tokens a server can cache) */
    uint32_t public_tokens; /* leading tokens declared public (segments) */
    uint32_t max_tokens;
} ikv_load_prompt_buf;

/* Builds the token prompt of q, a request of a trace whose blocks hold block_tokens tokens.
 * Block i contributes ntokens[i]/K tokens (block_tokens/K for a full one), derived from q->keys[i];
 * tokens of the input beyond its blocks (WEKA hashes only whole blocks) become round(rest/K)
 * tokens unique to the request, so they never hit. Returns 0, IKV_EINVAL (block_tokens not a
 * multiple of K, or a bad map) or IKV_ENOMEM (buf left valid). Allocates only to grow buf. */
int ikv_load_prompt(const ikv_load_map *m, const ikv_trace_request *q, uint32_t block_tokens,
                    ikv_load_prompt_buf *buf);
void ikv_load_prompt_free(ikv_load_prompt_buf *buf);

/* ---- SSE and OpenAI chunks (sse.c) ----------------------------------------------------------- */

/* Where a response's cached-token count came from. */
typedef enum ikv_cached_src {
    IKV_CACHED_NONE = 0,    /* the server reported no cached-token field */
    IKV_CACHED_OPENAI,      /* usage.prompt_tokens_details.cached_tokens (OpenAI, vLLM, isokv) */
    IKV_CACHED_LLAMACPP,    /* timings.cache_n (llama.cpp's llama-server) */
    IKV_CACHED_VLLM_LEGACY, /* usage.num_cached_tokens (older vLLM) */
    IKV_CACHED_LLAMACPP_PROMPT_N, /* usage.prompt_tokens - timings.prompt_n (llama.cpp builds
                                     without cache_n: the prompt tokens it did not evaluate) */
} ikv_cached_src;

const char *ikv_cached_src_name(ikv_cached_src s);

/* What one response said (filled as its SSE events arrive). */
typedef struct ikv_load_reply {
    int events;                /* data events parsed as JSON */
    int done;                  /* "data: [DONE]" seen */
    int streamed;              /* the body was SSE (0: one plain JSON object) */
    int first_token_seen;      /* a chunk with non-empty choices[].text / delta.content */
    double first_token_time;   /* ikv_now() when it arrived */
    int64_t prompt_tokens;     /* usage.prompt_tokens (-1 = absent) */
    int64_t completion_tokens; /* usage.completion_tokens (-1 = absent) */
    int64_t cached_tokens;     /* see cached_src (-1 = absent) */
    ikv_cached_src cached_src;
    double queue_s;      /* usage.isokv.queue_ms / 1000: isokv serve's wait for admission
                            (-1 = absent) */
    int64_t text_chunks; /* chunks that carried text */
    char error[160];     /* "": fine; else what was wrong with the body */
} ikv_load_reply;

/* An incremental SSE parser (WHATWG event-stream rules: "data:" lines joined by '\n', an event
 * ends at a blank line, ':' comments and other fields ignored, CR, LF or CRLF line ends). It
 * buffers at most max_event bytes of one event; a longer one is an error. */
typedef struct ikv_sse ikv_sse;

/* Called once per complete event with its data (NUL-terminated, len bytes). Return non-zero to
 * stop parsing (ikv_sse_feed then returns that value). */
typedef int (*ikv_sse_event_fn)(void *ctx, const char *data, size_t len);

int ikv_sse_create(size_t max_event, ikv_sse_event_fn fn, void *ctx, ikv_sse **out);
/* Feeds n bytes. Returns 0, the callback's non-zero value, or IKV_ETOOLONG (an event or line
 * over max_event). Allocates only when the event buffer grows (up to max_event). */
int ikv_sse_feed(ikv_sse *s, const char *p, size_t n);
/* End of stream: dispatches a last event that had no blank line after it. */
int ikv_sse_finish(ikv_sse *s);
/* Bytes fed so far; whether any "data:" field was seen (tells SSE from plain JSON bodies). */
uint64_t ikv_sse_bytes(const ikv_sse *s);
int ikv_sse_saw_data(const ikv_sse *s);
void ikv_sse_destroy(ikv_sse *s);
/* Invariant walker: 1 when the parser's buffer bounds hold (data <= line end < capacity <=
 * max_event + 1, no event data without a data field), else 0. For tests and IKV_ASSERT. */
int ikv_sse_check(const ikv_sse *s);

/* Reads one event's data (an OpenAI completion chunk, or "[DONE]") into r at time now.
 * Returns 0, or IKV_EFORMAT when the data is neither (r->error says why). */
int ikv_load_reply_chunk(ikv_load_reply *r, const char *data, size_t len, double now);
void ikv_load_reply_init(ikv_load_reply *r);

/* ---- the driver (run.c) ---------------------------------------------------------------------- */

typedef enum ikv_tenant_mode {
    IKV_TENANT_SALT = 0, /* tenant i sends "cache_salt": "PREFIX<i>" */
    IKV_TENANT_KEY,      /* tenant i sends "Authorization: Bearer PREFIX<i>" */
    IKV_TENANT_NONE,     /* tenants are not told to the server */
} ikv_tenant_mode;

typedef struct ikv_load_opts {
    const char *url;     /* base, e.g. http://127.0.0.1:8000 (/v1/completions appended) */
    const char *model;   /* "model" field (NULL: omitted) */
    const char *api_key; /* Authorization for every request (tenant mode salt/none) */
    ikv_tenant_mode tenant_mode;
    const char *tenant_prefix; /* default "tenant-" */
    int closed_loop;           /* 1: next request of a session when its previous ends */
    uint32_t concurrency;      /* closed loop: requests in flight (default 1); open loop: a cap
                                  (0 = none) */
    double rate;               /* open loop: time multiplier (2 = twice as fast; default 1) */
    double duration;           /* stop sending after this many seconds (0 = no limit) */
    double timeout;            /* per request, seconds (default 60) */
    double connect_timeout;    /* seconds (default 5) */
    int ignore_eos;            /* send "ignore_eos": true (vLLM, llama.cpp) */
    int send_public;       /* send "isokv": {"public_prefix_tokens": N} when N > 0 (default 1) */
    int include_usage;     /* stream_options.include_usage (default 1) */
    uint32_t max_tenants;  /* keep only requests of tenants 0..N-1 (0 = all; segments) */
    uint32_t max_inflight; /* open loop: at most this many in flight (default 256) */
    uint32_t max_context;  /* skip (IKV_LOAD_TOO_LONG) requests whose prompt + max_tokens
                              exceed this (0 = send everything) */
    ikv_load_map map;
    void (*progress)(void *ctx, uint64_t done, uint64_t total); /* may be NULL */
    void *progress_ctx;
} ikv_load_opts;

void ikv_load_opts_default(ikv_load_opts *o);

/* Error classes of a request that did not end in a complete 2xx stream. */
typedef enum ikv_load_err {
    IKV_LOAD_OK = 0,
    IKV_LOAD_HTTP,      /* a non-2xx status (see status) */
    IKV_LOAD_CONNECT,   /* connection refused / unreachable / DNS */
    IKV_LOAD_TIMEOUT,   /* per-request timeout */
    IKV_LOAD_BAD_REPLY, /* 2xx but not an OpenAI completion stream */
    IKV_LOAD_TRANSPORT, /* any other transfer error (reset, partial body) */
    IKV_LOAD_NOT_SENT,  /* --duration ran out before it was sent */
    IKV_LOAD_TOO_LONG,  /* prompt + max_tokens over max_context: not sent */
    IKV_LOAD_N_ERR
} ikv_load_err;

const char *ikv_load_err_name(ikv_load_err e);

/* One request: what was sent and what came back. Times are measured seconds from the start. */
typedef struct ikv_load_record {
    uint64_t index;      /* order in the trace */
    uint64_t sent_order; /* order in which it was sent (UINT64_MAX: not sent) */
    uint64_t session;    /* conversation/session id (0: none) */
    uint32_t tenant;
    double trace_time;             /* seconds, from the trace */
    double send, first_token, end; /* measured; first_token < 0 when none came */
    uint32_t prompt_tokens;        /* sent */
    uint32_t full_blocks, block_tokens, public_tokens, max_tokens;
    int64_t server_prompt_tokens, cached_tokens, completion_tokens; /* -1 = not reported */
    ikv_cached_src cached_src;
    double server_queue; /* seconds the server said it waited before admitting it (-1: none) */
    long status;         /* HTTP status (0: none) */
    ikv_load_err err;
    char detail[200]; /* error detail ("" when fine) */
    /* the trace request (owned by the result): its block keys, kept to build the prompt when
       it is sent and to write the sent-order trace */
    ikv_key *keys;
    uint32_t n_keys, last_ntokens; /* blocks; trace tokens of the last block */
    uint32_t input_tokens, output_tokens, n_public_blocks; /* trace units */
} ikv_load_record;

/* What a run measured (ikv_load_result_free releases records). */
typedef struct ikv_load_result {
    ikv_load_record *records; /* (n) in trace order */
    size_t n;
    uint64_t sent, ok, errors_by[IKV_LOAD_N_ERR];
    uint64_t prompt_tokens, cached_tokens, reported; /* over ok requests that reported cached */
    uint64_t completion_tokens;
    ikv_cached_src cached_src; /* the field the server used (first seen) */
    double token_hit_ratio;    /* cached_tokens / prompt_tokens over requests that reported */
    double ttft_p50, ttft_p90, ttft_p99, ttft_mean; /* seconds, ok requests */
    double lat_p50, lat_p90, lat_p99, lat_mean;
    double wall; /* seconds from the first send to the last end */
    double req_per_s, out_tok_per_s, prompt_tok_per_s;
    uint32_t block_tokens; /* scaled block size */
    uint32_t trace_block_tokens;
} ikv_load_result;

/* Reads every request of t (from its current position), maps it to tokens and replays it
 * against o->url. Fills *r (trace order). Returns 0 when the run was carried out, whatever the
 * server answered (failures are counted in r), or a negative error for bad options, an empty
 * or unreadable trace, or out of memory. Never waits longer than o->timeout per request. */
int ikv_load_run(ikv_trace *t, const ikv_load_opts *o, ikv_load_result *r);
void ikv_load_result_free(ikv_load_result *r);

/* The requests of r that completed (IKV_LOAD_OK; a refused request never reached the server's
 * cache), in the order they were sent, as an isokv segments trace (block_tokens = the sent
 * block size B) that `isokv sim --mode order` replays with exactly the blocks a server caches:
 * one segment of B tokens per full block of the request, its id dense over the distinct block
 * keys (a key names its prefix), public for the blocks wholly inside the declared public
 * tokens, the request's tenant and session kept; partial blocks and tails are left out (a
 * server caches whole blocks only), so the simulator's hit_tokens compare with the server's
 * cached tokens (its input_tokens lack the tails). Owned by the caller (ikv_free); NULL with
 * IKV_ENOMEM in the detail. */
char *ikv_load_sent_trace(const ikv_load_result *r);

/* ---- reports (report.c) ---------------------------------------------------------------------- */

/* Percentile p (0..100) of v[0..n) by linear interpolation between order statistics; sorts v.
 * 0 when n == 0. */
double ikv_load_percentile(double *v, size_t n, double p);

/* Fills the aggregate fields of r from r->records. */
void ikv_load_summarize(ikv_load_result *r);

/* Writes text to path atomically: a temporary file in the same directory, renamed over path.
 * Refuses a path that exists and is not a regular file (IKV_EINVAL). IKV_EIO on failure, with
 * the path in the detail; nothing is left under the final name then. */
int ikv_load_write_atomic(const char *path, const char *text, size_t len);

/* requests.csv and summary.json texts (owned by the caller: ikv_free). NULL on no memory.
 * extra_json, when not NULL, is a JSON object whose members are added to the summary. */
char *ikv_load_requests_csv(const ikv_load_result *r);
char *ikv_load_summary_json(const ikv_load_result *r, const ikv_load_opts *o, const char *trace,
                            const char *extra_json);

#ifdef __cplusplus
}
#endif
#endif
