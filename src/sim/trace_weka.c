/*
 * WEKA agentic-coding trace reader (real Claude Code sessions; callanjfox/kv-cache-tester,
 * traces/, Apache-2.0).
 *
 * One conversation per line:
 *     {"id", "block_size": 64, "hash_id_scope": "local", ...,
 *      "requests": [{"t": s, "type": "n"|"s", "in", "out", "hash_ids": [..]},
 *                   {"t": s, "type": "subagent", "requests": [ {..t from the subagent's start..}
 * ]}]}
 *
 * Keys. Ids are local to the conversation and, like Mooncake's, prefix ids (an id stands for a
 * block and all before it). Conversation i (0-based among accepted lines) uses namespace i + 1:
 * key = ikv_key_from_id(seed, i + 1, id). A subagent's requests share its parent's namespace (a
 * subagent re-sends the parent's tool definitions, so its prefixes may hit the parent's). Only
 * full 64-token blocks are hashed: len(hash_ids) == floor(in / 64), checked.
 *
 * Time. `--conversations N` takes the first N conversations (0: all); conversation i starts at
 * i·W/N seconds (W = --window, default 3600), N being the number actually read. A request's
 * time is its conversation's start plus its `t` (seconds from the conversation's start); a
 * nested subagent request's `t` counts from the subagent's own `t`. Requests are replayed in
 * order of that time, ties broken by conversation index, then by order in the file
 * (depth-first: a subagent's requests come where the subagent entry stands).
 *
 * Storage. The whole selection must be read before the first request can be replayed. Ids are
 * kept run-length encoded — (first id, count) runs of consecutive ids, which is what agentic
 * prompts are made of (the 355-conversation file has 40 M ids in ~3 k runs per conversation) —
 * and keys are computed when a request is handed out. A malformed conversation line is skipped
 * as a whole (its requests cannot be trusted) and does not count towards N; so is a
 * conversation with no requests at all (reported as such), and one whose times or token counts
 * are absurd (beyond 1e9 s, or opts.max_request_tokens).
 */
#include "trace_internal.h"

#include <stdlib.h>
#include <string.h>

#define WEKA_BLOCK 64u
#define MAX_DEPTH 8 /* subagent nesting accepted */

typedef struct wreq {
    double time;      /* seconds: conversation start + t */
    uint32_t conv;    /* accepted conversation index */
    uint32_t order;   /* position in the file within the conversation (depth-first) */
    uint32_t in, out; /* tokens */
    uint8_t hint;     /* ikv_hint from "stop" */
    uint32_t n_blocks;
    uint32_t n_runs;
    uint64_t run_off; /* index of the first run in runs[] */
} wreq;

typedef struct weka {
    wreq *reqs;
    size_t n_reqs, cap_reqs;
    uint32_t *runs; /* pairs (first id, count) */
    size_t n_runs, cap_runs;
    size_t cursor;
    uint32_t n_conv;
    /* while parsing a line: the hash_ids arrays the pre-scan pulled out, in document order */
    size_t line_first_req, line_first_run;
    struct ids_arr {
        uint64_t run_off;
        uint32_t n_runs, n_ids;
    } *arr;
    size_t n_arr, cap_arr, next_arr;
    uint64_t max_tokens; /* opts.max_request_tokens or its default */
    char why[400];
} weka;

static int wk_detect(const cJSON *j) {
    return cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "requests")) &&
           (cJSON_GetObjectItemCaseSensitive(j, "block_size") ||
            cJSON_GetObjectItemCaseSensitive(j, "hash_id_scope"));
}

static int push_run(weka *w, uint32_t first) {
    if (w->n_runs == w->cap_runs) {
        size_t cap = w->cap_runs ? w->cap_runs * 2 : 4096;
        uint32_t *p = ikv_realloc(w->runs, cap * 2 * sizeof *p);
        if (!p) return IKV_ENOMEM;
        w->runs = p;
        w->cap_runs = cap;
    }
    w->runs[2 * w->n_runs] = first;
    w->runs[2 * w->n_runs + 1] = 1;
    w->n_runs++;
    return 0;
}

