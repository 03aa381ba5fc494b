/* gpu_dp.cu - the CUDA engine's data parallelism on the GPU machine: one
 * rank per GPU, each a thread with its own model and NCCL handle (as nsad
 * drives them), the production config (bf16) on real text.
 *
 *   gpu_dp world1 [STEPS]             one GPU: a model alone and an NCCL
 *                                     model of world 1 take the same steps;
 *                                     losses, weights and moments must be
 *                                     bit for bit the same ("DP WORLD1 PASS")
 *   gpu_dp agree N STEPS [TEXT]       N GPUs (micro-batch b on rank b) against
 *                                     one GPU accumulating the same N micro-
 *                                     batches: every step's loss within bf16
 *                                     tolerance ("DP AGREE PASS")
 *   gpu_dp repeat N STEPS [TEXT]      two N-GPU runs: bit-identical losses
 *                                     and weights ("DP REPEAT PASS")
 *   gpu_dp train N STEPS STATE EVERY [TEXT]
 *                                     an N-GPU run that resumes from STATE
 *                                     when it exists and saves it every EVERY
 *                                     steps (temp + rename; moments gathered);
 *                                     prints "loss STEP <hex>" per step, for
 *                                     dp_checks.sh's kill -9 comparison
 *   gpu_dp stall N                    rank N-1 sleeps in a collective at step 3
 *                                     ("DP STALL PASS": the others fail by the
 *                                     deadline, naming the wait; no hang)
 *   gpu_dp exit N                     rank N-1's thread stops at step 3 as if
 *                                     its process had died ("DP EXIT PASS")
 *   gpu_dp proc RANK WORLD IDFILE STEPS
 *                                     one rank per process (rank 0 writes the
 *                                     NCCL id to IDFILE), train's shape and
 *                                     data: dp_checks.sh compares its losses
 *                                     with a one-process run, and kills one
 *                                     with -9 and expects the others to fail
 *                                     by the deadline
 *   gpu_dp bench N S B STEPS          tokens/s on 1 and N GPUs, the scaling
 *                                     factor, communication time and the share
 *                                     the backward hides ("BENCH-DP ...")
 * Environment: DP_TIMEOUT (seconds, default 60; stall/exit use 10) is the
 * transport's deadline. NCCL_NVLS_ENABLE=0 is set unless already set.
 * TEXT defaults to build/data/fortunes.txt. */
#include "gpu_util.h"

#include <pthread.h>
#include <unistd.h>

#define MAX_WORLD 8

/* ---- data: sample k is a window of the text drawn from (seed, k) alone,
 * so a global batch is the same samples whatever the GPU count ---- */

typedef struct Text {
    unsigned char *bytes;
    size_t size, split;   /* [0, split) trains */
} Text;

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void loadText(Text *t, const char *path, int S) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s (give TEXT)\n", path); exit(2); }
    fseek(f, 0, SEEK_END);
    t->size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    t->bytes = (unsigned char *)malloc(t->size);
    if (!t->bytes || fread(t->bytes, 1, t->size, f) != t->size) { fprintf(stderr, "short read\n"); exit(2); }
    fclose(f);
    t->split = t->size / 20 * 19;
    if (t->split < (size_t)S + 2) { fprintf(stderr, "%s too short for S %d\n", path, S); exit(2); }
}

