/* gpu_train.cu - trains the production config (bf16) on real text with
 * libnsa directly (the GPU machine has none of nsad's libraries).
 *
 *   gpu_train TEXT_FILE steps B S [max_seconds [STATE_FILE]]
 * Byte tokens; the last 5% of the file is held out for validation. Batches
 * are random windows drawn from a fixed seed. AdamW lr 6e-4, 50 warm-up
 * steps then cosine to 6e-5, weight decay 0.1, clip 1.0. Prints a line
 * every 25 steps and the validation loss every 250.
 *
 * With max_seconds, training stops before a step that would likely overrun
 * it. With STATE_FILE, the run resumes from that file when it exists and
 * saves to it (temp file + rename) when it stops: weights, Adam moments,
 * the step, the data RNG and the loss bookkeeping, so a run longer than one
 * device call continues the same loss curve in the next call (on a warm
 * machine the ignored build/ folder survives between calls).
 *
 * The last line says TRAIN PASS when all `steps` steps ran, none was
 * non-finite and the mean loss of the last 50 steps is below that of the
 * first 50 by at least 1 nat; TRAIN PARTIAL when it stopped early (state
 * saved) and TRAIN FAIL otherwise.
 *
 * NSA_TRAIN_CPU=1 runs a tiny config on the CPU engine instead: it checks
 * this driver's resume logic on a machine without a GPU. */
#include "gpu_util.h"

#define STATE_MAGIC 0x4e53415452414e31ull   /* "NSATRAN1" */

typedef struct TrainBook {
    uint64_t magic;
    int32_t done, nonfinite, B, S, steps, pad;
    double first, recent[50];
    NsaRng rng;
} TrainBook;

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

static const NsaArena kSavedArenas[3] = {NSA_ARENA_PARAMS, NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};

/* Writes book + the three arenas to path (via path.tmp + rename). */
static int saveState(NsaModel *m, const TrainBook *book, const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", tmp); return -1; }
    int ok = fwrite(book, sizeof(*book), 1, f) == 1;
    NsaError err = {{0}};
    for (int a = 0; a < 3 && ok; a++)
        for (int i = 0; i < nsaModelNumTensors(m) && ok; i++) {
            const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
            float *x = hostAlloc(ti->numel);
            ok = !nsaModelGetTensor(m, kSavedArenas[a], i, x, &err) &&
                 fwrite(x, sizeof(float), ti->numel, f) == ti->numel;
            free(x);
        }
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "saving %s failed %s\n", path, err.message);
        return -1;
    }
    return 0;
}

