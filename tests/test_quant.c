/*
 * Tests of the int8 weights (src/model/checkpoint_q8.c, src/model/quant.c): llama2.c version-2
 * checkpoints (loader validation, quantize round trip, `isokv model quantize`), the int8
 * kernels against an oracle written from runq.c's formulas (every SIMD level bit for bit, row
 * ranges, the matrix product against the matrix-vector product), exact reuse with int8 weights
 * at 1 and 2 threads, and greedy parity with llama2.c's runq.c through outputs it produced
 * (tests/data/runq/, see its README).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
    return tu_tmpdir(tmpdir, sizeof tmpdir, "quant");
}

static int teardown_all(void **st) {
    (void)st;
    return tu_rmtree(tmpdir);
}

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static ikv_model_config tiny(void) {
    ikv_model_config c;
    assert_int_equal(ikv_model_config_named("tiny", &c), 0);
    return c;
}

/* dim 128, hidden 352 (= 32 x 11): group 32 works, so the SIMD kernels run */
static ikv_model_config wide(void) {
    ikv_model_config c = {128, 352, 2, 4, 2, 512, 256, 1};
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
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)sz + 1);
    assert_int_equal(fread(p, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return p;
}

/* ---- kernels against the oracle ------------------------------------------------------------ */

/* runq.c's quantize, written from its formula. */
static void oracle_quantize(const float *x, size_t n, int gs, int8_t *q, float *s) {
    for (size_t g = 0; g < n / (size_t)gs; g++) {
        float wmax = 0.0f;
        for (int i = 0; i < gs; i++)
            if (fabsf(x[g * gs + i]) > wmax) wmax = fabsf(x[g * gs + i]);
        s[g] = wmax / 127.0f;
        for (int i = 0; i < gs; i++)
            q[g * gs + i] = s[g] > 0 ? (int8_t)round(x[g * gs + i] / s[g]) : 0;
    }
}

/* runq.c's matmul of rows [0, rows), written from its formula. */
static void oracle_matvec(const int8_t *W, const float *ws, size_t rows, size_t K, int gs,
                          const int8_t *xq, const float *xs, float *y) {
    for (size_t r = 0; r < rows; r++) {
        float val = 0.0f;
        for (size_t j = 0; j + (size_t)gs <= K; j += (size_t)gs) {
            int32_t iv = 0;
            for (int k = 0; k < gs; k++)
                iv += (int32_t)xq[j + k] * (int32_t)W[r * K + j + k];
            val += ((float)iv) * ws[(r * K + j) / gs] * xs[j / gs];
        }
        y[r] = val;
    }
}

/* A fake int8 model holding one matrix kind (w1, layer 0) of rows x K in groups of gs. */
typedef struct fake {
    struct ikv_model m;
    uint8_t *img; /* values then scales */
    int8_t *W;
    float *ws;
} fake;

static void fake_make(fake *f, size_t rows, size_t K, int gs, uint64_t seed) {
    memset(f, 0, sizeof *f);
    size_t n = rows * K, ns = n / (size_t)gs;
    f->img = calloc(n + 4 * ns, 1);
    f->W = (int8_t *)f->img;
    f->ws = malloc(4 * ns);
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++)
        f->W[i] = (int8_t)((int)(rng(&s) % 255) - 127); /* [-127, 127] */
    for (size_t i = 0; i < ns; i++) {
        f->ws[i] = (float)(rng(&s) % 100000 + 1) * 1e-7f;
        memcpy(f->img + n + 4 * i, &f->ws[i], 4);
    }
    f->m.gs = gs;
    f->m.qm[IKV__QM_1] = (ikv__qmat){f->W, n + 4 * ns, rows, K};
}

static void fake_free(fake *f) {
    free(f->img), free(f->ws);
}

/* x of n values: random, one all-zero group, one group whose scale is exactly 1 with values
 * on .5 (round half away from zero), large and tiny magnitudes. */
static void make_act(float *x, size_t n, int gs, uint64_t seed) {
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++)
        x[i] = ((float)(rng(&s) % 2000001) - 1000000.0f) * 1e-6f * (i % 7 == 0 ? 50.0f : 1.0f);
    if (n >= 3 * (size_t)gs) {
        memset(x + gs, 0, sizeof(float) * (size_t)gs);
        float *h = x + 2 * gs;
        for (int i = 0; i < gs; i++)
            h[i] = (float)(i % 5) - 2.5f + (i % 2 ? 0.0f : 1.0f);
        h[0] = 127.0f; /* scale = 1 */
        h[1] = -2.5f, h[2] = 2.5f, h[3] = 0.5f, h[4] = -0.5f;
    }
}

/* Every kernel level quantizes and multiplies exactly as the oracle, for group sizes the SIMD
 * kernels take (32, 64, 128) and ones only the portable kernel takes (4, 48 at AVX2's 8-lane
 * quantization); any row range gives each row the bits of the full call; the matrix product
 * (packed or not) gives the matrix-vector bits; dequantization is q * scale. */
