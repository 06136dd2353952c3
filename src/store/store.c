/*
 * Stores: the spec parser, the backend registry, blob format (seal / check), and the run calls
 * that verify every answer (fail closed) and count outcomes. See store.h for the blob layout.
 *
 * A get is an answer only when the blob's magic, version, lengths and XXH3-64 checksum hold
 * (else `corrupt`) and its key, scope, fingerprint and token ids are the ones asked for (else
 * `mismatch`): a collision, a torn write, a flipped bit or a block of another model costs a
 * miss, never a wrong answer. Runs go to the backend in chunks of IKV__STORE_CHUNK blocks,
 * with the per-chunk arrays on the stack, so mem and file never allocate here.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

static const ikv__store_ops *const registry[] = {&ikv__store_mem, &ikv__store_file,
                                                 &ikv__store_redis, &ikv__store_redis_cluster};
#define NREG (sizeof registry / sizeof registry[0])

struct ikv_store {
    const ikv__store_ops *ops;
    void *impl;
    ikv_store_params p;
    uint64_t capacity;
    char spec[256];
    ikv_store_stats st;
};

size_t ikv_store_backend_count(void) {
    return NREG;
}
const char *ikv_store_backend_name(size_t i) {
    return i < NREG ? registry[i]->scheme : NULL;
}
const char *ikv_store_backend_doc(size_t i) {
    return i < NREG ? registry[i]->doc : NULL;
}

int ikv_parse_size(const char *s, uint64_t *out) {
    if (!s || !*s) return IKV_EPARAM;
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return IKV_EPARAM;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k':
        case 'K':
            mul = 1024.0;
            break;
        case 'm':
        case 'M':
            mul = 1024.0 * 1024;
            break;
        case 'g':
        case 'G':
            mul = 1024.0 * 1024 * 1024;
            break;
        case 't':
        case 'T':
            mul = 1024.0 * 1024 * 1024 * 1024;
            break;
        default:
            return IKV_EPARAM;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return IKV_EPARAM;
    }
    v *= mul;
    if (v >= 1.8e19) return IKV_EPARAM;
    *out = (uint64_t)v;
    return 0;
}

/* ---- blobs -------------------------------------------------------------------------------- */

uint32_t *ikv_blob_init(void *blob, const ikv_blob_desc *d, void **payload) {
    uint8_t *b = blob;
    memset(b, 0, IKV_BLOB_HDR);
    ikv__wr32(b, IKV_BLOB_MAGIC);
    b[4] = IKV_BLOB_VERSION & 0xff, b[5] = IKV_BLOB_VERSION >> 8;
    b[6] = d->dtype;
    ikv__wr32(b + 8, d->ntok);
    ikv__wr32(b + 12, d->payload_bytes);
    ikv__wr64(b + 16, d->key.lo);
    ikv__wr64(b + 24, d->key.hi);
    ikv__wr64(b + 40, d->scope);
    if (payload) *payload = b + IKV_BLOB_HDR + (size_t)d->ntok * 4;
    return (uint32_t *)(void *)(b + IKV_BLOB_HDR);
}

int ikv_blob_parse(const void *blob, size_t len, ikv_blob_desc *d, uint64_t *fingerprint) {
    const uint8_t *b = blob;
    if (len < IKV_BLOB_HDR)
        return ikv_error(IKV_EFORMAT, "blob of %zu bytes: shorter than its header", len);
    if (ikv__rd32(b) != IKV_BLOB_MAGIC) return ikv_error(IKV_EFORMAT, "blob: bad magic");
    unsigned ver = b[4] | (unsigned)b[5] << 8;
    if (ver != IKV_BLOB_VERSION)
        return ikv_error(IKV_EFORMAT, "blob: format version %u, expected %u", ver,
                         IKV_BLOB_VERSION);
    uint32_t ntok = ikv__rd32(b + 8), pay = ikv__rd32(b + 12);
    if (b[6] > IKV_BLOB_DTYPE_Q8 || ntok > (1u << 20) || ikv_blob_bytes(ntok, pay) != len)
        return ikv_error(IKV_EFORMAT,
                         "blob: %u tokens and %u payload bytes disagree with its %zu bytes", ntok,
                         pay, len);
    if (d) {
        d->dtype = b[6];
        d->ntok = ntok;
        d->payload_bytes = pay;
        d->key.lo = ikv__rd64(b + 16);
        d->key.hi = ikv__rd64(b + 24);
        d->scope = ikv__rd64(b + 40);
    }
    if (fingerprint) *fingerprint = ikv__rd64(b + 32);
    return 0;
}

