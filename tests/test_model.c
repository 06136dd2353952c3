/*
 * Tests for model/: checkpoints (sizes, round trip, malformed files), tokenizer (round trips,
 * malformed files), sampler (determinism), and the engine: a plain reference forward (one
 * token at a time, contiguous KV, no BLAS) agrees within 1e-4 relative on every logit; with
 * and without the cache a prompt gives bit-identical logits, K/V and greedy tokens for full,
 * partial and no hits, at several tile sizes; tenants never share private blocks while a
 * public prefix is shared; a tampered cached block (a stand-in for a key collision) is a miss;
 * eviction returns blocks to the pool; long prompts are rejected; allocation failures leave
 * nothing behind. All on the `tiny` config.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cblas.h>

#include "isokv/model.h"
#include "model/internal.h"
#include "engine_testutil.h"
#include "testutil.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    return tu_path(tmpdir, name);
}

static int setup_all(void **st) {
    (void)st;
    return tu_tmpdir(tmpdir, sizeof tmpdir, "model");
}

static int teardown_all(void **st) {
    (void)st;
    return tu_rmtree(tmpdir);
}

static ikv_model_config tiny(void) {
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    return c;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    void *p = malloc(*n ? *n : 1);
    assert_int_equal(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

/* ---- checkpoints ------------------------------------------------------------------------- */

static void test_config_sizes(void **st) {
    (void)st;
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("stories15m", &c), 0);
    /* the real stories15M.bin is 60,816,028 bytes */
    assert_int_equal(ikv_model_file_bytes(&c), 60816028);
    assert_int_equal(ikv_model_kv_bytes_per_token(&c), 2 * 6 * 288 * 4);
    assert_int_equal(ikv_model_config_named("small", &c), 0);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(ikv_model_kv_bytes_per_token(&c), 2 * 8 * 256 * 4);
    assert_int_equal(ikv_model_config_named("nope", &c), IKV_EMODEL);
    assert_non_null(strstr(ikv_errdetail(), "nope"));
}

static void test_checkpoint_roundtrip(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    const char *p = tmp_path("tiny.bin");
    assert_int_equal(ikv_model_write_random(p, &c, 7), 0);
    ikv_model *a, *b, *d;
    assert_int_equal(ikv_model_load(p, &a), 0);
    assert_int_equal(ikv_model_random(&c, 7, &b), 0);
    assert_int_equal(ikv_model_random(&c, 8, &d), 0);
    assert_int_equal(a->image_bytes, ikv_model_file_bytes(&c));
    assert_memory_equal(a->image, b->image, a->image_bytes);
    assert_memory_not_equal(a->image, d->image, a->image_bytes);
    assert_memory_equal(ikv_model_cfg(a), &c, sizeof c);
    assert_ptr_equal(a->w.wcls, a->w.emb);
    ikv_model_destroy(a), ikv_model_destroy(b), ikv_model_destroy(d);
    /* a separate classifier: negative vocab in the header, wcls at the end */
    c.shared_classifier = 0;
    assert_int_equal(ikv_model_write_random(p, &c, 7), 0);
    assert_int_equal(ikv_model_load(p, &a), 0);
    assert_int_equal(a->cfg.shared_classifier, 0);
    assert_int_equal(a->cfg.vocab_size, 512);
    int32_t h[7];
    memcpy(h, a->image, sizeof h);
    assert_int_equal(h[5], -512);
    assert_ptr_equal(a->w.wcls + (size_t)512 * 64,
                     (const float *)((const char *)a->image + a->image_bytes));
    ikv_model_destroy(a);
}

/* Writes a tiny checkpoint with header fields h and `bytes` bytes of payload (or the correct
 * payload size when bytes == SIZE_MAX), then expects load to fail with rc and a detail
 * containing `word`. */
static void expect_bad_ckpt(const int32_t h[7], size_t payload, int rc, const char *word) {
    const char *p = tmp_path("bad.bin");
    size_t n = 28 + payload;
    char *buf = calloc(1, n);
    memcpy(buf, h, 28);
    write_bytes(p, buf, n);
    free(buf);
    ikv_model *m = NULL;
    int got = ikv_model_load(p, &m);
    if (got != rc || !strstr(ikv_errdetail(), word))
        fail_msg("expected %d with '%s', got %d: %s", rc, word, got, ikv_errdetail());
    assert_null(m);
}

static void test_checkpoint_malformed(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    size_t good = (size_t)ikv_model_file_bytes(&c) - 28;
    int32_t ok[7] = {c.dim,        c.hidden_dim, c.n_layers, c.n_heads,
                     c.n_kv_heads, c.vocab_size, c.seq_len};
    int32_t h[7];
#define WITH(i, v) (memcpy(h, ok, sizeof h), h[i] = (v), h)
    expect_bad_ckpt(WITH(0, 0), good, IKV_EFORMAT, "dim");
    expect_bad_ckpt(WITH(2, -3), good, IKV_EFORMAT, "n_layers = -3");
    expect_bad_ckpt(WITH(1, 2000000000), good, IKV_EFORMAT, "hidden_dim");
    expect_bad_ckpt(WITH(5, INT32_MIN), good, IKV_EFORMAT, "vocab_size");
    expect_bad_ckpt(WITH(6, 0x7fffffff), good, IKV_EFORMAT, "seq_len");
    expect_bad_ckpt(WITH(3, 3), good, IKV_EFORMAT, "n_heads");
    expect_bad_ckpt(WITH(4, 3), good, IKV_EFORMAT, "n_kv_heads");
    expect_bad_ckpt(WITH(0, 0x616b3432), good, IKV_EFORMAT, "ak42");
    expect_bad_ckpt(ok, good - 4, IKV_ETRUNC, "truncated");
    expect_bad_ckpt(ok, 0, IKV_ETRUNC, "truncated");
    expect_bad_ckpt(ok, good + 8, IKV_EFORMAT, "8 trailing bytes");
    /* a negative vocab (separate classifier) needs vocab*dim more floats */
    expect_bad_ckpt(WITH(5, -c.vocab_size), good, IKV_ETRUNC, "truncated");
    /* shorter than the header; missing file */
    write_bytes(tmp_path("short.bin"), ok, 10);
    ikv_model *m = NULL;
    assert_int_equal(ikv_model_load(tmp_path("short.bin"), &m), IKV_ETRUNC);
    assert_non_null(strstr(ikv_errdetail(), "28-byte"));
    assert_int_equal(ikv_model_load(tmp_path("missing.bin"), &m), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), "missing.bin"));
#undef WITH
}

/* ---- tokenizer --------------------------------------------------------------------------- */

static void roundtrip(const ikv_tokenizer *t, const char *text) {
    uint32_t ids[512];
    size_t n;
    assert_int_equal(ikv_tokenizer_encode(t, text, 1, 0, ids, 512, &n), 0);
    assert_true(n >= 1);
    assert_int_equal(ids[0], IKV_TOK_BOS);
    char out[2048];
    size_t len = 0;
    for (size_t i = 1; i < n; i++) {
        size_t pl;
        const char *p = ikv_tokenizer_decode(t, ids[i - 1], ids[i], &pl);
        memcpy(out + len, p, pl);
        len += pl;
    }
    out[len] = 0;
    /* the dummy prefix space is dropped after BOS, so decoding gives the text back */
    if (strcmp(out, text)) fail_msg("round trip of '%s' gave '%s'", text, out);
}

