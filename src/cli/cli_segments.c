/*
 * `isokv run --segments FILE`: structured requests from JSON (docs/chunks.md, "Request file").
 *
 * The file is one request object or an array of them, run in order on one engine:
 *
 *   {"tenant": "u1", "blend_ratio": 0.3,
 *    "segments": [{"kind": "doc", "text": "...", "public": true, "reusable": true,
 *                  "movable": true}, {"kind": "query", "tokens": [1, 306, 4]}]}
 *
 * Each segment has `kind` (system, tool, memory, doc, history, query, as docs/segments.md) and
 * exactly one of `text` (encoded with the run's tokenizer; when the first segment is text, a
 * BOS segment of its own, public, goes before it) or `tokens` (an array of ids < vocab); flags
 * `public`, `reusable`, `movable` are optional booleans (false). Every error names the file and the
 * field
 * ("req.json: requests[1].segments[0].tokens[3]: 700 is not a token id < vocab 512").
 */
#include "cli_segments.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_segfile_free(cli_segfile *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_req; i++) {
        for (size_t j = 0; j < f->req[i].n_segs; j++)
            free((void *)f->req[i].segs[j].tokens);
        free(f->req[i].segs);
        free(f->req[i].tenant);
    }
    free(f->req);
    memset(f, 0, sizeof *f);
}

static int bad(char *err, size_t errn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t errn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errn, fmt, ap);
    va_end(ap);
    return -1;
}

/* Reads the flag `name` of segment object o into *out (absent: 0). */
static int flag(const cJSON *o, const char *name, int *out, const char *where, char *err,
                size_t errn) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = 0;
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return bad(err, errn, "%s.%s: must be true or false", where, name);
    *out = cJSON_IsTrue(f);
    return 0;
}

static int one_request(const cJSON *r, const char *rw, const ikv_tokenizer *tok, uint32_t vocab,
                       cli_segreq *out, char *err, size_t errn) {
    memset(out, 0, sizeof *out);
    out->ratio = -1;
    if (!cJSON_IsObject(r)) return bad(err, errn, "%s: must be an object", rw);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "tenant");
    if (t) {
        if (!cJSON_IsString(t) || !*t->valuestring)
            return bad(err, errn, "%s.tenant: must be a non-empty string", rw);
        if (!(out->tenant = strdup(t->valuestring))) return bad(err, errn, "out of memory");
    }
    const cJSON *br = cJSON_GetObjectItemCaseSensitive(r, "blend_ratio");
    if (br) {
        if (!cJSON_IsNumber(br) || !(br->valuedouble >= 0 && br->valuedouble <= 1))
            return bad(err, errn, "%s.blend_ratio: must be a number in [0, 1]", rw);
        out->ratio = (float)br->valuedouble;
    }
    const cJSON *sg = cJSON_GetObjectItemCaseSensitive(r, "segments");
    if (!cJSON_IsArray(sg) || cJSON_GetArraySize(sg) == 0)
        return bad(err, errn, "%s.segments: required, a non-empty array", rw);
    size_t ns = (size_t)cJSON_GetArraySize(sg);
    if (ns > 256) return bad(err, errn, "%s.segments: %zu segments, at most 256", rw, ns);
    /* text first: BOS as a segment of its own (public), so that no reusable segment's tokens
     * depend on whether it comes first */
    const size_t bos = cJSON_GetObjectItemCaseSensitive(sg->child, "text") != NULL;
    if (!(out->segs = calloc(ns + bos, sizeof *out->segs))) return bad(err, errn, "out of memory");
    if (bos) {
        uint32_t *b = malloc(sizeof *b);
        if (!b) return bad(err, errn, "out of memory");
        *b = IKV_TOK_BOS;
        out->segs[0] = (ikv_prompt_seg){IKV_PSEG_SYSTEM, b, 1, 1, 0, 0};
        out->n_segs = 1;
    }
    size_t j = 0;
    for (const cJSON *g = sg->child; g; g = g->next, j++) {
        char w[96];
        snprintf(w, sizeof w, "%s.segments[%zu]", rw, j);
        ikv_prompt_seg *o = &out->segs[j + bos];
        out->n_segs = j + bos + 1;
        if (!cJSON_IsObject(g)) return bad(err, errn, "%s: must be an object", w);
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(g, "kind");
        if (!cJSON_IsString(k)) return bad(err, errn, "%s.kind: required, a string", w);
        if (ikv_pseg_kind_parse(k->valuestring, &o->kind))
            return bad(err, errn, "%s.kind: %s", w, ikv_errdetail());
        if (flag(g, "public", &o->is_public, w, err, errn) ||
            flag(g, "reusable", &o->reusable, w, err, errn) ||
            flag(g, "movable", &o->movable, w, err, errn))
            return -1;
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(g, "text"),
                    *tk = cJSON_GetObjectItemCaseSensitive(g, "tokens");
        if (!!tx == !!tk)
            return bad(err, errn, "%s: needs exactly one of \"text\" or \"tokens\"", w);
        uint32_t *ids = NULL;
        size_t n = 0;
        if (tx) {
            if (!cJSON_IsString(tx) || !*tx->valuestring)
                return bad(err, errn, "%s.text: must be a non-empty string", w);
            size_t cap = strlen(tx->valuestring) + 3;
            if (!(ids = malloc(cap * 4))) return bad(err, errn, "out of memory");
            o->tokens = ids;
            if (ikv_tokenizer_encode(tok, tx->valuestring, 0, 0, ids, cap, &n))
                return bad(err, errn, "%s.text: cannot encode: %s", w, ikv_errdetail());
        } else {
            if (!cJSON_IsArray(tk) || cJSON_GetArraySize(tk) == 0)
                return bad(err, errn, "%s.tokens: must be a non-empty array of token ids", w);
            size_t cap = (size_t)cJSON_GetArraySize(tk);
            if (!(ids = malloc(cap * 4))) return bad(err, errn, "out of memory");
            o->tokens = ids;
            for (const cJSON *x = tk->child; x; x = x->next, n++) {
                double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
                if (!(v >= 0 && v < vocab) || v != (double)(uint32_t)v)
                    return bad(err, errn, "%s.tokens[%zu]: not a token id < vocab %u", w, n, vocab);
                ids[n] = (uint32_t)v;
            }
        }
        o->n = n;
    }
    return 0;
}

