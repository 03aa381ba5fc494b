/* yamllimit.h - bounds on YAML (and JSON) input before it is parsed.
 *
 * libyaml's scanner keeps one "simple key" slot per open flow collection
 * and walks all of them for every token, so text like a megabyte of '['
 * or of "{a: " costs time quadratic in its length (tens of seconds), and
 * its document loader keeps every node of the input in memory. A config
 * needs a few levels and a few hundred nodes: yamlLimitCheck runs the
 * event parser over the text first and stops at the first limit passed,
 * which bounds the work of both passes to a linear one over at most
 * max_bytes. Directives (%TAG, which libyaml also checks pairwise) are
 * counted before libyaml runs. Callers then load the document as before. */
#ifndef NSAD_YAMLLIMIT_H
#define NSAD_YAMLLIMIT_H

#include <stddef.h>

#include "nsa.h"

typedef struct YamlLimits {
    size_t max_bytes; /* the text itself */
    int max_depth;    /* mappings and lists nested inside each other */
    size_t max_nodes; /* scalars, mappings, lists and aliases, all documents together */
} YamlLimits;

/* The limits of every config nsad reads: job configs (files, stdin, API
 * bodies) and the daemon config. A job config has 2 levels and about 150
 * nodes. docs/CONFIG.md and proto/api.md quote these numbers. */
#define YAML_LIMIT_BYTES ((size_t)1 << 20)
#define YAML_LIMIT_DEPTH 16
#define YAML_LIMIT_NODES 4096
/* %YAML / %TAG lines; a config needs none */
#define YAML_LIMIT_DIRECTIVES 16
extern const YamlLimits yamlConfigLimits;

/* Checks len bytes of text against lim with libyaml's event parser.
 * Returns 0 when the text stays within the limits - also when it has a
 * syntax error before passing one (the caller's own parse reports that,
 * with its position, in bounded time) - or -1 with err naming the limit
 * and where it was passed: "FILE:LINE: " (path given) or "line LINE: ",
 * e.g. "line 1: nesting deeper than 16 levels; allowed: at most 16 nested
 * mappings or lists". Cannot fail otherwise (out of memory is reported as
 * such in err). */
int yamlLimitCheck(const char *text, size_t len, const YamlLimits *lim, const char *path, NsaError *err);

#endif
