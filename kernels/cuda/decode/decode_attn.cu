/* decode_attn.cu - NSA attention of one decode step over the caches
 * (decode_ops.h; kernels/cpu/decode.c is the oracle). For each row (slot at
 * position t) and KV group g, with scale = 1/sqrt(dk):
 *
 *   append    q, k^c = RoPE(proj) at t; k^sel, v^sel -> row t; k^win, v^win
 *             -> ring row t % W; k^cmp, v^cmp -> raw ring row t % Lr
 *   pool      when t = i*d + l - 1, block i = phi(raw rows t-l+1 .. t) -> kc,
 *             vc
 *   cmp       s_i = scale q_h.kc_i over the visible blocks
 *             (n_t = floor((t-l+1)/d) + 1): o_cmp = softmax(s) vc
 *   select    lse_h of the compressed scores; p_i = sum_h exp(s_hi - lse_h);
 *             score_j = sum_i M_ij p_i (M_ij: the share of block i inside
 *             selection block j); blocks 0, t/l' and t/l' - 1, then the
 *             complete blocks with the highest scores (ties: lower j) up to
 *             n_sel
 *   sel, win  o_sel over the keys of the chosen blocks (<= t), o_win over
 *             [max(0, t-w+1), t]
 *   combine   y = sum_c sigmoid(gate_c) o_c
 *
 * One kernel (decAttnKernel) does it all for a row and group, on a cluster
 * of CTAs that hand their partials to each other through distributed shared
 * memory: the chain of dependent steps is walked by CTAs that wait on each
 * other at three cluster barriers, not by a kernel each that waits for the
 * whole grid of its predecessor. CTA r of the cluster owns the r-th share of
 * the selection blocks and the compressed blocks that start inside them, of
 * the selected keys and of the window; key and value rows are staged in
 * shared memory a tile at a time (coalesced 16-byte copies, the next tile in
 * flight while one is used) and merged online. Partials merge as
 * o = sum_u o_u exp(m_u - M) / sum_u l_u exp(m_u - M).
 * A decode step appends inside decAttnKernel (its rows are distinct slots);
 * a prefill pass's rows are positions of one slot, so decAppend and decPool
 * write every row's entries before decAttnKernel reads any.
 * Nothing here synchronises with the host or allocates; positions come from
 * device memory, so the kernels replay inside a CUDA graph. */
#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "../cuda_common.cuh"
#include "decode_ops.h"

__device__ __forceinline__ float bf(bf16 v) { return __bfloat162float(v); }

