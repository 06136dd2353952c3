/*
 * The scheduler: one thread that owns the engine and runs continuous batching.
 *
 * Each turn (mu held except during the forward step):
 *
 *   1. requests cancelled by their client (disconnect) end: their sequence is released, its
 *      cached blocks unlocked;
 *   2. decode blocks, then admission. Every decoding sequence, oldest first, reserves the
 *      block its next position needs (ikv_seq_reserve_next); when the private budget is spent
 *      the most recently admitted sequence is preempted: its sequence ends (its prompt's
 *      blocks stay cached), and it goes back to the head of the queue with its sampler, text
 *      and tokens; re-admitted, its prompt is prefilled (cached or not, bit-identical) and its
 *      generated tokens are fed back through decode steps before it samples again, so every
 *      position is computed by the same path as the first time and the output goes on
 *      bit-identical. Then admission, highest routing priority first (arrival order among
 *      equals): ikv_engine_admit reserves the prompt's blocks and SRV_HEADROOM decode
 *      positions (minus its cached prefix); when they do not fit (IKV_EFULL) or every sequence
 *      slot is taken (IKV_EBUSY) the queue waits for a sequence to end;
 *   3. one step: every running sequence that has finished its prompt decodes its next token
 *      (one row each), and the prompts still pending get prefill chunks from what is left of
 *      --max-batch-tokens (the first pending one always gets at least 16 positions, so a full
 *      batch of decodes cannot starve admissions); a chunk that does not finish its prompt ends
 *      on a multiple of 64 positions (the engine's tile) where it can, so no tile is computed
 *      twice. ikv_engine_step runs it: the decode rows of all sequences through the weights as
 *      one batched product, with results bit-identical to each request alone;
 *   4. for every sequence with logits: sample (per-request sampler: temperature, top_p, seed),
 *      detokenize, apply stop strings (text that may be the start of a stop string, or an
 *      unfinished UTF-8 character, is held back until decided), finish at EOS/BOS ("stop"), a
 *      stop string ("stop") or max_tokens ("length"); wake the request's HTTP thread.
 *
 * Speculative decoding (spec.c; per request: srq.spec): a decoding sequence's row may carry a
 * draft, the response cache's candidate output (--semantic-cache: the most similar finished
 * response of its scope or a public one, looked up when the prompt is done, its first token
 * taken by the acceptance rule) while the output follows it, else a prompt-lookup draft
 * (--spec lookup). The draft is verified as 1 + k rows of the same batched step as every
 * other sequence's decode (ikv_engine_step), so a verify never stalls the others; its
 * accepted tokens and the token at the first mismatch are taken at once (a streaming client
 * gets them as one burst). Drafts take what the step's rows leave (ikv_engine_max_rows) and
 * count against --max-batch-tokens. A request that finishes (stop or length, status 200)
 * stores its output in the response cache.
 *
 * Allocation: the sampler and text buffers of a request are allocated per request, never per
 * token in steady state (the text buffer grows geometrically).
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends len bytes to r's text (mu held). Returns 0 or IKV_ENOMEM. */
static int text_append(srq *r, const char *p, size_t len) {
    if (r->raw_len + len + 1 > r->tcap) {
        size_t cap = r->tcap ? r->tcap : 256;
        while (cap < r->raw_len + len + 1)
            cap *= 2;
        char *t = ikv_realloc(r->text, cap);
        if (!t) return IKV_ENOMEM;
        r->text = t, r->tcap = cap;
    }
    for (size_t i = 0; i < len; i++)
        if (p[i]) r->text[r->raw_len++] = p[i]; /* NUL bytes cannot travel in JSON strings */
    r->text[r->raw_len] = 0;
    return 0;
}

/* Bytes of text that can be shown: all but a tail that may start a stop string or that ends
 * in the middle of a UTF-8 character. */
