/*
 * value: the cost-aware eviction policy of isokv — evict the block whose next use is predicted
 * farthest beyond what the cache can wait for, where a block's prediction comes from the reuse
 * gaps of its own chain, a chain that has never been reused (or a fork off a shared prefix) is
 * predicted far, and a dearer block is predicted a little nearer.
 *
 * Class split (split=1, the default since issue 15). The blocks are split as ARC splits them
 * (Megiddo & Modha, FAST'03, Fig. 4; arc.c): T1 holds blocks not hit since they entered the
 * tier, T2 blocks hit there or back from a ghost; B1/B2 are exact ghost lists of the keys
 * evicted from T1/T2 (ghostq.h); the target p of |T1| adapts on ghost hits before REPLACE,
 * with ARC's tie and directory rules. value changes only the order inside the classes:
 *
 *     T1 heap: K(b) below, with T1's own horizon (t1key=1)    T2 heap: last access (t2key=0)
 *     REPLACE: T1's top if |T1| > p (ARC), else T2's top; the other heap's if it has none
 *
 * so among the blocks of T1 (unproven first blocks, forks, new tails inheriting their chain's
 * gap) the ones predicted back soonest, and the dearer ones, stay longest, while ARC's
 * frequency split keeps what is reused twice away from one-hit blocks. Measured (token hit
 * ratio, simulated; docs/policies.md, scripts/policy_grid.sh): best online policy in more of
 * the 34 short-capacity cells than any baseline, within 1.3 points of the best baseline in
 * every cell (the single-heap value below was up to 17.7 points behind on synthetic scenario
 * B), but not ahead of every baseline everywhere: ARC leads in some WEKA and Mooncake cells,
 * S3-FIFO and SIEVE in synthetic B and A shared-first. split=1,t1key=0,new=0,lru2=0,cost=0 is
 * ARC exactly (test_value_split_is_arc). Options measured and not default: t2key=1 (T2 by
 * the prediction too), t2in=1 (a block inheriting a T2 parent's gap enters T2; t2in=2: only
 * where the parent ended its previous access), tlfu=T (a TinyLFU count-min sketch, sketch.h:
 * a block seen T times within its window enters T2).
 *
 * The single heap (split=0, the default before issue 15) orders every evictable block by K:
 *
 * Key of a block b, set at every access (insert or hit); the victim is the evictable leaf with
 * the smallest key (min-heap, O(log n) per event):
 *
 *     K(b) = last(b) - max(0, gap(b) - H) + cost * gbar * ln(c(b) / c0)
 *
 *   last(b)  the time of b's last access (ikv_access.now).
 *   gap(b)   b's predicted inter-reference gap:
 *            - proven (hit in this tier): its own gaps, smoothed: at each hit, gap <- (1 -
 *              smooth) * gap + smooth * (now - last) (the first hit sets it);
 *            - inherited: a block inserted as the only resident child of its parent takes the
 *              parent's gap. In a prefix cache the next use of a conversation's new tail is that
 *              conversation's next request, which re-reads the whole chain, so the chain's
 *              history is the tail's best predictor;
 *            - unproven, gap = new * gbar: a first block, a block under an unproven parent, and
 *              a fork — a block inserted beside a resident sibling. A parent with several
 *              children has its reuses shared among them (a system prompt under which every
 *              user's memory hangs, a user's memory under which each request's documents
 *              hang), so its gap says nothing about one new child.
 *   H        the horizon: now - K(last victim), how far back the eviction frontier stands. A
 *            block keyed at its access time (no offset) is kept about H; a block predicted back
 *            within H needs no help and is ordered by recency, as in LRU; only the part of a
 *            gap beyond H moves a block ahead in the eviction order. 0 until the first
 *            eviction.
 *   gbar     running mean of observed gaps, over all hit blocks (exponential, weight 2^-10 per
 *            block hit: in a trace of long chains, the gaps of the last one or two requests).
 *   c(b)/c0  b's recompute cost per token (the cache's cost callback at b's depth) over that of
 *            a first full block: >= 1 with attention-shaped costs (up to ~3.4 at 128 k tokens of
 *            context for llama3-70b on the roofline model; depth + 1 with the core's default).
 *   cost     weight of the cost term (default 0.1): a block k times dearer per token is kept as
 *            if it had been used cost * ln(k) mean gaps later.
 *
 * Why. With H = 0, last - gap is the time of the block's previous-but-one use, smoothed: the
 * order is LRU-2 (O'Neil, O'Neil & Weikum, SIGMOD'93), read as a Belady estimate (evict the
 * farthest next use; Belady 1966) with next use = last + gap. The horizon turns that estimate
 * into a decision rule: what matters is not when a block comes back but whether it comes back
 * before the cache would drop it anyway. When the cache holds every live session a little
 * longer than their gaps (capacity barely short), every prediction falls inside H and value
 * is LRU, which is hard to beat there; when many ~100 k-token conversations interleave in a
 * cache that holds a few, gaps exceed H and value predicts unproven chains 4 mean gaps away,
 * keeping a stable set of conversations that keep coming back, as ARC's T1/T2 split and
 * LIRS's HIR/LIR split do (Megiddo & Modha, FAST'03; Jiang & Zhang, SIGMETRICS'02); the
 * inherited gap keeps the new tails of those conversations with their chains (ARC would put
 * them in T1 and evict them first). The fork rule keeps the inheritance for chains that grow
 * at their end and stops it where a shared prefix fans out: without it, every request's
 * never-reused documents under a reused prefix looked as live as the prefix. The cost term is
 * GreedyDual's idea (Young 1994; Cao & Irani's GreedyDual-Size 1997; Cherkasova's GDSF 1998,
 * which `gdsf` implements) in time units, with a logarithm so that a deep block's price buys
 * bounded extra life.
 *
 * Measured (simulated, token hit ratio, order mode; docs/simulator.md, docs/synthetic.md): on
 * WEKA at 0.5 M and 2 M tokens with 64, 128 and 355 conversations above lru, s3fifo and sieve
 * in all six cells (at 2 M / 64 by 0.02 points: a tie, as wherever capacity is barely short,
 * within 0.1-0.3 points of lru either way); above the exact arc (Fig. 4, 2026-12-01) in
 * three of the six (arc leads by 1.0, 0.2, 0.3 points at 0.5 M / 128, 0.5 M / 355, 2 M / 355)
 * and below it on the Mooncake traces at 1 M and 3 M; opt is 3-17 points higher. On the synthetic
 * many-apps scenario (500 apps, 1 M tokens) level with lru up to 1,000 users and 1.3-1.8 points
 * above it at 10,000 and 100,000 (three seeds; arc is 7-18 points above value there); the previous
 * version was 3-6 points below lru there. horizon=0,fork=0 gives the previous version exactly.
 *
 * Tried and rejected (token hit ratio on the same cells; the variants marked * were measured
 * on development builds whose knobs were not kept): ordering by last + gap (farthest
 * predicted use first: overdue, finished chains are then kept; 0.09 at 2 M / 355);
 * GreedyDual with 1/gap as the price (lru-like); the unproven penalty as a multiple of the
 * horizon instead of gbar (it shrinks with itself: lru-like); adapting `new` from ghost hits,
 * ARC-style (it drifts to the wrong end); * adapting it to equalise hits near the eviction
 * frontier per class (too few such hits to steer it: 0.39 instead of 0.41 at 2 M / 355, 5-7
 * points below lru on the synthetic scenario); * adapting it from a sample of unpenalised
 * "probe" chains (noisy: 0.36-0.37 at 2 M / 355); * inheriting only where the parent ended
 * its previous access (+2 to +4.5 points more on the synthetic scenario without the horizon,
 * +0.3 with it; -0.5 to +0.4 on WEKA); * a fork's gap as the parent's gap times its children (+0.2
 * over lru on the synthetic scenario, against +1.4-1.7 for the fork rule); * a soft horizon, gap^2
 * / (gap + H) (-0.7 to +0.3 on WEKA at 2 M); * a smoothed horizon (EWMA over victims, weight 2^-10
 * to 2^-2: within +-0.3 of the last victim's key, which is simpler); a smoother gbar (weight 2^-14
 * or 2^-17 per block hit, or one sample per request: 0.36-0.39 at 2 M / 355 before the horizon,
 * 0.38 with it); the cost as a divisor of the gap, or as a credit in units of the eviction horizon
 * (up to 10 and 6 points of token hits lost at 2 M / 355).
 *
 * Ghost feedback (ghost=W > 0, off by default; issue 15): an exact ghost (ghostq.h) of the
 * last c evicted keys; a block that misses while its key is there comes back proven, with a
 * gap of W horizons, which its children inherit. +0.3 to +1.7 points where many chains return
 * just after being dropped, -0.8 to -1.3 where value keeps a stable set of conversations
 * (docs/simulator.md); hence not the default. ARC-style adaptation of `new` from which of two
 * ghost lists (evicted unproven / proven) is hit was tried in both directions and lost to the
 * fixed default (2 M / 355: 0.33 and 0.416 against 0.419); removed.
 *
 * Expert mix (mix=1 or 2, off by default; issue 15; LeCaR, Vietri et al., HotStorage'18;
 * CACHEUS, Rodriguez et al., FAST'21): two experts propose a victim at every REPLACE, expert 0 the
 * split's (T1's or T2's top) and expert 1 the single heap's, the smallest K (split=0's key,
 * with its own horizon: K of the last victim) among `sample` evictable blocks drawn from both
 * heaps with a seeded xorshift stream (no second heap position: the 24 bytes of policy fields
 * are full). The victim is the proposal of the expert drawn by weight (mix=1) or of the
 * heavier one (mix=2, expert 0 on a tie); where they differ its key goes to that expert's
 * list of an exact ghost of c keys, and a miss found there multiplies that expert's weight by
 * exp(-lr) (default 0.45, LeCaR's), renormalised, each >= 0.001. Measured and lost
 * (docs/policies.md): the experts' penalties come out about equal, the weights swing, and
 * each expert's evictions spoil the other's order (2M / 355: 0.408 against 0.427 split, 0.419
 * single heap; synthetic B personal-first 100,000 users: 0.177 against 0.313 and 0.159).
 *
 * How the response ended (hint=1, 2 or 3, off by default; issue 15): the caller's ikv_access.hint
 * says the request's response ended its turn (IKV_HINT_TURN: the chain waits for a person, or
 * is done) or left a tool call pending (IKV_HINT_SOON: back within seconds). hint=1 dooms a
 * block whose latest access ended a turn (k - DOOM: before every block whose client is
 * expected back; from either class, as oracle's and pred's doomed blocks); hint=2 in T1 only,
 * hint=3 in T2 only. Measured (docs/policies.md): WEKA gap closed 21% against 15%, best online
 * in 5 of the 6 WEKA cells against 3; no other trace carries the hint.
 *
 * Hit density (hd=1, 2 or 3, off by default; issue 15): LHD's learned model (hdmodel.h; Beckmann
 * et al., NSDI'18; the `lhd` policy) orders T1 (hd=1), T2 (hd=2) or both (hd=3): the class's
 * victim is the least dense of `hdsample` (64) blocks drawn from that heap's slots (the heap
 * order itself is then unused). Classes: the core's hit count x a back bit (admitted from
 * B1/B2) x a root bit x the predicted gap's bucket against T1's horizon (unproven, within
 * half of it, within twice it, beyond). Every hit and eviction is evidence; a B1/B2 hit takes
 * the eviction back and counts the hit it would have been (8 bytes per ghost slot: last
 * access, age at eviction, class). Measured (docs/policies.md, 34 cells): hd=1 is above the
 * default in 28 of the 34 cells and the best online policy in 17 (default: 9), but below the
 * default in five of the six WEKA cells (WEKA gap closed 10% against 15%; worst cell -1.67
 * points against -1.29) and ~5x slower per insert with eviction (sampled node reads); hd=2 and
 * hd=3 are worse. Not the default.
 *
 * Oracle diagnostics (oracle=1..7, simulator only, never an online policy; docs/policies.md,
 * "What the WEKA gap is made of"): the replay passes next-use times as for opt (sim/replay.c
 * switches them on for a spec with "oracle="), and a block with no future use (1; 2: whose
 * conversation has no further request) or no use within its class's horizon (3; 5 / 6: in T1 /
 * T2 only) is doomed: keyed k - DOOM and evicted first from either class; 4 (split=0) keys by
 * the farthest next use, opt exactly. On the six WEKA cells the horizon bit closes 64% of the
 * lru -> opt gap, the dead-block bit 31%, the dead-conversation bit 24% (value: 15%).
 * oracle=7 (with nu=1,nusess=1,num=0) is the feature-limited oracle (ob_key): the horizon
 * bit as well as any rule over the online features could guess it, each bucket's doom rate
 * learned from the true bits of every request already served: 23% of the WEKA gap.
 *
 * Reuse predictor (pred=T > 0, off by default; issue 15): the online stand-in for oracle=3.
 * P(reused within the horizon | class) per class (ARC class x the core's hit count x the
 * predicted gap against the class's horizon; prdepth=1 adds the depth; prcls=1 / 2 dooms in
 * T1 / T2 only, 3 in both), from hits (yes) and
 * evictions of the pending victim (no), a B1/B2 hit within the horizon turning a no into a
 * yes (8 bytes per ghost slot: last access, class), counts halved every prperiod events. A
 * block whose class's P is below T x the mean P is doomed as by the oracle (relative: an
 * absolute threshold doomed every class where the policy itself evicts all before reuse).
 * Measured: WEKA gap closed 15-16% (the default's 15%; prcls=2 above the default in 16 of
 * 34 cells, below in 4 by <= 0.06 points), not the default (docs/policies.md).
 *
 * Next-use predictor (nu=1, off by default; issue 15; nextuse.h; relaxed Belady as in LRB,
 * Song et al., NSDI'20): per node, in side arrays indexed by node id (the pol area is full),
 * the times of its last 4 accesses, a new tail inheriting its parent's history (same rule as
 * the gap); the predicted gap is the largest of the last nugaps (3) gaps (numode=1; 0 the last,
 * 2 the mean, 3 the smallest; nuew=1 value's smoothed gap instead); nusess=1: a block with no
 * gap of its own (a first block, a chain re-inserted after its eviction) takes its session's
 * last turn gap (ikv_access.scope; a direct-mapped table of 2^12-2^20 entries, 16 bytes each).
 * At every access a block in a class of nucls (1 T1, 2 T2, 3 both; nuown=0: in T2 only by a
 * session gap) whose predicted gap exceeds num (1) x its class's horizon is doomed (keyed
 * k - DOOM, evicted first from either class, as oracle=3's doomed blocks); nuk=K > 0 (off by
 * default): a block older than K x its predicted gap is overdue and evicted next (a min-heap of
 * deadlines over the evictable blocks); nughost=1: a block back from B1/B2 resumes its last
 * two access times from its ghost slot (8 bytes per slot); nuadapt=LR: num moves by exp(+-LR)
 * on ghost hits of the predictor's evictions within the horizon (up) and of live ones within
 * twice it (down). 16 bytes per node; nuk > 0: 24 per node + 8 per block of capacity;
 * nusess: + the session table; nuadapt: 5 per ghost slot. Measured (docs/policies.md): a
 * block that is hit was by survival back within its horizon, so its own history alone almost
 * never predicts "beyond" (nu=1 alone ~ value on WEKA); the session gap carries the
 * information: nu=1,nusess=1,num=1.25,nucls=1 closes 17% of the WEKA gap (value 15%), best
 * online in 9 of 34 cells like value; not the default.
 *
 * Parameters: split (1 default, 0 = one heap), t1key (1 default; 0 = T1 by recency), t2key (0
 * default; 1 = T2 by K), t2in (0 default, 1, 2), tlfu (0 = off, default; 1..15), new (unproven
 * gap in mean gaps, default 4; 0 = no penalty), ghost (split=0 only; default 0), smooth (default
 * 0.5; 1 = last gap only), cost (default 0.1; 0 = cost ignored), lru2 (weight of gap(b) for
 * proven and inherited blocks, default 1; 0 orders them by recency alone), horizon (weight of
 * H, default 1; 0 = every gap counts in full), fork (1 = forks start unproven, default; 0 =
 * they inherit), mix (0 default, 1, 2), lr (0.45), sample (16), hd (0 default; 1, 2, 3),
 * hdsample (64), hdperiod (65536 events), hddecay (0.9), pred (0 = off; 0-1), prperiod
 * (65536), prdepth (0, 1), prcls (3; 1, 2), nu (0; 1), numode (1; 0-3), nugaps (3; 1-3), nuk
 * (0), num (1), nucls (3; 1, 2), nuown (1; 0), nusess (0; 1), nuew (0; 1), nughost (0; 1),
 * nuadapt (0), oracle (0; 1-7, simulator only), obt (0.5) and obsess (0; 1) for oracle=7.
 * value:split=0,new=0,lru2=0,cost=0 is LRU.
 *
 * Node fields: pol.u32[0] = gap (float, time units; -1 = unproven), pol.u32[1] = cost per token
 * (float), pol.u32[3] = TAG when this policy wrote them (a block demoted from a tier run by
 * another policy is recognised and starts unproven), pol.f64[2] = K (the heap position is the
 * node's hpos), pol.u32[2] = class bit and t2in=2's child marks (split=1), bits 8-14 the
 * hit-density class (hd > 0) or the predictor's class (pred > 0). Policy state: the
 * key of the last victim (for H; per class with split=1) besides gbar, ARC's p and counts.
 * Cost: O(log n) per event; split=1: 16 bytes of heap per block (one heap per class, each
 * sized for the whole tier) plus 24 of exact ghost; split=0: 8 bytes of heap; tlfu adds 4-8
 * bytes of sketch, mix 24 of expert ghost and O(sample) per eviction. Nothing allocated after
 * create.
 */
