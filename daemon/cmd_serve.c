/* cmd_serve.c - `nsad serve`: the long-lived daemon.
 *
 * Threads: main (options, start-up, then signals), the trainers (service.c:
 * 1 + min(GPUs, 16) alike, any idle one takes any run, whose claim binds
 * its GPUs or the CPU engine), the HTTP loop (server.c) and the watchdog
 * (watchdog.c). Start-up order:
 * options and daemon config (exit 78 when bad), state dir, token, run
 * registry (resuming every run left active: serviceOpen), listeners,
 * trainers, watchdog, then READY=1 to systemd. SIGTERM/SIGINT stop it:
 * every active run checkpoints and stays active on disk, so the next
 * start resumes it; signals.h says what every other signal does. */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "auth.h"
#include "commands.h"
#include "flags.h"
#include "fsutil.h"
#include "infer.h"
#include "log.h"
#include "mfu.h"
#include "paths.h"
#include "runlog.h"
#include "sdnotify.h"
#include "server.h"
#include "service.h"
#include "signals.h"
#include "stackdump.h"
#include "statelock.h"
#include "watchdog.h"
#include "yamllimit.h"
#include "yamlscalar.h"

#define DEFAULT_CONFIG "/etc/nsad/nsad.yaml"
#define DEFAULT_LISTEN "127.0.0.1:8470"

typedef struct ServeOptions {
    char config[PATH_MAX];
    int config_given;
    char listen[300];      /* "ADDR:PORT" or "none" */
    char socket[PATH_MAX]; /* path, "none", or "" for the default */
    char state_dir[PATH_MAX];
    char web_root[PATH_MAX];
    char token_file[PATH_MAX];
    int no_auth;
    long long max_body; /* the integer settings (intSettings) */
    long long max_connections;
    long long max_connections_per_client;
    long long idle_timeout_s;
    long long request_timeout_s;
    long long stop_timeout_s;
    long long model_keep_s;
    char allow_hosts[SERVER_MAX_ALLOW_HOSTS][256];
    int n_allow_hosts;
    int log_level;
    double peak_tflops; /* 0: from the table of GPU models (daemon/mfu.c) */
} ServeOptions;

static void usage(FILE *out) {
    fprintf(out,
            "usage: nsad serve [OPTIONS]\n"
            "\n"
            "Runs the training daemon: a JSON/HTTP API (proto/api.md), the dashboard, the\n"
            "trainers (1 + min(GPUs, 16) threads, any of which takes a run; a run takes\n"
            "the GPUs it names), the run queue and a watchdog.\n"
            "\n"
            "  --config FILE          daemon config (YAML; default " DEFAULT_CONFIG " when it exists)\n"
            "  --listen ADDR:PORT     TCP address (default " DEFAULT_LISTEN "; 'none' for no TCP)\n"
            "  --socket PATH          Unix socket (default $RUNTIME_DIRECTORY/nsad.sock, else\n"
            "                         $XDG_RUNTIME_DIR/nsad/nsad.sock, else /run/nsad/nsad.sock as\n"
            "                         root, else STATE_DIR/nsad.sock; nsactl looks there too; 'none')\n"
            "  --state-dir DIR        runs, checkpoints and the token (default $STATE_DIRECTORY,\n"
            "                         else $XDG_STATE_HOME/nsad, else /var/lib/nsad as root, else\n"
            "                         ~/.local/state/nsad); one nsad serve per state dir\n"
            "  --web-root DIR         dashboard files (default <binary>/../web, /usr/share/nsad/web)\n"
            "  --token-file FILE      bearer token for TCP (default <state-dir>/token; made on first start)\n"
            "  --no-auth              no token on TCP (refused unless --listen is loopback)\n"
            "  --allow-host NAME      accept this Host header too (repeatable)\n"
            "  --max-body BYTES       request body limit (default 1048576)\n"
            "  --max-connections N    open connections per listener before 429 (default 64)\n"
            "  --max-connections-per-client N\n"
            "                         open TCP connections from one address; more are refused (default 16)\n"
            "  --idle-timeout SECONDS close idle connections after it (default 30)\n"
            "  --request-timeout SECONDS\n"
            "                         close a connection whose request (headers and body) has not all\n"
            "                         arrived this long after it began, trickling or not (default 30)\n"
            "  --stop-timeout SECONDS on SIGTERM, wait this long for the run to stop; after half of\n"
            "                         it, abandon the step without a checkpoint (default 80)\n"
            "  --model-keep SECONDS   keep a sample job's checkpoint and decoder loaded this long for\n"
            "                         the next sample job (default 120; 0: load for every job)\n"
            "  --log-level LEVEL      error, warning, notice, info (default) or debug\n"
            "  --peak-tflops T        one GPU's dense bf16 matrix rate in TFLOP/s, the MFU denominator\n"
            "                         (default: from the GPU's model, proto/model.md; unknown: no MFU)\n"
            "\n"
            "Signals: SIGTERM/SIGINT checkpoint the active run and exit; SIGUSR1/SIGQUIT log\n"
            "every thread's stack; SIGHUP and other signals are logged and ignored.\n"
            "Exit status: 0 after SIGTERM/SIGINT, 1 on a runtime failure, 2 on a usage error,\n"
            "70 when the watchdog policy 'exit' stops a hung run, 75 when another nsad serve\n"
            "uses the state dir (the message names its pid and address), 78 on a bad config\n"
            "or a state dir it cannot use.\n");
}

static void setDefaults(ServeOptions *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->config, sizeof o->config, "%s", DEFAULT_CONFIG);
    snprintf(o->listen, sizeof o->listen, "%s", DEFAULT_LISTEN);
    o->max_body = 1 << 20;
    o->max_connections = 64;
    o->max_connections_per_client = 16;
    o->idle_timeout_s = 30;
    o->request_timeout_s = 30;
    o->stop_timeout_s = 80; /* inside systemd's default TimeoutStopSec of 90 s */
    o->model_keep_s = 120;
    o->log_level = LOG_LVL_INFO;
}

/* ---- values shared by flags and the config file --------------------------------- */

static int parseLogLevel(const char *v) {
    static const struct {
        const char *name;
        int level;
    } levels[] = {{"error", LOG_LVL_ERR},
                  {"warning", LOG_LVL_WARNING},
                  {"notice", LOG_LVL_NOTICE},
                  {"info", LOG_LVL_INFO},
                  {"debug", LOG_LVL_DEBUG}};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (!strcasecmp(v, levels[i].name)) return levels[i].level;
    return -1;
}

/* The integer settings by config-file key: bounds (the message names them)
 * and the ServeOptions field. */
static const struct {
    const char *key;
    long long lo, hi;
    size_t field; /* offsetof a long long */
} intSettings[] = {
    {"max_body_bytes", 1024, 1LL << 30, offsetof(ServeOptions, max_body)},
    {"max_connections", 1, 1000, offsetof(ServeOptions, max_connections)},
    {"max_connections_per_client", 1, 1000, offsetof(ServeOptions, max_connections_per_client)},
    {"request_timeout_s", 1, 3600, offsetof(ServeOptions, request_timeout_s)},
    {"idle_timeout_s", 1, 3600, offsetof(ServeOptions, idle_timeout_s)},
    {"stop_timeout_s", 1, 86400, offsetof(ServeOptions, stop_timeout_s)},
    {"model_keep_s", 0, 86400, offsetof(ServeOptions, model_keep_s)},
};

/* The other settings: the core YAML tags each takes in the config file
 * (yamlTagApply) and what it takes, for messages. */
static const struct {
    const char *key;
    int tags;
    const char *allowed;
} otherSettings[] = {
    {"listen", YTAG_STR, "ADDR:PORT or none"},
    {"socket", YTAG_STR, "a path or none"},
    {"state_dir", YTAG_STR, "a directory"},
    {"web_root", YTAG_STR, "a directory"},
    {"token_file", YTAG_STR, "a file path"},
    {"auth", YTAG_BOOL | YTAG_STR, "true or false"},
    {"allow_hosts", YTAG_STR | YTAG_SEQ, "a host name or a list of them"},
    {"peak_tflops", YTAG_INT | YTAG_FLOAT,
     "a number of TFLOP/s above 0 (one GPU's dense bf16 rate)"},
    {"log_level", YTAG_STR, "error, warning, notice, info or debug"},
};

/* What key takes, for messages, into out, and the core tags it takes in the
 * config file. Returns them, or -1 for an unknown key. */
