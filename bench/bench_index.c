/*
 * bench_index: throughput and memory of the cache core, per eviction policy.
 *
 * Workload (synthetic, generated before timing, deterministic for the seed):
 *   - R shared roots ("system prompts") of 4..16 blocks;
 *   - S sequences, each a root followed by 8..56 private blocks (chain keys, ikv_key_chain);
 *   - an access stream that picks sequences with Zipf(0.9) popularity.
 * Phases, each over `ops` block operations (default 10M):
 *   lookups   ikv_cache_match on a warm cache that holds every sequence (pure lookups);
 *   churn     ikv_cache_access over the sequences in order (cycling) on a cache of `cap` blocks,
 *             far smaller than the working set: every private block misses and each insert
 *             evicts one block. Reported: inserted blocks per second (each with its eviction).
 *   mixed     the Zipf stream through the same small cache: block operations (hits + inserts
 *             with their evictions) per second, and the hit ratio. opt gets exact next-use
 *             times here (computed before timing).
 * Output: millions of blocks per second per phase and policy, and metadata bytes per cached
 * block (node + hash bucket share + policy arrays, at the cache's full size).
 * Everything printed is measured on this machine, single thread.
 * --agent: the churn and mixed accesses carry what agent traffic tells the cache — a session
 * (the sequence), a wall clock (100 ms a request) and how the response ended (a pending tool
 * call, or for every 8th sequence the end of its turn) — so hazard's ranking and auto's switch
 * run (without it they see none and are arc and lrb).
 *
 *     bench_index [--ops N] [--cap BLOCKS] [--seqs S] [--policy NAME[:k=v,...]] [--seed S]
 *                 [--agent]
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "isokv/cache.h"

typedef struct workload {
    ikv_key *keys;     /* all sequences' keys back to back */
    size_t *off, *len; /* per sequence */
    size_t n_seqs, n_keys;
    uint32_t *stream;  /* sequence index per access */
    size_t n_stream;
    uint64_t *next_use; /* opt: per stream position, per block (flattened) */
    size_t *stream_off;
} workload;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void die(const char *what) {
    fprintf(stderr, "bench_index: %s\n", what);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) die("out of memory");
    return p;
}

/* Zipf(alpha) over n items by inverse CDF on a precomputed table. */
static uint32_t *zipf_stream(size_t n_items, size_t n, double alpha) {
    double *cdf = xmalloc(n_items * sizeof *cdf);
    double sum = 0;
    for (size_t i = 0; i < n_items; i++) cdf[i] = sum += 1.0 / pow((double)(i + 1), alpha);
    uint32_t *out = xmalloc(n * sizeof *out);
    /* a random permutation so popular sequences do not share roots systematically */
    uint32_t *perm = xmalloc(n_items * sizeof *perm);
    for (size_t i = 0; i < n_items; i++) perm[i] = (uint32_t)i;
    for (size_t i = n_items - 1; i > 0; i--) {
        size_t j = rnd() % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t k = 0; k < n; k++) {
        double u = (double)(rnd() >> 11) / 9007199254740992.0 * sum;
        size_t lo = 0, hi = n_items - 1;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (cdf[mid] < u) lo = mid + 1;
            else hi = mid;
        }
        out[k] = perm[lo];
    }
    free(cdf);
    free(perm);
    return out;
}

static void build(workload *w, size_t n_seqs, size_t ops) {
    size_t n_roots = 64;
    w->n_seqs = n_seqs;
    w->off = xmalloc(n_seqs * sizeof *w->off);
    w->len = xmalloc(n_seqs * sizeof *w->len);
    size_t root_len[64], total = 0;
    for (size_t r = 0; r < n_roots; r++) root_len[r] = 4 + rnd() % 13;
    size_t *root_of = xmalloc(n_seqs * sizeof *root_of);
    for (size_t s = 0; s < n_seqs; s++) {
        root_of[s] = rnd() % n_roots;
        w->len[s] = root_len[root_of[s]] + 8 + rnd() % 49;
        w->off[s] = total;
        total += w->len[s];
    }
    w->n_keys = total;
    w->keys = xmalloc(total * sizeof *w->keys);
    for (size_t s = 0; s < n_seqs; s++) {
        ikv_key *k = w->keys + w->off[s];
        for (size_t i = 0; i < w->len[s]; i++) {
            /* root blocks depend on the root only; then the sequence's own blocks */
            uint32_t tok = i < root_len[root_of[s]] ? (uint32_t)(root_of[s] * 1000 + i)
                                                    : (uint32_t)(s * 1000003u + i);
            k[i] = ikv_key_chain(1, i ? &k[i - 1] : NULL, &tok, 1, 0);
        }
    }
    free(root_of);
    double avg = (double)total / (double)n_seqs;
    w->n_stream = (size_t)((double)ops / avg) + 1;
    w->stream = zipf_stream(n_seqs, w->n_stream, 0.9);
}

