/* server.c - listeners, limits, auth and static files; see server.h. */
#include "server.h"
#include "clockutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "api.h"
#include "auth.h"
#include "log.h"
#include "stackdump.h"
#include "stream.h"

#define CSP                                                                                                  \
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "                        \
    "connect-src 'self'; frame-ancestors 'none'"
#define LOOP_WAKE_MS 500
/* Connections a listener takes beyond max_connections: those get a 429
 * answer (so a client learns why); past these, libmicrohttpd closes new
 * ones unanswered (docs/API.md). */
#define CONNECTIONS_OVER_LIMIT 16
/* libmicrohttpd's memory pool per connection: the request line and headers
 * and the body as it arrives in pieces (whole bodies are bounded by
 * max_body). */
#define CONNECTION_POOL_BYTES ((size_t)128 * 1024)

/* One open connection, for the request deadline: when its current request
 * began (the connection's start, or the end of the previous request on a
 * kept-alive connection). The deadline covers receiving the request (its
 * headers and body); once an answer is queued the clock stops (a streamed
 * answer may run for minutes; a reader that stops reading meets the idle
 * timeout). Owned by its listener's thread. */
typedef struct ConnState {
    struct ConnState *prev, *next;
    struct Listener *listener;
    int64_t request_since_ns;
    int fd;
    int answering; /* the request is in and answered: no deadline until the next one */
    int cut;       /* shut down for passing the deadline */
} ConnState;

/* A listener: its socket, its libmicrohttpd daemon and the thread that
 * serves it. Each listener has its own thread, connection count and
 * connection list, so that clients of one (TCP) can never use up what the
 * other (the Unix socket, the local operator's way in) needs. */
typedef struct Listener {
    struct Server *srv;
    struct MHD_Daemon *mhd;
    int fd;
    int is_unix;
    _Atomic unsigned open_connections;
    ConnState *conns; /* the listener thread's, see ConnState */
    _Atomic int64_t tick_ns;
    /* A streamed response resumed from another thread (streamResume) writes
     * a byte into nudge and sets resumed: libmicrohttpd's own wake-up does
     * not end an external select, and the resumed connection needs two
     * more rounds (resume, then its content reader) before its bytes go
     * out, so without this they would wait for LOOP_WAKE_MS. */
    int nudge[2];
    _Atomic int resumed;
    pthread_t thread;
    _Atomic int thread_started; /* set by main after pthread_create; read by both HTTP threads */
} Listener;

struct Server {
    ServerOptions opt;
    Service *svc;
    Listener tcp, unix_sock;
    int port;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char web_root[PATH_MAX]; /* realpath, "" when there is none */
    char token[AUTH_TOKEN_MAX];
    int have_token;
    char bound_host[256];
    _Atomic int stop;
    int wake[2]; /* a byte here ends the HTTP threads' select (never read: it wakes both) */
    pthread_mutex_t streams_lock;   /* the streamed responses alive (streamResponse) */
    struct StreamResponse *streams;
};

/* Per request: made by the URI callback (uriSeen) before the headers are
 * parsed; the body collected so far and whether it was refused. */
typedef struct RequestState {
    char *body;
    size_t len, cap;
    int checked;   /* the first call of the access handler has run */
    int answered;  /* a response was queued */
    int too_large; /* a chunked body outgrew the limit */
    int raw_bad;   /* SERVER_RAW_*: what the undecoded URL held */
} RequestState;

/* ---- addresses ------------------------------------------------------------------ */

int serverIsLoopback(const char *host) {
    if (!host) return 0;
    if (!strcasecmp(host, "localhost")) return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&a6)) return 1;
        if (IN6_IS_ADDR_V4MAPPED(&a6)) return a6.s6_addr[12] == 127;
    }
    return 0;
}

