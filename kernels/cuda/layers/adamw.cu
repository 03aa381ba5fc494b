/* adamw.cu - deterministic global gradient norm and the fused AdamW update
 * with the NaN guard on the device.
 *
 * norm = sqrt(sum g^2) / loss_scale (fixed-order two-pass sum in double).
 * If the step's loss or the norm is non-finite, nothing is updated.
 * Otherwise, with g' = g * coef / loss_scale, coef = clip/norm when
 * 0 < clip < norm (else 1):
 *   m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
 *   p -= lr (m/bc1 / (sqrt(v/bc2) + eps) + wd p)   (decoupled decay, old p)
 * computed in double per element, stored fp32 (master weights, moments;
 * the moments at each range's state_offset, see OptimTensor).
 * In bf16/fp16 mode the same pass stores the new weight rounded to the
 * GEMMs' operand type into the weight copy, so it is always the rounding of
 * the current master (and stays untouched with it when the guard trips). */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

/* partial[block] = sum g_i^2 over the block's grid-stride elements, in double (blockSumD, fixed
 * order); gradNormFinishKernel or dpLocalScalarsKernel adds the NORM_BLOCKS partials. */
__global__ void gradNormPartialKernel(double *partial, const float *grads, size_t n) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double g = grads[i];
        s += g * g;
    }
    s = blockSumD(s, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* One block: s = sum of partial[0 .. n_partial) (fixed order); grad_norm = sqrt(s) / loss_scale;
 * nonfinite_loss = !isfinite(loss), nonfinite_grad = !isfinite(norm), applied = neither. */
__global__ void gradNormFinishKernel(OptimState *state, const double *partial, int n_partial) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) s += partial[i];
    s = blockSumD(s, scratch);
    if (threadIdx.x == 0) {
        double norm = sqrt(s) / (double)state->loss_scale;
        state->grad_norm = norm;
        state->nonfinite_loss = !isfinite(state->loss);
        state->nonfinite_grad = !isfinite(norm);
        state->applied = !(state->nonfinite_loss || state->nonfinite_grad);
    }
}

int gradNormPartial(double *partial, const float *grads, size_t n, cudaStream_t stream,
                    NsaError *err) {
    gradNormPartialKernel<<<NORM_BLOCKS, 256, 0, stream>>>(partial, grads, n);
    LAUNCH_CHECK("gradNormPartialKernel", err);
    return 0;
}

int gradNorm(OptimState *state, double *partial, const float *grads, size_t n,
             cudaStream_t stream, NsaError *err) {
    gradNormPartialKernel<<<NORM_BLOCKS, 256, 0, stream>>>(partial, grads, n);
    LAUNCH_CHECK("gradNormPartialKernel", err);
    gradNormFinishKernel<<<1, 512, 0, stream>>>(state, partial, NORM_BLOCKS);
    LAUNCH_CHECK("gradNormFinishKernel", err);
    return 0;
}

/* grid (x, tensor): each block strides over one tensor's elements. */
__global__ void adamwKernel(float *params, void *params_low, int low_type, const float *grads,
                            float *m, float *v,
                            const OptimTensor *tensors, const OptimState *state, float lr,
                            float beta1, float beta2, float eps, float weight_decay,
                            float grad_clip, double bc1, double bc2) {
    if (!state->applied) return;   /* the NaN guard */
    const OptimTensor ten = tensors[blockIdx.y];
    const double norm = state->grad_norm;
    double coef = grad_clip > 0.0f && norm > (double)grad_clip ? (double)grad_clip / norm : 1.0;
    coef /= (double)state->loss_scale;
    const double wd = ten.decay ? (double)weight_decay : 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < ten.numel;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t at = ten.offset + i, ms = ten.state_offset + i;
        const double g = (double)grads[at] * coef;
        const double mi = (double)beta1 * m[ms] + (1.0 - (double)beta1) * g;
        const double vi = (double)beta2 * v[ms] + (1.0 - (double)beta2) * g * g;
        const double update = (mi / bc1) / (sqrt(vi / bc2) + (double)eps);
        m[ms] = (float)mi;
        v[ms] = (float)vi;
        const float p = (float)((double)params[at] - (double)lr * (update + wd * (double)params[at]));
        params[at] = p;
        if (params_low) storeAs(params_low, at, low_type, p);
    }
}

/* One thread, dynamic loss scaling: on a non-finite gradient with a finite loss,
 * scale = max(scale / 2, 1), good_steps = 0; else on an applied step ++good_steps, and once it
 * reaches scale_window, scale = min(scale * 2, 2^24), good_steps = 0. */
__global__ void lossScaleUpdateKernel(OptimState *state, int scale_window) {
    if (state->nonfinite_grad && !state->nonfinite_loss) {
        state->loss_scale = fmaxf(state->loss_scale * 0.5f, 1.0f);
        state->good_steps = 0;
    } else if (state->applied && ++state->good_steps >= scale_window) {
        state->loss_scale = fminf(state->loss_scale * 2.0f, 16777216.0f);
        state->good_steps = 0;
    }
}

int adamwStep(float *params, const float *grads, float *m, float *v, const OptimTensor *tensors,
              int n_tensors, size_t max_numel, OptimState *state, float lr, float beta1,
              float beta2, float eps, float weight_decay, float grad_clip, double bc1, double bc2,
              int dynamic_scale, int scale_window, cudaStream_t stream, NsaError *err) {
    return adamwStepWithCopy(params, NULL, DTYPE_F32, grads, m, v, tensors, n_tensors, max_numel,
                             state, lr, beta1, beta2, eps, weight_decay, grad_clip, bc1, bc2,
                             dynamic_scale, scale_window, stream, err);
}

int adamwStepWithCopy(float *params, void *params_low, DType low_type, const float *grads,
                      float *m, float *v, const OptimTensor *tensors, int n_tensors,
                      size_t max_numel, OptimState *state, float lr, float beta1, float beta2,
                      float eps, float weight_decay, float grad_clip, double bc1, double bc2,
                      int dynamic_scale, int scale_window, cudaStream_t stream, NsaError *err) {
    unsigned gx = gridFor(max_numel, 256);
    if (gx > 1024) gx = 1024;
    dim3 grid(gx, (unsigned)n_tensors);
    adamwKernel<<<grid, 256, 0, stream>>>(params, params_low, (int)low_type, grads, m, v, tensors,
                                          state, lr, beta1, beta2, eps, weight_decay, grad_clip,
                                          bc1, bc2);
    LAUNCH_CHECK("adamwKernel", err);
    if (dynamic_scale) {
        lossScaleUpdateKernel<<<1, 1, 0, stream>>>(state, scale_window);
        LAUNCH_CHECK("lossScaleUpdateKernel", err);
    }
    return 0;
}

/* *at = NaN (one thread): the NaN-gradient fault injection. */
__global__ void poisonKernel(float *at) { *at = NAN; }

int poisonFloat(float *at, cudaStream_t stream, NsaError *err) {
    poisonKernel<<<1, 1, 0, stream>>>(at);
    LAUNCH_CHECK("poisonKernel", err);
    return 0;
}