/* dot of an fp32 vector (shared memory) with a bf16 row, n % 8 == 0 */
__device__ __forceinline__ float dotRow(const float *q, const bf16 *k, int n) {
    float acc = 0.0f;
    const uint4 *k8 = (const uint4 *)k;
#pragma unroll 4
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

/* A thread per row b < B: decode: slot = stage[0] + b, row_pos[b] = pos[slot]; prefill (one slot's
 * B consecutive positions): slot = stage[0], row_pos[b] = pos[slot] + b. row_slot[b] = slot. */
__global__ void decRowsKernel(int *row_slot, int *row_pos, const int *stage, const int *pos, int B,
                              int prefill) {
    decWaitPrior();
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    const int slot = prefill ? stage[0] : stage[0] + b;
    row_slot[b] = slot;
    row_pos[b] = pos[slot] + (prefill ? b : 0);
    decLetNextLaunch();
}

int decRows(int *row_slot, int *row_pos, const int *stage, const int *pos, int B, int prefill,
            const DecLaunch *ln, NsaError *err) {
    DEC_LAUNCH("decRowsKernel", ln, err, decRowsKernel, dim3((B + 255) / 256), dim3(256), 0,
               row_slot, row_pos, stage, pos, B, prefill);
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

/* Row b's entries at t = row_pos[b] for group g (slot-group sg), by the
 * calling CTA: per branch k = RoPE_t(k of proj), v as is: cmp -> raw ring row
 * t % Lr (fp32), sel -> k_sel, v_sel row t, win -> ring row t % W (bf16).
 * RoPE_t turns each pair (x_i, x_{i+dk/2}) into (x_i cos - x_{i+dk/2} sin,
 * x_i sin + x_{i+dk/2} cos), s.rope row t. */
__device__ void appendRow(const DecDims &dm, const DecLayerCache &c, const DecScratch &s, int b,
                          int g, size_t sg, int t) {
    const int H = dm.H, G = dm.G, dk = dm.dk, dv = dm.dv, half = dk / 2;
    const float *pr = s.proj + (size_t)b * dm.proj_stride;
    const float *cs = s.rope + (size_t)t * dk;   /* [half][2] */
    const int qn = H * dk, kn = G * dk, vn = G * dv, Lr = dm.raw_ring;
    const int off_k[3] = {qn, qn + kn + vn, qn + 2 * (kn + vn)};
    const int off_v[3] = {qn + kn, qn + 2 * kn + vn, qn + 3 * kn + 2 * vn};
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
}

/* A prefill pass's appends: a CTA per (row b, group g), appendRow. */
__global__ void decAppendKernel(DecDims dm, DecLayerCache c, DecScratch s) {
    decWaitPrior();
    const int b = blockIdx.x, g = blockIdx.y;
    appendRow(dm, c, s, b, g, (size_t)s.row_slot[b] * dm.G + g, s.row_pos[b]);
    decLetNextLaunch();
}

/* A CTA per (row b, group g): when t = row_pos[b] completes block i = (t - l + 1) / d,
 * kc_i, vc_i = phi(raw ring rows t-l+1 .. t) (avg: their mean; mlp: mean + W2 silu(W1 vec(X + P)));
 * poolBlock. */
__global__ void decPoolKernel(DecDims dm, DecLayerCache c, DecScratch s) {
    decWaitPrior();
    extern __shared__ float pool_u[];
    __shared__ float hidden[DEC_MAX_HEAD_DIM];
    const int b = blockIdx.x, g = blockIdx.y;
    poolBlock(dm, c, (size_t)s.row_slot[b] * dm.G + g, s.row_pos[b], pool_u, hidden);
    decLetNextLaunch();
}

static size_t poolSmem(const DecDims *dm) {
    const int dmax = dm->dk > dm->dv ? dm->dk : dm->dv;
    return dm->phi_mlp ? (size_t)dm->l * dmax * sizeof(float) : 0;
}

int decAppend(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
              NsaError *err) {
    DEC_LAUNCH("decAppendKernel", ln, err, decAppendKernel, dim3(dm->B, dm->G), dim3(128), 0, *dm,
               *c, *s);
    return 0;
}

int decPool(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
            NsaError *err) {
    DEC_LAUNCH("decPoolKernel", ln, err, decPoolKernel, dim3(dm->B, dm->G), dim3(128),
               poolSmem(dm), *dm, *c, *s);
    return 0;
}

/* ---- the attention kernel ------------------------------------------------------ */

namespace cg = cooperative_groups;

/* The CTA's cluster: its rank, the barrier, another CTA's shared memory.
 * Code for GPUs before Hopper has no clusters: there decAttnPrepare picks
 * a cluster of one CTA, whose barrier is __syncthreads. */
struct AttnCluster {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::cluster_group cl;
    __device__ AttnCluster() : cl(cg::this_cluster()) {}
    __device__ int rank() const { return (int)cl.block_rank(); }
    __device__ void sync() { cl.sync(); }
    template <class T>
    __device__ T *map(T *p, int r) {
        return cl.map_shared_rank(p, r);
    }
#else
    __device__ int rank() const { return 0; }
    __device__ void sync() { __syncthreads(); }
    template <class T>
    __device__ T *map(T *p, int) {
        return p;
    }
#endif
};

#define ATTN_THREADS 256
#define ATTN_OUTS (DEC_MAX_HEADS_PER_GROUP * DEC_MAX_HEAD_DIM / ATTN_THREADS)

__host__ __device__ static inline int ceilDivInt(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ static inline int align4(int words) { return (words + 3) / 4 * 4; }

/* Where decAttnKernel keeps what in its dynamic shared memory: offsets in
 * 4-byte words, every region 16-byte aligned. The partials (part_*) and the
 * candidate list are read by the cluster's other CTAs. */
typedef struct AttnLayout {
    int qs;         /* [hpg][dk] rotated q */
    int ps;         /* [hpg][tile] a tile's scores, then probabilities */
    int stat;       /* [3][hpg] running max, running sum, this tile's rescale */
    int part_m;     /* [3][hpg] this CTA's partial per branch (cmp, sel, win): max */
    int part_l;     /* [3][hpg] sum */
    int part_o;     /* [3][hpg][dv] unnormalised output */
    int scores;     /* [hpg][span_max] scaled compressed scores of the CTA's span */
    int P;          /* [span_max] p_i summed over the group's heads */
    int lse;        /* [hpg] */
    int key;        /* [sel_per] selection scores (bits) of the CTA's blocks */
    int cand;       /* [sel_per] whether each is a candidate */
    int cand_list;  /* [cand_cap] int2 (score bits, j): the CTA's best, in order */
    int merged;     /* [cluster][cand_cap] int2: every CTA's list */
    int counts;     /* [cluster] entries of each list */
    int chosen;     /* [slots] the chosen blocks as found */
    int sel_list;   /* [slots] the chosen blocks ascending, -1 padded */
    int misc;       /* [4] the chosen count */
    int rstat;      /* [2][cluster][max(hpg, 3)] every CTA's max and sum (compressed; then
                     * one head's three branches) */
    int wts;        /* [3][cluster] the combine's merge weights */
    int comb;       /* [3][dv] the combine's branch outputs */
    int tiles;      /* three key/value tile buffers (bf16), or phi = mlp's pooling input */
    int total;
} AttnLayout;

/* Words of one key/value tile buffer: [tile][dk + 8] keys (padded so that
 * neighbouring threads' 16-byte reads fall in different banks), [tile][dv]
 * values, bf16. */
__host__ __device__ static inline int tileWords(const DecDims &dm) {
    return dm.tile * (dm.dk + 8 + dm.dv) / 2;
}

__host__ __device__ static inline AttnLayout attnLayout(const DecDims &dm) {
    const int hpg = dm.H / dm.G, CL = dm.cluster;
    AttnLayout L;
    int at = 0;
#define ATTN_TAKE(field, words) \
    do {                        \
        L.field = at;           \
        at += align4(words);    \
    } while (0)
    ATTN_TAKE(qs, hpg * dm.dk);
    ATTN_TAKE(ps, hpg * dm.tile);
    ATTN_TAKE(stat, 3 * hpg);
    ATTN_TAKE(part_m, 3 * hpg);
    ATTN_TAKE(part_l, 3 * hpg);
    ATTN_TAKE(part_o, 3 * hpg * dm.dv);
    ATTN_TAKE(scores, hpg * dm.span_max);
    ATTN_TAKE(P, dm.span_max);
    ATTN_TAKE(lse, hpg);
    ATTN_TAKE(key, dm.sel_per);
    ATTN_TAKE(cand, dm.sel_per);
    ATTN_TAKE(cand_list, 2 * dm.cand_cap);
    ATTN_TAKE(merged, 2 * CL * dm.cand_cap);
    ATTN_TAKE(counts, CL);
    ATTN_TAKE(chosen, dm.slots);
    ATTN_TAKE(sel_list, dm.slots);
    ATTN_TAKE(misc, 4);
    ATTN_TAKE(rstat, 2 * CL * (hpg > 3 ? hpg : 3));
    ATTN_TAKE(wts, 3 * CL);
    ATTN_TAKE(comb, 3 * dm.dv);
    const int dmax = dm.dk > dm.dv ? dm.dk : dm.dv;
    const int pool = dm.phi_mlp ? dm.l * dmax : 0;
    ATTN_TAKE(tiles, 3 * tileWords(dm) > pool ? 3 * tileWords(dm) : pool);
#undef ATTN_TAKE
    L.total = at;
    return L;
}

typedef struct TileBuf {
    bf16 *ks, *vs;
} TileBuf;

__device__ __forceinline__ TileBuf tileBuf(const DecDims &dm, float *smem, const AttnLayout &L,
                                           int i) {
    TileBuf t;
    t.ks = (bf16 *)(smem + L.tiles + i * tileWords(dm));
    t.vs = t.ks + dm.tile * (dm.dk + 8);
    return t;
}

struct IdentityRow {
    int first;
    __device__ int operator()(int k) const { return first + k; }
};
struct RingRow {
    int first, ring;
    __device__ int operator()(int k) const { return (first + k) % ring; }
};
/* Key k of a CTA's share of the selected keys: virtual key first + k, the
 * (v % l')-th key of the (v / l')-th chosen block. */
struct SelectedRow {
    const int *list;
    int first, l_sel;
    __device__ int operator()(int k) const {
        const int v = first + k;
        return list[v / l_sel] * l_sel + v % l_sel;
    }
};

/* Asynchronous 16-byte copies of keys k0 .. k0 + nt - 1 (rows rowOf(k) of
 * kbase, vbase) into buf, committed as one group. */
template <class RowOf>
__device__ void issueTile(const DecDims &dm, TileBuf buf, int k0, int nt, RowOf rowOf,
                          const bf16 *kbase, const bf16 *vbase) {
    const int ck = dm.dk / 8, cv = dm.dv / 8, ks_stride = dm.dk + 8;
    for (int idx = threadIdx.x; idx < nt * (ck + cv); idx += blockDim.x) {
        const int k = idx / (ck + cv), c = idx % (ck + cv);
        const size_t row = (size_t)rowOf(k0 + k);
        if (c < ck)
            __pipeline_memcpy_async(buf.ks + k * ks_stride + c * 8, kbase + row * dm.dk + c * 8, 16);
        else
            __pipeline_memcpy_async(buf.vs + k * dm.dv + (c - ck) * 8,
                                    vbase + row * dm.dv + (c - ck) * 8, 16);
    }
    __pipeline_commit();
}

/* Partial attention (max m, sum l, unnormalised o) of the group's hpg heads
 * (q in shared memory, qs) over n keys, a tile at a time, the next tile's
 * copies in flight while one is used; keys [own_lo, own_hi) enter the
 * softmax, and every key's scaled score goes to scores[hh * span_max + k]
 * when scores is not NULL. Tiles alternate between buffers first and
 * second; pre_issued: the caller already issued tile 0 into first. Writes
 * this CTA's branch partial (part_m, part_l, part_o). Every thread calls it. */
template <class RowOf>
__device__ void attendTiles(const DecDims &dm, float *smem, const AttnLayout &L, int n,
                            RowOf rowOf, const bf16 *kbase, const bf16 *vbase, int own_lo,
                            int own_hi, float *scores, bool pre_issued, TileBuf first,
                            TileBuf second, int branch) {
    const int hpg = dm.H / dm.G, dk = dm.dk, dv = dm.dv, ks_stride = dk + 8, TK = dm.tile;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float scale = rsqrtf((float)dk);
    const float *qs = smem + L.qs;
    float *ps = smem + L.ps, *stat = smem + L.stat;
    if (!pre_issued && n > 0) issueTile(dm, first, 0, n < TK ? n : TK, rowOf, kbase, vbase);
    /* before any barrier: the previous call's last reads of stat[hh] were
     * this same thread's (its partial's m and l) */
    for (int hh = threadIdx.x; hh < hpg; hh += blockDim.x) {
        stat[hh] = -INFINITY;
        stat[hpg + hh] = 0.0f;
    }
    float acc[ATTN_OUTS];
#pragma unroll
    for (int r = 0; r < ATTN_OUTS; r++) acc[r] = 0.0f;
    int tile = 0;
    for (int k0 = 0; k0 < n; k0 += TK, tile++) {
        const int nt = n - k0 < TK ? n - k0 : TK;
        const TileBuf cur = tile & 1 ? second : first;
        __syncthreads();   /* the previous tile is done with ps and the buffer refilled next */
        if (k0 + TK < n) {
            const int nn = n - k0 - TK < TK ? n - k0 - TK : TK;
            issueTile(dm, tile & 1 ? first : second, k0 + TK, nn, rowOf, kbase, vbase);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < hpg * TK; idx += blockDim.x) {
            const int hh = idx / TK, k = idx % TK;
            if (k >= nt) continue;
            const float sc = scale * dotRow(qs + hh * dk, cur.ks + k * ks_stride, dk);
            if (scores) scores[hh * dm.span_max + k0 + k] = sc;
            ps[idx] = k0 + k >= own_lo && k0 + k < own_hi ? sc : -INFINITY;
        }
        __syncthreads();
        for (int hh = warp; hh < hpg; hh += warps) {
            float *p = ps + hh * TK;
            float mt = -INFINITY;
            for (int k = lane; k < nt; k += 32) mt = fmaxf(mt, p[k]);
            mt = warpMax(mt);
            const float m_old = stat[hh], m_new = fmaxf(m_old, mt);
            float sum = 0.0f;
            for (int k = lane; k < nt; k += 32) {
                const float e = p[k] == -INFINITY ? 0.0f : __expf(p[k] - m_new);
                p[k] = e;
                sum += e;
            }
            sum = warpSum(sum);
            __syncwarp();
            if (lane == 0) {
                const float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
                stat[hh] = m_new;
                stat[hpg + hh] = stat[hpg + hh] * alpha + sum;
                stat[2 * hpg + hh] = alpha;
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ATTN_OUTS; r++) {
            const int idx = threadIdx.x + r * ATTN_THREADS;
            if (idx < hpg * dv) {
                const int hh = idx / dv, e = idx % dv;
                const float *p = ps + hh * TK;
                float a = 0.0f;
#pragma unroll 8
                for (int k = 0; k < nt; k++) a += p[k] * bf(cur.vs[k * dv + e]);
                acc[r] = acc[r] * stat[2 * hpg + hh] + a;
            }
        }
    }
    __syncthreads();   /* stat is final (also when n == 0: the empty partial) */
    for (int hh = threadIdx.x; hh < hpg; hh += blockDim.x) {
        smem[L.part_m + branch * hpg + hh] = stat[hh];
        smem[L.part_l + branch * hpg + hh] = stat[hpg + hh];
    }
#pragma unroll
    for (int r = 0; r < ATTN_OUTS; r++) {
        const int idx = threadIdx.x + r * ATTN_THREADS;
        if (idx < hpg * dv) smem[L.part_o + branch * hpg * dv + idx] = acc[r];
    }
}

/* ---- selection ------------------------------------------------------------------ */

/* The selection facts of a row at position t. */
typedef struct SelRow {
    int Ns;           /* blocks up to the current one: t / l' + 1 */
    int current;      /* the block t is in */
    int n_complete;   /* blocks that end at or before t: candidates */
    int want;         /* blocks chosen by score: n_sel minus the forced ones */
} SelRow;

__device__ __forceinline__ SelRow selRow(int t, int l_sel, int n_sel) {
    SelRow r;
    r.Ns = t / l_sel + 1;
    r.current = t / l_sel;
    r.n_complete = (t + 1) / l_sel;
    r.want = n_sel - (1 + (r.current != 0) + (r.current >= 2));   /* 0, current, current-1 */
    return r;
}

__device__ __forceinline__ int selForced(int j, int current) {
    return j == 0 || j == current || j == current - 1;
}

/* Candidates among blocks [lo, end): complete and not forced. */
__device__ __forceinline__ int selCandidatesIn(int lo, int end, const SelRow &r) {
    const int e = end < r.n_complete ? end : r.n_complete;
    if (e <= lo) return 0;
    int n = e - lo;
    n -= lo == 0;   /* block 0 */
    if (r.current != 0 && r.current >= lo && r.current < e) n--;
    if (r.current >= 2 && r.current - 1 >= lo && r.current - 1 < e) n--;
    return n;
}

/* Compressed blocks [*first, *last] overlapping the tokens of selection
 * blocks j_lo .. j_hi, clamped to the n_vis visible ones (*last < *first
 * when none is). Block i covers tokens [i d, i d + l). */
__host__ __device__ static inline void cmpSpan(int j_lo, int j_hi, int l, int d, int l_sel,
                                               int n_vis, int *first, int *last) {
    const int lo_tok = j_lo * l_sel, hi_tok = (j_hi + 1) * l_sel;
    *first = lo_tok - l < 0 ? 0 : (lo_tok - l) / d + 1;
    const int hi = (hi_tok - 1) / d;
    *last = hi < n_vis - 1 ? hi : n_vis - 1;
}

/* Whether candidate a comes before b: score descending, then block ascending
 * (scores are >= 0, so their bits order like them). */
__device__ __forceinline__ bool selBefore(int2 a, int2 b) {
    return (unsigned)a.x > (unsigned)b.x || ((unsigned)a.x == (unsigned)b.x && a.y < b.y);
}

/* A CTA's share of the selection: blocks [j_lo, j_hi) of the row (the same
 * split in every CTA). */
__device__ __forceinline__ void selShare(const SelRow &row, int cluster, int rank, int *j_lo,
                                         int *j_hi) {
    const int per = ceilDivInt(row.Ns, cluster);
    *j_lo = rank * per < row.Ns ? rank * per : row.Ns;
    *j_hi = *j_lo + per < row.Ns ? *j_lo + per : row.Ns;
}

/* The CTA's candidates: p_i = sum_h exp(s_hi - lse_h) (head order) over the
 * compressed blocks overlapping its selection blocks [j_lo, j_hi) (scores
 * from k_first on), score_j = sum_i (share of block i inside j) p_i, and
 * its best min(want, cand_cap) candidates into cand_list in order. */
__device__ void selectLocal(const DecDims &dm, float *smem, const AttnLayout &L, const SelRow &row,
                            int j_lo, int j_hi, int k_first, int n_vis) {
    const int hpg = dm.H / dm.G, l = dm.l, d = dm.d, ls = dm.l_sel, jn = j_hi - j_lo;
    const float *scores = smem + L.scores, *lse = smem + L.lse;
    float *P = smem + L.P;
    unsigned *key = (unsigned *)(smem + L.key);
    int *cand = (int *)(smem + L.cand);
    int2 *list = (int2 *)(smem + L.cand_list);
    if (jn <= 0) return;   /* uniform over the CTA */
    int i_first, i_last;
    cmpSpan(j_lo, j_hi - 1, l, d, ls, n_vis, &i_first, &i_last);
    for (int i = i_first + threadIdx.x; i <= i_last; i += blockDim.x) {
        float acc = 0.0f;
        for (int hh = 0; hh < hpg; hh++)
            acc += __expf(scores[hh * dm.span_max + i - k_first] - lse[hh]);
        P[i - k_first] = acc;
    }
    __syncthreads();
    for (int jj = threadIdx.x; jj < jn; jj += blockDim.x) {
        const int j = j_lo + jj;
        int lo, hi;
        cmpSpan(j, j, l, d, ls, n_vis, &lo, &hi);
        float acc = 0.0f;
        for (int i = lo; i <= hi; i++) {
            const int first = i * d, end = i * d + l;
            const int a = first > j * ls ? first : j * ls;
            const int e = end < (j + 1) * ls ? end : (j + 1) * ls;
            acc += (float)(e - a) / (float)l * P[i - k_first];
        }
        key[jj] = __float_as_uint(acc);
        cand[jj] = j < row.n_complete && !selForced(j, row.current);
    }
    __syncthreads();
    const int cap = row.want < dm.cand_cap ? row.want : dm.cand_cap;
    for (int jj = threadIdx.x; jj < jn; jj += blockDim.x) {
        if (!cand[jj]) continue;
        const int2 me = make_int2((int)key[jj], j_lo + jj);
        int rank = 0;
        for (int o = 0; o < jn; o++)
            rank += cand[o] && selBefore(make_int2((int)key[o], j_lo + o), me);
        if (rank < cap) list[rank] = me;
    }
}

/* The row's set from every CTA's candidates (read from the cluster's shared
 * memory after a cluster barrier): the forced blocks, then the candidates
 * whose rank among all is below want - a candidate's rank is its rank in
 * its own list plus, in every other list, the length of the prefix before
 * it (a binary search a list) - into sel_list ascending, -1 padded. Returns
 * nothing; sel_list and misc[0] (the count) are final after the caller's
 * __syncthreads. */
__device__ void selectMerge(const DecDims &dm, float *smem, const AttnLayout &L,
                            AttnCluster &cluster, const SelRow &row) {
    const int CL = dm.cluster;
    const int per = row.want <= 0 ? 0 : row.want < dm.cand_cap ? row.want : dm.cand_cap;
    int2 *merged = (int2 *)(smem + L.merged);
    int *counts = (int *)(smem + L.counts), *chosen = (int *)(smem + L.chosen);
    int *misc = (int *)(smem + L.misc), *out = (int *)(smem + L.sel_list);
    for (int r = threadIdx.x; r < CL; r += blockDim.x) {
        int lo, hi;
        selShare(row, CL, r, &lo, &hi);
        const int n = selCandidatesIn(lo, hi, row);
        counts[r] = n < per ? n : per;
    }
    if (threadIdx.x == 0) {
        int n = 0;
        chosen[n++] = 0;
        if (row.current != 0) chosen[n++] = row.current;
        if (row.current >= 2) chosen[n++] = row.current - 1;
        misc[0] = n;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < CL * per; idx += blockDim.x) {
        const int r = idx / per, k = idx % per;
        if (k < counts[r])
            merged[idx] = ((const int2 *)cluster.map(smem + L.cand_list, r))[k];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < CL * per; idx += blockDim.x) {
        const int me_r = idx / per, me_k = idx % per;
        if (me_k >= counts[me_r]) continue;
        const int2 me = merged[idx];
        int rank = me_k;
        for (int r = 0; r < CL && rank < row.want; r++) {
            if (r == me_r) continue;
            const int2 *list = merged + (size_t)r * per;
            int lo = 0, hi = counts[r];
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (selBefore(list[mid], me)) lo = mid + 1;
                else hi = mid;
            }
            rank += lo;
        }
        if (rank < row.want) chosen[atomicAdd(&misc[0], 1)] = me.y;
    }
    __syncthreads();
    const int n = misc[0];
    for (int k = threadIdx.x; k < dm.slots; k += blockDim.x) {
        if (k >= n) {
            out[k] = -1;
            continue;
        }
        const int j = chosen[k];
        int at = 0;
        for (int o = 0; o < n; o++) at += chosen[o] < j;
        out[at] = j;
    }
}

/* ---- the kernel ------------------------------------------------------------------ */

/* A cluster of dm.cluster CTAs per (row b, group g): grid (cluster, B*G).
 * 1. (decode) the CTA owning the newest visible compressed block appends the
 *    row (appendRow) and pools the block t completes (poolBlock);
 *    every CTA rotates q and attends its compressed blocks -> partial 0,
 *    keeping the scores of the blocks its selection blocks overlap;
 * 2. barrier; lse_h from every CTA's partial 0; the CTA's candidates;
 *    its window tile is requested;
 * 3. barrier; the set from every CTA's candidates; the CTA's share of the
 *    selected keys -> partial 1, of the window -> partial 2;
 * 4. barrier; CTA r combines head r (r + cluster, ...): each branch's
 *    partials merged, y = sum_c sigmoid(gate_c) o_c;
 * 5. barrier: no CTA leaves while its partials may still be read. */
__global__ void __launch_bounds__(ATTN_THREADS) decAttnKernel(DecDims dm, DecLayerCache c,
                                                              DecScratch s) {
    decWaitPrior();
    extern __shared__ float4 smem_attn[];
    __shared__ float hidden[DEC_MAX_HEAD_DIM];
    float *smem = (float *)smem_attn;
    AttnCluster cluster;
    const int CL = dm.cluster, rank = (int)cluster.rank();
    const int b = blockIdx.y / dm.G, g = blockIdx.y % dm.G;
    const int hpg = dm.H / dm.G, dk = dm.dk, dv = dm.dv, half = dk / 2;
    const int l = dm.l, d = dm.d, ls = dm.l_sel;
    const int slot = s.row_slot[b], t = s.row_pos[b];
    const size_t sg = (size_t)slot * dm.G + g;
    const AttnLayout L = attnLayout(dm);
    const int n_vis = visibleBlocks(t, l, d);
    const SelRow row = selRow(t, ls, dm.n_sel);
    const bool choose = row.want > 0;
    const TileBuf buf0 = tileBuf(dm, smem, L, 0), buf1 = tileBuf(dm, smem, L, 1);
    const TileBuf buf2 = tileBuf(dm, smem, L, 2);

    /* 1. this CTA's selection blocks [j_lo, j_hi), the compressed blocks that
     * start inside them [i_lo, i_hi) (every visible block is some CTA's), and
     * the keys it scores: from the first block overlapping j_lo */
    int j_lo, j_hi;
    selShare(row, CL, rank, &j_lo, &j_hi);
    const int i_lo = min(ceilDivInt(j_lo * ls, d), n_vis);
    const int i_hi = min(ceilDivInt(j_hi * ls, d), n_vis);
    int k_first = i_lo;
    if (choose && j_hi > j_lo) {
        int f, last;
        cmpSpan(j_lo, j_hi - 1, l, d, ls, n_vis, &f, &last);
        k_first = f < k_first ? f : k_first;
    }
    const bool appends =
        dm.append_in_attn && (n_vis == 0 ? rank == 0 : i_lo <= n_vis - 1 && n_vis - 1 < i_hi);
    if (appends) {
        appendRow(dm, c, s, b, g, sg, t);
        __syncthreads();   /* the raw rows above are the block's last */
        poolBlock(dm, c, sg, t, smem + L.tiles, hidden);
        __syncthreads();   /* the cluster reads the appended rows after its barrier */
    }
    /* a decode step's newest block, pooled by its owner in this step, may
     * also be the last key another CTA scores (one that owns no compressed
     * block: i_lo = i_hi = n_vis, its first selection block overlapping the
     * newest block): that CTA scores it after the first barrier instead */
    const bool rescore = dm.append_in_attn && !appends && choose && n_vis > 0 &&
                         (t - l + 1) % d == 0 && k_first <= n_vis - 1 && n_vis - 1 < i_hi;
    const int n_cmp = i_hi - k_first - (rescore ? 1 : 0);
    const bf16 *kc = c.kc + sg * dm.Nc * dk, *vc = c.vc + sg * dm.Nc * dv;
    if (n_cmp > 0) issueTile(dm, buf0, 0, n_cmp < dm.tile ? n_cmp : dm.tile, IdentityRow{k_first}, kc, vc);
    {
        const float *pr = s.proj + (size_t)b * dm.proj_stride;
        const float *cs = s.rope + (size_t)t * dk;
        float *qs = smem + L.qs;
        for (int idx = threadIdx.x; idx < hpg * half; idx += blockDim.x) {
            const int hh = idx / half, i = idx % half, h = g * hpg + hh;
            const float x0 = pr[h * dk + i], x1 = pr[h * dk + i + half];
            const float co = cs[2 * i], si = cs[2 * i + 1];
            qs[hh * dk + i] = x0 * co - x1 * si;
            qs[hh * dk + i + half] = x0 * si + x1 * co;
        }
    }
    attendTiles(dm, smem, L, n_cmp, IdentityRow{k_first}, kc, vc, i_lo - k_first, i_hi - k_first,
                choose ? smem + L.scores : NULL, true, buf0, buf1, 0);
    cluster.sync();

    /* 2. the window share's first tile; lse; the CTA's candidates */
    const int w0 = t - dm.window + 1 > 0 ? t - dm.window + 1 : 0, n_win_all = t - w0 + 1;
    const int wper = ceilDivInt(n_win_all, CL);
    const int wa = min(rank * wper, n_win_all), n_win = min(wa + wper, n_win_all) - wa;
    const bf16 *kw = c.k_win + sg * dm.W * dk, *vw = c.v_win + sg * dm.W * dv;
    if (n_win > 0)
        issueTile(dm, buf2, 0, n_win < dm.tile ? n_win : dm.tile, RingRow{w0 + wa, dm.W}, kw, vw);
    if (choose) {
        float *rstat = smem + L.rstat, *lse = smem + L.lse;
        for (int hh = threadIdx.x; rescore && hh < hpg; hh += blockDim.x)
            smem[L.scores + hh * dm.span_max + n_vis - 1 - k_first] =
                rsqrtf((float)dk) * dotRow(smem + L.qs + hh * dk, kc + (size_t)(n_vis - 1) * dk, dk);
        for (int idx = threadIdx.x; idx < CL * hpg; idx += blockDim.x) {
            const int r = idx / hpg, hh = idx % hpg;
            rstat[idx] = cluster.map(smem + L.part_m, r)[hh];
            rstat[CL * hpg + idx] = cluster.map(smem + L.part_l, r)[hh];
        }
        __syncthreads();
        for (int hh = threadIdx.x; hh < hpg; hh += blockDim.x) {
            float M = -INFINITY;
            for (int r = 0; r < CL; r++) M = fmaxf(M, rstat[r * hpg + hh]);
            float S = 0.0f;
            for (int r = 0; r < CL; r++) {
                const float m = rstat[r * hpg + hh];
                if (m != -INFINITY) S += rstat[CL * hpg + r * hpg + hh] * __expf(m - M);
            }
            lse[hh] = M == -INFINITY ? -INFINITY : M + __logf(S);
        }
        __syncthreads();
        selectLocal(dm, smem, L, row, j_lo, j_hi, k_first, n_vis);
    }
    cluster.sync();

    /* 3. the set; the selected keys ((n - 1) whole blocks and the current
     * one up to t: the set ascending ends with it) and the window */
    selectMerge(dm, smem, L, cluster, row);
    __syncthreads();
    const int n_sel_keys = (((int *)(smem + L.misc))[0] - 1) * ls + t - row.current * ls + 1;
    const int vper = ceilDivInt(n_sel_keys, CL);
    const int va = min(rank * vper, n_sel_keys), n_mine = min(va + vper, n_sel_keys) - va;
    attendTiles(dm, smem, L, n_mine, SelectedRow{(const int *)(smem + L.sel_list), va, ls},
                c.k_sel + sg * dm.T * dk, c.v_sel + sg * dm.T * dv, 0, n_mine, NULL, false, buf0,
                buf1, 1);
    attendTiles(dm, smem, L, n_win, RingRow{w0 + wa, dm.W}, kw, vw, 0, n_win, NULL, true, buf2,
                buf0, 2);
    cluster.sync();

    /* 4. combine: CTA r takes heads r, r + CL, ... */
    const float *gl = s.proj + (size_t)b * dm.proj_stride + dm.proj_stride - 3 * dm.H;
    float *wts = smem + L.wts, *comb = smem + L.comb, *rstat = smem + L.rstat;
    for (int hh = rank; hh < hpg; hh += CL) {
        for (int idx = threadIdx.x; idx < 3 * CL; idx += blockDim.x) {
            const int br = idx / CL, r = idx % CL;
            rstat[idx] = cluster.map(smem + L.part_m, r)[br * hpg + hh];
            rstat[3 * CL + idx] = cluster.map(smem + L.part_l, r)[br * hpg + hh];
        }
        __syncthreads();
        if (threadIdx.x < 3) {
            const int br = threadIdx.x;
            const float *m = rstat + br * CL, *lsum = rstat + 3 * CL + br * CL;
            float M = -INFINITY;
            for (int r = 0; r < CL; r++) M = fmaxf(M, m[r]);
            float S = 0.0f;
            for (int r = 0; r < CL; r++)
                if (m[r] != -INFINITY) S += lsum[r] * __expf(m[r] - M);
            for (int r = 0; r < CL; r++)
                wts[br * CL + r] =
                    M == -INFINITY || m[r] == -INFINITY ? 0.0f : __expf(m[r] - M) / S;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < 3 * dv; idx += blockDim.x) {
            const int br = idx / dv, e = idx % dv;
            const int at = L.part_o + (br * hpg + hh) * dv + e;
            float o[DEC_MAX_CLUSTER];
#pragma unroll
            for (int r = 0; r < DEC_MAX_CLUSTER; r++)
                o[r] = r < CL ? cluster.map(smem + at, r)[0] : 0.0f;
            float acc = 0.0f;
#pragma unroll
            for (int r = 0; r < DEC_MAX_CLUSTER; r++)
                if (r < CL) acc += wts[br * CL + r] * o[r];
            comb[idx] = acc;
        }
        __syncthreads();
        const int h = g * hpg + hh;
        const float g0 = 1.0f / (1.0f + __expf(-gl[h * 3])), g1 = 1.0f / (1.0f + __expf(-gl[h * 3 + 1]));
        const float g2 = 1.0f / (1.0f + __expf(-gl[h * 3 + 2]));
        for (int e = threadIdx.x; e < dv; e += blockDim.x)
            s.y[(size_t)b * dm.H * dv + (size_t)h * dv + e] =
                __float2bfloat16_rn(g0 * comb[e] + g1 * comb[dv + e] + g2 * comb[2 * dv + e]);
        __syncthreads();
    }
    cluster.sync();
    decLetNextLaunch();
}

/* The launch of `clusters` clusters of CL CTAs (grid (CL, clusters)) with
 * smem bytes each; attrs[0] becomes the cluster attribute, left out for a
 * cluster of one (GPUs before Hopper have none): cfg.attrs, cfg.numAttrs
 * name it or nothing. */
static cudaLaunchConfig_t clusterLaunch(int CL, int clusters, size_t smem,
                                        cudaLaunchAttribute *attrs) {
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = (unsigned)CL;
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)CL, (unsigned)clusters);
    cfg.blockDim = dim3(ATTN_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = attrs;
    cfg.numAttrs = CL > 1;
    return cfg;
}

/* Launches decAttnKernel with its cluster (and the overlap of ln). */
static cudaError_t launchAttn(const DecDims *dm, const DecLayerCache *c, const DecScratch *s,
                              const DecLaunch *ln) {
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = clusterLaunch(dm->cluster, dm->B * dm->G,
                                           (size_t)attnLayout(*dm).total * sizeof(float), attr);
    cfg.stream = ln->stream;
    if (ln->overlap) {
        attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs++;
    }
    return cudaLaunchKernelEx(&cfg, decAttnKernel, *dm, *c, *s);
}

int decAttn(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
            NsaError *err) {
    const cudaError_t e = launchAttn(dm, c, s, ln);
    if (e != cudaSuccess)
        return nsaErrorf(err, "cuda: launch of decAttnKernel (cluster %d, %d rows) failed: %s",
                         dm->cluster, dm->B, cudaGetErrorString(e));
    return 0;
}

/* ---- the selection alone (test_decode) -------------------------------------------- */

/* A cluster for row 0, group 0 at position t: compressed scores given
 * ([hpg][Nc], lse taken as 0), the set into out [slots]. */
__global__ void __launch_bounds__(ATTN_THREADS) decSelectCheckKernel(DecDims dm, const float *sc,
                                                                     int t, int *out) {
    extern __shared__ float4 smem_check[];
    float *smem = (float *)smem_check;
    AttnCluster cluster;
    const int rank = (int)cluster.rank(), hpg = dm.H / dm.G;
    const AttnLayout L = attnLayout(dm);
    const int n_vis = visibleBlocks(t, dm.l, dm.d);
    const SelRow row = selRow(t, dm.l_sel, dm.n_sel);
    int j_lo, j_hi;
    selShare(row, dm.cluster, rank, &j_lo, &j_hi);
    int k_first = 0, last = -1;
    if (j_hi > j_lo) cmpSpan(j_lo, j_hi - 1, dm.l, dm.d, dm.l_sel, n_vis, &k_first, &last);
    for (int idx = threadIdx.x; idx < hpg * dm.span_max; idx += blockDim.x) {
        const int hh = idx / dm.span_max, i = k_first + idx % dm.span_max;
        if (i <= last) smem[L.scores + idx] = sc[(size_t)hh * dm.Nc + i];
    }
    for (int hh = threadIdx.x; hh < hpg; hh += blockDim.x) smem[L.lse + hh] = 0.0f;
    __syncthreads();
    if (row.want > 0) selectLocal(dm, smem, L, row, j_lo, j_hi, k_first, n_vis);
    cluster.sync();
    selectMerge(dm, smem, L, cluster, row);
    __syncthreads();
    if (rank == 0)
        for (int k = threadIdx.x; k < dm.slots; k += blockDim.x) out[k] = ((int *)(smem + L.sel_list))[k];
    cluster.sync();
}

int decSelectCheck(const DecDims *dm, const float *scores, int t, int *out, NsaError *err) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        clusterLaunch(dm->cluster, 1, (size_t)attnLayout(*dm).total * sizeof(float), &attr);
    if (dm->cluster > 8)
        CUDA_CHECK(cudaFuncSetAttribute(decSelectCheckKernel,
                                        cudaFuncAttributeNonPortableClusterSizeAllowed, 1), err);
    CUDA_CHECK(cudaFuncSetAttribute(decSelectCheckKernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)cfg.dynamicSmemBytes), err);
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, decSelectCheckKernel, *dm, scores, t, out), err);
    return 0;
}

