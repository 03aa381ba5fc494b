/* decode_attn.cu - NSA attention of one decode step over the caches
 * (decode_ops.h; kernels/cpu/decode.c is the oracle). For each row (slot at
 * position t) and KV group g, with scale = 1/sqrt(dk):
 *
 *   append    q, k^c = RoPE(proj) at t; k^sel, v^sel -> row t; k^win, v^win
 *             -> ring row t % W; k^cmp, v^cmp -> raw ring row t % Lr
 *   pool      when t = i*d + l - 1, block i = phi(raw rows t-l+1 .. t) -> kc,
 *             vc (in append for a decode step; after it for a prefill pass)
 *   cmp       s_i = scale q_h.kc_i over the visible blocks
 *             (n_t = floor((t-l+1)/d) + 1), split in chunks: per chunk the
 *             max m, sum l = sum exp(s_i - m) and o = sum exp(s_i - m) vc_i
 *   select    lse_h, o_cmp from the chunks; p_i = exp(s_i - lse_h);
 *             score_j = sum_h sum_i M_ij p_i (M_ij: the share of block i
 *             inside selection block j); blocks 0, t/l' and t/l' - 1, then
 *             the complete blocks with the highest scores (ties: lower j)
 *             up to n_sel: the K-th largest score is found by bisection on
 *             its bits (scores are >= 0, so their bits order like them)
 *   selwin    per DEC_UNIT keys (a part of a selected block, <= t, or of
 *             the window [max(0, t-w+1), t]) partial m, l, o for every head
 *             of the group: the group's keys are read once
 *   combine   o_sel, o_win from their partials; y = sum_c sigmoid(gate_c) o_c
 * Partials merge as o = sum_u o_u exp(m_u - M) / sum_u l_u exp(m_u - M).
 * Nothing here synchronises with the host or allocates; positions come from
 * device memory, so the kernels replay inside a CUDA graph. */
#include "../cuda_common.cuh"
#include "decode_ops.h"

__device__ __forceinline__ float bf(bf16 v) { return __bfloat162float(v); }

/* dot of an fp32 vector (shared memory) with a bf16 row, n % 8 == 0 */
__device__ __forceinline__ float dotRow(const float *q, const bf16 *k, int n) {
    float acc = 0.0f;
    const uint4 *k8 = (const uint4 *)k;
    for (int c8 = 0; c8 < n / 8; c8++) {
        const uint4 u = k8[c8];
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc += q[c8 * 8 + 2 * i] * __uint_as_float(w[i] << 16);
            acc += q[c8 * 8 + 2 * i + 1] * __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    return acc;
}

__device__ __forceinline__ int visibleBlocks(int t, int l, int d) {
    return t < l - 1 ? 0 : (t - l + 1) / d + 1;
}

/* ---- rows ------------------------------------------------------------------ */

__global__ void decRowsKernel(int *row_slot, int *row_pos, const int *stage, const int *pos, int B,
                              int prefill) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const int slot = prefill ? stage[0] : stage[0] + b;
    row_slot[b] = slot;
    row_pos[b] = pos[slot] + (prefill ? b : 0);
}

int decRows(int *row_slot, int *row_pos, const int *stage, const int *pos, int B, int prefill,
            cudaStream_t stream, NsaError *err) {
    decRowsKernel<<<1, DEC_MAX_BATCH, 0, stream>>>(row_slot, row_pos, stage, pos, B, prefill);
    LAUNCH_CHECK("decRowsKernel", err);
    return 0;
}

/* ---- append and pool ---------------------------------------------------------- */

/* Block i = (t - l + 1) / d of slot-group sg from the raw ring, when
 * position t completes one (uniform over the CTA: t is the row's). pool_u:
 * [l][max(dk, dv)] floats of shared memory for phi = mlp. */
