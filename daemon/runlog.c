/* runlog.c - see runlog.h. */
#include "runlog.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"
#include "runs.h"
#include "stackdump.h"

typedef struct Follower {
    char run_id[RUN_ID_MAX];
    Stream *stream; /* the producer's hold */
    struct Follower *next;
} Follower;

struct RunLog {
    pthread_mutex_t lock;
    pthread_cond_t wake; /* the keep-alive thread waits on it */
    char runs_dir[RUN_PATH_MAX];
    Follower *followers;
    int n_followers;
    int stop;
    pthread_t thread;
};

/* Closes and unlinks *link's follower. Caller holds the lock. */
static void dropFollower(RunLog *rl, Follower **link) {
    Follower *f = *link;
    *link = f->next;
    streamClose(f->stream);
    free(f);
    rl->n_followers--;
}

/* Writes data to the followers of run_id (all of them when NULL), dropping
 * those whose reader is gone. Caller holds the lock. */
static void writeFollowers(RunLog *rl, const char *run_id, const char *data, size_t len) {
    for (Follower **link = &rl->followers; *link;) {
        if (run_id && strcmp((*link)->run_id, run_id) != 0) {
            link = &(*link)->next;
            continue;
        }
        if (streamWrite((*link)->stream, data, len) != 0) dropFollower(rl, link);
        else link = &(*link)->next;
    }
}

static void *keepAliveMain(void *arg) {
    RunLog *rl = arg;
    if (stackdumpRegisterThread("runlog") != 0)
        logWarn("the run log thread is not in stack dumps: %s", strerror(errno));
    pthread_mutex_lock(&rl->lock);
    while (!rl->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += RUNLOG_KEEPALIVE_S;
        if (pthread_cond_timedwait(&rl->wake, &rl->lock, &until) == ETIMEDOUT && !rl->stop)
            writeFollowers(rl, NULL, "\n", 1);
    }
    pthread_mutex_unlock(&rl->lock);
    stackdumpUnregisterThread();
    return NULL;
}

RunLog *runlogOpen(const char *runs_dir, NsaError *err) {
    RunLog *rl = calloc(1, sizeof *rl);
    if (!rl) {
        nsaErrorf(err, "out of memory");
        return NULL;
    }
    if (fsPathf(err, rl->runs_dir, sizeof rl->runs_dir, "%s", runs_dir) != 0) {
        free(rl);
        return NULL;
    }
    pthread_mutex_init(&rl->lock, NULL);
    pthread_cond_init(&rl->wake, NULL);
    int rc = pthread_create(&rl->thread, NULL, keepAliveMain, rl);
    if (rc != 0) {
        nsaErrorf(err, "cannot start the run log thread: %s", strerror(rc));
        pthread_cond_destroy(&rl->wake);
        pthread_mutex_destroy(&rl->lock);
        free(rl);
        return NULL;
    }
    return rl;
}

void runlogClose(RunLog *rl) {
    if (!rl) return;
    pthread_mutex_lock(&rl->lock);
    rl->stop = 1;
    pthread_cond_broadcast(&rl->wake);
    while (rl->followers) dropFollower(rl, &rl->followers);
    pthread_mutex_unlock(&rl->lock);
    pthread_join(rl->thread, NULL);
    pthread_cond_destroy(&rl->wake);
    pthread_mutex_destroy(&rl->lock);
    free(rl);
}

/* <runs_dir>/<id>/<name>. Returns 0, or -1 when it does not fit. */
static int logPath(const RunLog *rl, const char *run_id, const char *name, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/%s/%s", rl->runs_dir, run_id, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Appends line to the run's log.jsonl, first moving a full one to
 * log.1.jsonl. Returns 0; -1 with errno when the file cannot be written
 * (ENOENT: the run's directory is gone). Caller holds the lock. */
static int appendToFile(RunLog *rl, const char *run_id, const char *line, size_t len) {
    char path[RUN_PATH_MAX + 80], old[RUN_PATH_MAX + 80];
    if (logPath(rl, run_id, "log.jsonl", path, sizeof path) != 0 ||
        logPath(rl, run_id, "log.1.jsonl", old, sizeof old) != 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    struct stat st;
    if (stat(path, &st) == 0 && (size_t)st.st_size + len > RUNLOG_FILE_MAX && rename(path, old) != 0) return -1;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0) return -1;
    int rc = fsWriteAll(fd, line, len);
    int saved = errno;
    if (close(fd) != 0 && rc == 0) rc = -1, saved = errno;
    errno = saved;
    return rc;
}

void runlogAppend(void *ctx, const char *run_id, int level, double ts, const char *message) {
    RunLog *rl = ctx;
    if (!rl || !runIdValid(run_id)) return;
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddNumberToObject(o, "ts", ts);
        cJSON_AddStringToObject(o, "level", logLevelName(level));
        cJSON_AddStringToObject(o, "message", message);
    }
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) {
        logWarn("run %s: out of memory keeping a log line", run_id);
        return;
    }
    size_t len = strlen(text);
    text[len++] = '\n'; /* over the NUL: written by length */
    pthread_mutex_lock(&rl->lock);
    int rc = appendToFile(rl, run_id, text, len);
    int saved = errno;
    writeFollowers(rl, run_id, text, len);
    pthread_mutex_unlock(&rl->lock);
    free(text);
    if (rc != 0 && saved != ENOENT)
        logWarn("run %s: cannot append to its log.jsonl: %s", run_id, strerror(saved));
}

