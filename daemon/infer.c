/* infer.c - see infer.h. Lines a job writes (proto/api.md):
 *   sample: {"event":"start",...} then {"text":"..."} as tokens come (whole
 *           UTF-8 characters; a byte that is not becomes U+FFFD; with "sample"
 *           naming the continuation when the job asked for several), or for
 *           a prompt of token ids {"ids":[ID]} per token, then
 *           {"event":"done","tokens","stop","samples","seconds","tokens_per_s"}
 *   eval:   {"event":"start",...}, {"event":"progress","done","total","loss"}
 *           at most twice a second, then {"event":"result",...}
 *   either: {"event":"error","message"} ends a job that failed. */
#include "infer.h"
#include "clockutil.h"
#include "log.h"
#include "stackdump.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct Queued {
    InferJob job;
    Stream *stream;
    struct Queued *next;
} Queued;

/* The checkpoint and decoder of the last sample job, kept for the next one
 * (infer.h). Only the worker thread touches it. */
typedef struct Kept {
    int live;           /* w is open (d may still be NULL) */
    Weights w;
    NsaDecoder *d;
    NsaDevice dev;
    int gpu, slots, context;
    struct stat file;   /* model.safetensors when opened: a new checkpoint there is another file */
    double last_used;   /* clockMonotonicSeconds() at the end of its last job */
} Kept;

struct Infer {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    Queued *head, *tail;
    int waiting, stop;
    double keep_s;            /* how long the kept model outlives its last job */
    uint64_t release_gpus;    /* GPUs runs claimed since the worker last looked (lock) */
    Kept kept;
    pthread_t thread;
};

/* Writes o as one line and frees it. Returns -1 when the reader is gone. */
static int writeLine(Stream *s, cJSON *o) {
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) return -1;
    size_t n = strlen(text);
    text[n] = '\n';   /* over the NUL: written by length */
    int rc = streamWrite(s, text, n + 1);
    free(text);
    return rc;
}

static void writeError(Stream *s, const char *message) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "error");
    cJSON_AddStringToObject(o, "message", message);
    writeLine(s, o);
}

static NsaDevice pickDevice(int asked) {
    if (asked >= 0) return (NsaDevice)asked;
    NsaDeviceInfo info;
    NsaError err;
    return nsaDeviceProbe(&info, &err) == 0 && info.cuda_built && info.cuda_devices > 0
               ? NSA_DEVICE_CUDA
               : NSA_DEVICE_CPU;
}

static int cpuThreads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

static cJSON *startLine(const Weights *w, NsaDevice dev, int gpu) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "start");
    cJSON_AddStringToObject(o, "checkpoint", w->dir);
    cJSON_AddNumberToObject(o, "step", (double)w->state.step);
    cJSON_AddStringToObject(o, "device", dev == NSA_DEVICE_CUDA ? "cuda" : "cpu");
    if (dev == NSA_DEVICE_CUDA) cJSON_AddNumberToObject(o, "gpu", gpu);
    else cJSON_AddNullToObject(o, "gpu");
    return o;
}

/* ---- the kept model ------------------------------------------------------------------ */

static void keptDrop(Kept *k, const char *why) {
    if (!k->live) return;
    if (k->d) logInfo("sample model %s released: %s", k->w.dir, why);
    nsaDecoderFree(k->d);
    weightsClose(&k->w);
    memset(k, 0, sizeof *k);
}

/* model.safetensors of the checkpoint spec names, resolved as weightsOpen
 * does; 0 with its directory and stat, -1 when it does not resolve (the
 * job then opens it afresh, and weightsOpen says what is wrong). */
static int keptIdentity(const char *spec, char *dir, size_t cap, struct stat *sb) {
    NsaError err;
    char path[WEIGHTS_PATH_MAX + 32];
    if (checkpointResolve(NULL, spec, dir, cap, &err) != 1 ||
        snprintf(path, sizeof path, "%s/model.safetensors", dir) >= (int)sizeof path)
        return -1;
    return stat(path, sb);
}

