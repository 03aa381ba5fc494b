/* service.h - what `nsad serve` shares between its threads: the run
 * registry, the trainer thread that owns the engine (GPUs or CPU), the
 * TrainMonitor the watchdog and the API read, and the daemon's counters.
 *
 * Threads: the HTTP thread calls serviceCreateRun / serviceHaltRun /
 * serviceResumeRun and reads the registry under svc->lock; the trainer
 * thread runs one job at a time (trainerRun), takes the head of the queue
 * (runs in state queued) whenever it is free, and records its news under the
 * same lock; the watchdog reads the monitor atomics and takes the lock to
 * mark a run hung. Nobody holds the lock across slow work. */
#ifndef NSAD_SERVICE_H
#define NSAD_SERVICE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "config.h"
#include "auth.h"
#include "runs.h"
#include "trainer.h"

/* HTTP status classes counted for nsad_http_requests_total. */
#define SERVICE_HTTP_CODES 16
/* GPUs whose peak matrix rate the service keeps (MFU). */
#define SERVICE_MAX_GPUS 64

typedef enum ServiceStatus {
    SVC_OK = 0,
    SVC_BUSY,           /* another run holds the trainer (409 busy) */
    SVC_NOT_FOUND,      /* no such run (404) */
    SVC_INVALID_STATE,  /* the run's state forbids it (409 invalid_state) */
    SVC_INVALID_CONFIG, /* the job config did not load (400 invalid_config) */
    SVC_UNAVAILABLE,    /* shutting down (503) */
    SVC_INTERNAL        /* I/O or memory failure (500) */
} ServiceStatus;

/* Makes the engine's memory plan for a job (nsaModelMemoryPlan's
 * contract); tests put a stand-in in Service.memory_plan. */
typedef int (*ServiceMemoryPlanFn)(const NsaModelConfig *cfg, const NsaEngineOptions *opt, int world,
                                   NsaMemoryReport *out, int *max_batch_fits, NsaError *err);

/* What the trainer thread is to do with the active run it has not taken yet. */
enum { SERVICE_PENDING_NONE = 0, SERVICE_PENDING_START = 1, SERVICE_PENDING_RESUME = 2 };

typedef struct Service {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* the trainer thread waits on it */
    RunRegistry *runs;
    TrainMonitor mon;
    /* under lock: */
    char active_id[RUN_ID_MAX]; /* the run holding the trainer, "" when idle */
    int pending;                /* SERVICE_PENDING_*: the active run waits for the trainer thread */
    int user_halt;              /* the active run's halt came from a user */
    int shutting_down;          /* a TrainHaltReason once serviceShutdown began, else 0 */
    unsigned job_events;          /* ending events the trainer reported (eventBit) */
    WatchdogConfig deadlines;     /* the active job's phase deadlines */
    int64_t hang_flagged_since;   /* phase_since_ns the watchdog flagged, 0 none */
    RunState state_before_hang;   /* what a recovered run goes back to (running or halting) */
    char last_dump[RUN_PATH_MAX]; /* the latest hang dump file */
    /* atomics, read without the lock: */
    _Atomic int64_t trainer_tick_ns; /* the idle trainer thread's last loop */
    _Atomic int64_t http_tick_ns;    /* the HTTP thread's last loop */
    _Atomic int trainer_busy;
    _Atomic uint64_t hangs_total, anomalies_total;
    _Atomic uint64_t http_requests[SERVICE_HTTP_CODES];
    /* set before the HTTP thread starts, read-only after: */
    NsaDeviceInfo devices;           /* what nsad found (serviceSetDevices); none until told */
    /* under lock: where nsad listens (serviceSetListeners), "" for none */
    char listen_url[300];
    char socket_path[RUN_PATH_MAX];
    ServiceMemoryPlanFn memory_plan; /* nsaModelMemoryPlan */
    double started_unix;
    int64_t started_ns;
    pthread_t trainer;
    int trainer_started;
    struct Infer *infer; /* sample and eval jobs (daemon/infer.c); set by cmd_serve, or NULL */
    /* multi-node: the token this nsad presents to the other nodes of a job
     * it coordinates ("" without auth; the nodes of a job share one), and
     * the part a queued member run plays (under lock) */
    char peer_token[AUTH_TOKEN_MAX];
    TrainJoin join;
    struct RunLog *runlog; /* each run's log lines (daemon/runlog.c); serviceOpen makes it */
    /* under lock: each GPU's peak dense bf16 matrix rate in FLOP/s (0: not
     * known), for MFU; serviceSetPeakFlops */
    double gpu_peak_flops[SERVICE_MAX_GPUS];
    int n_gpus;
} Service;

