/* attn_inputs.cu - the fast attention op's inputs from a layer's fused
 * projection, forward and backward (layers_cuda.h says the row layout).
 *
 * Forward, per token n at position t = n % S, each head's pairs (i, i+d/2):
 *   q'  = (q_i cos - q_{i+d/2} sin, q_i sin + q_{i+d/2} cos), angle t theta_i
 *   k'_b likewise, v'_b = v_b, g = sigmoid(logit)
 * Backward (the transpose): dq = rotation of dq' by -angle, dk_b likewise,
 *   dv_b as given, dlogit = dg g (1 - g).
 * One pass replaces the eight GEMM outputs' RoPE, rounding and sigmoid
 * passes: each element is read once and written once. */
#include "layers_cuda.h"
#include "cuda_common.cuh"

/* Where each part of a projection row starts: q, then (k, v) per branch,
 * then the gate logits. */
typedef struct RowParts {
    int q, k[3], v[3], gate, stride;
} RowParts;

static RowParts rowParts(int H, int G, int dk, int dv) {
    RowParts r;
    r.q = 0;
    int at = H * dk;
    for (int b = 0; b < 3; b++) {
        r.k[b] = at;
        at += G * dk;
        r.v[b] = at;
        at += G * dv;
    }
    r.gate = at;
    r.stride = attnInputsStride(H, G, dk, dv);
    return r;
}

/* Rotates the pairs of `heads` heads of width dim from src (stype) into
 * dst (dtype): the block's threads stride over the pairs. */
__device__ __forceinline__ void rotateHeads(void *dst, size_t dst_at, int dtype, const void *src,
                                            size_t src_at, int stype, const float *cs_row,
                                            int heads, int dim, float sign) {
    const int half = dim / 2;
    for (int u = threadIdx.x; u < heads * half; u += blockDim.x) {
        const int h = u / half, i = u % half;
        const float c = cs_row[2 * i], s = sign * cs_row[2 * i + 1];
        const size_t a = (size_t)h * dim + i;
        const float x0 = loadAs(src, src_at + a, stype), x1 = loadAs(src, src_at + a + half, stype);
        storeAs(dst, dst_at + a, dtype, x0 * c - x1 * s);
        storeAs(dst, dst_at + a + half, dtype, x0 * s + x1 * c);
    }
}

__device__ __forceinline__ void copyRow(void *dst, size_t dst_at, int dtype, const void *src,
                                        size_t src_at, int stype, int n) {
    for (int u = threadIdx.x; u < n; u += blockDim.x)
        storeAs(dst, dst_at + u, dtype, loadAs(src, src_at + u, stype));
}

__global__ void attnInputsForwardKernel(AttnInputTensors out, float *gates, const void *proj,
                                        int pt, const float *cos_sin, int S, int H, int G, int dk,
                                        int dv, RowParts parts) {
    const size_t n = blockIdx.x;
    const size_t row = n * parts.stride;
    const float *cs = cos_sin + (size_t)(n % S) * (dk / 2) * 2;
    rotateHeads(out.q, n * H * dk, 1, proj, row + parts.q, pt, cs, H, dk, 1.0f);
    for (int b = 0; b < 3; b++) {
        rotateHeads(out.k[b], n * G * dk, 1, proj, row + parts.k[b], pt, cs, G, dk, 1.0f);
        copyRow(out.v[b], n * G * dv, 1, proj, row + parts.v[b], pt, G * dv);
    }
    for (int u = threadIdx.x; u < 3 * H; u += blockDim.x) {
        const float g = 1.0f / (1.0f + expf(-loadAs(proj, row + parts.gate + u, pt)));
        gates[n * 3 * H + u] = g;
        storeAs(out.g, n * 3 * H + u, 1, g);
    }
}

__global__ void attnInputsBackwardKernel(void *dproj, int dt, AttnInputTensors grads,
                                         const float *gates, const float *cos_sin, int S, int H,
                                         int G, int dk, int dv, RowParts parts) {
    const size_t n = blockIdx.x;
    const size_t row = n * parts.stride;
    const float *cs = cos_sin + (size_t)(n % S) * (dk / 2) * 2;
    rotateHeads(dproj, row + parts.q, dt, grads.q, n * H * dk, 1, cs, H, dk, -1.0f);
    for (int b = 0; b < 3; b++) {
        rotateHeads(dproj, row + parts.k[b], dt, grads.k[b], n * G * dk, 1, cs, G, dk, -1.0f);
        copyRow(dproj, row + parts.v[b], dt, grads.v[b], n * G * dv, 1, G * dv);
    }
    for (int u = threadIdx.x; u < 3 * H; u += blockDim.x) {
        const float g = gates[n * 3 * H + u];
        storeAs(dproj, row + parts.gate + u, dt, loadAs(grads.g, n * 3 * H + u, 1) * g * (1.0f - g));
    }
}

static unsigned rowThreads(int H, int dk) { return H * dk / 2 >= 256 ? 256 : 128; }

int attnInputsForward(AttnInputTensors out, float *gates, const void *proj, DType pt,
                      const float *cos_sin, int B, int S, int H, int G, int dk, int dv,
                      cudaStream_t stream, NsaError *err) {
    const size_t N = (size_t)B * S;
    if (N == 0) return 0;
    if (N > 0x7fffffffu) return cudaFail(err, "cuda: attnInputsForward: %zu tokens; allowed: < 2^31", N);
    attnInputsForwardKernel<<<(unsigned)N, rowThreads(H, dk), 0, stream>>>(
        out, gates, proj, (int)pt, cos_sin, S, H, G, dk, dv, rowParts(H, G, dk, dv));
    LAUNCH_CHECK("attnInputsForwardKernel", err);
    return 0;
}

int attnInputsBackward(void *dproj, DType dt, AttnInputTensors grads, const float *gates,
                       const float *cos_sin, int B, int S, int H, int G, int dk, int dv,
                       cudaStream_t stream, NsaError *err) {
    const size_t N = (size_t)B * S;
    if (N == 0) return 0;
    if (N > 0x7fffffffu) return cudaFail(err, "cuda: attnInputsBackward: %zu tokens; allowed: < 2^31", N);
    attnInputsBackwardKernel<<<(unsigned)N, rowThreads(H, dk), 0, stream>>>(
        dproj, (int)dt, grads, gates, cos_sin, S, H, G, dk, dv, rowParts(H, G, dk, dv));
    LAUNCH_CHECK("attnInputsBackwardKernel", err);
    return 0;
}
