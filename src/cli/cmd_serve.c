/*
 * isokv serve: the OpenAI-compatible server (serve.h, docs/serve.md).
 *
 *     isokv serve [--model M.bin] [--tokenizer T.bin] [--host 127.0.0.1] [--port 8000]
 *                 [--threads 1] [--kv-mem BYTES] [--policy lru] [--api-keys FILE]
 *                 [--max-seqs 32] [--max-batch-tokens 256] [--max-queue N]
 *                 [--public-prefix FILE] [--public-system] [--drain-s 10]
 *                 [--tier SPEC]... [--tier-dtype f32|q8]
 *
 * Prints the address (the bound port when --port 0), the model, the cache configuration and
 * the measured startup time on stdout, one line per request on stderr. SIGTERM or SIGINT stops
 * accepting (503), lets running requests finish for at most --drain-s seconds, and exits 0.
 * The signals are blocked in every thread and taken by sigwait() here, so no handler runs
 * inside the server's threads. --tier opens the stores through cli_tiers_open (as `run`
 * does), called by ikv_serve_create once the model is loaded (serve options' open_tiers).
 */
#include "cli.h"
#include "isokv/model.h"
#include "isokv/serve.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fputs("usage: isokv serve [--model M.bin] [--tokenizer T.bin] [--host ADDR] [--port N]\n"
          "                   [--threads T] [--kv-mem BYTES] [--policy NAME] [--api-keys FILE]\n"
          "                   [--max-seqs N] [--max-batch-tokens N] [--max-queue N]\n"
          "                   [--public-prefix FILE] [--public-system] [--drain-s S]\n"
          "                   [--tier SPEC]... [--tier-dtype f32|q8] [--route-config FILE]\n"
          "                   [--route-set KEY=VALUE]... [--route-model M] [--route-hw H]\n"
          "                   [--route walk|frontier] [--semantic-cache[=SIZE]]\n"
          "                   [--spec lookup[:n=3,k=1,m=2]] [--block-tokens N]\n\n"
          "An OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions,\n"
          "GET /v1/models, GET /health, GET /metrics (Prometheus). Continuous batching: one\n"
          "forward step serves every running sequence; prompts are prefilled in chunks within\n"
          "--max-batch-tokens positions per step (256); at most --max-seqs sequences run (32),\n"
          "--max-queue wait (4 x max-seqs; more get 429 with Retry-After). Defaults: the bundled\n"
          "model data/models/stories260K/{stories260K.bin,tok512.bin} on 127.0.0.1:8000\n"
          "(--port 0: any free port, printed). --block-tokens: tokens per KV block (16; fewer\n"
          "for scaled traces, docs/load.md). --kv-mem sizes the KV pool (k/M/G suffixes;\n"
          "default room for max-seqs full sequences plus 4). --api-keys FILE: a JSON object\n"
          "{\"KEY\": \"tenant\"}; requests need Authorization: Bearer KEY (else 401); without it\n"
          "every request is tenant 'default'. --public-prefix FILE: prompts starting with its\n"
          "text share those blocks across tenants; --public-system: chat system messages do.\n"
          "SIGTERM/SIGINT: stop accepting, finish running requests (at most --drain-s seconds,\n"
          "10), exit 0. Answers' usage.isokv.cached_tokens_by_tier says where each prompt's\n"
          "prefix came from (pool, then each --tier); /metrics has them by tier too.\n"
          "Routing: a request's class (isokv.class or header X-Isokv-Class: simple, medium\n"
          "(default), complex) and latency target (isokv.slo_ms, X-Isokv-Slo-Ms) go to the\n"
          "planner's router (ikv_plan_route) on the walk of --route-model (llama3-70b) on\n"
          "--route-hw (h100); class caps and prices are plan parameters (--route-config FILE\n"
          "as `isokv plan --config`, --route-set route.simple=1 as `isokv plan --set`);\n"
          "--route frontier routes on each class's efficient frontier instead (knee, SLO,\n"
          "as `isokv plan route --frontier`). The step sets the request's priority, its\n"
          "forward threads (1 below step 2, --threads from it) and, from step 3,\n"
          "speculation: --spec and --semantic-cache (docs/serve.md, \"Routing\").\n"
          "--semantic-cache[=SIZE]: keep finished responses, SIZE entries (digits: 1024 by\n"
          "default) or SIZE bytes (a k/M/G suffix: 64M; prompt and output tokens and a fixed\n"
          "part per entry count); a new request's most similar one (same tenant, or public) is\n"
          "verified by the model as a draft inside the batched step and only what the model\n"
          "itself would produce is served (docs/semantic.md). --spec lookup[:n=N,k=K,m=M]:\n"
          "prompt-lookup drafts (K tokens after the latest match of the last N..M tokens;\n"
          "3, 1, 2), verified in the same step. Both apply to requests routed to step 3 or above;\n"
          "a request switches them with \"isokv\": {\"spec\": \"lookup\"|\"off\",\n"
          "\"semantic_cache\": true|false}. usage.isokv.speculative, usage.isokv.semantic_cache,\n"
          "isokv_spec_* and isokv_semcache_* metrics count them.\n",
          f);
    fputs(cli_tiers_help, f);
}

