/*
 * The load driver: one thread, libcurl's multi interface, many SSE streams.
 *
 *     read the trace -> records[] (trace order, block keys kept)
 *     loop:  launch what may start  ->  curl_multi_perform  ->  finished transfers -> records
 *            curl_multi_poll(until the next arrival or 50 ms)
 *
 * What may start:
 *   closed loop  while fewer than C are in flight: the first unsent request (trace order) whose
 *                session has nothing in flight. With C = 1 the server sees exactly the trace
 *                order, which is what `isokv sim --mode order` replays.
 *   open loop    every unsent request whose trace time / rate has come, whose session has
 *                nothing in flight (a conversation's turns stay in order: a late turn waits for
 *                the one before it), up to max_inflight.
 * Sessions are the trace's (WEKA conversation, segments session); a request without one is a
 * session of its own.
 *
 * Every transfer has a total and a connect timeout (CURLOPT_TIMEOUT_MS), so the loop ends in
 * bounded time whatever the server does: an unreachable server, a stalled stream, a non-OpenAI
 * body or a 4xx/5xx is recorded with its class and detail, and the run goes on.
 *
 * Memory: a slot per concurrent transfer owns its easy handle, header list, body buffer, SSE
 * parser and a copy of the first 64 KiB of the raw body (for error messages and non-streamed
 * replies); slots are reused, so a long run allocates only when a body outgrows its buffer.
 */
#include "isokv/load.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RAW_KEEP   (64u << 10)
#define MAX_EVENT  (1u << 20)
#define NO_SESSION UINT32_MAX

void ikv_load_opts_default(ikv_load_opts *o) {
    memset(o, 0, sizeof *o);
    o->url = "http://127.0.0.1:8000";
    o->tenant_mode = IKV_TENANT_SALT;
    o->tenant_prefix = "tenant-";
    o->concurrency = 1;
    o->rate = 1.0;
    o->timeout = 60;
    o->connect_timeout = 5;
    o->send_public = 1;
    o->include_usage = 1;
    o->max_inflight = 256;
    ikv_load_map_default(&o->map);
}

const char *ikv_load_err_name(ikv_load_err e) {
    static const char *const names[IKV_LOAD_N_ERR] = {
        "ok", "http", "connect", "timeout", "bad_reply", "transport", "not_sent", "too_long"};
    return (unsigned)e < IKV_LOAD_N_ERR ? names[e] : "?";
}

/* ---- a growable text buffer --------------------------------------------------------------------
 */

typedef struct tbuf {
    char *p;
    size_t len, cap;
    int oom;
} tbuf;

