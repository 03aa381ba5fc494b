/* trainer.c - one training job, start to finish (see trainer.h).
 *
 * The loop, per optimizer step s (1-based):
 *   zero grads; accumulate_grad_batches x (data batch, forward, backward);
 *   AdamW at lr = schedule(s) (the engine skips a non-finite update);
 *   NaN guard; log; evaluate; checkpoint; look for a halt request.
 * Everything a resumed run needs to continue the same curve (weights,
 * moments, step, data position) goes into the checkpoint, and nothing else
 * influences the math: batches are pure functions of (seed, position). */
#include "trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "artifacts.h"
#include "checkpoint.h"
#include "data.h"
#include "log.h"
#include "schedule.h"
#include "trainsamples.h"

/* ---- monitor ------------------------------------------------------------ */

static const char *const phase_names[PHASE_COUNT] = {
    "idle", "starting", "data", "forward", "backward", "allreduce", "optimizer", "checkpoint", "eval",
};

const char *trainPhaseName(TrainPhase phase) {
    if ((int)phase < 0 || phase >= PHASE_COUNT) return "unknown";
    return phase_names[phase];
}

int trainPhaseFromName(const char *name) {
    for (int i = 0; name && i < PHASE_COUNT; i++)
        if (!strcmp(name, phase_names[i])) return i;
    return -1;
}

static int64_t monotonicNs(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void trainMonitorInit(TrainMonitor *mon) {
    atomic_store(&mon->phase, PHASE_IDLE);
    atomic_store(&mon->phase_since_ns, monotonicNs());
    atomic_store(&mon->step, 0);
    atomic_store(&mon->heartbeat_ns, monotonicNs());
    atomic_store(&mon->halt_requested, 0);
    atomic_store(&mon->stop_now, 0);
    atomic_store(&mon->step_done_ns, 0);
    atomic_store(&mon->step_done, 0);
    atomic_store(&mon->memory_bytes, 0);
    atomic_store(&mon->memory_step, 0);
    atomic_store(&mon->device_seq, 0);
    mon->device[0] = '\0';
}

/* A seqlock: one writer (the trainer), readers retry while it writes. The
 * bytes go through relaxed atomic loads and stores so that a read racing
 * a write is defined behaviour; the sequence numbers order them. */
void trainMonitorSetDevice(TrainMonitor *mon, const char *line) {
    unsigned seq = atomic_load_explicit(&mon->device_seq, memory_order_relaxed);
    atomic_store_explicit(&mon->device_seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    size_t i = 0;
    for (; line && line[i] && i + 1 < sizeof mon->device; i++)
        atomic_store_explicit((_Atomic char *)&mon->device[i], line[i], memory_order_relaxed);
    atomic_store_explicit((_Atomic char *)&mon->device[i], '\0', memory_order_relaxed);
    atomic_store_explicit(&mon->device_seq, seq + 2, memory_order_release);
}

void trainMonitorDevice(TrainMonitor *mon, char *out, size_t cap) {
    out[0] = '\0';
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned before = atomic_load_explicit(&mon->device_seq, memory_order_acquire);
        if (before & 1) continue;
        size_t i = 0;
        for (; i + 1 < cap && i < sizeof mon->device; i++) {
            out[i] = atomic_load_explicit((_Atomic char *)&mon->device[i], memory_order_relaxed);
            if (!out[i]) break;
        }
        out[i < cap ? i : cap - 1] = '\0';
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&mon->device_seq, memory_order_relaxed) == before) return;
    }
    snprintf(out, cap, "(being replaced)");
}

void trainMonitorDescribeDevice(TrainMonitor *mon, int64_t now_ns, char *out, size_t cap) {
    char device[sizeof mon->device];
    trainMonitorDevice(mon, device, sizeof device);
    const int64_t mem = atomic_load(&mon->memory_bytes), mem_step = atomic_load(&mon->memory_step);
    const int64_t done_ns = atomic_load(&mon->step_done_ns), done = atomic_load(&mon->step_done);
    char memory[96], last[128];
    if (mem_step > 0)
        snprintf(memory, sizeof memory, "%.2f GB in use at step %" PRId64, (double)mem / 1e9,
                 mem_step);
    else
        snprintf(memory, sizeof memory, "not measured yet (no step logged in this process)");
    if (done_ns > 0)
        snprintf(last, sizeof last, "step %" PRId64 ", %.1f s ago", done,
                 now_ns > done_ns ? (double)(now_ns - done_ns) * 1e-9 : 0.0);
    else
        snprintf(last, sizeof last, "none yet in this process");
    snprintf(out, cap, "device: %s\ndevice_memory: %s\nlast_step_done: %s\n",
             device[0] ? device : "(no model built yet)", memory, last);
}

/* clock_gettime and atomic stores only: async-signal-safe */
void trainMonitorEnter(TrainMonitor *mon, TrainPhase phase) {
    int64_t now = monotonicNs();
    atomic_store(&mon->phase, (int)phase);
    atomic_store(&mon->phase_since_ns, now);
    atomic_store(&mon->heartbeat_ns, now);
}

/* ---- the job ------------------------------------------------------------ */

