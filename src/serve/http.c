/*
 * The HTTP side of isokv serve: libmicrohttpd with one thread per connection, the OpenAI API
 * (request parsing, validation, responses, server-sent events; a list of prompts is one
 * sequence per prompt, answered together), tenants by API key, and the
 * server's lifecycle (create, drain, destroy).
 *
 * A completion request is parsed and checked here (every bad field is a 400 naming it), turned
 * into a srq (tokens, limits, sampler settings, tenant scope) and queued for the scheduler
 * (sched.c). Its connection thread then waits on the request's condition variable: for a
 * plain response until it is done, for a stream it sends each new piece of text as an SSE
 * chunk from a response callback. A client that goes away (seen by a zero-byte peek on the
 * socket while waiting, or by a failed write) cancels its request, which unlocks its blocks at
 * the scheduler's next turn.
 *
 * Error bodies are OpenAI's {"error": {"message", "type", "param", "code"}}.
 */
#include "internal.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

void ikv_serve_options_default(ikv_serve_options *o) {
    memset(o, 0, sizeof *o);
    o->model = "data/models/stories260K/stories260K.bin";
    o->tokenizer = "data/models/stories260K/tok512.bin";
    o->host = "127.0.0.1";
    o->port = 8000;
    o->threads = 1;
    o->policy = "lru";
    o->max_seqs = 32;
    o->max_batch_tokens = 256;
    o->max_body = 1 << 20;
    o->log = stderr;
}

/* ---- requests: references -------------------------------------------------------------- */

static void srq_free(srq *r) {
    if (!r) return;
    ikv_free(r->tenant), ikv_free(r->scope), ikv_free(r->tokens), ikv_free(r->user);
    ikv_free(r->all);
    ikv_free(r->segs), ikv_free(r->seg_hits);
    for (int i = 0; i < r->nstop; i++)
        ikv_free(r->stop[i]);
    ikv_free(r->text);
    ikv_free(r->otok);
    ikv_free(r->cand), ikv_free(r->dbuf);
    pthread_cond_destroy(&r->cv);
    srq *l = r->leader;
    ikv_free(r);
    if (l && --l->refs == 0) srq_free(l);
}

void ikv__srq_unref(ikv_serve *s, srq *r) {
    (void)s;
    IKV_ASSERT(r->refs > 0);
    if (--r->refs == 0) srq_free(r);
}

static char *dupstr(const char *p) {
    size_t n = strlen(p) + 1;
    char *q = ikv_malloc(n);
    if (q) memcpy(q, p, n);
    return q;
}

/* ---- responses --------------------------------------------------------------------------- */

typedef struct conn {
    ikv_serve *s;
    char *body;
    size_t n, cap;
    int too_large, responded;
    const char *tenant; /* points into s->keys, or "default" */
    const char *hdr_class, *hdr_slo; /* X-Isokv-Class, X-Isokv-Slo-Ms (NULL: absent) */
    int answering; /* counted in s->answering: queued, its answer not yet fully sent */
} conn;

static const char *status_type(int status) {
    switch (status) {
    case 401:
        return "authentication_error";
    case 429:
        return "rate_limit_error";
    case 500:
    case 503:
        return "server_error";
    default:
        return "invalid_request_error";
    }
}

/* Queues a response with a malloc'd body (taken over), counting it in the metrics. */
static enum MHD_Result respond(struct MHD_Connection *c, conn *cx, int status, char *body,
                               size_t len, const char *ctype, const char *hdr, const char *val) {
    struct MHD_Response *rs =
        MHD_create_response_from_buffer_with_free_callback(len, body, ikv_free);
    if (!rs) {
        ikv_free(body);
        return MHD_NO;
    }
    MHD_add_response_header(rs, "Content-Type", ctype);
    if (hdr) MHD_add_response_header(rs, hdr, val);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, rs);
    MHD_destroy_response(rs);
    pthread_mutex_lock(&cx->s->mu);
    ikv__metrics_response(cx->s, cx->tenant, status);
    pthread_mutex_unlock(&cx->s->mu);
    cx->responded = 1;
    return ret;
}

static enum MHD_Result respond_json(struct MHD_Connection *c, conn *cx, int status, cJSON *j,
                                    const char *hdr, const char *val) {
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!txt) return MHD_NO;
    size_t len = strlen(txt);
    char *body = ikv_malloc(len + 1);
    if (!body) {
        cJSON_free(txt);
        return MHD_NO;
    }
    memcpy(body, txt, len + 1);
    cJSON_free(txt);
    return respond(c, cx, status, body, len, "application/json", hdr, val);
}

/* An OpenAI error object; logs one line for the rejected request. */
static enum MHD_Result error_full(struct MHD_Connection *c, conn *cx, int status, const char *param,
                                  const char *code, const char *hdr, const char *val,
                                  const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static enum MHD_Result error_full(struct MHD_Connection *c, conn *cx, int status, const char *param,
                                  const char *code, const char *hdr, const char *val,
                                  const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status_type(status));
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    if (cx->s->opt.log) {
        fprintf(cx->s->opt.log, "isokv serve: req=- tenant=%s status=%d error=%s\n",
                cx->tenant ? cx->tenant : "-", status, msg);
        fflush(cx->s->opt.log);
    }
    return respond_json(c, cx, status, j, hdr, val);
}
#define ERR(status, param, code, ...)                                                              \
    error_full(c, cx, status, param, code, NULL, NULL, __VA_ARGS__)

/* ---- request parsing ---------------------------------------------------------------------- */

/* Encodes text, splitting off the --public-prefix text when the text starts with it (so the
 * public part tokenizes the same in every request). Returns 0 or an error; *pub gets the
 * public token count. */
static int encode_text(ikv_serve *s, const char *text, const char *pub_text, size_t pub_len,
                       uint32_t **out, size_t *n, size_t *pub) {
    size_t len = strlen(text), cap = len + 8;
    uint32_t *t = ikv_malloc(sizeof(uint32_t) * cap);
    if (!t) return IKV_ENOMEM;
    size_t a = 0, b = 0;
    int rc = 0;
    *pub = 0;
    if (pub_len && len >= pub_len && !memcmp(text, pub_text, pub_len)) {
        char *head = ikv_malloc(pub_len + 1);
        if (!head) rc = IKV_ENOMEM;
        if (!rc) {
            memcpy(head, text, pub_len);
            head[pub_len] = 0;
            rc = ikv_tokenizer_encode(s->tok, head, 1, 0, t, cap, &a);
            ikv_free(head);
        }
        if (!rc && text[pub_len])
            rc = ikv_tokenizer_encode(s->tok, text + pub_len, 0, 0, t + a, cap - a, &b);
        *pub = a;
    } else {
        rc = ikv_tokenizer_encode(s->tok, text, 1, 0, t, cap, &a);
    }
    if (rc) {
        ikv_free(t);
        return rc;
    }
    *out = t, *n = a + b;
    return 0;
}

/* Text of a chat message's content: a string, or an array of {"type": "text", "text": ...}
 * parts (concatenated). NULL if it is neither. */
static char *content_text(const cJSON *ct) {
    if (cJSON_IsString(ct)) return dupstr(ct->valuestring);
    if (!cJSON_IsArray(ct)) return NULL;
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, ct) {
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(tx)) return NULL;
        len += strlen(tx->valuestring);
    }
    char *out = ikv_malloc(len + 1);
    if (!out) return NULL;
    out[0] = 0;
    cJSON_ArrayForEach(p, ct) strcat(out, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    return out;
}

/* A growing string. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;
static int sb_add(sbuf *b, const char *a, const char *m, const char *z) {
    const char *parts[3] = {a, m, z};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(parts[i]);
        if (b->n + k + 1 > b->cap) {
            size_t cap = (b->cap + k + 1) * 2;
            char *q = ikv_realloc(b->p, cap);
            if (!q) return IKV_ENOMEM;
            b->p = q, b->cap = cap;
        }
        memcpy(b->p + b->n, parts[i], k + 1);
        b->n += k;
    }
    return 0;
}

/* "isokv": {"segments": [{"kind", "text" or "tokens", "public", "reusable", "movable"}]}:
 * the segments' tokens concatenated into r->tokens (a BOS segment first when the first has text),
 * r->segs pointing into them, the leading public segments as r->public_tokens. Returns 0,
 * IKV_ENOMEM, or IKV_EINVAL with msg naming the segment and field. */
