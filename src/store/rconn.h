/*
 * One Redis connection with timeouts and reconnect backoff, shared by redis.c and cluster.c
 * (not a public header).
 *
 * A connection is up, or down until retry_at: a failed connect or a failed/timed-out reply
 * closes it and schedules the next attempt after a backoff that doubles from 0.1 s to 5 s and
 * resets on success. While down every call answers at once (IKV_EIO), so a dead Redis costs a
 * request nothing but misses. hiredis allocates its replies: the Redis backends are the only
 * store code that allocates per call.
 */
#ifndef ISOKV_STORE_RCONN_H
#define ISOKV_STORE_RCONN_H

#include "internal.h"

#include <hiredis/hiredis.h>

typedef struct ikv__rconn {
    char host[64];
    int port;
    int db;
    double timeout_s;
    redisContext *c;
    double retry_at, backoff;
    uint64_t reconnects, failures;
    int was_up; /* connected at least once */
} ikv__rconn;

/* 0 if connected (connecting now if due), IKV_EIO if down. */
int ikv__rconn_ensure(ikv__rconn *r);
/* Closes the connection after an error and schedules the next attempt. */
void ikv__rconn_fail(ikv__rconn *r);
void ikv__rconn_close(ikv__rconn *r);
/* Runs one command (argv) and returns its reply (caller frees with freeReplyObject), or NULL
 * when the connection failed (it is then down). */
redisReply *ikv__rconn_cmd(ikv__rconn *r, int argc, const char **argv, const size_t *lens);
/* Parses "HOST:PORT" at s (up to len bytes) into r. 0 or IKV_EPARAM. */
int ikv__rconn_parse(ikv__rconn *r, const char *s, size_t len);

/* Reply handlers shared by redis.c and cluster.c: fill rcs[i] (and bufs/lens, found). */
typedef struct ikv__rctx {
    void *const *bufs;
    size_t cap;
    size_t *lens;
    int *rcs;
    uint8_t *found;
} ikv__rctx;
void ikv__redis_on_set(void *ctx, size_t i, redisReply *rep);
void ikv__redis_on_get(void *ctx, size_t i, redisReply *rep);
void ikv__redis_on_int(void *ctx, size_t i, redisReply *rep);

#endif
