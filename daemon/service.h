/* service.h - what `nsad serve` shares between its threads: the run
 * registry, the trainers that own the engine (each a thread that runs one
 * job at a time on the GPUs, or the CPU, that job claims), the TrainMonitor
 * of each that the watchdog and the API read, and the daemon's counters.
 *
 * Threads: the HTTP thread calls serviceSubmitRun / serviceHaltRun /
 * serviceResumeRun and reads the registry under svc->lock; the scheduler
 * (schedulerStartQueued in scheduler.c, run by the trainer threads under the
 * lock) hands queued runs to idle trainers in queue order as their GPUs
 * come free, and each trainer thread runs its job
 * (trainerRun) and records its news under the same lock; the watchdog
 * reads the monitors' atomics and takes the lock to mark a run hung.
 * Nobody holds the lock across slow work (GET .../logs, for one, only
 * opens the run's log files under it and reads them after: runlog.h).
 *
 * Claims: a CUDA run claims the GPUs runtime.gpus names (all of them by
 * default), a CPU run claims the CPU engine. Runs whose claims are
 * disjoint train at once, each on its own trainer; a queued run starts
 * when its claim is free and no run queued before it wants any of it (so a
 * small run may pass a big one waiting for busy GPUs, never delay it).
 *
 * Who touches which Service field, and how ("lock": holding svc->lock;
 * "atomic": without it). main is cmd_serve.c; HTTP is server.c, api.c,
 * api_use.c and prom.c; trainers are the trainer threads (service.c,
 * scheduler.c); watchdog is watchdog.c. Lock order: svc->lock, then the
 * run log's (runlog.h), then a stream's.
 *
 *   field               written by                    read by
 *   runs, runlog,       serviceOpen (main), before    everyone (the registry's
 *   lock, wake,         any other thread; tests set   contents under the lock;
 *   exports_dir,        memory_plan/train then too    runlog locks itself)
 *   memory_plan, train,
 *   started_*
 *   Run records and     HTTP (commands), trainers     HTTP, trainers, watchdog:
 *   the queue (runs)    (hooks, runJob, scheduler),   lock
 *                       watchdog (hang), main
 *                       (serviceOpen): lock
 *   devices             main (serviceSetDevices),     HTTP (submit checks, version),
 *                       before the HTTP thread        trainers (claims): no lock
 *                       starts; read-only after
 *   gpu_peak_flops,     main (serviceSetPeakFlops):   trainers (runJob): lock
 *   n_gpus              lock
 *   peer_token          main (serviceSetPeerToken),   trainers (runJob): no lock
 *                       before serviceStartTrainers
 *   infer               main (serviceSetInfer): lock; HTTP (api_use.c): no lock;
 *                       set before the HTTP thread    trainers (schedulerAssign):
 *                       starts, cleared after it ends lock
 *   listen_url,         main (serviceSetListeners):   HTTP (version route): lock
 *   socket_path         lock
 *   n_trainers          main (serviceStartTrainers,   lock, except the watchdog
 *                       once, after the HTTP thread   (started after it)
 *                       started): lock
 *   shutting_down       main (serviceShutdown): lock  trainers, HTTP commands: lock
 *   trainers[i], the    trainers (runJob, scheduler), HTTP (api.c, prom.c),
 *   fields marked       HTTP (commands hand runs      watchdog, trainers: lock
 *   "under svc->lock"   over, halt), main (start,
 *                       shutdown), watchdog (hang
 *                       fields, last_dump): lock
 *   trainers[i].mon     its trainer (trainerRun);     everyone: atomic
 *                       schedulerAssign resets it;
 *                       HTTP (halt), main (shutdown),
 *                       watchdog (abort) set its
 *                       requests: atomic
 *   trainers[i].busy,   trainers, schedulerAssign,    HTTP (health), watchdog,
 *   .tick_ns            main (shutdown): atomic       main (shutdown): atomic
 *   http_tick_ns        HTTP (server.c): atomic       watchdog: atomic
 *   hangs_total         watchdog: atomic              HTTP (metrics): atomic
 *   anomalies_total     trainers (hooks): atomic      HTTP (metrics): atomic
 *   http_requests       HTTP (serviceCountRequest):   HTTP (metrics): atomic
 *                       atomic */
#ifndef NSAD_SERVICE_H
#define NSAD_SERVICE_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "config.h"
#include "auth.h"
#include "runs.h"
#include "trainer.h"

