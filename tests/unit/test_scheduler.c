/* test_scheduler.c - the service's trainers and scheduler (daemon/
 * service.c) with their threads running: runs on disjoint GPUs train at
 * once, a run waits for the GPUs it claims, a small run may pass a big one
 * waiting for busy GPUs but never takes what that one waits for, the CPU
 * engine is one claim of its own, and the busy answer names the holder.
 *
 * The node is made up: the service is told it has two GPUs, plans memory
 * with a stand-in and trains with a stand-in that holds each job until the
 * test releases it, so the scheduling is seen exactly, without a GPU and
 * without timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "api.h"
#include "prom.h"
#include "scheduler.h"
#include "service.h"

#define MAX_JOBS 512

/* What the stand-in trainer saw: the jobs that started, in order, the ones
 * the test let finish, how many ran at once at most, and how often a job
 * started while another held part of what it claims (never, if the
 * scheduler is right). */
typedef struct Bench {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char started[MAX_JOBS][RUN_ID_MAX];
    int n_started;
    char released[MAX_JOBS][RUN_ID_MAX];
    int n_released;
    int running, most_running;
    ServiceClaim held;   /* what the running jobs claim together */
    int overlaps;
} Bench;

static Bench bench = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int listed(char (*ids)[RUN_ID_MAX], int n, const char *id) {
    for (int i = 0; i < n; i++)
        if (!strcmp(ids[i], id)) return 1;
    return 0;
}

/* What job cfg claims on the made-up two-GPU node, worked out here
 * independently of the service. */
static ServiceClaim jobClaim(const JobConfig *cfg) {
    const RuntimeConfig *rt = &cfg->runtime;
    ServiceClaim c = {0};
    if (rt->device != NSA_DEVICE_CUDA) c.cpu = 1;
    else if (rt->n_gpu_list > 0)
        for (int i = 0; i < rt->n_gpu_list; i++) c.gpus |= (uint64_t)1 << rt->gpu_list[i];
    else c.gpus = rt->gpus > 0 ? ((uint64_t)1 << rt->gpus) - 1 : 3;
    return c;
}

/* The stand-in for trainerRun: records the start (and whether what it
 * claims was free), then holds the job until the test releases it or a
 * halt comes. */
static int holdJob(const JobConfig *cfg, const TrainOptions *opt, TrainMonitor *mon, const TrainHooks *hooks,
                   TrainResult *res, NsaError *err) {
    (void)hooks, (void)err;
    const ServiceClaim claim = jobClaim(cfg);
    pthread_mutex_lock(&bench.mu);
    if (bench.n_started < MAX_JOBS) snprintf(bench.started[bench.n_started++], RUN_ID_MAX, "%s", opt->run_id);
    if ((bench.held.gpus & claim.gpus) || (bench.held.cpu && claim.cpu)) bench.overlaps++;
    bench.held.gpus |= claim.gpus;
    bench.held.cpu |= claim.cpu;
    if (++bench.running > bench.most_running) bench.most_running = bench.running;
    pthread_cond_broadcast(&bench.cv);
    while (!listed(bench.released, bench.n_released, opt->run_id) && !atomic_load(&mon->halt_requested)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 10 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&bench.cv, &bench.mu, &until);
    }
    bench.running--;
    bench.held.gpus &= ~claim.gpus;
    if (claim.cpu) bench.held.cpu = 0;
    pthread_mutex_unlock(&bench.mu);
    res->outcome = atomic_load(&mon->halt_requested) ? TRAIN_HALTED : TRAIN_COMPLETED;
    res->step = cfg->train.steps;
    return 0;
}

/* Every job fits (the node's memory is not what is tested here). */
static int planFits(const NsaModelConfig *cfg, const NsaEngineOptions *opt, int world, NsaMemoryReport *out,
                    int *max_batch_fits, NsaError *err) {
    (void)cfg, (void)world, (void)err;
    memset(out, 0, sizeof *out);
    out->total = 1;
    out->device_free = (size_t)80 << 30;
    *max_batch_fits = opt->max_batch;
    return 0;
}

