/* fast_attn.cu - the fast NSA attention op: plan (one workspace allocation),
 * forward, backward and the per-phase profile, on bf16 device tensors.
 *
 * Saved by the forward for the backward (all O(S)): pooled kc/vc, o and lse
 * of each branch, sel_idx. The backward folds the gate into each branch:
 * with D_c = dout.o_c (= dgates_c), dO_c = g_c dout and delta_c = g_c D_c,
 * so no per-branch dO is ever written. dq of the three branches is summed
 * in fp32 in a fixed order (window, then compressed in the same pass, then
 * selected) without atomics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fast_host.h"

#define FAST_MAX_MARKS 24

struct NsaAttnCudaPlan {
    NsaAttnDims max;
    NsaAttnCudaOptions opt; /* as given at create (zero: the defaults) */
    int wgmma;     /* the tile loops on wgmma: sm_90 unless opt.mma says mma.sync */
    void *tma_encode; /* wgmma: the driver's cuTensorMapEncodeTiled (fast_tma.cuh) */
    int device, sm_count;
    int l2_bytes; /* the device's L2 (fastSelItemEntries) */
    int smem_max; /* opt-in shared memory per CTA */
    size_t bytes;         /* device bytes this plan allocated */
    void *base;           /* its state, then (an owner's) its scratch */
    char *scratch_base;   /* the scratch it uses: its own or its owner's */
    NsaAttnCudaPlan *scratch_owner; /* NULL: owns its scratch */
    bf16 *kc, *vc, *o[3];
    float *lse[3], *dsum, *gate_f, *dq_acc, *cmp_part_k, *cmp_part_v;
    size_t cmp_part_capacity; /* elements of cmp_part_k: the max dims' cmp_parts parts */
    /* the compressed backward's parts for the last call's B and S
     * (fastCmpBackwardParts) */
    int cmp_parts, cmp_parts_B, cmp_parts_S; /* set first at the max dims */
    int32_t *sel;
    uint64_t *sel_mask; /* [B][S][G] chosen-block bits (masked dense design) */
    FastRevIndex rev;
    /* the block-centric selected forward's and dQ's chunk buffers (NULL:
     * not planned); sb_part holds the forward's o partials, later the dQ's */
    int *sb_item_start, *sb_item_block;
    void *sb_part;      /* sb_buffers buffers of sb_part_bytes (fastSelBlockBuffers) */
    float *sb_part_lse; /* as many of sb_part_lse_floats */
    size_t sb_part_bytes, sb_part_lse_floats;
    int sb_buffers;
    /* the fused selected backward's buffers (item_start NULL: not planned);
     * its item partials share rev.part_k / part_v, its fp32 dK/dV the
     * compressed backward's partials (that pass is over by then) */
    FastSelFused fused;
    /* B and S of the forward that built the reverse index for this sel
     * (0: none - the backward builds it) */
    int rev_B, rev_S;
    /* the backward's second stream: the window + compressed dQ runs there
     * chunk by chunk beside the fused selected backward at long S
     * (fastBwdSideDq), the selected dK/dV beside the other passes at short
     * S (side_sel); to_side and to_main order the work handed over */
    cudaStream_t side;
    cudaEvent_t to_side, to_main;
    /* the block-centric passes' combines, beside the next chunks' passes */
    FastDrain drain;
    int profile;
    /* profiling: [0] forward, [1] backward marks of the last call */
    cudaEvent_t ev[2][FAST_MAX_MARKS];
    const char *mark_name[2][FAST_MAX_MARKS];
    int n_marks[2];
    FastMarks marks[2];
};

#define FAST_CHECK(call, what)                                                              \
    do {                                                                                    \
        cudaError_t fast_status_ = (call);                                                  \
        if (fast_status_ != cudaSuccess)                                                    \
            return nsaErrorf(err, "nsa fast attention: %s failed: %s", (what),              \
                             cudaGetErrorString(fast_status_));                             \
    } while (0)

/* Which selected-branch kernels a call runs, from the shape and the
 * tensor-core path: the fastest at each shape (docs/FAST_ATTN.md has the
 * table and docs/PERF.md the measurements). force (NsaAttnCudaOptions.sel)
 * overrides it at every shape for the tests and benchmarks; DENSE only
 * where it applies. unfused keeps the dK/dV and a block-centric dQ as two
 * passes where the fused pass would run. Cannot fail.
 *  - on wgmma: masked dense where it applies (l' a multiple of 64, at most
 *    64 blocks) up to FAST_SEL_DENSE_MAX_S; past it the forward is
 *    block-centric where d_v = 64 or S >= 4096, else the union; the dQ is
 *    block-centric where d_k = 64, d_k >= 128 with l' <= 64 (formed in the
 *    dK/dV pass, FUSED, since then a block is one key tile) or S < 8192,
 *    else one warp per token;
 *  - on mma.sync: the union forward below 8192, block-centric from there;
 *    the union dQ below 4096, block-centric from 8192 where d_k = 64, one
 *    warp per token elsewhere. */
struct FastSelDesign {
    FastSelFwd fwd;
    FastSelDq dq;
};
static FastSelDesign fastSelDesign(int S, int d_k, int d_v, int sel_len, NsaAttnSelDesign force,
                                   int wgmma, int unfused) {
    FastSelDesign s;
    const bool dense_ok = fastSelDenseApplies(S, sel_len);
    if (force == NSA_ATTN_SEL_UNION) {
        s = {FastSelFwd::UNION, FastSelDq::UNION};
    } else if (force == NSA_ATTN_SEL_WARP) {
        s = {FastSelFwd::BLOCK, FastSelDq::WARP};
    } else if (force == NSA_ATTN_SEL_BLOCK) {
        s = {FastSelFwd::BLOCK, FastSelDq::BLOCK};
    } else if (dense_ok && (force == NSA_ATTN_SEL_DENSE || (wgmma && S <= FAST_SEL_DENSE_MAX_S))) {
        s = {FastSelFwd::DENSE, FastSelDq::DENSE};
    } else if (wgmma) {
        s.fwd = d_v <= 64 || S >= 4096 ? FastSelFwd::BLOCK : FastSelFwd::UNION;
        s.dq = d_k <= 64 || (d_k >= 128 && sel_len <= 64) || S < 8192 ? FastSelDq::BLOCK
                                                                       : FastSelDq::WARP;
    } else {
        s.fwd = S < 8192 ? FastSelFwd::UNION : FastSelFwd::BLOCK;
        s.dq = S < 4096                 ? FastSelDq::UNION
               : S >= 8192 && d_k == 64 ? FastSelDq::BLOCK
                                        : FastSelDq::WARP;
    }
    /* where the dQ is block-centric, on wgmma with one key tile per block,
     * the dK/dV pass forms it on the way (fast_sel_block.cu) */
    if (s.dq == FastSelDq::BLOCK && !unfused && wgmma && sel_len <= 64) s.dq = FastSelDq::FUSED;
    return s;
}

/* The call context for dims d: the shapes, and with plan options opt the
 * selected design (NULL: only the shapes - for sizing - with the auto
 * design on mma.sync); wgmma: the tile loops' tensor-core path; smem_max:
 * the device's opt-in shared memory per CTA (0 where no kernel is launched
 * with this context). */
