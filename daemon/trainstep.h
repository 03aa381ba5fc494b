/* trainstep.h - what one logged training step reports: the trainer fills a
 * TrainStepLog, the artifacts write it (heartbeat_rank0.jsonl, training.csv)
 * and the run registry keeps it (runs.c). Its own header so that those two
 * need not know the trainer. */
#ifndef NSAD_TRAINSTEP_H
#define NSAD_TRAINSTEP_H

#include <stddef.h>
#include <stdint.h>

/* Local data-parallel ranks a monitor follows (GPUs one nsad drives). */
#define TRAIN_MAX_RANKS 64

/* One data-parallel rank's last step (nsaModelCommStats for the figures). */
typedef struct TrainRankStatus {
    int rank;                 /* job-wide rank */
    int device;               /* CUDA device ordinal; -1 on the CPU engine */
    double step_seconds;      /* its step's wall time, from dispatch to its figures */
    double comm_seconds;      /* its gradient reduce-scatters */
    double exposed_seconds;   /* the part of them the backward did not hide */
    double overlap;           /* 1 - exposed / comm */
    double gather_seconds;    /* the weights' all-gather */
} TrainRankStatus;

/* One logged step, as written to heartbeat_rank0.jsonl and training.csv. */
typedef struct TrainStepLog {
    int64_t step, total_steps;
    double ts;            /* unix seconds */
    double loss, lr, grad_norm, toks_per_s, step_seconds;  /* toks_per_s: the whole job's */
    int64_t tokens_seen;
    size_t mem_bytes;     /* device (or host RSS) memory in use */
    int world;            /* data-parallel ranks of the job */
    int n_ranks;          /* this node's ranks, described in ranks[] */
    TrainRankStatus ranks[TRAIN_MAX_RANKS];
} TrainStepLog;

#endif
