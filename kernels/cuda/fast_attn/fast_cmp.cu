/* fast_cmp.cu - the compressed branch: avg pooling of the keys and values
 * into blocks, flash attention over the pooled blocks, and its backward.
 *
 * Block i covers tokens [i*d, i*d+l) and is visible at t when i*d+l-1 <= t.
 * The forward saves only o_cmp and lse_cmp (no S x Nc matrix): the
 * selection pass and the backward recompute P = exp(s - lse) tile by tile.
 * dK/dV: key tile i0 is seen by every token from i0*d+l-1 on, so its rows
 * are split among `parts` CTAs - equal token ranges that every key tile's
 * CTA of that part walks in step (CmpRanges: at two key warpgroups per
 * CTA; the count from a model of the CTA schedule, fastCmpBackwardParts),
 * or row tiles dealt round-robin with the CTAs started longest first; each
 * writes an fp32 partial and the pooling backward sums the parts in a
 * fixed order - no atomics, reproducible. The compressed dq comes from the
 * window + compressed dQ pass (fastWinCmpDq). */
#include "fast_host.h"
#include "fast_policy.cuh"
#include "tile_fwd.cuh"
#include "tile_dkdv.cuh"

#include <algorithm>
#include <functional>
#include <vector>

/* pooled[b][i][g][c] = (1/l) sum_{j<l} x[b][i*d+j][g][c], fp32 sum. */
__global__ void cmpPoolKernel(bf16 *pooled, const bf16 *x, int B, int S, int G, int dim, int l,
                              int d, int Nc) {
    size_t n = (size_t)B * Nc * G * dim;
    float inv = 1.f / (float)l;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % dim);
        size_t rest = idx / dim;
        int g = (int)(rest % G);
        rest /= G;
        int i = (int)(rest % Nc);
        int b = (int)(rest / Nc);
        const bf16 *src = x + (((size_t)b * S + (size_t)i * d) * G + g) * dim + c;
        float acc = 0.f;
        for (int j = 0; j < l; j++) acc += __bfloat162float(src[(size_t)j * G * dim]);
        pooled[idx] = __float2bfloat16(acc * inv);
    }
}

/* dx[b][t][g][c] = (1/l) sum over blocks i holding t (ascending) of
 * (sum over parts p (ascending) of part[p][b][i][g][c]).
 *
 * A CTA per run of `run` blocks [i0, i1) of one (b, g): it first
 * sums each block's parts once - for the run and the blocks before it that
 * still reach its first token (l > d: blocks overlap) - into shared
 * memory, then writes the tokens [i0 d, i1 d) (the last run: to S) from
 * those sums, four channels a thread. Summed per token instead, as before,
 * each block's parts were read again for every one of the l tokens it
 * holds: l / d x parts loads per output. dim is a multiple of 4. */
#define CMP_POOL_RUN 32
__global__ void cmpPoolBackwardKernel(bf16 *dx, const float *part, int parts, int B, int S, int G,
                                      int dim, int l, int d, int Nc, int run) {
    extern __shared__ float4 block_sum[]; /* [blocks of the run and its halo][dim / 4] */
    const int dim4 = dim / 4;
    const int b = blockIdx.y / G, g = blockIdx.y % G;
    const int i0 = blockIdx.x * run, i1 = min(Nc, i0 + run);
    const int ih = max(0, i0 - (l - 1) / d); /* first block reaching token i0 d */
    const int nblk = i1 - ih;
    for (int idx = threadIdx.x; idx < nblk * dim4; idx += blockDim.x) {
        const int i = ih + idx / dim4, c = (idx % dim4) * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int p = 0; p < parts; p++) {
            const float4 v =
                *(const float4 *)(part + ((((size_t)p * B + b) * Nc + i) * G + g) * dim + c);
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
        }
        block_sum[idx] = acc;
    }
    __syncthreads();
    const float inv = 1.f / (float)l;
    const int t0 = i0 * d;
    const int t1 = i1 == Nc ? S : i1 * d;
    for (int idx = threadIdx.x; idx < (t1 - t0) * dim4; idx += blockDim.x) {
        const int t = t0 + idx / dim4, c4 = idx % dim4;
        const int ilo = t - l + 1 <= 0 ? 0 : (t - l + 1 + d - 1) / d;
        const int ihi = min(Nc - 1, t / d);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i = ilo; i <= ihi; i++) {
            const float4 v = block_sum[(i - ih) * dim4 + c4];
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
        }
        *(uint2 *)(dx + (((size_t)b * S + t) * G + g) * dim + c4 * 4) =
            make_uint2(fastPack(acc.x * inv, acc.y * inv), fastPack(acc.z * inv, acc.w * inv));
    }
}

