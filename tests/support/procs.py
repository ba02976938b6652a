"""Real `brook` processes for end-to-end and fault tests: start, signal, read their JSON logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brook.replset import pid_alive
from tests.support import launcher
from tests.support.launcher import Forked

__all__ = ["BrookProcess", "brook_cli", "pid_alive", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
# Forked from the test run's launcher, imports done (`launcher.py`); `brook up` is started as
# a new interpreter, as a user starts it (its roles are its own children).
FORKED_ROLES = frozenset({"api", "dispatcher"})
# `python -m brook.cli ROLE`, after asking Linux to SIGKILL the role when its parent (this
# test run) dies. Set in the child after exec: a `preexec_fn` is unsafe in a process with
# threads, as pytest's is (PyMongo's monitors).
_DIE_WITH_PARENT = """
import ctypes, os, runpy, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the parent died before the call: do not outlive it
    os._exit(1)
sys.argv = ["brook", *sys.argv[2:]]
runpy.run_module("brook.cli", run_name="__main__")
"""


class BrookProcess:
    """A role in its own session (a test signals it alone) that dies with the test run, even
    a SIGKILLed one: no orphan keeps a port or claims jobs after pytest is gone. Linux sends
    the death signal when the *thread* that started the child exits, so only a role started
    from the main thread gets it."""

    def __init__(self, role: str, env: dict[str, str], log_path: Path) -> None:
        self.role = role
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._read_to = 0  # logs(): how far the log has been read and parsed
        self._parsed: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | Forked
        # A role with a library of its own preloaded (libfaketime) must be a new process:
        # a fork of the launcher would not load it.
        same_preload = env.get("LD_PRELOAD") == os.environ.get("LD_PRELOAD")
        if role in FORKED_ROLES and launcher.wanted() and same_preload:
            self.proc = Forked([role], env, ROOT, log_path)
            return
        if threading.current_thread() is threading.main_thread():
            argv = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), role]
        else:
            argv = [sys.executable, "-m", "brook.cli", role]
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> list[dict[str, Any]]:
        """Every JSON line the role has written so far. Each call reads and parses only
        what was written since the last one: a test waiting for an event calls this every
        50 ms, and a busy role's log grows to thousands of lines."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._read_to)
            new = fh.read()
        end = new.rfind(b"\n") + 1  # a line still being written is read next time
        self._read_to += end
        for raw in new[:end].splitlines():
            line = raw.decode(errors="replace").strip()
            if line.startswith("{"):
                try:
                    self._parsed.append(json.loads(line))
                except ValueError:
                    continue
        return list(self._parsed)

    def raw_log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]

    def wait_for_event(
        self,
        name: str,
        timeout: float = 30.0,
        where: Callable[[dict[str, Any]], bool] = lambda e: True,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events(name):
                if where(event):
                    return event
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.role} exited ({self.proc.returncode}):\n{self.raw_log()[-3000:]}"
                )
            time.sleep(0.05)
        raise AssertionError(f"no {name} from {self.role} in {timeout}s:\n{self.raw_log()[-3000:]}")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def children(self) -> list[int]:
        """Every descendant (workers are forks of the dispatcher's fork server)."""
        found: list[int] = []
        todo = [self.pid]
        while todo:
            try:
                out = subprocess.run(
                    ["pgrep", "-P", str(todo.pop())], capture_output=True, text=True
                )
            except OSError:
                return found
            kids = [int(p) for p in out.stdout.split()]
            found += kids
            todo += kids
        return found

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def brook_cli(
    *args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`brook ARGS...` run to its end, its stdout and stderr captured as text: forked from the
    launcher, with its imports done, or a new interpreter (`launcher.wanted()`)."""
    if launcher.wanted():
        return launcher.run(list(args), env, cwd, timeout)
    return subprocess.run(
        [sys.executable, "-m", "brook.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