int ikv__blob_ident(const void *hdr, ikv_key *key, uint64_t *scope, uint64_t *wtime) {
    const uint8_t *b = hdr;
    if (ikv__rd32(b) != IKV_BLOB_MAGIC) return 0;
    key->lo = ikv__rd64(b + 16);
    key->hi = ikv__rd64(b + 24);
    *scope = ikv__rd64(b + 40);
    if (wtime) *wtime = ikv__rd64(b + 48);
    return 1;
}

/* XXH3-64 of the header's first 56 bytes, then (seeded by that) of the body. */
static uint64_t blob_sum(const uint8_t *b, size_t len) {
    uint64_t h = XXH3_64bits(b, 56);
    return XXH3_64bits_withSeed(b + IKV_BLOB_HDR, len - IKV_BLOB_HDR, h);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void ikv_blob_seal(void *blob, uint64_t fingerprint) {
    uint8_t *b = blob;
    size_t len = ikv_blob_bytes(ikv__rd32(b + 8), ikv__rd32(b + 12));
    ikv__wr64(b + 32, fingerprint);
    ikv__wr64(b + 48, now_ns());
    ikv__wr64(b + 56, blob_sum(b, len));
}

int ikv_blob_check(const void *blob, size_t len) {
    int rc = ikv_blob_parse(blob, len, NULL, NULL);
    if (rc) return rc;
    const uint8_t *b = blob;
    if (blob_sum(b, len) != ikv__rd64(b + 56))
        return ikv_error(IKV_ECORRUPT, "blob: checksum mismatch");
    return 0;
}

const uint32_t *ikv_blob_tokens(const void *blob) {
    return (const uint32_t *)(const void *)((const uint8_t *)blob + IKV_BLOB_HDR);
}

const void *ikv_blob_payload(const void *blob) {
    const uint8_t *b = blob;
    return b + IKV_BLOB_HDR + (size_t)ikv__rd32(b + 8) * 4;
}

/* ---- open / close ------------------------------------------------------------------------- */

int ikv_store_open(const char *spec, const ikv_store_params *p, ikv_store **out) {
    *out = NULL;
    if (!spec || !*spec) return ikv_error(IKV_EPARAM, "empty tier spec");
    if (!p || p->slot_bytes < IKV_BLOB_HDR)
        return ikv_error(IKV_EINVAL, "store: slot size %zu is smaller than a blob header",
                         p ? p->slot_bytes : 0);
    if (strlen(spec) >= sizeof((ikv_store *)0)->spec)
        return ikv_error(IKV_EPARAM, "tier spec '%.40s...' is too long", spec);
    const ikv__store_ops *ops = NULL;
    const char *rest = NULL;
    for (size_t i = 0; i < NREG && !ops; i++) {
        size_t n = strlen(registry[i]->scheme);
        if (strncmp(spec, registry[i]->scheme, n)) continue;
        if (!strncmp(spec + n, "://", 3))
            ops = registry[i], rest = spec + n + 3;
        else if (spec[n] == ':')
            ops = registry[i], rest = spec + n + 1;
    }
    if (!ops)
        return ikv_error(IKV_EPARAM,
                         "tier spec '%s': unknown scheme (expected mem:SIZE, file:PATH:SIZE, "
                         "redis://HOST:PORT[/DB]:SIZE or redis-cluster://HOST:PORT[,...][:SIZE])",
                         spec);
    ikv_store *s = ikv_calloc(1, sizeof *s);
    if (!s) return ikv_error(IKV_ENOMEM, "store");
    s->ops = ops;
    s->p = *p;
    if (s->p.timeout_s <= 0) s->p.timeout_s = 0.5;
    strcpy(s->spec, spec);
    int rc = ops->open(rest, &s->p, &s->impl, &s->capacity);
    if (rc) {
        ikv_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void ikv_store_close(ikv_store *s) {
    if (!s) return;
    s->ops->close(s->impl);
    ikv_free(s);
}

/* ---- runs --------------------------------------------------------------------------------- */

size_t ikv_store_put_run(ikv_store *s, void *const *blobs, size_t n, int *rcs) {
    double t0 = ikv_now();
    size_t ok = 0;
    for (size_t i0 = 0; i0 < n; i0 += IKV__STORE_CHUNK) {
        size_t k = n - i0 < IKV__STORE_CHUNK ? n - i0 : IKV__STORE_CHUNK;
        ikv_key keys[IKV__STORE_CHUNK];
        uint64_t scopes[IKV__STORE_CHUNK];
        size_t lens[IKV__STORE_CHUNK];
        const void *bl[IKV__STORE_CHUNK];
        int r[IKV__STORE_CHUNK];
        size_t m = 0, idx[IKV__STORE_CHUNK];
        for (size_t j = 0; j < k; j++) {
            uint8_t *b = blobs[i0 + j];
            size_t len = ikv_blob_bytes(ikv__rd32(b + 8), ikv__rd32(b + 12));
            if (ikv__rd32(b) != IKV_BLOB_MAGIC || len > s->p.slot_bytes) {
                if (rcs) rcs[i0 + j] = IKV_EINVAL;
                s->st.put_fail++;
                continue;
            }
            ikv_blob_seal(b, s->p.fingerprint);
            ikv_blob_desc d;
            (void)ikv_blob_parse(b, len, &d, NULL);
            keys[m] = d.key, scopes[m] = d.scope, lens[m] = len, bl[m] = b, idx[m] = i0 + j;
            m++;
        }
        if (!m) continue;
        s->ops->put(s->impl, keys, scopes, bl, lens, m, r);
        for (size_t j = 0; j < m; j++) {
            if (rcs) rcs[idx[j]] = r[j];
            if (r[j] == 0)
                ok++, s->st.puts++, s->st.put_bytes += lens[j];
            else
                s->st.put_fail++;
        }
    }
    s->st.put_seconds += ikv_now() - t0;
    return ok;
}

/* Verifies one returned blob against what was asked. */
static int verify(const ikv_store *s, const ikv_block_want *w, const void *buf, size_t len) {
    if (ikv_blob_check(buf, len)) return IKV_ECORRUPT;
    ikv_blob_desc d;
    uint64_t fp;
    (void)ikv_blob_parse(buf, len, &d, &fp);
    if (fp != s->p.fingerprint || !ikv_key_eq(d.key, w->key) || d.scope != w->scope)
        return IKV_EMISMATCH;
    if (w->tokens &&
        (d.ntok != w->ntok || memcmp(ikv_blob_tokens(buf), w->tokens, sizeof(uint32_t) * d.ntok)))
        return IKV_EMISMATCH;
    return 0;
}

size_t ikv_store_get_run(ikv_store *s, const ikv_block_want *want, size_t n, void *const *bufs,
                         size_t cap, size_t *lens, int *rcs) {
    double t0 = ikv_now();
    size_t hits = 0;
    for (size_t i0 = 0; i0 < n; i0 += IKV__STORE_CHUNK) {
        size_t k = n - i0 < IKV__STORE_CHUNK ? n - i0 : IKV__STORE_CHUNK;
        ikv_key keys[IKV__STORE_CHUNK];
        uint64_t scopes[IKV__STORE_CHUNK];
        for (size_t j = 0; j < k; j++)
            keys[j] = want[i0 + j].key, scopes[j] = want[i0 + j].scope;
        s->ops->get(s->impl, keys, scopes, k, bufs + i0, cap, lens + i0, rcs + i0);
        for (size_t j = 0; j < k; j++) {
            size_t i = i0 + j;
            s->st.gets++;
            if (rcs[i] == 0) rcs[i] = verify(s, &want[i], bufs[i], lens[i]);
            switch (rcs[i]) {
            case 0:
                hits++, s->st.hits++, s->st.get_bytes += lens[i];
                break;
            case IKV_ENOENT:
                s->st.misses++;
                break;
            case IKV_ECORRUPT:
                s->st.corrupt++;
                break;
            case IKV_EMISMATCH:
                s->st.mismatch++;
                break;
            default:
                s->st.down++;
                break;
            }
        }
    }
    s->st.get_seconds += ikv_now() - t0;
    return hits;
}

size_t ikv_store_exists_run(ikv_store *s, const ikv_key *keys, const uint64_t *scopes, size_t n,
                            uint8_t *found) {
    size_t f = 0;
    memset(found, 0, n);
    for (size_t i0 = 0; i0 < n; i0 += IKV__STORE_CHUNK) {
        size_t k = n - i0 < IKV__STORE_CHUNK ? n - i0 : IKV__STORE_CHUNK;
        s->st.exists_calls++;
        if (s->ops->exists(s->impl, keys + i0, scopes + i0, k, found + i0)) {
            memset(found + i0, 0, k);
            s->st.down++;
            break;
        }
    }
    for (size_t i = 0; i < n; i++)
        f += found[i] != 0;
    s->st.exists_found += f;
    return f;
}

int ikv_store_del_run(ikv_store *s, const ikv_key *keys, const uint64_t *scopes, size_t n) {
    int rc = 0;
    for (size_t i0 = 0; i0 < n && !rc; i0 += IKV__STORE_CHUNK) {
        size_t k = n - i0 < IKV__STORE_CHUNK ? n - i0 : IKV__STORE_CHUNK;
        rc = s->ops->del(s->impl, keys + i0, scopes + i0, k);
        if (!rc) s->st.deletes += k;
    }
    return rc;
}

void ikv_store_stats_get(const ikv_store *s, ikv_store_stats *st) {
    *st = s->st;
    st->capacity = s->capacity;
    s->ops->stats(s->impl, st);
}

uint64_t ikv_store_capacity(const ikv_store *s) {
    return s->capacity;
}
const char *ikv_store_spec(const ikv_store *s) {
    return s->spec;
}
const char *ikv_store_scheme(const ikv_store *s) {
    return s->ops->scheme;
}
int ikv_store_shared(const ikv_store *s) {
    return s->ops->shared;
}
int ikv_store_check(ikv_store *s) {
    return s->ops->check ? s->ops->check(s->impl) : 1;
}

void ikv_store_dump(const ikv_store *s, FILE *f) {
    ikv_store_stats st;
    ikv_store_stats_get(s, &st);
    fprintf(f,
            "store %s (%s%s): %llu of %llu blocks, slot %zu bytes, fingerprint %016llx\n"
            "  puts %llu (%llu bytes, %llu failed, %.3f s), gets %llu: %llu hits, %llu misses, "
            "%llu corrupt, %llu mismatch, %llu down (%llu bytes, %.3f s)\n"
            "  deletes %llu, evictions %llu, exists %llu calls / %llu found, recovered %llu, "
            "dropped %llu, reconnects %llu, redirects %llu\n",
            s->spec, s->ops->scheme, s->ops->shared ? ", shared" : "",
            (unsigned long long)st.resident, (unsigned long long)st.capacity, s->p.slot_bytes,
            (unsigned long long)s->p.fingerprint, (unsigned long long)st.puts,
            (unsigned long long)st.put_bytes, (unsigned long long)st.put_fail, st.put_seconds,
            (unsigned long long)st.gets, (unsigned long long)st.hits, (unsigned long long)st.misses,
            (unsigned long long)st.corrupt, (unsigned long long)st.mismatch,
            (unsigned long long)st.down, (unsigned long long)st.get_bytes, st.get_seconds,
            (unsigned long long)st.deletes, (unsigned long long)st.evictions,
            (unsigned long long)st.exists_calls, (unsigned long long)st.exists_found,
            (unsigned long long)st.recovered, (unsigned long long)st.dropped,
            (unsigned long long)st.reconnects, (unsigned long long)st.redirects);
}
