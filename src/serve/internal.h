/*
 * Internals of the serve module (not a public header).
 *
 * Threads and ownership:
 *
 *   HTTP threads (libmicrohttpd, one per connection)        scheduler thread (sched.c)
 *   parse + validate -> srq (refs 2) --> queue  ----------> admit (engine) -> running[]
 *   wait / stream  <------ text, state, usage (under mu) <-- step, sample, detokenize, stop
 *   drop ref (disconnect -> cancelled)                       end (engine), drop ref
 *
 * One mutex (s->mu) guards the queue, every request's shared fields and the metrics; the engine
 * is touched only by the scheduler thread, outside the lock during a forward step. A request is
 * freed when both sides dropped their reference.
 */
#ifndef ISOKV_SERVE_INTERNAL_H
#define ISOKV_SERVE_INTERNAL_H

#include "isokv/model.h"
#include "isokv/plan.h"
#include "isokv/respcache.h"
#include "isokv/serve.h"

#include <pthread.h>

enum { SRQ_QUEUED = 0, SRQ_RUNNING, SRQ_DONE };
#define SRV_MAX_STOP    4
#define SRV_MAX_PROMPTS 16 /* prompts of one completion request (a list of strings) */
#define SRV_MAX_TENANTS 64 /* metric label sets kept per tenant; more share "other" */
#define SRV_HEADROOM    16 /* decode positions admission reserves blocks for (then block by block) */
#define SRV_MAX_THREADS 64 /* steps-by-thread-count metric slots (more count in the last) */

/* What a request's routed step sets in its real configuration (route.c). */
typedef struct srv_levers {
    int threads; /* forward threads of every step it takes part in (1, or the engine's all) */
    int rcache;  /* may take a verified draft from the response cache */
    int spec;    /* speculative decoding (prompt-lookup drafts) allowed */
} srv_levers;

/* One item's share of the grouped step it ran in (route.c). */
typedef struct srv_acct {
    double cpu_s, thread_s; /* measured CPU seconds; wall x threads */
    int threads;            /* threads the engine ran the group on */
    int first;              /* the group's first item (counts the group once) */
} srv_acct;

/* Per-request speculative decoding: the switches a request runs with (set once at parse from
 * the server's defaults, its route and its "isokv" fields; read-only after). The draft of each
 * decode step comes from the response cache's candidate while the output follows it, else
 * from prompt lookup; it is verified as extra rows of the batched step (ikv_step_item.draft),
 * so the output is exactly what decoding without it gives (greedy: the same tokens). */
typedef struct srv_spec {
    int lookup;         /* 1: prompt-lookup drafts (n-gram ngram..1, k tokens a step) */
    int semantic;       /* 1: the response cache proposes a candidate's output as the draft */
    uint32_t ngram;     /* lookup n-gram length (3) */
    uint32_t k;         /* lookup draft tokens a step (8) */
    uint32_t min_ngram; /* shortest match that drafts (2) */
} srv_spec;

