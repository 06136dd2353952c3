/*
 * Tests of the shared test helpers (tests/testutil.c): a tree made under tu_tmpdir is gone after
 * tu_rmtree (links not followed), tu_run reports exit codes and kills a child that overstays its
 * bound, tu_kill_all reaps what is left, tu_free_port gives a bindable port, and the
 * allocation-failure harness stops at the first run that succeeds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "isokv/base.h"
#include "testutil.h"

static void test_tmpdir_rmtree(void **st) {
    (void)st;
    char d[64], keep[64];
    assert_int_equal(tu_tmpdir(d, sizeof d, "testutil"), 0);
    assert_int_equal(tu_tmpdir(keep, sizeof keep, "testutil_keep"), 0);
    assert_non_null(strstr(d, "/tmp/ikv_test_testutil_"));
    assert_int_equal(mkdir(tu_path(d, "a"), 0700), 0);
    assert_int_equal(mkdir(tu_path(d, "a/b"), 0700), 0);
    FILE *f = fopen(tu_path(d, "a/b/f"), "w");
    assert_non_null(f);
    fclose(f);
    f = fopen(tu_path(keep, "kept"), "w");
    assert_non_null(f);
    fclose(f);
    /* a link to another directory is removed, not followed */
    assert_int_equal(symlink(keep, tu_path(d, "a/link")), 0);
    assert_int_equal(tu_rmtree(d), 0);
    struct stat sb;
    assert_int_equal(lstat(d, &sb), -1);
    assert_int_equal(lstat(tu_path(keep, "kept"), &sb), 0);
    assert_int_equal(tu_rmtree(keep), 0);
    assert_int_equal(tu_rmtree(keep), 0); /* already gone: fine */
    char small[8];
    assert_int_equal(tu_tmpdir(small, sizeof small, "testutil"), -1);
}

static void test_run_and_timeout(void **st) {
    (void)st;
    const char *ok[] = {"true", NULL}, *bad[] = {"false", NULL}, *none[] = {"/nonexistent", NULL};
    assert_int_equal(tu_run(ok, NULL, NULL, 10), 0);
    assert_int_equal(tu_run(bad, NULL, NULL, 10), 1);
    assert_int_equal(tu_run(none, NULL, NULL, 10), 127);
    const char *slow[] = {"sleep", "30", NULL};
    assert_int_equal(tu_run(slow, NULL, NULL, 0.2), -1); /* killed after 0.2 s */
    /* stdout to a file */
    char d[64];
    assert_int_equal(tu_tmpdir(d, sizeof d, "testutil"), 0);
    const char *echo[] = {"echo", "hello", NULL};
    assert_int_equal(tu_run(echo, tu_path(d, "out"), NULL, 10), 0);
    FILE *f = fopen(tu_path(d, "out"), "r");
    assert_non_null(f);
    char line[32] = {0};
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_string_equal(line, "hello\n");
    assert_int_equal(tu_rmtree(d), 0);
    assert_int_equal(tu_in_path("sh"), 1);
    assert_int_equal(tu_in_path("no-such-program-ikv"), 0);
}

static void test_kill_all(void **st) {
    (void)st;
    const char *slow[] = {"sleep", "30", NULL};
    pid_t a = tu_spawn(slow, NULL, NULL), b = tu_spawn(slow, NULL, NULL);
    assert_true(a > 0 && b > 0);
    tu_kill_all();
    /* reaped: no such child any more */
    errno = 0;
    assert_int_equal(kill(a, 0), -1);
    assert_int_equal(kill(b, 0), -1);
}

static void test_free_port(void **st) {
    (void)st;
    int p = tu_free_port(10000);
    assert_true(p >= 20000 && p < 30000);
}

static int calls;

/* Allocates three times through the seam; fails with IKV_ENOMEM when any allocation fails. */
static int three_allocs(void *ctx) {
    (void)ctx;
    calls++;
    void *p[3] = {0};
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++)
        if (!(p[i] = ikv_malloc(8))) rc = IKV_ENOMEM;
    for (int i = 0; i < 3; i++)
        ikv_free(p[i]);
    return rc;
}

static void test_alloc_fail_each(void **st) {
    (void)st;
    calls = 0;
    assert_int_equal(tu_alloc_fail_each(three_allocs, NULL, 10), 3);
    assert_int_equal(calls, 4);
    /* the seam works again afterwards */
    void *p = ikv_malloc(8);
    assert_non_null(p);
    ikv_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tmpdir_rmtree),   cmocka_unit_test(test_run_and_timeout),
        cmocka_unit_test(test_kill_all),        cmocka_unit_test(test_free_port),
        cmocka_unit_test(test_alloc_fail_each),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
