/* lrschedule.h - the learning-rate schedule: linear warmup, then cosine decay
 * to min_lr, counted in optimizer steps (not micro-batches).
 *
 *   step s is 1-based (the step about to be taken), W = warmup_steps,
 *   T = total steps:
 *     s <= W:      lr * s / W
 *     W < s <= T:  min_lr + (lr - min_lr) * (1 + cos(pi * (s - W) / (T - W))) / 2
 *     s > T:       min_lr
 * so the first step already trains (lr/W, not 0) and the last step lands
 * exactly on min_lr. */
#ifndef NSAD_LRSCHEDULE_H
#define NSAD_LRSCHEDULE_H

#include <stdint.h>

typedef struct LrSchedule {
    double lr;            /* peak */
    double min_lr;        /* floor reached at total_steps */
    int64_t warmup_steps; /* >= 0 */
    int64_t total_steps;  /* >= 1 */
} LrSchedule;

/* Learning rate for 1-based optimizer step `step`. Pure; cannot fail:
 * steps < 1 are treated as 1, steps past the end get min_lr. */
double lrScheduleRate(const LrSchedule *s, int64_t step);

#endif
