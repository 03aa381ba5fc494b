/* tokenizer.c - see tokenizer.h. */
#include "tokenizer.h"

#include <string.h>

static const Tokenizer byte_tokenizer = {"byte", 256, 1.0};

const Tokenizer *tokenizerFind(const char *name) {
    if (name && !strcmp(name, byte_tokenizer.name)) return &byte_tokenizer;
    return NULL;
}

const char *tokenizerNames(void) { return "byte"; }

int tokenizerVocabOf(const char *name) {
    if (!name) return 0;
    if (!strcmp(name, byte_tokenizer.name)) return byte_tokenizer.vocab_size;
    /* GPT-2's BPE (tiktoken's "gpt2", llm.c's shards): ids 0..50256 */
    if (!strcmp(name, "gpt2")) return 50257;
    return 0;
}

size_t tokenizerMaxTokens(const Tokenizer *tok, size_t len) {
    (void)tok;  /* the byte tokenizer: one token per byte */
    return len;
}

size_t tokenizerEncode(const Tokenizer *tok, const uint8_t *text, size_t len, uint16_t *out) {
    (void)tok;
    for (size_t i = 0; i < len; i++) out[i] = text[i];
    return len;
}

size_t tokenizerDecode(const Tokenizer *tok, const int32_t *ids, size_t n, char *out, size_t cap) {
    for (size_t i = 0; i < n && i + 1 < cap; i++) {
        int32_t id = ids[i];
        out[i] = (id >= 0 && id < tok->vocab_size) ? (char)(uint8_t)id : '?';
    }
    if (cap > 0) out[n < cap ? n : cap - 1] = '\0';
    return n;
}
