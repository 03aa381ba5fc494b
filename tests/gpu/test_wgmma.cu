/* test_wgmma.cu - checks the warpgroup MMA building blocks of
 * kernels/cuda/fast_attn/fast_wgmma.cuh on an sm_90 GPU against a CPU product, at
 * every shape the tile loops use, before any attention kernel relies on
 * them: the swizzled tile load, the K-major and MN-major descriptors (with
 * row offsets inside a tile), the shared x shared products (scores), the
 * register x shared products (P.V), and dS.K through a transposed
 * shared-memory store (the fused selected backward), and the TMA ring of
 * fast_tma.cuh (a key/value tile by TMA must equal, byte for byte, the
 * same tile by cp.async, rows past the tensor's end zero; so must a dK/dV
 * row stage of whole tokens, as one box or a box per token). Inputs are fresh
 * random bf16 values, outputs are poisoned with NaN first; a case passes
 * when its largest error is within 1e-5 of the largest |reference| (fp32
 * accumulation of exact bf16 products) and nothing is NaN. On a mismatch
 * it prints the first wrong entries, so a layout error shows its pattern.
 *
 *   test_wgmma            prints one TAP line per case, then `N passed, N failed` */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/fast_attn/fast_tma.cuh"

#define CHECK(call)                                                                     \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                            \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* Writes a warpgroup's m64 x NT*8 accumulator to out[64][NT*8]. */
template <int NT>
__device__ void storeAcc(float *out, const float (&acc)[NT][4]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = warp * 16 + (lane >> 2), col = (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        out[row * NT * 8 + n * 8 + col] = acc[n][0];
        out[row * NT * 8 + n * 8 + col + 1] = acc[n][1];
        out[(row + 8) * NT * 8 + n * 8 + col] = acc[n][2];
        out[(row + 8) * NT * 8 + n * 8 + col + 1] = acc[n][3];
    }
}

/* out[64][NT*8] = A[a_row0, +64) . Z[z_row0, +NT*8)^T over D; A has A_ROWS
 * rows, Z Z_ROWS, both row-major bf16 in global memory. One warpgroup. */
template <int NT, int D, int A_ROWS, int Z_ROWS>
__global__ void scoresKernel(float *out, const bf16 *a, const bf16 *z, int a_row0, int z_row0) {
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t pad = (1024u - (fastSmemAddr(smem) & 1023u)) & 1023u;
    bf16 *sA = (bf16 *)(smem + pad), *sZ = sA + A_ROWS * D;
    fastLoadTileSw<A_ROWS, D, 128>(sA, [&](int r) { return a + (size_t)r * D; });
    fastLoadTileSw<Z_ROWS, D, 128>(sZ, [&](int r) { return z + (size_t)r * D; });
    fastCpCommit();
    fastCpWait<0>();
    fastWgProxyFence();
    __syncthreads();
    float acc[NT][4];
    fastWgRun([&] { fastWgIssueAZt<NT, D>(acc, sA, A_ROWS, a_row0, sZ, Z_ROWS, z_row0); }, acc);
    storeAcc<NT>(out, acc);
}

/* out[64][D] = bf16(P) . Z[z_row0, +NT*8) x [0, D): P [64][NT*8] fp32 in
 * global memory, handed to the product as C fragments; Z has Z_ROWS rows. */
template <int NT, int D, int Z_ROWS>
__global__ void pvKernel(float *out, const float *p, const bf16 *z, int z_row0) {
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t pad = (1024u - (fastSmemAddr(smem) & 1023u)) & 1023u;
    bf16 *sZ = (bf16 *)(smem + pad);
    fastLoadTileSw<Z_ROWS, D, 128>(sZ, [&](int r) { return z + (size_t)r * D; });
    fastCpCommit();
    fastCpWait<0>();
    fastWgProxyFence();
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = warp * 16 + (lane >> 2), col = (lane & 3) * 2;
    float s[NT][4], acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < NT; n++) {
        s[n][0] = p[row * NT * 8 + n * 8 + col];
        s[n][1] = p[row * NT * 8 + n * 8 + col + 1];
        s[n][2] = p[(row + 8) * NT * 8 + n * 8 + col];
        s[n][3] = p[(row + 8) * NT * 8 + n * 8 + col + 1];
    }