typedef struct Fixture {
    char dir[64];
    Service *svc;
} Fixture;

static int setUp(void **state) {
    Fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/nsad-test-scheduler-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    NsaError err = {""};
    f->svc = serviceOpen(f->dir, &err);
    if (!f->svc) return -1;
    NsaDeviceInfo two = {.cuda_built = 1, .cuda_devices = 2};
    snprintf(two.description, sizeof two.description, "2 CUDA devices (made up by the test)");
    serviceSetDevices(f->svc, &two, NULL);
    f->svc->memory_plan = planFits;
    f->svc->train = holdJob;
    pthread_mutex_lock(&bench.mu);
    bench.n_started = bench.n_released = bench.running = bench.most_running = bench.overlaps = 0;
    bench.held = (ServiceClaim){0};
    pthread_mutex_unlock(&bench.mu);
    if (serviceStartTrainers(f->svc, &err) != 0) return -1;
    *state = f;
    return 0;
}

static int tearDown(void **state) {
    Fixture *f = *state;
    int rc = serviceShutdown(f->svc, 10, TRAIN_HALT_SHUTDOWN);
    serviceClose(f->svc);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0) rc = -1;
    free(f);
    return rc;
}

/* A tiny job on `device` ("cuda" or "cpu") with runtime.gpus `gpus`
 * (NULL: the default, all). */
static ServiceStatus submit(Fixture *f, const char *device, const char *gpus, char *id, NsaError *err) {
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_groups: 1, d_k: 16, d_v: 16}\n"
             "nsa: {l: 8, d: 4, l_sel: 16, n_sel: 4, w: 32}\n"
             "train: {steps: 5, seq_len: 64, batch_size: 2}\n"
             "data: {source: synthetic}\n"
             "runtime: {device: %s%s%s}\n",
             device, gpus ? ", gpus: " : "", gpus ? gpus : "");
    return serviceCreateRun(f->svc, yaml, strlen(yaml), NULL, id, NULL, err);
}

/* Waits (bounded) until the stand-in has started n jobs. */
static int waitStarted(int n) {
    pthread_mutex_lock(&bench.mu);
    for (int i = 0; i < 30 && bench.n_started < n; i++) { /* 30 s at most */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&bench.cv, &bench.mu, &until);
    }
    const int got = bench.n_started;
    pthread_mutex_unlock(&bench.mu);
    return got;
}

static void release(const char *id) {
    pthread_mutex_lock(&bench.mu);
    if (bench.n_released < MAX_JOBS && !listed(bench.released, bench.n_released, id))
        snprintf(bench.released[bench.n_released++], RUN_ID_MAX, "%s", id);
    pthread_cond_broadcast(&bench.cv);
    pthread_mutex_unlock(&bench.mu);
}

static RunState stateOf(Fixture *f, const char *id) {
    pthread_mutex_lock(&f->svc->lock);
    Run *run = runsFind(f->svc->runs, id);
    RunState s = run ? run->state : RUN_FAILED;
    pthread_mutex_unlock(&f->svc->lock);
    return s;
}

/* Waits (bounded) until run id has left the trainers and is in state s. */
static int waitEnded(Fixture *f, const char *id, RunState s) {
    for (int i = 0; i < 6000; i++) { /* 30 s at most */
        pthread_mutex_lock(&f->svc->lock);
        const int held = serviceTrainerOf(f->svc, id) != NULL;
        pthread_mutex_unlock(&f->svc->lock);
        if (!held && stateOf(f, id) == s) return 1;
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    return 0;
}

static int startedJob(const char *id) {
    pthread_mutex_lock(&bench.mu);
    const int yes = listed(bench.started, bench.n_started, id);
    pthread_mutex_unlock(&bench.mu);
    return yes;
}

/* GET path through the API; the parsed JSON body (the caller deletes it). */
static cJSON *get(Service *svc, const char *path) {
    ApiRequest req = {.method = "GET", .path = path};
    ApiResponse res;
    apiHandle(svc, &req, &res);
    assert_int_equal(res.status, 200);
    cJSON *json = cJSON_ParseWithLength(res.body, res.body_len);
    apiResponseFree(&res);
    assert_non_null(json);
    return json;
}

static double number(const cJSON *o, const char *key) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, key);
    assert_true(cJSON_IsNumber(n));
    return n->valuedouble;
}

