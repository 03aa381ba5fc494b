/* fuzz_checkpoint.c - libFuzzer harness for what checkpoint.c reads from
 * disk: safetensors headers and metadata, manifest.json, and the
 * checkpoints/latest pointer.
 *
 * The first byte picks what the rest becomes:
 *   0  a state.safetensors: safetensorsRead, every tensor copied out, the
 *      resume state parsed (checkpointReadState)
 *   1  the manifest.json of an otherwise valid checkpoint of a tiny model
 *      (made at start): checkpointVerify, then checkpointLoad
 *   2  checkpoints/latest beside that checkpoint: checkpointResolve
 *      ("latest") and checkpointResolveValid
 * Errors must be one line. Files live in a mkdtemp directory. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fuzzutil.h"
#include "nsa.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char state_dir[128];     /* holds state.safetensors for mode 0 */
static char out_dir[128];       /* a run's out_dir with one checkpoint */
static char ck_dir[256];        /* out_dir/checkpoints/step_00000003 */
static char manifest[320], latest[320];
static char *good_manifest; /* its bytes, restored after each mode-1 input */
static size_t good_manifest_len;
static NsaModel *model;

static void writeAll(const char *path, const void *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fuzzDie("create", path);
    const char *p = data;
    while (size) {
        ssize_t w = write(fd, p, size);
        if (w <= 0) fuzzDie("write", path);
        p += w;
        size -= (size_t)w;
    }
    close(fd);
}

static void oneLine(const NsaError *err) {
    if (!err->message[0] || strchr(err->message, '\n')) fuzzDie("an error that is not one line", err->message);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *root = fuzzScratchDir("nsad-fuzz-ckpt");
    snprintf(state_dir, sizeof state_dir, "%s/state", root);
    snprintf(out_dir, sizeof out_dir, "%s/out", root);
    mkdir(state_dir, 0755);
    NsaModelConfig mc;
    nsaModelConfigDefaults(&mc);
    mc.dim = 16, mc.n_layers = 1, mc.n_heads = 2, mc.n_kv_groups = 1, mc.d_k = 8, mc.d_v = 8;
    mc.vocab_size = 16;
    mc.cmp_len = 4, mc.cmp_stride = 2, mc.sel_len = 4, mc.n_sel = 2, mc.window = 8;
    NsaEngineOptions eo = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_F32, .max_batch = 2, .max_seq_len = 16,
                           .threads = 1};
    NsaError err = {{0}};
    model = nsaModelCreate(&mc, &eo, &err);
    if (!model || nsaModelInit(model, 1, &err) != 0) fuzzDie("model", err.message);
    ResumeState rs = {.step = 3, .data_position = 6, .seed = 1, .config_hash = 0x39, .tokens_seen = 96};
    if (checkpointSave(model, out_dir, &rs, 0, "{}", ck_dir, sizeof ck_dir, &err) != 0)
        fuzzDie("checkpointSave", err.message);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", ck_dir);
    snprintf(latest, sizeof latest, "%s/checkpoints/latest", out_dir);
    FILE *f = fopen(manifest, "rb");
    if (!f) fuzzDie("open", manifest);
    good_manifest = malloc(65536);
    good_manifest_len = good_manifest ? fread(good_manifest, 1, 65536, f) : 0;
    fclose(f);
    if (!good_manifest_len) fuzzDie("read", manifest);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 3;
    data++;
    size--;
    NsaError err = {{0}};
    char path[256], found[512];
    if (mode == 0) {
        snprintf(path, sizeof path, "%s/state.safetensors", state_dir);
        writeAll(path, data, size);
        Safetensors *st = safetensorsRead(path, &err);
        if (!st) {
            oneLine(&err);
            return 0;
        }
        for (int i = 0; i < safetensorsCount(st); i++) {
            const SafetensorsTensor *t = safetensorsTensor(st, i);
            if (safetensorsFind(st, t->name) == NULL) fuzzDie("find", t->name);
            float *buf = malloc(t->numel ? t->numel * sizeof(float) : 1);
            if (!buf) fuzzDie("malloc", t->name);
            safetensorsCopy(st, t, buf);
            free(buf);
        }
        (void)safetensorsMeta(st, "step");
        safetensorsFree(st);
        ResumeState rs;
        if (checkpointReadState(state_dir, &rs, &err) != 0) oneLine(&err);
    } else if (mode == 1) {
        writeAll(manifest, data, size);
        if (checkpointVerify(ck_dir, &err) < 0) {
            oneLine(&err);
        } else {
            ResumeState rs;
            if (checkpointLoad(model, ck_dir, &rs, &err) != 0) oneLine(&err);
        }
        writeAll(manifest, good_manifest, good_manifest_len);
    } else {
        writeAll(latest, data, size);
        if (checkpointResolve(out_dir, "latest", found, sizeof found, &err) < 0) oneLine(&err);
        char skipped[512];
        if (checkpointResolveValid(out_dir, found, sizeof found, skipped, sizeof skipped, &err) < 0) oneLine(&err);
    }
    return 0;
}
