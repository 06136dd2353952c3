/*
 * What a load run measured, as files: percentiles, requests.csv, summary.json, the sent-order
 * trace for `isokv sim` (the sweep's plots are the CLI's: src/cli/cmd_load.c).
 *
 * Files are never left half-written under their final name: each is written to a temporary
 * file in the same directory (mkstemp, so two runs never share one), flushed, closed and
 * renamed over the target. A target that exists and is not a regular file (a directory, a
 * FIFO, a device, a symlink) is refused, so `--out` cannot be used to write through a link.
 *
 * Hit ratio: cached tokens over prompt tokens, both as the server reported them in usage, over
 * the requests that completed and reported a cached-token field (a server that reports none
 * gives no ratio: "reported": 0 says so).
 */
#include "isokv/load.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ikv_load_percentile(double *v, size_t n, double p) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    if (p <= 0) return v[0];
    if (p >= 100) return v[n - 1];
    double pos = p / 100.0 * (double)(n - 1);
    size_t i = (size_t)pos;
    double f = pos - (double)i;
    return i + 1 < n ? v[i] + f * (v[i + 1] - v[i]) : v[i];
}

void ikv_load_summarize(ikv_load_result *r) {
    r->sent = r->ok = r->prompt_tokens = r->cached_tokens = r->reported = r->completion_tokens = 0;
    memset(r->errors_by, 0, sizeof r->errors_by);
    r->cached_src = IKV_CACHED_NONE;
    double *ttft = ikv_malloc((r->n ? r->n : 1) * sizeof *ttft);
    double *lat = ikv_malloc((r->n ? r->n : 1) * sizeof *lat);
    size_t nt = 0, nl = 0;
    double t_first = INFINITY, t_last = 0, st = 0, sl = 0;
    for (size_t i = 0; i < r->n; i++) {
        const ikv_load_record *e = &r->records[i];
        if (e->sent_order != UINT64_MAX) {
            r->sent++;
            if (e->send < t_first) t_first = e->send;
            if (e->end > t_last) t_last = e->end;
        }
        r->errors_by[e->err]++;
        if (e->err != IKV_LOAD_OK) continue;
        r->ok++;
        if (e->completion_tokens > 0) r->completion_tokens += (uint64_t)e->completion_tokens;
        if (e->cached_tokens >= 0) {
            r->reported++;
            r->cached_tokens += (uint64_t)e->cached_tokens;
            r->prompt_tokens +=
                e->server_prompt_tokens >= 0 ? (uint64_t)e->server_prompt_tokens : e->prompt_tokens;
            if (r->cached_src == IKV_CACHED_NONE) r->cached_src = e->cached_src;
        }
        if (e->first_token >= 0) {
            st += e->first_token - e->send;
            if (ttft) ttft[nt] = e->first_token - e->send;
            nt++;
        }
        sl += e->end - e->send;
        if (lat) lat[nl] = e->end - e->send;
        nl++;
    }
    r->token_hit_ratio = r->prompt_tokens ? (double)r->cached_tokens / (double)r->prompt_tokens : 0;
    if (ttft && lat) {
        r->ttft_p50 = ikv_load_percentile(ttft, nt, 50);
        r->ttft_p90 = ikv_load_percentile(ttft, nt, 90);
        r->ttft_p99 = ikv_load_percentile(ttft, nt, 99);
        r->lat_p50 = ikv_load_percentile(lat, nl, 50);
        r->lat_p90 = ikv_load_percentile(lat, nl, 90);
        r->lat_p99 = ikv_load_percentile(lat, nl, 99);
    }
    r->ttft_mean = nt ? st / (double)nt : 0;
    r->lat_mean = nl ? sl / (double)nl : 0;
    r->wall = r->sent ? t_last - t_first : 0;
    r->req_per_s = r->wall > 0 ? (double)r->ok / r->wall : 0;
    r->out_tok_per_s = r->wall > 0 ? (double)r->completion_tokens / r->wall : 0;
    uint64_t sent_tokens = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->records[i].err == IKV_LOAD_OK) sent_tokens += r->records[i].prompt_tokens;
    r->prompt_tok_per_s = r->wall > 0 ? (double)sent_tokens / r->wall : 0;
    ikv_free(ttft);
    ikv_free(lat);
}

/* ---- atomic files ------------------------------------------------------------------------------
 */

