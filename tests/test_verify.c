/*
 * Tests for draft verification (ikv_engine_verify) and the speculative-sampling rule
 * (ikv_sampler_accept):
 *   - exactness: every row a verify computes has logits bit-identical to decoding the same
 *     tokens one by one with ikv_engine_decode, on the bundled real model (stories260K) and on
 *     a generated `tiny` model, at 1 and 2 threads, with and without a lead token, for drafts
 *     that are right, wrong at every index, and wrong at the first token; after a verify,
 *     decoding continues with the reference's tokens and logits; rolled-back positions leave
 *     the pool as plain decoding to the same length would (ikv_engine_check, block counts);
 *   - drafts inside ikv_engine_step: several sequences in one step, with right, wrong and
 *     no drafts, each bit-identical to its own sequential decode;
 *   - errors: bad tokens, a draft longer than max_draft, one past the sequence's limit change
 *     nothing;
 *   - the rule's arithmetic with its coins given (acceptance exactly below p(x); the rejection
 *     branch never gives x and gives every other token in proportion to p), and statistically
 *     with a fixed seed: accepting a draft token gives tokens distributed as p (chi-square),
 *     including through the engine at temperature 4 and top-p 0.9 for two positions (the
 *     generated model's logits span about 40, so 4 gives a top token of p 0.45).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isokv/model.h"
#include "model/internal.h"
#include "engine_testutil.h"

/* Free blocks of an engine (the pool's state after a roll-back is compared with this). */
static uint64_t free_blocks(const ikv_engine *e) {
    ikv_engine_stats st;
    ikv_engine_stats_get(e, &st);
    return st.free_blocks;
}

/* The exactness checks on one model and prompt at one thread count; fused: the engine's steps
 * forced through the fused pass (forward.c; ikv__fused_force(1)), the reference decoded
 * without it. */
