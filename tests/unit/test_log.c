/* test_log.c - where nsad's log lines go decides their prefix: the syslog
 * priority "<N>" only for the journal (JOURNAL_STREAM names stderr's
 * device and inode), a timestamp and a level word for a person anywhere
 * else (a terminal, a pipe into `tee`, a file). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/* Logs one line at `level` with stderr sent to a fresh file; journal:
 * JOURNAL_STREAM names that file (else it names another one). Returns the
 * line written, in out. */
static void logged(int level, int journal, char *out, size_t cap) {
    char path[] = "/tmp/nsad-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    char stream[64];
    snprintf(stream, sizeof stream, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + (journal ? 0 : 1));
    setenv("JOURNAL_STREAM", stream, 1);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    logMsg(level, "run %s: step %d", "r-1", 7);
    dup2(saved, STDERR_FILENO);
    close(saved);
    unsetenv("JOURNAL_STREAM");
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
}

static void test_journal_gets_priority_prefixes(void **state) {
    (void)state;
    char line[256];
    logged(LOG_LVL_INFO, 1, line, sizeof line);
    assert_string_equal(line, "<6>run r-1: step 7\n");
    logged(LOG_LVL_ERR, 1, line, sizeof line);
    assert_string_equal(line, "<3>run r-1: step 7\n");
}

static void test_elsewhere_a_person_reads_it(void **state) {
    (void)state;
    char line[256];
    logged(LOG_LVL_INFO, 0, line, sizeof line);  /* a file that is not the journal's */
    assert_null(strchr(line, '<'));
    /* "HH:MM:SS info  run r-1: step 7" */
    assert_int_equal(strlen(line), strlen("12:34:56 info  run r-1: step 7\n"));
    assert_true(line[2] == ':' && line[5] == ':');
    assert_non_null(strstr(line, " info  run r-1: step 7\n"));
    logged(LOG_LVL_WARNING, 0, line, sizeof line);
    assert_non_null(strstr(line, " warn  run r-1: step 7\n"));
    unsetenv("JOURNAL_STREAM");  /* no variable at all: not the journal either */
    fflush(stderr);
    char path[] = "/tmp/nsad-test-log-XXXXXX";
    int fd = mkstemp(path);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    logError("disk full");
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, line, sizeof line - 1, 0);
    line[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    assert_non_null(strstr(line, " error disk full\n"));
    assert_null(strstr(line, "<3>"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_journal_gets_priority_prefixes),
        cmocka_unit_test(test_elsewhere_a_person_reads_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