/* Whether the compressed dK/dV at these dims splits its rows into token
 * ranges (else interleaved row tiles): where it runs two key warpgroups
 * per CTA, one CTA per SM (d_k + d_v >= 256 on wgmma). There the
 * interleaved parts read their q / dout rows from DRAM several times over
 * (the CTAs of later waves walk other rows); ranges read them about once.
 * With one key warpgroup (three CTAs per SM, the prototype's shape) the
 * interleaved parts mostly hit L2 already and the ranges' equal CTAs
 * balance worse. */
template <bool WG, int DK, int DV> struct CmpRanges {
    static constexpr bool value = FastDkdvShape<WG, DK, DV>::KWG > 1;
};
/* The dK/dV of keys [i0, khi) over `ntiles` row tiles of tpr tokens from
 * tileStart(it) (tokens from hi on are none), into part `part`'s fp32
 * partial. */
template <int DK, int DV, bool WG, class TileStart>
__device__ __forceinline__ void cmpDkdvWalk(const FastCtx &c, const FastBwdIo &io,
                                            const FastRowMaps &maps, float *part_k,
                                            float *part_v, int b, int g, int part, int i0,
                                            int khi, int ntiles, int hi, TileStart tileStart) {
    const int tpr = FAST_DKDV_ROWS / c.hpg;
    const int l = c.cmp_len, d = c.cmp_stride, Nc = c.Nc, B = c.B, G = c.G;
    auto visible = [=](int t, int i) { return i * d + l - 1 <= t; };
    auto seesAny = [=](int it, int ia, int) { /* the tile's last token sees block ia */
        return ia * d + l - 1 <= min(hi, tileStart(it) + tpr) - 1;
    };
    auto tileFull = [=](int it, int, int ia) { /* tokens of row tile it: [t, t + tpr) */
        int t = tileStart(it);
        return t + tpr <= hi && (ia + 63) * d + l - 1 <= t;
    };
    auto store = [=](int i, bool is_k, int col, float v0, float v1) {
        size_t blk = (((size_t)part * B + b) * Nc + i) * G + g;
        if (is_k)
            *(float2 *)(part_k + blk * DK + col) = make_float2(v0, v1);
        else
            *(float2 *)(part_v + blk * DV + col) = make_float2(v0, v1);
    };
    constexpr int KWG = FastDkdvShape<WG, DK, DV>::KWG;
    auto tokenOf = [=](int it, int slot) { /* row tile it: tokens tileStart(it) .., none from hi */
        int t = tileStart(it) + slot;
        return t < hi ? t : -1;
    };
    fastDkdvConsecutive<DK, DV, WG, KWG>(c, io, maps, b, g, i0, khi, ntiles, tokenOf, visible,
                                         seesAny, tileFull, store);
}

/* dK, dV of the pooled keys [i0, i0 + KEYS) of (b, g) (grid: key tiles x parts x B*G), summed
 * over the rows (t, h of group g) of its part (a token range, or every parts-th row tile:
 * CmpRanges) that see block i (i*d + l - 1 <= t): dvc_i = sum g_cmp P_ti dout_t,
 * dkc_i = scale sum dS_ti q_t, dS_ti = g_cmp P_ti (dout_t.vc_i - dout_t.o_cmp), P = exp(s - lse);
 * into the part's fp32 partial [part][b][i][g][c] (cmpPoolBackwardKernel sums the parts). */
