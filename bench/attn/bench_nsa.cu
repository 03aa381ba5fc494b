/* bench_nsa.cu - times the fast NSA attention op (kernels/cuda/fast_attn/),
 * the counterpart of dense_sdpa.py: same shapes, same sequence lengths,
 * batch so that B x S >= 64k tokens, bf16, and one JSON object per line:
 *   {"impl": "nsa", "shape", "S", "B", "fwd_ms", "bwd_ms", "total_ms",
 *    "peak_mib", "tflops", "finite", "branches": {...}, "phases": {...}}
 * Timing: CUDA events around forward and forward+backward, warm-up, median
 * of repeats; bwd = total - fwd as in dense_sdpa.py. peak_mib is the device
 * memory the run holds (inputs, outputs, gradients and the plan's
 * workspace), read from cudaMemGetInfo. "tflops" counts the useful FLOPs of
 * the three branches (2 (d_k + d_v) per visible query-key pair, x3.5 for
 * forward + backward, the convention of dense_sdpa.py); "branches" gives
 * each branch's FLOPs and achieved TFLOP/s over its phases' time; "phases"
 * is the per-phase time breakdown of one profiled forward + backward.
 * "host_ms" is the host's time to enqueue one forward + backward.
 * One more forward + backward runs between cudaProfilerStart and
 * cudaProfilerStop (no-ops without a profiler): what bench/attn/kernels.py
 * has Nsight Compute break down per kernel.
 * With --graph 1 the forward and the forward + backward are also captured
 * once each into a CUDA graph and the replays timed the same way
 * ("graph_fwd_ms", "graph_total_ms"): the difference to the stream-launched
 * times is what the host's launches and the gaps between kernels cost.
 *
 * usage: bench_nsa [--seq 2048,8192,...] [--shapes proto,paper,paper192]
 *                  [--tokens 65536] [--reps 10] [--graph 0|1] */
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "nsa.h"
}

#define CK(call)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "bench_nsa: %s: %s (line %d)\n", #call, cudaGetErrorString(e_), \
                    __LINE__);                                                           \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

struct Shape {
    const char *name;
    int H, G, dk, dv;
};
static const Shape kShapes[] = {
    {"proto", 12, 2, 64, 64},
    {"paper", 64, 4, 128, 128},
    {"paper192", 64, 4, 192, 128},
};

/* normal-ish values from a hash: no host generation of gigabytes */
__global__ void fillKernel(__nv_bfloat16 *x, size_t n, unsigned long long seed, float lo, float hi,
                           int gaussian) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = seed + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u1 = ((z >> 40) + 0.5f) / 16777216.f, u2 = (((z >> 16) & 0xFFFFFF) + 0.5f) / 16777216.f;
        float v = gaussian ? sqrtf(-2.f * logf(u1)) * cospif(2.f * u2) : lo + (hi - lo) * u1;
        x[i] = __float2bfloat16(v);
    }
}

__global__ void countNonFinite(const __nv_bfloat16 *x, size_t n, unsigned long long *bad) {
    unsigned long long local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        local += !isfinite(__bfloat162float(x[i]));
    if (local) atomicAdd(bad, local);
}

