/* data.c - see data.h.
 *
 * A loader holds one split of the corpus as a token stream: a list of
 * segments of uint16 tokens (text encoded into a buffer it owns, or the
 * token area of memory-mapped llm.c shards), addressed by one global offset.
 * Every batch is a pure function of its position:
 *   train: row r starts at hash(seed, position, r) mod (tokens - seq_len);
 *   val:   rows walk the split in consecutive seq_len strides, wrapping;
 *   synthetic: every token is hash(seed, split, position, row, i) mod V.
 * so a batch computed by the prefetch thread is bit-identical to one
 * computed on demand, and a resumed run that restores the position sees
 * exactly the batches the uninterrupted run would have seen.
 *
 * Splits: text is cut at the document boundary nearest to the last
 * val_fraction of its bytes (documents: the files of a directory, the
 * records of a .jsonl file, the blank-line separated paragraphs of a .txt
 * file); shards are cut by token count, unless their names say "val"
 * (llm.c's fineweb_val_*.bin), in which case those shards are the
 * validation split and the others the training split. Train windows never
 * leave the train range and val windows never leave the val range, so the
 * two never share a token. */
#include "data.h"
#include "fsutil.h"
#include "signals.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * sizeof(int32_t))
/* Between documents of the text stream: a blank line, which reads as a
 * paragraph break to the model and needs no special token. */
#define DOC_SEPARATOR "\n\n"

typedef struct Segment {
    const uint16_t *tokens;
    uint64_t start;  /* offset of tokens[0] in the split's stream */
    uint64_t len;
    int map;         /* shards: index into DataLoader.maps; -1 for text */
} Segment;

typedef struct Mapping {
    void *addr;
    size_t size;
    char *path; /* owned */
} Mapping;

typedef enum SlotState { SLOT_EMPTY = 0, SLOT_FILLING = 1, SLOT_READY = 2 } SlotState;

typedef struct Slot {
    SlotState state;
    uint64_t position;
    int32_t *tokens, *targets;
} Slot;

struct DataLoader {
    DataSource source;
    DataSplit split;
    int whole_path;      /* data.val_path holds the validation: no shard is held out by name */
    int batch, seq_len, vocab;
    uint64_t seed;
    double bytes_per_token;

    Segment *segments;
    int n_segments;
    uint64_t n_tokens;   /* in this split; UINT64_MAX for synthetic */
    uint16_t *owned;     /* text: the encoded split */
    int32_t *window;     /* dataBatch's scratch: seq_len + 1 tokens */
    Mapping *maps;       /* shards: every mapped file */
    int n_maps;

    /* prefetch ring: the thread computes positions [want, want + depth) */
    int depth;
    Slot *slots;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t want;
    int stop;
    int failed;        /* the prefetch thread could not read a batch: fail is why */
    NsaError fail;
    _Atomic uint64_t hits, misses;
};

/* ---- hashing: counter-based, so any batch is O(1) to reach ---------------- */

static uint64_t mix64(uint64_t x) {
    /* splitmix64's finaliser: every input bit reaches every output bit */
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    return mix64(a ^ mix64(b ^ mix64(c ^ mix64(d))));
}

/* ---- growing arrays ---------------------------------------------------------- */

typedef struct Bytes {
    uint8_t *data;
    size_t len, cap;
} Bytes;

/* Makes room for n more bytes after b->len. Returns 0, or -1 out of memory. */
static int bytesReserve(Bytes *b, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->data, cap);
        if (!p) return -1;
        b->data = p;
        b->cap = cap;
    }
    return 0;
}

static int bytesAppend(Bytes *b, const void *src, size_t n) {
    if (bytesReserve(b, n) != 0) return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

typedef struct Offsets {
    uint64_t *data;
    size_t len, cap;
} Offsets;

static int offsetsPush(Offsets *o, uint64_t v) {
    if (o->len == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 1024;
        uint64_t *p = realloc(o->data, cap * sizeof *p);
        if (!p) return -1;
        o->data = p;
        o->cap = cap;
    }
    o->data[o->len++] = v;
    return 0;
}

typedef struct Names {
    char **data;
    size_t len, cap;
} Names;

static int namesPush(Names *n, const char *s) {
    if (n->len == n->cap) {
        size_t cap = n->cap ? n->cap * 2 : 16;
        char **p = realloc(n->data, cap * sizeof *p);
        if (!p) return -1;
        n->data = p;
        n->cap = cap;
    }
    if (!(n->data[n->len] = strdup(s))) return -1;
    n->len++;
    return 0;
}

static void namesFree(Names *n) {
    for (size_t i = 0; i < n->len; i++) free(n->data[i]);
    free(n->data);
}

static int compareNames(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int hasSuffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Lists dir/NAME for the names ending in one of the suffixes, sorted, into
 * out. Returns 0, or -1 with err naming dir (unreadable, out of memory, or
 * an entry whose path does not fit 4095 bytes); out keeps what was listed
 * and the caller frees it (namesFree) either way. */
static int listDir(const char *dir, const char *const *suffixes, Names *out, NsaError *err) {
    DIR *d = opendir(dir);
    if (!d) return nsaErrorf(err, "data.path: %s: cannot open directory: %s", dir, strerror(errno));
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int match = 0;
        for (int i = 0; suffixes[i]; i++) match |= hasSuffix(e->d_name, suffixes[i]);
        if (!match) continue;
        const int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path) {
            /* never a truncated name: it would read another file, or none */
            closedir(d);
            return nsaErrorf(err, "data.path: %s: entry %s: the path is longer than %zu bytes", dir,
                             e->d_name, sizeof path - 1);
        }
        if (namesPush(out, path) != 0) {
            closedir(d);
            return nsaErrorf(err, "data.path: %s: out of memory", dir);
        }
    }
    closedir(d);
    if (out->len > 1) qsort(out->data, out->len, sizeof *out->data, compareNames);
    return 0;
}

/* The most text nsad loads: text is read whole and encoded into 2-byte
 * tokens (3 bytes of memory per byte of text), so it is also held to an
 * eighth of the machine's memory. Larger corpora belong in llm.c shards,
 * which are mapped, not loaded. */
