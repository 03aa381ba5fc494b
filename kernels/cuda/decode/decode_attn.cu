/* decode_attn.cu - NSA attention of one decode step over the caches
 * (decode_ops.h; kernels/cpu/decode.c is the oracle). For each row (slot at
 * position t) and KV group g, with scale = 1/sqrt(dk):
 *
 *   append    q, k^c = RoPE(proj) at t; k^sel, v^sel -> row t; k^win, v^win
 *             -> ring row t % W; k^cmp, v^cmp -> raw ring row t % Lr
 *   pool      when t = i*d + l - 1, block i = phi(raw rows t-l+1 .. t) -> kc,
 *             vc (in append for a decode step; after it for a prefill pass)
 *   cmp       s_i = scale q_h.kc_i over the visible blocks
 *             (n_t = floor((t-l+1)/d) + 1), split in chunks of
 *             DEC_CMP_CHUNK blocks: per chunk the max m, sum l = sum
 *             exp(s_i - m) and o = sum exp(s_i - m) vc_i
 *   select    lse_h from the chunks; p_i = sum_h exp(s_hi - lse_h);
 *             score_j = sum_i M_ij p_i (M_ij: the share of block i
 *             inside selection block j); blocks 0, t/l' and t/l' - 1, then
 *             the complete blocks with the highest scores (ties: lower j)
 *             up to n_sel. Scored in chunks of DEC_SEL_CHUNK blocks, a CTA
 *             each, whose best blocks are the candidates a second kernel
 *             ranks
 *   selwin    per DEC_UNIT keys (a part of a selected block, <= t, or of
 *             the window [max(0, t-w+1), t]) partial m, l, o for every head
 *             of the group: the group's keys are read once
 *   combine   o_cmp, o_sel, o_win from their partials;
 *             y = sum_c sigmoid(gate_c) o_c
 * cmp and selwin stage DEC_UNIT key and value rows at a time in shared
 * memory (coalesced 16-byte loads, all in flight at once) and merge the
 * tiles online, so no thread waits on one global load after another.
 * Partials merge as o = sum_u o_u exp(m_u - M) / sum_u l_u exp(m_u - M).
 * Nothing here synchronises with the host or allocates; positions come from
 * device memory, so the kernels replay inside a CUDA graph. */
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

