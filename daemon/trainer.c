/* trainer.c - one training job, start to finish (see trainer.h).
 *
 * The loop, per optimizer step s (1-based):
 *   zero grads; accumulate_grad_batches x (data batch, forward, backward);
 *   AdamW at lr = schedule(s) (the engine skips a non-finite update);
 *   NaN guard; log; evaluate; checkpoint; look for a halt request.
 * Everything a resumed run needs to continue the same curve (weights,
 * moments, step, data position) goes into the checkpoint, and nothing else
 * influences the math: batches are pure functions of (seed, position).
 *
 * Data parallelism: the job's ranks (runtime.gpus, or runtime.cpu_ranks on
 * the CPU engine) are a RankGroup (ranks.c), one worker thread and model
 * per rank; one rank is the same code with one worker and no transport.
 * This thread reads every rank's batches (train.batch_size is per rank:
 * micro-batch a of a step gives rank r the batch at position
 * P + a * world + r, so the data position counts batches of batch_size
 * samples, whatever the rank count) and hands the step to all ranks at
 * once (stepOnRank); evaluation is shared by the ranks (evalOnRank: each
 * takes every world-th held-out batch); checkpoints gather the
 * sharded moments (nsaModelGatherTensor) and load by broadcast from rank 0
 * (nsaModelBroadcastTensor). */
#include "trainer.h"
#include "clockutil.h"

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
#include "lrschedule.h"
#include "peers.h"
#include "ranks.h"
#include "stackdump.h"
#include "trainsamples.h"
#include "watchdog.h"
#include "weights.h"

/* ---- the job ------------------------------------------------------------ */

typedef struct Trainer {
    JobConfig job;                /* cfg with the command line's overrides */
    const char *out_dir;          /* job.train.out_dir */
    TrainMonitor *mon;
    TrainMonitor own_mon;         /* mon when the caller gives none */
    const TrainHooks *hooks;
    /* the argument of the dispatch in flight (workArea): never on a stack,
     * as a worker given up on may still write into it (ranks.h) */
    void *work;
    size_t work_bytes;
    int quiet;
    /* the log of a step that is evaluated next, for on_eval */
    TrainStepLog held_step;
    int has_held_step;

    RankGroup *ranks;             /* the job's ranks on this node */
    NsaModel *model;              /* local rank 0's: its tensor table (no device calls) */
    int local, world, first;      /* ranks here, in the job, and the first one's rank */
    TrainSamples *samples;        /* the prompts continued at each evaluation, or NULL */
    int ordinals[TRAIN_MAX_RANKS];/* CUDA: each local rank's device */
    const TrainJoin *join;        /* a member of another node's job, else NULL */
    int multi_node;               /* the job has ranks on other nodes */
    struct RankSlot **xbuf;       /* [local] each rank's exchange buffer, world slots */
    TrainRankStatus *world_status;/* [world] every rank's last step (multi-node: exchanged) */
    pthread_mutex_t data_lock;    /* evaluation: ranks share the validation loader */
    DataLoader *train_data, *val_data;
    Artifacts *art;
    int32_t *tokens, *targets;    /* [local][accum][batch] each: a step's batches */
    float **scratch;              /* [local] the largest tensor: checkpoint gathers */
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
    /* fault injections done (once per run). fault_fired and exit_fired are
     * touched by the fault rank's worker only; stall_fired also by this
     * (the controller) thread, whose phases (data, eval, checkpoint) can
     * stall too. Never at once: the controller reads and writes it only
     * between dispatches, and rankGroupRun's lock orders those accesses
     * with the worker's. */
    int fault_fired, stall_fired, exit_fired;
    /* the last step of each local rank: its wall time and communication */
    double rank_seconds[TRAIN_MAX_RANKS];
    NsaCommStats rank_comm[TRAIN_MAX_RANKS];

    /* throughput */
    double started;               /* monotonic seconds at the first step */
    int64_t steps_this_process;
    double log_step_seconds;      /* time in steps (not eval/checkpoint) since the last log */
    int64_t log_tokens0;
} Trainer;

/* What the ranks tell each other besides the math (nsaModelExchange): a
 * slot per rank, all exchanged at the same points of every node's loop. */
typedef struct RankSlot {
    int32_t stop;            /* this node wants the job to stop after this step */
    int32_t found;           /* rollback: rank 0 found a checkpoint to go back to */
    double eval_sum;         /* evaluation: the sum of this rank's share of the batches */
    TrainRankStatus status;  /* its last step */
    ResumeState state;       /* rank 0's resume state after it loaded a checkpoint */
} RankSlot;

/* The argument of the next dispatch to the ranks, zeroed: the trainer's
 * one work area (a dispatch never starts another, and a failed one that
 * left a worker behind ends the ranks' dispatches). Everything a dispatch
 * reaches is the trainer's (its buffers, this area), freed only once the
 * last worker is gone (releaseTrainer): a worker given up on may return
 * and write into it later. NULL with err if bytes exceed the area, which
 * workBytes sizes for every kind of work. */
static void *workArea(Trainer *t, size_t bytes, NsaError *err) {
    if (bytes > t->work_bytes) {
        nsaErrorf(err, "internal: a dispatch of %zu bytes; the work area has %zu (workBytes)",
                  bytes, t->work_bytes);
        return NULL;
    }
    memset(t->work, 0, bytes);
    return t->work;
}

static int memoryReportOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    return nsaModelMemoryReport(rc->model, arg) == 0 ? 0 : nsaErrorf(err, "no memory report");
}

/* Local rank 0's memory report, asked on its thread (its device). */
static int memoryReport(Trainer *t, NsaMemoryReport *out) {
    NsaError err;
    NsaMemoryReport *w = workArea(t, sizeof *w, &err);
    if (!w || rankGroupRunOne(t->ranks, 0, memoryReportOnRank, w, &err) != 0) return -1;
    *out = *w;
    return 0;
}

