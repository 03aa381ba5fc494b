/* runs.c - the run registry; see runs.h. */
#include "runs.h"
#include "artifacts.h"
#include "clockutil.h"
#include "fsutil.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static const char *const state_names[RUN_STATE_COUNT] = {
    "idle", "starting", "running", "halting", "halted", "completed", "failed", "nan_halted", "hung",
    "queued",
};

const char *runStateName(RunState state) {
    if ((int)state < 0 || state >= RUN_STATE_COUNT) return "unknown";
    return state_names[state];
}

int runStateFromName(const char *name) {
    for (int i = 0; i < RUN_STATE_COUNT; i++)
        if (name && !strcmp(name, state_names[i])) return i;
    return -1;
}

int runStateIsActive(RunState state) {
    return state == RUN_STARTING || state == RUN_RUNNING || state == RUN_HALTING || state == RUN_HUNG;
}

int runStateIsResumable(RunState state) {
    return state == RUN_HALTED || state == RUN_NAN_HALTED || state == RUN_FAILED;
}

static int validChars(const char *s, const char *extra) {
    size_t n = 0;
    for (; s && s[n]; n++) {
        char c = s[n];
        int ok =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr(extra, c);
        if (!ok) return 0;
    }
    return n >= 1 && n <= 64;
}

int runIdValid(const char *id) { return validChars(id, "_-"); }

