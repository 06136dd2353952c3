/*
 * isokv sim: trace readers, the synthetic multi-user generator, and replay through the cache
 * core (the same core the engine uses; see ../../shared/DESIGN.md §3).
 *
 * Data flow:
 *
 *     trace file (.jsonl / .jsonl.gz) --ikv_trace_next()--> ikv_trace_request --replay--> metrics
 *         mooncake | weka | segments                         keys, times            (JSON / table)
 *
 * A reader turns each record into an ikv_trace_request whose block keys are already 128-bit keys in
 * the cache's key space: Mooncake ids are global prefix ids (namespace 0), WEKA ids are local to
 * their conversation (namespace = conversation index + 1), segment traces are cut into blocks
 * and chained with the tenant's scope salt (public segments under IKV_SCOPE_PUBLIC).
 *
 * Ownership: an ikv_trace_request and the arrays it points to belong to the reader and stay valid
 * until the next ikv_trace_next() or ikv_trace_close() on it.
 */
#ifndef ISOKV_SIM_H
#define ISOKV_SIM_H

#include "isokv/base.h"
#include "isokv/cache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ikv_trace_format {
    IKV_TRACE_AUTO = 0, /* detect from the first record */
    IKV_TRACE_MOONCAKE,
    IKV_TRACE_WEKA,
    IKV_TRACE_SEGMENTS,
    IKV_TRACE_ORACLE, /* libCacheSim oracleGeneral binary, one block per request (never detected) */
} ikv_trace_format;

/* A run of blocks that came from one `doc` segment (segments format only): chunk reuse lets
 * them hit at any position, keyed by the document alone (doc_keys, chained over the document's
 * own tokens under the document's scope). */
typedef struct ikv_chunk {
    size_t first;          /* index of the first block of the request that the doc covers */
    size_t count;          /* blocks of the request fully inside the doc */
    const ikv_key *doc_keys; /* count position-independent keys */
    uint32_t tokens;       /* tokens of the doc segment */
} ikv_chunk;

typedef struct ikv_trace_request {
    double time;              /* arrival, seconds from the trace's start */
    uint64_t index;           /* 0-based order in the replay */
    uint32_t tenant;          /* dense tenant index (segments), conversation (weka), 0 otherwise */
    uint64_t session;         /* session id for soft-pin scope counting; 0 = unknown */
    uint32_t input_tokens;
    uint32_t output_tokens;
    size_t n_blocks;
    const ikv_key *keys;      /* n_blocks chain keys */
    const uint32_t *ntokens;  /* tokens per block (the last may be partial) */
    size_t n_chunks;
    const ikv_chunk *chunks;
    size_t n_public_blocks;   /* leading blocks that are public (pinnable shared prefix) */
    /* Measured service (segments "ttft_s" and "latency_s": what a live server took, as
     * `isokv load` writes them to sent.jsonl): seconds after `time` to the first token and to
     * the end. has_service = 0 when the record has none. */
    int has_service;
    double service_ttft, service_latency;
    double service_queue;     /* "queue_s" (optional, <= ttft_s): the server's wait before it
                                 admitted the request (looked its prefix up); 0 if absent */
    int hint;                 /* ikv_hint (cache.h) from how its response ended: weka "stop"
                                 "tool_use" -> SOON, "end_turn" -> TURN; 0 = unknown */
} ikv_trace_request;

typedef struct ikv_trace_opts {
    ikv_trace_format format;
    int strict;               /* a malformed line is fatal (default: skip and count it) */
    uint64_t seed;            /* key seed */
    uint64_t conversations;   /* weka: take the first N conversations (0 = all) */
    double window;            /* weka: conversation i starts at i*window/N seconds (def. 3600) */
    uint64_t max_requests;    /* stop after this many (0 = all) */
    /* Resource bounds: a record asking for more is a malformed line naming the limit, so a
     * short hostile line cannot make the reader allocate and hash millions of tokens. */
    uint64_t max_request_tokens; /* input (and output) tokens of one request (0 = default) */
    uint64_t max_segment_tokens; /* tokens of one segment, segments traces (0 = default) */
} ikv_trace_opts;

#define IKV_TRACE_DEFAULT_MAX_REQUEST_TOKENS (UINT64_C(1) << 21) /* 2097152: 10x real traces */
#define IKV_TRACE_DEFAULT_MAX_SEGMENT_TOKENS (UINT64_C(1) << 20) /* 1048576 */

typedef struct ikv_trace ikv_trace;

/* Opens a trace (plain or gzip, detected by content). Returns 0, or IKV_EIO (cannot open or
 * read), IKV_EEMPTY (no records), IKV_EFORMAT (cannot detect / first record malformed), with a
 * detail naming the file. */
