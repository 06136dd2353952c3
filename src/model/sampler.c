/*
 * Sampler: greedy, temperature, top-p (nucleus), seeded.
 *
 * Greedy is argmax (lowest index wins ties). Otherwise logits are divided by the temperature
 * and softmaxed; with 0 < topp < 1 only the smallest set of most-probable tokens whose mass
 * exceeds topp is kept (tokens below (1 - topp) / (vocab - 1) cannot be in it and are skipped
 * before sorting, as llama2.c does), and a uniform coin from xorshift64* picks a token from
 * the cumulative distribution. The candidate array is allocated at creation: sampling does not
 * allocate.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct cand {
    float p;
    uint32_t id;
} cand;

struct ikv_sampler {
    uint32_t vocab;
    float temperature, topp;
    uint64_t state;
    cand *cands; /* [vocab] */
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
    if (!s || !c) {
        ikv_free(s), ikv_free(c);
        return ikv_error(IKV_ENOMEM, "sampler");
    }
    s->vocab = vocab, s->temperature = temperature, s->topp = topp, s->cands = c;
    s->state = seed ? seed : UINT64_C(0x9E3779B97F4A7C15); /* xorshift needs a non-zero state */
    *out = s;
    return 0;
}

void ikv_sampler_destroy(ikv_sampler *s) {
    if (!s) return;
    ikv_free(s->cands);
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

uint32_t ikv_sampler_sample(ikv_sampler *s, float *logits) {
    uint32_t n = s->vocab;
    if (s->temperature == 0.0f) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float mx = logits[0];
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        logits[i] = expf((logits[i] - mx) / s->temperature);
        sum += logits[i];
    }
    for (uint32_t i = 0; i < n; i++)
        logits[i] /= sum;
    float r = coin(s);
    if (s->topp <= 0.0f || s->topp >= 1.0f) {
        float cdf = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            cdf += logits[i];
            if (r < cdf) return i;
        }
        return n - 1;
    }
    float cutoff = n > 1 ? (1.0f - s->topp) / (float)(n - 1) : 0.0f;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (logits[i] >= cutoff) s->cands[m].p = logits[i], s->cands[m].id = i, m++;
    if (m == 0) { /* all below the cutoff: cannot happen for a distribution, but stay total */
        for (uint32_t i = 0; i < n; i++)
            s->cands[i].p = logits[i], s->cands[i].id = i;
        m = n;
    }
    qsort(s->cands, m, sizeof *s->cands, by_prob_desc);
    float cum = 0.0f;
    uint32_t last = m - 1;
    for (uint32_t i = 0; i < m; i++) {
        cum += s->cands[i].p;
        if (cum > s->topp) {
            last = i;
            break;
        }
    }
    float target = r * cum, cdf = 0.0f;
    for (uint32_t i = 0; i <= last; i++) {
        cdf += s->cands[i].p;
        if (target < cdf) return s->cands[i].id;
    }
    return s->cands[last].id;
}
