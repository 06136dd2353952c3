/*
 * Trace readers: the internal interface between the generic reader (trace.c) and one file per
 * format (trace_mooncake.c, trace_weka.c, trace_segments.c).
 *
 * trace.c owns the file (zlib gzopen/gzread read plain and gzip files alike), line splitting
 * for lines of any length (its own buffer, so a NUL byte inside a line is seen, never taken
 * for the end of it), line numbers, the malformed-line policy (skip and count, or fatal
 * with opts.strict), format detection, max_requests and request numbering. A format supplies a
 * const ikv__trace_reader and is listed once in trace.c's registry:
 *
 *     ikv_trace_open ─ detect (first record, parsed once with cJSON) ─ rd->open
 *     ikv_trace_next ─ rd->next ─ (index, max_requests)                 ikv_trace_rewind ─
 * rd->rewind
 *
 * A reader keeps its own state in t->state (allocated in open, freed in close). It may stream
 * (read one line per request: mooncake, segments) or read the whole file in open (weka, which
 * must reorder requests by time). Key and token arrays handed out in an ikv_trace_request may live
 * in the shared scratch (ikv__trace_reserve) or in the reader's state; either way they stay valid
 * until the next ikv_trace_next() or ikv_trace_close().
 */
#ifndef ISOKV_SIM_TRACE_INTERNAL_H
#define ISOKV_SIM_TRACE_INTERNAL_H

#include "isokv/sim.h"

#include <cjson/cJSON.h>
#include <zlib.h>

typedef struct ikv__trace_reader {
    const char *name;          /* "mooncake", "weka", "segments" (ikv_trace_format_name) */
    ikv_trace_format format;
    uint32_t block_tokens;     /* default block size of the format (segments may override) */
    int binary;                /* 1: not line-based (oracleGeneral): never auto-detected, and
                                  open() and next() report an empty file themselves */
    /* 1 if the first record (a parsed JSON object) looks like this format, 0 if not. NULL for
     * binary formats. */
    int (*detect)(const cJSON *first);
    /* Sets up t->state. The file is positioned at its start (no line read yet). Returns 0 or a
     * negative error with an ikv_error detail. May read the whole file. */
    int (*open)(ikv_trace *t);
    /* Next request in replay order: 1 (req filled), 0 at the end, < 0 on error. Malformed
     * records go through ikv__trace_malformed. req->index is set by trace.c. */
    int (*next)(ikv_trace *t, ikv_trace_request *req);
    /* Back to the first request. NULL: trace.c rewinds the file and line counter only. When
     * set, it is called after the file has been rewound. */
    int (*rewind)(ikv_trace *t);
    /* Frees t->state (may be NULL; also called after a failed open). */
    void (*close)(ikv_trace *t);
} ikv__trace_reader;

struct ikv_trace {
    char *path;                /* as given (owned copy) */
    gzFile gz;
    ikv_trace_opts opts;       /* defaults applied: window 3600 when 0 */
    const ikv__trace_reader *rd;
    void *state;               /* the reader's */
    /* the current line (NUL-terminated, newline stripped) */
    char *line;
    size_t line_cap, line_len;
    uint64_t lineno;           /* 1-based number of the line in `line` */
    int line_complete;         /* 0 if the file ended without a newline after it */
    size_t line_nul;           /* offset of the first NUL byte in `line`, SIZE_MAX if none */
    /* read buffer between the file and `line` (gzread, not gzgets: NUL bytes survive) */
    char *rbuf;
    size_t rpos, rlen;
    int reof;
    /* malformed-line accounting */
    uint64_t skipped;
    char first_error[256];
    int has_error;
    /* replay bookkeeping */
    uint64_t emitted;          /* requests handed out since open / rewind */
    uint32_t block_tokens;
    uint32_t tenants;          /* distinct tenant indices seen (readers update it) */
    uint64_t known_requests;   /* requests in the trace if the reader knows (else 0) */
    /* shared scratch for request arrays */
    ikv_key *keys;
    uint32_t *ntokens;
    size_t scratch_cap;        /* blocks */
};

/* Reads the next non-blank line into t->line. Returns 1 (a line), 0 (end of file), IKV_ETRUNC
 * (a gzip stream that ends early), IKV_EIO (read error), IKV_ENOMEM. Lines may be any length. */
int ikv__trace_getline(ikv_trace *t);

/* Reports a malformed record at the current line: "path:line: reason". In strict mode it
 * returns IKV_EFORMAT with that detail (the caller returns it); otherwise it counts the line as
 * skipped, remembers the first message, and returns 0 (the caller moves on). A line the file
 * ends in the middle of is called truncated in the message. */
int ikv__trace_malformed(ikv_trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Back to the start of the file: zlib rewind, read buffer emptied, line counter 0. 0 or
 * IKV_EIO with a detail. */
int ikv__trace_file_rewind(ikv_trace *t);

/* Makes the shared scratch (t->keys, t->ntokens) hold at least n blocks. 0 or IKV_ENOMEM. */
int ikv__trace_reserve(ikv_trace *t, size_t n);

/* Parses the current line as a JSON object. Returns the object (caller cJSON_Delete()s it), or
 * NULL after reporting the line through ikv__trace_malformed (*rc says whether that was fatal:
 * 0 skip, < 0 return it). A NUL byte in the line, content after the object, nesting deeper
 * than cJSON's limit and invalid JSON are each reported as what they are, with the column. */
cJSON *ikv__trace_parse_line(ikv_trace *t, int *rc);

/* Why the current line is not one JSON object, or NULL if it is one (then *obj holds it, the
 * caller's to delete). `why` is a buffer of at least 96 bytes. Does not report anything. */
const char *ikv__trace_json_problem(ikv_trace *t, cJSON **obj, char *why, size_t why_len);

/* Bounds every reader applies to numbers it takes from a record (absurd values are malformed
 * lines, not silently huge replays): times in seconds, and tokens per request and per segment
 * unless opts.max_request_tokens / opts.max_segment_tokens say otherwise. */
#define IKV__TRACE_MAX_SECONDS 1e9 /* about 31.7 years of trace */
uint64_t ikv__trace_max_request_tokens(const ikv_trace *t);
uint64_t ikv__trace_max_segment_tokens(const ikv_trace *t);

/* JSON field helpers: a non-negative integral number that fits `max`. 0 on success, -1 if the
 * field is missing, not a number, negative, fractional or too large. */
int ikv__json_uint(const cJSON *obj, const char *field, uint64_t max, uint64_t *out);
/* A finite number (may be fractional). 0 or -1. */
int ikv__json_double(const cJSON *obj, const char *field, double *out);
/* A non-negative integral JSON number item (array element). 0 or -1. */
int ikv__json_item_uint(const cJSON *it, uint64_t max, uint64_t *out);

#endif
