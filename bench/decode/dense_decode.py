#!/usr/bin/env python3
"""dense_decode.py - the baseline for bench_decode: a dense-attention
transformer of the same shape (prototype-125m: dim 768, 12 layers, 12 heads,
2 KV groups, d_k = d_v = 64, SiLU MLP 3072, V 256, RMSNorm, RoPE) decoding
with a bf16 KV cache in PyTorch, attention by scaled_dot_product_attention
(GQA through enable_gqa where this torch has it, else K/V expanded).

    dense_decode.py CONTEXT BATCH [--steps N] [--mode eager|graph]

The cache holds CONTEXT random keys and values per layer (the cost of dense
attention does not depend on their values); each timed step appends the new
token at position CONTEXT (the same slot every step, so shapes are static)
and attends over CONTEXT + 1 keys, then copies the logits to the host, as
bench_decode does. `graph` captures the step in a torch CUDA graph (launch
overheads gone: the fair comparison); `eager` runs it op by op. Prints one
JSON object like bench_decode's, with "impl": "dense-eager" or "dense-graph".
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

DIM, LAYERS, HEADS, GROUPS, DK, DV, FFN, VOCAB = 768, 12, 12, 2, 64, 64, 3072, 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("context", type=int)
    ap.add_argument("batch", type=int)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--mode", choices=("eager", "graph"), default="graph")
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    B, T = a.batch, a.context
    g = torch.Generator(device=dev).manual_seed(1)

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=dev) * 0.02).to(dt)

    emb = w(VOCAB, DIM)
    wqkv = [w(HEADS * DK + GROUPS * (DK + DV), DIM) for _ in range(LAYERS)]
    wo = [w(DIM, HEADS * DV) for _ in range(LAYERS)]
    wfc = [w(FFN, DIM) for _ in range(LAYERS)]
    wproj = [w(DIM, FFN) for _ in range(LAYERS)]
    ones = torch.ones(DIM, device=dev, dtype=dt)
    head = w(VOCAB, DIM)
    kc = [torch.randn(B, GROUPS, T + 1, DK, generator=g, device=dev).to(dt) for _ in range(LAYERS)]
    vc = [torch.randn(B, GROUPS, T + 1, DV, generator=g, device=dev).to(dt) for _ in range(LAYERS)]
    theta = 10000.0 ** (-torch.arange(0, DK // 2, device=dev, dtype=torch.float64) * 2 / DK)
    cos = torch.cos(T * theta).to(torch.float32)
    sin = torch.sin(T * theta).to(torch.float32)
    try:  # enable_gqa came with torch 2.5
        z = torch.zeros(1, 2, 1, 8, device=dev, dtype=dt)
        F.scaled_dot_product_attention(z, z[:, :1], z[:, :1], enable_gqa=True)
        gqa = True
    except TypeError:
        gqa = False

    def rms(x, wt):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * wt

    def rope(x):  # [..., DK], split halves
        xf = x.float()
        x0, x1 = xf[..., : DK // 2], xf[..., DK // 2:]
        return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).to(dt)

    tok = torch.zeros(B, dtype=torch.long, device=dev)

    def step():
        x = emb[tok]
        for i in range(LAYERS):
            h = rms(x, ones) @ wqkv[i].t()
            q = rope(h[:, : HEADS * DK].view(B, HEADS, 1, DK))
            k = rope(h[:, HEADS * DK: HEADS * DK + GROUPS * DK].view(B, GROUPS, 1, DK))
            v = h[:, HEADS * DK + GROUPS * DK:].view(B, GROUPS, 1, DV)
            kc[i][:, :, T: T + 1] = k
            vc[i][:, :, T: T + 1] = v
            if gqa:
                o = F.scaled_dot_product_attention(q, kc[i], vc[i], enable_gqa=True)
            else:
                r = HEADS // GROUPS
                o = F.scaled_dot_product_attention(q, kc[i].repeat_interleave(r, 1),
                                                   vc[i].repeat_interleave(r, 1))
            x = x + o.reshape(B, HEADS * DV) @ wo[i].t()
            x = x + F.silu(rms(x, ones) @ wfc[i].t()) @ wproj[i].t()
        return (rms(x, ones) @ head.t()).float()

    if a.mode == "graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()

        def run():
            graph.replay()
            return out
    else:
        run = step
    host = torch.empty(B, VOCAB, dtype=torch.float32, pin_memory=True)
    for _ in range(5):
        host.copy_(run())
    torch.cuda.synchronize()
    ms = []
    for _ in range(a.steps):
        tok.random_(0, VOCAB, generator=g)
        t0 = time.perf_counter()
        host.copy_(run())  # synchronous: the logits are on the host after this
        ms.append((time.perf_counter() - t0) * 1e3)
    mean = sum(ms) / len(ms)
    kv = LAYERS * (T + 1) * GROUPS * (DK + DV) * 2
    print(json.dumps({"impl": "dense-" + a.mode, "batch": B, "context": T, "steps": a.steps,
                      "ms_per_step": round(mean, 4), "ms_per_step_p50": round(statistics.median(ms), 4),
                      "tok_per_s": round(B * 1e3 / mean, 1), "kv_bytes_per_token": kv,
                      "gqa": "enable_gqa" if gqa else "expanded", "torch": torch.__version__}))


if __name__ == "__main__":
    main()