static int parse_segments(ikv_serve *s, const cJSON *a, srq *r, char *msg, size_t msz) {
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0)
        return snprintf(msg, msz, "isokv.segments must be a non-empty list"), IKV_EINVAL;
    size_t ns = (size_t)cJSON_GetArraySize(a), n = 0, cap = 0;
    if (ns > 256) return snprintf(msg, msz, "isokv.segments: at most 256 segments"), IKV_EINVAL;
    /* text first: BOS as a segment of its own (public), so that no reusable segment's tokens
     * depend on whether it comes first */
    const size_t bos = cJSON_GetObjectItemCaseSensitive(a->child, "text") != NULL;
    if (!(r->segs = ikv_calloc(ns + bos, sizeof *r->segs))) return IKV_ENOMEM;
    size_t *off = ikv_calloc(ns + bos, sizeof *off);
    if (!off) return IKV_ENOMEM;
    if (bos) {
        if (!(r->tokens = ikv_malloc(sizeof *r->tokens * 16))) return ikv_free(off), IKV_ENOMEM;
        r->tokens[0] = IKV_TOK_BOS, cap = 16, n = 1, off[0] = 0;
        r->segs[0] = (ikv_prompt_seg){IKV_PSEG_SYSTEM, NULL, 1, 1, 0, 0};
        r->public_tokens = 1;
    }
    int rc = 0, lead = 1;
    size_t i = 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, a) {
        ikv_prompt_seg *o = &r->segs[i + bos];
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(g, "kind"),
                    *tx = cJSON_GetObjectItemCaseSensitive(g, "text"),
                    *tk = cJSON_GetObjectItemCaseSensitive(g, "tokens");
        const char *fl[3] = {"public", "reusable", "movable"};
        int *fv[3] = {&o->is_public, &o->reusable, &o->movable};
        if (!cJSON_IsObject(g) || !cJSON_IsString(k) || ikv_pseg_kind_parse(k->valuestring, &o->kind)) {
            snprintf(msg, msz, "isokv.segments[%zu].kind must be one of system, tool, memory, "
                     "doc, history, query", i);
            rc = IKV_EINVAL;
            break;
        }
        for (int q = 0; q < 3 && !rc; q++) {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(g, fl[q]);
            if (b && !cJSON_IsBool(b)) {
                snprintf(msg, msz, "isokv.segments[%zu].%s must be a boolean", i, fl[q]);
                rc = IKV_EINVAL;
            }
            *fv[q] = b && cJSON_IsTrue(b);
        }
        if (rc) break;
        if (!!tx == !!tk || (tx && (!cJSON_IsString(tx) || !tx->valuestring[0])) ||
            (tk && (!cJSON_IsArray(tk) || cJSON_GetArraySize(tk) == 0))) {
            snprintf(msg, msz, "isokv.segments[%zu] needs exactly one of a non-empty \"text\" or "
                     "\"tokens\" list", i);
            rc = IKV_EINVAL;
            break;
        }
        size_t need = tx ? strlen(tx->valuestring) + 3 : (size_t)cJSON_GetArraySize(tk);
        if (n + need > cap) {
            size_t nc = (n + need) * 2;
            uint32_t *t2 = ikv_realloc(r->tokens, nc * sizeof *t2);
            if (!t2) {
                rc = IKV_ENOMEM;
                break;
            }
            r->tokens = t2, cap = nc;
        }
        size_t got = 0;
        if (tx) {
            if (ikv_tokenizer_encode(s->tok, tx->valuestring, 0, 0, r->tokens + n, need,
                                     &got)) {
                snprintf(msg, msz, "isokv.segments[%zu].text: %s", i, ikv_errdetail());
                rc = IKV_EINVAL;
                break;
            }
        } else {
            const cJSON *x;
            cJSON_ArrayForEach(x, tk) {
                if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= s->vocab ||
                    x->valuedouble != (double)(long)x->valuedouble) {
                    snprintf(msg, msz, "isokv.segments[%zu].tokens[%zu] is not a token id below "
                             "%u", i, got, s->vocab);
                    rc = IKV_EINVAL;
                    break;
                }
                r->tokens[n + got++] = (uint32_t)x->valuedouble;
            }
            if (rc) break;
        }
        off[i + bos] = n, o->n = got, n += got;
        if (lead && o->is_public) r->public_tokens += got;
        else lead = 0;
        i++;
    }
    if (!rc) {
        for (size_t q = 0; q < ns + bos; q++)
            r->segs[q].tokens = r->tokens + off[q];
        r->nsegs = ns + bos, r->n = n;
    }
    ikv_free(off);
    return rc;
}

/* Chat messages as segments ("isokv": {"segments": "messages"}, or any message carrying an
 * "isokv" object): each message is one segment, its text as the chat template renders it
 * (system and developer: "TEXT\n\n", kind system, public under --public-system; user and
 * assistant before the last user message: "User: TEXT\n" / "Assistant: TEXT\n", kind history;
 * tool: "Tool: TEXT\n", kind tool; the last user message and what follows it: kind query, the
 * reply cue "Assistant:" appended to the final segment). A message's "isokv": {"kind",
 * "public", "reusable", "movable"} overrides its kind and flags (a retrieved document: "kind":
 * "doc", "reusable": true). Then parse_segments as for an explicit list. Returns 0, IKV_ENOMEM,
 * or IKV_EINVAL with msg and *param naming the message and field. */
static int messages_segments(ikv_serve *s, const cJSON *msgs, srq *r, char *msg, size_t msz,
                             const char **param) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return snprintf(msg, msz, "messages must be a non-empty list"), IKV_EINVAL;
    int nm = cJSON_GetArraySize(msgs), last_user = -1, i = 0, rc = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *ro = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(ro) && !strcmp(ro->valuestring, "user")) last_user = i;
        i++;
    }
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return IKV_ENOMEM;
    i = 0;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *ro = cJSON_GetObjectItemCaseSensitive(m, "role"),
                    *x = cJSON_GetObjectItemCaseSensitive(m, "isokv");
        char *text = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"));
        if (!cJSON_IsString(ro) || !text) {
            ikv_free(text);
            snprintf(msg, msz,
                     "messages[%d] needs a string role and a string (or text parts) "
                     "content",
                     i);
            rc = IKV_EINVAL;
            break;
        }
        const char *role = ro->valuestring, *kind = "history", *pre = "", *post = "\n";
        int pub = 0;
        if (!strcmp(role, "system") || !strcmp(role, "developer"))
            kind = "system", post = "\n\n", pub = s->opt.public_system;
        else if (!strcmp(role, "user"))
            pre = "User: ", kind = i >= last_user ? "query" : "history";
        else if (!strcmp(role, "assistant"))
            pre = "Assistant: ", kind = i > last_user ? "query" : "history";
        else if (!strcmp(role, "tool"))
            pre = "Tool: ", kind = i > last_user ? "query" : "tool";
        else {
            ikv_free(text);
            snprintf(msg, msz,
                     "messages[%d].role must be system, developer, user, assistant or "
                     "tool",
                     i);
            rc = IKV_EINVAL;
            break;
        }
        sbuf t = {0};
        rc = sb_add(&t, pre, text, post);
        if (!rc && i == nm - 1) rc = sb_add(&t, "Assistant:", "", "");
        ikv_free(text);
        cJSON *g = rc ? NULL : cJSON_CreateObject();
        if (!g || !cJSON_AddStringToObject(g, "text", t.p)) {
            ikv_free(t.p), cJSON_Delete(g);
            rc = IKV_ENOMEM;
            break;
        }
        ikv_free(t.p);
        cJSON_AddItemToArray(arr, g);
        int fl[3] = {pub, 0, 0};
        const char *fn[3] = {"public", "reusable", "movable"};
        if (x && !cJSON_IsNull(x)) {
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, "kind");
            int kd;
            if (!cJSON_IsObject(x) ||
                (k && (!cJSON_IsString(k) || ikv_pseg_kind_parse(k->valuestring, &kd)))) {
                snprintf(msg, msz,
                         "messages[%d].isokv must be an object whose kind is one of "
                         "system, tool, memory, doc, history, query",
                         i);
                *param = "messages.isokv";
                rc = IKV_EINVAL;
                break;
            }
            if (k) kind = k->valuestring;
            for (int q = 0; q < 3 && !rc; q++) {
                const cJSON *b = cJSON_GetObjectItemCaseSensitive(x, fn[q]);
                if (b && !cJSON_IsBool(b)) {
                    snprintf(msg, msz, "messages[%d].isokv.%s must be a boolean", i, fn[q]);
                    *param = "messages.isokv";
                    rc = IKV_EINVAL;
                }
                if (b) fl[q] = cJSON_IsTrue(b);
            }
            if (rc) break;
        }
        if (!cJSON_AddStringToObject(g, "kind", kind)) rc = IKV_ENOMEM;
        for (int q = 0; q < 3 && !rc; q++)
            if (!cJSON_AddBoolToObject(g, fn[q], fl[q])) rc = IKV_ENOMEM;
        if (rc) break;
        i++;
    }
    if (!rc) {
        rc = parse_segments(s, arr, r, msg, msz);
        if (rc == IKV_EINVAL) { /* name the message, not the derived segment */
            char *p = strstr(msg, "isokv.segments[");
            if (p) {
                char tail[256];
                snprintf(tail, sizeof tail, "messages[%s", p + strlen("isokv.segments["));
                snprintf(p, msz - (size_t)(p - msg), "%s", tail);
            }
        }
    }
    cJSON_Delete(arr);
    return rc;
}

/* What bounds s->max_fit, for the error message (in buf). */
static const char *fit_why(const ikv_serve *s, char *buf, size_t n) {
    if (s->max_fit == s->seq_len) return "the model's context";
    snprintf(buf, n, "the KV budget of %u private blocks: --kv-mem / --max-seqs", s->fit_blocks);
    return buf;
}

/* Parses the request body into r, with prompt number `which` of a list of prompts; *nprompts
 * gets how many the request has. Returns 0, or an HTTP status with msg/param filled. */
