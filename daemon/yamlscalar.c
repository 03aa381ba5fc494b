/* yamlscalar.c - the tag, leading-zero and too-small rules both config
 * files keep (yamlscalar.h). */
#include "yamlscalar.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void yamlStripUnderscores(const char *in, char *out, size_t cap) {
    size_t n = 0;
    for (; *in && n + 1 < cap; in++)
        if (*in != '_') out[n++] = *in;
    out[n] = '\0';
}

/* ---- numbers ------------------------------------------------------------------- */

/* A number written with a leading zero: 010, -007, 0_10, 010e2 (not 0, 0.5
 * or 00.5, which every YAML reads alike). YAML 1.1 - PyYAML, the
 * prototype's loader - reads 010 as octal 8, YAML 1.2 as decimal 10, so
 * nsad takes neither. Returns 1 and writes the number without its leading
 * zeros to plain (and, when the digits are octal ones, what YAML 1.1 reads,
 * to octal; else ""), or 0. */
int yamlLeadingZero(const char *text, char *plain, size_t plain_cap, char *octal,
                    size_t octal_cap) {
    char buf[128];
    if (strlen(text) >= sizeof buf) return 0;
    yamlStripUnderscores(text, buf, sizeof buf);
    const char *p = buf + (buf[0] == '+' || buf[0] == '-');
    if (p[0] != '0' || !isdigit((unsigned char)p[1]) || strspn(p, "0123456789eE+-") != strlen(p))
        return 0; /* not a number, or one with a fraction */
    const char *digits = p;
    while (digits[0] == '0' && isdigit((unsigned char)digits[1]))
        digits++;
    snprintf(plain, plain_cap, "%s%.100s", buf[0] == '-' ? "-" : "", digits);
    octal[0] = '\0';
    errno = 0;
    long long v = strspn(p, "01234567") == strlen(p) ? strtoll(p, NULL, 8) : -1;
    if (v >= 0 && errno != ERANGE)
        snprintf(octal, octal_cap, "%s%lld", buf[0] == '-' ? "-" : "", v);
    return 1;
}

/* Whether a decimal number's digits (those before any exponent) are all
 * zeros: 0, 0.0, -0e5. */
int yamlZeroLiteral(const char *text) {
    for (; *text && *text != 'e' && *text != 'E'; text++)
        if (*text >= '1' && *text <= '9') return 0;
    return 1;
}

/* "FILE:LINE: section.key: 010 has a leading zero ...", with what each
 * YAML makes of it where they differ (leadingZero's plain and octal). */
int yamlLeadingZeroError(NsaError *err, const char *at, const char *name, const char *shown,
                         const char *allowed, const char *plain, const char *octal) {
    if (octal[0] && strcmp(octal, plain))
        return nsaErrorf(
            err,
            "%s%s: %s has a leading zero: YAML 1.1 reads it as octal (%s), YAML 1.2 as "
            "decimal (%s); allowed: %s, written without leading zeros (%s, or %s if octal "
            "was meant)",
            at, name, shown, octal, plain, allowed, plain, octal);
    return nsaErrorf(
        err,
        "%s%s: %s has a leading zero, which YAML 1.1 reads as octal or as a string and "
        "YAML 1.2 as decimal; allowed: %s, written without leading zeros (%s)",
        at, name, shown, allowed, plain);
}

int yamlTooSmall(const char *text, double stored, double smallest) {
    return fabs(stored) < smallest && !yamlZeroLiteral(text);
}

int yamlTooSmallError(NsaError *err, const char *at, const char *name, const char *shown,
                      const char *allowed, double stored, double smallest) {
    char as[64] = "0";
    if (stored != 0) snprintf(as, sizeof as, "the subnormal %g, losing precision", stored);
    return nsaErrorf(err,
                     "%s%s: %s is too small: it would be stored as %s; allowed: %s, and if not 0 "
                     "at least %g in magnitude",
                     at, name, shown, as, allowed, smallest);
}

/* ---- tags ---------------------------------------------------------------------- */

