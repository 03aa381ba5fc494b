/* use.c - nsactl's commands that use a trained checkpoint through the
 * daemon: `sample` (text, or token ids, streamed as generated), `eval` (held-out
 * loss with progress) and `export` (the weights made into an export and
 * downloaded). Each names a run (its latest checkpoint) or a checkpoint
 * directory, and reads the JSON lines of POST /api/v1/sample, /api/v1/eval
 * or /api/v1/export (proto/api.md) as they come. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>

#include "args.h"
#include "ctlcmd.h"
#include "../daemon/strbuf.h"

typedef struct UseOption {
    const char *name;
    const char *value;
} UseOption;

/* argv into one positional argument and values of the named options (each
 * takes a value; argsParse's rules). With `required` (naming opts[0] with
 * its value: "--data PATH"), opts[0] is required, non-empty; NULL: the
 * caller checks what is required. Returns 0, or prints and returns -1. */
static int parseUse(const char *cmd, int argc, char **argv, UseOption *opts, int n_opts,
                    const char *required, const char **pos) {
    ArgsOption args[ARGS_MAX_OPTIONS];
    if (n_opts > ARRAY_LEN(args)) {
        fprintf(stderr, "nsactl %s: internal: %d options; at most %d\n", cmd, n_opts,
                ARRAY_LEN(args));
        return -1;
    }
    for (int k = 0; k < n_opts; k++) args[k] = (ArgsOption){opts[k].name, &opts[k].value, NULL};
    int n_pos = 0;
    if (argsParse(cmd, argc, argv, args, n_opts, pos, 1, 1, &n_pos) != 0) return -1;
    if (required && (!opts[0].value || !opts[0].value[0])) {
        fprintf(stderr, "nsactl %s: %s is required\n", cmd, required);
        return -1;
    }
    return 0;
}

/* {"run": ID} for a run id, {"checkpoint": /absolute/dir} for a path (the
 * daemon does not share our working directory). Returns 0, or prints and
 * returns -1. */
static int addTarget(const char *cmd, cJSON *body, const char *what) {
    if (!strchr(what, '/') && strcmp(what, ".") && strcmp(what, "..")) {
        if (ctlCheckRunId(what)) return -1;
        cJSON_AddStringToObject(body, "run", what);
        return 0;
    }
    char abs[PATH_MAX];
    if (!realpath(what, abs)) {
        fprintf(stderr, "nsactl %s: checkpoint %s: %s\n", cmd, what, strerror(errno));
        return -1;
    }
    cJSON_AddStringToObject(body, "checkpoint", abs);
    return 0;
}

/* A number option into body as key; absent: nothing. Returns 0, or prints
 * and returns -1. */
static int addNumber(const char *cmd, cJSON *body, const char *key, const UseOption *o) {
    if (!o->value) return 0;
    char *end = NULL;
    errno = 0;
    const double v = strtod(o->value, &end);
    if (errno || end == o->value || *end || !isfinite(v)) {
        fprintf(stderr, "nsactl %s: %s '%s' is not a number\n", cmd, o->name, o->value);
        return -1;
    }
    cJSON_AddNumberToObject(body, key, v);
    return 0;
}

/* The exchange: prints the daemon's refusal like ctlCall does. */
typedef struct UseRun {
    Ctl *ctl;
    const char *cmd;
    int failed;         /* an {"event":"error"} line came */
    int done;           /* the final line came */
    int progress_shown; /* a \r progress line is on the terminal */
} UseRun;

static int streamCall(UseRun *u, const char *path, cJSON *body, HttpLineFn on_line) {
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    if (!text) {
        fprintf(stderr, "nsactl %s: out of memory\n", u->cmd);
        return CTL_EXIT_ERROR;
    }
    const int rc = ctlStream(u->ctl, "POST", path, text, strlen(text), on_line, u, CTL_EXIT_USAGE);
    free(text);
    if (rc != CTL_OK) return rc;
    if (u->failed) return CTL_EXIT_ERROR;
    if (!u->done) {
        fprintf(stderr, "nsactl %s: the stream ended early (nsad stopped?)\n", u->cmd);
        return CTL_EXIT_ERROR;
    }
    return CTL_OK;
}