static void test_kernels_vs_oracle(void **st) {
    (void)st;
    const int gss[] = {4, 32, 48, 64, 128};
    for (size_t gi = 0; gi < sizeof gss / sizeof gss[0]; gi++) {
        const int gs = gss[gi];
        const size_t K = (size_t)gs * (gs >= 64 ? 5 : 11), rows = 37, M = 5;
        fake f;
        fake_make(&f, rows, K, gs, 1000 + (uint64_t)gs);
        float *X = malloc(sizeof(float) * M * K), *xs = malloc(sizeof(float) * M * K);
        int8_t *xq = malloc(M * K);
        float *yo = malloc(sizeof(float) * M * rows), *y = malloc(sizeof(float) * M * rows);
        for (size_t i = 0; i < M; i++) {
            make_act(X + i * K, K, gs, 77 + i);
            oracle_quantize(X + i * K, K, gs, xq + i * K, xs + i * K / (size_t)gs);
            oracle_matvec(f.W, f.ws, rows, K, gs, xq + i * K, xs + i * K / (size_t)gs,
                          yo + i * rows);
        }
        /* the .5 cases really are rounded away from zero */
        if (K >= 3 * (size_t)gs) {
            assert_true(xs[2] == 1.0f);
            assert_int_equal(xq[2 * gs + 1], -3);
            assert_int_equal(xq[2 * gs + 2], 3);
            assert_int_equal(xq[2 * gs + 3], 1);
            if (gs > 4) assert_int_equal(xq[2 * gs + 4], -1);
            assert_true(xs[1] == 0.0f);
        }
        int8_t *aq = malloc(M * K);
        uint8_t *aa = malloc(M * K);
        float *as = malloc(sizeof(float) * M * K);
        for (int lv = 0; lv <= 3; lv++) {
            ikv__q8_simd_force(lv);
            for (size_t i = 0; i < M; i++) {
                ikv__q8act a = {aq + i * K, aa + i * K, as + i * K / (size_t)gs};
                ikv__q8_quantize(X + i * K, K, gs, &a);
                assert_memory_equal(a.q, xq + i * K, K);
                assert_memory_equal(a.s, xs + i * K / (size_t)gs, sizeof(float) * K / (size_t)gs);
                for (size_t j = 0; j < K; j++)
                    assert_int_equal(a.a[j], abs(a.q[j]));
                /* the whole range, then rows alone and an uneven split */
                ikv__q8_matvec(&f.m, IKV__QM_1, 0, &a, y, 0, rows);
                assert_memory_equal(y, yo + i * rows, sizeof(float) * rows);
                memset(y, 0, sizeof(float) * rows);
                for (size_t r = 0; r < rows; r++)
                    ikv__q8_matvec(&f.m, IKV__QM_1, 0, &a, y, r, r + 1);
                assert_memory_equal(y, yo + i * rows, sizeof(float) * rows);
                ikv__q8_matvec(&f.m, IKV__QM_1, 0, &a, y, 0, 13);
                ikv__q8_matvec(&f.m, IKV__QM_1, 0, &a, y, 13, rows);
                assert_memory_equal(y, yo + i * rows, sizeof(float) * rows);
            }
            /* the matrix product: all rows, packed and not; and a sub-range of weight rows */
            for (int packed = 0; packed < 2; packed++) {
                const size_t r0s[2] = {0, 5}, r1s[2] = {rows, 30};
                for (int ri = 0; ri < 2; ri++) {
                    size_t n0 = r0s[ri], n1 = r1s[ri];
                    size_t pb = ikv__q8_pack(&f.m, IKV__QM_1, 0, n0, n1, NULL);
                    uint8_t *pk = packed && pb ? malloc(pb) : NULL;
                    if (pk) assert_int_equal(ikv__q8_pack(&f.m, IKV__QM_1, 0, n0, n1, pk), pb);
                    float *Y = calloc(M * rows, sizeof(float));
                    ikv__q8act a = {aq, aa, as};
                    ikv__q8_gemm(&f.m, IKV__QM_1, 0, X, M, &a, pk, Y, rows, n0, n1);
                    for (size_t i = 0; i < M; i++) {
                        assert_memory_equal(Y + i * rows + n0, yo + i * rows + n0,
                                            sizeof(float) * (n1 - n0));
                        for (size_t r = 0; r < rows; r++)
                            if (r < n0 || r >= n1) assert_true(Y[i * rows + r] == 0.0f);
                    }
                    /* one row from the packed rows (decode's path): aligned starts only */
                    if (pk) {
                        ikv__q8act a0 = {aq, aa, as};
                        float *y1 = calloc(rows, sizeof(float));
                        assert_int_equal(
                            ikv__q8_gemv_packed(&f.m, IKV__QM_1, pk, n0, &a0, y1, n0, n1), 1);
                        assert_memory_equal(y1 + n0, yo + n0, sizeof(float) * (n1 - n0));
                        assert_int_equal(
                            ikv__q8_gemv_packed(&f.m, IKV__QM_1, pk, n0, &a0, y1, n0 + 1, n1), 0);
                        free(y1);
                    }
                    free(Y), free(pk);
                }
            }
            /* dequantization */
            float *dq = malloc(sizeof(float) * 3 * K);
            ikv__q8_dequant_rows(&f.m, IKV__QM_1, 0, 7, 10, dq);
            for (size_t j = 0; j < 3 * K; j++) {
                size_t e = 7 * K + j;
                assert_true(dq[j] == (float)f.W[e] * f.ws[e / (size_t)gs]);
            }
            free(dq);
        }
        ikv__q8_simd_force(-1);
        free(aq), free(aa), free(as);
        free(X), free(xs), free(xq), free(yo), free(y);
        fake_free(&f);
    }
}

