/* mfu.h - model FLOPs utilisation (MFU): the model FLOPs a run trains per
 * second over the peak dense matrix rate of the GPUs that do it
 * (proto/model.md, "FLOPs" and "MFU"):
 *
 *     mfu = toks_per_s x flops_per_token / (peak per GPU x GPUs)
 *
 * flops_per_token is nsaModelFlopsPerToken's total at the job's seq_len;
 * the peak comes from a table of GPU models by the name the CUDA driver
 * gives them (mfuPeakOfDevice) or from the daemon's --peak-tflops. Runs on
 * the CPU engine, and CUDA runs in fp32, have no MFU (null): nsad knows no
 * honest peak for them and makes none up. Pure functions, no state. */
#ifndef NSAD_MFU_H
#define NSAD_MFU_H

#include "config.h"

/* The dense bf16/fp16 tensor-core rate of one GPU of that driver name, in
 * FLOP/s, from the table in proto/model.md ("NVIDIA H100 80GB HBM3":
 * 989e12); 0 when the table does not know the model. Names are matched by
 * whole words (space or dash separated), case-insensitively. */
double mfuPeakOfDevice(const char *name);

/* Model FLOPs of one training step per token of the job: the total of
 * nsaModelFlopsPerToken at train.seq_len. Returns 0 with *out, or -1 with
 * err when the model config does not validate. */
int mfuFlopsPerToken(const JobConfig *cfg, double *out, NsaError *err);

/* This node's part of the job's MFU denominator: the sum of
 * peaks[ordinal] (FLOP/s; 0: not known) over the n_local GPU ordinals the
 * job trains on here (trainerLocalRanks), or NAN when MFU is not reported
 * for it: the CPU engine, precision fp32 or fp64, no GPU, a GPU beyond the
 * n_gpus known or one of unknown peak. */
double mfuJobPeak(const JobConfig *cfg, const int *ordinals, int n_local, const double *peaks,
                  int n_gpus);

/* The whole job's peak from this node's (local_peak over its n_local
 * ranks): toks_per_s counts every rank of a multi-node job, so the
 * denominator counts every rank too, each at this node's mean GPU peak
 * (the nodes of a job are taken to be alike). world or n_local 0 (not
 * known yet): local_peak. */
double mfuWorldPeak(double local_peak, int world, int n_local);

/* toks_per_s x flops_per_token / peak_flops, or NAN when any is unknown
 * (not finite) or not positive. */
double mfuOf(double toks_per_s, double flops_per_token, double peak_flops);

#endif
