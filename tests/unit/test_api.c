/* test_api.c - the API routes (daemon/api.c) called directly, the service's
 * run life cycle without a trainer thread (daemon/service.c), the pick-up
 * of an interrupted run, the watchdog's hang detection (daemon/watchdog.c),
 * the Prometheus exposition (daemon/prom.c) and the sample route's body
 * checks (daemon/api_use.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "api.h"
#include "log.h"
#include "prom.h"
#include "runlog.h"
#include "server.h"
#include "service.h"
#include "watchdog.h"

static const char kTinyJson[] =
    "{\"model\":{\"dim\":32,\"n_layers\":1,\"n_heads\":2,\"n_kv_groups\":1,\"d_k\":16,\"d_v\":16},"
    "\"nsa\":{\"l\":8,\"d\":4,\"l_sel\":16,\"n_sel\":4,\"w\":32},"
    "\"train\":{\"steps\":20,\"seq_len\":64,\"batch_size\":2},"
    "\"runtime\":{\"device\":\"cpu\",\"precision\":\"fp32\"},\"data\":{\"source\":\"synthetic\"}}";

typedef struct Fixture {
    char *dir;
    Service *svc;
} Fixture;

static int setUp(void **state) {
    Fixture *f = calloc(1, sizeof *f);
    f->dir = strdup("/tmp/nsad-test-api-XXXXXX");
    if (!f->dir || !mkdtemp(f->dir)) return -1;
    NsaError err = {""};
    f->svc = serviceOpen(f->dir, &err);
    if (!f->svc) return -1;
    *state = f;
    return 0;
}

static int tearDown(void **state) {
    Fixture *f = *state;
    logSetRunSink(NULL, NULL); /* a failed test may leave its run log as the sink */
    serviceClose(f->svc);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f->dir);
    free(f);
    return rc == 0 ? 0 : -1;
}

/* One request; returns the parsed body (the caller deletes it) and the
 * response in res (body freed here). */
static cJSON *call(Service *svc, const char *method, const char *path, const char *body, const char *ctype,
                   ApiResponse *res) {
    ApiRequest req = {.method = method,
                      .path = path,
                      .body = body,
                      .body_len = body ? strlen(body) : 0,
                      .content_type = ctype};
    char *q = strchr(path, '?');
    char path_only[256], query[256];
    if (q) {
        snprintf(path_only, sizeof path_only, "%.*s", (int)(q - path), path);
        snprintf(query, sizeof query, "%s", q + 1);
        req.path = path_only;
        char *save = NULL; /* strtok_r: requests come from several threads at once */
        for (char *kv = strtok_r(query, "&", &save); kv && req.n_query < API_MAX_QUERY;
             kv = strtok_r(NULL, "&", &save)) {
            char *eq = strchr(kv, '=');
            if (eq) *eq = '\0';
            req.query[req.n_query].key = kv;
            req.query[req.n_query].value = eq ? eq + 1 : NULL;
            req.n_query++;
        }
    }
    apiHandle(svc, &req, res);
    cJSON *json = res->content_type && !strncmp(res->content_type, "application/json", 16)
                      ? cJSON_ParseWithLength(res->body, res->body_len)
                      : NULL;
    return json;
}

static const char *errorCode(const cJSON *json) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(json, "error");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
    if (!cJSON_IsString(c) || !cJSON_IsString(m) || !*m->valuestring) return NULL;
    return c->valuestring;
}

static void expectError(Service *svc, const char *method, const char *path, const char *body,
                        const char *ctype, int status, const char *code) {
    ApiResponse res;
    cJSON *json = call(svc, method, path, body, ctype, &res);
    if (res.status != status || !errorCode(json) || strcmp(errorCode(json), code) != 0)
        fail_msg("%s %s: got %d %.*s, want %d %s", method, path, res.status, (int)res.body_len, res.body,
                 status, code);
    if (status == 405) assert_non_null(res.allow);
    cJSON_Delete(json);
    apiResponseFree(&res);
}

/* Each query of the NULL-ended list on /api/v1/runs/{id}/{route}: 400
 * invalid_argument. */
