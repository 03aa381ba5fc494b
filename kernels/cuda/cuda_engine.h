/* cuda_engine.h - the CUDA training engine of libnsa, C-callable.
 *
 * kernels/nsa_model.c forwards every nsaModel* call of a model built with
 * device NSA_DEVICE_CUDA to the function of the same role here; tests/gpu
 * also drives it directly. The engine uses the shared parameter layout
 * (kernels/nsa_layout.h): tensor indices, offsets and the arena size are the
 * layout's, so checkpoints and SetTensor/GetTensor mean the same thing on
 * every engine.
 *
 * Device state: fp32 master weights, fp32 gradients, fp32 Adam moments, a
 * 16-bit copy of the weights (bf16/fp16 modes) and the activations, each in
 * one arena allocated at create time for opt->max_batch x opt->max_seq_len;
 * nothing is allocated afterwards. The precision mode picks:
 *   NSA_PREC_F32   exact fp32 GEMMs (no TF32) and the fp32 reference
 *                  attention kernels (attn_*.cu): the mode for checks
 *                  against the CPU;
 *   NSA_PREC_BF16  (default, sm_80+) GEMMs on bf16 operands through
 *                  cuBLASLt (CUDA_R_16BF A/B, CUBLAS_COMPUTE_32F, fp32 out):
 *                  the AdamW kernel writes the bf16 weight copy next to the
 *                  fp32 master, and every activation a GEMM reads is stored
 *                  in bf16 by its producer (RMSNorm, SiLU, RoPE backward...);
 *                  attention on the fast bf16 tensor-core op
 *                  (kernels/cuda/fast_attn/, nsaAttnForwardCuda) with one NsaAttnCudaPlan per layer;
 *   NSA_PREC_FP16  the same with fp16 GEMM operands and a dynamic loss scale
 *                  kept on the device; attention still runs in bf16 (the
 *                  fast op is bf16 only; bf16 has fp32's range, so the
 *                  scaled gradients cannot overflow there).
 * Attention path: when the fast op cannot take the model's dims - (d_k, d_v)
 * outside {(64,64), (128,64), (128,128), (192,128)}, more than 16 heads per
 * group or n_sel above 32 - a bf16/fp16 model runs the fp32 reference
 * attention kernels (GEMMs still 16-bit). So does every phi = mlp model:
 * the fast op takes the raw k_cmp/v_cmp and pools them with avg inside,
 * while phi = mlp pools them first (attn_pool_mlp.cu: a gather of X + P and
 * two GEMMs in the operand type, the pre-activation saved per layer, no
 * float atomics) and hands the pooled keys to the reference kernels, which
 * cap d_k and d_v at 128. That choice is never silent: it is
 * made at create time and reported, with its reason, by
 * nsaCudaModelAttentionPath, NsaMemoryReport.attention_path and
 * NsaCudaMemoryPlan.attention_path. A fast-op plan that fails for any other
 * reason (its workspace allocation, its score-ring limit) fails create.
 * Residual stream, norm statistics, softmax statistics, the loss and the
 * optimizer are fp32 in every mode.
 *
 * Steps: ZeroGrad, Forward, Backward and OptimizerStep only enqueue work on
 * the engine's stream (no allocation, no host synchronisation; the token ids
 * are staged through pinned buffers). The NaN guard lives on the device: the
 * AdamW kernel reads the step's loss and gradient norm from device memory
 * and leaves weights and moments untouched when either is non-finite.
 * StepStats waits on an event recorded after the step and reads them back.
 *
 * Errors: every function that can fail returns 0 (or a non-NULL pointer) on
 * success and -1 (NULL) on error with err (if not NULL) holding one line
 * that names the failing call or argument. Nothing here exits or prints.
 * Only built when nvcc is present (NSA_HAVE_CUDA); without it this header
 * still compiles, but nothing implements it. */
#ifndef NSA_CUDA_ENGINE_H
#define NSA_CUDA_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "../nsa.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct NsaCudaModel NsaCudaModel;

/* Number of CUDA devices visible. Returns 0 and sets *count (0 when the
 * driver has none); -1 with err when the runtime itself fails. */
int nsaCudaDeviceCount(int *count, NsaError *err);