typedef struct srq {
    uint64_t id;
    int chat, stream, include_usage, ignore_eos;
    char *tenant; /* tenant name (metrics, log) */
    char *scope;  /* engine scope: tenant, or tenant + 0x1f + cache_salt */
    uint32_t *tokens;
    size_t n, public_tokens;
    /* "isokv": {"segments": [...]}: segs[i].tokens point into tokens; NULL for a plain prompt */
    ikv_prompt_seg *segs;
    size_t nsegs;
    float blend_ratio; /* -1: the store's default */
    ikv_blend_info blend; /* scheduler: what the chunks job reported (first admission) */
    ikv_blend_job *job;   /* scheduler: from admission to the first token's logits (segments.c) */
    int job_rc;           /* the last ikv_chunks_advance */
    uint8_t *seg_hits;    /* [nsegs] segments reused at the first admission (re-admission) */
    double blend_step_s;  /* longest blend unit run in one scheduler turn (measured) */
    double blend_cpu_s;   /* CPU seconds of its last blend unit (scheduler + workers, measured) */
    double blend_thread_s; /* and its thread-seconds (wall x threads) */
    size_t blend_turns;   /* scheduler turns (each after a step) that ran a blend layer */
    int public_from_file; /* the public part is the --public-prefix text */
    uint32_t max_tokens;
    float temperature, top_p;
    uint64_t seed;
    char *stop[SRV_MAX_STOP];
    int nstop;
    char *user;
    double t_arrive;      /* ikv_now() at arrival */
    double t_admit;       /* ikv_now() at its first admission (0: not yet) */
    double t_arrive_wall; /* time(NULL) at arrival (the answers' `created`) */

    /* shared (under mu) */
    int state, cancelled, refs;
    char *text;                 /* generated text, committed bytes [0, tlen) */
    size_t tlen, tcap, raw_len; /* raw_len: bytes generated (text holds them all; tlen commits) */
    uint32_t ntok;
    const char *finish; /* "stop" | "length" | NULL while running */
    size_t cached, partial;
    size_t tier_tokens[IKV_MAX_TIERS]; /* cached prompt positions by tier (0 = the pool) */
    size_t tier_recomputed, lossy;     /* found in a lower tier but recomputed; via q8 */
    /* routing (set at parse, read-only after): class, SLO, the router's decision; prio is the
     * lever the step maps onto (the step itself: higher admits and prefills first) */
    int cls, has_class;
    double slo_ms;
    ikv_route_decision route;
    int prio;
    srv_levers lv;   /* the step's levers (route.c) */
    double cpu_s;    /* CPU seconds (scheduler + engine workers) of its steps, by its share */
    double thread_s; /* thread-seconds (wall x threads) of its steps, by its share */
    int threads_max; /* most threads the engine ran any of its steps on */
    /* preemption: the prompt and the tokens generated so far ([n + max_tokens], allocated at
     * its first admission). A preempted request is re-admitted with its prompt, then its
     * generated tokens all[n + replay] are fed back through decode steps (replay < ntok) before
     * it samples again, so every position is computed by the path that computed it first */
    uint32_t *all;
    uint32_t preemptions, replay;
    int replaying; /* 1 from a preemption until all[n + replay] reaches ntok */
    size_t recomputed; /* positions recomputed after preemptions (prefill and replayed) */
    double t_first, t_done;
    int status; /* 200, or an HTTP error decided by the scheduler */
    char err[256];
    pthread_cond_t cv;    /* the leader's wakes its connection thread */
    pthread_cond_t *wake; /* the condition to broadcast: its own, or its group leader's */
    struct srq *leader;   /* prompt 0 of its request (holds a reference), or NULL */

    /* scheduler only */
    ikv_seq *seq;
    ikv_sampler *smp;
    uint32_t next;  /* token to decode next */
    uint32_t prev;  /* previous token (detokenizing) */
    uint32_t *otok; /* [max_tokens] output token ids (kept for the response cache) */
    srv_spec spec;  /* speculative decoding switches (above) */
    uint32_t *cand; /* [ncand] the response cache's candidate output (a copy), or NULL */
    size_t ncand;
    uint32_t cand_id; /* its entry id (ikv_respcache_used) */
    int cand_on;      /* 1 while the output so far equals cand's first tokens */
    size_t cand_chk;  /* output tokens compared with cand so far */
    size_t cand_k;    /* its next draft's length at most: 8, doubled after each fully accepted
                         one (the whole output at once for the same prompt) */
    uint32_t *dbuf;   /* [spec.k] lookup draft of the current step */
    size_t spec_steps, spec_draft, spec_accepted; /* steps with a draft, draft tokens proposed,
                                                     accepted (both sources) */
    int sem_done;   /* the response cache was consulted */
    size_t sem_cands, sem_accepted, sem_rejected, sem_saved; /* candidates, draft tokens
                       accepted / rejected, decode steps saved (accepted - 1 per verify) */
    struct srq *qnext;
} srq;