typedef struct Trainer {
    JobConfig job;                /* cfg with the command line's overrides */
    const char *out_dir;          /* job.train.out_dir */
    TrainMonitor *mon;
    const TrainHooks *hooks;
    int quiet;
    /* the logged sample of a step that is evaluated next, for on_eval */
    TrainSample held_sample;
    int has_held_sample;

    NsaModel *model;
    TrainSamples *samples;        /* the prompts continued at each evaluation, or NULL */
    DataLoader *train_data, *val_data;
    Artifacts *art;
    int32_t *tokens, *targets;
    LrSchedule schedule;
    char *model_config_json;      /* for checkpoint metadata */

    ResumeState state;            /* step, data position, tokens, anomalies */
    uint64_t config_hash;
    double bytes_per_token;

    /* what happened so far in this process */
    double last_loss, last_grad_norm;
    double first_val, first_bpb, last_val, last_bpb, best_val;
    int64_t last_saved_step, last_eval_step;
    char last_checkpoint[4096];
    char anomaly[32];
    int fault_fired, stall_fired;

    /* throughput */
    double started;               /* monotonic seconds at the first step */
    int64_t steps_this_process;
    double log_step_seconds;      /* time in steps (not eval/checkpoint) since the last log */
    int64_t log_tokens0;
} Trainer;

static double monotonicSeconds(void) { return (double)monotonicNs() * 1e-9; }

