/*
 * Shared test helpers: temporary directories, child processes without a shell, free loopback
 * ports, `isokv serve` children and the allocation-failure harness. See testutil.h for what
 * each gives; this file keeps one table of the children it started so that an atexit hook can
 * kill and reap whatever a failed test left running.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "isokv/base.h"
#include "testutil.h"

/* ---- temporary directories ---------------------------------------------------------------- */

int tu_tmpdir(char *buf, size_t n, const char *tag) {
    int k = snprintf(buf, n, "/tmp/ikv_test_%s_XXXXXX", tag);
    if (k < 0 || (size_t)k >= n) return -1;
    return mkdtemp(buf) ? 0 : -1;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int tu_rmtree(const char *path) {
    if (!path || !*path) return 0;
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

const char *tu_path(const char *dir, const char *name) {
    static char buf[8][1024];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

const char *tu_bin(void) {
    const char *b = getenv("IKV_BIN");
    return b && *b ? b : "build/isokv";
}

int tu_in_path(const char *name) {
    const char *path = getenv("PATH");
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        char f[4096];
        if (n && snprintf(f, sizeof f, "%.*s/%s", (int)n, path, name) < (int)sizeof f &&
            access(f, X_OK) == 0)
            return 1;
        path = end ? end + 1 : NULL;
    }
    return 0;
}

/* ---- children ----------------------------------------------------------------------------- */

#define TU_MAX_CHILDREN 64
static pid_t children[TU_MAX_CHILDREN];
static int atexit_set;

static void remember(pid_t pid) {
    if (!atexit_set) atexit(tu_kill_all), atexit_set = 1;
    for (int i = 0; i < TU_MAX_CHILDREN; i++)
        if (children[i] <= 0) {
            children[i] = pid;
            return;
        }
}

static void forget(pid_t pid) {
    for (int i = 0; i < TU_MAX_CHILDREN; i++)
        if (children[i] == pid) children[i] = 0;
}

/* Opens path for the child's fd (NULL: /dev/null; "-": left as it is) and puts it there; 0 or
 * -1. */
static int redirect(int fd, const char *path) {
    if (path && !strcmp(path, "-")) return 0;
    int o = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600) : open("/dev/null", O_WRONLY);
    if (o < 0) return -1;
    if (o != fd) dup2(o, fd), close(o);
    return 0;
}

/* fork + execvp with stdout to out_fd when out_fd >= 0 (else out_path) and stderr to
 * err_path; the parent's end of a pipe (close_fd) is closed in the child. */
static pid_t spawn(const char *const *argv, int out_fd, int close_fd, const char *out_path,
                   const char *err_path) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (close_fd >= 0) close(close_fd);
        if (out_fd >= 0) {
            dup2(out_fd, 1);
            if (out_fd != 1) close(out_fd);
        } else if (redirect(1, out_path)) {
            _exit(126);
        }
        if (redirect(2, err_path)) _exit(126);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    remember(pid);
    return pid;
}

pid_t tu_spawn(const char *const *argv, const char *out_path, const char *err_path) {
    return spawn(argv, -1, -1, out_path, err_path);
}

void tu_sleep(double secs) {
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Seconds on the monotonic clock. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tu_wait(pid_t pid, double secs) {
    if (pid <= 0) return -1;
    int st = 0;
    const double deadline = now_s() + secs;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            forget(pid);
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        if (r < 0) {
            forget(pid);
            return -1;
        }
        if (now_s() >= deadline) break;
        tu_sleep(0.01);
    }
    tu_kill(pid);
    return -1;
}

int tu_run(const char *const *argv, const char *out_path, const char *err_path, double secs) {
    return tu_wait(tu_spawn(argv, out_path, err_path), secs);
}