static int sameFile(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Rows of context a decoder is built for: needed rounded up to a multiple
 * of 4096, so that jobs with other prompt lengths reuse it (a multiple of
 * 4096 stays within the CUDA decoder's limit of 4096 selection blocks
 * whenever needed does). */
static int keptContext(int needed) { return (needed + 4095) / 4096 * 4096; }

/* Makes k hold the checkpoint spec names: kept as it is when it is the same
 * file, else dropped and opened. Returns 0 (*opened: whether it was
 * opened now), or -1 with err (k then holds nothing). */
static int keptOpen(Kept *k, const char *spec, int *opened, NsaError *err) {
    char dir[WEIGHTS_PATH_MAX];
    struct stat sb;
    const int known = keptIdentity(spec, dir, sizeof dir, &sb) == 0;
    *opened = 0;
    const int same_dir = k->live && known && !strcmp(dir, k->w.dir);
    if (same_dir && sameFile(&sb, &k->file)) return 0;
    keptDrop(k, same_dir ? "its model.safetensors changed" : "a job names another checkpoint");
    if (weightsOpen(spec, &k->w, err)) return -1;
    k->live = 1;
    *opened = 1;
    char path[WEIGHTS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", k->w.dir);
    if (stat(path, &k->file)) memset(&k->file, 0, sizeof k->file);   /* never the same again */
    return 0;
}

/* A decoder of k's checkpoint on dev/gpu with room for slots x context,
 * every slot empty: k's own when it fits, else a new one (at least as large
 * as the one it replaces on the same device). Returns 0 (*built: whether it
 * was built now), or -1 with err, dropping k. */
static int keptDecoder(Kept *k, NsaDevice dev, int gpu, int slots, int context, int *built,
                       NsaError *err) {
    *built = 0;
    if (k->d && k->dev == dev && k->gpu == gpu && k->slots >= slots && k->context >= context) {
        if (nsaDecoderReset(k->d, -1, err) == 0) return 0;
        keptDrop(k, "its decoder failed to reset");
        return -1;
    }
    context = keptContext(context);
    if (k->d && k->dev == dev && k->gpu == gpu) {
        if (k->slots > slots) slots = k->slots;
        if (k->context > context) context = k->context;
    }
    nsaDecoderFree(k->d);   /* its memory first: the new one may need it */
    k->d = weightsNewDecoder(&k->w, dev, gpu, slots, context, cpuThreads(), err);
    if (!k->d) {
        keptDrop(k, "a decoder could not be built");
        return -1;
    }
    k->dev = dev;
    k->gpu = gpu;
    k->slots = slots;
    k->context = context;
    *built = 1;
    return 0;
}

/* ---- sample ------------------------------------------------------------------------ */

typedef struct TextOut {
    Stream *s;
    int sample;         /* the continuation's index, or -1 for a job of one */
    char pending[16];   /* an incomplete UTF-8 sequence held back */
    size_t n_pending;
} TextOut;

/* Writes pending + bytes as a {"text"} line, holding back an incomplete
 * trailing sequence unless final. Returns -1 when the reader is gone. */
static int flushText(TextOut *t, const char *bytes, size_t len, int final) {
    char buf[sizeof t->pending + 64];
    if (len > sizeof buf - t->n_pending) len = sizeof buf - t->n_pending;
    memcpy(buf, t->pending, t->n_pending);
    memcpy(buf + t->n_pending, bytes, len);
    size_t total = t->n_pending + len;
    size_t whole = final ? total : sampleUtf8Complete(buf, total);
    t->n_pending = total - whole;
    if (t->n_pending > sizeof t->pending) {   /* cannot be incomplete for that long */
        whole = total;
        t->n_pending = 0;
    }
    memcpy(t->pending, buf + whole, t->n_pending);
    if (whole == 0) return streamCancelled(t->s) ? -1 : 0;
    char *clean = sampleUtf8Clean(buf, whole);
    cJSON *o = cJSON_CreateObject();
    if (t->sample >= 0) cJSON_AddNumberToObject(o, "sample", t->sample);
    if (clean) cJSON_AddStringToObject(o, "text", clean);
    free(clean);
    return clean ? writeLine(t->s, o) : (cJSON_Delete(o), -1);
}

/* ctx: one TextOut per continuation. */
static int emitText(void *ctx, int prompt, const char *bytes, size_t len) {
    TextOut *out = ctx;
    return flushText(&out[prompt], bytes, len, 0) ? 1 : 0;
}

/* SampleEmitId: the new token of a continuation as an {"ids":[ID]} line
 * (ctx: one TextOut per continuation, its pending bytes unused). */
static int emitId(void *ctx, int prompt, int32_t id) {
    const TextOut *t = (const TextOut *)ctx + prompt;
    cJSON *o = cJSON_CreateObject(), *ids = cJSON_CreateArray();
    if (t->sample >= 0) cJSON_AddNumberToObject(o, "sample", t->sample);
    cJSON_AddItemToArray(ids, cJSON_CreateNumber(id));
    cJSON_AddItemToObject(o, "ids", ids);
    return writeLine(t->s, o) ? 1 : 0;
}

/* The prompt's ids as a JSON array, or NULL when memory ran out. */
static cJSON *idsArray(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int j = 0; a && j < n; j++) {
        cJSON *v = cJSON_CreateNumber(ids[j]);
        if (!v) {
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddItemToArray(a, v);
    }
    return a;
}

/* Whether job's prompt suits w's model before anything is built: token ids
 * within its vocabulary, or text and a tokenizer that encodes it (*tok).
 * Returns 0 with *tokens, the most tokens the prompt takes, or -1 with err
 * naming what is wrong (a refusal of the request: the model is fine). */
static int checkPrompt(const Weights *w, const InferJob *job, const Tokenizer **tok, size_t *tokens,
                       NsaError *err) {
    const int V = w->job.model.vocab_size;
    *tok = NULL;
    if (job->prompt_ids) {
        for (int j = 0; j < job->n_prompt_ids; j++)
            if (job->prompt_ids[j] < 0 || job->prompt_ids[j] >= V)
                return nsaErrorf(err,
                                 "prompt_ids[%d]: id %d is not in the model's vocabulary of %d "
                                 "ids; allowed: 0 to %d",
                                 j, (int)job->prompt_ids[j], V, V - 1);
        *tokens = (size_t)job->n_prompt_ids;
        return 0;
    }
    *tok = weightsTextTokenizer(w, err);
    if (!*tok) {
        char why[sizeof err->message];
        snprintf(why, sizeof why, "%s", err->message);
        return nsaErrorf(err,
                         "%s; give the prompt as token ids: prompt_ids [ID, ...] (nsactl sample "
                         "--prompt-ids ID,ID,...)",
                         why);
    }
    *tokens = tokenizerMaxTokens(*tok, strlen(job->prompt));
    return 0;
}

static cJSON *doneLine(const SampleResult *res, int n) {
    const double gen = res->seconds - res->prefill_seconds;
    int total = 0;
    cJSON *o = cJSON_CreateObject(), *each = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "tokens", res->tokens[i]);
        cJSON_AddStringToObject(e, "stop", sampleStopName(res->stop[i]));
        cJSON_AddItemToArray(each, e);
        total += res->tokens[i];
    }
    cJSON_AddStringToObject(o, "event", "done");
    cJSON_AddNumberToObject(o, "tokens", total);
    if (n == 1) cJSON_AddStringToObject(o, "stop", sampleStopName(res->stop[0]));
    cJSON_AddItemToObject(o, "samples", each);
    cJSON_AddNumberToObject(o, "seconds", res->seconds);
    cJSON_AddNumberToObject(o, "prefill_seconds", res->prefill_seconds);
    cJSON_AddNumberToObject(o, "tokens_per_s", gen > 0 ? total / gen : 0.0);
    return o;
}