static size_t committable(const srq *r) {
    size_t c = r->raw_len, hold = 0;
    for (int i = 0; i < r->nstop; i++) {
        size_t L = strlen(r->stop[i]);
        for (size_t k = L - 1 < r->raw_len ? L - 1 : r->raw_len; k > hold; k--)
            if (!memcmp(r->text + r->raw_len - k, r->stop[i], k)) {
                hold = k;
                break;
            }
    }
    c -= hold;
    /* back off an unfinished UTF-8 sequence */
    size_t i = c;
    while (i > 0 && c - i < 4 && ((unsigned char)r->text[i - 1] & 0xC0) == 0x80)
        i--;
    if (i > 0) {
        unsigned char lead = (unsigned char)r->text[i - 1];
        size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
        if (need > 1 && c - (i - 1) < need) c = i - 1;
    }
    return c > r->tlen ? c : r->tlen;
}

/* Finds a stop string ending in the bytes after `from`; returns its start or SIZE_MAX. */
static size_t find_stop(const srq *r, size_t from) {
    size_t best = SIZE_MAX;
    for (int i = 0; i < r->nstop; i++) {
        size_t L = strlen(r->stop[i]);
        size_t start = from >= L ? from - L + 1 : 0;
        const char *p = r->raw_len >= L ? strstr(r->text + start, r->stop[i]) : NULL;
        if (p && (size_t)(p - r->text) < best) best = (size_t)(p - r->text);
    }
    return best;
}

/* The per-request log line: cached=pool:N[,mem:N,file:N...] names where the prefix came
 * from; with lower tiers, tier_recomputed= (found below but recomputed) and lossy= (via q8). */
static void log_request(ikv_serve *s, const srq *r) {
    if (!s->opt.log) return;
    double ttft = r->t_first > 0 ? (r->t_first - r->t_arrive) * 1e3 : -1;
    char by[160];
    int k = snprintf(by, sizeof by, "pool:%zu", r->tier_tokens[0]);
    for (size_t t = 1; t <= s->n_tiers && k > 0 && (size_t)k < sizeof by; t++)
        k += snprintf(by + k, sizeof by - (size_t)k, ",%s:%zu", s->tier_name[t], r->tier_tokens[t]);
    char extra[96] = "";
    if (s->n_tiers)
        snprintf(extra, sizeof extra, " tier_recomputed=%zu lossy=%zu", r->tier_recomputed,
                 r->lossy);
    fprintf(s->opt.log,
            "isokv serve: req=%llu tenant=%s status=%d prompt=%zu cached=%s partial=%zu%s "
            "ttft_ms=%.2f tokens=%u finish=%s e2e_ms=%.2f class=%s step=%d threads=%d "
            "cpu_ms=%.2f%s%s\n",
            (unsigned long long)r->id, r->tenant, r->status, r->n, by, r->partial, extra, ttft,
            r->ntok, r->finish ? r->finish : (r->cancelled ? "cancelled" : "-"),
            (r->t_done - r->t_arrive) * 1e3, ikv_req_class_name((ikv_req_class)r->cls),
            r->route.step, r->threads_max, r->cpu_s * 1e3, r->err[0] ? " error=" : "", r->err);
    fflush(s->opt.log);
}

/* Ends a running request (mu held): releases its sequence, records it, wakes its thread. */
static void finish_running(ikv_serve *s, size_t idx, const char *reason) {
    srq *r = s->running[idx];
    if (s->rcache && reason && r->status == 200 && r->ntok > 0 && r->otok) {
        ikv_respcache_params pa = {
            .temperature = r->temperature, .top_p = r->top_p, .seed = r->seed};
        /* public only when the whole prompt was declared public */
        (void)ikv_respcache_put(s->rcache, r->scope, r->public_tokens >= r->n, r->tokens, r->n,
                                r->otok, r->ntok, &pa); /* ENOMEM: just not cached */
        ikv_respcache_stats_get(s->rcache, &s->met.sem);
    }
    if (r->job) ikv__seg_end(s, r);
    ikv_engine_end(s->engine, r->seq);
    r->seq = NULL;
    ikv_sampler_destroy(r->smp);
    r->smp = NULL;
    if (reason) {
        r->finish = reason;
        r->tlen = r->raw_len;
    }
    r->state = SRQ_DONE;
    r->t_done = ikv_now();
    memmove(s->running + idx, s->running + idx + 1, sizeof(srq *) * (s->nrunning - idx - 1));
    s->nrunning--;
    if (r->cancelled) s->met.cancelled++;
    ikv__metrics_request(s, r);
    log_request(s, r);
    pthread_cond_broadcast(r->wake);
    pthread_cond_broadcast(&s->idle_cv);
    ikv__srq_unref(s, r);
}