#pragma unroll
    for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    uint32_t af[NT / 2][4];
    fastWgAFromC<NT>(af, s);
    fastWgRun([&] { fastWgIssuePZ<NT, D>(acc, af, sZ, Z_ROWS, z_row0); }, acc);
    storeAcc<D / 8>(out, acc);
}

/* out[64][D] = bf16(T)^T . Z[0, 64) x [0, D) through shared memory, as the
 * fused selected backward forms dq = dS.K: T [64 keys][64 rows] fp32 in
 * global memory, handed over as C fragments of a warpgroup (keys x rows),
 * in halves of 16 * KS rows; each half's A fragments are stored transposed
 * (fastStoreAT) into a 64 x 64 tile, then read K-major against Z MN-major
 * (fastWgIssueSZ), 64 columns at a time. Z has 64 rows. */
template <int KS, int D>
__global__ void dsKernel(float *out, const float *t, const bf16 *z) {
    extern __shared__ __align__(16) unsigned char smem[];
    const uint32_t pad = (1024u - (fastSmemAddr(smem) & 1023u)) & 1023u;
    bf16 *sZ = (bf16 *)(smem + pad), *sT = sZ + 64 * D;
    fastLoadTileSw<64, D, 128>(sZ, [&](int r) { return z + (size_t)r * D; });
    fastCpCommit();
    fastCpWait<0>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int key = warp * 16 + (lane >> 2), col = (lane & 3) * 2;
    constexpr int RH = 16 * KS, NTH = 2 * KS;
    for (int half = 0; half < 64 / RH; half++) {
        float s[NTH][4];
#pragma unroll
        for (int n = 0; n < NTH; n++) {
            const int r = half * RH + n * 8 + col;
            s[n][0] = t[key * 64 + r];
            s[n][1] = t[key * 64 + r + 1];
            s[n][2] = t[(key + 8) * 64 + r];
            s[n][3] = t[(key + 8) * 64 + r + 1];
        }
        uint32_t a[KS][4];
        fastWgAFromC<NTH>(a, s);
#pragma unroll
        for (int ks = 0; ks < KS; ks++) fastStoreAT(sT, 64, a[ks], warp * 16, half * RH + 16 * ks);
    }
    fastWgProxyFence();
    __syncthreads();
    const int row = warp * 16 + (lane >> 2);
    for (int h = 0; h < D / 64; h++) {
        float acc[8][4];
        fastWgRun([&] { fastWgIssueSZ<64>(acc, sT, sZ + h * 64 * 64, 64); }, acc);
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const int c = h * 64 + n * 8 + col;
            out[row * D + c] = acc[n][0];
            out[row * D + c + 1] = acc[n][1];
            out[(row + 8) * D + c] = acc[n][2];
            out[(row + 8) * D + c + 1] = acc[n][3];
        }
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}
static float bf16Round(float x) { return __bfloat162float(__float2bfloat16(x)); }

static int passed = 0, failed = 0;

/* Compares got with want ([rows][cols]); prints the TAP line. */
static void verdict(const char *name, const float *got, const float *want, int rows, int cols) {
    double max_ref = 0, max_err = 0;
    int nan = 0, shown = 0;
    for (int i = 0; i < rows * cols; i++) max_ref = fmax(max_ref, fabs(want[i]));
    for (int i = 0; i < rows * cols; i++) {
        if (isnan(got[i])) nan++;
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= 1e-5 * max_ref) && shown < 6) {
            fprintf(stderr, "  %s: [%d][%d] got %g want %g\n", name, i / cols, i % cols, got[i],
                    want[i]);
            shown++;
        }
        if (e > max_err || isnan(e)) max_err = isnan(e) ? INFINITY : e;
    }
    const int ok = nan == 0 && max_err <= 1e-5 * max_ref;
    printf("%s %d - %s: rel err %.2e, %d NaN\n", ok ? "ok" : "not ok", passed + failed + 1, name,
           max_ref > 0 ? max_err / max_ref : max_err, nan);
    ok ? passed++ : failed++;
}

