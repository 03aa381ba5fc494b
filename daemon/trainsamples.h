/* trainsamples.h - what the model being trained writes at each evaluation:
 * a few fixed prompts continued by a decoder holding the current weights
 * (TRAIN_SAMPLE_TOKENS bytes each, temperature 0.8, top-p 0.95, seeded by
 * train.seed, so two evaluations differ only by the weights). The trainer
 * appends them to OUT/samples.jsonl and logs a `samples` event
 * (proto/files.md). Only text data with the byte tokenizer can encode the
 * prompts; other runs have no samples. */
#ifndef NSAD_TRAINSAMPLES_H
#define NSAD_TRAINSAMPLES_H

#include <stdint.h>
#include "../kernels/nsa.h"
#include "config.h"

#define TRAIN_SAMPLE_TOKENS 96

typedef struct TrainSamples TrainSamples;

/* A sampler for the job's model on the job's device (the decoder is
 * allocated here, once). Returns NULL with *why set (a static string) and
 * err empty when the job's tokenizer cannot encode the prompts, or NULL
 * with err filled on an allocation or engine failure. Free with
 * trainSamplesFree (NULL is a no-op). */
TrainSamples *trainSamplesCreate(const JobConfig *job, const char **why, NsaError *err);
void trainSamplesFree(TrainSamples *ts);

/* Copies m's weights into the decoder, continues every prompt and returns
 * the event detail {"step", "samples": [{"prompt", "text"}, ...]} as a
 * malloc'd one-line JSON string in *detail (valid UTF-8: bytes that are not
 * become U+FFFD). Synchronous (on CUDA it reads the weights back between
 * steps). Returns 0, or -1 with err. */
int trainSamplesRun(TrainSamples *ts, NsaModel *m, int64_t step, char **detail, NsaError *err);

/* Appends {"ts", ...detail} as one line to out_dir/samples.jsonl (one
 * write(2), like the heartbeat): detail is a one-line JSON object; "{}",
 * "" and NULL give {"ts"} alone. Returns 0, or -1 with err naming the file
 * (detail not an object, out of memory, a failed open or write). */
int trainSamplesAppend(const char *out_dir, const char *detail, double ts, NsaError *err);

#endif
