/* nsa_error.c - the one way every module of libnsa and nsad fills an
 * NsaError: format a one-line message and return -1. */
#include <stdarg.h>
#include <stdio.h>

#include "nsa.h"

int nsaErrorv(NsaError *err, const char *fmt, va_list ap) {
    if (err) vsnprintf(err->message, sizeof err->message, fmt, ap);
    return -1;
}

int nsaErrorf(NsaError *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nsaErrorv(err, fmt, ap);
    va_end(ap);
    return -1;
}
