/* fast_tile.cuh - the three flash-attention tile loops shared by the window
 * and the compressed branch (fast_win.cu, fast_cmp.cu), the masked dense
 * selected branch (fast_sel_dense.cu) and, for dK/dV, the selected branch
 * (fast_sel.cu). A branch supplies a policy: which keys a tile of query
 * tokens may see (keyRange), the visibility rule (visible(t, u)) and,
 * optionally, a per-row tile mask (FastNoRowMask). The dQ kernel runs a
 * list of branches on the same query tiles (the window and compressed
 * ones together). Each loop has two forms: mma.sync with ldmatrix (any
 * sm_80+), and wgmma (WG, sm_90a; fast_wgmma.cuh), where the forward and
 * dQ are software-pipelined and read their key tiles through a TMA ring
 * (fast_tma.cuh), and dK/dV reads its query-side row stages through one
 * (fastDkdvRingCore; the mma.sync loops, and the selected passes at fewer
 * than 16 heads per group, use cp.async: fastDkdvCore).
 * Warps own 16 mma rows (an m-tile) or two; the query-tile kernels
 * (forward, dQ) split their rows (FAST_QTILE_ROWS, the wgmma forward at
 * d_v > 64 FAST_FWD_WG_ROWS) as FastQTile says, the dK/dV core one
 * warpgroup (4 warps) per 64 keys (FastDkdvShape).
 *
 * Rows of a query tile are the heads of one KV group of consecutive tokens
 * (GQA packing: the K/V tile is loaded once for every head of the group).
 * Scores live in the log2 domain: s2 = scale*log2(e) q.k, so the softmax is
 * exp2(s2 - m2) and lse = (m2 + log2 l) ln 2. Rows that see nothing get
 * o = 0, lse = -INFINITY and zero gradients (never NaN). */
#ifndef NSA_FAST_TILE_CUH
#define NSA_FAST_TILE_CUH

#include <type_traits>
#include "fast_attn.h"
#include "fast_common.cuh"
#include "fast_tma.cuh"

/* A policy (see the file comment) may also mask whole key tiles per row:
 * rowState(b, g, t) is loaded once per query row (t < 0: a padding row),
 * rowSees(row, u0) says whether the row may see the key tile starting at
 * u0 at all (the masked dense selected branch, fast_sel_dense.cu). Plain
 * policies inherit this one, which sees everything and costs nothing. */
struct FastNoRowMask {
    struct Row {};
    __device__ Row rowState(int, int, int) const { return Row{}; }
    __device__ bool rowSees(Row, int) const { return true; }
    /* Key tiles the forward and dQ loops take ahead of [kb, ke): tile i <
     * leadTiles covers keys [i KT, (i + 1) KT) (the forced selected blocks'
     * block 0, fast_policy.cuh); plain policies have none. */
    template <int KT>
    __device__ int leadTiles(int) const { return 0; }
    /* true only for a branch that is the whole selected branch (the masked
     * dense one): a dQ pass holding it forms every term of dq */
    static constexpr bool WHOLE_SELECTION = false;
};

/* Dims every fast kernel needs, resolved once per call on the host. */
/* The selected branch's forward: the union of 4 tokens' blocks per CTA
 * (fast_sel_union.cu), block-centric work items over the reverse index
 * (fast_sel_block.cu), or masked dense flash attention run in the window
 * forward's pass (fast_sel_dense.cu, fast_win.cu). */
enum class FastSelFwd { UNION, BLOCK, DENSE };
/* The selected branch's dQ: union of 4 (fast_sel_union.cu), one warp per
 * token (fast_sel.cu), block-centric after the dK/dV pass (BLOCK) or formed
 * in it (FUSED, fast_sel_block.cu), or masked dense in the window +
 * compressed dQ pass (DENSE, fast_win.cu). */
enum class FastSelDq { UNION, WARP, BLOCK, FUSED, DENSE };

struct FastCtx {
    int B, S, H, G, hpg;
    int cmp_len, cmp_stride, sel_len, n_sel, window;
    int Nc, Ns, slots;
    float scale, scale_log2;
    FastSelFwd sel_fwd; /* the selected forward's design (fastSelDesign) */
    FastSelDq sel_dq;   /* the selected dQ's design */
    int smem_max; /* the device's opt-in shared memory per CTA, bytes */
    int wgmma;    /* 1: the tile loops run on wgmma (sm_90a), 0: mma.sync */
    /* host only: the driver's cuTensorMapEncodeTiled where wgmma (the
     * wgmma tile loops read their key tiles by TMA, fast_tma.cuh), else NULL */
    void *tma_encode;
};

struct FastFwdIo {
    const bf16 *q, *k, *v;  /* keys/values [B][nkeys][G][D] */
    int nkeys;
    bf16 *o;     /* [B][S][H][DV] */
    float *lse;  /* [B][S][H] */
    /* gate-combine epilogue (window branch, runs last):
     * out = g_cmp o_cmp + g_sel o_sel + g_win o, gates [B][S][H][3] */
    const bf16 *o_cmp, *o_sel, *gates;
    bf16 *out;
};

/* Where a dQ pass puts its branches' dq: the passes run one after another
 * and sum their terms in a fixed order through an fp32 running dq. */
enum class FastDqMode {
    ACC,     /* dq_acc = dq: the first pass */
    ACC_OUT, /* dq_out (bf16) = dq_acc + dq: the last */
};

struct FastBwdIo {
    const bf16 *q, *k, *v, *dout, *gates;
    int nkeys;
    const float *lse;   /* this branch's lse [B][S][H] */
    const float *dsum;  /* dout.o_c per row and branch [B][S][H][3] (= dgates) */
    const float *gate_f; /* the gates in fp32 [B][S][H][3] (4-byte async copies) */
    int branch;         /* 0 cmp, 1 sel, 2 win */
    float *dq_acc;      /* fp32 [B][S][H][DK] running sum over the branches */
    bf16 *dq_out;       /* bf16 dq, written by the last pass (ACC_OUT) */
    FastDqMode dq_mode; /* (a dQ pass of all three branches writes dq_out = dq) */
};

/* The query-tile kernels (forward, dQ) hold FAST_QTILE_ROWS query rows per
 * CTA: 128 rows halve the K/V bytes each row pulls from L2 against 64 (the
 * compressed forward was L2-bound at 64 rows: ncu, 70% L2 throughput).
 * How the rows are split depends on the width D of the accumulator a warp
 * keeps (DV in the forward, DK in dQ):
 *  - D = 128: 4 warps of two 16-row m-tiles against 32-key tiles. Every
 *    K/V fragment read from shared memory then feeds two products; with
 *    one, ldmatrix traffic bounded the tile loop (an ldmatrix.x4 moves 512
 *    bytes, 4 cycles of the SM's shared-memory bandwidth, per two
 *    mma.sync; ncu showed short_scoreboard and mio_throttle stalls). The
 *    accumulators take the 255 registers, so 2 CTAs (8 warps) per SM.
 *  - D = 64: 8 warps of one m-tile against 64-key tiles. The accumulators
 *    are small enough for more warps per SM, which wins there (measured:
 *    proto dQ 2.97 ms this way, 3.31 with two m-tiles).
 *  - D = 192 (dQ with d_k = 192): one m-tile too; two would spill. */
#define FAST_QTILE_ROWS 128
/* With wgmma (WG) the tile is two warpgroups of 64 rows (8 warps, one
 * m-tile each; the forward at d_v > 64 three, FWD_ROWS) against 64-key
 * tiles: the tensor cores read both operands
 * of the scores from shared memory, so the ldmatrix bound above is gone.
 * CTAS: the CTAs per SM the registers are sized for. */
template <int D, bool WG = false>
struct FastQTile {
    static constexpr int MT = (!WG && D == 128) ? 2 : 1; /* m-tiles per warp */
    static constexpr int WARPS = FAST_QTILE_ROWS / (16 * MT);
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int KEYS = 64 / MT; /* keys per tile */
    static constexpr int PAD = WG ? 0 : 8; /* row padding of the shared tiles, bf16 */
    /* K/V stages of the mma.sync loops (the wgmma loops' TMA ring:
     * fastFwdStages, fastDqStages) */
    static constexpr int STAGES = 2;
    /* forward (D = DV) and dQ (D = DK); the pipelined wgmma loops hold a
     * score tile, its P fragments and the accumulator (plus dP in dQ):
     * more than the 128 registers two CTAs of 8 warps leave, except the
     * forward at D = 64 */
    static constexpr int FWD_CTAS = WG && D > 64 ? 1 : 2;
    /* the forward's rows per CTA: at one CTA per SM (D > 64 on wgmma)
     * FAST_FWD_WG_ROWS, as 64-row warpgroups - three share each K/V tile
     * and a CTA's start and epilogue (its q load, the gate combine) are
     * spread over more rows; the 138 registers of the loop allow 384
     * threads. Elsewhere FAST_QTILE_ROWS. */
    static constexpr int FWD_ROWS = WG && D > 64 ? FAST_FWD_WG_ROWS : FAST_QTILE_ROWS;
    static constexpr int FWD_THREADS = 32 * FWD_ROWS / (16 * MT);
    static constexpr bool DQ_PIPE = WG && D > 64;
    static constexpr int DQ_CTAS = D == 192 || (WG && D > 64) ? 1 : 2;
};
/* Key/value stages of the wgmma query-tile kernels: a TMA ring
 * (fast_tma.cuh) beside the query-side tiles (q; dQ also dout). */
template <int DK, int DV>
constexpr int fastFwdStages() {
    using Q = FastQTile<DV, true>;
    return fastRingStages<Q::KEYS, DK, DV>(Q::FWD_ROWS * DK * 2, Q::FWD_CTAS);
}
template <int DK, int DV>
constexpr int fastDqStages() {
    using Q = FastQTile<DK, true>;
    return fastRingStages<Q::KEYS, DK, DV>(FAST_QTILE_ROWS * (DK + DV) * 2, Q::DQ_CTAS);
}
/* Dynamic shared memory of the tile kernels; WG tiles are swizzled and
 * start 1024-byte aligned (fastTileBase), hence the slack. */
template <int DK, int DV, bool WG = false>
constexpr int fastFwdSmem() {
    using Q = FastQTile<DV, WG>;
    constexpr int KT = Q::KEYS, P = Q::PAD, ST = Q::STAGES;
    if constexpr (WG)
        return Q::FWD_ROWS * DK * 2 + FastKvRing<KT, DK, DV, fastFwdStages<DK, DV>()>::BYTES + 1024;
    return (FAST_QTILE_ROWS * (DK + P) + ST * KT * (DK + P) + ST * KT * (DV + P)) * 2;
}
template <int DK, int DV, bool WG = false>
constexpr int fastDqSmem() {
    using Q = FastQTile<DK, WG>;
    constexpr int KT = Q::KEYS, P = Q::PAD, ST = Q::STAGES;
    if constexpr (WG)
        return FAST_QTILE_ROWS * (DK + DV) * 2 +
               FastKvRing<KT, DK, DV, fastDqStages<DK, DV>()>::BYTES + 1024;
    return (FAST_QTILE_ROWS * ((DK + P) + (DV + P)) + ST * KT * (DK + P) + ST * KT * (DV + P)) * 2;
}

/* The tile kernels' dynamic shared memory, 1024-byte aligned for WG. */
template <bool WG>
__device__ __forceinline__ bf16 *fastTileBase() {
    extern __shared__ __align__(16) unsigned char fast_smem[];
    if (!WG) return (bf16 *)fast_smem;
    const uint32_t pad = (1024u - (fastSmemAddr(fast_smem) & 1023u)) & 1023u;
    return (bf16 *)(fast_smem + pad);
}
/* A padded (mma.sync) or swizzled (WG) tile load; see fastLoadTile. */
template <bool WG, int ROWS, int D, int THREADS = FAST_THREADS, class RowPtr>
__device__ __forceinline__ void fastLoadTileFor(bf16 *dst, RowPtr rowPtr) {
    if constexpr (WG) fastLoadTileSw<ROWS, D, THREADS>(dst, rowPtr);
    else fastLoadTile<ROWS, D, THREADS>(dst, rowPtr);
}
/* Starts the async copy of key tile [u0, u0 + KT) of k, v [B][nkeys][G][D]
 * into the stages sK, sV, rows from ke on zero-filled. */
template <bool WG, int KT, int DK, int DV, int THREADS>
__device__ __forceinline__ void fastLoadKeyTile(bf16 *sK, bf16 *sV, const bf16 *k, const bf16 *v,
                                                int nkeys, int G, int b, int g, int u0, int ke) {
    fastLoadTileFor<WG, KT, DK, THREADS>(sK, [&](int r) -> const bf16 * {
        int u = u0 + r;
        return u < ke ? k + (((size_t)b * nkeys + u) * G + g) * DK : nullptr;
    });
    fastLoadTileFor<WG, KT, DV, THREADS>(sV, [&](int r) -> const bf16 * {
        int u = u0 + r;
        return u < ke ? v + (((size_t)b * nkeys + u) * G + g) * DV : nullptr;
    });
}
/* The barrier after a cp.async wait: for WG the landed tiles are first
 * handed to the async proxy the tensor cores read through. */