int ikv_trace_open(const char *path, const ikv_trace_opts *opts, ikv_trace **out);
/* Next request in replay order. Returns 1 and fills *req, 0 at the end, or a negative error
 * (in strict mode, a malformed line: IKV_EFORMAT with "file:line: reason"). */
int ikv_trace_next(ikv_trace *t, ikv_trace_request *req);
/* Rewinds to the first request (for a second pass, e.g. opt's next-use times). */
int ikv_trace_rewind(ikv_trace *t);
/* Malformed lines skipped so far, and the first one's message (NULL if none). */
uint64_t ikv_trace_skipped(const ikv_trace *t);
const char *ikv_trace_first_error(const ikv_trace *t);
ikv_trace_format ikv_trace_format_of(const ikv_trace *t);
const char *ikv_trace_path(const ikv_trace *t);
uint32_t ikv_trace_block_tokens(const ikv_trace *t); /* 512 mooncake, 64 weka, N segments */
uint32_t ikv_trace_tenants(const ikv_trace *t);      /* distinct tenant indices seen so far */
void ikv_trace_close(ikv_trace *t);

const char *ikv_trace_format_name(ikv_trace_format f);
int ikv_trace_format_parse(const char *name, ikv_trace_format *out);

/* Requests in the trace when the reader knows it up front (weka reads everything at open), else
 * 0 (streaming readers). For progress bars. */
uint64_t ikv_trace_count_hint(const ikv_trace *t);

/* ---- replay ----------------------------------------------------------------------------- */

typedef enum ikv_replay_mode {
    IKV_REPLAY_ORDER = 0, /* trace order, no timing: match, count hits, insert (Mooncake §) */
    IKV_REPLAY_TIMED,     /* arrivals at trace times, a pool of prefill servers, locks */
} ikv_replay_mode;

struct ikv_request_outcome;

typedef struct ikv_replay_tier {
    char name[16];            /* "hbm", "dram", "ssd", "remote" (the cost model's tier kinds) */
    uint64_t capacity_tokens; /* > 0 */
} ikv_replay_tier;

/* Replay options (caller-owned; ikv_replay_opts_default fills the defaults). */
typedef struct ikv_replay_opts {
    ikv_replay_mode mode;
    uint64_t capacity_tokens; /* one tier "hbm" of this many tokens; 0 = unlimited (every
                                 distinct block of the trace fits; sized by a first pass) */
    size_t n_tiers;           /* > 0: use tiers[] instead of capacity_tokens */
    ikv_replay_tier tiers[IKV_MAX_TIERS];
    const char *policy;       /* "NAME[:k=v,...]" for every tier (default "lru") */
    const char *model, *hw;   /* cost model (default llama3-70b on h100) */
    uint32_t gpus;            /* GPUs per server (tensor parallel; default 8) */
    uint32_t servers;         /* timed: prefill servers (default 4) */
    uint32_t decode_batch;    /* timed: decode batch the per-token time assumes (default 16) */
    int service_trace;        /* timed: each request starts at its arrival + queue_s and takes
                                 the trace's measured ttft_s / latency_s (no servers, no cost
                                 model times); every request must have them */
    int pin_public;           /* pin each request's leading public blocks after insertion */
    double pin_budget;        /* fraction of tier 0 that may be pinned (default 0.5) */
    double chunk_reuse;       /* < 0: off; else R: doc chunks hit anywhere, R recomputed */
    uint64_t thrash_window;   /* ghost list size in blocks (0 = total capacity in blocks; at
                                 most IKV_REPLAY_MAX_THRASH_WINDOW); memory follows the drops */
    int check_every;          /* tests: run ikv_cache_check every N requests (0 = never) */
    void (*progress)(void *ctx, uint64_t done, uint64_t total); /* may be NULL */
    void *progress_ctx;
    /* Called after each request with what happened to it (tests, traces of a replay). */
    void (*on_request)(void *ctx, const ikv_trace_request *q,
                       const struct ikv_request_outcome *out);
    void *on_request_ctx;
} ikv_replay_opts;

/* What one request got (ikv_replay_opts.on_request). Times are simulated (timed mode only). */
typedef struct ikv_request_outcome {
    size_t matched;            /* leading blocks found, all tiers */
    uint64_t hit_tokens;       /* min(matched * block, input) */
    double chunk_tokens;       /* chunk reuse: effective tokens (x (1 - R)) */
    size_t inserted;
    size_t lower_loaded, lower_recomputed; /* timed: lower-tier matched blocks by decision */
    double arrival, start, queue, prefill, ttft, decode; /* timed, seconds */
} ikv_request_outcome;

void ikv_replay_opts_default(ikv_replay_opts *o);

