/* test_config.c - job configs: the shipped files load, JSON loads, every
 * class of bad input gets its one-line message, the resolved YAML reads back
 * to the same struct, and `nsad check` exits 0 / 78 / 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "artifacts.h"
#include "commands.h"
#include "config.h"
#include "testutil.h"

static const char *const shipped[] = {"configs/tiny-cpu.yaml", "configs/prototype-smoke.yaml",
                                      "configs/prototype-125m.yaml", "configs/long-context.yaml"};

/* Loads text over the defaults; returns configLoadString's result. */
static int load(JobConfig *cfg, const char *text, NsaError *err) {
    configDefaults(cfg);
    memset(err, 0, sizeof *err);
    return configLoadString(cfg, text, strlen(text), err);
}

/* Asserts that env.json's config (artifactsConfigJson) spells
 * runtime.gradient_checkpointing as want: "true", "false" or a string. */
static void assertEnvRecompute(const JobConfig *cfg, const char *want) {
    cJSON *all = artifactsConfigJson(cfg);
    assert_non_null(all);
    const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(all, "runtime"), "gradient_checkpointing");
    if (!strcmp(want, "true")) assert_true(cJSON_IsTrue(v));
    else if (!strcmp(want, "false")) assert_true(cJSON_IsFalse(v));
    else assert_string_equal(cJSON_GetStringValue(v), want);
    cJSON_Delete(all);
}

/* Asserts that text fails to load and that the message holds every needle. */
static void expectError(const char *text, ...) {
    JobConfig cfg;
    NsaError err;
    int rc = load(&cfg, text, &err);
    if (rc == 0) fail_msg("loaded but should fail:\n%s", text);
    assert_null(strchr(err.message, '\n'));  /* one line */
    va_list ap;
    va_start(ap, text);
    for (const char *needle; (needle = va_arg(ap, const char *));) {
        if (!strstr(err.message, needle))
            fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
    }
    va_end(ap);
}

/* Compares two configs on everything but the warnings. */
static void assertSameConfig(const JobConfig *a, const JobConfig *b) {
    assert_memory_equal(a, b, offsetof(JobConfig, n_warnings));
}

static void test_shipped_configs_load(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
        JobConfig cfg;
        NsaError err = {{0}};
        configDefaults(&cfg);
        if (configLoadFile(&cfg, shipped[i], &err) != 0) fail_msg("%s: %s", shipped[i], err.message);
    }
}

static void test_prototype_configs_keep_their_values(void **state) {
    (void)state;
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, "configs/prototype-125m.yaml", &err), 0);
    assert_int_equal(cfg.model.dim, 768);
    assert_int_equal(cfg.model.n_layers, 12);
    assert_int_equal(cfg.model.n_heads, 12);
    assert_int_equal(cfg.model.n_kv_groups, 2);
    assert_int_equal(cfg.model.d_k, 64);
    assert_int_equal(cfg.model.d_v, 64);
    assert_int_equal(cfg.model.cmp_len, 32);
    assert_int_equal(cfg.model.cmp_stride, 16);
    assert_int_equal(cfg.model.sel_len, 64);
    assert_int_equal(cfg.model.n_sel, 16);
    assert_int_equal(cfg.model.window, 512);
    assert_int_equal(cfg.train.seq_len, 2048);
    assert_int_equal(cfg.runtime.precision, NSA_PREC_BF16);
    assert_int_equal(cfg.runtime.device, NSA_DEVICE_CUDA);
    assert_int_equal(cfg.runtime.device_auto, 0);

    /* the prototype-only switches load, each with a warning naming it */
    const char *expected[] = {"model.use_triton", "runtime.use_flash_attn", "runtime.compile:"};
    for (size_t i = 0; i < 3; i++) {
        int found = 0;
        for (int w = 0; w < cfg.n_warnings; w++) found |= strstr(cfg.warnings[w], expected[i]) != NULL;
        if (!found) fail_msg("no warning for %s", expected[i]);
    }

    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, "configs/long-context.yaml", &err), 0);
    assert_int_equal(cfg.train.seq_len, 32768);
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, "configs/tiny-cpu.yaml", &err), 0);
    assert_int_equal(cfg.runtime.device, NSA_DEVICE_CPU);
    assert_int_equal(cfg.data.source, DATA_TEXT);
    assert_int_equal(cfg.n_warnings, 0);
}

static int hasWarning(const JobConfig *cfg, const char *needle) {
    for (int w = 0; w < cfg->n_warnings; w++)
        if (strstr(cfg->warnings[w], needle)) return 1;
    return 0;
}

/* A file in the prototype's own key style loads: its kernel switches warn
 * (or load silently where false is what nsad does), max_grad_norm is
 * grad_clip, lr_schedule cosine and bfloat16 are honoured, and gpt2 sets
 * the vocabulary. */
