/*
 * The response cache (include/isokv/respcache.h): entries, MinHash signatures, the flat scan,
 * exact Jaccard rescoring, eviction through the cache core.
 *
 *     entries[node]  <->  core node `node` (a first-level block, key = H(scope, params, prompt))
 *        scope, public, prompt ‖ output tokens, sorted unique shingle hashes, sig[64]
 *
 * A shingle is the 64-bit XXH3 of n consecutive prompt tokens (a prompt shorter than n is one
 * shingle). MinHash value j of a set is min over its shingles of mix(h ^ salt_j) (splitmix64's
 * finalizer: a different well-mixed permutation per j); P(sig_a[j] == sig_b[j]) = J(a, b), so
 * the fraction of equal values estimates the Jaccard similarity with standard error
 * sqrt(J (1 - J) / 64) <= 0.0625. The scan keeps the RESCORE best estimates, which are then
 * rescored exactly by a merge of the two sorted shingle arrays.
 *
 * Invariants (ikv_respcache_check): an entry is used iff its core node is resident, with the
 * entry's key; used entries = resident blocks <= capacity; shingles strictly increasing.
 */
#include "isokv/respcache.h"
#include "isokv/cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define NH      64 /* MinHash functions */
#define RESCORE 16 /* candidates rescored exactly per lookup */

typedef struct entry {
    int used, pub;
    uint64_t scope;
    ikv_key key;
    uint32_t *toks; /* [np + no]: prompt, then output */
    uint32_t np, no;
    uint64_t *sh; /* [nsh] sorted unique shingle hashes */
    uint32_t nsh;
    uint64_t sig[NH];
    ikv_respcache_params params;
    uint64_t bytes; /* accounted: IKV_RESPCACHE_ENTRY_BYTES + 4 (np + no) + 8 nsh */
} entry;

/* the fixed part an entry counts holds its record and leaves room for the core's node */
_Static_assert(sizeof(entry) + 64 <= IKV_RESPCACHE_ENTRY_BYTES, "entry record outgrew its count");

struct ikv_respcache {
    ikv_respcache_options o;
    ikv_cache *core;
    uint64_t node_limit;
    entry *ent;    /* [node_limit] */
    uint64_t *qsh; /* [max_tokens] query shingles (scratch) */
    uint64_t qsig[NH];
    uint64_t salt[NH];
    uint64_t clock;
    ikv_respcache_stats st;
};

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorted unique shingle hashes of p[0..n) into out (room for max(n, 1)); returns the count. */
static uint32_t shingles(const uint32_t *p, size_t n, uint32_t ng, uint64_t *out) {
    size_t cnt = n < ng ? 1 : n - ng + 1, w = n < ng ? n : ng;
    for (size_t i = 0; i < cnt; i++)
        out[i] = XXH3_64bits(p + i, sizeof(uint32_t) * w);
    qsort(out, cnt, sizeof *out, cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < cnt; i++)
        if (!u || out[i] != out[u - 1]) out[u++] = out[i];
    return (uint32_t)u;
}

static void signature(const ikv_respcache *rc, const uint64_t *sh, uint32_t n, uint64_t *sig) {
    for (int j = 0; j < NH; j++) {
        uint64_t mn = UINT64_MAX;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t v = mix(sh[i] ^ rc->salt[j]);
            mn = v < mn ? v : mn;
        }
        sig[j] = mn;
    }
}

/* |a ∩ b| / |a ∪ b| of two sorted unique arrays. */
static double jaccard_sorted(const uint64_t *a, uint32_t na, const uint64_t *b, uint32_t nb) {
    uint32_t i = 0, j = 0, inter = 0;
    while (i < na && j < nb) {
        if (a[i] == b[j])
            inter++, i++, j++;
        else if (a[i] < b[j])
            i++;
        else
            j++;
    }
    uint32_t uni = na + nb - inter;
    return uni ? (double)inter / uni : 0.0;
}

