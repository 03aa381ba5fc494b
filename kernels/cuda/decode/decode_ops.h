/* decode_ops.h - the kernels of one CUDA decode step (internal to
 * kernels/cuda/decode/; C++ linkage). Every launcher enqueues on
 * ln->stream (it may be capturing a graph), overlapped with the kernel
 * before it when ln->overlap (see DecLaunch), never synchronises or
 * allocates, and returns 0, or -1 with err on a launch failure.
 *
 * Rows: a pass handles B rows; row b is slot row_slot[b] at position
 * row_pos[b] (device memory, set by decRows from the staged slot and the
 * slots' positions, which decAdvance moves on at the end of a pass). A
 * decode step has one row per slot (slots base .. base+B-1, each at its own
 * position); a prefill pass has B consecutive positions of one slot, so
 * every row's cache entries are appended (decAppend) before any row reads
 * them, and blocks are pooled after that (decPool).
 * Caches of one layer, slot s, group g (bf16 unless said):
 *   k_sel/v_sel [s][g][T][d]      position u at row u
 *   k_win/v_win [s][g][W][d]      ring, u at row u % W (W = min(w + R - 1, T):
 *                                 a prefill pass of R rows overwrites none
 *                                 that its first row still reads)
 *   kc/vc       [s][g][Nc][d]     pooled block i
 *   k_raw/v_raw [s][g][Lr][d] fp32 ring of raw compressed-branch rows, u at
 *                                 u % Lr (Lr = l + R - 1, likewise)
 * Projections of a row (fp32, proj [B][P]): q [H][dk], then k_cmp, v_cmp,
 * k_sel, v_sel, k_win, v_win ([G][dk] or [G][dv] each), then the gate
 * logits [H][3] - the row order of the concatenated projection weight. */
#ifndef NSA_CUDA_DECODE_OPS_H
#define NSA_CUDA_DECODE_OPS_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "../../nsa.h"

typedef __nv_bfloat16 bf16;

#define DEC_MAX_BATCH 64      /* slots a decode step takes */
#define DEC_PREFILL_ROWS 256  /* positions of one slot a prefill pass takes */
#define DEC_MAX_ROWS 256      /* rows of one pass: max(DEC_MAX_BATCH, DEC_PREFILL_ROWS) */
#define DEC_MAX_HEADS_PER_GROUP 16
#define DEC_MAX_HEAD_DIM 256
#define DEC_MAX_SEL_BLOCKS 4096
#define DEC_CMP_CHUNK 64      /* compressed blocks per CTA of decCmp */
#define DEC_SEL_CHUNK 64      /* selection blocks per CTA of the selection's scores */
#define DEC_UNIT 64           /* keys per CTA of decSelWin; key tile of decCmp */
#define DEC_MLP_POOL_MAX 8192 /* l * max(dk, dv) for phi = mlp (shared memory) */

/* ---- overlapped launches --------------------------------------------------
 * A pass is a chain of about ten small kernels a layer, each waiting for the
 * one before; launched plainly, every kernel pays its launch after its
 * predecessor has drained. With overlap (programmatic dependent launch,
 * sm_90 code) the next kernel of the chain is launched while the current
 * one finishes: every decode kernel waits at its start until its
 * predecessor has finished and its writes are visible (decWaitPrior), and
 * lets its successor launch as its last step (decLetNextLaunch). Before the
 * wait a kernel reads weights only (the matrix-vector kernels prefetch
 * theirs into L2 there). Every CTA waits before it can exit, so a kernel
 * ends after its predecessor and the chain orders the pass exactly as plain
 * launches would. Letting the successor launch at the start instead (every
 * later kernel resident and waiting at once) was slower; see docs/PERF.md.
 * Both instructions are no-ops for a kernel launched without overlap. */
typedef struct DecLaunch {
    cudaStream_t stream;
    int overlap;   /* launch with programmatic stream serialisation */
} DecLaunch;

__device__ __forceinline__ void decLetNextLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void decWaitPrior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Launches kernel on ln->stream, overlapped with its predecessor when
 * ln->overlap; returns the launch's error (cudaSuccess when enqueued). */
