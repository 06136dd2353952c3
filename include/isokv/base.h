/*
 * isokv base: error codes, the allocation seam, 128-bit block keys, progress bars.
 *
 * Errors. Every fallible call returns int: 0 on success, a negative IKV_E* code otherwise.
 * The codes come from one X-macro list below, which also makes ikv_strerror(). A call that
 * fails may also leave a longer, specific message (file, line, field, value) retrievable with
 * ikv_errdetail() on the same thread, in the spirit of dlerror()/sqlite3_errmsg(): library code
 * never prints and never exits.
 *
 * Allocation. All heap allocation in isokv goes through ikv_malloc/ikv_calloc/ikv_realloc/
 * ikv_free so tests can make the N-th allocation fail (ikv_alloc_fail_after) and check that the
 * failed call left everything as it was.
 *
 * Block keys. A block is named by the whole prefix it ends:
 *
 *     key(0) = XXH3-128(seed; 0 ‖ tokens(0) ‖ salt)
 *     key(i) = XXH3-128(seed; key(i-1) ‖ tokens(i) ‖ salt)
 *
 * where salt is the 64-bit scope salt of the tenant (IKV_SCOPE_PUBLIC for segments declared
 * public), so two tenants' keys are disjoint even for identical prompts. Traces that give opaque
 * block ids instead of tokens map (namespace, id) into the same 128-bit space with a distinct
 * domain tag, so ids of different namespaces never collide with each other or with token keys.
 */
#ifndef ISOKV_BASE_H
#define ISOKV_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------------------------ */

#define IKV_ERRNO_MAP(X)                                                                        \
    X(NOMEM, "out of memory")                                                                  \
    X(INVAL, "invalid argument")                                                               \
    X(RANGE, "value out of range")                                                             \
    X(NOENT, "not found")                                                                      \
    X(EXIST, "already exists")                                                                 \
    X(BUSY, "in use")                                                                          \
    X(FULL, "no evictable space left")                                                         \
    X(IO, "input/output error")                                                                \
    X(FORMAT, "malformed input")                                                               \
    X(TRUNC, "truncated input")                                                                \
    X(EMPTY, "empty input")                                                                    \
    X(POLICY, "unknown eviction policy")                                                       \
    X(PARAM, "malformed or unknown parameter")                                                 \
    X(BUDGET, "pin budget exceeded")                                                           \
    X(NOTLOCKED, "unlock without lock")                                                        \
    X(TOOLONG, "input longer than allowed")                                                    \
    X(MODEL, "unknown model")                                                                  \
    X(HW, "unknown hardware")                                                                  \
    X(UNSUPPORTED, "not supported")                                                            \
    X(CORRUPT, "corrupt stored block")                                                         \
    X(MISMATCH, "stored block belongs to another key, scope or model")

enum {
    IKV_OK = 0,
#define IKV__ERR_ENUM(name, msg) IKV_E##name,
    IKV__ERR_FIRST = -1000,
    IKV_ERRNO_MAP(IKV__ERR_ENUM) IKV__ERR_LAST
#undef IKV__ERR_ENUM
};

/* The static message for an error code; "unknown error" for anything else. Never NULL. */
const char *ikv_strerror(int err);

/* Sets this thread's error detail (printf-style) and returns err, so callers can write
 * `return ikv_error(IKV_EFORMAT, "%s:%zu: expected an array", path, line);`. */
int ikv_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* This thread's last error detail, or ikv_strerror of the last code if none was given. The
 * pointer stays valid until the next ikv_error() on this thread. */
const char *ikv_errdetail(void);

/* The detail of the last ikv_error() on this thread if it was given for code err, else
 * ikv_strerror(err): what to print for a call that returned err, so a bare `return IKV_ENOMEM`
 * never shows a stale detail (or "success"). */
const char *ikv_errdetail_for(int err);

