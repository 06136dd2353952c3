/*
 * Structured request files for `isokv run --segments` (cli_segments.c).
 */
#ifndef ISOKV_CLI_SEGMENTS_H
#define ISOKV_CLI_SEGMENTS_H

#include <stddef.h>

#include "isokv/model.h"

typedef struct cli_segreq {
    ikv_prompt_seg *segs; /* tokens owned (malloc'd) */
    size_t n_segs;
    char *tenant; /* NULL: none given */
    float ratio;  /* "blend_ratio", -1 when absent */
} cli_segreq;

typedef struct cli_segfile {
    cli_segreq *req;
    size_t n_req;
} cli_segfile;

/* Parses a request file (one object, or an array of them). 0, or -1 with err naming the file
 * and the field. */
int cli_segfile_load(const char *path, const ikv_tokenizer *tok, uint32_t vocab, cli_segfile *out,
                     char *err, size_t errn);
void cli_segfile_free(cli_segfile *f);

#endif
