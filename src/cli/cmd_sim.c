/*
 * `isokv sim`: replay a trace through the cache core and report what the cache did.
 *
 *     isokv sim TRACE [options]                  one replay: a table, or --json one object
 *     isokv sim sweep TRACE --vary K=v1,v2,... --policy p1,p2 --capacity-tokens c1,c2 --out DIR
 *
 * A sweep runs the grid (vary values x policies x capacities), each run with its own trace
 * reader and cache, on a pool of pthreads (--jobs, default the online cores), then writes
 * DIR/sweep.csv and DIR/sweep.json and draws the token hit ratio against the varied parameter
 * with gnuplot (DIR/sweep.svg and DIR/sweep.png) from a temporary script. The four files are
 * one atomic output set (ikv_outset), checked before the first run: they appear together, or
 * none does (a failed run, a full disk, a gnuplot failure leave every target as it was).
 * gnuplot is started with an argument vector (no shell) and every user string in its script
 * goes through cli_gp_string, so --out and --title are data, never code. A progress bar runs on
 * stderr (ikv_progress: only on a terminal or with IKV_PROGRESS=1).
 *
 * Policies are taken from the cache's registry (ikv_policy_count/ikv_policy_name) at run time,
 * so a newly registered policy is usable here with no change; an unknown name is a usage
 * error that lists the registered ones.
 *
 * Every simulated figure is labelled as such, with the cost model (model, hardware, GPUs) that
 * produced it; wall-clock figures (replay seconds, block ops/s) are labelled measured.
 */
#include "cli.h"

#include "isokv/cost.h"
#include "isokv/sim.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CMD "sim"
#define MAX_LIST 64

typedef struct sim_args {
    const char *trace;
    ikv_trace_opts to;
    ikv_replay_opts ro;
    int json, per_tenant, unlimited_given;
    char tiers_spec[256];
    char tier_names[IKV_MAX_TIERS][16];
} sim_args;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: isokv sim TRACE [options]\n"
        "       isokv sim sweep TRACE --vary KEY=v1,v2,.. [--policy p1,p2,..]\n"
        "                       [--capacity-tokens c1,c2,..] --out DIR [--jobs J] [options]\n"
        "\n"
        "Replays a trace (Mooncake JSONL, WEKA agentic JSONL.gz, isokv segments JSONL; plain\n"
        "or gzip) through the isokv cache core and reports hits, evictions, thrash and, in timed\n"
        "mode, simulated TTFT. Times are SIMULATED on the roofline cost model (src/cost/).\n"
        "\n"
        "trace:\n"
        "  --format F            auto (default), mooncake, weka, segments,\n"
        "                        oracleGeneral (libCacheSim binary, one block a request)\n"
        "  --strict              a malformed line is fatal (default: skip and count it)\n"
        "  --conversations N     weka: the first N conversations (default all)\n"
        "  --window W            weka: conversation i starts at i*W/N seconds (default 3600)\n"
        "  --max-requests N      stop after N requests\n"
        "  --seed S              key seed (default 0)\n"
        "  --max-request-tokens N  a record asking for more input or output tokens is\n"
        "                        malformed (default 2097152)\n"
        "  --max-segment-tokens N  segments: the same for one segment (default 1048576)\n"
        "cache:\n"
        "  --capacity-tokens C   one tier of C tokens (k/M/G suffixes; 0 or 'unlimited' =\n"
        "                        every distinct block fits; default unlimited)\n"
        "  --tiers SPEC          e.g. hbm=2M,dram=16M,ssd=200M (token capacities, fastest first)\n"
        "  --policy NAME[:k=v]   eviction policy of every tier (default lru); registered:");
    for (size_t i = 0; i < ikv_policy_count(); i++) fprintf(f, " %s", ikv_policy_name(i));
    fprintf(f,
            "\n"
            "  --pin-public          pin each request's leading public blocks (segments traces)\n"
            "  --pin-budget F        fraction of tier 0 that may be pinned (default 0.5)\n"
            "  --chunk-reuse[=R]     segments: doc chunks hit at any position, R of their tokens\n"
            "                        recomputed (default R 0.26: the engine's measured\n"
            "                        recompute at its default blend ratio, docs/chunks.md)\n"
            "  --thrash-window B     ghost list of the last B dropped blocks (default: capacity)\n"
            "replay:\n"
            "  --mode order|timed    order (default): trace order, no timing (Mooncake method);\n"
            "                        timed: arrivals at trace times, prefill servers, locks\n"
            "  --servers S           timed: prefill servers (default 4)\n"
            "  --service trace|model timed: times from the cost model (default) or each\n"
            "                        request's measured ttft_s / latency_s (a live run's\n"
            "                        sent.jsonl from isokv load: starts at arrival, no servers)\n"
            "  --decode-batch B      timed: decode batch for the per-token time (default 16)\n"
            "  --model M             cost model (default llama3-70b)\n"
            "  --hw H                hardware (default h100)\n"
            "  --gpus G              GPUs per server, tensor parallel (default 8)\n"
            "output:\n"
            "  --json                one JSON object instead of the table\n"
            "  --per-tenant          list every tenant's hit ratio (always in JSON for segments)\n"
            "sweep:\n"
            "  --vary KEY=LIST       conversations, window, servers, capacity-tokens, max-requests\n"
            "  --policy LIST         comma-separated policies (lru,value:new=4,cost=0,opt)\n"
            "  --capacity-tokens LIST  comma-separated capacities ('unlimited' allowed)\n"
            "  --out DIR             writes sweep.csv, sweep.json, sweep.svg, sweep.png, all\n"
            "                        together or none (a failed run writes nothing)\n"
            "  --jobs J              parallel runs (default: online cores)\n"
            "  --no-plot             skip gnuplot\n"
            "  --title T             plot title\n"
            "\n"
            "Exit: 0 ok, 1 failure (bad trace, I/O), 2 usage error.\n");
}

/* ---- option parsing ------------------------------------------------------------------------ */

static int policy_known(const char *spec) {
    size_t len = strcspn(spec, ":");
    for (size_t i = 0; i < ikv_policy_count(); i++) {
        const char *n = ikv_policy_name(i);
        if (strlen(n) == len && !strncmp(n, spec, len)) return 1;
    }
    return 0;
}

/* 1 (after printing the usage error) if the policy's own parser rejects the parameters of
 * spec ("lru:bogus=1"), checked on a throwaway cache, so a sweep fails at its flags exactly as a
 * single replay does, before any run starts. */
