#include "cli.h"
#include "plan_cli.h"
int plan_measured_main(const char *cmd, const plan_measured_opts *o, int json, const char *plot) {
    (void)o; (void)json; (void)plot;
    return cli_fail(cmd, "--measured: not yet");
}