static void test_tokenizer_roundtrip(void **st) {
    (void)st;
    const char *p = tmp_path("tok.bin");
    assert_int_equal(ikv_tokenizer_write_synthetic(p, 512, 1), 0);
    ikv_tokenizer *t, *b;
    assert_int_equal(ikv_tokenizer_load(p, 512, &t), 0);
    assert_int_equal(ikv_tokenizer_bytes(512, &b), 0);
    const char *texts[] = {"hello world",
                           "the cat sat on the mat",
                           "Once upon a time, there was a tiny robot.",
                           "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93 \xf0\x9f\x99\x82",
                           "tabs\tand\nnewlines  x",
                           "a",
                           ""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        if (texts[i][0]) roundtrip(t, texts[i]);
        roundtrip(b, texts[i]);
    }
    /* merges happen: the synthetic vocab compresses English below one token per byte */
    uint32_t ids[256];
    size_t n;
    const char *eng = "the then there these other that this tea eat ate";
    assert_int_equal(ikv_tokenizer_encode(t, eng, 0, 0, ids, 256, &n), 0);
    assert_true(n < strlen(eng));
    /* byte level: one token per byte, ids 3 + byte */
    assert_int_equal(ikv_tokenizer_encode(b, "AB", 1, 1, ids, 256, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ids[1], 3 + 'A');
    assert_int_equal(ids[3], IKV_TOK_EOS);
    /* too many tokens for the buffer */
    assert_int_equal(ikv_tokenizer_encode(b, "abcdef", 0, 0, ids, 3, &n), IKV_ETOOLONG);
    ikv_tokenizer_destroy(t), ikv_tokenizer_destroy(b);
    /* the same seed writes the same file */
    size_t n1, n2;
    assert_int_equal(ikv_tokenizer_write_synthetic(tmp_path("tok2.bin"), 512, 1), 0);
    void *f1 = read_all(p, &n1), *f2 = read_all(tmp_path("tok2.bin"), &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(f1, f2, n1);
    free(f1), free(f2);
}

/* The heap merge loop picks the same merges as llama2.c's rescan loop (the oracle), on random
 * texts over a large and a small synthetic vocabulary, ASCII and UTF-8. */
static void test_tokenizer_heap_vs_naive(void **st) {
    (void)st;
    const char *p = tmp_path("tok32k.bin");
    uint32_t vocabs[] = {32000, 512};
    const char *alpha[] = {"e", "t", "a", "o",  " ",        "th", "he", "in",
                           "s", "r", ".", "\n", "\xc3\xa9", "q",  "z"};
    uint64_t rs = 7;
    for (int v = 0; v < 2; v++) {
        assert_int_equal(ikv_tokenizer_write_synthetic(p, vocabs[v], 5), 0);
        ikv_tokenizer *t;
        assert_int_equal(ikv_tokenizer_load(p, vocabs[v], &t), 0);
        for (int k = 0; k < 60; k++) {
            char text[700];
            size_t len = 0;
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            size_t words = 1 + (rs >> 33) % 200;
            for (size_t w = 0; w < words && len + 3 < sizeof text; w++) {
                rs = rs * 6364136223846793005ull + 1442695040888963407ull;
                const char *a = alpha[(rs >> 33) % 15];
                size_t al = strlen(a);
                if (len + al + 1 >= sizeof text) break;
                memcpy(text + len, a, al);
                len += al;
            }
            text[len] = 0;
            uint32_t x[800], y[800];
            size_t nx, ny;
            assert_int_equal(ikv__tokenizer_encode_with(t, text, 1, 0, x, 800, &nx, 0), 0);
            assert_int_equal(ikv__tokenizer_encode_with(t, text, 1, 0, y, 800, &ny, 1), 0);
            assert_int_equal(nx, ny);
            assert_memory_equal(x, y, nx * sizeof *x);
        }
        ikv_tokenizer_destroy(t);
    }
}

static void expect_bad_tok(const void *buf, size_t n, uint32_t vocab, int rc, const char *word) {
    const char *p = tmp_path("badtok.bin");
    write_bytes(p, buf, n);
    ikv_tokenizer *t = NULL;
    int got = ikv_tokenizer_load(p, vocab, &t);
    if (got != rc || !strstr(ikv_errdetail(), word))
        fail_msg("expected %d with '%s', got %d: %s", rc, word, got, ikv_errdetail());
    assert_null(t);
}

static void test_tokenizer_malformed(void **st) {
    (void)st;
    const char *p = tmp_path("tok.bin");
    assert_int_equal(ikv_tokenizer_write_synthetic(p, 512, 1), 0);
    size_t n;
    unsigned char *buf = read_all(p, &n);
    expect_bad_tok(buf, n - 3, 512, IKV_ETRUNC, "truncated");
    expect_bad_tok(buf, 2, 512, IKV_ETRUNC, "header");
    expect_bad_tok(buf, n, 500, IKV_EFORMAT, "trailing");
    expect_bad_tok(buf, n, 600, IKV_ETRUNC, "truncated");
    unsigned char *b2 = malloc(n);
    memcpy(b2, buf, n);
    int32_t v = -5;
    memcpy(b2 + 4 + 4, &v, 4); /* length of piece 0 */
    expect_bad_tok(b2, n, 512, IKV_EFORMAT, "length -5");
    v = 1000;
    memcpy(b2 + 4 + 4, &v, 4);
    expect_bad_tok(b2, n, 512, IKV_EFORMAT, "max_token_length");
    memcpy(b2, buf, n);
    v = 0;
    memcpy(b2, &v, 4);
    expect_bad_tok(b2, n, 512, IKV_EFORMAT, "max_token_length 0");
    /* piece 3 must be <0x00>: rename it */
    memcpy(b2, buf, n);
    size_t off = 4;
    for (int i = 0; i < 3; i++) {
        int32_t len;
        memcpy(&len, b2 + off + 4, 4);
        off += 8 + (size_t)len;
    }
    b2[off + 8 + 1] = 'X'; /* "<X..." */
    expect_bad_tok(b2, n, 512, IKV_EFORMAT, "byte-fallback");
    expect_bad_tok(buf, n, 100, IKV_EINVAL, "259");
    free(b2), free(buf);
    ikv_tokenizer *t;
    assert_int_equal(ikv_tokenizer_load(tmp_path("none.bin"), 512, &t), IKV_EIO);
}

/* ---- sampler ----------------------------------------------------------------------------- */

static void test_sampler(void **st) {
    (void)st;
    enum { V = 300 };
    float base[V], l[V];
    uint64_t s = 99;
    for (int i = 0; i < V; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        base[i] = (float)((s >> 40) % 1000) / 200.0f;
    }
    base[123] = 10.0f;
    ikv_sampler *g, *a, *b, *c, *tp;
    assert_int_equal(ikv_sampler_create(V, 0.0f, 0.9f, 1, &g), 0);
    memcpy(l, base, sizeof l);
    assert_int_equal(ikv_sampler_sample(g, l), 123);
    assert_int_equal(ikv_sampler_create(V, 1.0f, 0.9f, 42, &a), 0);
    assert_int_equal(ikv_sampler_create(V, 1.0f, 0.9f, 42, &b), 0);
    assert_int_equal(ikv_sampler_create(V, 1.0f, 0.9f, 43, &c), 0);
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        for (int j = 0; j < V; j++)
            base[j] = (float)((i * 31 + j * 17) % 97) / 20.0f;
        memcpy(l, base, sizeof l);
        uint32_t x = ikv_sampler_sample(a, l);
        memcpy(l, base, sizeof l);
        uint32_t y = ikv_sampler_sample(b, l);
        memcpy(l, base, sizeof l);
        uint32_t z = ikv_sampler_sample(c, l);
        assert_int_equal(x, y);
        assert_true(x < V && z < V);
        differ += x != z;
    }
    assert_true(differ > 0);
    /* top-p keeps only the dominant token when it holds more than p of the mass */
    assert_int_equal(ikv_sampler_create(V, 1.0f, 0.5f, 5, &tp), 0);
    for (int i = 0; i < 50; i++) {
        for (int j = 0; j < V; j++)
            l[j] = 0.0f;
        l[7] = 12.0f;
        assert_int_equal(ikv_sampler_sample(tp, l), 7);
    }
    ikv_sampler *bad;
    assert_int_equal(ikv_sampler_create(V, -1.0f, 0.9f, 1, &bad), IKV_EINVAL);
    assert_int_equal(ikv_sampler_create(0, 1.0f, 0.9f, 1, &bad), IKV_EINVAL);
    ikv_sampler_destroy(g), ikv_sampler_destroy(a), ikv_sampler_destroy(b), ikv_sampler_destroy(c);
    ikv_sampler_destroy(tp);
}

/* ---- reference forward: one token at a time, contiguous KV, no BLAS ----------------------- */

typedef struct ref {
    const ikv_model *m;
    float *kc, *vc; /* [layer][seq][kv_dim] */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *sc, *logits;
} ref;

static void ref_init(ref *r, const ikv_model *m) {
    const ikv_model_config *c = &m->cfg;
    r->m = m;
    size_t S = (size_t)c->seq_len, L = (size_t)c->n_layers;
    r->kc = calloc(L * S * (size_t)m->kv_dim, sizeof(float));
    r->vc = calloc(L * S * (size_t)m->kv_dim, sizeof(float));
    r->x = calloc((size_t)c->dim, 4), r->xb = calloc((size_t)c->dim, 4),
    r->q = calloc((size_t)c->dim, 4);
    r->k = calloc((size_t)m->kv_dim, 4), r->v = calloc((size_t)m->kv_dim, 4),
    r->att = calloc((size_t)c->dim, 4);
    r->hb = calloc((size_t)c->hidden_dim, 4), r->hb2 = calloc((size_t)c->hidden_dim, 4);
    r->sc = calloc(S, 4), r->logits = calloc((size_t)c->vocab_size, 4);
}

static void ref_free(ref *r) {
    free(r->kc), free(r->vc), free(r->x), free(r->xb), free(r->q), free(r->k), free(r->v),
        free(r->att);
    free(r->hb), free(r->hb2), free(r->sc), free(r->logits);
}

static void ref_rms(float *o, const float *x, const float *w, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + 1e-5));
    for (int i = 0; i < n; i++)
        o[i] = w[i] * (inv * x[i]);
}

static void ref_matvec(float *y, const float *W, const float *x, int out, int in) {
    for (int i = 0; i < out; i++) {
        double s = 0;
        for (int j = 0; j < in; j++)
            s += (double)W[(size_t)i * in + j] * x[j];
        y[i] = (float)s;
    }
}

static void ref_rope(float *v, int width, int hs, int pos) {
    for (int i = 0; i < width; i += 2) {
        double f = pow(10000.0, -(double)(i % hs) / hs), a = pos * f;
        float v0 = v[i], v1 = v[i + 1];
        v[i] = (float)(v0 * cos(a) - v1 * sin(a));
        v[i + 1] = (float)(v0 * sin(a) + v1 * cos(a));
    }
}

