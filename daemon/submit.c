/* submit.c - what a job config must pass before it becomes a run; see
 * submit.h. */
#include "submit.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "scheduler.h"
#include "weights.h"

/* ---- the submit query's overrides ------------------------------------------------------ */

/* Sets runtime.KEY to the YAML flow value `value` over cfg, through the
 * loader so that it gets the config file's checks (and the whole config is
 * validated again with it). */
static int setRuntimeKey(JobConfig *cfg, const char *key, const char *value, NsaError *err) {
    char yaml[CONFIG_MAX_NODES * CONFIG_NODE_MAX + 96];
    const int n = snprintf(yaml, sizeof yaml, "runtime:\n  %s: %s\n", key, value);
    if (n >= (int)sizeof yaml) return nsaErrorf(err, "%s: '%.80s...' is too long", key, value);
    JobConfig *probe = malloc(sizeof *probe);
    if (!probe) return nsaErrorf(err, "out of memory");
    *probe = *cfg;
    const int rc = configLoadString(probe, yaml, (size_t)n, err);
    if (rc == 0) cfg->runtime = probe->runtime;
    free(probe);
    return rc;
}

int submitSetNodes(JobConfig *cfg, const char *nodes, NsaError *err) {
    char quoted[CONFIG_MAX_NODES * CONFIG_NODE_MAX + 8];
    if (strchr(nodes, '"') || strchr(nodes, '\\') ||
        snprintf(quoted, sizeof quoted, "\"%s\"", nodes) >= (int)sizeof quoted)
        return nsaErrorf(err, "nodes: '%.80s' is not a list of HOST:PORT", nodes);
    return setRuntimeKey(cfg, "nodes", quoted, err);
}

int submitSetGpus(JobConfig *cfg, const char *gpus, NsaError *err) {
    char value[320];
    const size_t len = strlen(gpus);
    if (len == 0 || len > 256 || strspn(gpus, "0123456789, []all") != len)
        return nsaErrorf(
            err, "gpus: '%.80s'; allowed: all, a GPU count, or GPU ordinals (0,2 or [0, 2])", gpus);
    snprintf(value, sizeof value, strchr(gpus, ',') && !strchr(gpus, '[') ? "[%s]" : "%s", gpus);
    return setRuntimeKey(cfg, "gpus", value, err);
}

/* ---- checks against this nsad ---------------------------------------------------------- */

/* One data path (key: its config key) names something nsad can read (a
 * glob: at least one file). Relative paths resolve against nsad's working
 * directory, which the message names. */