template <int NT, int D, int A_ROWS, int Z_ROWS>
static void caseScores(int a_row0, int z_row0) {
    const int N = NT * 8;
    float *ha = (float *)malloc(sizeof(float) * A_ROWS * D), *hz = (float *)malloc(sizeof(float) * Z_ROWS * D);
    bf16 *ba = (bf16 *)malloc(sizeof(bf16) * A_ROWS * D), *bz = (bf16 *)malloc(sizeof(bf16) * Z_ROWS * D);
    for (int i = 0; i < A_ROWS * D; i++) ha[i] = bf16Round(uniform()), ba[i] = __float2bfloat16(ha[i]);
    for (int i = 0; i < Z_ROWS * D; i++) hz[i] = bf16Round(uniform()), bz[i] = __float2bfloat16(hz[i]);
    float *want = (float *)malloc(sizeof(float) * 64 * N), *got = (float *)malloc(sizeof(float) * 64 * N);
    for (int r = 0; r < 64; r++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < D; k++) acc += (double)ha[(a_row0 + r) * D + k] * hz[(z_row0 + n) * D + k];
            want[r * N + n] = (float)acc;
        }
    bf16 *da, *dz;
    float *dout;
    CHECK(cudaMalloc(&da, sizeof(bf16) * A_ROWS * D));
    CHECK(cudaMalloc(&dz, sizeof(bf16) * Z_ROWS * D));
    CHECK(cudaMalloc(&dout, sizeof(float) * 64 * N));
    CHECK(cudaMemcpy(da, ba, sizeof(bf16) * A_ROWS * D, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dz, bz, sizeof(bf16) * Z_ROWS * D, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0xff, sizeof(float) * 64 * N)); /* NaN poison */
    const int smem = (A_ROWS + Z_ROWS) * D * 2 + 1024;
    auto kernel = scoresKernel<NT, D, A_ROWS, Z_ROWS>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<1, 128, smem>>>(dout, da, dz, a_row0, z_row0);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(got, dout, sizeof(float) * 64 * N, cudaMemcpyDeviceToHost));
    char name[128];
    snprintf(name, sizeof(name), "scores m64n%dk16 D=%d A rows %d+64 of %d, Z rows %d+%d of %d", N, D,
             a_row0, A_ROWS, z_row0, N, Z_ROWS);
    verdict(name, got, want, 64, N);
    CHECK(cudaFree(da));
    CHECK(cudaFree(dz));
    CHECK(cudaFree(dout));
    free(ha), free(hz), free(ba), free(bz), free(want), free(got);
}

template <int NT, int D, int Z_ROWS>
static void casePV(int z_row0) {
    const int K = NT * 8;
    float *hp = (float *)malloc(sizeof(float) * 64 * K), *hz = (float *)malloc(sizeof(float) * Z_ROWS * D);
    bf16 *bz = (bf16 *)malloc(sizeof(bf16) * Z_ROWS * D);
    for (int i = 0; i < 64 * K; i++) hp[i] = uniform(); /* rounded on the device */
    for (int i = 0; i < Z_ROWS * D; i++) hz[i] = bf16Round(uniform()), bz[i] = __float2bfloat16(hz[i]);
    float *want = (float *)malloc(sizeof(float) * 64 * D), *got = (float *)malloc(sizeof(float) * 64 * D);
    for (int r = 0; r < 64; r++)
        for (int n = 0; n < D; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)bf16Round(hp[r * K + k]) * hz[(z_row0 + k) * D + n];
            want[r * D + n] = (float)acc;
        }
    float *dp, *dout;
    bf16 *dz;
    CHECK(cudaMalloc(&dp, sizeof(float) * 64 * K));
    CHECK(cudaMalloc(&dz, sizeof(bf16) * Z_ROWS * D));
    CHECK(cudaMalloc(&dout, sizeof(float) * 64 * D));
    CHECK(cudaMemcpy(dp, hp, sizeof(float) * 64 * K, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dz, bz, sizeof(bf16) * Z_ROWS * D, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0xff, sizeof(float) * 64 * D));
    const int smem = Z_ROWS * D * 2 + 1024;
    auto kernel = pvKernel<NT, D, Z_ROWS>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<1, 128, smem>>>(dout, dp, dz, z_row0);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(got, dout, sizeof(float) * 64 * D, cudaMemcpyDeviceToHost));
    char name[128];
    snprintf(name, sizeof(name), "P.V m64n%dk16 x %d, Z rows %d+%d of %d", D, NT / 2, z_row0, K, Z_ROWS);
    verdict(name, got, want, 64, D);
    CHECK(cudaFree(dp));
    CHECK(cudaFree(dz));
    CHECK(cudaFree(dout));
    free(hp), free(hz), free(bz), free(want), free(got);
}

