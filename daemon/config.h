/* config.h - a training job's configuration: YAML (libyaml) into a typed,
 * validated struct.
 *
 * The prototype's config files load unchanged. Keys (see configs/ and
 * docs/CONFIG.md):
 *   model:   dim n_layers n_heads n_kv_groups d_k d_v vocab_size mlp_hidden mlp
 *            rope_base norm_eps
 *   nsa:     l d l_sel n_sel w phi
 *   train:   steps seq_len batch_size lr min_lr lr_schedule seed log_every
 *            out_dir accumulate_grad_batches warmup_steps weight_decay
 *            grad_clip (alias max_grad_norm) eval_every eval_batches
 *            save_every keep_last beta1 beta2 eps init_from
 *   runtime: device precision threads gpus cpu_ranks nodes
 *            gradient_checkpointing
 *   data:    source path tokenizer val_fraction val_path prefetch
 *   nan:     policy max_skips
 *   fault:   nan_at_step nan_kind stall_at_step stall_phase stall_seconds rank
 *            exit_at_step
 *   watchdog: data forward backward allreduce optimizer checkpoint eval (seconds)
 *            on_hang
 * Keys the prototype had but nsad cannot honour (flash-attn switches and the
 * like) load with a warning; unknown keys and bad values are errors. */
#ifndef NSAD_CONFIG_H
#define NSAD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "../kernels/nsa.h"

#define CONFIG_PATH_MAX 1024
#define CONFIG_MAX_WARNINGS 16
#define CONFIG_MAX_GPUS 64      /* GPUs one nsad drives (runtime.gpus) */
#define CONFIG_MAX_NODES 32     /* other nodes of a multi-node job (runtime.nodes) */
#define CONFIG_NODE_MAX 128     /* one "HOST:PORT" */

typedef enum DataSource {
    DATA_SYNTHETIC = 0,  /* seeded random tokens */
    DATA_TEXT = 1,       /* a .txt file, a directory of .txt files, or .jsonl ("text") */
    DATA_SHARDS = 2      /* llm.c .bin token shards: a file, directory or glob */
} DataSource;

typedef enum NanPolicy { NAN_HALT = 0, NAN_SKIP = 1, NAN_ROLLBACK = 2 } NanPolicy;

typedef enum HangPolicy { HANG_REPORT = 0, HANG_EXIT = 1 } HangPolicy;

typedef enum FaultKind { FAULT_NONE = 0, FAULT_NAN_LOSS = 1, FAULT_NAN_GRAD = 2 } FaultKind;

/* train.lr_schedule: nsad has one, lrschedule.h's linear warmup then cosine. */
typedef enum LrScheduleKind { LR_SCHEDULE_COSINE = 0 } LrScheduleKind;

typedef struct TrainConfig {
    int64_t steps;           /* optimizer steps */
    int seq_len;
    int batch_size;          /* sequences per micro-batch */
    int accumulate_grad_batches;
    double lr, min_lr;       /* peak and final learning rate */
    LrScheduleKind lr_schedule;
    int64_t warmup_steps;
    double weight_decay, grad_clip;
    double beta1, beta2, eps;
    uint64_t seed;
    int64_t log_every, eval_every, eval_batches, save_every;
    int keep_last;           /* checkpoints kept */
    char out_dir[CONFIG_PATH_MAX];
    /* a checkpoint (or a run's out_dir) whose weights a fresh start takes
     * instead of the seed's (fine-tuning, continued training); "" for none */
    char init_from[CONFIG_PATH_MAX];
} TrainConfig;

typedef struct RuntimeConfig {
    NsaDevice device;        /* "cpu" | "cuda" ("auto" resolves at load: cuda if present) */
    int device_auto;         /* 1 when the file said auto (or nothing) */
    NsaPrecision precision;  /* fp32 | fp64 | bf16 | fp16 */
    int precision_auto;      /* 1 when the file said auto (or nothing): bf16 on
                                cuda, fp32 on cpu; see configAutoPrecision */
    int threads;             /* CPU engine threads (per rank); a file's 0 means
                                one per online core and is resolved at load */
    /* runtime.gpus: "all" (gpus 0, the default), a count (the first `gpus`
     * devices) or a list of ordinals (gpu_list, n_gpu_list > 0). One rank
     * per GPU; train.batch_size is per GPU. */
    int gpus;
    int gpu_list[CONFIG_MAX_GPUS];
    int n_gpu_list;
    int cpu_ranks;           /* CPU engine: data-parallel ranks in this process */
    /* runtime.nodes: the other nodes' nsad APIs ("HOST:PORT") that join a
     * multi-node job this nsad coordinates; none for one node */
    char nodes[CONFIG_MAX_NODES][CONFIG_NODE_MAX];
    int n_nodes;
    int gradient_checkpointing; /* NsaRecompute: what the CUDA engine makes
                                   again in the backward (true = LAYER,
                                   selective = SELECTIVE); no effect on cpu */
} RuntimeConfig;