static int settingRule(const char *key, char *out, size_t cap) {
    for (size_t i = 0; i < sizeof intSettings / sizeof intSettings[0]; i++)
        if (!strcmp(key, intSettings[i].key)) {
            snprintf(out, cap, "an integer from %lld to %lld", intSettings[i].lo,
                     intSettings[i].hi);
            return YTAG_INT;
        }
    for (size_t i = 0; i < sizeof otherSettings / sizeof otherSettings[0]; i++)
        if (!strcmp(key, otherSettings[i].key)) {
            snprintf(out, cap, "%s", otherSettings[i].allowed);
            return otherSettings[i].tags;
        }
    return -1;
}

static int copyValue(char *dst, size_t cap, const char *v) {
    return snprintf(dst, cap, "%s", v) >= (int)cap ? -1 : 0;
}

/* Applies one setting by its config-file key. Returns 0, or -1 with err
 * naming the key, the value and what is allowed. flag is the spelling used
 * in messages ("--listen" or "listen"). */
static int applySetting(ServeOptions *o, const char *key, const char *v, const char *flag, NsaError *err) {
    for (size_t i = 0; i < sizeof intSettings / sizeof intSettings[0]; i++) {
        if (strcmp(key, intSettings[i].key)) continue;
        long long *field = (long long *)((char *)o + intSettings[i].field);
        if (flagsParseInt(v, intSettings[i].lo, intSettings[i].hi, field) == 0) return 0;
        return nsaErrorf(err, "%s: '%.200s' is not allowed; allowed: an integer from %lld to %lld",
                         flag, v, intSettings[i].lo, intSettings[i].hi);
    }
    int bad = 0;
    char rule[200] = "";
    settingRule(key, rule, sizeof rule);
    const char *allowed = rule;
    char hosts[64];
    if (!strcmp(key, "listen")) {
        bad = copyValue(o->listen, sizeof o->listen, v);
    } else if (!strcmp(key, "socket")) {
        bad = copyValue(o->socket, sizeof o->socket, v);
    } else if (!strcmp(key, "state_dir")) {
        bad = copyValue(o->state_dir, sizeof o->state_dir, v) || !*v;
    } else if (!strcmp(key, "web_root")) {
        bad = copyValue(o->web_root, sizeof o->web_root, v) || !*v;
    } else if (!strcmp(key, "token_file")) {
        bad = copyValue(o->token_file, sizeof o->token_file, v) || !*v;
    } else if (!strcmp(key, "auth")) {
        bad = strcmp(v, "true") && strcmp(v, "false");
        o->no_auth = !strcmp(v, "false");
    } else if (!strcmp(key, "allow_hosts")) {
        bad = o->n_allow_hosts == SERVER_MAX_ALLOW_HOSTS || !*v ||
              copyValue(o->allow_hosts[o->n_allow_hosts], sizeof o->allow_hosts[0], v);
        if (!bad) o->n_allow_hosts++;
        snprintf(hosts, sizeof hosts, "up to %d host names", SERVER_MAX_ALLOW_HOSTS);
        allowed = hosts;
    } else if (!strcmp(key, "peak_tflops")) {
        char *end = NULL;
        errno = 0;
        double t = strtod(v, &end);
        bad = !*v || *end || errno || !(t > 0) || t > 1e6;
        if (!bad) o->peak_tflops = t;
    } else if (!strcmp(key, "log_level")) {
        int level = parseLogLevel(v);
        bad = level < 0;
        if (!bad) o->log_level = level;
    } else {
        nsaErrorf(
            err,
            "%s: unknown key; allowed: listen, socket, state_dir, web_root, token_file, auth, "
            "max_body_bytes, max_connections, max_connections_per_client, idle_timeout_s, "
            "request_timeout_s, stop_timeout_s, model_keep_s, allow_hosts, log_level, "
            "peak_tflops",
            flag);
        return -1;
    }
    if (bad) {
        nsaErrorf(err, "%s: '%.200s' is not allowed; allowed: %s", flag, v, allowed);
        return -1;
    }
    return 0;
}

/* A value as messages show it: its text (quoted when it was), or "a list",
 * "a mapping". */
static void showNode(const yaml_node_t *node, char *out, size_t cap) {
    if (node->type != YAML_SCALAR_NODE)
        snprintf(out, cap, "%s", node->type == YAML_SEQUENCE_NODE ? "a list" : "a mapping");
    else if (node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE)
        snprintf(out, cap, "%.100s", (const char *)node->data.scalar.value);
    else
        snprintf(out, cap, "\"%.100s\"", (const char *)node->data.scalar.value);
}