static FastCtx fastMakeCtx(const NsaAttnDims *d, const NsaAttnCudaOptions *opt = NULL,
                           int smem_max = 0, int wgmma = 0) {
    FastCtx c;
    c.tma_encode = NULL; /* a plan's calls set it (fastPlanCtx) */
    c.smem_max = smem_max;
    c.wgmma = wgmma;
    const FastSelDesign sd =
        fastSelDesign(d->S, d->d_k, d->d_v, d->sel_len, opt ? opt->sel : NSA_ATTN_SEL_AUTO, wgmma,
                      opt ? opt->sel_unfused : 0);
    c.sel_fwd = sd.fwd;
    c.sel_dq = sd.dq;
    c.B = d->B;
    c.S = d->S;
    c.H = d->H;
    c.G = d->G;
    c.hpg = d->H / d->G;
    c.cmp_len = d->cmp_len;
    c.cmp_stride = d->cmp_stride;
    c.sel_len = d->sel_len;
    c.n_sel = d->n_sel;
    c.window = d->window;
    c.Nc = nsaNumCmpBlocks(d->S, d->cmp_len, d->cmp_stride);
    c.Ns = nsaNumSelBlocks(d->S, d->sel_len);
    c.slots = nsaNumSelSlots(d->n_sel);
    c.scale = 1.0f / sqrtf((float)d->d_k);
    c.scale_log2 = c.scale * FAST_LOG2E;
    return c;
}

/* The context of one call of plan p: fastMakeCtx with the plan's design
 * choices and its TMA encoder. Cannot fail. */
static FastCtx fastPlanCtx(const NsaAttnCudaPlan *p, const NsaAttnDims *dims) {
    FastCtx c = fastMakeCtx(dims, &p->opt, p->smem_max, p->wgmma);
    c.tma_encode = p->tma_encode;
    return c;
}

/* The limits of these kernels beyond nsaAttnDimsValidate. */
static int fastCheckDims(const NsaAttnDims *d, NsaError *err) {
    if (nsaAttnDimsValidate(d, err)) return -1;
    if (!fastDimsSupported(d->d_k, d->d_v))
        return nsaErrorf(err,
                         "nsa fast attention: (d_k, d_v) = (%d, %d) is not built; allowed: "
                         "(64, 64), (128, 64), (128, 128), (192, 128)",
                         d->d_k, d->d_v);
    int hpg = d->H / d->G;
    if (hpg > FAST_MAX_HPG)
        return nsaErrorf(err, "nsa fast attention: H/G = %d heads per group; allowed: 1 to %d", hpg,
                         FAST_MAX_HPG);
    if (nsaNumSelSlots(d->n_sel) > FAST_MAX_SLOTS)
        return nsaErrorf(err, "nsa fast attention: n_sel = %d; allowed: 1 to %d", d->n_sel,
                         FAST_MAX_SLOTS);
    long long span = (63LL * d->cmp_stride + d->cmp_len - 1) / d->sel_len + 2;
    if (span >= FAST_SCORE_RING)
        return nsaErrorf(err,
                         "nsa fast attention: a tile of 64 compressed blocks spans %lld selection "
                         "blocks (cmp_stride %d, cmp_len %d, sel_len %d); allowed: fewer than %d",
                         span, d->cmp_stride, d->cmp_len, d->sel_len, FAST_SCORE_RING);
    if (d->cmp_len / d->cmp_stride > FAST_CMP_MAX_OVERLAP)
        return nsaErrorf(err,
                         "nsa fast attention: cmp_len / cmp_stride = %d compressed blocks hold a "
                         "token; allowed: up to %d",
                         d->cmp_len / d->cmp_stride, FAST_CMP_MAX_OVERLAP);
    size_t hist = (size_t)nsaNumSelBlocks(d->S, d->sel_len) * sizeof(int);
    if (hist > FAST_HIST_SMEM_BYTES)
        return nsaErrorf(err,
                         "nsa fast attention: S / sel_len = %d selection blocks; allowed: up to %d",
                         nsaNumSelBlocks(d->S, d->sel_len), (int)(FAST_HIST_SMEM_BYTES / sizeof(int)));
    return 0;
}

int nsaAttnCudaSupports(const NsaAttnDims *dims, NsaError *err) {
    if (!dims) return nsaErrorf(err, "nsa fast attention: dims pointer is NULL");
    return fastCheckDims(dims, err);
}

/* Entries per work item of the unfused selected dK/dV (selDkdvKernel;
 * FastRevIndex.item_entries). Its CTAs run item after item through each
 * (b, g)'s block lists, and each token's q and dout rows are read once per
 * block it chose, by CTAs of the same (b, g). Where one group's rows fit
 * L2 (short S), items are cut small enough that the groups in flight -
 * the CTAs the SMs hold, over the items of one group - fit three quarters
 * of it, so those re-reads hit L2: with FAST_SEL_CHUNK items the groups in
 * flight at paper 2k overflowed L2 and the pass was bound by its DRAM
 * re-reads. Elsewhere the rows stream through anyway
 * and items stay FAST_SEL_CHUNK long (fewer partials). Cannot fail. */
/* The share of L2 the groups in flight may fill: FAST_SEL_ITEM_L2_SHARE. */
static int fastSelItemEntries(const NsaAttnDims *d, int hpg, int slots, int sm_count,
                              int l2_bytes) {
    const double rows = (double)d->S * hpg * (d->d_k + d->d_v) * 2; /* q, dout of a group */
    const double budget = FAST_SEL_ITEM_L2_SHARE * l2_bytes;
    if (l2_bytes <= 0 || sm_count <= 0 || rows > budget) return FAST_SEL_CHUNK;
    const double in_flight = (d->d_k == 64 ? 3.0 : 2.0) * sm_count; /* CTAs per SM: fast_sel.cu */
    const double items = in_flight / (budget / rows);               /* per group */
    long long e = (long long)((double)d->S * slots / items) / 64 * 64;
    return (int)(e < 256 ? 256 : e > FAST_SEL_CHUNK ? FAST_SEL_CHUNK : e);
}

/* The plan's drain for its block-centric passes: NULL where it keeps one
 * partial buffer (the combines then run in turn with the passes). */
static const FastDrain *fastPlanDrain(const NsaAttnCudaPlan *p) {
    return p->sb_buffers > 1 ? &p->drain : NULL;
}

/* B x tokens per chunk of the plan's block-centric passes whose partial
 * rows hold d values: opt.sel_chunk_tokens where set, else
 * fastSelBlockTokens. Cannot fail. */
static int fastPlanSelTokens(const NsaAttnCudaPlan *p, int G, int slots, int hpg, int d) {
    return p->opt.sel_chunk_tokens > 0 ? p->opt.sel_chunk_tokens
                                       : fastSelBlockTokens(G, slots, hpg, d);
}

/* Carves the workspace in two parts: the plan's state - what its forward
 * leaves for its backward (pooled keys, branch outputs, lse, the selection
 * and its reverse index) - from state_base, and the scratch a call uses
 * and drops (dsum, gates in fp32, the dq accumulator, partial sums, chunk
 * buffers) from scratch_base. NULL bases only measure. Returns the state
 * bytes and sets *scratch_bytes. Plans of one model share one scratch
 * (nsaAttnCudaPlanCreateSharing). */
