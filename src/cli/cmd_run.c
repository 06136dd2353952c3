/*
 * isokv run: generate text from a checkpoint with the paged-KV engine, through the prefix
 * cache, and report measured speeds.
 *
 *     isokv run [--model m.bin] [--tokenizer t.bin] [--prompt TEXT] [-n 64] [--temp 0] [--topp 0.9]
 *               [--seed S] [--threads T] [--kv-mem BYTES] [--policy lru] [--tenant NAME]
 *               [--public N] [--repeat R] [--stop-eos] [--raw-bytes] [--tier SPEC]...
 *               [--spec lookup[:n=3,k=1,m=2]] [--semantic-cache[=SIZE]] [--prompts FILE]
 *               [--max-draft N]
 *
 * --spec lookup decodes with prompt-lookup drafts verified by ikv_engine_verify (greedy output
 * identical to plain decoding). --semantic-cache keeps finished responses in a response cache
 * (respcache.h) and verifies the most similar one as a draft for each later request (with
 * --repeat, or --prompts FILE: one prompt per line, every line a request).
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
#include "cli_segments.h"
#include "isokv/model.h"
#include "isokv/respcache.h"

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
        "                 [--stop-eos] [--raw-bytes] [--tier SPEC]... [--tier-dtype q8]\n"
        "                 [--spec lookup[:n=3,k=1,m=2]] [--semantic-cache[=SIZE]]\n"
        "                 [--prompts FILE] [--max-draft N]\n"
        "                 [--segments REQ.json [--layout as-given|shared-first]\n"
        "                  [--blend-ratio R] [--blend-max-dev D] [--chunk-mem BYTES]]\n\n"
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
        "sequences). Figures printed on stderr are measured wall-clock times.\n"
        "--spec lookup[:n=N,k=K,m=M] drafts K tokens from the latest match of the last N (..M)\n"
        "tokens in prompt + output and verifies them in one batched forward (greedy output is\n"
        "identical to plain decoding; defaults n=3, k=1, m=2). --semantic-cache[=SIZE] keeps\n"
        "SIZE finished responses (digits: entries, 1024; k/M/G: bytes, 64M) and verifies the\n"
        "most similar one (MinHash/Jaccard over prompt 3-grams, same tenant or public) as a\n"
        "draft: only what the model itself would produce is served. Give it something to hit:\n"
        "--repeat R or --prompts FILE (one prompt per line, each a request). --max-draft N:\n"
        "draft tokens per verify (64; 256 with --semantic-cache).\n"
        "--segments REQ.json: structured requests (one object or an array, run in order on one\n"
        "engine; docs/chunks.md): segments with kind, text or tokens, public, reusable, movable.\n"
        "Reusable segments' KV is kept by content and reused at any offset, recomputing a\n"
        "fraction R of their tokens (--blend-ratio, default %.2f; 1 = exact prefill) and any\n"
        "whose deviation exceeds D (--blend-max-dev, default %.2f; 0 = off). --layout\n"
        "shared-first moves movable public/reusable segments before movable personal ones.\n"
        "--chunk-mem sizes the chunk store (default 64M).\n",
        data_dir(), DEFAULT_MODEL, data_dir(), (double)IKV_BLEND_RATIO, (double)IKV_BLEND_MAX_DEV);
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

typedef struct emit_ctx {
    const ikv_tokenizer *tok;
    uint32_t prev;
    int raw;
} emit_ctx;

/* Writes a burst of generated tokens (an accepted draft comes as one). */
static void emit(void *vc, const uint32_t *t, size_t n) {
    emit_ctx *c = vc;
    for (size_t i = 0; i < n; i++) {
        put_token(c->tok, c->prev, t[i], c->raw);
        c->prev = t[i];
    }
    fflush(stdout);
}

/* Parses "lookup[:n=N,k=K,m=M]" (cli.h; isokv run and serve). Returns 0 or -1. */
int cli_parse_spec(const char *v, uint64_t *ng, uint64_t *k, uint64_t *mn) {
    if (strncmp(v, "lookup", 6) || (v[6] && v[6] != ':')) return -1;
    const char *p = v[6] ? v + 7 : v + 6;
    while (*p) {
        char key = *p;
        if ((key != 'n' && key != 'k' && key != 'm') || p[1] != '=') return -1;
        char buf[32];
        size_t L = strcspn(p + 2, ",");
        if (L == 0 || L >= sizeof buf) return -1;
        memcpy(buf, p + 2, L), buf[L] = 0;
        uint64_t x;
        if (cli_parse_u64(buf, &x) || x == 0 || x > 256) return -1;
        *(key == 'n' ? ng : key == 'k' ? k : mn) = x;
        p += 2 + L;
        if (*p == ',') p++;
    }
    return 0;
}

