/*
 * The generic trace reader: files (plain or gzip), lines, malformed-line policy, format
 * detection and the registry of formats (see trace_internal.h for the reader interface).
 *
 * Files are read through zlib: gzopen reads a plain file transparently, so one code path serves
 * .jsonl and .jsonl.gz. A gzip stream that ends early (a truncated download) is reported as
 * IKV_ETRUNC with the file name, never silently taken as the end of the trace. Lines are
 * split out of a gzread buffer with memchr into a line buffer that doubles as needed, so a 4 MB
 * WEKA conversation line is read like a 100-byte Mooncake one, and a NUL byte is part of its
 * line (reported as malformed), not the end of it. Blank lines are ignored.
 *
 * A record is one JSON object per line: invalid JSON, a NUL byte, nesting deeper than cJSON's
 * limit and content after the object on the same line are each malformed, reported with the
 * line and column.
 *
 * Detection: the first non-blank line is parsed as JSON and offered to each registered reader's
 * detect(); the first that accepts it wins. `--format` skips detection.
 *
 * Malformed records: by default a bad line is skipped and counted (ikv_trace_skipped), and the
 * first message is kept ("file:line: reason"); with opts.strict the same message is returned as
 * IKV_EFORMAT by ikv_trace_next.
 */
#include "trace_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- registry ----------------------------------------------------------------------------- */

extern const ikv__trace_reader ikv__trace_mooncake;
extern const ikv__trace_reader ikv__trace_weka;
extern const ikv__trace_reader ikv__trace_segments;
extern const ikv__trace_reader ikv__trace_oracle;

/* Detection tries them in this order; a new format is one file plus one line here. */
static const ikv__trace_reader *const readers[] = {
    &ikv__trace_mooncake,
    &ikv__trace_weka,
    &ikv__trace_segments,
    &ikv__trace_oracle, /* binary: only with --format oracleGeneral */
};

#define N_READERS (sizeof readers / sizeof readers[0])

static const char *const format_names[] = {"auto", "mooncake", "weka", "segments",
                                           "oracleGeneral"};

const char *ikv_trace_format_name(ikv_trace_format f) {
    return (unsigned)f < sizeof format_names / sizeof format_names[0] ? format_names[f] : "?";
}

int ikv_trace_format_parse(const char *name, ikv_trace_format *out) {
    for (size_t i = 0; i < sizeof format_names / sizeof format_names[0]; i++)
        if (name && !strcmp(name, format_names[i])) {
            *out = (ikv_trace_format)i;
            return 0;
        }
    return ikv_error(IKV_EINVAL, "unknown trace format '%s' (auto, mooncake, weka, segments, oracleGeneral)",
                     name ? name : "");
}

static const ikv__trace_reader *reader_of(ikv_trace_format f) {
    for (size_t i = 0; i < N_READERS; i++)
        if (readers[i]->format == f) return readers[i];
    return NULL;
}

/* ---- lines -------------------------------------------------------------------------------- */

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

#define RBUF_BYTES (1u << 17)

/* Refills the read buffer. 1 (bytes available), 0 (end of file), or an error naming the line
 * after which the file stopped: a gzip stream that ends early is IKV_ETRUNC, never taken for
 * the end of the trace. */
static int refill(ikv_trace *t) {
    if (t->reof) return 0;
    if (!t->rbuf) {
        t->rbuf = ikv_malloc(RBUF_BYTES);
        if (!t->rbuf) return IKV_ENOMEM;
    }
    int got = gzread(t->gz, t->rbuf, RBUF_BYTES);
    int zerr = 0;
    const char *msg = gzerror(t->gz, &zerr);
    if (got < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
        if (zerr == Z_BUF_ERROR || (msg && strstr(msg, "unexpected end")))
            return ikv_error(IKV_ETRUNC, "%s: truncated gzip stream after line %llu (%s)", t->path,
                             (unsigned long long)t->lineno, msg ? msg : "");
        return ikv_error(IKV_EIO, "%s: read error after line %llu (%s)", t->path,
                         (unsigned long long)t->lineno, msg ? msg : "zlib error");
    }
    t->rpos = 0;
    t->rlen = (size_t)got;
    if (got == 0) t->reof = 1;
    return got > 0;
}

