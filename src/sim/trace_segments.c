/*
 * Segments trace reader: isokv's own JSONL for structured prompts (docs/segments.md).
 *
 *     {"format":"isokv-segments","version":1,"block_tokens":16,...}      optional header, line 1
 *     {"time":0.52,"tenant":"u7","session":3,"output":256,
 *      "segments":[{"kind":"system","id":"app1","tokens":2048,"public":true}, ...]}
 *
 * Each request line is turned into block keys by ikv_seg_build (segments.c): segment tokens
 * derived from the segment's identity, blocks cut over the concatenation, leading public blocks
 * under IKV_SCOPE_PUBLIC and the rest under the tenant's salt, chunks for `doc` segments.
 *
 * Block size: the header's block_tokens, else 16.
 * Tenants are named by strings and numbered densely in order of first appearance (a hash map
 * of owned names). Lines must come in non-decreasing time order; a line that goes back in time
 * is malformed, since timed replay depends on arrival order.
 *
 * Streams: one line in memory at a time; per request O(tokens) to derive tokens and
 * O(blocks) hashes. Rewind is the generic one (the file and line counter); the header line is
 * recognised again at line 1.
 */
#include "trace_internal.h"

#include "isokv/gen.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

#define HEADER_FORMAT    "isokv-segments"
#define HEADER_VERSION   1
#define MAX_BLOCK_TOKENS IKV_MAX_BLOCK_TOKENS
#define MAX_TENANTS      UINT32_MAX

typedef struct seg_state {
    ikv_seg_builder *b;
    int has_header;    /* line 1 is a header */
    ikv_segment *segs; /* (n) scratch for the current line */
    size_t segs_cap;
    double last_time; /* of the last request handed out (non-decreasing check) */
    /* tenant names -> dense indices: open addressing, linear probing, power-of-two size */
    char **names;    /* (n_tenants) owned, in index order */
    uint32_t *slots; /* (slot_cap) 1 + tenant index, 0 = empty */
    size_t slot_cap;
    uint32_t n_tenants;
} seg_state;

static int is_header(const cJSON *j) {
    return cJSON_GetObjectItemCaseSensitive(j, "format") != NULL &&
           cJSON_GetObjectItemCaseSensitive(j, "segments") == NULL;
}

static int seg_detect(const cJSON *j) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (cJSON_IsString(f)) return !strcmp(f->valuestring, HEADER_FORMAT);
    return cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "segments"));
}