/* An {"event":"error"} line: printed; 1 when it was one. */
static int errorLine(UseRun *u, const cJSON *o) {
    const char *ev = ctlString(o, "event", "");
    if (strcmp(ev, "error")) return 0;
    if (u->progress_shown) fputc('\n', stderr);
    fprintf(stderr, "nsactl %s: %s\n", u->cmd, ctlString(o, "message", "(no message)"));
    u->failed = 1;
    return 1;
}

/* With --json: the daemon's line as it came; notes the end (final_event)
 * and an error. */
static void jsonLine(UseRun *u, const char *line, size_t len, const char *ev, const char *final_event) {
    fwrite(line, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (!strcmp(ev, final_event)) u->done = 1;
    if (!strcmp(ev, "error")) u->failed = 1;
}

/* ---- sample ------------------------------------------------------------------ */


/* One continuation streams straight to stdout; several are collected and
 * printed one after another when the job is done. A prompt of token ids
 * (--prompt-ids) gets ids back: the prompt's and the new ones, printed
 * space-separated as one line per continuation, as `nsad sample
 * --prompt-ids` prints them. */
typedef struct SampleRun {
    UseRun u;
    int n;
    int ids;                     /* the prompt and the output are token ids */
    char *prompt;                /* n > 1: the start line's prompt, as printed */
    StrBuf text[CTL_SAMPLE_MAX_N];   /* n > 1: each continuation's text (or " ID"s) so far */
    const char *model;           /* the start line's reused: "model kept" or "model loaded" */
} SampleRun;

static void samplePrintAll(SampleRun *r, const cJSON *done) {
    const cJSON *each = cJSON_GetObjectItemCaseSensitive(done, "samples");
    for (int i = 0; i < r->n; i++) {
        const cJSON *e = cJSON_GetArrayItem(each, i);
        double tokens = 0;
        ctlHasNumber(e, "tokens", &tokens);
        printf("%s--- sample %d (%.0f tokens, %s) ---\n%s%s\n", i && !r->ids ? "\n" : "", i, tokens,
               ctlString(e, "stop", "?"), r->prompt ? r->prompt : "", r->text[i].data);
    }
}

/* The start line's prompt as printed: its text, or its prompt_ids
 * space-separated. Returns a malloc'd string, or NULL when out of memory. */
static char *promptOf(const SampleRun *r, const cJSON *start) {
    if (!r->ids) return strdup(ctlString(start, "prompt", ""));
    StrBuf b;
    if (strbufInit(&b, 64)) return NULL;
    const cJSON *id;
    int first = 1;
    cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(start, "prompt_ids")) {
        strbufPrintf(&b, "%s%.0f", first ? "" : " ", cJSON_IsNumber(id) ? id->valuedouble : -1.0);
        first = 0;
    }
    if (b.failed) {
        free(strbufTake(&b));
        return NULL;
    }
    return strbufTake(&b);
}

/* A token line's new ids as " ID" each: into b, or to stdout when b is
 * NULL. */
static void putIds(StrBuf *b, const cJSON *line) {
    const cJSON *id;
    cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(line, "ids")) {
        const double v = cJSON_IsNumber(id) ? id->valuedouble : -1.0;
        if (b)
            strbufPrintf(b, " %.0f", v);
        else
            printf(" %.0f", v);
    }
}

