/* attn_common.cuh - the warp-level building blocks of the simple NSA
 * attention kernels: a query row streaming over the keys it sees with an
 * online softmax (forward), the same walk for dq (backward), and a key
 * walking over the query rows that see it for dk/dv (backward).
 *
 * Keys are visited in chunks of 32: lane i scores key slot base+i against
 * the row (q staged in shared memory), then the warp folds the chunk into
 * its running max/sum/accumulator, each lane owning output dims lane,
 * lane+32, ... (coalesced value reads). All statistics are fp32; the order
 * of every sum is fixed, so results are bit-reproducible. */
#ifndef NSA_CUDA_ATTN_COMMON_CUH
#define NSA_CUDA_ATTN_COMMON_CUH

#include "attn_cuda.h"
#include "../cuda_common.cuh"

#define ATTN_DIM_REGS (NSA_CUDA_ATTN_MAX_DIM / 32)
#define ATTN_WARPS 4

__device__ __forceinline__ float dotShared(const float *__restrict__ a_shared,
                                           const float *__restrict__ b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc = fmaf(a_shared[i], b[i], acc);
    return acc;
}

/* Copies n floats of a row into this warp's shared buffer. */
__device__ __forceinline__ void warpStage(float *dst, const float *src, int n) {
    int lane = threadIdx.x & 31;
    for (int i = lane; i < n; i += 32) dst[i] = src[i];
    __syncwarp();
}

/* Per-warp shared memory of the attention kernels, in floats: the row
 * vectors (q and dO, or k and v) and two 32-row tiles with an odd stride
 * (dim + 1) so that lane j reading row j hits 32 different banks. Rows are
 * staged with coalesced loads (the warp reads one row at a time), which is
 * what keeps the per-lane dot products from thrashing L1. */
__host__ __device__ __forceinline__ int attnTileStride(int dim) { return dim | 1; }
__host__ __device__ __forceinline__ size_t attnWarpFloats(int dk, int dv) {
    return (size_t)dk + dv + 32 * (size_t)attnTileStride(dk) + 32 * (size_t)attnTileStride(dv);
}
/* Shared-memory bytes of a block of `warps` warps. */
static inline size_t attnBlockSmem(int dk, int dv, int warps) {
    return (size_t)warps * attnWarpFloats(dk, dv) * sizeof(float);
}

typedef struct AttnWarpSmem {
    float *a, *b;          /* [dk], [dv]: q and dO, or k and v */
    float *ta, *tb;        /* [32][stride(dk)], [32][stride(dv)] */
} AttnWarpSmem;

__device__ __forceinline__ AttnWarpSmem attnWarpSmem(float *smem, int warp, int dk, int dv) {
    AttnWarpSmem w;
    float *base = smem + (size_t)warp * attnWarpFloats(dk, dv);
    w.a = base;
    w.b = w.a + dk;
    w.ta = w.b + dv;
    w.tb = w.ta + 32 * attnTileStride(dk);
    return w;
}

/* The query row of a warp in the one-warp-per-row kernels (grids of
 * ATTN_WARPS rows a block): row = (b S + t) H + h, bt = b S + t, and g the
 * KV group of head h. Returns false for a warp past the last row, which
 * then has nothing to do. */
typedef struct AttnQueryRow {
    size_t row, bt;
    int b, t, h, g;
} AttnQueryRow;

__device__ __forceinline__ bool attnQueryRowOf(const NsaAttnDims &d, int warp, AttnQueryRow &r) {
    r.row = (size_t)blockIdx.x * ATTN_WARPS + warp;
    if (r.row >= (size_t)d.B * d.S * d.H) return false;
    r.h = (int)(r.row % d.H);
    r.bt = r.row / d.H;
    r.t = (int)(r.bt % d.S);
    r.b = (int)(r.bt / d.S);
    r.g = r.h / (d.H / d.G);
    return true;
}

/* Key row 0 of group g, batch row b, in x [B][nkeys][G][dim]; key r is
 * r * G * dim further (the key stride the row walks take). */
__device__ __forceinline__ const float *attnGroupKeys(const float *x, int b, int g, int nkeys,
                                                      int G, int dim) {
    return x + ((size_t)b * nkeys * G + g) * dim;
}

