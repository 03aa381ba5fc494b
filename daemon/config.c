/* config.c - see config.h.
 *
 * One table (configKeys) lists every key: its section, type, where it lives
 * in JobConfig, its range or its names. The YAML loader, the range checks,
 * the resolved-YAML writer and docs/CONFIG.md all follow that table, so a key
 * added here is parsed, checked and printed without further code. Checks that
 * relate several keys (d | l, G | H, ...) live in configValidate.
 *
 * The YAML is parsed with libyaml's document API (which also reads JSON, a
 * subset of YAML flow style) and walked once: unknown keys, duplicate keys
 * and wrong types are reported with their line. Plain scalars are typed by
 * their text (an int key takes 64 but not "64", 6.4 or 1e3); quoted scalars
 * are strings. A number with a leading zero (010: octal in YAML 1.1,
 * decimal in 1.2) and a nonzero number too small for its field (1e-400)
 * are errors. Tags are read from the text (yamlTagsCollect: the document
 * loses which were written): a core-schema tag the key takes is the
 * value's type (!!int "3" is 3), any other tag an error (tagApply). */
#include "config.h"
#include "fsutil.h"
#include "strbuf.h"
#include "yamllimit.h"
#include "yamlscalar.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "tokenizer.h"

/* ---- the key table ------------------------------------------------------ */

typedef enum KeyType {
    KEY_INT,     /* int */
    KEY_INT64,   /* int64_t */
    KEY_UINT64,  /* uint64_t (the seed) */
    KEY_DOUBLE,  /* double */
    KEY_FLOAT,   /* float (model constants) */
    KEY_STRING,  /* char[size] */
    KEY_ENUM,    /* int-sized C enum, by name */
    KEY_GPUS,    /* runtime.gpus: "all", a count, or a list of ordinals */
    KEY_NODES    /* runtime.nodes: a list of "HOST:PORT" */
} KeyType;

typedef struct EnumName {
    const char *name;  /* the first name of a value is the canonical one */
    int value;
} EnumName;

enum {
    RANGE_MIN_OPEN = 1,  /* the minimum itself is not allowed */
    RANGE_MAX_OPEN = 2   /* the maximum itself is not allowed */
};

typedef struct ConfigKey {
    const char *section;
    const char *key;
    KeyType type;
    size_t offset;       /* into JobConfig */
    size_t size;         /* KEY_STRING: the buffer size */
    double min, max;     /* numeric range */
    int range_flags;
    const EnumName *names; /* KEY_ENUM: NULL-terminated */
} ConfigKey;

/* "auto" is handled before the table: it sets device_auto/precision_auto. */
static const EnumName device_names[] = {
    {"cpu", NSA_DEVICE_CPU}, {"cuda", NSA_DEVICE_CUDA}, {"gpu", NSA_DEVICE_CUDA}, {NULL, 0}};
/* The prototype used PyTorch Lightning's spellings; they are accepted too. */
static const EnumName precision_names[] = {
    {"fp32", NSA_PREC_F32},    {"32", NSA_PREC_F32},       {"float32", NSA_PREC_F32},
    {"32-true", NSA_PREC_F32}, {"fp64", NSA_PREC_F64},     {"64", NSA_PREC_F64},
    {"float64", NSA_PREC_F64}, {"64-true", NSA_PREC_F64},  {"bf16", NSA_PREC_BF16},
    {"bfloat16", NSA_PREC_BF16}, {"bf16-mixed", NSA_PREC_BF16}, {"bf16-true", NSA_PREC_BF16},
    {"fp16", NSA_PREC_FP16},   {"16", NSA_PREC_FP16},      {"float16", NSA_PREC_FP16},
    {"16-mixed", NSA_PREC_FP16}, {"16-true", NSA_PREC_FP16}, {NULL, 0}};
static const EnumName phi_names[] = {{"avg", NSA_PHI_AVG}, {"mlp", NSA_PHI_MLP}, {NULL, 0}};
static const EnumName mlp_names[] = {{"silu", NSA_MLP_SILU}, {"swiglu", NSA_MLP_SWIGLU}, {NULL, 0}};
static const EnumName source_names[] = {
    {"synthetic", DATA_SYNTHETIC}, {"text", DATA_TEXT}, {"shards", DATA_SHARDS}, {NULL, 0}};
static const EnumName nan_policy_names[] = {
    {"halt", NAN_HALT}, {"skip", NAN_SKIP}, {"rollback", NAN_ROLLBACK}, {NULL, 0}};
static const EnumName hang_policy_names[] = {
    {"report", HANG_REPORT}, {"exit", HANG_EXIT}, {NULL, 0}};
static const EnumName fault_kind_names[] = {
    {"none", FAULT_NONE}, {"loss", FAULT_NAN_LOSS}, {"grad", FAULT_NAN_GRAD}, {NULL, 0}};
static const EnumName lr_schedule_names[] = {{"cosine", LR_SCHEDULE_COSINE}, {NULL, 0}};
/* runtime.gradient_checkpointing: the prototype's bool (YAML 1.1's
 * spellings, as its loader PyYAML reads them; true = the whole layer made
 * again) or nsad's selective; the values are NsaRecompute's */
static const EnumName recompute_names[] = {
    {"false", NSA_RECOMPUTE_NONE},  {"true", NSA_RECOMPUTE_LAYER},
    {"selective", NSA_RECOMPUTE_SELECTIVE},
    {"no", NSA_RECOMPUTE_NONE},     {"yes", NSA_RECOMPUTE_LAYER},
    {"off", NSA_RECOMPUTE_NONE},    {"on", NSA_RECOMPUTE_LAYER},
    {"layer", NSA_RECOMPUTE_LAYER}, {NULL, 0}};

/* The phases a stall can be injected into (monitor.h's TrainPhase names). */
static const char *const stall_phases[] = {"data",       "forward", "backward", "allreduce",
                                           "optimizer", "checkpoint", "eval", NULL};

