#!/usr/bin/env python3
"""test_export_numpy.py - an export is enough to run the model elsewhere.

Two tiny CPU runs (phi = mlp with the SiLU MLP; phi = avg with SwiGLU, one
KV group and d_k != d_v) are trained and exported; scripts/nsa_numpy.py, a
NumPy model written from proto/model.md that reads nothing but the export's
config.json and model.safetensors, must then reproduce nsad's own engine:
the held-out loss of `nsad eval` (f32 export: to 1e-5; bf16: to 2e-2), the
text of `nsad sample` at temperature 0 (up to the first step whose two best
logits lie within 1e-3, where rounding may pick either) and with a seed at
temperature 1 (top-k, top-p: the same draws). Its selection must meet no
near tie on the data it scores, or a match would prove less. Bad exports
get a clear error.

Prints TAP and exits non-zero on failure. Needs NumPy (python3-numpy).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from nsadtest import CORPUS, NSAD, ROOT, check, ensure_corpus, finish



def numpy_interpreter():
    """This interpreter if it imports NumPy, else the first python3 that does.

    A python3 of one's own (pyenv, a venv) ahead of Debian's on PATH need not
    have NumPy even where python3-numpy is installed; the test is about the
    script, not about which interpreter comes first.
    """
    try:
        import numpy  # noqa: F401
        return sys.executable
    except ImportError:
        pass
    for cand in (shutil.which("python3"), "/usr/bin/python3"):
        if cand and os.path.realpath(cand) != os.path.realpath(sys.executable) and \
                subprocess.run([cand, "-c", "import numpy"], capture_output=True).returncode == 0:
            return cand
    return None


python = numpy_interpreter()
if python is None:
    print("1..1\nnot ok 1 - NumPy imports in no python3 here (" + sys.executable +
          ", /usr/bin/python3); scripts/deps.sh installs python3-numpy")
    sys.exit(1)
if python != sys.executable:
    print(f"# NumPy is not in {sys.executable}; running under {python}", flush=True)
    os.execv(python, [python] + sys.argv)

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import nsa_numpy  # noqa: E402  (needs the path above)

RUNS = {
    "mlp-silu": ("{dim: 32, n_layers: 2, n_heads: 4, n_kv_groups: 2, d_k: 8, d_v: 8}",
                 "{l: 8, d: 4, l_sel: 8, n_sel: 4, w: 16, phi: mlp}"),
    "avg-swiglu": ("{dim: 24, n_layers: 2, n_heads: 2, n_kv_groups: 1, d_k: 8, d_v: 12, mlp: swiglu,"
                   " mlp_hidden: 40}",
                   "{l: 8, d: 4, l_sel: 8, n_sel: 3, w: 24, phi: avg}"),
}
SEQ = 64
PROMPT = "Q: What is"


def nsad(args):
    return subprocess.run([NSAD] + args, capture_output=True, timeout=300)


def train_and_export(tmp, name, model, nsa):
    out = os.path.join(tmp, name)
    cfg = os.path.join(tmp, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(f"""model: {model}
nsa: {nsa}
train: {{steps: 12, seq_len: {SEQ}, batch_size: 4, lr: 1.0e-2, seed: 3, log_every: 4,
        eval_every: 12, eval_batches: 1, save_every: 12, out_dir: {out}}}