/* Resident memory of the process (CPU engine) or memory in use on rank 0's GPU. */
static size_t memoryInUse(Trainer *t) {
    if (t->job.runtime.device == NSA_DEVICE_CUDA) {
        NsaMemoryReport r;
        if (memoryReport(t, &r) == 0 && r.device_total >= r.device_free)
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

/* The `stall` event of an injected stall in phase_name at step. */
static void emitStall(Trainer *t, const char *phase_name, int64_t step) {
    char detail[160];
    snprintf(detail, sizeof detail, "{\"phase\":\"%s\",\"at_step\":%" PRId64 ",\"seconds\":%.6g}",
             phase_name, step, t->job.fault.stall_seconds);
    NsaError err;
    if (emitEvent(t, "stall", detail, &err) != 0) logError("heartbeat: %s", err.message);
}

/* Sleeps inside `phase` when the config's fault section asks for a stall
 * there at this step (the watchdog's test); once per run, interruptible by
 * stop_now and by an abort of comm (a rank's transport, may be NULL). The
 * step's phases run on the ranks' threads: there only fault.rank stalls. A
 * `stall` event goes out first (its heartbeat line carries the phase the
 * trainer is in), so that the stall is on record without anyone having to
 * catch the trainer in the act. */
static void maybeStall(Trainer *t, TrainPhase phase, int64_t step, NsaComm *comm) {
    const FaultConfig *f = &t->job.fault;
    if (t->stall_fired || f->stall_at_step <= 0 || f->stall_at_step != step) return;
    if (trainPhaseFromName(f->stall_phase) != (int)phase) return;
    t->stall_fired = 1;
    logWarn("fault: stalling %.1f s in phase %s at step %" PRId64 " (fault.stall_at_step)",
            f->stall_seconds, f->stall_phase, step);
    emitStall(t, trainPhaseName(phase), step);
    double until = clockMonotonicSeconds() + f->stall_seconds;
    while (clockMonotonicSeconds() < until && !atomic_load(&t->mon->stop_now) &&
           !nsaCommAborted(comm, NULL, 0)) {
        struct timespec slice = {0, 20 * 1000 * 1000};
        nanosleep(&slice, NULL);
    }
}

/* A phase of this (the controller) thread: data, checkpoint, eval. */
static void enter(Trainer *t, TrainPhase phase, int64_t step) {
    trainMonitorEnter(t->mon, phase);
    maybeStall(t, phase, step, NULL);
}

/* A phase of a rank's step. Local rank 0 stands for the job in the
 * monitor's main phase (the watchdog's deadlines); every rank has its own
 * slot for the dumps. */
static void enterOnRank(Trainer *t, const RankCtx *rc, TrainPhase phase, int64_t step) {
    trainMonitorRankEnter(t->mon, rc->local, phase);
    if (rc->local == 0) trainMonitorEnter(t->mon, phase);
    if (rc->rank == t->job.fault.rank) maybeStall(t, phase, step, rc->comm);
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
    return 0;
}

/* Tokens of one batch (batch_size x seq_len). */
static size_t batchTokens(const Trainer *t) {
    return (size_t)t->job.train.batch_size * (size_t)t->job.train.seq_len;
}

/* Where local rank r's micro-batch a lives in t->tokens / t->targets. */
static size_t batchAt(const Trainer *t, int r, int a) {
    return ((size_t)r * (size_t)t->job.train.accumulate_grad_batches + (size_t)a) * batchTokens(t);
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
    if (t->world > 1) {
        size_t used = strlen(line);
        snprintf(line + used, sizeof line - used, "; %d ranks", t->world);
    }
    trainMonitorSetDevice(t->mon, line);
}

int trainerResolveGpus(const RuntimeConfig *rt, int visible, int *ordinals, NsaError *err) {
    if (rt->n_gpu_list > 0) {
        for (int i = 0; i < rt->n_gpu_list; i++) {
            if (rt->gpu_list[i] >= visible)
                return nsaErrorf(err, "runtime.gpus: GPU %d is not here; allowed: ordinals 0 to %d "
                                 "(%d CUDA device%s)", rt->gpu_list[i], visible - 1, visible,
                                 visible == 1 ? "" : "s");
            ordinals[i] = rt->gpu_list[i];
        }
        return rt->n_gpu_list;
    }
    const int n = rt->gpus > 0 ? rt->gpus : visible;
    if (n > visible)
        return nsaErrorf(err, "runtime.gpus: %d, but this machine has %d CUDA device%s; allowed: 1 to %d, "
                         "a list of ordinals, or all", n, visible, visible == 1 ? "" : "s", visible);
    if (n > TRAIN_MAX_RANKS)
        return nsaErrorf(err, "runtime.gpus: %d GPUs; allowed: up to %d per nsad", n, TRAIN_MAX_RANKS);
    for (int i = 0; i < n; i++) ordinals[i] = i;
    return n;
}

/* The GPUs runtime.gpus names, checked against the devices there are:
 * fills ordinals and returns how many, or -1 with err. */
static int resolveGpus(const RuntimeConfig *rt, int *ordinals, NsaError *err) {
    NsaDeviceInfo info;
    if (nsaDeviceProbe(&info, err) != 0) return -1;
    if (info.cuda_devices < 1)
        return nsaErrorf(err, "runtime.device: cuda, but there is no CUDA device (%s)", info.description);
    return trainerResolveGpus(rt, info.cuda_devices, ordinals, err);
}

/* A dispatch to the ranks failed (ranks.h): every thread's stack and each
 * rank's phase into a dump file in the run's directory, as the watchdog
 * writes for a hang. */
static void dumpRankFailure(void *ctx, const char *why) {
    Trainer *t = ctx;
    char ranks[1400], header[2400], path[4200];
    trainMonitorDescribeRanks(t->mon, clockMonotonicNs(), ranks, sizeof ranks);
    snprintf(header, sizeof header, "nsad rank failure dump\nstep: %" PRId64 "\nerror: %s\n%s\n",
             atomic_load(&t->mon->step) + 1, why, ranks);
    char *stacks = stackdumpString("a rank of the job failed");
    NsaError e;
    if (watchdogWriteDump(t->out_dir, "rankfail", header, stacks ? stacks : "(no stacks)\n", path,
                          sizeof path, &e) == 0)
        logError("a rank failed (%s); stacks in %s", why, path);
    else
        logError("a rank failed (%s); no stack dump: %s", why, e.message);
    free(stacks);
}

int trainerLocalRanks(const JobConfig *cfg, int *ordinals, NsaError *err) {
    if (cfg->runtime.device == NSA_DEVICE_CUDA) return resolveGpus(&cfg->runtime, ordinals, err);
    return cfg->runtime.cpu_ranks;
}

/* Multi-node, on the coordinator: every node in runtime.nodes says how many
 * ranks it brings, the job's ranks are laid out (this node's first, then
 * each node's in the list's order), and each node is told its part and the
 * transport's id (NCCL's unique id, or the TCP transport's address as that
 * node reaches us and its key). The ranks then join in rankGroupCreate. */
static int coordinate(Trainer *t, RankGroupConfig *rc, int resume, const TrainOptions *opt,
                      NsaError *err) {
    const RuntimeConfig *rt = &t->job.runtime;
    if (!opt->run_id)
        return nsaErrorf(err, "runtime.nodes: a multi-node job runs under nsad serve (the other nodes "
                              "join through its API); `nsad train` takes one node");
    int locals[CONFIG_MAX_NODES];
    char ips[CONFIG_MAX_NODES][64];
    char *yaml = configToYaml(&t->job);
    if (!yaml) return nsaErrorf(err, "out of memory");
    int world = rc->local;
    for (int k = 0; k < rt->n_nodes; k++) {
        ips[k][0] = '\0';
        if (peerPrepare(rt->nodes[k], opt->peer_token, yaml, &locals[k], ips[k], sizeof ips[k], err)) {
            free(yaml);
            return -1;
        }
        world += locals[k];
    }
    NsaCommId id;
    const int rc_id = rt->device == NSA_DEVICE_CUDA ? nsaCommNcclUniqueId(&id, err)
                                                    : nsaCommTcpUniqueId("", &id, err);
    if (rc_id) {
        free(yaml);
        return -1;
    }
    int first = rc->local;
    for (int k = 0; k < rt->n_nodes; k++) {
        PeerStart ps = {yaml, opt->run_id, first, world, id, resume};
        if (rt->device != NSA_DEVICE_CUDA &&
            nsaCommTcpIdSetHost(&ps.comm_id, ips[k][0] ? ips[k] : "127.0.0.1", err)) {
            free(yaml);
            nsaCommTcpIdRelease(&id);
            return -1;
        }
        char member[96];
        if (peerStart(rt->nodes[k], opt->peer_token, &ps, member, sizeof member, err)) {
            free(yaml);
            nsaCommTcpIdRelease(&id);
            return -1;
        }
        logInfo("multi-node: %s takes ranks %d to %d (its run %s)", rt->nodes[k], first,
                first + locals[k] - 1, member);
        first += locals[k];
    }
    free(yaml);
    rc->world = world;
    rc->have_comm_id = 1;
    rc->comm_id = id;
    logInfo("multi-node: %d ranks on %d nodes; this node has ranks 0 to %d", world, rt->n_nodes + 1,
            rc->local - 1);
    return 0;
}

/* The job's ranks on this node (each its model) and the step's batch
 * buffers, for the ranks rc lays out. */
static int startRanks(Trainer *t, RankGroupConfig *rc, NsaError *err) {
    const RuntimeConfig *rt = &t->job.runtime;
    t->multi_node = rc->world > rc->local;
    const FaultConfig *f = &t->job.fault;
    const int faults = f->nan_at_step > 0 || f->stall_at_step > 0 || f->exit_at_step > 0;
    if (faults && f->rank >= rc->world)
        return nsaErrorf(err, "fault.rank: %d, but the job has %d rank%s; allowed: 0 to %d", f->rank,
                         rc->world, rc->world == 1 ? "" : "s", rc->world - 1);
    if (f->exit_at_step > 0 && rc->world < 2)
        return nsaErrorf(err, "fault.exit_at_step: %lld with one rank; allowed: 0, or a job of 2 or "
                         "more ranks (runtime.gpus, runtime.cpu_ranks)", (long long)f->exit_at_step);
    t->local = rc->local;
    t->world = rc->world;
    t->first = rc->first;
    memcpy(t->ordinals, rc->ordinals, sizeof t->ordinals);
    const size_t step_tokens = (size_t)t->local * (size_t)t->job.train.accumulate_grad_batches *
                               batchTokens(t);
    t->tokens = malloc(step_tokens * sizeof(int32_t));
    t->targets = malloc(step_tokens * sizeof(int32_t));
    t->scratch = calloc((size_t)t->local, sizeof(float *));
    t->xbuf = calloc((size_t)t->local, sizeof(*t->xbuf));
    t->world_status = calloc((size_t)t->world, sizeof(*t->world_status));
    if (!t->tokens || !t->targets || !t->scratch || !t->xbuf || !t->world_status)
        return nsaErrorf(err, "out of memory for a step's batches (%zu tokens)", step_tokens);
    for (int r = 0; r < t->local; r++)
        if (!(t->xbuf[r] = calloc((size_t)t->world, sizeof(RankSlot))))
            return nsaErrorf(err, "out of memory for the ranks' exchange (%d ranks)", t->world);
    if (t->world > 1)
        logInfo("data parallel: %d ranks (%s), %d x %d x %d tokens per rank and step", t->world,
                rt->device == NSA_DEVICE_CUDA ? "NCCL, one GPU each" : "CPU engine, in-process",
                t->job.train.batch_size, t->job.train.seq_len, t->job.train.accumulate_grad_batches);
    t->ranks = rankGroupCreate(rc, err);
    return t->ranks ? 0 : -1;
}

/* The job's ranks on this node (each its model), the step's batch buffers
 * and the checkpoint scratch. */
static int createRanks(Trainer *t, const TrainOptions *opt, int resume, NsaError *err) {
    const RuntimeConfig *rt = &t->job.runtime;
    RankGroupConfig rc;
    memset(&rc, 0, sizeof rc);
    rc.model = t->job.model;
    rc.engine = (NsaEngineOptions){
        .device = rt->device,
        .precision = rt->precision,
        .max_batch = t->job.train.batch_size,
        .max_seq_len = t->job.train.seq_len,
        .threads = rt->threads,
        .recompute = rt->device == NSA_DEVICE_CUDA ? rt->gradient_checkpointing : NSA_RECOMPUTE_NONE,
    };
    rc.local = trainerLocalRanks(&t->job, rc.ordinals, err);
    if (rc.local < 0) return -1;
    rc.first = 0;
    rc.world = rc.local;
    if (t->join) { /* a member: the coordinator laid the job out */
        rc.first = t->join->first;
        rc.world = t->join->world;
        rc.have_comm_id = 1;
        rc.comm_id = t->join->comm_id;
        if (rc.first < 1 || rc.first + rc.local > rc.world)
            return nsaErrorf(err, "join: ranks %d to %d of a job of %d do not fit; allowed: ranks "
                                  "after the coordinator's, within the job",
                             rc.first, rc.first + rc.local - 1, rc.world);
    } else if (rt->n_nodes > 0 && coordinate(t, &rc, resume, opt, err)) {
        return -1;
    }
    rc.timeout = t->job.watchdog.allreduce;
    rc.mon = t->mon;
    if (opt->run_id) snprintf(rc.run_id, sizeof rc.run_id, "%s", opt->run_id);
    rc.on_failure = dumpRankFailure;
    rc.failure_ctx = t;
    const int started = startRanks(t, &rc, err);
    /* the coordinator's TCP listening socket: rank 0 has joined or never
     * will (a no-op for NCCL ids, single-node jobs and members' copies) */
    nsaCommTcpIdRelease(&rc.comm_id);
    if (started) return -1;
    t->model = rankGroupModel(t->ranks, 0);
    size_t largest = 1;
    for (int i = 0; i < nsaModelNumTensors(t->model); i++)
        if (nsaModelTensorInfo(t->model, i)->numel > largest) largest = nsaModelTensorInfo(t->model, i)->numel;
    for (int r = 0; r < t->local; r++)
        if (!(t->scratch[r] = malloc(largest * sizeof(float))))
            return nsaErrorf(err, "out of memory for the checkpoint scratch (%zu floats)", largest);
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

/* ---- what the ranks exchange ---------------------------------------------------- */

/* Each local rank's contribution to an exchange. */
typedef struct ExchangeWork {
    Trainer *t;
    RankSlot mine[TRAIN_MAX_RANKS];
} ExchangeWork;

static int exchangeOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    ExchangeWork *w = arg;
    RankSlot *buf = w->t->xbuf[rc->local];
    buf[rc->rank] = w->mine[rc->local];
    return nsaModelExchange(rc->model, buf, sizeof(RankSlot), err);
}

/* Every rank's slot of the job: w->mine filled per local rank in, the
 * job's slots (world of them) back. A collective of every rank of every
 * node: all call it at the same points. */
static const RankSlot *exchangeSlots(Trainer *t, ExchangeWork *w, NsaError *err) {
    w->t = t;
    if (rankGroupRun(t->ranks, exchangeOnRank, w, err) != 0) return NULL;
    return t->xbuf[0];
}

/* Rank 0's resume state to every node (after a checkpoint load: members
 * have no files, only the broadcast tensors). */
static int shareState(Trainer *t, NsaError *err) {
    if (!t->multi_node) return 0;
    ExchangeWork *w = workArea(t, sizeof *w, err);
    if (!w) return -1;
    for (int r = 0; r < t->local; r++) w->mine[r].state = t->state;
    const RankSlot *all = exchangeSlots(t, w, err);
    if (all) {
        t->state = all[0].state;
        t->state.ranks = t->world;
    }
    return all ? 0 : -1;
}

/* ---- checkpoints through the ranks ------------------------------------------- */

/* What a rank does for one tensor of a checkpoint. */
typedef struct TensorWork {
    Trainer *t;
    NsaArena arena;
    int i;
    float *rank0;  /* local rank 0's buffer: the caller's dst / src */
} TensorWork;

static float *tensorBuffer(const TensorWork *w, const RankCtx *rc) {
    return rc->local == 0 ? w->rank0 : w->t->scratch[rc->local];
}

static int gatherOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    TensorWork *w = arg;
    trainMonitorRankEnter(w->t->mon, rc->local, PHASE_CHECKPOINT);
    return nsaModelGatherTensor(rc->model, w->arena, w->i, tensorBuffer(w, rc), err);
}

static int broadcastOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    TensorWork *w = arg;
    trainMonitorRankEnter(w->t->mon, rc->local, PHASE_CHECKPOINT);
    return nsaModelBroadcastTensor(rc->model, w->arena, w->i, tensorBuffer(w, rc), 0, err);
}

