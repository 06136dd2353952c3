/*
 * The allocation seam. Every allocation in isokv passes here so that tests can inject failure
 * after N allocations (rax-oom-test style) and check that a failed call changed nothing.
 * The counter is process-wide and atomic; the fail point is meant for single-threaded tests.
 */
#include "isokv/base.h"

#include <stdatomic.h>
#include <stdlib.h>

static atomic_size_t fail_after = SIZE_MAX;
static atomic_size_t count;

static int should_fail(void) {
    size_t n = atomic_fetch_add(&count, 1);
    return n >= atomic_load(&fail_after);
}

void *ikv_malloc(size_t n) {
    if (should_fail()) return NULL;
    return malloc(n ? n : 1);
}

void *ikv_calloc(size_t c, size_t s) {
    if (should_fail()) return NULL;
    return calloc(c ? c : 1, s ? s : 1);
}

void *ikv_realloc(void *p, size_t n) {
    if (should_fail()) return NULL;
    return realloc(p, n ? n : 1);
}

void ikv_free(void *p) {
    free(p);
}

size_t ikv_alloc_fail_after(size_t n) {
    size_t made = atomic_exchange(&count, 0);
    atomic_store(&fail_after, n);
    return made;
}