/* B samples from sample index k0 on. */
static void samples(const Text *t, uint64_t k0, int B, int S, int32_t *tok, int32_t *tgt) {
    for (int b = 0; b < B; b++) {
        const size_t at = mix(0x6e7361ull ^ (k0 + (uint64_t)b)) % (t->split - (size_t)S - 1);
        for (int i = 0; i < S; i++) {
            tok[(size_t)b * S + i] = t->bytes[at + i];
            tgt[(size_t)b * S + i] = t->bytes[at + i + 1];
        }
    }
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static double timeoutSeconds(double dflt) {
    const char *v = getenv("DP_TIMEOUT");
    return v && atof(v) > 0 ? atof(v) : dflt;
}

/* ---- one run: `world` ranks (threads, GPU r each), `accum` micro-batches ---- */

typedef struct Run {
    int world, accum, B, S, steps;
    int nccl;                 /* 0: a model alone (world 1) */
    const Text *text;
    double timeout;
    NsaCommId id;
    const char *state;        /* train: resume/save file */
    int save_every;
    int stall_rank, exit_rank, fault_step;  /* -1: none */
    int print_losses;
    /* results */
    double loss[MAX_WORLD][4096];
    int rc[MAX_WORLD];
    NsaError err[MAX_WORLD];
    int done[MAX_WORLD];      /* the thread returned */
    int resumed_at;
    uint64_t weights_hash, moments_hash;  /* rank 0's weights, the gathered moments */
    double seconds;           /* steps after the first two, wall */
    int timed_steps;
    NsaCommStats comm;        /* rank 0's, summed over the timed steps */
    NsaComm *comms[MAX_WORLD];
    NsaModel *models[MAX_WORLD];
} Run;

typedef struct RankArg {
    Run *run;
    int rank;
} RankArg;

static double lrAt(int s) {
    const double max_lr = 6e-4, min_lr = 6e-5;
    return s <= 20 ? max_lr * s / 20.0 : min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(M_PI * s / 4000.0));
}

/* Collective over every rank: the whole tensors of one arena, in layout
 * order, into buf (rank 0's copy is what the callers use). */
static int gatherArena(NsaModel *m, NsaArena arena, float *buf, NsaError *err) {
    for (int i = 0; i < nsaModelNumTensors(m); i++) {
        const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
        if (nsaModelGatherTensor(m, arena, i, buf + ti->offset, err)) return -1;
    }
    return 0;
}

/* The state file: step, then params, adam_m, adam_v (layout order). */
static int saveState(Run *run, NsaModel *m, int rank, int step, float *buf, NsaError *err) {
    const size_t n = nsaModelNumParams(m);
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", run->state);
    FILE *f = rank == 0 ? fopen(tmp, "wb") : NULL;
    if (rank == 0 && !f) return nsaErrorf(err, "cannot write %s", tmp);
    int ok = !f || fwrite(&step, sizeof step, 1, f) == 1;
    const NsaArena arenas[3] = {NSA_ARENA_PARAMS, NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    for (int a = 0; a < 3; a++) {
        memset(buf, 0, n * sizeof(float));
        if (gatherArena(m, arenas[a], buf, err)) {
            if (f) fclose(f);
            return -1;
        }
        if (f) ok = ok && fwrite(buf, sizeof(float), n, f) == n;
    }
    if (f) {
        ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, run->state) != 0) return nsaErrorf(err, "saving %s failed", run->state);
        printf("saved %d\n", step);
        fflush(stdout);
    }
    return 0;
}

/* Every rank reads the file and keeps its part. Returns the step, 0 when
 * there is no file, -1 on error. */
static int loadState(Run *run, NsaModel *m, float *buf, NsaError *err) {
    FILE *f = fopen(run->state, "rb");
    if (!f) return 0;
    const size_t n = nsaModelNumParams(m);
    int step = 0;
    int ok = fread(&step, sizeof step, 1, f) == 1;
    const NsaArena arenas[3] = {NSA_ARENA_PARAMS, NSA_ARENA_ADAM_M, NSA_ARENA_ADAM_V};
    for (int a = 0; a < 3 && ok; a++) {
        ok = fread(buf, sizeof(float), n, f) == n;
        for (int i = 0; ok && i < nsaModelNumTensors(m); i++)
            ok = !nsaModelSetTensor(m, arenas[a], i, buf + nsaModelTensorInfo(m, i)->offset, err);
    }
    fclose(f);
    if (!ok) return nsaErrorf(err, "%s is not a state of this run", run->state);
    return step;
}

