/* crossentropy.cu - fused softmax cross-entropy over the vocabulary.
 *
 * loss_n = lse_n - logits[n][target_n], lse_n = log sum_v exp(logits[n][v]).
 * The gradient factor * (softmax - onehot) overwrites the logits row in
 * place, so no probability buffer is ever materialised. */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

/* One block per row. row_loss[n] = lse - logits[n][target],
 * lse = mx + log sum_v exp(logit_v - mx), mx = max_v logit_v (the sum in double); with want_grad
 * the row becomes f (softmax_v - [v == target]), f = grad_factor * loss_scale. A target < 0
 * gives loss 0 and a zero row. */
__global__ void crossEntropyForwardKernel(float *logits, float *row_loss, const int32_t *targets,
                                          int V, int want_grad, float grad_factor,
                                          const float *loss_scale) {
    __shared__ float fscratch[32];
    __shared__ double dscratch[32];
    __shared__ float target_logit;
    const size_t n = blockIdx.x;
    float *row = logits + n * V;
    const int target = targets[n];
    if (threadIdx.x == 0) target_logit = target >= 0 ? row[target] : 0.0f;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, row[v]);
    mx = blockMaxF(mx, fscratch);
    double sum = 0.0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += exp((double)row[v] - (double)mx);
    sum = blockSumD(sum, dscratch);
    const double lse = (double)mx + log(sum);
    if (threadIdx.x == 0) row_loss[n] = target >= 0 ? (float)(lse - (double)target_logit) : 0.0f;
    if (!want_grad) return;
    const float f = target >= 0 ? grad_factor * *loss_scale : 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float p = (float)exp((double)row[v] - lse);
        row[v] = f * (p - (v == target ? 1.0f : 0.0f));
    }
}

/* One block: fixed-order sum of the row losses. */
__global__ void crossEntropyReduceKernel(double *loss_acc, const float *row_loss, size_t N,
                                         double factor, int poison) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (size_t n = threadIdx.x; n < N; n += blockDim.x) s += (double)row_loss[n];
    s = blockSumD(s, scratch);
    if (threadIdx.x == 0) *loss_acc += poison ? (double)NAN : factor * s;
}

int crossEntropyForward(float *logits, float *row_loss, const int32_t *targets, size_t N, int V,
                        int want_grad, float grad_factor, const float *loss_scale,
                        cudaStream_t stream, NsaError *err) {
    if (N == 0) return 0;
    crossEntropyForwardKernel<<<(unsigned)N, 256, 0, stream>>>(logits, row_loss, targets, V,
                                                               want_grad, grad_factor, loss_scale);
    LAUNCH_CHECK("crossEntropyForwardKernel", err);
    return 0;
}

int crossEntropyReduce(double *loss_acc, const float *row_loss, size_t N, double factor,
                       int poison, cudaStream_t stream, NsaError *err) {
    crossEntropyReduceKernel<<<1, 1024, 0, stream>>>(loss_acc, row_loss, N, factor, poison);
    LAUNCH_CHECK("crossEntropyReduceKernel", err);
    return 0;
}