static size_t fastCarve(NsaAttnCudaPlan *p, const NsaAttnDims *d, char *state_base,
                        char *scratch_base, size_t *scratch_bytes) {
    FastCtx c = fastMakeCtx(d);
    size_t at = 0, at_scratch = 0;
    auto take = [&](size_t bytes) -> void * {
        void *ptr = state_base ? state_base + at : NULL;
        at += (bytes + 255) / 256 * 256;
        return ptr;
    };
    auto scratch = [&](size_t bytes) -> void * {
        void *ptr = scratch_base ? scratch_base + at_scratch : NULL;
        at_scratch += (bytes + 255) / 256 * 256;
        return ptr;
    };
    const size_t T = (size_t)d->B * d->S, rows = T * d->H, BG = (size_t)d->B * d->G;
    p->kc = (bf16 *)take((size_t)d->B * c.Nc * d->G * d->d_k * 2);
    p->vc = (bf16 *)take((size_t)d->B * c.Nc * d->G * d->d_v * 2);
    for (int i = 0; i < 3; i++) {
        p->o[i] = (bf16 *)take(rows * d->d_v * 2);
        p->lse[i] = (float *)take(rows * 4);
    }
    p->sel = (int32_t *)take(T * d->G * c.slots * 4);
    p->sel_mask = (uint64_t *)take(T * d->G * 8);
    p->dsum = (float *)scratch(rows * 3 * 4);
    p->gate_f = (float *)scratch(rows * 3 * 4);
    p->dq_acc = (float *)scratch(rows * d->d_k * 4);
    /* which selected-branch passes a call of any S up to the plan's may
     * run: fastSelDesign is constant in S between the edges below, so
     * asking at each edge tells (0 block forward, 1 block dQ, 2 fused) */
    int need_pass[3] = {0, 0, 0};
    const int edges[] = {1, 4095, 4096, 8191, 8192, FAST_SEL_DENSE_MAX_S, FAST_SEL_DENSE_MAX_S + 1,
                         64 * d->sel_len, 64 * d->sel_len + 1, d->S};
    for (int e = 0; e < (int)(sizeof(edges) / sizeof(edges[0])); e++) {
        if (edges[e] < 1 || edges[e] > d->S) continue;
        const FastSelDesign sd = fastSelDesign(edges[e], d->d_k, d->d_v, d->sel_len, p->opt.sel,
                                               p->wgmma, p->opt.sel_unfused);
        need_pass[0] |= sd.fwd == FastSelFwd::BLOCK;
        need_pass[1] |= sd.dq == FastSelDq::BLOCK || sd.dq == FastSelDq::FUSED;
        need_pass[2] |= sd.dq == FastSelDq::FUSED;
    }
    /* the fused pass's sizes: the largest any call within the plan's B
     * and S makes (more, smaller chunks at larger B; its item size follows
     * the chunk's tokens, which stop growing with S at the budget, so S
     * runs over every chunk length up to the plan's) */
    size_t fused_plan = 0, fused_blocks = 0, fused_part_k = 0, fused_part_v = 0;
    if (need_pass[2]) {
        const int rev_chunks = (d->S + FAST_REV_TOKENS - 1) / FAST_REV_TOKENS;
        for (int bb = 1; bb <= d->B; bb++) {
            /* rc = 0: the plan's S (the most chunks); then every shorter
             * chunk while the chunk is the whole call */
            for (int rc = 0; rc < rev_chunks; rc++) {
                const int s = rc == 0 ? d->S : rc * FAST_REV_TOKENS;
                const FastSelBlock sb =
                    fastSelBlockShape(bb, s, c.Ns, c.slots, c.hpg,
                                      fastPlanSelTokens(p, d->G, c.slots, c.hpg, d->d_k));
                if (rc > 0 && sb.chunk_revs < rc) break; /* chunks stopped growing: sizes too */
                const FastSelFused f =
                    fastSelFusedShape(sb, c.Ns, c.slots, c.hpg, bb * d->G, p->sm_count);
                const size_t plan = (size_t)sb.nchunks * bb * d->G * (c.Ns + 1) * 4;
                const size_t blocks = (size_t)sb.nchunks * bb * d->G * f.max_items * 4;
                const size_t pk = (size_t)bb * d->G * f.max_parts * 64 * d->d_k * 4;
                const size_t pv = (size_t)bb * d->G * f.max_parts * 64 * d->d_v * 4;
                fused_plan = plan > fused_plan ? plan : fused_plan;
                fused_blocks = blocks > fused_blocks ? blocks : fused_blocks;
                fused_part_k = pk > fused_part_k ? pk : fused_part_k;
                fused_part_v = pv > fused_part_v ? pv : fused_part_v;
            }
        }
    }
    /* the compressed backward's partials, and in the same bytes the fused
     * selected backward's fp32 dK/dV (its pass runs after that one) */
    /* room for the parts a call at the max dims takes (fastPlanConfigure;
     * a call of smaller B or S has room for more) */
    const int parts = p->cmp_parts;
    p->cmp_part_capacity = (size_t)parts * d->B * c.Nc * d->G * d->d_k;
    const size_t cmp_k_bytes = (p->cmp_part_capacity * 4 + 255) / 256 * 256;
    const size_t cmp_bytes = cmp_k_bytes + (size_t)parts * d->B * c.Nc * d->G * d->d_v * 4;
    const size_t acc_k_bytes = need_pass[2] ? (T * d->G * d->d_k * 4 + 255) / 256 * 256 : 0;
    const size_t acc_bytes = need_pass[2] ? acc_k_bytes + T * d->G * d->d_v * 4 : 0;
    char *shared = (char *)scratch(cmp_bytes > acc_bytes ? cmp_bytes : acc_bytes);
    p->cmp_part_k = (float *)shared;
    p->cmp_part_v = shared ? (float *)(shared + cmp_k_bytes) : NULL;
    p->fused = FastSelFused{};
    if (need_pass[2]) {
        p->fused.acc_k = (float *)shared;
        p->fused.acc_v = shared ? (float *)(shared + acc_k_bytes) : NULL;
    }
    FastRevIndex &r = p->rev;
    size_t entries = (size_t)d->S * c.slots;
    r.chunks = (d->S + FAST_REV_TOKENS - 1) / FAST_REV_TOKENS;
    r.item_entries = fastSelItemEntries(d, c.hpg, c.slots, p->sm_count, p->l2_bytes);
    const int n_items = (int)((entries + r.item_entries - 1) / r.item_entries);
    r.max_items = c.Ns + n_items;
    /* items of blocks with more than one: at most count / item_entries + 1
     * each, and such a block holds more than item_entries entries */
    r.max_parts = n_items + (n_items < c.Ns ? n_items : c.Ns) + 1;
    int subtiles = (d->sel_len + 63) / 64;
    r.offsets = (int *)take(BG * c.Ns * r.chunks * 4);
    r.block_start = (int *)take(BG * (c.Ns + 1) * 4);
    r.item_start = (int *)take(BG * (c.Ns + 1) * 4);
    r.part_start = (int *)take(BG * (c.Ns + 1) * 4);
    r.entries = (int *)take(BG * entries * 4);
    r.entry_slot = (int *)take(BG * entries * 4);
    /* the dK/dV pass's item partials, or the fused pass's (one or the other runs) */
    const size_t rev_pk = BG * r.max_parts * subtiles * 64 * d->d_k * 4;
    const size_t rev_pv = BG * r.max_parts * subtiles * 64 * d->d_v * 4;
    r.part_k = (float *)scratch(rev_pk > fused_part_k ? rev_pk : fused_part_k);
    r.part_v = (float *)scratch(rev_pv > fused_part_v ? rev_pv : fused_part_v);
    if (need_pass[2]) {
        p->fused.item_start = (int *)scratch(fused_plan);
        p->fused.item_block = (int *)scratch(fused_blocks);
        p->fused.part_start = (int *)scratch(fused_plan);
        p->fused.part_k = r.part_k;
        p->fused.part_v = r.part_v;
    }
    /* block-centric selected forward / dQ: sized for the largest chunking
     * any call within the plan's B and S makes (more, smaller chunks at
     * larger B; the sizes grow with S). */
    p->sb_item_start = NULL;
    p->sb_item_block = NULL;
    p->sb_part = NULL;
    p->sb_part_lse = NULL;
    p->sb_buffers = 1;
    if (need_pass[0] || need_pass[1]) {
        size_t items = 0, blocks = 0, part = 0, lse = 0;
        for (int pass = 0; pass < 2; pass++) {
            if (!need_pass[pass]) continue;
            const int n = fastSelBlockBuffers(d->G, c.slots, c.hpg, pass ? d->d_k : d->d_v);
            if (n > p->sb_buffers) p->sb_buffers = n;
        }
        for (int bb = 1; bb <= d->B; bb++) {
            for (int pass = 0; pass < 2; pass++) { /* 0 forward, 1 dQ */
                if (!need_pass[pass]) continue;
                FastSelBlock sb = fastSelBlockShape(
                    bb, d->S, c.Ns, c.slots, c.hpg,
                    fastPlanSelTokens(p, d->G, c.slots, c.hpg, pass ? d->d_k : d->d_v));
                const size_t it = (size_t)sb.nchunks * bb * d->G * (c.Ns + 1);
                const size_t blk = (size_t)sb.nchunks * bb * d->G * sb.max_items;
                const size_t pairs =
                    (size_t)bb * sb.chunk_revs * FAST_REV_TOKENS * d->G * c.slots * c.hpg;
                const size_t bytes = pairs * (pass ? d->d_k : d->d_v) * sizeof(bf16);
                items = it > items ? it : items;
                blocks = blk > blocks ? blk : blocks;
                part = bytes > part ? bytes : part;
                if (!pass) lse = pairs * 4 > lse ? pairs * 4 : lse;
            }
        }
        p->sb_item_start = (int *)scratch(items * 4);
        p->sb_item_block = (int *)scratch(blocks * 4);
        p->sb_part_bytes = (part + 255) / 256 * 256;
        p->sb_part_lse_floats = (lse / 4 + 63) / 64 * 64;
        p->sb_part = scratch(p->sb_part_bytes * p->sb_buffers);
        p->sb_part_lse = (float *)scratch(p->sb_part_lse_floats * 4 * p->sb_buffers);
    }
    *scratch_bytes = at_scratch;
    return at;
}

