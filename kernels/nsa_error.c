/* nsa_error.c - the one way every module of libnsa and nsad fills an
 * NsaError: format a one-line message and return -1. */
#include <stdarg.h>
#include <stdio.h>

#include "nsa.h"

int nsaErrorv(NsaError *err, const char *fmt, va_list ap) {
    if (!err) return -1;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    /* one line, whatever the arguments held (a name or value read from a
     * file or a request may carry newlines or terminal escapes) */
    for (char *c = err->message; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return -1;
}

int nsaErrorf(NsaError *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nsaErrorv(err, fmt, ap);
    va_end(ap);
    return -1;
}
