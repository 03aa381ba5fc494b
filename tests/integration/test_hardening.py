#!/usr/bin/env python3
"""test_hardening.py - what a hostile client, an odd signal or a damaged
file did to nsad before issue 39, each now answered or survived.

  1. a config body that made libyaml work for minutes (a megabyte of '[',
     of "{a: "): 400 naming the limit at once; health answers throughout
  2. connections that trickle headers: cut at --request-timeout however
     often they send a byte; a client address gets at most
     --max-connections-per-client; TCP clients never make the Unix socket
     answer 429
  3. SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT, SIGALRM to `nsad serve` and to
     `nsad train`: logged (stacks for USR1/QUIT), nothing stops; SIGTERM
     then checkpoints and exits 0
  5. a run whose newest checkpoint is damaged: `nsad serve` resumes it from
     the previous complete one by itself and says so in the log
  7. %00 in a URL: 400 instead of a silently shortened path

Uses the helpers of test_api.py (the same nsad serve harness). Python 3
standard library only; TAP output; every wait is bounded (the bounds are
generous: nothing here measures speed).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_api as t  # noqa: E402

check, wait_for, subdir, Nsad, NSAD = t.check, t.wait_for, t.subdir, t.Nsad, t.NSAD

ALIVE_SIGNALS = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM]


def safe(fn, *args, **kw):
    """fn's result, or the OSError it raised (a timeout is an answer too)."""
    try:
        return fn(*args, **kw)
    except OSError as e:
        return e


def start(d):
    """d.start(), False when nsad exits at once (an older nsad refuses the
    options these tests pass)."""
    try:
        return d.start()
    except OSError:
        return False


def started(d, name):
    """start(d), reported as the test line `name` (with the log when it
    fails); returns whether nsad runs."""
    return check(name, start(d), d.log_text()[-2000:] if d.proc else "")


def ok_status(r, status=200):
    return isinstance(r, t.Response) and r.status == status


def raw_connect(d):
    return socket.create_connection(("127.0.0.1", d.port), timeout=5)


def unfinished_request(d):
    """A TCP connection to d that has sent a request line and no more."""
    s = raw_connect(d)
    s.sendall(b"GET /api/v1/health HTTP/1.1\r\n")
    return s


def closed_by_server(sock, timeout):
    """True when the peer closes (or resets) sock within timeout seconds."""
    sock.settimeout(0.2)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if sock.recv(4096) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_hostile_configs(d):
    """Item 1: bodies that froze the API for minutes."""
    bodies = [
        ("a megabyte of '['", "[" * (1 << 20), "application/yaml", "nesting deeper than 16 levels"),
        ("250000 times '{a: '", "{a: " * 250000, "application/yaml", "nesting deeper than 16 levels"),
        ("140000 keys", "model:\n" + "  k: 1\n" * 140000, "application/yaml", "more than 4096 values"),
    ]
    for name, body, ctype, needle in bodies:
        result = {}

        def post():
            try:
                result["r"] = d.request("POST", "/api/v1/runs", body, content_type=ctype)
            except OSError as e:
                result["r"] = e
        poster = threading.Thread(target=post)
        poster.start()
        health = [safe(d.api, "GET", "/api/v1/health"), safe(d.request, "GET", "/api/v1/health", token=False)]
        poster.join(t.HTTP_TIMEOUT + 5)
        r = result.get("r")
        msg = r.json["error"]["message"] if isinstance(r, t.Response) and r.json else ""
        check(f"POST /api/v1/runs with {name}: 400 invalid_config naming the limit",
              isinstance(r, t.Response) and r.status == 400 and r.error_code() == "invalid_config"
              and needle in msg, r)
        check(f"  health answers on the Unix socket and TCP meanwhile ({name})",
              all(ok_status(h) for h in health), health)
    r = safe(d.request, "POST", "/api/v1/runs", "[" * 5000, content_type="application/json")
    check("a JSON body nested 5000 deep: 400 invalid_json",
          ok_status(r, 400) and r.error_code() == "invalid_json", r)


def test_url_nul(d):
    """Item 7: %00 cut the path short instead of failing."""
    r = safe(d.request, "GET", "/api/v1/health%00/../../etc/passwd", token=False)
    check("%00 in the path: 400 bad_path", ok_status(r, 400) and r.error_code() == "bad_path", r)
    r = safe(d.api, "GET", "/api/v1/health%00x")
    check("%00 in the path over the Unix socket: 400 bad_path", ok_status(r, 400) and r.error_code() == "bad_path", r)
    r = safe(d.api, "GET", "/api/v1/runs?x=ok%00evil")
    check("%00 in a query value: 400 invalid_argument",
          ok_status(r, 400) and r.error_code() == "invalid_argument", r)