/* Appends id to the current array's runs (extending the last run when consecutive). */
static int add_id(weka *w, struct ids_arr *a, uint64_t id) {
    if (a->n_ids && w->n_runs > a->run_off) {
        uint32_t *last = &w->runs[2 * (w->n_runs - 1)];
        if (id == (uint64_t)last[0] + last[1] && last[1] < UINT32_MAX) {
            last[1]++;
            a->n_ids++;
            return 0;
        }
    }
    if (push_run(w, (uint32_t)id)) return IKV_ENOMEM;
    a->n_runs++;
    a->n_ids++;
    return 0;
}

/*
 * Pre-scan of a conversation line: every "hash_ids": [..] array is read here, straight from the
 * text, into runs (document order), and its contents are overwritten with spaces, so that
 * cJSON then parses only the small structure around them (a 4 MB line holds ~550 k ids; as
 * cJSON nodes they made the reader 5x slower). Strings are skipped as strings (with escapes), so
 * "hash_ids" inside a string value is never taken for a key. Returns 0, 1 with w->why set
 * (malformed), or IKV_ENOMEM.
 */
static int prescan(weka *w, char *s, size_t len) {
    w->n_arr = w->next_arr = 0;
    size_t i = 0;
    for (;;) {
        char *q = memchr(s + i, '"', len - i);
        if (!q) return 0;
        size_t a = (size_t)(q - s) + 1, j = a;
        while (j < len && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
        if (j >= len) return 0; /* unterminated string: cJSON reports it */
        i = j + 1;
        if (j - a != 8 || memcmp(s + a, "hash_ids", 8)) continue;
        size_t k = i;
        while (k < len && (s[k] == ' ' || s[k] == '\t')) k++;
        if (k >= len || s[k] != ':') continue; /* a string value, not a key */
        k++;
        while (k < len && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r')) k++;
        if (k >= len || s[k] != '[') continue; /* not an array: add_requests reports it */
        if (w->n_arr == w->cap_arr) {
            size_t cap = w->cap_arr ? w->cap_arr * 2 : 256;
            struct ids_arr *p = ikv_realloc(w->arr, cap * sizeof *p);
            if (!p) return IKV_ENOMEM;
            w->arr = p;
            w->cap_arr = cap;
        }
        struct ids_arr *ar = &w->arr[w->n_arr++];
        ar->run_off = w->n_runs;
        ar->n_runs = ar->n_ids = 0;
        size_t open = k++;
        int want_num = 1, closed = 0;
        while (k < len && !closed) {
            char c = s[k];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                k++;
            } else if (c >= '0' && c <= '9' && want_num) {
                uint64_t v = 0;
                size_t d0 = k;
                while (k < len && s[k] >= '0' && s[k] <= '9' && k - d0 < 11) v = v * 10 + (uint64_t)(s[k++] - '0');
                if ((k < len && (s[k] == '.' || s[k] == 'e' || s[k] == 'E' || (s[k] >= '0' && s[k] <= '9'))) ||
                    v > UINT32_MAX - 1) {
                    snprintf(w->why, sizeof w->why, "hash_ids array %zu, id %u: not an integer id below 2^32",
                             w->n_arr - 1, ar->n_ids);
                    return 1;
                }
                if (add_id(w, ar, v)) return IKV_ENOMEM;
                want_num = 0;
            } else if (c == ',' && !want_num) {
                want_num = 1;
                k++;
            } else if (c == ']' && (!want_num || ar->n_ids == 0)) {
                closed = 1;
            } else {
                snprintf(w->why, sizeof w->why, "hash_ids array %zu, after %u ids: unexpected '%c'",
                         w->n_arr - 1, ar->n_ids, c);
                return 1;
            }
        }
        if (!closed) {
            snprintf(w->why, sizeof w->why, "hash_ids array %zu is not closed", w->n_arr - 1);
            return 1;
        }
        memset(s + open + 1, ' ', k - open - 1);
        i = k + 1;
    }
}

/* Adds the requests of one `requests` array (recursively for subagents). Returns 0, a negative
 * error, or 1 with w->why set when the conversation is malformed. */
static int add_requests(weka *w, const cJSON *arr, double base, uint32_t conv, uint32_t *order,
                        int depth, const char *where) {
    if (!cJSON_IsArray(arr)) {
        snprintf(w->why, sizeof w->why, "%s: \"requests\" is not an array", where);
        return 1;
    }
    if (depth > MAX_DEPTH) {
        snprintf(w->why, sizeof w->why, "%s: subagents nested deeper than %d", where, MAX_DEPTH);
        return 1;
    }
    size_t k = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, arr) {
        char here[96];
        snprintf(here, sizeof here, "%s[%zu]", where, k++);
        double t;
        if (!cJSON_IsObject(r) || ikv__json_double(r, "t", &t) || t < 0) {
            snprintf(w->why, sizeof w->why, "%s: \"t\" missing or negative", here);
            return 1;
        }
        if (base + t > IKV__TRACE_MAX_SECONDS) {
            snprintf(w->why, sizeof w->why, "%s: \"t\" %.6g s is more than 1e9 s (31 years)", here,
                     base + t);
            return 1;
        }
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(r, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "subagent")) {
            char sub[112];
            snprintf(sub, sizeof sub, "%s.requests", here);
            int rc = add_requests(w, cJSON_GetObjectItemCaseSensitive(r, "requests"), base + t,
                                  conv, order, depth + 1, sub);
            if (rc) return rc;
            continue;
        }
        uint64_t in, out;
        if (ikv__json_uint(r, "in", UINT32_MAX, &in) || ikv__json_uint(r, "out", UINT32_MAX, &out)) {
            snprintf(w->why, sizeof w->why, "%s: \"in\"/\"out\" missing or not token counts", here);
            return 1;
        }
        if (in > w->max_tokens || out > w->max_tokens) {
            snprintf(w->why, sizeof w->why,
                     "%s: \"%s\" %llu is more than the limit of %llu tokens (--max-request-tokens)",
                     here, in > w->max_tokens ? "in" : "out",
                     (unsigned long long)(in > w->max_tokens ? in : out),
                     (unsigned long long)w->max_tokens);
            return 1;
        }
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(r, "hash_ids");
        if (!cJSON_IsArray(ids) || w->next_arr >= w->n_arr) {
            snprintf(w->why, sizeof w->why, "%s: \"hash_ids\" missing or not an array", here);
            return 1;
        }
        const struct ids_arr *ar = &w->arr[w->next_arr++];
        if (w->n_reqs == w->cap_reqs) {
            size_t cap = w->cap_reqs ? w->cap_reqs * 2 : 1024;
            wreq *p = ikv_realloc(w->reqs, cap * sizeof *p);
            if (!p) return IKV_ENOMEM;
            w->reqs = p;
            w->cap_reqs = cap;
        }
        wreq *q = &w->reqs[w->n_reqs];
        q->time = base + t;
        q->conv = conv;
        q->order = (*order)++;
        q->in = (uint32_t)in;
        q->out = (uint32_t)out;
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(r, "stop");
        q->hint = !cJSON_IsString(stop)                       ? IKV_HINT_NONE
                  : !strcmp(stop->valuestring, "tool_use") ? IKV_HINT_SOON
                  : !strcmp(stop->valuestring, "end_turn") ? IKV_HINT_TURN
                                                           : IKV_HINT_NONE;
        q->run_off = ar->run_off;
        size_t i = ar->n_ids;
        if (i != in / WEKA_BLOCK) {
            snprintf(w->why, sizeof w->why, "%s: %zu hash_ids for in=%llu (expected floor(in/64) = %llu)",
                     here, i, (unsigned long long)in, (unsigned long long)(in / WEKA_BLOCK));
            return 1;
        }
        q->n_blocks = (uint32_t)i;
        q->n_runs = ar->n_runs;
        w->n_reqs++;
    }
    return 0;
}

