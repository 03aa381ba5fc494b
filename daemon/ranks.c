/* ranks.c - the data-parallel ranks of a job on this node; see ranks.h.
 *
 * Dispatch: the controller posts (fn, arg, which ranks) under a new
 * generation number and waits on `finished`; each targeted worker runs fn
 * and reports. The group is freed by whoever drops the last reference: the
 * controller and every worker hold one, so that an abandoned worker (one
 * that did not return in time) can still report, free its model and
 * transport handle, and leave, long after rankGroupFree. */
#include "ranks.h"
#include "clockutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "stackdump.h"

typedef struct RankWorker {
    struct RankGroup *g;
    int local;
    pthread_t thread;
    int started;
    NsaModel *model;
    NsaComm *comm;
    /* the current dispatch, under g->mu */
    int targeted;      /* it is one of the dispatch's ranks */
    int reported;      /* it has finished its part */
    int busy;          /* running fn */
    int rc;
    NsaError err;
    int end_phase;     /* its phase when fn returned (TrainPhase) */
    int abandoned;     /* the controller gave up waiting for it */
    int stopped;       /* returned RANK_STOPPED: answers no more */
} RankWorker;

struct RankGroup {
    pthread_mutex_t mu;
    pthread_cond_t work;      /* a dispatch (or quit) for the workers */
    pthread_cond_t finished;  /* a worker finished its part */
    RankGroupConfig cfg;
    int refs;                 /* the controller + live workers */
    int quit;
    uint64_t gen;             /* dispatches so far */
    RankFn fn;
    void *arg;
    int target;               /* -1: every rank, else one local rank */
    int pending;              /* targeted workers that have not reported */
    int broken;               /* a worker was abandoned: no more dispatches */
    void (*release)(void *);  /* rankGroupFreeThen's: run when the last reference goes */
    void *release_ctx;
    char abort_reason[256];
    int aborted;              /* this dispatch was aborted: a failure, mon->abort_requested */
    NsaComm *local_comms[RANKS_MAX];  /* CPU: the in-process transport's handles */
    RankWorker workers[RANKS_MAX];
};

/* Drops one reference; the last frees the group. Called with g->mu held;
 * returns with it released (and g possibly gone). */
static void releaseLocked(RankGroup *g) {
    const int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    void (*release)(void *) = g->release;
    void *release_ctx = g->release_ctx;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->work);
    pthread_cond_destroy(&g->finished);
    free(g);
    if (release) release(release_ctx);
}

static RankCtx ctxOf(RankWorker *w) {
    const RankGroupConfig *c = &w->g->cfg;
    RankCtx rc = {
        .local = w->local,
        .rank = c->first + w->local,
        .world = c->world,
        .ordinal = c->engine.device == NSA_DEVICE_CUDA ? c->ordinals[w->local] : -1,
        .model = w->model,
        .comm = w->comm,
        .mon = c->mon,
    };
    return rc;
}

/* The worker's own set-up, its first dispatch: its transport handle (NCCL
 * is made here, on the rank's thread and device, as every rank of the job
 * joins at once) and its model. */
static int setupRank(const RankCtx *rc, void *arg, NsaError *err) {
    RankWorker *w = arg;
    RankGroup *g = w->g;
    const RankGroupConfig *c = &g->cfg;
    if (c->world > 1) {
        if (c->engine.device == NSA_DEVICE_CUDA || c->have_comm_id) {
            NsaComm *comm = c->engine.device == NSA_DEVICE_CUDA
                                ? nsaCommNcclCreate(&c->comm_id, rc->rank, c->world, rc->ordinal,
                                                    c->timeout, err)
                                : nsaCommTcpCreate(&c->comm_id, rc->rank, c->world, c->timeout, err);
            if (!comm) return -1;
            pthread_mutex_lock(&g->mu); /* abortLocked reads it (the controller's thread) */
            w->comm = comm;
            pthread_mutex_unlock(&g->mu);
        } else {
            pthread_mutex_lock(&g->mu);
            w->comm = g->local_comms[w->local];
            g->local_comms[w->local] = NULL; /* the worker owns it now */
            pthread_mutex_unlock(&g->mu);
        }
    }
    NsaEngineOptions eo = c->engine;
    eo.device_ordinal = rc->ordinal < 0 ? 0 : rc->ordinal;
    eo.comm = w->comm;
    w->model = nsaModelCreate(&c->model, &eo, err);
    return w->model ? 0 : -1;
}

