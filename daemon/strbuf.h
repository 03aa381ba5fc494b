/* strbuf.h - a growing, NUL-terminated text buffer for the renderers
 * (resolved YAML, Prometheus text, stack dumps).
 *
 * A failed allocation sticks: later appends do nothing and strbufTake
 * returns NULL, so a renderer appends freely and checks once at the end. */
#ifndef NSAD_STRBUF_H
#define NSAD_STRBUF_H

#include <stddef.h>

typedef struct StrBuf {
    char *data;
    size_t len, cap;
    int failed;
} StrBuf;

/* Starts an empty buffer with room for cap bytes. Returns 0, or -1 when
 * the allocation fails (the buffer is then failed and strbufTake gives NULL). */
int strbufInit(StrBuf *b, size_t cap);
/* Appends printf-style text. Cannot fail visibly: see the note above. */
void strbufPrintf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Returns the text (the caller frees it), or NULL if any allocation failed
 * (everything is freed then). The buffer is empty afterwards. */
char *strbufTake(StrBuf *b);

#endif
