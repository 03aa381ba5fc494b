/* fast_common.cuh - the tensor-core building blocks of the fast NSA attention
 * kernels (kernels/cuda/fast_attn/): cp.async tile loads into padded shared
 * memory, ldmatrix fragment loads, mma.sync m16n8k16 bf16 with fp32
 * accumulators, and the fragment bookkeeping of a flash-attention tile.
 *
 * Fragment layout of mma.m16n8k16 (lane = 4*group + quad):
 *   A 16x16: a0 (row g, cols 2q..2q+1), a1 (row g+8), a2 (row g, cols +8),
 *            a3 (row g+8, cols +8);  B 16x8: b0 (k 2q..2q+1, col g), b1 (k +8);
 *   C 16x8:  c0,c1 (row g, cols 2q, 2q+1), c2,c3 (row g+8).
 * Shared tiles are row-major with rows padded by 8 bf16 (16 bytes), so the
 * eight row addresses of one ldmatrix land in distinct bank groups.
 * Internal to the fast kernels. */
#ifndef NSA_FAST_COMMON_CUH
#define NSA_FAST_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "../mma_sync.cuh"
#include "fast_attn.h"

#define FAST_THREADS 128  /* 4 warps: 4 x 16 mma rows */

__device__ __forceinline__ uint32_t fastSmemAddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* The barrier of one group of FAST_THREADS threads (threads 128 g .. 128 g
 * + 127) where a CTA's GROUPS warpgroups each walk their own work (named
 * barrier 1 + g; 0 is __syncthreads'); with one group, __syncthreads.
 * Every thread of the group must call it. */
template <int GROUPS>
__device__ __forceinline__ void fastGroupSync() {
    if constexpr (GROUPS == 1) {
        __syncthreads();
    } else {
        static_assert(FAST_THREADS == 128, "a group is one warpgroup");
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + (int)(threadIdx.x >> 7)) : "memory");
    }
}
/* Turns of a CTA's WGS warpgroups at the tensor cores (FlashAttention-3's
 * ping-pong): warpgroup w waits for its turn before it issues a tile's
 * products and hands the turn to warpgroup w + 1 (mod WGS) once they are
 * issued, so that one warpgroup's exponentials run under the others'
 * products rather than beside the same step of theirs. Named barrier
 * FAST_TURN_BAR + w is synced by warpgroup w and arrived at by the one
 * before it. Every warpgroup must take the same number of turns; begin()
 * before the first (the last warpgroup hands the first turn to warpgroup
 * 0), end() after the last (warpgroup 0 takes the last hand-over, so that
 * no arrival is left at a barrier). */
#define FAST_TURN_BAR 8
template <int WGS>
struct FastTurns {
    static_assert(WGS >= 2 && FAST_TURN_BAR + WGS <= 16, "named barriers 8 .. 15");
    __device__ static int wg() { return (int)(threadIdx.x >> 7); }
    __device__ static void begin() {
        if (wg() == WGS - 1) asm volatile("bar.arrive %0, %1;\n" ::"r"(FAST_TURN_BAR), "n"(256) : "memory");
    }
    __device__ static void wait() {
        asm volatile("bar.sync %0, %1;\n" ::"r"(FAST_TURN_BAR + wg()), "n"(256) : "memory");
    }
    __device__ static void pass() {
        asm volatile("bar.arrive %0, %1;\n" ::"r"(FAST_TURN_BAR + (wg() + 1) % WGS), "n"(256)
                     : "memory");
    }
    __device__ static void end() {
        if (wg() == 0) asm volatile("bar.sync %0, %1;\n" ::"r"(FAST_TURN_BAR), "n"(256) : "memory");
    }
};
/* fastGroupSync that also returns whether pred is non-zero in any thread
 * of the group (__syncthreads_or with one group). */
template <int GROUPS>
__device__ __forceinline__ int fastGroupSyncOr(int pred) {
    if constexpr (GROUPS == 1) {
        return __syncthreads_or(pred);
    } else {
        int any;
        asm volatile(
            "{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n"
            " bar.red.or.pred q, %2, 128, p;\n selp.s32 %0, 1, 0, q;\n}\n"
            : "=r"(any)
            : "r"(pred), "r"(1 + (int)(threadIdx.x >> 7))
            : "memory");
        return any;
    }
}

