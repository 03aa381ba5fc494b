/* layers_cuda.h - the transformer layer ops of the CUDA engine, one file
 * each under kernels/cuda/layers/ (forward and backward side by side): embedding,
 * RMSNorm, RoPE, activations, cross-entropy, global norm + AdamW, and the
 * phi = mlp block pooling (its two GEMMs go through gemm.h).
 * Device fp32 pointers, row-major, N rows (tokens) as size_t. Every
 * launcher enqueues on stream and returns 0, or -1 with err on a launch
 * failure. None allocates; scratch buffers come from the caller.
 * Unless a launcher says "adds", it overwrites its outputs. */
#ifndef NSA_CUDA_LAYERS_H
#define NSA_CUDA_LAYERS_H

#include <cuda_runtime.h>
#include <stdint.h>
#include "../../nsa.h"

/* Storage type of a tensor the engine hands to a GEMM or to the fast
 * attention op. fp32 mode keeps everything DTYPE_F32; bf16 and fp16 modes
 * store GEMM operands (activations, gradients of activations, the weight
 * copy) in DTYPE_BF16 / DTYPE_F16, and the fast attention op's tensors in
 * DTYPE_BF16. Arithmetic is fp32 in every kernel; values round once when
 * stored. The numbering is shared with loadAs/storeAs (cuda_common.cuh). */
typedef enum DType { DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_F16 = 2 } DType;
static inline size_t dtypeBytes(DType t) { return t == DTYPE_F32 ? 4 : 2; }

/* ---- convert.cu ----
 * dst[i] = (dt) src[i] for n elements; any pair of types (a same-type call
 * is a copy). Enqueues on stream; -1 with err on a launch failure. */
int convertTensor(void *dst, DType dt, const void *src, DType st, size_t n, cudaStream_t stream,
                  NsaError *err);

/* ---- embedding.cu ----
 * Forward: out[n] = table[tokens[n]].
 * Backward (adds into dtable), deterministic without float atomics: the
 * host sorts positions by token (embeddingPlanBackward, a counting sort)
 * and cuts each token's run into chunks of at most EMBED_CHUNK positions;
 * pass 1 sums each chunk in position order into partial[chunk][C], pass 2
 * adds each token's chunks in order into its row. */
#define EMBED_CHUNK 256
typedef struct EmbedPlan {
    int32_t *order;        /* [N] positions sorted by token, stable */
    int32_t *chunk_start;  /* [n_chunks + 1] into order */
    int32_t *chunk_token;  /* [n_chunks] */
    int32_t *token_chunk;  /* [V + 1]: chunks of token v are token_chunk[v] .. [v+1] */
    int n_chunks;
} EmbedPlan;
/* Upper bound on chunks for N positions and V tokens. */
size_t embeddingMaxChunks(size_t N, int V);
/* Host: fills plan (arrays sized by the caller: order N, chunk_start and
 * chunk_token embeddingMaxChunks + 1, token_chunk V + 1) using count[V] as
 * scratch. Cannot fail (tokens already range-checked). */
void embeddingPlanBackward(EmbedPlan *plan, int32_t *count, const int32_t *tokens, size_t N,
                           int V);
int embeddingForward(float *out, const float *table, const int32_t *tokens, size_t N, int C,
                     cudaStream_t stream, NsaError *err);
/* plan arrays are device copies of the host plan. partial: [n_chunks][C]. */
int embeddingBackward(float *dtable, float *partial, const float *dout, const EmbedPlan *plan,
                      int V, int C, cudaStream_t stream, NsaError *err);

/* ---- rmsnorm.cu ----
 * y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) per row.
 * Backward adds dx += w*dy*rstd - x * rstd^3 * mean(w*dy*x) and
 * dw += sum_n dy*x*rstd (deterministic: per-chunk column sums in partial,
 * rmsnormPartialFloats(N, C) floats, then a fixed-order sum). */
#define RMS_BWD_WARPS 4      /* warps of a backward CTA, one row each at a time */
#define RMS_MAX_CHUNKS 1024  /* row chunks (CTAs) of a backward: partial sums per column */
/* Floats of the backward's partial buffer for N rows of C: at most
 * RMS_MAX_CHUNKS x C. Cannot fail. */
size_t rmsnormPartialFloats(size_t N, int C);
/* Lets the backward kernel take the shared memory rows of C need (above
 * 48 KB from C > 3072); once per device and C, before any backward (not in
 * a step). -1 with err when this GPU cannot give it. */
