/* stream.c - see stream.h. */
#include "stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct Stream {
    pthread_mutex_t lock;
    char *buf;
    size_t len, cap, off;  /* unread bytes are buf[off .. len) */
    int eof;               /* closed or aborted: no more data will come */
    int cancelled;         /* the consumer is gone or aborted */
    int suspended;         /* the consumer waits for a wake */
    int holders;           /* 2 while both sides hold it */
    StreamFn wake;
    void *wake_ctx;
};

Stream *streamCreate(void) {
    Stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->lock, NULL);
    s->holders = 2;
    return s;
}

static void wakeLocked(Stream *s) {
    if (s->suspended && s->wake) {
        s->suspended = 0;
        s->wake(s->wake_ctx);
    }
}

/* Drops one holder; frees on the last. Called with the lock held. */
static void dropLocked(Stream *s) {
    int last = --s->holders == 0;
    pthread_mutex_unlock(&s->lock);
    if (last) {
        pthread_mutex_destroy(&s->lock);
        free(s->buf);
        free(s);
    }
}

int streamWrite(Stream *s, const char *data, size_t len) {
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    if (s->cancelled || s->eof) {
        rc = -1;
    } else {
        if (s->off > 0 && s->off == s->len) s->off = s->len = 0;   /* all read: start over */
        if (s->len - s->off + len > STREAM_MAX_UNREAD) {
            rc = -1;
        } else if (s->len + len > s->cap && s->off > 0) { /* room at the front first */
            memmove(s->buf, s->buf + s->off, s->len - s->off);
            s->len -= s->off;
            s->off = 0;
        }
        if (rc == 0 && s->len + len > s->cap) {
            size_t cap = s->cap ? s->cap : 4096;
            while (cap < s->len + len) cap *= 2;
            char *bigger = realloc(s->buf, cap);
            if (!bigger) rc = -1;
            else s->buf = bigger, s->cap = cap;
        }
        if (rc == 0) {
            memcpy(s->buf + s->len, data, len);
            s->len += len;
            wakeLocked(s);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int streamCancelled(Stream *s) {
    pthread_mutex_lock(&s->lock);
    int c = s->cancelled;
    pthread_mutex_unlock(&s->lock);
    return c;
}

void streamClose(Stream *s) {
    pthread_mutex_lock(&s->lock);
    s->eof = 1;
    wakeLocked(s);
    dropLocked(s);
}

void streamSetWake(Stream *s, StreamFn wake, void *ctx) {
    pthread_mutex_lock(&s->lock);
    s->wake = wake;
    s->wake_ctx = ctx;
    pthread_mutex_unlock(&s->lock);
}

ssize_t streamRead(Stream *s, char *buf, size_t max, StreamFn suspend, void *ctx) {
    pthread_mutex_lock(&s->lock);
    ssize_t n;
    if (s->len > s->off) {
        size_t k = s->len - s->off < max ? s->len - s->off : max;
        memcpy(buf, s->buf + s->off, k);
        s->off += k;
        n = (ssize_t)k;
    } else if (s->eof) {
        n = -1;
    } else {
        suspend(ctx);
        s->suspended = 1;
        n = 0;
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

void streamAbort(Stream *s) {
    pthread_mutex_lock(&s->lock);
    s->eof = 1;
    s->cancelled = 1;
    wakeLocked(s);
    pthread_mutex_unlock(&s->lock);
}

void streamRelease(Stream *s) {
    pthread_mutex_lock(&s->lock);
    s->cancelled = 1;
    s->wake = NULL;
    dropLocked(s);
}
