/* fast_host.h - the host side of the fast attention (kernels/cuda/fast_attn/):
 * the per-call context (FastCtx) and the designs it carries, the inputs and
 * outputs a pass takes (FastFwdIo, FastBwdIo), the launchers of the
 * kernels, and the host helpers the plan (fast_attn.cu) sizes and orders
 * the passes with. No device code: the plan and dispatch include this
 * alone; each kernel source adds the device headers it instantiates
 * (tile_*.cuh, fast_policy.cuh, fast_common.cuh). Each launcher enqueues on
 * stream and returns the launch status (cudaErrorInvalidValue for a
 * head-dim pair with no instantiation); it never synchronises or
 * allocates. */
#ifndef NSA_FAST_HOST_H
#define NSA_FAST_HOST_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include "fast_attn.h"

/* The selected branch's forward: the union of 4 tokens' blocks per CTA
 * (fast_sel_union.cu), block-centric work items over the reverse index
 * (fast_sel_block.cu), or masked dense flash attention run in the window
 * forward's pass (fast_sel_dense.cu, fast_win.cu). */
enum class FastSelFwd { UNION, BLOCK, DENSE };
/* The selected branch's dQ: union of 4 (fast_sel_union.cu), one warp per
 * token (fast_sel.cu), block-centric after the dK/dV pass (BLOCK) or formed
 * in it (FUSED, fast_sel_block.cu), or masked dense in the window +
 * compressed dQ pass (DENSE, fast_win.cu). */
enum class FastSelDq { UNION, WARP, BLOCK, FUSED, DENSE };

/* Dims every fast kernel needs, resolved once per call on the host. */
struct FastCtx {
    int B, S, H, G, hpg;
    int cmp_len, cmp_stride, sel_len, n_sel, window;
    int Nc, Ns, slots;
    float scale, scale_log2;
    FastSelFwd sel_fwd; /* the selected forward's design (fastSelDesign) */
    FastSelDq sel_dq;   /* the selected dQ's design */
    int smem_max; /* the device's opt-in shared memory per CTA, bytes */
    int wgmma;    /* 1: the tile loops run on wgmma (sm_90a), 0: mma.sync */
    /* host only: the driver's cuTensorMapEncodeTiled where wgmma (the
     * wgmma tile loops read their key tiles by TMA, fast_tma.cuh), else NULL */
    void *tma_encode;
};

struct FastFwdIo {
    const bf16 *q, *k, *v;  /* keys/values [B][nkeys][G][D] */
    int nkeys;
    bf16 *o;     /* [B][S][H][DV] */
    float *lse;  /* [B][S][H] */
    /* gate-combine epilogue (window branch, runs last):
     * out = g_cmp o_cmp + g_sel o_sel + g_win o, gates [B][S][H][3] */
    const bf16 *o_cmp, *o_sel, *gates;
    bf16 *out;
};

/* Where a dQ pass puts its branches' dq: the passes run one after another
 * and sum their terms in a fixed order through an fp32 running dq. */
enum class FastDqMode {
    ACC,     /* dq_acc = dq: the first pass */
    ACC_OUT, /* dq_out (bf16) = dq_acc + dq: the last */
};

struct FastBwdIo {
    const bf16 *q, *k, *v, *dout, *gates;
    int nkeys;
    const float *lse;   /* this branch's lse [B][S][H] */
    const float *dsum;  /* dout.o_c per row and branch [B][S][H][3] (= dgates) */
    const float *gate_f; /* the gates in fp32 [B][S][H][3] (4-byte async copies) */
    int branch;         /* 0 cmp, 1 sel, 2 win */
    float *dq_acc;      /* fp32 [B][S][H][DK] running sum over the branches */
    bf16 *dq_out;       /* bf16 dq, written by the last pass (ACC_OUT) */
    FastDqMode dq_mode; /* (a dQ pass of all three branches writes dq_out = dq) */
};

/* Looks up the driver's cuTensorMapEncodeTiled through the runtime (no
 * link against libcuda) and stores it in *encode. Returns cudaSuccess, or
 * the runtime's error / cudaErrorSymbolNotFound when the driver lacks it;
 * *encode is then NULL. Called once per plan, never in a step. */
