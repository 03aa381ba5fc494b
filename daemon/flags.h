/* flags.h - the number-valued flags of nsad's commands (train, sample,
 * eval, demo, serve): one parser for each kind and one message, so that
 * every command refuses a bad value alike and names it. */
#ifndef NSAD_FLAGS_H
#define NSAD_FLAGS_H

/* All of text as a base-10 integer in [lo, hi] into *out. Returns 0, or -1
 * (empty, other characters, overflow, out of range) with *out untouched.
 * Prints nothing: for callers that word the error themselves (serve's
 * daemon-config values and its --listen port). */
int flagsParseInt(const char *text, long long lo, long long hi, long long *out);

/* flagsParseInt for flag of command cmd; on -1 it has printed "nsad CMD:
 * FLAG 'TEXT' is not allowed; allowed: an integer from LO to HI" (or "of at
 * least LO" when hi is LLONG_MAX) to stderr. */
int flagsInt(const char *cmd, const char *flag, const char *text, long long lo, long long hi,
             long long *out);

/* All of text as a decimal number in [lo, hi] (not NaN, not infinite) into
 * *out; 0, or -1 after printing "nsad CMD: FLAG 'TEXT' is not allowed;
 * allowed: a number from LO to HI" to stderr (*out untouched). */
int flagsNumber(const char *cmd, const char *flag, const char *text, double lo, double hi,
                double *out);

#endif
