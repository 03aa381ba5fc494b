/* tap_bail.h - CK(call) for the fast-attention test programs
 * (test_fast_attn.cu, test_sel_index.cu): a CUDA runtime call that must
 * succeed, or a TAP "Bail out!" line naming the call, its error and the
 * place, and exit status 1. */
#ifndef NSA_TAP_BAIL_H
#define NSA_TAP_BAIL_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            printf("Bail out! %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__,   \
                   __LINE__);                                                              \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#endif