static void exact_on(const ikv_model *m, const uint32_t *P, size_t np, int threads, int fused) {
    const int V = m->cfg.vocab_size;
    enum { DEC = 48, K = 12 };
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = threads;
    o.max_seqs = 2;
    o.tile = 16;
    o.max_draft = K + 4;
    float *ref = malloc(sizeof(float) * (size_t)V * (DEC + 1));
    float *all = malloc(sizeof(float) * (size_t)V * (K + 1));
    uint32_t gen[DEC];
    ikv__fused_force(0);
    tu_greedy_ref(m, &o, P, np, DEC, ref, gen);
    ikv__fused_force(fused ? 1 : -1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    ikv_request rq = {.tokens = P, .n = np, .tenant = "T", .max_new = DEC + K + 2};

    /* (a) no lead, a draft wrong at index j (j = K: all right), from several starting points
     * d0; then plain decoding continues as the reference */
    static const int d0s[] = {0, 7, 19}, js[] = {0, 1, 2, 5, 9, K};
    for (size_t a0 = 0; a0 < sizeof d0s / sizeof d0s[0]; a0++)
        for (size_t a1 = 0; a1 < sizeof js / sizeof js[0]; a1++) {
            const int d0 = d0s[a0], j = js[a1];
            ikv_seq *s;
            assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
            const float *lg;
            for (int d = 0; d < d0; d++)
                assert_int_equal(ikv_engine_decode(e, s, gen[d], &lg), 0);
            uint32_t draft[K];
            for (int i = 0; i < K; i++)
                draft[i] = gen[d0 + i];
            if (j < K) draft[j] = (draft[j] + 1 + (uint32_t)j) % (uint32_t)V;
            ikv_verify v = {.draft = draft, .k = K, .logits_all = all};
            assert_int_equal(ikv_engine_verify(e, s, &v), 0);
            assert_int_equal(v.accepted, j);
            assert_int_equal(v.next, gen[d0 + j]);
            assert_int_equal(v.rows, j == 0 ? 0 : K);
            assert_int_equal(ikv_seq_len(s), np + (size_t)d0 + (size_t)j);
            /* the mismatch position's logits, and every row up to it, bit for bit */
            assert_memory_equal(ikv_seq_logits(s), ref + (size_t)(d0 + j) * V,
                                sizeof(float) * (size_t)V);
            for (int r = 0; j > 0 && r < j; r++)
                assert_memory_equal(all + (size_t)r * V, ref + (size_t)(d0 + r + 1) * V,
                                    sizeof(float) * (size_t)V);
            assert_true(ikv_engine_check(e));
            /* continue: the reference's logits at every later step */
            for (int d = d0 + j; d < d0 + j + 6; d++) {
                assert_int_equal(ikv_engine_decode(e, s, gen[d], &lg), 0);
                assert_memory_equal(lg, ref + (size_t)(d + 1) * V, sizeof(float) * (size_t)V);
            }
            /* the pool holds what plain decoding to this length holds */
            uint64_t fb = free_blocks(e);
            ikv_engine_end(e, s);
            ikv_seq *s2;
            assert_int_equal(ikv_engine_begin(e, &rq, &s2, NULL), 0);
            for (int d = 0; d < d0 + j + 6; d++)
                assert_int_equal(ikv_engine_decode(e, s2, gen[d], &lg), 0);
            assert_int_equal(free_blocks(e), fb);
            ikv_engine_end(e, s2);
            assert_true(ikv_engine_check(e));
        }

    /* (b) rounds with a lead (the prompt-lookup loop): every round's draft is right up to a
     * varying index; the emitted tokens and each round's logits follow the reference */
    {
        ikv_seq *s;
        assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
        size_t out = 0;
        uint32_t pending = tu_argmax(ikv_seq_logits(s), V);
        assert_int_equal(pending, gen[0]);
        out = 1; /* gen[0] emitted, not yet in the sequence */
        for (int round = 0; out + K + 1 < DEC; round++) {
            const size_t k = (size_t)(round % 5) * 3;     /* 0, 3, 6, 9, 12 */
            const size_t wrong = (size_t)round % (k + 1); /* k: all right */
            uint32_t draft[K];
            for (size_t i = 0; i < k; i++)
                draft[i] = gen[out + i];
            if (wrong < k) draft[wrong] = (draft[wrong] + 7) % (uint32_t)V;
            ikv_verify v = {
                .has_lead = 1, .lead = pending, .draft = draft, .k = k, .logits_all = all};
            assert_int_equal(ikv_engine_verify(e, s, &v), 0);
            assert_int_equal(v.rows, k + 1);
            assert_int_equal(v.accepted, wrong);
            for (size_t r = 0; r <= wrong; r++)
                assert_memory_equal(all + r * V, ref + (out + r) * V, sizeof(float) * (size_t)V);
            out += wrong;
            assert_int_equal(ikv_seq_len(s), np + out);
            assert_memory_equal(ikv_seq_logits(s), ref + out * V, sizeof(float) * (size_t)V);
            assert_int_equal(v.next, gen[out]);
            pending = v.next;
            out++;
            assert_true(ikv_engine_check(e));
        }
        /* errors change nothing */
        const size_t len = ikv_seq_len(s);
        uint32_t big[K + 8];
        for (int i = 0; i < K + 8; i++)
            big[i] = gen[0];
        ikv_verify bad = {.draft = big, .k = K + 8};
        assert_int_equal(ikv_engine_verify(e, s, &bad), IKV_EINVAL);
        big[2] = (uint32_t)V;
        bad.k = 4;
        assert_int_equal(ikv_engine_verify(e, s, &bad), IKV_EINVAL);
        bad = (ikv_verify){.has_lead = 1, .lead = (uint32_t)V + 3};
        assert_int_equal(ikv_engine_verify(e, s, &bad), IKV_EINVAL);
        bad = (ikv_verify){.draft = gen, .k = ikv_seq_room(s) + 1};
        if (bad.k <= K + 4) assert_int_equal(ikv_engine_verify(e, s, &bad), IKV_ETOOLONG);
        assert_int_equal(ikv_seq_len(s), len);
        assert_true(ikv_engine_check(e));
        ikv_engine_end(e, s);
    }
    /* (c) a draft up to the sequence's limit: accepted fully, nothing past the limit */
    {
        ikv_request r2 = rq;
        r2.max_new = 10;
        ikv_seq *s;
        assert_int_equal(ikv_engine_begin(e, &r2, &s, NULL), 0);
        assert_int_equal(ikv_seq_room(s), 10);
        ikv_verify v = {.draft = gen, .k = 11};
        assert_int_equal(ikv_engine_verify(e, s, &v), IKV_ETOOLONG);
        v.k = 10;
        assert_int_equal(ikv_engine_verify(e, s, &v), 0);
        assert_int_equal(v.accepted, 10);
        assert_int_equal(ikv_seq_room(s), 0);
        assert_memory_equal(ikv_seq_logits(s), ref + 10 * (size_t)V, sizeof(float) * (size_t)V);
        ikv_engine_end(e, s);
    }
    assert_true(ikv_engine_check(e));
    ikv_engine_destroy(e);
    ikv__fused_force(-1);
    free(ref);
    free(all);
}

static void test_verify_exact_real(void **st) {
    (void)st;
    ikv_model *m;
    ikv_tokenizer *tk;
    if (ikv_model_load("data/models/stories260K/stories260K.bin", &m))
        fail_msg("bundled model: %s", ikv_errdetail());
    assert_int_equal(ikv_tokenizer_load("data/models/stories260K/tok512.bin", 512, &tk), 0);
    uint32_t P[128];
    size_t np;
    assert_int_equal(ikv_tokenizer_encode(tk,
                                          "Once upon a time, there was a little girl named "
                                          "Lily. She loved to play",
                                          1, 0, P, 128, &np),
                     0);
    for (int th = 1; th <= 2; th++)
        for (int fz = 0; fz <= 1; fz++)
            exact_on(m, P, np, th, fz);
    ikv_tokenizer_destroy(tk);
    ikv_model_destroy(m);
}

static void test_verify_exact_generated(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 7, &m), 0);
    uint32_t P[40];
    for (int i = 0; i < 40; i++)
        P[i] = (uint32_t)(3 + (i * 37) % 400);
    for (int th = 1; th <= 3; th++) /* 3: the fused pass's row shares of 16 leave one empty */
        for (int fz = 0; fz <= 1; fz++)
            exact_on(m, P, 29, th, fz); /* 29: the draft crosses block boundaries at 32, 48, ... */
    ikv_model_destroy(m);
}

