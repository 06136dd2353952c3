/*
 * Checkpoints in llama2.c's int8 "version 2" format (its export.py --version 2, read by runq.c):
 * the loader and the writer (`isokv model quantize`).
 *
 * File layout (little-endian):
 *
 *   offset 0    uint32 magic 0x616b3432 ("ak42")
 *          4    int32  version = 2
 *          8    int32  dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
 *         36    uint8  shared_classifier (0 or 1)
 *         37    int32  group size gs (unaligned)
 *         41    zero padding up to 256
 *        256    fp32   rms_att [layer][dim], rms_ffn [layer][dim], rms_final [dim]
 *               then each quantized matrix as int8 values [rows][cols] followed by its fp32
 *               scales [rows * cols / gs] (one per group of gs consecutive values), in order:
 *               token embedding (vocab, dim); per layer wq (q_dim, dim); per layer wk, then wv
 *               (kv_dim, dim); per layer wo (dim, q_dim); per layer w1 (hidden, dim), w2
 *               (dim, hidden), w3 (hidden, dim); the classifier (vocab, dim) unless shared.
 *
 * There are no RoPE tables (version 0 had them). Unlike the legacy header, vocab_size is always
 * positive: the flag byte says whether the classifier is shared.
 *
 * Validation, before anything is used: the magic and version; the config fields as for the
 * fp32 loader (ikv_model_config_check); the flag byte 0 or 1; zero padding; a group size that
 * divides every matrix's input width (runq.c's matmul assumes it: a group that straddles rows
 * would mix two rows' scales); the exact length the header implies (shorter: IKV_ETRUNC; longer:
 * trailing bytes, IKV_EFORMAT); every scale finite and >= 0; no int8 value -128 (llama2.c's
 * quantization is symmetric, [-127, 127]; the SIMD kernels rely on it: |q| must fit a signed
 * byte). The last two read the whole file once at load (~1 ms per 10 MB here), which also pages
 * it in.
 *
 * Quantization (the writer) follows export.py's quantize_q80: per group of gs values, scale =
 * max |w| / 127 (fp32), q = round-half-to-even(w / scale) (torch.round); an all-zero group gets
 * scale 0 and q = 0. The embedding is quantized too, as runq.c expects (it dequantizes rows).
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *qm_name[IKV__QM_KINDS] = {
    "token_embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"};

/* Rows and columns of matrix kind k of shape c. */
static void qm_shape(const ikv_model_config *c, int k, size_t *rows, size_t *cols) {
    size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, V = (size_t)c->vocab_size;
    size_t kv = d / (size_t)c->n_heads * (size_t)c->n_kv_heads;
    switch (k) {
    case IKV__QM_EMB:
    case IKV__QM_CLS:
        *rows = V, *cols = d;
        break;
    case IKV__QM_Q:
    case IKV__QM_O:
        *rows = d, *cols = d;
        break;
    case IKV__QM_K:
    case IKV__QM_V:
        *rows = kv, *cols = d;
        break;
    case IKV__QM_1:
    case IKV__QM_3:
        *rows = h, *cols = d;
        break;
    default:
        *rows = d, *cols = h;
        break; /* w2 */
    }
}

/* Layers of matrix kind k (embedding and classifier: one). */
static size_t qm_layers(const ikv_model_config *c, int k) {
    return k == IKV__QM_EMB || k == IKV__QM_CLS ? 1 : (size_t)c->n_layers;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

int ikv_model_q8_group_check(const ikv_model_config *c, int gs) {
    if (gs <= 0 || gs > c->dim)
        return ikv_error(IKV_EINVAL, "group size %d: must be in 1..dim (%d)", gs, (int)c->dim);
    const char *what = NULL;
    int width = 0;
    if (c->dim % gs)
        what = "dim, the input width of the embedding, wq, wk, wv, wo, w1, w3", width = c->dim;
    else if (c->hidden_dim % gs)
        what = "hidden_dim, the input width of w2", width = c->hidden_dim;
    if (!what) return 0;
    uint64_t g = gcd_u64((uint64_t)c->dim, (uint64_t)c->hidden_dim);
    char list[160];
    size_t o = 0;
    list[0] = 0;
    for (uint64_t d = 1; d <= g && o + 24 < sizeof list; d++)
        if (g % d == 0)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%llu", o ? ", " : "",
                                  (unsigned long long)d);
    return ikv_error(IKV_EINVAL,
                     "group size %d does not divide %s (%d): a group must not straddle two rows; "
                     "groups that divide both dim %d and hidden_dim %d: %s",
                     gs, what, width, (int)c->dim, (int)c->hidden_dim, list);
}

