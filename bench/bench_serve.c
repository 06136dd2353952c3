/*
 * bench_serve: throughput and latency of `isokv serve` over loopback HTTP, measured.
 *
 *     bench_serve --bin build/isokv [--config small | --model M.bin --tokenizer T.bin]
 *                 [--streams 1,4,16,64] [--requests 4] [--prompt 64] [--prefix 0]
 *                 [--max-tokens 64] [--threads 2] [--url http://127.0.0.1:PORT]
 *                 [--classes 1] [--max-seqs N]
 *
 * Starts the server (on a free loopback port, stopped at the end; or, with --url, uses an already
 * running OpenAI-compatible server on loopback, e.g. llama.cpp's llama-server), then for each
 * stream count N runs N client threads, each sending --requests streaming completions one after
 * another: prompts of --prompt token ids (the load-generator form), the first --prefix of them
 * the same in every request and declared public (isokv.public_prefix_tokens), the rest random
 * per request; greedy, exactly --max-tokens (ignore_eos). Prints per N: requests/s, aggregate
 * output tokens/s (usage completion tokens over the wall time of the round), TTFT p50 / p99
 * (request sent to first byte of the stream), and the cached prompt tokens the server reported.
 * --config NAME writes a random-weight model of that shape (and a synthetic tokenizer) under /tmp
 * first. All figures are wall-clock measurements on this machine (core count printed).
 * --classes 1: request r of client k has class (k + r) % 3 (simple, medium, complex, as
 * isokv.class) and a table per class follows each round: the router's step, requests, mean and
 * p99 end-to-end latency (client side), mean CPU ms (usage.isokv.cpu_ms: the CPU of the
 * scheduler thread and the engine's workers over the forward steps, shared by positions), mean
 * thread-ms (usage.isokv.route.thread_ms: wall x threads, shared likewise) and the most threads
 * its steps ran on (route.threads_used). --max-seqs caps the server's running sequences
 * (default max(4, streams)), so the routing priority decides who is admitted.
 */
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "isokv/model.h"

typedef struct job {
    int port, requests, prompt, prefix, max_tokens, id;
    uint32_t vocab;
    double *ttft; /* [requests] */
    long tokens, cached;
    int failed;
    int classes;
    double *e2e;     /* [requests] */
    int *cls, *step; /* [requests] */
    double *cpu_ms;  /* [requests] */
    double *thr_ms;  /* [requests] usage.isokv.route.thread_ms */
    int *thr_used;   /* [requests] usage.isokv.route.threads_used */
} job;

static const char *const class_names[3] = {"simple", "medium", "complex"};

/* The last number after `key` in s as a double, or -1. */
static double last_dbl(const char *s, const char *key) {
    double v = -1;
    for (const char *p = s; (p = strstr(p, key)); p += strlen(key))
        v = atof(p + strlen(key));
    return v;
}

typedef struct rbuf {
    char *p;
    size_t n;
    double t0, tfirst;
} rbuf;

static size_t on_body(char *p, size_t sz, size_t nm, void *u) {
    rbuf *b = u;
    size_t k = sz * nm;
    if (b->tfirst == 0) b->tfirst = ikv_now();
    b->p = realloc(b->p, b->n + k + 1);
    memcpy(b->p + b->n, p, k);
    b->n += k;
    b->p[b->n] = 0;
    return k;
}

/* The last number after `key` in s (the usage chunk comes last), or -1. */
static long last_num(const char *s, const char *key) {
    long v = -1;
    for (const char *p = s; (p = strstr(p, key)); p += strlen(key))
        v = atol(p + strlen(key));
    return v;
}

