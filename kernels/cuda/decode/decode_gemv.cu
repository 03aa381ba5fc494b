/* decode_gemv.cu - the decoder's matrix-vector products (decode_ops.h):
 * a few rows (the step's slots) times a bf16 weight, memory-bound, so each
 * weight row is read once per step for up to 16 rows at a time.
 *
 *   out[b][n] = sum_k in[b][k] W[n][k],  in = x * rstd * norm_w (RMSNorm on
 *   the fly, rstd = 1/sqrt(mean_k x^2 + eps)) or a bf16 activation;
 *   epilogues: store, add into the residual, silu, silu(fc) * up.
 * SPLIT warps own an output row: their lanes stride over 16-byte chunks of
 * the weight row (8 bf16), multiply by the rows' inputs and reduce by
 * shuffles, then the row's first warp adds the SPLIT partial sums in warp
 * order - a fixed order, so results are reproducible. One input row (a
 * decode step of one slot) splits each weight row over 4 warps: four times
 * the CTAs and a quarter of the loads in a row for each lane. Launched
 * overlapped (decode_ops.h), a kernel prefetches its weight rows into L2
 * before it waits for the kernel before it. */
#include "../cuda_common.cuh"
#include "decode_ops.h"

#define GEMV_WARPS 8

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

/* BT rows per pass over the weight; NORM: fp32 x normalised on the fly
 * (else bf16 xb); MODE: DecGemvMode; SPLIT warps per output row. */
