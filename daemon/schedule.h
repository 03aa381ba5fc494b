/* schedule.h - a forwarding header: the learning-rate schedule lives in
 * lrschedule.h (lrScheduleRate). Kept only for daemon/trainer.c, which
 * still includes this name and calls scheduleLr; remove it once trainer.c
 * includes lrschedule.h and calls lrScheduleRate. */
#ifndef NSAD_SCHEDULE_H
#define NSAD_SCHEDULE_H

#include "lrschedule.h"

/* lrScheduleRate under its old name. Pure; cannot fail. */
static inline double scheduleLr(const LrSchedule *s, int64_t step) {
    return lrScheduleRate(s, step);
}

#endif