static void runSample(Infer *inf, InferJob *job, Stream *s) {
    NsaError err = {{0}};
    Kept *k = &inf->kept;
    int opened = 0, built = 0;
    if (keptOpen(k, job->checkpoint, &opened, &err)) {
        writeError(s, err.message);
        return;
    }
    const Weights *w = &k->w;
    const Tokenizer *tok = NULL;
    const NsaDevice dev = pickDevice(job->device);
    size_t tokens = 0;
    if (checkPrompt(w, job, &tok, &tokens, &err)) {
        /* the request is refused, not the model: it stays kept as it is */
        writeError(s, err.message);
        k->last_used = clockMonotonicSeconds();
        return;
    }
    int ready = 0;
    const size_t ctx = tokens + (size_t)job->sample.max_tokens;
    if (ctx > (1u << 24))
        nsaErrorf(&err, "prompt + max_tokens: %zu tokens; allowed: at most %u", ctx, 1u << 24);
    else
        ready = keptDecoder(k, dev, job->gpu, job->n_samples, (int)ctx, &built, &err) == 0;
    if (!ready) {
        writeError(s, err.message);
        keptDrop(k, "its job failed");
        return;
    }
    NsaDecoder *d = k->d;
    cJSON *start = startLine(w, dev, job->gpu);
    cJSON_AddBoolToObject(start, "reused", !opened && !built);
    if (job->prompt_ids) {
        cJSON *ids = idsArray(job->prompt_ids, job->n_prompt_ids);
        if (ids)
            cJSON_AddItemToObject(start, "prompt_ids", ids);
        else
            cJSON_AddNullToObject(start, "prompt_ids");
    } else {
        cJSON_AddStringToObject(start, "prompt", job->prompt);
    }
    const int n = job->n_samples;
    cJSON_AddNumberToObject(start, "samples", n);
    TextOut out[SAMPLE_MAX_PROMPTS];
    const char *prompts[SAMPLE_MAX_PROMPTS];
    for (int i = 0; i < n; i++) {
        out[i] = (TextOut){.s = s, .sample = n > 1 ? i : -1};
        prompts[i] = job->prompt;   /* one prefill, copied into every slot */
    }
    SampleResult res;
    if (writeLine(s, start) == 0) {
        const int failed =
            tok ? sampleGenerate(d, tok, prompts, n, &job->sample, emitText, out, &res, &err)
                : sampleGenerateIds(d, job->prompt_ids, job->n_prompt_ids, n, &job->sample, emitId,
                                    out, &res, &err);
        if (failed) {
            writeError(s, err.message);
        } else if (res.stop[0] != SAMPLE_STOP_CANCEL) {
            int gone = 0;
            for (int i = 0; tok && i < n && !gone; i++) /* text held back, if any */
                gone = flushText(&out[i], "", 0, 1) != 0;
            if (!gone) writeLine(s, doneLine(&res, n));
        }
    }
    k->last_used = clockMonotonicSeconds();
}