/* compressed chunks holding at least one of n_vis visible blocks */
__device__ __forceinline__ int visibleChunks(int n_vis) {
    return (n_vis + DEC_CMP_CHUNK - 1) / DEC_CMP_CHUNK;
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

/* A CTA per (row b, group g), t = row_pos[b]: q_h = RoPE_t(q_h of proj) for the heads of g
 * (fp32, into s.q); per branch k = RoPE_t(k of proj), v as is: cmp -> raw ring row t % Lr
 * (fp32), sel -> k_sel, v_sel row t, win -> ring row t % W (bf16). RoPE_t turns each pair
 * (x_i, x_{i+dk/2}) into (x_i cos - x_{i+dk/2} sin, x_i sin + x_{i+dk/2} cos), s.rope row t.
 * With pool_in_append it then pools the block t completes (poolBlock). */
__global__ void decAppendKernel(DecDims dm, DecLayerCache c, DecScratch s) {
    decWaitPrior();
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
    DEC_LAUNCH("decAppendKernel", ln, err, decAppendKernel, dim3(dm->B, dm->G), dim3(128),
               dm->pool_in_append ? poolSmem(dm) : 0, *dm, *c, *s);
    return 0;
}

int decPool(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
            NsaError *err) {
    DEC_LAUNCH("decPoolKernel", ln, err, decPoolKernel, dim3(dm->B, dm->G), dim3(128),
               poolSmem(dm), *dm, *c, *s);
    return 0;
}

/* ---- attention over key tiles (compressed, selected, window) ---------------- */

/* The CTA's view of the group's hpg heads and a tile of DEC_UNIT keys, in
 * dynamic shared memory: fp32 q, probabilities and running outputs, then
 * bf16 key rows (padded by 8 so that neighbouring threads' 16-byte reads
 * fall in different banks) and value rows. The running outputs live in
 * shared memory, not registers, so that the value loop is one short loop
 * whatever hpg x dv is: a register array sized for the largest shape (16
 * heads of 256) had it unrolled 16 times, and these kernels, whose code is
 * fetched anew at each launch, waited on instructions more than on anything
 * else. */
typedef struct TileSmem {
    float *qs;      /* [hpg][dk] */
    float *ps;      /* [hpg][DEC_UNIT] scores, then probabilities */
    float *stat;    /* [3][hpg]: running max, running sum, this tile's rescale */
    float *os;      /* [hpg][dv] running unnormalised outputs */
    bf16 *ks;       /* [DEC_UNIT][dk + 8] */
    bf16 *vs;       /* [DEC_UNIT][dv] */
} TileSmem;

#define ATTN_THREADS 256

/* The fp32 part in floats, rounded up to 16 bytes so that the bf16 rows
 * after it are 16-byte aligned for the copies. */
__host__ __device__ static inline int tileFloats(int hpg, int dk, int dv) {
    return (hpg * dk + hpg * DEC_UNIT + 3 * hpg + hpg * dv + 3) / 4 * 4;
}

static size_t tileSmemBytes(const DecDims *dm) {
    const int hpg = dm->H / dm->G;
    return (size_t)tileFloats(hpg, dm->dk, dm->dv) * sizeof(float) +
           (size_t)DEC_UNIT * (dm->dk + 8 + dm->dv) * sizeof(bf16);
}

/* base: the kernel's dynamic shared memory (16-byte aligned) */
__device__ TileSmem tileSmem(float *base, int hpg, int dk, int dv) {
    TileSmem t;
    t.qs = base;
    t.ps = t.qs + hpg * dk;
    t.stat = t.ps + hpg * DEC_UNIT;
    t.os = t.stat + 3 * hpg;
    t.ks = (bf16 *)(base + tileFloats(hpg, dk, dv));
    t.vs = t.ks + DEC_UNIT * (dk + 8);
    return t;
}

/* Partial attention (running max m, sum l, unnormalised o) of the group's
 * hpg heads over n keys, DEC_UNIT at a time: key k is row rowOf(k) of kbase
 * and vbase. The tiles' partials merge online, o rescaled by exp(m_old -
 * m_new) per tile. raw (when not NULL) gets each head's scaled score of key
 * k at raw[hh * raw_stride + k]. Writes m, l at part0 + hh * part_stride and
 * o at that index times dv. Every thread of the CTA (ATTN_THREADS) calls it. */
template <class RowOf>
__device__ void attendKeys(const DecDims &dm, TileSmem sm, const float *q, int n, RowOf rowOf,
                           const bf16 *kbase, const bf16 *vbase, float *raw, size_t raw_stride,
                           float *m_out, float *l_out, float *o_out, size_t part0,
                           size_t part_stride) {
    const int hpg = dm.H / dm.G, dk = dm.dk, dv = dm.dv, ks_stride = dk + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float scale = rsqrtf((float)dk);
    /* asynchronous 16-byte copies of keys [k0, k0 + nt): every one in flight
     * before the wait */
    auto issueTile = [&](int k0, int nt) {
        const int ck = dk / 8, cv = dv / 8;
        for (int idx = threadIdx.x; idx < nt * (ck + cv); idx += blockDim.x) {
            const int k = idx / (ck + cv), c = idx % (ck + cv);
            const size_t row = (size_t)rowOf(k0 + k);
            if (c < ck)
                __pipeline_memcpy_async(sm.ks + k * ks_stride + c * 8, kbase + row * dk + c * 8, 16);
            else
                __pipeline_memcpy_async(sm.vs + k * dv + (c - ck) * 8,
                                        vbase + row * dv + (c - ck) * 8, 16);
        }
        __pipeline_commit();
    };
    /* the first tile's copies go out before q is read, so that the two
     * round trips overlap */
    if (n > 0) issueTile(0, n < DEC_UNIT ? n : DEC_UNIT);
    for (int k = threadIdx.x; k < hpg * dk; k += blockDim.x) sm.qs[k] = q[k];
    for (int hh = threadIdx.x; hh < hpg; hh += blockDim.x) {
        sm.stat[hh] = -INFINITY;
        sm.stat[hpg + hh] = 0.0f;
    }
    /* a thread keeps the same outputs every tile: no barrier between their
     * updates */
    for (int idx = threadIdx.x; idx < hpg * dv; idx += blockDim.x) sm.os[idx] = 0.0f;
    for (int k0 = 0; k0 < n; k0 += DEC_UNIT) {
        const int nt = n - k0 < DEC_UNIT ? n - k0 : DEC_UNIT;
        if (k0 > 0) {
            __syncthreads();   /* the previous tile is done with ks, vs and ps */
            issueTile(k0, nt);
        }
        __pipeline_wait_prior(0);
        __syncthreads();
        for (int idx = threadIdx.x; idx < hpg * DEC_UNIT; idx += blockDim.x) {
            const int hh = idx / DEC_UNIT, k = idx % DEC_UNIT;
            if (k >= nt) continue;
            const float sc = scale * dotRow(sm.qs + hh * dk, sm.ks + k * ks_stride, dk);
            sm.ps[idx] = sc;
            if (raw) raw[hh * raw_stride + k0 + k] = sc;
        }
        __syncthreads();
        for (int hh = warp; hh < hpg; hh += warps) {
            float *p = sm.ps + hh * DEC_UNIT;
            float mt = -INFINITY;
            for (int k = lane; k < nt; k += 32) mt = fmaxf(mt, p[k]);
            mt = warpMax(mt);
            const float m_old = sm.stat[hh], m_new = fmaxf(m_old, mt);
            float sum = 0.0f;
            for (int k = lane; k < nt; k += 32) {
                const float e = __expf(p[k] - m_new);
                p[k] = e;
                sum += e;
            }
            sum = warpSum(sum);
            __syncwarp();
            if (lane == 0) {
                const float alpha = __expf(m_old - m_new);   /* 0 for the first tile */
                sm.stat[hh] = m_new;
                sm.stat[hpg + hh] = sm.stat[hpg + hh] * alpha + sum;
                sm.stat[2 * hpg + hh] = alpha;
            }
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < hpg * dv; idx += blockDim.x) {
            const int hh = idx / dv, e = idx % dv;
            const float *p = sm.ps + hh * DEC_UNIT;
            float a = 0.0f;
#pragma unroll 8
            for (int k = 0; k < nt; k++) a += p[k] * bf(sm.vs[k * dv + e]);
            sm.os[idx] = sm.os[idx] * sm.stat[2 * hpg + hh] + a;
        }
    }
    __syncthreads();   /* stat is final (also when n == 0: the empty partial) */
    for (int hh = threadIdx.x; hh < hpg; hh += blockDim.x) {
        m_out[part0 + hh * part_stride] = sm.stat[hh];
        l_out[part0 + hh * part_stride] = sm.stat[hpg + hh];
    }
    for (int idx = threadIdx.x; idx < hpg * dv; idx += blockDim.x)
        o_out[(part0 + (idx / dv) * part_stride) * dv + idx % dv] = sm.os[idx];
}

struct IdentityRow {
    int first;
    __device__ int operator()(int k) const { return first + k; }
};
struct RingRow {
    int first, ring;
    __device__ int operator()(int k) const { return (first + k) % ring; }
};

/* ---- compressed attention partials ----------------------------------------- */

/* A CTA per (row b, group g) and chunk of DEC_CMP_CHUNK compressed blocks: for each head h of g,
 * over the chunk's visible blocks i, s_hi = scale q_h.kc_i (also into cmp_scores), m = max_i s_hi,
 * l = sum_i exp(s_hi - m), o = sum_i exp(s_hi - m) vc_i (unnormalised): cmp_m, cmp_l, cmp_o. */
__global__ void __launch_bounds__(ATTN_THREADS) decCmpKernel(DecDims dm, DecLayerCache c,
                                                             DecScratch s) {
    decWaitPrior();
    extern __shared__ float4 smem_cmp[];
    const int b = blockIdx.x / dm.G, g = blockIdx.x % dm.G, chunk = blockIdx.y;
    const int hpg = dm.H / dm.G, t = s.row_pos[b];
    const int i0 = chunk * DEC_CMP_CHUNK, n_vis = visibleBlocks(t, dm.l, dm.d);
    const int n = max(0, min(DEC_CMP_CHUNK, n_vis - i0));   /* this chunk's visible blocks */
    const size_t sg = (size_t)s.row_slot[b] * dm.G + g, head0 = (size_t)b * dm.H + g * hpg;
    attendKeys(dm, tileSmem((float *)smem_cmp, hpg, dm.dk, dm.dv), s.q + head0 * dm.dk, n,
               IdentityRow{0}, c.kc + (sg * dm.Nc + i0) * dm.dk, c.vc + (sg * dm.Nc + i0) * dm.dv,
               s.cmp_scores + head0 * dm.Nc + i0, (size_t)dm.Nc, s.cmp_m, s.cmp_l, s.cmp_o,
               head0 * dm.n_chunks + chunk, (size_t)dm.n_chunks);
    decLetNextLaunch();
}

int decCmp(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
           NsaError *err) {
    DEC_LAUNCH("decCmpKernel", ln, err, decCmpKernel, dim3(dm->B * dm->G, dm->n_chunks),
               dim3(ATTN_THREADS), tileSmemBytes(dm), *dm, *c, *s);
    return 0;
}

/* ---- selection -------------------------------------------------------------- */

/* Two kernels. decSelScoreKernel: a CTA per row, group and chunk of
 * DEC_SEL_CHUNK selection blocks scores its blocks from the compressed
 * scores of the blocks that overlap them, ranks them among themselves and
 * writes its best `want` as candidates (the best `want` of the row are among
 * the chunks' best `want`). decSelectKernel: a CTA per row and group ranks
 * the candidates, adds the forced blocks and writes the set ascending.
 * Spreading the scores over many CTAs keeps the long-context selection off
 * one CTA's chain of dependent loads; ranking a few candidates by binary
 * searches in the chunks' ordered lists needs no radix passes. Order: score
 * descending, then j ascending (ties go to the lower block); scores are
 * >= 0, so their bits order like them. */

#define SEL_THREADS 256
static_assert(SEL_THREADS >= DEC_SEL_CHUNK, "decSelScoreKernel: a thread per block of its chunk");

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
__device__ __forceinline__ void cmpSpan(int j_lo, int j_hi, int l, int d, int l_sel, int n_vis,
                                        int *first, int *last) {
    const int lo_tok = j_lo * l_sel, hi_tok = (j_hi + 1) * l_sel;
    *first = lo_tok - l < 0 ? 0 : (lo_tok - l) / d + 1;
    const int hi = (hi_tok - 1) / d;
    *last = hi < n_vis - 1 ? hi : n_vis - 1;
}

/* Whether candidate a comes before b: score descending, then block ascending. */
__device__ __forceinline__ bool selBefore(int2 a, int2 b) {
    return (unsigned)a.x > (unsigned)b.x || ((unsigned)a.x == (unsigned)b.x && a.y < b.y);
}

/* Compressed blocks the widest chunk's span can hold (host and device). */
__host__ __device__ static inline int selSpanMax(int l, int d, int l_sel) {
    return (DEC_SEL_CHUNK * l_sel + l) / d + 2;
}

/* lse_h = log sum_chunks l_c exp(m_c); p_i = sum_h exp(s_hi - lse_h) over
 * the chunk's span; score_j = sum_i M_ij p_i; candidates = the chunk's
 * blocks ranked below want, written at their rank. */
__global__ void __launch_bounds__(SEL_THREADS) decSelScoreKernel(DecDims dm, DecScratch s) {
    decWaitPrior();
    extern __shared__ float P[];   /* [span]: p_i summed over the group's heads */
    __shared__ float lse[DEC_MAX_HEADS_PER_GROUP];
    __shared__ unsigned key[DEC_SEL_CHUNK];
    __shared__ int candidate[DEC_SEL_CHUNK];
    const int b = blockIdx.x / dm.G, g = blockIdx.x % dm.G, chunk = blockIdx.y;
    const int t = s.row_pos[b];
    const SelRow row = selRow(t, dm.l_sel, dm.n_sel);
    const int j0 = chunk * DEC_SEL_CHUNK;
    /* uniform over the CTA: past the row's blocks, or nothing to choose */
    if (j0 >= row.Ns || row.want <= 0) {
        decLetNextLaunch();
        return;
    }
    const int jn = min(DEC_SEL_CHUNK, row.Ns - j0);
    const int H = dm.H, hpg = H / dm.G, l = dm.l, d = dm.d, ls = dm.l_sel;
    const int n_vis = visibleBlocks(t, l, d), nc = visibleChunks(n_vis);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;

    /* 1. each head's log-sum-exp over the compressed partials */
    for (int hh = warp; hh < hpg; hh += warps) {
        const size_t p0 = ((size_t)b * H + g * hpg + hh) * dm.n_chunks;
        float M = -INFINITY;
        for (int k = lane; k < nc; k += 32) M = fmaxf(M, s.cmp_m[p0 + k]);
        M = warpMax(M);
        float L = 0.0f;
        for (int k = lane; k < nc; k += 32)
            if (s.cmp_m[p0 + k] != -INFINITY) L += s.cmp_l[p0 + k] * __expf(s.cmp_m[p0 + k] - M);
        L = warpSum(L);
        if (lane == 0) lse[hh] = M == -INFINITY ? -INFINITY : M + __logf(L);
    }
    __syncthreads();

    /* 2. p_i = sum_h exp(s_hi - lse_h) (head order) over the chunk's span;
     * a thread issues every head's load of its column before using any */
    int i_first, i_last;
    cmpSpan(j0, j0 + jn - 1, l, d, ls, n_vis, &i_first, &i_last);
    const float *sc = s.cmp_scores + ((size_t)b * H + g * hpg) * dm.Nc;
    for (int i = i_first + threadIdx.x; i <= i_last; i += SEL_THREADS) {
        float v[DEC_MAX_HEADS_PER_GROUP];
#pragma unroll
        for (int hh = 0; hh < DEC_MAX_HEADS_PER_GROUP; hh++)
            v[hh] = hh < hpg ? sc[(size_t)hh * dm.Nc + i] : 0.0f;
        float acc = 0.0f;
#pragma unroll
        for (int hh = 0; hh < DEC_MAX_HEADS_PER_GROUP; hh++)
            if (hh < hpg) acc += __expf(v[hh] - lse[hh]);
        P[i - i_first] = acc;
    }
    __syncthreads();

    /* 3. score_j = sum_i (share of compressed block i inside block j) p_i */
    if (threadIdx.x < DEC_SEL_CHUNK) {
        const int j = j0 + threadIdx.x;
        unsigned k = 0u;
        int cand = 0;
        if (threadIdx.x < jn) {
            int lo, hi;
            cmpSpan(j, j, l, d, ls, n_vis, &lo, &hi);
            float acc = 0.0f;
            for (int i = lo; i <= hi; i++) {
                const int first = i * d, end = i * d + l;
                const int a = first > j * ls ? first : j * ls;
                const int e = end < (j + 1) * ls ? end : (j + 1) * ls;
                acc += (float)(e - a) / (float)l * P[i - i_first];
            }
            k = __float_as_uint(acc);
            cand = j < row.n_complete && !selForced(j, row.current);
        }
        key[threadIdx.x] = k;
        candidate[threadIdx.x] = cand;
    }
    __syncthreads();

    /* 4. rank among the chunk's candidates; the best `want` go out at their rank */
    if (threadIdx.x < jn && candidate[threadIdx.x]) {
        const unsigned k = key[threadIdx.x];
        int rank = 0;
        for (int o = 0; o < jn; o++)
            rank += candidate[o] && selBefore(make_int2((int)key[o], j0 + o),
                                              make_int2((int)k, j0 + (int)threadIdx.x));
        if (rank < row.want)
            s.sel_cand[(((size_t)b * dm.G + g) * dm.sel_chunks + chunk) * dm.cand_stride + rank] =
                make_int2((int)k, j0 + (int)threadIdx.x);
    }
    decLetNextLaunch();
}

/* A chunk's candidates are in that order (each went out at its rank in the
 * chunk), so a candidate's rank in the row is its rank in its chunk plus, in
 * every other chunk, the length of the prefix that comes before it: a binary
 * search a chunk, not a comparison with every candidate. */
__global__ void __launch_bounds__(SEL_THREADS) decSelectKernel(DecDims dm, DecScratch s) {
    decWaitPrior();
    extern __shared__ int2 cand[];   /* [sel_chunks * cand_stride], then chosen [slots] */
    __shared__ int count[DEC_MAX_SEL_BLOCKS / DEC_SEL_CHUNK];   /* candidates a chunk wrote */
    __shared__ int n_chosen;
    const int b = blockIdx.x / dm.G, g = blockIdx.x % dm.G;
    const SelRow row = selRow(s.row_pos[b], dm.l_sel, dm.n_sel);
    const int chunks = (row.Ns + DEC_SEL_CHUNK - 1) / DEC_SEL_CHUNK;
    const int per = row.want <= 0 ? 0 : row.want < dm.cand_stride ? row.want : dm.cand_stride;
    const int n_cand = chunks * per;
    int *chosen = (int *)(cand + (size_t)dm.sel_chunks * dm.cand_stride);
    const int2 *src = s.sel_cand + ((size_t)b * dm.G + g) * dm.sel_chunks * dm.cand_stride;
    /* a chunk wrote min(want, its candidates) entries */
    for (int c = threadIdx.x; c < chunks; c += SEL_THREADS) {
        const int end = (c + 1) * DEC_SEL_CHUNK < row.Ns ? (c + 1) * DEC_SEL_CHUNK : row.Ns;
        const int n = selCandidatesIn(c * DEC_SEL_CHUNK, end, row);
        count[c] = n < per ? n : per;
    }
    __syncthreads();
    /* slots at or past a chunk's count are never read */
    for (int idx = threadIdx.x; idx < n_cand; idx += SEL_THREADS) {
        const int c = idx / per, k = idx % per;
        if (k < count[c]) cand[idx] = src[(size_t)c * dm.cand_stride + k];
    }
    if (threadIdx.x == 0) {
        int n = 0;
        chosen[n++] = 0;
        if (row.current != 0) chosen[n++] = row.current;
        if (row.current >= 2) chosen[n++] = row.current - 1;
        n_chosen = n;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n_cand; idx += SEL_THREADS) {
        const int me_chunk = idx / per, me_rank = idx % per;
        if (me_rank >= count[me_chunk]) continue;
        const int2 me = cand[idx];
        int rank = me_rank;
        for (int c = 0; c < chunks && rank < row.want; c++) {
            if (c == me_chunk) continue;
            const int2 *list = cand + (size_t)c * per;
            int lo = 0, hi = count[c];
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (selBefore(list[mid], me)) lo = mid + 1;
                else hi = mid;
            }
            rank += lo;
        }
        if (rank < row.want) chosen[atomicAdd(&n_chosen, 1)] = me.y;
    }
    __syncthreads();
    /* the set ascending (each block's place = the chosen below it), -1 padded */
    const int n = n_chosen;
    int *out = s.sel + ((size_t)b * dm.G + g) * dm.slots;
    for (int k = threadIdx.x; k < dm.slots; k += SEL_THREADS) {
        if (k >= n) {
            out[k] = -1;
            continue;
        }
        const int j = chosen[k];
        int at = 0;
        for (int o = 0; o < n; o++) at += chosen[o] < j;
        out[at] = j;
    }
    decLetNextLaunch();
}

