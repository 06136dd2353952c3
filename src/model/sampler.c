/*
 * Sampler: greedy, temperature, top-p (nucleus), seeded.
 *
 * Greedy is argmax (lowest index wins ties). Otherwise logits are divided by the temperature
 * and softmaxed; with 0 < topp < 1 only the smallest set of most-probable tokens whose mass
 * exceeds topp is kept (tokens below (1 - topp) / (vocab - 1) cannot be in it and are skipped
 * before sorting, as llama2.c does), and a uniform coin from xorshift64* picks a token from
 * the cumulative distribution. The candidate array is allocated at creation: sampling does not
 * allocate.
 *
 * Draft acceptance (ikv_sampler_accept, for ikv_engine_verify): the speculative-sampling rule
 * for a deterministic draft (Leviathan et al. 2023, "Fast Inference from Transformers via
 * Speculative Decoding"; Chen et al. 2023, "Accelerating LLM Decoding with Speculative
 * Sampling"). The draft proposes token x with probability q(x) = 1, so the general rule
 * "accept with probability min(1, p(x) / q(x)), else sample from max(0, p - q) renormalised"
 * becomes: accept x with probability p(x); on rejection draw from p with x removed,
 * renormalised. Then P(out = x) = p(x) and P(out = y) = (1 - p(x)) p(y) / (1 - p(x)) = p(y):
 * the output is distributed exactly as a plain sample. p is the distribution the sampler draws
 * from (temperature, then top-p's nucleus renormalised: ikv_sampler_dist). Greedy: accept iff
 * x is the argmax, and the argmax is the token out.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    float p;
    uint32_t id;
} cand;

struct ikv_sampler {
    uint32_t vocab;
    float temperature, topp;
    uint64_t state;
    cand *cands;  /* [vocab] */
    float *probs; /* [vocab] ikv_sampler_accept's distribution */
};

int ikv_sampler_create(uint32_t vocab, float temperature, float topp, uint64_t seed,
                       ikv_sampler **out) {
    if (vocab == 0) return ikv_error(IKV_EINVAL, "sampler: empty vocabulary");
    if (!(temperature >= 0.0f) || !isfinite(temperature))
        return ikv_error(IKV_EINVAL, "sampler: temperature %g must be a finite number >= 0",
                         (double)temperature);
    if (!(topp >= 0.0f && topp <= 1.0f))
        return ikv_error(IKV_EINVAL, "sampler: top-p %g must be in [0, 1]", (double)topp);
    ikv_sampler *s = ikv_calloc(1, sizeof *s);
    cand *c = ikv_calloc(vocab, sizeof *c);
    float *pr = ikv_calloc(vocab, sizeof *pr);
    if (!s || !c || !pr) {
        ikv_free(s), ikv_free(c), ikv_free(pr);
        return ikv_error(IKV_ENOMEM, "sampler");
    }
    s->vocab = vocab, s->temperature = temperature, s->topp = topp, s->cands = c, s->probs = pr;
    s->state = seed ? seed : UINT64_C(0x9E3779B97F4A7C15); /* xorshift needs a non-zero state */
    *out = s;
    return 0;
}

void ikv_sampler_destroy(ikv_sampler *s) {
    if (!s) return;
    ikv_free(s->cands);
    ikv_free(s->probs);
    ikv_free(s);
}

/* Uniform float in [0, 1) from xorshift64* (Vigna 2016). */
static float coin(ikv_sampler *s) {
    s->state ^= s->state >> 12;
    s->state ^= s->state << 25;
    s->state ^= s->state >> 27;
    uint32_t r = (uint32_t)((s->state * UINT64_C(0x2545F4914F6CDD1D)) >> 32);
    return (float)(r >> 8) / 16777216.0f;
}

static int by_prob_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* probs = softmax(logits / temperature); probs may be logits (in place). */
static void softmax_t(const ikv_sampler *s, const float *logits, float *probs) {
    const uint32_t n = s->vocab;
    float mx = logits[0];
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        probs[i] = expf((logits[i] - mx) / s->temperature);
        sum += probs[i];
    }
    for (uint32_t i = 0; i < n; i++)
        probs[i] /= sum;
}