static void test_one_trainer_per_gpu_and_one_for_the_cpu(void **state) {
    Fixture *f = *state;
    assert_int_equal(f->svc->n_trainers, 3);
    assert_int_equal(serviceBusyTrainers(f->svc), 0);
    assert_int_equal(schedulerPickGpu(f->svc), 1); /* sample/eval: the highest free GPU */
}

static void test_runs_on_disjoint_gpus_train_at_once(void **state) {
    Fixture *f = *state;
    char a[RUN_ID_MAX], b[RUN_ID_MAX];
    NsaError err = {""};
    assert_int_equal(submit(f, "cuda", "[0]", a, &err), SVC_OK);
    assert_int_equal(submit(f, "cuda", "[1]", b, &err), SVC_OK);
    assert_int_equal(waitStarted(2), 2);
    assert_true(startedJob(a) && startedJob(b));
    assert_int_equal(bench.most_running, 2);
    assert_int_equal(serviceBusyTrainers(f->svc), 2);
    assert_int_equal(schedulerPickGpu(f->svc), 1); /* none free: the highest */
    /* what the API, nsactl and /metrics see of two runs at once */
    cJSON *health = get(f->svc, "/api/v1/health");
    assert_int_equal((int)number(health, "trainers"), 3);
    assert_int_equal((int)number(health, "trainers_busy"), 2);
    cJSON_Delete(health);
    cJSON *runs = get(f->svc, "/api/v1/runs");
    const cJSON *active = cJSON_GetObjectItemCaseSensitive(runs, "active_runs");
    assert_int_equal(cJSON_GetArraySize(active), 2);
    assert_string_equal(cJSON_GetArrayItem(active, 0)->valuestring, b); /* newest first */
    assert_string_equal(cJSON_GetArrayItem(active, 1)->valuestring, a);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(runs, "active")->valuestring, b);
    /* each run object names its GPUs */
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(runs, "runs"), *r;
    int named = 0;
    cJSON_ArrayForEach(r, list) {
        const cJSON *gpus = cJSON_GetObjectItemCaseSensitive(r, "gpus");
        const char *id = cJSON_GetObjectItemCaseSensitive(r, "id")->valuestring;
        assert_int_equal(cJSON_GetArraySize(gpus), 1);
        assert_int_equal(cJSON_GetArrayItem(gpus, 0)->valueint, !strcmp(id, a) ? 0 : 1);
        named++;
    }
    assert_int_equal(named, 2);
    cJSON_Delete(runs);
    size_t len = 0;
    char *metrics = promRender(f->svc, &len);
    assert_non_null(metrics);
    assert_non_null(strstr(metrics, "nsad_trainer_busy 2\n"));
    assert_non_null(strstr(metrics, "nsad_trainers 3\n"));
    char line[128];
    snprintf(line, sizeof line, "nsad_run_step{run_id=\"%s\"", a);
    assert_non_null(strstr(metrics, line));
    snprintf(line, sizeof line, "nsad_run_step{run_id=\"%s\"", b);
    assert_non_null(strstr(metrics, line));
    free(metrics);
    release(a);
    release(b);
    assert_true(waitEnded(f, a, RUN_COMPLETED));
    assert_true(waitEnded(f, b, RUN_COMPLETED));
}

