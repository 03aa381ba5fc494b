/* lrschedule.c - see lrschedule.h. */
#include "lrschedule.h"

#include <math.h>

double lrScheduleRate(const LrSchedule *s, int64_t step) {
    if (step < 1) step = 1;
    if (s->warmup_steps > 0 && step <= s->warmup_steps)
        return s->lr * (double)step / (double)s->warmup_steps;
    if (step >= s->total_steps) return s->min_lr;
    /* warmup >= total leaves no decay span: the branch above already
     * returned for every step up to total */
    double span = (double)(s->total_steps - s->warmup_steps);
    double progress = (double)(step - s->warmup_steps) / span;
    return s->min_lr + (s->lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
}
