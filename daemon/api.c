/* api.c - the routes of proto/api.md; see api.h. */
#include "api.h"
#include "clockutil.h"
#include "peers.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api_use.h"
#include "log.h"
#include "mfu.h"
#include "prom.h"
#include "runlog.h"
#include "scheduler.h"
#include "stackdump.h"
#include "stream.h"

#define API_PREFIX "/api/v1"
#define SERIES_LIMIT 10000

static const char oom_body[] = "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}";

void apiResponseFree(ApiResponse *res) {
    free(res->body);
    res->body = NULL;
    if (res->stream) streamRelease(res->stream);
    res->stream = NULL;
    if (res->has_file) close(res->file_fd);
    res->has_file = 0;
}

static void outOfMemory(ApiResponse *res) {
    res->status = 500;
    res->body = strdup(oom_body);
    res->body_len = res->body ? strlen(res->body) : 0;
    res->content_type = "application/json";
    res->no_store = 1;
}

static void initResponse(ApiResponse *res) {
    memset(res, 0, sizeof *res);
    res->content_type = "application/json";
    res->no_store = 1;
}

/* Takes ownership of json: prints it as the body. */
static void respondJson(ApiResponse *res, int status, cJSON *json) {
    char *text = json ? cJSON_PrintUnformatted(json) : NULL;
    cJSON_Delete(json);
    if (!text) {
        outOfMemory(res);
        return;
    }
    res->status = status;
    res->body = text;
    res->body_len = strlen(text);
}

void apiError(ApiResponse *res, int status, const char *code, const char *fmt, ...) {
    initResponse(res);
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "code", code);
    cJSON_AddStringToObject(err, "message", message);
    respondJson(res, status, root);
}

int apiOwnsPath(const char *path) {
    return !strcmp(path, "/api") || !strncmp(path, "/api/", 5) || !strcmp(path, "/metrics");
}

int apiIsPublic(const char *method, const char *path) {
    return !strcmp(method, "GET") && !strcmp(path, API_PREFIX "/health");
}

/* ---- helpers ------------------------------------------------------------------------ */