/* The nucleus of a distribution (0 < topp < 1), as llama2.c's sample_topp: candidates at or
 * above (1 - topp) / (n - 1), sorted by probability (ties by id), cut after the first whose
 * cumulative sum passes topp. Leaves them in s->cands[0..last]; returns last and sets *cum to
 * their total. */
static uint32_t nucleus(ikv_sampler *s, const float *probs, float *cum) {
    const uint32_t n = s->vocab;
    float cutoff = n > 1 ? (1.0f - s->topp) / (float)(n - 1) : 0.0f;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (probs[i] >= cutoff) s->cands[m].p = probs[i], s->cands[m].id = i, m++;
    if (m == 0) { /* all below the cutoff: cannot happen for a distribution, but stay total */
        for (uint32_t i = 0; i < n; i++)
            s->cands[i].p = probs[i], s->cands[i].id = i;
        m = n;
    }
    qsort(s->cands, m, sizeof *s->cands, by_prob_desc);
    float c = 0.0f;
    uint32_t last = m - 1;
    for (uint32_t i = 0; i < m; i++) {
        c += s->cands[i].p;
        if (c > s->topp) {
            last = i;
            break;
        }
    }
    *cum = c;
    return last;
}

uint32_t ikv_sampler_sample(ikv_sampler *s, float *logits) {
    uint32_t n = s->vocab;
    if (s->temperature == 0.0f) return argmax(logits, n);
    softmax_t(s, logits, logits);
    float r = coin(s);
    if (s->topp <= 0.0f || s->topp >= 1.0f) {
        float cdf = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            cdf += logits[i];
            if (r < cdf) return i;
        }
        return n - 1;
    }
    float cum;
    uint32_t last = nucleus(s, logits, &cum);
    float target = r * cum, cdf = 0.0f;
    for (uint32_t i = 0; i <= last; i++) {
        cdf += s->cands[i].p;
        if (target < cdf) return s->cands[i].id;
    }
    return s->cands[last].id;
}

float ikv_sampler_temperature(const ikv_sampler *s) {
    return s->temperature;
}

void ikv_sampler_dist(ikv_sampler *s, const float *logits, float *probs) {
    const uint32_t n = s->vocab;
    if (s->temperature == 0.0f) {
        memset(probs, 0, sizeof(float) * n);
        probs[argmax(logits, n)] = 1.0f;
        return;
    }
    softmax_t(s, logits, probs); /* the same operations as ikv_sampler_sample */
    if (s->topp <= 0.0f || s->topp >= 1.0f) return;
    float cum;
    uint32_t last = nucleus(s, probs, &cum);
    memset(probs, 0, sizeof(float) * n);
    for (uint32_t i = 0; i <= last; i++)
        probs[s->cands[i].id] = s->cands[i].p / cum;
}

int ikv__sampler_accept_coins(const float *probs, uint32_t n, uint32_t draft, float u1, float u2,
                              uint32_t *out) {
    const float px = draft < n ? probs[draft] : 0.0f;
    if (u1 < px) {
        *out = draft;
        return 1;
    }
    /* p with the draft removed, renormalised: the cdf over the other tokens, scaled by their
     * total (summed, not 1 - p(x), so rounding cannot leave a gap at the end) */
    float rest = 0.0f;
    uint32_t lastnz = n;
    for (uint32_t i = 0; i < n; i++)
        if (i != draft && probs[i] > 0.0f) rest += probs[i], lastnz = i;
    if (lastnz == n) { /* p is all on the draft: rejection has probability 0; stay total */
        *out = draft;
        return 1;
    }
    const float target = u2 * rest;
    float cdf = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        if (i == draft || probs[i] <= 0.0f) continue;
        cdf += probs[i];
        if (target < cdf) {
            *out = i;
            return 0;
        }
    }
    *out = lastnz;
    return 0;
}

int ikv_sampler_accept(ikv_sampler *s, const float *logits, uint32_t draft, uint32_t *out) {
    if (s->temperature == 0.0f) {
        *out = argmax(logits, s->vocab);
        return *out == draft;
    }
    ikv_sampler_dist(s, logits, s->probs);
    const float u1 = coin(s);
    const float px = draft < s->vocab ? s->probs[draft] : 0.0f;
    const float u2 = u1 < px ? 0.0f : coin(s); /* the second coin only on rejection */
    return ikv__sampler_accept_coins(s->probs, s->vocab, draft, u1, u2, out);
}
