/* stackdump.c - see stackdump.h. */
#include "stackdump.h"
#include "clockutil.h"
#include "strbuf.h"

#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A slot's capture state; the handler and the dumper hand it over with
 * compare-and-swap so a late answer never writes into a slot being read. */
enum { SLOT_IDLE = 0, SLOT_REQUESTED, SLOT_WRITING, SLOT_DONE };

typedef struct Slot {
    int used;                 /* guarded by registry_lock */
    pthread_t thread;
    pid_t tid;
    char name[32];
    _Atomic int state;
    int n_frames;
    void *frames[STACKDUMP_MAX_FRAMES];
} Slot;

static Slot slots[STACKDUMP_MAX_THREADS];
/* Held for registration and for a whole dump, so a thread cannot
 * unregister (and exit) between being chosen and being signalled. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local Slot *my_slot;
static pthread_once_t handler_once = PTHREAD_ONCE_INIT;
static int handler_error;  /* errno of a failed sigaction, under handler_once */

static void onDumpSignal(int sig) {
    (void)sig;
    int saved_errno = errno;
    Slot *s = my_slot;
    int expected = SLOT_REQUESTED;
    if (s && atomic_compare_exchange_strong(&s->state, &expected, SLOT_WRITING)) {
        s->n_frames = backtrace(s->frames, STACKDUMP_MAX_FRAMES);
        atomic_store(&s->state, SLOT_DONE);
    }
    errno = saved_errno;
}

static void installHandler(void) {
    /* backtrace() loads libgcc on its first call, which is not safe inside
     * a signal handler: make that first call here */
    void *warm[2];
    backtrace(warm, 2);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = onDumpSignal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(STACKDUMP_SIGNAL, &sa, NULL) != 0) handler_error = errno;
}

int stackdumpRegisterThread(const char *name) {
    pthread_once(&handler_once, installHandler);
    if (handler_error) {
        errno = handler_error;
        return -1;
    }
    /* a thread that blocked signals wholesale still answers dumps */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, STACKDUMP_SIGNAL);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);

    pthread_mutex_lock(&registry_lock);
    Slot *slot = my_slot;
    for (int i = 0; !slot && i < STACKDUMP_MAX_THREADS; i++)
        if (!slots[i].used) slot = &slots[i];
    if (!slot) {
        pthread_mutex_unlock(&registry_lock);
        errno = ENOSPC;
        return -1;
    }
    slot->used = 1;
    slot->thread = pthread_self();
    slot->tid = (pid_t)syscall(SYS_gettid);
    snprintf(slot->name, sizeof slot->name, "%s", name ? name : "?");
    atomic_store(&slot->state, SLOT_IDLE);
    my_slot = slot;
    pthread_mutex_unlock(&registry_lock);
    return 0;
}

void stackdumpUnregisterThread(void) {
    pthread_mutex_lock(&registry_lock);
    if (my_slot) {
        my_slot->used = 0;
        my_slot = NULL;
    }
    pthread_mutex_unlock(&registry_lock);
}

/* ---- output buffer ------------------------------------------------------- */

static void printFrames(StrBuf *b, void *const *frames, int n) {
    char **symbols = backtrace_symbols(frames, n);
    for (int i = 0; i < n; i++) {
        if (symbols) strbufPrintf(b, "  #%-2d %s\n", i, symbols[i]);
        else strbufPrintf(b, "  #%-2d %p\n", i, frames[i]);
    }
    free(symbols);
}

/* Lists threads of this process that are not registered (tid and comm). */
static void listUnregistered(StrBuf *b, const pid_t *known, int n_known) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *e;
    int header = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        int seen = 0;
        for (int i = 0; i < n_known && !seen; i++) seen = known[i] == tid;
        if (seen) continue;
        char path[64], comm[64] = "?";
        snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
            fclose(f);
        }
        if (!header) {
            strbufPrintf(b, "threads not registered (no stack available):\n");
            header = 1;
        }
        strbufPrintf(b, "  tid %d (%s)\n", (int)tid, comm);
    }
    closedir(d);
}

char *stackdumpString(const char *reason) {
    StrBuf b;
    if (strbufInit(&b, 4096) != 0) return NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    pid_t self_tid = (pid_t)syscall(SYS_gettid);

    pthread_mutex_lock(&registry_lock);
    Slot *self = my_slot;
    int n_registered = 0;
    for (int i = 0; i < STACKDUMP_MAX_THREADS; i++) {
        Slot *s = &slots[i];
        if (!s->used) continue;
        n_registered++;
        if (s == self) continue;
        atomic_store(&s->state, SLOT_REQUESTED);
        if (pthread_kill(s->thread, STACKDUMP_SIGNAL) != 0) atomic_store(&s->state, SLOT_IDLE);
    }
    strbufPrintf(&b, "nsad stack dump\nreason: %s\ntime: %s\npid: %d\nregistered threads: %d\n\n",
              reason ? reason : "", when, (int)getpid(), n_registered);

    /* the calling thread answers directly */
    void *frames[STACKDUMP_MAX_FRAMES];
    int n = backtrace(frames, STACKDUMP_MAX_FRAMES);
    strbufPrintf(&b, "thread \"%s\" (tid %d, the dumping thread):\n", self ? self->name : "(unregistered)",
              (int)self_tid);
    printFrames(&b, frames, n);

    int64_t deadline = clockMonotonicNs() / 1000000 + STACKDUMP_TIMEOUT_MS;
    pid_t known[STACKDUMP_MAX_THREADS + 1];
    int n_known = 0;
    known[n_known++] = self_tid;
    for (int i = 0; i < STACKDUMP_MAX_THREADS; i++) {
        Slot *s = &slots[i];
        if (!s->used || s == self) continue;
        known[n_known++] = s->tid;
        while (atomic_load(&s->state) != SLOT_DONE && atomic_load(&s->state) != SLOT_IDLE &&
               clockMonotonicNs() / 1000000 < deadline) {
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
        }
        strbufPrintf(&b, "\nthread \"%s\" (tid %d):\n", s->name, (int)s->tid);
        int expected = SLOT_REQUESTED;
        if (atomic_compare_exchange_strong(&s->state, &expected, SLOT_IDLE)) {
            strbufPrintf(&b, "  (no answer within %d ms: signal blocked or stuck in the kernel)\n",
                      STACKDUMP_TIMEOUT_MS);
            continue;
        }
        /* a handler that started writing finishes in microseconds */
        while (atomic_load(&s->state) == SLOT_WRITING) sched_yield();
        if (atomic_load(&s->state) == SLOT_DONE) printFrames(&b, s->frames, s->n_frames);
        else strbufPrintf(&b, "  (could not be signalled)\n");
        atomic_store(&s->state, SLOT_IDLE);
    }
    pthread_mutex_unlock(&registry_lock);
    strbufPrintf(&b, "\n");
    listUnregistered(&b, known, n_known);
    return strbufTake(&b);
}

int stackdumpWrite(int fd, const char *reason) {
    char *text = stackdumpString(reason);
    if (!text) {
        errno = ENOMEM;
        return -1;
    }
    const char *p = text;
    size_t len = strlen(text);
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            int saved = errno;
            free(text);
            errno = saved;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    free(text);
    return 0;
}