int ikv_load_write_atomic(const char *path, const char *text, size_t len) {
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return ikv_error(IKV_EINVAL, "%s exists and is not a regular file: refusing to replace it",
                         path);
    size_t pl = strlen(path);
    char *tmp = ikv_malloc(pl + 32);
    if (!tmp) return IKV_ENOMEM;
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
    snprintf(tmp, pl + 32, "%.*s.%s.tmp.XXXXXX", (int)dl, path, path + dl);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int rc =
            ikv_error(IKV_EIO, "%s: cannot create a temporary file: %s", path, strerror(errno));
        ikv_free(tmp);
        return rc;
    }
    size_t off = 0;
    int err = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        off += (size_t)w;
    }
    if (!err && fchmod(fd, 0644)) err = errno;
    if (close(fd) && !err) err = errno;
    if (!err && rename(tmp, path)) err = errno;
    if (err) {
        unlink(tmp);
        ikv_free(tmp);
        return ikv_error(IKV_EIO, "%s: %s", path, strerror(err));
    }
    ikv_free(tmp);
    return 0;
}

/* ---- text building
 * ------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *p = ikv_realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static char *sb_take(sbuf *b) {
    if (b->oom) {
        ikv_free(b->p);
        ikv_error(IKV_ENOMEM, "report text");
        return NULL;
    }
    if (!b->p) sb_printf(b, "%s", "");
    return b->oom ? NULL : b->p;
}

/* A CSV field: quoted when it holds a comma, quote or line break; quotes doubled. */
static void sb_csv(sbuf *b, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        sb_printf(b, "%s", s);
        return;
    }
    sb_printf(b, "\"");
    for (; *s; s++) {
        if (*s == '"')
            sb_printf(b, "\"\"");
        else if (*s == '\r' || *s == '\n')
            sb_printf(b, " ");
        else
            sb_printf(b, "%c", *s);
    }
    sb_printf(b, "\"");
}

char *ikv_load_requests_csv(const ikv_load_result *r) {
    sbuf b = {0};
    sb_printf(&b, "index,sent_order,session,tenant,trace_time_s,send_s,ttft_s,latency_s,"
                  "prompt_tokens,full_blocks,block_tokens,public_tokens,max_tokens,"
                  "server_prompt_tokens,cached_tokens,completion_tokens,cached_field,status,"
                  "error,detail\n");
    for (size_t i = 0; i < r->n; i++) {
        const ikv_load_record *e = &r->records[i];
        int sent = e->sent_order != UINT64_MAX;
        sb_printf(&b, "%llu,", (unsigned long long)e->index);
        if (sent) sb_printf(&b, "%llu", (unsigned long long)e->sent_order);
        sb_printf(&b, ",%llu,%u,%.6f,", (unsigned long long)e->session, e->tenant, e->trace_time);
        if (sent) sb_printf(&b, "%.6f", e->send);
        sb_printf(&b, ",");
        if (sent && e->first_token >= 0) sb_printf(&b, "%.6f", e->first_token - e->send);
        sb_printf(&b, ",");
        if (sent) sb_printf(&b, "%.6f", e->end - e->send);
        sb_printf(&b, ",%u,%u,%u,%u,%u,", e->prompt_tokens, e->full_blocks, e->block_tokens,
                  e->public_tokens, e->max_tokens);
        if (e->server_prompt_tokens >= 0) sb_printf(&b, "%lld", (long long)e->server_prompt_tokens);
        sb_printf(&b, ",");
        if (e->cached_tokens >= 0) sb_printf(&b, "%lld", (long long)e->cached_tokens);
        sb_printf(&b, ",");
        if (e->completion_tokens >= 0) sb_printf(&b, "%lld", (long long)e->completion_tokens);
        sb_printf(&b, ",%s,%ld,%s,", e->cached_src ? ikv_cached_src_name(e->cached_src) : "",
                  e->status, ikv_load_err_name(e->err));
        sb_csv(&b, e->detail);
        sb_printf(&b, "\n");
    }
    return sb_take(&b);
}

static const char *tenant_mode_name(ikv_tenant_mode m) {
    return m == IKV_TENANT_KEY ? "api-key" : m == IKV_TENANT_NONE ? "none" : "cache_salt";
}

