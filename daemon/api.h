/* api.h - the JSON/HTTP API's routes (proto/api.md is the contract): one
 * request in, one response out, with no HTTP library in sight, so the
 * routes can be tested by calling apiHandle directly. daemon/server.c does
 * the HTTP part (listeners, limits, auth, Host/Origin, static files). */
#ifndef NSAD_API_H
#define NSAD_API_H

#include <stddef.h>
#include <stdint.h>
#include "service.h"

#define API_MAX_QUERY 16

typedef struct ApiQueryParam {
    const char *key, *value; /* value may be NULL ("?flag") */
} ApiQueryParam;

typedef struct ApiRequest {
    const char *method; /* "GET", "POST", ... */
    const char *path;   /* decoded, without the query string */
    ApiQueryParam query[API_MAX_QUERY];
    int n_query;
    int query_overflow; /* more than API_MAX_QUERY parameters were sent */
    const char *body;   /* may be NULL when body_len is 0 */
    size_t body_len;
    const char *content_type; /* may be NULL */
} ApiRequest;

typedef struct ApiResponse {
    int status;
    char *body; /* malloc'd, owned by the response */
    size_t body_len;
    const char *content_type; /* static string */
    const char *allow;        /* the Allow header for 405, else NULL */
    char location[128];       /* "" or the Location header */
    int retry_after;          /* seconds, 0 = no header */
    int no_store;             /* Cache-Control: no-store */
    struct Stream *stream;    /* not NULL: the body is this stream (daemon/stream.h), read until
                                 its end; owned by the response (apiResponseFree releases it) */
    int has_file;             /* the body is file_size bytes read from file_fd, which the
                                 response owns (apiResponseFree closes it) */
    int file_fd;
    uint64_t file_size;
} ApiResponse;

/* 1 when path belongs to the API (/api/... or /metrics), 0 for the
 * dashboard's static files. */
int apiOwnsPath(const char *path);

/* 1 when the route needs no token on TCP (GET /api/v1/health). */
int apiIsPublic(const char *method, const char *path);

/* Answers one API request. Always fills res (an error is a response too);
 * res->body is malloc'd (the caller frees it, see apiResponseFree). Cannot
 * fail except for memory, where it answers 500 with a static body. */
void apiHandle(Service *svc, const ApiRequest *req, ApiResponse *res);

/* Fills res with {"error":{"code","message"}} and the status. */
void apiError(ApiResponse *res, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Answers 200 with a stream of JSON lines (application/x-ndjson, not
 * cached): res takes s over. Cannot fail. */
void apiRespondStream(ApiResponse *res, struct Stream *s);

/* Frees res->body and releases res->stream; res can be reused. */
void apiResponseFree(ApiResponse *res);

#endif
