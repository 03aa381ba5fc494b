/* service.c - the trainer threads, the trainer hooks, the run life cycle
 * and the commands on runs; see service.h. Who trains where is
 * scheduler.c's. */
#include "service.h"
#include "clockutil.h"
#include "fsutil.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "mfu.h"
#include "runlog.h"
#include "scheduler.h"
#include "stackdump.h"
#include "submit.h"

const int service_http_codes[SERVICE_HTTP_CODES] = {200, 201, 202, 204, 304, 400, 401, 403,
                                                    404, 405, 409, 413, 429, 500, 503, 0};

ServiceStatus serviceFail(NsaError *err, ServiceStatus st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        nsaErrorv(err, fmt, ap);
        va_end(ap);
    }
    return st;
}

void serviceAddEvent(Run *run, const char *type, int64_t step, const char *detail) {
    NsaError err;
    if (runsAddEvent(run, type, step, detail, &err) != 0) logRunWarn(run->id, "run %s: %s", run->id, err.message);
}

void serviceSaveState(Run *run, RunState state) {
    NsaError err;
    if (runsSetState(run, state, &err) != 0) logRunWarn(run->id, "run %s: %s", run->id, err.message);
}

void serviceCountRequest(Service *svc, int status) {
    for (int i = 0; i < SERVICE_HTTP_CODES && service_http_codes[i]; i++)
        if (service_http_codes[i] == status) {
            atomic_fetch_add(&svc->http_requests[i], 1);
            return;
        }
}

/* ---- trainer hooks (trainer thread) -------------------------------------------- */

static Run *activeRun(ServiceTrainer *t) { return runsFind(t->svc->runs, t->active_id); }

int serviceRecoverHung(ServiceTrainer *t, Run *run, const char *how) {
    if (run->state != RUN_HUNG) return 0;
    t->hang_flagged_since = 0;
    run->anomaly[0] = '\0';
    serviceSaveState(run, t->state_before_hang == RUN_HALTING ? RUN_HALTING : RUN_RUNNING);
    serviceAddEvent(run, "recovered", run->step, NULL);
    logRunNotice(run->id, "run %s: %s", run->id, how);
    return 1;
}

/* The trainer reported progress: a run still starting is running, a hung
 * one has recovered. Caller holds the lock. */
static void markRunning(ServiceTrainer *t, Run *run) {
    if (run->state == RUN_STARTING) serviceSaveState(run, RUN_RUNNING);
    serviceRecoverHung(t, run, "recovered from the hang, running again");
}

/* Adds a logged step to the run's series; a run still starting (or hung)
 * is running again. Caller holds the lock. */
static void addStepLog(ServiceTrainer *t, Run *run, const TrainStepLog *s) {
    if (runsAddStep(run, s) != 0) logWarn("run %s: out of memory for the metric series", run->id);
    markRunning(t, run);
}

static void hookStep(void *ctx, const TrainStepLog *s) {
    ServiceTrainer *t = ctx;
    pthread_mutex_lock(&t->svc->lock);
    Run *run = activeRun(t);
    if (run) addStepLog(t, run, s);
    pthread_mutex_unlock(&t->svc->lock);
}

/* The step's log (when the trainer held it back) and its evaluation go
 * into the series under one lock: a metrics poll sees both or neither, so
 * its cursor never passes a step whose validation point is still to come. */
static void hookEval(void *ctx, const TrainStepLog *logged, int64_t step, double val_loss,
                     double bits_per_byte) {
    ServiceTrainer *t = ctx;
    Service *svc = t->svc;
    pthread_mutex_lock(&svc->lock);
    Run *run = activeRun(t);
    if (run) {
        if (logged) addStepLog(t, run, logged);
        if (runsAddEval(run, step, clockUnixSeconds(), val_loss, bits_per_byte) != 0)
            logWarn("run %s: out of memory for the metric series", run->id);
    }
    pthread_mutex_unlock(&svc->lock);
}

/* The trainer's events that the service acts on. trainer.c reports each by
 * name through TrainHooks.on_event (the names proto/api.md lists); every
 * event, these or others, is recorded on the run. */
typedef enum JobEvent {
    JOB_EVENT_START,
    JOB_EVENT_RESUME,
    JOB_EVENT_CHECKPOINT,
    JOB_EVENT_ANOMALY, /* a skipped step, or (nan_halted) the job's end */
    JOB_EVENT_COMPLETE,
    JOB_EVENT_HALT,
    JOB_EVENT_FAIL,
    JOB_EVENT_COUNT,
    JOB_EVENT_OTHER = JOB_EVENT_COUNT /* a name not above */
} JobEvent;

static const char *const job_event_names[JOB_EVENT_COUNT] = {
    [JOB_EVENT_START] = "start",
    [JOB_EVENT_RESUME] = "resume",
    [JOB_EVENT_CHECKPOINT] = "checkpoint",
    [JOB_EVENT_ANOMALY] = "anomaly",
    [JOB_EVENT_COMPLETE] = "complete",
    [JOB_EVENT_HALT] = "halt",
    [JOB_EVENT_FAIL] = "fail",
};

/* ServiceTrainer.job_events holds one bit per JobEvent. */
static_assert(JOB_EVENT_COUNT <= sizeof(unsigned) * CHAR_BIT, "a JobEvent bit past job_events");