/* ---- sizes ------------------------------------------------------------------------ */

/* dm's tile and per-CTA sizes for a cluster of CL CTAs. */
static void attnSizes(DecDims *dm, int CL) {
    dm->cluster = CL;
    /* keys a tile: 72 (a CTA's 256 compressed blocks at 64k and the one
     * before them in four tiles, not five), halved while three tile buffers
     * would pass 120 KB */
    dm->tile = 72;
    while (dm->tile > 18 && 3 * (size_t)dm->tile * (dm->dk + 8 + dm->dv) * 2 > 120 * 1024)
        dm->tile /= 2;
    const int ns_max = nsaNumSelBlocks(dm->T, dm->l_sel);
    dm->sel_per = ceilDivInt(ns_max > 1 ? ns_max : 1, CL);
    dm->span_max = (dm->sel_per * dm->l_sel + dm->l + dm->d - 1) / dm->d + 2;
    dm->cand_cap = dm->slots < dm->sel_per ? dm->slots : dm->sel_per;
}

int decAttnPrepare(DecDims *dm, NsaError *err) {
    int dev = 0, optin = 0, major = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    cudaFuncAttributes fa;
    CUDA_CHECK(cudaFuncGetAttributes(&fa, decAttnKernel), err);
    /* clusters need sm_90 code on a Hopper or newer GPU (16 CTAs is
     * Hopper's non-portable size) */
    const bool clusters = major >= 9 && fa.ptxVersion >= 90;
    if (clusters)
        CUDA_CHECK(cudaFuncSetAttribute(decAttnKernel,
                                        cudaFuncAttributeNonPortableClusterSizeAllowed, 1), err);
    /* the whole opt-in: a launch takes only what it asks for, and the
     * allowance is the function's on the device, shared by every decoder */
    const int allowance = optin - (int)fa.sharedSizeBytes;
    CUDA_CHECK(cudaFuncSetAttribute(decAttnKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    allowance), err);
    /* every size whose shared memory fits (not monotone in the size: the
     * candidate lists grow with it, the per-CTA spans shrink) and that runs */
    dm->cluster_sizes = 0;
    size_t need = 0;
    for (int CL = clusters ? DEC_MAX_CLUSTER : 1; CL >= 1; CL /= 2) {
        attnSizes(dm, CL);
        const size_t bytes = (size_t)attnLayout(*dm).total * sizeof(float);
        if (bytes > (size_t)allowance) {
            need = need && need < bytes ? need : bytes;
            continue;
        }
        if (CL > 1) {
            cudaLaunchAttribute attr;
            const cudaLaunchConfig_t cfg = clusterLaunch(CL, 1, bytes, &attr);
            int fit = 0;
            /* a size the GPU cannot schedule (a small MIG slice) may answer
             * with an error rather than 0: not this size, then */
            if (cudaOccupancyMaxActiveClusters(&fit, decAttnKernel, &cfg) != cudaSuccess) {
                (void)cudaGetLastError();
                fit = 0;
            }
            if (fit == 0) continue;
        }
        dm->cluster_sizes |= CL;
    }
    if (!dm->cluster_sizes)
        return nsaErrorf(err,
                         "nsa decoder (cuda): the attention kernel needs at least %zu bytes of "
                         "shared memory a CTA for every cluster size this GPU runs; it allows %d "
                         "(sel_len %d, cmp_stride %d, n_sel %d, max_context %d, d_k %d, d_v %d: "
                         "a shorter max_context needs less)",
                         need, allowance, dm->l_sel, dm->d, dm->n_sel, dm->T, dm->dk, dm->dv);
    dm->sms = sms;
    decAttnForRows(dm, 1);
    return 0;
}