/* Drafts inside the batched step: three sequences decode together, one with a draft that is
 * right (all accepted), one with a draft wrong at a moving index, one plain; at every step
 * each sequence's logits are bit-identical to its own sequential greedy decode, the accepted
 * counts are the right prefix, `next` is the reference's next token, and the pool stays
 * consistent. A step with more rows than the engine takes is refused and changes nothing. */
static void test_step_drafts_mixed(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 11, &m), 0);
    const int V = c.vocab_size;
    enum { NS = 3, DEC = 40, K = 7, NP = 21 };
    for (int run = 0; run < 4; run++) { /* 1 and 2 threads, the fused pass off and forced on */
        const int th = 1 + run / 2;
        ikv__fused_force(0);
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.threads = th;
        o.max_seqs = NS;
        o.tile = 16;
        o.max_draft = 2 * (K + 1);
        uint32_t P[NS][NP], gen[NS][DEC + K + 2];
        float *ref[NS];
        for (int q = 0; q < NS; q++) {
            for (int i = 0; i < NP; i++)
                P[q][i] = (uint32_t)(3 + (i * 37 + q * 101) % 400);
            ref[q] = malloc(sizeof(float) * (size_t)V * (DEC + K + 3));
            tu_greedy_ref(m, &o, P[q], NP, DEC + K + 2, ref[q], gen[q]);
        }
        ikv__fused_force(run % 2);
        ikv_engine *e;
        assert_int_equal(ikv_engine_create(m, &o, &e), 0);
        assert_true(ikv_engine_max_rows(e) >= 2 * (K + 1) + 1);
        ikv_seq *sq[NS];
        size_t done[NS] = {0}; /* tokens of gen[q] in the sequence */
        for (int q = 0; q < NS; q++) {
            ikv_request rq = {.tokens = P[q], .n = NP, .tenant = "T", .max_new = DEC + 3 * K};
            assert_int_equal(ikv_engine_begin(e, &rq, &sq[q], NULL), 0);
        }
        uint32_t bad[K];
        int steps = 0;
        while (done[0] < DEC || done[1] < DEC || done[2] < DEC) {
            ikv_step_item it[NS];
            size_t ni = 0, want[NS];
            int qi[NS];
            for (int q = 0; q < NS; q++) {
                if (done[q] >= DEC) continue;
                it[ni] = (ikv_step_item){.seq = sq[q], .token = gen[q][done[q]]};
                if (q == 0) { /* right draft */
                    it[ni].draft = &gen[q][done[q] + 1], it[ni].k = K, want[ni] = K;
                } else if (q == 1) { /* wrong at index steps % (K + 1) (K: none wrong) */
                    size_t w = (size_t)(steps % (K + 1));
                    memcpy(bad, &gen[q][done[q] + 1], sizeof bad);
                    if (w < K) bad[w] = (bad[w] + 1) % (uint32_t)V;
                    it[ni].draft = bad, it[ni].k = K, want[ni] = w;
                } else
                    want[ni] = 0;
                qi[ni++] = q;
            }
            assert_int_equal(ikv_engine_step(e, it, ni), 0);
            for (size_t i = 0; i < ni; i++) {
                const int q = qi[i];
                assert_int_equal(it[i].done, 1 + want[i]);
                if (it[i].k) {
                    assert_int_equal(it[i].accepted, want[i]);
                    assert_int_equal(it[i].next, gen[q][done[q] + 1 + want[i]]);
                }
                done[q] += 1 + want[i];
                assert_int_equal(ikv_seq_len(sq[q]), NP + done[q]);
                assert_memory_equal(ikv_seq_logits(sq[q]), ref[q] + done[q] * (size_t)V,
                                    sizeof(float) * (size_t)V);
            }
            assert_true(ikv_engine_check(e));
            steps++;
        }
        /* too many rows: refused, nothing changed */
        uint32_t many[64] = {0};
        ikv_step_item big[NS];
        size_t rows = 0;
        for (int q = 0; q < NS; q++) {
            const size_t k = ikv_seq_room(sq[q]) - 1; /* each fits its sequence alone */
            assert_true(k >= K);
            big[q] = (ikv_step_item){.seq = sq[q], .token = 1, .draft = many, .k = k};
            rows += 1 + k;
        }
        assert_true(rows > ikv_engine_max_rows(e));
        const size_t len0 = ikv_seq_len(sq[0]);
        assert_int_equal(ikv_engine_step(e, big, NS), IKV_EINVAL);
        assert_int_equal(ikv_seq_len(sq[0]), len0);
        big[0].k = o.max_draft + 1; /* more than max_draft */
        assert_int_equal(ikv_engine_step(e, big, 1), IKV_EINVAL);
        big[0].k = 1, many[0] = (uint32_t)V; /* a draft token outside the vocabulary */
        assert_int_equal(ikv_engine_step(e, big, 1), IKV_EINVAL);
        assert_true(ikv_engine_check(e));
        for (int q = 0; q < NS; q++) {
            ikv_engine_end(e, sq[q]);
            free(ref[q]);
        }
        assert_true(ikv_engine_check(e));
        ikv_engine_destroy(e);
        ikv__fused_force(-1);
    }
    ikv_model_destroy(m);
}