static int bindTcp(Server *srv, NsaError *err) {
    char port[16];
    snprintf(port, sizeof port, "%d", srv->opt.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(srv->opt.listen_host, port, &hints, &res);
    if (rc != 0)
        return nsaErrorf(err, "--listen %s:%d: cannot resolve the address: %s", srv->opt.listen_host,
                      srv->opt.port, gai_strerror(rc));
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return nsaErrorf(err, "--listen %s:%d: cannot listen: %s", srv->opt.listen_host, srv->opt.port,
                      strerror(saved));
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
    srv->tcp.fd = fd;
    return 0;
}

/* Binds the Unix socket with mode 0660, replacing a stale socket file. */
static int bindUnix(Server *srv, NsaError *err) {
    const char *path = srv->opt.socket_path;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return nsaErrorf(err, "--socket %s: path longer than %zu bytes", path, sizeof addr.sun_path - 1);
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) return nsaErrorf(err, "--socket %s: exists and is not a socket", path);
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&addr, sizeof addr) == 0;
        if (probe >= 0) close(probe);
        if (live) return nsaErrorf(err, "--socket %s: another nsad is listening there", path);
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return nsaErrorf(err, "--socket %s: %s", path, strerror(errno));
    mode_t old = umask(0117);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
    int saved = errno;
    umask(old);
    if (rc != 0 || chmod(path, 0660) != 0 || listen(fd, 64) != 0) {
        if (rc == 0) saved = errno;
        close(fd);
        return nsaErrorf(err, "--socket %s: cannot listen: %s", path, strerror(saved));
    }
    snprintf(srv->socket_path, sizeof srv->socket_path, "%s", path);
    srv->unix_sock.fd = fd;
    return 0;
}

/* ---- streamed responses -----------------------------------------------------------
 * A response whose body is a Stream (daemon/stream.h: the JSON lines of the
 * sample and eval routes) is read by MHD through a content reader on the
 * connection's HTTP thread. With nothing buffered the reader suspends the
 * connection (from inside the callback, where MHD allows it) and the
 * producer's next write resumes it (MHD_resume_connection may be called
 * from any thread). The server lists its live streams: at stop, before
 * MHD_stop_daemon (which must not find a suspended connection), each is
 * aborted, which resumes it to its end. */
typedef struct StreamResponse {
    Server *srv;
    struct Listener *listener; /* the connection's (NULL when its state was not allocated) */
    Stream *stream;
    struct MHD_Connection *conn;
    struct StreamResponse *prev, *next;
} StreamResponse;

static void streamSuspend(void *ctx) {
    StreamResponse *sr = ctx;
    MHD_suspend_connection(sr->conn);
}

static void streamResume(void *ctx) {
    StreamResponse *sr = ctx;
    MHD_resume_connection(sr->conn);
    Listener *l = sr->listener;
    if (l && l->nudge[1] >= 0) {
        atomic_store(&l->resumed, 1);
        ssize_t w = write(l->nudge[1], "r", 1);   /* full pipe: a byte is there already */
        (void)w;
    }
}

static ssize_t streamReader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    StreamResponse *sr = cls;
    ssize_t n = streamRead(sr->stream, buf, max, streamSuspend, sr);
    return n < 0 ? MHD_CONTENT_READER_END_OF_STREAM : n;
}

/* MHD is done with the response: its listener's HTTP thread, or MHD_stop_daemon. */
static void streamFree(void *cls) {
    StreamResponse *sr = cls;
    pthread_mutex_lock(&sr->srv->streams_lock);
    if (sr->prev) sr->prev->next = sr->next;
    else sr->srv->streams = sr->next;
    if (sr->next) sr->next->prev = sr->prev;
    pthread_mutex_unlock(&sr->srv->streams_lock);
    streamRelease(sr->stream);
    free(sr);
}

static ConnState *connState(struct MHD_Connection *conn);

/* The response for res->stream, which it takes over; NULL on failure
 * (res->stream released). */
