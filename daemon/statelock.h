/* statelock.h - one nsad serve per state dir: an flock(2) on
 * <state dir>/nsad.pid, held for the process's life, whose text says who
 * holds it and where it listens, for the message a second nsad prints.
 *
 *   pid=1234
 *   listen=http://127.0.0.1:8470      (empty: no TCP listener)
 *   socket=/run/nsad/nsad.sock        (empty: no Unix socket)
 *
 * The kernel drops the lock when the process ends, however it ends, so a
 * stale file never blocks a new nsad; the file itself stays. */
#ifndef NSAD_STATELOCK_H
#define NSAD_STATELOCK_H

#include <stddef.h>
#include "nsa.h"

#define STATELOCK_FILE "nsad.pid"

/* Takes the lock of state_dir and writes this process's pid into the file.
 * Returns the file's descriptor (close-on-exec; keep it open while nsad
 * runs). Returns -1 with err when another process holds the lock - then
 * *held is 1 and err says who, from its file: "state dir D is in use by
 * nsad pid N (http://..., unix:...)" - or when the file cannot be opened or
 * locked (*held 0, err says why). */
int statelockAcquire(const char *state_dir, int *held, NsaError *err);

/* Adds where this nsad listens to its lock file (listen_url, socket_path:
 * NULL or "" for none). Returns 0 or -1 with err; the lock holds either way. */
int statelockDescribe(int fd, const char *listen_url, const char *socket_path, NsaError *err);

#endif