static inline cudaError_t fastTmaEncoder(void **encode) {
    *encode = NULL;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", encode, 12000,
                                                     cudaEnableDefault, &found);
    if (e != cudaSuccess) return e;
    if (found != cudaDriverEntryPointSuccess || !*encode) {
        *encode = NULL;
        return cudaErrorSymbolNotFound;
    }
    return cudaSuccess;
}

/* The (d_k, d_v) pairs that are instantiated; every other pair is refused
 * by the op's dims check before any launch. */
#define FAST_DISPATCH(dk, dv, fn, ...)                                              \
    do {                                                                            \
        if ((dk) == 64 && (dv) == 64) return fn<64, 64>(__VA_ARGS__);               \
        if ((dk) == 128 && (dv) == 64) return fn<128, 64>(__VA_ARGS__);             \
        if ((dk) == 128 && (dv) == 128) return fn<128, 128>(__VA_ARGS__);           \
        if ((dk) == 192 && (dv) == 128) return fn<192, 128>(__VA_ARGS__);           \
        return cudaErrorInvalidValue;                                               \
    } while (0)

static inline int fastDimsSupported(int dk, int dv) {
    return (dk == 64 && dv == 64) || (dk == 128 && dv == 64) || (dk == 128 && dv == 128) ||
           (dk == 192 && dv == 128);
}

/* Optional per-kernel timing for benchmarks: a mark records an event on
 * the stream; the time up to the next mark is charged to its name. NULL
 * marks (profiling off) cost nothing. */
struct FastMarks {
    cudaEvent_t *events;
    const char **names;
    int *count;
    int max;
    cudaStream_t stream;
};
static inline cudaError_t fastMark(const FastMarks *m, const char *name) {
    if (!m || *m->count >= m->max) return cudaSuccess;
    cudaError_t e = cudaEventRecord(m->events[*m->count], m->stream);
    if (e == cudaSuccess) m->names[(*m->count)++] = name;
    return e;
}

/* fast_win.cu: o_win, lse_win and (fused) out; with sel (its keys, o and
 * lse; sel_mask from fastSelDenseMask), the masked dense selected forward
 * first in the same pass, its o read back by the combine. Returns
 * cudaErrorInvalidValue for a sel without a mask, else the encode or
 * launch status; never synchronises. */
cudaError_t fastWinForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                           const FastFwdIo *sel, const uint64_t *sel_mask, cudaStream_t stream);
/* dk_out, dv_out overwritten (bf16). */
cudaError_t fastWinBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io, bf16 *dk_out,
                            bf16 *dv_out, cudaStream_t stream, const FastMarks *marks);
/* dq of the window and compressed branches in one pass (win: rows, window
 * keys and where dq goes, per win.dq_mode; cmp: io.k, io.v = kc, vc, nkeys
 * = Nc, lse_cmp), for the tokens [t_begin, t_end) of every batch row. With
 * sel (its keys and lse) the selected branch joins the pass: with sel_mask
 * (fastSelDenseMask: c.sel_dq == FastSelDq::DENSE) all of it, as masked dense attention,
 * over every token, dq written whole; without, its forced blocks only
 * (SelForcedPolicy, where fastSelForcedDqApplies), the fused selected
 * backward adding the chosen blocks' dq (FastSelBlock.forced_dq_apart).
 * Returns cudaErrorInvalidValue for a NULL cmp, a forced sel where that
 * does not apply or a masked one over part of the tokens, else the encode or launch
 * status; never synchronises. */
cudaError_t fastWinCmpDq(const FastCtx &c, int dk, int dv, const FastBwdIo &win,
                         const FastBwdIo *cmp, const FastBwdIo *sel, const uint64_t *sel_mask,
                         int t_begin, int t_end, cudaStream_t stream);

/* fast_sel.cu */
/* The most shared memory the selection index's count kernel takes for its
 * per-(b, g) histogram of S / sel_len block counts: under the 227 KB opt-in
 * with room for the fill kernel's token slots beside the same histogram
 * (fastSelBuildIndex; fastCheckDims). */
#define FAST_HIST_SMEM_BYTES ((size_t)200 * 1024)

/* fast_cmp.cu */
/* Compressed blocks that may hold one token (cmp_len / cmp_stride): the
 * pooling backward keeps the sums of a run of blocks and of the blocks
 * before it that reach into it in 48 KB of shared memory (fastCheckDims). */