/* Fails a request before it ran, or while it waited after a preemption (mu held). */
static void fail_queued(ikv_serve *s, srq *r, int status, const char *msg) {
    ikv_sampler_destroy(r->smp);
    r->smp = NULL;
    r->status = status;
    snprintf(r->err, sizeof r->err, "%s", msg);
    r->state = SRQ_DONE;
    r->t_done = ikv_now();
    ikv__metrics_request(s, r);
    log_request(s, r);
    pthread_cond_broadcast(r->wake);
    pthread_cond_broadcast(&s->idle_cv);
    ikv__srq_unref(s, r);
}

static srq *queue_pop(ikv_serve *s) {
    srq *r = s->qhead;
    s->qhead = r->qnext;
    if (!s->qhead) s->qtail = NULL;
    r->qnext = NULL;
    s->nqueue--;
    return r;
}

/* Takes r (after prev, NULL: the head) out of the queue. */
static void queue_unlink(ikv_serve *s, srq *prev, srq *r) {
    if (prev)
        prev->qnext = r->qnext;
    else
        s->qhead = r->qnext;
    if (s->qtail == r) s->qtail = prev;
    r->qnext = NULL;
    s->nqueue--;
}

/* The queued request to admit next: the highest routing priority (its step), the earliest
 * arrival among equals; its predecessor in *prev. Cancelled ones are failed on the way. */
static srq *queue_best(ikv_serve *s, srq **prev) {
    srq *best = NULL, *bp = NULL, *p = NULL;
    for (srq *r = s->qhead; r;) {
        srq *nx = r->qnext;
        if (r->cancelled) {
            queue_unlink(s, p, r);
            s->met.cancelled++;
            fail_queued(s, r, 499, "client went away while queued");
            r = nx;
            continue;
        }
        if (!best || r->prio > best->prio) best = r, bp = p;
        p = r, r = nx;
    }
    *prev = bp;
    return best;
}

static int take_token(ikv_serve *s, size_t idx, uint32_t tok);