static void test_prototype_key_style(void **state) {
    (void)state;
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    if (configLoadFile(&cfg, "tests/configs/prototype-style.yaml", &err) != 0) fail_msg("%s", err.message);
    assert_true(cfg.train.grad_clip == 0.5);
    assert_int_equal(cfg.train.lr_schedule, LR_SCHEDULE_COSINE);
    assert_int_equal(cfg.runtime.precision, NSA_PREC_BF16);
    assert_int_equal(cfg.runtime.precision_auto, 0);
    assert_string_equal(cfg.data.tokenizer, "gpt2");
    assert_int_equal(cfg.model.vocab_size, 50257);
    const char *warned[] = {"runtime.use_flash: true ignored", "runtime.use_triton_sel: true ignored",
                            "runtime.sel_triton_min_L: 4096 ignored", "runtime.fa2_enabled: True ignored",
                            "runtime.fa2_min_len_win: 2048 ignored", "runtime.fa2_min_len_cmp: 8192 ignored"};
    for (size_t i = 0; i < sizeof warned / sizeof warned[0]; i++)
        if (!hasWarning(&cfg, warned[i])) fail_msg("no warning \"%s\"", warned[i]);
    assert_false(hasWarning(&cfg, "compile_cmp_win"));  /* false: nsad compiles nothing at run time */
    assert_int_equal(cfg.runtime.gradient_checkpointing, 1);  /* honoured: activation recompute on cuda */
    assert_false(hasWarning(&cfg, "gradient_checkpointing"));
    assert_int_equal(cfg.n_warnings, 6);
    assert_false(hasWarning(&cfg, "max_grad_norm"));
    assert_false(hasWarning(&cfg, "lr_schedule"));

    /* the resolved form spells it nsad's way and reads back the same */
    char *yaml = configToYaml(&cfg);
    assert_non_null(yaml);
    assert_non_null(strstr(yaml, "  grad_clip: 0.5\n"));
    assert_non_null(strstr(yaml, "  lr_schedule: cosine\n"));
    assert_non_null(strstr(yaml, "  vocab_size: 50257\n"));
    assert_non_null(strstr(yaml, "  gradient_checkpointing: true\n"));
    JobConfig back;
    if (load(&back, yaml, &err) != 0) fail_msg("%s", err.message);
    assertSameConfig(&cfg, &back);
    free(yaml);

    /* float16, the other spelling; false switches load silently */
    assert_int_equal(load(&cfg, "runtime:\n  device: cuda\n  precision: float16\n  use_flash: false\n"
                                "  gradient_checkpointing: off\n  fa2_enabled: no\n", &err), 0);
    assert_int_equal(cfg.runtime.precision, NSA_PREC_FP16);
    assert_int_equal(cfg.runtime.gradient_checkpointing, 0);
    assert_int_equal(cfg.n_warnings, 0);
    /* on the CPU engine there is nothing to recompute: said, not hidden */
    assert_int_equal(load(&cfg, "runtime:\n  device: cpu\n  gradient_checkpointing: yes\n", &err), 0);
    assert_true(hasWarning(&cfg, "runtime.gradient_checkpointing: true has no effect on device cpu"));
    expectError("runtime:\n  gradient_checkpointing: sometimes\n", "runtime.gradient_checkpointing", "sometimes",
                "allowed: false, true, selective", NULL);
    /* selective recompute: nsad's third value, written back as it reads */
    assert_int_equal(load(&cfg, "runtime:\n  device: cuda\n  gradient_checkpointing: selective\n", &err), 0);
    assert_int_equal(cfg.runtime.gradient_checkpointing, NSA_RECOMPUTE_SELECTIVE);
    assert_int_equal(cfg.n_warnings, 0);
    yaml = configToYaml(&cfg);
    assert_non_null(yaml);
    assert_non_null(strstr(yaml, "  gradient_checkpointing: selective\n"));
    if (load(&back, yaml, &err) != 0) fail_msg("%s", err.message);
    assertSameConfig(&cfg, &back);
    free(yaml);
    assertEnvRecompute(&cfg, "selective");
    assert_int_equal(load(&cfg, "runtime:\n  device: cuda\n  gradient_checkpointing: layer\n", &err), 0);
    assert_int_equal(cfg.runtime.gradient_checkpointing, NSA_RECOMPUTE_LAYER);
    assertEnvRecompute(&cfg, "true");
    assert_int_equal(load(&cfg, "runtime:\n  device: cuda\n  gradient_checkpointing: no\n", &err), 0);
    assertEnvRecompute(&cfg, "false");
    assert_int_equal(load(&cfg, "runtime:\n  device: cpu\n  gradient_checkpointing: selective\n", &err), 0);
    assert_true(hasWarning(&cfg, "runtime.gradient_checkpointing: selective has no effect on device cpu"));
    /* both spellings of the clip: fine when they agree */
    assert_int_equal(load(&cfg, "train:\n  grad_clip: 2.0\n  max_grad_norm: 2\n", &err), 0);
    assert_true(cfg.train.grad_clip == 2.0);
    assert_int_equal(load(&cfg, "train:\n  max_grad_norm: 0\n", &err), 0);
    assert_true(cfg.train.grad_clip == 0);
    /* gpt2 with token shards; an explicit vocabulary wins when it is big enough */
    assert_int_equal(load(&cfg, "data:\n  source: shards\n  path: x.bin\n  tokenizer: gpt2\n"
                                "model:\n  vocab_size: 50304\n", &err), 0);
    assert_int_equal(cfg.model.vocab_size, 50304);
    assert_int_equal(load(&cfg, "data:\n  source: shards\n  path: x.bin\n  tokenizer: gpt2\n", &err), 0);
    assert_int_equal(cfg.model.vocab_size, 50257);

    /* and what stays an error names the key, the value and what is allowed */
    expectError("train:\n  grad_clip: 1.0\n  max_grad_norm: 0.5\n", "line 3", "train.max_grad_norm", "0.5",
                "disagrees with train.grad_clip: 1.0 (line 2)", "allowed: one of the two", NULL);
    expectError("train:\n  max_grad_norm: 0.5\n  grad_clip: 1.0\n", "train.grad_clip", "1.0",
                "disagrees with train.max_grad_norm: 0.5", "prototype's name for train.grad_clip", NULL);
    expectError("train:\n  max_grad_norm: -1\n", "train.grad_clip", "-1", "out of range", NULL);
    expectError("train:\n  lr_schedule: linear\n", "train.lr_schedule", "linear", "not a known value",
                "allowed: cosine", "linear warmup", NULL);
    expectError("runtime:\n  use_flash: maybe\n", "runtime.use_flash", "maybe", "not a boolean",
                "allowed: true or false", NULL);
    expectError("runtime:\n  use_flash: \"true\"\n", "runtime.use_flash", "not a boolean", NULL);
    expectError("runtime:\n  fa2_min_len_win: -5\n", "runtime.fa2_min_len_win", "-5", "not a count",
                "an integer >= 0", NULL);
    expectError("runtime:\n  sel_triton_min_L: 1e4\n", "runtime.sel_triton_min_L", "1e4", "not a count", NULL);
    expectError("runtime:\n  use_flashy: true\n", "runtime.use_flashy", "unknown key", NULL);
    expectError("data:\n  source: text\n  path: corpus.txt\n  tokenizer: gpt2\n", "data.tokenizer",
                "\"gpt2\" cannot tokenize text", "allowed: byte with text", "data.source shards", NULL);
    expectError("data:\n  source: shards\n  path: x.bin\n  tokenizer: gpt2\nmodel:\n  vocab_size: 256\n",
                "model.vocab_size", "256", "gpt2", "at least 50257", NULL);
    expectError("train:\n  clip: 1\n", "train.clip", "unknown key", "max_grad_norm", NULL);
}

