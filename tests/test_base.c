/* Tests for base/: error strings, error detail, the allocation seam, block keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <string.h>

#include "isokv/base.h"

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
    const char *bad[] = {"", "12x", "-1", "1.5", "0x10", "inf", "nan", "1e30", "2^20", "k",
                         "1kk", " 1", "18446744073709551616"};
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
    struct { double v; const char *s; } cases[] = {
        {0, "0"},         {999, "999"},        {999.6, "1k"},     {1500, "1.5k"},
        {999600, "1M"},   {999936, "1M"},      {2e6, "2M"},       {123456789, "123M"},
        {999.5e9, "1T"},  {16777216, "16.8M"},
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror),  cmocka_unit_test(test_errdetail),
        cmocka_unit_test(test_alloc_fail), cmocka_unit_test(test_keys_chain),
        cmocka_unit_test(test_keys_ids),   cmocka_unit_test(test_parse_count),
        cmocka_unit_test(test_fmt_count),  cmocka_unit_test(test_errdetail_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