static void expectBadQueries(Service *svc, const char *method, const char *id, const char *route,
                             const char *const *queries) {
    char path[300];
    for (; *queries; queries++) {
        snprintf(path, sizeof path, "/api/v1/runs/%s/%s?%s", id, route, *queries);
        expectError(svc, method, path, NULL, NULL, 400, "invalid_argument");
    }
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* One request that must be answered with `status` (a body goes as JSON);
 * returns the parsed answer (NULL when it is not JSON; the caller deletes
 * it). */
static cJSON *callExpect(Service *svc, const char *method, const char *path, const char *body, int status) {
    ApiResponse res;
    cJSON *j = call(svc, method, path, body, body ? "application/json" : NULL, &res);
    if (res.status != status)
        fail_msg("%s %s: got %d %.*s, want %d", method, path, res.status, (int)res.body_len, res.body,
                 status);
    apiResponseFree(&res);
    return j;
}

/* Creates a tiny CPU run (kTinyJson) by POST path (/api/v1/runs and a
 * query), which must answer 201; copies the new run's id into id
 * (RUN_ID_MAX bytes). Returns the run object (the caller deletes it). */
static cJSON *postTinyRun(Service *svc, const char *path, char *id) {
    cJSON *j = callExpect(svc, "POST", path, kTinyJson, 201);
    assert_non_null(str(j, "id"));
    snprintf(id, RUN_ID_MAX, "%s", str(j, "id"));
    return j;
}

static void test_health_version_and_routing(void **state) {
    Fixture *f = *state;
    ApiResponse res;
    cJSON *j = call(f->svc, "GET", "/api/v1/health", NULL, NULL, &res);
    assert_int_equal(res.status, 200);
    assert_string_equal(str(j, "status"), "ok");
    assert_string_equal(str(j, "trainer"), "idle");
    assert_true(res.no_store);
    cJSON_Delete(j);
    apiResponseFree(&res);
    j = callExpect(f->svc, "GET", "/api/v1/version", NULL, 200);
    assert_string_equal(str(j, "version"), NSA_VERSION);
    cJSON_Delete(j);

    expectError(f->svc, "GET", "/api/v1/nothing", NULL, NULL, 404, "not_found");
    expectError(f->svc, "GET", "/api/v2/health", NULL, NULL, 404, "not_found");
    expectError(f->svc, "GET", "/api", NULL, NULL, 404, "not_found");
    expectError(f->svc, "POST", "/api/v1/health", NULL, NULL, 405, "method_not_allowed");
    expectError(f->svc, "DELETE", "/api/v1/runs", NULL, NULL, 405, "method_not_allowed");
    expectError(f->svc, "POST", "/metrics", NULL, NULL, 405, "method_not_allowed");
    expectError(f->svc, "GET", "/api/v1/debug/stacks", NULL, NULL, 405, "method_not_allowed");
    expectError(f->svc, "GET", "/api/v1/runs/unknown-run", NULL, NULL, 404, "not_found");
    expectError(f->svc, "GET", "/api/v1/runs/bad.id", NULL, NULL, 404, "not_found");
    expectError(f->svc, "GET", "/api/v1/health?x=1", NULL, NULL, 400, "invalid_argument");

    assert_int_equal(apiOwnsPath("/api/v1/runs"), 1);
    assert_int_equal(apiOwnsPath("/metrics"), 1);
    assert_int_equal(apiOwnsPath("/index.html"), 0);
    assert_int_equal(apiOwnsPath("/apix"), 0);
    assert_int_equal(apiIsPublic("GET", "/api/v1/health"), 1);
    assert_int_equal(apiIsPublic("GET", "/api/v1/runs"), 0);
    assert_int_equal(apiIsPublic("GET", "/metrics"), 0);
}

static void test_create_busy_halt_resume(void **state) {
    Fixture *f = *state;
    expectError(f->svc, "POST", "/api/v1/runs", "{\"model\":", "application/json", 400, "invalid_json");
    expectError(f->svc, "POST", "/api/v1/runs", "{\"train\":{\"steps\":\"many\"}}", "application/json", 400,
                "invalid_config");
    expectError(f->svc, "POST", "/api/v1/runs", "\n  \n", "application/yaml", 400, "invalid_config");
    expectError(f->svc, "POST", "/api/v1/runs?name=a%2Fb", kTinyJson, "application/json", 400,
                "invalid_argument");
    expectError(f->svc, "POST", "/api/v1/runs?colour=red", kTinyJson, "application/json", 400,
                "invalid_argument");

    ApiResponse res;
    cJSON *j = call(f->svc, "POST", "/api/v1/runs?name=unit", kTinyJson, "application/json", &res);
    assert_int_equal(res.status, 201);
    char id[RUN_ID_MAX];
    snprintf(id, sizeof id, "%s", str(j, "id"));
    char location[160];
    snprintf(location, sizeof location, "/api/v1/runs/%s", id);
    assert_string_equal(res.location, location);
    assert_string_equal(str(j, "state"), "starting");
    assert_string_equal(str(j, "name"), "unit");
    assert_string_equal(str(j, "device"), "cpu");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "loss")));
    cJSON_Delete(j);
    apiResponseFree(&res);

    /* the run's out_dir is under the state dir, and its config says so */
    pthread_mutex_lock(&f->svc->lock);
    Run *run = runsFind(f->svc->runs, id);
    assert_non_null(run);
    assert_non_null(strstr(run->config_yaml, run->out_dir));
    assert_int_equal(strncmp(run->out_dir, f->dir, strlen(f->dir)), 0);
    pthread_mutex_unlock(&f->svc->lock);

    expectError(f->svc, "POST", "/api/v1/runs?queue=false", kTinyJson, "application/json", 409, "busy");
    expectError(f->svc, "POST", "/api/v1/runs?queue=no", kTinyJson, "application/json", 400, "invalid_argument");
    /* without ?queue=false the second run waits its turn; DELETE cancels it */
    char queued_id[RUN_ID_MAX], queued_path[200];
    j = postTinyRun(f->svc, "/api/v1/runs", queued_id);
    assert_string_equal(str(j, "state"), "queued");
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(j, "queue_position")->valuedouble, 1);
    cJSON_Delete(j);
    snprintf(queued_path, sizeof queued_path, "/api/v1/runs/%s", queued_id);
    cJSON_Delete(callExpect(f->svc, "DELETE", queued_path, NULL, 200));
    pthread_mutex_lock(&f->svc->lock);
    assert_int_equal(runsQueueLength(f->svc->runs), 0);
    pthread_mutex_unlock(&f->svc->lock);
    char path[200];
    snprintf(path, sizeof path, "/api/v1/runs/%s/resume", id);
    expectError(f->svc, "POST", path, NULL, NULL, 409, "invalid_state");
    snprintf(path, sizeof path, "/api/v1/runs/%s/halt", id);
    expectError(f->svc, "POST", path, "{\"why\":\"x\"}", "application/json", 400, "invalid_argument");
    expectError(f->svc, "POST", path, "{\"reason\":true}", "application/json", 400, "invalid_argument");
    expectError(f->svc, "POST", path, "[]", "application/json", 400, "invalid_argument");
    expectError(f->svc, "POST", path, "{", "application/json", 400, "invalid_json");
    j = callExpect(f->svc, "POST", path, "{\"reason\":\"unit test\"}", 202);
    assert_string_equal(str(j, "state"), "halting");
    assert_int_equal(atomic_load(&f->svc->trainers[0].mon.halt_requested), 1);
    cJSON_Delete(j);
    cJSON_Delete(callExpect(f->svc, "POST", path, NULL, 202)); /* again: harmless */

    j = callExpect(f->svc, "GET", "/api/v1/runs", NULL, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "runs")), 1);
    assert_string_equal(str(j, "active"), id);
    cJSON_Delete(j);

    snprintf(path, sizeof path, "/api/v1/runs/%s/events", id);
    j = callExpect(f->svc, "GET", path, NULL, 200);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(j, "events");
    assert_int_equal(cJSON_GetArraySize(events), 1);
    assert_string_equal(str(cJSON_GetArrayItem(events, 0), "type"), "halt_requested");
    cJSON_Delete(j);
}

/* The memory plan of a GPU with 6 GB free (GPU 1: 5 GB): weights and
 * gradients 1 GB, the optimizer 1 GB over `world` ranks, 1 GB per sequence. */
static int fakePlan(const NsaModelConfig *cfg, const NsaEngineOptions *opt, int world, NsaMemoryReport *out,
                    int *max_batch_fits, NsaError *err) {
    (void)cfg;
    (void)err;
    memset(out, 0, sizeof *out);
    const size_t gb = 1000000000;
    out->params = out->grads = gb / 2;
    out->optimizer = gb / (size_t)world;
    out->activations = (size_t)opt->max_batch * gb;
    out->total = out->params + out->grads + out->optimizer + out->activations;
    out->device_free = opt->device_ordinal == 1 ? 5 * gb : 6 * gb;
    out->device_total = 8 * gb;
    if (max_batch_fits) *max_batch_fits = 4;
    return 0;
}

/* A run config nsad must refuse, and what its message must say. */
typedef struct Refusal {
    const char *body;
    const char *needles[3]; /* each must be in the message; the unused ones NULL */
} Refusal;

/* POSTs r->body as a new run: the answer must be 400 invalid_config with a
 * one-line message holding every needle. */
