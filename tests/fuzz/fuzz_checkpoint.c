/*
 * Fuzz harness: a llama2.c checkpoint through ikv_model_load, then, when it loads, a short
 * engine run on it (docs/fuzzing.md): an engine with the default pool, a prompt of up to 6
 * tokens prefilled through the cache twice (the second time from the cache), and 3 greedy decode
 * steps. Bounded by the input: every size in the header must be backed by the file's bytes, so a
 * 16 KB input cannot describe a large model (fitted inputs, below, are at most 64 KB).
 */
#include "fuzz_util.h"

#include "isokv/model.h"

#include <cblas.h>

static void run_engine(const ikv_model *m) {
    const ikv_model_config *c = ikv_model_cfg(m);
    ikv_engine_options eo;
    ikv_engine_options_default(&eo);
    eo.threads = 0;
    ikv_engine *e;
    if (ikv_engine_create(m, &eo, &e)) return;
    uint32_t toks[6];
    size_t n = c->seq_len < 6 ? (size_t)c->seq_len : 6;
    for (size_t i = 0; i < n; i++)
        toks[i] = (uint32_t)((i * 7 + 1) % (uint32_t)c->vocab_size);
    for (int pass = 0; pass < 2; pass++) {
        ikv_request rq = {.tokens = toks, .n = n, .tenant = "fuzz", .public_tokens = 0};
        ikv_seq *s;
        ikv_prefill_info info;
        if (ikv_engine_begin(e, &rq, &s, &info)) break;
        const float *lg = ikv_seq_logits(s);
        for (int d = 0; d < 3 && ikv_seq_len(s) < (size_t)c->seq_len; d++) {
            uint32_t next = 0;
            for (uint32_t i = 1; i < (uint32_t)c->vocab_size; i++)
                if (lg[i] > lg[next]) next = i;
            if (ikv_engine_decode(e, s, next, &lg)) break;
        }
        ikv_engine_end(e, s);
    }
    ikv_engine_destroy(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int once;
    if (!once) {
        openblas_set_num_threads(1);
        once = 1;
    }
    /* Most mutations change the length, and a checkpoint must be exactly as long as its header
     * says: so every other input is fitted to its header's size (cut, or padded with a
     * pattern) when that size is at most 64 KB, and the engine runs on mutated shapes too.
     * The rest go in as they are, for the header and size checks. */
    static uint8_t fitted[65536];
    const uint8_t *in = data;
    size_t n = size;
    if (size >= 28 && (fuzz_pick(data, size, 2) == 0)) {
        int32_t h[7];
        memcpy(h, data, sizeof h);
        ikv_model_config c = {.dim = h[0],
                              .hidden_dim = h[1],
                              .n_layers = h[2],
                              .n_heads = h[3],
                              .n_kv_heads = h[4],
                              .seq_len = h[6],
                              .shared_classifier = h[5] > 0};
        c.vocab_size = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]);
        if (ikv_model_config_check(&c) == 0 && ikv_model_file_bytes(&c) <= sizeof fitted) {
            n = (size_t)ikv_model_file_bytes(&c);
            size_t k = size < n ? size : n;
            memcpy(fitted, data, k);
            for (size_t i = k; i < n; i++)
                fitted[i] = (uint8_t)(i * 37 % 61); /* small floats */
            in = fitted;
        }
    }
    const char *path = fuzz_write_file("ckpt", in, n);
    if (!path) return 0;
    ikv_model *m;
    if (ikv_model_load(path, &m)) return 0;
    run_engine(m);
    ikv_model_destroy(m);
    return 0;
}