#define F(member) offsetof(JobConfig, member)
#define SZ(member) sizeof(((JobConfig *)0)->member)
#define BIG 1e18
static const ConfigKey configKeys[] = {
    {"model", "dim", KEY_INT, F(model.dim), 0, 1, 65536, 0, NULL},
    {"model", "n_layers", KEY_INT, F(model.n_layers), 0, 1, 1024, 0, NULL},
    {"model", "n_heads", KEY_INT, F(model.n_heads), 0, 1, 1024, 0, NULL},
    {"model", "n_kv_groups", KEY_INT, F(model.n_kv_groups), 0, 1, 1024, 0, NULL},
    {"model", "d_k", KEY_INT, F(model.d_k), 0, 2, 1024, 0, NULL},
    {"model", "d_v", KEY_INT, F(model.d_v), 0, 1, 1024, 0, NULL},
    {"model", "vocab_size", KEY_INT, F(model.vocab_size), 0, 2, 1 << 24, 0, NULL},
    {"model", "mlp_hidden", KEY_INT, F(model.mlp_hidden), 0, 0, 1 << 18, 0, NULL},
    {"model", "mlp", KEY_ENUM, F(model.mlp), 0, 0, 0, 0, mlp_names},
    {"model", "rope_base", KEY_FLOAT, F(model.rope_base), 0, 1, 1e9, RANGE_MIN_OPEN, NULL},
    {"model", "norm_eps", KEY_FLOAT, F(model.norm_eps), 0, 0, 1, RANGE_MIN_OPEN, NULL},

    {"nsa", "l", KEY_INT, F(model.cmp_len), 0, 1, 65536, 0, NULL},
    {"nsa", "d", KEY_INT, F(model.cmp_stride), 0, 1, 65536, 0, NULL},
    {"nsa", "l_sel", KEY_INT, F(model.sel_len), 0, 1, 65536, 0, NULL},
    {"nsa", "n_sel", KEY_INT, F(model.n_sel), 0, 1, 65536, 0, NULL},
    {"nsa", "w", KEY_INT, F(model.window), 0, 1, 1 << 24, 0, NULL},
    {"nsa", "phi", KEY_ENUM, F(model.phi), 0, 0, 0, 0, phi_names},

    {"train", "steps", KEY_INT64, F(train.steps), 0, 1, BIG, 0, NULL},
    {"train", "seq_len", KEY_INT, F(train.seq_len), 0, 1, 1 << 20, 0, NULL},
    {"train", "batch_size", KEY_INT, F(train.batch_size), 0, 1, 65536, 0, NULL},
    {"train", "accumulate_grad_batches", KEY_INT, F(train.accumulate_grad_batches), 0, 1, 65536, 0, NULL},
    {"train", "lr", KEY_DOUBLE, F(train.lr), 0, 0, 10, RANGE_MIN_OPEN, NULL},
    {"train", "min_lr", KEY_DOUBLE, F(train.min_lr), 0, 0, 10, 0, NULL},
    {"train", "lr_schedule", KEY_ENUM, F(train.lr_schedule), 0, 0, 0, 0, lr_schedule_names},
    {"train", "warmup_steps", KEY_INT64, F(train.warmup_steps), 0, 0, BIG, 0, NULL},
    {"train", "weight_decay", KEY_DOUBLE, F(train.weight_decay), 0, 0, 10, 0, NULL},
    {"train", "grad_clip", KEY_DOUBLE, F(train.grad_clip), 0, 0, 1e9, 0, NULL},
    {"train", "beta1", KEY_DOUBLE, F(train.beta1), 0, 0, 1, RANGE_MAX_OPEN, NULL},
    {"train", "beta2", KEY_DOUBLE, F(train.beta2), 0, 0, 1, RANGE_MAX_OPEN, NULL},
    {"train", "eps", KEY_DOUBLE, F(train.eps), 0, 0, 1, RANGE_MIN_OPEN, NULL},
    {"train", "seed", KEY_UINT64, F(train.seed), 0, 0, 0, 0, NULL},
    {"train", "log_every", KEY_INT64, F(train.log_every), 0, 1, BIG, 0, NULL},
    {"train", "eval_every", KEY_INT64, F(train.eval_every), 0, 0, BIG, 0, NULL},
    {"train", "eval_batches", KEY_INT64, F(train.eval_batches), 0, 1, 1e9, 0, NULL},
    {"train", "save_every", KEY_INT64, F(train.save_every), 0, 0, BIG, 0, NULL},
    {"train", "keep_last", KEY_INT, F(train.keep_last), 0, 1, 100000, 0, NULL},
    {"train", "out_dir", KEY_STRING, F(train.out_dir), SZ(train.out_dir), 0, 0, 0, NULL},
    {"train", "init_from", KEY_STRING, F(train.init_from), SZ(train.init_from), 0, 0, 0, NULL},

    {"runtime", "device", KEY_ENUM, F(runtime.device), 0, 0, 0, 0, device_names},
    {"runtime", "precision", KEY_ENUM, F(runtime.precision), 0, 0, 0, 0, precision_names},
    {"runtime", "threads", KEY_INT, F(runtime.threads), 0, 0, 256, 0, NULL}, /* nsaModelCreate's */
    {"runtime", "gpus", KEY_GPUS, F(runtime.gpus), 0, 1, CONFIG_MAX_GPUS, 0, NULL},
    {"runtime", "cpu_ranks", KEY_INT, F(runtime.cpu_ranks), 0, 1, CONFIG_MAX_GPUS, 0, NULL},
    {"runtime", "nodes", KEY_NODES, F(runtime.n_nodes), 0, 0, CONFIG_MAX_NODES, 0, NULL},
    {"runtime", "gradient_checkpointing", KEY_ENUM, F(runtime.gradient_checkpointing), 0, 0, 0, 0, recompute_names},

    {"data", "source", KEY_ENUM, F(data.source), 0, 0, 0, 0, source_names},
    {"data", "path", KEY_STRING, F(data.path), SZ(data.path), 0, 0, 0, NULL},
    {"data", "tokenizer", KEY_STRING, F(data.tokenizer), SZ(data.tokenizer), 0, 0, 0, NULL},
    {"data", "val_fraction", KEY_DOUBLE, F(data.val_fraction), 0, 0, 0.5, 0, NULL},
    {"data", "val_path", KEY_STRING, F(data.val_path), SZ(data.val_path), 0, 0, 0, NULL},
    {"data", "prefetch", KEY_INT, F(data.prefetch), 0, 0, 64, 0, NULL},

    {"nan", "policy", KEY_ENUM, F(nan.policy), 0, 0, 0, 0, nan_policy_names},
    {"nan", "max_skips", KEY_INT, F(nan.max_skips), 0, 0, 1000000, 0, NULL},

    {"fault", "nan_at_step", KEY_INT64, F(fault.nan_at_step), 0, 0, BIG, 0, NULL},
    {"fault", "nan_kind", KEY_ENUM, F(fault.nan_kind), 0, 0, 0, 0, fault_kind_names},
    {"fault", "stall_at_step", KEY_INT64, F(fault.stall_at_step), 0, 0, BIG, 0, NULL},
    {"fault", "stall_phase", KEY_STRING, F(fault.stall_phase), SZ(fault.stall_phase), 0, 0, 0, NULL},
    {"fault", "stall_seconds", KEY_DOUBLE, F(fault.stall_seconds), 0, 0, 1e6, 0, NULL},
    {"fault", "rank", KEY_INT, F(fault.rank), 0, 0, 4095, 0, NULL},
    {"fault", "exit_at_step", KEY_INT64, F(fault.exit_at_step), 0, 0, BIG, 0, NULL},

    {"watchdog", "data", KEY_DOUBLE, F(watchdog.data), 0, 0, 1e6, RANGE_MIN_OPEN, NULL},
    {"watchdog", "forward", KEY_DOUBLE, F(watchdog.forward), 0, 0, 1e6, RANGE_MIN_OPEN, NULL},
    {"watchdog", "backward", KEY_DOUBLE, F(watchdog.backward), 0, 0, 1e6, RANGE_MIN_OPEN, NULL},
    {"watchdog", "allreduce", KEY_DOUBLE, F(watchdog.allreduce), 0, 0, 1e6, RANGE_MIN_OPEN, NULL},
    {"watchdog", "optimizer", KEY_DOUBLE, F(watchdog.optimizer), 0, 0, 1e6, RANGE_MIN_OPEN, NULL},
    {"watchdog", "checkpoint", KEY_DOUBLE, F(watchdog.checkpoint), 0, 0, 1e6, RANGE_MIN_OPEN, NULL},
    {"watchdog", "eval", KEY_DOUBLE, F(watchdog.eval), 0, 0, 1e6, RANGE_MIN_OPEN, NULL},
    {"watchdog", "on_hang", KEY_ENUM, F(watchdog.on_hang), 0, 0, 0, 0, hang_policy_names},
};
#undef F
#undef SZ
#define N_KEYS (sizeof configKeys / sizeof configKeys[0])

static const char *const sections[] = {"model", "nsa",   "train", "runtime",
                                       "data",  "nan",   "fault", "watchdog", NULL};

/* The values an ignored key takes (the prototype checked them, so nsad
 * does too): anything, true/false, or a count (an integer >= 0). */
typedef enum IgnoredType { IGNORED_ANY = 0, IGNORED_BOOL, IGNORED_COUNT } IgnoredType;

/* Keys the PyTorch prototype had whose effect nsad either always has or
 * cannot have: they load with a warning so its config files keep working.
 * A switch whose `false` asks for what nsad does anyway (no third-party
 * kernel, no recomputation) loads silently when false. */
typedef struct IgnoredKey {
    const char *section, *key, *why;
    IgnoredType type;
    int false_is_honoured;
} IgnoredKey;

static const IgnoredKey ignoredKeys[] = {
    {"runtime", "use_flash_attn", "nsad always runs its own NSA kernels", IGNORED_ANY, 0},
    {"runtime", "flash_attn", "nsad always runs its own NSA kernels", IGNORED_ANY, 0},
    {"runtime", "compile", "there is no torch.compile; the CUDA engine is compiled ahead of time",
     IGNORED_ANY, 0},
    {"runtime", "compile_mode", "there is no torch.compile; the CUDA engine is compiled ahead of time",
     IGNORED_ANY, 0},
    {"runtime", "cudnn_benchmark", "nsad does not use cuDNN", IGNORED_ANY, 0},
    {"runtime", "allow_tf32", "fp32 matmuls follow runtime.precision", IGNORED_ANY, 0},
    {"runtime", "num_workers", "the data loader uses one prefetch thread (data.prefetch)", IGNORED_ANY,
     0},
    {"runtime", "pin_memory", "the data loader manages its own buffers", IGNORED_ANY, 0},
    {"runtime", "dist_backend", "multi-GPU always uses NCCL", IGNORED_ANY, 0},
    {"model", "use_triton", "nsad's kernels are CUDA C, not Triton", IGNORED_ANY, 0},
    {"model", "use_flash_attn", "nsad always runs its own NSA kernels", IGNORED_ANY, 0},
    {"model", "dropout", "nsad trains without dropout", IGNORED_ANY, 0},
    {"model", "bias", "nsad's layers have no biases", IGNORED_ANY, 0},
    {"nsa", "use_triton", "nsad's kernels are CUDA C, not Triton", IGNORED_ANY, 0},
    {"nsa", "block_impl", "nsad has one NSA implementation per engine", IGNORED_ANY, 0},
    {"data", "num_workers", "the data loader uses one prefetch thread (data.prefetch)", IGNORED_ANY, 0},
    /* the prototype's own place for it is runtime.gradient_checkpointing,
     * which nsad honours; kept for files that used this one */
    {"train", "gradient_checkpointing", "nsad's switch is runtime.gradient_checkpointing", IGNORED_ANY, 0},
    /* the prototype's kernel switches (runtime section) */
    {"runtime", "use_flash", "nsad runs its own fused NSA kernels for every branch, never flash-attn",
     IGNORED_BOOL, 1},
    {"runtime", "use_triton_sel", "nsad's selected-attention kernels are CUDA C, not Triton", IGNORED_BOOL,
     1},
    {"runtime", "compile_cmp_win",
     "there is no torch.compile; the compressed and window kernels are compiled ahead of time", IGNORED_BOOL,
     1},
    {"runtime", "sel_triton_min_L", "nsad picks its selected-attention kernel by sequence length itself",
     IGNORED_COUNT, 0},
    {"runtime", "fa2_enabled", "nsad never calls FlashAttention-2; its own kernels run every branch",
     IGNORED_BOOL, 1},
    {"runtime", "fa2_min_len_win", "nsad has no FlashAttention-2 path (runtime.fa2_enabled)", IGNORED_COUNT,
     0},
    {"runtime", "fa2_min_len_cmp", "nsad has no FlashAttention-2 path (runtime.fa2_enabled)", IGNORED_COUNT,
     0},
};
#define N_IGNORED (sizeof ignoredKeys / sizeof ignoredKeys[0])

/* The prototype's names for keys nsad spells otherwise. Giving both is fine
 * when they agree, an error when they do not. */
typedef struct KeyAlias {
    const char *section, *key, *canonical;
} KeyAlias;

static const KeyAlias keyAliases[] = {
    {"train", "max_grad_norm", "grad_clip"},
};
#define N_ALIASES (sizeof keyAliases / sizeof keyAliases[0])