/* ---- checkpoints ----------------------------------------------------------------------------- */

/* A valid version-2 file of `tiny` (group 16), then each corruption is refused with a message
 * that names the problem; a valid file loads with the shape, group and classifier it says. */
static void test_v2_loader_rejects(void **st) {
    (void)st;
    ikv_model_config c = tiny();
    ikv_model *m;
    assert_int_equal(ikv_model_random(&c, 3, &m), 0);
    const char *good = tmp_path("good_q8.bin");
    assert_int_equal(ikv_model_write_q8(m, good, 16), 0);
    ikv_model_destroy(m);
    size_t n;
    uint8_t *img = read_all(good, &n);
    assert_int_equal(n, ikv_model_q8_file_bytes(&c, 16));
    assert_int_equal(ikv_model_load(good, &m), 0);
    assert_int_equal(ikv_model_group(m), 16);
    assert_int_equal(ikv_model_cfg(m)->dim, 64);
    assert_int_equal(ikv_model_cfg(m)->shared_classifier, 1);
    ikv_model_destroy(m);

    const char *bad = tmp_path("bad_q8.bin");
    uint8_t *b = malloc(n + 8);
    struct {
        const char *what;
        int rc;
        const char *msg;
    } cases[] = {
        {"truncated by one byte", IKV_ETRUNC, "truncated"},
        {"shorter than the header", IKV_ETRUNC, "shorter than the 256-byte"},
        {"version 1", IKV_EFORMAT, "version 1"},
        {"flag byte 2", IKV_EFORMAT, "shared_classifier byte"},
        {"padding", IKV_EFORMAT, "padding byte at offset 100"},
        {"group 32 (does not divide hidden 176)", IKV_EFORMAT, "does not divide hidden_dim"},
        {"group 0", IKV_EFORMAT, "group size 0"},
        {"trailing byte", IKV_EFORMAT, "1 trailing bytes"},
        {"value -128", IKV_EFORMAT, "-128"},
        {"NaN scale", IKV_EFORMAT, "scales must be finite"},
        {"negative scale", IKV_EFORMAT, "scales must be finite"},
        {"dim 0", IKV_EFORMAT, "dim = 0"},
        {"n_heads 3", IKV_EFORMAT, "not a multiple of n_heads"},
    };
    const size_t norms = 4 * ((size_t)c.n_layers * 64 * 2 + 64);
    const size_t emb_q = 256 + norms, emb_s = emb_q + 512 * 64;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = n;
        memcpy(b, img, n);
        int32_t v;
        float f;
        switch (i) {
        case 0:
            len = n - 1;
            break;
        case 1:
            len = 100;
            break;
        case 2:
            v = 1, memcpy(b + 4, &v, 4);
            break;
        case 3:
            b[36] = 2;
            break;
        case 4:
            b[100] = 1;
            break;
        case 5:
            v = 32, memcpy(b + 37, &v, 4);
            break;
        case 6:
            v = 0, memcpy(b + 37, &v, 4);
            break;
        case 7:
            b[n] = 0, len = n + 1;
            break;
        case 8:
            b[emb_q + 12345] = 0x80;
            break;
        case 9:
            f = NAN, memcpy(b + emb_s + 40, &f, 4);
            break;
        case 10:
            f = -1.0f, memcpy(b + emb_s + 40, &f, 4);
            break;
        case 11:
            v = 0, memcpy(b + 8, &v, 4);
            break;
        default:
            v = 3, memcpy(b + 20, &v, 4);
            break;
        }
        write_bytes(bad, b, len);
        ikv_model *x = NULL;
        int rc = ikv_model_load(bad, &x);
        if (rc != cases[i].rc || !strstr(ikv_errdetail(), cases[i].msg))
            fail_msg("%s: rc %d (%s), want %d and \"%s\"", cases[i].what, rc, ikv_errdetail(),
                     cases[i].rc, cases[i].msg);
        assert_null(x);
        assert_non_null(strstr(ikv_errdetail(), bad)); /* names the file */
    }
    free(b), free(img);
}

/* Quantize round trip: the file equals the in-memory quantization byte for byte; every weight
 * dequantizes to within half a step of its fp32 value, with scale = max|w| / 127 per group; a
 * separate classifier is kept; groups that do not divide a width are refused with the reason;
 * a target that is not a regular file is refused and no temporary file is left. */