/* Checks the options of a plan (NULL: the defaults). Returns 0, or -1 with
 * err naming the field, its value and what is allowed. */
static int fastCheckOptions(const NsaAttnCudaOptions *o, NsaError *err) {
    if (o->sel < NSA_ATTN_SEL_AUTO || o->sel > NSA_ATTN_SEL_DENSE)
        return nsaErrorf(err,
                         "nsa fast attention: options sel = %d; allowed: %d (auto) to %d (dense)",
                         (int)o->sel, (int)NSA_ATTN_SEL_AUTO, (int)NSA_ATTN_SEL_DENSE);
    if (o->mma < NSA_ATTN_MMA_AUTO || o->mma > NSA_ATTN_MMA_WGMMA)
        return nsaErrorf(err,
                         "nsa fast attention: options mma = %d; allowed: %d (auto) to %d (wgmma)",
                         (int)o->mma, (int)NSA_ATTN_MMA_AUTO, (int)NSA_ATTN_MMA_WGMMA);
    if (o->sel_unfused != 0 && o->sel_unfused != 1)
        return nsaErrorf(err, "nsa fast attention: options sel_unfused = %d; allowed: 0, 1",
                         o->sel_unfused);
    if (o->cmp_parts < 0 || o->cmp_parts > CMP_MAX_PARTS)
        return nsaErrorf(err,
                         "nsa fast attention: options cmp_parts = %d; allowed: 0 (auto), 1 to %d",
                         o->cmp_parts, CMP_MAX_PARTS);
    const int chunk = o->sel_chunk_tokens;
    if (chunk != 0 && (chunk < FAST_REV_TOKENS || chunk > FAST_SEL_CHUNK_TOKENS_MAX ||
                       chunk % FAST_REV_TOKENS))
        return nsaErrorf(err,
                         "nsa fast attention: options sel_chunk_tokens = %d; allowed: 0 (auto), or "
                         "a multiple of %d from %d to %d",
                         chunk, FAST_REV_TOKENS, FAST_REV_TOKENS, FAST_SEL_CHUNK_TOKENS_MAX);
    return 0;
}

/* Fills a plan's design for max_dims and options opt (NULL: the defaults)
 * on the current device: the dims and options checked, the device's SM
 * count and shared memory, the tensor-core path. Allocates nothing.
 * Returns 0, or -1 with err (bad dims or options, no device). */
static int fastPlanConfigure(NsaAttnCudaPlan *p, const NsaAttnDims *max_dims,
                             const NsaAttnCudaOptions *opt, NsaError *err) {
    if (fastCheckDims(max_dims, err)) return -1;
    p->max = *max_dims;
    if (opt) p->opt = *opt;
    if (fastCheckOptions(&p->opt, err)) return -1;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&p->sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&p->l2_bytes, cudaDevAttrL2CacheSize, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&p->smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    /* the tile loops' tensor-core path (opt.mma; the tests check both):
     * auto is wgmma on sm_90, where the sm_90a code is built, else
     * mma.sync; wgmma elsewhere is refused */
    int major = 0, minor = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess)
        return nsaErrorf(err, "nsa fast attention: no usable CUDA device: %s",
                         cudaGetErrorString(e));
    p->device = dev;
    const int hopper = major == 9 && minor == 0;
    if (p->opt.mma == NSA_ATTN_MMA_WGMMA && !hopper)
        return nsaErrorf(err,
                         "nsa fast attention: options mma = wgmma on a compute capability "
                         "%d.%d device; allowed: auto, sync, and wgmma on 9.0",
                         major, minor);
    p->wgmma = p->opt.mma == NSA_ATTN_MMA_AUTO ? hopper : p->opt.mma == NSA_ATTN_MMA_WGMMA;
    /* the wgmma tile loops read their key tiles by TMA: without the
     * driver's encoder they cannot run, and we say so rather than fall back */
    if (p->wgmma && (e = fastTmaEncoder(&p->tma_encode)) != cudaSuccess)
        return nsaErrorf(err,
                         "nsa fast attention: the driver offers no "
                         "cuTensorMapEncodeTiled (%s); the wgmma path needs it; "
                         "options mma = sync runs without",
                         cudaGetErrorString(e));
    /* the compressed backward's parts at the max dims: fastCarve keeps
     * room for them, and calls at these dims take them as they are */
    e = fastCmpBackwardParts(fastPlanCtx(p, max_dims), max_dims->d_k, max_dims->d_v,
                             p->sm_count, CMP_MAX_PARTS, &p->cmp_parts);
    if (e != cudaSuccess)
        return nsaErrorf(err, "nsa fast attention: the compressed backward's parts: %s",
                         cudaGetErrorString(e));
    if (p->opt.cmp_parts) p->cmp_parts = p->opt.cmp_parts;
    p->cmp_parts_B = max_dims->B, p->cmp_parts_S = max_dims->S;
    return 0;
}

