/* gpu_train.cu - trains the production config (bf16) on real text with
 * libnsa directly (the GPU machine has none of nsad's libraries).
 *
 *   gpu_train TEXT_FILE steps B S [max_seconds]
 * Byte tokens; the last 5% of the file is held out for validation. Batches
 * are random windows drawn from a fixed seed. AdamW lr 6e-4, 50 warm-up
 * steps then cosine to 6e-5, weight decay 0.1, clip 1.0. Prints a line
 * every 25 steps and the validation loss every 250; the last line says
 * TRAIN PASS when no step was non-finite and the mean loss of the last 50
 * steps is below that of the first 50 by at least 1 nat. */
#include "gpu_util.h"

static void window(int32_t *tok, int32_t *tgt, const unsigned char *text, size_t lo, size_t hi,
                   int B, int S, NsaRng *rng) {
    for (int b = 0; b < B; b++) {
        size_t span = hi - lo - (size_t)S - 1;
        size_t at = lo + (size_t)(nsaRngUniform(rng) * (double)span);
        for (int t = 0; t < S; t++) {
            tok[b * S + t] = text[at + t];
            tgt[b * S + t] = text[at + t + 1];
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: gpu_train TEXT_FILE steps B S\n");
        return 2;
    }
    const int steps = atoi(argv[2]), B = atoi(argv[3]), S = atoi(argv[4]);
    const double max_seconds = argc > 5 ? atof(argv[5]) : 1e30;
    FILE *f = fopen(argv[1], "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", argv[1]); return 2; }
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *text = (unsigned char *)malloc(size);
    if (fread(text, 1, size, f) != size) { fprintf(stderr, "short read\n"); return 2; }
    fclose(f);
    const size_t split = size / 20 * 19;
    printf("# text %s: %zu bytes, train %zu, val %zu\n", argv[1], size, split, size - split);

    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    NsaEngineOptions o;
    memset(&o, 0, sizeof(o));
    o.device = NSA_DEVICE_CUDA;
    o.precision = NSA_PREC_BF16;
    o.max_batch = B;
    o.max_seq_len = S;
    NsaError err = {{0}};
    NsaModel *m = nsaModelCreate(&c, &o, &err);
    if (!m || nsaModelInit(m, 1234, &err)) { fprintf(stderr, "create: %s\n", err.message); return 1; }
    size_t N = (size_t)B * S;
    int32_t *tok = (int32_t *)malloc(N * 4), *tgt = (int32_t *)malloc(N * 4);
    NsaRng rng, vrng;
    nsaRngSeed(&rng, 1234, 1);
    double first = 0, last = 0, recent[50] = {0};
    int nonfinite = 0;
    double t_start = nowSeconds(), t_last = t_start;
    int done = 0;
    for (int s = 1; s <= steps; s++) {
        double elapsed = nowSeconds() - t_start;
        if (s > 1 && elapsed + elapsed / (s - 1) > max_seconds) break;
        const double max_lr = 6e-4, min_lr = 6e-5;
        double lr = s <= 50 ? max_lr * s / 50.0
                            : min_lr + 0.5 * (max_lr - min_lr) *
                                           (1 + cos(M_PI * (s - 50) / (double)(steps - 50)));
        NsaOptimConfig oc = {(float)lr, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
        window(tok, tgt, text, 0, split, B, S, &rng);
        NsaStepStats st;
        if (nsaModelZeroGrad(m, &err) || nsaModelForwardBackward(m, tok, tgt, B, S, 1.0f, &err) ||
            nsaModelOptimizerStep(m, &oc, s, &err) || nsaModelStepStats(m, &st, &err)) {
            fprintf(stderr, "step %d: %s\n", s, err.message);
            return 1;
        }
        if (!st.applied || !isfinite(st.loss) || !isfinite(st.grad_norm)) nonfinite++;
        done = s;
        if (s <= 50) first += st.loss / 50.0;
        recent[s % 50] = st.loss;
        if (s % 25 == 0 || s == 1) {
            double now = nowSeconds();
            int span = s == 1 ? 1 : 25;
            printf("step %5d loss %.4f norm %.3f lr %.2e  %.1f ms/step  %.0f tok/s\n", s, st.loss,
                   st.grad_norm, lr, (now - t_last) / span * 1e3, (double)N * span / (now - t_last));
            fflush(stdout);
            t_last = now;
        }
        if (s % 250 == 0 || s == steps) {
            nsaRngSeed(&vrng, 99, 0);
            double vl = 0;
            for (int k = 0; k < 4; k++) {
                double l;
                window(tok, tgt, text, split, size, B, S, &vrng);
                if (nsaModelEvalLoss(m, tok, tgt, B, S, &l, &err)) {
                    fprintf(stderr, "eval: %s\n", err.message);
                    return 1;
                }
                vl += l / 4;
            }
            printf("val step %5d loss %.4f (%.3f bits/byte)\n", s, vl, vl / log(2.0));
            fflush(stdout);
        }
    }
    double total = nowSeconds() - t_start;
    for (int k = 0; k < 50; k++) last += recent[k] / 50.0;
    size_t free_b, total_b;
    GPU_OK(cudaMemGetInfo(&free_b, &total_b));
    int pass = nonfinite == 0 && last < first - 1.0 && done == steps && done >= 100;
    printf("TRAIN %s steps=%d/%d B=%d S=%d first50=%.4f last50=%.4f nonfinite=%d seconds=%.1f "
           "tok_s=%.0f peak_gb=%.2f\n",
           pass ? "PASS" : "FAIL", done, steps, B, S, first, last, nonfinite, total,
           (double)N * done / total, (total_b - free_b) / 1e9);
    nsaModelFree(m);
    return pass ? 0 : 1;
}
