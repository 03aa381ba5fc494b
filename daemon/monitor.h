/* monitor.h - what a training job (trainer.c) shares with the threads
 * that watch it (the HTTP thread, the watchdog, signal handlers): its phase
 * and step, heartbeat, halt and stop requests, the device line and memory a
 * hang dump reports, each local rank's phase. Nothing here allocates, and
 * only trainMonitorSetDevice waits (for readers of the copy it rewrites). */
#ifndef NSAD_MONITOR_H
#define NSAD_MONITOR_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "trainstep.h"

typedef enum TrainPhase {
    PHASE_IDLE = 0,
    PHASE_STARTING,
    PHASE_DATA,
    PHASE_FORWARD,
    PHASE_BACKWARD,
    PHASE_ALLREDUCE,
    PHASE_OPTIMIZER,
    PHASE_CHECKPOINT,
    PHASE_EVAL,
    PHASE_COUNT
} TrainPhase;

/* Returns "idle", "data", "forward", ... Never NULL. */
const char *trainPhaseName(TrainPhase phase);
/* Returns the phase of that name, or -1. */
int trainPhaseFromName(const char *name);

/* Why a run is asked to finish its step, checkpoint and return: the value
 * of TrainMonitor.halt_requested (0: it is not). The reason reaches the
 * heartbeat's halt event, the result and the logs as trainHaltReasonName
 * says it. */
typedef enum TrainHaltReason {
    TRAIN_HALT_NONE = 0,
    TRAIN_HALT_REQUEST = 1,  /* a user: POST .../halt, nsactl halt, the dashboard */
    TRAIN_HALT_SIGTERM = 2,  /* nsad train or nsad serve got SIGTERM */
    TRAIN_HALT_SIGINT = 3,   /* ... SIGINT (Ctrl-C) */
    TRAIN_HALT_SHUTDOWN = 4, /* nsad serve stops for another reason */
    TRAIN_HALT_SIGXCPU = 5,  /* the soft CPU time limit (signals.c: a stop signal) */
    TRAIN_HALT_SIGPWR = 6    /* the power is failing (likewise) */
} TrainHaltReason;

/* "halt request", "SIGTERM", "SIGINT", "nsad shutdown", "SIGXCPU",
 * "SIGPWR"; "halt" for any other value. Never NULL. */
const char *trainHaltReasonName(int why);

/* The TrainHaltReason of a stop signal (signals.c's SIGNAL_STOP);
 * TRAIN_HALT_SHUTDOWN for a signal without one of its own. Cannot fail. */
int trainHaltReasonOfSignal(int sig);

/* Shared between the trainer and its watchers (HTTP thread, watchdog,
 * signal handlers). Every field is atomic; the trainer writes, others read,
 * except the request flags, which others set and the trainer clears. */
typedef struct TrainMonitor {
    _Atomic int phase;               /* TrainPhase */
    _Atomic int64_t phase_since_ns;  /* CLOCK_MONOTONIC when the phase began */
    _Atomic int64_t step;            /* last completed optimizer step */
    _Atomic int64_t heartbeat_ns;    /* CLOCK_MONOTONIC of the last sign of life */
    _Atomic int halt_requested;      /* TrainHaltReason: finish this step, checkpoint, return */
    _Atomic int stop_now;            /* abandon without checkpoint (shutdown) */
    /* What a hang dump says about the device, kept by the trainer so that a
     * watcher never has to ask a driver that may itself be stuck: */
    _Atomic int64_t step_done_ns;    /* when a step's results last came back (0: none yet) */
    _Atomic int64_t step_done;       /* which step that was */
    _Atomic int64_t memory_bytes;    /* device memory in use (CPU: RSS) at the last logged step */
    _Atomic int64_t memory_step;     /* and that step */
    /* The engine's device line (trainMonitorSetDevice / trainMonitorDevice):
     * two copies under a left-right protocol, so that a reader always takes
     * a whole line, old or new, in a bounded number of its own steps - it
     * never waits for the writer nor retries - while the one writer (the
     * trainer) waits for the readers of the copy it is about to rewrite. */
    _Atomic int device_read;         /* the copy readers take */
    _Atomic int device_version;      /* which reader count arriving readers join */
    _Atomic int device_readers[2];   /* readers in progress, per version */
    char device[2][384];
    /* Data parallelism: each local rank's phase (its worker writes it; idle
     * when it has done its part of a dispatch), so a hang dump names the
     * rank that holds the others up; and the watchdog's request to abort
     * the job's transports. */
    _Atomic int n_ranks;             /* local ranks of the job (0 before they exist) */
    _Atomic int rank_first;          /* the job-wide rank of local rank 0 */
    _Atomic int rank_phase[TRAIN_MAX_RANKS];
    _Atomic int64_t rank_since_ns[TRAIN_MAX_RANKS];
    /* set by the watchdog on a hang of a job with several local ranks;
     * polled by the rank group's dispatch (ranks.c), which then aborts
     * every local transport so the step fails; cleared at each job start */
    _Atomic int abort_requested;
} TrainMonitor;

/* Resets every field: idle phase since now, step 0, no requests, no
 * device line. Call before any reader or writer can see mon. */
void trainMonitorInit(TrainMonitor *mon);
/* Sets the phase and its start time; also a heartbeat. Async-signal-safe. */
void trainMonitorEnter(TrainMonitor *mon, TrainPhase phase);
/* The trainer's side: the device line of the model it just built (copied,
 * truncated to fit). One writer at a time. Waits for readers still copying
 * the older line (each takes a few hundred bytes' copy). Cannot fail. */
void trainMonitorSetDevice(TrainMonitor *mon, const char *line);
/* A watcher's side: copies the device line into out (cap > 0; "" before the
 * first model), truncated to cap - 1 bytes. Always a whole line, the one
 * before or after a concurrent trainMonitorSetDevice, without waiting or
 * retrying (wait-free). Any number of threads. */
void trainMonitorDevice(TrainMonitor *mon, char *out, size_t cap);
/* The device lines of a dump header, each ending in a newline: "device:"
 * (the device line), "device_memory:" (in use at the last logged step) and
 * "last_step_done:" (how long before now_ns, CLOCK_MONOTONIC, a step's
 * results last came back from the device: a long time with the phase
 * stuck points at the device or its driver, a short one at the host).
 * Truncates to cap (> 0). Cannot fail. */
void trainMonitorDescribeDevice(TrainMonitor *mon, int64_t now_ns, char *out, size_t cap);
/* A local rank's phase (its worker calls it; async-signal-safe). */
void trainMonitorRankEnter(TrainMonitor *mon, int local, TrainPhase phase);
/* "ranks: 0 allreduce 31.0 s, 1 forward 40.2 s\n" (job-wide ranks, the
 * phase each is in and for how long at now_ns; idle ranks say idle), or ""
 * with fewer than two ranks. Truncates to cap (> 0). Cannot fail. */
void trainMonitorDescribeRanks(TrainMonitor *mon, int64_t now_ns, char *out, size_t cap);

#endif
