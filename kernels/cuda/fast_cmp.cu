/* fast_cmp.cu - the compressed branch: avg pooling of the keys and values
 * into blocks, flash attention over the pooled blocks, and its backward.
 *
 * Block i covers tokens [i*d, i*d+l) and is visible at t when i*d+l-1 <= t.
 * The forward saves only o_cmp and lse_cmp (no S x Nc matrix): the
 * selection pass and the backward recompute P = exp(s - lse) tile by tile.
 * dK/dV: key tile i0 is seen by every token from i0*d+l-1 on, so its row
 * tiles are dealt round-robin to `parts` CTAs (balance: the first key tile
 * has the longest list) and the CTAs start longest first; each writes an
 * fp32 partial and the pooling backward sums the parts in a fixed order -
 * no atomics, reproducible. */
#include "fast_internal.cuh"

/* pooled[b][i][g][c] = (1/l) sum_{j<l} x[b][i*d+j][g][c], fp32 sum. */
__global__ void cmpPoolKernel(bf16 *pooled, const bf16 *x, int B, int S, int G, int dim, int l,
                              int d, int Nc) {
    size_t n = (size_t)B * Nc * G * dim;
    float inv = 1.f / (float)l;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % dim);
        size_t rest = idx / dim;
        int g = (int)(rest % G);
        rest /= G;
        int i = (int)(rest % Nc);
        int b = (int)(rest / Nc);
        const bf16 *src = x + (((size_t)b * S + (size_t)i * d) * G + g) * dim + c;
        float acc = 0.f;
        for (int j = 0; j < l; j++) acc += __bfloat162float(src[(size_t)j * G * dim]);
        pooled[idx] = __float2bfloat16(acc * inv);
    }
}

/* dx[b][t][g][c] = (1/l) sum over blocks i holding t (ascending) of
 * (sum over parts p (ascending) of part[p][b][i][g][c]).
 *
 * A CTA per run of `run` blocks [i0, i1) of one (b, g): it first
 * sums each block's parts once - for the run and the blocks before it that
 * still reach its first token (l > d: blocks overlap) - into shared
 * memory, then writes the tokens [i0 d, i1 d) (the last run: to S) from
 * those sums, four channels a thread. Summed per token instead, as before,
 * each block's parts were read again for every one of the l tokens it
 * holds: l / d x parts loads per output (paper 2k: 0.34 ms of the
 * compressed backward). dim is a multiple of 4. */
#define CMP_POOL_RUN 32
__global__ void cmpPoolBackwardKernel(bf16 *dx, const float *part, int parts, int B, int S, int G,
                                      int dim, int l, int d, int Nc, int run) {
    extern __shared__ float4 block_sum[]; /* [blocks of the run and its halo][dim / 4] */
    const int dim4 = dim / 4;
    const int b = blockIdx.y / G, g = blockIdx.y % G;
    const int i0 = blockIdx.x * run, i1 = min(Nc, i0 + run);
    const int ih = max(0, i0 - (l - 1) / d); /* first block reaching token i0 d */
    const int nblk = i1 - ih;
    for (int idx = threadIdx.x; idx < nblk * dim4; idx += blockDim.x) {
        const int i = ih + idx / dim4, c = (idx % dim4) * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int p = 0; p < parts; p++) {
            const float4 v =
                *(const float4 *)(part + ((((size_t)p * B + b) * Nc + i) * G + g) * dim + c);
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
        }
        block_sum[idx] = acc;
    }
    __syncthreads();
    const float inv = 1.f / (float)l;
    const int t0 = i0 * d;
    const int t1 = i1 == Nc ? S : i1 * d;
    for (int idx = threadIdx.x; idx < (t1 - t0) * dim4; idx += blockDim.x) {
        const int t = t0 + idx / dim4, c4 = idx % dim4;
        const int ilo = t - l + 1 <= 0 ? 0 : (t - l + 1 + d - 1) / d;
        const int ihi = min(Nc - 1, t / d);
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i = ilo; i <= ihi; i++) {
            const float4 v = block_sum[(i - ih) * dim4 + c4];
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
        }
        *(uint2 *)(dx + (((size_t)b * S + t) * G + g) * dim + c4 * 4) =
            make_uint2(fastPack(acc.x * inv, acc.y * inv), fastPack(acc.z * inv, acc.w * inv));
    }
}

