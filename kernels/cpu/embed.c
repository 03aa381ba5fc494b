/* embed.c - token embedding lookup. */
#include "real.h"
#include "cpu_ops.h"

#include <string.h>

/* out[n] = table[tokens[n]] */
void FN(nsaCpuEmbedForward)(real *out, const real *table, const int32_t *tokens, size_t N, int C) {
    for (size_t n = 0; n < N; n++)
        memcpy(out + n * C, table + (size_t)tokens[n] * C, (size_t)C * sizeof(real));
}

/* dtable[tokens[n]] += dout[n]: rows of repeated tokens accumulate. */
void FN(nsaCpuEmbedBackward)(real *dtable, const real *dout, const int32_t *tokens, size_t N,
                             int C) {
    for (size_t n = 0; n < N; n++) {
        real *drow = dtable + (size_t)tokens[n] * C;
        const real *g = dout + n * C;
        for (int c = 0; c < C; c++) drow[c] += g[c];
    }
}