static void test_defaults_are_valid(void **state) {
    (void)state;
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    if (configValidate(&cfg, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(cfg.model.dim, 768);
    assert_int_equal(cfg.data.source, DATA_SYNTHETIC);
    assert_int_equal(cfg.runtime.device_auto, 1);
    assert_true(cfg.runtime.threads >= 1);  /* 0 resolves to the core count */
    NsaError err2;
    assert_int_equal(load(&cfg, "runtime:\n  threads: 0\n", &err2), 0);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(cfg.runtime.threads, cores > 256 ? 256 : (int)cores);
    /* the engine's most (nsaModelCreate), not a count it refuses at start */
    assert_int_equal(load(&cfg, "runtime:\n  threads: 256\n", &err2), 0);
    assert_int_equal(load(&cfg, "runtime:\n  threads: 257\n", &err2), -1);
    assert_non_null(strstr(err2.message, "runtime.threads"));
}

static void test_json_loads_like_yaml(void **state) {
    (void)state;
    const char *yaml =
        "model:\n  dim: 64\n  n_layers: 2\n  n_heads: 4\n  n_kv_groups: 2\n  d_k: 16\n  d_v: 8\n"
        "nsa:\n  l: 8\n  d: 4\n  l_sel: 16\n  n_sel: 4\n  w: 32\n  phi: mlp\n"
        "train:\n  lr: 3.0e-4\n  seq_len: 128\n  out_dir: \"runs/x y\"\n  seed: 7\n"
        "runtime:\n  device: cpu\n  precision: fp32\n";
    const char *json_compact =
        "{\"model\":{\"dim\":64,\"n_layers\":2,\"n_heads\":4,\"n_kv_groups\":2,\"d_k\":16,\"d_v\":8},"
        "\"nsa\":{\"l\":8,\"d\":4,\"l_sel\":16,\"n_sel\":4,\"w\":32,\"phi\":\"mlp\"},"
        "\"train\":{\"lr\":3e-4,\"seq_len\":128,\"out_dir\":\"runs/x y\",\"seed\":7},"
        "\"runtime\":{\"device\":\"cpu\",\"precision\":\"fp32\"}}";
    const char *json_pretty =
        "{\n\t\"model\": {\n\t\t\"dim\": 64, \"n_layers\": 2, \"n_heads\": 4, \"n_kv_groups\": 2,\n"
        "\t\t\"d_k\": 16, \"d_v\": 8\n\t},\n"
        "\t\"nsa\": {\"l\": 8, \"d\": 4, \"l_sel\": 16, \"n_sel\": 4, \"w\": 32, \"phi\": \"mlp\"},\n"
        "\t\"train\": {\"lr\": 0.0003, \"seq_len\": 128, \"out_dir\": \"runs/x y\", \"seed\": 7},\n"
        "\t\"runtime\": {\"device\": \"cpu\", \"precision\": \"fp32\"}\n}\n";
    JobConfig a, b, c;
    NsaError err;
    if (load(&a, yaml, &err) != 0) fail_msg("yaml: %s", err.message);
    if (load(&b, json_compact, &err) != 0) fail_msg("compact json: %s", err.message);
    if (load(&c, json_pretty, &err) != 0) fail_msg("pretty json: %s", err.message);
    assert_int_equal(a.model.d_v, 8);
    assert_int_equal(a.model.phi, NSA_PHI_MLP);
    assert_string_equal(a.train.out_dir, "runs/x y");
    assertSameConfig(&a, &b);
    assertSameConfig(&a, &c);
    /* JSON's own mistakes are still named */
    expectError("{\"model\": {\"dim\": \"64\"}}", "model.dim", "\"64\"", "not an integer", NULL);
    expectError("{\"model\": {\"dim\": 64}", "malformed YAML", NULL);
    expectError("{\"model\": {\"dim\": 64 \"n_layers\": 2}}", "malformed YAML", "line 1", NULL);
}

static void test_resolved_yaml_reads_back(void **state) {
    (void)state;
    for (size_t i = 0; i <= sizeof shipped / sizeof shipped[0]; i++) {
        JobConfig a, b;
        NsaError err = {{0}};
        configDefaults(&a);
        if (i < sizeof shipped / sizeof shipped[0] && configLoadFile(&a, shipped[i], &err) != 0)
            fail_msg("%s: %s", shipped[i], err.message);
        char *yaml = configToYaml(&a);
        assert_non_null(yaml);
        if (load(&b, yaml, &err) != 0) fail_msg("%s\n%s", err.message, yaml);
        assertSameConfig(&a, &b);
        assert_int_equal(b.n_warnings, 0);
        free(yaml);
    }
}

static void test_unknown_key(void **state) {
    (void)state;
    expectError("model:\n  dim: 64\n  dimm: 64\n", "line 3", "model.dimm", "unknown key", "allowed:",
                "did you mean dim", NULL);
    expectError("modle:\n  dim: 64\n", "line 1", "modle", "unknown section", "did you mean model", NULL);
    expectError("train:\n  learning_rate: 0.1\n", "train.learning_rate", "unknown key", "lr", NULL);
}

static void test_wrong_type(void **state) {
    (void)state;
    expectError("model:\n  dim: \"64\"\n", "line 2", "model.dim", "\"64\"", "not an integer",
                "allowed: an integer from 1 to 65536", NULL);
    expectError("model:\n  dim: 6.5\n", "model.dim", "6.5", "not an integer", NULL);
    expectError("model:\n  dim: [64]\n", "model.dim", "a list", "not an integer", NULL);
    expectError("model:\n  dim:\n", "model.dim", "not an integer", NULL);
    expectError("train:\n  lr: fast\n", "train.lr", "fast", "not a number", NULL);
    expectError("train:\n  lr: .nan\n", "train.lr", "not a number", NULL);
    expectError("train:\n  out_dir: {a: 1}\n", "train.out_dir", "a mapping", "not a string", NULL);
    expectError("model: 5\n", "model", "5", "not a mapping", "dim, n_layers", NULL);
    expectError("- model\n", "config", "a list", "not a mapping", NULL);
}

static void test_out_of_range(void **state) {
    (void)state;
    expectError("model:\n  dim: 0\n", "model.dim", "0", "out of range", "from 1 to 65536", NULL);
    expectError("model:\n  dim: 99999999999999999999\n", "model.dim", "out of range", NULL);
    expectError("train:\n  lr: 0\n", "train.lr", "out of range", "0 < x", NULL);  /* open minimum */
    expectError("train:\n  beta2: 1.0\n", "train.beta2", "1.0", "out of range", "< 1", NULL);
    expectError("train:\n  steps: -5\n", "train.steps", "-5", "out of range", NULL);
    expectError("data:\n  val_fraction: 0.9\n", "data.val_fraction", "0.9", "0 to 0.5", NULL);
    expectError("train:\n  lr: 0.001\n  min_lr: 0.01\n", "train.min_lr", "above train.lr", NULL);
    expectError("train:\n  seed: -1\n", "train.seed", "not an integer", NULL);

    JobConfig cfg;
    NsaError err;
    assert_int_equal(load(&cfg, "train:\n  seed: 18446744073709551615\n  steps: 1_000_000\n", &err), 0);
    assert_true(cfg.train.seed == UINT64_MAX);
    assert_int_equal(cfg.train.steps, 1000000);

    /* structs filled in code get the same range checks */
    configDefaults(&cfg);
    cfg.train.batch_size = 0;
    assert_int_equal(configValidate(&cfg, &err), -1);
    assert_non_null(strstr(err.message, "train.batch_size"));
}

static void test_not_divisible(void **state) {
    (void)state;
    expectError("nsa:\n  l: 32\n  d: 5\n  l_sel: 64\n", "nsa.d: 5 does not divide nsa.l (32)",
                "allowed: a divisor of l and l_sel", NULL);
    expectError("nsa:\n  l: 32\n  d: 16\n  l_sel: 24\n", "nsa.d: 16 does not divide nsa.l_sel (24)", NULL);
    expectError("model:\n  n_heads: 12\n  n_kv_groups: 5\n",
                "model.n_heads: 12 is not divisible by model.n_kv_groups (5)", NULL);
    expectError("model:\n  d_k: 63\n", "model.d_k: 63 is odd", NULL);
}

static void test_bad_enum(void **state) {
    (void)state;
    expectError("nsa:\n  phi: max\n", "line 2", "nsa.phi", "max", "not a known value", "allowed: avg, mlp",
                NULL);
    expectError("runtime:\n  precision: fp8\n", "runtime.precision", "fp8", "fp32, fp64, bf16, fp16, auto",
                NULL);
    expectError("data:\n  source: s3\n", "data.source", "s3", "synthetic, text, shards", NULL);
    expectError("runtime:\n  device: tpu\n", "runtime.device", "tpu", "cpu, cuda, auto", NULL);
    expectError("data:\n  tokenizer: bpe9\n", "data.tokenizer", "bpe9", "allowed: byte", NULL);
    expectError("fault:\n  stall_phase: lunch\n", "fault.stall_phase", "lunch", "forward", NULL);

    /* aliases the prototype used, and "auto" */
    JobConfig cfg;
    NsaError err;
    assert_int_equal(load(&cfg, "runtime:\n  device: cuda\n  precision: bf16-mixed\n", &err), 0);
    assert_int_equal(cfg.runtime.precision, NSA_PREC_BF16);
    assert_int_equal(cfg.runtime.precision_auto, 0);
    assert_int_equal(load(&cfg, "runtime:\n  device: cpu\n  precision: auto\n", &err), 0);
    assert_int_equal(cfg.runtime.precision, NSA_PREC_F32);
    assert_int_equal(cfg.runtime.precision_auto, 1);
    expectError("runtime:\n  device: cpu\n  precision: bf16\n", "runtime.precision", "bf16",
                "not available on device cpu", NULL);
}

static void test_cross_key_rules(void **state) {
    (void)state;
    expectError("data:\n  source: text\n", "data.path", "(empty)", "data.source text", NULL);
    expectError("data:\n  val_fraction: 0\ntrain:\n  eval_every: 100\n", "train.eval_every",
                "data.val_fraction is 0", NULL);
    expectError("data:\n  source: shards\n  path: x.bin\nmodel:\n  vocab_size: 100000\n",
                "model.vocab_size", "100000", "uint16", NULL);
    expectError("model:\n  vocab_size: 100\n", "model.vocab_size", "100", "at least 256", NULL);
    expectError("fault:\n  nan_at_step: 3\n", "fault.nan_kind", "none", "loss, grad", NULL);

    JobConfig cfg;
    NsaError err;
    assert_int_equal(load(&cfg, "data:\n  path: ignored.txt\n", &err), 0);
    assert_int_equal(cfg.n_warnings, 1);
    assert_non_null(strstr(cfg.warnings[0], "data.path"));
}

/* A checkpoint's model config (model and nsa alone) is checked as a model:
 * a vocabulary below the byte tokenizer's is a shard run's and loads; the
 * model's own rules and ranges still hold, and another section is refused. */
static void test_model_config_alone(void **state) {
    (void)state;
    const char *mc = "{\"model\":{\"vocab_size\":100,\"dim\":32},\"nsa\":{\"l\":8,\"d\":4}}";
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(configLoadString(&cfg, mc, strlen(mc), &err), -1); /* as a job: bytes */
    assert_non_null(strstr(err.message, "at least 256"));
    configDefaults(&cfg);
    if (configLoadModelString(&cfg, mc, strlen(mc), &err)) fail_msg("%s", err.message);
    assert_int_equal(cfg.model.vocab_size, 100);
    assert_int_equal(cfg.model.dim, 32);
    assert_int_equal(cfg.model.cmp_len, 8);
    const struct {
        const char *text, *needle1, *needle2;
    } bad[] = {
        {"model: {vocab_size: 1}\n", "model.vocab_size: 1", "out of range"},
        {"model: {n_heads: 6, n_kv_groups: 4}\n", "model.n_heads", "n_kv_groups"},
        {"nsa: {l: 8, d: 3}\n", "nsa.d", "does not divide"},
        {"model: {vocab_size: 100}\ndata: {tokenizer: byte}\n",
         "data: not a section of a model "
         "config",
         "allowed: model, nsa"},
        {"model: {vocab_sise: 100}\n", "vocab_sise", "vocab_size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        configDefaults(&cfg);
        memset(&err, 0, sizeof err);
        if (configLoadModelString(&cfg, bad[i].text, strlen(bad[i].text), &err) == 0)
            fail_msg("loaded but should fail: %s", bad[i].text);
        if (!strstr(err.message, bad[i].needle1) || !strstr(err.message, bad[i].needle2))
            fail_msg("message \"%s\" lacks \"%s\" or \"%s\"", err.message, bad[i].needle1,
                     bad[i].needle2);
    }
}

static void test_malformed_yaml_names_line(void **state) {
    (void)state;
    expectError("model:\n  dim: 64\n  n_layers: [1, 2\nnsa:\n  l: 8\n", "malformed YAML", "line 4", NULL);
    expectError("model:\n  dim: 64\n   bad: indent\n", "malformed YAML", "line 3", NULL);
    expectError("model:\n\tdim: 64\n", "malformed YAML", "line 2", NULL);
    expectError("model:\n  dim: 64\n---\nnsa:\n  l: 8\n", "second YAML document", NULL);
}

static void test_duplicate_key(void **state) {
    (void)state;
    expectError("model:\n  dim: 64\n  n_layers: 2\n  dim: 128\n", "line 4", "model.dim",
                "duplicate key (first given on line 2)", NULL);
    expectError("model:\n  dim: 64\nmodel:\n  dim: 128\n", "line 3", "model", "duplicate key", NULL);
}

static void test_empty(void **state) {
    (void)state;
    expectError("", "config is empty", "model, nsa, train", NULL);
    expectError("# nothing but a comment\n\n", "config is empty", NULL);
    expectError("~\n", "config is empty", NULL);
}

/* Writes text to a fresh temp file; returns its malloc'd path. */
static char *writeTemp(const char *text) {
    char *path = strdup("/tmp/nsad-test-config-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return path;
}

/* Loads a file holding text; expects it to fail with "PATH:LINE: " then
 * rest in its message. */
static void expectFileError(const char *text, int line, const char *rest) {
    char *path = writeTemp(text);
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, path, &err), -1);
    char want[256];
    snprintf(want, sizeof want, "%s:%d: %s", path, line, rest);
    if (!strstr(err.message, want)) fail_msg("message \"%s\" lacks \"%s\"", err.message, want);
    unlink(path);
    free(path);
}

/* YAML tags were ignored: `steps: !!str 5` trained 5 steps, `!foo 5` too,
 * and `!!int "3"` was refused as a string. A core-schema tag is now the
 * value's type (when the key takes that type), any other tag an error
 * naming the key and the line. */
static void test_yaml_tags(void **state) {
    (void)state;
    JobConfig cfg;
    NsaError err;
    /* honoured: the tag decides, not the quoting */
    const char *ok = "!!map\n"
                     "model: !!map\n"
                     "  !!str dim: !!int \"64\"\n"
                     "  norm_eps: !!float \"1e-5\"\n"
                     "  mlp: !!str swiglu\n"
                     "train:\n"
                     "  lr: !!int 1\n"
                     "  min_lr: !<tag:yaml.org,2002:float> 0.5\n"
                     "  seed: !!int 18446744073709551615\n"
                     "  out_dir: !!str 2024\n"
                     "  init_from: !!null\n"
                     "runtime:\n"
                     "  gradient_checkpointing: !!bool \"yes\"\n"
                     "  nodes: !!seq []\n"
                     "  use_flash: !!bool false\n"
                     "  sel_triton_min_L: !!int \"8\"\n"
                     "  compile: {mode: !!str max, level: !!int 3}\n"
                     "data: !!null\n";
    if (load(&cfg, ok, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(cfg.model.dim, 64);
    assert_true(cfg.model.norm_eps == 1e-5f);
    assert_int_equal(cfg.model.mlp, NSA_MLP_SWIGLU);
    assert_true(cfg.train.lr == 1.0 && cfg.train.min_lr == 0.5);
    assert_true(cfg.train.seed == UINT64_MAX);
    assert_string_equal(cfg.train.out_dir, "2024");
    assert_string_equal(cfg.train.init_from, "");
    assert_int_equal(cfg.runtime.gradient_checkpointing, NSA_RECOMPUTE_LAYER);

    /* a core tag the key does not take: refused as the type it names */
    expectError("train:\n  steps: !!str 5\n", "line 2: train.steps: !!str 5 is tagged a string",
                "allowed: an integer >= 1, untagged or tagged !!int", NULL);
    expectError("train:\n  steps: ! 5\n", "train.steps: ! 5 is tagged a string", NULL);
    expectError("model:\n  dim: !!float 64\n", "model.dim: !!float 64 is tagged a float", NULL);
    expectError("data:\n  path: !!int 5\n", "data.path: !!int 5 is tagged an integer",
                "allowed: a string, untagged or tagged !!str or !!null", NULL);
    expectError("runtime:\n  device: !!bool true\n",
                "runtime.device: !!bool true is tagged a boolean", "allowed: cpu, cuda, auto",
                NULL);
    expectError("train:\n  !!int steps: 5\n",
                "line 2: train.steps: !!int steps is tagged an integer", "a key name", NULL);
    /* a value that is not what its tag says */
    expectError("train:\n  lr: !!int 0.5\n",
                "train.lr: !!int 0.5 is not an integer, as its tag says", NULL);
    expectError("data:\n  path: !!null x\n", "data.path: !!null x is not null", NULL);
    expectError("runtime:\n  gradient_checkpointing: !!bool selective\n", "is not a boolean", NULL);
    /* a collection tag on the wrong node */
    expectError("train: !!seq\n  steps: 5\n", "line 1: train: !!seq a mapping",
                "the tag !!seq does not fit a mapping", NULL);
    expectError("train:\n  steps: !!map 5\n", "the tag !!map does not fit a scalar", NULL);
    /* any other tag, wherever it is */
    expectError("train:\n  steps: !foo 5\n",
                "line 2: train.steps: !foo 5: the tag !foo is not supported",
                "allowed: an integer >= 1, untagged or tagged !!int", NULL);
    expectError("train:\n  out_dir: !!binary aGk=\n", "train.out_dir",
                "the tag !!binary is not supported", NULL);
    expectError("%TAG !e! tag:example.com,2000:\n---\ntrain:\n  steps: !e!n 5\n",
                "line 4: train.steps", "the tag tag:example.com,2000:n is not supported", NULL);
    expectError("runtime:\n  gpus: [0, !foo 1]\n",
                "runtime.gpus: !foo 1: the tag !foo is not supported", NULL);
    expectError("runtime:\n  nodes: [!!int 5]\n", "runtime.nodes: !!int 5 is tagged an integer",
                NULL);
    expectError("runtime:\n  compile:\n    mode: !foo x\n",
                "line 3: runtime.compile: the tag !foo is not supported", NULL);
    expectError("!foo\nmodel:\n  dim: 64\n",
                "config: !foo a mapping: the tag !foo is not supported", NULL);
    expectError("!foo model:\n  dim: 64\n", "model: !foo model: the tag !foo is not supported",
                NULL);
    expectFileError("train:\n  lr: 0.001\n  steps: !foo 5\n", 3, "train.steps: !foo 5");
}

/* `steps: 010` loaded as 10, which the prototype's YAML 1.1 loader
 * (PyYAML) read as octal 8: a number with a leading zero is refused,
 * naming the key and the number to write instead. */
static void test_leading_zeros(void **state) {
    (void)state;
    expectError(
        "train:\n  steps: 010\n", "line 2: train.steps: 010 has a leading zero",
        "YAML 1.1 reads it as octal (8), YAML 1.2 as decimal (10)",
        "allowed: an integer >= 1, written without leading zeros (10, or 8 if octal was meant)",
        NULL);
    expectError("train:\n  steps: 09\n", "train.steps: 09 has a leading zero", "leading zeros (9)",
                NULL);
    expectError("train:\n  warmup_steps: 0_10\n", "train.warmup_steps: 0_10", "(10, or 8", NULL);
    expectError("train:\n  seed: 0123\n", "train.seed: 0123", "(123, or 83 if octal", NULL);
    expectError("train:\n  lr: 010e-4\n", "train.lr: 010e-4 has a leading zero", "(10e-4)", NULL);
    expectError("train:\n  steps: !!int \"010\"\n", "train.steps: 010 has a leading zero", NULL);
    expectError("runtime:\n  gpus: 02\n", "runtime.gpus: 02 has a leading zero", NULL);
    expectError("runtime:\n  gpus: [0, 01]\n", "runtime.gpus: 01 has a leading zero", NULL);
    expectError("runtime:\n  sel_triton_min_L: 0512\n",
                "runtime.sel_triton_min_L: 0512 has a leading zero", NULL);
    expectFileError("train:\n  steps: 010\n", 2, "train.steps: 010 has a leading zero");

    /* a zero alone, a fraction and quoted text are as before */
    JobConfig cfg;
    NsaError err;
    if (load(&cfg, "train:\n  warmup_steps: 0\n  lr: 00.5\n  min_lr: 0.0\n  out_dir: \"010\"\n",
             &err) != 0)
        fail_msg("%s", err.message);
    assert_true(cfg.train.warmup_steps == 0 && cfg.train.lr == 0.5 && cfg.train.min_lr == 0);
    assert_string_equal(cfg.train.out_dir, "010");
}

/* `min_lr: 1e-400` loaded as 0 (strtod's underflow went unnoticed) and a
 * float key's `norm_eps: 1e-50` passed its > 0 check as a double and was
 * stored as 0.0f: a nonzero number the key cannot hold is refused. */
static void test_tiny_numbers_are_refused(void **state) {
    (void)state;
    expectError("train:\n  min_lr: 1e-400\n",
                "line 2: train.min_lr: 1e-400 is too small: it would be stored as 0",
                "allowed: a number from 0 to 10, and if not 0 at least 2.22507e-308", NULL);
    expectError("train:\n  lr: 1e-400\n", "train.lr: 1e-400 is too small", "0 < x <= 10", NULL);
    expectError("train:\n  grad_clip: 1e-310\n", "train.grad_clip: 1e-310 is too small",
                "the subnormal 1e-310, losing precision", NULL);
    expectError("model:\n  norm_eps: 1e-50\n",
                "model.norm_eps: 1e-50 is too small: it would be stored as 0", "1.17549e-38", NULL);
    expectError("model:\n  norm_eps: 1e-40\n", "model.norm_eps: 1e-40 is too small", "subnormal",
                NULL);
    expectError("fault:\n  stall_seconds: 0.0000e-999\n  nan_at_step: 1\n  exit_at_step: 0\n"
                "watchdog:\n  data: 1e-999\n",
                "line 6: watchdog.data: 1e-999 is too small", NULL);
    expectFileError("train:\n  min_lr: 1e-400\n", 2, "train.min_lr: 1e-400 is too small");

    /* zero written any way, and small normal numbers, load */
    JobConfig cfg;
    NsaError err;
    if (load(&cfg,
             "train:\n  min_lr: 0e-400\n  weight_decay: -0.0\n  grad_clip: 1e-300\n"
             "model:\n  norm_eps: 1.2e-38\n",
             &err) != 0)
        fail_msg("%s", err.message);
    assert_true(cfg.train.min_lr == 0 && cfg.train.weight_decay == 0 &&
                cfg.train.grad_clip == 1e-300);
    assert_true(cfg.model.norm_eps > 0);
}

static void test_file_errors_name_the_file(void **state) {
    (void)state;
    char *path = writeTemp("model:\n  dim: 64\n  heads: 4\n");
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, path, &err), -1);
    char want[128];
    snprintf(want, sizeof want, "%s:3: model.heads: unknown key", path);
    if (!strstr(err.message, want)) fail_msg("message \"%s\" lacks \"%s\"", err.message, want);
    unlink(path);
    free(path);

    path = writeTemp("");
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, path, &err), -1);
    snprintf(want, sizeof want, "%s: config is empty", path);
    if (!strstr(err.message, want)) fail_msg("message \"%s\" lacks \"%s\"", err.message, want);
    unlink(path);
    free(path);

    path = writeTemp("model:\n  dim: 64\n\x01");
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, path, &err), -1);
    snprintf(want, sizeof want, "%s: byte offset 17: malformed YAML: control characters", path);
    if (!strstr(err.message, want)) fail_msg("message \"%s\" lacks \"%s\"", err.message, want);
    unlink(path);
    free(path);

    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, "configs", &err), -1);
    assert_non_null(strstr(err.message, "configs: is a directory"));

    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, "/nonexistent/nsad.yaml", &err), -1);
    assert_non_null(strstr(err.message, "/nonexistent/nsad.yaml: cannot open config"));
}

