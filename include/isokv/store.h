/*
 * isokv store: payload backends for the lower tiers of the KV cache. A store keeps whole KV
 * blocks under their 128-bit block key and the tenant scope; it never decides what to keep
 * (the cache core does, cache.h): the engine writes a block when the core demotes it, reads it
 * back on a lower-tier hit, deletes it when the core drops it.
 *
 * Backends, one const ops table each (store/<name>.c) and one registry array (store.c):
 *
 *   mem:SIZE                         host-memory slab of fixed slots, sized at open
 *   file:PATH:SIZE                   one preallocated file of fixed slots (the SSD tier); it
 *                                    survives restarts and kill -9 (see file.c)
 *   redis://HOST:PORT[/DB]:SIZE      one Redis key per block (hiredis), pipelined runs
 *   redis-cluster://H:P[,H:P...][:SIZE]  the same over a Redis Cluster (slot routing here)
 *
 * SIZE takes k/M/G suffixes (powers of 1024); it sets the blocks the tier holds (SIZE / slot
 * bytes), which the engine gives the cache core as the tier's capacity.
 *
 * Every stored block is a self-describing blob, the same bytes in every backend:
 *
 *     offset  size  field
 *     0       4     magic "IKVB"
 *     4       2     format version (1)
 *     6       1     dtype of the payload (0 = fp32, 1 = q8)
 *     7       1     reserved (0)
 *     8       4     ntok: token ids that follow the header
 *     12      4     payload bytes
 *     16      16    block key (lo, hi)
 *     32      8     model fingerprint (checkpoint, tokenizer, block size, dtype, layout)
 *     40      8     scope salt (tenant, or the public scope)
 *     48      8     write time (ns since the epoch; the oldest write is evicted first)
 *     56      8     checksum: XXH3-64 of bytes [0, 56) and of everything after the header
 *     64      4 ntok  token ids
 *     ...           payload
 *
 * All integers little-endian. A blob is valid only when its magic, version, lengths and
 * checksum hold; it is an answer only when its key, fingerprint, scope and token ids are the
 * ones asked for (fail closed: anything else is a miss, counted as `corrupt` or `mismatch`).
 *
 * Calls work on runs of blocks (one pipelined round trip for Redis). A store that is down
 * (Redis unreachable or slow past its timeout) answers misses, counted as `down`, and tries
 * again after a backoff; it never blocks a request for longer than its timeouts.
 *
 * A store handle is used by one thread at a time.
 */
#ifndef ISOKV_STORE_H
#define ISOKV_STORE_H

#include "isokv/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define IKV_BLOB_MAGIC     0x42564b49u /* "IKVB" little-endian */
#define IKV_BLOB_VERSION   1
#define IKV_BLOB_HDR       64
#define IKV_BLOB_DTYPE_F32 0
#define IKV_BLOB_DTYPE_Q8  1

/* The header fields a caller sets (the store fills fingerprint, write time and checksum). */
typedef struct ikv_blob_desc {
    ikv_key key;
    uint64_t scope;
    uint32_t ntok;
    uint32_t payload_bytes;
    uint8_t dtype;
} ikv_blob_desc;

/* Bytes of a blob with ntok tokens and `payload` payload bytes. */
static inline size_t ikv_blob_bytes(uint32_t ntok, size_t payload) {
    return IKV_BLOB_HDR + (size_t)ntok * 4 + payload;
}

/* Writes the header fields of d into blob (fingerprint, time, checksum zero until a put seals
 * it); returns the token area (ntok ids) and sets *payload to the payload area. */
uint32_t *ikv_blob_init(void *blob, const ikv_blob_desc *d, void **payload);
/* Reads the header of a blob of len bytes without checking its checksum: 0, or IKV_EFORMAT
 * (bad magic, version, or lengths that disagree with len). */
int ikv_blob_parse(const void *blob, size_t len, ikv_blob_desc *d, uint64_t *fingerprint);
/* Fills fingerprint, write time and checksum (in place). */
void ikv_blob_seal(void *blob, uint64_t fingerprint);
/* Checks a blob of len bytes completely: 0, IKV_EFORMAT (header), IKV_ECORRUPT (checksum). */
int ikv_blob_check(const void *blob, size_t len);
/* The token ids and payload of a parsed blob. */
const uint32_t *ikv_blob_tokens(const void *blob);
const void *ikv_blob_payload(const void *blob);

/* ---- stores ------------------------------------------------------------------------------- */

typedef struct ikv_store ikv_store;

