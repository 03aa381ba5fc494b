/* infer.h - nsad serve's inference worker: one thread that runs sample,
 * eval and export jobs on trained checkpoints one at a time
 * (daemon/sampler.c, daemon/evaluate.c, daemon/exportstore.c), each writing
 * JSON lines into the Stream its HTTP response reads (proto/api.md, POST
 * /api/v1/sample, /api/v1/eval and /api/v1/export).
 *
 * A job runs on CUDA when it asks for it, or asks for nothing and this
 * build has CUDA and a device is visible; else on the CPU engine (fp32,
 * one thread per online core up to 8). It runs beside the trainer thread
 * (on a GPU the two share the device). A job whose reader goes away is
 * cancelled at its next line.
 *
 * The checkpoint and decoder of a sample job stay loaded for the next one
 * (its start line says "reused"), which then skips reading and verifying
 * the checkpoint, uploading the weights and building the decoder: when it
 * names the same model.safetensors (same directory, inode, size and
 * modification time), device and GPU, and fits the decoder's slots and
 * context (built for the context rounded up to a multiple of 4096, and
 * never smaller than the one it replaces). They are released when keep_s
 * pass without a sample job, when a run claims their GPU
 * (inferReleaseGpus), when a job needs another checkpoint or device, before
 * an eval job on their GPU, and at stop. */
#ifndef NSAD_INFER_H
#define NSAD_INFER_H

#include "evaluate.h"
#include "exportstore.h"
#include "sampler.h"
#include "stream.h"
#include "weights.h"

#define INFER_QUEUE_MAX 4

typedef struct Infer Infer;

typedef enum InferKind { INFER_SAMPLE = 0, INFER_EVAL = 1, INFER_EXPORT = 2 } InferKind;

typedef struct InferJob {
    InferKind kind;
    char checkpoint[WEIGHTS_PATH_MAX]; /* a checkpoint dir or a run's out_dir */
    int device;                         /* -1: as above; else NsaDevice */
    int gpu;                            /* CUDA: the device ordinal (schedulerPickGpu) */
    /* sample: the prompt as text or as token ids (one of the two; owned by the job) */
    char *prompt;        /* NUL-terminated text, or NULL */
    int32_t *prompt_ids; /* n_prompt_ids ids (below SAMPLE_MAX_TOKEN_ID + 1), or NULL */
    int n_prompt_ids;
    int n_samples;                      /* continuations of the prompt, 1 to SAMPLE_MAX_PROMPTS */
    SampleOptions sample;
    /* eval */
    char data[WEIGHTS_PATH_MAX];
    int seq_len, batch;
    int64_t max_tokens;
    /* export: made under exports_dir (exportstore.h) in dtype (ExportDtype) */
    char exports_dir[WEIGHTS_PATH_MAX];
    int dtype;
} InferJob;

/* Starts the worker; a sample job's model is kept keep_s seconds after it
 * (0: released after each job). Returns the worker (stop and free it with
 * inferStop), or NULL with err when out of memory or when the thread cannot
 * start (nothing is left allocated then). */
Infer *inferStart(double keep_s, NsaError *err);
/* Asks the worker to release the kept model if it is on one of gpus (a
 * mask of ordinals below 64), as soon as no job of its own uses it. Never
 * blocks on a job; inf NULL is a no-op. */
void inferReleaseGpus(Infer *inf, uint64_t gpus);
/* Cancels what waits (each stream gets an error line and its end), lets
 * the running job finish at its next line (its reader is gone by then: the
 * server stops first), joins the thread, frees everything. NULL: no-op. */
void inferStop(Infer *inf);

/* Queues a copy of job (taking over job->prompt and job->prompt_ids, also
 * on failure: both are NULL after the call) and returns the stream its
 * lines go to, held for the consumer (release with streamRelease). Returns
 * NULL with err when INFER_QUEUE_MAX jobs wait already or memory ran out. */
Stream *inferSubmit(Infer *inf, InferJob *job, NsaError *err);

/* Frees what job owns (its prompt or prompt ids) and sets those fields to
 * NULL / 0; the struct itself is the caller's. Cannot fail. */
void inferJobRelease(InferJob *job);

#endif
