/* cuda_engine_dp.cu - the CUDA engine's data parallelism: the
 * communication stream and its events, gradient buckets reduce-scattered
 * during the backward, the step's global loss and norm, the weights'
 * all-gather after AdamW, and the collectives of cuda_engine.h that the
 * daemon uses (gather a sharded tensor, broadcast or exchange host bytes,
 * the communication's timings). The model's state is in
 * cuda_engine_internal.h.
 *
 * Data parallelism (an NCCL transport in opt->comm; kernels/nsa.h says what
 * it computes): a second, communication stream carries every NCCL call of
 * the model. The backward records an event as each gradient bucket is
 * complete and the communication stream, waiting on it, reduce-scatters the
 * bucket while the compute stream goes on with the layers below
 * (cuda_engine.cu's bucketReady). The optimizer step waits for the
 * reductions, sums the norm over this rank's slices, all-gathers every
 * rank's {loss, norm} (dp_optim.cu), runs AdamW over its pieces and hands
 * the weights to the communication stream, which all-gathers them bucket by
 * bucket (fp32, then rounds the other ranks' slices into the bf16/fp16
 * copy) and records an event per bucket; the next forward waits on a
 * bucket's event only before the layer that reads it. Host waits of a data-
 * parallel model go through nsaCommNcclWaitEvent (the transport's deadline;
 * an overrun aborts the communicator), never a plain synchronise that a
 * dead peer could block forever. */
#include "cuda_engine_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *bucketName(const NsaCudaModel *m, int b, char *buf, size_t cap) {
    if (b == NSA_BUCKET_EMBED) snprintf(buf, cap, "bucket %d (embedding)", b);
    else if (b == NSA_BUCKET_HEAD(m->cfg.n_layers)) snprintf(buf, cap, "bucket %d (head)", b);
    else snprintf(buf, cap, "bucket %d (layer %d)", b, b - NSA_BUCKET_LAYER(0));
    return buf;
}

/* Reduce-scatters bucket b of the gradients on the communication stream
 * (which must already wait for the gradients). */
int dpReduceBucket(NsaCudaModel *m, int b, NsaError *err) {
    const NsaLayoutBucket *bk = &m->lay.buckets[b];
    char name[64], what[96];
    snprintf(what, sizeof what, "reduce-scatter of %s", bucketName(m, b, name, sizeof name));
    CUDA_CHECK(cudaEventRecord(m->dp.t_begin[b], m->dp.stream), err);
    TRY(nsaCommReduceScatter(m->dp.comm, m->arena[NSA_ARENA_GRADS] + bk->offset,
                             bk->count / (size_t)m->dp.world, 0, m->dp.stream, what, err));
    CUDA_CHECK(cudaEventRecord(m->dp.t_end[b], m->dp.stream), err);
    return 0;
}

/* The step's global loss and gradient norm into m->state: this rank's sum
 * of squares over its slices, every rank's pair all-gathered on the
 * communication stream, then added in rank order (the same on all). */
int dpGlobalScalars(NsaCudaModel *m, NsaError *err) {
    DpState *dp = &m->dp;
    for (int k = 0; k < dp->n_ranges; k++)
        TRY(gradNormPartial(dp->partial + (size_t)k * NORM_BLOCKS,
                            m->arena[NSA_ARENA_GRADS] + dp->range_offset[k], dp->range_count[k],
                            m->stream, err));
    TRY(dpLocalScalars(dp->scalars, dp->rank, m->state, dp->partial, dp->n_ranges * NORM_BLOCKS,
                       m->stream, err));
    TRY(engineStreamHop(m->stream, dp->stream, dp->to_comm, err));
    TRY(nsaCommAllGather(dp->comm, dp->scalars, 2 * sizeof(double), dp->stream,
                         "all-gather of the loss and gradient norm", err));
    TRY(engineStreamHop(dp->stream, m->stream, dp->to_compute, err));
    return dpGlobalNorm(m->state, dp->scalars, dp->world, m->stream, err);
}

/* After AdamW (on the compute stream): every rank's slices of the fp32
 * weights to every rank, bucket by bucket in the forward's order, the other
 * ranks' slices rounded into the GEMMs' weight copy, and an event per
 * bucket for the next forward to wait on. */