static void expectRefused(Service *svc, const Refusal *r) {
    ApiResponse res;
    cJSON *j = call(svc, "POST", "/api/v1/runs", r->body, "application/json", &res);
    const char *msg = str(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    if (res.status != 400 || !errorCode(j) || strcmp(errorCode(j), "invalid_config") != 0 || !msg)
        fail_msg("POST %s: got %d %.*s", r->body, res.status, (int)res.body_len, res.body);
    assert_null(strchr(msg, '\n'));
    for (int k = 0; k < 3 && r->needles[k]; k++)
        if (!strstr(msg, r->needles[k]))
            fail_msg("POST %s: \"%s\" lacks \"%s\"", r->body, msg, r->needles[k]);
    cJSON_Delete(j);
    apiResponseFree(&res);
}

/* POST answers 400 with one line, and creates nothing, for what cannot run
 * on this daemon: CUDA without a GPU, data that is not there, a batch the
 * GPU's memory cannot hold. */
static void test_create_refuses_what_cannot_run(void **state) {
    Fixture *f = *state;
    Service *svc = f->svc;
    const Refusal refused[] = {
        {"{\"runtime\":{\"device\":\"cuda\"},\"train\":{\"steps\":5}}",
         {"runtime.device: cuda, but this nsad has no usable GPU (no device probe made)", "allowed here: cpu"}},
        {"{\"runtime\":{\"device\":\"cpu\"},\"data\":{\"source\":\"text\",\"path\":\"/nonexistent/corpus.txt\"}}",
         {"data.path: \"/nonexistent/corpus.txt\": does not exist", "allowed: a .txt or .jsonl file"}},
        {"{\"runtime\":{\"device\":\"cpu\"},\"data\":{\"source\":\"text\",\"path\":\"no-such/corpus.txt\"}}",
         {"data.path: \"no-such/corpus.txt\" (relative to nsad's working directory /", "does not exist"}},
        {"{\"runtime\":{\"device\":\"cpu\"},\"data\":{\"source\":\"shards\",\"path\":\"/nonexistent/*_train_*.bin\"}}",
         {"data.path: \"/nonexistent/*_train_*.bin\" matches no file", "a glob"}},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) expectRefused(svc, &refused[i]);
    assert_int_equal(svc->runs->n_runs, 0);

    /* what the probe said is what the refusal says */
    NsaDeviceInfo none = {.cuda_built = 1, .cuda_devices = 0};
    snprintf(none.description, sizeof none.description, "no CUDA device (no NVIDIA driver or GPU)");
    serviceSetDevices(svc, &none, NULL);
    expectRefused(svc, &(Refusal){"{\"runtime\":{\"device\":\"gpu\"}}", {"no NVIDIA driver"}});
    serviceSetDevices(svc, &none, "CUDA driver version is insufficient for CUDA runtime version");
    expectRefused(svc, &(Refusal){"{\"runtime\":{\"device\":\"cuda\"}}",
                                  {"the CUDA runtime failed: CUDA driver version is insufficient"}});

    /* a GPU: the memory plan decides */
    NsaDeviceInfo one = {.cuda_built = 1, .cuda_devices = 1};
    snprintf(one.description, sizeof one.description, "1 CUDA device: 0: Test GPU, 8.0 GiB");
    serviceSetDevices(svc, &one, NULL);
    svc->memory_plan = fakePlan;
    const char *too_big = "{\"model\":{\"dim\":32,\"n_layers\":1,\"n_heads\":2,\"n_kv_groups\":1,\"d_k\":16,"
                          "\"d_v\":16},\"train\":{\"steps\":5,\"seq_len\":64,\"batch_size\":8},"
                          "\"runtime\":{\"device\":\"cuda\",\"precision\":\"bf16\"}}";
    expectRefused(svc, &(Refusal){too_big,
                                  {"train.batch_size: 8 sequences of 64 tokens need 10.0 GB",
                                   "GPU 0 has 6.0 GB free", "allowed: train.batch_size up to 4"}});
    assert_int_equal(svc->runs->n_runs, 0);

    /* several GPUs (runtime.gpus): each GPU's plan, the optimizer sharded
     * over the job's ranks (at least one more per node of runtime.nodes) */
    NsaDeviceInfo two = {.cuda_built = 1, .cuda_devices = 2};
    snprintf(two.description, sizeof two.description, "2 CUDA devices: 0: Test GPU, 8.0 GiB; 1: Test GPU, 8.0 GiB");
    serviceSetDevices(svc, &two, NULL);
    static const struct {
        const char *runtime;
        int batch;
        const char *needles[3];
    } multi[] = {
        {"\"gpus\":3", 1, {"runtime.gpus: 3, but this machine has 2 CUDA devices", NULL}},
        {"\"gpus\":[0,2]", 1, {"runtime.gpus: GPU 2 is not here", NULL}},
        {"\"gpus\":2", 4,
         {"need 5.5 GB of GPU memory per GPU (one of 2 data-parallel ranks", "GPU 1 has 5.0 GB free", NULL}},
        {"\"gpus\":[0],\"nodes\":[\"127.0.0.1:1\"]", 5,
         {"need 6.5 GB of GPU memory per GPU (one of at least 2 data-parallel ranks", "GPU 0 has 6.0 GB free",
          NULL}},
    };
    for (size_t i = 0; i < sizeof multi / sizeof multi[0]; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\":{\"dim\":32,\"n_layers\":1,\"n_heads\":2,\"n_kv_groups\":1,\"d_k\":16,"
                 "\"d_v\":16},\"train\":{\"steps\":5,\"seq_len\":64,\"batch_size\":%d},"
                 "\"runtime\":{\"device\":\"cuda\",%s}}",
                 multi[i].batch, multi[i].runtime);
        expectRefused(svc, &(Refusal){body, {multi[i].needles[0], multi[i].needles[1], multi[i].needles[2]}});
    }
    assert_int_equal(svc->runs->n_runs, 0);
    serviceSetDevices(svc, &one, NULL);

    const char *fits = "{\"model\":{\"dim\":32,\"n_layers\":1,\"n_heads\":2,\"n_kv_groups\":1,\"d_k\":16,"
                       "\"d_v\":16},\"train\":{\"steps\":5,\"seq_len\":64,\"batch_size\":2}}";
    cJSON *j = callExpect(svc, "POST", "/api/v1/runs", fits, 201); /* device auto: cuda here */
    assert_string_equal(str(j, "device"), "cuda");
    assert_string_equal(str(j, "precision"), "bf16");
    cJSON_Delete(j);
}

/* runtime.device auto becomes what this daemon has, in the run's config. */
static void test_auto_device_is_pinned(void **state) {
    Fixture *f = *state;
    cJSON *j = callExpect(f->svc, "POST", "/api/v1/runs",
                          "{\"model\":{\"dim\":32,\"n_layers\":1,\"n_heads\":2,\"n_kv_groups\":1,\"d_k\":16,"
                          "\"d_v\":16},\"train\":{\"steps\":5,\"seq_len\":64,\"batch_size\":2},"
                          "\"runtime\":{\"device\":\"auto\"}}",
                          201);
    assert_string_equal(str(j, "device"), "cpu");
    cJSON_Delete(j);
    Run *run = f->svc->runs->runs[0];
    assert_non_null(strstr(run->config_yaml, "  device: cpu\n"));
}