/* The YAML rules a job config keeps too (yamlscalar.h), for one value of
 * key (at: "FILE:LINE: "), which takes the core tags in kinds: its tag
 * honoured or refused, and a number with a leading zero or too small to
 * keep refused. Returns 0 or -1 with err. */
static int checkValue(const YamlTagList *tags, yaml_node_t *node, const char *at, const char *key,
                      int kinds, const char *allowed, NsaError *err) {
    char shown[220], plain[128], octal[32];
    showNode(node, shown, sizeof shown);
    if (yamlTagApply(tags, node, at, key, shown, kinds, allowed, err) != 0) return -1;
    if (node->type != YAML_SCALAR_NODE || node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
        !(kinds & (YTAG_INT | YTAG_FLOAT)))
        return 0;
    const char *text = (const char *)node->data.scalar.value;
    if (yamlLeadingZero(text, plain, sizeof plain, octal, sizeof octal))
        return yamlLeadingZeroError(err, at, key, shown, allowed, plain, octal);
    if (!(kinds & YTAG_FLOAT) || strspn(text, "0123456789+-.eE") != strlen(text)) return 0;
    double v = strtod(text, NULL);
    if (yamlTooSmall(text, v, DBL_MIN))
        return yamlTooSmallError(err, at, key, shown, allowed, v, DBL_MIN);
    return 0;
}

/* Reads the daemon config: a YAML mapping of the keys applySetting knows
 * (allow_hosts may be a list), held to the job config's YAML rules
 * (checkValue). Messages start "FILE:LINE: KEY: ". Returns 0 or -1 with
 * err. */
