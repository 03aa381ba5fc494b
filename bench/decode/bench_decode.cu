/* bench_decode.cu - NSA decode speed of the CUDA decoder (nsaDecoder*, the
 * prototype-125m model shape: dim 768, 12 layers, 12 heads, 2 KV groups,
 * d_k = d_v = 64, MLP 3072, V 256, l/d/l'/n/w = 32/16/64/16/512, phi avg) at
 * one batch size and context length.
 *
 *   bench_decode CONTEXT BATCH [STEPS]
 *
 * Random bf16-valued weights (N(0, 0.02)); slot 0 is filled with CONTEXT
 * random tokens through nsaDecoderPrefill (the prompt pass where the config
 * has it, see prefill_path), twice: first_fill_seconds times the first (a
 * new decoder's first use), prefill_tok_per_s the second; the other slots take copies
 * of it (nsaDecoderCopySlot, what several samples of one prompt do;
 * copy_ms is one copy), then STEPS (default 64) more steps are timed one by
 * one, wall clock, each including the copy of the logits to the host (what
 * sampling needs). Every step gives each slot its own random token, so the
 * slots' sequences part from the first step on; each slot reads its own
 * copy of the caches. After the timed steps slot 0 is filled again through
 * the 256-position passes (one token first, so the slot is not empty) for
 * pass_prefill_tok_per_s; then the decoder is freed and a second one built
 * (second_decoder_build_seconds, first_build_seconds for the first: create
 * and weights uploaded, not drawn) and filled once
 * (second_decoder_first_fill_seconds: a new decoder's first fill in a
 * process that has filled one before, as in a long-lived nsad serve).
 * Prints one JSON object:
 *   {"impl": "nsa", "batch", "context", "steps", "ms_per_step",
 *    "ms_per_step_p50", "tok_per_s", "kv_bytes_per_token", "fill_seconds",
 *    "prefill_tok_per_s", "pass_prefill_tok_per_s", "first_fill_seconds", "copy_ms",
 *    "first_build_seconds", "second_decoder_build_seconds",
 *    "second_decoder_first_fill_seconds", "prefill_path"}
 * kv_bytes_per_token: the cache bytes one token's attention reads, all
 * layers (nsaDecoderKvBytesPerToken at the timed context). Runs on the GPU
 * machine: make bench-decode. */
#include <cuda_profiler_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "nsa.h"
#include "nsa_rng.h"
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, const NsaError *err) {
    fprintf(stderr, "bench_decode: %s: %s\n", what, err->message);
    exit(1);
}

/* A decoder with random bf16-valued weights, N(0, 0.02) (norms 1);
 * *build_s: the seconds of nsaDecoderCreate and nsaDecoderSetTensor (not of
 * drawing the weights). */
