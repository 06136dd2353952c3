/*
 * Shared test helpers (tests/testutil.c, linked into every cmocka test by CMakeLists.txt's glob
 * rule). Each piece was repeated, with small drifts, in several test files:
 *
 *   - temporary directories: tu_tmpdir makes one with mkdtemp under /tmp, tu_rmtree removes a
 *     tree with nftw (never a shell: no system("rm -rf ...")), tu_path joins dir and name into
 *     one of a few rotating buffers;
 *   - child processes without a shell: tu_spawn (fork + execvp of an argument vector, stdout and
 *     stderr to files or /dev/null, SIGKILL when the test process dies: PR_SET_PDEATHSIG, and at
 *     exit), tu_wait with a bounded timeout (then SIGKILL), tu_run = both, tu_kill;
 *   - a free loopback TCP port (tu_free_port) for servers that cannot take port 0 (redis);
 *   - `isokv serve` (the binary CTest names in IKV_BIN) on port 0 of 127.0.0.1: tu_serve_start
 *     waits (bounded) for the "listening on" banner and reads the port from it, tu_serve_stop
 *     sends SIGTERM and reaps it (SIGKILL after a bound). Children still running when the test
 *     process exits (a failed assertion skips the test's own cleanup only until the group
 *     teardown, which calls tu_serve_stop) are killed and reaped by an atexit hook;
 *   - the allocation-failure harness: tu_alloc_fail_each runs an attempt with the k-th
 *     allocation through the ikv_malloc seam failing, k = 0, 1, ..., until it succeeds, and
 *     asserts every failed run returned IKV_ENOMEM.
 *
 * Every function here is for tests only: failures of the test's own plumbing fail the test
 * (cmocka assertions) or return -1 where a group setup must report them.
 */
#ifndef IKV_TESTUTIL_H
#define IKV_TESTUTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Makes a fresh directory /tmp/ikv_test_<tag>_XXXXXX (mkdtemp) and writes its path to buf.
 * Returns 0, or -1 (buf too small, mkdtemp failed). */
int tu_tmpdir(char *buf, size_t n, const char *tag);

/* Removes path and everything below it (nftw, depth first, links not followed). A path that
 * does not exist (or an empty string) is 0. Returns 0, or -1 if something could not be
 * removed. */
int tu_rmtree(const char *path);

/* "dir/name" in one of 8 rotating static buffers (valid until 8 more calls). */
const char *tu_path(const char *dir, const char *name);

/* The isokv binary under test: $IKV_BIN (set by CTest), else build/isokv. */
const char *tu_bin(void);

/* 1 if an executable file `name` is in a directory of $PATH (what `command -v` answers, without
 * a shell). */
int tu_in_path(const char *name);

/* Starts argv[0] (execvp: a name without '/' is looked up in PATH) with argv, no shell;
 * stdout to out_path and stderr to err_path (created 0600 and truncated; NULL is /dev/null,
 * "-" leaves the stream as it is).
 * The child gets SIGKILL if this process dies, and is killed at exit if still registered.
 * Returns its pid, or -1 if fork failed (a failed exec is exit status 127). */
pid_t tu_spawn(const char *const *argv, const char *out_path, const char *err_path);

/* Waits at most secs for pid to exit. Returns its exit status, or -1 when it was killed by a
 * signal or did not exit in time (then it is killed with SIGKILL and reaped). */
int tu_wait(pid_t pid, double secs);

/* tu_spawn + tu_wait: the exit status of argv run to completion within secs, or -1. */
int tu_run(const char *const *argv, const char *out_path, const char *err_path, double secs);

/* tu_run of the isokv binary (tu_bin) with the NULL-terminated arguments args (at most 46). */
int tu_run_isokv(const char *const *args, const char *out_path, const char *err_path, double secs);

/* Runs the isokv binary with the words of line as its arguments, no shell: words are split at
 * spaces and tabs; '...' and "..." quote literally (no expansion of any kind, no escapes).
 * stdout goes to out (at most cap - 1 bytes, NUL-terminated), stderr to err (ecap) or, when
 * err is NULL and merge is set, after stdout into out; NULL out/err drop the stream. Fails the
 * test on an unterminated quote or more than 46 words. Returns the exit status, or -1 when the
 * program was killed or did not finish within secs. */
int tu_isokv_line(const char *line, char *out, size_t cap, char *err, size_t ecap, int merge,
                  double secs);

/* SIGKILL and reap (no-op for pid <= 0). */
void tu_kill(pid_t pid);

/* Kills and reaps every child tu_spawn or tu_serve_start started that is still running (also
 * done at exit). */
void tu_kill_all(void);

/* A loopback TCP port in 20000..29999 that can be bound right now and, when bus_offset > 0,
 * whose port + bus_offset can be bound too (redis cluster bus ports). -1 if none was found. */
int tu_free_port(int bus_offset);

/* Sleeps secs seconds. */
void tu_sleep(double secs);

/* An `isokv serve` child on 127.0.0.1. pid and port are 0 when it is not running; dir is the
 * caller's (tu_serve_start leaves it alone); banner holds what the server printed at start
 * (the "listening on" line and the configuration line after it). */
typedef struct tu_server {
    pid_t pid;
    int port;
    char dir[64];
    char banner[2048];
} tu_server;

/* Starts `$IKV_BIN serve --port 0 EXTRA...` (extra is NULL-terminated; may be NULL), its
 * stderr to /dev/null unless IKV_SERVE_LOG is set, and waits up to 60 s for the banner. Returns
 * 0 with sv->pid and sv->port set, or -1 (the child, if any, killed and reaped). */
int tu_serve_start(tu_server *sv, const char *const *extra);

/* SIGTERM (the server drains), then waits up to secs (then SIGKILL). Returns the exit status,
 * or -1 (not running, killed by a signal, or killed after the wait). */
int tu_serve_stop(tu_server *sv, double secs);

/* One HTTP/1.1 request to 127.0.0.1:port over a plain socket (Connection: close): method GET
 * when body is NULL, else POST with a JSON body; an `Authorization: Bearer key` header when key
 * is not NULL. Waits at most secs for each read. Returns the malloc'd response body (after the
 * headers; the caller frees it); a failed connect, write or a reply without headers fails the
 * test. */
char *tu_http_body(int port, const char *path, const char *key, const char *body, int secs);

/* The allocation-failure harness. Runs attempt(ctx) with ikv_alloc_fail_after(k) in force,
 * for k = 0, 1, ..., max - 1, resetting the seam after each run. A run that returns nonzero
 * must return IKV_ENOMEM (asserted) having freed what it made (ASan's leak check) and checked
 * that its outputs are untouched; the first run that returns 0 ends the loop and its k is
 * returned. That run may leave what it made in ctx: the caller checks and frees it after this
 * returns, with allocation working again. Fails the test when all max runs failed. */
size_t tu_alloc_fail_each(int (*attempt)(void *ctx), void *ctx, size_t max);

#endif
