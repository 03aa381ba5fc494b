/* fuzzutil.h - what the fuzz harnesses (tests/fuzz/fuzz_*.c) share: how
 * they stop on a finding and their scratch directory. Linked into every
 * harness. */
#ifndef NSA_FUZZUTIL_H
#define NSA_FUZZUTIL_H

/* Prints "<harness>: what: detail" on stderr (the harness is the running
 * program's name) and aborts: libFuzzer reports the abort as a finding and
 * keeps the input that led to it. Never returns. */
void fuzzDie(const char *what, const char *detail) __attribute__((noreturn));

/* Makes a new directory PREFIX-XXXXXX for the harness's files: on tmpfs
 * (/dev/shm) when there is a writable one, since a harness writes files
 * for every input, else in /tmp. It is removed, with everything in it, at
 * exit. Returns its path (static storage: one scratch directory per
 * process). Aborts through fuzzDie when it cannot be made. */
const char *fuzzScratchDir(const char *prefix);

#endif
