/* sampler.c - see sampler.h. */
#include "sampler.h"
#include "clockutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nsa_rng.h"

void sampleDefaults(SampleOptions *o) {
    memset(o, 0, sizeof *o);
    o->temperature = 0.8;
    o->top_k = 0;
    o->top_p = 0.95;
    o->seed = 1;
    o->max_tokens = 200;
}

int sampleValidate(const SampleOptions *o, NsaError *err) {
    if (!isfinite(o->temperature) || o->temperature < 0)
        return nsaErrorf(err, "temperature: %g; allowed: a finite number >= 0 (0 is greedy)",
                         o->temperature);
    if (o->top_k < 0) return nsaErrorf(err, "top_k: %d; allowed: 0 (off) or more", o->top_k);
    if (!(o->top_p > 0 && o->top_p <= 1))
        return nsaErrorf(err, "top_p: %g; allowed: above 0 up to 1 (1 is off)", o->top_p);
    if (o->max_tokens < 1 || o->max_tokens > 1000000)
        return nsaErrorf(err, "max_tokens: %d; allowed: 1 to 1000000", o->max_tokens);
    if (o->n_stops < 0 || o->n_stops > SAMPLE_MAX_STOPS)
        return nsaErrorf(err, "stop: %d strings; allowed: at most %d", o->n_stops, SAMPLE_MAX_STOPS);
    for (int i = 0; i < o->n_stops; i++) {
        size_t n = strlen(o->stops[i]);
        if (n < 1 || n > SAMPLE_STOP_MAX)
            return nsaErrorf(err, "stop[%d]: %zu bytes; allowed: 1 to %d", i, n, SAMPLE_STOP_MAX);
    }
    return 0;
}

const char *sampleStopName(SampleStop s) {
    return s == SAMPLE_STOP_STRING ? "stop" : s == SAMPLE_STOP_CANCEL ? "cancelled" : "max_tokens";
}

/* ---- one token ------------------------------------------------------------------ */

size_t sampleScratchBytes(int V) { return (size_t)V * (sizeof(double) + sizeof(int)); }

/* Best first: logit descending, ties by id ascending. */
static int byLogit(const void *a, const void *b, void *ctx) {
    const float *z = ctx;
    const int i = *(const int *)a, j = *(const int *)b;
    if (z[i] != z[j]) return z[i] > z[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int samplePick(const float *logits, int V, const SampleOptions *o, double u, void *scratch) {
    for (int v = 0; v < V; v++) /* no order, no distribution: the model broke */
        if (!isfinite(logits[v])) return -1;
    if (o->temperature == 0) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        return best;
    }
    double *p = scratch;
    int *ids = (int *)(p + V);
    for (int v = 0; v < V; v++) ids[v] = v;
    qsort_r(ids, (size_t)V, sizeof *ids, byLogit, (void *)logits);
    int n = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    const double zmax = logits[ids[0]];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += p[i] = exp(((double)logits[ids[i]] - zmax) / o->temperature);
    if (o->top_p < 1) {
        double cum = 0;
        int keep = 0;
        while (keep < n && (keep == 0 || cum < o->top_p * sum)) cum += p[keep++];
        n = keep;
        sum = cum;
    }
    double target = u * sum, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += p[i];
        if (target < cum) return ids[i];
    }
    return ids[n - 1];
}

/* ---- UTF-8 ------------------------------------------------------------------------ */

/* Length of the sequence a lead byte starts (1 for an invalid lead). */
static size_t utf8Len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 1;
}

size_t sampleUtf8Complete(const char *buf, size_t len) {
    size_t i = 0;
    while (i < len) {
        size_t n = utf8Len((unsigned char)buf[i]);
        if (n == 1) {
            i++;
            continue;
        }
        size_t k = 1;
        while (k < n && i + k < len && ((unsigned char)buf[i + k] & 0xC0) == 0x80) k++;
        if (k < n && i + k == len) return i;   /* incomplete at the end: hold it back */
        i += k;                                 /* whole, or invalid (ends early) */
    }
    return len;
}

/* Bytes of the valid sequence at s[0..len), or 0 when none starts there. */
static size_t utf8Valid(const unsigned char *s, size_t len) {
    const unsigned char c = s[0];
    if (c >= 0x01 && c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;   /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) n = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEF) n = 3, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c == 0xF0) n = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF4) n = 4, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (len < n || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < n; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return n;
}

