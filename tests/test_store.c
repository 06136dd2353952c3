/*
 * Tests for store/: the blob format (seal, check, a flipped bit, bad headers); mem and file
 * round trips, bit-exact, for runs of 1..256 blocks; fail-closed answers (another scope, key,
 * token ids or fingerprint is a mismatch); a full store evicts the oldest write of a set and
 * never holds more than its capacity; bad specs; the file store across a restart, after a torn
 * write, a flipped byte, and a writer killed with SIGKILL mid-stream; Redis (a redis-server
 * child on a free loopback port): round trip, pipelined runs, a flipped byte, the server killed
 * (misses counted, no call blocks past its timeout) and restarted (reconnect); Redis Cluster
 * (three masters): blocks over all three, MOVED and ASK followed through a slot migration.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isokv/store.h"
#include "redis_helper.h"
#include "store/internal.h"
#include "testutil.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    return tu_path(tmpdir, name);
}

static int setup_all(void **st) {
    (void)st;
    return tu_tmpdir(tmpdir, sizeof tmpdir, "store");
}

static int teardown_all(void **st) {
    (void)st;
    rh_kill_all();
    return tu_rmtree(tmpdir);
}

static int teardown_redis(void **st) {
    (void)st;
    rh_kill_all();
    return 0;
}

#define NTOK 16
#define PAY  1000
#define SLOT (IKV_BLOB_HDR + NTOK * 4 + PAY)
#define FP   UINT64_C(0x1234567890abcdef)

static ikv_key key_of(uint64_t i) {
    return (ikv_key){.lo = i * 0x9e3779b97f4a7c15ull + 1, .hi = i ^ 0xabcdefull};
}

/* Blob i: tokens and payload derived from i (and a version v, to tell rewrites apart). */
static void make_blob(uint8_t *b, uint64_t i, uint64_t scope, int v) {
    ikv_blob_desc d = {.key = key_of(i), .scope = scope, .ntok = NTOK, .payload_bytes = PAY};
    void *pay;
    uint32_t *t = ikv_blob_init(b, &d, &pay);
    for (int j = 0; j < NTOK; j++)
        t[j] = (uint32_t)(i * 31 + (uint64_t)j);
    uint8_t *p = pay;
    for (int j = 0; j < PAY; j++)
        p[j] = (uint8_t)(i * 7 + (uint64_t)j * 13 + (uint64_t)v);
}

static ikv_block_want want_of(uint64_t i, uint64_t scope, uint32_t *toks) {
    for (int j = 0; j < NTOK; j++)
        toks[j] = (uint32_t)(i * 31 + (uint64_t)j);
    return (ikv_block_want){.key = key_of(i), .scope = scope, .tokens = toks, .ntok = NTOK};
}

static ikv_store_params params(void) {
    return (ikv_store_params){.slot_bytes = SLOT, .fingerprint = FP, .timeout_s = 0.3};
}

/* Puts blocks [first, first + n) in one run, gets them back in one run, compares bytes. */
static void roundtrip(ikv_store *s, uint64_t first, size_t n, uint64_t scope) {
    uint8_t *blobs = malloc(n * SLOT), *got = malloc(n * SLOT), *ref = malloc(SLOT);
    void **bp = malloc(n * sizeof *bp), **gp = malloc(n * sizeof *gp);
    ikv_block_want *w = malloc(n * sizeof *w);
    uint32_t *toks = malloc(n * NTOK * 4);
    size_t *lens = malloc(n * sizeof *lens);
    int *rcs = malloc(n * sizeof *rcs);
    for (size_t i = 0; i < n; i++) {
        bp[i] = blobs + i * SLOT, gp[i] = got + i * SLOT;
        make_blob(bp[i], first + i, scope, 0);
        w[i] = want_of(first + i, scope, toks + i * NTOK);
    }
    assert_int_equal(ikv_store_put_run(s, bp, n, rcs), n);
    assert_int_equal(ikv_store_get_run(s, w, n, gp, SLOT, lens, rcs), n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(rcs[i], 0);
        assert_int_equal(lens[i], SLOT);
        make_blob(ref, first + i, scope, 0);
        /* everything but the sealed fields (fingerprint, time, checksum) is the put's bytes */
        assert_memory_equal((uint8_t *)gp[i] + IKV_BLOB_HDR, ref + IKV_BLOB_HDR,
                            SLOT - IKV_BLOB_HDR);
        assert_memory_equal(gp[i], ref, 32);
        assert_int_equal(ikv_blob_check(gp[i], lens[i]), 0);
    }
    free(blobs), free(got), free(ref), free(bp), free(gp), free(w), free(toks), free(lens),
        free(rcs);
}