/* Admits queued requests while their blocks fit (mu held), highest priority first. */
static void admit(ikv_serve *s) {
    while (s->qhead && s->nrunning < s->opt.max_seqs) {
        srq *prev, *r = queue_best(s, &prev);
        if (!r) break;
        if (!r->all) { /* first admission: room for the prompt and every generated token */
            if (!(r->all = ikv_malloc(sizeof(uint32_t) * (r->n + r->max_tokens)))) {
                queue_unlink(s, prev, r);
                fail_queued(s, r, 500, "out of memory (token buffer)");
                continue;
            }
            memcpy(r->all, r->tokens, sizeof(uint32_t) * r->n);
        }
        /* after a preemption too, the prompt alone (prefilled as the first time: prefill is
         * chunk- and cache-invariant); the generated tokens are replayed as decodes */
        ikv_request rq = {.tokens = r->tokens,
                          .n = r->n,
                          .tenant = r->scope,
                          .public_tokens = r->public_tokens,
                          .max_new = r->max_tokens,
                          .reserve_new = SRV_HEADROOM};
        ikv_prefill_info info;
        ikv_seq *seq;
        int rc;
        if (r->segs) /* a structured request: a chunks job (segments.c) */
            rc = ikv__seg_admit(s, r, &seq, &info);
        else
            rc = ikv_engine_admit(s->engine, &rq, &seq, &info);
        if (rc == IKV_EFULL || rc == IKV_EBUSY) break; /* wait for a sequence to end */
        queue_unlink(s, prev, r);
        if (rc && r->preemptions) {
            /* a preempted request that no longer fits (its cached prefix was evicted meanwhile
             * and the whole remains above the private budget): it ends with what it made */
            char why[sizeof r->err];
            r->finish = "length";
            r->tlen = r->raw_len;
            snprintf(why, sizeof why, "preempted and cannot be re-admitted: %s", ikv_errdetail());
            fail_queued(s, r, 200, why);
            continue;
        }
        if (rc) {
            fail_queued(s, r, rc == IKV_ETOOLONG || rc == IKV_EINVAL ? 400 : 500, ikv_errdetail());
            continue;
        }
        r->seq = seq;
        r->state = SRQ_RUNNING;
        s->running[s->nrunning++] = r;
        if (r->preemptions) { /* re-admitted: its usage keeps the first admission's figures */
            r->recomputed += (r->segs ? 0 : info.computed_tokens) + r->ntok;
            continue;
        }
        rc = ikv_sampler_create(s->vocab, r->temperature, r->top_p, r->seed, &r->smp);
        if (!rc && s->rcache && !(r->otok = ikv_malloc(sizeof *r->otok * r->max_tokens)))
            rc = IKV_ENOMEM;
        if (rc) {
            s->nrunning--;
            ikv_sampler_destroy(r->smp);
            r->smp = NULL;
            if (r->job) ikv__seg_end(s, r);
            ikv_engine_end(s->engine, seq);
            r->seq = NULL;
            fail_queued(s, r, 500, "out of memory (sampler)");
            continue;
        }
        r->cached = info.cached_tokens;
        r->t_admit = ikv_now();
        r->partial = info.partial_tokens;
        size_t lower = 0;
        for (size_t t = 1; t <= s->n_tiers; t++)
            lower += (r->tier_tokens[t] = info.tier_tokens[t]);
        r->tier_tokens[0] = r->cached - lower; /* full pool blocks and a copied partial one */
        r->tier_recomputed = info.recomputed_tier_tokens;
        r->lossy = info.lossy_tokens;
        r->prev = r->tokens[r->n - 1];
    }
}

/* Preempts running request idx (mu held): its sequence ends (its prompt's full blocks stay in
 * the cache, its decode blocks go back to the pool), and it goes back to the head of the queue
 * with its sampler, text and generated tokens, to be re-admitted with its prompt and replay
 * them. */
static void preempt(ikv_serve *s, size_t idx) {
    srq *r = s->running[idx];
    if (r->job) ikv__seg_end(s, r); /* re-admitted with the segments it reused (segments.c) */
    ikv_engine_end(s->engine, r->seq);
    r->seq = NULL;
    r->replay = 0; /* generated tokens all[n..n+ntok) are fed again after re-admission */
    r->replaying = r->ntok > 0;
    memmove(s->running + idx, s->running + idx + 1, sizeof(srq *) * (s->nrunning - idx - 1));
    s->nrunning--;
    r->state = SRQ_QUEUED;
    r->preemptions++;
    s->met.preempted++;
    r->qnext = s->qhead;
    s->qhead = r;
    if (!s->qtail) s->qtail = r;
    s->nqueue++;
}

/* Before a step: every decoding sequence, oldest first, gets the block its next position
 * needs; while the private budget is spent, the most recently admitted running sequence is
 * preempted (which may be the one asking). The oldest alone always fits: admission refused
 * any request whose whole limit exceeds the budget. */
