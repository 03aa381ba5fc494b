/* attn_pool_mlp.cu - compressed-block pooling with phi = mlp on the GPU,
 * forward and backward (the oracle is kernels/cpu/attn_pool_mlp.c).
 *
 * For block i of group g, X_i is the l x dim slice x[i*d .. i*d+l)[g][:],
 * u_i = vec(X_i + P) (row j, column c -> j*dim + c), and with NB = B*Nc*G
 * blocks stacked as rows the op is two GEMMs around a SiLU:
 *   U [NB][l*dim]   = gather(x) + P                (operand type, scratch)
 *   H [NB][dim]     = U W1^T                       (fp32, saved by the caller)
 *   pooled [NB][dim]= mean_j X_ij + silu(H) W2^T   (mean first, GEMM adds onto it)
 * Nothing is saved but H: the backward gathers U again and recomputes
 * silu(H), so the only per-layer memory is the pre-activation. Every
 * reduction runs in a fixed order (no float atomics): the result is
 * bit-reproducible. */
#include "../cuda_common.cuh"
#include "gemm.h"
#include "../attn_ref/attn_cuda.h"
#include "layers_cuda.h"

__device__ __forceinline__ float poolSigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

/* U[r][j*dim + c] = x[b*S + i*d + j][g][c] + P[j][c], r = (b*Nc + i)*G + g,
 * stored in the GEMM operand type. */
__global__ void poolMlpGatherKernel(void *u, int ut, const float *x, const float *pos, int S,
                                    int G, int dim, int cmp_len, int cmp_stride, int Nc,
                                    size_t total) {
    const size_t in_len = (size_t)cmp_len * dim;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / in_len, k = idx % in_len;
        const size_t j = k / dim, c = k % dim;
        const size_t g = r % G, bi = r / G;
        const size_t i = bi % Nc, b = bi / Nc;
        const size_t tok = b * S + i * cmp_stride + j;
        storeAs(u, idx, ut, x[(tok * G + g) * dim + c] + pos[k]);
    }
}

/* dH = dA silu'(H), silu'(h) = s (1 + h (1 - s)), s = sigmoid(h): written
 * in fp32 over dA (the dP reduction reads it) and in the operand type into
 * dh_op (the two GEMMs read that). */
__global__ void poolMlpSiluBackwardKernel(float *dact, void *dh_op, int ot, const float *hidden,
                                          size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float h = hidden[i], s = poolSigmoid(h);
        const float dh = dact[i] * s * (1.0f + h * (1.0f - s));
        dact[i] = dh;
        storeAs(dh_op, i, ot, dh);
    }
}

/* dX[b*S + t][g][c] (=|+=) sum over the blocks i covering t, ascending:
 *   dU[r_i][(t - i*d)*dim + c] + dpooled[r_i][c] / l.
 * Token t is in block i iff i*d <= t < i*d + l, i < Nc: each token gathers
 * its own sum, so overlapping blocks need no atomics and the order is fixed. */
__global__ void poolMlpDxKernel(float *dx, int accumulate, const float *du, const float *dpooled,
                                int S, int G, int dim, int cmp_len, int cmp_stride, int Nc,
                                float inv_len, size_t total) {
    const size_t in_len = (size_t)cmp_len * dim;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t c = idx % dim, row = idx / dim;
        const size_t g = row % G, bt = row / G;
        const int t = (int)(bt % S);
        const size_t b = bt / S;
        const int first = t >= cmp_len ? (t - cmp_len) / cmp_stride + 1 : 0;
        const int last = min(t / cmp_stride, Nc - 1);
        float acc = 0.0f;
        for (int i = first; i <= last; i++) {
            const size_t r = (b * Nc + i) * G + g;
            const size_t j = (size_t)(t - i * cmp_stride);
            acc += du[r * in_len + j * dim + c] + dpooled[r * dim + c] * inv_len;
        }
        dx[idx] = (accumulate ? dx[idx] : 0.0f) + acc;
    }
}