static void test_a_run_waits_for_the_gpus_it_claims(void **state) {
    Fixture *f = *state;
    char a[RUN_ID_MAX], b[RUN_ID_MAX], c[RUN_ID_MAX];
    NsaError err = {""};
    assert_int_equal(submit(f, "cuda", "[0]", a, &err), SVC_OK);
    assert_int_equal(waitStarted(1), 1);
    /* all GPUs (the default) and GPU 0 both overlap a's claim */
    assert_int_equal(submit(f, "cuda", NULL, b, &err), SVC_OK);
    assert_int_equal(submit(f, "cuda", "[0]", c, &err), SVC_OK);
    assert_int_equal(stateOf(f, b), RUN_QUEUED);
    assert_int_equal(stateOf(f, c), RUN_QUEUED);
    /* without queueing, the answer names the run holding the GPU */
    char d[RUN_ID_MAX];
    char yaml[] = "model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_groups: 1, d_k: 16, d_v: 16}\n"
                  "nsa: {l: 8, d: 4, l_sel: 16, n_sel: 4, w: 32}\n"
                  "train: {steps: 5, seq_len: 64, batch_size: 2}\n"
                  "data: {source: synthetic}\nruntime: {device: cuda, gpus: [0]}\n";
    const ServiceSubmit no_queue = {.may_queue = 0};
    assert_int_equal(serviceSubmitRun(f->svc, yaml, strlen(yaml), &no_queue, d, NULL, &err), SVC_BUSY);
    assert_non_null(strstr(err.message, a));
    /* a's end frees GPU 0: b (first in the queue) takes both, c still waits */
    release(a);
    assert_true(waitEnded(f, a, RUN_COMPLETED));
    assert_int_equal(waitStarted(2), 2);
    assert_true(startedJob(b));
    assert_false(startedJob(c));
    assert_int_equal(stateOf(f, c), RUN_QUEUED);
    release(b);
    assert_int_equal(waitStarted(3), 3);
    assert_true(startedJob(c));
    release(c);
    assert_true(waitEnded(f, c, RUN_COMPLETED));
    assert_int_equal(bench.most_running, 1);
}

static void test_a_small_run_passes_but_never_delays_a_waiting_one(void **state) {
    Fixture *f = *state;
    char a[RUN_ID_MAX], big[RUN_ID_MAX], small1[RUN_ID_MAX], small0[RUN_ID_MAX];
    NsaError err = {""};
    assert_int_equal(submit(f, "cuda", "[0]", a, &err), SVC_OK);
    assert_int_equal(waitStarted(1), 1);
    assert_int_equal(submit(f, "cuda", "2", big, &err), SVC_OK);     /* GPUs 0 and 1: waits for a */
    assert_int_equal(submit(f, "cuda", "[1]", small1, &err), SVC_OK); /* GPU 1 is free, but big wants it */
    assert_int_equal(schedulerPickGpu(f->svc), 1);                    /* GPU 0 is a's */
    assert_int_equal(stateOf(f, big), RUN_QUEUED);
    assert_int_equal(stateOf(f, small1), RUN_QUEUED);
    /* moved to the front, small1 has nobody before it: it starts at once */
    assert_int_equal(serviceFrontRun(f->svc, small1, &err), SVC_OK);
    assert_int_equal(waitStarted(2), 2);
    assert_true(startedJob(small1));
    /* a CPU run claims the CPU engine alone: it passes the waiting GPU run */
    assert_int_equal(submit(f, "cpu", NULL, small0, &err), SVC_OK);
    assert_int_equal(waitStarted(3), 3);
    assert_true(startedJob(small0));
    assert_int_equal(bench.most_running, 3);
    release(a);
    release(small0);
    assert_true(waitEnded(f, a, RUN_COMPLETED));
    assert_false(startedJob(big)); /* GPU 1 is still small1's */
    release(small1);
    assert_int_equal(waitStarted(4), 4);
    assert_true(startedJob(big));
    release(big);
    assert_true(waitEnded(f, big, RUN_COMPLETED));
}

