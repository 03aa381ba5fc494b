/* decode_gemv.cu - the decoder's matrix-vector products (decode_ops.h):
 * a few rows (the step's slots, or a prefill pass's positions) times a
 * bf16 weight, memory-bound, so each weight row is read once per step.
 *
 *   out[b][n] = sum_k in[b][k] W[n][k],  in = x * rstd * norm_w (RMSNorm on
 *   the fly, rstd = 1/sqrt(mean_k x^2 + eps)) or a bf16 activation;
 *   epilogues: store, add into the residual, silu, silu(fc) * up.
 *
 * One row (a decode step of one slot) runs on CUDA cores, in fp32
 * (decGemvRowKernel): 4 warps own an output row, their lanes stride over
 * 16-byte chunks of the weight row (8 bf16), multiply by the input and
 * reduce by shuffles, then the row's first warp adds the 4 partial sums in
 * warp order - a fixed order, so results are reproducible.
 * Two rows and more run on tensor cores (decGemvMmaKernel): tiles of 16 rows
 * x 8 outputs through mma.sync m16n8k16 with fp32 accumulators, the fp32
 * normalised input as two bf16 parts (hi + lo). On CUDA cores every row
 * cost its own input loads and multiplies; on tensor cores 16 rows cost
 * what one does, and the step stays bound by the weight bytes.
 * Launched overlapped (decode_ops.h), a kernel prefetches its weight rows
 * into L2 before it waits for the kernel before it. */
#include "../cuda_common.cuh"
#include "../mma_sync.cuh"
#include "decode_ops.h"

#define GEMV_WARPS 8
/* 16-row tiles a CTA of the tensor-core form takes; more rows (a prefill
 * pass of 256) go to more CTAs, each reading the weights again from L2. At 4
 * tiles a CTA the normalising products held 170 registers (one CTA per SM)
 * and half as many CTAs ran. The two-tile kernels are built for two CTAs
 * per SM; the one-tile kernels keep the compiler's own register choice
 * (capped for two CTAs per SM they made the B16 step 1.8% slower). */
#define GEMV_MAX_TILES 2

__device__ __forceinline__ void unpackBf16x8(uint4 u, float *f) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float silu(float a) { return a / (1.0f + __expf(-a)); }

__device__ __forceinline__ void prefetchL2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* rstd[b - row0] = 1 / sqrt(mean_k x[b][k]^2 + eps) for the rows row0 ..
 * row0 + rows - 1 below B, a warp per row. */
__device__ __forceinline__ void decRowRstd(const DecGemv &a, int row0, int rows, float *rstd) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int end = row0 + rows < a.B ? row0 + rows : a.B;
    for (int b = row0 + warp; b < end; b += GEMV_WARPS) {
        const float4 *xr = (const float4 *)(a.x + (size_t)b * a.K);
        float ss = 0.0f;
        for (int k4 = lane; k4 < a.K / 4; k4 += 32) {
            const float4 v = xr[k4];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = warpSum(ss);
        if (lane == 0) rstd[b - row0] = 1.0f / sqrtf(ss / (float)a.K + a.eps);
    }
}

/* The epilogue of output (b, n): v0 = row n's sum, v1 = row N + n's (SWIGLU). */
template <int MODE>
__device__ __forceinline__ void decGemvStore(const DecGemv &a, int b, int n, float v0, float v1) {
    const size_t at = (size_t)b * a.N + n;
    if (MODE == DEC_STORE) a.out[at] = v0;
    else if (MODE == DEC_ADD) a.out[at] += v0;
    else if (MODE == DEC_SILU) a.outb[at] = __float2bfloat16_rn(silu(v0));
    else a.outb[at] = __float2bfloat16_rn(silu(v0) * v1);
}

/* One input row (B = 1) on CUDA cores, in fp32; NORM: fp32 x normalised on
 * the fly (else bf16 xb); MODE: DecGemvMode. ROW_SPLIT warps own an output
 * row, each a quarter of its k range, so a lane has few loads in a row. */
