/* nsa_comm.c - the public entry points of the data-parallel transports
 * (kernels/nsa.h): argument checks, the abort state shared by every
 * transport, the injected stall, then the transport's own operation
 * (kernels/nsa_comm.h). */
#include "nsa_comm.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

double nsaCommNow(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void nsaCommInitBase(NsaComm *c, const NsaCommOps *ops, int rank, int world, double timeout) {
    c->ops = ops;
    c->rank = rank;
    c->world = world;
    c->timeout = timeout;
    atomic_init(&c->aborted, 0);
    atomic_init(&c->stall_us, 0);
    pthread_mutex_init(&c->lock, NULL);
    c->reason[0] = '\0';
}

void nsaCommDestroyBase(NsaComm *c) { pthread_mutex_destroy(&c->lock); }

int nsaCommMarkAborted(NsaComm *c, const char *reason) {
    pthread_mutex_lock(&c->lock);
    int first = !atomic_load(&c->aborted);
    if (first) {
        snprintf(c->reason, sizeof c->reason, "%s", reason);
        atomic_store(&c->aborted, 1);
    }
    pthread_mutex_unlock(&c->lock);
    return first;
}

int nsaCommFail(NsaComm *c, NsaError *err, const char *fmt, ...) {
    char reason[sizeof c->reason];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (nsaCommMarkAborted(c, reason) && c->ops->wake) c->ops->wake(c);
    return nsaErrorf(err, "%s", reason);
}

int nsaCommAbortedError(NsaComm *c, const char *what, NsaError *err) {
    char reason[sizeof c->reason];
    nsaCommAborted(c, reason, sizeof reason);
    return nsaErrorf(err, "rank %d: %s: the transport was aborted (%s)", c->rank, what, reason);
}

int nsaCommRank(const NsaComm *comm) { return comm ? comm->rank : 0; }
int nsaCommWorld(const NsaComm *comm) { return comm ? comm->world : 1; }
const char *nsaCommKind(const NsaComm *comm) { return comm ? comm->ops->kind : ""; }

void nsaCommAbort(NsaComm *comm, const char *reason) {
    if (!comm) return;
    if (nsaCommMarkAborted(comm, reason && reason[0] ? reason : "aborted") && comm->ops->wake)
        comm->ops->wake(comm);
}

int nsaCommAborted(NsaComm *comm, char *out, size_t cap) {
    if (!comm) return 0;
    pthread_mutex_lock(&comm->lock);
    int aborted = atomic_load(&comm->aborted);
    if (out && cap) snprintf(out, cap, "%s", aborted ? comm->reason : "");
    pthread_mutex_unlock(&comm->lock);
    return aborted;
}

void nsaCommFree(NsaComm *comm) {
    if (comm) comm->ops->destroy(comm);
}

void nsaCommInjectStall(NsaComm *comm, double seconds) {
    if (comm && seconds > 0) atomic_store(&comm->stall_us, (long long)(seconds * 1e6));
}

/* The injected stall: sleeps in 10 ms slices until it is over or the
 * transport is aborted. */
static void stallIfAsked(NsaComm *c) {
    long long us = atomic_exchange(&c->stall_us, 0);
    if (us <= 0) return;
    double until = nsaCommNow() + (double)us * 1e-6;
    while (nsaCommNow() < until && !atomic_load(&c->aborted)) {
        struct timespec slice = {0, 10 * 1000 * 1000};
        nanosleep(&slice, NULL);
    }
}

/* What every collective checks first. */
static int enter(NsaComm *c, const void *buf, const char *what, NsaError *err) {
    if (!c) return nsaErrorf(err, "nsa: %s: no transport (NULL)", what ? what : "collective");
    if (!buf) return nsaErrorf(err, "nsa: rank %d: %s: NULL buffer", c->rank, what);
    stallIfAsked(c);
    if (atomic_load(&c->aborted)) return nsaCommAbortedError(c, what, err);
    return 0;
}

int nsaCommReduceScatter(NsaComm *comm, void *buf, size_t shard, int f64, void *stream,
                         const char *what, NsaError *err) {
    if (!what) what = "reduce-scatter";
    if (enter(comm, buf, what, err)) return -1;
    return comm->ops->reduce_scatter(comm, buf, shard, f64, stream, what, err);
}

int nsaCommAllGather(NsaComm *comm, void *buf, size_t shard_bytes, void *stream, const char *what,
                     NsaError *err) {
    if (!what) what = "all-gather";
    if (enter(comm, buf, what, err)) return -1;
    return comm->ops->all_gather(comm, buf, shard_bytes, stream, what, err);
}

int nsaCommBroadcast(NsaComm *comm, void *buf, size_t bytes, int root, void *stream,
                     const char *what, NsaError *err) {
    if (!what) what = "broadcast";
    if (enter(comm, buf, what, err)) return -1;
    if (root < 0 || root >= comm->world)
        return nsaErrorf(err, "nsa: rank %d: %s: root = %d; allowed: 0 to %d", comm->rank, what,
                         root, comm->world - 1);
    return comm->ops->broadcast(comm, buf, bytes, root, stream, what, err);
}