/* ---- errors ---------------------------------------------------------------- */

static void addWarning(JobConfig *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addWarning(JobConfig *cfg, const char *fmt, ...) {
    if (cfg->n_warnings >= CONFIG_MAX_WARNINGS) return;
    char *slot = cfg->warnings[cfg->n_warnings++];
    if (cfg->n_warnings == CONFIG_MAX_WARNINGS) {
        snprintf(slot, sizeof cfg->warnings[0], "more warnings were dropped");
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(slot, sizeof cfg->warnings[0], fmt, ap);
    va_end(ap);
}

/* ---- names ------------------------------------------------------------------- */

const char *configPrecisionName(NsaPrecision p) {
    switch (p) {
    case NSA_PREC_F32: return "fp32";
    case NSA_PREC_F64: return "fp64";
    case NSA_PREC_BF16: return "bf16";
    case NSA_PREC_FP16: return "fp16";
    }
    return "unknown";
}

const char *configDeviceName(NsaDevice d) {
    switch (d) {
    case NSA_DEVICE_CPU: return "cpu";
    case NSA_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

NsaPrecision configAutoPrecision(NsaDevice d) {
    return d == NSA_DEVICE_CUDA ? NSA_PREC_BF16 : NSA_PREC_F32;
}

/* "auto" means cuda when this build has the CUDA engine and the NVIDIA
 * driver's control device exists; probing the driver itself would pull the
 * CUDA runtime into config loading. */
static NsaDevice autoDevice(void) {
#ifdef NSA_HAVE_CUDA
    if (access("/dev/nvidiactl", F_OK) == 0) return NSA_DEVICE_CUDA;
#endif
    return NSA_DEVICE_CPU;
}

/* runtime.threads 0 means one per online core; resolved at load like
 * "auto", so the engine (where 0 means 1) always gets a real count. */
static int onlineCores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n; /* the engine's most (nsaModelCreate) */
}

static const char *enumName(const EnumName *names, int value) {
    for (const EnumName *e = names; e->name; e++)
        if (e->value == value) return e->name;
    return "unknown";
}

/* Writes the distinct canonical names ("a, b, c") of an enum table. */
static void enumList(const EnumName *names, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    for (const EnumName *e = names; e->name; e++) {
        int seen = 0;
        for (const EnumName *f = names; f < e; f++) seen |= f->value == e->value;
        if (seen) continue;
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", e->name);
        if (n >= cap) break;
    }
}

static int lookupEnum(const EnumName *names, const char *s, int *value) {
    for (const EnumName *e = names; e->name; e++) {
        if (!strcasecmp(e->name, s)) {
            *value = e->value;
            return 0;
        }
    }
    return -1;
}

/* ---- defaults ----------------------------------------------------------------- */

void configDefaults(JobConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    /* the prototype's production model, as the engine defines it */
    nsaModelConfigDefaults(&cfg->model);

    TrainConfig *t = &cfg->train;
    t->steps = 1000;
    t->seq_len = 2048;
    t->batch_size = 8;
    t->accumulate_grad_batches = 1;
    t->lr = 6e-4;
    t->min_lr = 6e-5;
    t->warmup_steps = 100;
    t->weight_decay = 0.1;
    t->grad_clip = 1.0;
    t->beta1 = 0.9;
    t->beta2 = 0.95;
    t->eps = 1e-8;
    t->seed = 1337;
    t->log_every = 10;
    t->eval_every = 250;
    t->eval_batches = 20;
    t->save_every = 500;
    t->keep_last = 3;
    snprintf(t->out_dir, sizeof t->out_dir, "runs/default");

    cfg->runtime.device_auto = 1;
    cfg->runtime.device = autoDevice();
    cfg->runtime.precision_auto = 1;
    cfg->runtime.precision = configAutoPrecision(cfg->runtime.device);
    cfg->runtime.threads = onlineCores();
    cfg->runtime.gpus = 0; /* all */
    cfg->runtime.cpu_ranks = 1;

    cfg->data.source = DATA_SYNTHETIC;
    snprintf(cfg->data.tokenizer, sizeof cfg->data.tokenizer, "byte");
    cfg->data.val_fraction = 0.05;
    cfg->data.prefetch = 4;

    cfg->nan.policy = NAN_HALT;
    cfg->nan.max_skips = 10;

    cfg->fault.nan_kind = FAULT_NONE;
    snprintf(cfg->fault.stall_phase, sizeof cfg->fault.stall_phase, "forward");

    cfg->watchdog.data = 120;
    cfg->watchdog.forward = 300;
    cfg->watchdog.backward = 300;
    cfg->watchdog.allreduce = 300;
    cfg->watchdog.optimizer = 120;
    cfg->watchdog.checkpoint = 900;
    cfg->watchdog.eval = 1800;
    cfg->watchdog.on_hang = HANG_REPORT;
}

/* ---- scalar parsing -------------------------------------------------------------- */

/* Where a node sits, for messages: "FILE:LINE: " or "line LINE: ". */
typedef struct Source {
    const char *path; /* NULL for strings */
    int model_only;   /* a model config: the model and nsa sections alone */
    YamlTagList *tags; /* the tags the text names; NULL: none */
} Source;

static void where(const Source *src, const yaml_node_t *node, char *out, size_t cap) {
    size_t line = node ? node->start_mark.line + 1 : 0;
    if (src->path)
        snprintf(out, cap, "%s:%zu: ", src->path, line);
    else
        snprintf(out, cap, "line %zu: ", line);
}

/* A short printable rendering of a node's value for messages. */
static void showValue(const yaml_node_t *node, char *out, size_t cap) {
    if (node->type == YAML_MAPPING_NODE) {
        snprintf(out, cap, "a mapping");
    } else if (node->type == YAML_SEQUENCE_NODE) {
        snprintf(out, cap, "a list");
    } else {
        const char *v = (const char *)node->data.scalar.value;
        int quoted = node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
        size_t n = 0;
        if (quoted && n + 1 < cap) out[n++] = '"';
        for (size_t i = 0; v[i] && n + 5 < cap; i++) {
            if (i == 60) {
                memcpy(out + n, "...", 3);
                n += 3;
                break;
            }
            unsigned char c = (unsigned char)v[i];
            out[n++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
        }
        if (quoted && n + 1 < cap) out[n++] = '"';
        if (n == 0 && cap > 8) {
            memcpy(out, "(empty)", 7);
            n = 7;
        }
        out[n] = '\0';
    }
}

static int isPlain(const yaml_node_t *node) {
    return node->type == YAML_SCALAR_NODE && node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static int isNull(const yaml_node_t *node) {
    if (!isPlain(node)) return 0;
    const char *v = (const char *)node->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static int parseInteger(const char *text, int64_t *out) {
    char buf[64];
    if (strlen(text) >= sizeof buf) return -1;
    yamlStripUnderscores(text, buf, sizeof buf);
    const char *p = buf;
    if (*p == '+') p++;
    if (!*p) return -1;
    for (const char *q = (*p == '-') ? p + 1 : p; *q; q++)
        if (!isdigit((unsigned char)*q)) return -1;
    if (!isdigit((unsigned char)p[*p == '-'])) return -1;
    errno = 0;
    long long v = strtoll(p, NULL, 10);
    if (errno == ERANGE) return -2;
    *out = v;
    return 0;
}

static int parseUnsigned(const char *text, uint64_t *out) {
    char buf[64];
    if (strlen(text) >= sizeof buf) return -1;
    yamlStripUnderscores(text, buf, sizeof buf);
    const char *p = buf + (buf[0] == '+');
    if (!*p) return -1;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return -1;
    errno = 0;
    unsigned long long v = strtoull(p, NULL, 10);
    if (errno == ERANGE) return -2;
    *out = v;
    return 0;
}

static int parseReal(const char *text, double *out) {
    char buf[128];
    if (strlen(text) >= sizeof buf) return -1;
    yamlStripUnderscores(text, buf, sizeof buf);
    if (!buf[0]) return -1;
    /* strtod would also take "nan", "inf" and hex floats: only decimal here */
    for (const char *q = buf; *q; q++)
        if (!strchr("0123456789+-.eE", *q)) return -1;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (*end || end == buf) return -1;
    if (errno == ERANGE && fabs(v) > 1.0) return -2;
    *out = v;
    return 0;
}

/* "allowed: ..." for a numeric key */
static void describeRange(const ConfigKey *k, char *out, size_t cap) {
    const char *what = (k->type == KEY_DOUBLE || k->type == KEY_FLOAT) ? "a number" : "an integer";
    if (k->type == KEY_UINT64) {
        snprintf(out, cap, "an integer from 0 to %llu", (unsigned long long)UINT64_MAX);
        return;
    }
    int min_open = k->range_flags & RANGE_MIN_OPEN, max_open = k->range_flags & RANGE_MAX_OPEN;
    if (k->max >= BIG)
        snprintf(out, cap, "%s %s %g", what, min_open ? ">" : ">=", k->min);
    else if (!min_open && !max_open)
        snprintf(out, cap, "%s from %g to %g", what, k->min, k->max);
    else
        snprintf(out, cap, "%s with %g %s x %s %g", what, k->min, min_open ? "<" : "<=",
                 max_open ? "<" : "<=", k->max);
}

static int inRange(const ConfigKey *k, double v) {
    if (k->range_flags & RANGE_MIN_OPEN ? v <= k->min : v < k->min) return 0;
    if (k->range_flags & RANGE_MAX_OPEN ? v >= k->max : v > k->max) return 0;
    return 1;
}

/* Honours the tag written on node, if any, for `name` (section.key), which
 * takes the core tags in `kinds` and `what` (for messages). A core tag the
 * key takes is the value's type whatever its quoting: !!str reads the value
 * as a quoted string ("5"), !!int, !!float, !!bool and !!null as the plain
 * scalar (!!int "3" is 3), once its text is a value of that type; !!map
 * and !!seq only say what the node is. Any other tag, or a core tag the key
 * does not take, is an error naming the key and the line. The node's style
 * is rewritten to match (the document is the caller's). Returns 0 or -1
 * with err. */
static int tagApply(const Source *src, yaml_node_t *node, const char *name, int kinds,
                    const char *what, NsaError *err) {
    if (!yamlTagOf(src->tags, node)) return 0;
    char at[CONFIG_PATH_MAX + 32], value[128];
    where(src, node, at, sizeof at);
    showValue(node, value, sizeof value);
    return yamlTagApply(src->tags, node, at, name, value, kinds, what, err);
}

/* The core tags a key takes, and what it takes, for tagApply. */
static int keyTags(const ConfigKey *k, char *what, size_t cap) {
    switch (k->type) {
    case KEY_INT:
    case KEY_INT64:
    case KEY_UINT64:
        describeRange(k, what, cap);
        return YTAG_INT;
    case KEY_DOUBLE:
    case KEY_FLOAT:
        describeRange(k, what, cap);
        return YTAG_INT | YTAG_FLOAT;
    case KEY_STRING:
        snprintf(what, cap, "a string");
        return YTAG_STR | YTAG_NULL;
    case KEY_ENUM: {
        int v;
        enumList(k->names, what, cap);
        if (k->names == device_names || k->names == precision_names)
            snprintf(what + strlen(what), cap - strlen(what), ", auto");
        return YTAG_STR | (lookupEnum(k->names, "true", &v) == 0 ? YTAG_BOOL : 0);
    }
    case KEY_GPUS:
        snprintf(what, cap, "all, a GPU count or a list of ordinals");
        return YTAG_INT | YTAG_STR | YTAG_SEQ;
    case KEY_NODES:
        snprintf(what, cap, "a list of HOST:PORT addresses");
        return YTAG_STR | YTAG_SEQ | YTAG_NULL;
    }
    snprintf(what, cap, "a value");
    return 0;
}

/* Stores one scalar node into the field of key k. Returns 0 or -1 with err. */
static int applyKey(JobConfig *cfg, const ConfigKey *k, const yaml_node_t *node, const Source *src,
                    NsaError *err) {
    char at[CONFIG_PATH_MAX + 32], shown[128], allowed[320];
    where(src, node, at, sizeof at);
    showValue(node, shown, sizeof shown);
    void *field = (char *)cfg + k->offset;
    const char *text = node->type == YAML_SCALAR_NODE ? (const char *)node->data.scalar.value : "";

    switch (k->type) {
    case KEY_INT:
    case KEY_INT64:
    case KEY_UINT64:
    case KEY_DOUBLE:
    case KEY_FLOAT: {
        describeRange(k, allowed, sizeof allowed);
        int is_real = k->type == KEY_DOUBLE || k->type == KEY_FLOAT;
        if (!isPlain(node) || isNull(node))
            return nsaErrorf(err, "%s%s.%s: %s is not %s; allowed: %s", at, k->section, k->key, shown,
                            is_real ? "a number" : "an integer", allowed);
        char name[80], plain[128], octal[32];
        snprintf(name, sizeof name, "%s.%s", k->section, k->key);
        if (yamlLeadingZero(text, plain, sizeof plain, octal, sizeof octal))
            return yamlLeadingZeroError(err, at, name, shown, allowed, plain, octal);
        double v;
        int rc;
        if (k->type == KEY_UINT64) {
            uint64_t u = 0;
            rc = parseUnsigned(text, &u);
            if (rc == 0) {
                *(uint64_t *)field = u;
                return 0;
            }
            v = 0;
        } else if (is_real) {
            rc = parseReal(text, &v);
        } else {
            int64_t i = 0;
            rc = parseInteger(text, &i);
            v = (double)i;
            if (rc == 0 && inRange(k, v)) {
                if (k->type == KEY_INT)
                    *(int *)field = (int)i;
                else
                    *(int64_t *)field = i;
                return 0;
            }
        }
        if (rc == -1)
            return nsaErrorf(err, "%s%s.%s: %s is not %s; allowed: %s", at, k->section, k->key, shown,
                            is_real ? "a number" : "an integer", allowed);
        /* a nonzero number the field cannot hold: 1e-400 reads as 0, a
         * float key's 1e-50 becomes 0 when stored */
        double smallest = k->type == KEY_FLOAT ? FLT_MIN : DBL_MIN;
        double stored = k->type == KEY_FLOAT ? (double)(float)v : v;
        if (rc == 0 && is_real && yamlTooSmall(text, stored, smallest))
            return yamlTooSmallError(err, at, name, shown, allowed, stored, smallest);
        if (rc == -2 || !inRange(k, v))
            return nsaErrorf(err, "%s%s.%s: %s is out of range; allowed: %s", at, k->section, k->key,
                            shown, allowed);
        if (k->type == KEY_FLOAT)
            *(float *)field = (float)v;
        else
            *(double *)field = v;
        return 0;
    }
    case KEY_STRING: {
        if (node->type != YAML_SCALAR_NODE)
            return nsaErrorf(err, "%s%s.%s: %s is not a string; allowed: a string", at, k->section,
                            k->key, shown);
        if (isNull(node)) text = "";
        if (strlen(text) >= k->size)
            return nsaErrorf(err, "%s%s.%s: %s is too long; allowed: at most %zu bytes", at,
                            k->section, k->key, shown, k->size - 1);
        memcpy(field, text, strlen(text) + 1);
        return 0;
    }
    case KEY_ENUM: {
        enumList(k->names, allowed, sizeof allowed);
        int is_device = k->names == device_names, is_precision = k->names == precision_names;
        if (node->type != YAML_SCALAR_NODE || isNull(node))
            return nsaErrorf(err, "%s%s.%s: %s is not a name; allowed: %s%s", at, k->section, k->key,
                            shown, allowed, (is_device || is_precision) ? ", auto" : "");
        if ((is_device || is_precision) && !strcasecmp(text, "auto")) {
            if (is_device) cfg->runtime.device_auto = 1;
            if (is_precision) cfg->runtime.precision_auto = 1;
            return 0;
        }
        int value;
        if (lookupEnum(k->names, text, &value) != 0)
            return nsaErrorf(err, "%s%s.%s: %s is not a known value; allowed: %s%s%s", at, k->section,
                            k->key, shown, allowed, (is_device || is_precision) ? ", auto" : "",
                            k->names == lr_schedule_names
                                ? " (nsad's one schedule: linear warmup over train.warmup_steps, then "
                                  "cosine decay to train.min_lr)"
                                : "");
        *(int *)field = value;
        if (is_device) cfg->runtime.device_auto = 0;
        if (is_precision) cfg->runtime.precision_auto = 0;
        return 0;
    }
    case KEY_GPUS: /* applyGpus, applyNodes: they need the document for lists */
    case KEY_NODES: break;
    }
    return nsaErrorf(err, "%s%s.%s: internal error: unknown key type", at, k->section, k->key);
}

/* runtime.gpus: "all", a count, or distinct ordinals as a list ([0, 2])
 * or a comma-separated string ("0,2"). Returns 0 or -1 with err. */
static int applyGpus(JobConfig *cfg, yaml_document_t *doc, const yaml_node_t *node,
                     const Source *src, NsaError *err) {
    static const char *const allowed =
        "all, a count from 1 to 64, or a list of distinct device ordinals 0 to 255 (e.g. [0, 1] or "
        "\"0,1\")";
    char at[CONFIG_PATH_MAX + 32], shown[128];
    where(src, node, at, sizeof at);
    showValue(node, shown, sizeof shown);
    RuntimeConfig *r = &cfg->runtime;
    int list[CONFIG_MAX_GPUS], n = 0;
    if (node->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = node->data.sequence.items.start;
             it < node->data.sequence.items.top; it++) {
            yaml_node_t *item = yaml_document_get_node(doc, *it);
            int64_t v = -1;
            if (tagApply(src, item, "runtime.gpus", YTAG_INT, "a device ordinal from 0 to 255",
                         err) != 0)
                return -1;
            char plain[128], octal[32], item_shown[128];
            if (item && isPlain(item) &&
                yamlLeadingZero((const char *)item->data.scalar.value, plain, sizeof plain, octal,
                                sizeof octal)) {
                showValue(item, item_shown, sizeof item_shown);
                return yamlLeadingZeroError(err, at, "runtime.gpus", item_shown,
                                            "device ordinals 0 to 255", plain, octal);
            }
            if (!item || !isPlain(item) || parseInteger((const char *)item->data.scalar.value, &v) ||
                v < 0 || v > 255 || n == CONFIG_MAX_GPUS)
                return nsaErrorf(err, "%sruntime.gpus: %s is not a list of device ordinals; allowed: %s",
                                 at, shown, allowed);
            list[n++] = (int)v;
        }
    } else if (node->type == YAML_SCALAR_NODE && !isNull(node)) {
        const char *text = (const char *)node->data.scalar.value;
        if (!strcasecmp(text, "all")) {
            r->gpus = 0;
            r->n_gpu_list = 0;
            return 0;
        }
        if (!strchr(text, ',')) {
            int64_t v = 0;
            char plain[128], octal[32];
            if (isPlain(node) && yamlLeadingZero(text, plain, sizeof plain, octal, sizeof octal))
                return yamlLeadingZeroError(err, at, "runtime.gpus", shown, allowed, plain, octal);
            if (!isPlain(node) || parseInteger(text, &v) || v < 1 || v > CONFIG_MAX_GPUS)
                return nsaErrorf(err, "%sruntime.gpus: %s is not a GPU count or list; allowed: %s", at,
                                 shown, allowed);
            r->gpus = (int)v;
            r->n_gpu_list = 0;
            return 0;
        }
        char buf[512];
        snprintf(buf, sizeof buf, "%s", text);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
            int64_t v = -1;
            if (parseInteger(tok, &v) || v < 0 || v > 255 || n == CONFIG_MAX_GPUS)
                return nsaErrorf(err, "%sruntime.gpus: %s is not a list of device ordinals; allowed: %s",
                                 at, shown, allowed);
            list[n++] = (int)v;
        }
    }
    if (n == 0)
        return nsaErrorf(err, "%sruntime.gpus: %s names no GPU; allowed: %s", at, shown, allowed);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (list[i] == list[j])
                return nsaErrorf(err, "%sruntime.gpus: %s names GPU %d twice; allowed: %s", at, shown,
                                 list[i], allowed);
    memcpy(r->gpu_list, list, (size_t)n * sizeof(int));
    r->n_gpu_list = n;
    r->gpus = n;
    return 0;
}

int configParseNode(const char *text, char *host, size_t host_cap, int *port) {
    const char *colon = text ? strrchr(text, ':') : NULL;
    if (!colon || colon == text || (size_t)(colon - text) >= host_cap) return -1;
    int64_t p = 0;
    if (parseInteger(colon + 1, &p) || p < 1 || p > 65535) return -1;
    for (const char *c = text; c < colon; c++)
        if (!isalnum((unsigned char)*c) && !strchr(".-_[]:", *c)) return -1;
    snprintf(host, host_cap, "%.*s", (int)(colon - text), text);
    *port = (int)p;
    return 0;
}

/* runtime.nodes: "HOST:PORT" entries as a list or a comma-separated
 * string. Returns 0 or -1 with err. */
static int applyNodes(JobConfig *cfg, yaml_document_t *doc, const yaml_node_t *node,
                      const Source *src, NsaError *err) {
    static const char *const allowed =
        "a list of the other nodes' nsad addresses, HOST:PORT each (e.g. [\"10.0.0.2:8470\"] or "
        "\"10.0.0.2:8470,10.0.0.3:8470\"), up to 32";
    char at[CONFIG_PATH_MAX + 32], shown[128], entry[512];
    where(src, node, at, sizeof at);
    showValue(node, shown, sizeof shown);
    RuntimeConfig *r = &cfg->runtime;
    r->n_nodes = 0;
    const char *items[CONFIG_MAX_NODES + 1];
    int n = 0;
    char buf[CONFIG_MAX_NODES * CONFIG_NODE_MAX];
    if (node->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = node->data.sequence.items.start;
             it < node->data.sequence.items.top; it++) {
            yaml_node_t *item = yaml_document_get_node(doc, *it);
            if (tagApply(src, item, "runtime.nodes", YTAG_STR, "a HOST:PORT address", err) != 0)
                return -1;
            if (!item || item->type != YAML_SCALAR_NODE || n == CONFIG_MAX_NODES)
                return nsaErrorf(err, "%sruntime.nodes: %s is not a list of addresses; allowed: %s", at,
                                 shown, allowed);
            items[n++] = (const char *)item->data.scalar.value;
        }
    } else if (node->type == YAML_SCALAR_NODE) {
        snprintf(buf, sizeof buf, "%s", isNull(node) ? "" : (const char *)node->data.scalar.value);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ", ", &save); tok && n <= CONFIG_MAX_NODES;
             tok = strtok_r(NULL, ", ", &save))
            items[n++] = tok;
        if (n > CONFIG_MAX_NODES)
            return nsaErrorf(err, "%sruntime.nodes: more than %d nodes; allowed: %s", at,
                             CONFIG_MAX_NODES, allowed);
    } else {
        return nsaErrorf(err, "%sruntime.nodes: %s is not a list of addresses; allowed: %s", at, shown,
                         allowed);
    }
    for (int i = 0; i < n; i++) {
        char host[CONFIG_NODE_MAX];
        int port;
        snprintf(entry, sizeof entry, "%s", items[i]);
        if (strlen(entry) >= CONFIG_NODE_MAX || configParseNode(entry, host, sizeof host, &port))
            return nsaErrorf(err, "%sruntime.nodes: \"%.80s\" is not HOST:PORT; allowed: %s", at, entry,
                             allowed);
        for (int j = 0; j < r->n_nodes; j++)
            if (!strcmp(r->nodes[j], entry))
                return nsaErrorf(err, "%sruntime.nodes: %s is named twice; allowed: %s", at, entry, allowed);
        snprintf(r->nodes[r->n_nodes++], CONFIG_NODE_MAX, "%s", entry);
    }
    return 0;
}

/* ---- the document walk ------------------------------------------------------------ */

/* Levenshtein distance, capped: for "did you mean" hints. */
static int editDistance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40) return 99;
    int prev[41], cur[41];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