template <bool WG>
__device__ __forceinline__ void fastTileBarrier() {
    if constexpr (WG) fastWgProxyFence();
    __syncthreads();
}
/* Query rows per dK/dV stage: whole tokens, computed as two 32-row halves
 * per barrier (registers hold a 16 x 32 score tile per warp). */
#define FAST_DKDV_ROWS 64
/* Rows per wgmma pass of the dK/dV core where d_k, d_v <= 128 (32 or 64;
 * 64 measured faster on an H200: paper 64k cmp dK/dV 25.6 -> 24.6 ms,
 * window 8.2 -> 7.1, selected 13.7 -> 12.8). */
/* Key warpgroups per dK/dV CTA of the window and compressed branches on
 * wgmma: two warpgroups of 64 keys each share every row stage (q, dout and
 * their row data), which halves the bytes each key pulls from L2; the
 * selected branch's CTAs hold one selection block (64 keys) and keep one. */
template <bool WG, int DK, int DV>
struct FastDkdvShape {
    /* warpgroups of 64 keys: at d_k = d_v = 64 one warpgroup's registers
     * leave three CTAs per SM, two warpgroups one (H200, proto 64k: compressed
     * dK/dV 2.81 -> 3.19 ms, window 0.85 -> 1.03). (At d_k = 192, 64-key
     * CTAs in two row warpgroups - FastDkdvRing's RWG, four stages, as the
     * fused selected backward runs there - measured slower than these
     * 128-key CTAs on three shared stages: H100, paper192 64k compressed
     * dK/dV 20.69 -> 21.49 ms, window 6.54 -> 8.23, fwd+bwd 129.71 ->
     * 133.06.) */
    static constexpr int KWG = WG && DK + DV >= 256 ? FAST_DKDV_KEY_WGS : 1;
    static constexpr int KEYS = 64 * KWG, THREADS = FAST_THREADS * KWG;
};
constexpr int fastDkdvSmem(int dk, int dv, bool wg = false, int key_wgs = 1) {
    const int pad = wg ? 0 : 8;
    return (64 * key_wgs * (dk + pad) + 64 * key_wgs * (dv + pad) +
            2 * FAST_DKDV_ROWS * (dk + pad) + 2 * FAST_DKDV_ROWS * (dv + pad)) * 2 +
           2 * FAST_DKDV_ROWS * 4 * 4 + 4 * FAST_DKDV_ROWS * 4 + (wg ? 1024 : 0);
}

/* One branch of a forward pass: its keys, values, o and lse (io.k, io.v,
 * io.nkeys, io.o, io.lse) and which keys a row sees (the policy). */
template <class Policy>
struct FastFwdBranch {
    FastFwdIo io;
    Policy pol;
};
/* wgmma: each branch's io.k, io.v as TMA maps, in the branches' order */
#define FAST_FWD_MAX_BRANCHES 2
struct FastFwdMaps {
    FastKvMaps br[FAST_FWD_MAX_BRANCHES];
};
/* A branch's keys for the query tokens [t0, t_last]: [kb, ke) by its
 * policy, after the policy's lead tiles (leadTiles: none but for the forced
 * selected blocks' block 0); returns the KT-key tiles of both (0 for none),
 * tile it starting at key fastKeyTileAt<KT>(it, lead, kb). */
template <int KT, class Policy>
__device__ __forceinline__ int fastKeyTiles(const Policy &pol, int t0, int t_last, int &kb,
                                            int &ke, int &lead) {
    pol.keyRange(t0, t_last, kb, ke);
    const int in_range = ke > kb ? (ke - kb + KT - 1) / KT : 0;
    lead = in_range > 0 ? pol.template leadTiles<KT>(kb) : 0;
    return lead + in_range;
}
template <int KT>
__device__ __forceinline__ int fastKeyTileAt(int it, int lead, int kb) {
    return it < lead ? it * KT : kb + (it - lead) * KT;
}
/* The mma.sync query-tile loops' two key/value stages: issues tile it + 1
 * into the other stage, waits for tile it's copies and makes them visible
 * to the CTA; returns tile it's stage. */
template <class LoadKV>
__device__ __forceinline__ int fastSyncStage(int it, int ntiles, LoadKV &loadKV) {
    const int st = it & 1;
    if (it + 1 < ntiles) loadKV(it + 1, st ^ 1);
    fastCpCommit();
    fastCpWait<1>();
    __syncthreads();
    return st;
}
/* Calls f(branch, is_last) for each branch in order, is_last a
 * std::bool_constant (the last branch's epilogue may use the q tile). */
template <class F, class First, class... Rest>
__device__ __forceinline__ void fastEachBranch(F &f, const First &first, const Rest &...rest) {
    f(first, std::bool_constant<sizeof...(Rest) == 0>{});
    if constexpr (sizeof...(Rest) > 0) fastEachBranch(f, rest...);
}

/* fastWgRun taking a turn (TURNS: FastTurns<WGS>): the warpgroup waits for
 * its turn before it issues, and hands the turn on before it waits for the
 * products. */
template <bool TURNS, int WGS, class Issue, class... Acc>
__device__ __forceinline__ void fastWgRunTurn(Issue issue, Acc &...accs) {
    (fastWgFenceAcc(accs), ...);
    if constexpr (TURNS) FastTurns<WGS>::wait();
    fastWgArrive();
    issue();
    fastWgCommit();
    if constexpr (TURNS) FastTurns<WGS>::pass();
    fastWgWait<0>();
    (fastWgFenceAcc(accs), ...);
}

/* Forward of one tile of FWD_ROWS query rows (FastQTile), per branch in
 * turn on the same q tile: o = softmax(scale q.K^T) V over the keys
 * [kb, ke) of the branch's policy, visible(t, u) masking per row; the
 * branch's o and lse out, and after the last branch the gate combine when
 * COMBINE (io: q, and o_cmp, o_sel, gates, out; an o_sel that an earlier
 * branch of this pass wrote is read back from L2). Two branches: the
 * masked dense selected forward and the window forward at short S share
 * the q tile and the launch.
 * Grid (ceil(S / tokens_per_tile), B*G), FastQTile<DV>::FWD_THREADS threads. */
/* Two CTAs per SM: with one m-tile per warp that holds the kernel to 128
 * registers (the latency-bound loop gains more from a second CTA than from
 * registers); two m-tiles need all 255 and get 2 x 4 warps. */