/* Runs fn for tensor i of arena on the ranks (on local rank 0 alone when
 * only_rank0), local rank 0 working in t->scratch[0]. */
static int tensorOnRanks(Trainer *t, RankFn fn, NsaArena arena, int i, int only_rank0,
                         NsaError *err) {
    TensorWork *w = workArea(t, sizeof *w, err);
    if (!w) return -1;
    *w = (TensorWork){t, arena, i, t->scratch[0]};
    return only_rank0 ? rankGroupRunOne(t->ranks, 0, fn, w, err) : rankGroupRun(t->ranks, fn, w, err);
}

static const NsaTensorInfo *ranksInfo(void *ctx, int i) {
    return nsaModelTensorInfo(((Trainer *)ctx)->model, i);
}

/* The whole tensor: the weights from rank 0 (every rank has them), the
 * moments gathered from their holders (a collective of every rank). */
static int ranksGet(void *ctx, NsaArena arena, int i, float *dst, NsaError *err) {
    Trainer *t = ctx;
    /* into the trainer's scratch, then dst: a rank given up on mid-gather
     * must not write into the caller's buffer after it is gone */
    if (tensorOnRanks(t, gatherOnRank, arena, i, arena == NSA_ARENA_PARAMS, err) != 0) return -1;
    if (dst != t->scratch[0])
        memcpy(dst, t->scratch[0], nsaModelTensorInfo(t->model, i)->numel * sizeof(float));
    return 0;
}

