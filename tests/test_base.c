/* Tests for base/: error strings, error detail, the allocation seam, block keys, atomic output
 * files (ikv_outset). */
#define _XOPEN_SOURCE 700 /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "isokv/base.h"
#include "testutil.h"

static void test_strerror(void **st) {
    (void)st;
    assert_string_equal(ikv_strerror(0), "success");
    assert_string_equal(ikv_strerror(IKV_ENOMEM), "out of memory");
    assert_string_equal(ikv_strerror(IKV_EPOLICY), "unknown eviction policy");
    assert_string_equal(ikv_strerror(12345), "unknown error");
    assert_true(IKV_ENOMEM < 0 && IKV_EUNSUPPORTED < 0);
}

static void test_errdetail(void **st) {
    (void)st;
    int rc = ikv_error(IKV_EFORMAT, "%s:%d: bad", "f.jsonl", 7);
    assert_int_equal(rc, IKV_EFORMAT);
    assert_string_equal(ikv_errdetail(), "f.jsonl:7: bad");
}

static void test_alloc_fail(void **st) {
    (void)st;
    ikv_alloc_fail_after(1);
    void *a = ikv_malloc(8);
    void *b = ikv_malloc(8);
    assert_non_null(a);
    assert_null(b);
    ikv_alloc_fail_after(SIZE_MAX);
    b = ikv_malloc(8);
    assert_non_null(b);
    ikv_free(a);
    ikv_free(b);
}

static void test_keys_chain(void **st) {
    (void)st;
    uint32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (uint32_t)i * 7;
    ikv_key k[4], k2[4];
    assert_int_equal(ikv_keys_of_tokens(1, toks, 64, 16, 5, 0, k, 4), 4);
    /* same tokens, same scope: same keys; different scope: disjoint keys */
    ikv_keys_of_tokens(1, toks, 64, 16, 5, 0, k2, 4);
    for (int i = 0; i < 4; i++) assert_true(ikv_key_eq(k[i], k2[i]));
    ikv_keys_of_tokens(1, toks, 64, 16, 6, 0, k2, 4);
    for (int i = 0; i < 4; i++) assert_false(ikv_key_eq(k[i], k2[i]));
    /* a different seed changes every key */
    ikv_keys_of_tokens(2, toks, 64, 16, 5, 0, k2, 4);
    for (int i = 0; i < 4; i++) assert_false(ikv_key_eq(k[i], k2[i]));
    /* a change in block 1 changes keys 1.. but not 0 (keys name whole prefixes) */
    toks[20]++;
    ikv_keys_of_tokens(1, toks, 64, 16, 5, 0, k2, 4);
    assert_true(ikv_key_eq(k[0], k2[0]));
    for (int i = 1; i < 4; i++) assert_false(ikv_key_eq(k[i], k2[i]));
    /* the chain is what ikv_key_chain computes block by block */
    ikv_key c0 = ikv_key_chain(1, NULL, toks, 16, 5);
    ikv_key c1 = ikv_key_chain(1, &c0, toks + 16, 16, 5);
    assert_true(ikv_key_eq(c1, k2[1]));
    /* partial last block only when asked */
    assert_int_equal(ikv_keys_of_tokens(1, toks, 60, 16, 5, 0, k2, 4), 3);
    assert_int_equal(ikv_keys_of_tokens(1, toks, 60, 16, 5, 1, k2, 4), 4);
}

static void test_keys_ids(void **st) {
    (void)st;
    ikv_key a = ikv_key_from_id(0, 1, 42), b = ikv_key_from_id(0, 2, 42);
    ikv_key c = ikv_key_from_id(0, 1, 42);
    assert_false(ikv_key_eq(a, b));
    assert_true(ikv_key_eq(a, c));
    assert_int_not_equal(ikv_scope_salt(0, "alice"), ikv_scope_salt(0, "bob"));
    assert_true(ikv_scope_salt(0, "") == IKV_SCOPE_PUBLIC);
    assert_true(ikv_scope_salt(0, NULL) == IKV_SCOPE_PUBLIC);
}