#define DATA_TEXT_MAX_BYTES ((uint64_t)4 << 30)

static uint64_t textLimit(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t eighth = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 8 : DATA_TEXT_MAX_BYTES;
    return eighth < DATA_TEXT_MAX_BYTES ? eighth : DATA_TEXT_MAX_BYTES;
}

/* Appends a whole regular file to out: exactly the size it has when
 * opened, which must fit in *budget (reduced by it). */
static int readWhole(const char *path, Bytes *out, uint64_t *budget, NsaError *err) {
    struct stat st;
    NsaError oerr;
    int fd = fsOpenRegular(path, &st, &oerr);
    if (fd < 0) return nsaErrorf(err, "data.path: %s", oerr.message);
    uint64_t size = (uint64_t)st.st_size;
    if (size > *budget) {
        close(fd);
        return nsaErrorf(err, "data.path: %s: %llu bytes is over what is left of the %llu-byte limit on text; "
                        "allowed: text that fits (pre-tokenize larger corpora into shards)", path,
                        (unsigned long long)size, (unsigned long long)textLimit());
    }
    if (out->len + size > out->cap) {
        uint8_t *p = realloc(out->data, out->len + size + 1);
        if (!p) {
            close(fd);
            return nsaErrorf(err, "data.path: %s: out of memory for %llu bytes", path, (unsigned long long)size);
        }
        out->data = p;
        out->cap = out->len + size + 1;
    }
    uint64_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, out->data + out->len + got, (size_t)(size - got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int saved = errno;
            close(fd);
            return nsaErrorf(err, "data.path: %s: read error: %s", path, strerror(saved));
        }
        if (n == 0) break; /* shrank while read: what is there is what is read */
        got += (uint64_t)n;
    }
    close(fd);
    out->len += (size_t)got;
    *budget -= got;
    return 0;
}

/* ---- text: files, directories, jsonl ------------------------------------------ */

/* The text stream being built: bytes, document starts, and how many of
 * the bytes are separators nsad put between documents (messages count the
 * data's own bytes only). */
typedef struct TextStream {
    Bytes text;
    Offsets docs;
    size_t separator_bytes;
    uint64_t budget; /* bytes of files still allowed (textLimit) */
} TextStream;

static int appendSeparator(TextStream *ts) {
    if (bytesAppend(&ts->text, DOC_SEPARATOR, strlen(DOC_SEPARATOR)) != 0) return -1;
    ts->separator_bytes += strlen(DOC_SEPARATOR);
    return 0;
}

/* Appends a .txt file; each paragraph (after a blank line) starts a document. */
static int appendTxt(const char *path, TextStream *ts, NsaError *err) {
    Bytes *text = &ts->text;
    Offsets *docs = &ts->docs;
    size_t base = text->len;
    if (readWhole(path, text, &ts->budget, err) != 0) return -1;
    if (text->len == base) return 0;  /* empty file: no document */
    if (offsetsPush(docs, base) != 0) return nsaErrorf(err, "data.path: %s: out of memory", path);
    const uint8_t *t = text->data;
    for (size_t i = base + 2; i < text->len; i++) {
        if (t[i - 1] != '\n' || t[i] == '\n' || t[i] == '\r') continue;
        /* a blank line ends the paragraph: "\n\n", or "\n\r\n" from Windows */
        int blank = t[i - 2] == '\n' || (i >= base + 3 && t[i - 2] == '\r' && t[i - 3] == '\n');
        if (blank && offsetsPush(docs, i) != 0) return nsaErrorf(err, "data.path: %s: out of memory", path);
    }
    return appendSeparator(ts) == 0 ? 0 : nsaErrorf(err, "data.path: %s: out of memory", path);
}

/* ---- jsonl: the "text" field, every byte of it --------------------------------- */

/* cJSON validates a record, but its strings are C strings: a "\u0000" in
 * the text would end it there. These read the record's raw bytes again
 * (after cJSON accepted them, so only its grammar needs handling) and
 * decode the "text" string with its length, NUL bytes included. */

/* Whitespace as cJSON skips it: every byte up to and including space. */
static size_t jsonSkipSpace(const char *s, size_t n, size_t i) {
    while (i < n && (unsigned char)s[i] <= ' ')
        i++;
    return i;
}

/* s[i] is a string's opening quote: returns the index just past its
 * closing quote, or n when there is none. */
static size_t jsonStringEnd(const char *s, size_t n, size_t i) {
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

/* Returns the index just past the value starting at s[i] (a string, an
 * object or array with everything in it, or a number or literal). */
static size_t jsonValueEnd(const char *s, size_t n, size_t i) {
    if (i < n && s[i] == '"') return jsonStringEnd(s, n, i);
    if (i < n && (s[i] == '{' || s[i] == '[')) {
        size_t depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                i = jsonStringEnd(s, n, i);
                continue;
            }
            if (s[i] == '{' || s[i] == '[')
                depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && (unsigned char)s[i] > ' ' && s[i] != ',' && s[i] != '}' && s[i] != ']')
        i++;
    return i;
}

static int jsonHex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16) return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

/* Decodes the JSON string s[begin..end) (both quotes included) into out,
 * which has room for end - begin bytes: escapes are never longer decoded
 * than written, and \u0000 is a 0 byte like any other. Returns the decoded
 * length, or SIZE_MAX for an escape that is not JSON: a lone UTF-16
 * surrogate (cJSON refuses it too) or a \u without four hex digits (cJSON
 * reads that as a NUL, which would hide a corrupt record). */
