/* signals.c - see signals.h. */
#include "signals.h"
#include "stackdump.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* SIGBUS has its own handler (onBus), which guarded reads return through. */
static const int fatal_signals[] = {SIGSEGV, SIGILL, SIGFPE, SIGABRT};

/* Signals nsad leaves alone: the crash signals (their handlers below, or
 * the kernel's action: a core dump), the two no process can catch, job
 * control and the ones whose default is to be ignored, and the stack
 * dumper's own real-time signal. Every other signal is taken. */
static int leftAlone(int sig) {
    switch (sig) {
    case SIGSEGV: case SIGBUS: case SIGILL: case SIGFPE: case SIGABRT: case SIGTRAP: case SIGSYS:
    case SIGKILL: case SIGSTOP:
    case SIGTSTP: case SIGTTIN: case SIGTTOU: case SIGCONT:
    case SIGCHLD: case SIGURG: case SIGWINCH:
    case SIGPIPE: /* ignored: a closed peer is an EPIPE, never a death */
        return 1;
    default:
        return sig == STACKDUMP_SIGNAL;
    }
}

void signalsTakenSet(sigset_t *set) {
    sigemptyset(set);
    for (int sig = 1; sig < NSIG; sig++)
        if (!leftAlone(sig)) sigaddset(set, sig); /* glibc keeps its internal ones out itself */
}

SignalAction signalsAction(int sig) {
    switch (sig) {
    case SIGTERM: case SIGINT:
    case SIGXCPU: /* the CPU time limit: the kernel kills at the hard one */
    case SIGPWR:  /* the power is failing */
        return SIGNAL_STOP;
    case SIGUSR1: case SIGQUIT: return SIGNAL_DUMP_STACKS;
    case SIGHUP: return SIGNAL_RELOAD;
    default: return SIGNAL_IGNORE;
    }
}

const char *signalsName(int sig, char *buf, size_t cap) {
    static const struct {
        int sig;
        const char *name;
    } names[] = {{SIGHUP, "SIGHUP"},     {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"}, {SIGUSR1, "SIGUSR1"},
                 {SIGUSR2, "SIGUSR2"},   {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"}, {SIGSTKFLT, "SIGSTKFLT"},
                 {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"},     {SIGVTALRM, "SIGVTALRM"},
                 {SIGPROF, "SIGPROF"},   {SIGIO, "SIGIO"},         {SIGPWR, "SIGPWR"},   {SIGPIPE, "SIGPIPE"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) return names[i].name;
    if (sig >= SIGRTMIN && sig <= SIGRTMAX)
        snprintf(buf, cap, "SIGRTMIN+%d", sig - SIGRTMIN);
    else
        snprintf(buf, cap, "signal %d", sig);
    return buf;
}

int signalsBlockDaemonSignals(void) {
    sigset_t set;
    signalsTakenSet(&set);
    int rc = pthread_sigmask(SIG_BLOCK, &set, NULL);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    struct sigaction ign = {.sa_handler = SIG_IGN};
    return sigaction(SIGPIPE, &ign, NULL);
}

/* write(2) of a NUL-terminated string: async-signal-safe. */
static void say(const char *s) {
    ssize_t w = write(STDERR_FILENO, s, strlen(s));
    (void)w;
}

/* The fatal handler's state: a signal handler can reach nothing else, so
 * it is file-wide. Set up once by signalsInstallFatal before the handler can
 * run. The pipe is what the trace is formatted through. */
static int trace_pipe[2] = {-1, -1};
/* The stack the handler runs on, so that a stack overflow still reports. */
static char alt_stack[64 * 1024];

/* Copies what backtrace_symbols_fd wrote into the pipe to stderr, one
 * "<2>  " prefixed line at a time, so journald files every frame as
 * critical. Only read(2) and write(2): async-signal-safe. */
static void relayTrace(void) {
    char buf[4096], line[600];
    size_t len = 0;
    ssize_t n;
    while ((n = read(trace_pipe[0], buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (len < sizeof line - 1) line[len++] = buf[i];
            if (buf[i] != '\n') continue;
            say("<2>  ");
            ssize_t w = write(STDERR_FILENO, line, len);
            (void)w;
            len = 0;
        }
    }
}

static void onFatal(int sig) {
    /* <2> is LOG_CRIT: journald files the trace as critical */
    say("<2>nsad: fatal signal ");
    say(sig == SIGSEGV  ? "SIGSEGV"
        : sig == SIGBUS ? "SIGBUS"
        : sig == SIGILL ? "SIGILL"
        : sig == SIGFPE ? "SIGFPE"
                        : "SIGABRT");
    say("; the crashing thread's stack:\n");
    void *frames[64];
    int n = backtrace(frames, 64);
    if (trace_pipe[1] >= 0) {
        backtrace_symbols_fd(frames, n, trace_pipe[1]);
        relayTrace();
    } else {
        backtrace_symbols_fd(frames, n, STDERR_FILENO);
    }
    /* SA_RESETHAND restored the default action: this makes the core dump */
    raise(sig);
}

/* Where a SIGBUS in a guarded call (signalsGuardBus) on this thread lands;
 * NULL outside one. Thread-local and file-wide because a signal handler can
 * reach nothing else. */
static _Thread_local sigjmp_buf *bus_landing;

static void onBus(int sig) {
    if (bus_landing) siglongjmp(*bus_landing, 1);
    /* not a guarded read: fatal, with the default action back for the core */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    onFatal(sig);
}

static int installBus(void) {
    struct sigaction sa = {.sa_handler = onBus, .sa_flags = SA_ONSTACK | SA_NODEFER};
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, NULL);
}

int signalsInstallFatal(void) {
    /* backtrace() loads libgcc on first use, which is not signal-safe: do it now */
    void *warm[1];
    backtrace(warm, 1);
    /* 64 frames of symbols fit in a pipe's buffer many times over */
    if (trace_pipe[0] < 0 && pipe2(trace_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack};
    if (sigaltstack(&ss, NULL) != 0) return -1;
    struct sigaction sa = {.sa_handler = onFatal, .sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER};
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
        if (sigaction(fatal_signals[i], &sa, NULL) != 0) return -1;
    return installBus();
}

int signalsGuardBus(void (*fn)(void *), void *arg) {
    /* checked per call (one query): a library or a test harness may have
     * put its own SIGBUS handler in since */
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) != 0) return -1;
    if (cur.sa_handler != onBus && installBus() != 0) return -1;
    sigjmp_buf landing;
    if (sigsetjmp(landing, 1)) {
        bus_landing = NULL;
        return -1;
    }
    bus_landing = &landing;
    fn(arg);
    bus_landing = NULL;
    return 0;
}

int signalsWait(int timeout_ms) {
    sigset_t set;
    signalsTakenSet(&set);
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    for (;;) {
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig > 0) return sig;
        if (errno == EAGAIN) return 0;
        if (errno != EINTR) return 0;
    }
}
