/*
 * isokv sim: trace readers, the synthetic multi-user generator, and replay through the cache
 * core (the same core the engine uses; see ../../shared/DESIGN.md §3).
 *
 * Data flow:
 *
 *     trace file (.jsonl / .jsonl.gz) --ikv_trace_next()--> ikv_request --replay--> metrics
 *         mooncake | weka | segments                         keys, times            (JSON / table)
 *
 * A reader turns each record into an ikv_request whose block keys are already 128-bit keys in
 * the cache's key space: Mooncake ids are global prefix ids (namespace 0), WEKA ids are local to
 * their conversation (namespace = conversation index + 1), segment traces are cut into blocks
 * and chained with the tenant's scope salt (public segments under IKV_SCOPE_PUBLIC).
 *
 * Ownership: an ikv_request and the arrays it points to belong to the reader and stay valid
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

typedef struct ikv_request {
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
} ikv_request;

typedef struct ikv_trace_opts {
    ikv_trace_format format;
    int strict;               /* a malformed line is fatal (default: skip and count it) */
    uint64_t seed;            /* key seed */
    uint64_t conversations;   /* weka: take the first N conversations (0 = all) */
    double window;            /* weka: conversation i starts at i*window/N seconds (def. 3600) */
    uint64_t max_requests;    /* stop after this many (0 = all) */
} ikv_trace_opts;

typedef struct ikv_trace ikv_trace;

/* Opens a trace (plain or gzip, detected by content). Returns 0, or IKV_EIO (cannot open or
 * read), IKV_EEMPTY (no records), IKV_EFORMAT (cannot detect / first record malformed), with a
 * detail naming the file. */
int ikv_trace_open(const char *path, const ikv_trace_opts *opts, ikv_trace **out);
/* Next request in replay order. Returns 1 and fills *req, 0 at the end, or a negative error
 * (in strict mode, a malformed line: IKV_EFORMAT with "file:line: reason"). */
int ikv_trace_next(ikv_trace *t, ikv_request *req);
/* Rewinds to the first request (for a second pass, e.g. opt's next-use times). */
int ikv_trace_rewind(ikv_trace *t);
/* Malformed lines skipped so far, and the first one's message (NULL if none). */
uint64_t ikv_trace_skipped(const ikv_trace *t);
const char *ikv_trace_first_error(const ikv_trace *t);
ikv_trace_format ikv_trace_format_of(const ikv_trace *t);
uint32_t ikv_trace_block_tokens(const ikv_trace *t); /* 512 mooncake, 64 weka, N segments */
uint32_t ikv_trace_tenants(const ikv_trace *t);      /* distinct tenant indices seen so far */
void ikv_trace_close(ikv_trace *t);

const char *ikv_trace_format_name(ikv_trace_format f);
int ikv_trace_format_parse(const char *name, ikv_trace_format *out);

#ifdef __cplusplus
}
#endif
#endif
