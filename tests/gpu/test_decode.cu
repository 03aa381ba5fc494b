/* test_decode.cu - the CUDA decoder (kernels/cuda/decode/) against the
 * CPU reference decoder (kernels/cpu/decode.c, itself checked against the
 * full forward by tests/unit/test_decode.c), on the GPU machine.
 *
 *   select    the selection kernel alone on random compressed scores: the
 *             chosen set holds the forced blocks and is a valid top-n (no
 *             unchosen complete block scores above a chosen one by more
 *             than rounding), ascending, -1 padded, equal to the CPU rule
 *             wherever no near-tie exists; up to 4096 selection blocks
 *   gemv      the matrix-vector products alone against a double reference:
 *             every mode, with and without the RMSNorm, 1 to 256 rows
 *   decode    whole models, bf16 decoder vs the fp32 CPU decoder holding the
 *             same bf16-rounded weights: several slots at different
 *             positions, prompts through Prefill (passes of up to
 *             DEC_PREFILL_ROWS = 256 positions of a slot, so prompts of
 *             256, 257 and 530 tokens cross pass, block and window edges),
 *             then batched Steps, every
 *             logit row compared (||gpu - cpu|| / ||cpu|| <= 2e-2, NaN never
 *             passes; outputs poisoned first), across many compressed,
 *             selection and window boundaries. Where n_sel leaves a choice,
 *             the compressed keys are zero, so every interior block scores
 *             alike on both devices and the tie rule (lower block first)
 *             decides - a discrete choice rounding cannot flip; with random
 *             compressed keys n_sel covers every block.
 *   graph     a step replayed from its CUDA graph gives the same logits as
 *             the first (a decoder reset and run again, bit-identical).
 *   copy slot one prompt prefilled and copied into the other slots, then
 *             steps: against the CPU decoder's copies, and a slot repeating
 *             the source's tokens bit-identical to it.
 *   prompt    the prompt pass (a prompt of more than 512 positions into an
 *             empty slot: GEMMs and the fast NSA op) against the passes on
 *             the same decoder, where the selection has no choice, at 600
 *             and 9,500 positions; and which prefill path each case's
 *             decoder reports.
 * Prints TAP lines, a table and "N passed, N failed"; exits 1 on failure.
 * Run on the GPU machine: make -C tests/gpu decode-test. */
#include "gpu_util.h"

#include "cuda/decode/decode_ops.h"
extern "C" {
#include "nsa_layout.h"
}

#include <vector>

static Results g_res;

static float roundBf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

/* ---- the selection kernel alone -------------------------------------------------- */

/* CPU rule on the same scores: returns the chosen blocks ascending. */
static std::vector<int> cpuSelect(const std::vector<double> &score, int t, int l_sel, int n_sel) {
    const int Ns = t / l_sel + 1, current = t / l_sel, n_complete = (t + 1) / l_sel;
    std::vector<char> taken(Ns, 0);
    int count = 0;
    const int forced[3] = {0, current, current - 1};
    for (int f = 0; f < 3; f++)
        if (forced[f] >= 0 && !taken[forced[f]]) taken[forced[f]] = 1, count++;
    while (count < n_sel) {
        int best = -1;
        for (int j = 0; j < n_complete; j++)
            if (!taken[j] && (best < 0 || score[j] > score[best])) best = j;
        if (best < 0) break;
        taken[best] = 1;
        count++;
    }
    std::vector<int> out;
    for (int j = 0; j < Ns; j++)
        if (taken[j]) out.push_back(j);
    return out;
}

/* ties: every compressed score 0, so the blocks inside the context tie
 * exactly and the rule (lower block first) alone decides; the GPU set must
 * then be the CPU's. */