static void addNumberOrNull(cJSON *o, const char *key, double v) {
    if (isfinite(v))
        cJSON_AddNumberToObject(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

static void addStringOrNull(cJSON *o, const char *key, const char *v) {
    if (v && *v)
        cJSON_AddStringToObject(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

/* Returns 1 when the request's method is the first of allow (a static
 * "GET" or "GET, POST"), else answers 405 with Allow: allow and returns 0. */
static int methodIs(const ApiRequest *req, ApiResponse *res, const char *allow) {
    size_t len = strcspn(allow, ",");
    if (strlen(req->method) == len && !strncmp(req->method, allow, len)) return 1;
    apiError(res, 405, "method_not_allowed", "%s is not allowed on %s; allowed: %s", req->method, req->path,
             allow);
    res->allow = allow;
    return 0;
}

/* Refuses query parameters other than those in allowed (comma-separated,
 * may be ""). Returns 1 when it answered. */
static int refuseUnknownQuery(const ApiRequest *req, ApiResponse *res, const char *allowed) {
    if (req->query_overflow) {
        apiError(res, 400, "invalid_argument", "more than %d query parameters", API_MAX_QUERY);
        return 1;
    }
    for (int i = 0; i < req->n_query; i++) {
        const char *key = req->query[i].key;
        size_t klen = strlen(key);
        int ok = 0;
        for (const char *p = allowed; *p && !ok;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            ok = len == klen && !strncmp(p, key, len);
            p = comma ? comma + 1 : p + len;
        }
        if (!ok) {
            apiError(res, 400, "invalid_argument", "unknown query parameter '%.100s'; allowed: %s", key,
                     *allowed ? allowed : "none");
            return 1;
        }
    }
    return 0;
}

static const char *queryValue(const ApiRequest *req, const char *key) {
    for (int i = 0; i < req->n_query; i++)
        if (!strcmp(req->query[i].key, key)) return req->query[i].value ? req->query[i].value : "";
    return NULL;
}

/* Parses a non-negative integer query value. Returns 1 and answers 400 when
 * it is malformed. */
static int queryInt(const ApiRequest *req, ApiResponse *res, const char *key, int64_t *out) {
    const char *v = queryValue(req, key);
    if (!v) return 0;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < 0) {
        apiError(res, 400, "invalid_argument", "%s: '%.60s' is not allowed; allowed: an integer >= 0", key,
                 v);
        return 1;
    }
    *out = n;
    return 0;
}

/* Parses an optional boolean query value (true/false/1/0) into *out, which
 * keeps its default when the key is absent. Returns 1 and answers 400 when
 * the value is anything else. */
static int queryBool(const ApiRequest *req, ApiResponse *res, const char *key, int *out) {
    const char *v = queryValue(req, key);
    if (!v) return 0;
    if (!strcmp(v, "true") || !strcmp(v, "1")) *out = 1;
    else if (!strcmp(v, "false") || !strcmp(v, "0")) *out = 0;
    else {
        apiError(res, 400, "invalid_argument", "%s: '%.60s' is not allowed; allowed: true, false, 1, 0", key, v);
        return 1;
    }
    return 0;
}

/* Validates an optional JSON object body with at most a string "reason".
 * Returns 1 when it answered 400; fills reason (may stay ""). */
static int parseReasonBody(const ApiRequest *req, ApiResponse *res, char *reason, size_t cap) {
    reason[0] = '\0';
    size_t i = 0;
    while (i < req->body_len && strchr(" \t\r\n", req->body[i])) i++;
    if (i == req->body_len) return 0;
    cJSON *body = cJSON_ParseWithLength(req->body, req->body_len);
    if (!body) {
        apiError(res, 400, "invalid_json", "the body is not valid JSON; send {} or {\"reason\": \"...\"}");
        return 1;
    }
    int answered = 0;
    if (!cJSON_IsObject(body)) {
        apiError(res, 400, "invalid_argument", "the body must be a JSON object, like {\"reason\": \"...\"}");
        answered = 1;
    }
    for (cJSON *f = body->child; !answered && f; f = f->next) {
        if (strcmp(f->string, "reason") != 0) {
            apiError(res, 400, "invalid_argument", "unknown field '%.60s'; allowed: reason", f->string);
            answered = 1;
        } else if (!cJSON_IsString(f)) {
            apiError(res, 400, "invalid_argument", "reason: expected a string, got %s",
                     cJSON_IsNumber(f) ? "a number"
                     : cJSON_IsBool(f) ? "a boolean"
                                       : "another type");
            answered = 1;
        } else {
            snprintf(reason, cap, "%s", f->valuestring);
        }
    }
    cJSON_Delete(body);
    return answered;
}

static void answerServiceError(ApiResponse *res, ServiceStatus st, const NsaError *err) {
    switch (st) {
    case SVC_BUSY: apiError(res, 409, "busy", "%s", err->message); break;
    case SVC_NOT_FOUND: apiError(res, 404, "not_found", "%s", err->message); break;
    case SVC_INVALID_STATE: apiError(res, 409, "invalid_state", "%s", err->message); break;
    case SVC_INVALID_CONFIG: apiError(res, 400, "invalid_config", "%s", err->message); break;
    case SVC_UNAVAILABLE: apiError(res, 503, "unavailable", "%s", err->message); break;
    default: apiError(res, 500, "internal", "%s", err->message); break;
    }
}

/* ---- the run object -------------------------------------------------------------------- */

/* The run as proto/api.md describes it. Caller holds svc->lock. */
static cJSON *runJson(Service *svc, Run *run, int with_config) {
    cJSON *o = cJSON_CreateObject();
    ServiceTrainer *t = serviceTrainerOf(svc, run->id);
    const int active = t != NULL;
    /* the trainer's monitor speaks for the run once its thread took it */
    const TrainMonitor *mon = t && !t->pending ? &t->mon : NULL;
    int64_t now = clockMonotonicNs();
    cJSON_AddStringToObject(o, "id", run->id);
    cJSON_AddStringToObject(o, "name", run->name);
    cJSON_AddStringToObject(o, "state", runStateName(run->state));
    const int position = runsQueuePosition(svc->runs, run);
    if (position > 0) cJSON_AddNumberToObject(o, "queue_position", position);
    else cJSON_AddNullToObject(o, "queue_position");
    if (mon) {
        TrainPhase phase = (TrainPhase)atomic_load(&mon->phase);
        cJSON_AddStringToObject(o, "phase", trainPhaseName(phase));
        cJSON_AddNumberToObject(o, "phase_age_s",
                                (double)(now - atomic_load(&mon->phase_since_ns)) * 1e-9);
    } else {
        cJSON_AddNullToObject(o, "phase");
        cJSON_AddNullToObject(o, "phase_age_s");
    }
    cJSON_AddNumberToObject(o, "step", (double)run->step);
    cJSON_AddNumberToObject(o, "total_steps", (double)run->total_steps);
    addNumberOrNull(o, "loss", run->loss);
    addNumberOrNull(o, "val_loss", run->val_loss);
    addNumberOrNull(o, "bits_per_byte", run->bits_per_byte);
    addNumberOrNull(o, "lr", run->lr);
    addNumberOrNull(o, "grad_norm", run->grad_norm);
    addNumberOrNull(o, "toks_per_s", run->toks_per_s);
    addNumberOrNull(o, "mfu", mfuOf(run->toks_per_s, run->flops_per_token, mfuWorldPeak(run->peak_flops, run->world, run->n_ranks)));
    addNumberOrNull(o, "flops_per_token", run->flops_per_token);
    addNumberOrNull(o, "peak_flops", run->peak_flops);
    const double wall = clockUnixSeconds();
    addNumberOrNull(o, "eta_s", active ? runsEtaSeconds(run, wall) : NAN);
    cJSON_AddNumberToObject(o, "elapsed_s", runsElapsedSeconds(run, wall));
    addNumberOrNull(o, "mem_bytes", run->mem_bytes);
    if (mon)
        cJSON_AddNumberToObject(o, "heartbeat_age_s",
                                (double)(now - atomic_load(&mon->heartbeat_ns)) * 1e-9);
    else
        cJSON_AddNullToObject(o, "heartbeat_age_s");
    addStringOrNull(o, "anomaly", run->anomaly);
    addStringOrNull(o, "error", run->error);
    cJSON_AddNumberToObject(o, "last_checkpoint_step", (double)run->last_checkpoint_step);
    cJSON_AddStringToObject(o, "device", run->device);
    /* a CUDA run's GPUs (what it claims: runtime.gpus resolved here) */
    const ServiceClaim claim =
        strcmp(run->device, "cuda") ? (ServiceClaim){0} : schedulerClaimOf(svc, run);
    if (claim.gpus) {
        cJSON *gpus = cJSON_AddArrayToObject(o, "gpus");
        for (int g = 0; g < SERVICE_MAX_GPUS; g++)
            if (claim.gpus & ((uint64_t)1 << g)) cJSON_AddItemToArray(gpus, cJSON_CreateNumber(g));
    } else {
        cJSON_AddNullToObject(o, "gpus");
    }
    cJSON_AddStringToObject(o, "precision", run->precision);
    cJSON_AddNumberToObject(o, "restarts", run->restarts);
    addStringOrNull(o, "member_of", run->member_of);
    addStringOrNull(o, "init_from", run->init_from);
    cJSON_AddNumberToObject(o, "created_at", run->created_at);
    addNumberOrNull(o, "started_at", run->started_at > 0 ? run->started_at : NAN);
    addNumberOrNull(o, "ended_at", run->ended_at > 0 ? run->ended_at : NAN);
    cJSON_AddStringToObject(o, "out_dir", run->out_dir);
    /* data parallelism: every rank of this node at the last logged step */
    if (run->n_ranks > 0) cJSON_AddNumberToObject(o, "world", run->world);
    else cJSON_AddNullToObject(o, "world");
    cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
    for (int r = 0; ranks && r < run->n_ranks; r++) {
        const TrainRankStatus *rs = &run->ranks[r];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "rank", rs->rank);
        if (rs->device >= 0) cJSON_AddNumberToObject(e, "device", rs->device);
        else cJSON_AddNullToObject(e, "device");
        addNumberOrNull(e, "step_s", rs->step_seconds);
        addNumberOrNull(e, "comm_s", rs->comm_seconds);
        addNumberOrNull(e, "comm_exposed_s", rs->exposed_seconds);
        addNumberOrNull(e, "overlap", rs->overlap);
        addNumberOrNull(e, "gather_s", rs->gather_seconds);
        if (mon && atomic_load(&mon->n_ranks) > r) {
            const int64_t since = atomic_load(&mon->rank_since_ns[r]);
            cJSON_AddStringToObject(e, "phase",
                                    trainPhaseName((TrainPhase)atomic_load(&mon->rank_phase[r])));
            cJSON_AddNumberToObject(e, "phase_age_s", since > 0 ? (double)(now - since) * 1e-9 : 0.0);
        } else {
            cJSON_AddNullToObject(e, "phase");
            cJSON_AddNullToObject(e, "phase_age_s");
        }
        cJSON_AddItemToArray(ranks, e);
    }
    if (with_config) cJSON_AddStringToObject(o, "config", run->config_yaml ? run->config_yaml : "");
    return o;
}

/* Answers status with the run's object (looked up again under the lock). */
static void respondRun(Service *svc, ApiResponse *res, int status, const char *id, int with_config) {
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    cJSON *o = run ? runJson(svc, run, with_config) : NULL;
    pthread_mutex_unlock(&svc->lock);
    if (!run)
        apiError(res, 404, "not_found", "no run '%s'; GET /api/v1/runs lists them", id);
    else
        respondJson(res, status, o);
}

/* ---- routes ------------------------------------------------------------------------------ */

static void getHealth(Service *svc, ApiResponse *res) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddStringToObject(o, "version", NSA_VERSION);
    cJSON_AddNumberToObject(o, "uptime_s", (double)(clockMonotonicNs() - svc->started_ns) * 1e-9);
    const int busy = serviceBusyTrainers(svc);
    pthread_mutex_lock(&svc->lock); /* serviceStartTrainers sets it after the HTTP threads start */
    const int trainers = svc->n_trainers;
    pthread_mutex_unlock(&svc->lock);
    cJSON_AddStringToObject(o, "trainer", busy ? "busy" : "idle");
    cJSON_AddNumberToObject(o, "trainers", trainers);
    cJSON_AddNumberToObject(o, "trainers_busy", busy);
    respondJson(res, 200, o);
}

static void getVersion(Service *svc, ApiResponse *res) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", NSA_VERSION);
    cJSON_AddStringToObject(o, "api", "v1");
#ifdef NSA_HAVE_CUDA
    cJSON_AddBoolToObject(o, "cuda", 1);
#else
    cJSON_AddBoolToObject(o, "cuda", 0);
#endif
    /* the devices a run can use here: cuda only when the start-up probe
     * found a GPU */
    const char *devices[] = {"cpu", "cuda"};
    int gpus = svc->devices.cuda_built && svc->devices.cuda_devices > 0;
    cJSON_AddItemToObject(o, "devices", cJSON_CreateStringArray(devices, gpus ? 2 : 1));
    cJSON_AddStringToObject(o, "device_probe", svc->devices.description);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    pthread_mutex_lock(&svc->lock);
    addStringOrNull(o, "listen", svc->listen_url);
    addStringOrNull(o, "socket", svc->socket_path);
    cJSON_AddStringToObject(o, "state_dir", svc->runs->state_dir);
    pthread_mutex_unlock(&svc->lock);
    respondJson(res, 200, o);
}

