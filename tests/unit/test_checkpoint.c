/* test_checkpoint.c - safetensors writer/reader and training checkpoints
 * (daemon/checkpoint.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "crc32c.h"
#include "nsa_rng.h"
#include "nsa.h"
#include "testutil.h"

/* ---- simulated kills ---------------------------------------------------- */

/* Every rename, unlink and rmdir of this program goes through these (the
 * test binary's definitions win over libc's at link time), so a forked
 * child can be "killed" right before its k-th change to the file system:
 * a crash at every point a real kill could land between two of them. */
static long crash_budget = -1;   /* changes left before the kill; -1: never */
static int exchange_missing = 0; /* renameat2 RENAME_EXCHANGE answers EINVAL, as on NFS */
#define CRASHED 99

static void fsChange(void) {
    if (crash_budget == 0) _exit(CRASHED);
    if (crash_budget > 0) crash_budget--;
}

int rename(const char *from, const char *to) {
    fsChange();
    return (int)syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 0);
}

int renameat2(int from_dir, const char *from, int to_dir, const char *to, unsigned flags) {
    fsChange();
    if (exchange_missing && (flags & RENAME_EXCHANGE)) {
        errno = EINVAL;
        return -1;
    }
    return (int)syscall(SYS_renameat2, from_dir, from, to_dir, to, flags);
}

int unlink(const char *path) {
    fsChange();
    return (int)syscall(SYS_unlinkat, AT_FDCWD, path, 0);
}

int rmdir(const char *path) {
    fsChange();
    return (int)syscall(SYS_unlinkat, AT_FDCWD, path, AT_REMOVEDIR);
}

/* ---- helpers ----------------------------------------------------------- */

static int fileExists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static unsigned char *readFile(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static void writeBytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* A raw safetensors file from a header string and data bytes. */
static void writeRaw(const char *path, const char *header, const void *data, size_t data_len) {
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + data_len);
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)(((uint64_t)hl >> (8 * b)) & 0xff);
    memcpy(buf + 8, header, hl);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    writeBytes(path, buf, 8 + hl + data_len);
    free(buf);
}

/* ---- safetensors ------------------------------------------------------- */

