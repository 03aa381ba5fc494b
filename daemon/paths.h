/* paths.h - where nsad keeps its state and its Unix socket when nobody says,
 * worked out the same way by `nsad serve`, nsactl and `make run`, so that
 * `nsactl list` finds the daemon `make run` started without flags or
 * exports.
 *
 *   state dir  $STATE_DIRECTORY (systemd; the first of a list), else
 *              $XDG_STATE_HOME/nsad, else /var/lib/nsad for root, else
 *              $HOME/.local/state/nsad
 *   socket     $RUNTIME_DIRECTORY/nsad.sock (systemd), else
 *              $XDG_RUNTIME_DIR/nsad/nsad.sock, else /run/nsad/nsad.sock
 *              for root, else <state dir>/nsad.sock
 *
 * Plain functions of the environment and the user id: no globals, no I/O. */
#ifndef NSAD_PATHS_H
#define NSAD_PATHS_H

#include <stddef.h>

/* The system service's places (systemd/nsad.service). */
#define PATHS_SYSTEM_STATE_DIR "/var/lib/nsad"
#define PATHS_SYSTEM_SOCKET "/run/nsad/nsad.sock"

/* Writes the default state dir into out. Returns 0, or -1 when it does not
 * fit in cap bytes (out then holds "", errno ENAMETOOLONG). */
int pathsStateDir(char *out, size_t cap);

/* Writes the default Unix socket path into out. Returns 0, or -1 when it
 * does not fit in cap bytes or in a socket address (108 bytes; errno
 * ENAMETOOLONG). */
int pathsSocket(char *out, size_t cap);

#endif