#define FAST_CMP_MAX_OVERLAP 64
/* The most parts fastCmpBackwardParts picks (at 16 their fp32 sums take
 * no more than the fused selected backward's fp32 dK/dV, which share the
 * bytes, at the paper and prototype shapes); the plan keeps room for the
 * count at its max dims. */
#define CMP_MAX_PARTS 16
cudaError_t fastPoolForward(bf16 *pooled, const bf16 *x, const FastCtx &c, int dim,
                            cudaStream_t stream);
/* io.k, io.v are the pooled kc, vc; io.nkeys = Nc. */
cudaError_t fastCmpForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                           cudaStream_t stream);
/* The parts fastCmpBackward should split its dK/dV into for this shape
 * on a device of sm_count SMs, at most max_parts: written to *parts.
 * Returns an invalid-value error for max_parts or sm_count < 1, else the
 * status of the kernel attribute and occupancy queries it makes (host
 * only, never synchronises; a schedule model replaying up to 16 times the
 * pass's CTAs - callers keep the result: the plan per B and S). */
cudaError_t fastCmpBackwardParts(const FastCtx &c, int dk, int dv, int sm_count, int max_parts,
                                 int *parts);
/* dK/dV of the pooled blocks as `parts` fp32 partial sums (part_k
 * [parts][B][Nc][G][dk], part_v likewise), then the pooling backward sums
 * them in a fixed order into dk_out, dv_out (bf16 [B][S][G][dim]). Its dq
 * comes with the window's (fastWinCmpDq). Returns the first launch or
 * memset error. */
cudaError_t fastCmpBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io, int parts,
                            float *part_k, float *part_v, bf16 *dk_out, bf16 *dv_out,
                            cudaStream_t stream, const FastMarks *marks);

/* fast_select.cu: sel_idx [B][S][G][slots] from q, kc and lse_cmp. */
cudaError_t fastSelect(const FastCtx &c, int dk, const bf16 *q, const bf16 *kc,
                       const float *lse_cmp, int32_t *sel_idx, cudaStream_t stream);

/* fast_sel_dense.cu: the short-sequence selected forward and dQ as masked
 * dense flash attention. Applies where l' is a multiple of 64 and there
 * are at most 64 selection blocks. */
bool fastSelDenseApplies(int S, int sel_len);
/* mask [B][S][G]: bit j set where block j is in the token's sel_idx row. */
cudaError_t fastSelDenseMask(const FastCtx &c, const int32_t *sel_idx, uint64_t *mask,
                             cudaStream_t stream);

/* fast_sel_union.cu: the short-sequence selected forward and dQ. */
cudaError_t fastSelUnionForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                                const int32_t *sel_idx, cudaStream_t stream);
cudaError_t fastSelUnionDq(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                           const int32_t *sel_idx, cudaStream_t stream);

/* The reverse index of the selection, per (b, g): for selection block j the
 * tokens that chose it, ascending (a stable counting sort), and the work
 * items (chunks of item_entries entries) of the dK/dV pass. */
/* Whether the selected dK/dV passes (selDkdvKernel, the fused backward),
 * on wgmma, take their gathered rows through the TMA row ring
 * (fastDkdvRingCore: a box per token) rather than fastDkdvCore's cp.async
 * stages: where a token's rows make a box of FAST_SEL_RING_BOX_BYTES or
 * more (hpg 16); smaller boxes (hpg 6: 768 bytes) were slower than the
 * cp.async stages. */
static inline __host__ __device__ bool fastSelRowRing(int hpg) {
    return hpg * 128 >= FAST_SEL_RING_BOX_BYTES;
}