static void test_safetensors_round_trip(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float a[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-30f};
    float b[3] = {7.0f, 8.0f, 9.0f};
    float scalar = 42.0f;
    SafetensorsTensor ts[] = {
        {.name = "layers.0.w", .ndim = 2, .shape = {2, 3}, .numel = 6, .data = a},
        {.name = "bias", .ndim = 1, .shape = {3}, .numel = 3, .data = b},
        {.name = "empty", .ndim = 2, .shape = {0, 4}, .numel = 0, .data = NULL},
        {.name = "scalar", .ndim = 0, .shape = {0}, .numel = 1, .data = &scalar},
    };
    SafetensorsMeta meta[] = {
        {.key = "step", .value = "12"},
        {.key = "note", .value = "quotes \" and \\ survive"},
    };
    NsaError err = {{0}};
    assert_int_equal(safetensorsWrite(path, ts, 4, meta, 2, &err), 0);

    /* layout: 8-byte LE header length, data 8-byte aligned, no temp left */
    size_t len;
    unsigned char *raw = readFile(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    assert_int_equal((8 + hl) % 8, 0);
    assert_int_equal(len, 8 + hl + (6 + 3 + 0 + 1) * sizeof(float));
    assert_int_equal(raw[8], '{');
    free(raw);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_false(fileExists(tmp));

    Safetensors *st = safetensorsRead(path, &err);
    assert_non_null(st);
    assert_int_equal(safetensorsCount(st), 4);
    const SafetensorsTensor *t = safetensorsFind(st, "layers.0.w");
    assert_non_null(t);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    float got[6];
    safetensorsCopy(st, t, got);
    assert_memory_equal(got, a, sizeof a);  /* bit-exact, -0.0 and denormals too */
    t = safetensorsFind(st, "bias");
    safetensorsCopy(st, t, got);
    assert_memory_equal(got, b, sizeof b);
    t = safetensorsFind(st, "empty");
    assert_non_null(t);
    assert_int_equal(t->numel, 0);
    t = safetensorsFind(st, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    safetensorsCopy(st, t, got);
    assert_true(got[0] == 42.0f);
    assert_null(safetensorsFind(st, "nope"));
    assert_string_equal(safetensorsMeta(st, "step"), "12");
    assert_string_equal(safetensorsMeta(st, "note"), "quotes \" and \\ survive");
    assert_null(safetensorsMeta(st, "missing"));
    safetensorsFree(st);
    testRemoveTree(dir);
    free(dir);
}

/* The file must load in Python's safetensors. Where the package is
 * installed the script uses it; everywhere it also checks the format rules
 * that library enforces (little-endian u64 length, JSON object header,
 * dtype/shape/data_offsets, contiguous offsets covering the whole data,
 * string metadata), with the standard library only, and prints each
 * tensor's float sum for comparison. */
static const char *python_check =
    "import json, struct, sys\n"
    "p = sys.argv[1]\n"
    "raw = open(p, 'rb').read()\n"
    "(n,) = struct.unpack('<Q', raw[:8])\n"
    "assert 8 + n <= len(raw), 'header length past the end'\n"
    "hdr = json.loads(raw[8:8 + n].decode('utf-8'))\n"
    "assert isinstance(hdr, dict)\n"
    "meta = hdr.pop('__metadata__', {})\n"
    "assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())\n"
    "data = raw[8 + n:]\n"
    "end = 0\n"
    "sums = {}\n"
    "for name, e in sorted(hdr.items(), key=lambda kv: kv[1]['data_offsets']):\n"
    "    assert set(e) == {'dtype', 'shape', 'data_offsets'}, e\n"
    "    assert e['dtype'] == 'F32'\n"
    "    b, f = e['data_offsets']\n"
    "    assert b == end, (name, b, end)\n"
    "    numel = 1\n"
    "    for d in e['shape']: numel *= d\n"
    "    assert f - b == 4 * numel, name\n"
    "    vals = struct.unpack('<%df' % numel, data[b:f])\n"
    "    sums[name] = sum(vals)\n"
    "    end = f\n"
    "assert end == len(data), 'data not fully covered'\n"
    "try:\n"
    "    from safetensors.numpy import load_file\n"
    "    loaded = load_file(p)\n"
    "    assert sorted(loaded) == sorted(sums)\n"
    "    print('lib safetensors')\n"
    "except ImportError:\n"
    "    print('lib none')\n"
    "for name in sorted(sums): print(name, repr(sums[name]))\n";

static void test_safetensors_python_loads(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    char path[512], script[512], cmd[1200];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    snprintf(script, sizeof script, "%s/check.py", dir);
    float w[12];
    for (int i = 0; i < 12; i++) w[i] = 0.125f * (float)(i - 5);
    float v[2] = {3.5f, -1.0f};
    SafetensorsTensor ts[] = {
        {.name = "tok_emb", .ndim = 2, .shape = {3, 4}, .numel = 12, .data = w},
        {.name = "final_norm", .ndim = 1, .shape = {2}, .numel = 2, .data = v},
    };
    SafetensorsMeta meta[] = {
        {.key = "format", .value = "pt"},
    };
    NsaError err;
    assert_int_equal(safetensorsWrite(path, ts, 2, meta, 1, &err), 0);
    writeBytes(script, python_check, strlen(python_check));
    snprintf(cmd, sizeof cmd, "python3 %s %s 2>&1", script, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[4096] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int status = pclose(p);
    if (status != 0) print_error("python3 said: %s\n", out);
    assert_int_equal(status, 0);
    /* sums: tok_emb = 0.125 * sum(-5..6) = 0.75, final_norm = 2.5 */
    assert_non_null(strstr(out, "final_norm 2.5\n"));
    assert_non_null(strstr(out, "tok_emb 0.75\n"));
    testRemoveTree(dir);
    free(dir);
}

static void expectReadError(const char *path, const char *fragment) {
    NsaError err = {{0}};
    Safetensors *st = safetensorsRead(path, &err);
    if (st) fail_msg("%s loaded; expected an error with '%s'", path, fragment);
    if (!strstr(err.message, fragment)) fail_msg("error '%s' lacks '%s'", err.message, fragment);
    /* every error names the file */
    assert_non_null(strstr(err.message, path));
}

static void test_safetensors_rejects_corrupt(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    float data[4] = {1, 2, 3, 4};

    writeBytes(path, "abc", 3);
    expectReadError(path, "too short");

    unsigned char huge[16] = {0xff, 0xff, 0xff, 0, 0, 0, 0, 0, '{', '}'};
    writeBytes(path, huge, 10);
    expectReadError(path, "exceeds the file");

    writeRaw(path, "[1,2]", NULL, 0);
    expectReadError(path, "not a JSON object");

    writeRaw(path, "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", data, 4);
    expectReadError(path, "dtype F16; allowed: F32");

    /* shape says 4 floats, offsets hold 3 */
    writeRaw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", data, 12);
    expectReadError(path, "shape needs 16");

    /* a gap between tensors */
    writeRaw(path,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             data, 12);
    expectReadError(path, "gap or overlap");

    /* truncated data */
    writeRaw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, 8);
    expectReadError(path, "truncated");

    writeRaw(path, "{\"__metadata__\":{\"k\":1}}", NULL, 0);
    expectReadError(path, "__metadata__.k is not a string");

    writeRaw(path, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", NULL, 0);
    expectReadError(path, "shape[0]");

    /* 2^62 elements: numel fits a size_t, numel * 4 wraps to 0 and would
     * match the empty span */
    writeRaw(path,
             "{\"big\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],"
             "\"data_offsets\":[0,0]}}",
             NULL, 0);
    expectReadError(path, "tensor big: shape holds 4611686018427387904 elements, whose byte size "
                          "overflows");

    NsaError err = {{0}};
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    assert_null(safetensorsRead(path, &err));
    assert_non_null(strstr(err.message, "No such file"));

    /* the writer fails cleanly into a directory that does not exist */
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", dir);
    SafetensorsTensor t = {.name = "a", .ndim = 1, .shape = {4}, .numel = 4, .data = data};
    assert_int_equal(safetensorsWrite(path, &t, 1, NULL, 0, &err), -1);
    assert_non_null(strstr(err.message, "no/such/dir"));
    /* and refuses a shape that disagrees with numel */
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    t.numel = 3;
    assert_int_equal(safetensorsWrite(path, &t, 1, NULL, 0, &err), -1);
    assert_non_null(strstr(err.message, "numel"));
    testRemoveTree(dir);
    free(dir);
}

/* ---- model checkpoints ------------------------------------------------- */

static NsaModel *tinyModel(int dim, uint64_t seed) {
    NsaModelConfig mc;
    nsaModelConfigDefaults(&mc);
    mc.dim = dim;
    mc.n_layers = 1;
    mc.n_heads = 2;
    mc.n_kv_groups = 1;
    mc.d_k = 8;
    mc.d_v = 8;
    mc.cmp_len = 4;
    mc.cmp_stride = 2;
    mc.sel_len = 4;
    mc.n_sel = 2;
    mc.window = 8;
    NsaEngineOptions eo = {.device = NSA_DEVICE_CPU, .precision = NSA_PREC_F32, .max_batch = 2,
                           .max_seq_len = 16, .threads = 1};
    NsaError err = {{0}};
    NsaModel *m = nsaModelCreate(&mc, &eo, &err);
    if (!m) fail_msg("nsaModelCreate: %s", err.message);
    assert_int_equal(nsaModelInit(m, seed, &err), 0);
    return m;
}

/* One optimizer step so the moments are not all zero. */
static void trainOneStep(NsaModel *m) {
    int32_t tokens[2 * 16], targets[2 * 16];
    for (int i = 0; i < 32; i++) {
        tokens[i] = (i * 37 + 11) % 256;
        targets[i] = (i * 53 + 7) % 256;
    }
    NsaError err;
    assert_int_equal(nsaModelZeroGrad(m, &err), 0);
    assert_int_equal(nsaModelForwardBackward(m, tokens, targets, 2, 16, 1.0f, &err), 0);
    NsaOptimConfig oc = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .grad_clip = 1.0f};
    assert_int_equal(nsaModelOptimizerStep(m, &oc, 1, &err), 0);
    NsaStepStats stats;
    assert_int_equal(nsaModelStepStats(m, &stats, &err), 0);
    assert_true(stats.applied);
}

static void assertArenasEqual(NsaModel *a, NsaModel *b, NsaArena arena) {
    size_t n = nsaModelNumParams(a);
    assert_int_equal(n, nsaModelNumParams(b));
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    NsaError err;
    for (int i = 0; i < nsaModelNumTensors(a); i++) {
        const NsaTensorInfo *info = nsaModelTensorInfo(a, i);
        assert_int_equal(nsaModelGetTensor(a, arena, i, x, &err), 0);
        assert_int_equal(nsaModelGetTensor(b, arena, i, y, &err), 0);
        if (memcmp(x, y, info->numel * sizeof(float)) != 0)
            fail_msg("arena %d tensor %s differs after the round trip", (int)arena, info->name);
    }
    free(x);
    free(y);
}

static void test_checkpoint_model_round_trip(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    NsaModel *a = tinyModel(16, 1);
    trainOneStep(a);
    ResumeState rs = {.step = 7, .data_position = 123456789012ull, .seed = 1337,
                      .config_hash = 0xfedcba9876543210ull, .tokens_seen = 4096, .anomalies = 2};
    NsaError err = {{0}};
    char saved[1024];
    assert_int_equal(checkpointSave(a, dir, &rs, 3, "{\"model\":{}}", saved, sizeof saved, &err), 0);
    char expect[1024];
    snprintf(expect, sizeof expect, "%s/checkpoints/step_00000007", dir);
    assert_string_equal(saved, expect);

    NsaModel *b = tinyModel(16, 99);  /* other weights, zero moments */
    ResumeState got;
    memset(&got, 0xab, sizeof got);
    if (checkpointLoad(b, saved, &got, &err) != 0) fail_msg("checkpointLoad: %s", err.message);
    assertArenasEqual(a, b, NSA_ARENA_PARAMS);
    assertArenasEqual(a, b, NSA_ARENA_ADAM_M);
    assertArenasEqual(a, b, NSA_ARENA_ADAM_V);
    assert_int_equal(got.step, 7);
    assert_true(got.data_position == 123456789012ull);
    assert_int_equal(got.seed, 1337);
    assert_true(got.config_hash == 0xfedcba9876543210ull);
    assert_int_equal(got.tokens_seen, 4096);
    assert_int_equal(got.anomalies, 2);

    /* the state alone reads the same */
    ResumeState only;
    assert_int_equal(checkpointReadState(saved, &only, &err), 0);
    assert_int_equal(only.step, 7);

    /* model.safetensors holds the engine's tensor names, state the moments */
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", saved);
    Safetensors *st = safetensorsRead(path, &err);
    assert_non_null(st);
    assert_int_equal(safetensorsCount(st), nsaModelNumTensors(a));
    assert_non_null(safetensorsFind(st, "tok_emb"));
    assert_non_null(safetensorsFind(st, "layers.0.wq"));
    assert_non_null(safetensorsFind(st, "lm_head"));
    assert_string_equal(safetensorsMeta(st, "format"), "pt");
    assert_string_equal(safetensorsMeta(st, "step"), "7");
    safetensorsFree(st);
    snprintf(path, sizeof path, "%s/state.safetensors", saved);
    st = safetensorsRead(path, &err);
    assert_non_null(st);
    assert_int_equal(safetensorsCount(st), 2 * nsaModelNumTensors(a));
    assert_non_null(safetensorsFind(st, "adam_m.tok_emb"));
    assert_non_null(safetensorsFind(st, "adam_v.lm_head"));
    assert_string_equal(safetensorsMeta(st, "config_hash"), "fedcba9876543210");
    safetensorsFree(st);

    nsaModelFree(a);
    nsaModelFree(b);
    testRemoveTree(dir);
    free(dir);
}

static void test_checkpoint_latest_and_keep_last(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    NsaModel *m = tinyModel(16, 3);
    NsaError err = {{0}};
    ResumeState rs = {.seed = 1, .config_hash = 5};
    char found[1024], expect[1024], path[1200];

    /* nothing saved yet: latest resolves to "none", a named dir is an error */
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 0);
    assert_int_equal(checkpointResolve(dir, NULL, found, sizeof found, &err), 0);
    assert_int_equal(checkpointResolve(dir, dir, found, sizeof found, &err), -1);
    assert_non_null(strstr(err.message, "neither a checkpoint directory"));

    for (int64_t s = 10; s <= 40; s += 10) {
        rs.step = s;
        assert_int_equal(checkpointSave(m, dir, &rs, 2, NULL, NULL, 0, &err), 0);
    }
    /* keep_last 2: 30 and 40 remain */
    for (int64_t s = 10; s <= 40; s += 10) {
        snprintf(path, sizeof path, "%s/checkpoints/step_%08d", dir, (int)s);
        assert_int_equal(fileExists(path), s >= 30);
    }
    snprintf(path, sizeof path, "%s/checkpoints/latest", dir);
    size_t len;
    unsigned char *latest = readFile(path, &len);
    assert_string_equal((char *)latest, "step_00000040\n");
    free(latest);

    snprintf(expect, sizeof expect, "%s/checkpoints/step_00000040", dir);
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 1);
    assert_string_equal(found, expect);
    /* a run directory resolves to its latest, a checkpoint dir to itself */
    assert_int_equal(checkpointResolve("/nonexistent", dir, found, sizeof found, &err), 1);
    assert_string_equal(found, expect);
    snprintf(expect, sizeof expect, "%s/checkpoints/step_00000030", dir);
    assert_int_equal(checkpointResolve("/nonexistent", expect, found, sizeof found, &err), 1);
    assert_string_equal(found, expect);
    /* without a run, the keywords name nothing (never the working directory) */
    const char *keywords[] = {"latest", "latest-valid", NULL};
    for (int k = 0; k < 3; k++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(checkpointResolve(NULL, keywords[k], found, sizeof found, &err), -1);
        assert_non_null(strstr(err.message, "needs a run to be the latest of"));
    }

    /* saving an older step again (resume from an older checkpoint) replaces
     * it and points latest at it; the newer one belongs to the abandoned
     * timeline and goes */
    rs.step = 30;
    rs.anomalies = 4;
    assert_int_equal(checkpointSave(m, dir, &rs, 2, NULL, NULL, 0, &err), 0);
    ResumeState got;
    assert_int_equal(checkpointReadState(expect, &got, &err), 0);
    assert_int_equal(got.anomalies, 4);
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 1);
    assert_string_equal(found, expect);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000040", dir);
    assert_false(fileExists(path));
    /* the run goes on from 30: keep_last counts its checkpoints, never the
     * abandoned timeline's (which would push them out): after 32 and 34,
     * 32 and 34 remain */
    rs.anomalies = 0;
    for (int64_t s = 32; s <= 34; s += 2) {
        rs.step = s;
        assert_int_equal(checkpointSave(m, dir, &rs, 2, NULL, NULL, 0, &err), 0);
    }
    const int64_t steps[] = {10, 20, 30, 32, 34, 40};
    for (int k = 0; k < 6; k++) {
        snprintf(path, sizeof path, "%s/checkpoints/step_%08d", dir, (int)steps[k]);
        assert_int_equal(fileExists(path), steps[k] >= 32 && steps[k] <= 34);
    }
    /* a rollback to 32 (latest moved back, 34 left behind), then a save at
     * 33: 32 and 33 are kept, the abandoned 34 goes */
    snprintf(path, sizeof path, "%s/checkpoints/latest", dir);
    writeBytes(path, "step_00000032\n", 14);
    rs.step = 33;
    assert_int_equal(checkpointSave(m, dir, &rs, 2, NULL, NULL, 0, &err), 0);
    const int64_t after[] = {32, 33, 34};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/checkpoints/step_%08d", dir, (int)after[k]);
        assert_int_equal(fileExists(path), after[k] != 34);
    }
    snprintf(expect, sizeof expect, "%s/checkpoints/step_00000030", dir);
    /* no temporary directories or files are left behind */
    snprintf(path, sizeof path, "%s/checkpoints/.step_00000030.tmp", dir);
    assert_false(fileExists(path));
    snprintf(path, sizeof path, "%s/checkpoints/.step_00000030.old", dir);
    assert_false(fileExists(path));
    snprintf(path, sizeof path, "%s/checkpoints/latest.tmp", dir);
    assert_false(fileExists(path));

    /* a latest pointer at a missing directory is an error, not "none" */
    snprintf(path, sizeof path, "%s/checkpoints/latest", dir);
    writeBytes(path, "step_00000099\n", 14);
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), -1);
    assert_non_null(strstr(err.message, "step_00000099"));
    writeBytes(path, "garbage\n", 8);
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), -1);
    assert_non_null(strstr(err.message, "garbage"));

    nsaModelFree(m);
    testRemoveTree(dir);
    free(dir);
}

