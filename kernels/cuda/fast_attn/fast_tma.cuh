/* fast_tma.cuh - key/value tiles by the Tensor Memory Accelerator (TMA,
 * sm_90a) for the wgmma tile loops (tile_*.cuh), and the ring of
 * mbarriers that hands each tile from the one thread that issues its copies
 * to the warps that read it.
 *
 * Why: with cp.async every thread of the CTA formed addresses and issued
 * 16-byte copies for each key tile, and a CTA-wide barrier per tile made the
 * tile visible (the loads were a large share of the tile loops'
 * instructions, and the barrier the forward's top stall, holding its two
 * warpgroups in lockstep). A TMA copy is one instruction per 64-row panel,
 * lands in exactly the 128-byte swizzle wgmma reads (fast_wgmma.cuh: panel
 * p of a tile at p * ROWS * 128 bytes, chunk c of row r at c ^ (r & 7)),
 * zero-fills rows past the tensor's end, and completes an mbarrier when its
 * bytes have landed. Warps wait for the tile they need and release it when
 * their products are done; nothing waits for the whole CTA.
 *
 * Keys and values are [B][nkeys][G][D] bf16; a tensor map views one as
 * dims (D, G, nkeys, B) with a box of (64, 1, ROWS, 1): one panel of ROWS
 * keys of one group. Rows from nkeys on come back zero, like the zero-filled
 * rows of the cp.async loads; rows of the key range's last tile that lie
 * past the range but inside the tensor hold real (finite) keys, which the
 * tile loops mask as they always have.
 *
 * Internal to the fast kernels; the host helpers never synchronise. */
#ifndef NSA_FAST_TMA_CUH
#define NSA_FAST_TMA_CUH

#include <string.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include "fast_host.h"
#include "fast_wgmma.cuh"

/* A pair of tensor maps (keys, values) for one branch. Kernels take it as a
 * __grid_constant__ parameter: TMA reads the map from the parameter space. */
struct FastKvMaps {
    CUtensorMap k, v;
};

/* The driver call every map below makes: a tensor of `type` and `rank`
 * dims (dims[0] innermost; strides in bytes of dims 1..), boxes of box[],
 * 128-byte swizzle, no interleave, zeros out of bounds. Returns
 * cudaErrorInvalidValue when the driver refuses it or encode is NULL.
 * fastTmaEncodeBf16: the same for bf16, which all but the running dq are. */
