/* grid_barrier.cu - what one grid-wide barrier costs on this GPU: the
 * number a persistent decoder (one kernel a step, its CTAs passing through
 * the layers' phases behind grid barriers) would pay about nine times a
 * layer. Three barriers, every CTA resident (one or two CTAs of 256
 * threads per SM):
 *   cg          cooperative_groups::this_grid().sync() (cooperative launch)
 *   generation  an arrival counter the last CTA resets, then bumps a
 *               generation word the others spin on (ld.acquire.gpu)
 *   monotonic   one counter that only grows; a CTA arrives with a release
 *               add and spins until it reaches its barrier's multiple of
 *               the grid size
 * Each kernel runs a barrier ITERS times and 10 times; the difference over
 * ITERS - 10 is one barrier's cost, launch and drain cancelled.
 *
 *   build/bench/grid_barrier        prints a markdown table */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

#define THREADS 256
#define ITERS 2000
#define SHORT_ITERS 10

#define CHECK(call)                                                                      \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "grid_barrier: %s failed at line %d: %s\n", #call, __LINE__, \
                    cudaGetErrorString(e_));                                             \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* A little arithmetic per round, so the barrier is not the only thing the
 * loop does; its result is never true, which keeps the compiler from
 * dropping it. */
__device__ __forceinline__ float work(float acc) { return acc * 1.0001f + 1.0f; }

__device__ __forceinline__ unsigned loadAcquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void cgBarrierKernel(int iters, float *sink) {
    cg::grid_group grid = cg::this_grid();
    float acc = (float)threadIdx.x;
    for (int i = 0; i < iters; i++) {
        acc = work(acc);
        grid.sync();
    }
    if (acc == -1.0f) sink[0] = acc;
}

/* bar[0]: arrivals this round, bar[1]: the generation. */
__global__ void generationBarrierKernel(int iters, unsigned *bar, float *sink) {
    unsigned gen = 0;
    float acc = (float)threadIdx.x;
    for (int i = 0; i < iters; i++) {
        acc = work(acc);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(&bar[0], 1u) == gridDim.x - 1) {
                bar[0] = 0;
                __threadfence();
                atomicAdd(&bar[1], 1u);
            } else {
                while (loadAcquire(&bar[1]) == gen) {
                }
            }
        }
        gen++;
        __syncthreads();
    }
    if (acc == -1.0f) sink[0] = acc;
}

__global__ void monotonicBarrierKernel(int iters, unsigned *bar, float *sink) {
    unsigned target = 0;
    float acc = (float)threadIdx.x;
    for (int i = 0; i < iters; i++) {
        acc = work(acc);
        __syncthreads();
        if (threadIdx.x == 0) {
            target += gridDim.x;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
            while (loadAcquire(bar) < target) {
            }
        }
        __syncthreads();
    }
    if (acc == -1.0f) sink[0] = acc;
}

/* Milliseconds of one launch of barrier `kind` over `grid` CTAs, `iters`
 * rounds (the faster of two launches). */
static float timeBarrier(int kind, int grid, int iters, unsigned *bar, float *sink) {
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    float best = 0.0f;
    for (int rep = 0; rep < 2; rep++) {
        CHECK(cudaMemset(bar, 0, 2 * sizeof(unsigned)));
        CHECK(cudaEventRecord(start));
        if (kind == 0) {
            void *args[] = {&iters, &sink};
            CHECK(cudaLaunchCooperativeKernel((void *)cgBarrierKernel, grid, THREADS, args, 0, 0));
        } else if (kind == 1) {
            generationBarrierKernel<<<grid, THREADS>>>(iters, bar, sink);
        } else {
            monotonicBarrierKernel<<<grid, THREADS>>>(iters, bar, sink);
        }
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (rep == 0 || ms < best) best = ms;
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return best;
}

int main(void) {
    int sms = 0, per_sm = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, cgBarrierKernel, THREADS, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    unsigned *bar = NULL;
    float *sink = NULL;
    CHECK(cudaMalloc(&bar, 2 * sizeof(unsigned)));
    CHECK(cudaMalloc(&sink, sizeof(float)));
    const char *names[3] = {"cg grid.sync", "generation word", "monotonic counter"};
    printf("%s, %d SMs, %d threads a CTA\n\n| barrier | CTAs | us per barrier |\n|---|---:|---:|\n",
           prop.name, sms, THREADS);
    /* every CTA must be resident, or the spinning ones starve the rest */
    for (int per = 1; per <= 2 && per <= per_sm; per++)
        for (int kind = 0; kind < 3; kind++) {
            const int grid = sms * per;
            const float shortMs = timeBarrier(kind, grid, SHORT_ITERS, bar, sink);
            const float longMs = timeBarrier(kind, grid, ITERS, bar, sink);
            printf("| %s | %d | %.3f |\n", names[kind], grid,
                   (longMs - shortMs) * 1000.0f / (float)(ITERS - SHORT_ITERS));
        }
    CHECK(cudaFree(bar));
    CHECK(cudaFree(sink));
    return 0;
}
