#!/usr/bin/env python3
"""test_api.py - nsad serve end to end, over TCP and the Unix socket.

Starts build/nsad serve on a free loopback port with a temporary state dir
and drives it through proto/api.md with tiny CPU runs: start -> status ->
metrics -> halt -> resume -> completed; kill -9 mid-run and restart (the run
resumes from its checkpoint, no logged step lost or doubled); a NaN fault;
a stall fault (hung, the dump names the phase); bad inputs (each a 4xx, the
daemon stays up); the Prometheus exposition (a strict parser here, plus
`promtool check metrics` when promtool is installed); sd_notify; SIGQUIT;
exit 78 on a bad daemon config.

Python 3 standard library only. Prints TAP ("ok N - name" / "not ok N -
name", then "1..N") and exits non-zero when anything failed. Every wait is
bounded and every nsad it starts is killed on the way out.
"""
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from nsadtest import (NSAD, ROOT, NsadProcess, check, diag, free_port, run_daemon_tests, subdir,
                     wait_for)

HTTP_TIMEOUT = 15
# NSAD_TEST_DEVICE=cuda runs the same scenarios on the CUDA engine (meant for
# the GPU machine; not yet run there)
RUNTIME = ({"device": "cuda", "precision": "bf16"} if os.environ.get("NSAD_TEST_DEVICE") == "cuda"
           else {"device": "cpu", "precision": "fp32", "threads": 1})
MAX_CONNECTIONS = 6
MAX_BODY = 64 * 1024

# ---- HTTP --------------------------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=HTTP_TIMEOUT):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body
        self.json = None
        ctype = headers.get("Content-Type", "")
        if ctype.startswith("application/json"):
            try:
                self.json = json.loads(body)
            except ValueError:
                self.json = None

    def error_code(self):
        try:
            return self.json["error"]["code"]
        except (TypeError, KeyError):
            return None

    def __repr__(self):
        return f"{self.status} {self.body[:300]!r}"


def json_config(steps, **sections):
    """A tiny CPU job: 1 layer, dim 32, seq 64, synthetic data."""
    cfg = {
        "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_groups": 1, "d_k": 16, "d_v": 16},
        "nsa": {"l": 8, "d": 4, "l_sel": 16, "n_sel": 4, "w": 32},
        "train": {"steps": steps, "seq_len": 64, "batch_size": 2, "log_every": 1, "eval_every": 0,
                  "save_every": 0, "warmup_steps": 2, "lr": 1e-3},
        "runtime": dict(RUNTIME),  # a copy: sections below update it
        "data": {"source": "synthetic"},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return json.dumps(cfg)


class Nsad(NsadProcess):
    """One nsad serve process on a loopback port and a Unix socket."""

    def __init__(self, workdir, web_root, env_extra=None, args=None):
        super().__init__(workdir)
        self.socket = os.path.join(workdir, "nsad.sock")
        self.web_root = web_root
        self.env_extra = env_extra or {}
        self.extra_args = list(args or [])
        self.port = None
        self.token = None

    def start(self, timeout=20):
        self.port = free_port()
        env = dict(os.environ)
        env.update(self.env_extra)
        self.spawn(["--listen", f"127.0.0.1:{self.port}", "--socket", self.socket,
                    "--state-dir", self.state_dir, "--web-root", self.web_root,
                    "--max-connections", str(MAX_CONNECTIONS), "--max-body", str(MAX_BODY),
                    "--log-level", "info"] + self.extra_args, env)
        ok = wait_for(self._healthy, timeout, 0.05)
        if ok:
            with open(os.path.join(self.state_dir, "token")) as f:
                self.token = f.read().strip()
        return bool(ok)

    def _healthy(self):
        if self.proc.poll() is not None:
            return True  # exited: stop waiting; alive() tells
        try:
            r = self.request("GET", "/api/v1/health", token=False)
            return r.status == 200
        except OSError:
            return False

    def request(self, method, path, body=None, headers=None, token=True, unix=False,
                content_type=None, host=None):
        if unix:
            conn = UnixHTTPConnection(self.socket)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT)
        try:
            conn.putrequest(method, path, skip_host=host is not None, skip_accept_encoding=True)
            if host is not None:
                conn.putheader("Host", host)
            hdrs = dict(headers or {})
            if token and not unix and self.token:
                hdrs.setdefault("Authorization", f"Bearer {self.token}")
            if body is not None:
                if isinstance(body, str):
                    body = body.encode()
                hdrs.setdefault("Content-Length", str(len(body)))
                if content_type:
                    hdrs.setdefault("Content-Type", content_type)
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders(body)
            r = conn.getresponse()
            data = r.read().decode("utf-8", "replace")
            return Response(r.status, r.headers, data)
        finally:
            conn.close()

    def api(self, method, path, body=None, **kw):
        """A request over the Unix socket (no token needed)."""
        return self.request(method, path, body=body, unix=True, **kw)

    def run(self, run_id):
        return self.api("GET", f"/api/v1/runs/{run_id}").json


# ---- the Prometheus text format, strictly ------------------------------------------

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*$")
FLOAT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_labels(text, lineno):
    """Parses 'a="x",b="y"' strictly; returns a tuple of pairs."""
    labels = []
    i = 0
    while i < len(text):
        m = re.match(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"", text[i:])
        if not m:
            raise ValueError(f"line {lineno}: bad label at {text[i:]!r}")
        name = m.group(1)
        i += m.end()
        value = []
        while True:
            if i >= len(text):
                raise ValueError(f"line {lineno}: unterminated label value")
            c = text[i]
            if c == "\\":
                if i + 1 >= len(text) or text[i + 1] not in "\\\"n":
                    raise ValueError(f"line {lineno}: bad escape in label value")
                value.append({"\\": "\\", '"': '"', "n": "\n"}[text[i + 1]])
                i += 2
                continue
            if c == "\n":
                raise ValueError(f"line {lineno}: raw newline in label value")
            if c == '"':
                i += 1
                break
            value.append(c)
            i += 1
        if any(n == name for n, _ in labels):
            raise ValueError(f"line {lineno}: duplicate label {name}")
        labels.append((name, "".join(value)))
        if i < len(text):
            if text[i] != ",":
                raise ValueError(f"line {lineno}: expected ',' between labels")
            i += 1
    return tuple(labels)