/* "dim, n_layers, ..." for a section, and the closest name to `wrong`. */
static void sectionKeys(const char *section, const char *wrong, char *list, size_t cap,
                        const char **closest) {
    size_t n = 0;
    int best = 3;  /* suggest only near misses */
    *closest = NULL;
    list[0] = '\0';
    for (size_t i = 0; i < N_KEYS; i++) {
        if (strcmp(configKeys[i].section, section)) continue;
        n += (size_t)snprintf(list + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", configKeys[i].key);
        int d = editDistance(wrong, configKeys[i].key);
        if (d < best) {
            best = d;
            *closest = configKeys[i].key;
        }
    }
    for (size_t i = 0; i < N_ALIASES; i++) {
        if (strcmp(keyAliases[i].section, section)) continue;
        n += (size_t)snprintf(list + n, n < cap ? cap - n : 0, ", %s", keyAliases[i].key);
    }
}

static const ConfigKey *findKey(const char *section, const char *key) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(configKeys[i].section, section) && !strcmp(configKeys[i].key, key))
            return &configKeys[i];
    return NULL;
}

static const IgnoredKey *findIgnored(const char *section, const char *key) {
    for (size_t i = 0; i < N_IGNORED; i++)
        if (!strcmp(ignoredKeys[i].section, section) && !strcmp(ignoredKeys[i].key, key))
            return &ignoredKeys[i];
    return NULL;
}