/* Appends the file at path (a missing one adds nothing) to *buf. Returns 0,
 * or -1 with err. */
static int readInto(const char *path, char **buf, size_t *len, NsaError *err) {
    size_t n = 0;
    char *text = fsReadRegular(path, RUNLOG_FILE_MAX + 65536, &n, err);
    if (!text) return errno == ENOENT ? 0 : -1;
    char *bigger = realloc(*buf, *len + n + 1);
    if (!bigger) {
        free(text);
        return nsaErrorf(err, "out of memory reading %s", path);
    }
    memcpy(bigger + *len, text, n);
    *len += n;
    bigger[*len] = '\0';
    *buf = bigger;
    free(text);
    return 0;
}

Stream *runlogRead(RunLog *rl, const char *run_id, long tail, int follow, NsaError *err) {
    char path[RUN_PATH_MAX + 80], old[RUN_PATH_MAX + 80];
    if (!runIdValid(run_id) || logPath(rl, run_id, "log.jsonl", path, sizeof path) != 0 ||
        logPath(rl, run_id, "log.1.jsonl", old, sizeof old) != 0) {
        nsaErrorf(err, "run id '%.80s': no log path", run_id);
        return NULL;
    }
    Follower *f = follow ? calloc(1, sizeof *f) : NULL;
    Stream *s = streamCreate();
    char *buf = NULL;
    size_t len = 0;
    if (!s || (follow && !f)) {
        nsaErrorf(err, "out of memory");
        goto fail;
    }
    pthread_mutex_lock(&rl->lock);
    /* the files and the follower under one lock: no line is lost or doubled */
    if (follow) { /* readers that left are noticed here too, not only at the next line */
        for (Follower **link = &rl->followers; *link;) {
            if (streamCancelled((*link)->stream)) dropFollower(rl, link);
            else link = &(*link)->next;
        }
    }
    if (follow && rl->n_followers >= RUNLOG_FOLLOWERS_MAX) {
        pthread_mutex_unlock(&rl->lock);
        nsaErrorf(err, "%d readers follow run logs already; try again later", RUNLOG_FOLLOWERS_MAX);
        goto fail;
    }
    if (readInto(old, &buf, &len, err) != 0 || readInto(path, &buf, &len, err) != 0) {
        pthread_mutex_unlock(&rl->lock);
        goto fail;
    }
    size_t start = 0;
    if (tail >= 0) { /* the last `tail` lines: walk back over tail newlines past the final one */
        long seen = 0;
        start = len;
        for (size_t i = len; i > 0; i--) {
            if (buf[i - 1] != '\n' || i == len) continue;
            if (++seen > tail) break;
            start = i;
        }
        if (seen < tail) start = 0; /* fewer lines than that: all */
        if (tail == 0) start = len;
    }
    int ok = len - start == 0 || streamWrite(s, buf + start, len - start) == 0;
    if (ok && follow) {
        snprintf(f->run_id, sizeof f->run_id, "%s", run_id);
        f->stream = s;
        f->next = rl->followers;
        rl->followers = f;
        rl->n_followers++;
        f = NULL;
    }
    pthread_mutex_unlock(&rl->lock);
    free(buf);
    buf = NULL;
    if (!ok) {
        nsaErrorf(err, "out of memory");
        goto fail;
    }
    if (!follow) streamClose(s); /* the producer is done: the reader gets the end */
    free(f);
    return s;
fail:
    free(buf);
    free(f);
    if (s) {
        streamClose(s);
        streamRelease(s);
    }
    return NULL;
}

void runlogEnd(RunLog *rl, const char *run_id) {
    if (!rl) return;
    pthread_mutex_lock(&rl->lock);
    for (Follower **link = &rl->followers; *link;) {
        if (!strcmp((*link)->run_id, run_id)) dropFollower(rl, link);
        else link = &(*link)->next;
    }
    pthread_mutex_unlock(&rl->lock);
}
