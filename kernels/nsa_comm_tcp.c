/* nsa_comm_tcp.c - the TCP transport: CPU-engine ranks in several processes
 * (nsad daemons on several nodes, joined through their API), so that the
 * multi-node path runs without GPUs.
 *
 * A star through rank 0: nsaCommTcpUniqueId opens rank 0's listening
 * socket and describes it in the id (address, port, a random key every
 * rank presents); each other rank connects and says who it is. In a
 * collective every rank sends rank 0 a header (what it calls) and its part,
 * rank 0 checks the headers agree, computes, and sends each rank its
 * result:
 *   reduce-scatter: rank 0 adds every rank's buffer into its own in rank
 *     order (((b0 + b1) + b2) ..., the local transport's order, so results
 *     are the same bits) and sends slice r to rank r;
 *   all-gather: rank 0 collects the slices and sends the whole buffer back;
 *   broadcast: root's buffer goes to rank 0 (when root is not 0) and on to
 *     the others.
 * Every socket wait polls against the collective's deadline; an abort (any
 * thread) shuts the sockets down, so waits end at once, and the peers see
 * the connection close. Rank 0 streams what it receives through one chunk
 * buffer allocated at create: a collective allocates nothing. */
#include "nsa_comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TCP_MAGIC "NSATCP1"
#define TCP_CHUNK ((size_t)1 << 20)
/* How long rank 0 waits for a connection's hello before it drops it. */
#define TCP_HELLO_SECONDS 5.0
#define HEADER_MAGIC 0x4e534143u /* "NSAC" */

enum { OP_REDUCE_SCATTER = 1, OP_ALL_GATHER = 2, OP_BROADCAST = 3 };

/* What an NsaCommId holds for this transport. */
typedef struct TcpId {
    char magic[8];
    uint64_t key;
    uint32_t port;
    int32_t fd;     /* rank 0's listening socket, in the process that made it */
    int32_t pid;
    char host[64];  /* where the other ranks connect */
} TcpId;
_Static_assert(sizeof(TcpId) <= NSA_COMM_ID_BYTES, "a TCP id fits an NsaCommId");

typedef struct Hello {
    uint64_t key;
    int32_t rank, world;
} Hello;

typedef struct Header {
    uint32_t magic, op;
    uint64_t size, seq;
    int32_t root, f64;
} Header;

typedef struct TcpComm {
    NsaComm base;     /* first: an NsaComm * is a TcpComm * */
    int *fds;         /* rank 0: [world] (fds[0] unused); others: fds[0] is rank 0 */
    int n_fds;
    unsigned char *chunk;  /* rank 0: TCP_CHUNK bytes */
    uint64_t seq;     /* collectives issued */
} TcpComm;

static TcpComm *tcpOf(NsaComm *c) { return (TcpComm *)c; }