static const KeyAlias *findAlias(const char *section, const char *key) {
    for (size_t i = 0; i < N_ALIASES; i++)
        if (!strcmp(keyAliases[i].section, section) && !strcmp(keyAliases[i].key, key))
            return &keyAliases[i];
    return NULL;
}

/* YAML 1.1's booleans, as the prototype's loader (PyYAML) reads them. */
static int yamlBool(const yaml_node_t *node, int *value) {
    static const char *const yes[] = {"true", "yes", "on", NULL}, *const no[] = {"false", "no", "off", NULL};
    if (!isPlain(node)) return -1;
    const char *v = (const char *)node->data.scalar.value;
    for (int i = 0; yes[i]; i++)
        if (!strcasecmp(v, yes[i])) return *value = 1, 0;
    for (int i = 0; no[i]; i++)
        if (!strcasecmp(v, no[i])) return *value = 0, 0;
    return -1;
}

/* The tags of an ignored key's value (tagApply): a boolean takes !!bool, a
 * count !!int, any other value any core tag, on it and on everything in it
 * (nsad reads none of it, but an unknown tag is still refused). Returns 0
 * or -1 with err. */
static int ignoredTags(const IgnoredKey *ig, yaml_node_t *node, const Source *src, NsaError *err) {
    char name[80];
    snprintf(name, sizeof name, "%s.%s", ig->section, ig->key);
    if (ig->type == IGNORED_BOOL) return tagApply(src, node, name, YTAG_BOOL, "true or false", err);
    if (ig->type == IGNORED_COUNT)
        return tagApply(src, node, name, YTAG_INT, "an integer >= 0", err);
    if (!src->tags) return 0;
    const int any = YTAG_STR | YTAG_INT | YTAG_FLOAT | YTAG_BOOL | YTAG_NULL | YTAG_MAP | YTAG_SEQ;
    for (size_t i = 0; i < src->tags->len; i++) {
        YamlTagMark *m = &src->tags->marks[i];
        if (m->index < node->start_mark.index || m->index >= node->end_mark.index) continue;
        m->used = 1;
        int kind = yamlTagKind(m);
        if (kind && ((kind == YTAG_MAP) == (m->type == YAML_MAPPING_NODE)) &&
            ((kind == YTAG_SEQ) == (m->type == YAML_SEQUENCE_NODE)))
            continue;
        char at[CONFIG_PATH_MAX + 32], tag[80], allowed[200];
        yamlTagShort(m, tag, sizeof tag);
        yamlTagsAllowed(any, allowed, sizeof allowed);
        if (src->path)
            snprintf(at, sizeof at, "%s:%zu: ", src->path, m->line);
        else
            snprintf(at, sizeof at, "line %zu: ", m->line);
        return nsaErrorf(
            err, "%s%s: the tag %s %s; allowed: any value (a prototype setting nsad ignores), %s",
            at, name, tag, kind ? "does not fit its value" : "is not supported", allowed);
    }
    return 0;
}

/* An ignored prototype key: its value checked as the prototype would, then
 * a warning (none for a false switch whose false nsad honours). Returns 0 or
 * -1 with err. */
