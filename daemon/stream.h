/* stream.h - a byte pipe from a worker thread to one streamed HTTP response
 * (the JSON lines of POST /api/v1/sample and /api/v1/eval).
 *
 * The producer (daemon/infer.c's worker) writes and finally closes; the
 * consumer (daemon/server.c's content reader on the HTTP thread) reads.
 * The HTTP thread never blocks: when nothing is buffered, streamRead calls
 * the consumer's `suspend` under the stream's lock and returns 0, and the
 * next write or close calls the consumer's `wake` (under the same lock), so
 * a wake can never come before its suspend. The stream is freed when both
 * sides have let go (streamClose + streamRelease); the consumer's release
 * before the end cancels: streamCancelled turns true and later writes are
 * dropped. Thread-safe. */
#ifndef NSAD_STREAM_H
#define NSAD_STREAM_H

#include <stddef.h>
#include <sys/types.h>

typedef struct Stream Stream;

/* A new open stream held by both sides. NULL when out of memory. */
Stream *streamCreate(void);

/* ---- producer ---- */
/* Appends len bytes. Returns 0, or -1 when the consumer is gone (cancel),
 * memory ran out, or the consumer has fallen STREAM_MAX_UNREAD bytes
 * behind (a client that stopped reading: the producer stops as for one
 * that left); nothing is written then. */
int streamWrite(Stream *s, const char *data, size_t len);

/* The most bytes a stream holds for its consumer. */
#define STREAM_MAX_UNREAD ((size_t)16 << 20)
/* 1 once the consumer is gone: the producer should stop. */
int streamCancelled(Stream *s);
/* The end: what is buffered is still read, then EOF. Drops the producer's
 * hold (s may be freed; do not use it afterwards). */
void streamClose(Stream *s);

/* ---- consumer ---- */
typedef void (*StreamFn)(void *ctx);
/* Sets how the consumer is woken after a suspend (called under the lock,
 * from the producer's thread or streamAbort's). */
void streamSetWake(Stream *s, StreamFn wake, void *ctx);
/* Copies up to max buffered bytes into buf and returns their number; with
 * nothing buffered returns -1 at EOF, else calls suspend(ctx) and returns 0
 * (a wake follows the next write, close or abort). */
ssize_t streamRead(Stream *s, char *buf, size_t max, StreamFn suspend, void *ctx);
/* Ends the stream for its reader now (the daemon stops): EOF after what is
 * buffered, and a suspended reader is woken. The producer sees a cancel. */
void streamAbort(Stream *s);
/* The consumer is gone (response freed). Drops its hold. */
void streamRelease(Stream *s);

#endif