/* ---- eval -------------------------------------------------------------------------- */

typedef struct Progress {
    Stream *s;
    double last;
} Progress;

static int evalProgress(void *ctx, int64_t done, int64_t total, double loss) {
    Progress *p = ctx;
    const double now = clockMonotonicSeconds();
    if (streamCancelled(p->s)) return 1;
    if (done < total && now - p->last < 0.5) return 0;
    p->last = now;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "progress");
    cJSON_AddNumberToObject(o, "done", (double)done);
    cJSON_AddNumberToObject(o, "total", (double)total);
    cJSON_AddNumberToObject(o, "loss", loss);
    return writeLine(p->s, o) ? 1 : 0;
}

static void runEval(Infer *inf, InferJob *job, Stream *s) {
    NsaError err = {{0}};
    const NsaDevice dev = pickDevice(job->device);
    /* the eval's model and activations may need the memory a kept decoder holds */
    if (dev == NSA_DEVICE_CUDA && inf->kept.live && inf->kept.dev == NSA_DEVICE_CUDA &&
        inf->kept.gpu == job->gpu)
        keptDrop(&inf->kept, "an eval job needs its GPU");
    Weights w;
    if (weightsOpen(job->checkpoint, &w, &err)) {
        writeError(s, err.message);
        return;
    }
    EvalOptions o = {.seq_len = job->seq_len, .batch = job->batch, .max_tokens = job->max_tokens,
                     .device = dev, .gpu = job->gpu, .precision = dev == NSA_DEVICE_CUDA ? NSA_PREC_BF16 : NSA_PREC_F32,
                     .threads = cpuThreads()};
    evalOptionsFromPath(&o, job->data);
    cJSON *start = startLine(&w, dev, job->gpu);
    cJSON_AddStringToObject(start, "data", job->data);
    Progress p = {.s = s, .last = clockMonotonicSeconds()};
    EvalResult r;
    if (writeLine(s, start) == 0) {
        if (evalRun(&w, &o, evalProgress, &p, &r, &err)) {
            writeError(s, err.message);
        } else {
            cJSON *res = cJSON_CreateObject();
            cJSON_AddStringToObject(res, "event", "result");
            evalResultToJson(res, &w, job->data, &r);
            writeLine(s, res);
        }
    }
    weightsClose(&w);
}

