/*
 * bench_store: put and get throughput (GB/s) and latency per block of every store backend,
 * for runs of 1, 16 and 256 blocks, next to the engine's measured recompute rate for the same
 * tokens and the break-even (how many cached tokens must be loaded before loading beats
 * recomputing), for the bundled real model (stories260K) and the `small` and `base` shapes.
 *
 *     bench_store [--models stories260K,small,base] [--mb 128] [--repeat 3] [--no-redis]
 *                 [--dir /tmp]
 *
 * Baselines measured here: memcpy of the same blocks, slot to slot (mem's target: get within
 * 2x), and the file's own sequential read rate (4 MiB preads over the slot bodies just written,
 * into the buffer the gets wrote, so in the same page-cache and memory state; file's target:
 * >= 70%). Redis is a redis-server child on a
 * free loopback port (killed at exit); its target is >= 300 MB/s with pipelining. Every figure
 * is the best of --repeat runs (the machine may be shared). Recompute: the engine's no-cache
 * prefill of a 512-token prompt (1 thread), best of --repeat; a block's recompute time is its
 * 16 tokens' share at that context. Break-even: loading n tokens in one run costs a + n b
 * (a, b fitted from the runs of 1 and 256 blocks), recomputing them n c; loading wins from
 * n* = a / (c - b) tokens on (never if c <= b); the rows of 16 and 256 give the ratio of a
 * block's load time to its recompute time instead.
 */
#include "isokv/model.h"
#include "isokv/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
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

static pid_t redis_pid;

static void stop_redis(void) {
    if (redis_pid > 0) {
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
        redis_pid = 0;
    }
}

/* Starts redis-server on a free loopback port; returns the port or -1. */
static int start_redis(void) {
    int port = -1;
    for (int i = 0; i < 100 && port < 0; i++) {
        int p = 20000 + (int)((unsigned)(getpid() * 7919 + i * 104729) % 10000);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a)) port = p;
        if (fd >= 0) close(fd);
    }
    if (port < 0) return -1;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0) dup2(dn, 1), dup2(dn, 2);
        const char *argv[] = {"redis-server", "--port",      ps,   "--bind",
                              "127.0.0.1",    "--save",      "",   "--appendonly",
                              "no",           "--daemonize", "no", NULL};
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    redis_pid = pid;
    atexit(stop_redis);
    /* wait until it accepts connections */
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof a);
        if (fd >= 0) close(fd);
        if (ok) return port;
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

typedef struct geom {
    const char *name;
    ikv_model *m;
    size_t payload, slot;
    double recompute_s_per_tok; /* at a 512-token context */
} geom;

/* Best-of-repeat no-cache prefill of a 512-token prompt: seconds per token. */
static double measure_recompute(ikv_model *m, int repeat) {
    ikv_engine_options o;
    ikv_engine_options_default(&o);
    o.threads = 1;
    ikv_engine *e;
    if (ikv_engine_create(m, &o, &e)) return 0;
    const ikv_model_config *c = ikv_model_cfg(m);
    size_t n = c->seq_len < 512 ? (size_t)c->seq_len : 512;
    uint32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = 3 + (uint32_t)((i * 2654435761u) % (uint32_t)(c->vocab_size - 3));
    double best = 1e30;
    for (int r = 0; r < repeat; r++) {
        ikv_request rq = {.tokens = t, .n = n, .no_cache = 1};
        ikv_seq *s;
        ikv_prefill_info inf;
        if (ikv_engine_begin(e, &rq, &s, &inf)) break;
        ikv_engine_end(e, s);
        if (inf.seconds < best) best = inf.seconds;
    }
    free(t);
    ikv_engine_destroy(e);
    return best / (double)n;
}

typedef struct result {
    double put_gbs, get_gbs, get_us_block, put_us_block;
} result;

