/* commands.c - the nsactl commands that ask nsad and print: start, status,
 * list, front, halt, resume, delete, metrics, events, logs (streamed),
 * stacks, dashboard, version, and watch's argument handling (the
 * following itself is watch.c). Their names, synopses and help text are
 * the table in cmdtable.c; sample, eval and export are use.c. */
#include "ctlcmd.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "format.h"
#include "nsa.h"
#include "runview.h"
#include "suggest.h"
#include "watch.h"

/* Prints one "label  value" line of `status`. */
static void statusLine(const char *label, const char *value) {
    printf("  %-11s %s\n", label, value);
}

/* Data parallelism: the job's rank count and a line per rank of the node
 * (its device, step time, communication and the share the backward hid,
 * its phase while the run is active). Nothing for a run of one rank. */
static void printRanks(const cJSON *run) {
    double world = 0;
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(run, "ranks");
    if (!ctlHasNumber(run, "world", &world) || world < 2 || !cJSON_IsArray(ranks)) return;
    char line[512], a[64], b[64], c[64];
    if (cJSON_GetArraySize(ranks) < (int)world)
        snprintf(line, sizeof line, "%.0f (%d on this node)", world, cJSON_GetArraySize(ranks));
    else
        snprintf(line, sizeof line, "%.0f", world);
    statusLine("ranks", line);
    const cJSON *r;
    cJSON_ArrayForEach(r, ranks) {
        double rank = 0, device = -1, v = 0;
        ctlHasNumber(r, "rank", &rank);
        int have_device = ctlHasNumber(r, "device", &device);
        snprintf(a, sizeof a, "-");
        snprintf(b, sizeof b, "-");
        snprintf(c, sizeof c, "-");
        if (ctlHasNumber(r, "step_s", &v)) snprintf(a, sizeof a, "%.1f ms", v * 1e3);
        if (ctlHasNumber(r, "comm_s", &v)) snprintf(b, sizeof b, "%.1f ms", v * 1e3);
        if (ctlHasNumber(r, "overlap", &v)) snprintf(c, sizeof c, "%.0f%%", v * 100.0);
        int used = snprintf(line, sizeof line, "%s%-3.0f step %s   comm %s (%s hidden)",
                            have_device ? "gpu " : "cpu ", have_device ? device : rank, a, b, c);
        const char *phase = ctlString(r, "phase", NULL);
        if (phase && used > 0 && (size_t)used < sizeof line)
            snprintf(line + used, sizeof line - (size_t)used, "   %s", phase);
        char label[32];
        snprintf(label, sizeof label, "  rank %.0f", rank);
        statusLine(label, line);
    }
}

static void printRunDetails(const cJSON *run) {
    char a[64], b[64], c[64], line[512];
    double v = 0, w = 0;
    const char *id = ctlString(run, "id", "?");
    const char *name = ctlString(run, "name", id);
    if (strcmp(name, id)) snprintf(line, sizeof line, "%s (%s)", id, name);
    else snprintf(line, sizeof line, "%s", id);
    statusLine("run", line);

    const char *state = ctlString(run, "state", "?");
    const char *phase = ctlString(run, "phase", NULL);
    if (phase && ctlHasNumber(run, "phase_age_s", &v))
        snprintf(line, sizeof line, "%s (phase %s for %s)", state, phase, formatDuration(v, a, sizeof a));
    else
        snprintf(line, sizeof line, "%s", state);
    statusLine("state", line);

    int have_step = ctlHasNumber(run, "step", &v);
    if (!have_step) snprintf(line, sizeof line, "-");
    else if (ctlHasNumber(run, "total_steps", &w) && w > 0)
        snprintf(line, sizeof line, "%.0f / %.0f (%.1f%%)", v, w, 100.0 * v / w);
    else snprintf(line, sizeof line, "%.0f", v);
    statusLine("step", line);

    int have_loss = ctlHasNumber(run, "loss", &v);
    formatLoss(v, have_loss, a, sizeof a);
    int have_val = ctlHasNumber(run, "val_loss", &v);
    formatLoss(v, have_val, b, sizeof b);
    int have_bpb = ctlHasNumber(run, "bits_per_byte", &v);
    formatLoss(v, have_bpb, c, sizeof c);
    snprintf(line, sizeof line, "%s   val %s   bits/byte %s", a, b, c);
    statusLine("loss", line);

    snprintf(a, sizeof a, "-");
    snprintf(b, sizeof b, "-");
    if (ctlHasNumber(run, "lr", &v)) snprintf(a, sizeof a, "%.3g", v);
    if (ctlHasNumber(run, "grad_norm", &v)) snprintf(b, sizeof b, "%.3g", v);
    snprintf(line, sizeof line, "%s   grad norm %s", a, b);
    statusLine("lr", line);

    snprintf(a, sizeof a, "-");
    snprintf(c, sizeof c, "-");
    if (ctlHasNumber(run, "toks_per_s", &v)) formatSi(v, a, sizeof a);
    if (ctlHasNumber(run, "mfu", &v)) snprintf(c, sizeof c, "%.1f%%", 100.0 * v);
    w = -1;
    ctlHasNumber(run, "eta_s", &w);
    snprintf(line, sizeof line, "%s tok/s   MFU %s   ETA %s", a, c, formatDuration(w, b, sizeof b));
    statusLine("speed", line);
    if (ctlHasNumber(run, "elapsed_s", &v)) statusLine("elapsed", formatDuration(v, a, sizeof a));

    if (ctlHasNumber(run, "mem_bytes", &v)) statusLine("memory", formatBytes(v, a, sizeof a));
    if (ctlHasNumber(run, "heartbeat_age_s", &v)) {
        snprintf(line, sizeof line, "%s ago", formatDuration(v, a, sizeof a));
        statusLine("heartbeat", line);
    }
    if (ctlHasNumber(run, "last_checkpoint_step", &v)) {
        snprintf(line, sizeof line, "step %.0f", v);
        statusLine("checkpoint", line);
    }
    char where[96];
    ctlRunDevice(run, where, sizeof where);
    snprintf(line, sizeof line, "%s %s", where, ctlString(run, "precision", "-"));
    if (ctlHasNumber(run, "restarts", &v) && v > 0)
        snprintf(line + strlen(line), sizeof line - strlen(line), "   restarts %.0f", v);
    statusLine("device", line);
    printRanks(run);

    double created = 0, started = 0, ended = 0;
    ctlHasNumber(run, "created_at", &created);
    ctlHasNumber(run, "started_at", &started);
    ctlHasNumber(run, "ended_at", &ended);
    statusLine("created", formatTimestamp(created, a, sizeof a));
    if (started > 0) statusLine("started", formatTimestamp(started, a, sizeof a));
    if (ended > 0) statusLine("ended", formatTimestamp(ended, a, sizeof a));
    const char *anomaly = ctlString(run, "anomaly", NULL);
    if (anomaly) statusLine("anomaly", anomaly);
    const char *error = ctlString(run, "error", NULL);
    if (error) statusLine("error", error);
    const char *from = ctlString(run, "init_from", NULL);
    if (from) statusLine("init from", from);
    statusLine("out_dir", ctlString(run, "out_dir", "-"));
}