static void *rankMain(void *p) {
    RankArg *a = (RankArg *)p;
    Run *run = a->run;
    const int r = a->rank;
    NsaError *err = &run->err[r];
    run->rc[r] = -1;
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);   /* the production (prototype 125M) model */
    NsaEngineOptions o;
    memset(&o, 0, sizeof o);
    o.device = NSA_DEVICE_CUDA;
    o.device_ordinal = r;
    o.precision = NSA_PREC_BF16;
    o.max_batch = run->B;
    o.max_seq_len = run->S;
    NsaComm *comm = NULL;
    if (run->nccl) {
        comm = nsaCommNcclCreate(&run->id, r, run->world, r, run->timeout, err);
        if (!comm) goto out;
        run->comms[r] = comm;
    }
    o.comm = comm;
    {
        NsaModel *m = nsaModelCreate(&c, &o, err);
        if (!m) goto out;
        run->models[r] = m;
        if (nsaModelInit(m, 1234, err)) goto out;
        const size_t N = (size_t)run->B * run->S, arena = nsaModelNumParams(m);
        /* a rank with B rows of every micro-batch: the ranks' rows are
         * consecutive samples, as the accumulating run's micro-batches */
        int32_t *tok = (int32_t *)malloc(N * 4), *tgt = (int32_t *)malloc(N * 4);
        float *buf = (float *)calloc(arena, sizeof(float));
        int first = 1;
        if (run->state) {
            first = loadState(run, m, buf, err);
            if (first < 0) goto out;
            if (r == 0 && first > 0) printf("resumed after step %d\n", first);
            run->resumed_at = first;
            first++;
        }
        const uint64_t per_step = (uint64_t)run->B * run->accum * run->world;
        double t0 = 0;
        for (int s = first; s <= run->steps; s++) {
            if (s == 3) t0 = nowSeconds();
            if (s == run->fault_step && r == run->stall_rank) nsaCommInjectStall(comm, 3600);
            if (s == run->fault_step && r == run->exit_rank) {
                snprintf(err->message, sizeof err->message, "rank %d stopped at step %d (fault)", r, s);
                run->rc[r] = 1;   /* as if the process had died: nothing freed, nothing aborted */
                run->done[r] = 1;
                return NULL;
            }
            NsaOptimConfig oc = {(float)lrAt(s), 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
            if (nsaModelZeroGrad(m, err)) goto out;
            for (int k = 0; k < run->accum; k++) {
                const uint64_t k0 = (uint64_t)(s - 1) * per_step + ((uint64_t)k * run->world + r) * run->B;
                samples(run->text, k0, run->B, run->S, tok, tgt);
                if (nsaModelForward(m, tok, tgt, run->B, run->S, 1.0f / run->accum, err) ||
                    (k + 1 == run->accum ? nsaModelBackwardReduce(m, err) : nsaModelBackward(m, err)))
                    goto out;
            }
            NsaStepStats st;
            if (nsaModelOptimizerStep(m, &oc, s, err) || nsaModelStepStats(m, &st, err)) goto out;
            if (s <= 4096) run->loss[r][s - 1] = st.loss;
            if (s >= 3 && r == 0) {
                NsaCommStats cs;
                if (nsaModelCommStats(m, &cs, err)) goto out;
                run->comm.reduce_seconds += cs.reduce_seconds;
                run->comm.exposed_seconds += cs.exposed_seconds;
                run->comm.gather_seconds += cs.gather_seconds;
                run->comm.bytes_sent = cs.bytes_sent;
            }
            if (r == 0 && run->print_losses) {
                printf("loss %d %a (%.4f)\n", s, st.loss, st.loss);
                fflush(stdout);
            }
            if (run->state && run->save_every > 0 && s % run->save_every == 0 &&
                saveState(run, m, r, s, buf, err))
                goto out;
        }
        if (run->steps >= 3) {
            run->seconds = nowSeconds() - t0;
            run->timed_steps = run->steps - 2;
        }
        /* the final state: weights (any rank's), moments gathered (collective) */
        uint64_t wh = 0xcbf29ce484222325ull, mh = wh;
        for (int i = 0; i < nsaModelNumTensors(m); i++) {
            const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
            if (nsaModelGetTensor(m, NSA_ARENA_PARAMS, i, buf + ti->offset, err)) goto out;
            wh = fnv(wh, buf + ti->offset, ti->numel * 4);
        }
        for (int a = NSA_ARENA_ADAM_M; a <= NSA_ARENA_ADAM_V; a++) {
            if (gatherArena(m, (NsaArena)a, buf, err)) goto out;
            for (int i = 0; i < nsaModelNumTensors(m); i++) {
                const NsaTensorInfo *ti = nsaModelTensorInfo(m, i);
                mh = fnv(mh, buf + ti->offset, ti->numel * 4);
            }
        }
        if (r == 0) {
            run->weights_hash = wh;
            run->moments_hash = mh;
        }
        free(tok);
        free(tgt);
        free(buf);
        run->rc[r] = 0;
    }
out:
    run->done[r] = 1;
    return NULL;
}