static void test_metrics_series_and_since(void **state) {
    Fixture *f = *state;
    char id[RUN_ID_MAX];
    cJSON_Delete(postTinyRun(f->svc, "/api/v1/runs", id));
    pthread_mutex_lock(&f->svc->lock);
    Run *run = runsFind(f->svc->runs, id);
    for (int64_t s = 1; s <= 5; s++)
        runsAddStep(run, &(TrainStepLog){.step = s,
                                          .total_steps = 20,
                                          .ts = 1.0,
                                          .loss = 5.0 - (double)s * 0.1,
                                          .lr = 1e-3,
                                          .grad_norm = 1.0,
                                          .toks_per_s = 10,
                                          .mem_bytes = 7});
    runsAddStep(run, &(TrainStepLog){.step = 6, .loss = NAN});
    runsAddEval(run, 4, 1.0, 4.5, 6.5);
    pthread_mutex_unlock(&f->svc->lock);

    char path[200];
    snprintf(path, sizeof path, "/api/v1/runs/%s/metrics?since=4", id);
    cJSON *j = callExpect(f->svc, "GET", path, NULL, 200);
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(j, "train");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(j, "val");
    assert_int_equal(cJSON_GetArraySize(train), 3);
    assert_int_equal(cJSON_GetArraySize(val), 1);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(train, 0), "step")->valueint, 4);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(train, 2), "loss")));
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "next")->valueint, 7);
    assert_string_equal(str(j, "run_id"), id);
    cJSON_Delete(j);

    snprintf(path, sizeof path, "/api/v1/runs/%s/metrics?since=7", id);
    j = callExpect(f->svc, "GET", path, NULL, 200);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "train")), 0);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "next")->valueint, 7);
    cJSON_Delete(j);

    expectBadQueries(f->svc, "GET", id, "metrics", (const char *[]){"since=x", "since=-2", "since=", NULL});
    expectError(f->svc, "GET", "/api/v1/runs/nope/metrics", NULL, NULL, 404, "not_found");
}

/* The number at key of the object, NAN when absent or null. */
static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void test_mfu_and_tokens(void **state) {
    Fixture *f = *state;
    char id[RUN_ID_MAX];
    cJSON *j = postTinyRun(f->svc, "/api/v1/runs", id);
    /* before the trainer took it: no MFU, no FLOPs, no peak */
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "mfu")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "peak_flops")));
    cJSON_Delete(j);
    pthread_mutex_lock(&f->svc->lock);
    Run *run = runsFind(f->svc->runs, id);
    run->flops_per_token = 6e9;
    run->peak_flops = 12e12; /* what runJob sets from the config and the GPU's peak */
    for (int64_t s = 1; s <= 5; s += 2) /* logged every other step: 128 tokens a step */
        runsAddStep(run, &(TrainStepLog){.step = s, .ts = 1.0, .loss = 4.0, .toks_per_s = 1000.0 * (double)s,
                                          .tokens_seen = 128 * s});
    runsAddEval(run, 2, 1.0, 4.0, 6.0);
    runsAddEval(run, 3, 1.0, 4.0, 6.0);
    runsAddEval(run, 7, 1.0, 4.0, 6.0);
    pthread_mutex_unlock(&f->svc->lock);

    char path[200];
    snprintf(path, sizeof path, "/api/v1/runs/%s", id);
    j = callExpect(f->svc, "GET", path, NULL, 200);
    /* 5000 tok/s x 6e9 FLOPs / 12e12 FLOP/s */
    assert_true(fabs(num(j, "mfu") - 2.5) < 1e-12);
    assert_true(num(j, "flops_per_token") == 6e9 && num(j, "peak_flops") == 12e12);
    cJSON_Delete(j);

    snprintf(path, sizeof path, "/api/v1/runs/%s/metrics", id);
    j = callExpect(f->svc, "GET", path, NULL, 200);
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(j, "train");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(j, "val");
    assert_int_equal(cJSON_GetArraySize(train), 3);
    assert_true(fabs(num(cJSON_GetArrayItem(train, 0), "mfu") - 0.5) < 1e-12);
    assert_true(num(cJSON_GetArrayItem(train, 1), "tokens") == 384);
    /* evaluations: at a logged step its tokens, between two the line through
     * them, past the last the line through the last two */
    assert_true(num(cJSON_GetArrayItem(val, 0), "tokens") == 256);
    assert_true(num(cJSON_GetArrayItem(val, 1), "tokens") == 384);
    assert_true(num(cJSON_GetArrayItem(val, 2), "tokens") == 896);
    cJSON_Delete(j);

    char *text = promRender(f->svc, NULL);
    char want[200];
    snprintf(want, sizeof want, "nsad_run_mfu{run_id=\"%s\"} 2.5\n", id);
    assert_non_null(strstr(text, want));
    free(text);

    /* a CPU run's peak is not known: null, and no gauge */
    pthread_mutex_lock(&f->svc->lock);
    run->peak_flops = NAN;
    pthread_mutex_unlock(&f->svc->lock);
    snprintf(path, sizeof path, "/api/v1/runs/%s", id);
    j = callExpect(f->svc, "GET", path, NULL, 200);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "mfu")));
    cJSON_Delete(j);
    text = promRender(f->svc, NULL);
    assert_null(strstr(text, "nsad_run_mfu{"));
    free(text);
}

static void noteSuspend(void *ctx) { *(int *)ctx = 1; }

/* Everything buffered in the stream (malloc'd); *ended: its end was read. */
static char *drainStream(Stream *s, int *ended) {
    size_t len = 0, cap = 1 << 16;
    char *out = calloc(1, cap);
    int suspended = 0;
    ssize_t n;
    while ((n = streamRead(s, out + len, cap - 1 - len, noteSuspend, &suspended)) > 0) len += (size_t)n;
    *ended = n < 0;
    out[len] = '\0';
    return out;
}

/* GET path, expecting a 200 stream of JSON lines; returns what it holds. */
static char *getLines(Service *svc, const char *path, int *ended, Stream **keep) {
    ApiResponse res;
    cJSON *j = call(svc, "GET", path, NULL, NULL, &res);
    if (res.status != 200 || !res.stream) fail_msg("GET %s: %d %.*s", path, res.status, (int)res.body_len, res.body);
    assert_string_equal(res.content_type, "application/x-ndjson");
    cJSON_Delete(j);
    char *text = drainStream(res.stream, ended);
    if (keep) {
        *keep = res.stream; /* the caller reads on and releases */
        res.stream = NULL;
    }
    apiResponseFree(&res);
    return text;
}

