/*
 * Fuzz harness: the planner's JSON configuration (isokv plan --config) through
 * ikv_plan_params_load_json and ikv_plan_params_check; when both accept it, the walk, the curve
 * and the router run on it for each request class (docs/fuzzing.md). The input is the file.
 */
#include "fuzz_util.h"

#include "isokv/cost.h"
#include "isokv/plan.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_file("plan", data, size);
    if (!path) return 0;
    ikv_plan_params p;
    ikv_plan_params_default(&p);
    if (ikv_plan_params_load_json(&p, path) || ikv_plan_params_check(&p)) return 0;
    const ikv_model_spec *m;
    const ikv_hw_spec *hw;
    if (ikv_model_lookup("llama3-70b", &m) || ikv_hw_lookup("h100", &hw)) abort();
    ikv_plan_result r;
    if (ikv_plan_walk(&p, m, hw, &r)) return 0;
    if (r.knee < 0 || r.knee >= IKV_PLAN_STEPS || r.hard_cap < 0 || r.hard_cap >= IKV_PLAN_STEPS)
        abort();
    ikv_plan_point pts[128];
    (void)ikv_plan_curve(&p, m, hw, pts, 128);
    for (int cls = 0; cls < 3; cls++) {
        ikv_route_req req = {
            .cls = (ikv_req_class)cls, .slo_s = 0.5, .budget_gpu_s = 0, .allow_poll = cls == 2};
        ikv_route_decision d;
        ikv_plan_route(&p, &r, &req, &d);
        if (d.step < 0 || d.step >= IKV_PLAN_STEPS) abort();
    }
    return 0;
}