char *sampleUtf8Clean(const char *buf, size_t len) {
    char *out = malloc(3 * len + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8Valid((const unsigned char *)buf + i, len - i);
        if (n) {
            memcpy(out + o, buf + i, n);
            o += n;
            i += n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}

/* ---- generation ------------------------------------------------------------------- */

/* Per prompt: its RNG, the tail of its text (for the stop strings), state. */
typedef struct Gen {
    NsaRng rng;
    char tail[SAMPLE_STOP_MAX];
    size_t tail_len;
    int done;
} Gen;

static int endsWithStop(Gen *g, const SampleOptions *o, const char *bytes, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (g->tail_len == sizeof g->tail) {
            memmove(g->tail, g->tail + 1, sizeof g->tail - 1);
            g->tail_len--;
        }
        g->tail[g->tail_len++] = bytes[i];
    }
    for (int s = 0; s < o->n_stops; s++) {
        size_t n = strlen(o->stops[s]);
        if (n <= g->tail_len && !memcmp(g->tail + g->tail_len - n, o->stops[s], n)) return 1;
    }
    return 0;
}

/* What a generation emits: text (tok, emit; stop strings apply) or, with
 * tok NULL, token ids (emit_id). */
typedef struct Out {
    const Tokenizer *tok;
    SampleEmit emit;
    SampleEmitId emit_id;
    void *ctx;
} Out;

/* The generation of n encoded prompts (ids[i][0..len[i])); see
 * sampleGenerate. o is valid and n fits the decoder. */
static int generate(NsaDecoder *d, const int32_t *const *ids, const size_t *len, int n,
                    const SampleOptions *o, const Out *out, SampleResult *res, NsaError *err) {
    const NsaDecoderOptions *dopt = nsaDecoderGetOptions(d);
    const int V = nsaDecoderGetConfig(d)->vocab_size;
    const double t0 = clockMonotonicSeconds();
    float *logits = malloc((size_t)n * V * sizeof(float));
    void *scratch = malloc(sampleScratchBytes(V));
    Gen *gen = calloc((size_t)n, sizeof *gen);
    int32_t *next = calloc((size_t)n, sizeof *next);
    int rc = 0;
    if (!logits || !scratch || !gen || !next) rc = nsaErrorf(err, "sample: out of memory");
    /* prefill every prompt into its slot; a prompt equal to an earlier one
     * takes a copy of that slot (one prefill for several samples of it) */
    for (int i = 0; rc == 0 && i < n; i++) {
        nsaRngSeed(&gen[i].rng, o->seed, (uint64_t)i);
        int same = -1;
        for (int j = 0; j < i && same < 0; j++)
            if (len[j] == len[i] && !memcmp(ids[j], ids[i], len[i] * sizeof(int32_t))) same = j;
        if (same >= 0) {
            if (nsaDecoderCopySlot(d, i, same, err)) rc = -1;
            memcpy(logits + (size_t)i * V, logits + (size_t)same * V, (size_t)V * sizeof(float));
            continue;
        }
        if (len[i] == 0)
            rc = nsaErrorf(err, "sample: prompt %d is empty; allowed: at least one token", i);
        else if ((int64_t)len[i] + o->max_tokens > dopt->max_context)
            rc = nsaErrorf(err,
                           "sample: prompt %d (%zu tokens) + max_tokens (%d) exceeds the "
                           "context (%d)",
                           i, len[i], o->max_tokens, dopt->max_context);
        else if (nsaDecoderReset(d, i, err) ||
                 nsaDecoderPrefill(d, i, ids[i], (int)len[i], logits + (size_t)i * V, err))
            rc = -1;
    }
    res->prefill_seconds = clockMonotonicSeconds() - t0;
    /* then all together: pick, emit, step */
    int live = n;
    for (int step = 0; rc == 0 && live > 0; step++) {
        for (int i = 0; i < n; i++) {
            if (gen[i].done) continue;
            const double u = nsaRngUniform(&gen[i].rng);
            next[i] = samplePick(logits + (size_t)i * V, V, o, u, scratch);
            if (next[i] < 0) {
                rc = nsaErrorf(err, "sample %d, token %d: the model's logits are not finite "
                                    "(NaN or infinity): nothing to sample from",
                               i, res->tokens[i] + 1);
                live = 0;
                break;
            }
            char bytes[8];
            int32_t id = next[i];
            size_t blen = 0;
            if (out->tok) {
                blen = tokenizerDecode(out->tok, &id, 1, bytes, sizeof bytes);
                if (blen >= sizeof bytes) blen = sizeof bytes - 1;
            }
            res->tokens[i]++;
            const int cancel = out->tok ? out->emit && out->emit(out->ctx, i, bytes, blen)
                                        : out->emit_id && out->emit_id(out->ctx, i, id);
            if (cancel) {
                for (int k = 0; k < n; k++)
                    if (!gen[k].done) res->stop[k] = SAMPLE_STOP_CANCEL, gen[k].done = 1;
                live = 0;
                break;
            }
            if (out->tok && endsWithStop(&gen[i], o, bytes, blen)) {
                gen[i].done = 1;
                res->stop[i] = SAMPLE_STOP_STRING;
                live--;
            } else if (res->tokens[i] >= o->max_tokens) {
                gen[i].done = 1;
                res->stop[i] = SAMPLE_STOP_TOKENS;
                live--;
            }
        }
        /* a finished slot steps along with its last token; its logits are unused */
        if (live > 0 && nsaDecoderStep(d, n, next, logits, err)) rc = -1;
    }
    res->seconds = clockMonotonicSeconds() - t0;
    free(logits);
    free(scratch);
    free(gen);
    free(next);
    return rc;
}

/* The checks both entries share: o, and n against the decoder. */
static int checkRequest(NsaDecoder *d, int n, const SampleOptions *o, NsaError *err) {
    const NsaDecoderOptions *dopt = nsaDecoderGetOptions(d);
    if (sampleValidate(o, err)) return -1;
    if (n < 1 || n > SAMPLE_MAX_PROMPTS || n > dopt->max_batch)
        return nsaErrorf(err, "sample: %d prompts; allowed: 1 to %d", n,
                         dopt->max_batch < SAMPLE_MAX_PROMPTS ? dopt->max_batch
                                                              : SAMPLE_MAX_PROMPTS);
    return 0;
}

int sampleGenerate(NsaDecoder *d, const Tokenizer *tok, const char *const *prompts, int n,
                   const SampleOptions *o, SampleEmit emit, void *ctx, SampleResult *res,
                   NsaError *err) {
    memset(res, 0, sizeof *res);
    const int V = nsaDecoderGetConfig(d)->vocab_size;
    if (checkRequest(d, n, o, err)) return -1;
    if (tok->vocab_size > V)
        return nsaErrorf(err,
                         "sample: the %s tokenizer's %d ids do not fit the model's vocabulary (%d)",
                         tok->name, tok->vocab_size, V);
    int32_t *ids[SAMPLE_MAX_PROMPTS] = {0};
    size_t len[SAMPLE_MAX_PROMPTS] = {0};
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        const size_t bytes = strlen(prompts[i]);
        uint16_t *ids16 = malloc((tokenizerMaxTokens(tok, bytes) + 1) * sizeof(uint16_t));
        ids[i] = malloc((tokenizerMaxTokens(tok, bytes) + 1) * sizeof(int32_t));
        if (!ids16 || !ids[i])
            rc = nsaErrorf(err, "sample: out of memory for a prompt of %zu bytes", bytes);
        else
            len[i] = tokenizerEncode(tok, (const uint8_t *)prompts[i], bytes, ids16);
        for (size_t j = 0; j < len[i]; j++)
            ids[i][j] = ids16[j];
        free(ids16);
    }
    const Out out = {.tok = tok, .emit = emit, .ctx = ctx};
    if (rc == 0) rc = generate(d, (const int32_t *const *)ids, len, n, o, &out, res, err);
    for (int i = 0; i < n; i++)
        free(ids[i]);
    return rc;
}