/* Returns 1 if path was loaded, 0 if it does not exist, -1 on error. */
static int loadState(NsaModel *m, TrainBook *book, const char *path, int B, int S, int steps) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int ok = fread(book, sizeof(*book), 1, f) == 1 && book->magic == STATE_MAGIC &&
             book->B == B && book->S == S && book->steps == steps;
    if (!ok) fprintf(stderr, "%s is not a state of this run (B %d S %d steps %d)\n", path, B, S, steps);
    NsaError err = {{0}};
    for (int a = 0; a < 3 && ok; a++)
        for (int i = 0; i < nsaModelNumTensors(m) && ok; i++) {
            const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
            float *x = hostAlloc(ti->numel);
            ok = fread(x, sizeof(float), ti->numel, f) == ti->numel &&
                 !nsaModelSetTensor(m, kSavedArenas[a], i, x, &err);
            free(x);
        }
    fclose(f);
    if (!ok) { fprintf(stderr, "loading %s failed %s\n", path, err.message); return -1; }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: gpu_train TEXT_FILE steps B S [max_seconds [STATE_FILE]]\n");
        return 2;
    }
    const int steps = atoi(argv[2]), B = atoi(argv[3]), S = atoi(argv[4]);
    const double max_seconds = argc > 5 ? atof(argv[5]) : 1e30;
    const char *state_path = argc > 6 ? argv[6] : NULL;
    const int on_cpu = getenv("NSA_TRAIN_CPU") && !strcmp(getenv("NSA_TRAIN_CPU"), "1");
    if (steps < 1 || B < 1 || S < 1) { fprintf(stderr, "steps, B and S must be >= 1\n"); return 2; }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", argv[1]); return 2; }
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *text = (unsigned char *)malloc(size);
    if (fread(text, 1, size, f) != size) { fprintf(stderr, "short read\n"); return 2; }
    fclose(f);
    const size_t split = size / 20 * 19;
    if (split < (size_t)S + 2 || size - split < (size_t)S + 2) {
        fprintf(stderr, "text too short for S %d\n", S);
        return 2;
    }
    printf("# text %s: %zu bytes, train %zu, val %zu\n", argv[1], size, split, size - split);

    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    NsaEngineOptions o;
    memset(&o, 0, sizeof(o));
    o.device = NSA_DEVICE_CUDA;
    o.precision = NSA_PREC_BF16;
    if (on_cpu) {   /* a tiny model: checks the driver, not the engine */
        c.dim = 32; c.n_layers = 1; c.n_heads = 2; c.n_kv_groups = 1; c.d_k = 8; c.d_v = 8;
        c.cmp_len = 8; c.cmp_stride = 4; c.sel_len = 8; c.n_sel = 3; c.window = 16;
        o.device = NSA_DEVICE_CPU;
        o.precision = NSA_PREC_F32;
    }
    o.max_batch = B;
    o.max_seq_len = S;
    NsaError err = {{0}};
    NsaModel *m = nsaModelCreate(&c, &o, &err);
    if (!m || nsaModelInit(m, 1234, &err)) { fprintf(stderr, "create: %s\n", err.message); return 1; }
    NsaMemoryReport mr;
    if (nsaModelMemoryReport(m, &mr) == 0 && mr.attention_path[0])
        printf("# attention: %s\n", mr.attention_path);
    TrainBook book;
    memset(&book, 0, sizeof(book));
    book.magic = STATE_MAGIC;
    book.B = B; book.S = S; book.steps = steps;
    nsaRngSeed(&book.rng, 1234, 1);
    if (state_path) {
        int rc = loadState(m, &book, state_path, B, S, steps);
        if (rc < 0) return 1;
        if (rc > 0) printf("# resumed from %s after step %d\n", state_path, book.done);
    }
    size_t N = (size_t)B * S;
    int32_t *tok = (int32_t *)malloc(N * 4), *tgt = (int32_t *)malloc(N * 4);
    NsaRng vrng;
    double t_start = nowSeconds(), t_last = t_start;
    int ran = 0, since_print = 0;
    for (int s = book.done + 1; s <= steps; s++) {
        double elapsed = nowSeconds() - t_start;
        if (ran > 0 && elapsed + elapsed / ran > max_seconds) break;
        const double max_lr = 6e-4, min_lr = 6e-5;
        double lr = s <= 50 ? max_lr * s / 50.0
                            : min_lr + 0.5 * (max_lr - min_lr) *
                                           (1 + cos(M_PI * (s - 50) / (double)(steps > 50 ? steps - 50 : 1)));
        NsaOptimConfig oc = {(float)lr, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
        window(tok, tgt, text, 0, split, B, S, &book.rng);
        NsaStepStats st;
        if (nsaModelZeroGrad(m, &err) || nsaModelForwardBackward(m, tok, tgt, B, S, 1.0f, &err) ||
            nsaModelOptimizerStep(m, &oc, s, &err) || nsaModelStepStats(m, &st, &err)) {
            fprintf(stderr, "step %d: %s\n", s, err.message);
            return 1;
        }
        if (!st.applied || !isfinite(st.loss) || !isfinite(st.grad_norm)) book.nonfinite++;
        if (s <= 50) book.first += st.loss / 50.0;
        book.recent[s % 50] = st.loss;
        book.done = s;
        ran++;
        since_print++;
        if (s % 25 == 0 || s == 1) {
            double now = nowSeconds();
            printf("step %5d loss %.4f norm %.3f lr %.2e  %.1f ms/step  %.0f tok/s\n", s, st.loss,
                   st.grad_norm, lr, (now - t_last) / since_print * 1e3,
                   (double)N * since_print / (now - t_last));
            fflush(stdout);
            t_last = now;
            since_print = 0;
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
    if (state_path && saveState(m, &book, state_path)) return 1;
    double last = 0;
    int counted = book.done < 50 ? book.done : 50;
    for (int s = book.done - counted + 1; s <= book.done; s++) last += book.recent[s % 50] / counted;
    double peak_gb = 0;
    if (!on_cpu) {
        size_t free_b, total_b;
        GPU_OK(cudaMemGetInfo(&free_b, &total_b));
        peak_gb = (total_b - free_b) / 1e9;
    }
    const char *verdict = book.nonfinite > 0 ? "FAIL"
                          : book.done < steps ? (state_path ? "PARTIAL" : "FAIL")
                          : (book.done >= 100 && last < book.first - 1.0) ? "PASS" : "FAIL";
    printf("TRAIN %s steps=%d/%d (this call %d) B=%d S=%d first50=%.4f last50=%.4f nonfinite=%d "
           "seconds=%.1f tok_s=%.0f peak_gb=%.2f\n",
           verdict, book.done, steps, ran, B, S, book.first, last, book.nonfinite, total,
           ran ? (double)N * ran / total : 0.0, peak_gb);
    nsaModelFree(m);
    return !strcmp(verdict, "FAIL");
}