static void reserve_decodes(ikv_serve *s) {
    for (size_t i = 0; i < s->nrunning; i++) {
        srq *r = s->running[i];
        if (ikv_seq_pending(r->seq) || r->job) continue;
        while (ikv_seq_reserve_next(s->engine, r->seq) == IKV_EFULL) {
            if (s->nrunning == 1) { /* cannot happen (see above); end it rather than stall */
                snprintf(r->err, sizeof r->err, "KV private budget exhausted");
                finish_running(s, i, "length");
                return;
            }
            /* the newest (structured requests too: segments.c); r itself qualifies */
            size_t v = s->nrunning - 1;
            preempt(s, v);
            if (v == i) break;
        }
    }
}

/* Takes the token sampled for running request idx (mu held); 1 if it finished. */
static int take_token(ikv_serve *s, size_t idx, uint32_t tok) {
    srq *r = s->running[idx];
    if (r->ntok == 0) {
        r->t_first = ikv_now();
        /* the prompt's public blocks are computed now: pin them (the --public-prefix text until
         * the end, a public system prompt for 10,000 requests after its last use; a spent pin
         * budget or blocks still pending elsewhere only mean no pin) */
        if (r->public_tokens >= 16)
            (void)ikv_engine_pin_public(s->engine, r->tokens, r->public_tokens,
                                        r->public_from_file ? 0 : 10000);
    }
    if (!r->ignore_eos && (tok == IKV_TOK_EOS || tok == IKV_TOK_BOS)) {
        finish_running(s, idx, "stop");
        return 1;
    }
    size_t len, from = r->raw_len;
    const char *piece = ikv_tokenizer_decode(s->tok, r->prev, tok, &len);
    r->all[r->n + r->ntok] = tok; /* < n + max_tokens: it finishes at max_tokens below */
    if (r->otok && r->ntok < r->max_tokens) r->otok[r->ntok] = tok;
    r->ntok++;
    r->prev = tok;
    if (text_append(r, piece, len)) {
        r->status = 500;
        snprintf(r->err, sizeof r->err, "out of memory (text)");
        finish_running(s, idx, "length");
        return 1;
    }
    size_t at = r->nstop ? find_stop(r, from) : SIZE_MAX;
    if (at != SIZE_MAX) {
        r->raw_len = at;
        r->text[at] = 0;
        finish_running(s, idx, "stop");
        return 1;
    }
    if (r->ntok >= r->max_tokens) {
        finish_running(s, idx, "length");
        return 1;
    }
    r->tlen = committable(r);
    r->next = tok;
    pthread_cond_broadcast(r->wake);
    return 0;
}

/* Takes the tokens of a step item of running request r (mu held): with a draft, the accepted
 * draft tokens and the token after them (one burst), else a sample of its logits. */
static void take_step(ikv_serve *s, srq *r, const ikv_step_item *it) {
    size_t idx = 0;
    while (idx < s->nrunning && s->running[idx] != r)
        idx++;
    IKV_ASSERT(idx < s->nrunning);
    if (!it->k) {
        memcpy(s->logit_scratch, ikv_seq_logits(r->seq), sizeof(float) * s->vocab);
        take_token(s, idx, ikv_sampler_sample(r->smp, s->logit_scratch));
        return;
    }
    ikv__spec_done(s, r, it->draft, it->k, it->accepted);
    for (size_t i = 0; i <= it->accepted; i++) {
        if (i) { /* take_token keeps r in place unless it finishes */
            idx = 0;
            while (idx < s->nrunning && s->running[idx] != r)
                idx++;
            IKV_ASSERT(idx < s->nrunning);
        }
        if (take_token(s, idx, i < it->accepted ? it->draft[i] : it->next)) break; /* finished */
    }
}

