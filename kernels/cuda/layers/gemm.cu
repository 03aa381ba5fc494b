/* gemm.cu - row-major GEMMs through cuBLASLt with cached plans.
 *
 * cuBLASLt is column-major. A row-major X[r][c] with leading dimension ld is
 * the column-major matrix X^T (c x r, ld). So row-major D = op(A) op(B)
 * is computed as column-major D^T = op(B)^T op(A)^T: cuBLASLt's "A" is our
 * B and its "B" is our A, with the transpose flags kept as given. */
#include "gemm.h"

#include <stdlib.h>
#include <string.h>
#include "../cuda_common.cuh"

struct GemmPlan {
    /* key */
    int trans_a, trans_b, M, N, K, lda, ldb, ldc, ldd, has_beta;
    DType d_type;
    /* value */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
};

#define LT_CHECK(call, err)                                                                        \
    do {                                                                                           \
        cublasStatus_t lt_check_status_ = (call);                                                  \
        if (lt_check_status_ != CUBLAS_STATUS_SUCCESS)                                             \
            return nsaErrorf((err), "cublasLt: %s failed at %s:%d: status %d", #call, __FILE__,    \
                             __LINE__, (int)lt_check_status_);                                     \
    } while (0)

int gemmContextCreate(GemmContext *ctx, NsaPrecision precision, size_t workspace_bytes,
                      NsaError *err) {
    memset(ctx, 0, sizeof(*ctx));
    ctx->compute = CUBLAS_COMPUTE_32F;
    switch (precision) {
    case NSA_PREC_F32: ctx->operand_cuda = CUDA_R_32F; ctx->operand = DTYPE_F32; break;
    case NSA_PREC_BF16: ctx->operand_cuda = CUDA_R_16BF; ctx->operand = DTYPE_BF16; break;
    case NSA_PREC_FP16: ctx->operand_cuda = CUDA_R_16F; ctx->operand = DTYPE_F16; break;
    default:
        return nsaErrorf(err, "cuda: precision %d has no GEMM mode; allowed: f32, bf16, fp16",
                         (int)precision);
    }
    cublasStatus_t st = cublasLtCreate(&ctx->handle);
    if (st != CUBLAS_STATUS_SUCCESS)
        return nsaErrorf(err, "cublasLt: cublasLtCreate failed: status %d", (int)st);
    cudaError_t ce = cudaMalloc(&ctx->workspace, workspace_bytes);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* reported here, not by the next launch check */
        cublasLtDestroy(ctx->handle);
        memset(ctx, 0, sizeof(*ctx));
        return nsaErrorf(err, "cuda: cudaMalloc of %zu bytes of GEMM workspace failed: %s",
                         workspace_bytes, cudaGetErrorString(ce));
    }
    ctx->workspace_bytes = workspace_bytes;
    return 0;
}

static void planRelease(GemmPlan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
}

void gemmContextDestroy(GemmContext *ctx) {
    if (!ctx) return;
    for (int i = 0; i < ctx->n_plans; i++) planRelease(&ctx->plans[i]);
    free(ctx->plans);
    if (ctx->workspace) cudaFree(ctx->workspace);
    if (ctx->handle) cublasLtDestroy(ctx->handle);
    memset(ctx, 0, sizeof(*ctx));
}

/* Builds descriptors and picks the heuristic's first algorithm. */
static int planBuild(GemmContext *ctx, GemmPlan *p, NsaError *err) {
    cublasOperation_t op_lt_a = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  /* our B */
    cublasOperation_t op_lt_b = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  /* our A */
    LT_CHECK(cublasLtMatmulDescCreate(&p->desc, ctx->compute, CUDA_R_32F), err);
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a,
                                            sizeof(op_lt_a)), err);
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b,
                                            sizeof(op_lt_b)), err);
    /* Column-major shapes of the stored matrices: our row-major B is
     * (trans_b ? K x N : N x K) stored as rows -> column-major rows/cols swap. */
    uint64_t lt_a_rows = p->trans_b ? (uint64_t)p->K : (uint64_t)p->N;
    uint64_t lt_a_cols = p->trans_b ? (uint64_t)p->N : (uint64_t)p->K;
    uint64_t lt_b_rows = p->trans_a ? (uint64_t)p->M : (uint64_t)p->K;
    uint64_t lt_b_cols = p->trans_a ? (uint64_t)p->K : (uint64_t)p->M;
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, ctx->operand_cuda, lt_a_rows, lt_a_cols, p->ldb),
             err);
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, ctx->operand_cuda, lt_b_rows, lt_b_cols, p->lda),
             err);
    /* C has D's type: fp32, or the operand type when beta is 0 */
    const cudaDataType_t d_cuda = p->d_type == DTYPE_F32 ? CUDA_R_32F : ctx->operand_cuda;
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lc, d_cuda, (uint64_t)p->N, (uint64_t)p->M, p->ldc),
             err);
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->ld, d_cuda, (uint64_t)p->N, (uint64_t)p->M, p->ldd),
             err);
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), err);
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->workspace_bytes,
        sizeof(ctx->workspace_bytes));
    /* The heuristic assumes 256-byte aligned pointers unless told; a bf16
     * weight copy at a 64-element layout offset is only 128-byte aligned. */
    const uint32_t align = 128;
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align, sizeof(align));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(ctx->handle, p->desc, p->la, p->lb, p->lc, p->ld,
                                            pref, 1, &result, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref); /* frees a host struct; fails only on NULL */
    if (st != CUBLAS_STATUS_SUCCESS || found < 1)
        return nsaErrorf(err,
                         "cublasLt: no algorithm for %dx%dx%d GEMM (trans %d/%d, compute %d): "
                         "status %d",
                         p->M, p->N, p->K, p->trans_a, p->trans_b, (int)ctx->compute, (int)st);
    p->algo = result.algo;
    return 0;
}