template <int DK, int DV, bool WG>
__global__ void __launch_bounds__(FastDkdvShape<WG, DK, DV>::THREADS)
cmpDkdvKernel(FastCtx c, FastBwdIo io, float *part_k, float *part_v,
              const __grid_constant__ FastRowMaps maps) {
    constexpr int KT = FastDkdvShape<WG, DK, DV>::KEYS;
    const int parts = gridDim.y, BG = gridDim.z, ktiles = gridDim.x;
    const int linear = blockIdx.x + ktiles * (blockIdx.y + parts * blockIdx.z);
    int key_tile, bg, part;
    if constexpr (CmpRanges<WG, DK, DV>::value) {
        /* Part p walks the p-th of `parts` equal token ranges (whole row
         * tiles), and the index runs over parts outermost, last range
         * first, then key tiles in order: the CTAs running together walk
         * one range in step and share its q / dout rows in L2. */
        part = parts - 1 - linear / (ktiles * BG);
        const int rest = linear % (ktiles * BG);
        key_tile = rest / BG, bg = rest % BG;
    } else {
        /* Part p takes every parts-th row tile. Longest first: CTAs start
         * in linear-index order, and key tile x has work ~ S - x*64*d, so
         * the index runs over key tiles outermost (every part and (b, g) of
         * tile 0 first). Without it the long CTAs of late (b, g) started
         * last and the pass ran about 1.36x its balanced time (a
         * greedy-schedule model of the paper shape at 64k). */
        key_tile = linear / (parts * BG);
        const int rest = linear % (parts * BG);
        bg = rest / parts, part = rest % parts;
    }
    const int b = bg / c.G, g = bg % c.G;
    const int i0 = key_tile * KT, khi = min(c.Nc, i0 + KT);
    const int tb = i0 * c.cmp_stride + c.cmp_len - 1; /* first token seeing block i0 */
    const int tpr = FAST_DKDV_ROWS / c.hpg, S = c.S;
    /* Row tiles go last token first: every key tile's rows end at the same
     * token, so the CTAs running together walk the same rows and share them
     * in L2; first token first, each started at its own key tile's first
     * token and the q / dout stream came from DRAM. Each mode passes its own tileStart (one
     * formula for both cost the prototype's instance 15 registers: two CTAs
     * a SM instead of three). */
    if constexpr (CmpRanges<WG, DK, DV>::value) {
        const int span = (S + parts * tpr - 1) / (parts * tpr) * tpr;
        const int lo = max(tb, part * span), hi = min(S, (part + 1) * span);
        const int ntiles = hi > lo ? (hi - lo + tpr - 1) / tpr : 0;
        cmpDkdvWalk<DK, DV, WG>(c, io, maps, part_k, part_v, b, g, part, i0, khi, ntiles, hi,
                                [=](int it) { return lo + (ntiles - 1 - it) * tpr; });
    } else {
        const int total = (S - tb + tpr - 1) / tpr;
        const int ntiles = total > part ? (total - part + parts - 1) / parts : 0;
        cmpDkdvWalk<DK, DV, WG>(
            c, io, maps, part_k, part_v, b, g, part, i0, khi, ntiles, S,
            [=](int it) { return tb + (part + (ntiles - 1 - it) * parts) * tpr; });
    }
}

/* The compressed dK/dV kernel of c's tensor-core path: its instance, keys
 * per CTA, threads and dynamic shared memory. Cannot fail. */
template <int DK, int DV> struct CmpDkdvLaunch {
    decltype(&cmpDkdvKernel<DK, DV, true>) kernel;
    int keys, threads, smem;
};
template <int DK, int DV>
static CmpDkdvLaunch<DK, DV> cmpDkdvLaunch(const FastCtx &c) {
    using Wg = FastDkdvShape<true, DK, DV>;
    using Sync = FastDkdvShape<false, DK, DV>;
    if (c.wgmma) {
        return {cmpDkdvKernel<DK, DV, true>, Wg::KEYS, Wg::THREADS,
                FastDkdvRing<DK, DV, Wg::KWG, false>::SMEM};
    }
    return {cmpDkdvKernel<DK, DV, false>, Sync::KEYS, Sync::THREADS,
            fastDkdvSmem(DK, DV, false, Sync::KEYS / 64)};
}

cudaError_t fastPoolForward(bf16 *pooled, const bf16 *x, const FastCtx &c, int dim,
                            cudaStream_t stream) {
    size_t n = (size_t)c.B * c.Nc * c.G * dim;
    if (n == 0) return cudaSuccess;
    unsigned blocks = (unsigned)min((size_t)65535 * 8, (n + 255) / 256);
    cmpPoolKernel<<<blocks, 256, 0, stream>>>(pooled, x, c.B, c.S, c.G, dim, c.cmp_len,
                                              c.cmp_stride, c.Nc);
    return cudaGetLastError();
}

