/*
 * Fuzz harness: a --tiers specification through ikv_replay_tiers_parse; when it is accepted,
 * the tiers must be what the parser promises (fastest first by the cost model's load time of a
 * block, each once, capacities > 0), and a
 * small built-in segments trace is replayed on them in timed mode (docs/fuzzing.md). The input
 * is the spec (at most 256 bytes); capacities are clamped to 4096 blocks for the replay.
 */
#include "fuzz_util.h"

#include "isokv/cost.h"
#include "isokv/sim.h"

static const char trace[] =
    "{\"format\":\"isokv-segments\",\"version\":1,\"block_tokens\":16}\n"
    "{\"time\":0,\"tenant\":\"a\",\"segments\":[{\"kind\":\"system\",\"id\":\"s\",\"tokens\":64,"
    "\"public\":true},{\"kind\":\"query\",\"id\":\"q1\",\"tokens\":40}]}\n"
    "{\"time\":0.5,\"tenant\":\"b\",\"segments\":[{\"kind\":\"system\",\"id\":\"s\",\"tokens\":64,"
    "\"public\":true},{\"kind\":\"doc\",\"id\":\"d\",\"tokens\":80},{\"kind\":\"query\",\"id\":"
    "\"q2\",\"tokens\":20}]}\n"
    "{\"time\":1,\"tenant\":\"a\",\"segments\":[{\"kind\":\"system\",\"id\":\"s\",\"tokens\":64,"
    "\"public\":true},{\"kind\":\"query\",\"id\":\"q1\",\"tokens\":40},{\"kind\":\"history\","
    "\"id\":\"h\",\"tokens\":33}]}\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = fuzz_string(data, size, 256);
    if (!spec) return 0;
    ikv_replay_tier tiers[IKV_MAX_TIERS];
    size_t n = 0;
    if (ikv_replay_tiers_parse(spec, tiers, &n) == 0) {
        if (n < 1 || n > IKV_MAX_TIERS) abort();
        const ikv_model_spec *m;
        const ikv_hw_spec *hw;
        if (ikv_model_lookup("llama3-70b", &m) || ikv_hw_lookup("h100", &hw)) abort();
        ikv_cost_cfg cfg;
        ikv_cost_cfg_init(&cfg, m, hw);
        ikv_tier prev = IKV_TIER_COUNT;
        for (size_t i = 0; i < n; i++) {
            ikv_tier k;
            if (ikv_tier_parse(tiers[i].name, &k) || tiers[i].capacity_tokens == 0) abort();
            /* each tier once, and none loads a block faster than the one before it */
            for (size_t j = 0; j < i; j++)
                if (!strcmp(tiers[j].name, tiers[i].name)) abort();
            if (i && ikv_load_time(&cfg, k, 1, 64) < ikv_load_time(&cfg, prev, 1, 64)) abort();
            prev = k;
            if (tiers[i].capacity_tokens > 4096 * 16) tiers[i].capacity_tokens = 4096 * 16;
        }
        const char *path = fuzz_write_file("tiers", (const uint8_t *)trace, sizeof trace - 1);
        ikv_trace *t;
        ikv_trace_opts to;
        memset(&to, 0, sizeof to);
        if (path && ikv_trace_open(path, &to, &t) == 0) {
            ikv_replay_opts ro;
            ikv_replay_opts_default(&ro);
            ro.mode = IKV_REPLAY_TIMED;
            ro.n_tiers = n;
            memcpy(ro.tiers, tiers, n * sizeof *tiers);
            ro.check_every = 1;
            ikv_replay_result r;
            if (ikv_replay(t, &ro, &r) == 0) ikv_replay_result_free(&r);
            ikv_trace_close(t);
        }
    }
    free(spec);
    return 0;
}
