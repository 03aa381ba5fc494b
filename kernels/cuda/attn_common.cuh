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
#include "cuda_common.cuh"

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

/* Forward of one query row. keyOf(n) gives the key index of slot n (0 <=
 * n < n_slots) or -1 when that slot is masked; key index r means rows
 * K + r*k_stride and V + r*v_stride. qs: the row's query in shared memory.
 * Writes o_row[0..dv) (0 when nothing is visible) and *lse_out (lane 0;
 * -INFINITY when nothing is visible). */
template <class KeyOf>
__device__ void warpAttnRowForward(const float *qs, int dk, int dv, const float *__restrict__ K,
                                   size_t k_stride, const float *__restrict__ V, size_t v_stride,
                                   int n_slots, KeyOf keyOf, float scale, float *o_row,
                                   float *lse_out) {
    const int lane = threadIdx.x & 31;
    float m = -INFINITY, l = 0.0f;
    float acc[ATTN_DIM_REGS];
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) acc[i] = 0.0f;
    for (int base = 0; base < n_slots; base += 32) {
        int n = base + lane;
        int key = n < n_slots ? keyOf(n) : -1;
        float s = key >= 0 ? scale * dotShared(qs, K + (size_t)key * k_stride, dk) : -INFINITY;
        float m_chunk = warpMax(s);
        if (m_chunk == -INFINITY) continue;
        float m_new = fmaxf(m, m_chunk);
        float corr = expf(m - m_new);
        float p = key >= 0 ? expf(s - m_new) : 0.0f;
        l = l * corr + warpSum(p);
#pragma unroll
        for (int i = 0; i < ATTN_DIM_REGS; i++) acc[i] *= corr;
        for (int jj = 0; jj < 32; jj++) {
            int kj = __shfl_sync(0xffffffffu, key, jj);
            float pj = __shfl_sync(0xffffffffu, p, jj);
            if (kj < 0) continue;
            const float *vrow = V + (size_t)kj * v_stride;
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
 * p_j = exp(scale q.k_j - lse). qs, dos: q and dO of the row in shared. */
template <class KeyOf>
__device__ void warpAttnRowBackwardDq(const float *qs, const float *dos, int dk, int dv,
                                      const float *__restrict__ K, size_t k_stride,
                                      const float *__restrict__ V, size_t v_stride, int n_slots,
                                      KeyOf keyOf, float scale, float lse, float delta,
                                      float *dq_row, int accumulate) {
    const int lane = threadIdx.x & 31;
    float acc[ATTN_DIM_REGS];
#pragma unroll
    for (int i = 0; i < ATTN_DIM_REGS; i++) acc[i] = 0.0f;
    if (lse != -INFINITY) {
        for (int base = 0; base < n_slots; base += 32) {
            int n = base + lane;
            int key = n < n_slots ? keyOf(n) : -1;
            float ds = 0.0f;
            if (key >= 0) {
                float s = scale * dotShared(qs, K + (size_t)key * k_stride, dk);
                float p = expf(s - lse);
                float dp = dotShared(dos, V + (size_t)key * v_stride, dv);
                ds = p * (dp - delta);
            }
            for (int jj = 0; jj < 32; jj++) {
                int kj = __shfl_sync(0xffffffffu, key, jj);
                float dsj = __shfl_sync(0xffffffffu, ds, jj);
                if (kj < 0) continue;
                const float *krow = K + (size_t)kj * k_stride;
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
 * [r][dv], lse [r], delta [r]) of candidate n, or -1 when masked. ks, vs:
 * the key and value in shared. Adds into acc_dk/acc_dv (lane's dims);
 * the caller scales dk by `scale` once at the end. */
template <class RowOf>
__device__ void warpAttnKeyBackward(const float *ks, const float *vs, int dk, int dv,
                                    const float *__restrict__ q, const float *__restrict__ dout,
                                    const float *__restrict__ lse,
                                    const float *__restrict__ delta, int n_cand, RowOf rowOf,
                                    float scale, float *acc_dk, float *acc_dv) {
    const int lane = threadIdx.x & 31;
    for (int base = 0; base < n_cand; base += 32) {
        int n = base + lane;
        long long r = n < n_cand ? rowOf(n) : -1;
        float p = 0.0f, ds = 0.0f;
        if (r >= 0) {
            float s = scale * dotShared(ks, q + (size_t)r * dk, dk);
            p = expf(s - lse[r]);
            float dp = dotShared(vs, dout + (size_t)r * dv, dv);
            ds = p * (dp - delta[r]);
        }
        for (int jj = 0; jj < 32; jj++) {
            long long rj = __shfl_sync(0xffffffffu, r, jj);
            float pj = __shfl_sync(0xffffffffu, p, jj);
            float dsj = __shfl_sync(0xffffffffu, ds, jj);
            if (rj < 0) continue;
            const float *qrow = q + (size_t)rj * dk;
            const float *dorow = dout + (size_t)rj * dv;
#pragma unroll
            for (int i = 0; i < ATTN_DIM_REGS; i++) {
                int c = lane + 32 * i;
                if (c < dk) acc_dk[i] = fmaf(dsj, qrow[c], acc_dk[i]);
                if (c < dv) acc_dv[i] = fmaf(pj, dorow[c], acc_dv[i]);
            }
        }
    }
}

#endif
