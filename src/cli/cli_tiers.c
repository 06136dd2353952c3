/*
 * --tier flags shared by the subcommands that run the engine (run, and later serve): parse,
 * open the stores for the loaded model (slot size and fingerprint come from the engine), hand
 * them to the engine options, report their measured figures, close them.
 */
#include "cli.h"
#include "isokv/model.h"
#include "isokv/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

const char cli_tiers_help[] =
    "--tier SPEC adds a lower KV tier below the engine's pool, fastest first (repeatable, up\n"
    "to 3): mem:SIZE, file:PATH:SIZE (persistent), redis://HOST:PORT[/DB]:SIZE,\n"
    "redis-cluster://HOST:PORT[,HOST:PORT...][:SIZE]. Blocks the pool evicts go down the\n"
    "tiers; a later hit loads them back when loading is measured to beat recomputing.\n"
    "--tier-dtype q8 stores lower-tier blocks as int8 with a scale per token and kv head\n"
    "(about 4x fewer bytes; lossy: such hits are reported; default f32, exact).\n";

int cli_tiers_dtype(cli_tiers *t, const char *cmd, const char *v) {
    if (!strcmp(v, "f32") || !strcmp(v, "fp32"))
        t->dtype = IKV_BLOB_DTYPE_F32;
    else if (!strcmp(v, "q8"))
        t->dtype = IKV_BLOB_DTYPE_Q8;
    else
        return cli_usage_error(cmd, "--tier-dtype wants f32 or q8, got '%s'", v);
    return IKV_EXIT_OK;
}

int cli_tiers_add(cli_tiers *t, const char *cmd, const char *spec) {
    if (t->n == CLI_MAX_TIERS)
        return cli_usage_error(cmd, "at most %d --tier options", CLI_MAX_TIERS);
    t->specs[t->n++] = spec;
    return IKV_EXIT_OK;
}

/* XXH3-64 of a file's bytes, 0 if it cannot be read. */
static uint64_t file_hash(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        XXH3_64bits_update(s, buf, n);
    fclose(f);
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

int cli_tiers_open(cli_tiers *t, const char *cmd, const ikv_model *m, const char *tokenizer,
                   ikv_engine_options *eo) {
    if (!t->n) return IKV_EXIT_OK;
    eo->tokenizer_fp = tokenizer ? file_hash(tokenizer) : 0;
    eo->tier_dtype = t->dtype;
    ikv_store_params p;
    ikv_engine_store_params(m, eo, &p);
    for (size_t i = 0; i < t->n; i++) {
        int rc = ikv_store_open(t->specs[i], &p, &t->st[i]);
        if (rc == IKV_EPARAM) return cli_usage_error(cmd, "--tier: %s", ikv_errdetail());
        if (rc) return cli_fail(cmd, "--tier: %s", ikv_errdetail());
        eo->tiers[i] = t->st[i];
    }
    eo->n_tiers = t->n;
    return IKV_EXIT_OK;
}

void cli_tiers_report(const cli_tiers *t, const ikv_engine *e, const char *cmd) {
    for (size_t i = 0; i < t->n && e; i++) {
        ikv_engine_tier_stats s;
        if (ikv_engine_tier_stats_get(e, i + 1, &s)) continue;
        fprintf(
            stderr,
            "[%s] tier %zu %s: %llu of %llu blocks; loaded %llu, recomputed %llu (cheaper), "
            "failed %llu (miss/corrupt/mismatch/down; %llu recomputed for it), %llu recomputed "
            "for want of a free pool block, %llu loaded and dropped, probed %llu, written %llu; "
            "store: "
            "%llu hits, %llu misses, %llu corrupt, %llu mismatch, %llu down, %llu "
            "recovered at open; measured %.1f us/block get, %.1f us/block put\n",
            cmd, i + 1, s.spec, (unsigned long long)s.resident, (unsigned long long)s.capacity,
            (unsigned long long)s.loaded_blocks, (unsigned long long)s.recomputed_blocks,
            (unsigned long long)s.failed_blocks, (unsigned long long)s.recomputed_failed_blocks,
            (unsigned long long)s.recomputed_noroom_blocks,
            (unsigned long long)s.recomputed_dropped_blocks, (unsigned long long)s.probed_blocks,
            (unsigned long long)s.demoted_blocks, (unsigned long long)s.store.hits,
            (unsigned long long)s.store.misses, (unsigned long long)s.store.corrupt,
            (unsigned long long)s.store.mismatch, (unsigned long long)s.store.down,
            (unsigned long long)s.store.recovered, s.load_s_per_block * 1e6,
            s.put_s_per_block * 1e6);
    }
}

void cli_tiers_close(cli_tiers *t) {
    for (size_t i = 0; i < t->n; i++) {
        ikv_store_close(t->st[i]);
        t->st[i] = NULL;
    }
}
