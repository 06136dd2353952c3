/*
 * Tokenizer: llama2.c's tokenizer.bin (a sentencepiece BPE vocabulary exported as pieces and
 * scores), or plain bytes.
 *
 * File layout (little-endian):
 *
 *   int32 max_token_length
 *   vocab_size times:  float32 score, int32 len, len bytes (the piece, no NUL)
 *
 * The vocabulary size is not in the file: it is the model's. Every length is checked against
 * the remaining bytes and against max_token_length; the file must end exactly after the last
 * piece, and must contain the 256 byte-fallback pieces "<0x00>".."<0xFF>" at ids 3..258.
 *
 * Encoding (as llama2.c's run.c does, so a real stories15M vocabulary gives the same ids):
 * optional BOS; a dummy-prefix " " piece when the text is non-empty; each UTF-8 code point
 * looked up as a piece, or else its bytes as byte tokens (3 + byte); then, repeatedly, the
 * adjacent pair whose concatenation is a piece with the highest score is merged (first such
 * pair on ties), until no pair merges; optional EOS. Lookup is a binary search over the
 * pieces sorted once at load. llama2.c rescans every pair after each merge (O(n^2) lookups);
 * here the candidate pairs live in a heap ordered by (score, leftmost), checked for staleness
 * when popped, which picks the same merge at every step in O(n log n) lookups (a test compares
 * the two on random text).
 *
 * Decoding: the piece, without its leading space right after BOS; "<0xHH>" pieces as the byte.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ikv_tokenizer {
    uint32_t vocab;
    uint32_t max_len; /* longest piece, bytes */
    char **piece;     /* [vocab], NUL-terminated */
    float *score;     /* [vocab] */
    struct sorted_piece {
        const char *s;
        uint32_t id;
    } * sorted;         /* pieces sorted by strcmp, for lookup */
    char *pool;         /* storage of all pieces */
    int bytes_only;     /* byte-level: no merges, no dummy prefix */
    char bytes[256][2]; /* one-byte strings for byte tokens */
};