void ikv_respcache_options_default(ikv_respcache_options *o) {
    memset(o, 0, sizeof *o);
    o->capacity = 1024;
    o->policy = "lru";
    o->ngram = 3;
    o->max_tokens = 4096;
    o->min_similarity = 0.2;
    o->key_seed = UINT64_C(0x69736f6b76726370); /* "isokvrcp" */
}

static void entry_free(entry *en) {
    ikv_free(en->toks);
    ikv_free(en->sh);
    memset(en, 0, sizeof *en);
}

/* The core dropped an entry's block: free the entry. */
static void on_evict(void *ctx, uint32_t node, ikv_key key, int from_tier, int to_tier) {
    ikv_respcache *rc = ctx;
    (void)key, (void)from_tier, (void)to_tier;
    IKV_ASSERT(node < rc->node_limit && rc->ent[node].used);
    rc->st.bytes -= rc->ent[node].bytes;
    entry_free(&rc->ent[node]);
    rc->st.evictions++;
}

int ikv_respcache_create(const ikv_respcache_options *oin, ikv_respcache **out) {
    ikv_respcache_options o;
    if (oin)
        o = *oin;
    else
        ikv_respcache_options_default(&o);
    if (!o.policy) o.policy = "lru";
    if (o.capacity == 0) return ikv_error(IKV_EINVAL, "response cache: capacity 0");
    if (o.ngram == 0 || o.ngram > 16)
        return ikv_error(IKV_EINVAL, "response cache: ngram %u not in 1..16", o.ngram);
    if (o.max_tokens == 0) o.max_tokens = 4096;
    ikv_respcache *rc = ikv_calloc(1, sizeof *rc);
    if (!rc) return ikv_error(IKV_ENOMEM, "response cache");
    rc->o = o;
    rc->o.policy = NULL; /* copied by the core */
    ikv_cache_config cc;
    ikv_cache_config_default(&cc, o.capacity, o.policy);
    cc.block_tokens = 1;
    cc.promote_on_hit = 0;
    cc.on_evict = on_evict;
    cc.evict_ctx = rc;
    int r = ikv_cache_create(&cc, &rc->core);
    if (r) {
        ikv_free(rc);
        return r;
    }
    rc->node_limit = ikv_cache_node_limit(rc->core);
    rc->ent = ikv_calloc(rc->node_limit, sizeof *rc->ent);
    rc->qsh = ikv_malloc(sizeof *rc->qsh * o.max_tokens);
    if (!rc->ent || !rc->qsh) {
        ikv_respcache_destroy(rc);
        return ikv_error(IKV_ENOMEM, "response cache (%u entries)", o.capacity);
    }
    uint64_t s = o.key_seed;
    for (int j = 0; j < NH; j++)
        rc->salt[j] = mix(s += UINT64_C(0x9e3779b97f4a7c15));
    rc->st.capacity = o.capacity;
    rc->st.max_bytes = o.max_bytes;
    *out = rc;
    return 0;
}

void ikv_respcache_destroy(ikv_respcache *rc) {
    if (!rc) return;
    if (rc->ent)
        for (uint64_t i = 0; i < rc->node_limit; i++)
            if (rc->ent[i].used) entry_free(&rc->ent[i]);
    ikv_cache_destroy(rc->core);
    ikv_free(rc->ent);
    ikv_free(rc->qsh);
    ikv_free(rc);
}

/* The core key of (scope, public, params, prompt). */
static ikv_key entry_key(const ikv_respcache *rc, uint64_t scope, int pub, const uint32_t *p,
                         size_t np, const ikv_respcache_params *pa) {
    uint64_t salt = scope ^ (pub ? UINT64_C(0x5055424c4943) : 0);
    salt = mix(salt ^ XXH3_64bits(pa, sizeof *pa));
    return ikv_key_chain(rc->o.key_seed, NULL, p, np, salt);
}