int rmsnormPrepare(int C, NsaError *err);
int rmsnormForward(float *y, float *rstd, const float *x, const float *w, size_t N, int C,
                   float eps, cudaStream_t stream, NsaError *err);
/* The same with y stored as yt (the normalised row feeds GEMMs only, so the
 * low-precision modes write it straight in the operand type). */
int rmsnormForwardTo(void *y, DType yt, float *rstd, const float *x, const float *w, size_t N,
                     int C, float eps, cudaStream_t stream, NsaError *err);
int rmsnormBackward(float *dx, float *dw, float *partial, const float *dy, const float *x,
                    const float *w, const float *rstd, size_t N, int C, cudaStream_t stream,
                    NsaError *err);
/* The same, and the updated dx is also stored as dx_ot into dx_op (the
 * residual gradient's GEMM operand copy, made in the same pass). */
int rmsnormBackwardTo(float *dx, void *dx_op, DType dx_ot, float *dw, float *partial,
                      const float *dy, const float *x, const float *w, const float *rstd,
                      size_t N, int C, cudaStream_t stream, NsaError *err);

/* ---- rope.cu ----
 * In place on x[B*S][heads][dim] (dim even), split-halves pairs (i, i+dim/2)
 * rotated by t*theta_i, theta_i = base^(-2i/dim); t = row % S.
 * cos_sin [S_max][dim/2][2], filled on the host in double (ropeTableHost).
 * Backward rotates by the opposite angle. */
void ropeTableHost(float *cos_sin, int S_max, int dim, double base);
int ropeForward(float *x, const float *cos_sin, int B, int S, int heads, int dim,
                cudaStream_t stream, NsaError *err);
int ropeBackward(float *dx, const float *cos_sin, int B, int S, int heads, int dim,
                 cudaStream_t stream, NsaError *err);
/* ---- activation.cu ---- elementwise over n.
 * silu(a) = a sigmoid(a); swiglu: out = silu(a) b; sigmoid in place allowed.
 * Backwards overwrite (da = dout * silu'(a), etc.). */
int siluForward(float *out, const float *a, size_t n, cudaStream_t stream, NsaError *err);
int siluBackward(float *da, const float *dout, const float *a, size_t n, cudaStream_t stream,
                 NsaError *err);
int swigluForward(float *out, const float *a, const float *b, size_t n, cudaStream_t stream,
                  NsaError *err);
int swigluBackward(float *da, float *db, const float *dout, const float *a, const float *b,
                   size_t n, cudaStream_t stream, NsaError *err);
int sigmoidForward(float *out, const float *a, size_t n, cudaStream_t stream, NsaError *err);
/* da = dout * g (1 - g), g the saved sigmoid output; da may alias dout. */
int sigmoidBackward(float *da, const float *dout, const float *g, size_t n, cudaStream_t stream,
                    NsaError *err);
/* Typed variants, the engine's: outputs stored as ot, every input read as
 * it (the MLP's pre-activations and their gradients come out of GEMMs in
 * the operand type). 16-byte accesses where the pointers are aligned. */
int siluForwardTo(void *out, DType ot, const void *a, DType it, size_t n, cudaStream_t stream,
                  NsaError *err);
int swigluForwardTo(void *out, DType ot, const void *a, const void *b, DType it, size_t n,
                    cudaStream_t stream, NsaError *err);
int siluBackwardTo(void *da, DType ot, const void *dout, const void *a, DType it, size_t n,
                   cudaStream_t stream, NsaError *err);
int swigluBackwardTo(void *da, void *db, DType ot, const void *dout, const void *a, const void *b,
                     DType it, size_t n, cudaStream_t stream, NsaError *err);

/* ---- attn_inputs.cu ----
 * The fast attention op's inputs from one fused projection of a layer, and
 * its gradients back into one. A projection row (token n, position t = n %
 * S) is [q (H dk) | k_cmp (G dk) | v_cmp (G dv) | k_sel | v_sel | k_win |
 * v_win | gate logits (3H)] - the layout order of wq .. w_gate, whose
 * weights are one contiguous [width][C] matrix - of type pt (fp32 or the
 * GEMM operand type), rows attnInputsStride apart.
 *   Forward:  q, k_b <- RoPE(q, k_b) (by +angle), v_b <- v_b, g <-
 *             sigmoid(logits), each stored bf16 in its own tensor
 *             (NsaAttnDeviceInputs' layouts); gates (fp32 [N][3H]) keeps g
 *             for the backward.
 *   Backward: the row of d (type dt) from the op's bf16 gradients: RoPE by
 *             -angle of dq and dk_b, dv_b as they are, dg g (1 - g).
 * A block per token; cos_sin is ropeTableHost's table. */