template <int DK, int DV, bool COMBINE, bool WG, class... Branches>
__global__ void __launch_bounds__(FastQTile<DV, WG>::FWD_THREADS, FastQTile<DV, WG>::FWD_CTAS)
fastFwdKernel(FastCtx c, FastFwdIo io, const __grid_constant__ FastFwdMaps maps, Branches... br) {
    static_assert(sizeof...(Branches) >= 1 && sizeof...(Branches) <= FAST_FWD_MAX_BRANCHES,
                  "FastFwdMaps holds the branches");
    using Q = FastQTile<DV, WG>;
    constexpr int MT = Q::MT, KT = Q::KEYS, NT = KT / 8;
    constexpr int LDK = DK + Q::PAD, LDV = DV + Q::PAD, R = Q::FWD_ROWS, THREADS = Q::FWD_THREADS;
    /* the warpgroups take turns at issuing their products (FastTurns) where
     * d_k > 128; at d_k = 128 the score products are shorter against the
     * same exponentials and turns cost more than they save */
    constexpr bool TURNS = WG && DV > 64 && DK > 128;
    constexpr int WGS = THREADS >= 256 ? THREADS / 128 : 2;
    using Turns = FastTurns<WGS>;
    bf16 *sQ = fastTileBase<WG>(), *sK = sQ + R * LDK, *sV = sK + Q::STAGES * KT * LDK;
    using Ring = FastKvRing<KT, DK, DV, fastFwdStages<DK, DV>()>;
    const Ring ring = Ring::at(sK); /* WG: the key/value tiles (sK, sV unused) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    const int tpc = R / c.hpg, t0 = blockIdx.x * tpc, t_last = min(c.S, t0 + tpc) - 1;
    auto rowToken = [&](int r) {
        int tok = t0 + r / c.hpg;
        return (r < tpc * c.hpg && tok < c.S) ? tok : -1;
    };
    auto rowIndex = [&](int r) -> size_t {
        return ((size_t)b * c.S + t0 + r / c.hpg) * c.H + (size_t)g * c.hpg + r % c.hpg;
    };
    fastLoadTileFor<WG, R, DK, THREADS>(sQ, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? io.q + rowIndex(r) * DK : nullptr;
    });
    if constexpr (COMBINE) {
        /* the gate combine's o_cmp, o_sel and gate rows toward L2 now, so
         * the epilogue - which nothing else on the SM overlaps at one CTA
         * per SM - reads them from L2 rather than DRAM */
        constexpr int LINES = DV * 2 / 128; /* 128-byte lines per output row */
        for (int i = threadIdx.x; i < R * LINES; i += THREADS) {
            const int r = i / LINES, part = i % LINES;
            if (rowToken(r) < 0) continue;
            const size_t row = rowIndex(r);
            fastPrefetchL2(io.o_cmp + row * DV + part * 64);
            /* (an o_sel of this pass is written later, and read from L2) */
            if (sizeof...(Branches) == 1) fastPrefetchL2(io.o_sel + row * DV + part * 64);
            if (part == 0 && r % c.hpg == 0) fastPrefetchL2(io.gates + row * 3);
        }
    }
    if constexpr (WG) {
        fastCpCommit(); /* q */
        if (threadIdx.x == 0) ring.init(THREADS / 32);
        __syncthreads(); /* the ring's barriers are initialised */
    }
    int ring_base = 0; /* WG: the ring's index of the branch's first tile */
    int branch_no = 0; /* the branch's place in br (its maps) */
    auto runBranch = [&](const auto &branch, auto is_last) {
        constexpr bool LAST = decltype(is_last)::value;
        const FastFwdIo &bio = branch.io;
        const auto &pol = branch.pol;
        using Policy = std::decay_t<decltype(pol)>;
        int kb, ke, lead;
        const int ntiles = fastKeyTiles<KT>(pol, t0, t_last, kb, ke, lead);
        auto keyAt = [&](int it) { return fastKeyTileAt<KT>(it, lead, kb); };
        auto loadKV = [&](int it, int st) {
            fastLoadKeyTile<WG, KT, DK, DV, THREADS>(sK + st * KT * LDK, sV + st * KT * LDV, bio.k,
                                                     bio.v, bio.nkeys, c.G, b, g, keyAt(it), ke);
        };
        if constexpr (WG) {
            if (threadIdx.x == 0)
                for (int j = 0; j <= Ring::AHEAD && j < ntiles; j++)
                    ring.produce(maps.br[branch_no], ring_base + j, b, g, keyAt(j));
        } else {
            if (branch_no > 0) __syncthreads(); /* the last branch's stages are free */
            if (ntiles > 0) loadKV(0, 0);
            fastCpCommit();
        }

        /* m-tile i of the warp holds rows row0 + 16i + grp (+ 8); with WG the
         * warpgroup of the warp owns rows wg_row0 .. wg_row0 + 63 */
        [[maybe_unused]] const int wg_row0 = (warp >> 2) * 64;
        const int row0 = warp * 16 * MT;
        int tok[MT][2];
        float m[MT][2], l[MT][2];
        float o[MT][DV / 8][4];
        typename Policy::Row rows[MT][2];
#pragma unroll
        for (int i = 0; i < MT; i++) {
            tok[i][0] = rowToken(row0 + 16 * i + grp);
            tok[i][1] = rowToken(row0 + 16 * i + grp + 8);
            rows[i][0] = pol.rowState(b, g, tok[i][0]);
            rows[i][1] = pol.rowState(b, g, tok[i][1]);
            m[i][0] = m[i][1] = -INFINITY;
            l[i][0] = l[i][1] = 0.f;
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
                o[i][n][0] = o[i][n][1] = o[i][n][2] = o[i][n][3] = 0.f;
        }
        /* scores of m-tile i of tile it to the log2 domain, masked entries
         * -inf, and their row-half maxima, in two instances chosen once per
         * tile - interior tiles (every row sees every key) test no key - as
         * the dQ pass's dsTile, where leaving the split to the compiler
         * once cost 7 ms */
        auto maskTile = [&](float (&si)[NT][4], int i, int it, float mx[2]) {
            const int u0 = keyAt(it);
            const bool full = u0 + KT <= ke && pol.allVisible(t0, t_last, u0, u0 + KT - 1);
            const bool sees[2] = {pol.rowSees(rows[i][0], u0), pol.rowSees(rows[i][1], u0)};
            auto run = [&](auto is_full) {
                constexpr bool FULL = decltype(is_full)::value;
                mx[0] = mx[1] = -INFINITY;
#pragma unroll
                for (int n = 0; n < NT; n++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int u = u0 + n * 8 + quad * 2 + (e & 1);
                        int t = tok[i][e >> 1];
                        bool ok = (FULL || (t >= 0 && u < ke && pol.visible(t, u))) && sees[e >> 1];
                        float v = ok ? si[n][e] * c.scale_log2 : -INFINITY;
                        si[n][e] = v;
                        mx[e >> 1] = fmaxf(mx[e >> 1], v);
                    }
                }
            };
            if (full) run(std::true_type{});
            else run(std::false_type{});
        };
        if constexpr (WG) {
            /* Software pipeline (FlashAttention-3's intra-warpgroup overlap):
             * tile it issues its scores, then P.V of tile it-1, and computes its
             * exponentials while that P.V runs on the tensor cores. Nothing is
             * in flight across iterations (the compiler would serialise the
             * products otherwise, C7515). Tiles come through the TMA ring: a
             * warp waits for tile it and releases tile it-1 (its V was the last
             * read) - no barrier across the CTA in the loop. */
            if (ntiles > 0) {
                float s[NT][4], corr[2];
                uint32_t a[NT / 2][4];
                auto scoresToP = [&](int it) { /* s: scores of tile it -> P, corr */
                    float mx[2];
                    maskTile(s, 0, it, mx);
                    fastSoftmaxScores<NT>(s, mx, m[0], l[0], corr);
                };
                const int j0 = ring_base;
                fastCpWait<0>();
                fastTileBarrier<WG>(); /* q landed */
                ring.wait(j0);
                fastWgRunTurn<TURNS, WGS>(
                    [&] { fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j0), KT, 0); }, s);
                scoresToP(0); /* o is 0: no rescale */
                fastWgAFromC<NT>(a, s);
                auto produce = [&](int it) {
                    if (threadIdx.x == 0 && it + Ring::AHEAD < ntiles)
                        ring.produce(maps.br[branch_no], j0 + it + Ring::AHEAD, b, g,
                                     keyAt(it + Ring::AHEAD));
                };
                for (int it = 1; it < ntiles; it++) {
                    ring.wait(j0 + it);
                    if constexpr (TURNS) Turns::wait();
                    fastWgArrive();
                    fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j0 + it), KT, 0);
                    fastWgCommit();
                    fastRescaleRows<DV>(o[0], corr); /* by tile it-1's max */
                    fastWgFenceAcc(o[0]);
                    fastWgArrive();
                    fastWgIssuePZ<NT, DV>(o[0], a, ring.v(j0 + it - 1), KT, 0);
                    fastWgCommit();
                    if constexpr (TURNS) Turns::pass();
                    produce(it);
                    fastWgWait<1>(); /* scores of tile it */
                    fastWgFenceAcc(s);
                    scoresToP(it);
                    fastWgWait<0>(); /* P.V of tile it-1 */
                    fastWgFenceAcc(o[0]);
                    ring.release(j0 + it - 1);
                    fastWgAFromC<NT>(a, s);
                }
                fastRescaleRows<DV>(o[0], corr);
                fastWgRunTurn<TURNS, WGS>(
                    [&] { fastWgIssuePZ<NT, DV>(o[0], a, ring.v(j0 + ntiles - 1), KT, 0); }, o[0]);
                if constexpr (!LAST) ring.release(j0 + ntiles - 1); /* the next branch reuses it */
            }
        } else {
            for (int it = 0; it < ntiles; it++) {
                const int st = fastSyncStage(it, ntiles, loadKV);
                const bf16 *k_t = sK + st * KT * LDK, *v_t = sV + st * KT * LDV;
                float s[MT][NT][4];
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int n = 0; n < NT; n++)
                        s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.f;
                /* q fragments are re-read from shared memory per tile: holding
                 * them (MT * DK / 4 registers) would spill */
                fastMmaAZtM<MT, NT, DK>(s, sQ, LDK, row0, k_t, LDK);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    float mx[2];
                    maskTile(s[i], i, it, mx);
                    fastSoftmaxStep<NT, DV>(s[i], mx, m[i], l[i], o[i]);
                }
                fastMmaPZM<MT, NT, DV>(o, s, v_t, LDV);
                __syncthreads();
            }
        }
        fastCpWait<0>();

        if constexpr (LAST && WG && (COMBINE || DV > 64)) {
            /* The epilogue through shared memory: the warp stages its 16 rows of
             * o (normalised, bf16) in its own rows of the q tile - its
             * warpgroup's products, the only readers of those rows, are done -
             * and then moves whole 16-byte chunks: o out, and with COMBINE
             *   out = g_cmp o_cmp + g_sel o_sel + g_win o
             * from 16-byte loads of o_cmp and o_sel. o enters the combine in
             * bf16, as it is stored (and as o_cmp, o_sel are). The fragments'
             * 4-byte loads and stores had been most of the window forward's
             * epilogue, which at one CTA per SM nothing overlaps (H100: paper
             * fwd.win+gate 4.61 -> 3.72 ms at 2k, 4.68 -> 3.95 at 64k; the 2k
             * compressed forward 1.44 -> 1.27). Not at d_v = 64 without the
             * combine: there two CTAs per SM overlap their epilogues, and the
             * proto 64k compressed forward measured 1.07 -> 1.10. */
            float inv[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float lsum = fastQuadSum(l[0][i]);
                inv[i] = lsum > 0.f ? 1.f / lsum : 0.f;
                if (tok[0][i] >= 0 && quad == 0)
                    bio.lse[rowIndex(row0 + grp + 8 * i)] = fastLse(m[0][i], lsum);
            }
#pragma unroll
            for (int h = 0; h < DV / 64; h++)
                fastStagePut64<R>(sQ, row0, h * 64, fastPanel64(o[0], h), inv[0], inv[1]);
            __syncwarp();
            /* lane l < 16 knows row row0 + l: its index (-1: none) and gates */
            const int my_r = row0 + (lane & 15);
            const long long my_at = rowToken(my_r) >= 0 ? (long long)rowIndex(my_r) : -1;
            float my_g[3] = {0.f, 0.f, 0.f};
            if (COMBINE && my_at >= 0)
#pragma unroll
                for (int k = 0; k < 3; k++) my_g[k] = __bfloat162float(io.gates[my_at * 3 + k]);
            constexpr int CH = DV / 8; /* 16-byte chunks per row */
#pragma unroll 2
            for (int idx = lane; idx < 16 * CH; idx += 32) {
                const int r = idx / CH, k = idx % CH;
                const long long at = __shfl_sync(0xffffffffu, my_at, r);
                const float gc = __shfl_sync(0xffffffffu, my_g[0], r);
                const float gs = __shfl_sync(0xffffffffu, my_g[1], r);
                const float gw = __shfl_sync(0xffffffffu, my_g[2], r);
                if (at < 0) continue;
                const uint4 ov = fastStageChunk<R>(sQ, row0 + r, k);
                const size_t off = (size_t)at * DV + k * 8;
                *(uint4 *)(bio.o + off) = ov;
                if constexpr (COMBINE) {
                    const uint4 cv = *(const uint4 *)(io.o_cmp + off);
                    const uint4 sv = *(const uint4 *)(io.o_sel + off);
                    const __nv_bfloat162 *o2 = (const __nv_bfloat162 *)&ov;
                    const __nv_bfloat162 *c2 = (const __nv_bfloat162 *)&cv;
                    const __nv_bfloat162 *s2 = (const __nv_bfloat162 *)&sv;
                    uint4 y;
                    uint32_t *y32 = (uint32_t *)&y;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float2 a = __bfloat1622float2(c2[e]), bs = __bfloat1622float2(s2[e]),
                                     w = __bfloat1622float2(o2[e]);
                        y32[e] = fastPack(gc * a.x + gs * bs.x + gw * w.x,
                                          gc * a.y + gs * bs.y + gw * w.y);
                    }
                    *(uint4 *)(io.out + off) = y;
                }
            }
        } else {
            /* from the fragments: 4-byte stores (and loads for the combine) */
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float lsum = fastQuadSum(l[mt][i]);
                    if (tok[mt][i] < 0) continue;
                    size_t row = rowIndex(row0 + 16 * mt + grp + 8 * i);
                    float inv = lsum > 0.f ? 1.f / lsum : 0.f;
                    float gc = 0.f, gs = 0.f, gw = 0.f;
                    if (LAST && COMBINE) {
                        gc = __bfloat162float(io.gates[row * 3 + 0]);
                        gs = __bfloat162float(io.gates[row * 3 + 1]);
                        gw = __bfloat162float(io.gates[row * 3 + 2]);
                    }
#pragma unroll
                    for (int n = 0; n < DV / 8; n++) {
                        int col = n * 8 + quad * 2;
                        float o0 = o[mt][n][2 * i] * inv, o1 = o[mt][n][2 * i + 1] * inv;
                        *(uint32_t *)(bio.o + row * DV + col) = fastPack(o0, o1);
                        if (LAST && COMBINE) {
                            const size_t at = row * DV + col;
                            __nv_bfloat162 oc = *(const __nv_bfloat162 *)(io.o_cmp + at);
                            __nv_bfloat162 os = *(const __nv_bfloat162 *)(io.o_sel + at);
                            float y0 = gc * __low2float(oc) + gs * __low2float(os) + gw * o0;
                            float y1 = gc * __high2float(oc) + gs * __high2float(os) + gw * o1;
                            *(uint32_t *)(io.out + row * DV + col) = fastPack(y0, y1);
                        }
                    }
                    if (quad == 0)
                        bio.lse[row] = fastLse(m[mt][i], lsum);
                }
            }
        }
        if constexpr (WG) ring_base += ntiles;
        branch_no++;
    }; /* runBranch */
    if constexpr (TURNS) Turns::begin();
    fastEachBranch(runBranch, br...);
    if constexpr (TURNS) Turns::end();
}

/* Writes row half i (0: mma row grp, 1: grp + 8) of a warp's dq fragments,
 * times the softmax scale, as io.dq_mode says: ACC dq_acc = dq, ACC_OUT
 * dq_out (bf16) = dq_acc + dq - the branches' fixed summation order - or,
 * where the pass ran every branch (ALL), dq_out = dq. ALL is a template
 * argument so that the passes of fewer branches keep their code (at d_k =
 * 64 a fourth runtime case made the mma.sync dQ kernel spill). */
template <int DK, bool ALL = false>
__device__ __forceinline__ void fastStoreDqRow(const FastCtx &c, const FastBwdIo &io, size_t row, int i,
                                               const float (&dq)[DK / 8][4]) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < DK / 8; n++) {
        int col = n * 8 + quad * 2;
        float v0 = dq[n][2 * i] * c.scale, v1 = dq[n][2 * i + 1] * c.scale;
        float2 *acc = (float2 *)(io.dq_acc + row * DK + col);
        if constexpr (ALL) {
            *(uint32_t *)(io.dq_out + row * DK + col) = fastPack(v0, v1);
        } else if (io.dq_mode == FastDqMode::ACC) {
            *acc = make_float2(v0, v1);
        } else {
            float2 prev = *acc;
            *(uint32_t *)(io.dq_out + row * DK + col) = fastPack(prev.x + v0, prev.y + v1);
        }
    }
}

/* dQ of one tile of FAST_QTILE_ROWS query rows, recomputing P from the
 * saved lse:
 *   dP = dO_c.V^T with dO_c = g_c dout;  dS = P (dP - delta_c), delta_c = g_c dout.o_c;
 *   dq = scale dS.K, summed into the running dq of the branches (io.dq_mode).
 * io gives the rows (q, dout) and where dq goes; each of the branches (a
 * FastDqBranch: keys, lse, policy) runs its tile loop in turn on the same
 * q / dout tiles and dq registers - the window and compressed branches
 * share one pass this way (one load of the rows and one dq round trip
 * less). */
/* CTAs per SM the registers are sized for: two m-tiles (DK = 128) need
 * 255 registers, 2 CTAs of 4 warps; DK = 64 fits 2 CTAs of 8 warps in
 * 128 (measured: proto dQ 3.0 ms so, 4.2 ms at 208 registers and one
 * CTA); DK = 192 needs 1 CTA of 8 warps at up to 255. */
template <class P>
struct FastDqBranch {
    using Policy = P;
    using Row = typename Policy::Row;
    FastBwdIo io; /* the branch's k, v, nkeys, lse and index into dsum / gates */
    Policy pol;
};
/* wgmma: each branch's io.k, io.v as TMA maps, in the branches' order
 * (fastLaunchDq fills them); three where the masked dense selected dQ
 * joins the window and compressed ones (fastWinCmpDq) */
