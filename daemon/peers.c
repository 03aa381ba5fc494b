/* peers.c - see peers.h. One libcurl easy handle per call: a job's
 * coordinator makes two calls per node at its start, nothing per step. */
#include "peers.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

typedef struct Body {
    char *data;
    size_t len;
} Body;

static size_t collect(char *ptr, size_t size, size_t n, void *ctx) {
    Body *b = ctx;
    const size_t add = size * n;
    if (b->len + add > (1u << 20)) return 0; /* an answer this large is not ours */
    char *grown = realloc(b->data, b->len + add + 1);
    if (!grown) return 0;
    b->data = grown;
    memcpy(b->data + b->len, ptr, add);
    b->len += add;
    b->data[b->len] = '\0';
    return add;
}

/* Appends line to *list. Returns 0, or -1 out of memory with *list as it
 * was (curl_slist_append returns NULL then: assigning that would lose the
 * list). The caller frees *list either way. */
static int appendHeader(struct curl_slist **list, const char *line) {
    struct curl_slist *grown = curl_slist_append(*list, line);
    if (!grown) return -1;
    *list = grown;
    return 0;
}

/* POSTs a JSON object to http://node/api/v1/join. Returns the parsed
 * answer of a 2xx reply (the caller deletes it), or NULL with err naming
 * the node and what went wrong (the daemon's own error message when it
 * answered one). local_ip (may be NULL) receives our address on that
 * connection. */
static cJSON *postJoin(const char *node, const char *token, cJSON *request, char *local_ip,
                       size_t cap, NsaError *err) {
    char host[CONFIG_NODE_MAX], url[CONFIG_NODE_MAX + 64], auth[300];
    int port;
    if (configParseNode(node, host, sizeof host, &port)) {
        nsaErrorf(err, "runtime.nodes: \"%s\" is not HOST:PORT", node);
        return NULL;
    }
    snprintf(url, sizeof url, "http://%s:%d/api/v1/join", host, port);
    char *text = cJSON_PrintUnformatted(request);
    CURL *curl = curl_easy_init();
    struct curl_slist *headers = NULL;
    Body body = {NULL, 0};
    cJSON *answer = NULL;
    if (!text || !curl) {
        nsaErrorf(err, "node %s: out of memory", node);
        goto out;
    }
    const int with_auth = token && token[0];
    if (with_auth) snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    if (appendHeader(&headers, "Content-Type: application/json") != 0 ||
        (with_auth && appendHeader(&headers, auth) != 0)) {
        nsaErrorf(err, "node %s: out of memory for the request's headers", node);
        goto out;
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 5L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
    CURLcode rc = curl_easy_perform(curl);
    if (rc != CURLE_OK) {
        nsaErrorf(err, "node %s: cannot reach its nsad: %s", node, curl_easy_strerror(rc));
        goto out;
    }
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    char *ip = NULL;
    if (local_ip && curl_easy_getinfo(curl, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip)
        snprintf(local_ip, cap, "%s", ip);
    cJSON *parsed = body.data ? cJSON_Parse(body.data) : NULL;
    if (status / 100 != 2) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(parsed, "error");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
        nsaErrorf(err, "node %s refused to join (HTTP %ld): %s", node, status,
                  cJSON_IsString(msg) ? msg->valuestring : "no message");
        cJSON_Delete(parsed);
        goto out;
    }
    if (!cJSON_IsObject(parsed)) {
        nsaErrorf(err, "node %s: its answer is not a JSON object", node);
        cJSON_Delete(parsed);
        goto out;
    }
    answer = parsed;
out:
    curl_slist_free_all(headers);
    if (curl) curl_easy_cleanup(curl);
    free(body.data);
    free(text);
    return answer;
}

int peerPrepare(const char *node, const char *token, const char *config_yaml, int *local,
                char *local_ip, size_t cap, NsaError *err) {
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "phase", "prepare");
    cJSON_AddStringToObject(req, "config", config_yaml);
    cJSON *ans = postJoin(node, token, req, local_ip, cap, err);
    cJSON_Delete(req);
    if (!ans) return -1;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(ans, "local");
    int ok = cJSON_IsNumber(n) && n->valuedouble >= 1 && n->valuedouble <= 4096;
    if (ok) *local = (int)n->valuedouble;
    cJSON_Delete(ans);
    return ok ? 0 : nsaErrorf(err, "node %s: its answer has no rank count", node);
}

void peerIdToHex(const NsaCommId *id, char *hex) {
    for (int i = 0; i < NSA_COMM_ID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", id->bytes[i]);
}

int peerIdFromHex(const char *hex, NsaCommId *id) {
    if (!hex || strlen(hex) != 2 * NSA_COMM_ID_BYTES) return -1;
    for (int i = 0; i < NSA_COMM_ID_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        id->bytes[i] = (unsigned char)v;
    }
    return 0;
}

int peerStart(const char *node, const char *token, const PeerStart *start, char *member_id,
              size_t cap, NsaError *err) {
    char hex[2 * NSA_COMM_ID_BYTES + 1];
    peerIdToHex(&start->comm_id, hex);
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "phase", "start");
    cJSON_AddStringToObject(req, "config", start->config_yaml);
    cJSON_AddStringToObject(req, "run_id", start->run_id);
    cJSON_AddNumberToObject(req, "first", start->first);
    cJSON_AddNumberToObject(req, "world", start->world);
    cJSON_AddStringToObject(req, "comm_id", hex);
    cJSON_AddBoolToObject(req, "resume", start->resume);
    cJSON *ans = postJoin(node, token, req, NULL, 0, err);
    cJSON_Delete(req);
    if (!ans) return -1;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(ans, "id");
    int ok = cJSON_IsString(id);
    if (ok) snprintf(member_id, cap, "%s", id->valuestring);
    cJSON_Delete(ans);
    return ok ? 0 : nsaErrorf(err, "node %s: its answer has no run id", node);
}
