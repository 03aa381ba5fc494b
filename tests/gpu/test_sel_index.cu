/* test_sel_index.cu - the selection's reverse index (fastSelBuildIndex,
 * kernels/cuda/fast_attn/fast_sel.cu) against a stable counting sort on the CPU.
 *
 * The index is what every deterministic selected dK/dV pass and every
 * block-centric pass walks: for each (b, g) and selection block j, the
 * ascending list of tokens that chose j (entries, with the slot of j in the
 * token's sel_idx row beside each), where each list starts (block_start),
 * the entries of j that fall in earlier counting chunks (offsets), and the
 * work items and partial slots of the dK/dV pass (item_start, part_start).
 * test_fast_attn checks it only through the gradients, at shapes whose
 * block count fits one scan tile; here it is compared entry by entry at
 * shapes that cross every tile and chunk edge: more than 1024 blocks (the
 * block scan's tile), more than 128 counting chunks (the row scan's
 * round), S no multiple of the chunk, lists longer than a work item
 * (FAST_SEL_CHUNK entries, or the shorter items fast_attn.cu picks at
 * short S), empty rows and rows of one block. Outputs are
 * poisoned first. Fresh random selections each run (the seed is printed).
 *
 *   test_sel_index        one TAP line per case, then `N passed, N failed` */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>

#include "cuda/fast_attn/fast_host.h"
#include "tap_bail.h"


static int passed = 0, failed = 0;
static unsigned long long rng_state;
static unsigned rnd(unsigned n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(rng_state >> 33) % n;
}

/* A device int array of n entries filled with the poison -7. */
static int *devPoisoned(size_t n) {
    int *p;
    CK(cudaMalloc(&p, (n ? n : 1) * sizeof(int)));
    CK(cudaMemset(p, 0xF9, (n ? n : 1) * sizeof(int))); /* 0xF9F9F9F9: negative, no valid value */
    return p;
}
static std::vector<int> toHost(const int *dev, size_t n) {
    std::vector<int> h(n);
    if (n) CK(cudaMemcpy(h.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost));
    return h;
}

/* Compares got and want; reports the first difference under `what`. */
static bool same(const char *what, const std::vector<int> &got, const std::vector<int> &want) {
    for (size_t i = 0; i < want.size(); i++)
        if (got[i] != want[i]) {
            printf("# %s[%zu] = %d, want %d\n", what, i, got[i], want[i]);
            return false;
        }
    return true;
}

/* One case: B x S tokens, G groups, `slots` entries per sel_idx row, blocks
 * of sel_len tokens, work items of item_entries entries. Each row holds block 0 (as NSA's forced block, so its
 * list is every token: several work items) with probability `p_zero`, then
 * up to slots - 1 further distinct random blocks, ascending, -1 padded; one
 * row in 16 is empty. */
