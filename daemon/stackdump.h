/* stackdump.h - stacks of all of nsad's long-lived threads, on demand.
 *
 * Each long-lived thread (trainer, data prefetch, HTTP, watchdog, signal
 * thread) registers itself with a name. A dump signals every registered
 * thread with a real-time signal (STACKDUMP_SIGNAL); its handler stores the
 * thread's backtrace() into that thread's slot, and the dumper collects the
 * slots, waiting at most STACKDUMP_TIMEOUT_MS for all of them: a thread that
 * does not answer (signal blocked, stuck in the kernel) is reported as such
 * instead of hanging the dump. Threads that never registered are listed by
 * tid and name from /proc/self/task, without a stack.
 *
 * The registry is process-wide state by nature (a signal handler must find
 * its slot): it lives in stackdump.c, guarded by a mutex, and this header is
 * its whole interface. Dumps are serialised; every function is thread-safe
 * and none is async-signal-safe: from a signal, hand the work to a thread
 * (nsad's signal thread does). Symbol names need the binary linked with
 * -rdynamic (the Makefile does). */
#ifndef NSAD_STACKDUMP_H
#define NSAD_STACKDUMP_H

#define STACKDUMP_MAX_THREADS 64
#define STACKDUMP_MAX_FRAMES 64
#define STACKDUMP_TIMEOUT_MS 2000
/* the real-time signal used to interrupt registered threads */
#define STACKDUMP_SIGNAL (SIGRTMIN + 4)

/* Registers the calling thread under name (copied, cut to 31 bytes) and
 * installs the signal handler on first use. Registering again renames.
 * Returns 0, or -1 when all STACKDUMP_MAX_THREADS slots are taken or the
 * handler cannot be installed (errno set). */
int stackdumpRegisterThread(const char *name);

/* Removes the calling thread; call before it exits. No-op when the thread
 * is not registered. Cannot fail. */
void stackdumpUnregisterThread(void);

/* The dump as a malloc'd string (the caller frees): a header with reason,
 * time and pid, then each registered thread's name, tid and symbolised
 * frames (the calling thread's own stack included). NULL only when memory
 * runs out. */
char *stackdumpString(const char *reason);

/* Writes stackdumpString(reason) to fd. Returns 0, or -1 with errno set
 * (allocation or write failure). */
int stackdumpWrite(int fd, const char *reason);

#endif