template <int DK, int DV, bool WG>
__global__ void __launch_bounds__(FastDkdvShape<WG, DK, DV>::THREADS)
cmpDkdvKernel(FastCtx c, FastBwdIo io, float *part_k, float *part_v,
              const __grid_constant__ FastRowMaps maps) {
    constexpr int KT = FastDkdvShape<WG, DK, DV>::KEYS;
    /* Longest first: CTAs start in linear-index order, and key tile x has
     * work ~ S - x*64*d, so the index runs over key tiles outermost (every
     * part and (b, g) of tile 0 first). Without it the long CTAs of late
     * (b, g) started last and the pass ran about 1.36x its balanced time
     * (a greedy-schedule model of the paper shape at 64k). */
    const int parts = gridDim.y, BG = gridDim.z;
    const int linear = blockIdx.x + gridDim.x * (blockIdx.y + parts * blockIdx.z);
    const int key_tile = linear / (parts * BG), rest = linear % (parts * BG);
    const int bg = rest / parts, b = bg / c.G, g = bg % c.G;
    const int part = rest % parts;
    const int i0 = key_tile * KT, khi = min(c.Nc, i0 + KT);
    const int tb = i0 * c.cmp_stride + c.cmp_len - 1; /* first token seeing block i0 */
    const int tpr = FAST_DKDV_ROWS / c.hpg;
    const int total = (c.S - tb + tpr - 1) / tpr;
    const int ntiles = total > part ? (total - part + parts - 1) / parts : 0;
    const int S = c.S, l = c.cmp_len, d = c.cmp_stride, Nc = c.Nc, B = c.B, G = c.G;
    /* Row tiles go last token first: every key tile's rows end at S - 1,
     * so the CTAs running together walk the same rows and share them in
     * L2; first token first, each started at its own key tile's first
     * token and the q / dout stream came from DRAM (ncu, paper 64k: DRAM
     * 48% busy beside L2 77%). */
    auto tileStart = [=](int it) { return tb + (part + (ntiles - 1 - it) * parts) * tpr; };
    auto visible = [=](int t, int i) { return i * d + l - 1 <= t; };
    auto seesAny = [=](int it, int ia, int) { /* the tile's last token sees block ia */
        return ia * d + l - 1 <= min(S, tileStart(it) + tpr) - 1;
    };
    auto tileFull = [=](int it, int, int ia) { /* tokens of row tile it: [t, t + tpr) */
        int t = tileStart(it);
        return t + tpr <= S && (ia + 63) * d + l - 1 <= t;
    };
    auto store = [=](int i, bool is_k, int col, float v0, float v1) {
        size_t blk = (((size_t)part * B + b) * Nc + i) * G + g;
        if (is_k)
            *(float2 *)(part_k + blk * DK + col) = make_float2(v0, v1);
        else
            *(float2 *)(part_v + blk * DV + col) = make_float2(v0, v1);
    };
    constexpr int KWG = FastDkdvShape<WG, DK, DV>::KWG;
    auto tokenOf = [=](int it, int slot) { /* row tile it: tokens tileStart(it) .., none from S */
        int t = tileStart(it) + slot;
        return t < S ? t : -1;
    };
    fastDkdvConsecutive<DK, DV, WG, KWG>(c, io, maps, b, g, i0, khi, ntiles, tokenOf, visible,
                                         seesAny, tileFull, store);
}

cudaError_t fastPoolForward(bf16 *pooled, const bf16 *x, const FastCtx &c, int dim,
                            cudaStream_t stream) {
    size_t n = (size_t)c.B * c.Nc * c.G * dim;
    if (n == 0) return cudaSuccess;
    unsigned blocks = (unsigned)min((size_t)65535 * 8, (n + 255) / 256);
    cmpPoolKernel<<<blocks, 256, 0, stream>>>(pooled, x, c.B, c.S, c.G, dim, c.cmp_len,
                                              c.cmp_stride, c.Nc);
    return cudaGetLastError();
}