int runNameValid(const char *name) {
    return validChars(name, "._-") && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static int joinPath(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s/%s", a, b);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

static void runFree(Run *run) {
    if (!run) return;
    free(run->config_yaml);
    free(run->train);
    free(run->val);
    for (size_t i = 0; i < run->n_events; i++) free(run->events[i].detail_json);
    free(run->events);
    free(run);
}

static Run *runNew(const RunRegistry *reg, const char *id) {
    Run *run = calloc(1, sizeof *run);
    if (!run) return NULL;
    snprintf(run->id, sizeof run->id, "%s", id);
    snprintf(run->name, sizeof run->name, "%s", id);
    if (joinPath(run->dir, sizeof run->dir, reg->runs_dir, id) != 0 ||
        joinPath(run->out_dir, sizeof run->out_dir, run->dir, "out") != 0) {
        free(run);
        return NULL;
    }
    run->loss = run->val_loss = run->bits_per_byte = NAN;
    run->lr = run->grad_norm = run->toks_per_s = run->mem_bytes = NAN;
    run->flops_per_token = run->peak_flops = NAN;
    run->step_seconds_avg = NAN;
    return run;
}

/* Room for one more run in the registry. Returns 0, or -1 (out of memory). */
static int registryReserve(RunRegistry *reg) {
    if (reg->n_runs < reg->cap_runs) return 0;
    size_t cap = reg->cap_runs ? reg->cap_runs * 2 : 16;
    Run **bigger = realloc(reg->runs, cap * sizeof *bigger);
    if (!bigger) return -1;
    reg->runs = bigger;
    reg->cap_runs = cap;
    return 0;
}

static int registryAppend(RunRegistry *reg, Run *run) {
    if (registryReserve(reg) != 0) return -1;
    reg->runs[reg->n_runs++] = run;
    return 0;
}

/* ---- run.json ------------------------------------------------------------- */

static void addNumberOrNull(cJSON *obj, const char *key, double v) {
    if (isfinite(v))
        cJSON_AddNumberToObject(obj, key, v);
    else
        cJSON_AddNullToObject(obj, key);
}

int runsSave(const Run *run, NsaError *err) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return nsaErrorf(err, "out of memory saving run %s", run->id);
    cJSON_AddStringToObject(o, "id", run->id);
    cJSON_AddStringToObject(o, "name", run->name);
    cJSON_AddStringToObject(o, "state", runStateName(run->state));
    cJSON_AddStringToObject(o, "device", run->device);
    cJSON_AddStringToObject(o, "precision", run->precision);
    cJSON_AddNumberToObject(o, "step", (double)run->step);
    cJSON_AddNumberToObject(o, "total_steps", (double)run->total_steps);
    cJSON_AddNumberToObject(o, "last_checkpoint_step", (double)run->last_checkpoint_step);
    addNumberOrNull(o, "loss", run->loss);
    addNumberOrNull(o, "val_loss", run->val_loss);
    addNumberOrNull(o, "flops_per_token", run->flops_per_token);
    addNumberOrNull(o, "peak_flops", run->peak_flops);
    cJSON_AddStringToObject(o, "anomaly", run->anomaly);
    cJSON_AddStringToObject(o, "error", run->error);
    cJSON_AddNumberToObject(o, "restarts", run->restarts);
    if (run->member_of[0]) cJSON_AddStringToObject(o, "member_of", run->member_of);
    if (run->init_from[0]) cJSON_AddStringToObject(o, "init_from", run->init_from);
    if (run->state == RUN_QUEUED) {
        cJSON_AddNumberToObject(o, "queue_order", (double)run->queue_order);
        cJSON_AddBoolToObject(o, "queue_resume", run->queue_resume);
    }
    cJSON_AddNumberToObject(o, "created_at", run->created_at);
    cJSON_AddNumberToObject(o, "started_at", run->started_at);
    cJSON_AddNumberToObject(o, "ended_at", run->ended_at);
    cJSON_AddNumberToObject(o, "elapsed_s", runsElapsedSeconds(run, clockUnixSeconds()));
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return nsaErrorf(err, "out of memory saving run %s", run->id);
    char path[RUN_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run.json", run->dir);
    int rc = fsWriteFileAtomic(path, text, strlen(text), 0640, err);
    free(text);
    return rc;
}

static double jsonNumber(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static void jsonString(const cJSON *o, const char *key, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v)) snprintf(out, cap, "%s", v->valuestring);
}

static int loadEvents(Run *run);

/* Loads one run directory. Returns NULL with err when its files are unusable. */
static Run *runLoad(const RunRegistry *reg, const char *id, NsaError *err) {
    Run *run = runNew(reg, id);
    if (!run) {
        nsaErrorf(err, "out of memory loading run %s", id);
        return NULL;
    }
    char path[RUN_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run.json", run->dir);
    char *text = fsReadFile(path, NULL);
    if (!text) {
        nsaErrorf(err, "%s: %s", path, strerror(errno));
        runFree(run);
        return NULL;
    }
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(o, "state");
    int st = cJSON_IsString(state) ? runStateFromName(state->valuestring) : -1;
    if (!cJSON_IsObject(o) || st < 0) {
        nsaErrorf(err, "%s: not a run record (no valid \"state\")", path);
        cJSON_Delete(o);
        runFree(run);
        return NULL;
    }
    run->state = (RunState)st;
    jsonString(o, "name", run->name, sizeof run->name);
    jsonString(o, "device", run->device, sizeof run->device);
    jsonString(o, "precision", run->precision, sizeof run->precision);
    jsonString(o, "anomaly", run->anomaly, sizeof run->anomaly);
    jsonString(o, "error", run->error, sizeof run->error);
    jsonString(o, "member_of", run->member_of, sizeof run->member_of);
    jsonString(o, "init_from", run->init_from, sizeof run->init_from);
    run->step = (int64_t)jsonNumber(o, "step", 0);
    run->total_steps = (int64_t)jsonNumber(o, "total_steps", 0);
    run->last_checkpoint_step = (int64_t)jsonNumber(o, "last_checkpoint_step", 0);
    run->loss = jsonNumber(o, "loss", NAN);
    run->val_loss = jsonNumber(o, "val_loss", NAN);
    run->flops_per_token = jsonNumber(o, "flops_per_token", NAN);
    run->peak_flops = jsonNumber(o, "peak_flops", NAN);
    run->restarts = (int)jsonNumber(o, "restarts", 0);
    run->queue_order = (int64_t)jsonNumber(o, "queue_order", 0);
    run->queue_resume = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "queue_resume"));
    run->created_at = jsonNumber(o, "created_at", 0);
    run->started_at = jsonNumber(o, "started_at", 0);
    run->ended_at = jsonNumber(o, "ended_at", 0);
    /* records from before elapsed_s was kept: their last segment */
    run->elapsed_before = jsonNumber(o, "elapsed_s",
                                    run->ended_at > run->started_at && run->started_at > 0
                                        ? run->ended_at - run->started_at
                                        : 0);
    cJSON_Delete(o);

    snprintf(path, sizeof path, "%s/config.yaml", run->dir);
    run->config_yaml = fsReadFile(path, NULL);
    if (!run->config_yaml) {
        nsaErrorf(err, "%s: %s", path, strerror(errno));
        runFree(run);
        return NULL;
    }
    if (loadEvents(run) != 0) {
        nsaErrorf(err, "%s/events.jsonl: out of memory", run->dir);
        runFree(run);
        return NULL;
    }
    NsaError serr;
    if (runsLoadSeries(run, &serr) != 0) logWarn("run %s: metric series: %s", id, serr.message);
    return run;
}

