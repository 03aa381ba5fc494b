/* api_use.c - the routes that use a trained checkpoint (proto/api.md):
 *   POST /api/v1/sample   text (or token ids) generated from a prompt, streamed
 *   POST /api/v1/eval     held-out loss on a data file, with progress
 *   POST /api/v1/export   the weights as an export to download
 *   GET  /api/v1/exports/NAME/FILE   one file of such an export
 * The POSTs take {"run": ID} (its latest checkpoint) or {"checkpoint": DIR},
 * check every field here (400 naming it), queue a job on the inference
 * worker (daemon/infer.c; 503 busy when INFER_QUEUE_MAX wait) and answer 200
 * with a stream of JSON lines (application/x-ndjson) that the worker
 * writes. */
#include "api.h"
#include "api_use.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "checkpoint.h"
#include "infer.h"
#include "scheduler.h"

/* The body as a JSON object whose fields are all in `allowed` (a
 * comma-separated list); NULL after answering 400 otherwise. */
static cJSON *parseBody(const ApiRequest *req, ApiResponse *res, const char *allowed) {
    if (!req->body_len) {
        apiError(res, 400, "invalid_argument", "the body is empty; send a JSON object");
        return NULL;
    }
    cJSON *o = cJSON_ParseWithLength(req->body, req->body_len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        apiError(res, 400, "invalid_json", "the body must be a JSON object");
        return NULL;
    }
    for (const cJSON *f = o->child; f; f = f->next) {
        const size_t n = strlen(f->string);
        int known = 0;
        for (const char *p = allowed; *p && !known;) {
            const char *end = strchr(p, ',');
            const size_t len = end ? (size_t)(end - p) : strlen(p);
            known = len == n && !strncmp(p, f->string, n);
            p += len + (end ? 1 : 0);
        }
        if (!known) {
            apiError(res, 400, "invalid_argument", "unknown field '%.60s'; allowed: %s", f->string,
                     allowed);
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

/* An optional number field in [lo, hi] (whole when integral); 0 after a
 * 400 answer, 1 when absent or set into *out. */
static int numberField(const cJSON *o, const char *key, double lo, double hi, int integral,
                       double *out, ApiResponse *res) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 1;
    const double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!cJSON_IsNumber(v) || !(x >= lo && x <= hi) || (integral && x != floor(x))) {
        apiError(res, 400, "invalid_argument", "%s: %s; allowed: a%s number from %g to %g", key,
                 cJSON_IsNumber(v) ? "out of range" : "not a number", integral ? " whole" : "", lo,
                 hi);
        return 0;
    }
    *out = x;
    return 1;
}

/* "run" or "checkpoint" into a checkpoint spec weightsOpen takes; 0 after
 * answering (400 both or neither, 404 unknown run or no checkpoint). */
static int checkpointField(Service *svc, const cJSON *o, char *spec, size_t cap, ApiResponse *res) {
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(o, "run");
    const cJSON *dir = cJSON_GetObjectItemCaseSensitive(o, "checkpoint");
    if (!!run == !!dir || (run && !cJSON_IsString(run)) || (dir && !cJSON_IsString(dir))) {
        apiError(res, 400, "invalid_argument",
                 "give one of run (a run id) or checkpoint (a checkpoint directory), as a string");
        return 0;
    }
    if (run) {
        pthread_mutex_lock(&svc->lock);
        const Run *r = runIdValid(run->valuestring) ? runsFind(svc->runs, run->valuestring) : NULL;
        if (r) snprintf(spec, cap, "%s", r->out_dir);
        pthread_mutex_unlock(&svc->lock);
        if (!r) {
            apiError(res, 404, "not_found", "no run '%.80s'", run->valuestring);
            return 0;
        }
    } else if (snprintf(spec, cap, "%s", dir->valuestring) >= (int)cap) {
        apiError(res, 400, "invalid_argument", "checkpoint: longer than %zu bytes", cap - 1);
        return 0;
    }
    char found[WEIGHTS_PATH_MAX];
    NsaError err = {{0}};
    const int rc = checkpointResolve(NULL, spec, found, sizeof found, &err);
    if (rc <= 0) {
        if (rc == 0) apiError(res, 404, "not_found", "%s has no checkpoint yet", spec);
        else apiError(res, 404, "not_found", "%s", err.message);
        return 0;
    }
    return 1;
}

static int deviceField(const cJSON *o, int *device, ApiResponse *res) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "device");
    *device = -1;
    if (!v) return 1;
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "cpu")) *device = NSA_DEVICE_CPU;
    else if (cJSON_IsString(v) && !strcmp(v->valuestring, "cuda")) *device = NSA_DEVICE_CUDA;
    else {
        apiError(res, 400, "invalid_argument", "device: allowed: \"cpu\" or \"cuda\"");
        return 0;
    }
    return 1;
}