static void ref_step(ref *r, uint32_t tok, int pos) {
    const ikv_model *m = r->m;
    const ikv_model_config *c = &m->cfg;
    const ikv__weights *w = &m->w;
    int dim = c->dim, hid = c->hidden_dim, hs = m->head_dim, kvd = m->kv_dim, S = c->seq_len;
    memcpy(r->x, w->emb + (size_t)tok * dim, sizeof(float) * (size_t)dim);
    for (int l = 0; l < c->n_layers; l++) {
        ref_rms(r->xb, r->x, w->rms_att + (size_t)l * dim, dim);
        ref_matvec(r->q, w->wq + (size_t)l * dim * dim, r->xb, dim, dim);
        ref_matvec(r->k, w->wk + (size_t)l * kvd * dim, r->xb, kvd, dim);
        ref_matvec(r->v, w->wv + (size_t)l * kvd * dim, r->xb, kvd, dim);
        ref_rope(r->q, dim, hs, pos);
        ref_rope(r->k, kvd, hs, pos);
        float *kc = r->kc + ((size_t)l * S) * kvd, *vc = r->vc + ((size_t)l * S) * kvd;
        memcpy(kc + (size_t)pos * kvd, r->k, sizeof(float) * (size_t)kvd);
        memcpy(vc + (size_t)pos * kvd, r->v, sizeof(float) * (size_t)kvd);
        int kvmul = c->n_heads / c->n_kv_heads;
        for (int h = 0; h < c->n_heads; h++) {
            int g = h / kvmul;
            double mx = -1e30;
            for (int t = 0; t <= pos; t++) {
                double d = 0;
                for (int i = 0; i < hs; i++)
                    d += (double)r->q[h * hs + i] * kc[(size_t)t * kvd + g * hs + i];
                r->sc[t] = (float)(d / sqrt((double)hs));
                if (r->sc[t] > mx) mx = r->sc[t];
            }
            double sum = 0;
            for (int t = 0; t <= pos; t++)
                sum += exp(r->sc[t] - mx);
            for (int i = 0; i < hs; i++) {
                double o = 0;
                for (int t = 0; t <= pos; t++)
                    o += exp(r->sc[t] - mx) / sum * vc[(size_t)t * kvd + g * hs + i];
                r->att[h * hs + i] = (float)o;
            }
        }
        ref_matvec(r->xb, w->wo + (size_t)l * dim * dim, r->att, dim, dim);
        for (int i = 0; i < dim; i++)
            r->x[i] += r->xb[i];
        ref_rms(r->xb, r->x, w->rms_ffn + (size_t)l * dim, dim);
        ref_matvec(r->hb, w->w1 + (size_t)l * hid * dim, r->xb, hid, dim);
        ref_matvec(r->hb2, w->w3 + (size_t)l * hid * dim, r->xb, hid, dim);
        for (int i = 0; i < hid; i++)
            r->hb[i] = (float)(r->hb[i] / (1.0 + exp(-(double)r->hb[i])) * r->hb2[i]);
        ref_matvec(r->xb, w->w2 + (size_t)l * dim * hid, r->hb, dim, hid);
        for (int i = 0; i < dim; i++)
            r->x[i] += r->xb[i];
    }
    ref_rms(r->xb, r->x, w->rms_final, dim);
    ref_matvec(r->logits, w->wcls, r->xb, c->vocab_size, dim);
}

/* |a - b| <= 1e-4 * max(|b|, rms of the row): relative error, with the row's scale standing in
 * for logits that are near zero. */
static void assert_close_row(const float *a, const float *b, int n, const char *what, int pos) {
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)b[i] * b[i];
    double rms = sqrt(ss / n);
    for (int i = 0; i < n; i++) {
        double tol = 1e-4 * fmax(fabs(b[i]), rms);
        if (fabs((double)a[i] - b[i]) > tol)
            fail_msg("%s: position %d logit %d: engine %.9g, reference %.9g", what, pos, i, a[i],
                     b[i]);
    }
}

static void make_prompt(uint32_t *t, size_t n, uint64_t seed, uint32_t vocab) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = 3 + (uint32_t)((seed >> 33) % (vocab - 3));
    }
}

static void test_reference_forward(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    c.shared_classifier = 0; /* exercise a separate classifier too */
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 3, &m), 0);
    enum { N = 70, DEC = 12 };
    int V = c.vocab_size;
    uint32_t toks[N];
    make_prompt(toks, N, 11, (uint32_t)V);
    /* the last two run the forward pass on 2 and 3 threads (uneven partitions of the 2 kv heads,
     * 64 rows and 176 hidden columns) */
    uint32_t tiles[] = {64, 16, 48, 64, 16};
    int threads[] = {1, 1, 1, 2, 3};
    for (size_t ti = 0; ti < 5; ti++) {
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.tile = tiles[ti];
        o.threads = threads[ti];
        ikv_engine *e;
        assert_int_equal(ikv_engine_create(m, &o, &e), 0);
        float *all = calloc((size_t)N * V, 4);
        ikv_request rq = {.tokens = toks, .n = N, .logits_all = all};
        ikv_seq *s;
        ikv_prefill_info info;
        assert_int_equal(ikv_engine_begin(e, &rq, &s, &info), 0);
        assert_int_equal(info.computed_tokens, N);
        ref r;
        ref_init(&r, m);
        for (int p = 0; p < N; p++) {
            ref_step(&r, toks[p], p);
            assert_close_row(all + (size_t)p * V, r.logits, V, "prefill", p);
        }
        uint32_t next = tu_argmax(ikv_seq_logits(s), V);
        for (int d = 0; d < DEC; d++) {
            const float *lg;
            assert_int_equal(ikv_engine_decode(e, s, next, &lg), 0);
            ref_step(&r, next, N + d);
            assert_close_row(lg, r.logits, V, "decode", N + d);
            next = tu_argmax(lg, V);
        }
        /* K/V in the blocks match the contiguous reference cache */
        float k[256], v[256];
        for (int p = 0; p < N + DEC; p += 7)
            for (int l = 0; l < c.n_layers; l++) {
                assert_int_equal(ikv_seq_kv(e, s, (size_t)p, l, k, v), 0);
                const float *rk = r.kc + ((size_t)l * c.seq_len + p) * m->kv_dim;
                for (int i = 0; i < m->kv_dim; i++)
                    assert_true(fabsf(k[i] - rk[i]) <= 1e-4f * fmaxf(1.0f, fabsf(rk[i])));
            }
        assert_int_equal(ikv_seq_kv(e, s, N + DEC, 0, k, v), IKV_ERANGE);
        ikv_engine_end(e, s);
        assert_true(ikv_engine_check(e));
        ref_free(&r);
        free(all);
        ikv_engine_destroy(e);
    }
    ikv_model_destroy(m);
}

/* ---- exactness with and without the cache ----------------------------------------------- */

typedef struct run_out {
    float *logits; /* [n + dec][V]: prompt rows (only computed ones filled), then decode rows */
    uint32_t gen[32];
    ikv_prefill_info info;
    float *kv; /* [n + dec][layers][2][kv_dim] */
} run_out;

static void run_req(ikv_engine *e, const uint32_t *toks, size_t n, const char *tenant, size_t pub,
                    int no_cache, int dec, run_out *o) {
    const ikv_model *m = ikv_engine_model(e);
    int V = m->cfg.vocab_size, L = m->cfg.n_layers, kvd = m->kv_dim;
    o->logits = calloc((n + (size_t)dec) * (size_t)V, 4);
    o->kv = calloc((n + (size_t)dec) * (size_t)L * 2 * (size_t)kvd, 4);
    ikv_request rq = {.tokens = toks,
                      .n = n,
                      .tenant = tenant,
                      .public_tokens = pub,
                      .no_cache = no_cache,
                      .logits_all = o->logits};
    ikv_seq *s;
    assert_int_equal(ikv_engine_begin(e, &rq, &s, &o->info), 0);
    assert_true(ikv_engine_check(e));
    uint32_t next = tu_argmax(ikv_seq_logits(s), V);
    for (int d = 0; d < dec; d++) {
        const float *lg;
        o->gen[d] = next;
        assert_int_equal(ikv_engine_decode(e, s, next, &lg), 0);
        memcpy(o->logits + (n + (size_t)d) * V, lg, sizeof(float) * (size_t)V);
        next = tu_argmax(lg, V);
    }
    for (size_t p = 0; p < n + (size_t)dec; p++)
        for (int l = 0; l < L; l++) {
            float *dst = o->kv + ((p * (size_t)L + (size_t)l) * 2) * (size_t)kvd;
            assert_int_equal(ikv_seq_kv(e, s, p, l, dst, dst + kvd), 0);
        }
    ikv_engine_end(e, s);
    assert_true(ikv_engine_check(e));
}

static void free_out(run_out *o) {
    free(o->logits), free(o->kv);
}

/* Bit-identical: computed prompt rows from `from` on, all decode rows, tokens, all K/V. */
static void assert_same(const run_out *a, const run_out *b, size_t n, int dec, size_t from, int V,
                        size_t kvfloats) {
    assert_memory_equal(a->logits + from * (size_t)V, b->logits + from * (size_t)V,
                        (n + (size_t)dec - from) * (size_t)V * sizeof(float));
    assert_memory_equal(a->gen, b->gen, sizeof(uint32_t) * (size_t)dec);
    assert_memory_equal(a->kv, b->kv, (n + (size_t)dec) * kvfloats * sizeof(float));
}

