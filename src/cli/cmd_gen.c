/*
 * `isokv gen`: write a synthetic multi-user workload as a segments trace (docs/segments.md).
 *
 * Every knob of ikv_gen_opts is a flag (table below), given as `--knob VALUE` or `--knob=VALUE`.
 * The file is an atomic output (ikv_outset: temporary name, renamed; a device or other
 * non-regular target is refused), so a failure never leaves a partial file. The same flags and seed
 * always give the same file.
 */
#include "cli.h"

#include "isokv/gen.h"

#include <stdio.h>
#include <string.h>

typedef enum { K_U64, K_U32, K_DBL, K_FLAG, K_LAYOUT } knob_type;

typedef struct knob {
    const char *name;
    knob_type type;
    size_t off;
    const char *help;
} knob;

#define OFF(f) offsetof(ikv_gen_opts, f)

static const knob knobs[] = {
    {"seed", K_U64, OFF(seed), "random seed; the same seed and flags give the same file"},
    {"block-tokens", K_U32, OFF(block_tokens), "tokens per block, written to the header"},
    {"users", K_U64, OFF(users), "N users (tenants u0..uN-1)"},
    {"user-alpha", K_DBL, OFF(user_alpha), "Zipf exponent of user activity (0 = uniform)"},
    {"apps", K_U32, OFF(apps), "A apps; each has a public system prompt and tool schema"},
    {"system-tokens", K_U32, OFF(system_tokens), "S tokens of each app's system prompt"},
    {"tool-tokens", K_U32, OFF(tool_tokens), "tokens of each app's tool schema (0 = none)"},
    {"memory-tokens", K_U32, OFF(memory_tokens), "M tokens of per-user memory (0 = none)"},
    {"memory-item-tokens", K_U32, OFF(memory_item_tokens), "memory is cut in items of this size"},
    {"drift", K_DBL, OFF(drift), "fraction of memory items rewritten at each new session"},
    {"docs", K_U32, OFF(docs_per_query), "k documents retrieved per query (0 = none)"},
    {"corpus", K_U64, OFF(corpus), "V documents in the corpus"},
    {"doc-tokens", K_U32, OFF(doc_tokens), "tokens per document"},
    {"doc-alpha", K_DBL, OFF(doc_alpha), "Zipf exponent of document popularity"},
    {"private-docs", K_FLAG, OFF(private_docs), "documents are per-tenant instead of public"},
    {"turns", K_U32, OFF(turns), "T turns per session; history grows with each"},
    {"think", K_DBL, OFF(think), "mean think time between turns, seconds (exponential)"},
    {"rate", K_DBL, OFF(rate), "mean requests per second (Poisson session starts)"},
    {"user-rate", K_DBL, OFF(user_rate), "requests per user per hour; > 0 overrides --rate"},
    {"duration", K_DBL, OFF(duration), "keep requests arriving before this time (s; 0 = none)"},
    {"requests", K_U64, OFF(requests), "keep the first R requests (0 = none; needs --duration)"},
    {"intents", K_U64, OFF(intents), "size of the Zipf head of query intents"},
    {"intent-alpha", K_DBL, OFF(intent_alpha), "Zipf exponent of the intent head"},
    {"novelty", K_DBL, OFF(novelty), "probability that a query has a new, unique intent"},
    {"query-tokens", K_U32, OFF(query_tokens), "tokens per query"},
    {"output-tokens", K_U32, OFF(output_tokens), "tokens per answer (output length)"},
    {"layout", K_LAYOUT, OFF(layout), "personal-first or shared-first"},
};
#define N_KNOBS (sizeof knobs / sizeof knobs[0])

static void knob_default(const ikv_gen_opts *d, const knob *k, char *buf, size_t n) {
    const char *p = (const char *)d + k->off;
    switch (k->type) {
    case K_U64:
        snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case K_U32:
        snprintf(buf, n, "%u", *(const uint32_t *)p);
        break;
    case K_DBL:
        snprintf(buf, n, "%g", *(const double *)p);
        break;
    case K_FLAG:
        snprintf(buf, n, "%s", *(const int *)p ? "on" : "off");
        break;
    case K_LAYOUT:
        snprintf(buf, n, "%s", ikv_gen_layout_name(*(const ikv_gen_layout *)p));
        break;
    }
}