static void tb_reserve(tbuf *b, size_t extra) {
    if (b->oom || b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = ikv_realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void tb_put(tbuf *b, const char *s, size_t n) {
    tb_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void tb_str(tbuf *b, const char *s) {
    tb_put(b, s, strlen(s));
}

static void tb_u64(tbuf *b, uint64_t v) {
    char t[24];
    int n = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    tb_put(b, t, (size_t)n);
}

/* A JSON string literal of s (quotes included; control characters escaped). */
static void tb_json_str(tbuf *b, const char *s) {
    tb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            tb_put(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            tb_put(b, e, 6);
        } else {
            tb_put(b, (const char *)&c, 1);
        }
    }
    tb_put(b, "\"", 1);
}

/* ---- slots -------------------------------------------------------------------------------------
 */

typedef struct slot {
    CURL *easy;
    struct curl_slist *hdrs;
    tbuf body;
    char *raw; /* first RAW_KEEP bytes of the reply body */
    size_t raw_len;
    ikv_sse *sse;
    ikv_load_reply reply;
    int sse_rc; /* first SSE/chunk error (stops the transfer) */
    char sse_err[160];
    ikv_load_record *rec;
    uint32_t session; /* dense session index or NO_SESSION */
    double t0;        /* run start (ikv_now) */
    int busy;
} slot;

typedef struct run {
    const ikv_load_opts *o;
    ikv_load_result *r;
    CURLM *multi;
    slot *slots;
    size_t n_slots, inflight;
    uint32_t *session_of; /* (n) dense session of each record, NO_SESSION for none */
    uint8_t *session_busy;
    char url[2048];
    ikv_load_prompt_buf pb;
    uint32_t *ntok; /* scratch ntokens for a record's blocks */
    size_t ntok_cap;
    double t0;
    uint64_t sent, done, skipped;
} run;

static int on_event(void *ctx, const char *data, size_t len) {
    slot *s = ctx;
    if (ikv_load_reply_chunk(&s->reply, data, len, ikv_now())) {
        snprintf(s->sse_err, sizeof s->sse_err, "%s", s->reply.error);
        return IKV_EFORMAT;
    }
    return 0;
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *ctx) {
    slot *s = ctx;
    size_t n = size * nmemb;
    if (s->raw_len < RAW_KEEP) {
        size_t k = RAW_KEEP - s->raw_len < n ? RAW_KEEP - s->raw_len : n;
        memcpy(s->raw + s->raw_len, p, k);
        s->raw_len += k;
        s->raw[s->raw_len] = 0;
    }
    long status = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status < 200 || status >= 300) return n; /* an error body: kept raw, not parsed as SSE */
    int rc = ikv_sse_feed(s->sse, p, n);
    if (rc) {
        if (!s->sse_err[0]) snprintf(s->sse_err, sizeof s->sse_err, "%s", ikv_errdetail());
        s->sse_rc = rc;
        return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
    }
    return n;
}

static int slot_init(slot *s) {
    memset(s, 0, sizeof *s);
    s->raw = ikv_malloc(RAW_KEEP + 1);
    if (!s->raw) return IKV_ENOMEM;
    int rc = ikv_sse_create(MAX_EVENT, on_event, s, &s->sse);
    if (rc) return rc;
    s->easy = curl_easy_init();
    if (!s->easy) return ikv_error(IKV_ENOMEM, "curl_easy_init failed");
    return 0;
}

static void slot_free(slot *s) {
    if (s->easy) curl_easy_cleanup(s->easy);
    curl_slist_free_all(s->hdrs);
    ikv_sse_destroy(s->sse);
    ikv_free(s->body.p);
    ikv_free(s->raw);
}

/* ---- reading the trace
 * --------------------------------------------------------------------------- */

static int cmp_u64_pair(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

static int read_trace(run *u, ikv_trace *t) {
    ikv_load_result *r = u->r;
    size_t cap = 0;
    ikv_trace_request q;
    int rc;
    while ((rc = ikv_trace_next(t, &q)) == 1) {
        if (u->o->max_tenants && q.tenant >= u->o->max_tenants) continue;
        if (r->n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            ikv_load_record *p = ikv_realloc(r->records, nc * sizeof *p);
            if (!p) return IKV_ENOMEM;
            r->records = p;
            cap = nc;
        }
        ikv_load_record *e = &r->records[r->n];
        memset(e, 0, sizeof *e);
        e->index = q.index;
        e->sent_order = UINT64_MAX;
        e->session = q.session;
        e->tenant = q.tenant;
        e->trace_time = q.time;
        e->first_token = -1;
        e->server_prompt_tokens = e->cached_tokens = e->completion_tokens = -1;
        e->server_queue = -1;
        e->n_keys = (uint32_t)q.n_blocks;
        e->input_tokens = q.input_tokens;
        e->output_tokens = q.output_tokens;
        e->n_public_blocks = (uint32_t)q.n_public_blocks;
        e->last_ntokens =
            q.n_blocks ? (q.ntokens ? q.ntokens[q.n_blocks - 1] : r->trace_block_tokens) : 0;
        if (q.n_blocks) {
            e->keys = ikv_malloc(q.n_blocks * sizeof *e->keys);
            if (!e->keys) return IKV_ENOMEM;
            memcpy(e->keys, q.keys, q.n_blocks * sizeof *e->keys);
            /* only the last block may be partial (all readers): checked, since prompts rely on it
             */
            for (size_t i = 0; q.ntokens && i + 1 < q.n_blocks; i++)
                if (q.ntokens[i] != r->trace_block_tokens)
                    return ikv_error(IKV_EFORMAT,
                                     "request %llu: block %zu of %zu has %u tokens "
                                     "(only the last block may be partial)",
                                     (unsigned long long)q.index, i, q.n_blocks, q.ntokens[i]);
        }
        r->n++;
    }
    if (rc < 0) return rc;
    if (!r->n) return ikv_error(IKV_EEMPTY, "the trace has no requests to send");
    /* dense session indices: sort (session key, record) pairs */
    uint64_t *pairs = ikv_malloc(r->n * 2 * sizeof *pairs);
    u->session_of = ikv_malloc(r->n * sizeof *u->session_of);
    u->session_busy = ikv_calloc(r->n, 1);
    if (!pairs || !u->session_of || !u->session_busy) {
        ikv_free(pairs);
        return IKV_ENOMEM;
    }
    size_t np = 0;
    for (size_t i = 0; i < r->n; i++) {
        u->session_of[i] = NO_SESSION;
        const ikv_load_record *e = &r->records[i];
        if (!e->session) continue;
        pairs[2 * np] = e->session * UINT64_C(0x100000001b3) ^ e->tenant;
        pairs[2 * np + 1] = i;
        np++;
    }
    qsort(pairs, np, 2 * sizeof *pairs, cmp_u64_pair);
    uint32_t dense = 0;
    for (size_t k = 0; k < np; k++) {
        if (k && pairs[2 * k] != pairs[2 * k - 2]) dense++;
        u->session_of[pairs[2 * k + 1]] = dense;
    }
    ikv_free(pairs);
    return 0;
}

/* ---- sending --------------------------------------------------------------------------------- */

/* Builds the prompt and the JSON body of record e into s->body. */
static int build_body(run *u, slot *s, ikv_load_record *e) {
    const ikv_load_opts *o = u->o;
    uint32_t bt = u->r->trace_block_tokens;
    if (e->n_keys > u->ntok_cap) {
        uint32_t *p = ikv_realloc(u->ntok, e->n_keys * sizeof *p);
        if (!p) return IKV_ENOMEM;
        u->ntok = p;
        u->ntok_cap = e->n_keys;
    }
    for (uint32_t i = 0; i < e->n_keys; i++)
        u->ntok[i] = bt;
    if (e->n_keys) u->ntok[e->n_keys - 1] = e->last_ntokens;
    ikv_trace_request q = {.time = e->trace_time,
                     .index = e->index,
                     .tenant = e->tenant,
                     .session = e->session,
                     .input_tokens = e->input_tokens,
                     .output_tokens = e->output_tokens,
                     .n_blocks = e->n_keys,
                     .keys = e->keys,
                     .ntokens = u->ntok,
                     .n_public_blocks = e->n_public_blocks};
    int rc = ikv_load_prompt(&o->map, &q, bt, &u->pb);
    if (rc) return rc;
    e->prompt_tokens = (uint32_t)u->pb.n;
    e->full_blocks = u->pb.full_blocks;
    e->block_tokens = u->pb.block_tokens;
    e->public_tokens = u->pb.public_tokens;
    e->max_tokens = u->pb.max_tokens;

    tbuf *b = &s->body;
    b->len = 0;
    tb_reserve(b, u->pb.n * 4 + 512);
    tb_str(b, "{");
    if (o->model) {
        tb_str(b, "\"model\":");
        tb_json_str(b, o->model);
        tb_str(b, ",");
    }
    tb_str(b, "\"prompt\":[");
    for (size_t i = 0; i < u->pb.n; i++) {
        if (i) tb_put(b, ",", 1);
        tb_u64(b, u->pb.tokens[i]);
    }
    tb_str(b, "],\"max_tokens\":");
    tb_u64(b, e->max_tokens);
    tb_str(b, ",\"temperature\":0,\"stream\":true");
    if (o->include_usage) tb_str(b, ",\"stream_options\":{\"include_usage\":true}");
    if (o->ignore_eos) tb_str(b, ",\"ignore_eos\":true");
    if (o->tenant_mode == IKV_TENANT_SALT) {
        char salt[160];
        snprintf(salt, sizeof salt, "%s%u", o->tenant_prefix ? o->tenant_prefix : "", e->tenant);
        tb_str(b, ",\"cache_salt\":");
        tb_json_str(b, salt);
    }
    if (o->send_public && e->public_tokens) {
        tb_str(b, ",\"isokv\":{\"public_prefix_tokens\":");
        tb_u64(b, e->public_tokens);
        tb_str(b, "}");
    }
    tb_str(b, "}");
    return b->oom ? ikv_error(IKV_ENOMEM, "request body of %zu tokens", u->pb.n) : 0;
}

/* Sends record idx on slot s. Returns 0 (sent), 1 (too long for max_context: recorded, not
 * sent) or a negative error. */
static int launch(run *u, slot *s, size_t idx) {
    const ikv_load_opts *o = u->o;
    ikv_load_record *e = &u->r->records[idx];
    int rc = build_body(u, s, e);
    if (rc) return rc;
    if (o->max_context && (uint64_t)e->prompt_tokens + e->max_tokens > o->max_context) {
        e->err = IKV_LOAD_TOO_LONG;
        snprintf(e->detail, sizeof e->detail, "prompt %u + max_tokens %u > --max-context %u",
                 e->prompt_tokens, e->max_tokens, o->max_context);
        u->skipped++;
        u->done++;
        if (o->progress) o->progress(o->progress_ctx, u->done, u->r->n);
        return 1;
    }
    CURL *h = s->easy;
    curl_easy_reset(h);
    curl_slist_free_all(s->hdrs);
    s->hdrs = NULL;
    struct curl_slist *l = curl_slist_append(NULL, "Content-Type: application/json");
    if (l) l = curl_slist_append(l, "Accept: text/event-stream");
    char auth[400];
    const char *key = NULL;
    char tk[200];
    if (o->tenant_mode == IKV_TENANT_KEY) {
        snprintf(tk, sizeof tk, "%s%u", o->tenant_prefix ? o->tenant_prefix : "", e->tenant);
        key = tk;
    } else if (o->api_key) {
        key = o->api_key;
    }
    if (key && l) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
        l = curl_slist_append(l, auth);
    }
    if (!l) return ikv_error(IKV_ENOMEM, "curl header list");
    s->hdrs = l;
    curl_easy_setopt(h, CURLOPT_URL, u->url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, s->body.p);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)s->body.len);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, s->hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_PRIVATE, s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(o->timeout * 1000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(o->connect_timeout * 1000));
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    ikv_load_reply_init(&s->reply);
    s->raw_len = 0;
    s->raw[0] = 0;
    s->sse_rc = 0;
    s->sse_err[0] = 0;
    ikv_sse_destroy(s->sse);
    s->sse = NULL;
    if ((rc = ikv_sse_create(MAX_EVENT, on_event, s, &s->sse))) return rc;
    s->rec = e;
    s->session = u->session_of[idx];
    s->busy = 1;
    e->send = ikv_now() - u->t0;
    e->sent_order = u->sent++;
    if (curl_multi_add_handle(u->multi, h) != CURLM_OK)
        return ikv_error(IKV_EIO, "curl_multi_add_handle failed");
    if (s->session != NO_SESSION) u->session_busy[s->session] = 1;
    u->inflight++;
    return 0;
}

