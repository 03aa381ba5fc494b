/* evaluate.h - held-out loss of a trained checkpoint on a data file
 * (`nsad eval`, POST /api/v1/eval): the file's whole token stream cut into
 * consecutive windows of seq_len + 1 tokens (stride seq_len; a tail shorter
 * than a window is not scored), every next-token prediction in them scored
 * by the engine's forward (nsaModelEvalLoss) and averaged: mean loss in nats
 * per token and, where the tokens come from text, bits per byte. */
#ifndef NSAD_EVALUATE_H
#define NSAD_EVALUATE_H

#include <stdint.h>
#include "../kernels/nsa.h"
#include "weights.h"

typedef struct EvalOptions {
    const char *data_path;  /* .txt, .jsonl or a directory of them; .bin shards or a glob */
    int shards;             /* 1: llm.c token shards; 0: text (evalOptionsFromPath sets it) */
    int seq_len;            /* 0: the run's train.seq_len */
    int batch;              /* 0: min(the run's batch_size, 4) */
    int64_t max_tokens;     /* 0: the whole file; else stop after the window reaching it */
    NsaDevice device;       /* engine to run on */
    int gpu;                /* CUDA: the device ordinal */
    NsaPrecision precision; /* fp32 on the CPU; bf16 (or fp32) on CUDA */
    int threads;            /* CPU engine threads */
} EvalOptions;

typedef struct EvalResult {
    double loss;            /* mean nats per scored token */
    double bits_per_byte;   /* NAN for shards (their bytes are unknown) */
    double bytes_per_token;
    int64_t tokens;         /* scored predictions */
    int64_t windows;
    int seq_len, batch;
    double seconds;
} EvalResult;

/* Called after every batch with the tokens scored so far, the total to
 * score and the running mean loss; returns non-zero to stop early (then
 * evalRun fails with "cancelled"). */
typedef int (*EvalProgress)(void *ctx, int64_t done, int64_t total, double loss);

/* Sets shards from the path: a .bin file, or a pattern or directory naming
 * .bin files, is shards; anything else text. Cannot fail. */
void evalOptionsFromPath(EvalOptions *o, const char *path);

/* Builds a model on o->device for (batch, seq_len), loads w's weights,
 * scores the file. Returns 0 with *out filled, or -1 with err (a data or
 * engine error, a file shorter than one window, cancelled). */
int evalRun(const Weights *w, const EvalOptions *o, EvalProgress progress, void *ctx,
            EvalResult *out, NsaError *err);

/* Adds the result's fields to o, as `nsad eval --json` prints them and the
 * eval stream's result line carries them (proto/api.md): checkpoint, step,
 * data, loss, bits_per_byte (null for shards), tokens, windows, seq_len,
 * batch, seconds. Cannot fail (cJSON drops what it cannot allocate). */
struct cJSON;
void evalResultToJson(struct cJSON *o, const Weights *w, const char *data, const EvalResult *r);

#endif