static void testSelect(int t, int l, int d, int l_sel, int n_sel, int hpg, uint64_t seed,
                       bool ties = false) {
    const double t0 = nowSeconds();
    DecDims dm = {};
    dm.B = 1; dm.G = 1; dm.H = hpg; dm.dk = 8; dm.dv = 8;
    dm.T = t + 1; dm.W = 1; dm.l = l; dm.d = d; dm.l_sel = l_sel; dm.n_sel = n_sel;
    dm.slots = n_sel < 3 ? 3 : n_sel; dm.window = 1;
    dm.Nc = nsaNumCmpBlocks(t + 1, l, d);
    dm.n_chunks = (dm.Nc + DEC_CMP_CHUNK - 1) / DEC_CMP_CHUNK;
    decSelectDims(&dm);
    const int n_vis = dm.Nc;
    /* one chunk holds the softmax normaliser: lse = 0, so p_i = exp(score_i) */
    std::vector<float> m(hpg * dm.n_chunks, -INFINITY), lsum(hpg * dm.n_chunks, 0.0f);
    std::vector<float> o((size_t)hpg * dm.n_chunks * dm.dv, 0.0f);
    for (int h = 0; h < hpg; h++) m[h * dm.n_chunks] = 0.0f, lsum[h * dm.n_chunks] = 1.0f;
    std::vector<float> sc((size_t)hpg * dm.Nc);
    if (ties)
        std::fill(sc.begin(), sc.end(), 0.0f);
    else
        fillUniform(sc.data(), sc.size(), seed, 1, -6.0f, 0.0f);
    int hslot[1] = {0}, hpos[1] = {t};
    int *stage = (int *)devAlloc(sizeof hslot), *pos = (int *)devAlloc(sizeof hpos);
    GPU_OK(cudaMemcpy(stage, hslot, sizeof hslot, cudaMemcpyHostToDevice));
    GPU_OK(cudaMemcpy(pos, hpos, sizeof hpos, cudaMemcpyHostToDevice));
    DecScratch s = {};
    s.row_slot = stage;
    s.row_pos = pos;
    s.cmp_m = devFrom(m.data(), m.size());
    s.cmp_l = devFrom(lsum.data(), lsum.size());
    s.cmp_o = devFrom(o.data(), o.size());
    s.cmp_scores = devFrom(sc.data(), sc.size());
    s.sel_cand = (int2 *)devAlloc((size_t)dm.G * dm.sel_chunks * dm.cand_stride * sizeof(int2));
    s.sel = (int *)devAlloc((size_t)dm.slots * sizeof(int));
    NsaError err = {{0}};
    const DecLaunch plain = {0, 0};
    const int rc = decAttnPrepare(&dm, &err) || decSelect(&dm, &s, &plain, &err);
    std::vector<int> sel(dm.slots);
    toHost(sel.data(), s.sel, sel.size() * sizeof(int));

    /* reference scores in double */
    const int Ns = t / l_sel + 1, n_complete = (t + 1) / l_sel;
    std::vector<double> score(Ns, 0.0);
    for (int h = 0; h < hpg; h++)
        for (int i = 0; i < n_vis; i++) {
            const double p = exp((double)sc[(size_t)h * dm.Nc + i]);
            const int first = i * d, end = i * d + l;
            for (int j = first / l_sel; j <= (end - 1) / l_sel && j < Ns; j++) {
                const int lo = first > j * l_sel ? first : j * l_sel;
                const int hi = end < (j + 1) * l_sel ? end : (j + 1) * l_sel;
                score[j] += (double)(hi - lo) / l * p;
            }
        }
    const std::vector<int> want = cpuSelect(score, t, l_sel, n_sel);
    /* the GPU set: ascending, padded, forced blocks in, a valid top-n */
    bool ok = rc == 0, exact = true;
    std::vector<char> chosen(Ns, 0);
    int k = 0;
    for (; k < dm.slots && sel[k] >= 0; k++) {
        ok = ok && sel[k] < Ns && (k == 0 || sel[k] > sel[k - 1]);
        if (sel[k] >= 0 && sel[k] < Ns) chosen[sel[k]] = 1;
    }
    for (int r = k; r < dm.slots; r++) ok = ok && sel[r] == -1;
    ok = ok && k == (int)want.size();
    const int current = t / l_sel;
    ok = ok && chosen[0] && chosen[current] && (current == 0 || chosen[current - 1]);
    double worst_gap = 0.0;
    for (int a = 0; a < n_complete; a++)
        for (int b = 0; b < n_complete; b++) {
            const bool fa = a == 0 || a == current || a == current - 1;
            if (chosen[a] && !fa && !chosen[b]) {
                const double gap = (score[b] - score[a]) / (score[a] > 1e-30 ? score[a] : 1e-30);
                if (gap > worst_gap) worst_gap = gap;
            }
        }
    ok = ok && worst_gap <= 1e-4;   /* a swap only across a tie up to fp32 rounding */
    for (size_t r = 0; r < want.size() && r < (size_t)k; r++) exact = exact && sel[r] == want[r];
    if (ties) ok = ok && exact;
    report(&g_res, ok, nowSeconds() - t0, "select kernel",
           "t %d l %d d %d l' %d n %d hpg %d%s: %d blocks, %s, worst swap gap %.1e%s", t, l,
           d, l_sel, n_sel, hpg, ties ? " (exact ties)" : "", k,
           exact ? "same set as the CPU" : "differs at a near-tie", worst_gap,
           rc ? err.message : "");
    cudaFree(stage); cudaFree(pos); cudaFree((void *)s.cmp_m); cudaFree((void *)s.cmp_l);
    cudaFree((void *)s.cmp_o); cudaFree((void *)s.cmp_scores); cudaFree(s.sel_cand); cudaFree(s.sel);
}

