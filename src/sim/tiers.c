/*
 * The tier specification of a replay: "hbm=2M,dram=16M,ssd=200M" -> ikv_replay_tier[].
 *
 * Tiers are listed fastest first: a block demoted from tier i goes to tier i + 1, so a slower
 * tier before a faster one would make the cache promote into the slow tier and demote into the
 * fast one. "Faster" is the cost model's: the time to load one block (ikv_load_time), which
 * orders hbm < dram < remote < ssd on every hardware of the catalog (RDMA at 25-50 GB/s and
 * 10 us beats NVMe at 3.5-7 GB/s and 100 us). The parser ranks with llama3-70b on h100;
 * ikv_replay checks the order again on the model and hardware it runs with
 * (ikv_replay_tiers_check). Each tier appears at most once. Capacities are token counts with the
 * usual k/M/G suffixes (ikv_parse_count), > 0. Errors are IKV_EPARAM with a detail naming the piece
 * at fault; *n and tiers are written only on success.
 */
#include "isokv/cost.h"
#include "isokv/sim.h"

#include <string.h>

/* Seconds to load one 64-token block from tier t under cfg. */
static double load1(const ikv_cost_cfg *cfg, ikv_tier t) {
    return ikv_load_time(cfg, t, 1, 64);
}

int ikv_replay_tiers_check(const ikv_replay_tier *tiers, size_t n, const ikv_cost_cfg *cfg) {
    ikv_tier prev = IKV_TIER_HBM;
    for (size_t i = 0; i < n; i++) {
        ikv_tier k;
        if (ikv_tier_parse(tiers[i].name, &k))
            return ikv_error(IKV_EPARAM, "--tiers: unknown tier '%s' (hbm, dram, ssd, remote)",
                             tiers[i].name);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(tiers[j].name, tiers[i].name))
                return ikv_error(IKV_EPARAM, "--tiers: tier '%s' is given twice", tiers[i].name);
        if (i && load1(cfg, k) < load1(cfg, prev))
            return ikv_error(IKV_EPARAM,
                             "--tiers: '%s' comes after the slower '%s' (a block loads in %.3g us "
                             "from %s, %.3g us from %s on %s): list tiers fastest first "
                             "(hbm, dram, remote, ssd)",
                             tiers[i].name, tiers[i - 1].name, load1(cfg, k) * 1e6, tiers[i].name,
                             load1(cfg, prev) * 1e6, tiers[i - 1].name, cfg->hw->name);
        prev = k;
    }
    return 0;
}

int ikv_replay_tiers_parse(const char *spec, ikv_replay_tier *tiers, size_t *n) {
    ikv_replay_tier out[IKV_MAX_TIERS];
    ikv_tier kinds[IKV_MAX_TIERS]; /* for the duplicate check */
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
        for (size_t i = 0; i < k; i++)
            if (kinds[i] == kind)
                return ikv_error(IKV_EPARAM, "--tiers: tier '%s' is given twice", name);
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
    /* the order, on the default cost model (the replay checks its own again) */
    const ikv_model_spec *m;
    const ikv_hw_spec *hw;
    if (ikv_model_lookup("llama3-70b", &m) || ikv_hw_lookup("h100", &hw))
        return ikv_error(IKV_EPARAM, "--tiers: the default cost model is missing");
    ikv_cost_cfg cfg;
    ikv_cost_cfg_init(&cfg, m, hw);
    int rc = ikv_replay_tiers_check(out, k, &cfg);
    if (rc) return rc;
    memcpy(tiers, out, k * sizeof *out);
    *n = k;
    return 0;
}