static void test_exact_with_cache(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 5, &m), 0);
    const int V = c.vocab_size, DEC = 16;
    const size_t kvf = (size_t)c.n_layers * 2 * (size_t)m->kv_dim;
    uint32_t a[200], b[200], f[160];
    make_prompt(a, 200, 1, (uint32_t)V);
    memcpy(b, a, sizeof b);
    make_prompt(b + 40, 160, 2, (uint32_t)V); /* shares 40 tokens (2 full blocks) with a */
    memcpy(f, a, sizeof f);                   /* 160 = 10 full blocks, all of them in a */
    /* tile sizes: aligned and unaligned with the 16-token blocks; the last configs run the
     * forward pass on 2 and 3 threads (bit exactness holds for any fixed thread count; 3 gives
     * uneven row and column splits and a thread with no kv head) */
    uint32_t tiles[] = {64, 16, 48, 7, 64, 16, 7};
    int threads[] = {1, 1, 1, 1, 2, 3, 2};
    for (size_t ti = 0; ti < 7; ti++) {
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.tile = tiles[ti];
        o.threads = threads[ti];
        ikv_engine *e;
        assert_int_equal(ikv_engine_create(m, &o, &e), 0);
        run_out cold, ref_a, warm_a, ref_b, part_b, ref_f, full_f;
        /* no hit: first request on an empty cache == the no-cache computation */
        run_req(e, a, 100, NULL, 0, 1, DEC, &ref_a);
        run_req(e, a, 100, NULL, 0, 0, DEC, &cold);
        assert_int_equal(cold.info.cached_tokens, 0);
        assert_int_equal(cold.info.inserted_blocks, 6);
        assert_same(&cold, &ref_a, 100, DEC, 0, V, kvf);
        free_out(&cold);
        /* full hit: the same prompt again reuses all 6 full blocks (96 tokens) and, copied from
         * the parked partial block of the first run, 3 of the last 4 positions */
        run_req(e, a, 100, NULL, 0, 0, DEC, &warm_a);
        assert_int_equal(warm_a.info.cached_tokens, 99);
        assert_int_equal(warm_a.info.partial_tokens, 3);
        assert_int_equal(warm_a.info.computed_tokens, 1);
        assert_same(&warm_a, &ref_a, 100, DEC, 99, V, kvf);
        /* partial hit: b shares 2 blocks with a */
        run_req(e, b, 150, NULL, 0, 1, DEC, &ref_b);
        run_req(e, b, 150, NULL, 0, 0, DEC, &part_b);
        assert_int_equal(part_b.info.cached_tokens, 32);
        assert_same(&part_b, &ref_b, 150, DEC, 32, V, kvf);
        /* a prompt made only of cached full blocks: the last block is recomputed. Its cached
         * blocks come from a longer prompt, so this also guards the rule that a tile's shape must
         * not depend on the prompt's length (cutting the last tile at n broke exactly this) */
        run_req(e, a, 200, NULL, 0, 0, 0, &cold); /* caches 12 blocks of a */
        free_out(&cold);
        run_req(e, f, 160, NULL, 0, 1, DEC, &ref_f);
        run_req(e, f, 160, NULL, 0, 0, DEC, &full_f);
        assert_int_equal(full_f.info.cached_tokens, 159); /* 9 blocks + 15 copied positions */
        assert_int_equal(full_f.info.partial_tokens, 15);
        assert_int_equal(full_f.info.computed_tokens, 1);
        assert_same(&full_f, &ref_f, 160, DEC, 159, V, kvf);
        free_out(&ref_a), free_out(&warm_a), free_out(&ref_b), free_out(&part_b), free_out(&ref_f),
            free_out(&full_f);
        if (ti == 0) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            ikv_engine_dump(e, f);
            fclose(f);
            assert_non_null(strstr(buf, "pool"));
            free(buf);
        }
        ikv_engine_destroy(e);
    }
    openblas_set_num_threads(1);
    ikv_model_destroy(m);
}

/* Prefill's grouped projection calls (G tiles in one sgemm) and trimmed ones (a tile alone on
 * its computed rows rounded to 16) are used only where the check at engine creation found
 * that BLAS gives each row the bits of its own whole-tile call. Here, on a model wide enough
 * for that check to pass with common BLAS kernels, they must give exactly what one whole-tile
 * call per tile gives (a second engine forced to G = 1, no trim): cold prefill (a group of 8
 * tiles, then single tiles, the last one trimmed), a partial hit whose first tile starts after
 * cached rows (trimmed, alone) followed by a group, and a full hit (one trimmed tile); and
 * cached vs no-cache on the grouped engine itself. Where the check fails, the test says so
 * and only compares the engines (then both run one call per tile). */
static void test_grouped_calls_exact(void **st) {
    (void)st;
    ikv_model_config c = {.dim = 256,
                          .hidden_dim = 512,
                          .n_layers = 2,
                          .n_heads = 4,
                          .n_kv_heads = 2,
                          .vocab_size = 400,
                          .seq_len = 640,
                          .shared_classifier = 1};
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 21, &m), 0);
    const int V = c.vocab_size, DEC = 4;
    const size_t kvf = (size_t)c.n_layers * 2 * (size_t)m->kv_dim;
    uint32_t a[600], b[620];
    make_prompt(a, 600, 31, (uint32_t)V);
    memcpy(b, a, sizeof(uint32_t) * 80);
    make_prompt(b + 80, 540, 32, (uint32_t)V); /* shares 5 blocks (80 tokens) with a */
    for (int run = 0; run < 4; run++) {
        /* the engine's own choice of scheme, then scheme 1 (tiles padded to 72 rows, trims of
         * 12) forced, at 1 and 2 threads */
        const int th = 1 + run % 2, scheme = run < 2 ? -1 : 1;
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.threads = th;
        ikv_engine *e, *r;
        ikv__prefill_scheme_force(scheme);
        assert_int_equal(ikv_engine_create(m, &o, &e), 0);
        ikv__prefill_scheme_force(-1);
        assert_int_equal(ikv_engine_create(m, &o, &r), 0);
        /* the reference: one call per tile, on the same tile pitch */
        r->G = 1, r->Q = 0, r->TP = e->TP;
        if (scheme == 1 && (e->G > 1 || e->Q)) assert_int_equal(e->TP, 72);
        if (e->G == 1 || !e->Q)
            print_message("note: scheme %d: grouped calls %s, trimmed calls %s at %d thread(s) "
                          "with this BLAS\n",
                          scheme, e->G > 1 ? "on" : "off", e->Q ? "on" : "off", th);
        run_out ra, rb, ea, eb, ewarm, ecold;
        run_req(r, a, 600, NULL, 0, 1, DEC, &ra);
        run_req(r, b, 620, NULL, 0, 1, DEC, &rb);
        run_req(e, a, 600, NULL, 0, 1, DEC, &ea); /* a group of 8 tiles, then 2 alone */
        assert_same(&ea, &ra, 600, DEC, 0, V, kvf);
        run_req(e, a, 600, NULL, 0, 0, DEC, &ecold);
        assert_int_equal(ecold.info.cached_tokens, 0);
        assert_same(&ecold, &ra, 600, DEC, 0, V, kvf);
        /* tile 1 alone from row 16, then tiles 2..9, the last with 20 pad rows, as a group */
        run_req(e, b, 620, NULL, 0, 0, DEC, &eb);
        assert_int_equal(eb.info.cached_tokens, 80);
        assert_same(&eb, &rb, 620, DEC, 80, V, kvf);
        run_req(e, a, 600, NULL, 0, 0, DEC, &ewarm); /* row 599 (7 copied): tile 9, rows [16, 32) */
        assert_int_equal(ewarm.info.cached_tokens, 599);
        assert_same(&ewarm, &ra, 600, DEC, 599, V, kvf);
        free_out(&ra), free_out(&rb), free_out(&ea), free_out(&eb), free_out(&ewarm),
            free_out(&ecold);
        ikv_engine_destroy(e);
        ikv_engine_destroy(r);
    }
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.group = 0;
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), IKV_EINVAL);
    o.group = 65;
    assert_int_equal(ikv_engine_create(m, &o, &e), IKV_EINVAL);
    openblas_set_num_threads(1);
    ikv_model_destroy(m);
}

/* Decode reads K/V, runs matrix-vector products row by row and attention head by head, each
 * with one fixed summation order, so given the same K/V it gives the same bits at any thread
 * count (prefill does not: its sgemm calls are split by columns per thread). Two engines at 1
 * and 3 threads prefill the same prompt; the second's K/V pool is overwritten with the first's
 * (same request flow, same block tables); then every decode step must agree bit for bit. */
static void decode_thread_invariant(void) {
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 9, &m), 0);
    const int V = c.vocab_size;
    uint32_t toks[90];
    make_prompt(toks, 90, 4, (uint32_t)V);
    ikv_engine *e[3];
    ikv_seq *s[3];
    int threads[] = {1, 3, 2};
    for (int i = 0; i < 3; i++) {
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.threads = threads[i];
        assert_int_equal(ikv_engine_create(m, &o, &e[i]), 0);
        ikv_request rq = {.tokens = toks, .n = 90};
        assert_int_equal(ikv_engine_begin(e[i], &rq, &s[i], NULL), 0);
        if (i) {
            assert_int_equal(e[i]->nblocks, e[0]->nblocks);
            assert_memory_equal(s[i]->table, s[0]->table, sizeof(uint32_t) * s[0]->n_blocks);
            memcpy(e[i]->kv, e[0]->kv, sizeof(float) * e[0]->nblocks * e[0]->block_floats);
        }
    }
    uint32_t next = tu_argmax(ikv_seq_logits(s[0]), V);
    for (int d = 0; d < 40; d++) {
        const float *lg[3];
        for (int i = 0; i < 3; i++)
            assert_int_equal(ikv_engine_decode(e[i], s[i], next, &lg[i]), 0);
        assert_memory_equal(lg[1], lg[0], sizeof(float) * (size_t)V);
        assert_memory_equal(lg[2], lg[0], sizeof(float) * (size_t)V);
        next = tu_argmax(lg[0], V);
    }
    for (int i = 0; i < 3; i++) {
        ikv_engine_end(e[i], s[i]);
        ikv_engine_destroy(e[i]);
    }
    openblas_set_num_threads(1);
    ikv_model_destroy(m);
}

/* ... with the kernels this CPU picks, and with the SSE2 ones forced (the fallback of a CPU
 * without AVX2), which must also agree with the reference forward. */
static void test_decode_thread_invariant(void **st) {
    (void)st;
    decode_thread_invariant();
    ikv__simd_force(0);
    decode_thread_invariant();
    test_reference_forward(NULL);
    ikv__simd_force(-1);
}

/* The worker pool runs every thread index exactly once per region, regions in order, at any
 * size; bad sizes are refused. */