/* ikv_serve_options.open_tiers: cli_tiers_open, remembering its exit code (2 for a malformed
 * spec) for the process's status. */
typedef struct serve_tiers {
    cli_tiers t;
    const char *tokenizer;
    int exit_code;
} serve_tiers;

static int open_tiers(void *ctx, const ikv_model *m, ikv_engine_options *eo) {
    serve_tiers *st = ctx;
    st->exit_code = cli_tiers_open(&st->t, "serve", m, st->tokenizer, eo);
    return st->exit_code ? ikv_error(IKV_EIO, "--tier: the stores could not be opened")
                         : 0;
}

int ikv_cmd_serve(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help(stdout);
        return IKV_EXIT_OK;
    }
    const char *cmd = "serve";
    ikv_serve_options o;
    ikv_serve_options_default(&o);
    double drain = 10;
    serve_tiers tiers;
    memset(&tiers, 0, sizeof tiers);
    const char *route_set[32];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int flag = !strcmp(a, "--public-system");
        if (flag) {
            o.public_system = 1;
            continue;
        }
        if (!strncmp(a, "--semantic-cache", 16) && (a[16] == 0 || a[16] == '=')) {
            uint64_t sz = 1024, by = 0;
            if (a[16] == '=' && cli_parse_semcache(a + 17, &sz, &by))
                return cli_usage_error(cmd,
                                       "--semantic-cache=%s is not a number of entries in "
                                       "1..1000000 or a byte size of at least 4k (64M)",
                                       a + 17);
            o.semantic_cache_bytes = by;
            o.semantic_cache = (uint32_t)sz;
            continue;
        }
        if (i + 1 >= argc) return cli_usage_error(cmd, "%s needs a value (see --help)", a);
        const char *v = argv[++i];
        uint64_t u;
        if (!strcmp(a, "--spec")) {
            uint64_t ng = 3, k = 1, mn = 2;
            if (cli_parse_spec(v, &ng, &k, &mn) || mn > ng)
                return cli_usage_error(cmd,
                                       "--spec '%s' is not lookup[:n=N,k=K,m=M] (1..256, "
                                       "m <= n)",
                                       v);
            o.spec_ngram = (uint32_t)ng, o.spec_k = (uint32_t)k, o.spec_min = (uint32_t)mn;
            continue;
        }
        if (!strcmp(a, "--model"))
            o.model = v;
        else if (!strcmp(a, "--tokenizer"))
            o.tokenizer = strcmp(v, "none") ? v : NULL;
        else if (!strcmp(a, "--host"))
            o.host = v;
        else if (!strcmp(a, "--policy"))
            o.policy = v;
        else if (!strcmp(a, "--api-keys"))
            o.api_keys = v;
        else if (!strcmp(a, "--public-prefix"))
            o.public_prefix = v;
        else if (!strcmp(a, "--route-config"))
            o.route_config = v;
        else if (!strcmp(a, "--route-model"))
            o.route_model = v;
        else if (!strcmp(a, "--route-hw"))
            o.route_hw = v;
        else if (!strcmp(a, "--route")) {
            if (strcmp(v, "walk") && strcmp(v, "frontier"))
                return cli_usage_error(cmd, "--route '%s': walk or frontier", v);
            o.route_frontier = !strcmp(v, "frontier");
        }
        else if (!strcmp(a, "--route-set")) {
            if (o.n_route_set == sizeof route_set / sizeof route_set[0])
                return cli_usage_error(cmd, "at most 32 --route-set options");
            route_set[o.n_route_set++] = v;
            o.route_set = route_set;
        } else if (!strcmp(a, "--tier")) {
            if (cli_tiers_add(&tiers.t, cmd, v)) return IKV_EXIT_USAGE;
        } else if (!strcmp(a, "--tier-dtype")) {
            if (cli_tiers_dtype(&tiers.t, cmd, v)) return IKV_EXIT_USAGE;
        }
        else if (!strcmp(a, "--kv-mem")) {
            if (cli_parse_count(v, &u) || u == 0)
                return cli_usage_error(cmd, "--kv-mem '%s' is not a positive size", v);
            o.kv_mem = u;
        } else if (!strcmp(a, "--drain-s")) {
            if (cli_parse_double(v, &drain) || drain < 0)
                return cli_usage_error(cmd, "--drain-s '%s' is not a non-negative number", v);
        } else if (!strcmp(a, "--port") || !strcmp(a, "--threads") || !strcmp(a, "--max-seqs") ||
                   !strcmp(a, "--max-batch-tokens") || !strcmp(a, "--max-queue") ||
                   !strcmp(a, "--block-tokens")) {
            if (cli_parse_u64(v, &u)) return cli_usage_error(cmd, "%s '%s' is not a number", a, v);
            if (!strcmp(a, "--port")) {
                if (u > 65535) return cli_usage_error(cmd, "--port %s is not in 0..65535", v);
                o.port = (uint16_t)u;
            } else if (!strcmp(a, "--threads")) {
                if (u < 1 || u > 256)
                    return cli_usage_error(cmd, "--threads %s is not in 1..256", v);
                o.threads = (int)u;
            } else if (!strcmp(a, "--max-seqs")) {
                if (u < 1 || u > 1024)
                    return cli_usage_error(cmd, "--max-seqs %s is not in 1..1024", v);
                o.max_seqs = (uint32_t)u;
            } else if (!strcmp(a, "--block-tokens")) {
                if (u < 1 || u > 4096)
                    return cli_usage_error(cmd, "--block-tokens %s is not in 1..4096", v);
                o.block_tokens = (uint32_t)u;
            } else if (!strcmp(a, "--max-batch-tokens")) {
                if (u < 1 || u > 1u << 20)
                    return cli_usage_error(cmd, "--max-batch-tokens %s is not in 1..1048576", v);
                o.max_batch_tokens = (uint32_t)u;
            } else {
                if (u < 1 || u > 1u << 20)
                    return cli_usage_error(cmd, "--max-queue %s is not in 1..1048576", v);
                o.max_queue = (uint32_t)u;
            }
        } else {
            return cli_usage_error(cmd, "unknown option '%s' (see --help)", a);
        }
    }
    /* block the stop signals before any thread starts: every thread inherits the mask */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that goes away is a failed write, not a death */
    if (tiers.t.n) {
        tiers.tokenizer = o.tokenizer;
        o.open_tiers = open_tiers, o.tiers_ctx = &tiers;
    }
    ikv_serve *s;
    int rc = ikv_serve_create(&o, &s);
    if (rc) {
        cli_tiers_close(&tiers.t);
        if (tiers.exit_code) return tiers.exit_code; /* cli_tiers_open said why */
        if (rc == IKV_EPARAM || rc == IKV_ERANGE || rc == IKV_EMODEL || rc == IKV_EHW ||
            rc == IKV_EPOLICY) /* a flag's value: --policy, --route-set/-model/-hw */
            return cli_usage_error(cmd, "%s", ikv_errdetail());
        return cli_fail(cmd, "%s", ikv_errdetail());
    }
    printf("isokv serve: listening on http://%s:%u\n%s\n", o.host, (unsigned)ikv_serve_port(s),
           ikv_serve_describe(s));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "isokv serve: %s: draining (at most %g s)\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", drain);
    size_t left = ikv_serve_drain(s, drain);
    if (left)
        fprintf(stderr, "isokv serve: %zu requests unfinished after the drain: cancelled\n", left);
    ikv_serve_destroy(s);
    cli_tiers_close(&tiers.t); /* after the engine: it writes to the stores until destroyed */
    fprintf(stderr, "isokv serve: stopped\n");
    return IKV_EXIT_OK;
}