char *ikv_load_summary_json(const ikv_load_result *r, const ikv_load_opts *o, const char *trace,
                            const char *extra_json) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "what", "measured: a trace replayed against a live server");
    cJSON_AddStringToObject(j, "trace", trace ? trace : "");
    cJSON_AddStringToObject(j, "url", o->url);
    cJSON_AddStringToObject(j, "loop", o->closed_loop ? "closed" : "open");
    cJSON_AddNumberToObject(j, "concurrency", o->closed_loop ? o->concurrency : o->max_inflight);
    cJSON_AddNumberToObject(j, "rate", o->rate);
    cJSON_AddNumberToObject(j, "scale", o->map.scale);
    cJSON_AddNumberToObject(j, "trace_block_tokens", r->trace_block_tokens);
    cJSON_AddNumberToObject(j, "block_tokens", r->block_tokens);
    cJSON_AddNumberToObject(j, "vocab", o->map.vocab);
    cJSON_AddNumberToObject(j, "token_seed", (double)o->map.seed);
    cJSON_AddStringToObject(j, "tenants_as", tenant_mode_name(o->tenant_mode));
    cJSON_AddNumberToObject(j, "requests", (double)r->n);
    cJSON_AddNumberToObject(j, "sent", (double)r->sent);
    cJSON_AddNumberToObject(j, "ok", (double)r->ok);
    cJSON_AddNumberToObject(j, "reported_cached", (double)r->reported);
    cJSON_AddStringToObject(j, "cached_field", ikv_cached_src_name(r->cached_src));
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->prompt_tokens);
    cJSON_AddNumberToObject(j, "cached_tokens", (double)r->cached_tokens);
    cJSON_AddNumberToObject(j, "completion_tokens", (double)r->completion_tokens);
    if (r->reported)
        cJSON_AddNumberToObject(j, "token_hit_ratio", r->token_hit_ratio);
    else
        cJSON_AddNullToObject(j, "token_hit_ratio");
    cJSON *t = cJSON_AddObjectToObject(j, "ttft_s");
    if (t) {
        cJSON_AddNumberToObject(t, "p50", r->ttft_p50);
        cJSON_AddNumberToObject(t, "p90", r->ttft_p90);
        cJSON_AddNumberToObject(t, "p99", r->ttft_p99);
        cJSON_AddNumberToObject(t, "mean", r->ttft_mean);
    }
    cJSON *l = cJSON_AddObjectToObject(j, "latency_s");
    if (l) {
        cJSON_AddNumberToObject(l, "p50", r->lat_p50);
        cJSON_AddNumberToObject(l, "p90", r->lat_p90);
        cJSON_AddNumberToObject(l, "p99", r->lat_p99);
        cJSON_AddNumberToObject(l, "mean", r->lat_mean);
    }
    cJSON_AddNumberToObject(j, "wall_s", r->wall);
    cJSON_AddNumberToObject(j, "requests_per_s", r->req_per_s);
    cJSON_AddNumberToObject(j, "output_tokens_per_s", r->out_tok_per_s);
    cJSON_AddNumberToObject(j, "prompt_tokens_per_s", r->prompt_tok_per_s);
    /* errors by status: HTTP codes as "404", transport classes by name */
    cJSON *eb = cJSON_AddObjectToObject(j, "errors_by_status");
    uint64_t errors = 0;
    for (size_t i = 0; eb && i < r->n; i++) {
        const ikv_load_record *e = &r->records[i];
        if (e->err == IKV_LOAD_OK) continue;
        errors++;
        char k[32];
        if (e->err == IKV_LOAD_HTTP)
            snprintf(k, sizeof k, "%ld", e->status);
        else
            snprintf(k, sizeof k, "%s", ikv_load_err_name(e->err));
        cJSON *c = cJSON_GetObjectItemCaseSensitive(eb, k);
        if (c)
            cJSON_SetNumberValue(c, c->valuedouble + 1);
        else
            cJSON_AddNumberToObject(eb, k, 1);
    }
    cJSON_AddNumberToObject(j, "errors", (double)errors);
    /* the first error's detail, to say what went wrong without opening the CSV */
    for (size_t i = 0; i < r->n; i++)
        if (r->records[i].err != IKV_LOAD_OK) {
            cJSON_AddStringToObject(j, "first_error", r->records[i].detail);
            break;
        }
    if (extra_json) {
        cJSON *x = cJSON_Parse(extra_json);
        cJSON *it = x ? x->child : NULL;
        while (it) {
            cJSON *next = it->next;
            cJSON_AddItemToObject(j, it->string, cJSON_Duplicate(it, 1));
            it = next;
        }
        cJSON_Delete(x);
    }
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *out = ikv_malloc(n + 2);
    if (out) {
        memcpy(out, s, n);
        out[n] = '\n';
        out[n + 1] = 0;
    }
    cJSON_free(s);
    return out;
}

/* ---- the sent-order trace
 * ------------------------------------------------------------------------ */