void decSelectDims(DecDims *dm) {
    dm->sel_chunks = (nsaNumSelBlocks(dm->T, dm->l_sel) + DEC_SEL_CHUNK - 1) / DEC_SEL_CHUNK;
    if (dm->sel_chunks < 1) dm->sel_chunks = 1;
    dm->cand_stride = dm->slots < DEC_SEL_CHUNK ? dm->slots : DEC_SEL_CHUNK;
}

static size_t selScoreSmem(const DecDims *dm) {
    return (size_t)selSpanMax(dm->l, dm->d, dm->l_sel) * sizeof(float);
}

static size_t selectSmem(const DecDims *dm) {
    return (size_t)dm->sel_chunks * dm->cand_stride * sizeof(int2) + (size_t)dm->slots * sizeof(int);
}

int decSelect(const DecDims *dm, const DecScratch *s, const DecLaunch *ln, NsaError *err) {
    DEC_LAUNCH("decSelScoreKernel", ln, err, decSelScoreKernel, dim3(dm->B * dm->G, dm->sel_chunks),
               dim3(SEL_THREADS), selScoreSmem(dm), *dm, *s);
    DEC_LAUNCH("decSelectKernel", ln, err, decSelectKernel, dim3(dm->B * dm->G), dim3(SEL_THREADS),
               selectSmem(dm), *dm, *s);
    return 0;
}

