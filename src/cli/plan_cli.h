/*
 * The parts of `isokv plan` beyond the walk: the frontier, algorithmic jumps (plan_views.c)
 * and the measured mode on isokv's own engine (plan_measured.c). Each prints its report (text
 * or JSON) and returns an exit code.
 */
#ifndef ISOKV_CLI_PLAN_CLI_H
#define ISOKV_CLI_PLAN_CLI_H

#include <cjson/cJSON.h>

#include "isokv/plan.h"

/* The fields of a `steps` entry of the JSON, for any step-shaped point. */
cJSON *plan_step_json(const ikv_plan_step *s, int first);
/* A configuration as a JSON object. */
cJSON *plan_config_json(const ikv_plan_config *c);

/* isokv plan --frontier [--json] [--plot FILE]. */
int plan_frontier_main(const char *cmd, const ikv_plan_params *p, const ikv_model_spec *m,
                       const ikv_hw_spec *hw, int json, const char *plot);

/* isokv plan --jump LIST [--json] [--plot FILE]. */
int plan_jump_main(const char *cmd, const ikv_plan_params *p, const ikv_model_spec *m,
                   const ikv_hw_spec *hw, const ikv_plan_jumps *j, int json, const char *plot);

typedef struct plan_measured_opts {
    const char *engine_model;  /* llama2.c checkpoint, or NULL */
    const char *engine_config; /* generated model config name when no checkpoint ("small") */
    uint32_t prompt, output;   /* request shape */
    uint32_t repeat;           /* measurements per point; the best is kept */
    double hit;                /* prefix-cache hit ratio of the "hit" configurations */
    uint32_t batch;            /* batch of the batched configurations (0 = 4; 1 = none) */
    int spec;                  /* 0: prompt-lookup speculation measured; -1: not (--spec none) */
} plan_measured_opts;

/* isokv plan --measured [--json] [--plot FILE]. */
int plan_measured_main(const char *cmd, const plan_measured_opts *o, int json, const char *plot);

#endif