static JobEvent jobEventOf(const char *type) {
    for (int e = 0; e < JOB_EVENT_COUNT; e++)
        if (!strcmp(type, job_event_names[e])) return (JobEvent)e;
    return JOB_EVENT_OTHER;
}

/* The JobEvent's bit in ServiceTrainer.job_events (0 for JOB_EVENT_OTHER):
 * finishJob adds a job's ending event only when the trainer did not report
 * it itself. */
static unsigned jobEventBit(JobEvent e) { return e < JOB_EVENT_COUNT ? 1u << e : 0; }

/* The step an event belongs to: its detail's "step" when present. */
static int64_t eventStep(const cJSON *detail, int64_t fallback) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(detail, "step");
    return cJSON_IsNumber(s) ? (int64_t)s->valuedouble : fallback;
}

static void hookEvent(void *ctx, const char *type, const char *detail_json) {
    ServiceTrainer *t = ctx;
    Service *svc = t->svc;
    cJSON *detail = detail_json ? cJSON_Parse(detail_json) : NULL;
    pthread_mutex_lock(&svc->lock);
    Run *run = activeRun(t);
    if (run) {
        int64_t step = eventStep(detail, atomic_load(&t->mon.step));
        serviceAddEvent(run, type, step, detail_json);
        const JobEvent event = jobEventOf(type);
        if (event == JOB_EVENT_START || event == JOB_EVENT_RESUME) {
            markRunning(t, run);
        } else if (event == JOB_EVENT_CHECKPOINT) {
            run->last_checkpoint_step = step;
            run->step = step > run->step ? step : run->step;
            NsaError err;
            if (runsSave(run, &err) != 0) logWarn("run %s: %s", run->id, err.message);
        } else if (event == JOB_EVENT_ANOMALY) {
            atomic_fetch_add(&svc->anomalies_total, 1);
            /* its name is detail.type (proto/api.md: nan_loss...) */
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(detail, "type");
            if (cJSON_IsString(name))
                snprintf(run->anomaly, sizeof run->anomaly, "%s", name->valuestring);
        }
        t->job_events |= jobEventBit(event);
    }
    pthread_mutex_unlock(&svc->lock);
    cJSON_Delete(detail);
}

/* ---- the trainer threads ----------------------------------------------------------- */

/* Records how t's job ended. Caller holds the lock. */
static void finishJob(ServiceTrainer *t, Run *run, int rc, const TrainResult *res, const NsaError *terr) {
    Service *svc = t->svc;
    if (res->step > run->step) run->step = res->step;
    if (svc->shutting_down && !t->user_halt && res->outcome == TRAIN_HALTED) {
        /* stopped for a daemon shutdown: keep it active on disk so the next
         * nsad resumes it */
        char detail[64];
        snprintf(detail, sizeof detail, "{\"reason\":\"%s\"}", trainHaltReasonName(svc->shutting_down));
        serviceAddEvent(run, "shutdown", run->step, detail);
        serviceSaveState(run, RUN_RUNNING);
        logRunNotice(run->id, "run %s: checkpointed at step %lld for the shutdown (%s); the next start resumes it",
                     run->id, (long long)run->step, trainHaltReasonName(svc->shutting_down));
        return;
    }
    /* a hang the run came through is history (its event stays), not its end */
    if (!strncmp(run->anomaly, "hang:", 5)) run->anomaly[0] = '\0';
    RunState state = RUN_FAILED;
    JobEvent event = JOB_EVENT_FAIL;
    switch (res->outcome) {
    case TRAIN_COMPLETED:
        state = RUN_COMPLETED;
        event = JOB_EVENT_COMPLETE;
        break;
    case TRAIN_HALTED:
        state = RUN_HALTED;
        event = JOB_EVENT_HALT;
        break;
    case TRAIN_NAN_HALTED:
        state = RUN_NAN_HALTED;
        event = JOB_EVENT_ANOMALY;
        if (res->anomaly[0]) snprintf(run->anomaly, sizeof run->anomaly, "%s", res->anomaly);
        break;
    case TRAIN_FAILED:
        state = RUN_FAILED;
        snprintf(run->error, sizeof run->error, "%s",
                 rc != 0 && terr->message[0] ? terr->message : "the trainer failed without a message");
        break;
    }
    if (!(t->job_events & jobEventBit(event))) {
        cJSON *d = cJSON_CreateObject();
        if (state == RUN_FAILED) cJSON_AddStringToObject(d, "error", run->error);
        if (state == RUN_NAN_HALTED) cJSON_AddStringToObject(d, "type", run->anomaly);
        char *text = cJSON_PrintUnformatted(d);
        serviceAddEvent(run, job_event_names[event], run->step, text);
        if (state == RUN_NAN_HALTED) atomic_fetch_add(&svc->anomalies_total, 1);
        free(text);
        cJSON_Delete(d);
    }
    serviceSaveState(run, state);
    if (state == RUN_FAILED)
        logRunError(run->id, "run %s failed at step %lld: %s", run->id, (long long)run->step, run->error);
    else
        logRunNotice(run->id, "run %s %s at step %lld", run->id, runStateName(state), (long long)run->step);
}