#define FAST_DQ_MAX_BRANCHES 3
struct FastDqMaps {
    FastKvMaps br[FAST_DQ_MAX_BRANCHES];
    /* the pass's tokens [t_begin, t_end) of every batch row: all, or one
     * chunk of the fused selected backward's (fastWinCmpDq). Here rather
     * than in FastBwdIo, which every backward kernel takes by value: grown,
     * it changed the others' register allocation (spills at d = 64 on
     * mma.sync). */
    int t_begin, t_end;
};
template <int DK, int DV, bool WG, class... Branches>
__global__ void __launch_bounds__(FastQTile<DK, WG>::THREADS, FastQTile<DK, WG>::DQ_CTAS)
fastDqKernel(FastCtx c, FastBwdIo io, const __grid_constant__ FastDqMaps maps, Branches... br) {
    static_assert(sizeof...(Branches) <= FAST_DQ_MAX_BRANCHES, "FastDqMaps holds the branches");
    /* every branch in this pass (the masked dense selected dQ joins the
     * window and compressed ones): dq goes out as it is (fastStoreDqRow).
     * A third branch of the forced selected blocks leaves the rest of the
     * selected dq to the fused backward's combine. */
    constexpr bool ALL = (Branches::Policy::WHOLE_SELECTION || ...);
    using Q = FastQTile<DK, WG>;
    constexpr int MT = Q::MT, KT = Q::KEYS, NT = KT / 8;
    constexpr int LDK = DK + Q::PAD, LDV = DV + Q::PAD, R = FAST_QTILE_ROWS, THREADS = Q::THREADS;
    /* the pipelined pass's two warpgroups take turns at issuing their
     * products (FastTurns) */
    constexpr bool TURNS = Q::DQ_PIPE;
    constexpr int WGS = THREADS >= 256 ? THREADS / 128 : 2;
    using Turns = FastTurns<WGS>;
    bf16 *sQ = fastTileBase<WG>(), *sdO = sQ + R * LDK, *sK = sdO + R * LDV,
         *sV = sK + Q::STAGES * KT * LDK;
    using Ring = FastKvRing<KT, DK, DV, fastDqStages<DK, DV>()>;
    const Ring ring = Ring::at(sK); /* WG: the key/value tiles (sK, sV unused) */
    int ring_base = 0; /* WG: the ring's index of the branch's first tile */
    int branch_no = 0; /* the branch's place in br (its maps) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2, quad = lane & 3;
    const int b = blockIdx.y / c.G, g = blockIdx.y % c.G;
    /* the pass's tokens (a pass of all three branches runs every token:
     * there a runtime range cost the short-S kernels registers and time) */
    const int t_begin = ALL ? 0 : maps.t_begin, t_end = ALL ? c.S : maps.t_end;
    const int tpc = R / c.hpg, t0 = t_begin + blockIdx.x * tpc, t_last = min(t_end, t0 + tpc) - 1;
    auto rowToken = [&](int r) {
        int tok = t0 + r / c.hpg;
        return (r < tpc * c.hpg && tok < t_end) ? tok : -1;
    };
    auto rowIndex = [&](int r) -> size_t {
        return ((size_t)b * c.S + t0 + r / c.hpg) * c.H + (size_t)g * c.hpg + r % c.hpg;
    };
    fastLoadTileFor<WG, R, DK, THREADS>(sQ, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? io.q + rowIndex(r) * DK : nullptr;
    });
    fastLoadTileFor<WG, R, DV, THREADS>(sdO, [&](int r) -> const bf16 * {
        return rowToken(r) >= 0 ? io.dout + rowIndex(r) * DV : nullptr;
    });
    if (!ALL && io.dq_mode != FastDqMode::ACC) {
        /* the epilogue adds to this tile's running dq (dq_acc, fp32): its
         * rows toward L2 now, so that the epilogue - at one CTA per SM
         * nothing overlaps it - reads them from L2 rather than DRAM (H100:
         * paper 2k masked dense selected dQ 9.50 -> 9.26 ms, total 41.51 ->
         * 40.85) */
        constexpr int LINES = DK * 4 / 128; /* 128-byte lines per row */
        for (int i = threadIdx.x; i < R * LINES; i += THREADS) {
            const int r = i / LINES;
            if (rowToken(r) >= 0) fastPrefetchL2(io.dq_acc + rowIndex(r) * DK + (i % LINES) * 32);
        }
    }
    if constexpr (WG) {
        fastCpCommit(); /* q, dout */
        if (threadIdx.x == 0) ring.init(Q::WARPS);
        __syncthreads(); /* the ring's barriers are initialised */
    }
    const int row0 = warp * 16 * MT, wg_row0 = (warp >> 2) * 64;
    float dq[MT][DK / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < DK / 8; n++) dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.f;
    /* one branch's keys: the tile loop over its key range, dq accumulating
     * over the branches in their order */
    auto runBranch = [&](const auto &branch) {
        const FastBwdIo &bio = branch.io;
        const auto &pol = branch.pol;
        using Row = typename std::decay_t<decltype(branch)>::Row;
        int kb, ke, lead;
        const int ntiles = fastKeyTiles<KT>(pol, t0, t_last, kb, ke, lead);
        auto keyAt = [&](int it) { return fastKeyTileAt<KT>(it, lead, kb); };
        auto loadKV = [&](int it, int st) {
            fastLoadKeyTile<WG, KT, DK, DV, THREADS>(sK + st * KT * LDK, sV + st * KT * LDV, bio.k,
                                                     bio.v, bio.nkeys, c.G, b, g, keyAt(it), ke);
        };
        /* WG: tile it of this branch is the ring's tile ring_base + it */
        auto produce = [&](int it) {
            if (threadIdx.x == 0 && it < ntiles)
                ring.produce(maps.br[branch_no], ring_base + it, b, g, keyAt(it));
        };
        if constexpr (WG) {
            for (int j = 0; j <= Ring::AHEAD; j++) produce(j);
        } else {
            __syncthreads(); /* the last branch's stages are free */
            if (ntiles > 0) loadKV(0, 0);
            fastCpCommit();
        }

        int tok[MT][2];
        float lse2[MT][2], dsum[MT][2], gate[MT][2];
        Row rows[MT][2];
    #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
    #pragma unroll
            for (int i = 0; i < 2; i++) {
                int r = row0 + 16 * mt + grp + 8 * i;
                tok[mt][i] = rowToken(r);
                rows[mt][i] = pol.rowState(b, g, tok[mt][i]);
                lse2[mt][i] = dsum[mt][i] = gate[mt][i] = 0.f;
                if (tok[mt][i] >= 0) {
                    size_t row = rowIndex(r);
                    float lse = bio.lse[row];
                    if (lse == -INFINITY) tok[mt][i] = -1; /* sees nothing: no gradient */
                    else lse2[mt][i] = lse * FAST_LOG2E;
                    dsum[mt][i] = bio.dsum[row * 3 + bio.branch];
                    gate[mt][i] = __bfloat162float(bio.gates[row * 3 + bio.branch]);
                }
            }
        }

        /* m-tile mt of tile it: s (scores) becomes dS = g P (dP - delta),
         * in two instances chosen once per tile - interior tiles (every row
         * sees every key) test no key. Left to the compiler, one loop with a
         * per-element `full ||` test was split in two in some builds and
         * not in others (the paper 64k window + compressed dQ 15.7 -> 22.7
         * ms when a token range was added to the pass, H100). */
        auto dsTile = [&](float (&si)[NT][4], const float (&dpi)[NT][4], int mt, int it) {
            const int u0 = keyAt(it);
            const bool full = u0 + KT <= ke && pol.allVisible(t0, t_last, u0, u0 + KT - 1);
            const bool sees[2] = {pol.rowSees(rows[mt][0], u0), pol.rowSees(rows[mt][1], u0)};
            auto run = [&](auto is_full) {
                constexpr bool FULL = decltype(is_full)::value;
    #pragma unroll
                for (int n = 0; n < NT; n++) {
    #pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int u = u0 + n * 8 + quad * 2 + (e & 1);
                        int i = e >> 1, t = tok[mt][i];
                        /* a row that sees nothing (t < 0) stays masked even in a full tile */
                        bool ok = t >= 0 && (FULL || (u < ke && pol.visible(t, u))) && sees[i];
                        float p = ok ? fastExp2(si[n][e] * c.scale_log2 - lse2[mt][i]) : 0.f;
                        si[n][e] = gate[mt][i] * p * (dpi[n][e] - dsum[mt][i]);
                    }
                }
            };
            if (full) run(std::true_type{});
            else run(std::false_type{});
        };
        if constexpr (Q::DQ_PIPE) {
            /* Software pipeline as in fastFwdKernel: tile it issues its scores
             * and dP, then dS.K of tile it-1, and computes its dS while that
             * runs. */
            if (ntiles > 0) {
                float s[NT][4], dp[NT][4];
                uint32_t a[NT / 2][4];
                const int j0 = ring_base;
                fastCpWait<0>();
                fastTileBarrier<WG>(); /* q and dout landed */
                ring.wait(j0);
                fastWgRunTurn<TURNS, WGS>(
                    [&] {
                        fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j0), KT, 0);
                        fastWgIssueAZt<NT, DV>(dp, sdO, R, wg_row0, ring.v(j0), KT, 0);
                    },
                    s, dp);
                dsTile(s, dp, 0, 0);
                fastWgAFromC<NT>(a, s);
                for (int it = 1; it < ntiles; it++) {
                    const int j = j0 + it;
                    ring.wait(j);
                    if constexpr (TURNS) Turns::wait();
                    fastWgArrive();
                    fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j), KT, 0);
                    fastWgIssueAZt<NT, DV>(dp, sdO, R, wg_row0, ring.v(j), KT, 0);
                    fastWgCommit();
                    fastWgFenceAcc(dq[0]);
                    fastWgArrive();
                    fastWgIssuePZ<NT, DK>(dq[0], a, ring.k(j - 1), KT, 0);
                    fastWgCommit();
                    if constexpr (TURNS) Turns::pass();
                    produce(it + Ring::AHEAD);
                    fastWgWait<1>(); /* scores and dP of tile it */
                    fastWgFenceAcc(s);
                    fastWgFenceAcc(dp);
                    dsTile(s, dp, 0, it);
                    fastWgWait<0>(); /* dS.K of tile it-1: its A registers are free */
                    fastWgFenceAcc(dq[0]);
                    ring.release(j - 1);
                    fastWgAFromC<NT>(a, s);
                }
                fastWgRunTurn<TURNS, WGS>(
                    [&] { fastWgIssuePZ<NT, DK>(dq[0], a, ring.k(j0 + ntiles - 1), KT, 0); }, dq[0]);
                ring.release(j0 + ntiles - 1); /* the next branch reuses its stage */
            }
        } else if constexpr (WG) {
            /* one tile at a time where the pipeline's registers would cost
             * the second CTA per SM (d_k = 64: proto dQ 2.4 ms this way
             * against 3.2 pipelined at one CTA, H200); tiles through the
             * TMA ring, released as soon as dS.K is done */
            if (ntiles > 0) {
                fastCpWait<0>();
                fastTileBarrier<WG>(); /* q and dout landed */
            }
            for (int it = 0; it < ntiles; it++) {
                if (it > 0) produce(it + Ring::AHEAD);
                const int j = ring_base + it;
                ring.wait(j);
                float s[NT][4], dp[NT][4];
                fastWgRun(
                    [&] {
                        fastWgIssueAZt<NT, DK>(s, sQ, R, wg_row0, ring.k(j), KT, 0);
                        fastWgIssueAZt<NT, DV>(dp, sdO, R, wg_row0, ring.v(j), KT, 0);
                    },
                    s, dp);
                dsTile(s, dp, 0, it);
                uint32_t a[NT / 2][4];
                fastWgAFromC<NT>(a, s);
                fastWgRun([&] { fastWgIssuePZ<NT, DK>(dq[0], a, ring.k(j), KT, 0); }, dq[0]);
                ring.release(j);
            }
        } else {
            /* mma.sync, one tile at a time */
            for (int it = 0; it < ntiles; it++) {
                const int st = fastSyncStage(it, ntiles, loadKV);
                const bf16 *k_t = sK + st * KT * LDK, *v_t = sV + st * KT * LDV;
                float s[MT][NT][4], dp[MT][NT][4];
    #pragma unroll
                for (int mt = 0; mt < MT; mt++)
    #pragma unroll
                    for (int n = 0; n < NT; n++)
    #pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][n][e] = dp[mt][n][e] = 0.f;
                fastMmaAZtM<MT, NT, DK>(s, sQ, LDK, row0, k_t, LDK);
                fastMmaAZtM<MT, NT, DV>(dp, sdO, LDV, row0, v_t, LDV);
    #pragma unroll
                for (int mt = 0; mt < MT; mt++) dsTile(s[mt], dp[mt], mt, it);
                fastMmaPZM<MT, NT, DK>(dq, s, k_t, LDK);
                __syncthreads();
            }
        }
        fastCpWait<0>();
        if constexpr (WG) ring_base += ntiles;
        branch_no++;
    };
    if constexpr (TURNS) Turns::begin();
    (runBranch(br), ...);
    if constexpr (TURNS) Turns::end();
    fastCpWait<0>();

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = row0 + 16 * mt + grp + 8 * i;
            if (rowToken(r) < 0) continue;
            fastStoreDqRow<DK, ALL>(c, io, rowIndex(r), i, dq[mt]);
        }
    }
}