static void test_a_waiting_run_that_leaves_lets_the_next_start(void **state) {
    Fixture *f = *state;
    char a[RUN_ID_MAX], big[RUN_ID_MAX], small[RUN_ID_MAX], big2[RUN_ID_MAX], small2[RUN_ID_MAX];
    NsaError err = {""};
    assert_int_equal(submit(f, "cuda", "[0]", a, &err), SVC_OK);
    assert_int_equal(waitStarted(1), 1);
    assert_int_equal(submit(f, "cuda", NULL, big, &err), SVC_OK);      /* all GPUs: waits for a */
    assert_int_equal(submit(f, "cuda", "[1]", small, &err), SVC_OK);   /* waits behind big */
    assert_int_equal(stateOf(f, small), RUN_QUEUED);
    /* halted out of the queue, big wants nothing any more: small starts */
    assert_int_equal(serviceHaltRun(f->svc, big, &err), SVC_OK);
    assert_int_equal(waitStarted(2), 2);
    assert_true(startedJob(small));
    release(small);
    assert_true(waitEnded(f, small, RUN_COMPLETED));
    /* the same when the waiting run is deleted */
    assert_int_equal(submit(f, "cuda", NULL, big2, &err), SVC_OK);
    assert_int_equal(submit(f, "cuda", "[1]", small2, &err), SVC_OK);
    assert_int_equal(stateOf(f, small2), RUN_QUEUED);
    assert_int_equal(serviceDeleteRun(f->svc, big2, &err), SVC_OK); /* DELETE cancels a queued run */
    assert_int_equal(waitStarted(3), 3);
    assert_true(startedJob(small2));
    assert_false(startedJob(big) || startedJob(big2));
    release(small2);
    release(a);
    assert_true(waitEnded(f, small2, RUN_COMPLETED));
    assert_true(waitEnded(f, a, RUN_COMPLETED));
}

static void test_every_interrupted_run_resumes_after_a_restart(void **state) {
    Fixture *f = *state;
    char a[RUN_ID_MAX], b[RUN_ID_MAX], c[RUN_ID_MAX];
    NsaError err = {""};
    assert_int_equal(submit(f, "cuda", "[0]", a, &err), SVC_OK);
    assert_int_equal(submit(f, "cuda", "[1]", b, &err), SVC_OK);
    assert_int_equal(waitStarted(2), 2);
    assert_int_equal(submit(f, "cuda", "[1]", c, &err), SVC_OK); /* waits for b */
    /* SIGTERM: both stop for the shutdown and stay running on disk */
    assert_int_equal(serviceShutdown(f->svc, 10, TRAIN_HALT_SIGTERM), 0);
    assert_int_equal(stateOf(f, a), RUN_RUNNING);
    assert_int_equal(stateOf(f, b), RUN_RUNNING);
    assert_int_equal(stateOf(f, c), RUN_QUEUED);
    serviceClose(f->svc);
    f->svc = serviceOpen(f->dir, &err);
    assert_non_null(f->svc);
    NsaDeviceInfo two = {.cuda_built = 1, .cuda_devices = 2};
    serviceSetDevices(f->svc, &two, NULL);
    f->svc->memory_plan = planFits;
    f->svc->train = holdJob;
    assert_int_equal(serviceStartTrainers(f->svc, &err), 0);
    /* both resume at once; the run queued behind b stays queued behind it */
    assert_int_equal(waitStarted(4), 4);
    assert_true(startedJob(a) && startedJob(b));
    pthread_mutex_lock(&f->svc->lock);
    assert_int_equal(runsFind(f->svc->runs, a)->restarts, 1);
    assert_int_equal(runsFind(f->svc->runs, b)->restarts, 1);
    assert_int_equal(runsQueuePosition(f->svc->runs, runsFind(f->svc->runs, c)), 1);
    pthread_mutex_unlock(&f->svc->lock);
    release(a);
    release(b);
    assert_int_equal(waitStarted(5), 5);
    release(c);
    assert_true(waitEnded(f, c, RUN_COMPLETED));
}