#include "../internal.h"
#include "ghostq.h"
#include "hdmodel.h"
#include "nextuse.h"
#include "sketch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TAG      0x76616c75u  /* "valu" */
#define UNPROVEN (-1.0f)      /* gap of a block whose chain shows no reuse yet */
#define GBAR_W   (1.0 / 1024) /* weight of one block hit's gap in gbar */

typedef struct value {
    ikv__heap_policy hp; /* first: the shared heap ops (ikv__hp_*) take the state as this */
    ikv_cost_fn cost_fn;
    void *cost_ctx;
    const uint64_t *now;
    uint32_t block_tokens;
    double c0;     /* cost per token of a first full block (> 0) */
    double gbar;   /* running mean of observed gaps (time units); 0 until the first hit */
    double newg;   /* unproven gap, in mean gaps */
    double smooth; /* weight of the latest gap */
    double cost;   /* weight of ln(c / c0), in mean gaps */
    double lru2;   /* weight of a proven block's own gap */
    double hzw;    /* weight of the horizon (1; 0 = a predicted gap counts in full) */
    double fork;   /* 1: a block inserted beside resident siblings starts unproven */
    double kv;     /* key of the last victim: the eviction frontier */
    int have_kv;   /* 0 until the first victim */
    /* ghost feedback (ghost > 0): keys of the last c evicted blocks */
    double ghostw; /* a returning block's gap, in horizons (0 = no ghost) */
    ikv__ghostq ghost;
    uint32_t pending; /* the last victim returned, until it leaves */
    ikv_key x;        /* the announced miss */
    int x_valid, x_hit;
    /* class split (split=1): T1 = probation heap (key: last access), hp.h = main heap (T2) */
    int split;
    double t2in; /* 1: an inheriting block is admitted into T2 (0: into T1) */
    ikv__heap h1;
    uint64_t res[2];   /* resident blocks of T1 and T2 */
    uint64_t c;        /* tier capacity in blocks */
    double p;          /* ARC's target for |T1| */
    int x_from;        /* the announced miss: -1 new, 0 in B1, 1 in B2 */
    int pending_ghost; /* the pending victim goes to B1/B2 when it leaves */
    double t1key;      /* 1: T1 is ordered by the predicted-use key too (its own horizon) */
    double t2key;      /* 1: T2 is ordered by the predicted-use key (0: by recency, ARC's T2) */
    double kv1;        /* key of the last T1 victim: T1's eviction frontier */
    int have_kv1;
    /* frequency sketch (tlfu > 0): a block seen at least tlfu times before goes to T2 */
    double tlfu;
    ikv__sketch sk;
    /* expert mix (mix > 0, split=1; LeCaR/CACHEUS style): expert 0 is the split's REPLACE,
     * expert 1 the single heap's key K (split=0) over a sample of the evictable blocks */
    double mix;    /* 0 off, 1 the expert drawn by weight, 2 the heavier expert */
    double lr;     /* a ghost hit on expert e's eviction: w[e] *= exp(-lr) */
    double sample; /* blocks sampled for expert 1 (all of them when fewer are queued) */
    double w[2];   /* expert weights, w[0] + w[1] = 1, each >= W_MIN */
    double kvs;    /* K (single-heap key) of the last victim: expert 1's horizon */
    int have_kvs;
    int pending_exp;     /* the expert whose choice the pending victim is (-1: both agreed) */
    uint64_t rng;        /* xorshift64* state, fixed seed: runs are deterministic */
    ikv__ghostq xg;      /* keys evicted by expert 0 (list 0) and by expert 1 (list 1) */
    uint64_t mix_pen[2]; /* ghost hits charged to each expert (for tests and docs) */
    /* hit density (hd > 0, split=1): LHD's model (hdmodel.h) orders T1 (hd=1), T2 (hd=2) or
     * both (hd=3) by sampling; per B1/B2 slot what the counterfactual hit needs */
    double hd;
    double hd_sample, hd_period, hd_decay;
    ikv__hd *hdm;
    uint64_t *hgd; /* per ghost slot: last access (32 bits) | age at eviction (24) | class (8) */
    /* oracle diagnostics (oracle > 0; simulator only, never an online policy): the replay
     * hands the future in ikv_access.next_use, as for opt */
    double oracle;
    double hint; /* hint=1: a block whose last access came with IKV_HINT_TURN is doomed */
    /* oracle=7: per bucket of the online features, how often the horizon bit doomed a block
     * (ob_yes) or kept it (ob_no) */
    double *ob_yes, *ob_no;   /* double: a WEKA bucket passes 2^24 counts, where float's +1 */
    double *ob_dyes, *ob_dno; /* is lost; this request's, counted when the next request starts */
    uint32_t *ob_touched;    /* buckets with pending bits */
    uint32_t ob_ntouched;
    uint64_t ob_req;         /* the request whose bits are pending */
    double ob_t;        /* doom where the bucket's learned P(doomed) exceeds this (0.5) */
    double ob_sess;     /* obsess=1: the bucket also has the session (scope hash, 512 ways) */
    uint64_t ob_doomed; /* blocks keyed as doomed by oracle=7 (tests, docs) */
    /* reuse predictor (pred > 0, split=1): P(a block is reused before its class's eviction
     * horizon | its class), learned online; a block whose P is below `pred` is doomed */
    double pred;          /* doom threshold (0 = off) */
    double pr_period;     /* evidence events between halvings of the counts */
    uint64_t pr_events;   /* events since the last halving */
    double pr_depth;      /* 1: the class includes the block's depth (3 buckets) */
    double pr_cls;        /* which ARC classes may be doomed: 1 T1, 2 T2, 3 both (default) */
    float pr_yes[128];    /* per class: hits while resident, ghost hits within the horizon */
    float pr_no[128];     /* per class: evictions (less those a ghost hit took back) */
    double pr_yes_all, pr_no_all; /* the sums over the classes */
    uint64_t pr_doomed;   /* blocks keyed as doomed (tests, docs) */
    /* next-use predictor (nu > 0, split=1; nextuse.h): per-block access history; a block
     * predicted back later than num x its class's horizon is doomed, one older than nuk x its
     * predicted gap is overdue (evicted first once evictable) */
    double nu;      /* 0 off, 1 on */
    double nu_mode; /* IKV__NU_LAST / MAX / MEAN / MIN over the last nugaps gaps */
    double nu_gaps; /* gaps the prediction reads (1-3) */
    double nu_k;    /* overdue at age > nuk x predicted gap (0: no overdue rule) */
    double nu_m;    /* doomed when the predicted gap > num x the class's horizon (0: never) */
    double nu_cls;  /* classes that may be doomed: 1 T1, 2 T2, 3 both */
    double nu_ew;   /* 1: predict with value's smoothed gap (gap_of) instead of the history */
    double nu_sess; /* 1: a block without a gap of its own takes its session's last turn gap */
    double nu_own;  /* 0: T2 blocks are doomed only by their session's gap, never their own */
    double nu_lr;   /* nuadapt: num *= exp(+-nulr) per ghost hit (0 = num fixed) */
    uint32_t *nu_glast; /* per B1/B2 slot (nuadapt): the block's last access (32 bits) */
    uint8_t *nu_gdoom;  /* per B1/B2 slot: 1 if the predictor chose that eviction */
    int nu_pdoom;       /* the pending victim was chosen by the predictor */
    double nu_ghost;    /* 1: a block back from B1/B2 resumes its history from its ghost slot */
    uint32_t (*nu_gt)[2]; /* per B1/B2 slot (nughost): the block's last two access times */
    uint32_t nu_xt[2];    /* nughost: the announced miss's ghost history (its slot may be reused
                             by the victims leaving before its admit) */
    uint64_t nu_false, nu_late; /* ghost hits: of predictor evictions within the horizon, of
                                   live evictions within twice it (num up / down) */
    ikv__nu nuu;
    uint64_t nu_doomed; /* blocks keyed as doomed by the predictor (tests, docs) */
} value;