static int policy_params_bad(const char *spec) {
    ikv_cache_config cfg;
    ikv_cache_config_default(&cfg, 16, spec);
    ikv_cache *c = NULL;
    int rc = ikv_cache_create(&cfg, &c);
    if (rc == IKV_EPOLICY || rc == IKV_EPARAM) {
        cli_usage_error(CMD, "--policy: %s", ikv_errdetail_for(rc));
        return 1;
    }
    if (!rc) ikv_cache_destroy(c);
    return 0;
}

static int policy_error(const char *spec) {
    char list[512] = "";
    for (size_t i = 0; i < ikv_policy_count(); i++) {
        if (i) strncat(list, ", ", sizeof list - strlen(list) - 1);
        strncat(list, ikv_policy_name(i), sizeof list - strlen(list) - 1);
    }
    return cli_usage_error(CMD, "unknown eviction policy '%.*s' (registered: %s)",
                           (int)strcspn(spec, ":"), spec, list);
}

static int parse_capacity(const char *s, uint64_t *out) {
    if (!strcmp(s, "unlimited") || !strcmp(s, "inf")) {
        *out = 0;
        return 0;
    }
    return cli_parse_count(s, out);
}

/* "hbm=2M,dram=16M" -> ro->tiers (ikv_replay_tiers_parse: fastest first, no duplicates) */
static int parse_tiers(sim_args *a, const char *spec) {
    if (strlen(spec) >= sizeof a->tiers_spec)
        return cli_usage_error(CMD, "--tiers: specification too long");
    snprintf(a->tiers_spec, sizeof a->tiers_spec, "%s", spec);
    if (ikv_replay_tiers_parse(spec, a->ro.tiers, &a->ro.n_tiers))
        return cli_usage_error(CMD, "%s", ikv_errdetail());
    return 0;
}

/* Value of option `name` at argv[*i] ("--name V" or "--name=V"); NULL if argv[*i] is not it. */
static const char *opt_val(int argc, char **argv, int *i, const char *name, int *missing) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    *missing = 0;
    if (strncmp(a, name, n)) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n]) return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

typedef struct sweep_args {
    char vary_key[32];
    char *vary_vals[MAX_LIST];
    size_t n_vary;
    char *policies[MAX_LIST];
    size_t n_pol;
    char *caps[MAX_LIST];
    size_t n_cap;
    const char *out, *title;
    uint32_t jobs;
    int no_plot;
    char vary_buf[2048], pol_buf[2048], cap_buf[2048]; /* the lists point into these */
} sweep_args;

/* Copies a list argument into buf (so it can be split in place). 0, or -1 if too long. */
static int copy_list(char *buf, size_t n, const char *v) {
    if (strlen(v) >= n) return -1;
    memcpy(buf, v, strlen(v) + 1);
    return 0;
}

/* Splits a policy list: "lru,value:new=4,cost=0,opt" -> lru | value:new=4,cost=0 | opt (a
 * piece of the form k=v without ':' continues the previous policy's parameters). */
static size_t split_policies(char *s, char **out, size_t max) {
    size_t n = 0;
    char *p = s;
    while (*p && n < max) {
        out[n++] = p;
        char *q = p;
        for (;;) {
            char *comma = strchr(q, ',');
            if (!comma) {
                p = q + strlen(q);
                break;
            }
            char *next = comma + 1, *end = strchr(next, ',');
            size_t len = end ? (size_t)(end - next) : strlen(next);
            int param = memchr(next, '=', len) && !memchr(next, ':', len) && strchr(out[n - 1], ':');
            if (!param) {
                *comma = 0;
                p = next;
                break;
            }
            q = next;
        }
    }
    return n;
}

static size_t split_list(char *s, char **out, size_t max) {
    size_t n = 0;
    for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok && n < max; tok = strtok_r(NULL, ",", &save))
        out[n++] = tok;
    return n;
}

/* Parses the options shared by sim and sweep. In a sweep, --policy and --capacity-tokens are
 * lists (stored in sw). Returns -1 if all was well, else an exit code. */
