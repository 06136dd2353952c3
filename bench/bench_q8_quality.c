/*
 * bench_q8_quality: how far int8 weights move a model from its fp32 self (measured, not timed).
 *
 *     build/bench_q8_quality MODEL.bin TOKENIZER.bin GROUP [N=256] [THREADS=1]
 *
 * Quantizes the fp32 checkpoint in memory (isokv model quantize's arithmetic, groups of GROUP)
 * and, for each of three prompts, generates N tokens greedily with each model. Reports
 *  - greedy agreement: generated positions where the int8 token equals the fp32 token, and the
 *    length of the common prefix of the two continuations;
 *  - mean KL per token, KL(p_fp32 || p_int8) of the next-token distributions (softmax of the
 *    logits, temperature 1), teacher-forced along the fp32 continuation: both models prefill
 *    the prompt + the fp32 tokens once and the KL is averaged over the N predicted positions;
 *  - the same for top-1 agreement under teacher forcing.
 * Prints what it measured, on what, and the core count.
 */
#include "isokv/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t argmax(const float *l, int n) {
    uint32_t b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = (uint32_t)i;
    return b;
}

/* Greedy continuation of n tokens after the prompt (stops early at BOS, as isokv run does). */
static size_t greedy(ikv_engine *e, const uint32_t *p, size_t np, size_t n, uint32_t *out) {
    ikv_request r = {.tokens = p, .n = np, .no_cache = 1};
    ikv_seq *s;
    if (ikv_engine_begin(e, &r, &s, NULL)) return 0;
    const int V = ikv_model_cfg(ikv_engine_model(e))->vocab_size;
    const float *lg = ikv_seq_logits(s);
    size_t k = 0;
    for (; k < n && np + k < (size_t)ikv_model_cfg(ikv_engine_model(e))->seq_len; k++) {
        out[k] = argmax(lg, V);
        if (out[k] == IKV_TOK_BOS || ikv_engine_decode(e, s, out[k], &lg)) break;
    }
    ikv_engine_end(e, s);
    return k;
}

/* log-softmax of l into o (n values). */
static void logsoftmax(const float *l, int n, double *o) {
    double mx = l[0], s = 0;
    for (int i = 1; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < n; i++)
        s += exp(l[i] - mx);
    double ls = log(s) + mx;
    for (int i = 0; i < n; i++)
        o[i] = l[i] - ls;
}