static int parse_request(ikv_serve *s, conn *cx, int chat, srq *r, int which, int *nprompts,
                         char *msg, size_t msz, const char **param, const char **code) {
    cJSON *j = cJSON_ParseWithLength(cx->body ? cx->body : "", cx->n);
    int st = 400;
    *param = NULL, *code = NULL;
#define BAD(p, ...)                                                                                \
    do {                                                                                           \
        *param = p;                                                                                \
        snprintf(msg, msz, __VA_ARGS__);                                                           \
        goto out;                                                                                  \
    } while (0)
    if (!j)
        BAD(NULL, "request body is not valid JSON (near byte %zu)",
            cJSON_GetErrorPtr() && cx->body ? (size_t)(cJSON_GetErrorPtr() - cx->body) : 0);
    if (!cJSON_IsObject(j)) BAD(NULL, "request body must be a JSON object");
    const cJSON *f;
    f = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f)) BAD("model", "model must be a string");
        if (strcmp(f->valuestring, s->model_name) && strcmp(f->valuestring, s->model_path)) {
            st = 404;
            *code = "model_not_found";
            BAD("model", "the model '%s' does not exist; this server serves '%s'", f->valuestring,
                s->model_name);
        }
    }
    f = cJSON_GetObjectItemCaseSensitive(j, "n");
    if (f && !cJSON_IsNull(f) && (!cJSON_IsNumber(f) || f->valuedouble != 1))
        BAD("n", "n must be 1 (several choices per request are not supported)");
    f = cJSON_GetObjectItemCaseSensitive(j, "echo");
    if (f && !cJSON_IsNull(f) && !cJSON_IsFalse(f)) BAD("echo", "echo is not supported");
    f = cJSON_GetObjectItemCaseSensitive(j, "logprobs");
    if (f && !cJSON_IsNull(f) && !cJSON_IsFalse(f)) BAD("logprobs", "logprobs is not supported");
    f = cJSON_GetObjectItemCaseSensitive(j, "best_of");
    if (f && !cJSON_IsNull(f) && (!cJSON_IsNumber(f) || f->valuedouble != 1))
        BAD("best_of", "best_of must be 1");
    f = cJSON_GetObjectItemCaseSensitive(j, "stream");
    if (f && !cJSON_IsNull(f) && !cJSON_IsBool(f)) BAD("stream", "stream must be a boolean");
    r->stream = cJSON_IsTrue(f);
    f = cJSON_GetObjectItemCaseSensitive(j, "ignore_eos"); /* vLLM's extension */
    if (f && !cJSON_IsNull(f) && !cJSON_IsBool(f))
        BAD("ignore_eos", "ignore_eos must be a boolean");
    r->ignore_eos = cJSON_IsTrue(f);
    f = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsObject(f)) BAD("stream_options", "stream_options must be an object");
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
        if (u && !cJSON_IsBool(u))
            BAD("stream_options.include_usage", "stream_options.include_usage must be a boolean");
        r->include_usage = cJSON_IsTrue(u);
    }
    r->temperature = 1.0f, r->top_p = 1.0f;
    f = cJSON_GetObjectItemCaseSensitive(j, "temperature");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || f->valuedouble < 0 || f->valuedouble > 2)
            BAD("temperature", "temperature must be a number in [0, 2]");
        r->temperature = (float)f->valuedouble;
    }
    f = cJSON_GetObjectItemCaseSensitive(j, "top_p");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || f->valuedouble <= 0 || f->valuedouble > 1)
            BAD("top_p", "top_p must be a number in (0, 1]");
        r->top_p = (float)f->valuedouble;
    }
    r->seed = (uint64_t)time(NULL) ^ (r->id * UINT64_C(0x9e3779b97f4a7c15));
    f = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || f->valuedouble != (double)(int64_t)f->valuedouble)
            BAD("seed", "seed must be an integer");
        r->seed = (uint64_t)(int64_t)f->valuedouble;
    }
    f = cJSON_GetObjectItemCaseSensitive(j, "user");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f)) BAD("user", "user must be a string");
        if (!(r->user = dupstr(f->valuestring))) goto oom;
    }
    f = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (f && !cJSON_IsNull(f)) {
        if (cJSON_IsString(f)) {
            if (!f->valuestring[0]) BAD("stop", "stop strings must not be empty");
            if (!(r->stop[r->nstop++] = dupstr(f->valuestring))) goto oom;
        } else if (cJSON_IsArray(f)) {
            if (cJSON_GetArraySize(f) > SRV_MAX_STOP) BAD("stop", "stop holds at most 4 strings");
            const cJSON *x;
            cJSON_ArrayForEach(x, f) {
                if (!cJSON_IsString(x) || !x->valuestring[0])
                    BAD("stop", "stop must be a string or a list of non-empty strings");
                if (!(r->stop[r->nstop++] = dupstr(x->valuestring))) goto oom;
            }
        } else {
            BAD("stop", "stop must be a string or a list of strings");
        }
    }
    const char *salt = NULL;
    f = cJSON_GetObjectItemCaseSensitive(j, "cache_salt");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f) || !f->valuestring[0])
            BAD("cache_salt", "cache_salt must be a non-empty string");
        salt = f->valuestring;
    }
    long declared_pub = -1;
    const cJSON *segs = NULL;
    f = cJSON_GetObjectItemCaseSensitive(j, "isokv");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsObject(f)) BAD("isokv", "isokv must be an object");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(f, "public_prefix_tokens");
        if (p && !cJSON_IsNull(p)) {
            if (!cJSON_IsNumber(p) || p->valuedouble < 0 ||
                p->valuedouble != (double)(long)p->valuedouble)
                BAD("isokv.public_prefix_tokens",
                    "isokv.public_prefix_tokens must be a non-negative integer");
            declared_pub = (long)p->valuedouble;
        }
        segs = cJSON_GetObjectItemCaseSensitive(f, "segments");
        if (segs && cJSON_IsNull(segs)) segs = NULL;
        const cJSON *br = cJSON_GetObjectItemCaseSensitive(f, "blend_ratio");
        r->blend_ratio = -1;
        if (br && !cJSON_IsNull(br)) {
            if (!cJSON_IsNumber(br) || !(br->valuedouble >= 0 && br->valuedouble <= 1))
                BAD("isokv.blend_ratio", "isokv.blend_ratio must be a number in [0, 1]");
            r->blend_ratio = (float)br->valuedouble;
        }
    }
    int from_messages = 0; /* chat: the messages mapped to segments (messages_segments) */
    if (segs && cJSON_IsString(segs)) {
        if (!chat || strcmp(segs->valuestring, "messages"))
            BAD("isokv.segments", "isokv.segments must be a list of segments%s",
                chat ? " or the string \"messages\"" : "");
        from_messages = 1, segs = NULL;
    }
    /* the request class and latency target: the isokv fields, else the headers */
    const char *cls = cx->hdr_class, *cls_param = "X-Isokv-Class";
    r->slo_ms = 0;
    if (cx->hdr_slo) {
        char *end;
        double v = strtod(cx->hdr_slo, &end);
        if (end == cx->hdr_slo || *end || !(v > 0) || v > 1e9)
            BAD("X-Isokv-Slo-Ms", "header X-Isokv-Slo-Ms '%.40s' is not a positive number of ms",
                cx->hdr_slo);
        r->slo_ms = v;
    }
    if (f && cJSON_IsObject(f)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(f, "class");
        if (c && !cJSON_IsNull(c)) {
            if (!cJSON_IsString(c)) BAD("isokv.class", "isokv.class must be a string");
            cls = c->valuestring, cls_param = "isokv.class";
        }
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(f, "slo_ms");
        if (l && !cJSON_IsNull(l)) {
            if (!cJSON_IsNumber(l) || !(l->valuedouble > 0) || l->valuedouble > 1e9)
                BAD("isokv.slo_ms", "isokv.slo_ms must be a positive number of milliseconds");
            r->slo_ms = l->valuedouble;
        }
    }
    ikv_req_class rc_cls = IKV_CLASS_MEDIUM; /* the default class */
    r->has_class = cls != NULL;
    if (cls && ikv_req_class_parse(cls, &rc_cls))
        BAD(cls_param, "%s '%.40s' is not simple, medium or complex", cls_param, cls);
    r->cls = (int)rc_cls;
    ikv__route_request(s, r, rc_cls); /* the step and its levers; asserts the hard cap */
    r->prio = r->route.step;
    /* speculative decoding: the server's defaults for requests whose routed step allows it
     * (route.c: step 3 or above on the walk, a point with a draft on the frontier), then the
     * request's own switches, which may turn a lever off but never on past its step */
    r->spec.ngram = s->opt.spec_k ? s->opt.spec_ngram : 3;
    r->spec.k = s->opt.spec_k ? s->opt.spec_k : 1;
    r->spec.min_ngram = s->opt.spec_k ? s->opt.spec_min : 2;
    r->spec.lookup = s->opt.spec_k > 0 && r->lv.spec;
    r->spec.semantic = r->lv.rcache;
    if (f && cJSON_IsObject(f)) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(f, "spec");
        if (sp && !cJSON_IsNull(sp)) {
            if (!cJSON_IsString(sp) ||
                (strcmp(sp->valuestring, "lookup") && strcmp(sp->valuestring, "off")))
                BAD("isokv.spec", "isokv.spec must be \"lookup\" or \"off\"");
            r->spec.lookup = !strcmp(sp->valuestring, "lookup");
        }
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(f, "semantic_cache");
        if (sc && !cJSON_IsNull(sc)) {
            if (!cJSON_IsBool(sc))
                BAD("isokv.semantic_cache", "isokv.semantic_cache must be true or false");
            r->spec.semantic = s->rcache && cJSON_IsTrue(sc); /* needs --semantic-cache */
        }
    }
    r->spec.lookup = r->spec.lookup && r->lv.spec; /* the hard cap (route.c) */
    r->spec.semantic = r->spec.semantic && r->lv.rcache;

    if (segs) {
        if (!s->chunks)
            BAD("isokv.segments", "isokv.segments needs fp32 weights; this server's model is "
                                  "int8 (chunk reuse blends fp32 products)");
        if (cJSON_GetObjectItemCaseSensitive(j, chat ? "messages" : "prompt"))
            BAD("isokv.segments", "isokv.segments replaces %s: give one of them",
                chat ? "messages" : "prompt");
        char sm[256];
        int sr = parse_segments(s, segs, r, sm, sizeof sm);
        if (sr == IKV_ENOMEM) goto oom;
        if (sr) BAD("isokv.segments", "%s", sm);
        *nprompts = 1;
        goto prompt_done;
    }
    if (chat && !from_messages) { /* a message with isokv flags asks for the mapping too */
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(j, "messages"))
            if (cJSON_GetObjectItemCaseSensitive(m, "isokv")) from_messages = 1;
    }
    if (from_messages) {
        if (!s->chunks)
            BAD("messages", "messages as segments (isokv flags) need fp32 weights; this server's "
                            "model is int8 (chunk reuse blends fp32 products)");
        char sm[256];
        const char *bad_param = "messages";
        int sr = messages_segments(s, cJSON_GetObjectItemCaseSensitive(j, "messages"), r, sm,
                                   sizeof sm, &bad_param);
        if (sr == IKV_ENOMEM) goto oom;
        if (sr) BAD(bad_param, "%s", sm);
        *nprompts = 1;
        goto prompt_done;
    }
    /* the prompt */
    int rc = 0;
    if (!chat) {
        f = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        if (!f) BAD("prompt", "prompt is required");
        const cJSON *p = f;
        *nprompts = 1;
        if (cJSON_IsArray(f) && cJSON_GetArraySize(f) >= 1 &&
            (cJSON_IsString(f->child) || cJSON_IsArray(f->child))) {
            /* ["text", ...] or [[ids], ...]: one choice per prompt */
            *nprompts = cJSON_GetArraySize(f);
            if (*nprompts > SRV_MAX_PROMPTS)
                BAD("prompt", "prompt holds %d prompts; at most %d per request", *nprompts,
                    SRV_MAX_PROMPTS);
            p = cJSON_GetArrayItem(f, which);
            if (!cJSON_IsString(p) && !cJSON_IsArray(p))
                BAD("prompt", "prompt[%d] must be a string or a list of token ids", which);
        }
        if (cJSON_IsString(p)) {
            if (!p->valuestring[0]) BAD("prompt", "prompt must not be empty");
            rc = encode_text(s, p->valuestring, s->public_text, s->public_len, &r->tokens, &r->n,
                             &r->public_tokens);
            r->public_from_file = !rc && r->public_tokens > 0;
        } else if (cJSON_IsArray(p)) {
            int k = cJSON_GetArraySize(p), i = 0;
            if (k == 0) BAD("prompt", "prompt must not be empty");
            if (!(r->tokens = ikv_malloc(sizeof(uint32_t) * (size_t)k))) goto oom;
            const cJSON *x;
            cJSON_ArrayForEach(x, p) {
                if (!cJSON_IsNumber(x) || x->valuedouble < 0 ||
                    x->valuedouble != (double)(long)x->valuedouble)
                    BAD("prompt", "prompt[%d] is not a token id (a non-negative integer)", i);
                if (x->valuedouble >= s->vocab)
                    BAD("prompt", "prompt[%d] is token %ld, outside the vocabulary of %u", i,
                        (long)x->valuedouble, s->vocab);
                r->tokens[i++] = (uint32_t)x->valuedouble;
            }
            r->n = (size_t)k;
        } else {
            BAD("prompt", "prompt must be a string, a list of strings or a list of token ids");
        }
    } else {
        f = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) == 0)
            BAD("messages", "messages must be a non-empty list");
        sbuf sys = {0}, rest = {0};
        const cJSON *m;
        int i = 0, bad = 0;
        cJSON_ArrayForEach(m, f) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            char *text = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"));
            if (!cJSON_IsString(role) || !text) {
                ikv_free(text);
                bad = 1;
                break;
            }
            const char *ro = role->valuestring;
            if (!strcmp(ro, "system") || !strcmp(ro, "developer"))
                rc = sb_add(&sys, "", text, "\n\n");
            else if (!strcmp(ro, "user"))
                rc = sb_add(&rest, "User: ", text, "\n");
            else if (!strcmp(ro, "assistant"))
                rc = sb_add(&rest, "Assistant: ", text, "\n");
            else
                bad = 2;
            ikv_free(text);
            if (bad || rc) break;
            i++;
        }
        if (!rc && !bad) rc = sb_add(&rest, "Assistant:", "", "");
        if (!rc && !bad) {
            if (s->opt.public_system && sys.n) {
                /* the system part alone is the public prefix */
                sbuf all = {0};
                rc = sb_add(&all, sys.p, rest.p, "");
                if (!rc)
                    rc = encode_text(s, all.p, sys.p, sys.n, &r->tokens, &r->n, &r->public_tokens);
                ikv_free(all.p);
            } else {
                sbuf all = {0};
                rc = sb_add(&all, sys.p ? sys.p : "", rest.p, "");
                if (!rc)
                    rc = encode_text(s, all.p, s->public_text, s->public_len, &r->tokens, &r->n,
                                     &r->public_tokens);
                r->public_from_file = !rc && r->public_tokens > 0;
                ikv_free(all.p);
            }
        }
        ikv_free(sys.p), ikv_free(rest.p);
        if (bad == 1)
            BAD("messages", "messages[%d] needs a string role and a string (or text parts) content",
                i);
        if (bad == 2) BAD("messages", "messages[%d].role must be system, user or assistant", i);
    }
    if (rc == IKV_ENOMEM) goto oom;
    if (rc) BAD("prompt", "cannot tokenize the prompt: %s", ikv_errdetail());