static void runJob(ServiceTrainer *t, const char *id, int resume) {
    Service *svc = t->svc;
    logBindRun(id); /* this thread's lines are the run's until the job ends */
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    char *yaml = run ? strdup(run->config_yaml) : NULL;
    char out_dir[RUN_PATH_MAX];
    snprintf(out_dir, sizeof out_dir, "%s", run ? run->out_dir : "");
    const int member = run && run->member_of[0];
    const TrainJoin join = t->join;
    t->job_events = 0;
    pthread_mutex_unlock(&svc->lock);

    TrainResult res;
    memset(&res, 0, sizeof res);
    res.outcome = TRAIN_FAILED;
    NsaError terr = {""};
    int rc = -1;
    JobConfig *cfg = malloc(sizeof *cfg);
    if (!yaml || !cfg) {
        snprintf(terr.message, sizeof terr.message, "out of memory starting the job");
    } else {
        configDefaults(cfg);
        if (configLoadString(cfg, yaml, strlen(yaml), &terr) == 0) {
            double flops_per_token = NAN;
            NsaError ferr;
            if (mfuFlopsPerToken(cfg, &flops_per_token, &ferr) != 0) flops_per_token = NAN;
            pthread_mutex_lock(&svc->lock);
            t->deadlines = cfg->watchdog;
            t->hang_flagged_since = 0;
            run = runsFind(svc->runs, id);
            if (run) { /* what its MFU is counted against from now on */
                run->flops_per_token = flops_per_token;
                int ordinals[TRAIN_MAX_RANKS];
                NsaError gerr;
                const int n_local = cfg->runtime.device == NSA_DEVICE_CUDA
                                        ? trainerLocalRanks(cfg, ordinals, &gerr) : 0;
                run->peak_flops = mfuJobPeak(cfg, ordinals, n_local, svc->gpu_peak_flops, svc->n_gpus);
                NsaError serr;
                if (runsSave(run, &serr) != 0) logWarn("run %s: %s", id, serr.message);
            }
            pthread_mutex_unlock(&svc->lock);
            TrainOptions opt = {.out_dir = out_dir,
                                /* a damaged newest checkpoint: the previous one (logged) */
                                .resume = resume ? "latest-valid" : NULL,
                                .steps = 0,
                                .device_override = -1,
                                .quiet = 1,
                                .run_id = id,
                                .peer_token = svc->peer_token[0] ? svc->peer_token : NULL,
                                .join = member ? &join : NULL};
            TrainHooks hooks = {
                .ctx = t, .on_step = hookStep, .on_eval = hookEval, .on_event = hookEvent};
            logInfo("run %s: %s", id, resume ? "resuming from its latest checkpoint" : "starting");
            rc = svc->train(cfg, &opt, &t->mon, &hooks, &res, &terr);
        }
    }
    free(cfg);
    free(yaml);
    trainMonitorEnter(&t->mon, PHASE_IDLE);

    pthread_mutex_lock(&svc->lock);
    run = runsFind(svc->runs, id);
    if (run) finishJob(t, run, rc, &res, &terr);
    runlogEnd(svc->runlog, id); /* after its last line: followers of the job get the end */
    t->active_id[0] = '\0';
    t->claim = (ServiceClaim){0};
    t->hang_flagged_since = 0;
    atomic_store(&t->busy, 0);
    pthread_mutex_unlock(&svc->lock);
    logBindRun(NULL);
}

ServiceTrainer *serviceTrainerOf(Service *svc, const char *id) {
    if (!id || !id[0]) return NULL;
    for (int i = 0; i < svc->n_trainers; i++)
        if (!strcmp(svc->trainers[i].active_id, id)) return &svc->trainers[i];
    return NULL;
}

int serviceBusyTrainers(Service *svc) {
    int n = 0;
    for (int i = 0; i < SERVICE_MAX_TRAINERS; i++) n += atomic_load(&svc->trainers[i].busy) != 0;
    return n;
}

static void *trainerThread(void *arg) {
    ServiceTrainer *t = arg;
    Service *svc = t->svc;
    char name[32];
    snprintf(name, sizeof name, t->index ? "trainer %d" : "trainer", t->index);
    if (stackdumpRegisterThread(name) != 0)
        logWarn("the %s thread is not in stack dumps: %s", name, strerror(errno));
    pthread_mutex_lock(&svc->lock);
    while (!svc->shutting_down) {
        atomic_store(&t->tick_ns, clockMonotonicNs());
        schedulerStartQueued(svc);
        if (t->pending) {
            char id[RUN_ID_MAX];
            snprintf(id, sizeof id, "%s", t->active_id);
            int resume = t->pending == SERVICE_PENDING_RESUME;
            t->pending = SERVICE_PENDING_NONE;
            pthread_mutex_unlock(&svc->lock);
            runJob(t, id, resume);
            pthread_mutex_lock(&svc->lock);
            pthread_cond_broadcast(&svc->wake); /* what it held is free: others may start */
            continue;
        }
        const struct timespec until = clockRealtimeAfterMs(500);
        pthread_cond_timedwait(&svc->wake, &svc->lock, &until);
    }
    pthread_mutex_unlock(&svc->lock);
    stackdumpUnregisterThread();
    return NULL;
}