static ServiceStatus checkReadable(DataSource source, const char *key, const char *path,
                                   NsaError *err) {
    const char *allowed = source == DATA_TEXT ? "a .txt or .jsonl file, or a directory of them"
                                              : "a .bin shard, a directory of them, or a glob";
    char cwd[PATH_MAX] = "", where[PATH_MAX + 64] = "";
    if (path[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(where, sizeof where, " (relative to nsad's working directory %s)", cwd);
    if (source == DATA_SHARDS && strpbrk(path, "*?[")) {
        glob_t g;
        int rc = glob(path, 0, NULL, &g);
        size_t n = rc == 0 ? g.gl_pathc : 0;
        if (rc == 0 || rc == GLOB_NOMATCH) globfree(&g);
        if (n == 0)
            return serviceFail(err, SVC_INVALID_CONFIG,
                               "%s: \"%s\" matches no file%s; allowed: %s (readable "
                               "by nsad)",
                               key, path, where, allowed);
        return SVC_OK;
    }
    if (access(path, R_OK) != 0)
        return serviceFail(err, SVC_INVALID_CONFIG,
                           "%s: \"%s\"%s: %s; allowed: %s (readable by nsad)", key, path, where,
                           errno == ENOENT ? "does not exist" : strerror(errno), allowed);
    return SVC_OK;
}

/* data.path, and data.val_path when set, name something nsad can read. */
static ServiceStatus checkDataPath(const DataConfig *d, NsaError *err) {
    if (d->source == DATA_SYNTHETIC) return SVC_OK;
    const ServiceStatus st = checkReadable(d->source, "data.path", d->path, err);
    if (st != SVC_OK || !d->val_path[0]) return st;
    return checkReadable(d->source, "data.val_path", d->val_path, err);
}

/* A CUDA job's memory plan on each of its GPUs (ordinals, n of them)
 * against that GPU's free memory, for a model that is one of `world`
 * data-parallel ranks (the optimizer's moments sharded over them). */
static ServiceStatus checkFits(Service *svc, const JobConfig *cfg, const int *ordinals, int n,
                               int world, NsaError *err) {
    const TrainConfig *t = &cfg->train;
    char ranks[96] = "";
    if (world > 1)
        snprintf(ranks, sizeof ranks,
                 " (one of %s%d data-parallel ranks, its share of the optimizer)",
                 cfg->runtime.n_nodes > 0 ? "at least " : "", world);
    for (int g = 0; g < n; g++) {
        NsaEngineOptions eo = {.device = NSA_DEVICE_CUDA,
                               .device_ordinal = ordinals[g],
                               .precision = cfg->runtime.precision,
                               .max_batch = t->batch_size,
                               .max_seq_len = t->seq_len,
                               .threads = cfg->runtime.threads,
                               .recompute = cfg->runtime.gradient_checkpointing};
        NsaMemoryReport plan;
        NsaError perr = {""};
        int fits = 0;
        if (svc->memory_plan(&cfg->model, &eo, world, &plan, &fits, &perr) != 0)
            return serviceFail(err, SVC_INVALID_CONFIG,
                               "the CUDA engine cannot plan this job on GPU %d: %s", ordinals[g],
                               perr.message);
        if (plan.total <= plan.device_free) continue;
        const double gb = 1e9;
        if (fits >= t->batch_size) fits = t->batch_size - 1; /* the estimate is not linear in B */
        if (fits < 1)
            return serviceFail(
                err, SVC_INVALID_CONFIG,
                "model: needs %.1f GB of GPU memory per GPU%s (weights, gradients and optimizer "
                "%.1f GB, activations for one sequence of %d tokens and workspace besides) but GPU "
                "%d "
                "has %.1f GB free; allowed: a smaller model (model.dim, model.n_layers) or "
                "train.seq_len",
                (double)plan.total / gb, ranks,
                (double)(plan.params + plan.grads + plan.optimizer) / gb, t->seq_len, ordinals[g],
                (double)plan.device_free / gb);
        return serviceFail(
            err, SVC_INVALID_CONFIG,
            "train.batch_size: %d sequences of %d tokens need %.1f GB of GPU memory per GPU%s "
            "(weights, gradients and optimizer %.1f GB, activations %.1f GB, workspace %.1f GB) "
            "but "
            "GPU %d has %.1f GB free; allowed: train.batch_size up to %d at this seq_len (raise "
            "train.accumulate_grad_batches to keep the tokens per step)",
            t->batch_size, t->seq_len, (double)plan.total / gb, ranks,
            (double)(plan.params + plan.grads + plan.optimizer) / gb, (double)plan.activations / gb,
            (double)plan.workspace / gb, ordinals[g], (double)plan.device_free / gb, fits);
    }
    return SVC_OK;
}

ServiceStatus submitCheckRunnable(Service *svc, JobConfig *cfg, int other_ranks, NsaError *err) {
    RuntimeConfig *rt = &cfg->runtime;
    const int gpus = svc->devices.cuda_built ? svc->devices.cuda_devices : 0;
    if (rt->device_auto) {
        rt->device = gpus > 0 ? NSA_DEVICE_CUDA : NSA_DEVICE_CPU;
        if (rt->precision_auto) rt->precision = configAutoPrecision(rt->device);
        NsaError verr;
        if (configValidate(cfg, &verr) != 0)
            return serviceFail(err, SVC_INVALID_CONFIG, "%s", verr.message);
        rt->device_auto = 0; /* the run's config.yaml says what it runs on */
    }
    if (rt->device == NSA_DEVICE_CUDA && gpus == 0)
        return serviceFail(err, SVC_INVALID_CONFIG,
                           "runtime.device: cuda, but this nsad has no usable GPU (%s); allowed "
                           "here: cpu, or auto "
                           "(which picks cpu)",
                           svc->devices.description);
    int ordinals[TRAIN_MAX_RANKS], n = 0;
    if (rt->device == NSA_DEVICE_CUDA) {
        NsaError gerr;
        if ((n = trainerResolveGpus(rt, gpus, ordinals, &gerr)) < 0)
            return serviceFail(err, SVC_INVALID_CONFIG, "%s", gerr.message);
    }
    ServiceStatus st = checkDataPath(&cfg->data, err);
    if (st != SVC_OK) return st;
    /* a running job holds GPU memory: the plan is made only against GPUs
     * no run holds (a run queued behind one meets the engine's own check
     * when it starts) */
    if (rt->device == NSA_DEVICE_CUDA && svc->memory_plan) {
        pthread_mutex_lock(&svc->lock);
        const int held = claimsOverlap(claimsOfOrdinals(ordinals, n), schedulerHeldClaims(svc));
        pthread_mutex_unlock(&svc->lock);
        if (!held) return checkFits(svc, cfg, ordinals, n, n + other_ranks, err);
    }
    return SVC_OK;
}

/* ---- train.init_from --------------------------------------------------------------------- */

ServiceStatus submitResolveInitFrom(Service *svc, JobConfig *cfg, NsaError *err) {
    char spec[WEIGHTS_PATH_MAX], found[WEIGHTS_PATH_MAX], absolute[PATH_MAX];
    snprintf(spec, sizeof spec, "%s", cfg->train.init_from);
    if (!spec[0]) return SVC_OK;
    pthread_mutex_lock(&svc->lock);
    const Run *r = runIdValid(spec) ? runsFind(svc->runs, spec) : NULL;
    if (r) snprintf(spec, sizeof spec, "%s", r->out_dir);
    pthread_mutex_unlock(&svc->lock);
    char cwd[PATH_MAX] = "", where[PATH_MAX + 64] = "";
    if (!r && spec[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(where, sizeof where, " (relative to nsad's working directory %s)", cwd);
    NsaError werr;
    char latest[WEIGHTS_PATH_MAX + 32];
    snprintf(latest, sizeof latest, "%s/checkpoints/latest", spec);
    const int rc = checkpointResolve(NULL, spec, found, sizeof found, &werr);
    if (rc <= 0 && r && access(latest, F_OK) != 0)
        snprintf(
            werr.message, sizeof werr.message,
            "that run has written no checkpoint yet; allowed: a run that has (train.save_every)");
    else if (rc < 0 && !r && runIdValid(spec) && access(spec, F_OK) != 0)
        snprintf(werr.message, sizeof werr.message,
                 "no run of that id on this nsad, and no such path");
    else if (rc == 0)
        snprintf(werr.message, sizeof werr.message, "%.400s has no checkpoint yet", spec);
    if (rc <= 0 || !realpath(found, absolute))
        return serviceFail(err, SVC_INVALID_CONFIG, "train.init_from: \"%s\"%s: %s",
                           cfg->train.init_from, where, rc <= 0 ? werr.message : strerror(errno));
    Weights *w = malloc(sizeof *w);
    if (!w) return serviceFail(err, SVC_INTERNAL, "out of memory");
    /* the trainer verifies the checksums when it loads the weights: here,
     * on the HTTP thread, reading every byte would stall the API */
    int bad = weightsOpenUnverified(absolute, w, &werr);
    if (!bad) {
        bad = weightsFitJob(w, cfg, NULL, 0, &werr);
        weightsClose(w);
    }
    free(w);
    if (bad)
        return serviceFail(err, SVC_INVALID_CONFIG, "train.init_from: \"%s\"%s: %s",
                           cfg->train.init_from, where, werr.message);
    if (snprintf(cfg->train.init_from, sizeof cfg->train.init_from, "%s", absolute) >=
        (int)sizeof cfg->train.init_from)
        return serviceFail(err, SVC_INVALID_CONFIG,
                           "train.init_from: the checkpoint's path %s is longer than "
                           "%zu bytes",
                           absolute, sizeof cfg->train.init_from - 1);
    return SVC_OK;
}