/* head, n copies of unit, then tail. */
static char *repeat(const char *head, const char *unit, size_t n, const char *tail) {
    size_t h = strlen(head), u = strlen(unit), t = strlen(tail);
    char *s = malloc(h + u * n + t + 1);
    assert_non_null(s);
    memcpy(s, head, h);
    for (size_t i = 0; i < n; i++) memcpy(s + h + i * u, unit, u);
    memcpy(s + h + u * n, tail, t + 1);
    return s;
}

/* Issue 39, item 1: a megabyte of '[' (or of "{a: ") made libyaml work for
 * minutes, in the HTTP thread. Every such input now stops at a limit that
 * its one-line message names. */
static void test_hostile_configs_stop_at_a_limit(void **state) {
    (void)state;
    typedef struct HostileCase {
        const char *head, *unit, *tail;
        size_t n;
        const char *needle;
    } HostileCase;
    const HostileCase cases[] = {
        {.head = "", .unit = "[", .tail = "", .n = (size_t)1 << 20,
         .needle = "nesting deeper than 16 levels"},
        {.head = "", .unit = "{a: ", .tail = "", .n = 250000,
         .needle = "nesting deeper than 16 levels"},
        {.head = "", .unit = "- ", .tail = "x\n", .n = 100000,
         .needle = "nesting deeper than 16 levels"},
        {.head = "model:\n", .unit = "  k: 1\n", .tail = "", .n = 140000,
         .needle = "more than 4096 values"},
        {.head = "a: &b 1\nc: [", .unit = "a, *b, ", .tail = "a]", .n = 100000,
         .needle = "more than 4096 values"},
        {.head = "", .unit = "%TAG !a! tag:x\n", .tail = "---\nmodel: {}\n", .n = 60000,
         .needle = "more than 16 directives"},
        {.head = "", .unit = "#", .tail = "", .n = ((size_t)1 << 20) + 1,
         .needle = "allowed: a config of at most 1048576 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = repeat(cases[i].head, cases[i].unit, cases[i].n, cases[i].tail);
        JobConfig cfg;
        NsaError err = {{0}};
        configDefaults(&cfg);
        assert_int_equal(configLoadString(&cfg, text, strlen(text), &err), -1);
        if (!strstr(err.message, cases[i].needle))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err.message, cases[i].needle);
        assert_null(strchr(err.message, '\n'));
        free(text);
    }
    /* the same limits hold for files, which name themselves */
    char *deep = repeat("", "[", 100, "");
    char *path = writeTemp(deep);
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, path, &err), -1);
    char want[256];
    snprintf(want, sizeof want, "%s:1: nesting deeper than 16 levels", path);
    if (!strstr(err.message, want)) fail_msg("message \"%s\" lacks \"%s\"", err.message, want);
    unlink(path);
    free(path);
    free(deep);
    /* and a legitimate config within them still loads: 16 levels deep in a
     * value the walker then refuses by name, not by a limit */
    expectError("train:\n  steps: [[[[[[[[[[[[[[1]]]]]]]]]]]]]]\n", "train.steps", "a list", NULL);
}

