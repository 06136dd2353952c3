/*
 * Fuzz harness: a llama2.c checkpoint through ikv_model_load, then, when it loads, a short
 * engine run on it (docs/fuzzing.md): an engine with the default pool, a prompt of up to 6
 * tokens prefilled through the cache twice (the second time from the cache), and 3 greedy decode
 * steps. Bounded by the input: every size in the header must be backed by the file's bytes, so a
 * 16 KB input cannot describe a large model.
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
    for (size_t i = 0; i < n; i++) toks[i] = (uint32_t)((i * 7 + 1) % (uint32_t)c->vocab_size);
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
    const char *path = fuzz_write_file("ckpt", data, size);
    if (!path) return 0;
    ikv_model *m;
    if (ikv_model_load(path, &m)) return 0;
    run_engine(m);
    ikv_model_destroy(m);
    return 0;
}
