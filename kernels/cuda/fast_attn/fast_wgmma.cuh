/* fast_wgmma.cuh - Hopper warpgroup MMA (wgmma, sm_90a) for the flash tile
 * loops (tile_*.cuh): 128-byte-swizzled shared tiles, their matrix
 * descriptors, and the products a tile loop needs.
 *
 * Shared tile layout ("swizzled tile" below): ROWS rows of D bf16 as D / 64
 * panels of [ROWS][64] (128-byte rows), panel p at p * ROWS * 128 bytes;
 * 16-byte chunk c of row r sits at chunk c ^ (r & 7) - the 128-byte
 * swizzle the tensor cores read without bank conflicts. Each tile starts
 * on a 1024-byte boundary (the swizzle is a function of address bits).
 *
 * Descriptors (PTX "matrix descriptor", swizzle mode 1 = 128 B):
 *  - K-major operand (rows along M or N, the reduction dim k contiguous):
 *    start = row0's row in the panel of k, + (k % 64) * 2 bytes; stride
 *    byte offset (8-row groups) 1024; leading byte offset unused.
 *  - MN-major operand (B = Z with k along rows, n along the columns, as V
 *    in P.V): start = row k0; leading byte offset = the panel stride
 *    (next 64 columns of n), stride byte offset 1024 (next 8 rows of k).
 *
 * Accumulators: warp w of the warpgroup holds rows 16w..16w+15 of the
 * m64 tile, and float d[N/8][4] is laid out exactly as NT = N/8 mma.sync
 * C fragments (fast_common.cuh), so the softmax code is shared; the A
 * operand from registers is an mma.sync A fragment (fastAFromC).
 *
 * Ordering: tiles written by cp.async or plain stores are made visible to
 * the tensor cores' async proxy with fastWgProxyFence before the barrier.
 * On targets without wgmma these compile to a trap: the host only picks the
 * wgmma kernels on sm_90 (FastCtx.wgmma). Internal to the fast kernels. */
#ifndef NSA_FAST_WGMMA_CUH
#define NSA_FAST_WGMMA_CUH

#include "fast_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FAST_HAVE_WGMMA 1
#else
#define FAST_HAVE_WGMMA 0
#endif

/* Bytes of a swizzled tile of rows x d bf16. */
#define FAST_SW_BYTES(rows, d) ((rows) * (d) * 2)

/* Loads ROWS rows of D bf16 into a swizzled tile; rowPtr(r) gives the
 * global row or NULL (zero-filled). All THREADS threads call it; a thread
 * copies row fastTileRowOf<ROWS, THREADS>() only, the same row in every
 * tile, so callers may form per-row values once. A row without a source is
 * zero-filled by the copy unit (src-size 0; nothing is read), not by a
 * branch and a store: the per-chunk branches and address arithmetic had
 * been a sixth of the flash loops' instructions. */
template <int ROWS, int D, int THREADS, class RowPtr>
__device__ __forceinline__ void fastLoadTileSw(bf16 *dst, RowPtr rowPtr) {
    static_assert(THREADS % ROWS == 0 && ROWS % 8 == 0 && D % 64 == 0, "tile shape");
    constexpr int CHUNKS = D / 8, TPR = THREADS / ROWS;
    const int r = fastTileRowOf<ROWS, THREADS>(), part = threadIdx.x % TPR;
    const bf16 *src = rowPtr(r);
    const uint32_t bytes = src ? 16u : 0u;
    const char *from = (const char *)src;
    const uint32_t row = fastSmemAddr(dst) + r * 128;
#pragma unroll
    for (int k = part; k < CHUNKS; k += TPR)
        fastCpAsync16Fill(row + (k >> 3) * (ROWS * 128) + (((k & 7) ^ (r & 7)) << 4), from + k * 16,
                          bytes);
}

/* Makes this thread's generic-proxy shared stores (cp.async landed, zero
 * fills) visible to wgmma; call after the cp.async wait, before the barrier. */
