/*
 * redis-cluster: the redis backend over a Redis Cluster, with the slot routing done here.
 *
 *     redis-cluster://HOST:PORT[,HOST:PORT...][:SIZE]      (SIZE defaults to 1G)
 *
 * Routing. A key's slot is CRC16(key) mod 16384 (hash tags honoured; isokv's names carry none,
 * so blocks spread over every master). The slot map (slot -> master) comes from CLUSTER SLOTS,
 * asked of the first seed or known node that answers, at open and again after any MOVED or a
 * node failure. A run is split by master, each part pipelined to its node; a reply
 * "-MOVED slot host:port" updates that slot and resends the command to the named node, "-ASK
 * slot host:port" sends ASKING then the command there once (the map is not changed), up to
 * 5 hops. A node that is down or slow answers misses (rconn.h backoff) and the map is
 * refreshed on the next call, which is how a resharding or a failover is followed.
 */
#include "rconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 32
#define NSLOTS    16384
#define NO_NODE   0xff

typedef struct cstore {
    ikv__rconn nodes[MAX_NODES];
    size_t nn, nseeds;
    uint8_t slot_node[NSLOTS];
    int need_refresh;
    double timeout_s;
    uint64_t fp, resident, moved, asked, refreshes;
} cstore;

/* The node index of host:port, added if new; NO_NODE when the table is full. */
static uint8_t node_of(cstore *s, const char *host, size_t hlen, int port) {
    for (size_t i = 0; i < s->nn; i++)
        if (s->nodes[i].port == port && strlen(s->nodes[i].host) == hlen &&
            !memcmp(s->nodes[i].host, host, hlen))
            return (uint8_t)i;
    if (s->nn == MAX_NODES || hlen >= sizeof s->nodes[0].host) return NO_NODE;
    ikv__rconn *r = &s->nodes[s->nn];
    memset(r, 0, sizeof *r);
    memcpy(r->host, host, hlen);
    r->host[hlen] = 0;
    r->port = port;
    r->timeout_s = s->timeout_s;
    return (uint8_t)s->nn++;
}

/* Reloads the slot map from the first node that answers CLUSTER SLOTS. 0 or IKV_EIO. */
static int refresh(cstore *s) {
    s->refreshes++;
    for (size_t i = 0; i < s->nn; i++) {
        ikv__rconn *r = &s->nodes[i];
        if (ikv__rconn_ensure(r)) continue;
        const char *argv[2] = {"CLUSTER", "SLOTS"};
        redisReply *rep = ikv__rconn_cmd(r, 2, argv, NULL);
        if (!rep) continue;
        int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements > 0;
        if (ok) {
            memset(s->slot_node, NO_NODE, sizeof s->slot_node);
            for (size_t e = 0; e < rep->elements; e++) {
                redisReply *x = rep->element[e];
                if (x->type != REDIS_REPLY_ARRAY || x->elements < 3) continue;
                redisReply *m = x->element[2];
                if (x->element[0]->type != REDIS_REPLY_INTEGER ||
                    x->element[1]->type != REDIS_REPLY_INTEGER || m->type != REDIS_REPLY_ARRAY ||
                    m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
                    m->element[1]->type != REDIS_REPLY_INTEGER)
                    continue;
                long long a = x->element[0]->integer, b = x->element[1]->integer;
                const char *h = m->element[0]->str;
                size_t hl = m->element[0]->len;
                if (hl == 0) h = r->host, hl = strlen(r->host); /* "" means the node asked */
                uint8_t nd = node_of(s, h, hl, (int)m->element[1]->integer);
                for (long long sl = a; sl <= b && sl < NSLOTS; sl++)
                    if (sl >= 0) s->slot_node[sl] = nd;
            }
        }
        freeReplyObject(rep);
        if (ok) {
            s->need_refresh = 0;
            return 0;
        }
    }
    return IKV_EIO;
}

