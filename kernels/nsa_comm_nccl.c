/* nsa_comm_nccl.c - the NCCL transport of the CUDA engine's data
 * parallelism (kernels/nsa.h, kernels/nsa_comm.h).
 *
 * Compiled in when this build found nccl.h (the Makefile then defines
 * NSA_HAVE_NCCL). The library itself, libnccl.so.2, is loaded at the first
 * use (dlopen), not linked: a build machine with NCCL's headers but not
 * its library (CI) still builds and links every program, and nsad on a
 * machine without NCCL trains on one GPU or over TCP; a job that asks for
 * NCCL there fails with an error naming the library and why it did not
 * load, so a multi-GPU job never falls back to one GPU silently.
 *
 * Never hang: the communicator is created non-blocking, so NCCL calls
 * return at once (ncclInProgress while NCCL still works on them) and every
 * wait - init, a collective not yet enqueued, a CUDA event behind the
 * collectives (nsaCommNcclWaitEvent) - polls ncclCommGetAsyncError, the
 * abort state and the deadline. Past the deadline, or on an asynchronous
 * error, the communicator is aborted (ncclCommAbort, which also stops the
 * NCCL kernels that wait for a peer on the device) and the call fails
 * naming the rank and what it waited for. ncclCommAbort runs on the thread
 * that uses the communicator (NCCL calls on one communicator must not run
 * concurrently): an abort asked for from another thread (nsaCommAbort)
 * takes effect at that thread's next wait, or at nsaCommFree. */
#include "nsa_comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nsaCommIsNccl(const NsaComm *c) { return c && !strcmp(c->ops->kind, "nccl"); }

#if defined(NSA_HAVE_NCCL) && defined(NSA_HAVE_CUDA)

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <time.h>

_Static_assert(sizeof(ncclUniqueId) == NSA_COMM_ID_BYTES, "NsaCommId holds an ncclUniqueId");

/* The non-blocking communicator, ncclCommFinalize and ncclGetLastError
 * came with NCCL 2.14. */
#define NCCL_OLDEST_USABLE NCCL_VERSION(2, 14, 0)

/* The NCCL entry points this transport calls, typed from nccl.h and
 * resolved from libnccl.so.2 once per process (the library is process-wide
 * state in any case: one dlopen handle, never closed). */
typedef struct NcclApi {
    __typeof__(&ncclGetVersion) getVersion;
    __typeof__(&ncclGetUniqueId) getUniqueId;
    __typeof__(&ncclCommInitRankConfig) commInitRankConfig;
    __typeof__(&ncclCommFinalize) commFinalize;
    __typeof__(&ncclCommDestroy) commDestroy;
    __typeof__(&ncclCommAbort) commAbort;
    __typeof__(&ncclCommGetAsyncError) commGetAsyncError;
    __typeof__(&ncclGetErrorString) getErrorString;
    __typeof__(&ncclGetLastError) getLastError;
    __typeof__(&ncclReduceScatter) reduceScatter;
    __typeof__(&ncclAllGather) allGather;
    __typeof__(&ncclBroadcast) broadcast;
} NcclApi;

static NcclApi ncclFn;
static char ncclLoadError[320]; /* empty once nccl is usable */
static pthread_once_t ncclLoadOnce = PTHREAD_ONCE_INIT;

/* dlsym into *slot; 0, or -1 with ncclLoadError naming the symbol. */
static int ncclResolve(void *lib, const char *name, void **slot) {
    *slot = dlsym(lib, name);
    if (*slot) return 0;
    snprintf(ncclLoadError, sizeof ncclLoadError,
             "the NCCL library has no %s (NCCL >= 2.14 is needed)", name);
    return -1;
}

