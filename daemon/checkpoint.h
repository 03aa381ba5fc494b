/* checkpoint.h - safetensors files and training checkpoints.
 *
 * Two layers:
 *   safetensors*  reads and writes the safetensors format (what Python's
 *                 `safetensors` loads): an 8-byte little-endian header
 *                 length N, N bytes of JSON {name: {"dtype", "shape",
 *                 "data_offsets": [begin, end]}, "__metadata__": {str: str}},
 *                 padded with spaces so 8 + N is a multiple of 8, then the raw
 *                 little-endian tensor bytes, contiguous, in header order.
 *                 nsad writes and reads dtype "F32" only.
 *   checkpoint*   a training checkpoint of an NsaModel: a directory
 *                 OUT/checkpoints/step_00000100/ holding model.safetensors
 *                 (master weights, the engine's tensor names),
 *                 state.safetensors (adam_m.<name>, adam_v.<name>, and the
 *                 resume state in __metadata__) and manifest.json (each
 *                 file's size and CRC-32C, the step, config hash and nsad
 *                 version; written last, so a directory without one is
 *                 incomplete), plus OUT/checkpoints/latest, a one-line text
 *                 file naming the newest complete directory.
 * Every file is written to a temporary name, fsynced and renamed, and the
 * directory is fsynced, so a crash leaves either the old or the new state;
 * `latest` never names a missing directory. Loading verifies the manifest
 * first: a damaged checkpoint is refused, never trained on. Only regular
 * files are opened. proto/files.md documents the names and metadata keys. */
#ifndef NSAD_CHECKPOINT_H
#define NSAD_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "../kernels/nsa.h"

/* ---- safetensors -------------------------------------------------------- */

#define SAFETENSORS_MAX_DIMS 8

typedef struct SafetensorsTensor {
    const char *name;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    size_t numel;
    const float *data;   /* writer: the source; reader: see safetensorsCopy */
} SafetensorsTensor;

/* One __metadata__ entry. Values are strings, as safetensors requires. */
typedef struct SafetensorsMeta {
    const char *key;
    const char *value;
} SafetensorsMeta;

/* Writes n tensors (F32) and n_meta metadata entries to path atomically
 * (path.tmp, fsync, rename, fsync of the directory). Returns 0, or -1 with
 * err naming the file and the failing call; the temporary is removed. */
int safetensorsWrite(const char *path, const SafetensorsTensor *tensors, int n,
                     const SafetensorsMeta *meta, int n_meta, NsaError *err);

typedef struct Safetensors Safetensors;

/* Reads and validates a whole safetensors file: a regular file, header
 * length within the file and at most 16 MiB, a JSON object header (one
 * __metadata__), dtype F32, non-negative shapes whose element count matches
 * data_offsets, offsets contiguous from 0 to the end of the file. Returns
 * NULL with err naming the file and the first problem. The caller frees
 * with safetensorsFree. */
Safetensors *safetensorsRead(const char *path, NsaError *err);
/* Frees st and everything it holds; NULL is a no-op. */
void safetensorsFree(Safetensors *st);

/* The number of tensors in st (st not NULL). Cannot fail. */
int safetensorsCount(const Safetensors *st);
/* Tensor i in file order (by data offset), or NULL when out of range. The
 * pointer lives as long as st; its data field is NULL (use safetensorsCopy). */
const SafetensorsTensor *safetensorsTensor(const Safetensors *st, int i);
/* The named tensor, or NULL. */
const SafetensorsTensor *safetensorsFind(const Safetensors *st, const char *name);
/* Copies a tensor's numel floats into dst (no alignment assumed). */
void safetensorsCopy(const Safetensors *st, const SafetensorsTensor *t, float *dst);
/* The metadata value for key, or NULL when absent. Lives as long as st. */
const char *safetensorsMeta(const Safetensors *st, const char *key);

/* ---- training checkpoints ------------------------------------------------ */

#define CHECKPOINT_FORMAT "nsad-checkpoint-2"
/* Checkpoints written before manifests: the same files and metadata, no
 * manifest.json. They still load, unverified (no sizes or checksums to
 * check them against), and every loader says so in its log. */
#define CHECKPOINT_FORMAT_LEGACY "nsad-checkpoint-1"

/* What a resumed run needs besides weights and moments. The data order is
 * a pure function of (seed, data_position) (daemon/data.h), so those two
 * are the complete state of the data RNG. */
typedef struct ResumeState {
    int64_t step;             /* optimizer steps completed */
    uint64_t data_position;   /* next training batch number */
    uint64_t seed;            /* train.seed: data order and init */
    uint64_t config_hash;     /* configHash() of the run that wrote it */
    int64_t tokens_seen;      /* training tokens consumed so far */
    int anomalies;            /* NaN/Inf anomalies absorbed so far (skip/rollback) */
    int ranks;                /* data-parallel ranks of the job that wrote it (1 for
                                 checkpoints from before data parallelism) */
    int legacy;               /* 1: format CHECKPOINT_FORMAT_LEGACY, loaded unverified */
} ResumeState;

/* Where a checkpoint's tensors come from and go to: a model alone
 * (checkpointSave/Load) or a data-parallel job's ranks (the trainer). get
 * fills dst with the whole tensor i of an arena; set takes the whole
 * tensor. Both are called for the params' tensors, then adam_m's, then
 * adam_v's, each in layout order (a job's ranks rely on that order to run
 * the matching collectives everywhere); save calls get only, load set only.
 * Return 0, or -1 with err. */