static void listRuns(Service *svc, ApiResponse *res) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "runs");
    pthread_mutex_lock(&svc->lock);
    for (size_t i = svc->runs->n_runs; i-- > 0;)
        cJSON_AddItemToArray(arr, runJson(svc, svc->runs->runs[i], 0));
    /* the runs holding trainers, newest first ("active": the newest) */
    cJSON *active = cJSON_AddArrayToObject(o, "active_runs");
    const char *newest = "";
    for (size_t i = svc->runs->n_runs; i-- > 0;)
        if (serviceTrainerOf(svc, svc->runs->runs[i]->id)) {
            if (!newest[0]) newest = svc->runs->runs[i]->id;
            cJSON_AddItemToArray(active, cJSON_CreateString(svc->runs->runs[i]->id));
        }
    addStringOrNull(o, "active", newest);
    /* the queue, next to start first */
    cJSON *queue = cJSON_AddArrayToObject(o, "queue");
    Run **queued = NULL;
    size_t n_queued = 0;
    const int listed = runsQueue(svc->runs, &queued, &n_queued);
    for (size_t i = 0; i < n_queued; i++) cJSON_AddItemToArray(queue, cJSON_CreateString(queued[i]->id));
    free(queued);
    pthread_mutex_unlock(&svc->lock);
    if (listed != 0) {
        cJSON_Delete(o);
        outOfMemory(res);
        return;
    }
    respondJson(res, 200, o);
}