/* One get of block i: its rc. */
static int get1(ikv_store *s, uint64_t i, uint64_t scope) {
    uint8_t buf[SLOT];
    void *bp = buf;
    uint32_t toks[NTOK];
    ikv_block_want w = want_of(i, scope, toks);
    size_t len = 0;
    int rc = -1;
    ikv_store_get_run(s, &w, 1, &bp, SLOT, &len, &rc);
    return rc;
}

static void put1(ikv_store *s, uint64_t i, uint64_t scope, int v) {
    uint8_t buf[SLOT];
    void *bp = buf;
    make_blob(buf, i, scope, v);
    int rc = -1;
    assert_int_equal(ikv_store_put_run(s, &bp, 1, &rc), 1);
    assert_int_equal(rc, 0);
}

/* ---- blobs ------------------------------------------------------------------------------- */

static void test_blob_format(void **st) {
    (void)st;
    uint8_t b[SLOT];
    make_blob(b, 5, 77, 0);
    ikv_blob_seal(b, FP);
    assert_int_equal(ikv_blob_check(b, SLOT), 0);
    ikv_blob_desc d;
    uint64_t fp;
    assert_int_equal(ikv_blob_parse(b, SLOT, &d, &fp), 0);
    assert_true(ikv_key_eq(d.key, key_of(5)));
    assert_int_equal(d.scope, 77);
    assert_int_equal(fp, FP);
    assert_int_equal(ikv_blob_tokens(b)[3], 5 * 31 + 3);
    /* a flipped bit anywhere is caught: in the payload, a token, the key */
    size_t where[] = {SLOT - 1, IKV_BLOB_HDR + 5, 20, 40};
    for (size_t i = 0; i < 4; i++) {
        b[where[i]] ^= 0x10;
        assert_int_equal(ikv_blob_check(b, SLOT), IKV_ECORRUPT);
        b[where[i]] ^= 0x10;
    }
    assert_int_equal(ikv_blob_check(b, SLOT), 0);
    assert_int_equal(ikv_blob_check(b, SLOT - 1), IKV_EFORMAT); /* length disagrees */
    b[0] ^= 1;
    assert_int_equal(ikv_blob_check(b, SLOT), IKV_EFORMAT);
    assert_non_null(strstr(ikv_errdetail(), "magic"));
}