static void test_run_logs(void **state) {
    Fixture *f = *state;
    logSetRunSink(runlogAppend, f->svc->runlog);
    char id[RUN_ID_MAX], path[256];
    cJSON_Delete(postTinyRun(f->svc, "/api/v1/runs?name=logged", id));
    /* a line of the trainer thread's (bound to the run), and one of another thread */
    logBindRun(id);
    logInfo("a line from the run's job");
    logBindRun(NULL);
    logInfo("a line of nobody's run");

    int ended = 0;
    snprintf(path, sizeof path, "/api/v1/runs/%s/logs", id);
    char *text = getLines(f->svc, path, &ended, NULL);
    assert_true(ended); /* no follow: the stored lines, then the end */
    assert_non_null(strstr(text, "created (logged,"));
    assert_non_null(strstr(text, "a line from the run's job"));
    assert_null(strstr(text, "nobody's run"));
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *o = cJSON_Parse(line);
        assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "ts")));
        assert_non_null(str(o, "level"));
        assert_non_null(str(o, "message"));
        cJSON_Delete(o);
    }
    assert_int_equal(lines, 2);
    free(text);

    snprintf(path, sizeof path, "/api/v1/runs/%s/logs?tail=1", id);
    text = getLines(f->svc, path, &ended, NULL);
    assert_non_null(strstr(text, "\"level\":\"info\",\"message\":\"a line from the run's job\""));
    assert_null(strstr(text, "created"));
    free(text);
    snprintf(path, sizeof path, "/api/v1/runs/%s/logs?tail=0", id);
    text = getLines(f->svc, path, &ended, NULL);
    assert_string_equal(text, "");
    free(text);

    /* follow an active run: stored lines, each new line, the end when its job ends */
    Stream *s = NULL;
    snprintf(path, sizeof path, "/api/v1/runs/%s/logs?follow=1&tail=0", id);
    text = getLines(f->svc, path, &ended, &s);
    assert_false(ended);
    assert_string_equal(text, "");
    free(text);
    logRunWarn(id, "run %s: something to see", id);
    text = drainStream(s, &ended);
    assert_false(ended);
    assert_non_null(strstr(text, "\"level\":\"warning\""));
    assert_non_null(strstr(text, "something to see"));
    free(text);
    pthread_mutex_lock(&f->svc->lock);
    runlogEnd(f->svc->runlog, id); /* what the end of the run's job does */
    pthread_mutex_unlock(&f->svc->lock);
    text = drainStream(s, &ended);
    assert_true(ended);
    free(text);
    streamRelease(s);

    /* a run that is not active: follow ends after the stored lines */
    pthread_mutex_lock(&f->svc->lock);
    NsaError err;
    runsSetState(runsFind(f->svc->runs, id), RUN_HALTED, &err);
    f->svc->trainers[0].active_id[0] = '\0';
    pthread_mutex_unlock(&f->svc->lock);
    snprintf(path, sizeof path, "/api/v1/runs/%s/logs?follow=1", id);
    text = getLines(f->svc, path, &ended, NULL);
    assert_true(ended);
    assert_non_null(strstr(text, "something to see"));
    free(text);

    /* a full log.jsonl moves to log.1.jsonl; a reader gets both */
    char file[700];
    snprintf(file, sizeof file, "%s/runs/%s/log.jsonl", f->dir, id);
    FILE *big = fopen(file, "a");
    while ((size_t)ftell(big) < RUNLOG_FILE_MAX)
        fprintf(big, "{\"ts\":1,\"level\":\"info\",\"message\":\"%-25s\"}\n", "filler");
    fclose(big);
    logRunNotice(id, "after the move");
    snprintf(file, sizeof file, "%s/runs/%s/log.1.jsonl", f->dir, id);
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    snprintf(path, sizeof path, "/api/v1/runs/%s/logs?tail=2", id);
    text = getLines(f->svc, path, &ended, NULL);
    assert_non_null(strstr(text, "filler"));
    assert_non_null(strstr(text, "after the move"));
    free(text);

    expectBadQueries(f->svc, "GET", id, "logs", (const char *[]){"follow=2", "tail=-1", "lines=3", NULL});
    snprintf(path, sizeof path, "/api/v1/runs/%s/logs", id);
    expectError(f->svc, "POST", path, NULL, NULL, 405, "method_not_allowed");
    expectError(f->svc, "GET", "/api/v1/runs/20000101-000000-dead/logs", NULL, NULL, 404, "not_found");
    logSetRunSink(NULL, NULL);
}

/* ---- a log read holds no lock while it reads ---- */

/* The read hook of test_run_logs_read_holds_no_lock: the first read waits
 * in it (a slow disk) until the test lets it go; later ones pass. */
typedef struct SlowDisk {
    sem_t entered, go;
    atomic_int reads;
} SlowDisk;

static void slowDiskRead(void *ctx) {
    SlowDisk *d = ctx;
    if (atomic_fetch_add(&d->reads, 1) != 0) return;
    sem_post(&d->entered);
    while (sem_wait(&d->go) != 0)
        continue;
}

/* 0 once sem is posted, -1 after `seconds` without. */
static int semWaitFor(sem_t *sem, int seconds) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    int rc;
    while ((rc = sem_timedwait(sem, &until)) != 0 && errno == EINTR)
        continue;
    return rc;
}

/* One GET on a thread of its own (no cmocka checks off the main thread). */
typedef struct BackgroundGet {
    Service *svc;
    char path[300];
    ApiResponse res;
} BackgroundGet;

static void *backgroundGetMain(void *arg) {
    BackgroundGet *g = arg;
    cJSON_Delete(call(g->svc, "GET", g->path, NULL, NULL, &g->res));
    return NULL;
}

/* What other requests do while a log read is slow: read a run (the
 * service's lock), log a line for it (the run log's lock) and read its
 * log again; then `done` is posted. */
typedef struct OtherWork {
    Service *svc;
    const char *id;
    int run_status, tail_status;
    char *tail_text;
    sem_t done;
} OtherWork;

static void *otherWorkMain(void *arg) {
    OtherWork *w = arg;
    char path[300];
    ApiResponse res;
    snprintf(path, sizeof path, "/api/v1/runs/%s", w->id);
    cJSON_Delete(call(w->svc, "GET", path, NULL, NULL, &res));
    w->run_status = res.status;
    apiResponseFree(&res);
    logRunNotice(w->id, "logged during the slow read");
    snprintf(path, sizeof path, "/api/v1/runs/%s/logs?tail=1", w->id);
    cJSON_Delete(call(w->svc, "GET", path, NULL, NULL, &res));
    w->tail_status = res.status;
    if (res.stream) {
        int ended;
        w->tail_text = drainStream(res.stream, &ended);
    }
    apiResponseFree(&res);
    sem_post(&w->done);
    return NULL;
}

