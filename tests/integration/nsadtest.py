"""nsadtest.py - what the integration tests (tests/integration/test_*.py)
share: the paths of the build, TAP output, bounded waits, and an `nsad
serve` process with the life cycle every daemon test gives it.

A test imports it from its own directory (sys.path[0] when it runs as a
script). Python 3 standard library only. Not a test itself: tests/run.sh
runs the executable test_* files.
"""
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# NSAD_BIN runs the suite against another build (a sanitizer build, say)
NSAD = os.environ.get("NSAD_BIN") or os.path.join(ROOT, "build", "nsad")
NSACTL = os.path.join(ROOT, "build", "nsactl")
CORPUS = os.path.join(ROOT, "build", "data", "fortunes.txt")

# ---- TAP ---------------------------------------------------------------------

_count = 0
_failed = 0


def check(name, ok, detail=""):
    """Reports one test line ("ok N - name" or "not ok N - name" and the
    first 40 lines of detail as comments); returns ok."""
    global _count, _failed
    _count += 1
    if ok:
        print(f"ok {_count} - {name}", flush=True)
    else:
        _failed += 1
        print(f"not ok {_count} - {name}", flush=True)
        for line in str(detail).splitlines()[:40]:
            print(f"#   {line}", flush=True)
    return ok


def skip(name, reason):
    """Reports one skipped test line (a TAP SKIP: neither passed nor failed)."""
    global _count
    _count += 1
    print(f"ok {_count} - {name} # SKIP {reason}", flush=True)


def diag(msg):
    print(f"# {msg}", flush=True)


def failed():
    """How many test lines failed so far."""
    return _failed


def finish():
    """Prints the plan (1..N); returns the exit status: 1 when a test failed."""
    print(f"1..{_count}", flush=True)
    return 1 if _failed else 0


def require_built(path):
    """True when path is an executable; else reports the one failing test
    line and the plan (make all builds it) and returns False."""
    if os.access(path, os.X_OK):
        return True
    print(f"not ok 1 - {path} exists (run make all)")
    print("1..1")
    return False


# ---- waiting, places ---------------------------------------------------------


def wait_for(fn, timeout, interval=0.05):
    """Calls fn until it returns a truthy value or timeout seconds pass.
    Returns the last value."""
    end = time.monotonic() + timeout
    value = fn()
    while not value and time.monotonic() < end:
        time.sleep(interval)
        value = fn()
    return value


def free_port():
    """A loopback TCP port no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subdir(parent, name):
    """parent/name, made (it must not exist yet)."""
    path = os.path.join(parent, name)
    os.makedirs(path)
    return path


def ensure_corpus():
    """Builds the fortunes corpus (scripts/make-corpus.sh) unless it is there."""
    if not os.path.exists(CORPUS):
        subprocess.run([os.path.join(ROOT, "scripts", "make-corpus.sh")], check=True, capture_output=True)


def corpus_slice(path, offset, n):
    """Writes n bytes of the corpus from offset to path (a held-out file);
    returns path."""
    with open(CORPUS, "rb") as f:
        f.seek(offset)
        text = f.read(n)
    with open(path, "wb") as f:
        f.write(text)
    return path


def first_line(text, prefix):
    """The first line of text that starts with prefix, or ""."""
    return next((line for line in text.splitlines() if line.startswith(prefix)), "")


# ---- nsad serve --------------------------------------------------------------


def _no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class NsadProcess:
    """One `nsad serve` a test runs in workdir (state in workdir/state), its
    output appended to workdir/nsad.log. A subclass says how to start it
    (spawn with its arguments) and how to read a run (run)."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.state_dir = os.path.join(workdir, "state")
        self.log_path = os.path.join(workdir, "nsad.log")
        self.proc = None

    def spawn(self, args, env=None):
        """Starts `nsad serve ARGS` (no core dumps) with env (None: ours)."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([NSAD, "serve"] + args, stdout=log, stderr=log, env=env,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir,
                                         preexec_fn=_no_core_dumps)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def run(self, run_id):
        raise NotImplementedError

    def wait_state(self, run_id, states, timeout):
        """The run once its state is one of states, or None after timeout."""
        def probe():
            run = self.run(run_id)
            return run if run and run["state"] in states else None
        return wait_for(probe, timeout)

    def stop(self, timeout=60):
        """SIGTERM, then SIGKILL after timeout. Returns the exit status."""
        if not self.proc or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


def run_daemon_tests(prefix, scenarios):
    """The main of a test that runs nsad serve: nsad must be built; then
    scenarios(workdir, daemons) runs in a new /tmp/PREFIX* directory,
    adding each NsadProcess it starts to the list daemons. Afterwards every
    one still running is killed, and the directory removed unless a test
    failed (then its logs stay, and a comment says where). Prints the plan;
    returns the exit status."""
    if not require_built(NSAD):
        return 1
    workdir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    daemons = []
    try:
        scenarios(workdir, daemons)
    finally:
        for d in daemons:
            if d:
                d.kill9()
        if _failed:
            diag(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit("nsadtest.py is the integration tests' helper module; run tests/run.sh")
