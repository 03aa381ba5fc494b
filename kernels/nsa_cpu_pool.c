/* nsa_cpu_pool.c - worker threads for the CPU engine's parallel regions. */
#include "nsa_cpu_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct NsaCpuPool {
    int parts;          /* workers + the caller */
    pthread_t *workers; /* parts - 1 */
    int started;        /* workers actually running */
    pthread_mutex_t lock;
    pthread_cond_t work_ready, work_done;
    unsigned long generation; /* bumped for every region; workers wait for a new one */
    int pending;              /* workers still running the current region */
    int stopping;
    NsaCpuTask task;
    void *ctx;
};

typedef struct WorkerArg {
    NsaCpuPool *pool;
    int part;
} WorkerArg;

static void *workerMain(void *arg_ptr) {
    WorkerArg arg = *(WorkerArg *)arg_ptr;
    free(arg_ptr);
    NsaCpuPool *pool = arg.pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stopping && pool->generation == seen)
            pthread_cond_wait(&pool->work_ready, &pool->lock);
        if (pool->stopping) break;
        seen = pool->generation;
        NsaCpuTask task = pool->task;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->lock);
        task(ctx, arg.part, pool->parts);
        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0) pthread_cond_signal(&pool->work_done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

NsaCpuPool *nsaCpuPoolCreate(int threads, NsaError *err) {
    NsaCpuPool *pool = calloc(1, sizeof(*pool));
    if (!pool) {
        nsaErrorf(err, "nsa: out of memory for the thread pool");
        return NULL;
    }
    pool->parts = threads > 1 ? threads : 1;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work_ready, NULL);
    pthread_cond_init(&pool->work_done, NULL);
    if (pool->parts == 1) return pool;
    pool->workers = calloc((size_t)pool->parts - 1, sizeof(pthread_t));
    if (!pool->workers) goto fail;
    for (int i = 1; i < pool->parts; i++) {
        WorkerArg *arg = malloc(sizeof(*arg));
        if (!arg) goto fail;
        arg->pool = pool;
        arg->part = i;
        int rc = pthread_create(&pool->workers[i - 1], NULL, workerMain, arg);
        if (rc) {
            free(arg);
            nsaErrorf(err, "nsa: cannot start CPU worker thread %d of %d: %s", i, pool->parts - 1,
                      strerror(rc));
            nsaCpuPoolFree(pool);
            return NULL;
        }
        pool->started++;
    }
    return pool;
fail:
    nsaErrorf(err, "nsa: out of memory for the thread pool");
    nsaCpuPoolFree(pool);
    return NULL;
}

void nsaCpuPoolFree(NsaCpuPool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->started; i++)
        pthread_join(pool->workers[i], NULL);
    free(pool->workers);
    pthread_cond_destroy(&pool->work_done);
    pthread_cond_destroy(&pool->work_ready);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

void nsaCpuPoolRun(NsaCpuPool *pool, NsaCpuTask task, void *ctx) {
    if (!pool || pool->parts == 1) {
        task(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->task = task;
    pool->ctx = ctx;
    pool->pending = pool->parts - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->lock);
    task(ctx, 0, pool->parts);
    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->work_done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
