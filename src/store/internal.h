/*
 * Internals of the store module: the backend ops table and helpers shared by the backends.
 *
 * store.c owns the public API: it parses the spec's scheme, finds the backend in the registry,
 * seals blobs before a put and verifies every blob a get returns (header, checksum, key,
 * scope, fingerprint, token ids), and counts outcomes. A backend only moves bytes: it stores a
 * sealed blob under (key, scope) and returns the raw bytes it holds for (key, scope).
 * Runs reach the backends in chunks of at most IKV__STORE_CHUNK blocks.
 */
#ifndef ISOKV_STORE_INTERNAL_H
#define ISOKV_STORE_INTERNAL_H

#include "isokv/store.h"

#define IKV__STORE_CHUNK 64

typedef struct ikv__store_ops {
    const char *scheme; /* "mem", "file", "redis", "redis-cluster" */
    const char *doc;    /* one line for --help */
    int shared;         /* other processes may write to the same store */
    /* Opens from the spec's text after "scheme:" (or after "scheme://" for URLs, then url = 1).
     * Sets *impl and *capacity (blocks). Errors as ikv_store_open. */
    int (*open)(const char *rest, const ikv_store_params *p, void **impl, uint64_t *capacity);
    void (*close)(void *impl);
    /* Stores blobs[i] (sealed, lens[i] bytes) under (keys[i], scopes[i]); rcs[i] = 0 or
     * IKV_EIO. */
    void (*put)(void *impl, const ikv_key *keys, const uint64_t *scopes, const void *const *blobs,
                const size_t *lens, size_t n, int *rcs);
    /* Copies the raw bytes held for (keys[i], scopes[i]) into bufs[i] (cap bytes): rcs[i] = 0
     * and lens[i], IKV_ENOENT, IKV_ECORRUPT (held bytes longer than cap), IKV_EIO (down). */
    void (*get)(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                void *const *bufs, size_t cap, size_t *lens, int *rcs);
    /* found[i] = 1 where present; returns 0 or IKV_EIO (down: nothing found). */
    int (*exists)(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n,
                  uint8_t *found);
    int (*del)(void *impl, const ikv_key *keys, const uint64_t *scopes, size_t n);
    /* Backend-kept figures: resident, evictions, recovered, dropped, reconnects. */
    void (*stats)(void *impl, ikv_store_stats *st);
    int (*check)(void *impl); /* 1 or 0 with a detail message; NULL: nothing to check */
} ikv__store_ops;

extern const ikv__store_ops ikv__store_mem;
extern const ikv__store_ops ikv__store_file;
extern const ikv__store_ops ikv__store_redis;
extern const ikv__store_ops ikv__store_redis_cluster;

/* Set-associative slot placement shared by mem and file: the set of (key, scope). */
static inline uint64_t ikv__store_set(ikv_key key, uint64_t scope, uint64_t nsets) {
    uint64_t h = key.hi ^ key.lo * UINT64_C(0xff51afd7ed558ccd) ^
                 scope * UINT64_C(0x9e3779b97f4a7c15); /* splitmix64's finalizer below */
    h = (h ^ h >> 30) * UINT64_C(0xbf58476d1ce4e5b9);
    h = (h ^ h >> 27) * UINT64_C(0x94d049bb133111eb);
    h ^= h >> 31;
    return (uint64_t)(((unsigned __int128)h * nsets) >> 64);
}

/* Little-endian loads and stores of header fields. */
static inline uint64_t ikv__rd64(const void *p) {
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}
static inline uint32_t ikv__rd32(const void *p) {
    const uint8_t *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline void ikv__wr64(void *p, uint64_t v) {
    uint8_t *b = p;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static inline void ikv__wr32(void *p, uint32_t v) {
    uint8_t *b = p;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

/* The (key, scope, write time) of a blob header, when its magic is right; 0 if not. */
int ikv__blob_ident(const void *hdr, ikv_key *key, uint64_t *scope, uint64_t *wtime);

/* Redis helpers shared by redis.c and cluster.c (redis.c). */
/* The Redis key name of a block: "ikv:<fingerprint>:<scope>:<key hi><key lo>" (hex). */
size_t ikv__redis_keyname(char *out, uint64_t fingerprint, uint64_t scope, ikv_key key);
/* CRC16 (XMODEM) slot of a Redis key as Redis Cluster routes it (hash tags honoured). */
unsigned ikv__redis_slot(const char *key, size_t len);

#endif
