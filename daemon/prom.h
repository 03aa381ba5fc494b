/* prom.h - GET /metrics: the daemon's state in the Prometheus text
 * exposition format 0.0.4, every name prefixed nsad_ (proto/api.md lists
 * them). */
#ifndef NSAD_PROM_H
#define NSAD_PROM_H

#include <stddef.h>
#include "service.h"

#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Renders the exposition. Takes svc->lock briefly. Returns a malloc'd
 * NUL-terminated text (length in *len when len is not NULL) the caller
 * frees, or NULL when out of memory. */
char *promRender(Service *svc, size_t *len);

#endif