static int isJsonType(const char *content_type) {
    return content_type && !strncasecmp(content_type, "application/json", 16);
}

static void createRun(Service *svc, const ApiRequest *req, ApiResponse *res) {
    if (refuseUnknownQuery(req, res, "name,nodes,gpus,init_from,queue")) return;
    int may_queue = 1;
    if (queryBool(req, res, "queue", &may_queue)) return;
    const char *name = queryValue(req, "name");
    if (name && !runNameValid(name)) {
        apiError(res, 400, "invalid_argument",
                 "name: '%.80s' is not allowed; allowed: 1-64 of [A-Za-z0-9._-]", name);
        return;
    }
    size_t i = 0;
    while (i < req->body_len && strchr(" \t\r\n", req->body[i])) i++;
    if (i == req->body_len) {
        apiError(res, 400, "invalid_config", "the body is empty; send a job config (YAML or JSON)");
        return;
    }
    if (isJsonType(req->content_type)) {
        const char *where = NULL;
        cJSON *probe = cJSON_ParseWithLengthOpts(req->body, req->body_len, &where, 0);
        int is_object = cJSON_IsObject(probe);
        cJSON_Delete(probe);
        if (!probe) {
            apiError(res, 400, "invalid_json", "the body is not valid JSON (error near byte %ld)",
                     where ? (long)(where - req->body) : 0L);
            return;
        }
        if (!is_object) {
            apiError(res, 400, "invalid_config",
                     "the config must be a JSON object with sections like \"model\" and \"train\"");
            return;
        }
    }
    if (memchr(req->body, '\0', req->body_len)) {
        apiError(res, 400, "invalid_config", "the body holds a NUL byte");
        return;
    }
    char id[RUN_ID_MAX];
    NsaError err = {""};
    ServiceWarnings *warnings = malloc(sizeof *warnings);
    if (!warnings) {
        outOfMemory(res);
        return;
    }
    const ServiceSubmit how = {.name = name,
                               .nodes = queryValue(req, "nodes"),
                               .gpus = queryValue(req, "gpus"),
                               .init_from = queryValue(req, "init_from"),
                               .may_queue = may_queue};
    ServiceStatus st = serviceSubmitRun(svc, req->body, req->body_len, &how, id, warnings, &err);
    if (st != SVC_OK) {
        free(warnings);
        answerServiceError(res, st, &err);
        return;
    }
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    cJSON *o = run ? runJson(svc, run, 0) : cJSON_CreateObject();
    pthread_mutex_unlock(&svc->lock);
    cJSON *list = cJSON_AddArrayToObject(o, "warnings");
    for (int i = 0; i < warnings->n; i++) cJSON_AddItemToArray(list, cJSON_CreateString(warnings->text[i]));
    free(warnings);
    respondJson(res, 201, o);
    snprintf(res->location, sizeof res->location, API_PREFIX "/runs/%s", id);
}