prompt_done:
    if (declared_pub >= 0) {
        if ((size_t)declared_pub > r->n)
            BAD("isokv.public_prefix_tokens",
                "isokv.public_prefix_tokens is %ld, more than the prompt's %zu tokens",
                declared_pub, r->n);
        r->public_tokens = (size_t)declared_pub;
        r->public_from_file = 0;
    }
    /* A request that could never be admitted is refused here, before anything is queued or a
     * stream starts: the prompt and the tokens it asks for must fit the model's context and the
     * private KV budget (s->max_fit positions; admission counts the blocks of prompt + limit
     * that are not cached, so a request within max_fit always fits once the others end, and
     * whether one is refused never depends on what the cache holds). */
    char why[96];
    if (r->n >= s->max_fit) {
        *code = "context_length_exceeded";
        BAD(chat ? "messages" : "prompt",
            "the prompt is %zu tokens; this server holds at most %u positions per request (%s) "
            "and room for at least one generated token is needed",
            r->n, s->max_fit, fit_why(s, why, sizeof why));
    }
    /* max_tokens: completions default 16 (OpenAI's), chat the rest of what fits; a default is
     * cut to what fits, an explicit value that does not fit is refused */
    long maxt = chat ? (long)(s->max_fit - r->n) : 16;
    const char *mname = chat ? "max_completion_tokens" : "max_tokens";
    f = cJSON_GetObjectItemCaseSensitive(j, mname);
    if (chat && !f) f = cJSON_GetObjectItemCaseSensitive(j, mname = "max_tokens");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || f->valuedouble < 1 ||
            f->valuedouble != (double)(long)f->valuedouble || f->valuedouble > 1e9)
            BAD(mname, "%s must be a positive integer", mname);
        maxt = (long)f->valuedouble;
        if ((size_t)maxt > s->max_fit - r->n) {
            *code = "context_length_exceeded";
            BAD(mname,
                "the prompt is %zu tokens and %s asks for %ld more, %zu in all; this server holds "
                "at most %u positions per request (%s)",
                r->n, mname, maxt, r->n + (size_t)maxt, s->max_fit, fit_why(s, why, sizeof why));
        }
    }
    if ((size_t)maxt > s->max_fit - r->n) maxt = (long)(s->max_fit - r->n);
    r->max_tokens = (uint32_t)maxt;
    /* the engine's scope: tenant, and the salt when given */
    {
        sbuf sc = {0};
        if (sb_add(&sc, cx->tenant, salt ? "\x1f" : "", salt ? salt : "")) goto oom;
        r->scope = sc.p;
        if (!(r->tenant = dupstr(cx->tenant))) goto oom;
    }
    st = 0;
    goto out;
oom:
    st = 500;
    snprintf(msg, msz, "out of memory");
out:
#undef BAD
    cJSON_Delete(j);
    return st;
}

