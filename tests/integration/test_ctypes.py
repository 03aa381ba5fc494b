#!/usr/bin/env python3
"""test_ctypes.py - libnsa.so from another language: Python's ctypes, stdlib only.

Loads build/libnsa.so and drives the public C API (kernels/nsa.h) the way an
interop caller would: the NSA attention op alone (forward against a brute-force
full causal attention through the identities of proto/model.md, "The three
branches"; backward against central differences) and the model (create, init,
forward/backward, tensors by name, an optimizer step, a clear error for a bad
config).
Prints TAP ("ok N - name" / "not ok N - name") and exits non-zero on failure.
"""
import ctypes as C
import math
import os
import random
import sys

from nsadtest import ROOT, check, finish

LIB = os.environ.get("NSA_LIB") or os.path.join(ROOT, "build", "libnsa.so")

PF = C.POINTER(C.c_float)


class NsaError(C.Structure):
    _fields_ = [("message", C.c_char * 512)]


class NsaAttnDims(C.Structure):
    _fields_ = [(n, C.c_int) for n in ("B", "S", "H", "G", "d_k", "d_v", "cmp_len", "cmp_stride",
                                       "sel_len", "n_sel", "window")]


BRANCH_INPUTS = ("q", "k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win", "gates")


class NsaAttnInputs(C.Structure):
    _fields_ = [(n, PF) for n in BRANCH_INPUTS]


class NsaAttnGrads(C.Structure):
    _fields_ = [("d" + n, PF) for n in BRANCH_INPUTS]


class NsaModelConfig(C.Structure):
    _fields_ = [(n, C.c_int) for n in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_groups",
                                       "d_k", "d_v", "mlp_hidden", "mlp", "cmp_len", "cmp_stride",
                                       "sel_len", "n_sel", "window", "phi")] + \
               [("rope_base", C.c_float), ("norm_eps", C.c_float)]


class NsaEngineOptions(C.Structure):
    _fields_ = [(n, C.c_int) for n in ("device", "device_ordinal", "precision", "max_batch",
                                       "max_seq_len", "threads", "recompute")] + \
               [("comm", C.c_void_p)]  # NULL: a model alone


class NsaOptimConfig(C.Structure):
    _fields_ = [(n, C.c_float) for n in ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip")]


class NsaStepStats(C.Structure):
    _fields_ = [("loss", C.c_double), ("grad_norm", C.c_double), ("nonfinite_loss", C.c_int),
                ("nonfinite_grad", C.c_int), ("applied", C.c_int)]


class NsaDeviceInfo(C.Structure):
    _fields_ = [("cuda_built", C.c_int), ("cuda_devices", C.c_int), ("description", C.c_char * 512)]


class NsaTensorInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("ndim", C.c_int), ("shape", C.c_int64 * 4),
                ("numel", C.c_size_t), ("offset", C.c_size_t), ("weight_decay", C.c_int)]


def floats(n, rng, lo=-1.0, hi=1.0):
    return (C.c_float * n)(*[rng.uniform(lo, hi) for _ in range(n)])


def full_causal(d, q, k, v, gates_branch):
    """Brute-force causal attention of every head over its group's k/v."""
    B, S, H, G, dk, dv = d.B, d.S, d.H, d.G, d.d_k, d.d_v
    hpg = H // G
    out = [0.0] * (B * S * H * dv)
    scale = 1.0 / math.sqrt(dk)
    for b in range(B):
        for t in range(S):
            for h in range(H):
                g = h // hpg
                qo = ((b * S + t) * H + h) * dk
                logits = []
                for u in range(t + 1):
                    ko = ((b * S + u) * G + g) * dk
                    logits.append(scale * sum(q[qo + i] * k[ko + i] for i in range(dk)))
                m = max(logits)
                w = [math.exp(x - m) for x in logits]
                z = sum(w)
                for j in range(dv):
                    acc = sum(w[u] * v[((b * S + u) * G + g) * dv + j] for u in range(t + 1))
                    out[((b * S + t) * H + h) * dv + j] = acc / z
    return out