/* POST /api/v1/join: a coordinator asks this node to join its multi-node
 * job (daemon/peers.c is the other side). */
static void postJoin(Service *svc, const ApiRequest *req, ApiResponse *res) {
    if (refuseUnknownQuery(req, res, "")) return;
    cJSON *in = req->body_len ? cJSON_ParseWithLength(req->body, req->body_len) : NULL;
    const cJSON *phase = cJSON_GetObjectItemCaseSensitive(in, "phase");
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(in, "config");
    if (!cJSON_IsObject(in) || !cJSON_IsString(phase) || !cJSON_IsString(config) ||
        (strcmp(phase->valuestring, "prepare") && strcmp(phase->valuestring, "start"))) {
        cJSON_Delete(in);
        apiError(res, 400, "invalid_argument", "a join is a JSON object with \"phase\" (prepare or "
                                               "start) and \"config\" (the job's YAML)");
        return;
    }
    ServiceJoin j = {.start = !strcmp(phase->valuestring, "start"), .config_yaml = config->valuestring};
    if (j.start) {
        const cJSON *run_id = cJSON_GetObjectItemCaseSensitive(in, "run_id");
        const cJSON *first = cJSON_GetObjectItemCaseSensitive(in, "first");
        const cJSON *world = cJSON_GetObjectItemCaseSensitive(in, "world");
        const cJSON *comm_id = cJSON_GetObjectItemCaseSensitive(in, "comm_id");
        const cJSON *resume = cJSON_GetObjectItemCaseSensitive(in, "resume");
        if (!cJSON_IsString(run_id) || !cJSON_IsNumber(first) || !cJSON_IsNumber(world) ||
            !cJSON_IsString(comm_id) || !cJSON_IsBool(resume) ||
            peerIdFromHex(comm_id->valuestring, &j.join.comm_id) != 0 || !(first->valuedouble >= 1) ||
            !(first->valuedouble <= 65536) || !(world->valuedouble >= 1) || !(world->valuedouble <= 65536)) {
            cJSON_Delete(in);
            apiError(res, 400, "invalid_argument", "a start needs run_id, first and world (1 to 65536), "
                                                   "comm_id (%d hex digits) and resume", 2 * NSA_COMM_ID_BYTES);
            return;
        }
        j.run_id = run_id->valuestring;
        j.join.first = (int)first->valuedouble;
        j.join.world = (int)world->valuedouble;
        j.join.resume = cJSON_IsTrue(resume);
    }
    char id[RUN_ID_MAX] = "";
    int local = 0;
    NsaError err = {""};
    ServiceStatus st = serviceJoin(svc, &j, &local, id, &err);
    cJSON_Delete(in);
    if (st != SVC_OK) {
        answerServiceError(res, st, &err);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "local", local);
    if (j.start) cJSON_AddStringToObject(o, "id", id);
    respondJson(res, j.start ? 201 : 200, o);
}

static void haltOrResume(Service *svc, const ApiRequest *req, ApiResponse *res, const char *id, int resume) {
    if (refuseUnknownQuery(req, res, resume ? "queue" : "")) return;
    int may_queue = 1;
    if (resume && queryBool(req, res, "queue", &may_queue)) return;
    char reason[256];
    if (parseReasonBody(req, res, reason, sizeof reason)) return;
    NsaError err = {""};
    ServiceStatus st = resume ? serviceResumeRun(svc, id, may_queue, &err) : serviceHaltRun(svc, id, &err);
    if (st != SVC_OK) {
        answerServiceError(res, st, &err);
        return;
    }
    if (reason[0]) logRunNotice(id, "run %s: %s reason: %s", id, resume ? "resume" : "halt", reason);
    respondRun(svc, res, 202, id, 0);
}

/* Tokens trained on by `step`, for an evaluation's x on a tokens axis: the
 * training point at that step, else the line through the training points
 * around it (past the last one, through the last two: a run's tokens per
 * step change only when a resume changes the batch). NAN when the points
 * it needs do not know their tokens. O(log n): the series is in step order. */
static double tokensAtStep(const Run *run, int64_t step) {
    size_t lo = 0, hi = run->n_train;
    while (lo < hi) { /* the first point at or after step */
        size_t mid = lo + (hi - lo) / 2;
        if (run->train[mid].step < step) lo = mid + 1;
        else hi = mid;
    }
    if (lo < run->n_train && run->train[lo].step == step) return run->train[lo].tokens;
    const RunTrainPoint *a, *b;
    if (lo > 0 && lo < run->n_train) a = &run->train[lo - 1], b = &run->train[lo];
    else if (lo >= 2) a = &run->train[lo - 2], b = &run->train[lo - 1];
    else if (run->n_train >= 2) a = &run->train[0], b = &run->train[1];
    else if (run->n_train == 1 && run->train[0].step > 0)
        return run->train[0].tokens * (double)step / (double)run->train[0].step;
    else return NAN;
    return a->tokens + (b->tokens - a->tokens) * (double)(step - a->step) / (double)(b->step - a->step);
}

