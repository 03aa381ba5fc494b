/* sdnotify.h - systemd's notify protocol without libsystemd: one datagram
 * to the socket named by $NOTIFY_SOCKET (sd_notify(3)). Every function is a
 * quiet no-op when nsad does not run under a Type=notify unit. */
#ifndef NSAD_SDNOTIFY_H
#define NSAD_SDNOTIFY_H

#include <stdint.h>

/* Sends state ("READY=1", "STATUS=...", "WATCHDOG=1", "STOPPING=1", several
 * joined by '\n') to $NOTIFY_SOCKET. Returns 1 when sent, 0 when there is no
 * NOTIFY_SOCKET, -1 when sending failed (errno set). Thread-safe. */
int sdNotify(const char *state);

/* The watchdog interval systemd expects pings within, from $WATCHDOG_USEC
 * (honouring $WATCHDOG_PID when it names another process). Returns the
 * interval in microseconds, or 0 when systemd's watchdog is off. */
uint64_t sdWatchdogUsec(void);

#endif