/* Name and memory of CUDA device `ordinal`. Returns 0, or -1 with err. */
int nsaCudaDeviceDescribe(int ordinal, char *name, size_t cap, size_t *total_bytes, NsaError *err);

/* Memory plan for cfg/opt without allocating anything: bytes of each arena
 * and of the activations for opt->max_batch sequences of opt->max_seq_len,
 * the activation bytes of one such sequence, and the largest batch that
 * would fit in the device's free memory now. params includes the 16-bit
 * weight copy; workspace the fast attention op's per-layer plans as
 * nsaAttnCudaPlanMeasure gives them, so total is what nsaCudaModelCreate
 * allocates and nsaCudaModelMemoryReport reports (data parallel: give or
 * take the norm's partial sums, planned at one range per bucket, the most
 * a rank's slices make). The batch that fits is an
 * estimate (the attention plans' chunk buffers are not linear in B).
 * Returns 0, or -1 with err (bad config, no device, a refused plan). */
typedef struct NsaCudaMemoryPlan {
    size_t params, grads, optimizer;      /* bytes: fp32 master, fp32 grads, m + v */
    size_t activations;                   /* bytes for max_batch x max_seq_len */
    size_t activations_per_sequence;      /* bytes for one sequence of max_seq_len */
    size_t workspace;                     /* cuBLASLt workspace, staging, scratch */
    size_t total;                         /* everything above */
    size_t device_free, device_total;
    int max_batch_that_fits;              /* at max_seq_len; 0 if not even one fits */
    char attention_path[256];             /* as nsaCudaModelAttentionPath would say */
} NsaCudaMemoryPlan;
int nsaCudaMemoryPlanFor(const NsaModelConfig *cfg, const NsaEngineOptions *opt,
                         NsaCudaMemoryPlan *plan, NsaError *err);
/* The same plan for a model that would be one of `world` data-parallel
 * ranks (1 or more; opt->comm NULL, or a transport of that world): each
 * rank keeps 1/world of the moments (ZeRO-1) and, past one rank, the
 * data-parallel buffers. nsaCudaMemoryPlanFor is this with opt->comm's
 * world (1 without). Lets nsad plan a job before any transport exists. */
int nsaCudaMemoryPlanRanks(const NsaModelConfig *cfg, const NsaEngineOptions *opt, int world,
                           NsaCudaMemoryPlan *plan, NsaError *err);

/* Builds the engine on device opt->device_ordinal: validates cfg and opt,
 * builds the layout, creates the stream, cuBLASLt handle and events, and
 * allocates every arena once. opt->precision must be F32, BF16 or FP16
 * (F64 is CPU only). Returns NULL with err filled on any failure (nothing
 * leaks). Weights are uninitialised until nsaCudaModelInit or SetTensor.
 * The caller frees with nsaCudaModelFree. */
NsaCudaModel *nsaCudaModelCreate(const NsaModelConfig *cfg, const NsaEngineOptions *opt,
                                 NsaError *err);

/* Frees every device and host resource. NULL is a no-op. Synchronises. */
void nsaCudaModelFree(NsaCudaModel *m);

/* Seeded init, the same weights as the CPU engine: each tensor is drawn on
 * the host with nsa_rng (seed, stream = layout index) as the layout's
 * NsaInitKind says, then uploaded. Zeroes gradients, moments, the step's
 * loss accumulator and resets the fp16 loss scale. Synchronous. */
int nsaCudaModelInit(NsaCudaModel *m, uint64_t seed, NsaError *err);

/* Zeroes gradients, moments and the loss accumulator and resets the loss
 * scale, leaving weights as they are (for callers that upload weights
 * themselves with SetTensor). Synchronous. */
int nsaCudaModelResetState(NsaCudaModel *m, NsaError *err);

/* The layout the engine uses (owned by m, lives as long as m). */
int nsaCudaModelNumTensors(const NsaCudaModel *m);
const NsaTensorInfo *nsaCudaModelTensorInfo(const NsaCudaModel *m, int i);
size_t nsaCudaModelArenaElements(const NsaCudaModel *m);  /* layout total, padding included */

/* Copies tensor i of an arena to/from host fp32. Gradients read back are
 * unscaled (the fp16 loss scale divided out). Synchronous: call between
 * steps. Returns -1 with err for a bad index or arena. */
