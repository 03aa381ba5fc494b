/* decode.h - the CUDA decoder behind nsaDecoder* (kernels/nsa_decode.c
 * forwards every call of a CUDA decoder here; checks of slots, token ids
 * and room are done there first). C-callable; built only with nvcc.
 *
 * Device state, all allocated at create: the weights in bf16 (the seven
 * attention input projections and the gate of a layer concatenated into one
 * matrix; W_fc and W_up into one for SwiGLU), fp32 embedding, norms and phi
 * tensors; per layer and slot the caches of kernels/cpu/decode.h in bf16
 * (the compressed branch's raw ring in fp32, as pooling sums it); the
 * scratch of one pass (max_batch slots, or 256 prefill positions); pinned
 * staging for the token ids and the logits; where the decoder has the
 * prompt pass (max_context above 512, a config the fast NSA op takes),
 * its buffers for max_context positions (the fp32 residual stream, the
 * op's bf16 inputs and output: ~0.55 GB at 64k for the production shape),
 * 4,096-row chunk buffers, the op's plan and a cuBLASLt context. A step is one CUDA graph per batch size, captured on first
 * use: the token ids go in and the logits come out through memcpy nodes,
 * every kernel reads the slots' positions from device memory, and the last
 * one advances them, so a replay needs nothing from the host. The caller
 * synchronises once per step, to read the logits. */
#ifndef NSA_CUDA_DECODE_H
#define NSA_CUDA_DECODE_H

#include <stdint.h>
#include "../../nsa.h"
#include "../../nsa_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct NsaCudaDecoder NsaCudaDecoder;

/* Validates what this decoder supports beyond nsaModelConfigValidate (dim,
 * H*d_v and the MLP width multiples of 8; d_k and d_v multiples of 8 and at
 * most 256; at most 16 heads per group; max_batch at most 64; at most 4096
 * selection blocks in max_context; for phi = mlp, l * max(d_k, d_v) at most
 * 8192), allocates everything on opt->device_ordinal and uploads the RoPE
 * table. layout must outlive the decoder. Returns NULL with err. */
NsaCudaDecoder *nsaCudaDecoderCreate(const NsaModelConfig *cfg, const NsaLayout *layout,
                                     const NsaDecoderOptions *opt, NsaError *err);
/* Frees every device and host resource (synchronises). NULL is a no-op. */
void nsaCudaDecoderFree(NsaCudaDecoder *d);
/* Uploads tensor i (host fp32, numel values) into its place; synchronous. */
int nsaCudaDecoderSetTensor(NsaCudaDecoder *d, int i, const float *src, NsaError *err);
/* Sets slot's position (every slot's for -1) to 0; synchronous. */
int nsaCudaDecoderReset(NsaCudaDecoder *d, int slot, NsaError *err);
int nsaCudaDecoderPosition(const NsaCudaDecoder *d, int slot);
/* Slot dst takes slot src's caches and position (slots checked by the
 * caller, dst != src); synchronous. */
int nsaCudaDecoderCopySlot(NsaCudaDecoder *d, int dst, int src, NsaError *err);
/* How Prefill runs on this decoder, and why (a sentence). */
const char *nsaCudaDecoderPrefillPath(const NsaCudaDecoder *d);
/* n prompt tokens into slot: the prompt pass (more than 512 positions into
 * an empty slot) or passes of up to 256 rows (nsaCudaDecoderPrefillPath
 * says which); logits [V] of the last (NULL: none). */
int nsaCudaDecoderPrefill(NsaCudaDecoder *d, int slot, const int32_t *tokens, int n,
                          float *logits, NsaError *err);
/* One step of slots 0..B-1; logits [B][V] (NULL: none). */
int nsaCudaDecoderStep(NsaCudaDecoder *d, int B, const int32_t *tokens, float *logits,
                       NsaError *err);

#ifdef __cplusplus
}
#endif
#endif /* NSA_CUDA_DECODE_H */