static void getMetrics(Service *svc, const ApiRequest *req, ApiResponse *res, const char *id) {
    if (refuseUnknownQuery(req, res, "since")) return;
    int64_t since = 0;
    if (queryInt(req, res, "since", &since)) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "run_id", id);
    cJSON *next = cJSON_AddNumberToObject(o, "next", (double)since);
    cJSON *train = cJSON_AddArrayToObject(o, "train");
    cJSON *val = cJSON_AddArrayToObject(o, "val");
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    int64_t highest = since - 1, generation = 0;
    if (run) {
        generation = run->series_generation;
        size_t n = 0;
        for (size_t i = 0; i < run->n_train && n < SERIES_LIMIT; i++) {
            const RunTrainPoint *p = &run->train[i];
            if (p->step < since) continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "step", (double)p->step);
            addNumberOrNull(e, "ts", p->ts);
            addNumberOrNull(e, "loss", p->loss);
            addNumberOrNull(e, "lr", p->lr);
            addNumberOrNull(e, "grad_norm", p->grad_norm);
            addNumberOrNull(e, "toks_per_s", p->toks_per_s);
            addNumberOrNull(e, "mfu", mfuOf(p->toks_per_s, run->flops_per_token, mfuWorldPeak(run->peak_flops, run->world, run->n_ranks)));
            addNumberOrNull(e, "mem_bytes", p->mem_bytes);
            addNumberOrNull(e, "tokens", p->tokens);
            cJSON_AddItemToArray(train, e);
            if (p->step > highest) highest = p->step;
            n++;
        }
        /* a truncated answer must not skip evaluations beyond its last step */
        int64_t val_cap = n == SERIES_LIMIT ? highest : INT64_MAX;
        n = 0;
        for (size_t i = 0; i < run->n_val && n < SERIES_LIMIT; i++) {
            const RunValPoint *p = &run->val[i];
            if (p->step < since || p->step > val_cap) continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "step", (double)p->step);
            addNumberOrNull(e, "ts", p->ts);
            addNumberOrNull(e, "val_loss", p->val_loss);
            addNumberOrNull(e, "bits_per_byte", p->bits_per_byte);
            addNumberOrNull(e, "tokens", tokensAtStep(run, p->step));
            cJSON_AddItemToArray(val, e);
            if (p->step > highest) highest = p->step;
            n++;
        }
    }
    pthread_mutex_unlock(&svc->lock);
    if (!run) {
        cJSON_Delete(o);
        apiError(res, 404, "not_found", "no run '%s'; GET /api/v1/runs lists them", id);
        return;
    }
    cJSON_SetNumberValue(next, (double)(highest + 1 > since ? highest + 1 : since));
    cJSON_AddNumberToObject(o, "generation", (double)generation);
    respondJson(res, 200, o);
}

static void getEvents(Service *svc, const ApiRequest *req, ApiResponse *res, const char *id) {
    if (refuseUnknownQuery(req, res, "since")) return;
    int64_t since = 0;
    if (queryInt(req, res, "since", &since)) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "run_id", id);
    cJSON *next = cJSON_AddNumberToObject(o, "next", (double)(since > 1 ? since : 1));
    cJSON *arr = cJSON_AddArrayToObject(o, "events");
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    for (size_t i = 0; run && i < run->n_events; i++) {
        const RunEvent *ev = &run->events[i];
        if (ev->seq < since) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "seq", (double)ev->seq);
        cJSON_AddNumberToObject(e, "ts", ev->ts);
        cJSON_AddStringToObject(e, "type", ev->type);
        cJSON_AddNumberToObject(e, "step", (double)ev->step);
        cJSON *detail = cJSON_Parse(ev->detail_json);
        cJSON_AddItemToObject(e, "detail", detail ? detail : cJSON_CreateObject());
        cJSON_AddItemToArray(arr, e);
        cJSON_SetNumberValue(next, (double)(ev->seq + 1));
    }
    pthread_mutex_unlock(&svc->lock);
    if (!run) {
        cJSON_Delete(o);
        apiError(res, 404, "not_found", "no run '%s'; GET /api/v1/runs lists them", id);
        return;
    }
    respondJson(res, 200, o);
}

/* GET /api/v1/runs/{id}/logs[?follow=1][&tail=N]: the run's own log lines
 * (daemon/runlog.h) as JSON lines; with follow, a stream that goes on
 * until the run's job ends (a run that is not active or queued ends at
 * once). */