static void *workerMain(void *p) {
    RankWorker *w = p;
    RankGroup *g = w->g;
    char name[32];
    snprintf(name, sizeof name, "rank %d", g->cfg.first + w->local);
    if (stackdumpRegisterThread(name) != 0)
        logWarn("%s: not in stack dumps: %s", name, strerror(errno));
    /* with several runs training at once, a rank's lines name its run */
    logBindRun(g->cfg.run_id);
    pthread_mutex_lock(&g->mu);
    uint64_t seen = 0;
    for (;;) {
        while (!g->quit && g->gen == seen) pthread_cond_wait(&g->work, &g->mu);
        if (g->quit) break;
        seen = g->gen;
        if (w->stopped || (g->target >= 0 && g->target != w->local)) continue;
        RankFn fn = g->fn;
        void *arg = g->fn == setupRank ? (void *)w : g->arg;
        w->busy = 1;
        pthread_mutex_unlock(&g->mu);
        NsaError err = {{0}};
        const RankCtx rc = ctxOf(w);
        int ret = fn(&rc, arg, &err);
        const int end_phase = g->cfg.mon ? atomic_load(&g->cfg.mon->rank_phase[w->local]) : PHASE_IDLE;
        trainMonitorRankEnter(g->cfg.mon, w->local, PHASE_IDLE);
        pthread_mutex_lock(&g->mu);
        w->end_phase = end_phase;
        w->busy = 0;
        if (ret == RANK_STOPPED) {
            /* as a dead rank: no report; only the group's end wakes it */
            w->stopped = 1;
            pthread_cond_broadcast(&g->finished);
            continue;
        }
        w->rc = ret;
        w->err = err;
        if (!w->abandoned) {
            w->reported = 1;
            g->pending--;
        }
        pthread_cond_broadcast(&g->finished);
    }
    /* leaving: the model before the transport it uses */
    NsaModel *model = w->model;
    NsaComm *comm = w->comm;
    w->model = NULL;
    w->comm = NULL;
    pthread_mutex_unlock(&g->mu);
    nsaModelFree(model);
    nsaCommFree(comm);
    stackdumpUnregisterThread();
    pthread_mutex_lock(&g->mu);
    releaseLocked(g);
    return NULL;
}

/* Aborts every local transport. Called with g->mu held. */
static void abortLocked(RankGroup *g, const char *reason) {
    if (!g->aborted) snprintf(g->abort_reason, sizeof g->abort_reason, "%s", reason);
    g->aborted = 1;
    for (int r = 0; r < g->cfg.local; r++) {
        if (g->workers[r].comm) nsaCommAbort(g->workers[r].comm, reason);
        if (g->local_comms[r]) nsaCommAbort(g->local_comms[r], reason);
    }
    pthread_cond_broadcast(&g->finished);
}

/* The job-wide rank and phase of local rank r, for messages: the phase it
 * failed in, or the one it is still in. Called with g->mu held. */
static void describeRank(const RankGroup *g, int r, char *out, size_t cap) {
    TrainMonitor *mon = g->cfg.mon;
    const RankWorker *w = &g->workers[r];
    if (!mon) {
        snprintf(out, cap, "rank %d", g->cfg.first + r);
        return;
    }
    if (w->reported) {
        snprintf(out, cap, "rank %d (in %s)", g->cfg.first + r, trainPhaseName((TrainPhase)w->end_phase));
        return;
    }
    const int64_t since = atomic_load(&mon->rank_since_ns[r]);
    const int64_t now = clockMonotonicNs();
    snprintf(out, cap, "rank %d (in %s for %.1f s)", g->cfg.first + r,
             trainPhaseName((TrainPhase)atomic_load(&mon->rank_phase[r])),
             since > 0 && now > since ? (double)(now - since) * 1e-9 : 0.0);
}