/* The largest size of dm->cluster_sizes at most `at_most`, else the
 * smallest there is. */
static int clusterAtMost(const DecDims *dm, int at_most) {
    int smallest = 0;
    for (int CL = DEC_MAX_CLUSTER; CL >= 1; CL /= 2) {
        if (!(dm->cluster_sizes & CL)) continue;
        if (CL <= at_most) return CL;
        smallest = CL;
    }
    return smallest;
}

void decAttnForRows(DecDims *dm, int rows) {
    /* a pass's clusters fill the GPU about twice over (two CTAs an SM run
     * side by side while each waits on its loads): one row of two groups
     * takes 16 CTAs a cluster, a 256-row prefill pass one */
    const size_t per_row = (size_t)rows * dm->G;
    int want = DEC_MAX_CLUSTER;
    while (want > 1 && per_row * want > 2 * (size_t)dm->sms) want /= 2;
    attnSizes(dm, clusterAtMost(dm, want));
}

void decAttnCluster(DecDims *dm, int cluster) { attnSizes(dm, clusterAtMost(dm, cluster)); }

/* ---- embedding and positions ------------------------------------------------- */

/* x[b][c] = tok_emb[tokens[b]][c], a CTA per row b. */
__global__ void decEmbedKernel(float *x, const float *tok_emb, const int *tokens, int C) {
    decWaitPrior();
    const int b = blockIdx.x;
    const float *row = tok_emb + (size_t)tokens[b] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) x[(size_t)b * C + c] = row[c];
    decLetNextLaunch();
}