/* oracle=1/2: the key of a block with no future use (below every real key: evicted first) */
#define DEADK (-5e14) /* at or below: doomed (oracle_key) */
#define OB_N  (2 * 4 * 8 * 8 * 3 * 4) /* oracle=7's feature buckets (ob_key) */
#define OB_NS (2 * 8 * 3 * 512)       /* obsess=1: class x session gap x hint x session */

#define NU_MMIN 0.125 /* nuadapt keeps num within [NU_MMIN, NU_MMAX] */
#define NU_MMAX 64.0
#define W_MIN 0.001 /* an expert's weight never falls below this: it can win back */

/* pol.u32[2] (split=1): bit 0 the class (T1 / T2), bits 3-4 t2in=2's record of children */
#define SPL(n) ((n)->pol.u32[2])
#define CLS(n) (SPL(n) & 1u)
#define F_KID  8u  /* a child was accessed at this block's latest access */
#define F_PKID 16u /* ... at its previous access: it did not end that request's chain */
#define HDC_SHIFT 8 /* bits 8-14: the block's hit-density class (hd > 0) */
#define HDC(n) ((SPL(n) >> HDC_SHIFT) & 127u)
#define HD_BACK 1u
#define HD_ROOT 2u /* bits 2-3: the predicted gap's bucket (value_admit) */

static inline float *gap_of(ikv__node *n) {
    return (float *)&n->pol.u32[0];
}
static inline float *cpt_of(ikv__node *n) {
    return (float *)&n->pol.u32[1];
}

/* The cost credit of a block: cost * gbar * ln(c / c0), 0 for blocks no dearer than c0. */
static inline double credit_of(const value *p, ikv__node *n) {
    double r = *cpt_of(n) / p->c0;
    return p->cost > 0 && r > 1 ? p->cost * (p->gbar > 1 ? p->gbar : 1) * log(r) : 0;
}

