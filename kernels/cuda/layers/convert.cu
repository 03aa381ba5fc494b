/* convert.cu - storage-type conversion between fp32, bf16 and fp16.
 *
 * dst[i] = round(src[i]) into the destination type (round-to-nearest-even;
 * fp32 -> fp16 overflows to +-inf, which the fp16 mode's loss-scale logic
 * is built to catch as a non-finite gradient). */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

/* dst[i] = round_dt(float(src[i])) for i < n: read as fp32 (loadAs), rounded once into the
 * destination type (storeAs); grid-stride loop. */
__global__ void convertKernel(void *dst, int dt, const void *src, int st, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        storeAs(dst, i, dt, loadAs(src, i, st));
}

int convertTensor(void *dst, DType dt, const void *src, DType st, size_t n, cudaStream_t stream,
                  NsaError *err) {
    if (n == 0) return 0;
    if (dt == st) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtypeBytes(dt), cudaMemcpyDeviceToDevice, stream),
                   err);
        return 0;
    }
    convertKernel<<<gridFor(n, 256), 256, 0, stream>>>(dst, (int)dt, src, (int)st, n);
    LAUNCH_CHECK("convertKernel", err);
    return 0;
}
