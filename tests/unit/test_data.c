/* test_data.c - the data loaders: synthetic, text (.txt, directories,
 * .jsonl) and llm.c shards. Batches are pure functions of (seed, position),
 * the prefetch thread serves exactly what a direct read gives, validation
 * never shares a token with training, tokens stay below the vocabulary, and
 * corrupt input names its file and offset. Fixtures live in a mkdtemp
 * directory; the fortunes corpus (scripts/make-corpus.sh) is used when built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "testutil.h"
#include "data.h"

#define CORPUS "build/data/fortunes.txt"

typedef struct Fixture {
    char dir[64];
} Fixture;

static int setupDir(void **state) {
    Fixture *fx = calloc(1, sizeof *fx);
    if (!fx) return -1;
    snprintf(fx->dir, sizeof fx->dir, "/tmp/nsad-test-data-XXXXXX");
    if (!mkdtemp(fx->dir)) return -1;
    *state = fx;
    return 0;
}

static int teardownDir(void **state) {
    Fixture *fx = *state;
    testRemoveTree(fx->dir);
    free(fx);
    return 0;
}

static void pathIn(const Fixture *fx, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", fx->dir, name);
}

static void writeFile(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* An llm.c shard: header (magic, version, count) + uint16 tokens; the
 * header may lie about the count to make a corrupt file. */
static void writeShard(const char *path, int32_t magic, int32_t version, int32_t header_count,
                       const uint16_t *tokens, size_t n) {
    int32_t header[256] = {0};
    header[0] = magic;
    header[1] = version;
    header[2] = header_count;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(header, sizeof header, 1, f), 1);
    if (n) assert_int_equal(fwrite(tokens, sizeof(uint16_t), n, f), n);
    fclose(f);
}

static void baseConfig(JobConfig *cfg, DataSource source, const char *path, int seq_len, int batch) {
    configDefaults(cfg);
    cfg->data.source = source;
    snprintf(cfg->data.path, sizeof cfg->data.path, "%s", path ? path : "");
    cfg->train.seq_len = seq_len;
    cfg->train.batch_size = batch;
    cfg->data.prefetch = 0;
}

static DataLoader *openOk(const JobConfig *cfg, DataSplit split) {
    NsaError err = {{0}};
    DataLoader *dl = dataOpen(cfg, split, &err);
    if (!dl) fail_msg("dataOpen: %s", err.message);
    return dl;
}

static void expectOpenError(const JobConfig *cfg, DataSplit split, const char *a, const char *b) {
    NsaError err = {{0}};
    DataLoader *dl = dataOpen(cfg, split, &err);
    if (dl) {
        dataClose(dl);
        fail_msg("dataOpen succeeded; expected an error with \"%s\"", a);
    }
    assert_null(strchr(err.message, '\n'));
    if (a && !strstr(err.message, a)) fail_msg("message \"%s\" lacks \"%s\"", err.message, a);
    if (b && !strstr(err.message, b)) fail_msg("message \"%s\" lacks \"%s\"", err.message, b);
}

typedef struct Batch {
    int32_t *tokens, *targets;
    size_t n;
} Batch;

static Batch batchNew(const JobConfig *cfg) {
    Batch b;
    b.n = (size_t)cfg->train.batch_size * (size_t)cfg->train.seq_len;
    b.tokens = malloc(b.n * sizeof(int32_t));
    b.targets = malloc(b.n * sizeof(int32_t));
    assert_non_null(b.tokens);
    assert_non_null(b.targets);
    return b;
}

static void batchFree(Batch *b) {
    free(b->tokens);
    free(b->targets);
}

static void getBatch(DataLoader *dl, uint64_t position, Batch *b) {
    NsaError err = {{0}};
    if (dataBatch(dl, position, b->tokens, b->targets, &err) != 0) fail_msg("dataBatch: %s", err.message);
}

/* Every row's targets are its tokens shifted by one; all ids < vocab. */
static void checkBatchShape(const Batch *b, int batch, int seq_len, int vocab) {
    for (int r = 0; r < batch; r++) {
        const int32_t *t = b->tokens + (size_t)r * seq_len, *y = b->targets + (size_t)r * seq_len;
        for (int i = 0; i < seq_len; i++) {
            assert_true(t[i] >= 0 && t[i] < vocab);
            assert_true(y[i] >= 0 && y[i] < vocab);
            if (i + 1 < seq_len) assert_int_equal(y[i], t[i + 1]);
        }
    }
}

/* ---- synthetic ----------------------------------------------------------------- */

