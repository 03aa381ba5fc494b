/* runlog.c - see runlog.h. */
#include "runlog.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
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

/* A reader that follows a run's log. While `loading` its reader is writing
 * the stored lines to the stream outside the lock (runlogReadFinish): the
 * lines logged meanwhile wait in `pending`, and only that reader drops it. */
typedef struct Follower {
    char run_id[RUN_ID_MAX];
    Stream *stream; /* the producer's hold */
    int loading;
    int ended;    /* runlogEnd came while loading: the end follows the stored lines */
    int overflow; /* pending outgrew STREAM_MAX_UNREAD or memory: ends once loaded */
    char *pending;
    size_t pending_len, pending_cap;
    struct Follower *next;
} Follower;

struct RunLog {
    pthread_mutex_t lock;
    pthread_cond_t wake;   /* the keep-alive thread waits on it */
    pthread_cond_t loaded; /* runlogClose waits on it for loading readers */
    char runs_dir[RUN_PATH_MAX];
    Follower *followers;
    int n_followers;
    int n_loading; /* followers whose reader is in runlogReadFinish */
    int stop;
    pthread_t thread;
    RunLogReadHook read_hook; /* tests: runlogSetReadHook */
    void *read_hook_ctx;
};

/* One read between runlogReadStart and runlogReadFinish: the stored files
 * as they were under the lock. Appends go past `size`, a rotation renames
 * (the descriptors keep what they opened): reading `size` bytes of each
 * gives the lines stored then, no more. */
struct RunLogRead {
    int fd[2];      /* log.1.jsonl, log.jsonl; -1: none */
    size_t size[2]; /* their sizes then */
    char path[2][RUN_PATH_MAX + 80];
    long tail;
    Stream *stream;     /* the consumer's hold, handed to the caller */
    Follower *follower; /* with follow: in the list, loading */
};

/* Adds data to a loading follower's pending lines; past STREAM_MAX_UNREAD
 * or out of memory it is marked to end instead. Caller holds the lock. */
static void holdForLoader(Follower *f, const char *data, size_t len) {
    if (f->overflow) return;
    if (f->pending_len + len > STREAM_MAX_UNREAD) {
        f->overflow = 1;
        return;
    }
    if (f->pending_len + len > f->pending_cap) {
        size_t cap = f->pending_cap ? f->pending_cap : 4096;
        while (cap < f->pending_len + len)
            cap *= 2;
        char *grown = realloc(f->pending, cap);
        if (!grown) {
            f->overflow = 1;
            return;
        }
        f->pending = grown;
        f->pending_cap = cap;
    }
    memcpy(f->pending + f->pending_len, data, len);
    f->pending_len += len;
}

/* Closes and unlinks *link's follower. Caller holds the lock. */
static void dropFollower(RunLog *rl, Follower **link) {
    Follower *f = *link;
    *link = f->next;
    streamClose(f->stream);
    free(f->pending);
    free(f);
    rl->n_followers--;
}

/* Writes data to the followers of run_id (all of them when NULL: a
 * keep-alive, which loading ones skip), dropping those whose reader is
 * gone; a loading one keeps it for its reader. Caller holds the lock. */
