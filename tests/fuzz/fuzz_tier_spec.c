/*
 * Fuzz harness: a --tiers specification through ikv_replay_tiers_parse; when it is accepted,
 * the tiers must be what the parser promises (fastest first, each once, capacities > 0), and a
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
        ikv_tier prev = IKV_TIER_COUNT;
        for (size_t i = 0; i < n; i++) {
            ikv_tier k;
            if (ikv_tier_parse(tiers[i].name, &k) || tiers[i].capacity_tokens == 0) abort();
            if (i && k <= prev) abort();
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
