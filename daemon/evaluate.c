/* evaluate.c - see evaluate.h. */
#include "evaluate.h"
#include "clockutil.h"
#include "data.h"
#include <cjson/cJSON.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int endsWith(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* 1 when the directory holds a .bin file. */
static int dirHasShards(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) found = endsWith(e->d_name, ".bin");
    closedir(d);
    return found;
}

void evalOptionsFromPath(EvalOptions *o, const char *path) {
    struct stat st;
    o->data_path = path;
    if (endsWith(path, ".bin"))
        o->shards = 1;
    else if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        o->shards = dirHasShards(path);
    else
        o->shards = 0;
}

int evalRun(const Weights *w, const EvalOptions *o, EvalProgress progress, void *ctx,
            EvalResult *out, NsaError *err) {
    const double t0 = clockMonotonicSeconds();
    memset(out, 0, sizeof *out);
    if (!o->data_path || !*o->data_path) return nsaErrorf(err, "eval: no data file given");
    if (!o->shards && !weightsTextTokenizer(w, err)) { /* no text form: shards only */
        char why[sizeof err->message];
        snprintf(why, sizeof why, "%s", err->message);
        return nsaErrorf(err,
                         "eval: %s is text, and %s; allowed: .bin token shards of the model's "
                         "vocabulary",
                         o->data_path, why);
    }
    JobConfig job = w->job;
    job.data.source = o->shards ? DATA_SHARDS : DATA_TEXT;
    if (snprintf(job.data.path, sizeof job.data.path, "%s", o->data_path) >= (int)sizeof job.data.path)
        return nsaErrorf(err, "eval: data path longer than %zu bytes", sizeof job.data.path - 1);
    snprintf(job.data.tokenizer, sizeof job.data.tokenizer, "%s", weightsTokenizer(w));
    job.data.prefetch = 0;
    job.data.val_fraction = 0;
    const int S = o->seq_len > 0 ? o->seq_len : job.train.seq_len;
    int B = o->batch > 0 ? o->batch : (job.train.batch_size < 4 ? job.train.batch_size : 4);
    if (S < 1 || B < 1 || S > (1 << 24) || B > 4096)
        return nsaErrorf(err, "eval: seq_len %d, batch %d; allowed: seq_len 1 to %d, batch 1 to 4096",
                         S, B, 1 << 24);
    job.train.seq_len = S;
    job.train.batch_size = B;

    DataLoader *dl = dataOpen(&job, SPLIT_ALL, err);
    if (!dl) return -1;
    const uint64_t n_tokens = dataNumTokens(dl);
    int64_t windows = (int64_t)((n_tokens - 1) / (uint64_t)S);
    if (o->max_tokens > 0 && windows > (o->max_tokens + S - 1) / S) windows = (o->max_tokens + S - 1) / S;

    NsaEngineOptions eo = {.device = o->device, .device_ordinal = o->gpu, .precision = o->precision, .max_batch = B,
                           .max_seq_len = S, .threads = o->threads};
    NsaModel *m = windows > 0 ? nsaModelCreate(&w->job.model, &eo, err) : NULL;
    int32_t *tokens = malloc((size_t)B * S * sizeof(int32_t));
    int32_t *targets = malloc((size_t)B * S * sizeof(int32_t));
    int rc = 0;
    if (windows <= 0)
        rc = nsaErrorf(err, "eval: %s has %llu tokens, fewer than one window of seq_len + 1 (%d)",
                       o->data_path, (unsigned long long)n_tokens, S + 1);
    else if (!m)
        rc = -1;
    else if (!tokens || !targets)
        rc = nsaErrorf(err, "eval: out of memory for a batch of %d x %d", B, S);
    else
        rc = weightsToModel(w, m, err);

    const int64_t total = windows * S;
    double sum = 0.0;
    int64_t done = 0;
    for (int64_t p = 0; rc == 0 && p * B < windows; p++) {
        if ((rc = dataBatch(dl, (uint64_t)p, tokens, targets, err))) break;
        /* rows past the last window wrapped around to the start: not scored */
        const int64_t rows = windows - p * B < B ? windows - p * B : B;
        for (int64_t r = rows; r < B; r++)
            for (int t = 0; t < S; t++) targets[r * S + t] = -1;
        double loss;
        if ((rc = nsaModelEvalLoss(m, tokens, targets, B, S, &loss, err))) break;
        sum += loss * (double)(rows * S);
        done += rows * S;
        if (progress && progress(ctx, done, total, sum / (double)done))
            rc = nsaErrorf(err, "eval: cancelled after %lld of %lld tokens", (long long)done,
                           (long long)total);
    }
    if (rc == 0) {
        out->loss = sum / (double)done;
        out->bytes_per_token = dataBytesPerToken(dl);
        out->bits_per_byte = out->bytes_per_token > 0 ? out->loss / log(2.0) / out->bytes_per_token : NAN;
        out->tokens = done;
        out->windows = windows;
        out->seq_len = S;
        out->batch = B;
        out->seconds = clockMonotonicSeconds() - t0;
    }
    free(tokens);
    free(targets);
    nsaModelFree(m);
    dataClose(dl);
    return rc;
}

void evalResultToJson(cJSON *o, const Weights *w, const char *data, const EvalResult *r) {
    cJSON_AddStringToObject(o, "checkpoint", w->dir);
    cJSON_AddNumberToObject(o, "step", (double)w->state.step);
    cJSON_AddStringToObject(o, "data", data);
    cJSON_AddNumberToObject(o, "loss", r->loss);
    if (isfinite(r->bits_per_byte)) cJSON_AddNumberToObject(o, "bits_per_byte", r->bits_per_byte);
    else cJSON_AddNullToObject(o, "bits_per_byte");
    cJSON_AddNumberToObject(o, "tokens", (double)r->tokens);
    cJSON_AddNumberToObject(o, "windows", (double)r->windows);
    cJSON_AddNumberToObject(o, "seq_len", r->seq_len);
    cJSON_AddNumberToObject(o, "batch", r->batch);
    cJSON_AddNumberToObject(o, "seconds", r->seconds);
}