typedef struct AttnInputTensors {
    void *q, *k[3], *v[3], *g;   /* bf16, branch order cmp, sel, win */
} AttnInputTensors;
/* Elements of one projection row, and the row's stride in memory: the
 * width rounded up to 8 elements, so every row starts 16-byte aligned (the
 * GEMMs' fast kernels need it; 3H alone often breaks it). */
static inline int attnInputsWidth(int H, int G, int dk, int dv) {
    return H * dk + 3 * G * (dk + dv) + 3 * H;
}
static inline int attnInputsStride(int H, int G, int dk, int dv) {
    return (attnInputsWidth(H, G, dk, dv) + 7) / 8 * 8;
}
int attnInputsForward(AttnInputTensors out, float *gates, const void *proj, DType pt,
                      const float *cos_sin, int B, int S, int H, int G, int dk, int dv,
                      cudaStream_t stream, NsaError *err);
int attnInputsBackward(void *dproj, DType dt, AttnInputTensors grads, const float *gates,
                       const float *cos_sin, int B, int S, int H, int G, int dk, int dv,
                       cudaStream_t stream, NsaError *err);

/* ---- crossentropy.cu ----
 * One block per row of logits [N][V] (fp32): row_loss[n] = lse - logit[target]
 * (0 where target = -1). With want_grad, the row is overwritten in place by
 * its gradient, grad_factor * *loss_scale (device) * (softmax - onehot) (0 on
 * ignored rows):
 * no probability buffer exists. Then crossEntropyReduce adds
 * factor * sum_n row_loss[n] (fixed-order sum, double) into *loss_acc
 * (device double); poison makes it NaN (fault injection). */
int crossEntropyForward(float *logits, float *row_loss, const int32_t *targets, size_t N, int V,
                        int want_grad, float grad_factor, const float *loss_scale,
                        cudaStream_t stream, NsaError *err);
int crossEntropyReduce(double *loss_acc, const float *row_loss, size_t N, double factor,
                       int poison, cudaStream_t stream, NsaError *err);

/* ---- adamw.cu ---- */
/* Device step state, one struct in device memory. */
typedef struct OptimState {
    double loss;          /* the step's accumulated loss */
    double grad_norm;     /* unscaled global norm of the last step */
    float loss_scale;     /* fp16 dynamic loss scale (1 otherwise) */
    int good_steps;       /* finite steps since the scale last changed */
    int nonfinite_loss, nonfinite_grad, applied;
    int pad;
} OptimState;

/* One range the optimizer updates: numel elements from `offset` of the
 * params/grads arenas, whose Adam moments start at `state_offset` of the
 * moment arenas (== offset for a model alone; a data-parallel rank holds
 * the moments of its shard only, packed). */
typedef struct OptimTensor {
    size_t offset, numel;
    size_t state_offset;
    int decay;
} OptimTensor;

/* Global norm: partial[NORM_BLOCKS] sums of squares (double) over the
 * tensors, then one block adds them in order and writes state->grad_norm
 * (divided by the loss scale) and the non-finite flags. Deterministic. */
#define NORM_BLOCKS 512
int gradNorm(OptimState *state, double *partial, const float *grads, size_t n,
             cudaStream_t stream, NsaError *err);
/* The first pass of gradNorm alone: partial[NORM_BLOCKS] sums of squares
 * of grads[0, n) (data parallelism runs it per range of its shard). */
int gradNormPartial(double *partial, const float *grads, size_t n, cudaStream_t stream,
                    NsaError *err);

/* ---- dp_optim.cu ----
 * The data-parallel step's scalars. dpLocalScalars: one block adds
 * partial[n_partial] in gradNorm's fixed order and writes this rank's
 * {loss, sum of squares} to scalars[2 rank], [2 rank + 1]. After the
 * all-gather of scalars, dpGlobalNorm adds every rank's pair in rank order
 * and finishes as gradNorm does: state->loss, the unscaled global norm and
 * the NaN-guard flags, the same bits on every rank. With one rank and one
 * range it gives gradNorm's result bit for bit. */
int dpLocalScalars(double *scalars, int rank, const OptimState *state, const double *partial,
                   int n_partial, cudaStream_t stream, NsaError *err);
int dpGlobalNorm(OptimState *state, const double *scalars, int world, cudaStream_t stream,
                 NsaError *err);