/* Interleaved parts past 8 only as a doubling, where the balance target
 * asks for 16 or more and a part still holds 1024 tokens (S >= 16384): the
 * pooling backward reads every part, so more parts pay only where the
 * dK/dV pass gains more than that read costs. */
static int cmpInterleavedParts(const FastCtx &c, int sm_count) {
    /* The longest CTA (key tile 0, S/parts rows) should not outlast the
     * balanced pass: with the triangle of work, 2 CTAs of 64 keys per SM
     * (or, on wgmma, one of 128: the same count in 64-key units) and the
     * CTAs started longest first, 4 waves' worth of CTAs keep the greedy
     * schedule within about 1% of balanced (a model); 8 waves were a
     * little faster (FAST_CMP_BALANCE_CTAS). */
    long long ctas = (long long)((c.Nc + 63) / 64) * c.B * c.G;
    long long p = ((long long)FAST_CMP_BALANCE_CTAS * sm_count + ctas - 1) / ctas;
    const int cap = p <= 8 ? 8 : c.S >= 16384 && p >= 16 ? 16 : 8;
    return (int)(p < 1 ? 1 : (p > cap ? cap : p));
}

/* The modelled length, in row tiles, of the range-parts pass with `parts`
 * parts: the CTAs in launch order (fast_cmp's index: last range first, key
 * tiles in order), each taken by the first of `slots` CTA slots to come
 * free - the block scheduler's greedy order - each costing its row tiles
 * plus `overhead` (its K/V load and partial store). */
static double cmpRangeSchedule(const FastCtx &c, int keys, int parts, int slots, double overhead,
                               std::vector<double> &heap) {
    const int tpr = FAST_DKDV_ROWS / c.hpg, ktiles = (c.Nc + keys - 1) / keys;
    const int span = (c.S + parts * tpr - 1) / (parts * tpr) * tpr;
    heap.assign((size_t)slots, 0.0);
    double end = 0.0;
    for (int part = parts - 1; part >= 0; part--)
        for (int kt = 0; kt < ktiles; kt++) {
            const int tb = kt * keys * c.cmp_stride + c.cmp_len - 1;
            const int lo = tb > part * span ? tb : part * span;
            const int hi = c.S < (part + 1) * span ? c.S : (part + 1) * span;
            const double cost = (hi > lo ? (hi - lo + tpr - 1) / tpr : 0) + overhead;
            for (int bg = 0; bg < c.B * c.G; bg++) {
                std::pop_heap(heap.begin(), heap.end(), std::greater<double>());
                heap.back() += cost;
                if (heap.back() > end) end = heap.back();
                std::push_heap(heap.begin(), heap.end(), std::greater<double>());
            }
        }
    return end;
}

/* CTA cost beside its row tiles in the model above, in row tiles: the
 * K/V load and the fp32 partial store of its keys, a few microseconds
 * each, against about 2 us per row tile at the paper shape. */
#define CMP_RANGE_OVERHEAD_TILES 4.0

template <int DK, int DV>
static cudaError_t cmpBackwardParts(const FastCtx &c, int sm_count, int max_parts, int *parts) {
    const bool ranges = c.wgmma ? CmpRanges<true, DK, DV>::value : CmpRanges<false, DK, DV>::value;
    if (!ranges || c.Nc == 0) {
        const int p = c.Nc == 0 ? 1 : cmpInterleavedParts(c, sm_count);
        *parts = p < max_parts ? p : max_parts;
        return cudaSuccess;
    }
    const CmpDkdvLaunch<DK, DV> k = cmpDkdvLaunch<DK, DV>(c);
    cudaError_t e = fastSetSmem(k.kernel, k.smem);
    int per_sm = 0;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.kernel, k.threads, k.smem);
    if (e != cudaSuccess) return e;
    if (per_sm < 1) return cudaErrorInvalidConfiguration;
    /* Equal ranges make CTAs of equal length, which the greedy schedule
     * runs in waves: the count decides how full the last wave is (a count
     * that leaves the last wave part-empty loses to the interleaved
     * parts). The fewest parts within 1% of the best
     * modelled length: each part costs the pooling backward a read. */
    std::vector<double> heap;
    double best = 0.0;
    double len[CMP_MAX_PARTS + 1];
    const int top = max_parts < CMP_MAX_PARTS ? max_parts : CMP_MAX_PARTS;
    for (int p = 1; p <= top; p++) {
        len[p] = cmpRangeSchedule(c, k.keys, p, per_sm * sm_count, CMP_RANGE_OVERHEAD_TILES, heap);
        if (p == 1 || len[p] < best) best = len[p];
    }
    *parts = 1;
    while (*parts < top && len[*parts] > 1.01 * best) ++*parts;
    return cudaSuccess;
}