#define USAGE "usage: bench_q8_quality MODEL.bin TOKENIZER.bin GROUP [N=256] [THREADS=1]\n"

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%s", USAGE);
            return 0;
        }
        if (argv[i][0] == '-') {
            fprintf(stderr, "bench_q8_quality: unknown option '%s'\n%s", argv[i], USAGE);
            return 2;
        }
    }
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "bench_q8_quality: wants 3 to 5 arguments\n%s", USAGE);
        return 2;
    }
    const int group = atoi(argv[3]);
    const size_t N = argc > 4 ? (size_t)atoi(argv[4]) : 256;
    const int threads = argc > 5 ? atoi(argv[5]) : 1;
    ikv_model *f, *q;
    ikv_tokenizer *t;
    if (ikv_model_load(argv[1], &f) || ikv_model_quantize(f, group, &q)) {
        fprintf(stderr, "bench_q8_quality: %s\n", ikv_errdetail());
        return 1;
    }
    const ikv_model_config *c = ikv_model_cfg(f);
    if (ikv_tokenizer_load(argv[2], (uint32_t)c->vocab_size, &t)) {
        fprintf(stderr, "bench_q8_quality: %s\n", ikv_errdetail());
        return 1;
    }
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = threads;
    ikv_engine *ef, *eq;
    if (ikv_engine_create(f, &o, &ef) || ikv_engine_create(q, &o, &eq)) {
        fprintf(stderr, "bench_q8_quality: %s\n", ikv_errdetail());
        return 1;
    }
    static const char *prompts[] = {"Once upon a time", "The little dog ran to the park.",
                                    "Zo\xc3\xab had a red ball"};
    const int V = c->vocab_size;
    const size_t L = (size_t)c->seq_len;
    uint32_t *seq = malloc(sizeof(uint32_t) * L), *gq = malloc(sizeof(uint32_t) * L);
    float *lf = malloc(sizeof(float) * L * (size_t)V), *lq = malloc(sizeof(float) * L * (size_t)V);
    double *af = malloc(sizeof(double) * (size_t)V), *aq = malloc(sizeof(double) * (size_t)V);
    printf("int8 vs fp32 (measured): %s, int8 groups of %d, %zu greedy tokens per prompt, %d "
           "thread(s), %ld cores\n",
           argv[1], group, N, threads, sysconf(_SC_NPROCESSORS_ONLN));
    size_t tot_pos = 0, tot_same = 0, tot_tf = 0, tot_tf_same = 0;
    double tot_kl = 0;
    for (size_t pi = 0; pi < sizeof prompts / sizeof prompts[0]; pi++) {
        size_t np;
        if (ikv_tokenizer_encode(t, prompts[pi], 1, 0, seq, L, &np)) return 1;
        size_t nf = greedy(ef, seq, np, N, seq + np);
        size_t nq = greedy(eq, seq, np, N, gq);
        size_t same = 0, prefix = 0, n = nf < nq ? nf : nq;
        for (size_t i = 0; i < n; i++)
            same += seq[np + i] == gq[i];
        while (prefix < n && seq[np + prefix] == gq[prefix])
            prefix++;
        /* teacher forcing along the fp32 continuation: positions np-1 .. np+nf-2 predict it */
        ikv_request rf = {.tokens = seq, .n = np + nf, .no_cache = 1, .logits_all = lf};
        ikv_request rq = {.tokens = seq, .n = np + nf, .no_cache = 1, .logits_all = lq};
        ikv_seq *s;
        if (ikv_engine_begin(ef, &rf, &s, NULL)) return 1;
        ikv_engine_end(ef, s);
        if (ikv_engine_begin(eq, &rq, &s, NULL)) return 1;
        ikv_engine_end(eq, s);
        double kl = 0;
        size_t tf_same = 0;
        for (size_t p = np - 1; p + 1 < np + nf; p++) {
            const float *a = lf + p * (size_t)V, *b = lq + p * (size_t)V;
            logsoftmax(a, V, af), logsoftmax(b, V, aq);
            double k = 0;
            for (int i = 0; i < V; i++)
                k += exp(af[i]) * (af[i] - aq[i]);
            kl += k;
            tf_same += argmax(a, V) == argmax(b, V);
        }
        printf("  prompt %zu (%zu tokens): greedy %zu/%zu generated tokens equal, common prefix "
               "%zu; teacher-forced: mean KL %.3g nats/token, top-1 equal %zu/%zu\n",
               pi + 1, np, same, n, prefix, nf ? kl / (double)nf : 0.0, tf_same, nf);
        tot_pos += n, tot_same += same, tot_kl += kl, tot_tf += nf, tot_tf_same += tf_same;
    }
    printf("  all: greedy %zu/%zu equal (%.1f%%); mean KL %.3g nats/token; teacher-forced top-1 "
           "%zu/%zu (%.1f%%)\n",
           tot_same, tot_pos, 100.0 * (double)tot_same / (double)(tot_pos ? tot_pos : 1),
           tot_kl / (double)(tot_tf ? tot_tf : 1), tot_tf_same, tot_tf,
           100.0 * (double)tot_tf_same / (double)(tot_tf ? tot_tf : 1));
    free(seq), free(gq), free(lf), free(lq), free(af), free(aq);
    ikv_engine_destroy(ef), ikv_engine_destroy(eq);
    ikv_model_destroy(q), ikv_model_destroy(f);
    ikv_tokenizer_destroy(t);
    return 0;
}
