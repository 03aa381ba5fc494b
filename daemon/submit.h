/* submit.h - what a job config must pass before it becomes a run: the
 * submit query's overrides (?nodes=, ?gpus=) applied through the config
 * loader, the checks against this nsad (its devices, the data files it can
 * read, the CUDA memory plan against the GPUs' free memory) and
 * train.init_from resolved to one checkpoint directory. serviceSubmitRun
 * and serviceJoin (service.c) call them on the HTTP thread before any run
 * exists; none holds svc->lock across its slow work (file access, the
 * memory plan), each takes it briefly where it reads the Service. */
#ifndef NSAD_SUBMIT_H
#define NSAD_SUBMIT_H

#include "config.h"
#include "service.h"

/* Sets cfg's runtime.nodes from "HOST:PORT,..." (the API's ?nodes=),
 * through the config loader: the value gets the config file's checks and
 * the whole config is validated again. Returns 0, or -1 with err (cfg
 * unchanged). */
int submitSetNodes(JobConfig *cfg, const char *nodes, NsaError *err);
/* Sets cfg's runtime.gpus from the API's ?gpus=: what the config file
 * takes (all, a count, [0, 2]) or ordinals separated by commas ("0,2": a
 * list), through the loader like submitSetNodes. Returns 0, or -1 with
 * err (cfg unchanged). */
int submitSetGpus(JobConfig *cfg, const char *gpus, NsaError *err);

/* Refuses (SVC_INVALID_CONFIG with err) what this nsad cannot run - the
 * checks serviceCreateRun lists: runtime.device cuda without a usable GPU,
 * GPUs that do not resolve, a data.path or data.val_path nsad cannot read,
 * a CUDA job whose memory plan exceeds a GPU's free memory (checked only
 * while no run holds those GPUs) - and pins runtime.device auto to what
 * this nsad has (cuda with a usable GPU, else cpu) in cfg. other_ranks:
 * the job's ranks on other nodes, at least (each node of runtime.nodes
 * brings one or more; a member's coordinator one or more), for the memory
 * plan's sharding of the optimizer. Returns SVC_OK or SVC_INVALID_CONFIG.
 * Takes the lock briefly. */
ServiceStatus submitCheckRunnable(Service *svc, JobConfig *cfg, int other_ranks, NsaError *err);

/* Resolves cfg's train.init_from (a run of this nsad by its id, or a
 * checkpoint directory or run out_dir by path; relative paths against
 * nsad's working directory) now, in place, to the absolute path of one
 * checkpoint directory, so that a queued run starts from the checkpoint
 * that was the latest when it was submitted, whatever its source run
 * writes meanwhile. The checkpoint's model config and tensors are read
 * (weightsOpenUnverified: the trainer checks the checksums when it loads
 * them) and its sizes must fit the job's model and tokenizer
 * (weightsFitJob). An empty init_from is SVC_OK, nothing done. Returns
 * SVC_OK, SVC_INVALID_CONFIG (err names init_from and why) or
 * SVC_INTERNAL (out of memory). For this node's own runs only: a member
 * node of a multi-node job is not asked, its coordinator reads the files.
 * Takes the lock briefly. */
ServiceStatus submitResolveInitFrom(Service *svc, JobConfig *cfg, NsaError *err);

#endif
