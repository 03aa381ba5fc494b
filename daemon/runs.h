/* runs.h - the run registry: every run nsad knows, its state machine, its
 * metric series and events, persisted under <state-dir>/runs/<id>/.
 *
 * On disk (proto/api.md, "Files in the state dir"):
 *   run.json       the record (state, step, timestamps, anomaly, ...)
 *   config.yaml    the resolved job config the trainer reads
 *   events.jsonl   one event per line
 *   out/           the run's out_dir (the trainer's artifacts); the metric
 *                  series are rebuilt from out/training.csv and out/val.csv
 *
 * Not thread-safe: the owner (Service) serialises every call with its lock. */
#ifndef NSAD_RUNS_H
#define NSAD_RUNS_H

#include <stddef.h>
#include <stdint.h>
#include "nsa.h"
#include "trainstep.h"

#define RUN_ID_MAX 65
#define RUN_PATH_MAX 4096
/* Points a run keeps in memory per series (training, evaluation). The files
 * under out/ keep every logged step; past this many points the in-memory
 * series - what the API and the dashboard serve - drops every other point
 * (keeping the first and the last), so a run of any length costs bounded
 * daemon memory (about 1 MB) at a resolution that halves each time. */
#define RUN_SERIES_MAX_POINTS 16384
/* Events a run keeps in memory (what the events route serves): past this
 * many the older half is dropped; events.jsonl keeps every one. A NaN
 * skip policy can log an anomaly per step. */
#define RUN_EVENTS_MAX 4096
/* The ETA's seconds per step are a moving average over about this many
 * optimizer steps of wall time (evaluations and checkpoints included, as
 * they take the run's time too); before a segment (a start or a resume)
 * has run this many steps, the plain average since its first sample. */
#define RUN_ETA_HORIZON_STEPS 200

typedef enum RunState {
    RUN_IDLE = 0,
    RUN_STARTING,
    RUN_RUNNING,
    RUN_HALTING,
    RUN_HALTED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_NAN_HALTED,
    RUN_HUNG,
    RUN_QUEUED, /* waits for the trainer (daemon/service.c starts the queue in order) */
    RUN_STATE_COUNT
} RunState;

/* "idle", "starting", ... Never NULL. */
const char *runStateName(RunState state);
/* The state of that name, or -1. */
int runStateFromName(const char *name);
/* 1 while the run holds the trainer: starting, running, halting, hung. */
int runStateIsActive(RunState state);
/* 1 when POST resume may restart a run in this state. */
int runStateIsResumable(RunState state);

/* 1 when id matches [A-Za-z0-9_-]{1,64} (safe as a path component). */
int runIdValid(const char *id);
/* 1 when name matches [A-Za-z0-9._-]{1,64} and is not "." or "..". */
int runNameValid(const char *name);

typedef struct RunTrainPoint {
    int64_t step;
    double ts, loss, lr, grad_norm, toks_per_s, mem_bytes;
    double tokens; /* tokens trained on up to this step (NAN: not known) */
} RunTrainPoint;

typedef struct RunValPoint {
    int64_t step;
    double ts, val_loss, bits_per_byte;
} RunValPoint;

typedef struct RunEvent {
    int64_t seq, step;
    double ts;
    char type[24];
    char *detail_json; /* a JSON object, owned */
} RunEvent;