struct FastRevIndex {
    int chunks;       /* ceil(S / FAST_REV_TOKENS) */
    int item_entries; /* entries per dK/dV work item (fastSelItemEntries), <= FAST_SEL_CHUNK */
    int max_items;    /* per (b, g): Ns + ceil(S * slots / item_entries) */
    int max_parts;    /* per (b, g): n + min(Ns, n) + 1, n = ceil(S * slots / item_entries) */
    int *offsets;     /* [B*G][Ns][chunks] counts, then the entries of j from earlier chunks */
    int *block_start; /* [B*G][Ns+1] where j's list starts (exclusive scan; [Ns] the total) */
    int *item_start;  /* [B*G][Ns+1] */
    int *part_start;  /* [B*G][Ns+1] */
    int *entries;     /* [B*G][S*slots] tokens, grouped by block */
    int *entry_slot;  /* [B*G][S*slots] where the block sits in each entry's sel_idx row */
    float *part_k, *part_v; /* [B*G][max_parts][subtiles][64][dk|dv] */
};
cudaError_t fastSelBuildIndex(const FastCtx &c, const int32_t *sel_idx, const FastRevIndex &rev,
                              cudaStream_t stream);

/* fast_sel_block.cu: the block-centric selected forward (long S). Tokens go
 * in chunks of chunk_revs * FAST_REV_TOKENS per batch row; one chunk's
 * partials fill part_o / part_lse. */
struct FastSelBlock {
    int chunk_revs;  /* reverse-index chunks per token chunk */
    int nchunks;     /* token chunks of the call */
    int max_items;   /* work items per (chunk, b, g), at most */
    int *item_start; /* [nchunks][B*G][Ns+1] */
    int *item_block; /* [nchunks][B*G][max_items]: each work item's block (selBlockPlanKernel) */
    bf16 *part_o;    /* forward: [B][chunk tokens][G][slots][hpg][dv], normalised per block */
    float *part_lse; /* forward: [B][chunk tokens][G][slots][hpg] */
    bf16 *part_dq;   /* dQ: [B][chunk tokens][G][slots][hpg][dk] (the forward's memory) */
    /* chunk c's partials are in buffer c % buffers (fastSelBlockBuffer),
     * part_bytes and part_lse_floats apart */
    int buffers;
    size_t part_bytes, part_lse_floats;
    /* forward (set by fastSelBlockForward, not the caller): 1 where the
     * forced blocks (0, the token's and the one before) went through their
     * own pass into o and lse: the items hold the other entries, and the
     * combine merges o, lse with them */
    int skip_forced;
    /* fused backward: 1 where the forced blocks' dq is formed in the window
     * + compressed dQ pass (fastWinCmpDq): their entries still give dK/dV,
     * but no dq partial, and the dq combine skips their slots */
    int forced_dq_apart;
};
/* Whether the block-centric forward takes the forced blocks of every
 * token (block 0, its own and the one before: 3 of the paper's 16) in a
 * flash pass of their own (SelForcedPolicy) rather than as work items like
 * the chosen blocks: where l' is a multiple of 64, the key tile, and the
 * block kernel runs on wgmma (d_v = 64 or l' = 64; selBlockForward). */
static inline bool fastSelForcedApplies(const FastCtx &c) { return c.sel_len % 64 == 0; }
/* Whether that pass is fast_sel_forced.cu's, one token block per CTA:
 * where l' = 64 (a block is one key tile) and the tile loops run on wgmma;
 * elsewhere it is the forward tile kernel with SelForcedPolicy. */
static inline bool fastSelForcedOwnPass(const FastCtx &c) {
    return fastSelForcedApplies(c) && c.sel_len == 64 && c.wgmma && c.hpg <= 64;
}
/* The forced blocks' merged partial into io.o, io.lse (fast_sel_forced.cu)
 * where fastSelForcedOwnPass(c); cudaErrorInvalidValue elsewhere, else the
 * encode, attribute or launch status. Never synchronises. */
cudaError_t fastSelForcedForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                                 cudaStream_t stream);

/* The fused selected backward leaves the forced blocks' dq to the window +
 * compressed dQ pass (FastSelBlock.forced_dq_apart) where that applies and
 * d_k >= 128, where it then skips those stages' dS.K products too; at d_k
 * = 64 (three CTAs per SM, no registers for the skip) the move was
 * slower. */
static inline bool fastSelForcedDqApplies(const FastCtx &c, int dk) {
    return fastSelForcedApplies(c) && dk >= 128;
}
/* B x tokens per chunk of a block-centric pass whose partial rows hold d
 * values (d_v in the forward, d_k in the dQ): FAST_SEL_BLOCK_TOKENS, or
 * more where FAST_SEL_BLOCK_BYTES of bf16 partials hold more tokens, at
 * most FAST_SEL_BLOCK_MAX_TOKENS. Fewer, longer chunks give each block more
 * tokens per K/V load and each pass more work per launch. */
