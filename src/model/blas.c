/*
 * OpenBLAS loaded on first use (see blas.h for why). The function pointers start at
 * trampolines that load the library and then forward the call; ikv__blas_load() replaces
 * them with the library's own functions, once, under pthread_once.
 */
#include "blas.h"

#include "isokv/base.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#ifndef IKV_OPENBLAS_LIB
#define IKV_OPENBLAS_LIB "libopenblas.so.0"
#endif

static void tramp_sgemm(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE ta,
                        const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                        const blasint k, const float alpha, const float *a, const blasint lda,
                        const float *b, const blasint ldb, const float beta, float *c,
                        const blasint ldc);
static float tramp_sasum(const blasint n, const float *x, const blasint incx);
static void tramp_set_num_threads(int n);

ikv__blas_fns ikv__blas = {tramp_sgemm, tramp_sasum, tramp_set_num_threads};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int load_rc;
static char load_msg[512];

static void load(void) {
    const char *names[] = {IKV_OPENBLAS_LIB, "libopenblas.so.0", "libopenblas.so"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_msg, sizeof load_msg, "cannot load OpenBLAS (%s): %s", IKV_OPENBLAS_LIB,
                 e ? e : "unknown error");
        load_rc = IKV_EUNSUPPORTED;
        return;
    }
    ikv__blas_fns f;
    *(void **)&f.sgemm = dlsym(h, "cblas_sgemm");
    *(void **)&f.sasum = dlsym(h, "cblas_sasum");
    *(void **)&f.set_num_threads = dlsym(h, "openblas_set_num_threads");
    if (!f.sgemm || !f.sasum || !f.set_num_threads) {
        snprintf(load_msg, sizeof load_msg,
                 "%s lacks cblas_sgemm, cblas_sasum or "
                 "openblas_set_num_threads",
                 IKV_OPENBLAS_LIB);
        load_rc = IKV_EUNSUPPORTED;
        return;
    }
    ikv__blas = f;
}

int ikv__blas_load(void) {
    pthread_once(&once, load);
    return load_rc ? ikv_error(load_rc, "%s", load_msg) : 0;
}

int ikv__blas_loaded(void) {
    return ikv__blas.sgemm != tramp_sgemm;
}

/* A call before ikv__blas_load(): load, or stop (a BLAS call has no way to return an error;
 * engine creation loads first, so this only guards internal callers). */
static void must_load(void) {
    IKV_ASSERT(ikv__blas_load() == 0);
}

static void tramp_sgemm(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE ta,
                        const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                        const blasint k, const float alpha, const float *a, const blasint lda,
                        const float *b, const blasint ldb, const float beta, float *c,
                        const blasint ldc) {
    must_load();
    ikv__blas.sgemm(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static float tramp_sasum(const blasint n, const float *x, const blasint incx) {
    must_load();
    return ikv__blas.sasum(n, x, incx);
}

static void tramp_set_num_threads(int n) {
    must_load();
    ikv__blas.set_num_threads(n);
}