static int compareCreated(const void *a, const void *b) {
    const Run *x = *(Run *const *)a, *y = *(Run *const *)b;
    if (x->created_at != y->created_at) return x->created_at < y->created_at ? -1 : 1;
    return strcmp(x->id, y->id);
}

RunRegistry *runsOpen(const char *state_dir, NsaError *err) {
    RunRegistry *reg = calloc(1, sizeof *reg);
    if (!reg) {
        nsaErrorf(err, "out of memory");
        return NULL;
    }
    if (snprintf(reg->state_dir, sizeof reg->state_dir, "%s", state_dir) >= (int)sizeof reg->state_dir ||
        joinPath(reg->runs_dir, sizeof reg->runs_dir, state_dir, "runs") != 0) {
        nsaErrorf(err, "state dir path too long: %s", state_dir);
        free(reg);
        return NULL;
    }
    if (fsMkdirs(reg->state_dir, 0750, err) != 0 || fsMkdirs(reg->runs_dir, 0750, err) != 0) {
        free(reg);
        return NULL;
    }
    DIR *d = opendir(reg->runs_dir);
    if (!d) {
        nsaErrorf(err, "cannot read %s: %s", reg->runs_dir, strerror(errno));
        free(reg);
        return NULL;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strncmp(e->d_name, RUNS_TRASH_PREFIX, strlen(RUNS_TRASH_PREFIX))) {
            /* a deletion the previous nsad did not finish */
            char trash[RUN_PATH_MAX + 300];
            NsaError terr;
            snprintf(trash, sizeof trash, "%s/%s", reg->runs_dir, e->d_name);
            if (fsRemoveTree(trash, &terr) != 0) logWarn("unfinished run deletion: %s", terr.message);
            continue;
        }
        if (!runIdValid(e->d_name)) continue;
        NsaError lerr;
        Run *run = runLoad(reg, e->d_name, &lerr);
        if (!run) {
            logWarn("skipping stored run %s: %s", e->d_name, lerr.message);
            continue;
        }
        if (registryAppend(reg, run) != 0) {
            runFree(run);
            closedir(d);
            runsClose(reg);
            nsaErrorf(err, "out of memory loading runs");
            return NULL;
        }
    }
    closedir(d);
    if (reg->n_runs > 1) qsort(reg->runs, reg->n_runs, sizeof *reg->runs, compareCreated);
    return reg;
}

void runsClose(RunRegistry *reg) {
    if (!reg) return;
    for (size_t i = 0; i < reg->n_runs; i++) runFree(reg->runs[i]);
    free(reg->runs);
    free(reg);
}

Run *runsFind(const RunRegistry *reg, const char *id) {
    if (!id) return NULL;
    for (size_t i = 0; i < reg->n_runs; i++)
        if (!strcmp(reg->runs[i]->id, id)) return reg->runs[i];
    return NULL;
}