static int set_param(void *ctx, const char *k, const char *v) {
    value *p = ctx;
    if (!strcmp(k, "new")) return ikv__param_double("value", k, v, 0, 1e6, &p->newg);
    if (!strcmp(k, "smooth")) return ikv__param_double("value", k, v, 0.001, 1, &p->smooth);
    if (!strcmp(k, "cost")) return ikv__param_double("value", k, v, 0, 1e3, &p->cost);
    if (!strcmp(k, "lru2")) return ikv__param_double("value", k, v, 0, 1e3, &p->lru2);
    if (!strcmp(k, "horizon")) return ikv__param_double("value", k, v, 0, 1e3, &p->hzw);
    if (!strcmp(k, "ghost")) return ikv__param_double("value", k, v, 0, 1e3, &p->ghostw);
    if (!strcmp(k, "split")) {
        double v01;
        int rc = ikv__param_double("value", k, v, 0, 1, &v01);
        if (!rc && v01 != 0 && v01 != 1)
            rc = ikv_error(IKV_EPARAM, "value: split=%s must be 0 or 1", v);
        p->split = v01 == 1;
        return rc;
    }
    if (!strcmp(k, "t2in")) return ikv__param_double("value", k, v, 0, 2, &p->t2in);
    if (!strcmp(k, "t2key")) return ikv__param_double("value", k, v, 0, 1, &p->t2key);
    if (!strcmp(k, "t1key")) return ikv__param_double("value", k, v, 0, 1, &p->t1key);
    if (!strcmp(k, "tlfu")) return ikv__param_double("value", k, v, 0, 15, &p->tlfu);
    if (!strcmp(k, "mix")) return ikv__param_whole("value", k, v, 0, 2, &p->mix);
    if (!strcmp(k, "hd")) return ikv__param_whole("value", k, v, 0, 3, &p->hd);
    if (!strcmp(k, "hdsample")) return ikv__param_double("value", k, v, 1, 1024, &p->hd_sample);
    if (!strcmp(k, "hdperiod")) return ikv__param_double("value", k, v, 16, 1e12, &p->hd_period);
    if (!strcmp(k, "hddecay")) return ikv__param_double("value", k, v, 0, 1, &p->hd_decay);
    if (!strcmp(k, "pred")) return ikv__param_double("value", k, v, 0, 1, &p->pred);
    if (!strcmp(k, "prcls")) return ikv__param_whole("value", k, v, 1, 3, &p->pr_cls);
    if (!strcmp(k, "prdepth")) return ikv__param_double("value", k, v, 0, 1, &p->pr_depth);
    if (!strcmp(k, "prperiod")) return ikv__param_double("value", k, v, 16, 1e12, &p->pr_period);
    if (!strcmp(k, "hint")) return ikv__param_whole("value", k, v, 0, 3, &p->hint);
    if (!strcmp(k, "oracle")) return ikv__param_whole("value", k, v, 0, 7, &p->oracle);
    if (!strcmp(k, "obt")) return ikv__param_double("value", k, v, 0, 1, &p->ob_t);
    if (!strcmp(k, "obsess")) return ikv__param_whole("value", k, v, 0, 1, &p->ob_sess);
    if (!strcmp(k, "nu")) return ikv__param_whole("value", k, v, 0, 1, &p->nu);
    if (!strcmp(k, "numode")) return ikv__param_whole("value", k, v, 0, 3, &p->nu_mode);
    if (!strcmp(k, "nugaps")) return ikv__param_whole("value", k, v, 1, 3, &p->nu_gaps);
    if (!strcmp(k, "nuk")) return ikv__param_double("value", k, v, 0, 1e3, &p->nu_k);
    if (!strcmp(k, "num")) return ikv__param_double("value", k, v, 0, 1e3, &p->nu_m);
    if (!strcmp(k, "nucls")) return ikv__param_whole("value", k, v, 1, 3, &p->nu_cls);
    if (!strcmp(k, "nuew")) return ikv__param_whole("value", k, v, 0, 1, &p->nu_ew);
    if (!strcmp(k, "nusess")) return ikv__param_whole("value", k, v, 0, 1, &p->nu_sess);
    if (!strcmp(k, "nuown")) return ikv__param_whole("value", k, v, 0, 1, &p->nu_own);
    if (!strcmp(k, "nughost")) return ikv__param_whole("value", k, v, 0, 1, &p->nu_ghost);
    if (!strcmp(k, "nuadapt")) return ikv__param_double("value", k, v, 0, 1, &p->nu_lr);
    if (!strcmp(k, "lr")) return ikv__param_double("value", k, v, 0.001, 10, &p->lr);
    if (!strcmp(k, "sample")) return ikv__param_double("value", k, v, 1, 1024, &p->sample);
    if (!strcmp(k, "fork")) return ikv__param_whole("value", k, v, 0, 1, &p->fork);
    return ikv_error(IKV_EPARAM,
                     "value: unknown parameter '%s' (new, smooth, cost, lru2, horizon, fork, "
                     "ghost, split, t2in, tlfu, mix, lr, sample, hd, hdsample, hdperiod, hddecay, "
                     "pred, prperiod, prdepth, prcls, hint, nu, numode, nugaps, nuk, num, nucls, "
                     "nuew, nusess, nughost, nuadapt, oracle, obt, obsess)",
                     k);
}

static void value_destroy(void *s) {
    value *p = s;
    if (!p) return;
    ikv__heap_free(&p->hp.h);
    ikv__heap_free(&p->h1);
    ikv__ghostq_free(&p->ghost);
    ikv__sketch_free(&p->sk);
    ikv__ghostq_free(&p->xg);
    ikv_free(p->hdm);
    ikv_free(p->hgd);
    ikv__nu_free(&p->nuu);
    ikv_free(p->nu_glast);
    ikv_free(p->nu_gdoom);
    ikv_free(p->nu_gt);
    ikv_free(p->ob_yes);
    ikv_free(p->ob_no);
    ikv_free(p->ob_dyes);
    ikv_free(p->ob_dno);
    ikv_free(p->ob_touched);
    ikv_free(p);
}

static int value_create(const ikv__policy_env *env, const char *params, void **out) {
    value *p = ikv_calloc(1, sizeof *p);
    if (!p) return IKV_ENOMEM;
    p->newg = 4;
    p->smooth = 0.5;
    p->cost = 0.1;
    p->lru2 = 1;
    p->hzw = 1;
    p->fork = 1;
    p->split = 1;
    p->t1key = 1;
    p->t2key = 0;
    p->lr = 0.45;
    p->sample = 16;
    p->hd_sample = 64;
    p->hd_period = 65536;
    p->hd_decay = 0.9;
    p->pr_period = 65536;
    p->pr_cls = 3;
    p->nu_mode = IKV__NU_MAX;
    p->nu_gaps = 3;
    p->nu_k = 0;
    p->nu_m = 1;
    p->nu_cls = 3;
    p->nu_own = 1;
    p->ob_t = 0.5;
    int rc = ikv__params_each(params, set_param, p);
    if (!rc && p->hd > 0 && !p->split)
        rc = ikv_error(IKV_EPARAM, "value: hd needs split=1 (it orders T1 and/or T2)");
    if (!rc && p->pred > 0 && (!p->split || p->hd > 0))
        rc = ikv_error(IKV_EPARAM, "value: pred needs split=1 and hd=0 (it uses hd's class bits)");
    if (!rc && p->pred > 0) {
        p->hgd = ikv_calloc(env->capacity ? env->capacity : 1, sizeof *p->hgd);
        if (!p->hgd) rc = IKV_ENOMEM;
    }
    if (!rc && p->hd > 0) {
        p->hdm = ikv_malloc(sizeof *p->hdm);
        p->hgd = ikv_calloc(env->capacity ? env->capacity : 1, sizeof *p->hgd);
        if (!p->hdm || !p->hgd) rc = IKV_ENOMEM;
        else ikv__hd_init(p->hdm, p->hd_period, p->hd_decay, 16);
    }
    if (!rc && p->nu > 0 && !p->split)
        rc = ikv_error(IKV_EPARAM, "value: nu needs split=1 (it dooms within ARC's classes)");
    if (!rc && p->nu > 0 &&
        ikv__nu_init(&p->nuu, env->node_limit, env->capacity, (int)p->nu_mode, (int)p->nu_gaps,
                     p->nu_sess > 0, p->nu_k > 0))
        rc = IKV_ENOMEM;
    if (!rc && p->nu_lr > 0 && (p->nu <= 0 || p->pred > 0 || p->hd > 0))
        rc = ikv_error(IKV_EPARAM, "value: nuadapt needs nu=1, pred=0 and hd=0 (ghost slots)");
    if (!rc && p->nu_ghost > 0 && (p->nu <= 0 || p->pred > 0 || p->hd > 0))
        rc = ikv_error(IKV_EPARAM, "value: nughost needs nu=1, pred=0 and hd=0 (ghost slots)");
    if (!rc && p->nu_ghost > 0) {
        p->nu_gt = ikv_calloc(env->capacity ? env->capacity : 1, sizeof *p->nu_gt);
        if (!p->nu_gt) rc = IKV_ENOMEM;
    }
    if (!rc && p->nu_lr > 0) {
        uint64_t gc = env->capacity ? env->capacity : 1;
        p->nu_glast = ikv_calloc(gc, sizeof *p->nu_glast);
        p->nu_gdoom = ikv_calloc(gc, sizeof *p->nu_gdoom);
        if (!p->nu_glast || !p->nu_gdoom) rc = IKV_ENOMEM;
    }
    if (!rc && p->oracle == 7 && (!p->split || p->nu <= 0 || p->nu_sess <= 0))
        rc = ikv_error(IKV_EPARAM, "value: oracle=7 reads the next-use histories: it needs "
                                   "split=1, nu=1 and nusess=1 (num=0 keeps nu from dooming)");
    if (!rc && p->oracle == 7) {
        size_t nb = p->ob_sess > 0 ? OB_NS : OB_N;
        p->ob_yes = ikv_calloc(nb, sizeof *p->ob_yes);
        p->ob_no = ikv_calloc(nb, sizeof *p->ob_no);
        p->ob_dyes = ikv_calloc(nb, sizeof *p->ob_dyes);
        p->ob_dno = ikv_calloc(nb, sizeof *p->ob_dno);
        p->ob_touched = ikv_calloc(nb, sizeof *p->ob_touched);
        if (!p->ob_yes || !p->ob_no || !p->ob_dyes || !p->ob_dno || !p->ob_touched)
            rc = IKV_ENOMEM;
    }
    if (!rc && p->oracle == 4 && p->split)
        rc = ikv_error(IKV_EPARAM, "value: oracle=4 orders one heap: it needs split=0");
    if (!rc && p->mix > 0 && !p->split)
        rc = ikv_error(IKV_EPARAM, "value: mix needs split=1 (it mixes the split with split=0)");
    if (!rc && p->mix > 0 && ikv__ghostq_init(&p->xg, env->capacity)) rc = IKV_ENOMEM;
    if (!rc && ikv__heap_init(&p->hp.h, env)) rc = IKV_ENOMEM;
    if (!rc && (p->ghostw > 0 || p->split) && ikv__ghostq_init(&p->ghost, env->capacity))
        rc = IKV_ENOMEM;
    if (!rc && p->split && ikv__heap_init(&p->h1, env)) rc = IKV_ENOMEM;
    if (!rc && p->tlfu > 0 && ikv__sketch_init(&p->sk, env->capacity)) rc = IKV_ENOMEM;
    if (rc) {
        value_destroy(p);
        return rc;
    }
    p->w[0] = p->w[1] = 0.5;
    p->pending_exp = -1;
    p->rng = 0x9e3779b97f4a7c15ull;
    p->c = env->capacity;
    p->x_from = -1;

    p->pending = IKV_NIL;
    p->hp.nodes = env->nodes;
    p->cost_fn = env->cost;
    p->cost_ctx = env->cost_ctx;
    p->now = env->now;
    p->block_tokens = env->block_tokens;
    p->c0 = p->cost_fn(p->cost_ctx, 0, p->block_tokens) / p->block_tokens;
    if (!(p->c0 > 0)) p->c0 = 1;
    *out = p;
    return 0;
}