static struct MHD_Response *streamResponse(Server *srv, struct MHD_Connection *conn, ApiResponse *res) {
    StreamResponse *sr = calloc(1, sizeof *sr);
    struct MHD_Response *r = sr ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, streamReader,
                                                                    sr, streamFree)
                                : NULL;
    if (!r) {
        free(sr);
        apiResponseFree(res);
        return NULL;
    }
    sr->srv = srv;
    const ConnState *cs = connState(conn);
    sr->listener = cs ? cs->listener : NULL;
    sr->stream = res->stream;
    sr->conn = conn;
    res->stream = NULL;
    streamSetWake(sr->stream, streamResume, sr);
    pthread_mutex_lock(&srv->streams_lock);
    sr->next = srv->streams;
    if (sr->next) sr->next->prev = sr;
    srv->streams = sr;
    pthread_mutex_unlock(&srv->streams_lock);
    return r;
}

/* ---- responses ------------------------------------------------------------------ */

/* The request on conn is answered: its deadline no longer runs. */
static void requestAnswered(struct MHD_Connection *conn) {
    ConnState *cs = connState(conn);
    if (cs) cs->answering = 1;
}

static enum MHD_Result queue(Server *srv, struct MHD_Connection *conn, ApiResponse *res) {
    struct MHD_Response *r =
        res->stream     ? streamResponse(srv, conn, res)
        : res->has_file ? MHD_create_response_from_fd(res->file_size, res->file_fd)
                        : MHD_create_response_from_buffer(res->body_len, res->body,
                                                          MHD_RESPMEM_MUST_FREE);
    if (!r) {
        apiResponseFree(res);
        return MHD_NO;
    }
    res->has_file = 0; /* MHD closes the descriptor with the response */
    res->body = NULL;  /* MHD owns it now */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, res->content_type);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    if (res->no_store) MHD_add_response_header(r, "Cache-Control", "no-store");
    if (res->allow) MHD_add_response_header(r, "Allow", res->allow);
    if (res->location[0]) MHD_add_response_header(r, "Location", res->location);
    if (res->retry_after) {
        char v[16];
        snprintf(v, sizeof v, "%d", res->retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    if (res->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"nsad\"");
    serviceCountRequest(srv->svc, res->status);
    requestAnswered(conn);
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)res->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result queueError(Server *srv, struct MHD_Connection *conn, int status, const char *code,
                                  const char *message) {
    ApiResponse res;
    apiError(&res, status, code, "%s", message);
    return queue(srv, conn, &res);
}

/* ---- checks ------------------------------------------------------------------------ */

/* Host names a browser on this machine may use: loopback names, any IP
 * literal (DNS rebinding needs a name), the bound host and --allow-host. */
static int hostAllowed(const Server *srv, const char *host_header) {
    if (!host_header || !*host_header) return 0;
    char host[256];
    size_t len = strlen(host_header);
    if (len >= sizeof host) return 0;
    if (host_header[0] == '[') {
        const char *end = strchr(host_header, ']');
        if (!end) return 0;
        len = (size_t)(end - host_header - 1);
        memcpy(host, host_header + 1, len);
        host[len] = '\0';
        if (end[1] && end[1] != ':') return 0;
    } else {
        const char *colon = strchr(host_header, ':');
        if (colon) len = (size_t)(colon - host_header);
        memcpy(host, host_header, len);
        host[len] = '\0';
    }
    struct in6_addr a6;
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1) return 1;
    if (!strcasecmp(host, "localhost")) return 1;
    if (srv->bound_host[0] && !strcasecmp(host, srv->bound_host)) return 1;
    for (int i = 0; i < srv->opt.n_allow_hosts; i++)
        if (!strcasecmp(host, srv->opt.allow_hosts[i])) return 1;
    return 0;
}

int serverPathIsBad(const char *path) {
    if (!path || path[0] != '/') return 1;
    for (const char *p = path; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x21 || c > 0x7e || c == '\\') return 1;
    }
    for (const char *seg = path; seg; seg = strchr(seg + 1, '/')) {
        const char *s = seg + 1;
        if (s[0] == '.' && s[1] == '.' && (s[2] == '/' || s[2] == '\0')) return 1;
    }
    return 0;
}

