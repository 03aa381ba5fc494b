/* layers_cuda.h - the transformer layer ops of the CUDA engine, one file
 * each under kernels/cuda/ (forward and backward side by side): embedding,
 * RMSNorm, RoPE, activations, cross-entropy, global norm + AdamW.
 * Device fp32 pointers, row-major, N rows (tokens) as size_t. Every
 * launcher enqueues on stream and returns 0, or -1 with err on a launch
 * failure. None allocates; scratch buffers come from the caller.
 * Unless a launcher says "adds", it overwrites its outputs. */
#ifndef NSA_CUDA_LAYERS_H
#define NSA_CUDA_LAYERS_H

#include <cuda_runtime.h>
#include <stdint.h>
#include "../nsa.h"

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
 * dw += sum_n dy*x*rstd (deterministic: partial[ceil(N/RMS_CHUNK)][C]
 * column sums, then a fixed-order sum). */
#define RMS_CHUNK 256
int rmsnormForward(float *y, float *rstd, const float *x, const float *w, size_t N, int C,
                   float eps, cudaStream_t stream, NsaError *err);
int rmsnormBackward(float *dx, float *dw, float *partial, const float *dy, const float *x,
                    const float *w, const float *rstd, size_t N, int C, cudaStream_t stream,
                    NsaError *err);

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

typedef struct OptimTensor {
    size_t offset, numel;
    int decay;
} OptimTensor;

/* Global norm: partial[NORM_BLOCKS] sums of squares (double) over the
 * tensors, then one block adds them in order and writes state->grad_norm
 * (divided by the loss scale) and the non-finite flags. Deterministic. */
#define NORM_BLOCKS 512
int gradNorm(OptimState *state, double *partial, const float *grads, size_t n,
             cudaStream_t stream, NsaError *err);

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

/* Sets one float to NaN on the device (fault injection). */
int poisonFloat(float *at, cudaStream_t stream, NsaError *err);

#endif