/* ---- answers ----------------------------------------------------------------------------- */

/* The usage of a request's prompts g[0..n) (summed; ttft_ms of the first prompt). */
static void add_usage(const ikv_serve *s, cJSON *parent, srq *const *g, int n) {
    double pt = 0, ct = 0, ca = 0, pa = 0, pub = 0;
    for (int i = 0; i < n; i++)
        pt += (double)g[i]->n, ct += g[i]->ntok, ca += (double)g[i]->cached,
            pa += (double)g[i]->partial, pub += (double)g[i]->public_tokens;
    const srq *r = g[0];
    cJSON *u = cJSON_AddObjectToObject(parent, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", pt);
    cJSON_AddNumberToObject(u, "completion_tokens", ct);
    cJSON_AddNumberToObject(u, "total_tokens", pt + ct);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", ca);
    cJSON *x = cJSON_AddObjectToObject(u, "isokv");
    cJSON *bt = cJSON_AddObjectToObject(x, "cached_tokens_by_tier");
    double rec = 0, lossy = 0;
    for (size_t t = 0; t <= s->n_tiers; t++) {
        double v = 0;
        for (int i = 0; i < n; i++)
            v += (double)g[i]->tier_tokens[t];
        cJSON_AddNumberToObject(bt, s->tier_name[t], v);
    }
    for (int i = 0; i < n; i++)
        rec += (double)g[i]->tier_recomputed, lossy += (double)g[i]->lossy;
    if (s->n_tiers) {
        cJSON_AddNumberToObject(x, "tier_recomputed_tokens", rec);
        cJSON_AddNumberToObject(x, "lossy_cached_tokens", lossy);
    }
    cJSON_AddNumberToObject(x, "partial_block_tokens", pa);
    cJSON_AddNumberToObject(x, "computed_prompt_tokens", pt - ca);
    cJSON_AddNumberToObject(x, "public_prompt_tokens", pub);
    cJSON_AddNumberToObject(x, "ttft_ms", r->t_first > 0 ? (r->t_first - r->t_arrive) * 1e3 : 0);
    /* waiting for admission (a sequence slot, the private budget): the cache is looked up then */
    cJSON_AddNumberToObject(x, "queue_ms", r->t_admit > 0 ? (r->t_admit - r->t_arrive) * 1e3 : 0);
    cJSON_AddStringToObject(x, "tenant", r->tenant);
    double cpu = 0;
    for (int i = 0; i < n; i++)
        cpu += g[i]->cpu_s;
    cJSON_AddNumberToObject(x, "cpu_ms", cpu * 1e3);
    double pre = 0, recomp = 0;
    for (int i = 0; i < n; i++)
        pre += g[i]->preemptions, recomp += (double)g[i]->recomputed;
    cJSON_AddNumberToObject(x, "preemptions", pre);
    cJSON_AddNumberToObject(x, "preempted_recomputed_tokens", recomp);
    cJSON *ro = cJSON_AddObjectToObject(x, "route");
    cJSON_AddStringToObject(ro, "class", ikv_req_class_name((ikv_req_class)r->cls));
    cJSON_AddBoolToObject(ro, "class_given", r->has_class);
    cJSON_AddStringToObject(ro, "router", s->opt.route_frontier ? "frontier" : "walk");
    cJSON_AddNumberToObject(ro, "step", r->route.step);
    cJSON_AddStringToObject(ro, "step_name", ikv__route_step_name(s, r));
    if (s->opt.route_frontier) cJSON_AddNumberToObject(ro, "point", r->route.point);
    cJSON_AddStringToObject(ro, "config", ikv__route_config(s, r));
    /* the levers the step set, and what the engine did: the most threads of any step */
    cJSON_AddNumberToObject(ro, "threads", r->lv.threads);
    cJSON_AddBoolToObject(ro, "speculation_allowed", r->lv.spec);
    cJSON_AddBoolToObject(ro, "response_cache_allowed", r->lv.rcache);
    int tmax = 0;
    double ts = 0;
    for (int i = 0; i < n; i++) {
        if (g[i]->threads_max > tmax) tmax = g[i]->threads_max;
        ts += g[i]->thread_s;
    }
    cJSON_AddNumberToObject(ro, "threads_used", tmax);
    cJSON_AddNumberToObject(ro, "thread_ms", ts * 1e3);
    cJSON_AddNumberToObject(ro, "max_step", r->route.max_step);
    cJSON_AddNumberToObject(ro, "class_cap", r->route.class_cap);
    if (r->slo_ms > 0) {
        cJSON_AddNumberToObject(ro, "slo_ms", r->slo_ms);
        cJSON_AddBoolToObject(ro, "slo_met_on_walk", r->route.slo_met);
    }
    cJSON_AddNumberToObject(ro, "priority", r->prio);
    if (r->segs) {
        const ikv_blend_info *b = &r->blend;
        cJSON_AddNumberToObject(x, "reusable_tokens", (double)b->reusable_tokens);
        cJSON_AddNumberToObject(x, "reused_tokens", (double)b->reused_tokens);
        cJSON_AddNumberToObject(x, "recomputed_tokens", (double)b->recomputed_tokens);
        cJSON_AddNumberToObject(x, "chunk_hits", (double)b->hit_segments);
        cJSON_AddNumberToObject(x, "blend_deviation_max", b->deviation_max);
        cJSON_AddBoolToObject(x, "blended", !b->full);
        cJSON_AddNumberToObject(x, "prefix_cached_tokens", (double)b->prefix_cached_tokens);
        cJSON_AddNumberToObject(x, "blend_step_ms_max", r->blend_step_s * 1e3);
        cJSON_AddNumberToObject(x, "blend_turns", (double)r->blend_turns);
    }
    cJSON *sp = cJSON_AddObjectToObject(x, "speculative");
    cJSON_AddStringToObject(sp, "spec", r->spec.lookup ? "lookup" : "off");
    cJSON_AddBoolToObject(sp, "semantic_cache", r->spec.semantic);
    cJSON_AddNumberToObject(sp, "draft_steps", (double)r->spec_steps);
    cJSON_AddNumberToObject(sp, "draft_tokens", (double)r->spec_draft);
    cJSON_AddNumberToObject(sp, "accepted_tokens", (double)r->spec_accepted);
    if (r->sem_done) {
        cJSON *sc = cJSON_AddObjectToObject(x, "semantic_cache");
        cJSON_AddNumberToObject(sc, "candidates", (double)r->sem_cands);
        cJSON_AddNumberToObject(sc, "accepted_tokens", (double)r->sem_accepted);
        cJSON_AddNumberToObject(sc, "rejected_tokens", (double)r->sem_rejected);
        cJSON_AddNumberToObject(sc, "decode_steps_saved", (double)r->sem_saved);
    }
}

/* The skeleton every answer and chunk shares. */
static cJSON *answer_head(ikv_serve *s, const srq *r, const char *object) {
    char id[48];
    snprintf(id, sizeof id, "%s-%016llx", r->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(r->id * UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)r->t_arrive));
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)(long)r->t_arrive_wall);
    cJSON_AddStringToObject(j, "model", s->model_name);
    return j;
}

/* A finished request's answer (not streamed): one choice per prompt. */
static cJSON *answer_full(ikv_serve *s, srq *const *g, int n) {
    const srq *r0 = g[0];
    cJSON *j = answer_head(s, r0, r0->chat ? "chat.completion" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < n; i++) {
        const srq *r = g[i];
        cJSON *c0 = cJSON_CreateObject();
        cJSON_AddItemToArray(ch, c0);
        cJSON_AddNumberToObject(c0, "index", i);
        char *text = ikv_malloc(r->tlen + 1);
        if (text) {
            memcpy(text, r->text ? r->text : "", r->tlen);
            text[r->tlen] = 0;
        }
        if (r->chat) {
            cJSON *m = cJSON_AddObjectToObject(c0, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", text ? text : "");
        } else {
            cJSON_AddStringToObject(c0, "text", text ? text : "");
        }
        ikv_free(text);
        cJSON_AddNullToObject(c0, "logprobs");
        cJSON_AddStringToObject(c0, "finish_reason", r->finish ? r->finish : "length");
    }
    add_usage(s, j, g, n);
    return j;
}

/* Is the peer of fd gone? A zero-byte peek means it closed its side. */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLNVAL)) return 1;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Waits on r->cv for up to 100 ms (mu held). */
static void wait_a_bit(ikv_serve *s, srq *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&r->cv, &s->mu, &ts);
}

/* Cancels r on behalf of its client (mu held). */
static void cancel(ikv_serve *s, srq *r) {
    if (r->state != SRQ_DONE) {
        r->cancelled = 1;
        pthread_cond_signal(&s->sched_cv);
    }
}

/* ---- server-sent events -------------------------------------------------------------------- */

typedef struct stream {
    ikv_serve *s;
    srq *g[SRV_MAX_PROMPTS]; /* the request's prompts; g[0] leads */
    int n;
    int fd;
    int phase;                    /* 0: before the first chunk, 1: text, 2: all written */
    size_t sent[SRV_MAX_PROMPTS]; /* text bytes sent per prompt */
    int fin[SRV_MAX_PROMPTS];     /* finish chunk sent */
    sbuf out;
    size_t off;
} stream;

