/*
 * Speculative decoding in the server's batched step: where a request's drafts come from and
 * what is recorded when the step has verified them.
 *
 *   prompt done ---> ikv__spec_first: response cache lookup (spec.semantic), keep a copy of the
 *                    best candidate's output; its first token by the acceptance rule (greedy:
 *                    free, the prefill's argmax; sampled: p(x), else a sample without x)
 *   each step   ---> ikv__spec_draft: after the lead r->next, the candidate's continuation while
 *                    the output so far equals its first tokens (8 tokens, doubled after each
 *                    fully accepted draft; all of it for the same prompt), else a
 *                    prompt-lookup draft (the continuation of the latest match of the last
 *                    n..m tokens in prompt + output, spec.lookup); blocks reserved for it
 *   ikv_engine_step: the draft is 1 + k rows of the same batched forward as every other
 *                    sequence's decode row (no forward of its own, no stall for the others)
 *   after       ---> ikv__spec_done: counts; the scheduler takes the accepted tokens and the
 *                    token at the first mismatch (ikv_step_item.next) as one burst
 *
 * Exactness is the engine's (ikv_engine_step with a draft keeps only what the model itself
 * produces, bit-identical logits): at temperature 0 the output is the same tokens as without
 * any draft, whatever the draft. Only the scheduler thread calls these, with s->mu held.
 * Allocation: the candidate copy and the lookup buffer once per request, never per step.
 */
#include "internal.h"

#include <string.h>

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int ikv__spec_first(ikv_serve *s, srq *r, uint32_t *tok) {
    const float *lg = ikv_seq_logits(r->seq);
    int rc = 0;
    if (r->spec.semantic && s->rcache && !r->sem_done) {
        r->sem_done = 1;
        ikv_respcache_hit h[3];
        size_t nh = ikv_respcache_lookup(s->rcache, r->scope, r->tokens, r->n, h, 3);
        s->met.sem_lookups++;
        r->sem_cands = nh;
        /* greedy: the best candidate whose first token is the argmax (free to check) */
        const uint32_t want = r->temperature == 0.0f ? argmax(lg, s->vocab) : 0;
        const ikv_respcache_hit *c = NULL;
        for (size_t i = 0; i < nh && !c; i++)
            if (r->temperature != 0.0f || h[i].output[0] == want) c = &h[i];
        if (c) {
            size_t n = c->n_output < r->max_tokens ? c->n_output : r->max_tokens;
            /* a copy: later puts may evict the entry while the request runs */
            if (!(r->cand = ikv_malloc(sizeof *r->cand * n)))
                rc = IKV_ENOMEM;
            else {
                memcpy(r->cand, c->output, sizeof *r->cand * n);
                r->ncand = n, r->cand_id = c->id, r->cand_on = 1, r->cand_chk = 0;
                /* a wrong candidate wastes at most 8 rows, then at most as many as were
                 * accepted; the same prompt (Jaccard 1) drafts its whole output at once */
                r->cand_k = c->similarity >= 0.999 ? n : 8;
                s->met.sem_verified++;
            }
        }
    }
    if (r->cand && r->ntok == 0) {
        const int ok = ikv_sampler_accept(r->smp, lg, r->cand[0], tok);
        r->sem_accepted += (size_t)ok, r->sem_rejected += (size_t)!ok;
        s->met.sem_accepted += (uint64_t)ok, s->met.sem_rejected += (uint64_t)!ok;
        s->met.sem_hits += (uint64_t)ok;
        if (ok)
            ikv_respcache_used(s->rcache, r->cand_id, 1); /* a hit for the eviction policy */
        else
            r->cand_on = 0;
        return rc;
    }
    memcpy(s->logit_scratch, lg, sizeof(float) * s->vocab);
    *tok = ikv_sampler_sample(r->smp, s->logit_scratch);
    return rc;
}

size_t ikv__spec_draft(ikv_serve *s, srq *r, size_t kmax, const uint32_t **draft) {
    *draft = NULL;
    if (r->replaying || r->ntok == 0 || r->ntok >= r->max_tokens) return 0;
    const size_t room = ikv_seq_room(r->seq);
    /* tokens after the lead that may still be output (the last one's next is then unused) */
    size_t cap = r->max_tokens - r->ntok;
    if (room < 2) return 0;
    if (cap > room - 1) cap = room - 1;
    if (cap > kmax) cap = kmax;
    /* the output so far against the candidate: otok[0, ntok) == cand[0, ntok)? */
    while (r->cand_on && r->cand_chk < r->ntok) {
        if (r->cand_chk >= r->ncand || r->otok[r->cand_chk] != r->cand[r->cand_chk]) r->cand_on = 0;
        r->cand_chk++;
    }
    const uint32_t *d = NULL;
    size_t k = 0;
    if (r->cand && r->cand_on && r->ncand > r->ntok) {
        d = r->cand + r->ntok;
        k = r->ncand - r->ntok < cap ? r->ncand - r->ntok : cap;
        if (k > r->cand_k) k = r->cand_k;
    } else if (r->spec.lookup && r->spec.k) {
        if (!r->dbuf && !(r->dbuf = ikv_malloc(sizeof *r->dbuf * r->spec.k)))
            return 0; /* no memory for a draft: decode plainly */
        d = r->dbuf;
        k = ikv_lookup_draft(r->all, r->n + r->ntok, r->spec.ngram, r->spec.min_ngram,
                             cap < r->spec.k ? cap : r->spec.k, r->dbuf);
    }
    /* the draft's blocks come from the private budget: shorter when they do not all fit,
     * never a preemption for a draft */
    while (k > 0 && ikv_seq_reserve(s->engine, r->seq, 1 + k) == IKV_EFULL)
        k /= 2;
    if (k) *draft = d;
    return k;
}

void ikv__spec_done(ikv_serve *s, srq *r, const uint32_t *draft, size_t k, size_t accepted) {
    r->spec_steps++, r->spec_draft += k, r->spec_accepted += accepted;
    s->met.spec_steps++, s->met.spec_draft_tokens += k, s->met.spec_accepted_tokens += accepted;
    if (r->cand && draft >= r->cand && draft < r->cand + r->ncand) { /* the cached response */
        if (!r->sem_accepted && accepted) s->met.sem_hits++;
        r->sem_accepted += accepted, r->sem_rejected += k - accepted;
        r->sem_saved += accepted; /* each accepted token is a decode step not run */
        s->met.sem_accepted += accepted, s->met.sem_rejected += k - accepted;
        s->met.sem_saved += accepted;
        if (accepted < k)
            r->cand_on = 0; /* the next token differs from the candidate's */
        else
            r->cand_k *= 2;
    } else
        s->met.spec_lookup_accepted += accepted;
}
