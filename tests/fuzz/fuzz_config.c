/* fuzz_config.c - libFuzzer harness for the job config loader
 * (daemon/config.c, daemon/yamllimit.c): any bytes, as an API body or a
 * file would bring them.
 *
 * Beyond "no crash, no sanitizer report, no timeout", it checks what the
 * loader promises: an error is one line; a config that loads prints
 * (configToYaml) as YAML that loads again to the same config hash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static JobConfig cfg, again;
    NsaError err = {{0}};
    configDefaults(&cfg);
    if (configLoadString(&cfg, (const char *)data, size, &err) != 0) {
        if (!err.message[0] || strchr(err.message, '\n')) {
            fprintf(stderr, "fuzz_config: an error that is not one line: '%s'\n", err.message);
            abort();
        }
        return 0;
    }
    char *yaml = configToYaml(&cfg);
    if (!yaml) abort();
    configDefaults(&again);
    if (configLoadString(&again, yaml, strlen(yaml), &err) != 0) {
        fprintf(stderr, "fuzz_config: the resolved config does not load again: %s\n%s\n", err.message, yaml);
        abort();
    }
    if (configHash(&cfg) != configHash(&again)) {
        fprintf(stderr, "fuzz_config: the resolved config loads as another config\n%s\n", yaml);
        abort();
    }
    free(yaml);
    return 0;
}