int ikv_respcache_put(ikv_respcache *rc, const char *tenant, int public_, const uint32_t *prompt,
                      size_t np, const uint32_t *output, size_t no,
                      const ikv_respcache_params *params) {
    if (!prompt || !np || !output || !no)
        return ikv_error(IKV_EINVAL, "response cache: empty prompt or output");
    if (np > rc->o.max_tokens) np = rc->o.max_tokens;
    if (no > rc->o.max_tokens) no = rc->o.max_tokens;
    ikv_respcache_params pa = {0};
    if (params) pa = *params;
    const uint64_t scope = ikv_scope_salt(rc->o.key_seed, tenant);
    const int pub = public_ ? 1 : 0;
    ikv_key key = entry_key(rc, scope, pub, prompt, np, &pa);
    /* everything allocated before anything changes */
    uint32_t *toks = ikv_malloc(sizeof *toks * (np + no));
    uint64_t *sh = ikv_malloc(sizeof *sh * np);
    if (!toks || !sh) {
        ikv_free(toks), ikv_free(sh);
        return ikv_error(IKV_ENOMEM, "response cache entry (%zu + %zu tokens)", np, no);
    }
    memcpy(toks, prompt, sizeof *toks * np);
    memcpy(toks + np, output, sizeof *toks * no);
    uint32_t nsh = shingles(prompt, np, rc->o.ngram, sh);
    const uint64_t nbytes = IKV_RESPCACHE_ENTRY_BYTES + 4 * (uint64_t)(np + no) + 8 * (uint64_t)nsh;
    const uint64_t maxb = rc->o.max_bytes;
    if (maxb && nbytes > maxb) {
        ikv_free(toks), ikv_free(sh);
        rc->st.too_big++;
        return ikv_error(IKV_EFULL,
                         "response cache: an entry of %llu bytes (%zu + %zu tokens) "
                         "is above the budget of %llu bytes",
                         (unsigned long long)nbytes, np, no, (unsigned long long)maxb);
    }
    ikv_access acc = {.now = ++rc->clock};
    uint32_t node;
    size_t m = 0;
    ikv_cache_match(rc->core, &key, 1, &node, NULL, &m);
    if (m == 1) { /* the same request again: the newer response replaces the older */
        entry *en = &rc->ent[node];
        IKV_ASSERT(en->used);
        ikv_free(en->toks), ikv_free(en->sh);
        en->toks = toks, en->sh = sh, en->nsh = nsh, en->np = (uint32_t)np, en->no = (uint32_t)no;
        rc->st.bytes += nbytes - en->bytes;
        en->bytes = nbytes;
        (void)ikv_cache_hit(rc->core, &node, 1, &acc);
        /* over the byte budget: evict others (this one is held locked meanwhile) */
        if (maxb && rc->st.bytes > maxb && !ikv_cache_lock(rc->core, &node, 1)) {
            while (rc->st.bytes > maxb && !ikv_cache_evict(rc->core, 0)) {
            }
            (void)ikv_cache_unlock(rc->core, &node, 1);
        }
        rc->st.replaced++;
        rc->st.puts++;
        return 0;
    }
    /* room by bytes first: the policy's victims until the new entry fits */
    while (maxb && rc->st.bytes + nbytes > maxb)
        if (ikv_cache_evict(rc->core, 0)) {
            ikv_free(toks), ikv_free(sh);
            return ikv_error(IKV_EFULL, "response cache: no evictable entry for %llu bytes",
                             (unsigned long long)nbytes);
        }
    size_t ins = 0;
    int r = ikv_cache_insert(rc->core, &key, 1, 0, &acc, 0, &node, &ins);
    if (r || ins != 1) {
        ikv_free(toks), ikv_free(sh);
        return r ? r : ikv_error(IKV_EFULL, "response cache: no evictable entry");
    }
    entry *en = &rc->ent[node];
    IKV_ASSERT(!en->used);
    en->used = 1, en->pub = pub, en->scope = scope, en->key = key;
    en->toks = toks, en->np = (uint32_t)np, en->no = (uint32_t)no, en->sh = sh, en->nsh = nsh;
    en->params = pa;
    en->bytes = nbytes;
    rc->st.bytes += nbytes;
    signature(rc, sh, nsh, en->sig);
    rc->st.puts++;
    return 0;
}