static GemmPlan *planFind(GemmContext *ctx, const GemmPlan *key, NsaError *err) {
    for (int i = 0; i < ctx->n_plans; i++) {
        GemmPlan *p = &ctx->plans[i];
        if (p->trans_a == key->trans_a && p->trans_b == key->trans_b && p->M == key->M &&
            p->N == key->N && p->K == key->K && p->lda == key->lda && p->ldb == key->ldb &&
            p->ldc == key->ldc && p->ldd == key->ldd && p->has_beta == key->has_beta &&
            p->d_type == key->d_type)
            return p;
    }
    if (ctx->n_plans == ctx->cap_plans) {
        int cap = ctx->cap_plans ? 2 * ctx->cap_plans : 64;
        GemmPlan *grown = (GemmPlan *)realloc(ctx->plans, (size_t)cap * sizeof(GemmPlan));
        if (!grown) {
            nsaErrorf(err, "cuda: out of host memory for GEMM plan %d", ctx->n_plans);
            return NULL;
        }
        ctx->plans = grown;
        ctx->cap_plans = cap;
    }
    GemmPlan *p = &ctx->plans[ctx->n_plans];
    memset(p, 0, sizeof(*p));
    p->trans_a = key->trans_a; p->trans_b = key->trans_b;
    p->M = key->M; p->N = key->N; p->K = key->K;
    p->lda = key->lda; p->ldb = key->ldb; p->ldc = key->ldc; p->ldd = key->ldd;
    p->has_beta = key->has_beta;
    p->d_type = key->d_type;
    if (planBuild(ctx, p, err) != 0) {
        planRelease(p);
        return NULL;
    }
    ctx->n_plans++;
    return p;
}

int gemmRowMajorTo(GemmContext *ctx, cudaStream_t stream, int trans_a, int trans_b, int M, int N,
                   int K, float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                   const float *C, int ldc, void *D, DType d_type, int ldd, NsaError *err) {
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        return nsaErrorf(err, "cuda: GEMM with K = %d (M %d, N %d); allowed: K >= 1", K, M, N);
    }
    if (d_type != DTYPE_F32 && (d_type != ctx->operand || beta != 0.0f))
        return nsaErrorf(err,
                         "cuda: GEMM output type %d with beta %g; allowed: fp32, or the "
                         "operand type (%d) with beta 0",
                         (int)d_type, (double)beta, (int)ctx->operand);
    GemmPlan key;
    memset(&key, 0, sizeof(key));
    key.trans_a = trans_a; key.trans_b = trans_b;
    key.M = M; key.N = N; key.K = K;
    key.lda = lda; key.ldb = ldb;
    key.ldc = beta != 0.0f ? ldc : ldd;
    key.ldd = ldd;
    key.has_beta = beta != 0.0f;
    key.d_type = d_type;
    GemmPlan *p = planFind(ctx, &key, err);
    if (!p) return -1;
    const void *c_ptr = beta != 0.0f ? (const void *)C : (const void *)D;
    LT_CHECK(cublasLtMatmul(ctx->handle, p->desc, &alpha, B, p->la, A, p->lb, &beta, c_ptr, p->lc,
                            D, p->ld, &p->algo, ctx->workspace, ctx->workspace_bytes, stream),
             err);
    return 0;
}

int gemmRowMajor(GemmContext *ctx, cudaStream_t stream, int trans_a, int trans_b, int M, int N,
                 int K, float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                 const float *C, int ldc, float *D, int ldd, NsaError *err) {
    return gemmRowMajorTo(ctx, stream, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                          ldc, D, DTYPE_F32, ldd, err);
}

int linearForward(GemmContext *ctx, cudaStream_t stream, float *y, const void *x,
                  const void *w, int N, int in, int out, float beta, const float *c,
                  NsaError *err) {
    return gemmRowMajor(ctx, stream, 0, 1, N, out, in, 1.0f, x, in, w, in, beta, c ? c : y, out,
                        y, out, err);
}

int linearBackwardX(GemmContext *ctx, cudaStream_t stream, float *dx, const void *dy,
                    const void *w, int N, int in, int out, float beta, NsaError *err) {
    return gemmRowMajor(ctx, stream, 0, 0, N, in, out, 1.0f, dy, out, w, in, beta, dx, in, dx,
                        in, err);
}

int linearBackwardW(GemmContext *ctx, cudaStream_t stream, float *dw, const void *dy,
                    const void *x, int N, int in, int out, NsaError *err) {
    return gemmRowMajor(ctx, stream, 1, 0, out, in, N, 1.0f, dy, out, x, in, 1.0f, dw, in, dw,
                        in, err);
}

int linearForwardTo(GemmContext *ctx, cudaStream_t stream, void *y, DType yt, const void *x,
                    const void *w, int N, int in, int out, NsaError *err) {
    return gemmRowMajorTo(ctx, stream, 0, 1, N, out, in, 1.0f, x, in, w, in, 0.0f, NULL, out, y,
                          yt, out, err);
}

int linearBackwardXTo(GemmContext *ctx, cudaStream_t stream, void *dx, DType dt, const void *dy,
                      const void *w, int N, int in, int out, NsaError *err) {
    return gemmRowMajorTo(ctx, stream, 0, 0, N, in, out, 1.0f, dy, out, w, in, 0.0f, NULL, in, dx,
                          dt, in, err);
}