static int sampleLine(void *ctx, const char *line, size_t len) {
    SampleRun *r = ctx;
    UseRun *u = &r->u;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!o) return 0;
    const char *ev = ctlString(o, "event", "");
    if (u->ctl->json) {
        jsonLine(u, line, len, ev, "done");
    } else if (errorLine(u, o)) {
    } else if (!strcmp(ev, "start")) {
        const cJSON *reused = cJSON_GetObjectItemCaseSensitive(o, "reused");
        r->model = cJSON_IsTrue(reused) ? "model kept" : cJSON_IsFalse(reused) ? "model loaded" : NULL;
        free(r->prompt);
        r->prompt = promptOf(r, o);
        if (!r->prompt) {
            fprintf(stderr, "nsactl sample: out of memory for the prompt\n");
            u->failed = 1;
        } else if (r->n == 1) {
            fputs(r->prompt, stdout);
            fflush(stdout);
        }
    } else if (!strcmp(ev, "done")) {
        double tokens = 0, tps = 0;
        for (int i = 0; i < r->n && r->n > 1; i++)
            if (r->text[i].failed) {
                fprintf(stderr, "nsactl sample: out of memory for the texts\n");
                u->failed = 1;
                cJSON_Delete(o);
                return 0;
            }
        ctlHasNumber(o, "tokens", &tokens);
        ctlHasNumber(o, "tokens_per_s", &tps);
        u->done = 1;
        if (r->n == 1) {
            fprintf(stdout, "\n");
            fprintf(stderr, "[%.0f tokens, %s, %.1f tokens/s%s%s]\n", tokens,
                    ctlString(o, "stop", "?"), tps, r->model ? ", " : "", r->model ? r->model : "");
        } else {
            samplePrintAll(r, o);
            fprintf(stderr, "[%d samples, %.0f tokens, %.1f tokens/s%s%s]\n", r->n, tokens, tps,
                    r->model ? ", " : "", r->model ? r->model : "");
        }
        fflush(stdout);
    } else if (r->n == 1 && r->ids) {
        putIds(NULL, o);
        fflush(stdout);
    } else if (r->n == 1) {
        fputs(ctlString(o, "text", ""), stdout);
        fflush(stdout);
    } else {
        double at = -1;
        ctlHasNumber(o, "sample", &at);
        if (at >= 0 && at < r->n && r->ids)
            putIds(&r->text[(int)at], o);
        else if (at >= 0 && at < r->n)
            strbufPrintf(&r->text[(int)at], "%s", ctlString(o, "text", ""));
    }
    cJSON_Delete(o);
    return 0;
}

/* --prompt-ids' text (whole numbers, commas or spaces between) into body's
 * prompt_ids; their range and count are the daemon's to check. Returns 0,
 * or prints and returns -1 (a usage error). */
static int addIds(cJSON *body, const char *text) {
    cJSON *ids = cJSON_AddArrayToObject(body, "prompt_ids");
    if (!ids) {
        fprintf(stderr, "nsactl sample: out of memory\n");
        return -1;
    }
    for (const char *p = text;;) {
        p += strspn(p, ", \t\n");
        if (!*p) break;
        const size_t len = strcspn(p, ", \t\n");
        if (strspn(p, "0123456789") < len || len > 15) {
            fprintf(stderr,
                    "nsactl sample: --prompt-ids: '%.*s' is not a token id; allowed: whole "
                    "numbers, commas or spaces between\n",
                    (int)(len > 40 ? 40 : len), p);
            return -1;
        }
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(strtod(p, NULL)));
        p += len;
    }
    if (cJSON_GetArraySize(ids) == 0) {
        fprintf(stderr, "nsactl sample: --prompt-ids: no ids; allowed: whole numbers, commas or "
                        "spaces between\n");
        return -1;
    }
    return 0;
}