/* Puts and gets nblk blocks in runs of R (best of repeat). */
static int measure(ikv_store *s, const geom *g, size_t nblk, size_t R, int repeat, uint8_t *src,
                   uint8_t *dst, uint64_t salt, result *out) {
    void **sp = malloc(R * sizeof *sp), **dp = malloc(R * sizeof *dp);
    ikv_block_want *w = malloc(R * sizeof *w);
    size_t *lens = malloc(R * sizeof *lens);
    int *rcs = malloc(R * sizeof *rcs);
    double bp = 1e30, bg = 1e30;
    int ok = 1;
    size_t misses = 0;
    for (int rep = 0; rep < repeat && ok; rep++) {
        double t0 = ikv_now();
        for (size_t i0 = 0; i0 < nblk; i0 += R) {
            size_t k = nblk - i0 < R ? nblk - i0 : R;
            for (size_t j = 0; j < k; j++) {
                uint8_t *b = src + (i0 + j) * g->slot;
                ikv_blob_desc d = {.key = {.lo = i0 + j + 1, .hi = salt},
                                   .scope = salt,
                                   .ntok = 16,
                                   .payload_bytes = (uint32_t)g->payload};
                (void)ikv_blob_init(b, &d, NULL); /* header only: tokens and payload as filled */
                sp[j] = b;
            }
            if (ikv_store_put_run(s, sp, k, rcs) != k) ok = 0;
        }
        double t1 = ikv_now();
        for (size_t i0 = 0; i0 < nblk; i0 += R) {
            size_t k = nblk - i0 < R ? nblk - i0 : R;
            for (size_t j = 0; j < k; j++) {
                w[j] = (ikv_block_want){.key = {.lo = i0 + j + 1, .hi = salt}, .scope = salt};
                dp[j] = dst + (i0 + j) * g->slot;
            }
            misses += k - ikv_store_get_run(s, w, k, dp, g->slot, lens, rcs);
        }
        double t2 = ikv_now();
        if (t1 - t0 < bp) bp = t1 - t0;
        if (t2 - t1 < bg) bg = t2 - t1;
    }
    double bytes = (double)nblk * (double)g->slot;
    out->put_gbs = bytes / bp / 1e9;
    out->get_gbs = bytes / bg / 1e9;
    out->put_us_block = bp / (double)nblk * 1e6;
    out->get_us_block = bg / (double)nblk * 1e6;
    free(sp), free(dp), free(w), free(lens), free(rcs);
    if (misses)
        fprintf(stderr, "bench_store: %zu of %zu gets missed (a full set evicted them)\n", misses,
                nblk * (size_t)repeat);
    return ok ? 0 : -1;
}

/* Sequential read rate of the file's slot bodies (4 MiB preads into dst, the buffer the gets
 * filled, so both write the same memory), best of repeat. */
static double seq_read_gbs(const char *path, size_t bytes, int repeat, uint8_t *dst) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    size_t chunk = 4u << 20;
    double best = 1e30;
    for (int r = 0; r < repeat; r++) {
        double t0 = ikv_now();
        size_t done = 0;
        while (done < bytes) {
            size_t k = bytes - done < chunk ? bytes - done : chunk;
            ssize_t got = pread(fd, dst + done, k, (off_t)(8192 + done));
            if (got <= 0) break;
            done += (size_t)got;
        }
        double dt = ikv_now() - t0;
        if (dt < best) best = dt;
    }
    close(fd);
    return (double)bytes / best / 1e9;
}

/* memcpy of the same blocks, one call per block slot to slot (the copies a get makes). */
static double memcpy_gbs(uint8_t *dst, const uint8_t *src, size_t nblk, size_t slot, int repeat) {
    double best = 1e30;
    for (int r = 0; r < repeat; r++) {
        double t0 = ikv_now();
        for (size_t i = 0; i < nblk; i++)
            memcpy(dst + i * slot, src + i * slot, slot);
        double dt = ikv_now() - t0;
        if (dt < best) best = dt;
    }
    return (double)nblk * (double)slot / best / 1e9;
}

#define USAGE                                                                                      \
    "usage: bench_store [--models stories260K,small,base] [--mb 128] [--repeat 3] [--no-redis]\n"  \
    "                   [--dir /tmp]\n"

