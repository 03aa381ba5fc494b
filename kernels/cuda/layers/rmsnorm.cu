/* rmsnorm.cu - RMSNorm with a learned weight, forward and backward.
 *
 * y = x * rstd * w, rstd = 1/sqrt(mean_c x_c^2 + eps) (the mean in double).
 * Backward, u = w * dy: dx += rstd u - x rstd^3 mean_c(u_c x_c);
 * dw += sum_n dy x rstd, as fixed-order column sums (deterministic), both
 * from one read of each row. The row kernels need 16-byte aligned rows for
 * their vector path (C % 4 == 0 and aligned base pointers, as the engine's
 * arenas are). */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

/* A warp per row: the row is small (a few KB) and a warp's shuffle sum
 * needs no barrier. With vec (C % 4 == 0, pointers aligned: rowVec) rows
 * move in 16-byte loads; the second read of a row hits L1. Sums run in
 * double, in a fixed order. */
#define RMS_ROWS_PER_BLOCK 4

/* 1 when rows of C floats at these pointers allow 4-wide access (typed
 * pointers of 16-bit elements need 8 bytes). */
static int rowVec(int C, const void *f0, const void *f1, const void *f2, const void *f3,
                  const void *typed) {
    const void *f[4] = {f0, f1, f2, f3};
    if (C % 4) return 0;
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)f[i] % 16) return 0;
    return (uintptr_t)typed % 8 == 0;
}

__device__ __forceinline__ void store4As(void *p, size_t i, int type, float a, float b, float c,
                                         float d) {
    if (type == 1) {
        __nv_bfloat162 *q = (__nv_bfloat162 *)((__nv_bfloat16 *)p + i);
        q[0] = __floats2bfloat162_rn(a, b);
        q[1] = __floats2bfloat162_rn(c, d);
    } else if (type == 2) {
        __half2 *q = (__half2 *)((__half *)p + i);
        q[0] = __floats2half2_rn(a, b);
        q[1] = __floats2half2_rn(c, d);
    } else {
        *(float4 *)((float *)p + i) = make_float4(a, b, c, d);
    }
}

/* y[n] = x[n] * rstd_n * w (stored as ytype), rstd_n = 1/sqrt(mean_c x[n][c]^2 + eps), the sum
 * of squares in double; rstd[n] saved for the backward. A warp per row, RMS_ROWS_PER_BLOCK rows
 * per block. */
__global__ void rmsnormForwardKernel(void *y, int ytype, float *rstd, const float *x,
                                     const float *w, size_t N, int C, float eps, int vec) {
    const size_t n = (size_t)blockIdx.x * RMS_ROWS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (n >= N) return;
    const float *xr = x + n * C;
    double ss = 0.0;
    if (vec) {
        for (int c = lane * 4; c < C; c += 128) {
            const float4 v = *(const float4 *)(xr + c);
            ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
    } else {
        for (int c = lane; c < C; c += 32) ss += (double)xr[c] * xr[c];
    }
    ss = warpSumD(ss);
    const float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    if (lane == 0) rstd[n] = r;
    if (vec) {
        for (int c = lane * 4; c < C; c += 128) {
            const float4 v = *(const float4 *)(xr + c), g = *(const float4 *)(w + c);
            store4As(y, n * C + c, ytype, v.x * r * g.x, v.y * r * g.y, v.z * r * g.z,
                     v.w * r * g.w);
        }
    } else {
        for (int c = lane; c < C; c += 32) storeAs(y, n * C + c, ytype, xr[c] * r * w[c]);
    }
}

/* One CTA per chunk of `rows` rows (chunkRows), a warp per row in
 * turn: dx += rstd w dy - x k with k = rstd^3 mean_c(w dy x), dx_op (dx_type)
 * receiving the updated row when not NULL; and the chunk's share of dw,
 * partial[chunk][c] = sum over its rows of dy x rstd, summed per warp in
 * shared memory while the row is at hand, then over the warps in order (so
 * dy and x are read once for both gradients). */
__global__ void rmsnormBackwardKernel(float *dx, void *dx_op, int dx_type, float *partial,
                                      const float *dy, const float *x, const float *w,
                                      const float *rstd, size_t N, int C, int rows, int vec) {
    extern __shared__ float4 dw_smem[];   /* [RMS_BWD_WARPS][C] floats */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *acc = (float *)dw_smem + (size_t)warp * C;
    for (int c = lane; c < C; c += 32) acc[c] = 0.0f;
    __syncwarp();
    const size_t n0 = (size_t)blockIdx.x * rows;
    const size_t n1 = n0 + rows < N ? n0 + rows : N;
    for (size_t n = n0 + warp; n < n1; n += RMS_BWD_WARPS) {
        const float *xr = x + n * C, *dyr = dy + n * C;
        float *dxr = dx + n * C;
        double dot = 0.0;
        if (vec) {
            for (int c = lane * 4; c < C; c += 128) {
                const float4 a = *(const float4 *)(xr + c), d = *(const float4 *)(dyr + c);
                const float4 g = *(const float4 *)(w + c);
                dot += (double)g.x * d.x * a.x + (double)g.y * d.y * a.y +
                       (double)g.z * d.z * a.z + (double)g.w * d.w * a.w;
            }
        } else {
            for (int c = lane; c < C; c += 32) dot += (double)w[c] * dyr[c] * xr[c];
        }
        dot = warpSumD(dot);
        const float r = rstd[n];
        const float k = (float)(dot / C * (double)r * r * r);
        if (vec) {
            for (int c = lane * 4; c < C; c += 128) {
                const float4 a = *(const float4 *)(xr + c), d = *(const float4 *)(dyr + c);
                const float4 g = *(const float4 *)(w + c);
                float4 o = *(const float4 *)(dxr + c);
                o.x += r * g.x * d.x - a.x * k;
                o.y += r * g.y * d.y - a.y * k;
                o.z += r * g.z * d.z - a.z * k;
                o.w += r * g.w * d.w - a.w * k;
                *(float4 *)(dxr + c) = o;
                if (dx_op) store4As(dx_op, n * C + c, dx_type, o.x, o.y, o.z, o.w);
                float4 *s4 = (float4 *)(acc + c);
                float4 sv = *s4;
                sv.x += d.x * a.x * r;
                sv.y += d.y * a.y * r;
                sv.z += d.z * a.z * r;
                sv.w += d.w * a.w * r;
                *s4 = sv;
            }
        } else {
            for (int c = lane; c < C; c += 32) {
                const float v = dxr[c] + (r * w[c] * dyr[c] - xr[c] * k);
                dxr[c] = v;
                if (dx_op) storeAs(dx_op, n * C + c, dx_type, v);
                acc[c] += dyr[c] * xr[c] * r;
            }
        }
    }
    __syncthreads();
    const float *all = (const float *)dw_smem;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int k = 0; k < RMS_BWD_WARPS; k++) sum += all[(size_t)k * C + c];
        partial[(size_t)blockIdx.x * C + c] = sum;
    }
}