static inline cudaError_t fastTmaEncodeOf(void *encode, CUtensorMap *map, CUtensorMapDataType type,
                                          const void *base, int rank, const cuuint64_t *dims,
                                          const cuuint64_t *strides, const cuuint32_t *box,
                                          CUtensorMapL2promotion promotion) {
    if (!encode) return cudaErrorInvalidValue;
    const cuuint32_t step[4] = {1, 1, 1, 1};
    CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)encode)(
        map, type, (cuuint32_t)rank, (void *)base, dims, strides, box, step,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t fastTmaEncodeBf16(void *encode, CUtensorMap *map, const bf16 *base,
                                            int rank, const cuuint64_t *dims,
                                            const cuuint64_t *strides, const cuuint32_t *box,
                                            CUtensorMapL2promotion promotion) {
    return fastTmaEncodeOf(encode, map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, rank, dims,
                           strides, box, promotion);
}

/* Encodes the map of one [B][nkeys][G][d] bf16 tensor for boxes of `rows`
 * keys x 64 channels, 128-byte swizzle. Returns cudaErrorInvalidValue when
 * the driver refuses the map (misaligned base, d not a multiple of 64) or
 * encode is NULL. Host only; no device work. */
static inline cudaError_t fastTmaEncodeKeys(void *encode, CUtensorMap *map, const bf16 *base,
                                            int B, int nkeys, int G, int d, int rows) {
    if (!encode || d % 64 != 0 || nkeys < 1) return cudaErrorInvalidValue;
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)G, (cuuint64_t)nkeys, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)d * 2, (cuuint64_t)G * d * 2,
                                   (cuuint64_t)nkeys * G * d * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1};
    return fastTmaEncodeBf16(encode, map, base, 4, dims, strides, box,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

/* The keys-only map of a pass that reads no values (the selection's
 * scores): maps->v is zeroed and must not be read. Errors as above. */
static inline cudaError_t fastTmaEncodeK(void *encode, FastKvMaps *maps, const bf16 *k, int B,
                                         int nkeys, int G, int dk, int rows) {
    memset(maps, 0, sizeof(*maps));
    return nkeys == 0 ? cudaSuccess : fastTmaEncodeKeys(encode, &maps->k, k, B, nkeys, G, dk, rows);
}

/* Both maps of a branch whose keys k [B][nkeys][G][dk] and values v
 * [B][nkeys][G][dv] are read in tiles of `rows` keys; errors as above.
 * With no keys (nkeys 0: the compressed branch below one block) no tile is
 * ever read: the maps are zeroed and cudaSuccess returned. */
static inline cudaError_t fastTmaEncodeKv(void *encode, FastKvMaps *maps, const bf16 *k,
                                          const bf16 *v, int B, int nkeys, int G, int dk, int dv,
                                          int rows) {
    if (nkeys == 0) {
        memset(maps, 0, sizeof(*maps));
        return cudaSuccess;
    }
    cudaError_t e = fastTmaEncodeKeys(encode, &maps->k, k, B, nkeys, G, dk, rows);
    return e != cudaSuccess ? e : fastTmaEncodeKeys(encode, &maps->v, v, B, nkeys, G, dv, rows);
}

/* The query-side rows of a dK/dV pass - q [B][S][H][dk] and dout
 * [B][S][H][dv] - as tensor maps viewing each as dims (d, H, S, B) with a
 * box of (64, hpg, tokens, 1): one 64-channel panel of `tokens` whole
 * tokens' hpg heads of one group, landing token-major (row = token slot *
 * hpg + head), the row order of the dK/dV stages. Tokens from S on come
 * back zero. */
struct FastRowMaps {
    CUtensorMap q, dout;
};

/* Encodes one such map over elements of `esize` bytes (type): boxes of a
 * 128-byte panel of channels (128 / esize), hpg heads and `tokens` tokens;
 * errors as fastTmaEncodeKeys (d a multiple of the panel, 1 <= hpg *
 * tokens <= 256). Host only. */
static inline cudaError_t fastTmaEncodeRowsOf(void *encode, CUtensorMap *map,
                                              CUtensorMapDataType type, int esize,
                                              const void *base, int B, int S, int H, int d,
                                              int hpg, int tokens) {
    const int panel = 128 / esize;
    if (!encode || d % panel != 0 || S < 1 || hpg < 1 || tokens < 1 || hpg * tokens > 256)
        return cudaErrorInvalidValue;
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)H, (cuuint64_t)S, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)d * esize, (cuuint64_t)H * d * esize,
                                   (cuuint64_t)S * H * d * esize};
    const cuuint32_t box[4] = {(cuuint32_t)panel, (cuuint32_t)hpg, (cuuint32_t)tokens, 1};
    return fastTmaEncodeOf(encode, map, type, base, 4, dims, strides, box,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}
/* bf16 rows (q, dout): 64-channel panels */
static inline cudaError_t fastTmaEncodeRows(void *encode, CUtensorMap *map, const bf16 *base,
                                            int B, int S, int H, int d, int hpg, int tokens) {
    return fastTmaEncodeRowsOf(encode, map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, B, S, H, d,
                               hpg, tokens);
}
/* Both row maps of a dK/dV pass whose stages take `tokens` tokens per box
 * (all of a stage's tokens when they are consecutive, 1 when each token
 * comes by its own copy). Errors as above. */
static inline cudaError_t fastTmaEncodeRowMaps(void *encode, FastRowMaps *maps, const bf16 *q,
                                               const bf16 *dout, int B, int S, int H, int dk,
                                               int dv, int hpg, int tokens) {
    cudaError_t e = fastTmaEncodeRows(encode, &maps->q, q, B, S, H, dk, hpg, tokens);
    return e != cudaSuccess ? e : fastTmaEncodeRows(encode, &maps->dout, dout, B, S, H, dv, hpg, tokens);
}

/* Encodes the map of a row-major [rows][d] bf16 matrix (d a multiple of
 * 64) for boxes of box_rows rows x 64 columns, 128-byte swizzle: the way
 * out of shared memory for rows staged as wgmma tiles. Errors as
 * fastTmaEncodeKeys. Host only. */