/* Writes one key row's gradients from a warp's lane-strided accumulators
 * (lane owns dims lane, lane + 32, ...): dk = scale acc_dk, dv = acc_dv.
 * key_row indexes [B][keys][G] rows. */
__device__ __forceinline__ void attnStoreKeyGrads(float *dk, float *dv, size_t key_row, int d_k,
                                                  int d_v, float scale,
                                                  const float (&acc_dk)[ATTN_DIM_REGS],
                                                  const float (&acc_dv)[ATTN_DIM_REGS]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) {
        const int c = lane + 32 * i;
        if (c < d_k) dk[key_row * d_k + c] = scale * acc_dk[i];
        if (c < d_v) dv[key_row * d_v + c] = acc_dv[i];
    }
}

/* Stages row `idx` of lane r (r = 0..31; idx < 0: skipped) of src
 * (rows of row_stride floats, dim used) into tile row r. */
__device__ __forceinline__ void warpStageRows(float *tile, int dim, const float *__restrict__ src,
                                              size_t row_stride, long long idx) {
    const int lane = threadIdx.x & 31, stride = attnTileStride(dim);
    __syncwarp();
#pragma unroll 4
    for (int r = 0; r < 32; r++) {
        long long ir = __shfl_sync(0xffffffffu, idx, r);
        if (ir < 0) continue;
        const float *row = src + (size_t)ir * row_stride;
        for (int c = lane; c < dim; c += 32) tile[r * stride + c] = row[c];
    }
    __syncwarp();
}

/* Forward of one query row. keyOf(n) gives the key index of slot n (0 <=
 * n < n_slots) or -1 when that slot is masked; key index r means rows
 * K + r*k_stride and V + r*v_stride. w.a holds the row's query.
 * Writes o_row[0..dv) (0 when nothing is visible) and *lse_out (lane 0;
 * -INFINITY when nothing is visible). */
template <class KeyOf>
__device__ void warpAttnRowForward(const AttnWarpSmem &w, int dk, int dv,
                                   const float *__restrict__ K, size_t k_stride,
                                   const float *__restrict__ V, size_t v_stride, int n_slots,
                                   KeyOf keyOf, float scale, float *o_row, float *lse_out) {
    const int lane = threadIdx.x & 31;
    const int ks = attnTileStride(dk), vs = attnTileStride(dv);
    float m = -INFINITY, l = 0.0f;
    float acc[ATTN_DIM_REGS];
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) acc[i] = 0.0f;
    for (int base = 0; base < n_slots; base += 32) {
        int n = base + lane;
        int key = n < n_slots ? keyOf(n) : -1;
        if (__ballot_sync(0xffffffffu, key >= 0) == 0) continue;
        warpStageRows(w.ta, dk, K, k_stride, key);
        warpStageRows(w.tb, dv, V, v_stride, key);
        float s = key >= 0 ? scale * dotShared(w.a, w.ta + lane * ks, dk) : -INFINITY;
        float m_new = fmaxf(m, warpMax(s));
        float corr = expf(m - m_new);
        float p = key >= 0 ? expf(s - m_new) : 0.0f;
        l = l * corr + warpSum(p);
#pragma unroll
        for (int i = 0; i < ATTN_DIM_REGS; i++) acc[i] *= corr;
        for (int jj = 0; jj < 32; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            if (pj == 0.0f) continue;   /* masked slot (or an underflow: adds nothing) */
            const float *vrow = w.tb + jj * vs;
#pragma unroll
            for (int i = 0; i < ATTN_DIM_REGS; i++) {
                int c = lane + 32 * i;
                if (c < dv) acc[i] = fmaf(pj, vrow[c], acc[i]);
            }
        }
        m = m_new;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) {
        int c = lane + 32 * i;
        if (c < dv) o_row[c] = acc[i] * inv;
    }
    if (lane == 0) *lse_out = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* dq of one query row: dq = scale * sum_j p_j (dO.v_j - delta) k_j with
 * p_j = exp(scale q.k_j - lse). w.a, w.b: q and dO of the row. */