/* partial[chunk][e] = sum over rows r of the chunk, ascending, of dH[r][e]. */
__global__ void poolMlpColumnPartialKernel(float *partial, const float *dh, int rows, int dim) {
    const int r0 = blockIdx.x * POOL_MLP_CHUNK;
    const int r1 = min(rows, r0 + POOL_MLP_CHUNK);
    for (int e = threadIdx.x; e < dim; e += blockDim.x) {
        double acc = 0.0;
        for (int r = r0; r < r1; r++) acc += dh[(size_t)r * dim + e];
        partial[(size_t)blockIdx.x * dim + e] = (float)acc;
    }
}

/* dh_sum[e] = sum over chunks, ascending, of partial[chunk][e]. */
__global__ void poolMlpColumnSumKernel(float *dh_sum, const float *partial, int chunks, int dim) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= dim) return;
    double acc = 0.0;
    for (int ch = 0; ch < chunks; ch++) acc += partial[(size_t)ch * dim + e];
    dh_sum[e] = (float)acc;
}

/* dP[k] += sum_e W1[e][k] dh_sum[e]: dP = sum over blocks of (W1^T dH_r),
 * summed over blocks first (linearity), so it costs one [dim] x [dim][l*dim]
 * product however many blocks there are. */
__global__ void poolMlpDposKernel(float *dpos, const float *w1, const float *dh_sum, int dim,
                                  size_t in_len) {
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < in_len;
         k += (size_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int e = 0; e < dim; e++) acc += w1[(size_t)e * in_len + k] * dh_sum[e];
        dpos[k] += acc;
    }
}

size_t poolMlpBlocks(int B, int S, int G, int cmp_len, int cmp_stride) {
    return (size_t)B * nsaNumCmpBlocks(S, cmp_len, cmp_stride) * G;
}

static int poolMlpCheck(const PoolMlpWeights *w, const PoolMlpScratch *s, int B, int S, int G,
                        int dim, int cmp_len, int cmp_stride, NsaError *err) {
    if (!w || !s || !w->pos || !w->w1 || !w->w2 || !w->w1_master)
        return nsaErrorf(err, "cuda: phi=mlp pooling needs its weights and scratch (NULL given)");
    if (B < 1 || S < 1 || G < 1 || dim < 1 || cmp_len < 1 || cmp_stride < 1)
        return nsaErrorf(err,
                         "cuda: phi=mlp pooling dims B=%d S=%d G=%d dim=%d l=%d d=%d; "
                         "allowed: each 1 or more",
                         B, S, G, dim, cmp_len, cmp_stride);
    if ((size_t)cmp_len * dim > (size_t)1 << 30)
        return nsaErrorf(err, "cuda: phi=mlp pooling l*dim = %zu; allowed: up to 2^30",
                         (size_t)cmp_len * dim);
    return 0;
}

int poolMlpForward(GemmContext *gemm, cudaStream_t stream, float *pooled, float *hidden,
                   const float *x, const PoolMlpWeights *w, const PoolMlpScratch *s, int B, int S,
                   int G, int dim, int cmp_len, int cmp_stride, NsaError *err) {
    if (poolMlpCheck(w, s, B, S, G, dim, cmp_len, cmp_stride, err)) return -1;
    const int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    const size_t NB = (size_t)B * Nc * G;
    if (NB == 0) return 0;   /* S < l: no block, nothing to pool */
    if (NB > (size_t)1 << 30)
        return nsaErrorf(err, "cuda: phi=mlp pooling over %zu blocks; allowed: up to 2^30", NB);
    const int in_len = cmp_len * dim;
    const DType op = gemmOperandType(gemm);
    const size_t n_u = NB * (size_t)in_len;
    poolMlpGatherKernel<<<gridFor(n_u, 256), 256, 0, stream>>>(s->u, (int)op, x, w->pos, S, G,
                                                               dim, cmp_len, cmp_stride, Nc, n_u);
    LAUNCH_CHECK("poolMlpGatherKernel", err);
    if (linearForward(gemm, stream, hidden, s->u, w->w1, (int)NB, in_len, dim, 0.0f, NULL, err))
        return -1;
    if (siluForwardTo(s->act, op, hidden, DTYPE_F32, NB * dim, stream, err)) return -1;
    if (attnPoolAvgForward(pooled, x, B, S, G, dim, cmp_len, cmp_stride, stream, err)) return -1;
    /* the residual mean rides in the GEMM's beta: pooled = mean + silu(H) W2^T */
    return linearForward(gemm, stream, pooled, s->act, w->w2, (int)NB, dim, dim, 1.0f, pooled,
                         err);
}

