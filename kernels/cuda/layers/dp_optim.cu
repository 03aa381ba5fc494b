/* dp_optim.cu - the scalars of a data-parallel optimizer step: each rank's
 * loss and squared gradient norm over its shard, and - once every rank's
 * pair has been all-gathered - the global loss and norm with the NaN-guard
 * decision, identical on every rank.
 *
 *   local:  s_r = sum of partial[0 .. n_partial) (blockSumD, the order of
 *           gradNorm's second pass);  scalars[r] = {loss_r, s_r}
 *   global: loss = sum_r loss_r;  s = sum_r s_r  (r = 0, 1, ... in order)
 *           norm = sqrt(s) / loss_scale; non-finite flags as gradNorm
 * adamw.cu's gradNorm is the one-rank form of the same computation. */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

/* One block: s_r = sum of partial[0 .. n_partial) (blockSumD, fixed order);
 * scalars[2 rank] = loss_r, scalars[2 rank + 1] = s_r. */
__global__ void dpLocalScalarsKernel(double *scalars, int rank, const OptimState *state,
                                     const double *partial, int n_partial) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) s += partial[i];
    s = blockSumD(s, scratch);
    if (threadIdx.x == 0) {
        scalars[2 * rank] = state->loss;
        scalars[2 * rank + 1] = s;
    }
}

int dpLocalScalars(double *scalars, int rank, const OptimState *state, const double *partial,
                   int n_partial, cudaStream_t stream, NsaError *err) {
    dpLocalScalarsKernel<<<1, 512, 0, stream>>>(scalars, rank, state, partial, n_partial);
    LAUNCH_CHECK("dpLocalScalarsKernel", err);
    return 0;
}

/* One thread: loss = sum_r scalars[2r], s = sum_r scalars[2r+1] (r in order);
 * grad_norm = sqrt(s) / loss_scale; the non-finite flags and applied as in gradNormFinishKernel. */
__global__ void dpGlobalNormKernel(OptimState *state, const double *scalars, int world) {
    double loss = 0.0, s = 0.0;
    for (int r = 0; r < world; r++) {
        loss += scalars[2 * r];
        s += scalars[2 * r + 1];
    }
    const double norm = sqrt(s) / (double)state->loss_scale;
    state->loss = loss;
    state->grad_norm = norm;
    state->nonfinite_loss = !isfinite(loss);
    state->nonfinite_grad = !isfinite(norm);
    state->applied = !(state->nonfinite_loss || state->nonfinite_grad);
}

int dpGlobalNorm(OptimState *state, const double *scalars, int world, cudaStream_t stream,
                 NsaError *err) {
    dpGlobalNormKernel<<<1, 1, 0, stream>>>(state, scalars, world);
    LAUNCH_CHECK("dpGlobalNormKernel", err);
    return 0;
}
