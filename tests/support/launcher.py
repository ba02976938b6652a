"""Start `brook api` / `brook dispatcher` for a test as a fork of an interpreter that has
already imported them, instead of a new interpreter importing everything again.

A role's start is mostly imports (about 0.35 CPU-s for a dispatcher, 0.7 for an API, on
these 2 cores), and a run of the suite starts about 250 of them. The launcher is one
process per test run (or xdist worker), started from its main thread: a fresh `python`
that imports the roles' modules once, starts no thread and opens no connection, then waits
for requests. For each it forks a child that becomes the role, as `python -m brook.cli
ROLE` would: its own session, its log file as stdout and stderr, the test's environment,
working directory and `PYTHONPATH`, then `brook.cli`'s `__main__` run to the end and the
interpreter's own exit (atexit handlers included). The role's MongoDB client, threads and
event loop are all made in the role, after the fork, as ever. A dispatcher's
worker fork server is forked too, by the role before it runs anything: multiprocessing's
own server loop in a process that has already imported what a fresh server would, handed
to the role as if `ensure_running` had started it (0.45 CPU-s saved a dispatcher, about
150 of them a run). It holds no client or thread, and exits with the role as ever.

Lifetimes, as with `procs._DIE_WITH_PARENT`: the launcher dies with the test run
(`PR_SET_PDEATHSIG` toward the thread that started it, the main thread), and each role
with the launcher, so a SIGKILLed run leaves no role behind. The launcher reaps its
children and reports each exit status, which `Forked` (a `subprocess.Popen` look-alike)
hands to the test: `poll`, `wait`, `returncode`, `send_signal`, `kill`.

The CLI's one-shot commands (`brook ls`, `brook submit`…) are forked the same way when a
test only reads what they print (`procs.brook_cli`). `BROOK_TEST_FORK_ROLES=0` starts every
role and command as a new interpreter instead.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What the launcher imports before it forks: every module a role imports at start-up.
PRELOAD = (
    "brook.cli",
    "brook.roles",
    "brook.dispatcher.dispatcher",
    "brook.executor.forking",
    "brook.executor.registry",
    "brook.executor.worker",
    "brook.executor.demo",
    "brook.common.runtime.log",
    "brook.ingest.app",
    "uvicorn",
)

# The launcher itself (run with `python -c`; "brook.cli" in its argv marks its children as
# Brook's in /proc/PID/cmdline, as `python -m brook.cli` does).
_SERVE = r"""
import ctypes, gc, importlib, json, os, select, signal, sys, threading

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the test run
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
for name in sys.argv[3].split(","):
    importlib.import_module(name)
assert threading.active_count() == 1, "the launcher must not start threads: it forks"
gc.collect()
gc.freeze()  # what the imports made stays shared with every fork


def serve():
    # Requests on stdin, one JSON line each; on stdout, "started PID" per request and
    # "exited PID STATUS" for each child reaped.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    out = os.fdopen(1, "w", buffering=1, closefd=False)
    pending = b""
    while True:
        ready = select.select([0, wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                out.write(f"exited {pid} {status}\n")
        if 0 in ready:
            data = os.read(0, 1 << 20)
            if not data:  # the test run closed its end: it is done
                os._exit(0)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    return request
                out.write(f"started {pid}\n")


def start_fork_server():
    # A dispatcher's worker fork server, as a fork of this process (which has imported what
    # the server would preload) rather than a new interpreter: multiprocessing's own server
    # loop, handed to the role as if its `ensure_running` had spawned it. Its lifetime is
    # the same: it exits when the role, which holds the "alive" pipe's write end, dies.
    import socket
    from multiprocessing import connection, forkserver

    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        try:
            forkserver.main(listener.fileno(), alive_r, [])
        finally:
            os._exit(0)
    os.close(alive_r)
    listener.close()
    server = forkserver._forkserver
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


def become(request):
    import io, multiprocessing, runpy

    launcher = os.getppid()
    os.setsid()
    libc.prctl(1, signal.SIGKILL)  # die with the launcher (and so with the test run)
    if os.getppid() != launcher:
        os._exit(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(1, entry)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=name == "stderr",
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    multiprocessing.current_process().authkey = os.urandom(32)  # as a new interpreter has
    sys.argv = ["brook", *request["argv"]]
    if request["argv"][:1] == ["dispatcher"]:
        start_fork_server()
    runpy.run_module("brook.cli", run_name="__main__")


request = serve()
del serve
become(request)
"""


def wanted() -> bool:
    """Whether roles are forked from the launcher (`BROOK_TEST_FORK_ROLES`, default on);
    only a role started from the main thread is, as only that thread's death kills it."""
    if os.environ.get("BROOK_TEST_FORK_ROLES", "1").strip() == "0":
        return False
    return threading.current_thread() is threading.main_thread()


class Launcher:
    """The test run's launcher process, and the exit statuses it has reported."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(os.getpid()), "brook.cli", ",".join(PRELOAD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self._out = self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        self._pending = b""
        self._started: list[int] = []
        self.statuses: dict[int, int] = {}
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(
        self, argv: list[str], env: Mapping[str, str], cwd: Path, stdout: Path, stderr: Path
    ) -> int:
        """Fork `brook ARGV...`; the child's pid."""
        request = {
            "argv": argv,
            "env": dict(env),
            "cwd": str(cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + 60
            while not self._started:
                if not self.alive():
                    raise RuntimeError(f"the role launcher exited ({self.proc.returncode})")
                if time.monotonic() > deadline:
                    raise RuntimeError("the role launcher did not start the role in 60 s")
                select.select([self._out], [], [], 0.5)
                self._drain()
            return self._started.pop(0)

    def status(self, pid: int) -> int | None:
        """The wait status of `pid` once the launcher has reaped it, else None."""
        with self._lock:
            self._drain()
            return self.statuses.get(pid)

    def _drain(self) -> None:
        try:
            data = os.read(self._out, 1 << 16)
        except BlockingIOError:
            return
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            word, *rest = line.decode().split()
            if word == "started":
                self._started.append(int(rest[0]))
            elif word == "exited":
                self.statuses[int(rest[0])] = int(rest[1])


_launcher: Launcher | None = None


def launcher() -> Launcher:
    """This test run's launcher, started on first use (from the main thread)."""
    global _launcher
    if _launcher is None or not _launcher.alive():
        _launcher = Launcher()
    return _launcher


class Forked:
    """A role forked by the launcher, with the part of `subprocess.Popen`'s interface the
    tests use. The role is the launcher's child, not this process's: its exit status comes
    from the launcher, which reaps it."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: Path,
        stdout: Path,
        stderr: Path | None = None,
    ) -> None:
        self._launcher = launcher()
        self.args = ["brook", *argv]
        self.pid = self._launcher.start(argv, env, cwd, stdout, stderr or stdout)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self._launcher.status(self.pid)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif not self._launcher.alive():  # the launcher died: so did its children
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(
    argv: list[str], env: Mapping[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`brook ARGV...` forked and waited for, its output captured, as `subprocess.run(...,
    capture_output=True, text=True, timeout=...)` would (killed, then TimeoutExpired)."""
    with tempfile.TemporaryDirectory(prefix="brook-cli-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = Forked(argv, env, cwd, out, err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(
            ["brook", *argv], code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )
