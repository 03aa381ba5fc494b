/* http.h - nsactl's one way to talk to nsad: a blocking libcurl request over
 * the daemon's Unix socket (the default, no token needed) or over TCP
 * (--url, with a bearer token).
 *
 * Where the daemon is, in order:
 *   --url / NSAD_URL                      TCP, token from --token, --token-file,
 *                                         NSAD_TOKEN, NSAD_TOKEN_FILE or the
 *                                         state dir's token file
 *   --socket / NSAD_SOCKET                that Unix socket
 *   $XDG_RUNTIME_DIR/nsad/nsad.sock       when it exists (a user's nsad)
 *   /run/nsad/nsad.sock                   the systemd unit's socket */
#ifndef NSACTL_HTTP_H
#define NSACTL_HTTP_H

#include <stddef.h>
#include <stdint.h>

#define HTTP_ADDR_MAX 1024
#define HTTP_TOKEN_MAX 256
#define HTTP_ERR_MAX 512

typedef struct HttpTarget {
    char socket_path[HTTP_ADDR_MAX]; /* "" when talking TCP */
    char base_url[HTTP_ADDR_MAX];    /* "http://127.0.0.1:8470" (no trailing '/'),
                                        or "http://localhost" for the socket */
    char token[HTTP_TOKEN_MAX];      /* "" for none */
    long timeout_ms;                 /* whole request; 0 = no limit */
} HttpTarget;

typedef struct HttpResponse {
    long status;        /* HTTP status code */
    char *body;         /* NUL-terminated, malloc'd; never NULL after success */
    size_t len;         /* body bytes, without the NUL */
} HttpResponse;

/* Must be called once before any request and before other threads start.
 * Returns 0, or -1 when libcurl cannot initialise. */
int httpGlobalInit(void);
void httpGlobalCleanup(void);

/* Reads a token file: the first line, surrounding whitespace removed.
 * Returns 0, or -1 with err naming the file and the reason (missing,
 * unreadable, empty, too long). */
int httpReadTokenFile(const char *path, char *token, size_t cap, char *err, size_t errcap);

/* Points t at a TCP base URL ("http://host:port", a trailing '/' removed).
 * Returns 0, or -1 with err when the URL is not http://... or too long. */
int httpTargetUrl(HttpTarget *t, const char *url, char *err, size_t errcap);

/* Points t at a Unix socket. Returns 0, or -1 with err when the path is too
 * long for a socket address. */
int httpTargetSocket(HttpTarget *t, const char *path, char *err, size_t errcap);

/* The socket nsactl uses when nothing names one: the one `nsad serve` makes
 * by default for this user (daemon/paths.h: what `make run` starts) when
 * it exists, else the system service's /run/nsad/nsad.sock when that
 * exists, else the user's default (whose absence the error then names).
 * Writes into buf; cannot fail. */
void httpDefaultSocket(char *buf, size_t cap);

/* Sends METHOD base_url+path (path starts with '/'), with body (may be NULL)
 * of the given content type, and waits for the whole answer.
 * Returns 0 when the daemon answered (whatever the status; res filled, the
 * caller frees with httpResponseFree), or -1 when it could not be reached or
 * the exchange broke (err says why: connection refused, no such socket,
 * timeout, ...). */
int httpRequest(const HttpTarget *t, const char *method, const char *path,
                const char *body, size_t body_len, const char *content_type,
                HttpResponse *res, char *err, size_t errcap);

/* Like httpRequest (body JSON), but the answer is read as it comes: while
 * the status is 2xx each line of the body (without its newline; empty lines
 * skipped) goes to on_line as soon as it is complete, and on_line returns
 * non-zero to stop reading (a success). A non-2xx answer's body is collected
 * into res as httpRequest does; a 2xx one leaves res->body empty. There is
 * no whole-request timeout: a stream lasts as long as the daemon's job. */
typedef int (*HttpLineFn)(void *ctx, const char *line, size_t len);
int httpStream(const HttpTarget *t, const char *method, const char *path, const char *body,
               size_t body_len, HttpLineFn on_line, void *ctx, HttpResponse *res, char *err,
               size_t errcap);

/* GETs path and writes a 2xx answer's body to fd as it comes, calling
 * progress (when not NULL) with the bytes written so far; a non-2xx
 * answer's body is collected into res instead (nothing written to fd).
 * No whole-request timeout. Returns 0 when the daemon answered (res->status
 * says how; the caller frees res), -1 with err when it could not be reached
 * or the exchange broke, -2 with err when a write to fd failed. */
typedef void (*HttpProgressFn)(void *ctx, uint64_t bytes);
int httpDownload(const HttpTarget *t, const char *path, int fd, HttpProgressFn progress,
                 void *ctx, HttpResponse *res, char *err, size_t errcap);

/* Frees the body; res may be reused. NULL-safe. */
void httpResponseFree(HttpResponse *res);

/* Percent-encodes s for one URL path segment or query value into out.
 * Returns 0, or -1 when out is too small. */
int httpEscape(const char *s, char *out, size_t cap);

#endif
