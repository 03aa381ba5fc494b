/* test_stream.c - the byte pipe from a producer thread to a streamed HTTP
 * response (daemon/stream.c): bytes come out in order whatever the
 * interleaving of writes and reads, a consumer that stops reading makes
 * the producer's writes fail once STREAM_MAX_UNREAD bytes wait (instead of
 * the daemon buffering without end), and a consumer that reads again lets
 * the writes through. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "../../daemon/stream.h"

static void noSuspend(void *ctx) { (void)ctx; }

/* Reads up to max bytes into out; the count read. */
static size_t drain(Stream *s, char *out, size_t max) {
    size_t got = 0;
    while (got < max) {
        ssize_t n = streamRead(s, out + got, max - got, noSuspend, NULL);
        if (n <= 0) break;
        got += (size_t)n;
    }
    return got;
}

static void test_bytes_in_order_through_a_lagging_reader(void **state) {
    (void)state;
    Stream *s = streamCreate();
    assert_non_null(s);
    /* a reader always a little behind: every write, read back less than
     * was written, so the unread part never empties and the buffer must
     * reuse its front */
    unsigned char next_out = 0, next_in = 0;
    char chunk[1000], got[1000];
    for (int round = 0; round < 2000; round++) {
        for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = (char)next_out++;
        assert_int_equal(streamWrite(s, chunk, sizeof chunk), 0);
        size_t n = drain(s, got, 900);
        assert_int_equal(n, 900);
        for (size_t i = 0; i < n; i++) assert_int_equal((unsigned char)got[i], next_in++);
    }
    size_t n;
    while ((n = drain(s, got, sizeof got)) > 0)
        for (size_t i = 0; i < n; i++) assert_int_equal((unsigned char)got[i], next_in++);
    assert_int_equal(next_in, next_out);
    streamRelease(s); /* the consumer lets go */
    streamClose(s);   /* the producer's side: the last holder frees */
}

static void test_a_reader_that_stops_stops_the_writer(void **state) {
    (void)state;
    Stream *s = streamCreate();
    assert_non_null(s);
    const size_t piece = (size_t)1 << 20;
    char *buf = calloc(1, piece);
    assert_non_null(buf);
    size_t written = 0;
    while (streamWrite(s, buf, piece) == 0) {
        written += piece;
        assert_true(written <= STREAM_MAX_UNREAD);
    }
    assert_int_equal(written, STREAM_MAX_UNREAD);
    /* reading makes room again */
    char *out = malloc(piece);
    assert_non_null(out);
    assert_int_equal(drain(s, out, piece), piece);
    assert_int_equal(streamWrite(s, buf, piece), 0);
    assert_int_equal(streamWrite(s, buf, 1), -1);
    free(out);
    free(buf);
    streamRelease(s);
    streamClose(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_in_order_through_a_lagging_reader),
        cmocka_unit_test(test_a_reader_that_stops_stops_the_writer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
