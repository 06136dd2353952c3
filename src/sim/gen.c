/*
 * The synthetic multi-user workload generator: writes a segments trace (docs/segments.md).
 *
 * Model (every knob is in ikv_gen_opts; defaults in docs/segments.md):
 *
 *   - N users (tenants "u0".."u<N-1>"), each in one of A apps (app = hash(seed, user) mod A).
 *     Each app has a public system prompt (S tokens) and a public tool schema.
 *   - Sessions start as a Poisson process of rate `rate / turns` (or, when user_rate is set,
 *     users * user_rate / 3600 / turns: load that grows with users); each belongs to a user
 *     drawn uniformly (or Zipf(user_alpha) over user ids) and has T turns separated by
 *     exponential think times. Requests are emitted in arrival order; the first R, or those
 *     before the duration, are kept.
 *   - Per-user memory: M tokens in items of memory_item_tokens, each item "m<i>.v<version>".
 *     At each new session of a user exactly round(drift * items) distinct items, drawn
 *     uniformly, get a new version (their tokens change); the first session starts at v0.
 *   - Each turn has a query intent: with probability `novelty` a new unique intent ("n<j>"),
 *     otherwise intent "q<h>" with h ~ Zipf(intent_alpha) over `intents`. An intent retrieves
 *     k distinct documents from a corpus of V, each ~ Zipf(doc_alpha) by popularity (rank =
 *     document id), drawn from a random stream seeded by the intent alone, so the same intent
 *     retrieves the same documents in the same order for every user.
 *   - A turn's prompt: system, tool, then memory and docs (order set by the layout), then the
 *     session's history (each earlier turn's query segment verbatim followed by its answer as a
 *     `history` segment "s<session>.a<turn>" of output_tokens), then the query.
 *
 * Determinism: one xoshiro256** stream (seeded from `seed`) drives arrivals, users, drift and
 * intents in session-start order; document lists come from per-intent streams. The output is a
 * pure function of the options. Times are printed with 6 decimals.
 *
 * Cost: O(sessions * (turns + memory items)) memory for the session table (about 40 bytes per
 * session plus 4 bytes per memory item), O(users) for the last-session index, O(V + H + N) for
 * Zipf tables; the writer is O(output size).
 */
#include "isokv/gen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GOLDEN             UINT64_C(0x9E3779B97F4A7C15)
#define STREAM_MAIN        UINT64_C(0x6d61696e) /* "main" */
#define STREAM_DOCS        UINT64_C(0x646f6373) /* "docs" */
#define STREAM_APPS        UINT64_C(0x61707073) /* "apps" */
#define NOVEL_BIT          (UINT64_C(1) << 63)
#define MAX_REQUESTS       UINT64_C(100000000) /* 1e8: keeps the session table in memory */
#define MAX_TABLE          UINT64_C(10000000)  /* 1e7: users, corpus, intents */
#define MAX_DOCS_PER_QUERY 64u
#define MAX_MEMORY_ITEMS   4096u

/* ---- random numbers ---------------------------------------------------------------------- */

typedef struct rng {
    uint64_t s[4];
} rng;

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += GOLDEN);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed, uint64_t stream, uint64_t sub) {
    uint64_t x = seed ^ (stream * GOLDEN) ^ splitmix(&sub);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix(&x);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman & Vigna, 2018). */