int tu_run_isokv(const char *const *args, const char *out_path, const char *err_path, double secs) {
    const char *argv[48] = {tu_bin()};
    int n = 1;
    for (; args[n - 1] && n < 47; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    return tu_run(argv, out_path, err_path, secs);
}

/* Reads at most cap - 1 bytes of path into buf at offset *n (advanced), keeping it NUL-terminated.
 */
static void slurp_into(const char *path, char *buf, size_t cap, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    *n += fread(buf + *n, 1, cap - 1 - *n, f);
    buf[*n] = 0;
    fclose(f);
}

int tu_isokv_line(const char *line, char *out, size_t cap, char *err, size_t ecap, int merge,
                  double secs) {
    static char words[8192];
    const char *args[47];
    size_t nw = 0, w = 0;
    assert_true(strlen(line) < sizeof words);
    for (const char *p = line; *p;) {
        if (*p == ' ' || *p == '\t') {
            p++;
            continue;
        }
        assert_true(nw < 46);
        args[nw++] = words + w;
        while (*p && *p != ' ' && *p != '\t') {
            if (*p == '\'' || *p == '"') {
                const char *e = strchr(p + 1, *p);
                if (!e) fail_msg("unterminated %c in: %s", *p, line);
                memcpy(words + w, p + 1, (size_t)(e - p - 1));
                w += (size_t)(e - p - 1);
                p = e + 1;
            } else {
                words[w++] = *p++;
            }
        }
        words[w++] = 0;
    }
    args[nw] = NULL;
    char dir[64];
    assert_int_equal(tu_tmpdir(dir, sizeof dir, "run"), 0);
    char of[128], ef[128];
    snprintf(of, sizeof of, "%s/out", dir);
    snprintf(ef, sizeof ef, "%s/err", dir);
    int st = tu_run_isokv(args, of, ef, secs);
    size_t n = 0;
    if (out && cap) {
        slurp_into(of, out, cap, &n);
        if (!err && merge) slurp_into(ef, out, cap, &n);
    }
    size_t k = 0;
    if (err && ecap) slurp_into(ef, err, ecap, &k);
    assert_int_equal(tu_rmtree(dir), 0);
    return st;
}

void tu_kill(pid_t pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    forget(pid);
}

void tu_kill_all(void) {
    for (int i = 0; i < TU_MAX_CHILDREN; i++)
        if (children[i] > 0) tu_kill(children[i]);
}

/* ---- ports -------------------------------------------------------------------------------- */

/* 1 if a loopback TCP port can be bound right now. */
static int port_free(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

int tu_free_port(int bus_offset) {
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() * 2654435761u;
    for (int i = 0; i < 1000; i++) {
        seed = seed * 1103515245u + 12345u;
        int port = 20000 + (int)((seed >> 8) % 10000);
        if (port_free(port) && (bus_offset <= 0 || port_free(port + bus_offset))) return port;
    }
    return -1;
}

/* ---- isokv serve -------------------------------------------------------------------------- */

#define LISTENING "listening on http://127.0.0.1:"

int tu_serve_start(tu_server *sv, const char *const *extra) {
    const char *argv[48];
    int n = 0;
    argv[n++] = tu_bin(), argv[n++] = "serve", argv[n++] = "--port", argv[n++] = "0";
    for (int i = 0; extra && extra[i] && n < 47; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    sv->pid = 0, sv->port = 0, sv->banner[0] = 0;
    int pfd[2];
    if (pipe(pfd)) return -1;
    pid_t pid = spawn(argv, pfd[1], pfd[0], NULL, getenv("IKV_SERVE_LOG") ? "-" : NULL);
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        return -1;
    }
    size_t len = 0;
    int port = 0;
    for (int waited = 0; waited < 600 && !port; waited++) { /* at most 60 s */
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t k = read(pfd[0], sv->banner + len, sizeof sv->banner - 1 - len);
        if (k <= 0) break; /* the server exited (or closed stdout) before it listened */
        len += (size_t)k;
        sv->banner[len] = 0;
        char *at = strstr(sv->banner, LISTENING);
        char *eol = at ? strchr(at, '\n') : NULL;
        /* the banner is the listening line and the configuration line after it */
        if (eol && (strchr(eol + 1, '\n') || len == sizeof sv->banner - 1))
            port = atoi(at + strlen(LISTENING));
    }
    close(pfd[0]); /* the server's later stdout writes go nowhere: it prints only at start */
    if (!port) {
        tu_kill(pid);
        return -1;
    }
    sv->pid = pid, sv->port = port;
    return 0;
}

int tu_serve_stop(tu_server *sv, double secs) {
    if (sv->pid <= 0) return -1;
    kill(sv->pid, SIGTERM);
    int rc = tu_wait(sv->pid, secs);
    sv->pid = 0, sv->port = 0;
    return rc;
}

/* ---- allocation failures ------------------------------------------------------------------ */

size_t tu_alloc_fail_each(int (*attempt)(void *ctx), void *ctx, size_t max) {
    for (size_t k = 0; k < max; k++) {
        ikv_alloc_fail_after(k);
        int rc = attempt(ctx);
        ikv_alloc_fail_after(SIZE_MAX);
        if (rc == 0) return k;
        if (rc != IKV_ENOMEM)
            fail_msg("allocation %zu failing: %d (%s), expected IKV_ENOMEM", k, rc,
                     ikv_strerror(rc));
    }
    fail_msg("still failing with %zu allocations allowed", max);
    return max;
}

char *tu_http_body(int port, const char *path, const char *key, const char *body, int secs) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {secs, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char head[512], auth[160] = "";
    if (key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      body ? "POST" : "GET", path, auth, body ? strlen(body) : 0);
    assert_true(hn > 0 && (size_t)hn < sizeof head);
    assert_int_equal(write(fd, head, (size_t)hn), hn);
    if (body) assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (n + 4096 > cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    char *b = strstr(buf, "\r\n\r\n");
    assert_non_null(b);
    char *out = strdup(b + 4);
    free(buf);
    assert_non_null(out);
    return out;
}
