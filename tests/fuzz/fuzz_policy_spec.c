/*
 * Fuzz harness: an eviction-policy specification "NAME[:k=v,...]" through ikv_cache_create
 * (the policy registry and each policy's parameter parser), then, when it is accepted, a few
 * hundred accesses on a two-tier cache of 16 + 32 blocks with ikv_cache_check after each
 * (docs/fuzzing.md). The input is the spec (at most 256 bytes).
 */
#include "fuzz_util.h"

#include "isokv/cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = fuzz_string(data, size, 256);
    if (!spec) return 0;
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 16, spec);
    cfg.n_tiers = 2;
    cfg.tiers[1].name = "dram";
    cfg.tiers[1].capacity = 32;
    cfg.tiers[1].policy = spec;
    ikv_cache *c;
    if (ikv_cache_create(&cfg, &c) == 0) {
        uint64_t x = 88172645463325252ull;
        ikv_key keys[12];
        uint64_t next[12];
        for (uint64_t now = 1; now <= 300; now++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t n = 1 + x % 12, root = (x >> 8) % 5;
            uint64_t id = root + 1;
            for (size_t i = 0; i < n; i++) {
                /* a prefix id: equal ids are equal prefixes, as the index requires */
                id = id * 5 + (i < 3 ? 1 : 1 + (x >> (16 + 2 * i)) % 4);
                keys[i] = ikv_key_from_id(1, 0, id);
                next[i] = now + 1 + ((x >> i) % 50);
            }
            ikv_access a = {.now = now, .scope = root + 1, .next_use = next, .ntokens = NULL};
            ikv_access_result r;
            int rc = ikv_cache_access(c, keys, n, &a, &r);
            if (rc && rc != IKV_EFULL) abort();
            if (!ikv_cache_check(c)) abort();
        }
        ikv_cache_destroy(c);
    }
    free(spec);
    return 0;
}