/* ---- selected and window partials ------------------------------------------- */

/* A CTA per (row b, group g) and unit: the unit's keys are one DEC_UNIT part of selected block
 * sel[slot] (keys <= t; sel_units = slots x parts) or of the window [max(0, t-w+1), t] (ring
 * rows); per head h of g: m = max_k s_hk, l = sum_k exp(s_hk - m), o = sum_k exp(s_hk - m) v_k,
 * s_hk = scale q_h.k_k, into sw_m, sw_l, sw_o (an empty unit: m = -inf, l = 0, o = 0). */
__global__ void __launch_bounds__(ATTN_THREADS) decSelWinKernel(DecDims dm, DecLayerCache c,
                                                                DecScratch s) {
    decWaitPrior();
    extern __shared__ float4 smem_sw[];
    const int b = blockIdx.x / dm.G, g = blockIdx.x % dm.G, unit = blockIdx.y;
    const int t = s.row_pos[b], hpg = dm.H / dm.G;
    const int units = dm.sel_units + dm.win_units;
    const size_t sg = (size_t)s.row_slot[b] * dm.G + g, head0 = (size_t)b * dm.H + g * hpg;
    const TileSmem sm = tileSmem((float *)smem_sw, hpg, dm.dk, dm.dv);
    const float *q = s.q + head0 * dm.dk;
    const size_t part0 = head0 * units + unit;

    /* this unit's keys: positions [first, end) of k_sel (sel) or the ring (win) */
    if (unit < dm.sel_units) {
        const int parts = dm.sel_units / dm.slots, slot_n = unit / parts, part = unit % parts;
        const int j = s.sel[((size_t)b * dm.G + g) * dm.slots + slot_n];
        int first = 0, end = 0;
        if (j >= 0) {
            first = j * dm.l_sel + part * DEC_UNIT;
            end = first + DEC_UNIT;
            if (end > (j + 1) * dm.l_sel) end = (j + 1) * dm.l_sel;
            if (end > t + 1) end = t + 1;
        }
        attendKeys(dm, sm, q, end > first ? end - first : 0, IdentityRow{first},
                   c.k_sel + sg * dm.T * dm.dk, c.v_sel + sg * dm.T * dm.dv, NULL, 0, s.sw_m,
                   s.sw_l, s.sw_o, part0, (size_t)units);
    } else {
        const int w0 = t - dm.window + 1 > 0 ? t - dm.window + 1 : 0;
        const int first = w0 + (unit - dm.sel_units) * DEC_UNIT;
        const int end = first + DEC_UNIT < t + 1 ? first + DEC_UNIT : t + 1;
        attendKeys(dm, sm, q, end > first ? end - first : 0, RingRow{first, dm.W},
                   c.k_win + sg * dm.W * dm.dk, c.v_win + sg * dm.W * dm.dv, NULL, 0, s.sw_m,
                   s.sw_l, s.sw_o, part0, (size_t)units);
    }
    decLetNextLaunch();
}

