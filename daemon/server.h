/* server.h - nsad's HTTP server: libmicrohttpd on a TCP socket and a Unix
 * socket (both bound here and handed over with MHD_OPTION_LISTEN_SOCKET),
 * each served by a thread of its own with its own connection limits, so
 * TCP clients can never starve the Unix socket. It enforces what
 * proto/api.md promises about transport: the bearer token on TCP, Host and
 * Origin checks, body and connection limits (per listener and per client
 * address), a deadline per request that trickling bytes cannot extend,
 * path traversal refusal, security headers, and serves the dashboard's
 * static files; everything under /api and /metrics goes to apiHandle. */
#ifndef NSAD_SERVER_H
#define NSAD_SERVER_H

#include <stddef.h>
#include "service.h"

#define SERVER_MAX_ALLOW_HOSTS 16

typedef struct ServerOptions {
    const char *listen_host;                         /* numeric address or name; NULL: no TCP listener */
    int port;                                        /* 0 picks a free port (see serverPort) */
    const char *socket_path;                         /* NULL or "": no Unix socket */
    const char *web_root;                            /* dashboard directory; NULL: none */
    const char *token;                               /* required on TCP; NULL: no auth (loopback only) */
    size_t max_body;                                 /* bytes; larger bodies get 413 */
    unsigned max_connections;                        /* per listener: open connections beyond it get 429 */
    unsigned max_connections_per_client;             /* TCP: per client address; more are refused */
    unsigned idle_timeout_s;                         /* an idle connection closes after it */
    unsigned request_timeout_s;                      /* a request's headers and body must be in by then */
    const char *allow_hosts[SERVER_MAX_ALLOW_HOSTS]; /* extra Host names */
    int n_allow_hosts;
} ServerOptions;

typedef struct Server Server;

/* Binds the listeners opt names (TCP, the Unix socket, or both; at least
 * one) and starts, for each, a libmicrohttpd daemon and the HTTP thread that
 * serves it. A stale Unix socket file (nobody accepting) is replaced; a live
 * one is an error (another nsad). svc must outlive the server. Returns the
 * server (stop and free it with serverStop), or NULL with err naming the
 * address and the reason; on failure nothing is left running, bound or
 * allocated. */
Server *serverStart(const ServerOptions *opt, Service *svc, NsaError *err);

/* The TCP port actually bound (useful with port 0), or 0 without TCP. */
int serverPort(const Server *srv);

/* Stops accepting, joins the HTTP threads (one per listener), ends the
 * streamed responses still open, stops libmicrohttpd (closing its
 * connections), closes the listeners, removes the socket file and frees
 * srv: it must not be used after. Not on an HTTP thread (it joins them).
 * Cannot fail; NULL is a no-op. */
void serverStop(Server *srv);

/* 1 when host (a numeric address or "localhost") is a loopback address. */
int serverIsLoopback(const char *host);

/* 1 when nsad refuses a decoded request path outright (400 bad_path): not
 * starting with '/', a ".." segment, a backslash, or a byte outside
 * printable ASCII. */
int serverPathIsBad(const char *path);

/* What the raw (undecoded) request URL holds that decoding would hide:
 * SERVER_RAW_OK, SERVER_RAW_BAD_PATH (%00 or a byte outside printable
 * ASCII before any '?': 400 bad_path) or SERVER_RAW_BAD_QUERY (the same in
 * the query string: 400 invalid_argument). */
int serverRawUrlProblem(const char *raw);
enum { SERVER_RAW_OK = 0, SERVER_RAW_BAD_PATH = 1, SERVER_RAW_BAD_QUERY = 2 };

#endif