static void test_checkpoint_rejects_other_model(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    NsaModel *small = tinyModel(16, 1);
    NsaModel *wide = tinyModel(32, 1);
    NsaError err = {{0}};
    ResumeState rs = {.step = 1};
    char saved[1024], path[1200];
    assert_int_equal(checkpointSave(small, dir, &rs, 0, NULL, saved, sizeof saved, &err), 0);
    assert_int_equal(checkpointLoad(wide, saved, &rs, &err), -1);
    assert_non_null(strstr(err.message, "tok_emb"));
    assert_non_null(strstr(err.message, "shape"));

    /* a missing state file fails naming it */
    snprintf(path, sizeof path, "%s/state.safetensors", saved);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(checkpointLoad(small, saved, &rs, &err), -1);
    assert_non_null(strstr(err.message, "state.safetensors"));

    /* a state file without the resume metadata is refused */
    float one = 1.0f;
    SafetensorsTensor t = {.name = "x", .ndim = 1, .shape = {1}, .numel = 1, .data = &one};
    assert_int_equal(safetensorsWrite(path, &t, 1, NULL, 0, &err), 0);
    assert_int_equal(checkpointReadState(saved, &rs, &err), -1);
    assert_non_null(strstr(err.message, "nsad_format"));

    nsaModelFree(small);
    nsaModelFree(wide);
    testRemoveTree(dir);
    free(dir);
}