/* One query row of a dK/dV row stage as the score gradients read it: its
 * token (-1: none), lse in the log2 domain, delta and gate (a row that
 * adds nothing has gate 0). */
struct FastDkdvRow {
    int t;
    float lse2, delta, gate;
};

/* s (scores S^T of keys x NTH*8 rows) becomes g P^T, dp (dP^T) becomes
 * dS^T: p = exp2(s scale2 - lse2) where key ukey (+8 for the fragment's
 * second row half) is visible to the row, else 0. rowOf(col) is the
 * FastDkdvRow of score column col. FULL: every row sees every key - no
 * token read, no mask tested. Two instances, chosen once per tile by the
 * caller: as one loop with a per-element test the compiler kept the test
 * and the token loads in every tile in some builds, which cost the dK/dV
 * passes a third of their time (H200, paper 64k selected dK/dV 13.0 ->
 * 17.8 ms). */
template <bool FULL, int NTH, class RowOf, class Visible>
__device__ __forceinline__ void fastDkdvGradOfScores(const FastCtx &c, float (&s)[NTH][4],
                                                     float (&dp)[NTH][4], int ukey, int khi,
                                                     RowOf rowOf, Visible visible) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NTH; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = n * 8 + quad * 2 + (e & 1);
            const FastDkdvRow row = rowOf(col);
            bool ok = true;
            if constexpr (!FULL) {
                const int u = ukey + (e >> 1) * 8;
                ok = row.t >= 0 && u < khi && visible(row.t, u);
            }
            const float p = ok ? fastExp2(s[n][e] * c.scale_log2 - row.lse2) : 0.f;
            const float gp = row.gate * p;
            s[n][e] = gp;
            dp[n][e] = gp * (dp[n][e] - row.delta);
        }
    }
}

/* The probs-first pass's two halves of fastDkdvGradOfScores: s = g P^T
 * (zero where masked) in place, then, from those probabilities as the
 * bf16 A fragments ap of dV's product, dp = g P^T (dP^T - delta). */
template <bool FULL, int NTH, class RowOf, class Visible>
__device__ __forceinline__ void fastDkdvGatedProbs(const FastCtx &c, float (&s)[NTH][4], int ukey,
                                                   int khi, RowOf rowOf, Visible visible) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NTH; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const FastDkdvRow row = rowOf(n * 8 + quad * 2 + (e & 1));
            bool ok = true;
            if constexpr (!FULL) {
                const int u = ukey + (e >> 1) * 8;
                ok = row.t >= 0 && u < khi && visible(row.t, u);
            }
            s[n][e] = ok ? row.gate * fastExp2(s[n][e] * c.scale_log2 - row.lse2) : 0.f;
        }
    }
}
template <int NTH, class RowOf>
__device__ __forceinline__ void fastDkdvGradOfProbs(float (&dp)[NTH][4],
                                                    const uint32_t (&ap)[NTH / 2][4],
                                                    RowOf rowOf) {
    const int quad = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NTH; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            /* fastAFromC's packing: s[n][e] is ap[n / 2][(n & 1) * 2 + e / 2], low half for even e */
            const uint32_t pair = ap[n / 2][(n & 1) * 2 + (e >> 1)];
            const float gp = __uint_as_float(e & 1 ? pair & 0xffff0000u : pair << 16);
            dp[n][e] = gp * (dp[n][e] - rowOf(n * 8 + quad * 2 + (e & 1)).delta);
        }
    }
}

/* Probabilities first: where both the scores and
 * dP^T of a 64-row pass would not fit in registers beside dK's and dV's
 * accumulators (d_k or d_v above 128: 96 + 64 + 32 + 32 of 255), the pass
 * forms S^T alone, turns it into g P^T in bf16 (the A fragments dV's
 * product needs anyway), runs dP^T beside dV += g P^T.dout, and forms dS^T
 * from the bf16 probabilities: 208 live accumulator registers at the
 * peak, not 224. Three waits on the tensor cores per pass (two 32-row
 * passes had four), and P^T rounded to bf16 before dS^T is formed from it
 * (dS^T is rounded to bf16 after, as before; test_fast_attn's d_k = 192
 * gradients within 3.5e-3 of the reference, budget 1e-2). */
/* Only there: where the registers fit, the scores and dP^T together are
 * faster. */
template <int DK, int DV, int RH>
constexpr bool fastDkdvProbsFirst() {
    return RH == 64 && (DK > 128 || DV > 128);
}

/* One wgmma pass of the dK/dV core: rows half * RH .. + RH - 1 of a row
 * stage (q_st, do_st: swizzled tiles of R rows) against this warpgroup's
 * 64 keys (rows wg * 64 .. of the KT-row tiles sK, sV, the CTA's first key
 * u0):  S^T = K.Q^T, dP^T = V.dout^T, then (fastDkdvGradOfScores)
 * dv += g P^T.dout, dk += dS^T.q. rowOf(col) is the FastDkdvRow of stage
 * row half * RH + col; ads returns dS^T's A fragments. during() runs while
 * the first two products are on the tensor cores (it must not touch their
 * accumulators): the ring core's producer work, which at the top of the
 * stage held the other warps at the products' warpgroup-wide issue. */
struct FastNoop {
    __device__ void operator()() const {}
};
template <int DK, int DV, int KT, int R, int RH, class RowOf, class Visible,
          class During = FastNoop>
__device__ __forceinline__ void fastDkdvWgPass(const FastCtx &c, const bf16 *sK, const bf16 *sV,
                                               int wg, const bf16 *q_st, const bf16 *do_st,
                                               int half, int u0, int khi, bool full, RowOf rowOf,
                                               Visible visible, float (&dk)[DK / 8][4],
                                               float (&dv)[DV / 8][4],
                                               uint32_t (&ads)[RH / 16][4],
                                               During during = During{}) {
    constexpr int NTH = RH / 8;
    /* (warps past the key warpgroups': row warpgroups, the same keys) */
    const int ukey = u0 + (int)((threadIdx.x >> 5) & (KT / 16 - 1)) * 16 + (int)((threadIdx.x & 31) >> 2);
    if constexpr (fastDkdvProbsFirst<DK, DV, RH>()) {
        float s[NTH][4];
        fastWgFenceAcc(s);
        fastWgArrive();
        fastWgIssueAZt<NTH, DK>(s, sK, KT, wg * 64, q_st, R, half * RH);
        fastWgCommit();
        during();
        fastWgWait<0>();
        fastWgFenceAcc(s);
        if (full) fastDkdvGatedProbs<true>(c, s, ukey, khi, rowOf, visible);
        else fastDkdvGatedProbs<false>(c, s, ukey, khi, rowOf, visible);
        uint32_t ap[NTH / 2][4];
        fastWgAFromC<NTH>(ap, s);
        float dp[NTH][4];
        fastWgFenceAcc(dp);
        fastWgFenceAcc(dv);
        fastWgArrive();
        fastWgIssueAZt<NTH, DV>(dp, sV, KT, wg * 64, do_st, R, half * RH);
        fastWgIssuePZ<NTH, DV>(dv, ap, do_st, R, half * RH);
        fastWgCommit();
        fastWgWait<0>();
        fastWgFenceAcc(dp);
        fastWgFenceAcc(dv);
        fastDkdvGradOfProbs(dp, ap, rowOf);
        fastWgAFromC<NTH>(ads, dp);
        fastWgRun([&] { fastWgIssuePZ<NTH, DK>(dk, ads, q_st, R, half * RH); }, dk);
        return;
    }
    float s[NTH][4], dp[NTH][4];
    fastWgFenceAcc(s);
    fastWgFenceAcc(dp);
    fastWgArrive();
    fastWgIssueAZt<NTH, DK>(s, sK, KT, wg * 64, q_st, R, half * RH);
    fastWgIssueAZt<NTH, DV>(dp, sV, KT, wg * 64, do_st, R, half * RH);
    fastWgCommit();
    during();
    fastWgWait<0>();
    fastWgFenceAcc(s);
    fastWgFenceAcc(dp);
    if (full) fastDkdvGradOfScores<true>(c, s, dp, ukey, khi, rowOf, visible);
    else fastDkdvGradOfScores<false>(c, s, dp, ukey, khi, rowOf, visible);
    uint32_t ap[NTH / 2][4];
    fastWgAFromC<NTH>(ap, s);
    fastWgAFromC<NTH>(ads, dp);
    fastWgRun(
        [&] {
            fastWgIssuePZ<NTH, DV>(dv, ap, do_st, R, half * RH);
            fastWgIssuePZ<NTH, DK>(dk, ads, q_st, R, half * RH);
        },
        dv, dk);
}

/* Hands a warp's dK (times the scale) and dV rows - keys u0 + warp * 16 +
 * grp (+ 8) of the CTA's, in C-fragment layout - to store(u, is_k, col,
 * v0, v1), two adjacent columns at a time; keys from khi on are skipped. */
template <int DK, int DV, class Store>
__device__ __forceinline__ void fastDkdvStore(const FastCtx &c, int u0, int khi,
                                              const float (&dk)[DK / 8][4],
                                              const float (&dv)[DV / 8][4], Store store) {
    const int lane = threadIdx.x & 31, quad = lane & 3;
    const int keyA = (int)(threadIdx.x >> 5) * 16 + (lane >> 2);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int u = u0 + keyA + i * 8;
        if (u >= khi) continue;
#pragma unroll
        for (int n = 0; n < DK / 8; n++)
            store(u, true, n * 8 + quad * 2, dk[n][2 * i] * c.scale, dk[n][2 * i + 1] * c.scale);
#pragma unroll
        for (int n = 0; n < DV / 8; n++)
            store(u, false, n * 8 + quad * 2, dv[n][2 * i], dv[n][2 * i + 1]);
    }
}

/* acc[0 .. D/8) += A . tile[k0, k0 + 16)[0, D) on mma.sync: A one 16 x 16
 * fragment (rows of keys), tile row-major with row stride ld - dV += P^T dO
 * and dK += dS^T Q of the mma.sync dK/dV loop, 16 query rows at a time. */
template <int D>
__device__ __forceinline__ void fastMmaRowsOfTile(float (&acc)[D / 8][4], const uint32_t (&a)[4],
                                                  const bf16 *tile, int ld, int k0) {
#pragma unroll
    for (int dd = 0; dd < D / 16; dd++) {
        uint32_t bb[4];
        fastLoadBCols(bb, tile, ld, k0, dd * 16);
        fastMma(acc[2 * dd], a, bb[0], bb[1]);
        fastMma(acc[2 * dd + 1], a, bb[2], bb[3]);
    }
}

/* dK, dV of one tile of 64 * KWG keys [u0, khi), walking the row tiles of
 * FAST_DKDV_ROWS query rows (64 / hpg whole tokens) that may see them:
 *   P^T = exp2(K.Q^T s2 - lse2);  dP^T = V.dout^T;  dS^T = g P^T (dP^T - delta)
 *   dV = sum (g P^T) dout;  dK = scale sum dS^T Q.
 * A fixed row-tile order per CTA and no atomics: bit-reproducible.
 *
 * Pipeline, one barrier per row tile: the token indices of tile k arrive
 * two tiles ahead (a ring of 4 slots) (fetchToken(k, slot, dst) writes slot's token or -1 to
 * shared memory, directly or by a 4-byte async copy), so the rows of tile
 * k+1 - q, dout and their lse, delta and gate - are all async copies issued
 * while tile k computes; no thread waits on a global load in the loop.
 * Each warpgroup owns 64 keys [ka, ka + 64) of the CTA's and computes
 * only for row tiles where seesAny(k, ka, kb) (some row of tile k may see
 * a key of [ka, kb]); tileFull(k, t_first, ka) says every row of tile k
 * (first token t_first) sees every key of [ka, ka + 64).
 * store(u, is_k, col, v0, v1) writes two adjacent results of key u.
 * stageOut (wgmma only; FastNoStageOut: none) runs after each pass's dK/dV
 * products with what else the pass can give: stageOut(it, half, ads,
 * q_stage, do_stage, tok) - ads the A fragments of its dS^T (keys x rows
 * half * RH .. + RH - 1), the stage's q and dout tiles (the dout tile free
 * from here on, the q tile once every warp has passed a barrier), and the
 * row tile's tokens (fetchToken's slots). The fused selected backward
 * forms dq = dS.K there (fast_sel_block.cu). */