/* dw[c] += sum over the chunks of partial[chunk][c]: 32 columns per CTA, 8
 * slices of the chunks each, the slices added in order. */
__global__ void rmsnormBackwardDwSumKernel(float *dw, const float *partial, int chunks, int C) {
    __shared__ float slice[8][32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < C)
        for (int k = threadIdx.y; k < chunks; k += 8) acc += partial[(size_t)k * C + c];
    slice[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    float sum = 0.0f;
    for (int y = 0; y < 8; y++) sum += slice[y][threadIdx.x];
    dw[c] += sum;
}

/* Rows a CTA of the backward takes: at least 32 (a warp's worth of work to
 * amortise the CTA's dw sums), and no more chunks than RMS_MAX_CHUNKS. */
static size_t chunkRows(size_t N) {
    const size_t rows = (N + RMS_MAX_CHUNKS - 1) / RMS_MAX_CHUNKS;
    return rows > 32 ? rows : 32;
}

size_t rmsnormPartialFloats(size_t N, int C) {
    const size_t rows = chunkRows(N);
    return (N + rows - 1) / rows * (size_t)C;
}

int rmsnormForwardTo(void *y, DType yt, float *rstd, const float *x, const float *w, size_t N,
                     int C, float eps, cudaStream_t stream, NsaError *err) {
    if (N == 0) return 0;
    rmsnormForwardKernel<<<ceilDiv(N, RMS_ROWS_PER_BLOCK), 32 * RMS_ROWS_PER_BLOCK, 0, stream>>>(
        y, (int)yt, rstd, x, w, N, C, eps, rowVec(C, x, w, yt == DTYPE_F32 ? y : NULL, NULL, y));
    LAUNCH_CHECK("rmsnormForwardKernel", err);
    return 0;
}

int rmsnormForward(float *y, float *rstd, const float *x, const float *w, size_t N, int C,
                   float eps, cudaStream_t stream, NsaError *err) {
    return rmsnormForwardTo(y, DTYPE_F32, rstd, x, w, N, C, eps, stream, err);
}

int rmsnormPrepare(int C, NsaError *err) {
    const size_t smem = (size_t)RMS_BWD_WARPS * C * sizeof(float);
    if (smem <= 48 * 1024) return 0;
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), err);
    if (smem > (size_t)optin)
        return nsaErrorf(err,
                         "cuda: RMSNorm backward: dim %d needs %zu bytes of shared memory for "
                         "the weight gradient's row sums; allowed: dim up to %d on this GPU",
                         C, smem, optin / (RMS_BWD_WARPS * 4));
    CUDA_CHECK(cudaFuncSetAttribute(rmsnormBackwardKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               err);
    return 0;
}

int rmsnormBackwardTo(float *dx, void *dx_op, DType dx_ot, float *dw, float *partial,
                      const float *dy, const float *x, const float *w, const float *rstd,
                      size_t N, int C, cudaStream_t stream, NsaError *err) {
    if (N == 0) return 0;
    const size_t rows = chunkRows(N), chunks = (N + rows - 1) / rows;
    const size_t smem = (size_t)RMS_BWD_WARPS * C * sizeof(float);
    rmsnormBackwardKernel<<<(unsigned)chunks, 32 * RMS_BWD_WARPS, smem, stream>>>(
        dx, dx_op, (int)dx_ot, partial, dy, x, w, rstd, N, C, (int)rows,
        rowVec(C, dx, dy, x, w, dx_ot == DTYPE_F32 ? NULL : dx_op) &&
            (dx_ot != DTYPE_F32 || (uintptr_t)dx_op % 16 == 0));
    LAUNCH_CHECK("rmsnormBackwardKernel", err);
    rmsnormBackwardDwSumKernel<<<ceilDiv(C, 32), dim3(32, 8), 0, stream>>>(dw, partial,
                                                                        (int)chunks, C);
    LAUNCH_CHECK("rmsnormBackwardDwSumKernel", err);
    return 0;
}

int rmsnormBackward(float *dx, float *dw, float *partial, const float *dy, const float *x,
                    const float *w, const float *rstd, size_t N, int C, cudaStream_t stream,
                    NsaError *err) {
    return rmsnormBackwardTo(dx, NULL, DTYPE_F32, dw, partial, dy, x, w, rstd, N, C, stream, err);
}