static void test_synthetic_is_a_function_of_seed_and_position(void **state) {
    (void)state;
    JobConfig cfg;
    baseConfig(&cfg, DATA_SYNTHETIC, NULL, 64, 4);
    cfg.model.vocab_size = 1000;
    DataLoader *a = openOk(&cfg, SPLIT_TRAIN), *b = openOk(&cfg, SPLIT_TRAIN);
    assert_int_equal(dataVocabSize(a), 1000);
    assert_true(dataNumTokens(a) == UINT64_MAX);
    Batch x = batchNew(&cfg), y = batchNew(&cfg);
    getBatch(a, 7, &x);
    getBatch(b, 7, &y);
    checkBatchShape(&x, 4, 64, 1000);
    assert_memory_equal(x.tokens, y.tokens, x.n * sizeof(int32_t));
    assert_memory_equal(x.targets, y.targets, x.n * sizeof(int32_t));
    getBatch(b, 8, &y);
    assert_memory_not_equal(x.tokens, y.tokens, x.n * sizeof(int32_t));

    cfg.train.seed = 99;
    DataLoader *c = openOk(&cfg, SPLIT_TRAIN);
    getBatch(c, 7, &y);
    assert_memory_not_equal(x.tokens, y.tokens, x.n * sizeof(int32_t));
    DataLoader *v = openOk(&cfg, SPLIT_VAL);
    getBatch(c, 0, &x);
    getBatch(v, 0, &y);
    assert_memory_not_equal(x.tokens, y.tokens, x.n * sizeof(int32_t));

    /* every id of a small vocabulary shows up: the ids are spread */
    int seen[1000] = {0};
    for (uint64_t p = 0; p < 20; p++) {
        getBatch(a, p, &x);
        for (size_t i = 0; i < x.n; i++) seen[x.tokens[i]] = 1;
    }
    int distinct = 0;
    for (int i = 0; i < 1000; i++) distinct += seen[i];
    assert_true(distinct > 990);
    batchFree(&x);
    batchFree(&y);
    dataClose(a);
    dataClose(b);
    dataClose(c);
    dataClose(v);
}

/* ---- text ------------------------------------------------------------------------ */

/* Document i of the id corpus is "[%05d]" repeated: every window of a few
 * dozen bytes names the documents it came from. */
static void writeIdCorpus(const char *path, int n_docs, int jsonl) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < n_docs; i++) {
        if (jsonl) fputs("{\"id\": 1, \"text\": \"", f);
        for (int k = 0; k < 6; k++) fprintf(f, "[%05d]", i);
        fputs(jsonl ? "\"}\n" : "\n\n", f);
    }
    fclose(f);
}

/* A text config (baseConfig) over an id corpus of n_docs documents written
 * as `name` into the fixture's directory: JSON lines when name ends in
 * .jsonl, else plain text. */
static void idCorpusConfig(JobConfig *cfg, const Fixture *fx, const char *name, int n_docs, int seq_len,
                           int batch) {
    char path[256];
    pathIn(fx, name, path, sizeof path);
    const size_t len = strlen(name);
    writeIdCorpus(path, n_docs, len > 6 && !strcmp(name + len - 6, ".jsonl"));
    baseConfig(cfg, DATA_TEXT, path, seq_len, batch);
}

/* Adds every complete "[ddddd]" id in a window to the set. */
static void collectIds(const int32_t *t, int n, unsigned char *set, int n_docs) {
    for (int i = 0; i + 7 <= n; i++) {
        if (t[i] != '[' || t[i + 6] != ']') continue;
        int id = 0, ok = 1;
        for (int k = 1; k <= 5; k++) {
            if (t[i + k] < '0' || t[i + k] > '9') ok = 0;
            id = id * 10 + (t[i + k] - '0');
        }
        if (ok && id < n_docs) set[id] = 1;
    }
}

/* Opens both splits of cfg and checks that no document id appears in both,
 * that val holds the tail of the corpus, and its share is near val_fraction. */
static void checkIdSplit(const JobConfig *cfg, int n_docs) {
    DataLoader *train = openOk(cfg, SPLIT_TRAIN), *val = openOk(cfg, SPLIT_VAL);
    int S = cfg->train.seq_len, B = cfg->train.batch_size;
    unsigned char *in_train = calloc((size_t)n_docs, 1), *in_val = calloc((size_t)n_docs, 1);
    Batch b = batchNew(cfg);
    for (uint64_t p = 0; p < 400; p++) {
        getBatch(train, p, &b);
        checkBatchShape(&b, B, S, 256);
        for (int r = 0; r < B; r++) collectIds(b.tokens + (size_t)r * S, S, in_train, n_docs);
    }
    uint64_t val_windows = (dataNumTokens(val) - 1) / (uint64_t)S;
    for (uint64_t p = 0; p * (uint64_t)B < val_windows; p++) {
        getBatch(val, p, &b);
        checkBatchShape(&b, B, S, 256);
        for (int r = 0; r < B; r++) collectIds(b.tokens + (size_t)r * S, S, in_val, n_docs);
    }
    int first_val = n_docs, last_train = -1, n_val = 0, n_train = 0;
    for (int i = 0; i < n_docs; i++) {
        if (in_train[i] && in_val[i]) fail_msg("document %d is in both splits", i);
        if (in_val[i] && i < first_val) first_val = i;
        if (in_train[i]) last_train = i;
        n_val += in_val[i];
        n_train += in_train[i];
    }
    assert_true(last_train < first_val);      /* val is the tail */
    assert_true(n_val >= 1);
    assert_true(n_train > n_docs / 2);        /* random windows cover most of train */
    double share = (double)dataNumTokens(val) / (double)(dataNumTokens(val) + dataNumTokens(train));
    assert_true(share > cfg->data.val_fraction * 0.5 && share < cfg->data.val_fraction * 1.5);
    assert_true(dataBytesPerToken(train) == 1.0);
    batchFree(&b);
    free(in_train);
    free(in_val);
    dataClose(train);
    dataClose(val);
}