static inline cudaError_t fastTmaEncodeMatrix(void *encode, CUtensorMap *map, const bf16 *base,
                                              size_t rows, int d, int box_rows) {
    if (!encode || d % 64 != 0 || rows < 1 || box_rows < 1 || box_rows > 256)
        return cudaErrorInvalidValue;
    const cuuint64_t dims[2] = {(cuuint64_t)d, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)d * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    return fastTmaEncodeBf16(encode, map, base, 2, dims, strides, box,
                             CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

/* ---- mbarriers and the bulk tensor copy (PTX; sm_90) ---- */
#if FAST_HAVE_WGMMA
__device__ __forceinline__ void fastMbarInit(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(fastSmemAddr(bar)), "r"(count)
                 : "memory");
}
/* Makes barrier initialisation visible to the async proxy (the TMA unit
 * completes transactions on them); the initialising thread calls it once,
 * before the CTA barrier that publishes the barriers to the other threads. */
__device__ __forceinline__ void fastMbarInitFence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void fastMbarArrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(fastSmemAddr(bar)) : "memory");
}
/* One arrival that also announces `bytes` of transactions still to land. */
__device__ __forceinline__ void fastMbarArriveTx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     fastSmemAddr(bar)),
                 "r"(bytes)
                 : "memory");
}
/* Spins until the barrier's phase with this parity has completed. */
__device__ __forceinline__ void fastMbarWait(uint64_t *bar, uint32_t parity) {
    const uint32_t addr = fastSmemAddr(bar);
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (!done);
}
/* Stores the box of map at (c0, c1) from shared src (swizzled as the map
 * says) to global memory, marked evict-first in L2: rows written once and
 * read once, much later, by another kernel. Completes in this thread's
 * bulk group (fastBulkCommit, fastBulkWaitRead). */
__device__ __forceinline__ void fastTmaStore2(const CUtensorMap *map, const void *src, int c0,
                                              int c1) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint"
        " [%0, {%1, %2}], [%3], %4;\n" ::"l"((uint64_t)map),
        "r"(c0), "r"(c1), "r"(fastSmemAddr(src)), "l"(policy)
        : "memory");
}
__device__ __forceinline__ void fastBulkCommit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* Waits until this thread's committed bulk stores have read their shared
 * memory (the source may be overwritten then; the global writes may still
 * be in flight - the next kernel sees them). */
__device__ __forceinline__ void fastBulkWaitRead() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/* An arrival on bar once every cp.async this thread issued so far has
 * landed; the barrier's count must include it (.noinc). */
__device__ __forceinline__ void fastMbarArriveCpAsync(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(fastSmemAddr(bar))
                 : "memory");
}
/* A 4-byte cp.async of src, or of zeros when src is NULL - always an async
 * copy, so that fastMbarArriveCpAsync covers the zeros too (a plain store
 * is not ordered with that arrival). */
__device__ __forceinline__ void fastCpAsync4Or0(void *dst, const void *src, const void *any) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(fastSmemAddr(dst)),
                 "l"(src ? src : any), "r"(src ? 4 : 0));
}
/* The box of map at (c0, c1, c2, c3) into shared dst (1024-byte aligned),
 * its bytes completing on bar. */
__device__ __forceinline__ void fastTmaLoad4(void *dst, const CUtensorMap *map, int c0, int c1,
                                             int c2, int c3, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(fastSmemAddr(dst)),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(fastSmemAddr(bar))
        : "memory");
}
/* bytes (a multiple of 16, both addresses 16-byte aligned) of shared src
 * added element-wise as fp32 to global dst in L2 (add) or copied there.
 * Completes in this thread's bulk group (fastBulkCommit, then
 * fastBulkWaitRead before src is reused or the CTA ends). */
__device__ __forceinline__ void fastBulkPutF32(float *dst, const float *src, int bytes, bool add) {
    if (add)
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                     ::"l"(dst), "r"(fastSmemAddr(src)), "r"(bytes)
                     : "memory");
    else
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
                     "r"(fastSmemAddr(src)), "r"(bytes)
                     : "memory");
}
#else
__device__ __forceinline__ void fastBulkPutF32(float *, const float *, int, bool) { __trap(); }
__device__ __forceinline__ void fastTmaStore2(const CUtensorMap *, const void *, int, int) { __trap(); }
__device__ __forceinline__ void fastBulkCommit() { __trap(); }
__device__ __forceinline__ void fastBulkWaitRead() { __trap(); }
__device__ __forceinline__ void fastMbarArriveCpAsync(uint64_t *) { __trap(); }
__device__ __forceinline__ void fastCpAsync4Or0(void *, const void *, const void *) { __trap(); }
__device__ __forceinline__ void fastMbarInit(uint64_t *, int) { __trap(); }
__device__ __forceinline__ void fastMbarInitFence() { __trap(); }
__device__ __forceinline__ void fastMbarArrive(uint64_t *) { __trap(); }
__device__ __forceinline__ void fastMbarArriveTx(uint64_t *, uint32_t) { __trap(); }
__device__ __forceinline__ void fastMbarWait(uint64_t *, uint32_t) { __trap(); }
__device__ __forceinline__ void fastTmaLoad4(void *, const CUtensorMap *, int, int, int, int,
                                             uint64_t *) {
    __trap();
}
#endif

