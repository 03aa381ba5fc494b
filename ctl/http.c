/* http.c - the libcurl side of nsactl (see http.h). One easy handle per
 * request: nsactl makes a handful of calls per invocation (watch makes one or
 * two a second), so connection reuse is not worth the state it would need. */
#include "http.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "paths.h"

/* The daemon's answers are small JSON documents; a runaway body (a proxy's
 * HTML page, a wrong port) is cut off rather than filling memory. */
#define HTTP_BODY_LIMIT ((size_t)64 << 20)

int httpGlobalInit(void) {
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void httpGlobalCleanup(void) {
    curl_global_cleanup();
}

int httpReadTokenFile(const char *path, char *token, size_t cap, char *err, size_t errcap) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errcap, "token file %s: %s", path, strerror(errno));
        return -1;
    }
    char line[HTTP_TOKEN_MAX * 2];
    int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!got) {
        snprintf(err, errcap, "token file %s: empty", path);
        return -1;
    }
    char *start = line;
    while (*start && isspace((unsigned char)*start)) start++;
    size_t n = strlen(start);
    while (n > 0 && isspace((unsigned char)start[n - 1])) n--;
    if (n == 0) {
        snprintf(err, errcap, "token file %s: empty", path);
        return -1;
    }
    if (n >= cap) {
        snprintf(err, errcap, "token file %s: token longer than %zu bytes", path, cap - 1);
        return -1;
    }
    memcpy(token, start, n);
    token[n] = '\0';
    return 0;
}

int httpTargetUrl(HttpTarget *t, const char *url, char *err, size_t errcap) {
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
        snprintf(err, errcap, "--url: '%s' is not a URL; allowed: http://HOST:PORT", url);
        return -1;
    }
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/') n--;
    if (n >= sizeof t->base_url) {
        snprintf(err, errcap, "--url: longer than %zu bytes", sizeof t->base_url - 1);
        return -1;
    }
    memcpy(t->base_url, url, n);
    t->base_url[n] = '\0';
    t->socket_path[0] = '\0';
    return 0;
}

int httpTargetSocket(HttpTarget *t, const char *path, char *err, size_t errcap) {
    struct sockaddr_un sa;
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errcap, "--socket: '%s' is longer than a socket path may be (%zu bytes)",
                 path, sizeof sa.sun_path - 1);
        return -1;
    }
    snprintf(t->socket_path, sizeof t->socket_path, "%s", path);
    snprintf(t->base_url, sizeof t->base_url, "http://localhost");
    return 0;
}