static void runCase(const char *name, int B, int S, int G, int slots, int sel_len, double p_zero,
                    int item_entries = FAST_SEL_CHUNK) {
    FastCtx c;
    memset(&c, 0, sizeof(c));
    c.B = B, c.S = S, c.G = G, c.slots = slots, c.sel_len = sel_len;
    c.Ns = (S + sel_len - 1) / sel_len;
    const int BG = B * G, Ns = c.Ns, chunks = (S + FAST_REV_TOKENS - 1) / FAST_REV_TOKENS;
    const size_t n_rows = (size_t)B * S * G;

    std::vector<int> sel(n_rows * slots, -1);
    for (size_t r = 0; r < n_rows; r++) {
        if (rnd(16) == 0) continue;
        std::vector<int> pick;
        if (rnd(1000) < p_zero * 1000) pick.push_back(0);
        const int want = (int)rnd(slots) + (pick.empty() ? 1 : 0);
        for (int tries = 0; (int)pick.size() < std::min(want, Ns) && tries < 8 * slots; tries++) {
            const int j = (int)rnd(Ns);
            if (std::find(pick.begin(), pick.end(), j) == pick.end()) pick.push_back(j);
        }
        std::sort(pick.begin(), pick.end());
        std::copy(pick.begin(), pick.end(), sel.begin() + r * slots);
    }

    /* the CPU's stable counting sort, per (b, g) */
    const size_t per_bg = (size_t)S * slots;
    std::vector<int> w_bs(BG * (size_t)(Ns + 1)), w_is(w_bs.size()), w_ps(w_bs.size());
    std::vector<int> w_off((size_t)BG * Ns * chunks), w_ent(BG * per_bg, -1), w_slot(BG * per_bg, -1);
    for (int bg = 0; bg < BG; bg++) {
        const int b = bg / G, g = bg % G;
        std::vector<std::vector<std::pair<int, int>>> lists(Ns); /* (token, slot) */
        for (int t = 0; t < S; t++)
            for (int s = 0; s < slots; s++) {
                const int j = sel[(((size_t)b * S + t) * G + g) * slots + s];
                if (j >= 0) lists[j].push_back({t, s});
            }
        int *bs = &w_bs[(size_t)bg * (Ns + 1)], *is = &w_is[(size_t)bg * (Ns + 1)];
        int *ps = &w_ps[(size_t)bg * (Ns + 1)];
        int run = 0, items = 0, parts = 0;
        for (int j = 0; j < Ns; j++) {
            bs[j] = run, is[j] = items, ps[j] = parts;
            int earlier = 0, k = 0;
            for (int ch = 0; ch < chunks; ch++) {
                w_off[((size_t)bg * Ns + j) * chunks + ch] = earlier;
                while (k < (int)lists[j].size() && lists[j][k].first < (ch + 1) * FAST_REV_TOKENS)
                    k++, earlier++;
            }
            for (const auto &e : lists[j]) {
                w_ent[bg * per_bg + run] = e.first;
                w_slot[bg * per_bg + run] = e.second;
                run++;
            }
            const int n_items =
                std::max(1, ((int)lists[j].size() + item_entries - 1) / item_entries);
            items += n_items;
            parts += n_items > 1 ? n_items : 0;
        }
        bs[Ns] = run, is[Ns] = items, ps[Ns] = parts;
    }

    int32_t *d_sel;
    CK(cudaMalloc(&d_sel, sel.size() * sizeof(int32_t)));
    CK(cudaMemcpy(d_sel, sel.data(), sel.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    FastRevIndex rev;
    memset(&rev, 0, sizeof(rev));
    rev.chunks = chunks;
    rev.item_entries = item_entries;
    rev.offsets = devPoisoned(w_off.size());
    rev.block_start = devPoisoned(w_bs.size());
    rev.item_start = devPoisoned(w_is.size());
    rev.part_start = devPoisoned(w_ps.size());
    rev.entries = devPoisoned(w_ent.size());
    rev.entry_slot = devPoisoned(w_slot.size());
    /* entries past a (b, g)'s total are never written: expect the poison */
    for (size_t i = 0; i < w_ent.size(); i++)
        if (w_ent[i] < 0) w_ent[i] = w_slot[i] = (int)0xF9F9F9F9u;
    CK(fastSelBuildIndex(c, d_sel, rev, 0));
    CK(cudaDeviceSynchronize());

    const bool ok = same("block_start", toHost(rev.block_start, w_bs.size()), w_bs) &&
                    same("item_start", toHost(rev.item_start, w_is.size()), w_is) &&
                    same("part_start", toHost(rev.part_start, w_ps.size()), w_ps) &&
                    same("offsets", toHost(rev.offsets, w_off.size()), w_off) &&
                    same("entries", toHost(rev.entries, w_ent.size()), w_ent) &&
                    same("entry_slot", toHost(rev.entry_slot, w_slot.size()), w_slot);
    printf("%s %d - %s: B=%d S=%d G=%d slots=%d Ns=%d chunks=%d, %d entries, items of %d: %d\n",
           ok ? "ok" : "not ok", passed + failed + 1, name, B, S, G, slots, Ns, chunks, w_bs[Ns],
           item_entries, w_is[Ns]);
    (ok ? passed : failed)++;
    CK(cudaFree(d_sel));
    CK(cudaFree(rev.offsets));
    CK(cudaFree(rev.block_start));
    CK(cudaFree(rev.item_start));
    CK(cudaFree(rev.part_start));
    CK(cudaFree(rev.entries));
    CK(cudaFree(rev.entry_slot));
}

int main(void) {
    rng_state = (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ull + 1;
    printf("# seed %llu\n", rng_state);
    runCase("one token", 1, 1, 1, 16, 64, 1.0);
    runCase("S300, l'16, 4 slots", 2, 300, 3, 4, 16, 0.5);
    runCase("2k, paper batch-like", 8, 2048, 4, 16, 64, 1.0);
    runCase("2k, short items", 8, 2048, 4, 16, 64, 1.0, 256);
    runCase("S3001, items of 100", 2, 3001, 2, 16, 64, 0.7, 100);
    runCase("S33000: 129 chunks, 516 blocks", 1, 33000, 2, 16, 64, 1.0);
    runCase("S70001: 2 block tiles, 274 chunks", 1, 70001, 2, 16, 64, 1.0);
    runCase("S5000 l'1: 5000 blocks, 32 slots", 1, 5000, 1, 32, 1, 0.3);
    runCase("S2600 l'2: 1300 blocks, sparse", 3, 2600, 2, 3, 2, 0.0);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