/* Milliseconds until deadline (>= 0), for poll. */
static int msLeft(double deadline) {
    double left = deadline - nsaCommNow();
    return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

/* Moves n bytes over fd (send or receive) by the deadline. Returns 0, or
 * -1 with err: the deadline, a closed connection, an abort. */
static int moveAll(TcpComm *tc, int fd, void *buf, size_t n, int sending, double deadline,
                   const char *what, int peer, NsaError *err) {
    NsaComm *c = &tc->base;
    char *p = buf;
    while (n > 0) {
        if (atomic_load(&c->aborted)) return nsaCommAbortedError(c, what, err);
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        int ready = poll(&pfd, 1, msLeft(deadline));
        if (ready < 0 && errno == EINTR) continue;
        if (atomic_load(&c->aborted)) return nsaCommAbortedError(c, what, err);
        if (ready < 0)
            return nsaCommFail(c, err, "rank %d: %s: waiting for rank %d: poll: %s; the transport is "
                                       "aborted",
                               c->rank, what, peer, strerror(errno));
        if (ready == 0)
            return nsaCommFail(c, err, "rank %d: %s: rank %d did not %s within %g s (the deadline of "
                                       "every collective); the transport is aborted",
                               c->rank, what, peer, sending ? "take our data" : "send its part",
                               c->timeout);
        /* never blocking: POLLOUT means some room, not room for n bytes, and
         * a send that waits for the rest would outlive the deadline */
        ssize_t got = sending ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT)
                              : recv(fd, p, n, MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (got <= 0)
            return nsaCommFail(c, err, "rank %d: %s: the connection with rank %d %s; the transport is "
                                       "aborted",
                               c->rank, what, peer, got == 0 ? "closed (its process ended?)"
                                                             : strerror(errno));
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static int sendAll(TcpComm *tc, int fd, const void *buf, size_t n, double deadline,
                   const char *what, int peer, NsaError *err) {
    return moveAll(tc, fd, (void *)buf, n, 1, deadline, what, peer, err);
}

static int recvAll(TcpComm *tc, int fd, void *buf, size_t n, double deadline, const char *what,
                   int peer, NsaError *err) {
    return moveAll(tc, fd, buf, n, 0, deadline, what, peer, err);
}

static const char *opName(uint32_t op) {
    return op == OP_REDUCE_SCATTER ? "reduce-scatter" : op == OP_ALL_GATHER ? "all-gather" : "broadcast";
}

/* Rank 0 reads rank r's header and checks it matches its own call. */
static int expectHeader(TcpComm *tc, int r, const Header *mine, double deadline, const char *what,
                        NsaError *err) {
    Header h;
    if (recvAll(tc, tc->fds[r], &h, sizeof h, deadline, what, r, err)) return -1;
    if (h.magic != HEADER_MAGIC || h.op != mine->op || h.size != mine->size || h.seq != mine->seq ||
        h.root != mine->root || h.f64 != mine->f64)
        return nsaCommFail(&tc->base, err,
                           "rank 0: %s: rank %d issued %s of %llu (root %d, collective #%llu) where "
                           "rank 0 issued %s of %llu (root %d, collective #%llu); every rank must "
                           "issue the same collectives in the same order",
                           what, r, opName(h.op), (unsigned long long)h.size, h.root,
                           (unsigned long long)h.seq, opName(mine->op), (unsigned long long)mine->size,
                           mine->root, (unsigned long long)mine->seq);
    return 0;
}

static Header headerOf(TcpComm *tc, uint32_t op, size_t size, int root, int f64) {
    Header h = {HEADER_MAGIC, op, (uint64_t)size, tc->seq++, root, f64};
    return h;
}

static int tcpReduceScatter(NsaComm *c, void *buf, size_t shard, int f64, void *stream,
                            const char *what, NsaError *err) {
    TcpComm *tc = tcpOf(c);
    const double deadline = nsaCommNow() + c->timeout;
    const size_t esz = f64 ? sizeof(double) : sizeof(float), slice = shard * esz;
    const size_t total = slice * (size_t)c->world;
    Header mine = headerOf(tc, OP_REDUCE_SCATTER, shard, 0, f64);
    if (c->rank != 0) {
        if (sendAll(tc, tc->fds[0], &mine, sizeof mine, deadline, what, 0, err) ||
            sendAll(tc, tc->fds[0], buf, total, deadline, what, 0, err))
            return -1;
        return recvAll(tc, tc->fds[0], (char *)buf + (size_t)c->rank * slice, slice, deadline, what,
                       0, err);
    }
    /* rank 0: add each rank's buffer into ours, rank by rank */
    for (int r = 1; r < c->world; r++) {
        if (expectHeader(tc, r, &mine, deadline, what, err)) return -1;
        for (size_t at = 0; at < total; at += TCP_CHUNK) {
            const size_t n = total - at < TCP_CHUNK ? total - at : TCP_CHUNK;
            if (recvAll(tc, tc->fds[r], tc->chunk, n, deadline, what, r, err)) return -1;
            if (f64) {
                double *acc = (double *)((char *)buf + at);
                const double *in = (const double *)tc->chunk;
                for (size_t i = 0; i < n / sizeof(double); i++) acc[i] += in[i];
            } else {
                float *acc = (float *)((char *)buf + at);
                const float *in = (const float *)tc->chunk;
                for (size_t i = 0; i < n / sizeof(float); i++) acc[i] += in[i];
            }
        }
    }
    for (int r = 1; r < c->world; r++)
        if (sendAll(tc, tc->fds[r], (char *)buf + (size_t)r * slice, slice, deadline, what, r, err))
            return -1;
    return 0;
}

static int tcpAllGather(NsaComm *c, void *buf, size_t shard_bytes, void *stream, const char *what,
                        NsaError *err) {
    TcpComm *tc = tcpOf(c);
    const double deadline = nsaCommNow() + c->timeout;
    const size_t total = shard_bytes * (size_t)c->world;
    Header mine = headerOf(tc, OP_ALL_GATHER, shard_bytes, 0, 0);
    if (c->rank != 0) {
        if (sendAll(tc, tc->fds[0], &mine, sizeof mine, deadline, what, 0, err) ||
            sendAll(tc, tc->fds[0], (char *)buf + (size_t)c->rank * shard_bytes, shard_bytes,
                    deadline, what, 0, err))
            return -1;
        return recvAll(tc, tc->fds[0], buf, total, deadline, what, 0, err);
    }
    for (int r = 1; r < c->world; r++)
        if (expectHeader(tc, r, &mine, deadline, what, err) ||
            recvAll(tc, tc->fds[r], (char *)buf + (size_t)r * shard_bytes, shard_bytes, deadline,
                    what, r, err))
            return -1;
    for (int r = 1; r < c->world; r++)
        if (sendAll(tc, tc->fds[r], buf, total, deadline, what, r, err)) return -1;
    return 0;
}

static int tcpBroadcast(NsaComm *c, void *buf, size_t bytes, int root, void *stream,
                        const char *what, NsaError *err) {
    TcpComm *tc = tcpOf(c);
    const double deadline = nsaCommNow() + c->timeout;
    Header mine = headerOf(tc, OP_BROADCAST, bytes, root, 0);
    if (c->rank != 0) {
        if (sendAll(tc, tc->fds[0], &mine, sizeof mine, deadline, what, 0, err)) return -1;
        if (c->rank == root) return sendAll(tc, tc->fds[0], buf, bytes, deadline, what, 0, err);
        return recvAll(tc, tc->fds[0], buf, bytes, deadline, what, 0, err);
    }
    for (int r = 1; r < c->world; r++)
        if (expectHeader(tc, r, &mine, deadline, what, err)) return -1;
    if (root != 0 && recvAll(tc, tc->fds[root], buf, bytes, deadline, what, root, err)) return -1;
    for (int r = 1; r < c->world; r++)
        if (r != root && sendAll(tc, tc->fds[r], buf, bytes, deadline, what, r, err)) return -1;
    return 0;
}

/* An abort ends every socket wait at once (poll wakes on the shutdown). */
static void tcpWake(NsaComm *c) {
    TcpComm *tc = tcpOf(c);
    for (int i = 0; i < tc->n_fds; i++)
        if (tc->fds[i] >= 0) shutdown(tc->fds[i], SHUT_RDWR);
}

static void tcpDestroy(NsaComm *c) {
    TcpComm *tc = tcpOf(c);
    for (int i = 0; tc->fds && i < tc->n_fds; i++)
        if (tc->fds[i] >= 0) close(tc->fds[i]);
    free(tc->fds);
    free(tc->chunk);
    nsaCommDestroyBase(c);
    free(tc);
}

static const NsaCommOps tcpOps = {
    .kind = "tcp",
    .reduce_scatter = tcpReduceScatter,
    .all_gather = tcpAllGather,
    .broadcast = tcpBroadcast,
    .wake = tcpWake,
    .destroy = tcpDestroy,
};

int nsaCommTcpUniqueId(const char *bind_host, NsaCommId *id, NsaError *err) {
    if (!id) return nsaErrorf(err, "nsa: nsaCommTcpUniqueId needs an id to fill");
    memset(id, 0, sizeof *id);
    TcpId t;
    memset(&t, 0, sizeof t);
    memcpy(t.magic, TCP_MAGIC, sizeof TCP_MAGIC);
    FILE *rnd = fopen("/dev/urandom", "rb");
    const int have_key = rnd && fread(&t.key, sizeof t.key, 1, rnd) == 1;
    if (rnd) fclose(rnd);
    if (!have_key) return nsaErrorf(err, "nsa: cannot read /dev/urandom for the TCP transport's key");
    const char *host = bind_host && bind_host[0] ? bind_host : "0.0.0.0";
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return nsaErrorf(err, "nsa: TCP transport bind address '%s'; allowed: an IPv4 address of this "
                              "machine, or \"\" for all", host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return nsaErrorf(err, "nsa: socket: %s", strerror(errno));
    socklen_t len = sizeof addr;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
        int e = errno;
        close(fd);
        return nsaErrorf(err, "nsa: TCP transport listening on %s: %s", host, strerror(e));
    }
    t.port = ntohs(addr.sin_port);
    t.fd = fd;
    t.pid = (int32_t)getpid();
    snprintf(t.host, sizeof t.host, "%s", bind_host && bind_host[0] ? bind_host : "127.0.0.1");
    memcpy(id->bytes, &t, sizeof t);
    return 0;
}

void nsaCommTcpIdRelease(NsaCommId *id) {
    if (!id) return;
    TcpId t;
    memcpy(&t, id->bytes, sizeof t);
    if (memcmp(t.magic, TCP_MAGIC, sizeof TCP_MAGIC) || t.pid != (int32_t)getpid() || t.fd < 0)
        return; /* not a TCP id, another process's, or released */
    close(t.fd);
    t.fd = -1;
    memcpy(id->bytes, &t, sizeof t);
}

int nsaCommTcpIdSetHost(NsaCommId *id, const char *host, NsaError *err) {
    TcpId t;
    if (!id || !host) return nsaErrorf(err, "nsa: nsaCommTcpIdSetHost needs an id and a host");
    memcpy(&t, id->bytes, sizeof t);
    if (memcmp(t.magic, TCP_MAGIC, sizeof TCP_MAGIC))
        return nsaErrorf(err, "nsa: not a TCP transport id");
    if (strlen(host) >= sizeof t.host)
        return nsaErrorf(err, "nsa: TCP transport host '%.40s...' is longer than %zu bytes", host,
                         sizeof t.host - 1);
    snprintf(t.host, sizeof t.host, "%s", host);
    memcpy(id->bytes, &t, sizeof t);
    return 0;
}

/* Reads a joining rank's hello by the deadline without failing the
 * transport: a stranger that says nothing is just dropped. */
static int readHello(int fd, Hello *h, double deadline) {
    char *p = (char *)h;
    size_t n = sizeof *h;
    while (n > 0) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = poll(&pfd, 1, msLeft(deadline));
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return -1;
        ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Rank 0 takes the other ranks' connections from its listening socket. */
static int acceptAll(TcpComm *tc, int listen_fd, uint64_t key, double deadline, NsaError *err) {
    NsaComm *c = &tc->base;
    int joined = 1;
    while (joined < c->world) {
        struct pollfd pfd = {listen_fd, POLLIN, 0};
        int ready = poll(&pfd, 1, msLeft(deadline));
        if (ready < 0 && errno == EINTR) continue;
        if (ready > 0 && (pfd.revents & (POLLERR | POLLNVAL)))
            return nsaErrorf(err, "nsa: rank 0: TCP transport: its listening socket failed");
        if (ready <= 0 || nsaCommNow() > deadline) {
            char missing[160] = "";
            size_t used = 0;
            for (int r = 1; r < c->world && used < sizeof missing; r++)
                if (tc->fds[r] < 0)
                    used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                             used ? ", " : "", r);
            return nsaErrorf(err, "nsa: rank 0: TCP transport: rank%s %s did not join within %g s",
                             strchr(missing, ',') ? "s" : "", missing, c->timeout);
        }
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        /* a rank says hello as it connects: a connection that stays silent
         * (not one of ours) costs a few seconds, not the whole deadline */
        const double hello_by = nsaCommNow() + TCP_HELLO_SECONDS;
        Hello h;
        if (readHello(fd, &h, hello_by < deadline ? hello_by : deadline) != 0 || h.key != key ||
            h.world != c->world || h.rank < 1 || h.rank >= c->world || tc->fds[h.rank] >= 0) {
            close(fd); /* a stranger, or a rank twice: not part of this job */
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        tc->fds[h.rank] = fd;
        joined++;
    }
    return 0;
}

/* connect(2) on the non-blocking fd, waiting no later than deadline (a
 * blocking connect to an address that drops SYNs waits out the kernel's
 * retries, minutes, whatever the deadline). Returns 0, or -1 with errno. */
static int connectBy(int fd, const struct sockaddr_in *addr, double deadline) {
    if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0) return 0;
    if (errno != EINPROGRESS) return -1;
    for (;;) {
        struct pollfd pfd = {fd, POLLOUT, 0};
        int ready = poll(&pfd, 1, msLeft(deadline));
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return -1;
        if (ready == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        int so_error = 0;
        socklen_t len = sizeof so_error;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) return -1;
        if (so_error == 0) return 0;
        errno = so_error;
        return -1;
    }
}

/* A rank other than 0 connects to rank 0 and says who it is. */
static int connectToRoot(TcpComm *tc, const TcpId *t, double deadline, NsaError *err) {
    NsaComm *c = &tc->base;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)t->port);
    if (inet_pton(AF_INET, t->host, &addr.sin_addr) != 1)
        return nsaErrorf(err, "nsa: rank %d: TCP transport: rank 0's address '%s' is not an IPv4 "
                              "address", c->rank, t->host);
    for (;;) { /* rank 0 may still be on its way to accept: retry by the deadline */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return nsaErrorf(err, "nsa: socket: %s", strerror(errno));
        if (connectBy(fd, &addr, deadline) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            tc->fds[0] = fd;
            Hello h = {t->key, c->rank, c->world};
            return sendAll(tc, fd, &h, sizeof h, deadline, "join", 0, err);
        }
        int e = errno;
        close(fd);
        if (nsaCommNow() > deadline)
            return nsaErrorf(err, "nsa: rank %d: TCP transport: cannot reach rank 0 at %s:%u within "
                                  "%g s: %s", c->rank, t->host, t->port, c->timeout, strerror(e));
        struct timespec nap = {0, 20 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* 1 when the id's fd is still the listening socket it names (not closed,
 * and not a number reused by another file since). */
static int isOurListener(const TcpId *t) {
    int listening = 0;
    socklen_t len = sizeof listening;
    struct sockaddr_in addr;
    socklen_t alen = sizeof addr;
    return t->fd >= 0 && getsockopt(t->fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 &&
           listening && getsockname(t->fd, (struct sockaddr *)&addr, &alen) == 0 &&
           addr.sin_family == AF_INET && ntohs(addr.sin_port) == t->port;
}

NsaComm *nsaCommTcpCreate(const NsaCommId *id, int rank, int world, double timeout_seconds,
                          NsaError *err) {
    TcpId t;
    if (!id) {
        nsaErrorf(err, "nsa: nsaCommTcpCreate needs the job's id (NULL given)");
        return NULL;
    }
    memcpy(&t, id->bytes, sizeof t);
    if (memcmp(t.magic, TCP_MAGIC, sizeof TCP_MAGIC)) {
        nsaErrorf(err, "nsa: not a TCP transport id (make it with nsaCommTcpUniqueId)");
        return NULL;
    }
    if (world < 1 || world > 4096 || rank < 0 || rank >= world) {
        nsaErrorf(err, "nsa: TCP rank %d of world %d; allowed: 1 to 4096 ranks, 0 <= rank < world",
                  rank, world);
        return NULL;
    }
    if (!(timeout_seconds > 0) || !(timeout_seconds <= NSA_COMM_MAX_TIMEOUT)) {
        nsaErrorf(err, "nsa: TCP timeout = %g s; allowed: more than 0, up to %g", timeout_seconds,
                  NSA_COMM_MAX_TIMEOUT);
        return NULL;
    }
    if (rank == 0 && (t.pid != (int32_t)getpid() || !isOurListener(&t))) {
        nsaErrorf(err, "nsa: rank 0 of a TCP job must be made from an id that is not released, in "
                       "the process that made it (its listening socket)");
        return NULL;
    }
    TcpComm *tc = calloc(1, sizeof *tc);
    if (!tc) {
        nsaErrorf(err, "nsa: out of memory for rank %d's TCP handle", rank);
        return NULL;
    }
    nsaCommInitBase(&tc->base, &tcpOps, rank, world, timeout_seconds);
    tc->n_fds = rank == 0 ? world : 1;
    tc->fds = malloc((size_t)tc->n_fds * sizeof(int));
    tc->chunk = rank == 0 ? malloc(TCP_CHUNK) : NULL;
    if (!tc->fds || (rank == 0 && !tc->chunk)) {
        free(tc->fds);
        free(tc->chunk);
        nsaCommDestroyBase(&tc->base);
        free(tc);
        nsaErrorf(err, "nsa: out of memory for rank %d's TCP handle", rank);
        return NULL;
    }
    for (int i = 0; i < tc->n_fds; i++) tc->fds[i] = -1;
    const double deadline = nsaCommNow() + timeout_seconds;
    int rc;
    if (rank == 0) {
        /* a descriptor of its own: the maker may release the id's while a
         * rank given up on still waits here, and its number be reused */
        const int listen_fd = fcntl(t.fd, F_DUPFD_CLOEXEC, 0);
        rc = listen_fd < 0 ? nsaErrorf(err, "nsa: TCP rank 0's listening socket: %s", strerror(errno))
                           : acceptAll(tc, listen_fd, t.key, deadline, err);
        if (listen_fd >= 0) close(listen_fd);
    } else {
        rc = connectToRoot(tc, &t, deadline, err);
    }
    if (rc != 0) {
        tcpDestroy(&tc->base);
        return NULL;
    }
    return &tc->base;
}
