/* signals.h - what every signal means to nsad (serve and train alike).
 *
 * Every signal a user may send and a process may catch is blocked in every
 * thread and taken synchronously by one thread (serve's main thread with
 * signalsWait, train's signal thread with sigwait), so no work happens
 * inside a handler and nothing a user sends ends nsad without a
 * checkpoint. signalsAction says what each means:
 *   SIGTERM, SIGINT (and SIGXCPU, SIGPWR)  checkpoint the run and exit 0
 *   SIGUSR1, SIGQUIT                       dump every thread's stack, go on
 *   SIGHUP                                 reload what can be reloaded (or
 *                                          log that nothing can), go on
 *   every other one (SIGUSR2, SIGALRM, real-time signals, ...)
 *                                          logged and ignored
 * SIGPIPE is ignored (a closed peer is an EPIPE). Left alone: job control
 * (SIGTSTP, SIGCONT, ...), SIGKILL and SIGSTOP, the stack dumper's
 * real-time signal, and the crash signals (SIGSEGV, SIGBUS, SIGILL,
 * SIGFPE, SIGABRT, SIGTRAP, SIGSYS), which get a handler that writes the
 * crashing thread's stack to stderr (async-signal-safe:
 * backtrace_symbols_fd) and then re-raises the signal with its default
 * action, so the core dump still happens (systemd's watchdog sends
 * SIGABRT for exactly that). docs/ARCHITECTURE.md, "Signals", is the
 * user's version of this table. */
#ifndef NSAD_SIGNALS_H
#define NSAD_SIGNALS_H

#include <signal.h>
#include <stddef.h>

typedef enum SignalAction {
    SIGNAL_STOP = 0,     /* checkpoint the active run, exit 0 */
    SIGNAL_DUMP_STACKS,  /* all threads' stacks to the log (train: also a file) */
    SIGNAL_RELOAD,       /* SIGHUP */
    SIGNAL_IGNORE        /* logged, nothing else */
} SignalAction;

/* The signals nsad takes (blocks and waits for): see the table above. */
void signalsTakenSet(sigset_t *set);

/* What sig means to nsad. Cannot fail. */
SignalAction signalsAction(int sig);

/* "SIGUSR2", "SIGRTMIN+3", ...: a static string or buf. */
const char *signalsName(int sig, char *buf, size_t cap);

/* Blocks every signal of signalsTakenSet in the calling thread (and so in
 * every thread it creates afterwards) and ignores SIGPIPE. Call before any
 * thread starts. Returns 0 or -1 (errno set). */
int signalsBlockDaemonSignals(void);

/* Installs the fatal-signal handlers (on an alternate stack for the calling
 * thread, so a stack overflow still reports). Returns 0 or -1 (errno set). */
int signalsInstallFatal(void);

/* Waits up to timeout_ms for one of the signals of signalsTakenSet.
 * Returns the signal number, or 0 on timeout. */
int signalsWait(int timeout_ms);

/* Runs fn(arg) so that a SIGBUS it raises - a read of a mapped file that
 * shrank under nsad - returns -1 to the caller instead of killing the
 * daemon; returns 0 when fn returned. fn must not take locks or allocate
 * (it may be abandoned mid-way). A SIGBUS outside a guarded call stays
 * fatal (stack trace, core dump). (Re)installs nsad's SIGBUS handler when
 * another is in place; any thread, nesting not supported. Returns -1
 * without running fn when the handler cannot be installed (errno set). */
int signalsGuardBus(void (*fn)(void *), void *arg);

#endif
