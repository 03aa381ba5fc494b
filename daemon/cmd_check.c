/* cmd_check.c - `nsad check CONFIG`: validates a job config and prints it
 * resolved (every key, defaults filled in) as YAML on stdout. Warnings go to
 * stderr. Exit 0 when valid, 78 (EX_CONFIG) with one error line when not,
 * 2 on a usage error. CONFIG "-" reads the config from stdin. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "config.h"
#include "yamllimit.h"

static void checkUsage(FILE *out) {
    fprintf(out,
            "usage: nsad check CONFIG\n"
            "\n"
            "Validates a job config (YAML, or JSON) and prints it resolved: every key\n"
            "with its value, defaults filled in. CONFIG may be - for stdin.\n"
            "Warnings (ignored prototype keys) go to stderr.\n"
            "Exit status: 0 valid, 78 invalid, 2 usage error.\n");
}

/* Reads stdin into a malloc'd buffer, at most max bytes: one more is read
 * so that a longer input is seen (*len > max) without reading all of it.
 * Returns NULL on failure. */
static char *readStdin(size_t max, size_t *len) {
    char *buf = malloc(max + 1);
    size_t n = 0, got = 1;
    while (buf && n < max + 1 && got > 0) {
        got = fread(buf + n, 1, max + 1 - n, stdin);
        n += got;
    }
    if (buf && ferror(stdin)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int cmdCheck(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            checkUsage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "nsad check: unknown option '%s'\n", argv[i]);
            checkUsage(stderr);
            return EXIT_USAGE;
        }
        if (path) {
            fprintf(stderr, "nsad check: one CONFIG only (got '%s' and '%s')\n", path, argv[i]);
            return EXIT_USAGE;
        }
        path = argv[i];
    }
    if (!path) {
        checkUsage(stderr);
        return EXIT_USAGE;
    }

    JobConfig *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        fprintf(stderr, "nsad check: out of memory\n");
        return 1;
    }
    configDefaults(cfg);
    NsaError err = {{0}};
    int rc;
    if (!strcmp(path, "-")) {
        size_t len = 0;
        char *text = readStdin(YAML_LIMIT_BYTES, &len);
        if (!text) {
            fprintf(stderr, "nsad check: cannot read stdin: %s\n", strerror(errno));
            free(cfg);
            return 1;
        }
        /* over the limit: configLoadString names it */
        rc = configLoadString(cfg, text, len, &err);
        free(text);
    } else {
        rc = configLoadFile(cfg, path, &err);
    }
    for (int i = 0; i < cfg->n_warnings; i++)
        fprintf(stderr, "%s: warning: %s\n", strcmp(path, "-") ? path : "stdin", cfg->warnings[i]);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err.message);
        free(cfg);
        return EXIT_CONFIG;
    }
    char *yaml = configToYaml(cfg);
    free(cfg);
    if (!yaml) {
        fprintf(stderr, "nsad check: out of memory\n");
        return 1;
    }
    fputs(yaml, stdout);
    free(yaml);
    return 0;
}