/* Posts a dispatch and waits; see rankGroupRun. */
static int dispatch(RankGroup *g, int target, RankFn fn, void *arg, NsaError *err) {
    pthread_mutex_lock(&g->mu);
    if (g->broken) {
        pthread_mutex_unlock(&g->mu);
        return nsaErrorf(err, "the job's ranks are broken (%s); no more work runs on them",
                         g->abort_reason);
    }
    g->fn = fn;
    g->arg = arg;
    g->target = target;
    g->aborted = 0;
    g->pending = 0;
    for (int r = 0; r < g->cfg.local; r++) {
        RankWorker *w = &g->workers[r];
        w->rc = 0;
        w->err.message[0] = '\0';
        w->targeted = target < 0 || target == r;
        w->reported = 0;
        if (w->targeted) g->pending++;
    }
    g->gen++;
    pthread_cond_broadcast(&g->work);

    int first_failed = -1;
    double grace_until = 0;
    TrainMonitor *mon = g->cfg.mon;
    while (g->pending > 0) {
        /* the first failure (or an abort from outside) aborts every
         * transport; from then on the others have the grace period */
        if (first_failed < 0)
            for (int r = 0; r < g->cfg.local; r++)
                if (g->workers[r].rc != 0 && !g->workers[r].busy) {
                    first_failed = r;
                    break;
                }
        if (mon && atomic_load(&mon->abort_requested) && !g->aborted)
            abortLocked(g, "the watchdog aborted the job (a phase overran its deadline)");
        if ((first_failed >= 0 || g->aborted) && grace_until == 0) {
            char why[600];
            if (first_failed >= 0)
                snprintf(why, sizeof why, "rank %d failed: %s", g->cfg.first + first_failed,
                         g->workers[first_failed].err.message);
            else
                snprintf(why, sizeof why, "%s", g->abort_reason);
            if (g->cfg.on_failure) { /* stacks first, while the stuck are still stuck */
                pthread_mutex_unlock(&g->mu);
                g->cfg.on_failure(g->cfg.failure_ctx, why);
                pthread_mutex_lock(&g->mu);
            }
            if (!g->aborted) abortLocked(g, why);
            grace_until = clockMonotonicSeconds() + g->cfg.timeout + 5.0;
        }
        if (grace_until > 0 && clockMonotonicSeconds() > grace_until) break;
        /* the ranks still owed are all stopped: nobody can report any more */
        int alive = 0;
        for (int r = 0; r < g->cfg.local; r++)
            alive += g->workers[r].targeted && !g->workers[r].reported && !g->workers[r].stopped;
        if (alive == 0) break;
        const struct timespec until = clockRealtimeAfterMs(100);
        pthread_cond_timedwait(&g->finished, &g->mu, &until);
    }

    int rc = 0;
    char msg[sizeof err->message] = "";
    size_t used = 0;
    /* the root cause: a failure of its own, not the abort that spread it */
    for (int r = 0; r < g->cfg.local; r++)
        if (g->workers[r].rc != 0 && g->workers[r].reported &&
            !strstr(g->workers[r].err.message, "the transport was aborted")) {
            first_failed = r;
            break;
        }
    if (first_failed < 0)
        for (int r = 0; r < g->cfg.local; r++)
            if (g->workers[r].rc != 0 && !g->workers[r].busy) {
                first_failed = r;
                break;
            }
    if (first_failed >= 0) {
        char who[96];
        describeRank(g, first_failed, who, sizeof who);
        used = (size_t)snprintf(msg, sizeof msg, "%s: %s", who, g->workers[first_failed].err.message);
        rc = -1;
    } else if (g->aborted) {
        used = (size_t)snprintf(msg, sizeof msg, "%s", g->abort_reason);
        rc = -1;
    }
    /* who never came back */
    for (int r = 0; r < g->cfg.local && g->pending > 0; r++) {
        RankWorker *w = &g->workers[r];
        if (!w->targeted || w->reported || w->abandoned) continue;
        w->abandoned = 1;
        g->broken = 1;
        char who[96];
        describeRank(g, r, who, sizeof who);
        if (used < sizeof msg)
            used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%s %s: abandoned",
                                     used ? "; " : "", who,
                                     w->stopped ? "stopped answering" : "did not return after the abort");
        rc = -1;
    }
    if (g->broken && !g->abort_reason[0])
        snprintf(g->abort_reason, sizeof g->abort_reason, "a rank was abandoned");
    pthread_mutex_unlock(&g->mu);
    if (rc) nsaErrorf(err, "%s", msg);
    return rc;
}

int rankGroupBroken(RankGroup *g) {
    if (!g) return 0;
    pthread_mutex_lock(&g->mu);
    const int broken = g->broken;
    pthread_mutex_unlock(&g->mu);
    return broken;
}

int rankGroupRun(RankGroup *g, RankFn fn, void *arg, NsaError *err) {
    if (!g || !fn) return nsaErrorf(err, "rankGroupRun: no group or function");
    return dispatch(g, -1, fn, arg, err);
}