/* Asks L2 to fetch the 128-byte line holding p (no register, no wait):
 * for rows an epilogue will read long after the kernel starts. */
__device__ __forceinline__ void fastPrefetchL2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
/* 16-byte async copy; src == NULL zero-fills the destination (masked rows
 * must hold finite values: 0 * NaN would poison the P.V product). */
__device__ __forceinline__ void fastCpAsync16(void *dst, const void *src) {
    uint32_t d = fastSmemAddr(dst);
    if (src) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
    } else {
        *(uint4 *)dst = make_uint4(0, 0, 0, 0);
    }
}
/* 16-byte async copy to shared address dst of which the first `bytes` (16
 * or 0) come from src and the rest are zero: bytes == 0 zero-fills without
 * reading src, so src may be NULL then. */
__device__ __forceinline__ void fastCpAsync16Fill(uint32_t dst, const void *src, uint32_t bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
/* 16-byte async copy through L1 (.ca): for rows that several warps of an SM
 * read (the selected branch's forced blocks); src == NULL zero-fills. */
__device__ __forceinline__ void fastCpAsync16L1(void *dst, const void *src) {
    uint32_t d = fastSmemAddr(dst);
    if (src) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
    } else {
        *(uint4 *)dst = make_uint4(0, 0, 0, 0);
    }
}
/* 4-byte async copy (metadata: lse, deltas, gates, token indices); src ==
 * NULL stores 0 instead. */
__device__ __forceinline__ void fastCpAsync4(void *dst, const void *src) {
    if (src) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(fastSmemAddr(dst)),
                     "l"(src));
    } else {
        *(uint32_t *)dst = 0u;
    }
}
__device__ __forceinline__ void fastCpCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void fastCpWait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* The row of a ROWS-row tile this thread copies in fastLoadTile and
 * fastLoadTileSw (THREADS / ROWS threads share a row): the same row in every
 * tile, so a caller may form per-row values (token slot, head) once. */
template <int ROWS, int THREADS>
__device__ __forceinline__ int fastTileRowOf() {
    return (int)threadIdx.x / (THREADS / ROWS);
}

/* Loads ROWS rows of D bf16 into dst[ROWS][D + 8]; rowPtr(r) gives the
 * global row or NULL for a masked row (zero-filled). All THREADS threads of
 * the CTA call it; THREADS / ROWS of them share a row, so each thread forms
 * its row's address once (gathers such as the selected keys cost a
 * division each). */
template <int ROWS, int D, int THREADS = FAST_THREADS, class RowPtr>
__device__ __forceinline__ void fastLoadTile(bf16 *dst, RowPtr rowPtr) {
    static_assert(THREADS % ROWS == 0, "rows must divide the CTA");
    constexpr int CHUNKS = D / 8, LD = D + 8, TPR = THREADS / ROWS;
    const int r = fastTileRowOf<ROWS, THREADS>(), part = threadIdx.x % TPR;
    const bf16 *src = rowPtr(r);
    bf16 *row = dst + r * LD;
#pragma unroll
    for (int k = part; k < CHUNKS; k += TPR)
        fastCpAsync16(row + k * 8, src ? src + k * 8 : (const bf16 *)0);
}

__device__ __forceinline__ void fastLdsm4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                          const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(fastSmemAddr(p)));
}
__device__ __forceinline__ void fastLdsm4T(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                           const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(fastSmemAddr(p)));
}

/* c += a b on mma.sync m16n8k16 (mma_sync.cuh) with an A fragment a[4]:
 * bf16 operands (the attention's tiles) */
__device__ __forceinline__ void fastMma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mmaBf16(c, a[0], a[1], a[2], a[3], b0, b1);
}
/* fp16 operands: 11 significant bits for values in [0, 1] (probabilities,
 * overlap shares), where bf16 keeps 8 - the score pass's fold. */
__device__ __forceinline__ void fastMmaF16(float c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1) {
    mmaF16(c, a[0], a[1], a[2], a[3], b0, b1);
}

__device__ __forceinline__ uint32_t fastPack(float lo, float hi) { return packBf16(lo, hi); }

