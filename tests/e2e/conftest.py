"""Real `brook api` / `brook dispatcher` processes on the test replica set."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brook.common.runtime.settings import Settings
from tests.conftest import brook_env
from tests.support.http import TLS
from tests.support.procs import BrookProcess, brook_cli, pid_alive, wait_until

JSON = {"Content-Type": "application/json"}  # what a request body must be


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Cluster:
    """Processes started by one test; all are stopped (and checked for orphans) at the end."""

    def __init__(self, settings: Settings, tmp: Path) -> None:
        self.settings = settings
        self.tmp = tmp
        self.procs: list[BrookProcess] = []
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a `brook` process of this test: its settings, this API's port."""
        return brook_env(self.settings, **{"BROOK_API_PORT": str(self.port), **extra})

    def start(self, role: str, **env: str) -> BrookProcess:
        n = len(self.procs)
        proc = BrookProcess(role, self.env(**env), self.tmp / f"{role}-{n}.log")
        self.procs.append(proc)
        return proc

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """`brook ARGS...` against this test's API, run to its end (60 s at most), its output
        captured."""
        return brook_cli(*args, env=self.env(**env))

    def api(self, **env: str) -> BrookProcess:
        proc = self.start("api", **env)
        wait_until(self._healthy, timeout=30)
        return proc

    def dispatcher(self, **env: str) -> BrookProcess:
        proc = self.start("dispatcher", **env)
        proc.wait_for_event("dispatcher.ready", timeout=60)
        return proc

    def tails(self, lines: int = 40, width: int = 400) -> str:
        """The last `lines` lines of each process's log: a failed test's account."""
        out = []
        for i, proc in enumerate(self.procs):
            tail = proc.raw_log().splitlines()[-lines:]
            out.append(f"-- {proc.role} #{i} (pid {proc.pid}, {proc.log_path.name}):")
            out += [line[:width] for line in tail]
        return "\n".join(out)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/healthz", timeout=1, verify=TLS).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        children: list[int] = []
        for proc in self.procs:
            children += proc.children()
            proc.stop()
        # Ctrl-C leaves nothing behind: no worker outlives its dispatcher.
        wait_until(lambda: not any(pid_alive(p) for p in children), timeout=10)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran processes shows the end of each one's log."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.when == "call" and report.failed and isinstance(cluster, Cluster):
        report.sections.append(("brook processes: the end of each log", cluster.tails()))


@pytest.fixture
def cluster(settings: Settings, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(settings, tmp_path)
    yield c
    c.close()


@pytest.fixture
def http(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.api_url, timeout=30, verify=TLS) as client:
        yield client


def wait_terminal(http: httpx.Client, job_id: str, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job: dict[str, Any] = http.get(f"/jobs/{job_id}").json()
        return job if job["status"] in ("completed", "failed", "cancelled") else None

    # A terminal status stays: a look every 0.2 s misses none of it, and costs the API, the
    # set and this process a quarter of what one every 50 ms did (about 6 CPU-ms a look).
    result: dict[str, Any] = wait_until(done, timeout=timeout, interval=0.2)
    return result


Submit = Callable[..., dict[str, Any]]