/* The "message" of an OpenAI error body, or the start of the body. */
static void error_detail(char *out, size_t cap, const char *raw, size_t len) {
    cJSON *j = len ? cJSON_ParseWithLength(raw, len) : NULL;
    const cJSON *e = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
    if (cJSON_IsString(m))
        snprintf(out, cap, "%s", m->valuestring);
    else if (len) {
        snprintf(out, cap, "non-OpenAI error body: %.80s", raw);
        for (char *p = out; *p; p++)
            if ((unsigned char)*p < 0x20) *p = ' ';
    } else
        snprintf(out, cap, "empty body");
    cJSON_Delete(j);
}

static void finish(run *u, slot *s, CURLcode cc) {
    ikv_load_record *e = s->rec;
    double now = ikv_now();
    e->end = now - u->t0;
    long status = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &status);
    e->status = status;
    ikv_load_reply *rp = &s->reply;
    if (cc == CURLE_OK && status >= 200 && status < 300 && !s->sse_rc) {
        /* a last event without the blank line after it */
        int frc = ikv_sse_finish(s->sse);
        if (frc) {
            s->sse_rc = frc;
            if (!s->sse_err[0]) snprintf(s->sse_err, sizeof s->sse_err, "%s", ikv_errdetail());
            cc = CURLE_WRITE_ERROR;
        }
    }
    if (cc == CURLE_WRITE_ERROR && s->sse_rc) {
        e->err = IKV_LOAD_BAD_REPLY;
        snprintf(e->detail, sizeof e->detail, "%s", s->sse_err);
    } else if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
               cc == CURLE_COULDNT_RESOLVE_PROXY) {
        e->err = IKV_LOAD_CONNECT;
        snprintf(e->detail, sizeof e->detail, "%s", curl_easy_strerror(cc));
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
        e->err = IKV_LOAD_TIMEOUT;
        snprintf(e->detail, sizeof e->detail, "no complete reply within %.3g s", u->o->timeout);
    } else if (cc != CURLE_OK) {
        e->err = IKV_LOAD_TRANSPORT;
        snprintf(e->detail, sizeof e->detail, "%s", curl_easy_strerror(cc));
    } else if (status < 200 || status >= 300) {
        e->err = IKV_LOAD_HTTP;
        error_detail(e->detail, sizeof e->detail, s->raw, s->raw_len);
    } else if (!ikv_sse_saw_data(s->sse)) {
        /* not a stream: accept one plain OpenAI completion object */
        ikv_load_reply_init(rp);
        if (s->raw_len >= RAW_KEEP) {
            e->err = IKV_LOAD_BAD_REPLY;
            snprintf(e->detail, sizeof e->detail, "not an event stream, and over %u bytes",
                     RAW_KEEP);
        } else if (ikv_load_reply_chunk(rp, s->raw, s->raw_len, now) || rp->prompt_tokens < 0) {
            e->err = IKV_LOAD_BAD_REPLY;
            snprintf(e->detail, sizeof e->detail, "not an OpenAI completion (%.160s)",
                     rp->error[0] ? rp->error : "no usage");
        } else {
            rp->streamed = 0;
            rp->first_token_time = now;
            rp->first_token_seen = 1;
        }
    } else if (!rp->done) {
        e->err = IKV_LOAD_BAD_REPLY;
        snprintf(e->detail, sizeof e->detail, "the stream ended without data: [DONE]");
    } else if (!rp->events) {
        e->err = IKV_LOAD_BAD_REPLY;
        snprintf(e->detail, sizeof e->detail, "no completion chunk before [DONE]");
    }
    /* a stream without usage is still a completion: its cached tokens count as not reported
       (summary.json's reported_cached says how many did) */
    if (!e->err) {
        e->server_prompt_tokens = rp->prompt_tokens;
        e->completion_tokens = rp->completion_tokens;
        e->cached_tokens = rp->cached_tokens;
        e->cached_src = rp->cached_src;
        e->server_queue = rp->queue_s;
        e->first_token = rp->first_token_seen ? rp->first_token_time - u->t0 : -1;
    }
    curl_multi_remove_handle(u->multi, s->easy);
    if (s->session != NO_SESSION) u->session_busy[s->session] = 0;
    s->busy = 0;
    s->rec = NULL;
    u->inflight--;
    u->done++;
    if (u->o->progress) u->o->progress(u->o->progress_ctx, u->done, u->r->n);
}