static int parse_args(int argc, char **argv, int first, sim_args *a, sweep_args *sw) {
    ikv_replay_opts_default(&a->ro);
    memset(&a->to, 0, sizeof a->to);
    a->to.window = 3600;
    for (int i = first; i < argc; i++) {
        const char *v;
        int miss = 0;
        const char *arg = argv[i];
#define OPT(name) ((v = opt_val(argc, argv, &i, name, &miss)) != NULL || miss)
#define NEED(name)                                                                             \
    if (miss) return cli_usage_error(CMD, "%s needs a value", name)
        if (!strcmp(arg, "--json")) {
            a->json = 1;
        } else if (!strcmp(arg, "--strict")) {
            a->to.strict = 1;
        } else if (!strcmp(arg, "--per-tenant")) {
            a->per_tenant = 1;
        } else if (!strcmp(arg, "--pin-public")) {
            a->ro.pin_public = 1;
        } else if (!strcmp(arg, "--no-plot") && sw) {
            sw->no_plot = 1;
        } else if (!strcmp(arg, "--chunk-reuse")) {
            double r;
            if (i + 1 < argc && !cli_parse_double(argv[i + 1], &r)) {
                i++;
                if (r < 0 || r > 1) return cli_usage_error(CMD, "--chunk-reuse: R must be in [0, 1]");
                a->ro.chunk_reuse = r;
            } else {
                /* the engine's measured cost at its default blend ratio (docs/chunks.md): at
                 * r = 0.15 on `small`, 15.5% of a document's tokens recomputed in layers 1..7
                 * and all of them in layer 0: 1/8 + 7/8 x 0.155 = 0.26 */
                a->ro.chunk_reuse = 0.26;
            }
        } else if (!strncmp(arg, "--chunk-reuse=", 14)) {
            double r;
            if (cli_parse_double(arg + 14, &r) || r < 0 || r > 1)
                return cli_usage_error(CMD, "--chunk-reuse: R must be a number in [0, 1]");
            a->ro.chunk_reuse = r;
        } else if (OPT("--format")) {
            NEED("--format");
            if (ikv_trace_format_parse(v, &a->to.format))
                return cli_usage_error(CMD, "%s", ikv_errdetail());
        } else if (OPT("--mode")) {
            NEED("--mode");
            if (!strcmp(v, "order")) a->ro.mode = IKV_REPLAY_ORDER;
            else if (!strcmp(v, "timed")) a->ro.mode = IKV_REPLAY_TIMED;
            else return cli_usage_error(CMD, "--mode must be order or timed, not '%s'", v);
        } else if (OPT("--service")) {
            NEED("--service");
            if (!strcmp(v, "trace")) a->ro.service_trace = 1;
            else if (!strcmp(v, "model")) a->ro.service_trace = 0;
            else return cli_usage_error(CMD, "--service must be trace or model, not '%s'", v);
        } else if (OPT("--capacity-tokens")) {
            NEED("--capacity-tokens");
            if (sw) {
                if (copy_list(sw->cap_buf, sizeof sw->cap_buf, v))
                    return cli_usage_error(CMD, "--capacity-tokens: list too long");
                sw->n_cap = split_list(sw->cap_buf, sw->caps, MAX_LIST);
                for (size_t k = 0; k < sw->n_cap; k++) {
                    uint64_t c;
                    if (parse_capacity(sw->caps[k], &c))
                        return cli_usage_error(CMD, "--capacity-tokens: '%s' is not a token count", sw->caps[k]);
                }
            } else if (parse_capacity(v, &a->ro.capacity_tokens)) {
                return cli_usage_error(CMD, "--capacity-tokens: '%s' is not a token count", v);
            }
        } else if (OPT("--tiers")) {
            NEED("--tiers");
            int rc = parse_tiers(a, v);
            if (rc) return rc;
        } else if (OPT("--policy")) {
            NEED("--policy");
            if (sw) {
                if (copy_list(sw->pol_buf, sizeof sw->pol_buf, v))
                    return cli_usage_error(CMD, "--policy: list too long");
                sw->n_pol = split_policies(sw->pol_buf, sw->policies, MAX_LIST);
                for (size_t k = 0; k < sw->n_pol; k++)
                    if (!policy_known(sw->policies[k])) return policy_error(sw->policies[k]);
                    else if (policy_params_bad(sw->policies[k]))
                        return IKV_EXIT_USAGE;
            } else {
                if (!policy_known(v)) return policy_error(v);
                if (policy_params_bad(v)) return IKV_EXIT_USAGE;
                a->ro.policy = v;
            }
        } else if (OPT("--model")) {
            NEED("--model");
            a->ro.model = v;
        } else if (OPT("--hw")) {
            NEED("--hw");
            a->ro.hw = v;
        } else if (OPT("--gpus") || OPT("--servers") || OPT("--decode-batch") ||
                   OPT("--conversations") || OPT("--max-requests") || OPT("--seed") ||
                   OPT("--thrash-window") || OPT("--jobs") || OPT("--max-request-tokens") ||
                   OPT("--max-segment-tokens")) {
            if (miss) return cli_usage_error(CMD, "%s needs a value", arg);
            uint64_t u;
            const char *name = arg;
            if (cli_parse_count(v, &u)) return cli_usage_error(CMD, "%.*s: '%s' is not a count",
                                                               (int)strcspn(name, "="), name, v);
            if (!strncmp(name, "--gpus", 6)) a->ro.gpus = (uint32_t)u;
            else if (!strncmp(name, "--servers", 9)) a->ro.servers = (uint32_t)u;
            else if (!strncmp(name, "--decode-batch", 14)) a->ro.decode_batch = (uint32_t)u;
            else if (!strncmp(name, "--conversations", 15)) a->to.conversations = u;
            else if (!strncmp(name, "--max-requests", 14)) a->to.max_requests = u;
            else if (!strncmp(name, "--seed", 6)) a->to.seed = u;
            else if (!strncmp(name, "--thrash-window", 15)) {
                if (u > IKV_REPLAY_MAX_THRASH_WINDOW)
                    return cli_usage_error(CMD, "--thrash-window: at most %llu blocks, got '%s'",
                                           (unsigned long long)IKV_REPLAY_MAX_THRASH_WINDOW, v);
                a->ro.thrash_window = u;
            } else if (!strncmp(name, "--max-request-tokens", 20) ||
                       !strncmp(name, "--max-segment-tokens", 20)) {
                if (u == 0 || u > UINT32_MAX)
                    return cli_usage_error(CMD, "%.*s must be 1..%u", (int)strcspn(name, "="), name,
                                           UINT32_MAX);
                *(name[6] == 'r' ? &a->to.max_request_tokens : &a->to.max_segment_tokens) = u;
            } else if (!strncmp(name, "--jobs", 6)) {
                if (!sw) return cli_usage_error(CMD, "--jobs is a sweep option");
                sw->jobs = (uint32_t)u;
            }
            if ((!strncmp(name, "--gpus", 6) || !strncmp(name, "--servers", 9) ||
                 !strncmp(name, "--decode-batch", 14)) && (u == 0 || u > 1000000))
                return cli_usage_error(CMD, "%.*s must be 1..1000000", (int)strcspn(name, "="), name);
        } else if (OPT("--window")) {
            NEED("--window");
            if (cli_parse_double(v, &a->to.window) || !(a->to.window > 0))
                return cli_usage_error(CMD, "--window: '%s' is not a positive number of seconds", v);
        } else if (OPT("--pin-budget")) {
            NEED("--pin-budget");
            if (cli_parse_double(v, &a->ro.pin_budget) || a->ro.pin_budget < 0 || a->ro.pin_budget > 1)
                return cli_usage_error(CMD, "--pin-budget: '%s' is not a fraction in [0, 1]", v);
        } else if (sw && OPT("--vary")) {
            NEED("--vary");
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof sw->vary_key)
                return cli_usage_error(CMD, "--vary: expected KEY=v1,v2,..., got '%s'", v);
            snprintf(sw->vary_key, sizeof sw->vary_key, "%.*s", (int)(eq - v), v);
            if (copy_list(sw->vary_buf, sizeof sw->vary_buf, eq + 1))
                return cli_usage_error(CMD, "--vary: list too long");
            sw->n_vary = split_list(sw->vary_buf, sw->vary_vals, MAX_LIST);
        } else if (sw && OPT("--out")) {
            NEED("--out");
            sw->out = v;
        } else if (sw && OPT("--title")) {
            NEED("--title");
            sw->title = v;
        } else if (arg[0] == '-' && arg[1]) {
            return cli_usage_error(CMD, "unknown option '%s'", arg);
        } else if (!a->trace) {
            a->trace = arg;
        } else {
            return cli_usage_error(CMD, "more than one trace given ('%s', '%s')", a->trace, arg);
        }
#undef OPT
#undef NEED
    }
    if (!a->trace) return cli_usage_error(CMD, "no trace file given");
    if (a->ro.n_tiers && a->ro.capacity_tokens)
        return cli_usage_error(CMD, "--capacity-tokens and --tiers are exclusive");
    if (a->ro.service_trace && a->ro.mode != IKV_REPLAY_TIMED)
        return cli_usage_error(CMD, "--service trace needs --mode timed");
    const ikv_model_spec *m;
    const ikv_hw_spec *h;
    if (ikv_model_lookup(a->ro.model, &m)) return cli_usage_error(CMD, "%s", ikv_errdetail());
    if (ikv_hw_lookup(a->ro.hw, &h)) return cli_usage_error(CMD, "%s", ikv_errdetail());
    return -1;
}

