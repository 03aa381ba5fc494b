/* gemm.h - row-major GEMMs through cuBLASLt with cached plans.
 *
 * D[M][N] = alpha * op(A) op(B) + beta * C, every matrix row-major fp32 in
 * memory, op(X) = X or X^T. The precision mode picks the compute type:
 * F32 -> CUBLAS_COMPUTE_32F (exact, no TF32), BF16 -> 32F_FAST_16BF (bf16
 * tensor-core operands, fp32 accumulate), FP16 -> 32F_FAST_16F.
 * Each distinct (shape, transposes, strides, beta != 0) gets its descriptors
 * and heuristic algorithm once, on first use, and keeps them: later calls
 * only look the plan up. Internal to the CUDA engine (C++ linkage). */
#ifndef NSA_CUDA_GEMM_H
#define NSA_CUDA_GEMM_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include "../nsa.h"

typedef struct GemmPlan GemmPlan;

typedef struct GemmContext {
    cublasLtHandle_t handle;
    cublasComputeType_t compute;
    void *workspace;          /* device, workspace_bytes */
    size_t workspace_bytes;
    GemmPlan *plans;          /* host array, n_plans used of cap_plans */
    int n_plans, cap_plans;
} GemmContext;

/* Creates the handle and the workspace (the only allocation). Returns 0 or
 * -1 with err; on error ctx holds nothing to free. */
int gemmContextCreate(GemmContext *ctx, NsaPrecision precision, size_t workspace_bytes,
                      NsaError *err);

/* Frees the plans, the workspace and the handle. Safe on a zeroed ctx. */
void gemmContextDestroy(GemmContext *ctx);

/* D = alpha op(A) op(B) + beta C with row-major leading dimensions lda, ldb,
 * ldc, ldd (elements per row as stored). C may equal D; C is ignored when
 * beta == 0. Enqueues on stream; returns -1 with err when cuBLASLt finds no
 * algorithm or fails. */
int gemmRowMajor(GemmContext *ctx, cudaStream_t stream, int trans_a, int trans_b, int M, int N,
                 int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                 const float *C, int ldc, float *D, int ldd, NsaError *err);

/* The three products of a linear layer y = x W^T, W [out][in] (nn.Linear):
 *   linearForward:     y[N][out] = x W^T (+ beta * c, into y; c may be y)
 *   linearBackwardX:   dx[N][in] = dy W      (+ beta * dx)
 *   linearBackwardW:   dW[out][in] += dy^T x (always accumulates)
 */
int linearForward(GemmContext *ctx, cudaStream_t stream, float *y, const float *x,
                  const float *w, int N, int in, int out, float beta, const float *c,
                  NsaError *err);
int linearBackwardX(GemmContext *ctx, cudaStream_t stream, float *dx, const float *dy,
                    const float *w, int N, int in, int out, float beta, NsaError *err);
int linearBackwardW(GemmContext *ctx, cudaStream_t stream, float *dw, const float *dy,
                    const float *x, int N, int in, int out, NsaError *err);

#endif