template <int KS, int D>
static void caseDsK(void) {
    float *ht = (float *)malloc(sizeof(float) * 64 * 64), *hz = (float *)malloc(sizeof(float) * 64 * D);
    bf16 *bz = (bf16 *)malloc(sizeof(bf16) * 64 * D);
    for (int i = 0; i < 64 * 64; i++) ht[i] = uniform(); /* rounded on the device */
    for (int i = 0; i < 64 * D; i++) hz[i] = bf16Round(uniform()), bz[i] = __float2bfloat16(hz[i]);
    float *want = (float *)malloc(sizeof(float) * 64 * D), *got = (float *)malloc(sizeof(float) * 64 * D);
    for (int r = 0; r < 64; r++)
        for (int n = 0; n < D; n++) {
            double acc = 0;
            for (int k = 0; k < 64; k++) acc += (double)bf16Round(ht[k * 64 + r]) * hz[k * D + n];
            want[r * D + n] = (float)acc;
        }
    float *dt, *dout;
    bf16 *dz;
    CHECK(cudaMalloc(&dt, sizeof(float) * 64 * 64));
    CHECK(cudaMalloc(&dz, sizeof(bf16) * 64 * D));
    CHECK(cudaMalloc(&dout, sizeof(float) * 64 * D));
    CHECK(cudaMemcpy(dt, ht, sizeof(float) * 64 * 64, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dz, bz, sizeof(bf16) * 64 * D, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0xff, sizeof(float) * 64 * D));
    const int smem = 64 * D * 2 + 64 * 64 * 2 + 1024;
    auto kernel = dsKernel<KS, D>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<1, 128, smem>>>(dout, dt, dz);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(got, dout, sizeof(float) * 64 * D, cudaMemcpyDeviceToHost));
    char name[128];
    snprintf(name, sizeof(name), "dS.K: stmatrix.trans in %d-row halves, m64n64k16 SS (B MN-major), D %d",
             16 * KS, D);
    verdict(name, got, want, 64, D);
    CHECK(cudaFree(dt));
    CHECK(cudaFree(dz));
    CHECK(cudaFree(dout));
    free(ht), free(hz), free(bz), free(want), free(got);
}

/* Loads the key tile at u0 of group g, batch b of k, v [B][nkeys][G][D]
 * twice: by the TMA ring (tile 0, then tile 1 into the next stage - so the
 * second stage's address arithmetic is checked too) and by cp.async
 * (fastLoadTileSw, rows from nkeys zero-filled); copies all to out: ring
 * stages 0..1 of K then of V, then the cp.async K and V tiles. */
