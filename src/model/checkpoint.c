/*
 * Checkpoints in the llama2.c "legacy" (version 0) format, named configurations, and
 * deterministic random weights.
 *
 * File layout (all little-endian; written by llama2.c's export script, read by its run.c):
 *
 *   offset 0   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
 *              (vocab_size < 0: the classifier is stored separately at the end)
 *   offset 28  fp32 token_embedding  [vocab][dim]
 *              fp32 rms_att          [layer][dim]
 *              fp32 wq               [layer][n_heads*hd][dim]      hd = dim / n_heads
 *              fp32 wk, wv           [layer][n_kv_heads*hd][dim]
 *              fp32 wo               [layer][dim][n_heads*hd]
 *              fp32 rms_ffn          [layer][dim]
 *              fp32 w1               [layer][hidden][dim]
 *              fp32 w2               [layer][dim][hidden]
 *              fp32 w3               [layer][hidden][dim]
 *              fp32 rms_final        [dim]
 *              fp32 freq_cis_real    [seq_len][hd/2]   (unused: RoPE is recomputed)
 *              fp32 freq_cis_imag    [seq_len][hd/2]
 *              fp32 wcls             [vocab][dim]      only when vocab_size < 0
 *
 * The loader maps the file read-only and accepts it only if its length is exactly what the
 * header implies: a shorter file is truncated, a longer one is not this format (version-1/2
 * exports start with the magic "ak42" and are named as such). Nothing is read before the
 * header fields are checked against limits, so absurd sizes cannot overflow the arithmetic.
 *
 * Random weights: splitmix64 stream from the seed -> uniform in [-sqrt(3) s, sqrt(3) s] with
 * s = 1/sqrt(fan_in) (so each projection keeps unit variance), the residual output projections
 * (wo, w2) scaled by 1/sqrt(2 n_layers) so the residual stream grows like O(1) over depth,
 * the embedding by 4/sqrt(dim) (tied classifier logits of standard deviation ~4), norms 1.
 * Same seed, same bytes, on every machine.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    ikv_model_config cfg;
} named[] = {
    {"tiny", {64, 176, 3, 4, 2, 512, 256, 1}},
    {"stories15m", {288, 768, 6, 6, 6, 32000, 256, 1}},
    {"small", {512, 1376, 8, 8, 4, 32000, 4096, 1}},
    {"base", {768, 2048, 12, 12, 4, 32000, 8192, 1}},
};

int ikv_model_config_named(const char *name, ikv_model_config *out) {
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (name && !strcmp(name, named[i].name)) {
            *out = named[i].cfg;
            return 0;
        }
    return ikv_error(IKV_EMODEL, "unknown model config '%s' (known: %s)", name ? name : "(null)",
                     ikv_model_config_names());
}

const char *ikv_model_config_names(void) {
    return "tiny, stories15m, small, base";
}

/* Limits that keep every size product far inside uint64 and reject garbage headers. */
#define LIM_DIM    65536
#define LIM_HIDDEN 1048576
#define LIM_LAYERS 1024
#define LIM_VOCAB  (1 << 22)
#define LIM_SEQ    (1 << 20)

static int field(const char *name, int32_t v, int32_t lim) {
    if (v <= 0) return ikv_error(IKV_EFORMAT, "%s = %d: must be positive", name, (int)v);
    if (v > lim)
        return ikv_error(IKV_EFORMAT, "%s = %d: larger than the limit %d", name, (int)v, (int)lim);
    return 0;
}

