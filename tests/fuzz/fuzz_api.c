/* fuzz_api.c - libFuzzer harness for nsad's HTTP side: libmicrohttpd's
 * parsing in front of daemon/server.c (limits, Host/Origin, token, raw URL
 * and path checks, bodies) and daemon/api.c's routes, through a real
 * nsad server on a Unix socket and a loopback TCP port.
 *
 * The first byte picks the listener (even: the Unix socket, odd: TCP, where
 * the token is "fuzz" repeated 16 times); the rest is sent as it is, as one
 * connection's bytes, after which the harness half-closes and reads until
 * nsad closes. nsad must answer or close within 10 s (the harness aborts
 * otherwise: a request that holds a connection open is a finding), and
 * every answer must be HTTP. The service has no trainer thread: the run
 * the harness creates at start stays queued (later POSTs answer 409 busy),
 * and "@RUN@" in an input becomes its id, so that the per-run routes are
 * reachable. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "fuzzutil.h"
#include "server.h"
#include "service.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char socket_path[128];
static char run_id[RUN_ID_MAX];
static Service *svc;
static Server *srv;
static int port;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *root = fuzzScratchDir("nsad-fuzz-api");
    char state[128], web[128], index[160];
    snprintf(state, sizeof state, "%s/state", root);
    snprintf(web, sizeof web, "%s/web", root);
    snprintf(socket_path, sizeof socket_path, "%s/nsad.sock", root);
    snprintf(index, sizeof index, "%s/index.html", web);
    mkdir(state, 0700);
    mkdir(web, 0755);
    FILE *f = fopen(index, "w");
    if (!f) fuzzDie("create", index);
    fputs("<!doctype html><title>fuzz</title>\n", f);
    fclose(f);
    NsaError err = {{0}};
    svc = serviceOpen(state, &err);
    if (!svc) fuzzDie("serviceOpen", err.message);
    static char token[65];
    for (int i = 0; i < 16; i++) memcpy(token + 4 * i, "fuzz", 4);
    ServerOptions opt = {
        .listen_host = "127.0.0.1",
        .port = 0,
        .socket_path = socket_path,
        .web_root = web,
        .token = token,
        .max_body = 64 * 1024,
        .max_connections = 64,
        .max_connections_per_client = 64,
        .idle_timeout_s = 5,
        .request_timeout_s = 5,
    };
    srv = serverStart(&opt, svc, &err);
    if (!srv) fuzzDie("serverStart", err.message);
    port = serverPort(srv);
    static const char job[] = "train: {steps: 3, seq_len: 64, batch_size: 1}\nruntime: {device: cpu}\n"
                              "model: {dim: 32, n_layers: 1, n_heads: 2, n_kv_groups: 1, d_k: 16, d_v: 16}\n";
    if (serviceCreateRun(svc, job, sizeof job - 1, "fuzz", run_id, NULL, &err) != SVC_OK)
        fuzzDie("serviceCreateRun", err.message);
    return 0;
}

/* The input with every "@RUN@" replaced by the queued run's id (malloc'd). */
static char *withRunId(const uint8_t *data, size_t size, size_t *len) {
    size_t id_len = strlen(run_id), n = 0;
    char *out = malloc(size * (id_len > 5 ? id_len / 5 + 1 : 1) + 1);
    if (!out) fuzzDie("malloc", "input");
    for (size_t i = 0; i < size;) {
        if (size - i >= 5 && !memcmp(data + i, "@RUN@", 5)) {
            memcpy(out + n, run_id, id_len);
            n += id_len;
            i += 5;
        } else {
            out[n++] = (char)data[i++];
        }
    }
    *len = n;
    return out;
}

static int connectTo(int unix_sock) {
    int fd;
    if (unix_sock) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", socket_path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) fuzzDie("connect", socket_path);
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) fuzzDie("connect", "127.0.0.1");
    }
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int fd = connectTo(data[0] % 2 == 0);
    size_t len;
    char *bytes = withRunId(data + 1, size - 1, &len);
    const char *p = bytes;
    /* a peer that stops reading must not block the harness: nsad may
     * answer and close before all bytes are sent */
    while (len) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        p += w;
        len -= (size_t)w;
    }
    free(bytes);
    shutdown(fd, SHUT_WR);
    char buf[65536];
    size_t got = 0;
    char head[8] = "";
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
        int n = poll(&p, 1, 10000);
        if (n == 0) fuzzDie("no answer and no close within 10 s", "the connection stays open");
        if (n < 0 && errno == EINTR) continue;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* closed (or reset: nsad refused the bytes) */
        if (got < 5) memcpy(head + got, buf, (size_t)r < 5 - got ? (size_t)r : 5 - got);
        got += (size_t)r;
    }
    close(fd);
    if (got >= 5 && memcmp(head, "HTTP/", 5) != 0) fuzzDie("an answer that is not HTTP", head);
    return 0;
}