static const struct CoreTag {
    const char *name; /* after tag:yaml.org,2002: (written !!name) */
    int kind;
    const char *noun; /* what the tag makes the value */
} coreTags[] = {{"str", YTAG_STR, "a string"},    {"int", YTAG_INT, "an integer"},
                {"float", YTAG_FLOAT, "a float"}, {"bool", YTAG_BOOL, "a boolean"},
                {"null", YTAG_NULL, "null"},      {"map", YTAG_MAP, "a mapping"},
                {"seq", YTAG_SEQ, "a list"}};
#define N_CORE_TAGS (sizeof coreTags / sizeof coreTags[0])
#define CORE_TAG_PREFIX "tag:yaml.org,2002:"

void yamlTagsFree(YamlTagList *tags) {
    for (size_t i = 0; i < tags->len; i++)
        free(tags->marks[i].tag);
    free(tags->marks);
}

int yamlTagsCollect(const char *text, size_t len, YamlTagList *tags) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return -1;
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = 0;
    for (int done = 0; !done && rc == 0;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) break;
        const yaml_char_t *tag = NULL;
        yaml_node_type_t type = YAML_NO_NODE;
        if (ev.type == YAML_SCALAR_EVENT) {
            tag = ev.data.scalar.tag;
            type = YAML_SCALAR_NODE;
        } else if (ev.type == YAML_MAPPING_START_EVENT) {
            tag = ev.data.mapping_start.tag;
            type = YAML_MAPPING_NODE;
        } else if (ev.type == YAML_SEQUENCE_START_EVENT) {
            tag = ev.data.sequence_start.tag;
            type = YAML_SEQUENCE_NODE;
        }
        done = ev.type == YAML_DOCUMENT_END_EVENT || ev.type == YAML_STREAM_END_EVENT;
        if (tag) {
            if (tags->len == tags->cap) {
                size_t cap = tags->cap ? tags->cap * 2 : 16;
                YamlTagMark *m = realloc(tags->marks, cap * sizeof *m);
                if (m) {
                    tags->marks = m;
                    tags->cap = cap;
                }
            }
            char *copy = tags->len < tags->cap ? strdup((const char *)tag) : NULL;
            if (copy)
                tags->marks[tags->len++] =
                    (YamlTagMark){ev.start_mark.index, type, ev.start_mark.line + 1, 0, copy};
            else
                rc = -1;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    return rc;
}

YamlTagMark *yamlTagOf(const YamlTagList *tags, const yaml_node_t *node) {
    if (!tags || !node) return NULL;
    const YamlTagList *t = tags;
    size_t lo = 0, hi = t->len; /* the first mark at or after the node's start */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->marks[mid].index < node->start_mark.index)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* a block mapping starts where its first key does */
    for (; lo < t->len && t->marks[lo].index == node->start_mark.index; lo++)
        if (t->marks[lo].type == node->type) return &t->marks[lo];
    return NULL;
}

int yamlTagKind(const YamlTagMark *m) {
    if (!strcmp(m->tag, "!"))
        return m->type == YAML_MAPPING_NODE    ? YTAG_MAP
               : m->type == YAML_SEQUENCE_NODE ? YTAG_SEQ
                                               : YTAG_STR;
    if (strncmp(m->tag, CORE_TAG_PREFIX, strlen(CORE_TAG_PREFIX))) return 0;
    for (size_t i = 0; i < N_CORE_TAGS; i++)
        if (!strcmp(m->tag + strlen(CORE_TAG_PREFIX), coreTags[i].name)) return coreTags[i].kind;
    return 0;
}

/* A tag as it is written: !!int for tag:yaml.org,2002:int, else itself. */
void yamlTagShort(const YamlTagMark *m, char *out, size_t cap) {
    if (!strncmp(m->tag, CORE_TAG_PREFIX, strlen(CORE_TAG_PREFIX)))
        snprintf(out, cap, "!!%.40s", m->tag + strlen(CORE_TAG_PREFIX));
    else
        snprintf(out, cap, "%.60s", m->tag);
}

