/* suggest.h - "did you mean ...?" for a word nsactl does not know (a
 * command, an option): the known words closest to it by edit distance.
 * Pure: libc only, no state. */
#ifndef NSACTL_SUGGEST_H
#define NSACTL_SUGGEST_H

#include <stddef.h>

#define SUGGEST_MAX 3

/* The optimal-string-alignment distance between a and b, ignoring case:
 * insertions, deletions, substitutions and swaps of two neighbouring
 * characters each count 1 ("stauts" is 1 from "status"). Cannot fail. */
size_t suggestDistance(const char *a, const char *b);

/* Fills out[] with up to SUGGEST_MAX of the n candidates that word is
 * probably a typo of, closest first (ties in candidate order): those within
 * 1 edit (words of up to 4 characters) or 2 edits (longer), only those at
 * the smallest distance found; when none is that close, those word is a
 * prefix of (at least 2 characters). A candidate equal to word is left out,
 * one listed twice is given once. Returns how many (0: nothing is close). */
int suggestWords(const char *word, const char *const *candidates, size_t n, const char **out);

/* Writes "'a'", "'a' or 'b'", "'a', 'b' or 'c'" for the n words into buf
 * (cap > 0; truncated to fit). Returns buf. */
char *suggestList(const char *const *words, int n, char *buf, size_t cap);

#endif