/* checkIdSplit over 400 documents in the file `name`, a tenth of it val. */
static void checkIdSplitOfFile(const Fixture *fx, const char *name) {
    JobConfig cfg;
    idCorpusConfig(&cfg, fx, name, 400, 48, 8);
    cfg.data.val_fraction = 0.1;
    checkIdSplit(&cfg, 400);
}

static void test_txt_val_never_overlaps_train(void **state) { checkIdSplitOfFile(*state, "ids.txt"); }

static void test_jsonl_val_never_overlaps_train(void **state) { checkIdSplitOfFile(*state, "ids.jsonl"); }

static void test_directory_of_text_files(void **state) {
    Fixture *fx = *state;
    char dir[256], path[512];
    pathIn(fx, "corpus", dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    /* files in name order make the stream; other extensions are not data */
    const char *names[] = {"b.txt", "a.txt", "c.jsonl", "notes.md"};
    const char *texts[] = {"second file\n", "first file\n", "{\"text\": \"third file\"}\n", "not data"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        writeFile(path, texts[i], strlen(texts[i]));
    }
    JobConfig cfg;
    baseConfig(&cfg, DATA_TEXT, dir, 8, 1);
    cfg.data.val_fraction = 0;
    cfg.train.eval_every = 0;
    DataLoader *dl = openOk(&cfg, SPLIT_TRAIN);
    const char *expected = "first file\n\n\nsecond file\n\n\nthird file\n\n";
    assert_int_equal(dataNumTokens(dl), strlen(expected));
    Batch b = batchNew(&cfg);
    for (uint64_t p = 0; p < 50; p++) {  /* every window is a piece of the stream */
        getBatch(dl, p, &b);
        char window[10];
        for (int i = 0; i < 8; i++) window[i] = (char)b.tokens[i];
        window[8] = (char)b.targets[7];
        window[9] = '\0';
        if (!strstr(expected, window)) fail_msg("window \"%s\" is not in the stream", window);
    }
    batchFree(&b);
    dataClose(dl);
    expectOpenError(&cfg, SPLIT_VAL, "data.val_fraction", "no validation split");

    pathIn(fx, "empty-dir", dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    baseConfig(&cfg, DATA_TEXT, dir, 8, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, dir, "no .txt or .jsonl files");
}

static void test_malformed_jsonl_names_file_and_line(void **state) {
    Fixture *fx = *state;
    char path[256], want[320];
    pathIn(fx, "bad.jsonl", path, sizeof path);
    JobConfig cfg;
    baseConfig(&cfg, DATA_TEXT, path, 8, 1);

    const struct {
        const char *text;
        const char *error;  /* after "PATH:" */
        const char *also;   /* a second part of the message, or NULL */
    } cases[] = {
        /* line 4 is cut short (line 2 is blank, which is allowed) */
        {"{\"text\": \"one\"}\n\n{\"text\": \"two\"}\n{\"text\": \"thr\n{\"text\": \"four\"}\n",
         "4: malformed JSON", "byte offset"},
        {"{\"text\": \"one\"}\n{\"text\": 5}\n",
         "2: a non-string \"text\" field in the record at byte offset 16", NULL},
        {"{\"body\": \"one\"}\n", "1: no \"text\" field", NULL},
        {"{\"text\": \"one\"}\n[1, 2]\n", "2: the line at byte offset 16 is not a JSON object", NULL},
        {"{\"text\": \"one\"} x\n", "1: unexpected text after the JSON value at byte offset 16", NULL},
        /* cJSON reads a bad \u escape as a NUL and would cut the text there */
        {"{\"text\": \"one\"}\n{\"text\": \"a\\uZZZZb\"}\n",
         "2: the \"text\" string at byte offset 25 has an escape that is not JSON", "\\uXXXX"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        writeFile(path, cases[i].text, strlen(cases[i].text));
        snprintf(want, sizeof want, "%s:%s", path, cases[i].error);
        expectOpenError(&cfg, SPLIT_TRAIN, want, cases[i].also);
    }
}

/* Reads the whole stream of a text source: SPLIT_ALL's first window, with
 * seq_len one short of the stream, holds every token. */
static size_t readWholeStream(const char *path, uint8_t *out, size_t cap) {
    JobConfig cfg;
    baseConfig(&cfg, DATA_TEXT, path, 1, 1);
    DataLoader *dl = openOk(&cfg, SPLIT_ALL);
    size_t n = (size_t)dataNumTokens(dl);
    dataClose(dl);
    assert_true(n >= 2 && n <= cap);
    baseConfig(&cfg, DATA_TEXT, path, (int)n - 1, 1);
    dl = openOk(&cfg, SPLIT_ALL);
    Batch b = batchNew(&cfg);
    getBatch(dl, 0, &b);
    for (size_t i = 0; i + 1 < n; i++)
        out[i] = (uint8_t)b.tokens[i];
    out[n - 1] = (uint8_t)b.targets[n - 2];
    batchFree(&b);
    dataClose(dl);
    return n;
}

/* A jsonl record's text is every byte its JSON string holds: an escaped
 * NUL (\u0000) is a 0 token, not the end of the text (cJSON's strings are C
 * strings, and "ab\u0000cd" was read as "ab"); the eval path (evaluate.c)
 * reads data through the same loader. */
static void test_jsonl_text_keeps_every_byte(void **state) {
    Fixture *fx = *state;
    char path[256];
    pathIn(fx, "nul.jsonl", path, sizeof path);
    /* line 2: a "text" inside another member is not the record's */
    const char *jsonl =
        "{\"text\": \"ab\\u0000cd\", \"id\": 1}\n"
        "{\"meta\": {\"text\": 5, \"x\": [\"}\", \"\\\"\"]}, \"text\": \"\\u0000\"}\n"
        "{\"t\\u0065xt\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u20ac\\ud83d\\ude00\", \"text\": "
        "\"dup\"}\n"
        "{\"text\": \"\"}\n" /* empty: no document */
        "\xEF\xBB\xBF{\"text\":\"z\\u0000\"}\n";
    writeFile(path, jsonl, strlen(jsonl));
    static const uint8_t expected[] = {'a',  'b',  0,    'c',  'd',  '\n', '\n', 0,    '\n',
                                       '\n', 'q',  '"',  '\\', '/',  '\b', '\f', '\n', '\r',
                                       '\t', 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98,
                                       0x80, '\n', '\n', 'z',  0,    '\n', '\n'};
    uint8_t got[128];
    size_t n = readWholeStream(path, got, sizeof got);
    assert_int_equal(n, sizeof expected);
    assert_memory_equal(got, expected, sizeof expected);

    /* a key is "text" only when all of it is: "text\u0000" is another key */
    const char *other = "{\"text\\u0000\": \"abcdefgh\"}\n";
    writeFile(path, other, strlen(other));
    JobConfig cfg;
    baseConfig(&cfg, DATA_TEXT, path, 4, 1);
    char want[320];
    snprintf(want, sizeof want, "%s:1: no \"text\" field", path);
    expectOpenError(&cfg, SPLIT_ALL, want, NULL);
}

static void test_crlf_paragraphs_are_documents(void **state) {
    Fixture *fx = *state;
    char path[256];
    pathIn(fx, "crlf.txt", path, sizeof path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 100; i++) fprintf(f, "paragraph %03d line one\r\nline two\r\n\r\n", i);
    fclose(f);
    JobConfig cfg;
    baseConfig(&cfg, DATA_TEXT, path, 32, 2);
    cfg.data.val_fraction = 0.1;
    DataLoader *train = openOk(&cfg, SPLIT_TRAIN), *val = openOk(&cfg, SPLIT_VAL);
    Batch b = batchNew(&cfg);
    getBatch(val, 0, &b);
    /* the val split starts at a paragraph: its first window begins with one */
    char head[16];
    for (int i = 0; i < 10; i++) head[i] = (char)b.tokens[i];
    head[10] = '\0';
    assert_string_equal(head, "paragraph ");
    batchFree(&b);
    dataClose(train);
    dataClose(val);
}

static void test_text_too_small_for_the_split(void **state) {
    Fixture *fx = *state;
    char path[256];
    pathIn(fx, "small.txt", path, sizeof path);
    const char *text = "just one short document without a blank line in it, long enough for train";
    writeFile(path, text, strlen(text));
    JobConfig cfg;
    baseConfig(&cfg, DATA_TEXT, path, 16, 1);
    cfg.data.val_fraction = 0.1;
    expectOpenError(&cfg, SPLIT_TRAIN, "data.val_fraction", "no document boundary");
    cfg.data.val_fraction = 0;
    DataLoader *dl = openOk(&cfg, SPLIT_TRAIN);
    dataClose(dl);
    cfg.train.seq_len = 4096;
    expectOpenError(&cfg, SPLIT_TRAIN, "fewer than train.seq_len + 1", path);
    baseConfig(&cfg, DATA_TEXT, "/nonexistent/corpus.txt", 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "/nonexistent/corpus.txt", "No such file");
}

/* Issue 39, items 6 and 7: data.path /dev/zero (or /dev/urandom) read until
 * memory ran out, a FIFO hung the loader, and a 4-byte file was reported
 * as "6 bytes" (nsad's own document separator counted). */
static void test_odd_data_files_are_refused(void **state) {
    Fixture *fx = *state;
    JobConfig cfg;
    char path[320], fifo[256], sub[256];
    baseConfig(&cfg, DATA_TEXT, "/dev/zero", 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "data.path: /dev/zero: is a character device", "allowed:");
    baseConfig(&cfg, DATA_TEXT, "/dev/urandom", 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "/dev/urandom: is a character device", NULL);
    baseConfig(&cfg, DATA_SHARDS, "/dev/zero", 16, 1);
    cfg.model.vocab_size = 256;
    expectOpenError(&cfg, SPLIT_TRAIN, "data.path: /dev/zero: is a character device", NULL);

    /* a FIFO named like data, alone and inside a directory */
    pathIn(fx, "pipe.txt", fifo, sizeof fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    baseConfig(&cfg, DATA_TEXT, fifo, 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "pipe.txt: is a FIFO", NULL);
    baseConfig(&cfg, DATA_TEXT, fx->dir, 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "pipe.txt: is a FIFO", NULL);
    pathIn(fx, "pipe.bin", path, sizeof path);
    assert_int_equal(mkfifo(path, 0600), 0);
    baseConfig(&cfg, DATA_SHARDS, path, 16, 1);
    cfg.model.vocab_size = 256;
    expectOpenError(&cfg, SPLIT_TRAIN, "pipe.bin: is a FIFO", NULL);
    unlink(fifo);
    unlink(path);

    /* a (sparse) 5 GiB text file is refused by its size, before a byte is read */
    pathIn(fx, "huge.txt", path, sizeof path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), (off_t)5 << 30), 0);
    fclose(f);
    baseConfig(&cfg, DATA_TEXT, path, 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "5368709120 bytes of text; allowed: at most", "shards");
    unlink(path);

    /* the data's own size in messages */
    snprintf(sub, sizeof sub, "%s/tiny", fx->dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    snprintf(path, sizeof path, "%s/four.txt", sub);
    writeFile(path, "abcd", 4);
    baseConfig(&cfg, DATA_TEXT, path, 64, 1);
    cfg.data.val_fraction = 0;
    expectOpenError(&cfg, SPLIT_TRAIN, "four.txt: 4 bytes of text, fewer than train.seq_len + 1 (65)", NULL);
    cfg.data.val_fraction = 0.1;
    expectOpenError(&cfg, SPLIT_TRAIN, "(4 bytes, 1 documents)", NULL);
}

/* The validation split walks its windows in order, wrapping at the end. */
static void test_val_walks_sequentially(void **state) {
    JobConfig cfg;
    idCorpusConfig(&cfg, *state, "ids.txt", 200, 32, 4);
    cfg.data.val_fraction = 0.2;
    DataLoader *val = openOk(&cfg, SPLIT_VAL);
    uint64_t n_windows = (dataNumTokens(val) - 1) / 32;
    Batch b = batchNew(&cfg), c = batchNew(&cfg);
    getBatch(val, 0, &b);
    for (int r = 0; r + 1 < 4; r++)  /* row r + 1 continues row r */
        assert_int_equal(b.tokens[(size_t)(r + 1) * 32], b.targets[(size_t)r * 32 + 31]);
    /* the position after the last window starts over: batch n_windows of 1 row == batch 0 */
    JobConfig one = cfg;
    one.train.batch_size = 1;
    DataLoader *val1 = openOk(&one, SPLIT_VAL);
    Batch x = batchNew(&one), y = batchNew(&one);
    getBatch(val1, 0, &x);
    getBatch(val1, n_windows, &y);
    assert_memory_equal(x.tokens, y.tokens, x.n * sizeof(int32_t));
    assert_memory_equal(x.tokens, b.tokens, x.n * sizeof(int32_t));
    getBatch(val, 1, &c);
    assert_memory_not_equal(b.tokens, c.tokens, b.n * sizeof(int32_t));
    batchFree(&b);
    batchFree(&c);
    batchFree(&x);
    batchFree(&y);
    dataClose(val);
    dataClose(val1);
}

/* data.val_path: validation is that file's text from its first byte, in
 * consecutive windows; training takes all of data.path (no share held out:
 * val_fraction does not apply) and never a byte of the validation file. */
static void test_val_path_is_its_own_split(void **state) {
    const Fixture *fx = *state;
    char train[512], val[512];
    pathIn(fx, "train.txt", train, sizeof train);
    pathIn(fx, "val.txt", val, sizeof val);
    char text[4096];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (char)('a' + i % 26); /* lowercase only */
    writeFile(train, text, sizeof text);
    for (size_t i = 0; i < 1000; i++)
        text[i] = (char)('A' + i % 26); /* uppercase only */
    writeFile(val, text, 1000);
    JobConfig cfg;
    baseConfig(&cfg, DATA_TEXT, train, 32, 4);
    snprintf(cfg.data.val_path, sizeof cfg.data.val_path, "%s", val);
    DataLoader *v = openOk(&cfg, SPLIT_VAL), *t = openOk(&cfg, SPLIT_TRAIN);
    /* the whole of each file (and its document separator): val_fraction 0.05
     * cut nothing off the training text */
    JobConfig whole = cfg;
    whole.data.val_path[0] = '\0';
    whole.data.val_fraction = 0;
    DataLoader *all = openOk(&whole, SPLIT_TRAIN);
    assert_int_equal(dataNumTokens(t), dataNumTokens(all));
    assert_true(dataNumTokens(all) >= 4096 && dataNumTokens(v) >= 1000 && dataNumTokens(v) < 1004);
    dataClose(all);
    Batch b = batchNew(&cfg);
    getBatch(v, 0, &b);
    for (int i = 0; i < 32; i++)
        assert_int_equal(b.tokens[i], 'A' + i % 26);
    for (uint64_t p = 0; p < 8; p++) {
        getBatch(t, p, &b);
        for (size_t i = 0; i < b.n; i++)
            assert_true(b.tokens[i] >= 'a' && b.tokens[i] <= 'z');
    }
    batchFree(&b);
    dataClose(v);
    dataClose(t);
    /* a missing validation file is named */
    snprintf(cfg.data.val_path, sizeof cfg.data.val_path, "%s/none.txt", fx->dir);
    expectOpenError(&cfg, SPLIT_VAL, "none.txt", NULL);
}

static void test_fortunes_corpus(void **state) {
    (void)state;
    struct stat st;
    if (stat(CORPUS, &st) != 0) {
        fprintf(stderr, "# %s not built (scripts/make-corpus.sh): skipped\n", CORPUS);
        skip();
    }
    JobConfig cfg;
    NsaError err = {{0}};
    configDefaults(&cfg);
    assert_int_equal(configLoadFile(&cfg, "configs/tiny-cpu.yaml", &err), 0);
    cfg.data.prefetch = 2;
    DataLoader *train = openOk(&cfg, SPLIT_TRAIN), *val = openOk(&cfg, SPLIT_VAL);
    uint64_t nt = dataNumTokens(train), nv = dataNumTokens(val);
    assert_true(nt + nv <= (uint64_t)st.st_size + 2);
    assert_true(nt + nv > (uint64_t)st.st_size * 99 / 100);
    assert_true((double)nv / (double)(nt + nv) > 0.04 && (double)nv / (double)(nt + nv) < 0.06);
    assert_int_equal(dataVocabSize(train), 256);
    Batch b = batchNew(&cfg);
    size_t letters = 0, total = 0;
    for (uint64_t p = 0; p < 20; p++) {
        getBatch(p % 2 ? val : train, p, &b);
        checkBatchShape(&b, cfg.train.batch_size, cfg.train.seq_len, 256);
        for (size_t i = 0; i < b.n; i++) letters += (b.tokens[i] >= 'a' && b.tokens[i] <= 'z');
        total += b.n;
    }
    assert_true(letters > total / 2);  /* English text, not noise */
    batchFree(&b);
    dataClose(train);
    dataClose(val);
}

/* ---- shards ---------------------------------------------------------------------- */

/* Token j of the shard corpus is j + base: its value names its position. */
static void writeCountingShard(const char *path, uint16_t base, size_t n) {
    uint16_t *t = malloc(n * sizeof *t);
    for (size_t j = 0; j < n; j++) t[j] = (uint16_t)(base + j);
    writeShard(path, 20240520, 1, (int32_t)n, t, n);
    free(t);
}

static void test_shards_split_and_load(void **state) {
    Fixture *fx = *state;
    char dir[256], path[512];
    pathIn(fx, "shards", dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    /* three shards of 4000 tokens: the stream is 0..11999 in order */
    for (int s = 0; s < 3; s++) {
        snprintf(path, sizeof path, "%s/data_%06d.bin", dir, s);
        writeCountingShard(path, (uint16_t)(s * 4000), 4000);
    }
    JobConfig cfg;
    baseConfig(&cfg, DATA_SHARDS, dir, 64, 4);
    cfg.model.vocab_size = 12000;
    cfg.data.val_fraction = 0.1;
    DataLoader *train = openOk(&cfg, SPLIT_TRAIN), *val = openOk(&cfg, SPLIT_VAL);
    assert_int_equal(dataNumTokens(train), 10800);
    assert_int_equal(dataNumTokens(val), 1200);
    assert_int_equal(dataVocabSize(train), 12000);
    assert_true(dataBytesPerToken(train) == 0);
    Batch b = batchNew(&cfg);
    int crossed = 0;
    for (uint64_t p = 0; p < 300; p++) {
        getBatch(train, p, &b);
        for (int r = 0; r < 4; r++) {
            const int32_t *t = b.tokens + r * 64, *y = b.targets + r * 64;
            for (int i = 0; i < 64; i++) {
                assert_true(t[i] < 10800 && y[i] < 10800);  /* never a val token */
                assert_int_equal(y[i], t[i] + 1);          /* contiguous, across shard edges too */
            }
            crossed |= t[0] < 4000 && y[63] >= 4000;
        }
    }
    assert_true(crossed);
    for (uint64_t p = 0; p < 10; p++) {
        getBatch(val, p, &b);
        for (size_t i = 0; i < b.n; i++) assert_true(b.tokens[i] >= 10800 && b.targets[i] < 12000);
    }
    dataClose(train);
    dataClose(val);

    /* a glob works like the directory */
    snprintf(path, sizeof path, "%s/data_*.bin", dir);
    baseConfig(&cfg, DATA_SHARDS, path, 64, 4);
    cfg.model.vocab_size = 12000;
    cfg.data.val_fraction = 0.1;
    train = openOk(&cfg, SPLIT_TRAIN);
    assert_int_equal(dataNumTokens(train), 10800);
    dataClose(train);

    /* llm.c's *_val_* naming picks the validation shards */
    pathIn(fx, "named", dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/fineweb_val_000000.bin", dir);
    writeCountingShard(path, 0, 1000);
    snprintf(path, sizeof path, "%s/fineweb_train_000001.bin", dir);
    writeCountingShard(path, 1000, 5000);
    baseConfig(&cfg, DATA_SHARDS, dir, 64, 4);
    cfg.model.vocab_size = 6000;
    train = openOk(&cfg, SPLIT_TRAIN);
    val = openOk(&cfg, SPLIT_VAL);
    assert_int_equal(dataNumTokens(train), 5000);
    assert_int_equal(dataNumTokens(val), 1000);
    getBatch(train, 3, &b);
    for (size_t i = 0; i < b.n; i++) assert_true(b.tokens[i] >= 1000);
    getBatch(val, 3, &b);
    for (size_t i = 0; i < b.n; i++) assert_true(b.targets[i] < 1000);
    batchFree(&b);
    dataClose(train);
    dataClose(val);

    /* with data.val_path, training takes every shard of data.path, a
     * *_val_* one too: the held-out data is the other source */
    snprintf(path, sizeof path, "%s/fineweb_train_000001.bin", dir);
    snprintf(cfg.data.val_path, sizeof cfg.data.val_path, "%s", path);
    train = openOk(&cfg, SPLIT_TRAIN);
    val = openOk(&cfg, SPLIT_VAL);
    assert_int_equal(dataNumTokens(train), 6000);
    assert_int_equal(dataNumTokens(val), 5000);
    dataClose(train);
    dataClose(val);
}

static void test_corrupt_shards_name_file_and_offset(void **state) {
    Fixture *fx = *state;
    char path[256], want[400];
    pathIn(fx, "bad.bin", path, sizeof path);
    uint16_t tokens[1000];
    for (int i = 0; i < 1000; i++) tokens[i] = (uint16_t)(i % 256);
    JobConfig cfg;
    baseConfig(&cfg, DATA_SHARDS, path, 16, 1);
    cfg.data.val_fraction = 0.1;

    writeShard(path, 20240520, 1, 1000, tokens, 500);  /* truncated: half the tokens */
    snprintf(want, sizeof want, "%s: truncated at offset 2024: the header promises 1000 tokens", path);
    expectOpenError(&cfg, SPLIT_TRAIN, want, "offset 3024");

    writeFile(path, "short", 5);
    snprintf(want, sizeof want, "%s: truncated at offset 5", path);
    expectOpenError(&cfg, SPLIT_TRAIN, want, "header");

    writeShard(path, 12345, 1, 1000, tokens, 1000);
    snprintf(want, sizeof want, "%s: offset 0: magic 12345", path);
    expectOpenError(&cfg, SPLIT_TRAIN, want, "20240520");

    writeShard(path, 20240520, 2, 1000, tokens, 1000);
    snprintf(want, sizeof want, "%s: offset 4: shard version 2", path);
    expectOpenError(&cfg, SPLIT_TRAIN, want, NULL);

    writeShard(path, 20240520, 1, 900, tokens, 1000);
    snprintf(want, sizeof want, "%s: offset 2824: 200 bytes after the last", path);
    expectOpenError(&cfg, SPLIT_TRAIN, want, NULL);

    char dir[256];
    pathIn(fx, "no-shards", dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    baseConfig(&cfg, DATA_SHARDS, dir, 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, dir, "no .bin shards");
    snprintf(want, sizeof want, "%s/*.bin", dir);
    baseConfig(&cfg, DATA_SHARDS, want, 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "the pattern matches no file", NULL);
    baseConfig(&cfg, DATA_SHARDS, "/nonexistent/shard.bin", 16, 1);
    expectOpenError(&cfg, SPLIT_TRAIN, "data.path: /nonexistent/shard.bin", "allowed:");
    baseConfig(&cfg, DATA_SHARDS, path, 16, 1);
    cfg.data.val_fraction = 0.1;

    tokens[700] = 300;  /* >= vocab 256, at byte 1024 + 2 * 700 */
    writeShard(path, 20240520, 1, 1000, tokens, 1000);
    snprintf(want, sizeof want, "%s: offset 2424: token 300 is not below model.vocab_size (256)", path);
    expectOpenError(&cfg, SPLIT_TRAIN, want, NULL);
    cfg.model.vocab_size = 512;
    DataLoader *dl = openOk(&cfg, SPLIT_TRAIN);
    dataClose(dl);
}

/* A shard truncated while a run reads it (rewritten in place, a full disk
 * during a copy): the mapped pages past the new end raise SIGBUS, which
 * must fail the batch with the file's name - direct or prefetched - and
 * not kill the daemon. The guard still works after it has caught one. */
static void test_shard_truncated_during_the_run(void **state) {
    Fixture *fx = *state;
    char path[512];
    pathIn(fx, "live.bin", path, sizeof path);
    writeCountingShard(path, 0, 60000);
    JobConfig cfg;
    baseConfig(&cfg, DATA_SHARDS, path, 64, 4);
    cfg.model.vocab_size = 60000;
    cfg.data.val_fraction = 0.1;
    DataLoader *direct = openOk(&cfg, SPLIT_TRAIN);
    cfg.data.prefetch = 2;
    DataLoader *ahead = openOk(&cfg, SPLIT_TRAIN);
    Batch b = batchNew(&cfg);
    getBatch(direct, 0, &b);
    getBatch(ahead, 0, &b);
    assert_int_equal(truncate(path, 1024), 0);
    for (uint64_t p = 1; p <= 3; p++) {
        NsaError err = {""};
        assert_int_equal(dataBatch(direct, p, b.tokens, b.targets, &err), -1);
        assert_non_null(strstr(err.message, path));
        assert_non_null(strstr(err.message, "shrank"));
    }
    int failed = 0;
    NsaError err = {""};
    for (uint64_t p = 1; p < 64 && !failed; p++) failed = dataBatch(ahead, p, b.tokens, b.targets, &err) != 0;
    assert_true(failed);
    assert_non_null(strstr(err.message, "shrank"));
    batchFree(&b);
    dataClose(direct);
    dataClose(ahead);
}

/* ---- prefetch and resume ------------------------------------------------------- */

/* The prefetch thread serves the batches a direct read computes, through
 * sequential runs, jumps (a resume) and revisits. Before each batch the
 * test waits until the thread has it ready when it lies in the look-ahead
 * (dataPrefetchWait), so which batches come from the ring is fixed: every
 * one that follows its predecessor (0 included: the look-ahead starts
 * there), not the jumps to 1000 and back to 3. */
static void comparePrefetch(const JobConfig *base, DataSplit split) {
    JobConfig direct = *base, ahead = *base;
    direct.data.prefetch = 0;
    ahead.data.prefetch = 4;
    DataLoader *d = openOk(&direct, split), *a = openOk(&ahead, split);
    Batch x = batchNew(base), y = batchNew(base);
    const uint64_t positions[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1000, 1001, 1002, 1003, 1004, 3, 4, 5};
    const size_t n = sizeof positions / sizeof positions[0];
    uint64_t ready = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(dataPrefetchWait(d, positions[i]), 0);  /* no thread */
        int in_ring = dataPrefetchWait(a, positions[i]);
        assert_int_equal(in_ring, i == 0 || positions[i] == positions[i - 1] + 1);
        ready += (uint64_t)in_ring;
        getBatch(d, positions[i], &x);
        getBatch(a, positions[i], &y);
        assert_memory_equal(x.tokens, y.tokens, x.n * sizeof(int32_t));
        assert_memory_equal(x.targets, y.targets, x.n * sizeof(int32_t));
    }
    DataStats sd, sa;
    dataGetStats(d, &sd);
    dataGetStats(a, &sa);
    assert_int_equal(sd.prefetched, 0);
    assert_int_equal(sd.computed, n);
    assert_int_equal(ready, 18);
    assert_int_equal(sa.prefetched, ready);
    assert_int_equal(sa.computed, n - ready);
    batchFree(&x);
    batchFree(&y);
    dataClose(d);
    dataClose(a);
}

static void test_prefetch_matches_direct_reads(void **state) {
    JobConfig cfg;
    baseConfig(&cfg, DATA_SYNTHETIC, NULL, 128, 4);
    comparePrefetch(&cfg, SPLIT_TRAIN);
    idCorpusConfig(&cfg, *state, "ids.txt", 300, 64, 4);
    comparePrefetch(&cfg, SPLIT_TRAIN);
    comparePrefetch(&cfg, SPLIT_VAL);
}

/* A run resumed at position k sees exactly what the uninterrupted run saw. */
static void test_resume_sees_the_same_batches(void **state) {
    JobConfig cfg;
    idCorpusConfig(&cfg, *state, "ids.jsonl", 300, 64, 4);
    cfg.data.prefetch = 3;
    DataLoader *first = openOk(&cfg, SPLIT_TRAIN);
    Batch b = batchNew(&cfg);
    int32_t *seen = malloc(30 * b.n * sizeof(int32_t));
    for (uint64_t p = 0; p < 30; p++) {
        getBatch(first, p, &b);
        memcpy(seen + p * b.n, b.tokens, b.n * sizeof(int32_t));
    }
    dataClose(first);
    DataLoader *resumed = openOk(&cfg, SPLIT_TRAIN);
    for (uint64_t p = 17; p < 30; p++) {
        getBatch(resumed, p, &b);
        assert_memory_equal(seen + p * b.n, b.tokens, b.n * sizeof(int32_t));
    }
    /* and batches differ from step to step */
    assert_memory_not_equal(seen, seen + b.n, b.n * sizeof(int32_t));
    free(seen);
    batchFree(&b);
    dataClose(resumed);
}

/* A test with a fixture directory of its own (setupDir) */
#define DIR_TEST(test) cmocka_unit_test_setup_teardown(test, setupDir, teardownDir)

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_is_a_function_of_seed_and_position),
        DIR_TEST(test_txt_val_never_overlaps_train),
        DIR_TEST(test_jsonl_val_never_overlaps_train),
        DIR_TEST(test_directory_of_text_files),
        DIR_TEST(test_malformed_jsonl_names_file_and_line),
        DIR_TEST(test_jsonl_text_keeps_every_byte),
        DIR_TEST(test_crlf_paragraphs_are_documents),
        DIR_TEST(test_text_too_small_for_the_split),
        DIR_TEST(test_odd_data_files_are_refused),
        DIR_TEST(test_val_walks_sequentially),
        DIR_TEST(test_val_path_is_its_own_split),
        cmocka_unit_test(test_fortunes_corpus),
        DIR_TEST(test_shards_split_and_load),
        DIR_TEST(test_corrupt_shards_name_file_and_offset),
        DIR_TEST(test_shard_truncated_during_the_run),
        DIR_TEST(test_prefetch_matches_direct_reads),
        DIR_TEST(test_resume_sees_the_same_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
