/*
 * libCacheSim's oracleGeneral binary trace reader (flat semantics: each request is one block).
 *
 * The format (libCacheSim traceReader/customizedReader/oracle/oracleGeneralBin.h) is a bare
 * array of packed little-endian 24-byte records, no header:
 *
 *     offset  0  uint32  timestamp (seconds)
 *             4  uint64  object id
 *            12  uint32  object size (bytes; libCacheSim skips size-0 requests)
 *            16  int64   virtual time (0-based request index) of the object's next request,
 *                        -1 or INT64_MAX if there is none
 *
 * Each record becomes a request of one block whose key is ikv_key_from_id(seed, 0, id), the
 * key space of Mooncake ids, of one token (block_tokens = 1, so --capacity-tokens N is a cache
 * of N blocks: cachesim's `--ignore-obj-size 1` with a cache size of N). The size is not used
 * beyond libCacheSim's rule: a size-0 record is skipped (counted as a malformed record; fatal
 * with --strict). `isokv trace export` writes this format.
 *
 * Strict validation: a file whose length is not a multiple of 24 is truncated, and the error
 * names the byte offset of the partial record; a next-access time that is neither -1,
 * INT64_MAX nor later than the record's own index means the file is not oracleGeneral (or is
 * misaligned) and is rejected with the record's index and offset. Records are read through
 * zlib in blocks of 8192 (a .gz file works too), one buffer allocated at open.
 */
#include "trace_internal.h"

#include <string.h>

#define REC      24
#define BUF_RECS 8192

typedef struct og_state {
    unsigned char *buf; /* BUF_RECS records */
    size_t len, pos;    /* bytes in buf, next byte to use */
    uint64_t offset;    /* file offset of buf[0] */
    uint64_t vtime;     /* index of the next record (counting skipped ones, as libCacheSim) */
} og_state;

static inline uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rd64(const unsigned char *p) {
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

/* Refills the buffer keeping the unread tail. 0, or a negative error. */
static int refill(ikv_trace *t, og_state *s) {
    size_t keep = s->len - s->pos;
    memmove(s->buf, s->buf + s->pos, keep);
    s->offset += s->pos;
    s->pos = 0;
    s->len = keep;
    while (s->len < REC * BUF_RECS) {
        int got = gzread(t->gz, s->buf + s->len, (unsigned)(REC * BUF_RECS - s->len));
        if (got < 0) {
            int zerr = 0;
            const char *msg = gzerror(t->gz, &zerr);
            return ikv_error(zerr == Z_BUF_ERROR ? IKV_ETRUNC : IKV_EIO,
                             "%s: read error at byte %llu (%s)", t->path,
                             (unsigned long long)(s->offset + s->len), msg ? msg : "zlib");
        }
        if (got == 0) break;
        s->len += (size_t)got;
    }
    return 0;
}

static int og_open(ikv_trace *t) {
    og_state *s = ikv_calloc(1, sizeof *s);
    if (!s) return IKV_ENOMEM;
    s->buf = ikv_malloc(REC * BUF_RECS);
    if (!s->buf) {
        ikv_free(s);
        return IKV_ENOMEM;
    }
    t->state = s;
    t->tenants = 1;
    int rc = ikv__trace_reserve(t, 1);
    if (!rc) rc = refill(t, s);
    if (!rc && s->len == 0) rc = ikv_error(IKV_EEMPTY, "%s: empty trace (no records)", t->path);
    return rc;
}

static int og_next(ikv_trace *t, ikv_trace_request *req) {
    og_state *s = t->state;
    for (;;) {
        if (s->len - s->pos < REC) {
            int rc = refill(t, s);
            if (rc) return rc;
            if (s->len == 0) {
                if (s->offset == 0)
                    return ikv_error(IKV_EEMPTY, "%s: empty trace (no records)", t->path);
                return 0;
            }
            if (s->len < REC)
                return ikv_error(IKV_ETRUNC,
                                 "%s: truncated oracleGeneral record at byte offset %llu "
                                 "(record %llu has %zu of 24 bytes)",
                                 t->path, (unsigned long long)s->offset,
                                 (unsigned long long)s->vtime, s->len);
        }
        const unsigned char *r = s->buf + s->pos;
        uint64_t at = s->offset + s->pos, v = s->vtime;
        s->pos += REC;
        s->vtime++;
        uint32_t ts = rd32(r), size = rd32(r + 12);
        uint64_t id = rd64(r + 4);
        int64_t next = (int64_t)rd64(r + 16);
        if (next != -1 && next != INT64_MAX && (next < 0 || (uint64_t)next <= v))
            return ikv_error(IKV_EFORMAT,
                             "%s: record %llu at byte offset %llu: next access time %lld is not "
                             "after the record's own index (not an oracleGeneral file, or "
                             "misaligned)",
                             t->path, (unsigned long long)v, (unsigned long long)at,
                             (long long)next);
        if (size == 0) {
            t->lineno = v + 1; /* "file:N" in the message names the 1-based record */
            t->line_complete = 1;
            int rc = ikv__trace_malformed(t,
                                          "object size 0 (record at byte offset %llu; "
                                          "libCacheSim skips these too)",
                                          (unsigned long long)at);
            if (rc) return rc;
            continue;
        }
        t->keys[0] = ikv_key_from_id(t->opts.seed, 0, id);
        t->ntokens[0] = 1;
        req->time = (double)ts;
        req->input_tokens = 1;
        req->n_blocks = 1;
        req->keys = t->keys;
        req->ntokens = t->ntokens;
        return 1;
    }
}

static int og_rewind(ikv_trace *t) {
    og_state *s = t->state;
    s->len = s->pos = 0;
    s->offset = s->vtime = 0;
    t->skipped = 0;
    t->has_error = 0;
    t->first_error[0] = 0;
    return 0;
}

static void og_close(ikv_trace *t) {
    og_state *s = t->state;
    if (!s) return;
    ikv_free(s->buf);
    ikv_free(s);
    t->state = NULL;
}

const ikv__trace_reader ikv__trace_oracle = {
    .name = "oracleGeneral",
    .format = IKV_TRACE_ORACLE,
    .block_tokens = 1,
    .binary = 1,
    .detect = NULL,
    .open = og_open,
    .next = og_next,
    .rewind = og_rewind,
    .close = og_close,
};