int nsaCudaModelGetTensor(NsaCudaModel *m, NsaArena arena, int i, float *dst, NsaError *err);
int nsaCudaModelSetTensor(NsaCudaModel *m, NsaArena arena, int i, const float *src,
                          NsaError *err);

/* Whole arena (nsaCudaModelArenaElements floats) at once (Init's weights).
 * Same rules as SetTensor. */
int nsaCudaModelSetArena(NsaCudaModel *m, NsaArena arena, const float *src, NsaError *err);

/* The step, as nsa.h describes nsaModelZeroGrad/Forward/Backward/
 * OptimizerStep/StepStats. Forward checks B, S and every token/target id on
 * the host (clear error naming the position and value) before enqueuing
 * anything. Backward needs the activations of the last Forward. */
int nsaCudaModelZeroGrad(NsaCudaModel *m, NsaError *err);
int nsaCudaModelForward(NsaCudaModel *m, const int32_t *tokens, const int32_t *targets, int B,
                        int S, float grad_scale, NsaError *err);
int nsaCudaModelBackward(NsaCudaModel *m, NsaError *err);
/* Backward of the step's last micro-batch of a data-parallel model: each
 * gradient bucket is reduce-scattered on the communication stream as soon
 * as it is complete (nsa.h, nsaModelBackwardReduce). Alone: Backward. */
int nsaCudaModelBackwardReduce(NsaCudaModel *m, NsaError *err);
int nsaCudaModelOptimizerStep(NsaCudaModel *m, const NsaOptimConfig *oc, int64_t step,
                              NsaError *err);
int nsaCudaModelStepStats(NsaCudaModel *m, NsaStepStats *out, NsaError *err);

/* Data parallelism (opt->comm, an NCCL transport): the pieces of tensor
 * i's Adam moments that the other ranks hold, broadcast by each holder
 * into dst (host, the whole tensor; this rank's own range is already in
 * dst from GetTensor), and a broadcast of root's host buffer (bytes) into
 * every rank's, through device staging. Collectives: every rank calls
 * them alike. Synchronous, with the transport's deadline. */
int nsaCudaModelGatherPieces(NsaCudaModel *m, NsaArena arena, int i, float *dst,
                             const char *what, NsaError *err);
int nsaCudaModelBroadcastHost(NsaCudaModel *m, void *buf, size_t bytes, int root, const char *what,
                              NsaError *err);

/* nsaModelExchange through device staging (every rank calls it alike). */
int nsaCudaModelExchange(NsaCudaModel *m, void *buf, size_t bytes, NsaError *err);

/* The last step's communication figures (nsa.h, nsaModelCommStats);
 * zeros for a model alone. Call after StepStats. */
int nsaCudaModelCommStats(NsaCudaModel *m, NsaCommStats *out, NsaError *err);

/* Forward only; synchronous; leaves gradients and the step's loss
 * accumulator untouched. */
int nsaCudaModelEvalLoss(NsaCudaModel *m, const int32_t *tokens, const int32_t *targets, int B,
                         int S, double *loss, NsaError *err);

/* Poisons the next Forward's loss or one gradient element of the next
 * Backward with NaN (tests of the NaN guard). */
int nsaCudaModelInjectFault(NsaCudaModel *m, NsaFault fault, NsaError *err);

/* Bytes held (as allocated; params includes the 16-bit weight copy,
 * workspace the fast attention plans) plus the device's free/total memory
 * now, and the attention path (as nsaCudaModelAttentionPath).
 * Returns -1 only when m or out is NULL. */
int nsaCudaModelMemoryReport(const NsaCudaModel *m, NsaMemoryReport *out);

/* Which attention kernels the model runs and why (one line, never NULL;
 * "" for NULL m). Lives as long as m. */
const char *nsaCudaModelAttentionPath(const NsaCudaModel *m);

/* Peak device memory in use since create (cudaMemGetInfo based), bytes. */
size_t nsaCudaModelPeakDeviceBytes(const NsaCudaModel *m);

/* The stream every step enqueues on (a cudaStream_t), for benchmarks that
 * record events between the step's calls. NULL for NULL m. */
void *nsaCudaModelStream(const NsaCudaModel *m);

#ifdef __cplusplus
}
#endif
#endif /* NSA_CUDA_ENGINE_H */
