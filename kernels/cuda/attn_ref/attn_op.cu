/* attn_op.cu - the whole NSA attention op on device pointers (phi = avg),
 * the CUDA twin of nsaAttnForwardCpu / nsaAttnBackwardCpu: pool, compressed
 * attention, selection, selected and window attention, gate combine; the
 * backward recomputes the forward into the workspace and runs the branch
 * backwards. The model uses the branch launchers directly; this entry point
 * serves tests and benchmarks. */
#include "attn_common.cuh"

/* Workspace carve-up, in floats; shared by the size query and the launchers. */
typedef struct AttnOpWork {
    float *kc, *vc, *dkc, *dvc, *o[3], *d_o[3], *lse[3], *delta[3];
    int32_t *sel;
    size_t total;
} AttnOpWork;

static AttnOpWork attnOpCarve(const NsaAttnDims *d, float *base) {
    AttnOpWork w;
    const size_t N = (size_t)d->B * d->S;
    const size_t Nc = (size_t)nsaNumCmpBlocks(d->S, d->cmp_len, d->cmp_stride);
    const size_t pooled_k = (size_t)d->B * Nc * d->G * d->d_k;
    const size_t pooled_v = (size_t)d->B * Nc * d->G * d->d_v;
    const size_t o_elems = N * d->H * d->d_v, rows = N * d->H;
    size_t at = 0;
#define TAKE(ptr, n) do { (ptr) = base ? base + at : NULL; at += (n); } while (0)
    TAKE(w.kc, pooled_k);
    TAKE(w.vc, pooled_v);
    TAKE(w.dkc, pooled_k);
    TAKE(w.dvc, pooled_v);
    for (int c = 0; c < 3; c++) {
        TAKE(w.o[c], o_elems);
        TAKE(w.d_o[c], o_elems);
        TAKE(w.lse[c], rows);
        TAKE(w.delta[c], rows);
    }
    float *sel_as_float;
    TAKE(sel_as_float, N * d->G * (size_t)nsaNumSelSlots(d->n_sel));
    w.sel = (int32_t *)sel_as_float;
#undef TAKE
    w.total = at;
    return w;
}

size_t attnOpWorkspaceFloats(const NsaAttnDims *dims) { return attnOpCarve(dims, NULL).total; }

/* The forward into the workspace (o, lse, sel per branch). */
static int attnOpRun(const NsaAttnDims *d, const NsaAttnInputs *in, const AttnOpWork *w,
                     float *out, cudaStream_t stream, NsaError *err) {
    if (attnPoolAvgForward(w->kc, in->k_cmp, d->B, d->S, d->G, d->d_k, d->cmp_len, d->cmp_stride,
                           stream, err) ||
        attnPoolAvgForward(w->vc, in->v_cmp, d->B, d->S, d->G, d->d_v, d->cmp_len, d->cmp_stride,
                           stream, err) ||
        attnCmpForward(w->o[0], w->lse[0], in->q, w->kc, w->vc, d, stream, err) ||
        attnSelectBlocks(w->sel, in->q, w->kc, w->lse[0], d, stream, err) ||
        attnSelForward(w->o[1], w->lse[1], in->q, in->k_sel, in->v_sel, w->sel, d, stream, err) ||
        attnWinForward(w->o[2], w->lse[2], in->q, in->k_win, in->v_win, d, stream, err))
        return -1;
    if (out && attnGateCombineForward(out, in->gates, w->o[0], w->o[1], w->o[2], d, stream, err))
        return -1;
    return 0;
}

int attnOpForward(const NsaAttnDims *dims, const NsaAttnInputs *in, float *out, int32_t *sel_idx,
                  float *lse_cmp, float *workspace, cudaStream_t stream, NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    if (!in || !out || !workspace)
        return nsaErrorf(err,
                         "cuda attention: inputs, out and workspace are required (NULL given)");
    AttnOpWork w = attnOpCarve(dims, workspace);
    if (attnOpRun(dims, in, &w, out, stream, err)) return -1;
    const size_t N = (size_t)dims->B * dims->S;
    if (sel_idx)
        CUDA_CHECK(cudaMemcpyAsync(sel_idx, w.sel,
                                   N * dims->G * nsaNumSelSlots(dims->n_sel) * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, stream), err);
    if (lse_cmp)
        CUDA_CHECK(cudaMemcpyAsync(lse_cmp, w.lse[0], N * dims->H * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream), err);
    return 0;
}

int attnOpBackward(const NsaAttnDims *dims, const NsaAttnInputs *in, const float *dout,
                   const NsaAttnGrads *gr, float *workspace, cudaStream_t stream,
                   NsaError *err) {
    if (attnCudaCheckDims(dims, err)) return -1;
    if (!in || !dout || !gr || !workspace)
        return nsaErrorf(err, "cuda attention: inputs, dout, grads and workspace are required");
    const NsaAttnDims *d = dims;
    AttnOpWork w = attnOpCarve(d, workspace);
    if (attnOpRun(d, in, &w, NULL, stream, err)) return -1;
    const size_t rows = (size_t)d->B * d->S * d->H;
    if (attnGateCombineBackward(gr->dgates, w.d_o[0], w.d_o[1], w.d_o[2], dout, in->gates, w.o[0],
                                w.o[1], w.o[2], d, stream, err))
        return -1;
    for (int c = 0; c < 3; c++)
        if (attnRowDelta(w.delta[c], w.d_o[c], w.o[c], rows, d->d_v, stream, err)) return -1;
    if (attnWinBackward(gr->dq, 0, gr->dk_win, gr->dv_win, w.d_o[2], in->q, in->k_win, in->v_win,
                        w.lse[2], w.delta[2], d, stream, err) ||
        attnSelBackward(gr->dq, 1, gr->dk_sel, gr->dv_sel, w.d_o[1], in->q, in->k_sel, in->v_sel,
                        w.sel, w.lse[1], w.delta[1], d, stream, err) ||
        attnCmpBackward(gr->dq, 1, w.dkc, w.dvc, w.d_o[0], in->q, w.kc, w.vc, w.lse[0],
                        w.delta[0], d, stream, err) ||
        attnPoolAvgBackward(gr->dk_cmp, w.dkc, d->B, d->S, d->G, d->d_k, d->cmp_len,
                            d->cmp_stride, 0, stream, err) ||
        attnPoolAvgBackward(gr->dv_cmp, w.dvc, d->B, d->S, d->G, d->d_v, d->cmp_len,
                            d->cmp_stride, 0, stream, err))
        return -1;
    return 0;
}
