/* nsactl.c - the command-line client of nsad: global options, help, and
 * dispatch to the commands. The rest of ctl/:
 *   cmdtable.c  the command table: names, synopses, help text, aliases
 *   args.c      per-command argument parsing, "did you mean" for options
 *   commands.c  the commands that ask nsad and print (start ... version)
 *   watch.c     following a run live (watch, start --watch)
 *   use.c       sample, eval and export (streams and downloads)
 *   runview.c   a run in one line (status, list, watch)
 *   format.c    durations, SI numbers, bytes, losses, tables
 *   suggest.c   the nearest words to a mistyped one
 *   api.c       one request to nsad and what its answer means (ctl.h)
 *   http.c      libcurl: the socket or TCP exchange itself (http.h) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ctlcmd.h"
#include "ctl.h"
#include "nsa.h"
#include "paths.h"

#define DEFAULT_TIMEOUT_S 30.0

static void printUsage(FILE *out) {
    fprintf(out, "usage: nsactl [OPTIONS] COMMAND [ARGS]\n\ncommands:\n");
    for (const CtlCommand *c = ctlCommands; c->name; c++) {
        char aliases[64], summary[400];
        ctlAliasesOf(c->name, aliases, sizeof aliases);
        snprintf(summary, sizeof summary, "%s%s%s%s", c->summary, aliases[0] ? " (also: " : "", aliases,
                 aliases[0] ? ")" : "");
        if (strlen(c->synopsis) > 24) fprintf(out, "  %s\n  %-24s %s\n", c->synopsis, "", summary);
        else fprintf(out, "  %-24s %s\n", c->synopsis, summary);
    }
    fprintf(out,
            "\n"
            "options (anywhere on the line):\n"
            "  --json              machine-readable output: the daemon's JSON, one document a line\n"
            "  --socket PATH       nsad's Unix socket (env NSAD_SOCKET); default: the one\n"
            "                      `nsad serve` (and `make run`) makes for this user -\n"
            "                      $XDG_RUNTIME_DIR/nsad/nsad.sock, /run/nsad/nsad.sock as root,\n"
            "                      else STATE_DIR/nsad.sock - when it exists, else the system\n"
            "                      service's /run/nsad/nsad.sock\n"
            "  --url URL           talk TCP instead, e.g. http://127.0.0.1:8470 (env NSAD_URL)\n"
            "  --token TOKEN       bearer token for TCP (env NSAD_TOKEN)\n"
            "  --token-file FILE   read the token from FILE (env NSAD_TOKEN_FILE); default\n"
            "                      STATE_DIR/token when readable\n"
            "  --state-dir DIR     nsad's state dir, for its token (env NSAD_STATE_DIR;\n"
            "                      default: nsad's for this user - $XDG_STATE_HOME/nsad,\n"
            "                      /var/lib/nsad as root, else ~/.local/state/nsad - then\n"
            "                      /var/lib/nsad)\n"
            "  --timeout S         give up on one request after S seconds (default 30; 0: never)\n"
            "  -h, --help          this help; `nsactl COMMAND --help` for one command\n"
            "  --version           nsactl's version (`nsactl version` asks nsad too)\n"
            "\n"
            "exit codes:\n"
            "  0   ok\n"
            "  1   nsad answered with an error (or the run failed, for watch)\n"
            "  2   bad command line\n"
            "  3   cannot reach nsad (no socket, connection refused, no answer in time)\n"
            "  4   not found (no such run)\n"
            "  5   conflict (the run's state does not allow it, or --no-queue and it would wait)\n"
            "  78  bad config file (missing, unreadable, or rejected by nsad)\n");
}

static void printCommandHelp(const CtlCommand *c) {
    char aliases[64];
    printf("usage: nsactl %s\n\n%s.\n", c->synopsis, c->summary);
    if (ctlAliasesOf(c->name, aliases, sizeof aliases)[0]) printf("Aliases: %s.\n", aliases);
    if (c->help[0]) printf("\n%s", c->help);
    printf("\nGlobal options (--json, --socket, --url, --token, ...) and exit codes: nsactl --help\n");
}

/* The global options nsactl takes anywhere on the line. */
typedef struct GlobalArgs {
    const char *socket, *url, *token, *token_file, *state_dir, *timeout;
    int json, help, version;
} GlobalArgs;

/* Moves global options into g and the rest (command first) into rest[].
 * Returns 0, or prints why and returns -1. */
static int splitArgs(int argc, char **argv, GlobalArgs *g, char **rest, int *n_rest) {
    struct {
        const char *name;
        const char **value;
    } valued[] = {{"--socket", &g->socket},       {"--url", &g->url},
                  {"--token", &g->token},         {"--token-file", &g->token_file},
                  {"--state-dir", &g->state_dir}, {"--timeout", &g->timeout}};
    *n_rest = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--json")) { g->json = 1; continue; }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { g->help = 1; continue; }
        if (!strcmp(arg, "--version")) { g->version = 1; continue; }
        int matched = 0;
        for (int k = 0; k < ARRAY_LEN(valued) && !matched; k++) {
            size_t n = strlen(valued[k].name);
            if (strncmp(arg, valued[k].name, n) != 0) continue;
            if (arg[n] == '=') {
                *valued[k].value = arg + n + 1;
                matched = 1;
            } else if (arg[n] == '\0') {
                if (i + 1 >= argc) {
                    fprintf(stderr, "nsactl: %s needs a value (see nsactl --help)\n", valued[k].name);
                    return -1;
                }
                *valued[k].value = argv[++i];
                matched = 1;
            }
        }
        if (!matched) rest[(*n_rest)++] = argv[i];
    }
    return 0;
}