/* Runs every rank; when one fails (rc -1), aborts every handle (as nsad's
 * rank group does), so a rank blocked in a stall or a collective returns
 * too. A rank that stopped on purpose (rc 1, the exit fault) aborts
 * nothing: the others must find out by their deadline. Returns the number
 * of ranks that did not finish. */
static int runAll(Run *run) {
    if (run->nccl && nsaCommNcclUniqueId(&run->id, &run->err[0])) {
        fprintf(stderr, "unique id: %s\n", run->err[0].message);
        exit(1);
    }
    pthread_t th[MAX_WORLD];
    RankArg args[MAX_WORLD];
    memset(run->done, 0, sizeof run->done);
    for (int r = 0; r < run->world; r++) {
        args[r] = (RankArg){run, r};
        pthread_create(&th[r], NULL, rankMain, &args[r]);
    }
    int aborted = 0;
    for (;;) {
        int all = 1, failed = 0;
        for (int r = 0; r < run->world; r++) {
            all &= __atomic_load_n(&run->done[r], __ATOMIC_ACQUIRE);
            failed |= __atomic_load_n(&run->done[r], __ATOMIC_ACQUIRE) && run->rc[r] == -1;
        }
        if (all) break;
        if (failed && !aborted) {
            for (int r = 0; r < run->world; r++)
                if (run->comms[r]) nsaCommAbort(run->comms[r], "another rank failed");
            aborted = 1;
        }
        usleep(2000);
    }
    int bad = 0;
    for (int r = 0; r < run->world; r++) {
        pthread_join(th[r], NULL);
        if (run->rc[r]) {
            printf("# rank %d: %s\n", r, run->err[r].message);
            bad++;
        }
    }
    /* models before their handles (a stopped rank's too) */
    for (int r = 0; r < run->world; r++) {
        if (run->rc[r] == 1 && run->comms[r]) nsaCommAbort(run->comms[r], "rank stopped");
        cudaSetDevice(r);
        nsaModelFree(run->models[r]);
        nsaCommFree(run->comms[r]);
        run->models[r] = NULL;
        run->comms[r] = NULL;
    }
    return bad;
}

static Run *newRun(int world, int accum, int B, int S, int steps, int nccl, const Text *text,
                   double timeout) {
    Run *run = (Run *)calloc(1, sizeof(Run));
    run->world = world;
    run->accum = accum;
    run->B = B;
    run->S = S;
    run->steps = steps;
    run->nccl = nccl;
    run->text = text;
    run->timeout = timeout;
    run->stall_rank = run->exit_rank = run->fault_step = -1;
    return run;
}

static int visibleGpus(void) {
    int n = 0;
    GPU_OK(cudaGetDeviceCount(&n));
    return n;
}

static void needGpus(int n) {
    if (n < 1 || n > MAX_WORLD) { fprintf(stderr, "N must be 1 to %d\n", MAX_WORLD); exit(2); }
    if (visibleGpus() < n) {
        printf("SKIP: %d GPUs needed, %d visible\n", n, visibleGpus());
        exit(0);
    }
}

/* ---- modes ---- */