int serverRawUrlProblem(const char *raw) {
    if (!raw) return SERVER_RAW_BAD_PATH;
    int in_query = 0;
    for (const char *p = raw; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '?') in_query = 1;
        /* decoding "%00" gives a NUL, which would cut the C string short:
         * the path or value nsad checks would not be the one sent */
        int nul = c == '%' && p[1] == '0' && p[2] == '0';
        if (nul || c < 0x21 || c > 0x7e) return in_query ? SERVER_RAW_BAD_QUERY : SERVER_RAW_BAD_PATH;
    }
    return SERVER_RAW_OK;
}

/* First-call checks, before any body is read. Returns 1 when it queued a
 * refusal. */
static int refuseEarly(Server *srv, Listener *l, struct MHD_Connection *conn, const char *url,
                       const char *method, int raw_bad, enum MHD_Result *result) {
    char msg[512];
    if (atomic_load(&l->open_connections) > srv->opt.max_connections) {
        ApiResponse res;
        apiError(&res, 429, "too_many_requests", "more than %u open connections; retry in a moment",
                 srv->opt.max_connections);
        res.retry_after = 1;
        *result = queue(srv, conn, &res);
        return 1;
    }
    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (!l->is_unix && !hostAllowed(srv, host)) {
        snprintf(msg, sizeof msg,
                 "Host '%.200s' is not allowed; allowed: localhost, an IP address, or a name given with "
                 "--allow-host",
                 host ? host : "(none)");
        *result = queueError(srv, conn, 403, "forbidden", msg);
        return 1;
    }
    const char *origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");
    if (origin) {
        char expected[320];
        snprintf(expected, sizeof expected, "http://%s", host ? host : "");
        if (!host || strcasecmp(origin, expected) != 0) {
            snprintf(msg, sizeof msg,
                     "Origin '%.200s' is not this server (%.200s); cross-origin requests are refused", origin,
                     expected);
            *result = queueError(srv, conn, 403, "forbidden", msg);
            return 1;
        }
    }
    if (raw_bad == SERVER_RAW_BAD_PATH || serverPathIsBad(url)) {
        *result = queueError(srv, conn, 400, "bad_path",
                             raw_bad == SERVER_RAW_BAD_PATH
                                 ? "the path holds %00 or a byte outside printable ASCII"
                                 : "the path has a '..' segment, a backslash or a non-printable character");
        return 1;
    }
    if (raw_bad == SERVER_RAW_BAD_QUERY) {
        *result = queueError(srv, conn, 400, "invalid_argument",
                             "the query string holds %00 or a byte outside printable ASCII");
        return 1;
    }
    if (!l->is_unix && srv->have_token && apiOwnsPath(url) && !apiIsPublic(method, url)) {
        const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!authCheckBearer(auth, srv->token)) {
            *result = queueError(
                srv, conn, 401, "unauthorized",
                auth ? "the bearer token is wrong"
                     : "missing 'Authorization: Bearer <token>'; the token is in the state dir's token file");
            return 1;
        }
    }
    const char *clen = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (clen) {
        char *end;
        unsigned long long n = strtoull(clen, &end, 10);
        if (*end == '\0' && n > srv->opt.max_body) {
            snprintf(msg, sizeof msg, "body of %llu bytes is over the limit of %zu bytes", n,
                     srv->opt.max_body);
            *result = queueError(srv, conn, 413, "payload_too_large", msg);
            return 1;
        }
    }
    return 0;
}

/* ---- static files ----------------------------------------------------------------- */