/* Bytes of one layer of matrix kind k: values then scales. */
static uint64_t qm_bytes(const ikv_model_config *c, int k, int gs) {
    size_t r, cl;
    qm_shape(c, k, &r, &cl);
    uint64_t n = (uint64_t)r * cl;
    return n + 4 * (n / (uint64_t)gs);
}

uint64_t ikv_model_q8_file_bytes(const ikv_model_config *c, int gs) {
    uint64_t b = IKV__CKPT_Q8_HEADER_BYTES;
    b += 4 * ((uint64_t)c->n_layers * (uint64_t)c->dim * 2 + (uint64_t)c->dim);
    for (int k = 0; k < IKV__QM_KINDS; k++) {
        if (k == IKV__QM_CLS && c->shared_classifier) continue;
        b += qm_layers(c, k) * qm_bytes(c, k, gs);
    }
    return b;
}

uint64_t ikv_model_q8_decode_bytes(const ikv_model_config *c, int gs) {
    /* norms, every layer matrix, one embedding row, the classifier */
    uint64_t b = 4 * ((uint64_t)c->n_layers * (uint64_t)c->dim * 2 + (uint64_t)c->dim);
    for (int k = IKV__QM_Q; k <= IKV__QM_3; k++)
        b += (uint64_t)c->n_layers * qm_bytes(c, k, gs);
    uint64_t row = (uint64_t)c->dim + 4 * ((uint64_t)c->dim / (uint64_t)gs);
    return b + row + qm_bytes(c, IKV__QM_CLS, gs);
}

int ikv_model_group(const ikv_model *m) {
    return m->gs;
}

/* Reads a little-endian int32 at p. */
static int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