/* CRC-32C: the published check values (RFC 3720 B.4), chaining, and the
 * hardware path against the portable one on every length and alignment. */
static void test_crc32c(void **state) {
    (void)state;
    unsigned char buf[600];
    assert_int_equal(crc32cUpdate(0, "123456789", 9), 0xe3069283u);
    memset(buf, 0, 32);
    assert_int_equal(crc32cUpdate(0, buf, 32), 0x8a9136aau);
    memset(buf, 0xff, 32);
    assert_int_equal(crc32cUpdate(0, buf, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    assert_int_equal(crc32cUpdate(0, buf, 32), 0x46dd794eu);
    assert_int_equal(crc32cPortable(0, buf, 32), 0x46dd794eu);
    NsaRng rng;
    nsaRngSeed(&rng, 39, 0);
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(nsaRngNext(&rng) >> 24);
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len + off <= sizeof buf; len += 7) {
            uint32_t whole = crc32cUpdate(0, buf + off, len);
            assert_int_equal(whole, crc32cPortable(0, buf + off, len));
            size_t cut = len / 3;
            assert_int_equal(crc32cUpdate(crc32cUpdate(0, buf + off, cut), buf + off + cut, len - cut), whole);
        }
    assert_int_equal(crc32cUpdate(0, NULL, 0), 0);
}

/* Flips one bit of a file at offset (from the end when negative). */
static void flipBit(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET), 0);
    int c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, -1, SEEK_CUR), 0);
    fputc(c ^ 0x04, f);
    fclose(f);
}

/* Replaces the first occurrence of from by to (same length) in a file. */
static void editFile(const char *path, const char *from, const char *to) {
    size_t len;
    unsigned char *buf = readFile(path, &len);
    assert_int_equal(strlen(from), strlen(to));
    unsigned char *at = memmem(buf, len, from, strlen(from));
    if (!at) fail_msg("%s holds no '%s'", path, from);
    memcpy(at, to, strlen(to));
    writeBytes(path, buf, len);
    free(buf);
}

static void expectLoadError(NsaModel *m, const char *dir, const char *needle) {
    NsaError err = {{0}};
    ResumeState rs;
    if (checkpointLoad(m, dir, &rs, &err) == 0) fail_msg("%s loaded; expected \"%s\"", dir, needle);
    if (!strstr(err.message, needle)) fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
    assert_null(strchr(err.message, '\n'));
}