/* Makes t->line hold at least `need` bytes plus a terminating NUL. */
static int line_room(ikv_trace *t, size_t need) {
    if (need + 1 <= t->line_cap) return 0;
    size_t cap = t->line_cap ? t->line_cap : 1 << 16;
    while (cap < need + 1)
        cap *= 2;
    char *p = ikv_realloc(t->line, cap);
    if (!p)
        return ikv_error(IKV_ENOMEM, "%s:%llu: line too long for memory", t->path,
                         (unsigned long long)t->lineno + 1);
    t->line = p;
    t->line_cap = cap;
    return 0;
}

/* Reads one physical line (any length, any bytes but '\n') into t->line. 1, 0 at EOF, or an
 * error. The line is NUL-terminated for convenience, but its length is t->line_len and a NUL
 * byte inside it is recorded in t->line_nul: readers report such a line as malformed instead
 * of cutting it short (gzgets + strlen silently dropped the rest and the next line). */
static int read_line(ikv_trace *t) {
    t->line_len = 0;
    t->line_complete = 0;
    int rc = line_room(t, 0);
    if (rc) return rc;
    for (;;) {
        if (t->rpos == t->rlen) {
            rc = refill(t);
            if (rc < 0) return rc;
            if (rc == 0) {
                if (t->line_len == 0) return 0;
                break; /* last line without a newline */
            }
        }
        const char *from = t->rbuf + t->rpos;
        size_t avail = t->rlen - t->rpos;
        const char *nl = memchr(from, '\n', avail);
        size_t take = nl ? (size_t)(nl - from) + 1 : avail;
        if ((rc = line_room(t, t->line_len + take))) return rc;
        memcpy(t->line + t->line_len, from, take);
        t->line_len += take;
        t->rpos += take;
        if (nl) {
            t->line_complete = 1;
            break;
        }
    }
    t->lineno++;
    while (t->line_len && (t->line[t->line_len - 1] == '\n' || t->line[t->line_len - 1] == '\r'))
        t->line_len--;
    t->line[t->line_len] = 0;
    const char *z = memchr(t->line, 0, t->line_len);
    t->line_nul = z ? (size_t)(z - t->line) : SIZE_MAX;
    return 1;
}

int ikv__trace_file_rewind(ikv_trace *t) {
    if (gzrewind(t->gz) != 0) return ikv_error(IKV_EIO, "%s: cannot rewind", t->path);
    t->rpos = t->rlen = 0;
    t->reof = 0;
    t->lineno = 0;
    return 0;
}

int ikv__trace_getline(ikv_trace *t) {
    for (;;) {
        int rc = read_line(t);
        if (rc <= 0) return rc;
        if (!is_blank(t->line, t->line_len)) return 1;
    }
}

int ikv__trace_malformed(ikv_trace *t, const char *fmt, ...) {
    char reason[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    const char *trunc = t->line_complete ? "" : " (the file ends inside this line: truncated?)";
    if (t->opts.strict)
        return ikv_error(IKV_EFORMAT, "%s:%llu: %s%s", t->path, (unsigned long long)t->lineno,
                         reason, trunc);
    if (!t->has_error) {
        snprintf(t->first_error, sizeof t->first_error, "%s:%llu: %s%s", t->path,
                 (unsigned long long)t->lineno, reason, trunc);
        t->has_error = 1;
    }
    t->skipped++;
    return 0;
}

int ikv__trace_reserve(ikv_trace *t, size_t n) {
    if (n <= t->scratch_cap) return 0;
    size_t cap = t->scratch_cap ? t->scratch_cap : 256;
    while (cap < n) cap *= 2;
    ikv_key *k = ikv_realloc(t->keys, cap * sizeof *k);
    if (!k) return IKV_ENOMEM;
    t->keys = k;
    uint32_t *nt = ikv_realloc(t->ntokens, cap * sizeof *nt);
    if (!nt) return IKV_ENOMEM;
    t->ntokens = nt;
    t->scratch_cap = cap;
    return 0;
}

/* The deepest nesting of arrays and objects in s (strings skipped), stopping early once it
 * passes `stop`. Used only to explain a failed parse. */
static size_t json_depth(const char *s, size_t n, size_t stop) {
    size_t d = 0, max = 0;
    for (size_t i = 0; i < n && max <= stop; i++) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\') i++;
        } else if (c == '[' || c == '{') {
            if (++d > max) max = d;
        } else if ((c == ']' || c == '}') && d) {
            d--;
        }
    }
    return max;
}