#define ROW_SPLIT 4
template <bool NORM, int MODE>
__global__ void __launch_bounds__(GEMV_WARPS * 32) decGemvRowKernel(DecGemv a) {
    __shared__ float rstd[1];
    __shared__ float part[GEMV_WARPS][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * (GEMV_WARPS / ROW_SPLIT) + warp / ROW_SPLIT, kpart = warp % ROW_SPLIT;
    const bool live = n < a.N;
    const int K8 = live ? a.K / 8 : 0;
    const uint4 *w0 = (const uint4 *)(a.w + (size_t)n * a.K);
    const uint4 *w1 = (const uint4 *)(a.w + (size_t)(a.N + n) * a.K);  /* SWIGLU only */
    /* the weights are constant during a pass: bring this warp's share into
     * L2 while the previous kernel finishes (a 128-byte line per 8 lanes) */
    if ((lane & 7) == 0)
        for (int k8 = kpart * 32 + lane; k8 < K8; k8 += 32 * ROW_SPLIT) {
            prefetchL2(w0 + k8);
            if (MODE == DEC_SWIGLU) prefetchL2(w1 + k8);
        }
    decWaitPrior();
    if (NORM) {
        decRowRstd(a, 0, 1, rstd);
        __syncthreads();
    }
    float acc0 = 0.0f, acc1 = 0.0f;
    /* unrolled so that several 16-byte weight loads are in flight per lane */
#pragma unroll 4
    for (int k8 = kpart * 32 + lane; k8 < K8; k8 += 32 * ROW_SPLIT) {
        float wf[8], uf[8], xf[8];
        unpackBf16x8(w0[k8], wf);
        if (MODE == DEC_SWIGLU) unpackBf16x8(w1[k8], uf);
        if (NORM) {
            const float4 n0 = ((const float4 *)a.norm_w)[2 * k8];
            const float4 n1 = ((const float4 *)a.norm_w)[2 * k8 + 1];
            const float4 x0 = ((const float4 *)a.x)[2 * k8], x1 = ((const float4 *)a.x)[2 * k8 + 1];
            const float r = rstd[0];
            xf[0] = x0.x * r * n0.x; xf[1] = x0.y * r * n0.y;
            xf[2] = x0.z * r * n0.z; xf[3] = x0.w * r * n0.w;
            xf[4] = x1.x * r * n1.x; xf[5] = x1.y * r * n1.y;
            xf[6] = x1.z * r * n1.z; xf[7] = x1.w * r * n1.w;
        } else {
            unpackBf16x8(((const uint4 *)a.xb)[k8], xf);
        }
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s0 += wf[j] * xf[j];
            if (MODE == DEC_SWIGLU) s1 += uf[j] * xf[j];
        }
        acc0 += s0;
        if (MODE == DEC_SWIGLU) acc1 += s1;
    }
    acc0 = warpSum(acc0);
    if (MODE == DEC_SWIGLU) acc1 = warpSum(acc1);
    if (lane == 0) {
        part[warp][0] = acc0;
        part[warp][1] = acc1;
    }
    __syncthreads();
    if (kpart == 0 && lane == 0 && live) {
        for (int w = 1; w < ROW_SPLIT; w++) {
            acc0 += part[warp + w][0];
            acc1 += part[warp + w][1];
        }
        decGemvStore<MODE>(a, 0, n, acc0, acc1);
    }
    decLetNextLaunch();
}


/* Input row b's 8 values at 16-byte column k8 as bf16 (zero past B or K):
 * the bf16 activation as it is, or (NORM) the row normalised on the fly and
 * split in two bf16 parts, hi = bf16(v) and lo = bf16(v - hi), so that the
 * two products keep about 16 bits of the fp32 input, as the one-row kernel
 * does in fp32 (a single bf16 rounding showed in the decode test's error
 * against the fp32 reference). */
template <bool NORM>
__device__ __forceinline__ void decRowChunk(const DecGemv &a, const float *rstd, int row0,
                                            const float *nw, int b, int k8, bool kin, uint4 &hi,
                                            uint4 &lo) {
    hi = lo = make_uint4(0u, 0u, 0u, 0u);
    if (b >= a.B || !kin) return;
    if (!NORM) {
        hi = ((const uint4 *)(a.xb + (size_t)b * a.K))[k8];
        return;
    }
    const float4 *xr = (const float4 *)(a.x + (size_t)b * a.K);
    const float4 x0 = xr[2 * k8], x1 = xr[2 * k8 + 1];
    const float r = rstd[b - row0];
    const float v[8] = {x0.x * r * nw[0], x0.y * r * nw[1], x0.z * r * nw[2], x0.w * r * nw[3],
                        x1.x * r * nw[4], x1.y * r * nw[5], x1.z * r * nw[6], x1.w * r * nw[7]};
    uint32_t h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat162 p = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        h[i] = *(const uint32_t *)&p;
        l[i] = packBf16(v[2 * i] - __low2float(p), v[2 * i + 1] - __high2float(p));
    }
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