static double unixSeconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident memory of the process (CPU engine) or memory in use on the GPU. */
static size_t memoryInUse(const Trainer *t) {
    if (t->job.runtime.device == NSA_DEVICE_CUDA) {
        NsaMemoryReport r;
        if (nsaModelMemoryReport(t->model, &r) == 0 && r.device_total >= r.device_free)
            return r.device_total - r.device_free;
        return 0;
    }
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long pages_total = 0, pages_resident = 0;
    int got = fscanf(f, "%lu %lu", &pages_total, &pages_resident);
    fclose(f);
    if (got != 2) return 0;
    return (size_t)pages_resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* An event: the heartbeat line, the hook, and nothing else. A heartbeat
 * write failure is returned: the artifacts are part of the contract. */
static int emitEvent(Trainer *t, const char *type, const char *detail_json, NsaError *err) {
    if (t->art && artifactsLogEvent(t->art, type, t->state.step,
                                    trainPhaseName((TrainPhase)atomic_load(&t->mon->phase)),
                                    detail_json, err) != 0)
        return -1;
    if (t->hooks && t->hooks->on_event) t->hooks->on_event(t->hooks->ctx, type, detail_json);
    return 0;
}

/* Sleeps inside `phase` when the config's fault section asks for a stall
 * there at this step (the watchdog's test); once per run, interruptible by
 * stop_now. */
static void maybeStall(Trainer *t, TrainPhase phase, int64_t step) {
    const FaultConfig *f = &t->job.fault;
    if (t->stall_fired || f->stall_at_step <= 0 || f->stall_at_step != step) return;
    if (trainPhaseFromName(f->stall_phase) != (int)phase) return;
    t->stall_fired = 1;
    logWarn("fault: stalling %.1f s in phase %s at step %" PRId64 " (fault.stall_at_step)",
            f->stall_seconds, f->stall_phase, step);
    double until = monotonicSeconds() + f->stall_seconds;
    while (monotonicSeconds() < until && !atomic_load(&t->mon->stop_now)) {
        struct timespec slice = {0, 20 * 1000 * 1000};
        nanosleep(&slice, NULL);
    }
}

static void enter(Trainer *t, TrainPhase phase, int64_t step) {
    trainMonitorEnter(t->mon, phase);
    maybeStall(t, phase, step);
}

/* ---- setup -------------------------------------------------------------- */

int trainerApplyOptions(JobConfig *job, const TrainOptions *opt, NsaError *err) {
    if (opt->out_dir && snprintf(job->train.out_dir, sizeof job->train.out_dir, "%s",
                                 opt->out_dir) >= (int)sizeof job->train.out_dir)
        return nsaErrorf(err, "--out: '%.60s...' is longer than %zu bytes", opt->out_dir,
                    sizeof job->train.out_dir - 1);
    if (opt->steps > 0) job->train.steps = opt->steps;
    if (opt->device_override >= 0) {
        job->runtime.device = (NsaDevice)opt->device_override;
        job->runtime.device_auto = 0;
        if (job->runtime.precision_auto)
            job->runtime.precision = configAutoPrecision(job->runtime.device);
    }
    return configValidate(job, err);
}

static int applyOverrides(Trainer *t, const JobConfig *cfg, const TrainOptions *opt,
                          NsaError *err) {
    t->job = *cfg;
    if (trainerApplyOptions(&t->job, opt, err) != 0) return -1;
    t->out_dir = t->job.train.out_dir;
    const TrainConfig *tc = &t->job.train;
    t->schedule = (LrSchedule){tc->lr, tc->min_lr, tc->warmup_steps, tc->steps};
    t->config_hash = configHash(&t->job);
    return 0;
}

static int evalEnabled(const Trainer *t) {
    return t->job.train.eval_every > 0 && t->job.train.eval_batches > 0;
}

static int openData(Trainer *t, NsaError *err) {
    t->train_data = dataOpen(&t->job, SPLIT_TRAIN, err);
    if (!t->train_data) return -1;
    int data_vocab = dataVocabSize(t->train_data);
    if (data_vocab > t->job.model.vocab_size)
        return nsaErrorf(err, "model.vocab_size: %d is smaller than the data's vocabulary (%d); "
                         "allowed: >= %d", t->job.model.vocab_size, data_vocab, data_vocab);
    t->bytes_per_token = dataBytesPerToken(t->train_data);
    if (evalEnabled(t)) {
        t->val_data = dataOpen(&t->job, SPLIT_VAL, err);
        if (!t->val_data) return -1;
    }
    size_t n = (size_t)t->job.train.batch_size * (size_t)t->job.train.seq_len;
    t->tokens = malloc(n * sizeof(int32_t));
    t->targets = malloc(n * sizeof(int32_t));
    if (!t->tokens || !t->targets) return nsaErrorf(err, "out of memory for a batch of %zu tokens", n);
    return 0;
}

/* The device line of hang dumps: engine, precision, which device (the
 * probe's line on CUDA), memory and attention path. Asked once per job,
 * while the device answers. */
static void publishDevice(Trainer *t, const NsaMemoryReport *mem) {
    const RuntimeConfig *rt = &t->job.runtime;
    char line[1024]; /* room for every part; the monitor keeps what fits */
    if (rt->device == NSA_DEVICE_CUDA) {
        NsaDeviceInfo info;
        NsaError e;
        const int probed = nsaDeviceProbe(&info, &e) == 0;
        snprintf(line, sizeof line, "%s, %s; %s; model %.2f GB; attention %s",
                 configDeviceName(rt->device), configPrecisionName(rt->precision),
                 probed ? info.description : "device not probed", mem ? (double)mem->total / 1e9 : 0.0,
                 mem ? mem->attention_path : "?");
    } else {
        snprintf(line, sizeof line, "%s, %s; %d threads", configDeviceName(rt->device),
                 configPrecisionName(rt->precision), rt->threads);
    }
    trainMonitorSetDevice(t->mon, line);
}

static int createModel(Trainer *t, NsaError *err) {
    NsaEngineOptions eo = {
        .device = t->job.runtime.device,
        .device_ordinal = 0,
        .precision = t->job.runtime.precision,
        .max_batch = t->job.train.batch_size,
        .max_seq_len = t->job.train.seq_len,
        .threads = t->job.runtime.threads,
    };
    t->model = nsaModelCreate(&t->job.model, &eo, err);
    if (!t->model) return -1;
    cJSON *all = artifactsConfigJson(&t->job);
    cJSON *mc = cJSON_CreateObject();
    if (all && mc) {
        cJSON_AddItemToObject(mc, "model", cJSON_DetachItemFromObject(all, "model"));
        cJSON_AddItemToObject(mc, "nsa", cJSON_DetachItemFromObject(all, "nsa"));
        t->model_config_json = cJSON_PrintUnformatted(mc);
    }
    cJSON_Delete(all);
    cJSON_Delete(mc);
    if (!t->model_config_json) return nsaErrorf(err, "out of memory describing the model config");
    return 0;
}

/* Loads the checkpoint `spec` names, or initialises from the seed.
 * *resumed_from receives the directory, or "" for a fresh start. */
static int restoreOrInit(Trainer *t, const char *spec, char *resumed_from, size_t cap,
                         NsaError *err) {
    resumed_from[0] = 0;
    memset(&t->state, 0, sizeof t->state);
    t->state.seed = t->job.train.seed;
    t->state.config_hash = t->config_hash;
    if (spec) {
        char skipped[1024] = "";
        int found = !strcmp(spec, "latest-valid")
                        ? checkpointResolveValid(t->out_dir, resumed_from, cap, skipped, sizeof skipped, err)
                        : checkpointResolve(t->out_dir, spec, resumed_from, cap, err);
        if (found < 0) return -1;
        if (found > 0 && skipped[0])
            logWarn("resume: skipping damaged checkpoints (%s); resuming from %s", skipped, resumed_from);
        if (found == 0) {
            logNotice("resume: %s/checkpoints has no checkpoint yet; starting at step 0",
                      t->out_dir);
        } else {
            ResumeState st;
            if (checkpointLoad(t->model, resumed_from, &st, err) != 0) return -1;
            if (st.config_hash != t->config_hash)
                return nsaErrorf(err, "resume: %s was written by a run whose config hashes to %016" PRIx64
                                 "; this config hashes to %016" PRIx64
                                 " (model, nsa, data, seed or batch shape differ)",
                            resumed_from, st.config_hash, t->config_hash);
            t->state = st;
            logNotice("resume: step %" PRId64 " from %s (data position %" PRIu64 ")", st.step,
                      resumed_from, st.data_position);
            return 0;
        }
    }
    return nsaModelInit(t->model, t->job.train.seed, err);
}

/* ---- the step ----------------------------------------------------------- */

static int runStep(Trainer *t, int64_t step, double lr, NsaStepStats *stats, NsaError *err) {
    const TrainConfig *tc = &t->job.train;
    int accum = tc->accumulate_grad_batches;
    size_t batch_tokens = (size_t)tc->batch_size * (size_t)tc->seq_len;
    if (nsaModelZeroGrad(t->model, err) != 0) return -1;
    for (int micro = 0; micro < accum; micro++) {
        enter(t, PHASE_DATA, step);
        if (dataBatch(t->train_data, t->state.data_position, t->tokens, t->targets, err) != 0)
            return -1;
        t->state.data_position++;
        t->state.tokens_seen += (int64_t)batch_tokens;
        if (micro == 0 && !t->fault_fired && t->job.fault.nan_at_step == step &&
            t->job.fault.nan_kind != FAULT_NONE) {
            NsaFault f = t->job.fault.nan_kind == FAULT_NAN_GRAD ? NSA_FAULT_NAN_GRAD
                                                                  : NSA_FAULT_NAN_LOSS;
            logWarn("fault: injecting NaN %s at step %" PRId64 " (fault.nan_at_step)",
                    f == NSA_FAULT_NAN_GRAD ? "gradient" : "loss", step);
            if (nsaModelInjectFault(t->model, f, err) != 0) return -1;
            t->fault_fired = 1;
        }
        enter(t, PHASE_FORWARD, step);
        if (nsaModelForward(t->model, t->tokens, t->targets, tc->batch_size, tc->seq_len,
                            1.0f / (float)accum, err) != 0)
            return -1;
        enter(t, PHASE_BACKWARD, step);
        if (nsaModelBackward(t->model, err) != 0) return -1;
    }
    enter(t, PHASE_OPTIMIZER, step);
    NsaOptimConfig oc = {
        .lr = (float)lr,
        .beta1 = (float)tc->beta1,
        .beta2 = (float)tc->beta2,
        .eps = (float)tc->eps,
        .weight_decay = (float)tc->weight_decay,
        .grad_clip = (float)tc->grad_clip,
    };
    if (nsaModelOptimizerStep(t->model, &oc, step, err) != 0) return -1;
    return nsaModelStepStats(t->model, stats, err);
}

/* ---- evaluation, logging, checkpoints ------------------------------------ */

/* The evaluation's samples (daemon/trainsamples.c): samples.jsonl and a
 * `samples` event. A sampling failure is logged and the run goes on: the
 * samples are a view of the model, not part of its training. */
static int sampleAtEval(Trainer *t, int64_t step, NsaError *err) {
    if (!t->samples) return 0;
    char *detail = NULL;
    NsaError e;
    if (trainSamplesRun(t->samples, t->model, step, &detail, &e) != 0 ||
        trainSamplesAppend(t->out_dir, detail, unixSeconds(), &e) != 0) {
        logWarn("samples at step %" PRId64 ": %s", step, e.message);
        free(detail);
        return 0;
    }
    int rc = emitEvent(t, "samples", detail, err);
    free(detail);
    return rc;
}

static int evaluate(Trainer *t, NsaError *err) {
    const TrainConfig *tc = &t->job.train;
    int64_t step = t->state.step;
    enter(t, PHASE_EVAL, step);
    double sum = 0;
    for (int64_t i = 0; i < tc->eval_batches; i++) {
        /* the same held-out batches every time, so the curve compares */
        if (dataBatch(t->val_data, (uint64_t)i, t->tokens, t->targets, err) != 0) return -1;
        double loss;
        if (nsaModelEvalLoss(t->model, t->tokens, t->targets, tc->batch_size, tc->seq_len, &loss,
                             err) != 0)
            return -1;
        sum += loss;
    }
    double val = sum / (double)tc->eval_batches;
    /* token shards do not record the text they came from: no bits-per-byte
     * figure then (NaN is written as "nan" in val.csv and null in JSON) */
    double bpb = t->bytes_per_token > 0 ? val / log(2.0) / t->bytes_per_token : NAN;
    if (isnan(t->first_val)) {
        t->first_val = val;
        t->first_bpb = bpb;
    }
    t->last_val = val;
    t->last_bpb = bpb;
    if (isnan(t->best_val) || val < t->best_val) t->best_val = val;
    t->last_eval_step = step;
    if (artifactsLogEval(t->art, step, val, bpb, err) != 0) return -1;
    const TrainSample *held = t->has_held_sample && t->held_sample.step == step ? &t->held_sample : NULL;
    if (t->hooks && t->hooks->on_eval) t->hooks->on_eval(t->hooks->ctx, held, step, val, bpb);
    t->has_held_sample = 0;
    logInfo("eval: step %" PRId64 " val_loss %.4f (%.4f bits/byte)", step, val, bpb);
    if (!t->quiet) {
        printf("eval  %6" PRId64 " | val_loss %.4f | %.4f bits/byte\n", step, val, bpb);
        fflush(stdout);
    }
    return sampleAtEval(t, step, err);
}

static int saveCheckpoint(Trainer *t, NsaError *err) {
    enter(t, PHASE_CHECKPOINT, t->state.step);
    double t0 = monotonicSeconds();
    if (checkpointSave(t->model, t->out_dir, &t->state, t->job.train.keep_last,
                       t->model_config_json, t->last_checkpoint, sizeof t->last_checkpoint,
                       err) != 0)
        return -1;
    t->last_saved_step = t->state.step;
    double secs = monotonicSeconds() - t0;
    logInfo("checkpoint: step %" PRId64 " -> %s (%.2f s)", t->state.step, t->last_checkpoint, secs);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "dir", t->last_checkpoint);
    cJSON_AddNumberToObject(d, "seconds", secs);
    char *detail = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    int rc = detail ? emitEvent(t, "checkpoint", detail, err) : nsaErrorf(err, "out of memory");
    free(detail);
    return rc;
}