static int cluster_open(const char *rest, const ikv_store_params *p, void **impl, uint64_t *cap) {
    cstore *s = ikv_calloc(1, sizeof *s);
    if (!s) return ikv_error(IKV_ENOMEM, "redis-cluster store");
    s->timeout_s = p->timeout_s;
    s->fp = p->fingerprint;
    uint64_t size = 1ull << 30;
    /* seeds: HOST:PORT separated by commas; an optional trailing :SIZE */
    const char *end = rest + strlen(rest);
    const char *last = strrchr(rest, ':'), *lastcomma = strrchr(rest, ',');
    if (last && (!lastcomma || last > lastcomma)) {
        /* HOST:PORT:SIZE has two colons in its last seed */
        const char *prev = last - 1;
        while (prev > rest && *prev != ':' && *prev != ',')
            prev--;
        if (*prev == ':') {
            if (ikv_parse_size(last + 1, &size) || size == 0) {
                ikv_free(s);
                return ikv_error(IKV_EPARAM, "tier redis-cluster://%s: size '%s' is not a size > 0",
                                 rest, last + 1);
            }
            end = last;
        }
    }
    for (const char *a = rest; a < end;) {
        const char *c = memchr(a, ',', (size_t)(end - a));
        const char *e = c ? c : end;
        ikv__rconn tmp;
        memset(&tmp, 0, sizeof tmp);
        if (ikv__rconn_parse(&tmp, a, (size_t)(e - a)) ||
            node_of(s, tmp.host, strlen(tmp.host), tmp.port) == NO_NODE) {
            ikv_free(s);
            return ikv_error(IKV_EPARAM,
                             "tier redis-cluster://%s: expected "
                             "HOST:PORT[,HOST:PORT...][:SIZE]",
                             rest);
        }
        a = c ? c + 1 : end;
    }
    s->nseeds = s->nn;
    if (s->nn == 0) {
        ikv_free(s);
        return ikv_error(IKV_EPARAM, "tier redis-cluster://%s: no seed node", rest);
    }
    *cap = size / p->slot_bytes;
    if (*cap == 0) {
        ikv_free(s);
        return ikv_error(IKV_EPARAM, "tier redis-cluster://%s: %llu bytes hold no block", rest,
                         (unsigned long long)size);
    }
    if (refresh(s)) {
        for (size_t i = 0; i < s->nn; i++)
            ikv__rconn_close(&s->nodes[i]);
        ikv_free(s);
        return ikv_error(IKV_EIO,
                         "tier redis-cluster://%s: no seed answers CLUSTER SLOTS within "
                         "%.2f s",
                         rest, p->timeout_s);
    }
    *impl = s;
    return 0;
}

static void cluster_close(void *impl) {
    cstore *s = impl;
    if (!s) return;
    for (size_t i = 0; i < s->nn; i++)
        ikv__rconn_close(&s->nodes[i]);
    ikv_free(s);
}

/* Parses "MOVED slot host:port" / "ASK slot host:port"; returns the node or NO_NODE. */
static uint8_t redirect(cstore *s, const redisReply *rep, int *ask, unsigned *slot) {
    if (rep->type != REDIS_REPLY_ERROR) return NO_NODE;
    const char *t = rep->str;
    if (!strncmp(t, "MOVED ", 6))
        *ask = 0, t += 6;
    else if (!strncmp(t, "ASK ", 4))
        *ask = 1, t += 4;
    else
        return NO_NODE;
    char *e;
    unsigned long sl = strtoul(t, &e, 10);
    if (*e != ' ' || sl >= NSLOTS) return NO_NODE;
    const char *hp = e + 1, *colon = strrchr(hp, ':');
    if (!colon) return NO_NODE;
    int port = atoi(colon + 1);
    *slot = (unsigned)sl;
    return node_of(s, hp, (size_t)(colon - hp), port);
}

/* Runs one verb over a chunk: split by master, pipelined per node, redirections followed. */
static void run(cstore *s, const char *verb, const ikv_key *keys, const uint64_t *scopes,
                const void *const *vals, const size_t *vlens, size_t n, int *rcs,
                void (*fn)(void *, size_t, redisReply *), ikv__rctx *g) {
    char names[IKV__STORE_CHUNK][96];
    size_t nl[IKV__STORE_CHUNK];
    unsigned slots[IKV__STORE_CHUNK];
    uint8_t target[IKV__STORE_CHUNK], hop_ask[IKV__STORE_CHUNK];
    if (s->need_refresh) (void)refresh(s);
    for (size_t i = 0; i < n; i++) {
        rcs[i] = IKV_EIO;
        nl[i] = ikv__redis_keyname(names[i], s->fp, scopes[i], keys[i]);
        slots[i] = ikv__redis_slot(names[i], nl[i]);
        target[i] = s->slot_node[slots[i]];
        hop_ask[i] = 0;
    }
    for (int hop = 0; hop < 6; hop++) {
        int pending = 0;
        for (size_t nd = 0; nd < s->nn; nd++) {
            size_t idx[IKV__STORE_CHUNK], k = 0;
            for (size_t i = 0; i < n; i++)
                if (target[i] == nd) idx[k++] = i;
            if (!k) continue;
            ikv__rconn *r = &s->nodes[nd];
            if (ikv__rconn_ensure(r)) {
                for (size_t j = 0; j < k; j++)
                    target[idx[j]] = NO_NODE;
                s->need_refresh = 1;
                continue;
            }
            size_t sent = 0;
            for (; sent < k; sent++) {
                size_t i = idx[sent];
                if (hop_ask[i]) {
                    const char *a[1] = {"ASKING"};
                    if (redisAppendCommandArgv(r->c, 1, a, NULL) != REDIS_OK) break;
                }
                const char *argv[3] = {verb, names[i], vals ? vals[i] : NULL};
                size_t lens[3] = {strlen(verb), nl[i], vals ? vlens[i] : 0};
                if (redisAppendCommandArgv(r->c, vals ? 3 : 2, argv, lens) != REDIS_OK) break;
            }
            int failed = sent < k;
            for (size_t j = 0; j < sent && !failed; j++) {
                size_t i = idx[j];
                void *rep = NULL;
                if (hop_ask[i]) {
                    if (redisGetReply(r->c, &rep) != REDIS_OK || !rep) {
                        failed = 1;
                        break;
                    }
                    freeReplyObject(rep);
                    rep = NULL;
                }
                if (redisGetReply(r->c, &rep) != REDIS_OK || !rep) {
                    failed = 1;
                    break;
                }
                int ask = 0;
                unsigned sl = 0;
                uint8_t to = redirect(s, rep, &ask, &sl);
                target[i] = NO_NODE;
                hop_ask[i] = 0;
                if (to != NO_NODE) {
                    target[i] = to;
                    hop_ask[i] = (uint8_t)ask;
                    if (ask) {
                        s->asked++;
                    } else {
                        s->moved++;
                        s->slot_node[sl] = to;
                        s->need_refresh = 1;
                    }
                    pending = 1;
                } else {
                    fn(g, i, rep);
                }
                freeReplyObject(rep);
            }
            if (failed) {
                ikv__rconn_fail(r);
                s->need_refresh = 1;
                for (size_t j = 0; j < k; j++)
                    if (target[idx[j]] == nd) target[idx[j]] = NO_NODE;
            }
        }
        if (!pending) break;
    }
}