/* Issue 39, item 6: a FIFO (or a device) given as the config made nsad
 * wait for a writer forever; only regular files are read. */
static void test_config_must_be_a_regular_file(void **state) {
    (void)state;
    char *dir = strdup("/tmp/nsad-test-config-fifo-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/job.yaml", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, fifo, &err), -1);
    char want[300];
    snprintf(want, sizeof want, "%s: is a FIFO; allowed: a YAML or JSON config file", fifo);
    if (!strstr(err.message, want)) fail_msg("message \"%s\" lacks \"%s\"", err.message, want);
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, "/dev/zero", &err), -1);
    assert_non_null(strstr(err.message, "/dev/zero: is a character device"));
    unlink(fifo);
    rmdir(dir);
    free(dir);
}

static void test_hash_follows_the_math(void **state) {
    (void)state;
    JobConfig a, b;
    configDefaults(&a);
    configDefaults(&b);
    assert_true(configHash(&a) == configHash(&b));
    b.train.lr = 1e-3;  /* schedule, not the model or the data order */
    b.train.steps = 5;
    b.runtime.threads = 7;
    assert_true(configHash(&a) == configHash(&b));
    b.model.d_k = 32;
    assert_true(configHash(&a) != configHash(&b));
    configDefaults(&b);
    b.train.seed = 2;
    assert_true(configHash(&a) != configHash(&b));
    configDefaults(&b);
    b.train.seq_len = 1024;
    assert_true(configHash(&a) != configHash(&b));
}