static void formatEta(double seconds, char *out, size_t cap) {
    if (!(seconds >= 0) || seconds > 1e8) {
        snprintf(out, cap, "?");
        return;
    }
    long s = lround(seconds);
    if (s >= 3600) snprintf(out, cap, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(out, cap, "%ld:%02ld", s / 60, s % 60);
}

/* toks_per_s counts the steps' own time: evaluations and checkpoints in
 * between would otherwise show up as a throughput drop. */
/* Hands a held sample to on_sample after all (its evaluation failed). */
static void releaseHeldSample(Trainer *t) {
    if (t->has_held_sample && t->hooks && t->hooks->on_sample)
        t->hooks->on_sample(t->hooks->ctx, &t->held_sample);
    t->has_held_sample = 0;
}

/* Logs the step to training.csv and the console; its sample goes to
 * on_sample now, or - hold: the step is evaluated next - to on_eval with
 * the evaluation. Returns -1 with err set when the CSV write fails. */
static int logStep(Trainer *t, const NsaStepStats *stats, double lr, double step_seconds, int hold,
                   NsaError *err) {
    double now = monotonicSeconds();
    double span = t->log_step_seconds;
    int64_t tokens = t->state.tokens_seen - t->log_tokens0;
    TrainSample s = {
        .step = t->state.step,
        .total_steps = t->job.train.steps,
        .ts = unixSeconds(),
        .loss = stats->loss,
        .lr = lr,
        .grad_norm = stats->grad_norm,
        .toks_per_s = span > 0 ? (double)tokens / span : 0,
        .step_seconds = step_seconds,
        .tokens_seen = t->state.tokens_seen,
        .mem_bytes = memoryInUse(t),
    };
    atomic_store(&t->mon->memory_bytes, (int64_t)s.mem_bytes);
    atomic_store(&t->mon->memory_step, s.step);
    t->log_step_seconds = 0;
    t->log_tokens0 = t->state.tokens_seen;
    const char *phase = t->state.step <= t->job.train.warmup_steps ? "warmup" : "train";
    if (artifactsLogStep(t->art, &s, phase, err) != 0) return -1;
    if (hold) {
        t->held_sample = s;
        t->has_held_sample = 1;
    } else if (t->hooks && t->hooks->on_sample) {
        t->hooks->on_sample(t->hooks->ctx, &s);
    }
    if (!t->quiet) {
        double per_step = (now - t->started) / (double)t->steps_this_process;
        char eta[32];
        formatEta(per_step * (double)(t->job.train.steps - t->state.step), eta, sizeof eta);
        printf("step %6" PRId64 "/%" PRId64 " | loss %.4f | lr %.2e | grad %.3f | %.0f tok/s | "
               "ETA %s\n",
               s.step, s.total_steps, s.loss, s.lr, s.grad_norm, s.toks_per_s, eta);
        fflush(stdout);
    }
    return 0;
}

/* ---- the NaN guard ------------------------------------------------------- */

typedef enum GuardAction { GUARD_CONTINUE = 0, GUARD_HALT = 1 } GuardAction;

static const char *policyName(NanPolicy p) {
    return p == NAN_SKIP ? "skip" : p == NAN_ROLLBACK ? "rollback" : "halt";
}

/* Reloads the newest checkpoint of this run. The anomaly count survives
 * (it is this run's budget), and the CSV logs drop the steps that are
 * about to be replayed. Returns 0, 1 when there is nothing to roll back
 * to, or -1 with err. */
static int rollBack(Trainer *t, NsaError *err) {
    char dir[4096], skipped[1024] = "";
    int found = checkpointResolveValid(t->out_dir, dir, sizeof dir, skipped, sizeof skipped, err);
    if (found <= 0) return found < 0 ? -1 : 1;
    if (skipped[0]) logWarn("rollback: skipping damaged checkpoints (%s); rolling back to %s", skipped, dir);
    int anomalies = t->state.anomalies;
    int64_t from = t->state.step;
    ResumeState st;
    if (checkpointLoad(t->model, dir, &st, err) != 0) return -1;
    if (st.config_hash != t->config_hash)
        return nsaErrorf(err, "rollback: %s belongs to another config (hash %016" PRIx64 ")", dir,
                    st.config_hash);
    t->state = st;
    t->state.anomalies = anomalies;
    t->log_tokens0 = st.tokens_seen;  /* throughput restarts from the checkpoint */
    t->log_step_seconds = 0;
    atomic_store(&t->mon->step, st.step);
    artifactsClose(t->art);
    t->art = artifactsOpen(t->out_dir, st.step, err);
    if (!t->art) return -1;
    t->last_saved_step = st.step;
    logWarn("rollback: step %" PRId64 " -> %" PRId64 " (%s)", from, st.step, dir);
    char detail[4400];
    snprintf(detail, sizeof detail, "{\"from_step\":%" PRId64 ",\"to_step\":%" PRId64 "}", from,
             st.step);
    return emitEvent(t, "rollback", detail, err);
}

/* Called when the engine did not apply step `step`. Records the anomaly and
 * applies nan.policy. Returns GUARD_CONTINUE, GUARD_HALT (err says why), or
 * -1 on an error while handling it. */
static int guardAnomaly(Trainer *t, int64_t step, const NsaStepStats *stats, NsaError *err) {
    if (!stats->nonfinite_loss && !stats->nonfinite_grad)
        return nsaErrorf(err, "step %" PRId64 ": the engine skipped the update with a finite loss (%g) "
                         "and gradient norm (%g)", step, stats->loss, stats->grad_norm);
    if (stats->nonfinite_loss) artifactsAnomalyName(stats->loss, "loss", t->anomaly, sizeof t->anomaly);
    else artifactsAnomalyName(stats->grad_norm, "grad", t->anomaly, sizeof t->anomaly);
    t->state.anomalies++;
    const NanConfig *nc = &t->job.nan;
    int over_budget = nc->policy != NAN_HALT && t->state.anomalies > nc->max_skips;
    const char *action = nc->policy == NAN_HALT || over_budget ? "halt"
                         : nc->policy == NAN_SKIP             ? "skip"
                                                              : "rollback";
    logError("nan guard: %s at step %" PRId64 " (loss %g, grad norm %g): update skipped; "
             "policy %s -> %s (%d anomalies, max_skips %d)",
             t->anomaly, step, stats->loss, stats->grad_norm, policyName(nc->policy), action,
             t->state.anomalies, nc->max_skips);
    if (artifactsWriteAnomaly(t->out_dir, t->anomaly, err) != 0) return -1;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", t->anomaly);
    cJSON_AddNumberToObject(d, "at_step", (double)step);
    cJSON_AddNumberToObject(d, "loss", stats->loss);
    cJSON_AddNumberToObject(d, "grad_norm", stats->grad_norm);
    cJSON_AddStringToObject(d, "policy", policyName(nc->policy));
    cJSON_AddStringToObject(d, "action", action);
    cJSON_AddNumberToObject(d, "anomalies", t->state.anomalies);
    char *detail = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    int rc = detail ? emitEvent(t, "anomaly", detail, err) : nsaErrorf(err, "out of memory");
    free(detail);
    if (rc != 0) return -1;

    if (!strcmp(action, "skip")) return GUARD_CONTINUE;
    if (!strcmp(action, "rollback")) {
        int r = rollBack(t, err);
        if (r <= 0) return r < 0 ? -1 : GUARD_CONTINUE;
        nsaErrorf(err, "step %" PRId64 ": %s; nan.policy rollback found no checkpoint in %s/checkpoints "
                  "to roll back to: halted", step, t->anomaly, t->out_dir);
    } else if (over_budget) {
        nsaErrorf(err, "step %" PRId64 ": %s; %d anomalies exceed nan.max_skips (%d): halted", step,
             t->anomaly, t->state.anomalies, nc->max_skips);
    } else {
        nsaErrorf(err, "step %" PRId64 ": %s (loss %g, grad norm %g): update skipped, run halted "
                  "(nan.policy halt)", step, t->anomaly, stats->loss, stats->grad_norm);
    }
    char reason[600];
    snprintf(reason, sizeof reason, "nan guard: %s", err ? err->message : t->anomaly);
    NsaError halt_err;
    if (artifactsWriteHalt(t->out_dir, reason, &halt_err) != 0)
        logError("nan guard: %s", halt_err.message);
    return GUARD_HALT;
}

/* ---- the run -------------------------------------------------------------- */

static void freeTrainer(Trainer *t) {
    artifactsClose(t->art);
    dataClose(t->train_data);
    dataClose(t->val_data);
    trainSamplesFree(t->samples);
    nsaModelFree(t->model);
    free(t->tokens);
    free(t->targets);
    free(t->model_config_json);
}

static const char *outcomeName(TrainOutcome o) {
    switch (o) {
    case TRAIN_COMPLETED: return "completed";
    case TRAIN_HALTED: return "halted";
    case TRAIN_NAN_HALTED: return "nan_halted";
    default: return "failed";
    }
}

/* Why the run should stop after this step, or NULL. */
static const char *haltReason(Trainer *t) {
    if (atomic_load(&t->mon->stop_now)) return "stop_now";
    if (atomic_load(&t->mon->halt_requested)) return "halt request";
    if (artifactsHaltRequested(t->out_dir)) return ".HALT file";
    return NULL;
}

static int trainLoop(Trainer *t, TrainOutcome *outcome, const char **halt_reason, NsaError *err) {
    const TrainConfig *tc = &t->job.train;
    t->started = monotonicSeconds();
    t->log_step_seconds = 0;
    t->log_tokens0 = t->state.tokens_seen;
    while (t->state.step < tc->steps) {
        int64_t step = t->state.step + 1;
        double lr = scheduleLr(&t->schedule, step);
        double t0 = monotonicSeconds();
        NsaStepStats stats;
        if (runStep(t, step, lr, &stats, err) != 0) return -1;
        atomic_store(&t->mon->step_done, step); /* its results are back from the device */
        atomic_store(&t->mon->step_done_ns, monotonicNs());
        t->log_step_seconds += monotonicSeconds() - t0;
        if (!stats.applied || stats.nonfinite_loss || stats.nonfinite_grad) {
            int g = guardAnomaly(t, step, &stats, err);
            if (g < 0) return -1;
            if (g == GUARD_HALT) {
                *outcome = TRAIN_NAN_HALTED;
                return 0;
            }
        } else {
            t->state.step = step;
            t->steps_this_process++;
            t->last_loss = stats.loss;
            t->last_grad_norm = stats.grad_norm;
            atomic_store(&t->mon->step, step);
            const int eval_now = evalEnabled(t) && (step % tc->eval_every == 0 || step == tc->steps);
            if ((tc->log_every > 0 && step % tc->log_every == 0) || step == tc->steps)
                if (logStep(t, &stats, lr, monotonicSeconds() - t0, eval_now, err) != 0) return -1;
            if (eval_now && evaluate(t, err) != 0) {
                releaseHeldSample(t);
                return -1;
            }
            if (tc->save_every > 0 && step % tc->save_every == 0 && step != tc->steps)
                if (saveCheckpoint(t, err) != 0) return -1;
        }
        *halt_reason = haltReason(t);
        if (*halt_reason && t->state.step < tc->steps) {
            *outcome = TRAIN_HALTED;
            return 0;
        }
    }
    *outcome = TRAIN_COMPLETED;
    return 0;
}

static void writeSummary(Trainer *t, TrainOutcome outcome, double wall, const char *error) {
    double run_secs = t->steps_this_process ? monotonicSeconds() - t->started : 0;
    int64_t tokens_per_step = (int64_t)t->job.train.batch_size * t->job.train.seq_len *
                              t->job.train.accumulate_grad_batches;
    RunSummary s = {
        .outcome = outcomeName(outcome),
        .step = t->state.step,
        .total_steps = t->job.train.steps,
        .final_loss = t->last_loss,
        .first_val_loss = t->first_val,
        .first_bits_per_byte = t->first_bpb,
        .final_val_loss = t->last_val,
        .final_bits_per_byte = t->last_bpb,
        .best_val_loss = t->best_val,
        .tokens_seen = t->state.tokens_seen,
        .wall_seconds = wall,
        .mean_toks_per_s = run_secs > 0 ? (double)(t->steps_this_process * tokens_per_step) / run_secs
                                        : NAN,
        .anomalies = t->state.anomalies,
        .anomaly = t->anomaly,
        .last_checkpoint = t->last_checkpoint,
        .error = error ? error : "",
    };
    NsaError e;
    if (artifactsWriteMetrics(t->out_dir, &s, &e) != 0) logError("metrics.json: %s", e.message);
}

/* What an earlier process of this run evaluated (val.csv rows kept by the
 * resume), so metrics.json summarises the whole curve. */
static void loadValHistory(Trainer *t) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", t->out_dir, ARTIFACT_VAL_CSV);
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[256];
    int first = 1;
    while (fgets(line, sizeof line, f)) {
        if (first) {  /* the header */
            first = 0;
            continue;
        }
        long long step;
        double val, bpb;
        if (sscanf(line, "%lld,%lf,%lf", &step, &val, &bpb) != 3) continue;
        if (isnan(t->first_val)) {
            t->first_val = val;
            t->first_bpb = bpb;
        }
        t->last_val = val;
        t->last_bpb = bpb;
        if (isnan(t->best_val) || val < t->best_val) t->best_val = val;
    }
    fclose(f);
}