typedef struct pool_probe {
    int n;
    int region;
    int seen[8];     /* regions thread t ran */
    int order_ok[8]; /* thread t saw region numbers 0, 1, 2, ... in order */
    int nthreads_ok;
} pool_probe;

static void pool_task(void *ctx, int t, int n) {
    pool_probe *p = ctx;
    if (n != p->n) p->nthreads_ok = 0;
    if (p->seen[t] != p->region) p->order_ok[t] = 0;
    p->seen[t]++;
}

static void test_pool(void **st) {
    (void)st;
    ikv__pool *pool;
    assert_int_equal(ikv__pool_create(0, &pool), IKV_EINVAL);
    assert_int_equal(ikv__pool_create(257, &pool), IKV_EINVAL);
    int sizes[] = {1, 2, 5, 8};
    for (int si = 0; si < 4; si++) {
        pool_probe p;
        memset(&p, 0, sizeof p);
        p.n = sizes[si];
        p.nthreads_ok = 1;
        for (int t = 0; t < 8; t++)
            p.order_ok[t] = 1;
        assert_int_equal(ikv__pool_create(p.n, &pool), 0);
        assert_int_equal(ikv__pool_size(pool), p.n);
        for (p.region = 0; p.region < 1000; p.region++) {
            ikv__pool_run(pool, pool_task, &p);
            if (p.region == 500) usleep(20000); /* let the workers fall asleep once */
        }
        for (int t = 0; t < 8; t++) {
            assert_int_equal(p.seen[t], t < p.n ? 1000 : 0);
            assert_true(p.order_ok[t]);
        }
        assert_true(p.nthreads_ok);
        ikv__pool_destroy(pool);
    }
    ikv__pool_destroy(NULL);
}

/* ikv__pool_barrier: inside one region, no thread passes barrier k before every thread has
 * reached it (each thread writes its slot of phase k, passes the barrier, then must see every
 * other thread's phase-k slot written), over 300 barriers a region, at pool sizes 1, 2, 3 and
 * 5 (more threads than this machine's cores: the waiting threads yield), twice, with the
 * workers asleep between the regions once. */
enum { BAR_PHASES = 300, BAR_MAXT = 5 };
typedef struct bar_probe {
    ikv__pool *pool;
    int slot[BAR_MAXT][BAR_PHASES];
    int bad[BAR_MAXT]; /* phase-k slots thread t found unwritten after barrier k */
} bar_probe;

static void bar_task(void *ctx, int t, int n) {
    bar_probe *p = ctx;
    for (int k = 0; k < BAR_PHASES; k++) {
        __atomic_store_n(&p->slot[t][k], k + 1, __ATOMIC_RELAXED);
        ikv__pool_barrier(p->pool, n);
        for (int u = 0; u < n; u++)
            if (__atomic_load_n(&p->slot[u][k], __ATOMIC_RELAXED) != k + 1) p->bad[t]++;
    }
}

static void test_pool_barrier(void **st) {
    (void)st;
    static const int sizes[] = {1, 2, 3, 5};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        bar_probe *p = calloc(1, sizeof *p);
        assert_non_null(p);
        assert_int_equal(ikv__pool_create(sizes[si], &p->pool), 0);
        for (int rep = 0; rep < 2; rep++) {
            memset(p->slot, 0, sizeof p->slot);
            ikv__pool_run(p->pool, bar_task, p);
            for (int t = 0; t < sizes[si]; t++) {
                assert_int_equal(p->bad[t], 0);
                assert_int_equal(p->slot[t][BAR_PHASES - 1], BAR_PHASES);
            }
            usleep(20000); /* the workers fall asleep before the second region */
        }
        ikv__pool_destroy(p->pool);
        free(p);
    }
}

/* Runs `isokv ARGS` (the words of args, no shell), capturing stdout into out (at most cap
 * bytes); returns the exit status. */
static int run_isokv(const char *args, char *out, size_t cap) {
    return tu_isokv_line(args, out, cap, NULL, 0, 0, 300);
}

/* isokv bench engine: usage errors exit 2; a small run on `tiny` at 2 threads, best of 2,
 * prints one JSON row that says what it measured: the warm request took the whole prefix from
 * the cache, every rate is positive, ratios are consistent with their parts. */
static void test_bench_cli(void **st) {
    (void)st;
    static char out[8192];
    assert_int_equal(run_isokv("bench engine --repeat 0", out, sizeof out), 2);
    assert_int_equal(run_isokv("bench engine --threads 0", out, sizeof out), 2);
    assert_int_equal(run_isokv("bench engine --group 0", out, sizeof out), 2);
    assert_int_equal(run_isokv("bench engine --config tiny --prefix 32 --suffix 8 --decode 4 "
                               "--threads 2 --repeat 2 --json",
                               out, sizeof out),
                     0);
    assert_non_null(strstr(out, "\"repeat\": 2"));
    assert_non_null(strstr(out, "\"tile\": 64"));
    assert_non_null(strstr(out, "\"group\": 8, \"rows\""));
    assert_non_null(strstr(out, "\"threads\": 2"));
    assert_non_null(strstr(out, "\"warm_cached_tokens\": 32"));
    assert_null(strstr(out, "\"threads\": 1"));
    const char *p = strstr(out, "\"prefill_gflops\": ");
    assert_non_null(p);
    double gf = atof(p + strlen("\"prefill_gflops\": "));
    p = strstr(out, "\"sgemm_peak_gflops\": ");
    assert_non_null(p);
    double peak = atof(p + strlen("\"sgemm_peak_gflops\": "));
    p = strstr(out, "\"prefill_over_peak\": ");
    assert_non_null(p);
    double ratio = atof(p + strlen("\"prefill_over_peak\": "));
    assert_true(gf > 0 && peak > 0);
    assert_true(fabs(ratio - gf / peak) < 1e-3 * (1 + ratio));
    p = strstr(out, "\"read_gbs\": ");
    assert_non_null(p);
    assert_true(atof(p + strlen("\"read_gbs\": ")) > 0);
    assert_non_null(strstr(out, "\"read_by\": \""));
}

/* isokv model init --classifier and isokv run's text: a separate classifier is written with a
 * negative vocab_size and read back as separate; a bad --classifier is a usage error; run
 * prints the prompt's pieces as llama2.c's run.c does (a byte token whose byte is neither
 * printable ASCII nor whitespace is skipped), and every byte with --raw-bytes; -n 0 generates
 * nothing. */
static void test_model_run_cli(void **st) {
    (void)st;
    static char out[4096];
    char args[1024];
    const char *mp = tmp_path("cli_sep.bin");
    snprintf(args, sizeof args, "model init --config tiny --seed 3 --classifier both -o '%s'", mp);
    assert_int_equal(run_isokv(args, out, sizeof out), 2);
    snprintf(args, sizeof args, "model init --config tiny --seed 3 --classifier separate -o '%s'",
             mp);
    assert_int_equal(run_isokv(args, out, sizeof out), 0);
    ikv_model *m;
    assert_int_equal(ikv_model_load(mp, &m), 0);
    assert_int_equal(ikv_model_cfg(m)->shared_classifier, 0);
    assert_true(m->w.wcls != m->w.emb);
    ikv_model_destroy(m);
    FILE *f = fopen(mp, "rb");
    assert_non_null(f);
    int32_t h[7];
    assert_int_equal(fread(h, sizeof h, 1, f), 1);
    fclose(f);
    assert_int_equal(h[5], -512);
    /* byte-level tokenizer: every prompt byte is a byte token; \001 is dropped, \t kept */
    snprintf(args, sizeof args, "run --model '%s' --prompt 'a\001b\tc' -n 0", mp);
    assert_int_equal(run_isokv(args, out, sizeof out), 0);
    assert_string_equal(out, "ab\tc\n");
    snprintf(args, sizeof args,
             "run --model '%s' --prompt 'a\001b\tc' -n 0 --raw-bytes", mp);
    assert_int_equal(run_isokv(args, out, sizeof out), 0);
    assert_string_equal(out, "a\001b\tc\n");
}

static void test_tenants(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 9, &m), 0);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, NULL, &e), 0);
    uint32_t p[120];
    make_prompt(p, 120, 77, (uint32_t)c.vocab_size);
    run_out x;
    /* tenant A: 64 public tokens (system prompt) + private rest */
    run_req(e, p, 120, "A", 64, 0, 2, &x);
    assert_int_equal(x.info.cached_tokens, 0);
    free_out(&x);
    /* tenant B sends the very same prompt: only the public blocks are shared */
    run_req(e, p, 120, "B", 64, 0, 2, &x);
    assert_int_equal(x.info.cached_tokens, 64);
    free_out(&x);
    /* A again: its own private blocks too (7 full blocks = 112 tokens), and 7 positions of its
     * parked partial block (B's parked block, of B's scope, is not visible to A) */
    run_req(e, p, 120, "A", 64, 0, 2, &x);
    assert_int_equal(x.info.cached_tokens, 119);
    free_out(&x);
    /* a request with no public declaration shares nothing with A or B */
    run_req(e, p, 120, "C", 0, 0, 2, &x);
    assert_int_equal(x.info.cached_tokens, 0);
    free_out(&x);
    /* the public scope itself (no tenant) sees only the public blocks */
    run_req(e, p, 120, NULL, 64, 0, 2, &x);
    assert_int_equal(x.info.cached_tokens, 64);
    free_out(&x);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* A cached block whose stored tokens differ from the prompt's (what a key collision would
 * look like) is refused: the request computes it and gets the no-cache answer. */