/* One number parser for every flag: suffixes, whole strings, exact integers. */
static void test_parse_count(void **st) {
    (void)st;
    uint64_t v;
    assert_int_equal(ikv_parse_count("12", &v), 0), assert_int_equal(v, 12);
    assert_int_equal(ikv_parse_count("2M", &v), 0), assert_int_equal(v, 2000000);
    assert_int_equal(ikv_parse_count("1.5k", &v), 0), assert_int_equal(v, 1500);
    assert_int_equal(ikv_parse_count("1.1k", &v), 0), assert_int_equal(v, 1100);
    assert_int_equal(ikv_parse_count("1e3", &v), 0), assert_int_equal(v, 1000);
    assert_int_equal(ikv_parse_count("3G", &v), 0), assert_int_equal(v, 3000000000ull);
    assert_int_equal(ikv_parse_count("18446744073709551615", &v), 0);
    assert_true(v == UINT64_MAX);
    const char *bad[] = {"",
                         "12x",
                         "-1",
                         "1.5",
                         "0x10",
                         "inf",
                         "nan",
                         "1e30",
                         "2^20",
                         "k",
                         "1kk",
                         " 1",
                         "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ikv_parse_count(bad[i], &v), -1);
    double d;
    assert_int_equal(ikv_parse_double("0.25", &d), 0);
    assert_true(d == 0.25);
    assert_int_equal(ikv_parse_double("0x1p3", &d), -1);
    assert_int_equal(ikv_parse_double("1e999", &d), -1);
}

/* Regression: 999 600 tokens printed as "1e+03k"; the unit is chosen after rounding. */
static void test_fmt_count(void **st) {
    (void)st;
    char b[32];
    struct {
        double v;
        const char *s;
    } cases[] = {
        {0, "0"},       {999, "999"}, {999.6, "1k"},       {1500, "1.5k"},  {999600, "1M"},
        {999936, "1M"}, {2e6, "2M"},  {123456789, "123M"}, {999.5e9, "1T"}, {16777216, "16.8M"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ikv_fmt_count(b, sizeof b, cases[i].v);
        assert_string_equal(b, cases[i].s);
    }
}

/* A bare error code never prints a stale detail ("success"). */
static void test_errdetail_for(void **st) {
    (void)st;
    ikv_error(IKV_EINVAL, "older detail");
    assert_string_equal(ikv_errdetail_for(IKV_ENOMEM), "out of memory");
    assert_string_equal(ikv_errdetail_for(IKV_EINVAL), "older detail");
}

/* ---- atomic output files ----------------------------------------------------------------- */

static char odir[256];

static const char *op(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", odir, name);
    return buf[k];
}

static int setup_odir(void **st) {
    (void)st;
    return tu_tmpdir(odir, sizeof odir, "base");
}

static int teardown_odir(void **st) {
    (void)st;
    return tu_rmtree(odir);
}

/* Entries in odir other than . and .. (temporaries included). */
static int entries(void) {
    DIR *d = opendir(odir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *get(const char *path) {
    static char buf[4096];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void test_outset_commit(void **st) {
    (void)st;
    put(op("b"), "old b");
    chmod(op("b"), 0640);
    ikv_outset *s;
    FILE *fa, *fb;
    const char *tc;
    assert_int_equal(ikv_outset_create(&s), 0);
    assert_int_equal(ikv_outset_add(s, op("a"), &fa, NULL), 0);
    assert_int_equal(ikv_outset_add(s, op("b"), &fb, NULL), 0);
    assert_int_equal(ikv_outset_add(s, op("c"), NULL, &tc), 0);
    assert_int_equal(ikv_outset_count(s), 3);
    fputs("new a", fa);
    fputs("new b", fb);
    put(tc, "new c"); /* as a child program writes the temp by name */
    /* nothing is visible before the commit */
    assert_null(get(op("a")));
    assert_string_equal(get(op("b")), "old b");
    assert_int_equal(ikv_outset_commit(s), 0);
    ikv_outset_destroy(s);
    assert_string_equal(get(op("a")), "new a");
    assert_string_equal(get(op("b")), "new b");
    assert_string_equal(get(op("c")), "new c");
    struct stat sb;
    assert_int_equal(stat(op("b"), &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640); /* the replaced file's mode is kept */
    assert_int_equal(entries(), 3);            /* no temporary left */
    unlink(op("a")), unlink(op("b")), unlink(op("c"));
}

static void test_outset_abandon(void **st) {
    (void)st;
    put(op("keep"), "old");
    ikv_outset *s;
    FILE *f;
    assert_int_equal(ikv_outset_create(&s), 0);
    assert_int_equal(ikv_outset_add(s, op("keep"), &f, NULL), 0);
    assert_int_equal(ikv_outset_add(s, op("new"), &f, NULL), 0);
    fputs("partial", f);
    assert_int_equal(entries(), 3); /* keep + two temporaries */
    ikv_outset_destroy(s);          /* not committed: temporaries removed, targets as they were */
    assert_int_equal(entries(), 1);
    assert_string_equal(get(op("keep")), "old");
    ikv_outset_destroy(NULL);
    unlink(op("keep"));
}

/* Regression (issue 9, security defect 3): an output path naming a device, a FIFO or a
 * directory was replaced by a regular file (temp + rename); it must be refused, saying what it
 * is, and left as it was. A symlink to a regular file is written through (the link stays). */
static void test_outset_refuses_non_regular(void **st) {
    (void)st;
    ikv_outset *s;
    FILE *f;
    assert_int_equal(ikv_outset_create(&s), 0);
    assert_int_equal(mkfifo(op("fifo"), 0600), 0);
    assert_int_equal(ikv_outset_add(s, op("fifo"), &f, NULL), IKV_EINVAL);
    assert_non_null(strstr(ikv_errdetail(), "FIFO"));
    assert_non_null(strstr(ikv_errdetail(), op("fifo")));
    assert_int_equal(mkdir(op("dir"), 0700), 0);
    assert_int_equal(ikv_outset_add(s, op("dir"), &f, NULL), IKV_EINVAL);
    assert_non_null(strstr(ikv_errdetail(), "directory"));
    assert_int_equal(ikv_outset_add(s, "/dev/null", &f, NULL), IKV_EINVAL);
    assert_non_null(strstr(ikv_errdetail(), "character device"));
    assert_int_equal(symlink("/dev/null", op("lnull")), 0);
    assert_int_equal(ikv_outset_add(s, op("lnull"), &f, NULL), IKV_EINVAL);
    assert_non_null(strstr(ikv_errdetail(), "symbolic link to a character device"));
    assert_int_equal(symlink(op("missing"), op("dangling")), 0);
    assert_int_equal(ikv_outset_add(s, op("dangling"), &f, NULL), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "missing"));
    assert_int_equal(ikv_outset_add(s, op("nodir/x"), &f, NULL), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "nodir"));
    assert_int_equal(ikv_outset_add(s, "", &f, NULL), IKV_EINVAL);
    assert_int_equal(ikv_output_check(op("fifo")), IKV_EINVAL);
    assert_int_equal(ikv_output_check(op("fine")), 0);
    assert_int_equal(ikv_outset_count(s), 0);
    ikv_outset_destroy(s);
    struct stat sb;
    assert_int_equal(lstat(op("fifo"), &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    assert_int_equal(stat("/dev/null", &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
    /* written through a symlink: the file it names is replaced, the link stays */
    put(op("real"), "old");
    assert_int_equal(symlink("real", op("link")), 0);
    assert_int_equal(ikv_outset_create(&s), 0);
    assert_int_equal(ikv_outset_add(s, op("link"), &f, NULL), 0);
    fputs("through", f);
    assert_int_equal(ikv_outset_commit(s), 0);
    ikv_outset_destroy(s);
    assert_int_equal(lstat(op("link"), &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_string_equal(get(op("real")), "through");
    unlink(op("fifo")), rmdir(op("dir")), unlink(op("lnull")), unlink(op("dangling"));
    unlink(op("link")), unlink(op("real"));
    assert_int_equal(entries(), 0);
}

/* Regression (issue 9, security defect 4): two outputs of one command naming the same file,
 * by the same name, another spelling, a symlink or a hard link, are refused. */
static void test_outset_same_file(void **st) {
    (void)st;
    put(op("x"), "x");
    assert_int_equal(symlink("x", op("sx")), 0);
    assert_int_equal(link(op("x"), op("hx")), 0);
    char dotted[600];
    snprintf(dotted, sizeof dotted, "%s/./x", odir);
    const char *other[] = {op("x"), dotted, op("sx"), op("hx")};
    for (size_t i = 0; i < 4; i++) {
        ikv_outset *s;
        FILE *f;
        assert_int_equal(ikv_outset_create(&s), 0);
        assert_int_equal(ikv_outset_add(s, op("x"), &f, NULL), 0);
        assert_int_equal(ikv_outset_add(s, other[i], &f, NULL), IKV_EEXIST);
        assert_non_null(strstr(ikv_errdetail(), "same file"));
        ikv_outset_destroy(s);
    }
    /* a file that does not exist yet, named twice */
    ikv_outset *s;
    FILE *f;
    snprintf(dotted, sizeof dotted, "%s/./new", odir);
    assert_int_equal(ikv_outset_create(&s), 0);
    assert_int_equal(ikv_outset_add(s, op("new"), &f, NULL), 0);
    assert_int_equal(ikv_outset_add(s, dotted, &f, NULL), IKV_EEXIST);
    ikv_outset_destroy(s);
    assert_string_equal(get(op("x")), "x");
    unlink(op("x")), unlink(op("sx")), unlink(op("hx"));
    assert_int_equal(entries(), 0);
}

/* Regression (issue 9, security defect 5): when one output of a set fails to write (here: the
 * file size limit, as a full disk would), no target is replaced, not even those whose writes
 * succeeded, and no temporary is left. */
static void test_outset_all_or_nothing(void **st) {
    (void)st;
    put(op("a"), "old a");
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    ikv_outset *s;
    FILE *fa, *fb;
    assert_int_equal(ikv_outset_create(&s), 0);
    assert_int_equal(ikv_outset_add(s, op("a"), &fa, NULL), 0);
    assert_int_equal(ikv_outset_add(s, op("b"), &fb, NULL), 0);
    fputs("small", fa);
    for (int i = 0; i < 1000; i++)
        fputs("0123456789", fb); /* 10 kB */
    lim = old;
    lim.rlim_cur = 4096;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = ikv_outset_commit(s);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), op("b")));
    ikv_outset_destroy(s);
    assert_string_equal(get(op("a")), "old a");
    assert_null(get(op("b")));
    assert_int_equal(entries(), 1);
    unlink(op("a"));
}

/* One try of a two-file set for tu_alloc_fail_each: a failed one leaves nothing behind. */
static int try_outset(void *ctx) {
    (void)ctx;
    ikv_outset *s = NULL;
    FILE *f;
    int rc = ikv_outset_create(&s);
    if (!rc) rc = ikv_outset_add(s, op("m1"), &f, NULL);
    if (!rc) fputs("1", f), rc = ikv_outset_add(s, op("m2"), &f, NULL);
    if (!rc) fputs("2", f), rc = ikv_outset_commit(s);
    ikv_outset_destroy(s);
    if (rc) assert_int_equal(entries(), 0);
    return rc;
}

/* Allocation failure at every point of a two-file set leaves nothing behind. */
static void test_outset_oom(void **st) {
    (void)st;
    tu_alloc_fail_each(try_outset, NULL, 40);
    assert_string_equal(get(op("m1")), "1");
    assert_string_equal(get(op("m2")), "2");
    unlink(op("m1")), unlink(op("m2"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror),         cmocka_unit_test(test_errdetail),
        cmocka_unit_test(test_alloc_fail),       cmocka_unit_test(test_keys_chain),
        cmocka_unit_test(test_keys_ids),         cmocka_unit_test(test_outset_commit),
        cmocka_unit_test(test_outset_abandon),   cmocka_unit_test(test_outset_refuses_non_regular),
        cmocka_unit_test(test_outset_same_file), cmocka_unit_test(test_outset_all_or_nothing),
        cmocka_unit_test(test_outset_oom),       cmocka_unit_test(test_parse_count),
        cmocka_unit_test(test_fmt_count),        cmocka_unit_test(test_errdetail_for),
    };
    return cmocka_run_group_tests(tests, setup_odir, teardown_odir);
}
