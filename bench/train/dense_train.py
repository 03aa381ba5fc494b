#!/usr/bin/env python3
"""dense_train.py - the dense baseline of `make bench-train`: a PyTorch model
of the production config's shape trained the way a user would pick instead
of nsad, timed like bench_train.

    bench/train/dense_train.py --seq 2048 --batch 64 [--backend cudnn|flash] [--steps N]
    bench/train/dense_train.py --ceiling

The model: byte vocabulary (256), dim 768, 12 layers, 12 query heads sharing
2 key/value groups, head dim 64, RMSNorm (eps 1e-6), RoPE on q and k (base
10000, pairs (i, i + d/2), as nsad's), full causal attention through
torch.nn.functional.scaled_dot_product_attention restricted to one backend
(cuDNN or FlashAttention-2), a 4x SiLU MLP, untied LM head. fp32 weights
with bf16 autocast, fused AdamW (0.9, 0.95, wd 0.1 on matrices), grad-norm
clip 1.0, the whole step (forward, loss, backward) under torch.compile. A
step is zero_grad, forward + backward, clip, optimizer step, and a read of
the loss (the host waits, like nsad's trainer). Tokens are random bytes,
fresh each step.

Prints one JSON line (impl "dense-<backend>"): S, B, ms_step (median of the
timed steps), tok_s, peak_gb (torch.cuda.max_memory_allocated), compile_s,
flops_per_token (the same count as nsaModelFlopsPerToken's dense_attention:
proto/model.md), loss; or {"impl", "S", "B", "error"} when the backend
refuses the shape or memory runs out. --ceiling prints the measured bf16
matrix rate and copy bandwidth instead, the MFU denominators.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

V, C, L, H, G, D = 256, 768, 12, 12, 2, 64
FF = 4 * C


def rope_tables(S, device):
    inv = 10000.0 ** (-torch.arange(0, D // 2, device=device, dtype=torch.float64) * 2.0 / D)
    ang = torch.arange(S, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def rope(x, cos, sin):
    # x [B, S, heads, D]; pairs (i, i + D/2)
    a, b = x[..., : D // 2], x[..., D // 2:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = nn.RMSNorm(C, eps=1e-6)
        self.wq = nn.Linear(C, H * D, bias=False)
        self.wk = nn.Linear(C, G * D, bias=False)
        self.wv = nn.Linear(C, G * D, bias=False)
        self.wo = nn.Linear(H * D, C, bias=False)
        self.mlp_norm = nn.RMSNorm(C, eps=1e-6)
        self.fc = nn.Linear(C, FF, bias=False)
        self.proj = nn.Linear(FF, C, bias=False)

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        h = self.attn_norm(x)
        q = rope(self.wq(h).view(B, S, H, D), cos, sin).transpose(1, 2)
        k = rope(self.wk(h).view(B, S, G, D), cos, sin).transpose(1, 2)
        v = self.wv(h).view(B, S, G, D).transpose(1, 2)
        k = k.repeat_interleave(H // G, dim=1)
        v = v.repeat_interleave(H // G, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(B, S, H * D))
        return x + self.proj(F.silu(self.fc(self.mlp_norm(x))))


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.norm = nn.RMSNorm(C, eps=1e-6)
        self.head = nn.Linear(C, V, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets, cos, sin):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


def flops_per_token(S):
    """The count of nsaModelFlopsPerToken (proto/model.md) for this model:
    6 x matrix parameters + 3 x 2 (d_k + d_v) per causal (query, key) pair."""
    layer = C * H * D + 2 * C * G * D + H * D * C + 2 * C * FF
    matmul = 6.0 * (L * layer + V * C)
    attention = 3.0 * 2.0 * (D + D) * H * L * (S + 1) / 2.0
    return matmul + attention


def ceiling():
    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    end.synchronize()
    tflops = 2.0 * n ** 3 * reps / (start.elapsed_time(end) * 1e-3) / 1e12
    x = torch.empty(2 * 1024 ** 3, device=dev, dtype=torch.uint8)
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        y.copy_(x)
    end.record()
    end.synchronize()
    tbs = 2.0 * x.numel() * reps / (start.elapsed_time(end) * 1e-3) / 1e12
    print(json.dumps({"impl": "ceiling", "bf16_tflops": round(tflops, 1),
                      "copy_tbs": round(tbs, 3), "device": torch.cuda.get_device_name()}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--backend", choices=("cudnn", "flash"), default="cudnn")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ceiling", action="store_true")
    args = ap.parse_args()
    if args.ceiling:
        ceiling()
        return 0
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[args.backend]
    S, B = args.seq, args.batch
    impl = "dense-" + args.backend
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = Dense().to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    cos, sin = rope_tables(S, dev)

    def loss_fn(tokens, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(tokens, targets, cos, sin)

    compiled = torch.compile(loss_fn)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    times, loss = [], float("nan")
    try:
        with sdpa_kernel([backend]):
            t_compile = time.time()
            for step in range(args.warmup + args.steps):
                tokens = torch.randint(0, V, (B, S), device=dev, generator=gen)
                targets = torch.randint(0, V, (B, S), device=dev, generator=gen)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                l = compiled(tokens, targets)
                l.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                opt.step()
                loss = l.item()
                t1 = time.perf_counter()
                if step == 0:
                    compile_s = time.time() - t_compile
                if step >= args.warmup:
                    times.append((t1 - t0) * 1e3)
    except (RuntimeError, torch.OutOfMemoryError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(json.dumps({"impl": impl, "S": S, "B": B, "error": msg[:300]}))
        return 0
    times.sort()
    ms = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
    print(json.dumps({"impl": impl, "S": S, "B": B, "steps": args.steps, "ms_step": round(ms, 3),
                      "tok_s": round(B * S / (ms * 1e-3)),
                      "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
                      "compile_s": round(compile_s, 1), "flops_per_token": flops_per_token(S),
                      "loss": round(loss, 5) if math.isfinite(loss) else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