static int cmp_piece(const void *a, const void *b) {
    const struct sorted_piece *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

/* The id of piece s, or -1. */
static long lookup(const ikv_tokenizer *t, const char *s) {
    size_t lo = 0, hi = t->vocab;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s, t->sorted[mid].s);
        if (c == 0) return (long)t->sorted[mid].id;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

static ikv_tokenizer *alloc_tok(uint32_t vocab, size_t pool_bytes) {
    ikv_tokenizer *t = ikv_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->vocab = vocab;
    t->piece = ikv_calloc(vocab, sizeof *t->piece);
    t->score = ikv_calloc(vocab, sizeof *t->score);
    t->sorted = ikv_calloc(vocab, sizeof *t->sorted);
    t->pool = ikv_malloc(pool_bytes ? pool_bytes : 1);
    for (int b = 0; b < 256; b++)
        t->bytes[b][0] = (char)b, t->bytes[b][1] = 0;
    if (!t->piece || !t->score || !t->sorted || !t->pool) {
        ikv_tokenizer_destroy(t);
        return NULL;
    }
    return t;
}

static void finish_sort(ikv_tokenizer *t) {
    for (uint32_t i = 0; i < t->vocab; i++)
        t->sorted[i].s = t->piece[i], t->sorted[i].id = i;
    qsort(t->sorted, t->vocab, sizeof *t->sorted, cmp_piece);
}

int ikv_tokenizer_load(const char *path, uint32_t vocab, ikv_tokenizer **out) {
    if (vocab < 259)
        return ikv_error(IKV_EINVAL, "%s: vocab_size %u is below 259 (3 specials + 256 bytes)",
                         path, vocab);
    FILE *f = fopen(path, "rb");
    if (!f) return ikv_error(IKV_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        int dir = S_ISDIR(st.st_mode);
        fclose(f);
        return ikv_error(IKV_EIO, "%s: %s, not a tokenizer file", path,
                         dir ? "is a directory" : "is not a regular file");
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return ikv_error(IKV_EIO, "%s: cannot seek", path);
    }
    long fsz = ftell(f);
    rewind(f);
    if (fsz < 4) {
        fclose(f);
        return ikv_error(IKV_ETRUNC, "%s: %ld bytes, shorter than the 4-byte header", path, fsz);
    }
    char *buf = ikv_malloc((size_t)fsz);
    if (!buf) {
        fclose(f);
        return ikv_error(IKV_ENOMEM, "%s: %ld bytes", path, fsz);
    }
    size_t got = fread(buf, 1, (size_t)fsz, f);
    fclose(f);
    if (got != (size_t)fsz) {
        ikv_free(buf);
        return ikv_error(IKV_EIO, "%s: short read", path);
    }
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    int rc = 0;
    ikv_tokenizer *t = NULL;
    if (maxlen <= 0 || maxlen > 65536) {
        rc =
            ikv_error(IKV_EFORMAT, "%s: max_token_length %d is not in 1..65536", path, (int)maxlen);
        goto done;
    }
    /* The pieces need at most fsz bytes plus a NUL each. */
    t = alloc_tok(vocab, (size_t)fsz + vocab);
    if (!t) {
        rc = ikv_error(IKV_ENOMEM, "%s: tokenizer of %u pieces", path, vocab);
        goto done;
    }
    t->max_len = (uint32_t)maxlen;
    size_t off = 4, poff = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        if ((size_t)fsz - off < 8) {
            rc = ikv_error(IKV_ETRUNC, "%s: truncated at piece %u of %u (offset %zu)", path, i,
                           vocab, off);
            goto done;
        }
        int32_t len;
        memcpy(&t->score[i], buf + off, 4);
        memcpy(&len, buf + off + 4, 4);
        off += 8;
        if (len < 0 || len > maxlen) {
            rc = ikv_error(IKV_EFORMAT,
                           "%s: piece %u has length %d (max_token_length %d) at offset %zu", path,
                           i, (int)len, (int)maxlen, off - 4);
            goto done;
        }
        if ((size_t)fsz - off < (size_t)len) {
            rc = ikv_error(IKV_ETRUNC,
                           "%s: truncated inside piece %u (needs %d bytes at offset %zu)", path, i,
                           (int)len, off);
            goto done;
        }
        if (memchr(buf + off, 0, (size_t)len)) {
            rc = ikv_error(IKV_EFORMAT, "%s: piece %u contains a NUL byte", path, i);
            goto done;
        }
        t->piece[i] = t->pool + poff;
        memcpy(t->pool + poff, buf + off, (size_t)len);
        t->pool[poff + (size_t)len] = 0;
        poff += (size_t)len + 1;
        off += (size_t)len;
    }
    if (off != (size_t)fsz) {
        rc = ikv_error(IKV_EFORMAT,
                       "%s: %zu trailing bytes after %u pieces (wrong vocab_size for this model?)",
                       path, (size_t)fsz - off, vocab);
        goto done;
    }
    for (int b = 0; b < 256; b++) {
        char want[8];
        snprintf(want, sizeof want, "<0x%02X>", b);
        if (strcmp(t->piece[IKV_TOK_BYTE0 + (uint32_t)b], want)) {
            rc = ikv_error(IKV_EFORMAT, "%s: piece %d is not the byte-fallback piece %s", path,
                           (int)IKV_TOK_BYTE0 + b, want);
            goto done;
        }
    }
    finish_sort(t);
done:
    ikv_free(buf);
    if (rc) {
        ikv_tokenizer_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

int ikv_tokenizer_bytes(uint32_t vocab, ikv_tokenizer **out) {
    if (vocab < 259)
        return ikv_error(IKV_EINVAL, "byte tokenizer needs vocab_size >= 259, model has %u", vocab);
    ikv_tokenizer *t = alloc_tok(vocab, (size_t)vocab * 16);
    if (!t) return ikv_error(IKV_ENOMEM, "byte tokenizer");
    size_t poff = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        char *p = t->pool + poff;
        if (i == IKV_TOK_UNK)
            strcpy(p, "<unk>");
        else if (i == IKV_TOK_BOS)
            strcpy(p, "\n<s>\n");
        else if (i == IKV_TOK_EOS)
            strcpy(p, "\n</s>\n");
        else if (i < 259)
            snprintf(p, 16, "<0x%02X>", i - IKV_TOK_BYTE0);
        else
            snprintf(p, 16, "<tok%u>", i);
        t->piece[i] = p;
        poff += strlen(p) + 1;
    }
    t->max_len = 16;
    t->bytes_only = 1;
    finish_sort(t);
    *out = t;
    return 0;
}

void ikv_tokenizer_destroy(ikv_tokenizer *t) {
    if (!t) return;
    ikv_free(t->piece);
    ikv_free(t->score);
    ikv_free(t->sorted);
    ikv_free(t->pool);
    ikv_free(t);
}

uint32_t ikv_tokenizer_vocab(const ikv_tokenizer *t) {
    return t->vocab;
}

/* Appends token id to out, failing with IKV_ETOOLONG when full. */
static int push(uint32_t *out, size_t max, size_t *n, uint32_t id) {
    if (*n >= max) return ikv_error(IKV_ETOOLONG, "text encodes to more than %zu tokens", max);
    out[(*n)++] = id;
    return 0;
}

/* The id of the piece a ‖ b (its score above the -1e10 floor), or -1. buf holds 2 max_len + 1. */
static long pair_id(const ikv_tokenizer *t, uint32_t a, uint32_t b, char *buf) {
    const char *pa = t->piece[a], *pb = t->piece[b];
    size_t la = strlen(pa), lb = strlen(pb);
    if (la + lb > 2 * (size_t)t->max_len) return -1;
    memcpy(buf, pa, la);
    memcpy(buf + la, pb, lb + 1);
    long id = lookup(t, buf);
    return id >= 0 && t->score[id] > -1e10f ? id : -1;
}

/* Reference merge loop (llama2.c's): rescan all pairs, merge the best (leftmost on ties), repeat.
 * O(n^2) lookups; kept as the oracle of the heap version in tests. */
static int merge_naive(const ikv_tokenizer *t, uint32_t *tok, size_t n, size_t *out_n) {
    char *buf = ikv_malloc(2 * (size_t)t->max_len + 2);
    if (!buf) return ikv_error(IKV_ENOMEM, "encode buffer");
    for (;;) {
        float best = -1e10f;
        long best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            long id = pair_id(t, tok[i], tok[i + 1], buf);
            if (id >= 0 && t->score[id] > best) best = t->score[id], best_id = id, best_i = i;
        }
        if (best_id < 0) break;
        tok[best_i] = (uint32_t)best_id;
        memmove(tok + best_i + 1, tok + best_i + 2, (n - best_i - 2) * sizeof *tok);
        n--;
    }
    ikv_free(buf);
    *out_n = n;
    return 0;
}

