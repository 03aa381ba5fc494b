/* nsa_cpu_pool.h - a fixed pool of worker threads for the CPU engine.
 *
 * Created once with the model (threads from NsaEngineOptions), it runs one
 * parallel region at a time: nsaCpuPoolRun calls task(ctx, part, parts) for
 * every part in [0, parts), the calling thread doing part 0, and returns when
 * all are done. Tasks split their work by part into disjoint outputs in a
 * fixed way, so results do not depend on timing. Nothing is allocated per
 * region. */
#ifndef NSA_CPU_POOL_H
#define NSA_CPU_POOL_H

#include "nsa.h"

typedef struct NsaCpuPool NsaCpuPool;
typedef void (*NsaCpuTask)(void *ctx, int part, int parts);

/* A pool of `threads` parts (the caller plus threads-1 workers); threads <= 1
 * gives a pool that runs everything on the caller. Returns NULL with err
 * filled when a thread cannot be started (nothing is left running). The
 * caller frees with nsaCpuPoolFree. */
NsaCpuPool *nsaCpuPoolCreate(int threads, NsaError *err);

/* Stops and joins the workers and frees the pool. NULL is a no-op. */
void nsaCpuPoolFree(NsaCpuPool *pool);

/* Runs task over all parts and waits for them. pool NULL runs task(ctx, 0, 1).
 * Cannot fail. Not reentrant: tasks must not call it. */
void nsaCpuPoolRun(NsaCpuPool *pool, NsaCpuTask task, void *ctx);

#endif /* NSA_CPU_POOL_H */