/* Counters of one tenant. */
typedef struct srv_tenant_stats {
    char name[64];
    uint64_t req_by_status[8]; /* 200, 400, 401, 404, 413, 429, 503, other */
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    uint64_t cached_by_tier[IKV_MAX_TIERS]; /* cached_tokens split by tier (0 = the pool) */
} srv_tenant_stats;

#define SRV_HIST_BUCKETS 14
typedef struct srv_hist {
    uint64_t count[SRV_HIST_BUCKETS + 1]; /* per bucket, the last is +Inf */
    double sum;
    uint64_t n;
} srv_hist;

typedef struct srv_metrics {
    srv_tenant_stats tenants[SRV_MAX_TENANTS + 1];
    size_t n_tenants;
    uint64_t http_by_status[8]; /* every response, tenant or not */
    srv_hist ttft, tpot, e2e;
    uint64_t steps, step_rows, step_prefill_tokens, cancelled, preempted;
    /* response cache */
    uint64_t sem_lookups, sem_verified, sem_accepted, sem_rejected, sem_saved, sem_hits;
    /* speculative decoding in the step (lookup and response-cache drafts) */
    uint64_t spec_steps, spec_draft_tokens, spec_accepted_tokens, spec_lookup_accepted;
    ikv_respcache_stats sem;
    /* snapshots the scheduler takes after each step (the engine is its alone) */
    ikv_engine_stats eng;
    ikv_cache_stats cache;
    ikv_engine_tier_stats tiers[IKV_MAX_TIERS - 1]; /* lower tiers 1..n_tiers */
    /* routing: requests (completed, 200) per class and step, their e2e and CPU seconds */
    uint64_t route_req[3][IKV_PLAN_STEPS];
    double route_e2e_s[3], route_cpu_s[3], route_thread_s[3];
    uint64_t route_n[3];
    uint64_t route_threads[3][SRV_MAX_THREADS + 1]; /* completed requests by most threads used */
    uint64_t steps_by_threads[SRV_MAX_THREADS + 1]; /* engine steps by thread count */
} srv_metrics;

typedef struct srv_key {
    char *key, *tenant;
} srv_key;

struct ikv_serve {
    ikv_serve_options opt;
    char *model_name, *model_path, *describe;
    ikv_model *model;
    ikv_tokenizer *tok;
    ikv_engine *engine;
    ikv_chunks *chunks; /* chunk store for "isokv": {"segments": ...} requests */
    uint32_t vocab, seq_len;
    /* positions one request can ever hold: min(seq_len, the private budget of fit_blocks
     * blocks); set at create, before the first request */
    uint32_t max_fit, fit_blocks;
    size_t n_tiers;                      /* lower tiers (0: the pool alone) */
    ikv_plan_params plan;                /* the router's parameters (class caps, prices) */
    ikv_plan_result walk;                /* the walk it routes on (computed at create) */
    ikv_plan_frontier fr[3];             /* --route frontier: one per class cap */
    size_t n_fr;                         /* frontiers built (to free) */
    int max_threads;                     /* the engine's thread count */
    char tier_name[IKV_MAX_TIERS][24];   /* labels: "pool", then the store kinds (mem, file..) */
    struct MHD_Daemon *httpd;
    uint16_t port;
    pthread_t sched;
    int sched_started;

    pthread_mutex_t mu;
    pthread_cond_t sched_cv, idle_cv;
    srq *qhead, *qtail;
    size_t nqueue;
    size_t answering; /* completion requests queued whose answer is not fully sent (on_done) */
    srq **running; /* [max_seqs] */
    srq **blend_list; /* [max_seqs] scheduler: structured requests advanced after a step */
    size_t nrunning;
    int ready, draining, stopping;
    uint64_t next_id;