int dpGatherWeights(NsaCudaModel *m, NsaError *err) {
    DpState *dp = &m->dp;
    const int turn = dp->gather_turn;
    TRY(engineStreamHop(m->stream, dp->stream, dp->to_comm, err));
    CUDA_CHECK(cudaEventRecord(dp->t_gather[turn][0], dp->stream), err);
    for (int b = 0; b < m->lay.n_buckets; b++) {
        const NsaLayoutBucket *bk = &m->lay.buckets[b];
        const NsaShardSlice *own = &dp->shard.slices[b];
        char name[64], what[96];
        snprintf(what, sizeof what, "all-gather of the weights of %s",
                 bucketName(m, b, name, sizeof name));
        TRY(nsaCommAllGather(dp->comm, m->arena[NSA_ARENA_PARAMS] + bk->offset,
                             own->count * sizeof(float), dp->stream, what, err));
        if (m->weights_low) {
            /* [bucket start, own slice) and [own slice end, bucket end) */
            const size_t lo[2] = {bk->offset, own->offset + own->count};
            const size_t hi[2] = {own->offset, bk->offset + bk->count};
            for (int k = 0; k < 2; k++)
                if (hi[k] > lo[k])
                    TRY(convertTensor((char *)m->weights_low + lo[k] * dtypeBytes(m->mode.op),
                                      m->mode.op, m->arena[NSA_ARENA_PARAMS] + lo[k], DTYPE_F32,
                                      hi[k] - lo[k], dp->stream, err));
        }
        CUDA_CHECK(cudaEventRecord(dp->weights_ready[b], dp->stream), err);
    }
    CUDA_CHECK(cudaEventRecord(dp->t_gather[turn][1], dp->stream), err);
    dp->gather_recorded[turn] = 1;
    dp->gather_turn = turn ^ 1;
    return 0;
}

/* Device bytes of the data-parallel buffers (0 alone). */
size_t dpBytes(const NsaCudaModel *m) {
    if (!m->dp.comm) return 0;
    return (size_t)m->dp.n_ranges * NORM_BLOCKS * sizeof(double) +
           (size_t)m->dp.world * 2 * sizeof(double) + m->max_numel * sizeof(float);
}

/* The communication stream, events, slice ranges and buffers. Alone:
 * nothing. */
int dpCreate(NsaCudaModel *m, NsaError *err) {
    DpState *dp = &m->dp;
    if (!dp->comm) return 0;
    const NsaShard *sh = &dp->shard;
    const int nb = m->lay.n_buckets;
    dp->range_offset = (size_t *)calloc((size_t)sh->n_slices, sizeof(size_t));
    dp->range_count = (size_t *)calloc((size_t)sh->n_slices, sizeof(size_t));
    dp->bucket_ready = (cudaEvent_t *)calloc((size_t)nb, sizeof(cudaEvent_t));
    dp->weights_ready = (cudaEvent_t *)calloc((size_t)nb, sizeof(cudaEvent_t));
    dp->t_begin = (cudaEvent_t *)calloc((size_t)nb, sizeof(cudaEvent_t));
    dp->t_end = (cudaEvent_t *)calloc((size_t)nb, sizeof(cudaEvent_t));
    if (!dp->range_offset || !dp->range_count || !dp->bucket_ready || !dp->weights_ready ||
        !dp->t_begin || !dp->t_end)
        return nsaErrorf(err, "cuda: out of host memory for the data-parallel tables");
    /* neighbouring slices merge (alone: one range, the whole arena, so the
     * norm's partial sums are gradNorm's own) */
    for (int b = 0; b < sh->n_slices; b++) {
        const NsaShardSlice *sl = &sh->slices[b];
        if (dp->n_ranges > 0 &&
            dp->range_offset[dp->n_ranges - 1] + dp->range_count[dp->n_ranges - 1] == sl->offset)
            dp->range_count[dp->n_ranges - 1] += sl->count;
        else {
            dp->range_offset[dp->n_ranges] = sl->offset;
            dp->range_count[dp->n_ranges++] = sl->count;
        }
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&dp->stream, cudaStreamNonBlocking), err);
    dp->have_stream = 1;
    for (int b = 0; b < nb; b++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&dp->bucket_ready[b], cudaEventDisableTiming), err);
        CUDA_CHECK(cudaEventCreateWithFlags(&dp->weights_ready[b], cudaEventDisableTiming), err);
        CUDA_CHECK(cudaEventCreate(&dp->t_begin[b]), err);
        CUDA_CHECK(cudaEventCreate(&dp->t_end[b]), err);
    }
    CUDA_CHECK(cudaEventCreate(&dp->t_backward_end), err);
    for (int k = 0; k < 2; k++)
        for (int e = 0; e < 2; e++) CUDA_CHECK(cudaEventCreate(&dp->t_gather[k][e]), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&dp->to_comm, cudaEventDisableTiming), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&dp->to_compute, cudaEventDisableTiming), err);
    CUDA_CHECK(cudaEventCreateWithFlags(&dp->sync, cudaEventDisableTiming), err);
    if (engineAllocDevice((void **)&dp->partial,
                    (size_t)dp->n_ranges * NORM_BLOCKS * sizeof(double), "norm partials", err) ||
        engineAllocDevice((void **)&dp->scalars, (size_t)dp->world * 2 * sizeof(double),
                    "the ranks' loss and norm", err) ||
        engineAllocDevice((void **)&dp->staging, m->max_numel * sizeof(float), "gather staging", err))
        return -1;
    return 0;
}