/* Issue 39, item 5: single flipped bytes in the weights or the moments
 * loaded, and a state file edited to step 999 "resumed" there. */
static void test_checkpoint_damage_is_refused(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    NsaModel *m = tinyModel(16, 1);
    trainOneStep(m);
    ResumeState rs = {.step = 7, .seed = 1, .config_hash = 0x1234};
    NsaError err = {{0}};
    char saved[1024], model[1200], stfile[1200], manifest[1200];
    assert_int_equal(checkpointSave(m, dir, &rs, 0, NULL, saved, sizeof saved, &err), 0);
    assert_int_equal(checkpointVerify(saved, &err), 0);
    snprintf(model, sizeof model, "%s/model.safetensors", saved);
    snprintf(stfile, sizeof stfile, "%s/state.safetensors", saved);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", saved);
    size_t model_len, state_len, manifest_len;
    unsigned char *model_bytes = readFile(model, &model_len);
    unsigned char *state_bytes = readFile(stfile, &state_len);
    unsigned char *manifest_bytes = readFile(manifest, &manifest_len);

    /* a flipped bit in a weight, in a moment, in a header */
    flipBit(model, -5);
    expectLoadError(m, saved, "model.safetensors: CRC-32C");
    assert_int_equal(checkpointVerify(saved, &err), -1);
    assert_non_null(strstr(err.message, "the file is damaged"));
    writeBytes(model, model_bytes, model_len);
    flipBit(stfile, -1000);
    expectLoadError(m, saved, "state.safetensors: CRC-32C");
    writeBytes(stfile, state_bytes, state_len);
    flipBit(stfile, 20);
    expectLoadError(m, saved, "state.safetensors: CRC-32C");
    writeBytes(stfile, state_bytes, state_len);

    /* the step edited in the metadata: the checksum no longer matches ... */
    editFile(stfile, "\"step\":\"7\"", "\"step\":\"9\"");
    expectLoadError(m, saved, "state.safetensors: CRC-32C");
    /* ... and with the manifest's checksum forged to match, the metadata
     * still disagrees with the manifest */
    uint32_t crc = 0;
    {
        size_t len;
        unsigned char *edited = readFile(stfile, &len);
        /* the CRC-32C the edited file has, from the verifier's own message */
        free(edited);
        assert_int_equal(checkpointVerify(saved, &err), -1);
        const char *at = strstr(err.message, "CRC-32C ");
        assert_non_null(at);
        crc = (uint32_t)strtoul(at + 8, NULL, 16);
    }
    char old_crc[16], new_crc[16];
    {
        const char *at = strstr((const char *)manifest_bytes, "state.safetensors");
        assert_non_null(at);
        at = strstr(at, "\"crc32c\":");
        assert_non_null(at);
        at = strchr(at + 9, '"');
        snprintf(old_crc, sizeof old_crc, "%.8s", at + 1);
    }
    snprintf(new_crc, sizeof new_crc, "%08x", crc);
    editFile(manifest, old_crc, new_crc);
    assert_int_equal(checkpointVerify(saved, &err), 0);
    expectLoadError(m, saved, "__metadata__.step is '9' but the manifest says '7'");
    writeBytes(stfile, state_bytes, state_len);
    writeBytes(manifest, manifest_bytes, manifest_len);

    /* a manifest that claims another step than the directory's name */
    editFile(manifest, "\"step\":\t7", "\"step\":\t9");
    expectLoadError(m, saved, "says step 9 but the directory is step 7");
    writeBytes(manifest, manifest_bytes, manifest_len);
    /* a truncated file, a missing manifest (the save never finished) */
    writeBytes(model, model_bytes, model_len - 4);
    expectLoadError(m, saved, "the manifest says");
    writeBytes(model, model_bytes, model_len);
    assert_int_equal(unlink(manifest), 0);
    expectLoadError(m, saved, "no manifest.json: the checkpoint is incomplete");
    writeBytes(manifest, manifest_bytes, manifest_len);

    /* restored byte for byte, it loads again */
    ResumeState got;
    if (checkpointLoad(m, saved, &got, &err) != 0) fail_msg("checkpointLoad: %s", err.message);
    assert_int_equal(got.step, 7);
    free(model_bytes);
    free(state_bytes);
    free(manifest_bytes);
    nsaModelFree(m);
    testRemoveTree(dir);
    free(dir);
}

/* A checkpoint from before manifests (format nsad-checkpoint-1: the same
 * files and metadata, no manifest.json) still loads, marked unverified, and
 * gives back exactly what was saved; one that claims that format but whose
 * files disagree is refused naming the field. */
static void test_checkpoint_legacy_format_loads_unverified(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    NsaModel *m = tinyModel(16, 1);
    trainOneStep(m);
    ResumeState rs = {.step = 7, .seed = 1, .config_hash = 0x1234, .tokens_seen = 99};
    NsaError err = {{0}};
    char saved[1024], model[1200], stfile[1200], manifest[1200];
    assert_int_equal(checkpointSave(m, dir, &rs, 0, NULL, saved, sizeof saved, &err), 0);
    snprintf(model, sizeof model, "%s/model.safetensors", saved);
    snprintf(stfile, sizeof stfile, "%s/state.safetensors", saved);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", saved);
    /* what a format-1 save wrote */
    editFile(model, CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_LEGACY);
    editFile(stfile, CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_LEGACY);
    assert_int_equal(unlink(manifest), 0);

    assert_int_equal(checkpointVerify(saved, &err), 1);
    NsaModel *back = tinyModel(16, 2);
    ResumeState got = {0};
    if (checkpointLoad(back, saved, &got, &err) != 0) fail_msg("checkpointLoad: %s", err.message);
    assert_int_equal(got.legacy, 1);
    assert_int_equal(got.step, 7);
    assert_int_equal(got.tokens_seen, 99);
    assert_int_equal(got.config_hash, 0x1234);
    assertArenasEqual(m, back, NSA_ARENA_PARAMS);
    assertArenasEqual(m, back, NSA_ARENA_ADAM_M);
    assertArenasEqual(m, back, NSA_ARENA_ADAM_V);

    /* the two files disagree on the format */
    editFile(model, CHECKPOINT_FORMAT_LEGACY, CHECKPOINT_FORMAT);
    expectLoadError(back, saved, "__metadata__.nsad_format is 'nsad-checkpoint-2' but the manifest says "
                                 "'nsad-checkpoint-1'");
    editFile(model, CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_LEGACY);
    /* the directory's name and the state's step disagree */
    editFile(stfile, "\"step\":\"7\"", "\"step\":\"9\"");
    expectLoadError(back, saved, "says step 9 but the directory is step 7");
    assert_int_equal(checkpointVerify(saved, &err), -1);
    editFile(stfile, "\"step\":\"9\"", "\"step\":\"7\"");
    /* model.safetensors missing */
    assert_int_equal(unlink(model), 0);
    expectLoadError(back, saved, "model.safetensors: missing or not a regular file");
    nsaModelFree(back);
    nsaModelFree(m);
    testRemoveTree(dir);
    free(dir);
}