/* ---- life cycle ---------------------------------------------------------------------- */

/* Picks up what a previous nsad left active: every run that was starting,
 * running or hung resumes from its latest checkpoint (the newest at once on
 * the first trainer, the others through the queue, at its front, in their
 * order, as their claims allow once the trainers start). Caller holds the
 * lock. */
static void recoverRuns(Service *svc) {
    Run *newest = NULL;
    for (size_t i = svc->runs->n_runs; i-- > 0;) {
        Run *run = svc->runs->runs[i];
        if (run->state == RUN_HALTING) {
            serviceAddEvent(run, "restart", run->step,
                            "{\"note\":\"nsad restarted while the run was halting\"}");
            serviceSaveState(run, RUN_HALTED);
        } else if (runStateIsActive(run->state) && run->member_of[0]) {
            /* a member follows its coordinator, which resumes the job */
            serviceAddEvent(
                run, "restart", run->step,
                "{\"note\":\"nsad restarted; the coordinator resumes a multi-node job\"}");
            snprintf(run->error, sizeof run->error, "nsad restarted during the multi-node job %s; "
                     "resume it on its coordinator", run->member_of);
            serviceSaveState(run, RUN_FAILED);
        } else if (runStateIsActive(run->state)) {
            run->restarts++;
            char detail[128];
            snprintf(detail, sizeof detail, "{\"from_state\":\"%s\",\"last_checkpoint_step\":%lld}",
                     runStateName(run->state), (long long)run->last_checkpoint_step);
            serviceAddEvent(run, "restart", run->last_checkpoint_step, detail);
            run->anomaly[0] = '\0';
            logRunNotice(run->id, "run %s was active when nsad stopped; resuming it from its latest "
                         "checkpoint (step %lld)", run->id, (long long)run->last_checkpoint_step);
            if (!newest) {
                newest = run;
                serviceSaveState(run, RUN_STARTING);
                schedulerAssign(&svc->trainers[0], run, 1);
                continue;
            }
            /* older ones go to the front, each before the one after it */
            NsaError qerr;
            if (runsEnqueue(svc->runs, run, 1, 1, &qerr) != 0) logRunWarn(run->id, "run %s: %s", run->id, qerr.message);
        }
    }
}