cudaError_t fastCmpBackwardParts(const FastCtx &c, int dk, int dv, int sm_count, int max_parts,
                                 int *parts) {
    if (max_parts < 1 || sm_count < 1) return cudaErrorInvalidValue;
    FAST_DISPATCH(dk, dv, cmpBackwardParts, c, sm_count, max_parts, parts);
}

template <int DK, int DV>
static cudaError_t cmpForward(const FastCtx &c, const FastFwdIo &io, cudaStream_t stream) {
    return fastLaunchForward<DK, DV, CmpPolicy, false>(c, io, fastCmpPolicy(c), stream);
}

template <int DK, int DV>
static cudaError_t cmpBackward(const FastCtx &c, const FastBwdIo &io, int parts, float *part_k,
                               float *part_v, bf16 *dk_out, bf16 *dv_out, cudaStream_t stream,
                               const FastMarks *marks) {
    cudaError_t e;
    if ((e = fastMark(marks, "bwd.cmp.dkdv")) != cudaSuccess) return e;
    if (c.Nc > 0) {
        FastRowMaps maps = {};
        if ((e = fastDkdvRowMaps(c, io, DK, DV, false, &maps)) != cudaSuccess) return e;
        const CmpDkdvLaunch<DK, DV> k = cmpDkdvLaunch<DK, DV>(c);
        if ((e = fastSetSmem(k.kernel, k.smem)) != cudaSuccess) return e;
        const int ktiles = (c.Nc + k.keys - 1) / k.keys;
        k.kernel<<<dim3(ktiles, parts, c.B * c.G), k.threads, k.smem, stream>>>(
            c, io, part_k, part_v, maps);
        e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    if ((e = fastMark(marks, "bwd.cmp.pool")) != cudaSuccess) return e;
    if (c.Nc == 0) { /* no block holds a token: the gradients are zero */
        if ((e = cudaMemsetAsync(dk_out, 0, (size_t)c.B * c.S * c.G * DK * 2, stream)) != cudaSuccess)
            return e;
        return cudaMemsetAsync(dv_out, 0, (size_t)c.B * c.S * c.G * DV * 2, stream);
    }
    /* runs of up to CMP_POOL_RUN blocks whose sums, with the halo's, fit
     * 48 KB at the wider of d_k, d_v (fastCheckDims bounds the halo) */
    const int halo = (c.cmp_len - 1) / c.cmp_stride;
    const int run = min(CMP_POOL_RUN, 48 * 1024 / ((DK > DV ? DK : DV) * 4) - halo);
    if (run < 1) return cudaErrorInvalidValue;
    const dim3 runs((c.Nc + run - 1) / run, c.B * c.G);
    cmpPoolBackwardKernel<<<runs, 256, (size_t)(run + halo) * DK * 4, stream>>>(
        dk_out, part_k, parts, c.B, c.S, c.G, DK, c.cmp_len, c.cmp_stride, c.Nc, run);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    cmpPoolBackwardKernel<<<runs, 256, (size_t)(run + halo) * DV * 4, stream>>>(
        dv_out, part_v, parts, c.B, c.S, c.G, DV, c.cmp_len, c.cmp_stride, c.Nc, run);
    return cudaGetLastError();
}

cudaError_t fastCmpForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                           cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, cmpForward, c, io, stream);
}

cudaError_t fastCmpBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io, int parts,
                            float *part_k, float *part_v, bf16 *dk_out, bf16 *dv_out,
                            cudaStream_t stream, const FastMarks *marks) {
    FAST_DISPATCH(dk, dv, cmpBackward, c, io, parts, part_k, part_v, dk_out, dv_out, stream,
                  marks);
}
