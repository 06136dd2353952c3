/*
 * `isokv trace export TRACE -o OUT`: write a trace's block stream in libCacheSim's
 * oracleGeneral binary format, so the same stream runs in `isokv sim --format oracleGeneral`
 * and in libCacheSim's cachesim (docs/policies.md).
 *
 * The block stream is every block of every request in replay order, one 24-byte record each
 * (flat semantics: the prefix structure is dropped): timestamp = the request's arrival in whole
 * seconds, object id = the block key's high 64 bits (equal keys give equal ids; the key space
 * is 128-bit, so distinct blocks share an id with probability ~ n^2 / 2^65), size = the block's
 * tokens (never 0), next access = the record index of the next record with the same id, or -1.
 * Computing next access needs the whole stream: ids are gathered in memory (8 bytes a record
 * plus a 16-byte-a-slot hash map at load <= 1/2) and written at the end, to a temporary name
 * renamed into place through the project's atomic output helper (ikv_outset), so a failure
 * never leaves a partial file and a device or directory is refused as a target.
 */
#include "cli.h"

#include "isokv/sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD "trace export"

static void help(void) {
    printf("Usage: isokv trace export TRACE -o OUT [--format F] [--conversations N]\n"
           "                          [--max-requests N] [--seed S] [--strict]\n"
           "\n"
           "Writes TRACE's block stream (every block of every request in replay order, one\n"
           "request per block) as libCacheSim oracleGeneral binary records: uint32 timestamp\n"
           "(s), uint64 object id (key's high 64 bits), uint32 size (the block's tokens),\n"
           "int64 next access (record index, -1 if none). Read it back with\n"
           "`isokv sim OUT --format oracleGeneral`, or with libCacheSim's\n"
           "`cachesim OUT oracleGeneral POLICY N --ignore-obj-size 1`.\n"
           "\n"
           "  -o, --output OUT      the file to write (atomically: temp file + rename)\n"
           "  --format F            input format: auto (default), mooncake, weka, segments,\n"
           "                        oracleGeneral\n"
           "  --conversations N     weka: the first N conversations (default all)\n"
           "  --max-requests N      stop after N requests\n"
           "  --seed S              key seed (default 0)\n"
           "  --strict              a malformed record is fatal (default: skipped, counted)\n");
}

/* The message for a failed call: its detail, or the code's text when it gave none. */
static const char *errmsg(int rc) {
    return rc == IKV_ENOMEM ? ikv_strerror(rc) : ikv_errdetail();
}

typedef struct rec {
    uint64_t id;
    uint32_t ts, size;
} rec;

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

/* next[i] = index of the next record with rec[i].id, or -1. Open addressing, backward pass. */
static int next_access(const rec *r, uint64_t n, int64_t *next) {
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint64_t *key = calloc(cap, sizeof *key);
    int64_t *at = malloc(cap * sizeof *at);
    uint8_t *used = calloc(cap, 1);
    if (!key || !at || !used) {
        free(key), free(at), free(used);
        return -1;
    }
    for (uint64_t i = n; i-- > 0;) {
        uint64_t h = (r[i].id * 0x9e3779b97f4a7c15ull) & (cap - 1);
        while (used[h] && key[h] != r[i].id)
            h = (h + 1) & (cap - 1);
        next[i] = used[h] ? at[h] : -1;
        used[h] = 1;
        key[h] = r[i].id;
        at[h] = (int64_t)i;
    }
    free(key), free(at), free(used);
    return 0;
}