typedef struct DataConfig {
    DataSource source;
    char path[CONFIG_PATH_MAX];
    char tokenizer[32];      /* "byte"; for shards any name ("gpt2" sets the vocabulary) */
    double val_fraction;     /* held-out share of the data, never trained on */
    /* a validation source of its own (same source kind and tokenizer): the
     * validation split is all of it and training takes all of path; ""
     * for none (val_fraction's split) */
    char val_path[CONFIG_PATH_MAX];
    int prefetch;            /* batches computed ahead by the loader thread; 0 = none */
} DataConfig;

typedef struct NanConfig {
    NanPolicy policy;
    int max_skips;
} NanConfig;

typedef struct FaultConfig {
    int64_t nan_at_step;     /* 0 = never */
    FaultKind nan_kind;
    int64_t stall_at_step;   /* 0 = never */
    char stall_phase[16];    /* phase name the stall happens in */
    double stall_seconds;
    int rank;                /* the data-parallel rank the faults fire on */
    int64_t exit_at_step;    /* that rank's worker stops answering (a dead rank); 0 = never */
} FaultConfig;

typedef struct WatchdogConfig {
    double data, forward, backward, optimizer, checkpoint, eval; /* seconds */
    double allreduce;        /* every collective's deadline (data parallelism) */
    HangPolicy on_hang;
} WatchdogConfig;

typedef struct JobConfig {
    NsaModelConfig model;
    TrainConfig train;
    RuntimeConfig runtime;
    DataConfig data;
    NanConfig nan;
    FaultConfig fault;
    WatchdogConfig watchdog;
    int n_warnings;
    char warnings[CONFIG_MAX_WARNINGS][256];
} JobConfig;

/* Fills cfg with every default (the prototype's production model, a short
 * synthetic run). Cannot fail. */
void configDefaults(JobConfig *cfg);

/* Parses YAML from a file or a string over the defaults and validates.
 * Returns 0, or -1 with err holding one line: the key (dotted path), the
 * value and what is allowed, e.g.
 *   "nsa.d: 5 does not divide nsa.l (32); allowed: a divisor of l and l_sel".
 * Warnings (ignored prototype keys) are appended to cfg->warnings. */
int configLoadFile(JobConfig *cfg, const char *path, NsaError *err);
int configLoadString(JobConfig *cfg, const char *yaml, size_t len, NsaError *err);

/* Parses a model config - a document of the model and nsa sections alone,
 * as a checkpoint's model_config holds - over cfg and validates the model
 * alone: each model and nsa key's range, the rules relating them and the
 * engine's. Not the rules that tie the model to a data section (a
 * tokenizer's vocabulary, shards' uint16 tokens): the document has none,
 * and cfg's data section is not the one the model was trained on. Any
 * other section is an error. Returns 0, or -1 with err as configLoadString
 * (then cfg->model may be partly written). */
int configLoadModelString(JobConfig *cfg, const char *yaml, size_t len, NsaError *err);

/* Validates a filled struct (also used after overrides). Returns 0 or -1. */
int configValidate(const JobConfig *cfg, NsaError *err);

/* Writes the resolved config as YAML (the form `nsad check` prints, and that
 * configLoadString reads back to the same struct). Returns a malloc'd string
 * the caller frees, or NULL on allocation failure. */
char *configToYaml(const JobConfig *cfg);

/* Splits "HOST:PORT" (a runtime.nodes entry) into host (cap bytes) and
 * port. Returns 0, or -1 when text is not of that form. */
int configParseNode(const char *text, char *host, size_t host_cap, int *port);

/* A stable 64-bit hash of the settings that change the math (model, data,
 * seed, batch shape); resume refuses a checkpoint whose hash differs. */
uint64_t configHash(const JobConfig *cfg);

/* The config spelling of p ("fp32", "fp64", "bf16", "fp16"; "unknown" for
 * a value outside the enum): a static string, never NULL. */
const char *configPrecisionName(NsaPrecision p);
/* The precision "auto" means on device d: bf16 on cuda, fp32 on cpu. A
 * caller that overrides runtime.device re-resolves precision with it when
 * runtime.precision_auto is set. */
NsaPrecision configAutoPrecision(NsaDevice d);
const char *configDeviceName(NsaDevice d);

#endif