def test_unix_never_starved(workdir, web_root):
    """Item 2: TCP connections used to count against the Unix socket too."""
    d = Nsad(workdir, web_root, args=["--max-connections", "4"])
    if not started(d, "starvation: nsad starts"):
        return d
    idle = []
    try:
        for _ in range(8):
            try:
                idle.append(raw_connect(d))
            except OSError:
                break
        time.sleep(0.3)
        r = safe(d.api, "GET", "/api/v1/health")
        check("8 idle TCP connections (--max-connections 4): the Unix socket still answers 200",
              ok_status(r), r)
    finally:
        for s in idle:
            s.close()
    return d


def test_request_deadline(workdir, web_root):
    """Item 2: a header line now and then kept a connection open forever."""
    d = Nsad(workdir, web_root, args=["--request-timeout", "2"])
    if not started(d, "slowloris: nsad starts"):
        return d
    trickler = unfinished_request(d)
    cut = False
    end = time.monotonic() + 20
    while time.monotonic() < end and not cut:
        try:
            trickler.sendall(b"X-Slow: 1\r\n")
        except OSError:
            cut = True
            break
        cut = closed_by_server(trickler, 0.5)
    trickler.close()
    check("a connection trickling a header line every 0.5 s is closed (--request-timeout 2)", cut,
          d.log_text()[-1500:])
    # the client can see the close before the listener thread writes its line
    check("  the cut is logged", wait_for(lambda: "--request-timeout" in d.log_text(), 10), d.log_text()[-1500:])
    held = []
    try:
        for _ in range(3):
            held.append(unfinished_request(d))
        r = safe(d.api, "GET", "/api/v1/health")
        check("  while requests hang unfinished on TCP, the Unix socket answers 200", ok_status(r), r)
        check("  each unfinished request is cut at the deadline", all(closed_by_server(s, 15) for s in held), "")
    finally:
        for s in held:
            s.close()
    ok = wait_for(lambda: ok_status(safe(d.request, "GET", "/api/v1/health", token=False)), 10)
    check("  afterwards TCP answers again", ok, "")
    rc = d.stop(30)
    check("  SIGTERM: exit 0", rc == 0, rc)
    return d


def test_per_client_limit(workdir, web_root):
    """Item 2: one address could hold every connection there was."""
    d = Nsad(workdir, web_root, args=["--max-connections-per-client", "3"])
    if not started(d, "per client: nsad starts"):
        return d
    held = []
    try:
        for _ in range(3):
            held.append(unfinished_request(d))
        time.sleep(0.3)
        extra = raw_connect(d)
        # the request deadline (30 s) is far off: a close now is the limit's
        refused = closed_by_server(extra, 10)
        extra.close()
        check("a 4th connection from one address (--max-connections-per-client 3) is closed unanswered",
              refused, "")
        r = safe(d.api, "GET", "/api/v1/health")
        check("  meanwhile the Unix socket answers 200", ok_status(r), r)
        held[0].sendall(b"Host: 127.0.0.1\r\n\r\n")
        check("  the 3 connections it holds are still served", held[0].recv(12).startswith(b"HTTP/1.1 200"), "")
    finally:
        for s in held:
            s.close()
    rc = d.stop(30)
    check("  SIGTERM: exit 0", rc == 0, rc)
    return d


def test_serve_signals(workdir, web_root):
    """Item 3: SIGUSR1 ended nsad serve (exit 138)."""
    d = Nsad(workdir, web_root)
    if not started(d, "signals: nsad serve starts"):
        return d
    for sig in ALIVE_SIGNALS:
        d.proc.send_signal(sig)
        ok = wait_for(lambda: f"{sig.name}:" in d.log_text() or f"stack dump ({sig.name})" in d.log_text(), 10)
        check(f"nsad serve: {sig.name} is logged and nsad keeps answering",
              ok and d.alive() and ok_status(safe(d.api, "GET", "/api/v1/health")), d.log_text()[-1500:])
    check("nsad serve: SIGUSR1 dumps every thread's stack",
          wait_for(lambda: "stack dump (SIGUSR1)" in d.log_text() and 'thread "http-unix"' in d.log_text(), 10),
          d.log_text()[-1500:])
    rc = d.stop(30)
    check("nsad serve: SIGTERM afterwards exits 0", rc == 0, rc)
    return d


def train_config(out_dir, steps):
    cfg = json.loads(t.json_config(steps))
    cfg["train"]["out_dir"] = out_dir
    return json.dumps(cfg)