/* Start line, then done {name, reused, seconds, files: [{name, bytes}]} once
 * the export is made (or found), or an error line. */
static void runExport(InferJob *job, Stream *s) {
    NsaError err = {{0}};
    Weights w;
    if (weightsOpen(job->checkpoint, &w, &err)) {
        writeError(s, err.message);
        return;
    }
    const double t0 = clockMonotonicSeconds();
    cJSON *start = cJSON_CreateObject();
    cJSON_AddStringToObject(start, "event", "start");
    cJSON_AddStringToObject(start, "checkpoint", w.dir);
    cJSON_AddNumberToObject(start, "step", (double)w.state.step);
    cJSON_AddStringToObject(start, "dtype", job->dtype == EXPORT_BF16 ? "bf16" : "f32");
    char name[EXPORT_STORE_NAME_MAX];
    uint64_t bytes[EXPORT_STORE_FILES];
    int reused = 0;
    if (writeLine(s, start) == 0) {
        if (exportStoreMake(job->exports_dir, &w, (ExportDtype)job->dtype, name, bytes, &reused,
                            &err)) {
            writeError(s, err.message);
        } else {
            cJSON *done = cJSON_CreateObject();
            cJSON_AddStringToObject(done, "event", "done");
            cJSON_AddStringToObject(done, "name", name);
            cJSON_AddBoolToObject(done, "reused", reused);
            cJSON_AddNumberToObject(done, "seconds", clockMonotonicSeconds() - t0);
            cJSON *files = cJSON_AddArrayToObject(done, "files");
            for (int i = 0; i < EXPORT_STORE_FILES; i++) {
                cJSON *f = cJSON_CreateObject();
                cJSON_AddStringToObject(f, "name", exportStoreFiles[i]);
                cJSON_AddNumberToObject(f, "bytes", (double)bytes[i]);
                cJSON_AddItemToArray(files, f);
            }
            writeLine(s, done);
        }
    }
    weightsClose(&w);
}

/* ---- the worker --------------------------------------------------------------------- */

/* Drops the kept model when a run claimed its GPU or it has been idle for
 * keep_s. Caller holds inf->lock; the drop (a device free, an unmap) runs
 * with it released, as the kept model is the worker's alone and the lock's
 * other takers (inferReleaseGpus under the service lock, inferSubmit on an
 * HTTP thread) must not wait for it. */
static void keptExpire(Infer *inf) {
    Kept *k = &inf->kept;
    const uint64_t claimed = inf->release_gpus;
    inf->release_gpus = 0;
    if (!k->live) return;
    const char *why = NULL;
    if (k->dev == NSA_DEVICE_CUDA && k->gpu >= 0 && k->gpu < (int)(8 * sizeof claimed) &&
        (claimed >> k->gpu & 1))
        why = "a run claimed its GPU";
    else if (clockMonotonicSeconds() - k->last_used >= inf->keep_s)
        why = "no sample job for the keep time";
    if (!why) return;
    pthread_mutex_unlock(&inf->lock);
    keptDrop(k, why);
    pthread_mutex_lock(&inf->lock);
}

/* Waits for a job, a stop or a release while the kept model lives, until
 * its keep time ends. Caller holds inf->lock. */
static void waitForWork(Infer *inf) {
    for (;;) {
        keptExpire(inf);
        if (inf->stop || inf->head) return;
        if (!inf->kept.live) {
            pthread_cond_wait(&inf->cv, &inf->lock);
            continue;
        }
        const double until = inf->kept.last_used + inf->keep_s;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const double wait = until - clockMonotonicSeconds();
        if (wait > 0) {
            ts.tv_sec += (time_t)wait;
            ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&inf->cv, &inf->lock, &ts);
        }
    }
}