static int applyIgnored(JobConfig *cfg, const IgnoredKey *ig, const yaml_node_t *node, const Source *src,
                        NsaError *err) {
    char at[CONFIG_PATH_MAX + 32], shown[128];
    where(src, node, at, sizeof at);
    showValue(node, shown, sizeof shown);
    if (ig->type == IGNORED_BOOL) {
        int on;
        if (yamlBool(node, &on) != 0)
            return nsaErrorf(err, "%s%s.%s: %s is not a boolean; allowed: true or false (a prototype setting "
                            "nsad ignores)", at, ig->section, ig->key, shown);
        if (!on && ig->false_is_honoured) return 0;
    } else if (ig->type == IGNORED_COUNT) {
        int64_t v;
        char name[80], plain[128], octal[32];
        snprintf(name, sizeof name, "%s.%s", ig->section, ig->key);
        if (isPlain(node) && yamlLeadingZero((const char *)node->data.scalar.value, plain,
                                             sizeof plain, octal, sizeof octal))
            return yamlLeadingZeroError(err, at, name, shown,
                                        "an integer >= 0 (a prototype setting nsad ignores)", plain,
                                        octal);
        if (!isPlain(node) || isNull(node) || parseInteger((const char *)node->data.scalar.value, &v) != 0 ||
            v < 0)
            return nsaErrorf(err, "%s%s.%s: %s is not a count; allowed: an integer >= 0 (a prototype setting "
                            "nsad ignores)", at, ig->section, ig->key, shown);
    }
    addWarning(cfg, "%s.%s: %s ignored (a prototype setting: %s)", ig->section, ig->key, shown, ig->why);
    return 0;
}

/* Which keys a file gave, and where: an alias and its key agree, and a
 * default that follows another key (model.vocab_size from the tokenizer)
 * applies only when the file did not set it. */
typedef struct Given {
    const yaml_node_t *node[N_KEYS];
    const char *name[N_KEYS];  /* the spelling used */
} Given;

/* Reports the second occurrence of a key in a mapping, if any. */
static int checkDuplicates(yaml_document_t *doc, const yaml_node_t *map, const char *prefix,
                           const Source *src, NsaError *err) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (!k || k->type != YAML_SCALAR_NODE) continue;
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *k0 = yaml_document_get_node(doc, q->key);
            if (k0 && k0->type == YAML_SCALAR_NODE &&
                !strcmp((const char *)k0->data.scalar.value, (const char *)k->data.scalar.value)) {
                char at[CONFIG_PATH_MAX + 32];
                where(src, k, at, sizeof at);
                return nsaErrorf(err, "%s%s%s: duplicate key (first given on line %zu); allowed: each key once",
                                at, prefix, (const char *)k->data.scalar.value, k0->start_mark.line + 1);
            }
        }
    }
    return 0;
}

static int walkSection(JobConfig *cfg, yaml_document_t *doc, const char *section,
                       const yaml_node_t *map, const Source *src, Given *given, NsaError *err) {
    char at[CONFIG_PATH_MAX + 32], list[400], prefix[40];
    snprintf(prefix, sizeof prefix, "%s.", section);
    if (checkDuplicates(doc, map, prefix, src, err) != 0) return -1;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(doc, p->value);
        where(src, kn, at, sizeof at);
        if (!kn || kn->type != YAML_SCALAR_NODE || !vn)
            return nsaErrorf(err, "%s%s: a key that is not a plain name; allowed: key: value pairs", at,
                            section);
        const char *key = (const char *)kn->data.scalar.value;
        char name[80], what[400];
        snprintf(name, sizeof name, "%s.%.60s", section, key);
        if (tagApply(src, kn, name, YTAG_STR, "a key name", err) != 0) return -1;
        const KeyAlias *alias = findAlias(section, key);
        const ConfigKey *k = findKey(section, alias ? alias->canonical : key);
        if (k) {
            size_t idx = (size_t)(k - configKeys);
            int kinds = keyTags(k, what, sizeof what);
            if (tagApply(src, vn, name, kinds, what, err) != 0) return -1;
            double *real = k->type == KEY_DOUBLE ? (double *)((char *)cfg + k->offset) : NULL;
            double before = real ? *real : 0;
            if ((k->type == KEY_GPUS    ? applyGpus(cfg, doc, vn, src, err)
                 : k->type == KEY_NODES ? applyNodes(cfg, doc, vn, src, err)
                                        : applyKey(cfg, k, vn, src, err)) != 0)
                return -1;
            /* the other spelling of the same key (a repeated spelling is a
             * duplicate, reported above) */
            if (given->node[idx] && real && *real != before) {
                char shown[128], first[128];
                showValue(vn, shown, sizeof shown);
                showValue(given->node[idx], first, sizeof first);
                return nsaErrorf(err, "%s%s.%s: %s disagrees with %s.%s: %s (line %zu); allowed: one of the "
                                "two (%s.%s is the prototype's name for %s.%s), or the same value in both",
                                at, section, key, shown, section, given->name[idx], first,
                                given->node[idx]->start_mark.line + 1, section,
                                alias ? key : given->name[idx], section, k->key);
            }
            given->node[idx] = vn;
            given->name[idx] = key;
            continue;
        }
        const IgnoredKey *ig = findIgnored(section, key);
        if (ig) {
            if (ignoredTags(ig, vn, src, err) != 0 || applyIgnored(cfg, ig, vn, src, err) != 0)
                return -1;
            continue;
        }
        const char *closest;
        sectionKeys(section, key, list, sizeof list, &closest);
        return nsaErrorf(err, "%s%s.%s: unknown key; allowed: %s%s%s%s", at, section, key, list,
                        closest ? "; did you mean " : "", closest ? closest : "", closest ? "?" : "");
    }
    return 0;
}

static int walkRoot(JobConfig *cfg, yaml_document_t *doc, const Source *src, Given *given, NsaError *err) {
    char at[CONFIG_PATH_MAX + 32], shown[128];
    static const char *const section_list =
        "model, nsa, train, runtime, data, nan, fault, watchdog";
    yaml_node_t *root = yaml_document_get_root_node(doc);
    char what[480];
    snprintf(what, sizeof what, "a mapping of sections (%s)", section_list);
    if (tagApply(src, root, "config", YTAG_MAP | YTAG_NULL, what, err) != 0) return -1;
    if (!root || (root->type == YAML_SCALAR_NODE && isNull(root)))
        return nsaErrorf(err, "%s%sconfig is empty; allowed: a mapping of sections (%s)",
                        src->path ? src->path : "", src->path ? ": " : "", section_list);
    where(src, root, at, sizeof at);
    if (root->type != YAML_MAPPING_NODE) {
        showValue(root, shown, sizeof shown);
        return nsaErrorf(err, "%sconfig: %s is not a mapping; allowed: a mapping of sections (%s)", at,
                        shown, section_list);
    }
    if (checkDuplicates(doc, root, "", src, err) != 0) return -1;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(doc, p->value);
        where(src, kn, at, sizeof at);
        if (!kn || kn->type != YAML_SCALAR_NODE || !vn)
            return nsaErrorf(err, "%sconfig: a section name that is not a plain name; allowed: %s", at,
                            section_list);
        const char *name = (const char *)kn->data.scalar.value;
        if (tagApply(src, kn, name, YTAG_STR, "a section name", err) != 0) return -1;
        int known = 0;
        for (int i = 0; sections[i]; i++) known |= !strcmp(sections[i], name);
        if (known && src->model_only && strcmp(name, "model") && strcmp(name, "nsa"))
            return nsaErrorf(err, "%s%s: not a section of a model config; allowed: model, nsa", at,
                             name);
        if (!known) {
            const char *closest = NULL;
            int best = 3;
            for (int i = 0; sections[i]; i++) {
                int d = editDistance(name, sections[i]);
                if (d < best) {
                    best = d;
                    closest = sections[i];
                }
            }
            return nsaErrorf(err, "%s%s: unknown section; allowed: %s%s%s%s", at, name, section_list,
                            closest ? "; did you mean " : "", closest ? closest : "", closest ? "?" : "");
        }
        char list[400];
        const char *unused;
        sectionKeys(name, "", list, sizeof list, &unused);
        snprintf(what, sizeof what, "a mapping of %s", list);
        if (tagApply(src, vn, name, YTAG_MAP | YTAG_NULL, what, err) != 0) return -1;
        if (vn->type == YAML_SCALAR_NODE && isNull(vn)) continue;  /* "nan:" with nothing under it */
        if (vn->type != YAML_MAPPING_NODE) {
            showValue(vn, shown, sizeof shown);
            where(src, vn, at, sizeof at);
            return nsaErrorf(err, "%s%s: %s is not a mapping; allowed: a mapping of %s", at, name, shown,
                            list);
        }
        if (walkSection(cfg, doc, name, vn, src, given, err) != 0) return -1;
    }
    return 0;
}

/* Checks made at load time only: they need to know what the file said. */
static void loadWarnings(JobConfig *cfg) {
    if (cfg->data.source == DATA_SYNTHETIC && cfg->data.path[0])
        addWarning(cfg, "data.path: \"%s\" ignored (data.source is synthetic)", cfg->data.path);
    if (cfg->runtime.gradient_checkpointing && cfg->runtime.device == NSA_DEVICE_CPU)
        addWarning(cfg, "runtime.gradient_checkpointing: %s has no effect on device cpu (the CPU engine "
                        "keeps every activation)",
                   enumName(recompute_names, cfg->runtime.gradient_checkpointing));
}

static int validateModel(const JobConfig *cfg, int model_only, NsaError *err);

