/*
 * The tier specification of a replay: "hbm=2M,dram=16M,ssd=200M" -> ikv_replay_tier[].
 *
 * Tiers are listed fastest first, in the cost model's order (hbm, dram, ssd, remote): a block
 * demoted from tier i goes to tier i + 1, so a slower tier before a faster one would make the
 * cache promote into the slow tier and demote into the fast one. Each tier appears at most
 * once. Capacities are token counts with the usual k/M/G suffixes (ikv_parse_count), > 0.
 * Errors are IKV_EPARAM with a detail naming the piece at fault; *n and tiers are written only
 * on success.
 */
#include "isokv/cost.h"
#include "isokv/sim.h"

#include <string.h>

int ikv_replay_tiers_parse(const char *spec, ikv_replay_tier *tiers, size_t *n) {
    ikv_replay_tier out[IKV_MAX_TIERS];
    ikv_tier kinds[IKV_MAX_TIERS];
    size_t k = 0;
    if (!spec || !*spec) return ikv_error(IKV_EPARAM, "--tiers: no tier given");
    const char *p = spec;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq || eq == p)
            return ikv_error(IKV_EPARAM, "--tiers: '%.*s' is not NAME=TOKENS", (int)len, p);
        size_t nlen = (size_t)(eq - p), vlen = len - nlen - 1;
        char name[16], val[32];
        if (nlen >= sizeof name || vlen >= sizeof val)
            return ikv_error(IKV_EPARAM, "--tiers: '%.*s' is too long", (int)len, p);
        memcpy(name, p, nlen);
        name[nlen] = 0;
        memcpy(val, eq + 1, vlen);
        val[vlen] = 0;
        ikv_tier kind;
        if (ikv_tier_parse(name, &kind))
            return ikv_error(IKV_EPARAM, "--tiers: unknown tier '%s' (hbm, dram, ssd, remote)",
                             name);
        if (k == IKV_MAX_TIERS)
            return ikv_error(IKV_EPARAM, "--tiers: at most %d tiers", IKV_MAX_TIERS);
        for (size_t i = 0; i < k; i++) {
            if (kinds[i] == kind)
                return ikv_error(IKV_EPARAM, "--tiers: tier '%s' is given twice", name);
            if (kinds[i] > kind)
                return ikv_error(IKV_EPARAM,
                                 "--tiers: '%s' comes after the slower '%s': list tiers fastest "
                                 "first (hbm, dram, ssd, remote)",
                                 name, out[i].name);
        }
        uint64_t cap;
        if (ikv_parse_count(val, &cap) || cap == 0)
            return ikv_error(IKV_EPARAM, "--tiers: bad capacity '%s' for %s (a token count > 0)",
                             val, name);
        memset(&out[k], 0, sizeof out[k]);
        memcpy(out[k].name, name, nlen + 1);
        out[k].capacity_tokens = cap;
        kinds[k] = kind;
        k++;
        if (!comma) break;
        p = comma + 1;
    }
    memcpy(tiers, out, k * sizeof *out);
    *n = k;
    return 0;
}
