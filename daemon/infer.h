/* infer.h - nsad serve's inference worker: one thread that runs sample and
 * eval jobs on trained checkpoints one at a time (daemon/sampler.c,
 * daemon/evaluate.c), each writing JSON lines into the Stream its HTTP
 * response reads (proto/api.md, POST /api/v1/sample and /api/v1/eval).
 *
 * A job runs on CUDA when it asks for it, or asks for nothing and this
 * build has CUDA and a device is visible; else on the CPU engine (fp32,
 * one thread per online core up to 8). It runs beside the trainer thread
 * (on a GPU the two share the device). A job whose reader goes away is
 * cancelled at its next line. */
#ifndef NSAD_INFER_H
#define NSAD_INFER_H

#include "evaluate.h"
#include "sampler.h"
#include "stream.h"
#include "weights.h"

#define INFER_QUEUE_MAX 4

typedef struct Infer Infer;

typedef enum InferKind { INFER_SAMPLE = 0, INFER_EVAL = 1 } InferKind;

typedef struct InferJob {
    InferKind kind;
    char checkpoint[WEIGHTS_PATH_MAX]; /* a checkpoint dir or a run's out_dir */
    int device;                         /* -1: as above; else NsaDevice */
    int gpu;                            /* CUDA: the device ordinal (servicePickGpu) */
    /* sample */
    char *prompt;                       /* owned by the job once submitted */
    int n_samples;                      /* continuations of the prompt, 1 to SAMPLE_MAX_PROMPTS */
    SampleOptions sample;
    /* eval */
    char data[WEIGHTS_PATH_MAX];
    int seq_len, batch;
    int64_t max_tokens;
} InferJob;

/* Starts the worker. NULL with err when the thread cannot start. */
Infer *inferStart(NsaError *err);
/* Cancels what waits (each stream gets an error line and its end), lets
 * the running job finish at its next line (its reader is gone by then: the
 * server stops first), joins the thread, frees everything. NULL: no-op. */
void inferStop(Infer *inf);

/* Queues a copy of job (taking over job->prompt, also on failure) and
 * returns the stream its lines go to, held for the consumer (release with
 * streamRelease). Returns NULL with err when INFER_QUEUE_MAX jobs wait
 * already or memory ran out. */
Stream *inferSubmit(Infer *inf, InferJob *job, NsaError *err);

#endif
