/* cmd_sample.c - `nsad sample CHECKPOINT --prompt TEXT [...]`: generates
 * text from a checkpoint in the foreground (daemon/sampler.c over an
 * nsaDecoder), writing the prompt and then each new token's bytes to stdout
 * as it comes; a summary line (tokens, why it stopped, tokens/s) goes to
 * stderr. With --n N, N continuations of the prompt are decoded together
 * after one prefill and printed one after another, each under a header,
 * once all are done. With --prompt-ids ID,ID,... instead, the prompt and
 * the output are token ids (a line of them): the way to sample a model
 * with no text form, such as one trained on token shards of its own
 * vocabulary. Exit 0 on success, 1 on a failure, 2 on a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "sampler.h"
#include "tokenizer.h"
#include "weights.h"

static void sampleUsage(FILE *out) {
    fprintf(out,
            "usage: nsad sample CHECKPOINT --prompt TEXT [--n N] [--max-tokens N]\n"
            "                   [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
            "                   [--stop TEXT]... [--device cpu|cuda] [--threads N]\n"
            "       nsad sample CHECKPOINT --prompt-ids ID,ID,... [the options but --stop]\n"
            "\n"
            "Generates text from a checkpoint (a checkpoint directory or a run's out_dir) with\n"
            "NSA's decode caches, printing it as it is generated. Defaults: 200 tokens,\n"
            "temperature 0.8 (0 is greedy), top-k off, top-p 0.95, seed 1, the run's device.\n"
            "--stop (up to 4) ends the text when it ends with that string. --n N (1 to 16)\n"
            "decodes N continuations together after one prefill and prints each under a\n"
            "'--- sample I ---' line once all are done. --threads N (1 to 256): the CPU\n"
            "decoder's threads (default: the run's runtime.threads, at most this machine's\n"
            "cores); the text is the same for any count.\n"
            "--prompt-ids: the prompt as 1 to 65536 token ids (commas or spaces between),\n"
            "each below the model's vocabulary; the prompt's and the new tokens' ids are\n"
            "printed, space-separated, as one line. For a model whose tokenizer nsad cannot\n"
            "run (token shards of another vocabulary), ids are its only form.\n");
}

static int writeOut(void *ctx, int prompt, const char *bytes, size_t len) {
    (void)ctx;
    (void)prompt;
    if (fwrite(bytes, 1, len, stdout) != len) return 1;   /* stdout closed: stop */
    fflush(stdout);
    return 0;
}

/* Each continuation's raw bytes (a NUL may be among them, so not a
 * StrBuf), kept until all are done (--n above 1). */
typedef struct Collected {
    char *text[SAMPLE_MAX_PROMPTS];
    size_t len[SAMPLE_MAX_PROMPTS], cap[SAMPLE_MAX_PROMPTS];
} Collected;

static int collectOut(void *ctx, int prompt, const char *bytes, size_t len) {
    Collected *c = ctx;
    if (c->len[prompt] + len > c->cap[prompt]) {
        size_t cap = c->cap[prompt] ? c->cap[prompt] * 2 : 256;
        while (cap < c->len[prompt] + len) cap *= 2;
        char *t = realloc(c->text[prompt], cap);
        if (!t) return 1;   /* out of memory: cancel */
        c->text[prompt] = t;
        c->cap[prompt] = cap;
    }
    memcpy(c->text[prompt] + c->len[prompt], bytes, len);
    c->len[prompt] += len;
    return 0;
}

/* SampleEmitId for stdout (ctx NULL) or a Collected: " ID". */
static int writeId(void *ctx, int prompt, int32_t id) {
    char b[16];
    const int k = snprintf(b, sizeof b, " %d", (int)id);
    return ctx ? collectOut(ctx, prompt, b, (size_t)k) : writeOut(NULL, prompt, b, (size_t)k);
}

/* --prompt-ids' text into a malloc'd array: 1 to SAMPLE_MAX_PROMPT_IDS ids,
 * each 0 to 2^24 - 1, commas or spaces between. Returns the array (*n set),
 * or NULL after printing what was wrong (a usage error). */