/* ---- output -------------------------------------------------------------------------------- */

static void progress_cb(void *ctx, uint64_t done, uint64_t total) {
    ikv_progress *p = ctx;
    if (total) p->total = total;
    ikv_progress_update(p, done);
}

/* "1M", "512k", "999": the unit is chosen after rounding (ikv_fmt_count). */
static void fmt_tokens(char *buf, size_t n, double tok) {
    ikv_fmt_count(buf, n, tok);
}

/* The JSON object of one replay (caller owns it). */
static cJSON *result_json(const sim_args *a, const ikv_trace *t, const ikv_replay_result *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "trace", a->trace);
    cJSON_AddStringToObject(o, "format", ikv_trace_format_name(ikv_trace_format_of(t)));
    cJSON_AddStringToObject(o, "mode", ikv_replay_mode_name(r->mode));
    cJSON_AddStringToObject(o, "policy", r->policy);
    cJSON_AddNumberToObject(o, "block_tokens", r->block_tokens);
    if (a->to.conversations) cJSON_AddNumberToObject(o, "conversations", (double)a->to.conversations);
    cJSON_AddBoolToObject(o, "unlimited", r->unlimited);
    cJSON *tiers = cJSON_AddArrayToObject(o, "tiers");
    for (size_t i = 0; i < r->n_tiers; i++) {
        cJSON *ti = cJSON_CreateObject();
        cJSON_AddStringToObject(ti, "name", r->tier_name[i]);
        cJSON_AddNumberToObject(ti, "capacity_blocks", (double)r->tier_capacity_blocks[i]);
        cJSON_AddNumberToObject(ti, "capacity_tokens", (double)r->tier_capacity_blocks[i] * r->block_tokens);
        cJSON_AddNumberToObject(ti, "hits", (double)r->hits_by_tier[i]);
        cJSON_AddNumberToObject(ti, "evictions", (double)r->evictions_by_tier[i]);
        cJSON_AddItemToArray(tiers, ti);
    }
    cJSON_AddNumberToObject(o, "requests", (double)r->requests);
    cJSON_AddNumberToObject(o, "input_tokens", (double)r->input_tokens);
    cJSON_AddNumberToObject(o, "hit_tokens", r->hit_tokens);
    cJSON_AddNumberToObject(o, "token_hit_ratio", r->token_hit_ratio);
    cJSON_AddNumberToObject(o, "blocks", (double)r->blocks);
    cJSON_AddNumberToObject(o, "hit_blocks", (double)r->hit_blocks);
    cJSON_AddNumberToObject(o, "block_hit_ratio", r->block_hit_ratio);
    cJSON *hbt = cJSON_AddObjectToObject(o, "hits_by_tier");
    for (size_t i = 0; i < r->n_tiers; i++) cJSON_AddNumberToObject(hbt, r->tier_name[i], (double)r->hits_by_tier[i]);
    cJSON_AddNumberToObject(o, "inserted_blocks", (double)r->inserted_blocks);
    cJSON_AddNumberToObject(o, "evictions", (double)r->evictions);
    cJSON_AddNumberToObject(o, "demotions", (double)r->demotions);
    cJSON_AddNumberToObject(o, "promotions", (double)r->promotions);
    cJSON_AddNumberToObject(o, "thrash_ratio", r->thrash_ratio);
    cJSON_AddNumberToObject(o, "thrash_reused", (double)r->thrash_reused);
    cJSON_AddNumberToObject(o, "thrash_window_blocks", (double)r->thrash_window);
    cJSON_AddNumberToObject(o, "prefill_flops", r->prefill_flops);
    cJSON_AddNumberToObject(o, "prefill_flops_saved", r->prefill_flops_saved);
    cJSON_AddNumberToObject(o, "chunk_hit_blocks", (double)r->chunk_hit_blocks);
    cJSON_AddNumberToObject(o, "chunk_hit_tokens", r->chunk_hit_tokens);
    cJSON_AddNumberToObject(o, "pins", (double)r->pins);
    cJSON_AddNumberToObject(o, "pin_budget_errors", (double)r->pin_budget_errors);
    cJSON_AddNumberToObject(o, "pin_failures", (double)r->pin_failures);
    cJSON_AddNumberToObject(o, "insert_full", (double)r->insert_full);
    cJSON_AddNumberToObject(o, "chain_conflicts", (double)r->chain_conflicts);
    cJSON_AddNumberToObject(o, "skipped_lines", (double)r->skipped_lines);
    const char *fe = ikv_trace_first_error(t);
    if (fe) cJSON_AddStringToObject(o, "first_skipped", fe);
    cJSON *cm = cJSON_AddObjectToObject(o, "cost_model");
    cJSON_AddStringToObject(cm, "model", r->model);
    cJSON_AddStringToObject(cm, "hw", r->hw);
    cJSON_AddNumberToObject(cm, "gpus_per_server", r->gpus);
    cJSON_AddStringToObject(cm, "note", "FLOPs and times are simulated on the roofline cost model");
    if (r->mode == IKV_REPLAY_TIMED) {
        cJSON *tm = cJSON_AddObjectToObject(o, "timed");
        cJSON_AddBoolToObject(tm, "simulated", 1);
        cJSON_AddNumberToObject(tm, "servers", r->servers);
        cJSON_AddNumberToObject(tm, "ttft_p50", r->ttft_p50);
        cJSON_AddNumberToObject(tm, "ttft_p90", r->ttft_p90);
        cJSON_AddNumberToObject(tm, "ttft_p99", r->ttft_p99);
        cJSON_AddNumberToObject(tm, "ttft_mean", r->ttft_mean);
        cJSON_AddNumberToObject(tm, "queue_p50", r->queue_p50);
        cJSON_AddNumberToObject(tm, "queue_p90", r->queue_p90);
        cJSON_AddNumberToObject(tm, "queue_p99", r->queue_p99);
        cJSON_AddNumberToObject(tm, "queue_mean", r->queue_mean);
        cJSON_AddNumberToObject(tm, "prefill_mean", r->prefill_mean);
        cJSON_AddNumberToObject(tm, "decode_mean", r->decode_mean);
        cJSON_AddNumberToObject(tm, "makespan", r->makespan);
        cJSON_AddNumberToObject(tm, "lower_tier_loaded_blocks", (double)r->lower_loaded_blocks);
        cJSON_AddNumberToObject(tm, "lower_tier_recomputed_blocks", (double)r->lower_recomputed_blocks);
        cJSON_AddNumberToObject(tm, "lock_failures", (double)r->lock_failures);
        cJSON_AddNumberToObject(tm, "pending_cuts", (double)r->pending_cuts);
        cJSON_AddStringToObject(tm, "service", a->ro.service_trace ? "trace" : "model");
    }
    if (a->per_tenant || ikv_trace_format_of(t) == IKV_TRACE_SEGMENTS) {
        cJSON *ta = cJSON_AddArrayToObject(o, "tenants");
        for (uint32_t i = 0; i < r->n_tenants; i++) {
            if (!r->tenant_requests[i]) continue;
            cJSON *ti = cJSON_CreateObject();
            cJSON_AddNumberToObject(ti, "tenant", i);
            cJSON_AddNumberToObject(ti, "requests", (double)r->tenant_requests[i]);
            cJSON_AddNumberToObject(ti, "input_tokens", (double)r->tenant_input_tokens[i]);
            cJSON_AddNumberToObject(ti, "token_hit_ratio", ikv_replay_tenant_ratio(r, i));
            cJSON_AddItemToArray(ta, ti);
        }
    }
    cJSON *me = cJSON_AddObjectToObject(o, "measured");
    cJSON_AddNumberToObject(me, "replay_seconds", r->replay_seconds);
    cJSON_AddNumberToObject(me, "prepass_seconds", r->prepass_seconds);
    cJSON_AddNumberToObject(me, "block_ops", (double)r->block_ops);
    cJSON_AddNumberToObject(me, "block_ops_per_s", r->block_ops_per_s);
    return o;
}

