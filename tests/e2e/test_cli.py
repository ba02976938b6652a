"""The client commands of `brook` against a real API."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.e2e.conftest import Cluster


def test_brook_ls_pages_with_limit_and_after(cluster: Cluster, http: httpx.Client) -> None:
    cluster.api()  # no dispatcher: the jobs stay pending
    ids = [http.post("/jobs", json={"task": "noop"}).json()["id"] for _ in range(5)]
    seen: list[list[str]] = []
    after: list[str] = []
    while True:
        out = cluster.cli("ls", "--limit", "2", *after)
        assert out.returncode == 0, out.stderr
        seen.append([line.split()[0] for line in out.stdout.splitlines()])
        hint = out.stderr.strip()
        if not hint:
            break
        assert hint.startswith("# more: --after ")
        after = hint.removeprefix("# more: ").split()
    assert seen == [ids[4:2:-1], ids[2:0:-1], ids[:1]]  # newest first, 2 + 2 + 1


def test_brook_ls_filters_by_status(cluster: Cluster, http: httpx.Client) -> None:
    cluster.api()
    job = http.post("/jobs", json={"task": "noop"}).json()["id"]
    assert http.post(f"/jobs/{job}/cancel").status_code == 200
    cancelled = cluster.cli("ls", "--status", "cancelled")
    assert cancelled.returncode == 0 and cancelled.stdout.split()[:2] == [job, "cancelled"]
    assert cluster.cli("ls", "--status", "pending").stdout == ""


def test_brook_piped_into_a_reader_that_stops_ends_quietly(cluster: Cluster, http: httpx.Client) -> None:
    cluster.api()
    for _ in range(3):
        http.post("/jobs", json={"task": "noop"})
    env = cluster.env()
    # `true` reads nothing and exits at once: every line `brook ls` writes meets a closed pipe.
    out = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m brook.cli ls | true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 141 and out.stderr == "", out.stderr