static void test_bad_specs(void **st) {
    (void)st;
    ikv_store_params p = params();
    ikv_store *s = NULL;
    assert_int_equal(ikv_store_open("nvme:1G", &p, &s), IKV_EPARAM);
    assert_non_null(strstr(ikv_errdetail(), "unknown scheme"));
    assert_null(s);
    assert_int_equal(ikv_store_open("mem:0", &p, &s), IKV_EPARAM);
    assert_int_equal(ikv_store_open("mem:lots", &p, &s), IKV_EPARAM);
    assert_int_equal(ikv_store_open("mem:100", &p, &s), IKV_EPARAM); /* smaller than a slot */
    assert_non_null(strstr(ikv_errdetail(), "no slot"));
    assert_int_equal(ikv_store_open("file:/nonexistent-dir/x/store.bin:1M", &p, &s), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "cannot open"));
    assert_int_equal(ikv_store_open("file:noSize", &p, &s), IKV_EPARAM);
    assert_int_equal(ikv_store_open("file:/tmp/x:0", &p, &s), IKV_EPARAM);
    /* an existing file that is not a store is never overwritten */
    FILE *f = fopen(tmp_path("notastore"), "w");
    fputs("precious", f);
    fclose(f);
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s:1M", tmp_path("notastore"));
    assert_int_equal(ikv_store_open(spec, &p, &s), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "not an isokv store"));
    /* a store made for another slot size */
    snprintf(spec, sizeof spec, "file:%s:1M", tmp_path("geom"));
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    ikv_store_close(s);
    ikv_store_params p2 = p;
    p2.slot_bytes += 64;
    assert_int_equal(ikv_store_open(spec, &p2, &s), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "slots of"));
    /* redis: malformed and unreachable */
    assert_int_equal(ikv_store_open("redis://localhost:1G", &p, &s), IKV_EPARAM);
    assert_int_equal(ikv_store_open("redis://127.0.0.1:0:1G", &p, &s), IKV_EPARAM);
    assert_int_equal(ikv_store_open("redis://127.0.0.1:6379/x:1G", &p, &s), IKV_EPARAM);
    int port = rh_free_port();
    snprintf(spec, sizeof spec, "redis://127.0.0.1:%d:1M", port);
    double t0 = ikv_now();
    assert_int_equal(ikv_store_open(spec, &p, &s), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "cannot reach"));
    assert_true(ikv_now() - t0 < 5); /* bounded by the timeout, not a hang (generous bound) */
    snprintf(spec, sizeof spec, "redis-cluster://127.0.0.1:%d", port);
    assert_int_equal(ikv_store_open(spec, &p, &s), IKV_EIO);
    assert_int_equal(ikv_store_open("redis-cluster://", &p, &s), IKV_EPARAM);
    uint64_t v;
    assert_int_equal(ikv_parse_size("64M", &v), 0);
    assert_int_equal(v, 64u << 20);
    assert_int_equal(ikv_parse_size("1.5k", &v), 0);
    assert_int_equal(v, 1536);
    assert_int_equal(ikv_parse_size("12Q", &v), IKV_EPARAM);
}

/* ---- mem and file ------------------------------------------------------------------------ */

static void exercise(ikv_store *s) {
    roundtrip(s, 0, 1, 1);
    roundtrip(s, 100, 16, 1);
    roundtrip(s, 1000, 256, 2);
    assert_int_equal(ikv_store_check(s), 1);
    /* fail closed: another scope is another block, other tokens are a mismatch */
    assert_int_equal(get1(s, 100, 1), 0);
    assert_int_equal(get1(s, 100, 2), IKV_ENOENT);
    assert_int_equal(get1(s, 99999, 1), IKV_ENOENT);
    uint8_t buf[SLOT];
    void *bp = buf;
    uint32_t toks[NTOK];
    ikv_block_want w = want_of(100, 1, toks);
    toks[3]++;
    int rc;
    size_t len;
    ikv_store_get_run(s, &w, 1, &bp, SLOT, &len, &rc);
    assert_int_equal(rc, IKV_EMISMATCH);
    ikv_store_stats stt;
    ikv_store_stats_get(s, &stt);
    assert_int_equal(stt.mismatch, 1);
    assert_int_equal(stt.hits, 1 + 16 + 256 + 1);
    /* exists and delete */
    ikv_key keys[3] = {key_of(100), key_of(101), key_of(5555)};
    uint64_t scopes[3] = {1, 1, 1};
    uint8_t found[3];
    assert_int_equal(ikv_store_exists_run(s, keys, scopes, 3, found), 2);
    assert_true(found[0] && found[1] && !found[2]);
    assert_int_equal(ikv_store_del_run(s, keys, scopes, 1), 0);
    assert_int_equal(get1(s, 100, 1), IKV_ENOENT);
    assert_int_equal(get1(s, 101, 1), 0);
    /* a rewrite replaces, not duplicates */
    ikv_store_stats_get(s, &stt);
    uint64_t res = stt.resident;
    put1(s, 101, 1, 5);
    ikv_store_stats_get(s, &stt);
    assert_int_equal(stt.resident, res);
    assert_int_equal(ikv_store_check(s), 1);
}

