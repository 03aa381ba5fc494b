/* attn_inputs.cu - the fast attention op's inputs from a layer's fused
 * projection, forward and backward (layers_cuda.h says the row layout).
 *
 * Forward, per token n at position t = n % S, each head's pairs (i, i+d/2):
 *   q'  = (q_i cos - q_{i+d/2} sin, q_i sin + q_{i+d/2} cos), angle t theta_i
 *   k'_b likewise, v'_b = v_b, g = sigmoid(logit)
 * Backward (the transpose): dq = rotation of dq' by -angle, dk_b likewise,
 *   dv_b as given, dlogit = dg g (1 - g).
 * One pass replaces the eight GEMM outputs' RoPE, rounding and sigmoid
 * passes: each element is read once and written once, four at a time. */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

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

/* Four consecutive elements by storage type (0 fp32, 1 bf16, 2 fp16): the
 * row parts start at multiples of 4 elements, so these are single 16- or
 * 8-byte accesses. */
__device__ __forceinline__ float4 load4As(const void *p, size_t i, int type) {
    if (type == 1) {
        const __nv_bfloat162 *q = (const __nv_bfloat162 *)((const __nv_bfloat16 *)p + i);
        const float2 a = __bfloat1622float2(q[0]), b = __bfloat1622float2(q[1]);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    if (type == 2) {
        const __half2 *q = (const __half2 *)((const __half *)p + i);
        const float2 a = __half22float2(q[0]), b = __half22float2(q[1]);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    return *(const float4 *)((const float *)p + i);
}

__device__ __forceinline__ void store4As(void *p, size_t i, int type, float4 v) {
    if (type == 1) {
        __nv_bfloat162 *q = (__nv_bfloat162 *)((__nv_bfloat16 *)p + i);
        q[0] = __floats2bfloat162_rn(v.x, v.y);
        q[1] = __floats2bfloat162_rn(v.z, v.w);
    } else if (type == 2) {
        __half2 *q = (__half2 *)((__half *)p + i);
        q[0] = __floats2half2_rn(v.x, v.y);
        q[1] = __floats2half2_rn(v.z, v.w);
    } else {
        *(float4 *)((float *)p + i) = v;
    }
}

/* Rotates the pairs of `heads` heads of width dim from src (stype) into
 * dst (dtype), four pairs (i .. i+3 with i+dim/2 .. i+dim/2+3) per thread
 * step: the block's threads stride over them. */
__device__ __forceinline__ void rotateHeads(void *dst, size_t dst_at, int dtype, const void *src,
                                            size_t src_at, int stype, const float *cs_row,
                                            int heads, int dim, float sign) {
    const int half = dim / 2, quads = half / 4;
    for (int u = threadIdx.x; u < heads * quads; u += blockDim.x) {
        const int h = u / quads, i = (u % quads) * 4;
        const float4 c01 = *(const float4 *)(cs_row + 2 * i);     /* cos, sin of i, i+1 */
        const float4 c23 = *(const float4 *)(cs_row + 2 * i + 4); /* of i+2, i+3 */
        const float c[4] = {c01.x, c01.z, c23.x, c23.z};
        const float s[4] = {sign * c01.y, sign * c01.w, sign * c23.y, sign * c23.w};
        const size_t a = (size_t)h * dim + i;
        const float4 x0 = load4As(src, src_at + a, stype), x1 = load4As(src, src_at + a + half, stype);
        const float p[4] = {x0.x, x0.y, x0.z, x0.w}, q[4] = {x1.x, x1.y, x1.z, x1.w};
        float lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = p[k] * c[k] - q[k] * s[k];
            hi[k] = p[k] * s[k] + q[k] * c[k];
        }
        store4As(dst, dst_at + a, dtype, make_float4(lo[0], lo[1], lo[2], lo[3]));
        store4As(dst, dst_at + a + half, dtype, make_float4(hi[0], hi[1], hi[2], hi[3]));
    }
}

/* n elements (a multiple of 4), four per thread step. */
__device__ __forceinline__ void copyRow(void *dst, size_t dst_at, int dtype, const void *src,
                                        size_t src_at, int stype, int n) {
    for (int u = threadIdx.x * 4; u < n; u += blockDim.x * 4)
        store4As(dst, dst_at + u, dtype, load4As(src, src_at + u, stype));
}

/* A block per token n (t = n % S): q' = rope(q), k'_b = rope(k_b), v'_b = v_b (b = 0..2), stored
 * bf16; g = sigmoid(logit) for the 3H gate logits, into gates (fp32) and out.g (bf16). rope
 * rotates each head's pairs (i, i+d/2) by angle t theta_i, with cos/sin from cos_sin row t. */
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

/* Also zeroes the row's padding (after the gate part), which the dX and dW
 * GEMMs read against the layout's zero weight rows. */
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
    for (int u = threadIdx.x; u < parts.stride - parts.gate; u += blockDim.x) {
        float d = 0.0f;
        if (u < 3 * H) {
            const float g = gates[n * 3 * H + u];
            d = loadAs(grads.g, n * 3 * H + u, 1) * g * (1.0f - g);
        }
        storeAs(dproj, row + parts.gate + u, dt, d);
    }
}

static unsigned rowThreads(int H, int dk) { return H * dk / 8 >= 128 ? 128 : 64; }

/* The 4-wide accesses need d_k a multiple of 8 and d_v of 4 (the fast op's
 * head dims all are), and 16-byte aligned tensors. */
static int shapeOk(int dk, int dv, const char *what, NsaError *err) {
    if (dk % 8 || dv % 4)
        return nsaErrorf(err,
                         "cuda: %s: d_k = %d, d_v = %d; allowed: d_k a multiple of 8, d_v of 4",
                         what, dk, dv);
    return 0;
}

int attnInputsForward(AttnInputTensors out, float *gates, const void *proj, DType pt,
                      const float *cos_sin, int B, int S, int H, int G, int dk, int dv,
                      cudaStream_t stream, NsaError *err) {
    const size_t N = (size_t)B * S;
    if (N == 0) return 0;
    if (N > 0x7fffffffu)
        return nsaErrorf(err, "cuda: attnInputsForward: %zu tokens; allowed: < 2^31", N);
    if (shapeOk(dk, dv, "attnInputsForward", err)) return -1;
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
    if (N > 0x7fffffffu)
        return nsaErrorf(err, "cuda: attnInputsBackward: %zu tokens; allowed: < 2^31", N);
    if (shapeOk(dk, dv, "attnInputsBackward", err)) return -1;
    attnInputsBackwardKernel<<<(unsigned)N, rowThreads(H, dk), 0, stream>>>(
        dproj, (int)dt, grads, gates, cos_sin, S, H, G, dk, dv, rowParts(H, G, dk, dv));
    LAUNCH_CHECK("attnInputsBackwardKernel", err);
    return 0;
}