template <int DK, int DV>
static cudaError_t cmpForward(const FastCtx &c, const FastFwdIo &io, cudaStream_t stream) {
    return fastLaunchForward<DK, DV, CmpPolicy, false>(c, io, fastCmpPolicy(c), stream);
}

template <int DK, int DV>
static cudaError_t cmpBackward(const FastCtx &c, const FastBwdIo &io, int parts, float *part_k,
                               float *part_v, bf16 *dk_out, bf16 *dv_out, cudaStream_t stream,
                               const FastMarks *marks) {
    cudaError_t e;
    if ((e = fastMark(marks, "bwd.cmp.dkdv")) != cudaSuccess) return e;
    if (c.Nc > 0) {
        FastRowMaps maps = {};
        if ((e = fastDkdvRowMaps(c, io, DK, DV, false, &maps)) != cudaSuccess) return e;
        auto dkdv = c.wgmma ? cmpDkdvKernel<DK, DV, true> : cmpDkdvKernel<DK, DV, false>;
        const int kt = c.wgmma ? FastDkdvShape<true, DK, DV>::KEYS
                               : FastDkdvShape<false, DK, DV>::KEYS;
        const int threads = c.wgmma ? FastDkdvShape<true, DK, DV>::THREADS
                                    : FastDkdvShape<false, DK, DV>::THREADS;
        const int smem_kv = c.wgmma ? FastDkdvRing<DK, DV, FastDkdvShape<true, DK, DV>::KWG, false>::SMEM
                                    : fastDkdvSmem(DK, DV, false, kt / 64);
        if ((e = fastSetSmem(dkdv, smem_kv)) != cudaSuccess) return e;
        dkdv<<<dim3((c.Nc + kt - 1) / kt, parts, c.B * c.G), threads, smem_kv, stream>>>(
            c, io, part_k, part_v, maps);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if ((e = fastMark(marks, "bwd.cmp.pool")) != cudaSuccess) return e;
    if (c.Nc == 0) { /* no block holds a token: the gradients are zero */
        if ((e = cudaMemsetAsync(dk_out, 0, (size_t)c.B * c.S * c.G * DK * 2, stream)) != cudaSuccess)
            return e;
        return cudaMemsetAsync(dv_out, 0, (size_t)c.B * c.S * c.G * DV * 2, stream);
    }
    /* runs of up to CMP_POOL_RUN blocks whose sums, with the halo's, fit
     * 48 KB at the wider of d_k, d_v (fastCheckDims bounds the halo) */
    const int halo = (c.cmp_len - 1) / c.cmp_stride;
    const int run = min(CMP_POOL_RUN, 48 * 1024 / ((DK > DV ? DK : DV) * 4) - halo);
    if (run < 1) return cudaErrorInvalidValue;
    const dim3 runs((c.Nc + run - 1) / run, c.B * c.G);
    cmpPoolBackwardKernel<<<runs, 256, (size_t)(run + halo) * DK * 4, stream>>>(
        dk_out, part_k, parts, c.B, c.S, c.G, DK, c.cmp_len, c.cmp_stride, c.Nc, run);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    cmpPoolBackwardKernel<<<runs, 256, (size_t)(run + halo) * DV * 4, stream>>>(
        dv_out, part_v, parts, c.B, c.S, c.G, DV, c.cmp_len, c.cmp_stride, c.Nc, run);
    return cudaGetLastError();
}

cudaError_t fastCmpForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                           cudaStream_t stream) {
    FAST_DISPATCH(dk, dv, cmpForward, c, io, stream);
}

cudaError_t fastCmpBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io, int parts,
                            float *part_k, float *part_v, bf16 *dk_out, bf16 *dv_out,
                            cudaStream_t stream, const FastMarks *marks) {
    FAST_DISPATCH(dk, dv, cmpBackward, c, io, parts, part_k, part_v, dk_out, dv_out, stream,
                  marks);
}
