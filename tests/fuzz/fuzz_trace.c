/*
 * Fuzz harness: a trace file through its reader and a replay (docs/fuzzing.md).
 *
 * Built once per reader (FUZZ_FORMAT = IKV_TRACE_MOONCAKE, _WEKA, _SEGMENTS, _ORACLE: the
 * harnesses trace_mooncake, trace_weka, trace_segments, trace_oracle), with detection (IKV_TRACE_AUTO) tried
 * on every fourth input. The input is the file; the replay varies with fuzz_pick: order or
 * timed mode, strict or lenient lines, a policy among lru, opt (its first pass rewinds the
 * trace), value, s3fifo and arc, one tier or hbm+dram, and a cache check after every request.
 * Bounded: at most 256 requests of at most 65536 tokens, capacities of a few dozen blocks.
 */
#include "fuzz_util.h"

#include "isokv/sim.h"

#ifndef FUZZ_FORMAT
#define FUZZ_FORMAT IKV_TRACE_AUTO
#endif
#ifndef FUZZ_TAG
#define FUZZ_TAG "trace"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_file(FUZZ_TAG, data, size);
    if (!path) return 0;
    unsigned pick = fuzz_pick(data, size, 1u << 16);
    ikv_trace_opts to;
    memset(&to, 0, sizeof to);
    to.format = (pick & 3) == 3 ? IKV_TRACE_AUTO : FUZZ_FORMAT;
    to.strict = (pick >> 2) & 1;
    to.max_requests = 256;
    to.max_request_tokens = 65536;
    to.max_segment_tokens = 16384;
    to.seed = 7;
    ikv_trace *t;
    if (ikv_trace_open(path, &to, &t)) return 0;
    static const char *const policies[] = {"lru", "opt", "value", "s3fifo", "arc"};
    ikv_replay_opts ro;
    ikv_replay_opts_default(&ro);
    ro.mode = (pick >> 3) & 1 ? IKV_REPLAY_TIMED : IKV_REPLAY_ORDER;
    ro.policy = policies[(pick >> 4) % 5];
    ro.check_every = 1;
    ro.servers = 2;
    uint64_t bt = ikv_trace_block_tokens(t);
    if ((pick >> 7) & 1) {
        ro.n_tiers = 2;
        snprintf(ro.tiers[0].name, sizeof ro.tiers[0].name, "hbm");
        ro.tiers[0].capacity_tokens = 8 * bt;
        snprintf(ro.tiers[1].name, sizeof ro.tiers[1].name, "dram");
        ro.tiers[1].capacity_tokens = 32 * bt;
    } else {
        ro.capacity_tokens = ((pick >> 8) & 1) ? 0 : 24 * bt; /* 0: unlimited (first pass) */
    }
    ro.pin_public = (pick >> 9) & 1;
    ro.chunk_reuse = (pick >> 10) & 1 ? 0.15 : -1;
    ikv_replay_result r;
    if (ikv_replay(t, &ro, &r) == 0) {
        /* what the replay measured must be consistent whatever the input */
        if (r.hit_blocks > r.blocks || r.prefix_hit_tokens > r.input_tokens) abort();
        ikv_replay_result_free(&r);
    }
    ikv_trace_close(t);
    return 0;
}
