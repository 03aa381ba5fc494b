/* suggest.c - see suggest.h. */
#include "suggest.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Words longer than this are never close to a command name. */
#define SUGGEST_WORD_MAX 64

size_t suggestDistance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > SUGGEST_WORD_MAX || m > SUGGEST_WORD_MAX) return n > m ? n : m;
    /* three rows of the dynamic programme: two back (for swaps), one back, this */
    size_t rows[3][SUGGEST_WORD_MAX + 1];
    size_t *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= m; j++) prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
            size_t best = prev[j - 1] + (same ? 0 : 1);
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == tolower((unsigned char)b[j - 1]) && prev2[j - 2] + 1 < best)
                best = prev2[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = prev2;
        prev2 = prev;
        prev = cur;
        cur = t;
    }
    return prev[m];
}

static int isPrefix(const char *word, const char *of) {
    size_t n = strlen(word);
    return n >= 2 && n < strlen(of) && !strncasecmp(word, of, n);
}

int suggestWords(const char *word, const char *const *candidates, size_t n, const char **out) {
    size_t len = strlen(word);
    size_t limit = len <= 4 ? 1 : 2;
    int found = 0;
    /* the nearest words only: pass d = 1..limit until one finds some, then
     * (none close) the words word begins */
    for (size_t pass = 1; pass <= limit + 1 && found == 0; pass++) {
        for (size_t i = 0; i < n && found < SUGGEST_MAX; i++) {
            const char *c = candidates[i];
            if (!strcasecmp(c, word)) continue;
            int taken = 0;
            for (int k = 0; k < found && !taken; k++) taken = !strcmp(out[k], c);
            if (taken) continue;
            int fits = pass <= limit ? suggestDistance(word, c) == pass : isPrefix(word, c);
            if (fits) out[found++] = c;
        }
    }
    return found;
}

char *suggestList(const char *const *words, int n, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < cap; i++) {
        const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
        int k = snprintf(buf + used, cap - used, "%s'%s'", sep, words[i]);
        if (k < 0) break;
        used += (size_t)k;
    }
    return buf;
}