/* latest-valid: the newest checkpoint that verifies, naming the others. */
static void test_checkpoint_latest_valid_falls_back(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    NsaModel *m = tinyModel(16, 2);
    NsaError err = {{0}};
    ResumeState rs = {.seed = 1, .config_hash = 5};
    char found[1024], path[1200], skipped[1024];
    assert_int_equal(checkpointResolve(dir, "latest-valid", found, sizeof found, &err), 0);
    for (int64_t s = 10; s <= 30; s += 10) {
        rs.step = s;
        assert_int_equal(checkpointSave(m, dir, &rs, 0, NULL, NULL, 0, &err), 0);
    }
    snprintf(path, sizeof path, "%s/checkpoints/step_00000030/model.safetensors", dir);
    flipBit(path, -1);
    /* latest names the damaged one; loading it is refused */
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 1);
    assert_non_null(strstr(found, "step_00000030"));
    assert_int_equal(checkpointResolveValid(dir, found, sizeof found, skipped, sizeof skipped, &err), 1);
    assert_non_null(strstr(found, "step_00000020"));
    assert_non_null(strstr(skipped, "step_00000030/model.safetensors: CRC-32C"));
    /* a newer directory from an abandoned timeline (latest names 20) is
     * not a candidate */
    snprintf(path, sizeof path, "%s/checkpoints/latest", dir);
    writeBytes(path, "step_00000020\n", 14);
    assert_int_equal(checkpointResolveValid(dir, found, sizeof found, skipped, sizeof skipped, &err), 1);
    assert_non_null(strstr(found, "step_00000020"));
    assert_string_equal(skipped, "");
    /* all damaged: an error naming each */
    writeBytes(path, "step_00000030\n", 14);
    for (int s = 10; s <= 20; s += 10) {
        snprintf(path, sizeof path, "%s/checkpoints/step_%08d/state.safetensors", dir, s);
        flipBit(path, -1);
    }
    assert_int_equal(checkpointResolve(dir, "latest-valid", found, sizeof found, &err), -1);
    assert_non_null(strstr(err.message, "no valid checkpoint"));
    assert_non_null(strstr(err.message, "step_00000030"));
    assert_non_null(strstr(err.message, "step_00000010"));
    nsaModelFree(m);
    testRemoveTree(dir);
    free(dir);
}

/* Issue 39, items 6 and 7: a FIFO at checkpoints/latest hung resume
 * forever, and a binary latest was echoed raw. */
static void test_checkpoint_odd_files(void **state) {
    (void)state;
    char *dir = testTempDir("ckpt");
    NsaModel *m = tinyModel(16, 2);
    NsaError err = {{0}};
    ResumeState rs = {.step = 3, .seed = 1, .config_hash = 5};
    char found[1024], path[1200], saved[1024];
    assert_int_equal(checkpointSave(m, dir, &rs, 0, NULL, saved, sizeof saved, &err), 0);
    snprintf(path, sizeof path, "%s/checkpoints/latest", dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), -1);
    assert_non_null(strstr(err.message, "is a FIFO; allowed: a regular file"));
    /* latest-valid reads the directories themselves */
    assert_int_equal(checkpointResolve(dir, "latest-valid", found, sizeof found, &err), 1);
    assert_string_equal(found, saved);
    assert_int_equal(unlink(path), 0);
    writeBytes(path, "\x01\xff\x1b[2Jstep\n", 11);
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), -1);
    assert_non_null(strstr(err.message, "'\\x01\\xff\\x1b[2Jstep"));
    for (const char *c = err.message; *c; c++) assert_true((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f);
    /* latest removed but a step directory there: not "no checkpoint" */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), -1);
    assert_non_null(strstr(err.message, "latest is missing but 1 step_* directory exist"));
    /* a FIFO or a device as a checkpoint file is refused, not read */
    snprintf(path, sizeof path, "%s/model.safetensors", saved);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_null(safetensorsRead(path, &err));
    assert_non_null(strstr(err.message, "is a FIFO"));
    expectLoadError(m, saved, "is a FIFO");
    assert_null(safetensorsRead("/dev/zero", &err));
    assert_non_null(strstr(err.message, "is a character device"));
    /* two __metadata__ objects: refused (the second overflowed a buffer) */
    snprintf(path, sizeof path, "%s/meta2.safetensors", dir);
    writeRaw(path, "{\"__metadata__\":{\"a\":\"1\"},\"__metadata__\":{\"b\":\"2\",\"c\":\"3\"}}", NULL, 0);
    assert_null(safetensorsRead(path, &err));
    assert_non_null(strstr(err.message, "__metadata__ appears twice"));
    nsaModelFree(m);
    testRemoveTree(dir);
    free(dir);
}

/* ---- kills at every point of a save --------------------------------------- */

/* The out dir before the save under test. */
typedef void (*Fixture)(NsaModel *m, const char *dir);

static void saveSteps(NsaModel *m, const char *dir, const int64_t *steps, int n) {
    NsaError err = {{0}};
    for (int i = 0; i < n; i++) {
        ResumeState rs = {.step = steps[i], .seed = 1, .config_hash = 5};
        if (checkpointSave(m, dir, &rs, 0, NULL, NULL, 0, &err) != 0) fail_msg("fixture: %s", err.message);
    }
}
static void fixtureTenTwenty(NsaModel *m, const char *dir) { saveSteps(m, dir, (const int64_t[]){10, 20}, 2); }
static void fixtureTwenty(NsaModel *m, const char *dir) { saveSteps(m, dir, (const int64_t[]){20}, 1); }
static void fixtureEmpty(NsaModel *m, const char *dir) { (void)m; (void)dir; }

