/* cuda_common.cuh - shared helpers of the CUDA engine: error checks that
 * return into NsaError (never exit), launch checks, warp/block reductions.
 * Included by every CUDA source of the engine; internal to the engine. */
#ifndef NSA_CUDA_COMMON_CUH
#define NSA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "../nsa.h"

/* Checks a CUDA runtime call; on failure fills err (naming the call, file
 * and line) and returns -1 from the enclosing function. The failure is
 * taken off the thread's last error too (a failed cudaMalloc leaves one),
 * or the next launch check on this thread - another job's, on a
 * long-lived worker - would report it as its own. */
#define CUDA_CHECK(call, err)                                                                      \
    do {                                                                                           \
        cudaError_t cuda_check_status_ = (call);                                                   \
        if (cuda_check_status_ != cudaSuccess) {                                                   \
            (void)cudaGetLastError(); /* reported here, not by the next launch check */            \
            return nsaErrorf((err), "cuda: %s failed at %s:%d: %s", #call, __FILE__, __LINE__,     \
                             cudaGetErrorString(cuda_check_status_));                              \
        }                                                                                          \
    } while (0)

/* After a kernel launch: catches bad launch configurations at once. */
#define LAUNCH_CHECK(name, err)                                                                    \
    do {                                                                                           \
        cudaError_t launch_check_status_ = cudaGetLastError();                                     \
        if (launch_check_status_ != cudaSuccess)                                                   \
            return nsaErrorf((err), "cuda: launch of %s failed at %s:%d: %s", (name), __FILE__,    \
                             __LINE__, cudaGetErrorString(launch_check_status_));                  \
    } while (0)

static inline unsigned ceilDiv(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

/* Grid size for a grid-stride loop over n elements, capped so huge tensors
 * still launch. */
static inline unsigned gridFor(size_t n, unsigned threads) {
    size_t blocks = (n + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    return (unsigned)blocks;
}

__device__ __forceinline__ float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warpSumD(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warpMax(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of blockDim.x (a multiple of 32, <= 1024) threads; every
 * thread gets the result. The order is fixed, so the result is
 * deterministic. scratch holds 32 doubles in shared memory. */
__device__ __forceinline__ double blockSumD(double v, double *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nwarps = (blockDim.x + 31) >> 5;
    v = warpSumD(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < nwarps ? scratch[lane] : 0.0;
    t = warpSumD(t);
    return t;
}

__device__ __forceinline__ float blockMaxF(float v, float *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nwarps = (blockDim.x + 31) >> 5;
    v = warpMax(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : -INFINITY;
    return warpMax(t);
}

/* Element access by storage type (the DType of layers_cuda.h: 0 fp32,
 * 1 bf16, 2 fp16). The type is uniform across a launch, so the switch costs
 * a predictable branch; values travel as fp32 and round once on store
 * (round-to-nearest-even). */
__device__ __forceinline__ float loadAs(const void *p, size_t i, int type) {
    if (type == 1) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (type == 2) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void storeAs(void *p, size_t i, int type, float v) {
    if (type == 1) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (type == 2) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}

/* Typed element conversions and 8-element (16- or 32-byte) vector access
 * for kernels templated on their storage types. load8/store8 need p aligned
 * to 8 elements' width (16 bytes for the 16-bit types, 32 for fp32). */
__device__ __forceinline__ float toFloat(float x) { return x; }
__device__ __forceinline__ float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float toFloat(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T fromFloat(float v);
template <> __device__ __forceinline__ float fromFloat<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half fromFloat<__half>(float v) { return __float2half_rn(v); }

template <typename T> __device__ __forceinline__ void load8(const T *p, float v[8]) {
    if constexpr (sizeof(T) == 4) {
        const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
        const uint4 u = *(const uint4 *)p;
        const T *e = (const T *)&u;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = toFloat(e[k]);
    }
}

template <typename T> __device__ __forceinline__ void store8(T *p, const float v[8]) {
    if constexpr (sizeof(T) == 4) {
        ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        uint4 u;
        T *e = (T *)&u;
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = fromFloat<T>(v[k]);
        *(uint4 *)p = u;
    }
}

/* 1 when p is aligned for load8/store8 of elements of `bytes` bytes. */
static inline int aligned8(const void *p, size_t bytes) {
    return ((uintptr_t)p % (8 * bytes)) == 0;
}

#endif
