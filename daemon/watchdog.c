/* watchdog.c - see watchdog.h. */
#include "watchdog.h"
#include "clockutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sdnotify.h"
#include "stackdump.h"

#define TICK_NS (250 * 1000000LL)
#define STATUS_EVERY_NS (5 * 1000000000LL)
/* the HTTP loop wakes at least twice a second; this much silence means stuck */
#define HTTP_SILENCE_NS (10 * 1000000000LL)
#define TRAINER_IDLE_SILENCE_NS (10 * 1000000000LL)

struct Watchdog {
    Service *svc;
    pthread_t thread;
    _Atomic int stop;
    uint64_t sd_usec;
    int64_t last_ping_ns, last_status_ns;
    int warned_no_ping;
    int warned_notify;
};

int watchdogWriteDump(const char *dir, const char *reason, const char *header, const char *stacks, char *path,
                      size_t cap, NsaError *err) {
    int n = snprintf(path, cap, "%s/stacks-%lld-%s.txt", dir, (long long)time(NULL), reason);
    if (n < 0 || (size_t)n >= cap) {
        nsaErrorf(err, "dump path too long under %s", dir);
        return -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0) {
        nsaErrorf(err, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    int ok = 1;
    const char *parts[2] = {header, stacks};
    for (int i = 0; i < 2 && ok; i++) {
        size_t len = parts[i] ? strlen(parts[i]) : 0, off = 0;
        while (off < len) {
            ssize_t w = write(fd, parts[i] + off, len - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                ok = 0;
                break;
            }
            off += (size_t)w;
        }
    }
    int saved = errno;
    if (close(fd) != 0) ok = 0;
    if (!ok) {
        nsaErrorf(err, "cannot write %s: %s", path, strerror(saved));
        return -1;
    }
    return 0;
}

/* Logs text line by line (the log keeps one line per entry). */
static void logLines(int level, const char *prefix, const char *text) {
    const char *p = text;
    while (p && *p) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        logMsg(level, "%s%.*s", prefix, len, p);
        p = nl ? nl + 1 : NULL;
    }
}

/* The deadline in seconds for phase under the active job's watchdog config,
 * or 0 when the phase has none (idle, starting). */
static double phaseDeadline(const WatchdogConfig *wd, TrainPhase phase) {
    switch (phase) {
    case PHASE_DATA:
        return wd->data;
    case PHASE_FORWARD:
        return wd->forward;
    case PHASE_BACKWARD:
        return wd->backward;
    case PHASE_ALLREDUCE:
        return wd->allreduce;
    case PHASE_OPTIMIZER:
        return wd->optimizer;
    case PHASE_CHECKPOINT:
        return wd->checkpoint;
    case PHASE_EVAL:
        return wd->eval;
    default:
        return 0;
    }
}

/* watchdogCheck for one trainer. */
static int checkTrainer(ServiceTrainer *t, int64_t now_ns, char *dump_path, size_t cap) {
    Service *svc = t->svc;
    TrainMonitor *mon = &t->mon;
    pthread_mutex_lock(&svc->lock);
    Run *run = t->active_id[0] ? runsFind(svc->runs, t->active_id) : NULL;
    TrainPhase phase = (TrainPhase)atomic_load(&mon->phase);
    int64_t since = atomic_load(&mon->phase_since_ns);
    if (t->hang_flagged_since && since != t->hang_flagged_since) {
        /* the stuck phase ended: the trainer is moving again (a run halted
         * while hung stays halting) */
        t->hang_flagged_since = 0;
        if (run) serviceRecoverHung(t, run, "the stuck phase ended; running again");
    }
    double deadline = phaseDeadline(&t->deadlines, phase);
    double age = (double)(now_ns - since) * 1e-9;
    int overrun = run && !t->pending && deadline > 0 && age > deadline &&
                  t->hang_flagged_since != since && run->state != RUN_HUNG;
    if (!overrun) {
        pthread_mutex_unlock(&svc->lock);
        return 0;
    }
    t->hang_flagged_since = since;
    char id[RUN_ID_MAX], out_dir[RUN_PATH_MAX];
    snprintf(id, sizeof id, "%s", run->id);
    snprintf(out_dir, sizeof out_dir, "%s", run->out_dir);
    int64_t step = atomic_load(&mon->step);
    HangPolicy policy = t->deadlines.on_hang;
    pthread_mutex_unlock(&svc->lock);

    /* the slow part runs unlocked: the HTTP thread keeps answering */
    const char *phase_name = trainPhaseName(phase);
    char device[640], ranks[1400], header[2200];
    trainMonitorDescribeDevice(mon, now_ns, device, sizeof device);
    trainMonitorDescribeRanks(mon, now_ns, ranks, sizeof ranks);
    snprintf(header, sizeof header,
             "nsad hang dump\nrun: %s\nphase: %s\nphase_seconds: %.1f\ndeadline_seconds: %.1f\n"
             "step: %lld\npolicy: %s\n%s%s\n",
             id, phase_name, age, deadline, (long long)step, policy == HANG_EXIT ? "exit" : "report",
             device, ranks);
    /* several ranks: the others wait in collectives for the stuck one, so
     * the hang cannot end by itself - the trainer aborts the transports and
     * the run fails, resumable from its last checkpoint */
    if (atomic_load(&mon->n_ranks) > 1) atomic_store(&mon->abort_requested, 1);
    char *stacks = stackdumpString("watchdog: phase overran its deadline");
    char path[RUN_PATH_MAX + 64] = "";
    NsaError err;
    if (watchdogWriteDump(out_dir, "hang", header, stacks ? stacks : "(no stacks: out of memory)\n", path,
                          sizeof path, &err) != 0) {
        logRunError(id, "run %s: %s", id, err.message);
        path[0] = '\0';
    }
    logRunError(id, "run %s hung: the %s phase has lasted %.1f s (deadline %.1f s) at step %lld; stacks in %s", id,
             phase_name, age, deadline, (long long)step, path[0] ? path : "(not written)");
    if (ranks[0]) logLines(LOG_LVL_ERR, "  ", ranks);
    logLines(LOG_LVL_ERR, "  ", stacks);
    free(stacks);
    if (dump_path) snprintf(dump_path, cap, "%s", path);

    pthread_mutex_lock(&svc->lock);
    run = runsFind(svc->runs, id);
    /* still the same stuck phase of the same run: while the stacks were
     * taken the phase may have ended, or the run restarted on this trainer
     * (runJob clears hang_flagged_since) - then the dump stays, as a
     * record, but nothing is marked hung and nobody exits */
    const int still = run && !strcmp(t->active_id, id) && t->hang_flagged_since == since &&
                      atomic_load(&mon->phase_since_ns) == since;
    if (!still) {
        pthread_mutex_unlock(&svc->lock);
        logRunWarn(id, "run %s: the %s phase ended while its stacks were taken; not marked hung",
                   id, phase_name);
        return 0;
    }
    snprintf(run->anomaly, sizeof run->anomaly, "hang:%s", phase_name);
    snprintf(t->last_dump, sizeof t->last_dump, "%s", path);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "phase", phase_name);
    cJSON_AddNumberToObject(d, "seconds", age);
    cJSON_AddNumberToObject(d, "deadline", deadline);
    cJSON_AddStringToObject(d, "dump", path);
    cJSON_AddStringToObject(d, "policy", policy == HANG_EXIT ? "exit" : "report");
    char *detail = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    if (runsAddEvent(run, "hang", step, detail, &err) != 0) logRunWarn(id, "run %s: %s", id, err.message);
    free(detail);
    t->state_before_hang = run->state;
    if (runsSetState(run, RUN_HUNG, &err) != 0) logRunWarn(id, "run %s: %s", id, err.message);
    atomic_fetch_add(&svc->hangs_total, 1);
    pthread_mutex_unlock(&svc->lock);

    if (policy == HANG_EXIT) {
        logError("watchdog policy is exit: stopping nsad so that systemd restarts it and the run resumes");
        char status[160];
        snprintf(status, sizeof status, "STATUS=run %s hung in %s; exiting for a restart", id, phase_name);
        sdNotify(status);
        _exit(WATCHDOG_EXIT_HUNG);
    }
    return 1;
}

