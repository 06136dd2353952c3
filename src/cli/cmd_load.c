/*
 * `isokv load`: replay a trace against an OpenAI-compatible server and measure it.
 *
 *     isokv load TRACE --url http://127.0.0.1:8000 --out DIR [options]
 *     isokv load TRACE --url URL --vary users=1,4,16 --out DIR [options]     a sweep
 *
 * One run writes DIR/requests.csv (one row per request), DIR/summary.json (measured hit ratio
 * from usage, TTFT and latency percentiles, throughput, errors by status) and DIR/sent.jsonl
 * (the requests in the order they were sent, as a Mooncake trace for `isokv sim --mode order`,
 * whose blocks are the sent blocks: see docs/load.md). A sweep runs one load per value, each in
 * DIR/KEY-VALUE/, then writes DIR/sweep.csv, DIR/sweep.json and, unless --no-plot, gnuplot
 * plots of hit ratio and TTFT against the value (sweep_hit.svg/png, sweep_ttft.svg/png).
 *
 * Exit: 0 when the load ran and at least one request succeeded; 1 when the trace or an output
 * could not be read or written, or no request succeeded (the files are still written, with
 * every failure counted); 2 for bad flags.
 */
#include "cli.h"

#include "isokv/load.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CMD      "load"
#define MAX_VARY 32

typedef struct load_args {
    const char *trace, *out, *vary_key, *title, *write_keys;
    char *vary_vals[MAX_VARY];
    size_t n_vary;
    char vary_buf[1024];
    ikv_trace_opts to;
    ikv_load_opts lo;
    uint64_t users;
    int progress, no_plot;
} load_args;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: isokv load TRACE --url URL --out DIR [options]\n"
        "       isokv load TRACE --url URL --vary KEY=v1,v2,.. --out DIR [options]\n"
        "\n"
        "Replays a trace (Mooncake, WEKA, isokv segments; the readers of `isokv sim`) against\n"
        "an OpenAI-compatible server (POST /v1/completions, token-id prompts, SSE streaming)\n"
        "and measures, from the server's own usage fields, the token hit ratio, TTFT,\n"
        "latency, throughput and errors. Everything it reports is MEASURED.\n"
        "\n"
        "trace:\n"
        "  --format F            auto (default), mooncake, weka, segments\n"
        "  --strict              a malformed line is fatal (default: skip and count it)\n"
        "  --users N             weka: the first N conversations; segments: tenants 0..N-1\n"
        "  --conversations N     weka: the first N conversations\n"
        "  --window W            weka: conversation i starts at i*W/N seconds (default 3600)\n"
        "  --max-requests N      only the first N requests\n"
        "  --seed S              trace key seed (default 0, as `isokv sim`)\n"
        "tokens:\n"
        "  --scale K             a B-token trace block becomes B/K tokens (K divides B; default "
        "1)\n"
        "  --vocab V             target model's vocabulary (default 512, stories260K)\n"
        "  --token-seed S        seed of the block -> token mapping (default 0)\n"
        "  --out-scale F         max_tokens = output / K * F (default 1)\n"
        "  --max-output N        cap on max_tokens (default none)\n"
        "  --max-context N       do not send requests whose prompt + max_tokens exceed N\n"
        "                        (counted as too_long; e.g. 512 for stories260K)\n"
        "server:\n"
        "  --url URL             base URL (default http://127.0.0.1:8000); /v1/completions added\n"
        "  --model NAME          \"model\" field (default: omitted)\n"
        "  --api-key KEY         Authorization: Bearer KEY on every request\n"
        "  --tenants MODE        salt (default: cache_salt PREFIX<i>), key (Bearer PREFIX<i>),\n"
        "                        none\n"
        "  --tenant-prefix P     default 'tenant-'\n"
        "  --write-keys FILE     write the key file ({\"PREFIX<i>\": \"PREFIX<i>\"}) of every "
        "tenant\n"
        "                        in the trace, for `isokv serve --api-keys FILE` with\n"
        "                        --tenants key, and exit without sending\n"
        "  --no-public           do not send isokv.public_prefix_tokens\n"
        "  --ignore-eos          send ignore_eos: true (vLLM, llama.cpp)\n"
        "replay:\n"
        "  --closed-loop         a session's next request when its previous ends, --concurrency\n"
        "                        in flight (1: exactly the trace order)\n"
        "  --concurrency C       closed loop: requests in flight (default 1); open loop: cap\n"
        "                        (default 256)\n"
        "  --rate R              open loop: trace time / R (default 1)\n"
        "  --duration S          send nothing after S seconds (default: no limit)\n"
        "  --timeout S           per request (default 60); --connect-timeout S (default 5)\n"
        "output:\n"
        "  --out DIR             requests.csv, summary.json, sent.jsonl (created if missing)\n"
        "  --vary KEY=LIST       sweep: users, conversations, concurrency, rate, scale,\n"
        "                        max-requests; one run per value in DIR/KEY-VALUE/\n"
        "  --no-plot             skip gnuplot; --title T plot title\n"
        "  --progress            progress bar on stderr even when it is not a terminal\n"
        "\n"
        "Exit: 0 ok, 1 failure (bad trace, I/O, no request succeeded), 2 usage error.\n");
}