def attention_case(lib, rng, name, dims, branch):
    """One identity: only `branch` (0 cmp, 1 sel, 2 win) has gate 1."""
    n_q = dims.B * dims.S * dims.H * dims.d_k
    n_k = dims.B * dims.S * dims.G * dims.d_k
    n_v = dims.B * dims.S * dims.G * dims.d_v
    n_o = dims.B * dims.S * dims.H * dims.d_v
    bufs = {"q": floats(n_q, rng)}
    for br in ("cmp", "sel", "win"):
        bufs["k_" + br] = floats(n_k, rng)
        bufs["v_" + br] = floats(n_v, rng)
    gates = (C.c_float * (dims.B * dims.S * dims.H * 3))()
    for i in range(dims.B * dims.S * dims.H):
        gates[i * 3 + branch] = 1.0
    bufs["gates"] = gates
    inputs = NsaAttnInputs(*[C.cast(bufs[n], PF) for n in BRANCH_INPUTS])
    out = (C.c_float * n_o)(*([float("nan")] * n_o))  # poisoned: every element must be written
    err = NsaError()
    rc = lib.nsaAttnForwardCpu(C.byref(dims), C.byref(inputs), out, None, None, C.byref(err))
    if rc != 0:
        check(name, False, err.message.decode())
        return
    tag = ("cmp", "sel", "win")[branch]
    ref = full_causal(dims, bufs["q"], bufs["k_" + tag], bufs["v_" + tag], branch)
    num = math.sqrt(sum((a - b) ** 2 for a, b in zip(out, ref)))
    den = math.sqrt(sum(b * b for b in ref)) or 1.0
    finite = all(math.isfinite(x) for x in out)
    check(f"{name}: relative error {num / den:.2e} < 1e-5", finite and num / den < 1e-5,
          f"rel {num / den:.3e}, finite {finite}")