static void test_quantize_roundtrip(void **st) {
    (void)st;
    for (int shared = 0; shared < 2; shared++) {
        ikv_model_config c = tiny();
        c.shared_classifier = shared;
        ikv_model *m, *q, *l;
        assert_int_equal(ikv_model_random(&c, 11, &m), 0);
        const char *path = tmp_path("rt_q8.bin");
        assert_int_equal(ikv_model_write_q8(m, path, 8), 0);
        assert_int_equal(ikv_model_quantize(m, 8, &q), 0);
        assert_int_equal(ikv_model_load(path, &l), 0);
        assert_int_equal(l->image_bytes, q->image_bytes);
        assert_memory_equal(l->image, q->image, q->image_bytes);
        assert_int_equal(ikv_model_cfg(l)->shared_classifier, shared);
        assert_memory_equal(l->w.rms_att, m->w.rms_att, sizeof(float) * 3 * 64);
        assert_memory_equal(l->w.rms_final, m->w.rms_final, sizeof(float) * 64);
        const float *src[] = {m->w.emb, m->w.wq, m->w.wk, m->w.wv,  m->w.wo,
                              m->w.w1,  m->w.w2, m->w.w3, m->w.wcls};
        for (int k = 0; k < IKV__QM_KINDS; k++) {
            const ikv__qmat *qm = &l->qm[k];
            const size_t rows = qm->rows, cols = qm->cols;
            const int layers = k == IKV__QM_EMB || k == IKV__QM_CLS ? 1 : c.n_layers;
            float *dq = malloc(sizeof(float) * rows * cols);
            for (int ly = 0; ly < layers; ly++) {
                ikv__q8_dequant_rows(l, k, ly, 0, rows, dq);
                const float *w = src[k] + (size_t)ly * rows * cols;
                for (size_t g = 0; g < rows * cols / 8; g++) {
                    float mx = 0;
                    for (size_t i = 0; i < 8; i++)
                        mx = fabsf(w[g * 8 + i]) > mx ? fabsf(w[g * 8 + i]) : mx;
                    float sc;
                    memcpy(&sc, ikv__qm_s(l, k, ly) + 4 * g, 4);
                    assert_true(sc == mx / 127.0f);
                    for (size_t i = 0; i < 8; i++)
                        assert_true(fabsf(dq[g * 8 + i] - w[g * 8 + i]) <= 0.5001f * sc);
                }
            }
            free(dq);
        }
        if (shared)
            assert_ptr_equal(l->qm[IKV__QM_CLS].q, l->qm[IKV__QM_EMB].q);
        else
            assert_true(l->qm[IKV__QM_CLS].q != l->qm[IKV__QM_EMB].q);
        /* an int8 model is not quantized again */
        ikv_model *again = NULL;
        assert_int_equal(ikv_model_quantize(l, 8, &again), IKV_EINVAL);
        assert_null(again);
        ikv_model_destroy(l);
        ikv_model_destroy(q);
        /* tiny: dim 64, hidden 176 = 16 x 11 */
        assert_int_equal(ikv_model_write_q8(m, path, 32), IKV_EINVAL);
        assert_non_null(strstr(ikv_errdetail(), "does not divide hidden_dim"));
        assert_non_null(strstr(ikv_errdetail(), "1, 2, 4, 8, 16"));
        assert_int_equal(ikv_model_write_q8(m, path, 65), IKV_EINVAL);
        assert_true(ikv_model_write_q8(m, tmpdir, 8) != 0); /* a directory */
        assert_non_null(strstr(ikv_errdetail(), tmpdir));
        assert_true(ikv_model_write_q8(m, "/dev/null", 8) != 0); /* a device */
        ikv_model_destroy(m);
    }
    /* nothing but the finished files in the directory: no temporary left behind */
    DIR *dir = opendir(tmpdir);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));)
        assert_null(strstr(e->d_name, "tmp"));
    closedir(dir);
}

/* Runs `isokv ARGS` (the words of args, no shell) capturing stdout into out (at most cap
 * bytes) and stderr into err; returns the exit status. */
static int run_isokv(const char *args, char *out, size_t cap, char *err, size_t ecap) {
    return tu_isokv_line(args, out, cap, err, ecap, 0, 300);
}

/* isokv model quantize and info: usage errors exit 2, a group that does not fit exits 1 with
 * the reason, a good run writes a file that info describes as int8. */
static void test_quantize_cli(void **st) {
    (void)st;
    static char out[8192], err[4096];
    char args[4096];
    const char *src = getenv("IKV_SOURCE_DIR");
    assert_non_null(src);
    char q[600], x[600];
    snprintf(q, sizeof q, "%s", tmp_path("s260_q4.bin"));
    snprintf(x, sizeof x, "%s", tmp_path("x.bin"));
    assert_int_equal(run_isokv("model quantize", out, sizeof out, err, sizeof err), 2);
    snprintf(args, sizeof args, "model quantize '%s/data/models/stories260K/stories260K.bin'", src);
    assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 2);
    assert_non_null(strstr(err, "-o"));
    snprintf(args, sizeof args,
             "model quantize '%s/data/models/stories260K/stories260K.bin' -o '%s' --group x", src,
             q);
    assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 2);
    snprintf(args, sizeof args,
             "model quantize '%s/data/models/stories260K/stories260K.bin' -o '%s'", src, q);
    assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 1);
    assert_non_null(strstr(err, "group size 64 does not divide hidden_dim"));
    assert_non_null(strstr(err, "1, 2, 4"));
    assert_int_equal(access(q, F_OK), -1);
    snprintf(args, sizeof args, "model quantize '%s/nope.bin' -o '%s' --group 4", tmpdir, q);
    assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 1);
    snprintf(args, sizeof args,
             "model quantize '%s/data/models/stories260K/stories260K.bin' -o '%s' --group 4", src,
             q);
    assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 0);
    snprintf(args, sizeof args, "model info '%s'", q);
    assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 0);
    assert_non_null(strstr(out, "version 2: int8 weights in groups of 4"));
    assert_non_null(strstr(out, "521728 bytes on disk"));
    /* bench engine --q8: int8 weights said in its output; a group that does not fit is refused */
    assert_int_equal(run_isokv("bench engine --config tiny --q8 16 --prefix 32 --suffix 8 "
                               "--decode 4 --threads 1 --repeat 1 --json",
                               out, sizeof out, err, sizeof err),
                     0);
    assert_non_null(strstr(out, "\"weights\": \"int8\", \"q8_group\": 16"));
    assert_non_null(strstr(out, "\"q8_prefill\": \"int8\""));
    assert_int_equal(run_isokv("bench engine --config tiny --q8 32 --prefix 32 --suffix 8 "
                               "--decode 4 --threads 1 --repeat 1",
                               out, sizeof out, err, sizeof err),
                     2); /* a flag that does not fit the config: a usage error */
    assert_non_null(strstr(err, "does not divide hidden_dim"));
    assert_int_equal(run_isokv("bench engine --config tiny --q8 16 --q8-prefill fast", out,
                               sizeof out, err, sizeof err),
                     2);
    /* quantizing an int8 file again is refused */
    snprintf(args, sizeof args, "model quantize '%s' -o '%s' --group 4", q, x);
    assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 1);
    assert_non_null(strstr(err, "already int8"));
}