typedef struct run_seg_opts {
    const char *path, *tenant;
    int shared_first, stop_eos, raw;
    float ratio, max_dev;
    uint64_t mem, steps, repeat, seed, threads;
    double temp, topp;
} run_seg_opts;

/* --segments: each request of the file (repeat times) through the chunk store; the text on
 * stdout, per request the reuse figures on stderr. Returns an exit code. */
static int run_segments(const run_seg_opts *o, const ikv_model *m, const ikv_tokenizer *tok,
                        ikv_engine *e) {
    const ikv_model_config *c = ikv_model_cfg(m);
    cli_segfile sf;
    char err[512];
    if (cli_segfile_load(o->path, tok, (uint32_t)c->vocab_size, &sf, err, sizeof err))
        return cli_fail("run", "%s", err);
    int rc = IKV_EXIT_FAIL;
    ikv_chunks *ch = NULL;
    ikv_sampler *smp = NULL;
    ikv_prompt_seg lay[256];
    ikv_chunks_options co;
    ikv_chunks_options_default(&co);
    co.mem = o->mem, co.ratio = o->ratio, co.max_dev = o->max_dev;
    if (ikv_chunks_create(e, &co, &ch)) {
        cli_fail("run", "%s", ikv_errdetail());
        goto out;
    }
    for (uint64_t rep = 0; rep < o->repeat; rep++)
        for (size_t q = 0; q < sf.n_req; q++) {
            const cli_segreq *sr = &sf.req[q];
            size_t moved = 0;
            const ikv_prompt_seg *segs = sr->segs;
            if (o->shared_first) {
                moved = ikv_psegs_shared_first(sr->segs, sr->n_segs, lay);
                segs = lay;
            }
            ikv_blend_request br = {.segs = segs, .n_segs = sr->n_segs,
                                    .tenant = sr->tenant ? sr->tenant : o->tenant,
                                    .ratio = sr->ratio, .max_dev = -1, .max_new = o->steps};
            ikv_seq *s;
            ikv_blend_info bi;
            if (ikv_chunks_begin(ch, &br, &s, &bi)) {
                cli_fail("run", "%s: request %zu: %s", o->path, q, ikv_errdetail());
                goto out;
            }
            ikv_sampler_destroy(smp);
            smp = NULL;
            if (ikv_sampler_create((uint32_t)c->vocab_size, (float)o->temp, (float)o->topp, o->seed,
                                   &smp)) {
                cli_fail("run", "%s", ikv_errdetail());
                ikv_engine_end(e, s);
                goto out;
            }
            float *lg = (float *)ikv_seq_logits(s);
            uint32_t prev = segs[sr->n_segs - 1].tokens[segs[sr->n_segs - 1].n - 1];
            size_t gen = 0;
            while (gen < o->steps) {
                uint32_t next = ikv_sampler_sample(smp, lg);
                if (next == IKV_TOK_BOS || (o->stop_eos && next == IKV_TOK_EOS)) break;
                put_token(tok, prev, next, o->raw);
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
            printf("\n");
            fflush(stdout);
            ikv_engine_end(e, s);
            fprintf(stderr,
                    "[run %llu request %zu] measured on %llu thread(s): prompt %zu tokens, "
                    "%zu segments (%zu moved by the layout); reusable %zu tokens: %zu reused, "
                    "%zu recomputed (%zu hit, %zu missed, %zu stored); deviation max %.4f mean "
                    "%.4f; guard +%zu; %s; TTFT %.2f ms\n",
                    (unsigned long long)rep + 1, q, (unsigned long long)o->threads,
                    bi.prompt_tokens, sr->n_segs, moved, bi.reusable_tokens, bi.reused_tokens,
                    bi.recomputed_tokens, bi.hit_segments, bi.miss_segments, bi.stored_segments,
                    bi.deviation_max, bi.deviation_mean, bi.guard_tokens,
                    bi.full ? "exact prefill" : "blended", bi.seconds * 1e3);
        }
    rc = IKV_EXIT_OK;
out:
    ikv_sampler_destroy(smp);
    ikv_chunks_destroy(ch);
    cli_segfile_free(&sf);
    return rc;
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
    const char *segpath = NULL;
    int shared_first = 0;
    double bratio = IKV_BLEND_RATIO, bmaxdev = IKV_BLEND_MAX_DEV;
    uint64_t chunkmem = 64ull << 20;
    uint64_t spec_n = 0, spec_k = 1, spec_m = 2, semcache = 0, semcache_bytes = 0, max_draft = 0;
    const char *prompts_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strncmp(a, "--semantic-cache", 16) && (a[16] == 0 || a[16] == '=')) {
            semcache = 1024;
            if (a[16] == '=' && cli_parse_semcache(a + 17, &semcache, &semcache_bytes))
                return cli_usage_error("run",
                                       "bad value '%s' for --semantic-cache (entries "
                                       "1..1000000, or bytes with k/M/G: 64M)",
                                       a + 17);
            continue;
        }
        if (!strcmp(a, "--stop-eos") || !strcmp(a, "--raw-bytes")) {
            *(a[2] == 's' ? &stop_eos : &raw) = 1;
            continue;
        }
        static const char *const valued[] = {
            "--model", "--tokenizer", "--prompt",     "--tenant", "--policy",  "-n",
            "--seed",  "--threads",   "--kv-mem",     "--public", "--repeat",  "--temp",
            "--topp",  "--tier",      "--tier-dtype", "--spec",   "--prompts", "--max-draft",
            "--segments", "--layout", "--blend-ratio", "--blend-max-dev", "--chunk-mem"};
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
        else if (!strcmp(a, "--segments"))
            segpath = v;
        else if (!strcmp(a, "--layout")) {
            if (strcmp(v, "as-given") && strcmp(v, "shared-first"))
                return cli_usage_error("run", "--layout: '%s' is not as-given or shared-first", v);
            shared_first = !strcmp(v, "shared-first");
        } else if (!strcmp(a, "--blend-ratio"))
            bad = cli_parse_double(v, &bratio) || !(bratio >= 0 && bratio <= 1);
        else if (!strcmp(a, "--blend-max-dev"))
            bad = cli_parse_double(v, &bmaxdev) || !(bmaxdev >= 0);
        else if (!strcmp(a, "--chunk-mem"))
            bad = cli_parse_count(v, &chunkmem) || chunkmem == 0;
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
        else if (!strcmp(a, "--spec")) {
            spec_n = 3;
            bad = cli_parse_spec(v, &spec_n, &spec_k, &spec_m) || spec_m > spec_n;
        } else if (!strcmp(a, "--prompts"))
            prompts_path = v;
        else if (!strcmp(a, "--max-draft"))
            bad = cli_parse_u64(v, &max_draft) || max_draft == 0 || max_draft > 4096;
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
    if (segpath && (text || prompts_path || spec_n || semcache))
        return cli_usage_error("run", "--segments excludes --prompt, --prompts, --spec and "
                                      "--semantic-cache");
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
    eo.max_draft = (uint32_t)(max_draft ? max_draft : semcache ? 256 : 64);

    int rc = IKV_EXIT_FAIL;
    ikv_model *m = NULL;
    ikv_tokenizer *tok = NULL;
    ikv_engine *e = NULL;
    ikv_sampler *smp = NULL;
    ikv_respcache *rcache = NULL;
    uint32_t *ids = NULL, *hist = NULL;
    char *ptext = NULL;
    size_t nprompts = 1;
    char **plines = NULL;
    if (prompts_path) { /* one prompt per line */
        FILE *f = fopen(prompts_path, "rb");
        if (!f) {
            cli_fail("run", "cannot open --prompts file %s: %s", prompts_path, strerror(errno));
            goto out;
        }
        size_t cap = 0, len = 0;
        int ch;
        while ((ch = fgetc(f)) != EOF) {
            if (len + 2 > cap) {
                char *t = realloc(ptext, cap = cap ? cap * 2 : 4096);
                if (!t) {
                    fclose(f);
                    cli_fail("run", "out of memory reading %s", prompts_path);
                    goto out;
                }
                ptext = t;
            }
            ptext[len++] = (char)ch;
        }
        int err = ferror(f);
        fclose(f);
        if (err || len == 0) {
            cli_fail("run", "--prompts file %s: %s", prompts_path, err ? "read error" : "empty");
            goto out;
        }
        ptext[len] = 0;
        nprompts = 0;
        for (size_t j = 0; j < len; j++)
            nprompts += ptext[j] == '\n';
        nprompts += ptext[len - 1] != '\n';
        plines = calloc(nprompts, sizeof *plines);
        if (!plines) {
            cli_fail("run", "out of memory");
            goto out;
        }
        size_t k = 0;
        for (char *q = ptext; k < nprompts; k++) {
            plines[k] = q;
            char *nl = strchr(q, '\n');
            if (!nl) break;
            *nl = 0;
            if (nl > q && nl[-1] == '\r') nl[-1] = 0;
            q = nl + 1;
        }
    }
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
    if (segpath) {
        run_seg_opts so = {.path = segpath, .tenant = tenant, .shared_first = shared_first,
                           .ratio = (float)bratio, .max_dev = (float)bmaxdev, .mem = chunkmem,
                           .steps = steps, .repeat = repeat, .temp = temp, .topp = topp,
                           .seed = seed, .stop_eos = stop_eos, .raw = raw, .threads = threads};
        rc = run_segments(&so, m, tok, e);
        goto out;
    }
    if (semcache) {
        ikv_respcache_options ro;
        ikv_respcache_options_default(&ro);
        ro.capacity = (uint32_t)semcache;
        ro.max_bytes = semcache_bytes;
        ro.max_tokens = (uint32_t)c->seq_len;
        if (ikv_respcache_create(&ro, &rcache)) {
            cli_fail("run", "%s", ikv_errdetail());
            goto out;
        }
    }
    size_t maxlen = prompts_path ? 0 : strlen(text);
    for (size_t j = 0; j < nprompts && prompts_path; j++)
        if (strlen(plines[j]) > maxlen) maxlen = strlen(plines[j]);
    size_t cap = maxlen + 3, n;
    ids = malloc(sizeof *ids * cap);
    hist = malloc(sizeof *hist * ((size_t)c->seq_len + steps + 2));
    if (!ids || !hist) {
        cli_fail("run", "out of memory");
        goto out;
    }
    uint64_t tot_req = 0, tot_hits = 0, tot_acc = 0, tot_gen = 0, tot_fwd = 0, tot_lk = 0,
             tot_lka = 0;
    double tot_dec_s = 0;
    for (uint64_t r = 0; r < repeat; r++)
        for (size_t pi = 0; pi < nprompts; pi++) {
            const char *ptxt = prompts_path ? plines[pi] : text;
            if (ikv_tokenizer_encode(tok, ptxt, 1, 0, ids, cap, &n)) {
                cli_fail("run", "cannot encode prompt %zu: %s", pi + 1, ikv_errdetail());
                goto out;
            }
            if (n > (size_t)c->seq_len) {
                cli_fail("run", "prompt %zu is %zu tokens, longer than the model's seq_len %d",
                         pi + 1, n, (int)c->seq_len);
                goto out;
            }
            ikv_sampler_destroy(smp);
            smp = NULL;
            if (ikv_sampler_create((uint32_t)c->vocab_size, (float)temp, (float)topp, seed, &smp)) {
                cli_fail("run", "%s", ikv_errdetail());
                goto out;
            }
            ikv_request rq = {
                .tokens = ids, .n = n, .tenant = tenant, .public_tokens = (size_t)pub};
            ikv_seq *s;
            ikv_prefill_info info;
            if (ikv_engine_begin(e, &rq, &s, &info)) {
                cli_fail("run", "%s", ikv_errdetail());
                goto out;
            }
            for (size_t i = 1; i < n; i++)
                put_token(tok, ids[i - 1], ids[i], raw);
            ikv_respcache_hit hits[3];
            size_t nh = rcache ? ikv_respcache_lookup(rcache, tenant, ids, n, hits, 3) : 0;
            emit_ctx ec = {.tok = tok, .prev = ids[n - 1], .raw = raw};
            ikv_gen_options go = {.max_tokens = steps,
                                  .stop_eos = stop_eos,
                                  .cands = hits,
                                  .n_cands = nh,
                                  .lookup_ngram = (uint32_t)spec_n,
                                  .lookup_k = (uint32_t)spec_k,
                                  .lookup_min = (uint32_t)spec_m,
                                  .max_draft = eo.max_draft,
                                  .emit = emit,
                                  .emit_ctx = &ec};
            memcpy(hist, ids, sizeof *ids * n);
            ikv_gen_result gr;
            if (ikv_respcache_generate(e, s, smp, &go, hist, n, &gr)) {
                cli_fail("run", "%s", ikv_errdetail());
                ikv_engine_end(e, s);
                goto out;
            }
            printf("\n");
            fflush(stdout); /* the text, then the figures on stderr */
            ikv_engine_end(e, s);
            if (gr.cand_used >= 0)
                ikv_respcache_used(rcache, hits[gr.cand_used].id, gr.cache_accepted);
            if (rcache && gr.n_out) {
                ikv_respcache_params pa = {
                    .temperature = (float)temp, .top_p = (float)topp, .seed = seed};
                if (ikv_respcache_put(rcache, tenant, pub >= n, ids, n, hist + n, gr.n_out, &pa)) {
                    cli_fail("run", "%s", ikv_errdetail());
                    goto out;
                }
            }
            tot_req++, tot_gen += gr.n_out, tot_fwd += gr.forwards, tot_dec_s += gr.seconds;
            tot_hits += gr.cache_accepted > 0, tot_acc += gr.cache_accepted;
            tot_lk += gr.lookup_drafted, tot_lka += gr.lookup_accepted;
            fprintf(stderr,
                    "[run %llu] measured on %llu thread(s): prompt %zu tokens (%zu from the "
                    "cache, %zu computed), "
                    "TTFT %.2f ms, prefill %.0f tok/s; decode %zu tokens in %zu forward passes, "
                    "%.3f ms (%.1f tok/s)",
                    (unsigned long long)tot_req, (unsigned long long)threads, n, info.cached_tokens,
                    info.computed_tokens, info.seconds * 1e3,
                    info.seconds > 0 ? (double)info.computed_tokens / info.seconds : 0.0, gr.n_out,
                    gr.forwards, gr.seconds * 1e3,
                    gr.n_out > 1 && gr.seconds > 0 ? (double)(gr.n_out - 1) / gr.seconds : 0.0);
            if (spec_n)
                fprintf(stderr, "; lookup drafts %zu, accepted %zu", gr.lookup_drafted,
                        gr.lookup_accepted);
            if (rcache)
                fprintf(stderr,
                        "; semantic cache: %zu candidate(s), %s, %zu draft tokens "
                        "accepted, %zu rejected",
                        nh, gr.cand_verified ? "verified" : "none verified", gr.cache_accepted,
                        gr.cache_rejected);
            fprintf(stderr, "\n");
            if (tiers.n) {
                fprintf(stderr, "[run %llu] cached tokens by tier: pool %zu",
                        (unsigned long long)tot_req, info.tier_tokens[0]);
                for (size_t t = 1; t <= tiers.n; t++)
                    fprintf(stderr, ", %s %zu", tiers.specs[t - 1], info.tier_tokens[t]);
                size_t why[4] = {0};
                for (size_t t = 1; t <= tiers.n; t++)
                    why[0] += info.tier_cheaper_tokens[t], why[1] += info.tier_failed_tokens[t],
                        why[2] += info.tier_noroom_tokens[t], why[3] += info.tier_dropped_tokens[t];
                fprintf(stderr,
                        "; %zu tier tokens recomputed (cheaper %zu, failed %zu, no room %zu, "
                        "dropped %zu)",
                        info.recomputed_tier_tokens, why[0], why[1], why[2], why[3]);
                if (info.lossy_tokens)
                    fprintf(stderr, "; %zu cached tokens LOSSY (q8 tier)", info.lossy_tokens);
                fprintf(stderr, "\n");
            }
        }
    cli_tiers_report(&tiers, e, "run");
    if (tot_req > 1)
        fprintf(stderr,
                "[total] %llu requests, %llu tokens in %llu forward passes (%.1f ms of decode); "
                "semantic-cache hits %llu (%llu tokens accepted); lookup drafts %llu, accepted "
                "%llu\n",
                (unsigned long long)tot_req, (unsigned long long)tot_gen,
                (unsigned long long)tot_fwd, tot_dec_s * 1e3, (unsigned long long)tot_hits,
                (unsigned long long)tot_acc, (unsigned long long)tot_lk,
                (unsigned long long)tot_lka);
    rc = IKV_EXIT_OK;
out:
    free(ids);
    free(hist);
    free(plines);
    free(ptext);
    ikv_respcache_destroy(rcache);
    ikv_sampler_destroy(smp);
    ikv_engine_destroy(e);
    cli_tiers_close(&tiers);
    ikv_tokenizer_destroy(tok);
    ikv_model_destroy(m);
    return rc;
}