static void getLogs(Service *svc, const ApiRequest *req, ApiResponse *res, const char *id) {
    if (refuseUnknownQuery(req, res, "follow,tail")) return;
    const char *f = queryValue(req, "follow");
    int follow = 0;
    if (f && (!*f || !strcmp(f, "1") || !strcmp(f, "true"))) follow = 1;
    else if (f && strcmp(f, "0") != 0 && strcmp(f, "false") != 0) {
        apiError(res, 400, "invalid_argument", "follow: '%.60s' is not allowed; allowed: 1, true, 0 or false", f);
        return;
    }
    int64_t tail = -1;
    if (queryInt(req, res, "tail", &tail)) return;
    if (!svc->runlog) {
        apiError(res, 503, "unavailable", "this nsad keeps no run logs");
        return;
    }
    NsaError err = {""};
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    /* decided under the lock the job's end takes to end its followers */
    int live = run && (runStateIsActive(run->state) || serviceTrainerOf(svc, id));
    RunLogRead *rd = run ? runlogReadStart(svc->runlog, id, tail > LONG_MAX ? LONG_MAX : (long)tail,
                                           follow && live, &err)
                         : NULL;
    pthread_mutex_unlock(&svc->lock);
    if (!run) {
        apiError(res, 404, "not_found", "no run '%s'; GET /api/v1/runs lists them", id);
        return;
    }
    /* the files are read with no lock held: a slow disk stalls this request only */
    Stream *s = rd ? runlogReadFinish(svc->runlog, rd, &err) : NULL;
    if (!s) {
        apiError(res, 503, "unavailable", "%s", err.message);
        res->retry_after = 5;
        return;
    }
    apiRespondStream(res, s);
}

void apiRespondStream(ApiResponse *res, struct Stream *s) {
    res->status = 200;
    res->body_len = 0;
    res->content_type = "application/x-ndjson";
    res->no_store = 1;
    res->stream = s;
}

static void postStacks(Service *svc, const ApiRequest *req, ApiResponse *res) {
    if (refuseUnknownQuery(req, res, "")) return;
    char *stacks = stackdumpString("POST /api/v1/debug/stacks");
    if (!stacks) {
        apiError(res, 500, "internal", "could not collect the stacks (out of memory)");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    const int64_t now = clockMonotonicNs();
    /* every trainer's phase; the top-level fields are the first busy one's */
    cJSON *trainers = cJSON_AddArrayToObject(o, "trainers");
    ServiceTrainer *first = NULL;
    pthread_mutex_lock(&svc->lock);
    for (int i = 0; i < svc->n_trainers; i++) {
        ServiceTrainer *t = &svc->trainers[i];
        const int active = t->active_id[0] && !t->pending;
        if (active && !first) first = t;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "trainer", t->index);
        addStringOrNull(e, "run_id", t->active_id);
        cJSON_AddStringToObject(e, "phase",
                                trainPhaseName(active ? (TrainPhase)atomic_load(&t->mon.phase) : PHASE_IDLE));
        if (active)
            cJSON_AddNumberToObject(e, "phase_age_s",
                                    (double)(now - atomic_load(&t->mon.phase_since_ns)) * 1e-9);
        else
            cJSON_AddNullToObject(e, "phase_age_s");
        cJSON_AddItemToArray(trainers, e);
    }
    if (!first) first = &svc->trainers[0];
    const int active = first->active_id[0] && !first->pending;
    TrainPhase phase = active ? (TrainPhase)atomic_load(&first->mon.phase) : PHASE_IDLE;
    cJSON_AddStringToObject(o, "phase", trainPhaseName(phase));
    if (active)
        cJSON_AddNumberToObject(o, "phase_age_s", (double)(now - atomic_load(&first->mon.phase_since_ns)) * 1e-9);
    else
        cJSON_AddNullToObject(o, "phase_age_s");
    cJSON_AddNumberToObject(o, "step", (double)atomic_load(&first->mon.step));
    addStringOrNull(o, "run_id", first->active_id);
    pthread_mutex_unlock(&svc->lock);
    char device[640];
    trainMonitorDescribeDevice(&first->mon, now, device, sizeof device);
    cJSON_AddStringToObject(o, "device", device);
    cJSON_AddStringToObject(o, "stacks", stacks);
    logNotice("stack dump requested over the API (trainer phase %s)", trainPhaseName(phase));
    const char *p = stacks;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        if (len > 0) logNotice("  %.*s", len, p);
        p = nl ? nl + 1 : NULL;
    }
    free(stacks);
    respondJson(res, 200, o);
}

static void getPrometheus(Service *svc, const ApiRequest *req, ApiResponse *res) {
    if (refuseUnknownQuery(req, res, "")) return;
    size_t len = 0;
    char *text = promRender(svc, &len);
    if (!text) {
        outOfMemory(res);
        return;
    }
    res->status = 200;
    res->body = text;
    res->body_len = len;
    res->content_type = PROM_CONTENT_TYPE;
}