/* Tiles the producing thread of a ring issues ahead of the one its warps
 * compute: tile it + AHEAD is issued at iteration it (the prologue issues
 * tiles 0 .. AHEAD). Its stage must have been released, so the producer
 * waits for every warp to have released tile it + AHEAD - STAGES. A loop
 * whose warps hold HOLD tiles at once (the pipelined loops release tile
 * it-1 at the end of iteration it: two) takes AHEAD <= STAGES - HOLD, else
 * the producer would wait for itself.
 * Two ahead at four stages: FAST_RING_AHEAD. */

/* The ring of STAGES key/value stages of KT keys (DV = 0: keys only). Tile j of a kernel's
 * loop (counted across all its branches) lives in stage j % STAGES; its
 * use n = j / STAGES of the stage completes full[s] with parity n & 1 when
 * its bytes land, and empty[s] with parity n & 1 when all `consumers`
 * warps have released it. One thread produces (issues the copies, after
 * the stage's previous tile was released); every warp of the CTA waits for
 * and releases every tile. Shared layout: K stages, V stages, then 2 *
 * STAGES barriers (fastKvRingBytes). */
template <int KT, int DK, int DV, int STAGES, int HOLD = 2>
struct FastKvRing {
    bf16 *sK, *sV;
    uint64_t *full, *empty;

    static constexpr uint32_t TILE_BYTES = (uint32_t)KT * (DK + DV) * 2;
    static constexpr int AHEAD =
        FAST_RING_AHEAD < STAGES - HOLD + 1 ? FAST_RING_AHEAD : STAGES - HOLD;
    static_assert(AHEAD >= 1, "a ring needs a stage to load into while its warps compute");
    static constexpr int BYTES = STAGES * KT * (DK + DV) * 2 + 2 * STAGES * 8;

    /* The ring at sK (1024-byte aligned). */
    __device__ static FastKvRing at(bf16 *sK) {
        FastKvRing r;
        r.sK = sK;
        r.sV = sK + STAGES * KT * DK;
        r.full = (uint64_t *)(r.sV + STAGES * KT * DV);
        r.empty = r.full + STAGES;
        return r;
    }
    /* One thread, before the CTA barrier that publishes the ring. */
    __device__ void init(int consumers) const {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            fastMbarInit(&full[s], 1);
            fastMbarInit(&empty[s], consumers);
        }
        fastMbarInitFence();
    }
    __device__ const bf16 *k(int j) const { return sK + (j % STAGES) * KT * DK; }
    __device__ const bf16 *v(int j) const { return sV + (j % STAGES) * KT * DV; }
    /* The producing thread: keys [u0, u0 + KT) of (b, g) as tile j. */
    __device__ void produce(const FastKvMaps &maps, int j, int b, int g, int u0) const {
        const int s = j % STAGES;
        if (j >= STAGES) fastMbarWait(&empty[s], (uint32_t)(j / STAGES + 1) & 1u);
        fastMbarArriveTx(&full[s], TILE_BYTES);
        bf16 *dk = sK + s * KT * DK, *dv = sV + s * KT * DV;
#pragma unroll
        for (int p = 0; p < DK / 64; p++)
            fastTmaLoad4(dk + p * KT * 64, &maps.k, p * 64, g, u0, b, &full[s]);
#pragma unroll
        for (int p = 0; p < DV / 64; p++)
            fastTmaLoad4(dv + p * KT * 64, &maps.v, p * 64, g, u0, b, &full[s]);
    }
    /* Every thread that reads tile j, before its first product on it; the
     * warp leaves converged (the next wgmma is .sync.aligned). */
    __device__ void wait(int j) const {
        fastMbarWait(&full[j % STAGES], (uint32_t)(j / STAGES) & 1u);
        __syncwarp();
    }
    /* Every warp, once, after its last product on tile j has completed. */
    __device__ void release(int j) const {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) fastMbarArrive(&empty[j % STAGES]);
    }
};

/* Stages of a query-tile kernel's ring: four where CTAS CTAs of
 * `fixed_bytes` (the query-side tiles) plus the ring fit an SM's 228 KB
 * (each CTA also costs 1 KB of reserve and 1 KB of alignment slack), else
 * three. Four stages let a warp run a tile ahead of the producer's wait. */
template <int KT, int DK, int DV>
constexpr int fastRingStages(int fixed_bytes, int ctas) {
    return ctas * (fixed_bytes + FastKvRing<KT, DK, DV, 4>::BYTES + 2048) <= 233472 ? 4 : 3;
}

#endif