def parse_prometheus(text):
    """Parses exposition format 0.0.4 strictly. Returns {name: {"type", "help",
    "samples": {labels: value}}}; raises ValueError naming the line."""
    if not text.endswith("\n"):
        raise ValueError("the exposition must end with a newline")
    families = {}
    order = []
    current = None
    for lineno, line in enumerate(text.split("\n")[:-1], 1):
        if line == "":
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 2 and parts[1] in ("HELP", "TYPE"):
                if len(parts) < 3 or not METRIC_NAME.match(parts[2]):
                    raise ValueError(f"line {lineno}: bad metric name in {parts[1]}")
                name = parts[2]
                fam = families.setdefault(name, {"type": None, "help": None, "samples": {}})
                if name not in order:
                    order.append(name)
                elif current != name:
                    raise ValueError(f"line {lineno}: family {name} is not contiguous")
                current = name
                key = parts[1].lower()
                if fam[key] is not None:
                    raise ValueError(f"line {lineno}: second {parts[1]} for {name}")
                if key == "type":
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise ValueError(f"line {lineno}: bad type {parts[3:]}")
                    if fam["samples"]:
                        raise ValueError(f"line {lineno}: TYPE after samples of {name}")
                    fam["type"] = parts[3]
                else:
                    fam["help"] = parts[3] if len(parts) == 4 else ""
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+)( -?\d+)?$", line)
        if not m:
            raise ValueError(f"line {lineno}: not a sample: {line!r}")
        name, labels_text, value = m.group(1), m.group(3), m.group(4)
        labels = parse_labels(labels_text, lineno) if labels_text else ()
        if value in ("NaN", "+Inf", "-Inf"):
            v = float(value.replace("Inf", "inf").replace("NaN", "nan"))
        elif FLOAT.match(value):
            v = float(value)
        else:
            raise ValueError(f"line {lineno}: bad value {value!r}")
        if name not in families:
            raise ValueError(f"line {lineno}: sample {name} before its TYPE")
        if current != name:
            raise ValueError(f"line {lineno}: sample of {name} outside its family")
        fam = families[name]
        if fam["type"] is None:
            raise ValueError(f"line {lineno}: {name} has no TYPE")
        if labels in fam["samples"]:
            raise ValueError(f"line {lineno}: duplicate series {name}{labels}")
        fam["samples"][labels] = v
    for name, fam in families.items():
        if fam["help"] is None or fam["type"] is None:
            raise ValueError(f"{name}: HELP and TYPE are both required")
        if not name.startswith("nsad_"):
            raise ValueError(f"{name}: every name must start with nsad_")
        if fam["type"] == "counter":
            if not name.endswith("_total"):
                raise ValueError(f"{name}: counters end in _total")
            if any(v < 0 or math.isnan(v) for v in fam["samples"].values()):
                raise ValueError(f"{name}: a counter must be a non-negative number")
    return families


# ---- the scenarios -----------------------------------------------------------------


def test_transport(d):
    r = d.request("GET", "/api/v1/health", token=False)
    check("GET /api/v1/health needs no token and answers ok",
          r.status == 200 and r.json and r.json.get("status") == "ok", r)
    check("JSON answers carry nosniff and no CORS headers",
          r.headers.get("X-Content-Type-Options") == "nosniff"
          and not any(h.lower().startswith("access-control-") for h in r.headers.keys()), r.headers)
    mode = os.stat(os.path.join(d.state_dir, "token")).st_mode & 0o777
    check("token file is mode 0600 with 64 hex characters",
          mode == 0o600 and re.fullmatch(r"[0-9a-f]{64}", d.token or ""), oct(mode))
    r = d.request("GET", "/api/v1/version", token=False)
    check("TCP without a token: 401 unauthorized with WWW-Authenticate",
          r.status == 401 and r.error_code() == "unauthorized"
          and r.headers.get("WWW-Authenticate", "").startswith("Bearer"), r)
    r = d.request("GET", "/api/v1/version", headers={"Authorization": "Bearer " + "0" * 64})
    check("TCP with a wrong token: 401", r.status == 401 and r.error_code() == "unauthorized", r)
    r = d.request("GET", "/api/v1/version", headers={"Authorization": "Basic " + (d.token or "")})
    check("TCP with the token under another scheme: 401", r.status == 401, r)
    r = d.request("GET", "/api/v1/version")
    check("TCP with the token: version answers",
          r.status == 200 and r.json.get("version") and r.json.get("api") == "v1", r)
    r = d.api("GET", "/api/v1/runs")
    check("Unix socket needs no token", r.status == 200 and r.json.get("runs") == [], r)
    mode = os.stat(d.socket).st_mode & 0o777
    check("Unix socket file is mode 0660", mode == 0o660, oct(mode))
    r = d.request("GET", "/metrics", token=False)
    check("/metrics over TCP needs the token", r.status == 401, r)


