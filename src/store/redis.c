/*
 * redis: one Redis key per block (hiredis), against a single redis-server.
 *
 *     redis://HOST:PORT[/DB]:SIZE
 *
 * The key is "ikv:<fingerprint>:<scope>:<block key>" in hex, so blocks of different models
 * and tenants never share a name; the value is the blob (store.h), the same bytes as a file
 * slot. A run of n blocks is one pipelined round trip: n commands written, then n replies read
 * (SET / GET / EXISTS / DEL). SIZE sets the capacity the cache core gives this tier; Redis's
 * own maxmemory policy may evict sooner, which costs misses. Connection handling (timeouts,
 * down, backoff, reconnect) is in rconn.h.
 */
#include "rconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

size_t ikv__redis_keyname(char *out, uint64_t fp, uint64_t scope, ikv_key key) {
    return (size_t)sprintf(out, "ikv:%016llx:%016llx:%016llx%016llx", (unsigned long long)fp,
                           (unsigned long long)scope, (unsigned long long)key.hi,
                           (unsigned long long)key.lo);
}

/* CRC16-CCITT (XMODEM), as in the Redis Cluster specification. */
static uint16_t crc16(const char *buf, size_t len) {
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint8_t)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned ikv__redis_slot(const char *key, size_t len) {
    size_t s = 0;
    while (s < len && key[s] != '{')
        s++;
    if (s < len) {
        size_t e = s + 1;
        while (e < len && key[e] != '}')
            e++;
        if (e < len && e > s + 1) return crc16(key + s + 1, e - s - 1) & 16383u;
    }
    return crc16(key, len) & 16383u;
}

/* ---- connection --------------------------------------------------------------------------- */

static struct timeval tv_of(double s) {
    struct timeval tv = {.tv_sec = (time_t)s,
                         .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6)};
    return tv;
}

void ikv__rconn_close(ikv__rconn *r) {
    if (r->c) redisFree(r->c);
    r->c = NULL;
}

void ikv__rconn_fail(ikv__rconn *r) {
    ikv__rconn_close(r);
    r->failures++;
    r->backoff = r->backoff <= 0 ? 0.1 : r->backoff * 2;
    if (r->backoff > 5) r->backoff = 5;
    r->retry_at = ikv_now() + r->backoff;
}

int ikv__rconn_ensure(ikv__rconn *r) {
    if (r->c) return 0;
    if (ikv_now() < r->retry_at) return IKV_EIO;
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv_of(r->timeout_s));
    if (!c || c->err) {
        if (c) redisFree(c);
        ikv__rconn_fail(r);
        return IKV_EIO;
    }
    redisSetTimeout(c, tv_of(r->timeout_s));
    r->c = c;
    if (r->db) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        const char *argv[2] = {"SELECT", db};
        redisReply *rep = ikv__rconn_cmd(r, 2, argv, NULL);
        int ok = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep) freeReplyObject(rep);
        if (!ok) {
            if (r->c) ikv__rconn_fail(r);
            return IKV_EIO;
        }
    }
    if (r->was_up) r->reconnects++;
    r->was_up = 1;
    r->backoff = 0;
    return 0;
}

redisReply *ikv__rconn_cmd(ikv__rconn *r, int argc, const char **argv, const size_t *lens) {
    if (!r->c) return NULL;
    redisReply *rep = redisCommandArgv(r->c, argc, argv, lens);
    if (!rep) ikv__rconn_fail(r);
    return rep;
}

int ikv__rconn_parse(ikv__rconn *r, const char *s, size_t len) {
    const char *colon = memchr(s, ':', len);
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof r->host) return IKV_EPARAM;
    memcpy(r->host, s, (size_t)(colon - s));
    r->host[colon - s] = 0;
    long port = 0;
    const char *p = colon + 1;
    if (p >= s + len) return IKV_EPARAM;
    for (; p < s + len; p++) {
        if (*p < '0' || *p > '9') return IKV_EPARAM;
        port = port * 10 + (*p - '0');
        if (port > 65535) return IKV_EPARAM;
    }
    if (port == 0) return IKV_EPARAM;
    r->port = (int)port;
    return 0;
}