typedef struct ikv_store_params {
    size_t slot_bytes;    /* largest blob the store must hold (slot size of mem and file) */
    uint64_t fingerprint; /* model fingerprint written into and required of every blob */
    double timeout_s;     /* network connect and I/O timeout (0 = 0.5 s) */
} ikv_store_params;

/* What a get asks for: a blob is an answer only with this key and scope and, when tokens is
 * not NULL, these ntok token ids. */
typedef struct ikv_block_want {
    ikv_key key;
    uint64_t scope;
    const uint32_t *tokens;
    uint32_t ntok;
} ikv_block_want;

typedef struct ikv_store_stats {
    uint64_t capacity; /* blocks the store holds */
    uint64_t resident; /* valid blocks (mem, file: exact; redis: blocks this process put) */
    uint64_t puts, put_bytes, put_fail;
    uint64_t gets, hits, misses, corrupt, mismatch, down;
    uint64_t get_bytes;
    uint64_t deletes, evictions; /* evictions: valid blocks overwritten to make room */
    uint64_t exists_calls, exists_found;
    uint64_t recovered, dropped;     /* file: valid / invalid slots found when it was opened */
    uint64_t reconnects;             /* redis: successful reconnects after a failure */
    uint64_t redirects;              /* redis-cluster: MOVED and ASK replies followed */
    double put_seconds, get_seconds; /* measured wall time spent in puts / gets */
} ikv_store_stats;

/* Opens a store from its spec (above). Returns 0 and *out (the caller owns it: destroy with
 * ikv_store_close, which takes NULL), or IKV_EPARAM (malformed spec, unknown scheme, size 0 or
 * smaller than one slot), IKV_EIO (unwritable path, unreachable host, a file made for another
 * slot size), IKV_ENOMEM; ikv_errdetail() names the spec and the problem. */
int ikv_store_open(const char *spec, const ikv_store_params *p, ikv_store **out);
void ikv_store_close(ikv_store *s);

/* Writes n sealed-or-not blobs (each from ikv_blob_init, filled); the store seals each with
 * its fingerprint. A block already stored under the same key and scope is replaced. rcs[i]
 * (may be NULL) gets 0 or IKV_EIO / IKV_EINVAL (blob larger than a slot). Returns the number
 * stored. mem and file do not allocate. */
size_t ikv_store_put_run(ikv_store *s, void *const *blobs, size_t n, int *rcs);

/* Reads n blocks into bufs[i] (cap bytes each). rcs[i]: 0 (a valid, matching blob, lens[i]
 * bytes), IKV_ENOENT (miss), IKV_ECORRUPT (bad header or checksum), IKV_EMISMATCH (another
 * key, scope, fingerprint or token ids), IKV_EIO (store down). Every outcome is counted.
 * Returns the number of hits. mem and file do not allocate. */
size_t ikv_store_get_run(ikv_store *s, const ikv_block_want *want, size_t n, void *const *bufs,
                         size_t cap, size_t *lens, int *rcs);

/* Sets found[i] to 1 where a block with that key and scope seems present (not verified: a get
 * may still miss). Down stores find nothing. Returns the number found. */
size_t ikv_store_exists_run(ikv_store *s, const ikv_key *keys, const uint64_t *scopes, size_t n,
                            uint8_t *found);

/* Deletes n blocks (absent ones are ignored). Returns 0 or IKV_EIO (store down). */
int ikv_store_del_run(ikv_store *s, const ikv_key *keys, const uint64_t *scopes, size_t n);

void ikv_store_stats_get(const ikv_store *s, ikv_store_stats *st);
uint64_t ikv_store_capacity(const ikv_store *s); /* blocks */
const char *ikv_store_spec(const ikv_store *s);  /* the spec it was opened with */
const char *ikv_store_scheme(const ikv_store *s);
/* 1 when other processes may write to the same store (file, redis): the engine probes it for
 * blocks its own index has never seen. */
int ikv_store_shared(const ikv_store *s);
/* Walks the store's invariants (mem, file: every slot's index entry agrees with its header).
 * Returns 1, or 0 with an ikv_errdetail message. */
int ikv_store_check(ikv_store *s);

/* Writes the store's spec, capacity and every counter to f, for debugging. */
void ikv_store_dump(const ikv_store *s, FILE *f);

/* The registered schemes, for --help: name and one-line description. */
size_t ikv_store_backend_count(void);
const char *ikv_store_backend_name(size_t i);
const char *ikv_store_backend_doc(size_t i);

/* Parses a size with an optional k/M/G/T suffix (powers of 1024). 0 or IKV_EPARAM. */
int ikv_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