/* A candidate merge of the live token at `left` with its right neighbour, valid while both
 * still hold lid and rid. Order: higher score first, then leftmost (the naive loop's choice). */
typedef struct cand {
    float score;
    uint32_t left, lid, rid, id;
} cand;

static int cand_first(const cand *a, const cand *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(cand *h, size_t *hn, cand c) {
    size_t i = (*hn)++;
    while (i && cand_first(&c, &h[(i - 1) / 2]))
        h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *hn) {
    cand top = h[0], last = h[--(*hn)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *hn) break;
        if (c + 1 < *hn && cand_first(&h[c + 1], &h[c])) c++;
        if (!cand_first(&h[c], &last)) break;
        h[i] = h[c], i = c;
    }
    if (*hn) h[i] = last;
    return top;
}

/* The same merges as merge_naive, in O(n log n): tokens form a linked list, candidate pairs
 * sit in a max-heap keyed by (score, -position) and are checked for staleness when popped.
 * Each merge adds at most two candidates, so the heap never holds more than 3n. */
static int merge_heap(const ikv_tokenizer *t, uint32_t *tok, size_t n, size_t *out_n) {
    if (n < 2) {
        *out_n = n;
        return 0;
    }
    uint32_t *nxt = ikv_malloc(sizeof *nxt * n), *prv = ikv_malloc(sizeof *prv * n);
    cand *h = ikv_malloc(sizeof *h * 3 * n);
    char *buf = ikv_malloc(2 * (size_t)t->max_len + 2);
    if (!nxt || !prv || !h || !buf) {
        ikv_free(nxt), ikv_free(prv), ikv_free(h), ikv_free(buf);
        return ikv_error(IKV_ENOMEM, "encode buffers for %zu tokens", n);
    }
    const uint32_t NONE = UINT32_MAX;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++)
        nxt[i] = i + 1 < n ? (uint32_t)i + 1 : NONE, prv[i] = i ? (uint32_t)i - 1 : NONE;