int cli_segfile_load(const char *path, const ikv_tokenizer *tok, uint32_t vocab, cli_segfile *out,
                     char *err, size_t errn) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return bad(err, errn, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            if (cap > (64u << 20)) {
                fclose(f), free(buf);
                return bad(err, errn, "%s: larger than 64 MiB", path);
            }
            char *nb = realloc(buf, cap = cap * 2 + 65536 + 1);
            if (!nb) return fclose(f), free(buf), bad(err, errn, "out of memory");
            buf = nb;
        }
        size_t k = fread(buf + len, 1, cap - len - 1, f);
        len += k;
        if (k == 0) break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) return free(buf), bad(err, errn, "%s: read error", path);
    buf[len] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(buf, &end, 1);
    if (!root) {
        size_t off = end ? (size_t)(end - buf) : 0;
        free(buf);
        return bad(err, errn, "%s: invalid JSON near byte %zu", path, off);
    }
    free(buf);
    int arr = cJSON_IsArray(root);
    size_t nr = arr ? (size_t)cJSON_GetArraySize(root) : 1;
    int rc = 0;
    if (nr == 0) {
        rc = bad(err, errn, "%s: an empty array of requests", path);
        goto done;
    }
    if (!(out->req = calloc(nr, sizeof *out->req))) {
        rc = bad(err, errn, "out of memory");
        goto done;
    }
    const cJSON *r = arr ? root->child : root;
    for (size_t i = 0; i < nr; i++, r = r->next) {
        char rw[64], e2[400];
        if (arr)
            snprintf(rw, sizeof rw, "requests[%zu]", i);
        else
            snprintf(rw, sizeof rw, "request");
        out->n_req = i + 1;
        if (one_request(r, rw, tok, vocab, &out->req[i], e2, sizeof e2)) {
            rc = bad(err, errn, "%s: %s", path, e2);
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    if (rc) cli_segfile_free(out);
    return rc;
}
