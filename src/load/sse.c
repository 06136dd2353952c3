/*
 * Server-sent events, incrementally, and the OpenAI completion chunks they carry.
 *
 * The parser follows the WHATWG event-stream rules as far as a completion stream needs them:
 *
 *     data: {"choices":[{"text":"a"}]}\n          one field line: "name: value" (one optional
 *     \n                                           space after ':'), an event ends at a blank line
 *     : keep-alive comment\n                       ':' lines are comments
 *     data: [DONE]\n\n                             OpenAI's end marker
 *
 * Several "data" lines of one event are joined with '\n'; other fields (event, id, retry) are
 * ignored; lines end in LF, CR or CRLF, and a CRLF may be split across two feeds (a lone CR at
 * the end of a feed is remembered). Bytes arrive in arbitrary pieces from libcurl, so the
 * parser keeps the current line and the current event's data in one buffer bounded by
 * max_event: a server that streams an endless line cannot exhaust memory.
 *
 * Chunks. Each event's data is parsed with cJSON. A chunk with a non-empty choices[i].text (or
 * chat delta.content) is a streamed token: the first such marks TTFT. The usage object (the
 * last chunk when stream_options.include_usage is set, or a plain non-streamed response) gives
 * prompt, completion and cached tokens; cached tokens are taken, in this order, from
 * usage.prompt_tokens_details.cached_tokens (OpenAI; vLLM and isokv use the same field),
 * timings.cache_n (llama.cpp's server, on its last chunk), usage.num_cached_tokens (older
 * vLLM builds), or, for llama.cpp builds whose timings have no cache_n (b4700-era),
 * usage.prompt_tokens - timings.prompt_n: the prompt tokens it did not evaluate.
 */
#include "isokv/load.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

struct ikv_sse {
    char *buf; /* [0, data_len) the event's data so far; [data_len, len) the current line */
    size_t data_len, len, cap, max;
    int has_data;   /* the current event has a data field */
    int saw_data;   /* any data field so far */
    int pending_cr; /* the last byte fed was a CR (a following LF belongs to it) */
    uint64_t bytes;
    ikv_sse_event_fn fn;
    void *ctx;
};

int ikv_sse_create(size_t max_event, ikv_sse_event_fn fn, void *ctx, ikv_sse **out) {
    *out = NULL;
    if (max_event < 16 || !fn) return ikv_error(IKV_EINVAL, "sse: max_event %zu", max_event);
    ikv_sse *s = ikv_calloc(1, sizeof *s);
    if (!s) return IKV_ENOMEM;
    s->cap = max_event < 4096 ? max_event + 1 : 4096;
    s->buf = ikv_malloc(s->cap);
    if (!s->buf) {
        ikv_free(s);
        return IKV_ENOMEM;
    }
    s->max = max_event;
    s->fn = fn;
    s->ctx = ctx;
    *out = s;
    return 0;
}

void ikv_sse_destroy(ikv_sse *s) {
    if (!s) return;
    ikv_free(s->buf);
    ikv_free(s);
}

int ikv_sse_check(const ikv_sse *s) {
    if (!s || !s->buf || !s->fn) return 0;
    if (s->data_len > s->len || s->len >= s->cap || s->cap > s->max + 1) return 0;
    if (!s->has_data && s->data_len) return 0;
    if (s->has_data && !s->saw_data) return 0;
    return 1;
}

uint64_t ikv_sse_bytes(const ikv_sse *s) {
    return s->bytes;
}

int ikv_sse_saw_data(const ikv_sse *s) {
    return s->saw_data;
}

static int put(ikv_sse *s, char c) {
    if (s->len + 1 >= s->cap) {
        if (s->len >= s->max)
            return ikv_error(IKV_ETOOLONG, "server-sent event longer than %zu bytes", s->max);
        size_t cap = s->cap * 2 > s->max + 1 ? s->max + 1 : s->cap * 2;
        char *p = ikv_realloc(s->buf, cap);
        if (!p) return IKV_ENOMEM;
        s->buf = p;
        s->cap = cap;
    }
    s->buf[s->len++] = c;
    return 0;
}

/* Dispatches the event gathered so far (if it has data) and resets it. */
static int dispatch(ikv_sse *s) {
    int rc = 0;
    if (s->has_data) {
        s->buf[s->data_len] = 0;
        rc = s->fn(s->ctx, s->buf, s->data_len);
    }
    s->has_data = 0;
    s->data_len = s->len = 0;
    return rc;
}

/* The line in buf[data_len, len) is complete: interpret it. */
static int end_line(ikv_sse *s) {
    char *line = s->buf + s->data_len;
    size_t n = s->len - s->data_len;
    if (n == 0) return dispatch(s);
    if (line[0] == ':') { /* comment */
        s->len = s->data_len;
        return 0;
    }
    size_t name = 0;
    while (name < n && line[name] != ':')
        name++;
    size_t v = name < n ? name + 1 : n;
    if (v < n && line[v] == ' ') v++;
    if (name == 4 && !memcmp(line, "data", 4)) {
        s->saw_data = 1;
        /* move the value to the end of the data, after a '\n' if data already holds some */
        size_t at = s->data_len;
        if (s->has_data) s->buf[at++] = '\n'; /* the line had >= 5 bytes: room is there */
        memmove(s->buf + at, line + v, n - v);
        s->data_len = at + (n - v);
        s->has_data = 1;
    }
    s->len = s->data_len;
    return 0;
}