static NsaDecoder *newDecoder(const NsaModelConfig *cfg, const NsaDecoderOptions *o,
                              double *build_s) {
    NsaError err = {{0}};
    double t0 = now();
    NsaDecoder *d = nsaDecoderCreate(cfg, o, &err);
    if (!d) die("create", &err);
    *build_s = now() - t0;
    for (int i = 0; i < nsaDecoderNumTensors(d); i++) {
        const NsaTensorInfo *ti = nsaDecoderTensorInfo(d, i);
        std::vector<float> w(ti->numel);
        NsaRng rng;
        nsaRngSeed(&rng, 42, (uint64_t)i);
        for (float &v : w) v = ti->ndim == 1 ? 1.0f : (float)(0.02 * nsaRngNormal(&rng));
        t0 = now();
        if (nsaDecoderSetTensor(d, i, w.data(), &err)) die("weights", &err);
        *build_s += now() - t0;
    }
    return d;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_decode CONTEXT BATCH [STEPS]\n");
        return 2;
    }
    const int context = atoi(argv[1]), B = atoi(argv[2]), steps = argc > 3 ? atoi(argv[3]) : 64;
    if (context < 1 || B < 1 || steps < 1) {
        fprintf(stderr, "bench_decode: CONTEXT, BATCH and STEPS must be >= 1\n");
        return 2;
    }
    NsaModelConfig cfg;
    nsaModelConfigDefaults(&cfg);   /* the prototype's shape */
    NsaDecoderOptions o = {};
    o.device = NSA_DEVICE_CUDA;
    o.precision = NSA_PREC_BF16;
    o.max_batch = B;
    o.max_context = context + steps;
    NsaError err = {{0}};
    double first_build_s = 0.0;
    NsaDecoder *d = newDecoder(&cfg, &o, &first_build_s);
    NsaRng rng;
    nsaRngSeed(&rng, 7, 0);
    std::vector<int32_t> tok(B), prompt((size_t)context);
    std::vector<float> logits((size_t)B * cfg.vocab_size);
    for (int32_t &t : prompt) t = (int32_t)nsaRngBelow(&rng, cfg.vocab_size);
    /* the first fill of a decoder pays its first use (kernels loaded,
     * GEMM plans chosen); the second is what later prompts cost */
    const double f0 = now();
    if (nsaDecoderPrefill(d, 0, prompt.data(), context, NULL, &err)) die("fill", &err);
    const double cold_fill = now() - f0;
    if (nsaDecoderReset(d, 0, &err)) die("reset", &err);
    const double f1 = now();
    if (nsaDecoderPrefill(d, 0, prompt.data(), context, NULL, &err)) die("fill", &err);
    const double fill = now() - f1, c0 = now();
    for (int b = 1; b < B; b++)
        if (nsaDecoderCopySlot(d, b, 0, &err)) die("copy", &err);
    const double copy_ms = B > 1 ? (now() - c0) * 1e3 / (B - 1) : 0.0;
    std::vector<double> ms(steps);
    /* Only the timed steps are profiled under `ncu --profile-from-start off`. */
    if (cudaProfilerStart() != cudaSuccess) fprintf(stderr, "bench_decode: cudaProfilerStart failed\n");
    for (int s = 0; s < steps; s++) {
        for (int b = 0; b < B; b++) tok[b] = (int32_t)nsaRngBelow(&rng, cfg.vocab_size);
        const double t0 = now();
        if (nsaDecoderStep(d, B, tok.data(), logits.data(), &err)) die("step", &err);
        ms[s] = (now() - t0) * 1e3;
        for (float v : logits)
            if (!isfinite(v)) {
                fprintf(stderr, "bench_decode: non-finite logit at step %d\n", s);
                return 1;
            }
    }
    cudaProfilerStop();
    double pass_fill = 0.0;
    if (context > 1) {
        if (nsaDecoderReset(d, 0, &err) || nsaDecoderPrefill(d, 0, prompt.data(), 1, NULL, &err))
            die("refill", &err);
        const double p0 = now();
        if (nsaDecoderPrefill(d, 0, prompt.data() + 1, context - 1, NULL, &err)) die("refill", &err);
        pass_fill = now() - p0;
    }
    /* a second decoder in this process: what a new decoder costs once the
     * process has run one (kernels loaded), to build and to fill */
    nsaDecoderFree(d);
    double build_s = 0.0;
    d = newDecoder(&cfg, &o, &build_s);
    const double s0 = now();
    if (nsaDecoderPrefill(d, 0, prompt.data(), context, NULL, &err)) die("fill", &err);
    const double second_fill = now() - s0;
    double sum = 0.0;
    for (double v : ms) sum += v;
    const double mean = sum / steps;
    std::vector<double> sorted(ms);
    std::sort(sorted.begin(), sorted.end());
    printf("{\"impl\": \"nsa\", \"batch\": %d, \"context\": %d, \"steps\": %d, "
           "\"ms_per_step\": %.4f, \"ms_per_step_p50\": %.4f, \"tok_per_s\": %.1f, "
           "\"kv_bytes_per_token\": %zu, \"fill_seconds\": %.2f, \"prefill_tok_per_s\": %.0f, "
           "\"pass_prefill_tok_per_s\": %.0f, \"first_fill_seconds\": %.3f, \"copy_ms\": %.3f, "
           "\"first_build_seconds\": %.3f, \"second_decoder_build_seconds\": %.3f, "
           "\"second_decoder_first_fill_seconds\": %.3f, "
           "\"prefill_path\": \"%s\"}\n",
           B, context, steps, mean, sorted[steps / 2], B * 1e3 / mean,
           nsaDecoderKvBytesPerToken(d, context + steps / 2), fill, (double)context / fill,
           pass_fill > 0 ? (context - 1) / pass_fill : 0.0, cold_fill, copy_ms, first_build_s, build_s,
           second_fill,
           nsaDecoderPrefillPath(d));
    nsaDecoderFree(d);
    return 0;
}