static __nv_bfloat16 *newTensor(size_t n, unsigned long long seed, float lo, float hi, int gaussian) {
    __nv_bfloat16 *p;
    CK(cudaMalloc(&p, n * sizeof(__nv_bfloat16)));
    fillKernel<<<1024, 256>>>(p, n, seed, lo, hi, gaussian);
    CK(cudaGetLastError());
    return p;
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* useful forward FLOPs of each branch, and of the selection score pass */
struct Flops {
    double cmp, sel, win, score;
};
static Flops countFlops(const NsaAttnDims &d) {
    Flops f = {0, 0, 0, 0};
    const double per = 2.0 * (d.d_k + d.d_v) * d.H * d.B;
    for (long t = 0; t < d.S; t++) {
        long nvis = t < d.cmp_len - 1 ? 0 : (t - d.cmp_len + 1) / d.cmp_stride + 1;
        long cur = t / d.sel_len;
        long nb = std::min<long>(std::max(d.n_sel, 1), cur + 1);
        if (cur >= 1 && nb < 2) nb = 2;
        if (cur >= 2 && nb < 3) nb = 3;
        long sel_keys = (nb - 1) * d.sel_len + t % d.sel_len + 1;
        f.cmp += per * nvis;
        f.sel += per * sel_keys;
        f.win += per * std::min<long>(t + 1, d.window);
        f.score += 2.0 * d.d_k * d.H * d.B * nvis;
    }
    return f;
}

static void benchOne(const Shape &sh, int S, long tokens, int reps, bool graph) {
    NsaAttnDims d = {(int)std::max(1L, tokens / S), S, sh.H, sh.G, sh.dk, sh.dv, 32, 16, 64, 16, 512};
    const size_t T = (size_t)d.B * S, rows = T * d.H, kvk = T * d.G * d.d_k, kvv = T * d.G * d.d_v;
    size_t free0, total;
    CK(cudaDeviceSynchronize());
    CK(cudaMemGetInfo(&free0, &total));
    unsigned long long seed = 1234 + S;
    NsaAttnDeviceInputs in;
    in.q = newTensor(rows * d.d_k, seed++, 0, 0, 1);
    in.k_cmp = newTensor(kvk, seed++, 0, 0, 1);
    in.v_cmp = newTensor(kvv, seed++, 0, 0, 1);
    in.k_sel = newTensor(kvk, seed++, 0, 0, 1);
    in.v_sel = newTensor(kvv, seed++, 0, 0, 1);
    in.k_win = newTensor(kvk, seed++, 0, 0, 1);
    in.v_win = newTensor(kvv, seed++, 0, 0, 1);
    in.gates = newTensor(rows * 3, seed++, 0.05f, 0.95f, 0);
    __nv_bfloat16 *dout = newTensor(rows * d.d_v, seed++, 0, 0, 1);
    __nv_bfloat16 *out = newTensor(rows * d.d_v, seed++, 0, 0, 1);
    NsaAttnDeviceGrads gr;
    gr.dq = newTensor(rows * d.d_k, 1, 0, 0, 0);
    gr.dk_cmp = newTensor(kvk, 1, 0, 0, 0);
    gr.dv_cmp = newTensor(kvv, 1, 0, 0, 0);
    gr.dk_sel = newTensor(kvk, 1, 0, 0, 0);
    gr.dv_sel = newTensor(kvv, 1, 0, 0, 0);
    gr.dk_win = newTensor(kvk, 1, 0, 0, 0);
    gr.dv_win = newTensor(kvv, 1, 0, 0, 0);
    gr.dgates = newTensor(rows * 3, 1, 0, 0, 0);
    NsaError err = {{0}};
    NsaAttnCudaPlan *plan = nsaAttnCudaPlanCreate(&d, NULL, &err);
    if (!plan) {
        printf("{\"impl\": \"nsa\", \"shape\": \"%s\", \"S\": %d, \"error\": \"%s\"}\n", sh.name, S,
               err.message);
        fflush(stdout);
        return;
    }
    CK(cudaDeviceSynchronize());
    size_t free1;
    CK(cudaMemGetInfo(&free1, &total));

    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    auto fwd = [&]() {
        if (nsaAttnForwardCuda(plan, &d, &in, out, NULL, NULL, stream, &err)) {
            fprintf(stderr, "bench_nsa: forward: %s\n", err.message);
            exit(1);
        }
    };
    auto fwdBwd = [&]() {
        fwd();
        if (nsaAttnBackwardCuda(plan, &d, &in, dout, &gr, stream, &err)) {
            fprintf(stderr, "bench_nsa: backward: %s\n", err.message);
            exit(1);
        }
    };
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    auto timeIt = [&](auto fn) {
        for (int i = 0; i < 2; i++) fn();
        CK(cudaStreamSynchronize(stream));
        std::vector<float> ms;
        for (int i = 0; i < reps; i++) {
            CK(cudaEventRecord(a, stream));
            fn();
            CK(cudaEventRecord(b, stream));
            CK(cudaEventSynchronize(b));
            float t;
            CK(cudaEventElapsedTime(&t, a, b));
            ms.push_back(t);
        }
        return median(ms);
    };
    float fwd_ms = timeIt(fwd);
    float total_ms = timeIt(fwdBwd);
    /* the host's own time to enqueue one forward + backward (the GPU idle
     * before each, so nothing waits on a full launch queue): where it
     * comes near the GPU's time, short sequences wait on the host */
    float host_ms;
    {
        std::vector<float> ms;
        for (int i = 0; i < reps; i++) {
            CK(cudaStreamSynchronize(stream));
            const auto t0 = std::chrono::steady_clock::now();
            fwdBwd();
            const auto t1 = std::chrono::steady_clock::now();
            ms.push_back(std::chrono::duration<float, std::milli>(t1 - t0).count());
        }
        CK(cudaStreamSynchronize(stream));
        host_ms = median(ms);
    }
    /* the same work as one graph launch each (after the warm-up above, so
     * the plan's once-per-shape host work is done before the capture) */
    float graph_fwd_ms = -1.f, graph_total_ms = -1.f;
    if (graph) {
        /* a capture that fails at its end or at instantiation is reported
         * (-1 ms and a line on stderr), not fatal: the stream-launched
         * times still stand (a call the op refuses exits, as above) */
        auto timeGraph = [&](auto fn) {
            cudaGraph_t g = NULL;
            cudaGraphExec_t exec;
            CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            fn();
            cudaError_t e = cudaStreamEndCapture(stream, &g);
            if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
            if (e != cudaSuccess) {
                fprintf(stderr, "bench_nsa: graph capture at %s S=%d: %s\n", sh.name, S,
                        cudaGetErrorString(e));
                if (g) CK(cudaGraphDestroy(g));
                (void)cudaGetLastError();
                return -1.f;
            }
            float ms = timeIt([&]() { CK(cudaGraphLaunch(exec, stream)); });
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(g));
            return ms;
        };
        graph_fwd_ms = timeGraph(fwd);
        graph_total_ms = timeGraph(fwdBwd);
    }

    /* the per-kernel breakdown's forward + backward (kernels.py) */
    CK(cudaStreamSynchronize(stream));
    CK(cudaProfilerStart());
    fwdBwd();
    CK(cudaStreamSynchronize(stream));
    CK(cudaProfilerStop());

    /* one profiled pass for the phase breakdown */
    nsaAttnCudaProfile(plan, 1, &err);
    fwdBwd();
    const char *names[48];
    float phase_ms[48];
    int np = nsaAttnCudaProfileRead(plan, names, phase_ms, 48, &err);
    if (np < 0) {
        fprintf(stderr, "bench_nsa: profile: %s\n", err.message);
        np = 0;
    }
    nsaAttnCudaProfile(plan, 0, &err);

    unsigned long long *bad;
    CK(cudaMalloc(&bad, 8));
    CK(cudaMemset(bad, 0, 8));
    countNonFinite<<<1024, 256, 0, stream>>>(out, rows * d.d_v, bad);
    countNonFinite<<<1024, 256, 0, stream>>>((const __nv_bfloat16 *)gr.dq, rows * d.d_k, bad);
    countNonFinite<<<1024, 256, 0, stream>>>((const __nv_bfloat16 *)gr.dk_cmp, kvk, bad);
    countNonFinite<<<1024, 256, 0, stream>>>((const __nv_bfloat16 *)gr.dk_sel, kvk, bad);
    countNonFinite<<<1024, 256, 0, stream>>>((const __nv_bfloat16 *)gr.dv_win, kvv, bad);
    unsigned long long nbad = 0;
    CK(cudaMemcpyAsync(&nbad, bad, 8, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));

    Flops f = countFlops(d);
    /* sum of the phases named; a pattern ending in '.' matches a prefix */
    auto phases = [&](std::initializer_list<const char *> patterns) {
        double sum = 0;
        for (int i = 0; i < np; i++)
            for (const char *pat : patterns) {
                size_t n = strlen(pat);
                bool prefix = n > 0 && pat[n - 1] == '.';
                if (prefix ? !strncmp(names[i], pat, n) : !strcmp(names[i], pat))
                    sum += phase_ms[i];
            }
        return sum;
    };
    double t_cmp = phases({"fwd.pool", "fwd.cmp", "bwd.cmp."});
    double t_sel = phases({"fwd.sel", "bwd.sel."});
    double t_win = phases({"fwd.win+gate", "bwd.win.", "bwd.gate"});
    /* the masked dense selected forward runs in the window forward's pass
     * at short S: that pass's time shared out by the two branches' FLOPs */
    const double t_sw = phases({"fwd.sel+win+gate"});
    if (f.sel + f.win > 0) {
        t_sel += t_sw * f.sel / (f.sel + f.win);
        t_win += t_sw * f.win / (f.sel + f.win);
    }
    /* the window and compressed dQ run as one pass: its time is shared out
     * by the two branches' FLOPs (their dQ is the same share of each) */
    const double t_wc = phases({"bwd.win+cmp.dq"});
    if (f.cmp + f.win > 0) {
        t_cmp += t_wc * f.cmp / (f.cmp + f.win);
        t_win += t_wc * f.win / (f.cmp + f.win);
    }
    /* ... and with the selected dQ too where that is masked dense (short S):
     * shared out by the three branches' FLOPs */
    const double t_wcs = phases({"bwd.win+cmp+sel.dq"});
    if (f.cmp + f.win + f.sel > 0) {
        const double all = f.cmp + f.win + f.sel;
        t_cmp += t_wcs * f.cmp / all;
        t_win += t_wcs * f.win / all;
        t_sel += t_wcs * f.sel / all;
    }
    /* ... and beside the fused selected backward at long S, on a second
     * stream chunk by chunk (the phase spans both): shared out by FLOPs,
     * the selected branch's whole backward (2.5 forwards) against the
     * window's and compressed dQ (1.5 each). At short S the selected dK/dV
     * runs beside the other passes; its phase (bwd.sel.wait) is only the
     * time the caller's stream waits for it. */
    const double t_swc = phases({"bwd.sel+win+cmp.dq"});
    if (f.cmp + f.win + f.sel > 0) {
        const double all = 2.5 * f.sel + 1.5 * (f.cmp + f.win);
        t_cmp += t_swc * 1.5 * f.cmp / all;
        t_win += t_swc * 1.5 * f.win / all;
        t_sel += t_swc * 2.5 * f.sel / all;
    }
    double t_score = phases({"fwd.select"});
    double useful = 3.5 * (f.cmp + f.sel + f.win);
    printf("{\"impl\": \"nsa\", \"shape\": \"%s\", \"S\": %d, \"B\": %d, \"fwd_ms\": %.4f, "
           "\"bwd_ms\": %.4f, \"total_ms\": %.4f, \"peak_mib\": %.1f, \"workspace_mib\": %.1f, "
           "\"tflops\": %.1f, \"finite\": %s, ",
           sh.name, S, d.B, fwd_ms, total_ms - fwd_ms, total_ms, (free0 - free1) / 1048576.0,
           nsaAttnCudaPlanBytes(plan) / 1048576.0, useful / (total_ms * 1e-3) / 1e12,
           nbad == 0 ? "true" : "false");
    printf("\"host_ms\": %.4f, ", host_ms);
    if (graph)
        printf("\"graph_fwd_ms\": %.4f, \"graph_total_ms\": %.4f, ", graph_fwd_ms, graph_total_ms);
    printf("\"branches\": {");
    printf("\"cmp\": {\"gflop\": %.1f, \"ms\": %.3f, \"tflops\": %.1f}, ", 3.5 * f.cmp / 1e9, t_cmp,
           t_cmp > 0 ? 3.5 * f.cmp / (t_cmp * 1e-3) / 1e12 : 0);
    printf("\"score\": {\"gflop\": %.1f, \"ms\": %.3f, \"tflops\": %.1f}, ", f.score / 1e9, t_score,
           t_score > 0 ? f.score / (t_score * 1e-3) / 1e12 : 0);
    printf("\"sel\": {\"gflop\": %.1f, \"ms\": %.3f, \"tflops\": %.1f}, ", 3.5 * f.sel / 1e9, t_sel,
           t_sel > 0 ? 3.5 * f.sel / (t_sel * 1e-3) / 1e12 : 0);
    printf("\"win\": {\"gflop\": %.1f, \"ms\": %.3f, \"tflops\": %.1f}}, \"phases\": {", 3.5 * f.win / 1e9,
           t_win, t_win > 0 ? 3.5 * f.win / (t_win * 1e-3) / 1e12 : 0);
    for (int i = 0; i < np; i++) printf("%s\"%s\": %.4f", i ? ", " : "", names[i], phase_ms[i]);
    printf("}}\n");
    fflush(stdout);

    nsaAttnCudaPlanFree(plan);
    const void *bufs[] = {in.q, in.k_cmp, in.v_cmp, in.k_sel, in.v_sel, in.k_win, in.v_win,
                          in.gates, dout, out, gr.dq, gr.dk_cmp, gr.dv_cmp, gr.dk_sel,
                          gr.dv_sel, gr.dk_win, gr.dv_win, gr.dgates, bad};
    for (const void *p : bufs) CK(cudaFree((void *)p));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(stream));
}