/* A sample body's prompt_ids (v, present) into job->prompt_ids: 1 to
 * SAMPLE_MAX_PROMPT_IDS whole numbers from 0 to SAMPLE_MAX_TOKEN_ID (the
 * worker checks them against the model's vocabulary, which it reads). 1
 * when set (job owns the array), 0 after a 400 answer naming what is wrong
 * or a 500 when memory ran out. */
static int promptIdsField(const cJSON *v, InferJob *job, ApiResponse *res) {
    const int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 1 || n > SAMPLE_MAX_PROMPT_IDS) {
        char what[48];
        if (n < 0)
            snprintf(what, sizeof what, "not an array");
        else if (n == 0)
            snprintf(what, sizeof what, "empty");
        else
            snprintf(what, sizeof what, "%d ids, longer than a prompt may be", n);
        apiError(res, 400, "invalid_argument",
                 "prompt_ids: %s; allowed: an array of 1 to %d token ids, whole numbers from 0 "
                 "to %d",
                 what, SAMPLE_MAX_PROMPT_IDS, SAMPLE_MAX_TOKEN_ID);
        return 0;
    }
    job->prompt_ids = malloc((size_t)n * sizeof *job->prompt_ids);
    if (!job->prompt_ids) {
        apiError(res, 500, "internal", "out of memory");
        return 0;
    }
    int j = 0;
    for (const cJSON *e = v->child; e; e = e->next, j++) {
        const double x = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (x >= 0 && x <= SAMPLE_MAX_TOKEN_ID && x == floor(x)) {
            job->prompt_ids[j] = (int32_t)x;
            continue;
        }
        char *shown = cJSON_PrintUnformatted(e);
        apiError(res, 400, "invalid_argument",
                 "prompt_ids[%d]: %.40s%s is %s; allowed: a whole number from 0 to %d (a token id "
                 "of the model's vocabulary)",
                 j, shown ? shown : "?", shown && strlen(shown) > 40 ? "..." : "",
                 !cJSON_IsNumber(e) ? "not a number"
                 : x != floor(x)    ? "not a whole number"
                                    : "out of range",
                 SAMPLE_MAX_TOKEN_ID);
        free(shown);
        inferJobRelease(job);
        return 0;
    }
    job->n_prompt_ids = n;
    return 1;
}

/* Queues job and answers with its stream. */
static void answerStream(Service *svc, InferJob *job, ApiResponse *res) {
    if (!svc->infer) {
        inferJobRelease(job);
        apiError(res, 503, "unavailable", "this nsad has no inference worker");
        return;
    }
    job->gpu = schedulerPickGpu(svc);
    NsaError err = {{0}};
    Stream *s = inferSubmit(svc->infer, job, &err);
    if (!s) {
        apiError(res, 503, "busy", "%s", err.message);
        res->retry_after = 5;
        return;
    }
    apiRespondStream(res, s);
}

void apiUseSample(Service *svc, const ApiRequest *req, ApiResponse *res) {
    cJSON *o = parseBody(req, res,
                         "run,checkpoint,prompt,prompt_ids,n,max_tokens,temperature,"
                         "top_k,top_p,seed,stop,device");
    if (!o) return;
    InferJob job = {.kind = INFER_SAMPLE};
    sampleDefaults(&job.sample);
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "prompt_ids");
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(o, "stop");
    double max_tokens = job.sample.max_tokens, top_k = 0, seed = (double)job.sample.seed, n = 1;
    int ok = checkpointField(svc, o, job.checkpoint, sizeof job.checkpoint, res) &&
             deviceField(o, &job.device, res);
    if (ok && !!prompt == !!ids) {
        apiError(res, 400, "invalid_argument",
                 prompt ? "prompt and prompt_ids: give one of the two, not both"
                        : "prompt (text) or prompt_ids (an array of token ids) is required");
        ok = 0;
    } else if (ok && ids) {
        ok = promptIdsField(ids, &job, res);
    } else if (ok && (!cJSON_IsString(prompt) || !prompt->valuestring[0] ||
                      strlen(prompt->valuestring) > 65536)) {
        apiError(res, 400, "invalid_argument", "prompt: a string of 1 to 65536 bytes is required");
        ok = 0;
    }
    ok = ok && numberField(o, "n", 1, SAMPLE_MAX_PROMPTS, 1, &n, res) &&
         numberField(o, "max_tokens", 1, 100000, 1, &max_tokens, res) &&
         numberField(o, "temperature", 0, 1e6, 0, &job.sample.temperature, res) &&
         numberField(o, "top_k", 0, 1 << 24, 1, &top_k, res) &&
         numberField(o, "top_p", 1e-9, 1, 0, &job.sample.top_p, res) &&
         numberField(o, "seed", 0, 9007199254740992.0, 1, &seed, res);
    if (ok && stop) {
        const int n = cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : -1;
        ok = n >= 0 && n <= SAMPLE_MAX_STOPS;
        for (int i = 0; ok && i < n; i++) {
            const cJSON *s = cJSON_GetArrayItem(stop, i);
            ok = cJSON_IsString(s) && s->valuestring[0] && strlen(s->valuestring) <= SAMPLE_STOP_MAX;
            if (ok) snprintf(job.sample.stops[i], sizeof job.sample.stops[i], "%s", s->valuestring);
        }
        if (!ok) {
            apiError(res, 400, "invalid_argument",
                     "stop: an array of at most %d strings of 1 to %d bytes", SAMPLE_MAX_STOPS,
                     SAMPLE_STOP_MAX);
            ok = 0;
        } else if (n > 0 && ids) {
            apiError(res, 400, "invalid_argument",
                     "stop: stop strings with prompt_ids; allowed: none (stop strings need text: "
                     "give them with a text prompt)");
            ok = 0;
        }
        job.sample.n_stops = n;
    }
    job.n_samples = (int)n;
    job.sample.max_tokens = (int)max_tokens;
    job.sample.top_k = (int)top_k;
    job.sample.seed = (uint64_t)seed;
    if (ok && prompt && !(job.prompt = strdup(prompt->valuestring))) {
        apiError(res, 500, "internal", "out of memory");
        ok = 0;
    }
    if (ok)
        answerStream(svc, &job, res); /* which takes over the prompt */
    else
        inferJobRelease(&job);
    cJSON_Delete(o);
}

