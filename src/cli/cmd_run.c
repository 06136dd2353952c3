/*
 * isokv run: generate text from a checkpoint with the paged-KV engine, through the prefix
 * cache, and report measured speeds.
 *
 *     isokv run [--model m.bin] [--tokenizer t.bin] [--prompt TEXT] [-n 64] [--temp 0] [--topp 0.9]
 *               [--seed S] [--threads T] [--kv-mem BYTES] [--policy lru] [--tenant NAME]
 *               [--public N] [--repeat R] [--stop-eos] [--raw-bytes] [--tier SPEC]...
 *
 * --repeat R sends the same request R times through one engine, so runs after the first show
 * the cache at work (cached tokens, warm TTFT). Text goes to stdout; figures to stderr.
 *
 * The text is what llama2.c's run.c prints for the same tokens: the prompt's pieces, then the
 * generated ones; generation stops at BOS (run.c's only stop; --stop-eos also stops at EOS) or
 * when the sequence reaches seq_len; a byte-fallback token is written only when its byte is
 * printable ASCII or whitespace (run.c's rule, which keeps control bytes off the terminal;
 * --raw-bytes writes every byte, e.g. UTF-8 spelled in byte tokens). -n counts generated
 * tokens, where run.c's -n counts positions from BOS: run.c -n S is -n S - (prompt tokens - 1).
 *
 * Without --model, the bundled trained model data/models/stories260K/stories260K.bin and its
 * tokenizer tok512.bin are used (data/ found through IKV_DATA_DIR in the environment, else the
 * source tree's data/ compiled in as IKV_DATA_DIR). The prompt may be empty (the default): the
 * sequence is then BOS alone, as in run.c.
 */
#include "cli.h"
#include "isokv/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef IKV_DATA_DIR
#define IKV_DATA_DIR "data"
#endif
#define DEFAULT_MODEL "models/stories260K/stories260K.bin"
#define DEFAULT_TOK   "models/stories260K/tok512.bin"

/* The data directory: $IKV_DATA_DIR when set and non-empty, else the compiled-in one. */
static const char *data_dir(void) {
    const char *e = getenv("IKV_DATA_DIR");
    return e && *e ? e : IKV_DATA_DIR;
}

static void help(FILE *f) {
    fprintf(
        f,
        "usage: isokv run [--model M.bin] [--tokenizer T.bin] [--prompt TEXT] [-n 64] [--temp 0]\n"
        "                 [--topp 0.9] [--seed S] [--threads T] [--kv-mem BYTES]\n"
        "                 [--policy NAME] [--tenant NAME] [--public N] [--repeat R]\n"
        "                 [--stop-eos] [--raw-bytes] [--tier SPEC]... [--tier-dtype q8]\n\n"
        "Encodes the prompt (BOS first; byte-level when --model is given without a tokenizer),\n"
        "prefills it through the prefix cache, then decodes up to -n tokens (stopping at BOS,\n"
        "also at EOS with --stop-eos, or at seq_len) and prints the text as llama2.c's run.c\n"
        "does: byte tokens only when printable ASCII or whitespace (--raw-bytes: every byte).\n"
        "The prompt may be empty (the default): generation then starts from BOS alone.\n"
        "Without --model: the bundled trained stories260K model and its tok512 tokenizer,\n"
        "  %s/%s\n"
        "  (IKV_DATA_DIR=DIR in the environment replaces %s).\n"
        "-n counts GENERATED tokens. llama2.c's run.c -n S counts positions from BOS instead:\n"
        "run.c -n S is isokv -n S-P+1 for a prompt of P tokens, BOS included (the token count\n"
        "is printed on stderr); e.g. run.c's default 256 with an empty prompt is -n 256.\n"
        "Temperature 0 is greedy.\n"
        "--public N declares the first N prompt tokens shared across tenants; the rest is\n"
        "scoped to --tenant. --repeat R runs the request R times on one engine (the later runs\n"
        "hit the cache). --kv-mem sizes the KV pool (k/M/G suffixes; default: 5 full-length\n"
        "sequences). Figures printed on stderr are measured wall-clock times.\n",
        data_dir(), DEFAULT_MODEL, data_dir());
    fputs(cli_tiers_help, f);
}

/* Writes the text of `token` after `prev` to stdout. Unless raw, a byte-fallback token (ids
 * 3..258, which a loaded tokenizer guarantees are the pieces <0x00>..<0xFF>) whose byte is
 * neither printable ASCII nor whitespace is skipped, as run.c does. */
