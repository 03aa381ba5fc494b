#!/usr/bin/env python3
"""nsa_numpy.py - run an nsad export with NumPy alone: held-out loss and text.

An export (`nsad export CHECKPOINT --out DIR`, proto/files.md) is a
model.safetensors and a config.json meant for other tools. This file is such a
tool: it reads both with nothing but NumPy and the standard library and runs
the NSA model as proto/model.md defines it - RMSNorm, split-halves RoPE, the
compressed (phi avg or mlp), selected and sliding-window branches mixed by
sigmoid gates, the SiLU or SwiGLU MLP - in float64, one sequence at a time,
the whole prefix at every position (no caches: a reference, not a server).

    scripts/nsa_numpy.py DIR eval --data FILE.txt [--seq-len N] [--max-tokens N]
    scripts/nsa_numpy.py DIR sample --prompt TEXT [--max-tokens N]
                         [--temperature T] [--top-k K] [--top-p P] [--seed S]

`eval` scores a text file the way `nsad eval` does: the byte stream cut into
consecutive windows of seq_len + 1 tokens (stride seq_len; a shorter tail is
not scored), mean loss in nats and bits per byte. `sample` picks tokens as
`nsad sample` does (daemon/sampler.h: greedy at temperature 0; else top-k,
then top-p, then a uniform draw from xoshiro256** seeded as NsaRng with the
seed and stream 0). Both print one JSON object.

As a module: `NsaModel(DIR)` then `model.logits(tokens)` ([S][V]) and
`model.near_ties`: the selection decisions of that call where the last
block chosen and the first left out scored within 1e-6 (relative) of each
other, where an engine's rounding may choose the other block.
tests/integration/test_export_numpy.py checks it against nsad's own engine.
"""
import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit(f"nsa_numpy.py: NumPy does not import in {sys.executable}: install it "
             "(Debian: apt-get install python3-numpy, then /usr/bin/python3; or pip install numpy)")

EXPORT_FORMAT = "nsad-export-1"


class ExportError(Exception):
    """An export this reader cannot use; the message names what and where."""


# ---- the files -------------------------------------------------------------------