int poolMlpBackward(GemmContext *gemm, cudaStream_t stream, float *dx, int accumulate,
                    float *dpos, float *dw1, float *dw2, const float *dpooled,
                    const float *hidden, const float *x, const PoolMlpWeights *w,
                    const PoolMlpScratch *s, int B, int S, int G, int dim, int cmp_len,
                    int cmp_stride, NsaError *err) {
    if (poolMlpCheck(w, s, B, S, G, dim, cmp_len, cmp_stride, err)) return -1;
    const int Nc = nsaNumCmpBlocks(S, cmp_len, cmp_stride);
    const size_t NB = (size_t)B * Nc * G;
    if (NB > (size_t)1 << 30)
        return nsaErrorf(err, "cuda: phi=mlp pooling over %zu blocks; allowed: up to 2^30", NB);
    const int in_len = cmp_len * dim;
    const DType op = gemmOperandType(gemm);
    const size_t n_x = (size_t)B * S * G * dim;
    if (NB > 0) {
        const size_t n_u = NB * (size_t)in_len, n_h = NB * (size_t)dim;
        /* U and silu(H) again (the forward kept only H) */
        poolMlpGatherKernel<<<gridFor(n_u, 256), 256, 0, stream>>>(
            s->u, (int)op, x, w->pos, S, G, dim, cmp_len, cmp_stride, Nc, n_u);
        LAUNCH_CHECK("poolMlpGatherKernel", err);
        if (siluForwardTo(s->act, op, hidden, DTYPE_F32, n_h, stream, err)) return -1;
        const void *dp = dpooled;
        if (op != DTYPE_F32) {
            if (convertTensor(s->dp, op, dpooled, DTYPE_F32, n_h, stream, err)) return -1;
            dp = s->dp;
        }
        /* dW2 += dP^T silu(H);  dA = dP W2 */
        if (linearBackwardW(gemm, stream, dw2, dp, s->act, (int)NB, dim, dim, err) ||
            linearBackwardX(gemm, stream, s->dact, dp, w->w2, (int)NB, dim, dim, 0.0f, err))
            return -1;
        poolMlpSiluBackwardKernel<<<gridFor(n_h, 256), 256, 0, stream>>>(s->dact, s->dh, (int)op,
                                                                         hidden, n_h);
        LAUNCH_CHECK("poolMlpSiluBackwardKernel", err);
        /* dW1 += dH^T U;  dU = dH W1 */
        if (linearBackwardW(gemm, stream, dw1, s->dh, s->u, (int)NB, in_len, dim, err) ||
            linearBackwardX(gemm, stream, s->du, s->dh, w->w1, (int)NB, in_len, dim, 0.0f, err))
            return -1;
        /* dP += W1^T (sum over blocks of dH), fp32 master W1 */
        const int chunks = (int)((NB + POOL_MLP_CHUNK - 1) / POOL_MLP_CHUNK);
        poolMlpColumnPartialKernel<<<chunks, 128, 0, stream>>>(s->partial, s->dact, (int)NB, dim);
        LAUNCH_CHECK("poolMlpColumnPartialKernel", err);
        poolMlpColumnSumKernel<<<ceilDiv((size_t)dim, 128), 128, 0, stream>>>(s->dh_sum,
                                                                              s->partial, chunks,
                                                                              dim);
        LAUNCH_CHECK("poolMlpColumnSumKernel", err);
        poolMlpDposKernel<<<gridFor((size_t)in_len, 256), 256, 0, stream>>>(
            dpos, w->w1_master, s->dh_sum, dim, (size_t)in_len);
        LAUNCH_CHECK("poolMlpDposKernel", err);
    }
    if (n_x == 0) return 0;
    /* with no block (S < l) every token gets 0 (or keeps dx): du is not read */
    poolMlpDxKernel<<<gridFor(n_x, 256), 256, 0, stream>>>(dx, accumulate, s->du, dpooled, S, G,
                                                           dim, cmp_len, cmp_stride, Nc,
                                                           1.0f / (float)cmp_len, n_x);
    LAUNCH_CHECK("poolMlpDxKernel", err);
    return 0;
}