int decEmbed(float *x, const float *tok_emb, const int *tokens, int B, int C, const DecLaunch *ln,
             NsaError *err) {
    DEC_LAUNCH("decEmbedKernel", ln, err, decEmbedKernel, dim3(B), dim3(256), 0, x, tok_emb, tokens,
               C);
    return 0;
}

/* One CTA: decode: pos[stage[0] + b] += 1 for b < B; prefill: pos[stage[0]] += B. */
__global__ void decAdvanceKernel(int *pos, const int *stage, int B, int prefill) {
    decWaitPrior();
    const int b = threadIdx.x;
    if (prefill) {
        if (b == 0) pos[stage[0]] += B;
    } else if (b < B) {
        pos[stage[0] + b] += 1;
    }
    decLetNextLaunch();
}

int decAdvance(int *pos, const int *stage, int B, int prefill, const DecLaunch *ln, NsaError *err) {
    DEC_LAUNCH("decAdvanceKernel", ln, err, decAdvanceKernel, dim3(1), dim3(DEC_MAX_BATCH), 0, pos,
               stage, B, prefill);
    return 0;
}

/* ---- overlapped launches ------------------------------------------------------ */

int decOverlapSupported(int *overlap, NsaError *err) {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), err);
    /* the kernels' wait is compiled in from sm_90 code only (decWaitPrior):
     * a kernel JIT-compiled from older PTX would not wait, so its launch
     * must not overlap */
    cudaFuncAttributes fa;
    CUDA_CHECK(cudaFuncGetAttributes(&fa, decAppendKernel), err);
    *overlap = major >= 9 && fa.ptxVersion >= 90;
    return 0;
}