Service *serviceOpen(const char *state_dir, NsaError *err) {
    Service *svc = calloc(1, sizeof *svc);
    if (!svc) {
        serviceFail(err, SVC_INTERNAL, "out of memory");
        return NULL;
    }
    if (snprintf(svc->exports_dir, sizeof svc->exports_dir, "%s/exports", state_dir) >=
        (int)sizeof svc->exports_dir) {
        serviceFail(err, SVC_INTERNAL, "the state dir's path is too long: %s", state_dir);
        free(svc);
        return NULL;
    }
    svc->runs = runsOpen(state_dir, err);
    if (!svc->runs) {
        free(svc);
        return NULL;
    }
    svc->runlog = runlogOpen(svc->runs->runs_dir, err);
    if (!svc->runlog) {
        runsClose(svc->runs);
        free(svc);
        return NULL;
    }
    pthread_mutex_init(&svc->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_cond_init(&svc->wake, &attr);
    pthread_condattr_destroy(&attr);
    for (int i = 0; i < SERVICE_MAX_TRAINERS; i++) {
        ServiceTrainer *t = &svc->trainers[i];
        t->svc = svc;
        t->index = i;
        trainMonitorInit(&t->mon);
        atomic_store(&t->tick_ns, clockMonotonicNs());
    }
    svc->n_trainers = 1;
    svc->memory_plan = nsaModelMemoryPlan;
    svc->train = trainerRun;
    snprintf(svc->devices.description, sizeof svc->devices.description, "no device probe made");
    svc->started_unix = clockUnixSeconds();
    svc->started_ns = clockMonotonicNs();
    atomic_store(&svc->http_tick_ns, svc->started_ns);
    pthread_mutex_lock(&svc->lock);
    recoverRuns(svc);
    pthread_mutex_unlock(&svc->lock);
    return svc;
}

void serviceSetPeakFlops(Service *svc, const double *per_gpu, int n) {
    if (n > SERVICE_MAX_GPUS) n = SERVICE_MAX_GPUS;
    pthread_mutex_lock(&svc->lock);
    for (int i = 0; i < n; i++) svc->gpu_peak_flops[i] = per_gpu[i];
    svc->n_gpus = n < 0 ? 0 : n;
    pthread_mutex_unlock(&svc->lock);
}

void serviceSetDevices(Service *svc, const NsaDeviceInfo *found, const char *probe_error) {
    memset(&svc->devices, 0, sizeof svc->devices);
    if (probe_error) {
        svc->devices.cuda_built = found ? found->cuda_built : 0;
        snprintf(svc->devices.description, sizeof svc->devices.description, "the CUDA runtime failed: %s",
                 probe_error);
    } else if (found) {
        svc->devices = *found;
    }
}

void serviceSetListeners(Service *svc, const char *listen_url, const char *socket_path) {
    pthread_mutex_lock(&svc->lock);
    snprintf(svc->listen_url, sizeof svc->listen_url, "%s", listen_url ? listen_url : "");
    snprintf(svc->socket_path, sizeof svc->socket_path, "%s", socket_path ? socket_path : "");
    pthread_mutex_unlock(&svc->lock);
}

struct Infer *serviceSetInfer(Service *svc, struct Infer *infer) {
    pthread_mutex_lock(&svc->lock);
    struct Infer *old = svc->infer;
    svc->infer = infer;
    pthread_mutex_unlock(&svc->lock);
    return old;
}

void serviceSetPeerToken(Service *svc, const char *token) {
    snprintf(svc->peer_token, sizeof svc->peer_token, "%s", token ? token : "");
}

int serviceStartTrainers(Service *svc, NsaError *err) {
    const int gpus = svc->devices.cuda_built ? svc->devices.cuda_devices : 0;
    pthread_mutex_lock(&svc->lock);
    svc->n_trainers = 1 + (gpus < SERVICE_MAX_TRAINERS - 1 ? gpus : SERVICE_MAX_TRAINERS - 1);
    /* claims worked out before the devices were known are redone */
    for (size_t i = 0; i < svc->runs->n_runs; i++) svc->runs->runs[i]->claim_known = 0;
    for (int i = 0; i < svc->n_trainers; i++) {
        ServiceTrainer *t = &svc->trainers[i];
        Run *run = t->active_id[0] ? runsFind(svc->runs, t->active_id) : NULL;
        if (run) t->claim = schedulerClaimOf(svc, run);
    }
    pthread_mutex_unlock(&svc->lock);
    for (int i = 0; i < svc->n_trainers; i++) {
        ServiceTrainer *t = &svc->trainers[i];
        int rc = pthread_create(&t->thread, NULL, trainerThread, t);
        if (rc != 0) {
            serviceFail(err, SVC_INTERNAL, "cannot start trainer thread %d: %s", i, strerror(rc));
            serviceShutdown(svc, 5, TRAIN_HALT_SHUTDOWN);
            return -1;
        }
        t->started = 1;
    }
    return 0;
}

int serviceShutdown(Service *svc, double timeout_s, int why) {
    pthread_mutex_lock(&svc->lock);
    svc->shutting_down = why > 0 ? why : TRAIN_HALT_SHUTDOWN;
    for (int i = 0; i < svc->n_trainers; i++) {
        ServiceTrainer *t = &svc->trainers[i];
        if (!t->active_id[0]) continue;
        if (t->pending) {
            /* never started: it stays active on disk and resumes next time */
            t->pending = SERVICE_PENDING_NONE;
            t->active_id[0] = '\0';
            atomic_store(&t->busy, 0);
        } else {
            atomic_store(&t->mon.halt_requested, svc->shutting_down);
        }
    }
    pthread_cond_broadcast(&svc->wake);
    pthread_mutex_unlock(&svc->lock);
    int64_t start = clockMonotonicNs();
    int64_t abandon_at = start + (int64_t)(timeout_s * 0.5e9), until = start + (int64_t)(timeout_s * 1e9);
    for (int i = 0; i < svc->n_trainers; i++) {
        ServiceTrainer *t = &svc->trainers[i];
        while (t->started) {
            const struct timespec abs = clockRealtimeAfterMs(1000);
            if (pthread_timedjoin_np(t->thread, NULL, &abs) == 0) {
                t->started = 0;
                break;
            }
            int64_t now = clockMonotonicNs();
            if (now > abandon_at) {
                /* a stuck step never reaches its checkpoint: give it up, the
                 * run resumes from its previous checkpoint */
                for (int j = 0; j < svc->n_trainers; j++) {
                    ServiceTrainer *u = &svc->trainers[j];
                    if (u->started && atomic_load(&u->busy) && !atomic_load(&u->mon.stop_now)) {
                        char name[24] = "the trainer";
                        if (u->index) snprintf(name, sizeof name, "trainer %d", u->index);
                        logWarn("%s did not checkpoint within %.0f s; abandoning the step without a "
                                "checkpoint", name, timeout_s * 0.5);
                        atomic_store(&u->mon.stop_now, 1);
                    }
                }
            }
            if (now > until) return -1;
        }
    }
    return 0;
}

void serviceClose(Service *svc) {
    if (!svc) return;
    for (int i = 0; i < svc->n_trainers; i++)
        if (svc->trainers[i].started) return; /* still running: leak rather than free under it */
    runlogClose(svc->runlog);
    runsClose(svc->runs);
    pthread_cond_destroy(&svc->wake);
    pthread_mutex_destroy(&svc->lock);
    free(svc);
}

/* ---- commands (HTTP thread) --------------------------------------------------------- */

static ServiceStatus createAndQueue(Service *svc, JobConfig *cfg, const char *name,
                                    const char *member_of, const TrainJoin *join, int may_queue,
                                    char *id_out, NsaError *err);

ServiceStatus serviceCreateRun(Service *svc, const char *config_text, size_t len, const char *name,
                               char *id_out, ServiceWarnings *warnings, NsaError *err) {
    const ServiceSubmit how = {.name = name, .may_queue = 1};
    return serviceSubmitRun(svc, config_text, len, &how, id_out, warnings, err);
}

ServiceStatus serviceSubmitRun(Service *svc, const char *config_text, size_t len, const ServiceSubmit *how,
                               char *id_out, ServiceWarnings *warnings, NsaError *err) {
    JobConfig *cfg = malloc(sizeof *cfg);
    if (!cfg) return serviceFail(err, SVC_INTERNAL, "out of memory");
    configDefaults(cfg);
    NsaError cerr;
    const char *name = how->name;
    const int may_queue = how->may_queue;
    if (configLoadString(cfg, config_text, len, &cerr) != 0 ||
        (how->nodes && submitSetNodes(cfg, how->nodes, &cerr) != 0) ||
        (how->gpus && submitSetGpus(cfg, how->gpus, &cerr) != 0)) {
        free(cfg);
        return serviceFail(err, SVC_INVALID_CONFIG, "%s", cerr.message);
    }
    /* over the file's train.init_from, like nodes and gpus over runtime's */
    if (how->init_from && snprintf(cfg->train.init_from, sizeof cfg->train.init_from, "%s",
                                   how->init_from) >= (int)sizeof cfg->train.init_from) {
        free(cfg);
        return serviceFail(err, SVC_INVALID_CONFIG, "init_from: longer than %zu bytes",
                           sizeof cfg->train.init_from - 1);
    }
    ServiceStatus st = submitCheckRunnable(svc, cfg, cfg->runtime.n_nodes, err);
    if (st == SVC_OK) st = submitResolveInitFrom(svc, cfg, err);
    if (st != SVC_OK) {
        logNotice("new run refused: %s", err ? err->message : "");
        free(cfg);
        return st;
    }
    if (warnings) warnings->n = 0;
    for (int i = 0; i < cfg->n_warnings; i++) {
        logWarn("new run config: %s", cfg->warnings[i]);
        if (warnings)
            snprintf(warnings->text[warnings->n++], sizeof warnings->text[0], "%s", cfg->warnings[i]);
    }
    st = createAndQueue(svc, cfg, name, NULL, NULL, may_queue, id_out, err);
    free(cfg);
    return st;
}

/* Creates a run from cfg (its out_dir moved under the run's directory)
 * and hands it to the trainer, or (may_queue, the trainer busy or others
 * waiting) queues it at the back; member_of and join (NULL for a run of
 * this node's own) make it a member run, which never waits: its
 * coordinator starts the job now. Takes the lock. */
static ServiceStatus createAndQueue(Service *svc, JobConfig *cfg, const char *name,
                                    const char *member_of, const TrainJoin *join, int may_queue,
                                    char *id_out, NsaError *err) {
    ServiceStatus st = SVC_OK;
    pthread_mutex_lock(&svc->lock);
    const ServiceClaim claim = schedulerClaimOfConfig(svc, cfg);
    /* a member never waits for the queue: its coordinator starts the job now */
    ServiceTrainer *t = NULL;
    if (!member_of) t = schedulerTrainerFor(svc, claim);
    else if (!claimsOverlap(claim, schedulerHeldClaims(svc))) t = schedulerIdleTrainer(svc);
    const int wait = t == NULL;
    if (svc->shutting_down) {
        st = serviceFail(err, SVC_UNAVAILABLE, "nsad is shutting down");
    } else if (wait && (!may_queue || member_of)) {
        st = schedulerBusy(svc, claim, err);
    } else {
        /* the run's out_dir lives under the state dir: store the resolved
         * config with it so the file says what the trainer does */
        char *yaml = configToYaml(cfg);
        Run *run = yaml ? runsCreate(svc->runs, name, yaml, configDeviceName(cfg->runtime.device),
                                     configPrecisionName(cfg->runtime.precision), cfg->train.steps,
                                     wait ? RUN_QUEUED : RUN_STARTING, err)
                        : NULL;
        int had_yaml = yaml != NULL;
        free(yaml);
        if (!run) {
            st = had_yaml ? SVC_INTERNAL : serviceFail(err, SVC_INTERNAL, "out of memory");
        } else {
            NsaError werr = {"out of memory"};
            int fits = snprintf(cfg->train.out_dir, sizeof cfg->train.out_dir, "%s", run->out_dir) <
                       (int)sizeof cfg->train.out_dir;
            yaml = fits ? configToYaml(cfg) : NULL;
            if (!fits) snprintf(werr.message, sizeof werr.message, "the run's out_dir path is too long");
            if (!yaml || runsSetConfig(run, yaml, &werr) != 0)
                logWarn("run %s: config.yaml keeps the submitted out_dir: %s", run->id, werr.message);
            free(yaml);
            run->claim_gpus = claim.gpus;
            run->claim_cpu = claim.cpu;
            run->claim_known = 1;
            snprintf(run->init_from, sizeof run->init_from, "%s", cfg->train.init_from);
            if (member_of) {
                snprintf(run->member_of, sizeof run->member_of, "%s", member_of);
                t->join = *join;
            }
            if (member_of || run->init_from[0]) { /* run.json was written without them */
                NsaError serr;
                if (runsSave(run, &serr) != 0) logWarn("run %s: %s", run->id, serr.message);
            }
            snprintf(id_out, RUN_ID_MAX, "%s", run->id);
            if (wait) {
                char detail[64];
                snprintf(detail, sizeof detail, "{\"position\":%d}", runsQueuePosition(svc->runs, run));
                serviceAddEvent(run, "queued", 0, detail);
                logRunNotice(run->id, "run %s created (%s, %lld steps, %s) and queued at position %d", run->id,
                             run->name, (long long)run->total_steps, run->device,
                             runsQueuePosition(svc->runs, run));
            } else {
                schedulerAssign(t, run, 0);
                logRunNotice(run->id, "run %s created (%s, %lld steps, %s)%s%s", run->id, run->name,
                             (long long)run->total_steps, run->device,
                             member_of ? ": ranks of the multi-node job " : "", member_of ? member_of : "");
            }
        }
    }
    pthread_mutex_unlock(&svc->lock);
    return st;
}

ServiceStatus serviceJoin(Service *svc, const ServiceJoin *j, int *local, char *id_out,
                          NsaError *err) {
    JobConfig *cfg = malloc(sizeof *cfg);
    if (!cfg) return serviceFail(err, SVC_INTERNAL, "out of memory");
    configDefaults(cfg);
    NsaError cerr;
    if (!j->config_yaml ||
        configLoadString(cfg, j->config_yaml, strlen(j->config_yaml), &cerr) != 0) {
        free(cfg);
        return serviceFail(err, SVC_INVALID_CONFIG, "%s",
                           j->config_yaml ? cerr.message : "no config");
    }
    cfg->runtime.n_nodes = 0; /* a member coordinates nothing */
    int ordinals[TRAIN_MAX_RANKS];
    const int n = trainerLocalRanks(cfg, ordinals, &cerr);
    ServiceStatus st = SVC_OK;
    if (n < 0) {
        st = serviceFail(err, SVC_INVALID_CONFIG, "%s", cerr.message);
    } else if (!j->start) {
        pthread_mutex_lock(&svc->lock);
        const ServiceClaim claim = schedulerClaimOfConfig(svc, cfg);
        if (svc->shutting_down)
            st = serviceFail(err, SVC_UNAVAILABLE, "nsad is shutting down");
        else if (claimsOverlap(claim, schedulerHeldClaims(svc)) || !schedulerIdleTrainer(svc))
            st = schedulerBusy(svc, claim, err);
        pthread_mutex_unlock(&svc->lock);
        /* what the coordinator checked at submit, against this node's
         * devices and files (its own ranks are one or more) */
        if (st == SVC_OK && (st = submitCheckRunnable(svc, cfg, 1, err)) != SVC_OK)
            logNotice("multi-node job refused: %s", err ? err->message : "");
    } else if (!j->run_id || !runNameValid(j->run_id)) {
        st = serviceFail(err, SVC_INVALID_CONFIG, "run_id: '%.80s' is not a run id",
                         j->run_id ? j->run_id : "");
    } else if (j->join.first < 1 || j->join.first + n > j->join.world) {
        st = serviceFail(err, SVC_INVALID_CONFIG,
                         "first: %d, world %d: this node's %d rank%s do not fit; "
                         "allowed: ranks after the coordinator's, within the job",
                         j->join.first, j->join.world, n, n == 1 ? "" : "s");
    } else {
        st = createAndQueue(svc, cfg, j->run_id, j->run_id, &j->join, 0, id_out, err);
    }
    if (local) *local = n;
    free(cfg);
    return st;
}

ServiceStatus serviceHaltRun(Service *svc, const char *id, NsaError *err) {
    ServiceStatus st = SVC_OK;
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    if (!run) {
        st = serviceFail(err, SVC_NOT_FOUND, "no run '%s'; GET /api/v1/runs lists them", id);
    } else if (run->state == RUN_HALTING) {
        /* already on its way: repeating the request is harmless */
    } else if (run->state == RUN_QUEUED) {
        /* it leaves the queue, keeping its files: resume queues it again */
        run->queue_resume = 0;
        serviceAddEvent(run, "halt", run->step, "{\"note\":\"left the queue\"}");
        serviceSaveState(run, RUN_HALTED);
        logRunNotice(id, "run %s: halted while queued; it left the queue", id);
        pthread_cond_broadcast(&svc->wake); /* a run behind it may start now */
    } else if (!runStateIsActive(run->state) || !serviceTrainerOf(svc, id)) {
        st = serviceFail(err, SVC_INVALID_STATE,
                         "run %s is %s; halt applies to a queued, starting, running or hung run",
                         id, runStateName(run->state));
    } else {
        ServiceTrainer *t = serviceTrainerOf(svc, id);
        t->user_halt = 1;
        atomic_store(&t->mon.halt_requested, TRAIN_HALT_REQUEST);
        serviceAddEvent(run, "halt_requested", run->step, NULL);
        serviceSaveState(run, RUN_HALTING);
        logRunNotice(id, "run %s: halt requested at step %lld", id, (long long)run->step);
    }
    pthread_mutex_unlock(&svc->lock);
    return st;
}

/* Removes a deleted run's moved-aside directory (arg: its malloc'd path,
 * freed here). Off the HTTP thread: a run's checkpoints can be gigabytes,
 * and a silent HTTP thread stops the systemd watchdog pings. */
static void *removeTrashMain(void *arg) {
    char *trash = arg;
    NsaError err;
    if (fsRemoveTree(trash, &err) != 0)
        logWarn("deleted run: its files are not all gone: %s (the next start retries)", err.message);
    free(trash);
    return NULL;
}

ServiceStatus serviceDeleteRun(Service *svc, const char *id, NsaError *err) {
    ServiceStatus st = SVC_OK;
    char trash[RUN_PATH_MAX + 128] = "";
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    if (!run) {
        st = serviceFail(err, SVC_NOT_FOUND, "no run '%s'; GET /api/v1/runs lists them", id);
    } else if (runStateIsActive(run->state) || serviceTrainerOf(svc, id)) {
        st = serviceFail(err, SVC_INVALID_STATE,
                         "run %s is %s; halt it (and let it stop) before deleting it", id,
                         runStateName(run->state));
    } else {
        NsaError derr = {""};
        if (runsDelete(svc->runs, id, trash, sizeof trash, &derr) != 0)
            st = serviceFail(err, SVC_INTERNAL, "run %s not deleted: %s", id, derr.message);
    }
    if (st == SVC_OK) {
        runlogEnd(svc->runlog, id);
        pthread_cond_broadcast(&svc->wake); /* a queued run leaving lets those behind it start */
    }
    pthread_mutex_unlock(&svc->lock);
    if (st != SVC_OK) return st;
    logNotice("run %s: deleted", id);
    /* a remover left unfinished at exit leaves trash the next start sweeps */
    char *path = strdup(trash);
    pthread_t remover;
    pthread_attr_t attr;
    int started = 0;
    if (path && pthread_attr_init(&attr) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&remover, &attr, removeTrashMain, path) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!started) { /* no thread to spare: remove here */
        free(path);
        NsaError rerr;
        if (fsRemoveTree(trash, &rerr) != 0)
            logWarn("run %s: deleted, but its files are not all gone: %s (the next start retries)", id,
                    rerr.message);
    }
    return SVC_OK;
}