static const char *mimeType(const char *path) {
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".json", "application/json"},
        {".svg", "image/svg+xml"},
        {".png", "image/png"},
        {".ico", "image/x-icon"},
        {".txt", "text/plain; charset=utf-8"},
        {".woff2", "font/woff2"},
        {".map", "application/json"},
    };
    const char *dot = strrchr(path, '.');
    if (dot && !strchr(dot, '/'))
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
            if (!strcasecmp(dot, types[i][0])) return types[i][1];
    return "application/octet-stream";
}

static enum MHD_Result serveStatic(Server *srv, struct MHD_Connection *conn, const char *url,
                                   const char *method) {
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        ApiResponse res;
        apiError(&res, 405, "method_not_allowed",
                 "%s is not allowed on the dashboard's files; allowed: GET, HEAD", method);
        res.allow = "GET, HEAD";
        return queue(srv, conn, &res);
    }
    if (!srv->web_root[0])
        return queueError(srv, conn, 404, "not_found",
                          "no dashboard: nsad found no web root (see --web-root)");
    const char *rel = strcmp(url, "/") == 0 ? "/index.html" : url;
    /* hidden files stay hidden; ".." segments were refused earlier */
    if (strstr(rel, "/.")) return queueError(srv, conn, 404, "not_found", "no such file");
    char path[PATH_MAX], real[PATH_MAX];
    if (snprintf(path, sizeof path, "%s%s", srv->web_root, rel) >= (int)sizeof path || !realpath(path, real))
        return queueError(srv, conn, 404, "not_found", "no such file");
    size_t root_len = strlen(srv->web_root);
    if (strncmp(real, srv->web_root, root_len) != 0 || real[root_len] != '/')
        return queueError(srv, conn, 404, "not_found", "no such file");
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        return queueError(srv, conn, 404, "not_found", "no such file");
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, mimeType(real));
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    serviceCountRequest(srv->svc, 200);
    requestAnswered(conn);
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- the access handler ----------------------------------------------------------- */

static enum MHD_Result collectQuery(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    ApiRequest *req = cls;
    if (req->n_query == API_MAX_QUERY) {
        req->query_overflow = 1;
        return MHD_NO;
    }
    req->query[req->n_query].key = key;
    req->query[req->n_query].value = value;
    req->n_query++;
    return MHD_YES;
}

static enum MHD_Result handleRequest(void *cls, struct MHD_Connection *conn, const char *url,
                                     const char *method, const char *version, const char *upload,
                                     size_t *upload_size, void **con_cls) {
    (void)version;
    Listener *l = cls;
    Server *srv = l->srv;
    RequestState *rs = *con_cls;
    if (!rs) { /* uriSeen ran out of memory */
        rs = calloc(1, sizeof *rs);
        if (!rs) return MHD_NO;
        *con_cls = rs;
    }
    if (!rs->checked) {
        rs->checked = 1;
        enum MHD_Result result;
        if (refuseEarly(srv, l, conn, url, method, rs->raw_bad, &result)) {
            rs->answered = 1;
            return result;
        }
        return MHD_YES;
    }
    if (rs->answered) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (rs->too_large || rs->len + n > srv->opt.max_body) {
            rs->too_large = 1; /* keep reading, answer 413 at the end */
            return MHD_YES;
        }
        if (rs->len + n + 1 > rs->cap) {
            size_t cap = rs->cap ? rs->cap : 4096;
            while (cap < rs->len + n + 1) cap *= 2;
            char *bigger = realloc(rs->body, cap);
            if (!bigger) return MHD_NO;
            rs->body = bigger;
            rs->cap = cap;
        }
        memcpy(rs->body + rs->len, upload, n);
        rs->len += n;
        rs->body[rs->len] = '\0';
        return MHD_YES;
    }
    rs->answered = 1;
    if (rs->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "body is over the limit of %zu bytes", srv->opt.max_body);
        return queueError(srv, conn, 413, "payload_too_large", msg);
    }
    if (!apiOwnsPath(url)) return serveStatic(srv, conn, url, method);

    ApiRequest req = {.method = method, .path = url, .body = rs->body, .body_len = rs->len};
    req.content_type = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, collectQuery, &req);
    ApiResponse res;
    apiHandle(srv->svc, &req, &res);
    logDebug("%s %s -> %d (%s)", method, url, res.status, l->is_unix ? "unix" : "tcp");
    return queue(srv, conn, &res);
}

