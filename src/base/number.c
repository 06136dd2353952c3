/*
 * Numbers as people type them on a command line, and as the tools print them back.
 *
 * One parser for every count a flag takes (subcommands and bench programs alike), so that the
 * k/M/G suffixes the README promises work everywhere and a typo is never taken for a number:
 *
 *     "12"  -> 12        "2M" -> 2000000      "1.5k" -> 1500      "1e3" -> 1000
 *     "12x", "", "-1", "0x10", "1.5", "inf", "2^20", "1e30"  -> rejected
 *
 * Suffixes are decimal (k = 1e3, M = 1e6, G = 1e9, T = 1e12), case-insensitive, and apply to
 * a mantissa that may be fractional as long as the product is whole. A string of digits alone is
 * read with strtoull, so every uint64 value is exact; anything else goes through strtod and must
 * stay below 2^63 (where doubles still hold whole numbers of that size without surprise).
 *
 * The printer does the inverse with three significant digits, choosing the unit after rounding
 * (999 600 prints as "1M", never "1e+03k").
 */
#include "isokv/base.h"

#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int ikv_parse_count(const char *s, uint64_t *out) {
    if (!s || !*s) return -1;
    size_t n = strlen(s), digits = strspn(s, "0123456789");
    if (digits == n) {
        errno = 0;
        unsigned long long v = strtoull(s, NULL, 10);
        if (errno) return -1;
        *out = v;
        return 0;
    }
    /* a decimal mantissa: digits, at most one '.', an optional exponent; then a suffix */
    if (!(s[0] >= '0' && s[0] <= '9') && s[0] != '.') return -1;
    if (strpbrk(s, "xXpP")) return -1; /* strtod would take hexadecimal */
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return -1;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k':
        case 'K':
            mul = 1e3;
            break;
        case 'm':
        case 'M':
            mul = 1e6;
            break;
        case 'g':
        case 'G':
            mul = 1e9;
            break;
        case 't':
        case 'T':
            mul = 1e12;
            break;
        default:
            return -1;
        }
        if (end[1]) return -1;
    }
    v *= mul;
    /* 1.1k is 1100 although 1.1 * 1000 is 1100.0000000000002 in binary */
    double r = nearbyint(v);
    if (fabs(v - r) > 1e-9 * (r > 1 ? r : 1) || r >= 9.2e18) return -1;
    *out = (uint64_t)r;
    return 0;
}

int ikv_parse_double(const char *s, double *out) {
    if (!s || !*s) return -1;
    if (strpbrk(s, "xXpP")) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

void ikv_fmt_count(char *buf, size_t n, double v) {
    static const char *const unit[] = {"", "k", "M", "G", "T", "P"};
    const size_t nu = sizeof unit / sizeof unit[0];
    if (!isfinite(v)) {
        snprintf(buf, n, "%g", v);
        return;
    }
    double scale = 1;
    for (size_t i = 0; i < nu; i++, scale *= 1e3) {
        char tmp[32];
        if (i == 0)
            snprintf(tmp, sizeof tmp, "%.0f", v);
        else
            snprintf(tmp, sizeof tmp, "%.3g", v / scale);
        /* the rounded mantissa still below 1000 (and not in exponent form): this unit fits */
        if ((fabs(strtod(tmp, NULL)) < 1000 && !strchr(tmp, 'e')) || i == nu - 1) {
            snprintf(buf, n, "%s%s", tmp, unit[i]);
            return;
        }
    }
}