/* Waits for both streams (deadline-bound: a dead peer aborts the
 * communicator, which releases its kernels), then frees. */
void dpFree(NsaCudaModel *m) {
    DpState *dp = &m->dp;
    if (dp->comm && dp->have_stream && dp->sync) {
        NsaError ignored;
        if (m->have_stream && cudaEventRecord(dp->sync, m->stream) == cudaSuccess)
            engineWaitEvent(m, dp->sync, "free (compute stream)", &ignored);
        if (cudaEventRecord(dp->sync, dp->stream) == cudaSuccess)
            engineWaitEvent(m, dp->sync, "free (communication stream)", &ignored);
    }
    for (int b = 0; b < m->lay.n_buckets; b++) {
        if (dp->bucket_ready && dp->bucket_ready[b]) cudaEventDestroy(dp->bucket_ready[b]);
        if (dp->weights_ready && dp->weights_ready[b]) cudaEventDestroy(dp->weights_ready[b]);
        if (dp->t_begin && dp->t_begin[b]) cudaEventDestroy(dp->t_begin[b]);
        if (dp->t_end && dp->t_end[b]) cudaEventDestroy(dp->t_end[b]);
    }
    if (dp->t_backward_end) cudaEventDestroy(dp->t_backward_end);
    for (int k = 0; k < 2; k++)
        for (int e = 0; e < 2; e++)
            if (dp->t_gather[k][e]) cudaEventDestroy(dp->t_gather[k][e]);
    free(dp->t_begin);
    free(dp->t_end);
    if (dp->to_comm) cudaEventDestroy(dp->to_comm);
    if (dp->to_compute) cudaEventDestroy(dp->to_compute);
    if (dp->sync) cudaEventDestroy(dp->sync);
    if (dp->have_stream) cudaStreamDestroy(dp->stream);
    cudaFree(dp->partial);
    cudaFree(dp->scalars);
    cudaFree(dp->staging);
    free(dp->bucket_ready);
    free(dp->weights_ready);
    free(dp->range_offset);
    free(dp->range_count);
    nsaShardFree(&dp->shard);
    memset(dp, 0, sizeof(*dp));
}

/* ---- collectives for the daemon ------------------------------------------ */

int nsaCudaModelGatherPieces(NsaCudaModel *m, NsaArena arena, int i, float *dst,
                             const char *what, NsaError *err) {
    if (!m || !dst) return nsaErrorf(err, "cuda: GatherPieces needs a model and a destination");
    if (!m->dp.comm) return nsaErrorf(err, "cuda: %s: a model alone has no pieces to gather", what);
    if (arena != NSA_ARENA_ADAM_M && arena != NSA_ARENA_ADAM_V)
        return nsaErrorf(err, "cuda: %s: only the moments are sharded", what);
    const NsaTensorInfo *ti = nsaCudaModelTensorInfo(m, i);
    if (!ti)
        return nsaErrorf(err, "cuda: tensor index %d; allowed: 0 to %d", i,
                         nsaCudaModelNumTensors(m) - 1);
    DpState *dp = &m->dp;
    /* everything on the communication stream, after the compute stream's work */
    TRY(engineStreamHop(m->stream, dp->stream, dp->to_comm, err));
    const int p = dp->shard.tensor_piece[i];
    if (p >= 0) {
        const NsaShardPiece *pc = &dp->shard.pieces[p];
        CUDA_CHECK(cudaMemcpyAsync(dp->staging + pc->begin, m->arena[arena] + pc->local,
                                   pc->numel * sizeof(float), cudaMemcpyDeviceToDevice,
                                   dp->stream), err);
    }
    for (int r = 0; r < dp->world; r++) {
        size_t begin, end;
        nsaShardTensorRange(&m->lay, i, r, &begin, &end);
        if (end > begin)
            TRY(nsaCommBroadcast(dp->comm, dp->staging + begin, (end - begin) * sizeof(float), r,
                                 dp->stream, what, err));
    }
    /* the broadcasts first, by the deadline: the copy to pageable memory
     * would block the host on them */
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    TRY(engineWaitEvent(m, dp->sync, what, err));
    CUDA_CHECK(cudaMemcpyAsync(dst, dp->staging, ti->numel * sizeof(float), cudaMemcpyDeviceToHost,
                               dp->stream), err);
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    return engineWaitEvent(m, dp->sync, what, err);
}

