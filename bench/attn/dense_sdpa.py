#!/usr/bin/env python3
"""dense_sdpa.py - times PyTorch's dense causal attention, the baseline NSA must beat.

For each shape and sequence length it times scaled_dot_product_attention
(causal, bf16) forward and forward+backward with the FlashAttention-2 and the
cuDNN backends, batch chosen so that B x S >= 64k tokens, and prints one JSON
object per line: {"impl", "shape", "S", "B", "fwd_ms", "bwd_ms", "total_ms",
"peak_mib", "tflops"}. Timing: CUDA events, warm-up, median of repeats.
GQA: K/V carry G heads; SDPA's enable_gqa is used where the backend takes
it, else K/V are expanded to H heads (noted in the "gqa" field).
d_k != d_v (paper192, the NSA paper's d_k 192 / d_v 128): a backend that
refuses unequal head dims (SDPA's FA2 requires d_k = d_v) gets V zero-padded
to d_k and its output sliced back to d_v - what a user of that backend must
do - and the row says so ("v_padded": true). Nothing else changes: the
useful FLOPs stay those of d_k / d_v.
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {
    # name: (H, G, d_k, d_v)
    "proto": (12, 2, 64, 64),
    "paper": (64, 4, 128, 128),
    "paper192": (64, 4, 192, 128),
}
BACKENDS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def time_ms(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bench_one(impl, shape, S, tokens, reps):
    H, G, dk, dv = SHAPES[shape]
    B = max(1, tokens // S)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(1234 + S)
    q = torch.randn(B, H, S, dk, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    k = torch.randn(B, G, S, dk, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    v = torch.randn(B, G, S, dv, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    dout = torch.randn(B, H, S, dv, device=dev, dtype=torch.bfloat16, generator=gen)
    # the first of these forms the backend takes is used for every call:
    # GQA native or K/V expanded to H heads, V as it is or zero-padded to d_k
    forms = [(g, p) for p in (False, True) for g in ("native", "expanded") if dk != dv or not p]
    chosen = []

    def call(form):
        g, padded = form
        kk, vv = k, v
        if g == "expanded":
            rep = H // G
            kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        if padded:
            vv = F.pad(vv, (0, dk - dv))
        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=(g == "native"))
        return out[..., :dv] if padded else out

    # pick the form by a forward + backward: a backend may run a form's
    # forward and refuse its backward
    errors = []
    with sdpa_kernel([BACKENDS[impl]]):
        for form in forms:
            try:
                call(form).backward(dout)
            except RuntimeError as e:
                errors.append(str(e).splitlines()[0][:120])
                continue
            chosen.append(form)
            break
    if not chosen:
        raise RuntimeError("no form runs: " + " | ".join(errors))
    q.grad = k.grad = v.grad = None

    def attn():
        with sdpa_kernel([BACKENDS[impl]]):
            return call(chosen[0])

    def fwd():
        with torch.no_grad():
            attn()

    def fwd_bwd():
        out = attn()
        out.backward(dout)

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_ms = time_ms(fwd, reps=reps)
    total_ms = time_ms(fwd_bwd, reps=reps)
    peak = torch.cuda.max_memory_allocated()
    # useful causal FLOPs: QK^T and PV over the lower triangle, backward 2.5x forward
    flops_fwd = 2.0 * B * H * (S * (S + 1) / 2) * (dk + dv)
    flops = flops_fwd * 3.5
    return {
        "impl": impl, "shape": shape, "S": S, "B": B, "gqa": chosen[0][0], "v_padded": chosen[0][1],
        "fwd_ms": fwd_ms, "bwd_ms": total_ms - fwd_ms, "total_ms": total_ms,
        "peak_mib": peak / 2**20, "inputs_mib": base / 2**20,
        "tflops": flops / (total_ms * 1e-3) / 1e12,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", default="2048,8192,16384,32768,65536")
    ap.add_argument("--shapes", default="proto,paper,paper192")
    ap.add_argument("--impls", default="fa2,cudnn")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)
    for shape in args.shapes.split(","):
        for S in [int(s) for s in args.seq.split(",")]:
            for impl in args.impls.split(","):
                try:
                    r = bench_one(impl, shape, S, args.tokens, args.reps)
                except Exception as e:  # report, never hide
                    r = {"impl": impl, "shape": shape, "S": S, "error": str(e).splitlines()[0][:200]}
                print(json.dumps(r), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
