/* api.c - one request to nsad and the meaning of its answer (see ctl.h). */
#include "ctl.h"
#include "paths.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The one mapping from a non-2xx HTTP status to nsactl's exit code (ctl.h,
 * docs/NSACTL.md "Exit codes"): 404 CTL_EXIT_NOT_FOUND, 409
 * CTL_EXIT_CONFLICT, 400 bad_request_exit, anything else CTL_EXIT_ERROR.
 * A bad_request_exit of CTL_EXIT_CONFIG (start's config body) applies only
 * to the daemon's verdict on the config (code invalid_config or
 * invalid_json); any other 400, such as a bad --name, is CTL_EXIT_ERROR.
 * code may be NULL (no error document). Cannot fail. */
static int exitCodeFor(long status, const char *code, int bad_request_exit) {
    if (status == 404) return CTL_EXIT_NOT_FOUND;
    if (status == 409) return CTL_EXIT_CONFLICT;
    if (status != 400) return CTL_EXIT_ERROR;
    if (bad_request_exit != CTL_EXIT_CONFIG) return bad_request_exit;
    const int config_rejected =
        code && (!strcmp(code, "invalid_config") || !strcmp(code, "invalid_json"));
    return config_rejected ? CTL_EXIT_CONFIG : CTL_EXIT_ERROR;
}

/* Adds what the user can do about a refused token; the daemon's own message
 * cannot know where nsactl looked. */
static void authHint(const Ctl *ctl, long status, char *hint, size_t cap) {
    hint[0] = '\0';
    if (status != 401) return;
    if (ctl->token_source[0])
        snprintf(hint, cap, "; the token from %s was refused", ctl->token_source);
    else
        snprintf(hint, cap, "; no token found: pass --token-file STATE_DIR/token or use the Unix socket");
}

/* Describes a non-2xx answer to METHOD path in msg (what nsactl prints
 * after "nsactl: ") and returns its exit code (exitCodeFor). doc is the
 * parsed body, or NULL: the daemon's error document is
 * {"error":{"code","message"}}; anything else (an HTML page from some other
 * server, an empty body) is described by its status alone. A 401 adds where
 * the token came from (authHint). Cannot fail. */
static int describeRefusal(const Ctl *ctl, const char *method, const char *path, long status,
                           const cJSON *doc, int bad_request_exit, char *msg, size_t msgcap) {
    const cJSON *error = doc ? cJSON_GetObjectItemCaseSensitive(doc, "error") : NULL;
    const char *code = ctlString(error, "code", NULL);
    const char *message = ctlString(error, "message", NULL);
    char hint[HTTP_ADDR_MAX + 64];
    authHint(ctl, status, hint, sizeof hint);
    if (code && message)
        snprintf(msg, msgcap, "%s (%s, HTTP %ld)%s", message, code, status, hint);
    else
        snprintf(msg, msgcap, "%s %s: HTTP %ld without an nsad error document; is this nsad?%s",
                 method, path, status, hint);
    return exitCodeFor(status, code, bad_request_exit);
}

int ctlCallQuiet(const Ctl *ctl, const char *method, const char *path, const char *body,
                 size_t body_len, const char *content_type, int config_body, CtlReply *reply,
                 char *msg, size_t msgcap) {
    memset(reply, 0, sizeof *reply);
    char err[HTTP_ERR_MAX];
    if (httpRequest(&ctl->target, method, path, body, body_len, content_type, &reply->http, err,
                    sizeof err) != 0) {
        snprintf(msg, msgcap, "%s", err);
        return CTL_EXIT_UNREACHABLE;
    }
    long status = reply->http.status;
    reply->json = reply->http.len ? cJSON_ParseWithLength(reply->http.body, reply->http.len) : NULL;
    if (status >= 200 && status < 300) {
        if (!reply->json) {
            snprintf(msg, msgcap, "%s %s: HTTP %ld with a body that is not JSON; is this nsad?",
                     method, path, status);
            ctlReplyFree(reply);
            return CTL_EXIT_ERROR;
        }
        return CTL_OK;
    }
    int rc = describeRefusal(ctl, method, path, status, reply->json,
                             config_body ? CTL_EXIT_CONFIG : CTL_EXIT_ERROR, msg, msgcap);
    ctlReplyFree(reply);
    return rc;
}

int ctlCall(const Ctl *ctl, const char *method, const char *path, const char *body,
            size_t body_len, const char *content_type, int config_body, CtlReply *reply) {
    char msg[HTTP_ERR_MAX * 2];
    int rc = ctlCallQuiet(ctl, method, path, body, body_len, content_type, config_body, reply, msg,
                          sizeof msg);
    if (rc != CTL_OK) fprintf(stderr, "nsactl: %s\n", msg);
    return rc;
}

/* Prints a non-2xx answer to METHOD path as one line on stderr, as ctlCall
 * does. Returns its exit code (exitCodeFor). */
static int printRefusal(const Ctl *ctl, const char *method, const char *path,
                        const HttpResponse *res, int bad_request_exit) {
    cJSON *doc = res->len ? cJSON_ParseWithLength(res->body, res->len) : NULL;
    char msg[HTTP_ERR_MAX * 2];
    const int rc =
        describeRefusal(ctl, method, path, res->status, doc, bad_request_exit, msg, sizeof msg);
    fprintf(stderr, "nsactl: %s\n", msg);
    cJSON_Delete(doc);
    return rc;
}

