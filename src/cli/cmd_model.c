/*
 * isokv model: write a checkpoint with deterministic random weights (and optionally a matching
 * tokenizer), or describe a checkpoint.
 *
 *     isokv model init --config tiny|stories15m|small|base --seed S -o model.bin
 *                      [--tokenizer-out tok.bin] [--classifier tied|separate]
 *     isokv model quantize IN.bin -o OUT.bin [--group 64]
 *     isokv model info model.bin
 *
 * init writes the checkpoint and the tokenizer as one atomic output set (ikv_outset): both
 * appear or neither does, and the two may not name the same file.
 */
#include "cli.h"
#include "isokv/model.h"

#include <stdio.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(
        f,
        "usage: isokv model init --config NAME [--seed S] -o MODEL.bin [--tokenizer-out TOK.bin]\n"
        "                        [--classifier tied|separate] [--seq-len N]\n"
        "       isokv model quantize IN.bin -o OUT.bin [--group G]\n"
        "       isokv model info MODEL.bin\n\n"
        "init  writes a llama2.c-format checkpoint with deterministic random weights (same seed,\n"
        "      same bytes), scaled so activations stay of order one through all layers.\n"
        "      Configs: %s. --tokenizer-out also writes a matching synthetic\n"
        "      tokenizer.bin (llama2.c format) of the model's vocabulary size. --classifier\n"
        "      separate stores its own classifier matrix (negative vocab_size in the header)\n"
        "      instead of tying it to the token embedding (the configs' default). --seq-len N\n"
        "      sets the context (the weights are the same; e.g. a tiny model for long traces).\n"
        "      Both files\n"
        "      are written to temporaries and renamed together: a failure leaves neither, and\n"
        "      a device, directory or the same file named twice is refused.\n"
        "quantize  writes an fp32 checkpoint as llama2.c's int8 version-2 format (what its\n"
        "      export.py --version 2 writes and runq.c runs): per group of G values (64) of each\n"
        "      matrix row, scale = max|w| / 127 and int8 round(w / scale). G must divide dim and\n"
        "      hidden_dim (stories260K: 1, 2 or 4). Such a model runs with int8 weights.\n"
        "info  prints the format, shape, parameter count and KV bytes per token of a checkpoint.\n",
        ikv_model_config_names());
}

static int init(int argc, char **argv) {
    const char *cfgname = NULL, *out = NULL, *tok = NULL, *cls = NULL;
    uint64_t seed = 1, seq_len = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v)
            cfgname = v, i++;
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && v)
            out = v, i++;
        else if (!strcmp(a, "--tokenizer-out") && v)
            tok = v, i++;
        else if (!strcmp(a, "--classifier") && v)
            cls = v, i++;
        else if (!strcmp(a, "--seed") && v) {
            if (cli_parse_u64(v, &seed))
                return cli_usage_error("model", "--seed '%s' is not a number", v);
            i++;
        } else if (!strcmp(a, "--seq-len") && v) {
            if (cli_parse_u64(v, &seq_len) || seq_len < 1 || seq_len > 1u << 20)
                return cli_usage_error("model", "--seq-len '%s' is not a number in 1..1048576", v);
            i++;
        } else if (!strcmp(a, "--config") || !strcmp(a, "-o") || !strcmp(a, "--output") ||
                   !strcmp(a, "--tokenizer-out") || !strcmp(a, "--classifier") ||
                   !strcmp(a, "--seed") || !strcmp(a, "--seq-len"))
            return cli_usage_error("model", "option '%s' needs a value", a);
        else
            return cli_usage_error("model", "unknown option '%s'", a);
    }
    if (!cfgname)
        return cli_usage_error("model", "init needs --config (%s)", ikv_model_config_names());
    if (!out) return cli_usage_error("model", "init needs -o MODEL.bin");
    ikv_model_config c;
    if (ikv_model_config_named(cfgname, &c)) return cli_usage_error("model", "%s", ikv_errdetail());
    if (cls && strcmp(cls, "tied") && strcmp(cls, "separate"))
        return cli_usage_error("model", "--classifier '%s': expected tied or separate", cls);
    if (cls) c.shared_classifier = !strcmp(cls, "tied");
    if (seq_len) c.seq_len = (int32_t)seq_len; /* context only: the weights do not change */
    /* both files in one atomic set: they appear together or not at all, and -o and
     * --tokenizer-out naming the same file (by any path) is refused before anything is written */
    ikv_outset *set = NULL;
    FILE *fm = NULL, *ft = NULL;
    int rc = ikv_outset_create(&set);
    if (!rc) rc = ikv_outset_add(set, out, &fm, NULL);
    if (!rc && tok) rc = ikv_outset_add(set, tok, &ft, NULL);
    if (!rc) rc = ikv_model_write_random_stream(fm, &c, seed);
    if (!rc && tok) rc = ikv_tokenizer_write_synthetic_stream(ft, (uint32_t)c.vocab_size, seed);
    if (!rc) rc = ikv_outset_commit(set);
    ikv_outset_destroy(set);
    if (rc) return cli_fail("model", "%s", ikv_errdetail());
    printf("wrote %s: config %s, seed %llu, %s classifier, %.2fM parameters, %llu bytes\n", out,
           cfgname, (unsigned long long)seed, c.shared_classifier ? "tied" : "separate",
           (double)ikv_model_params(&c) / 1e6, (unsigned long long)ikv_model_file_bytes(&c));
    if (tok) printf("wrote %s: synthetic tokenizer, %d pieces\n", tok, (int)c.vocab_size);
    return IKV_EXIT_OK;
}