/* nsaAttnCudaPlanCreate (owner NULL) and nsaAttnCudaPlanCreateSharing. */
static NsaAttnCudaPlan *fastPlanCreate(const NsaAttnDims *max_dims,
                                       const NsaAttnCudaOptions *opt, NsaAttnCudaPlan *owner,
                                       NsaError *err) {
    NsaAttnCudaPlan *p = (NsaAttnCudaPlan *)calloc(1, sizeof(*p));
    if (!p) {
        nsaErrorf(err, "nsa fast attention: out of host memory for the plan");
        return NULL;
    }
    if (fastPlanConfigure(p, max_dims, opt, err)) {
        free(p);
        return NULL;
    }
    if (owner) {
        const NsaAttnDims *o = &owner->max;
        const char *why = NULL;
        if (owner->scratch_owner)
            why = "the plan to share scratch with shares another plan's; allowed: a plan from "
                  "nsaAttnCudaPlanCreate";
        else if (memcmp(o, max_dims, sizeof(*o)) != 0 ||
                 memcmp(&owner->opt, &p->opt, sizeof(p->opt)) != 0)
            why = "dims or options differ from the scratch owner's; allowed: identical max_dims "
                  "and options";
        else if (owner->wgmma != p->wgmma)
            why = "the tensor-core path differs from the scratch owner's; allowed: the same "
                  "tensor-core path";
        else if (owner->device != p->device)
            why = "the scratch owner lives on another device; allowed: the same device";
        if (why) {
            nsaErrorf(err,
                      "nsa fast attention: %s (this plan B=%d S=%d H=%d G=%d on device %d, "
                      "owner B=%d S=%d H=%d G=%d on device %d)",
                      why, max_dims->B, max_dims->S, max_dims->H, max_dims->G, p->device, o->B,
                      o->S, o->H, o->G, owner->device);
            free(p);
            return NULL;
        }
        p->scratch_owner = owner;
    }
    /* an owner holds its scratch after its state; a sharer only its state */
    size_t scratch_bytes = 0;
    const size_t state_bytes = fastCarve(p, max_dims, NULL, NULL, &scratch_bytes);
    p->bytes = owner ? state_bytes : state_bytes + scratch_bytes;
    cudaError_t e = cudaMalloc(&p->base, p->bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* reported here, not by the next launch check */
        nsaErrorf(err,
                  "nsa fast attention: cudaMalloc of the %zu-byte workspace (B=%d S=%d) failed: %s",
                  p->bytes, max_dims->B, max_dims->S, cudaGetErrorString(e));
        free(p);
        return NULL;
    }
    p->scratch_base = owner ? owner->scratch_base : (char *)p->base + state_bytes;
    fastCarve(p, max_dims, (char *)p->base, p->scratch_base, &scratch_bytes);
    for (int i = 0; i < FAST_MAX_MARKS; i++) {
        if (cudaEventCreate(&p->ev[0][i]) != cudaSuccess ||
            cudaEventCreate(&p->ev[1][i]) != cudaSuccess) {
            nsaErrorf(err, "nsa fast attention: cudaEventCreate failed");
            nsaAttnCudaPlanFree(p);
            return NULL;
        }
    }
    /* (at the greatest stream priority the second stream was no faster) */
    if ((e = cudaStreamCreateWithFlags(&p->side, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&p->to_side, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&p->to_main, cudaEventDisableTiming)) != cudaSuccess) {
        nsaErrorf(err, "nsa fast attention: creating the second stream failed: %s",
                  cudaGetErrorString(e));
        nsaAttnCudaPlanFree(p);
        return NULL;
    }
    /* the combines' stream where a second partial buffer lets them run
     * beside the next chunk (at the greatest stream priority it was no
     * faster) */
    e = p->sb_buffers > 1 ? cudaStreamCreateWithFlags(&p->drain.stream, cudaStreamNonBlocking)
                          : cudaSuccess;
    for (int i = 0; e == cudaSuccess && p->sb_buffers > 1 && i < FAST_SEL_BLOCK_BUFFERS; i++)
        if ((e = cudaEventCreateWithFlags(&p->drain.made[i], cudaEventDisableTiming)) ==
            cudaSuccess)
            e = cudaEventCreateWithFlags(&p->drain.drained[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        nsaErrorf(err, "nsa fast attention: creating the combines' stream failed: %s",
                  cudaGetErrorString(e));
        nsaAttnCudaPlanFree(p);
        return NULL;
    }
    return p;
}

extern "C" int nsaAttnCudaPlanMeasure(const NsaAttnDims *max_dims, const NsaAttnCudaOptions *opt,
                                      size_t *state_bytes, size_t *scratch_bytes, NsaError *err) {
    if (!max_dims) return nsaErrorf(err, "nsa fast attention: dims are NULL");
    NsaAttnCudaPlan *p = (NsaAttnCudaPlan *)calloc(1, sizeof(*p));
    if (!p) return nsaErrorf(err, "nsa fast attention: out of host memory for the plan");
    if (fastPlanConfigure(p, max_dims, opt, err)) {
        free(p);
        return -1;
    }
    size_t scratch = 0;
    const size_t state = fastCarve(p, max_dims, NULL, NULL, &scratch);
    free(p);
    if (state_bytes) *state_bytes = state;
    if (scratch_bytes) *scratch_bytes = scratch;
    return 0;
}

extern "C" NsaAttnCudaPlan *nsaAttnCudaPlanCreate(const NsaAttnDims *max_dims,
                                                  const NsaAttnCudaOptions *opt, NsaError *err) {
    return fastPlanCreate(max_dims, opt, NULL, err);
}

extern "C" NsaAttnCudaPlan *nsaAttnCudaPlanCreateSharing(const NsaAttnDims *max_dims,
                                                         const NsaAttnCudaOptions *opt,
                                                         NsaAttnCudaPlan *owner, NsaError *err) {
    if (!owner) {
        nsaErrorf(err, "nsa fast attention: the plan to share scratch with is NULL");
        return NULL;
    }
    return fastPlanCreate(max_dims, opt, owner, err);
}

extern "C" void nsaAttnCudaPlanFree(NsaAttnCudaPlan *p) {
    if (!p) return;
    for (int i = 0; i < FAST_MAX_MARKS; i++) {
        if (p->ev[0][i]) cudaEventDestroy(p->ev[0][i]);
        if (p->ev[1][i]) cudaEventDestroy(p->ev[1][i]);
    }
    if (p->to_side) cudaEventDestroy(p->to_side);
    if (p->to_main) cudaEventDestroy(p->to_main);
    if (p->side) cudaStreamDestroy(p->side);
    for (int i = 0; i < FAST_SEL_BLOCK_BUFFERS; i++) {
        if (p->drain.made[i]) cudaEventDestroy(p->drain.made[i]);
        if (p->drain.drained[i]) cudaEventDestroy(p->drain.drained[i]);
    }
    if (p->drain.stream) cudaStreamDestroy(p->drain.stream);
    cudaFree(p->base);
    free(p);
}

extern "C" size_t nsaAttnCudaPlanBytes(const NsaAttnCudaPlan *p) { return p ? p->bytes : 0; }

/* The call's dims must be the plan's, with B and S no larger. The carve was
 * made for the plan's dims; every buffer is indexed densely by the call's
 * dims, and all sizes grow with B and S, so the plan's buffers hold them. */
static int fastCheckCall(const NsaAttnCudaPlan *p, const NsaAttnDims *d, NsaError *err) {
    if (!p) return nsaErrorf(err, "nsa fast attention: plan is NULL");
    if (fastCheckDims(d, err)) return -1;
    const NsaAttnDims *m = &p->max;
    if (d->H != m->H || d->G != m->G || d->d_k != m->d_k || d->d_v != m->d_v ||
        d->cmp_len != m->cmp_len || d->cmp_stride != m->cmp_stride || d->sel_len != m->sel_len ||
        d->n_sel != m->n_sel || d->window != m->window)
        return nsaErrorf(err, "nsa fast attention: dims differ from the plan's in a field other "
                              "than B and S; allowed: the planned H, G, d_k, d_v, l, d, l', n, w");
    if (d->B > m->B || d->S > m->S)
        return nsaErrorf(err, "nsa fast attention: B=%d S=%d exceed the plan's B=%d S=%d", d->B,
                         d->S, m->B, m->S);
    /* the reverse index lays out [B*G][Ns][chunks]: fits when B and S do */
    return 0;
}

/* The kernels copy tensor rows in 16-byte pieces (cp.async) and store
 * outputs in 4-byte pairs: every base pointer but the gates' must be 16-byte
 * aligned (cudaMalloc gives 256). Returns 0 or -1 naming the tensor. */
static int fastCheckAligned(const char *const *names, const void *const *ptrs, int n,
                            NsaError *err) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0)
            return nsaErrorf(err,
                             "nsa fast attention: %s = %p is not 16-byte aligned; allowed: "
                             "16-byte aligned device pointers",
                             names[i], ptrs[i]);
    return 0;
}