ServiceStatus serviceResumeRun(Service *svc, const char *id, int may_queue, NsaError *err) {
    ServiceStatus st = SVC_OK;
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    if (!run) {
        st = serviceFail(err, SVC_NOT_FOUND, "no run '%s'; GET /api/v1/runs lists them", id);
    } else if (svc->shutting_down) {
        st = serviceFail(err, SVC_UNAVAILABLE, "nsad is shutting down");
    } else if (!runStateIsResumable(run->state)) {
        st = serviceFail(err, SVC_INVALID_STATE,
                         "run %s is %s; resume applies to a halted, nan_halted or failed run", id,
                         runStateName(run->state));
    } else if (run->member_of[0]) {
        st = serviceFail(err, SVC_INVALID_STATE,
                         "run %s is this node's part of the multi-node job %s; resume "
                         "that run on its coordinator (it brings this node back in)",
                         id, run->member_of);
    } else {
        ServiceTrainer *t = schedulerTrainerFor(svc, schedulerClaimOf(svc, run));
        if (!t && !may_queue) {
            st = schedulerBusy(svc, schedulerClaimOf(svc, run), err);
        } else {
            run->anomaly[0] = '\0';
            run->error[0] = '\0';
            serviceAddEvent(run, "resume_requested", run->step, NULL);
        }
        if (!t && may_queue) {
            NsaError qerr;
            if (runsEnqueue(svc->runs, run, 0, 1, &qerr) != 0) logRunWarn(id, "run %s: %s", id, qerr.message);
            char detail[64];
            snprintf(detail, sizeof detail, "{\"position\":%d}", runsQueuePosition(svc->runs, run));
            serviceAddEvent(run, "queued", run->step, detail);
            logRunNotice(id, "run %s: resume queued at position %d (latest checkpoint: step %lld)", id,
                         runsQueuePosition(svc->runs, run), (long long)run->last_checkpoint_step);
        } else if (t) {
            serviceSaveState(run, RUN_STARTING);
            schedulerAssign(t, run, 1);
            logRunNotice(id, "run %s: resume requested (latest checkpoint: step %lld)", id,
                         (long long)run->last_checkpoint_step);
        }
    }
    pthread_mutex_unlock(&svc->lock);
    return st;
}

ServiceStatus serviceFrontRun(Service *svc, const char *id, NsaError *err) {
    ServiceStatus st = SVC_OK;
    pthread_mutex_lock(&svc->lock);
    Run *run = runsFind(svc->runs, id);
    if (!run) {
        st = serviceFail(err, SVC_NOT_FOUND, "no run '%s'; GET /api/v1/runs lists them", id);
    } else if (run->state != RUN_QUEUED) {
        st = serviceFail(err, SVC_INVALID_STATE, "run %s is %s; front applies to a queued run", id,
                         runStateName(run->state));
    } else if (runsQueuePosition(svc->runs, run) > 1) {
        NsaError qerr;
        if (runsEnqueue(svc->runs, run, 1, run->queue_resume, &qerr) != 0) {
            st = serviceFail(err, SVC_INTERNAL, "run %s: %s", id, qerr.message);
        } else {
            serviceAddEvent(run, "queue_front", run->step, NULL);
            logRunNotice(id, "run %s: moved to the front of the queue", id);
            pthread_cond_broadcast(&svc->wake); /* no run before it now: it may start */
        }
    }
    pthread_mutex_unlock(&svc->lock);
    return st;
}