static int need(int argc, char **argv, int i) {
    if (i + 1 >= argc) return cli_usage_error(CMD, "%s needs a value", argv[i]);
    return 0;
}

static int parse_pos_double(const char *flag, const char *v, double *out) {
    if (cli_parse_double(v, out) || !(*out > 0))
        return cli_usage_error(CMD, "%s: '%s' is not a number > 0", flag, v);
    return 0;
}

static int parse_u32(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint32_t *out) {
    uint64_t u;
    if (cli_parse_count(v, &u) || u < lo || u > hi)
        return cli_usage_error(CMD, "%s: '%s' is not a whole number in %llu..%llu", flag, v,
                               (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint32_t)u;
    return 0;
}

/* Applies KEY=V (sweep value or plain flag value) to a. */
static int apply(load_args *a, const char *k, const char *v) {
    uint64_t u;
    if (!strcmp(k, "users") || !strcmp(k, "conversations")) {
        if (cli_parse_count(v, &u) || !u)
            return cli_usage_error(CMD, "--%s: '%s' is not a count >= 1", k, v);
        a->users = u;
        a->to.conversations = u;
        a->lo.max_tenants = !strcmp(k, "users") && u <= UINT32_MAX ? (uint32_t)u : 0;
        return 0;
    }
    if (!strcmp(k, "concurrency"))
        return parse_u32("--concurrency", v, 1, 1u << 16, &a->lo.concurrency);
    if (!strcmp(k, "rate")) return parse_pos_double("--rate", v, &a->lo.rate);
    if (!strcmp(k, "scale")) return parse_u32("--scale", v, 1, 1u << 16, &a->lo.map.scale);
    if (!strcmp(k, "max-requests")) {
        if (cli_parse_count(v, &u) || !u) return cli_usage_error(CMD, "--max-requests: '%s'", v);
        a->to.max_requests = u;
        return 0;
    }
    return cli_usage_error(CMD,
                           "--vary: unknown key '%s' (users, conversations, concurrency, "
                           "rate, scale, max-requests)",
                           k);
}

static int parse_args(int argc, char **argv, load_args *a) {
    memset(a, 0, sizeof *a);
    ikv_load_opts_default(&a->lo);
    a->to.window = 3600;
    int conc_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int rc;
        if (f[0] != '-' || !f[1]) {
            if (a->trace)
                return cli_usage_error(CMD, "one trace only ('%s' and '%s')", a->trace, f);
            a->trace = f;
            continue;
        }
        if (!strcmp(f, "--strict")) {
            a->to.strict = 1;
            continue;
        }
        if (!strcmp(f, "--closed-loop")) {
            a->lo.closed_loop = 1;
            continue;
        }
        if (!strcmp(f, "--no-public")) {
            a->lo.send_public = 0;
            continue;
        }
        if (!strcmp(f, "--ignore-eos")) {
            a->lo.ignore_eos = 1;
            continue;
        }
        if (!strcmp(f, "--progress")) {
            a->progress = 1;
            continue;
        }
        if (!strcmp(f, "--no-plot")) {
            a->no_plot = 1;
            continue;
        }
        if ((rc = need(argc, argv, i))) return rc;
        const char *v = argv[++i];
        uint64_t u;
        double d;
        if (!strcmp(f, "--format")) {
            if (ikv_trace_format_parse(v, &a->to.format))
                return cli_usage_error(CMD, "%s", ikv_errdetail());
        } else if (!strcmp(f, "--users") || !strcmp(f, "--conversations")) {
            if ((rc = apply(a, f + 2, v))) return rc;
        } else if (!strcmp(f, "--window")) {
            if ((rc = parse_pos_double(f, v, &a->to.window))) return rc;
        } else if (!strcmp(f, "--max-requests") || !strcmp(f, "--scale") || !strcmp(f, "--rate")) {
            if ((rc = apply(a, f + 2, v))) return rc;
        } else if (!strcmp(f, "--concurrency")) {
            if ((rc = apply(a, "concurrency", v))) return rc;
            conc_given = 1;
        } else if (!strcmp(f, "--seed")) {
            if (cli_parse_u64(v, &a->to.seed)) return cli_usage_error(CMD, "--seed: '%s'", v);
        } else if (!strcmp(f, "--token-seed")) {
            if (cli_parse_u64(v, &a->lo.map.seed))
                return cli_usage_error(CMD, "--token-seed: '%s'", v);
        } else if (!strcmp(f, "--vocab")) {
            if ((rc = parse_u32(f, v, 8, 1u << 24, &a->lo.map.vocab))) return rc;
        } else if (!strcmp(f, "--out-scale")) {
            if ((rc = parse_pos_double(f, v, &a->lo.map.out_scale))) return rc;
        } else if (!strcmp(f, "--max-output")) {
            if ((rc = parse_u32(f, v, 1, 1u << 24, &a->lo.map.max_output))) return rc;
        } else if (!strcmp(f, "--url")) {
            a->lo.url = v;
        } else if (!strcmp(f, "--model")) {
            a->lo.model = v;
        } else if (!strcmp(f, "--api-key")) {
            if (strpbrk(v, "\r\n")) return cli_usage_error(CMD, "--api-key holds a line break");
            a->lo.api_key = v;
        } else if (!strcmp(f, "--tenants")) {
            if (!strcmp(v, "salt"))
                a->lo.tenant_mode = IKV_TENANT_SALT;
            else if (!strcmp(v, "key"))
                a->lo.tenant_mode = IKV_TENANT_KEY;
            else if (!strcmp(v, "none"))
                a->lo.tenant_mode = IKV_TENANT_NONE;
            else
                return cli_usage_error(CMD, "--tenants: '%s' (salt, key, none)", v);
        } else if (!strcmp(f, "--tenant-prefix")) {
            if (strpbrk(v, "\r\n") || strlen(v) > 100)
                return cli_usage_error(CMD, "--tenant-prefix: line break or over 100 bytes");
            a->lo.tenant_prefix = v;
        } else if (!strcmp(f, "--max-context")) {
            if ((rc = parse_u32(f, v, 2, UINT32_MAX, &a->lo.max_context))) return rc;
        } else if (!strcmp(f, "--duration")) {
            if ((rc = parse_pos_double(f, v, &a->lo.duration))) return rc;
        } else if (!strcmp(f, "--timeout")) {
            if ((rc = parse_pos_double(f, v, &a->lo.timeout))) return rc;
        } else if (!strcmp(f, "--connect-timeout")) {
            if ((rc = parse_pos_double(f, v, &a->lo.connect_timeout))) return rc;
        } else if (!strcmp(f, "--out")) {
            a->out = v;
        } else if (!strcmp(f, "--write-keys")) {
            a->write_keys = v;
        } else if (!strcmp(f, "--title")) {
            a->title = v;
        } else if (!strcmp(f, "--vary")) {
            if (strlen(v) >= sizeof a->vary_buf) return cli_usage_error(CMD, "--vary: too long");
            snprintf(a->vary_buf, sizeof a->vary_buf, "%s", v);
            char *eq = strchr(a->vary_buf, '=');
            if (!eq || eq == a->vary_buf || !eq[1])
                return cli_usage_error(CMD, "--vary: '%s' is not KEY=v1,v2,..", v);
            *eq = 0;
            a->vary_key = a->vary_buf;
            for (char *save = NULL, *t = strtok_r(eq + 1, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (a->n_vary == MAX_VARY)
                    return cli_usage_error(CMD, "--vary: at most %d values", MAX_VARY);
                a->vary_vals[a->n_vary++] = t;
            }
            if (!a->n_vary) return cli_usage_error(CMD, "--vary: no values");
        } else {
            (void)u;
            (void)d;
            return cli_usage_error(CMD, "unknown option '%s'", f);
        }
    }
    if (!a->trace) return cli_usage_error(CMD, "no trace given");
    if (!a->out && !a->write_keys) return cli_usage_error(CMD, "--out DIR is required");
    if (!a->lo.closed_loop && conc_given) a->lo.max_inflight = a->lo.concurrency;
    if (!a->lo.closed_loop && !conc_given) a->lo.concurrency = 0;
    return -1;
}

/* DIR exists as a directory, or is created. */
static int ensure_dir(const char *dir) {
    struct stat st;
    if (lstat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return cli_fail(CMD, "%s exists and is not a directory", dir);
        return 0;
    }
    if (mkdir(dir, 0755)) return cli_fail(CMD, "cannot create %s: %s", dir, strerror(errno));
    return 0;
}

static int write_text(const char *dir, const char *name, char *text) {
    if (!text) return cli_fail(CMD, "%s/%s: %s", dir, name, ikv_errdetail());
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = ikv_load_write_atomic(path, text, strlen(text));
    ikv_free(text);
    if (rc) return cli_fail(CMD, "%s", ikv_errdetail());
    return 0;
}

/* The driver knows the request count once it has read the trace (streaming readers give no
 * count up front): the bar takes it from the first update. */
static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    ikv_progress *p = ctx;
    p->total = total;
    ikv_progress_update(p, done);
}

