/* rope.cu - rotary position embedding (split-halves pairs), forward and
 * backward, in place.
 *
 * (x_i, x_{i+dim/2}) <- (x_i cos - x_{i+dim/2} sin, x_i sin + x_{i+dim/2} cos)
 * with angle t * base^(-2i/dim), t = row % S. The backward applies the
 * transpose, i.e. the rotation by -angle. The table is made on the host in
 * double so long sequences keep their phase. */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

void ropeTableHost(float *cos_sin, int S_max, int dim, double base) {
    const int half = dim / 2;
    for (int t = 0; t < S_max; t++)
        for (int i = 0; i < half; i++) {
            double angle = (double)t * pow(base, -2.0 * i / dim);
            cos_sin[((size_t)t * half + i) * 2] = (float)cos(angle);
            cos_sin[((size_t)t * half + i) * 2 + 1] = (float)sin(angle);
        }
}

/* A thread per pair (row, head, i):
 * (a_i, a_{i+dim/2}) <- (a_i c - a_{i+dim/2} s, a_i s + a_{i+dim/2} c), with c, s = cos,
 * sign * sin from table row row % S; sign = -1 (rotation by -angle) is the backward. */
__global__ void ropeKernel(float *x, const float *cos_sin, size_t rows, int S, int heads, int dim,
                           float sign) {
    const int half = dim / 2;
    const size_t total = rows * heads * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t rh = e / half;  /* row*heads + h */
        size_t row = rh / heads;
        const float *cs = cos_sin + ((row % S) * half + i) * 2;
        float c = cs[0], s = sign * cs[1];
        float *a = x + rh * dim;
        float x0 = a[i], x1 = a[i + half];
        a[i] = x0 * c - x1 * s;
        a[i + half] = x0 * s + x1 * c;
    }
}

static int ropeLaunch(float *x, const float *cos_sin, int B, int S, int heads, int dim,
                      float sign, cudaStream_t stream, NsaError *err) {
    size_t total = (size_t)B * S * heads * (dim / 2);
    if (total == 0) return 0;
    ropeKernel<<<gridFor(total, 256), 256, 0, stream>>>(x, cos_sin, (size_t)B * S, S, heads, dim,
                                                        sign);
    LAUNCH_CHECK("ropeKernel", err);
    return 0;
}

int ropeForward(float *x, const float *cos_sin, int B, int S, int heads, int dim,
                cudaStream_t stream, NsaError *err) {
    return ropeLaunch(x, cos_sin, B, S, heads, dim, 1.0f, stream, err);
}

int ropeBackward(float *dx, const float *cos_sin, int B, int S, int heads, int dim,
                 cudaStream_t stream, NsaError *err) {
    return ropeLaunch(dx, cos_sin, B, S, heads, dim, -1.0f, stream, err);
}