static int modeWorld1(int steps, const Text *text) {
    const int B = 2, S = 2048;
    Run *alone = newRun(1, 1, B, S, steps, 0, text, 60);
    Run *one = newRun(1, 1, B, S, steps, 1, text, timeoutSeconds(60));
    if (runAll(alone) || runAll(one)) { printf("DP WORLD1 FAIL (a run failed)\n"); return 1; }
    int same = 1;
    for (int s = 0; s < steps; s++) {
        const int eq = !memcmp(&alone->loss[0][s], &one->loss[0][s], sizeof(double));
        printf("step %d loss %.6f %.6f %s\n", s + 1, alone->loss[0][s], one->loss[0][s], eq ? "=" : "DIFFERS");
        same &= eq;
    }
    same &= alone->weights_hash == one->weights_hash && alone->moments_hash == one->moments_hash;
    printf("weights %016llx %016llx, moments %016llx %016llx\n", (unsigned long long)alone->weights_hash,
           (unsigned long long)one->weights_hash, (unsigned long long)alone->moments_hash,
           (unsigned long long)one->moments_hash);
    printf("DP WORLD1 %s steps=%d (NCCL world 1 against the engine alone, bit for bit)\n",
           same ? "PASS" : "FAIL", steps);
    return !same;
}

static int modeAgree(int N, int steps, const Text *text) {
    needGpus(N);
    const int B = 4, S = 2048;
    Run *ref = newRun(1, N, B, S, steps, 0, text, 60);     /* one GPU, N micro-batches */
    Run *dp = newRun(N, 1, B, S, steps, 1, text, timeoutSeconds(60));
    if (runAll(ref) || runAll(dp)) { printf("DP AGREE FAIL (a run failed)\n"); return 1; }
    double worst = 0, tol = 2e-2;
    int worst_step = 0, same_ranks = 1;
    for (int s = 0; s < steps && s < 4096; s++) {
        const double d = fabs(dp->loss[0][s] - ref->loss[0][s]) / fabs(ref->loss[0][s]);
        if (!(d <= worst)) { worst = d; worst_step = s + 1; }
        for (int r = 1; r < N; r++) same_ranks &= !memcmp(&dp->loss[r][s], &dp->loss[0][s], sizeof(double));
        if ((s + 1) % 25 == 0 || s == 0)
            printf("step %4d loss 1 GPU %.5f, %d GPUs %.5f (rel %.2e)\n", s + 1, ref->loss[0][s], N,
                   dp->loss[0][s], d);
    }
    const int ok = worst <= tol && same_ranks;
    printf("DP AGREE %s gpus=%d steps=%d B=%d S=%d worst_rel_loss_diff=%.3e at step %d (tolerance %.0e)%s\n",
           ok ? "PASS" : "FAIL", N, steps, B, S, worst, worst_step, tol,
           same_ranks ? "" : "; the ranks disagree on the loss");
    return !ok;
}

static int modeRepeat(int N, int steps, const Text *text) {
    needGpus(N);
    const int B = 4, S = 2048;
    Run *a = newRun(N, 1, B, S, steps, 1, text, timeoutSeconds(60));
    Run *b = newRun(N, 1, B, S, steps, 1, text, timeoutSeconds(60));
    if (runAll(a) || runAll(b)) { printf("DP REPEAT FAIL (a run failed)\n"); return 1; }
    int same = a->weights_hash == b->weights_hash && a->moments_hash == b->moments_hash;
    for (int s = 0; s < steps && s < 4096; s++)
        same &= !memcmp(&a->loss[0][s], &b->loss[0][s], sizeof(double));
    printf("DP REPEAT %s gpus=%d steps=%d weights %016llx %016llx\n", same ? "PASS" : "FAIL", N, steps,
           (unsigned long long)a->weights_hash, (unsigned long long)b->weights_hash);
    return !same;
}

static int modeTrain(int N, int steps, const char *state, int every, const Text *text) {
    needGpus(N);
    Run *run = newRun(N, 1, 4, 2048, steps, 1, text, timeoutSeconds(60));
    run->state = state;
    run->save_every = every;
    run->print_losses = 1;
    const int bad = runAll(run);
    printf("DP TRAIN %s gpus=%d steps=%d resumed_at=%d weights %016llx\n", bad ? "FAIL" : "DONE", N,
           steps, run->resumed_at, (unsigned long long)run->weights_hash);
    return bad != 0;
}