static void print_table(const sim_args *a, const ikv_trace *t, const ikv_replay_result *r) {
    char b1[32], b2[32];
    printf("isokv sim: %s (%s, %u-token blocks), mode %s, policy %s\n", a->trace,
           ikv_trace_format_name(ikv_trace_format_of(t)), r->block_tokens,
           ikv_replay_mode_name(r->mode), r->policy);
    printf("  cache                ");
    for (size_t i = 0; i < r->n_tiers; i++) {
        fmt_tokens(b1, sizeof b1, (double)r->tier_capacity_blocks[i] * r->block_tokens);
        printf("%s%s %llu blocks (%s tokens)", i ? ", " : "", r->tier_name[i],
               (unsigned long long)r->tier_capacity_blocks[i], b1);
    }
    printf("%s\n", r->unlimited ? " = unlimited (every distinct block fits)" : "");
    printf("  requests             %llu\n", (unsigned long long)r->requests);
    printf("  input tokens         %llu\n", (unsigned long long)r->input_tokens);
    printf("  hit tokens           %.0f\n", r->hit_tokens);
    printf("  token hit ratio      %.4f\n", r->token_hit_ratio);
    printf("  block hit ratio      %.4f\n", r->block_hit_ratio);
    printf("  hits by tier        ");
    for (size_t i = 0; i < r->n_tiers; i++)
        printf(" %s %llu", r->tier_name[i], (unsigned long long)r->hits_by_tier[i]);
    printf("\n  evictions            %llu dropped", (unsigned long long)r->evictions);
    if (r->n_tiers > 1) printf(", %llu demoted, %llu promoted", (unsigned long long)r->demotions,
                               (unsigned long long)r->promotions);
    printf("\n  thrash ratio         %.4f (dropped blocks requested again within the next %llu "
           "drops)\n",
           r->thrash_ratio, (unsigned long long)r->thrash_window);
    fmt_tokens(b1, sizeof b1, r->prefill_flops_saved);
    fmt_tokens(b2, sizeof b2, r->prefill_flops);
    printf("  prefill FLOPs saved  %.3g of %.3g (%.1f%%; simulated, %s)\n", r->prefill_flops_saved,
           r->prefill_flops, r->prefill_flops > 0 ? 100 * r->prefill_flops_saved / r->prefill_flops : 0,
           r->model);
    if (a->ro.chunk_reuse >= 0)
        printf("  chunk reuse          %llu blocks, %.0f effective tokens (R = %.2f)\n",
               (unsigned long long)r->chunk_hit_blocks, r->chunk_hit_tokens, a->ro.chunk_reuse);
    if (a->ro.pin_public)
        printf("  pins                 %llu prefixes pinned, %llu over budget, %llu failed\n",
               (unsigned long long)r->pins, (unsigned long long)r->pin_budget_errors,
               (unsigned long long)r->pin_failures);
    if (r->insert_full || r->chain_conflicts)
        printf("  insert full          %llu requests (no evictable room), %llu id conflicts\n",
               (unsigned long long)r->insert_full, (unsigned long long)r->chain_conflicts);
    if (r->skipped_lines)
        printf("  skipped lines        %llu (first: %s)\n", (unsigned long long)r->skipped_lines,
               ikv_trace_first_error(t) ? ikv_trace_first_error(t) : "?");
    if (r->mode == IKV_REPLAY_TIMED && a->ro.service_trace)
        printf("  MEASURED service times from the trace (ttft_s, latency_s); %llu requests met a "
               "block still being computed\n",
               (unsigned long long)r->pending_cuts);
    else if (r->mode == IKV_REPLAY_TIMED) {
        printf("  SIMULATED times: %s on %u x %s per server, %u prefill servers, decode batch %u\n",
               r->model, r->gpus, r->hw, r->servers, a->ro.decode_batch);
        printf("    TTFT p50/p90/p99   %.3f / %.3f / %.3f s (mean %.3f)\n", r->ttft_p50, r->ttft_p90,
               r->ttft_p99, r->ttft_mean);
        printf("    queueing p50/p90/p99 %.3f / %.3f / %.3f s (mean %.3f)\n", r->queue_p50,
               r->queue_p90, r->queue_p99, r->queue_mean);
        printf("    prefill mean       %.3f s, decode mean %.3f s, makespan %.1f s\n",
               r->prefill_mean, r->decode_mean, r->makespan);
        if (r->n_tiers > 1)
            printf("    lower-tier hits    %llu blocks loaded, %llu recomputed (cheaper)\n",
                   (unsigned long long)r->lower_loaded_blocks,
                   (unsigned long long)r->lower_recomputed_blocks);
    }
    if (a->per_tenant || (ikv_trace_format_of(t) == IKV_TRACE_SEGMENTS && r->n_tenants <= 32)) {
        printf("  per tenant (token hit ratio):\n");
        for (uint32_t i = 0; i < r->n_tenants; i++)
            if (r->tenant_requests[i])
                printf("    %-6u %8llu requests  %.4f\n", i, (unsigned long long)r->tenant_requests[i],
                       ikv_replay_tenant_ratio(r, i));
    } else if (ikv_trace_format_of(t) == IKV_TRACE_SEGMENTS) {
        printf("  tenants              %u (--per-tenant lists them)\n", r->n_tenants);
    }
    printf("  MEASURED: replay %.3f s (+ first pass %.3f s), %.3g block ops/s\n", r->replay_seconds,
           r->prepass_seconds, r->block_ops_per_s);
}

