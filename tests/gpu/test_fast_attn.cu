/* test_fast_attn.cu - the fast CUDA NSA attention (kernels/cuda/fast_attn/)
 * against the CPU reference (kernels/cpu/attn_*.c), on fresh random inputs
 * at many shapes: forward output, lse, the selection, and all eight input
 * gradients, plus NaN-freedom and bit-reproducibility of the backward.
 *
 * Inputs are drawn in fp32, rounded to bf16 for the GPU, and the very same
 * rounded values feed the fp32 reference. The selection is a discrete
 * choice: near-ties may legitimately flip between bf16 tensor cores and
 * fp32, so the reference branches downstream of it use the GPU's sel_idx,
 * and the selection itself is checked row by row: a row may differ from
 * the reference only where the swapped blocks' reference scores are within
 * a small tolerance of each other (a tie up to rounding). The reference
 * runs each head on its own (B = H = G = 1 slices, on threads) and sums
 * the heads' key gradients per group in head order afterwards.
 *
 * Usage: test_fast_attn [--count | CASE] [--sel auto|union|warp|block|dense]
 *   [--mma auto|sync|wgmma] [--unfused] [--cmp-parts N] [--sel-chunk-tokens N]
 * (the plan's NsaAttnCudaOptions; bench/attn/run_all.sh runs each design).
 * Prints TAP ("ok N - ..." / "not ok N - ...") and exits non-zero on any
 * failure. Run on the GPU machine: make -C bench fast-test. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "tap_bail.h"

extern "C" {
#include "nsa.h"
#include "cpu/cpu_ops.h"
}

static int g_test = 0, g_failed = 0;
static NsaAttnCudaOptions g_opt; /* the plans' options, from the command line */