runtime: {{device: cpu, precision: fp32, threads: 1}}
data: {{source: text, path: {CORPUS}, tokenizer: byte, val_fraction: 0.05}}
""")
    r = nsad(["train", cfg])
    if not check(f"{name}: a tiny run trains", r.returncode == 0, r.stderr.decode()):
        return None
    for dtype in ("f32", "bf16"):
        r = nsad(["export", out, "--out", os.path.join(tmp, f"{name}-{dtype}"), "--dtype", dtype])
        if not check(f"{name}: {dtype} export", r.returncode == 0, r.stderr.decode()):
            return None
    return out


def main():
    ensure_corpus()
    tmp = tempfile.mkdtemp(prefix="nsad-test-numpy-")
    try:
        with open(CORPUS, "rb") as f:
            corpus = f.read()
        data = os.path.join(tmp, "held-out.txt")
        with open(data, "wb") as f:   # four windows of SEQ + 1 tokens
            f.write(corpus[len(corpus) // 2:len(corpus) // 2 + 4 * SEQ + 1])
        for name, (model, nsa) in RUNS.items():
            out = train_and_export(tmp, name, model, nsa)
            if out is None:
                continue
            r = nsad(["eval", out, "--data", data, "--seq-len", str(SEQ), "--device", "cpu",
                      "--json"])
            if not check(f"{name}: nsad eval", r.returncode == 0, r.stderr.decode()):
                continue
            want = json.loads(r.stdout)
            m32 = nsa_numpy.NsaModel(os.path.join(tmp, f"{name}-f32"))
            with open(data, "rb") as f:
                got = nsa_numpy.evaluate(m32, f.read(), SEQ)
            rel = abs(got["loss"] - want["loss"]) / want["loss"]
            check(f"{name}: f32 export, NumPy: nsad eval's loss to 1e-5 ({rel:.1e}) over the same "
                  f"{want['tokens']} tokens",
                  rel < 1e-5 and got["tokens"] == want["tokens"], f"{got} against {want}")
            check(f"{name}: the NumPy selection met no near tie", got["near_ties"] == 0,
                  f"{got['near_ties']} decisions within 1e-6")
            m16 = nsa_numpy.NsaModel(os.path.join(tmp, f"{name}-bf16"))
            with open(data, "rb") as f:
                got16 = nsa_numpy.evaluate(m16, f.read(), SEQ)
            rel16 = abs(got16["loss"] - want["loss"]) / want["loss"]
            check(f"{name}: bf16 export, NumPy: the loss to 2e-2 ({rel16:.1e})", rel16 < 2e-2,
                  f"{got16} against {want}")

            # nsad sample prints the prompt, then the generated text
            r = nsad(["sample", out, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "24",
                      "--device", "cpu"])
            text = r.stdout[len(PROMPT):] if r.stdout.startswith(PROMPT.encode()) else r.stdout
            ids, margins = nsa_numpy.generate(m32, PROMPT.encode(), 24)
            close = next((i for i, m in enumerate(margins) if m < 1e-3), len(ids))
            check(f"{name}: greedy text of nsad sample, the first {close} of 24 tokens",
                  r.returncode == 0 and text[:close] == bytes(ids[:close]) and close >= 8,
                  f"nsad {r.stdout!r}, NumPy {bytes(ids)!r}, margins {margins}")
            r = nsad(["sample", out, "--prompt", PROMPT, "--temperature", "1", "--top-k", "40",
                      "--top-p", "0.9", "--seed", "7", "--max-tokens", "24", "--device", "cpu"])
            ids, _ = nsa_numpy.generate(m32, PROMPT.encode(), 24, 1.0, 40, 0.9, 7)
            check(f"{name}: seeded sampling draws the same text",
                  r.returncode == 0 and r.stdout == PROMPT.encode() + bytes(ids), f"nsad {r.stdout!r}, NumPy {bytes(ids)!r}")

        # a bad export is named, not half-read
        bad = os.path.join(tmp, "mlp-silu-f32")
        if os.path.isdir(bad):
            with open(os.path.join(bad, "config.json")) as f:
                c = json.load(f)
            c["n_heads"] = 8
            with open(os.path.join(bad, "config.json"), "w") as f:
                json.dump(c, f)
            r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "nsa_numpy.py"), bad,
                                "eval", "--data", data], capture_output=True, text=True, timeout=60)
            check("a config.json that disagrees with the tensors: exit 1 naming the tensor",
                  r.returncode == 1 and "layers.0.wq" in r.stderr, r.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.exit(finish())