__device__ void poolBlock(const DecDims &dm, const DecLayerCache &c, size_t sg, int t, float *pool_u,
                          float *hidden) {
    if (t < dm.l - 1 || (t - dm.l + 1) % dm.d != 0) return;   /* no block ends here */
    const int blk = (t - dm.l + 1) / dm.d, first = t - dm.l + 1, Lr = dm.raw_ring;
    for (int kv = 0; kv < 2; kv++) {
        const int dim = kv ? dm.dv : dm.dk;
        const float *raw = (kv ? c.v_raw : c.k_raw) + sg * Lr * dim;
        bf16 *out = (kv ? c.vc : c.kc) + (sg * dm.Nc + blk) * dim;
        if (!dm.phi_mlp) {
            /* mean over the block's rows in token order (attn_pool_avg.c) */
            for (int e = threadIdx.x; e < dim; e += blockDim.x) {
                float acc = 0.0f;
                for (int j = 0; j < dm.l; j++) acc += raw[((first + j) % Lr) * dim + e];
                out[e] = __float2bfloat16_rn(acc * (1.0f / dm.l));
            }
            continue;
        }
        /* phi = mlp: u = vec(X + P); hidden = W1 u; out = mean_j X + W2 silu(hidden) */
        const float *pos = kv ? c.phi_v_pos : c.phi_k_pos;
        const float *w1 = kv ? c.phi_v_w1 : c.phi_k_w1, *w2 = kv ? c.phi_v_w2 : c.phi_k_w2;
        const int in_len = dm.l * dim;
        __syncthreads();   /* the previous pass is done with pool_u and hidden */
        for (int k = threadIdx.x; k < in_len; k += blockDim.x)
            pool_u[k] = raw[((first + k / dim) % Lr) * dim + k % dim] + pos[k];
        __syncthreads();
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
        for (int e = warp; e < dim; e += warps) {
            const float *row = w1 + (size_t)e * in_len;
            float acc = 0.0f;
            for (int k = lane; k < in_len; k += 32) acc += row[k] * pool_u[k];
            acc = warpSum(acc);
            if (lane == 0) hidden[e] = acc / (1.0f + __expf(-acc));   /* silu */
        }
        __syncthreads();
        for (int e = threadIdx.x; e < dim; e += blockDim.x) {
            float mean = 0.0f, mlp = 0.0f;
            for (int j = 0; j < dm.l; j++) mean += raw[((first + j) % Lr) * dim + e];
            for (int f = 0; f < dim; f++) mlp += w2[(size_t)e * dim + f] * hidden[f];
            out[e] = __float2bfloat16_rn(mean * (1.0f / dm.l) + mlp);
        }
    }
}

__global__ void decAppendKernel(DecDims dm, DecLayerCache c, DecScratch s) {
    extern __shared__ float pool_u[];   /* phi = mlp: [l][dim] block + position */
    __shared__ float hidden[DEC_MAX_HEAD_DIM];
    const int b = blockIdx.x, g = blockIdx.y;
    const int slot = s.row_slot[b], t = s.row_pos[b];
    const int H = dm.H, G = dm.G, dk = dm.dk, dv = dm.dv, half = dk / 2, hpg = H / G;
    const float *pr = s.proj + (size_t)b * dm.proj_stride;
    const float *cs = s.rope + (size_t)t * dk;   /* [half][2] */
    const size_t sg = (size_t)slot * G + g;
    const int qn = H * dk, kn = G * dk, vn = G * dv, Lr = dm.raw_ring;
    const int off_k[3] = {qn, qn + kn + vn, qn + 2 * (kn + vn)};
    const int off_v[3] = {qn + kn, qn + 2 * kn + vn, qn + 3 * kn + 2 * vn};

    for (int idx = threadIdx.x; idx < hpg * half; idx += blockDim.x) {
        const int h = g * hpg + idx / half, i = idx % half;
        const float x0 = pr[h * dk + i], x1 = pr[h * dk + i + half];
        const float co = cs[2 * i], si = cs[2 * i + 1];
        float *qr = s.q + ((size_t)b * H + h) * dk;
        qr[i] = x0 * co - x1 * si;
        qr[i + half] = x0 * si + x1 * co;
    }
    for (int idx = threadIdx.x; idx < 3 * half; idx += blockDim.x) {
        const int br = idx / half, i = idx % half;
        const float *kr = pr + off_k[br] + g * dk;
        const float co = cs[2 * i], si = cs[2 * i + 1];
        const float r0 = kr[i] * co - kr[i + half] * si, r1 = kr[i] * si + kr[i + half] * co;
        if (br == 0) {
            float *dst = c.k_raw + (sg * Lr + t % Lr) * dk;
            dst[i] = r0;
            dst[i + half] = r1;
        } else {
            bf16 *dst = br == 1 ? c.k_sel + (sg * dm.T + t) * dk
                                : c.k_win + (sg * dm.W + t % dm.W) * dk;
            dst[i] = __float2bfloat16_rn(r0);
            dst[i + half] = __float2bfloat16_rn(r1);
        }
    }
    for (int idx = threadIdx.x; idx < 3 * dv; idx += blockDim.x) {
        const int br = idx / dv, i = idx % dv;
        const float v = pr[off_v[br] + g * dv + i];
        if (br == 0) c.v_raw[(sg * Lr + t % Lr) * dv + i] = v;
        else if (br == 1) c.v_sel[(sg * dm.T + t) * dv + i] = __float2bfloat16_rn(v);
        else c.v_win[(sg * dm.W + t % dm.W) * dv + i] = __float2bfloat16_rn(v);
    }
    if (!dm.pool_in_append) return;
    __syncthreads();   /* the raw rows above are the block's last */
    poolBlock(dm, c, sg, t, pool_u, hidden);
}