/* Parses a tier list "hbm=2M,dram=16M,ssd=200M" (fastest first, each tier once, token
 * capacities > 0 with k/M/G suffixes) into tiers[IKV_MAX_TIERS] and *n. 0, or IKV_EPARAM with a
 * detail (unknown tier, duplicate, slower before faster, bad capacity); nothing written then.
 * "Faster" is a shorter ikv_load_time of a block: hbm, dram, remote, ssd in the catalog. */
int ikv_replay_tiers_parse(const char *spec, ikv_replay_tier *tiers, size_t *n);

struct ikv_cost_cfg;
/* The order and uniqueness check of ikv_replay_tiers_parse on a given cost model (ikv_replay
 * runs it with its model and hardware). 0 or IKV_EPARAM with a detail. */
int ikv_replay_tiers_check(const ikv_replay_tier *tiers, size_t n, const struct ikv_cost_cfg *cfg);

#define IKV_REPLAY_MAX_THRASH_WINDOW (UINT64_C(0xFFFFFFFE)) /* 32-bit ring positions */

/* What a replay measured. Token and block counts are exact; simulated times come from the cost
 * model named in model/hw; wall-clock figures (replay_seconds, block_ops_per_s) are measured. */
typedef struct ikv_replay_result {
    ikv_replay_mode mode;
    char policy[64], model[32], hw[32];
    uint32_t block_tokens;
    size_t n_tiers;
    char tier_name[IKV_MAX_TIERS][16];
    uint64_t tier_capacity_blocks[IKV_MAX_TIERS];
    int unlimited;

    uint64_t requests, input_tokens, blocks;
    uint64_t hit_blocks;            /* leading blocks found (prefix match), all tiers */
    uint64_t prefix_hit_tokens;     /* sum of min(k * block, input) */
    double chunk_hit_tokens;        /* chunk reuse: hit tokens x (1 - R) */
    uint64_t chunk_hit_blocks;
    double hit_tokens;              /* prefix_hit_tokens + chunk_hit_tokens */
    double token_hit_ratio;         /* hit_tokens / input_tokens */
    double block_hit_ratio;         /* (hit_blocks + chunk_hit_blocks) / blocks */
    uint64_t hits_by_tier[IKV_MAX_TIERS];
    uint64_t inserted_blocks, evictions, demotions, promotions;
    uint64_t evictions_by_tier[IKV_MAX_TIERS];
    uint64_t thrash_window;         /* blocks (see ikv_replay_opts.thrash_window) */
    uint64_t thrash_reused;         /* dropped blocks requested again within the window */
    double thrash_ratio;            /* thrash_reused / evictions (drops) */
    double prefill_flops, prefill_flops_saved; /* simulated: all-miss FLOPs, FLOPs avoided */
    uint64_t insert_full;           /* requests whose insertion ran out of evictable room */
    uint64_t chain_conflicts;       /* requests whose ids contradict earlier prefixes */
    uint64_t pins, pin_budget_errors, pin_failures;
    uint64_t skipped_lines;

    /* timed mode (simulated seconds on the cost model) */
    uint32_t servers, gpus;
    double ttft_p50, ttft_p90, ttft_p99, ttft_mean;
    double queue_p50, queue_p90, queue_p99, queue_mean;
    double prefill_mean, decode_mean, makespan;
    uint64_t lower_loaded_blocks, lower_recomputed_blocks; /* lower-tier hits: loaded / not */
    uint64_t lock_failures;
    uint64_t pending_cuts;          /* requests whose match stopped at a block another running
                                       request was still computing (no insertion then) */

    /* per tenant (segments: tenants; weka: conversations); arrays of n_tenants, owned */
    uint32_t n_tenants;
    uint64_t *tenant_requests, *tenant_input_tokens;
    double *tenant_hit_tokens;

    /* measured */
    uint64_t block_ops;             /* blocks looked up or inserted (incl. chunk keys) */
    double prepass_seconds, replay_seconds, block_ops_per_s;
} ikv_replay_result;

/* Replays trace t (from its current position: normally just opened) through a fresh cache built
 * from o, and fills *r (free it with ikv_replay_result_free). Rewinds the trace for a first pass
 * when the capacity is unlimited or a tier runs opt. Returns 0, or a negative error with a detail
 * (bad options: IKV_EINVAL / IKV_EPOLICY / IKV_EPARAM / IKV_EMODEL / IKV_EHW; trace errors). */
int ikv_replay(ikv_trace *t, const ikv_replay_opts *o, ikv_replay_result *r);
void ikv_replay_result_free(ikv_replay_result *r);
/* Token hit ratio of tenant i (0 when it had no input). */
double ikv_replay_tenant_ratio(const ikv_replay_result *r, uint32_t i);

const char *ikv_replay_mode_name(ikv_replay_mode m);

#ifdef __cplusplus
}
#endif
#endif
