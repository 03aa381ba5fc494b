/* rmsnorm.cu - RMSNorm with a learned weight, forward and backward.
 *
 * y = x * rstd * w, rstd = 1/sqrt(mean_c x_c^2 + eps) (the mean in double).
 * Backward, u = w * dy: dx += rstd u - x rstd^3 mean_c(u_c x_c);
 * dw += sum_n dy x rstd, as fixed-order column sums (deterministic). */
#include "layers_cuda.h"
#include "cuda_common.cuh"

/* One block per row; y stored as ytype. */
__global__ void rmsnormForwardKernel(void *y, int ytype, float *rstd, const float *x,
                                     const float *w, int C, float eps) {
    __shared__ double scratch[32];
    const size_t n = blockIdx.x;
    const float *xr = x + n * C;
    double ss = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += (double)xr[c] * xr[c];
    ss = blockSumD(ss, scratch);
    const float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    if (threadIdx.x == 0) rstd[n] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x) storeAs(y, n * C + c, ytype, xr[c] * r * w[c]);
}

__global__ void rmsnormBackwardDxKernel(float *dx, const float *dy, const float *x,
                                        const float *w, const float *rstd, int C) {
    __shared__ double scratch[32];
    const size_t n = blockIdx.x;
    const float *xr = x + n * C, *dyr = dy + n * C;
    double dot = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += (double)w[c] * dyr[c] * xr[c];
    dot = blockSumD(dot, scratch);
    const float r = rstd[n];
    const float k = (float)(dot / C * (double)r * r * r);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[n * C + c] += r * w[c] * dyr[c] - xr[c] * k;
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

static unsigned rowThreads(int C) { return C >= 512 ? 256 : (C >= 128 ? 128 : 32); }

int rmsnormForwardTo(void *y, DType yt, float *rstd, const float *x, const float *w, size_t N,
                     int C, float eps, cudaStream_t stream, NsaError *err) {
    if (N == 0) return 0;
    rmsnormForwardKernel<<<(unsigned)N, rowThreads(C), 0, stream>>>(y, (int)yt, rstd, x, w, C,
                                                                     eps);
    LAUNCH_CHECK("rmsnormForwardKernel", err);
    return 0;
}

int rmsnormForward(float *y, float *rstd, const float *x, const float *w, size_t N, int C,
                   float eps, cudaStream_t stream, NsaError *err) {
    return rmsnormForwardTo(y, DTYPE_F32, rstd, x, w, N, C, eps, stream, err);
}

int rmsnormBackward(float *dx, float *dw, float *partial, const float *dy, const float *x,
                    const float *w, const float *rstd, size_t N, int C, cudaStream_t stream,
                    NsaError *err) {
    if (N == 0) return 0;
    rmsnormBackwardDxKernel<<<(unsigned)N, rowThreads(C), 0, stream>>>(dx, dy, x, w, rstd, C);
    LAUNCH_CHECK("rmsnormBackwardDxKernel", err);
    unsigned chunks = ceilDiv(N, RMS_CHUNK);
    dim3 grid(chunks, ceilDiv(C, 128));
    rmsnormBackwardDwPartialKernel<<<grid, 128, 0, stream>>>(partial, dy, x, rstd, N, C);
    LAUNCH_CHECK("rmsnormBackwardDwPartialKernel", err);
    rmsnormBackwardDwSumKernel<<<ceilDiv(C, 128), 128, 0, stream>>>(dw, partial, (int)chunks, C);
    LAUNCH_CHECK("rmsnormBackwardDwSumKernel", err);
    return 0;
}