int decSelWin(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
              NsaError *err) {
    DEC_LAUNCH("decSelWinKernel", ln, err, decSelWinKernel,
               dim3(dm->B * dm->G, dm->sel_units + dm->win_units), dim3(ATTN_THREADS),
               tileSmemBytes(dm), *dm, *c, *s);
    return 0;
}

/* ---- combine ---------------------------------------------------------------- */

#define COMBINE_THREADS 256

/* One branch's merge weights w_u = exp(m_u - M) / L (0 for empty partials)
 * into wts[0 .. n), by one warp. */
__device__ void branchWeights(const float *m, const float *lsum, int n, float *wts) {
    const int lane = threadIdx.x & 31;
    float M = -INFINITY;
    for (int u = lane; u < n; u += 32) M = fmaxf(M, m[u]);
    M = warpMax(M);
    float L = 0.0f;
    for (int u = lane; u < n; u += 32)
        if (m[u] != -INFINITY) L += lsum[u] * __expf(m[u] - M);
    L = warpSum(L);
    for (int u = lane; u < n; u += 32)
        wts[u] = M == -INFINITY || m[u] == -INFINITY ? 0.0f : __expf(m[u] - M) / L;
}

/* One head's three branch outputs from their partials, gated into y:
 * o_c = sum_u w_u o_u over branch c's partials (compressed chunks, selected
 * units, window units); y = sum_c sigmoid(gate_c) o_c. The threads split
 * into COMBINE_THREADS / dv parts, each summing every parts-th partial of
 * each branch; the parts add up in shared memory. */