typedef struct CheckpointTensors {
    void *ctx;
    int n;                                       /* tensors per arena */
    const NsaTensorInfo *(*info)(void *ctx, int i);
    int (*get)(void *ctx, NsaArena arena, int i, float *dst, NsaError *err);
    int (*set)(void *ctx, NsaArena arena, int i, const float *src, NsaError *err);
} CheckpointTensors;

/* Writes OUT/checkpoints/step_<8 digits>/ for st->step: model weights and
 * optimizer moments of m (read one tensor at a time with nsaModelGetTensor:
 * memory for the largest tensor only; on CUDA this synchronises), their
 * manifest last, then points OUT/checkpoints/latest at it and deletes the
 * oldest step_* directories beyond keep_last (<= 0 keeps all; each is
 * renamed away first, so a kill never leaves one half deleted). An
 * existing directory for the same step is replaced without `latest` ever
 * naming a missing directory (a kill in the middle: checkpointSweep, which
 * each save runs first). model_config_json (may be NULL) goes into
 * model.safetensors' metadata. On success copies the directory path into
 * saved_dir (if not NULL, cap bytes). Returns 0 or -1 with err. */
int checkpointSave(NsaModel *m, const char *out_dir, const ResumeState *st, int keep_last,
                   const char *model_config_json, char *saved_dir, size_t cap, NsaError *err);
/* The same with the tensors read through src. */
int checkpointSaveTensors(const CheckpointTensors *src, const char *out_dir, const ResumeState *st,
                          int keep_last, const char *model_config_json, char *saved_dir,
                          size_t cap, NsaError *err);

/* Finishes what a kill in the middle of a save or prune left in
 * OUT/checkpoints. A replacement of a step's directory where the file
 * system has no RENAME_EXCHANGE (NFS: two renames, with `latest` moved off
 * that step meanwhile) cut at any point ends with exactly one complete,
 * verified copy of the step under its name - the new one once the first
 * rename was done and it verifies, else the old one - and `latest` back on
 * it when the replacement had moved it. Then the leftovers (.step_N.tmp,
 * .old, .del) are removed. Each save runs it first; a resume runs it
 * before it picks a checkpoint. An out_dir without checkpoints is fine.
 * Not while another process saves into out_dir. Returns 0, or -1 with
 * err. */
int checkpointSweep(const char *out_dir, NsaError *err);

/* Resolves what `--resume` names into a checkpoint directory:
 *   "latest" or NULL   the directory OUT/checkpoints/latest points at;
 *   "latest-valid"     checkpointResolveValid's choice;
 *   a checkpoint dir   (holds model.safetensors) itself;
 *   a run's out_dir    (holds checkpoints/latest) its latest.
 * Returns 1 and fills dir when found, 0 when spec is NULL/"latest"/
 * "latest-valid" and out_dir has no checkpoint yet, -1 with err otherwise
 * (a named directory that holds no checkpoint is an error; so is a latest
 * pointer that is not a regular file holding a step_N name, with its bytes
 * shown escaped, and step directories without a latest pointer). Only
 * latest-valid verifies: checkpointLoad does for the others. With out_dir
 * NULL (no run: a path alone), the keywords are an error. */
int checkpointResolve(const char *out_dir, const char *spec, char *dir, size_t cap,
                      NsaError *err);

/* The newest checkpoint of out_dir that verifies (checkpointVerify): the
 * one checkpoints/latest names, else the newest step_* directory older
 * than it (all of them, newest first, when latest is unreadable). Returns
 * 1 and fills dir; 0 when out_dir has no checkpoint at all; -1 with err
 * listing why each one was refused. skipped (may be NULL) gets the reasons
 * for the newer ones refused before the one returned ("" when none), for
 * the caller's log. */
int checkpointResolveValid(const char *out_dir, char *dir, size_t cap, char *skipped, size_t skipped_cap,
                           NsaError *err);

/* Checks a checkpoint directory without loading it: its manifest.json
 * (format, step matching the directory's step_N name, config hash,
 * version) and the size and CRC-32C of every file it lists. Returns 0, or
 * -1 with err naming the file and what does not match. Reads every byte.
 * A checkpoint of format CHECKPOINT_FORMAT_LEGACY (no manifest; its
 * state.safetensors says so) returns 1: complete as far as can be told,
 * but unverified; the caller logs that. */
int checkpointVerify(const char *dir, NsaError *err);

/* Loads weights and moments from a checkpoint directory into m and fills
 * st, after checkpointVerify and with each file's __metadata__ (format,
 * version, step, config hash) checked against the manifest. Every tensor
 * of m must be present with the same shape, and nothing else may be: a
 * mismatch fails naming the tensor. On failure m's contents are
 * unspecified (the caller must not train on them). Returns 0 or -1. */
int checkpointLoad(NsaModel *m, const char *dir, ResumeState *st, NsaError *err);
/* The same with the tensors written through dst. */
int checkpointLoadTensors(const CheckpointTensors *dst, const char *dir, ResumeState *st,
                          NsaError *err);

/* Reads only the resume state of a checkpoint directory (state.safetensors'
 * metadata; no checksum is verified). Returns 0 or -1. */
int checkpointReadState(const char *dir, ResumeState *st, NsaError *err);

#endif
