/*
 * Generation with drafts (ikv_respcache_generate): the loop `isokv run` and the benchmarks use
 * to serve a response-cache hit or prompt-lookup drafts through ikv_engine_verify.
 *
 *     tok = candidate verify (no lead)  |  sample(prompt logits)
 *     loop: stop? emit tok; draft = candidate continuation | lookup | none
 *           verify(lead = tok, draft) -> accepted (emitted as one burst), next; tok = next
 *
 * A verify with a lead and no draft is exactly a decode step, so without drafts this is plain
 * decoding; with them, each accepted token replaces one decode step. Stops, the token limit and
 * seq_len act on every token as in plain decoding (drafts are cut to what may still be
 * emitted), so greedy output is token-for-token the plain output. Candidate drafts start at 8
 * tokens and double after every fully accepted chunk (the whole output at once for an
 * identical prompt), which bounds the rows a wrong candidate wastes.
 */
#include "isokv/respcache.h"

#include <string.h>
#include <time.h>

static double thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int is_stop(uint32_t t, int stop_eos) {
    return t == IKV_TOK_BOS || (stop_eos && t == IKV_TOK_EOS);
}

static uint32_t argmax(const float *x, size_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < (uint32_t)n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static size_t min3(size_t a, size_t b, size_t c) {
    size_t m = a < b ? a : b;
    return m < c ? m : c;
}

int ikv_respcache_generate(ikv_engine *e, ikv_seq *s, ikv_sampler *sp, const ikv_gen_options *o,
                           uint32_t *hist, size_t np, ikv_gen_result *r) {
    const ikv_model_config *c = ikv_model_cfg(ikv_engine_model(e));
    const size_t V = (size_t)c->vocab_size, maxd = o->max_draft ? o->max_draft : 64;
    uint32_t *out = hist + np;
    memset(r, 0, sizeof *r);
    r->cand_used = -1;
    double t0 = ikv_now(), c0 = thread_cpu();
    const int greedy = ikv_sampler_temperature(sp) == 0.0f;
    const ikv_respcache_hit *cand = NULL;
    size_t g = 0;
    uint32_t tok;
    int done = 0, rc;
    if (o->n_cands && o->max_tokens) {
        const float *lg = ikv_seq_logits(s);
        const uint32_t want = greedy ? argmax(lg, V) : 0;
        for (size_t i = 0; i < o->n_cands && !cand; i++)
            if (o->cands[i].n_output && (!greedy || o->cands[i].output[0] == want))
                cand = &o->cands[i], r->cand_used = (int)i;
    }
    /* candidate drafts grow: 8 tokens, doubled after each fully accepted chunk (so a wrong
     * candidate wastes at most 8 rows and then at most as many as were accepted), or the whole
     * output at once when the prompt is the same (Jaccard 1) */
    size_t ck = cand && cand->similarity >= 0.999 ? maxd : 8;
    if (cand) {
        size_t k = min3(cand->n_output, maxd < ck ? maxd : ck, o->max_tokens);
        if (k > ikv_seq_room(s)) k = ikv_seq_room(s);
        ikv_verify v = {.draft = cand->output, .k = k, .sampler = sp};
        if ((rc = ikv_engine_verify(e, s, &v))) return rc;
        r->forwards += v.rows > 0;
        r->cand_verified = 1;
        r->cache_accepted += v.accepted;
        r->cache_rejected += k - v.accepted;
        if (v.accepted == k) ck *= 2;
        size_t a = 0;
        while (a < v.accepted && !is_stop(cand->output[a], o->stop_eos))
            out[g++] = cand->output[a++];
        if (a && o->emit) o->emit(o->emit_ctx, out, a);
        done = a < v.accepted;
        tok = v.next;
    } else {
        float *lg = (float *)ikv_seq_logits(s);
        tok = ikv_sampler_sample(sp, lg); /* overwrites the logits, as plain decoding does */
    }
    while (!done && g < o->max_tokens) {
        if (is_stop(tok, o->stop_eos)) break;
        out[g++] = tok;
        if (o->emit) o->emit(o->emit_ctx, &tok, 1);
        if (g >= o->max_tokens || ikv_seq_len(s) >= (size_t)c->seq_len) break;
        size_t room = ikv_seq_room(s);
        if (!room) break;
        size_t kmax = min3(maxd, o->max_tokens - g, room - 1), k = 0;
        uint32_t draft_buf[256];
        const uint32_t *draft = NULL;
        int from_cand = 0;
        if (cand && g < cand->n_output && !memcmp(out, cand->output, sizeof(uint32_t) * g)) {
            draft = cand->output + g;
            k = min3(cand->n_output - g, kmax, ck);
            from_cand = 1;
        } else if (o->lookup_ngram && kmax) {
            size_t kk = o->lookup_k < kmax ? o->lookup_k : kmax;
            if (kk > 256) kk = 256;
            k = ikv_lookup_draft(hist, np + g, o->lookup_ngram, o->lookup_min, kk, draft_buf);
            draft = draft_buf;
        }
        ikv_verify v = {.has_lead = 1, .lead = tok, .draft = draft, .k = k, .sampler = sp};
        if ((rc = ikv_engine_verify(e, s, &v))) return rc;
        r->forwards++;
        if (from_cand) {
            r->cache_accepted += v.accepted;
            r->cache_rejected += k - v.accepted;
            if (v.accepted == k) ck *= 2;
        } else {
            r->lookup_drafted += k;
            r->lookup_accepted += v.accepted;
        }
        size_t a = 0, g0 = g;
        while (a < v.accepted && !is_stop(draft[a], o->stop_eos))
            out[g++] = draft[a++];
        if (a && o->emit) o->emit(o->emit_ctx, out + g0, a);
        if (a < v.accepted) break;
        tok = v.next;
    }
    r->n_out = g;
    r->seconds = ikv_now() - t0;
    r->cpu_seconds = thread_cpu() - c0;
    return 0;
}
