/* scheduler.c - claims and the run scheduler; see scheduler.h. Every
 * function works on the Service's state: its callers hold svc->lock unless
 * scheduler.h says the function takes it. */
#include "scheduler.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"
#include "log.h"

/* ---- claims (pure) ---------------------------------------------------------------- */

int claimsOverlap(ServiceClaim a, ServiceClaim b) {
    return (a.gpus & b.gpus) != 0 || (a.cpu && b.cpu);
}

void claimsAdd(ServiceClaim *into, ServiceClaim c) {
    into->gpus |= c.gpus;
    into->cpu |= c.cpu;
}

ServiceClaim claimsOfOrdinals(const int *ordinals, int n) {
    ServiceClaim c = {0};
    if (n < 0) c.cpu = 1;
    for (int i = 0; i < n; i++)
        if (ordinals[i] >= 0 && ordinals[i] < SERVICE_MAX_GPUS)
            c.gpus |= (uint64_t)1 << ordinals[i];
    return c;
}

/* ---- what runs claim and hold -------------------------------------------------------- */

ServiceClaim schedulerClaimOfConfig(Service *svc, const JobConfig *cfg) {
    if (cfg->runtime.device != NSA_DEVICE_CUDA) return claimsOfOrdinals(NULL, -1);
    const int gpus = svc->devices.cuda_built ? svc->devices.cuda_devices : 0;
    int ordinals[TRAIN_MAX_RANKS];
    NsaError err;
    const int n = trainerResolveGpus(&cfg->runtime, gpus, ordinals, &err);
    return claimsOfOrdinals(ordinals, n > 0 ? n : 0);
}

ServiceClaim schedulerClaimOf(Service *svc, Run *run) {
    if (!run->claim_known) {
        ServiceClaim c = {0};
        JobConfig *cfg = malloc(sizeof *cfg);
        NsaError err;
        if (cfg && run->config_yaml) {
            configDefaults(cfg);
            if (configLoadString(cfg, run->config_yaml, strlen(run->config_yaml), &err) == 0) {
                const int gpus = svc->devices.cuda_built ? svc->devices.cuda_devices : 0;
                if (cfg->runtime.device_auto) {
                    c.cpu = 1;
                    c.gpus = gpus >= SERVICE_MAX_GPUS ? ~(uint64_t)0 : ((uint64_t)1 << gpus) - 1;
                } else {
                    c = schedulerClaimOfConfig(svc, cfg);
                }
            }
        }
        free(cfg);
        run->claim_gpus = c.gpus;
        run->claim_cpu = c.cpu;
        run->claim_known = 1;
    }
    return (ServiceClaim){.gpus = run->claim_gpus, .cpu = run->claim_cpu};
}

ServiceClaim schedulerHeldClaims(Service *svc) {
    ServiceClaim held = {0};
    for (int i = 0; i < svc->n_trainers; i++)
        if (svc->trainers[i].active_id[0]) claimsAdd(&held, svc->trainers[i].claim);
    return held;
}

ServiceTrainer *schedulerIdleTrainer(Service *svc) {
    for (int i = 0; i < svc->n_trainers; i++)
        if (!svc->trainers[i].active_id[0]) return &svc->trainers[i];
    return NULL;
}

ServiceTrainer *schedulerTrainerFor(Service *svc, ServiceClaim c) {
    if (claimsOverlap(c, schedulerHeldClaims(svc))) return NULL;
    ServiceClaim queued = {0};
    for (size_t i = 0; i < svc->runs->n_runs; i++)
        if (svc->runs->runs[i]->state == RUN_QUEUED)
            claimsAdd(&queued, schedulerClaimOf(svc, svc->runs->runs[i]));
    return claimsOverlap(c, queued) ? NULL : schedulerIdleTrainer(svc);
}

int schedulerPickGpu(Service *svc) {
    const int n = svc->devices.cuda_built ? svc->devices.cuda_devices : 0;
    pthread_mutex_lock(&svc->lock);
    const ServiceClaim held = schedulerHeldClaims(svc);
    pthread_mutex_unlock(&svc->lock);
    for (int g = (n < SERVICE_MAX_GPUS ? n : SERVICE_MAX_GPUS) - 1; g >= 0; g--)
        if (!(held.gpus & ((uint64_t)1 << g))) return g;
    return n > 0 ? n - 1 : 0;
}

/* ---- the hand-off ------------------------------------------------------------------ */

void schedulerAssign(ServiceTrainer *t, Run *run, int resume) {
    Service *svc = t->svc;
    snprintf(t->active_id, sizeof t->active_id, "%s", run->id);
    t->claim = schedulerClaimOf(svc, run);
    inferReleaseGpus(svc->infer, t->claim.gpus); /* a kept sample model gives them back */
    t->pending = resume ? SERVICE_PENDING_RESUME : SERVICE_PENDING_START;
    t->user_halt = 0;
    atomic_store(&t->mon.halt_requested, 0);
    atomic_store(&t->mon.stop_now, 0);
    atomic_store(&t->mon.abort_requested, 0);
    atomic_store(&t->mon.step, run->step);
    trainMonitorEnter(&t->mon, PHASE_STARTING);
    atomic_store(&t->busy, 1);
    pthread_cond_broadcast(&svc->wake);
}

void schedulerStartQueued(Service *svc) {
    if (svc->shutting_down) return;
    Run **queue = NULL;
    size_t n = 0;
    if (runsQueue(svc->runs, &queue, &n) != 0) {
        logWarn("the scheduler is out of memory; the queue waits for the next try");
        return;
    }
    ServiceClaim held = schedulerHeldClaims(svc), ahead = {0};
    for (size_t i = 0; i < n; i++) {
        Run *run = queue[i];
        const ServiceClaim c = schedulerClaimOf(svc, run);
        ServiceTrainer *t =
            claimsOverlap(c, held) || claimsOverlap(c, ahead) ? NULL : schedulerIdleTrainer(svc);
        if (!t) { /* it waits, and those behind it leave what it wants alone */
            claimsAdd(&ahead, c);
            continue;
        }
        const int resume = run->queue_resume;
        run->queue_resume = 0;
        serviceAddEvent(run, "dequeued", run->step,
                        resume ? "{\"resume\":true}" : "{\"resume\":false}");
        serviceSaveState(run, RUN_STARTING); /* it leaves the queue */
        schedulerAssign(t, run, resume);
        claimsAdd(&held, c);
        logRunNotice(run->id, "run %s: its turn in the queue came; %s", run->id,
                     resume ? "resuming from its latest checkpoint" : "starting");
    }
    free(queue);
}

ServiceStatus schedulerBusy(Service *svc, ServiceClaim c, NsaError *err) {
    for (int i = 0; i < svc->n_trainers; i++) {
        ServiceTrainer *t = &svc->trainers[i];
        Run *run = t->active_id[0] ? runsFind(svc->runs, t->active_id) : NULL;
        if (run && claimsOverlap(c, t->claim))
            return serviceFail(
                err, SVC_BUSY, "run %s (%s) holds %s this run needs; halt it first or wait",
                run->id, runStateName(run->state), c.cpu ? "the CPU engine" : "GPUs");
    }
    if (!schedulerIdleTrainer(svc))
        return serviceFail(err, SVC_BUSY, "every trainer is busy; halt a run first or wait");
    const int waiting = runsQueueLength(svc->runs);
    return serviceFail(err, SVC_BUSY,
                       "%d queued run%s wait%s for what this run needs; wait or queue it", waiting,
                       waiting == 1 ? "" : "s", waiting == 1 ? "s" : "");
}