int sampleGenerateIds(NsaDecoder *d, const int32_t *ids, int n_ids, int n, const SampleOptions *o,
                      SampleEmitId emit, void *ctx, SampleResult *res, NsaError *err) {
    memset(res, 0, sizeof *res);
    const int V = nsaDecoderGetConfig(d)->vocab_size;
    if (checkRequest(d, n, o, err)) return -1;
    if (o->n_stops > 0)
        return nsaErrorf(err,
                         "sample: %d stop strings with a prompt of token ids; allowed: none "
                         "(stop strings need text)",
                         o->n_stops);
    if (n_ids < 1)
        return nsaErrorf(err, "sample: the prompt is empty; allowed: at least one token id");
    for (int j = 0; j < n_ids; j++)
        if (ids[j] < 0 || ids[j] >= V)
            return nsaErrorf(err,
                             "sample: prompt token %d is id %d; allowed: 0 to %d (the model's "
                             "vocabulary is %d)",
                             j, (int)ids[j], V - 1, V);
    const int32_t *all[SAMPLE_MAX_PROMPTS];
    size_t len[SAMPLE_MAX_PROMPTS];
    for (int i = 0; i < n; i++) {
        all[i] = ids; /* one prefill, copied into every slot */
        len[i] = (size_t)n_ids;
    }
    const Out out = {.emit_id = emit, .ctx = ctx};
    return generate(d, all, len, n, o, &out, res, err);
}