/* The connection's ConnState (NULL before NOTIFY_STARTED ran). */
static ConnState *connState(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

static void requestCompleted(void *cls, struct MHD_Connection *conn, void **con_cls,
                             enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)toe;
    RequestState *rs = *con_cls;
    if (rs) {
        free(rs->body);
        free(rs);
        *con_cls = NULL;
    }
    /* a kept-alive connection's next request gets a deadline of its own */
    ConnState *cs = conn ? connState(conn) : NULL;
    if (cs) {
        cs->request_since_ns = clockMonotonicNs();
        cs->answering = 0;
    }
}

/* Called with the request line, before the headers are parsed: the raw URL
 * is still undecoded here. Returns the request's RequestState (*con_cls). */
static void *uriSeen(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)cls;
    (void)conn;
    RequestState *rs = calloc(1, sizeof *rs);
    if (rs) rs->raw_bad = serverRawUrlProblem(uri);
    return rs;
}

static void connectionNotify(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                             enum MHD_ConnectionNotificationCode code) {
    Listener *l = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&l->open_connections, 1);
        ConnState *cs = calloc(1, sizeof *cs);
        if (!cs) return; /* no deadline for this one: the idle timeout still applies */
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        cs->fd = info ? info->connect_fd : -1;
        cs->listener = l;
        cs->request_since_ns = clockMonotonicNs();
        cs->next = l->conns;
        if (l->conns) l->conns->prev = cs;
        l->conns = cs;
        *socket_ctx = cs;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&l->open_connections, 1);
        ConnState *cs = *socket_ctx;
        if (!cs) return;
        if (cs->prev) cs->prev->next = cs->next;
        else l->conns = cs->next;
        if (cs->next) cs->next->prev = cs->prev;
        free(cs);
        *socket_ctx = NULL;
    }
}

/* Cuts every connection whose request has run past the deadline: its
 * socket is shut down (not closed: libmicrohttpd owns the descriptor and
 * sees an end of file, then closes and forgets the connection). Trickling
 * bytes resets the idle timeout but never this clock; an answered request
 * has none. Returns the time until the next deadline, in ms (at most
 * cap_ms). */
static uint64_t cutLateConnections(Listener *l, int64_t now, uint64_t cap_ms) {
    int64_t limit = (int64_t)l->srv->opt.request_timeout_s * 1000000000LL;
    uint64_t next_ms = cap_ms;
    for (ConnState *cs = l->conns; cs; cs = cs->next) {
        if (cs->cut || cs->answering || cs->fd < 0) continue;
        int64_t age = now - cs->request_since_ns;
        if (age >= limit) {
            shutdown(cs->fd, SHUT_RDWR);
            cs->cut = 1;
            logInfo("http: closed a %s connection whose request took over %u s (--request-timeout)",
                    l->is_unix ? "Unix socket" : "TCP", l->srv->opt.request_timeout_s);
        } else {
            uint64_t left_ms = (uint64_t)((limit - age) / 1000000) + 1;
            if (left_ms < next_ms) next_ms = left_ms;
        }
    }
    return next_ms;
}

static void mhdLog(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = '\0';
    logDebug("http: %s", line);
}