/* ikv_lookup_draft against a brute-force oracle on random histories over a small alphabet
 * (many matches): the longest suffix length m in [min_ngram, ngram] that occurs earlier with
 * a token after it, its latest such occurrence, the up to k tokens after it. */
static void test_lookup_draft_oracle(void **st) {
    (void)st;
    uint64_t x = 99;
    uint32_t h[64], out[16], want[16];
    for (int it = 0; it < 4000; it++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        const size_t len = (size_t)(x >> 33) % 40, k = (size_t)(x >> 20) % 9;
        const uint32_t ng = 1 + (uint32_t)((x >> 12) % 5), mn = (uint32_t)((x >> 8) % (ng + 1));
        const uint32_t alpha = 2 + (uint32_t)((x >> 4) % 3);
        for (size_t i = 0; i < len; i++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
            h[i] = (uint32_t)(x >> 40) % alpha;
        }
        size_t wn = 0;
        if (k && len >= 2)
            for (size_t m = 1; m <= ng && m < len; m++) {
                if (m < (mn ? mn : 1)) continue;
                size_t best = SIZE_MAX;
                for (size_t i = 0; i + m < len; i++) /* starts with a token after the match */
                    if (!memcmp(h + i, h + len - m, sizeof(uint32_t) * m)) best = i;
                if (best == SIZE_MAX) continue;
                wn = len - (best + m) < k ? len - (best + m) : k;
                memcpy(want, h + best + m, sizeof(uint32_t) * wn); /* longer m wins: later */
            }
        size_t got = ikv_lookup_draft(h, len, ng, mn, k, out);
        assert_int_equal(got, wn);
        if (wn) assert_memory_equal(out, want, sizeof(uint32_t) * wn);
    }
}

/* The rule's arithmetic with the coins given. */
static void test_accept_rule_arithmetic(void **st) {
    (void)st;
    const float p[6] = {0.1f, 0.0f, 0.45f, 0.25f, 0.2f, 0.0f};
    uint32_t out;
    /* acceptance exactly when u1 < p(x) */
    assert_int_equal(ikv__sampler_accept_coins(p, 6, 2, 0.44f, 0.5f, &out), 1);
    assert_int_equal(out, 2);
    assert_int_equal(ikv__sampler_accept_coins(p, 6, 2, 0.45f, 0.5f, &out), 0);
    assert_int_not_equal(out, 2);
    /* a zero-probability draft is never accepted */
    assert_int_equal(ikv__sampler_accept_coins(p, 6, 1, 0.0f, 0.0f, &out), 0);
    assert_int_equal(out, 0);
    /* rejection: u2 over a fine grid lands on y != x with frequency p(y) / (1 - p(x)) */
    enum { G = 100000 };
    for (uint32_t x = 0; x < 6; x++) {
        int cnt[6] = {0};
        for (int i = 0; i < G; i++) {
            assert_int_equal(ikv__sampler_accept_coins(p, 6, x, 1.0f, ((float)i + 0.5f) / G, &out),
                             0);
            cnt[out]++;
        }
        assert_int_equal(cnt[x], 0);
        for (uint32_t y = 0; y < 6; y++) {
            if (y == x) continue;
            double want = p[y] / (1.0 - p[x]);
            assert_true(fabs((double)cnt[y] / G - want) < 1e-4);
            if (p[y] == 0.0f) assert_int_equal(cnt[y], 0);
        }
    }
    /* all mass on the draft: accepted whatever the coins */
    const float one[3] = {0.0f, 1.0f, 0.0f};
    assert_int_equal(ikv__sampler_accept_coins(one, 3, 1, 0.9999f, 0.3f, &out), 1);
    assert_int_equal(out, 1);
    /* greedy: accepted iff argmax (lowest index on ties) */
    ikv_sampler *g;
    assert_int_equal(ikv_sampler_create(4, 0.0f, 0.0f, 1, &g), 0);
    const float lg[4] = {1.0f, 3.0f, 3.0f, -1.0f};
    assert_int_equal(ikv_sampler_accept(g, lg, 1, &out), 1);
    assert_int_equal(ikv_sampler_accept(g, lg, 2, &out), 0);
    assert_int_equal(out, 1);
    ikv_sampler_destroy(g);
}