size_t ikv_respcache_lookup(ikv_respcache *rc, const char *tenant, const uint32_t *prompt,
                            size_t np, ikv_respcache_hit *hits, size_t max) {
    rc->st.lookups++;
    if (!np || !max) return 0;
    if (np > rc->o.max_tokens) np = rc->o.max_tokens;
    const uint64_t scope = ikv_scope_salt(rc->o.key_seed, tenant);
    uint32_t nq = shingles(prompt, np, rc->o.ngram, rc->qsh);
    signature(rc, rc->qsh, nq, rc->qsig);
    /* scan: the RESCORE best estimates (insertion into a small sorted array) */
    uint32_t best[RESCORE];
    double best_est[RESCORE];
    size_t nb = 0;
    for (uint64_t i = 0; i < rc->node_limit; i++) {
        const entry *en = &rc->ent[i];
        if (!en->used || !(en->pub || en->scope == scope)) continue;
        int eq = 0;
        for (int j = 0; j < NH; j++)
            eq += en->sig[j] == rc->qsig[j];
        double est = (double)eq / NH;
        if (eq == 0) continue;
        if (nb == RESCORE && est <= best_est[nb - 1]) continue;
        size_t at = nb < RESCORE ? nb++ : nb - 1;
        while (at > 0 && best_est[at - 1] < est) {
            best[at] = best[at - 1], best_est[at] = best_est[at - 1];
            at--;
        }
        best[at] = (uint32_t)i, best_est[at] = est;
    }
    /* exact rescoring; keep those above the floor, best first */
    size_t n = 0;
    for (size_t c = 0; c < nb; c++) {
        const entry *en = &rc->ent[best[c]];
        double jac = jaccard_sorted(en->sh, en->nsh, rc->qsh, nq);
        if (jac < rc->o.min_similarity || jac <= 0.0) continue;
        ikv_respcache_hit h = {.id = best[c],
                               .similarity = jac,
                               .estimate = best_est[c],
                               .prompt = en->toks,
                               .n_prompt = en->np,
                               .output = en->toks + en->np,
                               .n_output = en->no,
                               .params = en->params};
        size_t at;
        if (n < max)
            at = n++;
        else if (jac > hits[max - 1].similarity)
            at = max - 1;
        else
            continue;
        while (at > 0 && hits[at - 1].similarity < jac) {
            hits[at] = hits[at - 1];
            at--;
        }
        hits[at] = h;
    }
    rc->st.candidates += n;
    return n;
}

void ikv_respcache_used(ikv_respcache *rc, uint32_t id, size_t accepted) {
    if (id >= rc->node_limit || !rc->ent[id].used || !accepted) return;
    ikv_access acc = {.now = ++rc->clock};
    (void)ikv_cache_hit(rc->core, &id, 1, &acc);
    rc->st.used_hits++;
}

void ikv_respcache_stats_get(const ikv_respcache *rc, ikv_respcache_stats *s) {
    *s = rc->st;
    s->entries = 0;
    for (uint64_t i = 0; i < rc->node_limit; i++)
        s->entries += rc->ent[i].used != 0;
}