/* A rank that stalls in (stall) or leaves (exit) the job at step 3: the
 * others must fail within the deadline, naming what they waited for. */
static int modeFault(int N, int exit_not_stall, const Text *text) {
    needGpus(N);
    const double timeout = timeoutSeconds(10);
    Run *run = newRun(N, 1, 2, 2048, 6, 1, text, timeout);
    run->fault_step = 3;
    if (exit_not_stall) run->exit_rank = N - 1;
    else run->stall_rank = N - 1;
    const double t0 = nowSeconds();
    runAll(run);
    const double took = nowSeconds() - t0;
    /* every other rank failed; at least one by its own deadline */
    int failed = 1, by_deadline = 0;
    for (int r = 0; r < N - 1; r++) {
        failed &= run->rc[r] == -1;
        by_deadline |= strstr(run->err[r].message, "within") != NULL;
    }
    const int ok = failed && by_deadline && took < 3 * timeout + 60;
    printf("DP %s %s gpus=%d deadline=%.0f s whole run %.1f s; rank 0: %s\n",
           exit_not_stall ? "EXIT" : "STALL", ok ? "PASS" : "FAIL", N, timeout, took,
           run->err[0].message);
    return !ok;
}

/* One rank of a job of processes: rank 0 publishes the id in idfile. */
static int modeProc(int rank, int world, const char *idfile, int steps, const Text *text) {
    /* the shape and data of `train`: its losses compare bit for bit */
    Run *run = newRun(world, 1, 4, 2048, steps, 1, text, timeoutSeconds(30));
    if (rank == 0) {
        NsaError e = {{0}};
        if (nsaCommNcclUniqueId(&run->id, &e)) { fprintf(stderr, "%s\n", e.message); return 1; }
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s.tmp", idfile);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(&run->id, sizeof run->id, 1, f) != 1 || fclose(f) || rename(tmp, idfile)) {
            fprintf(stderr, "cannot write %s\n", idfile);
            return 1;
        }
    } else {
        FILE *f = NULL;
        for (int i = 0; i < 600 && !(f = fopen(idfile, "rb")); i++) usleep(100000);
        if (!f || fread(&run->id, sizeof run->id, 1, f) != 1) { fprintf(stderr, "no id in %s\n", idfile); return 1; }
        fclose(f);
    }
    /* this process is one rank: its thread runs rank `rank` on GPU 0 of
     * what CUDA_VISIBLE_DEVICES gives it */
    NsaError *err = &run->err[rank];
    NsaModelConfig c;
    nsaModelConfigDefaults(&c);
    NsaComm *comm = nsaCommNcclCreate(&run->id, rank, world, 0, run->timeout, err);
    if (!comm) { printf("DP PROC rank %d FAILED: %s\n", rank, err->message); return 1; }
    NsaEngineOptions o;
    memset(&o, 0, sizeof o);
    o.device = NSA_DEVICE_CUDA;
    o.device_ordinal = 0;
    o.precision = NSA_PREC_BF16;
    o.max_batch = run->B;
    o.max_seq_len = run->S;
    o.comm = comm;
    NsaModel *m = nsaModelCreate(&c, &o, err);
    int rc = !m || nsaModelInit(m, 1234, err);
    const size_t N = (size_t)run->B * run->S;
    int32_t *tok = (int32_t *)malloc(N * 4), *tgt = (int32_t *)malloc(N * 4);
    const double t0 = nowSeconds();
    for (int s = 1; !rc && s <= steps; s++) {
        samples(text, ((uint64_t)(s - 1) * world + rank) * (uint64_t)run->B, run->B, run->S, tok, tgt);
        NsaOptimConfig oc = {(float)lrAt(s), 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
        NsaStepStats st;
        rc = nsaModelZeroGrad(m, err) || nsaModelForward(m, tok, tgt, run->B, run->S, 1.0f, err) ||
             nsaModelBackwardReduce(m, err) || nsaModelOptimizerStep(m, &oc, s, err) ||
             nsaModelStepStats(m, &st, err);
        if (!rc) printf("rank %d step %d loss %.4f\n", rank, s, st.loss);
        if (!rc && rank == 0) printf("loss %d %a (%.4f)\n", s, st.loss, st.loss);
        fflush(stdout);
    }
    printf("DP PROC rank %d %s after %.1f s: %s\n", rank, rc ? "FAILED" : "DONE", nowSeconds() - t0,
           rc ? err->message : "all steps");
    fflush(stdout);
    nsaModelFree(m);
    nsaCommFree(comm);
    return rc;
}

