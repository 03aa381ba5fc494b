/* gpu_bench.cu - step time, tokens/s and peak device memory of the
 * production config (dim 768, 12 layers, 12 heads, 2 groups, d 64,
 * l/d/l'/n/w = 32/16/64/16/512) on the CUDA engine.
 *
 *   gpu_bench S B steps [f32|bf16|fp16]
 * Prints the start-up memory plan, then one line
 *   BENCH S=.. B=.. prec=.. ms_step=.. tok_s=.. fwd_ms=.. peak_gb=.. loss=..
 * (median step over `steps` timed steps after 2 warm-up steps; a step is
 * ZeroGrad, Forward, Backward, OptimizerStep, StepStats). */
#include "gpu_util.h"

#include "cuda/cuda_engine.h"

static int cmpDouble(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: gpu_bench S B steps [f32|bf16|fp16]\n");
        return 2;
    }
    const int S = atoi(argv[1]), B = atoi(argv[2]), steps = atoi(argv[3]);
    const char *pname = argc > 4 ? argv[4] : "bf16";
    NsaPrecision prec = !strcmp(pname, "f32") ? NSA_PREC_F32
                        : !strcmp(pname, "fp16") ? NSA_PREC_FP16 : NSA_PREC_BF16;
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    NsaEngineOptions o;
    memset(&o, 0, sizeof(o));
    o.device = NSA_DEVICE_CUDA;
    o.precision = prec;
    o.max_batch = B;
    o.max_seq_len = S;
    NsaError err = {{0}};
    NsaCudaMemoryPlan plan;
    if (nsaCudaMemoryPlanFor(&c, &o, &plan, &err)) {
        fprintf(stderr, "plan: %s\n", err.message);
        return 1;
    }
    printf("# plan S=%d B=%d: params %.1f MB, grads %.1f MB, adam %.1f MB, activations %.2f GB "
           "(%.2f GB per sequence), workspace %.2f GB, total %.2f GB; device free %.1f GB of "
           "%.1f GB; largest batch that fits: %d\n",
           S, B, plan.params / 1e6, plan.grads / 1e6, plan.optimizer / 1e6, plan.activations / 1e9,
           plan.activations_per_sequence / 1e9, plan.workspace / 1e9, plan.total / 1e9,
           plan.device_free / 1e9, plan.device_total / 1e9, plan.max_batch_that_fits);
    printf("# attention: %s\n", plan.attention_path);
    double t_create = nowSeconds();
    NsaModel *m = nsaModelCreate(&c, &o, &err);
    if (!m || nsaModelInit(m, 1, &err)) {
        fprintf(stderr, "create: %s\n", err.message);
        return 1;
    }
    t_create = nowSeconds() - t_create;
    size_t N = (size_t)B * S;
    int32_t *tok = (int32_t *)malloc(N * 4), *tgt = (int32_t *)malloc(N * 4);
    NsaOptimConfig oc = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    double *times = (double *)calloc(steps + 2, sizeof(double));
    NsaStepStats st = {0, 0, 0, 0, 0};
    for (int s = 0; s < steps + 2; s++) {
        fillTokens(tok, N, 5, (uint64_t)s, c.vocab_size);
        fillTokens(tgt, N, 6, (uint64_t)s, c.vocab_size);
        double t0 = nowSeconds();
        if (nsaModelZeroGrad(m, &err) || nsaModelForward(m, tok, tgt, B, S, 1.0f, &err) ||
            nsaModelBackward(m, &err) || nsaModelOptimizerStep(m, &oc, s + 1, &err) ||
            nsaModelStepStats(m, &st, &err)) {
            fprintf(stderr, "step %d: %s\n", s, err.message);
            return 1;
        }
        times[s] = nowSeconds() - t0;
    }
    double fwd = nowSeconds(), ev = 0;
    if (nsaModelEvalLoss(m, tok, tgt, B, S, &ev, &err)) {
        fprintf(stderr, "eval: %s\n", err.message);
        return 1;
    }
    fwd = nowSeconds() - fwd;
    qsort(times + 2, steps, sizeof(double), cmpDouble);
    double med = times[2 + steps / 2];
    size_t free_b, total_b;
    GPU_OK(cudaMemGetInfo(&free_b, &total_b));
    NsaMemoryReport mr;
    nsaModelMemoryReport(m, &mr);
    cudaDeviceProp prop;
    GPU_OK(cudaGetDeviceProperties(&prop, 0));
    printf("# device %s; create+init %.2f s; arenas: params %.1f MB grads %.1f MB adam %.1f MB "
           "activations %.2f GB workspace %.2f GB\n",
           prop.name, t_create, mr.params / 1e6, mr.grads / 1e6, mr.optimizer / 1e6,
           mr.activations / 1e9, mr.workspace / 1e9);
    printf("BENCH S=%d B=%d prec=%s attn=%.4s ms_step=%.1f min_ms=%.1f tok_s=%.0f fwd_ms=%.1f "
           "peak_gb=%.2f loss=%.4f applied=%d\n",
           S, B, pname, mr.attention_path, med * 1e3, times[2] * 1e3, (double)N / med, fwd * 1e3,
           (total_b - free_b) / 1e9, st.loss, st.applied);
    nsaModelFree(m);
    free(tok); free(tgt); free(times);
    return st.applied && isfinite(st.loss) ? 0 : 1;
}