static void test_the_submit_sets_the_gpus(void **state) {
    Fixture *f = *state;
    char yaml[] = "model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_groups: 1, d_k: 16, d_v: 16}\n"
                  "nsa: {l: 8, d: 4, l_sel: 16, n_sel: 4, w: 32}\n"
                  "train: {steps: 5, seq_len: 64, batch_size: 2}\n"
                  "data: {source: synthetic}\nruntime: {device: cuda}\n";
    char a[RUN_ID_MAX], b[RUN_ID_MAX], x[RUN_ID_MAX];
    NsaError err = {""};
    /* "1,0"-style lists and [1] pick ordinals; the two runs train at once */
    const ServiceSubmit on1 = {.gpus = "[1]", .may_queue = 1}, on0 = {.gpus = "0", .may_queue = 1};
    assert_int_equal(serviceSubmitRun(f->svc, yaml, strlen(yaml), &on1, a, NULL, &err), SVC_OK);
    const ServiceSubmit first = {.gpus = "1", .may_queue = 1}; /* a count: the first GPU, 0 */
    assert_int_equal(serviceSubmitRun(f->svc, yaml, strlen(yaml), &first, b, NULL, &err), SVC_OK);
    assert_int_equal(waitStarted(2), 2);
    pthread_mutex_lock(&f->svc->lock);
    assert_int_equal(schedulerClaimOf(f->svc, runsFind(f->svc->runs, a)).gpus, 2u);
    assert_int_equal(schedulerClaimOf(f->svc, runsFind(f->svc->runs, b)).gpus, 1u);
    pthread_mutex_unlock(&f->svc->lock);
    /* what the loader refuses, named */
    assert_int_equal(serviceSubmitRun(f->svc, yaml, strlen(yaml), &on0, x, NULL, &err), SVC_INVALID_CONFIG);
    assert_non_null(strstr(err.message, "runtime.gpus"));
    const ServiceSubmit bad = {.gpus = "gpu1", .may_queue = 1}, far = {.gpus = "0,5", .may_queue = 1};
    assert_int_equal(serviceSubmitRun(f->svc, yaml, strlen(yaml), &bad, x, NULL, &err), SVC_INVALID_CONFIG);
    assert_non_null(strstr(err.message, "gpus: 'gpu1'"));
    assert_int_equal(serviceSubmitRun(f->svc, yaml, strlen(yaml), &far, x, NULL, &err), SVC_INVALID_CONFIG);
    assert_non_null(strstr(err.message, "GPU 5"));
    char cpu[] = "model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_groups: 1, d_k: 16, d_v: 16}\n"
                 "nsa: {l: 8, d: 4, l_sel: 16, n_sel: 4, w: 32}\n"
                 "train: {steps: 5, seq_len: 64, batch_size: 2}\n"
                 "data: {source: synthetic}\nruntime: {device: cpu}\n";
    assert_int_equal(serviceSubmitRun(f->svc, cpu, strlen(cpu), &on1, x, NULL, &err), SVC_INVALID_CONFIG);
    assert_non_null(strstr(err.message, "on device cpu"));
    release(a);
    release(b);
    assert_true(waitEnded(f, a, RUN_COMPLETED));
    assert_true(waitEnded(f, b, RUN_COMPLETED));
}

static void test_cpu_runs_take_turns(void **state) {
    Fixture *f = *state;
    char a[RUN_ID_MAX], b[RUN_ID_MAX];
    NsaError err = {""};
    assert_int_equal(submit(f, "cpu", NULL, a, &err), SVC_OK);
    assert_int_equal(submit(f, "cpu", NULL, b, &err), SVC_OK);
    assert_int_equal(waitStarted(1), 1);
    assert_int_equal(stateOf(f, b), RUN_QUEUED);
    /* halting the running one frees the CPU engine for the next */
    assert_int_equal(serviceHaltRun(f->svc, a, &err), SVC_OK);
    assert_true(waitEnded(f, a, RUN_HALTED));
    assert_int_equal(waitStarted(2), 2);
    assert_true(startedJob(b));
    release(b);
    assert_true(waitEnded(f, b, RUN_COMPLETED));
    assert_int_equal(bench.most_running, 1);
}