__global__ void __launch_bounds__(COMBINE_THREADS) decCombineKernel(DecDims dm, DecScratch s) {
    decWaitPrior();
    extern __shared__ float wts[];   /* [n_chunks + units] */
    __shared__ float part_sum[3][COMBINE_THREADS];
    const int b = blockIdx.x, h = blockIdx.y, dv = dm.dv;
    const int units = dm.sel_units + dm.win_units;
    const int nc = visibleChunks(visibleBlocks(s.row_pos[b], dm.l, dm.d));
    const size_t pc = ((size_t)b * dm.H + h) * dm.n_chunks, pu = ((size_t)b * dm.H + h) * units;
    const int warp = threadIdx.x >> 5;
    if (warp == 0) branchWeights(s.cmp_m + pc, s.cmp_l + pc, nc, wts);
    else if (warp == 1) branchWeights(s.sw_m + pu, s.sw_l + pu, dm.sel_units, wts + nc);
    else if (warp == 2)
        branchWeights(s.sw_m + pu + dm.sel_units, s.sw_l + pu + dm.sel_units, dm.win_units,
                      wts + nc + dm.sel_units);
    __syncthreads();
    const int parts = COMBINE_THREADS / dv, part = threadIdx.x / dv, e = threadIdx.x % dv;
    if (part < parts) {
        float oc = 0.0f, os = 0.0f, ow = 0.0f;
#pragma unroll 4
        for (int u = part; u < nc; u += parts) oc += wts[u] * s.cmp_o[(pc + u) * dv + e];
#pragma unroll 4
        for (int u = part; u < dm.sel_units; u += parts)
            os += wts[nc + u] * s.sw_o[(pu + u) * dv + e];
#pragma unroll 4
        for (int u = dm.sel_units + part; u < units; u += parts)
            ow += wts[nc + u] * s.sw_o[(pu + u) * dv + e];
        part_sum[0][threadIdx.x] = oc;
        part_sum[1][threadIdx.x] = os;
        part_sum[2][threadIdx.x] = ow;
    }
    __syncthreads();
    if (threadIdx.x >= dv) return;
    float o[3] = {0.0f, 0.0f, 0.0f};
    for (int c = 0; c < 3; c++)
        for (int p = 0; p < parts; p++) o[c] += part_sum[c][p * dv + threadIdx.x];
    const float *gl = s.proj + (size_t)b * dm.proj_stride + dm.proj_stride - 3 * dm.H + h * 3;
    const float g0 = 1.0f / (1.0f + __expf(-gl[0])), g1 = 1.0f / (1.0f + __expf(-gl[1]));
    const float g2 = 1.0f / (1.0f + __expf(-gl[2]));
    s.y[(size_t)b * dm.H * dv + (size_t)h * dv + threadIdx.x] =
        __float2bfloat16_rn(g0 * o[0] + g1 * o[1] + g2 * o[2]);
    decLetNextLaunch();
}