int watchdogCheck(Service *svc, int64_t now_ns, char *dump_path, size_t cap) {
    int flagged = 0;
    for (int i = 0; i < svc->n_trainers; i++)
        flagged |= checkTrainer(&svc->trainers[i], now_ns, flagged ? NULL : dump_path, cap);
    return flagged;
}

/* sdNotify, logging the first failure (systemd then sees no pings). */
static void notify(Watchdog *wd, const char *state) {
    if (sdNotify(state) < 0 && !wd->warned_notify) {
        logWarn("sd_notify to $NOTIFY_SOCKET failed: %s", strerror(errno));
        wd->warned_notify = 1;
    }
}

/* WATCHDOG=1 only while both loops are alive; STATUS= every few seconds. */
static void tellSystemd(Watchdog *wd, int64_t now) {
    Service *svc = wd->svc;
    if (wd->sd_usec && now - wd->last_ping_ns >= (int64_t)wd->sd_usec * 1000 / 3) {
        int64_t http_age = now - atomic_load(&svc->http_tick_ns);
        /* every trainer: a busy one not hung, an idle one looping */
        int trainer_ok = 1;
        pthread_mutex_lock(&svc->lock);
        for (int i = 0; i < svc->n_trainers; i++) {
            const ServiceTrainer *t = &svc->trainers[i];
            if (atomic_load(&t->busy) ? t->hang_flagged_since != 0
                                      : now - atomic_load(&t->tick_ns) >= TRAINER_IDLE_SILENCE_NS)
                trainer_ok = 0;
        }
        pthread_mutex_unlock(&svc->lock);
        int64_t http_limit = (int64_t)wd->sd_usec * 500; /* half systemd's interval, in ns */
        int http_ok = http_age < (http_limit < HTTP_SILENCE_NS ? http_limit : HTTP_SILENCE_NS);
        if (trainer_ok && http_ok) {
            notify(wd, "WATCHDOG=1");
            wd->last_ping_ns = now;
            wd->warned_no_ping = 0;
        } else if (!wd->warned_no_ping) {
            logWarn("not pinging systemd's watchdog: %s",
                    !http_ok ? "the HTTP thread is silent" : "a trainer is hung");
            wd->warned_no_ping = 1;
        }
    }
    if (now - wd->last_status_ns >= STATUS_EVERY_NS) {
        char status[256];
        pthread_mutex_lock(&svc->lock);
        /* the newest active run, and how many others train beside it */
        const Run *run = NULL;
        int n_active = 0;
        for (size_t i = svc->runs->n_runs; i-- > 0;)
            if (serviceTrainerOf(svc, svc->runs->runs[i]->id)) {
                if (!run) run = svc->runs->runs[i];
                n_active++;
            }
        char others[48] = "";
        if (n_active > 1) snprintf(others, sizeof others, " (+%d more active)", n_active - 1);
        if (run)
            snprintf(status, sizeof status, "STATUS=run %s %s step %lld/%lld loss %.4f %.0f tok/s%s", run->id,
                     runStateName(run->state), (long long)run->step, (long long)run->total_steps,
                     isfinite(run->loss) ? run->loss : 0.0,
                     isfinite(run->toks_per_s) ? run->toks_per_s : 0.0, others);
        else
            snprintf(status, sizeof status, "STATUS=idle, %zu runs stored", svc->runs->n_runs);
        pthread_mutex_unlock(&svc->lock);
        notify(wd, status);
        wd->last_status_ns = now;
    }
}