/* Random submits, releases, halts, fronts, deletes and resumes (a fixed
 * seed; the threads interleave as they will): whatever the order, no job
 * starts while another holds part of its claim, and in the end every run
 * has ended, completed or halted, with nothing left queued or held. */
static void test_random_operations_keep_claims_disjoint(void **state) {
    Fixture *f = *state;
    static const char *const kinds[4][2] = {{"cuda", "[0]"}, {"cuda", "[1]"}, {"cuda", NULL}, {"cpu", NULL}};
    char ids[120][RUN_ID_MAX];
    int n = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    NsaError err = {""};
    for (int op = 0; op < 400; op++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const int what = (int)(x % 100), pick = n ? (int)((x >> 32) % (uint64_t)n) : 0;
        if (what < 30 && n < 120) {
            const char *const *k = kinds[(x >> 8) % 4];
            assert_int_equal(submit(f, k[0], k[1], ids[n], &err), SVC_OK);
            n++;
        } else if (n && what < 60) {
            release(ids[pick]);
        } else if (n && what < 70) {
            serviceHaltRun(f->svc, ids[pick], &err);   /* refused when it ended: fine */
        } else if (n && what < 80) {
            serviceFrontRun(f->svc, ids[pick], &err);
        } else if (n && what < 88) {
            serviceDeleteRun(f->svc, ids[pick], &err); /* refused while active */
        } else if (n) {
            serviceResumeRun(f->svc, ids[pick], 1, &err);
        }
        if (op % 16 == 0) {   /* now and then let the trainers catch up */
            struct timespec nap = {0, 2 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
    }
    /* let everything finish: release every run until none is held or queued */
    int quiet = 0;
    for (int round = 0; round < 6000 && !quiet; round++) {
        for (int i = 0; i < n; i++) release(ids[i]);
        pthread_mutex_lock(&f->svc->lock);
        quiet = runsQueueLength(f->svc->runs) == 0 && serviceBusyTrainers(f->svc) == 0;
        pthread_mutex_unlock(&f->svc->lock);
        struct timespec nap = {0, 5 * 1000 * 1000};
        if (!quiet) nanosleep(&nap, NULL);
    }
    assert_true(quiet);
    assert_int_equal(bench.overlaps, 0);
    assert_true(bench.most_running <= 3);   /* two GPUs and the CPU engine */
    pthread_mutex_lock(&f->svc->lock);
    int ended = 0;
    for (size_t i = 0; i < f->svc->runs->n_runs; i++) {
        const RunState s = f->svc->runs->runs[i]->state;
        if (s != RUN_COMPLETED && s != RUN_HALTED)
            fail_msg("run %s ended %s", f->svc->runs->runs[i]->id, runStateName(s));
        ended++;
    }
    pthread_mutex_unlock(&f->svc->lock);
    assert_true(ended > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_trainer_per_gpu_and_one_for_the_cpu, setUp, tearDown),
        cmocka_unit_test_setup_teardown(test_runs_on_disjoint_gpus_train_at_once, setUp, tearDown),
        cmocka_unit_test_setup_teardown(test_a_run_waits_for_the_gpus_it_claims, setUp, tearDown),
        cmocka_unit_test_setup_teardown(test_a_small_run_passes_but_never_delays_a_waiting_one, setUp,
                                        tearDown),
        cmocka_unit_test_setup_teardown(test_a_waiting_run_that_leaves_lets_the_next_start, setUp, tearDown),
        cmocka_unit_test_setup_teardown(test_every_interrupted_run_resumes_after_a_restart, setUp, tearDown),
        cmocka_unit_test_setup_teardown(test_the_submit_sets_the_gpus, setUp, tearDown),
        cmocka_unit_test_setup_teardown(test_cpu_runs_take_turns, setUp, tearDown),
        cmocka_unit_test_setup_teardown(test_random_operations_keep_claims_disjoint, setUp, tearDown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