/* Runs cmdCheck with stdout and stderr captured into out; returns its status. */
typedef struct CheckArgs {
    int argc;
    char **argv;
} CheckArgs;
static int callCheck(void *arg) {
    const CheckArgs *c = arg;
    return cmdCheck(c->argc, c->argv);
}
static int runCheck(int argc, char **argv, char *out, size_t cap) {
    CheckArgs c = {argc, argv};
    return testCaptureOutput(callCheck, &c, out, cap);
}

static void test_check_command(void **state) {
    (void)state;
    static char out[65536];
    char *good[] = {"check", "configs/prototype-smoke.yaml"};
    assert_int_equal(runCheck(2, good, out, sizeof out), 0);
    assert_non_null(strstr(out, "warning: runtime.use_flash_attn"));
    assert_non_null(strstr(out, "  dim: 256\n"));
    assert_non_null(strstr(out, "  precision: bf16\n"));

    char *path = writeTemp("nsa:\n  d: 5\n");
    char *bad[] = {"check", path};
    assert_int_equal(runCheck(2, bad, out, sizeof out), EXIT_CONFIG);
    assert_non_null(strstr(out, "nsa.d: 5 does not divide nsa.l (32)"));
    assert_null(strstr(out, "model:"));  /* nothing printed on stdout */
    unlink(path);
    free(path);

    char *none[] = {"check"};
    assert_int_equal(runCheck(1, none, out, sizeof out), EXIT_USAGE);
    char *help[] = {"check", "--help"};
    assert_int_equal(runCheck(2, help, out, sizeof out), 0);
    assert_non_null(strstr(out, "usage: nsad check CONFIG"));
    char *missing[] = {"check", "/nonexistent.yaml"};
    assert_int_equal(runCheck(2, missing, out, sizeof out), EXIT_CONFIG);
}