int ctlCmdSample(Ctl *ctl, int argc, char **argv) {
    UseOption opts[] = {{"--prompt", NULL},    {"--max-tokens", NULL}, {"--temperature", NULL},
                        {"--top-k", NULL},     {"--top-p", NULL},      {"--seed", NULL},
                        {"--stop", NULL},      {"--device", NULL},     {"--n", NULL},
                        {"--prompt-ids", NULL}};
    const char *what;
    if (parseUse("sample", argc, argv, opts, ARRAY_LEN(opts), NULL, &what)) return CTL_EXIT_USAGE;
    const char *prompt = opts[0].value, *ids = opts[9].value;
    if (!prompt == !ids || (prompt && !prompt[0])) {
        fprintf(stderr, "nsactl sample: %s\n",
                prompt && ids ? "--prompt and --prompt-ids: one of the two, not both"
                              : "--prompt TEXT or --prompt-ids ID,ID,... is required");
        return CTL_EXIT_USAGE;
    }
    if (ids && opts[6].value) {
        fprintf(stderr, "nsactl sample: --stop with --prompt-ids; allowed: --stop with --prompt "
                        "(stop strings need text)\n");
        return CTL_EXIT_USAGE;
    }
    SampleRun r = {.u = {.ctl = ctl, .cmd = "sample"}, .n = 1, .ids = ids != NULL};
    if (opts[8].value) {
        char *end = NULL;
        const long n = strtol(opts[8].value, &end, 10);
        if (end == opts[8].value || *end || n < 1 || n > CTL_SAMPLE_MAX_N) {
            fprintf(stderr, "nsactl sample: --n '%s'; allowed: a whole number from 1 to %d\n",
                    opts[8].value, CTL_SAMPLE_MAX_N);
            return CTL_EXIT_USAGE;
        }
        r.n = (int)n;
    }
    cJSON *body = cJSON_CreateObject();
    if (!body || addTarget("sample", body, what) || addNumber("sample", body, "n", &opts[8]) ||
        addNumber("sample", body, "max_tokens", &opts[1]) ||
        addNumber("sample", body, "temperature", &opts[2]) ||
        addNumber("sample", body, "top_k", &opts[3]) ||
        addNumber("sample", body, "top_p", &opts[4]) ||
        addNumber("sample", body, "seed", &opts[5]) || (ids && addIds(body, ids))) {
        cJSON_Delete(body);
        return CTL_EXIT_USAGE;
    }
    if (prompt) cJSON_AddStringToObject(body, "prompt", prompt);
    if (opts[6].value) {
        cJSON *stops = cJSON_AddArrayToObject(body, "stop");
        cJSON_AddItemToArray(stops, cJSON_CreateString(opts[6].value));
    }
    if (opts[7].value) cJSON_AddStringToObject(body, "device", opts[7].value);
    for (int i = 0; i < r.n && r.n > 1; i++)
        if (strbufInit(&r.text[i], 256)) {
            fprintf(stderr, "nsactl sample: out of memory\n");
            for (int k = 0; k < i; k++)
                free(strbufTake(&r.text[k]));
            cJSON_Delete(body);
            return CTL_EXIT_ERROR;
        }
    const int rc = streamCall(&r.u, "/api/v1/sample", body, sampleLine);
    free(r.prompt);
    for (int i = 0; i < r.n && r.n > 1; i++) free(strbufTake(&r.text[i]));
    return rc;
}

/* ---- eval -------------------------------------------------------------------- */

static int evalLine(void *ctx, const char *line, size_t len) {
    UseRun *u = ctx;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!o) return 0;
    const char *ev = ctlString(o, "event", "");
    double done = 0, total = 0, loss = NAN, v;
    if (u->ctl->json) {
        jsonLine(u, line, len, ev, "result");
    } else if (errorLine(u, o)) {
    } else if (!strcmp(ev, "progress")) {
        ctlHasNumber(o, "done", &done);
        ctlHasNumber(o, "total", &total);
        ctlHasNumber(o, "loss", &loss);
        const int tty = isatty(STDERR_FILENO);
        fprintf(stderr, "%seval: %5.1f%% (%.0f of %.0f tokens), loss %.4f%s", tty ? "\r" : "",
                total > 0 ? 100.0 * done / total : 0.0, done, total, loss, tty ? "" : "\n");
        u->progress_shown = tty;
    } else if (!strcmp(ev, "result")) {
        if (u->progress_shown) fputc('\n', stderr);
        u->progress_shown = 0;
        u->done = 1;
        ctlHasNumber(o, "loss", &loss);
        printf("%s (step %.0f) on %s: loss %.4f nats/token", ctlString(o, "checkpoint", "?"),
               ctlHasNumber(o, "step", &v) ? v : 0.0, ctlString(o, "data", "?"), loss);
        if (ctlHasNumber(o, "bits_per_byte", &v)) printf(", %.4f bits/byte", v);
        double tokens = 0, windows = 0, seq = 0;
        ctlHasNumber(o, "tokens", &tokens);
        ctlHasNumber(o, "windows", &windows);
        ctlHasNumber(o, "seq_len", &seq);
        printf(" over %.0f tokens (%.0f windows of %.0f)\n", tokens, windows, seq);
    }
    cJSON_Delete(o);
    return 0;
}