static void cluster_put(void *impl, const ikv_key *keys, const uint64_t *scopes,
                        const void *const *blobs, const size_t *lens, size_t n, int *rcs) {
    cstore *s = impl;
    ikv__rctx g = {.rcs = rcs};
    run(s, "SET", keys, scopes, blobs, lens, n, rcs, ikv__redis_on_set, &g);
    for (size_t i = 0; i < n; i++)
        s->resident += rcs[i] == 0;
}

static void cluster_get(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                        void *const *bufs, size_t cap, size_t *lens, int *rcs) {
    ikv__rctx g = {.bufs = bufs, .cap = cap, .lens = lens, .rcs = rcs};
    run(impl, "GET", keys, scopes, NULL, NULL, n, rcs, ikv__redis_on_get, &g);
}

static int cluster_exists(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                          uint8_t *found) {
    int rcs[IKV__STORE_CHUNK];
    ikv__rctx g = {.rcs = rcs, .found = found};
    run(impl, "EXISTS", keys, scopes, NULL, NULL, n, rcs, ikv__redis_on_int, &g);
    for (size_t i = 0; i < n; i++)
        if (rcs[i]) found[i] = 0; /* a node down: its keys are not found */
    return 0;
}

static int cluster_del(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n) {
    cstore *s = impl;
    int rcs[IKV__STORE_CHUNK], rc = 0;
    uint8_t found[IKV__STORE_CHUNK] = {0};
    ikv__rctx g = {.rcs = rcs, .found = found};
    run(s, "DEL", keys, scopes, NULL, NULL, n, rcs, ikv__redis_on_int, &g);
    for (size_t i = 0; i < n; i++) {
        if (rcs[i])
            rc = IKV_EIO;
        else if (found[i] && s->resident)
            s->resident--;
    }
    return rc;
}

static void cluster_stats(void *impl, ikv_store_stats *st) {
    const cstore *s = impl;
    st->resident = s->resident;
    st->redirects = s->moved + s->asked;
    for (size_t i = 0; i < s->nn; i++)
        st->reconnects += s->nodes[i].reconnects;
}

/* Every slot maps to a known node. */
static int cluster_check(void *impl) {
    const cstore *s = impl;
    for (size_t i = 0; i < NSLOTS; i++)
        if (s->slot_node[i] != NO_NODE && s->slot_node[i] >= s->nn)
            return ikv_error(IKV_EINVAL, "redis-cluster: slot %zu maps to node %u of %zu", i,
                             s->slot_node[i], s->nn);
    return 1;
}

const ikv__store_ops ikv__store_redis_cluster = {
    .scheme = "redis-cluster",
    .doc = "redis-cluster://HOST:PORT[,HOST:PORT...][:SIZE]  Redis Cluster, CRC16 slot routing",
    .shared = 1,
    .open = cluster_open,
    .close = cluster_close,
    .put = cluster_put,
    .get = cluster_get,
    .exists = cluster_exists,
    .del = cluster_del,
    .stats = cluster_stats,
    .check = cluster_check,
};