int ikv_respcache_check(const ikv_respcache *rc) {
    if (!ikv_cache_check(rc->core)) return 0;
    uint64_t used = 0, bytes = 0;
    for (uint64_t i = 0; i < rc->node_limit; i++) {
        const entry *en = &rc->ent[i];
        if (en->used) bytes += en->bytes;
        int res = ikv_cache_node_tier(rc->core, (uint32_t)i) >= 0;
        if (en->used != res)
            return ikv_error(IKV_EINVAL, "response entry %llu: used %d, core node resident %d",
                             (unsigned long long)i, en->used, res);
        if (!en->used) continue;
        used++;
        if (!ikv_key_eq(ikv_cache_node_key(rc->core, (uint32_t)i), en->key))
            return ikv_error(IKV_EINVAL, "response entry %llu: core node has another key",
                             (unsigned long long)i);
        if (!en->np || !en->no || en->np > rc->o.max_tokens || en->no > rc->o.max_tokens ||
            !en->nsh || en->nsh > en->np)
            return ikv_error(IKV_EINVAL, "response entry %llu: %u + %u tokens, %u shingles",
                             (unsigned long long)i, en->np, en->no, en->nsh);
        if (en->bytes !=
            IKV_RESPCACHE_ENTRY_BYTES + 4 * (uint64_t)(en->np + en->no) + 8 * (uint64_t)en->nsh)
            return ikv_error(IKV_EINVAL, "response entry %llu: counts %llu bytes",
                             (unsigned long long)i, (unsigned long long)en->bytes);
        for (uint32_t j = 1; j < en->nsh; j++)
            if (en->sh[j] <= en->sh[j - 1])
                return ikv_error(IKV_EINVAL, "response entry %llu: shingles not sorted unique",
                                 (unsigned long long)i);
    }
    ikv_cache_stats cs;
    ikv_cache_stats_get(rc->core, &cs);
    if (used != cs.resident[0] || used > rc->o.capacity)
        return ikv_error(IKV_EINVAL, "%llu entries, core holds %llu, capacity %u",
                         (unsigned long long)used, (unsigned long long)cs.resident[0],
                         rc->o.capacity);
    if (bytes != rc->st.bytes || (rc->o.max_bytes && bytes > rc->o.max_bytes))
        return ikv_error(IKV_EINVAL, "entries hold %llu bytes, counted %llu, budget %llu",
                         (unsigned long long)bytes, (unsigned long long)rc->st.bytes,
                         (unsigned long long)rc->o.max_bytes);
    return 1;
}

void ikv_respcache_dump(const ikv_respcache *rc, FILE *f) {
    ikv_respcache_stats s;
    ikv_respcache_stats_get(rc, &s);
    fprintf(f,
            "respcache: %llu/%llu entries, %llu puts (%llu replaced), %llu evictions, %llu "
            "lookups, %llu candidates, policy %s\n",
            (unsigned long long)s.entries, (unsigned long long)s.capacity,
            (unsigned long long)s.puts, (unsigned long long)s.replaced,
            (unsigned long long)s.evictions, (unsigned long long)s.lookups,
            (unsigned long long)s.candidates, ikv_cache_policy_name(rc->core, 0));
    for (uint64_t i = 0; i < rc->node_limit; i++) {
        const entry *en = &rc->ent[i];
        if (!en->used) continue;
        fprintf(f,
                "  [%llu] %s scope %016llx: prompt %u tokens (%u shingles), output %u, "
                "temp %g\n",
                (unsigned long long)i, en->pub ? "public" : "private",
                (unsigned long long)en->scope, en->np, en->nsh, en->no,
                (double)en->params.temperature);
    }
}

double ikv_respcache_jaccard(const uint32_t *a, size_t na, const uint32_t *b, size_t nb,
                             uint32_t ngram) {
    if (!na || !nb || !ngram) return 0.0;
    uint64_t *x = ikv_malloc(sizeof *x * na), *y = ikv_malloc(sizeof *y * nb);
    double j = -1.0;
    if (x && y) j = jaccard_sorted(x, shingles(a, na, ngram, x), y, shingles(b, nb, ngram, y));
    ikv_free(x), ikv_free(y);
    return j;
}