static int32_t *parseIds(const char *text, int *n) {
    int32_t *ids = malloc(SAMPLE_MAX_PROMPT_IDS * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "nsad sample: out of memory\n");
        return NULL;
    }
    *n = 0;
    for (const char *p = text;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p) break;
        size_t len = strcspn(p, ", \t\n");
        char one[24];
        long long v;
        snprintf(one, sizeof one, "%.*s", len < sizeof one ? (int)len : (int)sizeof one - 1, p);
        if (*n == SAMPLE_MAX_PROMPT_IDS || len >= sizeof one ||
            flagsParseInt(one, 0, SAMPLE_MAX_TOKEN_ID, &v)) {
            if (*n == SAMPLE_MAX_PROMPT_IDS)
                fprintf(stderr, "nsad sample: --prompt-ids: more than %d ids",
                        SAMPLE_MAX_PROMPT_IDS);
            else
                fprintf(stderr, "nsad sample: --prompt-ids: '%.*s' is not a token id", (int)len, p);
            fprintf(stderr, "; allowed: 1 to %d ids from 0 to %d, commas or spaces between\n",
                    SAMPLE_MAX_PROMPT_IDS, SAMPLE_MAX_TOKEN_ID);
            free(ids);
            return NULL;
        }
        ids[(*n)++] = (int32_t)v;
        p += len;
    }
    if (*n == 0) {
        fprintf(stderr, "nsad sample: --prompt-ids: no ids; allowed: 1 to %d token ids\n",
                SAMPLE_MAX_PROMPT_IDS);
        free(ids);
        return NULL;
    }
    return ids;
}

/* The prompt as printed before its continuation: the text, or its ids. */
static void printPrompt(const char *prompt, const int32_t *ids, int n_ids) {
    if (!ids) fputs(prompt, stdout);
    for (int j = 0; ids && j < n_ids; j++)
        printf("%s%d", j ? " " : "", (int)ids[j]);
}