/* AdamW over every tensor (tensors: device table of n_tensors) with the
 * NaN guard on the device: if state says the loss or norm is non-finite,
 * nothing changes. Clip coef = clip/norm when clip > 0 and norm > clip.
 * Gradients are divided by the loss scale. Then (one thread) the fp16 loss
 * scale is updated when dynamic_scale: halved after a non-finite step,
 * doubled after scale_window finite ones. */
int adamwStep(float *params, const float *grads, float *m, float *v, const OptimTensor *tensors,
              int n_tensors, size_t max_numel, OptimState *state, float lr, float beta1,
              float beta2, float eps, float weight_decay, float grad_clip, double bc1, double bc2,
              int dynamic_scale, int scale_window, cudaStream_t stream, NsaError *err);
/* The same, and each updated weight is also stored as low_type into
 * params_low (same layout, the GEMMs' weight copy) - in the same pass, so
 * the copy never lags the master. params_low NULL behaves as adamwStep. */
int adamwStepWithCopy(float *params, void *params_low, DType low_type, const float *grads,
                      float *m, float *v, const OptimTensor *tensors, int n_tensors,
                      size_t max_numel, OptimState *state, float lr, float beta1, float beta2,
                      float eps, float weight_decay, float grad_clip, double bc1, double bc2,
                      int dynamic_scale, int scale_window, cudaStream_t stream, NsaError *err);

/* Sets one float to NaN on the device (fault injection). */
int poisonFloat(float *at, cudaStream_t stream, NsaError *err);

/* ---- attn_pool_mlp.cu ----
 * Compressed-block pooling with phi = mlp (kernels/cpu/attn_pool_mlp.c is
 * the oracle): for block i of group g, u = vec(X_i + P),
 *   hidden = W1 u,  pooled = mean_j X_ij + W2 silu(hidden).
 * x [B][S][G][dim] (fp32, keys already rotated), pooled and hidden
 * [B][Nc][G][dim] fp32 (hidden is the only thing the backward needs saved).
 * The NB = B*Nc*G blocks are rows of two cuBLASLt GEMMs in the context's
 * operand type; scratch (shared, none allocated here) holds the gathered
 * operand and the backward's intermediates. Nothing uses float atomics:
 * dX is gathered per token over the blocks that cover it, dP is a
 * fixed-order column sum, so results are bit-reproducible. */
typedef struct GemmContext GemmContext;
#define POOL_MLP_CHUNK 256   /* rows per partial sum of the dP reduction */
typedef struct PoolMlpWeights {
    const float *pos;        /* [l][dim] fp32 */
    const void *w1, *w2;     /* GEMM operand type: [dim][l*dim], [dim][dim] */
    const float *w1_master;  /* fp32 W1 (dP = W1^T sum of dhidden) */
} PoolMlpWeights;
/* Sizes for NB = poolMlpBlocks(...) blocks at the largest B, S: */
typedef struct PoolMlpScratch {
    void *u;          /* op [NB][l*dim] gathered X + P */
    void *act;        /* op [NB][dim] silu(hidden) */
    void *dp;         /* op [NB][dim] dpooled as an operand (bf16/fp16 modes only) */
    float *dact;      /* [NB][dim] d silu(hidden), then d hidden */
    void *dh;         /* op [NB][dim] d hidden as an operand */
    float *du;        /* [NB][l*dim] */
    float *partial;   /* [ceil(NB / POOL_MLP_CHUNK)][dim] */
    float *dh_sum;    /* [dim] */
} PoolMlpScratch;
/* B * nsaNumCmpBlocks(S, l, d) * G (0 when S < l). Cannot fail. */
size_t poolMlpBlocks(int B, int S, int G, int cmp_len, int cmp_stride);
/* Writes pooled and hidden (nothing when S < l). Returns -1 with err on a
 * NULL weight/scratch pointer, bad dims, a launch or GEMM failure. */
int poolMlpForward(GemmContext *gemm, cudaStream_t stream, float *pooled, float *hidden,
                   const float *x, const PoolMlpWeights *w, const PoolMlpScratch *s, int B, int S,
                   int G, int dim, int cmp_len, int cmp_stride, NsaError *err);
/* dx (=, or += with accumulate) d loss / d x; ADDS into dpos, dw1, dw2
 * (summed over every block). dx is written for every token, 0 where no
 * block covers it. Same errors as poolMlpForward. */
int poolMlpBackward(GemmContext *gemm, cudaStream_t stream, float *dx, int accumulate,
                    float *dpos, float *dw1, float *dw2, const float *dpooled,
                    const float *hidden, const float *x, const PoolMlpWeights *w,
                    const PoolMlpScratch *s, int B, int S, int G, int dim, int cmp_len,
                    int cmp_stride, NsaError *err);

#endif