static void help(void) {
    ikv_gen_opts d;
    ikv_gen_opts_default(&d);
    printf("usage: isokv gen -o FILE [knobs]\n\n"
           "Writes a synthetic multi-user workload as segments JSONL (docs/segments.md): N users\n"
           "in A apps with public system prompts, drifting per-user memory, Zipf-popular\n"
           "documents, multi-turn sessions with growing history, Poisson arrivals. Replay it\n"
           "with 'isokv sim FILE'. The same flags and seed always give the same file.\n\n"
           "  -o, --output FILE        the trace to write (atomically: temp file + rename)\n"
           "  -q, --quiet              print nothing on success\n");
    for (size_t i = 0; i < N_KNOBS; i++) {
        char def[64], flag[48];
        knob_default(&d, &knobs[i], def, sizeof def);
        snprintf(flag, sizeof flag, "--%s%s", knobs[i].name, knobs[i].type == K_FLAG ? "" : " X");
        printf("  %-24s %s [%s]\n", flag, knobs[i].help, def);
    }
    printf("\nCounts accept k/M/G suffixes (--users 100k). If --duration is given without\n"
           "--requests, every request before the duration is kept.\n"
           "Exit codes: 0 success, 1 failure, 2 usage error.\n");
}

static int set_knob(const knob *k, ikv_gen_opts *o, const char *v) {
    char *p = (char *)o + k->off;
    uint64_t u;
    double x;
    switch (k->type) {
    case K_U64:
        if (cli_parse_count(v, &u)) return -1;
        *(uint64_t *)p = u;
        return 0;
    case K_U32:
        if (cli_parse_count(v, &u) || u > UINT32_MAX) return -1;
        *(uint32_t *)p = (uint32_t)u;
        return 0;
    case K_DBL:
        if (cli_parse_double(v, &x)) return -1;
        *(double *)p = x;
        return 0;
    case K_LAYOUT:
        return ikv_gen_layout_parse(v, (ikv_gen_layout *)p) ? -1 : 0;
    case K_FLAG:
        return -1;
    }
    return -1;
}

int ikv_cmd_gen(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        help();
        return IKV_EXIT_OK;
    }
    ikv_gen_opts o;
    ikv_gen_opts_default(&o);
    const char *out = NULL;
    int quiet = 0, saw_requests = 0, saw_duration = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) return cli_usage_error("gen", "%s needs a file name", a);
            out = argv[++i];
            continue;
        }
        if (!strncmp(a, "--output=", 9)) {
            out = a + 9;
            continue;
        }
        if (strncmp(a, "--", 2)) return cli_usage_error("gen", "unexpected argument '%s'", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const knob *k = NULL;
        for (size_t j = 0; j < N_KNOBS; j++)
            if (strlen(knobs[j].name) == len && !strncmp(knobs[j].name, name, len)) k = &knobs[j];
        if (!k) return cli_usage_error("gen", "unknown option '%s'", a);
        if (k->type == K_FLAG) {
            if (eq) return cli_usage_error("gen", "--%s takes no value", k->name);
            *(int *)((char *)&o + k->off) = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return cli_usage_error("gen", "--%s needs a value", k->name);
        if (set_knob(k, &o, v)) return cli_usage_error("gen", "--%s: bad value '%s'", k->name, v);
        saw_requests |= k->off == OFF(requests);
        saw_duration |= k->off == OFF(duration);
    }
    if (!out) return cli_usage_error("gen", "missing -o FILE");
    if (saw_duration && !saw_requests) o.requests = 0;
    if (ikv_gen_opts_check(&o)) return cli_usage_error("gen", "%s", ikv_errdetail());

    ikv_progress p;
    ikv_progress_init(&p, stderr, "gen", 0);
    uint64_t n = 0;
    int rc = ikv_gen_write_file(&o, out, &p, &n);
    ikv_progress_done(&p);
    if (rc) return cli_fail("gen", "%s", ikv_errdetail());
    if (!quiet)
        printf("wrote %llu requests of %llu users (%s, block %u tokens) to %s\n",
               (unsigned long long)n, (unsigned long long)o.users, ikv_gen_layout_name(o.layout),
               o.block_tokens, out);
    return IKV_EXIT_OK;
}
