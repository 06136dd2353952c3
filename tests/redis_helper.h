/*
 * Test helper: redis-server children on free loopback ports (never a shell: testutil's tu_spawn,
 * fork + execvp with an argument vector), stopped with SIGKILL in teardown and, as a last
 * resort, at exit (testutil's atexit hook) or when the test process dies (PR_SET_PDEATHSIG).
 */
#ifndef IKV_TEST_REDIS_HELPER_H
#define IKV_TEST_REDIS_HELPER_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <stdarg.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

/* The children, ports and waits are testutil's (tu_spawn, tu_free_port, tu_kill_all); this file
 * adds what is redis's own: readiness by PING, the server's flags, clusters. */
#define RH_MAX 8
static pid_t rh_pids[RH_MAX];

static void rh_kill_all(void) {
    for (int i = 0; i < RH_MAX; i++)
        tu_kill(rh_pids[i]), rh_pids[i] = 0;
}

/* A loopback TCP port in 20000..29999 nobody listens on right now, whose cluster bus port
 * (+10000) is free too (ephemeral ports are too high for a bus port). */
static int rh_free_port(void) {
    return tu_free_port(10000);
}

static void rh_sleep(double s) {
    tu_sleep(s);
}

/* Waits up to 10 s for PING to answer on port. 1 if it did. */
static int rh_wait_up(int port) {
    for (int i = 0; i < 200; i++) {
        struct timeval tv = {0, 200000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            redisFree(c);
            if (ok) return 1;
        } else if (c) {
            redisFree(c);
        }
        rh_sleep(0.05);
    }
    return 0;
}

/* Starts redis-server on port (cluster mode with its own dir when cluster_dir != NULL) and
 * records it in slot `i`. Returns the pid, or -1. */
static pid_t rh_start(int i, int port, const char *cluster_dir) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    char conf[64];
    snprintf(conf, sizeof conf, "nodes-%d.conf", port);
    if (cluster_dir) mkdir(cluster_dir, 0755);
    const char *argv[] = {"redis-server",
                          "--port",
                          p,
                          "--bind",
                          "127.0.0.1",
                          "--save",
                          "",
                          "--appendonly",
                          "no",
                          "--daemonize",
                          "no",
                          cluster_dir ? "--dir" : NULL,
                          cluster_dir,
                          "--cluster-enabled",
                          "yes",
                          "--cluster-config-file",
                          conf,
                          "--cluster-node-timeout",
                          "2000",
                          NULL};
    pid_t pid = tu_spawn(argv, NULL, NULL);
    if (pid < 0) return -1;
    rh_pids[i] = pid;
    if (!rh_wait_up(port)) return -1;
    return pid;
}

static void rh_stop(int i) {
    tu_kill(rh_pids[i]);
    rh_pids[i] = 0;
}

/* Runs argv (no shell), waits up to `secs`; returns its exit status or -1. */
static int rh_run(const char *const *argv, int secs) {
    return tu_run(argv, NULL, NULL, secs);
}

/* A command on a fresh connection (caller frees the reply); NULL if it failed. */
static redisReply *rh_cmd(int port, const char *fmt, ...) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c) redisFree(c);
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

/* Starts a three-master cluster under dir; ports[3] get the ports. 1 on success. */
static int rh_cluster(const char *dir, int ports[3]) {
    char d[3][300], hp[3][32];
    mkdir(dir, 0755);
    for (int i = 0; i < 3; i++) {
        ports[i] = rh_free_port();
        snprintf(d[i], sizeof d[i], "%s/node%d", dir, i);
        if (ports[i] < 0 || rh_start(2 + i, ports[i], d[i]) < 0) return 0;
        snprintf(hp[i], sizeof hp[i], "127.0.0.1:%d", ports[i]);
    }
    const char *argv[] = {"redis-cli", "--cluster",          "create", hp[0],           hp[1],
                          hp[2],       "--cluster-replicas", "0",      "--cluster-yes", NULL};
    if (rh_run(argv, 30) != 0) return 0;
    for (int t = 0; t < 200; t++) {
        int ok = 1;
        for (int i = 0; i < 3 && ok; i++) {
            redisReply *r = rh_cmd(ports[i], "CLUSTER INFO");
            ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
            if (r) freeReplyObject(r);
        }
        if (ok) return 1;
        rh_sleep(0.05);
    }
    return 0;
}

#endif