typedef struct keypos {
    uint64_t lo, hi;
    size_t pos; /* index into the flat id array */
} keypos;

static int cmp_keypos(const void *a, const void *b) {
    const keypos *x = a, *y = b;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int cmp_sent(const void *a, const void *b) {
    const ikv_load_record *x = *(const ikv_load_record *const *)a,
                          *y = *(const ikv_load_record *const *)b;
    return x->sent_order < y->sent_order ? -1 : x->sent_order > y->sent_order;
}

char *ikv_load_sent_trace(const ikv_load_result *r) {
    uint32_t bs = r->block_tokens;
    if (!bs) {
        ikv_error(IKV_EINVAL, "sent trace: no block size");
        return NULL;
    }
    size_t ns = 0, nk = 0;
    uint64_t prompt = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->records[i].sent_order != UINT64_MAX && r->records[i].err == IKV_LOAD_OK) {
            ns++;
            nk += r->records[i].full_blocks;
            prompt += r->records[i].prompt_tokens;
        }
    const ikv_load_record **order = ikv_malloc((ns ? ns : 1) * sizeof *order);
    keypos *kp = ikv_malloc((nk ? nk : 1) * sizeof *kp);
    uint64_t *ids = ikv_malloc((nk ? nk : 1) * sizeof *ids);
    sbuf b = {0};
    if (!order || !kp || !ids) goto oom;
    ns = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->records[i].sent_order != UINT64_MAX && r->records[i].err == IKV_LOAD_OK)
            order[ns++] = &r->records[i];
    qsort(order, ns, sizeof *order, cmp_sent);
    /* ids: dense over the distinct keys of full blocks */
    nk = 0;
    for (size_t i = 0; i < ns; i++)
        for (uint32_t j = 0; j < order[i]->full_blocks; j++, nk++)
            kp[nk] = (keypos){order[i]->keys[j].lo, order[i]->keys[j].hi, nk};
    qsort(kp, nk, sizeof *kp, cmp_keypos);
    uint64_t next_id = 0;
    for (size_t i = 0; i < nk; i++) {
        if (i && (kp[i].lo != kp[i - 1].lo || kp[i].hi != kp[i - 1].hi)) next_id++;
        ids[kp[i].pos] = next_id;
    }
    sb_printf(
        &b,
        "{\"format\": \"isokv-segments\", \"version\": 1, \"block_tokens\": %u, "
        "\"isokv_load\": {\"requests\": %zu, \"prompt_tokens\": %llu, \"note\": \"full blocks "
        "only: compare hit_tokens with the server's cached tokens\"}}\n",
        bs, ns, (unsigned long long)prompt);
    size_t at = 0;
    for (size_t i = 0; i < ns; i++) {
        const ikv_load_record *e = order[i];
        uint32_t pub_blocks = e->public_tokens / bs;
        /* measured service: first token and end, from the send (for `isokv sim --mode timed
         * --service trace`); a reply without a first text token counts its end as both */
        double lat = e->end - e->send, ttft = e->first_token >= 0 ? e->first_token - e->send : lat;
        if (lat < 0) lat = 0;
        if (ttft < 0) ttft = 0;
        if (ttft > lat) ttft = lat;
        sb_printf(&b,
                  "{\"time\": %.6f, \"tenant\": \"t%u\", \"session\": %llu, \"output\": %u, "
                  "\"ttft_s\": %.6f, \"latency_s\": %.6f, ",
                  e->send, e->tenant, (unsigned long long)e->session, e->max_tokens, ttft, lat);
        if (e->server_queue >= 0) /* isokv serve: the wait before admission, within ttft */
            sb_printf(&b, "\"queue_s\": %.6f, ", e->server_queue < ttft ? e->server_queue : ttft);
        sb_printf(&b, "\"segments\": [");
        for (uint32_t j = 0; j < e->full_blocks; j++) {
            int pub = j < pub_blocks;
            sb_printf(&b, "%s{\"kind\": \"%s\", \"id\": \"b%llu\", \"tokens\": %u, \"public\": %s}",
                      j ? ", " : "", pub ? "system" : "history", (unsigned long long)ids[at + j],
                      bs, pub ? "true" : "false");
        }
        sb_printf(&b, "]}\n");
        at += e->full_blocks;
    }
    ikv_free(order);
    ikv_free(kp);
    ikv_free(ids);
    return sb_take(&b);
oom:
    ikv_error(IKV_ENOMEM, "sent trace");
    ikv_free(order);
    ikv_free(kp);
    ikv_free(ids);
    ikv_free(b.p);
    return NULL;
}