/* Pearson chi-square of counts against probabilities over nb bins (expected >= 5 each). */
static double chi2(const int *cnt, const double *p, int nb, int total) {
    double x = 0.0;
    for (int i = 0; i < nb; i++) {
        double ex = p[i] * total;
        assert_true(ex >= 5.0);
        x += (cnt[i] - ex) * (cnt[i] - ex) / ex;
    }
    return x;
}

/* Statistically: out of ikv_sampler_accept with any draft token is distributed as p. The
 * critical values are the chi-square 0.999 quantiles; the seed is fixed, so the test is
 * deterministic, and the wrong rules (resampling from p with x kept, or never rejecting) fail
 * it by far (checked: a drawn x would get p(x) + (1 - p(x)) p(x)). */
static void test_accept_rule_statistics(void **st) {
    (void)st;
    enum { NV = 8, N = 20000 };
    const float logits[NV] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    for (int topp10 = 0; topp10 <= 9; topp10 += 9) {
        ikv_sampler *s;
        assert_int_equal(ikv_sampler_create(NV, 0.9f, (float)topp10 / 10.0f, 12345, &s), 0);
        float pf[NV];
        ikv_sampler_dist(s, logits, pf);
        double p[NV], sum = 0.0;
        int nb = 0, map[NV];
        for (int i = 0; i < NV; i++) {
            sum += pf[i];
            map[i] = pf[i] > 0.0f ? nb++ : -1;
        }
        assert_true(fabs(sum - 1.0) < 1e-5);
        for (int i = 0; i < NV; i++)
            if (map[i] >= 0) p[map[i]] = pf[i];
        for (uint32_t x = 0; x < NV; x += 3) {
            int cnt[NV] = {0}, acc = 0;
            for (int i = 0; i < N; i++) {
                uint32_t out;
                acc += ikv_sampler_accept(s, logits, x, &out);
                assert_true(map[out] >= 0); /* never outside the nucleus */
                cnt[map[out]]++;
            }
            /* chi-square 0.999 quantiles for 1..7 degrees of freedom */
            static const double crit[8] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
            assert_true(chi2(cnt, p, nb, N) < crit[nb - 1]);
            /* and it accepted about p(x) of the time */
            assert_true(fabs((double)acc / N - pf[x]) < 4.0 * sqrt(pf[x] * (1 - pf[x]) / N) + 1e-9);
        }
        ikv_sampler_destroy(s);
    }
}

/* Through the engine, temperature 4 and top-p 0.9: over many verifies of a two-token draft
 * (the two most likely tokens), the first emitted token is distributed as the model's p0, and
 * given that it is the draft's, the second as p1 (the logits after it). */