const char *ikv__trace_json_problem(ikv_trace *t, cJSON **obj, char *why, size_t why_len) {
    *obj = NULL;
    if (t->line_nul != SIZE_MAX) {
        snprintf(why, why_len, "NUL byte at column %zu", t->line_nul + 1);
        return why;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(t->line, t->line_len, &end, 0);
    if (!j) {
        if (json_depth(t->line, t->line_len, CJSON_NESTING_LIMIT) > CJSON_NESTING_LIMIT) {
            snprintf(why, why_len, "JSON nested deeper than %d levels", CJSON_NESTING_LIMIT);
            return why;
        }
        const char *where = cJSON_GetErrorPtr();
        size_t off = where && where >= t->line && where <= t->line + t->line_len
                         ? (size_t)(where - t->line)
                         : t->line_len;
        snprintf(why, why_len, "invalid JSON at column %zu", off + 1);
        return why;
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        snprintf(why, why_len, "expected a JSON object");
        return why;
    }
    size_t off = end && end >= t->line && end <= t->line + t->line_len ? (size_t)(end - t->line)
                                                                       : t->line_len;
    if (!is_blank(t->line + off, t->line_len - off)) {
        cJSON_Delete(j);
        while (off < t->line_len && (t->line[off] == ' ' || t->line[off] == '\t'))
            off++;
        snprintf(why, why_len, "trailing content after the JSON object at column %zu", off + 1);
        return why;
    }
    *obj = j;
    return NULL;
}

cJSON *ikv__trace_parse_line(ikv_trace *t, int *rc) {
    *rc = 0;
    char why[128];
    cJSON *j;
    const char *bad = ikv__trace_json_problem(t, &j, why, sizeof why);
    if (bad) {
        *rc = ikv__trace_malformed(t, "%s", bad);
        return NULL;
    }
    return j;
}

uint64_t ikv__trace_max_request_tokens(const ikv_trace *t) {
    return t->opts.max_request_tokens ? t->opts.max_request_tokens
                                      : IKV_TRACE_DEFAULT_MAX_REQUEST_TOKENS;
}

uint64_t ikv__trace_max_segment_tokens(const ikv_trace *t) {
    return t->opts.max_segment_tokens ? t->opts.max_segment_tokens
                                      : IKV_TRACE_DEFAULT_MAX_SEGMENT_TOKENS;
}

/* ---- JSON helpers ------------------------------------------------------------------------- */

int ikv__json_item_uint(const cJSON *it, uint64_t max, uint64_t *out) {
    if (!cJSON_IsNumber(it)) return -1;
    double v = it->valuedouble;
    if (!(v >= 0) || v != floor(v) || v > (double)max) return -1;
    *out = (uint64_t)v;
    return 0;
}

int ikv__json_uint(const cJSON *obj, const char *field, uint64_t max, uint64_t *out) {
    return ikv__json_item_uint(cJSON_GetObjectItemCaseSensitive(obj, field), max, out);
}

int ikv__json_double(const cJSON *obj, const char *field, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) return -1;
    *out = it->valuedouble;
    return 0;
}

/* ---- open / next / rewind / close --------------------------------------------------------- */

/* Reads the first record and asks each reader whether it is theirs. */
static int detect(ikv_trace *t) {
    int rc = ikv__trace_getline(t);
    if (rc < 0) return rc;
    if (rc == 0) return ikv_error(IKV_EEMPTY, "%s: empty trace (no records)", t->path);
    char why[128];
    cJSON *j;
    const char *bad = ikv__trace_json_problem(t, &j, why, sizeof why);
    if (bad && !j) {
        /* trailing content is the reader's to report (with the line counted); the rest means
         * there is no record to detect from */
        if (strncmp(bad, "trailing", 8))
            return ikv_error(IKV_EFORMAT,
                             "%s:%llu: cannot detect the trace format: the first record: %s%s "
                             "(use --format; binary traces: --format oracleGeneral)",
                             t->path, (unsigned long long)t->lineno, bad,
                             t->line_complete ? "" : " (file ends inside it: truncated?)");
        j = cJSON_ParseWithLength(t->line, t->line_len);
        if (!j) return ikv_error(IKV_ENOMEM, "%s: parsing the first record", t->path);
    }
    const ikv__trace_reader *found = NULL;
    for (size_t i = 0; i < N_READERS && !found; i++)
        if (readers[i]->detect && readers[i]->detect(j)) found = readers[i];
    cJSON_Delete(j);
    if (!found)
        return ikv_error(IKV_EFORMAT,
                         "%s:%llu: cannot detect the trace format from the first record "
                         "(known: mooncake, weka, segments; use --format)",
                         t->path, (unsigned long long)t->lineno);
    t->rd = found;
    return 0;
}