static void ncclLoad(void) {
    /* NVLink multicast (NVLS) stays off unless the user set it. Here, once
     * and before any NCCL call, because NCCL reads its environment from
     * the ranks' threads: a setenv beside them could move environ under a
     * getenv. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(ncclLoadError, sizeof ncclLoadError,
                 "libnccl.so.2 could not be loaded (%s): install NCCL (e.g. the libnccl2 "
                 "package) or add its directory to LD_LIBRARY_PATH",
                 why ? why : "not found");
        return;
    }
    NcclApi api;
    struct {
        const char *name;
        void **slot;
    } const entries[] = {
        {"ncclGetVersion", (void **)&api.getVersion},
        {"ncclGetUniqueId", (void **)&api.getUniqueId},
        {"ncclCommInitRankConfig", (void **)&api.commInitRankConfig},
        {"ncclCommFinalize", (void **)&api.commFinalize},
        {"ncclCommDestroy", (void **)&api.commDestroy},
        {"ncclCommAbort", (void **)&api.commAbort},
        {"ncclCommGetAsyncError", (void **)&api.commGetAsyncError},
        {"ncclGetErrorString", (void **)&api.getErrorString},
        {"ncclGetLastError", (void **)&api.getLastError},
        {"ncclReduceScatter", (void **)&api.reduceScatter},
        {"ncclAllGather", (void **)&api.allGather},
        {"ncclBroadcast", (void **)&api.broadcast},
    };
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (ncclResolve(lib, entries[i].name, entries[i].slot)) return;
    int version = 0;
    if (api.getVersion(&version) != ncclSuccess || version < NCCL_OLDEST_USABLE) {
        snprintf(ncclLoadError, sizeof ncclLoadError,
                 "the NCCL library is version %d; nsad needs NCCL >= 2.14 (%d)", version,
                 NCCL_OLDEST_USABLE);
        return;
    }
    ncclFn = api;
    ncclLoadError[0] = '\0';
}

/* The loaded API, or NULL with err saying why NCCL is not usable. */
static const NcclApi *ncclApi(NsaError *err) {
    pthread_once(&ncclLoadOnce, ncclLoad);
    if (!ncclLoadError[0]) return &ncclFn;
    nsaErrorf(err, "nsa: the NCCL transport is not available: %s", ncclLoadError);
    return NULL;
}

typedef struct NcclComm {
    NsaComm base;          /* first: an NsaComm * is an NcclComm * */
    ncclComm_t nccl;
    int device;
    int nccl_aborted;      /* ncclCommAbort ran */
} NcclComm;

static NcclComm *ncclOf(NsaComm *c) { return (NcclComm *)c; }

int nsaCommHaveNccl(void) {
    pthread_once(&ncclLoadOnce, ncclLoad);
    return !ncclLoadError[0];
}

/* Aborts the NCCL communicator once (on the calling thread). ncclCommAbort
 * frees it: nc->nccl is NULL from then on, and nothing may ask it again. */
static void abortNccl(NcclComm *nc) {
    if (nc->nccl && !nc->nccl_aborted) {
        ncclFn.commAbort(nc->nccl);
        nc->nccl = NULL;
        nc->nccl_aborted = 1;
    }
}

/* Short waits first (a collective usually completes within microseconds
 * of the host asking), then 200 us naps: a poll costs little and a stuck
 * wait still notices the deadline within a millisecond. */
static void pollPause(int round) {
    if (round < 64) return;
    struct timespec nap = {0, 200 * 1000};
    nanosleep(&nap, NULL);
}

/* Fails c with reason (marking it aborted) and aborts NCCL. */
static int ncclFail(NcclComm *nc, NsaError *err, const char *fmt, const char *what,
                    const char *detail) {
    abortNccl(nc);
    return nsaCommFail(&nc->base, err, fmt, nc->base.rank, what, detail);
}

/* Waits until the communicator has no call in progress: ncclSuccess, an
 * error, an abort or the deadline. */
static int waitIdle(NcclComm *nc, const char *what, NsaError *err) {
    NsaComm *c = &nc->base;
    const double deadline = nsaCommNow() + c->timeout;
    for (int round = 0;; round++) {
        if (!nc->nccl) return nsaCommAbortedError(c, what, err); /* aborted: freed */
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclFn.commGetAsyncError(nc->nccl, &state);
        if (r != ncclSuccess) state = r;
        if (state == ncclSuccess) return 0;
        if (state != ncclInProgress)
            return ncclFail(nc, err, "rank %d: %s: NCCL failed (%s); the communicator is aborted",
                            what, ncclFn.getLastError(nc->nccl));
        if (atomic_load(&c->aborted)) {
            abortNccl(nc);
            return nsaCommAbortedError(c, what, err);
        }
        if (nsaCommNow() > deadline) {
            char detail[96];
            snprintf(detail, sizeof detail, "%g s", c->timeout);
            return ncclFail(nc, err, "rank %d: %s: NCCL did not finish within %s (a peer stalled "
                                     "or died); the communicator is aborted",
                            what, detail);
        }
        pollPause(round);
    }
}

/* The end of every NCCL call: success, in progress (wait), or an error. */
static int afterCall(NcclComm *nc, ncclResult_t r, const char *what, NsaError *err) {
    if (r == ncclSuccess) return 0;
    if (r == ncclInProgress) return waitIdle(nc, what, err);
    return ncclFail(nc, err, "rank %d: %s: NCCL failed (%s); the communicator is aborted", what,
                    ncclFn.getErrorString(r));
}

static int ncclReduceScatterOp(NsaComm *c, void *buf, size_t shard, int f64, void *stream,
                               const char *what, NsaError *err) {
    NcclComm *nc = ncclOf(c);
    const size_t esz = f64 ? sizeof(double) : sizeof(float);
    char *base = buf;
    /* in place: rank r's slice of the send buffer is its receive buffer */
    ncclResult_t r = ncclFn.reduceScatter(base, base + (size_t)c->rank * shard * esz, shard,
                                       f64 ? ncclFloat64 : ncclFloat32, ncclSum, nc->nccl,
                                       (cudaStream_t)stream);
    return afterCall(nc, r, what, err);
}

static int ncclAllGatherOp(NsaComm *c, void *buf, size_t shard_bytes, void *stream,
                           const char *what, NsaError *err) {
    NcclComm *nc = ncclOf(c);
    char *base = buf;
    ncclResult_t r = ncclFn.allGather(base + (size_t)c->rank * shard_bytes, base, shard_bytes,
                                   ncclUint8, nc->nccl, (cudaStream_t)stream);
    return afterCall(nc, r, what, err);
}

static int ncclBroadcastOp(NsaComm *c, void *buf, size_t bytes, int root, void *stream,
                           const char *what, NsaError *err) {
    NcclComm *nc = ncclOf(c);
    ncclResult_t r = ncclFn.broadcast(buf, buf, bytes, ncclUint8, root, nc->nccl, (cudaStream_t)stream);
    return afterCall(nc, r, what, err);
}

static void ncclDestroy(NsaComm *c) {
    NcclComm *nc = ncclOf(c);
    if (nc->nccl) {
        (void)cudaSetDevice(nc->device); /* teardown cannot report; abort still runs */
        NsaError ignored;
        /* a clean finish flushes what was issued; anything that cannot
         * finish in time (a dead peer) is aborted instead */
        if (!nc->nccl_aborted && !atomic_load(&c->aborted) &&
            afterCall(nc, ncclFn.commFinalize(nc->nccl), "finalize", &ignored) == 0)
            (void)ncclFn.commDestroy(nc->nccl); /* finalized: frees host and device state */
        else
            abortNccl(nc);
    }
    nsaCommDestroyBase(c);
    free(nc);
}

static const NsaCommOps ncclOps = {
    .kind = "nccl",
    .reduce_scatter = ncclReduceScatterOp,
    .all_gather = ncclAllGatherOp,
    .broadcast = ncclBroadcastOp,
    .wake = NULL, /* the owning thread aborts NCCL at its next wait */
    .destroy = ncclDestroy,
};

int nsaCommNcclUniqueId(NsaCommId *id, NsaError *err) {
    if (!id) return nsaErrorf(err, "nsa: nsaCommNcclUniqueId needs an id to fill");
    if (!ncclApi(err)) return -1;
    ncclUniqueId uid;
    ncclResult_t r = ncclFn.getUniqueId(&uid);
    if (r != ncclSuccess)
        return nsaErrorf(err, "nsa: ncclGetUniqueId failed: %s (%s)", ncclFn.getErrorString(r),
                         ncclFn.getLastError(NULL));
    memcpy(id->bytes, &uid, sizeof uid);
    return 0;
}

NsaComm *nsaCommNcclCreate(const NsaCommId *id, int rank, int world, int device_ordinal,
                           double timeout_seconds, NsaError *err) {
    if (!id) {
        nsaErrorf(err, "nsa: nsaCommNcclCreate needs the job's unique id (NULL given)");
        return NULL;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        nsaErrorf(err, "nsa: NCCL rank %d of world %d; allowed: world >= 1, 0 <= rank < world", rank,
                  world);
        return NULL;
    }
    if (!(timeout_seconds > 0) || !(timeout_seconds <= NSA_COMM_MAX_TIMEOUT)) {
        nsaErrorf(err, "nsa: NCCL timeout = %g s; allowed: more than 0, up to %g", timeout_seconds,
                  NSA_COMM_MAX_TIMEOUT);
        return NULL;
    }
    if (!ncclApi(err)) return NULL;
    cudaError_t ce = cudaSetDevice(device_ordinal);
    if (ce != cudaSuccess) {
        nsaErrorf(err, "nsa: rank %d: cudaSetDevice(%d) failed: %s", rank, device_ordinal,
                  cudaGetErrorString(ce));
        return NULL;
    }
    NcclComm *nc = calloc(1, sizeof *nc);
    if (!nc) {
        nsaErrorf(err, "nsa: out of memory for rank %d's NCCL handle", rank);
        return NULL;
    }
    nsaCommInitBase(&nc->base, &ncclOps, rank, world, timeout_seconds);
    nc->device = device_ordinal;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "nsad";
    ncclUniqueId uid;
    memcpy(&uid, id->bytes, sizeof uid);
    ncclResult_t r = ncclFn.commInitRankConfig(&nc->nccl, world, uid, rank, &config);
    char what[64];
    snprintf(what, sizeof what, "NCCL init (%d ranks, device %d)", world, device_ordinal);
    if (r != ncclSuccess && r != ncclInProgress) {
        nsaErrorf(err, "nsa: rank %d: %s: ncclCommInitRankConfig failed: %s (%s)", rank, what,
                  ncclFn.getErrorString(r), ncclFn.getLastError(NULL));
        if (nc->nccl) ncclFn.commAbort(nc->nccl);
        nsaCommDestroyBase(&nc->base);
        free(nc);
        return NULL;
    }
    if (afterCall(nc, r, what, err)) {
        ncclDestroy(&nc->base);
        return NULL;
    }
    return &nc->base;
}

int nsaCommNcclWaitEvent(NsaComm *c, void *event, const char *what, NsaError *err) {
    cudaEvent_t ev = (cudaEvent_t)event;
    if (!nsaCommIsNccl(c)) {
        cudaError_t e = cudaEventSynchronize(ev);
        if (e != cudaSuccess)
            return nsaErrorf(err, "cuda: %s: cudaEventSynchronize failed: %s", what,
                             cudaGetErrorString(e));
        return 0;
    }
    NcclComm *nc = ncclOf(c);
    const double deadline = nsaCommNow() + c->timeout;
    for (int round = 0;; round++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) {
            char detail[160];
            snprintf(detail, sizeof detail, "%s", cudaGetErrorString(e));
            return ncclFail(nc, err, "rank %d: %s: the device failed (%s); the communicator is "
                                     "aborted",
                            what, detail);
        }
        ncclResult_t state = ncclSuccess;
        if (nc->nccl) { /* else aborted (freed): only the event and the deadline are left */
            ncclResult_t r = ncclFn.commGetAsyncError(nc->nccl, &state);
            if (r != ncclSuccess) state = r;
        }
        if (state != ncclSuccess && state != ncclInProgress)
            return ncclFail(nc, err, "rank %d: %s: NCCL failed (%s); the communicator is aborted",
                            what, ncclFn.getLastError(nc->nccl));
        if (atomic_load(&c->aborted)) {
            abortNccl(nc);
            return nsaCommAbortedError(c, what, err);
        }
        if (nsaCommNow() > deadline) {
            char detail[96];
            snprintf(detail, sizeof detail, "%g s", c->timeout);
            return ncclFail(nc, err, "rank %d: %s: the device's work did not finish within %s (a "
                                     "collective waits for a peer that stalled or died); the "
                                     "communicator is aborted",
                            what, detail);
        }
        pollPause(round);
    }
}

#else /* no NCCL in this build */

static int noNccl(NsaError *err) {
#if defined(NSA_HAVE_CUDA)
    return nsaErrorf(err, "nsa: this libnsa was built without NCCL (nccl.h was not found when it "
                          "was built: install NCCL's headers and rebuild); multi-GPU training "
                          "needs it");
#else
    return nsaErrorf(err, "nsa: this libnsa was built without CUDA, so it has no NCCL transport");
#endif
}

int nsaCommHaveNccl(void) { return 0; }

int nsaCommNcclUniqueId(NsaCommId *id, NsaError *err) {
    (void)id;
    return noNccl(err);
}

NsaComm *nsaCommNcclCreate(const NsaCommId *id, int rank, int world, int device_ordinal,
                           double timeout_seconds, NsaError *err) {
    (void)id, (void)rank, (void)world, (void)device_ordinal, (void)timeout_seconds;
    noNccl(err);
    return NULL;
}

int nsaCommNcclWaitEvent(NsaComm *c, void *event, const char *what, NsaError *err) {
    (void)c, (void)event, (void)what;
    return noNccl(err);
}

#endif