int runsDelete(RunRegistry *reg, const char *id, char *trash_out, size_t cap, NsaError *err) {
    size_t at = reg->n_runs;
    for (size_t i = 0; i < reg->n_runs; i++)
        if (!strcmp(reg->runs[i]->id, id)) at = i;
    if (at == reg->n_runs) {
        nsaErrorf(err, "no run '%s'", id);
        return -1;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (fsPathf(err, trash_out, cap, "%s/" RUNS_TRASH_PREFIX "%s.%ld.%09ld", reg->runs_dir, id,
                (long)now.tv_sec, (long)now.tv_nsec) != 0)
        return -1;
    Run *run = reg->runs[at];
    if (rename(run->dir, trash_out) != 0) {
        nsaErrorf(err, "cannot move %s to %s: %s", run->dir, trash_out, strerror(errno));
        return -1;
    }
    NsaError ferr;
    if (fsFsyncDir(reg->runs_dir, &ferr) != 0) logWarn("deleting run %s: %s", id, ferr.message);
    memmove(&reg->runs[at], &reg->runs[at + 1], (reg->n_runs - at - 1) * sizeof *reg->runs);
    reg->n_runs--;
    runFree(run);
    return 0;
}

/* A fresh id: UTC creation time plus 4 random hex digits. */
static void makeRunId(char *out, size_t cap) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    unsigned short r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (unsigned short)(clock() ^ getpid());
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out, cap, "%s-%04x", stamp, (unsigned)r);
}

static int64_t queueEnd(const RunRegistry *reg, int front) {
    int64_t end = 0;
    int any = 0;
    for (size_t i = 0; i < reg->n_runs; i++) {
        const Run *r = reg->runs[i];
        if (r->state != RUN_QUEUED) continue;
        if (!any || (front ? r->queue_order < end : r->queue_order > end)) end = r->queue_order;
        any = 1;
    }
    if (!any) return 0;
    return front ? end - 1 : end + 1;
}

/* 1 when a starts before b: the lower order, then the older run. */
static int queueBefore(const Run *a, const Run *b) {
    if (a->queue_order != b->queue_order) return a->queue_order < b->queue_order;
    return strcmp(a->id, b->id) < 0;
}

static int compareQueued(const void *a, const void *b) {
    const Run *x = *(Run *const *)a, *y = *(Run *const *)b;
    return queueBefore(x, y) ? -1 : queueBefore(y, x) ? 1 : 0;
}

int runsQueue(const RunRegistry *reg, Run ***out, size_t *n) {
    *out = NULL;
    *n = 0;
    const size_t queued = (size_t)runsQueueLength(reg);
    if (queued == 0) return 0;
    Run **q = malloc(queued * sizeof *q);
    if (!q) return -1;
    for (size_t i = 0; i < reg->n_runs; i++)
        if (reg->runs[i]->state == RUN_QUEUED) q[(*n)++] = reg->runs[i];
    qsort(q, *n, sizeof *q, compareQueued);
    *out = q;
    return 0;
}

int runsQueuePosition(const RunRegistry *reg, const Run *run) {
    if (run->state != RUN_QUEUED) return 0;
    int pos = 1;
    for (size_t i = 0; i < reg->n_runs; i++) {
        const Run *r = reg->runs[i];
        if (r != run && r->state == RUN_QUEUED && queueBefore(r, run)) pos++;
    }
    return pos;
}

int runsQueueLength(const RunRegistry *reg) {
    int n = 0;
    for (size_t i = 0; i < reg->n_runs; i++) n += reg->runs[i]->state == RUN_QUEUED;
    return n;
}

int runsEnqueue(RunRegistry *reg, Run *run, int front, int resume, NsaError *err) {
    if (run->state == RUN_QUEUED) run->state = RUN_HALTED; /* not counted against itself */
    run->queue_order = queueEnd(reg, front);
    run->queue_resume = resume;
    run->state = RUN_QUEUED;
    return runsSave(run, err);
}