int decCombine(const DecDims *dm, const DecScratch *s, const DecLaunch *ln, NsaError *err) {
    const size_t smem = ((size_t)dm->n_chunks + dm->sel_units + dm->win_units) * sizeof(float);
    DEC_LAUNCH("decCombineKernel", ln, err, decCombineKernel, dim3(dm->B, dm->H),
               dim3(COMBINE_THREADS), smem, *dm, *s);
    return 0;
}

/* The attention kernels' dynamic shared memory beyond the default 48 KB
 * (large heads, many heads per group, long contexts for the selection's
 * per-block sums). Called once per decoder. */
int decAttnPrepare(const DecDims *dm, NsaError *err) {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err);
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), err);
    const struct {
        const void *fn;
        const char *name;
        size_t bytes;
    } sel[2] = {{(const void *)decSelScoreKernel, "scores (a chunk's compressed blocks)",
                 selScoreSmem(dm)},
                {(const void *)decSelectKernel, "top-n (the chunks' candidates)", selectSmem(dm)}};
    for (int k = 0; k < 2; k++) {
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaFuncGetAttributes(&fa, sel[k].fn), err);
        if (sel[k].bytes + fa.sharedSizeBytes > (size_t)optin)
            return nsaErrorf(err,
                             "nsa decoder (cuda): the selection's %s needs %zu bytes of "
                             "shared memory; allowed: at most %zu on this GPU (sel_len %d, "
                             "cmp_stride %d, n_sel %d, max_context %d)",
                             sel[k].name, sel[k].bytes, (size_t)optin - fa.sharedSizeBytes,
                             dm->l_sel, dm->d, dm->n_sel, dm->T);
        if (sel[k].bytes > 48 * 1024 - fa.sharedSizeBytes)
            CUDA_CHECK(cudaFuncSetAttribute(sel[k].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)sel[k].bytes), err);
    }
    const size_t tile = tileSmemBytes(dm);
    const size_t comb = ((size_t)dm->n_chunks + dm->sel_units + dm->win_units) * sizeof(float);
    if (tile > 48 * 1024) {
        CUDA_CHECK(cudaFuncSetAttribute(decCmpKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)tile), err);
        CUDA_CHECK(cudaFuncSetAttribute(decSelWinKernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tile), err);
    }
    const size_t comb_max = 48 * 1024 - sizeof(float) * 3 * COMBINE_THREADS;
    if (comb > comb_max)
        return nsaErrorf(err,
                         "nsa decoder (cuda): %d compressed chunks and %d units need %zu bytes "
                         "of shared memory to combine; allowed: at most %zu",
                         dm->n_chunks, dm->sel_units + dm->win_units, comb, comb_max);
    return 0;
}

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