static void test_collision_is_miss(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 4, &m), 0);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, NULL, &e), 0);
    uint32_t p[80];
    make_prompt(p, 80, 5, (uint32_t)c.vocab_size);
    run_out r0, r1, r2;
    run_req(e, p, 80, NULL, 0, 1, 4, &r0);
    run_req(e, p, 80, NULL, 0, 0, 4, &r1);
    /* tamper: the cached block at depth 2 now claims other token ids */
    uint32_t hit = IKV_NIL;
    for (uint32_t b = 0; b < e->nblocks; b++)
        if (e->state[b] == IKV__BLK_READY && e->bdepth[b] == 2) hit = b;
    assert_int_not_equal(hit, IKV_NIL);
    e->btokens[(size_t)hit * e->bt + 3] ^= 1;
    run_req(e, p, 80, NULL, 0, 0, 4, &r2);
    assert_int_equal(r2.info.matched_blocks, 5);
    assert_int_equal(r2.info.rejected_blocks, 3);
    assert_int_equal(r2.info.cached_tokens, 32);
    assert_same(&r2, &r0, 80, 4, 32, c.vocab_size, (size_t)c.n_layers * 2 * (size_t)m->kv_dim);
    free_out(&r0), free_out(&r1), free_out(&r2);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* Differential fuzz: random requests over three base prompts (random lengths, tenants, public
 * prefixes) through one cached engine with a pool large enough that nothing is evicted. Oracle:
 * the cached prefix is the longest run of full blocks shared with an earlier request whose
 * tokens and block scopes agree (public for blocks inside the public prefix, else the tenant),
 * capped so one position is computed; the last logits and greedy continuation equal a no-cache
 * run of the same prompt, bit for bit. */
typedef struct fz_req {
    const uint32_t *toks;
    size_t n, pub;
    int tenant; /* -1 = none (public scope) */
} fz_req;

static int fz_scope(const fz_req *r, size_t j) {
    return (j + 1) * 16 <= r->pub ? -1 : r->tenant;
}

static void test_fuzz_against_oracle(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 21, &m), 0);
    const int V = c.vocab_size;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.tile = 32;
    o.kv_mem = ikv_model_kv_bytes_per_token(&c) * 16 * (16 + 400);
    ikv_engine *e, *cold;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    assert_int_equal(ikv_engine_create(m, &o, &cold), 0);
    enum { NB = 3, LEN = 240, NR = 40 };
    uint32_t base[NB][LEN];
    make_prompt(base[0], LEN, 100, (uint32_t)V);
    memcpy(base[1], base[0], sizeof base[0]);
    make_prompt(base[1] + 70, LEN - 70, 101, (uint32_t)V); /* shares 70 tokens with base 0 */
    make_prompt(base[2], LEN, 102, (uint32_t)V);
    const char *names[] = {"A", "B", "C"};
    fz_req hist[NR];
    uint64_t rs = 12345;
    int hits = 0, misses = 0, partial = 0;
    for (int i = 0; i < NR; i++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        fz_req r = {base[(rs >> 33) % NB], 1 + (size_t)((rs >> 20) % (LEN - 20)),
                    (size_t)((rs >> 40) % 100), (int)((rs >> 50) % 4) - 1};
        /* oracle */
        size_t want = 0, cap = (r.n - 1) / 16;
        for (int q = 0; q < i; q++) {
            size_t j = 0;
            while (j < r.n / 16 && j < hist[q].n / 16 && fz_scope(&r, j) == fz_scope(&hist[q], j) &&
                   !memcmp(r.toks, hist[q].toks, sizeof(uint32_t) * 16 * (j + 1)))
                j++;
            if (j > want) want = j;
        }
        int full_hit = want > cap;
        if (want > cap) want = cap;
        hits += want > 0, misses += want == 0 && r.n >= 32;
        ikv_request rq = {.tokens = r.toks,
                          .n = r.n,
                          .tenant = r.tenant < 0 ? NULL : names[r.tenant],
                          .public_tokens = r.pub};
        ikv_request rc0 = rq;
        rc0.no_cache = 1;
        ikv_seq *s, *s0;
        ikv_prefill_info info;
        assert_int_equal(ikv_engine_begin(e, &rq, &s, &info), 0);
        assert_int_equal(ikv_engine_begin(cold, &rc0, &s0, NULL), 0);
        /* the oracle counts full blocks; on top of them a partial block may be copied (from a
         * parked block or from the full block the prompt ends on): never more than the rest of
         * the block, never the last position; a prompt ending on a cached full block always
         * copies it */
        if (info.cached_tokens < want * 16 || info.cached_tokens >= want * 16 + 16 ||
            info.cached_tokens > r.n - 1 || info.cached_tokens - info.partial_tokens != want * 16 ||
            (full_hit && info.cached_tokens != r.n - 1))
            fail_msg("request %d (n %zu, tenant %d, public %zu): cached %zu (%zu partial), oracle "
                     "%zu full blocks%s",
                     i, r.n, r.tenant, r.pub, info.cached_tokens, info.partial_tokens, want * 16,
                     full_hit ? ", ends on a cached block" : "");
        partial += info.partial_tokens > 0;
        const float *l1 = ikv_seq_logits(s), *l0 = ikv_seq_logits(s0);
        for (int d = 0; d < 3 && r.n + (size_t)d < (size_t)c.seq_len; d++) {
            assert_memory_equal(l1, l0, sizeof(float) * (size_t)V);
            uint32_t nx = tu_argmax(l1, V);
            assert_int_equal(ikv_engine_decode(e, s, nx, &l1), 0);
            assert_int_equal(ikv_engine_decode(cold, s0, nx, &l0), 0);
        }
        ikv_engine_end(e, s);
        ikv_engine_end(cold, s0);
        assert_true(ikv_engine_check(e));
        hist[i] = r;
    }
    ikv_cache_stats cs;
    ikv_cache_stats_get(ikv_engine_cache(e), &cs);
    assert_int_equal(cs.drops, 0);
    assert_true(hits >= 10 && misses >= 3 && partial >= 3); /* the stream exercises all */
    ikv_engine_destroy(e);
    ikv_engine_destroy(cold);
    ikv_model_destroy(m);
}

/* Two sequences in flight at once (max_seqs 2): the second hits the first one's blocks while the
 * first still holds them locked, decoding interleaves, and both equal no-cache runs. */
static void test_two_sequences(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 13, &m), 0);
    const int V = c.vocab_size;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.max_seqs = 2;
    ikv_engine *e, *cold;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    assert_int_equal(ikv_engine_create(m, &o, &cold), 0);
    uint32_t a[90], b[90];
    make_prompt(a, 90, 31, (uint32_t)V);
    memcpy(b, a, sizeof b);
    make_prompt(b + 50, 40, 32, (uint32_t)V);
    ikv_request ra = {.tokens = a, .n = 90}, rb = {.tokens = b, .n = 90};
    ikv_seq *sa, *sb, *ca, *cb;
    ikv_prefill_info ia, ib;
    assert_int_equal(ikv_engine_begin(e, &ra, &sa, &ia), 0);
    assert_int_equal(ikv_engine_begin(e, &rb, &sb, &ib), 0);
    assert_int_equal(ia.cached_tokens, 0);
    assert_int_equal(ib.cached_tokens, 48);
    ra.no_cache = rb.no_cache = 1;
    assert_int_equal(ikv_engine_begin(cold, &ra, &ca, NULL), 0);
    assert_int_equal(ikv_engine_begin(cold, &rb, &cb, NULL), 0);
    const float *la = ikv_seq_logits(sa), *lb = ikv_seq_logits(sb), *lca = ikv_seq_logits(ca),
                *lcb = ikv_seq_logits(cb);
    for (int d = 0; d < 10; d++) {
        assert_memory_equal(la, lca, sizeof(float) * (size_t)V);
        assert_memory_equal(lb, lcb, sizeof(float) * (size_t)V);
        uint32_t na = tu_argmax(la, V), nb = tu_argmax(lb, V);
        assert_int_equal(ikv_engine_decode(e, sa, na, &la), 0);
        assert_int_equal(ikv_engine_decode(e, sb, nb, &lb), 0);
        assert_int_equal(ikv_engine_decode(cold, ca, na, &lca), 0);
        assert_int_equal(ikv_engine_decode(cold, cb, nb, &lcb), 0);
        assert_true(ikv_engine_check(e));
    }
    ikv_cache_stats cs;
    ikv_cache_stats_get(ikv_engine_cache(e), &cs);
    assert_true(cs.locked >= 5); /* a's 5 full blocks, held by both sequences */
    ikv_engine_end(e, sa);
    ikv_engine_end(e, sb);
    ikv_engine_end(cold, ca);
    ikv_engine_end(cold, cb);
    ikv_cache_stats_get(ikv_engine_cache(e), &cs);
    assert_int_equal(cs.locked, 0);
    assert_true(ikv_engine_check(e));
    ikv_engine_destroy(e);
    ikv_engine_destroy(cold);
    ikv_model_destroy(m);
}

