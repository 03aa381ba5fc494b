/* nsa_comm_local.c - the in-process transport: ranks that are threads of
 * one process (the CPU engine's data parallelism, and its tests).
 *
 * The handles of one job share an exchange (LocalHub). A collective is two
 * barriers around the copy: each rank posts its call (kind, size, buffer)
 * and waits until every rank has; each checks that all posted the same
 * call, then computes its own part straight from the others' buffers
 * (reduce-scatter: its slice, summed over ranks in rank order; all-gather:
 * the other ranks' slices into its buffer; broadcast: root's buffer into
 * its own) - every rank writes only its own buffer, and only where no other
 * rank reads; then all wait again, so that no rank returns (and reuses its
 * buffer) while another still reads it. Every wait has the transport's
 * deadline: a rank that does not arrive in time aborts every handle of the
 * exchange, naming the missing ranks. */
#include "nsa_comm.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { OP_REDUCE_SCATTER = 1, OP_ALL_GATHER = 2, OP_BROADCAST = 3 };

static const char *opName(int op) {
    return op == OP_REDUCE_SCATTER ? "reduce-scatter" : op == OP_ALL_GATHER ? "all-gather" : "broadcast";
}

/* One rank's posted call. */
typedef struct Post {
    int op, f64, root;
    size_t size;       /* elements (reduce-scatter) or bytes */
    void *buf;
} Post;

typedef struct LocalHub {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* CLOCK_MONOTONIC */
    int world, refs;
    uint64_t generation;   /* barriers passed */
    int arrived;           /* ranks in the current barrier */
    unsigned char *present;/* [world] who is in the current barrier */
    Post *posts;           /* [world] */
    NsaComm **members;     /* [world]; NULL once freed */
} LocalHub;

typedef struct LocalComm {
    NsaComm base;          /* first: an NsaComm * is a LocalComm * */
    LocalHub *hub;
} LocalComm;

static LocalHub *hubOf(NsaComm *c) { return ((LocalComm *)c)->hub; }

/* Lists the ranks not present in the current barrier ("1, 3"). Called
 * with the hub locked. */
static void missingRanks(const LocalHub *h, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (int r = 0; r < h->world && used < cap; r++)
        if (!h->present[r])
            used += (size_t)snprintf(out + used, cap - used, "%s%d", used ? ", " : "", r);
}

/* Waits until every rank reaches this barrier, the deadline passes (the
 * exchange is aborted, naming the missing ranks) or it is aborted. */