/* docs/CONFIG.md has a row for every key the loader knows, with the right
 * default: the resolved YAML of the defaults lists every key. */
static void test_docs_list_every_key(void **state) {
    (void)state;
    FILE *f = fopen("docs/CONFIG.md", "rb");
    if (!f) fail_msg("docs/CONFIG.md: cannot open (run the tests from the repository root)");
    static char doc[1 << 17];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = '\0';
    fclose(f);

    JobConfig cfg;
    configDefaults(&cfg);
    cfg.runtime.device_auto = 1;  /* print "auto" whatever this machine has */
    cfg.runtime.precision_auto = 1;
    cfg.runtime.threads = 0;      /* the documented default, before it resolves to the core count */
    char *yaml = configToYaml(&cfg);
    assert_non_null(yaml);
    char section[32] = "";
    int keys = 0;
    for (char *line = strtok(yaml, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        if (line[0] != ' ') {
            snprintf(section, sizeof section, "%.*s", (int)strcspn(line, ":"), line);
            continue;
        }
        char key[64], value[256], want[128];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(line + 2, ":"), line + 2);
        const char *v = strchr(line, ':') + 2;
        size_t len = strcspn(v, "#");
        while (len > 0 && v[len - 1] == ' ') len--;
        if (len >= 2 && v[0] == '"') {
            v++;
            len -= 2;
        }
        snprintf(value, sizeof value, "%.*s", (int)len, v);
        if (!value[0]) snprintf(value, sizeof value, "(empty)");
        snprintf(want, sizeof want, "| `%s.%s` | ", section, key);
        const char *row = strstr(doc, want);
        if (!row) fail_msg("docs/CONFIG.md has no row for %s.%s", section, key);
        const char *type_end = strchr(row + strlen(want), '|');  /* then the default column */
        assert_non_null(type_end);
        char shown[256];
        snprintf(shown, sizeof shown, "%.*s", (int)strcspn(type_end + 2, "|") - 1, type_end + 2);
        char *tick;
        while ((tick = strchr(shown, '`'))) memmove(tick, tick + 1, strlen(tick));
        if (strcmp(shown, value)) fail_msg("docs/CONFIG.md: %s.%s default \"%s\", the loader's is \"%s\"",
                                           section, key, shown, value);
        keys++;
    }
    assert_true(keys > 50);
    free(yaml);
}