int ikv_model_config_check(const ikv_model_config *c) {
    int rc;
    if ((rc = field("dim", c->dim, LIM_DIM)) ||
        (rc = field("hidden_dim", c->hidden_dim, LIM_HIDDEN)) ||
        (rc = field("n_layers", c->n_layers, LIM_LAYERS)) ||
        (rc = field("n_heads", c->n_heads, c->dim)) ||
        (rc = field("n_kv_heads", c->n_kv_heads, c->n_heads)) ||
        (rc = field("vocab_size", c->vocab_size, LIM_VOCAB)) ||
        (rc = field("seq_len", c->seq_len, LIM_SEQ)))
        return rc;
    if (c->dim % c->n_heads)
        return ikv_error(IKV_EFORMAT, "dim %d is not a multiple of n_heads %d", (int)c->dim,
                         (int)c->n_heads);
    if (c->n_heads % c->n_kv_heads)
        return ikv_error(IKV_EFORMAT, "n_heads %d is not a multiple of n_kv_heads %d",
                         (int)c->n_heads, (int)c->n_kv_heads);
    if ((c->dim / c->n_heads) % 2)
        return ikv_error(IKV_EFORMAT, "head_dim %d is odd (RoPE rotates pairs)",
                         (int)(c->dim / c->n_heads));
    return 0;
}

uint64_t ikv__ckpt_floats(const ikv_model_config *c) {
    uint64_t d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t hd = d / (uint64_t)c->n_heads, kv = hd * (uint64_t)c->n_kv_heads,
             V = (uint64_t)c->vocab_size;
    uint64_t f = V * d;                    /* embedding */
    f += L * d * 2;                        /* rms_att, rms_ffn */
    f += L * (d * d + 2 * kv * d + d * d); /* wq, wk, wv, wo */
    f += L * 3 * d * h;                    /* w1, w2, w3 */
    f += d;                                /* rms_final */
    f += (uint64_t)c->seq_len * hd;        /* freq_cis real + imag */
    if (!c->shared_classifier) f += V * d; /* wcls */
    return f;
}

uint64_t ikv_model_params(const ikv_model_config *c) {
    uint64_t hd = (uint64_t)(c->dim / c->n_heads);
    return ikv__ckpt_floats(c) - (uint64_t)c->seq_len * hd;
}

uint64_t ikv_model_file_bytes(const ikv_model_config *c) {
    return IKV__CKPT_HEADER_BYTES + 4 * ikv__ckpt_floats(c);
}

uint64_t ikv_model_kv_bytes_per_token(const ikv_model_config *c) {
    uint64_t kv = (uint64_t)(c->dim / c->n_heads) * (uint64_t)c->n_kv_heads;
    return 2 * (uint64_t)c->n_layers * kv * 4;
}

uint64_t ikv_model_decode_bytes(const ikv_model_config *c) {
    uint64_t d = (uint64_t)c->dim, V = (uint64_t)c->vocab_size;
    /* everything but the embedding table, plus one embedding row and the classifier */
    return 4 * (ikv_model_params(c) - V * d + d + (c->shared_classifier ? V * d : 0));
}

void ikv__model_bind(struct ikv_model *m, const ikv_model_config *c) {
    m->cfg = *c;
    m->head_dim = c->dim / c->n_heads;
    m->q_dim = m->head_dim * c->n_heads;
    m->kv_dim = m->head_dim * c->n_kv_heads;
    size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t V = (size_t)c->vocab_size, q = (size_t)m->q_dim, kv = (size_t)m->kv_dim;
    const float *p = (const float *)((const char *)m->image + IKV__CKPT_HEADER_BYTES);
    m->w.emb = p, p += V * d;
    m->w.rms_att = p, p += L * d;
    m->w.wq = p, p += L * q * d;
    m->w.wk = p, p += L * kv * d;
    m->w.wv = p, p += L * kv * d;
    m->w.wo = p, p += L * d * q;
    m->w.rms_ffn = p, p += L * d;
    m->w.w1 = p, p += L * h * d;
    m->w.w2 = p, p += L * d * h;
    m->w.w3 = p, p += L * h * d;
    m->w.rms_final = p, p += d;
    p += (size_t)c->seq_len * (size_t)m->head_dim; /* freq_cis real + imag, skipped */
    m->w.wcls = c->shared_classifier ? m->w.emb : p;
}

