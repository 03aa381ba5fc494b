/* trainsamples.c - see trainsamples.h. */
#include "trainsamples.h"
#include "fsutil.h"
#include "sampler.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const kPrompts[] = {"The ", "Once upon a time", "Q: What is the answer?\nA:"};
#define N_PROMPTS ((int)(sizeof kPrompts / sizeof kPrompts[0]))

struct TrainSamples {
    const Tokenizer *tok;
    NsaDecoder *dec;
    SampleOptions opt;
    char text[N_PROMPTS][TRAIN_SAMPLE_TOKENS * 4 + 1];
    size_t len[N_PROMPTS];
};

TrainSamples *trainSamplesCreate(const JobConfig *job, const char **why, NsaError *err) {
    *why = NULL;
    if (err) err->message[0] = '\0';
    const Tokenizer *tok = tokenizerFind(job->data.tokenizer);
    if (job->data.source != DATA_TEXT || !tok || strcmp(tok->name, "byte") != 0) {
        *why = "the data is not text through the byte tokenizer";
        return NULL;
    }
    TrainSamples *ts = calloc(1, sizeof *ts);
    if (!ts) {
        nsaErrorf(err, "samples: out of memory");
        return NULL;
    }
    ts->tok = tok;
    sampleDefaults(&ts->opt);
    ts->opt.max_tokens = TRAIN_SAMPLE_TOKENS;
    ts->opt.seed = job->train.seed;
    size_t longest = 0;
    for (int i = 0; i < N_PROMPTS; i++)
        if (strlen(kPrompts[i]) > longest) longest = strlen(kPrompts[i]);
    NsaDecoderOptions o = {.device = job->runtime.device,
                           .device_ordinal = 0,
                           .precision = job->runtime.device == NSA_DEVICE_CUDA ? NSA_PREC_BF16
                                                                              : NSA_PREC_F32,
                           .max_batch = N_PROMPTS,
                           .max_context = (int)longest + TRAIN_SAMPLE_TOKENS};
    ts->dec = nsaDecoderCreate(&job->model, &o, err);
    if (!ts->dec) {
        free(ts);
        return NULL;
    }
    return ts;
}

void trainSamplesFree(TrainSamples *ts) {
    if (!ts) return;
    nsaDecoderFree(ts->dec);
    free(ts);
}

static int collect(void *ctx, int prompt, const char *bytes, size_t len) {
    TrainSamples *ts = ctx;
    if (ts->len[prompt] + len < sizeof ts->text[prompt]) {
        memcpy(ts->text[prompt] + ts->len[prompt], bytes, len);
        ts->len[prompt] += len;
    }
    return 0;
}

int trainSamplesRun(TrainSamples *ts, NsaModel *m, int64_t step, char **detail, NsaError *err) {
    *detail = NULL;
    if (nsaDecoderLoadModel(ts->dec, m, err)) return -1;
    memset(ts->len, 0, sizeof ts->len);
    SampleResult res;
    if (sampleGenerate(ts->dec, ts->tok, kPrompts, N_PROMPTS, &ts->opt, collect, ts, &res, err))
        return -1;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "step", (double)step);
    cJSON *list = cJSON_AddArrayToObject(d, "samples");
    int ok = d && list;
    for (int i = 0; ok && i < N_PROMPTS; i++) {
        char *clean = sampleUtf8Clean(ts->text[i], ts->len[i]);
        cJSON *s = cJSON_CreateObject();
        ok = clean && s;
        if (ok) {
            cJSON_AddStringToObject(s, "prompt", kPrompts[i]);
            cJSON_AddStringToObject(s, "text", clean);
            cJSON_AddItemToArray(list, s);
        } else {
            cJSON_Delete(s);
        }
        free(clean);
    }
    *detail = ok ? cJSON_PrintUnformatted(d) : NULL;
    cJSON_Delete(d);
    if (!*detail) return nsaErrorf(err, "samples: out of memory");
    return 0;
}

int trainSamplesAppend(const char *out_dir, const char *detail, double ts, NsaError *err) {
    char path[4096];
    if (fsPathf(err, path, sizeof path, "%s/samples.jsonl", out_dir)) return -1;
    /* {"ts":..., then the detail's members: none for "" and "{}" */
    const char *members = "}";
    if (detail && detail[0]) {
        if (detail[0] != '{')
            return nsaErrorf(err, "%s: the sample detail is not a JSON object", path);
        members = detail + 1 + strspn(detail + 1, " \t\r\n");
    }
    const char *comma = members[0] == '}' ? "" : ",";
    const size_t cap = strlen(members) + 64;
    char *line = malloc(cap);
    if (!line) return nsaErrorf(err, "%s: out of memory", path);
    const int len = snprintf(line, cap, "{\"ts\":%.3f%s%s\n", ts, comma, members);
    if (len < 0 || (size_t)len >= cap) {
        free(line);
        return nsaErrorf(err, "%s: the timestamp %g does not fit a line", path, ts);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int rc = 0;
    if (fd < 0 || fsWriteAll(fd, line, (size_t)len) != 0)
        rc = nsaErrorf(err, "%s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    free(line);
    return rc;
}