int ctlStream(const Ctl *ctl, const char *method, const char *path, const char *body,
              size_t body_len, HttpLineFn on_line, void *ctx, int bad_request_exit) {
    HttpResponse res;
    char err[HTTP_ERR_MAX];
    if (httpStream(&ctl->target, method, path, body, body_len, on_line, ctx, &res, err, sizeof err) != 0) {
        fprintf(stderr, "nsactl: %s\n", err);
        return CTL_EXIT_UNREACHABLE;
    }
    const int rc = res.status >= 200 && res.status < 300
                       ? CTL_OK
                       : printRefusal(ctl, method, path, &res, bad_request_exit);
    httpResponseFree(&res);
    return rc;
}

int ctlDownload(const Ctl *ctl, const char *path, int fd, HttpProgressFn progress, void *ctx) {
    HttpResponse res;
    char err[HTTP_ERR_MAX];
    const int got = httpDownload(&ctl->target, path, fd, progress, ctx, &res, err, sizeof err);
    if (got != 0) {
        fprintf(stderr, "nsactl: %s\n", err);
        return got == -2 ? CTL_EXIT_ERROR : CTL_EXIT_UNREACHABLE;
    }
    const int rc = res.status >= 200 && res.status < 300
                       ? CTL_OK
                       : printRefusal(ctl, "GET", path, &res, CTL_EXIT_ERROR);
    httpResponseFree(&res);
    return rc;
}

void ctlReplyFree(CtlReply *reply) {
    if (!reply) return;
    cJSON_Delete(reply->json);
    reply->json = NULL;
    httpResponseFree(&reply->http);
}

void ctlPrintJson(const CtlReply *reply) {
    size_t n = reply->http.len;
    while (n > 0 && isspace((unsigned char)reply->http.body[n - 1])) n--;
    fwrite(reply->http.body, 1, n, stdout);
    fputc('\n', stdout);
}

int ctlHasNumber(const cJSON *obj, const char *key, double *out) {
    const cJSON *item = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!cJSON_IsNumber(item)) return 0;
    *out = item->valuedouble;
    return 1;
}

const char *ctlString(const cJSON *obj, const char *key, const char *fallback) {
    const cJSON *item = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    return cJSON_IsString(item) && item->valuestring ? item->valuestring : fallback;
}

int ctlCheckRunId(const char *id) {
    size_t n = strlen(id);
    int ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)id[i]) || id[i] == '_' || id[i] == '-';
    if (!ok) {
        fprintf(stderr, "nsactl: run id '%s' is not valid; allowed: 1-64 of A-Z a-z 0-9 _ - "
                        "(see nsactl list)\n", id);
        return -1;
    }
    return 0;
}

/* Takes token as the one to send, saying it came from source (--token,
 * NSAD_TOKEN). Returns 0, or prints why and returns -1 when it is too long. */
static int takeToken(Ctl *ctl, const char *token, const char *source) {
    if (strlen(token) >= sizeof ctl->target.token) {
        fprintf(stderr, "nsactl: %s: longer than %zu bytes\n", source, sizeof ctl->target.token - 1);
        return -1;
    }
    snprintf(ctl->target.token, sizeof ctl->target.token, "%s", token);
    snprintf(ctl->token_source, sizeof ctl->token_source, "%s", source);
    return 0;
}

int ctlResolveToken(Ctl *ctl, const char *token_arg, const char *token_file_arg) {
    char err[HTTP_ERR_MAX];
    const char *env_token = getenv("NSAD_TOKEN");
    const char *env_file = getenv("NSAD_TOKEN_FILE");
    HttpTarget *t = &ctl->target;
    ctl->token_source[0] = '\0';
    if (token_arg) return takeToken(ctl, token_arg, "--token");
    if (env_token && *env_token) return takeToken(ctl, env_token, "NSAD_TOKEN");
    const char *file = token_file_arg ? token_file_arg : (env_file && *env_file ? env_file : NULL);
    if (file) {
        if (httpReadTokenFile(file, t->token, sizeof t->token, err, sizeof err) != 0) {
            fprintf(stderr, "nsactl: %s\n", err);
            return -1;
        }
        snprintf(ctl->token_source, sizeof ctl->token_source, "%s", file);
        return 0;
    }
    /* The state dir's token is a convenience for root and the nsad user; for
     * anyone else it is unreadable, which is fine: the socket needs no token
     * and the daemon's 401 says what is missing. */
    char path[HTTP_ADDR_MAX];
    int n = snprintf(path, sizeof path, "%s/token", ctl->state_dir);
    if (ctl->state_dir_default && access(path, R_OK) != 0)
        n = snprintf(path, sizeof path, "%s/token", PATHS_SYSTEM_STATE_DIR);
    if (n > 0 && (size_t)n < sizeof path && access(path, R_OK) == 0) {
        if (httpReadTokenFile(path, t->token, sizeof t->token, err, sizeof err) != 0) {
            fprintf(stderr, "nsactl: %s\n", err);
            return -1;
        }
        snprintf(ctl->token_source, sizeof ctl->token_source, "%s", path);
    }
    return 0;
}