/* Reads the header, if line 1 has one: checks format and version, takes block_tokens. */
static int read_header(ikv_trace *t, seg_state *s, uint32_t *block) {
    int rc = ikv__trace_getline(t);
    if (rc <= 0) return rc;
    char why[128];
    cJSON *j;
    if (ikv__trace_json_problem(t, &j, why, sizeof why) || !is_header(j)) {
        cJSON_Delete(j); /* not a header: a request (or a bad line next() will report) */
        return 0;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format");
    uint64_t v = 0, bt = 0;
    const char *bad = NULL;
    if (!cJSON_IsString(f) || strcmp(f->valuestring, HEADER_FORMAT))
        bad = "header: \"format\" is not \"" HEADER_FORMAT "\"";
    else if (ikv__json_uint(j, "version", UINT32_MAX, &v) || v != HEADER_VERSION)
        bad = "header: unsupported \"version\" (this reader knows 1)";
    else if (cJSON_GetObjectItemCaseSensitive(j, "block_tokens") &&
             (ikv__json_uint(j, "block_tokens", MAX_BLOCK_TOKENS, &bt) || bt == 0)) {
        snprintf(why, sizeof why, "header: \"block_tokens\" must be 1..%u", IKV_MAX_BLOCK_TOKENS);
        bad = why;
    }
    cJSON_Delete(j);
    if (bad)
        return ikv_error(IKV_EFORMAT, "%s:%llu: %s", t->path, (unsigned long long)t->lineno, bad);
    s->has_header = 1;
    if (bt) *block = (uint32_t)bt;
    return 0;
}

static void seg_close(ikv_trace *t) {
    seg_state *s = t->state;
    if (!s) return;
    ikv_seg_builder_destroy(s->b);
    ikv_free(s->segs);
    for (uint32_t i = 0; i < s->n_tenants; i++)
        ikv_free(s->names[i]);
    ikv_free(s->names);
    ikv_free(s->slots);
    ikv_free(s);
    t->state = NULL;
}

static int seg_open(ikv_trace *t) {
    seg_state *s = ikv_calloc(1, sizeof *s);
    if (!s) return IKV_ENOMEM;
    t->state = s;
    s->last_time = -INFINITY;
    uint32_t block = IKV_SEG_DEFAULT_BLOCK;
    int rc = read_header(t, s, &block);
    if (rc < 0) return rc;
    if ((rc = ikv__trace_file_rewind(t))) return rc;
    if (block > MAX_BLOCK_TOKENS)
        return ikv_error(IKV_EINVAL, "%s: block size %u out of range 1..%u", t->path, block,
                         MAX_BLOCK_TOKENS);
    t->block_tokens = block;
    return ikv_seg_builder_create(t->opts.seed, block, &s->b);
}

/* The dense index of tenant `name`, adding it if new. 0 or IKV_ENOMEM / IKV_ERANGE. */
static int tenant_index(seg_state *s, const char *name, uint32_t *out) {
    size_t len = strlen(name);
    uint64_t h = XXH3_64bits(name, len);
    if (s->slot_cap) {
        for (size_t i = h & (s->slot_cap - 1);; i = (i + 1) & (s->slot_cap - 1)) {
            uint32_t v = s->slots[i];
            if (!v) break;
            if (!strcmp(s->names[v - 1], name)) {
                *out = v - 1;
                return 0;
            }
        }
    }
    if (s->n_tenants == MAX_TENANTS - 1) return ikv_error(IKV_ERANGE, "too many tenants");
    if ((size_t)(s->n_tenants + 1) * 2 > s->slot_cap) { /* keep load <= 1/2 */
        size_t cap = s->slot_cap ? s->slot_cap * 2 : 1024;
        uint32_t *slots = ikv_calloc(cap, sizeof *slots);
        char **names = ikv_realloc(s->names, cap / 2 * sizeof *names);
        if (!slots || !names) {
            ikv_free(slots);
            if (names) s->names = names;
            return IKV_ENOMEM;
        }
        s->names = names;
        for (uint32_t k = 0; k < s->n_tenants; k++) {
            const char *nm = s->names[k];
            size_t i = XXH3_64bits(nm, strlen(nm)) & (cap - 1);
            while (slots[i])
                i = (i + 1) & (cap - 1);
            slots[i] = k + 1;
        }
        ikv_free(s->slots);
        s->slots = slots;
        s->slot_cap = cap;
    }
    char *copy = ikv_malloc(len + 1);
    if (!copy) return IKV_ENOMEM;
    memcpy(copy, name, len + 1);
    size_t i = h & (s->slot_cap - 1);
    while (s->slots[i])
        i = (i + 1) & (s->slot_cap - 1);
    s->names[s->n_tenants] = copy;
    s->slots[i] = ++s->n_tenants;
    *out = s->n_tenants - 1;
    return 0;
}

/* Parses the segments array of a request into s->segs. Returns NULL on success (count in
 * *n), or a static-format reason written to `why`. */
static const char *parse_segments(const ikv_trace *t, seg_state *s, const cJSON *arr, size_t *n,
                                  char *why, size_t why_len, int *nomem) {
    uint64_t max_seg = ikv__trace_max_segment_tokens(t), max_req = ikv__trace_max_request_tokens(t);
    if (max_req > IKV_SEG_MAX_TOKENS) max_req = IKV_SEG_MAX_TOKENS;
    size_t count = (size_t)cJSON_GetArraySize(arr);
    if (!count) return "\"segments\" is empty";
    if (count > s->segs_cap) {
        size_t cap = s->segs_cap ? s->segs_cap : 64;
        while (cap < count)
            cap *= 2;
        ikv_segment *p = ikv_realloc(s->segs, cap * sizeof *p);
        if (!p) {
            *nomem = 1;
            return "out of memory";
        }
        s->segs = p;
        s->segs_cap = cap;
    }
    size_t i = 0;
    const cJSON *it;
    uint64_t total = 0;
    cJSON_ArrayForEach(it, arr) {
        ikv_segment *g = &s->segs[i];
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(it, "kind");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *pub = cJSON_GetObjectItemCaseSensitive(it, "public");
        uint64_t tok = 0;
        const char *bad = NULL;
        if (!cJSON_IsObject(it))
            bad = "is not an object";
        else if (!cJSON_IsString(kind) || ikv_seg_kind_parse(kind->valuestring, &g->kind))
            bad = "\"kind\" is not one of system, tool, memory, doc, history, query";
        else if (!cJSON_IsString(id) || !id->valuestring[0])
            bad = "\"id\" missing or not a non-empty string";
        else if (ikv__json_uint(it, "tokens", UINT64_MAX >> 11, &tok) || tok == 0)
            bad = "\"tokens\" missing or not a positive integer";
        else if (pub && !cJSON_IsBool(pub))
            bad = "\"public\" is not true or false";
        if (bad) {
            snprintf(why, why_len, "segments[%zu] %s", i, bad);
            return why;
        }
        if (tok > max_seg) {
            snprintf(why, why_len,
                     "segments[%zu] has %llu tokens, more than the limit of %llu per segment "
                     "(--max-segment-tokens)",
                     i, (unsigned long long)tok, (unsigned long long)max_seg);
            return why;
        }
        total += tok;
        if (total > max_req) {
            snprintf(why, why_len,
                     "the request has more than the limit of %llu tokens (--max-request-tokens)",
                     (unsigned long long)max_req);
            return why;
        }
        g->id = id->valuestring;
        g->tokens = (uint32_t)tok;
        g->is_public = cJSON_IsTrue(pub);
        i++;
    }
    *n = i;
    return NULL;
}

static int seg_next(ikv_trace *t, ikv_trace_request *req) {
    seg_state *s = t->state;
    char why[160];
    for (;;) {
        int rc = ikv__trace_getline(t);
        if (rc <= 0) return rc;
        if (t->lineno == 1 && s->has_header) continue;
        cJSON *j = ikv__trace_parse_line(t, &rc);
        if (!j) {
            if (rc) return rc;
            continue;
        }
        double time = 0, ttft = -1, latency = -1, queue = 0;
        uint64_t session = 0, output = 0;
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(j, "ttft_s");
        const cJSON *jl = cJSON_GetObjectItemCaseSensitive(j, "latency_s");
        const cJSON *tenant = cJSON_GetObjectItemCaseSensitive(j, "tenant");
        const cJSON *segs = cJSON_GetObjectItemCaseSensitive(j, "segments");
        const char *bad = NULL;
        int nomem = 0;
        size_t n = 0;
        if (is_header(j))
            bad = "a header line is allowed only as line 1";
        else if (ikv__json_double(j, "time", &time) || time < 0)
            bad = "\"time\" (seconds) missing or negative";
        else if (time > IKV__TRACE_MAX_SECONDS)
            bad = "\"time\" is more than 1e9 seconds (31 years) into the trace";
        else if (time < s->last_time) {
            snprintf(why, sizeof why, "\"time\" %.6f goes back before the previous request's %.6f",
                     time, s->last_time);
            bad = why;
        } else if (!cJSON_IsString(tenant) || !tenant->valuestring[0])
            bad = "\"tenant\" missing or not a non-empty string";
        else if (cJSON_GetObjectItemCaseSensitive(j, "session") &&
                 ikv__json_uint(j, "session", UINT64_MAX >> 11, &session))
            bad = "\"session\" is not a non-negative integer";
        else if (cJSON_GetObjectItemCaseSensitive(j, "output") &&
                 ikv__json_uint(j, "output", UINT32_MAX, &output))
            bad = "\"output\" is not a token count";
        else if (output > ikv__trace_max_request_tokens(t)) {
            snprintf(why, sizeof why,
                     "\"output\" %llu is more than the limit of %llu tokens (--max-request-tokens)",
                     (unsigned long long)output,
                     (unsigned long long)ikv__trace_max_request_tokens(t));
            bad = why;
        } else if (!jt != !jl)
            bad = "\"ttft_s\" and \"latency_s\" come together (measured service times)";
        else if (jt && (ikv__json_double(j, "ttft_s", &ttft) || ttft < 0 ||
                        ikv__json_double(j, "latency_s", &latency) || latency < ttft ||
                        latency > IKV__TRACE_MAX_SECONDS))
            bad = "\"ttft_s\" / \"latency_s\": seconds with 0 <= ttft_s <= latency_s <= 1e9";
        else if (cJSON_GetObjectItemCaseSensitive(j, "queue_s") &&
                 (!jt || ikv__json_double(j, "queue_s", &queue) || queue < 0 || queue > ttft))
            bad = "\"queue_s\": seconds with 0 <= queue_s <= ttft_s (and ttft_s given)";
        else if (!cJSON_IsArray(segs))
            bad = "\"segments\" missing or not an array";
        else
            bad = parse_segments(t, s, segs, &n, why, sizeof why, &nomem);
        if (nomem) {
            cJSON_Delete(j);
            return IKV_ENOMEM;
        }
        uint32_t tix = 0;
        if (!bad) {
            rc = ikv_seg_build(s->b, tenant->valuestring, s->segs, n, req);
            if (rc == IKV_ENOMEM) {
                cJSON_Delete(j);
                return rc;
            }
            if (rc) {
                snprintf(why, sizeof why, "%s", ikv_errdetail());
                bad = why;
            } else if ((rc = tenant_index(s, tenant->valuestring, &tix))) {
                cJSON_Delete(j);
                return rc;
            }
        }
        cJSON_Delete(j);
        if (bad) {
            if ((rc = ikv__trace_malformed(t, "%s", bad))) return rc;
            continue;
        }
        s->last_time = time;
        req->time = time;
        req->tenant = tix;
        req->session = session;
        req->output_tokens = (uint32_t)output;
        req->has_service = jt != NULL;
        req->service_ttft = jt ? ttft : 0;
        req->service_latency = jt ? latency : 0;
        req->service_queue = jt ? queue : 0;
        if (s->n_tenants > t->tenants) t->tenants = s->n_tenants;
        return 1;
    }
}

/* Called after trace.c rewound the file: the time check starts over. */
static int seg_rewind(ikv_trace *t) {
    seg_state *s = t->state;
    s->last_time = -INFINITY;
    t->skipped = 0; /* streaming: the second pass counts the same lines again */
    t->has_error = 0;
    t->first_error[0] = 0;
    return 0;
}

const ikv__trace_reader ikv__trace_segments = {
    .name = "segments",
    .format = IKV_TRACE_SEGMENTS,
    .block_tokens = IKV_SEG_DEFAULT_BLOCK,
    .detect = seg_detect,
    .open = seg_open,
    .next = seg_next,
    .rewind = seg_rewind,
    .close = seg_close,
};