static int export_main(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    ikv_trace_opts to = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (++i == argc) return cli_usage_error(CMD, "%s needs a file", a);
            out = argv[i];
        } else if (!strncmp(a, "--output=", 9)) {
            out = a + 9;
        } else if (!strcmp(a, "--strict")) {
            to.strict = 1;
        } else if (!strcmp(a, "--format") || !strcmp(a, "--conversations") ||
                   !strcmp(a, "--max-requests") || !strcmp(a, "--seed")) {
            if (++i == argc) return cli_usage_error(CMD, "%s needs a value", a);
            const char *v = argv[i];
            uint64_t u = 0;
            if (!strcmp(a, "--format")) {
                if (ikv_trace_format_parse(v, &to.format))
                    return cli_usage_error(CMD, "--format: unknown format '%s'", v);
            } else if (cli_parse_count(v, &u)) {
                return cli_usage_error(CMD, "%s: '%s' is not a non-negative number", a, v);
            } else if (!strcmp(a, "--conversations")) {
                to.conversations = u;
            } else if (!strcmp(a, "--max-requests")) {
                to.max_requests = u;
            } else {
                to.seed = u;
            }
        } else if (a[0] == '-') {
            return cli_usage_error(CMD, "unknown option '%s' (see --help)", a);
        } else if (!in) {
            in = a;
        } else {
            return cli_usage_error(CMD, "more than one trace given ('%s')", a);
        }
    }
    if (!in) return cli_usage_error(CMD, "no trace given (see --help)");
    if (!out) return cli_usage_error(CMD, "no output file given (-o OUT)");

    ikv_trace *t = NULL;
    int rc = ikv_trace_open(in, &to, &t);
    if (rc) return cli_fail(CMD, "%s", errmsg(rc));
    rec *r = NULL;
    uint64_t n = 0, cap = 0;
    ikv_trace_request q;
    while ((rc = ikv_trace_next(t, &q)) == 1) {
        for (size_t b = 0; b < q.n_blocks; b++) {
            if (n == cap) {
                cap = cap ? 2 * cap : 1 << 16;
                rec *nr = realloc(r, cap * sizeof *r);
                if (!nr) {
                    rc = IKV_ENOMEM;
                    break;
                }
                r = nr;
            }
            double ts = q.time < 0 ? 0 : q.time > 4294967295.0 ? 4294967295.0 : q.time;
            r[n].id = q.keys[b].hi;
            r[n].ts = (uint32_t)ts;
            r[n].size = q.ntokens && q.ntokens[b] ? q.ntokens[b] : 1;
            n++;
        }
        if (rc == IKV_ENOMEM) break;
    }
    uint64_t skipped = ikv_trace_skipped(t);
    if (rc < 0) {
        int code = cli_fail(CMD, "%s", errmsg(rc));
        ikv_trace_close(t);
        free(r);
        return code;
    }
    ikv_trace_close(t);
    int64_t *next = malloc((n ? n : 1) * sizeof *next);
    if (!next || next_access(r, n, next)) {
        free(r), free(next);
        return cli_fail(CMD, "out of memory for %llu records", (unsigned long long)n);
    }
    ikv_outset *os = NULL;
    FILE *f = NULL;
    int orc = ikv_outset_create(&os);
    if (!orc) orc = ikv_outset_add(os, out, &f, NULL);
    if (orc) {
        free(r), free(next);
        ikv_outset_destroy(os);
        return cli_fail(CMD, "%s", errmsg(orc));
    }
    int ok = 1;
    unsigned char buf[24 * 1024];
    size_t fill = 0;
    for (uint64_t i = 0; ok && i < n; i++) {
        unsigned char *p = buf + fill;
        put32(p, r[i].ts);
        put64(p + 4, r[i].id);
        put32(p + 12, r[i].size);
        put64(p + 16, (uint64_t)next[i]);
        fill += 24;
        if (fill == sizeof buf || i + 1 == n) {
            ok = fwrite(buf, 1, fill, f) == fill;
            fill = 0;
        }
    }
    free(r), free(next);
    orc = ok ? ikv_outset_commit(os) : IKV_EIO;
    ikv_outset_destroy(os);
    if (orc) return cli_fail(CMD, "%s: cannot write the output file (%s)", out, errmsg(orc));
    fprintf(stderr, "isokv trace export: %llu records (blocks) to %s%s\n", (unsigned long long)n,
            out, skipped ? " (malformed records skipped; see --strict)" : "");
    return IKV_EXIT_OK;
}

int ikv_cmd_trace(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        help();
        return argc < 2 ? IKV_EXIT_USAGE : IKV_EXIT_OK;
    }
    if (!strcmp(argv[1], "export")) {
        if (cli_wants_help(argc, argv)) {
            help();
            return IKV_EXIT_OK;
        }
        return export_main(argc, argv);
    }
    return cli_usage_error("trace", "unknown action '%s' (export)", argv[1]);
}