/* Job-wide rank 0's copy goes to every rank (each keeps its moments' range). */
static int ranksSet(void *ctx, NsaArena arena, int i, const float *src, NsaError *err) {
    Trainer *t = ctx;
    const size_t n = nsaModelTensorInfo(t->model, i)->numel;
    memcpy(t->scratch[0], src, n * sizeof(float)); /* the broadcast writes into its buffer */
    return tensorOnRanks(t, broadcastOnRank, arena, i, 0, err);
}

static CheckpointTensors ranksTensors(Trainer *t) {
    CheckpointTensors c = {t, nsaModelNumTensors(t->model), ranksInfo, ranksGet, ranksSet};
    return c;
}

typedef struct InitWork {
    Trainer *t;
    uint64_t seed;
} InitWork;

static int initOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    const InitWork *w = arg;
    return nsaModelInit(rc->model, w->seed, err);
}

/* Reads a checkpoint into every rank: its resume state first (a checkpoint
 * of another run is refused before any tensor moves), then the tensors.
 * Logs a change of rank count. */
static int loadCheckpoint(Trainer *t, const char *dir, ResumeState *st, NsaError *err) {
    if (checkpointReadState(dir, st, err) != 0) return -1;
    if (st->config_hash != t->config_hash)
        return nsaErrorf(err, "resume: %s was written by a run whose config hashes to %016" PRIx64
                         "; this config hashes to %016" PRIx64
                         " (model, nsa, data, seed or batch shape differ)",
                         dir, st->config_hash, t->config_hash);
    const CheckpointTensors dst = ranksTensors(t);
    if (checkpointLoadTensors(&dst, dir, st, err) != 0) return -1;
    if (st->legacy)
        logWarn("resume: %s has format %s (before manifests): loaded unverified, no sizes or checksums "
                "to check it against; the next checkpoint is written as %s", dir, CHECKPOINT_FORMAT_LEGACY,
                CHECKPOINT_FORMAT);
    if (st->ranks != t->world)
        logNotice("resume: %s was written by a job of %d rank%s; this job has %d: the data goes on "
                  "from batch %" PRIu64 " (batches of %d sequences), and a step now takes %d x %d of "
                  "them instead of %d x %d", dir, st->ranks, st->ranks == 1 ? "" : "s", t->world,
                  st->data_position, t->job.train.batch_size, t->world,
                  t->job.train.accumulate_grad_batches, st->ranks, t->job.train.accumulate_grad_batches);
    return 0;
}

/* A member's side of a checkpoint the coordinator writes: the same
 * gathers of the moments (params need no collective), nothing written. */
static int joinSave(Trainer *t, NsaError *err) {
    for (NsaArena a = NSA_ARENA_ADAM_M; a <= NSA_ARENA_ADAM_V; a++)
        for (int i = 0; i < nsaModelNumTensors(t->model); i++)
            if (tensorOnRanks(t, gatherOnRank, a, i, 0, err) != 0) return -1;
    return 0;
}

/* A member's side of a checkpoint load: the broadcasts of every tensor
 * from rank 0 (params, adam_m, adam_v; checkpointLoadTensors's order),
 * then rank 0's resume state. */
static int joinLoad(Trainer *t, NsaError *err) {
    const NsaArena arenas[3] = {NSA_ARENA_PARAMS, NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < nsaModelNumTensors(t->model); i++)
            if (tensorOnRanks(t, broadcastOnRank, arenas[a], i, 0, err) != 0) return -1;
    return shareState(t, err);
}

/* A fresh start from train.init_from (fine-tuning, continued training):
 * every rank initialised from the seed (the Adam moments zero), then each
 * weight read by the job's rank 0 from the checkpoint and broadcast to
 * every rank; a member node takes part in the broadcasts without the
 * files. The step, the data position and the tokens seen start at zero. */
/* Every rank's model from the job's seed. */
static int initFromSeed(Trainer *t, NsaError *err) {
    InitWork *w = workArea(t, sizeof *w, err);
    if (!w) return -1;
    *w = (InitWork){t, t->job.train.seed};
    return rankGroupRun(t->ranks, initOnRank, w, err);
}