/* Next-use times for opt: for each stream position and block, the next stream position that
 * accesses the same key (same sequence index and block, or the same root block). Approximated
 * by sequence identity plus root sharing through a per-key table keyed by key index. */
static void build_next_use(workload *w) {
    size_t total = 0;
    w->stream_off = xmalloc((w->n_stream + 1) * sizeof *w->stream_off);
    for (size_t i = 0; i < w->n_stream; i++) {
        w->stream_off[i] = total;
        total += w->len[w->stream[i]];
    }
    w->stream_off[w->n_stream] = total;
    w->next_use = xmalloc(total * sizeof *w->next_use);
    /* exact next use by key: hash table from key to last position seen, scanning backwards */
    size_t cap = 1;
    while (cap < 2 * w->n_keys) cap <<= 1;
    ikv_key *tk = calloc(cap, sizeof *tk);
    uint64_t *tv = xmalloc(cap * sizeof *tv);
    uint8_t *used = calloc(cap, 1);
    if (!tk || !used) die("out of memory");
    for (size_t i = w->n_stream; i-- > 0;) {
        const ikv_key *k = w->keys + w->off[w->stream[i]];
        for (size_t b = 0; b < w->len[w->stream[i]]; b++) {
            size_t h = k[b].lo & (cap - 1);
            while (used[h] && !ikv_key_eq(tk[h], k[b])) h = (h + 1) & (cap - 1);
            w->next_use[w->stream_off[i] + b] = used[h] ? tv[h] : IKV_NEVER;
            used[h] = 1;
            tk[h] = k[b];
            tv[h] = i;
        }
    }
    free(tk);
    free(tv);
    free(used);
}

static ikv_cache *make_cache(const char *policy, uint64_t cap) {
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, cap, policy);
    ikv_cache *c;
    int rc = ikv_cache_create(&cfg, &c);
    if (rc) {
        fprintf(stderr, "bench_index: %s: %s\n", policy, ikv_errdetail());
        exit(1);
    }
    return c;
}

static int agent; /* --agent */

/* The access of sequence s at logical time t: with --agent also its session, wall clock and
 * hint. */
static void set_access(ikv_access *acc, size_t s, uint64_t t) {
    acc->now = t;
    if (!agent) return;
    acc->scope = s + 1;
    acc->clock_ms = t * 100 + 1;
    acc->hint = s % 8 ? IKV_HINT_SOON : IKV_HINT_TURN;
}

static void run_policy(const workload *w, const char *policy, uint64_t cap, size_t ops) {
    /* lookups on a cache large enough for every key */
    ikv_cache *c = make_cache(policy, w->n_keys + 1);
    ikv_access acc = {0};
    ikv_access_result r;
    for (size_t s = 0; s < w->n_seqs; s++) {
        acc.now = s;
        ikv_cache_access(c, w->keys + w->off[s], w->len[s], &acc, &r);
    }
    size_t done = 0, matched_total = 0;
    double t0 = ikv_now();
    for (size_t i = 0; done < ops; i = (i + 1) % w->n_stream) {
        size_t s = w->stream[i], m;
        ikv_cache_match(c, w->keys + w->off[s], w->len[s], NULL, NULL, &m);
        matched_total += m;
        done += w->len[s];
    }
    double t_lookup = ikv_now() - t0;
    if (matched_total != done) die("lookup phase: a resident block was not found");
    ikv_cache_destroy(c);

    /* churn: sequences in order, cycling, through a small cache: every private block misses,
     * so each one is an insert that evicts (the shared roots hit) */
    c = make_cache(policy, cap);
    int need_next = !strcmp(policy, "opt");
    size_t blocks = 0;
    uint64_t t = 0;
    t0 = ikv_now();
    for (size_t s = 0; blocks < ops; s = (s + 1) % w->n_seqs) {
        set_access(&acc, s, ++t);
        acc.next_use = NULL; /* opt without next-use times treats every block as never reused */
        if (ikv_cache_access(c, w->keys + w->off[s], w->len[s], &acc, &r)) die(ikv_errdetail());
        blocks += w->len[s];
    }
    double t_churn = ikv_now() - t0;
    ikv_cache_stats st;
    ikv_cache_stats_get(c, &st);
    double churn_inserts = (double)st.inserts, churn_evict = (double)st.evictions[0];
    ikv_cache_destroy(c);

    /* mixed: the Zipf stream through the same small cache; block operations per second */
    c = make_cache(policy, cap);
    blocks = 0;
    t0 = ikv_now();
    for (size_t i = 0; blocks < ops; i++) {
        size_t si = i % w->n_stream, s = w->stream[si];
        set_access(&acc, s, ++t);
        acc.next_use = need_next ? w->next_use + w->stream_off[si] : NULL;
        if (ikv_cache_access(c, w->keys + w->off[s], w->len[s], &acc, &r)) die(ikv_errdetail());
        blocks += w->len[s];
    }
    double t_mixed = ikv_now() - t0;
    ikv_cache_stats_get(c, &st);
    printf("%-8s %11.2f %11.2f %11.2f %11.2f %9.3f %8.1f\n", policy,
           (double)done / t_lookup / 1e6, churn_inserts / t_churn / 1e6, churn_evict / churn_inserts,
           (double)blocks / t_mixed / 1e6, (double)st.hits / (double)blocks,
           ikv_cache_bytes_per_block(c));
    ikv_cache_destroy(c);
}

