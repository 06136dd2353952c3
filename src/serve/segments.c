/*
 * Structured (segments) requests in the scheduler: admission, the blend pass between steps,
 * preemption.
 *
 * A structured request is admitted as a chunks job (ikv_chunks_admit): its exact part — the
 * whole prompt when nothing is reused, else the segments before the first reused one, through
 * the prefix cache — is pending prefill like any prompt, chunked into the batched steps beside
 * the other sequences' decodes. Once that part is done, the blend pass runs one unit per
 * scheduler turn, right after the step, outside the lock (the engine is the scheduler
 * thread's): a unit is one stage of one layer (Q/K/V, or attention + FFN) over at most
 * SRV_BLEND_ROWS active rows (8x for the cheaper Q/K/V stage), so a decode step of the other
 * sequences waits at most about a plain prompt chunk's work, never the whole pass. The row
 * count is fixed per server, so the pass's bits never depend on what else runs. One pass runs at
 * a time (the scratch is sized for one); another request whose exact part is done waits.
 * When the guard abandons a pass, the rest of the prompt becomes pending prefill, chunked like
 * any other.
 *
 * Preemption: a structured request may be a victim like any other. Its job ends with its
 * sequence; re-admitted, it asks the chunk store for exactly the segments it reused the first
 * time (hits_in), so it gets the same K/V and its replayed tokens and its output go on
 * bit-identical; if one of those segments has left the store meanwhile it ends, like a
 * preempted request that no longer fits, with what it generated.
 */
#include "internal.h"

/* Active rows per unit of a blend pass (its attention + FFN stage; the Q/K/V stage takes 8x):
 * fixed per server, so a request's bits never depend on what else runs. 4 x --max-batch-tokens
 * rows of one layer are at most about the work of a plain prompt's chunk of --max-batch-tokens
 * positions through every layer on models like `small` (a row of that stage: attention over
 * ~4k positions + FFN, about a sixth of a position through all 8 layers). */
#define SRV_BLEND_ROWS(s) ((size_t)(s)->opt.max_batch_tokens * 4)

#include <string.h>

int ikv__seg_admit(ikv_serve *s, srq *r, ikv_seq **seq, ikv_prefill_info *info) {
    if (!r->seg_hits && !(r->seg_hits = ikv_calloc(r->nsegs, 1)))
        return ikv_error(IKV_ENOMEM, "out of memory (segment hits)");
    ikv_blend_request br = {.segs = r->segs,
                            .n_segs = r->nsegs,
                            .tenant = r->scope,
                            .ratio = r->blend_ratio,
                            .max_dev = -1,
                            .max_new = r->max_tokens,
                            .reserve_new = SRV_HEADROOM, /* then block by block, as others */
                            .hits = r->seg_hits,
                            .hits_in = r->preemptions > 0};
    ikv_blend_job *j;
    int rc = ikv_chunks_admit(s->chunks, &br, &j);
    if (rc) return rc;
    r->job = j;
    *seq = ikv_chunks_job_seq(j);
    ikv_blend_info b;
    ikv_chunks_job_info(j, &b);
    *info = b.prefill;
    return 0;
}

int ikv__seg_waiting(const srq *r) {
    return r->job && !ikv_seq_pending(r->seq);
}

void ikv__seg_advance(ikv_serve *s, srq *r) {
    ikv_blend_info b;
    ikv_chunks_job_info(r->job, &b);
    double t0 = ikv_now();
    r->job_rc = ikv_chunks_advance(s->chunks, r->job, SRV_BLEND_ROWS(s));
    double dt = ikv_now() - t0;
    size_t before = b.blend_units;
    ikv_chunks_job_info(r->job, &b);
    if (b.blend_units > before) r->blend_turns++; /* a turn that ran a unit of the pass */
    if (dt > r->blend_step_s) r->blend_step_s = dt;
}

void ikv__seg_end(ikv_serve *s, srq *r) {
    ikv_chunks_job_end(s->chunks, r->job);
    r->job = NULL;
}