int rankGroupRunOne(RankGroup *g, int local, RankFn fn, void *arg, NsaError *err) {
    if (!g || !fn) return nsaErrorf(err, "rankGroupRunOne: no group or function");
    if (local < 0 || local >= g->cfg.local)
        return nsaErrorf(err, "rankGroupRunOne: local rank %d; allowed: 0 to %d", local,
                         g->cfg.local - 1);
    return dispatch(g, local, fn, arg, err);
}


NsaModel *rankGroupModel(RankGroup *g, int local) {
    if (!g || local < 0 || local >= g->cfg.local) return NULL;
    return g->workers[local].model;
}

void rankGroupFreeThen(RankGroup *g, void (*release)(void *ctx), void *ctx) {
    if (!g) {
        if (release) release(ctx);
        return;
    }
    pthread_mutex_lock(&g->mu);
    g->release = release;
    g->release_ctx = ctx;
    pthread_mutex_unlock(&g->mu);
    rankGroupFree(g);
}

void rankGroupFree(RankGroup *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->quit = 1;
    pthread_cond_broadcast(&g->work);
    for (int r = 0; r < g->cfg.local; r++)
        if (g->local_comms[r]) { /* never handed to a worker */
            nsaCommFree(g->local_comms[r]);
            g->local_comms[r] = NULL;
        }
    pthread_mutex_unlock(&g->mu);
    for (int r = 0; r < g->cfg.local; r++) {
        RankWorker *w = &g->workers[r];
        if (!w->started) continue;
        if (w->abandoned) pthread_detach(w->thread); /* it cleans up when it returns */
        else pthread_join(w->thread, NULL);
    }
    if (g->cfg.mon) atomic_store(&g->cfg.mon->n_ranks, 0);
    pthread_mutex_lock(&g->mu);
    releaseLocked(g);
}

RankGroup *rankGroupCreate(const RankGroupConfig *cfg, NsaError *err) {
    if (!cfg || cfg->local < 1 || cfg->local > RANKS_MAX || cfg->first < 0 ||
        cfg->world < cfg->first + cfg->local) {
        nsaErrorf(err, "rankGroupCreate: %d local ranks from rank %d of %d; allowed: 1 to %d local "
                       "ranks within the job", cfg ? cfg->local : 0, cfg ? cfg->first : 0,
                  cfg ? cfg->world : 0, RANKS_MAX);
        return NULL;
    }
    RankGroup *g = calloc(1, sizeof *g);
    if (!g) {
        nsaErrorf(err, "out of memory for the job's ranks");
        return NULL;
    }
    g->cfg = *cfg;
    if (!(g->cfg.timeout > 0)) g->cfg.timeout = 300;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->work, NULL);
    pthread_cond_init(&g->finished, NULL);
    g->refs = 1;
    if (cfg->world > 1) {
        if (cfg->engine.device == NSA_DEVICE_CUDA) {
            if (!cfg->have_comm_id && nsaCommNcclUniqueId(&g->cfg.comm_id, err)) {
                rankGroupFree(g);
                return NULL;
            }
        } else if (cfg->have_comm_id) {
            /* CPU ranks on several nodes: the TCP transport, made by each worker */
        } else if (cfg->first != 0 || cfg->world != cfg->local) {
            nsaErrorf(err, "%d of the job's %d CPU ranks here and no TCP transport id", cfg->local,
                      cfg->world);
            rankGroupFree(g);
            return NULL;
        } else if (nsaCommLocalCreate(cfg->local, g->cfg.timeout, g->local_comms, err)) {
            rankGroupFree(g);
            return NULL;
        }
    }
    if (cfg->mon) {
        atomic_store(&cfg->mon->rank_first, cfg->first);
        for (int r = 0; r < cfg->local; r++) trainMonitorRankEnter(cfg->mon, r, PHASE_STARTING);
        atomic_store(&cfg->mon->n_ranks, cfg->local);
    }
    for (int r = 0; r < cfg->local; r++) {
        RankWorker *w = &g->workers[r];
        w->g = g;
        w->local = r;
        pthread_mutex_lock(&g->mu);
        g->refs++;
        pthread_mutex_unlock(&g->mu);
        int e = pthread_create(&w->thread, NULL, workerMain, w);
        if (e != 0) {
            pthread_mutex_lock(&g->mu);
            g->refs--;
            pthread_mutex_unlock(&g->mu);
            nsaErrorf(err, "cannot start the thread of rank %d: %s", cfg->first + r, strerror(e));
            rankGroupFree(g);
            return NULL;
        }
        w->started = 1;
    }
    if (dispatch(g, -1, setupRank, NULL, err) != 0) {
        rankGroupFree(g);
        return NULL;
    }
    return g;
}
