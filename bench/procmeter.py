"""Memory and CPU of a process tree, sampled from `/proc` (standard library only: the peer
drivers import it from the peers' own virtualenvs).

`TreeMeter(pid)` samples the process and all its descendants every `interval` seconds from a
thread: the sum of their PSS (`/proc/<pid>/smaps_rollup`), its peak, and each process's
user + system CPU time (`/proc/<pid>/stat`). A process that exits between two samples loses
at most its last interval of CPU time.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree(root: int) -> list[int]:
    """`root` and every descendant of it that is alive now."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                parents.setdefault(int(fields[1]), []).append(int(entry))
    out = [root]
    todo = list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += parents.get(pid, [])
    return out


def pss_kib(pid: int) -> int:
    """The PSS of one process in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cpu_s(pid: int) -> float | None:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK if fields else None


class TreeMeter:
    """Samples the tree under `root` from a thread until `stop()`; `mark()` starts the
    measured window (CPU is counted from there, peak PSS too; `idle_pss_mib` is the last
    sample before it)."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        self.root = root
        self.interval = interval
        self.peak_kib = 0
        self.idle_kib = 0
        self.samples = 0
        self.max_processes = 0
        self._baseline: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._marked = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-meter", daemon=True)

    def start(self) -> TreeMeter:
        self._sample()
        self._thread.start()
        return self

    def mark(self) -> None:
        """The measured window starts now."""
        self._sample()
        with self._lock:
            self._marked = True
            self._baseline = dict(self._last)
            self.peak_kib = 0
            self.samples = 0

    def _sample(self) -> None:
        pids = tree(self.root)
        total = 0
        cpu: dict[int, float] = {}
        for pid in pids:
            total += pss_kib(pid)
            used = cpu_s(pid)
            if used is not None:
                cpu[pid] = used
        with self._lock:
            self._last.update(cpu)
            if self._marked:
                self.peak_kib = max(self.peak_kib, total)
                self.samples += 1
                self.max_processes = max(self.max_processes, len(pids))
            else:
                self.idle_kib = total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> dict[str, Any]:
        """One last sample; the window's figures."""
        self._sample()
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            used = sum(v - self._baseline.get(pid, 0.0) for pid, v in self._last.items())
            return {
                "idle_pss_mib": round(self.idle_kib / 1024, 1),
                "peak_pss_mib": round(self.peak_kib / 1024, 1),
                "cpu_s": round(used, 2),
                "samples": self.samples,
                "max_processes": self.max_processes,
            }


def per_job(figs: dict[str, Any], jobs: int) -> dict[str, Any]:
    """`figs` with `cpu_ms_per_job` added."""
    return {**figs, "cpu_ms_per_job": round(figs["cpu_s"] * 1000 / max(jobs, 1), 2)}


def wait_until(check: Any, timeout: float, what: str, step: float = 0.05) -> None:
    """Poll `check()` until true; RuntimeError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(step)