template <class KeyOf>
__device__ void warpAttnRowBackwardDq(const AttnWarpSmem &w, int dk, int dv,
                                      const float *__restrict__ K, size_t k_stride,
                                      const float *__restrict__ V, size_t v_stride, int n_slots,
                                      KeyOf keyOf, float scale, float lse, float delta,
                                      float *dq_row, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int ks = attnTileStride(dk), vs = attnTileStride(dv);
    float acc[ATTN_DIM_REGS];
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) acc[i] = 0.0f;
    if (lse != -INFINITY) {
        for (int base = 0; base < n_slots; base += 32) {
            int n = base + lane;
            int key = n < n_slots ? keyOf(n) : -1;
            if (__ballot_sync(0xffffffffu, key >= 0) == 0) continue;
            warpStageRows(w.ta, dk, K, k_stride, key);
            warpStageRows(w.tb, dv, V, v_stride, key);
            float ds = 0.0f;
            if (key >= 0) {
                float s = scale * dotShared(w.a, w.ta + lane * ks, dk);
                float p = expf(s - lse);
                float dp = dotShared(w.b, w.tb + lane * vs, dv);
                ds = p * (dp - delta);
            }
            for (int jj = 0; jj < 32; jj++) {
                float dsj = __shfl_sync(0xffffffffu, ds, jj);
                if (dsj == 0.0f) continue;
                const float *krow = w.ta + jj * ks;
#pragma unroll
                for (int i = 0; i < ATTN_DIM_REGS; i++) {
                    int c = lane + 32 * i;
                    if (c < dk) acc[i] = fmaf(dsj, krow[c], acc[i]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) {
        int c = lane + 32 * i;
        if (c < dk) dq_row[c] = (accumulate ? dq_row[c] : 0.0f) + scale * acc[i];
    }
}

/* dk, dv of one key, accumulated into registers over the query rows that
 * see it. rowOf(n) gives the query row index r (into q [r][dk], dout
 * [r][dv], lse [r], delta [r]) of candidate n, or -1 when masked. w.a, w.b:
 * the key and value. Adds into acc_dk/acc_dv (lane's dims); the caller
 * scales dk by `scale` once at the end. */
template <class RowOf>
__device__ void warpAttnKeyBackward(const AttnWarpSmem &w, int dk, int dv,
                                    const float *__restrict__ q, const float *__restrict__ dout,
                                    const float *__restrict__ lse,
                                    const float *__restrict__ delta, int n_cand, RowOf rowOf,
                                    float scale, float *acc_dk, float *acc_dv) {
    const int lane = threadIdx.x & 31;
    const int ks = attnTileStride(dk), vs = attnTileStride(dv);
    for (int base = 0; base < n_cand; base += 32) {
        int n = base + lane;
        long long r = n < n_cand ? rowOf(n) : -1;
        if (__ballot_sync(0xffffffffu, r >= 0) == 0) continue;
        warpStageRows(w.ta, dk, q, (size_t)dk, r);
        warpStageRows(w.tb, dv, dout, (size_t)dv, r);
        float p = 0.0f, ds = 0.0f;
        if (r >= 0) {
            float s = scale * dotShared(w.a, w.ta + lane * ks, dk);
            p = expf(s - lse[r]);
            float dp = dotShared(w.b, w.tb + lane * vs, dv);
            ds = p * (dp - delta[r]);
        }
        for (int jj = 0; jj < 32; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
            if (pj == 0.0f && dsj == 0.0f) continue;
            const float *qrow = w.ta + jj * ks;
            const float *dorow = w.tb + jj * vs;
#pragma unroll
            for (int i = 0; i < ATTN_DIM_REGS; i++) {
                int c = lane + 32 * i;
                if (c < dk) acc_dk[i] = fmaf(dsj, qrow[c], acc_dk[i]);
                if (c < dv) acc_dv[i] = fmaf(pj, dorow[c], acc_dv[i]);
            }
        }
    }
}

/* Launches kernel with one warp per item over `count` items, ATTN_WARPS
 * warps per block and the per-warp shared memory of dims; returns -1 from
 * the enclosing launcher on failure. */
#define ATTN_LAUNCH_WARPS(kernel, count, dims, stream, err, ...)                              \
    do {                                                                                      \
        size_t smem_ = attnBlockSmem((dims)->d_k, (dims)->d_v, ATTN_WARPS);                   \
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                        (int)smem_), err);                                    \
        kernel<<<ceilDiv((count), ATTN_WARPS), 32 * ATTN_WARPS, smem_, (stream)>>>(__VA_ARGS__); \
        LAUNCH_CHECK(#kernel, err);                                                           \
    } while (0)

#endif