/* HTTP status classes counted for nsad_http_requests_total. */
#define SERVICE_HTTP_CODES 16
/* The most GPUs nsad tells apart: a claim is a bitmask of GPU ordinals
 * (ServiceClaim.gpus, a uint64_t), and the service keeps each one's peak
 * matrix rate (MFU). GPUs past it are never claimed. */
#define SERVICE_MAX_GPUS 64
static_assert(SERVICE_MAX_GPUS <= 64, "ServiceClaim.gpus is a uint64_t bitmask");
/* Trainer threads one nsad runs, at most: serviceStartTrainers starts
 * 1 + min(GPUs, SERVICE_MAX_TRAINERS - 1) of them, all alike. */
#define SERVICE_MAX_TRAINERS 17

typedef enum ServiceStatus {
    SVC_OK = 0,
    SVC_BUSY,           /* another run holds what this one claims (409 busy) */
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

/* Runs a job (trainerRun's contract); tests put a stand-in in
 * Service.train. */
typedef int (*ServiceTrainFn)(const JobConfig *cfg, const TrainOptions *opt, TrainMonitor *mon,
                              const TrainHooks *hooks, TrainResult *res, NsaError *err);

/* What a run holds while it trains: GPU ordinals (bit g: GPU g, g below
 * SERVICE_MAX_GPUS) or the CPU engine. A run whose config no longer
 * resolves claims nothing and fails with the config's error when it
 * starts. */
typedef struct ServiceClaim {
    uint64_t gpus;
    int cpu;
} ServiceClaim;

/* What a trainer thread is to do with the active run it has not taken yet. */
enum { SERVICE_PENDING_NONE = 0, SERVICE_PENDING_START = 1, SERVICE_PENDING_RESUME = 2 };

struct Service;

/* One trainer: a thread, the run it holds and that run's monitor. */
typedef struct ServiceTrainer {
    struct Service *svc;
    int index;                  /* 0 .. n_trainers-1; thread "trainer" (0), "trainer N" */
    TrainMonitor mon;
    /* under svc->lock: */
    char active_id[RUN_ID_MAX]; /* the run it holds, "" when idle */
    int pending;                /* SERVICE_PENDING_*: the run waits for the thread */
    int user_halt;              /* the run's halt came from a user */
    unsigned job_events;        /* events the trainer reported, a bit each (service.c's JobEvent) */
    ServiceClaim claim;         /* what the run holds */
    TrainJoin join;             /* a member run's part in its multi-node job */
    WatchdogConfig deadlines;   /* the job's phase deadlines */
    int64_t hang_flagged_since; /* phase_since_ns the watchdog flagged, 0 none */
    RunState state_before_hang; /* what a recovered run goes back to (running or halting) */
    char last_dump[RUN_PATH_MAX]; /* the latest hang dump file */
    /* atomics, read without the lock: */
    _Atomic int64_t tick_ns;    /* the idle thread's last loop */
    _Atomic int busy;
    pthread_t thread;
    int started;
} ServiceTrainer;

typedef struct Service {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* the trainer threads wait on it */
    RunRegistry *runs;
    ServiceTrainer trainers[SERVICE_MAX_TRAINERS];
    int n_trainers;      /* set by serviceStartTrainers (1 until then) */
    /* under lock: */
    int shutting_down;          /* a TrainHaltReason once serviceShutdown began, else 0 */
    /* atomics, read without the lock: */
    _Atomic int64_t http_tick_ns;    /* the HTTP thread's last loop */
    _Atomic uint64_t hangs_total, anomalies_total;
    _Atomic uint64_t http_requests[SERVICE_HTTP_CODES];
    /* set before the HTTP thread starts, read-only after: */
    NsaDeviceInfo devices;           /* what nsad found (serviceSetDevices); none until told */
    /* under lock: where nsad listens (serviceSetListeners), "" for none */
    char listen_url[300];
    char socket_path[RUN_PATH_MAX];
    /* set by serviceOpen (tests replace the first two before any thread
     * starts), read-only after: */
    ServiceMemoryPlanFn memory_plan; /* nsaModelMemoryPlan */
    ServiceTrainFn train;            /* trainerRun */
    double started_unix;
    int64_t started_ns;
    /* sample, eval and export jobs (daemon/infer.c), or NULL: serviceSetInfer */
    struct Infer *infer;
    char exports_dir[RUN_PATH_MAX]; /* <state-dir>/exports (daemon/exportstore.h) */
    /* multi-node: the token this nsad presents to the other nodes of a job
     * it coordinates ("" without auth; the nodes of a job share one);
     * serviceSetPeerToken, before the trainers start */
    char peer_token[AUTH_TOKEN_MAX];
    struct RunLog *runlog; /* each run's log lines (daemon/runlog.c); serviceOpen makes it */
    /* under lock: each GPU's peak dense bf16 matrix rate in FLOP/s (0: not
     * known), for MFU; serviceSetPeakFlops */
    double gpu_peak_flops[SERVICE_MAX_GPUS];
    int n_gpus;
} Service;

/* The trainer holding run id, or NULL. Caller holds the lock. */
ServiceTrainer *serviceTrainerOf(Service *svc, const char *id);
/* Takes run (t's, hung) out of the hung state: back to what it was before
 * the hang (running, or halting when a halt came first), its anomaly
 * cleared, a "recovered" event added and "run ID: <how>" logged; t's
 * flagged hang is forgotten. The trainer's progress hooks and the watchdog
 * (the stuck phase ended) both call it. Returns 1 when run was hung, 0
 * (nothing done) otherwise. Cannot fail: a record not written is logged.
 * Caller holds the lock. */
int serviceRecoverHung(ServiceTrainer *t, Run *run, const char *how);
/* Trainers holding a run now (0 when all are idle). Lock-free. */
int serviceBusyTrainers(Service *svc);

/* Opens the registry in state_dir and picks up the runs a previous nsad
 * left active. Every run that was starting, running or hung resumes from
 * its latest checkpoint (same id, restarts+1, a "restart" event, its
 * anomaly cleared): the newest is handed straight to the first trainer
 * (state starting; it starts once serviceStartTrainers runs), the others
 * go to the front of the queue, oldest first, ahead of runs already
 * queued, and start as their claims allow. A run that was halting becomes
 * halted; a member run of a multi-node job becomes failed (its
 * coordinator resumes the job and brings this node back in). Returns NULL
 * with err when the state dir is unusable. Free with serviceClose. */
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

/* Sets the inference worker (sample, eval and export jobs; NULL: none)
 * and returns the one it replaces (NULL when none), which the caller then
 * owns (inferStop). Takes the lock: a trainer handed a run tells the
 * worker about the GPUs the run claims. The HTTP thread reads it without
 * the lock: set it before the HTTP thread starts and clear it (NULL) only
 * after that thread has stopped. Cannot fail. */
struct Infer *serviceSetInfer(Service *svc, struct Infer *infer);

/* Sets the bearer token this nsad presents to the other nodes of a
 * multi-node job it coordinates (NULL or "": none, as without auth; a
 * longer one is cut at AUTH_TOKEN_MAX - 1 bytes). The trainer threads
 * read it without the lock: call before serviceStartTrainers. Cannot
 * fail. */
void serviceSetPeerToken(Service *svc, const char *token);

/* Starts 1 + min(GPUs of serviceSetDevices, SERVICE_MAX_TRAINERS - 1)
 * trainer threads, which pick up queued runs at once. The trainers are
 * interchangeable: any idle one takes any run, and the run's claim (not
 * the trainer) binds its GPUs or the CPU engine, so at most that many runs
 * with disjoint claims train at once. Returns 0 or -1 with err (then none
 * runs). */
int serviceStartTrainers(Service *svc, NsaError *err);

/* Asks every active run to checkpoint and stop without marking it halted
 * (the next nsad resumes it), waits for the trainer threads and joins them. why (a
 * TrainHaltReason: TRAIN_HALT_SIGTERM, _SIGINT or _SHUTDOWN) is what the
 * run's heartbeat, events and the log say stopped it. After half of
 * timeout_s it asks the trainers to stop at once, without a checkpoint (a
 * stuck step never reaches one). Returns 0 when every trainer stopped, -1
 * when one did not within timeout_s (the caller exits anyway; the run's
 * record still says it was active). */
int serviceShutdown(Service *svc, double timeout_s, int why);

/* Frees everything. The trainer threads must have stopped (serviceShutdown)
 * or never started. NULL is a no-op. */
void serviceClose(Service *svc);

/* The config loader's warnings (ignored prototype keys) for a new run. */
typedef struct ServiceWarnings {
    int n;
    char text[CONFIG_MAX_WARNINGS][256];
} ServiceWarnings;

/* Creates a run from a job config (YAML or JSON text) and hands it to an
 * idle trainer, or queues it (state queued, at the back) while a run holds
 * what it claims or others wait before it. name may be NULL. Refuses (SVC_INVALID_CONFIG)
 * what cannot run here before any run exists: runtime.device cuda without
 * a usable GPU, a data.path that does not exist or cannot be read, a CUDA
 * job whose memory plan exceeds its GPUs' free memory (checked while no
 * run holds them; a queued run meets the engine's own check when it
 * starts);
 * runtime.device auto becomes what this nsad has (cuda with a usable GPU,
 * else cpu) in the run's config. On SVC_OK copies the new id into id_out
 * (RUN_ID_MAX bytes) and the config's warnings into warnings (may be NULL).
 * Otherwise err says why in one line. Takes the lock. */
ServiceStatus serviceCreateRun(Service *svc, const char *config_text, size_t len, const char *name,
                               char *id_out, ServiceWarnings *warnings, NsaError *err);
/* How a run is submitted (POST /api/v1/runs's query): its name (NULL: the
 * id), runtime.nodes ("HOST:PORT,...") and runtime.gpus (all, a count,
 * "0,2" or "[0, 2]") set over the config's (NULL: the config's), and
 * may_queue (0 answers SVC_BUSY instead of queueing: ?queue=false). */
typedef struct ServiceSubmit {
    const char *name;
    const char *nodes;
    const char *gpus;
    const char *init_from; /* train.init_from over the config's: a run id or a checkpoint path */
    int may_queue;
} ServiceSubmit;
/* serviceCreateRun with those; a bad nodes, gpus or init_from is
 * SVC_INVALID_CONFIG naming it. train.init_from (from the config or
 * init_from) is resolved to one checkpoint directory's absolute path and
 * checked against the model before the run is created. */
ServiceStatus serviceSubmitRun(Service *svc, const char *config_text, size_t len, const ServiceSubmit *how,
                               char *id_out, ServiceWarnings *warnings, NsaError *err);

/* A coordinator's request to join its multi-node job (POST /api/v1/join):
 * prepare answers how many ranks this node brings (its GPUs for the
 * config, or its CPU ranks) in *local, and checks the config and that no
 * run holds what it claims; start creates and queues the member run (named after the
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
 * while a run holds what it claims or others wait, queues it at the back (it
 * resumes on its turn), or with may_queue 0 answers SVC_BUSY. Takes the
 * lock. */
ServiceStatus serviceResumeRun(Service *svc, const char *id, int may_queue, NsaError *err);

/* Moves a queued run to the front of the queue (it starts next; running
 * runs keep their trainers). Returns SVC_NOT_FOUND, SVC_INVALID_STATE
 * (not queued) or SVC_INTERNAL (run.json not written) with err. Takes the
 * lock. */
ServiceStatus serviceFrontRun(Service *svc, const char *id, NsaError *err);

/* Deletes a run that is not active (not starting, running, halting or hung,
 * and not holding a trainer): its record leaves the registry at once and
 * its directory - config, logs, checkpoints - is moved aside at once and
 * removed by a detached thread (slow work stays off the caller's thread).
 * Returns SVC_NOT_FOUND, SVC_INVALID_STATE (halt it first) or SVC_INTERNAL
 * (the directory could not be moved: nothing changed) with err; SVC_OK
 * also when the removal fails part way (logged; the next nsad finishes
 * it). Takes the lock. */
ServiceStatus serviceDeleteRun(Service *svc, const char *id, NsaError *err);

/* Sets err (when not NULL) from fmt - one line, nsaErrorf's rules - and
 * returns st: the error of a ServiceStatus in one call. */
ServiceStatus serviceFail(NsaError *err, ServiceStatus st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Adds an event to run's record (runsAddEvent); when its file cannot be
 * written that is logged, not returned: the event stays visible through
 * the API either way. Caller holds the lock. */
void serviceAddEvent(Run *run, const char *type, int64_t step, const char *detail);
/* Sets run's state and saves its record (runsSetState); a record not
 * written is logged, not returned. Caller holds the lock. */
void serviceSaveState(Run *run, RunState state);

/* Counts one answered HTTP request by status for /metrics. Lock-free. */
void serviceCountRequest(Service *svc, int status);
/* The status codes serviceCountRequest tracks, slot by slot (0 ends). */
extern const int service_http_codes[SERVICE_HTTP_CODES];

#endif