int main(int argc, char **argv) {
    const char *seq = "2048,8192,16384,32768,65536", *shapes = "proto,paper,paper192";
    long tokens = 65536;
    int reps = 10, graph = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seq")) seq = argv[i + 1];
        else if (!strcmp(argv[i], "--shapes")) shapes = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens")) tokens = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--graph")) graph = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_nsa: unknown option %s; allowed: --seq --shapes --tokens --reps "
                            "--graph\n",
                    argv[i]);
            return 2;
        }
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("{\"device\": \"%s\", \"impl\": \"nsa\"}\n", prop.name);
    char shape_list[256];
    snprintf(shape_list, sizeof(shape_list), "%s", shapes);
    for (char *sname = strtok(shape_list, ","); sname; sname = strtok(NULL, ",")) {
        const Shape *sh = NULL;
        for (const Shape &s : kShapes)
            if (!strcmp(s.name, sname)) sh = &s;
        if (!sh) {
            fprintf(stderr, "bench_nsa: unknown shape %s; allowed: proto, paper, paper192\n", sname);
            return 2;
        }
        char seq_list[256];
        snprintf(seq_list, sizeof(seq_list), "%s", seq);
        char *save = NULL;
        for (char *s = strtok_r(seq_list, ",", &save); s; s = strtok_r(NULL, ",", &save))
            benchOne(*sh, atoi(s), tokens, reps, graph != 0);
    }
    return 0;
}