static int initFromCheckpoint(Trainer *t, NsaError *err) {
    if (initFromSeed(t, err) != 0) return -1;
    const int n = nsaModelNumTensors(t->model);
    if (t->join) { /* a member node: the coordinator reads the checkpoint */
        for (int i = 0; i < n; i++)
            if (tensorOnRanks(t, broadcastOnRank, NSA_ARENA_PARAMS, i, 0, err) != 0) return -1;
        logNotice("init: the weights of the coordinator's %s", t->job.train.init_from);
        return 0;
    }
    Weights *src = malloc(sizeof *src);
    if (!src) return nsaErrorf(err, "out of memory");
    char notes[512];
    NsaError werr;
    int rc = weightsOpen(t->job.train.init_from, src, &werr);
    if (rc == 0 && (rc = weightsFitJob(src, &t->job, notes, sizeof notes, &werr)) == 0 &&
        weightsNumTensors(src) != n)
        rc = nsaErrorf(&werr, "%s has %d tensors; this model has %d", src->dir,
                       weightsNumTensors(src), n);
    if (rc) nsaErrorf(err, "train.init_from: %s", werr.message);
    for (int i = 0; rc == 0 && i < n; i++)
        if (weightsTensor(src, i, NULL, t->scratch[0], err) ||
            tensorOnRanks(t, broadcastOnRank, NSA_ARENA_PARAMS, i, 0, err))
            rc = -1;
    if (rc == 0) {
        logNotice("init: the weights of %s (step %" PRId64 " of its run, %" PRId64
                  " tokens seen); the Adam moments, the step and the data start at zero",
                  src->dir, src->state.step, src->state.tokens_seen);
        if (notes[0]) logNotice("init: this job changes what shapes no weight: %s", notes);
    }
    weightsClose(src); /* safe after a failed weightsOpen: it holds nothing */
    free(src);
    return rc;
}

/* Loads the checkpoint dir (from checkpointResolve; "" for a fresh start,
 * NULL for a member of a job that resumes), or initialises from
 * train.init_from's weights or from the seed. */
static int restoreOrInit(Trainer *t, const char *dir, NsaError *err) {
    memset(&t->state, 0, sizeof t->state);
    t->state.seed = t->job.train.seed;
    t->state.config_hash = t->config_hash;
    t->state.ranks = t->world;
    if (!dir) {
        if (joinLoad(t, err) != 0) return -1;
        logNotice("resume: step %" PRId64 " from the coordinator's checkpoint (data position %" PRIu64
                  ")", t->state.step, t->state.data_position);
        return 0;
    }
    if (dir[0]) {
        ResumeState st;
        if (loadCheckpoint(t, dir, &st, err) != 0) return -1;
        t->state = st;
        t->state.ranks = t->world;
        if (shareState(t, err) != 0) return -1;
        logNotice("resume: step %" PRId64 " from %s (data position %" PRIu64 ")", st.step, dir,
                  st.data_position);
        return 0;
    }
    if (t->job.train.init_from[0]) return initFromCheckpoint(t, err);
    return initFromSeed(t, err);
}

/* ---- the step ----------------------------------------------------------- */

/* One step on one rank: its micro-batches (read by the controller into
 * t->tokens), the reducing last backward, the optimizer step, its figures. */
typedef struct StepWork {
    Trainer *t;
    int64_t step;
    double lr;
    NsaStepStats stats[TRAIN_MAX_RANKS];
} StepWork;

static int stepOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    StepWork *w = arg;
    Trainer *t = w->t;
    const TrainConfig *tc = &t->job.train;
    const FaultConfig *f = &t->job.fault;
    const int accum = tc->accumulate_grad_batches, at_fault_rank = rc->rank == f->rank;
    const double t0 = clockMonotonicSeconds();
    if (at_fault_rank && !t->exit_fired && f->exit_at_step == w->step) {
        t->exit_fired = 1;
        logWarn("fault: rank %d stops answering at step %" PRId64 " (fault.exit_at_step)", rc->rank,
                w->step);
        return RANK_STOPPED;
    }
    if (nsaModelZeroGrad(rc->model, err) != 0) return -1;
    for (int micro = 0; micro < accum; micro++) {
        if (micro == 0 && at_fault_rank && !t->fault_fired && f->nan_at_step == w->step &&
            f->nan_kind != FAULT_NONE) {
            NsaFault kind = f->nan_kind == FAULT_NAN_GRAD ? NSA_FAULT_NAN_GRAD : NSA_FAULT_NAN_LOSS;
            logWarn("fault: injecting NaN %s at step %" PRId64 " on rank %d (fault.nan_at_step)",
                    kind == NSA_FAULT_NAN_GRAD ? "gradient" : "loss", w->step, rc->rank);
            if (nsaModelInjectFault(rc->model, kind, err) != 0) return -1;
            t->fault_fired = 1;
        }
        const size_t at = batchAt(t, rc->local, micro);
        enterOnRank(t, rc, PHASE_FORWARD, w->step);
        if (nsaModelForward(rc->model, t->tokens + at, t->targets + at, tc->batch_size, tc->seq_len,
                            1.0f / (float)accum, err) != 0)
            return -1;
        const int last = micro + 1 == accum;
        enterOnRank(t, rc, PHASE_BACKWARD, w->step);
        /* a rank that sleeps in a collective: its first one is the last
         * backward's first reduce-scatter */
        if (last && at_fault_rank && rc->comm && !t->stall_fired && f->stall_at_step == w->step &&
            !strcmp(f->stall_phase, "allreduce")) {
            t->stall_fired = 1;
            logWarn("fault: rank %d sleeps %.1f s in its next collective at step %" PRId64
                    " (fault.stall_phase allreduce)", rc->rank, f->stall_seconds, w->step);
            emitStall(t, "allreduce", w->step);
            nsaCommInjectStall(rc->comm, f->stall_seconds);
        }
        if ((last ? nsaModelBackwardReduce(rc->model, err) : nsaModelBackward(rc->model, err)) != 0)
            return -1;
    }
    enterOnRank(t, rc, rc->world > 1 ? PHASE_ALLREDUCE : PHASE_OPTIMIZER, w->step);
    NsaOptimConfig oc = {
        .lr = (float)w->lr,
        .beta1 = (float)tc->beta1,
        .beta2 = (float)tc->beta2,
        .eps = (float)tc->eps,
        .weight_decay = (float)tc->weight_decay,
        .grad_clip = (float)tc->grad_clip,
    };
    if (nsaModelOptimizerStep(rc->model, &oc, w->step, err) != 0 ||
        nsaModelStepStats(rc->model, &w->stats[rc->local], err) != 0 ||
        nsaModelCommStats(rc->model, &t->rank_comm[rc->local], err) != 0)
        return -1;
    t->rank_seconds[rc->local] = clockMonotonicSeconds() - t0;
    return 0;
}

static int runStep(Trainer *t, int64_t step, double lr, NsaStepStats *stats, NsaError *err) {
    const int accum = t->job.train.accumulate_grad_batches;
    /* every local rank's micro-batches: rank r's a-th is batch
     * P + a * world + r of the data (consecutive positions: the prefetch
     * keeps up) */
    enter(t, PHASE_DATA, step);
    const uint64_t base = t->state.data_position;
    for (int a = 0; a < accum; a++)
        for (int r = 0; r < t->local; r++) {
            const uint64_t position = base + (uint64_t)a * (uint64_t)t->world + (uint64_t)(t->first + r);
            const size_t at = batchAt(t, r, a);
            if (dataBatch(t->train_data, position, t->tokens + at, t->targets + at, err) != 0) return -1;
        }
    StepWork *w = workArea(t, sizeof *w, err);
    if (!w) return -1;
    *w = (StepWork){.t = t, .step = step, .lr = lr};
    int rc = rankGroupRun(t->ranks, stepOnRank, w, err);
    if (rc == 0) {
        *stats = w->stats[0];
        /* the ranks decide together: the same loss, norm and NaN-guard
         * decision everywhere, or something is broken */
        for (int r = 1; r < t->local && rc == 0; r++)
            if (w->stats[r].applied != stats->applied ||
                memcmp(&w->stats[r].loss, &stats->loss, sizeof stats->loss) ||
                memcmp(&w->stats[r].grad_norm, &stats->grad_norm, sizeof stats->grad_norm))
                rc = nsaErrorf(err, "step %" PRId64 ": rank %d disagrees with rank %d (loss %.17g vs "
                               "%.17g, applied %d vs %d): the ranks' weights are no longer the same",
                               step, t->first + r, t->first, w->stats[r].loss, stats->loss,
                               w->stats[r].applied, stats->applied);
    }
    if (rc != 0) return -1;
    t->state.data_position += (uint64_t)accum * (uint64_t)t->world;
    t->state.tokens_seen += (int64_t)(batchTokens(t) * (size_t)accum * (size_t)t->world);
    return 0;
}