int nsaCudaModelBroadcastHost(NsaCudaModel *m, void *buf, size_t bytes, int root, const char *what,
                              NsaError *err) {
    if (!m || !buf) return nsaErrorf(err, "cuda: BroadcastHost needs a model and a buffer");
    if (!m->dp.comm)
        return nsaErrorf(err, "cuda: %s: a model alone has no one to broadcast to", what);
    DpState *dp = &m->dp;
    if (bytes > m->max_numel * sizeof(float))
        return nsaErrorf(err, "cuda: %s: %zu bytes; allowed: up to the largest tensor (%zu bytes)",
                         what, bytes, m->max_numel * sizeof(float));
    TRY(engineStreamHop(m->stream, dp->stream, dp->to_comm, err));
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    TRY(engineWaitEvent(m, dp->sync, what, err)); /* before copies from/to pageable memory */
    if (dp->rank == root)
        CUDA_CHECK(cudaMemcpyAsync(dp->staging, buf, bytes, cudaMemcpyHostToDevice, dp->stream), err);
    TRY(nsaCommBroadcast(dp->comm, dp->staging, bytes, root, dp->stream, what, err));
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    TRY(engineWaitEvent(m, dp->sync, what, err));
    CUDA_CHECK(cudaMemcpyAsync(buf, dp->staging, bytes, cudaMemcpyDeviceToHost, dp->stream), err);
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    return engineWaitEvent(m, dp->sync, what, err);
}

int nsaCudaModelExchange(NsaCudaModel *m, void *buf, size_t bytes, NsaError *err) {
    if (!m || !buf) return nsaErrorf(err, "cuda: Exchange needs a model and a buffer");
    DpState *dp = &m->dp;
    if (!dp->comm) return 0;
    const size_t total = bytes * (size_t)dp->world;
    if (total > m->max_numel * sizeof(float))
        return nsaErrorf(err,
                         "cuda: exchange of %zu bytes from %d ranks; allowed: up to %zu bytes in "
                         "all",
                         bytes, dp->world, m->max_numel * sizeof(float));
    char *slot = (char *)dp->staging + (size_t)dp->rank * bytes;
    TRY(engineStreamHop(m->stream, dp->stream, dp->to_comm, err));
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    TRY(engineWaitEvent(m, dp->sync, "exchange", err)); /* before copies from/to pageable memory */
    CUDA_CHECK(cudaMemcpyAsync(slot, (char *)buf + (size_t)dp->rank * bytes, bytes,
                               cudaMemcpyHostToDevice, dp->stream), err);
    TRY(nsaCommAllGather(dp->comm, dp->staging, bytes, dp->stream, "exchange", err));
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    TRY(engineWaitEvent(m, dp->sync, "exchange", err));
    CUDA_CHECK(cudaMemcpyAsync(buf, dp->staging, total, cudaMemcpyDeviceToHost, dp->stream), err);
    CUDA_CHECK(cudaEventRecord(dp->sync, dp->stream), err);
    return engineWaitEvent(m, dp->sync, "exchange", err);
}

/* Milliseconds between two completed timing events (0 when either is not). */
static double elapsedSeconds(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    return (double)ms * 1e-3;
}

int nsaCudaModelCommStats(NsaCudaModel *m, NsaCommStats *out, NsaError *err) {
    if (!m || !out) return nsaErrorf(err, "cuda: CommStats needs a model and an output");
    memset(out, 0, sizeof(*out));
    DpState *dp = &m->dp;
    if (!dp->comm || !m->step_recorded) return 0;
    /* after StepStats every reduction is complete: the step waited for them */
    for (int b = 0; b < m->lay.n_buckets; b++)
        out->reduce_seconds += elapsedSeconds(dp->t_begin[b], dp->t_end[b]);
    double exposed = elapsedSeconds(dp->t_backward_end, dp->t_end[NSA_BUCKET_EMBED]);
    out->exposed_seconds = exposed > 0 ? exposed : 0;
    if (out->exposed_seconds > out->reduce_seconds) out->exposed_seconds = out->reduce_seconds;
    out->overlap = out->reduce_seconds > 0 ? 1.0 - out->exposed_seconds / out->reduce_seconds : 0;
    /* the all-gather of the step before: complete, the forward waited for it */
    const int before = dp->gather_turn; /* the turn not written by the last step */
    if (dp->gather_recorded[before] && cudaEventQuery(dp->t_gather[before][1]) == cudaSuccess)
        dp->last_gather_seconds = elapsedSeconds(dp->t_gather[before][0], dp->t_gather[before][1]);
    else
        cudaGetLastError();
    out->gather_seconds = dp->last_gather_seconds;
    out->bytes_sent = 2.0 * (double)m->lay.total * sizeof(float) * (double)(dp->world - 1) /
                      (double)dp->world;
    return 0;
}