int ikv__q8_bind(struct ikv_model *m, const char *path, const void *image, size_t bytes) {
    const uint8_t *b = image;
    if (bytes < IKV__CKPT_Q8_HEADER_BYTES)
        return ikv_error(IKV_ETRUNC,
                         "%s: %zu bytes, shorter than the 256-byte llama2.c version-2 header", path,
                         bytes);
    int32_t version = rd_i32(b + 4);
    if (version != 2)
        return ikv_error(IKV_EFORMAT,
                         "%s: llama2.c export version %d (magic \"ak42\"); supported: version 2 "
                         "(int8) here, and the legacy version-0 layout (no magic)",
                         path, (int)version);
    ikv_model_config c;
    memset(&c, 0, sizeof c);
    c.dim = rd_i32(b + 8), c.hidden_dim = rd_i32(b + 12), c.n_layers = rd_i32(b + 16);
    c.n_heads = rd_i32(b + 20), c.n_kv_heads = rd_i32(b + 24), c.vocab_size = rd_i32(b + 28);
    c.seq_len = rd_i32(b + 32);
    int rc = ikv_model_config_check(&c);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", ikv_errdetail());
        return ikv_error(rc, "%s: bad version-2 header: %s", path, why);
    }
    if (b[36] > 1)
        return ikv_error(IKV_EFORMAT,
                         "%s: bad version-2 header: shared_classifier byte (offset 36) is %u, "
                         "expected 0 or 1",
                         path, (unsigned)b[36]);
    c.shared_classifier = b[36];
    int32_t gs = rd_i32(b + 37);
    for (size_t i = 41; i < IKV__CKPT_Q8_HEADER_BYTES; i++)
        if (b[i])
            return ikv_error(IKV_EFORMAT,
                             "%s: bad version-2 header: padding byte at offset %zu is 0x%02x, "
                             "expected zero",
                             path, i, (unsigned)b[i]);
    if ((rc = ikv_model_q8_group_check(&c, gs))) {
        char why[512];
        snprintf(why, sizeof why, "%s", ikv_errdetail());
        return ikv_error(IKV_EFORMAT, "%s: bad version-2 header: %s", path, why);
    }
    uint64_t want = ikv_model_q8_file_bytes(&c, gs);
    if ((uint64_t)bytes < want)
        return ikv_error(IKV_ETRUNC,
                         "%s: truncated: %zu bytes, the version-2 header (dim %d, hidden %d, %d "
                         "layers, vocab %d, group %d, %s classifier) implies %llu",
                         path, bytes, (int)c.dim, (int)c.hidden_dim, (int)c.n_layers,
                         (int)c.vocab_size, (int)gs, c.shared_classifier ? "shared" : "separate",
                         (unsigned long long)want);
    if ((uint64_t)bytes > want)
        return ikv_error(IKV_EFORMAT,
                         "%s: size does not match the version-2 header: %zu bytes, the header "
                         "implies %llu (%llu trailing bytes)",
                         path, bytes, (unsigned long long)want,
                         (unsigned long long)((uint64_t)bytes - want));
    /* bind: norms, then the matrices in file order */
    m->cfg = c;
    m->gs = gs;
    m->head_dim = c.dim / c.n_heads;
    m->q_dim = m->head_dim * c.n_heads;
    m->kv_dim = m->head_dim * c.n_kv_heads;
    memset(&m->w, 0, sizeof m->w);
    const size_t D = (size_t)c.dim, L = (size_t)c.n_layers;
    const float *f = (const float *)(b + IKV__CKPT_Q8_HEADER_BYTES);
    m->w.rms_att = f, f += L * D;
    m->w.rms_ffn = f, f += L * D;
    m->w.rms_final = f, f += D;
    const uint8_t *p = (const uint8_t *)f;
    for (int k = 0; k < IKV__QM_KINDS; k++) {
        ikv__qmat *q = &m->qm[k];
        if (k == IKV__QM_CLS && c.shared_classifier) {
            *q = m->qm[IKV__QM_EMB];
            continue;
        }
        qm_shape(&c, k, &q->rows, &q->cols);
        q->stride = (size_t)qm_bytes(&c, k, gs);
        q->q = (const int8_t *)p;
        p += qm_layers(&c, k) * q->stride;
    }
    IKV_ASSERT((size_t)(p - b) == bytes);
    /* contents: scales finite and non-negative, values in [-127, 127] */
    for (int k = 0; k < IKV__QM_KINDS; k++) {
        if (k == IKV__QM_CLS && c.shared_classifier) continue;
        const ikv__qmat *q = &m->qm[k];
        const size_t n = q->rows * q->cols, ns = n / (size_t)gs;
        for (size_t l = 0; l < qm_layers(&c, k); l++) {
            const uint8_t *v = (const uint8_t *)ikv__qm_q(m, k, (int)l);
            const uint8_t *bad = memchr(v, 0x80, n);
            if (bad) {
                size_t at = (size_t)(bad - v);
                return ikv_error(IKV_EFORMAT,
                                 "%s: %s (layer %zu) row %zu column %zu (file offset %zu) holds "
                                 "the int8 value -128, outside llama2.c's symmetric range "
                                 "[-127, 127]",
                                 path, qm_name[k], l, at / q->cols, at % q->cols,
                                 (size_t)(bad - b));
            }
            const uint8_t *s = v + n;
            for (size_t i = 0; i < ns; i++) {
                float x;
                memcpy(&x, s + 4 * i, sizeof x);
                if (!(x >= 0.0f) || isinf(x))
                    return ikv_error(IKV_EFORMAT,
                                     "%s: %s (layer %zu) scale of group %zu (file offset %zu) is "
                                     "%g: scales must be finite and non-negative",
                                     path, qm_name[k], l, i, (size_t)(s + 4 * i - b), (double)x);
            }
        }
    }
    return 0;
}

/* export.py's quantize_q80 of n values (gs divides n) into q[n] and s[n / gs]. */
static void quantize_groups(const float *w, size_t n, int gs, int8_t *q, float *s) {
    for (size_t g = 0; g < n / (size_t)gs; g++) {
        const float *x = w + g * (size_t)gs;
        float mx = 0.0f;
        for (int i = 0; i < gs; i++)
            mx = fabsf(x[i]) > mx ? fabsf(x[i]) : mx;
        const float sc = mx / 127.0f;
        s[g] = sc;
        for (int i = 0; i < gs; i++) {
            float v = sc > 0.0f ? rintf(x[i] / sc) : 0.0f; /* half to even, as torch.round */
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q[g * (size_t)gs + (size_t)i] = (int8_t)v;
        }
    }
}