static slot *free_slot(run *u) {
    for (size_t i = 0; i < u->n_slots; i++)
        if (!u->slots[i].busy) return &u->slots[i];
    return NULL;
}

/* Launches what may start now; returns the seconds until the next open-loop arrival that is
 * waiting for its time (or 1 when none), through *wait. */
static int schedule(run *u, size_t *cursor, int stop, double *wait) {
    const ikv_load_opts *o = u->o;
    ikv_load_result *r = u->r;
    *wait = 1.0;
    if (stop) return 0;
    size_t cap = o->closed_loop ? o->concurrency : u->n_slots;
    while (*cursor < r->n &&
           (r->records[*cursor].sent_order != UINT64_MAX || r->records[*cursor].err))
        (*cursor)++;
    double now = ikv_now() - u->t0;
    for (size_t i = *cursor; i < r->n && u->inflight < cap; i++) {
        ikv_load_record *e = &r->records[i];
        if (e->sent_order != UINT64_MAX || e->err != IKV_LOAD_OK) continue;
        if (!o->closed_loop) {
            double due = e->trace_time / o->rate;
            if (due > now) {
                if (due - now < *wait) *wait = due - now;
                break; /* records are in time order: nothing later is due either */
            }
        }
        uint32_t ss = u->session_of[i];
        if (ss != NO_SESSION && u->session_busy[ss]) continue;
        slot *s = free_slot(u);
        if (!s) break;
        int rc = launch(u, s, i);
        if (rc < 0) return rc;
    }
    return 0;
}