def read_safetensors(path):
    """{name: float64 array} from a safetensors file of F32 or BF16 tensors."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ExportError(f"{path}: {len(blob)} bytes; a safetensors file starts with 8")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ExportError(f"{path}: header of {n} bytes runs past the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        shape = tuple(t["shape"])
        count = math.prod(shape)
        if t["dtype"] == "F32":
            arr = np.frombuffer(data[a:b], dtype="<f4", count=count).astype(np.float64)
        elif t["dtype"] == "BF16":
            bits = np.frombuffer(data[a:b], dtype="<u2", count=count).astype(np.uint32) << 16
            arr = bits.view(np.float32).astype(np.float64)
        else:
            raise ExportError(f"{path}: tensor {name} has dtype {t['dtype']}; allowed: F32, BF16")
        out[name] = arr.reshape(shape)
    return out


# ---- the model ---------------------------------------------------------------------


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(a):
    return a / (1.0 + np.exp(-a))


def softmax_masked(s, mask):
    """Softmax of s over its last axis where mask holds; rows that see
    nothing are all zero (proto/model.md: o = 0)."""
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(mask, np.exp(s - m), 0.0)
    z = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(z > 0, z, 1.0), m + np.log(np.where(z > 0, z, 1.0)), z[..., 0] > 0


class NsaModel:
    """The model of an export directory, weights widened to float64."""

    def __init__(self, export_dir):
        cfg_path = os.path.join(export_dir, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        if cfg.get("format") != EXPORT_FORMAT:
            raise ExportError(f"{cfg_path}: format {cfg.get('format')!r}; this reader knows "
                              f"{EXPORT_FORMAT!r}")
        self.cfg = cfg
        self.V, self.C, self.L = cfg["vocab_size"], cfg["dim"], cfg["n_layers"]
        self.H, self.G = cfg["n_heads"], cfg["n_kv_groups"]
        self.dk, self.dv, self.F = cfg["d_k"], cfg["d_v"], cfg["mlp_hidden"]
        self.mlp = cfg["mlp"]
        nsa = cfg["nsa"]
        self.l, self.d, self.ls = nsa["cmp_len"], nsa["cmp_stride"], nsa["sel_len"]
        self.n_sel, self.w, self.phi = nsa["n_sel"], nsa["window"], nsa["phi"]
        self.eps, self.rope_base = cfg["norm"]["eps"], cfg["rope"]["base"]
        if self.mlp not in ("silu", "swiglu") or self.phi not in ("avg", "mlp"):
            raise ExportError(f"{cfg_path}: mlp {self.mlp!r}, phi {self.phi!r}; "
                              "allowed: silu or swiglu, avg or mlp")
        if cfg["rope"]["pairing"] != "split_halves":
            raise ExportError(f"{cfg_path}: rope pairing {cfg['rope']['pairing']!r}; "
                              "allowed: split_halves")
        self.tokenizer = cfg["tokenizer"]["type"]
        self.t = read_safetensors(os.path.join(export_dir, "model.safetensors"))
        for spec in cfg["tensors"]:
            got = self.t.get(spec["name"])
            if got is None or list(got.shape) != spec["shape"]:
                raise ExportError(f"model.safetensors: tensor {spec['name']} is "
                                  f"{None if got is None else list(got.shape)}; config.json "
                                  f"says {spec['shape']}")
        for name, shape in self.expected_shapes().items():
            got = self.t.get(name)
            if got is None or got.shape != shape:
                raise ExportError(f"model.safetensors: tensor {name} is "
                                  f"{None if got is None else list(got.shape)}; the sizes in "
                                  f"config.json make it {list(shape)}")
        self.group_of = np.arange(self.H) // (self.H // self.G)
        self.near_ties = 0

    def expected_shapes(self):
        """{name: shape} of every tensor the model reads (proto/model.md)."""
        V, C, H, G, dk, dv, F, l = self.V, self.C, self.H, self.G, self.dk, self.dv, self.F, self.l
        if H % G:
            raise ExportError(f"config.json: n_kv_groups {G} does not divide n_heads {H}")
        out = {"tok_emb": (V, C), "final_norm": (C,), "lm_head": (V, C)}
        for i in range(self.L):
            p = f"layers.{i}."
            out.update({p + "attn_norm": (C,), p + "wq": (H * dk, C), p + "w_gate": (3 * H, C),
                        p + "wo": (C, H * dv), p + "mlp_norm": (C,), p + "w_fc": (F, C),
                        p + "w_proj": (C, F)})
            for c in ("cmp", "sel", "win"):
                out[p + "wk_" + c], out[p + "wv_" + c] = (G * dk, C), (G * dv, C)
            if self.mlp == "swiglu":
                out[p + "w_up"] = (F, C)
            if self.phi == "mlp":
                for kv, n in (("k", dk), ("v", dv)):
                    out.update({f"{p}phi_{kv}.pos": (l, n), f"{p}phi_{kv}.w1": (n, l * n),
                                f"{p}phi_{kv}.w2": (n, n)})
        return out

    def rope(self, x):
        """x [S][n][dk] rotated at positions 0 .. S-1, pairs (i, i + dk/2)."""
        S, half = x.shape[0], self.dk // 2
        theta = self.rope_base ** (-2.0 * np.arange(half) / self.dk)
        a = np.arange(S)[:, None] * theta[None, :]
        cos, sin = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)

    def pool(self, x, prefix, dim):
        """Compressed blocks [Nc][G][dim] of x [S][G][dim]: block i over
        tokens [i d, i d + l), phi = mean, or mean + w2 silu(w1 vec(X + pos))."""
        S = x.shape[0]
        Nc = (S - self.l) // self.d + 1 if S >= self.l else 0
        if Nc == 0:
            return np.zeros((0, self.G, dim))
        idx = np.arange(Nc)[:, None] * self.d + np.arange(self.l)[None, :]
        blocks = x[idx]                                   # [Nc][l][G][dim]
        out = blocks.mean(axis=1)
        if self.phi == "mlp":
            u = blocks + self.t[prefix + ".pos"][None, :, None, :]
            u = u.transpose(0, 2, 1, 3).reshape(Nc, self.G, self.l * dim)
            out = out + silu(u @ self.t[prefix + ".w1"].T) @ self.t[prefix + ".w2"].T
        return out

    def selection_mask(self, p_cmp, S):
        """[S][G][S] keys each (query, group) sees in the selected branch.
        p_cmp [S][H][Nc]: the compressed softmax (zero where not visible)."""
        ls, Nc = self.ls, p_cmp.shape[2]
        Ns = (S + ls - 1) // ls
        share = np.zeros((Nc, Ns))                        # M_ij = |block i n block j| / l
        for i in range(Nc):
            for j in range(Ns):
                lo, hi = max(i * self.d, j * ls), min(i * self.d + self.l, (j + 1) * ls)
                share[i, j] = max(0, hi - lo) / self.l
        p_group = np.zeros((S, self.G, Nc))
        np.add.at(p_group, (slice(None), self.group_of), p_cmp)
        score = p_group @ share                           # [S][G][Ns]
        mask = np.zeros((S, self.G, S), dtype=bool)
        for t in range(S):
            cur = t // ls
            forced = {0, cur} | ({cur - 1} if cur >= 2 else set())
            complete = (t + 1) // ls
            cands = [j for j in range(complete) if j not in forced]
            want = max(0, self.n_sel - len(forced))
            for g in range(self.G):
                ranked = sorted(cands, key=lambda j: (-score[t, g, j], j))
                chosen = forced | set(ranked[:want])
                if 0 < want < len(ranked):
                    a, b = score[t, g, ranked[want - 1]], score[t, g, ranked[want]]
                    if max(a, b) > 0 and a - b <= 1e-6 * max(a, b):
                        self.near_ties += 1
                for j in chosen:
                    mask[t, g, j * ls:min((j + 1) * ls, t + 1)] = True
        return mask

    def attention(self, q, k, v, mask):
        """softmax(scale q k^T) v per head over the keys mask [S][G][S] allows."""
        s = np.einsum("thd,uhd->thu", q, k[:, self.group_of]) / math.sqrt(self.dk)
        p, _, _ = softmax_masked(s, mask[:, self.group_of, :])
        return np.einsum("thu,uhd->thd", p, v[:, self.group_of])

    def layer(self, x, i):
        t, p = self.t, f"layers.{i}."
        S, H, G, dk, dv = x.shape[0], self.H, self.G, self.dk, self.dv
        xn = rmsnorm(x, t[p + "attn_norm"], self.eps)
        q = self.rope((xn @ t[p + "wq"].T).reshape(S, H, dk))
        k = {c: self.rope((xn @ t[p + "wk_" + c].T).reshape(S, G, dk)) for c in ("cmp", "sel", "win")}
        v = {c: (xn @ t[p + "wv_" + c].T).reshape(S, G, dv) for c in ("cmp", "sel", "win")}
        gates = 1.0 / (1.0 + np.exp(-(xn @ t[p + "w_gate"].T).reshape(S, H, 3)))
        # compressed: block i is visible at t when i d + l - 1 <= t
        kc, vc = self.pool(k["cmp"], p + "phi_k", dk), self.pool(v["cmp"], p + "phi_v", dv)
        Nc = kc.shape[0]
        if Nc == 0:   # S < l: no block, no compressed output, nothing to score
            p_cmp, o_cmp = np.zeros((S, H, 0)), np.zeros((S, H, dv))
        else:
            s = np.einsum("thd,ihd->thi", q, kc[:, self.group_of]) / math.sqrt(dk)
            visible = (np.arange(Nc)[None, :] * self.d + self.l - 1) <= np.arange(S)[:, None]
            p_cmp, _, _ = softmax_masked(s, np.broadcast_to(visible[:, None, :], s.shape))
            o_cmp = np.einsum("thi,ihd->thd", p_cmp, vc[:, self.group_of])
        o_sel = self.attention(q, k["sel"], v["sel"], self.selection_mask(p_cmp, S))
        pos = np.arange(S)
        win = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - self.w)
        o_win = self.attention(q, k["win"], v["win"], np.broadcast_to(win[:, None, :], (S, G, S)))
        y = gates[..., 0:1] * o_cmp + gates[..., 1:2] * o_sel + gates[..., 2:3] * o_win
        x = x + y.reshape(S, H * dv) @ t[p + "wo"].T
        xn = rmsnorm(x, t[p + "mlp_norm"], self.eps)
        act = silu(xn @ t[p + "w_fc"].T)
        if self.mlp == "swiglu":
            act = act * (xn @ t[p + "w_up"].T)
        return x + act @ t[p + "w_proj"].T

    def logits(self, tokens):
        """[S][V] next-token logits of one sequence (token ids, S >= 1)."""
        self.near_ties = 0
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or len(tokens) == 0 or tokens.min() < 0 or tokens.max() >= self.V:
            raise ValueError(f"tokens: a non-empty sequence of ids in [0, {self.V})")
        x = self.t["tok_emb"][tokens]
        for i in range(self.L):
            x = self.layer(x, i)
        return rmsnorm(x, self.t["final_norm"], self.eps) @ self.t["lm_head"].T


def log_softmax(z):
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))


# ---- eval and sample ---------------------------------------------------------------


def evaluate(model, data, seq_len, max_tokens=0):
    """nsad eval's figures for byte tokens: windows of seq_len + 1 tokens at
    stride seq_len, every prediction in them scored."""
    ids = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    windows = (len(ids) - 1) // seq_len
    if windows < 1:
        raise ValueError(f"{len(ids)} tokens: shorter than one window of {seq_len + 1}")
    total, count, near_ties = 0.0, 0, 0
    for k in range(windows):
        w = ids[k * seq_len:k * seq_len + seq_len + 1]
        lp = log_softmax(model.logits(w[:-1]))
        near_ties += model.near_ties
        total -= float(np.sum(lp[np.arange(seq_len), w[1:]]))
        count += seq_len
        if max_tokens and count >= max_tokens:
            windows = k + 1
            break
    loss = total / count
    return {"loss": loss, "bits_per_byte": loss / math.log(2), "tokens": count,
            "windows": windows, "seq_len": seq_len, "near_ties": near_ties}


class NsaRng:
    """xoshiro256** seeded through splitmix64, as kernels/nsa_rng.c."""
    MASK = (1 << 64) - 1

    def __init__(self, seed, stream):
        def splitmix(x):
            x = (x + 0x9E3779B97F4A7C15) & self.MASK
            z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
            return x, z ^ (z >> 31)
        _, mixed = splitmix(stream & self.MASK)
        x = (seed ^ mixed) & self.MASK
        self.s = []
        for _ in range(4):
            x, z = splitmix(x)
            self.s.append(z)

    def uniform(self):
        s, M = self.s, self.MASK
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M
        result = (rotl((s[1] * 5) & M, 7) * 9) & M
        t = (s[1] << 17) & M
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return (result >> 11) * 2.0 ** -53


def pick(z, temperature, top_k, top_p, u):
    """One token from logits z by daemon/sampler.c's rule."""
    if temperature == 0:
        return int(np.argmax(z))
    ids = sorted(range(len(z)), key=lambda v: (-z[v], v))
    n = top_k if 0 < top_k < len(z) else len(z)
    p = [math.exp((float(z[ids[i]]) - float(z[ids[0]])) / temperature) for i in range(n)]
    total = sum(p)
    if top_p < 1:
        keep, cum = 0, 0.0
        while keep < n and (keep == 0 or cum < top_p * total):
            cum += p[keep]
            keep += 1
        n, total = keep, cum
    target, cum = u * total, 0.0
    for i in range(n):
        cum += p[i]
        if target < cum:
            return ids[i]
    return ids[n - 1]