int ctlCmdEval(Ctl *ctl, int argc, char **argv) {
    UseOption opts[] = {{"--data", NULL},       {"--seq-len", NULL}, {"--batch", NULL},
                        {"--max-tokens", NULL}, {"--device", NULL}};
    const char *what;
    if (parseUse("eval", argc, argv, opts, ARRAY_LEN(opts), "--data PATH", &what))
        return CTL_EXIT_USAGE;
    char data[PATH_MAX];
    if (!realpath(opts[0].value, data)) {
        fprintf(stderr, "nsactl eval: --data %s: %s\n", opts[0].value, strerror(errno));
        return CTL_EXIT_USAGE;
    }
    cJSON *body = cJSON_CreateObject();
    if (!body || addTarget("eval", body, what) || addNumber("eval", body, "seq_len", &opts[1]) ||
        addNumber("eval", body, "batch", &opts[2]) ||
        addNumber("eval", body, "max_tokens", &opts[3])) {
        cJSON_Delete(body);
        return CTL_EXIT_USAGE;
    }
    cJSON_AddStringToObject(body, "data", data);
    if (opts[4].value) cJSON_AddStringToObject(body, "device", opts[4].value);
    UseRun u = {.ctl = ctl, .cmd = "eval"};
    return streamCall(&u, "/api/v1/eval", body, evalLine);
}

/* ---- export ------------------------------------------------------------------ */

#define EXPORT_FILES 3
static const char *const export_files[EXPORT_FILES] = {"model.safetensors", "config.json",
                                                       "README.md"};

typedef struct ExportRun {
    UseRun u;
    char name[128];              /* the done line's export name */
    double bytes[EXPORT_FILES];  /* and its files' sizes */
} ExportRun;

static int exportLine(void *ctx, const char *line, size_t len) {
    ExportRun *r = ctx;
    UseRun *u = &r->u;
    cJSON *o = cJSON_ParseWithLength(line, len);
    if (!o) return 0;
    const char *ev = ctlString(o, "event", "");
    double step = 0;
    if (errorLine(u, o)) {
    } else if (!strcmp(ev, "start")) {
        ctlHasNumber(o, "step", &step);
        fprintf(stderr, "exporting %s (step %.0f, %s)\n", ctlString(o, "checkpoint", "?"), step,
                ctlString(o, "dtype", "?"));
    } else if (!strcmp(ev, "done")) {
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files");
        snprintf(r->name, sizeof r->name, "%s", ctlString(o, "name", ""));
        for (int i = 0; i < EXPORT_FILES; i++) {
            const cJSON *f = cJSON_GetArrayItem(files, i);
            r->bytes[i] = -1;
            if (!strcmp(ctlString(f, "name", ""), export_files[i]))
                ctlHasNumber(f, "bytes", &r->bytes[i]);
        }
        u->done = r->name[0] != 0;
        if (!u->done) {
            fprintf(stderr, "nsactl export: the daemon's done line names no export\n");
            u->failed = 1;
        }
    }
    cJSON_Delete(o);
    return 0;
}

typedef struct Progress {
    const char *file;
    double total;
    int tty;
    double shown;
} Progress;

static void downloadProgress(void *ctx, uint64_t bytes) {
    Progress *p = ctx;
    if (!p->tty || ((double)bytes - p->shown < 8e6 && (double)bytes < p->total)) return;
    p->shown = (double)bytes;
    fprintf(stderr, "\r  %s: %.1f of %.1f MB", p->file, (double)bytes / 1e6, p->total / 1e6);
}

/* Removes the hidden part files of dir's export (those that exist). */
static void removeParts(const char *dir) {
    for (int i = 0; i < EXPORT_FILES; i++) {
        char part[PATH_MAX + 16];
        snprintf(part, sizeof part, "%s/.%s.part", dir, export_files[i]);
        unlink(part);
    }
}

/* Downloads one file of export r->name into part, checking its size. */
static int downloadFile(Ctl *ctl, const ExportRun *r, int i, const char *part) {
    char url[512];
    snprintf(url, sizeof url, "/api/v1/exports/%s/%s", r->name, export_files[i]);
    const int fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "nsactl export: %s: %s\n", part, strerror(errno));
        return CTL_EXIT_ERROR;
    }
    Progress p = {export_files[i], r->bytes[i], isatty(STDERR_FILENO), 0};
    int rc = ctlDownload(ctl, url, fd, downloadProgress, &p);
    struct stat st;
    if (p.tty && p.shown > 0) fputc('\n', stderr);
    if (rc == CTL_OK && (fsync(fd) != 0 || fstat(fd, &st) != 0)) {
        fprintf(stderr, "nsactl export: %s: %s\n", part, strerror(errno));
        rc = CTL_EXIT_ERROR;
    } else if (rc == CTL_OK && (double)st.st_size != r->bytes[i]) {
        fprintf(stderr, "nsactl export: %s: %lld bytes came, the daemon said %.0f\n",
                export_files[i], (long long)st.st_size, r->bytes[i]);
        rc = CTL_EXIT_ERROR;
    }
    close(fd);
    return rc;
}