static int modeBench(int N, int S, int B, int steps, const Text *text) {
    needGpus(N);
    if (steps < 4) steps = 4;
    Run *one = newRun(1, 1, B, S, steps, 0, text, 60);
    Run *many = newRun(N, 1, B, S, steps, 1, text, timeoutSeconds(120));
    if (runAll(one) || runAll(many)) { printf("BENCH-DP FAIL S=%d B=%d gpus=%d (a run failed)\n", S, B, N); return 1; }
    const double tok1 = (double)B * S * one->timed_steps / one->seconds;
    const double tokN = (double)B * S * N * many->timed_steps / many->seconds;
    const double k = many->timed_steps;
    const double red = many->comm.reduce_seconds / k, exp_s = many->comm.exposed_seconds / k;
    printf("BENCH-DP S=%d B=%d gpus=%d tok_s_1=%.0f tok_s_N=%.0f scaling=%.2fx step_ms_1=%.1f "
           "step_ms_N=%.1f reduce_ms=%.2f exposed_ms=%.2f hidden=%.0f%% gather_ms=%.2f "
           "bytes_per_step=%.0f\n",
           S, B, N, tok1, tokN, tokN / tok1, one->seconds / one->timed_steps * 1e3,
           many->seconds / many->timed_steps * 1e3, red * 1e3, exp_s * 1e3,
           red > 0 ? 100.0 * (1.0 - exp_s / red) : 0.0, many->comm.gather_seconds / k * 1e3,
           many->comm.bytes_sent);
    return 0;
}

int main(int argc, char **argv) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_dp world1|agree|repeat|train|stall|exit|proc|bench ... (see the "
                        "comment at the top of tests/gpu/gpu_dp.cu)\n");
        return 2;
    }
    const char *mode = argv[1];
    static Text text;
    const char *dflt = "build/data/fortunes.txt";
#define TEXT_ARG(i) (argc > (i) ? argv[i] : dflt)
    if (!strcmp(mode, "world1")) {
        loadText(&text, TEXT_ARG(3), 2048);
        return modeWorld1(argc > 2 ? atoi(argv[2]) : 10, &text);
    }
    if (!strcmp(mode, "agree") && argc >= 4) {
        loadText(&text, TEXT_ARG(4), 2048);
        return modeAgree(atoi(argv[2]), atoi(argv[3]), &text);
    }
    if (!strcmp(mode, "repeat") && argc >= 4) {
        loadText(&text, TEXT_ARG(4), 2048);
        return modeRepeat(atoi(argv[2]), atoi(argv[3]), &text);
    }
    if (!strcmp(mode, "train") && argc >= 6) {
        loadText(&text, TEXT_ARG(6), 2048);
        return modeTrain(atoi(argv[2]), atoi(argv[3]), argv[4], atoi(argv[5]), &text);
    }
    if ((!strcmp(mode, "stall") || !strcmp(mode, "exit")) && argc >= 3) {
        loadText(&text, TEXT_ARG(3), 2048);
        return modeFault(atoi(argv[2]), !strcmp(mode, "exit"), &text);
    }
    if (!strcmp(mode, "proc") && argc >= 6) {
        loadText(&text, TEXT_ARG(6), 2048);
        return modeProc(atoi(argv[2]), atoi(argv[3]), argv[4], atoi(argv[5]), &text);
    }
    if (!strcmp(mode, "bench") && argc >= 6) {
        loadText(&text, TEXT_ARG(6), atoi(argv[3]));
        return modeBench(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), &text);
    }
    fprintf(stderr, "gpu_dp: bad arguments for %s (see the comment at the top of tests/gpu/gpu_dp.cu)\n", mode);
    return 2;
}
