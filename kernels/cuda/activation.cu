/* activation.cu - elementwise activations, forward and backward.
 *
 * silu(a) = a s(a), s = sigmoid; silu'(a) = s(a) (1 + a (1 - s(a))).
 * swiglu(a, b) = silu(a) b.  sigmoid'(a) = g (1 - g) with g = s(a). */
#include "layers_cuda.h"
#include "cuda_common.cuh"

__device__ __forceinline__ float sigmoidf_(float a) { return 1.0f / (1.0f + expf(-a)); }

#define ELEMENTWISE_LOOP(n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void siluForwardKernel(float *out, const float *a, size_t n) {
    ELEMENTWISE_LOOP(n) { float x = a[i]; out[i] = x * sigmoidf_(x); }
}
__global__ void siluBackwardKernel(float *da, const float *dout, const float *a, size_t n) {
    ELEMENTWISE_LOOP(n) {
        float x = a[i], s = sigmoidf_(x);
        da[i] = dout[i] * s * (1.0f + x * (1.0f - s));
    }
}
__global__ void swigluForwardKernel(float *out, const float *a, const float *b, size_t n) {
    ELEMENTWISE_LOOP(n) { float x = a[i]; out[i] = x * sigmoidf_(x) * b[i]; }
}
__global__ void swigluBackwardKernel(float *da, float *db, const float *dout, const float *a,
                                     const float *b, size_t n) {
    ELEMENTWISE_LOOP(n) {
        float x = a[i], s = sigmoidf_(x), d = dout[i];
        da[i] = d * b[i] * s * (1.0f + x * (1.0f - s));
        db[i] = d * x * s;
    }
}
__global__ void sigmoidForwardKernel(float *out, const float *a, size_t n) {
    ELEMENTWISE_LOOP(n) { out[i] = sigmoidf_(a[i]); }
}
__global__ void sigmoidBackwardKernel(float *da, const float *dout, const float *g, size_t n) {
    ELEMENTWISE_LOOP(n) { float y = g[i]; da[i] = dout[i] * y * (1.0f - y); }
}

/* Typed variants: outputs stored as ot (GEMM operands in bf16/fp16 mode). */
__global__ void siluForwardToKernel(void *out, int ot, const float *a, size_t n) {
    ELEMENTWISE_LOOP(n) { float x = a[i]; storeAs(out, i, ot, x * sigmoidf_(x)); }
}
__global__ void swigluForwardToKernel(void *out, int ot, const float *a, const float *b, size_t n) {
    ELEMENTWISE_LOOP(n) { float x = a[i]; storeAs(out, i, ot, x * sigmoidf_(x) * b[i]); }
}
__global__ void siluBackwardToKernel(void *da, int ot, const float *dout, const float *a,
                                     size_t n) {
    ELEMENTWISE_LOOP(n) {
        float x = a[i], s = sigmoidf_(x);
        storeAs(da, i, ot, dout[i] * s * (1.0f + x * (1.0f - s)));
    }
}
__global__ void swigluBackwardToKernel(void *da, void *db, int ot, const float *dout,
                                       const float *a, const float *b, size_t n) {
    ELEMENTWISE_LOOP(n) {
        float x = a[i], s = sigmoidf_(x), d = dout[i];
        storeAs(da, i, ot, d * b[i] * s * (1.0f + x * (1.0f - s)));
        storeAs(db, i, ot, d * x * s);
    }
}
__global__ void sigmoidBackwardToKernel(void *da, int ot, const void *dout, int dt, const float *g,
                                        size_t n) {
    ELEMENTWISE_LOOP(n) { float y = g[i]; storeAs(da, i, ot, loadAs(dout, i, dt) * y * (1.0f - y)); }
}

#define LAUNCH_ELEMENTWISE(kernel, n, ...)                                        \
    do {                                                                          \
        if ((n) == 0) return 0;                                                   \
        kernel<<<gridFor((n), 256), 256, 0, stream>>>(__VA_ARGS__);               \
        LAUNCH_CHECK(#kernel, err);                                               \
        return 0;                                                                 \
    } while (0)

int siluForward(float *out, const float *a, size_t n, cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(siluForwardKernel, n, out, a, n);
}
int siluBackward(float *da, const float *dout, const float *a, size_t n, cudaStream_t stream,
                 NsaError *err) {
    LAUNCH_ELEMENTWISE(siluBackwardKernel, n, da, dout, a, n);
}
int swigluForward(float *out, const float *a, const float *b, size_t n, cudaStream_t stream,
                  NsaError *err) {
    LAUNCH_ELEMENTWISE(swigluForwardKernel, n, out, a, b, n);
}
int swigluBackward(float *da, float *db, const float *dout, const float *a, const float *b,
                   size_t n, cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(swigluBackwardKernel, n, da, db, dout, a, b, n);
}
int sigmoidForward(float *out, const float *a, size_t n, cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(sigmoidForwardKernel, n, out, a, n);
}
int sigmoidBackward(float *da, const float *dout, const float *g, size_t n, cudaStream_t stream,
                    NsaError *err) {
    LAUNCH_ELEMENTWISE(sigmoidBackwardKernel, n, da, dout, g, n);
}

int siluForwardTo(void *out, DType ot, const float *a, size_t n, cudaStream_t stream,
                  NsaError *err) {
    LAUNCH_ELEMENTWISE(siluForwardToKernel, n, out, (int)ot, a, n);
}
int swigluForwardTo(void *out, DType ot, const float *a, const float *b, size_t n,
                    cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(swigluForwardToKernel, n, out, (int)ot, a, b, n);
}
int siluBackwardTo(void *da, DType ot, const float *dout, const float *a, size_t n,
                   cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(siluBackwardToKernel, n, da, (int)ot, dout, a, n);
}
int swigluBackwardTo(void *da, void *db, DType ot, const float *dout, const float *a,
                     const float *b, size_t n, cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(swigluBackwardToKernel, n, da, db, (int)ot, dout, a, b, n);
}
int sigmoidBackwardTo(void *da, DType ot, const void *dout, DType dt, const float *g, size_t n,
                      cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(sigmoidBackwardToKernel, n, da, (int)ot, dout, (int)dt, g, n);
}
