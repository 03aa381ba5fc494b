/* sampler.h - text generation from a decoder: next-token sampling
 * (temperature, top-k, top-p, a seed) and the generation loop over one or
 * several prompts at once (nsaDecoderPrefill per prompt, then batched
 * nsaDecoderStep), with stop strings and a token budget; prompts and output
 * as text through a tokenizer, or as token ids (a model with no text form).
 *
 * Sampling a token from logits z (V values), reproducible for a seed:
 *   temperature 0: the arg max (ties: the lowest id);
 *   else p = softmax(z / temperature) over the top_k largest logits (all
 *   when top_k is 0; ties: the lower id first), then the smallest prefix of
 *   them, by p descending, whose sum reaches top_p (at least one), and a
 *   draw u in [0, 1) from the prompt's own NsaRng (seed, stream = prompt
 *   index) picks the token where the renormalised cumulative sum passes u. */
#ifndef NSAD_SAMPLER_H
#define NSAD_SAMPLER_H

#include <stddef.h>
#include <stdint.h>
#include "../kernels/nsa.h"
#include "tokenizer.h"

#define SAMPLE_MAX_STOPS 4
#define SAMPLE_STOP_MAX 64 /* bytes per stop string */
#define SAMPLE_MAX_PROMPTS 16
#define SAMPLE_MAX_PROMPT_IDS 65536         /* token ids in a prompt given as ids */
#define SAMPLE_MAX_TOKEN_ID ((1 << 24) - 1) /* no vocabulary holds more (model.vocab_size) */

typedef struct SampleOptions {
    double temperature;  /* >= 0; 0 is greedy */
    int top_k;           /* 0: every token */
    double top_p;        /* (0, 1]; 1: every token top_k leaves */
    uint64_t seed;
    int max_tokens;      /* tokens to generate per prompt, >= 1 */
    int n_stops;
    char stops[SAMPLE_MAX_STOPS][SAMPLE_STOP_MAX + 1]; /* generation of a prompt ends
                                                          when its text ends with one */
} SampleOptions;

/* Defaults: temperature 0.8, top_k 0, top_p 0.95, seed 1, 200 tokens, no stop. */
void sampleDefaults(SampleOptions *o);

/* Checks the ranges (temperature finite >= 0, top_k >= 0, top_p in (0, 1],
 * max_tokens 1 to 1000000, stop strings 1 to SAMPLE_STOP_MAX bytes). Returns 0,
 * or -1 with err naming the field, its value and what is allowed. */
int sampleValidate(const SampleOptions *o, NsaError *err);

/* One token id from logits [V] (see above), or -1 when a logit is NaN or
 * infinite. scratch holds 2*V doubles or ints (sampleScratchBytes). u is
 * the uniform draw (ignored when greedy). */
size_t sampleScratchBytes(int V);
int samplePick(const float *logits, int V, const SampleOptions *o, double u, void *scratch);

/* Why a prompt's generation ended. */
typedef enum SampleStop { SAMPLE_STOP_TOKENS = 0, SAMPLE_STOP_STRING = 1, SAMPLE_STOP_CANCEL = 2 } SampleStop;
const char *sampleStopName(SampleStop s);

/* Called with each prompt's new bytes as they are generated (prompt index,
 * the token's decoded bytes); returns non-zero to cancel everything. */
typedef int (*SampleEmit)(void *ctx, int prompt, const char *bytes, size_t len);

/* The same for a generation of token ids: each prompt's new token id. */
typedef int (*SampleEmitId)(void *ctx, int prompt, int32_t id);

typedef struct SampleResult {
    int tokens[SAMPLE_MAX_PROMPTS];       /* generated per prompt */
    SampleStop stop[SAMPLE_MAX_PROMPTS];
    double seconds;                       /* generation, prefill included */
    double prefill_seconds;
} SampleResult;

/* Generates for n prompts (1 to SAMPLE_MAX_PROMPTS, at most the decoder's
 * max_batch) in slots 0..n-1, each prompt's text encoded by tok (a prompt
 * must encode to at least one token, and prompt + max_tokens must fit the
 * decoder's max_context). Resets those slots first. A prompt equal to an
 * earlier one is not prefilled again: its slot takes a copy of the
 * earlier one's (nsaDecoderCopySlot), so n samples of one prompt cost one
 * prefill; each prompt still draws from its own stream. emit may be NULL.
 * Returns 0 with res filled (a cancel is a success with SAMPLE_STOP_CANCEL),
 * or -1 with err. */
int sampleGenerate(NsaDecoder *d, const Tokenizer *tok, const char *const *prompts, int n,
                   const SampleOptions *o, SampleEmit emit, void *ctx, SampleResult *res,
                   NsaError *err);

/* sampleGenerate for a prompt given as token ids, for a model with no text
 * form (its tokenizer is one nsad cannot run, such as a token shard run's)
 * or to bypass the tokenizer: n continuations (1 to SAMPLE_MAX_PROMPTS, at
 * most the decoder's max_batch) of ids[0..n_ids), prefilled once and copied
 * into slots 0..n-1, continuation i drawing from stream i (so the ids a
 * text prompt encodes to give the tokens sampleGenerate gives for it). The
 * prompt must hold at least one id, each in [0, the model's vocab_size),
 * and n_ids + max_tokens must fit the decoder's max_context. Stop strings
 * need text: o->n_stops must be 0. emit (may be NULL) gets each new token's
 * id. Returns 0 with res filled (a cancel is a success with
 * SAMPLE_STOP_CANCEL), or -1 with err naming what was wrong. */
int sampleGenerateIds(NsaDecoder *d, const int32_t *ids, int n_ids, int n, const SampleOptions *o,
                      SampleEmitId emit, void *ctx, SampleResult *res, NsaError *err);

/* The longest prefix of buf[0..len) made of whole UTF-8 sequences, given
 * that more bytes may follow: a trailing incomplete sequence is held back.
 * Invalid bytes count as whole (the JSON writer replaces them). */
size_t sampleUtf8Complete(const char *buf, size_t len);

/* A malloc'd NUL-terminated copy of buf[0..len) that is valid UTF-8: each
 * byte that does not start a whole, valid sequence (and each NUL) becomes
 * U+FFFD. NULL when out of memory. The caller frees. */
char *sampleUtf8Clean(const char *buf, size_t len);

#endif