/* Downloads the three files of export r->name into dir (created when
 * missing): each into a hidden part file beside it, its size checked; once
 * all three are there they are linked into place (a file that appeared
 * meanwhile is not replaced) and the parts removed. On failure nothing of
 * this export is left in dir, so the same command can be run again. */
static int downloadExport(Ctl *ctl, const ExportRun *r, const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "nsactl export: --out %s: %s\n", dir, strerror(errno));
        return CTL_EXIT_ERROR;
    }
    int rc = CTL_OK;
    for (int i = 0; rc == CTL_OK && i < EXPORT_FILES; i++) {
        char part[PATH_MAX + 16];
        snprintf(part, sizeof part, "%s/.%s.part", dir, export_files[i]);
        rc = downloadFile(ctl, r, i, part);
    }
    int linked = 0;
    for (; rc == CTL_OK && linked < EXPORT_FILES; linked++) {
        char path[PATH_MAX], part[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/%s", dir, export_files[linked]);
        snprintf(part, sizeof part, "%s/.%s.part", dir, export_files[linked]);
        if (link(part, path) != 0) {
            fprintf(stderr, "nsactl export: %s: %s\n", path, strerror(errno));
            rc = CTL_EXIT_ERROR;
            break;
        }
    }
    if (rc != CTL_OK) /* the files linked before the one that failed */
        for (int i = 0; i < linked; i++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, export_files[i]);
            unlink(path);
        }
    removeParts(dir);
    for (int i = 0; rc == CTL_OK && !ctl->json && i < EXPORT_FILES; i++)
        fprintf(stderr, "  %s/%s (%.1f MB)\n", dir, export_files[i], r->bytes[i] / 1e6);
    return rc;
}

int ctlCmdExport(Ctl *ctl, int argc, char **argv) {
    UseOption opts[] = {{"--out", NULL}, {"--dtype", NULL}};
    const char *what;
    if (parseUse("export", argc, argv, opts, ARRAY_LEN(opts), "--out DIR", &what))
        return CTL_EXIT_USAGE;
    const char *dir = opts[0].value, *dtype = opts[1].value ? opts[1].value : "bf16";
    if (strcmp(dtype, "bf16") && strcmp(dtype, "f32")) {
        fprintf(stderr, "nsactl export: --dtype '%s'; allowed: bf16 or f32\n", dtype);
        return CTL_EXIT_USAGE;
    }
    /* nothing is overwritten: refused before the daemon does any work */
    for (int i = 0; i < EXPORT_FILES; i++) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, export_files[i]) >= (int)sizeof path ||
            access(path, F_OK) == 0) {
            fprintf(stderr, "nsactl export: --out %s: %s exists; allowed: a new or empty "
                    "directory (nothing is overwritten)\n", dir, export_files[i]);
            return CTL_EXIT_USAGE;
        }
    }
    cJSON *body = cJSON_CreateObject();
    if (!body || addTarget("export", body, what)) {
        cJSON_Delete(body);
        return CTL_EXIT_USAGE;
    }
    cJSON_AddStringToObject(body, "dtype", dtype);
    ExportRun r = {.u = {.ctl = ctl, .cmd = "export"}};
    int rc = streamCall(&r.u, "/api/v1/export", body, exportLine);
    if (rc == CTL_OK) rc = downloadExport(ctl, &r, dir);
    if (rc == CTL_OK && ctl->json) {
        cJSON *doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "export", r.name);
        cJSON_AddStringToObject(doc, "dir", dir);
        char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;
        if (text) puts(text);
        free(text);
        cJSON_Delete(doc);
    }
    return rc;
}
