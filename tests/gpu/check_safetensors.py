#!/usr/bin/env python3
"""check_safetensors.py CHECKPOINT_DIR - loads an nsad checkpoint with Python's
own `safetensors` package (present on the GPU machine, not on CI's) and checks
it against proto/files.md: every tensor fp32 and finite, the model's names and
shapes, the moments' names matching the weights, the metadata keys. Prints
TAP and exits non-zero on failure. The CPU test suite checks the same format
with a stdlib parser (tests/unit/test_checkpoint.c and test_trainer.c)."""
import json
import math
import sys

from safetensors import safe_open

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok' if ok else 'not ok'} {len(results)} - {name}" + ("" if ok else f"  # {detail}"))


def main(ck):
    with safe_open(f"{ck}/model.safetensors", framework="numpy") as f:
        meta = f.metadata()
        names = list(f.keys())
        tensors = {n: f.get_tensor(n) for n in names}
    check("model.safetensors loads with safetensors", len(names) > 0)
    check("every weight is float32", all(str(t.dtype) == "float32" for t in tensors.values()))
    check("every weight is finite", all(bool(math.isfinite(float(abs(t).max()))) for t in tensors.values()))
    for key in ("format", "nsad_format", "nsad_version", "step", "config_hash", "model_config"):
        check(f"model metadata has {key}", key in meta, sorted(meta))
    mc = json.loads(meta["model_config"])
    m = mc["model"]
    C, V, L = m["dim"], m["vocab_size"], m["n_layers"]
    Hdk, Gdk = m["n_heads"] * m["d_k"], m["n_kv_groups"] * m["d_k"]
    check("tok_emb is [V][C]", list(tensors["tok_emb"].shape) == [V, C], tensors["tok_emb"].shape)
    check("lm_head is [V][C]", list(tensors["lm_head"].shape) == [V, C], tensors["lm_head"].shape)
    for i in range(L):
        check(f"layers.{i}.wq is [H*d_k][C]", list(tensors[f"layers.{i}.wq"].shape) == [Hdk, C])
        for br in ("cmp", "sel", "win"):
            check(f"layers.{i}.wk_{br} is [G*d_k][C]", list(tensors[f"layers.{i}.wk_{br}"].shape) == [Gdk, C])
    with safe_open(f"{ck}/state.safetensors", framework="numpy") as f:
        smeta = f.metadata()
        snames = set(f.keys())
        shapes_ok = all(list(f.get_tensor(f"adam_m.{n}").shape) == list(tensors[n].shape) for n in names)
    want = {f"adam_{k}.{n}" for n in names for k in ("m", "v")}
    check("state.safetensors holds adam_m/adam_v for every weight", snames == want,
          sorted(snames ^ want)[:5])
    check("moments have the weights' shapes", shapes_ok)
    for key in ("nsad_format", "step", "data_position", "seed", "config_hash", "tokens_seen"):
        check(f"state metadata has {key}", key in smeta, sorted(smeta))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
