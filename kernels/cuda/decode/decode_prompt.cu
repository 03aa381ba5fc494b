/* decode_prompt.cu - the caches of one slot filled from a whole prompt's
 * attention inputs (decode_ops.h, decPromptCaches). The prompt pass
 * (decode.cu) runs the prompt's n tokens through GEMMs and the fast NSA op,
 * whose bf16 inputs k_b, v_b [n][G][d] (branches cmp, sel, win; keys
 * already rotated) are what the decoder's caches hold; for slot s, group g
 * and position t < n:
 *
 *   caches    k_sel, v_sel row t <- k_sel, v_sel [t][g]
 *             ring rows t % W   <- k_win, v_win [t][g]  for t >= n - W
 *             raw rows t % Lr   <- k_cmp, v_cmp [t][g]  for t >= n - Lr (fp32)
 *   pool      kc, vc block i    <- mean_{j < l} k_cmp, v_cmp [i d + j][g]
 *             for the nsaNumCmpBlocks(n) blocks the prompt completes
 *             (phi = avg: the prompt pass exists only where the fast op
 *             does, and it pools with avg)
 *
 * exactly what n decode steps would leave there, up to the bf16 rounding of
 * the raw rows (the decoder's own appends keep them fp32). */
#include "../cuda_common.cuh"
#include "decode_ops.h"

#define PROMPT_ROWS 8   /* positions per CTA of the cache copy */

/* A CTA per (PROMPT_ROWS positions, group g) of slot `slot`, for t < n: k_sel, v_sel row t <-
 * in.k[1], in.v[1] [t][g]; ring row t % W <- in.k[2], in.v[2] [t][g] for t >= n - W; raw ring
 * row t % Lr <- in.k[0], in.v[0] [t][g] widened to fp32 for t >= n - Lr. */
__global__ void decPromptCachesKernel(DecDims dm, DecLayerCache c, int slot, DecPromptInputs in,
                                      int n) {
    const int g = blockIdx.y, G = dm.G, dk = dm.dk, dv = dm.dv, Lr = dm.raw_ring;
    const size_t sg = (size_t)slot * G + g;
    for (int r = 0; r < PROMPT_ROWS; r++) {
        const int t = blockIdx.x * PROMPT_ROWS + r;
        if (t >= n) return;
        const bool in_window = t >= n - dm.W, in_raw = t >= n - Lr;
        const bf16 *ks = in.k[1] + ((size_t)t * G + g) * dk, *vs = in.v[1] + ((size_t)t * G + g) * dv;
        const bf16 *kw = in.k[2] + ((size_t)t * G + g) * dk, *vw = in.v[2] + ((size_t)t * G + g) * dv;
        const bf16 *kr = in.k[0] + ((size_t)t * G + g) * dk, *vr = in.v[0] + ((size_t)t * G + g) * dv;
        for (int e = threadIdx.x; e < dk; e += blockDim.x) {
            c.k_sel[(sg * dm.T + t) * dk + e] = ks[e];
            if (in_window) c.k_win[(sg * dm.W + t % dm.W) * dk + e] = kw[e];
            if (in_raw) c.k_raw[(sg * Lr + t % Lr) * dk + e] = __bfloat162float(kr[e]);
        }
        for (int e = threadIdx.x; e < dv; e += blockDim.x) {
            c.v_sel[(sg * dm.T + t) * dv + e] = vs[e];
            if (in_window) c.v_win[(sg * dm.W + t % dm.W) * dv + e] = vw[e];
            if (in_raw) c.v_raw[(sg * Lr + t % Lr) * dv + e] = __bfloat162float(vr[e]);
        }
    }
}

/* One CTA per (block, group): the mean of the block's l rows, in token
 * order as attn_pool_avg.c sums them. */
__global__ void decPromptPoolKernel(DecDims dm, DecLayerCache c, int slot, DecPromptInputs in) {
    const int blk = blockIdx.x, g = blockIdx.y, G = dm.G, first = blk * dm.d;
    const size_t sg = (size_t)slot * G + g;
    for (int kv = 0; kv < 2; kv++) {
        const int dim = kv ? dm.dv : dm.dk;
        const bf16 *raw = (kv ? in.v[0] : in.k[0]) + (size_t)g * dim;
        bf16 *out = (kv ? c.vc : c.kc) + (sg * dm.Nc + blk) * dim;
        for (int e = threadIdx.x; e < dim; e += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < dm.l; j++)
                acc += __bfloat162float(raw[(size_t)(first + j) * G * dim + e]);
            out[e] = __float2bfloat16_rn(acc * (1.0f / dm.l));
        }
    }
}

int decPromptCaches(const DecDims *dm, const DecLayerCache *c, int slot, const DecPromptInputs *in,
                    int n, cudaStream_t stream, NsaError *err) {
    const DecLaunch plain = {stream, 0};
    DEC_LAUNCH("decPromptCachesKernel", &plain, err, decPromptCachesKernel,
               dim3((n + PROMPT_ROWS - 1) / PROMPT_ROWS, dm->G), dim3(64), 0, *dm, *c, slot, *in,
               n);
    const int blocks = nsaNumCmpBlocks(n, dm->l, dm->d);
    if (blocks > 0)
        DEC_LAUNCH("decPromptPoolKernel", &plain, err, decPromptPoolKernel, dim3(blocks, dm->G),
                   dim3(64), 0, *dm, *c, slot, *in);
    return 0;
}