static void put_token(const ikv_tokenizer *tok, uint32_t prev, uint32_t token, int raw) {
    size_t len;
    const char *p = ikv_tokenizer_decode(tok, prev, token, &len);
    if (!raw && token >= IKV_TOK_BYTE0 && token < IKV_TOK_BYTE0 + 256 && len == 1) {
        unsigned char b = (unsigned char)p[0];
        int printable = b >= 0x20 && b <= 0x7e, space = b == ' ' || (b >= '\t' && b <= '\r');
        if (!printable && !space) return;
    }
    fwrite(p, 1, len, stdout);
}

int ikv_cmd_run(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return IKV_EXIT_OK;
    }
    const char *model = NULL, *tokp = NULL, *text = NULL, *tenant = NULL;
    uint64_t steps = 64, seed = 1, threads = 1, kvmem = 0, pub = 0, repeat = 1;
    double temp = 0.0, topp = 0.9;
    ikv_engine_options eo;
    ikv_engine_options_default(&eo);
    int stop_eos = 0, raw = 0;
    cli_tiers tiers = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--stop-eos") || !strcmp(a, "--raw-bytes")) {
            *(a[2] == 's' ? &stop_eos : &raw) = 1;
            continue;
        }
        static const char *const valued[] = {
            "--model",   "--tokenizer", "--prompt", "--tenant", "--policy", "-n",    "--seed",
            "--threads", "--kv-mem",    "--public", "--repeat", "--temp",   "--topp",
            "--tier",    "--tier-dtype"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("run", "unknown option '%s'", a);
        if (!v) return cli_usage_error("run", "option '%s' needs a value", a);
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--tokenizer"))
            tokp = v;
        else if (!strcmp(a, "--prompt"))
            text = v;
        else if (!strcmp(a, "--tenant"))
            tenant = v;
        else if (!strcmp(a, "--policy"))
            eo.policy = v;
        else if (!strcmp(a, "--tier")) {
            if (cli_tiers_add(&tiers, "run", v)) return IKV_EXIT_USAGE;
        } else if (!strcmp(a, "--tier-dtype")) {
            if (cli_tiers_dtype(&tiers, "run", v)) return IKV_EXIT_USAGE;
        } else if (!strcmp(a, "-n"))
            bad = cli_parse_u64(v, &steps);
        else if (!strcmp(a, "--seed"))
            bad = cli_parse_u64(v, &seed);
        else if (!strcmp(a, "--threads"))
            bad = cli_parse_u64(v, &threads) || threads == 0 || threads > 256;
        else if (!strcmp(a, "--kv-mem"))
            bad = cli_parse_count(v, &kvmem);
        else if (!strcmp(a, "--public"))
            bad = cli_parse_u64(v, &pub);
        else if (!strcmp(a, "--repeat"))
            bad = cli_parse_u64(v, &repeat) || repeat == 0 || repeat > 1000;
        else if (!strcmp(a, "--temp"))
            bad = cli_parse_double(v, &temp) || temp < 0;
        else if (!strcmp(a, "--topp"))
            bad = cli_parse_double(v, &topp) || topp < 0 || topp > 1;
        else
            return cli_usage_error("run", "unknown option '%s'", a);
        if (bad) return cli_usage_error("run", "bad value '%s' for %s", v, a);
        i++;
    }
    static char dmodel[4096], dtok[4096];
    if (!text) text = "";
    if (!model) {
        /* the bundled model, with its tokenizer unless one was given */
        snprintf(dmodel, sizeof dmodel, "%s/%s", data_dir(), DEFAULT_MODEL);
        snprintf(dtok, sizeof dtok, "%s/%s", data_dir(), DEFAULT_TOK);
        model = dmodel;
        if (!tokp) tokp = dtok;
        const char *miss = access(dmodel, R_OK)                        ? dmodel
                           : !strcmp(tokp, dtok) && access(dtok, R_OK) ? dtok
                                                                       : NULL;
        if (miss)
            return cli_fail("run",
                            "no --model given and the bundled model file %s cannot be read: %s "
                            "(set IKV_DATA_DIR to the directory holding models/stories260K/, "
                            "or pass --model)",
                            miss, strerror(errno));
    }
    eo.threads = (int)threads;
    eo.kv_mem = kvmem;

    int rc = IKV_EXIT_FAIL;
    ikv_model *m = NULL;
    ikv_tokenizer *tok = NULL;
    ikv_engine *e = NULL;
    ikv_sampler *smp = NULL;
    uint32_t *ids = NULL;
    if (ikv_model_load(model, &m)) {
        cli_fail("run", "%s", ikv_errdetail());
        goto out;
    }
    const ikv_model_config *c = ikv_model_cfg(m);
    if ((tokp ? ikv_tokenizer_load(tokp, (uint32_t)c->vocab_size, &tok)
              : ikv_tokenizer_bytes((uint32_t)c->vocab_size, &tok))) {
        cli_fail("run", "%s", ikv_errdetail());
        goto out;
    }
    size_t cap = strlen(text) + 3, n;
    ids = malloc(sizeof *ids * cap);
    if (!ids || ikv_tokenizer_encode(tok, text, 1, 0, ids, cap, &n)) {
        cli_fail("run", "cannot encode the prompt: %s", ikv_errdetail());
        goto out;
    }
    if (n > (size_t)c->seq_len) {
        cli_fail("run", "the prompt is %zu tokens, longer than the model's seq_len %d", n,
                 (int)c->seq_len);
        goto out;
    }
    if ((rc = cli_tiers_open(&tiers, "run", m, tokp, &eo))) goto out;
    rc = IKV_EXIT_FAIL;
    int erc = ikv_engine_create(m, &eo, &e);
    if (erc) {
        /* an unknown policy or policy parameter is a usage error; the rest (memory) a failure */
        if (erc == IKV_EPOLICY || erc == IKV_EPARAM)
            rc = cli_usage_error("run", "--policy: %s", ikv_errdetail_for(erc));
        else
            cli_fail("run", "%s", ikv_errdetail_for(erc));
        goto out;
    }
    for (uint64_t r = 0; r < repeat; r++) {
        ikv_sampler_destroy(smp);
        smp = NULL;
        if (ikv_sampler_create((uint32_t)c->vocab_size, (float)temp, (float)topp, seed, &smp)) {
            cli_fail("run", "%s", ikv_errdetail());
            goto out;
        }
        ikv_request rq = {.tokens = ids, .n = n, .tenant = tenant, .public_tokens = (size_t)pub};
        ikv_seq *s;
        ikv_prefill_info info;
        if (ikv_engine_begin(e, &rq, &s, &info)) {
            cli_fail("run", "%s", ikv_errdetail());
            goto out;
        }
        float *lg = (float *)ikv_seq_logits(s);
        for (size_t i = 1; i < n; i++)
            put_token(tok, ids[i - 1], ids[i], raw);
        uint32_t prev = ids[n - 1];
        size_t gen = 0;
        double t0 = ikv_now();
        while (gen < steps) {
            uint32_t next = ikv_sampler_sample(smp, lg);
            if (next == IKV_TOK_BOS || (stop_eos && next == IKV_TOK_EOS)) break;
            put_token(tok, prev, next, raw);
            fflush(stdout);
            prev = next;
            gen++;
            if (ikv_seq_len(s) >= (size_t)c->seq_len) break;
            const float *l2;
            if (ikv_engine_decode(e, s, next, &l2)) {
                cli_fail("run", "%s", ikv_errdetail());
                ikv_engine_end(e, s);
                goto out;
            }
            lg = (float *)l2;
        }
        double dt = ikv_now() - t0;
        printf("\n");
        fflush(stdout); /* the text, then the figures on stderr */
        ikv_engine_end(e, s);
        fprintf(stderr,
                "[run %llu] measured on %llu thread(s): prompt %zu tokens (%zu from the "
                "cache, %zu computed), "
                "TTFT %.2f ms, prefill %.0f tok/s; decode %zu tokens at %.1f tok/s\n",
                (unsigned long long)r + 1, (unsigned long long)threads, n, info.cached_tokens,
                info.computed_tokens, info.seconds * 1e3,
                info.seconds > 0 ? (double)info.computed_tokens / info.seconds : 0.0, gen,
                gen > 1 && dt > 0 ? (double)(gen - 1) / dt : 0.0);
        if (tiers.n) {
            fprintf(stderr, "[run %llu] cached tokens by tier: pool %zu", (unsigned long long)r + 1,
                    info.tier_tokens[0]);
            for (size_t t = 1; t <= tiers.n; t++)
                fprintf(stderr, ", %s %zu", tiers.specs[t - 1], info.tier_tokens[t]);
            fprintf(stderr, "; %zu tier tokens recomputed (cheaper or failed)",
                    info.recomputed_tier_tokens);
            if (info.lossy_tokens)
                fprintf(stderr, "; %zu cached tokens LOSSY (q8 tier)", info.lossy_tokens);
            fprintf(stderr, "\n");
        }
    }
    cli_tiers_report(&tiers, e, "run");
    rc = IKV_EXIT_OK;
out:
    free(ids);
    ikv_sampler_destroy(smp);
    ikv_engine_destroy(e);
    cli_tiers_close(&tiers);
    ikv_tokenizer_destroy(tok);
    ikv_model_destroy(m);
    return rc;
}