/* ---- one run ------------------------------------------------------------------------------- */

static int run_one(const sim_args *a, ikv_progress *prog) {
    ikv_trace *t;
    int orc = ikv_trace_open(a->trace, &a->to, &t);
    if (orc) return cli_fail(CMD, "%s", ikv_errdetail_for(orc));
    ikv_replay_opts ro = a->ro;
    if (prog) {
        ro.progress = progress_cb;
        ro.progress_ctx = prog;
    }
    ikv_replay_result r;
    int rc = ikv_replay(t, &ro, &r);
    if (prog) ikv_progress_done(prog);
    if (rc) {
        /* a policy spec the cache rejects (unknown parameter name) is a usage error; the rest
         * (the trace, memory) is a failure */
        int code = rc == IKV_EPOLICY || rc == IKV_EPARAM
                       ? cli_usage_error(CMD, "%s", ikv_errdetail_for(rc))
                       : cli_fail(CMD, "%s", ikv_errdetail_for(rc));
        ikv_trace_close(t);
        return code;
    }
    if (a->json) {
        cJSON *o = result_json(a, t, &r);
        char *s = o ? cJSON_Print(o) : NULL;
        if (!s) rc = cli_fail(CMD, "out of memory");
        else printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        print_table(a, t, &r);
    }
    ikv_replay_result_free(&r);
    ikv_trace_close(t);
    return rc ? IKV_EXIT_FAIL : IKV_EXIT_OK;
}

/* ---- sweep --------------------------------------------------------------------------------- */

typedef struct job {
    sim_args a;
    const char *vary_val, *policy, *cap;
    uint64_t cap_tokens;
    int rc;
    char err[512];
    cJSON *json;
    ikv_replay_result r;
} job;

typedef struct pool {
    job *jobs;
    size_t n, next, done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} pool;

static void *worker(void *arg) {
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        size_t i = p->next < p->n ? p->next++ : p->n;
        pthread_mutex_unlock(&p->mu);
        if (i >= p->n) return NULL;
        job *j = &p->jobs[i];
        ikv_trace *t = NULL;
        j->rc = ikv_trace_open(j->a.trace, &j->a.to, &t);
        if (!j->rc) j->rc = ikv_replay(t, &j->a.ro, &j->r);
        if (j->rc) {
            snprintf(j->err, sizeof j->err, "%s", ikv_errdetail_for(j->rc));
        } else {
            j->json = result_json(&j->a, t, &j->r);
            if (!j->json) {
                j->rc = IKV_ENOMEM;
                snprintf(j->err, sizeof j->err, "out of memory");
            } else {
                cJSON_AddStringToObject(j->json, "vary", j->vary_val ? j->vary_val : "");
                cJSON_AddStringToObject(j->json, "capacity", j->cap ? j->cap : "");
            }
        }
        ikv_trace_close(t);
        pthread_mutex_lock(&p->mu);
        p->done++;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Applies vary value `v` of key `k` to a job's options. 0, or a usage exit code. */
static int apply_vary(sim_args *a, const char *k, const char *v) {
    uint64_t u;
    double d;
    if (!strcmp(k, "conversations")) {
        if (cli_parse_count(v, &u)) return cli_usage_error(CMD, "--vary conversations: '%s'", v);
        a->to.conversations = u;
    } else if (!strcmp(k, "max-requests")) {
        if (cli_parse_count(v, &u)) return cli_usage_error(CMD, "--vary max-requests: '%s'", v);
        a->to.max_requests = u;
    } else if (!strcmp(k, "servers")) {
        if (cli_parse_count(v, &u) || !u) return cli_usage_error(CMD, "--vary servers: '%s'", v);
        a->ro.servers = (uint32_t)u;
    } else if (!strcmp(k, "window")) {
        if (cli_parse_double(v, &d) || !(d > 0)) return cli_usage_error(CMD, "--vary window: '%s'", v);
        a->to.window = d;
    } else if (!strcmp(k, "capacity-tokens") || !strcmp(k, "capacity")) {
        if (parse_capacity(v, &u)) return cli_usage_error(CMD, "--vary capacity-tokens: '%s'", v);
        a->ro.capacity_tokens = u;
    } else {
        return cli_usage_error(CMD, "--vary: unknown key '%s' (conversations, window, servers, "
                                    "capacity-tokens, max-requests)", k);
    }
    return 0;
}

static int is_numeric_list(char *const *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t u;
        double d;
        if (cli_parse_count(v[i], &u) && cli_parse_double(v[i], &d)) return 0;
    }
    return 1;
}

static double num_of(const char *s) {
    uint64_t u;
    double d;
    if (!cli_parse_count(s, &u)) return (double)u;
    if (!cli_parse_double(s, &d)) return d;
    return 0;
}

/* Draws token hit ratio against the varied value, one line per (policy, capacity), with
 * gnuplot from PATH into svg and png (temporary names of the output set). gnuplot runs with an
 * argument vector, never through a shell, and every user string in the script (the title, the
 * paths, the series names, the varied values) is written by cli_gp_string, so it is read back
 * as data. The data file and the script are private files in dir, removed at the end. Returns
 * 0, or an exit code after printing why. */