def test_lifecycle(d):
    """start -> status -> metrics -> halt -> resume -> completed."""
    # batch 8: a few seconds of work, so the halt lands well before the end
    steps = 300
    r = d.request("POST", "/api/v1/runs?name=life", json_config(steps, train={"batch_size": 8}),
                  content_type="application/json")
    ok = check("POST /api/v1/runs (JSON over TCP): 201 with Location and state starting",
               r.status == 201 and r.json and r.json.get("state") in ("starting", "running")
               and r.json.get("warnings") == []
               and r.headers.get("Location") == f"/api/v1/runs/{r.json.get('id')}"
               and r.json.get("name") == "life", r)
    if not ok:
        return
    run_id = r.json["id"]
    # two logged steps: the first gives the ETA its starting point
    run = wait_for(lambda: (lambda x: x if x and x["state"] == "running" and x["step"] > 1 else None)(
        d.run(run_id)), 30)
    check("the run reaches running with steps done", bool(run), d.run(run_id))
    if run:
        check("status has step/total, loss, lr, grad norm, tok/s, memory, heartbeat and phase",
              run["total_steps"] == steps and isinstance(run["loss"], float) and run["lr"] is not None
              and run["grad_norm"] is not None and run["toks_per_s"] and run["mem_bytes"]
              and run["heartbeat_age_s"] is not None and run["heartbeat_age_s"] < 10
              and run["phase"] in ("data", "forward", "backward", "optimizer", "checkpoint", "eval", "starting")
              and run["eta_s"] is not None and run["elapsed_s"] > 0, run)
    r = d.request("POST", "/api/v1/runs?queue=false", json_config(10), content_type="application/json")
    check("a second run while one is active, ?queue=false: 409 busy", r.status == 409 and r.error_code() == "busy", r)
    r = d.api("GET", f"/api/v1/runs/{run_id}/metrics?since=0")
    train = r.json.get("train", []) if r.json else []
    steps_seen = [p["step"] for p in train]
    check("metrics since=0: the train series, steps increasing, next = last + 1",
          r.status == 200 and r.json["run_id"] == run_id and steps_seen
          and steps_seen == sorted(set(steps_seen)) and r.json["next"] == steps_seen[-1] + 1
          and all(k in train[0] for k in ("step", "ts", "loss", "lr", "grad_norm", "toks_per_s", "mem_bytes")),
          r)
    if steps_seen:
        nxt = r.json["next"]
        r2 = d.api("GET", f"/api/v1/runs/{run_id}/metrics?since={nxt}")
        check("metrics since=next returns only newer points",
              r2.status == 200 and all(p["step"] >= nxt for p in r2.json["train"]), r2)
    r = d.request("POST", f"/api/v1/runs/{run_id}/halt", '{"reason": "integration test"}',
                  content_type="application/json")
    check("POST halt: 202, state halting", r.status == 202 and r.json["state"] in ("halting", "halted"), r)
    run = d.wait_state(run_id, ("halted", "completed"), 30)
    check("the run halts (checkpointed) before completing",
          run and run["state"] == "halted" and run["step"] < steps
          and run["last_checkpoint_step"] == run["step"], run)
    halted_step = run["step"] if run else 0
    diag(f"halted at step {halted_step} of {steps}")
    r = d.api("POST", f"/api/v1/runs/{run_id}/halt")
    check("halt of a halted run: 409 invalid_state", r.status == 409 and r.error_code() == "invalid_state", r)
    r = d.api("POST", f"/api/v1/runs/{run_id}/resume", "{}", content_type="application/json")
    check("POST resume: 202, state starting", r.status == 202 and r.json["state"] in ("starting", "running"), r)
    run = d.wait_state(run_id, ("completed", "failed", "halted", "nan_halted"), 60)
    check("the resumed run completes all its steps",
          run and run["state"] == "completed" and run["step"] == steps, run)
    r = d.api("GET", f"/api/v1/runs/{run_id}/events")
    types = [e["type"] for e in r.json["events"]] if r.json else []
    resume = [e for e in (r.json or {}).get("events", []) if e["type"] == "resume"]
    check("events: start, halt_requested, halt, resume_requested, resume, complete (in order)",
          types and types[0] == "start" and "halt_requested" in types and "halt" in types
          and "resume" in types and types[-1] == "complete"
          and types.index("halt") < types.index("resume"), types)
    check("the resume event continues from the halted step",
          resume and resume[0]["detail"].get("step") == halted_step, resume)
    seqs = [e["seq"] for e in r.json["events"]] if r.json else []
    r2 = d.api("GET", f"/api/v1/runs/{run_id}/events?since={seqs[-1] if seqs else 1}")
    check("events since=SEQ returns from that seq on",
          r2.status == 200 and [e["seq"] for e in r2.json["events"]] == seqs[-1:], r2)
    r = d.api("GET", f"/api/v1/runs/{run_id}/metrics")
    steps_seen = [p["step"] for p in r.json["train"]]
    check("the metric series has every step exactly once across halt and resume",
          steps_seen == list(range(1, steps + 1)), steps_seen[:5] + ["..."] + steps_seen[-5:])
    check("a resume from the halt's own checkpoint replaces nothing (generation 0)",
          r.json.get("generation") == 0, r.json.get("generation"))
    r = d.request("GET", "/api/v1/runs")
    check("GET /api/v1/runs lists the run, newest first",
          r.status == 200 and r.json["runs"] and r.json["runs"][0]["id"] == run_id
          and r.json["active"] is None, r)
    r = d.api("GET", f"/api/v1/runs/{run_id}")
    check("GET /api/v1/runs/{id} includes the resolved config",
          r.status == 200 and "model:" in r.json.get("config", ""), r)
    return run_id


