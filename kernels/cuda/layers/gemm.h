/* gemm.h - row-major GEMMs through cuBLASLt with cached plans.
 *
 * D[M][N] = alpha * op(A) op(B) + beta * C, every matrix row-major in
 * memory, op(X) = X or X^T. C and D are fp32 (residual adds and weight
 * gradients accumulate in fp32), or D is in the operand type with beta 0
 * (an activation that only a 16-bit consumer reads); the precision mode picks
 * the storage type of the operands A and B, and the compute type is always
 * CUBLAS_COMPUTE_32F (fp32 accumulate):
 *   F32  -> fp32 operands, exact fp32 (no TF32): the mode for checks;
 *   BF16 -> CUDA_R_16BF operands (bf16 tensor cores);
 *   FP16 -> CUDA_R_16F operands (fp16 tensor cores).
 * The caller stores the operands in that type (gemmOperandType); the engine
 * keeps a bf16/fp16 copy of the weights and converts activations once.
 * Each distinct (shape, transposes, strides, beta != 0) gets its descriptors
 * and heuristic algorithm once, on first use, and keeps them: later calls
 * only look the plan up. Internal to the CUDA engine (C++ linkage). */
#ifndef NSA_CUDA_GEMM_H
#define NSA_CUDA_GEMM_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include "../../nsa.h"
#include "layers_cuda.h"

typedef struct GemmPlan GemmPlan;

typedef struct GemmContext {
    cublasLtHandle_t handle;
    cublasComputeType_t compute;   /* always CUBLAS_COMPUTE_32F */
    cudaDataType_t operand_cuda;   /* A and B storage type */
    DType operand;
    void *workspace;          /* device, workspace_bytes */
    size_t workspace_bytes;
    GemmPlan *plans;          /* host array, n_plans used of cap_plans */
    int n_plans, cap_plans;
} GemmContext;

/* Creates the handle and the workspace (the only allocation). Returns 0 or
 * -1 with err; on error ctx holds nothing to free. */
int gemmContextCreate(GemmContext *ctx, NsaPrecision precision, size_t workspace_bytes,
                      NsaError *err);

/* The storage type gemmRowMajor and the linear* calls expect for A and B
 * (and for x, w, dy) in this context's precision mode. */
static inline DType gemmOperandType(const GemmContext *ctx) { return ctx->operand; }

/* Frees the plans, the workspace and the handle. Safe on a zeroed ctx. */
void gemmContextDestroy(GemmContext *ctx);

/* D = alpha op(A) op(B) + beta C with row-major leading dimensions lda, ldb,
 * ldc, ldd (elements per row as stored). A and B are in the operand type,
 * C and D fp32. C may equal D; C is ignored when beta == 0. Pointers must
 * be 128-byte aligned (the engine's arenas and weight copies are). Enqueues on stream; returns -1 with err when cuBLASLt finds no
 * algorithm or fails. */
int gemmRowMajor(GemmContext *ctx, cudaStream_t stream, int trans_a, int trans_b, int M, int N,
                 int K, float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                 const float *C, int ldc, float *D, int ldd, NsaError *err);
/* The same with D stored as d_type: DTYPE_F32, or the operand type when
 * beta is 0 (anything else is refused with err). */
int gemmRowMajorTo(GemmContext *ctx, cudaStream_t stream, int trans_a, int trans_b, int M, int N,
                   int K, float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                   const float *C, int ldc, void *D, DType d_type, int ldd, NsaError *err);

/* The three products of a linear layer y = x W^T, W [out][in] (nn.Linear):
 *   linearForward:     y[N][out] = x W^T (+ beta * c, into y; c may be y)
 *   linearBackwardX:   dx[N][in] = dy W      (+ beta * dx)
 *   linearBackwardW:   dW[out][in] += dy^T x (always accumulates)
 */
int linearForward(GemmContext *ctx, cudaStream_t stream, float *y, const void *x,
                  const void *w, int N, int in, int out, float beta, const float *c,
                  NsaError *err);
int linearBackwardX(GemmContext *ctx, cudaStream_t stream, float *dx, const void *dy,
                    const void *w, int N, int in, int out, float beta, NsaError *err);
int linearBackwardW(GemmContext *ctx, cudaStream_t stream, float *dw, const void *dy,
                    const void *x, int N, int in, int out, NsaError *err);
/* y = x W^T and dx = dy W (no accumulation) stored as yt / dt: fp32 or the
 * operand type. */
int linearForwardTo(GemmContext *ctx, cudaStream_t stream, void *y, DType yt, const void *x,
                    const void *w, int N, int in, int out, NsaError *err);
int linearBackwardXTo(GemmContext *ctx, cudaStream_t stream, void *dx, DType dt, const void *dy,
                      const void *w, int N, int in, int out, NsaError *err);

#endif