static void *watchdogThread(void *arg) {
    Watchdog *wd = arg;
    if (stackdumpRegisterThread("watchdog") != 0)
        logWarn("the watchdog thread is not in stack dumps: %s", strerror(errno));
    while (!atomic_load(&wd->stop)) {
        int64_t now = clockMonotonicNs();
        watchdogCheck(wd->svc, now, NULL, 0);
        tellSystemd(wd, now);
        struct timespec nap = {0, TICK_NS};
        nanosleep(&nap, NULL);
    }
    stackdumpUnregisterThread();
    return NULL;
}

Watchdog *watchdogStart(Service *svc, NsaError *err) {
    Watchdog *wd = calloc(1, sizeof *wd);
    if (!wd) {
        nsaErrorf(err, "out of memory");
        return NULL;
    }
    wd->svc = svc;
    wd->sd_usec = sdWatchdogUsec();
    if (wd->sd_usec) logInfo("systemd watchdog: pinging every %.1f s", (double)wd->sd_usec / 3e6);
    int rc = pthread_create(&wd->thread, NULL, watchdogThread, wd);
    if (rc != 0) {
        nsaErrorf(err, "cannot start the watchdog thread: %s", strerror(rc));
        free(wd);
        return NULL;
    }
    return wd;
}

void watchdogStop(Watchdog *wd) {
    if (!wd) return;
    atomic_store(&wd->stop, 1);
    pthread_join(wd->thread, NULL);
    free(wd);
}