static int plot(const sweep_args *sw, const job *jobs, const char *dir, const char *svg,
                const char *png) {
    char dat[4200], gp[4200];
    FILE *d = cli_private_file(dir, "dat", dat, sizeof dat), *g = NULL;
    if (d) g = cli_private_file(dir, "gp", gp, sizeof gp);
    if (!d || !g) {
        int e = errno;
        if (d) fclose(d), remove(dat);
        return cli_fail(CMD, "%s: cannot write plot files: %s", dir, strerror(e));
    }
    int numeric = is_numeric_list(sw->vary_vals, sw->n_vary);
    /* one data block per series, in job order (vary is the innermost loop) */
    for (size_t p = 0; p < sw->n_pol; p++)
        for (size_t c = 0; c < sw->n_cap; c++) {
            fprintf(d, "# series %zu\n", p * sw->n_cap + c);
            for (size_t v = 0; v < sw->n_vary; v++) {
                const job *j = &jobs[(p * sw->n_cap + c) * sw->n_vary + v];
                if (j->rc) continue;
                fprintf(d, "%zu %.10g %.6f\n", v, numeric ? num_of(sw->vary_vals[v]) : (double)v,
                        j->r.token_hit_ratio);
            }
            fprintf(d, "\n\n");
        }
    int logx = numeric && !strcmp(sw->vary_key, "conversations");
    fprintf(g, "set termoption noenhanced\n");
    for (int k = 0; k < 2; k++) {
        fputs(k == 0 ? "set terminal svg size 900,560 dynamic font 'sans,12'\nset output "
                     : "set terminal png size 900,560\nset output ",
              g);
        cli_gp_string(g, k == 0 ? svg : png);
        fputs("\nset title ", g);
        cli_gp_string(g, sw->title ? sw->title : "token hit ratio (order mode, simulated cache)");
        fputs(" noenhanced\nset xlabel ", g);
        cli_gp_string(g, sw->vary_key);
        fputs(" noenhanced\nset ylabel 'token hit ratio'\nset yrange [0:1]\n"
              "set key outside right noenhanced\nset grid\n",
              g);
        if (logx) fprintf(g, "set logscale x 2\n");
        if (!numeric) {
            fprintf(g, "set xtics (");
            for (size_t v = 0; v < sw->n_vary; v++) {
                if (v) fputs(", ", g);
                cli_gp_string(g, sw->vary_vals[v]);
                fprintf(g, " %zu", v);
            }
            fprintf(g, ")\n");
        }
        fprintf(g, "plot ");
        size_t s = 0;
        for (size_t p = 0; p < sw->n_pol; p++)
            for (size_t c = 0; c < sw->n_cap; c++, s++) {
                char name[512];
                snprintf(name, sizeof name, "%s%s%s", sw->policies[p], sw->n_cap > 1 ? " " : "",
                         sw->n_cap > 1 ? sw->caps[c] : "");
                if (s) fputs(", ", g);
                cli_gp_string(g, dat);
                fprintf(g, " index %zu using 2:3 with linespoints lw 2 title ", s);
                cli_gp_string(g, name);
            }
        fprintf(g, "\nset output\n");
    }
    int bad = ferror(d) | ferror(g);
    bad |= fclose(d) != 0;
    bad |= fclose(g) != 0;
    if (bad) {
        remove(gp);
        remove(dat);
        return cli_fail(CMD, "%s: cannot write plot files", dir);
    }
    fflush(stdout);
    char *argv[] = {"gnuplot", gp, NULL};
    int rc = cli_spawn_wait(argv);
    int e = errno;
    remove(gp);
    remove(dat);
    if (rc < 0) return cli_fail(CMD, "cannot run gnuplot: %s", strerror(e));
    if (rc != 0) return cli_fail(CMD, "gnuplot failed (exit %d)", rc);
    return 0;
}

