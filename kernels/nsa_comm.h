/* nsa_comm.h - the data-parallel transport behind NsaComm (kernels/nsa.h),
 * internal to libnsa.
 *
 * An NsaComm is one rank's handle on a transport: the generic part below
 * (rank, world, deadline, abort state, the stall fault) and a table of
 * operations each transport fills:
 *   nsa_comm_local.c  ranks that are threads of this process (CPU engine);
 *   nsa_comm_tcp.c    ranks on other nodes over TCP (CPU engine);
 *   nsa_comm_nccl.c   NCCL (CUDA engine), compiled in when nccl.h exists.
 * nsa_comm.c holds the public entry points: argument checks, the abort
 * state and the injected stall, then the transport's operation. */
#ifndef NSA_COMM_INTERNAL_H
#define NSA_COMM_INTERNAL_H

#include <stddef.h>
#include "nsa.h"

/* The longest deadline a transport takes, in seconds (about 31 years):
 * past it the deadline's arithmetic would overflow a time_t; not finite
 * (inf, NaN) is no deadline, which every collective must have. */
#define NSA_COMM_MAX_TIMEOUT 1e9

#ifdef __cplusplus
extern "C" {
#endif

/* NCCL only (nsa_comm_nccl.c): waits for a CUDA event (cudaEvent_t) until
 * it completes, polling the communicator's asynchronous error, the abort
 * state and the deadline (c's timeout from now); past it the communicator
 * is aborted and -1 returned with err naming what and the wait. comm NULL
 * or not NCCL: a plain cudaEventSynchronize. */
int nsaCommNcclWaitEvent(NsaComm *c, void *event, const char *what, NsaError *err);
/* 1 when c is an NCCL handle. */
int nsaCommIsNccl(const NsaComm *c);

#ifdef __cplusplus
}
#else /* the transports' side, C only (C11 atomics) */

#include <pthread.h>
#include <stdatomic.h>

typedef struct NsaCommOps {
    const char *kind;  /* "local", "tcp", "nccl" */
    /* The collectives of nsa.h, arguments already checked; the transport
     * enforces the deadline and fails (after calling nsaCommFail) when a
     * peer does not arrive in time. */
    int (*reduce_scatter)(NsaComm *c, void *buf, size_t shard, int f64, void *stream,
                          const char *what, NsaError *err);
    int (*all_gather)(NsaComm *c, void *buf, size_t shard_bytes, void *stream, const char *what,
                      NsaError *err);
    int (*broadcast)(NsaComm *c, void *buf, size_t bytes, int root, void *stream,
                     const char *what, NsaError *err);
    /* Called once by nsaCommAbort after the state is set: wakes whatever
     * waits (local: the exchange's waiters). May be NULL. */
    void (*wake)(NsaComm *c);
    /* Frees the transport's part and c itself. */
    void (*destroy)(NsaComm *c);
} NsaCommOps;

struct NsaComm {
    const NsaCommOps *ops;
    int rank, world;
    double timeout;              /* seconds any wait for the peers may last */
    _Atomic int aborted;
    pthread_mutex_t lock;        /* guards reason */
    char reason[320];
    _Atomic long long stall_us;  /* nsaCommInjectStall: consumed by the next collective */
};

/* Fills the generic part (rank, world, timeout; not aborted). */
void nsaCommInitBase(NsaComm *c, const NsaCommOps *ops, int rank, int world, double timeout);
/* Releases what nsaCommInitBase set up. */
void nsaCommDestroyBase(NsaComm *c);

/* Marks c aborted with a reason (the first reason wins), wakes its waiters,
 * and formats the same reason into err. Returns -1. */
int nsaCommFail(NsaComm *c, NsaError *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Sets c's abort state with reason unless it is set already, without
 * waking anything (a transport's wake uses it to spread an abort to the
 * other handles it serves). Returns 1 when this call set it. */
int nsaCommMarkAborted(NsaComm *c, const char *reason);

/* The error of an aborted transport: "<what>: transport aborted: <reason>".
 * Returns -1. */
int nsaCommAbortedError(NsaComm *c, const char *what, NsaError *err);

/* CLOCK_MONOTONIC seconds. */
double nsaCommNow(void);

#endif /* __cplusplus */
#endif /* NSA_COMM_INTERNAL_H */