def main():
    if not os.path.exists(LIB):
        print(f"not ok 1 - {LIB} exists (run make first)")
        return 1
    lib = C.CDLL(LIB)
    lib.nsaAttnForwardCpu.argtypes = [C.c_void_p, C.c_void_p, PF, C.c_void_p, C.c_void_p, C.c_void_p]
    lib.nsaAttnBackwardCpu.argtypes = [C.c_void_p, C.c_void_p, PF, C.c_void_p, C.c_void_p]
    lib.nsaModelCreate.restype = C.c_void_p
    lib.nsaModelCreate.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
    lib.nsaModelFree.argtypes = [C.c_void_p]
    lib.nsaModelInit.argtypes = [C.c_void_p, C.c_uint64, C.c_void_p]
    lib.nsaModelZeroGrad.argtypes = [C.c_void_p, C.c_void_p]
    lib.nsaModelForwardBackward.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_int, C.c_int,
                                            C.c_float, C.c_void_p]
    lib.nsaModelOptimizerStep.argtypes = [C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p]
    lib.nsaModelStepStats.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
    lib.nsaModelFindTensor.argtypes = [C.c_void_p, C.c_char_p]
    lib.nsaModelTensorInfo.restype = C.POINTER(NsaTensorInfo)
    lib.nsaModelTensorInfo.argtypes = [C.c_void_p, C.c_int]
    lib.nsaModelGetTensor.argtypes = [C.c_void_p, C.c_int, C.c_int, PF, C.c_void_p]
    lib.nsaModelConfigDefaults.argtypes = [C.c_void_p]
    lib.nsaModelConfigValidate.argtypes = [C.c_void_p, C.c_void_p]

    dev, err = NsaDeviceInfo(), NsaError()
    rc = lib.nsaDeviceProbe(C.byref(dev), C.byref(err))
    desc = dev.description.decode()
    check(f"nsaDeviceProbe: {desc}", rc == 0 and dev.cuda_devices >= 0 and len(desc) > 0,
          err.message.decode())

    rng = random.Random(int.from_bytes(os.urandom(4), "little"))  # fresh inputs every run
    # --- the attention op alone: the identities of proto/model.md, "The three branches" ---
    S = 11  # a multiple of no block size used below
    attention_case(lib, rng, "op via ctypes: window with w >= S is full causal attention",
                   NsaAttnDims(2, S, 4, 2, 8, 6, 4, 2, 4, 3, S), 2)
    attention_case(lib, rng, "op via ctypes: selection with l'=1, n_sel >= S is full causal attention",
                   NsaAttnDims(1, S, 4, 1, 8, 8, 4, 1, 1, S, 5), 1)
    attention_case(lib, rng, "op via ctypes: compressed with l=d=1 is full causal attention",
                   NsaAttnDims(1, S, 2, 2, 6, 4, 1, 1, 4, 3, 5), 0)

    # --- the op's backward: dq against central differences of sum(out * w) ---
    dims = NsaAttnDims(1, 9, 2, 1, 4, 4, 4, 2, 4, 3, 5)
    n_q, n_k, n_v = 9 * 2 * 4, 9 * 1 * 4, 9 * 1 * 4
    n_o = 9 * 2 * 4
    bufs = {"q": floats(n_q, rng), "gates": floats(9 * 2 * 3, rng, 0.1, 0.9)}
    for br in ("cmp", "sel", "win"):
        bufs["k_" + br] = floats(n_k, rng)
        bufs["v_" + br] = floats(n_v, rng)
    inputs = NsaAttnInputs(*[C.cast(bufs[n], PF) for n in BRANCH_INPUTS])
    weights = floats(n_o, rng)
    sizes = {n: len(bufs[n]) for n in BRANCH_INPUTS}
    grads_bufs = {n: (C.c_float * sizes[n])() for n in BRANCH_INPUTS}
    grads = NsaAttnGrads(*[C.cast(grads_bufs[n], PF) for n in BRANCH_INPUTS])
    err = NsaError()
    rc = lib.nsaAttnBackwardCpu(C.byref(dims), C.byref(inputs), weights, C.byref(grads), C.byref(err))
    check("op backward via ctypes returns 0", rc == 0, err.message.decode())

    def objective():
        out = (C.c_float * n_o)()
        lib.nsaAttnForwardCpu(C.byref(dims), C.byref(inputs), out, None, None, C.byref(err))
        return sum(float(o) * float(w) for o, w in zip(out, weights))

    worst = 0.0
    for name in ("q", "v_win", "gates"):
        buf, g = bufs[name], grads_bufs[name]
        for i in rng.sample(range(len(buf)), 6):
            x, h = buf[i], 1e-2
            buf[i] = x + h
            up = objective()
            buf[i] = x - h
            down = objective()
            buf[i] = x
            fd = (up - down) / (2 * h)
            worst = max(worst, abs(fd - g[i]) / max(1.0, abs(fd)))
    check(f"op backward via ctypes matches central differences (worst {worst:.1e} < 1e-2)",
          worst < 1e-2, f"worst {worst}")

    # --- the model through the C API ---
    cfg = NsaModelConfig()
    lib.nsaModelConfigDefaults(C.byref(cfg))
    bad = NsaModelConfig.from_buffer_copy(cfg)
    bad.n_kv_groups = 5
    err = NsaError()
    rc = lib.nsaModelConfigValidate(C.byref(bad), C.byref(err))
    msg = err.message.decode()
    check("a bad config is refused with a message naming the field", rc != 0 and "n_kv_groups" in msg, msg)
    cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_groups = 64, 32, 1, 4, 2
    cfg.d_k, cfg.d_v, cfg.cmp_len, cfg.cmp_stride, cfg.sel_len, cfg.n_sel, cfg.window = 8, 8, 4, 2, 4, 3, 8
    opt = NsaEngineOptions(0, 0, 0, 2, 16, 1)  # cpu, fp32, B 2, S 16
    model = lib.nsaModelCreate(C.byref(cfg), C.byref(opt), C.byref(err))
    check("nsaModelCreate via ctypes", bool(model), err.message.decode())
    if not model:
        return finish()
    try:
        lib.nsaModelInit(model, 1234, C.byref(err))
        toks = (C.c_int32 * 32)(*[rng.randrange(64) for _ in range(32)])
        tgts = (C.c_int32 * 32)(*[rng.randrange(64) for _ in range(32)])
        oc = NsaOptimConfig(1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0)
        stats = NsaStepStats()
        losses = []
        for step in range(1, 4):
            rc = lib.nsaModelZeroGrad(model, C.byref(err)) or \
                lib.nsaModelForwardBackward(model, toks, tgts, 2, 16, C.c_float(1.0), C.byref(err)) or \
                lib.nsaModelOptimizerStep(model, C.byref(oc), step, C.byref(err)) or \
                lib.nsaModelStepStats(model, C.byref(stats), C.byref(err))
            if rc != 0:
                break
            losses.append(stats.loss)
        check(f"three steps via ctypes: loss {losses[0]:.3f} near ln 64 = {math.log(64):.3f}, then falls"
              if losses else "three steps via ctypes",
              len(losses) == 3 and abs(losses[0] - math.log(64)) < 0.3 and losses[2] < losses[0],
              f"{losses} {err.message.decode()}")
        idx = lib.nsaModelFindTensor(model, b"layers.0.wk_sel")
        info = lib.nsaModelTensorInfo(model, idx).contents if idx >= 0 else None
        ok = info is not None and list(info.shape[:info.ndim]) == [2 * 8, 32]
        if ok:
            grad = (C.c_float * info.numel)()
            ok = lib.nsaModelGetTensor(model, 1, idx, grad, C.byref(err)) == 0 and \
                any(x != 0.0 for x in grad)
        check("tensors by name: layers.0.wk_sel is [G*d_k][C] with a non-zero gradient", ok,
              err.message.decode())
    finally:
        lib.nsaModelFree(model)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