/* ---- engine ------------------------------------------------------------------------------------
 */

static void make_prompt(uint32_t *t, size_t n, uint64_t seed, uint32_t vocab) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = 3 + (uint32_t)((seed >> 33) % (vocab - 3));
    }
}

/* One request: logits of every computed prompt row and of dec greedy decode steps. */
static float *run_req(ikv_engine *e, const uint32_t *toks, size_t n, int no_cache, int dec,
                      size_t *cached) {
    const int V = ikv_engine_model(e)->cfg.vocab_size;
    float *lg = calloc((n + (size_t)dec) * (size_t)V, sizeof(float));
    ikv_request rq = {.tokens = toks, .n = n, .no_cache = no_cache, .logits_all = lg};
    ikv_seq *s;
    ikv_prefill_info info;
    assert_int_equal(ikv_engine_begin(e, &rq, &s, &info), 0);
    *cached = info.cached_tokens;
    uint32_t next = tu_argmax(ikv_seq_logits(s), V);
    for (int d = 0; d < dec; d++) {
        const float *l;
        assert_int_equal(ikv_engine_decode(e, s, next, &l), 0);
        memcpy(lg + (n + (size_t)d) * (size_t)V, l, sizeof(float) * (size_t)V);
        next = tu_argmax(l, V);
    }
    ikv_engine_end(e, s);
    assert_true(ikv_engine_check(e));
    return lg;
}

/* Exact reuse with int8 weights: for each model (group 32 on `wide`: the SIMD kernels; group 16
 * on `tiny`: the portable matrix-vector kernel), each prefill scheme (int8 products, dequantize
 * + sgemm) and 1 and 2 threads, a request whose prefix comes from the cache (fully aligned and
 * partly) gives the bits of a no-cache run on every computed logit row and every decode step;
 * with int8 products the logits are also the same at 1 and 2 threads (no BLAS in the
 * projections; attention's calls have the same shapes at any thread count). */
static void test_q8_exact_with_cache(void **st) {
    (void)st;
    const ikv_model_config cfgs[2] = {wide(), tiny()};
    const int groups[2] = {32, 16};
    enum { N = 150, DEC = 6 };
    for (int mi = 0; mi < 2; mi++) {
        ikv_model *f, *m;
        ikv_model_config c = cfgs[mi];
        assert_int_equal(ikv_model_random(&c, 21, &f), 0);
        assert_int_equal(ikv_model_quantize(f, groups[mi], &m), 0);
        ikv_model_destroy(f);
        const int V = c.vocab_size;
        uint32_t a[N], b[N];
        make_prompt(a, N, 5, (uint32_t)V);
        memcpy(b, a, sizeof a);
        make_prompt(b + 100, N - 100, 9, (uint32_t)V); /* shares 100 tokens (6 blocks + 4) */
        for (int scheme = 1; scheme >= 0; scheme--) {
            float *ref_threads = NULL;
            for (int th = 1; th <= 2; th++) {
                ikv__q8_prefill_force(scheme);
                ikv_engine_options o;
                ikv_engine_options_default(&o);
                o.threads = th;
                ikv_engine *e;
                assert_int_equal(ikv_engine_create(m, &o, &e), 0);
                assert_int_equal(e->q8_gemm, scheme);
                size_t cached;
                float *cold = run_req(e, b, N, 1, DEC, &cached);
                assert_int_equal(cached, 0);
                float *warm_a = run_req(e, a, N, 0, DEC, &cached);
                assert_int_equal(cached, 0);
                float *warm_b = run_req(e, b, N, 0, DEC, &cached);
                assert_int_equal(cached, 96);
                assert_memory_equal(warm_b + 96 * (size_t)V, cold + 96 * (size_t)V,
                                    sizeof(float) * (N + DEC - 96) * (size_t)V);
                float *full = run_req(e, b, N, 0, DEC, &cached);
                assert_true(cached >= 144 && cached < N); /* whole blocks, or more (partial) */
                assert_memory_equal(full + cached * (size_t)V, cold + cached * (size_t)V,
                                    sizeof(float) * (N + DEC - cached) * (size_t)V);
                /* int8 logits are finite and not all equal */
                assert_true(isfinite(cold[(N - 1) * (size_t)V]));
                assert_true(cold[(N - 1) * (size_t)V] != cold[(N - 1) * (size_t)V + 1]);
                if (scheme == 1) {
                    if (th == 1)
                        ref_threads = cold, cold = NULL;
                    else
                        assert_memory_equal(ref_threads, cold,
                                            sizeof(float) * (N + DEC) * (size_t)V);
                }
                free(cold), free(warm_a), free(warm_b), free(full);
                ikv_engine_destroy(e);
            }
            free(ref_threads);
        }
        ikv__q8_prefill_force(-1);
        ikv_model_destroy(m);
    }
}