enum { T1 = 0, T2 = 1 };

#define DOOM 1e15 /* doomed blocks (oracle, pred) are keyed k - DOOM: below every live key */

/* pred: the horizon of class cls at `now`, how long a block of it has stayed lately (T2: the
 * last T2 victim's age; T1: now - the last T1 victim's key, the stay of a block keyed at its
 * access); the mean gap until the first eviction. */
static inline double pr_horizon(const value *p, int cls, double now) {
    double kv = cls == T1 ? p->kv1 : p->kv;
    int have = cls == T1 ? p->have_kv1 : p->have_kv;
    return have && now > kv ? now - kv : p->gbar;
}

/* pred: a block's class at an access, 48 of 128: its ARC class (1 bit) x the core's hit count
 * (0, 1, 2, 3+) x its predicted gap g against the horizon h of that class (unproven, <= h/4,
 * <= h/2, <= h, <= 2h, beyond); prdepth=1: 108 of 128, hit counts 0, 1, 2+ x the block's
 * depth (under 1024, under 2048, deeper). */
static inline uint32_t pr_class(const value *p, const ikv__node *n, int cls, double now, double g) {
    double h = pr_horizon(p, cls, now);
    uint32_t gb = g < 0 ? 0 : g <= h / 4 ? 1 : g <= h / 2 ? 2 : g <= h ? 3 : g <= 2 * h ? 4 : 5;
    if (p->pr_depth > 0) {
        uint32_t hb = n->hits < 2 ? n->hits : 2, db = n->depth < 1024 ? 0 : n->depth < 2048 ? 1 : 2;
        return (uint32_t)cls + 2 * (hb + 3 * (db + 3 * gb));
    }
    uint32_t hb = n->hits < 3 ? n->hits : 3;
    return (uint32_t)cls | hb << 1 | gb << 3;
}

/* pred: the class's learned P(reused within the horizon), Laplace-smoothed. */
static inline double pr_p(const value *p, uint32_t c) {
    return (p->pr_yes[c] + 1.0) / (p->pr_yes[c] + p->pr_no[c] + 2.0);
}

/* pred: one event of evidence; every pr_period of them the counts halve (old evidence fades). */
static inline void pr_event(value *p) {
    if (++p->pr_events < (uint64_t)p->pr_period) return;
    p->pr_events = 0;
    p->pr_yes_all = p->pr_no_all = 0;
    for (int i = 0; i < 128; i++) {
        p->pr_yes[i] *= 0.5f, p->pr_no[i] *= 0.5f;
        p->pr_yes_all += p->pr_yes[i], p->pr_no_all += p->pr_no[i];
    }
}

/* pred: sets n's class (HDC bits) for this access and returns k, or k - DOOM when the class is
 * unlikely to be reused before the horizon (evicted first, from either class, as the oracle's
 * doomed blocks: docs/policies.md). */
static double pr_key(value *p, ikv__node *n, int cls, double now, double k) {
    uint32_t c = pr_class(p, n, cls, now, *gap_of(n));
    SPL(n) = (SPL(n) & ~(127u << HDC_SHIFT)) | c << HDC_SHIFT;
    if (!((int)p->pr_cls & (1 << cls))) return k; /* prcls: this class is never doomed */
    /* relative to the mean: where every class is evicted before reuse (the policy's own
     * outcome), nothing is doomed, else the doom would fulfil itself */
    double all = (p->pr_yes_all + 1.0) / (p->pr_yes_all + p->pr_no_all + 2.0);
    if (pr_p(p, c) >= p->pred * all) return k;
    p->pr_doomed++;
    return k - DOOM;
}

/* nu: the block's predicted gap to its next use (its own access history, or with nuew=1
 * value's smoothed gap), < 0 when none is known. */
static inline double nu_gap(const value *p, uint32_t id) {
    return p->nu_ew > 0 ? *gap_of(&p->hp.nodes[id]) : ikv__nu_gap(&p->nuu, id);
}

/* nu: after an access at `now` that left block id in class cls with key k, returns k, or
 * k - DOOM when its predicted next use lies beyond num x the class's eviction horizon (it would
 * be dropped before it comes back, were it kept like the others: evicted first, from either
 * class, as oracle=3's doomed blocks); a live block with a known gap gets the overdue deadline
 * now + nuk x gap (nuk > 0). A block without a known gap keeps k and has no deadline. O(1);
 * O(log n) with nuk. Does not allocate. */
static double nu_key(value *p, uint32_t id, int cls, const ikv_access *a, double now, double k) {
    ikv__node *n = &p->hp.nodes[id];
    int queued = (n->flags & IKV__QUEUED) != 0;
    double g = nu_gap(p, id);
    int own = g >= 0;
    /* nusess: no gap of its own (a first block, a chain back after its eviction): the
     * session's last turn gap, which is the block's own had it stayed */
    if (p->nu_sess > 0 && a) {
        double sg = ikv__nu_session(&p->nuu, a->scope, (uint64_t)now);
        if (g < 0) g = sg;
    }
    if (g < 0) {
        ikv__nu_set_deadline(&p->nuu, id, IKV__NU_NONE, queued);
        return k;
    }
    if (p->nu_m > 0 && ((int)p->nu_cls & (1 << cls)) && !(own && cls == T2 && p->nu_own <= 0) &&
        g > p->nu_m * pr_horizon(p, cls, now)) {
        ikv__nu_set_deadline(&p->nuu, id, IKV__NU_NONE, queued);
        p->nu_doomed++;
        return k - DOOM;
    }
    double dl = p->nu_k > 0 ? now + p->nu_k * g + 1 : (double)IKV__NU_NONE;
    ikv__nu_set_deadline(&p->nuu, id, dl < (double)IKV__NU_NONE ? (uint32_t)dl : IKV__NU_NONE - 1,
                         queued);
    return k;
}

/* The heap a block of this policy is queued on: T1's (split=1, probation) or the main one. */
static inline ikv__heap *heap_of(value *p, ikv__node *n) {
    return p->split && CLS(n) == T1 ? &p->h1 : &p->hp.h;
}

/* Ghost feedback: a missed key found among the last c evicted ones is a block that came back
 * soon after the cache dropped it. */
static void value_miss(void *s, ikv_key k) {
    value *p = s;
    if (p->split) {
        /* ARC's cases II and III (FAST'03 Fig. 4): adapt the target of T1 before REPLACE */
        uint32_t slot;
        int g = ikv__ghostq_arc_adapt_slot(&p->ghost, k, (double)p->c, &p->p, &slot);
        if (g >= 0 && p->pred > 0) {
            /* back within its class's horizon (from its last access): kept like the others it
             * would have been a hit, so the eviction's evidence turns into a reuse */
            uint64_t d = p->hgd[slot];
            uint32_t c = (uint32_t)(d >> 56) & 127u;
            double age = (double)(uint32_t)((uint32_t)*p->now - (uint32_t)d);
            if (age <= pr_horizon(p, (int)(c & 1u), (double)*p->now)) {
                if (p->pr_no[c] >= 1) p->pr_no[c] -= 1, p->pr_no_all -= 1;
                p->pr_yes[c] += 1, p->pr_yes_all += 1;
            }
        }
        if (p->nu_ghost > 0) {
            p->nu_xt[0] = g >= 0 ? p->nu_gt[slot][0] : 0;
            p->nu_xt[1] = g >= 0 ? p->nu_gt[slot][1] : 0;
        }
        if (g >= 0 && p->nu_lr > 0) {
            /* nuadapt: a block the predictor evicted that is back within its horizon was a
             * false doom (doom less); a live victim back within twice its horizon is a miss
             * that room made by dooming more would have avoided (doom more) */
            double age = (double)(uint32_t)((uint32_t)*p->now - p->nu_glast[slot]);
            double h = pr_horizon(p, g, (double)*p->now);
            if (p->nu_gdoom[slot] && age <= h) p->nu_m *= exp(p->nu_lr), p->nu_false++;
            else if (!p->nu_gdoom[slot] && age <= 2 * h) p->nu_m *= exp(-p->nu_lr), p->nu_late++;
            if (p->nu_m < NU_MMIN) p->nu_m = NU_MMIN;
            if (p->nu_m > NU_MMAX) p->nu_m = NU_MMAX;
        }
        if (g >= 0 && p->hdm) {
            /* the eviction cost a hit: the model counts the hit it would have been */
            uint64_t d = p->hgd[slot];
            ikv__hd_unevict(p->hdm, (uint32_t)(d >> 56), (d >> 32) & 0xffffff,
                            (uint32_t)((uint32_t)*p->now - (uint32_t)d));
        }
        p->x = k;
        p->x_valid = 1;
        p->x_from = g;
        if (p->mix > 0) {
            /* LeCaR's regret: the expert that evicted k was wrong; move weight to the other */
            int e = ikv__ghostq_take(&p->xg, k);
            if (e >= 0) {
                p->mix_pen[e]++;
                p->w[e] *= exp(-p->lr);
                double t = p->w[0] + p->w[1];
                p->w[0] /= t, p->w[1] /= t;
                for (int i = 0; i < 2; i++)
                    if (p->w[i] < W_MIN) p->w[i] = W_MIN, p->w[!i] = 1 - W_MIN;
            }
        }
        return;
    }
    if (p->ghostw <= 0) return;
    p->x = k;
    p->x_valid = 1;
    p->x_hit = ikv__ghostq_take(&p->ghost, k) >= 0;
}