/* Everything before the first step: overrides, data, model, weights
 * (checkpoint or seed), artifacts, env.json, the start event and the
 * step-0 evaluation. Returns 0 or -1 with err. */
static int startRun(Trainer *t, const JobConfig *cfg, const TrainOptions *opt, NsaError *err) {
    char resumed_from[4096] = "";
    if (applyOverrides(t, cfg, opt, err) != 0) return -1;
    NsaError e;
    int removed = artifactsClearStale(t->out_dir, &e);
    if (removed > 0) logNotice("removed a stale .HALT/.anomaly_type from %s", t->out_dir);
    if (openData(t, err) != 0 || createModel(t, err) != 0 ||
        restoreOrInit(t, opt->resume, resumed_from, sizeof resumed_from, err) != 0)
        return -1;
    int resumed = resumed_from[0] != 0;
    if (resumed) t->last_saved_step = t->last_eval_step = t->state.step;
    atomic_store(&t->mon->step, t->state.step);
    t->art = artifactsOpen(t->out_dir, resumed ? t->state.step : -1, err);
    if (!t->art) return -1;
    if (resumed) loadValHistory(t);
    const char *no_samples = NULL;
    t->samples = trainSamplesCreate(&t->job, &no_samples, &e);
    if (!t->samples && no_samples) logInfo("samples: none (%s)", no_samples);
    else if (!t->samples) logWarn("samples: none: %s", e.message);
    NsaMemoryReport mem;
    int have_mem = nsaModelMemoryReport(t->model, &mem) == 0;
    if (artifactsWriteEnv(t->out_dir, &t->job, have_mem ? &mem : NULL,
                          resumed ? resumed_from : NULL, err) != 0)
        return -1;

    const TrainConfig *tc = &t->job.train;
    size_t n_params = 0;  /* the arenas' padding is not a parameter */
    for (int i = 0; i < nsaModelNumTensors(t->model); i++)
        n_params += nsaModelTensorInfo(t->model, i)->numel;
    logInfo("train: %zu parameters (%.1f MB with activations), %s %s, %" PRId64
            " steps of %d x %d x %d tokens, out_dir %s",
            n_params, have_mem ? (double)mem.total / 1e6 : 0.0,
            configDeviceName(t->job.runtime.device), configPrecisionName(t->job.runtime.precision),
            tc->steps, tc->batch_size, tc->seq_len, tc->accumulate_grad_batches, t->out_dir);
    if (have_mem) {
        logInfo("memory: params %.1f MB, grads %.1f MB, optimizer %.1f MB, activations %.1f MB, "
                "workspace %.1f MB, total %.1f MB",
                (double)mem.params / 1e6, (double)mem.grads / 1e6, (double)mem.optimizer / 1e6,
                (double)mem.activations / 1e6, (double)mem.workspace / 1e6, (double)mem.total / 1e6);
        if (mem.attention_path[0]) logInfo("attention: %s", mem.attention_path);
    }
    publishDevice(t, have_mem ? &mem : NULL);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "step", (double)t->state.step);
    cJSON_AddNumberToObject(d, "total_steps", (double)tc->steps);
    cJSON_AddNumberToObject(d, "params", (double)n_params);
    cJSON_AddStringToObject(d, "device", configDeviceName(t->job.runtime.device));
    if (resumed) cJSON_AddStringToObject(d, "checkpoint", resumed_from);
    char *detail = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    int rc = detail ? emitEvent(t, resumed ? "resume" : "start", detail, err)
                    : nsaErrorf(err, "out of memory");
    free(detail);
    if (rc != 0) return -1;
    /* the curve's true start: the untrained model */
    if (!resumed && evalEnabled(t)) return evaluate(t, err);
    return 0;
}

