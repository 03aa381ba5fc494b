/* yamlscalar.h - the YAML rules both of nsad's config files keep (the job
 * config, daemon/config.c, and the daemon config, `nsad serve --config`,
 * daemon/cmd_serve.c), so that the two refuse the same text alike:
 *
 * Tags. libyaml's document gives every node a tag, the implicit ones
 * included, so yamlTagsCollect reads the tags the text names with an event
 * pass, and yamlTagOf finds one again by where its node starts. A core-
 * schema tag a key takes is the value's type (yamlTagApply); any other tag,
 * and a tag on a value nothing reads (yamlTagsUnread), is an error.
 *
 * Leading zeros. 010 is octal 8 in YAML 1.1 (PyYAML, the prototype's
 * loader) and decimal 10 in YAML 1.2: yamlLeadingZero spots such a number
 * and yamlLeadingZeroError words the refusal with both readings.
 *
 * Numbers too small to keep. A nonzero number below the smallest normal
 * value of its field (1e-400 reads as 0) is refused (yamlTooSmall,
 * yamlTooSmallError); zero written any way (0e-400) is zero.
 *
 * Every message starts with the caller's "FILE:LINE: " (or "line LINE: ")
 * and the key, and ends with "; allowed: ...". */
#ifndef NSAD_YAMLSCALAR_H
#define NSAD_YAMLSCALAR_H

#include <stddef.h>
#include <yaml.h>

#include "nsa.h"

/* YAML's core-schema tags, as a set: what a key takes. */
enum {
    YTAG_STR = 1,
    YTAG_INT = 2,
    YTAG_FLOAT = 4,
    YTAG_BOOL = 8,
    YTAG_NULL = 16,
    YTAG_MAP = 32,
    YTAG_SEQ = 64
};

/* One tag written in the text. */
typedef struct YamlTagMark {
    size_t index;          /* the node's start_mark.index */
    yaml_node_type_t type; /* a scalar's, a mapping's or a list's */
    size_t line;           /* 1-based */
    int used;              /* a caller has read the node (yamlTagApply) */
    char *tag;             /* as libyaml resolved it: tag:yaml.org,2002:int, !foo */
} YamlTagMark;

typedef struct YamlTagList {
    YamlTagMark *marks; /* in the order of the text */
    size_t len, cap;
} YamlTagList;

/* Collects the tags written in the first document of len bytes of text into
 * tags (zeroed by the caller; free with yamlTagsFree, also after -1).
 * Returns 0, or -1 out of memory. A syntax error ends the pass quietly: the
 * caller's document load reports it with its place. */
int yamlTagsCollect(const char *text, size_t len, YamlTagList *tags);
void yamlTagsFree(YamlTagList *tags);

/* The tag written on node, or NULL (tags or node NULL: NULL). */
YamlTagMark *yamlTagOf(const YamlTagList *tags, const yaml_node_t *node);

/* The core tag a written tag is (YTAG_*), or 0 for any other. The
 * non-specific "!" is the node's own kind: a string for a scalar. */
int yamlTagKind(const YamlTagMark *m);

/* A tag as it is written: !!int for tag:yaml.org,2002:int, else itself. */
void yamlTagShort(const YamlTagMark *m, char *out, size_t cap);

/* "untagged or tagged !!int or !!float" for a set of core tags. */
void yamlTagsAllowed(int kinds, char *out, size_t cap);

/* Honours the tag written on node, if any, for key `name`, which takes the
 * core tags in `kinds` and `what` (for messages); at is "FILE:LINE: " (or
 * "line LINE: ") and value the node as messages show it. A core tag the
 * key takes is the value's type whatever its quoting: !!str reads the
 * value as a quoted string ("5"), !!int, !!float, !!bool and !!null as the
 * plain scalar (!!int "3" is 3), once its text is a value of that type;
 * !!map and !!seq only say what the node is. Any other tag, or a core tag
 * the key does not take, is an error: "AT NAME: !foo 5: the tag !foo is not
 * supported; allowed: WHAT, untagged or tagged !!int". The node's style is
 * rewritten to match and its mark set used. Returns 0 or -1 with err. */
int yamlTagApply(const YamlTagList *tags, yaml_node_t *node, const char *at, const char *name,
                 const char *value, int kinds, const char *what, NsaError *err);

/* The first tag no yamlTagApply read (one on a value nothing reads) as an
 * error: "FILE:LINE: the tag !foo is on a value nsad does not read;
 * allowed: no tag there" (path NULL: "line LINE: "). Returns 0 or -1 with
 * err. */
int yamlTagsUnread(const YamlTagList *tags, const char *path, NsaError *err);

/* in without its '_' (YAML allows 1_000), at most cap - 1 bytes, into out. */
void yamlStripUnderscores(const char *in, char *out, size_t cap);

/* A number written with a leading zero: 010, -007, 0_10, 010e2 (not 0, 0.5
 * or 00.5, which every YAML reads alike). Returns 1 and writes the number
 * without its leading zeros to plain (and, when the digits are octal ones,
 * what YAML 1.1 reads, to octal; else ""), or 0. */
int yamlLeadingZero(const char *text, char *plain, size_t plain_cap, char *octal, size_t octal_cap);

/* "ATNAME: 010 has a leading zero: YAML 1.1 reads it as octal (8), YAML
 * 1.2 as decimal (10); allowed: ALLOWED, written without leading zeros (10,
 * or 8 if octal was meant)", from yamlLeadingZero's plain and octal, into
 * err. Returns -1. */
int yamlLeadingZeroError(NsaError *err, const char *at, const char *name, const char *shown,
                         const char *allowed, const char *plain, const char *octal);

/* Whether a decimal number's digits (those before any exponent) are all
 * zeros: 0, 0.0, -0e5. */
int yamlZeroLiteral(const char *text);

/* Whether the number text, read as v and kept as stored (v itself, or v
 * as a float), is nonzero as written but below smallest (DBL_MIN, FLT_MIN)
 * in magnitude as stored: 1e-400 (read as 0), 1e-50 in a float. */
int yamlTooSmall(const char *text, double stored, double smallest);

/* "ATNAME: 1e-400 is too small: it would be stored as 0; allowed: ALLOWED,
 * and if not 0 at least 2.22507e-308 in magnitude" into err (a subnormal
 * stored value: "as the subnormal S, losing precision"). Returns -1. */
int yamlTooSmallError(NsaError *err, const char *at, const char *name, const char *shown,
                      const char *allowed, double stored, double smallest);

#endif