void *ikv__serve_sched(void *arg) {
    ikv_serve *s = arg;
    const uint32_t maxs = s->opt.max_seqs;
    ikv_step_item *items = ikv_calloc(maxs, sizeof *items);
    srq **map = ikv_calloc(maxs, sizeof *map);
    srv_acct *acct = ikv_calloc(maxs, sizeof *acct);
    IKV_ASSERT(items && map && acct); /* allocated once; create checked the memory is there */
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        for (size_t i = 0; i < s->nrunning;)
            if (s->running[i]->cancelled)
                finish_running(s, i, NULL);
            else
                i++;
        reserve_decodes(s); /* first: running sequences' next blocks before new admissions */
        admit(s);
        if (s->nrunning == 0) {
            /* idle: the metrics show the engine as the last requests left it */
            ikv_engine_stats_get(s->engine, &s->met.eng);
            ikv_cache_stats_get(ikv_engine_cache(s->engine), &s->met.cache);
            pthread_cond_wait(&s->sched_cv, &s->mu);
            continue;
        }
        /* the step: decodes first, then prefill chunks from what the budget leaves */
        size_t ni = 0, budget = s->opt.max_batch_tokens, prefill_tokens = 0;
        size_t rows_left = ikv_engine_max_rows(s->engine); /* decode rows the step takes */
        for (size_t i = 0; i < s->nrunning; i++)
            rows_left -= !ikv_seq_pending(s->running[i]->seq) && !s->running[i]->job;
        for (size_t i = 0; i < s->nrunning; i++) {
            srq *r = s->running[i];
            if (ikv_seq_pending(r->seq) || r->job) continue; /* prefilling or blending */
            items[ni] = (ikv_step_item){.seq = r->seq, .token = r->next, .sampler = r->smp};
            /* a draft (response cache or prompt lookup) as extra rows of this same step */
            if (r->spec.lookup || r->cand) {
                items[ni].k = ikv__spec_draft(s, r, rows_left, &items[ni].draft);
                rows_left -= items[ni].k;
                budget = budget > items[ni].k ? budget - items[ni].k : 0;
            }
            map[ni++] = r;
            budget = budget ? budget - 1 : 0;
        }
        /* prefill chunks by routing priority (highest first), admission order among equals */
        int first_pending = 1, pmax = 0;
        for (size_t i = 0; i < s->nrunning; i++)
            if (s->running[i]->prio > pmax) pmax = s->running[i]->prio;
        for (size_t k = 0; k < (size_t)(pmax + 1) * s->nrunning; k++) {
            srq *r = s->running[k % s->nrunning];
            if (r->prio != pmax - (int)(k / s->nrunning)) continue;
            size_t pend = ikv_seq_pending(r->seq);
            if (!pend) continue;
            size_t give = budget;
            if (first_pending && give < 16) give = 16;
            first_pending = 0;
            if (!give) break;
            size_t cnt = pend < give ? pend : give;
            if (cnt < pend) { /* end the chunk on a tile edge where it can */
                size_t at = ikv_seq_len(r->seq), end = (at + cnt) / 64 * 64;
                if (end > at) cnt = end - at;
            }
            items[ni] = (ikv_step_item){.seq = r->seq, .n = cnt};
            map[ni++] = r;
            budget = budget > cnt ? budget - cnt : 0;
            prefill_tokens += cnt;
        }
        /* structured requests whose exact part is done: their blend pass's next unit after
         * the step (segments.c), each decided now, run outside the lock */
        size_t nb = 0;
        for (size_t i = 0; i < s->nrunning; i++)
            if (ikv__seg_waiting(s->running[i])) s->blend_list[nb++] = s->running[i];
        pthread_mutex_unlock(&s->mu);
        /* one engine step per thread count the requests' routed steps give (route.c) */
        ikv__route_step_run(s, items, map, ni, acct);
        for (size_t k = 0; k < nb; k++) { /* at the request's routed thread count */
            srq *r = s->blend_list[k];
            IKV_ASSERT(ikv_engine_set_threads(s->engine, r->lv.threads) == 0);
            const double t0 = ikv_now(), c0 = ikv__route_cpu_now(s);
            ikv__seg_advance(s, r);
            r->blend_cpu_s = ikv__route_cpu_now(s) - c0; /* charged below, mu held */
            r->blend_thread_s = (ikv_now() - t0) * ikv_engine_threads(s->engine);
        }
        ikv_engine_stats es;
        ikv_cache_stats cs;
        ikv_engine_stats_get(s->engine, &es);
        ikv_cache_stats_get(ikv_engine_cache(s->engine), &cs);
        ikv_engine_tier_stats ts[IKV_MAX_TIERS - 1];
        for (size_t t = 0; t < s->n_tiers; t++)
            (void)ikv_engine_tier_stats_get(s->engine, t + 1, &ts[t]);
        pthread_mutex_lock(&s->mu);
        s->met.eng = es;
        s->met.cache = cs;
        for (size_t t = 0; t < s->n_tiers; t++)
            s->met.tiers[t] = ts[t];
        s->met.steps++;
        s->met.step_rows += ni;
        s->met.step_prefill_tokens += prefill_tokens;
        /* each group's CPU and thread-seconds, shared by positions (route.c) */
        ikv__route_step_account(s, map, ni, acct);
        for (size_t k = 0; k < ni; k++) {
            srq *r = map[k];
            if (ikv_seq_pending(r->seq) || r->state != SRQ_RUNNING || r->job)
                continue; /* still prefilling; a chunks job samples when it is done (below) */
            if (r->replaying) { /* after a preemption: feed what it generated, as before */
                r->next = r->all[r->n + r->replay++];
                r->replaying = r->replay < r->ntok;
                continue;
            }
            if (r->ntok == 0 && r->spec.semantic && s->rcache) {
                /* the first token: the response cache's candidate, if the model takes it */
                uint32_t tok;
                (void)ikv__spec_first(s, r, &tok); /* ENOMEM: no candidate, tok sampled */
                size_t idx = 0;
                while (idx < s->nrunning && s->running[idx] != r)
                    idx++;
                IKV_ASSERT(idx < s->nrunning);
                take_token(s, idx, tok);
                continue;
            }
            take_step(s, r, &items[k]);
        }
        for (size_t k = 0; k < nb; k++) { /* structured requests that advanced */
            srq *r = s->blend_list[k];
            size_t idx = 0;
            while (idx < s->nrunning && s->running[idx] != r)
                idx++;
            IKV_ASSERT(idx < s->nrunning);
            r->cpu_s += r->blend_cpu_s, r->thread_s += r->blend_thread_s; /* its blend unit */
            if (r->job_rc == 0) continue; /* more units, or pending prefill again */
            if (r->job_rc < 0) { /* re-admitted, and a segment it reused left the store */
                snprintf(r->err, sizeof r->err, "preempted and cannot be re-admitted: %s",
                         ikv_errdetail());
                finish_running(s, idx, "length");
                continue;
            }
            ikv_blend_info b;
            ikv_chunks_job_info(r->job, &b);
            ikv__seg_end(s, r);
            if (r->preemptions) { /* usage keeps the first admission's figures */
                r->recomputed += b.prefill.computed_tokens;
            } else {
                r->blend = b; /* reused chunk tokens count as cached, with the pool's */
                r->cached = b.prefill.cached_tokens;
                r->tier_tokens[0] += b.reused_tokens;
            }
            if (r->replaying) { /* after a preemption: feed what it generated, as before */
                r->next = r->all[r->n + r->replay++];
                r->replaying = r->replay < r->ntok;
                continue;
            }
            memcpy(s->logit_scratch, ikv_seq_logits(r->seq), sizeof(float) * s->vocab);
            take_token(s, idx, ikv_sampler_sample(r->smp, s->logit_scratch));
        }
    }
    /* stopping: whatever is left is cancelled */
    while (s->nrunning) {
        s->running[0]->cancelled = 1;
        finish_running(s, 0, NULL);
    }
    while (s->qhead) {
        srq *r = queue_pop(s);
        fail_queued(s, r, 503, "server stopping");
    }
    pthread_mutex_unlock(&s->mu);
    ikv_free(items);
    ikv_free(map);
    ikv_free(acct);
    return NULL;
}