int ikv_sse_feed(ikv_sse *s, const char *p, size_t n) {
    int rc;
    s->bytes += n;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (s->pending_cr) {
            s->pending_cr = 0;
            if (c == '\n') continue; /* the LF of a CRLF split across feeds */
        }
        if (c == '\r' || c == '\n') {
            if (c == '\r') {
                if (i + 1 < n) {
                    if (p[i + 1] == '\n') i++;
                } else {
                    s->pending_cr = 1;
                }
            }
            if ((rc = end_line(s))) return rc;
        } else if ((rc = put(s, c))) {
            return rc;
        }
    }
    return 0;
}

int ikv_sse_finish(ikv_sse *s) {
    int rc = 0;
    if (s->len > s->data_len && (rc = end_line(s))) return rc;
    return dispatch(s);
}

/* ---- OpenAI chunks ----------------------------------------------------------------------------
 */

const char *ikv_cached_src_name(ikv_cached_src s) {
    switch (s) {
    case IKV_CACHED_OPENAI:
        return "usage.prompt_tokens_details.cached_tokens";
    case IKV_CACHED_LLAMACPP:
        return "timings.cache_n";
    case IKV_CACHED_VLLM_LEGACY:
        return "usage.num_cached_tokens";
    case IKV_CACHED_LLAMACPP_PROMPT_N:
        return "usage.prompt_tokens-timings.prompt_n";
    default:
        return "none";
    }
}

void ikv_load_reply_init(ikv_load_reply *r) {
    memset(r, 0, sizeof *r);
    r->prompt_tokens = r->completion_tokens = r->cached_tokens = -1;
    r->queue_s = -1;
}

/* A non-negative integral JSON number, or -1. */
static int64_t count_of(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9e15 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return -1;
    return (int64_t)v->valuedouble;
}

static int has_text(const cJSON *choices) {
    const cJSON *c;
    cJSON_ArrayForEach(c, choices) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
        if (cJSON_IsString(t) && t->valuestring[0]) return 1;
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta");
        const cJSON *m = d ? d : cJSON_GetObjectItemCaseSensitive(c, "message");
        t = m ? cJSON_GetObjectItemCaseSensitive(m, "content") : NULL;
        if (cJSON_IsString(t) && t->valuestring[0]) return 1;
    }
    return 0;
}

int ikv_load_reply_chunk(ikv_load_reply *r, const char *data, size_t len, double now) {
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        r->done = 1;
        return 0;
    }
    if (r->done) {
        snprintf(r->error, sizeof r->error, "data after [DONE]");
        return IKV_EFORMAT;
    }
    cJSON *j = cJSON_ParseWithLength(data, len);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        snprintf(r->error, sizeof r->error, "event %d is not a JSON object: %.40s%s", r->events + 1,
                 data, len > 40 ? "..." : "");
        return IKV_EFORMAT;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (err) {
        const cJSON *m =
            cJSON_IsObject(err) ? cJSON_GetObjectItemCaseSensitive(err, "message") : err;
        snprintf(r->error, sizeof r->error, "server error in stream: %.100s",
                 cJSON_IsString(m) ? m->valuestring : "(no message)");
        cJSON_Delete(j);
        return IKV_EFORMAT;
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *timings = cJSON_GetObjectItemCaseSensitive(j, "timings");
    if (!cJSON_IsArray(choices) && !cJSON_IsObject(usage)) {
        cJSON_Delete(j);
        snprintf(r->error, sizeof r->error, "event %d has neither \"choices\" nor \"usage\"",
                 r->events + 1);
        return IKV_EFORMAT;
    }
    r->events++;
    if (cJSON_IsArray(choices) && has_text(choices)) {
        r->text_chunks++;
        if (!r->first_token_seen) {
            r->first_token_seen = 1;
            r->first_token_time = now;
        }
    }
    if (cJSON_IsObject(usage)) {
        int64_t v;
        if ((v = count_of(usage, "prompt_tokens")) >= 0) r->prompt_tokens = v;
        if ((v = count_of(usage, "completion_tokens")) >= 0) r->completion_tokens = v;
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(usage, "isokv");
        const cJSON *qm =
            cJSON_IsObject(ix) ? cJSON_GetObjectItemCaseSensitive(ix, "queue_ms") : NULL;
        if (cJSON_IsNumber(qm) && qm->valuedouble >= 0 && qm->valuedouble < 1e12)
            r->queue_s = qm->valuedouble / 1e3;
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
        if (cJSON_IsObject(d) && (v = count_of(d, "cached_tokens")) >= 0) {
            r->cached_tokens = v;
            r->cached_src = IKV_CACHED_OPENAI;
        } else if (r->cached_src != IKV_CACHED_LLAMACPP &&
                   (v = count_of(usage, "num_cached_tokens")) >= 0) {
            r->cached_tokens = v;
            r->cached_src = IKV_CACHED_VLLM_LEGACY;
        }
    }
    if (cJSON_IsObject(timings) && r->cached_src != IKV_CACHED_OPENAI) {
        int64_t v = count_of(timings, "cache_n"), pn = count_of(timings, "prompt_n");
        if (v >= 0) {
            r->cached_tokens = v;
            r->cached_src = IKV_CACHED_LLAMACPP;
        } else if (pn >= 0 && r->prompt_tokens >= pn && r->cached_src == IKV_CACHED_NONE) {
            r->cached_tokens = r->prompt_tokens - pn;
            r->cached_src = IKV_CACHED_LLAMACPP_PROMPT_N;
        }
    }
    cJSON_Delete(j);
    return 0;
}