/* Opens the registry in state_dir and prepares the pick-up of runs a
 * previous nsad left active: the newest one that was starting, running or
 * hung is queued to resume from its latest checkpoint (same id, restarts+1,
 * a "restart" event); one that was halting becomes halted. Returns NULL with
 * err when the state dir is unusable. Free with serviceClose. */
Service *serviceOpen(const char *state_dir, NsaError *err);

/* Records the peak dense bf16 matrix rate of each of the node's n GPUs
 * (FLOP/s, 0 where not known; at most SERVICE_MAX_GPUS are kept): the MFU
 * denominator of the runs that start from now on (daemon/mfu.h). Takes the
 * lock. Cannot fail. */
void serviceSetPeakFlops(Service *svc, const double *per_gpu, int n);
/* Tells the service which devices this nsad can use: the start-up probe's
 * result, or (probe_error not NULL) why the probe failed, which then leaves
 * no GPU. New runs are checked against it. Call before the HTTP thread
 * starts. Cannot fail. */
void serviceSetDevices(Service *svc, const NsaDeviceInfo *found, const char *probe_error);

/* Records where nsad listens (the TCP URL, the Unix socket path; NULL or
 * "" for none), for the version route. Takes the lock. Cannot fail. */
void serviceSetListeners(Service *svc, const char *listen_url, const char *socket_path);

/* Starts the trainer thread (which picks up a queued run at once). Returns 0
 * or -1 with err. */
int serviceStartTrainer(Service *svc, NsaError *err);

/* Asks an active run to checkpoint and stop without marking it halted (the
 * next nsad resumes it), waits for the trainer thread and joins it. why (a
 * TrainHaltReason: TRAIN_HALT_SIGTERM, _SIGINT or _SHUTDOWN) is what the
 * run's heartbeat, events and the log say stopped it. After half of
 * timeout_s it asks the trainer to stop at once, without a checkpoint (a
 * stuck step never reaches one). Returns 0 when the trainer stopped, -1
 * when it did not within timeout_s (the caller exits anyway; the run's
 * record still says it was active). */
int serviceShutdown(Service *svc, double timeout_s, int why);

/* Frees everything. The trainer thread must have stopped (serviceShutdown)
 * or never started. NULL is a no-op. */
void serviceClose(Service *svc);

/* The config loader's warnings (ignored prototype keys) for a new run. */
typedef struct ServiceWarnings {
    int n;
    char text[CONFIG_MAX_WARNINGS][256];
} ServiceWarnings;

/* Creates a run from a job config (YAML or JSON text) and hands it to the
 * trainer, or queues it (state queued, at the back) while a run holds the
 * trainer or others wait. name may be NULL. Refuses (SVC_INVALID_CONFIG)
 * what cannot run here before any run exists: runtime.device cuda without
 * a usable GPU, a data.path that does not exist or cannot be read, a CUDA
 * job whose memory plan exceeds the GPU's free memory (checked while the
 * trainer is idle; a queued run meets the engine's own check when it
 * starts);
 * runtime.device auto becomes what this nsad has (cuda with a usable GPU,
 * else cpu) in the run's config. On SVC_OK copies the new id into id_out
 * (RUN_ID_MAX bytes) and the config's warnings into warnings (may be NULL).
 * Otherwise err says why in one line. Takes the lock. */