static char *readWhole(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: cannot open (run the tests from the repository root)", path);
    static char buf[2][1 << 17];
    static int turn;
    char *text = buf[turn++ & 1];
    size_t n = fread(text, 1, sizeof buf[0] - 1, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

/* docs/CONFIG.md's table of shipped configs has a row for every file in
 * configs/, and the row that says `make run` names the file scripts/run.sh
 * starts by default. */
static void test_docs_name_the_shipped_configs(void **state) {
    (void)state;
    const char *doc = readWhole("docs/CONFIG.md");
    const char *run = readWhole("scripts/run.sh");
    const char *dflt = strstr(run, "NSAD_RUN_CONFIG:-configs/");
    assert_non_null(dflt);
    dflt += strlen("NSAD_RUN_CONFIG:-configs/");
    char want[128];
    snprintf(want, sizeof want, "| `%.*s` |", (int)strcspn(dflt, "}\""), dflt);
    const char *row = strstr(doc, want);
    if (!row) fail_msg("docs/CONFIG.md has no row %s (the config `make run` starts)", want);
    size_t len = strcspn(row, "\n");
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)len, row);
    if (!strstr(line, "`make run`")) fail_msg("docs/CONFIG.md: the row of %s does not say `make run`", want);
    /* and no other row claims it */
    for (const char *p = strstr(doc, "`make run`"); p; p = strstr(p + 1, "`make run`")) {
        const char *start = p;
        while (start > doc && start[-1] != '\n') start--;
        if (*start == '|' && strncmp(start, want, strlen(want)) != 0 && strstr(start, ".yaml` |") &&
            strstr(start, ".yaml` |") < p)
            fail_msg("docs/CONFIG.md: another config's row says `make run`: %.80s", start);
    }
    DIR *d = opendir("configs");
    assert_non_null(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".yaml") != 0) continue;
        snprintf(want, sizeof want, "| `%s` |", e->d_name);
        if (!strstr(doc, want)) fail_msg("docs/CONFIG.md has no row for configs/%s", e->d_name);
        files++;
    }
    closedir(d);
    assert_true(files >= 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_configs_load),
        cmocka_unit_test(test_prototype_configs_keep_their_values),
        cmocka_unit_test(test_prototype_key_style),
        cmocka_unit_test(test_defaults_are_valid),
        cmocka_unit_test(test_json_loads_like_yaml),
        cmocka_unit_test(test_resolved_yaml_reads_back),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_wrong_type),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_not_divisible),
        cmocka_unit_test(test_bad_enum),
        cmocka_unit_test(test_cross_key_rules),
        cmocka_unit_test(test_model_config_alone),
        cmocka_unit_test(test_malformed_yaml_names_line),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_file_errors_name_the_file),
        cmocka_unit_test(test_yaml_tags),
        cmocka_unit_test(test_leading_zeros),
        cmocka_unit_test(test_tiny_numbers_are_refused),
        cmocka_unit_test(test_hostile_configs_stop_at_a_limit),
        cmocka_unit_test(test_config_must_be_a_regular_file),
        cmocka_unit_test(test_hash_follows_the_math),
        cmocka_unit_test(test_check_command),
        cmocka_unit_test(test_docs_list_every_key),
        cmocka_unit_test(test_docs_name_the_shipped_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