static void test_mem(void **st) {
    (void)st;
    ikv_store_params p = params();
    ikv_store *s;
    assert_int_equal(ikv_store_open("mem:2M", &p, &s), 0);
    assert_string_equal(ikv_store_scheme(s), "mem");
    assert_false(ikv_store_shared(s));
    exercise(s);
    char *buf = NULL;
    size_t blen = 0;
    FILE *mf = open_memstream(&buf, &blen);
    ikv_store_dump(s, mf);
    fclose(mf);
    assert_non_null(strstr(buf, "store mem:2M (mem)"));
    assert_non_null(strstr(buf, "1 mismatch"));
    free(buf);
    ikv_store_close(s);
}

static void test_full_store_evicts(void **st) {
    (void)st;
    ikv_store_params p = params();
    ikv_store *s;
    char spec[64];
    snprintf(spec, sizeof spec, "mem:%d", SLOT * 64);
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    uint64_t cap = ikv_store_capacity(s);
    assert_int_equal(cap, 64);
    for (uint64_t i = 0; i < 1000; i++) {
        put1(s, i, 3, 0);
        /* the newest write is always readable */
        assert_int_equal(get1(s, i, 3), 0);
    }
    ikv_store_stats stt;
    ikv_store_stats_get(s, &stt);
    assert_true(stt.resident <= cap);
    assert_int_equal(stt.evictions, 1000 - stt.resident);
    uint64_t hits = 0;
    for (uint64_t i = 0; i < 1000; i++)
        hits += get1(s, i, 3) == 0;
    assert_int_equal(hits, stt.resident);
    assert_int_equal(ikv_store_check(s), 1);
    ikv_store_close(s);
}

static void test_file(void **st) {
    (void)st;
    ikv_store_params p = params();
    ikv_store *s;
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s:4M", tmp_path("f1.store"));
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    assert_true(ikv_store_shared(s));
    exercise(s);
    ikv_store_stats a;
    ikv_store_stats_get(s, &a);
    ikv_store_close(s);
    /* restart: every block is still there */
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    ikv_store_stats b;
    ikv_store_stats_get(s, &b);
    assert_int_equal(b.recovered, a.resident);
    assert_int_equal(b.dropped, 0);
    assert_int_equal(get1(s, 1005, 2), 0);
    assert_int_equal(get1(s, 101, 1), 0); /* the rewrite survived too */
    ikv_store_close(s);
}

/* Offset of block i's slot header and body in a file store (searching the headers). */
static long find_slot(const char *path, uint64_t i, uint64_t scope, long *body) {
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    uint8_t sb[4096];
    assert_int_equal(pread(fd, sb, sizeof sb, 0), (ssize_t)sizeof sb);
    uint64_t nslots = ikv__rd64(sb + 24), data_off = ikv__rd64(sb + 32);
    long found = -1;
    for (uint64_t s = 0; s < nslots && found < 0; s++) {
        uint8_t h[64];
        assert_int_equal(pread(fd, h, 64, (off_t)(4096 + s * 64)), 64);
        ikv_key k;
        uint64_t sc;
        if (ikv__blob_ident(h, &k, &sc, NULL) && ikv_key_eq(k, key_of(i)) && sc == scope) {
            found = (long)(4096 + s * 64);
            *body = (long)(data_off + s * (SLOT - 64));
        }
    }
    close(fd);
    return found;
}

static void poke(const char *path, long off, const void *p, size_t n) {
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, p, n, off), (ssize_t)n);
    close(fd);
}