static int startMhd(Server *srv, Listener *l, NsaError *err) {
    l->srv = srv;
    if (pipe2(l->nudge, O_CLOEXEC | O_NONBLOCK) != 0)
        return nsaErrorf(err, "cannot create a pipe: %s", strerror(errno));
    unsigned hard_limit = srv->opt.max_connections + CONNECTIONS_OVER_LIMIT;
    /* libmicrohttpd counts per IP address only: the Unix socket has none */
    unsigned per_client = l->is_unix ? 0 : srv->opt.max_connections_per_client;
    l->mhd = MHD_start_daemon(
        MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME, 0, NULL, NULL, handleRequest, l, MHD_OPTION_LISTEN_SOCKET, l->fd,
        MHD_OPTION_CONNECTION_LIMIT, hard_limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client,
        MHD_OPTION_CONNECTION_TIMEOUT, srv->opt.idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        CONNECTION_POOL_BYTES, MHD_OPTION_URI_LOG_CALLBACK, uriSeen, l, MHD_OPTION_NOTIFY_COMPLETED,
        requestCompleted, l, MHD_OPTION_NOTIFY_CONNECTION, connectionNotify, l, MHD_OPTION_EXTERNAL_LOGGER,
        mhdLog, srv, MHD_OPTION_END);
    if (!l->mhd)
        return nsaErrorf(err, "cannot start libmicrohttpd on the %s listener", l->is_unix ? "Unix" : "TCP");
    l->fd = -1; /* MHD_stop_daemon closes it */
    return 0;
}

/* ---- the HTTP threads (one per listener) -------------------------------------------- */

/* The HTTP threads' liveness for the watchdog: the older of the two
 * listeners' last loops, so that one stuck thread is not hidden by the
 * other's ticks. */
static void publishTick(Server *srv) {
    int64_t oldest = INT64_MAX;
    const Listener *ls[2] = {&srv->tcp, &srv->unix_sock};
    for (int i = 0; i < 2; i++)
        if (atomic_load(&ls[i]->thread_started)) {
            int64_t t = atomic_load(&ls[i]->tick_ns);
            if (t < oldest) oldest = t;
        }
    if (oldest != INT64_MAX) atomic_store(&srv->svc->http_tick_ns, oldest);
}

static void *httpThread(void *arg) {
    Listener *l = arg;
    Server *srv = l->srv;
    if (stackdumpRegisterThread(l->is_unix ? "http-unix" : "http-tcp") != 0)
        logWarn("the %s HTTP thread is not in stack dumps: %s", l->is_unix ? "Unix socket" : "TCP",
                strerror(errno));
    while (!atomic_load(&srv->stop)) {
        int64_t now = clockMonotonicNs();
        atomic_store(&l->tick_ns, now);
        publishTick(srv);
        fd_set r, w, e;
        FD_ZERO(&r);
        FD_ZERO(&w);
        FD_ZERO(&e);
        MHD_socket max = srv->wake[0] > l->nudge[0] ? srv->wake[0] : l->nudge[0];
        FD_SET(srv->wake[0], &r);
        FD_SET(l->nudge[0], &r);
        uint64_t timeout_ms = cutLateConnections(l, now, LOOP_WAKE_MS);
        if (atomic_exchange(&l->resumed, 0)) timeout_ms = 0;   /* the resumed stream's next round */
        MHD_get_fdset2(l->mhd, &r, &w, &e, &max, FD_SETSIZE);
        MHD_UNSIGNED_LONG_LONG t;
        if (MHD_get_timeout(l->mhd, &t) == MHD_YES && t < timeout_ms) timeout_ms = t;
        struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
        int n = select(max + 1, &r, &w, &e, &tv);
        if (n < 0 && errno != EINTR) {
            logError("http: select failed: %s", strerror(errno));
            struct timespec nap = {0, 100 * 1000000L};
            nanosleep(&nap, NULL);
            continue;
        }
        if (n < 0) continue;
        if (FD_ISSET(l->nudge[0], &r)) {
            char drain[64];
            while (read(l->nudge[0], drain, sizeof drain) > 0) {
            }
        }
        MHD_run_from_select(l->mhd, &r, &w, &e);
    }
    stackdumpUnregisterThread();
    return NULL;
}

