/* crossentropy.c - softmax cross-entropy over the vocabulary, in double. */
#include "real.h"
#include "cpu_ops.h"

#include <math.h>

/* loss_n = lse_n - logits[n][target_n],  lse_n = log sum_v exp(logits[n][v]) */
double FN(nsaCpuCrossEntropyForward)(real *lse, const real *logits, const int32_t *targets,
                                     size_t N, int V, size_t *count) {
    double total = 0.0;
    size_t counted = 0;
    for (size_t n = 0; n < N; n++) {
        const real *row = logits + n * V;
        double mx = row[0];
        for (int v = 1; v < V; v++)
            if (row[v] > mx) mx = row[v];
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        const double row_lse = mx + log(sum);
        lse[n] = (real)row_lse;
        if (targets[n] < 0) continue;
        total += row_lse - (double)row[targets[n]];
        counted++;
    }
    *count = counted;
    return total;
}

/* dlogits[n][v] = scale (softmax_v - [v == target_n]); 0 on ignored rows */
void FN(nsaCpuCrossEntropyBackward)(real *dlogits, const real *logits, const real *lse,
                                    const int32_t *targets, size_t N, int V, double scale) {
    for (size_t n = 0; n < N; n++) {
        real *drow = dlogits + n * V;
        const real *row = logits + n * V;
        if (targets[n] < 0) {
            for (int v = 0; v < V; v++) drow[v] = 0;
            continue;
        }
        const double l = lse[n];
        for (int v = 0; v < V; v++) drow[v] = (real)(scale * exp((double)row[v] - l));
        drow[targets[n]] -= (real)scale;
    }
}