static void writeFollowers(RunLog *rl, const char *run_id, const char *data, size_t len) {
    for (Follower **link = &rl->followers; *link;) {
        if (run_id && strcmp((*link)->run_id, run_id) != 0) {
            link = &(*link)->next;
            continue;
        }
        if ((*link)->loading) {
            if (run_id) holdForLoader(*link, data, len);
            link = &(*link)->next;
        } else if (streamWrite((*link)->stream, data, len) != 0)
            dropFollower(rl, link);
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
    pthread_cond_init(&rl->loaded, NULL);
    int rc = pthread_create(&rl->thread, NULL, keepAliveMain, rl);
    if (rc != 0) {
        nsaErrorf(err, "cannot start the run log thread: %s", strerror(rc));
        pthread_cond_destroy(&rl->loaded);
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
    /* a loading follower is its reader's to drop: it sees stop when done */
    while (rl->n_loading > 0)
        pthread_cond_wait(&rl->loaded, &rl->lock);
    while (rl->followers) dropFollower(rl, &rl->followers);
    pthread_mutex_unlock(&rl->lock);
    pthread_join(rl->thread, NULL);
    pthread_cond_destroy(&rl->loaded);
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

/* Closes rd's descriptors and frees it (not its stream or follower). */
static void freeRead(RunLogRead *rd) {
    for (int i = 0; i < 2; i++)
        if (rd->fd[i] >= 0) close(rd->fd[i]);
    free(rd);
}

RunLogRead *runlogReadStart(RunLog *rl, const char *run_id, long tail, int follow, NsaError *err) {
    RunLogRead *rd = calloc(1, sizeof *rd);
    if (!rd) {
        nsaErrorf(err, "out of memory");
        return NULL;
    }
    rd->fd[0] = rd->fd[1] = -1;
    rd->tail = tail;
    if (!runIdValid(run_id) ||
        logPath(rl, run_id, "log.1.jsonl", rd->path[0], sizeof rd->path[0]) != 0 ||
        logPath(rl, run_id, "log.jsonl", rd->path[1], sizeof rd->path[1]) != 0) {
        nsaErrorf(err, "run id '%.80s': no log path", run_id);
        free(rd);
        return NULL;
    }
    Follower *f = follow ? calloc(1, sizeof *f) : NULL;
    rd->stream = streamCreate();
    if (!rd->stream || (follow && !f)) {
        nsaErrorf(err, "out of memory");
        goto fail;
    }
    pthread_mutex_lock(&rl->lock);
    /* the files' sizes and the follower under one lock: no line is lost or doubled */
    if (follow) { /* readers that left are noticed here too, not only at the next line */
        for (Follower **link = &rl->followers; *link;) {
            if (!(*link)->loading && streamCancelled((*link)->stream))
                dropFollower(rl, link);
            else link = &(*link)->next;
        }
    }
    if (follow && rl->n_followers >= RUNLOG_FOLLOWERS_MAX) {
        pthread_mutex_unlock(&rl->lock);
        nsaErrorf(err, "%d readers follow run logs already; try again later", RUNLOG_FOLLOWERS_MAX);
        goto fail;
    }
    /* opened, not read: only metadata under the lock (a missing file is no lines) */
    for (int i = 0; i < 2; i++) {
        struct stat st;
        rd->fd[i] = fsOpenRegular(rd->path[i], &st, err);
        if (rd->fd[i] < 0 && errno == ENOENT) continue;
        if (rd->fd[i] < 0) {
            pthread_mutex_unlock(&rl->lock);
            goto fail;
        }
        if ((uint64_t)st.st_size > (uint64_t)(RUNLOG_FILE_MAX + 65536)) {
            pthread_mutex_unlock(&rl->lock);
            nsaErrorf(err, "%s: %lld bytes; allowed: at most %zu bytes", rd->path[i],
                      (long long)st.st_size, RUNLOG_FILE_MAX + 65536);
            goto fail;
        }
        rd->size[i] = (size_t)st.st_size;
    }
    if (follow) {
        snprintf(f->run_id, sizeof f->run_id, "%s", run_id);
        f->stream = rd->stream;
        f->loading = 1;
        f->next = rl->followers;
        rl->followers = f;
        rl->n_followers++;
        rl->n_loading++;
        rd->follower = f;
    }
    pthread_mutex_unlock(&rl->lock);
    return rd;
fail:
    free(f);
    if (rd->stream) {
        streamClose(rd->stream);
        streamRelease(rd->stream);
    }
    freeRead(rd);
    return NULL;
}

/* Reads rd's stored lines into a malloc'd buffer: size[i] bytes of each
 * file at most (a file cut shorter since gives what it has). Returns 0, or
 * -1 with err. */
static int readStored(RunLogRead *rd, char **buf_out, size_t *len_out, NsaError *err) {
    char *buf = malloc(rd->size[0] + rd->size[1] + 1);
    if (!buf) return nsaErrorf(err, "out of memory reading %s", rd->path[1]);
    size_t len = 0;
    for (int i = 0; i < 2; i++) {
        for (size_t got = 0; rd->fd[i] >= 0 && got < rd->size[i];) {
            ssize_t n = pread(rd->fd[i], buf + len, rd->size[i] - got, (off_t)got);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                int saved = errno;
                free(buf);
                nsaErrorf(err, "%s: read error: %s", rd->path[i], strerror(saved));
                return -1;
            }
            if (n == 0) break;
            got += (size_t)n;
            len += (size_t)n;
        }
    }
    buf[len] = '\0';
    *buf_out = buf;
    *len_out = len;
    return 0;
}

Stream *runlogReadFinish(RunLog *rl, RunLogRead *rd, NsaError *err) {
    if (rl->read_hook) rl->read_hook(rl->read_hook_ctx);
    Stream *s = rd->stream;
    Follower *f = rd->follower;
    char *buf = NULL;
    size_t len = 0;
    int ok = readStored(rd, &buf, &len, err) == 0;
    if (ok) {
        size_t start = 0;
        if (rd->tail >=
            0) { /* the last `tail` lines: walk back over tail newlines past the final one */
            long seen = 0;
            start = len;
            for (size_t i = len; i > 0; i--) {
                if (buf[i - 1] != '\n' || i == len) continue;
                if (++seen > rd->tail) break;
                start = i;
            }
            if (seen < rd->tail) start = 0; /* fewer lines than that: all */
            if (rd->tail == 0) start = len;
        }
        ok = len - start == 0 || streamWrite(s, buf + start, len - start) == 0;
        if (!ok) nsaErrorf(err, "out of memory");
    }
    free(buf);
    freeRead(rd);
    if (f) { /* the lines logged since the start, then the follower goes live */
        pthread_mutex_lock(&rl->lock);
        int live = ok && !f->overflow &&
                   (f->pending_len == 0 || streamWrite(s, f->pending, f->pending_len) == 0);
        if (f->ended || rl->stop) live = 0; /* its job ended meanwhile: the end comes now */
        free(f->pending);
        f->pending = NULL;
        f->pending_len = f->pending_cap = 0;
        f->loading = 0;
        if (!live) { /* the end after what was written (or, failed, for nobody) */
            for (Follower **link = &rl->followers; *link; link = &(*link)->next) {
                if (*link == f) {
                    dropFollower(rl, link);
                    break;
                }
            }
        }
        rl->n_loading--;
        pthread_cond_broadcast(&rl->loaded);
        pthread_mutex_unlock(&rl->lock);
    } else if (ok) {
        streamClose(s); /* the producer is done: the reader gets the end */
    }
    if (!ok) {
        if (!f) streamClose(s);
        streamRelease(s);
        return NULL;
    }
    return s;
}

void runlogEnd(RunLog *rl, const char *run_id) {
    if (!rl) return;
    pthread_mutex_lock(&rl->lock);
    for (Follower **link = &rl->followers; *link;) {
        if (strcmp((*link)->run_id, run_id) != 0) {
            link = &(*link)->next;
        } else if ((*link)->loading) { /* its reader ends it after the stored lines */
            (*link)->ended = 1;
            link = &(*link)->next;
        } else {
            dropFollower(rl, link);
        }
    }
    pthread_mutex_unlock(&rl->lock);
}

void runlogSetReadHook(RunLog *rl, RunLogReadHook fn, void *ctx) {
    rl->read_hook = fn;
    rl->read_hook_ctx = ctx;
}