static int isSocket(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

void httpDefaultSocket(char *buf, size_t cap) {
    char mine[HTTP_ADDR_MAX];
    int have_mine = pathsSocket(mine, sizeof mine) == 0;
    if (have_mine && isSocket(mine))
        snprintf(buf, cap, "%s", mine);
    else if (isSocket(PATHS_SYSTEM_SOCKET) || !have_mine)
        snprintf(buf, cap, "%s", PATHS_SYSTEM_SOCKET);
    else
        snprintf(buf, cap, "%s", mine);
}

typedef struct BodyBuffer {
    char *data;
    size_t len, cap;
    int overflow;
} BodyBuffer;

static size_t collectBody(char *chunk, size_t size, size_t nmemb, void *userdata) {
    BodyBuffer *b = userdata;
    size_t n = size * nmemb;
    if (b->len + n + 1 > HTTP_BODY_LIMIT) {
        b->overflow = 1;
        return 0; /* tells curl to abort the transfer */
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) return 0;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, chunk, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

/* Says in words why the daemon could not be reached; curl's own strings
 * ("Couldn't connect to server") do not say where it tried. */
static void describeCurlError(const HttpTarget *t, CURLcode rc, long os_errno, const char *detail,
                              char *err, size_t errcap) {
    const char *where = t->socket_path[0] ? t->socket_path : t->base_url;
    const char *kind = t->socket_path[0] ? "socket" : "url";
    if (rc == CURLE_OPERATION_TIMEDOUT) {
        snprintf(err, errcap, "no answer from nsad at %s %s within %.1f s", kind, where,
                 (double)t->timeout_ms / 1000.0);
    } else if (t->socket_path[0] && rc == CURLE_COULDNT_CONNECT && os_errno) {
        /* curl's text names "localhost port 80", which is not where it went. */
        snprintf(err, errcap, "cannot reach nsad at socket %s: %s (is `nsad serve` running?)", where,
                 strerror(os_errno));
    } else if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST) {
        snprintf(err, errcap, "cannot reach nsad at %s %s: %s (is `nsad serve` running?)", kind,
                 where, detail[0] ? detail : curl_easy_strerror(rc));
    } else {
        snprintf(err, errcap, "request to nsad at %s %s failed: %s", kind, where,
                 detail[0] ? detail : curl_easy_strerror(rc));
    }
}

/* The headers nsad wants: Accept, the bearer token when there is one, the
 * body's Content-Type (default JSON) when has_body, and an empty Expect.
 * Returns the list (the caller frees it with curl_slist_free_all), or NULL
 * when out of memory, with nothing left to free. */
static struct curl_slist *requestHeaders(const HttpTarget *t, int has_body,
                                         const char *content_type) {
    char auth[HTTP_TOKEN_MAX + 32], ctype[128];
    const char *lines[4];
    int n = 0;
    lines[n++] = "Accept: application/json";
    if (t->token[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", t->token);
        lines[n++] = auth;
    }
    if (has_body) {
        snprintf(ctype, sizeof ctype, "Content-Type: %s",
                 content_type ? content_type : "application/json");
        lines[n++] = ctype;
    }
    /* curl adds "Expect: 100-continue" to large POSTs; the daemon answers
     * straight away, so the extra round trip only costs a second's wait. */
    lines[n++] = "Expect:";
    struct curl_slist *list = NULL;
    for (int i = 0; i < n; i++) {
        /* NULL when out of memory, the list kept: free it, not lose it */
        struct curl_slist *grown = curl_slist_append(list, lines[i]);
        if (!grown) {
            curl_slist_free_all(list);
            return NULL;
        }
        list = grown;
    }
    return list;
}

/* A curl handle for METHOD base_url+path with the headers nsad wants and
 * body (may be NULL); *headers and *url are for the caller to free. NULL
 * when out of memory, with nothing left to free (*headers and *url NULL). */
static CURL *newRequest(const HttpTarget *t, const char *method, const char *path,
                        const char *body, size_t body_len, const char *content_type,
                        struct curl_slist **headers, char **url, char *detail) {
    size_t url_len = strlen(t->base_url) + strlen(path) + 1;
    *url = malloc(url_len);
    *headers = requestHeaders(t, body != NULL, content_type);
    CURL *curl = curl_easy_init();
    if (!*url || !*headers || !curl) {
        free(*url);
        *url = NULL;
        curl_slist_free_all(*headers);
        *headers = NULL;
        if (curl) curl_easy_cleanup(curl);
        return NULL;
    }
    snprintf(*url, url_len, "%s%s", t->base_url, path);
    curl_easy_setopt(curl, CURLOPT_URL, *url);
    if (t->socket_path[0]) curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, t->socket_path);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    } else if (!strcmp(method, "POST")) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, *headers);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, detail);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "nsactl");
    /* A proxy from the environment would see the bearer token and cannot
     * reach a loopback daemon anyway. */
    curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
    return curl;
}

/* After curl_easy_perform: the status and body into res (0), or err (-1). */
static int finishRequest(const HttpTarget *t, CURL *curl, CURLcode rc, BodyBuffer *buf,
                         const char *detail, HttpResponse *res, char *err, size_t errcap) {
    if (rc != CURLE_OK) {
        if (buf->overflow)
            snprintf(err, errcap, "answer from nsad larger than %zu bytes; is --url pointing at nsad?",
                     HTTP_BODY_LIMIT);
        else {
            long os_errno = 0;
            curl_easy_getinfo(curl, CURLINFO_OS_ERRNO, &os_errno);
            describeCurlError(t, rc, os_errno, detail, err, errcap);
        }
        free(buf->data);
        return -1;
    }
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &res->status);
    if (!buf->data) {
        buf->data = calloc(1, 1);
        if (!buf->data) {
            snprintf(err, errcap, "out of memory reading the answer");
            return -1;
        }
    }
    res->body = buf->data;
    res->len = buf->len;
    return 0;
}

int httpRequest(const HttpTarget *t, const char *method, const char *path,
                const char *body, size_t body_len, const char *content_type,
                HttpResponse *res, char *err, size_t errcap) {
    memset(res, 0, sizeof *res);
    struct curl_slist *headers;
    char *url;
    char detail[CURL_ERROR_SIZE] = "";
    CURL *curl = newRequest(t, method, path, body, body_len, content_type, &headers, &url, detail);
    if (!curl) {
        snprintf(err, errcap, "out of memory preparing the request");
        return -1;
    }
    BodyBuffer buf = {0};
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collectBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &buf);
    if (t->timeout_ms > 0) curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, t->timeout_ms);
    CURLcode rc = curl_easy_perform(curl);
    int ret = finishRequest(t, curl, rc, &buf, detail, res, err, errcap);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    free(url);
    return ret;
}

/* ---- streamed answers ---------------------------------------------------- */

typedef struct LineStream {
    CURL *curl;
    BodyBuffer buf;     /* a 2xx answer: the partial last line; else the whole body */
    HttpLineFn on_line;
    void *ctx;
    int stopped;        /* on_line asked to stop */
} LineStream;