typedef struct Run {
    char id[RUN_ID_MAX];
    char name[RUN_ID_MAX];
    RunState state;
    char *config_yaml;          /* the resolved config (owned) */
    char dir[RUN_PATH_MAX];     /* <state-dir>/runs/<id> */
    char out_dir[RUN_PATH_MAX]; /* <dir>/out */
    char device[16], precision[16];
    int64_t step, total_steps, last_checkpoint_step;
    /* latest values; NAN until known */
    double loss, val_loss, bits_per_byte, lr, grad_norm, toks_per_s, mem_bytes;
    /* MFU (daemon/mfu.h): the model FLOPs per trained token and the peak
     * matrix rate of the GPUs the run last started on (FLOP/s); NAN when
     * not known or not reported (CPU runs). run.json keeps both. */
    double flops_per_token, peak_flops;
    /* the ETA's smoothed seconds per step (runsAddStep; NAN until two
     * samples of this segment came in), from the segment's first sample
     * and the last one (step and unix time; eta_ts 0: none yet) */
    double step_seconds_avg;
    int64_t eta_first_step, eta_step;
    double eta_ts;
    /* active time (starting, running, halting, hung) of the run's earlier
     * segments, and when the current one began (unix seconds, 0: not
     * active); run.json keeps the sum as elapsed_s */
    double elapsed_before, segment_started;
    char anomaly[64];                        /* "" when none */
    char error[512];                         /* "" unless failed */
    int restarts;                            /* daemon restarts that resumed it */
    double created_at, started_at, ended_at; /* unix seconds; 0 = not yet */
    RunTrainPoint *train;
    size_t n_train, cap_train;
    RunValPoint *val;
    size_t n_val, cap_val;
    RunEvent *events;
    size_t n_events, cap_events;
    /* bumped whenever stored points are replaced (a resume or a rollback
     * redid steps), so pollers know to refetch the series */
    int64_t series_generation;
    /* data parallelism: the job's rank count and this node's ranks at the
     * last logged step (n_ranks 0 until one is logged in this process) */
    int world, n_ranks;
    TrainRankStatus ranks[TRAIN_MAX_RANKS];
    /* a member run (this node's part of a multi-node job another nsad
     * coordinates): the coordinator's run id, else "" (run.json "member_of") */
    char member_of[RUN_ID_MAX];
    /* the checkpoint whose weights the run started from (train.init_from,
     * fixed at submit), else "" (run.json "init_from") */
    char init_from[RUN_PATH_MAX];
    /* while queued: its place (the lowest starts first; run.json keeps it,
     * so the queue survives restarts and crashes) and whether it starts
     * from its latest checkpoint (a resume that waited) */
    int64_t queue_order;
    int queue_resume;
    /* what it holds while it trains (daemon/service.h, ServiceClaim), worked
     * out from config_yaml once by the service (not in run.json) */
    int claim_known, claim_cpu;
    uint64_t claim_gpus;
} Run;

typedef struct RunRegistry {
    char state_dir[RUN_PATH_MAX];
    char runs_dir[RUN_PATH_MAX];
    Run **runs; /* oldest first */
    size_t n_runs, cap_runs;
} RunRegistry;

/* Opens (creating <state_dir>/runs when missing) and loads every stored run:
 * its record, config, events and metric series. A run directory whose
 * run.json is unreadable or corrupt is skipped with a warning in the log
 * naming the file; deleted runs' leftover trash is removed. Returns NULL with err when the state dir cannot be used.
 * Free with runsClose. */
RunRegistry *runsOpen(const char *state_dir, NsaError *err);
void runsClose(RunRegistry *reg);

/* Creates a run in state `initial` (RUN_STARTING, or RUN_QUEUED: then at
 * the back of the queue): a fresh id, its directories, config.yaml and
 * run.json. name may be NULL (the id is used). Returns the run (owned by
 * the registry) or NULL with err. */
Run *runsCreate(RunRegistry *reg, const char *name, const char *config_yaml, const char *device,
                const char *precision, int64_t total_steps, RunState initial, NsaError *err);

/* ---- the queue: the runs in state queued, by queue_order ---- */

/* The queued runs in the order they start (lowest queue_order first, the
 * older id on a tie) into *out, a malloc'd array of *n runs (the caller
 * frees it; NULL when none is queued). Returns 0, or -1 when out of
 * memory (*out NULL, *n 0). */