/* ---- the backend -------------------------------------------------------------------------- */

typedef struct rstore {
    ikv__rconn r;
    uint64_t fp;
    uint64_t resident;
} rstore;

static int redis_open(const char *rest, const ikv_store_params *p, void **impl, uint64_t *cap) {
    /* HOST:PORT[/DB]:SIZE */
    const char *last = strrchr(rest, ':');
    rstore *s = ikv_calloc(1, sizeof *s);
    if (!s) return ikv_error(IKV_ENOMEM, "redis store");
    uint64_t size = 0;
    const char *slash = last ? memchr(rest, '/', (size_t)(last - rest)) : NULL;
    const char *hp_end = slash ? slash : last;
    int bad = !last || ikv_parse_size(last + 1, &size) || size == 0 || !hp_end ||
              ikv__rconn_parse(&s->r, rest, (size_t)(hp_end - rest));
    if (!bad && slash) {
        char *e;
        long db = strtol(slash + 1, &e, 10);
        bad = e != last || db < 0 || db > 1000 || e == slash + 1;
        s->r.db = (int)db;
    }
    if (bad) {
        ikv_free(s);
        return ikv_error(IKV_EPARAM,
                         "tier redis://%s: expected redis://HOST:PORT[/DB]:SIZE with "
                         "SIZE > 0 (k/M/G)",
                         rest);
    }
    *cap = size / p->slot_bytes;
    if (*cap == 0) {
        ikv_free(s);
        return ikv_error(IKV_EPARAM, "tier redis://%s: %llu bytes hold no block of %zu bytes", rest,
                         (unsigned long long)size, p->slot_bytes);
    }
    s->r.timeout_s = p->timeout_s;
    s->fp = p->fingerprint;
    if (ikv__rconn_ensure(&s->r)) {
        int rc = ikv_error(IKV_EIO, "tier redis://%s: cannot reach %s:%d within %.2f s", rest,
                           s->r.host, s->r.port, p->timeout_s);
        ikv_free(s);
        return rc;
    }
    const char *ping[1] = {"PING"};
    redisReply *rep = ikv__rconn_cmd(&s->r, 1, ping, NULL);
    int ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep) freeReplyObject(rep);
    if (!ok) {
        int rc = ikv_error(IKV_EIO, "tier redis://%s: %s:%d does not answer PING", rest, s->r.host,
                           s->r.port);
        ikv__rconn_close(&s->r);
        ikv_free(s);
        return rc;
    }
    *impl = s;
    return 0;
}

static void redis_close(void *impl) {
    rstore *s = impl;
    if (!s) return;
    ikv__rconn_close(&s->r);
    ikv_free(s);
}

/* Pipelines n commands of one verb over keys (with values for SET), reading n replies; calls
 * on_reply(i, reply) for each, or sets rcs[i] = IKV_EIO for the ones lost to a failure. */
typedef void (*reply_fn)(void *ctx, size_t i, redisReply *rep);
static void pipeline(rstore *s, const char *verb, const ikv_key *keys, const uint64_t *scopes,
                     const void *const *vals, const size_t *vlens, size_t n, int *rcs, reply_fn fn,
                     void *ctx) {
    for (size_t i = 0; i < n; i++)
        rcs[i] = IKV_EIO;
    if (ikv__rconn_ensure(&s->r)) return;
    char name[96];
    size_t sent = 0;
    for (; sent < n; sent++) {
        size_t nl = ikv__redis_keyname(name, s->fp, scopes[sent], keys[sent]);
        const char *argv[3] = {verb, name, vals ? vals[sent] : NULL};
        size_t lens[3] = {strlen(verb), nl, vals ? vlens[sent] : 0};
        if (redisAppendCommandArgv(s->r.c, vals ? 3 : 2, argv, lens) != REDIS_OK) break;
    }
    for (size_t i = 0; i < sent; i++) {
        void *rep = NULL;
        if (redisGetReply(s->r.c, &rep) != REDIS_OK || !rep) {
            ikv__rconn_fail(&s->r);
            return;
        }
        rcs[i] = 0;
        fn(ctx, i, rep);
        freeReplyObject(rep);
    }
    if (sent < n) ikv__rconn_fail(&s->r);
}