static void tap(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tap(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", ok ? "ok" : "not ok", ++g_test);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (!ok) g_failed++;
}


/* splitmix64 + Box-Muller: deterministic from the seed, fresh per case */
struct Rng {
    unsigned long long s;
    unsigned long long next() {
        unsigned long long z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return ((next() >> 11) + 0.5) / 9007199254740992.0; }
    float normal() { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }
};

/* A host tensor drawn in fp32 and rounded to bf16, with its device copy. */
struct Tensor {
    std::vector<float> host;  /* the bf16-rounded values */
    __nv_bfloat16 *dev = nullptr;
    size_t n = 0;
    void alloc(size_t count) {
        n = count;
        host.assign(n ? n : 1, 0.f);
        CK(cudaMalloc(&dev, (n ? n : 1) * sizeof(__nv_bfloat16)));
    }
    void fill(Rng &rng, float lo, float hi, bool gaussian) {
        std::vector<__nv_bfloat16> b(n);
        for (size_t i = 0; i < n; i++) {
            float v = gaussian ? rng.normal() : (float)(lo + (hi - lo) * rng.uniform());
            b[i] = __float2bfloat16(v);
            host[i] = __bfloat162float(b[i]);
        }
        if (n) CK(cudaMemcpy(dev, b.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    }
    void poison() {
        if (n) CK(cudaMemset(dev, 0xFF, n * sizeof(__nv_bfloat16))); /* bf16 NaN */
    }
    std::vector<float> download() const {
        std::vector<__nv_bfloat16> b(n);
        if (n) CK(cudaMemcpy(b.data(), dev, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        std::vector<float> f(n);
        for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(b[i]);
        return f;
    }
    std::vector<unsigned short> raw() const {
        std::vector<unsigned short> b(n);
        if (n) CK(cudaMemcpy(b.data(), dev, n * 2, cudaMemcpyDeviceToHost));
        return b;
    }
    ~Tensor() { cudaFree(dev); }
};

static double relErr(const std::vector<float> &got, const std::vector<float> &ref, size_t *bad) {
    double num = 0, den = 0;
    *bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!isfinite(got[i])) (*bad)++;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    /* A gradient that is exactly zero in exact arithmetic (one visible key:
     * p = 1, dS = p (dp - delta) = 0) comes back as rounding noise; below an
     * RMS of 1e-3 per element the error is measured against that floor. */
    double floor2 = 1e-6 * (double)ref.size();
    return sqrt(num / (den > floor2 ? den : floor2));
}

/* Runs fn(i) for every i in [0, n) on up to one thread per CPU; fn must
 * write disjoint outputs. The CPU reference at the long cases (S = 8500 at
 * 16 heads, S = 65536) took longer single-threaded than a device call
 * allows. */
template <class Fn>
static void parallelFor(int n, Fn fn) {
    const unsigned cpus = std::thread::hardware_concurrency();
    const int threads = std::max(1, std::min(n, (int)(cpus ? cpus : 1)));
    std::atomic<int> next{0};
    auto worker = [&] {
        for (int i; (i = next++) < n;) fn(i);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; t++) pool.emplace_back(worker);
    worker();
    for (auto &t : pool) t.join();
}

/* Slices of the [B][S][N][dim] tensors that the reference runs head by
 * head (B = H = G = 1: the same math per head, its keys those of its
 * group), and their way back. */
struct RefShape {
    int B, S, H, G, Nc;
    NsaAttnDims dims;
    /* dims of one batch row and one group with `heads` heads */
    NsaAttnDims one(int heads) const {
        NsaAttnDims d = dims;
        d.B = 1, d.H = heads, d.G = 1;
        return d;
    }
    /* [t][count][dim] from x[b][t][n0 .. n0 + count)[dim] of `len` tokens a row and N a token */
    template <class T>
    static std::vector<T> slice(const std::vector<T> &x, int len, int N, int dim, int b, int n0,
                                int count) {
        std::vector<T> out((size_t)len * count * dim + 1);
        for (int t = 0; t < len; t++)
            memcpy(&out[(size_t)t * count * dim], &x[(((size_t)b * len + t) * N + n0) * dim],
                   (size_t)count * dim * sizeof(T));
        return out;
    }
    template <class T>
    static void put(std::vector<T> &x, const std::vector<T> &part, int len, int N, int dim, int b,
                    int n0, int count, bool add) {
        for (int t = 0; t < len; t++)
            for (size_t c = 0; c < (size_t)count * dim; c++) {
                T &at = x[(((size_t)b * len + t) * N + n0) * dim + c];
                const T v = part[(size_t)t * count * dim + c];
                at = add ? at + v : v;
            }
    }
    std::vector<float> rowsOf(const std::vector<float> &x, int dim, int b, int h0,
                              int count) const {
        return slice(x, S, H, dim, b, h0, count);
    }
    void putRows(std::vector<float> &x, const std::vector<float> &part, int dim, int b, int h0,
                 int count) const {
        put(x, part, S, H, dim, b, h0, count, false);
    }
    template <class T>
    std::vector<T> keysOf(const std::vector<T> &x, int dim, int b, int g) const {
        return slice(x, S, G, dim, b, g, 1);
    }
    template <class T>
    void putKeys(std::vector<T> &x, const std::vector<T> &part, int dim, int b, int g) const {
        put(x, part, S, G, dim, b, g, 1, false);
    }
    void addKeys(std::vector<float> &x, const std::vector<float> &part, int dim, int b,
                 int g) const {
        put(x, part, S, G, dim, b, g, 1, true);
    }
    std::vector<float> blocksOf(const std::vector<float> &x, int dim, int b, int g) const {
        return slice(x, Nc, G, dim, b, g, 1);
    }
    void addBlocks(std::vector<float> &x, const std::vector<float> &part, int dim, int b,
                   int g) const {
        put(x, part, Nc, G, dim, b, g, 1, true);
    }
};

struct Case {
    const char *name;
    int B, S, H, G, dk, dv, l, d, l_sel, n_sel, w;
};

static void runCase(const Case &k, unsigned long long seed) {
    NsaAttnDims dims = {k.B, k.S, k.H, k.G, k.dk, k.dv, k.l, k.d, k.l_sel, k.n_sel, k.w};
    const size_t T = (size_t)k.B * k.S, rows = T * k.H;
    const int slots = nsaNumSelSlots(k.n_sel), Ns = nsaNumSelBlocks(k.S, k.l_sel);
    const int Nc = nsaNumCmpBlocks(k.S, k.l, k.d), hpg = k.H / k.G;
    Rng rng{seed};
    Tensor q, kc_in, vc_in, ks, vs, kw, vw, gates, dout;
    q.alloc(rows * k.dk);
    kc_in.alloc(T * k.G * k.dk);
    vc_in.alloc(T * k.G * k.dv);
    ks.alloc(T * k.G * k.dk);
    vs.alloc(T * k.G * k.dv);
    kw.alloc(T * k.G * k.dk);
    vw.alloc(T * k.G * k.dv);
    gates.alloc(rows * 3);
    dout.alloc(rows * k.dv);
    for (Tensor *t : {&q, &kc_in, &vc_in, &ks, &vs, &kw, &vw, &dout}) t->fill(rng, 0, 0, true);
    gates.fill(rng, 0.05f, 0.95f, false);

    Tensor out, dq, dkc, dvc, dks, dvs, dkw, dvw, dg;
    out.alloc(rows * k.dv);
    dq.alloc(rows * k.dk);
    dkc.alloc(T * k.G * k.dk);
    dvc.alloc(T * k.G * k.dv);
    dks.alloc(T * k.G * k.dk);
    dvs.alloc(T * k.G * k.dv);
    dkw.alloc(T * k.G * k.dk);
    dvw.alloc(T * k.G * k.dv);
    dg.alloc(rows * 3);
    int32_t *sel_dev;
    float *lse_dev;
    CK(cudaMalloc(&sel_dev, T * k.G * slots * sizeof(int32_t)));
    CK(cudaMalloc(&lse_dev, rows * sizeof(float)));

    NsaError err = {{0}};
    NsaAttnCudaPlan *plan = nsaAttnCudaPlanCreate(&dims, &g_opt, &err);
    if (!plan) {
        tap(false, "%s: plan: %s", k.name, err.message);
        return;
    }
    NsaAttnDeviceInputs in = {q.dev, kc_in.dev, vc_in.dev, ks.dev, vs.dev, kw.dev, vw.dev, gates.dev};
    NsaAttnDeviceGrads gr = {dq.dev, dkc.dev, dvc.dev, dks.dev, dvs.dev, dkw.dev, dvw.dev, dg.dev};
    for (Tensor *t : {&out, &dq, &dkc, &dvc, &dks, &dvs, &dkw, &dvw, &dg}) t->poison();
    CK(cudaMemset(sel_dev, 0x7F, T * k.G * slots * sizeof(int32_t)));
    int rc = nsaAttnForwardCuda(plan, &dims, &in, out.dev, sel_dev, lse_dev, NULL, &err);
    if (rc == 0) rc = nsaAttnBackwardCuda(plan, &dims, &in, dout.dev, &gr, NULL, &err);
    cudaError_t sync = cudaDeviceSynchronize();
    if (rc != 0 || sync != cudaSuccess) {
        tap(false, "%s: run: %s %s", k.name, rc ? err.message : "",
            sync != cudaSuccess ? cudaGetErrorString(sync) : "");
        exit(1); /* a device fault poisons the context: stop here */
    }
    std::vector<int32_t> sel(T * k.G * slots);
    std::vector<float> lse_gpu(rows);
    CK(cudaMemcpy(sel.data(), sel_dev, sel.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse_gpu.data(), lse_dev, rows * 4, cudaMemcpyDeviceToHost));

    /* the reference, branch by branch as kernels/nsa_attn.c, with the GPU's selection */
    std::vector<float> kc((size_t)k.B * Nc * k.G * k.dk + 1), vc((size_t)k.B * Nc * k.G * k.dv + 1);
    std::vector<float> o_cmp(rows * k.dv), o_sel(rows * k.dv), o_win(rows * k.dv), ref_out(rows * k.dv);
    std::vector<float> l_cmp(rows), l_sel(rows), l_win(rows);
    nsaCpuPoolAvgForwardF32(kc.data(), kc_in.host.data(), k.B, k.S, k.G, k.dk, k.l, k.d);
    nsaCpuPoolAvgForwardF32(vc.data(), vc_in.host.data(), k.B, k.S, k.G, k.dv, k.l, k.d);
    const RefShape sh = {k.B, k.S, k.H, k.G, Nc, dims};
    /* each head's three branches on its own (B = H = G = 1); heads write disjoint rows */
    parallelFor(k.B * k.H, [&](int task) {
        const int b = task / k.H, h = task % k.H, g = h / hpg;
        const NsaAttnDims d1 = sh.one(1);
        const auto q1 = sh.rowsOf(q.host, k.dk, b, h, 1);
        const auto sel1 = sh.keysOf(sel, slots, b, g);
        std::vector<float> o1((size_t)k.S * k.dv), l1(k.S);
        nsaCpuCmpAttnForwardF32(o1.data(), l1.data(), q1.data(), sh.blocksOf(kc, k.dk, b, g).data(),
                                sh.blocksOf(vc, k.dv, b, g).data(), &d1);
        sh.putRows(o_cmp, o1, k.dv, b, h, 1);
        sh.putRows(l_cmp, l1, 1, b, h, 1);
        nsaCpuSelAttnForwardF32(o1.data(), l1.data(), q1.data(),
                                sh.keysOf(ks.host, k.dk, b, g).data(),
                                sh.keysOf(vs.host, k.dv, b, g).data(), sel1.data(), &d1);
        sh.putRows(o_sel, o1, k.dv, b, h, 1);
        sh.putRows(l_sel, l1, 1, b, h, 1);
        nsaCpuWinAttnForwardF32(o1.data(), l1.data(), q1.data(),
                                sh.keysOf(kw.host, k.dk, b, g).data(),
                                sh.keysOf(vw.host, k.dv, b, g).data(), &d1);
        sh.putRows(o_win, o1, k.dv, b, h, 1);
        sh.putRows(l_win, l1, 1, b, h, 1);
    });
    /* the selection per (b, g): its score sums the group's heads */
    std::vector<int32_t> sel_ref(T * k.G * slots);
    std::vector<float> scores(T * k.G * (size_t)Ns + 1);
    std::atomic<int> select_failed{0};
    parallelFor(k.B * k.G, [&](int task) {
        const int b = task / k.G, g = task % k.G;
        const NsaAttnDims dg = sh.one(hpg);
        std::vector<int32_t> sel1((size_t)k.S * slots);
        std::vector<float> scores1((size_t)k.S * Ns + 1);
        if (nsaCpuSelectBlocksF32(sel1.data(), scores1.data(),
                                  sh.rowsOf(q.host, k.dk, b, g * hpg, hpg).data(),
                                  sh.blocksOf(kc, k.dk, b, g).data(),
                                  sh.rowsOf(l_cmp, 1, b, g * hpg, hpg).data(), &dg))
            select_failed++;
        sh.putKeys(sel_ref, sel1, slots, b, g);
        sh.putKeys(scores, scores1, Ns, b, g);
    });
    if (select_failed) {
        tap(false, "%s: reference selection refused the shape (Ns = %d)", k.name, Ns);
        nsaAttnCudaPlanFree(plan);
        cudaFree(sel_dev);
        cudaFree(lse_dev);
        return;
    }
    nsaCpuGateCombineForwardF32(ref_out.data(), gates.host.data(), o_cmp.data(), o_sel.data(),
                                o_win.data(), &dims);

    /* selection: identical rows, or a swap within a score tie */
    size_t differ = 0, hard = 0, invalid = 0;
    for (size_t r = 0; r < T * k.G; r++) {
        const int32_t *a = &sel[r * slots], *b = &sel_ref[r * slots];
        for (int e = 0; e < slots; e++)
            if (a[e] < -1 || a[e] >= Ns || (e > 0 && a[e] >= 0 && a[e] <= a[e - 1])) invalid++;
        if (memcmp(a, b, slots * 4) == 0) continue;
        differ++;
        const float *s = &scores[r * Ns];
        float min_gpu_only = INFINITY, max_ref_only = -INFINITY, top = 0;
        for (int j = 0; j < Ns; j++) top = fmaxf(top, s[j]);
        for (int e = 0; e < slots; e++) {
            bool in_ref = false, in_gpu = false;
            for (int f = 0; f < slots; f++) {
                in_ref |= a[e] >= 0 && b[f] == a[e];
                in_gpu |= b[e] >= 0 && a[f] == b[e];
            }
            if (a[e] >= 0 && !in_ref) min_gpu_only = fminf(min_gpu_only, s[a[e]]);
            if (b[e] >= 0 && !in_gpu) max_ref_only = fmaxf(max_ref_only, s[b[e]]);
        }
        if (max_ref_only - min_gpu_only > 1e-2f * fmaxf(top, 1e-3f) + 1e-5f) hard++;
    }
    tap(invalid == 0 && hard == 0,
        "%s: selection valid and equal up to ties (%zu rows of %zu differ by near-ties, %zu "
        "real mismatches, %zu invalid entries)",
        k.name, differ, T * k.G, hard, invalid);

    size_t bad_lse = 0;
    double lse_err = 0;
    for (size_t r = 0; r < rows; r++) {
        if (isinf(l_cmp[r]) || isinf(lse_gpu[r])) {
            bad_lse += !(isinf(l_cmp[r]) && isinf(lse_gpu[r]) && l_cmp[r] < 0 && lse_gpu[r] < 0);
        } else {
            lse_err = fmax(lse_err, fabs((double)lse_gpu[r] - l_cmp[r]));
            bad_lse += !isfinite(lse_gpu[r]);
        }
    }
    tap(bad_lse == 0 && lse_err < 2e-2, "%s: lse_cmp max abs error %.2e, %zu rows wrong", k.name,
        lse_err, bad_lse);

    size_t bad;
    double e = relErr(out.download(), ref_out, &bad);
    tap(bad == 0 && e < 1e-2, "%s: forward out rel err %.2e (%zu non-finite)", k.name, e, bad);

    /* backward reference: each head on its own into its own key gradients,
     * summed per (b, g) afterwards in head order */
    std::vector<float> r_dq(rows * k.dk, 0), r_dkc(T * k.G * k.dk, 0), r_dvc(T * k.G * k.dv, 0);
    std::vector<float> r_dks(T * k.G * k.dk, 0), r_dvs(T * k.G * k.dv, 0);
    std::vector<float> r_dkw(T * k.G * k.dk, 0), r_dvw(T * k.G * k.dv, 0), r_dg(rows * 3, 0);
    std::vector<float> do_c(rows * k.dv, 0), do_s(rows * k.dv, 0), do_w(rows * k.dv, 0);
    std::vector<float> dkcp(kc.size(), 0), dvcp(vc.size(), 0);
    nsaCpuGateCombineBackwardF32(r_dg.data(), do_c.data(), do_s.data(), do_w.data(),
                                 dout.host.data(), gates.host.data(), o_cmp.data(), o_sel.data(),
                                 o_win.data(), &dims);
    struct HeadGrads {
        std::vector<float> dq, dks, dvs, dkw, dvw, dkc, dvc;
    };
    std::vector<HeadGrads> head(k.B * k.H);
    parallelFor(k.B * k.H, [&](int task) {
        const int b = task / k.H, h = task % k.H, g = h / hpg;
        const NsaAttnDims d1 = sh.one(1);
        HeadGrads &hg = head[task];
        hg.dq.assign((size_t)k.S * k.dk, 0.f);
        hg.dkw.assign((size_t)k.S * k.dk, 0.f);
        hg.dvw.assign((size_t)k.S * k.dv, 0.f);
        hg.dks.assign((size_t)k.S * k.dk, 0.f);
        hg.dvs.assign((size_t)k.S * k.dv, 0.f);
        hg.dkc.assign((size_t)Nc * k.dk + 1, 0.f);
        hg.dvc.assign((size_t)Nc * k.dv + 1, 0.f);
        const auto q1 = sh.rowsOf(q.host, k.dk, b, h, 1);
        nsaCpuWinAttnBackwardF32(
            hg.dq.data(), hg.dkw.data(), hg.dvw.data(), sh.rowsOf(do_w, k.dv, b, h, 1).data(),
            q1.data(), sh.keysOf(kw.host, k.dk, b, g).data(), sh.keysOf(vw.host, k.dv, b, g).data(),
            sh.rowsOf(o_win, k.dv, b, h, 1).data(), sh.rowsOf(l_win, 1, b, h, 1).data(), &d1);
        nsaCpuSelAttnBackwardF32(
            hg.dq.data(), hg.dks.data(), hg.dvs.data(), sh.rowsOf(do_s, k.dv, b, h, 1).data(),
            q1.data(), sh.keysOf(ks.host, k.dk, b, g).data(), sh.keysOf(vs.host, k.dv, b, g).data(),
            sh.keysOf(sel, slots, b, g).data(), sh.rowsOf(o_sel, k.dv, b, h, 1).data(),
            sh.rowsOf(l_sel, 1, b, h, 1).data(), &d1);
        nsaCpuCmpAttnBackwardF32(
            hg.dq.data(), hg.dkc.data(), hg.dvc.data(), sh.rowsOf(do_c, k.dv, b, h, 1).data(),
            q1.data(), sh.blocksOf(kc, k.dk, b, g).data(), sh.blocksOf(vc, k.dv, b, g).data(),
            sh.rowsOf(o_cmp, k.dv, b, h, 1).data(), sh.rowsOf(l_cmp, 1, b, h, 1).data(), &d1);
    });
    for (int task = 0; task < k.B * k.H; task++) {
        const int b = task / k.H, h = task % k.H, g = h / hpg;
        HeadGrads &hg = head[task];
        sh.putRows(r_dq, hg.dq, k.dk, b, h, 1);
        sh.addKeys(r_dkw, hg.dkw, k.dk, b, g);
        sh.addKeys(r_dvw, hg.dvw, k.dv, b, g);
        sh.addKeys(r_dks, hg.dks, k.dk, b, g);
        sh.addKeys(r_dvs, hg.dvs, k.dv, b, g);
        sh.addBlocks(dkcp, hg.dkc, k.dk, b, g);
        sh.addBlocks(dvcp, hg.dvc, k.dv, b, g);
        hg = HeadGrads();
    }
    nsaCpuPoolAvgBackwardF32(r_dkc.data(), dkcp.data(), k.B, k.S, k.G, k.dk, k.l, k.d);
    nsaCpuPoolAvgBackwardF32(r_dvc.data(), dvcp.data(), k.B, k.S, k.G, k.dv, k.l, k.d);

    struct { const char *name; Tensor *t; std::vector<float> *ref; } grads[] = {
        {"dq", &dq, &r_dq},       {"dk_cmp", &dkc, &r_dkc}, {"dv_cmp", &dvc, &r_dvc},
        {"dk_sel", &dks, &r_dks}, {"dv_sel", &dvs, &r_dvs}, {"dk_win", &dkw, &r_dkw},
        {"dv_win", &dvw, &r_dvw}, {"dgates", &dg, &r_dg},
    };
    char line[512];
    int at = 0;
    bool all_ok = true;
    std::vector<std::vector<unsigned short>> first;
    for (auto &g : grads) {
        double ge = relErr(g.t->download(), *g.ref, &bad);
        /* an all-zero reference (no compressed block visible yet) must come back as zeros */
        bool ok = bad == 0 && ge < 1e-2;
        all_ok &= ok;
        at += snprintf(line + at, sizeof(line) - at, " %s %.1e%s", g.name, ge, ok ? "" : "(!)");
        first.push_back(g.t->raw());
    }
    tap(all_ok, "%s: gradients rel err:%s", k.name, line);

    /* determinism: a second backward must be bit-identical */
    for (Tensor *t : {&dq, &dkc, &dvc, &dks, &dvs, &dkw, &dvw, &dg}) t->poison();
    rc = nsaAttnBackwardCuda(plan, &dims, &in, dout.dev, &gr, NULL, &err);
    CK(cudaDeviceSynchronize());
    bool same = rc == 0;
    for (size_t i = 0; i < 8 && same; i++) same = grads[i].t->raw() == first[i];
    tap(same, "%s: backward is bit-reproducible", k.name);

    nsaAttnCudaPlanFree(plan);
    cudaFree(sel_dev);
    cudaFree(lse_dev);
    (void)hpg;
}

int main(int argc, char **argv) {
    /* name, B, S, H, G, dk, dv, l, d, l', n, w */
    const Case cases[] = {
        {"S1 proto", 1, 1, 2, 1, 64, 64, 32, 16, 64, 16, 512},
        {"S31 hpg2", 2, 31, 4, 2, 64, 64, 32, 16, 64, 16, 512},
        {"S100 B2", 2, 100, 4, 2, 64, 64, 32, 16, 64, 16, 512},
        {"S1000 proto 12/2", 1, 1000, 12, 2, 64, 64, 32, 16, 64, 16, 128},
        {"S2085 hpg16 d128", 1, 2085, 16, 1, 128, 128, 32, 16, 64, 16, 512},
        {"S777 hpg1 dk192 dv128", 1, 777, 8, 8, 192, 128, 32, 16, 64, 16, 100},
        {"S1500 hpg3 dk128 dv64 l'32", 1, 1500, 6, 2, 128, 64, 32, 16, 32, 8, 64},
        {"S300 l16 d8 l'16 n4", 1, 300, 4, 1, 64, 64, 16, 8, 16, 4, 40},
        {"S513 hpg5", 1, 513, 10, 2, 64, 64, 32, 16, 64, 16, 512},
        {"S4096 hpg4 n_sel2", 1, 4096, 4, 1, 64, 64, 32, 16, 64, 2, 256},
        {"S200 l'=d=l=1 (full causal)", 1, 200, 2, 1, 64, 64, 1, 1, 1, 32, 1},
        {"S1200 paper-like 16/1 d128 l'128", 1, 1200, 16, 1, 128, 128, 32, 16, 128, 16, 512},
        {"S1700 hpg8", 1, 1700, 16, 2, 64, 64, 32, 16, 64, 16, 256},
        {"S700 hpg12 d128", 1, 700, 12, 1, 128, 128, 32, 16, 64, 16, 256},
        /* l' = 3 d: 64 compressed blocks are no whole number of selection
         * blocks (the score pass folds per tile, not by its periodic map) */
        {"S900 l'48 hpg4", 1, 900, 8, 2, 64, 64, 32, 16, 48, 12, 128},
        /* the long end, against the full CPU reference (one thread per
         * head: two here, so about 140 and 90 s on the H100 machine): the
         * issue's 64k, and an S that is no multiple of any block size with
         * d_k != d_v */
        {"S65536 hpg2", 1, 65536, 2, 1, 64, 64, 32, 16, 64, 16, 512},
        {"S32771 hpg2 dk128 dv64", 1, 32771, 2, 1, 128, 64, 32, 16, 64, 16, 512},
        /* several token chunks of the block-centric passes per batch row
         * (16384 tokens a chunk at the first shape, 8192 per row at the
         * second: 16 heads a group at d = 128, the paper's), B = 2, the
         * last chunk short (the second about 60 s: 32 heads' references
         * on 16 CPUs; single-threaded it had not finished in 330 s) */
        {"S20000 B2 hpg2", 2, 20000, 4, 2, 64, 64, 32, 16, 64, 16, 512},
        {"S8500 B2 hpg16 d128", 2, 8500, 16, 1, 128, 128, 32, 16, 64, 16, 512},
        /* the paper's own d_k 192 / d_v 128 at 16 heads a group past the
         * masked dense range: the fused selected backward's two row
         * warpgroups (fast_sel_block.cu, selFusedRowWgs), B = 2 */
        {"S6000 B2 hpg16 dk192 dv128", 2, 6000, 16, 1, 192, 128, 32, 16, 64, 16, 512},
    };
    const int n = sizeof(cases) / sizeof(cases[0]);
    int only = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int word = -1;
        if (!strcmp(a, "--count")) {
            printf("%d\n", n);
            return 0;
        } else if (!strcmp(a, "--unfused")) {
            g_opt.sel_unfused = word = 1;
        } else if (!strcmp(a, "--sel") && v) {
            const char *names[] = {"auto", "union", "warp", "block", "dense"};
            for (int j = 0; j < 5; j++)
                if (!strcmp(v, names[j])) word = j;
            g_opt.sel = (NsaAttnSelDesign)word;
            i++;
        } else if (!strcmp(a, "--mma") && v) {
            const char *names[] = {"auto", "sync", "wgmma"};
            for (int j = 0; j < 3; j++)
                if (!strcmp(v, names[j])) word = j;
            g_opt.mma = (NsaAttnMma)word;
            i++;
        } else if (!strcmp(a, "--cmp-parts") && v) {
            g_opt.cmp_parts = word = atoi(v);
            i++;
        } else if (!strcmp(a, "--sel-chunk-tokens") && v) {
            g_opt.sel_chunk_tokens = word = atoi(v);
            i++;
        } else if (a[0] != '-') {
            only = word = atoi(a);
        }
        if (word < 0) {
            fprintf(stderr, "test_fast_attn: bad argument %s%s%s (usage at the top of "
                            "tests/gpu/test_fast_attn.cu)\n", a, v ? " " : "", v ? v : "");
            return 2;
        }
    }
    printf("1..%d\n", only >= 0 ? 5 : 5 * n);
    for (int i = 0; i < n; i++) {
        if (only >= 0 && i != only) continue;
        runCase(cases[i], 0x5EEDull * (i + 1) + (unsigned long long)time(NULL));
    }
    printf("# %d of %d failed\n", g_failed, g_test);
    return g_failed ? 1 : 0;
}
