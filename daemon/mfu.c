/* mfu.c - see mfu.h. */
#include "mfu.h"

#include <math.h>
#include <string.h>
#include <strings.h>

/* Dense (no sparsity) bf16 tensor-core rates from NVIDIA's data sheets, in
 * TFLOP/s; the words every one of which the driver's name must hold. More
 * specific entries first: "H100 PCIe" before "H100". proto/model.md lists
 * the same table. */
static const struct {
    const char *words[3];
    double tflops;
} kPeaks[] = {
    {{"H100", "PCIe", NULL}, 756.0},
    {{"H100", "NVL", NULL}, 835.0},
    {{"H100", NULL, NULL}, 989.0}, /* SXM: "NVIDIA H100 80GB HBM3" */
    {{"H200", "NVL", NULL}, 835.0},
    {{"H200", NULL, NULL}, 989.0}, /* SXM */
    {{"GH200", NULL, NULL}, 989.0},
    {{"A100", NULL, NULL}, 312.0}, /* SXM and PCIe */
    {{"L40S", NULL, NULL}, 362.0},
    {{"L40", NULL, NULL}, 181.0},
    {{"L4", NULL, NULL}, 121.0},
};

/* 1 when name holds word as a whole word (separated by spaces or dashes). */
static int hasWord(const char *name, const char *word) {
    size_t n = strlen(word);
    for (const char *p = name; *p;) {
        while (*p == ' ' || *p == '-') p++;
        size_t len = strcspn(p, " -");
        if (len == n && !strncasecmp(p, word, n)) return 1;
        p += len;
    }
    return 0;
}

double mfuPeakOfDevice(const char *name) {
    if (!name) return 0;
    for (size_t i = 0; i < sizeof kPeaks / sizeof kPeaks[0]; i++) {
        int all = 1;
        for (int w = 0; w < 3 && kPeaks[i].words[w] && all; w++) all = hasWord(name, kPeaks[i].words[w]);
        if (all) return kPeaks[i].tflops * 1e12;
    }
    return 0;
}

int mfuFlopsPerToken(const JobConfig *cfg, double *out, NsaError *err) {
    NsaFlops f;
    if (nsaModelFlopsPerToken(&cfg->model, cfg->train.seq_len, &f, err) != 0) return -1;
    *out = f.total;
    return 0;
}

double mfuJobPeak(const JobConfig *cfg, const int *ordinals, int n_local, const double *peaks,
                  int n_gpus) {
    const RuntimeConfig *rt = &cfg->runtime;
    if (rt->device != NSA_DEVICE_CUDA) return NAN;
    if (rt->precision != NSA_PREC_BF16 && rt->precision != NSA_PREC_FP16) return NAN;
    if (n_local < 1) return NAN;
    double sum = 0;
    for (int i = 0; i < n_local; i++) {
        int o = ordinals[i];
        if (o < 0 || o >= n_gpus || !(peaks[o] > 0) || !isfinite(peaks[o])) return NAN;
        sum += peaks[o];
    }
    return sum;
}

double mfuWorldPeak(double local_peak, int world, int n_local) {
    if (world > n_local && n_local > 0) return local_peak * (double)world / (double)n_local;
    return local_peak;
}

double mfuOf(double toks_per_s, double flops_per_token, double peak_flops) {
    if (!isfinite(toks_per_s) || !isfinite(flops_per_token) || !isfinite(peak_flops)) return NAN;
    if (toks_per_s < 0 || !(flops_per_token > 0) || !(peak_flops > 0)) return NAN;
    return toks_per_s * flops_per_token / peak_flops;
}