template <typename... Params, typename... Args>
static inline cudaError_t decLaunchKernel(const DecLaunch *ln, void (*kernel)(Params...), dim3 grid,
                                          dim3 block, size_t smem, Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ln->stream;
    cfg.attrs = &attr;
    cfg.numAttrs = ln->overlap ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* decLaunchKernel, returning -1 with err (naming the kernel) on failure. */
#define DEC_LAUNCH(name, ln, err, ...)                                                             \
    do {                                                                                           \
        const cudaError_t dec_launch_status_ = decLaunchKernel((ln), __VA_ARGS__);                 \
        if (dec_launch_status_ != cudaSuccess)                                                     \
            return nsaErrorf((err), "cuda: launch of %s failed at %s:%d: %s", (name), __FILE__,    \
                             __LINE__, cudaGetErrorString(dec_launch_status_));                    \
    } while (0)

/* Whether this build's decode kernels can overlap their launches on the
 * current device (their code is sm_90 or later); 0 or -1 with err. */
int decOverlapSupported(int *overlap, NsaError *err);

/* ---- decode_gemv.cu ----
 * out[b][n] = sum_k in[b][k] W[n][k] for b < B, W bf16 [N][K] (K % 8 == 0,
 * 16-byte aligned rows). The input is either the fp32 residual x with
 * RMSNorm applied on the fly (norm_w given: x * rstd * norm_w, rstd from the
 * row in fp32) or a bf16 activation xb. Modes: STORE writes fp32 out, ADD
 * adds into fp32 out (the residual stream), SILU writes bf16
 * silu(out) to outb, SWIGLU reads W as [2N][K] and writes bf16
 * silu(row n) * (row N + n). One row runs on CUDA cores in fp32, two or
 * more (B <= DEC_MAX_ROWS) on tensor cores, 16 rows a tile. */
typedef enum DecGemvMode { DEC_STORE = 0, DEC_ADD = 1, DEC_SILU = 2, DEC_SWIGLU = 3 } DecGemvMode;
typedef struct DecGemv {
    const bf16 *w;
    int N, K, B;
    const float *x, *norm_w;
    float eps;
    const bf16 *xb;
    float *out;
    bf16 *outb;
} DecGemv;
int decGemv(const DecGemv *g, DecGemvMode mode, const DecLaunch *ln, NsaError *err);

/* ---- decode_attn.cu ---- */
typedef struct DecDims {
    int B, H, G, dk, dv;
    int T;            /* max_context: rows of k_sel/v_sel */
    int W;            /* window ring rows, min(w + R - 1, T) (R: rows_max) */
    int raw_ring;     /* raw compressed-branch ring rows, l + R - 1 */
    int Nc;           /* pooled rows per slot: nsaNumCmpBlocks(T) (>= 1) */
    int n_chunks;     /* ceil(Nc / DEC_CMP_CHUNK) */
    int l, d, l_sel, n_sel, slots, window;
    int sel_chunks;   /* ceil(selection blocks of T / DEC_SEL_CHUNK) (decSelectDims) */
    int cand_stride;  /* min(slots, DEC_SEL_CHUNK): candidates a chunk keeps (decSelectDims) */
    int sel_units;    /* slots * ceil(l_sel / DEC_UNIT) */
    int win_units;    /* ceil(min(w, T) / DEC_UNIT) */
    int proj_stride;  /* P: projection row length */
    int phi_mlp;
    int pool_in_append; /* decode: decAppend pools a completed block; prefill: decPool does */
} DecDims;

typedef struct DecLayerCache {
    bf16 *k_sel, *v_sel, *k_win, *v_win, *kc, *vc;
    float *k_raw, *v_raw;
    const float *phi_k_pos, *phi_k_w1, *phi_k_w2;   /* phi = mlp, fp32 */
    const float *phi_v_pos, *phi_v_w1, *phi_v_w2;
} DecLayerCache;

typedef struct DecScratch {
    const int *row_slot, *row_pos; /* [B]: each row's slot and position (decRows) */
    const float *rope;     /* [T][dk/2][2] cos, sin */
    float *proj;           /* [B][P] */
    float *q;              /* [B][H][dk] rotated */
    float *cmp_scores;     /* [B][H][Nc] scale q.kc_i */
    float *cmp_m, *cmp_l;  /* [B][H][n_chunks] */
    float *cmp_o;          /* [B][H][n_chunks][dv] */
    int2 *sel_cand;        /* [B][G][sel_chunks][cand_stride]: a chunk's best (score bits, j) */
    int *sel;              /* [B][G][slots] */
    float *sw_m, *sw_l;    /* [B][H][sel_units + win_units] */
    float *sw_o;           /* [B][H][units][dv] */
    bf16 *y;               /* [B][H*dv] gate-combined attention output */
} DecScratch;

/* row_slot[b], row_pos[b] for b < B from stage (the staged slot base, or
 * for prefill the slot) and pos (each slot's next position): decode rows
 * are slots base+b at their positions, prefill rows positions pos+b of one
 * slot. */
int decRows(int *row_slot, int *row_pos, const int *stage, const int *pos, int B, int prefill,
            const DecLaunch *ln, NsaError *err);
/* RoPE on q and the three branch keys of every row, cache appends, and (when
 * dm->pool_in_append) the pooled block when the row's position completes
 * one. Grid (B, G). */
int decAppend(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
              NsaError *err);
/* The pooled blocks the rows' positions complete, after decAppend (prefill:
 * the rows of one slot share the raw ring). Grid (B, G). */
int decPool(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
            NsaError *err);
/* Compressed attention partials over chunks of visible blocks, and the raw
 * scores for the selection. Grid (B*G, n_chunks). */
int decCmp(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
           NsaError *err);
/* The selection (two kernels): each head's log-sum-exp from the compressed
 * partials, the selection blocks' scores, every chunk's best candidates
 * (grid (B*G, sel_chunks)), then the forced and top blocks (sel; grid
 * (B*G)). */
int decSelect(const DecDims *dm, const DecScratch *s, const DecLaunch *ln, NsaError *err);
/* Sets dm->sel_chunks and dm->cand_stride from dm->T, l_sel and slots;
 * cannot fail. */
void decSelectDims(DecDims *dm);
/* Selected and window attention partials, DEC_UNIT keys per CTA, every
 * head of the group at once. Grid (B*G, sel_units + win_units). */
int decSelWin(const DecDims *dm, const DecLayerCache *c, const DecScratch *s, const DecLaunch *ln,
              NsaError *err);
/* Merges each branch's partials (compressed chunks, selected and window
 * units) and combines the branches with the gates into y. Grid (B, H). */
int decCombine(const DecDims *dm, const DecScratch *s, const DecLaunch *ln, NsaError *err);
/* Lets decCmp, decSelWin and the selection use the shared memory dm's
 * sizes need (above 48 KB only for large heads, long selection blocks or
 * many of them); -1 with err when the selection's or decCombine's would not
 * fit. Once per decoder, before any pass. */
int decAttnPrepare(const DecDims *dm, NsaError *err);

/* ---- decode_prompt.cu ----
 * The fast NSA op's bf16 inputs of a whole prompt (keys rotated), branch
 * order cmp, sel, win: k [n][G][dk], v [n][G][dv]. */
typedef struct DecPromptInputs {
    const bf16 *k[3], *v[3];
} DecPromptInputs;
/* Fills slot's caches (and its compressed blocks, phi = avg) as n decode
 * steps of the prompt would have; plain launches on stream. 0 or -1 with
 * err. */
int decPromptCaches(const DecDims *dm, const DecLayerCache *c, int slot, const DecPromptInputs *in,
                    int n, cudaStream_t stream, NsaError *err);

/* x[b] = tok_emb[tokens[b]] (fp32). */
int decEmbed(float *x, const float *tok_emb, const int *tokens, int B, int C, const DecLaunch *ln,
             NsaError *err);
/* Decode: pos[stage[0] + b] += 1 for b < B; prefill: pos[stage[0]] += B. */
int decAdvance(int *pos, const int *stage, int B, int prefill, const DecLaunch *ln, NsaError *err);

#endif /* NSA_CUDA_DECODE_OPS_H */