void apiUseEval(Service *svc, const ApiRequest *req, ApiResponse *res) {
    cJSON *o = parseBody(req, res, "run,checkpoint,data,seq_len,batch,max_tokens,device");
    if (!o) return;
    InferJob job = {.kind = INFER_EVAL};
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(o, "data");
    double seq_len = 0, batch = 0, max_tokens = 0;
    int ok = checkpointField(svc, o, job.checkpoint, sizeof job.checkpoint, res) &&
             deviceField(o, &job.device, res);
    if (ok && (!cJSON_IsString(data) || !data->valuestring[0] ||
               snprintf(job.data, sizeof job.data, "%s", data->valuestring) >= (int)sizeof job.data)) {
        apiError(res, 400, "invalid_argument",
                 "data: a path (a .txt, .jsonl or .bin file, or a directory) is required");
        ok = 0;
    }
    ok = ok && numberField(o, "seq_len", 1, 1 << 24, 1, &seq_len, res) &&
         numberField(o, "batch", 1, 4096, 1, &batch, res) &&
         numberField(o, "max_tokens", 1, 1e15, 1, &max_tokens, res);
    job.seq_len = (int)seq_len;
    job.batch = (int)batch;
    job.max_tokens = (int64_t)max_tokens;
    if (ok) answerStream(svc, &job, res);
    cJSON_Delete(o);
}

void apiUseExport(Service *svc, const ApiRequest *req, ApiResponse *res) {
    cJSON *o = parseBody(req, res, "run,checkpoint,dtype");
    if (!o) return;
    InferJob job = {.kind = INFER_EXPORT, .device = -1, .dtype = EXPORT_BF16};
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    int ok = checkpointField(svc, o, job.checkpoint, sizeof job.checkpoint, res);
    if (ok && dtype) {
        ExportDtype d;
        NsaError err;
        ok = cJSON_IsString(dtype) && exportDtypeParse(dtype->valuestring, &d, &err) == 0;
        if (ok) job.dtype = d;
        else apiError(res, 400, "invalid_argument", "dtype: allowed: \"bf16\" or \"f32\"");
    }
    snprintf(job.exports_dir, sizeof job.exports_dir, "%s", svc->exports_dir);
    if (ok) answerStream(svc, &job, res);
    cJSON_Delete(o);
}

void apiUseExportFile(Service *svc, const ApiRequest *req, ApiResponse *res, const char *rest) {
    const char *slash = strchr(rest, '/');
    char name[EXPORT_STORE_NAME_MAX];
    if (!slash || (size_t)(slash - rest) >= sizeof name) {
        apiError(res, 404, "not_found", "no such export file: %.120s; the form is "
                 "/api/v1/exports/NAME/FILE", rest);
        return;
    }
    snprintf(name, sizeof name, "%.*s", (int)(slash - rest), rest);
    int fd;
    uint64_t size;
    if (exportStoreOpen(svc->exports_dir, name, slash + 1, &fd, &size) != 0) {
        apiError(res, 404, "not_found", "no file %.80s in an export %.80s (POST /api/v1/export "
                 "makes one; files: model.safetensors, config.json, README.md)", slash + 1, name);
        return;
    }
    (void)req;
    res->status = 200;
    res->has_file = 1;
    res->file_fd = fd;
    res->file_size = size;
    res->content_type = !strcmp(slash + 1, "config.json") ? "application/json"
                        : !strcmp(slash + 1, "README.md") ? "text/markdown; charset=utf-8"
                                                          : "application/octet-stream";
}