static void value_leave(void *s, uint32_t id) {
    value *p = s;
    ikv__node *n = &p->hp.nodes[id];
    if (p->split) {
        p->res[CLS(n)]--;
        if (id == p->pending && p->hdm) {
            uint64_t now = *p->now, age = now > n->last ? now - n->last : 0;
            ikv__hd_evict(p->hdm, HDC(n), age);
            if (p->pending_ghost) {
                uint32_t slot = ikv__ghostq_add(&p->ghost, n->key, (int)CLS(n));
                if (slot != IKV_NIL)
                    p->hgd[slot] = (uint32_t)n->last |
                                   (uint64_t)(age < 0xffffff ? age : 0xffffff) << 32 |
                                   (uint64_t)HDC(n) << 56;
            }
        } else if (id == p->pending && p->pred > 0) {
            /* evicted unreused: evidence against its class; the ghost slot remembers the class
             * and last access, so a quick return can take the evidence back */
            p->pr_no[HDC(n)] += 1, p->pr_no_all += 1;
            pr_event(p);
            if (p->pending_ghost) {
                uint32_t slot = ikv__ghostq_add(&p->ghost, n->key, (int)CLS(n));
                if (slot != IKV_NIL) p->hgd[slot] = (uint32_t)n->last | (uint64_t)HDC(n) << 56;
            }
        } else if (id == p->pending && p->pending_ghost) {
            uint32_t slot = ikv__ghostq_add(&p->ghost, n->key, (int)CLS(n));
            if (p->nu_lr > 0 && slot != IKV_NIL) {
                p->nu_glast[slot] = (uint32_t)n->last;
                p->nu_gdoom[slot] = (uint8_t)p->nu_pdoom;
            }
            if (p->nu_ghost > 0 && slot != IKV_NIL) {
                p->nu_gt[slot][0] = p->nuu.t[id][0];
                p->nu_gt[slot][1] = p->nuu.t[id][1];
            }
        }
        if (id == p->pending && p->pending_exp >= 0)
            ikv__ghostq_add(&p->xg, n->key, p->pending_exp);
    } else if (id == p->pending && p->ghostw > 0) {
        ikv__ghostq_add(&p->ghost, n->key, 0);
    }
    if (p->nu > 0) ikv__nu_set_deadline(&p->nuu, id, IKV__NU_NONE, 0);
    p->pending = IKV_NIL;
}

static void value_queue(void *s, uint32_t id) {
    value *p = s;
    ikv__node *n = &p->hp.nodes[id];
    ikv__heap_push(heap_of(p, n), p->hp.nodes, id, IKV__HKEY(n));
    if (p->nu_k > 0) ikv__nu_queue(&p->nuu, id);
}

static void value_dequeue(void *s, uint32_t id) {
    value *p = s;
    ikv__heap_remove(heap_of(p, &p->hp.nodes[id]), p->hp.nodes, id);
    if (p->nu_k > 0) ikv__nu_dequeue(&p->nuu, id);
}

/* K(b) for a block last accessed at `last` (see the header). The horizon is read at `last`,
 * the time of the access that sets the key; before the first eviction it is 0 (nothing is
 * known yet of how long the cache keeps a block), so every gap counts in full. */
static double key_at(const value *p, ikv__node *n, uint64_t last, double kv, int have_kv) {
    double g = *gap_of(n);
    g = g < 0 ? p->newg * p->gbar : p->lru2 * g;
    if (p->hzw > 0) {
        double h = have_kv && (double)last > kv ? p->hzw * ((double)last - kv) : 0;
        g = g > h ? g - h : 0;
    }
    return (double)last - g + credit_of(p, n);
}

static double key_of(const value *p, ikv__node *n, uint64_t last) {
    return key_at(p, n, last, p->kv, p->have_kv);
}

/* Oracle diagnostics (docs/policies.md, "What the WEKA gap is made of"; simulator only): the
 * key k the policy would give, overridden from the future that the simulator passes in
 * a->next_use (the block's own next use; for oracle=2 its conversation's next request).
 * oracle=1/2: a block with no future use is doomed; oracle=3: also one whose next use lies
 * beyond the horizon of its class (it would be evicted before it, were it kept like the
 * others). Doomed blocks are keyed k - DOOM (below every live key, in value's order among
 * themselves) and go first from either class. oracle=4 (split=0): Belady's key, the
 * farthest next use first (opt exactly: the plumbing's check). */
static inline double oracle_key(const value *p, int cls, const ikv_access *a, size_t pos,
                                double k) {
    if (p->oracle <= 0 || p->oracle == 7 || !a || !a->next_use) return k;
    uint64_t nu = a->next_use[pos];
    if (p->oracle == 4) return -(double)nu;
    /* oracle=5 / 6: as 3, but only in T1 / only in T2 (which class's blocks the bit helps) */
    if ((p->oracle == 5 && cls != T1) || (p->oracle == 6 && cls != T2)) return k;
    if (nu == IKV_NEVER) return k - 2 * DOOM;
    if (p->oracle >= 3) {
        double kv = p->split && cls == T1 ? p->kv1 : p->kv;
        int have = p->split && cls == T1 ? p->have_kv1 : p->have_kv;
        double now = (double)a->now;
        if (have && now > kv && (double)nu > now + (now - kv)) return k - DOOM;
    }
    return k;
}

/* hint=1: the request's response ended its turn (ikv_access.hint): its chain waits for a
 * person's next message, or is done; doomed (k - DOOM), so it goes before any block whose
 * client is expected back. hint=2: only in T1. hint=3: only in T2. */
static inline double hint_key(const value *p, int cls, const ikv_access *a, double k) {
    if (p->hint <= 0 || !a || a->hint != IKV_HINT_TURN) return k;
    if ((p->hint == 2 && cls != T1) || (p->hint == 3 && cls != T2)) return k;
    return k - DOOM;
}

/* oracle=7, the feature-limited oracle (simulator only; docs/policies.md): how much of
 * oracle=3's horizon bit any rule over the online features could recover. A block's bucket at
 * an access is its ARC class x the core's hit count (0-3+) x its own predicted gap (nu's
 * history) against its class's horizon h (none, <= h/8, h/4, h/2, h, 2h, 4h, beyond) x its
 * session's last turn gap against h (same 8 steps) x the response's hint (ikv_access.hint) x
 * its depth (< 256, 1024, 2048 blocks, deeper): 6,144 buckets; obsess=1 instead: class x
 * session gap x hint x the session itself (its scope hashed to 512 ways), 24,576 buckets. The
 * block is doomed (k - DOOM, as oracle=3's) where the bucket's share of doomed accesses exceeds
 * obt (0.5: the Bayes decision for the bit). Every access's true bit, read from the future,
 * is counted the moment its request ends (bits of the request being served would tell its
 * later blocks their own chain's future). A live learner over these features gets its labels
 * only a horizon later, so this bounds what one recovers, up to the buckets' resolution. */
static inline uint32_t ob_step(double g, double h) {
    if (g < 0) return 0;
    uint32_t b = 1;
    for (double t = h / 8; b < 7 && g > t; t *= 2) b++;
    return b;
}

/* oracle=7: the previous request's bits join the counts. */
static void ob_flush(value *p) {
    for (uint32_t i = 0; i < p->ob_ntouched; i++) {
        uint32_t b = p->ob_touched[i];
        p->ob_yes[b] += p->ob_dyes[b], p->ob_no[b] += p->ob_dno[b];
        p->ob_dyes[b] = p->ob_dno[b] = 0;
    }
    p->ob_ntouched = 0;
}

static double ob_key(value *p, uint32_t id, int cls, const ikv_access *a, size_t pos, double now,
                     double k) {
    if (p->oracle != 7 || !a || !a->next_use) return k;
    if (a->now != p->ob_req) ob_flush(p), p->ob_req = a->now;
    int have = cls == T1 ? p->have_kv1 : p->have_kv;
    double kv = cls == T1 ? p->kv1 : p->kv;
    if (!have || !(now > kv)) return k; /* no horizon yet: oracle=3 dooms nothing either */
    double h = now - kv;
    const ikv__node *n = &p->hp.nodes[id];
    uint32_t sb = ob_step(ikv__nu_session(&p->nuu, a->scope, (uint64_t)now), h);
    uint32_t ib = a->hint == IKV_HINT_SOON ? 1 : a->hint == IKV_HINT_TURN ? 2 : 0;
    uint32_t b;
    if (p->ob_sess > 0) {
        uint32_t sh = (uint32_t)((a->scope * 0x9e3779b97f4a7c15ull) >> 55); /* 512 ways */
        b = (uint32_t)cls + 2 * (sb + 8 * (ib + 3 * sh));
    } else {
        uint32_t hb = n->hits < 3 ? n->hits : 3;
        uint32_t gb = ob_step(ikv__nu_gap(&p->nuu, id), h);
        uint32_t db = n->depth < 256 ? 0 : n->depth < 1024 ? 1 : n->depth < 2048 ? 2 : 3;
        b = (uint32_t)cls + 2 * (hb + 4 * (gb + 8 * (sb + 8 * (ib + 3 * db))));
    }
    double pd = (p->ob_yes[b] + 1.0) / (p->ob_yes[b] + p->ob_no[b] + 2.0);
    uint64_t nu = a->next_use[pos];
    if (p->ob_dyes[b] == 0 && p->ob_dno[b] == 0) p->ob_touched[p->ob_ntouched++] = b;
    if (nu == IKV_NEVER || (double)nu > now + h) p->ob_dyes[b] += 1;
    else p->ob_dno[b] += 1;
    if (pd <= p->ob_t) return k;
    p->ob_doomed++;
    return k - DOOM;
}

/* split=1: the block's parent (same tier, same policy) had a child at this access. */
static inline void mark_parent(value *p, ikv__node *n) {
    if (n->parent == IKV_NIL) return;
    ikv__node *pa = &p->hp.nodes[n->parent];
    if (pa->pol.u32[3] == TAG && pa->tier == n->tier) SPL(pa) |= F_KID;
}

/* A new block (a != NULL) takes its cost per token from the callback and its gap from its
 * parent when that is in this tier under this policy (chains are inserted top down, so the
 * parent was just hit or inserted) and has no other resident child there (fork=1), else
 * starts unproven. A block moving between tiers that both run this policy keeps both fields. */