static void *inferMain(void *arg) {
    Infer *inf = arg;
    if (stackdumpRegisterThread("infer") != 0) logWarn("the infer thread is not in stack dumps");
    pthread_mutex_lock(&inf->lock);
    for (;;) {
        waitForWork(inf);
        if (inf->stop) break;
        Queued *q = inf->head;
        inf->head = q->next;
        if (!inf->head) inf->tail = NULL;
        inf->waiting--;
        pthread_mutex_unlock(&inf->lock);
        if (!streamCancelled(q->stream)) {
            const double t0 = clockMonotonicSeconds();
            static const char *const kinds[] = {"sample", "eval", "export"};
            if (q->job.kind == INFER_SAMPLE) runSample(inf, &q->job, q->stream);
            else if (q->job.kind == INFER_EVAL) runEval(inf, &q->job, q->stream);
            else runExport(&q->job, q->stream);
            logInfo("%s on %s: %.2f s%s", kinds[q->job.kind],
                    q->job.checkpoint, clockMonotonicSeconds() - t0,
                    streamCancelled(q->stream) ? " (cancelled: its reader left)" : "");
        }
        streamClose(q->stream);
        inferJobRelease(&q->job);
        free(q);
        pthread_mutex_lock(&inf->lock);
    }
    pthread_mutex_unlock(&inf->lock);
    keptDrop(&inf->kept, "nsad is stopping");
    stackdumpUnregisterThread();
    return NULL;
}

Infer *inferStart(double keep_s, NsaError *err) {
    Infer *inf = calloc(1, sizeof *inf);
    if (!inf) {
        nsaErrorf(err, "inference: out of memory");
        return NULL;
    }
    inf->keep_s = keep_s;
    pthread_mutex_init(&inf->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);   /* the keep time's deadline */
    pthread_cond_init(&inf->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&inf->thread, NULL, inferMain, inf);
    if (rc != 0) {
        nsaErrorf(err, "inference: cannot start its thread: %s", strerror(rc));
        pthread_mutex_destroy(&inf->lock);
        pthread_cond_destroy(&inf->cv);
        free(inf);
        return NULL;
    }
    return inf;
}

void inferStop(Infer *inf) {
    if (!inf) return;
    pthread_mutex_lock(&inf->lock);
    inf->stop = 1;
    Queued *q = inf->head;
    inf->head = inf->tail = NULL;
    pthread_cond_broadcast(&inf->cv);
    pthread_mutex_unlock(&inf->lock);
    pthread_join(inf->thread, NULL);
    while (q) {
        Queued *next = q->next;
        writeError(q->stream, "nsad is stopping");
        streamClose(q->stream);
        inferJobRelease(&q->job);
        free(q);
        q = next;
    }
    pthread_mutex_destroy(&inf->lock);
    pthread_cond_destroy(&inf->cv);
    free(inf);
}

void inferReleaseGpus(Infer *inf, uint64_t gpus) {
    if (!inf || !gpus) return;
    pthread_mutex_lock(&inf->lock);
    inf->release_gpus |= gpus;
    pthread_cond_signal(&inf->cv);
    pthread_mutex_unlock(&inf->lock);
}

Stream *inferSubmit(Infer *inf, InferJob *job, NsaError *err) {
    Queued *q = calloc(1, sizeof *q);
    Stream *s = q ? streamCreate() : NULL;
    if (!q || !s) {
        free(q);
        inferJobRelease(job);
        nsaErrorf(err, "inference: out of memory");
        return NULL;
    }
    q->job = *job;
    job->prompt = NULL; /* the queued copy owns them now */
    job->prompt_ids = NULL;
    job->n_prompt_ids = 0;
    q->stream = s;
    pthread_mutex_lock(&inf->lock);
    if (inf->waiting >= INFER_QUEUE_MAX || inf->stop) {
        const int stopping = inf->stop;
        pthread_mutex_unlock(&inf->lock);
        inferJobRelease(&q->job);
        free(q);
        streamClose(s);
        streamRelease(s);
        if (stopping)
            nsaErrorf(err, "inference: nsad is stopping");
        else
            nsaErrorf(err, "inference: %d jobs wait already; allowed: at most %d", INFER_QUEUE_MAX,
                      INFER_QUEUE_MAX);
        return NULL;
    }
    if (inf->tail) inf->tail->next = q;
    else inf->head = q;
    inf->tail = q;
    inf->waiting++;
    pthread_cond_signal(&inf->cv);
    pthread_mutex_unlock(&inf->lock);
    return s;
}

void inferJobRelease(InferJob *job) {
    free(job->prompt);
    free(job->prompt_ids);
    job->prompt = NULL;
    job->prompt_ids = NULL;
    job->n_prompt_ids = 0;
}