static int cmp_req(const void *a, const void *b) {
    const wreq *x = a, *y = b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    if (x->conv != y->conv) return x->conv < y->conv ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static void wk_close(ikv_trace *t) {
    weka *w = t->state;
    if (!w) return;
    ikv_free(w->reqs);
    ikv_free(w->runs);
    ikv_free(w->arr);
    ikv_free(w);
    t->state = NULL;
}

static int wk_open(ikv_trace *t) {
    weka *w = ikv_calloc(1, sizeof *w);
    if (!w) return IKV_ENOMEM;
    t->state = w;
    w->max_tokens = ikv__trace_max_request_tokens(t);
    uint64_t want = t->opts.conversations;
    int rc = 0;
    while ((!want || w->n_conv < want) && (rc = ikv__trace_getline(t)) == 1) {
        w->line_first_req = w->n_reqs;
        w->line_first_run = w->n_runs;
        int pre = prescan(w, t->line, t->line_len);
        if (pre < 0) return pre;
        if (pre) {
            w->n_runs = w->line_first_run;
            if ((rc = ikv__trace_malformed(t, "%s", w->why))) return rc;
            continue;
        }
        cJSON *j = ikv__trace_parse_line(t, &rc);
        if (!j) {
            w->n_runs = w->line_first_run;
            if (rc) return rc;
            continue;
        }
        uint64_t bs = WEKA_BLOCK;
        const cJSON *bsj = cJSON_GetObjectItemCaseSensitive(j, "block_size");
        int bad = 0;
        if (bsj && (ikv__json_item_uint(bsj, UINT32_MAX, &bs) || bs != WEKA_BLOCK)) {
            snprintf(w->why, sizeof w->why, "\"block_size\" must be 64");
            bad = 1;
        } else {
            uint32_t order = 0;
            bad = add_requests(w, cJSON_GetObjectItemCaseSensitive(j, "requests"), 0, w->n_conv,
                               &order, 0, "requests");
            if (!bad && w->next_arr != w->n_arr) {
                snprintf(w->why, sizeof w->why, "%zu \"hash_ids\" arrays outside request entries",
                         w->n_arr - w->next_arr);
                bad = 1;
            }
            if (!bad && w->n_reqs == w->line_first_req) {
                /* nothing to replay, and it would shift every later conversation's start */
                snprintf(w->why, sizeof w->why, "the conversation has no requests");
                bad = 1;
            }
        }
        cJSON_Delete(j);
        if (bad < 0) return bad;
        if (bad) {
            w->n_reqs = w->line_first_req; /* drop the conversation's requests */
            w->n_runs = w->line_first_run;
            if ((rc = ikv__trace_malformed(t, "%s", w->why))) return rc;
            continue;
        }
        w->n_conv++;
    }
    if (rc < 0) return rc;
    if (w->n_conv == 0)
        return ikv_error(IKV_EEMPTY, "%s: no valid conversation (%llu malformed line%s; first: %s)",
                         t->path, (unsigned long long)t->skipped, t->skipped == 1 ? "" : "s",
                         t->has_error ? t->first_error : "none");
    /* Conversation i starts at i*W/N. */
    for (size_t i = 0; i < w->n_reqs; i++)
        w->reqs[i].time += (double)w->reqs[i].conv * t->opts.window / (double)w->n_conv;
    if (w->n_reqs > 1) qsort(w->reqs, w->n_reqs, sizeof *w->reqs, cmp_req);
    t->tenants = w->n_conv;
    t->known_requests = w->n_reqs;
    return 0;
}

static int wk_next(ikv_trace *t, ikv_trace_request *req) {
    weka *w = t->state;
    if (w->cursor >= w->n_reqs) return 0;
    const wreq *q = &w->reqs[w->cursor++];
    int rc = ikv__trace_reserve(t, q->n_blocks ? q->n_blocks : 1);
    if (rc) return rc;
    size_t i = 0;
    const uint32_t *run = w->runs + 2 * q->run_off;
    for (uint32_t r = 0; r < q->n_runs; r++)
        for (uint32_t k = 0; k < run[2 * r + 1]; k++, i++) {
            t->keys[i] = ikv_key_from_id(t->opts.seed, (uint64_t)q->conv + 1, (uint64_t)run[2 * r] + k);
            t->ntokens[i] = WEKA_BLOCK;
        }
    req->time = q->time;
    req->tenant = q->conv;
    req->session = (uint64_t)q->conv + 1;
    req->input_tokens = q->in;
    req->output_tokens = q->out;
    req->hint = q->hint;
    req->n_blocks = q->n_blocks;
    req->keys = t->keys;
    req->ntokens = t->ntokens;
    return 1;
}

static int wk_rewind(ikv_trace *t) {
    weka *w = t->state;
    w->cursor = 0;
    return 0;
}

const ikv__trace_reader ikv__trace_weka = {
    .name = "weka",
    .format = IKV_TRACE_WEKA,
    .block_tokens = WEKA_BLOCK,
    .detect = wk_detect,
    .open = wk_open,
    .next = wk_next,
    .rewind = wk_rewind,
    .close = wk_close,
};