/* A fragment of rows [row0, row0+16), cols [k0, k0+16) of a row-major tile. */
__device__ __forceinline__ void fastLoadA(uint32_t a[4], const bf16 *tile, int ld, int row0,
                                          int k0) {
    int lane = threadIdx.x & 31;
    fastLdsm4(a[0], a[1], a[2], a[3], tile + (row0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
}

/* B fragments of two n-tiles (n0..n0+15) at k-step k0 when B[k][n] = Y[n][k]
 * (Y row-major, e.g. keys for Q.K^T): b[0],b[1] for n0, b[2],b[3] for n0+8. */
__device__ __forceinline__ void fastLoadBRows(uint32_t b[4], const bf16 *tile, int ld, int n0,
                                              int k0) {
    int lane = threadIdx.x & 31;
    fastLdsm4(b[0], b[1], b[2], b[3],
              tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}

/* B fragments of two n-tiles (n0..n0+15) at k-step k0 when B[k][n] = Z[k][n]
 * (Z row-major, e.g. values for P.V). */
__device__ __forceinline__ void fastLoadBCols(uint32_t b[4], const bf16 *tile, int ld, int k0,
                                              int n0) {
    int lane = threadIdx.x & 31;
    fastLdsm4T(b[0], b[1], b[2], b[3],
               tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}

/* The A fragment of k-step ks built from C accumulators c[2ks], c[2ks+1]. */
__device__ __forceinline__ void fastAFromC(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = fastPack(c0[0], c0[1]);
    a[1] = fastPack(c0[2], c0[3]);
    a[2] = fastPack(c1[0], c1[1]);
    a[3] = fastPack(c1[2], c1[3]);
}

/* The lse a forward saves, in natural-log units, from its running max m
 * (log2 units, scores scaled by log2 e) and the row's sum l of
 * exp2(s - m); -inf where no key was seen (l = 0). */
__device__ __forceinline__ float fastLse(float m, float lsum) {
    return lsum > 0.f ? (m + log2f(lsum)) * FAST_LN2 : -INFINITY;
}

/* 2^x as one SFU instruction (ex2.approx.ftz: relative error about 2^-22;
 * results below 2^-126 flush to 0, which a bf16 softmax term is anyway).
 * fastExp2() without fast-math wraps MUFU.EX2 in a range test and two
 * predicated multiplies: four instructions per score instead of one, in
 * loops whose non-tensor instructions are what the tensor cores wait on.
 * exp2(-inf) = 0, as the masked scores need. */
__device__ __forceinline__ float fastExp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float fastQuadMax(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float fastQuadSum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* The score half of an online-softmax step over a tile s of NT n-tiles
 * (NT * 8 keys; log2 domain, masked entries -inf) whose per-row-half
 * maxima over this thread's entries are mx: the running max m moves to
 * the new max, the running sum l is rescaled and grows by the tile, s
 * becomes P = exp2(s - m), and corr gets the factor the output of the
 * earlier tiles must be scaled by. A row that has seen nothing keeps
 * m = -inf and gets P = 0. Split from the rescale so that a wgmma loop can
 * run it while the previous tile's P.V is still in flight. */
template <int NT>
__device__ __forceinline__ void fastSoftmaxScores(float (&s)[NT][4], const float mx[2], float m[2],
                                                  float l[2], float corr[2]) {
    float muse[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mn = fmaxf(m[i], fastQuadMax(mx[i]));
        muse[i] = mn == -INFINITY ? 0.f : mn;
        corr[i] = fastExp2(m[i] - muse[i]);
        m[i] = mn;
        l[i] *= corr[i];
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = fastExp2(s[n][e] - muse[e >> 1]);
            s[n][e] = p;
            l[e >> 1] += p;
        }
    }
}
/* o (DV columns, C fragments) *= corr per row half. */
template <int DV>
__device__ __forceinline__ void fastRescaleRows(float (&o)[DV / 8][4], const float corr[2]) {
#pragma unroll
    for (int n = 0; n < DV / 8; n++) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
    }
}
/* One online-softmax step (fastSoftmaxScores, then the output rescale). */
template <int NT, int DV>
__device__ __forceinline__ void fastSoftmaxStep(float (&s)[NT][4], const float mx[2], float m[2],
                                                float l[2], float (&o)[DV / 8][4]) {
    float corr[2];
    fastSoftmaxScores<NT>(s, mx, m, l, corr);
    fastRescaleRows<DV>(o, corr);
}

/* acc[i] += A[a_row + 16i, +16) x [0, D) . Z[0, NT*8) x [0, D)^T for a
 * warp: its MT m-tiles of 16 rows of the row-major shared tile a (stride
 * lda) against NT * 8 rows of the shared tile z (stride ldz), both through
 * ldmatrix - the scores S = Q.K^T and dP = dO.V^T, or their transposes in
 * dK/dV. Every B fragment feeds MT products: on Hopper an ldmatrix.x4
 * (512 bytes, 4 cycles of shared-memory bandwidth) per two mma.sync is
 * the bound, so MT = 2 moves 1.5x fewer shared bytes per product. */
template <int MT, int NT, int D>
__device__ __forceinline__ void fastMmaAZtM(float (&acc)[MT][NT][4], const bf16 *a, int lda,
                                            int a_row, const bf16 *z, int ldz) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int i = 0; i < MT; i++) fastLoadA(af[i], a, lda, a_row + 16 * i, kk * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bb[4];
            fastLoadBRows(bb, z, ldz, np * 16, kk * 16);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                fastMma(acc[i][2 * np], af[i], bb[0], bb[1]);
                fastMma(acc[i][2 * np + 1], af[i], bb[2], bb[3]);
            }
        }
    }
}
template <int NT, int D>
__device__ __forceinline__ void fastMmaAZt(float (&acc)[NT][4], const bf16 *a, int lda, int a_row,
                                           const bf16 *z, int ldz) {
    fastMmaAZtM<1, NT, D>(*reinterpret_cast<float(*)[1][NT][4]>(&acc), a, lda, a_row, z, ldz);
}

