/* activation.cu - elementwise activations, forward and backward.
 *
 * silu(a) = a s(a), s = sigmoid; silu'(a) = s(a) (1 + a (1 - s(a))).
 * swiglu(a, b) = silu(a) b.  sigmoid'(a) = g (1 - g) with g = s(a).
 *
 * The MLP's kernels (silu, swiglu and their backward) are the largest
 * elementwise passes of a step, so they are templated on their storage
 * types and move 8 elements per thread in 16-byte accesses where the
 * pointers allow (the engine's buffers always do); arithmetic is fp32 and
 * each value rounds once when stored. */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

__device__ __forceinline__ float sigmoidf_(float a) { return 1.0f / (1.0f + expf(-a)); }

#define ELEMENTWISE_LOOP(n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

/* The MLP activations by what they compute; b is SwiGLU's gate input and
 * db its gradient (unused by SiLU). */
enum { ACT_SILU_FWD, ACT_SWIGLU_FWD, ACT_SILU_BWD, ACT_SWIGLU_BWD };

template <int OP>
__device__ __forceinline__ void activationMath(float d, float a, float b, float *out, float *out2) {
    const float s = sigmoidf_(a);
    if constexpr (OP == ACT_SILU_FWD) *out = a * s;
    else if constexpr (OP == ACT_SWIGLU_FWD) *out = a * s * b;
    else if constexpr (OP == ACT_SILU_BWD) *out = d * s * (1.0f + a * (1.0f - s));
    else {
        *out = d * b * s * (1.0f + a * (1.0f - s));
        *out2 = d * a * s;
    }
}

/* Forward: out = f(a[, b]). Backward: out = df/da * dout, out2 = df/db *
 * dout. A thread takes 8 consecutive elements when VEC (the tail, fewer
 * than 8, by the last thread element by element). */
template <int OP, bool VEC, typename OT, typename IT>
__global__ void activationKernel(OT *out, OT *out2, const IT *dout, const IT *a, const IT *b,
                                 size_t n) {
    constexpr bool has_d = OP == ACT_SILU_BWD || OP == ACT_SWIGLU_BWD;
    constexpr bool has_b = OP == ACT_SWIGLU_FWD || OP == ACT_SWIGLU_BWD;
    if constexpr (VEC) {
        const size_t vectors = n / 8;
        for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < vectors;
             v += (size_t)gridDim.x * blockDim.x) {
            const size_t i = v * 8;
            float d[8] = {0}, x[8], g[8] = {0}, o[8], o2[8];
            load8(a + i, x);
            if constexpr (has_d) load8(dout + i, d);
            if constexpr (has_b) load8(b + i, g);
#pragma unroll
            for (int k = 0; k < 8; k++) activationMath<OP>(d[k], x[k], g[k], &o[k], &o2[k]);
            store8(out + i, o);
            if constexpr (OP == ACT_SWIGLU_BWD) store8(out2 + i, o2);
        }
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            for (size_t i = vectors * 8; i < n; i++) {
                float o, o2;
                activationMath<OP>(has_d ? toFloat(dout[i]) : 0.0f, toFloat(a[i]),
                                   has_b ? toFloat(b[i]) : 0.0f, &o, &o2);
                out[i] = fromFloat<OT>(o);
                if constexpr (OP == ACT_SWIGLU_BWD) out2[i] = fromFloat<OT>(o2);
            }
        }
    } else {
        ELEMENTWISE_LOOP(n) {
            float o, o2;
            activationMath<OP>(has_d ? toFloat(dout[i]) : 0.0f, toFloat(a[i]),
                               has_b ? toFloat(b[i]) : 0.0f, &o, &o2);
            out[i] = fromFloat<OT>(o);
            if constexpr (OP == ACT_SWIGLU_BWD) out2[i] = fromFloat<OT>(o2);
        }
    }
}

template <int OP, typename OT, typename IT>
static int activationLaunchTyped(void *out, void *out2, const void *dout, const void *a,
                                 const void *b, size_t n, cudaStream_t stream, NsaError *err) {
    const int vec = aligned8(out, sizeof(OT)) && aligned8(out2, sizeof(OT)) &&
                    aligned8(dout, sizeof(IT)) && aligned8(a, sizeof(IT)) &&
                    aligned8(b, sizeof(IT));
    if (vec)
        activationKernel<OP, true, OT, IT><<<gridFor(n / 8 + 1, 256), 256, 0, stream>>>(
            (OT *)out, (OT *)out2, (const IT *)dout, (const IT *)a, (const IT *)b, n);
    else
        activationKernel<OP, false, OT, IT><<<gridFor(n, 256), 256, 0, stream>>>(
            (OT *)out, (OT *)out2, (const IT *)dout, (const IT *)a, (const IT *)b, n);
    LAUNCH_CHECK("activationKernel", err);
    return 0;
}

