/* flags.c - number-valued command flags (flags.h). */
#include "flags.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int flagsParseInt(const char *text, long long lo, long long hi, long long *out) {
    if (!text || !*text) return -1;
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int flagsInt(const char *cmd, const char *flag, const char *text, long long lo, long long hi,
             long long *out) {
    if (flagsParseInt(text, lo, hi, out) == 0) return 0;
    if (hi == LLONG_MAX)
        fprintf(stderr, "nsad %s: %s '%s' is not allowed; allowed: an integer of at least %lld\n",
                cmd, flag, text ? text : "", lo);
    else
        fprintf(stderr, "nsad %s: %s '%s' is not allowed; allowed: an integer from %lld to %lld\n",
                cmd, flag, text ? text : "", lo, hi);
    return -1;
}

int flagsNumber(const char *cmd, const char *flag, const char *text, double lo, double hi,
                double *out) {
    char *end = NULL;
    double v = NAN;
    if (text && *text) {
        errno = 0;
        v = strtod(text, &end);
    }
    if (!text || !*text || errno || *end != '\0' || !isfinite(v) || !(v >= lo && v <= hi)) {
        fprintf(stderr, "nsad %s: %s '%s' is not allowed; allowed: a number from %g to %g\n", cmd,
                flag, text ? text : "", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}