static int loadParser(JobConfig *cfg, yaml_parser_t *parser, const Source *src, NsaError *err) {
    yaml_document_t doc;
    if (!yaml_parser_load(parser, &doc)) {
        if (parser->error == YAML_READER_ERROR) {  /* bad bytes: libyaml has an offset, no line */
            char byte[24] = "";
            if (parser->problem_value != -1) snprintf(byte, sizeof byte, " (byte 0x%02x)", parser->problem_value);
            return nsaErrorf(err, "%s%sbyte offset %zu: malformed YAML: %s%s; allowed: UTF-8 text",
                            src->path ? src->path : "", src->path ? ": " : "", parser->problem_offset,
                            parser->problem ? parser->problem : "unreadable input", byte);
        }
        const char *ctx = parser->context ? parser->context : "";
        size_t line = parser->problem_mark.line + 1, col = parser->problem_mark.column + 1;
        if (src->path)
            return nsaErrorf(err, "%s:%zu:%zu: malformed YAML: %s%s%s", src->path, line, col,
                            parser->problem ? parser->problem : "parse error", *ctx ? " " : "", ctx);
        return nsaErrorf(err, "line %zu, column %zu: malformed YAML: %s%s%s", line, col,
                        parser->problem ? parser->problem : "parse error", *ctx ? " " : "", ctx);
    }
    Given *given = calloc(1, sizeof *given);
    if (!given) {
        yaml_document_delete(&doc);
        return nsaErrorf(err, "%s%sout of memory", src->path ? src->path : "", src->path ? ": " : "");
    }
    int rc = walkRoot(cfg, &doc, src, given, err);
    /* the walk reads every node it keeps; a tag it did not meet is refused
     * all the same */
    if (rc == 0) rc = yamlTagsUnread(src->tags, src->path, err);
    /* the prototype took the vocabulary from its tokenizer (gpt2: 50257) */
    const ConfigKey *vocab = findKey("model", "vocab_size");
    int tokenizer_vocab = tokenizerVocabOf(cfg->data.tokenizer);
    if (rc == 0 && !src->model_only && !given->node[vocab - configKeys] && tokenizer_vocab > 0)
        cfg->model.vocab_size = tokenizer_vocab;
    free(given);
    yaml_document_delete(&doc);
    if (rc != 0) return -1;

    /* a second document ("---") would be silently ignored otherwise */
    yaml_document_t extra;
    if (yaml_parser_load(parser, &extra)) {
        yaml_node_t *root = yaml_document_get_root_node(&extra);
        size_t line = root ? root->start_mark.line + 1 : 0;
        yaml_document_delete(&extra);
        if (root) {
            if (src->path)
                return nsaErrorf(err, "%s:%zu: a second YAML document; allowed: one document per config",
                                src->path, line);
            return nsaErrorf(err, "line %zu: a second YAML document; allowed: one document per config",
                            line);
        }
    } else {
        return nsaErrorf(err, "%s%smalformed YAML after the first document: %s", src->path ? src->path : "",
                        src->path ? ": " : "", parser->problem ? parser->problem : "parse error");
    }

    if (src->model_only) return validateModel(cfg, 1, err);
    if (cfg->runtime.device_auto) cfg->runtime.device = autoDevice();
    if (cfg->runtime.precision_auto) cfg->runtime.precision = configAutoPrecision(cfg->runtime.device);
    if (cfg->runtime.threads == 0) cfg->runtime.threads = onlineCores();
    loadWarnings(cfg);
    if (configValidate(cfg, err) != 0) {
        if (src->path && err) {  /* name the file, as the per-key errors do */
            char msg[sizeof err->message];
            snprintf(msg, sizeof msg, "%s", err->message);
            nsaErrorf(err, "%s: %s", src->path, msg);
        }
        return -1;
    }
    return 0;
}

/* Loads len bytes of text: the limits first (yamllimit.h), then the document. */
static int loadText(JobConfig *cfg, const char *text, size_t len, const Source *src, NsaError *err) {
    if (yamlLimitCheck(text, len, &yamlConfigLimits, src->path, err) != 0) return -1;
    YamlTagList tags = {0};
    Source tagged = *src;
    tagged.tags = &tags;
    if (yamlTagsCollect(text, len, &tags) != 0) {
        yamlTagsFree(&tags);
        return nsaErrorf(err, "config: out of memory");
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        yamlTagsFree(&tags);
        return nsaErrorf(err, "config: out of memory");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = loadParser(cfg, &parser, &tagged, err);
    yaml_parser_delete(&parser);
    yamlTagsFree(&tags);
    return rc;
}

int configLoadString(JobConfig *cfg, const char *yaml, size_t len, NsaError *err) {
    Source src = {NULL, 0, NULL};
    return loadText(cfg, yaml, len, &src, err);
}

int configLoadModelString(JobConfig *cfg, const char *yaml, size_t len, NsaError *err) {
    Source src = {NULL, 1, NULL};
    return loadText(cfg, yaml, len, &src, err);
}

int configLoadFile(JobConfig *cfg, const char *path, NsaError *err) {
    size_t len = 0;
    NsaError ferr;
    char *text = fsReadRegular(path, YAML_LIMIT_BYTES, &len, &ferr);
    if (!text) {
        if (errno == EFBIG)
            return nsaErrorf(err, "%s: over %zu bytes; allowed: a config of at most %zu bytes", path,
                             YAML_LIMIT_BYTES, YAML_LIMIT_BYTES);
        struct stat st;
        if ((errno == EISDIR || errno == EINVAL) && stat(path, &st) == 0)
            return nsaErrorf(err, "%s: is %s; allowed: a YAML or JSON config file", path, fsKindName(st.st_mode));
        return nsaErrorf(err, "%s: cannot open config: %s", path, strerror(errno));
    }
    Source src = {path, 0, NULL};
    int rc = loadText(cfg, text, len, &src, err);
    free(text);
    return rc;
}

/* ---- validation -------------------------------------------------------------------- */

/* The engine's own rules for the model (nsaModelConfigValidate). Returns 0
 * or -1 with err. */
static int validateEngine(const NsaModelConfig *m, NsaError *err) {
    NsaError engine_err;
    if (nsaModelConfigValidate(m, &engine_err) != 0)
        return nsaErrorf(err, "model: the engine refuses the model: %s", engine_err.message);
    return 0;
}

/* The rules of the model alone: each key's range (of the model and nsa
 * sections only when model_only, else of every section), then the rules
 * relating the model's keys; with model_only the engine's own rules too
 * (configValidate checks those last, after the other sections). Returns 0
 * or -1 with err. */
static int validateModel(const JobConfig *cfg, int model_only, NsaError *err) {
    /* every key's own range first: structs filled in code (overrides, the
     * HTTP API) get the same checks as files */
    char allowed[320];
    for (size_t i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &configKeys[i];
        if (model_only && strcmp(k->section, "model") && strcmp(k->section, "nsa")) continue;
        const void *field = (const char *)cfg + k->offset;
        double v;
        switch (k->type) {
        case KEY_INT: v = *(const int *)field; break;
        case KEY_INT64: v = (double)*(const int64_t *)field; break;
        case KEY_DOUBLE: v = *(const double *)field; break;
        case KEY_FLOAT: v = *(const float *)field; break;
        case KEY_ENUM: {
            int value = *(const int *)field;
            if (strcmp(enumName(k->names, value), "unknown")) continue;
            enumList(k->names, allowed, sizeof allowed);
            return nsaErrorf(err, "%s.%s: %d is not a known value; allowed: %s", k->section, k->key,
                            value, allowed);
        }
        default: continue;
        }
        if (!isfinite(v) || !inRange(k, v)) {
            describeRange(k, allowed, sizeof allowed);
            return nsaErrorf(err, "%s.%s: %.17g is out of range; allowed: %s", k->section, k->key, v,
                            allowed);
        }
    }

    const NsaModelConfig *m = &cfg->model;
    if (m->n_heads % m->n_kv_groups != 0)
        return nsaErrorf(err, "model.n_heads: %d is not divisible by model.n_kv_groups (%d); allowed: a "
                        "multiple of n_kv_groups", m->n_heads, m->n_kv_groups);
    if (m->d_k % 2 != 0)
        return nsaErrorf(err, "model.d_k: %d is odd; allowed: an even number (RoPE rotates pairs of dims)",
                        m->d_k);
    if (m->cmp_len % m->cmp_stride != 0)
        return nsaErrorf(err, "nsa.d: %d does not divide nsa.l (%d); allowed: a divisor of l and l_sel",
                        m->cmp_stride, m->cmp_len);
    if (m->sel_len % m->cmp_stride != 0)
        return nsaErrorf(err, "nsa.d: %d does not divide nsa.l_sel (%d); allowed: a divisor of l and l_sel",
                        m->cmp_stride, m->sel_len);
    return model_only ? validateEngine(m, err) : 0;
}

int configValidate(const JobConfig *cfg, NsaError *err) {
    if (validateModel(cfg, 0, err) != 0) return -1;
    const NsaModelConfig *m = &cfg->model;
    const TrainConfig *t = &cfg->train;
    if (t->min_lr > t->lr)
        return nsaErrorf(err, "train.min_lr: %g is above train.lr (%g); allowed: 0 to lr", t->min_lr, t->lr);
    if (!t->out_dir[0])
        return nsaErrorf(err, "train.out_dir: (empty); allowed: a directory path");
    if (t->eval_every > 0 && cfg->data.val_fraction <= 0 && !cfg->data.val_path[0])
        return nsaErrorf(err, "train.eval_every: %lld needs a validation split but data.val_fraction is 0; "
                        "allowed: 0 (no evaluation), or set data.val_fraction above 0 or data.val_path",
                        (long long)t->eval_every);

    const RuntimeConfig *r = &cfg->runtime;
    if (r->device == NSA_DEVICE_CPU && (r->precision == NSA_PREC_BF16 || r->precision == NSA_PREC_FP16))
        return nsaErrorf(err, "runtime.precision: %s is not available on device cpu%s; allowed on cpu: "
                        "fp32, fp64, auto", configPrecisionName(r->precision),
                        r->device_auto ? " (runtime.device auto found no GPU)" : "");
    if (r->device == NSA_DEVICE_CUDA && r->precision == NSA_PREC_F64)
        return nsaErrorf(err, "runtime.precision: fp64 is not available on device cuda; allowed on cuda: "
                        "fp32, bf16, fp16, auto");
    if (r->device == NSA_DEVICE_CPU && r->gpus > 0)
        return nsaErrorf(err, "runtime.gpus: %d GPU%s on device cpu%s; allowed on cpu: all (the default; "
                        "runtime.cpu_ranks sets the CPU engine's ranks)", r->gpus, r->gpus == 1 ? "" : "s",
                        r->device_auto ? " (runtime.device auto found no GPU)" : "");
    if (r->n_gpu_list < 0 || r->n_gpu_list > CONFIG_MAX_GPUS || r->gpus < 0 || r->gpus > CONFIG_MAX_GPUS)
        return nsaErrorf(err, "runtime.gpus: %d; allowed: all, 1 to %d GPUs", r->gpus, CONFIG_MAX_GPUS);
    if (r->device == NSA_DEVICE_CUDA && r->cpu_ranks > 1)
        return nsaErrorf(err, "runtime.cpu_ranks: %d on device cuda; allowed on cuda: 1 (runtime.gpus "
                        "sets the GPUs)", r->cpu_ranks);

    const DataConfig *d = &cfg->data;
    const Tokenizer *tok = tokenizerFind(d->tokenizer);
    const int known_vocab = tokenizerVocabOf(d->tokenizer);
    if (d->source == DATA_TEXT && !tok && known_vocab > 0)
        return nsaErrorf(err, "data.tokenizer: \"%s\" cannot tokenize text in nsad (data.source text); "
                        "allowed: %s with text, or tokenize the corpus with %s into llm.c .bin token shards "
                        "(e.g. llm.c's dev/data scripts) and train on them with data.source shards",
                        d->tokenizer, tokenizerNames(), d->tokenizer);
    if (d->source != DATA_SHARDS && !tok && known_vocab == 0)
        return nsaErrorf(err, "data.tokenizer: \"%s\" is not a known tokenizer; allowed: %s (or "
                        "data.source shards for pre-tokenized data)", d->tokenizer, tokenizerNames());
    if (known_vocab > 0 && m->vocab_size < known_vocab)
        return nsaErrorf(err, "model.vocab_size: %d is smaller than the %s tokenizer's vocabulary; "
                        "allowed: at least %d", m->vocab_size, d->tokenizer, known_vocab);
    if (d->source == DATA_SHARDS && m->vocab_size > 65536)
        return nsaErrorf(err, "model.vocab_size: %d does not fit llm.c shards' uint16 tokens; allowed: 2 "
                        "to 65536 with data.source shards", m->vocab_size);
    if (d->source == DATA_SYNTHETIC && d->val_path[0])
        return nsaErrorf(err,
                         "data.val_path: \"%s\" with data.source synthetic; allowed: a "
                         "validation file for data.source text or shards",
                         d->val_path);
    if (d->source != DATA_SYNTHETIC && !d->path[0])
        return nsaErrorf(err, "data.path: (empty) with data.source %s; allowed: %s",
                        enumName(source_names, d->source),
                        d->source == DATA_TEXT ? "a .txt or .jsonl file, or a directory of them"
                                               : "a .bin shard, a directory of them, or a glob");

    /* the engine's own rules last: the keys above already cover them, so
     * this only fires if the engine grows a rule config.c does not know */
    if (validateEngine(m, err) != 0) return -1;

    const FaultConfig *f = &cfg->fault;
    if (f->nan_at_step > 0 && f->nan_kind == FAULT_NONE)
        return nsaErrorf(err, "fault.nan_kind: none while fault.nan_at_step is %lld; allowed: loss, grad",
                        (long long)f->nan_at_step);
    int phase_ok = 0;
    for (int i = 0; stall_phases[i]; i++) phase_ok |= !strcmp(stall_phases[i], f->stall_phase);
    if (!phase_ok)
        return nsaErrorf(err, "fault.stall_phase: \"%s\" is not a phase; allowed: data, forward, backward, "
                        "allreduce, optimizer, checkpoint, eval", f->stall_phase);
    return 0;
}

/* ---- writing YAML -------------------------------------------------------------------- */

/* A double in the fewest digits that read back to the same value; whole
 * numbers without an exponent (120, not 1.2e+02). */
static void formatReal(double v, char *out, size_t cap) {
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, cap, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) return;
    }
}