/* The int8 engine against the fp32 engine on the same weights: int8 logits stay close to fp32
 * (a bound on the quantization error, not a bit comparison), and the kernel levels give the same
 * bits end to end (decode and prefill). */
static void test_q8_levels_end_to_end(void **st) {
    (void)st;
    ikv_model_config c = wide();
    ikv_model *f, *m;
    assert_int_equal(ikv_model_random(&c, 8, &f), 0);
    assert_int_equal(ikv_model_quantize(f, 32, &m), 0);
    enum { N = 70, DEC = 4 };
    const int V = c.vocab_size;
    uint32_t p[N];
    make_prompt(p, N, 3, (uint32_t)V);
    float *ref = NULL;
    for (int lv = 3; lv >= 0; lv--) {
        ikv__q8_simd_force(lv);
        ikv_engine *e;
        assert_int_equal(ikv_engine_create(m, NULL, &e), 0);
        size_t cached;
        float *lg = run_req(e, p, N, 1, DEC, &cached);
        if (!ref)
            ref = lg;
        else {
            assert_memory_equal(lg, ref, sizeof(float) * (N + DEC) * (size_t)V);
            free(lg);
        }
        ikv_engine_destroy(e);
    }
    ikv__q8_simd_force(-1);
    ikv_engine *e;
    assert_int_equal(ikv_engine_create(f, NULL, &e), 0);
    size_t cached;
    float *lf = run_req(e, p, N, 1, 0, &cached);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)N * (size_t)V; i++)
        num += (lf[i] - ref[i]) * (lf[i] - ref[i]), den += lf[i] * lf[i];
    assert_true(num / den < 1e-3); /* relative rms error of the int8 logits */
    assert_true(num > 0);          /* and they are not the fp32 ones */
    free(lf), free(ref);
    ikv_engine_destroy(e);
    ikv_model_destroy(m);
    ikv_model_destroy(f);
}

/* The server's batched decode with int8 weights: a sequence stepped together with two others
 * (ikv_engine_step, one batched call per matrix) gets the bits it gets alone, at every step, at
 * 1 and 2 threads. */
static void test_q8_batched_decode(void **st) {
    (void)st;
    ikv_model_config c = wide();
    ikv_model *f, *m;
    assert_int_equal(ikv_model_random(&c, 13, &f), 0);
    assert_int_equal(ikv_model_quantize(f, 32, &m), 0);
    ikv_model_destroy(f);
    enum { N = 40, DEC = 6 };
    const int V = c.vocab_size;
    uint32_t p[3][N];
    for (int i = 0; i < 3; i++)
        make_prompt(p[i], N - 7 * (size_t)i, 31 + (uint64_t)i, (uint32_t)V);
    for (int th = 1; th <= 2; th++) {
        ikv_engine_options o;
        ikv_engine_options_default(&o);
        o.threads = th;
        o.max_seqs = 3;
        ikv_engine *e;
        assert_int_equal(ikv_engine_create(m, &o, &e), 0);
        /* alone */
        float *solo = calloc((size_t)DEC * (size_t)V, sizeof(float));
        size_t cached;
        float *lg = run_req(e, p[0], N, 1, DEC, &cached);
        memcpy(solo, lg + (size_t)N * (size_t)V, sizeof(float) * (size_t)DEC * (size_t)V);
        free(lg);
        /* batched with two others */
        ikv_seq *s[3];
        for (int i = 0; i < 3; i++) {
            ikv_request r = {.tokens = p[i], .n = N - 7 * (size_t)i, .no_cache = 1};
            assert_int_equal(ikv_engine_begin(e, &r, &s[i], NULL), 0);
        }
        for (int d = 0; d < DEC; d++) {
            ikv_step_item it[3];
            memset(it, 0, sizeof it);
            for (int i = 0; i < 3; i++)
                it[i].seq = s[i], it[i].token = tu_argmax(ikv_seq_logits(s[i]), V);
            assert_int_equal(ikv_engine_step(e, it, 3), 0);
            assert_memory_equal(ikv_seq_logits(s[0]), solo + (size_t)d * (size_t)V,
                                sizeof(float) * (size_t)V);
        }
        for (int i = 0; i < 3; i++)
            ikv_engine_end(e, s[i]);
        assert_true(ikv_engine_check(e));
        free(solo);
        ikv_engine_destroy(e);
    }
    ikv_model_destroy(m);
}

/* ---- runq.c's attention, SwiGLU and expf (runq_ops.c) ---------------------------------------- */

