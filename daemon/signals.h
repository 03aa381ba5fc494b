/* signals.h - nsad serve's signal handling.
 *
 * The daemon's ordinary signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT) are
 * blocked in every thread and taken synchronously by the main thread with
 * signalsWait, so no work happens inside a handler. Fatal signals (SIGSEGV,
 * SIGBUS, SIGILL, SIGFPE, SIGABRT) get a handler that writes the crashing
 * thread's stack to stderr (async-signal-safe: backtrace_symbols_fd) and then
 * re-raises the signal with its default action, so the core dump still
 * happens. */
#ifndef NSAD_SIGNALS_H
#define NSAD_SIGNALS_H

/* Blocks SIGTERM, SIGINT, SIGHUP and SIGQUIT in the calling thread (and so in
 * every thread it creates afterwards) and ignores SIGPIPE. Call before any
 * thread starts. Returns 0 or -1 (errno set). */
int signalsBlockDaemonSignals(void);

/* Installs the fatal-signal handlers (on an alternate stack for the calling
 * thread, so a stack overflow still reports). Returns 0 or -1 (errno set). */
int signalsInstallFatal(void);

/* Waits up to timeout_ms for one of the blocked daemon signals. Returns the
 * signal number, or 0 on timeout. */
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