template <int OP, typename OT>
static int activationLaunchIn(void *out, void *out2, const void *dout, const void *a,
                              const void *b, DType it, size_t n, cudaStream_t stream,
                              NsaError *err) {
    switch (it) {
    case DTYPE_F32:
        return activationLaunchTyped<OP, OT, float>(out, out2, dout, a, b, n, stream, err);
    case DTYPE_BF16:
        return activationLaunchTyped<OP, OT, __nv_bfloat16>(out, out2, dout, a, b, n, stream, err);
    case DTYPE_F16:
        return activationLaunchTyped<OP, OT, __half>(out, out2, dout, a, b, n, stream, err);
    }
    return nsaErrorf(err, "cuda: activation input type %d; allowed: 0 (fp32), 1 (bf16), 2 (fp16)",
                     (int)it);
}

/* out (and out2) of type ot, every input of type it. */
template <int OP>
static int activationLaunch(void *out, void *out2, DType ot, const void *dout, const void *a,
                            const void *b, DType it, size_t n, cudaStream_t stream,
                            NsaError *err) {
    if (n == 0) return 0;
    switch (ot) {
    case DTYPE_F32:
        return activationLaunchIn<OP, float>(out, out2, dout, a, b, it, n, stream, err);
    case DTYPE_BF16:
        return activationLaunchIn<OP, __nv_bfloat16>(out, out2, dout, a, b, it, n, stream, err);
    case DTYPE_F16:
        return activationLaunchIn<OP, __half>(out, out2, dout, a, b, it, n, stream, err);
    }
    return nsaErrorf(err, "cuda: activation output type %d; allowed: 0 (fp32), 1 (bf16), 2 (fp16)",
                     (int)ot);
}

int siluForwardTo(void *out, DType ot, const void *a, DType at, size_t n, cudaStream_t stream,
                  NsaError *err) {
    return activationLaunch<ACT_SILU_FWD>(out, NULL, ot, NULL, a, NULL, at, n, stream, err);
}
int swigluForwardTo(void *out, DType ot, const void *a, const void *b, DType it, size_t n,
                    cudaStream_t stream, NsaError *err) {
    return activationLaunch<ACT_SWIGLU_FWD>(out, NULL, ot, NULL, a, b, it, n, stream, err);
}
int siluBackwardTo(void *da, DType ot, const void *dout, const void *a, DType it, size_t n,
                   cudaStream_t stream, NsaError *err) {
    return activationLaunch<ACT_SILU_BWD>(da, NULL, ot, dout, a, NULL, it, n, stream, err);
}
int swigluBackwardTo(void *da, void *db, DType ot, const void *dout, const void *a, const void *b,
                     DType it, size_t n, cudaStream_t stream, NsaError *err) {
    return activationLaunch<ACT_SWIGLU_BWD>(da, db, ot, dout, a, b, it, n, stream, err);
}

int siluForward(float *out, const float *a, size_t n, cudaStream_t stream, NsaError *err) {
    return siluForwardTo(out, DTYPE_F32, a, DTYPE_F32, n, stream, err);
}
int siluBackward(float *da, const float *dout, const float *a, size_t n, cudaStream_t stream,
                 NsaError *err) {
    return siluBackwardTo(da, DTYPE_F32, dout, a, DTYPE_F32, n, stream, err);
}
int swigluForward(float *out, const float *a, const float *b, size_t n, cudaStream_t stream,
                  NsaError *err) {
    return swigluForwardTo(out, DTYPE_F32, a, b, DTYPE_F32, n, stream, err);
}
int swigluBackward(float *da, float *db, const float *dout, const float *a, const float *b,
                   size_t n, cudaStream_t stream, NsaError *err) {
    return swigluBackwardTo(da, db, DTYPE_F32, dout, a, b, DTYPE_F32, n, stream, err);
}

/* ---- sigmoid (the reference path's gates) ---- */

/* out = sigmoid(a) = 1 / (1 + exp(-a)), elementwise. */
__global__ void sigmoidForwardKernel(float *out, const float *a, size_t n) {
    ELEMENTWISE_LOOP(n) { out[i] = sigmoidf_(a[i]); }
}
/* da = dout g (1 - g), elementwise, from the forward's output g = sigmoid(a). */
__global__ void sigmoidBackwardKernel(float *da, const float *dout, const float *g, size_t n) {
    ELEMENTWISE_LOOP(n) { float y = g[i]; da[i] = dout[i] * y * (1.0f - y); }
}

#define LAUNCH_ELEMENTWISE(kernel, n, ...)                                        \
    do {                                                                          \
        if ((n) == 0) return 0;                                                   \
        kernel<<<gridFor((n), 256), 256, 0, stream>>>(__VA_ARGS__);               \
        LAUNCH_CHECK(#kernel, err);                                               \
        return 0;                                                                 \
    } while (0)

int sigmoidForward(float *out, const float *a, size_t n, cudaStream_t stream, NsaError *err) {
    LAUNCH_ELEMENTWISE(sigmoidForwardKernel, n, out, a, n);
}
int sigmoidBackward(float *da, const float *dout, const float *g, size_t n, cudaStream_t stream,
                    NsaError *err) {
    LAUNCH_ELEMENTWISE(sigmoidBackwardKernel, n, da, dout, g, n);
}
