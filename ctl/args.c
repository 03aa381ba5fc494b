/* args.c - nsactl's per-command argument parsing (see args.h). */
#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctlcmd.h"
#include "suggest.h"

int argsParse(const char *cmd, int argc, char **argv, const ArgsOption *opts, int n_opts,
              const char **pos, int min_pos, int max_pos, int *n_pos) {
    *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] == '-' && arg[1] == '-' && arg[2]) {
            const char *eq = strchr(arg, '=');
            size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
            const ArgsOption *opt = NULL;
            for (int k = 0; k < n_opts; k++)
                if (strlen(opts[k].name) == name_len && !strncmp(opts[k].name, arg, name_len))
                    opt = &opts[k];
            if (!opt) {
                char typed[80];
                const char *names[ARGS_MAX_OPTIONS];
                int n_names = 0;
                snprintf(typed, sizeof typed, "%.*s", (int)name_len, arg);
                for (int k = 0; k < n_opts && n_names < ARRAY_LEN(names); k++)
                    names[n_names++] = opts[k].name;
                argsUnknownOption(cmd, typed, names, n_names);
                return -1;
            }
            if (opt->flag) {
                if (eq) {
                    fprintf(stderr, "nsactl %s: %s takes no value\n", cmd, opt->name);
                    return -1;
                }
                *opt->flag = 1;
            } else if (eq) {
                *opt->value = eq + 1;
            } else if (i + 1 < argc) {
                *opt->value = argv[++i];
            } else {
                fprintf(stderr, "nsactl %s: %s needs a value\n", cmd, opt->name);
                return -1;
            }
        } else if (arg[0] == '-' && arg[1] && strcmp(arg, "-") != 0) {
            fprintf(stderr, "nsactl %s: unknown option '%s' (see nsactl %s --help)\n", cmd, arg,
                    cmd);
            return -1;
        } else {
            if (*n_pos == max_pos) {
                fprintf(stderr, "nsactl %s: unexpected argument '%s' (see nsactl %s --help)\n", cmd,
                        arg, cmd);
                return -1;
            }
            pos[(*n_pos)++] = arg;
        }
    }
    if (*n_pos < min_pos) {
        const CtlCommand *c = ctlFindCommand(cmd);
        fprintf(stderr, "nsactl %s: missing argument; usage: nsactl %s\n", cmd,
                c ? c->synopsis : cmd);
        return -1;
    }
    return 0;
}

int argsParseInterval(const char *cmd, const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= 0.05) || v > 3600) {
        fprintf(stderr,
                "nsactl %s: --interval '%s' is not valid; allowed: seconds from 0.05 to 3600\n",
                cmd, text);
        return -1;
    }
    *out = v;
    return 0;
}

int argsParseCount(const char *cmd, const char *opt, const char *text, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < 0) {
        fprintf(stderr, "nsactl %s: %s '%s' is not valid; allowed: an integer >= 0\n", cmd, opt,
                text);
        return -1;
    }
    *out = v;
    return 0;
}

int argsParseNone(const char *cmd, int argc, char **argv) {
    const char *pos[1];
    int n_pos;
    return argsParse(cmd, argc, argv, NULL, 0, pos, 0, 0, &n_pos);
}

void argsUnknownOption(const char *cmd, const char *typed, const char *const *opts, int n_opts) {
    /* the command's options and the global ones (nsactl.c) */
    static const char *const global[] = {"--json",      "--help",    "--socket",
                                         "--url",       "--token",   "--token-file",
                                         "--state-dir", "--timeout", "--version"};
    const char *names[ARGS_MAX_OPTIONS + ARRAY_LEN(global)], *close[SUGGEST_MAX];
    size_t n = 0;
    for (int k = 0; k < n_opts && k < ARGS_MAX_OPTIONS; k++)
        names[n++] = opts[k];
    for (int k = 0; k < ARRAY_LEN(global); k++)
        names[n++] = global[k];
    char hint[256] = "", list[200];
    const int n_close = suggestWords(typed, names, n, close);
    if (n_close)
        snprintf(hint, sizeof hint, "; did you mean %s?",
                 suggestList(close, n_close, list, sizeof list));
    fprintf(stderr, "nsactl %s: unknown option '%s'%s (see nsactl %s --help)\n", cmd, typed, hint,
            cmd);
}