/* ---- the matrix-vector products alone --------------------------------------------- */

static std::vector<uint16_t> toBf16Bits(const std::vector<float> &f) {
    std::vector<uint16_t> u(f.size());
    for (size_t i = 0; i < f.size(); i++) {
        uint32_t v;
        memcpy(&v, &f[i], 4);
        u[i] = (uint16_t)(v >> 16);   /* f already bf16-rounded */
    }
    return u;
}

static float bf16BitsToFloat(uint16_t h) {
    const uint32_t v = (uint32_t)h << 16;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* decGemv at B rows against a double reference on the same bf16 weights:
 * every mode, with and without the on-the-fly RMSNorm, N and K off the
 * tile sizes, B across the CUDA-core / tensor-core forms and their tiles. */
static void testGemv(int N, int K, int B, DecGemvMode mode, bool norm, uint64_t seed) {
    const double t0 = nowSeconds();
    const int rows_w = mode == DEC_SWIGLU ? 2 * N : N;
    std::vector<float> w((size_t)rows_w * K), x((size_t)B * K), nw(K), base((size_t)B * N);
    fillUniform(w.data(), w.size(), seed, 1, -1.0f, 1.0f);
    fillUniform(x.data(), x.size(), seed, 2, -2.0f, 2.0f);
    fillUniform(nw.data(), nw.size(), seed, 3, 0.5f, 1.5f);
    fillUniform(base.data(), base.size(), seed, 4, -1.0f, 1.0f);
    for (float &v : w) v = roundBf16(v);
    if (!norm)
        for (float &v : x) v = roundBf16(v);
    /* reference in double */
    std::vector<double> want((size_t)B * N);
    for (int b = 0; b < B; b++) {
        double rs = 1.0;
        if (norm) {
            double ss = 0.0;
            for (int k = 0; k < K; k++) ss += (double)x[(size_t)b * K + k] * x[(size_t)b * K + k];
            rs = 1.0 / sqrt(ss / K + 1e-5);
        }
        for (int n = 0; n < N; n++) {
            double s0 = 0.0, s1 = 0.0;
            for (int k = 0; k < K; k++) {
                const double in = norm ? x[(size_t)b * K + k] * rs * nw[k] : x[(size_t)b * K + k];
                s0 += in * w[(size_t)n * K + k];
                if (mode == DEC_SWIGLU) s1 += in * w[(size_t)(N + n) * K + k];
            }
            const double silu0 = s0 / (1.0 + exp(-s0));
            double v = s0;
            if (mode == DEC_ADD) v = base[(size_t)b * N + n] + s0;
            else if (mode == DEC_SILU) v = silu0;
            else if (mode == DEC_SWIGLU) v = silu0 * s1;
            want[(size_t)b * N + n] = v;
        }
    }
    const std::vector<uint16_t> wb = toBf16Bits(w), xbits = toBf16Bits(x);
    DecGemv g = {};
    g.N = N; g.K = K; g.B = B; g.eps = 1e-5f;
    bf16 *dw = (bf16 *)devAlloc(wb.size() * 2);
    GPU_OK(cudaMemcpy(dw, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice));
    g.w = dw;
    float *dx = NULL, *dnw = NULL;
    bf16 *dxb = NULL;
    if (norm) {
        dx = devFrom(x.data(), x.size());
        dnw = devFrom(nw.data(), nw.size());
        g.x = dx; g.norm_w = dnw;
    } else {
        dxb = (bf16 *)devAlloc(xbits.size() * 2);
        GPU_OK(cudaMemcpy(dxb, xbits.data(), xbits.size() * 2, cudaMemcpyHostToDevice));
        g.xb = dxb;
    }
    const bool bf16_out = mode == DEC_SILU || mode == DEC_SWIGLU;
    float *dout = mode == DEC_ADD ? devFrom(base.data(), base.size())
                                  : (float *)devAlloc((size_t)B * N * sizeof(float));
    bf16 *doutb = (bf16 *)devAlloc((size_t)B * N * 2);   /* poisoned: NaN bf16 */
    g.out = dout; g.outb = doutb;
    NsaError err = {{0}};
    const DecLaunch plain = {0, 0};
    const int rc = decGemv(&g, mode, &plain, &err);
    std::vector<float> got((size_t)B * N);
    if (bf16_out) {
        std::vector<uint16_t> h((size_t)B * N);
        toHost(h.data(), doutb, h.size() * 2);
        for (size_t i = 0; i < h.size(); i++) got[i] = bf16BitsToFloat(h[i]);
    } else {
        toHost(got.data(), dout, got.size() * sizeof(float));
    }
    const double e = relErrD(got.data(), want.data(), got.size());
    const char *names[] = {"store", "add", "silu", "swiglu"};
    report(&g_res, rc == 0 && e <= 1e-2, nowSeconds() - t0, "gemv",
           "N %d K %d B %d %s%s: rel err %.2e (tol 1e-2)%s%s", N, K, B, names[mode],
           norm ? " +rmsnorm" : "", e, rc ? ": " : "", rc ? err.message : "");
    cudaFree(dw); cudaFree(dx); cudaFree(dnw); cudaFree(dxb); cudaFree(dout); cudaFree(doutb);
}

/* ---- whole models ----------------------------------------------------------------- */

typedef struct Case {
    const char *name;
    NsaModelConfig cfg;
    int slots, context;
    int prompt[16];    /* per slot */
    int zero_cmp_keys; /* wk_cmp = 0: the selection decided by the tie rule */
    int prompt_pass;   /* the CUDA decoder has the prompt pass */
    uint64_t seed;
} Case;

static NsaModelConfig smallConfig(void) {
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    c.vocab_size = 64;
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_groups = 2;
    c.d_k = 16;
    c.d_v = 16;
    c.mlp_hidden = 128;
    c.cmp_len = 8;
    c.cmp_stride = 4;
    c.sel_len = 16;
    c.n_sel = 64;
    c.window = 24;
    return c;
}

static NsaDecoder *makeDecoder(const NsaModelConfig *cfg, NsaDevice dev, int slots, int context) {
    NsaDecoderOptions o = {};
    o.device = dev;
    o.precision = dev == NSA_DEVICE_CUDA ? NSA_PREC_BF16 : NSA_PREC_F32;
    o.max_batch = slots;
    o.max_context = context;
    NsaError err = {{0}};
    NsaDecoder *d = nsaDecoderCreate(cfg, &o, &err);
    if (!d) {
        fprintf(stderr, "FATAL nsaDecoderCreate (%s): %s\n", dev == NSA_DEVICE_CUDA ? "cuda" : "cpu",
                err.message);
        exit(2);
    }
    return d;
}

/* Random weights, rounded to bf16, into both decoders (norms near 1). */
static void setWeights(NsaDecoder *cpu, NsaDecoder *gpu, const Case *k) {
    NsaError err = {{0}};
    for (int i = 0; i < nsaDecoderNumTensors(cpu); i++) {
        const NsaTensorInfo *ti = nsaDecoderTensorInfo(cpu, i);
        std::vector<float> w(ti->numel);
        const double bound = ti->ndim == 1 ? 0.2 : 1.5 / sqrt((double)ti->shape[ti->ndim - 1]);
        fillUniform(w.data(), w.size(), k->seed, 100 + i, (float)-bound, (float)bound);
        if (ti->ndim == 1)
            for (float &v : w) v += 1.0f;
        if (k->zero_cmp_keys && strstr(ti->name, ".wk_cmp"))
            for (float &v : w) v = 0.0f;
        for (float &v : w) v = roundBf16(v);
        if (nsaDecoderSetTensor(cpu, i, w.data(), &err) || nsaDecoderSetTensor(gpu, i, w.data(), &err)) {
            fprintf(stderr, "FATAL SetTensor %s: %s\n", ti->name, err.message);
            exit(2);
        }
    }
}

/* Prefill on the CUDA decoder. With zero compressed keys every interior
 * block scores alike and the tie rule (lower block first) decides the
 * selection; the decode kernels and the CPU decoder compute those equal
 * scores exactly alike, but the prompt pass's fast op sums them in another
 * order, so they round apart and the rounding decides. Such cases fill
 * through the passes: the first token alone, then the rest into a slot
 * that is no longer empty. */
static int gpuPrefill(const Case *k, NsaDecoder *gpu, int slot, const int32_t *tokens, int n,
                      float *logits, NsaError *err) {
    if (!k->zero_cmp_keys || n < 2) return nsaDecoderPrefill(gpu, slot, tokens, n, logits, err);
    if (nsaDecoderPrefill(gpu, slot, tokens, 1, NULL, err)) return -1;
    return nsaDecoderPrefill(gpu, slot, tokens + 1, n - 1, logits, err);
}

/* One prompt prefilled in slot 0 and copied into every other slot (both
 * decoders), then 24 steps: the last slot repeats slot 0's tokens and must
 * give its logits bit for bit, the others go on with their own tokens;
 * every row against the CPU decoder (whose copy test/unit/test_decode.c
 * checks against the full forward). */
static void testCopySlot(const Case *k, NsaDecoder *cpu, NsaDecoder *gpu,
                         const std::vector<int32_t> &tokens) {
    const double t0 = nowSeconds();
    const int V = k->cfg.vocab_size, S = k->slots, T = k->context, P = T - 24;
    NsaError err = {{0}};
    bool ok = !nsaDecoderReset(cpu, -1, &err) && !nsaDecoderReset(gpu, -1, &err) &&
              !nsaDecoderPrefill(cpu, 0, tokens.data(), P, NULL, &err) &&
              !gpuPrefill(k, gpu, 0, tokens.data(), P, NULL, &err);
    for (int s = 1; s < S && ok; s++)
        ok = !nsaDecoderCopySlot(cpu, s, 0, &err) && !nsaDecoderCopySlot(gpu, s, 0, &err) &&
             nsaDecoderPosition(gpu, s) == P;
    std::vector<float> lc((size_t)S * V), lg((size_t)S * V);
    std::vector<int32_t> step(S);
    double worst = 0.0;
    bool same = true;
    for (int n = 0; ok && P + n < T; n++) {
        for (int s = 0; s < S; s++) step[s] = tokens[(size_t)(s == S - 1 ? 0 : s) * T + P + n];
        std::fill(lg.begin(), lg.end(), NAN);
        ok = !nsaDecoderStep(cpu, S, step.data(), lc.data(), &err) &&
             !nsaDecoderStep(gpu, S, step.data(), lg.data(), &err);
        for (int s = 0; s < S && ok; s++) {
            const double e = relErr(&lg[(size_t)s * V], &lc[(size_t)s * V], V);
            worst = e > worst || !(e == e) ? e : worst;
        }
        same = same && memcmp(lg.data(), &lg[(size_t)(S - 1) * V], (size_t)V * sizeof(float)) == 0;
    }
    ok = ok && same && worst <= 2e-2;
    report(&g_res, ok, nowSeconds() - t0, "copy slot",
           "%s: %d-token prompt into %d slots, 24 steps, worst rel err %.2e (tol 2e-2), "
           "repeated slot %s%s%s",
           k->name, P, S, worst, same ? "bit-identical" : "DIFFERS", err.message[0] ? ": " : "",
           err.message);
}

/* The prompt pass (an empty slot's prompt of more than 512 positions)
 * against the 256-position passes on the same CUDA decoder, themselves
 * checked against the CPU decoder above: slot 0 takes a P-token prompt
 * through the prompt pass, slot 1 the same prompt with its first token
 * alone (so the rest goes through the passes), then both step 24 tokens;
 * every logit row of slot 0 against slot 1's, for P = 600 and 9,500.
 * l' = 512 leaves at most 19 selection blocks for n = 32: no choice, so
 * neither path's rounding can flip one.
 * (d_k, d_v) = (128, 64), SwiGLU, random compressed keys. */
static void testPromptPass(void) {
    Case k = {};
    k.cfg = smallConfig();
    k.cfg.dim = 256;
    k.cfg.n_heads = 4;
    k.cfg.d_k = 128;
    k.cfg.d_v = 64;
    k.cfg.mlp = NSA_MLP_SWIGLU;
    k.cfg.mlp_hidden = 384;
    k.cfg.vocab_size = 256;
    k.cfg.cmp_len = 32;
    k.cfg.cmp_stride = 16;
    k.cfg.sel_len = 512;
    k.cfg.n_sel = 32;
    k.cfg.window = 256;
    k.seed = 16;
    const int T = 9600, V = k.cfg.vocab_size;
    NsaDecoder *cpu = makeDecoder(&k.cfg, NSA_DEVICE_CPU, 1, 8);   /* weights only */
    NsaDecoder *gpu = makeDecoder(&k.cfg, NSA_DEVICE_CUDA, 2, T);
    setWeights(cpu, gpu, &k);
    const char *path = nsaDecoderPrefillPath(gpu);
    report(&g_res, !strncmp(path, "prompt pass", 11), 0.0, "prefill path", "prompt pass case: %.100s",
           path);
    std::vector<int32_t> tokens((size_t)T);
    fillTokens(tokens.data(), tokens.size(), k.seed, 2, V);
    const int prompts[2] = {600, 9500};
    for (int c = 0; c < 2; c++) {
        const double t0 = nowSeconds();
        const int P = prompts[c];
        std::vector<float> la((size_t)V, NAN), lb((size_t)V, NAN), steps((size_t)2 * V);
        NsaError err = {{0}};
        bool ok = !nsaDecoderReset(gpu, -1, &err) &&
                  !nsaDecoderPrefill(gpu, 0, tokens.data(), P, la.data(), &err) &&
                  !nsaDecoderPrefill(gpu, 1, tokens.data(), 1, NULL, &err) &&
                  !nsaDecoderPrefill(gpu, 1, tokens.data() + 1, P - 1, lb.data(), &err);
        double worst = ok ? relErr(la.data(), lb.data(), V) : INFINITY;
        std::vector<int32_t> step(2);
        for (int n = 0; ok && P + n < T && n < 24; n++) {
            step[0] = step[1] = tokens[(size_t)P + n];
            std::fill(steps.begin(), steps.end(), NAN);
            ok = !nsaDecoderStep(gpu, 2, step.data(), steps.data(), &err);
            const double e = relErr(steps.data(), &steps[(size_t)V], V);
            worst = e > worst || !(e == e) ? e : worst;
        }
        ok = ok && worst <= 2e-2;
        report(&g_res, ok, nowSeconds() - t0, "prompt pass",
               "%d-token prompt: prompt pass vs 256-position passes, 25 logit rows, worst rel err "
               "%.2e (tol 2e-2)%s%s",
               P, worst, err.message[0] ? ": " : "", err.message);
    }
    nsaDecoderFree(cpu);
    nsaDecoderFree(gpu);
}

static void testModel(const Case *k) {
    const double t0 = nowSeconds();
    const int V = k->cfg.vocab_size, S = k->slots, T = k->context;
    NsaDecoder *cpu = makeDecoder(&k->cfg, NSA_DEVICE_CPU, S, T);
    NsaDecoder *gpu = makeDecoder(&k->cfg, NSA_DEVICE_CUDA, S, T);
    const char *path = nsaDecoderPrefillPath(gpu);
    report(&g_res, !strncmp(path, "prompt pass", 11) == !!k->prompt_pass, 0.0, "prefill path",
           "%s: %.120s", k->name, path);
    setWeights(cpu, gpu, k);
    std::vector<int32_t> tokens((size_t)S * T);
    fillTokens(tokens.data(), tokens.size(), k->seed, 2, V);
    std::vector<float> lc((size_t)S * V), lg((size_t)S * V);
    NsaError err = {{0}};
    double worst = 0.0;
    long rows = 0;
    bool ok = true;
    for (int s = 0; s < S && ok; s++) {
        std::fill(lg.begin(), lg.end(), NAN);
        ok = !nsaDecoderPrefill(cpu, s, &tokens[(size_t)s * T], k->prompt[s], lc.data(), &err) &&
             !gpuPrefill(k, gpu, s, &tokens[(size_t)s * T], k->prompt[s], lg.data(), &err);
        const double e = relErr(lg.data(), lc.data(), V);
        worst = e > worst || !(e == e) ? e : worst;
        rows++;
    }
    /* all slots step together until the first is full */
    int pmax = 0;
    for (int s = 0; s < S; s++) pmax = k->prompt[s] > pmax ? k->prompt[s] : pmax;
    std::vector<int32_t> step(S);
    for (int n = 0; ok && pmax + n < T; n++) {
        for (int s = 0; s < S; s++) step[s] = tokens[(size_t)s * T + k->prompt[s] + n];
        std::fill(lg.begin(), lg.end(), NAN);
        ok = !nsaDecoderStep(cpu, S, step.data(), lc.data(), &err) &&
             !nsaDecoderStep(gpu, S, step.data(), lg.data(), &err);
        for (int s = 0; s < S && ok; s++) {
            const double e = relErr(&lg[(size_t)s * V], &lc[(size_t)s * V], V);
            worst = e > worst || !(e == e) ? e : worst;
            rows++;
        }
    }
    ok = ok && worst <= 2e-2;
    report(&g_res, ok, nowSeconds() - t0, k->name, "%ld logit rows, worst rel err %.2e (tol 2e-2)%s%s",
           rows, worst, err.message[0] ? ": " : "", err.message);

    /* reset and run slot 0 again: the graph replays give the same bits */
    const double t1 = nowSeconds();
    std::vector<float> first((size_t)V), again((size_t)V);
    bool same = !nsaDecoderReset(gpu, -1, &err) &&
                !gpuPrefill(k, gpu, 0, tokens.data(), k->prompt[0], first.data(), &err) &&
                !nsaDecoderReset(gpu, 0, &err) &&
                !gpuPrefill(k, gpu, 0, tokens.data(), k->prompt[0], again.data(), &err);
    same = same && memcmp(first.data(), again.data(), (size_t)V * sizeof(float)) == 0 &&
           nsaDecoderPosition(gpu, 0) == k->prompt[0];
    report(&g_res, same, nowSeconds() - t1, "graph replay", "%s: prefill after reset bit-identical",
           k->name);
    if (S >= 2) testCopySlot(k, cpu, gpu, tokens);
    nsaDecoderFree(cpu);
    nsaDecoderFree(gpu);
}

int main(void) {
    NsaDeviceInfo info;
    NsaError err = {{0}};
    if (nsaDeviceProbe(&info, &err) || info.cuda_devices == 0) {
        printf("FATAL: no CUDA device (%s)\n", err.message[0] ? err.message : info.description);
        return 2;
    }
    printf("# %s\n", info.description);
    /* selection kernel: short, several rounds of 1024 blocks, n_sel < 3, l > l' */
    testSelect(40, 8, 4, 16, 4, 2, 1);
    testSelect(2047, 32, 16, 64, 16, 6, 2);
    testSelect(65535, 32, 16, 64, 16, 6, 3);
    testSelect(70000, 32, 16, 64, 16, 16, 4);
    testSelect(262143, 32, 16, 64, 32, 1, 5);
    testSelect(300, 16, 8, 8, 2, 3, 6);
    testSelect(1000, 64, 16, 32, 20, 4, 7);
    testSelect(65535, 32, 16, 64, 16, 6, 8, true);
    testSelect(9000, 32, 16, 64, 70, 2, 9, true);
    /* matrix-vector products: one row (CUDA cores), 2 to 256 (tensor cores:
     * tiles of 16 rows, at most 2 a CTA, so above 32 rows more row groups
     * of CTAs), N and K off the tiles (K a multiple of 8) */
    testGemv(200, 72, 1, DEC_STORE, true, 21);
    testGemv(203, 72, 2, DEC_STORE, true, 22);
    testGemv(768, 768, 16, DEC_STORE, true, 23);
    testGemv(77, 3072, 3, DEC_ADD, false, 24);
    testGemv(768, 3072, 17, DEC_ADD, false, 25);
    testGemv(300, 264, 33, DEC_SILU, true, 26);
    testGemv(64, 128, 64, DEC_SWIGLU, true, 27);
    testGemv(96, 40, 47, DEC_SWIGLU, true, 28);
    testGemv(256, 768, 1, DEC_SILU, true, 29);
    testGemv(256, 768, 49, DEC_ADD, false, 30);
    /* a whole prefill pass: 256 rows, eight row groups; and a tail of one */
    testGemv(776, 768, 256, DEC_STORE, true, 31);
    testGemv(512, 3072, 200, DEC_ADD, false, 32);

    Case a = {};
    a.name = "decode avg/silu, every block selected";
    a.cfg = smallConfig();
    a.slots = 3;
    a.context = 300;
    a.prompt[0] = 1; a.prompt[1] = 40; a.prompt[2] = 100;
    a.seed = 11;
    testModel(&a);

    Case b = {};
    b.name = "decode mlp/swiglu, top-n by the tie rule";
    b.cfg = smallConfig();
    b.cfg.phi = NSA_PHI_MLP;
    b.cfg.mlp = NSA_MLP_SWIGLU;
    b.cfg.d_k = 32;
    b.cfg.cmp_len = 16;
    b.cfg.cmp_stride = 8;
    b.cfg.sel_len = 32;
    b.cfg.n_sel = 5;
    b.cfg.window = 40;
    b.slots = 2;
    b.context = 600;
    b.prompt[0] = 77; b.prompt[1] = 5;
    b.zero_cmp_keys = 1;
    b.seed = 12;
    testModel(&b);

    Case c = {};
    c.name = "decode prototype NSA sizes (l/d/l'/n/w 32/16/64/16/512)";
    c.cfg = smallConfig();
    c.cfg.dim = 256;
    c.cfg.d_k = 64;
    c.cfg.d_v = 64;
    c.cfg.mlp_hidden = 512;
    c.cfg.vocab_size = 256;
    c.cfg.cmp_len = 32;
    c.cfg.cmp_stride = 16;
    c.cfg.sel_len = 64;
    c.cfg.n_sel = 16;
    c.cfg.window = 512;
    c.slots = 2;
    c.context = 1600;
    c.prompt[0] = 1400; c.prompt[1] = 1300;
    c.zero_cmp_keys = 1;
    c.prompt_pass = 1;
    c.seed = 13;
    testModel(&c);

    testPromptPass();

    Case f = {};
    f.name = "decode prefill passes: prompts across pass edges, window < pass";
    f.cfg = smallConfig();
    f.cfg.phi = NSA_PHI_MLP;
    f.slots = 3;
    f.context = 560;
    f.prompt[0] = 256; f.prompt[1] = 257; f.prompt[2] = 530;
    f.seed = 15;
    testModel(&f);

    Case e = {};
    e.name = "decode 16 slots, d_k 64 d_v 32, G 1";
    e.cfg = smallConfig();
    e.cfg.n_kv_groups = 1;
    e.cfg.d_k = 64;
    e.cfg.d_v = 32;
    e.slots = 16;
    e.context = 130;
    for (int s = 0; s < 16; s++) e.prompt[s] = 7 * s + 1;
    e.seed = 14;
    testModel(&e);
    return printTable(&g_res) ? 1 : 0;
}