struct FastNoStageOut {
    template <class... A>
    __device__ void operator()(A &&...) const {}
};
template <int DK, int DV, bool WG, int KWG, class FetchToken, class Visible, class SeesAny,
          class TileFull, class Store, class StageOut = FastNoStageOut>
__device__ __forceinline__ void fastDkdvCore(const FastCtx &c, const FastBwdIo &io, int b, int g,
                                             int u0, int khi, int ntiles, FetchToken fetchToken,
                                             Visible visible, SeesAny seesAny, TileFull tileFull,
                                             Store store, StageOut stageOut = StageOut{}) {
    constexpr int LDK = DK + (WG ? 0 : 8), LDV = DV + (WG ? 0 : 8);
    constexpr int R = FAST_DKDV_ROWS, KT = 64 * KWG, THREADS = FAST_THREADS * KWG;
    static_assert(R <= FAST_THREADS, "one metadata thread per row");
    bf16 *sK = fastTileBase<WG>(), *sV = sK + KT * LDK, *sQ = sV + KT * LDV,
         *sdO = sQ + 2 * R * LDK;
    float *sL = (float *)(sdO + 2 * R * LDV), *sD = sL + 2 * R, *sG = sD + 2 * R;
    int *sT = (int *)(sG + 2 * R);
    int *sTok = sT + 2 * R; /* [4][R]: tokens of row tile k in ring slot k % 4 */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 2;
    const int hpg = c.hpg, tpr = R / hpg;

    fastLoadKeyTile<WG, KT, DK, DV, THREADS>(sK, sV, io.k, io.v, io.nkeys, c.G, b, g, u0, khi);
    auto fetchTokens = [&](int k) {
        if (k < ntiles && (int)threadIdx.x < tpr)
            fetchToken(k, (int)threadIdx.x, sTok + (k % 4) * R + threadIdx.x);
    };
    /* Row r of a row tile is token slot r / hpg, head r % hpg; a thread's
     * rows - the one it copies (fastTileRowOf) and its metadata row r =
     * threadIdx.x - are the same in every tile, so their slots and heads are
     * formed here once (divisions by the runtime hpg, per row and tile, had
     * been a tenth of this loop's instructions). Slot -1: a padding row. */
    struct RowSlot {
        int slot, head;
    };
    auto slotOf = [&](int r) { return RowSlot{r < tpr * hpg ? r / hpg : -1, r % hpg}; };
    const RowSlot ld_rs = slotOf(fastTileRowOf<R, THREADS>()), md_rs = slotOf((int)threadIdx.x);
    auto rowOf = [&](const int *tok, RowSlot rs, size_t &row) {
        if (rs.slot < 0) return false;
        int t = tok[rs.slot];
        if (t < 0) return false;
        row = ((size_t)b * c.S + t) * c.H + (size_t)g * hpg + rs.head;
        return true;
    };
    /* async copies of row tile k into stage k & 1 (its tokens are visible) */
    auto issueRows = [&](int k) {
        const int st = k & 1;
        const int *tok = sTok + (k % 4) * R;
        fastLoadTileFor<WG, R, DK, THREADS>(sQ + st * R * LDK, [&](int) -> const bf16 * {
            size_t row;
            return rowOf(tok, ld_rs, row) ? io.q + row * DK : nullptr;
        });
        fastLoadTileFor<WG, R, DV, THREADS>(sdO + st * R * LDV, [&](int) -> const bf16 * {
            size_t row;
            return rowOf(tok, ld_rs, row) ? io.dout + row * DV : nullptr;
        });
        if ((int)threadIdx.x < R) {
            const int r = threadIdx.x;
            size_t row = 0;
            const bool ok = rowOf(tok, md_rs, row);
            sT[st * R + r] = ok ? tok[md_rs.slot] : -1;
            fastCpAsync4(sL + st * R + r, ok ? io.lse + row : nullptr);
            fastCpAsync4(sD + st * R + r, ok ? io.dsum + row * 3 + io.branch : nullptr);
            fastCpAsync4(sG + st * R + r, ok ? io.gate_f + row * 3 + io.branch : nullptr);
        }
    };
    /* the thread that issued row r's metadata finishes it once its copies
     * landed: lse to the log2 domain; a row that sees nothing (lse = -inf)
     * gets token -1 and zero gate, delta (no gradient, never NaN) */
    auto finishRows = [&](int k) {
        if ((int)threadIdx.x < R) {
            const int i = (k & 1) * R + threadIdx.x;
            const float lse = sL[i];
            if (sT[i] >= 0 && lse != -INFINITY) {
                sL[i] = lse * FAST_LOG2E;
            } else {
                sT[i] = -1;
                sL[i] = 0.f;
                sD[i] = 0.f;
                sG[i] = 0.f;
            }
        }
    };
    fetchTokens(0);
    fetchTokens(1);
    fastCpCommit();
    fastCpWait<0>();
    __syncthreads();
    if (ntiles > 0) issueRows(0);
    fetchTokens(2);
    fastCpCommit();

    float dk[DK / 8][4], dv[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DK / 8; n++) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
#pragma unroll
    for (int n = 0; n < DV / 8; n++) dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
    const int keyA = warp * 16 + grp;
    /* this warpgroup's keys [ka, kb] */
    const int wg = KWG > 1 ? warp >> 2 : 0, ka = u0 + wg * 64, kb = min(khi, ka + 64) - 1;

    for (int it = 0; it < ntiles; it++) {
        const int st = it & 1;
        fastCpWait<0>(); /* rows of tile it, tokens of tile it + 2 */
        finishRows(it);
        fastTileBarrier<WG>(); /* ... visible to all; stage st ^ 1 is free again */
        if (it + 1 < ntiles) issueRows(it + 1);
        fetchTokens(it + 3);
        fastCpCommit();
        const int t_first = sTok[(it % 4) * R]; /* slot (it + 3) % 4 is being refilled */
        /* no row of the tile sees this warpgroup's keys: nothing to add
         * (warpgroup-uniform, so the wgmma below stay whole) */
        if constexpr (KWG > 1) /* one warpgroup: the caller's row tiles all see key u0 */
            if (ka > kb || !seesAny(it, ka, kb)) continue;
        /* every row of the tile sees all 64 keys: no mask (rows without a
         * gradient carry gate 0, so they add nothing either way) */
        const bool full = kb - ka == 63 && tileFull(it, t_first, ka);
        /* rows per pass: the mma.sync path holds a 16 x 32 score tile per
         * warp; wgmma takes the whole 64-row stage in one m64n64 pass where
         * the dK/dV accumulators leave room (d_k, d_v <= 128) */
        constexpr int RH = (WG && DK <= 128 && DV <= 128) ? FAST_DKDV_WG_ROWS : 32, NTH = RH / 8;
        const float *l_t = sL + st * R, *d_t = sD + st * R, *g_t = sG + st * R;
        const int *t_t = sT + st * R;
#pragma unroll 1
        for (int half = 0; half < R / RH; half++) {
            const int h0 = half * RH; /* the pass's first row of the stage */
            auto rowOf = [&](int col) {
                return FastDkdvRow{t_t[h0 + col], l_t[h0 + col], d_t[h0 + col], g_t[h0 + col]};
            };
            if constexpr (WG) {
                uint32_t ads[NTH / 2][4];
                fastDkdvWgPass<DK, DV, KT, R, RH>(c, sK, sV, wg, sQ + st * R * LDK,
                                                  sdO + st * R * LDV, half, u0, khi, full, rowOf,
                                                  visible, dk, dv, ads);
                if constexpr (!std::is_same<StageOut, FastNoStageOut>::value)
                    stageOut(it, half, ads, sQ + st * R * LDK, sdO + st * R * LDV,
                             sTok + (it % 4) * R);
            } else {
                const bf16 *q_t = sQ + (st * R + h0) * LDK, *do_t = sdO + (st * R + h0) * LDV;
                float s[NTH][4], dp[NTH][4];
#pragma unroll
                for (int n = 0; n < NTH; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
                fastMmaAZt<NTH, DK>(s, sK, LDK, warp * 16, q_t, LDK);
                fastMmaAZt<NTH, DV>(dp, sV, LDV, warp * 16, do_t, LDV);
                if (full) fastDkdvGradOfScores<true>(c, s, dp, u0 + keyA, khi, rowOf, visible);
                else fastDkdvGradOfScores<false>(c, s, dp, u0 + keyA, khi, rowOf, visible);
#pragma unroll
                for (int ks = 0; ks < NTH / 2; ks++) {
                    uint32_t a[4];
                    fastAFromC(a, s[2 * ks], s[2 * ks + 1]);
                    fastMmaRowsOfTile<DV>(dv, a, do_t, LDV, ks * 16);
                    fastAFromC(a, dp[2 * ks], dp[2 * ks + 1]);
                    fastMmaRowsOfTile<DK>(dk, a, q_t, LDK, ks * 16);
                }
            }
        } /* half */
    }
    fastCpWait<0>();
    fastDkdvStore<DK, DV>(c, u0, khi, dk, dv, store);
}

/* No sums hook (fastDkdvRingCore): the sums go out through the store functor. */
struct FastNoSums {
    template <class K, class V>
    __device__ void operator()(const K &, const V &) const {}
};
/* No per-row payload beside the token (fastDkdvRingCore). */
struct FastNoAux {
    __device__ const int *operator()(int, int) const { return nullptr; }
};
/* The value a listed row's token and payload take where there is none:
 * copied like the real ones, so that every row's copy is asynchronous. */
static __device__ const int fastMinusOne = -1;

/* ---- The dK/dV core on a TMA row ring (wgmma) ----
 *
 * fastDkdvCore above copies each row stage with 16-byte cp.async from every
 * thread and makes it visible with a CTA barrier per row tile - the
 * structure the forward and dQ loops had before their key tiles came by
 * TMA (fast_tma.cuh). Here the stages form a ring: one warp's lanes issue
 * a stage's q and dout panels as TMA boxes of whole tokens (FastRowMaps)
 * AHEAD tiles early, the first R threads issue its per-row lse, delta and
 * gate (and, gathering, the row's token) as 4-byte cp.async tracked by the
 * stage's full mbarrier, and every warp waits for the stage it needs and
 * releases it after its products: no barrier across the CTA in the loop.
 *
 * Tokens: consecutive (GATHER false: the window and compressed passes,
 * tokens(it, slot) = the token of slot `slot` of row tile it, -1 past the
 * rows that carry a gradient, slot 0 always a real position, one box per
 * panel) or listed (GATHER true: tokens(it, slot) = the address of the
 * token in the caller's list, NULL past its end; a box per token and
 * panel, the token read a tile before it is needed).
 *
 * GATHER may carry a second int per row, aux(it, slot) (the address of the
 * payload beside the token in the caller's list), and take a stageOut
 * (one key warpgroup) that runs after each pass as fastDkdvCore's does -
 * stageOut(it, half, ads, q_stage, do_stage, row) with row(r) = (token,
 * payload) of stage row r, -1 where none. Its plain stores to the stage
 * are fenced from the TMA's before the stage is released.
 *
 * Shared layout (FastDkdvRing): K, V, the q and dout stages, full and empty
 * barriers, then per slot of a ring of MS row-data slots the raw lse, delta,
 * gate (and token, payload) of each row, each row's token slot (-1: a
 * padding row, which no box writes: zeroed once), and EXTRA bytes of the
 * caller's at EXTRA_AT. */
/* Row tiles the ring's producer issues ahead (at most STAGES - 1). One
 * measured best (H200, paper 64k compressed dK/dV: 15.69 ms at one ahead,
 * 15.95 at two, 15.83 at three; proto 64k 2.04, 2.17, 2.17): with rows
 * from L2 a tile's compute covers the copies, and one ahead leaves a
 * four-stage ring three tiles of slack between the fastest and slowest
 * warps. */
/* The warp that issues the row boxes of the dK/dV ring (the row data are
 * warps 0 and 1's). H100, paper 64k: fwd+bwd 101.10 -> 98.75 ms with the
 * boxes on warp 2 rather than 0, 16k 67.31 -> 65.86. */
/* RWG > 1 (row warpgroups): the CTA's RWG warpgroups share one K/V tile
 * and take its row tiles in turn - warpgroup w the tiles it = w (mod RWG),
 * each with its own producer, stages (it % STAGES) and row-data slots (it %
 * MS), so that each runs a ring of STAGES / RWG stages of its own, one
 * ahead - and add their dK/dV sums in warpgroup order at the end. It keeps
 * 8 warps on an SM where one CTA's shared memory leaves room for one only
 * (d_k = 192: K/V 40 KB, 40 KB a stage), at the cost of one K/V copy. */
template <int DK, int DV, int KWG, bool GATHER, bool AUX = false, int EXTRA = 0, int RWG = 1>
struct FastDkdvRing {
    static_assert(KWG == 1 || RWG == 1, "key and row warpgroups do not mix");
    static constexpr int R = FAST_DKDV_ROWS, KT = 64 * KWG, MS = 8;
    /* CTAs per SM the registers allow (two key or row warpgroups: one; d_k
     * = d_v = 64: three; else two) */
    static constexpr int CTAS = KWG > 1 || RWG > 1 ? 1 : (DK + DV <= 128 ? 3 : 2);
    static constexpr int bytes(int stages) {
        return KT * (DK + DV) * 2 + stages * R * (DK + DV) * 2 + 2 * stages * 8 +
               MS * R * 4 * (3 + GATHER + AUX) + R * 4 + 1024 + EXTRA;
    }
    static constexpr bool fits(int stages) { return CTAS * (bytes(stages) + 1024) <= 233472; }
    static constexpr int STAGES = fits(4) ? 4 : fits(3) && RWG == 1 ? 3 : 2;
    /* warps hold one stage at a time: the producer may run STAGES - 1 ahead
     * (RWG > 1: FAST_DKDV_AHEAD of the warpgroup's own tiles) */
    static constexpr int AHEAD =
        RWG > 1 ? FAST_DKDV_AHEAD * RWG
                : (FAST_DKDV_AHEAD < STAGES ? FAST_DKDV_AHEAD : STAGES - 1);
    static_assert(RWG == 1 || (STAGES % RWG == 0 && AHEAD < STAGES && MS % RWG == 0),
                  "each row warpgroup owns the stages and slots of its own tiles");
    static constexpr int SMEM = bytes(STAGES); /* EXTRA bytes for the caller at the end */
    static constexpr int EXTRA_AT = SMEM - EXTRA - 1024;  /* their offset from the 1024-aligned base */
    /* a warp at tile it writes the row data of tile it + AHEAD; every warp
     * is past tile it - 1 - STAGES then (its stage was refilled for tile
     * it - 1, which this warp waited for). RWG > 1: the slots of a
     * warpgroup's tiles are its own, and it is past its tile it - STAGES. */
    static_assert(MS >= STAGES + AHEAD + 1, "a row-data slot is rewritten only once no warp reads it");
    /* the dK/dV sums of warpgroups 1 .. RWG - 1, in the stages at the end */
    static_assert(RWG == 1 || (RWG - 1) * FAST_THREADS * (DK + DV) / 2 * 4 <= STAGES * R * (DK + DV) * 2,
                  "the row warpgroups' sums fit the stages");
};

/* Rows per wgmma pass of the ring core: FAST_DKDV_WG_ROWS at every d_k,
 * d_v - where either is above 128 as probabilities first
 * (fastDkdvProbsFirst), since a 64-row pass's scores and dP^T beside the
 * 64 x 192 dK accumulator spill. A caller may ask for other rows
 * (PASS_ROWS: the fused selected backward, selFusedPassRows). */
template <int DK, int DV, int KWG, bool GATHER, int EXTRA = 0, int RWG = 1, int PASS_ROWS = 0,
          class Tokens, class Visible, class SeesAny, class TileFull, class Store,
          class Aux = FastNoAux, class StageOut = FastNoStageOut, class Sums = FastNoSums>
__device__ __forceinline__ void fastDkdvRingCore(const FastCtx &c, const FastBwdIo &io,
                                                 const FastRowMaps &maps, int b, int g, int u0,
                                                 int khi, int ntiles, Tokens tokens,
                                                 Visible visible, SeesAny seesAny,
                                                 TileFull tileFull, Store store, Aux aux = Aux{},
                                                 StageOut stageOut = StageOut{},
                                                 bool defer_release = false, Sums sums = Sums{}) {
    constexpr bool HAS_AUX = !std::is_same<Aux, FastNoAux>::value;
    constexpr bool HAS_OUT = !std::is_same<StageOut, FastNoStageOut>::value;
    static_assert(GATHER || !HAS_AUX, "payloads need listed tokens");
    static_assert(!HAS_OUT || (GATHER && KWG == 1), "stageOut: listed tokens, one key warpgroup");
    using Ring = FastDkdvRing<DK, DV, KWG, GATHER, HAS_AUX, EXTRA, RWG>;
    constexpr int R = Ring::R, KT = Ring::KT, MS = Ring::MS, STAGES = Ring::STAGES;
    constexpr int AHEAD = Ring::AHEAD, THREADS = FAST_THREADS * KWG * RWG;
    constexpr int RH = PASS_ROWS ? PASS_ROWS : FAST_DKDV_WG_ROWS, NTH = RH / 8;
    bf16 *sK = fastTileBase<true>(), *sV = sK + KT * DK, *sQ = sV + KT * DV;
    bf16 *sdO = sQ + STAGES * R * DK;
    uint64_t *full = (uint64_t *)(sdO + STAGES * R * DV), *empty = full + STAGES;
    float *mL = (float *)(empty + STAGES), *mD = mL + MS * R, *mG = mD + MS * R;
    int *mT = (int *)(mG + MS * R);               /* GATHER: [MS][R] row tokens */
    int *mA = mT + (GATHER ? MS * R : 0);         /* HAS_AUX: [MS][R] row payloads */
    int *rowSlot = mA + (HAS_AUX ? MS * R : 0);   /* [R] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* RWG > 1: this thread's row warpgroup, and its thread and warp in it */
    const int rwg = RWG > 1 ? warp >> 2 : 0, gtid = RWG > 1 ? tid & 127 : tid,
              gwarp = RWG > 1 ? warp & 3 : warp;
    const int hpg = c.hpg, tpr = R / hpg, rows = tpr * hpg;
    const uint32_t tx_bytes = (uint32_t)rows * 128 * ((DK + DV) / 64);
    /* defer_release: stageOut's bulk stores of tile it may still read its
     * stage when it returns; the stage is released in tile it + 1, under
     * its first products and before the producer waits for it */
    const bool defer = HAS_OUT && defer_release;

    fastLoadKeyTile<true, KT, DK, DV, THREADS>(sK, sV, io.k, io.v, io.nkeys, c.G, b, g, u0, khi);
    fastCpCommit();
    if (rows < R) { /* padding rows: never written by a box, read by the products */
        constexpr int CH = (DK + DV) / 8; /* 16-byte chunks per row of q and dout */
        for (int i = tid; i < STAGES * (R - rows) * CH; i += THREADS) {
            const int st = i / ((R - rows) * CH), rest = i % ((R - rows) * CH);
            const int r = rows + rest / CH, ch = rest % CH;
            bf16 *at = ch < DK / 8 ? sQ + st * R * DK + (ch / 8) * R * 64 + r * 64 + (ch % 8) * 8
                                   : sdO + st * R * DV + ((ch - DK / 8) / 8) * R * 64 + r * 64 +
                                         ((ch - DK / 8) % 8) * 8;
            *(uint4 *)at = make_uint4(0, 0, 0, 0);
        }
    }
    for (int r = tid; r < R; r += THREADS) rowSlot[r] = r < rows ? r / hpg : -1;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            fastMbarInit(&full[s], 1 + R); /* the producer's, and each row's row data */
            fastMbarInit(&empty[s], THREADS / 32 / RWG); /* its warpgroup's warps */
        }
        fastMbarInitFence();
    }
    /* The first tiles' rows are issued before K/V is waited for, so that
     * their token reads and boxes overlap its load rather than follow it:
     * at one CTA per SM (d_k = 192) nothing else hides a work item's start. */
    __syncthreads(); /* rowSlot and barriers visible */

    /* row data thread r < R (of each row warpgroup): row r of every tile
     * (of the warpgroup's) - token slot, head */
    const int my_slot = gtid < R ? rowSlot[gtid] : -1, my_head = gtid % hpg;
    auto tokenAt = [&](int it, int slot) -> int { /* GATHER: a global read */
        if constexpr (GATHER) {
            const int *p = slot >= 0 && it < ntiles ? tokens(it, slot) : nullptr;
            return p ? *p : -1;
        } else {
            return slot >= 0 ? tokens(it, slot) : -1;
        }
    };
    /* The producer's work is split over three warps: the row data of rows
     * 0-63 (threads tid < R: warps 0 and 1) and the boxes (BOX_WARP), each
     * of about the same length; with the boxes on warp 0 too, that warp
     * came to the next warpgroup-wide product last (ncu, paper 64k fused
     * selected backward: 21% of the stall samples on that issue). */
    constexpr int BOX_WARP = FAST_DKDV_BOX_WARP;
    static_assert(BOX_WARP < 4 * KWG, "the boxes' warp is one of the CTA's");
    /* tokens of the next tile to issue (this warpgroup's first, then j +
     * RWG after tile j): this row's, and (BOX_WARP) lane's slot */
    int next_row_tok = gtid < R ? tokenAt(rwg, my_slot) : -1;
    int next_box_tok[2] = {-1, -1}; /* slots lane and lane + 32 (tpr <= 64) */
    if (GATHER && gwarp == BOX_WARP)