static int startThread(Listener *l, NsaError *err) {
    atomic_store(&l->tick_ns, clockMonotonicNs());
    int rc = pthread_create(&l->thread, NULL, httpThread, l);
    if (rc != 0)
        return nsaErrorf(err, "cannot start the %s HTTP thread: %s",
                         l->is_unix ? "Unix socket" : "TCP", strerror(rc));
    atomic_store(&l->thread_started, 1);
    return 0;
}

/* ---- life cycle ---------------------------------------------------------------------- */

Server *serverStart(const ServerOptions *opt, Service *svc, NsaError *err) {
    Server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        nsaErrorf(err, "out of memory");
        return NULL;
    }
    srv->opt = *opt;
    srv->svc = svc;
    pthread_mutex_init(&srv->streams_lock, NULL);
    srv->tcp.fd = srv->unix_sock.fd = -1;
    srv->tcp.nudge[0] = srv->tcp.nudge[1] = srv->unix_sock.nudge[0] = srv->unix_sock.nudge[1] = -1;
    srv->unix_sock.is_unix = 1;
    srv->wake[0] = srv->wake[1] = -1;
    if (opt->token) {
        snprintf(srv->token, sizeof srv->token, "%s", opt->token);
        srv->have_token = 1;
    }
    if (opt->listen_host) snprintf(srv->bound_host, sizeof srv->bound_host, "%s", opt->listen_host);
    if (opt->web_root && !realpath(opt->web_root, srv->web_root)) srv->web_root[0] = '\0';
    if (pipe2(srv->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        nsaErrorf(err, "cannot create a pipe: %s", strerror(errno));
        goto fail;
    }
    if (opt->listen_host && (bindTcp(srv, err) != 0 || startMhd(srv, &srv->tcp, err) != 0)) goto fail;
    if (opt->socket_path && *opt->socket_path &&
        (bindUnix(srv, err) != 0 || startMhd(srv, &srv->unix_sock, err) != 0))
        goto fail;
    if (!srv->tcp.mhd && !srv->unix_sock.mhd) {
        nsaErrorf(err, "no listener: give --listen or --socket");
        goto fail;
    }
    if ((srv->tcp.mhd && startThread(&srv->tcp, err) != 0) ||
        (srv->unix_sock.mhd && startThread(&srv->unix_sock, err) != 0))
        goto fail;
    return srv;
fail:
    serverStop(srv);
    return NULL;
}

int serverPort(const Server *srv) { return srv && srv->tcp.mhd ? srv->port : 0; }

void serverStop(Server *srv) {
    if (!srv) return;
    Listener *ls[2] = {&srv->tcp, &srv->unix_sock};
    atomic_store(&srv->stop, 1);
    if (srv->wake[1] >= 0) {
        ssize_t w = write(srv->wake[1], "x", 1);
        (void)w;
    }
    for (int i = 0; i < 2; i++)
        if (atomic_load(&ls[i]->thread_started)) pthread_join(ls[i]->thread, NULL);
    /* no connection may stay suspended into MHD_stop_daemon: end every stream */
    pthread_mutex_lock(&srv->streams_lock);
    for (StreamResponse *sr = srv->streams; sr; sr = sr->next) streamAbort(sr->stream);
    pthread_mutex_unlock(&srv->streams_lock);
    for (int i = 0; i < 2; i++) {
        /* closes the listener's connections (connectionNotify frees their state) */
        if (ls[i]->mhd) MHD_stop_daemon(ls[i]->mhd);
        if (ls[i]->fd >= 0) close(ls[i]->fd);
        if (ls[i]->nudge[0] >= 0) close(ls[i]->nudge[0]);
        if (ls[i]->nudge[1] >= 0) close(ls[i]->nudge[1]);
    }
    if (srv->socket_path[0]) unlink(srv->socket_path);
    if (srv->wake[0] >= 0) close(srv->wake[0]);
    if (srv->wake[1] >= 0) close(srv->wake[1]);
    pthread_mutex_destroy(&srv->streams_lock);
    free(srv);
}