    srv_key *keys;
    size_t nkeys;
    char *public_text; /* --public-prefix file contents */
    size_t public_len;
    int pinned_public;     /* 1 once the public prefix's blocks are pinned */
    float *logit_scratch;  /* [vocab] scheduler's copy for the sampler */
    ikv_respcache *rcache; /* response cache (NULL when off); the scheduler's alone */
    srv_metrics met;
};

/* segments.c: structured requests in the scheduler (mu held, except advance: the scheduler
 * thread outside the lock, as the step). admit: ikv_chunks_admit for r (hits_in after a
 * preemption); 0 with *seq and the exact part's *info, or its error. waiting: r's job has no
 * prefill pending and is not done (advance it, do not decode it). advance: one unit (the blend
 * pass's next layer, or its end), result in r->job_rc, its wall time into r->blend_step_s.
 * end: frees r's job. */
int ikv__seg_admit(ikv_serve *s, srq *r, ikv_seq **seq, ikv_prefill_info *info);
int ikv__seg_waiting(const srq *r);
void ikv__seg_advance(ikv_serve *s, srq *r);
void ikv__seg_end(ikv_serve *s, srq *r);
/* route.c: the frontiers of --route frontier (one per class; errors name the class); their
 * release; the routing decision and levers of one request (pure, no allocation); the names
 * of its step and configuration; one scheduler step run grouped by thread count (mu not
 * held; reorders items/map, fills acct[n]) and its accounting (mu held); the CPU clock
 * the accounting reads (scheduler thread + engine workers). */
int ikv__route_setup_frontier(ikv_serve *s, const ikv_model_spec *m, const ikv_hw_spec *hw);
void ikv__route_free(ikv_serve *s);
void ikv__route_request(ikv_serve *s, srq *r, ikv_req_class cls);
const char *ikv__route_step_name(const ikv_serve *s, const srq *r);
const char *ikv__route_config(const ikv_serve *s, const srq *r);
void ikv__route_step_run(ikv_serve *s, ikv_step_item *items, srq **map, size_t n, srv_acct *acct);
void ikv__route_step_account(ikv_serve *s, srq **map, size_t n, const srv_acct *acct);
double ikv__route_cpu_now(const ikv_serve *s);
/* spec.c: speculative decoding in the scheduler (mu held).
 * ikv__spec_first: the prompt of r is done and its first token not sampled: looks up the
 * response cache (spec.semantic) and keeps a copy of the best candidate; returns the first
 * token (the candidate's when the acceptance rule takes it, else a sample). Returns 0 or
 * IKV_ENOMEM (no candidate kept; *tok still set).
 * ikv__spec_draft: the draft for r's next decode step (after its lead r->next), at most kmax
 * tokens: the candidate's continuation while the output follows it, else a prompt-lookup
 * draft; blocks for it reserved (shorter when the private budget is short, never a
 * preemption). Returns its length (0: none) and sets *draft.
 * ikv__spec_done: records a step's verified draft (k proposed, `accepted` kept). */
int ikv__spec_first(ikv_serve *s, srq *r, uint32_t *tok);
size_t ikv__spec_draft(ikv_serve *s, srq *r, size_t kmax, const uint32_t **draft);
void ikv__spec_done(ikv_serve *s, srq *r, const uint32_t *draft, size_t k, size_t accepted);

/* sched.c: the scheduler thread's body. */
void *ikv__serve_sched(void *arg);
/* Drops one reference to r (mu held); frees it at zero. */
void ikv__srq_unref(ikv_serve *s, srq *r);
/* Records a finished HTTP response in the metrics (mu held). tenant may be NULL. */
void ikv__metrics_response(ikv_serve *s, const char *tenant, int status);
/* Records a completed request (mu held). */
void ikv__metrics_request(ikv_serve *s, const srq *r);
/* Writes the Prometheus text of the metrics (mu held) into a malloc'd string. */
char *ikv__metrics_text(ikv_serve *s, size_t *len);
/* Index 0..7 of a status in the by-status arrays. */
int ikv__status_slot(int status);
extern const int ikv__status_codes[8];

#endif