#pragma unroll
        for (int k = 0; k < 2; k++) next_box_tok[k] = tokenAt(rwg, lane + 32 * k < tpr ? lane + 32 * k : -1);
    auto issue = [&](int j) { /* tile j into stage j % STAGES, row data slot j % MS */
        const int s = j % STAGES;
        if (gwarp == BOX_WARP) {
            if (lane == 0) {
                if (j >= STAGES) fastMbarWait(&empty[s], (uint32_t)(j / STAGES + 1) & 1u);
                fastMbarArriveTx(&full[s], tx_bytes);
            }
            __syncwarp();
            bf16 *q_st = sQ + s * R * DK, *do_st = sdO + s * R * DV;
            if constexpr (GATHER) {
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    const int slot = lane + 32 * k;
                    if (slot < tpr) { /* past the list: a box past S, zeros */
                        const int t = next_box_tok[k] >= 0 ? next_box_tok[k] : c.S;
#pragma unroll
                        for (int p = 0; p < DK / 64; p++)
                            fastTmaLoad4(q_st + p * R * 64 + slot * hpg * 64, &maps.q, p * 64,
                                         g * hpg, t, b, &full[s]);
#pragma unroll
                        for (int p = 0; p < DV / 64; p++)
                            fastTmaLoad4(do_st + p * R * 64 + slot * hpg * 64, &maps.dout, p * 64,
                                         g * hpg, t, b, &full[s]);
                    }
                    next_box_tok[k] = tokenAt(j + RWG, slot < tpr ? slot : -1);
                }
            } else if (lane == 0) {
                const int t0 = tokens(j, 0);
#pragma unroll
                for (int p = 0; p < DK / 64; p++)
                    fastTmaLoad4(q_st + p * R * 64, &maps.q, p * 64, g * hpg, t0, b, &full[s]);
#pragma unroll
                for (int p = 0; p < DV / 64; p++)
                    fastTmaLoad4(do_st + p * R * 64, &maps.dout, p * 64, g * hpg, t0, b, &full[s]);
            }
        }
        if (gtid < R) {
            const int t = next_row_tok, ms = j % MS, r = gtid;
            const size_t row = ((size_t)b * c.S + (t < 0 ? 0 : t)) * c.H + (size_t)g * hpg + my_head;
            fastCpAsync4Or0(mL + ms * R + r, t >= 0 ? io.lse + row : nullptr, io.lse);
            fastCpAsync4Or0(mD + ms * R + r, t >= 0 ? io.dsum + row * 3 + io.branch : nullptr,
                            io.lse);
            fastCpAsync4Or0(mG + ms * R + r, t >= 0 ? io.gate_f + row * 3 + io.branch : nullptr,
                            io.lse);
            if constexpr (GATHER) /* -1 where the row has no token */
                fastCpAsync4(mT + ms * R + r, t >= 0 ? tokens(j, my_slot) : &fastMinusOne);
            if constexpr (HAS_AUX)
                fastCpAsync4(mA + ms * R + r, t >= 0 ? aux(j, my_slot) : &fastMinusOne);
            fastMbarArriveCpAsync(&full[s]);
            next_row_tok = tokenAt(j + RWG, my_slot);
        }
    };
    /* each warpgroup its own first tiles (RWG = 1: tiles 0 .. AHEAD - 1) */
    for (int j = rwg; j < AHEAD && j < ntiles; j += RWG) issue(j);
    fastCpWait<0>(); /* K/V (the rows' cp.async are not in a group: their barrier tracks them) */
    fastWgProxyFence();
    __syncthreads(); /* K/V and the zeroed rows visible to the products */

    float dk[DK / 8][4], dv[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DK / 8; n++) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.f;