static void peek(const char *path, long off, void *p, size_t n) {
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, p, n, off), (ssize_t)n);
    close(fd);
}

static void test_file_torn_and_flipped(void **st) {
    (void)st;
    ikv_store_params p = params();
    ikv_store *s;
    const char *path = tmp_path("f2.store");
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s:1M", path);
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    for (uint64_t i = 0; i < 20; i++)
        put1(s, i, 9, 0);
    long body, hdr = find_slot(path, 3, 9, &body);
    assert_true(hdr > 0);
    /* a flipped byte in the payload: detected, counted, a miss */
    uint8_t c;
    peek(path, body + NTOK * 4 + 100, &c, 1);
    c ^= 0x01;
    poke(path, body + NTOK * 4 + 100, &c, 1);
    assert_int_equal(get1(s, 3, 9), IKV_ECORRUPT);
    ikv_store_stats stt;
    ikv_store_stats_get(s, &stt);
    assert_int_equal(stt.corrupt, 1);
    /* a torn write: block 4's body half overwritten by another block's bytes */
    long body4, hdr4 = find_slot(path, 4, 9, &body4);
    assert_true(hdr4 > 0);
    uint8_t other[SLOT];
    make_blob(other, 4, 9, 1);
    poke(path, body4, other + IKV_BLOB_HDR, (SLOT - IKV_BLOB_HDR) / 2);
    assert_int_equal(get1(s, 4, 9), IKV_ECORRUPT);
    assert_int_equal(get1(s, 5, 9), 0);
    ikv_store_close(s);
    /* reopening drops both, keeps the rest */
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    ikv_store_stats_get(s, &stt);
    assert_int_equal(stt.recovered, 18);
    assert_int_equal(stt.dropped, 2);
    assert_int_equal(get1(s, 3, 9), IKV_ENOENT);
    assert_int_equal(get1(s, 4, 9), IKV_ENOENT);
    for (uint64_t i = 5; i < 20; i++)
        assert_int_equal(get1(s, i, 9), 0);
    assert_int_equal(ikv_store_check(s), 1);
    ikv_store_close(s);
}

/* A child writes blocks 0, 1, 2, ... (each acknowledged on a pipe) until it is killed with
 * SIGKILL mid-stream; the file must reopen with every acknowledged block readable (unless
 * evicted by a later one) and nothing invalid readable. */
static void test_file_kill9(void **st) {
    (void)st;
    ikv_store_params p = params();
    const char *path = tmp_path("f3.store");
    char spec[600];
    snprintf(spec, sizeof spec, "file:%s:%d", path, 4096 * 3 + 400 * SLOT);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        ikv_store *s;
        if (ikv_store_open(spec, &p, &s)) _exit(3);
        for (uint64_t i = 0;; i++) {
            uint8_t buf[SLOT];
            void *bp = buf;
            make_blob(buf, i, 1, 0);
            int rc;
            ikv_store_put_run(s, &bp, 1, &rc);
            if (rc) _exit(4);
            uint32_t n = (uint32_t)i;
            if (write(pfd[1], &n, sizeof n) != sizeof n) _exit(5);
        }
    }
    close(pfd[1]);
    uint32_t last = 0, n;
    while (read(pfd[0], &n, sizeof n) == sizeof n && n < 3000)
        last = n;
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    close(pfd[0]);
    assert_true(WIFSIGNALED(status));
    ikv_store *s;
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    assert_int_equal(ikv_store_check(s), 1); /* every header left verifies */
    ikv_store_stats stt;
    ikv_store_stats_get(s, &stt);
    uint64_t hits = 0, bad = 0;
    /* the child can be a pipe buffer (16384 acknowledgements) ahead of what was read */
    for (uint64_t i = 0; i <= (uint64_t)last + 16384 + 2; i++) {
        int rc = get1(s, i, 1);
        hits += rc == 0;
        bad += rc != 0 && rc != IKV_ENOENT;
    }
    assert_int_equal(bad, 0);
    assert_int_equal(hits, stt.recovered);
    assert_true(stt.recovered > 100); /* the store was full of acknowledged blocks */
    assert_true(stt.recovered <= ikv_store_capacity(s));
    ikv_store_close(s);
}

