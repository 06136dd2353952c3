/*
 * Mooncake trace reader (Qin et al., "Mooncake: Trading More Storage for Less Computation",
 * FAST'25; traces from kvcache-ai/Mooncake, FAST25-release/traces/, Apache-2.0).
 *
 * One request per line:
 *     {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [ids]}
 * Blocks are 512 tokens. Each id stands for a block AND all blocks before it (a prefix hash
 * remapped to small integers), global across the file, so id x maps to the single key
 * ikv_key_from_id(seed, 0, x): equal ids are equal prefixes. The last block may be partial:
 * len(hash_ids) == ceil(input_length / 512); block i has min(512, input - 512 i) tokens.
 *
 * Checks per line: the four fields present and integral, ids non-negative, the timestamp below
 * 1e12 ms and both lengths within opts.max_request_tokens (absurd values such as 1e308 or
 * 2^32-1 are malformed lines, reported with their line), and the id count matching
 * ceil(input/512) (a mismatch is a malformed line, since token hit ratios depend on
 * it). Streams: one line in memory at a time; O(ids) per request.
 */
#include "trace_internal.h"

#define MOONCAKE_BLOCK 512u
#define MAX_TOKENS UINT32_MAX

static int mc_detect(const cJSON *j) {
    return cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "hash_ids")) &&
           cJSON_GetObjectItemCaseSensitive(j, "input_length") != NULL &&
           cJSON_GetObjectItemCaseSensitive(j, "requests") == NULL;
}

static int mc_open(ikv_trace *t) {
    t->tenants = 1;
    return 0;
}

static int mc_next(ikv_trace *t, ikv_trace_request *req) {
    for (;;) {
        int rc = ikv__trace_getline(t);
        if (rc <= 0) return rc;
        cJSON *j = ikv__trace_parse_line(t, &rc);
        if (!j) {
            if (rc) return rc;
            continue;
        }
        uint64_t in = 0, out = 0, lim = ikv__trace_max_request_tokens(t);
        double ts = 0;
        char why[160];
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "hash_ids");
        const char *bad = NULL;
        if (ikv__json_double(j, "timestamp", &ts) || ts < 0) bad = "\"timestamp\" (ms) missing or negative";
        else if (ikv__json_uint(j, "input_length", MAX_TOKENS, &in)) bad = "\"input_length\" missing or not a token count";
        else if (ikv__json_uint(j, "output_length", MAX_TOKENS, &out)) bad = "\"output_length\" missing or not a token count";
        else if (!cJSON_IsArray(ids)) bad = "\"hash_ids\" missing or not an array";
        else if (ts > IKV__TRACE_MAX_SECONDS * 1e3) {
            snprintf(why, sizeof why, "\"timestamp\" %.6g ms is more than 1e12 ms (31 years)", ts);
            bad = why;
        } else if (in > lim || out > lim) {
            snprintf(why, sizeof why,
                     "\"%s\" %llu is more than the limit of %llu tokens (--max-request-tokens)",
                     in > lim ? "input_length" : "output_length",
                     (unsigned long long)(in > lim ? in : out), (unsigned long long)lim);
            bad = why;
        }
        size_t n = bad ? 0 : (size_t)cJSON_GetArraySize(ids);
        if (!bad && n != (in + MOONCAKE_BLOCK - 1) / MOONCAKE_BLOCK) {
            rc = ikv__trace_malformed(t, "%zu hash_ids for input_length %llu (expected ceil(%llu/512) = %llu)",
                                      n, (unsigned long long)in, (unsigned long long)in,
                                      (unsigned long long)((in + MOONCAKE_BLOCK - 1) / MOONCAKE_BLOCK));
            cJSON_Delete(j);
            if (rc) return rc;
            continue;
        }
        if (bad) {
            rc = ikv__trace_malformed(t, "%s", bad);
            cJSON_Delete(j);
            if (rc) return rc;
            continue;
        }
        if ((rc = ikv__trace_reserve(t, n ? n : 1))) {
            cJSON_Delete(j);
            return rc;
        }
        size_t i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, ids) {
            uint64_t id;
            if (ikv__json_item_uint(it, UINT64_MAX >> 11, &id)) break;
            t->keys[i] = ikv_key_from_id(t->opts.seed, 0, id);
            uint64_t left = in - (uint64_t)i * MOONCAKE_BLOCK;
            t->ntokens[i] = left < MOONCAKE_BLOCK ? (uint32_t)left : MOONCAKE_BLOCK;
            i++;
        }
        cJSON_Delete(j);
        if (i != n) {
            if ((rc = ikv__trace_malformed(t, "hash_ids[%zu] is not a non-negative integer", i)))
                return rc;
            continue;
        }
        req->time = ts / 1000.0;
        req->tenant = 0;
        req->session = 0;
        req->input_tokens = (uint32_t)in;
        req->output_tokens = (uint32_t)out;
        req->n_blocks = n;
        req->keys = t->keys;
        req->ntokens = t->ntokens;
        return 1;
    }
}

const ikv__trace_reader ikv__trace_mooncake = {
    .name = "mooncake",
    .format = IKV_TRACE_MOONCAKE,
    .block_tokens = MOONCAKE_BLOCK,
    .detect = mc_detect,
    .open = mc_open,
    .next = mc_next,
    .rewind = NULL,
    .close = NULL,
};