template <int BT, bool NORM, int MODE, int SPLIT>
__global__ void __launch_bounds__(GEMV_WARPS * 32) decGemvKernel(DecGemv a) {
    __shared__ float rstd[DEC_MAX_BATCH];
    __shared__ float part[SPLIT > 1 ? GEMV_WARPS : 1][2][BT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * (GEMV_WARPS / SPLIT) + warp / SPLIT, kpart = warp % SPLIT;
    const bool live = n < a.N;
    const int K8 = live ? a.K / 8 : 0;
    const uint4 *w0 = (const uint4 *)(a.w + (size_t)n * a.K);
    const uint4 *w1 = (const uint4 *)(a.w + (size_t)(a.N + n) * a.K);  /* SWIGLU only */
    /* the weights are constant during a pass: bring this warp's share into
     * L2 while the previous kernel finishes (a 128-byte line per 8 lanes) */
    if ((lane & 7) == 0)
        for (int k8 = kpart * 32 + lane; k8 < K8; k8 += 32 * SPLIT) {
            prefetchL2(w0 + k8);
            if (MODE == DEC_SWIGLU) prefetchL2(w1 + k8);
        }
    decWaitPrior();
    if (NORM) {
        for (int b = warp; b < a.B; b += GEMV_WARPS) {
            const float4 *xr = (const float4 *)(a.x + (size_t)b * a.K);
            float ss = 0.0f;
            for (int k4 = lane; k4 < a.K / 4; k4 += 32) {
                const float4 v = xr[k4];
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            ss = warpSum(ss);
            if (lane == 0) rstd[b] = 1.0f / sqrtf(ss / (float)a.K + a.eps);
        }
        __syncthreads();
    }
    if (SPLIT == 1 && !live) return;   /* SPLIT > 1: every warp reaches the barrier */
    for (int b0 = 0; b0 < a.B; b0 += BT) {
        float acc0[BT], acc1[BT];
#pragma unroll
        for (int i = 0; i < BT; i++) acc0[i] = acc1[i] = 0.0f;
        /* unrolled so that several 16-byte weight loads are in flight per lane */
#pragma unroll 4
        for (int k8 = kpart * 32 + lane; k8 < K8; k8 += 32 * SPLIT) {
            float wf[8], uf[8], nw[8];
            unpackBf16x8(w0[k8], wf);
            if (MODE == DEC_SWIGLU) unpackBf16x8(w1[k8], uf);
            if (NORM) {
                const float4 n0 = ((const float4 *)a.norm_w)[2 * k8];
                const float4 n1 = ((const float4 *)a.norm_w)[2 * k8 + 1];
                nw[0] = n0.x; nw[1] = n0.y; nw[2] = n0.z; nw[3] = n0.w;
                nw[4] = n1.x; nw[5] = n1.y; nw[6] = n1.z; nw[7] = n1.w;
            }
#pragma unroll
            for (int i = 0; i < BT; i++) {
                const int b = b0 + i;
                if (b >= a.B) break;
                float xf[8];
                if (NORM) {
                    const float4 *xr = (const float4 *)(a.x + (size_t)b * a.K);
                    const float4 x0 = xr[2 * k8], x1 = xr[2 * k8 + 1];
                    const float r = rstd[b];
                    xf[0] = x0.x * r * nw[0]; xf[1] = x0.y * r * nw[1];
                    xf[2] = x0.z * r * nw[2]; xf[3] = x0.w * r * nw[3];
                    xf[4] = x1.x * r * nw[4]; xf[5] = x1.y * r * nw[5];
                    xf[6] = x1.z * r * nw[6]; xf[7] = x1.w * r * nw[7];
                } else {
                    unpackBf16x8(((const uint4 *)(a.xb + (size_t)b * a.K))[k8], xf);
                }
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    s0 += wf[j] * xf[j];
                    if (MODE == DEC_SWIGLU) s1 += uf[j] * xf[j];
                }
                acc0[i] += s0;
                if (MODE == DEC_SWIGLU) acc1[i] += s1;
            }
        }
#pragma unroll
        for (int i = 0; i < BT; i++) {
            acc0[i] = warpSum(acc0[i]);
            if (MODE == DEC_SWIGLU) acc1[i] = warpSum(acc1[i]);
        }
        if (SPLIT > 1) {
            if (lane == 0) {
#pragma unroll
                for (int i = 0; i < BT; i++) {
                    part[warp][0][i] = acc0[i];
                    part[warp][1][i] = acc1[i];
                }
            }
            __syncthreads();
            if (kpart == 0) {
#pragma unroll
                for (int i = 0; i < BT; i++)
                    for (int w = 1; w < SPLIT; w++) {
                        acc0[i] += part[warp + w][0][i];
                        acc1[i] += part[warp + w][1][i];
                    }
            }
            __syncthreads();   /* part is free for the next pass of rows */
        }
#pragma unroll
        for (int i = 0; i < BT; i++) {
            const int b = b0 + i;
            const float v0 = acc0[i], v1 = acc1[i];
            if (lane != 0 || kpart != 0 || !live || b >= a.B) continue;
            const size_t at = (size_t)b * a.N + n;
            if (MODE == DEC_STORE) a.out[at] = v0;
            else if (MODE == DEC_ADD) a.out[at] += v0;
            else if (MODE == DEC_SILU) a.outb[at] = __float2bfloat16_rn(silu(v0));
            else a.outb[at] = __float2bfloat16_rn(silu(v0) * v1);
        }
    }
    decLetNextLaunch();
}

template <bool NORM, int MODE>
static cudaError_t launchTiles(const DecGemv *g, const DecLaunch *ln) {
    const dim3 grid(ceilDiv((size_t)g->N, GEMV_WARPS)), block(GEMV_WARPS * 32);
    if (g->B <= 1)
        return decLaunchKernel(ln, decGemvKernel<1, NORM, MODE, 4>,
                               dim3(ceilDiv((size_t)g->N, GEMV_WARPS / 4)), block, 0, *g);
    if (g->B <= 2) return decLaunchKernel(ln, decGemvKernel<2, NORM, MODE, 1>, grid, block, 0, *g);
    if (g->B <= 4) return decLaunchKernel(ln, decGemvKernel<4, NORM, MODE, 1>, grid, block, 0, *g);
    if (g->B <= 8) return decLaunchKernel(ln, decGemvKernel<8, NORM, MODE, 1>, grid, block, 0, *g);
    return decLaunchKernel(ln, decGemvKernel<16, NORM, MODE, 1>, grid, block, 0, *g);
}

int decGemv(const DecGemv *g, DecGemvMode mode, const DecLaunch *ln, NsaError *err) {
    if (g->K % 8 != 0 || g->B < 1 || g->B > DEC_MAX_BATCH)
        return cudaFail(err, "decode gemv: K = %d, B = %d; allowed: K a multiple of 8, B 1 to %d",
                        g->K, g->B, DEC_MAX_BATCH);
    const bool norm = g->norm_w != NULL;
    cudaError_t e;
    if (norm && mode == DEC_STORE) e = launchTiles<true, DEC_STORE>(g, ln);
    else if (norm && mode == DEC_SILU) e = launchTiles<true, DEC_SILU>(g, ln);
    else if (norm && mode == DEC_SWIGLU) e = launchTiles<true, DEC_SWIGLU>(g, ln);
    else if (!norm && mode == DEC_ADD) e = launchTiles<false, DEC_ADD>(g, ln);
    else
        return cudaFail(err, "decode gemv: mode %d with%s RMSNorm is not built", (int)mode,
                        norm ? "" : "out");
    if (e != cudaSuccess)
        return cudaFail(err, "cuda: launch of decGemvKernel (N %d, K %d, B %d) failed: %s", g->N,
                        g->K, g->B, cudaGetErrorString(e));
    return 0;
}
