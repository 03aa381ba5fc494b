/* clockutil.h - the daemon's clocks, in one place: monotonic time for
 * durations and deadlines between threads, wall-clock (unix) time for what
 * is written down (heartbeats, run records), and the absolute CLOCK_REALTIME
 * deadline that pthread_cond_timedwait and pthread_timedjoin_np take. */
#ifndef NSAD_CLOCKUTIL_H
#define NSAD_CLOCKUTIL_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. Cannot fail; async-signal-safe (a
 * clock_gettime call and arithmetic only), so signal paths may use it. */
int64_t clockMonotonicNs(void);

/* CLOCK_MONOTONIC in seconds, for durations. Cannot fail. */
double clockMonotonicSeconds(void);

/* CLOCK_REALTIME in unix seconds (with fractions), for what is recorded.
 * Cannot fail. */
double clockUnixSeconds(void);

/* CLOCK_REALTIME now plus ms milliseconds, normalised: the absolute deadline
 * of a timed wait on a condition variable or a thread. Cannot fail. */
struct timespec clockRealtimeAfterMs(int64_t ms);

#endif