static inline int fastSelBlockTokens(int G, int slots, int hpg, int d) {
    const long long per_token = (long long)G * slots * hpg * d * 2;
    long long t = FAST_SEL_BLOCK_BYTES / per_token;
    if (t > FAST_SEL_BLOCK_MAX_TOKENS) t = FAST_SEL_BLOCK_MAX_TOKENS;
    return t < FAST_SEL_BLOCK_TOKENS ? FAST_SEL_BLOCK_TOKENS : (int)t;
}
/* Partial buffers for such a pass: FAST_SEL_BLOCK_BUFFERS where its chunk
 * is bound by FAST_SEL_BLOCK_BYTES (the paper shape: a second buffer lets
 * the combines run beside the next chunk, FastDrain), 1 where by the token
 * cap (the prototype's: it was no faster with two, and two would
 * either double its memory or halve its chunks). */
static inline int fastSelBlockBuffers(int G, int slots, int hpg, int d) {
    const long long per_token = (long long)G * slots * hpg * d * 2;
    return FAST_SEL_BLOCK_BYTES / per_token < FAST_SEL_BLOCK_MAX_TOKENS ? FAST_SEL_BLOCK_BUFFERS : 1;
}
/* Token chunk `chunk`'s view of sb: its partials in buffer chunk %
 * sb.buffers (cannot fail). */
static inline FastSelBlock fastSelBlockBuffer(FastSelBlock sb, int chunk) {
    const size_t at = sb.buffers > 1 ? (size_t)(chunk % sb.buffers) : 0;
    if (sb.part_o) sb.part_o = (bf16 *)((char *)sb.part_o + at * sb.part_bytes);
    if (sb.part_dq) sb.part_dq = (bf16 *)((char *)sb.part_dq + at * sb.part_bytes);
    if (sb.part_lse) sb.part_lse += at * sb.part_lse_floats;
    return sb;
}
/* Where a chunked pass's combines run, with FAST_SEL_BLOCK_BUFFERS
 * buffers (sb.buffers): on `stream` (the plan's drain), each after its
 * chunk's pass (made[buffer] recorded behind it), while the pass goes on to
 * the next chunks; a pass that would refill a buffer first waits for
 * drained[buffer], recorded behind that buffer's last combine. NULL in
 * place of a FastDrain (and with one buffer): the combines run on the
 * pass's stream. What this buys is the kernels' tails: per-CTA timelines
 * showed the block scheduler starting no CTA of
 * a combine while a pass still had CTAs waiting, though one would fit, so
 * the passes and combines otherwise run one after another. */
struct FastDrain {
    cudaStream_t stream;
    cudaEvent_t made[FAST_SEL_BLOCK_BUFFERS], drained[FAST_SEL_BLOCK_BUFFERS];
};
/* The drain's steps around chunk `chunk` of a pass on `stream`: before
 * its pass (wait for the buffer to be drained), after it (the stream its
 * combine goes on, which waits for the pass), after the combine (mark the
 * buffer drained), and at the end (the pass's stream waits for the last
 * combine). Each returns the CUDA status; with drain NULL they do nothing
 * and the combine's stream is `stream`. Never synchronise. */
cudaError_t fastDrainBeforePass(const FastDrain *drain, int chunk, cudaStream_t stream);
cudaError_t fastDrainAfterPass(const FastDrain *drain, int chunk, cudaStream_t stream,
                               cudaStream_t *combine_stream);
cudaError_t fastDrainAfterCombine(const FastDrain *drain, int chunk);
cudaError_t fastDrainEnd(const FastDrain *drain, int nchunks, cudaStream_t stream);
/* The chunking for a call of B x S with about budget_tokens tokens (B x
 * chunk) per chunk, at least FAST_REV_TOKENS per batch row (the buffers
 * left NULL, one of them); cannot fail. */
FastSelBlock fastSelBlockShape(int B, int S, int Ns, int slots, int hpg, int budget_tokens);
/* o_sel, lse_sel (io.o, io.lse) from the reverse index rev of sel_idx;
 * the combines on drain's stream where drain is not NULL (the caller's
 * stream waits for the last before this returns). */