/* The expf of the int8 path (16 lanes where the CPU has AVX-512) is libm's, bit for bit: every
 * 61st float of [-105, 90] (36 million values; the whole range was checked once, see
 * runq_ops.c), plus values next to the ends of its range, zeros, infinities and NaN. */
static void test_runq_expf(void **st) {
    (void)st;
    enum { B = 4096 };
    static float in[B], out[B];
    size_t k = 0, total = 0;
    const float special[] = {0.0f,       -0.0f,  INFINITY,  -INFINITY, NAN,     -87.0f,  -87.00001f,
                             -86.99999f, 88.0f,  88.00001f, 87.99999f, -103.9f, -104.5f, 88.7f,
                             89.0f,      1e-30f, -1e-30f,   1e-45f,    -1e-45f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        in[k++] = special[i];
    for (int sign = 0; sign < 2; sign++)
        for (uint64_t b = 0; b <= 0x7f800000u; b += 61) {
            uint32_t u = (uint32_t)b | (sign ? 0x80000000u : 0u);
            float f;
            memcpy(&f, &u, 4);
            if (f < -105.0f || f > 90.0f) continue;
            in[k++] = f;
            if (k == B) {
                memcpy(out, in, sizeof in);
                ikv__runq_expf_buf(out, k);
                for (size_t i = 0; i < k; i++) {
                    const float r = expf(in[i]);
                    if (isnan(r) ? !isnan(out[i]) : memcmp(&r, &out[i], 4) != 0)
                        fail_msg("expf(%a): libm %a, int8 path %a", (double)in[i], (double)r,
                                 (double)out[i]);
                }
                total += k, k = 0;
            }
        }
    assert_true(total > 30000000);
}

/* SwiGLU of the int8 path is runq.c's loop, bit for bit, on every lane and the tail. */
static void test_runq_swiglu(void **st) {
    (void)st;
    enum { N = 203 };
    float hb[N], hb2[N], ref[N];
    uint64_t r = 77;
    for (int i = 0; i < N; i++) {
        hb[i] = (float)((double)(rng(&r) % 2000001) / 1e5 - 10.0);
        hb2[i] = (float)((double)(rng(&r) % 2000001) / 1e5 - 10.0);
    }
    hb[3] = 0.0f, hb[4] = -0.0f, hb[5] = 100.0f, hb[6] = -100.0f, hb[7] = 89.0f, hb[8] = -89.0f;
    for (int i = 0; i < N; i++) {
        float val = hb[i];
        val *= (1.0f / (1.0f + expf(-val)));
        val *= hb2[i];
        ref[i] = val;
    }
    ikv__runq_swiglu(hb, hb2, N);
    assert_memory_equal(hb, ref, sizeof ref);
}

/* With int8 weights every position gets runq.c's arithmetic whichever pass computes it: the
 * logits of a 150-token prefill (three tiles, the last partial; grouped-query heads) equal, row
 * for row and bit for bit, those of one token prefilled and the other 149 decoded one at a time;
 * at 1 and 2 threads, with the vector attention/exp kernels and with the scalar loops. */
static void test_q8_prefill_equals_decode(void **st) {
    (void)st;
    ikv_model_config c = wide();
    ikv_model *f, *m;
    assert_int_equal(ikv_model_random(&c, 17, &f), 0);
    assert_int_equal(ikv_model_quantize(f, 32, &m), 0);
    ikv_model_destroy(f);
    enum { N = 150 };
    const int V = c.vocab_size;
    uint32_t p[N];
    make_prompt(p, N, 9, (uint32_t)V);
    float *ref = NULL;
    for (int avx = 1; avx >= 0; avx--)
        for (int th = 1; th <= 2; th++) {
            ikv__simd_force(avx);
            ikv_engine_options o;
            ikv_engine_options_default(&o);
            o.threads = th;
            ikv_engine *e;
            assert_int_equal(ikv_engine_create(m, &o, &e), 0);
            size_t cached;
            float *pf = run_req(e, p, N, 1, 0, &cached);
            if (!ref)
                ref = pf;
            else {
                assert_memory_equal(pf, ref, sizeof(float) * N * (size_t)V);
                free(pf);
            }
            ikv_request rq = {.tokens = p, .n = 1, .no_cache = 1};
            ikv_seq *s;
            ikv_prefill_info info;
            assert_int_equal(ikv_engine_begin(e, &rq, &s, &info), 0);
            assert_memory_equal(ikv_seq_logits(s), ref, sizeof(float) * (size_t)V);
            for (size_t i = 1; i < N; i++) {
                const float *l;
                assert_int_equal(ikv_engine_decode(e, s, p[i], &l), 0);
                if (memcmp(l, ref + i * (size_t)V, sizeof(float) * (size_t)V))
                    fail_msg("position %zu (avx %d, %d thread(s)): decode differs from prefill", i,
                             avx, th);
            }
            ikv_engine_end(e, s);
            ikv_engine_destroy(e);
        }
    ikv__simd_force(-1);
    free(ref);
    ikv_model_destroy(m);
}

/* ---- parity with runq.c
 * -------------------------------------------------------------------------- */

/* Greedy parity with llama2.c's runq.c, from the outputs it produced (tests/data/runq/MANIFEST:
 * one line per case: file, model, group, prompt number, positions, bytes that must match). The
 * models are remade here exactly as when the outputs were recorded (isokv model init / the
 * bundled stories260K, then isokv model quantize); isokv run's output at 1 and 2 threads must
 * equal runq.c's for at least the recorded number of bytes (the whole file where the manifest
 * says so). */
static void test_runq_parity(void **st) {
    (void)st;
    const char *src = getenv("IKV_SOURCE_DIR");
    assert_non_null(src);
    static const char *prompts[] = {"Once upon a time", "The little dog ran to the park.",
                                    "Zo\xc3\xab had a red ball"};
    char path[1024], args[4096];
    snprintf(path, sizeof path, "%s/tests/data/runq/MANIFEST", src);
    FILE *mf = fopen(path, "r");
    assert_non_null(mf);
    static char out[65536], err[4096];
    char line[512], made[128] = "";
    int cases = 0;
    while (fgets(line, sizeof line, mf)) {
        char file[128], model[64];
        int group, pi, npos;
        long must;
        if (line[0] == '#' ||
            sscanf(line, "%127s %63s %d %d %d %ld", file, model, &group, &pi, &npos, &must) != 6)
            continue;
#ifdef IKV_SANITIZE
        /* sanitizer builds: only the small model (a stories15m run takes minutes there; the
         * release build runs every case) */
        if (strcmp(model, "stories260K")) continue;
#endif
        char q[600], tok[600], fp[600];
        snprintf(q, sizeof q, "%s", tmp_path("parity_q8.bin"));
        snprintf(fp, sizeof fp, "%s", tmp_path("parity_fp32.bin"));
        char key[128];
        snprintf(key, sizeof key, "%s/%d", model, group);
        if (!strcmp(model, "stories260K")) {
            snprintf(tok, sizeof tok, "%s/data/models/stories260K/tok512.bin", src);
            if (strcmp(made, key)) {
                snprintf(args, sizeof args,
                         "model quantize '%s/data/models/stories260K/stories260K.bin' -o '%s' "
                         "--group %d",
                         src, q, group);
                assert_int_equal(run_isokv(args, out, sizeof out, NULL, 0), 0);
            }
        } else { /* stories15m-SEED-tied|separate */
            int seed;
            char cls[16];
            assert_int_equal(sscanf(model, "stories15m-%d-%15s", &seed, cls), 2);
            snprintf(tok, sizeof tok, "%s", tmp_path("parity_tok.bin"));
            if (strcmp(made, key)) {
                snprintf(args, sizeof args,
                         "model init --config stories15m --seed %d --classifier %s -o '%s' "
                         "--tokenizer-out '%s'",
                         seed, cls, fp, tok);
                assert_int_equal(run_isokv(args, out, sizeof out, NULL, 0), 0);
                snprintf(args, sizeof args, "model quantize '%s' -o '%s' --group %d", fp, q, group);
                assert_int_equal(run_isokv(args, out, sizeof out, NULL, 0), 0);
            }
        }
        snprintf(made, sizeof made, "%s", key);
        snprintf(path, sizeof path, "%s/tests/data/runq/%s", src, file);
        size_t en;
        char *expect = read_all(path, &en);
        /* isokv's -n counts generated tokens: positions - (prompt tokens - 1) */
        ikv_tokenizer *tk;
        assert_int_equal(ikv_tokenizer_load(tok, !strcmp(model, "stories260K") ? 512 : 32000, &tk),
                         0);
        uint32_t ids[64];
        size_t np;
        assert_int_equal(ikv_tokenizer_encode(tk, prompts[pi - 1], 1, 0, ids, 64, &np), 0);
        ikv_tokenizer_destroy(tk);
        for (int th = 1; th <= 2; th++) {
            snprintf(args, sizeof args,
                     "run --model '%s' --tokenizer '%s' --prompt '%s' --temp 0 --threads %d -n %d",
                     q, tok, prompts[pi - 1], th, npos - ((int)np - 1));
            assert_int_equal(run_isokv(args, out, sizeof out, err, sizeof err), 0);
            size_t on = strlen(out), same = 0;
            while (same < on && same < en && out[same] == expect[same])
                same++;
            long want = must < 0 ? (long)en : must;
            if (must < 0 && (on != en || same != en))
                fail_msg("%s, %d thread(s): differs from runq.c at byte %zu of %zu", file, th, same,
                         en);
            if ((long)same < want)
                fail_msg("%s, %d thread(s): same as runq.c for %zu bytes, the manifest says %ld",
                         file, th, same, want);
            cases++;
        }
        free(expect);
    }
    fclose(mf);
#ifdef IKV_SANITIZE
    assert_true(cases >= 12);
#else
    assert_true(cases >= 24);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_vs_oracle),   cmocka_unit_test(test_v2_loader_rejects),
        cmocka_unit_test(test_quantize_roundtrip),  cmocka_unit_test(test_quantize_cli),
        cmocka_unit_test(test_q8_exact_with_cache), cmocka_unit_test(test_q8_levels_end_to_end),
        cmocka_unit_test(test_q8_batched_decode),   cmocka_unit_test(test_runq_expf),
        cmocka_unit_test(test_runq_swiglu),         cmocka_unit_test(test_q8_prefill_equals_decode),
        cmocka_unit_test(test_runq_parity),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