__device__ __forceinline__ void fastWgProxyFence() {
#if FAST_HAVE_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* A descriptor as two words. lo: the start address in 16-byte units (bits
 * 0-13) and the leading byte offset (bits 16-29); hi: the stride byte
 * offset (bits 32-45) and the 128-byte swizzle (bits 62-63). The issue
 * loops below form lo once per tile and add each k-step's offset to it as
 * a constant: a shared address is below 2^18 bytes, so the address field
 * cannot carry into the offset field. Formed per product from a pointer
 * (convert, mask, shift, or) the descriptors had cost about 16
 * instructions per wgmma - a fifth of the score pass's instructions. */
__device__ __forceinline__ uint32_t fastWgLo(const void *smem, uint32_t lbo) {
    return (fastSmemAddr(smem) >> 4) | (((lbo >> 4) & 0x3FFF) << 16);
}
__device__ __forceinline__ uint64_t fastWgDescOf(uint32_t lo) {
    return ((uint64_t)((1024 >> 4) | (1u << 30)) << 32) | lo; /* stride 1024 B, 128-byte swizzle */
}
/* A K-major tile's lo word at row row0 (of `rows` rows), k = 0; column k0
 * (a multiple of 16) adds fastWgKOff(rows, k0). */
__device__ __forceinline__ uint32_t fastWgLoK(const bf16 *tile, int row0) {
    return fastWgLo(tile + row0 * 64, 16);
}
__device__ __forceinline__ constexpr uint32_t fastWgKOff(int rows, int k0) {
    return (uint32_t)((k0 >> 6) * rows * 8 + (k0 & 63) / 8);
}
/* An MN-major tile (`rows` rows read as B[k][n], k = rows): lo word at k =
 * 0; row k0 (a multiple of 8) adds fastWgMNOff(k0). */
__device__ __forceinline__ uint32_t fastWgLoMN(const bf16 *tile, int rows) {
    return fastWgLo(tile, (uint32_t)rows * 128);
}
__device__ __forceinline__ constexpr uint32_t fastWgMNOff(int k0) { return (uint32_t)k0 * 8; }