static int hubBarrier(NsaComm *c, const char *what, const char *verb, NsaError *err) {
    LocalHub *h = hubOf(c);
    pthread_mutex_lock(&h->mu);
    if (atomic_load(&c->aborted)) {
        pthread_mutex_unlock(&h->mu);
        return nsaCommAbortedError(c, what, err);
    }
    const uint64_t gen = h->generation;
    h->present[c->rank] = 1;
    if (++h->arrived == h->world) {
        h->arrived = 0;
        memset(h->present, 0, (size_t)h->world);
        h->generation++;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        return 0;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = floor(c->timeout);
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((c->timeout - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    int timed_out = 0;
    while (gen == h->generation && !atomic_load(&c->aborted)) {
        if (pthread_cond_timedwait(&h->cv, &h->mu, &deadline) == ETIMEDOUT &&
            gen == h->generation) {
            timed_out = 1;
            break;
        }
    }
    if (gen != h->generation) { /* every rank arrived */
        pthread_mutex_unlock(&h->mu);
        return 0;
    }
    char missing[160];
    missingRanks(h, missing, sizeof missing);
    pthread_mutex_unlock(&h->mu);
    if (timed_out)
        return nsaCommFail(c, err, "rank %d: %s: rank%s %s did not %s within %g s (the deadline "
                                   "of every collective); the transport is aborted",
                           c->rank, what, strchr(missing, ',') ? "s" : "", missing, verb,
                           c->timeout);
    return nsaCommAbortedError(c, what, err);
}

/* Posts this rank's call, waits for all, and checks they agree. */
static int postAndMeet(NsaComm *c, Post post, const char *what, NsaError *err) {
    LocalHub *h = hubOf(c);
    pthread_mutex_lock(&h->mu);
    h->posts[c->rank] = post;
    pthread_mutex_unlock(&h->mu);
    if (hubBarrier(c, what, "arrive", err)) return -1;
    for (int r = 0; r < h->world; r++) {
        const Post *p = &h->posts[r];
        if (p->op != post.op || p->size != post.size || p->f64 != post.f64 || p->root != post.root)
            return nsaCommFail(c, err, "rank %d: %s: rank %d issued %s of %zu (root %d) where rank %d "
                                       "issued %s of %zu (root %d); every rank must issue the same "
                                       "collectives in the same order",
                               c->rank, what, r, opName(p->op), p->size, p->root, c->rank,
                               opName(post.op), post.size, post.root);
    }
    return 0;
}

static int localReduceScatter(NsaComm *c, void *buf, size_t shard, int f64, void *stream,
                              const char *what, NsaError *err) {
    LocalHub *h = hubOf(c);
    Post post = {OP_REDUCE_SCATTER, f64 ? 1 : 0, 0, shard, buf};
    if (postAndMeet(c, post, what, err)) return -1;
    const size_t lo = (size_t)c->rank * shard, hi = lo + shard;
    if (f64) {
        double *own = buf;
        for (size_t i = lo; i < hi; i++) {
            double s = ((const double *)h->posts[0].buf)[i];
            for (int r = 1; r < h->world; r++) s += ((const double *)h->posts[r].buf)[i];
            own[i] = s;
        }
    } else {
        float *own = buf;
        for (size_t i = lo; i < hi; i++) {
            float s = ((const float *)h->posts[0].buf)[i];
            for (int r = 1; r < h->world; r++) s += ((const float *)h->posts[r].buf)[i];
            own[i] = s;
        }
    }
    return hubBarrier(c, what, "finish", err);
}

static int localAllGather(NsaComm *c, void *buf, size_t shard_bytes, void *stream,
                          const char *what, NsaError *err) {
    LocalHub *h = hubOf(c);
    Post post = {OP_ALL_GATHER, 0, 0, shard_bytes, buf};
    if (postAndMeet(c, post, what, err)) return -1;
    for (int r = 0; r < h->world; r++)
        if (r != c->rank && shard_bytes)
            memcpy((char *)buf + (size_t)r * shard_bytes,
                   (const char *)h->posts[r].buf + (size_t)r * shard_bytes, shard_bytes);
    return hubBarrier(c, what, "finish", err);
}

static int localBroadcast(NsaComm *c, void *buf, size_t bytes, int root, void *stream,
                          const char *what, NsaError *err) {
    LocalHub *h = hubOf(c);
    Post post = {OP_BROADCAST, 0, root, bytes, buf};
    if (postAndMeet(c, post, what, err)) return -1;
    if (c->rank != root && bytes) memcpy(buf, h->posts[root].buf, bytes);
    return hubBarrier(c, what, "finish", err);
}

/* An abort of one handle is an abort of the exchange: every member gets
 * the reason and every waiter wakes. */
static void localWake(NsaComm *c) {
    LocalHub *h = hubOf(c);
    char reason[sizeof c->reason];
    nsaCommAborted(c, reason, sizeof reason);
    pthread_mutex_lock(&h->mu);
    for (int r = 0; r < h->world; r++)
        if (h->members[r] && h->members[r] != c) nsaCommMarkAborted(h->members[r], reason);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void hubFree(LocalHub *h) {
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->present);
    free(h->posts);
    free(h->members);
    free(h);
}

static void localDestroy(NsaComm *c) {
    LocalHub *h = hubOf(c);
    pthread_mutex_lock(&h->mu);
    h->members[c->rank] = NULL;
    int last = --h->refs == 0;
    pthread_mutex_unlock(&h->mu);
    nsaCommDestroyBase(c);
    free(c);
    if (last) hubFree(h);
}

static const NsaCommOps localOps = {
    .kind = "local",
    .reduce_scatter = localReduceScatter,
    .all_gather = localAllGather,
    .broadcast = localBroadcast,
    .wake = localWake,
    .destroy = localDestroy,
};

int nsaCommLocalCreate(int world, double timeout_seconds, NsaComm **comms, NsaError *err) {
    if (!comms) return nsaErrorf(err, "nsa: nsaCommLocalCreate needs an array for the handles");
    if (world < 1 || world > 4096)
        return nsaErrorf(err, "nsa: local transport world = %d; allowed: 1 to 4096", world);
    if (!(timeout_seconds > 0) || !(timeout_seconds <= NSA_COMM_MAX_TIMEOUT))
        return nsaErrorf(err, "nsa: local transport timeout = %g s; allowed: more than 0, up to %g",
                         timeout_seconds, NSA_COMM_MAX_TIMEOUT);
    LocalHub *h = calloc(1, sizeof *h);
    if (!h) return nsaErrorf(err, "nsa: out of memory for the local transport");
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &attr);
    pthread_condattr_destroy(&attr);
    h->world = world;
    h->present = calloc((size_t)world, 1);
    h->posts = calloc((size_t)world, sizeof *h->posts);
    h->members = calloc((size_t)world, sizeof *h->members);
    if (!h->present || !h->posts || !h->members) {
        hubFree(h);
        return nsaErrorf(err, "nsa: out of memory for the local transport (%d ranks)", world);
    }
    for (int r = 0; r < world; r++) {
        LocalComm *lc = calloc(1, sizeof *lc);
        if (!lc) {
            for (int k = 0; k < r; k++) nsaCommFree(comms[k]);
            if (r == 0) hubFree(h);
            return nsaErrorf(err, "nsa: out of memory for the local transport (%d ranks)", world);
        }
        nsaCommInitBase(&lc->base, &localOps, r, world, timeout_seconds);
        lc->hub = h;
        h->members[r] = &lc->base;
        h->refs++;
        comms[r] = &lc->base;
    }
    return 0;
}