static void test_eviction_and_limits(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 6, &m), 0);
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    uint64_t bb = ikv_model_kv_bytes_per_token(&c) * 16;
    o.kv_mem = bb * (16 + 10); /* 16 private (256 / 16) + 10 cached */
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    ikv_engine_stats s;
    ikv_engine_stats_get(e, &s);
    assert_int_equal(s.pool_blocks, 26);
    assert_int_equal(s.cache_capacity, 10);
    uint32_t p[100];
    for (int i = 0; i < 12; i++) {
        make_prompt(p, 100, 1000 + (uint64_t)i, (uint32_t)c.vocab_size);
        run_out x;
        run_req(e, p, 100, "T", 0, 0, 3, &x);
        free_out(&x);
        ikv_engine_stats_get(e, &s);
        assert_true(s.cached_blocks <= 10);
        assert_int_equal(s.private_blocks, 0);
        assert_int_equal(s.free_blocks + s.cached_blocks, 26);
    }
    ikv_cache_stats cs;
    ikv_cache_stats_get(ikv_engine_cache(e), &cs);
    assert_true(cs.drops > 0);
    /* the most recent prompt is still cached (lru), the first is gone */
    run_out x;
    run_req(e, p, 100, "T", 0, 0, 0, &x);
    assert_int_equal(x.info.cached_tokens, 99); /* 6 blocks and 3 positions of the parked one */
    free_out(&x);
    make_prompt(p, 100, 1000, (uint32_t)c.vocab_size);
    run_req(e, p, 100, "T", 0, 0, 0, &x);
    assert_int_equal(x.info.cached_tokens, 0);
    free_out(&x);
    /* too long, bad tokens, busy */
    uint32_t big[300];
    make_prompt(big, 300, 1, (uint32_t)c.vocab_size);
    ikv_request rq = {.tokens = big, .n = 257};
    ikv_seq *sq, *sq2;
    assert_int_equal(ikv_engine_begin(e, &rq, &sq, NULL), IKV_ETOOLONG);
    assert_non_null(strstr(ikv_errdetail(), "seq_len 256"));
    rq.n = 0;
    assert_int_equal(ikv_engine_begin(e, &rq, &sq, NULL), IKV_EINVAL);
    big[3] = 512;
    rq.n = 10;
    assert_int_equal(ikv_engine_begin(e, &rq, &sq, NULL), IKV_EINVAL);
    big[3] = 5;
    rq.n = 250;
    assert_int_equal(ikv_engine_begin(e, &rq, &sq, NULL), 0);
    assert_int_equal(ikv_engine_begin(e, &rq, &sq2, NULL), IKV_EBUSY);
    const float *lg;
    for (int i = 0; i < 6; i++)
        assert_int_equal(ikv_engine_decode(e, sq, 5, &lg), 0);
    assert_int_equal(ikv_engine_decode(e, sq, 5, &lg), IKV_ETOOLONG);
    assert_int_equal(ikv_engine_decode(e, sq, 600, &lg), IKV_EINVAL);
    assert_true(ikv_engine_check(e));
    ikv_engine_end(e, sq);
    assert_true(ikv_engine_check(e));
    ikv_engine_destroy(e);
    /* a pool too small for the private reserve */
    o.kv_mem = bb * 16;
    assert_int_equal(ikv_engine_create(m, &o, &e), IKV_EINVAL);
    assert_non_null(strstr(ikv_errdetail(), "kv-mem"));
    o.kv_mem = 0;
    o.policy = "no-such-policy";
    assert_int_equal(ikv_engine_create(m, &o, &e), IKV_EPOLICY);
    /* a policy that needs the future is refused by a live engine, with the reason */
    const char *offline[] = {"opt", "value:oracle=3", "value:split=0,oracle=4"};
    for (int i = 0; i < 3; i++) {
        o.policy = offline[i];
        assert_int_equal(ikv_engine_create(m, &o, &e), IKV_EPARAM);
        assert_non_null(strstr(ikv_errdetail(), "isokv sim"));
    }
    o.policy = "value:oracle=0";
    assert_int_equal(ikv_engine_create(m, &o, &e), 0);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
}

/* ---- batches: admit + step ------------------------------------------------------------- */

/* Batch invariance on the bundled real model (stories260K): a request's greedy tokens and its
 * logits at every step are bit-identical to its run alone, when it runs among 1..16 other
 * requests (other prompts and lengths, some sharing its prefix) through ikv_engine_step, with
 * its prompt prefilled in chunks of various sizes interleaved with the others' decode rows,
 * and whatever its prefix hit (cold, full blocks, a parked partial block), at 1 and 2 threads.
 * Admission by reserved blocks is checked on the way (IKV_EFULL when the budget is spent). */
static void test_batch_invariance(void **st) {
    (void)st;
    ikv_model *m;
    ikv_tokenizer *tk;
    if (ikv_model_load("data/models/stories260K/stories260K.bin", &m)) {
        fail_msg("bundled model: %s", ikv_errdetail());
    }
    assert_int_equal(ikv_tokenizer_load("data/models/stories260K/tok512.bin", 512, &tk), 0);
    const int V = m->cfg.vocab_size, DEC = 20;
    static const char *texts[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends and her dog.",
        "Once upon a time, there was a little boy",
        "The sun was hot and the sky was blue.",
        "Tom had a big red ball. He liked to throw it high.",
        "One day, a cat and a dog went to the forest to find some food for their friends.",
        "Mia wanted a cake.",
    };
    enum { NT = 6, MAXO = 16 };
    uint32_t toks[NT][256];
    size_t nt[NT];
    for (int i = 0; i < NT; i++)
        assert_int_equal(ikv_tokenizer_encode(tk, texts[i], 1, 0, toks[i], 256, &nt[i]), 0);
    const uint32_t *P = toks[0];
    const size_t np = nt[0];
    assert_true(np > 20 && np % 16 != 0); /* a partial last block, reused the second time */
    float *ref = malloc(sizeof(float) * (size_t)V * (DEC + 1));
    float *oref[NT];
    uint32_t gen[DEC], ogen[NT][DEC];
    for (int th = 1; th <= 2; th++) {
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.max_seqs = MAXO + 1;
        o.threads = th;
        o.tile = 16; /* several tiles per prompt: chunks start inside and at tile edges */
        tu_greedy_ref(m, &o, P, np, DEC, ref, gen);
        for (int i = 1; i < NT; i++) {
            oref[i] = malloc(sizeof(float) * (size_t)V * (DEC + 1));
            tu_greedy_ref(m, &o, toks[i], nt[i], DEC, oref[i], ogen[i]);
        }
        ikv_engine *e;
        assert_int_equal(ikv_engine_create(m, &o, &e), 0);
        int others[] = {0, 1, 2, 5, 16, 16};
        size_t chunks[] = {0, 7, 16, 5, 33, 1};
        for (int round = 0; round < 6; round++) {
            int no = others[round];
            ikv_seq *seq[MAXO + 1];
            int which[MAXO + 1], d_at[MAXO + 1];
            uint32_t next[MAXO + 1];
            float *lref[MAXO + 1];
            uint32_t *gref[MAXO + 1];
            ikv_prefill_info info;
            /* the others first (so the target's prompt shares the batch with their decodes),
             * the target last */
            for (int k = 0; k <= no; k++) {
                which[k] = k == no ? 0 : 1 + k % (NT - 1);
                const size_t n = nt[which[k]];
                char tenant[8];
                snprintf(tenant, sizeof tenant, "t%d", k % 3);
                ikv_request rq = {.tokens = toks[which[k]],
                                  .n = n,
                                  .tenant = which[k] ? tenant : "T",
                                  .max_new = DEC};
                assert_int_equal(ikv_engine_admit(e, &rq, &seq[k], &info), 0);
                assert_int_equal(ikv_seq_pending(seq[k]), info.computed_tokens);
                if (k == no && round >= 1)
                    assert_int_equal(info.cached_tokens, np - 1); /* blocks + parked block */
                lref[k] = which[k] ? oref[which[k]] : ref;
                gref[k] = which[k] ? ogen[which[k]] : gen;
                d_at[k] = -1;
                assert_true(ikv_engine_check(e));
            }
            /* steps until everyone has decoded DEC tokens; chunked prefill of chunks[round] */
            for (int live = no + 1; live > 0;) {
                ikv_step_item it[MAXO + 1];
                int map[MAXO + 1], ni = 0;
                for (int k = 0; k <= no; k++) {
                    if (d_at[k] >= DEC) continue;
                    it[ni] = (ikv_step_item){
                        .seq = seq[k], .token = next[k], .n = chunks[round] + (size_t)k % 3};
                    map[ni++] = k;
                }
                assert_int_equal(ikv_engine_step(e, it, (size_t)ni), 0);
                for (int i = 0; i < ni; i++) {
                    int k = map[i];
                    if (ikv_seq_pending(seq[k])) continue;
                    d_at[k]++;
                    /* after the prompt (d 0) or decode step d: the reference's row d */
                    assert_memory_equal(ikv_seq_logits(seq[k]), lref[k] + (size_t)d_at[k] * V,
                                        sizeof(float) * (size_t)V);
                    if (d_at[k] < DEC) {
                        next[k] = tu_argmax(ikv_seq_logits(seq[k]), V);
                        assert_int_equal(next[k], gref[k][d_at[k]]);
                    } else {
                        ikv_engine_end(e, seq[k]);
                        live--;
                    }
                }
                assert_true(ikv_engine_check(e));
            }
        }
        /* admission by reserved blocks: a budget that holds one request, not two */
        ikv_engine_destroy(e);
        ikv_engine_options ob = o;
        ob.private_blocks = (np + DEC + 15) / 16;
        assert_int_equal(ikv_engine_create(m, &ob, &e), 0);
        ikv_request rq = {.tokens = P, .n = np, .tenant = "T", .max_new = DEC}, rq2 = rq;
        ikv_seq *s1, *s2;
        assert_int_equal(ikv_engine_admit(e, &rq, &s1, NULL), 0);
        rq2.tenant = "U";
        assert_int_equal(ikv_engine_admit(e, &rq2, &s2, NULL), IKV_EFULL);
        rq2.max_new = 4096;
        assert_int_equal(ikv_engine_admit(e, &rq2, &s2, NULL), IKV_ETOOLONG);
        ikv_step_item twice[2] = {{.seq = s1}, {.seq = s1}};
        assert_int_equal(ikv_engine_step(e, twice, 2), IKV_EINVAL);
        assert_int_equal(ikv_seq_pending(s1), np); /* a rejected step ran nothing */
        ikv_step_item it = {.seq = s1};
        assert_int_equal(ikv_engine_step(e, &it, 1), 0);
        for (int d = 0; d < DEC; d++) {
            it.token = gen[d];
            assert_int_equal(ikv_engine_step(e, &it, 1), 0);
            assert_memory_equal(ikv_seq_logits(s1), ref + (size_t)(d + 1) * V,
                                sizeof(float) * (size_t)V);
        }
        it.token = 1;
        assert_int_equal(ikv_engine_step(e, &it, 1), IKV_ETOOLONG); /* past prompt + max_new */
        ikv_engine_end(e, s1);
        rq2.max_new = DEC;
        assert_int_equal(ikv_engine_admit(e, &rq2, &s2, NULL), 0);
        ikv_engine_end(e, s2);
        assert_true(ikv_engine_check(e));
        ikv_engine_destroy(e);
        /* reserve_new: the prompt and one position now, later blocks one at a time (only the
         * private ones: the cache holds the full prompt blocks). With a budget of one full
         * request and one block, requests are admitted until it is spent; they decode in
         * lockstep, and when one's next block does not fit (reserve_next EFULL; the step EFULL,
         * running nothing) the newest other sequence ends; logits stay bit-identical */
        ob.private_blocks = (np + DEC + 15) / 16 + 1;
        assert_int_equal(ikv_engine_create(m, &ob, &e), 0);
        rq.reserve_new = 1, rq.max_new = DEC;
        static const char *tn[] = {"T", "U", "V", "W", "X", "Y", "Z", "A", "B", "C"};
        ikv_seq *many[10];
        int nm = 0, arc = 0;
        while (nm < 10) {
            rq2 = rq, rq2.tenant = tn[nm];
            if ((arc = ikv_engine_admit(e, &rq2, &many[nm], NULL))) break;
            nm++;
        }
        assert_int_equal(arc, IKV_EFULL);
        assert_true(nm >= 2); /* more than one full request's reservation would allow */
        ikv_step_item pre[10];
        for (int k = 0; k < nm; k++)
            pre[k] = (ikv_step_item){.seq = many[k]};
        assert_int_equal(ikv_engine_step(e, pre, (size_t)nm), 0);
        int refused = 0;
        for (int d = 0; d < DEC; d++) {
            for (int k = 0; k < nm; k++) {
                int rc;
                while ((rc = ikv_seq_reserve_next(e, many[k]))) {
                    assert_int_equal(rc, IKV_EFULL);
                    it = (ikv_step_item){.seq = many[k], .token = gen[d]};
                    assert_int_equal(ikv_engine_step(e, &it, 1), IKV_EFULL);
                    assert_int_equal(ikv_seq_len(many[k]), np + (size_t)d); /* nothing ran */
                    assert_true(nm > 1); /* the oldest alone always fits */
                    ikv_engine_end(e, many[--nm]); /* "preempt" the newest: maybe itself */
                    refused = 1;
                    if (k == nm) break;
                }
            }
            for (int k = 0; k < nm; k++)
                pre[k] = (ikv_step_item){.seq = many[k], .token = gen[d]};
            assert_int_equal(ikv_engine_step(e, pre, (size_t)nm), 0);
            for (int k = 0; k < nm; k++)
                assert_memory_equal(ikv_seq_logits(many[k]), ref + (size_t)(d + 1) * V,
                                    sizeof(float) * (size_t)V);
            assert_true(ikv_engine_check(e));
        }
        for (int k = 0; k < nm; k++)
            ikv_engine_end(e, many[k]);
        assert_true(refused);
        assert_true(ikv_engine_check(e));
        ikv_engine_destroy(e);
        for (int i = 1; i < NT; i++)
            free(oref[i]);
    }
    free(ref);
    ikv_tokenizer_destroy(tk);
    ikv_model_destroy(m);
}