/* Differential fuzz against an oracle (the latest version put of each block, or absent): a
 * get answers exactly the latest version or a miss (an eviction, never more than the store
 * holds), never an older version or another block; for mem and file, with restarts of the
 * file store in between. */
static void fuzz_one(const char *spec, int reopen) {
    ikv_store_params p = params();
    ikv_store *s;
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    enum { K = 300 };
    int ver[K];
    for (int i = 0; i < K; i++)
        ver[i] = -1;
    uint64_t x = 12345;
    uint8_t buf[SLOT], ref[SLOT];
    void *bp = buf;
    for (int step = 0; step < 4000; step++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % K), op = (int)(x >> 32) % 10;
        if (op < 4) {
            int v = step & 0xff;
            make_blob(buf, (uint64_t)k, 5, v);
            int rc;
            assert_int_equal(ikv_store_put_run(s, &bp, 1, &rc), 1);
            ver[k] = v;
        } else if (op < 9) {
            uint32_t toks[NTOK];
            ikv_block_want w = want_of((uint64_t)k, 5, toks);
            size_t len;
            int rc;
            ikv_store_get_run(s, &w, 1, &bp, SLOT, &len, &rc);
            if (rc == 0) {
                assert_true(ver[k] >= 0);
                make_blob(ref, (uint64_t)k, 5, ver[k]);
                assert_memory_equal(buf + IKV_BLOB_HDR, ref + IKV_BLOB_HDR, SLOT - IKV_BLOB_HDR);
            } else {
                assert_int_equal(rc, IKV_ENOENT);
                ver[k] = -1; /* evicted: it may not come back */
            }
        } else {
            ikv_key key = key_of((uint64_t)k);
            uint64_t sc = 5;
            assert_int_equal(ikv_store_del_run(s, &key, &sc, 1), 0);
            ver[k] = -1;
        }
        if (step % 500 == 0) {
            assert_int_equal(ikv_store_check(s), 1);
            if (reopen) {
                ikv_store_close(s);
                assert_int_equal(ikv_store_open(spec, &p, &s), 0);
            }
        }
    }
    ikv_store_stats stt;
    ikv_store_stats_get(s, &stt);
    assert_true(stt.resident <= ikv_store_capacity(s));
    assert_true(stt.evictions > 0); /* 300 blocks through 128 slots */
    ikv_store_close(s);
}

static void test_fuzz_against_oracle(void **st) {
    (void)st;
    char spec[600];
    snprintf(spec, sizeof spec, "mem:%d", SLOT * 128);
    fuzz_one(spec, 0);
    snprintf(spec, sizeof spec, "file:%s:%d", tmp_path("fuzz.store"), 3 * 4096 + SLOT * 128);
    fuzz_one(spec, 1);
}

/* One try of ikv_store_open for tu_alloc_fail_each: a failed open leaves *s NULL. */
typedef struct open_try {
    const char *spec;
    const ikv_store_params *p;
    ikv_store *s;
} open_try;

static int try_open(void *ctx) {
    open_try *t = ctx;
    t->s = NULL;
    int rc = ikv_store_open(t->spec, t->p, &t->s);
    if (rc) assert_null(t->s);
    return rc;
}

/* Every allocation failing in turn while opening a store: a clean IKV_ENOMEM, nothing left
 * behind (ASan's leak check), and a store that works once it succeeds. */
static void test_alloc_failure(void **st) {
    (void)st;
    ikv_store_params p = params();
    char spec[2][600];
    snprintf(spec[0], sizeof spec[0], "mem:1M");
    snprintf(spec[1], sizeof spec[1], "file:%s:1M", tmp_path("oom.store"));
    for (int b = 0; b < 2; b++) {
        open_try t = {spec[b], &p, NULL};
        tu_alloc_fail_each(try_open, &t, 20);
        roundtrip(t.s, 0, 4, 1);
        ikv_store_close(t.s);
    }
}