#define CONSIDER(l)                                                                                \
    do {                                                                                           \
        uint32_t l_ = (l), r_ = nxt[l_];                                                           \
        long id_ = r_ == NONE ? -1 : pair_id(t, tok[l_], tok[r_], buf);                            \
        if (id_ >= 0)                                                                              \
            heap_push(h, &hn, (cand){t->score[id_], l_, tok[l_], tok[r_], (uint32_t)id_});         \
    } while (0)
    for (size_t i = 0; i + 1 < n; i++)
        CONSIDER((uint32_t)i);
    while (hn) {
        cand c = heap_pop(h, &hn);
        uint32_t r = nxt[c.left];
        if (tok[c.left] != c.lid || r == NONE || tok[r] != c.rid || prv[r] != c.left)
            continue; /* stale */
        tok[c.left] = c.id;
        nxt[c.left] = nxt[r];
        if (nxt[r] != NONE) prv[nxt[r]] = c.left;
        tok[r] = UINT32_MAX; /* dead */
        prv[r] = NONE;
        if (prv[c.left] != NONE) CONSIDER(prv[c.left]);
        CONSIDER(c.left);
    }
#undef CONSIDER
    size_t m = 0;
    for (uint32_t i = 0; i != NONE; i = nxt[i])
        tok[m++] = tok[i];
    ikv_free(nxt), ikv_free(prv), ikv_free(h), ikv_free(buf);
    *out_n = m;
    return 0;
}

int ikv_tokenizer_encode(const ikv_tokenizer *t, const char *text, int bos, int eos, uint32_t *out,
                         size_t max, size_t *n) {
    return ikv__tokenizer_encode_with(t, text, bos, eos, out, max, n, 0);
}

int ikv__tokenizer_encode_with(const ikv_tokenizer *t, const char *text, int bos, int eos,
                               uint32_t *out, size_t max, size_t *n, int naive) {
    *n = 0;
    size_t m = 0;
    int rc;
    if (bos && (rc = push(out, max, n, IKV_TOK_BOS))) return rc;
    const unsigned char *s = (const unsigned char *)text;
    if (t->bytes_only) {
        for (; *s; s++)
            if ((rc = push(out, max, n, IKV_TOK_BYTE0 + *s))) return rc;
        if (eos && (rc = push(out, max, n, IKV_TOK_EOS))) return rc;
        return 0;
    }
    size_t start = *n;
    if (*s) {
        long sp = lookup(t, " ");
        if ((rc = push(out, max, n, sp >= 0 ? (uint32_t)sp : IKV_TOK_BYTE0 + ' '))) return rc;
    }
    char cp[8];
    while (*s) {
        /* one UTF-8 code point: a lead byte and its continuation bytes (at most 4 in all) */
        size_t k = 0;
        cp[k++] = (char)*s++;
        while (*s && (*s & 0xC0) == 0x80 && k < 4)
            cp[k++] = (char)*s++;
        cp[k] = 0;
        long id = lookup(t, cp);
        if (id >= 0) {
            if ((rc = push(out, max, n, (uint32_t)id))) return rc;
        } else {
            for (size_t i = 0; i < k; i++)
                if ((rc = push(out, max, n, IKV_TOK_BYTE0 + (unsigned char)cp[i]))) return rc;
        }
    }
    rc = naive ? merge_naive(t, out + start, *n - start, &m)
               : merge_heap(t, out + start, *n - start, &m);
    if (rc) return rc;
    *n = start + m;
    if (eos && (rc = push(out, max, n, IKV_TOK_EOS))) return rc;
    return 0;
}

const char *ikv_tokenizer_decode(const ikv_tokenizer *t, uint32_t prev, uint32_t token,
                                 size_t *len) {
    if (token >= t->vocab) {
        *len = 0;
        return "";
    }
    const char *p = t->piece[token];
    if (prev == IKV_TOK_BOS && p[0] == ' ') p++;
    unsigned b;
    char tail;
    if (strlen(p) == 6 && sscanf(p, "<0x%2X%c", &b, &tail) == 2 && tail == '>') {
        *len = 1;
        return t->bytes[b & 0xFF];
    }
    *len = strlen(p);
    return p;
}

/* ---- synthetic vocabulary ------------------------------------------------------------------ */

typedef struct strset {
    char **slot;
    size_t cap;
} strset;

static uint64_t fnv(const char *s) {
    uint64_t h = UINT64_C(1469598103934665603);
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(1099511628211);
    return h;
}

/* Inserts s (not copied) unless present; returns 1 if inserted. */
static int strset_add(strset *ss, char *s) {
    size_t i = (size_t)fnv(s) & (ss->cap - 1);
    while (ss->slot[i]) {
        if (!strcmp(ss->slot[i], s)) return 0;
        i = (i + 1) & (ss->cap - 1);
    }
    ss->slot[i] = s;
    return 1;
}