/* The closing heartbeat event (or, without artifacts, the fail hook) and
 * metrics.json. Errors here are logged: the outcome is already decided. */
static void finishRun(Trainer *t, TrainOutcome outcome, const char *halt_reason, double wall,
                      const NsaError *err) {
    int failed = outcome == TRAIN_FAILED || outcome == TRAIN_NAN_HALTED;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "outcome", outcomeName(outcome));
    if (halt_reason && outcome == TRAIN_HALTED) cJSON_AddStringToObject(d, "reason", halt_reason);
    if (outcome == TRAIN_NAN_HALTED) cJSON_AddStringToObject(d, "anomaly", t->anomaly);
    if (failed) cJSON_AddStringToObject(d, "error", err->message);
    char *detail = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    const char *type = outcome == TRAIN_COMPLETED ? "complete" : outcome == TRAIN_FAILED ? "fail" : "halt";
    if (t->art) {
        NsaError e;
        if (detail && emitEvent(t, type, detail, &e) != 0) logError("heartbeat: %s", e.message);
        writeSummary(t, outcome, wall, failed ? err->message : "");
    } else if (t->hooks && t->hooks->on_event) {
        t->hooks->on_event(t->hooks->ctx, type, detail ? detail : "{}");
    }
    free(detail);
}

int trainerRun(const JobConfig *cfg, const TrainOptions *opt, TrainMonitor *mon,
               const TrainHooks *hooks, TrainResult *res, NsaError *err) {
    static const TrainOptions no_options = {NULL, NULL, 0, -1, 0};
    TrainMonitor local_mon;
    TrainResult local_res;
    NsaError local_err;
    if (!opt) opt = &no_options;
    if (!mon) {
        trainMonitorInit(&local_mon);
        mon = &local_mon;
    }
    if (!res) res = &local_res;
    if (!err) err = &local_err;
    memset(res, 0, sizeof *res);
    res->outcome = TRAIN_FAILED;
    res->last_loss = res->last_val_loss = NAN;

    Trainer *t = calloc(1, sizeof *t);
    if (!t) return nsaErrorf(err, "out of memory");
    t->mon = mon;
    t->hooks = hooks;
    t->quiet = opt->quiet;
    t->last_loss = t->last_grad_norm = NAN;
    t->first_val = t->first_bpb = t->last_val = t->last_bpb = t->best_val = NAN;
    t->last_saved_step = t->last_eval_step = -1;
    double wall0 = monotonicSeconds();
    trainMonitorEnter(mon, PHASE_STARTING);

    TrainOutcome outcome = TRAIN_FAILED;
    const char *halt_reason = NULL;
    int ok = startRun(t, cfg, opt, err) == 0 && trainLoop(t, &outcome, &halt_reason, err) == 0;
    if (ok && outcome == TRAIN_COMPLETED && evalEnabled(t) && t->last_eval_step != t->state.step)
        ok = evaluate(t, err) == 0;
    /* stop_now abandons the run: no checkpoint, shutdown is waiting */
    int stop_now = halt_reason && !strcmp(halt_reason, "stop_now");
    if (ok && (outcome == TRAIN_COMPLETED || outcome == TRAIN_HALTED) && !stop_now &&
        t->last_saved_step != t->state.step)
        ok = saveCheckpoint(t, err) == 0;
    if (!ok) outcome = TRAIN_FAILED;
    trainMonitorEnter(mon, PHASE_IDLE);
    finishRun(t, outcome, halt_reason, monotonicSeconds() - wall0, err);

    res->outcome = outcome;
    res->step = t->state.step;
    res->last_loss = t->last_loss;
    res->last_val_loss = t->last_val;
    snprintf(res->anomaly, sizeof res->anomaly, "%s", t->anomaly);
    freeTrainer(t);
    free(t);
    return outcome == TRAIN_COMPLETED || outcome == TRAIN_HALTED ? 0 : -1;
}