/* ---- redis --------------------------------------------------------------------------------- */

static void test_redis(void **st) {
    (void)st;
    int port = rh_free_port();
    assert_true(port > 0);
    assert_true(rh_start(0, port, NULL) > 0);
    ikv_store_params p = params();
    ikv_store *s;
    char spec[128];
    snprintf(spec, sizeof spec, "redis://127.0.0.1:%d/0:64M", port);
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    assert_int_equal(ikv_store_capacity(s), (64u << 20) / SLOT);
    roundtrip(s, 0, 1, 1);
    roundtrip(s, 100, 16, 1);
    roundtrip(s, 1000, 256, 2);
    assert_int_equal(get1(s, 100, 2), IKV_ENOENT);
    ikv_key keys[2] = {key_of(100), key_of(4444)};
    uint64_t scopes[2] = {1, 1};
    uint8_t found[2];
    assert_int_equal(ikv_store_exists_run(s, keys, scopes, 2, found), 1);
    /* a flipped byte in a stored value */
    char name[96];
    ikv__redis_keyname(name, FP, 1, key_of(101));
    redisReply *r = rh_cmd(port, "SETRANGE %s %d %b", name, SLOT - 10, "\x55", (size_t)1);
    assert_non_null(r);
    freeReplyObject(r);
    assert_int_equal(get1(s, 101, 1), IKV_ECORRUPT);
    /* a block of another model under the same name is a mismatch */
    ikv_store_params p2 = p;
    p2.fingerprint ^= 1;
    ikv_store *s2;
    assert_int_equal(ikv_store_open(spec, &p2, &s2), 0);
    put1(s2, 7, 1, 0);
    ikv_store_close(s2);
    assert_int_equal(get1(s, 7, 1), IKV_ENOENT); /* the name carries the fingerprint */
    assert_int_equal(ikv_store_del_run(s, keys, scopes, 1), 0);
    assert_int_equal(get1(s, 100, 1), IKV_ENOENT);
    /* killed: misses counted as down, nothing blocks past the timeout */
    rh_stop(0);
    double t0 = ikv_now();
    for (int i = 0; i < 20; i++)
        assert_int_equal(get1(s, 102, 1), IKV_EIO);
    assert_true(ikv_now() - t0 < 10);
    ikv_store_stats stt;
    ikv_store_stats_get(s, &stt);
    assert_int_equal(stt.down, 20);
    uint8_t buf[SLOT];
    void *bp = buf;
    make_blob(buf, 5, 1, 0);
    int rc;
    assert_int_equal(ikv_store_put_run(s, &bp, 1, &rc), 0);
    assert_int_equal(rc, IKV_EIO);
    /* restarted (empty: no persistence): used again after the backoff */
    assert_true(rh_start(0, port, NULL) > 0);
    int back = 0;
    for (int i = 0; i < 100 && !back; i++) {

        make_blob(buf, 5, 1, 0);
        back = ikv_store_put_run(s, &bp, 1, &rc) == 1;
        if (!back) rh_sleep(0.1);
    }
    assert_true(back);
    assert_int_equal(get1(s, 5, 1), 0);
    ikv_store_stats_get(s, &stt);
    assert_true(stt.reconnects >= 1);
    ikv_store_close(s);
    rh_stop(0);
}

static long long dbsize(int port) {
    redisReply *r = rh_cmd(port, "DBSIZE");
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    return n;
}

static void myid(int port, char *out) {
    redisReply *r = rh_cmd(port, "CLUSTER MYID");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    snprintf(out, 64, "%s", r->str);
    freeReplyObject(r);
}