/* Parses and checks the header of an image of `bytes` bytes named `path`; fills *c. */
static int parse_header(const char *path, const void *image, size_t bytes, ikv_model_config *c) {
    if (bytes < IKV__CKPT_HEADER_BYTES)
        return ikv_error(IKV_ETRUNC, "%s: %zu bytes, shorter than the 28-byte llama2.c header",
                         path, bytes);
    int32_t h[7];
    memcpy(h, image, sizeof h);
    if ((uint32_t)h[0] == 0x616b3432u)
        return ikv_error(IKV_EFORMAT,
                         "%s: llama2.c version-1/2 export (magic \"ak42\"); only the legacy "
                         "version-0 layout is supported (export with --version 0)",
                         path);
    memset(c, 0, sizeof *c);
    c->dim = h[0], c->hidden_dim = h[1], c->n_layers = h[2], c->n_heads = h[3];
    c->n_kv_heads = h[4], c->seq_len = h[6];
    c->shared_classifier = h[5] > 0;
    c->vocab_size = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]);
    int rc = ikv_model_config_check(c);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", ikv_errdetail()); /* ikv_error rewrites that buffer */
        return ikv_error(rc, "%s: bad header: %s", path, why);
    }
    uint64_t want = ikv_model_file_bytes(c);
    if ((uint64_t)bytes < want)
        return ikv_error(IKV_ETRUNC,
                         "%s: truncated: %zu bytes, the header (dim %d, hidden %d, %d layers, "
                         "vocab %d, seq_len %d) implies %llu",
                         path, bytes, (int)c->dim, (int)c->hidden_dim, (int)c->n_layers,
                         (int)c->vocab_size, (int)c->seq_len, (unsigned long long)want);
    if ((uint64_t)bytes > want)
        return ikv_error(IKV_EFORMAT,
                         "%s: size does not match the header: %zu bytes, the header implies %llu "
                         "(%llu trailing bytes)",
                         path, bytes, (unsigned long long)want,
                         (unsigned long long)((uint64_t)bytes - want));
    return 0;
}

int ikv_model_load(const char *path, ikv_model **out) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ikv_error(IKV_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int dir = S_ISDIR(st.st_mode);
        close(fd);
        return ikv_error(IKV_EIO, "%s: %s, not a checkpoint file", path,
                         dir ? "is a directory" : "is not a regular file");
    }
    size_t bytes = (size_t)st.st_size;
    if (bytes < IKV__CKPT_HEADER_BYTES) {
        close(fd);
        return ikv_error(IKV_ETRUNC, "%s: %zu bytes, shorter than the 28-byte llama2.c header",
                         path, bytes);
    }
    void *img = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (img == MAP_FAILED) return ikv_error(IKV_EIO, "%s: mmap failed: %s", path, strerror(errno));
    ikv_model_config c;
    int rc = parse_header(path, img, bytes, &c);
    if (rc) {
        munmap(img, bytes);
        return rc;
    }
    ikv_model *m = ikv_calloc(1, sizeof *m);
    if (!m) {
        munmap(img, bytes);
        return ikv_error(IKV_ENOMEM, "model struct");
    }
    m->image = img;
    m->image_bytes = bytes;
    m->mapped = 1;
    ikv__model_bind(m, &c);
    *out = m;
    return 0;
}

/* splitmix64: a tiny, well-mixed, seedable stream (Steele, Lea, Flood 2014). */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Fills n floats uniform in [-a, a] (a = sqrt(3) * stddev). */
static void fill_uniform(float *p, size_t n, float stddev, uint64_t *s) {
    float a = sqrtf(3.0f) * stddev;
    for (size_t i = 0; i < n; i++) {
        float u = (float)(splitmix(s) >> 40) / 16777216.0f; /* [0,1), 24 bits, exact */
        p[i] = (2.0f * u - 1.0f) * a;
    }
}