static int loadDaemonConfig(ServeOptions *o, const char *path, NsaError *err) {
    size_t len = 0;
    char *text = fsReadRegular(path, YAML_LIMIT_BYTES, &len, err);
    if (!text) return -1;
    if (yamlLimitCheck(text, len, &yamlConfigLimits, path, err) != 0) {
        free(text);
        return -1;
    }
    YamlTagList tags = {0};
    yaml_parser_t parser;
    yaml_document_t doc;
    if (yamlTagsCollect(text, len, &tags) != 0 || !yaml_parser_initialize(&parser)) {
        yamlTagsFree(&tags);
        free(text);
        nsaErrorf(err, "%.300s: out of memory", path);
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = 0;
    if (!yaml_parser_load(&parser, &doc)) {
        nsaErrorf(err, "%.300s line %zu: %s", path, parser.problem_mark.line + 1,
                  parser.problem ? parser.problem : "YAML syntax error");
        yaml_parser_delete(&parser);
        yamlTagsFree(&tags);
        free(text);
        return -1;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    char at[340], root_shown[220];
    if (root) {
        snprintf(at, sizeof at, "%.300s:%zu: ", path, root->start_mark.line + 1);
        showNode(root, root_shown, sizeof root_shown);
    }
    if (root && yamlTagApply(&tags, root, at, "config", root_shown, YTAG_MAP,
                             "a mapping of settings", err) != 0) {
        rc = -1;
    } else if (root && root->type != YAML_MAPPING_NODE) {
        nsaErrorf(err, "%.300s: the top level must be a mapping of settings", path);
        rc = -1;
    }
    for (yaml_node_pair_t *p = root && rc == 0 ? root->data.mapping.pairs.start : NULL;
         p && p < root->data.mapping.pairs.top && rc == 0; p++) {
        yaml_node_t *k = yaml_document_get_node(&doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&doc, p->value);
        if (!k || k->type != YAML_SCALAR_NODE) {
            nsaErrorf(err, "%.300s: keys must be plain words", path);
            rc = -1;
            break;
        }
        const char *key = (const char *)k->data.scalar.value;
        char flag[440], allowed[200], shown[220];
        snprintf(at, sizeof at, "%.300s:%zu: ", path, k->start_mark.line + 1);
        snprintf(flag, sizeof flag, "%s%.80s", at, key);
        showNode(k, shown, sizeof shown);
        if (yamlTagApply(&tags, k, at, key, shown, YTAG_STR, "a setting name", err) != 0) {
            rc = -1;
            break;
        }
        int kinds = settingRule(key, allowed, sizeof allowed);
        if (v) snprintf(at, sizeof at, "%.300s:%zu: ", path, v->start_mark.line + 1);
        if (kinds >= 0 && v && checkValue(&tags, v, at, key, kinds, allowed, err) != 0) {
            rc = -1;
            break;
        }
        if (v && v->type == YAML_SEQUENCE_NODE && !strcmp(key, "allow_hosts")) {
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top && rc == 0; it++) {
                yaml_node_t *item = yaml_document_get_node(&doc, *it);
                if (item) snprintf(at, sizeof at, "%.300s:%zu: ", path, item->start_mark.line + 1);
                rc = item && checkValue(&tags, item, at, key, YTAG_STR, "a host name", err) != 0
                         ? -1
                     : item && item->type == YAML_SCALAR_NODE
                         ? applySetting(o, key, (const char *)item->data.scalar.value, flag, err)
                         : nsaErrorf(err, "%s: list items must be host names", flag);
            }
        } else if (v && v->type == YAML_SCALAR_NODE) {
            rc = applySetting(o, key, (const char *)v->data.scalar.value, flag, err);
        } else {
            nsaErrorf(err, "%s: expected a single value", flag);
            rc = -1;
        }
    }
    if (rc == 0) rc = yamlTagsUnread(&tags, path, err);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    yamlTagsFree(&tags);
    free(text);
    return rc;
}

/* ---- command line ------------------------------------------------------------------ */

/* Returns 0 to go on, an exit status (EXIT_USAGE, EXIT_CONFIG), or -1 after
 * printing --help (the command then exits 0). */
static int parseArgs(ServeOptions *o, int argc, char **argv) {
    static const struct {
        const char *flag, *key;
    } valued[] = {{"--listen", "listen"},
                  {"--socket", "socket"},
                  {"--state-dir", "state_dir"},
                  {"--web-root", "web_root"},
                  {"--token-file", "token_file"},
                  {"--allow-host", "allow_hosts"},
                  {"--max-body", "max_body_bytes"},
                  {"--max-connections", "max_connections"},
                  {"--max-connections-per-client", "max_connections_per_client"},
                  {"--idle-timeout", "idle_timeout_s"},
                  {"--request-timeout", "request_timeout_s"},
                  {"--stop-timeout", "stop_timeout_s"},
                  {"--model-keep", "model_keep_s"},
                  {"--log-level", "log_level"},
                  {"--peak-tflops", "peak_tflops"}};
    /* the config file first, so that flags override it */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "nsad serve: --config needs a file\n");
                return EXIT_USAGE;
            }
            snprintf(o->config, sizeof o->config, "%s", argv[++i]);
            o->config_given = 1;
        }
    }
    NsaError err;
    if (o->config_given || access(o->config, F_OK) == 0) {
        if (loadDaemonConfig(o, o->config, &err) != 0) {
            fprintf(stderr, "nsad serve: %s\n", err.message);
            return EXIT_CONFIG;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (!strcmp(a, "--no-auth")) {
            o->no_auth = 1;
            continue;
        }
        const char *key = NULL;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            if (!strcmp(a, valued[k].flag)) key = valued[k].key;
        if (!key) {
            fprintf(stderr, "nsad serve: unknown option '%s' (see nsad serve --help)\n", a);
            return EXIT_USAGE;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "nsad serve: %s needs a value\n", a);
            return EXIT_USAGE;
        }
        if (applySetting(o, key, argv[++i], a, &err) != 0) {
            fprintf(stderr, "nsad serve: %s\n", err.message);
            return EXIT_CONFIG;
        }
    }
    return 0;
}

/* Splits "ADDR:PORT" ("[v6]:PORT" too). Returns 0 or -1. */
static int splitListen(const char *spec, char *host, size_t cap, int *port) {
    const char *colon = strrchr(spec, ':');
    if (!colon || colon == spec) return -1;
    size_t len = (size_t)(colon - spec);
    const char *start = spec;
    if (spec[0] == '[') {
        if (colon[-1] != ']') return -1;
        start++;
        len -= 2;
    } else if (memchr(spec, ':', len)) {
        return -1; /* a bare IPv6 address needs brackets */
    }
    if (len == 0 || len >= cap) return -1;
    memcpy(host, start, len);
    host[len] = '\0';
    long long p;
    if (flagsParseInt(colon + 1, 0, 65535, &p) != 0) return -1;
    *port = (int)p;
    return 0;
}