/* The port of the master that owns `slot` (of the three). */
static int owner(const int ports[3], unsigned slot) {
    for (int i = 0; i < 3; i++) {
        redisReply *r = rh_cmd(ports[i], "CLUSTER COUNTKEYSINSLOT %u", slot);
        int ok = r && r->type == REDIS_REPLY_INTEGER;
        if (r) freeReplyObject(r);
        (void)ok;
    }
    redisReply *r = rh_cmd(ports[0], "CLUSTER SLOTS");
    assert_non_null(r);
    int port = -1;
    for (size_t e = 0; e < r->elements; e++) {
        redisReply *x = r->element[e];
        if ((long long)slot >= x->element[0]->integer && (long long)slot <= x->element[1]->integer)
            port = (int)x->element[2]->element[1]->integer;
    }
    freeReplyObject(r);
    return port;
}

static void test_redis_cluster(void **st) {
    (void)st;
    int ports[3];
    assert_true(rh_cluster(tmp_path("cluster"), ports));
    ikv_store_params p = params();
    ikv_store *s;
    char spec[256];
    snprintf(spec, sizeof spec, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d:64M", ports[0],
             ports[1]);
    assert_int_equal(ikv_store_open(spec, &p, &s), 0);
    assert_int_equal(ikv_store_check(s), 1);
    roundtrip(s, 0, 256, 4);
    for (int i = 0; i < 3; i++)
        assert_true(dbsize(ports[i]) > 40); /* spread over all three */
    assert_int_equal(dbsize(ports[0]) + dbsize(ports[1]) + dbsize(ports[2]), 256);
    /* migrate block 7's slot to another master, by hand: ASK while it moves, MOVED after */
    char name[96];
    size_t nl = ikv__redis_keyname(name, FP, 4, key_of(7));
    unsigned slot = ikv__redis_slot(name, nl);
    int src = owner(ports, slot), dst = src == ports[0] ? ports[1] : ports[0];
    char sid[64], did[64];
    myid(src, sid), myid(dst, did);
    redisReply *r;
    r = rh_cmd(dst, "CLUSTER SETSLOT %u IMPORTING %s", slot, sid);
    assert_true(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = rh_cmd(src, "CLUSTER SETSLOT %u MIGRATING %s", slot, did);
    assert_true(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = rh_cmd(src, "MIGRATE 127.0.0.1 %d %s 0 5000", dst, name);
    assert_true(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    /* the source no longer has it: it answers ASK, which the store follows */
    assert_int_equal(get1(s, 7, 4), 0);
    ikv_store_stats stt;
    ikv_store_stats_get(s, &stt);
    assert_int_equal(stt.redirects, 1);
    for (int i = 0; i < 3; i++) {
        r = rh_cmd(ports[i], "CLUSTER SETSLOT %u NODE %s", slot, did);
        assert_non_null(r);
        freeReplyObject(r);
    }
    /* now MOVED: followed, the map updated, and every block still loads */
    assert_int_equal(get1(s, 7, 4), 0);
    ikv_store_stats_get(s, &stt);
    assert_int_equal(stt.redirects, 2);
    roundtrip(s, 0, 256, 4);
    assert_int_equal(ikv_store_check(s), 1);
    /* a master killed: its blocks are misses, the others still load, nothing fails */
    rh_stop(2);
    uint64_t hits = 0, down = 0;
    for (uint64_t i = 0; i < 256; i++) {
        int rc = get1(s, i, 4);
        hits += rc == 0;
        down += rc == IKV_EIO;
    }
    assert_true(hits > 0 && down > 0 && hits + down == 256);
    ikv_store_close(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blob_format),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_mem),
        cmocka_unit_test(test_full_store_evicts),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_file_torn_and_flipped),
        cmocka_unit_test(test_file_kill9),
        cmocka_unit_test(test_fuzz_against_oracle),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test_teardown(test_redis, teardown_redis),
        cmocka_unit_test_teardown(test_redis_cluster, teardown_redis),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