static void test_verify_sampling_distribution(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 11, &m), 0);
    const int V = c.vocab_size;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    uint32_t P[20];
    for (int i = 0; i < 20; i++)
        P[i] = (uint32_t)(5 + i * 11);
    ikv_request rq = {.tokens = P, .n = 20, .tenant = "T", .max_new = 8};
    ikv_sampler *sp;
    assert_int_equal(ikv_sampler_create((uint32_t)V, 4.0f, 0.9f, 99, &sp), 0);
    float *p0 = malloc(sizeof(float) * (size_t)V), *p1 = malloc(sizeof(float) * (size_t)V);
    ikv_seq *s;
    const float *lg;
    assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
    ikv_sampler_dist(sp, ikv_seq_logits(s), p0);
    const uint32_t d0 = tu_argmax(p0, V);
    assert_int_equal(ikv_engine_decode(e, s, d0, &lg), 0);
    ikv_sampler_dist(sp, lg, p1);
    const uint32_t d1 = tu_argmax(p1, V);
    ikv_engine_end(e, s);
    /* bins: the 4 most likely tokens of each distribution and the rest */
    enum { N = 3000, NB = 5 };
    uint32_t top0[4], top1[4];
    for (int t = 0; t < 2; t++) {
        const float *p = t ? p1 : p0;
        uint32_t *top = t ? top1 : top0;
        for (int b = 0; b < 4; b++) {
            uint32_t best = UINT32_MAX;
            for (uint32_t i = 0; i < (uint32_t)V; i++) {
                int used = 0;
                for (int q = 0; q < b; q++)
                    used |= top[q] == i;
                if (!used && (best == UINT32_MAX || p[i] > p[best])) best = i;
            }
            top[b] = best;
        }
    }
    int c0[NB] = {0}, c1[NB] = {0}, n1 = 0;
    for (int trial = 0; trial < N; trial++) {
        assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
        const uint32_t draft[2] = {d0, d1};
        ikv_verify v = {.draft = draft, .k = 2, .sampler = sp};
        assert_int_equal(ikv_engine_verify(e, s, &v), 0);
        uint32_t e0 = v.accepted >= 1 ? d0 : v.next;
        int b = 4;
        for (int q = 0; q < 4; q++)
            if (top0[q] == e0) b = q;
        c0[b]++;
        if (v.accepted >= 1) {
            uint32_t e1 = v.accepted >= 2 ? d1 : v.next;
            b = 4;
            for (int q = 0; q < 4; q++)
                if (top1[q] == e1) b = q;
            c1[b]++;
            n1++;
        }
        ikv_engine_end(e, s);
    }
    double q0[NB], q1[NB];
    q0[4] = q1[4] = 1.0;
    for (int b = 0; b < 4; b++) {
        q0[b] = p0[top0[b]], q1[b] = p1[top1[b]];
        q0[4] -= q0[b], q1[4] -= q1[b];
    }
    /* merge bins with too little mass into "rest" (expected counts >= 5) */
    int m0[NB] = {0}, m1[NB] = {0}, k0 = 0, k1 = 0;
    double r0[NB], r1[NB], rest0 = 0, rest1 = 0;
    int rc0 = 0, rc1 = 0;
    for (int b = 0; b < NB; b++) {
        if (q0[b] * N >= 5 && b < 4)
            r0[k0] = q0[b], m0[k0++] = c0[b];
        else
            rest0 += q0[b], rc0 += c0[b];
        if (q1[b] * n1 >= 5 && b < 4)
            r1[k1] = q1[b], m1[k1++] = c1[b];
        else
            rest1 += q1[b], rc1 += c1[b];
    }
    if (rest0 * N >= 5)
        r0[k0] = rest0, m0[k0++] = rc0;
    else
        assert_true(rc0 <= 10);
    if (rest1 * n1 >= 5)
        r1[k1] = rest1, m1[k1++] = rc1;
    else
        assert_true(rc1 <= 10);
    static const double crit[6] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};
    assert_true(k0 >= 2 && k1 >= 2);
    assert_true(n1 > 200);
    assert_true(chi2(m0, r0, k0, N) < crit[k0 - 1]);
    assert_true(chi2(m1, r1, k1, n1) < crit[k1 - 1]);
    assert_true(ikv_engine_check(e));
    free(p0), free(p1);
    ikv_sampler_destroy(sp);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* One long verify against decoding, with the AVX-512 batch kernels (batch512.c, linear.c) on
 * and off, the reference being a decode with them off (and a decode with them on must give the
 * same bits): a draft of DEC tokens (rows in groups of 16, 16, ..., and a short last group), at
 * block sizes 16 and 5 (a row's last block then holds fewer than 8 keys: the exp sums' tail), at 1,
 * 2 and 3 threads, through the fused pass and the region-per-phase one (forward.c), and with
 * fewer threads active than the pool has; every row's logits bit-identical to the decode
 * reference in every setting. */
static void rows_kernel_on(const ikv_model *m, const uint32_t *P, size_t np, int expect_usable) {
    const int V = m->cfg.vocab_size;
    enum { DEC = 70 };
    float *ref = malloc(sizeof(float) * (size_t)V * (DEC + 1));
    float *all = malloc(sizeof(float) * (size_t)V * DEC);
    float *ref2 = malloc(sizeof(float) * (size_t)V * (DEC + 1));
    uint32_t gen[DEC], gen2[DEC];
    static const uint32_t bts[] = {16, 5};
    for (size_t bi = 0; bi < 2; bi++)
        for (int th = 1; th <= 3; th++) { /* 3: uneven shares (Q|K|V split inside Q) */
            ikv_engine_options o;
            ikv_engine_options_default(&o);
            o.threads = th;
            o.max_seqs = 2;
            o.tile = 16;
            o.block_tokens = bts[bi];
            o.max_draft = DEC;
            /* the reference: decoding with every AVX-512 kernel off (the AVX2 + FMA path) */
            ikv__batch512_force(0);
            ikv__fused_force(0);
            tu_greedy_ref(m, &o, P, np, DEC, ref, gen);
            /* decoding with them on gives the same bits (they apply to batches of >= 4 rows),
             * and so does decoding every one-row step through the fused pass */
            ikv__batch512_force(1);
            ikv__fused_force(1);
            tu_greedy_ref(m, &o, P, np, DEC, ref2, gen2);
            assert_memory_equal(ref2, ref, sizeof(float) * (size_t)V * (DEC + 1));
            assert_memory_equal(gen2, gen, sizeof gen);
            ikv_engine *e;
            assert_int_equal(ikv_engine_create(m, &o, &e), 0);
            /* the kernels on and off, each with the fused pass forced on, off, and by default;
             * at 3 threads also with 2 of them active (the fused pass cannot run there) */
            for (int run = 0; run < (th == 3 ? 8 : 6); run++) {
                const int on = run % 2 == 0, fz = run / 2 % 3 == 2 ? -1 : run / 2 % 3;
                ikv__batch512_force(on);
                ikv__fused_force(fz);
                assert_int_equal(ikv_engine_set_threads(e, run >= 6 ? 2 : 0), 0);
                assert_int_equal(ikv__attn_rows_usable(e), on && expect_usable);
                ikv_request rq = {.tokens = P, .n = np, .tenant = "T", .max_new = DEC + 2};
                ikv_seq *s;
                assert_int_equal(ikv_engine_begin(e, &rq, &s, NULL), 0);
                ikv_verify v = {.draft = gen, .k = DEC, .logits_all = all};
                assert_int_equal(ikv_engine_verify(e, s, &v), 0);
                assert_int_equal(v.accepted, DEC);
                /* row i follows draft[i]: decode's logits after gen[i] */
                for (size_t i = 0; i < DEC; i++)
                    assert_memory_equal(all + i * (size_t)V, ref + (i + 1) * (size_t)V,
                                        sizeof(float) * (size_t)V);
                ikv_engine_end(e, s);
                assert_true(ikv_engine_check(e));
            }
            ikv__batch512_force(-1);
            ikv__fused_force(-1);
            ikv_engine_destroy(e);
        }
    free(ref), free(ref2);
    free(all);
}

