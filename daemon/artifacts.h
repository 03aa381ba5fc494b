/* artifacts.h - the files a training run leaves in its out_dir, named as
 * the PyTorch prototype named them so its users' scripts keep working
 * (proto/files.md has every field):
 *   env.json                versions, device, git commit, the resolved config
 *   heartbeat_rank0.jsonl   one JSON object per logged step and per event
 *   training.csv            step,loss,lr,toks_per_s
 *   val.csv                 step,val_loss,bits_per_byte
 *   metrics.json            the run's summary, rewritten at the end
 *   .anomaly_type           one word: nan_loss, inf_loss, nan_grad, inf_grad
 *   .HALT                   created by a user (or the NaN guard) to stop the run
 * Lines are appended with one write(2) each, so a reader tailing a file never
 * sees half a line. Whole files (env.json, metrics.json) are written to a
 * temporary name and renamed. */
#ifndef NSAD_ARTIFACTS_H
#define NSAD_ARTIFACTS_H

#include <stdint.h>
#include "config.h"
#include "trainstep.h"

#define ARTIFACT_ENV "env.json"
#define ARTIFACT_HEARTBEAT "heartbeat_rank0.jsonl"
#define ARTIFACT_TRAINING_CSV "training.csv"
#define ARTIFACT_VAL_CSV "val.csv"
#define ARTIFACT_METRICS "metrics.json"
#define ARTIFACT_ANOMALY ".anomaly_type"
#define ARTIFACT_HALT ".HALT"

#define TRAINING_CSV_HEADER "step,loss,lr,toks_per_s"
#define VAL_CSV_HEADER "step,val_loss,bits_per_byte"

typedef struct Artifacts Artifacts;

/* Creates out_dir (and parents) if needed and opens the three append-only
 * logs. A fresh run (resume_step < 0) starts training.csv and val.csv anew
 * with their headers; a resumed run keeps the rows up to resume_step and
 * drops later ones (steps the interrupted run logged after its last
 * checkpoint, which the resumed run logs again). The heartbeat is never
 * truncated: it is the run's history. Returns NULL with err on failure;
 * free with artifactsClose. */
Artifacts *artifactsOpen(const char *out_dir, int64_t resume_step, NsaError *err);
void artifactsClose(Artifacts *a);

/* Writes env.json: nsad/libnsa/library versions, git commit, compiler,
 * host, device (kind, precision, threads, memory), the resolved config (as
 * a JSON object and as YAML) and its hash, the resume source (or null).
 * Returns 0 or -1 with err. */
int artifactsWriteEnv(const char *out_dir, const JobConfig *cfg, const NsaMemoryReport *mem,
                      const char *resumed_from, NsaError *err);

/* A logged step: one heartbeat line (ts, step, loss, lr, grad_norm,
 * toks_per_s, phase, memory, ...) and one training.csv row. phase is the
 * schedule's phase, "warmup" or "train". Returns 0 or -1 with err. */
int artifactsLogStep(Artifacts *a, const TrainStepLog *s, const char *phase, NsaError *err);

/* An evaluation: one val.csv row and an "eval" heartbeat event (a NaN
 * figure is "nan" in the row, null in the event). Returns 0, or -1 with err
 * (a failed write names the file; out of memory): the row may be written
 * without its event then. a must not be NULL. */
int artifactsLogEval(Artifacts *a, int64_t step, double val_loss, double bits_per_byte,
                     NsaError *err);

/* An event line in the heartbeat: {"ts", "event": type, "step", "phase",
 * "detail": detail_json}. detail_json must be a JSON object or NULL; an
 * unparsable one is an error. Returns 0 or -1. */
int artifactsLogEvent(Artifacts *a, const char *type, int64_t step, const char *phase,
                      const char *detail_json, NsaError *err);

/* One row of training.csv or val.csv as read back. A column the file does
 * not have is NAN (ts, grad_norm and mem_bytes are in no file nsad writes:
 * they come from the heartbeat; files of the PyTorch prototype may carry
 * them). */
typedef struct ArtifactCsvRow {
    int64_t step;
    double ts, loss, lr, grad_norm, toks_per_s, mem_bytes;  /* training.csv */
    double val_loss, bits_per_byte;                         /* val.csv */
} ArtifactCsvRow;

/* Called for each row in file order; returns 0 to go on, or -1 with err set
 * to stop the read (artifactsReadCsv then returns -1). */
typedef int (*ArtifactCsvRowFn)(void *ctx, const ArtifactCsvRow *row, NsaError *err);

/* Reads out_dir/name (ARTIFACT_TRAINING_CSV or ARTIFACT_VAL_CSV) and calls
 * fn for every row. Columns are found by their header names: those nsad
 * writes and the prototype's alternatives (train_loss, bpb, tokens_per_s,
 * ...); in val.csv a "loss" column stands for val_loss when there is no
 * val_loss. A row whose step is not a number (a torn last line after a
 * kill) is skipped. A file that does not exist has no rows: returns 0.
 * Returns -1 with err when the file cannot be opened or read, when its
 * header has no step column, or when fn stops the read. Cannot allocate
 * beyond one line buffer, freed before it returns. */
int artifactsReadCsv(const char *out_dir, const char *name, ArtifactCsvRowFn fn, void *ctx,
                     NsaError *err);

/* The run's summary for metrics.json. */
typedef struct RunSummary {
    const char *outcome;        /* "completed", "halted", "nan_halted", "failed" */
    int64_t step, total_steps;
    double final_loss;          /* NAN when no step ran */
    double first_val_loss, first_bits_per_byte;
    double final_val_loss, final_bits_per_byte;
    double best_val_loss;
    int64_t tokens_seen;
    double wall_seconds, mean_toks_per_s;
    int anomalies;
    const char *anomaly;        /* last anomaly type or "" */
    const char *last_checkpoint;/* directory or "" */
    const char *error;          /* failure message or "" */
} RunSummary;

/* Writes metrics.json atomically. NaN values are written as null.
 * Returns 0 or -1 with err. */
int artifactsWriteMetrics(const char *out_dir, const RunSummary *s, NsaError *err);

/* Writes .anomaly_type ("nan_loss\n", ...). Returns 0 or -1. */
int artifactsWriteAnomaly(const char *out_dir, const char *type, NsaError *err);

/* Creates .HALT holding reason. Returns 0 or -1. */
int artifactsWriteHalt(const char *out_dir, const char *reason, NsaError *err);

/* 1 when out_dir/.HALT exists, else 0. */
int artifactsHaltRequested(const char *out_dir);

/* Removes a stale .HALT / .anomaly_type left by an earlier run in the same
 * out_dir, so a resumed run does not stop at once. Returns the number of
 * files removed (0..2), or -1 with err when one exists but cannot go. */
int artifactsClearStale(const char *out_dir, NsaError *err);

/* The resolved config as a JSON object (model, nsa, train, runtime, data,
 * nan, fault, watchdog). The caller owns it (cJSON_Delete). NULL on
 * allocation failure. */
struct cJSON *artifactsConfigJson(const JobConfig *cfg);

/* "nan" / "inf" prefix for a non-finite value: writes "nan_<what>" or
 * "inf_<what>" into out. */
void artifactsAnomalyName(double value, const char *what, char *out, size_t cap);

#endif
