/* data.h - training and validation token streams.
 *
 * Sources (config `data:`): synthetic (seeded random tokens), local text (a
 * .txt file, a directory of .txt files, or .jsonl with a "text" field) through
 * the byte tokenizer, and pre-tokenized llm.c .bin shards (256 x int32 header,
 * magic 20240520, version 1, uint16 tokens). The validation split is a
 * held-out tail of the corpus (by whole documents / shard ranges) that never
 * overlaps training data. A background thread prefetches the next batches.
 *
 * Batches are deterministic functions of (seed, position): the position is a
 * plain integer the trainer saves in its resume state, so a resumed run sees
 * exactly the batches the uninterrupted run would have seen. */
#ifndef NSAD_DATA_H
#define NSAD_DATA_H

#include <stdint.h>
#include "config.h"

typedef struct DataLoader DataLoader;

/* SPLIT_ALL: the whole source, val_fraction and shard names ignored, read
 * like the val split (consecutive windows) - for evaluating a file. */
typedef enum DataSplit { SPLIT_TRAIN = 0, SPLIT_VAL = 1, SPLIT_ALL = 2 } DataSplit;

/* Opens the source named by cfg->data for one split, producing batches of
 * batch x (seq_len + 1) tokens. Reads and validates every file up front:
 * corrupt or truncated input fails here with err naming the file and the
 * byte offset. Returns NULL on error. Free with dataClose. */
DataLoader *dataOpen(const JobConfig *cfg, DataSplit split, NsaError *err);
void dataClose(DataLoader *dl);

/* Fills tokens[batch*seq_len] (inputs) and targets[batch*seq_len] (the next
 * tokens) with batch number `position` of this split. Uses the prefetched
 * copy when it is ready; never blocks on disk when the disk keeps up.
 * Allocates nothing. One calling thread per loader at a time.
 * Returns 0 or -1 with err: a shard that shrank under the mapping (the
 * SIGBUS is caught, see signalsGuardBus) fails this and every later batch
 * with the file's name instead of killing nsad. */
int dataBatch(DataLoader *dl, uint64_t position, int32_t *tokens, int32_t *targets, NsaError *err);

/* Total tokens in this split (synthetic: UINT64_MAX). */
uint64_t dataNumTokens(const DataLoader *dl);
/* Bytes of source text per token (1.0 for the byte tokenizer): turns nats
 * per token into bits per byte. 0 when unknown (shards do not record the
 * text they came from): then there is no bits-per-byte figure. */
double dataBytesPerToken(const DataLoader *dl);
/* Vocabulary the tokens come from (256 for bytes; shards: model.vocab_size). */
int dataVocabSize(const DataLoader *dl);

/* How dataBatch served its calls so far: from the prefetch ring, or
 * computed on the caller's thread (a miss: the prefetch was behind or the
 * position jumped). Thread-safe. */
typedef struct DataStats {
    uint64_t prefetched, computed;
} DataStats;
void dataGetStats(DataLoader *dl, DataStats *out);

/* Blocks until the prefetch thread has batch `position` ready, when that
 * position lies in the look-ahead the thread works on (the data.prefetch
 * positions from the one after the last dataBatch call; the thread fills
 * them in order, so it gets there). Returns 1 when the batch is ready: the
 * next dataBatch for it is served from the ring. Returns 0 at once when
 * the loader has no prefetch thread, the position is outside the
 * look-ahead, or the thread has failed. Lets tests count ring hits without
 * depending on how threads are scheduled. */
int dataPrefetchWait(DataLoader *dl, uint64_t position);

#endif