int runsQueue(const RunRegistry *reg, Run ***out, size_t *n);
/* The run's place in the queue, 1 for the head; 0 when it is not queued. */
int runsQueuePosition(const RunRegistry *reg, const Run *run);
/* How many runs are queued. */
int runsQueueLength(const RunRegistry *reg);
/* Puts run at the back (front 0) or the front (front 1) of the queue:
 * state queued, queue_order past the others', resume as given; saves
 * run.json (atomic). Returns runsSave's result; memory changes either way. */
int runsEnqueue(RunRegistry *reg, Run *run, int front, int resume, NsaError *err);

/* Replaces the run's config (memory and config.yaml). Returns 0, or -1 with
 * err (the old config stays). */
int runsSetConfig(Run *run, const char *config_yaml, NsaError *err);

/* The run with that id, or NULL. */
Run *runsFind(const RunRegistry *reg, const char *id);

/* Name prefix of a deleted run's directory until it is removed. */
#define RUNS_TRASH_PREFIX ".deleted-"

/* Takes the run out of the registry (freeing it: pointers to it die) and
 * renames its directory to <runs>/.deleted-<id>.<time> in one step, so a
 * crash leaves either the whole run or trash that the next runsOpen
 * removes. trash_out (cap bytes) gets that path: the caller removes the
 * tree (fsRemoveTree; slow, so outside any lock). Returns 0, or -1 with
 * err (nothing changed) when there is no such run or the rename fails.
 * Refusing active runs is the caller's business. */
int runsDelete(RunRegistry *reg, const char *id, char *trash_out, size_t cap, NsaError *err);

/* Writes run.json atomically (temp file, fsync, rename). Returns 0 or -1
 * with err. */
int runsSave(const Run *run, NsaError *err);

/* Moves the run to state, stamps started_at / ended_at as fitting, opens or
 * closes an active segment (elapsed time, a fresh ETA estimate), and
 * saves. Returns runsSave's result; the state changes in memory either way. */
int runsSetState(Run *run, RunState state, NsaError *err);

/* Seconds the run has been active (starting, running, halting or hung) at
 * unix time now, summed over every start, resume and daemon restart (time
 * halted or with nsad down does not count; a crash loses the time since
 * run.json was last saved). Cannot fail. */
double runsElapsedSeconds(const Run *run, double now);

/* Estimated seconds until the run completes at unix time now: the steps
 * left times the smoothed seconds per step, less the time since the last
 * logged step (so it counts down between samples), never below 0. NAN
 * before two samples of the current segment. The one estimate the API,
 * /metrics, nsactl and the dashboard show. Cannot fail. */
double runsEtaSeconds(const Run *run, double now);

/* Appends a logged training step to the series and updates the run's latest
 * values and its ETA estimate. A step at or below the last one stored (a
 * resume redoing steps after its checkpoint) first drops the stored points
 * from that step on, so the series stays strictly increasing; a series past
 * RUN_SERIES_MAX_POINTS is thinned. Either bumps series_generation.
 * Returns 0, or -1 when out of memory. */
int runsAddStep(Run *run, const TrainStepLog *s);
/* Same for an evaluation. */
int runsAddEval(Run *run, int64_t step, double ts, double val_loss, double bits_per_byte);

/* Records an event (in memory, newest RUN_EVENTS_MAX kept, and appended to
 * events.jsonl). detail_json
 * must be a JSON object or NULL ({}); anything else is stored as
 * {"text": "..."}. Returns 0, or -1 with err when the file cannot be written
 * (the event is still kept in memory). */
int runsAddEvent(Run *run, const char *type, int64_t step, const char *detail_json, NsaError *err);

/* Replaces the metric series with the contents of out/training.csv and
 * out/val.csv (missing files give empty series; columns are found by their
 * header names), then fills what the CSVs lack (time, gradient norm,
 * memory, tokens seen) from out/heartbeat_rank0.jsonl. Returns 0, or -1 with err naming
 * the file and line. */
int runsLoadSeries(Run *run, NsaError *err);

#endif