static int quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    uint64_t group = 64;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && v)
            out = v, i++;
        else if (!strcmp(a, "--group") && v) {
            if (cli_parse_u64(v, &group) || group == 0 || group > 65536)
                return cli_usage_error("model", "--group '%s': expected a number in 1..65536", v);
            i++;
        } else if (a[0] == '-' && a[1])
            return cli_usage_error("model", "unknown or incomplete option '%s'", a);
        else if (in)
            return cli_usage_error("model", "quantize takes one input checkpoint ('%s', '%s')", in,
                                   a);
        else
            in = a;
    }
    if (!in) return cli_usage_error("model", "quantize needs an input checkpoint IN.bin");
    if (!out) return cli_usage_error("model", "quantize needs -o OUT.bin");
    ikv_model *m;
    if (ikv_model_load(in, &m)) return cli_fail("model", "%s", ikv_errdetail());
    if (ikv_model_write_q8(m, out, (int)group)) {
        ikv_model_destroy(m);
        return cli_fail("model", "quantize %s: %s", in, ikv_errdetail());
    }
    const ikv_model_config *c = ikv_model_cfg(m);
    printf("wrote %s: llama2.c version 2, int8 in groups of %d, %llu bytes (from %s, %llu)\n",
           out, (int)group, (unsigned long long)ikv_model_q8_file_bytes(c, (int)group), in,
           (unsigned long long)ikv_model_file_bytes(c));
    ikv_model_destroy(m);
    return IKV_EXIT_OK;
}

static int info(int argc, char **argv) {
    if (argc != 3) return cli_usage_error("model", "info takes one checkpoint path");
    ikv_model *m;
    if (ikv_model_load(argv[2], &m)) return cli_fail("model", "%s", ikv_errdetail());
    const ikv_model_config *c = ikv_model_cfg(m);
    const int gs = ikv_model_group(m);
    if (gs)
        printf("%s: llama2.c checkpoint, version 2: int8 weights in groups of %d, fp32 norms\n",
               argv[2], gs);
    else
        printf("%s: llama2.c checkpoint, legacy version 0: fp32 weights\n", argv[2]);
    printf("  dim %d, hidden %d, layers %d, heads %d, kv heads %d, head dim %d, vocab %d, seq_len "
           "%d\n",
           (int)c->dim, (int)c->hidden_dim, (int)c->n_layers, (int)c->n_heads, (int)c->n_kv_heads,
           (int)(c->dim / c->n_heads), (int)c->vocab_size, (int)c->seq_len);
    printf("  classifier: %s\n", c->shared_classifier ? "tied to the token embedding" : "separate");
    printf("  parameters: %llu (%.2fM), %llu bytes on disk\n",
           (unsigned long long)ikv_model_params(c), (double)ikv_model_params(c) / 1e6,
           (unsigned long long)(gs ? ikv_model_q8_file_bytes(c, gs) : ikv_model_file_bytes(c)));
    printf("  KV bytes per token: %llu (fp32 K and V, all layers); per 16-token block: %llu\n",
           (unsigned long long)ikv_model_kv_bytes_per_token(c),
           (unsigned long long)ikv_model_kv_bytes_per_token(c) * 16);
    printf("  weight bytes read per decode step: %llu\n",
           (unsigned long long)(gs ? ikv_model_q8_decode_bytes(c, gs)
                                   : ikv_model_decode_bytes(c)));
    ikv_model_destroy(m);
    return IKV_EXIT_OK;
}

int ikv_cmd_model(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return IKV_EXIT_OK;
    }
    if (argc < 2) return cli_usage_error("model", "expected 'init', 'quantize' or 'info'");
    if (!strcmp(argv[1], "init")) return init(argc, argv);
    if (!strcmp(argv[1], "info")) return info(argc, argv);
    if (!strcmp(argv[1], "quantize")) return quantize(argc, argv);
    return cli_usage_error("model", "unknown action '%s' (init, quantize, info)", argv[1]);
}