__global__ void decPoolKernel(DecDims dm, DecLayerCache c, DecScratch s) {
    extern __shared__ float pool_u[];
    __shared__ float hidden[DEC_MAX_HEAD_DIM];
    const int b = blockIdx.x, g = blockIdx.y;
    poolBlock(dm, c, (size_t)s.row_slot[b] * dm.G + g, s.row_pos[b], pool_u, hidden);
}

static size_t poolSmem(const DecDims *dm) {
    const int dmax = dm->dk > dm->dv ? dm->dk : dm->dv;
    return dm->phi_mlp ? (size_t)dm->l * dmax * sizeof(float) : 0;
}

int decAppend(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, cudaStream_t stream,
              NsaError *err) {
    decAppendKernel<<<dim3(dm->B, dm->G), 128, dm->pool_in_append ? poolSmem(dm) : 0, stream>>>(
        *dm, *c, *s);
    LAUNCH_CHECK("decAppendKernel", err);
    return 0;
}

int decPool(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, cudaStream_t stream,
            NsaError *err) {
    decPoolKernel<<<dim3(dm->B, dm->G), 128, poolSmem(dm), stream>>>(*dm, *c, *s);
    LAUNCH_CHECK("decPoolKernel", err);
    return 0;
}

/* ---- compressed attention partials ----------------------------------------- */

__global__ void __launch_bounds__(DEC_CMP_CHUNK) decCmpKernel(DecDims dm, DecLayerCache c,
                                                              DecScratch s) {
    __shared__ float qs[DEC_MAX_HEADS_PER_GROUP * DEC_MAX_HEAD_DIM];
    __shared__ float ps[DEC_MAX_HEADS_PER_GROUP][DEC_CMP_CHUNK];
    const int b = blockIdx.x / dm.G, g = blockIdx.x % dm.G, chunk = blockIdx.y;
    const int slot = s.row_slot[b], t = s.row_pos[b];
    const int H = dm.H, hpg = H / dm.G, dk = dm.dk, dv = dm.dv;
    const int i0 = chunk * DEC_CMP_CHUNK, n_vis = visibleBlocks(t, dm.l, dm.d);
    const int n = n_vis - i0 < DEC_CMP_CHUNK ? n_vis - i0 : DEC_CMP_CHUNK;
    const float scale = rsqrtf((float)dk);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const size_t part0 = ((size_t)b * H + g * hpg) * dm.n_chunks + chunk;
    if (n <= 0) {   /* nothing visible in this chunk: an empty partial */
        for (int hh = warp; hh < hpg; hh += warps) {
            const size_t p = part0 + (size_t)hh * dm.n_chunks;
            if (lane == 0) {
                s.cmp_m[p] = -INFINITY;
                s.cmp_l[p] = 0.0f;
            }
            for (int e = lane; e < dv; e += 32) s.cmp_o[p * dv + e] = 0.0f;
        }
        return;
    }
    for (int k = threadIdx.x; k < hpg * dk; k += blockDim.x)
        qs[k] = s.q[((size_t)b * H + g * hpg) * dk + k];
    __syncthreads();
    const size_t sg = (size_t)slot * dm.G + g;
    if ((int)threadIdx.x < n) {
        const int i = i0 + threadIdx.x;
        const bf16 *kr = c.kc + (sg * dm.Nc + i) * dk;
        for (int hh = 0; hh < hpg; hh++) {
            const float sc = scale * dotRow(qs + hh * dk, kr, dk);
            ps[hh][threadIdx.x] = sc;
            s.cmp_scores[((size_t)b * H + g * hpg + hh) * dm.Nc + i] = sc;
        }
    }
    __syncthreads();
    for (int hh = warp; hh < hpg; hh += warps) {
        float m = -INFINITY;
        for (int i = lane; i < n; i += 32) m = fmaxf(m, ps[hh][i]);
        m = warpMax(m);
        float sum = 0.0f;
        for (int i = lane; i < n; i += 32) {
            const float p = __expf(ps[hh][i] - m);
            ps[hh][i] = p;
            sum += p;
        }
        sum = warpSum(sum);
        __syncwarp();
        const size_t p = part0 + (size_t)hh * dm.n_chunks;
        if (lane == 0) {
            s.cmp_m[p] = m;
            s.cmp_l[p] = sum;
        }
        for (int e = lane; e < dv; e += 32) {
            float acc = 0.0f;
            for (int i = 0; i < n; i++) acc += ps[hh][i] * bf(c.vc[(sg * dm.Nc + i0 + i) * dv + e]);
            s.cmp_o[p * dv + e] = acc;
        }
    }
}