/* ---- evaluation, logging, checkpoints ------------------------------------ */

/* The evaluation's samples (daemon/trainsamples.c): samples.jsonl and a
 * `samples` event. A sampling failure is logged and the run goes on: the
 * samples are a view of the model, not part of its training. */
typedef struct SampleWork {
    Trainer *t;
    int64_t step;
    char *detail;
} SampleWork;

/* On rank 0's thread: its device holds the decoder and the weights. */
static int sampleOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    SampleWork *w = arg;
    return trainSamplesRun(w->t->samples, rc->model, w->step, &w->detail, err);
}

static int createSamplesOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    Trainer *t = arg;
    const char *no_samples = NULL;
    t->samples = trainSamplesCreate(&t->job, &no_samples, err);
    if (!t->samples && no_samples) logInfo("samples: none (%s)", no_samples);
    else if (!t->samples) logWarn("samples: none: %s", err->message);
    return 0;
}

static int sampleAtEval(Trainer *t, int64_t step, NsaError *err) {
    if (!t->samples) return 0;
    char *detail = NULL;
    NsaError e;
    SampleWork *w = workArea(t, sizeof *w, &e);
    int rc_run = -1;
    if (w) {
        *w = (SampleWork){t, step, NULL};
        rc_run = rankGroupRunOne(t->ranks, 0, sampleOnRank, w, &e);
        if (rc_run == 0) detail = w->detail; /* else a worker given up on may still set it */
    }
    if (rc_run != 0 ||
        trainSamplesAppend(t->out_dir, detail, clockUnixSeconds(), &e) != 0) {
        logWarn("samples at step %" PRId64 ": %s", step, e.message);
        free(detail);
        return 0;
    }
    int rc = emitEvent(t, "samples", detail, err);
    free(detail);
    return rc;
}

/* Evaluation shared by the ranks: rank r takes the held-out batches
 * i = r, r + world, ... (the same batches every time, so the curve
 * compares) and sums their losses; the sums are exchanged and added in
 * rank order (one rank: the plain sum in batch order). */
typedef struct EvalWork {
    Trainer *t;
    ExchangeWork x;  /* the sums, exchanged */
} EvalWork;

static int evalOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    EvalWork *w = arg;
    Trainer *t = w->t;
    const TrainConfig *tc = &t->job.train;
    int32_t *tokens = t->tokens + batchAt(t, rc->local, 0), *targets = t->targets + batchAt(t, rc->local, 0);
    trainMonitorRankEnter(t->mon, rc->local, PHASE_EVAL);
    double sum = 0.0;
    for (int64_t i = rc->rank; i < tc->eval_batches; i += rc->world) {
        pthread_mutex_lock(&t->data_lock); /* one loader for every rank here */
        int rc_data = dataBatch(t->val_data, (uint64_t)i, tokens, targets, err);
        pthread_mutex_unlock(&t->data_lock);
        if (rc_data != 0) return -1;
        double loss;
        if (nsaModelEvalLoss(rc->model, tokens, targets, tc->batch_size, tc->seq_len, &loss, err) != 0)
            return -1;
        sum += loss;
    }
    w->x.mine[rc->local].eval_sum = sum;
    return 0;
}

static int evaluate(Trainer *t, NsaError *err) {
    const TrainConfig *tc = &t->job.train;
    int64_t step = t->state.step;
    enter(t, PHASE_EVAL, step);
    EvalWork *w = workArea(t, sizeof *w, err);
    if (!w) return -1;
    w->t = t;
    const RankSlot *all = rankGroupRun(t->ranks, evalOnRank, w, err) == 0 ? exchangeSlots(t, &w->x, err)
                                                                          : NULL;
    double total = 0.0;
    for (int r = 0; all && r < t->world; r++) total += all[r].eval_sum;
    if (!all) return -1;
    double val = total / (double)tc->eval_batches;
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
    const TrainStepLog *held = t->has_held_step && t->held_step.step == step ? &t->held_step : NULL;
    if (t->hooks && t->hooks->on_eval) t->hooks->on_eval(t->hooks->ctx, held, step, val, bpb);
    t->has_held_step = 0;
    /* once: the progress line on stdout (`nsad train`, where stdout and the
     * log usually share a terminal), else the log */
    if (!t->quiet) {
        printf("eval  %6" PRId64 " | val_loss %.4f | %.4f bits/byte\n", step, val, bpb);
        fflush(stdout);
    } else {
        logInfo("eval: step %" PRId64 " val_loss %.4f (%.4f bits/byte)", step, val, bpb);
    }
    return sampleAtEval(t, step, err);
}