static int file_rewind(ikv_trace *t) {
    int rc = ikv__trace_file_rewind(t);
    if (rc) return rc;
    t->emitted = 0;
    return 0;
}

int ikv_trace_open(const char *path, const ikv_trace_opts *opts, ikv_trace **out) {
    *out = NULL;
    if (!path || !*path) return ikv_error(IKV_EINVAL, "no trace file given");
    ikv_trace *t = ikv_calloc(1, sizeof *t);
    if (!t) return IKV_ENOMEM;
    if (opts) t->opts = *opts;
    if (!(t->opts.window > 0)) t->opts.window = 3600;
    size_t plen = strlen(path);
    t->path = ikv_malloc(plen + 1);
    if (!t->path) {
        ikv_free(t);
        return IKV_ENOMEM;
    }
    memcpy(t->path, path, plen + 1);
    int rc = 0;
    t->gz = gzopen(path, "rb");
    if (!t->gz) {
        rc = ikv_error(IKV_EIO, "%s: cannot open (%s)", path, errno ? strerror(errno) : "zlib");
        goto fail;
    }
    gzbuffer(t->gz, 1 << 17);
    t->line_nul = SIZE_MAX;
    if (t->opts.format == IKV_TRACE_AUTO) {
        if ((rc = detect(t))) goto fail;
    } else {
        t->rd = reader_of(t->opts.format);
        if (!t->rd) {
            rc = ikv_error(IKV_EUNSUPPORTED, "%s: no reader for format '%s' in this build", path,
                           ikv_trace_format_name(t->opts.format));
            goto fail;
        }
        /* an empty file is an error whatever the format (binary readers check it) */
        int g = t->rd->binary ? 1 : ikv__trace_getline(t);
        if (g < 0) {
            rc = g;
            goto fail;
        }
        if (g == 0) {
            rc = ikv_error(IKV_EEMPTY, "%s: empty trace (no records)", path);
            goto fail;
        }
    }
    t->block_tokens = t->rd->block_tokens;
    if ((rc = file_rewind(t))) goto fail;
    if ((rc = t->rd->open(t))) goto fail;
    *out = t;
    return 0;
fail:
    ikv_trace_close(t);
    return rc;
}

int ikv_trace_next(ikv_trace *t, ikv_trace_request *req) {
    if (t->opts.max_requests && t->emitted >= t->opts.max_requests) return 0;
    memset(req, 0, sizeof *req);
    int rc = t->rd->next(t, req);
    if (rc != 1) return rc;
    req->index = t->emitted++;
    return 1;
}

int ikv_trace_rewind(ikv_trace *t) {
    int rc = file_rewind(t);
    if (rc) return rc;
    if (t->rd->rewind) return t->rd->rewind(t); /* read in open: keep its skip count */
    t->skipped = 0; /* streaming: the second pass counts the same lines again */
    t->has_error = 0;
    t->first_error[0] = 0;
    return 0;
}

uint64_t ikv_trace_skipped(const ikv_trace *t) {
    return t->skipped;
}

const char *ikv_trace_path(const ikv_trace *t) {
    return t->path;
}

const char *ikv_trace_first_error(const ikv_trace *t) {
    return t->has_error ? t->first_error : NULL;
}

ikv_trace_format ikv_trace_format_of(const ikv_trace *t) {
    return t->rd ? t->rd->format : IKV_TRACE_AUTO;
}

uint32_t ikv_trace_block_tokens(const ikv_trace *t) {
    return t->block_tokens;
}

uint32_t ikv_trace_tenants(const ikv_trace *t) {
    return t->tenants;
}

void ikv_trace_close(ikv_trace *t) {
    if (!t) return;
    if (t->rd && t->rd->close) t->rd->close(t);
    if (t->gz) gzclose(t->gz);
    ikv_free(t->line);
    ikv_free(t->rbuf);
    ikv_free(t->keys);
    ikv_free(t->ntokens);
    ikv_free(t->path);
    ikv_free(t);
}

uint64_t ikv_trace_count_hint(const ikv_trace *t) {
    uint64_t n = t->known_requests;
    if (t->opts.max_requests && (!n || n > t->opts.max_requests)) n = t->opts.max_requests;
    return n;
}