/* "untagged or tagged !!int or !!float" for a set of core tags. */
void yamlTagsAllowed(int kinds, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "untagged");
    int first = 1;
    for (size_t i = 0; i < N_CORE_TAGS && n < cap; i++) {
        if (!(kinds & coreTags[i].kind)) continue;
        n += (size_t)snprintf(out + n, cap - n, "%s!!%s", first ? " or tagged " : " or ",
                              coreTags[i].name);
        first = 0;
    }
}

int yamlTagApply(const YamlTagList *tags, yaml_node_t *node, const char *at, const char *name,
                 const char *value, int kinds, const char *what, NsaError *err) {
    YamlTagMark *m = yamlTagOf(tags, node);
    if (!m) return 0;
    m->used = 1;
    char tag[80], shown[220], allowed[200];
    yamlTagShort(m, tag, sizeof tag);
    snprintf(shown, sizeof shown, "%s %s", tag, value);
    yamlTagsAllowed(kinds, allowed, sizeof allowed);
    int kind = yamlTagKind(m);
    int scalar = node->type == YAML_SCALAR_NODE;
    if (!kind)
        return nsaErrorf(err, "%s%s: %s: the tag %s is not supported; allowed: %s, %s", at, name,
                         shown, tag, what, allowed);
    if (scalar == ((kind & (YTAG_MAP | YTAG_SEQ)) != 0) ||
        (kind == YTAG_MAP && node->type != YAML_MAPPING_NODE) ||
        (kind == YTAG_SEQ && node->type != YAML_SEQUENCE_NODE))
        return nsaErrorf(err, "%s%s: %s: the tag %s does not fit %s; allowed: %s, %s", at, name,
                         shown, tag,
                         scalar                            ? "a scalar"
                         : node->type == YAML_MAPPING_NODE ? "a mapping"
                                                           : "a list",
                         what, allowed);
    const char *noun = "";
    for (size_t i = 0; i < N_CORE_TAGS; i++)
        if (coreTags[i].kind == kind) noun = coreTags[i].noun;
    if (!(kinds & kind))
        return nsaErrorf(err, "%s%s: %s is tagged %s; allowed: %s, %s", at, name, shown, noun, what,
                         allowed);
    if (!scalar) return 0;
    const char *text = (const char *)node->data.scalar.value;
    int fits = 1;
    if (kind == YTAG_INT) {
        const char *p = text + (text[0] == '+' || text[0] == '-');
        fits = strspn(p, "0123456789_") == strlen(p) && strpbrk(p, "0123456789");
    } else if (kind == YTAG_BOOL) {
        static const char *const bools[] = {"true", "false", "yes", "no", "on", "off", NULL};
        fits = 0;
        for (int i = 0; bools[i]; i++)
            fits |= !strcasecmp(text, bools[i]);
    } else if (kind == YTAG_NULL) {
        fits = !*text || !strcmp(text, "~") || !strcmp(text, "null") || !strcmp(text, "Null") ||
               !strcmp(text, "NULL");
    }
    if (!fits)
        return nsaErrorf(err, "%s%s: %s is not %s, as its tag says; allowed: %s, %s", at, name,
                         shown, noun, what, allowed);
    node->data.scalar.style =
        kind == YTAG_STR ? YAML_SINGLE_QUOTED_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE;
    return 0;
}

int yamlTagsUnread(const YamlTagList *tags, const char *path, NsaError *err) {
    for (size_t i = 0; tags && i < tags->len; i++) {
        const YamlTagMark *m = &tags->marks[i];
        if (m->used) continue;
        char tag[80];
        yamlTagShort(m, tag, sizeof tag);
        if (path)
            return nsaErrorf(err,
                             "%s:%zu: the tag %s is on a value nsad does not read; allowed: no "
                             "tag there",
                             path, m->line, tag);
        return nsaErrorf(
            err, "line %zu: the tag %s is on a value nsad does not read; allowed: no tag there",
            m->line, tag);
    }
    return 0;
}