/* One load: opens the trace, runs, writes the three files into dir. *res keeps the result. */
static int one_run(load_args *a, const char *dir, ikv_load_result *res) {
    ikv_trace *t = NULL;
    int rc = ikv_trace_open(a->trace, &a->to, &t);
    if (rc) return cli_fail(CMD, "%s", ikv_errdetail());
    ikv_progress p;
    ikv_progress_init(&p, stderr, "load", ikv_trace_count_hint(t));
    if (a->progress) p.enabled = 1;
    ikv_load_opts o = a->lo;
    o.progress = on_progress;
    o.progress_ctx = &p;
    rc = ikv_load_run(t, &o, res);
    ikv_progress_done(&p);
    unsigned long long skipped = (unsigned long long)ikv_trace_skipped(t);
    if (skipped)
        fprintf(stderr, "isokv load: %llu malformed trace lines skipped (first: %s)\n", skipped,
                ikv_trace_first_error(t));
    ikv_trace_close(t);
    if (rc)
        return rc == IKV_EINVAL ? cli_usage_error(CMD, "%s", ikv_errdetail())
                                : cli_fail(CMD, "%s", ikv_errdetail());
    if ((rc = ensure_dir(dir))) return rc;
    if ((rc = write_text(dir, "requests.csv", ikv_load_requests_csv(res)))) return rc;
    char *sent = ikv_load_sent_trace(res);
    if (!sent)
        fprintf(stderr, "isokv load: sent.jsonl not written: %s\n", ikv_errdetail());
    else if ((rc = write_text(dir, "sent.jsonl", sent)))
        return rc;
    char extra[256];
    snprintf(extra, sizeof extra, "{\"skipped_trace_lines\": %llu}", skipped);
    if ((rc = write_text(dir, "summary.json", ikv_load_summary_json(res, &o, a->trace, extra))))
        return rc;
    return 0;
}

