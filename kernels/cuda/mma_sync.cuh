/* mma_sync.cuh - the warp-level tensor-core product (mma.sync m16n8k16,
 * fp32 accumulators) and the bf16 pair packing its operands take, shared by
 * the fast attention op (fast_common.cuh) and the decoder's matrix-vector
 * products (decode_gemv.cu). Device code only; no state. */
#ifndef NSA_CUDA_MMA_SYNC_CUH
#define NSA_CUDA_MMA_SYNC_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* c += A (16x16, row-major, a0..a3) B (16x8, column-major, b0 b1), one
 * warp; T names the operands' type: "bf16" or "f16". */
#define MMA_SYNC_16816(T, c, a0, a1, a2, a3, b0, b1)                                          \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, "     \
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                  \
                 : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                     \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

/* c += A B with bf16 operands. */
__device__ __forceinline__ void mmaBf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
    MMA_SYNC_16816("bf16", c, a0, a1, a2, a3, b0, b1);
}

/* c += A B with fp16 operands. */
__device__ __forceinline__ void mmaF16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
    MMA_SYNC_16816("f16", c, a0, a1, a2, a3, b0, b1);
}

/* (lo, hi) rounded to bf16 and packed into one register, lo in the low half. */
__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

#endif