int main(int argc, char **argv) {
    size_t ops = 10000000, seqs = 50000;
    uint64_t cap = 1u << 17;
    const char *only = NULL;
    /* exit codes as everywhere in isokv: 0 ok, 1 failure, 2 usage (unknown option, bad value) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: bench_index [--ops N] [--cap BLOCKS] [--seqs S] [--policy NAME[:k=v,...]] "
                   "[--seed S] [--agent]\n(counts take k/M/G suffixes)\n");
            return 0;
        }
        if (!strcmp(a, "--agent")) {
            agent = 1;
            continue;
        }
        int valued = !strcmp(a, "--ops") || !strcmp(a, "--cap") || !strcmp(a, "--seqs") ||
                     !strcmp(a, "--policy") || !strcmp(a, "--seed");
        if (!valued) {
            fprintf(stderr, "bench_index: unknown option '%s' (try --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_index: option '%s' needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        uint64_t x = 0;
        if (strcmp(a, "--policy") && ikv_parse_count(v, &x)) {
            fprintf(stderr, "bench_index: %s: '%s' is not a count\n", a, v);
            return 2;
        }
        if (!strcmp(a, "--ops"))
            ops = (size_t)x;
        else if (!strcmp(a, "--cap"))
            cap = x;
        else if (!strcmp(a, "--seqs"))
            seqs = (size_t)x;
        else if (!strcmp(a, "--seed"))
            rng = x | 1;
        else
            only = v;
    }
    if (only) {
        /* NAME or NAME:params; the cache rejects bad parameters when it is created */
        size_t nl = strcspn(only, ":");
        int found = 0;
        for (size_t p = 0; p < ikv_policy_count(); p++)
            found |= strlen(ikv_policy_name(p)) == nl && !strncmp(only, ikv_policy_name(p), nl);
        if (!found) {
            fprintf(stderr, "bench_index: unknown policy '%s'\n", only);
            return 2;
        }
    }
    if (!ops || !cap || !seqs) die("--ops, --cap and --seqs must be > 0");
    workload w;
    build(&w, seqs, ops);
    build_next_use(&w);
    printf("bench_index: measured, single thread, %ld cores online\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("workload: %zu sequences (%zu distinct blocks, 64 shared roots), Zipf(0.9) stream, "
           "%zu block ops per phase; churn cache %" PRIu64 " blocks%s\n",
           w.n_seqs, w.n_keys, ops, cap,
           agent ? "; agent traffic (sessions, wall clock, hints)" : "");
    printf("%-8s %11s %11s %11s %11s %9s %8s\n", "policy", "lookup M/s", "insert M/s",
           "evict/ins", "mixed M/s", "mixed hit", "B/block");
    if (only && only[strcspn(only, ":")]) {
        run_policy(&w, only, cap, ops);
    } else {
        for (size_t p = 0; p < ikv_policy_count(); p++) {
            if (only && strcmp(only, ikv_policy_name(p))) continue;
            run_policy(&w, ikv_policy_name(p), cap, ops);
            fflush(stdout);
        }
    }
    free(w.keys);
    free(w.off);
    free(w.len);
    free(w.stream);
    free(w.next_use);
    free(w.stream_off);
    return 0;
}