/* The marks of pass (0 forward, 1 backward) when profiling, else NULL. */
static const FastMarks *fastPassMarks(NsaAttnCudaPlan *p, int pass, cudaStream_t stream) {
    if (!p->profile) return NULL;
    p->n_marks[pass] = 0;
    FastMarks *m = &p->marks[pass];
    m->events = p->ev[pass];
    m->names = p->mark_name[pass];
    m->count = &p->n_marks[pass];
    m->max = FAST_MAX_MARKS;
    m->stream = stream;
    return m;
}

#define FAST_MARK(name) FAST_CHECK(fastMark(marks, (name)), "cudaEventRecord")

/* The reverse index sized for this call; partial slots keep the plan's stride. */
static FastRevIndex fastCallRev(const NsaAttnCudaPlan *p, const NsaAttnDims *dims,
                                const FastCtx &c) {
    FastRevIndex rev = p->rev;
    rev.chunks = (dims->S + FAST_REV_TOKENS - 1) / FAST_REV_TOKENS;
    size_t entries = (size_t)dims->S * c.slots;
    rev.max_items = c.Ns + (int)((entries + rev.item_entries - 1) / rev.item_entries);
    return rev;
}

extern "C" int nsaAttnForwardCuda(NsaAttnCudaPlan *p, const NsaAttnDims *dims,
                                  const NsaAttnDeviceInputs *in, void *out, int32_t *sel_idx,
                                  float *lse_cmp, void *stream_ptr, NsaError *err) {
    if (fastCheckCall(p, dims, err)) return -1;
    if (!in || !in->q || !in->k_cmp || !in->v_cmp || !in->k_sel || !in->v_sel || !in->k_win ||
        !in->v_win || !in->gates || !out)
        return nsaErrorf(err, "nsa fast attention: an input or out is NULL; all eight inputs and "
                              "out are required");
    {
        const char *names[] = {"q", "k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win", "out"};
        const void *ptrs[] = {in->q, in->k_cmp, in->v_cmp, in->k_sel, in->v_sel, in->k_win,
                              in->v_win, out};
        if (fastCheckAligned(names, ptrs, 8, err)) return -1;
    }
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const FastCtx c = fastPlanCtx(p, dims);
    const int dk = dims->d_k, dv = dims->d_v;
    const bf16 *q = (const bf16 *)in->q;
    const FastMarks *marks = fastPassMarks(p, 0, stream);
    FAST_MARK("fwd.pool");
    FAST_CHECK(fastPoolForward(p->kc, (const bf16 *)in->k_cmp, c, dk, stream), "pool k_cmp");
    FAST_CHECK(fastPoolForward(p->vc, (const bf16 *)in->v_cmp, c, dv, stream), "pool v_cmp");
    FAST_MARK("fwd.cmp");
    FastFwdIo io = {};
    io.q = q;
    io.k = p->kc;
    io.v = p->vc;
    io.nkeys = c.Nc;
    io.o = p->o[0];
    io.lse = p->lse[0];
    FAST_CHECK(fastCmpForward(c, dk, dv, io, stream), "compressed forward");
    FAST_MARK("fwd.select");
    FAST_CHECK(fastSelect(c, dk, q, p->kc, p->lse[0], p->sel, stream), "selection");
    /* Where the selected forward is masked dense (short S) it runs in the
     * window forward's pass, on the same q tiles (one load of the rows and
     * one launch less); its phase is then that pass's. */
    const bool dense_fwd = c.sel_fwd == FastSelFwd::DENSE;
    FAST_MARK(dense_fwd ? "fwd.sel+win+gate" : "fwd.sel");
    io.k = (const bf16 *)in->k_sel;
    io.v = (const bf16 *)in->v_sel;
    io.nkeys = c.S;
    io.o = p->o[1];
    io.lse = p->lse[1];
    const FastFwdIo sel_io = io;
    p->rev_B = p->rev_S = 0;
    if (dense_fwd || c.sel_dq == FastSelDq::DENSE)
        FAST_CHECK(fastSelDenseMask(c, p->sel, p->sel_mask, stream), "selection mask");
    if (dense_fwd) {
        /* in the window forward below */
    } else if (c.sel_fwd == FastSelFwd::BLOCK) {
        const FastRevIndex rev = fastCallRev(p, dims, c);
        FAST_CHECK(fastSelBuildIndex(c, p->sel, rev, stream), "selection reverse index");
        FastSelBlock sb =
            fastSelBlockShape(dims->B, dims->S, c.Ns, c.slots, c.hpg,
                              fastPlanSelTokens(p, dims->G, c.slots, c.hpg, dims->d_v));
        sb.item_start = p->sb_item_start;
        sb.item_block = p->sb_item_block;
        sb.part_o = (bf16 *)p->sb_part;
        sb.part_lse = p->sb_part_lse;
        sb.part_bytes = p->sb_part_bytes;
        sb.part_lse_floats = p->sb_part_lse_floats;
        sb.buffers = p->sb_buffers;
        FAST_CHECK(fastSelBlockForward(c, dk, dv, io, p->sel, rev, sb, fastPlanDrain(p), stream),
                   "selected forward (block-centric)");
        p->rev_B = dims->B; /* the backward reuses this index */
        p->rev_S = dims->S;
    } else {
        FAST_CHECK(fastSelUnionForward(c, dk, dv, io, p->sel, stream), "selected forward");
    }
    if (!dense_fwd) FAST_MARK("fwd.win+gate");
    io.k = (const bf16 *)in->k_win;
    io.v = (const bf16 *)in->v_win;
    io.o = p->o[2];
    io.lse = p->lse[2];
    io.o_cmp = p->o[0];
    io.o_sel = p->o[1];
    io.gates = (const bf16 *)in->gates;
    io.out = (bf16 *)out;
    FAST_CHECK(fastWinForward(c, dk, dv, io, dense_fwd ? &sel_io : NULL,
                              dense_fwd ? p->sel_mask : NULL, stream),
               dense_fwd ? "selected (masked dense) and window forward" : "window forward");
    FAST_MARK("end");
    const size_t T = (size_t)dims->B * dims->S;
    if (sel_idx)
        FAST_CHECK(cudaMemcpyAsync(sel_idx, p->sel, T * dims->G * c.slots * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, stream),
                   "copy of sel_idx");
    if (lse_cmp)
        FAST_CHECK(cudaMemcpyAsync(lse_cmp, p->lse[0], T * dims->H * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream),
                   "copy of lse_cmp");
    return 0;
}