static void value_admit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    value *p = s;
    ikv__node *n = &p->hp.nodes[id];
    if (a) {
        uint32_t ntok = a->ntokens ? a->ntokens[pos] : p->block_tokens;
        if (!ntok) ntok = 1;
        *cpt_of(n) = (float)(p->cost_fn(p->cost_ctx, n->depth, ntok) / (double)ntok);
        float g = UNPROVEN;
        uint32_t inh = IKV_NIL; /* the parent whose history n inherits */
        if (n->parent != IKV_NIL) {
            ikv__node *pa = &p->hp.nodes[n->parent];
            /* pa->nchild counts n already: more than 1 means n forks beside a sibling */
            if (pa->pol.u32[3] == TAG && pa->tier == n->tier &&
                !(p->fork > 0 && pa->nchild[n->tier] > 1))
                g = *gap_of(pa), inh = n->parent;
        }
        if (p->nu > 0) {
            /* a tail inserted with its parent shares its future: it takes the parent's history */
            if (inh != IKV_NIL && p->x_from < 0) ikv__nu_inherit(&p->nuu, id, inh);
            else if (p->nu_ghost > 0 && p->x_from >= 0 && p->x_valid && ikv_key_eq(p->x, n->key))
                ikv__nu_resume(&p->nuu, id, p->nu_xt);
            else ikv__nu_start(&p->nuu, id, n->last);
            ikv__nu_access(&p->nuu, id, n->last);
        }
        /* a block that came back from the ghost is proven: its gap is `ghost` horizons */
        if (p->ghostw > 0 && p->x_valid && p->x_hit && ikv_key_eq(p->x, n->key) && p->have_kv &&
            (double)n->last > p->kv)
            g = (float)(p->ghostw * ((double)n->last - p->kv) / (p->hzw > 0 ? p->hzw : 1));
        if (!p->split) p->x_valid = 0;
        *gap_of(n) = g;
        n->pol.u32[3] = TAG;
    } else if (n->pol.u32[3] != TAG) {
        *gap_of(n) = UNPROVEN;
        *cpt_of(n) = (float)(p->cost_fn(p->cost_ctx, n->depth, p->block_tokens) / p->block_tokens);
        n->pol.u32[3] = TAG;
    }
    /* nu: the history arrays are this tier's own; a block arriving from another tier starts
     * with its last access only */
    if (!a && p->nu > 0) ikv__nu_start(&p->nuu, id, n->last);
    if (p->split) {
        /* T2 for a block back from B1/B2 (ARC), one whose key the sketch has seen tlfu times
         * (TinyLFU's longer memory), and (t2in=1) one that inherits its chain's gap; T1 else */
        if (!p->x_valid || !ikv_key_eq(p->x, n->key)) value_miss(p, n->key);
        float g = *gap_of(n);
        uint32_t cls = T1;
        if (p->x_from >= 0 ||
            (p->tlfu > 0 && (double)ikv__sketch_estimate(&p->sk, n->key) >= p->tlfu)) {
            cls = T2;
            if (g < 0) *gap_of(n) = 0; /* returned: ordered by recency until its gap is seen */
        } else if (g < 0 || p->t2in <= 0 || n->parent == IKV_NIL ||
                   CLS(&p->hp.nodes[n->parent]) != T2) {
            /* T1; a chain below a block kept in T1 stays in T1 */
        } else if (p->t2in >= 2) {
            /* t2in=2: inherit into T2 only where the parent ended its previous access (a
             * conversation's next turn continues its chain; a request's documents under a
             * user's memory, which had other children last time, do not) */
            ikv__node *pa = &p->hp.nodes[n->parent];
            if (!(SPL(pa) & F_PKID)) cls = T2;
        } else {
            cls = T2;
        }
        if (p->tlfu > 0) ikv__sketch_add(&p->sk, n->key);
        uint32_t hf = p->x_from >= 0 ? HD_BACK : 0;
        if (p->hdm) {
            if (n->depth == 0) hf |= HD_ROOT;
            /* the predicted gap against T1's horizon: unproven, within half of it, within
             * twice it, beyond (value's key in T1 orders by the same comparison) */
            double gg = *gap_of(n), hz = p->have_kv1 && (double)n->last > p->kv1
                                             ? (double)n->last - p->kv1
                                             : p->gbar;
            uint32_t gb = gg < 0 ? 0 : gg <= hz / 2 ? 1 : gg <= 2 * hz ? 2 : 3;
            hf |= gb << 2;
        }
        SPL(n) = cls | (p->hdm ? ikv__hd_class(n->hits, hf) << HDC_SHIFT : 0);
        mark_parent(p, n);
        p->res[cls]++;
        p->x_valid = 0;
        p->x_from = -1;
        IKV__HKEY(n) = cls == T2  ? (p->t2key ? key_of(p, n, n->last) : (double)n->last)
                       : p->t1key ? key_at(p, n, n->last, p->kv1, p->have_kv1)
                                  : (double)n->last;
        if (a) IKV__HKEY(n) = oracle_key(p, (int)cls, a, pos, IKV__HKEY(n));
        IKV__HKEY(n) = hint_key(p, (int)cls, a, IKV__HKEY(n));
        if (p->pred > 0) IKV__HKEY(n) = pr_key(p, n, (int)cls, (double)n->last, IKV__HKEY(n));
        if (p->nu > 0) IKV__HKEY(n) = nu_key(p, id, (int)cls, a, (double)n->last, IKV__HKEY(n));
        IKV__HKEY(n) = ob_key(p, id, (int)cls, a, pos, (double)n->last, IKV__HKEY(n));
        return;
    }
    IKV__HKEY(n) = key_of(p, n, n->last);
    if (a) IKV__HKEY(n) = oracle_key(p, T2, a, pos, IKV__HKEY(n));
}

static void value_hit(void *s, uint32_t id, const ikv_access *a, size_t pos) {
    value *p = s;
    ikv__node *n = &p->hp.nodes[id];
    /* node->last is still the previous access (the core sets it after this call) */
    uint64_t now = *p->now;
    double gap = now > n->last ? (double)(now - n->last) : 0;
    float g = *gap_of(n);
    *gap_of(n) = g < 0 ? (float)gap : (float)((1 - p->smooth) * g + p->smooth * gap);
    p->gbar = p->gbar == 0 ? gap : (1 - GBAR_W) * p->gbar + GBAR_W * gap;
    double k = p->split && p->t2key == 0 ? (double)now : key_of(p, n, now);
    k = oracle_key(p, T2, a, pos, k); /* a hit block is in T2 after this call */
    k = hint_key(p, T2, a, k);
    if (p->pred > 0) {
        /* the class it had since its last access was reused while resident */
        p->pr_yes[HDC(n)] += 1, p->pr_yes_all += 1;
        pr_event(p);
        k = pr_key(p, n, T2, (double)now, k);
    }
    if (p->nu > 0) {
        ikv__nu_access(&p->nuu, id, now);
        k = nu_key(p, id, T2, a, (double)now, k);
    }
    k = ob_key(p, id, T2, a, pos, (double)now, k);
    if (p->split) {
        if (p->tlfu > 0) ikv__sketch_add(&p->sk, n->key);
        if (p->hdm) {
            /* evidence for the class the block had while its age ran; then its new bucket */
            ikv__hd_hit(p->hdm, HDC(n), (uint64_t)gap);
            uint32_t c = ikv__hd_class(n->hits, HDC(n) % IKV__HD_NFL);
            SPL(n) = (SPL(n) & ~(127u << HDC_SHIFT)) | c << HDC_SHIFT;
        }
        /* a new access: what was "latest" becomes "previous" (parents are hit before children) */
        SPL(n) = (SPL(n) & ~(F_KID | F_PKID)) | (SPL(n) & F_KID ? F_PKID : 0);
        mark_parent(p, n);
        if (CLS(n) == T1) { /* ARC case I: a hit moves the block to T2 */
            int queued = (n->flags & IKV__QUEUED) != 0;
            if (queued) ikv__heap_remove(&p->h1, p->hp.nodes, id);
            SPL(n) = T2 | (SPL(n) & (F_KID | F_PKID | 127u << HDC_SHIFT));
            p->res[T1]--;
            p->res[T2]++;
            if (queued) {
                ikv__heap_push(&p->hp.h, p->hp.nodes, id, k);
                return;
            }
        }
    }
    if (n->flags & IKV__QUEUED)
        ikv__heap_update(&p->hp.h, p->hp.nodes, id, k);
    else
        IKV__HKEY(n) = k;
}

