/* trainer.h - one training job, start to finish: data, steps, evaluation,
 * checkpoints, artifacts, the NaN guard. `nsad train` runs it in the
 * foreground; `nsad serve` runs it on its trainer thread and watches it
 * through a TrainMonitor (monitor.h). Same code path for both.
 *
 * Threads: trainerRun runs the job's loop on the caller's thread (the
 * controller) and starts threads it owns and ends before it returns: a
 * worker per local rank (ranks.h; each owns its rank's model and runs the
 * steps, evaluation shares and checkpoint gathers the controller hands it)
 * and a data prefetch thread per loader (data.h); a rank abandoned after
 * a failure is detached instead (ranks.h). Other threads talk to
 * it only through the TrainMonitor (atomics, monitor.h).
 *
 * TrainHooks are called on the controller thread, with one exception: a
 * `stall` event in one of a step's phases (fault.stall_phase forward,
 * backward, allreduce or optimizer) is sent on the fault rank's worker thread, as is
 * its heartbeat line, while the controller waits for the step to finish
 * (so hooks are not called concurrently with each other). Hooks must be
 * quick, must not call back into the trainer, and must not rely on the
 * thread they run on (thread-local state). */
#ifndef NSAD_TRAINER_H
#define NSAD_TRAINER_H

#include <stdatomic.h>
#include <stdint.h>
#include "config.h"
#include "monitor.h"
#include "trainstep.h"

typedef struct TrainHooks {
    void *ctx;
    /* a step was logged (every log_every steps and the last), except a
     * step that is also evaluated: its log comes with the evaluation */
    void (*on_step)(void *ctx, const TrainStepLog *s);
    /* an evaluation of `step` finished; logged is that step's log when it
     * was held back to arrive here, else NULL. A consumer that
     * lists both series by step (the metrics API's `since` cursor) takes
     * the two together, so no reader sees the step's loss without its
     * validation point and moves past it. */
    void (*on_eval)(void *ctx, const TrainStepLog *logged, int64_t step, double val_loss,
                    double bits_per_byte);
    /* an event: type is one of "start", "resume" (the run began, fresh or
     * from a checkpoint), "checkpoint", "samples" (an evaluation's sample
     * continuations), "anomaly" (the NaN guard), "rollback", "stall" (a
     * fault.stall_* injection, sent as the stall begins), and last "complete", "halt" or "fail";
     * detail is a one-line JSON object */
    void (*on_event)(void *ctx, const char *type, const char *detail_json);
} TrainHooks;

typedef enum TrainOutcome {
    TRAIN_COMPLETED = 0,  /* all steps done, final checkpoint written */
    TRAIN_HALTED = 1,     /* halt request, .HALT file or SIGTERM: checkpointed */
    TRAIN_NAN_HALTED = 2, /* the NaN guard stopped it (.anomaly_type written) */
    TRAIN_FAILED = 3      /* an error; err says which */
} TrainOutcome;

/* A node's part in a multi-node job another nsad coordinates (handed over
 * by the coordinator's POST /api/v1/join). */
typedef struct TrainJoin {
    int first, world;        /* this node's first rank, the job's ranks */
    NsaCommId comm_id;       /* the transport's id: NCCL's, or the TCP transport's */
    int resume;              /* the coordinator loads a checkpoint: take part in its broadcasts */
} TrainJoin;

typedef struct TrainOptions {
    const char *out_dir;     /* overrides train.out_dir when not NULL */
    const char *resume;      /* NULL, a checkpoint dir, "latest" or "latest-valid" (checkpoint.h) */
    int64_t steps;           /* overrides train.steps when > 0 */
    int device_override;     /* -1 none, else NsaDevice */
    int quiet;               /* no progress line on stdout */
    /* multi-node (runtime.nodes): */
    const char *run_id;      /* names the job to the other nodes (coordinator) */
    const char *peer_token;  /* the other nodes' bearer token (coordinator; NULL: none) */
    const TrainJoin *join;   /* set: this node is a member of another's job */
} TrainOptions;

typedef struct TrainResult {
    TrainOutcome outcome;
    int64_t step;            /* last completed step */
    double last_loss, last_val_loss;
    char anomaly[32];        /* "nan_loss", "nan_grad", ... or "" */
    char halt_reason[32];    /* TRAIN_HALTED: why ("SIGTERM", "halt request", ".HALT file", ...) */
} TrainResult;

/* How many data-parallel ranks this node brings to job cfg: its GPUs as
 * runtime.gpus names them (checked against the devices there are; their
 * ordinals go to ordinals[TRAIN_MAX_RANKS]), or runtime.cpu_ranks on the
 * CPU engine. Returns the count, or -1 with err. */
int trainerLocalRanks(const JobConfig *cfg, int *ordinals, NsaError *err);

/* The GPUs runtime.gpus names among `visible` CUDA devices (1 or more):
 * their ordinals go to ordinals[TRAIN_MAX_RANKS]. Returns the count, or -1
 * with err naming runtime.gpus and what this machine has (a GPU that is not
 * there, more GPUs than there are, more than TRAIN_MAX_RANKS). Makes no
 * driver call: nsad serve checks a job at submit with what it probed. */
int trainerResolveGpus(const RuntimeConfig *rt, int visible, int *ordinals, NsaError *err);

/* Applies opt's overrides (out_dir, steps, device; precision follows the
 * device when the config said auto) to job and validates the result: the
 * job trainerRun will run. Returns 0, or -1 with err naming the key, the
 * value and what is allowed (a config error: `nsad train` exits 78). */
int trainerApplyOptions(JobConfig *job, const TrainOptions *opt, NsaError *err);

/* Runs the job. Returns 0 when it ended cleanly (completed or halted, with
 * res->outcome saying which), or -1 with err filled and res->outcome set
 * (TRAIN_NAN_HALTED or TRAIN_FAILED). mon and hooks may be NULL. */
int trainerRun(const JobConfig *cfg, const TrainOptions *opt, TrainMonitor *mon,
               const TrainHooks *hooks, TrainResult *res, NsaError *err);

#endif