static size_t countOf(const char *text, const char *what) {
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

/* A slow read of GET /api/v1/runs/{id}/logs (up to 8 MiB) blocks no other
 * request: the route reads the files with neither the service's lock nor
 * the run log's held. A follower still gets every stored line, then the
 * lines logged during its read, each once and in order; a job that ends
 * during the read, or a rotation, loses or doubles nothing either. */
static void test_run_logs_read_holds_no_lock(void **state) {
    Fixture *f = *state;
    logSetRunSink(runlogAppend, f->svc->runlog);
    char id[RUN_ID_MAX];
    cJSON_Delete(postTinyRun(f->svc, "/api/v1/runs?name=slow", id));
    logRunNotice(id, "stored before the read");

    SlowDisk disk = {.reads = 0};
    sem_init(&disk.entered, 0, 0);
    sem_init(&disk.go, 0, 0);
    runlogSetReadHook(f->svc->runlog, slowDiskRead, &disk);
    BackgroundGet slow = {.svc = f->svc};
    snprintf(slow.path, sizeof slow.path, "/api/v1/runs/%s/logs?follow=1", id);
    pthread_t slow_thread, other_thread;
    assert_int_equal(pthread_create(&slow_thread, NULL, backgroundGetMain, &slow), 0);
    int entered = semWaitFor(&disk.entered, 30) == 0;
    OtherWork other = {.svc = f->svc, .id = id};
    sem_init(&other.done, 0, 0);
    int other_done = 0;
    if (entered) {
        assert_int_equal(pthread_create(&other_thread, NULL, otherWorkMain, &other), 0);
        other_done = semWaitFor(&other.done, 10) == 0; /* while the first read still waits */
    }
    sem_post(&disk.go);
    pthread_join(slow_thread, NULL);
    if (entered) pthread_join(other_thread, NULL);
    runlogSetReadHook(f->svc->runlog, NULL, NULL);
    assert_true(entered);
    if (!other_done) fail_msg("other requests waited for a slow log read");
    assert_int_equal(other.run_status, 200);
    assert_int_equal(other.tail_status, 200);
    assert_non_null(other.tail_text);
    assert_non_null(strstr(other.tail_text, "logged during the slow read"));
    free(other.tail_text);

    /* the slow reader: the stored lines, then the one logged meanwhile, once */
    assert_int_equal(slow.res.status, 200);
    Stream *s = slow.res.stream;
    assert_non_null(s);
    slow.res.stream = NULL;
    apiResponseFree(&slow.res);
    int ended = 0;
    char *text = drainStream(s, &ended);
    assert_false(ended);
    const char *stored = strstr(text, "stored before the read");
    const char *during = strstr(text, "logged during the slow read");
    assert_non_null(stored);
    assert_non_null(during);
    assert_true(stored < during);
    assert_int_equal(countOf(text, "logged during the slow read"), 1);
    free(text);
    logRunNotice(id, "after the read");
    text = drainStream(s, &ended);
    assert_int_equal(countOf(text, "after the read"), 1);
    assert_null(strstr(text, "during the slow read"));
    free(text);
    pthread_mutex_lock(&f->svc->lock);
    runlogEnd(f->svc->runlog, id);
    pthread_mutex_unlock(&f->svc->lock);
    text = drainStream(s, &ended);
    assert_true(ended);
    free(text);
    streamRelease(s);

    /* the job ends between the two steps: the stored lines, the line logged
     * meanwhile, then the end */
    NsaError err = {""};
    pthread_mutex_lock(&f->svc->lock);
    RunLogRead *rd = runlogReadStart(f->svc->runlog, id, 1, 1, &err);
    pthread_mutex_unlock(&f->svc->lock);
    assert_non_null(rd);
    logRunNotice(id, "the job's last line");
    pthread_mutex_lock(&f->svc->lock);
    runlogEnd(f->svc->runlog, id);
    pthread_mutex_unlock(&f->svc->lock);
    s = runlogReadFinish(f->svc->runlog, rd, &err);
    assert_non_null(s);
    text = drainStream(s, &ended);
    assert_true(ended);
    assert_int_equal(countOf(text, "\n"), 2); /* tail=1, then the one logged meanwhile */
    assert_non_null(strstr(text, "after the read"));
    assert_int_equal(countOf(text, "the job's last line"), 1);
    free(text);
    streamRelease(s);

    /* log.jsonl moves to log.1.jsonl between the two steps: what was stored
     * at step one, exactly, then the line that moved it */
    char file[700], old_file[700];
    snprintf(file, sizeof file, "%s/runs/%s/log.jsonl", f->dir, id);
    snprintf(old_file, sizeof old_file, "%s/runs/%s/log.1.jsonl", f->dir, id);
    size_t stored_len = 0;
    char *want = NULL;
    {
        FILE *in = fopen(file, "r");
        assert_non_null(in);
        want = calloc(1, 1 << 20);
        stored_len = fread(want, 1, (1 << 20) - 1, in);
        fclose(in);
    }
    pthread_mutex_lock(&f->svc->lock);
    rd = runlogReadStart(f->svc->runlog, id, -1, 1, &err);
    pthread_mutex_unlock(&f->svc->lock);
    assert_non_null(rd);
    FILE *big = fopen(file, "a"); /* not through the run log: past what step one took */
    while ((size_t)ftell(big) < RUNLOG_FILE_MAX)
        fprintf(big, "{\"ts\":1,\"level\":\"info\",\"message\":\"%-25s\"}\n", "filler");
    fclose(big);
    logRunNotice(id, "the line that moved it");
    struct stat st;
    assert_int_equal(stat(old_file, &st), 0);
    s = runlogReadFinish(f->svc->runlog, rd, &err);
    assert_non_null(s);
    text = drainStream(s, &ended);
    assert_false(ended);
    assert_int_equal(strncmp(text, want, stored_len), 0);
    assert_null(strstr(text, "filler"));
    assert_int_equal(countOf(text + stored_len, "\n"), 1);
    assert_non_null(strstr(text + stored_len, "the line that moved it"));
    free(text);
    free(want);
    pthread_mutex_lock(&f->svc->lock);
    runlogEnd(f->svc->runlog, id);
    pthread_mutex_unlock(&f->svc->lock);
    free(drainStream(s, &ended));
    assert_true(ended);
    streamRelease(s);
    sem_destroy(&other.done);
    sem_destroy(&disk.entered);
    sem_destroy(&disk.go);
    logSetRunSink(NULL, NULL);
}

static void test_interrupted_run_is_picked_up(void **state) {
    Fixture *f = *state;
    char id[RUN_ID_MAX];
    cJSON_Delete(postTinyRun(f->svc, "/api/v1/runs", id));
    pthread_mutex_lock(&f->svc->lock);
    Run *run = runsFind(f->svc->runs, id);
    NsaError err = {""};
    assert_int_equal(runsSetState(run, RUN_RUNNING, &err), 0);
    run->last_checkpoint_step = 10;
    assert_int_equal(runsSave(run, &err), 0);
    pthread_mutex_unlock(&f->svc->lock);
    /* the daemon dies here; a new one opens the same state dir */
    serviceClose(f->svc);
    f->svc = serviceOpen(f->dir, &err);
    assert_non_null(f->svc);
    run = runsFind(f->svc->runs, id);
    assert_non_null(run);
    assert_int_equal(run->state, RUN_STARTING);
    assert_int_equal(run->restarts, 1);
    assert_string_equal(f->svc->trainers[0].active_id, id);
    assert_int_equal(f->svc->trainers[0].pending, SERVICE_PENDING_RESUME);
    assert_string_equal(run->events[run->n_events - 1].type, "restart");
    assert_int_equal(run->events[run->n_events - 1].step, 10);
    expectError(f->svc, "POST", "/api/v1/runs?queue=false", kTinyJson, "application/json", 409, "busy");
}

static void test_watchdog_flags_an_overrun_and_a_recovery(void **state) {
    Fixture *f = *state;
    char id[RUN_ID_MAX];
    cJSON_Delete(postTinyRun(f->svc, "/api/v1/runs", id));
    /* play the trainer thread: it took the job and is in forward */
    Service *svc = f->svc;
    pthread_mutex_lock(&svc->lock);
    svc->trainers[0].pending = SERVICE_PENDING_NONE;
    svc->trainers[0].deadlines.forward = 0.5;
    svc->trainers[0].deadlines.on_hang = HANG_REPORT;
    Run *run = runsFind(svc->runs, id);
    NsaError err;
    runsSetState(run, RUN_RUNNING, &err);
    pthread_mutex_unlock(&svc->lock);
    trainMonitorEnter(&svc->trainers[0].mon, PHASE_FORWARD);
    int64_t since = atomic_load(&svc->trainers[0].mon.phase_since_ns);
    /* what the trainer keeps for the dump: its device, memory at the last
     * logged step, the last step whose results came back (2 s before) */
    trainMonitorSetDevice(&svc->trainers[0].mon, "cuda, bf16; 1 CUDA device: 0: Test GPU");
    atomic_store(&svc->trainers[0].mon.memory_bytes, 1500000000LL);
    atomic_store(&svc->trainers[0].mon.memory_step, 9);
    atomic_store(&svc->trainers[0].mon.step_done, 10);
    atomic_store(&svc->trainers[0].mon.step_done_ns, since + 600000000LL - 2000000000LL);

    char dump[RUN_PATH_MAX + 64] = "";
    assert_int_equal(watchdogCheck(svc, since + 400000000LL, dump, sizeof dump), 0);
    assert_int_equal(watchdogCheck(svc, since + 600000000LL, dump, sizeof dump), 1);
    assert_int_equal(run->state, RUN_HUNG);
    assert_string_equal(run->anomaly, "hang:forward");
    assert_string_equal(run->events[run->n_events - 1].type, "hang");
    assert_non_null(strstr(run->events[run->n_events - 1].detail_json, "\"phase\":\"forward\""));
    FILE *file = fopen(dump, "r");
    assert_non_null(file);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, file);
    text[n] = '\0';
    fclose(file);
    assert_non_null(strstr(text, "phase: forward"));
    assert_non_null(strstr(text, id));
    assert_non_null(strstr(text, "device: cuda, bf16; 1 CUDA device: 0: Test GPU\n"));
    assert_non_null(strstr(text, "device_memory: 1.50 GB in use at step 9\n"));
    assert_non_null(strstr(text, "last_step_done: step 10, 2.0 s ago\n"));
    assert_int_equal(atomic_load(&svc->hangs_total), 1);
    /* the same overrun is reported once */
    assert_int_equal(watchdogCheck(svc, since + 5000000000LL, NULL, 0), 0);
    /* the phase ends: running again */
    trainMonitorEnter(&svc->trainers[0].mon, PHASE_BACKWARD);
    assert_int_equal(watchdogCheck(svc, atomic_load(&svc->trainers[0].mon.phase_since_ns) + 1000, NULL, 0), 0);
    assert_int_equal(run->state, RUN_RUNNING);
    assert_string_equal(run->anomaly, "");
    assert_string_equal(run->events[run->n_events - 1].type, "recovered");
}