def test_prometheus(d, run_id):
    r = d.request("GET", "/metrics")
    ok = check("GET /metrics: 200, text/plain version 0.0.4",
               r.status == 200 and r.headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"), r)
    if not ok:
        return
    try:
        fams = parse_prometheus(r.body)
        err = None
    except ValueError as e:
        fams, err = None, str(e)
    check("the exposition parses strictly (HELP/TYPE, families, labels, values, _total)", fams is not None, err)
    if not fams:
        return
    def sample(name, **labels):
        fam = fams.get(name)
        return fam["samples"].get(tuple(sorted(labels.items()))) if fam else None
    check("nsad_up is 1 and nsad_build_info carries the version",
          sample("nsad_up") == 1 and any(l and l[0][0] == "version" for l in fams["nsad_build_info"]["samples"]), "")
    check("run gauges for the last run: step, loss, state",
          sample("nsad_run_step", run_id=run_id) == 300 and sample("nsad_run_loss", run_id=run_id) is not None
          and sample("nsad_run_state", run_id=run_id, state="completed") == 1, fams.get("nsad_run_step"))
    check("request counters count by code",
          (sample("nsad_http_requests_total", code="200") or 0) > 0
          and (sample("nsad_http_requests_total", code="401") or 0) > 0, fams.get("nsad_http_requests_total"))
    promtool = shutil.which("promtool")
    unpacked = os.path.join(ROOT, "build", "tools", "bin", "promtool")  # scripts/deps.sh
    if not promtool and os.access(unpacked, os.X_OK):
        promtool = unpacked
    if promtool:
        p = subprocess.run([promtool, "check", "metrics"], input=r.body.encode(), capture_output=True, timeout=30)
        check("promtool check metrics accepts the exposition", p.returncode == 0, p.stdout + p.stderr)
    else:
        diag("promtool not installed: the strict parser above is the check")


def test_concurrent_clients(d, run_id):
    """Many clients at once over both listeners: every request gets an
    answer (200, or 429 past the connection limit), none hangs."""
    import threading
    statuses = []
    errors = []
    lock = threading.Lock()

    def client(i):
        for k in range(15):
            try:
                path = ("/api/v1/runs", f"/api/v1/runs/{run_id}/metrics?since=0", "/metrics",
                        f"/api/v1/runs/{run_id}")[(i + k) % 4]
                r = d.request("GET", path, unix=(i % 2 == 0))
                with lock:
                    statuses.append(r.status)
            except OSError as e:
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - t0
    ok = not errors and len(statuses) == 12 * 15 and set(statuses) <= {200, 429} and statuses.count(200) > 0
    diag(f"concurrent clients: {statuses.count(200)} x 200, {statuses.count(429)} x 429 in {took:.1f} s")
    check("12 concurrent clients x 15 requests over both listeners: each answered 200 or 429", ok,
          (errors[:3], sorted(set(statuses)), statuses.count(200)))
    check("the daemon answers normally after the burst",
          d.request("GET", "/api/v1/health", token=False).status == 200, "")


def test_nan_fault(d):
    # runtime.use_flash_attn: a prototype key that loads with a warning
    cfg = json_config(40, fault={"nan_at_step": 5, "nan_kind": "loss"}, nan={"policy": "halt"},
                      runtime={"use_flash_attn": True})
    r = d.api("POST", "/api/v1/runs", cfg, content_type="application/json")
    if not check("POST a run with a NaN fault at step 5", r.status == 201, r):
        return
    check("the answer lists the config's warnings (an ignored prototype key)",
          any("use_flash_attn" in w for w in r.json.get("warnings", [])), r.json.get("warnings"))
    run_id = r.json["id"]
    run = d.wait_state(run_id, ("nan_halted", "completed", "failed", "halted"), 60)
    check("NaN fault: the run ends nan_halted with the anomaly in its status",
          run and run["state"] == "nan_halted" and run["anomaly"] in ("nan_loss", "inf_loss"), run)
    r = d.api("GET", f"/api/v1/runs/{run_id}/events")
    anomalies = [e for e in r.json["events"] if e["type"] == "anomaly"]
    check("NaN fault: an anomaly event names it",
          anomalies and anomalies[0]["detail"].get("type") in ("nan_loss", "inf_loss"), r.json)
    path = os.path.join(run["out_dir"] if run else "", ".anomaly_type")
    content = open(path).read().strip() if os.path.exists(path) else None
    check("NaN fault: .anomaly_type in the out_dir", content in ("nan_loss", "inf_loss"), content)
    r = d.api("GET", "/metrics")
    check("NaN fault: nsad_anomalies_total counts it",
          re.search(r"^nsad_anomalies_total [1-9]", r.body, re.M) is not None, r.body[-400:])


def test_delete(d):
    """DELETE /api/v1/runs/{id}: refused while active, then record and files gone."""
    r = d.request("POST", "/api/v1/runs?name=doomed", json_config(300, train={"batch_size": 8}),
                  content_type="application/json")
    if not check("POST a run to delete later: 201", r.status == 201, r):
        return
    run_id = r.json["id"]
    run_dir = os.path.join(d.state_dir, "runs", run_id)
    wait_for(lambda: (lambda x: x if x and x["state"] == "running" else None)(d.run(run_id)), 30)
    r = d.api("DELETE", f"/api/v1/runs/{run_id}")
    check("DELETE an active run: 409 invalid_state, the run and its files stay",
          r.status == 409 and r.error_code() == "invalid_state" and os.path.isdir(run_dir)
          and d.run(run_id) is not None, r)
    r = d.api("DELETE", f"/api/v1/runs/{run_id}/metrics")
    check("DELETE on a run's metrics: 405 naming GET",
          r.status == 405 and r.error_code() == "method_not_allowed" and r.headers.get("Allow") == "GET", r)
    d.api("POST", f"/api/v1/runs/{run_id}/halt")
    run = d.wait_state(run_id, ("halted", "completed", "failed"), 30)
    check("the run to delete stops", run is not None, run)
    r = d.api("DELETE", f"/api/v1/runs/{run_id}?force=1")
    check("DELETE with a query parameter: 400 invalid_argument",
          r.status == 400 and r.error_code() == "invalid_argument", r)
    r = d.api("DELETE", f"/api/v1/runs/{run_id}")
    check("DELETE an ended run: 200 {run_id, deleted: true}",
          r.status == 200 and r.json == {"run_id": run_id, "deleted": True}, r)
    check("its directory is gone from runs/ at once", not os.path.exists(run_dir), run_dir)
    def trash():
        return [n for n in os.listdir(os.path.join(d.state_dir, "runs")) if n.startswith(".deleted-")]
    gone = wait_for(lambda: not trash(), 10)
    check("its files are removed in the background (no trash left)", gone, trash())
    r = d.api("GET", f"/api/v1/runs/{run_id}")
    check("GET the deleted run: 404 not_found", r.status == 404 and r.error_code() == "not_found", r)
    r = d.api("GET", "/api/v1/runs")
    check("the run list no longer has it",
          r.status == 200 and all(x["id"] != run_id for x in r.json["runs"]), r)
    r = d.api("DELETE", f"/api/v1/runs/{run_id}")
    check("DELETE it again: 404 not_found", r.status == 404 and r.error_code() == "not_found", r)


def test_stall_fault(d):
    cfg = json_config(20, fault={"stall_at_step": 3, "stall_phase": "forward", "stall_seconds": 3.0},
                      watchdog={"forward": 0.5})
    r = d.api("POST", "/api/v1/runs", cfg, content_type="application/json")
    if not check("POST a run with a 3 s stall in forward at step 3 (deadline 0.5 s)", r.status == 201, r):
        return
    run_id = r.json["id"]
    run = d.wait_state(run_id, ("hung", "completed", "failed"), 30)
    check("stall: the watchdog marks the run hung, anomaly names the phase",
          run and run["state"] == "hung" and run["anomaly"] == "hang:forward" and run["phase"] == "forward", run)
    r = d.request("POST", "/api/v1/debug/stacks")
    check("POST /api/v1/debug/stacks while hung: stacks, phase and its age",
          r.status == 200 and r.json["phase"] == "forward" and r.json["phase_age_s"] > 0.5
          and 'thread "trainer"' in r.json["stacks"] and r.json["run_id"] == run_id, r)
    r = d.api("GET", f"/api/v1/runs/{run_id}/events")
    hangs = [e for e in r.json["events"] if e["type"] == "hang"]
    check("stall: a hang event with the phase and the dump file",
          hangs and hangs[0]["detail"].get("phase") == "forward" and hangs[0]["detail"].get("dump"), r.json)
    dump = hangs[0]["detail"].get("dump") if hangs else None
    text = open(dump).read() if dump and os.path.exists(dump) else ""
    check("stall: the dump file names the phase and holds the trainer's stack",
          "phase: forward" in text and 'thread "trainer"' in text, text[:600])
    check("stall: the log has the hang and the stacks",
          wait_for(lambda: "hung: the forward phase" in d.log_text() and 'thread "trainer"' in d.log_text(), 10),
          d.log_text()[-1500:])
    run = d.wait_state(run_id, ("completed", "failed", "nan_halted"), 60)
    r = d.api("GET", f"/api/v1/runs/{run_id}/events")
    types = [e["type"] for e in r.json["events"]]
    check("stall: the run recovers when the phase ends and completes",
          run and run["state"] == "completed" and "recovered" in types, (run, types))


def test_bad_inputs(d, run_id):
    cases = [
        ("malformed JSON: 400 invalid_json",
         ("POST", "/api/v1/runs", '{"model": {"dim": 32,', "application/json"), 400, "invalid_json"),
        ("a config field of the wrong type: 400 invalid_config naming the key",
         ("POST", "/api/v1/runs", '{"train": {"steps": "many"}}', "application/json"), 400, "invalid_config"),
        ("an unknown config field: 400 invalid_config",
         ("POST", "/api/v1/runs", '{"train": {"stepz": 5}}', "application/json"), 400, "invalid_config"),
        ("a YAML config with a bad value: 400 invalid_config",
         ("POST", "/api/v1/runs", "nsa:\n  d: 5\n", "application/yaml"), 400, "invalid_config"),
        ("an empty config body: 400",
         ("POST", "/api/v1/runs", "", "application/yaml"), 400, "invalid_config"),
        ("a config that is a JSON array: 400",
         ("POST", "/api/v1/runs", "[1, 2]", "application/json"), 400, "invalid_config"),
        ("halt with an unknown body field: 400 invalid_argument",
         ("POST", f"/api/v1/runs/{run_id}/halt", '{"bogus": 1}', "application/json"), 400, "invalid_argument"),
        ("halt with a reason of the wrong type: 400 invalid_argument",
         ("POST", f"/api/v1/runs/{run_id}/halt", '{"reason": 5}', "application/json"), 400, "invalid_argument"),
        ("resume with malformed JSON: 400 invalid_json",
         ("POST", f"/api/v1/runs/{run_id}/resume", "{", "application/json"), 400, "invalid_json"),
        ("an oversized body: 413",
         ("POST", "/api/v1/runs", "x" * (MAX_BODY + 1), "application/yaml"), 413, "payload_too_large"),
        ("an unknown route: 404", ("GET", "/api/v1/nope", None, None), 404, "not_found"),
        ("another API version: 404", ("GET", "/api/v2/runs", None, None), 404, "not_found"),
        ("an unknown run: 404", ("GET", "/api/v1/runs/no-such-run", None, None), 404, "not_found"),
        ("an unknown run action: 404", ("GET", f"/api/v1/runs/{run_id}/explode", None, None), 404, "not_found"),
        ("DELETE on runs: 405", ("DELETE", "/api/v1/runs", None, None), 405, "method_not_allowed"),
        ("PUT on health: 405", ("PUT", "/api/v1/health", None, None), 405, "method_not_allowed"),
        ("GET on halt: 405", ("GET", f"/api/v1/runs/{run_id}/halt", None, None), 405, "method_not_allowed"),
        ("OPTIONS (no CORS preflight): 405", ("OPTIONS", "/api/v1/runs", None, None), 405, "method_not_allowed"),
        ("metrics with since=abc: 400", ("GET", f"/api/v1/runs/{run_id}/metrics?since=abc", None, None), 400,
         "invalid_argument"),
        ("metrics with since=-1: 400", ("GET", f"/api/v1/runs/{run_id}/metrics?since=-1", None, None), 400,
         "invalid_argument"),
        ("an unknown query parameter: 400", ("GET", f"/api/v1/runs/{run_id}/metrics?step=3", None, None), 400,
         "invalid_argument"),
        ("a bad run name: 400", ("POST", "/api/v1/runs?name=a/b", "{}", "application/json"), 400,
         "invalid_argument"),
        ("path traversal in the dashboard: 400", ("GET", "/../../etc/passwd", None, None), 400, "bad_path"),
        ("encoded path traversal: 400", ("GET", "/%2e%2e/%2e%2e/etc/passwd", None, None), 400, "bad_path"),
        ("path traversal through a run id: 400",
         ("GET", "/api/v1/runs/..%2f..%2f..%2fetc%2fpasswd", None, None), 400, "bad_path"),
    ]
    for name, (method, path, body, ctype), status, code in cases:
        r = d.request(method, path, body, content_type=ctype)
        ok = r.status == status and r.error_code() == code
        if status == 405:
            ok = ok and r.headers.get("Allow")
        check(name, ok, r)
    # what this daemon cannot run is refused at submit, in one line
    devices = d.api("GET", "/api/v1/version").json.get("devices", [])
    if "cuda" not in devices:
        r = d.request("POST", "/api/v1/runs", json_config(5, runtime={"device": "cuda", "precision": "bf16"}),
                      content_type="application/json")
        msg = (r.json or {}).get("error", {}).get("message", "")
        check("runtime.device cuda on a daemon without a usable GPU: 400 with one line saying so",
              r.status == 400 and r.error_code() == "invalid_config" and "no usable GPU" in msg
              and "\n" not in msg, r)
    else:
        diag("this nsad has a GPU: the no-GPU refusal is not tried")
    r = d.request("POST", "/api/v1/runs", json_config(5, data={"source": "text", "path": "/nonexistent/c.txt"}),
                  content_type="application/json")
    msg = (r.json or {}).get("error", {}).get("message", "")
    check("a data.path that does not exist: 400 naming it", r.status == 400 and r.error_code() == "invalid_config"
          and 'data.path: "/nonexistent/c.txt": does not exist' in msg, r)
    r = d.request("GET", "/api/v1/runs", host="evil.example:8470")
    check("a foreign Host header (DNS rebinding): 403", r.status == 403 and r.error_code() == "forbidden", r)
    r = d.request("GET", "/api/v1/runs", host=f"localhost:{d.port}")
    check("Host localhost:PORT is accepted", r.status == 200, r)
    r = d.request("GET", "/api/v1/runs", headers={"Origin": "http://evil.example"})
    check("a foreign Origin: 403", r.status == 403 and r.error_code() == "forbidden", r)
    r = d.request("GET", "/api/v1/runs", headers={"Origin": f"http://127.0.0.1:{d.port}"})
    check("a same-origin Origin is accepted", r.status == 200, r)
    r = d.request("GET", "/api/v1/runs", headers={"Authorization": "Bearer"})
    check("an empty bearer token: 401", r.status == 401, r)
    r = d.request("POST", "/api/v1/runs", "x" * (MAX_BODY + 1), token=False, content_type="application/yaml")
    check("an oversized body without a token: 401 before reading it", r.status == 401, r)

    # a chunked body over the limit: the length is not known up front
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=HTTP_TIMEOUT)
    try:
        conn.putrequest("POST", "/api/v1/runs")
        conn.putheader("Authorization", f"Bearer {d.token}")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.putheader("Content-Type", "application/yaml")
        conn.endheaders()
        chunk = b"#" * 16384
        for _ in range(MAX_BODY // len(chunk) + 2):
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        status = resp.status
        resp.read()
    except OSError as e:
        status = f"connection error: {e}"
    finally:
        conn.close()
    check("a chunked body over the limit: 413", status == 413, status)

    # too many connections: the ones over the limit get 429
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
            idle.append(s)
        time.sleep(0.3)
        r = d.request("GET", "/api/v1/health", token=False)
        check("more open connections than --max-connections: 429 with Retry-After",
              r.status == 429 and r.error_code() == "too_many_requests" and r.headers.get("Retry-After"), r)
    finally:
        for s in idle:
            s.close()
    ok = wait_for(lambda: d.request("GET", "/api/v1/health", token=False).status == 200, 10)
    check("after the idle connections close, requests are served again", ok, "")
    check("the daemon is still up after every bad input", d.alive(), d.log_text()[-2000:])


def test_dashboard(d):
    r = d.request("GET", "/", token=False)
    csp = r.headers.get("Content-Security-Policy", "")
    check("GET / serves index.html without a token, with the strict CSP and nosniff",
          r.status == 200 and "nsad-test-dashboard" in r.body and r.headers.get("Content-Type", "").startswith("text/html")
          and "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
          and r.headers.get("X-Content-Type-Options") == "nosniff", r)
    r = d.request("GET", "/app.js", token=False)
    check("static JavaScript with its type", r.status == 200 and "javascript" in r.headers.get("Content-Type", ""), r)
    r = d.request("GET", "/missing.js", token=False)
    check("a missing static file: 404", r.status == 404 and r.error_code() == "not_found", r)
    r = d.request("GET", "/.secret", token=False)
    check("a hidden file: 404", r.status == 404, r)
    r = d.request("GET", "/outside.txt", token=False)
    check("a symlink out of the web root: 404", r.status == 404 and "TOPSECRET" not in r.body, r)
    r = d.request("POST", "/index.html", "x", token=False)
    check("POST to a static file: 405", r.status == 405, r)


def test_kill9_resume(workdir, web_root):
    d = Nsad(workdir, web_root)
    if not check("kill -9: nsad starts", d.start(), ""):
        return d
    steps, save_every = 400, 50
    r = d.api("POST", "/api/v1/runs", json_config(steps, train={"save_every": save_every, "log_every": 5}),
              content_type="application/json")
    if not check("kill -9: run created", r.status == 201, r):
        return d
    run_id = r.json["id"]
    def past_checkpoint():
        run = d.run(run_id)
        return run if run and run["last_checkpoint_step"] >= save_every and \
            run["step"] >= run["last_checkpoint_step"] + 10 else None
    run = wait_for(past_checkpoint, 60, 0.02)
    if not check("kill -9: the run passed a checkpoint", run and run["state"] == "running", d.run(run_id)):
        return d
    ckpt_before = run["last_checkpoint_step"]
    d.kill9()
    check("kill -9: nsad is dead", not d.alive(), "")
    if not check("kill -9: nsad restarts on the same state dir", d.start(), d.log_text()[-2000:]):
        return d
    run = d.run(run_id)
    check("kill -9: the run is back under its id, resuming (restarts = 1)",
          run and run["id"] == run_id and run["restarts"] == 1
          and run["state"] in ("starting", "running", "completed"), run)
    run = d.wait_state(run_id, ("completed", "failed", "halted", "nan_halted"), 90)
    check("kill -9: the resumed run completes", run and run["state"] == "completed" and run["step"] == steps, run)
    events = d.api("GET", f"/api/v1/runs/{run_id}/events").json["events"]
    restart = [e for e in events if e["type"] == "restart"]
    resume = [e for e in events if e["type"] == "resume"]
    check("kill -9: restart and resume events; it resumed from the last checkpoint or later",
          restart and resume and resume[-1]["detail"].get("step", -1) >= ckpt_before, (ckpt_before, events[-6:]))
    metrics = d.api("GET", f"/api/v1/runs/{run_id}/metrics").json
    train = metrics["train"]
    got = [p["step"] for p in train]
    check("kill -9: the metric series is whole: every logged step once, none lost",
          got == list(range(5, steps + 1, 5)), got)
    check("kill -9: the series generation tells pollers that redone steps replaced points",
          metrics.get("generation", 0) >= 1, metrics.get("generation"))
    check("kill -9: points rebuilt from the files keep their time, grad norm and memory",
          train and all(p["ts"] and p["grad_norm"] is not None and p["mem_bytes"] for p in train),
          [p for p in train if not (p["ts"] and p["grad_norm"] is not None and p["mem_bytes"])][:3])
    return d


def test_sigterm_resume(workdir, web_root):
    """SIGTERM mid-run: the run checkpoints, stays active on disk, and the
    next nsad resumes it to completion."""
    d = Nsad(workdir, web_root)
    if not check("SIGTERM mid-run: nsad starts", d.start(), ""):
        return d
    steps = 300
    r = d.api("POST", "/api/v1/runs", json_config(steps, train={"log_every": 2}), content_type="application/json")
    if not check("SIGTERM mid-run: run created", r.status == 201, r):
        return d
    run_id = r.json["id"]
    run = wait_for(lambda: (lambda x: x if x and x["step"] >= 20 else None)(d.run(run_id)), 60, 0.02)
    if not check("SIGTERM mid-run: the run is under way", run and run["state"] == "running", d.run(run_id)):
        return d
    rc = d.stop(60)
    check("SIGTERM mid-run: nsad exits 0 after checkpointing", rc == 0, (rc, d.log_text()[-1500:]))
    record = json.load(open(os.path.join(d.state_dir, "runs", run_id, "run.json")))
    stopped_at = record["last_checkpoint_step"]
    check("SIGTERM mid-run: the record stays running with a checkpoint at the stop",
          record["state"] == "running" and stopped_at >= 20 and stopped_at == record["step"], record)
    if not check("SIGTERM mid-run: nsad restarts", d.start(), d.log_text()[-1500:]):
        return d
    run = d.wait_state(run_id, ("completed", "failed", "halted", "nan_halted"), 90)
    check("SIGTERM mid-run: the run resumes and completes", run and run["state"] == "completed", run)
    events = d.api("GET", f"/api/v1/runs/{run_id}/events").json["events"]
    types = [e["type"] for e in events]
    resume = [e for e in events if e["type"] == "resume"]
    check("SIGTERM mid-run: shutdown and restart events, resumed at the stopping step",
          "shutdown" in types and "restart" in types and resume and resume[-1]["detail"].get("step") == stopped_at,
          events[-6:])
    shutdown = [e for e in events if e["type"] == "shutdown"]
    check("SIGTERM mid-run: the shutdown event says SIGTERM stopped it",
          shutdown and shutdown[0]["detail"].get("reason") == "SIGTERM", shutdown)
    hb = open(os.path.join(d.state_dir, "runs", run_id, "out", "heartbeat_rank0.jsonl")).read()
    halts = [json.loads(line) for line in hb.splitlines() if '"event":"halt"' in line]
    check("SIGTERM mid-run: the heartbeat's halt event names SIGTERM, not a halt request",
          halts and halts[0]["detail"].get("reason") == "SIGTERM", halts)
    check("SIGTERM mid-run: the log names it too",
          "for the shutdown (SIGTERM)" in d.log_text(), d.log_text()[-1500:])
    got = [p["step"] for p in d.api("GET", f"/api/v1/runs/{run_id}/metrics").json["train"]]
    check("SIGTERM mid-run: the metric series is whole", got == list(range(2, steps + 1, 2)), got)
    return d


def test_sigterm_while_stuck(workdir, web_root):
    """SIGTERM while the trainer is stuck in a phase: after half of
    --stop-timeout nsad abandons the step and exits 0; the run stays active
    on disk for the next start."""
    d = Nsad(workdir, web_root, args=["--stop-timeout", "4"])
    if not check("SIGTERM while stuck: nsad starts", d.start(), ""):
        return d
    cfg = json_config(30, fault={"stall_at_step": 2, "stall_phase": "optimizer", "stall_seconds": 60.0},
                      watchdog={"optimizer": 0.5})
    r = d.api("POST", "/api/v1/runs", cfg, content_type="application/json")
    if not check("SIGTERM while stuck: run created", r.status == 201, r):
        return d
    run_id = r.json["id"]
    run = d.wait_state(run_id, ("hung",), 30)
    check("SIGTERM while stuck: the run is hung in optimizer", run and run["phase"] == "optimizer", run)
    t0 = time.monotonic()
    rc = d.stop(30)
    took = time.monotonic() - t0
    # the step stalls for 60 s: exiting well before that (d.stop allows 30 s)
    # is the abandoned step, whatever the machine's load does to the 4 s
    check("SIGTERM while stuck: nsad gives the step up and exits 0 long before the stall ends",
          rc == 0 and took < 30 and "abandoning the step" in d.log_text(), (rc, took, d.log_text()[-1500:]))
    record = json.load(open(os.path.join(d.state_dir, "runs", run_id, "run.json")))
    check("SIGTERM while stuck: the record stays active for the next start",
          record["state"] in ("running", "hung"), record)
    return d


def test_hang_exit_policy(workdir, web_root):
    """watchdog.on_hang: exit -> nsad exits 70 with the run hung on disk; the
    next nsad picks the run up again."""
    d = Nsad(workdir, web_root)
    if not check("hang exit policy: nsad starts", d.start(), ""):
        return d
    cfg = json_config(30, fault={"stall_at_step": 3, "stall_phase": "backward", "stall_seconds": 20.0},
                      watchdog={"backward": 0.5, "on_hang": "exit"})
    r = d.api("POST", "/api/v1/runs", cfg, content_type="application/json")
    if not check("hang exit policy: run created", r.status == 201, r):
        return d
    run_id = r.json["id"]
    try:
        rc = d.proc.wait(30)
    except subprocess.TimeoutExpired:
        rc = None
    check("hang exit policy: nsad exits with status 70", rc == 70, (rc, d.log_text()[-1500:]))
    record = json.load(open(os.path.join(d.state_dir, "runs", run_id, "run.json")))
    check("hang exit policy: the record says hung in backward", record["state"] == "hung"
          and record["anomaly"] == "hang:backward", record)
    out_dir = os.path.join(d.state_dir, "runs", run_id, "out")
    dumps = [f for f in os.listdir(out_dir) if f.startswith("stacks-") and f.endswith("-hang.txt")]
    text = open(os.path.join(out_dir, dumps[0])).read() if dumps else ""
    check("hang exit policy: the dump names the phase", "phase: backward" in text, dumps)
    if not check("hang exit policy: nsad restarts", d.start(), d.log_text()[-1500:]):
        return d
    run = d.run(run_id)
    check("hang exit policy: the restarted nsad resumes the run (restarts = 1)",
          run and run["restarts"] == 1 and run["state"] in ("starting", "running", "hung"), run)
    d.kill9()  # the fault would stall it again: this scenario ends here
    return d


def test_fatal_signal(workdir, web_root):
    """A fatal signal logs a stack, then the default action (core dump) runs."""
    d = Nsad(workdir, web_root)
    if not check("fatal signal: nsad starts", d.start(), ""):
        return d
    d.proc.send_signal(signal.SIGSEGV)
    try:
        rc = d.proc.wait(15)
    except subprocess.TimeoutExpired:
        rc = None
    log = d.log_text()
    check("fatal signal: SIGSEGV logs the crashing thread's stack and kills nsad by the signal",
          rc == -signal.SIGSEGV and "fatal signal SIGSEGV" in log and "nsad(" in log.split("fatal signal")[-1],
          (rc, log[-1500:]))
    return d


def test_sdnotify(workdir, web_root):
    """READY=1 after listening, WATCHDOG=1 pings, STATUS= lines."""
    path = os.path.join(workdir, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    d = Nsad(workdir, web_root, {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "600000"})
    try:
        started = d.start()
        messages = []
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                messages.append(sock.recv(4096).decode())
            except socket.timeout:
                pass
            if sum("WATCHDOG=1" in m for m in messages) >= 2 and any("STATUS=" in m for m in messages):
                break
        check("sd_notify: READY=1 once listening", started and any("READY=1" in m for m in messages), messages)
        check("sd_notify: WATCHDOG=1 pings while HTTP and trainer live",
              sum("WATCHDOG=1" in m for m in messages) >= 2, messages)
        check("sd_notify: STATUS= lines", any("STATUS=" in m for m in messages), messages)
        d.proc.send_signal(signal.SIGQUIT)
        ok = wait_for(lambda: "stack dump (SIGQUIT)" in d.log_text(), 10)
        check("SIGQUIT: stacks in the log and nsad keeps running",
              ok and d.alive() and d.request("GET", "/api/v1/health", token=False).status == 200,
              d.log_text()[-1500:])
        rc = d.stop(60)
        check("SIGTERM: clean exit 0", rc == 0, rc)
        try:
            while True:
                messages.append(sock.recv(4096).decode())
        except (socket.timeout, OSError):
            pass
        check("sd_notify: STOPPING=1 on the way out", any("STOPPING=1" in m for m in messages), messages)
    finally:
        d.kill9()
        sock.close()


def test_bad_daemon_config(workdir):
    bad = os.path.join(workdir, "bad.yaml")
    with open(bad, "w") as f:
        f.write("listen: 127.0.0.1:1\nmax_connections: lots\n")
    p = subprocess.run([NSAD, "serve", "--config", bad, "--state-dir", os.path.join(workdir, "s1"),
                        "--socket", "none"], capture_output=True, timeout=30)
    err = p.stderr.decode()
    check("a bad daemon config: exit 78 naming the key", p.returncode == 78 and "max_connections" in err,
          (p.returncode, err))
    with open(bad, "w") as f:
        f.write("colour: blue\n")
    p = subprocess.run([NSAD, "serve", "--config", bad, "--state-dir", os.path.join(workdir, "s1"),
                        "--socket", "none"], capture_output=True, timeout=30)
    check("an unknown daemon config key: exit 78", p.returncode == 78 and "colour" in p.stderr.decode(),
          (p.returncode, p.stderr))
    # the job config's YAML rules (daemon/yamlscalar.h): tags, leading zeros, numbers too small
    for text, want in (
            ("listen: 127.0.0.1:1\nmax_connections: 010\n",
             "bad.yaml:2: max_connections: 010 has a leading zero: YAML 1.1 reads it as octal (8), "
             "YAML 1.2 as decimal (10); allowed: an integer from 1 to 1000"),
            ("peak_tflops: 1e-400\n", "bad.yaml:1: peak_tflops: 1e-400 is too small: it would be stored as 0"),
            ("max_connections: !foo 5\n",
             "bad.yaml:1: max_connections: !foo 5: the tag !foo is not supported; allowed: an integer "
             "from 1 to 1000, untagged or tagged !!int"),
            ("idle_timeout_s: 5\nlisten: !!int 5\n", "bad.yaml:2: listen: !!int 5 is tagged an integer"),
            ("allow_hosts: [a, !!binary aGk=]\n", "bad.yaml:1: allow_hosts: !!binary aGk=: the tag !!binary")):
        with open(bad, "w") as f:
            f.write(text)
        p = subprocess.run([NSAD, "serve", "--config", bad, "--state-dir", os.path.join(workdir, "s1"),
                            "--socket", "none"], capture_output=True, timeout=30)
        check(f"a daemon config refused as a job config would be: {text!r}",
              p.returncode == 78 and want in p.stderr.decode(), (p.returncode, p.stderr))
    # a core tag the key takes, and numbers every YAML reads alike, still load
    with open(bad, "w") as f:
        f.write("max_connections: !!int \"8\"\npeak_tflops: 0.5\nauth: !!bool true\nmodel_keep_s: 0\n")
    p = subprocess.run([NSAD, "serve", "--config", bad, "--state-dir", os.path.join(workdir, "s1"),
                        "--socket", "none", "--listen", "nonsense"], capture_output=True, timeout=30)
    check("a daemon config with the tags its keys take loads (then --listen is refused)",
          p.returncode == 78 and "--listen: 'nonsense'" in p.stderr.decode(), (p.returncode, p.stderr))
    p = subprocess.run([NSAD, "serve", "--listen", f"0.0.0.0:{free_port()}", "--no-auth", "--state-dir",
                        os.path.join(workdir, "s2"), "--socket", "none"], capture_output=True, timeout=30)
    check("a non-loopback bind without a token is refused (exit 78)",
          p.returncode == 78 and "loopback" in p.stderr.decode(), (p.returncode, p.stderr))
    p = subprocess.run([NSAD, "serve", "--web-root", os.path.join(workdir, "no-such-dir"), "--state-dir",
                        os.path.join(workdir, "s4"), "--socket", "none", "--listen", f"127.0.0.1:{free_port()}"],
                       capture_output=True, timeout=30)
    check("a --web-root that is not a directory: exit 78", p.returncode == 78 and "web-root" in p.stderr.decode(),
          (p.returncode, p.stderr))
    p = subprocess.run([NSAD, "serve", "--listen", "nonsense", "--state-dir", os.path.join(workdir, "s3"),
                        "--socket", "none"], capture_output=True, timeout=30)
    check("a malformed --listen: exit 78", p.returncode == 78, (p.returncode, p.stderr))


def make_web_root(workdir):
    web = os.path.join(workdir, "web")
    os.makedirs(web)
    with open(os.path.join(web, "index.html"), "w") as f:
        f.write("<!doctype html><title>nsad-test-dashboard</title>\n")
    with open(os.path.join(web, "app.js"), "w") as f:
        f.write("console.log('nsad');\n")
    with open(os.path.join(web, ".secret"), "w") as f:
        f.write("hidden\n")
    outside = os.path.join(workdir, "outside.txt")
    with open(outside, "w") as f:
        f.write("TOPSECRET\n")
    os.symlink(outside, os.path.join(web, "outside.txt"))
    return web


def scenarios(workdir, daemons):
    web = make_web_root(workdir)
    d = Nsad(subdir(workdir, "main"), web)
    daemons.append(d)
    if check("nsad serve starts and answers health", d.start(), d.log_text()[-3000:] if d.proc else ""):
        test_transport(d)
        run_id = test_lifecycle(d)
        if run_id:
            test_prometheus(d, run_id)
            test_bad_inputs(d, run_id)
            test_concurrent_clients(d, run_id)
        test_dashboard(d)
        test_nan_fault(d)
        test_delete(d)
        test_stall_fault(d)
        check("the daemon survived everything", d.alive(), d.log_text()[-3000:])
        rc = d.stop(60)
        check("SIGTERM: nsad exits 0", rc == 0, rc)
    # each of these starts a daemon of its own, in a directory of its own
    for name, scenario in (("kill9", test_kill9_resume), ("sigterm", test_sigterm_resume),
                           ("sigterm-stuck", test_sigterm_while_stuck), ("hang-exit", test_hang_exit_policy),
                           ("fatal", test_fatal_signal), ("notify", test_sdnotify)):
        daemons.append(scenario(subdir(workdir, name), web))
    test_bad_daemon_config(workdir)


def main():
    return run_daemon_tests("nsad-it-", scenarios)


if __name__ == "__main__":
    sys.exit(main())