static void fill_const(float *p, size_t n, float v) {
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

int ikv_model_random(const ikv_model_config *cin, uint64_t seed, ikv_model **out) {
    int rc = ikv_model_config_check(cin);
    if (rc) return rc;
    ikv_model_config c = *cin;
    c.shared_classifier = c.shared_classifier ? 1 : 0;
    uint64_t bytes = ikv_model_file_bytes(&c);
    if (bytes > (uint64_t)SIZE_MAX / 2)
        return ikv_error(IKV_ENOMEM, "model of %llu bytes", (unsigned long long)bytes);
    ikv_model *m = ikv_calloc(1, sizeof *m);
    void *img = ikv_malloc((size_t)bytes);
    if (!m || !img) {
        ikv_free(m);
        ikv_free(img);
        return ikv_error(IKV_ENOMEM, "model image of %llu bytes", (unsigned long long)bytes);
    }
    int32_t h[7] = {c.dim,     c.hidden_dim, c.n_layers,
                    c.n_heads, c.n_kv_heads, c.shared_classifier ? c.vocab_size : -c.vocab_size,
                    c.seq_len};
    memcpy(img, h, sizeof h);
    m->image = img;
    m->image_bytes = (size_t)bytes;
    ikv__model_bind(m, &c);

    size_t d = (size_t)c.dim, hid = (size_t)c.hidden_dim, L = (size_t)c.n_layers,
           V = (size_t)c.vocab_size;
    size_t q = (size_t)m->q_dim, kv = (size_t)m->kv_dim, hd = (size_t)m->head_dim;
    float res = 1.0f / sqrtf(2.0f * (float)L);
    uint64_t s = seed;
    /* Sections are filled in file order from one stream, through non-const aliases. */
    float *p = (float *)((char *)img + IKV__CKPT_HEADER_BYTES);
    fill_uniform(p, V * d, 4.0f / sqrtf((float)d), &s), p += V * d;
    fill_const(p, L * d, 1.0f), p += L * d;
    fill_uniform(p, L * q * d, 1.0f / sqrtf((float)d), &s), p += L * q * d;
    fill_uniform(p, L * kv * d, 1.0f / sqrtf((float)d), &s), p += L * kv * d;
    fill_uniform(p, L * kv * d, 1.0f / sqrtf((float)d), &s), p += L * kv * d;
    fill_uniform(p, L * d * q, res / sqrtf((float)q), &s), p += L * d * q;
    fill_const(p, L * d, 1.0f), p += L * d;
    fill_uniform(p, L * hid * d, 1.0f / sqrtf((float)d), &s), p += L * hid * d;
    fill_uniform(p, L * d * hid, res / sqrtf((float)hid), &s), p += L * d * hid;
    fill_uniform(p, L * hid * d, 1.0f / sqrtf((float)d), &s), p += L * hid * d;
    fill_const(p, d, 1.0f), p += d;
    /* freq_cis as llama2.c's exporter writes it (cos, then sin, of pos * theta^(-2i/hd)) */
    for (size_t t = 0; t < (size_t)c.seq_len; t++)
        for (size_t i = 0; i < hd / 2; i++) {
            float f = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hd);
            p[t * (hd / 2) + i] = cosf((float)t * f);
            p[(size_t)c.seq_len * (hd / 2) + t * (hd / 2) + i] = sinf((float)t * f);
        }
    p += (size_t)c.seq_len * hd;
    if (!c.shared_classifier) fill_uniform(p, V * d, 1.0f / sqrtf((float)d), &s);
    *out = m;
    return 0;
}

int ikv_model_write_random_stream(FILE *f, const ikv_model_config *c, uint64_t seed) {
    ikv_model *m;
    int rc = ikv_model_random(c, seed, &m);
    if (rc) return rc;
    if (fwrite(m->image, 1, m->image_bytes, f) != m->image_bytes)
        rc = ikv_error(IKV_EIO, "checkpoint: write failed: %s", strerror(errno));
    ikv_model_destroy(m);
    return rc;
}

int ikv_model_write_random(const char *path, const ikv_model_config *c, uint64_t seed) {
    ikv_outset *s = NULL;
    FILE *f = NULL;
    int rc = ikv_outset_create(&s);
    if (rc) return rc;
    if (!(rc = ikv_outset_add(s, path, &f, NULL)) &&
        !(rc = ikv_model_write_random_stream(f, c, seed)))
        rc = ikv_outset_commit(s);
    ikv_outset_destroy(s);
    return rc;
}

void ikv_model_destroy(ikv_model *m) {
    if (!m) return;
    if (m->mapped)
        munmap(m->image, m->image_bytes);
    else
        ikv_free(m->image);
    ikv_free(m);
}

const ikv_model_config *ikv_model_cfg(const ikv_model *m) {
    return &m->cfg;
}