static int saveCheckpoint(Trainer *t, NsaError *err) {
    enter(t, PHASE_CHECKPOINT, t->state.step);
    double t0 = clockMonotonicSeconds();
    if (t->join) { /* the coordinator writes the job's checkpoint */
        if (joinSave(t, err) != 0) return -1;
        t->last_saved_step = t->state.step;
        logInfo("checkpoint: step %" PRId64 " written by the coordinator (%.2f s)", t->state.step,
                clockMonotonicSeconds() - t0);
        return 0;
    }
    const CheckpointTensors src = ranksTensors(t);
    if (checkpointSaveTensors(&src, t->out_dir, &t->state, t->job.train.keep_last,
                              t->model_config_json, t->last_checkpoint, sizeof t->last_checkpoint,
                              err) != 0)
        return -1;
    t->last_saved_step = t->state.step;
    double secs = clockMonotonicSeconds() - t0;
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

/* Local rank r's last step, as the run object and the exchange show it. */
static TrainRankStatus localStatus(const Trainer *t, int r) {
    const NsaCommStats *cs = &t->rank_comm[r];
    TrainRankStatus st = {
        .rank = t->first + r,
        .device = t->job.runtime.device == NSA_DEVICE_CUDA ? t->ordinals[r] : -1,
        .step_seconds = t->rank_seconds[r],
        .comm_seconds = cs->reduce_seconds,
        .exposed_seconds = cs->exposed_seconds,
        .overlap = cs->overlap,
        .gather_seconds = cs->gather_seconds,
    };
    return st;
}

/* Hands a held step log to on_step after all (its evaluation failed). */
static void releaseHeldStep(Trainer *t) {
    if (t->has_held_step && t->hooks && t->hooks->on_step)
        t->hooks->on_step(t->hooks->ctx, &t->held_step);
    t->has_held_step = 0;
}

/* Logs the step to training.csv and the console; its TrainStepLog goes to
 * on_step now, or - hold: the step is evaluated next - to on_eval with
 * the evaluation. toks_per_s counts the steps' own time: evaluations and
 * checkpoints in between would otherwise show up as a throughput drop.
 * Returns -1 with err set when the CSV write fails. */
static int logStep(Trainer *t, const NsaStepStats *stats, double lr, double step_seconds, int hold,
                   NsaError *err) {
    double now = clockMonotonicSeconds();
    double span = t->log_step_seconds;
    int64_t tokens = t->state.tokens_seen - t->log_tokens0;
    TrainStepLog s = {
        .step = t->state.step,
        .total_steps = t->job.train.steps,
        .ts = clockUnixSeconds(),
        .loss = stats->loss,
        .lr = lr,
        .grad_norm = stats->grad_norm,
        .toks_per_s = span > 0 ? (double)tokens / span : 0,
        .step_seconds = step_seconds,
        .tokens_seen = t->state.tokens_seen,
        .mem_bytes = memoryInUse(t),
        .world = t->world,
        .n_ranks = t->local,
    };
    for (int r = 0; r < t->local; r++) s.ranks[r] = localStatus(t, r);
    if (t->multi_node) { /* every rank of the job, as the last exchange told */
        s.n_ranks = t->world < TRAIN_MAX_RANKS ? t->world : TRAIN_MAX_RANKS;
        memcpy(s.ranks, t->world_status, (size_t)s.n_ranks * sizeof s.ranks[0]);
    }
    atomic_store(&t->mon->memory_bytes, (int64_t)s.mem_bytes);
    atomic_store(&t->mon->memory_step, s.step);
    t->log_step_seconds = 0;
    t->log_tokens0 = t->state.tokens_seen;
    const char *phase = t->state.step <= t->job.train.warmup_steps ? "warmup" : "train";
    if (artifactsLogStep(t->art, &s, phase, err) != 0) return -1;
    if (hold) {
        t->held_step = s;
        t->has_held_step = 1;
    } else if (t->hooks && t->hooks->on_step) {
        t->hooks->on_step(t->hooks->ctx, &s);
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
    char dir[4096] = "", skipped[1024] = "";
    int found = t->join ? 0 : checkpointResolveValid(t->out_dir, dir, sizeof dir, skipped, sizeof skipped, err);
    if (found < 0 && !t->multi_node) return -1;
    if (found > 0 && skipped[0]) logWarn("rollback: skipping damaged checkpoints (%s); rolling back to %s", skipped, dir);
    if (t->multi_node) { /* the coordinator's checkpoints decide for every node */
        ExchangeWork *w = workArea(t, sizeof *w, err);
        if (!w) return -1;
        for (int r = 0; r < t->local; r++) w->mine[r].found = found;
        const RankSlot *all = exchangeSlots(t, w, err);
        found = all ? all[0].found : -1;
        if (!all) return -1;
        if (found < 0) return nsaErrorf(err, "rollback: the coordinator could not read its checkpoints");
    }
    if (found <= 0) return 1;
    int anomalies = t->state.anomalies;
    int64_t from = t->state.step;
    ResumeState st;
    if (t->join) {
        if (joinLoad(t, err) != 0) return -1;
        st = t->state;
        snprintf(dir, sizeof dir, "the coordinator's checkpoint");
    } else {
        if (loadCheckpoint(t, dir, &st, err) != 0) return -1;
        t->state = st;
        if (shareState(t, err) != 0) return -1;
    }
    t->state = st;
    t->state.ranks = t->world;
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

static int freeSamplesOnRank(const RankCtx *rc, void *arg, NsaError *err) {
    Trainer *t = arg;
    trainSamplesFree(t->samples);
    t->samples = NULL;
    return 0;
}

/* What the ranks' dispatches reach - the trainer, its buffers, its work
 * area, its data and artifacts - once no worker can run any more
 * (rankGroupFreeThen): at once, or when a worker given up on leaves. */
static void releaseTrainer(void *ctx) {
    Trainer *t = ctx;
    artifactsClose(t->art);
    dataClose(t->train_data);
    dataClose(t->val_data);
    for (int r = 0; t->scratch && r < t->local; r++) free(t->scratch[r]);
    free(t->scratch);
    for (int r = 0; t->xbuf && r < t->local; r++) free(t->xbuf[r]);
    free(t->xbuf);
    free(t->world_status);
    pthread_mutex_destroy(&t->data_lock);
    free(t->tokens);
    free(t->targets);
    free(t->model_config_json);
    free(t->work);
    free(t);
}

/* Frees the trainer: the decoder on the thread that made it, then the
 * ranks (models, transports, worker threads), then releaseTrainer - later,
 * if a worker was given up on and may still return into what it reaches. */
static void freeTrainer(Trainer *t) {
    NsaError e;
    if (t->samples && rankGroupRunOne(t->ranks, 0, freeSamplesOnRank, t, &e) != 0)
        logWarn("samples: %s", e.message); /* the ranks are broken: it stays (a leak, not a crash) */
    if (rankGroupBroken(t->ranks))
        logWarn("the run's memory is kept until the rank given up on returns (it may still write "
                "into it)");
    rankGroupFreeThen(t->ranks, releaseTrainer, t);
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
    int why = atomic_load(&t->mon->halt_requested);
    if (why) return trainHaltReasonName(why);
    if (artifactsHaltRequested(t->out_dir)) return ".HALT file";
    return NULL;
}

/* Why the job stops after this step, or NULL. On several nodes every node
 * must stop at the same step: each says whether it wants to (a halt
 * request, a .HALT file, a shutdown) and every rank's last figures ride
 * along; any node's wish stops them all. */
static int agreeHalt(Trainer *t, const char **halt_reason, NsaError *err) {
    *halt_reason = haltReason(t);
    if (!t->multi_node) return 0;
    ExchangeWork *w = workArea(t, sizeof *w, err);
    if (!w) return -1;
    for (int r = 0; r < t->local; r++) {
        w->mine[r].stop = *halt_reason != NULL;
        w->mine[r].status = localStatus(t, r);
    }
    const RankSlot *all = exchangeSlots(t, w, err);
    int stop = 0;
    for (int r = 0; all && r < t->world; r++) {
        stop |= all[r].stop;
        t->world_status[r] = all[r].status;
    }
    if (!all) return -1;
    if (stop && !*halt_reason) *halt_reason = "another node's halt";
    return 0;
}

static int trainLoop(Trainer *t, TrainOutcome *outcome, const char **halt_reason, NsaError *err) {
    const TrainConfig *tc = &t->job.train;
    t->started = clockMonotonicSeconds();
    t->log_step_seconds = 0;
    t->log_tokens0 = t->state.tokens_seen;
    while (t->state.step < tc->steps) {
        int64_t step = t->state.step + 1;
        double lr = lrScheduleRate(&t->schedule, step);
        double t0 = clockMonotonicSeconds();
        NsaStepStats stats;
        if (runStep(t, step, lr, &stats, err) != 0) return -1;
        atomic_store(&t->mon->step_done, step); /* its results are back from the device */
        atomic_store(&t->mon->step_done_ns, clockMonotonicNs());
        t->log_step_seconds += clockMonotonicSeconds() - t0;
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
                if (logStep(t, &stats, lr, clockMonotonicSeconds() - t0, eval_now, err) != 0) return -1;
            if (eval_now && evaluate(t, err) != 0) {
                releaseHeldStep(t);
                return -1;
            }
            if (tc->save_every > 0 && step % tc->save_every == 0 && step != tc->steps)
                if (saveCheckpoint(t, err) != 0) return -1;
        }
        if (agreeHalt(t, halt_reason, err) != 0) return -1;
        if (*halt_reason && t->state.step < tc->steps) {
            *outcome = TRAIN_HALTED;
            return 0;
        }
    }
    *outcome = TRAIN_COMPLETED;
    return 0;
}

static void writeSummary(Trainer *t, TrainOutcome outcome, double wall, const char *error) {
    double run_secs = t->steps_this_process ? clockMonotonicSeconds() - t->started : 0;
    int64_t tokens_per_step = (int64_t)t->job.train.batch_size * t->job.train.seq_len *
                              t->job.train.accumulate_grad_batches * (t->world > 0 ? t->world : 1);
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

/* artifactsReadCsv's callback: one earlier evaluation into the summary. */
static int addValHistory(void *ctx, const ArtifactCsvRow *row, NsaError *err) {
    Trainer *t = ctx;
    if (isnan(t->first_val)) {
        t->first_val = row->val_loss;
        t->first_bpb = row->bits_per_byte;
    }
    t->last_val = row->val_loss;
    t->last_bpb = row->bits_per_byte;
    if (isnan(t->best_val) || row->val_loss < t->best_val) t->best_val = row->val_loss;
    return 0;
}

/* What an earlier process of this run evaluated (val.csv rows kept by the
 * resume), so metrics.json summarises the whole curve. Returns 0 or -1 with
 * err (val.csv unreadable). */
static int loadValHistory(Trainer *t, NsaError *err) {
    return artifactsReadCsv(t->out_dir, ARTIFACT_VAL_CSV, addValHistory, t, err);
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
    /* what to resume from is known before the ranks: a coordinator tells
     * the other nodes whether to take part in a load */
    int resumed = 0;
    if (t->join) {
        resumed = t->join->resume;
        if (resumed) snprintf(resumed_from, sizeof resumed_from, "the coordinator's checkpoint");
    } else if (opt->resume) {
        /* a save a kill cut short first: a step it was replacing is not lost */
        if (checkpointSweep(t->out_dir, &e) != 0) logWarn("resume: %s", e.message);
        char skipped[1024] = "";
        int found = !strcmp(opt->resume, "latest-valid")
                        ? checkpointResolveValid(t->out_dir, resumed_from, sizeof resumed_from, skipped,
                                                 sizeof skipped, err)
                        : checkpointResolve(t->out_dir, opt->resume, resumed_from, sizeof resumed_from, err);
        if (found < 0) return -1;
        if (found > 0 && skipped[0])
            logWarn("resume: skipping damaged checkpoints (%s); resuming from %s", skipped, resumed_from);
        if (found == 0)
            logNotice("resume: %s/checkpoints has no checkpoint yet; starting at step 0", t->out_dir);
        resumed = found > 0;
    }
    if (openData(t, err) != 0 || createRanks(t, opt, resumed, err) != 0 ||
        restoreOrInit(t, t->join && resumed ? NULL : resumed ? resumed_from : "", err) != 0)
        return -1;
    if (resumed) t->last_saved_step = t->last_eval_step = t->state.step;
    atomic_store(&t->mon->step, t->state.step);
    t->art = artifactsOpen(t->out_dir, resumed ? t->state.step : -1, err);
    if (!t->art) return -1;
    if (resumed && loadValHistory(t, err) != 0) return -1;
    /* samples come from the job's rank 0, on its thread and device */
    if (t->first == 0) rankGroupRunOne(t->ranks, 0, createSamplesOnRank, t, &e);
    NsaMemoryReport mem;
    int have_mem = memoryReport(t, &mem) == 0;
    if (artifactsWriteEnv(t->out_dir, &t->job, have_mem ? &mem : NULL,
                          resumed ? resumed_from : NULL, err) != 0)
        return -1;

    const TrainConfig *tc = &t->job.train;
    size_t n_params = 0;  /* the arenas' padding is not a parameter */
    for (int i = 0; i < nsaModelNumTensors(t->model); i++)
        n_params += nsaModelTensorInfo(t->model, i)->numel;
    const int recompute = nsaModelGetOptions(t->model)->recompute;
    logInfo("train: %zu parameters (%.1f MB with activations), %s %s%s%s, %" PRId64
            " steps of %d x %d x %d tokens, out_dir %s",
            n_params, have_mem ? (double)mem.total / 1e6 : 0.0,
            configDeviceName(t->job.runtime.device), configPrecisionName(t->job.runtime.precision),
            recompute ? ", activation recompute " : "", recompute ? nsaRecomputeName(recompute) : "",
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
    else if (tc->init_from[0]) cJSON_AddStringToObject(d, "init_from", tc->init_from);
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

/* The work area's size: the largest argument any dispatch takes. */
static size_t workBytes(void) {
    const size_t sizes[] = {sizeof(NsaMemoryReport), sizeof(ExchangeWork), sizeof(TensorWork),
                            sizeof(InitWork),        sizeof(StepWork),     sizeof(SampleWork),
                            sizeof(EvalWork)};
    size_t most = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] > most) most = sizes[i];
    return most;
}

int trainerRun(const JobConfig *cfg, const TrainOptions *opt, TrainMonitor *mon,
               const TrainHooks *hooks, TrainResult *res, NsaError *err) {
    static const TrainOptions no_options = {.device_override = -1};
    TrainResult local_res;
    NsaError local_err;
    if (!opt) opt = &no_options;
    if (!res) res = &local_res;
    if (!err) err = &local_err;
    memset(res, 0, sizeof *res);
    res->outcome = TRAIN_FAILED;
    res->last_loss = res->last_val_loss = NAN;

    Trainer *t = calloc(1, sizeof *t);
    if (t) {
        t->work_bytes = workBytes();
        t->work = calloc(1, t->work_bytes);
    }
    if (!t || !t->work) {
        free(t);
        return nsaErrorf(err, "out of memory");
    }
    if (!mon) { /* the trainer's own: the ranks report into it as long as they run */
        trainMonitorInit(&t->own_mon);
        mon = &t->own_mon;
    }
    t->mon = mon;
    t->hooks = hooks;
    t->quiet = opt->quiet;
    t->join = opt->join;
    pthread_mutex_init(&t->data_lock, NULL);
    t->last_loss = t->last_grad_norm = NAN;
    t->first_val = t->first_bpb = t->last_val = t->last_bpb = t->best_val = NAN;
    t->last_saved_step = t->last_eval_step = -1;
    double wall0 = clockMonotonicSeconds();
    atomic_store(&mon->abort_requested, 0);
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
    finishRun(t, outcome, halt_reason, clockMonotonicSeconds() - wall0, err);

    res->outcome = outcome;
    res->step = t->state.step;
    res->last_loss = t->last_loss;
    res->last_val_loss = t->last_val;
    snprintf(res->anomaly, sizeof res->anomaly, "%s", t->anomaly);
    if (outcome == TRAIN_HALTED && halt_reason)
        snprintf(res->halt_reason, sizeof res->halt_reason, "%s", halt_reason);
    freeTrainer(t);
    return outcome == TRAIN_COMPLETED || outcome == TRAIN_HALTED ? 0 : -1;
}