int decCmp(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, cudaStream_t stream,
           NsaError *err) {
    decCmpKernel<<<dim3(dm->B * dm->G, dm->n_chunks), DEC_CMP_CHUNK, 0, stream>>>(*dm, *c, *s);
    LAUNCH_CHECK("decCmpKernel", err);
    return 0;
}

/* ---- selection -------------------------------------------------------------- */

#define SEL_THREADS 256
#define SEL_PER_THREAD (DEC_MAX_SEL_BLOCKS / SEL_THREADS)

/* Sum of v over the block (every thread gets it). scratch: 32 ints. */
__device__ int blockSumInt(int v, int *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int total = lane < warps ? scratch[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    return total;
}

/* Exclusive prefix sum of flag (0/1) over the block in thread order; *total
 * gets the sum. scratch: 32 ints. */
__device__ int blockPrefix(int flag, int *scratch, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    const int in_warp = __popc(ballot & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0) scratch[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < warps; w++) {
        if (w < warp) before += scratch[w];
        all += scratch[w];
    }
    *total = all;
    return before + in_warp;
}

__global__ void __launch_bounds__(SEL_THREADS) decSelectKernel(DecDims dm, DecScratch s) {
    __shared__ float lse[DEC_MAX_HEADS_PER_GROUP];
    __shared__ float score[DEC_MAX_SEL_BLOCKS];
    __shared__ int scratch[32];
    const int b = blockIdx.x / dm.G, g = blockIdx.x % dm.G;
    const int t = s.row_pos[b];
    const int H = dm.H, hpg = H / dm.G, dv = dm.dv, l = dm.l, d = dm.d, ls = dm.l_sel;
    const int n_vis = visibleBlocks(t, l, d);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;

    /* 1. merge the compressed partials: lse and o_cmp per head */
    for (int hh = warp; hh < hpg; hh += warps) {
        const size_t p0 = ((size_t)b * H + g * hpg + hh) * dm.n_chunks;
        float M = -INFINITY;
        for (int k = lane; k < dm.n_chunks; k += 32) M = fmaxf(M, s.cmp_m[p0 + k]);
        M = warpMax(M);
        float L = 0.0f;
        for (int k = lane; k < dm.n_chunks; k += 32)
            if (s.cmp_m[p0 + k] != -INFINITY) L += s.cmp_l[p0 + k] * __expf(s.cmp_m[p0 + k] - M);
        L = warpSum(L);
        float *o = s.o_cmp + ((size_t)b * H + g * hpg + hh) * dv;
        for (int e = lane; e < dv; e += 32) {
            float acc = 0.0f;
            if (M != -INFINITY)
                for (int k = 0; k < dm.n_chunks; k++)
                    if (s.cmp_m[p0 + k] != -INFINITY)
                        acc += s.cmp_o[(p0 + k) * dv + e] * __expf(s.cmp_m[p0 + k] - M);
            o[e] = M == -INFINITY ? 0.0f : acc / L;
        }
        if (lane == 0) lse[hh] = M == -INFINITY ? -INFINITY : M + __logf(L);
    }
    __syncthreads();

    /* 2. selection-block scores, blocks up to the current one */
    const int Ns = t / ls + 1, current = t / ls, n_complete = (t + 1) / ls;
    for (int j = threadIdx.x; j < Ns; j += blockDim.x) {
        const int lo_tok = j * ls, hi_tok = (j + 1) * ls;
        const int i_lo = lo_tok - l < 0 ? 0 : (lo_tok - l) / d + 1;
        int i_hi = (hi_tok - 1) / d;
        if (i_hi > n_vis - 1) i_hi = n_vis - 1;
        float acc = 0.0f;
        for (int hh = 0; hh < hpg; hh++) {
            const float *sc = s.cmp_scores + ((size_t)b * H + g * hpg + hh) * dm.Nc;
            for (int i = i_lo; i <= i_hi; i++) {
                const int first = i * d, end = i * d + l;
                const int lo = first > lo_tok ? first : lo_tok, hi = end < hi_tok ? end : hi_tok;
                acc += (float)(hi - lo) / (float)l * __expf(sc[i] - lse[hh]);
            }
        }
        score[j] = acc;
    }
    __syncthreads();

    /* 3. forced blocks, then the K best complete ones (score desc, j asc) */
    int n_forced = 1 + (current != 0) + (current >= 2);   /* 0, current, current-1 distinct */
    int want = dm.n_sel - n_forced;
    unsigned key[SEL_PER_THREAD];
    int valid[SEL_PER_THREAD], chosen[SEL_PER_THREAD];
    int n_cand = 0;
#pragma unroll
    for (int r = 0; r < SEL_PER_THREAD; r++) {   /* every slot set: later loops read them */
        const int j = r * SEL_THREADS + threadIdx.x;
        const int forced = j == 0 || j == current || j == current - 1;
        valid[r] = j < n_complete && !forced;
        key[r] = valid[r] ? __float_as_uint(score[j]) : 0u;
        chosen[r] = forced && j < Ns;
        n_cand += valid[r];
    }
    n_cand = blockSumInt(n_cand, scratch);
    if (want > 0 && n_cand <= want) {
#pragma unroll
        for (int r = 0; r < SEL_PER_THREAD; r++) chosen[r] |= valid[r];
    } else if (want > 0) {
        /* the want-th largest key: bisection on the bits (bit 31 is the sign: 0) */
        unsigned tau = 0;
        for (int bit = 30; bit >= 0; bit--) {
            const unsigned cand = tau | (1u << bit);
            int cnt = 0;
#pragma unroll
            for (int r = 0; r < SEL_PER_THREAD; r++) cnt += valid[r] && key[r] >= cand;   /* 0 past Ns */
            if (blockSumInt(cnt, scratch) >= want) tau = cand;
        }
        int gt = 0;
#pragma unroll
        for (int r = 0; r < SEL_PER_THREAD; r++) gt += valid[r] && key[r] > tau;
        const int need_eq = want - blockSumInt(gt, scratch);
        /* ties at tau: the lowest j first; j = r * SEL_THREADS + thread is in
         * thread order within each r, and r ascends */
        int eq_before = 0;
#pragma unroll
        for (int r = 0; r < SEL_PER_THREAD; r++) {
            if (r * SEL_THREADS >= Ns) break;   /* uniform: nothing valid past Ns */
            const int eq = valid[r] && key[r] == tau;
            int total;
            const int rank = eq_before + blockPrefix(eq, scratch, &total);
            chosen[r] |= (valid[r] && key[r] > tau) || (eq && rank < need_eq);
            eq_before += total;
        }
    }
    /* 4. write the chosen blocks ascending, -1 padded */
    int *out = s.sel + ((size_t)b * dm.G + g) * dm.slots;
    int written = 0;
#pragma unroll
    for (int r = 0; r < SEL_PER_THREAD; r++) {
        if (r * SEL_THREADS >= Ns) break;   /* uniform: nothing chosen past Ns */
        int total;
        const int at = written + blockPrefix(chosen[r], scratch, &total);
        if (chosen[r] && at < dm.slots) out[at] = r * SEL_THREADS + threadIdx.x;
        written += total;
    }
    for (int k = written + threadIdx.x; k < dm.slots; k += blockDim.x) out[k] = -1;
}

int decSelect(const DecDims *dm, const DecScratch *s, cudaStream_t stream, NsaError *err) {
    decSelectKernel<<<dm->B * dm->G, SEL_THREADS, 0, stream>>>(*dm, *s);
    LAUNCH_CHECK("decSelectKernel", err);
    return 0;
}

/* ---- selected and window partials ------------------------------------------- */

__global__ void __launch_bounds__(128) decSelWinKernel(DecDims dm, DecLayerCache c, DecScratch s) {
    __shared__ float qs[DEC_MAX_HEADS_PER_GROUP * DEC_MAX_HEAD_DIM];
    __shared__ float ps[DEC_MAX_HEADS_PER_GROUP][DEC_UNIT];
    const int b = blockIdx.x / dm.G, g = blockIdx.x % dm.G, unit = blockIdx.y;
    const int slot = s.row_slot[b], t = s.row_pos[b];
    const int H = dm.H, hpg = H / dm.G, dk = dm.dk, dv = dm.dv;
    const int units = dm.sel_units + dm.win_units;
    const size_t sg = (size_t)slot * dm.G + g;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;

    /* this unit's keys: positions [first, end) of k_sel (sel) or the ring (win) */
    int first = 0, end = 0, ring = 0;
    if (unit < dm.sel_units) {
        const int parts = dm.sel_units / dm.slots, n = unit / parts, part = unit % parts;
        const int j = s.sel[((size_t)b * dm.G + g) * dm.slots + n];
        if (j >= 0) {
            first = j * dm.l_sel + part * DEC_UNIT;
            end = first + DEC_UNIT;
            if (end > (j + 1) * dm.l_sel) end = (j + 1) * dm.l_sel;
            if (end > t + 1) end = t + 1;
        }
    } else {
        const int w0 = t - dm.window + 1 > 0 ? t - dm.window + 1 : 0;
        first = w0 + (unit - dm.sel_units) * DEC_UNIT;
        end = first + DEC_UNIT < t + 1 ? first + DEC_UNIT : t + 1;
        ring = 1;
    }
    const int n = end - first;
    const size_t part0 = ((size_t)b * H + g * hpg) * units + unit;
    if (n <= 0) {
        for (int hh = warp; hh < hpg; hh += warps) {
            const size_t p = part0 + (size_t)hh * units;
            if (lane == 0) {
                s.sw_m[p] = -INFINITY;
                s.sw_l[p] = 0.0f;
            }
            for (int e = lane; e < dv; e += 32) s.sw_o[p * dv + e] = 0.0f;
        }
        return;
    }
    const bf16 *kbase = ring ? c.k_win + sg * dm.W * dk : c.k_sel + sg * dm.T * dk;
    const bf16 *vbase = ring ? c.v_win + sg * dm.W * dv : c.v_sel + sg * dm.T * dv;
    for (int k = threadIdx.x; k < hpg * dk; k += blockDim.x)
        qs[k] = s.q[((size_t)b * H + g * hpg) * dk + k];
    __syncthreads();
    const float scale = rsqrtf((float)dk);
    for (int idx = threadIdx.x; idx < hpg * DEC_UNIT; idx += blockDim.x) {
        const int hh = idx / DEC_UNIT, k = idx % DEC_UNIT;
        if (k >= n) continue;
        const int u = first + k, row = ring ? u % dm.W : u;
        ps[hh][k] = scale * dotRow(qs + hh * dk, kbase + (size_t)row * dk, dk);
    }
    __syncthreads();
    for (int hh = warp; hh < hpg; hh += warps) {
        float m = -INFINITY;
        for (int k = lane; k < n; k += 32) m = fmaxf(m, ps[hh][k]);
        m = warpMax(m);
        float sum = 0.0f;
        for (int k = lane; k < n; k += 32) {
            const float p = __expf(ps[hh][k] - m);
            ps[hh][k] = p;
            sum += p;
        }
        sum = warpSum(sum);
        __syncwarp();
        const size_t p = part0 + (size_t)hh * units;
        if (lane == 0) {
            s.sw_m[p] = m;
            s.sw_l[p] = sum;
        }
        for (int e = lane; e < dv; e += 32) {
            float acc = 0.0f;
            for (int k = 0; k < n; k++) {
                const int u = first + k, row = ring ? u % dm.W : u;
                acc += ps[hh][k] * bf(vbase[(size_t)row * dv + e]);
            }
            s.sw_o[p * dv + e] = acc;
        }
    }
}

int decSelWin(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, cudaStream_t stream,
              NsaError *err) {
    decSelWinKernel<<<dim3(dm->B * dm->G, dm->sel_units + dm->win_units), 128, 0, stream>>>(
        *dm, *c, *s);
    LAUNCH_CHECK("decSelWinKernel", err);
    return 0;
}

/* ---- combine ---------------------------------------------------------------- */

/* o[e] of one head from partials [first, last) of its unit list. */
__device__ float mergeUnits(const DecScratch *s, size_t p0, int first, int last, int dv, int e) {
    float M = -INFINITY;
    for (int u = first; u < last; u++) M = fmaxf(M, s->sw_m[p0 + u]);
    if (M == -INFINITY) return 0.0f;
    float L = 0.0f, acc = 0.0f;
    for (int u = first; u < last; u++) {
        const float m = s->sw_m[p0 + u];
        if (m == -INFINITY) continue;
        const float w = __expf(m - M);
        L += s->sw_l[p0 + u] * w;
        acc += s->sw_o[(p0 + u) * dv + e] * w;
    }
    return acc / L;
}

__global__ void decCombineKernel(DecDims dm, DecScratch s) {
    const int b = blockIdx.x, h = blockIdx.y, dv = dm.dv;
    const int units = dm.sel_units + dm.win_units;
    const size_t p0 = ((size_t)b * dm.H + h) * units;
    const float *gl = s.proj + (size_t)b * dm.proj_stride + dm.proj_stride - 3 * dm.H + h * 3;
    const float g0 = 1.0f / (1.0f + __expf(-gl[0])), g1 = 1.0f / (1.0f + __expf(-gl[1]));
    const float g2 = 1.0f / (1.0f + __expf(-gl[2]));
    for (int e = threadIdx.x; e < dv; e += blockDim.x) {
        const float o_sel = mergeUnits(&s, p0, 0, dm.sel_units, dv, e);
        const float o_win = mergeUnits(&s, p0, dm.sel_units, units, dv, e);
        const float o_cmp = s.o_cmp[((size_t)b * dm.H + h) * dv + e];
        s.y[(size_t)b * dm.H * dv + (size_t)h * dv + e] =
            __float2bfloat16_rn(g0 * o_cmp + g1 * o_sel + g2 * o_win);
    }
}

int decCombine(const DecDims *dm, const DecScratch *s, cudaStream_t stream, NsaError *err) {
    decCombineKernel<<<dim3(dm->B, dm->H), 64, 0, stream>>>(*dm, *s);
    LAUNCH_CHECK("decCombineKernel", err);
    return 0;
}

/* ---- embedding and positions ------------------------------------------------- */

__global__ void decEmbedKernel(float *x, const float *tok_emb, const int *tokens, int C) {
    const int b = blockIdx.x;
    const float *row = tok_emb + (size_t)tokens[b] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) x[(size_t)b * C + c] = row[c];
}

int decEmbed(float *x, const float *tok_emb, const int *tokens, int B, int C, cudaStream_t stream,
             NsaError *err) {
    decEmbedKernel<<<B, 256, 0, stream>>>(x, tok_emb, tokens, C);
    LAUNCH_CHECK("decEmbedKernel", err);
    return 0;
}

__global__ void decAdvanceKernel(int *pos, const int *stage, int B, int prefill) {
    const int b = threadIdx.x;
    if (prefill) {
        if (b == 0) pos[stage[0]] += B;
    } else if (b < B) {
        pos[stage[0] + b] += 1;
    }
}

int decAdvance(int *pos, const int *stage, int B, int prefill, cudaStream_t stream, NsaError *err) {
    decAdvanceKernel<<<1, DEC_MAX_BATCH, 0, stream>>>(pos, stage, B, prefill);
    LAUNCH_CHECK("decAdvanceKernel", err);
    return 0;
}