/* dsum[r][c] = dout[r].o_c[r] (fp32) and dgates = the same in bf16; dv / 8
 * lanes per row (16-byte loads, every load of a row in flight at once),
 * summed in a fixed shuffle order. gate_f = the gates in fp32, for the
 * dK/dV kernels' 4-byte async copies. dv is 64 or 128 (fastCheckDims). */
__global__ void fastGateBackwardKernel(float *dsum, bf16 *dgates, float *gate_f, const bf16 *gates,
                                       const bf16 *dout, const bf16 *o0, const bf16 *o1,
                                       const bf16 *o2, size_t rows, int dv) {
    const int lpr = dv / 8; /* lanes per row: 8 or 16 */
    const int lane = threadIdx.x & 31, sub = lane % lpr, col = sub * 8;
    const size_t group = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / lpr;
    const size_t ngroups = ((size_t)gridDim.x * blockDim.x) / lpr;
    /* every lane of the warp runs the same trip count (the shuffles need
     * them all): rows past the end compute on row 0 and store nothing */
    for (size_t base = group - group % (32 / lpr); base < rows; base += ngroups) {
        const size_t r0 = base + (lane / lpr), r = r0 < rows ? r0 : 0;
        const uint4 dy4 = *(const uint4 *)(dout + r * dv + col);
        const bf16 *os[3] = {o0, o1, o2};
        uint4 o4[3];
#pragma unroll
        for (int k = 0; k < 3; k++) o4[k] = *(const uint4 *)(os[k] + r * dv + col);
        const __nv_bfloat162 *dy2 = (const __nv_bfloat162 *)&dy4;
#pragma unroll
        for (int k = 0; k < 3; k++) {
            const __nv_bfloat162 *o2v = (const __nv_bfloat162 *)&o4[k];
            float v = 0.f;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 a = __bfloat1622float2(dy2[e]), o = __bfloat1622float2(o2v[e]);
                v += a.x * o.x + a.y * o.y;
            }
            for (int off = lpr / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
            if (sub == 0 && r0 < rows) {
                dsum[r * 3 + k] = v;
                dgates[r * 3 + k] = __float2bfloat16(v);
                gate_f[r * 3 + k] = __bfloat162float(gates[r * 3 + k]);
            }
        }
    }
}

/* The window + compressed dQ beside the fused selected backward (a
 * FastChunkHook, run before each chunk's dq combine): that pass, compute
 * bound, goes on the plan's second stream one token chunk at a time (dq_acc
 * = its dq, ACC), while the main stream runs the selected passes, which
 * wait on DRAM; the chunk's combine (dq_out = dq_acc + the selected
 * partials) then waits for the chunk's dq. */
struct FastBwdSideDq {
    const NsaAttnCudaPlan *p;
    FastCtx c;
    int dk, dv;
    FastBwdIo win;
    const FastBwdIo *cmp;        /* the compressed branch (its keys kc, vc and lse) */
    const FastBwdIo *sel_forced; /* the forced selected blocks' dq in the pass too, or NULL */
};
static cudaError_t fastBwdSideDq(const void *ctx, int t_begin, int t_end, cudaStream_t stream) {
    const FastBwdSideDq *w = (const FastBwdSideDq *)ctx;
    cudaError_t e = fastWinCmpDq(w->c, w->dk, w->dv, w->win, w->cmp, w->sel_forced, NULL, t_begin,
                                 t_end, w->p->side);
    if (e == cudaSuccess) e = cudaEventRecord(w->p->to_main, w->p->side);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, w->p->to_main, 0);
    return e;
}

/* io aimed at one branch: its keys and values (nkeys of them per (b, g)),
 * its lse, and its index in the per-row (cmp, sel, win) triples. */
static FastBwdIo fastBranchIo(FastBwdIo io, const void *k, const void *v, int nkeys,
                              const float *lse, int branch) {
    io.k = (const bf16 *)k;
    io.v = (const bf16 *)v;
    io.nkeys = nkeys;
    io.lse = lse;
    io.branch = branch;
    return io;
}