int ikv_load_run(ikv_trace *t, const ikv_load_opts *o, ikv_load_result *r) {
    memset(r, 0, sizeof *r);
    if (!o->url || !*o->url) return ikv_error(IKV_EINVAL, "no server URL");
    if (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8))
        return ikv_error(IKV_EINVAL, "URL '%s' is not http:// or https://", o->url);
    if (o->closed_loop && !o->concurrency)
        return ikv_error(IKV_EINVAL, "closed loop needs a concurrency >= 1");
    if (!(o->rate > 0) || !(o->timeout > 0) || !(o->connect_timeout > 0) || o->duration < 0)
        return ikv_error(IKV_EINVAL, "rate, timeout and connect timeout must be > 0");
    uint32_t bt = ikv_trace_block_tokens(t);
    if (!o->map.scale || !bt || bt % o->map.scale)
        return ikv_error(IKV_EINVAL, "--scale %u does not divide the trace's %u-token blocks",
                         o->map.scale, bt);
    r->trace_block_tokens = bt;
    r->block_tokens = bt / o->map.scale;

    run u;
    memset(&u, 0, sizeof u);
    u.o = o;
    u.r = r;
    size_t ul = strlen(o->url);
    while (ul && o->url[ul - 1] == '/')
        ul--;
    /* a base URL gets /v1/completions, one ending in /v1 gets /completions, a full one nothing */
    const char *suffix = "/v1/completions";
    if (ul >= strlen(suffix) && !strncmp(o->url + ul - strlen(suffix), suffix, strlen(suffix)))
        suffix = "";
    else if (ul >= 3 && !strncmp(o->url + ul - 3, "/v1", 3))
        suffix = "/completions";
    if (ul + strlen(suffix) + 1 > sizeof u.url) return ikv_error(IKV_EINVAL, "URL too long");
    snprintf(u.url, sizeof u.url, "%.*s%s", (int)ul, o->url, suffix);

    int rc = read_trace(&u, t);
    if (rc) goto out;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        rc = ikv_error(IKV_EIO, "curl_global_init failed");
        goto out;
    }
    u.multi = curl_multi_init();
    if (!u.multi) {
        rc = ikv_error(IKV_ENOMEM, "curl_multi_init failed");
        goto out_curl;
    }
    u.n_slots = o->closed_loop ? o->concurrency : (o->max_inflight ? o->max_inflight : 256);
    if (u.n_slots > r->n) u.n_slots = r->n;
    u.slots = ikv_calloc(u.n_slots, sizeof *u.slots);
    if (!u.slots) {
        rc = IKV_ENOMEM;
        goto out_curl;
    }
    for (size_t i = 0; i < u.n_slots; i++)
        if ((rc = slot_init(&u.slots[i]))) goto out_curl;

    u.t0 = ikv_now();
    size_t cursor = 0;
    int stop = 0, dirty = 1;
    double wait = 0, due_at = 0;
    while (!(u.inflight == 0 && (stop || u.sent + u.skipped == r->n))) {
        if (!stop && o->duration > 0 && ikv_now() - u.t0 >= o->duration) {
            stop = 1;
            for (size_t i = 0; i < r->n; i++)
                if (r->records[i].sent_order == UINT64_MAX && !r->records[i].err) {
                    r->records[i].err = IKV_LOAD_NOT_SENT;
                    snprintf(r->records[i].detail, sizeof r->records[i].detail,
                             "--duration %.3g s ran out", o->duration);
                }
            if (u.inflight == 0) break;
        }
        /* scan for what may start only when something ended or an arrival time came: a scan
           is O(waiting requests), a wakeup happens per streamed chunk */
        double now = ikv_now() - u.t0;
        if (dirty || now >= due_at) {
            if ((rc = schedule(&u, &cursor, stop, &wait))) goto out_curl;
            dirty = 0;
            due_at = o->closed_loop ? INFINITY : now + wait;
        }
        wait = due_at - now;
        if (wait < 0) wait = 0;
        int running = 0;
        curl_multi_perform(u.multi, &running);
        CURLMsg *m;
        int left;
        int finished = 0;
        while ((m = curl_multi_info_read(u.multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            slot *s = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            finish(&u, s, m->data.result);
            finished = 1;
            dirty = 1;
        }
        if (finished) continue; /* something may start now */
        if (u.inflight == 0 && (stop || u.sent + u.skipped == r->n)) break;
        /* wait may be INFINITY (closed loop: only a completion starts anything): clamp first */
        int ms = wait < 0.05 ? (int)(wait * 1000) : 50;
        if (o->duration > 0 && !stop) {
            double left_s = o->duration - (ikv_now() - u.t0);
            if (left_s * 1000 < ms) ms = left_s > 0 ? (int)(left_s * 1000) : 0;
        }
        if (u.inflight)
            curl_multi_poll(u.multi, NULL, 0, ms, NULL);
        else if (ms > 0) {
            struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    r->sent = u.sent;
    ikv_load_summarize(r);
    rc = 0;
out_curl:
    if (u.slots) {
        for (size_t i = 0; i < u.n_slots; i++) {
            if (u.slots[i].busy && u.multi) curl_multi_remove_handle(u.multi, u.slots[i].easy);
            slot_free(&u.slots[i]);
        }
    }
    if (u.multi) curl_multi_cleanup(u.multi);
    curl_global_cleanup();
out:
    ikv_free(u.slots);
    ikv_free(u.session_of);
    ikv_free(u.session_busy);
    ikv_free(u.ntok);
    ikv_load_prompt_free(&u.pb);
    if (rc) ikv_load_result_free(r);
    return rc;
}

void ikv_load_result_free(ikv_load_result *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n; i++)
        ikv_free(r->records[i].keys);
    ikv_free(r->records);
    memset(r, 0, sizeof *r);
}