static size_t collectLines(char *chunk, size_t size, size_t nmemb, void *userdata) {
    LineStream *ls = userdata;
    const size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(ls->curl, CURLINFO_RESPONSE_CODE, &status);
    if (collectBody(chunk, size, nmemb, &ls->buf) != n) return 0;
    if (status < 200 || status >= 300) return n;
    size_t start = 0;
    for (size_t i = 0; i < ls->buf.len; i++) {
        if (ls->buf.data[i] != '\n') continue;
        if (i > start && ls->on_line(ls->ctx, ls->buf.data + start, i - start)) {
            ls->stopped = 1;
            return 0;
        }
        start = i + 1;
    }
    memmove(ls->buf.data, ls->buf.data + start, ls->buf.len - start);
    ls->buf.len -= start;
    ls->buf.data[ls->buf.len] = '\0';
    return n;
}

int httpStream(const HttpTarget *t, const char *method, const char *path, const char *body,
               size_t body_len, HttpLineFn on_line, void *ctx, HttpResponse *res, char *err,
               size_t errcap) {
    memset(res, 0, sizeof *res);
    struct curl_slist *headers;
    char *url;
    char detail[CURL_ERROR_SIZE] = "";
    LineStream ls = {.on_line = on_line, .ctx = ctx};
    ls.curl = newRequest(t, method, path, body, body_len, "application/json", &headers, &url, detail);
    if (!ls.curl) {
        snprintf(err, errcap, "out of memory preparing the request");
        return -1;
    }
    curl_easy_setopt(ls.curl, CURLOPT_WRITEFUNCTION, collectLines);
    curl_easy_setopt(ls.curl, CURLOPT_WRITEDATA, &ls);
    CURLcode rc = curl_easy_perform(ls.curl);
    if (ls.stopped) rc = CURLE_OK;   /* stopping is the caller's choice, not a failure */
    int ret = finishRequest(t, ls.curl, rc, &ls.buf, detail, res, err, errcap);
    /* a last line without its newline */
    if (ret == 0 && !ls.stopped && res->status >= 200 && res->status < 300 && res->len)
        on_line(ctx, res->body, res->len);
    curl_slist_free_all(headers);
    curl_easy_cleanup(ls.curl);
    free(url);
    return ret;
}

/* ---- downloads ---------------------------------------------------------- */

typedef struct Download {
    CURL *curl;
    int fd;
    BodyBuffer error_body; /* a non-2xx answer */
    uint64_t written;
    int write_errno;       /* a write to fd failed */
    HttpProgressFn progress;
    void *ctx;
} Download;

static size_t downloadChunk(char *chunk, size_t size, size_t nmemb, void *userdata) {
    Download *dl = userdata;
    const size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(dl->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status < 200 || status >= 300) return collectBody(chunk, size, nmemb, &dl->error_body);
    for (size_t done = 0; done < n;) {
        const ssize_t w = write(dl->fd, chunk + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            dl->write_errno = w < 0 ? errno : EIO;
            return 0;
        }
        done += (size_t)w;
    }
    dl->written += n;
    if (dl->progress) dl->progress(dl->ctx, dl->written);
    return n;
}

int httpDownload(const HttpTarget *t, const char *path, int fd, HttpProgressFn progress,
                 void *ctx, HttpResponse *res, char *err, size_t errcap) {
    memset(res, 0, sizeof *res);
    struct curl_slist *headers;
    char *url;
    char detail[CURL_ERROR_SIZE] = "";
    Download dl = {.fd = fd, .progress = progress, .ctx = ctx};
    dl.curl = newRequest(t, "GET", path, NULL, 0, NULL, &headers, &url, detail);
    if (!dl.curl) {
        snprintf(err, errcap, "out of memory preparing the request");
        return -1;
    }
    curl_easy_setopt(dl.curl, CURLOPT_WRITEFUNCTION, downloadChunk);
    curl_easy_setopt(dl.curl, CURLOPT_WRITEDATA, &dl);
    const CURLcode rc = curl_easy_perform(dl.curl);
    int ret;
    if (dl.write_errno) {
        snprintf(err, errcap, "writing the download: %s", strerror(dl.write_errno));
        free(dl.error_body.data);
        ret = -2;
    } else {
        ret = finishRequest(t, dl.curl, rc, &dl.error_body, detail, res, err, errcap);
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(dl.curl);
    free(url);
    return ret;
}

void httpResponseFree(HttpResponse *res) {
    if (!res) return;
    free(res->body);
    res->body = NULL;
    res->len = 0;
}

int httpEscape(const char *s, char *out, size_t cap) {
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~';
        size_t need = plain ? 1 : 3;
        if (o + need + 1 > cap) return -1;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    if (o + 1 > cap) return -1;
    out[o] = '\0';
    return 0;
}