__device__ __forceinline__ void fastWgArrive() {
#if FAST_HAVE_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fastWgCommit() {
#if FAST_HAVE_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void fastWgWait() {
#if FAST_HAVE_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Pins accumulator registers in place around the asynchronous products so
 * the compiler neither reads them before the wait nor moves writes past an
 * issue. */
template <int N>
__device__ __forceinline__ void fastWgFenceAcc(float (&d)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}

/* Runs the products issue() enqueues as one group and waits for them:
 * the accumulators accs are pinned before the arrive (they may hold values
 * plain code wrote) and after the wait. For a loop that keeps products in
 * flight, use the pieces (fastWgArrive ... fastWgWait) instead. */
template <class Issue, class... Acc>
__device__ __forceinline__ void fastWgRun(Issue issue, Acc &...accs) {
    (fastWgFenceAcc(accs), ...);
    fastWgArrive();
    issue();
    fastWgCommit();
    fastWgWait<0>();
    (fastWgFenceAcc(accs), ...);
}

#define FAST_WG_ACC4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#if FAST_HAVE_WGMMA
/* d (+)= A . B, A and B from shared memory (K-major), m64n32k16 */
__device__ __forceinline__ void fastWgSS(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b,
                                          int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
        "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : FAST_WG_ACC4(0), FAST_WG_ACC4(1), FAST_WG_ACC4(2), FAST_WG_ACC4(3)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
/* d (+)= A . B, A and B from shared memory (K-major), m64n64k16 */
__device__ __forceinline__ void fastWgSS(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                          int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : FAST_WG_ACC4(0), FAST_WG_ACC4(1), FAST_WG_ACC4(2), FAST_WG_ACC4(3),
          FAST_WG_ACC4(4), FAST_WG_ACC4(5), FAST_WG_ACC4(6), FAST_WG_ACC4(7)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
/* d (+)= A . B, A from shared memory (K-major), B from shared memory
 * (MN-major), m64n64k16: dq = dS.K in the fused selected backward, where dS
 * went through shared memory (fastStoreAT) */
__device__ __forceinline__ void fastWgSSt(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                          int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, %32, %33, p, 1, 1, 0, 1;\n}\n"
        : FAST_WG_ACC4(0), FAST_WG_ACC4(1), FAST_WG_ACC4(2), FAST_WG_ACC4(3),
          FAST_WG_ACC4(4), FAST_WG_ACC4(5), FAST_WG_ACC4(6), FAST_WG_ACC4(7)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
/* Stores an mma.sync A fragment a (16 x 16: rows m, columns k) of a warp
 * transposed into a swizzled tile of `rows` rows: element (m, k) goes to
 * row k0 + k, column m0 + m (stmatrix .trans, one 16-byte row per lane
 * and matrix). Call fastWgProxyFence and a barrier before wgmma reads it. */
__device__ __forceinline__ void fastStoreAT(bf16 *tile, int rows, const uint32_t (&a)[4], int m0,
                                            int k0) {
    /* lane l addresses row j = l % 8 of matrix i = l / 8: a[0] is (m 0-7,
     * k 0-7), a[1] (m 8-15, k 0-7), a[2] (m 0-7, k 8-15), a[3] (m 8-15, k 8-15) */
    const int lane = threadIdx.x & 31, i = lane >> 3;
    const int row = k0 + (i >> 1) * 8 + (lane & 7), col = m0 + (i & 1) * 8;
    char *at = (char *)tile + (col >> 6) * rows * 128 + row * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     fastSmemAddr(at)),
                 "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])
                 : "memory");
}
/* Stores four 8 x 8 bf16 matrices of a warp (stmatrix, not transposed):
 * register j of lane l holds row l / 4, columns 2 (l % 4) and + 1 of
 * matrix j - the C-fragment layout packed to bf16 - and lane l gives the
 * shared address of row l % 8 of matrix l / 8 (16 bytes). */
__device__ __forceinline__ void fastStoreMatrix4(void *row, uint32_t m0, uint32_t m1, uint32_t m2,
                                                 uint32_t m3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     fastSmemAddr(row)),
                 "r"(m0), "r"(m1), "r"(m2), "r"(m3)
                 : "memory");
}
/* d (+)= A . B, A from registers, B from shared memory (MN-major), m64n64k16 */
__device__ __forceinline__ void fastWgRS(float (&d)[8][4], const uint32_t (&a)[4],
                                           uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
        : FAST_WG_ACC4(0), FAST_WG_ACC4(1), FAST_WG_ACC4(2), FAST_WG_ACC4(3),
          FAST_WG_ACC4(4), FAST_WG_ACC4(5), FAST_WG_ACC4(6), FAST_WG_ACC4(7)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
/* d (+)= A . B, A from registers, B from shared memory (MN-major), m64n128k16 */
__device__ __forceinline__ void fastWgRS(float (&d)[16][4], const uint32_t (&a)[4],
                                           uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
        "}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
        : FAST_WG_ACC4(0), FAST_WG_ACC4(1), FAST_WG_ACC4(2), FAST_WG_ACC4(3),
          FAST_WG_ACC4(4), FAST_WG_ACC4(5), FAST_WG_ACC4(6), FAST_WG_ACC4(7),
          FAST_WG_ACC4(8), FAST_WG_ACC4(9), FAST_WG_ACC4(10), FAST_WG_ACC4(11),
          FAST_WG_ACC4(12), FAST_WG_ACC4(13), FAST_WG_ACC4(14), FAST_WG_ACC4(15)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
/* d (+)= A . B, A from registers, B from shared memory (MN-major), m64n192k16 */
__device__ __forceinline__ void fastWgRS(float (&d)[24][4], const uint32_t (&a)[4],
                                           uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
        "}, {%96,%97,%98,%99}, %100, p, 1, 1, 1;\n}\n"
        : FAST_WG_ACC4(0), FAST_WG_ACC4(1), FAST_WG_ACC4(2), FAST_WG_ACC4(3),
          FAST_WG_ACC4(4), FAST_WG_ACC4(5), FAST_WG_ACC4(6), FAST_WG_ACC4(7),
          FAST_WG_ACC4(8), FAST_WG_ACC4(9), FAST_WG_ACC4(10), FAST_WG_ACC4(11),
          FAST_WG_ACC4(12), FAST_WG_ACC4(13), FAST_WG_ACC4(14), FAST_WG_ACC4(15),
          FAST_WG_ACC4(16), FAST_WG_ACC4(17), FAST_WG_ACC4(18), FAST_WG_ACC4(19),
          FAST_WG_ACC4(20), FAST_WG_ACC4(21), FAST_WG_ACC4(22), FAST_WG_ACC4(23)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
#else
template <int NT>
__device__ __forceinline__ void fastWgSS(float (&d)[NT][4], uint64_t, uint64_t, int) {
    __trap();
}
template <int NT>
__device__ __forceinline__ void fastWgRS(float (&d)[NT][4], const uint32_t (&)[4], uint64_t, int) {
    __trap();
}
__device__ __forceinline__ void fastWgSSt(float (&)[8][4], uint64_t, uint64_t, int) { __trap(); }
__device__ __forceinline__ void fastStoreAT(bf16 *, int, const uint32_t (&)[4], int, int) { __trap(); }
__device__ __forceinline__ void fastStoreMatrix4(void *, uint32_t, uint32_t, uint32_t, uint32_t) {
    __trap();
}
#endif

/* Stages a warp's 16 rows (row0 ..) x 64 columns (col0, a multiple of 64)
 * of a C-fragment tile v, row half i scaled by scale_i, as bf16 into a tile
 * of ROWS rows laid out as the swizzled q tiles (64-column panels of ROWS
 * rows of 128 bytes): element (r, col) at panel col / 64, row r, 16-byte
 * chunk (col % 64 / 8) ^ (r % 8), so that each stmatrix touches 32
 * distinct banks - four stmatrix, each two n-tiles of both row halves, in
 * place of 16 4-byte stores and their address arithmetic. The warp then
 * moves whole 16-byte chunks (after a __syncwarp): rows written as 128-byte
 * lines where the fragments' 4-byte stores wrote each 32-byte sector in
 * two halves. */
template <int ROWS>
__device__ __forceinline__ void fastStagePut64(bf16 *stage, int row0, int col0,
                                               const float (&v)[8][4], float scale0, float scale1) {
    const int lane = threadIdx.x & 31, m = lane >> 3;
    const int r = row0 + (m & 1) * 8 + (lane & 7); /* this lane's row of matrix m */
    char *row = (char *)stage + (col0 >> 6) * (ROWS * 128) + r * 128;
#pragma unroll
    for (int n = 0; n < 8; n += 2)
        fastStoreMatrix4(row + (((n + (m >> 1)) ^ (r & 7)) << 4),
                         fastPack(v[n][0] * scale0, v[n][1] * scale0),
                         fastPack(v[n][2] * scale1, v[n][3] * scale1),
                         fastPack(v[n + 1][0] * scale0, v[n + 1][1] * scale0),
                         fastPack(v[n + 1][2] * scale1, v[n + 1][3] * scale1));
}
/* 16-byte chunk k (columns 8k .. 8k + 7) of row r of a tile staged by
 * fastStagePut64. */
template <int ROWS>
__device__ __forceinline__ uint4 fastStageChunk(const bf16 *stage, int r, int k) {
    const int chunk = (k & 7) ^ (r & 7);
    return *(const uint4 *)((const char *)stage + (k >> 3) * (ROWS * 128) + r * 128 + chunk * 16);
}
/* The 64 columns from n-tile 8h of a C-fragment tile of more columns. */
template <int NT>
__device__ __forceinline__ const float (&fastPanel64(const float (&v)[NT][4], int h))[8][4] {
    return *reinterpret_cast<const float(*)[8][4]>(&v[8 * h]);
}
#undef FAST_WG_ACC4

/* Issues acc (64 x NT*8) = A[a_row0, +64) . Z[z_row0, +NT*8)^T over D
 * columns, both swizzled tiles read K-major (a_rows, z_rows their row
 * counts): the scores S = Q.K^T and dP = dO.V^T, or S^T = K.Q^T in dK/dV.
 * The caller brackets the issues with fastWgArrive / fastWgCommit and
 * waits before reading acc. */
template <int NT, int D>
__device__ __forceinline__ void fastWgIssueAZt(float (&acc)[NT][4], const bf16 *a, int a_rows,
                                               int a_row0, const bf16 *z, int z_rows, int z_row0) {
    const uint32_t a_lo = fastWgLoK(a, a_row0), z_lo = fastWgLoK(z, z_row0);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        fastWgSS(acc, fastWgDescOf(a_lo + fastWgKOff(a_rows, kk * 16)),
                 fastWgDescOf(z_lo + fastWgKOff(z_rows, kk * 16)), kk > 0);
}

/* The register A operands of P . Z over NT * 8 keys: P the C fragments s
 * of NT n-tiles rounded to bf16, one mma.sync A fragment per 16 keys.
 * Built before fastWgArrive: registers written between two issues would
 * make the compiler insert a warpgroup arrive of its own (C7519). */
template <int NT>
__device__ __forceinline__ void fastWgAFromC(uint32_t (&a)[NT / 2][4], const float (&s)[NT][4]) {
#pragma unroll
    for (int ks = 0; ks < NT / 2; ks++) fastAFromC(a[ks], s[2 * ks], s[2 * ks + 1]);
}

/* Issues acc (64 x D) += P . Z[z_row0, +NT*8) x [0, D): P from fastWgAFromC,
 * Z a swizzled tile of z_rows rows read MN-major - o += P.V, dq += dS.K,
 * and in dK/dV dv += P^T.dO, dk += dS^T.Q. */
template <int NT, int D>
__device__ __forceinline__ void fastWgIssuePZ(float (&acc)[D / 8][4], const uint32_t (&a)[NT / 2][4],
                                              const bf16 *z, int z_rows, int z_row0) {
    const uint32_t z_lo = fastWgLoMN(z, z_rows) + fastWgMNOff(z_row0);
#pragma unroll
    for (int ks = 0; ks < NT / 2; ks++) fastWgRS(acc, a[ks], fastWgDescOf(z_lo + fastWgMNOff(16 * ks)), 1);
}

/* Issues acc (64 x 64) = A . Z[0, KD) x [0, 64): A a swizzled tile of
 * A_ROWS rows (its first 64) read K-major over KD columns (64-column
 * panels of A_ROWS rows), Z a swizzled tile of z_rows rows read MN-major
 * (its first 64 columns; pass z + h * z_rows * 64 for panel h) - dq =
 * dS.K in the fused selected backward (64 keys) and the compressed dK/dV
 * (128). */
template <int KD, int A_ROWS = 64>
__device__ __forceinline__ void fastWgIssueSZ(float (&acc)[8][4], const bf16 *a, const bf16 *z,
                                              int z_rows) {
    static_assert(KD % 16 == 0, "whole k-steps");
    const uint32_t a_lo = fastWgLoK(a, 0), z_lo = fastWgLoMN(z, z_rows);
#pragma unroll
    for (int kk = 0; kk < KD / 16; kk++)
        fastWgSSt(acc, fastWgDescOf(a_lo + fastWgKOff(A_ROWS, kk * 16)),
                  fastWgDescOf(z_lo + fastWgMNOff(kk * 16)), kk > 0);
}

/* P . Z over a 64-row swizzled tile z of D columns, in 64-column parts: 32
 * accumulator registers at a time instead of D / 2. Each part is handed to
 * store(h, acc) (columns 64h .. 64h + 63, C-fragment layout) once done -
 * for kernels that write their result straight out and must stay at two
 * CTAs per SM. */
template <int D, class Store>
__device__ __forceinline__ void fastWgPZParts(const uint32_t (&a)[4][4], const bf16 *z, Store store) {
#pragma unroll
    for (int h = 0; h < D / 64; h++) {
        float acc[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
        fastWgRun([&] { fastWgIssuePZ<8, 64>(acc, a, z + h * 64 * 64, 64, 0); }, acc);
        store(h, acc);
    }
}

#endif