typedef struct CrashCase {
    const char *what;
    Fixture fixture;
    int64_t step;       /* the save under test */
    int keep_last;
    int no_exchange;    /* the file system has no RENAME_EXCHANGE */
    int latest_may_vanish; /* no other complete checkpoint exists to point at meanwhile */
    int replaces;          /* the fixture has the step already, and latest names it */
} CrashCase;

/* Checks what must hold after any kill: latest, when present, names a
 * directory that verifies; every step_* directory holds both files and
 * verifies; some checkpoint is found unless none existed. */
static void checkAfterKill(const CrashCase *c, const char *dir, long k) {
    char ck[1100], path[1400], found[1024];
    NsaError err = {{0}};
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    snprintf(path, sizeof path, "%s/latest", ck);
    int have_latest = fileExists(path);
    if (have_latest) {
        if (checkpointResolve(dir, "latest", found, sizeof found, &err) != 1)
            fail_msg("%s, kill %ld: latest: %s", c->what, k, err.message);
        if (checkpointVerify(found, &err) != 0) fail_msg("%s, kill %ld: latest: %s", c->what, k, err.message);
    } else if (c->fixture != fixtureEmpty && !c->latest_may_vanish) {
        fail_msg("%s, kill %ld: latest is gone", c->what, k);
    }
    DIR *d = opendir(ck);
    struct dirent *e;
    int steps = 0;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "step_", 5) != 0) continue;
        steps++;
        for (int f = 0; f < 2; f++) {
            snprintf(path, sizeof path, "%s/%s/%s", ck, e->d_name, f ? "state.safetensors" : "model.safetensors");
            if (!fileExists(path)) fail_msg("%s, kill %ld: %s is missing", c->what, k, path);
        }
        snprintf(path, sizeof path, "%s/%s", ck, e->d_name);
        if (checkpointVerify(path, &err) != 0) fail_msg("%s, kill %ld: %s", c->what, k, err.message);
    }
    if (d) closedir(d);
    if (c->fixture != fixtureEmpty && !c->latest_may_vanish && steps == 0)
        fail_msg("%s, kill %ld: no checkpoint left", c->what, k);
}

/* After a kill, the sweep a resume runs (checkpointSweep), itself killed
 * at each of its changes in turn until it completes: what checkAfterKill
 * checks holds after each kill, and at the end nothing is left over and a
 * step the save was replacing is there once, complete, with latest on it:
 * the save's copy once the replacement's first rename was done (its
 * .old exists). Returns the number of kills in the sweep. */
static long checkAfterSweep(const CrashCase *c, const char *dir, long k) {
    char ck[1100], final_dir[1200], old_dir[1200], found[1024];
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    snprintf(final_dir, sizeof final_dir, "%s/step_%08lld", ck, (long long)c->step);
    snprintf(old_dir, sizeof old_dir, "%s/.step_%08lld.old", ck, (long long)c->step);
    const int cut = fileExists(old_dir);
    long kills = 0;
    for (long j = 0;; j++) {
        if (j == 100) fail_msg("%s, kill %ld: the sweep never completed", c->what, k);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            NsaError cerr;
            crash_budget = j;
            int rc = checkpointSweep(dir, &cerr);
            if (rc != 0) fprintf(stderr, "sweep: %s\n", cerr.message);
            _exit(rc == 0 ? 0 : 1);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        int code = WEXITSTATUS(status);
        if (code != 0 && code != CRASHED) fail_msg("%s, kill %ld: the sweep failed", c->what, k);
        checkAfterKill(c, dir, k);
        if (code == 0) break;
        kills++;
    }
    DIR *d = opendir(ck);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            fail_msg("%s, kill %ld: %s left after the sweep", c->what, k, e->d_name);
    if (d) closedir(d);
    if (!c->replaces) return kills;
    NsaError err = {{0}};
    if (checkpointResolve(dir, "latest", found, sizeof found, &err) != 1)
        fail_msg("%s, kill %ld: latest after the sweep: %s", c->what, k, err.message);
    if (strcmp(found, final_dir) != 0)
        fail_msg("%s, kill %ld: latest names %s, not the step being replaced", c->what, k, found);
    ResumeState got;
    assert_int_equal(checkpointReadState(final_dir, &got, &err), 0);
    if (cut && got.anomalies != 7)
        fail_msg("%s, kill %ld: the old copy was kept; the new one was complete", c->what, k);
    return kills;
}

/* Issue 39, items 4 and 7: a kill between the two renames that replace
 * the step directory `latest` names left latest pointing at nothing, and
 * a kill during pruning left an old directory missing a file. Kills the
 * save at each of its file-system changes in turn, until it completes;
 * after each kill, the sweep must keep the step being replaced
 * (checkAfterSweep). */
