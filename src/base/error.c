/*
 * Error codes and per-thread error detail.
 *
 * The codes and their messages come from IKV_ERRNO_MAP in base.h (one list, libuv-style). The
 * detail buffer is thread-local, so concurrent sweeps in different threads do not overwrite
 * each other's messages.
 */
#include "isokv/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ikv_strerror(int err) {
    switch (err) {
    case IKV_OK:
        return "success";
#define IKV__ERR_CASE(name, msg)                                                                \
    case IKV_E##name:                                                                          \
        return msg;
        IKV_ERRNO_MAP(IKV__ERR_CASE)
#undef IKV__ERR_CASE
    default:
        return "unknown error";
    }
}

static _Thread_local char detail[512];
static _Thread_local int detail_code;

int ikv_error(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    detail_code = err;
    return err;
}

const char *ikv_errdetail(void) {
    if (detail[0]) return detail;
    return ikv_strerror(detail_code);
}

void ikv__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "isokv: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

const char *ikv_errdetail_for(int err) {
    if (detail[0] && detail_code == err) return detail;
    return ikv_strerror(err);
}