int cmdSample(int argc, char **argv) {
    const char *spec = NULL, *prompt = NULL, *prompt_ids = NULL, *device = NULL;
    int n = 1;
    long long threads = 0;
    SampleOptions so;
    sampleDefaults(&so);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        long long k;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            sampleUsage(stdout);
            return 0;
        } else if (v && !strcmp(a, "--prompt")) {
            prompt = argv[++i];
        } else if (v && !strcmp(a, "--prompt-ids")) {
            prompt_ids = argv[++i];
        } else if (v && !strcmp(a, "--device")) {
            device = argv[++i];
        } else if (v && !strcmp(a, "--threads")) {
            if (flagsInt("sample", a, argv[++i], 1, 256, &threads)) return EXIT_USAGE;
        } else if (v && !strcmp(a, "--stop")) {
            if (so.n_stops == SAMPLE_MAX_STOPS || strlen(v) < 1 || strlen(v) > SAMPLE_STOP_MAX) {
                fprintf(stderr, "nsad sample: --stop: at most %d strings of 1 to %d bytes\n",
                        SAMPLE_MAX_STOPS, SAMPLE_STOP_MAX);
                return EXIT_USAGE;
            }
            snprintf(so.stops[so.n_stops++], sizeof so.stops[0], "%s", argv[++i]);
        } else if (v && !strcmp(a, "--n")) {
            if (flagsInt("sample", a, argv[++i], 1, SAMPLE_MAX_PROMPTS, &k)) return EXIT_USAGE;
            n = (int)k;
        } else if (v && !strcmp(a, "--max-tokens")) {
            if (flagsInt("sample", a, argv[++i], 1, 1000000, &k)) return EXIT_USAGE;
            so.max_tokens = (int)k;
        } else if (v && !strcmp(a, "--temperature")) {
            if (flagsNumber("sample", a, argv[++i], 0, 1e6, &x)) return EXIT_USAGE;
            so.temperature = x;
        } else if (v && !strcmp(a, "--top-k")) {
            if (flagsInt("sample", a, argv[++i], 0, 1 << 24, &k)) return EXIT_USAGE;
            so.top_k = (int)k;
        } else if (v && !strcmp(a, "--top-p")) {
            if (flagsNumber("sample", a, argv[++i], 1e-9, 1, &x)) return EXIT_USAGE;
            so.top_p = x;
        } else if (v && !strcmp(a, "--seed")) {
            /* 2^53: what a JSON number (the API's seed) holds exactly */
            if (flagsInt("sample", a, argv[++i], 0, 9007199254740992LL, &k)) return EXIT_USAGE;
            so.seed = (uint64_t)k;
        } else if (a[0] == '-') {
            fprintf(stderr, "nsad sample: unknown option or missing value: '%s'\n", a);
            sampleUsage(stderr);
            return EXIT_USAGE;
        } else if (spec) {
            fprintf(stderr, "nsad sample: one CHECKPOINT only (got '%s' and '%s')\n", spec, a);
            return EXIT_USAGE;
        } else {
            spec = a;
        }
    }
    if (!spec || !prompt == !prompt_ids) {
        fprintf(stderr, "nsad sample: %s\n",
                !spec    ? "CHECKPOINT is required"
                : prompt ? "--prompt and --prompt-ids: one of the two, not both"
                         : "--prompt TEXT or --prompt-ids ID,ID,... is required");
        sampleUsage(stderr);
        return EXIT_USAGE;
    }
    if (prompt_ids && so.n_stops) {
        fprintf(stderr, "nsad sample: --stop with --prompt-ids; allowed: --stop with --prompt "
                        "(stop strings need text)\n");
        return EXIT_USAGE;
    }
    if (device && strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "nsad sample: --device '%s'; allowed: cpu or cuda\n", device);
        return EXIT_USAGE;
    }
    int n_ids = 0;
    int32_t *ids = prompt_ids ? parseIds(prompt_ids, &n_ids) : NULL;
    if (prompt_ids && !ids) return EXIT_USAGE;
    NsaError err = {{0}};
    Weights w;
    if (weightsOpen(spec, &w, &err)) {
        fprintf(stderr, "nsad sample: %s\n", err.message);
        free(ids);
        return 1;
    }
    const int V = w.job.model.vocab_size;
    for (int j = 0; j < n_ids; j++)
        if (ids[j] >= V) {
            fprintf(stderr,
                    "nsad sample: --prompt-ids: id %d (the prompt's token %d) is not in the "
                    "model's vocabulary of %d; allowed: ids 0 to %d\n",
                    (int)ids[j], j, V, V - 1);
            free(ids);
            weightsClose(&w);
            return 1;
        }
    const Tokenizer *tok = ids ? NULL : weightsTextTokenizer(&w, &err);
    const NsaDevice dev = device ? (!strcmp(device, "cuda") ? NSA_DEVICE_CUDA : NSA_DEVICE_CPU)
                                 : w.job.runtime.device;
    const size_t context = ids ? (size_t)n_ids : tok ? tokenizerMaxTokens(tok, strlen(prompt)) : 0;
    NsaDecoder *d = NULL;
    int rc = 0;
    if (!ids && !tok) {
        fprintf(stderr, "nsad sample: %s; give the prompt as token ids: --prompt-ids ID,ID,...\n",
                err.message);
        rc = 1;
    } else if (!(d = weightsNewDecoder(&w, dev, 0, n, (int)context + so.max_tokens,
                                       threads > 0 ? (int)threads : weightsCpuThreads(&w), &err))) {
        fprintf(stderr, "nsad sample: %s\n", err.message);
        rc = 1;
    }
    Collected got;
    memset(&got, 0, sizeof got);
    if (rc == 0) {
        if (n == 1) printPrompt(prompt, ids, n_ids);
        fflush(stdout);
        SampleResult res;
        const char *prompts[SAMPLE_MAX_PROMPTS];
        for (int i = 0; i < n; i++) prompts[i] = prompt;   /* one prefill, copied */
        void *ctx = n == 1 ? NULL : &got;
        if (ids ? sampleGenerateIds(d, ids, n_ids, n, &so, writeId, ctx, &res, &err)
                : sampleGenerate(d, tok, prompts, n, &so, n == 1 ? writeOut : collectOut, ctx, &res,
                                 &err)) {
            fprintf(stderr, "\nnsad sample: %s\n", err.message);
            rc = 1;
        } else {
            int total = 0;
            for (int i = 0; i < n; i++) {
                total += res.tokens[i];
                if (n == 1) continue;
                printf("%s--- sample %d (%d tokens, %s) ---\n", i && !ids ? "\n" : "", i,
                       res.tokens[i], sampleStopName(res.stop[i]));
                printPrompt(prompt, ids, n_ids);
                if (got.len[i]) fwrite(got.text[i], 1, got.len[i], stdout);
                if (ids) putchar('\n');
            }
            if (ids && n == 1) putchar('\n'); /* a line of ids */
            fflush(stdout);
            const double gen = res.seconds - res.prefill_seconds;
            fprintf(stderr, "%s[%s%d tokens, %s; %.1f tokens/s on %s; step %lld of %s]\n",
                    ids ? "" : "\n", n > 1 ? "samples together: " : "", total,
                    n > 1 ? "each stopped as above" : sampleStopName(res.stop[0]),
                    gen > 0 ? total / gen : 0.0, dev == NSA_DEVICE_CUDA ? "cuda" : "cpu",
                    (long long)w.state.step, w.dir);
        }
    }
    for (int i = 0; i < SAMPLE_MAX_PROMPTS; i++) free(got.text[i]);
    free(ids);
    nsaDecoderFree(d);
    weightsClose(&w);
    return rc;
}