template <int D>
__global__ void ringKernel(bf16 *out, const __grid_constant__ FastKvMaps maps, const bf16 *k,
                           const bf16 *v, int nkeys, int G, int b, int g, int u0) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t pad = (1024u - (fastSmemAddr(smem_raw) & 1023u)) & 1023u;
    bf16 *base = (bf16 *)(smem_raw + pad);
    using Ring = FastKvRing<64, D, D, 2, 1>;
    const Ring ring = Ring::at(base);
    /* the cp.async tiles after the ring, 1024-byte aligned */
    bf16 *ck = (bf16 *)(((uintptr_t)base + Ring::BYTES + 1023) & ~(uintptr_t)1023);
    bf16 *cv = ck + 64 * D;
    if (threadIdx.x == 0) ring.init(4);
    __syncthreads();
    if (threadIdx.x == 0) {
        ring.produce(maps, 0, b, g, u0);
        ring.produce(maps, 1, b, g, u0);
    }
    auto rowOf = [&](const bf16 *t, int r) -> const bf16 * {
        return u0 + r < nkeys ? t + (((size_t)b * nkeys + u0 + r) * G + g) * D : nullptr;
    };
    fastLoadTileSw<64, D, 128>(ck, [&](int r) { return rowOf(k, r); });
    fastLoadTileSw<64, D, 128>(cv, [&](int r) { return rowOf(v, r); });
    fastCpCommit();
    fastCpWait<0>();
    ring.wait(0);
    ring.wait(1);
    __syncthreads();
    const bf16 *parts[6] = {ring.k(0), ring.k(1), ring.v(0), ring.v(1), ck, cv};
    for (int p = 0; p < 6; p++)
        for (int i = threadIdx.x; i < 64 * D; i += blockDim.x) out[p * 64 * D + i] = parts[p][i];
}

/* The ring's tiles against cp.async's at a tile inside the tensor and one
 * that runs past its end (rows from nkeys zero in both). */