/* ---- start ------------------------------------------------------------------- */

/* Reads a whole config file ("-" is stdin). Returns a malloc'd NUL-terminated
 * buffer (caller frees), or NULL after printing why. */
static char *readConfigFile(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "nsactl start: config file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    /* One byte past the limit tells "exactly the limit" from "too large". */
    char *buf = malloc(CTL_CONFIG_FILE_LIMIT + 2);
    if (!buf) {
        if (f != stdin) fclose(f);
        fprintf(stderr, "nsactl start: out of memory reading %s\n", path);
        return NULL;
    }
    errno = 0;
    size_t n = fread(buf, 1, CTL_CONFIG_FILE_LIMIT + 1, f);
    buf[n] = '\0';
    int read_error = ferror(f) ? (errno ? errno : EIO) : 0;
    if (f != stdin) fclose(f);
    const char *problem = NULL;
    if (read_error) problem = strerror(read_error);
    else if (n > CTL_CONFIG_FILE_LIMIT)
        problem = "larger than 1 MiB, the most nsad accepts; a job config is a short YAML file";
    else if (strspn(buf, " \t\r\n") >= n) problem = "empty";
    if (problem) {
        fprintf(stderr, "nsactl start: config file %s: %s\n", path, problem);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int waitWhileState(Ctl *ctl, const char *id, const char *transient, char *state_out, size_t cap);
static int runCall(Ctl *ctl, const char *method, const char *id, CtlReply *reply);

/* Waits until a queued run took the trainer: 0 once it left queued (and
 * starting) for running or an end; prints where it got unless --json.
 * A run deleted while it waited is a failure (4, from the 404). */
static int waitForStart(Ctl *ctl, const char *id, char *state, size_t cap) {
    int rc = CTL_OK;
    if (!strcmp(state, "queued")) {
        if (!ctl->json) {
            printf("waiting for run %s to leave the queue\n", id);
            fflush(stdout);
        }
        rc = waitWhileState(ctl, id, "queued", state, cap);
    }
    if (rc == CTL_OK && !strcmp(state, "starting")) rc = waitWhileState(ctl, id, "starting", state, cap);
    return rc;
}

/* Appends key=value (escaped) to path's query. Returns 0, or prints that
 * the option (--key, '_' as '-') is too long (allowed: what it takes) and
 * returns -1. */
static int addQuery(char *path, size_t cap, const char *key, const char *value,
                    const char *allowed) {
    char escaped[3 * PATH_MAX];
    const size_t used = strlen(path);
    if (httpEscape(value, escaped, sizeof escaped) ||
        snprintf(path + used, cap - used, "%s%s=%s", strchr(path, '?') ? "&" : "?", key, escaped) >=
            (int)(cap - used)) {
        char option[64];
        snprintf(option, sizeof option, "%s", key);
        for (char *c = option; *c; c++)
            if (*c == '_') *c = '-';
        fprintf(stderr, "nsactl start: --%s is too long; allowed: %s\n", option, allowed);
        return -1;
    }
    return 0;
}

int ctlCmdStart(Ctl *ctl, int argc, char **argv) {
    const char *name = NULL, *interval = NULL, *nodes = NULL, *gpus = NULL, *init_from = NULL;
    int watch = 0, wait = 0, no_queue = 0;
    const ArgsOption opts[] = {{"--name", &name, NULL},         {"--watch", NULL, &watch},
                               {"--interval", &interval, NULL}, {"--nodes", &nodes, NULL},
                               {"--wait", NULL, &wait},         {"--no-queue", NULL, &no_queue},
                               {"--gpus", &gpus, NULL},         {"--init-from", &init_from, NULL}};
    const char *pos[1];
    int n_pos;
    if (argsParse("start", argc, argv, opts, ARRAY_LEN(opts), pos, 1, 1, &n_pos))
        return CTL_EXIT_USAGE;
    double interval_s = 1.0;
    if (interval && argsParseInterval("start", interval, &interval_s)) return CTL_EXIT_USAGE;
    /* a checkpoint path goes absolute: the daemon does not share our
     * working directory (anything without a '/' is a run id, as for sample) */
    char init_abs[PATH_MAX];
    if (init_from &&
        (strchr(init_from, '/') || !strcmp(init_from, ".") || !strcmp(init_from, ".."))) {
        if (!realpath(init_from, init_abs)) {
            fprintf(stderr, "nsactl start: --init-from %s: %s\n", init_from, strerror(errno));
            return CTL_EXIT_USAGE;
        }
        init_from = init_abs;
    } else if (init_from && ctlCheckRunId(init_from)) {
        return CTL_EXIT_USAGE;
    }
    /* the daemon checks every value */
    char path[4 * PATH_MAX] = "/api/v1/runs";
    if ((name && addQuery(path, sizeof path, "name", name, "1-64 of A-Z a-z 0-9 . _ -")) ||
        (nodes && addQuery(path, sizeof path, "nodes", nodes, "HOST:PORT,... of up to 32 nodes")) ||
        (gpus &&
         addQuery(path, sizeof path, "gpus", gpus, "all, a GPU count, or ordinals like 0,2")) ||
        (init_from && addQuery(path, sizeof path, "init_from", init_from, "a run id or a path")) ||
        (no_queue &&
         addQuery(path, sizeof path, "queue", "false", "false"))) /* busy: 409, exit 5 */
        return CTL_EXIT_USAGE;
    size_t len = 0;
    char *body = readConfigFile(pos[0], &len);
    if (!body) return CTL_EXIT_CONFIG;
    /* The daemon reads JSON bodies strictly and anything else as YAML;
     * label the file by what it is so a JSON typo gets a JSON error. */
    size_t ext = strlen(pos[0]);
    const char *first = body + strspn(body, " \t\r\n");
    int is_json = (ext > 5 && !strcmp(pos[0] + ext - 5, ".json")) || *first == '{';
    CtlReply reply;
    int rc = ctlCall(ctl, "POST", path, body, len, is_json ? "application/json" : "application/yaml",
                     1, &reply);
    free(body);
    if (rc != CTL_OK) return rc;
    const char *id = ctlString(reply.json, "id", NULL);
    if (!id) {
        fprintf(stderr, "nsactl start: the daemon's answer has no run id\n");
        ctlReplyFree(&reply);
        return CTL_EXIT_ERROR;
    }
    char id_copy[128], state[32];
    snprintf(id_copy, sizeof id_copy, "%s", id);
    snprintf(state, sizeof state, "%s", ctlString(reply.json, "state", "?"));
    if (ctl->json) {
        if (!wait) ctlPrintJson(&reply);
    } else {
        double position = 0;
        int queued =
            !strcmp(state, "queued") && ctlHasNumber(reply.json, "queue_position", &position);
        printf("%s run %s", queued ? "queued" : "started", id);
        const char *run_name = ctlString(reply.json, "name", id);
        if (strcmp(run_name, id)) printf(" (%s)", run_name);
        if (queued)
            printf(" on %s at position %.0f: it starts when the runs before it are done\n",
                   ctlString(reply.json, "device", "?"), position);
        else
            printf(" on %s, state %s\n", ctlString(reply.json, "device", "?"), state);
        if (!watch && !wait) printf("follow it:  nsactl watch %s\n", id);
    }
    fflush(stdout);
    ctlReplyFree(&reply);
    if (wait) {
        rc = waitForStart(ctl, id_copy, state, sizeof state);
        if (rc != CTL_OK) return rc;
        if (ctl->json && !watch) {
            rc = runCall(ctl, "GET", id_copy, &reply);
            if (rc != CTL_OK) return rc;
            ctlPrintJson(&reply);
            ctlReplyFree(&reply);
        } else if (!ctl->json) {
            printf("run %s is %s\n", id_copy, state);
        }
        fflush(stdout);
        /* it ended before it ran (halted out of the queue, failed to start) */
        if (!watch && strcmp(state, "running") && strcmp(state, "completed")) return CTL_EXIT_ERROR;
    }
    return watch ? ctlWatchRun(ctl, id_copy, interval_s) : CTL_OK;
}

/* ---- asking once and showing the answer ------------------------------------------ */

/* Prints doc, a document nsactl built, as one line of JSON on stdout (what
 * --json promises) and frees it. */
static void printJsonDoc(cJSON *doc) {
    char *text = cJSON_PrintUnformatted(doc);
    if (text) puts(text);
    free(text);
    cJSON_Delete(doc);
}

/* Prints a command's human text for nsad's answer doc; how is the command's
 * own (a run id, its options). Returns CTL_OK, or CTL_EXIT_ERROR after
 * printing why (out of memory). */
typedef int (*ShowFn)(const cJSON *doc, const void *how);

/* Calls method on path with no body and prints the answer: the daemon's
 * document as it came with --json, else show's text. Returns ctlCall's code
 * (after it printed why) or show's. */
static int callAndShow(Ctl *ctl, const char *method, const char *path, ShowFn show, const void *how) {
    CtlReply reply;
    int rc = ctlCall(ctl, method, path, NULL, 0, NULL, 0, &reply);
    if (rc != CTL_OK) return rc;
    if (ctl->json) ctlPrintJson(&reply);
    else rc = show(reply.json, how);
    ctlReplyFree(&reply);
    return rc;
}

/* ---- status and list ----------------------------------------------------------- */

static int statusOfDaemon(Ctl *ctl) {
    CtlReply health, runs;
    int rc = ctlCall(ctl, "GET", "/api/v1/health", NULL, 0, NULL, 0, &health);
    if (rc != CTL_OK) return rc;
    rc = ctlCall(ctl, "GET", "/api/v1/runs", NULL, 0, NULL, 0, &runs);
    if (rc != CTL_OK) {
        ctlReplyFree(&health);
        return rc;
    }
    /* the runs holding trainers, newest first ("active": the newest; an
     * older nsad sends only that) */
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(runs.json, "active_runs");
    const char *newest = ctlString(runs.json, "active", NULL);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(runs.json, "runs");
    const cJSON *active[64], *run, *id;
    int n_active = 0, n_runs = cJSON_GetArraySize(list);
    if (cJSON_IsArray(ids)) {
        cJSON_ArrayForEach(id, ids)
            cJSON_ArrayForEach(run, list)
                if (cJSON_IsString(id) && !strcmp(ctlString(run, "id", ""), id->valuestring) && n_active < 64)
                    active[n_active++] = run;
    } else if (newest) {
        cJSON_ArrayForEach(run, list)
            if (!strcmp(ctlString(run, "id", ""), newest)) active[n_active++] = run;
    }
    if (ctl->json) {
        cJSON *out = cJSON_CreateObject();
        cJSON_AddItemToObject(out, "health", cJSON_Duplicate(health.json, 1));
        cJSON_AddItemToObject(out, "active", n_active ? cJSON_Duplicate(active[0], 1) : cJSON_CreateNull());
        cJSON *all = cJSON_AddArrayToObject(out, "active_runs");
        for (int i = 0; i < n_active; i++) cJSON_AddItemToArray(all, cJSON_Duplicate(active[i], 1));
        cJSON_AddNumberToObject(out, "runs", n_runs);
        printJsonDoc(out);
    } else {
        double uptime = -1, trainers = 1, busy = 0;
        char up[32], load[48] = "";
        ctlHasNumber(health.json, "uptime_s", &uptime);
        /* several trainers (a GPU node): how many of them are busy */
        if (ctlHasNumber(health.json, "trainers", &trainers) && trainers > 1 &&
            ctlHasNumber(health.json, "trainers_busy", &busy))
            snprintf(load, sizeof load, " (%.0f of %.0f busy)", busy, trainers);
        printf("nsad %s, up %s, trainer %s%s, %d run%s stored\n", ctlString(health.json, "version", "?"),
               formatDuration(uptime, up, sizeof up), ctlString(health.json, "trainer", "?"), load, n_runs,
               n_runs == 1 ? "" : "s");
        for (int i = 0; i < n_active; i++) {
            char line[512];
            ctlRunLine(active[i], line, sizeof line);
            printf("active: %s\n", line);
        }
        if (!n_active) printf("no active run%s\n", n_runs ? " (nsactl list shows the others)" : "");
    }
    ctlReplyFree(&health);
    ctlReplyFree(&runs);
    return CTL_OK;
}

/* Calls method on /api/v1/runs/{id} (id already checked) with no body.
 * Returns ctlCall's code; on CTL_OK the caller frees *reply. */
static int runCall(Ctl *ctl, const char *method, const char *id, CtlReply *reply) {
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s", id);
    return ctlCall(ctl, method, path, NULL, 0, NULL, 0, reply);
}

static int showRunDetails(const cJSON *run, const void *how) {
    (void)how;
    printRunDetails(run);
    return CTL_OK;
}

int ctlCmdStatus(Ctl *ctl, int argc, char **argv) {
    const char *pos[1];
    int n_pos;
    if (argsParse("status", argc, argv, NULL, 0, pos, 0, 1, &n_pos)) return CTL_EXIT_USAGE;
    if (n_pos == 0) return statusOfDaemon(ctl);
    if (ctlCheckRunId(pos[0])) return CTL_EXIT_USAGE;
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s", pos[0]);
    return callAndShow(ctl, "GET", path, showRunDetails, NULL);
}

/* The table of `list`. */
static int showRunTable(const cJSON *doc, const void *how) {
    (void)how;
    static const char *const headers[] = {"ID", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "DEVICE", "CREATED"};
    FormatTable *table = formatTableNew(ARRAY_LEN(headers), headers);
    if (!table) {
        fprintf(stderr, "nsactl list: out of memory\n");
        return CTL_EXIT_ERROR;
    }
    const cJSON *run;
    cJSON_ArrayForEach(run, cJSON_GetObjectItemCaseSensitive(doc, "runs")) {
        char step[48] = "-", loss[32], tps[32] = "-", created[32], where[96];
        ctlRunDevice(run, where, sizeof where);
        double v = 0, total = 0, ts = 0;
        if (ctlHasNumber(run, "step", &v)) {
            if (ctlHasNumber(run, "total_steps", &total))
                snprintf(step, sizeof step, "%.0f/%.0f", v, total);
            else snprintf(step, sizeof step, "%.0f", v);
        }
        int have_loss = ctlHasNumber(run, "loss", &v);
        formatLoss(v, have_loss, loss, sizeof loss);
        if (ctlHasNumber(run, "toks_per_s", &v)) formatSi(v, tps, sizeof tps);
        ctlHasNumber(run, "created_at", &ts);
        char state[48];
        double position = 0;
        if (ctlHasNumber(run, "queue_position", &position))
            snprintf(state, sizeof state, "%s #%.0f", ctlString(run, "state", "?"), position);
        else
            snprintf(state, sizeof state, "%s", ctlString(run, "state", "?"));
        const char *cells[] = {ctlString(run, "id", "?"), ctlString(run, "name", "-"),
                               state, step, loss, tps,
                               where, formatTimestamp(ts, created, sizeof created)};
        if (formatTableAdd(table, cells)) {
            fprintf(stderr, "nsactl list: out of memory\n");
            formatTableFree(table);
            return CTL_EXIT_ERROR;
        }
    }
    if (formatTableRows(table) == 0) printf("no runs yet; start one with: nsactl start CONFIG\n");
    else formatTablePrint(table, stdout);
    formatTableFree(table);
    return CTL_OK;
}

int ctlCmdList(Ctl *ctl, int argc, char **argv) {
    if (argsParseNone("list", argc, argv)) return CTL_EXIT_USAGE;
    return callAndShow(ctl, "GET", "/api/v1/runs", showRunTable, NULL);
}

/* ---- halt and resume -------------------------------------------------------------- */

/* Polls the run until its state leaves `transient` (halting, starting).
 * Returns the final exit code; prints the state reached. */
static int waitWhileState(Ctl *ctl, const char *id, const char *transient, char *state_out, size_t cap) {
    for (;;) {
        CtlReply reply;
        int rc = runCall(ctl, "GET", id, &reply);
        if (rc != CTL_OK) return rc;
        snprintf(state_out, cap, "%s", ctlString(reply.json, "state", "?"));
        ctlReplyFree(&reply);
        if (strcmp(state_out, transient)) return CTL_OK;
        struct timespec pause = {0, 200 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

static int cmdHaltOrResume(Ctl *ctl, int argc, char **argv, const char *verb) {
    int wait = 0, no_queue = 0;
    const int resume = !strcmp(verb, "resume");
    /* halt takes the first (--wait) only */
    const ArgsOption opts[] = {{"--wait", NULL, &wait}, {"--no-queue", NULL, &no_queue}};
    const int n_opts = resume ? ARRAY_LEN(opts) : 1;
    const char *pos[1];
    int n_pos;
    if (argsParse(verb, argc, argv, opts, n_opts, pos, 1, 1, &n_pos)) return CTL_EXIT_USAGE;
    if (ctlCheckRunId(pos[0])) return CTL_EXIT_USAGE;
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s/%s%s", pos[0], verb, no_queue ? "?queue=false" : "");
    CtlReply reply;
    int rc = ctlCall(ctl, "POST", path, "{}", 2, "application/json", 0, &reply);
    if (rc != CTL_OK) return rc;
    char state[32];
    snprintf(state, sizeof state, "%s", ctlString(reply.json, "state", "?"));
    if (ctl->json && !wait) ctlPrintJson(&reply);
    ctlReplyFree(&reply);
    if (wait) {
        /* halt: halting -> halted; resume: (queued ->) starting -> running (or an end). */
        if (resume) {
            rc = waitForStart(ctl, pos[0], state, sizeof state);
            if (rc != CTL_OK) return rc;
        } else if (!strcmp(state, "halting")) {
            rc = waitWhileState(ctl, pos[0], "halting", state, sizeof state);
            if (rc != CTL_OK) return rc;
        }
        if (ctl->json) {
            rc = runCall(ctl, "GET", pos[0], &reply);
            if (rc != CTL_OK) return rc;
            ctlPrintJson(&reply);
            ctlReplyFree(&reply);
            return CTL_OK;
        }
    }
    if (!ctl->json) {
        if (!strcmp(verb, "halt") && !strcmp(state, "halting"))
            printf("halting run %s: it stops after the current step and a checkpoint\n", pos[0]);
        else if (!strcmp(state, "queued"))
            printf("run %s is queued: it resumes when the runs before it are done\n", pos[0]);
        else
            printf("run %s is %s\n", pos[0], state);
    }
    return CTL_OK;
}

static int showFront(const cJSON *doc, const void *id) {
    (void)doc;
    printf("run %s is first in the queue: it starts next\n", (const char *)id);
    return CTL_OK;
}

/* A command whose one argument is a run id: method on /api/v1/runs/{id}
 * plus suffix, the answer shown by show (which gets the id). */
static int cmdOnRun(Ctl *ctl, int argc, char **argv, const char *cmd, const char *method,
                    const char *suffix, ShowFn show) {
    const char *pos[1];
    int n_pos;
    if (argsParse(cmd, argc, argv, NULL, 0, pos, 1, 1, &n_pos)) return CTL_EXIT_USAGE;
    if (ctlCheckRunId(pos[0])) return CTL_EXIT_USAGE;
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s%s", pos[0], suffix);
    return callAndShow(ctl, method, path, show, pos[0]);
}

int ctlCmdFront(Ctl *ctl, int argc, char **argv) {
    return cmdOnRun(ctl, argc, argv, "front", "POST", "/front", showFront);
}

int ctlCmdHalt(Ctl *ctl, int argc, char **argv) { return cmdHaltOrResume(ctl, argc, argv, "halt"); }

int ctlCmdResume(Ctl *ctl, int argc, char **argv) {
    return cmdHaltOrResume(ctl, argc, argv, "resume");
}

static int showDeleted(const cJSON *doc, const void *id) {
    (void)doc;
    printf("deleted %s\n", (const char *)id);
    return CTL_OK;
}

int ctlCmdDelete(Ctl *ctl, int argc, char **argv) {
    return cmdOnRun(ctl, argc, argv, "delete", "DELETE", "", showDeleted);
}

/* ---- metrics and events ------------------------------------------------------------ */

/* What `metrics` was asked to show. */
typedef struct MetricsView {
    long long since_step; /* --since */
    long long last_n;     /* --last: the newest rows of the training table; 0 all */
} MetricsView;

/* The training table (its newest rows) and the validation table. */
static int showMetrics(const cJSON *doc, const void *how) {
    const MetricsView *view = how;
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(doc, "train");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(doc, "val");
    int n_train = cJSON_GetArraySize(train), n_val = cJSON_GetArraySize(val);
    int skip = (view->last_n > 0 && n_train > view->last_n) ? n_train - (int)view->last_n : 0;

    static const char *const train_headers[] = {"STEP", "LOSS", "LR", "GRAD_NORM", "TOK/S", "MEMORY"};
    FormatTable *table = formatTableNew(ARRAY_LEN(train_headers), train_headers);
    if (!table) {
        fprintf(stderr, "nsactl metrics: out of memory\n");
        return CTL_EXIT_ERROR;
    }
    int i = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, train) {
        if (i++ < skip) continue;
        char step[32] = "-", loss[32], lr[32] = "-", gn[32] = "-", tps[32] = "-", mem[32] = "-";
        double v = 0;
        if (ctlHasNumber(s, "step", &v)) snprintf(step, sizeof step, "%.0f", v);
        int have_loss = ctlHasNumber(s, "loss", &v);
        formatLoss(v, have_loss, loss, sizeof loss);
        if (ctlHasNumber(s, "lr", &v)) snprintf(lr, sizeof lr, "%.3g", v);
        if (ctlHasNumber(s, "grad_norm", &v)) snprintf(gn, sizeof gn, "%.3g", v);
        if (ctlHasNumber(s, "toks_per_s", &v)) formatSi(v, tps, sizeof tps);
        if (ctlHasNumber(s, "mem_bytes", &v)) formatBytes(v, mem, sizeof mem);
        const char *cells[] = {step, loss, lr, gn, tps, mem};
        if (formatTableAdd(table, cells)) {
            fprintf(stderr, "nsactl metrics: out of memory\n");
            formatTableFree(table);
            return CTL_EXIT_ERROR;
        }
    }
    if (n_train == 0) printf("no training samples%s yet\n", view->since_step ? " at or after that step" : "");
    else formatTablePrint(table, stdout);
    if (skip) printf("(last %lld of %d samples; --last 0 shows all)\n", view->last_n, n_train);
    formatTableFree(table);

    if (n_val > 0) {
        static const char *const val_headers[] = {"STEP", "VAL_LOSS", "BITS/BYTE"};
        table = formatTableNew(ARRAY_LEN(val_headers), val_headers);
        if (!table) {
            fprintf(stderr, "nsactl metrics: out of memory\n");
            return CTL_EXIT_ERROR;
        }
        {
            cJSON_ArrayForEach(s, val) {
                char step[32] = "-", vl[32], bpb[32];
                double v = 0;
                if (ctlHasNumber(s, "step", &v)) snprintf(step, sizeof step, "%.0f", v);
                int have = ctlHasNumber(s, "val_loss", &v);
                formatLoss(v, have, vl, sizeof vl);
                have = ctlHasNumber(s, "bits_per_byte", &v);
                formatLoss(v, have, bpb, sizeof bpb);
                const char *cells[] = {step, vl, bpb};
                if (formatTableAdd(table, cells)) {
                    fprintf(stderr, "nsactl metrics: out of memory\n");
                    formatTableFree(table);
                    return CTL_EXIT_ERROR;
                }
            }
            printf("\n");
            formatTablePrint(table, stdout);
            formatTableFree(table);
        }
    }
    return CTL_OK;
}

int ctlCmdMetrics(Ctl *ctl, int argc, char **argv) {
    const char *since = NULL, *last = NULL;
    const ArgsOption opts[] = {{"--since", &since, NULL}, {"--last", &last, NULL}};
    const char *pos[1];
    int n_pos;
    MetricsView view = {.since_step = 0, .last_n = 20};
    if (argsParse("metrics", argc, argv, opts, ARRAY_LEN(opts), pos, 1, 1, &n_pos))
        return CTL_EXIT_USAGE;
    if (since && argsParseCount("metrics", "--since", since, &view.since_step))
        return CTL_EXIT_USAGE;
    if (last && argsParseCount("metrics", "--last", last, &view.last_n)) return CTL_EXIT_USAGE;
    if (ctlCheckRunId(pos[0])) return CTL_EXIT_USAGE;
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s/metrics?since=%lld", pos[0], view.since_step);
    return callAndShow(ctl, "GET", path, showMetrics, &view);
}

/* One line per event: seq, time, step, type and its details. */
static int showEvents(const cJSON *doc, const void *how) {
    (void)how;
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(doc, "events");
    if (cJSON_GetArraySize(events) == 0) printf("no events\n");
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        double seq = 0, ts = 0, step = 0;
        char when[32], step_s[32] = "-";
        ctlHasNumber(e, "seq", &seq);
        ctlHasNumber(e, "ts", &ts);
        if (ctlHasNumber(e, "step", &step)) snprintf(step_s, sizeof step_s, "%.0f", step);
        const cJSON *detail = cJSON_GetObjectItemCaseSensitive(e, "detail");
        char *detail_text = (detail && cJSON_GetArraySize(detail) > 0) ? cJSON_PrintUnformatted(detail) : NULL;
        printf("%4.0f  %s  step %-7s %s%s%s\n", seq, formatTimestamp(ts, when, sizeof when), step_s,
               ctlString(e, "type", "?"), detail_text ? "  " : "", detail_text ? detail_text : "");
        free(detail_text);
    }
    return CTL_OK;
}

int ctlCmdEvents(Ctl *ctl, int argc, char **argv) {
    const char *since = NULL;
    const ArgsOption opts[] = {{"--since", &since, NULL}};
    const char *pos[1];
    int n_pos;
    long long since_seq = 0;
    if (argsParse("events", argc, argv, opts, ARRAY_LEN(opts), pos, 1, 1, &n_pos))
        return CTL_EXIT_USAGE;
    if (since && argsParseCount("events", "--since", since, &since_seq)) return CTL_EXIT_USAGE;
    if (ctlCheckRunId(pos[0])) return CTL_EXIT_USAGE;
    char path[256];
    if (since) snprintf(path, sizeof path, "/api/v1/runs/%s/events?since=%lld", pos[0], since_seq);
    else snprintf(path, sizeof path, "/api/v1/runs/%s/events", pos[0]);
    return callAndShow(ctl, "GET", path, showEvents, NULL);
}

/* ---- logs ----------------------------------------------------------------------------- */

/* One line of the run's log: printed as it comes. */
static int logLine(void *ctx, const char *line, size_t len) {
    const Ctl *ctl = ctx;
    if (ctl->json) {
        fwrite(line, 1, len, stdout);
        fputc('\n', stdout);
    } else {
        cJSON *o = cJSON_ParseWithLength(line, len);
        double ts = 0;
        char when[32];
        if (o && ctlHasNumber(o, "ts", &ts))
            printf("%s  %-7s  %s\n", formatTimestamp(ts, when, sizeof when), ctlString(o, "level", "?"),
                   ctlString(o, "message", ""));
        /* a line that does not parse (torn by a crash of nsad) is left out */
        cJSON_Delete(o);
    }
    fflush(stdout);
    return 0;
}

int ctlCmdLogs(Ctl *ctl, int argc, char **argv) {
    const char *tail = NULL;
    int follow = 0;
    const ArgsOption opts[] = {{"--follow", NULL, &follow}, {"--tail", &tail, NULL}};
    /* -f is --follow, as in tail(1) */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) {
        fprintf(stderr, "nsactl logs: out of memory\n");
        return CTL_EXIT_ERROR;
    }
    for (int i = 0; i < argc; i++) args[i] = !strcmp(argv[i], "-f") ? "--follow" : argv[i];
    const char *pos[1];
    int n_pos;
    long long tail_n = -1;
    int bad = argsParse("logs", argc, args, opts, ARRAY_LEN(opts), pos, 1, 1, &n_pos) ||
              (tail && argsParseCount("logs", "--tail", tail, &tail_n)) || ctlCheckRunId(pos[0]);
    free(args);
    if (bad) return CTL_EXIT_USAGE;
    char path[256];
    int n = snprintf(path, sizeof path, "/api/v1/runs/%s/logs?follow=%d", pos[0], follow);
    if (tail_n >= 0) snprintf(path + n, sizeof path - (size_t)n, "&tail=%lld", tail_n);
    return ctlStream(ctl, "GET", path, NULL, 0, logLine, ctl, CTL_EXIT_ERROR);
}

/* ---- stacks, dashboard, version ---------------------------------------------------- */

/* The trainer's phase and its age, the device, then the stacks. */
static int showStacks(const cJSON *doc, const void *how) {
    (void)how;
    double age = -1, step = 0;
    char age_s[32];
    ctlHasNumber(doc, "phase_age_s", &age);
    int have_step = ctlHasNumber(doc, "step", &step);
    printf("run %s, phase %s for %s", ctlString(doc, "run_id", "(none)"), ctlString(doc, "phase", "-"),
           formatDuration(age, age_s, sizeof age_s));
    if (have_step) printf(", step %.0f", step);
    printf("\n%s", ctlString(doc, "device", ""));
    printf("\n%s", ctlString(doc, "stacks", "(no stacks in the answer)\n"));
    const char *stacks = ctlString(doc, "stacks", "");
    if (*stacks && stacks[strlen(stacks) - 1] != '\n') putchar('\n');
    return CTL_OK;
}

int ctlCmdStacks(Ctl *ctl, int argc, char **argv) {
    if (argsParseNone("stacks", argc, argv)) return CTL_EXIT_USAGE;
    return callAndShow(ctl, "POST", "/api/v1/debug/stacks", showStacks, NULL);
}

int ctlCmdDashboard(Ctl *ctl, int argc, char **argv) {
    if (argsParseNone("dashboard", argc, argv)) return CTL_EXIT_USAGE;
    /* The dashboard is a TCP page: with the socket as target, nsad says
     * where it listens. */
    char base[HTTP_ADDR_MAX];
    snprintf(base, sizeof base, "%s", ctl->target.base_url);
    if (ctl->target.socket_path[0]) {
        CtlReply reply;
        int rc = ctlCall(ctl, "GET", "/api/v1/version", NULL, 0, NULL, 0, &reply);
        if (rc != CTL_OK) return rc;
        const char *listen = ctlString(reply.json, "listen", NULL);
        if (listen) snprintf(base, sizeof base, "%s", listen);
        ctlReplyFree(&reply);
        if (!listen) {
            fprintf(stderr, "nsactl dashboard: nsad at %s has no TCP listener (it runs with --listen none); "
                            "the dashboard is served over TCP\n", ctl->target.socket_path);
            return CTL_EXIT_ERROR;
        }
    }
    if (!ctl->target.token[0]) {
        fprintf(stderr, "nsactl dashboard: no token: the dashboard needs the daemon's token; pass "
                        "--token-file STATE_DIR/token (or run as a user who can read %s/token)\n",
                ctl->state_dir);
        return CTL_EXIT_ERROR;
    }
    if (ctl->json) {
        cJSON *out = cJSON_CreateObject();
        char url[HTTP_ADDR_MAX + HTTP_TOKEN_MAX + 16];
        snprintf(url, sizeof url, "%s/#token=%s", base, ctl->target.token);
        cJSON_AddStringToObject(out, "url", url);
        printJsonDoc(out);
    } else {
        printf("%s/#token=%s\n", base, ctl->target.token);
    }
    return CTL_OK;
}

static int showVersion(const cJSON *doc, const void *how) {
    (void)how;
    printf("nsactl %s\nnsad   %s (api %s, cuda %s)\n", NSA_VERSION, ctlString(doc, "version", "?"),
           ctlString(doc, "api", "?"), cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "cuda")) ? "yes" : "no");
    return CTL_OK;
}

int ctlCmdVersion(Ctl *ctl, int argc, char **argv) {
    if (argsParseNone("version", argc, argv)) return CTL_EXIT_USAGE;
    return callAndShow(ctl, "GET", "/api/v1/version", showVersion, NULL);
}

int ctlCmdWatch(Ctl *ctl, int argc, char **argv) {
    const char *interval = NULL;
    const ArgsOption opts[] = {{"--interval", &interval, NULL}};
    const char *pos[1];
    int n_pos;
    if (argsParse("watch", argc, argv, opts, ARRAY_LEN(opts), pos, 1, 1, &n_pos))
        return CTL_EXIT_USAGE;
    double interval_s = 1.0;
    if (interval && argsParseInterval("watch", interval, &interval_s)) return CTL_EXIT_USAGE;
    if (ctlCheckRunId(pos[0])) return CTL_EXIT_USAGE;
    return ctlWatchRun(ctl, pos[0], interval_s);
}