static size_t jsonDecodeString(const char *s, size_t begin, size_t end, uint8_t *out) {
    size_t o = 0;
    for (size_t i = begin + 1; i + 1 < end; i++) {
        if (s[i] != '\\') {
            out[o++] = (uint8_t)s[i];
            continue;
        }
        if (i + 2 >= end) return SIZE_MAX;
        char c = s[++i];
        if (c != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *k = strchr(from, c);
            if (!k || !c) return SIZE_MAX;
            out[o++] = (uint8_t)to[k - from];
            continue;
        }
        unsigned cp, lo;
        if (i + 5 > end - 1 || jsonHex4(s + i + 1, &cp) != 0) return SIZE_MAX;
        i += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return SIZE_MAX;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair: \uD8xx\uDCxx */
            if (i + 7 > end - 1 || s[i + 1] != '\\' || s[i + 2] != 'u' ||
                jsonHex4(s + i + 3, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
                return SIZE_MAX;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
        }
        if (cp < 0x80) {
            out[o++] = (uint8_t)cp;
        } else if (cp < 0x800) {
            out[o++] = (uint8_t)(0xC0 | cp >> 6);
            out[o++] = (uint8_t)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out[o++] = (uint8_t)(0xE0 | cp >> 12);
            out[o++] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
            out[o++] = (uint8_t)(0x80 | (cp & 0x3F));
        } else {
            out[o++] = (uint8_t)(0xF0 | cp >> 18);
            out[o++] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
            out[o++] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
            out[o++] = (uint8_t)(0x80 | (cp & 0x3F));
        }
    }
    return o;
}

typedef enum JsonlText {
    JSONL_NO_TEXT,
    JSONL_TEXT_NOT_STRING,
    JSONL_TEXT,
    JSONL_UNREADABLE
} JsonlText;

/* Finds the first member of the JSON object line[0..len) (one cJSON
 * accepted) whose key is exactly the four bytes "text". JSONL_TEXT: its
 * value is a string, [*begin, *end) its raw bytes, quotes included. */
static JsonlText jsonlFindText(const char *line, size_t len, size_t *begin, size_t *end) {
    size_t i = len >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a BOM, as cJSON skips it */
    i = jsonSkipSpace(line, len, i);
    if (i >= len || line[i] != '{') return JSONL_UNREADABLE;
    i = jsonSkipSpace(line, len, i + 1);
    while (i < len && line[i] == '"') {
        size_t key_end = jsonStringEnd(line, len, i);
        uint8_t key[32];
        size_t key_len = SIZE_MAX;
        /* "text" is at most 24 bytes written (\u0074\u0065\u0078\u0074) */
        if (key_end - i <= sizeof key) key_len = jsonDecodeString(line, i, key_end, key);
        i = jsonSkipSpace(line, len, key_end);
        if (i >= len || line[i] != ':') return JSONL_UNREADABLE;
        i = jsonSkipSpace(line, len, i + 1);
        size_t value_end = jsonValueEnd(line, len, i);
        if (i >= len) return JSONL_UNREADABLE;
        if (key_len == 4 && !memcmp(key, "text", 4)) {
            if (line[i] != '"') return JSONL_TEXT_NOT_STRING;
            *begin = i;
            *end = value_end;
            return JSONL_TEXT;
        }
        i = jsonSkipSpace(line, len, value_end);
        if (i < len && line[i] == ',') i = jsonSkipSpace(line, len, i + 1);
    }
    return i < len && line[i] == '}' ? JSONL_NO_TEXT : JSONL_UNREADABLE;
}

/* Appends the "text" field of every record of a .jsonl file, one document
 * each, byte for byte: an escaped NUL (\u0000) is a 0 byte of the text,
 * which the byte tokenizer reads like any other. Fails on the first line
 * that is not a JSON object with a string "text", naming the line and the
 * byte offset. */
static int appendJsonl(const char *path, TextStream *ts, NsaError *err) {
    Bytes *text = &ts->text;
    Offsets *docs = &ts->docs;
    Bytes raw = {0};
    if (readWhole(path, &raw, &ts->budget, err) != 0) {
        free(raw.data);
        return -1;
    }
    int rc = 0;
    size_t line_no = 0;
    for (size_t pos = 0; pos < raw.len && rc == 0;) {
        line_no++;
        const char *line = (const char *)raw.data + pos;
        const char *nl = memchr(line, '\n', raw.len - pos);
        size_t len = nl ? (size_t)(nl - line) : raw.len - pos;
        size_t next = pos + len + (nl ? 1 : 0);
        size_t lead = 0;
        while (lead < len && (line[lead] == ' ' || line[lead] == '\t' || line[lead] == '\r')) lead++;
        if (lead == len) {  /* blank line: nothing to read */
            pos = next;
            continue;
        }
        const char *end = NULL;
        cJSON *obj = cJSON_ParseWithLengthOpts(line, len, &end, 0);
        size_t at = end ? (size_t)(end - line) : 0;
        if (!obj) {
            rc = nsaErrorf(err, "data.path: %s:%zu: malformed JSON at byte offset %zu (column %zu); "
                          "allowed: one JSON object per line with a string \"text\"",
                          path, line_no, pos + at, at + 1);
            break;
        }
        while (at < len && (line[at] == ' ' || line[at] == '\t' || line[at] == '\r')) at++;
        size_t begin = 0, stop = 0;
        JsonlText field = cJSON_IsObject(obj) && at >= len ? jsonlFindText(line, at, &begin, &stop)
                                                           : JSONL_UNREADABLE;
        if (at < len) {
            rc = nsaErrorf(err, "data.path: %s:%zu: unexpected text after the JSON value at byte offset "
                          "%zu (column %zu); allowed: one JSON object per line", path, line_no, pos + at,
                          at + 1);
        } else if (!cJSON_IsObject(obj)) {
            rc = nsaErrorf(err, "data.path: %s:%zu: the line at byte offset %zu is not a JSON object; "
                          "allowed: an object with a string \"text\"", path, line_no, pos + lead);
        } else if (field == JSONL_NO_TEXT || field == JSONL_TEXT_NOT_STRING) {
            rc = nsaErrorf(err,
                           "data.path: %s:%zu: %s \"text\" field in the record at byte offset %zu; "
                           "allowed: an object with a string \"text\"",
                           path, line_no, field == JSONL_TEXT_NOT_STRING ? "a non-string" : "no",
                           pos + lead);
        } else if (field == JSONL_UNREADABLE) {
            rc = nsaErrorf(err,
                           "data.path: %s:%zu: the record at byte offset %zu cannot be read; "
                           "allowed: one JSON object per line with a string \"text\"",
                           path, line_no, pos + lead);
        } else {
            /* room for the raw string: decoding never lengthens it */
            size_t room = stop - begin, n = 0;
            if (bytesReserve(text, room) != 0) {
                rc = nsaErrorf(err, "data.path: %s: out of memory", path);
            } else if ((n = jsonDecodeString(line, begin, stop, text->data + text->len)) ==
                       SIZE_MAX) {
                rc = nsaErrorf(
                    err,
                    "data.path: %s:%zu: the \"text\" string at byte offset %zu has an "
                    "escape that is not JSON; allowed: \\\", \\\\, \\/, \\b, \\f, \\n, \\r, "
                    "\\t and \\uXXXX (surrogates in pairs)",
                    path, line_no, pos + begin);
            } else if (n > 0) {
                if (offsetsPush(docs, text->len) != 0)
                    rc = nsaErrorf(err, "data.path: %s: out of memory", path);
                text->len += n;
                if (rc == 0 && appendSeparator(ts) != 0)
                    rc = nsaErrorf(err, "data.path: %s: out of memory", path);
            }
        }
        cJSON_Delete(obj);
        pos = next;
    }
    free(raw.data);
    return rc;
}

static int appendTextFile(const char *path, TextStream *ts, NsaError *err) {
    if (hasSuffix(path, ".jsonl")) return appendJsonl(path, ts, err);
    return appendTxt(path, ts, err);
}

static const char *splitName(DataSplit split) {
    return split == SPLIT_TRAIN ? "train" : split == SPLIT_VAL ? "val" : "whole";
}

/* Picks the document boundary nearest to the target that leaves both
 * splits at least `need` bytes. Returns 0 and *cut, or -1. */
static int chooseCut(const Offsets *docs, size_t n, double val_fraction, size_t need, size_t *cut) {
    double target = (double)n * (1.0 - val_fraction);
    int found = 0;
    double best = 0;
    for (size_t i = 0; i < docs->len; i++) {
        size_t b = (size_t)docs->data[i];
        if (b < need || n - b < need) continue;
        double dist = b > target ? b - target : target - b;
        if (!found || dist < best) {
            found = 1;
            best = dist;
            *cut = b;
        }
    }
    return found ? 0 : -1;
}

static int openText(DataLoader *dl, const JobConfig *cfg, NsaError *err) {
    const char *path = cfg->data.path;
    const Tokenizer *tok = tokenizerFind(cfg->data.tokenizer);
    if (!tok)
        return nsaErrorf(err, "data.tokenizer: \"%s\" is not a known tokenizer; allowed: %s",
                        cfg->data.tokenizer, tokenizerNames());
    struct stat st;
    if (stat(path, &st) != 0)
        return nsaErrorf(err, "data.path: %s: %s; allowed: a .txt or .jsonl file, or a directory of them",
                        path, strerror(errno));

    TextStream ts = {.budget = textLimit()};
    Names files = {0};
    int rc = 0;
    if (S_ISDIR(st.st_mode)) {
        static const char *const suffixes[] = {".txt", ".jsonl", NULL};
        rc = listDir(path, suffixes, &files, err);
        if (rc == 0 && files.len == 0)
            rc = nsaErrorf(err, "data.path: %s: no .txt or .jsonl files in the directory", path);
    } else if (namesPush(&files, path) != 0) {
        rc = nsaErrorf(err, "data.path: %s: out of memory", path);
    }
    /* the size check before any byte is read: every file regular, the
     * total within the limit */
    uint64_t total = 0;
    for (size_t i = 0; rc == 0 && i < files.len; i++) {
        struct stat fst;
        if (stat(files.data[i], &fst) != 0)
            rc = nsaErrorf(err, "data.path: %s: %s", files.data[i], strerror(errno));
        else if (!S_ISREG(fst.st_mode))
            rc = nsaErrorf(err, "data.path: %s: is %s; allowed: a .txt or .jsonl file, or a directory of them",
                           files.data[i], fsKindName(fst.st_mode));
        else
            total += (uint64_t)fst.st_size;
    }
    if (rc == 0 && total > ts.budget)
        rc = nsaErrorf(err, "data.path: %s: %llu bytes of text; allowed: at most %llu (text is loaded into "
                       "memory, 3 bytes per byte: pre-tokenize larger corpora into llm.c shards, data.source "
                       "shards, which are mapped)", path, (unsigned long long)total,
                       (unsigned long long)ts.budget);
    /* one allocation for the stream (jsonl records only shrink into it) */
    size_t stream_cap = (size_t)total + files.len * strlen(DOC_SEPARATOR) + 1;
    if (rc == 0 && !(ts.text.data = malloc(stream_cap)))
        rc = nsaErrorf(err, "data.path: %s: out of memory for %llu bytes of text", path, (unsigned long long)total);
    ts.text.cap = ts.text.data ? stream_cap : 0;
    for (size_t i = 0; rc == 0 && i < files.len; i++) rc = appendTextFile(files.data[i], &ts, err);
    namesFree(&files);
    Bytes text = ts.text;
    Offsets docs = ts.docs;
    /* what messages report: the data's bytes, not nsad's separators */
    size_t data_bytes = text.len - ts.separator_bytes;
    if (rc == 0 && docs.len == 0) rc = nsaErrorf(err, "data.path: %s: no text in the data", path);

    /* the split, in bytes of the stream; +1: a window holds seq_len + 1 */
    size_t need = (size_t)cfg->train.seq_len + 1;
    size_t begin = 0, end = text.len;
    if (rc == 0) {
        double vf = cfg->data.val_fraction;
        if (vf <= 0 && dl->split == SPLIT_VAL) {
            rc = nsaErrorf(err, "data.val_fraction: 0 leaves no validation split; allowed: above 0 to "
                          "evaluate");
        } else if (vf > 0 && dl->split != SPLIT_ALL) {
            size_t cut = 0;
            if (chooseCut(&docs, text.len, vf, need, &cut) != 0)
                rc = nsaErrorf(err, "data.val_fraction: %g: %s (%zu bytes, %zu documents) has no document "
                              "boundary leaving both splits %zu tokens (train.seq_len + 1); allowed: more "
                              "data, a shorter seq_len or another val_fraction",
                              vf, path, data_bytes, docs.len, need);
            else if (dl->split == SPLIT_TRAIN)
                end = cut;
            else
                begin = cut;
        }
    }
    if (rc == 0 && end - begin < need) {
        if (begin == 0 && end == text.len)
            rc = nsaErrorf(err, "data.path: %s: %zu bytes of text, fewer than train.seq_len + 1 (%zu)", path,
                           data_bytes, need);
        else
            rc = nsaErrorf(err, "data.path: %s: the %s split has %zu bytes, fewer than train.seq_len + 1 (%zu)",
                           path, splitName(dl->split), end - begin, need);
    }
    free(docs.data);
    if (rc != 0) {
        free(text.data);
        return -1;
    }

    size_t bytes = end - begin;
    dl->owned = malloc(tokenizerMaxTokens(tok, bytes) * sizeof(uint16_t));
    dl->segments = malloc(sizeof *dl->segments);
    if (!dl->owned || !dl->segments) {
        free(text.data);
        return nsaErrorf(err, "data.path: %s: out of memory for %zu tokens", path, bytes);
    }
    size_t n = tokenizerEncode(tok, text.data + begin, bytes, dl->owned);
    free(text.data);
    dl->segments[0] = (Segment){dl->owned, 0, n, -1};
    dl->n_segments = 1;
    dl->n_tokens = n;
    dl->vocab = tok->vocab_size;
    dl->bytes_per_token = n ? (double)bytes / (double)n : tok->bytes_per_token;
    return 0;
}

/* ---- llm.c token shards ---------------------------------------------------------- */

/* Maps one shard and checks its header against its size. */
static int mapShard(const char *path, Mapping *map, const uint16_t **tokens, uint64_t *n_tokens,
                    NsaError *err) {
    struct stat st;
    NsaError oerr;
    int fd = fsOpenRegular(path, &st, &oerr);
    if (fd < 0) return nsaErrorf(err, "data.path: %s", oerr.message);
    size_t size = (size_t)st.st_size;
    if (size < SHARD_HEADER_BYTES) {
        close(fd);
        return nsaErrorf(err, "data.path: %s: truncated at offset %zu: shorter than the %zu-byte llm.c "
                        "shard header", path, size, (size_t)SHARD_HEADER_BYTES);
    }
    void *addr = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (addr == MAP_FAILED) return nsaErrorf(err, "data.path: %s: cannot map: %s", path, strerror(errno));
    map->addr = addr;
    map->size = size;
    map->path = strdup(path);

    const int32_t *header = addr;
    if (header[0] != SHARD_MAGIC)
        return nsaErrorf(err, "data.path: %s: offset 0: magic %d is not an llm.c token shard's; allowed: "
                        "%d", path, header[0], SHARD_MAGIC);
    if (header[1] != SHARD_VERSION)
        return nsaErrorf(err, "data.path: %s: offset 4: shard version %d is not supported; allowed: %d "
                        "(uint16 tokens)", path, header[1], SHARD_VERSION);
    if (header[2] <= 0)
        return nsaErrorf(err, "data.path: %s: offset 8: token count %d; allowed: a positive count", path,
                        header[2]);
    uint64_t count = (uint64_t)header[2];
    size_t expected = SHARD_HEADER_BYTES + (size_t)count * sizeof(uint16_t);
    if (size < expected)
        return nsaErrorf(err, "data.path: %s: truncated at offset %zu: the header promises %llu tokens, "
                        "which end at offset %zu", path, size, (unsigned long long)count, expected);
    if (size > expected)
        return nsaErrorf(err, "data.path: %s: offset %zu: %zu bytes after the last of the %llu tokens the "
                        "header promises", path, expected, size - expected, (unsigned long long)count);
    *tokens = (const uint16_t *)((const char *)addr + SHARD_HEADER_BYTES);
    *n_tokens = count;
    return 0;
}

static int isValShard(const char *path) {
    const char *base = strrchr(path, '/');
    return strstr(base ? base + 1 : path, "val") != NULL;
}

static int openShards(DataLoader *dl, const JobConfig *cfg, NsaError *err) {
    const char *path = cfg->data.path;
    Names files = {0};
    int rc = 0;
    struct stat st;
    if (strpbrk(path, "*?[")) {
        glob_t g;
        int grc = glob(path, 0, NULL, &g);
        if (grc == GLOB_NOMATCH)
            rc = nsaErrorf(err, "data.path: %s: the pattern matches no file", path);
        else if (grc != 0)
            rc = nsaErrorf(err, "data.path: %s: cannot expand the pattern", path);
        for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
            if (namesPush(&files, g.gl_pathv[i]) != 0) rc = nsaErrorf(err, "data.path: out of memory");
        if (grc == 0) globfree(&g);
    } else if (stat(path, &st) != 0) {
        rc = nsaErrorf(err, "data.path: %s: %s; allowed: a .bin shard, a directory of them, or a glob",
                      path, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        static const char *const suffixes[] = {".bin", NULL};
        rc = listDir(path, suffixes, &files, err);
        if (rc == 0 && files.len == 0) rc = nsaErrorf(err, "data.path: %s: no .bin shards in the directory", path);
    } else {
        if (namesPush(&files, path) != 0) rc = nsaErrorf(err, "data.path: out of memory");
    }
    if (rc != 0) {
        namesFree(&files);
        return -1;
    }

    /* llm.c names its held-out shard *_val_*: use the names when both kinds exist */
    size_t n_val_named = 0;
    for (size_t i = 0; i < files.len; i++) n_val_named += (size_t)isValShard(files.data[i]);
    int by_name = !dl->whole_path && n_val_named > 0 && n_val_named < files.len;

    dl->maps = calloc(files.len, sizeof *dl->maps);
    dl->segments = calloc(files.len, sizeof *dl->segments);
    if (!dl->maps || !dl->segments) {
        namesFree(&files);
        return nsaErrorf(err, "data.path: out of memory");
    }
    /* map and check every header first: the split needs the total */
    const uint16_t **tok = calloc(files.len, sizeof *tok);
    uint64_t *count = calloc(files.len, sizeof *count);
    uint64_t total = 0;
    if (!tok || !count) rc = nsaErrorf(err, "data.path: out of memory");
    for (size_t i = 0; rc == 0 && i < files.len; i++) {
        rc = mapShard(files.data[i], &dl->maps[i], &tok[i], &count[i], err);
        dl->n_maps = (int)i + 1;
        if (rc == 0 && (!by_name || dl->split == SPLIT_ALL || isValShard(files.data[i]) == (dl->split == SPLIT_VAL)))
            total += count[i];
    }

    /* [lo, hi) of the concatenation of this split's files */
    uint64_t lo = 0, hi = total;
    if (rc == 0 && !by_name && dl->split != SPLIT_ALL) {
        double vf = cfg->data.val_fraction;
        uint64_t n_val = (uint64_t)((double)total * vf);
        if (dl->split == SPLIT_VAL && vf <= 0)
            rc = nsaErrorf(err, "data.val_fraction: 0 leaves no validation split; allowed: above 0 to evaluate");
        else if (dl->split == SPLIT_TRAIN)
            hi = total - n_val;
        else
            lo = total - n_val;
    }
    uint64_t need = (uint64_t)cfg->train.seq_len + 1;
    if (rc == 0 && hi - lo < need)
        rc = nsaErrorf(err, "data.path: %s: the %s split has %llu tokens, fewer than train.seq_len + 1 (%llu)",
                      path, splitName(dl->split), (unsigned long long)(hi - lo),
                      (unsigned long long)need);

    /* segments for [lo, hi), each token checked against the vocabulary */
    uint64_t offset = 0;
    for (size_t i = 0; rc == 0 && i < files.len; i++) {
        if (by_name && dl->split != SPLIT_ALL && isValShard(files.data[i]) != (dl->split == SPLIT_VAL)) continue;
        uint64_t a = offset > lo ? offset : lo, b = offset + count[i] < hi ? offset + count[i] : hi;
        if (a < b) {
            const uint16_t *t = tok[i] + (a - offset);
            for (uint64_t j = 0; j < b - a; j++) {
                if (t[j] >= (uint32_t)cfg->model.vocab_size) {
                    rc = nsaErrorf(err, "data.path: %s: offset %llu: token %u is not below model.vocab_size "
                                  "(%d); allowed: tokens < vocab_size", files.data[i],
                                  (unsigned long long)(SHARD_HEADER_BYTES + (a - offset + j) * 2), t[j],
                                  cfg->model.vocab_size);
                    break;
                }
            }
            dl->segments[dl->n_segments++] = (Segment){t, a - lo, b - a, (int)i};
        }
        offset += count[i];
    }
    free(tok);
    free(count);
    namesFree(&files);
    if (rc != 0) return -1;
    dl->n_tokens = hi - lo;
    dl->vocab = cfg->model.vocab_size;
    dl->bytes_per_token = 0;  /* the shards do not say what text they came from */
    return 0;
}

/* ---- batches ------------------------------------------------------------------------- */

/* Copies tokens [start, start + n) of the stream into out as int32;
 * *reading names the segment being read (for an error after a SIGBUS). */
static void copyWindow(const DataLoader *dl, uint64_t start, size_t n, int32_t *out,
                       volatile int *reading) {
    int lo = 0, hi = dl->n_segments - 1;
    while (lo < hi) {  /* the last segment starting at or before `start` */
        int mid = (lo + hi + 1) / 2;
        if (dl->segments[mid].start <= start) lo = mid; else hi = mid - 1;
    }
    for (int s = lo; n > 0; s++) {
        const Segment *seg = &dl->segments[s];
        *reading = s;
        uint64_t off = start - seg->start;
        size_t take = (size_t)(seg->len - off) < n ? (size_t)(seg->len - off) : n;
        for (size_t i = 0; i < take; i++) out[i] = seg->tokens[off + i];
        out += take;
        n -= take;
        start += take;
    }
}

/* One batch to compute: what computeBatch needs, plus the segment it was
 * reading when a guarded read failed. */
typedef struct BatchJob {
    const DataLoader *dl;
    uint64_t position;
    int32_t *tokens, *targets, *window; /* window: seq_len + 1 tokens of scratch */
    volatile int reading;
} BatchJob;

/* The batch at `position`: a pure function of the loader's data, seed and
 * position. Takes no lock and allocates nothing (signalsGuardBus may
 * abandon it). */
static void computeBatch(void *arg) {
    BatchJob *job = arg;
    const DataLoader *dl = job->dl;
    int32_t *window = job->window;
    size_t S = (size_t)dl->seq_len;
    for (int r = 0; r < dl->batch; r++) {
        if (dl->source == DATA_SYNTHETIC) {
            uint64_t row = hash4(dl->seed, (uint64_t)dl->split, job->position, (uint64_t)r);
            for (size_t i = 0; i <= S; i++) window[i] = (int32_t)(mix64(row ^ i) % (uint64_t)dl->vocab);
        } else if (dl->split == SPLIT_TRAIN) {
            uint64_t n_starts = dl->n_tokens - S;  /* windows of S + 1 tokens */
            uint64_t start =
                hash4(dl->seed, 0x747261696eULL /* "train" */, job->position, (uint64_t)r) % n_starts;
            copyWindow(dl, start, S + 1, window, &job->reading);
        } else {
            uint64_t n_windows = (dl->n_tokens - 1) / S;
            uint64_t k = (job->position * (uint64_t)dl->batch + (uint64_t)r) % n_windows;
            copyWindow(dl, k * S, S + 1, window, &job->reading);
        }
        memcpy(job->tokens + (size_t)r * S, window, S * sizeof(int32_t));
        memcpy(job->targets + (size_t)r * S, window + 1, S * sizeof(int32_t));
    }
}

/* computeBatch; over mapped shards a read past a file that shrank under
 * nsad (truncated or rewritten in place) raises SIGBUS, which fails the
 * batch with err naming the file instead of killing the daemon. */
static int readBatch(const DataLoader *dl, uint64_t position, int32_t *tokens, int32_t *targets,
                     int32_t *window, NsaError *err) {
    BatchJob job = {dl, position, tokens, targets, window, -1};
    if (dl->source != DATA_SHARDS) {
        computeBatch(&job);
        return 0;
    }
    if (signalsGuardBus(computeBatch, &job) == 0) return 0;
    int seg = job.reading;
    if (seg < 0) /* nothing was read: the guard itself could not be set up */
        return nsaErrorf(err, "data: cannot install the SIGBUS guard for mapped shards: %s", strerror(errno));
    int map = seg >= 0 && seg < dl->n_segments ? dl->segments[seg].map : -1;
    return nsaErrorf(err, "data.path: %s: the shard shrank while nsad read it (truncated or rewritten "
                    "during the run); stop writing to it and resume the run",
                    map >= 0 && dl->maps[map].path ? dl->maps[map].path : "a shard");
}

static void *prefetchMain(void *arg) {
    DataLoader *dl = arg;
    int32_t *window = malloc(((size_t)dl->seq_len + 1) * sizeof(int32_t));
    pthread_mutex_lock(&dl->mu);
    if (!window) { /* a waiter must not wait for batches that never come */
        nsaErrorf(&dl->fail, "data: out of memory for the prefetch thread's window (%d tokens)",
                  dl->seq_len + 1);
        dl->failed = 1;
        pthread_cond_broadcast(&dl->cv);
    }
    while (!dl->stop && window) {
        /* the first position of the look-ahead not held, and a slot outside it */
        uint64_t target = 0;
        int have_target = 0;
        Slot *free_slot = NULL;
        for (uint64_t p = dl->want; p < dl->want + (uint64_t)dl->depth && !have_target; p++) {
            int held = 0;
            for (int i = 0; i < dl->depth; i++)
                held |= dl->slots[i].state != SLOT_EMPTY && dl->slots[i].position == p;
            if (!held) {
                target = p;
                have_target = 1;
            }
        }
        for (int i = 0; i < dl->depth && !free_slot; i++) {
            Slot *s = &dl->slots[i];
            if (s->state == SLOT_EMPTY ||
                (s->state == SLOT_READY && (s->position < dl->want || s->position >= dl->want + (uint64_t)dl->depth)))
                free_slot = s;
        }
        if (!have_target || !free_slot) {
            pthread_cond_wait(&dl->cv, &dl->mu);
            continue;
        }
        free_slot->state = SLOT_FILLING;
        free_slot->position = target;
        pthread_mutex_unlock(&dl->mu);
        NsaError ferr = {""};
        int rc = readBatch(dl, target, free_slot->tokens, free_slot->targets, window, &ferr);
        pthread_mutex_lock(&dl->mu);
        if (rc != 0) { /* dataBatch reports it; nothing more is read */
            free_slot->state = SLOT_EMPTY;
            dl->fail = ferr;
            dl->failed = 1;
            pthread_cond_broadcast(&dl->cv);
            break;
        }
        free_slot->state = SLOT_READY;
        pthread_cond_broadcast(&dl->cv);
    }
    pthread_mutex_unlock(&dl->mu);
    free(window);
    return NULL;
}

static int startPrefetch(DataLoader *dl, int depth, NsaError *err) {
    dl->depth = depth;
    if (depth <= 0) return 0;
    size_t n = (size_t)dl->batch * (size_t)dl->seq_len;
    dl->slots = calloc((size_t)depth, sizeof *dl->slots);
    if (!dl->slots) return nsaErrorf(err, "data: out of memory for the prefetch ring");
    for (int i = 0; i < depth; i++) {
        dl->slots[i].tokens = malloc(n * sizeof(int32_t));
        dl->slots[i].targets = malloc(n * sizeof(int32_t));
        if (!dl->slots[i].tokens || !dl->slots[i].targets)
            return nsaErrorf(err, "data: out of memory for the prefetch ring (%d x %zu tokens)", depth, n);
    }
    if (pthread_mutex_init(&dl->mu, NULL) != 0 || pthread_cond_init(&dl->cv, NULL) != 0)
        return nsaErrorf(err, "data: cannot create the prefetch thread's lock");
    int rc = pthread_create(&dl->thread, NULL, prefetchMain, dl);
    if (rc != 0) {
        pthread_cond_destroy(&dl->cv);
        pthread_mutex_destroy(&dl->mu);
        return nsaErrorf(err, "data: cannot start the prefetch thread: %s", strerror(rc));
    }
    dl->thread_started = 1;
    return 0;
}

/* ---- public API -------------------------------------------------------------------------- */

static DataLoader *openSplit(const JobConfig *cfg, DataSplit split, int whole_path, NsaError *err);

DataLoader *dataOpen(const JobConfig *cfg, DataSplit split, NsaError *err) {
    /* data.val_path: the validation split is all of that source, read as a
     * whole file is; training takes all of data.path, no share held out */
    if (cfg->data.val_path[0] && (split == SPLIT_TRAIN || split == SPLIT_VAL)) {
        JobConfig *own = malloc(sizeof *own);
        if (!own) {
            nsaErrorf(err, "data: out of memory");
            return NULL;
        }
        *own = *cfg;
        own->data.val_path[0] = '\0';
        own->data.val_fraction = 0;
        if (split == SPLIT_VAL)
            snprintf(own->data.path, sizeof own->data.path, "%s", cfg->data.val_path);
        DataLoader *dl = openSplit(own, split == SPLIT_VAL ? SPLIT_ALL : SPLIT_TRAIN, 1, err);
        free(own);
        return dl;
    }
    return openSplit(cfg, split, 0, err);
}

/* dataOpen for one split of cfg->data.path; whole_path: the training split
 * takes every shard, whatever its name (data.val_path holds the validation). */
static DataLoader *openSplit(const JobConfig *cfg, DataSplit split, int whole_path, NsaError *err) {
    if (cfg->train.seq_len < 1 || cfg->train.batch_size < 1) {
        nsaErrorf(err, "train.seq_len: %d, train.batch_size: %d; allowed: both at least 1",
                 cfg->train.seq_len, cfg->train.batch_size);
        return NULL;
    }
    if (split != SPLIT_TRAIN && split != SPLIT_VAL && split != SPLIT_ALL) {
        nsaErrorf(err, "data: split %d; allowed: train (0), val (1) or all (2)", (int)split);
        return NULL;
    }
    DataLoader *dl = calloc(1, sizeof *dl);
    if (!dl) {
        nsaErrorf(err, "data: out of memory");
        return NULL;
    }
    dl->source = cfg->data.source;
    dl->split = split;
    dl->whole_path = whole_path;
    dl->batch = cfg->train.batch_size;
    dl->seq_len = cfg->train.seq_len;
    dl->seed = cfg->train.seed;
    int rc;
    switch (cfg->data.source) {
    case DATA_SYNTHETIC:
        if (split == SPLIT_VAL && cfg->data.val_fraction <= 0) {
            rc = nsaErrorf(err, "data.val_fraction: 0 leaves no validation split; allowed: above 0 to evaluate");
            break;
        }
        dl->n_tokens = UINT64_MAX;
        dl->vocab = cfg->model.vocab_size;
        dl->bytes_per_token = 1.0;
        rc = 0;
        break;
    case DATA_TEXT: rc = openText(dl, cfg, err); break;
    case DATA_SHARDS: rc = openShards(dl, cfg, err); break;
    default: rc = nsaErrorf(err, "data.source: %d; allowed: synthetic, text, shards", (int)cfg->data.source);
    }
    if (rc == 0 && dl->vocab > cfg->model.vocab_size)
        rc = nsaErrorf(err, "model.vocab_size: %d is smaller than the data's vocabulary (%d); allowed: at "
                      "least %d", cfg->model.vocab_size, dl->vocab, dl->vocab);
    if (rc == 0 && !(dl->window = malloc(((size_t)dl->seq_len + 1) * sizeof(int32_t))))
        rc = nsaErrorf(err, "data: out of memory for a window of %d tokens", dl->seq_len + 1);
    if (rc == 0) rc = startPrefetch(dl, cfg->data.prefetch, err);
    if (rc != 0) {
        dataClose(dl);
        return NULL;
    }
    return dl;
}

void dataClose(DataLoader *dl) {
    if (!dl) return;
    if (dl->thread_started) {
        pthread_mutex_lock(&dl->mu);
        dl->stop = 1;
        pthread_cond_broadcast(&dl->cv);
        pthread_mutex_unlock(&dl->mu);
        pthread_join(dl->thread, NULL);
        pthread_cond_destroy(&dl->cv);
        pthread_mutex_destroy(&dl->mu);
    }
    if (dl->slots) {
        for (int i = 0; i < dl->depth; i++) {
            free(dl->slots[i].tokens);
            free(dl->slots[i].targets);
        }
        free(dl->slots);
    }
    for (int i = 0; i < dl->n_maps; i++) {
        if (dl->maps[i].addr) munmap(dl->maps[i].addr, dl->maps[i].size);
        free(dl->maps[i].path);
    }
    free(dl->maps);
    free(dl->segments);
    free(dl->owned);
    free(dl->window);
    free(dl);
}

int dataBatch(DataLoader *dl, uint64_t position, int32_t *tokens, int32_t *targets, NsaError *err) {
    if (!dl || !tokens || !targets) return nsaErrorf(err, "dataBatch: NULL argument");
    size_t n = (size_t)dl->batch * (size_t)dl->seq_len;
    int served = 0;
    if (dl->thread_started) {
        pthread_mutex_lock(&dl->mu);
        for (int i = 0; i < dl->depth && !served; i++) {
            Slot *s = &dl->slots[i];
            while (s->state == SLOT_FILLING && s->position == position) pthread_cond_wait(&dl->cv, &dl->mu);
            if (dl->failed) break;
            if (s->state == SLOT_READY && s->position == position) {
                memcpy(tokens, s->tokens, n * sizeof(int32_t));
                memcpy(targets, s->targets, n * sizeof(int32_t));
                served = 1;
            }
        }
        dl->want = position + 1;
        int failed = dl->failed;
        if (failed && err) *err = dl->fail;
        pthread_cond_broadcast(&dl->cv);
        pthread_mutex_unlock(&dl->mu);
        if (failed) return -1;
    }
    if (served) {
        atomic_fetch_add(&dl->hits, 1);
        return 0;
    }
    if (readBatch(dl, position, tokens, targets, dl->window, err) != 0) return -1;
    atomic_fetch_add(&dl->misses, 1);
    return 0;
}

uint64_t dataNumTokens(const DataLoader *dl) { return dl->n_tokens; }

double dataBytesPerToken(const DataLoader *dl) { return dl->bytes_per_token; }

int dataVocabSize(const DataLoader *dl) { return dl->vocab; }

void dataGetStats(DataLoader *dl, DataStats *out) {
    out->prefetched = atomic_load(&dl->hits);
    out->computed = atomic_load(&dl->misses);
}

int dataPrefetchWait(DataLoader *dl, uint64_t position) {
    if (!dl || !dl->thread_started) return 0;
    int ready = 0;
    pthread_mutex_lock(&dl->mu);
    while (!dl->failed && position >= dl->want && position - dl->want < (uint64_t)dl->depth) {
        for (int i = 0; i < dl->depth && !ready; i++)
            ready = dl->slots[i].state == SLOT_READY && dl->slots[i].position == position;
        if (ready) break;
        pthread_cond_wait(&dl->cv, &dl->mu);
    }
    pthread_mutex_unlock(&dl->mu);
    return ready;
}
