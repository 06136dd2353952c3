/*
 * BLAS for the model, loaded on first use.
 *
 * OpenBLAS starts its worker threads in a constructor when the library is loaded, so a binary
 * that links it pays for them (one thread per core, and their start-up in system time) even
 * when it never multiplies a matrix: `isokv sim`, `isokv trace`, `isokv plan`. The model
 * therefore reaches OpenBLAS only through this header: cblas.h gives the types and enums, and
 * the three functions the model calls are redirected to pointers that blas.c fills by dlopen()
 * of the very library the build found (pkg-config openblas), on the first call or at
 * ikv__blas_load() (engine creation calls it, so a missing library is an error there, never a
 * crash later). Same library, same functions, same bits: only the moment of loading changes.
 */
#ifndef ISOKV_MODEL_BLAS_H
#define ISOKV_MODEL_BLAS_H

#include <cblas.h>

typedef struct ikv__blas_fns {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sasum) *sasum;
    __typeof__(openblas_set_num_threads) *set_num_threads;
} ikv__blas_fns;

extern ikv__blas_fns ikv__blas;

/* Loads OpenBLAS once (thread-safe). 0, or IKV_EUNSUPPORTED with the loader's message. */
int ikv__blas_load(void);

/* 1 once OpenBLAS has been loaded in this process (tests, diagnostics). */
int ikv__blas_loaded(void);

#define cblas_sgemm              (*ikv__blas.sgemm)
#define cblas_sasum              (*ikv__blas.sasum)
#define openblas_set_num_threads (*ikv__blas.set_num_threads)

#endif