static void print_summary(const char *label, const ikv_load_result *r) {
    printf("%s%s%d requests: %llu ok", label ? label : "", label ? ": " : "", (int)r->n,
           (unsigned long long)r->ok);
    for (int e = 1; e < IKV_LOAD_N_ERR; e++)
        if (r->errors_by[e])
            printf(", %llu %s", (unsigned long long)r->errors_by[e], ikv_load_err_name(e));
    printf("\n");
    if (r->reported)
        printf("  token hit ratio %.4f (measured: %llu cached of %llu prompt tokens, %s)\n",
               r->token_hit_ratio, (unsigned long long)r->cached_tokens,
               (unsigned long long)r->prompt_tokens, ikv_cached_src_name(r->cached_src));
    else if (r->ok)
        printf("  token hit ratio: not reported by the server (no cached-token field)\n");
    if (r->ok)
        printf("  TTFT p50 %.1f ms, p90 %.1f ms, p99 %.1f ms; latency p50 %.1f ms, p99 %.1f ms; "
               "%.2f req/s, %.1f output tok/s (measured, %.2f s)\n",
               r->ttft_p50 * 1e3, r->ttft_p90 * 1e3, r->ttft_p99 * 1e3, r->lat_p50 * 1e3,
               r->lat_p99 * 1e3, r->req_per_s, r->out_tok_per_s, r->wall);
    for (size_t i = 0; i < r->n; i++)
        if (r->records[i].err) {
            printf("  first error: request %llu: %s%s%s\n", (unsigned long long)r->records[i].index,
                   ikv_load_err_name(r->records[i].err), r->records[i].detail[0] ? ": " : "",
                   r->records[i].detail);
            break;
        }
}
/* Draws the sweep's hit ratio and TTFT percentiles against the varied value, with gnuplot into
 * DIR/sweep_{hit,ttft}.{svg,png}. The four targets are one atomic output set (ikv_outset:
 * checked before gnuplot runs, a target that is not a regular file or a link to one refused,
 * all four renamed into place together or none); the data file and the script are private files
 * of DIR ("x" mode), removed at the end. gnuplot runs with an argument vector, never through a
 * shell, and every user string in the script (the title, the paths, the varied key) is written
 * by cli_gp_string, so gnuplot reads it back as data. Returns 0, or an exit code after printing
 * why (sweep.csv and sweep.json are already written then). */