/* MT tiles of 16 rows (from row0 = 16 MT blockIdx.y) x the CTA's 8 outputs
 * (from 8 blockIdx.x), on tensor cores.
 * Lane (g, q) = (lane / 4, lane % 4) loads, per 32-wide k chunk, one 16-byte
 * piece of weight row n0 + g (k 8q .. 8q+7) and the same columns of input
 * rows g and g + 8 of each tile; the chunk's k order is permuted alike for
 * both operands (physical 8q + 0..3 as the fragment's k 2q, 2q+1, 2q+8,
 * 2q+9 of the first mma, 8q + 4..7 of the second), which changes only which
 * products a fragment pairs, not the sum. The 8 warps take interleaved
 * chunks; their tiles are summed in warp order through shared memory. */
template <bool NORM, int MODE, int MT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MT > 1 ? 2 : 1) decGemvMmaKernel(DecGemv a) {
    constexpr int ACC = MODE == DEC_SWIGLU ? 2 : 1;
    __shared__ float rstd[16 * MT];
    __shared__ float tile[GEMV_WARPS][ACC][MT][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int n = blockIdx.x * 8 + g, row0 = blockIdx.y * 16 * MT;
    const bool nlive = n < a.N;
    const int K8 = a.K / 8, chunks = (K8 + 3) / 4;
    const uint4 *w0 = (const uint4 *)(a.w + (size_t)(nlive ? n : 0) * a.K);
    const uint4 *w1 = (const uint4 *)(a.w + (size_t)(a.N + (nlive ? n : 0)) * a.K);
    /* a chunk of a row is 64 bytes: one prefetch per 128-byte line */
    if (nlive && q == 0)
        for (int c = 2 * warp; c < chunks; c += 2 * GEMV_WARPS) {
            prefetchL2(w0 + 4 * c);
            if (MODE == DEC_SWIGLU) prefetchL2(w1 + 4 * c);
        }
    decWaitPrior();
    if (NORM) {
        decRowRstd(a, row0, 16 * MT, rstd);
        __syncthreads();
    }
    float acc[ACC][MT][4];
#pragma unroll
    for (int u = 0; u < ACC; u++)
#pragma unroll
        for (int t = 0; t < MT; t++) acc[u][t][0] = acc[u][t][1] = acc[u][t][2] = acc[u][t][3] = 0.0f;
#pragma unroll 4
    for (int c = warp; c < chunks; c += GEMV_WARPS) {
        const int k8 = 4 * c + q;
        const bool kin = k8 < K8;
        uint4 wa = make_uint4(0u, 0u, 0u, 0u), wb = wa;
        if (nlive && kin) {
            wa = w0[k8];
            if (MODE == DEC_SWIGLU) wb = w1[k8];
        }
        float nw[8];
        if (NORM && kin) {
            const float4 n0 = ((const float4 *)a.norm_w)[2 * k8];
            const float4 n1 = ((const float4 *)a.norm_w)[2 * k8 + 1];
            nw[0] = n0.x; nw[1] = n0.y; nw[2] = n0.z; nw[3] = n0.w;
            nw[4] = n1.x; nw[5] = n1.y; nw[6] = n1.z; nw[7] = n1.w;
        }
#pragma unroll
        for (int t = 0; t < MT; t++) {
            /* rows g and g + 8 of the tile; [0] the bf16 (hi) parts, [1] the lo parts */
            uint4 top[2], bot[2];
            decRowChunk<NORM>(a, rstd, row0, nw, row0 + 16 * t + g, k8, kin, top[0], top[1]);
            decRowChunk<NORM>(a, rstd, row0, nw, row0 + 16 * t + g + 8, k8, kin, bot[0], bot[1]);
#pragma unroll
            for (int part = 0; part < (NORM ? 2 : 1); part++) {
                const uint4 r0 = top[part], r1 = bot[part];
                mmaBf16(acc[0][t], r0.x, r1.x, r0.y, r1.y, wa.x, wa.y);
                mmaBf16(acc[0][t], r0.z, r1.z, r0.w, r1.w, wa.z, wa.w);
                if (MODE == DEC_SWIGLU) {
                    mmaBf16(acc[ACC - 1][t], r0.x, r1.x, r0.y, r1.y, wb.x, wb.y);
                    mmaBf16(acc[ACC - 1][t], r0.z, r1.z, r0.w, r1.w, wb.z, wb.w);
                }
            }
        }
    }
#pragma unroll
    for (int u = 0; u < ACC; u++)
#pragma unroll
        for (int t = 0; t < MT; t++)
#pragma unroll
            for (int r = 0; r < 4; r++) tile[warp][u][t][r][lane] = acc[u][t][r];
    __syncthreads();
    /* element (t, r, l) of the C tiles: row row0 + 16t + l/4 (+8 for r >= 2),
     * output 8 blockIdx.x + 2 (l % 4) + r % 2 */
    for (int e = threadIdx.x; e < MT * 4 * 32; e += GEMV_WARPS * 32) {
        const int t = e / 128, r = (e / 32) % 4, l = e % 32;
        const int b = row0 + 16 * t + (l >> 2) + (r >= 2 ? 8 : 0);
        const int col = blockIdx.x * 8 + 2 * (l & 3) + (r & 1);
        if (b >= a.B || col >= a.N) continue;
        float v0 = 0.0f, v1 = 0.0f;
        for (int w = 0; w < GEMV_WARPS; w++) {
            v0 += tile[w][0][t][r][l];
            if (MODE == DEC_SWIGLU) v1 += tile[w][ACC - 1][t][r][l];
        }
        decGemvStore<MODE>(a, b, col, v0, v1);
    }
    decLetNextLaunch();
}

template <bool NORM, int MODE>
static cudaError_t launchTiles(const DecGemv *g, const DecLaunch *ln) {
    const dim3 block(GEMV_WARPS * 32);
    if (g->B == 1)
        return decLaunchKernel(ln, decGemvRowKernel<NORM, MODE>,
                               dim3(ceilDiv((size_t)g->N, GEMV_WARPS / ROW_SPLIT)), block, 0, *g);
    const int tiles = (g->B + 15) / 16;
    const int mt = tiles < GEMV_MAX_TILES ? tiles : GEMV_MAX_TILES;
    const dim3 grid(ceilDiv((size_t)g->N, 8), ceilDiv((size_t)tiles, (size_t)mt));
    static_assert(GEMV_MAX_TILES == 2, "the launches below instantiate 1 and 2 tiles");
    if (mt == 1) return decLaunchKernel(ln, decGemvMmaKernel<NORM, MODE, 1>, grid, block, 0, *g);
    return decLaunchKernel(ln, decGemvMmaKernel<NORM, MODE, 2>, grid, block, 0, *g);
}

int decGemv(const DecGemv *g, DecGemvMode mode, const DecLaunch *ln, NsaError *err) {
    if (g->K % 8 != 0 || g->B < 1 || g->B > DEC_MAX_ROWS)
        return nsaErrorf(err, "decode gemv: K = %d, B = %d; allowed: K a multiple of 8, B 1 to %d",
                         g->K, g->B, DEC_MAX_ROWS);
    const bool norm = g->norm_w != NULL;
    cudaError_t e;
    if (norm && mode == DEC_STORE) e = launchTiles<true, DEC_STORE>(g, ln);
    else if (norm && mode == DEC_SILU) e = launchTiles<true, DEC_SILU>(g, ln);
    else if (norm && mode == DEC_SWIGLU) e = launchTiles<true, DEC_SWIGLU>(g, ln);
    else if (!norm && mode == DEC_ADD) e = launchTiles<false, DEC_ADD>(g, ln);
    else
        return nsaErrorf(err, "decode gemv: mode %d with%s RMSNorm is not built", (int)mode,
                         norm ? "" : "out");
    if (e != cudaSuccess)
        return nsaErrorf(err, "cuda: launch of a decode gemv kernel (N %d, K %d, B %d) failed: %s",
                         g->N, g->K, g->B, cudaGetErrorString(e));
    return 0;
}
