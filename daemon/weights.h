/* weights.h - a trained checkpoint opened for use (sampling, evaluation,
 * export) rather than for resuming: its model config, its training figures
 * and its master weights.
 *
 * A checkpoint directory (OUT/checkpoints/step_N, proto/files.md) carries
 * the model config in model.safetensors' metadata and the step and tokens in
 * state.safetensors'; the run around it (OUT = the directory two levels up)
 * may add env.json (the whole job config) and val.csv (the evaluations).
 * weightsOpen reads all of it; weightsTo* copy the weights into a decoder or
 * a model after checking every tensor's name and shape against the layout. */
#ifndef NSAD_WEIGHTS_H
#define NSAD_WEIGHTS_H

#include <stdint.h>
#include "../kernels/nsa.h"
#include "../kernels/nsa_layout.h"
#include "checkpoint.h"
#include "config.h"
#include "tokenizer.h"

#define WEIGHTS_PATH_MAX 4096

typedef struct Weights {
    char dir[WEIGHTS_PATH_MAX];     /* the checkpoint directory */
    char out_dir[WEIGHTS_PATH_MAX]; /* the run's out_dir ("" when dir is not inside one) */
    JobConfig job;       /* model from the checkpoint; the rest from env.json, else defaults */
    int have_run_config; /* env.json was found and loaded */
    char *config_yaml;   /* env.json's config_yaml, or NULL */
    ResumeState state;   /* step, tokens_seen, seed, config_hash (state.safetensors) */
    /* the run's last evaluation at or before this step (val.csv); NAN when none */
    int64_t val_step;
    double val_loss, bits_per_byte;
    Safetensors *st;     /* model.safetensors */
    NsaLayout layout;    /* of job.model: the tensor table */
} Weights;

/* Opens what spec names - a checkpoint directory, or a run's out_dir (its
 * checkpoints/latest) - and reads the model config, the state and, when
 * present, the run's env.json and val.csv. Verifies the checkpoint's
 * manifest (checkpointVerify: sizes, checksums) first. The model config is
 * checked as a model alone (configLoadModelString): any vocabulary the
 * engine takes, a shard run's below the byte tokenizer's 256 included.
 * Checks every tensor the layout of that config names is in
 * model.safetensors with its shape, and nothing else is. Returns 0, or -1 with err naming the file and the problem (then
 * w holds nothing to close). The caller closes with weightsClose. */
int weightsOpen(const char *spec, Weights *w, NsaError *err);
void weightsClose(Weights *w);
/* weightsOpen without the manifest's checksums (which read every byte of
 * the checkpoint, its optimizer state included): the model config, the
 * state and every tensor's name and shape are still checked. For a quick
 * check before the files are used (nsad serve's submit); whatever then
 * loads them opens them with weightsOpen. Same contract otherwise. */
int weightsOpenUnverified(const char *spec, Weights *w, NsaError *err);

/* CPU threads for using w's model on this machine: the run's
 * runtime.threads, at most the online cores and 256 (the engine's and the
 * decoder's limit), at least 1. Cannot fail. */
int weightsCpuThreads(const Weights *w);

/* The name weightsTokenizer gives a tokenizer that cannot be known. */
#define WEIGHTS_TOKENIZER_UNKNOWN "unknown"

/* The run's data.tokenizer. Without the run's config: "byte" (the
 * default) where the model's vocabulary holds the byte tokenizer's 256 ids,
 * else WEIGHTS_TOKENIZER_UNKNOWN (a model of fewer ids, e.g. one trained on
 * shards of a 100-token vocabulary, was not trained on bytes). Never NULL. */
const char *weightsTokenizer(const Weights *w);

/* The tokenizer that turns text into w's token ids and back: the one of
 * weightsTokenizer when nsad runs it (tokenizerFind) and its ids fit the
 * model's vocabulary. NULL with err saying why there is none (the
 * tokenizer is unknown, or one nsad cannot run, such as a shard run's
 * own): such a model is used through token ids alone. */
const Tokenizer *weightsTextTokenizer(const Weights *w, NsaError *err);

/* Copies every weight into d / m (built from w->job.model). Synchronous.
 * Returns 0, or -1 with err (out of memory, an engine error). */
int weightsToDecoder(const Weights *w, NsaDecoder *d, NsaError *err);
int weightsToModel(const Weights *w, NsaModel *m, NsaError *err);

/* A decoder on device (CPU: fp32 on `threads` threads; CUDA: bf16, on GPU
 * ordinal gpu) for `slots` sequences of up to `context` tokens, holding w's
 * weights. NULL with err on failure. The caller frees with nsaDecoderFree. */
NsaDecoder *weightsNewDecoder(const Weights *w, NsaDevice device, int gpu, int slots, int context,
                              int threads, NsaError *err);

/* Whether w's weights fit the model of job (train.init_from): every
 * field that shapes a tensor (the model section, nsa.phi, and nsa.l where
 * phi = mlp) must be equal; returns 0, or -1 with err naming w's
 * directory, the first field that differs and both values. The fields that do
 * not shape a tensor (nsa.d, l_sel, n_sel, w, and l where phi = avg;
 * rope_base, norm_eps) may differ: each that does is listed in notes
 * ("nsa.w 512 -> 1024, ..."; "" when none), cut to cap bytes (notes NULL:
 * not listed). The tokenizer must be the job's data.tokenizer too, where
 * w's run config is known (token ids mean nothing under another); -1 with
 * err naming both otherwise. Cannot fail otherwise. */
int weightsFitJob(const Weights *w, const JobConfig *job, char *notes, size_t cap, NsaError *err);

/* Tensor i of the layout of w->job.model as fp32 into dst (numel floats);
 * for export. Returns 0, or -1 with err for a bad index. */
int weightsTensor(const Weights *w, int i, const NsaTensorInfo **info, float *dst, NsaError *err);
int weightsNumTensors(const Weights *w);

#endif