Run *runsCreate(RunRegistry *reg, const char *name, const char *config_yaml, const char *device,
                const char *precision, int64_t total_steps, RunState initial, NsaError *err) {
    char id[RUN_ID_MAX];
    int tries = 0;
    do {
        makeRunId(id, sizeof id);
    } while (runsFind(reg, id) && ++tries < 16);
    if (runsFind(reg, id)) {
        nsaErrorf(err, "could not find a free run id");
        return NULL;
    }
    Run *run = runNew(reg, id);
    /* the registry's room first: once the directory exists the run is
     * either whole (on disk and in the registry) or gone from both */
    if (!run || !(run->config_yaml = strdup(config_yaml)) || registryReserve(reg) != 0) {
        runFree(run);
        nsaErrorf(err, "out of memory creating a run");
        return NULL;
    }
    if (name) snprintf(run->name, sizeof run->name, "%s", name);
    snprintf(run->device, sizeof run->device, "%s", device ? device : "");
    snprintf(run->precision, sizeof run->precision, "%s", precision ? precision : "");
    run->total_steps = total_steps;
    run->state = initial == RUN_QUEUED ? RUN_QUEUED : RUN_STARTING;
    if (run->state == RUN_QUEUED) run->queue_order = queueEnd(reg, 0);
    run->created_at = clockUnixSeconds();
    /* a queued run's active time starts when it does (runsSetState) */
    if (run->state != RUN_QUEUED) run->segment_started = run->created_at;
    char path[RUN_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.yaml", run->dir);
    if (mkdir(run->dir, 0750) != 0) {
        nsaErrorf(err, "cannot create %s: %s", run->dir, strerror(errno));
        runFree(run);
        return NULL;
    }
    if (fsMkdirs(run->out_dir, 0750, err) != 0 ||
        fsWriteFileAtomic(path, config_yaml, strlen(config_yaml), 0640, err) != 0 || runsSave(run, err) != 0) {
        NsaError rm_err;
        if (fsRemoveTree(run->dir, &rm_err) != 0) /* else a restart would find a half-made run */
            logWarn("run %s: %s", run->id, rm_err.message);
        runFree(run);
        return NULL;
    }
    reg->runs[reg->n_runs++] = run; /* reserved above */
    return run;
}

int runsSetConfig(Run *run, const char *config_yaml, NsaError *err) {
    char *copy = strdup(config_yaml);
    if (!copy) return nsaErrorf(err, "out of memory");
    char path[RUN_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.yaml", run->dir);
    if (fsWriteFileAtomic(path, copy, strlen(copy), 0640, err) != 0) {
        free(copy);
        return -1;
    }
    free(run->config_yaml);
    run->config_yaml = copy;
    return 0;
}

int runsSetState(Run *run, RunState state, NsaError *err) {
    double now = clockUnixSeconds();
    if (state == RUN_RUNNING && run->state == RUN_STARTING) run->started_at = now;
    if (runStateIsActive(state))
        run->ended_at = 0;
    else if (runStateIsActive(run->state))
        run->ended_at = now;
    if (runStateIsActive(state) && run->segment_started == 0) {
        /* a segment begins (a start, a resume, a restart's pick-up): the
         * time since the last sample before it is no step time */
        run->segment_started = now;
        run->eta_ts = 0;
        run->step_seconds_avg = NAN;
    } else if (!runStateIsActive(state) && run->segment_started > 0) {
        run->elapsed_before += now > run->segment_started ? now - run->segment_started : 0;
        run->segment_started = 0;
    }
    run->state = state;
    return runsSave(run, err);
}

double runsElapsedSeconds(const Run *run, double now) {
    double current = run->segment_started > 0 && now > run->segment_started ? now - run->segment_started : 0;
    return run->elapsed_before + current;
}

double runsEtaSeconds(const Run *run, double now) {
    if (!isfinite(run->step_seconds_avg) || run->eta_ts <= 0 || run->total_steps < run->step) return NAN;
    double eta = (double)(run->total_steps - run->step) * run->step_seconds_avg;
    if (now > run->eta_ts) eta -= now - run->eta_ts;
    return eta > 0 ? eta : 0;
}

/* Folds the wall time from the previous sample into the seconds-per-step
 * average: the plain mean over the segment until it spans
 * RUN_ETA_HORIZON_STEPS steps, then a moving average over about that many.
 * A step at or below the previous one (a rollback) only moves the
 * reference point. */
static void updateEta(Run *run, int64_t step, double ts) {
    if (run->eta_ts > 0 && step > run->eta_step && ts > run->eta_ts) {
        double steps = (double)(step - run->eta_step);
        double rate = (ts - run->eta_ts) / steps;
        double span = (double)(step - run->eta_first_step);
        double weight = steps / (span < RUN_ETA_HORIZON_STEPS ? span : RUN_ETA_HORIZON_STEPS);
        if (!isfinite(run->step_seconds_avg) || weight >= 1)
            run->step_seconds_avg = rate;
        else
            run->step_seconds_avg += weight * (rate - run->step_seconds_avg);
    } else if (run->eta_ts <= 0) {
        run->eta_first_step = step;
    }
    run->eta_step = step;
    run->eta_ts = ts;
}

/* ---- series ----------------------------------------------------------------- */

static int growArray(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap * 2 : 256;
    while (cap2 < need) cap2 *= 2;
    void *bigger = realloc(*arr, cap2 * elem);
    if (!bigger) return -1;
    *arr = bigger;
    *cap = cap2;
    return 0;
}

/* Keeps the points at even indices and the last one of an array of n
 * elements of elem bytes, in order; returns how many remain. */
static size_t thinSeries(void *arr, size_t n, size_t elem) {
    char *a = arr;
    size_t kept = 0;
    for (size_t i = 0; i < n; i += 2) memmove(a + kept++ * elem, a + i * elem, elem);
    if (n > 0 && (n - 1) % 2 != 0) memmove(a + kept++ * elem, a + (n - 1) * elem, elem);
    return kept;
}

static int appendTrain(Run *run, const RunTrainPoint *p) {
    size_t before = run->n_train;
    while (run->n_train > 0 && run->train[run->n_train - 1].step >= p->step) run->n_train--;
    if (run->n_train != before) run->series_generation++;
    if (growArray((void **)&run->train, &run->cap_train, run->n_train + 1, sizeof *run->train) != 0)
        return -1;
    run->train[run->n_train++] = *p;
    if (run->n_train > RUN_SERIES_MAX_POINTS) {
        run->n_train = thinSeries(run->train, run->n_train, sizeof *run->train);
        run->series_generation++;
    }
    return 0;
}

static int appendVal(Run *run, const RunValPoint *p) {
    size_t before = run->n_val;
    while (run->n_val > 0 && run->val[run->n_val - 1].step >= p->step) run->n_val--;
    if (run->n_val != before) run->series_generation++;
    if (growArray((void **)&run->val, &run->cap_val, run->n_val + 1, sizeof *run->val) != 0) return -1;
    run->val[run->n_val++] = *p;
    if (run->n_val > RUN_SERIES_MAX_POINTS) {
        run->n_val = thinSeries(run->val, run->n_val, sizeof *run->val);
        run->series_generation++;
    }
    return 0;
}

int runsAddStep(Run *run, const TrainStepLog *s) {
    RunTrainPoint p = {.step = s->step,
                       .ts = s->ts,
                       .loss = s->loss,
                       .lr = s->lr,
                       .grad_norm = s->grad_norm,
                       .toks_per_s = s->toks_per_s,
                       .mem_bytes = (double)s->mem_bytes,
                       .tokens = s->tokens_seen > 0 ? (double)s->tokens_seen : NAN};
    run->step = s->step;
    if (s->total_steps > 0) run->total_steps = s->total_steps;
    run->loss = s->loss;
    run->lr = s->lr;
    run->grad_norm = s->grad_norm;
    run->toks_per_s = s->toks_per_s;
    run->mem_bytes = (double)s->mem_bytes;
    run->world = s->world;
    run->n_ranks = s->n_ranks < 0 ? 0 : s->n_ranks > TRAIN_MAX_RANKS ? TRAIN_MAX_RANKS : s->n_ranks;
    memcpy(run->ranks, s->ranks, (size_t)run->n_ranks * sizeof run->ranks[0]);
    updateEta(run, s->step, s->ts);
    return appendTrain(run, &p);
}

int runsAddEval(Run *run, int64_t step, double ts, double val_loss, double bits_per_byte) {
    RunValPoint p = {.step = step, .ts = ts, .val_loss = val_loss, .bits_per_byte = bits_per_byte};
    run->val_loss = val_loss;
    run->bits_per_byte = bits_per_byte;
    return appendVal(run, &p);
}

/* artifactsReadCsv's callbacks: one row into the run's series. */
static int addTrainRow(void *ctx, const ArtifactCsvRow *row, NsaError *err) {
    Run *run = ctx;
    RunTrainPoint p = {.step = row->step, .ts = row->ts, .loss = row->loss, .lr = row->lr,
                       .grad_norm = row->grad_norm, .toks_per_s = row->toks_per_s,
                       .mem_bytes = row->mem_bytes, .tokens = NAN};
    return appendTrain(run, &p) == 0 ? 0 : nsaErrorf(err, "%s/%s: out of memory", run->out_dir,
                                                     ARTIFACT_TRAINING_CSV);
}

static int addValRow(void *ctx, const ArtifactCsvRow *row, NsaError *err) {
    Run *run = ctx;
    RunValPoint p = {.step = row->step, .ts = row->ts, .val_loss = row->val_loss,
                     .bits_per_byte = row->bits_per_byte};
    return appendVal(run, &p) == 0 ? 0 : nsaErrorf(err, "%s/%s: out of memory", run->out_dir,
                                                   ARTIFACT_VAL_CSV);
}

/* Index of the point with that step in a strictly increasing series, or -1. */
static long findTrain(const Run *run, int64_t step) {
    size_t lo = 0, hi = run->n_train;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (run->train[mid].step < step)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < run->n_train && run->train[lo].step == step ? (long)lo : -1;
}

static long findVal(const Run *run, int64_t step) {
    for (size_t i = run->n_val; i-- > 0;)
        if (run->val[i].step == step) return (long)i;
    return -1;
}

/* The CSVs keep only step, loss, lr and tok/s; the heartbeat has the time,
 * gradient norm, memory and tokens seen of every logged step. A step logged twice (redone
 * after a resume) appears twice there: the later line is the one the CSV
 * kept, and it wins because it is read last. */
static void enrichFromHeartbeat(Run *run) {
    char path[RUN_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/heartbeat_rank0.jsonl", run->out_dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        int is_step = strstr(line, "\"event\":\"step\"") != NULL;
        int is_eval = !is_step && strstr(line, "\"event\":\"eval\"") != NULL;
        if (!is_step && !is_eval) continue;
        cJSON *o = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
        if (cJSON_IsNumber(step)) {
            long i = is_step ? findTrain(run, (int64_t)step->valuedouble)
                             : findVal(run, (int64_t)step->valuedouble);
            if (i >= 0 && is_step) {
                RunTrainPoint *p = &run->train[i];
                p->ts = jsonNumber(o, "ts", p->ts);
                p->grad_norm = jsonNumber(o, "grad_norm", p->grad_norm);
                p->mem_bytes = jsonNumber(o, "memory", p->mem_bytes);
                p->toks_per_s = jsonNumber(o, "toks_per_s", p->toks_per_s);
                p->tokens = jsonNumber(o, "tokens_seen", p->tokens);
            } else if (i >= 0) {
                run->val[i].ts = jsonNumber(o, "ts", run->val[i].ts);
            }
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
}

int runsLoadSeries(Run *run, NsaError *err) {
    run->n_train = run->n_val = 0;
    if (artifactsReadCsv(run->out_dir, ARTIFACT_TRAINING_CSV, addTrainRow, run, err) != 0 ||
        artifactsReadCsv(run->out_dir, ARTIFACT_VAL_CSV, addValRow, run, err) != 0)
        return -1;
    enrichFromHeartbeat(run);
    if (run->n_train) {
        const RunTrainPoint *p = &run->train[run->n_train - 1];
        run->loss = p->loss;
        run->lr = p->lr;
        run->grad_norm = p->grad_norm;
        run->toks_per_s = p->toks_per_s;
        run->mem_bytes = p->mem_bytes;
        if (p->step > run->step) run->step = p->step;
    }
    if (run->n_val) {
        run->val_loss = run->val[run->n_val - 1].val_loss;
        run->bits_per_byte = run->val[run->n_val - 1].bits_per_byte;
    }
    return 0;
}

/* ---- events ------------------------------------------------------------------- */

static int pushEvent(Run *run, int64_t seq, double ts, const char *type, int64_t step, char *detail) {
    if (run->n_events == RUN_EVENTS_MAX) { /* the older half goes; events.jsonl keeps it */
        size_t drop = RUN_EVENTS_MAX / 2;
        for (size_t i = 0; i < drop; i++) free(run->events[i].detail_json);
        memmove(run->events, run->events + drop, (run->n_events - drop) * sizeof *run->events);
        run->n_events -= drop;
    }
    if (growArray((void **)&run->events, &run->cap_events, run->n_events + 1, sizeof *run->events) != 0)
        return -1;
    RunEvent *e = &run->events[run->n_events++];
    e->seq = seq;
    e->ts = ts;
    e->step = step;
    snprintf(e->type, sizeof e->type, "%s", type);
    e->detail_json = detail;
    return 0;
}

/* Returns a malloc'd JSON object text for detail (see runsAddEvent). */
static char *normaliseDetail(const char *detail_json) {
    if (!detail_json || !*detail_json) return strdup("{}");
    cJSON *d = cJSON_Parse(detail_json);
    char *out;
    if (cJSON_IsObject(d)) {
        out = cJSON_PrintUnformatted(d);
    } else {
        cJSON *wrap = cJSON_CreateObject();
        cJSON_AddStringToObject(wrap, "text", detail_json);
        out = cJSON_PrintUnformatted(wrap);
        cJSON_Delete(wrap);
    }
    cJSON_Delete(d);
    return out;
}

int runsAddEvent(Run *run, const char *type, int64_t step, const char *detail_json, NsaError *err) {
    char *detail = normaliseDetail(detail_json);
    if (!detail) return nsaErrorf(err, "out of memory recording event %s", type);
    int64_t seq = run->n_events ? run->events[run->n_events - 1].seq + 1 : 1;
    double ts = clockUnixSeconds();
    if (pushEvent(run, seq, ts, type, step, detail) != 0) {
        free(detail);
        return nsaErrorf(err, "out of memory recording event %s", type);
    }
    cJSON *line = cJSON_CreateObject();
    cJSON_AddNumberToObject(line, "seq", (double)seq);
    cJSON_AddNumberToObject(line, "ts", ts);
    cJSON_AddStringToObject(line, "type", type);
    cJSON_AddNumberToObject(line, "step", (double)step);
    cJSON_AddRawToObject(line, "detail", detail);
    char *text = cJSON_PrintUnformatted(line);
    cJSON_Delete(line);
    if (!text) return nsaErrorf(err, "out of memory recording event %s", type);
    char path[RUN_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/events.jsonl", run->dir);
    int rc = 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        rc = nsaErrorf(err, "cannot append to %s: %s", path, strerror(errno));
    } else {
        int bad = fprintf(f, "%s\n", text) < 0;
        bad |= fclose(f) != 0;
        if (bad) rc = nsaErrorf(err, "cannot append to %s: %s", path, strerror(errno));
    }
    free(text);
    return rc;
}

static int loadEvents(Run *run) {
    char path[RUN_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/events.jsonl", run->dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
        const cJSON *detail = cJSON_GetObjectItemCaseSensitive(o, "detail");
        if (cJSON_IsObject(o) && cJSON_IsString(type)) {
            char *d = cJSON_IsObject(detail) ? cJSON_PrintUnformatted(detail) : strdup("{}");
            if (!d || pushEvent(run, (int64_t)jsonNumber(o, "seq", (double)run->n_events + 1),
                                jsonNumber(o, "ts", 0), type->valuestring, (int64_t)jsonNumber(o, "step", 0),
                                d) != 0) {
                free(d);
                rc = -1;
            }
        }
        /* a line torn by a kill is skipped: the events before it stay */
        cJSON_Delete(o);
        if (rc) break;
    }
    free(line);
    fclose(f);
    return rc;
}