/* Appends "data: <json>\n\n" (deletes j). */
static int sse_json(stream *st, cJSON *j) {
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!txt) return IKV_ENOMEM;
    int rc = sb_add(&st->out, "data: ", txt, "\n\n");
    cJSON_free(txt);
    return rc;
}

/* A chunk of choice `index` carrying text (or a role / finish chunk). */
static cJSON *chunk(stream *st, int index, const char *text, int role, const char *finish) {
    const srq *r = st->g[0];
    cJSON *j = answer_head(st->s, r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(j, "choices"), *c0 = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c0);
    cJSON_AddNumberToObject(c0, "index", index);
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(c0, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c0, "text", text ? text : "");
    }
    cJSON_AddNullToObject(c0, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c0, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c0, "finish_reason");
    if (r->include_usage) cJSON_AddNullToObject(j, "usage");
    return j;
}

/* Cancels every prompt of a stream (mu held). */
static void cancel_all(ikv_serve *s, srq *const *g, int n) {
    for (int i = 0; i < n; i++)
        cancel(s, g[i]);
}

/* Fills st->out with what is new (mu held). Returns 1 when something was added, 0 when the
 * stream is over, -1 to abort (client gone, out of memory). */
static int sse_fill(stream *st) {
    ikv_serve *s = st->s;
    for (;;) {
        if (st->phase == 2) return 0;
        if (st->phase == 0 && st->g[0]->chat) {
            st->phase = 1;
            if (sse_json(st, chunk(st, 0, "", 1, NULL))) return -1;
            return 1;
        }
        int added = 0, all = 1;
        for (int i = 0; i < st->n; i++) {
            srq *r = st->g[i];
            if (r->tlen > st->sent[i]) {
                st->phase = 1;
                char *t = ikv_malloc(r->tlen - st->sent[i] + 1);
                if (!t) return -1;
                memcpy(t, r->text + st->sent[i], r->tlen - st->sent[i]);
                t[r->tlen - st->sent[i]] = 0;
                st->sent[i] = r->tlen;
                int rc = sse_json(st, chunk(st, i, t, 0, NULL));
                ikv_free(t);
                if (rc) return -1;
                added = 1;
            }
            if (!st->fin[i] && r->state == SRQ_DONE) {
                if (r->status != 200) { /* an error event ends the whole stream */
                    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
                    cJSON_AddStringToObject(e, "message", r->err[0] ? r->err : "request failed");
                    cJSON_AddStringToObject(e, "type", status_type(r->status));
                    cJSON_AddNullToObject(e, "param");
                    cJSON_AddNullToObject(e, "code");
                    cancel_all(s, st->g, st->n);
                    int rc = sse_json(st, j);
                    if (!rc) rc = sb_add(&st->out, "data: [DONE]\n\n", "", "");
                    st->phase = 2;
                    return rc ? -1 : 1;
                }
                if (sse_json(
                        st, chunk(st, i, r->chat ? NULL : "", 0, r->finish ? r->finish : "length")))
                    return -1;
                st->fin[i] = 1;
                added = 1;
            }
            all &= st->fin[i];
        }
        if (all) {
            int rc = 0;
            if (st->g[0]->include_usage) {
                cJSON *j = answer_head(
                    s, st->g[0], st->g[0]->chat ? "chat.completion.chunk" : "text_completion");
                cJSON_AddArrayToObject(j, "choices");
                add_usage(st->s, j, st->g, st->n);
                rc = sse_json(st, j);
            }
            if (!rc) rc = sb_add(&st->out, "data: [DONE]\n\n", "", "");
            st->phase = 2;
            return rc ? -1 : 1;
        }
        if (added) return 1;
        if (s->stopping) return 0;
        if (peer_gone(st->fd)) {
            cancel_all(s, st->g, st->n);
            return -1;
        }
        wait_a_bit(s, st->g[0]);
    }
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    if (st->off == st->out.n) {
        st->off = st->out.n = 0;
        pthread_mutex_lock(&st->s->mu);
        int rc = sse_fill(st);
        pthread_mutex_unlock(&st->s->mu);
        if (rc < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (rc == 0 && st->out.n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t k = st->out.n - st->off < max ? st->out.n - st->off : max;
    memcpy(buf, st->out.p + st->off, k);
    st->off += k;
    return (ssize_t)k;
}

/* The response is gone (finished, or the client went away): cancel what still runs. */
static void sse_free(void *cls) {
    stream *st = cls;
    pthread_mutex_lock(&st->s->mu);
    cancel_all(st->s, st->g, st->n);
    for (int i = st->n - 1; i >= 0; i--)
        ikv__srq_unref(st->s, st->g[i]);
    pthread_mutex_unlock(&st->s->mu);
    ikv_free(st->out.p);
    ikv_free(st);
}

/* ---- routes ------------------------------------------------------------------------------ */

/* The tenant of the request's Authorization header; NULL (with a 401 queued) if refused. */
static const char *tenant_of(ikv_serve *s, struct MHD_Connection *c) {
    if (!s->nkeys) return "default";
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return NULL;
    h += 7;
    for (size_t i = 0; i < s->nkeys; i++)
        if (!strcmp(s->keys[i].key, h)) return s->keys[i].tenant;
    return NULL;
}

/* Drops the HTTP thread's references to g[0..n) (mu held), members first. */
static void unref_all(ikv_serve *s, srq *const *g, int n) {
    for (int i = n - 1; i >= 0; i--)
        ikv__srq_unref(s, g[i]);
}

static enum MHD_Result completion(ikv_serve *s, struct MHD_Connection *c, conn *cx, int chat) {
    srq *g[SRV_MAX_PROMPTS];
    int n = 1;
    cx->hdr_class = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Isokv-Class");
    cx->hdr_slo = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Isokv-Slo-Ms");
    for (int i = 0; i < n; i++) {
        srq *r = ikv_calloc(1, sizeof *r);
        if (!r) {
            for (int k = i - 1; k >= 0; k--)
                srq_free(g[k]);
            return ERR(500, NULL, NULL, "out of memory");
        }
        pthread_cond_init(&r->cv, NULL);
        r->wake = i ? &g[0]->cv : &r->cv;
        if (i) {
            r->leader = g[0];
            g[0]->refs++;
        }
        r->chat = chat;
        r->refs = 1;
        r->status = 200;
        r->t_arrive = ikv_now();
        r->t_arrive_wall = (double)time(NULL);
        pthread_mutex_lock(&s->mu);
        r->id = ++s->next_id;
        pthread_mutex_unlock(&s->mu);
        g[i] = r;
        char msg[512];
        const char *param, *code;
        int st = parse_request(s, cx, chat, r, i, &n, msg, sizeof msg, &param, &code);
        if (st) {
            for (int k = i; k >= 0; k--)
                srq_free(g[k]);
            return error_full(c, cx, st, param, code, NULL, NULL, "%s", msg);
        }
    }
    pthread_mutex_lock(&s->mu);
    if (!s->ready || s->draining || s->stopping) {
        pthread_mutex_unlock(&s->mu);
        for (int k = n - 1; k >= 0; k--)
            srq_free(g[k]);
        return ERR(503, NULL, "unavailable", "the server is %s",
                   s->ready ? "shutting down" : "not ready");
    }
    if (s->nqueue + (size_t)n > s->opt.max_queue) {
        size_t q = s->nqueue;
        pthread_mutex_unlock(&s->mu);
        for (int k = n - 1; k >= 0; k--)
            srq_free(g[k]);
        return error_full(c, cx, 429, NULL, "queue_full", "Retry-After", "1",
                          "%zu requests are waiting for admission (--max-queue); retry later", q);
    }
    for (int i = 0; i < n; i++) {
        srq *r = g[i];
        r->refs++; /* the scheduler's */
        if (s->qtail)
            s->qtail->qnext = r;
        else
            s->qhead = r;
        s->qtail = r;
        s->nqueue++;
    }
    pthread_cond_signal(&s->sched_cv);
    cx->answering = 1, s->answering++; /* until on_done: the drain waits for the last bytes */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    if (g[0]->stream) {
        pthread_mutex_unlock(&s->mu);
        stream *sst = ikv_calloc(1, sizeof *sst);
        struct MHD_Response *rs =
            sst ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, sst, sse_free)
                : NULL;
        if (!rs) {
            pthread_mutex_lock(&s->mu);
            cancel_all(s, g, n);
            unref_all(s, g, n);
            pthread_mutex_unlock(&s->mu);
            ikv_free(sst);
            return MHD_NO;
        }
        sst->s = s, sst->n = n, sst->fd = fd;
        memcpy(sst->g, g, sizeof(srq *) * (size_t)n);
        MHD_add_response_header(rs, "Content-Type", "text/event-stream");
        MHD_add_response_header(rs, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, rs);
        MHD_destroy_response(rs);
        pthread_mutex_lock(&s->mu);
        ikv__metrics_response(s, cx->tenant, 200);
        pthread_mutex_unlock(&s->mu);
        cx->responded = 1;
        return ret;
    }
    for (int i = 0; i < n; i++)
        while (g[i]->state != SRQ_DONE) {
            if (s->stopping || peer_gone(fd)) {
                cancel_all(s, g, n);
                unref_all(s, g, n);
                pthread_mutex_unlock(&s->mu);
                return MHD_NO; /* nobody to answer */
            }
            wait_a_bit(s, g[0]);
        }
    int status = 200;
    char err[256] = "";
    for (int i = 0; i < n && status == 200; i++)
        if (g[i]->status != 200) {
            status = g[i]->status;
            snprintf(err, sizeof err, "%s", g[i]->err);
        }
    cJSON *j = status == 200 ? answer_full(s, g, n) : NULL;
    unref_all(s, g, n);
    pthread_mutex_unlock(&s->mu);
    if (status != 200) return ERR(status, NULL, NULL, "%s", err);
    return respond_json(c, cx, 200, j, NULL, NULL);
}

static enum MHD_Result route(ikv_serve *s, struct MHD_Connection *c, conn *cx, const char *url,
                             const char *method) {
    static const struct {
        const char *path, *method;
    } routes[] = {{"/v1/completions", "POST"},
                  {"/v1/chat/completions", "POST"},
                  {"/v1/models", "GET"},
                  {"/health", "GET"},
                  {"/metrics", "GET"}};
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(url, routes[i].path)) k = i;
    if (k < 0) return ERR(404, NULL, "not_found", "no route for %s %s", method, url);
    if (strcmp(method, routes[k].method))
        return error_full(c, cx, 405, NULL, "method_not_allowed", "Allow", routes[k].method,
                          "%s takes %s, not %s", url, routes[k].method, method);
    if (k == 3) {
        pthread_mutex_lock(&s->mu);
        int ready = s->ready && !s->draining;
        pthread_mutex_unlock(&s->mu);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", ready ? "ok" : s->draining ? "draining" : "loading");
        return respond_json(c, cx, ready ? 200 : 503, j, NULL, NULL);
    }
    if (k == 4) {
        size_t len = 0;
        pthread_mutex_lock(&s->mu);
        char *t = ikv__metrics_text(s, &len);
        pthread_mutex_unlock(&s->mu);
        if (!t) return ERR(500, NULL, NULL, "out of memory");
        return respond(c, cx, 200, t, len, "text/plain; version=0.0.4", NULL, NULL);
    }
    /* /v1/...: the tenant first */
    cx->tenant = tenant_of(s, c);
    if (!cx->tenant)
        return ERR(401, NULL, "invalid_api_key",
                   "missing or unknown API key (send Authorization: Bearer KEY)");
    if (cx->too_large)
        return ERR(413, NULL, "request_too_large", "request body is larger than %zu bytes",
                   s->opt.max_body);
    if (k == 2) {
        cJSON *j = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(j, "data"),
              *m = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON_AddItemToArray(d, m);
        cJSON_AddStringToObject(m, "id", s->model_name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "isokv");
        cJSON_AddNumberToObject(m, "max_model_len", s->seq_len);
        return respond_json(c, cx, 200, j, NULL, NULL);
    }
    return completion(s, c, cx, k == 1);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **ctx) {
    (void)version;
    ikv_serve *s = cls;
    conn *cx = *ctx;
    if (!cx) {
        if (!(cx = ikv_calloc(1, sizeof *cx))) return MHD_NO;
        cx->s = s;
        *ctx = cx;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->opt.max_body) cx->too_large = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cx->too_large && cx->n + *upload_size > s->opt.max_body) cx->too_large = 1;
        if (!cx->too_large) {
            if (cx->n + *upload_size + 1 > cx->cap) {
                size_t cap = (cx->n + *upload_size + 1) * 2;
                char *b = ikv_realloc(cx->body, cap);
                if (!b) return MHD_NO;
                cx->body = b, cx->cap = cap;
            }
            memcpy(cx->body + cx->n, upload, *upload_size);
            cx->n += *upload_size;
            cx->body[cx->n] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cx->responded) return MHD_YES;
    return route(s, c, cx, url, method);
}