int main(int argc, char **argv) {
    const char *models = "stories260K,small,base", *dir = "/tmp";
    size_t mb = 128;
    int repeat = 3, redis = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s", USAGE);
            return 0;
        }
        if (!strcmp(a, "--no-redis")) {
            redis = 0;
            continue;
        }
        if (strcmp(a, "--models") && strcmp(a, "--dir") && strcmp(a, "--mb") &&
            strcmp(a, "--repeat")) {
            fprintf(stderr, "bench_store: unknown option '%s'\n%s", a, USAGE);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "bench_store: option '%s' needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--models"))
            models = v;
        else if (!strcmp(a, "--dir"))
            dir = v;
        else if (!strcmp(a, "--mb"))
            mb = (size_t)atol(v);
        else if (!strcmp(a, "--repeat"))
            repeat = atoi(v);
        else {
            fprintf(stderr, "bench_store: unknown option '%s'\n%s", a, USAGE);
            return 2;
        }
        i++;
    }
    if (mb == 0 || mb > 4096 || repeat < 1 || repeat > 100) {
        fprintf(stderr, "bench_store: --mb wants 1..4096, --repeat 1..100\n");
        return 2;
    }
    int port = redis ? start_redis() : -1;
    if (redis && port < 0) fprintf(stderr, "bench_store: no redis-server: Redis rows skipped\n");
    printf("bench_store: measured on this machine (%ld cores), best of %d; %zu MiB of blocks "
           "per backend and model; blocks of 16 tokens, fp32 K and V\n",
           sysconf(_SC_NPROCESSORS_ONLN), repeat, mb);
    char list[256];
    snprintf(list, sizeof list, "%s", models);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        geom g = {.name = name};
        if (!strcmp(name, "stories260K")) {
            const char *src = getenv("IKV_SOURCE_DIR");
            char path[600];
            snprintf(path, sizeof path, "%s/data/models/stories260K/stories260K.bin",
                     src ? src : ".");
            if (ikv_model_load(path, &g.m)) {
                fprintf(stderr, "bench_store: %s\n", ikv_errdetail());
                continue;
            }
        } else {
            ikv_model_config c;
            if (ikv_model_config_named(name, &c) || ikv_model_random(&c, 1, &g.m)) {
                fprintf(stderr, "bench_store: %s\n", ikv_errdetail());
                continue;
            }
        }
        ikv_engine_options eo;
        ikv_engine_options_default(&eo);
        ikv_store_params p;
        ikv_engine_store_params(g.m, &eo, &p);
        p.timeout_s = 2;
        g.slot = p.slot_bytes;
        g.payload = g.slot - ikv_blob_bytes(16, 0);
        g.recompute_s_per_tok = measure_recompute(g.m, repeat);
        size_t nblk = mb * 1048576 / g.slot;
        if (nblk < 256) nblk = 256;
        uint8_t *src = malloc(nblk * g.slot), *dst = malloc(nblk * g.slot);
        for (size_t i = 0; i < nblk * g.slot; i++)
            src[i] = (uint8_t)(i * 131 + 7);
        memset(dst, 0, nblk * g.slot);
        double mc = memcpy_gbs(dst, src, nblk, g.slot, repeat);
        double blk_tok_us = g.recompute_s_per_tok * 1e6;
        printf("\nmodel %s: block %zu bytes (%zu KV + header and token ids); recompute %.1f "
               "us/token = %.1f us/block at a 512-token context (engine prefill, 1 thread, "
               "measured); memcpy of the same blocks %.2f GB/s\n",
               name, g.slot, g.payload, blk_tok_us, blk_tok_us * 16, mc);
        printf("  %-26s %4s %9s %9s %11s %11s %12s\n", "backend", "run", "put GB/s", "get GB/s",
               "put us/blk", "get us/blk", "break-even / load:recompute");
        char specs[3][700];
        size_t nb = 0;
        char fpath[600];
        snprintf(fpath, sizeof fpath, "%s/bench_store_%d.store", dir, (int)getpid());
        unlink(fpath);
        snprintf(specs[nb++], sizeof specs[0], "mem:%zu", (nblk + 64) * g.slot * 4);
        snprintf(specs[nb++], sizeof specs[0], "file:%s:%zu", fpath, (nblk + 64) * g.slot * 4);
        if (port > 0)
            snprintf(specs[nb++], sizeof specs[0], "redis://127.0.0.1:%d:%zu", port,
                     (nblk + 64) * g.slot * 4);
        for (size_t b = 0; b < nb; b++) {
            ikv_store *s;
            if (ikv_store_open(specs[b], &p, &s)) {
                fprintf(stderr, "bench_store: %s\n", ikv_errdetail());
                continue;
            }
            result res[3];
            size_t runs[3] = {1, 16, 256};
            for (int r = 0; r < 3; r++)
                if (measure(s, &g, nblk, runs[r], repeat, src, dst, 100, &res[r]))
                    fprintf(stderr, "bench_store: %s: some puts failed\n", specs[b]);
            /* fit get time per run: a + R * blk from the runs of 1 and 256 */
            double t1 = res[0].get_us_block, t256 = res[2].get_us_block * 256;
            double per_blk = (t256 - t1) / 255, a = t1 - per_blk;
            if (a < 0) a = 0;
            double per_tok = per_blk / 16, c = blk_tok_us;
            for (int r = 0; r < 3; r++) {
                char be[32];
                if (r == 0) {
                    double nstar = c > per_tok ? a / (c - per_tok) : -1;
                    if (nstar < 0)
                        snprintf(be, sizeof be, "never");
                    else if (nstar <= 16)
                        snprintf(be, sizeof be, "<= 16 tokens");
                    else
                        snprintf(be, sizeof be, "%.0f tokens", nstar);
                } else {
                    snprintf(be, sizeof be, "%.3fx", res[r].get_us_block / (16 * c));
                }
                const char *label = b == 0   ? "mem"
                                    : b == 1 ? "file (page cache)"
                                             : "redis loopback";
                printf("  %-26s %4zu %9.2f %9.2f %11.1f %11.1f %12s\n", r == 0 ? label : "",
                       runs[r], res[r].put_gbs, res[r].get_gbs, res[r].put_us_block,
                       res[r].get_us_block, be);
            }
            if (b == 0)
                printf("  %-26s mem get (run of 256) / memcpy = %.2f (target >= 0.5)\n", "",
                       res[2].get_gbs / mc);
            if (b == 1) {
                double sq = seq_read_gbs(fpath, nblk * (g.slot - 64), repeat, dst);
                printf("  %-26s sequential read of the file %.2f GB/s; get (run of 256) / "
                       "sequential = %.2f (target >= 0.7)\n",
                       "", sq, res[2].get_gbs / sq);
            }
            if (b == 2)
                printf("  %-26s redis get (run of 256) %.0f MB/s (target >= 300)\n", "",
                       res[2].get_gbs * 1e3);
            ikv_store_close(s);
        }
        unlink(fpath);
        free(src), free(dst);
        ikv_model_destroy(g.m);
    }
    stop_redis();
    return 0;
}