/* acc += A.Z^T as fastMmaAZt, with the warp's 16 rows of A already in
 * registers (af: the q fragments a loop keeps across its key tiles). */
template <int NT, int D>
__device__ __forceinline__ void fastMmaFragZt(float (&acc)[NT][4], const uint32_t (&af)[D / 16][4],
                                              const bf16 *z, int ldz) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bb[4];
            fastLoadBRows(bb, z, ldz, np * 16, kk * 16);
            fastMma(acc[2 * np], af[kk], bb[0], bb[1]);
            fastMma(acc[2 * np + 1], af[kk], bb[2], bb[3]);
        }
    }
}

/* acc[i] += s[i] . Z[0, NT*8) x [0, D) for each of MT m-tiles: s the C
 * fragments of NT n-tiles over the tile's NT * 8 keys (rounded to bf16 as
 * the A operand), Z a row-major shared tile of those keys with row stride
 * ldz - o += P.V in a forward, dq += dS.K in a dQ pass. */
template <int MT, int NT, int D>
__device__ __forceinline__ void fastMmaPZM(float (&acc)[MT][D / 8][4], const float (&s)[MT][NT][4],
                                           const bf16 *z, int ldz) {
#pragma unroll
    for (int ks = 0; ks < NT / 2; ks++) {
        uint32_t a[MT][4];
#pragma unroll
        for (int i = 0; i < MT; i++) fastAFromC(a[i], s[i][2 * ks], s[i][2 * ks + 1]);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t bb[4];
            fastLoadBCols(bb, z, ldz, ks * 16, dp * 16);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                fastMma(acc[i][2 * dp], a[i], bb[0], bb[1]);
                fastMma(acc[i][2 * dp + 1], a[i], bb[2], bb[3]);
            }
        }
    }
}
template <int NT, int D>
__device__ __forceinline__ void fastMmaPZ(float (&acc)[D / 8][4], const float (&s)[NT][4],
                                          const bf16 *z, int ldz) {
    fastMmaPZM<1, NT, D>(*reinterpret_cast<float(*)[1][D / 8][4]>(&acc),
                         *reinterpret_cast<const float(*)[1][NT][4]>(&s), z, ldz);
}

/* The end of a flash forward for row i (grp + 8 i) of a warp's m-tile:
 * o / l to o_row in bf16 (this lane's columns) and, from lane quad 0, the
 * lse m + log l in natural-log units, -inf where no key was seen (o = 0
 * there). lsum is l summed over the quad (fastQuadSum, which every lane
 * must call, so before any per-row exit); m is in log2 units. */
template <int DV>
__device__ __forceinline__ void fastStoreOutRow(bf16 *o_row, float *lse, const float (&o)[DV / 8][4],
                                                int i, float m, float lsum, int quad) {
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
    for (int n = 0; n < DV / 8; n++)
        *(uint32_t *)(o_row + n * 8 + quad * 2) = fastPack(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    if (quad == 0) *lse = fastLse(m, lsum);
}

#endif
