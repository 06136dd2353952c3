/*
 * What the files of plan/ share: an evaluation context (parameters checked once, the draft
 * model looked up, the baseline's TP found) and the evaluation of one configuration on it, so
 * that the frontier can evaluate tens of thousands of configurations without re-checking.
 */
#ifndef ISOKV_PLAN_INTERNAL_H
#define ISOKV_PLAN_INTERNAL_H

#include "isokv/plan.h"

typedef struct ikv__plan_ctx {
    const ikv_plan_params *p;
    const ikv_model_spec *m, *draft;
    const ikv_hw_spec *hw;
    uint32_t base_tp; /* fewest GPUs of one node that hold the baseline */
} ikv__plan_ctx;

/* Checks p, looks up the draft, finds base_tp. Returns 0 or an error as ikv_plan_walk. */
int ikv__plan_setup(const ikv_plan_params *p, const ikv_model_spec *model, const ikv_hw_spec *hw,
                    ikv__plan_ctx *x);

/* Evaluates configuration c on x into *out as ikv_plan_eval does. Does not allocate. */
void ikv__plan_eval(const ikv__plan_ctx *x, const ikv_plan_config *c, ikv_plan_step *out);

#endif