extern "C" int nsaAttnBackwardCuda(NsaAttnCudaPlan *p, const NsaAttnDims *dims,
                                   const NsaAttnDeviceInputs *in, const void *dout,
                                   const NsaAttnDeviceGrads *grads, void *stream_ptr,
                                   NsaError *err) {
    if (fastCheckCall(p, dims, err)) return -1;
    if (!in || !in->q || !in->k_cmp || !in->v_cmp || !in->k_sel || !in->v_sel || !in->k_win ||
        !in->v_win || !in->gates || !dout)
        return nsaErrorf(err, "nsa fast attention: an input or dout is NULL; all are required");
    if (!grads || !grads->dq || !grads->dk_cmp || !grads->dv_cmp || !grads->dk_sel ||
        !grads->dv_sel || !grads->dk_win || !grads->dv_win || !grads->dgates)
        return nsaErrorf(err,
                         "nsa fast attention: a gradient output is NULL; all eight are required");
    {
        const char *names[] = {"q",      "k_cmp",  "v_cmp",  "k_sel",  "v_sel",  "k_win",
                               "v_win",  "dout",   "dq",     "dk_cmp", "dv_cmp", "dk_sel",
                               "dv_sel", "dk_win", "dv_win"};
        const void *ptrs[] = {in->q,         in->k_cmp,      in->v_cmp,      in->k_sel,
                              in->v_sel,     in->k_win,      in->v_win,      dout,
                              grads->dq,     grads->dk_cmp,  grads->dv_cmp,  grads->dk_sel,
                              grads->dv_sel, grads->dk_win,  grads->dv_win};
        if (fastCheckAligned(names, ptrs, 15, err)) return -1;
    }
    cudaStream_t stream = (cudaStream_t)stream_ptr;
    const FastCtx c = fastPlanCtx(p, dims);
    const int dk = dims->d_k, dv = dims->d_v;
    const size_t rows = (size_t)dims->B * dims->S * dims->H;

    const FastMarks *marks = fastPassMarks(p, 1, stream);
    FAST_MARK("bwd.gate");
    unsigned blocks = (unsigned)((rows * (dv / 8) + 255) / 256);
    if (blocks > 65535u * 8u) blocks = 65535u * 8u;
    fastGateBackwardKernel<<<blocks, 256, 0, stream>>>(
        p->dsum, (bf16 *)grads->dgates, p->gate_f, (const bf16 *)in->gates, (const bf16 *)dout,
        p->o[0], p->o[1], p->o[2], rows, dv);
    FAST_CHECK(cudaGetLastError(), "gate backward");

    FastBwdIo io = {};
    io.q = (const bf16 *)in->q;
    io.dout = (const bf16 *)dout;
    io.gates = (const bf16 *)in->gates;
    io.dsum = p->dsum;
    io.gate_f = p->gate_f;
    io.dq_acc = p->dq_acc;
    io.dq_out = (bf16 *)grads->dq;

    FastBwdIo win = fastBranchIo(io, in->k_win, in->v_win, c.S, p->lse[2], 2);
    win.dq_mode = FastDqMode::ACC;
    FastBwdIo cmp = fastBranchIo(io, p->kc, p->vc, c.Nc, p->lse[0], 0);
    FastBwdIo sel = fastBranchIo(io, in->k_sel, in->v_sel, c.S, p->lse[1], 1);
    /* Where the selected dQ is masked dense flash attention (short S) it
     * joins the window and compressed dQ pass as a third branch: the
     * q / dout tiles are loaded once, and dq goes out once in bf16 instead
     * of through an fp32 running sum written by one pass and read by the
     * next (fastSelBackward then forms only dK/dV). */
    const bool joint_dq = c.sel_dq == FastSelDq::DENSE;
    const FastRevIndex rev = fastCallRev(p, dims, c);
    /* That leaves the selected dK/dV (its index and reverse-index pass)
     * needing nothing of the other passes but the gate backward's: it runs
     * on the second stream beside them. */
    const bool side_sel = joint_dq;
    if (side_sel) {
        FAST_CHECK(cudaEventRecord(p->to_side, stream), "cudaEventRecord");
        FAST_CHECK(cudaStreamWaitEvent(p->side, p->to_side, 0), "cudaStreamWaitEvent");
        if (p->rev_B != dims->B || p->rev_S != dims->S) /* the forward did not build it */
            FAST_CHECK(fastSelBuildIndex(c, p->sel, rev, p->side), "selection reverse index");
        FAST_CHECK(fastSelBackward(c, dk, dv, sel, p->sel, rev, NULL, (bf16 *)grads->dk_sel,
                                   (bf16 *)grads->dv_sel, p->side, NULL),
                   "selected backward (beside the others)");
        FAST_CHECK(cudaEventRecord(p->to_main, p->side), "cudaEventRecord");
    }
    FAST_CHECK(fastWinBackward(c, dk, dv, win, (bf16 *)grads->dk_win, (bf16 *)grads->dv_win,
                               stream, marks),
               "window backward");
    /* where the fused selected backward runs, the window + compressed dQ
     * runs beside it on the second stream (fastBwdSideDq) */
    const bool fused = c.sel_dq == FastSelDq::FUSED;
    /* and with it the forced selected blocks' dq (FastSelBlock.forced_dq_apart) */
    const bool forced_dq = fused && fastSelForcedDqApplies(c, dk);
    io = cmp;
    if (p->cmp_parts_B != dims->B || p->cmp_parts_S != dims->S) { /* host work, once per B, S */
        const size_t per_part = (size_t)dims->B * c.Nc * dims->G * dk;
        const size_t room = per_part > 0 ? p->cmp_part_capacity / per_part : CMP_MAX_PARTS;
        FAST_CHECK(fastCmpBackwardParts(c, dk, dv, p->sm_count,
                                        room < CMP_MAX_PARTS ? (int)room : CMP_MAX_PARTS,
                                        &p->cmp_parts),
                   "compressed backward's parts");
        if (p->opt.cmp_parts)
            p->cmp_parts = room < (size_t)p->opt.cmp_parts ? (int)room : p->opt.cmp_parts;
        p->cmp_parts_B = dims->B, p->cmp_parts_S = dims->S;
    }
    FAST_CHECK(fastCmpBackward(c, dk, dv, io, p->cmp_parts, p->cmp_part_k, p->cmp_part_v,
                               (bf16 *)grads->dk_cmp, (bf16 *)grads->dv_cmp, stream, marks),
               "compressed backward");
    /* dq = window + compressed terms in one pass (written, ACC) and the
     * selected branch adds its own and writes the bf16 result, or all
     * three in the one pass (joint_dq) */
    if (joint_dq) {
        FAST_MARK("bwd.win+cmp+sel.dq");
        FAST_CHECK(fastWinCmpDq(c, dk, dv, win, &cmp, &sel, p->sel_mask, 0, c.S, stream),
                   "window, compressed and selected dq");
    } else if (!fused) {
        FAST_MARK("bwd.win+cmp.dq");
        FAST_CHECK(fastWinCmpDq(c, dk, dv, win, &cmp, NULL, NULL, 0, c.S, stream),
                   "window and compressed dq");
    }
    if (side_sel) { /* the caller's stream goes on once the selected dK/dV is done */
        FAST_MARK("bwd.sel.wait");
        FAST_CHECK(cudaStreamWaitEvent(stream, p->to_main, 0), "cudaStreamWaitEvent");
        FAST_MARK("end");
        return 0;
    }
    FAST_MARK("bwd.sel.index");

    if (p->rev_B != dims->B || p->rev_S != dims->S) /* the forward did not build it */
        FAST_CHECK(fastSelBuildIndex(c, p->sel, rev, stream), "selection reverse index");
    io = sel;
    io.dq_mode = FastDqMode::ACC_OUT;
    FastSelBlock sbq = {};
    const bool block_dq = c.sel_dq == FastSelDq::BLOCK || fused;
    if (block_dq) {
        sbq = fastSelBlockShape(dims->B, dims->S, c.Ns, c.slots, c.hpg,
                                fastPlanSelTokens(p, dims->G, c.slots, c.hpg, dims->d_k));
        sbq.item_start = p->sb_item_start;
        sbq.item_block = p->sb_item_block;
        sbq.part_dq = (bf16 *)p->sb_part;
        sbq.part_bytes = p->sb_part_bytes;
        sbq.buffers = p->sb_buffers;
        sbq.forced_dq_apart = forced_dq;
    }
    if (fused) {
        if (!p->fused.item_start || !sbq.part_dq)
            return nsaErrorf(err, "nsa fast attention: the fused selected backward was not planned "
                                  "(a bug: fastCarve and fastSelDesign disagree)");
        FastSelFused f = p->fused;
        const FastSelFused shape =
            fastSelFusedShape(sbq, c.Ns, c.slots, c.hpg, dims->B * dims->G, p->sm_count);
        f.item_tokens = shape.item_tokens;
        f.max_items = shape.max_items;
        f.max_parts = shape.max_parts;
        const FastBwdSideDq side = {p, c, dk, dv, win, &cmp,
                                    forced_dq ? &sel : NULL};
        const FastChunkHook hook = {fastBwdSideDq, &side};
        FAST_MARK("bwd.sel+win+cmp.dq");
        /* the second stream starts behind everything so far (forked right
         * after the gate backward instead, so that the dQ chunks could also
         * run beside the window and compressed dK/dV, it was slower) */
        FAST_CHECK(cudaEventRecord(p->to_side, stream), "cudaEventRecord");
        FAST_CHECK(cudaStreamWaitEvent(p->side, p->to_side, 0), "cudaStreamWaitEvent");
        FAST_CHECK(fastSelFusedBackward(c, dk, dv, io, p->sel, rev, sbq, f, (bf16 *)grads->dk_sel,
                                        (bf16 *)grads->dv_sel, &hook, fastPlanDrain(p), stream),
                   "fused selected backward beside the window and compressed dq");
        FAST_MARK("end");
        return 0;
    }
    FAST_CHECK(fastSelBackward(c, dk, dv, io, p->sel, rev, block_dq ? &sbq : NULL,
                               (bf16 *)grads->dk_sel, (bf16 *)grads->dv_sel, stream, marks),
               "selected backward");
    FAST_MARK("end");
    return 0;
}

extern "C" int nsaAttnCudaProfile(NsaAttnCudaPlan *p, int enable, NsaError *err) {
    if (!p) return nsaErrorf(err, "nsa fast attention: plan is NULL");
    p->profile = enable != 0;
    p->n_marks[0] = p->n_marks[1] = 0;
    return 0;
}

extern "C" int nsaAttnCudaProfileRead(NsaAttnCudaPlan *p, const char **names, float *ms, int max,
                                      NsaError *err) {
    if (!p) return nsaErrorf(err, "nsa fast attention: plan is NULL");
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i + 1 < p->n_marks[pass] && n < max; i++, n++) {
            FAST_CHECK(cudaEventSynchronize(p->ev[pass][i + 1]), "cudaEventSynchronize");
            FAST_CHECK(cudaEventElapsedTime(&ms[n], p->ev[pass][i], p->ev[pass][i + 1]),
                       "cudaEventElapsedTime");
            names[n] = p->mark_name[pass][i];
        }
    }
    return n;
}
