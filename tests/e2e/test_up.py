"""`brook up` as a user runs it: everything in the foreground, a role that dies is restarted,
Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from brook.replset import ReplicaSet
from tests.conftest import ROOT, extra_port
from tests.e2e.conftest import free_port
from tests.support.http import TLS
from tests.support.procs import brook_cli, pid_alive, wait_until


@pytest.mark.timeout(330)  # its own waits: 90 + 30 + 60 + 30 + 60 + 40 s
def test_brook_up_runs_everything_restarts_a_killed_dispatcher_and_ctrl_c_cleans_up(
    tmp_path: Path,
) -> None:
    port = free_port()
    mongo_port = extra_port("up")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROOK_")}
    env.update(
        {
            "BROOK_HOME": str(tmp_path / "home"),
            "BROOK_MONGO_PORT": str(mongo_port),
            "BROOK_API_PORT": str(port),
            "BROOK_CONCURRENCY": "2",
            "BROOK_SHUTDOWN_GRACE_SECONDS": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    up = subprocess.Popen(
        [sys.executable, "-m", "brook.cli", "up"],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    rs = ReplicaSet(home=tmp_path / "home", base_port=mongo_port)

    def events(name: str) -> list[dict[str, Any]]:
        lines = (tmp_path / "up.log").read_text(errors="replace").splitlines()
        return [
            e for e in (json.loads(x) for x in lines if x.startswith("{")) if e.get("event") == name
        ]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return brook_cli(*args, env=env)

    try:
        wait_until(lambda: events("up.started"), timeout=90)
        wait_until(lambda: _ok(f"http://127.0.0.1:{port}/readyz"), timeout=30)
        assert sorted(s for _, s in rs.member_states()) == ["PRIMARY", "SECONDARY", "SECONDARY"]
        done = cli("submit", "echo", "--payload", '{"x": 1}', "--wait", "--wait-timeout", "60")
        assert done.returncode == 0 and json.loads(done.stdout) == {"x": 1}, done.stderr

        dispatcher = int(events("up.started")[0]["pids"]["dispatcher"])
        os.kill(dispatcher, signal.SIGKILL)
        wait_until(lambda: events("up.child_restarted"), timeout=30)
        again = cli("submit", "echo", "--payload", '{"y": 2}', "--wait", "--wait-timeout", "60")
        assert again.returncode == 0 and json.loads(again.stdout) == {"y": 2}, again.stderr

        mongods = [rs.pid(i) for i in range(3)]
        roles = [int(e["pid"]) for e in events("up.child_restarted")]
        roles += [int(p) for p in events("up.started")[0]["pids"].values()]
        workers = [int(e["pid"]) for e in events("worker.started")]
        assert len(workers) >= 4  # two per dispatcher, both generations
        up.send_signal(signal.SIGINT)  # Ctrl-C
        assert up.wait(40) == 0
    finally:
        if up.poll() is None:
            up.kill()
            rs.down()
        log.close()
    assert events("mongo.down") and events("up.stopped")
    assert not any(pid_alive(p) for p in [*mongods, *roles, *workers] if p)
    stray = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert stray.stdout.strip() == ""  # no mongod, API, dispatcher or worker left


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, verify=TLS).status_code == 200
    except httpx.HTTPError:
        return False