static void test_verify_rows_kernel(void **st) {
    (void)st;
#if defined(__x86_64__) && defined(__GNUC__)
    const int avx512 = ikv__use_avx2() && __builtin_cpu_supports("avx512f");
#else
    const int avx512 = 0;
#endif
    if (!avx512) printf("(no AVX-512F here: the multi-row kernel is off, checked as such)\n");
    ikv_model *m;
    if (ikv_model_load("data/models/stories260K/stories260K.bin", &m))
        fail_msg("bundled model: %s", ikv_errdetail());
    uint32_t P[40];
    for (int i = 0; i < 40; i++)
        P[i] = (uint32_t)(3 + (i * 37) % 500);
    rows_kernel_on(m, P, 23, avx512); /* head_dim 8: the unrolled kernel */
    ikv_model_destroy(m);
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0); /* head_dim 16: the general one */
    assert_int_equal(ikv_model_random(&c, 5, &m), 0);
    rows_kernel_on(m, P, 17, avx512);
    ikv_model_destroy(m);
    c.dim = 48, c.hidden_dim = 96; /* head_dim 12: not a multiple of 8, the per-row kernels */
    assert_int_equal(ikv_model_random(&c, 5, &m), 0);
    rows_kernel_on(m, P, 17, 0);
    ikv_model_destroy(m);
}

/* The weight-product seam (ikv__linear_rows) with the AVX-512 kernels on and off: every output
 * of a batched call, over row ranges with odd ends and batches of 1..37 rows (16-row transposed
 * groups, 4 x 4 tiles and leftovers), at K from 1 to 172 (32-wide steps, 8-wide steps, tails, and
 * none of them), is bit-identical to the same product computed alone (one weight row, one batch
 * row). Values span several binades so that any change of summation order shows in the last bits.
 */
static void test_linear_rows_tiles(void **st) {
    (void)st;
    static const size_t Ks[] = {1, 7, 8, 13, 32, 40, 64, 100, 172};
    enum { N = 45, NX = 37, LDX = 180, LDY = 47 }; /* N >= 32 + 3: the transposed groups */
    static const size_t nxs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 15, 16, 17, 31, 32, 37};
    float *W = malloc(sizeof(float) * N * 172), *X = malloc(sizeof(float) * NX * LDX);
    float *Y = malloc(sizeof(float) * NX * LDY), one[N];
    uint64_t seed = 12345;
    for (size_t i = 0; i < (size_t)N * 172; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        W[i] = ((float)(seed >> 40) / 16777216.0f - 0.5f) * (float)(1u << (seed >> 61));
    }
    for (size_t i = 0; i < (size_t)NX * LDX; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        X[i] = ((float)(seed >> 40) / 16777216.0f - 0.5f) * (float)(1u << (seed >> 61));
    }
    for (int on = 1; on >= 0; on--) {
        ikv__batch512_force(on);
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof nxs / sizeof nxs[0]; ni++)
                for (size_t r0 = 0; r0 < 3; r0++) {
                    const size_t K = Ks[ki], r1 = N - r0, nx = nxs[ni];
                    memset(Y, 0, sizeof(float) * NX * LDY);
                    ikv__linear_rows(W, K, r0, r1, X, LDX, nx, Y, LDY);
                    for (size_t b = 0; b < nx; b++)
                        for (size_t r = r0; r < r1; r++) {
                            ikv__linear_rows(W, K, r, r + 1, X + b * LDX, LDX, 1, one, 0);
                            if (memcmp(&one[r], &Y[b * LDY + r], sizeof one[r]))
                                fail_msg("K %zu, %zu rows, row %zu, output %zu: %a vs %a alone", K,
                                         nx, b, r, (double)Y[b * LDY + r], (double)one[r]);
                        }
                }
    }
    ikv__batch512_force(-1);
    free(W), free(X), free(Y);
}

/* ikv__argmax against the scalar scan it replaces, with the AVX-512 path on and off: ties
 * (the first wins), +0 / -0, -inf, NaNs anywhere (never chosen; x[0] NaN gives 0), lengths
 * 0..200 around the 16- and 64-wide steps. */