template <int D>
static void caseRing(int nkeys, int u0) {
    const int B = 2, G = 3, b = 1, g = 2;
    const size_t n = (size_t)B * nkeys * G * D;
    bf16 *hk = (bf16 *)malloc(n * 2), *hv = (bf16 *)malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        hk[i] = __float2bfloat16(uniform());
        hv[i] = __float2bfloat16(uniform());
    }
    bf16 *dk, *dv, *dout;
    const size_t out_n = (size_t)6 * 64 * D;
    CHECK(cudaMalloc(&dk, n * 2));
    CHECK(cudaMalloc(&dv, n * 2));
    CHECK(cudaMalloc(&dout, out_n * 2));
    CHECK(cudaMemcpy(dk, hk, n * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dv, hv, n * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0xFF, out_n * 2)); /* NaN */
    void *encode = NULL;
    CHECK(fastTmaEncoder(&encode));
    FastKvMaps maps;
    CHECK(fastTmaEncodeKv(encode, &maps, dk, dv, B, nkeys, G, D, D, 64));
    const int smem = FastKvRing<64, D, D, 2, 1>::BYTES + 2 * 64 * D * 2 + 3 * 1024;
    CHECK(cudaFuncSetAttribute(ringKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    ringKernel<D><<<1, 128, smem>>>(dout, maps, dk, dv, nkeys, G, b, g, u0);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    uint16_t *got = (uint16_t *)malloc(out_n * 2);
    CHECK(cudaMemcpy(got, dout, out_n * 2, cudaMemcpyDeviceToHost));
    const size_t tile = (size_t)64 * D;
    int bad = 0, zeros_ok = 1;
    for (int p = 0; p < 4 && !bad; p++) {
        const uint16_t *ref = got + (p < 2 ? 4 : 5) * tile;
        for (size_t i = 0; i < tile; i++)
            if (got[p * tile + i] != ref[i]) {
                printf("# ring tile %d differs from cp.async at element %zu: %04x vs %04x\n", p, i,
                       got[p * tile + i], ref[i]);
                bad = 1;
                break;
            }
    }
    /* the cp.async tile itself holds the right rows: row r of panel p,
     * swizzled chunk, against the host copy (zero past nkeys) */
    for (int r = 0; r < 64 && !bad; r++)
        for (int c = 0; c < D; c++) {
            const int u = u0 + r, panel = c / 64, chunk = (c % 64) / 8;
            const size_t at = (size_t)panel * 64 * 64 + r * 64 + ((chunk ^ (r & 7)) * 8) + c % 8;
            uint16_t want = 0;
            if (u < nkeys) memcpy(&want, &hk[(((size_t)b * nkeys + u) * G + g) * D + c], 2);
            else zeros_ok &= got[4 * tile + at] == 0;
            if (got[4 * tile + at] != want) {
                printf("# cp.async K tile row %d col %d: %04x, want %04x\n", r, c,
                       got[4 * tile + at], want);
                bad = 1;
                break;
            }
        }
    const int ok = !bad && zeros_ok;
    printf("%s %d - TMA ring tile D=%d nkeys=%d u0=%d equals cp.async's\n", ok ? "ok" : "not ok",
           passed + failed + 1, D, nkeys, u0);
    ok ? passed++ : failed++;
    CHECK(cudaFree(dk));
    CHECK(cudaFree(dv));
    CHECK(cudaFree(dout));
    free(hk), free(hv), free(got);
}

/* One dK/dV row stage (64 rows: tpr = 64 / hpg tokens x hpg heads of group
 * g, token-major, padding rows zero) of q [B][S][H][D], loaded twice: by TMA
 * boxes (FastRowMaps; one box of all tpr tokens when tok[] holds
 * consecutive tokens and gather is 0, else a box of one token per slot,
 * tokens >= S zero) and by cp.async (fastLoadTileSw); out gets the TMA
 * tile, then the cp.async tile. */
template <int D>
__global__ void rowsKernel(bf16 *out, const __grid_constant__ FastRowMaps maps, const bf16 *q,
                           const int *tok, int S, int H, int hpg, int b, int g, int gather) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t pad = (1024u - (fastSmemAddr(smem_raw) & 1023u)) & 1023u;
    bf16 *tma = (bf16 *)(smem_raw + pad), *cpa = tma + 64 * D;
    uint64_t *bar = (uint64_t *)(cpa + 64 * D);
    const int tpr = 64 / hpg, rows = tpr * hpg;
    for (int i = threadIdx.x; i < 64 * D; i += blockDim.x) tma[i] = __float2bfloat16(0.f);
    if (threadIdx.x == 0) {
        fastMbarInit(bar, 1);
        fastMbarInitFence();
    }
    __syncthreads();
    if (threadIdx.x == 0) fastMbarArriveTx(bar, (uint32_t)rows * 128 * (D / 64));
    __syncthreads();
    if (!gather && threadIdx.x == 0) {
        for (int p = 0; p < D / 64; p++)
            fastTmaLoad4(tma + p * 64 * 64, &maps.q, p * 64, g * hpg, tok[0], b, bar);
    } else if (gather && (int)threadIdx.x < tpr) {
        for (int p = 0; p < D / 64; p++)
            fastTmaLoad4(tma + p * 64 * 64 + threadIdx.x * hpg * 64, &maps.q, p * 64, g * hpg,
                         tok[threadIdx.x], b, bar);
    }
    fastLoadTileSw<64, D, 128>(cpa, [&](int r) -> const bf16 * {
        const int t = r < rows ? tok[r / hpg] : S;
        return t < S ? q + (((size_t)b * S + t) * H + (size_t)g * hpg + r % hpg) * D : nullptr;
    });
    fastCpCommit();
    fastCpWait<0>();
    fastMbarWait(bar, 0);
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * 64 * D; i += blockDim.x) out[i] = tma[i];
}