/* Programmer errors (broken invariants) abort with file and line; bad input never does. */
#define IKV_ASSERT(x)                                                                           \
    do {                                                                                       \
        if (!(x)) ikv__assert_fail(#x, __FILE__, __LINE__);                                    \
    } while (0)
void ikv__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* ---- allocation seam --------------------------------------------------------------------- */

void *ikv_malloc(size_t n);
void *ikv_calloc(size_t count, size_t size);
void *ikv_realloc(void *p, size_t n);
void ikv_free(void *p);

/* Test hook: the next `n` allocations succeed and every one after fails, until reset with
 * n = SIZE_MAX. Returns the number of allocations made since the last call. */
size_t ikv_alloc_fail_after(size_t n);

/* ---- block keys -------------------------------------------------------------------------- */

typedef struct ikv_key {
    uint64_t lo, hi;
} ikv_key;

#define IKV_SCOPE_PUBLIC UINT64_C(0x7075626c69630000) /* "public": shared across tenants */

static inline int ikv_key_eq(ikv_key a, ikv_key b) {
    return a.lo == b.lo && a.hi == b.hi;
}

/* The key of a block of n tokens whose prefix ends in `parent` (NULL for the first block),
 * under scope `salt` and secret `seed`. Does not allocate. */
ikv_key ikv_key_chain(uint64_t seed, const ikv_key *parent, const uint32_t *tokens, size_t n,
                      uint64_t salt);

/* Keys of a whole token sequence cut into blocks of block_tokens (the last, partial block is
 * included only when with_partial is non-zero). Writes at most max keys; returns the number of
 * keys the sequence has (which may exceed max). */
size_t ikv_keys_of_tokens(uint64_t seed, const uint32_t *tokens, size_t n, size_t block_tokens,
                          uint64_t salt, int with_partial, ikv_key *out, size_t max);

/* The scope salt of a tenant name ("" or NULL is the public scope). */
uint64_t ikv_scope_salt(uint64_t seed, const char *tenant);

/* The key of an opaque trace block id in namespace ns (e.g. a WEKA conversation index). */
ikv_key ikv_key_from_id(uint64_t seed, uint64_t ns, uint64_t id);

/* ---- numbers typed on a command line (src/base/number.c) -------------------------------- */

/* A whole non-negative count, the whole string: digits, or a decimal mantissa with an optional
 * suffix k/M/G/T (1e3/1e6/1e9/1e12, any case): "2M" -> 2000000, "1.5k" -> 1500. Returns 0, or
 * -1 for anything else ("12x", "-1", "1.5", "0x10", "", too large). Every flag that takes a
 * count parses it with this, so the suffixes work everywhere. */
int ikv_parse_count(const char *s, uint64_t *out);
/* A finite decimal number, the whole string. 0 or -1. */
int ikv_parse_double(const char *s, double *out);
/* v with three significant digits and a k/M/G/T/P suffix chosen after rounding ("1M", not
 * "1e+03k"); whole numbers below 1000 print as they are. */
void ikv_fmt_count(char *buf, size_t n, double v);

/* ---- small utilities --------------------------------------------------------------------- */

/* Monotonic wall-clock seconds. */
double ikv_now(void);

/* A progress bar on a stream (normally stderr). It stays silent for the first second, and
 * draws only when stderr is a terminal or IKV_PROGRESS=1 is set; ikv_progress_done() ends the
 * line. Not thread-safe: update it from one thread. */
typedef struct ikv_progress {
    FILE *out;
    const char *label;
    uint64_t total, done;
    double start, last_draw;
    int enabled, drawn;
} ikv_progress;

void ikv_progress_init(ikv_progress *p, FILE *out, const char *label, uint64_t total);
void ikv_progress_update(ikv_progress *p, uint64_t done);
void ikv_progress_done(ikv_progress *p);

/* ---- atomic output files (src/base/outfile.c) ------------------------------------------- */

/* A set of output files that appear together or not at all. Each target is checked when added:
 * a missing file or a regular file is fine (a symlink to a regular file is written through:
 * the file it names is replaced, the link stays); a device, directory, FIFO, socket or dangling
 * link is refused (IKV_EINVAL / IKV_EIO, the message names the path and its kind), and so is a
 * second name of a file already in the set (IKV_EEXIST). Writes go to temporary files beside
 * the targets; commit closes them all, checking every error, and only then renames each over
 * its target. Destroying a set that was not committed removes its temporaries, so a failure
 * leaves every target as it was. Allocates; not for hot paths. */
typedef struct ikv_outset ikv_outset;

int ikv_outset_create(ikv_outset **out);

/* Adds `path`. With f, *f gets a stream on the temporary file (owned by the set: do not close
 * it); with tmp, *tmp gets the temporary file's name (valid until destroy), for a writer that
 * opens the file itself, such as a child process. Returns 0 or an IKV_E* code with
 * ikv_errdetail() naming the path; the set is unchanged on failure. */
int ikv_outset_add(ikv_outset *s, const char *path, FILE **f, const char **tmp);

/* Flushes and closes every stream, then renames every temporary over its target. Returns 0, or
 * IKV_EIO (write failed: no target was touched; rename failed: the message says how many were
 * already replaced). Call at most once. */
int ikv_outset_commit(ikv_outset *s);

size_t ikv_outset_count(const ikv_outset *s);

/* Removes the temporaries of an uncommitted set and frees it. Takes NULL. */
void ikv_outset_destroy(ikv_outset *s);

/* Checks that `path` could be an output (the rules above, and its directory is writable)
 * without touching it. 0 or the error ikv_outset_add would give. */
int ikv_output_check(const char *path);

#ifdef __cplusplus
}
#endif
#endif
