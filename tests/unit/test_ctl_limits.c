/* test_ctl_limits.c - the limits nsactl keeps in step with nsad without
 * linking the daemon module that defines them: start's largest config file
 * (CTL_CONFIG_FILE_LIMIT, ctl/ctlcmd.h) is the daemon's YAML_LIMIT_BYTES
 * (daemon/yamllimit.h), so a file nsactl sends is never refused for its
 * size and one it refuses would have been; sample's most continuations
 * (CTL_SAMPLE_MAX_N) are the daemon's SAMPLE_MAX_PROMPTS (daemon/sampler.h).
 * A mismatch fails the build of this test (the static assertions), not just
 * its run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sampler.h"
#include "yamllimit.h"
#include "../../ctl/ctlcmd.h"

_Static_assert(
    CTL_CONFIG_FILE_LIMIT == YAML_LIMIT_BYTES,
    "CTL_CONFIG_FILE_LIMIT (ctl/ctlcmd.h) must equal YAML_LIMIT_BYTES (daemon/yamllimit.h)");

_Static_assert(CTL_SAMPLE_MAX_N == SAMPLE_MAX_PROMPTS,
               "CTL_SAMPLE_MAX_N (ctl/ctlcmd.h) must equal SAMPLE_MAX_PROMPTS (daemon/sampler.h)");

static void test_config_file_limit(void **state) {
    (void)state;
    assert_int_equal(CTL_CONFIG_FILE_LIMIT, YAML_LIMIT_BYTES);
    assert_int_equal(CTL_SAMPLE_MAX_N, SAMPLE_MAX_PROMPTS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_file_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