/* Fills ctl->target from the options and the environment. Returns 0, or
 * prints why and returns -1. */
static int chooseTarget(Ctl *ctl, const GlobalArgs *g) {
    char err[HTTP_ERR_MAX];
    const char *env_url = getenv("NSAD_URL"), *env_socket = getenv("NSAD_SOCKET");
    if (env_url && !*env_url) env_url = NULL;
    if (env_socket && !*env_socket) env_socket = NULL;
    if (g->url && g->socket) {
        fprintf(stderr, "nsactl: --url and --socket both given; pick one\n");
        return -1;
    }
    if (!g->url && !g->socket && env_url && env_socket) {
        fprintf(stderr, "nsactl: NSAD_URL (%s) and NSAD_SOCKET (%s) are both set; unset one or "
                        "pass --url / --socket\n", env_url, env_socket);
        return -1;
    }
    const char *url = g->url ? g->url : (g->socket ? NULL : env_url);
    const char *socket = g->socket ? g->socket : (url ? NULL : env_socket);
    int rc;
    if (url) {
        rc = httpTargetUrl(&ctl->target, url, err, sizeof err);
    } else if (socket) {
        rc = httpTargetSocket(&ctl->target, socket, err, sizeof err);
    } else {
        char path[HTTP_ADDR_MAX];
        httpDefaultSocket(path, sizeof path);
        rc = httpTargetSocket(&ctl->target, path, err, sizeof err);
    }
    if (rc) fprintf(stderr, "nsactl: %s\n", err);
    return rc;
}

/* Fills ctl from the global options and the environment: output mode, state
 * dir, timeout, target, token. Returns CTL_OK or the exit code after
 * printing why not. */
static int setupCtl(Ctl *ctl, const GlobalArgs *g, const CtlCommand *cmd) {
    memset(ctl, 0, sizeof *ctl);
    ctl->json = g->json;
    ctl->tty = isatty(STDOUT_FILENO);
    const char *env_state = getenv("NSAD_STATE_DIR");
    ctl->state_dir = g->state_dir ? g->state_dir : (env_state && *env_state ? env_state : NULL);
    if (!ctl->state_dir) {
        ctl->state_dir_default = 1;
        if (pathsStateDir(ctl->state_dir_buf, sizeof ctl->state_dir_buf) != 0)
            snprintf(ctl->state_dir_buf, sizeof ctl->state_dir_buf, "%s", PATHS_SYSTEM_STATE_DIR);
        ctl->state_dir = ctl->state_dir_buf;
    }
    double timeout_s = DEFAULT_TIMEOUT_S;
    if (g->timeout) {
        char *end = NULL;
        errno = 0;
        timeout_s = strtod(g->timeout, &end);
        if (errno || end == g->timeout || *end || !(timeout_s >= 0) || timeout_s > 86400) {
            fprintf(stderr, "nsactl: --timeout '%s' is not valid; allowed: seconds from 0 (no limit) to 86400\n",
                    g->timeout);
            return CTL_EXIT_USAGE;
        }
    }
    if (chooseTarget(ctl, g)) return CTL_EXIT_USAGE;
    ctl->target.timeout_ms = (long)(timeout_s * 1000.0);
    /* The Unix socket needs no token; the dashboard URL carries one even when
     * nsactl itself talks over the socket. */
    int wants_token = !ctl->target.socket_path[0] || !strcmp(cmd->name, "dashboard");
    if (!wants_token && (g->token || g->token_file)) {
        fprintf(stderr, "nsactl: --token/--token-file apply to TCP (--url) only; the Unix socket "
                        "needs none\n");
        return CTL_EXIT_USAGE;
    }
    if (wants_token && ctlResolveToken(ctl, g->token, g->token_file)) return CTL_EXIT_ERROR;
    return CTL_OK;
}

/* Everything main does once argv has room to be split. Returns the exit code. */
static int nsactlMain(int argc, char **argv, char **rest) {
    GlobalArgs g = {0};
    int n_rest = 0;
    if (splitArgs(argc, argv, &g, rest, &n_rest)) return CTL_EXIT_USAGE;
    const CtlCommand *cmd = NULL;
    int asks_help = n_rest > 0 && !strcmp(rest[0], "help");
    const char *name = asks_help ? (n_rest > 1 ? rest[1] : NULL) : (n_rest > 0 ? rest[0] : NULL);
    if (name && !(cmd = ctlFindCommand(name))) {
        ctlUnknownCommand(name);
        return CTL_EXIT_USAGE;
    }
    if (asks_help || g.help) {
        if (cmd) printCommandHelp(cmd);
        else printUsage(stdout);
        return CTL_OK;
    }
    if (g.version) {
        printf("nsactl %s\n", NSA_VERSION);
        return CTL_OK;
    }
    if (!cmd) {
        printUsage(stderr);
        return CTL_EXIT_USAGE;
    }
    Ctl ctl;
    int rc = setupCtl(&ctl, &g, cmd);
    if (rc != CTL_OK) return rc;
    if (httpGlobalInit()) {
        fprintf(stderr, "nsactl: libcurl failed to initialise\n");
        return CTL_EXIT_ERROR;
    }
    rc = cmd->run(&ctl, n_rest - 1, rest + 1);
    httpGlobalCleanup();
    return rc;
}

int main(int argc, char **argv) {
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) {
        fprintf(stderr, "nsactl: out of memory\n");
        return CTL_EXIT_ERROR;
    }
    int rc = nsactlMain(argc, argv, rest);
    free(rest);
    return rc;
}