static void deleteRun(Service *svc, const ApiRequest *req, ApiResponse *res, const char *id) {
    if (refuseUnknownQuery(req, res, "")) return;
    NsaError err = {""};
    ServiceStatus st = serviceDeleteRun(svc, id, &err);
    if (st != SVC_OK) {
        answerServiceError(res, st, &err);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "run_id", id);
    cJSON_AddBoolToObject(o, "deleted", 1);
    respondJson(res, 200, o);
}

/* POST /api/v1/runs/{id}/front: a queued run starts next. */
static void frontRun(Service *svc, const ApiRequest *req, ApiResponse *res, const char *id) {
    if (refuseUnknownQuery(req, res, "")) return;
    NsaError err = {""};
    ServiceStatus st = serviceFrontRun(svc, id, &err);
    if (st != SVC_OK) {
        answerServiceError(res, st, &err);
        return;
    }
    respondRun(svc, res, 200, id, 0);
}

/* Routes /api/v1/runs/{id}[/action]. */
static void routeRun(Service *svc, const ApiRequest *req, ApiResponse *res, const char *rest) {
    char id[RUN_ID_MAX + 1];
    const char *slash = strchr(rest, '/');
    size_t id_len = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *action = slash ? slash + 1 : "";
    if (id_len == 0 || id_len >= sizeof id) {
        apiError(res, 404, "not_found", "no such route: %s %s", req->method, req->path);
        return;
    }
    memcpy(id, rest, id_len);
    id[id_len] = '\0';
    if (!runIdValid(id)) {
        apiError(res, 404, "not_found", "no run '%.80s': run ids are [A-Za-z0-9_-]{1,64}", id);
        return;
    }
    if (!*action) {
        if (!strcmp(req->method, "DELETE"))
            deleteRun(svc, req, res, id);
        else if (methodIs(req, res, "GET, DELETE") && !refuseUnknownQuery(req, res, ""))
            respondRun(svc, res, 200, id, 1);
    } else if (!strcmp(action, "halt") || !strcmp(action, "resume")) {
        if (methodIs(req, res, "POST")) haltOrResume(svc, req, res, id, !strcmp(action, "resume"));
    } else if (!strcmp(action, "front")) {
        if (methodIs(req, res, "POST")) frontRun(svc, req, res, id);
    } else if (!strcmp(action, "metrics")) {
        if (methodIs(req, res, "GET")) getMetrics(svc, req, res, id);
    } else if (!strcmp(action, "events")) {
        if (methodIs(req, res, "GET")) getEvents(svc, req, res, id);
    } else if (!strcmp(action, "logs")) {
        if (methodIs(req, res, "GET")) getLogs(svc, req, res, id);
    } else {
        apiError(res, 404, "not_found", "no such route: %s %s", req->method, req->path);
    }
}

void apiHandle(Service *svc, const ApiRequest *req, ApiResponse *res) {
    initResponse(res);
    const char *path = req->path;
    const char *rest = !strncmp(path, API_PREFIX "/", sizeof API_PREFIX) ? path + sizeof API_PREFIX : NULL;
    if (!strcmp(path, "/metrics")) {
        if (methodIs(req, res, "GET")) getPrometheus(svc, req, res);
    } else if (!rest) {
        apiError(res, 404, "not_found", "no such route: %s %s; the API lives under " API_PREFIX "/",
                 req->method, path);
    } else if (!strcmp(rest, "health")) {
        if (methodIs(req, res, "GET") && !refuseUnknownQuery(req, res, "")) getHealth(svc, res);
    } else if (!strcmp(rest, "version")) {
        if (methodIs(req, res, "GET") && !refuseUnknownQuery(req, res, "")) getVersion(svc, res);
    } else if (!strcmp(rest, "runs")) {
        if (!strcmp(req->method, "POST"))
            createRun(svc, req, res);
        else if (methodIs(req, res, "GET, POST") && !refuseUnknownQuery(req, res, ""))
            listRuns(svc, res);
    } else if (!strncmp(rest, "runs/", 5)) {
        routeRun(svc, req, res, rest + 5);
    } else if (!strcmp(rest, "sample")) {
        if (methodIs(req, res, "POST")) apiUseSample(svc, req, res);
    } else if (!strcmp(rest, "eval")) {
        if (methodIs(req, res, "POST")) apiUseEval(svc, req, res);
    } else if (!strcmp(rest, "export")) {
        if (methodIs(req, res, "POST")) apiUseExport(svc, req, res);
    } else if (!strncmp(rest, "exports/", 8)) {
        if (methodIs(req, res, "GET") && !refuseUnknownQuery(req, res, ""))
            apiUseExportFile(svc, req, res, rest + 8);
    } else if (!strcmp(rest, "join")) {
        if (methodIs(req, res, "POST")) postJoin(svc, req, res);
    } else if (!strcmp(rest, "debug/stacks")) {
        if (methodIs(req, res, "POST")) postStacks(svc, req, res);
    } else {
        apiError(res, 404, "not_found", "no such route: %s %s", req->method, path);
    }
}