static int sweep_plot(const load_args *a, const ikv_load_result *rs, const int *ok) {
    static const char *const names[4] = {"sweep_hit.svg", "sweep_hit.png", "sweep_ttft.svg",
                                         "sweep_ttft.png"};
    ikv_outset *outs = NULL;
    const char *tmp[4] = {0};
    char path[4200], dat[4200], gp[4200];
    int rc = ikv_outset_create(&outs);
    for (int i = 0; i < 4 && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", a->out, names[i]);
        rc = ikv_outset_add(outs, path, NULL, &tmp[i]);
    }
    if (rc) {
        ikv_outset_destroy(outs);
        return cli_fail(CMD, "%s (sweep.csv and sweep.json were written)", ikv_errdetail());
    }
    FILE *d = cli_private_file(a->out, "dat", dat, sizeof dat), *g = NULL;
    if (d) g = cli_private_file(a->out, "gp", gp, sizeof gp);
    if (!d || !g) {
        int e = errno;
        if (d) fclose(d), remove(dat);
        ikv_outset_destroy(outs);
        return cli_fail(CMD, "%s: cannot write plot files: %s", a->out, strerror(e));
    }
    for (size_t v = 0; v < a->n_vary; v++) {
        if (!ok[v]) continue;
        double x;
        uint64_t u;
        if (cli_parse_count(a->vary_vals[v], &u) == 0)
            x = (double)u;
        else if (cli_parse_double(a->vary_vals[v], &x))
            x = (double)v;
        fprintf(d, "%.10g %.6f %.6f %.6f %.6f\n", x, rs[v].token_hit_ratio, rs[v].ttft_p50 * 1e3,
                rs[v].ttft_p90 * 1e3, rs[v].ttft_p99 * 1e3);
    }
    fputs("set termoption noenhanced\n", g);
    for (int i = 0; i < 4; i++) {
        int ttft = i >= 2, png = i & 1;
        fputs(png ? "set terminal png size 900,560\nset output "
                  : "set terminal svg size 900,560 dynamic font 'sans,12'\nset output ",
              g);
        cli_gp_string(g, tmp[i]);
        fputs("\nset title ", g);
        cli_gp_string(g, a->title ? a->title : a->trace);
        fputs(".' (measured)'\nset xlabel ", g);
        cli_gp_string(g, a->vary_key);
        fputs("\nset grid\nset key top right\nset logscale x 2\n", g);
        fputs(ttft ? "set ylabel 'TTFT (ms)'\nset autoscale y\nplot "
                   : "set ylabel 'token hit ratio (from usage)'\nset yrange [0:1]\nplot ",
              g);
        cli_gp_string(g, dat);
        fputs(ttft ? " using 1:3 with linespoints lw 2 title 'p50', '' using 1:4 with linespoints "
                     "lw 2 title 'p90', '' using 1:5 with linespoints lw 2 title 'p99'\n"
                   : " using 1:2 with linespoints lw 2 title 'hit ratio'\n",
              g);
        fputs("unset output\n", g);
    }
    int bad = ferror(d) | ferror(g);
    bad |= fclose(d) != 0;
    bad |= fclose(g) != 0;
    if (bad) {
        remove(dat), remove(gp);
        ikv_outset_destroy(outs);
        return cli_fail(CMD, "%s: cannot write plot files (sweep.csv and sweep.json were written)",
                        a->out);
    }
    fflush(stdout);
    char *argv[] = {"gnuplot", gp, NULL};
    int st = cli_spawn_wait(argv), e = errno;
    remove(dat), remove(gp);
    if (st < 0)
        rc = cli_fail(CMD, "cannot run gnuplot: %s", strerror(e));
    else if (st != 0)
        rc = cli_fail(CMD, "gnuplot failed (exit %d)", st);
    else if (ikv_outset_commit(outs))
        rc = cli_fail(CMD, "%s (sweep.csv and sweep.json were written)", ikv_errdetail());
    ikv_outset_destroy(outs);
    return rc;
}

