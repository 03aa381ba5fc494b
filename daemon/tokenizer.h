/* tokenizer.h - text to token ids for the text data source.
 *
 * nsad ships one tokenizer, "byte": every byte of the UTF-8 text is one token
 * (vocabulary 256), so no vocabulary file is needed and bits per byte equals
 * bits per token. Pre-tokenized llm.c shards bypass the tokenizer entirely.
 * nsad also knows "gpt2" by name (the prototype's data.tokenizer for GPT-2
 * token shards, vocabulary 50257) without being able to run it on text.
 * Tokenizers are immutable tables: nothing to open or free. */
#ifndef NSAD_TOKENIZER_H
#define NSAD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer {
    const char *name;       /* the config's data.tokenizer value */
    int vocab_size;         /* ids are in [0, vocab_size) */
    double bytes_per_token; /* average source bytes per token */
} Tokenizer;

/* Returns the tokenizer of that name that nsad can run on text, or NULL
 * when there is none. */
const Tokenizer *tokenizerFind(const char *name);

/* A comma-separated list of the names tokenizerFind knows, for messages. */
const char *tokenizerNames(void);

/* The vocabulary of a tokenizer nsad knows by name, whether or not it can
 * run it on text ("byte": 256, "gpt2": 50257), or 0 for any other name. */
int tokenizerVocabOf(const char *name);

/* Encodes len bytes of text into out (capacity at least
 * tokenizerMaxTokens(tok, len)). Returns the number of tokens written.
 * Cannot fail. */
size_t tokenizerEncode(const Tokenizer *tok, const uint8_t *text, size_t len, uint16_t *out);

/* Upper bound on the tokens len bytes can encode to. */
size_t tokenizerMaxTokens(const Tokenizer *tok, size_t len);

/* Decodes n token ids into out (capacity cap bytes, always NUL-terminated
 * when cap > 0). Ids outside the vocabulary decode to '?'. Returns the
 * number of bytes the full decoding needs (like snprintf). */
size_t tokenizerDecode(const Tokenizer *tok, const int32_t *ids, size_t n, char *out, size_t cap);

#endif