static void test_checkpoint_survives_a_kill_anywhere(void **state) {
    (void)state;
    const CrashCase cases[] = {
        {.what = "replacing the step latest names", .fixture = fixtureTenTwenty, .step = 20,
         .keep_last = 0, .no_exchange = 0, .latest_may_vanish = 0, .replaces = 1},
        {.what = "replacing it without RENAME_EXCHANGE", .fixture = fixtureTenTwenty, .step = 20,
         .keep_last = 0, .no_exchange = 1, .latest_may_vanish = 0, .replaces = 1},
        {.what = "replacing the only one without RENAME_EXCHANGE", .fixture = fixtureTwenty,
         .step = 20, .keep_last = 0, .no_exchange = 1, .latest_may_vanish = 1, .replaces = 1},
        {.what = "saving and pruning (keep_last 2)", .fixture = fixtureTenTwenty, .step = 30,
         .keep_last = 2, .no_exchange = 0, .latest_may_vanish = 0},
        {.what = "the first save", .fixture = fixtureEmpty, .step = 5, .keep_last = 0,
         .no_exchange = 0, .latest_may_vanish = 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const CrashCase *c = &cases[i];
        int completed = 0;
        long kills = 0, sweep_kills = 0;
        for (long k = 0; !completed && k < 200; k++) {
            char *dir = testTempDir("crash");
            NsaModel *m = tinyModel(16, 4);
            c->fixture(m, dir);
            nsaModelFree(m);
            pid_t pid = fork();
            assert_true(pid >= 0);
            if (pid == 0) {
                NsaModel *child = tinyModel(16, 5); /* other weights than the fixture's */
                ResumeState rs = {.step = c->step, .seed = 1, .config_hash = 5, .anomalies = 7};
                NsaError cerr;
                crash_budget = k;
                exchange_missing = c->no_exchange;
                int rc = checkpointSave(child, dir, &rs, c->keep_last, NULL, NULL, 0, &cerr);
                if (rc != 0) fprintf(stderr, "save: %s\n", cerr.message);
                _exit(rc == 0 ? 0 : 1);
            }
            int status;
            assert_int_equal(waitpid(pid, &status, 0), pid);
            assert_true(WIFEXITED(status));
            int code = WEXITSTATUS(status);
            if (code != 0 && code != CRASHED) fail_msg("%s: the save failed (kill %ld)", c->what, k);
            checkAfterKill(c, dir, k);
            if (code == 0) {
                completed = 1;
                char found[1024], want[64];
                NsaError err;
                ResumeState got;
                assert_int_equal(checkpointResolve(dir, "latest", found, sizeof found, &err), 1);
                snprintf(want, sizeof want, "step_%08lld", (long long)c->step);
                assert_non_null(strstr(found, want));
                assert_int_equal(checkpointReadState(found, &got, &err), 0);
                assert_int_equal(got.anomalies, 7);
            } else {
                kills++;
            }
            sweep_kills += checkAfterSweep(c, dir, k);
            testRemoveTree(dir);
            free(dir);
        }
        if (!completed) fail_msg("%s: the save never completed", c->what);
        print_message("# %s: killed at each of %ld points, then completed; the sweeps after "
                      "the kills, killed %ld times in all, then completed\n",
                      c->what, kills, sweep_kills);
    }
}

/* ---- a replacement cut between its two renames --------------------------- */

/* dir/checkpoints/<name> */
static void ckPath(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/checkpoints/%s", dir, name);
}

/* A complete copy of step 20 from other weights (anomalies 7, the mark of
 * the new copy) left as dir's .step_00000020.tmp, as a save makes it. */
static void newCopyAsTmp(const char *dir) {
    char *other = testTempDir("cut-new");
    NsaModel *m = tinyModel(16, 5);
    NsaError err = {{0}};
    ResumeState rs = {.step = 20, .seed = 1, .config_hash = 5, .anomalies = 7};
    char saved[1024], tmp[1200];
    if (checkpointSave(m, other, &rs, 0, NULL, saved, sizeof saved, &err) != 0)
        fail_msg("%s", err.message);
    ckPath(tmp, sizeof tmp, dir, ".step_00000020.tmp");
    assert_int_equal(rename(saved, tmp), 0);
    nsaModelFree(m);
    testRemoveTree(other);
    free(other);
}

/* Where the file system has no RENAME_EXCHANGE, replacing step_N takes two
 * renames: step_N to .step_N.old, then .step_N.tmp to step_N. A kill
 * between them left only .old and the new .tmp, and the next save's sweep
 * removed both: the step was gone. The sweep now finishes the
 * replacement: the new copy when it verifies, else the old one. */
static void test_checkpoint_cut_replacement_keeps_the_step(void **state) {
    (void)state;
    for (int damaged = 0; damaged < 2; damaged++) {
        char *dir = testTempDir("cut");
        NsaModel *m = tinyModel(16, 4);
        saveSteps(m, dir, (const int64_t[]){10, 20}, 2);
        newCopyAsTmp(dir);
        char final_dir[1200], old_dir[1200], tmp_dir[1200], path[1400];
        ckPath(final_dir, sizeof final_dir, dir, "step_00000020");
        ckPath(old_dir, sizeof old_dir, dir, ".step_00000020.old");
        ckPath(tmp_dir, sizeof tmp_dir, dir, ".step_00000020.tmp");
        if (damaged) { /* the new copy's weights, one byte off */
            snprintf(path, sizeof path, "%s/model.safetensors", tmp_dir);
            size_t len;
            unsigned char *bytes = readFile(path, &len);
            bytes[len - 1] ^= 0x40;
            writeBytes(path, bytes, len);
            free(bytes);
        }
        assert_int_equal(rename(final_dir, old_dir), 0); /* the first rename, then the kill */

        /* the next save sweeps first */
        NsaError err = {{0}};
        ResumeState rs = {.step = 30, .seed = 1, .config_hash = 5};
        if (checkpointSave(m, dir, &rs, 0, NULL, NULL, 0, &err) != 0)
            fail_msg("save: %s", err.message);
        if (!fileExists(final_dir)) fail_msg("damaged=%d: step_00000020 is gone", damaged);
        if (checkpointVerify(final_dir, &err) != 0)
            fail_msg("damaged=%d: %s", damaged, err.message);
        ResumeState got;
        assert_int_equal(checkpointReadState(final_dir, &got, &err), 0);
        assert_int_equal(got.anomalies, damaged ? 0 : 7); /* the new copy, unless it is damaged */
        assert_false(fileExists(old_dir));
        assert_false(fileExists(tmp_dir));
        nsaModelFree(m);
        testRemoveTree(dir);
        free(dir);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_round_trip),
        cmocka_unit_test(test_safetensors_python_loads),
        cmocka_unit_test(test_safetensors_rejects_corrupt),
        cmocka_unit_test(test_checkpoint_model_round_trip),
        cmocka_unit_test(test_checkpoint_latest_and_keep_last),
        cmocka_unit_test(test_checkpoint_rejects_other_model),
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_checkpoint_damage_is_refused),
        cmocka_unit_test(test_checkpoint_legacy_format_loads_unverified),
        cmocka_unit_test(test_checkpoint_latest_valid_falls_back),
        cmocka_unit_test(test_checkpoint_odd_files),
        cmocka_unit_test(test_checkpoint_survives_a_kill_anywhere),
        cmocka_unit_test(test_checkpoint_cut_replacement_keeps_the_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