static int run_sweep(load_args *a) {
    ikv_load_result rs[MAX_VARY];
    int ok[MAX_VARY] = {0};
    memset(rs, 0, sizeof rs);
    if (!a->no_plot && !cli_find_program("gnuplot"))
        return cli_fail(CMD, "gnuplot not found on PATH: install gnuplot-nox (scripts/deps.sh) or "
                             "use --no-plot");
    int rc = ensure_dir(a->out), worst = 0;
    if (rc) return rc;
    /* values are checked before anything runs */
    for (size_t v = 0; v < a->n_vary; v++) {
        load_args t = *a;
        if ((rc = apply(&t, a->vary_key, a->vary_vals[v]))) return rc;
    }
    uint64_t seed0 = a->lo.map.seed;
    for (size_t v = 0; v < a->n_vary; v++) {
        load_args t = *a;
        apply(&t, a->vary_key, a->vary_vals[v]);
        /* each point its own tokens, so a point never hits blocks an earlier one left behind */
        t.lo.map.seed = seed0 + v;
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s-%s", a->out, a->vary_key, a->vary_vals[v]);
        if (strpbrk(a->vary_vals[v], "/") || !strcmp(a->vary_vals[v], ".."))
            return cli_usage_error(CMD, "--vary: bad value '%s'", a->vary_vals[v]);
        rc = one_run(&t, dir, &rs[v]);
        if (rc) {
            worst = rc;
            if (rc == IKV_EXIT_USAGE) break;
            continue;
        }
        ok[v] = rs[v].ok > 0;
        char label[128];
        snprintf(label, sizeof label, "%s=%s", a->vary_key, a->vary_vals[v]);
        print_summary(label, &rs[v]);
    }
    /* sweep.csv / sweep.json */
    size_t cap = 4096 + a->n_vary * 512;
    char *csv = ikv_malloc(cap), *js = ikv_malloc(cap);
    if (!csv || !js) {
        ikv_free(csv);
        ikv_free(js);
        return cli_fail(CMD, "out of memory");
    }
    size_t cl = (size_t)snprintf(csv, cap,
                                 "%s,requests,ok,errors,token_hit_ratio,ttft_p50_ms,ttft_p90_ms,"
                                 "ttft_p99_ms,latency_p50_ms,latency_p99_ms,requests_per_s,"
                                 "output_tokens_per_s\n",
                                 a->vary_key);
    size_t jl =
        (size_t)snprintf(js, cap,
                         "{\"what\": \"measured: one load per value against a live server\", "
                         "\"vary\": \"%s\", \"points\": [",
                         a->vary_key);
    for (size_t v = 0; v < a->n_vary; v++) {
        const ikv_load_result *r = &rs[v];
        uint64_t errs = r->n - r->ok;
        cl += (size_t)snprintf(
            csv + cl, cap - cl, "%s,%zu,%llu,%llu,%.6f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.2f\n",
            a->vary_vals[v], r->n, (unsigned long long)r->ok, (unsigned long long)errs,
            r->token_hit_ratio, r->ttft_p50 * 1e3, r->ttft_p90 * 1e3, r->ttft_p99 * 1e3,
            r->lat_p50 * 1e3, r->lat_p99 * 1e3, r->req_per_s, r->out_tok_per_s);
        jl += (size_t)snprintf(
            js + jl, cap - jl,
            "%s{\"%s\": \"%s\", \"requests\": %zu, \"ok\": %llu, \"errors\": %llu, "
            "\"token_hit_ratio\": %.6f, \"ttft_p50_ms\": %.3f, \"ttft_p90_ms\": %.3f, "
            "\"ttft_p99_ms\": %.3f, \"latency_p50_ms\": %.3f, \"latency_p99_ms\": %.3f, "
            "\"requests_per_s\": %.4f, \"output_tokens_per_s\": %.2f}",
            v ? ", " : "", a->vary_key, a->vary_vals[v], r->n, (unsigned long long)r->ok,
            (unsigned long long)errs, r->token_hit_ratio, r->ttft_p50 * 1e3, r->ttft_p90 * 1e3,
            r->ttft_p99 * 1e3, r->lat_p50 * 1e3, r->lat_p99 * 1e3, r->req_per_s, r->out_tok_per_s);
    }
    snprintf(js + jl, cap - jl, "]}\n");
    int n_ok = 0;
    for (size_t v = 0; v < a->n_vary; v++)
        n_ok += ok[v];
    rc = write_text(a->out, "sweep.csv", csv);
    if (!rc)
        rc = write_text(a->out, "sweep.json", js);
    else
        ikv_free(js);
    if (!rc && !a->no_plot && n_ok) rc = sweep_plot(a, rs, ok);
    for (size_t v = 0; v < a->n_vary; v++)
        ikv_load_result_free(&rs[v]);
    if (rc) return rc;
    if (worst) return worst;
    if (!n_ok) return cli_fail(CMD, "no request succeeded at any point");
    return IKV_EXIT_OK;
}