/* Layer 0 of the fp32 matrix kind k of an fp32 model, and its per-layer stride in floats. */
static const float *fp32_mat(const ikv_model *m, int k, size_t *stride) {
    size_t r, c;
    qm_shape(&m->cfg, k, &r, &c);
    *stride = r * c;
    switch (k) {
    case IKV__QM_EMB:
        return m->w.emb;
    case IKV__QM_Q:
        return m->w.wq;
    case IKV__QM_K:
        return m->w.wk;
    case IKV__QM_V:
        return m->w.wv;
    case IKV__QM_O:
        return m->w.wo;
    case IKV__QM_1:
        return m->w.w1;
    case IKV__QM_2:
        return m->w.w2;
    case IKV__QM_3:
        return m->w.w3;
    default:
        return m->w.wcls;
    }
}

int ikv_model_quantize(const ikv_model *m, int gs, ikv_model **out) {
    const ikv_model_config *c = &m->cfg;
    if (m->gs)
        return ikv_error(
            IKV_EINVAL, "the model is already int8 (group %d); quantize an fp32 checkpoint", m->gs);
    int rc = ikv_model_q8_group_check(c, gs);
    if (rc) return rc;
    const uint64_t bytes = ikv_model_q8_file_bytes(c, gs);
    if (bytes > (uint64_t)SIZE_MAX / 2)
        return ikv_error(IKV_ENOMEM, "int8 image of %llu bytes", (unsigned long long)bytes);
    ikv_model *q = ikv_calloc(1, sizeof *q);
    uint8_t *img = ikv_malloc((size_t)bytes);
    if (!q || !img) {
        ikv_free(q), ikv_free(img);
        return ikv_error(IKV_ENOMEM, "int8 image of %llu bytes", (unsigned long long)bytes);
    }
    memset(img, 0, IKV__CKPT_Q8_HEADER_BYTES);
    uint32_t magic = IKV__CKPT_Q8_MAGIC;
    int32_t hv[8] = {2,          c->dim,        c->hidden_dim, c->n_layers,
                     c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len};
    memcpy(img, &magic, 4);
    memcpy(img + 4, hv, sizeof hv);
    img[36] = c->shared_classifier ? 1 : 0;
    int32_t g32 = gs;
    memcpy(img + 37, &g32, 4);
    uint8_t *p = img + IKV__CKPT_Q8_HEADER_BYTES;
    const size_t D = (size_t)c->dim, L = (size_t)c->n_layers;
    memcpy(p, m->w.rms_att, 4 * L * D), p += 4 * L * D;
    memcpy(p, m->w.rms_ffn, 4 * L * D), p += 4 * L * D;
    memcpy(p, m->w.rms_final, 4 * D), p += 4 * D;
    for (int k = 0; k < IKV__QM_KINDS; k++) {
        if (k == IKV__QM_CLS && c->shared_classifier) continue;
        size_t stride;
        const float *w = fp32_mat(m, k, &stride);
        for (size_t l = 0; l < qm_layers(c, k); l++) {
            float *sc = ikv_malloc(sizeof(float) * (stride / (size_t)gs));
            if (!sc) {
                ikv_free(q), ikv_free(img);
                return ikv_error(IKV_ENOMEM, "quantize scales");
            }
            quantize_groups(w + l * stride, stride, gs, (int8_t *)p, sc);
            memcpy(p + stride, sc, sizeof(float) * (stride / (size_t)gs));
            ikv_free(sc);
            p += stride + 4 * (stride / (size_t)gs);
        }
    }
    IKV_ASSERT((uint64_t)(p - img) == bytes);
    q->image = img;
    q->image_bytes = (size_t)bytes;
    q->mapped = 0;
    if ((rc = ikv__q8_bind(q, "(quantized in memory)", img, (size_t)bytes))) {
        ikv_model_destroy(q);
        return rc;
    }
    *out = q;
    return 0;
}

int ikv_model_write_q8(const ikv_model *m, const char *path, int gs) {
    /* the target's checks first (a device or directory is refused before any work) */
    int rc = ikv_output_check(path);
    if (rc) return rc;
    ikv_model *q;
    if ((rc = ikv_model_quantize(m, gs, &q))) return rc;
    ikv_outset *s = NULL;
    FILE *f = NULL;
    if (!(rc = ikv_outset_create(&s)) && !(rc = ikv_outset_add(s, path, &f, NULL))) {
        if (fwrite(q->image, 1, q->image_bytes, f) != q->image_bytes)
            rc = ikv_error(IKV_EIO, "%s: write failed: %s", path, strerror(errno));
        else
            rc = ikv_outset_commit(s);
    }
    ikv_outset_destroy(s);
    ikv_model_destroy(q);
    return rc;
}