#pragma unroll
    for (int n = 0; n < DV / 8; n++) dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.f;
    /* this warpgroup's keys [ka, kb] */
    const int wg = KWG > 1 ? warp >> 2 : 0, ka = u0 + wg * 64, kb = min(khi, ka + 64) - 1;

    for (int it = rwg; it < ntiles; it += RWG) {
        /* the producer's part of tile it + AHEAD (BOX_WARP's boxes, the row
         * data of the first R threads): under this tile's first products
         * where the pass runs, else here */
        bool issued = it + AHEAD >= ntiles, released = !(defer && it >= RWG);
        auto produce = [&] {
            if (!released) { /* this warpgroup's last tile's stage, once its bulk stores have read it */
                __syncwarp();
                if (lane == 0) {
                    fastBulkWaitRead();
                    fastMbarArrive(&empty[(it - RWG) % STAGES]);
                }
                released = true;
            }
            if (!issued) issue(it + AHEAD);
            issued = true;
        };
        const int s = it % STAGES, ms = it % MS;
        fastMbarWait(&full[s], (uint32_t)(it / STAGES) & 1u);
        __syncwarp();
        /* a warpgroup whose keys no row of the tile sees adds nothing; it
         * still waits for the tile first, so that its release counts
         * toward this use of the stage */
        const bool runs = KWG == 1 || (ka <= kb && seesAny(it, ka, kb));
        /* stageOut's row r of tile it: (token or -1, payload or -1) */
        auto stageRow = [&](int it, int ms, int r) {
            int t;
            if constexpr (GATHER) t = mT[ms * R + r];
            else t = rowSlot[r] >= 0 ? tokens(it, rowSlot[r]) : -1;
            return make_int2(t, HAS_AUX ? mA[ms * R + r] : -1);
        };
        if (runs) {
            const float *l_t = mL + ms * R, *d_t = mD + ms * R, *g_t = mG + ms * R;
            const int *t_t = mT + ms * R;
            int t_first;
            if constexpr (GATHER) t_first = t_t[0];
            else t_first = tokens(it, 0);
            const bool full_tile = kb - ka == 63 && tileFull(it, t_first, ka);
#pragma unroll 1
            for (int half = 0; half < R / RH; half++) {
                const int h0 = half * RH;
                auto rowOf = [&](int col) {
                    const int r = h0 + col;
                    int t;
                    if constexpr (GATHER) t = t_t[r];
                    else t = tokens(it, rowSlot[r]);
                    return FastDkdvRow{rowSlot[r] >= 0 ? t : -1, l_t[r] * FAST_LOG2E, d_t[r], g_t[r]};
                };
                uint32_t ads[NTH / 2][4];
                fastDkdvWgPass<DK, DV, KT, R, RH>(c, sK, sV, wg, sQ + s * R * DK,
                                                  sdO + s * R * DV, half, u0, khi, full_tile,
                                                  rowOf, visible, dk, dv, ads, produce);
                if constexpr (HAS_OUT)
                    stageOut(it, half, ads, sQ + s * R * DK, sdO + s * R * DV,
                             [&](int r) { return stageRow(it, ms, r); });
            }
        }
        produce(); /* where no pass ran */
        /* stageOut wrote the stage by plain stores; the next writes to it
         * are the TMA's */
        if constexpr (HAS_OUT) fastWgProxyFence();
        __syncwarp();
        if (lane == 0 && !defer) fastMbarArrive(&empty[s]);
    }
    if (defer && lane == 0) fastBulkWaitRead(); /* the last stage's stores, before the CTA ends */
    if constexpr (RWG > 1) {
        /* warpgroups 1 .. RWG - 1 leave their sums in the stages (drained:
         * every issued tile was waited for), warpgroup 0 adds them in order
         * and stores; per thread, its fragments' 4 (DK + DV) / 8 floats,
         * [float][thread] so that a warp's stores meet no bank twice */
        constexpr int NF = (DK + DV) / 2;
        float *sums = (float *)sQ;
        __syncthreads(); /* every warp is past its last stage */
        if (rwg > 0) {
            float *mine = sums + (size_t)(rwg - 1) * NF * FAST_THREADS + gtid;
#pragma unroll
            for (int n = 0; n < DK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) mine[(n * 4 + e) * FAST_THREADS] = dk[n][e];
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) mine[(DK / 2 + n * 4 + e) * FAST_THREADS] = dv[n][e];
        }
        __syncthreads();
        if (rwg > 0) return;
#pragma unroll 1
        for (int w = 1; w < RWG; w++) {
            const float *theirs = sums + (size_t)(w - 1) * NF * FAST_THREADS + gtid;
#pragma unroll
            for (int n = 0; n < DK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) dk[n][e] += theirs[(n * 4 + e) * FAST_THREADS];
#pragma unroll
            for (int n = 0; n < DV / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) dv[n][e] += theirs[(DK / 2 + n * 4 + e) * FAST_THREADS];
        }
    }
    /* sums(dk, dv), where given, takes the sums (dK unscaled) instead of
     * store. The threads of warpgroup 0 call it (RWG > 1: with the other
     * warpgroups' sums added); other warps of that warpgroup may still be
     * reading the ring's shared memory, so it syncs the warpgroup before
     * it writes there. */
    if constexpr (!std::is_same<Sums, FastNoSums>::value) sums(dk, dv);
    else fastDkdvStore<DK, DV>(c, u0, khi, dk, dv, store);
}

/* The dK/dV pass of a branch whose row tiles are runs of consecutive
 * tokens (window, compressed): tokenOf(it, slot) gives the token of row
 * tile it's slot, -1 for none. On wgmma through the TMA row ring
 * (fastDkdvRingCore, one box per tile), else through fastDkdvCore's
 * cp.async stages - one rule for both. */
template <int DK, int DV, bool WG, int KWG, class TokenOf, class Visible, class SeesAny,
          class TileFull, class Store>
__device__ __forceinline__ void fastDkdvConsecutive(const FastCtx &c, const FastBwdIo &io,
                                                    const FastRowMaps &maps, int b, int g, int u0,
                                                    int khi, int ntiles, TokenOf tokenOf,
                                                    Visible visible, SeesAny seesAny,
                                                    TileFull tileFull, Store store) {
    if constexpr (WG)
        fastDkdvRingCore<DK, DV, KWG, false>(c, io, maps, b, g, u0, khi, ntiles, tokenOf, visible,
                                             seesAny, tileFull, store);
    else
        fastDkdvCore<DK, DV, WG, KWG>(
            c, io, b, g, u0, khi, ntiles,
            [=](int it, int slot, int *dst) { *dst = tokenOf(it, slot); }, visible, seesAny,
            tileFull, store);
}

/* The row maps of a dK/dV pass on the ring core (c.wgmma; zeroed maps
 * otherwise): boxes of a row tile's FAST_DKDV_ROWS / hpg tokens, or of one
 * token where the pass gathers its rows. Returns the encode status; host
 * only, no device work. */
static inline cudaError_t fastDkdvRowMaps(const FastCtx &c, const FastBwdIo &io, int dk, int dv,
                                          bool gather, FastRowMaps *maps) {
    memset(maps, 0, sizeof(*maps));
    if (!c.wgmma) return cudaSuccess;
    return fastTmaEncodeRowMaps(c.tma_encode, maps, io.q, io.dout, c.B, c.S, c.H, dk, dv, c.hpg,
                                gather ? 1 : FAST_DKDV_ROWS / c.hpg);
}

/* Sets a kernel's dynamic shared memory limit (above 48 KB needs opt-in). */
template <class Kernel>
static inline cudaError_t fastSetSmem(Kernel kernel, int bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

/* Enqueues a query-tile kernel (an instance of fastFwdKernel or
 * fastDqKernel, threads per CTA from its FastQTile) over `tokens` tokens of
 * every batch row (the forward's all, a dQ pass's t_end - t_begin): one CTA
 * per rows / hpg whole tokens of each (b, g). Returns the attribute or
 * launch status; never synchronises. */
template <class Kernel, class... Args>
static inline cudaError_t fastLaunchQTiles(Kernel kernel, int rows, int threads, int smem,
                                           int tokens, const FastCtx &c, cudaStream_t stream,
                                           Args... args) {
    cudaError_t e = fastSetSmem(kernel, smem);
    if (e != cudaSuccess) return e;
    const int tpc = rows / c.hpg;
    kernel<<<dim3((tokens + tpc - 1) / tpc, c.B * c.G), threads, smem, stream>>>(
        c, args...);
    return cudaGetLastError();
}

/* maps[i] = the TMA maps of branch i's keys and values (br.io.k, io.v, in
 * tiles of KEYS), in the branches' order. Host only; returns the first
 * encode error. */
template <int DK, int DV, int KEYS, class... Branches>
static inline cudaError_t fastTmaEncodeBranches(const FastCtx &c, FastKvMaps *maps,
                                                const Branches &...br) {
    cudaError_t e = cudaSuccess;
    int n = 0;
    ((e = e != cudaSuccess ? e
                           : fastTmaEncodeKv(c.tma_encode, &maps[n++], br.io.k, br.io.v, c.B,
                                             br.io.nkeys, c.G, DK, DV, KEYS)),
     ...);
    return e;
}

/* The forward tile kernel over one or more branches (FastFwdBranch, run in
 * turn on each q tile; io: q and the gate combine's inputs when COMBINE) on
 * this context's tensor-core path (c.wgmma: the key tiles by TMA, their
 * maps encoded here on the host); returns the encode, attribute or launch
 * status, never synchronises. */
template <int DK, int DV, bool COMBINE, class... Branches>
static inline cudaError_t fastLaunchForwardBranches(const FastCtx &c, const FastFwdIo &io,
                                                    cudaStream_t stream, Branches... br) {
    FastFwdMaps maps = {};
    if (c.wgmma) {
        cudaError_t e =
            fastTmaEncodeBranches<DK, DV, FastQTile<DV, true>::KEYS>(c, maps.br, br...);
        if (e != cudaSuccess) return e;
        using Q = FastQTile<DV, true>;
        return fastLaunchQTiles(fastFwdKernel<DK, DV, COMBINE, true, Branches...>, Q::FWD_ROWS,
                                Q::FWD_THREADS, fastFwdSmem<DK, DV, true>(), c.S, c, stream, io,
                                maps, br...);
    }
    using Q = FastQTile<DV>;
    return fastLaunchQTiles(fastFwdKernel<DK, DV, COMBINE, false, Branches...>, Q::FWD_ROWS,
                            Q::FWD_THREADS, fastFwdSmem<DK, DV>(), c.S, c, stream, io, maps, br...);
}
/* The forward of one policy's branch (io: its keys, o, lse, and the
 * combine's inputs when COMBINE). */
template <int DK, int DV, class Policy, bool COMBINE>
static inline cudaError_t fastLaunchForward(const FastCtx &c, const FastFwdIo &io, Policy pol,
                                            cudaStream_t stream) {
    return fastLaunchForwardBranches<DK, DV, COMBINE>(c, io, stream, FastFwdBranch<Policy>{io, pol});
}
/* The dQ tile kernel over one or more branches (FastDqBranch, run in
 * order) for the tokens [t_begin, t_end) of every batch row. Returns
 * cudaErrorInvalidValue for an empty or out-of-range token range, else the
 * encode, attribute or launch status; never synchronises. */
template <int DK, int DV, class... Branches>
static inline cudaError_t fastLaunchDq(const FastCtx &c, const FastBwdIo &io, int t_begin,
                                       int t_end, cudaStream_t stream, Branches... br) {
    if (t_begin < 0 || t_end <= t_begin || t_end > c.S) return cudaErrorInvalidValue;
    FastDqMaps maps = {};
    maps.t_begin = t_begin;
    maps.t_end = t_end;
    if (c.wgmma) {
        cudaError_t e =
            fastTmaEncodeBranches<DK, DV, FastQTile<DK, true>::KEYS>(c, maps.br, br...);
        if (e != cudaSuccess) return e;
        return fastLaunchQTiles(fastDqKernel<DK, DV, true, Branches...>, FAST_QTILE_ROWS,
                                FastQTile<DK, true>::THREADS, fastDqSmem<DK, DV, true>(),
                                t_end - t_begin, c, stream, io, maps, br...);
    }
    return fastLaunchQTiles(fastDqKernel<DK, DV, false, Branches...>, FAST_QTILE_ROWS,
                            FastQTile<DK>::THREADS, fastDqSmem<DK, DV>(), t_end - t_begin, c,
                            stream, io, maps, br...);
}
template <class Policy>
static inline FastDqBranch<Policy> fastDqBranch(const FastBwdIo &io, Policy pol) {
    return FastDqBranch<Policy>{io, pol};
}

#endif