static void bufQuoted(StrBuf *b, const char *s) {
    strbufPrintf(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            strbufPrintf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            strbufPrintf(b, "\\x%02x", c);
        else
            strbufPrintf(b, "%c", c);
    }
    strbufPrintf(b, "\"");
}

char *configToYaml(const JobConfig *cfg) {
    StrBuf b;
    if (strbufInit(&b, 4096) != 0) return NULL;
    strbufPrintf(&b, "# nsad job config, resolved (every key, defaults filled in)\n");
    const char *section = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &configKeys[i];
        const void *field = (const char *)cfg + k->offset;
        if (strcmp(section, k->section)) {
            section = k->section;
            strbufPrintf(&b, "%s:\n", section);
        }
        strbufPrintf(&b, "  %s: ", k->key);
        char num[40];
        switch (k->type) {
        case KEY_INT: strbufPrintf(&b, "%d", *(const int *)field); break;
        case KEY_INT64: strbufPrintf(&b, "%lld", (long long)*(const int64_t *)field); break;
        case KEY_UINT64: strbufPrintf(&b, "%llu", (unsigned long long)*(const uint64_t *)field); break;
        case KEY_DOUBLE:
            formatReal(*(const double *)field, num, sizeof num);
            strbufPrintf(&b, "%s", num);
            break;
        case KEY_FLOAT:
            /* floats print through double: exact, and read back to the same float */
            if (*(const float *)field == floorf(*(const float *)field) &&
                fabsf(*(const float *)field) < 1e7f) {
                strbufPrintf(&b, "%.0f", (double)*(const float *)field);
                break;
            }
            for (int prec = 1; prec <= 9; prec++) {
                snprintf(num, sizeof num, "%.*g", prec, (double)*(const float *)field);
                if ((float)strtod(num, NULL) == *(const float *)field) break;
            }
            strbufPrintf(&b, "%s", num);
            break;
        case KEY_STRING: bufQuoted(&b, (const char *)field); break;
        case KEY_ENUM: {
            int value = *(const int *)field;
            if (k->names == device_names && cfg->runtime.device_auto)
                strbufPrintf(&b, "auto  # %s on this machine", enumName(k->names, value));
            else if (k->names == precision_names && cfg->runtime.precision_auto)
                strbufPrintf(&b, "auto  # %s on %s", enumName(k->names, value),
                          configDeviceName(cfg->runtime.device));
            else
                strbufPrintf(&b, "%s", enumName(k->names, value));
            break;
        }
        case KEY_GPUS: {
            const RuntimeConfig *r = &cfg->runtime;
            if (r->n_gpu_list > 0) {
                strbufPrintf(&b, "[");
                for (int g = 0; g < r->n_gpu_list; g++)
                    strbufPrintf(&b, "%s%d", g ? ", " : "", r->gpu_list[g]);
                strbufPrintf(&b, "]");
            } else if (r->gpus > 0) {
                strbufPrintf(&b, "%d", r->gpus);
            } else {
                strbufPrintf(&b, "all");
            }
            break;
        }
        case KEY_NODES: {
            const RuntimeConfig *r = &cfg->runtime;
            strbufPrintf(&b, "[");
            for (int n = 0; n < r->n_nodes; n++) {
                if (n) strbufPrintf(&b, ", ");
                bufQuoted(&b, r->nodes[n]);
            }
            strbufPrintf(&b, "]");
            break;
        }
        }
        strbufPrintf(&b, "\n");
    }
    return strbufTake(&b);
}

/* ---- hash ---------------------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

uint64_t configHash(const JobConfig *cfg) {
    uint64_t h = 14695981039346656037ULL;
    /* field by field: struct padding must not reach the hash */
    for (size_t i = 0; i < N_KEYS; i++) {
        const ConfigKey *k = &configKeys[i];
        int relevant = !strcmp(k->section, "model") || !strcmp(k->section, "nsa") ||
                       (!strcmp(k->section, "data") && strcmp(k->key, "prefetch")) ||
                       (!strcmp(k->section, "train") &&
                        (!strcmp(k->key, "seed") || !strcmp(k->key, "seq_len") ||
                         !strcmp(k->key, "batch_size") || !strcmp(k->key, "accumulate_grad_batches")));
        if (!relevant) continue;
        const void *field = (const char *)cfg + k->offset;
        h = fnv(h, k->key, strlen(k->key));
        switch (k->type) {
        case KEY_INT:
        case KEY_ENUM: h = fnv(h, field, sizeof(int)); break;
        case KEY_INT64: h = fnv(h, field, sizeof(int64_t)); break;
        case KEY_UINT64: h = fnv(h, field, sizeof(uint64_t)); break;
        case KEY_DOUBLE: h = fnv(h, field, sizeof(double)); break;
        case KEY_FLOAT: h = fnv(h, field, sizeof(float)); break;
        case KEY_STRING: h = fnv(h, field, strlen((const char *)field)); break;
        case KEY_GPUS: /* never part of the hash: resume on another GPU count */
        case KEY_NODES: break;
        }
    }
    return h;
}