/* mix: a uniform number in [0, 1) from the policy's xorshift64* stream. */
static double next_unit(value *p) {
    p->rng ^= p->rng >> 12, p->rng ^= p->rng << 25, p->rng ^= p->rng >> 27;
    return (double)((p->rng * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

/* mix: the single heap's key K of a block (split=0's order), with expert 1's own horizon. */
static double single_key(const value *p, ikv__node *n) {
    return key_at(p, n, n->last, p->kvs, p->have_kvs);
}

/* mix: expert 1's victim, the block of smallest K among `sample` evictable blocks drawn
 * uniformly from both heaps (all of them when no more are queued). O(sample). */
static uint32_t single_pick(value *p) {
    uint64_t n1 = p->h1.len, n = n1 + p->hp.h.len, s = (uint64_t)p->sample;
    uint32_t best = IKV_NIL;
    double bk = 0;
    for (uint64_t i = 0; i < (n <= s ? n : s); i++) {
        uint64_t r = n <= s ? i : (uint64_t)(next_unit(p) * (double)n) % n;
        uint32_t id = r < n1 ? p->h1.slot[r].id : p->hp.h.slot[r - n1].id;
        double k = single_key(p, &p->hp.nodes[id]);
        if (best == IKV_NIL || k < bk || (k == bk && id < best)) best = id, bk = k;
    }
    return best;
}

/* hd: the least dense (hdmodel.h) of `hdsample` blocks drawn from heap h's slots (all of
 * them when no more are queued); ties to the older block, then the lower id. The sampled
 * nodes are prefetched in batches of up to 64 so their reads overlap. O(hdsample). */
static uint32_t hd_pick(value *p, const ikv__heap *h) {
    uint64_t n = h->len, k = (uint64_t)p->hd_sample, now = *p->now;
    uint32_t best = IKV_NIL;
    double bd = 0;
    if (n <= k) k = n;
    for (uint64_t i0 = 0; i0 < k; i0 += 64) {
        uint32_t ids[64];
        uint64_t m = k - i0 < 64 ? k - i0 : 64;
        for (uint64_t j = 0; j < m; j++) {
            ids[j] = h->slot[n == k ? i0 + j : (uint64_t)(next_unit(p) * (double)n) % n].id;
            __builtin_prefetch(&p->hp.nodes[ids[j]].last);
        }
        for (uint64_t j = 0; j < m; j++) {
            uint32_t id = ids[j];
            ikv__node *nd = &p->hp.nodes[id];
            double d = ikv__hd_density(p->hdm, HDC(nd), now > nd->last ? now - nd->last : 0);
            if (best == IKV_NIL || d < bd ||
                (d == bd && (nd->last < p->hp.nodes[best].last ||
                             (nd->last == p->hp.nodes[best].last && id < best))))
                best = id, bd = d;
        }
    }
    return best;
}

/* The victim of class l's heap: its top, or (hd covering l) the sampled least dense block. */
static uint32_t top_of(value *p, int l) {
    const ikv__heap *h = l == T1 ? &p->h1 : &p->hp.h;
    if (p->hdm && ((int)p->hd & (l == T1 ? 1 : 2))) return hd_pick(p, h);
    return ikv__heap_top(h);
}

/* split=1: ARC's REPLACE(x, p) over the two heaps (the other heap when the chosen one has no
 * evictable block). */
static uint32_t replace(value *p) {
    uint64_t t1 = p->res[T1];
    int x_in_b2 = p->x_valid && p->x_from == 1;
    int l = (t1 >= 1 && ((double)t1 > p->p || (x_in_b2 && (double)t1 == p->p))) || p->res[T2] == 0
                ? T1
                : T2;
    ikv__heap *h = l == T1 ? &p->h1 : &p->hp.h;
    if (!h->len) {
        l = !l;
        h = l == T1 ? &p->h1 : &p->hp.h;
    }
    if (p->oracle > 0 || p->pred > 0 || p->hint > 0 || p->nu > 0) {
        /* oracle=1/2: a block without future use goes first, from either class; the
         * frontiers (kv, kv1) stay where the live victims put them */
        for (int d = T1; d <= T2; d++) {
            const ikv__heap *hd = d == T1 ? &p->h1 : &p->hp.h;
            uint32_t t = ikv__heap_top(hd);
            if (t != IKV_NIL && IKV__HKEY(&p->hp.nodes[t]) <= DEADK) {
                p->pending_ghost = 1;
                p->nu_pdoom = 1;
                return p->pending = t;
            }
        }
    }
    if (p->nu > 0 && p->nu_k > 0) {
        /* nu: a block older than nuk x its predicted gap (its conversation probably ended)
         * goes next; the frontiers stay where the live victims put them */
        uint32_t o = ikv__nu_overdue(&p->nuu, *p->now);
        if (o != IKV_NIL) {
            p->nuu.taken++;
            p->pending_ghost = 1;
            p->nu_pdoom = 1;
            return p->pending = o;
        }
    }
    uint32_t id = top_of(p, l);
    if (p->mix > 0 && id != IKV_NIL) {
        uint32_t c1 = single_pick(p);
        int e = p->mix == 2 ? p->w[1] > p->w[0] : next_unit(p) < p->w[1];
        p->pending_exp = c1 == id ? -1 : e;
        if (e == 1 && c1 != IKV_NIL) {
            id = c1;
            l = (int)CLS(&p->hp.nodes[id]);
        }
        p->kvs = single_key(p, &p->hp.nodes[id]);
        p->have_kvs = 1;
    }
    if (id != IKV_NIL && l == T2) {
        p->kv = IKV__HKEY(&p->hp.nodes[id]);
        p->have_kv = 1;
    } else if (id != IKV_NIL) {
        p->kv1 = IKV__HKEY(&p->hp.nodes[id]);
        p->have_kv1 = 1;
    }
    p->pending_ghost = 1;
    return p->pending = id;
}

/* split=1: ARC's case IV directory rules (arc.c), then REPLACE. */
static uint32_t split_victim(value *p) {
    p->pending_exp = -1;
    p->nu_pdoom = 0;
    if (p->x_valid && p->x_from >= 0) return replace(p);
    uint64_t t1 = p->res[T1], b1 = ikv__ghostq_len(&p->ghost, 0);
    uint64_t total = t1 + p->res[T2] + b1 + ikv__ghostq_len(&p->ghost, 1);
    if (t1 + b1 >= p->c) {
        if (b1 > 0) {
            ikv__ghostq_drop_oldest(&p->ghost, 0);
            return replace(p);
        }
        if (p->h1.len) {
            p->pending_ghost = 0;
            return p->pending = top_of(p, T1);
        }
        return replace(p);
    }
    if (total >= 2 * p->c) ikv__ghostq_drop_oldest(&p->ghost, 1);
    return replace(p);
}

static uint32_t value_victim(void *s) {
    value *p = s;
    if (p->split) return split_victim(p);
    uint32_t id = ikv__hp_victim(s);
    if (id != IKV_NIL && !(p->oracle > 0 && IKV__HKEY(&p->hp.nodes[id]) <= DEADK)) {
        p->kv = IKV__HKEY(&p->hp.nodes[id]);
        p->have_kv = 1;
    }
    p->pending = id;
    return id;
}

static size_t value_bytes(const void *s) {
    const value *p = s;
    return (size_t)(p->hp.h.cap + p->h1.cap) * sizeof(ikv__hslot) + ikv__ghostq_bytes(&p->ghost) +
           ikv__sketch_bytes(&p->sk) + ikv__ghostq_bytes(&p->xg) +
           (p->hgd ? (size_t)p->c * sizeof *p->hgd : 0) + (p->nu > 0 ? ikv__nu_bytes(&p->nuu) : 0) +
           (p->nu_glast ? (size_t)p->c * (sizeof *p->nu_glast + sizeof *p->nu_gdoom) : 0) +
           (p->nu_gt ? (size_t)p->c * sizeof *p->nu_gt : 0);
}

/* nu's check: a block on the overdue heap must be evictable. */
static int node_queued(const void *ctx, uint32_t id) {
    return (((const ikv__node *)ctx)[id].flags & IKV__QUEUED) != 0;
}

/* Every queued block is on the heap of its class, and (split=1) the class counts, ARC's target
 * and the ghost lists are consistent. */
static int value_check(const void *s) {
    const value *p = s;
    if (!ikv__heap_check(&p->hp.h, p->hp.nodes)) return 0;
    if (!p->split) return p->tlfu > 0 ? ikv__sketch_check(&p->sk) : 1;
    if (!ikv__heap_check(&p->h1, p->hp.nodes)) return 0;
    for (int l = T1; l <= T2; l++) {
        const ikv__heap *h = l == T1 ? &p->h1 : &p->hp.h;
        if (h->len > p->res[l]) return 0;
        for (uint64_t i = 0; i < h->len; i++)
            if (CLS(&p->hp.nodes[h->slot[i].id]) != (uint32_t)l) return 0;
    }
    if (p->mix > 0 && !(p->w[0] >= W_MIN && p->w[1] >= W_MIN &&
                        fabs(p->w[0] + p->w[1] - 1) < 1e-9 && ikv__ghostq_check(&p->xg) &&
                        ikv__ghostq_len(&p->xg, 0) + ikv__ghostq_len(&p->xg, 1) <= p->c))
        return 0;
    if (p->nu > 0 && !ikv__nu_check(&p->nuu, node_queued, p->hp.nodes)) return 0;
    if (p->nu_lr > 0 && !(p->nu_m >= NU_MMIN && p->nu_m <= NU_MMAX)) return 0;
    for (int i = 0; p->pred > 0 && i < 128; i++)
        if (!(p->pr_yes[i] >= 0 && p->pr_no[i] >= 0)) return 0;
    return p->res[T1] + p->res[T2] <= p->c && p->p >= 0 && p->p <= (double)p->c &&
           ikv__ghostq_check(&p->ghost) && (p->tlfu <= 0 || ikv__sketch_check(&p->sk)) &&
           (!p->hdm || ikv__hd_check(p->hdm));
}

static uint64_t value_queued(const void *s) {
    const value *p = s;
    return p->hp.h.len + p->h1.len;
}

/* ikv__params_each callback: the oracle= value into *(double *)ctx (not a number: 0). */
static int oracle_param(void *ctx, const char *k, const char *v) {
    if (!strcmp(k, "oracle")) *(double *)ctx = strtod(v, NULL);
    return 0;
}

/* value reads next-use times only for a nonzero oracle= diagnostic. A malformed spec is not
 * offline here: creating the cache reports it. */
static int value_offline(const char *params) {
    double oracle = 0;
    ikv__params_each(params, oracle_param, &oracle);
    return oracle != 0;
}

const ikv_policy_ops ikv_policy_value = {
    .name = "value",
    .doc = "ARC's T1/T2 split (exact ghosts, adaptive p) with T1 ordered by cost-aware predicted "
           "next use: last - the part of the chain's reuse gap beyond the eviction horizon "
           "(unproven chains and forks: 4 mean gaps) + cost * mean gap * ln(recompute "
           "cost/token) (params split, t1key, t2key, t2in, tlfu, new, smooth, cost, lru2, "
           "horizon, fork, ghost, mix, hd, pred, hint, nu; oracle: simulator diagnostics)",
    .create = value_create,
    .destroy = value_destroy,
    .miss = value_miss,
    .admit = value_admit,
    .hit = value_hit,
    .queue = value_queue,
    .dequeue = value_dequeue,
    .leave = value_leave,
    .victim = value_victim,
    .check = value_check,
    .queued = value_queued,
    .bytes = value_bytes,
    .offline = value_offline,
};