static int run_sweep(int argc, char **argv) {
    sim_args base;
    memset(&base, 0, sizeof base);
    sweep_args sw;
    memset(&sw, 0, sizeof sw);
    int rc = parse_args(argc, argv, 2, &base, &sw);
    if (rc >= 0) return rc;
    if (!sw.out) return cli_usage_error(CMD, "sweep needs --out DIR");
    static char one[] = "";
    if (!sw.n_vary) {
        snprintf(sw.vary_key, sizeof sw.vary_key, "run");
        sw.vary_vals[0] = one;
        sw.n_vary = 1;
    }
    if (!sw.n_pol) {
        sw.policies[0] = (char *)(base.ro.policy ? base.ro.policy : "lru");
        sw.n_pol = 1;
    }
    static char unl[] = "unlimited";
    if (!sw.n_cap) {
        sw.caps[0] = base.ro.n_tiers ? base.tiers_spec : unl;
        sw.n_cap = 1;
    } else if (base.ro.n_tiers) {
        return cli_usage_error(CMD, "--capacity-tokens and --tiers are exclusive");
    }
    if (!sw.no_plot && !cli_find_program("gnuplot"))
        return cli_fail(CMD, "gnuplot not found on PATH: install gnuplot-nox (scripts/deps.sh) or "
                             "use --no-plot");
    int made_dir = mkdir(sw.out, 0777) == 0;
    if (!made_dir && errno != EEXIST) return cli_fail(CMD, "%s: %s", sw.out, strerror(errno));
    size_t n = sw.n_pol * sw.n_cap * sw.n_vary;
    job *jobs = calloc(n, sizeof *jobs);
    if (!jobs) return cli_fail(CMD, "out of memory");
    for (size_t p = 0; p < sw.n_pol; p++)
        for (size_t c = 0; c < sw.n_cap; c++)
            for (size_t v = 0; v < sw.n_vary; v++) {
                job *j = &jobs[(p * sw.n_cap + c) * sw.n_vary + v];
                j->a = base;
                j->a.ro.policy = sw.policies[p];
                j->policy = sw.policies[p];
                j->cap = sw.caps[c];
                j->vary_val = sw.vary_vals[v];
                if (!base.ro.n_tiers && parse_capacity(sw.caps[c], &j->a.ro.capacity_tokens)) {
                    free(jobs);
                    return cli_usage_error(CMD, "bad capacity '%s'", sw.caps[c]);
                }
                if (sw.vary_vals[v][0] && (rc = apply_vary(&j->a, sw.vary_key, sw.vary_vals[v]))) {
                    free(jobs);
                    return rc;
                }
            }
    /* every output in one atomic set, checked before any run: all appear, or none does */
    ikv_outset *outs = NULL;
    FILE *fcsv = NULL, *fjson = NULL;
    const char *tsvg = NULL, *tpng = NULL;
    {
        char path[4200];
        rc = ikv_outset_create(&outs);
        snprintf(path, sizeof path, "%s/sweep.csv", sw.out);
        if (!rc) rc = ikv_outset_add(outs, path, &fcsv, NULL);
        snprintf(path, sizeof path, "%s/sweep.json", sw.out);
        if (!rc) rc = ikv_outset_add(outs, path, &fjson, NULL);
        snprintf(path, sizeof path, "%s/sweep.svg", sw.out);
        if (!rc && !sw.no_plot) rc = ikv_outset_add(outs, path, NULL, &tsvg);
        snprintf(path, sizeof path, "%s/sweep.png", sw.out);
        if (!rc && !sw.no_plot) rc = ikv_outset_add(outs, path, NULL, &tpng);
        if (rc) {
            ikv_outset_destroy(outs);
            free(jobs);
            if (made_dir) rmdir(sw.out);
            return cli_fail(CMD, "%s", ikv_errdetail());
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nth = sw.jobs ? sw.jobs : (cores > 0 ? (size_t)cores : 1);
    if (nth > n) nth = n;
    pool pl = {.jobs = jobs, .n = n};
    pthread_mutex_init(&pl.mu, NULL);
    pthread_cond_init(&pl.cv, NULL);
    pthread_t *th = calloc(nth, sizeof *th);
    if (!th) {
        ikv_outset_destroy(outs);
        free(jobs);
        return cli_fail(CMD, "out of memory");
    }
    double t0 = ikv_now();
    size_t started = 0;
    for (; started < nth; started++)
        if (pthread_create(&th[started], NULL, worker, &pl)) break;
    if (!started) {
        ikv_outset_destroy(outs);
        free(th);
        free(jobs);
        return cli_fail(CMD, "cannot start worker threads");
    }
    ikv_progress prog;
    ikv_progress_init(&prog, stderr, "sweep", n);
    pthread_mutex_lock(&pl.mu);
    while (pl.done < n) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&pl.cv, &pl.mu, &ts);
        size_t d = pl.done;
        pthread_mutex_unlock(&pl.mu);
        ikv_progress_update(&prog, d);
        pthread_mutex_lock(&pl.mu);
    }
    pthread_mutex_unlock(&pl.mu);
    for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    ikv_progress_done(&prog);
    double wall = ikv_now() - t0;
    free(th);

    /* CSV and JSON */
    int failed = 0;
    size_t cap = 1 << 16, len = 0;
    char *csv = malloc(cap);
    cJSON *root = cJSON_CreateObject(), *runs = root ? cJSON_AddArrayToObject(root, "runs") : NULL;
    if (!csv || !runs) {
        ikv_outset_destroy(outs);
        free(csv);
        cJSON_Delete(root);
        free(jobs);
        return cli_fail(CMD, "out of memory");
    }
    cJSON_AddStringToObject(root, "trace", base.trace);
    cJSON_AddStringToObject(root, "vary", sw.vary_key);
    cJSON_AddNumberToObject(root, "jobs", (double)started);
    cJSON_AddNumberToObject(root, "measured_wall_seconds", wall);
#define CSV(...)                                                                               \
    do {                                                                                       \
        int k_ = snprintf(csv + len, cap - len, __VA_ARGS__);                                  \
        if (k_ > 0 && (size_t)k_ >= cap - len) {                                               \
            char *q_ = realloc(csv, cap * 2 + (size_t)k_);                                     \
            if (!q_) break;                                                                    \
            csv = q_;                                                                          \
            cap = cap * 2 + (size_t)k_;                                                        \
            k_ = snprintf(csv + len, cap - len, __VA_ARGS__);                                  \
        }                                                                                      \
        if (k_ > 0) len += (size_t)k_;                                                         \
    } while (0)
    CSV("%s,policy,capacity,requests,input_tokens,hit_tokens,token_hit_ratio,block_hit_ratio,"
        "evictions,thrash_ratio,prefill_flops_saved,ttft_p50_sim,ttft_p99_sim,replay_seconds_measured\n",
        sw.vary_key);
    for (size_t i = 0; i < n; i++) {
        job *j = &jobs[i];
        if (j->rc) {
            failed++;
            fprintf(stderr, "isokv sim: run %s=%s policy %s capacity %s failed: %s\n", sw.vary_key,
                    j->vary_val, j->policy, j->cap, j->err);
            continue;
        }
        const ikv_replay_result *r = &j->r;
        CSV("%s,\"%s\",\"%s\",%llu,%llu,%.0f,%.6f,%.6f,%llu,%.6f,%.6g,%.6g,%.6g,%.4f\n", j->vary_val,
            j->policy, j->cap, (unsigned long long)r->requests, (unsigned long long)r->input_tokens,
            r->hit_tokens, r->token_hit_ratio, r->block_hit_ratio, (unsigned long long)r->evictions,
            r->thrash_ratio, r->prefill_flops_saved, r->ttft_p50, r->ttft_p99, r->replay_seconds);
        cJSON_AddItemToArray(runs, j->json);
        j->json = NULL;
    }
    char *js = cJSON_Print(root);
    int code = IKV_EXIT_OK;
    if (!js)
        code = cli_fail(CMD, "out of memory");
    else if (fputs(csv, fcsv) < 0 || fputs(js, fjson) < 0)
        code =
            cli_fail(CMD, "%s: cannot write sweep.csv / sweep.json: %s", sw.out, strerror(errno));
    else if (!sw.no_plot && n - failed > 0 && plot(&sw, jobs, sw.out, tsvg, tpng))
        code = IKV_EXIT_FAIL;
    free(js);
    free(csv);
    cJSON_Delete(root);
    /* a sweep with failed runs writes nothing: its outputs would be incomplete */
    if (code == IKV_EXIT_OK && !failed && ikv_outset_commit(outs))
        code = cli_fail(CMD, "%s", ikv_errdetail());
    ikv_outset_destroy(outs);
    if ((code != IKV_EXIT_OK || failed) && made_dir) rmdir(sw.out); /* only if still empty */
    /* summary */
    if (code == IKV_EXIT_OK) {
        printf("isokv sim sweep: %zu runs on %zu threads in %.1f s (measured); token hit ratio "
               "(order mode unless --mode timed):\n",
               n, started, wall);
        printf("  %-14s %-18s %-12s %s\n", sw.vary_key, "policy", "capacity", "hit ratio");
        for (size_t i = 0; i < n; i++)
            if (!jobs[i].rc)
                printf("  %-14s %-18s %-12s %.4f\n", jobs[i].vary_val, jobs[i].policy, jobs[i].cap,
                       jobs[i].r.token_hit_ratio);
        if (!failed)
            printf("  wrote %s/sweep.csv, %s/sweep.json%s\n", sw.out, sw.out,
                   sw.no_plot ? "" : ", sweep.svg, sweep.png");
        else
            printf("  wrote nothing: a sweep with failed runs leaves no partial outputs\n");
    }
    for (size_t i = 0; i < n; i++) {
        cJSON_Delete(jobs[i].json);
        if (!jobs[i].rc) ikv_replay_result_free(&jobs[i].r);
    }
    free(jobs);
    pthread_mutex_destroy(&pl.mu);
    pthread_cond_destroy(&pl.cv);
    if (failed && code == IKV_EXIT_OK) code = cli_fail(CMD, "%d of %zu runs failed", failed, n);
    return code;
}

int ikv_cmd_sim(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return IKV_EXIT_OK;
    }
    if (argc >= 2 && !strcmp(argv[1], "sweep")) return run_sweep(argc, argv);
    sim_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_args(argc, argv, 1, &a, NULL);
    if (rc >= 0) return rc;
    ikv_progress prog;
    ikv_progress_init(&prog, stderr, "sim", 0);
    return run_one(&a, &prog);
}
