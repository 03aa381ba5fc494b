/* rmsnorm.cu - RMSNorm with a learned weight, forward and backward.
 *
 * y = x * rstd * w, rstd = 1/sqrt(mean_c x_c^2 + eps) (the mean in double).
 * Backward, u = w * dy: dx += rstd u - x rstd^3 mean_c(u_c x_c);
 * dw += sum_n dy x rstd, as fixed-order column sums (deterministic). The
 * row kernels need 16-byte aligned rows for their vector path (C % 4 == 0
 * and aligned base pointers, as the engine's arenas are). */
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

/* A warp per row; dx_op (dx_type) receives the updated row when not NULL. */
__global__ void rmsnormBackwardDxKernel(float *dx, void *dx_op, int dx_type, const float *dy,
                                        const float *x, const float *w, const float *rstd,
                                        size_t N, int C, int vec) {
    const size_t n = (size_t)blockIdx.x * RMS_ROWS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (n >= N) return;
    const float *xr = x + n * C, *dyr = dy + n * C;
    float *dxr = dx + n * C;
    double dot = 0.0;
    if (vec) {
        for (int c = lane * 4; c < C; c += 128) {
            const float4 a = *(const float4 *)(xr + c), d = *(const float4 *)(dyr + c);
            const float4 g = *(const float4 *)(w + c);
            dot += (double)g.x * d.x * a.x + (double)g.y * d.y * a.y + (double)g.z * d.z * a.z +
                   (double)g.w * d.w * a.w;
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
        }
    } else {
        for (int c = lane; c < C; c += 32) {
            const float v = dxr[c] + (r * w[c] * dyr[c] - xr[c] * k);
            dxr[c] = v;
            if (dx_op) storeAs(dx_op, n * C + c, dx_type, v);
        }
    }
}

/* partial[chunk][c] = sum over the chunk's rows of dy x rstd. */
__global__ void rmsnormBackwardDwPartialKernel(float *partial, const float *dy, const float *x,
                                               const float *rstd, size_t N, int C) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const size_t n0 = (size_t)blockIdx.x * RMS_CHUNK;
    size_t n1 = n0 + RMS_CHUNK < N ? n0 + RMS_CHUNK : N;
    float acc = 0.0f;
    for (size_t n = n0; n < n1; n++) acc += dy[n * C + c] * x[n * C + c] * rstd[n];
    partial[(size_t)blockIdx.x * C + c] = acc;
}

__global__ void rmsnormBackwardDwSumKernel(float *dw, const float *partial, int chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int k = 0; k < chunks; k++) acc += partial[(size_t)k * C + c];
    dw[c] += acc;
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

int rmsnormBackwardTo(float *dx, void *dx_op, DType dx_ot, float *dw, float *partial,
                      const float *dy, const float *x, const float *w, const float *rstd,
                      size_t N, int C, cudaStream_t stream, NsaError *err) {
    if (N == 0) return 0;
    rmsnormBackwardDxKernel<<<ceilDiv(N, RMS_ROWS_PER_BLOCK), 32 * RMS_ROWS_PER_BLOCK, 0, stream>>>(
        dx, dx_op, (int)dx_ot, dy, x, w, rstd, N, C,
        rowVec(C, dx, dy, x, w, dx_ot == DTYPE_F32 ? NULL : dx_op) &&
            (dx_ot != DTYPE_F32 || (uintptr_t)dx_op % 16 == 0));
    LAUNCH_CHECK("rmsnormBackwardDxKernel", err);
    unsigned chunks = ceilDiv(N, RMS_CHUNK);
    dim3 grid(chunks, ceilDiv(C, 128));
    rmsnormBackwardDwPartialKernel<<<grid, 128, 0, stream>>>(partial, dy, x, rstd, N, C);
    LAUNCH_CHECK("rmsnormBackwardDwPartialKernel", err);
    rmsnormBackwardDwSumKernel<<<ceilDiv(C, 128), 128, 0, stream>>>(dw, partial, (int)chunks, C);
    LAUNCH_CHECK("rmsnormBackwardDwSumKernel", err);
    return 0;
}

int rmsnormBackward(float *dx, float *dw, float *partial, const float *dy, const float *x,
                    const float *w, const float *rstd, size_t N, int C, cudaStream_t stream,
                    NsaError *err) {
    return rmsnormBackwardTo(dx, NULL, DTYPE_F32, dw, partial, dy, x, w, rstd, N, C, stream, err);
}