static void on_done(void *cls, struct MHD_Connection *c, void **ctx,
                    enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    conn *cx = *ctx;
    if (!cx) return;
    if (cx->answering) {
        pthread_mutex_lock(&cx->s->mu);
        cx->s->answering--;
        pthread_cond_broadcast(&cx->s->idle_cv);
        pthread_mutex_unlock(&cx->s->mu);
    }
    ikv_free(cx->body);
    ikv_free(cx);
    *ctx = NULL;
}

/* ---- lifecycle --------------------------------------------------------------------------- */

/* Reads a whole file (NUL-terminated). */
static int read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return ikv_error(IKV_EIO, "%s: cannot open: %s", path, strerror(errno));
    sbuf b = {0};
    char chunkb[4096];
    size_t k;
    int rc = 0;
    while (!rc && (k = fread(chunkb, 1, sizeof chunkb - 1, f)) > 0) {
        chunkb[k] = 0;
        if (memchr(chunkb, 0, k)) rc = ikv_error(IKV_EFORMAT, "%s: holds a NUL byte", path);
        if (!rc && sb_add(&b, chunkb, "", "")) rc = ikv_error(IKV_ENOMEM, "%s", path);
    }
    if (!rc && ferror(f)) rc = ikv_error(IKV_EIO, "%s: read error", path);
    fclose(f);
    if (rc) {
        ikv_free(b.p);
        return rc;
    }
    if (!b.p && !(b.p = dupstr(""))) return ikv_error(IKV_ENOMEM, "%s", path);
    *out = b.p, *len = b.n;
    return 0;
}

/* --api-keys: a JSON object {"KEY": "tenant", ...}. */
static int load_keys(ikv_serve *s, const char *path) {
    char *txt;
    size_t len;
    int rc = read_file(path, &txt, &len);
    if (rc) return rc;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    ikv_free(txt);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return ikv_error(IKV_EFORMAT, "%s: expected a JSON object {\"KEY\": \"tenant\", ...}",
                         path);
    }
    int n = cJSON_GetArraySize(j);
    if (n == 0) {
        cJSON_Delete(j);
        return ikv_error(IKV_EFORMAT, "%s: no keys", path);
    }
    s->keys = ikv_calloc((size_t)n, sizeof *s->keys);
    if (!s->keys) {
        cJSON_Delete(j);
        return ikv_error(IKV_ENOMEM, "%s", path);
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, j) {
        if (!cJSON_IsString(k) || !k->valuestring[0] || !k->string[0] ||
            strlen(k->valuestring) > 60) {
            rc = ikv_error(IKV_EFORMAT,
                           "%s: key \"%s\": the tenant must be a name of 1..60 characters", path,
                           k->string);
            break;
        }
        srv_key *e = &s->keys[s->nkeys++];
        e->key = dupstr(k->string), e->tenant = dupstr(k->valuestring);
        if (!e->key || !e->tenant) {
            rc = ikv_error(IKV_ENOMEM, "%s", path);
            break;
        }
    }
    cJSON_Delete(j);
    return rc;
}

/* The router: plan parameters (defaults, the config file, the key=value overrides) and the
 * walk of route_model on route_hw it decides on. Errors name the file or key. */
static int route_setup(ikv_serve *s, const ikv_serve_options *o) {
    ikv_plan_params_default(&s->plan);
    int rc;
    if (o->route_config && (rc = ikv_plan_params_load_json(&s->plan, o->route_config)))
        return rc;
    for (size_t i = 0; i < o->n_route_set; i++) {
        const char *kv = o->route_set[i], *eq = strchr(kv, '=');
        char key[64];
        if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof key)
            return ikv_error(IKV_EPARAM, "--route-set '%s' is not key=value", kv);
        memcpy(key, kv, (size_t)(eq - kv));
        key[eq - kv] = 0;
        if ((rc = ikv_plan_param_set(&s->plan, key, eq + 1))) return rc;
    }
    if ((rc = ikv_plan_params_check(&s->plan))) return rc;
    const ikv_model_spec *m;
    const ikv_hw_spec *hw;
    if ((rc = ikv_model_lookup(o->route_model ? o->route_model : "llama3-70b", &m))) return rc;
    if ((rc = ikv_hw_lookup(o->route_hw ? o->route_hw : "h100", &hw))) return rc;
    if ((rc = ikv_plan_walk(&s->plan, m, hw, &s->walk))) return rc;
    return o->route_frontier ? ikv__route_setup_frontier(s, m, hw) : 0;
}

static char *model_name_of(const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    char *n = dupstr(b);
    if (n) {
        char *dot = strrchr(n, '.');
        if (dot && dot != n && !strcmp(dot, ".bin")) *dot = 0;
    }
    return n;
}