ServiceStatus serviceCreateRun(Service *svc, const char *config_text, size_t len, const char *name,
                               char *id_out, ServiceWarnings *warnings, NsaError *err);
/* The same with the other nodes of a multi-node job (runtime.nodes,
 * "HOST:PORT,..." ) set over the config's; nodes NULL keeps the config's.
 * may_queue 0 answers SVC_BUSY instead of queueing (?queue=false). */
ServiceStatus serviceCreateRunOn(Service *svc, const char *config_text, size_t len, const char *name,
                                 const char *nodes, int may_queue, char *id_out,
                                 ServiceWarnings *warnings, NsaError *err);

/* A coordinator's request to join its multi-node job (POST /api/v1/join):
 * prepare answers how many ranks this node brings (its GPUs for the
 * config, or its CPU ranks) in *local, and checks the config and that no
 * run is active; start creates and queues the member run (named after the
 * coordinator's run, its runtime.nodes cleared) that plays the part
 * `join` describes, and copies its id into id_out. Returns SVC_OK,
 * SVC_INVALID_CONFIG, SVC_BUSY, SVC_UNAVAILABLE or SVC_INTERNAL with err.
 * Takes the lock. */
typedef struct ServiceJoin {
    int start;                 /* 0: prepare, 1: start */
    const char *config_yaml;
    const char *run_id;        /* start: the coordinator's run id */
    TrainJoin join;            /* start: the layout and the transport's id */
} ServiceJoin;
ServiceStatus serviceJoin(Service *svc, const ServiceJoin *j, int *local, char *id_out,
                          NsaError *err);

/* Asks the run to halt (finish the step, checkpoint, stop); a queued run
 * leaves the queue at once (state halted, its files kept). Returns
 * SVC_NOT_FOUND or SVC_INVALID_STATE with err. Takes the lock. */
ServiceStatus serviceHaltRun(Service *svc, const char *id, NsaError *err);

/* Restarts a halted, nan_halted or failed run from its latest checkpoint;
 * while the trainer is busy or others wait, queues it at the back (it
 * resumes on its turn), or with may_queue 0 answers SVC_BUSY. Takes the
 * lock. */
ServiceStatus serviceResumeRun(Service *svc, const char *id, int may_queue, NsaError *err);

/* Moves a queued run to the front of the queue (it starts next; the run
 * holding the trainer keeps it). Returns SVC_NOT_FOUND, SVC_INVALID_STATE
 * (not queued) or SVC_INTERNAL (run.json not written) with err. Takes the
 * lock. */
ServiceStatus serviceFrontRun(Service *svc, const char *id, NsaError *err);

/* Deletes a run that is not active (not starting, running, halting or hung,
 * and not holding the trainer): its record leaves the registry at once and
 * its directory - config, logs, checkpoints - is moved aside at once and
 * removed by a detached thread (slow work stays off the caller's thread).
 * Returns SVC_NOT_FOUND, SVC_INVALID_STATE (halt it first) or SVC_INTERNAL
 * (the directory could not be moved: nothing changed) with err; SVC_OK
 * also when the removal fails part way (logged; the next nsad finishes
 * it). Takes the lock. */
ServiceStatus serviceDeleteRun(Service *svc, const char *id, NsaError *err);

/* Counts one answered HTTP request by status for /metrics. Lock-free. */
void serviceCountRequest(Service *svc, int status);
/* The status codes serviceCountRequest tracks, slot by slot (0 ends). */
extern const int service_http_codes[SERVICE_HTTP_CODES];

/* The deadline in seconds for phase under the active job's watchdog config,
 * or 0 when the phase has none (idle, starting). */
double serviceDeadline(const WatchdogConfig *wd, TrainPhase phase);

#endif
