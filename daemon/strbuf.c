/* strbuf.c - see strbuf.h. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int strbufInit(StrBuf *b, size_t cap) {
    b->len = 0;
    b->cap = cap ? cap : 64;
    b->data = malloc(b->cap);
    b->failed = b->data == NULL;
    if (b->data) b->data[0] = 0;
    return b->failed ? -1 : 0;
}

void strbufPrintf(StrBuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
}

char *strbufTake(StrBuf *b) {
    char *out = b->failed ? NULL : b->data;
    if (b->failed) free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
    return out;
}
