/* scheduler.h - which run trains where: what each run claims (GPU ordinals
 * or the CPU engine, a ServiceClaim), what the trainers' runs hold, and the
 * hand-off of a run to an idle trainer - at once when it is submitted or
 * resumed and its claim is free, else from the queue in queue order (the
 * rule: service.h, "Claims").
 *
 * The state is the Service's: its trainers' claims, the registry's queue
 * and each run's cached claim. Functions that read or change it expect the
 * caller to hold svc->lock unless their comment says they take it; the
 * claims* functions are pure. */
#ifndef NSAD_SCHEDULER_H
#define NSAD_SCHEDULER_H

#include "service.h"

/* 1 when a and b share a GPU or both claim the CPU engine, else 0. Pure. */
int claimsOverlap(ServiceClaim a, ServiceClaim b);
/* Adds c's GPUs and CPU engine to *into. Pure. */
void claimsAdd(ServiceClaim *into, ServiceClaim c);
/* What a CUDA job on the n GPU ordinals claims (ordinals outside
 * 0..SERVICE_MAX_GPUS-1 left out), or with n < 0 (ordinals unused) what a
 * CPU job claims: the CPU engine. Pure. */
ServiceClaim claimsOfOrdinals(const int *ordinals, int n);

/* What the job cfg (runtime.device pinned, not auto) claims: a CUDA job
 * its runtime.gpus resolved against svc's devices (nothing when they do
 * not resolve), a CPU job the CPU engine. Reads only what is set before
 * the HTTP thread starts: no lock needed. Cannot fail. */
ServiceClaim schedulerClaimOfConfig(Service *svc, const JobConfig *cfg);
/* What run claims, worked out from its config once and cached in the run
 * (run->claim_*). A config that no longer resolves (a GPU gone), or no
 * memory to load it, claims nothing: the run starts and fails with the
 * config's error. A device still "auto" (a run from before submissions
 * pinned it) claims every GPU and the CPU engine. Caller holds the lock.
 * Cannot fail. */
ServiceClaim schedulerClaimOf(Service *svc, Run *run);
/* What the trainers' runs hold now. Caller holds the lock. */
ServiceClaim schedulerHeldClaims(Service *svc);
/* An idle trainer (holding no run), or NULL when all are busy. Caller
 * holds the lock. */
ServiceTrainer *schedulerIdleTrainer(Service *svc);
/* The idle trainer a run submitted now (new or resumed) claiming c may
 * take at once: c is free and no queued run wants any of it. NULL when it
 * must wait (or queue). Caller holds the lock. */
ServiceTrainer *schedulerTrainerFor(Service *svc, ServiceClaim c);
/* The GPU a sample or eval job should use: the highest-numbered one no run
 * claims (runs given a GPU count take the lowest), else the highest; 0
 * without GPUs. Takes the lock. Cannot fail. */
int schedulerPickGpu(Service *svc);

/* Hands run to t (idle): t holds it and its claim (a kept inference model
 * gives those GPUs back), its monitor is reset to the run's step and
 * phase starting, and the trainer threads are woken; t's thread starts
 * the job (resume: from its latest checkpoint). The caller has already
 * set the run's state (starting). Caller holds the lock. Cannot fail. */
void schedulerAssign(ServiceTrainer *t, Run *run, int resume);
/* The scheduler's pass: queued runs, in queue order, take idle trainers
 * while their claims are free and no run before them wants what they
 * claim; each one that starts gets a "dequeued" event and state starting.
 * Does nothing once serviceShutdown began. Out of memory: logged, the
 * queue waits for the next pass. The trainer threads run it on every
 * wake-up. Caller holds the lock. */
void schedulerStartQueued(Service *svc);
/* SVC_BUSY with err naming what a run claiming c waits for: the run
 * holding part of it, else no idle trainer, else the queued runs before
 * it. Caller holds the lock. */
ServiceStatus schedulerBusy(Service *svc, ServiceClaim c, NsaError *err);

#endif
