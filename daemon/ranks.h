/* ranks.h - the data-parallel ranks of one job on this node.
 *
 * A RankGroup owns one worker thread per local rank. Each worker creates
 * and owns its rank's transport handle (NCCL on CUDA, made on its own
 * thread and device; the in-process local transport on the CPU engine) and
 * its model, and runs whatever the trainer hands the group - all ranks at
 * once, since their collectives wait for each other (kernels/nsa.h, "data
 * parallelism"). One rank in all has no transport: a model alone.
 *
 * Never hang: a dispatch (rankGroupRun) waits for every rank; the first
 * rank that fails - a collective past its deadline names the ranks it
 * waited for - makes the group abort every local transport, so that ranks
 * blocked in collectives fail at once, and the others get a grace period
 * (the transport's timeout) to return. A rank that still has not returned
 * is abandoned: the dispatch fails naming it and its phase, the group is
 * broken (later dispatches fail at once), and the worker frees its own
 * model whenever it returns.
 *
 * From outside, the watchdog (watchdog.c) does the same through the
 * TrainMonitor: on a hang of a job with several local ranks it sets
 * cfg.mon->abort_requested, which the dispatch's wait loop polls (at least
 * every 100 ms); seeing it, the dispatch aborts every local transport and
 * fails as above. Nothing else aborts a dispatch: a shutdown sets
 * mon->stop_now, which ends a fault stall and makes the trainer stop
 * after the step, but a rank blocked in a collective still waits out the
 * transport's deadline.
 *
 * Threads: rankGroup* are called by one controller thread (the trainer).
 * Workers register with the stack dumper as "rank N" and report their
 * phase in the TrainMonitor's rank slots. */
#ifndef NSAD_RANKS_H
#define NSAD_RANKS_H

#include "../kernels/nsa.h"
#include "monitor.h"

#define RANKS_MAX TRAIN_MAX_RANKS

typedef struct RankGroup RankGroup;

typedef struct RankGroupConfig {
    NsaModelConfig model;
    NsaEngineOptions engine;   /* device, precision, max_batch, max_seq_len, threads; each
                                  rank's device_ordinal and comm are set by the group */
    int local;                 /* ranks on this node, 1 to RANKS_MAX */
    int first;                 /* the job-wide rank of local rank 0 */
    int world;                 /* ranks in the whole job (>= first + local) */
    int ordinals[RANKS_MAX];   /* CUDA: local rank r runs on device ordinals[r] */
    double timeout;            /* seconds: every collective's deadline, and the grace
                                  period of ranks after an abort */
    /* the job's transport id when it spans nodes (CUDA: NCCL's; CPU: the
     * TCP transport's); else 0: one node, the group makes an NCCL id
     * (CUDA) or uses the in-process transport (CPU) */
    int have_comm_id;
    NsaCommId comm_id;
    TrainMonitor *mon;         /* ranks' phases (may be NULL) */
    char run_id[72];           /* the run the rank threads' log lines belong to ("": none) */
    /* Called once per failed dispatch, on the controller's thread, before
     * the transports are aborted (the stuck ranks are still where they
     * stuck): the trainer dumps every thread's stack there. May be NULL. */
    void (*on_failure)(void *ctx, const char *why);
    void *failure_ctx;
} RankGroupConfig;

/* What a worker hands the function it runs. */
typedef struct RankCtx {
    int local;       /* index on this node */
    int rank;        /* job-wide rank */
    int world;
    int ordinal;     /* CUDA device (CPU: -1) */
    NsaModel *model;
    NsaComm *comm;   /* NULL with one rank in all */
    TrainMonitor *mon;
} RankCtx;

/* Runs on a rank's worker thread. Returns 0, or -1 with err (the group
 * aborts the others), or RANK_STOPPED: the rank stops answering for good,
 * as a rank whose process died would (fault injection: fault.exit_at_step). */
#define RANK_STOPPED 2
typedef int (*RankFn)(const RankCtx *rc, void *arg, NsaError *err);

/* Starts the workers; each creates its transport handle and its model
 * (weights uninitialised). Returns NULL with err naming the rank that
 * failed (a failed NCCL init, a device out of memory, ...). Free with
 * rankGroupFree. */
RankGroup *rankGroupCreate(const RankGroupConfig *cfg, NsaError *err);

/* Runs fn(rank, arg) on every local rank at once and waits for them all.
 * Returns 0, or -1 with err: "rank R (PHASE): <what failed>", plus the
 * ranks abandoned (see above). An abandoned worker may still read and
 * write arg, and whatever fn reaches from it, when it returns: after a
 * failed dispatch, rankGroupBroken says whether that can happen, and what
 * it can reach must stay valid until rankGroupFreeThen's release runs. */
int rankGroupRun(RankGroup *g, RankFn fn, void *arg, NsaError *err);

/* Runs fn on local rank `local` alone (the others idle); same failure rules. */
int rankGroupRunOne(RankGroup *g, int local, RankFn fn, void *arg, NsaError *err);

/* Local rank `local`'s model, for what touches no device (its tensor table,
 * options); engine calls go through rankGroupRun*. NULL when out of range. */
NsaModel *rankGroupModel(RankGroup *g, int local);

/* 1 when a worker was abandoned (the group takes no more dispatches), else
 * 0; NULL is 0. Cannot fail. */
int rankGroupBroken(RankGroup *g);

/* Stops the workers (each frees its model, then its transport handle) and
 * frees the group; an abandoned worker does that when it returns. NULL is
 * a no-op. */
void rankGroupFree(RankGroup *g);

/* rankGroupFree, then release(ctx) once no worker can run any more: on
 * this thread before it returns when every worker had returned, else on
 * the last abandoned worker's thread when it returns and leaves (maybe
 * never, if it never returns). The memory the dispatches reached goes in
 * release. release may not touch the group. With g NULL, release runs at
 * once. Cannot fail. */
void rankGroupFreeThen(RankGroup *g, void (*release)(void *ctx), void *ctx);

#endif