/* mkdir -p with mode for the last component. Returns 0 or -1 (errno). */
static int makeDirs(const char *path, mode_t mode) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST) return -1;
    struct stat st;
    if (stat(buf, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* The socket's directory, created when missing (the default one under
 * $XDG_RUNTIME_DIR or /run may not exist yet). Returns 0 or -1 (errno). */
static int makeSocketDir(const char *socket_path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", socket_path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    return makeDirs(dir, 0750);
}

static int isDir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void defaultWebRoot(char *out, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    out[0] = '\0';
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            char candidate[PATH_MAX + 8];
            snprintf(candidate, sizeof candidate, "%s/../web", exe);
            char real[PATH_MAX];
            if (isDir(candidate) && realpath(candidate, real) && (size_t)snprintf(out, cap, "%s", real) < cap)
                return;
        }
    }
    if (isDir("/usr/share/nsad/web")) snprintf(out, cap, "/usr/share/nsad/web");
}

static void logStacks(const char *reason) {
    char *text = stackdumpString(reason);
    if (!text) {
        logError("stack dump (%s): out of memory", reason);
        return;
    }
    logNotice("stack dump (%s):", reason);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) logNotice("  %s", line);
    free(text);
}

/* Detaches the inference worker from svc (serviceSetInfer takes its lock:
 * a trainer handed a run tells the worker about claimed GPUs), then stops
 * it. */
static void stopInfer(Service *svc) { inferStop(serviceSetInfer(svc, NULL)); }

/* Tells the service each GPU's peak matrix rate, the MFU denominator: the
 * table's value for its model, or --peak-tflops. Logs what MFU will say. */
static void setPeakFlops(Service *svc, double peak_tflops) {
    double peaks[SERVICE_MAX_GPUS];
    int n = 0;
    for (; n < SERVICE_MAX_GPUS; n++) {
        char name[256];
        NsaError err;
        if (nsaDeviceName(n, name, sizeof name, &err) != 0) break; /* no more devices (or no CUDA) */
        peaks[n] = peak_tflops > 0 ? peak_tflops * 1e12 : mfuPeakOfDevice(name);
        if (peaks[n] > 0)
            logInfo("MFU: GPU %d (%s) peaks at %.0f TFLOP/s dense bf16 (%s)", n, name, peaks[n] / 1e12,
                    peak_tflops > 0 ? "--peak-tflops" : "the table of GPU models");
        else
            logNotice("MFU: GPU %d (%s) is not in nsad's table of GPU models: its runs report no MFU "
                      "(--peak-tflops sets the rate)", n, name);
    }
    serviceSetPeakFlops(svc, peaks, n);
}

/* The bearer token for the TCP listener, from o->token_file (default
 * STATE_DIR/token), created (mode 0600) when missing. Returns 0, or -1
 * after logging why. */
static int loadToken(ServeOptions *o, char *token, size_t cap) {
    if (!o->token_file[0] &&
        snprintf(o->token_file, sizeof o->token_file, "%s/token", o->state_dir) >=
            (int)sizeof o->token_file) {
        logError("--state-dir %s: path too long", o->state_dir);
        return -1;
    }
    int created = 0;
    NsaError err = {""};
    if (authLoadOrCreateToken(o->token_file, token, cap, &created, &err) != 0) {
        logError("%s", err.message);
        return -1;
    }
    if (created) logNotice("created a new bearer token in %s (mode 0600)", o->token_file);
    return 0;
}

/* Tells the service, the state lock's description, the log and systemd
 * (READY=1) where nsad listens: host (NULL: no TCP listener) at the
 * server's port, and o->socket when unix_sock. Cannot fail (what cannot be
 * told is logged). */
