/* embedding.cu - token embedding, forward and backward.
 *
 * Forward: out[n] = table[tokens[n]]. Backward: dtable[v] += sum of dout[n]
 * over positions n with tokens[n] = v, summed in position order through a
 * host-built sort (no float atomics: the result is bit-reproducible). */
#include "layers_cuda.h"
#include "../cuda_common.cuh"

#include <string.h>

size_t embeddingMaxChunks(size_t N, int V) { return N / EMBED_CHUNK + (size_t)V + 1; }

void embeddingPlanBackward(EmbedPlan *plan, int32_t *count, const int32_t *tokens, size_t N,
                           int V) {
    memset(count, 0, (size_t)V * sizeof(int32_t));
    for (size_t n = 0; n < N; n++) count[tokens[n]]++;
    /* exclusive prefix sum -> start of each token's run in order[] */
    int32_t run = 0;
    for (int v = 0; v < V; v++) {
        int32_t c = count[v];
        count[v] = run;
        run += c;
    }
    int chunks = 0;
    for (int v = 0; v < V; v++) {
        int32_t start = count[v];
        int32_t end = v + 1 < V ? count[v + 1] : (int32_t)N;
        plan->token_chunk[v] = chunks;
        for (int32_t s = start; s < end; s += EMBED_CHUNK) {
            plan->chunk_start[chunks] = s;
            plan->chunk_token[chunks] = v;
            chunks++;
        }
    }
    plan->token_chunk[V] = chunks;
    plan->chunk_start[chunks] = (int32_t)N;
    for (size_t n = 0; n < N; n++) plan->order[count[tokens[n]]++] = (int32_t)n;  /* stable */
    plan->n_chunks = chunks;
}

/* out[n][c] = table[tokens[n]][c]; a thread per element (grid-stride). */
__global__ void embeddingForwardKernel(float *out, const float *table, const int32_t *tokens,
                                       size_t N, int C) {
    size_t total = N * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t n = e / C;
        int c = (int)(e % C);
        out[e] = table[(size_t)tokens[n] * C + c];
    }
}

/* Pass 1: block (chunk, column tile); each thread sums one column over the
 * chunk's positions in order. */
__global__ void embeddingChunkSumKernel(float *partial, const float *dout, const int32_t *order,
                                        const int32_t *chunk_start, int C) {
    const int chunk = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int32_t s = chunk_start[chunk]; s < chunk_start[chunk + 1]; s++)
        acc += dout[(size_t)order[s] * C + c];
    partial[(size_t)chunk * C + c] = acc;
}

/* Pass 2: block (token, column tile); adds the token's chunk sums in order. */
__global__ void embeddingTokenSumKernel(float *dtable, const float *partial,
                                        const int32_t *token_chunk, int C) {
    const int v = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int32_t first = token_chunk[v], last = token_chunk[v + 1];
    if (first == last) return;
    float acc = 0.0f;
    for (int32_t k = first; k < last; k++) acc += partial[(size_t)k * C + c];
    dtable[(size_t)v * C + c] += acc;
}

int embeddingForward(float *out, const float *table, const int32_t *tokens, size_t N, int C,
                     cudaStream_t stream, NsaError *err) {
    size_t total = N * C;
    if (total == 0) return 0;
    embeddingForwardKernel<<<gridFor(total, 256), 256, 0, stream>>>(out, table, tokens, N, C);
    LAUNCH_CHECK("embeddingForwardKernel", err);
    return 0;
}

int embeddingBackward(float *dtable, float *partial, const float *dout, const EmbedPlan *plan,
                      int V, int C, cudaStream_t stream, NsaError *err) {
    if (plan->n_chunks == 0) return 0;
    dim3 grid1((unsigned)plan->n_chunks, ceilDiv(C, 128));
    embeddingChunkSumKernel<<<grid1, 128, 0, stream>>>(partial, dout, plan->order,
                                                       plan->chunk_start, C);
    LAUNCH_CHECK("embeddingChunkSumKernel", err);
    dim3 grid2((unsigned)V, ceilDiv(C, 128));
    embeddingTokenSumKernel<<<grid2, 128, 0, stream>>>(dtable, partial, plan->token_chunk, C);
    LAUNCH_CHECK("embeddingTokenSumKernel", err);
    return 0;
}