def test_train_signals(workdir):
    """Item 3: SIGHUP and SIGQUIT ended nsad train with no checkpoint."""
    out = os.path.join(workdir, "out")
    cfg = os.path.join(workdir, "job.json")
    with open(cfg, "w") as f:
        f.write(train_config(out, 10 ** 7))
    log_path = os.path.join(workdir, "train.log")
    with open(log_path, "wb") as log:
        p = subprocess.Popen([NSAD, "train", cfg, "--quiet"], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        csv = os.path.join(out, "training.csv")
        started = wait_for(lambda: os.path.exists(csv) and len(open(csv).readlines()) > 2, 60)
        check("nsad train: training has started", started, open(log_path).read()[-1500:])
        for sig in ALIVE_SIGNALS:
            p.send_signal(sig)
            ok = wait_for(lambda: f"{sig.name}:" in open(log_path).read(), 10)
            check(f"nsad train: {sig.name} is logged and the run goes on", ok and p.poll() is None,
                  open(log_path).read()[-1500:])
        dumps = [n for n in os.listdir(out) if n.startswith("stacks-")]
        check("nsad train: SIGUSR1 and SIGQUIT each wrote a stack file", len(dumps) == 2, dumps)
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
        metrics = {}
        try:
            with open(os.path.join(out, "metrics.json")) as f:
                metrics = json.load(f)
        except (OSError, ValueError):
            pass
        check("nsad train: SIGTERM checkpoints, writes metrics.json (halted) and exits 0",
              rc == 0 and os.path.exists(os.path.join(out, "checkpoints", "latest"))
              and metrics.get("outcome") == "halted", (rc, metrics, open(log_path).read()[-1500:]))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_damaged_checkpoint_fallback(workdir, web_root):
    """Item 5: the daemon resumes from the previous complete checkpoint when
    the newest is damaged, and logs it. SIGTERM leaves the run active on disk
    with a fresh checkpoint and no save in progress; the next start resumes
    it by itself."""
    d = Nsad(workdir, web_root)
    if not started(d, "fallback: nsad starts"):
        return d
    body = t.json_config(10 ** 7, train={"save_every": 5, "keep_last": 3})
    r = safe(d.api, "POST", "/api/v1/runs", body, content_type="application/json")
    if not check("fallback: a run starts", ok_status(r, 201), r):
        return d
    run_id = r.json["id"]
    ck = os.path.join(d.state_dir, "runs", run_id, "out", "checkpoints")

    def step_dirs():
        try:
            return sorted(n for n in os.listdir(ck) if n.startswith("step_"))
        except OSError:
            return []
    check("fallback: the run has written two checkpoints", wait_for(lambda: len(step_dirs()) >= 2, 60), "")
    rc = d.stop(60)
    check("fallback: SIGTERM checkpoints the run and exits 0", rc == 0, rc)
    with open(os.path.join(ck, "latest")) as f:
        newest = f.read().strip()
    older = [n for n in step_dirs() if n < newest]
    if not check("fallback: an older checkpoint is there to fall back to", older, step_dirs()):
        return d
    previous = older[-1]
    model = os.path.join(ck, newest, "model.safetensors")
    with open(model, "r+b") as f:
        f.seek(os.path.getsize(model) - 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))
    if not check("fallback: nsad restarts", start(d), d.log_text()[-2000:]):
        return d

    def logged():
        line = next((ln for ln in d.log_text().splitlines() if "skipping damaged checkpoints" in ln), "")
        return newest in line and line.endswith(f"resuming from {ck}/{previous}")
    check(f"fallback: the log says {newest} is damaged and the run resumes from {previous}",
          wait_for(logged, 30), d.log_text()[-2500:])
    def resumes():
        r = safe(d.api, "GET", f"/api/v1/runs/{run_id}/events")
        events = (r.json if isinstance(r, t.Response) else None) or {}
        return [e for e in events.get("events", []) if e["type"] == "resume"]
    # the log line comes before the model is loaded, the event after: wait for it
    got = wait_for(resumes, 30)
    check("fallback: the resume event names the previous checkpoint",
          got and got[-1]["detail"].get("checkpoint", "").endswith(previous), got)
    safe(d.api, "POST", f"/api/v1/runs/{run_id}/halt")
    rc = d.stop(60)
    check("fallback: SIGTERM exits 0", rc == 0, rc)
    return d


def scenarios(workdir, daemons):
    web = t.make_web_root(workdir)
    d = Nsad(subdir(workdir, "main"), web, args=["--max-body", str(2 << 20)])
    daemons.append(d)
    if check("nsad serve starts (--max-body 2 MiB)", start(d), d.log_text()[-3000:] if d.proc else ""):
        test_hostile_configs(d)
        test_url_nul(d)
        check("the daemon survived every hostile body", d.alive(), d.log_text()[-3000:])
        rc = d.stop(30)
        check("SIGTERM after the hostile bodies: exit 0 at once", rc == 0, rc)
    daemons.append(test_unix_never_starved(subdir(workdir, "starve"), web))
    daemons.append(test_request_deadline(subdir(workdir, "slow"), web))
    daemons.append(test_per_client_limit(subdir(workdir, "per-client"), web))
    daemons.append(test_serve_signals(subdir(workdir, "signals"), web))
    test_train_signals(subdir(workdir, "train"))
    daemons.append(test_damaged_checkpoint_fallback(subdir(workdir, "fallback"), web))


def main():
    return t.run_daemon_tests("nsad-hard-", scenarios)


if __name__ == "__main__":
    sys.exit(main())