typedef ikv__rctx getctx;

void ikv__redis_on_set(void *ctx, size_t i, redisReply *rep) {
    getctx *g = ctx;
    g->rcs[i] = rep->type == REDIS_REPLY_STATUS ? 0 : IKV_EIO;
}

void ikv__redis_on_get(void *ctx, size_t i, redisReply *rep) {
    getctx *g = ctx;
    if (rep->type == REDIS_REPLY_NIL) {
        g->rcs[i] = IKV_ENOENT;
    } else if (rep->type != REDIS_REPLY_STRING) {
        g->rcs[i] = IKV_EIO;
    } else if (rep->len > g->cap) {
        g->rcs[i] = IKV_ECORRUPT;
    } else {
        memcpy(g->bufs[i], rep->str, rep->len);
        g->lens[i] = rep->len;
        g->rcs[i] = 0;
    }
}

void ikv__redis_on_int(void *ctx, size_t i, redisReply *rep) {
    getctx *g = ctx;
    if (rep->type == REDIS_REPLY_INTEGER) {
        if (g->found) g->found[i] = rep->integer > 0;
        g->rcs[i] = 0;
    } else {
        g->rcs[i] = IKV_EIO;
    }
}

static void redis_put(void *impl, const ikv_key *keys, const uint64_t *scopes,
                      const void *const *blobs, const size_t *lens, size_t n, int *rcs) {
    rstore *s = impl;
    getctx g = {.rcs = rcs};
    pipeline(s, "SET", keys, scopes, blobs, lens, n, rcs, ikv__redis_on_set, &g);
    for (size_t i = 0; i < n; i++)
        s->resident += rcs[i] == 0;
}

static void redis_get(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                      void *const *bufs, size_t cap, size_t *lens, int *rcs) {
    getctx g = {.bufs = bufs, .cap = cap, .lens = lens, .rcs = rcs};
    pipeline(impl, "GET", keys, scopes, NULL, NULL, n, rcs, ikv__redis_on_get, &g);
}

static int redis_exists(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                        uint8_t *found) {
    int rcs[IKV__STORE_CHUNK];
    getctx g = {.rcs = rcs, .found = found};
    pipeline(impl, "EXISTS", keys, scopes, NULL, NULL, n, rcs, ikv__redis_on_int, &g);
    for (size_t i = 0; i < n; i++)
        if (rcs[i]) return IKV_EIO;
    return 0;
}

static int redis_del(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n) {
    rstore *s = impl;
    int rcs[IKV__STORE_CHUNK];
    uint8_t found[IKV__STORE_CHUNK] = {0};
    getctx g = {.rcs = rcs, .found = found};
    pipeline(s, "DEL", keys, scopes, NULL, NULL, n, rcs, ikv__redis_on_int, &g);
    for (size_t i = 0; i < n; i++) {
        if (rcs[i]) return IKV_EIO;
        if (found[i] && s->resident) s->resident--;
    }
    return 0;
}

static void redis_stats(void *impl, ikv_store_stats *st) {
    const rstore *s = impl;
    st->resident = s->resident;
    st->reconnects = s->r.reconnects;
}

const ikv__store_ops ikv__store_redis = {
    .scheme = "redis",
    .doc = "redis://HOST:PORT[/DB]:SIZE  one Redis key per block, pipelined runs (shared)",
    .shared = 1,
    .open = redis_open,
    .close = redis_close,
    .put = redis_put,
    .get = redis_get,
    .exists = redis_exists,
    .del = redis_del,
    .stats = redis_stats,
    .check = NULL,
};