static void announceReady(Service *svc, Server *srv, const ServeOptions *o, int lock_fd,
                          const char *host, int unix_sock) {
    char where[PATH_MAX + 400], url[300] = "";
    int n = 0;
    const int auth = host && !o->no_auth;
    if (host)
        snprintf(url, sizeof url, "http://%s%s%s:%d", strchr(host, ':') ? "[" : "", host,
                 strchr(host, ':') ? "]" : "", serverPort(srv));
    n += snprintf(where + n, sizeof where - (size_t)n, "%s", url);
    if (unix_sock)
        snprintf(where + n, sizeof where - (size_t)n, "%sunix:%s", host ? " and " : "", o->socket);
    serviceSetListeners(svc, url, unix_sock ? o->socket : "");
    NsaError err = {""};
    if (statelockDescribe(lock_fd, url, unix_sock ? o->socket : "", &err) != 0)
        logWarn("%s", err.message);
    logNotice("nsad %s listening on %s; state dir %s%s%s; dashboard %s", NSA_VERSION, where,
              o->state_dir, auth ? "; token in " : "", auth ? o->token_file : "",
              o->web_root[0] ? o->web_root : "(none found)");
    char status[PATH_MAX + 500];
    snprintf(status, sizeof status, "READY=1\nSTATUS=listening on %s", where);
    if (sdNotify(status) < 0)
        logWarn("sd_notify: cannot send READY=1 to $NOTIFY_SOCKET: %s", strerror(errno));
}

/* Serves the daemon's signals until one means stop (signals.h: SIGTERM, SIGINT, ...):
 * stack dumps on request, the others logged and ignored. Returns the
 * stopping signal. */
static int waitForStopSignal(void) {
    for (;;) {
        int sig = signalsWait(1000);
        if (!sig) continue;
        char buf[32];
        const char *name = signalsName(sig, buf, sizeof buf);
        switch (signalsAction(sig)) {
        case SIGNAL_DUMP_STACKS: logStacks(name); break;
        case SIGNAL_RELOAD:
            logNotice("%s: nsad serve has nothing it can reload while running; restart it to apply a new "
                      "daemon config (ignored)", name);
            break;
        case SIGNAL_IGNORE: logNotice("%s: ignored (nsad gives it no meaning)", name); break;
        case SIGNAL_STOP:
            logNotice("%s: shutting down (the active run checkpoints and resumes at the next start)", name);
            return sig;
        }
    }
}

/* ---- the command --------------------------------------------------------------------- */