static void *client(void *arg) {
    job *j = arg;
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", j->port);
    struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
    char *body = malloc((size_t)j->prompt * 8 + 512);
    uint64_t z = 0x9e3779b97f4a7c15ull * (uint64_t)(j->id + 1);
    for (int r = 0; r < j->requests; r++) {
        size_t n = (size_t)sprintf(body, "{\"prompt\":[1");
        for (int i = 1; i < j->prompt; i++) {
            uint32_t t;
            if (i < j->prefix) {
                t = 3 + (uint32_t)((i * 2654435761u) % (j->vocab - 3));
            } else {
                z ^= z << 13, z ^= z >> 7, z ^= z << 17;
                t = 3 + (uint32_t)(z % (j->vocab - 3));
            }
            n += (size_t)sprintf(body + n, ",%u", t);
        }
        int cls = (j->id + r) % 3;
        char extra[64] = "";
        if (j->classes) snprintf(extra, sizeof extra, ",\"class\":\"%s\"", class_names[cls]);
        sprintf(body + n,
                "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                "\"stream_options\":"
                "{\"include_usage\":true},\"isokv\":{\"public_prefix_tokens\":%d%s}}",
                j->max_tokens, j->prefix, extra);
        rbuf b = {0};
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
        b.t0 = ikv_now();
        long status = 0;
        if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (status != 200 || !b.p || !strstr(b.p, "[DONE]")) {
            j->failed++;
        } else {
            j->ttft[r] = b.tfirst - b.t0;
            long ct = last_num(b.p, "\"completion_tokens\":"),
                 ca = last_num(b.p, "\"cached_tokens\":"); /* -1: not reported (llama-server) */
            j->tokens += ct > 0 ? ct : 0;
            j->cached += ca > 0 ? ca : 0;
            j->e2e[r] = ikv_now() - b.t0;
            j->cls[r] = cls;
            j->step[r] = (int)last_num(b.p, "\"step\":");
            j->cpu_ms[r] = last_dbl(b.p, "\"cpu_ms\":");
            j->thr_ms[r] = last_dbl(b.p, "\"thread_ms\":");
            j->thr_used[r] = (int)last_num(b.p, "\"threads_used\":");
        }
        free(b.p);
    }
    free(body);
    curl_slist_free_all(hs);
    curl_easy_cleanup(c);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The per-class table of a round (--classes). */
static void class_table(const job *jobs, int N, int requests) {
    printf("  %-8s %5s %8s %12s %12s %12s %12s %8s\n", "class", "step", "requests", "e2e mean",
           "e2e p99", "cpu/request", "thread-ms/r", "threads");
    for (int c = 0; c < 3; c++) {
        double *e = calloc((size_t)N * (size_t)requests, sizeof *e), cpu = 0, sum = 0, thr = 0;
        size_t n = 0;
        int step = -1, tmax = 0;
        for (int k = 0; k < N; k++)
            for (int r = 0; r < requests; r++)
                if (jobs[k].cls[r] == c && jobs[k].e2e[r] > 0) {
                    e[n++] = jobs[k].e2e[r], sum += jobs[k].e2e[r], cpu += jobs[k].cpu_ms[r];
                    thr += jobs[k].thr_ms[r] > 0 ? jobs[k].thr_ms[r] : 0;
                    if (jobs[k].thr_used[r] > tmax) tmax = jobs[k].thr_used[r];
                    step = jobs[k].step[r];
                }
        if (n) {
            qsort(e, n, sizeof *e, cmp_d);
            printf("  %-8s %5d %8zu %10.2fms %10.2fms %10.3fms %10.3fms %8d\n", class_names[c],
                   step, n, sum / (double)n * 1e3,
                   e[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] * 1e3, cpu / (double)n,
                   thr / (double)n, tmax);
        }
        free(e);
    }
}

static pid_t start_server(const char *bin, const char *model, const char *tok, int threads,
                          int max_seqs, int *port) {
    int pfd[2];
    if (pipe(pfd)) return -1;
    char th[16], ms[16];
    snprintf(th, sizeof th, "%d", threads);
    snprintf(ms, sizeof ms, "%d", max_seqs);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], 1);
        FILE *null = fopen("/dev/null", "w");
        if (null) dup2(fileno(null), 2);
        execl(bin, bin, "serve", "--port", "0", "--model", model, "--tokenizer", tok, "--threads",
              th, "--max-seqs", ms, "--max-queue", "256", "--kv-mem", "1G", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char buf[4096];
    size_t len = 0;
    *port = 0;
    while (!*port) {
        ssize_t k = read(pfd[0], buf + len, sizeof buf - 1 - len);
        if (k <= 0) break;
        len += (size_t)k;
        buf[len] = 0;
        char *at = strstr(buf, "127.0.0.1:");
        if (at && strchr(at, '\n')) *port = atoi(at + 10);
    }
    char *nl = strchr(buf, '\n');
    if (nl) fprintf(stderr, "server: %s", nl + 1);
    close(pfd[0]);
    return *port ? pid : -1;
}

