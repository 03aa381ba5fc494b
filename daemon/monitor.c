/* monitor.c - the trainer's shared state for its watchers (see monitor.h):
 * phase and halt-reason names, the device line under a left-right
 * protocol, the ranks' phases. */
#include "monitor.h"

#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "clockutil.h"

static const char *const phase_names[PHASE_COUNT] = {
    "idle", "starting", "data", "forward", "backward", "allreduce", "optimizer", "checkpoint", "eval",
};

const char *trainPhaseName(TrainPhase phase) {
    if ((int)phase < 0 || phase >= PHASE_COUNT) return "unknown";
    return phase_names[phase];
}

const char *trainHaltReasonName(int why) {
    switch (why) {
    case TRAIN_HALT_REQUEST: return "halt request";
    case TRAIN_HALT_SIGTERM: return "SIGTERM";
    case TRAIN_HALT_SIGINT: return "SIGINT";
    case TRAIN_HALT_SHUTDOWN: return "nsad shutdown";
    case TRAIN_HALT_SIGXCPU: return "SIGXCPU";
    case TRAIN_HALT_SIGPWR: return "SIGPWR";
    default: return "halt";
    }
}

int trainHaltReasonOfSignal(int sig) {
    switch (sig) {
    case SIGTERM: return TRAIN_HALT_SIGTERM;
    case SIGINT: return TRAIN_HALT_SIGINT;
    case SIGXCPU: return TRAIN_HALT_SIGXCPU;
    case SIGPWR: return TRAIN_HALT_SIGPWR;
    default: return TRAIN_HALT_SHUTDOWN;
    }
}

int trainPhaseFromName(const char *name) {
    for (int i = 0; name && i < PHASE_COUNT; i++)
        if (!strcmp(name, phase_names[i])) return i;
    return -1;
}

void trainMonitorInit(TrainMonitor *mon) {
    atomic_store(&mon->phase, PHASE_IDLE);
    atomic_store(&mon->phase_since_ns, clockMonotonicNs());
    atomic_store(&mon->step, 0);
    atomic_store(&mon->heartbeat_ns, clockMonotonicNs());
    atomic_store(&mon->halt_requested, 0);
    atomic_store(&mon->stop_now, 0);
    atomic_store(&mon->step_done_ns, 0);
    atomic_store(&mon->step_done, 0);
    atomic_store(&mon->memory_bytes, 0);
    atomic_store(&mon->memory_step, 0);
    atomic_store(&mon->device_read, 0);
    atomic_store(&mon->device_version, 0);
    atomic_store(&mon->device_readers[0], 0);
    atomic_store(&mon->device_readers[1], 0);
    mon->device[0][0] = mon->device[1][0] = '\0';
    atomic_store(&mon->n_ranks, 0);
    atomic_store(&mon->rank_first, 0);
    for (int r = 0; r < TRAIN_MAX_RANKS; r++) {
        atomic_store(&mon->rank_phase[r], PHASE_IDLE);
        atomic_store(&mon->rank_since_ns[r], 0);
    }
    atomic_store(&mon->abort_requested, 0);
}

void trainMonitorRankEnter(TrainMonitor *mon, int local, TrainPhase phase) {
    if (!mon || local < 0 || local >= TRAIN_MAX_RANKS) return;
    atomic_store(&mon->rank_phase[local], (int)phase);
    atomic_store(&mon->rank_since_ns[local], clockMonotonicNs());
}

void trainMonitorDescribeRanks(TrainMonitor *mon, int64_t now_ns, char *out, size_t cap) {
    out[0] = '\0';
    const int n = atomic_load(&mon->n_ranks), first = atomic_load(&mon->rank_first);
    if (n < 2) return;
    size_t used = (size_t)snprintf(out, cap, "ranks:");
    for (int r = 0; r < n && r < TRAIN_MAX_RANKS && used < cap; r++) {
        const int64_t since = atomic_load(&mon->rank_since_ns[r]);
        used += (size_t)snprintf(out + used, cap - used, "%s %d %s %.1f s", r ? "," : "", first + r,
                                 trainPhaseName((TrainPhase)atomic_load(&mon->rank_phase[r])),
                                 since > 0 && now_ns > since ? (double)(now_ns - since) * 1e-9 : 0.0);
    }
    if (used + 1 < cap) snprintf(out + used, cap - used, "\n");
}

/* Left-right (Ramalhete and Correia): readers announce themselves in the
 * reader count of the current version, then copy the line device_read
 * points at. The writer fills the other copy, points readers at it, and
 * before returning waits until no reader can still be in the copy it left
 * (first the count readers will move to, then, after moving them, the
 * count they were in), so that its next call can rewrite that copy. Every
 * protocol step is a sequentially consistent atomic, which orders the
 * plain byte copies on either side of it. */
static void waitForReaders(_Atomic int *readers) {
    while (atomic_load(readers) != 0) sched_yield();
}

void trainMonitorSetDevice(TrainMonitor *mon, const char *line) {
    const int old = atomic_load(&mon->device_read);
    char *copy = mon->device[!old];
    size_t i = 0;
    for (; line && line[i] && i + 1 < sizeof mon->device[0]; i++) copy[i] = line[i];
    copy[i] = '\0';
    atomic_store(&mon->device_read, !old);
    const int version = atomic_load(&mon->device_version);
    waitForReaders(&mon->device_readers[!version]);
    atomic_store(&mon->device_version, !version);
    waitForReaders(&mon->device_readers[version]);
}

void trainMonitorDevice(TrainMonitor *mon, char *out, size_t cap) {
    const int version = atomic_load(&mon->device_version);
    atomic_fetch_add(&mon->device_readers[version], 1);
    const char *line = mon->device[atomic_load(&mon->device_read)];
    size_t i = 0;
    for (; i + 1 < cap && i < sizeof mon->device[0] && line[i]; i++) out[i] = line[i];
    out[i] = '\0';
    atomic_fetch_sub(&mon->device_readers[version], 1);
}

void trainMonitorDescribeDevice(TrainMonitor *mon, int64_t now_ns, char *out, size_t cap) {
    char device[sizeof mon->device[0]];
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
    int64_t now = clockMonotonicNs();
    atomic_store(&mon->phase, (int)phase);
    atomic_store(&mon->phase_since_ns, now);
    atomic_store(&mon->heartbeat_ns, now);
}