int cmdServe(int argc, char **argv) {
    ServeOptions o;
    setDefaults(&o);
    int rc = parseArgs(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    logSetLevel(o.log_level);

    char host[256] = "";
    int port = 0, tcp = strcmp(o.listen, "none") != 0;
    if (tcp && splitListen(o.listen, host, sizeof host, &port) != 0) {
        logError(
            "--listen: '%s' is not allowed; allowed: ADDR:PORT (like 127.0.0.1:8470 or [::1]:8470) or none",
            o.listen);
        return EXIT_CONFIG;
    }
    if (tcp && o.no_auth && !serverIsLoopback(host)) {
        logError("--listen %s is not a loopback address: refusing to serve it without a token "
                 "(drop --no-auth / auth: false, or listen on 127.0.0.1)",
                 o.listen);
        return EXIT_CONFIG;
    }
    if (!o.state_dir[0] && pathsStateDir(o.state_dir, sizeof o.state_dir) != 0) {
        logError("the default state dir is too long a path: give --state-dir DIR");
        return EXIT_CONFIG;
    }
    if (makeDirs(o.state_dir, 0750) != 0) {
        logError("--state-dir %s: cannot create: %s", o.state_dir, strerror(errno));
        return EXIT_CONFIG;
    }
    /* One nsad per state dir, before anything reads or writes in it: a
     * second one must not touch the first one's live runs. */
    NsaError err = {""};
    int in_use = 0;
    int lock_fd = statelockAcquire(o.state_dir, &in_use, &err);
    if (lock_fd < 0) {
        logError("%s", err.message);
        return in_use ? EXIT_IN_USE : EXIT_CONFIG;
    }
    int unix_sock = strcmp(o.socket, "none") != 0;
    if (!tcp && !unix_sock) {
        logError("--listen none and --socket none: nsad needs at least one listener");
        return EXIT_CONFIG;
    }
    if (unix_sock && ((!o.socket[0] && pathsSocket(o.socket, sizeof o.socket) != 0) ||
                      makeSocketDir(o.socket) != 0)) {
        logError("cannot create the directory for the Unix socket %s: %s (give --socket PATH or "
                 "--socket none)",
                 o.socket, strerror(errno));
        return EXIT_CONFIG;
    }
    if (!o.web_root[0]) {
        defaultWebRoot(o.web_root, sizeof o.web_root);
    } else if (!isDir(o.web_root)) {
        logError("--web-root %s: not a directory; allowed: the directory holding the dashboard's index.html",
                 o.web_root);
        return EXIT_CONFIG;
    }

    char token[AUTH_TOKEN_MAX] = "";
    if (tcp && !o.no_auth && loadToken(&o, token, sizeof token) != 0) return EXIT_CONFIG;

    if (signalsBlockDaemonSignals() != 0 || signalsInstallFatal() != 0) {
        logError("cannot set up signal handling: %s", strerror(errno));
        return 1;
    }
    if (stackdumpRegisterThread("main") != 0)
        logWarn("the main thread is not in stack dumps: %s", strerror(errno));

    Service *svc = serviceOpen(o.state_dir, &err);
    if (!svc) {
        logError("state dir %s: %s", o.state_dir, err.message);
        return EXIT_CONFIG;
    }
    logSetRunSink(runlogAppend, svc->runlog); /* each run's lines into its own log too */
    setPeakFlops(svc, o.peak_tflops);
    /* from here every way out goes through `stop`: what started is stopped
     * in reverse order, the service last */
    int exit_code = 1, halt_reason = TRAIN_HALT_SHUTDOWN;
    Server *srv = NULL;
    Watchdog *wd = NULL;
    Infer *infer = inferStart((double)o.model_keep_s, &err);
    if (!infer) {
        logError("%s", err.message);
        goto stop;
    }
    serviceSetInfer(svc, infer);
    /* the nodes of a multi-node job share one token: a coordinator shows
     * the other nodes its own */
    serviceSetPeerToken(svc, tcp && !o.no_auth ? token : NULL);
    /* Device init before the API and READY=1: systemd (and whoever waits on
     * it) learns that nsad is up only once the driver has answered, and
     * the first POST of a run is checked against what it found. No GPU is
     * not an error (runs then use the CPU engine); a broken driver is
     * logged, and CUDA runs are refused. */
    NsaDeviceInfo dev;
    NsaError dev_err = {{0}};
    if (nsaDeviceProbe(&dev, &dev_err) == 0) {
        logNotice("devices: %s", dev.description);
        serviceSetDevices(svc, &dev, NULL);
    } else {
        logError("devices: the CUDA runtime failed: %s; only CPU runs will work", dev_err.message);
        serviceSetDevices(svc, &dev, dev_err.message);
    }
    ServerOptions so = {
        .listen_host = tcp ? host : NULL,
        .port = port,
        .socket_path = unix_sock ? o.socket : NULL,
        .web_root = o.web_root[0] ? o.web_root : NULL,
        .token = tcp && !o.no_auth ? token : NULL,
        .max_body = (size_t)o.max_body,
        .max_connections = (unsigned)o.max_connections,
        .max_connections_per_client = (unsigned)o.max_connections_per_client,
        .idle_timeout_s = (unsigned)o.idle_timeout_s,
        .request_timeout_s = (unsigned)o.request_timeout_s,
        .n_allow_hosts = o.n_allow_hosts,
    };
    for (int i = 0; i < o.n_allow_hosts; i++) so.allow_hosts[i] = o.allow_hosts[i];
    if (!(srv = serverStart(&so, svc, &err)) || serviceStartTrainers(svc, &err) != 0 ||
        !(wd = watchdogStart(svc, &err))) {
        logError("%s", err.message);
        goto stop;
    }

    announceReady(svc, srv, &o, lock_fd, tcp ? host : NULL, unix_sock);
    halt_reason = trainHaltReasonOfSignal(waitForStopSignal());
    sdNotify("STOPPING=1\nSTATUS=stopping: checkpointing the active run");
    exit_code = 0;

stop:
    if (srv) serverStop(srv); /* first: it ends the streams the inference jobs write */
    stopInfer(svc);
    /* a trainer not started has nothing to stop; a run it was handed stays
     * active on disk and resumes at the next start */
    if (serviceShutdown(svc, (double)o.stop_timeout_s, halt_reason) != 0) {
        logError("the trainer did not stop within %.0f s; exiting anyway (the run resumes at the next start)",
                 (double)o.stop_timeout_s);
        watchdogStop(wd);
        return 1; /* the trainer thread still runs: do not free what it uses */
    }
    watchdogStop(wd);
    logSetRunSink(NULL, NULL);
    serviceClose(svc);
    if (exit_code == 0) {
        stackdumpUnregisterThread();
        logNotice("nsad stopped");
    }
    return exit_code;
}