static uint32_t argmax_scan(const float *x, size_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < (uint32_t)n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_argmax_exact(void **st) {
    (void)st;
    float x[200];
    uint64_t seed = 99;
    for (int on = 1; on >= 0; on--) {
        ikv__batch512_force(on);
        for (int trial = 0; trial < 400; trial++)
            for (size_t n = 0; n <= 200; n += 1 + (size_t)(trial % 7)) {
                for (size_t i = 0; i < n; i++) {
                    seed = seed * 6364136223846793005u + 1442695040888963407u;
                    const unsigned k = (unsigned)(seed >> 58) % 16;
                    x[i] = k == 0   ? NAN
                           : k == 1 ? -INFINITY
                           : k == 2 ? 0.0f
                           : k == 3 ? -0.0f
                           : k < 8  ? (float)(k - 5) /* small ints: many ties */
                                    : (float)((int64_t)(seed >> 40) - (1 << 23)) / 4096.0f;
                }
                if (trial % 5 == 0 && n) x[0] = NAN;
                if (trial % 3 == 0 && n) x[n - 1] = 1e30f; /* the last one wins */
                assert_int_equal(ikv__argmax(x, n), argmax_scan(x, n));
            }
    }
    ikv__batch512_force(-1);
}

/* The decode path's exp (forward.c exp_neg8 / exp_neg_fma1, batch512.c exp_neg16 on AVX2 +
 * FMA; exp_neg4 / exp_neg_scalar on SSE2): one lane, the 8- (or 4-) lane vector and the
 * 16-lane one give the same bits for every input (every 256th float of [-87, 0], the ends,
 * signed zeros, tiny and out-of-range values, NaN and infinities), and the result is within
 * 2 ulp of the double-precision exp on [-87, 0] (inputs below are clamped to -87; NaN gives
 * e^-87, +inf and positive values 1). */
static void test_exp_paths(void **st) {
    (void)st;
    enum { SPECIAL = 16 };
    const uint32_t lo = 0x80000000u, hi = 0xC2AE0000u, stride = 256; /* -0 .. -87 */
    const size_t n = SPECIAL + (hi - lo) / stride + 1;
    float *x = malloc(sizeof(float) * n), *o1 = malloc(sizeof(float) * n);
    float *o8 = malloc(sizeof(float) * n), *o16 = malloc(sizeof(float) * n);
    static const float sp[SPECIAL] = {0.0f, -0.0f, -87.0f, -87.5f, -100.0f, -1e-30f, -1e-45f,
                                      1.0f, 1e30f, -0.34657359f, -0.693147181f, -1.0f,
                                      -86.99999f, 0.5f, 0.0f, 0.0f};
    memcpy(x, sp, sizeof sp);
    x[13] = -INFINITY, x[14] = INFINITY, x[15] = NAN;
    for (size_t i = SPECIAL; i < n; i++) {
        const uint32_t b = lo + (uint32_t)(i - SPECIAL) * stride;
        memcpy(&x[i], &b, sizeof b);
    }
    for (int sse = 1; sse >= 0; sse--) { /* the SSE2 path first, then the default */
        ikv__simd_force(sse ? 0 : -1);
        ikv__exp_neg_paths(x, n, o1, o8);
        assert_memory_equal(o1, o8, sizeof(float) * n);
        if (!sse && ikv__batch512_on()) {
            memcpy(o16, o1, sizeof(float) * n);
            assert_true(ikv__exp_neg16_buf(x, n, o16) == (n & ~(size_t)15));
            assert_memory_equal(o16, o1, sizeof(float) * n);
        }
        const float e87 = o1[2];
        assert_true(o1[0] == 1.0f && o1[1] == 1.0f && o1[7] == 1.0f && o1[8] == 1.0f);
        assert_true(o1[14] == 1.0f && o1[13] == e87 && o1[15] == e87 && o1[4] == e87);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            if (!(x[i] <= 0.0f && x[i] >= -87.0f)) continue;
            const double ex = exp((double)x[i]);
            const float fe = (float)ex;
            const double ulp = (double)nextafterf(fe, INFINITY) - (double)fe;
            const double err = fabs((double)o1[i] - ex) / ulp;
            if (err > worst) worst = err;
        }
        printf("exp on [-87, 0], %s path: at most %.3f ulp from the double exp over %zu inputs\n",
               sse ? "SSE2" : "default", worst, n);
        assert_true(worst <= 2.0);
    }
    ikv__simd_force(-1);
    free(x), free(o1), free(o8), free(o16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_rule_arithmetic),
        cmocka_unit_test(test_accept_rule_statistics),
        cmocka_unit_test(test_verify_exact_generated),
        cmocka_unit_test(test_verify_exact_real),
        cmocka_unit_test(test_verify_rows_kernel),
        cmocka_unit_test(test_linear_rows_tiles),
        cmocka_unit_test(test_argmax_exact),
        cmocka_unit_test(test_exp_paths),
        cmocka_unit_test(test_step_drafts_mixed),
        cmocka_unit_test(test_lookup_draft_oracle),
        cmocka_unit_test(test_verify_sampling_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
