/* test_ranks.c - the rank group's lifetime rules (daemon/ranks.c) with its
 * threads running, on the CPU engine: a dispatch returns what each rank
 * did; a rank that does not return within the grace period after another
 * failed is given up on (the dispatch fails naming it, the group is
 * broken); and rankGroupFreeThen's release waits until that rank has come
 * back and left, so that what it writes on its way out still exists.
 *
 * The given-up rank sleeps past the grace period (the timeout + 5 s) on
 * purpose, ignoring the abort as a rank stuck in a device call would: the
 * test takes about eight seconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../daemon/ranks.h"

static RankGroupConfig groupConfig(int local, double timeout) {
    RankGroupConfig c;
    memset(&c, 0, sizeof c);
    nsaModelConfigDefaults(&c.model);
    c.model.vocab_size = 32;
    c.model.dim = 16;
    c.model.n_layers = 1;
    c.model.n_heads = 2;
    c.model.n_kv_groups = 1;
    c.model.d_k = 8;
    c.model.d_v = 8;
    c.model.cmp_len = 8;
    c.model.cmp_stride = 4;
    c.model.sel_len = 8;
    c.model.n_sel = 2;
    c.model.window = 16;
    c.engine.device = NSA_DEVICE_CPU;
    c.engine.precision = NSA_PREC_F32;
    c.engine.max_batch = 1;
    c.engine.max_seq_len = 16;
    c.engine.threads = 1;
    c.local = local;
    c.world = local;
    c.timeout = timeout;
    return c;
}

/* A started group of local ranks with the given timeout (fails the test
 * when it cannot start). */
static RankGroup *startGroup(int local, double timeout) {
    RankGroupConfig c = groupConfig(local, timeout);
    NsaError err = {{0}};
    RankGroup *g = rankGroupCreate(&c, &err);
    if (!g) fail_msg("%s", err.message);
    return g;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Each rank writes its rank into arg[local]. */
static int writeRank(const RankCtx *rc, void *arg, NsaError *err) {
    (void)err;
    ((int *)arg)[rc->local] = rc->rank + 100;
    return 0;
}

static void test_dispatch_reaches_every_rank(void **state) {
    (void)state;
    RankGroup *g = startGroup(3, 5.0);
    NsaError err = {{0}};
    int got[3] = {0, 0, 0};
    assert_int_equal(rankGroupRun(g, writeRank, got, &err), 0);
    assert_int_equal(got[0], 100);
    assert_int_equal(got[1], 101);
    assert_int_equal(got[2], 102);
    int one[3] = {0, 0, 0};
    assert_int_equal(rankGroupRunOne(g, 1, writeRank, one, &err), 0);
    assert_int_equal(one[0] + one[2], 0);
    assert_int_equal(one[1], 101);
    assert_int_equal(rankGroupBroken(g), 0);
    rankGroupFree(g);
}

/* What a dispatch of the stuck-rank test reaches: the rank that does not
 * come back writes into it after the dispatch has failed. */
typedef struct Stuck {
    double sleep_s;            /* rank 1's sleep, past the grace period */
    _Atomic int late_writes;   /* rank 1 after its sleep */
    _Atomic int released;      /* set by release */
    _Atomic int late_first;    /* release found rank 1's late write done */
    pthread_t release_thread;
    int *after;                /* heap memory rank 1 writes into on its way out */
} Stuck;

static int failOrSleep(const RankCtx *rc, void *arg, NsaError *err) {
    Stuck *s = arg;
    if (rc->local == 0) return nsaErrorf(err, "rank 0 fails at once");
    const double until = now() + s->sleep_s; /* deaf to the abort: stuck in a "device call" */
    while (now() < until) {
        struct timespec slice = {0, 20 * 1000 * 1000};
        nanosleep(&slice, NULL);
    }
    s->after[0] = 42; /* freed memory here would be a use after free (ASan) */
    atomic_fetch_add(&s->late_writes, 1);
    return 0;
}

/* A Stuck whose late-write target holds `written`. */
static Stuck *newStuck(int written) {
    Stuck *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->after = calloc(1, sizeof(int));
    assert_non_null(s->after);
    s->after[0] = written;
    return s;
}

/* Runs on whichever thread lets the group go: no cmocka calls here. */
static void releaseStuck(void *ctx) {
    Stuck *s = ctx;
    s->release_thread = pthread_self();
    atomic_store(&s->late_first, s->after[0] == 42); /* the late write came before */
    free(s->after);
    s->after = NULL;
    atomic_store(&s->released, 1);
}

static void test_release_waits_for_a_rank_given_up_on(void **state) {
    (void)state;
    RankGroup *g = startGroup(2, 0.1); /* grace: 0.1 + 5 s */
    NsaError err = {{0}};
    Stuck *s = newStuck(0);
    s->sleep_s = 8.0;
    const double t0 = now();
    assert_int_equal(rankGroupRun(g, failOrSleep, s, &err), -1);
    print_message("# dispatch: %s (%.1f s)\n", err.message, now() - t0);
    assert_non_null(strstr(err.message, "rank 0 fails at once"));
    assert_non_null(strstr(err.message, "did not return after the abort"));
    assert_int_equal(rankGroupBroken(g), 1);
    assert_int_equal(atomic_load(&s->late_writes), 0);
    /* no more dispatches on a broken group */
    int got[2] = {0, 0};
    assert_int_equal(rankGroupRun(g, writeRank, got, &err), -1);
    assert_int_equal(got[0] + got[1], 0);
    rankGroupFreeThen(g, releaseStuck, s);
    assert_int_equal(atomic_load(&s->released), 0); /* rank 1 is still asleep */
    const double deadline = now() + 30;
    while (!atomic_load(&s->released) && now() < deadline) {
        struct timespec slice = {0, 20 * 1000 * 1000};
        nanosleep(&slice, NULL);
    }
    assert_int_equal(atomic_load(&s->released), 1);
    assert_int_equal(atomic_load(&s->late_writes), 1);
    assert_int_equal(atomic_load(&s->late_first), 1);
    assert_false(pthread_equal(s->release_thread, pthread_self())); /* on rank 1's way out */
    free(s);
}

static void test_release_at_once_when_every_rank_returned(void **state) {
    (void)state;
    RankGroup *g = startGroup(2, 5.0);
    Stuck *s = newStuck(42);
    rankGroupFreeThen(g, releaseStuck, s);
    assert_int_equal(atomic_load(&s->released), 1);
    assert_true(pthread_equal(s->release_thread, pthread_self()));
    free(s);
    /* NULL: release at once */
    s = newStuck(42);
    rankGroupFreeThen(NULL, releaseStuck, s);
    assert_int_equal(atomic_load(&s->released), 1);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch_reaches_every_rank),
        cmocka_unit_test(test_release_at_once_when_every_rank_returned),
        cmocka_unit_test(test_release_waits_for_a_rank_given_up_on),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