/* The TMA row stage against cp.async's, byte for byte. */
template <int D>
static void caseRows(int H, int hpg, int gather, int t0) {
    const int B = 2, S = 100, b = 1, g = H / hpg - 1, tpr = 64 / hpg;
    const size_t n = (size_t)B * S * H * D;
    bf16 *hq = (bf16 *)malloc(n * 2);
    for (size_t i = 0; i < n; i++) hq[i] = __float2bfloat16(uniform());
    int htok[64];
    for (int s = 0; s < tpr; s++) /* gathered: scattered, the last one past S */
        htok[s] = gather ? (s == tpr - 1 ? S : (t0 + 7 * s * s) % S) : t0 + s;
    bf16 *dq, *dout;
    int *dtok;
    const size_t out_n = (size_t)2 * 64 * D;
    CHECK(cudaMalloc(&dq, n * 2));
    CHECK(cudaMalloc(&dout, out_n * 2));
    CHECK(cudaMalloc(&dtok, sizeof(htok)));
    CHECK(cudaMemcpy(dq, hq, n * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dtok, htok, sizeof(htok), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0xFF, out_n * 2)); /* NaN */
    void *encode = NULL;
    CHECK(fastTmaEncoder(&encode));
    FastRowMaps maps;
    CHECK(fastTmaEncodeRowMaps(encode, &maps, dq, dq, B, S, H, D, D, hpg, gather ? 1 : tpr));
    const int smem = 2 * 64 * D * 2 + 8 + 2048;
    CHECK(cudaFuncSetAttribute(rowsKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    rowsKernel<D><<<1, 128, smem>>>(dout, maps, dq, dtok, S, H, hpg, b, g, gather);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    uint16_t *got = (uint16_t *)malloc(out_n * 2);
    CHECK(cudaMemcpy(got, dout, out_n * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < (size_t)64 * D && !bad; i++)
        if (got[i] != got[64 * D + i]) {
            printf("# TMA row stage differs from cp.async at element %zu: %04x vs %04x\n", i, got[i],
                   got[64 * D + i]);
            bad = 1;
        }
    /* and the cp.async stage holds the right rows (row 5 of slot 1 probed) */
    const int r = hpg + (5 % hpg), t = htok[1];
    for (int c = 0; c < D && !bad; c++) {
        const size_t at = (size_t)(c / 64) * 64 * 64 + r * 64 + ((((c % 64) / 8) ^ (r & 7)) * 8) + c % 8;
        uint16_t want = 0;
        if (t < S) memcpy(&want, &hq[(((size_t)b * S + t) * H + (size_t)g * hpg + r % hpg) * D + c], 2);
        if (got[64 * D + at] != want) {
            printf("# cp.async row %d col %d: %04x, want %04x\n", r, c, got[64 * D + at], want);
            bad = 1;
        }
    }
    printf("%s %d - TMA row stage D=%d H=%d hpg=%d %s t0=%d equals cp.async's\n",
           bad ? "not ok" : "ok", passed + failed + 1, D, H, hpg,
           gather ? "one box per token" : "one box", t0);
    bad ? failed++ : passed++;
    CHECK(cudaFree(dq));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(dtok));
    free(hq), free(got);
}

int main(void) {
    int dev = 0, major = 0, minor = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) {
        printf("not ok 1 - wgmma needs compute capability 9.0, this device is %d.%d\n", major, minor);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    /* scores of the forward / dQ tiles: 128 query rows (warpgroup 0 or 1) x 64 keys */
    caseScores<8, 64, 128, 64>(0, 0);
    caseScores<8, 128, 128, 64>(64, 0);
    caseScores<8, 192, 128, 64>(64, 0);
    /* dK/dV: 64 keys x one 32-row half of a 64-row stage */
    caseScores<4, 64, 64, 64>(0, 32);
    caseScores<4, 128, 64, 64>(0, 0);
    caseScores<4, 192, 64, 64>(0, 32);
    /* P.V over a 64-key tile, and the dK/dV halves (32 rows from row 32) */
    casePV<8, 64, 64>(0);
    casePV<8, 128, 64>(0);
    casePV<8, 192, 64>(0);
    casePV<4, 128, 64>(32);
    casePV<4, 192, 64>(32);
    casePV<4, 64, 64>(32);
    /* dq = dS.K of the fused selected backward: dS^T from the dK/dV
     * fragments through shared memory, whole stages and 32-row halves */
    caseDsK<4, 64>();
    caseDsK<4, 128>();
    caseDsK<2, 192>();
    /* key tiles by TMA: inside the tensor, and past its end */
    caseRing<64>(200, 64);
    caseRing<128>(200, 160);
    caseRing<192>(130, 100);
    /* dK/dV row stages by TMA: whole tiles (one past S), and one box per
     * token at 16, 6 (768-byte boxes), 3 and 1 heads per group */
    caseRows<128>(64, 16, 0, 3);
    caseRows<64>(12, 6, 0, 95);
    caseRows<192>(16, 16, 0, 40);
    caseRows<128>(64, 16, 1, 11);
    caseRows<64>(12, 6, 1, 2);
    caseRows<128>(6, 3, 1, 50);
    caseRows<64>(8, 1, 1, 5); /* 64 boxes of one row: two per lane */
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