static uint64_t rng_next(rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_unit(rng *r) {
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [0, n), n > 0 (multiply-shift; the bias is below 2^-40 for n < 2^24). */
static uint64_t rng_below(rng *r, uint64_t n) {
    return (uint64_t)(rng_unit(r) * (double)n) % n;
}

static double rng_exp(rng *r, double rate) {
    return -log1p(-rng_unit(r)) / rate;
}

/* ---- Zipf over [0, n): rank i has weight 1/(i+1)^alpha; alpha 0 is uniform ---------------- */

typedef struct zipf {
    double *cdf; /* (n) cumulative weights normalised to 1; NULL when uniform */
    uint64_t n;
} zipf;

static int zipf_init(zipf *z, uint64_t n, double alpha) {
    z->n = n;
    z->cdf = NULL;
    if (alpha == 0 || n <= 1) return 0;
    z->cdf = ikv_malloc(n * sizeof *z->cdf);
    if (!z->cdf) return IKV_ENOMEM;
    double sum = 0;
    for (uint64_t i = 0; i < n; i++)
        z->cdf[i] = (sum += pow((double)(i + 1), -alpha));
    for (uint64_t i = 0; i < n; i++)
        z->cdf[i] /= sum;
    z->cdf[n - 1] = 1.0;
    return 0;
}

static uint64_t zipf_draw(const zipf *z, rng *r) {
    if (!z->cdf) return rng_below(r, z->n);
    double u = rng_unit(r);
    uint64_t lo = 0, hi = z->n - 1; /* first i with cdf[i] > u */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (z->cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* ---- options ----------------------------------------------------------------------------- */

static const char *const layout_names[] = {"personal-first", "shared-first"};

const char *ikv_gen_layout_name(ikv_gen_layout l) {
    return (unsigned)l < 2 ? layout_names[l] : NULL;
}

int ikv_gen_layout_parse(const char *name, ikv_gen_layout *out) {
    for (int i = 0; i < 2; i++)
        if (name && !strcmp(name, layout_names[i])) {
            *out = (ikv_gen_layout)i;
            return 0;
        }
    return IKV_EINVAL;
}

void ikv_gen_opts_default(ikv_gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->block_tokens = IKV_SEG_DEFAULT_BLOCK;
    o->users = 100;
    o->user_alpha = 0;
    o->apps = 4;
    o->system_tokens = 2048;
    o->tool_tokens = 256;
    o->memory_tokens = 1024;
    o->memory_item_tokens = 128;
    o->drift = 0.25;
    o->docs_per_query = 4;
    o->corpus = 10000;
    o->doc_tokens = 512;
    o->doc_alpha = 1.0;
    o->private_docs = 0;
    o->turns = 4;
    o->think = 30;
    o->rate = 10;
    o->user_rate = 0;
    o->duration = 0;
    o->requests = 10000;
    o->intents = 1000;
    o->intent_alpha = 1.0;
    o->novelty = 0.2;
    o->query_tokens = 64;
    o->output_tokens = 256;
    o->layout = IKV_LAYOUT_PERSONAL_FIRST;
}

static uint32_t memory_items(const ikv_gen_opts *o) {
    if (!o->memory_tokens) return 0;
    return (o->memory_tokens + o->memory_item_tokens - 1) / o->memory_item_tokens;
}

/* Mean requests per second of the whole trace. */
static double total_rate(const ikv_gen_opts *o) {
    return o->user_rate > 0 ? (double)o->users * o->user_rate / 3600.0 : o->rate;
}

#define BAD(...) return ikv_error(IKV_EPARAM, __VA_ARGS__)

int ikv_gen_opts_check(const ikv_gen_opts *o) {
    if (!o->block_tokens || o->block_tokens > IKV_MAX_BLOCK_TOKENS)
        BAD("gen: block_tokens must be 1..%u", IKV_MAX_BLOCK_TOKENS);
    if (!o->users || o->users > MAX_TABLE)
        BAD("gen: users must be 1..%llu", (unsigned long long)MAX_TABLE);
    if (!(o->user_alpha >= 0 && o->user_alpha <= 10)) BAD("gen: user_alpha must be 0..10");
    if (!o->apps || o->apps > 1000000) BAD("gen: apps must be 1..1000000");
    if (!o->system_tokens) BAD("gen: system_tokens must be > 0");
    if (o->memory_tokens && !o->memory_item_tokens) BAD("gen: memory_item_tokens must be > 0");
    if (memory_items(o) > MAX_MEMORY_ITEMS)
        BAD("gen: memory_tokens / memory_item_tokens must be at most %u items", MAX_MEMORY_ITEMS);
    if (!(o->drift >= 0 && o->drift <= 1)) BAD("gen: drift must be 0..1");
    if (o->docs_per_query > MAX_DOCS_PER_QUERY)
        BAD("gen: docs_per_query must be 0..%u", MAX_DOCS_PER_QUERY);
    if (o->docs_per_query && (!o->corpus || o->corpus > MAX_TABLE))
        BAD("gen: corpus must be 1..%llu", (unsigned long long)MAX_TABLE);
    if (o->docs_per_query > o->corpus) BAD("gen: docs_per_query must not exceed corpus");
    if (o->docs_per_query && !o->doc_tokens) BAD("gen: doc_tokens must be > 0");
    if (!(o->doc_alpha >= 0 && o->doc_alpha <= 10)) BAD("gen: doc_alpha must be 0..10");
    if (!o->turns || o->turns > 10000) BAD("gen: turns must be 1..10000");
    if (!(o->think >= 0 && o->think < 1e9)) BAD("gen: think must be >= 0 seconds");
    if (!(o->rate > 0 && o->rate < 1e9)) BAD("gen: rate must be > 0 requests per second");
    if (!(o->user_rate >= 0 && o->user_rate < 1e9))
        BAD("gen: user_rate must be >= 0 requests per user per hour");
    if (o->user_rate > 0 && !(total_rate(o) < 1e9))
        BAD("gen: users * user_rate / 3600 must be below 1e9 requests per second");
    if (!(o->duration >= 0 && o->duration < 1e12)) BAD("gen: duration must be >= 0 seconds");
    if (!o->requests && o->duration == 0) BAD("gen: give requests or duration (or both)");
    if (o->requests > MAX_REQUESTS)
        BAD("gen: requests must be at most %llu", (unsigned long long)MAX_REQUESTS);
    if (!o->requests && total_rate(o) * o->duration > (double)MAX_REQUESTS)
        BAD("gen: rate * duration must be at most %llu requests", (unsigned long long)MAX_REQUESTS);
    if (!o->intents || o->intents > MAX_TABLE)
        BAD("gen: intents must be 1..%llu", (unsigned long long)MAX_TABLE);
    if (!(o->intent_alpha >= 0 && o->intent_alpha <= 10)) BAD("gen: intent_alpha must be 0..10");
    if (!(o->novelty >= 0 && o->novelty <= 1)) BAD("gen: novelty must be 0..1");
    if (!o->query_tokens) BAD("gen: query_tokens must be > 0");
    if (!o->output_tokens) BAD("gen: output_tokens must be > 0");
    if (!ikv_gen_layout_name(o->layout)) BAD("gen: unknown layout");
    /* The longest prompt must fit a request. */
    double longest = (double)o->system_tokens + o->tool_tokens + o->memory_tokens +
                     (double)o->docs_per_query * o->doc_tokens +
                     (double)o->turns * (o->query_tokens + (double)o->output_tokens);
    /* ... and what the readers accept by default, so `isokv sim` replays every file gen writes
     * without raising --max-request-tokens / --max-segment-tokens */
    if (longest > (double)IKV_TRACE_DEFAULT_MAX_REQUEST_TOKENS)
        BAD("gen: the longest prompt (%.0f tokens) exceeds %llu (the trace readers' default "
            "--max-request-tokens)",
            longest, (unsigned long long)IKV_TRACE_DEFAULT_MAX_REQUEST_TOKENS);
    double seg = o->system_tokens;
    const double others[] = {o->tool_tokens, o->memory_item_tokens, o->doc_tokens, o->query_tokens,
                             o->output_tokens}; /* history: one per turn */
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
        if (others[i] > seg) seg = others[i];
    if (seg > (double)IKV_TRACE_DEFAULT_MAX_SEGMENT_TOKENS)
        BAD("gen: a segment of %.0f tokens exceeds %llu (the trace readers' default "
            "--max-segment-tokens)",
            seg, (unsigned long long)IKV_TRACE_DEFAULT_MAX_SEGMENT_TOKENS);
    return 0;
}

/* ---- generation -------------------------------------------------------------------------- */

typedef struct session {
    double start; /* seconds */
    uint64_t user;
    uint64_t id; /* 1-based, in start order */
    size_t mem;  /* offset of this session's memory versions in gen.versions */
    size_t turn; /* offset of this session's turns in gen.intents / gen.times */
} session;

typedef struct req_ref {
    double time;
    uint32_t session; /* index into gen.sessions */
    uint32_t turn;
} req_ref;

typedef struct gen {
    const ikv_gen_opts *o;
    rng r;
    zipf users, docs, intents;
    uint32_t items; /* memory items per user */
    session *sessions;
    size_t n_sessions, cap_sessions;
    uint32_t *versions; /* (sessions, items) memory item versions at session start */
    size_t cap_versions;
    uint64_t *intent_of; /* (sessions, turns) intent code (NOVEL_BIT | n for novel) */
    size_t cap_intents;
    req_ref *reqs;
    size_t n_reqs, cap_reqs;
    uint32_t *last; /* (users) 1 + index of the user's latest session; 0 = none */
    uint32_t *perm; /* (items) scratch for drift */
    uint64_t novel; /* novel intents so far */
} gen;

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 256;
    while (n < need)
        n *= 2;
    void *q = ikv_realloc(*p, n * size);
    if (!q) return IKV_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

static int cmp_req(const void *a, const void *b) {
    const req_ref *x = a, *y = b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    if (x->session != y->session) return x->session < y->session ? -1 : 1;
    return (x->turn > y->turn) - (x->turn < y->turn);
}

/* Adds one session starting at `start`: draws its user, memory versions, intents and turn
 * times, and appends its turns to g->reqs. */
static int add_session(gen *g, double start) {
    const ikv_gen_opts *o = g->o;
    size_t T = o->turns;
    if (g->n_sessions >= UINT32_MAX - 1) return ikv_error(IKV_ERANGE, "gen: too many sessions");
    if (grow((void **)&g->sessions, &g->cap_sessions, g->n_sessions + 1, sizeof *g->sessions) ||
        grow((void **)&g->versions, &g->cap_versions, (g->n_sessions + 1) * g->items,
             sizeof *g->versions) ||
        grow((void **)&g->intent_of, &g->cap_intents, (g->n_sessions + 1) * T,
             sizeof *g->intent_of) ||
        grow((void **)&g->reqs, &g->cap_reqs, g->n_reqs + T, sizeof *g->reqs))
        return IKV_ENOMEM;
    size_t si = g->n_sessions++;
    session *s = &g->sessions[si];
    s->start = start;
    s->user = zipf_draw(&g->users, &g->r);
    s->id = si + 1;
    s->mem = si * g->items;
    s->turn = si * T;
    uint32_t *v = g->versions + s->mem;
    uint32_t prev = g->last[s->user];
    if (!prev) {
        memset(v, 0, g->items * sizeof *v);
    } else {
        memcpy(v, g->versions + g->sessions[prev - 1].mem, g->items * sizeof *v);
        /* exactly round(drift * items) distinct items, by a partial Fisher-Yates shuffle */
        uint32_t k = (uint32_t)floor(o->drift * g->items + 0.5);
        for (uint32_t i = 0; i < g->items; i++)
            g->perm[i] = i;
        for (uint32_t i = 0; i < k; i++) {
            uint32_t j = i + (uint32_t)rng_below(&g->r, g->items - i);
            uint32_t t = g->perm[i];
            g->perm[i] = g->perm[j];
            g->perm[j] = t;
            v[g->perm[i]]++;
        }
    }
    g->last[s->user] = (uint32_t)si + 1;
    double t = start;
    for (size_t j = 0; j < T; j++) {
        if (j) t += o->think > 0 ? rng_exp(&g->r, 1.0 / o->think) : 0;
        uint64_t intent =
            rng_unit(&g->r) < o->novelty ? (NOVEL_BIT | g->novel++) : zipf_draw(&g->intents, &g->r);
        g->intent_of[s->turn + j] = intent;
        req_ref *q = &g->reqs[g->n_reqs++];
        q->time = t;
        q->session = (uint32_t)si;
        q->turn = (uint32_t)j;
    }
    return 0;
}

/* Generates sessions until the kept requests are known: those before the duration, and the
 * first R by time. A session starting after the R-th earliest request generated so far cannot
 * contribute to the first R, so generation stops there. */
static int generate(gen *g) {
    const ikv_gen_opts *o = g->o;
    double session_rate = total_rate(o) / o->turns, t = 0, bound = INFINITY;
    for (;;) {
        t += rng_exp(&g->r, session_rate);
        if (o->duration > 0 && t >= o->duration) break;
        if (t >= bound) break;
        int rc = add_session(g, t);
        if (rc) return rc;
        if (o->requests && bound == INFINITY && g->n_reqs >= o->requests) {
            qsort(g->reqs, g->n_reqs, sizeof *g->reqs, cmp_req);
            bound = g->reqs[o->requests - 1].time;
        }
    }
    qsort(g->reqs, g->n_reqs, sizeof *g->reqs, cmp_req);
    size_t keep = g->n_reqs;
    if (o->duration > 0)
        while (keep && g->reqs[keep - 1].time >= o->duration)
            keep--;
    if (o->requests && keep > o->requests) keep = o->requests;
    g->n_reqs = keep;
    return 0;
}

/* The k documents retrieved by an intent, in retrieval order: distinct Zipf draws from a stream
 * seeded by the intent alone. If 64 draws in a row repeat earlier ones (tiny corpus, steep
 * alpha), the most popular unused document is taken instead. */
static void docs_of(const gen *g, uint64_t intent, uint64_t *out) {
    rng r;
    rng_seed(&r, g->o->seed, STREAM_DOCS, intent);
    uint32_t k = g->o->docs_per_query;
    for (uint32_t i = 0; i < k; i++) {
        uint64_t d = 0;
        int ok = 0;
        for (int tries = 0; tries < 64 && !ok; tries++) {
            d = zipf_draw(&g->docs, &r);
            ok = 1;
            for (uint32_t j = 0; j < i; j++)
                ok &= out[j] != d;
        }
        for (d = ok ? d : 0; !ok; d++) {
            ok = 1;
            for (uint32_t j = 0; j < i; j++)
                ok &= out[j] != d;
            if (ok) break;
        }
        out[i] = d;
    }
}

static uint32_t app_of(const gen *g, uint64_t user) {
    uint64_t x = g->o->seed ^ (STREAM_APPS * GOLDEN) ^ (user * GOLDEN);
    return (uint32_t)(splitmix(&x) % g->o->apps);
}

static void put_seg(FILE *f, int *first, const char *kind, const char *id, uint64_t tokens,
                    int pub) {
    fprintf(f, "%s{\"kind\":\"%s\",\"id\":\"%s\",\"tokens\":%llu,\"public\":%s}", *first ? "" : ",",
            kind, id, (unsigned long long)tokens, pub ? "true" : "false");
    *first = 0;
}

static void intent_id(uint64_t intent, char *buf, size_t n) {
    if (intent & NOVEL_BIT)
        snprintf(buf, n, "n%llu", (unsigned long long)(intent & ~NOVEL_BIT));
    else
        snprintf(buf, n, "q%llu", (unsigned long long)intent);
}

static void write_memory(const gen *g, FILE *f, int *first, const session *s) {
    const ikv_gen_opts *o = g->o;
    char id[64];
    for (uint32_t i = 0; i < g->items; i++) {
        uint32_t len = o->memory_item_tokens;
        if (i == g->items - 1) len = o->memory_tokens - i * o->memory_item_tokens;
        snprintf(id, sizeof id, "m%u.v%u", i, g->versions[s->mem + i]);
        put_seg(f, first, "memory", id, len, 0);
    }
}

static void write_docs(const gen *g, FILE *f, int *first, uint64_t intent) {
    uint64_t docs[MAX_DOCS_PER_QUERY];
    char id[32];
    docs_of(g, intent, docs);
    for (uint32_t i = 0; i < g->o->docs_per_query; i++) {
        snprintf(id, sizeof id, "d%llu", (unsigned long long)docs[i]);
        put_seg(f, first, "doc", id, g->o->doc_tokens, !g->o->private_docs);
    }
}

static void write_request(const gen *g, FILE *f, const req_ref *q) {
    const ikv_gen_opts *o = g->o;
    const session *s = &g->sessions[q->session];
    uint32_t app = app_of(g, s->user);
    char id[64];
    int first = 1;
    fprintf(f,
            "{\"time\":%.6f,\"tenant\":\"u%llu\",\"session\":%llu,\"turn\":%u,\"output\":%u,"
            "\"segments\":[",
            q->time, (unsigned long long)s->user, (unsigned long long)s->id, q->turn,
            o->output_tokens);
    snprintf(id, sizeof id, "app%u", app);
    put_seg(f, &first, "system", id, o->system_tokens, 1);
    if (o->tool_tokens) {
        snprintf(id, sizeof id, "app%u.tools", app);
        put_seg(f, &first, "tool", id, o->tool_tokens, 1);
    }
    uint64_t intent = g->intent_of[s->turn + q->turn];
    if (o->layout == IKV_LAYOUT_PERSONAL_FIRST) {
        write_memory(g, f, &first, s);
        write_docs(g, f, &first, intent);
    } else {
        write_docs(g, f, &first, intent);
        write_memory(g, f, &first, s);
    }
    for (uint32_t j = 0; j < q->turn; j++) {
        intent_id(g->intent_of[s->turn + j], id, sizeof id);
        put_seg(f, &first, "query", id, o->query_tokens, 0);
        snprintf(id, sizeof id, "s%llu.a%u", (unsigned long long)s->id, j);
        put_seg(f, &first, "history", id, o->output_tokens, 0);
    }
    intent_id(intent, id, sizeof id);
    put_seg(f, &first, "query", id, o->query_tokens, 0);
    fputs("]}\n", f);
}

static void write_header(const ikv_gen_opts *o, FILE *f) {
    fprintf(f,
            "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":%u,\"generator\":{"
            "\"seed\":%llu,\"users\":%llu,\"user_alpha\":%g,\"apps\":%u,\"system_tokens\":%u,"
            "\"tool_tokens\":%u,\"memory_tokens\":%u,\"memory_item_tokens\":%u,\"drift\":%g,"
            "\"docs_per_query\":%u,\"corpus\":%llu,\"doc_tokens\":%u,\"doc_alpha\":%g,"
            "\"private_docs\":%s,\"turns\":%u,\"think\":%g,\"rate\":%g,\"user_rate\":%g,"
            "\"duration\":%g,"
            "\"requests\":%llu,\"intents\":%llu,\"intent_alpha\":%g,\"novelty\":%g,"
            "\"query_tokens\":%u,\"output_tokens\":%u,\"layout\":\"%s\"}}\n",
            o->block_tokens, (unsigned long long)o->seed, (unsigned long long)o->users,
            o->user_alpha, o->apps, o->system_tokens, o->tool_tokens, o->memory_tokens,
            o->memory_item_tokens, o->drift, o->docs_per_query, (unsigned long long)o->corpus,
            o->doc_tokens, o->doc_alpha, o->private_docs ? "true" : "false", o->turns, o->think,
            o->rate, o->user_rate, o->duration, (unsigned long long)o->requests,
            (unsigned long long)o->intents, o->intent_alpha, o->novelty, o->query_tokens,
            o->output_tokens, ikv_gen_layout_name(o->layout));
}

static void gen_free(gen *g) {
    ikv_free(g->users.cdf);
    ikv_free(g->docs.cdf);
    ikv_free(g->intents.cdf);
    ikv_free(g->sessions);
    ikv_free(g->versions);
    ikv_free(g->intent_of);
    ikv_free(g->reqs);
    ikv_free(g->last);
    ikv_free(g->perm);
}

int ikv_gen_write(const ikv_gen_opts *o, FILE *f, ikv_progress *progress, uint64_t *n_requests) {
    int rc = ikv_gen_opts_check(o);
    if (rc) return rc;
    gen g;
    memset(&g, 0, sizeof g);
    g.o = o;
    g.items = memory_items(o);
    rng_seed(&g.r, o->seed, STREAM_MAIN, 0);
    g.last = ikv_calloc(o->users, sizeof *g.last);
    g.perm = ikv_malloc((g.items ? g.items : 1) * sizeof *g.perm);
    if (!g.last || !g.perm || zipf_init(&g.users, o->users, o->user_alpha) ||
        zipf_init(&g.intents, o->intents, o->intent_alpha) ||
        (o->docs_per_query && zipf_init(&g.docs, o->corpus, o->doc_alpha))) {
        gen_free(&g);
        return IKV_ENOMEM;
    }
    rc = generate(&g);
    if (rc) {
        gen_free(&g);
        return rc;
    }
    if (progress) progress->total = g.n_reqs;
    write_header(o, f);
    for (size_t i = 0; i < g.n_reqs; i++) {
        write_request(&g, f, &g.reqs[i]);
        if (progress && (i & 1023) == 1023) ikv_progress_update(progress, i + 1);
    }
    if (progress) ikv_progress_update(progress, g.n_reqs);
    if (n_requests) *n_requests = g.n_reqs;
    gen_free(&g);
    if (fflush(f) || ferror(f)) return ikv_error(IKV_EIO, "gen: write failed: %s", strerror(errno));
    return 0;
}

int ikv_gen_write_file(const ikv_gen_opts *o, const char *path, ikv_progress *progress,
                       uint64_t *n_requests) {
    int rc = ikv_gen_opts_check(o);
    if (rc) return rc;
    ikv_outset *s = NULL;
    FILE *f = NULL;
    if ((rc = ikv_outset_create(&s))) return rc;
    if (!(rc = ikv_outset_add(s, path, &f, NULL)) &&
        !(rc = ikv_gen_write(o, f, progress, n_requests)))
        rc = ikv_outset_commit(s);
    ikv_outset_destroy(s);
    return rc;
}