/* The port of a loopback URL http://127.0.0.1:PORT or http://localhost:PORT (an optional
 * trailing '/' or "/v1"), or -1 for any other form or host: bench_serve talks to loopback only. */
static int loopback_port(const char *url) {
    const char *p;
    if (!strncmp(url, "http://127.0.0.1:", 17))
        p = url + 17;
    else if (!strncmp(url, "http://localhost:", 17))
        p = url + 17;
    else
        return -1;
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 1 || v > 65535) return -1;
    if (*end && strcmp(end, "/") && strcmp(end, "/v1") && strcmp(end, "/v1/")) return -1;
    return (int)v;
}

#define USAGE                                                                                      \
    "usage: bench_serve [--bin build/isokv] [--config small | --model M.bin --tokenizer T.bin]\n"  \
    "                   [--streams 1,4,16,64] [--requests 4] [--prompt 64] [--prefix 0]\n"         \
    "                   [--max-tokens 64] [--threads 2] [--url http://127.0.0.1:PORT]\n"           \
    "                   [--classes 1] [--max-seqs N]\n"

int main(int argc, char **argv) {
    const char *bin = "build/isokv", *model = NULL, *tok = NULL, *config = NULL,
               *streams = "1,4,16,64";
    int requests = 4, prompt = 64, prefix = 0, max_tokens = 64, threads = 2, port = 0;
    int classes = 0, max_seqs = 0;
    const char *url = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s", USAGE);
            return 0;
        }
        static const char *const valued[] = {
            "--bin",    "--model",  "--tokenizer",  "--config",  "--streams", "--requests",
            "--prompt", "--prefix", "--max-tokens", "--threads", "--classes", "--max-seqs",
            "--url",    NULL};
        int known = 0;
        for (int k = 0; valued[k]; k++)
            known |= !strcmp(a, valued[k]);
        if (!known) {
            fprintf(stderr, "bench_serve: unknown option '%s'\n%s", a, USAGE);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_serve: option '%s' needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--bin"))
            bin = v;
        else if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--tokenizer"))
            tok = v;
        else if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--streams"))
            streams = v;
        else if (!strcmp(a, "--requests"))
            requests = atoi(v);
        else if (!strcmp(a, "--prompt"))
            prompt = atoi(v);
        else if (!strcmp(a, "--prefix"))
            prefix = atoi(v);
        else if (!strcmp(a, "--max-tokens"))
            max_tokens = atoi(v);
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "--classes"))
            classes = atoi(v);
        else if (!strcmp(a, "--max-seqs"))
            max_seqs = atoi(v);
        else if (!strcmp(a, "--url"))
            url = v;
        else {
            fprintf(stderr, "bench_serve: unknown option '%s'\n%s", a, USAGE);
            return 2;
        }
    }
    int url_port = 0;
    if (url && (url_port = loopback_port(url)) <= 0) {
        fprintf(stderr,
                "bench_serve: --url '%s': want http://127.0.0.1:PORT or http://localhost:PORT "
                "(loopback only)\n",
                url);
        return 2;
    }
    if (requests < 1 || prompt < 2 || prefix < 0 || prefix >= prompt || max_tokens < 1) {
        fprintf(stderr, "bench_serve: bad sizes\n");
        return 2;
    }
    char mpath[128], tpath[128];
    if (config) {
        ikv_model_config cfg;
        if (ikv_model_config_named(config, &cfg)) {
            fprintf(stderr, "bench_serve: unknown config %s\n", config);
            return 2;
        }
        snprintf(mpath, sizeof mpath, "/tmp/bench_serve_%s.bin", config);
        snprintf(tpath, sizeof tpath, "/tmp/bench_serve_%s_tok.bin", config);
        if (ikv_model_write_random(mpath, &cfg, 1) ||
            ikv_tokenizer_write_synthetic(tpath, (uint32_t)cfg.vocab_size, 1)) {
            fprintf(stderr, "bench_serve: %s\n", ikv_errdetail());
            return 1;
        }
        model = mpath, tok = tpath;
    }
    if (!model) model = "data/models/stories260K/stories260K.bin";
    if (!tok) tok = "data/models/stories260K/tok512.bin";
    ikv_model *m;
    if (ikv_model_load(model, &m)) {
        fprintf(stderr, "bench_serve: %s\n", ikv_errdetail());
        return 1;
    }
    uint32_t vocab = (uint32_t)ikv_model_cfg(m)->vocab_size;
    ikv_model_destroy(m);
    curl_global_init(CURL_GLOBAL_ALL);
    if (url) printf("bench_serve: server %s (already running; --bin, --threads unused)\n", url);
    printf("bench_serve: %s, prompt %d tokens (shared public prefix %d), %d output tokens, %d "
           "requests per stream, server --threads %d; %ld cores; measured over loopback\n",
           model, prompt, prefix, max_tokens, requests, threads, sysconf(_SC_NPROCESSORS_ONLN));
    printf("%8s %10s %12s %10s %10s %10s\n", "streams", "req/s", "out tok/s", "ttft p50",
           "ttft p99", "cached");
    char list[64];
    snprintf(list, sizeof list, "%s", streams);
    for (char *sv = strtok(list, ","); sv; sv = strtok(NULL, ",")) {
        int N = atoi(sv);
        if (N < 1) continue;
        pid_t pid = 0;
        if (url_port)
            port = url_port;
        else
            pid = start_server(bin, model, tok, threads, max_seqs > 0 ? max_seqs : (N < 4 ? 4 : N),
                               &port);
        if (pid < 0) {
            fprintf(stderr, "bench_serve: cannot start %s\n", bin);
            return 1;
        }
        job *jobs = calloc((size_t)N, sizeof *jobs);
        pthread_t *th = calloc((size_t)N, sizeof *th);
        size_t nreq = (size_t)N * (size_t)requests;
        double *ttft = calloc(nreq, sizeof *ttft), *e2e = calloc(nreq, sizeof *e2e),
               *cpu = calloc(nreq, sizeof *cpu), *thr = calloc(nreq, sizeof *thr);
        int *cls = calloc(nreq, sizeof *cls), *step = calloc(nreq, sizeof *step),
            *thru = calloc(nreq, sizeof *thru);
        double t0 = ikv_now();
        for (int k = 0; k < N; k++) {
            jobs[k] = (job){.port = port,
                            .requests = requests,
                            .prompt = prompt,
                            .prefix = prefix,
                            .max_tokens = max_tokens,
                            .id = k,
                            .vocab = vocab,
                            .ttft = ttft + (size_t)k * requests,
                            .classes = classes,
                            .e2e = e2e + (size_t)k * requests,
                            .cls = cls + (size_t)k * requests,
                            .step = step + (size_t)k * requests,
                            .cpu_ms = cpu + (size_t)k * requests,
                            .thr_ms = thr + (size_t)k * requests,
                            .thr_used = thru + (size_t)k * requests};
            pthread_create(&th[k], NULL, client, &jobs[k]);
        }
        long tokens = 0, cached = 0, failed = 0;
        for (int k = 0; k < N; k++) {
            pthread_join(th[k], NULL);
            tokens += jobs[k].tokens, cached += jobs[k].cached, failed += jobs[k].failed;
        }
        double wall = ikv_now() - t0;
        size_t nt = (size_t)N * (size_t)requests;
        qsort(ttft, nt, sizeof *ttft, cmp_d);
        printf("%8d %10.2f %12.1f %8.1fms %8.1fms %10ld%s\n", N, (double)nt / wall,
               (double)tokens / wall, ttft[nt / 2] * 1e3,
               ttft[(nt * 99) / 100 < nt ? (nt * 99) / 100 : nt - 1] * 1e3, cached,
               failed ? "  (some requests failed)" : "");
        if (classes) class_table(jobs, N, requests);
        fflush(stdout);
        if (pid > 0) {
            kill(pid, SIGTERM);
            waitpid(pid, NULL, 0);
        }
        free(jobs), free(th), free(ttft), free(e2e), free(cpu), free(cls), free(step);
        free(thr), free(thru);
    }
    curl_global_cleanup();
    return 0;
}