/* Tries of ikv_engine_create and ikv_tokenizer_load for tu_alloc_fail_each. */
typedef struct af_try {
    ikv_model *m;
    int threads;
    const char *tok_path;
    ikv_engine *e;
    ikv_tokenizer *t;
} af_try;

static int try_engine(void *ctx) {
    af_try *a = ctx;
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = a->threads; /* 3: the worker pool's allocations fail too */
    a->e = NULL;
    return ikv_engine_create(a->m, &o, &a->e);
}

static int try_tokenizer(void *ctx) {
    af_try *a = ctx;
    a->t = NULL;
    return ikv_tokenizer_load(a->tok_path, 512, &a->t);
}

static void test_alloc_failure(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 6, &m), 0);
    const char *tp = tmp_path("tok_af.bin");
    assert_int_equal(ikv_tokenizer_write_synthetic(tp, 512, 3), 0);
    af_try a = {.m = m, .tok_path = tp};
    for (a.threads = 0; a.threads <= 3; a.threads += 3) {
        tu_alloc_fail_each(try_engine, &a, 200);
        ikv_engine_destroy(a.e);
    }
    openblas_set_num_threads(1);
    tu_alloc_fail_each(try_tokenizer, &a, 50);
    ikv_tokenizer_destroy(a.t);
    ikv_model *m2 = NULL;
    ikv_alloc_fail_after(1);
    assert_int_equal(ikv_model_random(&c, 1, &m2), IKV_ENOMEM);
    ikv_alloc_fail_after(SIZE_MAX);
    ikv_model_destroy(m);
}

/* ---- regressions: hostile input (issue 9) ------------------------------------------------- */

/* `run --tokenizer .` printed ".: 9223372036854775807 bytes": a directory is named as one. */
static void test_regress_tokenizer_directory(void **st) {
    (void)st;
    ikv_tokenizer *t;
    assert_int_equal(ikv_tokenizer_load(".", 512, &t), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), ".: is a directory, not a tokenizer file"));
    ikv_model *m;
    assert_int_equal(ikv_model_load(".", &m), IKV_EIO);
    assert_non_null(strstr(ikv_errdetail(), ".: is a directory, not a checkpoint file"));
}

/* `run --kv-mem 100G` failed with "engine buffers (KV pool 100000000000 bytes)" (or, where
 * memory is overcommitted, would be killed while the pool is touched): a pool beyond the
 * machine's memory is refused before anything is allocated, with both sizes. */
static void test_regress_kv_mem_beyond_memory(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 1, &m), 0);
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.kv_mem = UINT64_C(1) << 60; /* an exabyte: more than any machine this runs on */
    ikv_engine *e = NULL;
    assert_int_equal(ikv_engine_create(m, &o, &e), IKV_ERANGE);
    assert_null(e);
    assert_non_null(strstr(ikv_errdetail(), "is more than this machine's"));
    ikv_model_destroy(m);
}

/* The decode bound read "222%" for a model whose weights fit in the last-level cache; and
 * --decode 0 / --prefix 0 ran a benchmark with nothing to measure. */
static void test_regress_bench_bound_and_zero_sizes(void **st) {
    (void)st;
    ikv_engine_bench_options o = {.config = "tiny",
                                  .prefix = 32,
                                  .suffix = 8,
                                  .decode = 4,
                                  .threads = {1, 0},
                                  .seed = 1,
                                  .repeat = 1};
    ikv_engine_bench_result r;
    o.decode = 0;
    assert_int_equal(ikv_engine_bench(&o, &r), IKV_EINVAL);
    o.decode = 4, o.prefix = 0;
    assert_int_equal(ikv_engine_bench(&o, &r), IKV_EINVAL);
    o.prefix = 32;
    assert_int_equal(ikv_engine_bench(&o, &r), 0);
    const ikv_engine_bench_row *w = &r.rows[0];
    ikv_model_config c = tiny();
    double want = (double)ikv_model_decode_bytes(&c) +
                  (double)ikv_model_kv_bytes_per_token(&c) * (40.0 + 4.0 / 2);
    assert_true(fabs(w->step_bytes - want) < 1);
    /* the tiny model (under 1 MB a step) fits any last-level cache this reports */
    if (r.llc_bytes) {
        assert_int_equal(w->bound_applies, 0);
        assert_true(w->decode_bound_tok_s == 0);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ikv_engine_bench_print(&r, f, 0);
    fclose(f);
    if (r.llc_bytes)
        assert_non_null(strstr(buf, "no bandwidth bound applies"));
    else if (w->decode_tok_s > w->decode_bound_tok_s)
        assert_non_null(strstr(buf, "above the bound: caches hold part"));
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_sizes),
        cmocka_unit_test(test_checkpoint_roundtrip),
        cmocka_unit_test(test_checkpoint_malformed),
        cmocka_unit_test(test_tokenizer_roundtrip),
        cmocka_unit_test(test_tokenizer_heap_vs_naive),
        cmocka_unit_test(test_tokenizer_malformed),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_reference_forward),
        cmocka_unit_test(test_exact_with_cache),
        cmocka_unit_test(test_decode_thread_invariant),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_pool_barrier),
        cmocka_unit_test(test_grouped_calls_exact),
        cmocka_unit_test(test_bench_cli),
        cmocka_unit_test(test_model_run_cli),
        cmocka_unit_test(test_tenants),
        cmocka_unit_test(test_collision_is_miss),
        cmocka_unit_test(test_fuzz_against_oracle),
        cmocka_unit_test(test_two_sequences),
        cmocka_unit_test(test_eviction_and_limits),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_regress_tokenizer_directory),
        cmocka_unit_test(test_regress_kv_mem_beyond_memory),
        cmocka_unit_test(test_regress_bench_bound_and_zero_sizes),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