static uint64_t xs(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * UINT64_C(0x2545F4914F6CDD1D);
}

int ikv_tokenizer_write_synthetic_stream(FILE *f, uint32_t vocab, uint64_t seed) {
    if (vocab < 259)
        return ikv_error(IKV_EINVAL, "tokenizer needs vocab_size >= 259, got %u", vocab);
    const uint32_t maxlen = 16;
    char *pool = ikv_calloc(vocab, maxlen + 1);
    char **piece = ikv_calloc(vocab, sizeof *piece);
    size_t cap = 1;
    while (cap < 2 * (size_t)vocab)
        cap <<= 1;
    strset ss = {ikv_calloc(cap, sizeof(char *)), cap};
    if (!pool || !piece || !ss.slot) {
        ikv_free(pool), ikv_free(piece), ikv_free(ss.slot);
        return ikv_error(IKV_ENOMEM, "synthetic tokenizer");
    }
    uint32_t n = 0;
#define NEXT() (piece[n] = pool + (size_t)n * (maxlen + 1))
    strcpy(NEXT(), "<unk>"), n++;
    strcpy(NEXT(), "\n<s>\n"), n++;
    strcpy(NEXT(), "\n</s>\n"), n++;
    for (int b = 0; b < 256; b++)
        snprintf(NEXT(), maxlen + 1, "<0x%02X>", b), strset_add(&ss, piece[n]), n++;
    /* printable ASCII, most frequent English letters first */
    const char *freq = " etaoinshrdlcumwfgypbvkjxqz";
    for (const char *c = freq; *c && n < vocab; c++)
        NEXT()[0] = *c, strset_add(&ss, piece[n]), n++;
    for (int c = 33; c < 127 && n < vocab; c++) {
        NEXT()[0] = (char)c;
        if (strset_add(&ss, piece[n])) n++;
    }
    /* merges: a word-ish piece (optionally space-led) extended by a frequent letter; early
     * pieces are drawn more often, like a real BPE vocabulary's frequency order */
    uint32_t first_merge = n;
    uint64_t s = seed * 2 + 1;
    size_t tries = 0;
    while (n < vocab && tries < (size_t)vocab * 200) {
        tries++;
        uint32_t span = n - 259;
        uint32_t r = (uint32_t)(xs(&s) % span), r2 = (uint32_t)(xs(&s) % span);
        uint32_t a = 259 + (r < r2 ? r : r2); /* min of two: skewed towards early pieces */
        const char *pa = piece[a];
        char add = freq[1 + xs(&s) % 26];
        if (a < first_merge && pa[0] != ' ' && (xs(&s) & 1)) pa = " ";
        size_t la = strlen(pa);
        if (la + 1 > maxlen || (pa[0] != ' ' && !(pa[0] >= 'a' && pa[0] <= 'z'))) continue;
        char *p = NEXT();
        memcpy(p, pa, la), p[la] = add, p[la + 1] = 0;
        if (strset_add(&ss, p)) n++;
    }
    for (; n < vocab; n++)
        snprintf(NEXT(), maxlen + 1, "<x%u>", n); /* tiny vocab spill */
#undef NEXT
    int rc = 0;
    int32_t ml = (int32_t)maxlen;
    int bad = fwrite(&ml, 4, 1, f) != 1;
    for (uint32_t i = 0; i < vocab && !bad; i++) {
        /* specials and bytes score 0; singles and merges score by rank (earlier = higher) */
        float score = i < 259 ? 0.0f : -(float)(i - 259);
        int32_t len = (int32_t)strlen(piece[i]);
        bad = fwrite(&score, 4, 1, f) != 1 || fwrite(&len, 4, 1, f) != 1 ||
              fwrite(piece[i], 1, (size_t)len, f) != (size_t)len;
    }
    if (bad) rc = ikv_error(IKV_EIO, "tokenizer: write failed: %s", strerror(errno));
    ikv_free(pool), ikv_free(piece), ikv_free(ss.slot);
    return rc;
}

int ikv_tokenizer_write_synthetic(const char *path, uint32_t vocab, uint64_t seed) {
    ikv_outset *s = NULL;
    FILE *f = NULL;
    int rc = ikv_outset_create(&s);
    if (rc) return rc;
    if (!(rc = ikv_outset_add(s, path, &f, NULL)) &&
        !(rc = ikv_tokenizer_write_synthetic_stream(f, vocab, seed)))
        rc = ikv_outset_commit(s);
    ikv_outset_destroy(s);
    return rc;
}