/* A run halted before or while it hangs stays halting when the phase ends. */
static void test_hang_during_halt_keeps_halting(void **state) {
    Fixture *f = *state;
    Service *svc = f->svc;
    char id[RUN_ID_MAX];
    cJSON_Delete(postTinyRun(svc, "/api/v1/runs", id));
    pthread_mutex_lock(&svc->lock);
    svc->trainers[0].pending = SERVICE_PENDING_NONE;
    svc->trainers[0].deadlines.checkpoint = 1.0;
    Run *run = runsFind(svc->runs, id);
    pthread_mutex_unlock(&svc->lock);
    NsaError err;
    assert_int_equal(serviceHaltRun(svc, id, &err), SVC_OK);
    assert_int_equal(run->state, RUN_HALTING);
    trainMonitorEnter(&svc->trainers[0].mon, PHASE_CHECKPOINT);
    int64_t since = atomic_load(&svc->trainers[0].mon.phase_since_ns);
    assert_int_equal(watchdogCheck(svc, since + 1500000000LL, NULL, 0), 1);
    assert_int_equal(run->state, RUN_HUNG);
    assert_int_equal(serviceHaltRun(svc, id, &err), SVC_OK); /* halting a hung run is allowed */
    assert_int_equal(run->state, RUN_HALTING);
    trainMonitorEnter(&svc->trainers[0].mon, PHASE_IDLE);
    assert_int_equal(watchdogCheck(svc, atomic_load(&svc->trainers[0].mon.phase_since_ns) + 1000, NULL, 0), 0);
    assert_int_equal(run->state, RUN_HALTING);
    assert_int_equal(svc->trainers[0].hang_flagged_since, 0);

    /* a halting run that hangs goes back to halting when the phase ends */
    trainMonitorEnter(&svc->trainers[0].mon, PHASE_CHECKPOINT);
    since = atomic_load(&svc->trainers[0].mon.phase_since_ns);
    assert_int_equal(watchdogCheck(svc, since + 1500000000LL, NULL, 0), 1);
    assert_int_equal(run->state, RUN_HUNG);
    trainMonitorEnter(&svc->trainers[0].mon, PHASE_DATA);
    assert_int_equal(watchdogCheck(svc, atomic_load(&svc->trainers[0].mon.phase_since_ns) + 1000, NULL, 0), 0);
    assert_int_equal(run->state, RUN_HALTING);
}

