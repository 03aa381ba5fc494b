/* yamllimit.c - see yamllimit.h. */
#include "yamllimit.h"

#include <stdio.h>
#include <yaml.h>

const YamlLimits yamlConfigLimits = {
    .max_bytes = YAML_LIMIT_BYTES, .max_depth = YAML_LIMIT_DEPTH, .max_nodes = YAML_LIMIT_NODES};

/* err = "FILE:LINE: " or "line LINE: ", then the problem. */
static int limitError(NsaError *err, const char *path, size_t line, const char *problem) {
    if (path) return nsaErrorf(err, "%s:%zu: %s", path, line, problem);
    return nsaErrorf(err, "line %zu: %s", line, problem);
}

/* libyaml checks each %TAG directive against all before it (quadratic in
 * their number) before the first event of a document: they are counted
 * here, as lines starting with '%', before libyaml sees any. */
static int countDirectives(const char *text, size_t len, int max, size_t *line_out) {
    int n = 0;
    size_t line = 1;
    for (size_t i = 0; i < len; i++) {
        if ((i == 0 || text[i - 1] == '\n') && text[i] == '%' && ++n > max) {
            *line_out = line;
            return n;
        }
        if (text[i] == '\n') line++;
    }
    return n;
}

int yamlLimitCheck(const char *text, size_t len, const YamlLimits *lim, const char *path, NsaError *err) {
    if (len > lim->max_bytes) {
        if (path)
            return nsaErrorf(err, "%s: %zu bytes; allowed: a config of at most %zu bytes", path, len,
                             lim->max_bytes);
        return nsaErrorf(err, "config: %zu bytes; allowed: a config of at most %zu bytes", len, lim->max_bytes);
    }
    char problem[160];
    size_t line = 0;
    if (countDirectives(text, len, YAML_LIMIT_DIRECTIVES, &line) > YAML_LIMIT_DIRECTIVES) {
        snprintf(problem, sizeof problem, "more than %d directives (lines starting with '%%'); allowed: at most %d",
                 YAML_LIMIT_DIRECTIVES, YAML_LIMIT_DIRECTIVES);
        return limitError(err, path, line, problem);
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return nsaErrorf(err, "config: out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int depth = 0, rc = 0;
    size_t nodes = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) break; /* a syntax error: the loader reports it */
        yaml_event_type_t type = ev.type;
        line = ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        if (type == YAML_STREAM_END_EVENT) break;
        if (type == YAML_MAPPING_START_EVENT || type == YAML_SEQUENCE_START_EVENT) {
            if (++depth > lim->max_depth) {
                snprintf(problem, sizeof problem,
                         "nesting deeper than %d levels; allowed: at most %d mappings or lists inside each other",
                         lim->max_depth, lim->max_depth);
                rc = limitError(err, path, line, problem);
                break;
            }
        } else if (type == YAML_MAPPING_END_EVENT || type == YAML_SEQUENCE_END_EVENT) {
            depth--;
        }
        if ((type == YAML_MAPPING_START_EVENT || type == YAML_SEQUENCE_START_EVENT ||
             type == YAML_SCALAR_EVENT || type == YAML_ALIAS_EVENT) &&
            ++nodes > lim->max_nodes) {
            snprintf(problem, sizeof problem,
                     "more than %zu values; allowed: at most %zu keys, values, mappings and lists in a config",
                     lim->max_nodes, lim->max_nodes);
            rc = limitError(err, path, line, problem);
            break;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}