def generate(model, prompt, max_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=1):
    """Token ids generated after prompt (bytes); each with the margin between
    its two largest logits (how close greedy decoding was to another pick)."""
    rng = NsaRng(seed, 0)
    seq = list(prompt)
    out, margins = [], []
    for _ in range(max_tokens):
        z = model.logits(seq)[-1]
        top2 = np.sort(z)[-2:]
        margins.append(float(top2[1] - top2[0]))
        tok = pick(z, temperature, top_k, top_p, rng.uniform())
        out.append(tok)
        seq.append(tok)
    return out, margins


def main(argv):
    ap = argparse.ArgumentParser(prog="nsa_numpy.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("export_dir")
    sub = ap.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="held-out loss and bits per byte on a text file")
    ev.add_argument("--data", required=True)
    ev.add_argument("--seq-len", type=int, default=256)
    ev.add_argument("--max-tokens", type=int, default=0)
    sa = sub.add_parser("sample", help="text after a prompt")
    sa.add_argument("--prompt", required=True)
    sa.add_argument("--max-tokens", type=int, default=64)
    sa.add_argument("--temperature", type=float, default=0.8)
    sa.add_argument("--top-k", type=int, default=0)
    sa.add_argument("--top-p", type=float, default=0.95)
    sa.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    try:
        model = NsaModel(a.export_dir)
    except (OSError, ValueError, KeyError, ExportError) as e:
        print(f"nsa_numpy.py: {a.export_dir}: {e}", file=sys.stderr)
        return 1
    if model.tokenizer != "byte":
        print(f"nsa_numpy.py: tokenizer {model.tokenizer!r}; this reader runs text through "
              "'byte' only", file=sys.stderr)
        return 1
    if a.command == "eval":
        if a.seq_len < 1:
            print("nsa_numpy.py: --seq-len: at least 1", file=sys.stderr)
            return 2
        try:
            with open(a.data, "rb") as f:
                data = f.read()
            res = evaluate(model, data, a.seq_len, a.max_tokens)
        except (OSError, ValueError) as e:
            print(f"nsa_numpy.py: {a.data}: {e}", file=sys.stderr)
            return 1
        res["data"] = a.data
    else:
        if not (a.temperature >= 0 and 0 < a.top_p <= 1 and a.top_k >= 0 and a.max_tokens >= 1):
            print("nsa_numpy.py: temperature >= 0, top-k >= 0, top-p in (0, 1], max-tokens >= 1",
                  file=sys.stderr)
            return 2
        prompt = a.prompt.encode()
        if not prompt:
            print("nsa_numpy.py: --prompt: at least one byte", file=sys.stderr)
            return 2
        ids, _ = generate(model, prompt, a.max_tokens, a.temperature, a.top_k, a.top_p, a.seed)
        res = {"prompt": a.prompt, "text": bytes(ids).decode("utf-8", "replace"), "tokens": len(ids),
               "near_ties": model.near_ties}   # in the last forward: the whole text
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