/* Every sample line belongs to a family announced by HELP and TYPE. */
static void test_prometheus_exposition(void **state) {
    Fixture *f = *state;
    char id[RUN_ID_MAX];
    cJSON_Delete(postTinyRun(f->svc, "/api/v1/runs", id));
    serviceCountRequest(f->svc, 404);
    ApiResponse res;
    cJSON *j = call(f->svc, "GET", "/metrics", NULL, NULL, &res);
    assert_null(j);
    assert_int_equal(res.status, 200);
    assert_string_equal(res.content_type, PROM_CONTENT_TYPE);
    char *text = strndup(res.body, res.body_len);
    apiResponseFree(&res);
    assert_true(text[strlen(text) - 1] == '\n');
    char family[128] = "";
    int samples = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char name[128];
        if (sscanf(line, "# TYPE %127s", name) == 1) {
            snprintf(family, sizeof family, "%s", name);
            continue;
        }
        if (line[0] == '#') continue;
        size_t len = strcspn(line, "{ ");
        assert_true(len > 5 && !strncmp(line, "nsad_", 5));
        if (strlen(family) != len || strncmp(line, family, len) != 0)
            fail_msg("sample outside its family: %s", line);
        samples++;
    }
    free(text);
    assert_true(samples > 20);
    char *again = promRender(f->svc, NULL);
    assert_non_null(strstr(again, "nsad_up 1\n"));
    assert_non_null(strstr(again, "nsad_runs{state=\"starting\"} 1\n"));
    assert_non_null(strstr(again, "nsad_trainer_busy 1\n"));
    assert_non_null(strstr(again, "nsad_http_requests_total{code=\"404\"} 1\n"));
    assert_non_null(strstr(again, "# TYPE nsad_http_requests_total counter\n"));
    free(again);
}

static void test_loopback_addresses(void **state) {
    (void)state;
    const char *loopback[] = {"127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1", "localhost"};
    const char *other[] = {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "example.com", NULL};
    for (size_t i = 0; i < sizeof loopback / sizeof loopback[0]; i++)
        if (serverIsLoopback(loopback[i]) != 1) fail_msg("%s is a loopback address", loopback[i]);
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (serverIsLoopback(other[i]) != 0)
            fail_msg("%s is not a loopback address", other[i] ? other[i] : "NULL");
}

/* POST /api/v1/sample with body: status and, for an error, a message
 * holding want (want NULL: 503 unavailable, the service has no inference
 * worker: the body was accepted and would have been queued). */
static void expectSample(Service *svc, const char *body, int status, const char *want) {
    ApiResponse res;
    cJSON *json = call(svc, "POST", "/api/v1/sample", body, "application/json", &res);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(json, "error");
    const char *msg = str(e, "message"), *code = str(e, "code");
    const int ok = want ? res.status == status && code && !strcmp(code, "invalid_argument") &&
                              msg && strstr(msg, want)
                        : res.status == 503 && code && !strcmp(code, "unavailable");
    if (!ok)
        fail_msg("POST /api/v1/sample %.200s: got %d %.*s, want %d %s", body, res.status,
                 (int)res.body_len, res.body, want ? status : 503, want ? want : "unavailable");
    cJSON_Delete(json);
    apiResponseFree(&res);
}

/* A sample body for checkpoint ck with n prompt ids (0 to 9). Returns it
 * malloc'd; the caller frees it. */
static char *idsBody(const char *ck, int n) {
    char *b = malloc((size_t)n * 2 + strlen(ck) + 64);
    assert_non_null(b);
    int at = sprintf(b, "{\"checkpoint\":\"%s\",\"prompt_ids\":[", ck);
    for (int i = 0; i < n; i++)
        at += sprintf(b + at, "%s%d", i ? "," : "", i % 10);
    sprintf(b + at, "]}");
    return b;
}

/* The sample route's prompt: text (prompt) or token ids (prompt_ids), one
 * of the two; each malformed prompt_ids is refused 400 naming what is
 * wrong (the vocabulary is the worker's to check: it reads the model). */
static void test_sample_prompt_ids(void **state) {
    Fixture *f = *state;
    char ck[600], path[700];
    snprintf(ck, sizeof ck, "%s/ckpt", f->dir);
    assert_int_equal(mkdir(ck, 0755), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", ck); /* enough for the route to find */
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fclose(fp);
    char body[800];
#define SAMPLE_BODY(rest)                                                                          \
    (snprintf(body, sizeof body, "{\"checkpoint\":\"%s\",%s}", ck, rest), body)
    /* accepted (no worker here: 503) */
    expectSample(f->svc, SAMPLE_BODY("\"prompt\":\"Hi\""), 503, NULL);
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[3,14,15]"), 503, NULL);
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[0,16777215],\"n\":2,\"stop\":[]"), 503, NULL);
    /* one of the two */
    expectSample(f->svc, SAMPLE_BODY("\"n\":1"), 400,
                 "prompt (text) or prompt_ids (an array of token ids) is required");
    expectSample(f->svc, SAMPLE_BODY("\"prompt\":\"Hi\",\"prompt_ids\":[1]"), 400,
                 "prompt and prompt_ids: give one of the two, not both");
    /* its shape and each id */
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":\"3,14\""), 400,
                 "prompt_ids: not an array; allowed: an array of 1 to 65536 token ids");
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":{}"), 400, "prompt_ids: not an array");
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[]"), 400, "prompt_ids: empty");
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[1,2.5]"), 400,
                 "prompt_ids[1]: 2.5 is not a whole number; allowed: a whole number from 0 to "
                 "16777215");
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[1,2,\"7\"]"), 400,
                 "prompt_ids[2]: \"7\" is not a number");
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[null]"), 400,
                 "prompt_ids[0]: null is not a number");
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[-1]"), 400,
                 "prompt_ids[0]: -1 is out of range");
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[5,16777216]"), 400,
                 "prompt_ids[1]: 16777216 is out of range");
    /* stop strings need text; an empty list is no stop */
    expectSample(f->svc, SAMPLE_BODY("\"prompt_ids\":[1],\"stop\":[\"a\"]"), 400,
                 "stop: stop strings with prompt_ids; allowed: none");
    /* too long: more ids than a prompt may hold */
    char *big = idsBody(ck, 65537);
    expectSample(f->svc, big, 400,
                 "prompt_ids: 65537 ids, longer than a prompt may be; allowed: an array of 1 to "
                 "65536");
    free(big);
    big = idsBody(ck, 65536);
    expectSample(f->svc, big, 503, NULL);
    free(big);
#undef SAMPLE_BODY
}

/* A test on a service of its own (setUp) */
#define SERVICE_TEST(test) cmocka_unit_test_setup_teardown(test, setUp, tearDown)

int main(void) {
    const struct CMUnitTest tests[] = {
        SERVICE_TEST(test_health_version_and_routing),
        SERVICE_TEST(test_create_busy_halt_resume),
        SERVICE_TEST(test_create_refuses_what_cannot_run),
        SERVICE_TEST(test_auto_device_is_pinned),
        SERVICE_TEST(test_metrics_series_and_since),
        SERVICE_TEST(test_mfu_and_tokens),
        SERVICE_TEST(test_run_logs),
        SERVICE_TEST(test_run_logs_read_holds_no_lock),
        SERVICE_TEST(test_interrupted_run_is_picked_up),
        SERVICE_TEST(test_watchdog_flags_an_overrun_and_a_recovery),
        SERVICE_TEST(test_hang_during_halt_keeps_halting),
        SERVICE_TEST(test_prometheus_exposition),
        SERVICE_TEST(test_sample_prompt_ids),
        cmocka_unit_test(test_loopback_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