cudaError_t fastSelBlockForward(const FastCtx &c, int dk, int dv, const FastFwdIo &io,
                                const int32_t *sel_idx, const FastRevIndex &rev,
                                const FastSelBlock &sb, const FastDrain *drain,
                                cudaStream_t stream);
/* dq of the selected branch per io.dq_mode (block-centric, same index;
 * drain as above). */
cudaError_t fastSelBlockDq(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                           const int32_t *sel_idx, const FastRevIndex &rev, const FastSelBlock &sb,
                           const FastDrain *drain, cudaStream_t stream);
/* The fused selected backward (wgmma, l' <= 64): per token chunk of the
 * dQ's chunking (FastSelBlock), one pass over each chosen block's tokens
 * forms dK/dV and the dq partials together. dK/dV add up across chunks in
 * fp32 (acc); within a chunk a block whose tokens span several work items
 * writes one partial per item, summed in item order. */
struct FastSelFused {
    int item_tokens; /* tokens of one work item (fastSelFusedShape) */
    int max_items;   /* work items per (chunk, b, g), at most */
    int max_parts;   /* item partials per (chunk, b, g), at most */
    int *item_start; /* [nchunks][B*G][Ns+1] */
    int *item_block; /* [nchunks][B*G][max_items]: each work item's block */
    int *part_start; /* [nchunks][B*G][Ns+1]: first partial of each block */
    float *part_k, *part_v; /* [B*G][max_parts][64][dk|dv] */
    float *acc_k, *acc_v;   /* [B][S][G][dk|dv] */
};
/* 64-row stages per fused work item: at most FAST_SEL_FUSED_STAGES, halved
 * (down to FAST_SEL_FUSED_MIN_STAGES) while a chunk holds fewer than 4 x
 * sm_count items' worth of stages. A CTA walks its item's stages one after
 * the other, so the longest item - block 0, which every token chose - is a
 * floor under the chunk's time; with little work per chunk (the proto
 * shape: about 31 stages per CTA slot against 64-stage items) that floor
 * is what the pass waits for. */
/* The fused pass's item size and its item and partial bounds for the
 * chunking sb of B*G = BG rows of groups on a device of sm_count SMs;
 * cannot fail. */
FastSelFused fastSelFusedShape(const FastSelBlock &sb, int Ns, int slots, int hpg, int BG,
                               int sm_count);
/* Work enqueued before each token chunk's dq combine of the fused selected
 * backward: run(ctx, t_begin, t_end, stream) for the chunk's tokens
 * [t_begin, t_end) of every batch row, returning a CUDA status (an error
 * ends the pass). */
struct FastChunkHook {
    cudaError_t (*run)(const void *ctx, int t_begin, int t_end, cudaStream_t stream);
    const void *ctx;
};
/* dK/dV of the selected branch (dk_out, dv_out, bf16) and its dq per
 * io.dq_mode, fused (see FastSelFused): sb the dQ's chunking and partial
 * buffers, f its own buffers; before_combine (NULL: none) runs before each
 * chunk's dq combine, given the stream that combine goes on (fast_attn.cu:
 * the window + compressed dQ of the chunk, on a second stream, that the
 * combine adds to); the combines on drain's stream where drain is not NULL
 * (the caller's stream waits for the last before this returns). */
cudaError_t fastSelFusedBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                                 const int32_t *sel_idx, const FastRevIndex &rev,
                                 const FastSelBlock &sb, const FastSelFused &f, bf16 *dk_out,
                                 bf16 *dv_out, const FastChunkHook *before_combine,
                                 const FastDrain *drain, cudaStream_t stream);
/* dk_out, dv_out overwritten (bf16); dq per io.dq_mode, block-centric when
 * c.sel_dq is FastSelDq::BLOCK or FUSED (sb_dq its chunking and buffers,
 * else NULL), and none when it is DENSE (the masked dense dQ runs in
 * fastWinCmpDq's pass). */
cudaError_t fastSelBackward(const FastCtx &c, int dk, int dv, const FastBwdIo &io,
                            const int32_t *sel_idx, const FastRevIndex &rev,
                            const FastSelBlock *sb_dq, bf16 *dk_out, bf16 *dv_out,
                            cudaStream_t stream, const FastMarks *marks);

#endif