int ikv_serve_create(const ikv_serve_options *oin, ikv_serve **out) {
    double t0 = ikv_now();
    ikv_serve_options o;
    if (oin)
        o = *oin;
    else
        ikv_serve_options_default(&o);
    if (!o.model || !o.host) return ikv_error(IKV_EINVAL, "model and host are required");
    if (o.max_seqs == 0 || o.max_seqs > 1024)
        return ikv_error(IKV_EINVAL, "max-seqs %u not in 1..1024", o.max_seqs);
    if (o.max_batch_tokens == 0) return ikv_error(IKV_EINVAL, "max-batch-tokens must be positive");
    if (!o.max_queue) o.max_queue = 4 * o.max_seqs;
    if (!o.max_body) o.max_body = 1 << 20;
    if (!o.policy) o.policy = "lru";
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(o.port);
    if (inet_pton(AF_INET, o.host, &addr.sin_addr) != 1)
        return ikv_error(IKV_EINVAL, "host '%s' is not an IPv4 address", o.host);

    ikv_serve *s = ikv_calloc(1, sizeof *s);
    if (!s) return ikv_error(IKV_ENOMEM, "server");
    s->opt = o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->sched_cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    int rc = ikv_model_load(o.model, &s->model);
    if (rc) goto fail;
    const ikv_model_config *mc = ikv_model_cfg(s->model);
    s->vocab = (uint32_t)mc->vocab_size, s->seq_len = (uint32_t)mc->seq_len;
    rc = o.tokenizer ? ikv_tokenizer_load(o.tokenizer, s->vocab, &s->tok)
                     : ikv_tokenizer_bytes(s->vocab, &s->tok);
    if (rc) goto fail;
    if (!(s->model_name = model_name_of(o.model)) || !(s->model_path = dupstr(o.model))) {
        rc = ikv_error(IKV_ENOMEM, "server");
        goto fail;
    }
    if (o.api_keys && (rc = load_keys(s, o.api_keys))) goto fail;
    if (o.public_prefix && (rc = read_file(o.public_prefix, &s->public_text, &s->public_len)))
        goto fail;
    if ((rc = route_setup(s, &o))) goto fail;
    ikv_engine_options eo;
    ikv_engine_options_default(&eo);
    eo.max_seqs = o.max_seqs;
    eo.threads = o.threads;
    eo.kv_mem = o.kv_mem;
    eo.policy = o.policy;
    if (o.block_tokens) eo.block_tokens = o.block_tokens;
    /* drafts: a cached answer verified in one step; lookup drafts of spec_k (8 when a request
     * asks for lookup on a server without --spec) */
    eo.max_draft = o.semantic_cache ? 256 : o.spec_k > 8 ? o.spec_k : 8;
    if (eo.max_draft > 256) eo.max_draft = 256; /* spec_k is 1..256 */
    if (o.spec_k > eo.max_draft) eo.max_draft = o.spec_k;
    if (o.kv_mem) {
        /* private blocks: what max_seqs full sequences need, at most half the pool */
        uint64_t bb = ikv_model_kv_bytes_per_token(mc) * eo.block_tokens;
        uint64_t nb = o.kv_mem / bb, full = (uint64_t)o.max_seqs *
                                                ((s->seq_len + eo.block_tokens - 1) / eo.block_tokens);
        eo.private_blocks = full < nb / 2 ? full : nb / 2;
        if (eo.private_blocks == 0) eo.private_blocks = 1;
    }
    if (o.open_tiers && (rc = o.open_tiers(o.tiers_ctx, s->model, &eo))) goto fail;
    if ((rc = ikv_engine_create(s->model, &eo, &s->engine))) goto fail;
    {
        /* the most positions one request can hold: admission must find all its uncached
         * blocks in the private budget, and an uncached request has none cached */
        ikv_engine_stats es0;
        ikv_engine_stats_get(s->engine, &es0);
        uint64_t fit = es0.private_budget * eo.block_tokens;
        s->max_fit = fit < s->seq_len ? (uint32_t)fit : s->seq_len;
        s->fit_blocks = (uint32_t)es0.private_budget;
    }
    s->max_threads = ikv_engine_threads(s->engine);
    s->n_tiers = eo.n_tiers;
    snprintf(s->tier_name[0], sizeof s->tier_name[0], "pool");
    for (size_t t = 1; t <= s->n_tiers; t++) {
        ikv_engine_tier_stats ts;
        if (ikv_engine_tier_stats_get(s->engine, t, &ts)) {
            rc = ikv_error(IKV_EINVAL, "tier %zu has no stats", t);
            goto fail;
        }
        s->met.tiers[t - 1] = ts;
        /* the label: the spec's kind (mem, file, redis, redis-cluster), numbered if repeated */
        size_t k = strcspn(ts.spec, ":");
        if (k > 16) k = 16;
        snprintf(s->tier_name[t], sizeof s->tier_name[t], "%.*s", (int)k, ts.spec);
        for (size_t u = 1; u < t; u++)
            if (!strcmp(s->tier_name[u], s->tier_name[t])) {
                snprintf(s->tier_name[t], sizeof s->tier_name[t], "%.*s%zu", (int)k, ts.spec, t);
                break;
            }
    }
    /* chunk reuse (isokv.segments) blends fp32 products: fp32 models only; an int8 model's
     * server answers such requests 400 */
    if (!ikv_model_group(ikv_engine_model(s->engine)) &&
        (rc = ikv_chunks_create(s->engine, NULL, &s->chunks)))
        goto fail;
    s->running = ikv_calloc(o.max_seqs, sizeof *s->running);
    s->blend_list = ikv_calloc(o.max_seqs, sizeof *s->blend_list);
    s->logit_scratch = ikv_calloc(s->vocab, sizeof(float));
    if (!s->running || !s->blend_list || !s->logit_scratch) {
        rc = ikv_error(IKV_ENOMEM, "server");
        goto fail;
    }
    if (o.semantic_cache) {
        ikv_respcache_options ro;
        ikv_respcache_options_default(&ro);
        ro.capacity = o.semantic_cache;
        ro.max_bytes = o.semantic_cache_bytes;
        ro.max_tokens = s->seq_len;
        if ((rc = ikv_respcache_create(&ro, &s->rcache))) goto fail;
    }
    ikv_engine_stats_get(s->engine, &s->met.eng);
    ikv_cache_stats_get(ikv_engine_cache(s->engine), &s->met.cache);
    if (pthread_create(&s->sched, NULL, ikv__serve_sched, s)) {
        rc = ikv_error(IKV_ENOMEM, "cannot start the scheduler thread");
        goto fail;
    }
    s->sched_started = 1;
    s->httpd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL, 0, NULL,
        NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_done, s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)1024,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)256,
        MHD_OPTION_END);
    if (!s->httpd) {
        rc = ikv_error(IKV_EINVAL, "cannot listen on %s:%u (in use, or not an address here)",
                       o.host, (unsigned)o.port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->httpd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o.port;
    ikv_engine_stats es;
    ikv_engine_stats_get(s->engine, &es);
    char d[512];
    snprintf(d, sizeof d,
             "model %s (dim %d, %d layers, %d heads / %d kv, vocab %d, context %d); KV pool %llu "
             "blocks of %u tokens (%.1f MiB): cache %llu blocks (policy %s), private %llu; "
             "max-seqs %u, max-batch-tokens %u, threads %d, %s%s; startup %.0f ms (measured)",
             s->model_name, mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->vocab_size,
             mc->seq_len, (unsigned long long)es.pool_blocks, eo.block_tokens,
             (double)es.pool_blocks * (double)es.block_bytes / 1048576.0,
             (unsigned long long)es.cache_capacity, o.policy, (unsigned long long)es.private_budget,
             o.max_seqs, o.max_batch_tokens, o.threads,
             s->nkeys ? "tenants by API key" : "one tenant (default)",
             s->public_text ? ", public prefix file"
                            : (o.public_system ? ", public system prompts" : ""),
             (ikv_now() - t0) * 1e3);
    if (!(s->describe = dupstr(d))) {
        rc = ikv_error(IKV_ENOMEM, "server");
        goto fail;
    }
    pthread_mutex_lock(&s->mu);
    s->ready = 1;
    pthread_mutex_unlock(&s->mu);
    *out = s;
    return 0;
fail:
    ikv_serve_destroy(s);
    return rc;
}

uint16_t ikv_serve_port(const ikv_serve *s) {
    return s->port;
}

const char *ikv_serve_describe(const ikv_serve *s) {
    return s->describe;
}

size_t ikv_serve_drain(ikv_serve *s, double seconds) {
    double end = ikv_now() + seconds;
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    /* finished requests whose answers are still being written count too: stopping the
     * daemon under them would cut their streams short */
    while ((s->nrunning || s->nqueue || s->answering) && ikv_now() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s->idle_cv, &s->mu, &ts);
    }
    size_t left = s->nrunning + s->nqueue + s->answering;
    pthread_mutex_unlock(&s->mu);
    return left;
}

void ikv_serve_destroy(ikv_serve *s) {
    if (!s) return;
    if (s->sched_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        pthread_cond_broadcast(&s->sched_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->sched, NULL); /* cancels what runs, wakes every waiting connection */
    }
    if (s->httpd) MHD_stop_daemon(s->httpd); /* joins the connection threads */
    ikv_chunks_destroy(s->chunks);
    ikv_engine_destroy(s->engine);
    ikv_tokenizer_destroy(s->tok);
    ikv_model_destroy(s->model);
    for (size_t i = 0; i < s->nkeys; i++)
        ikv_free(s->keys[i].key), ikv_free(s->keys[i].tenant);
    ikv_free(s->keys);
    ikv_free(s->public_text);
    ikv_free(s->running), ikv_free(s->blend_list);
    ikv_free(s->logit_scratch);
    ikv_respcache_destroy(s->rcache);
    ikv__route_free(s);
    ikv_free(s->model_name), ikv_free(s->model_path), ikv_free(s->describe);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->sched_cv);
    pthread_cond_destroy(&s->idle_cv);
    ikv_free(s);
}