/* --write-keys: reads the whole trace (with the same selection flags) and writes one key per
 * tenant index seen, named as --tenants key sends them. */
static int write_keys(const load_args *a) {
    ikv_trace *t = NULL;
    if (ikv_trace_open(a->trace, &a->to, &t)) return cli_fail(CMD, "%s", ikv_errdetail());
    ikv_trace_request q;
    int rc;
    uint64_t tenants = 0;
    while ((rc = ikv_trace_next(t, &q)) == 1)
        if ((uint64_t)q.tenant + 1 > tenants) tenants = (uint64_t)q.tenant + 1;
    ikv_trace_close(t);
    if (rc < 0) return cli_fail(CMD, "%s", ikv_errdetail());
    if (a->lo.max_tenants && tenants > a->lo.max_tenants) tenants = a->lo.max_tenants;
    cJSON *j = cJSON_CreateObject();
    for (uint64_t i = 0; j && i < tenants; i++) {
        char k[160];
        snprintf(k, sizeof k, "%s%llu", a->lo.tenant_prefix, (unsigned long long)i);
        if (!cJSON_AddStringToObject(j, k, k)) {
            cJSON_Delete(j);
            j = NULL;
        }
    }
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text) return cli_fail(CMD, "out of memory");
    rc = ikv_load_write_atomic(a->write_keys, text, strlen(text));
    cJSON_free(text);
    if (rc) return cli_fail(CMD, "%s", ikv_errdetail());
    printf("wrote %llu tenant keys to %s\n", (unsigned long long)tenants, a->write_keys);
    return IKV_EXIT_OK;
}

int ikv_cmd_load(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return IKV_EXIT_OK;
    }
    load_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    if (a.write_keys) return write_keys(&a);
    if (a.vary_key) return run_sweep(&a);
    if ((rc = ensure_dir(a.out))) return rc;
    ikv_load_result r;
    memset(&r, 0, sizeof r);
    rc = one_run(&a, a.out, &r);
    if (rc) {
        ikv_load_result_free(&r);
        return rc;
    }
    print_summary(NULL, &r);
    int ok = r.ok > 0;
    ikv_load_result_free(&r);
    if (!ok)
        return cli_fail(CMD, "no request succeeded (see %s/requests.csv and summary.json)", a.out);
    return IKV_EXIT_OK;
}
