"""Progress end to end: reported by real tasks in worker processes, written by the
dispatcher (fenced), read through the API and the CLI."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore
from tests.conftest import ROOT, brook_env
from tests.e2e.conftest import Cluster, wait_terminal
from tests.support.procs import wait_until

TASKS = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.progress"}


def submit(http: httpx.Client, task: str, **payload: Any) -> str:
    resp = http.post("/jobs", json={"task": task, "payload": payload})
    assert resp.status_code == 202, resp.text
    job_id: str = resp.json()["id"]
    return job_id


def brook(settings: Settings, port: int, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brook.cli", *args],
        env=brook_env(settings, BROOK_API_PORT=str(port), **TASKS),
        cwd=ROOT,
        text=True,
        timeout=60,
        **kw,
    )


@pytest.mark.parametrize("task", ["steps", "steps_async"])
def test_progress_written_by_a_task_is_readable_while_it_runs(
    cluster: Cluster, http: httpx.Client, settings: Settings, task: str
) -> None:
    cluster.api(**TASKS)
    cluster.dispatcher(**TASKS)
    job_id = submit(http, task, steps=10, seconds=4)
    seen: list[dict[str, Any]] = []
    while (job := http.get(f"/jobs/{job_id}").json())["status"] in ("pending", "running"):
        progress = job["progress"] if job["status"] == "running" else None
        if progress is not None and (not seen or seen[-1] != progress):
            seen.append(progress)
        time.sleep(0.1)
    assert job["status"] == "completed", job
    fractions = [p["fraction"] for p in seen]
    assert len(fractions) >= 3 and fractions == sorted(fractions)
    last = seen[-1]
    assert set(last) == {"fraction", "message", "at", "attempt"} and last["attempt"] == 1
    assert last["message"] == f"attempt 1 step {round(last['fraction'] * 10)}/10"
    # The last report lands before the outcome, so a finished job shows where it ended.
    assert job["progress"]["fraction"] == 1.0 and job["progress"]["message"].endswith("10/10")
    shown = cluster.cli("status", job_id)
    assert shown.returncode == 0 and '"fraction": 1.0' in shown.stdout


async def test_a_task_reporting_nonstop_costs_a_few_writes_a_second(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(**TASKS)
    cluster.dispatcher(**TASKS)
    async with await store.jobs.watch([{"$match": {"operationType": "update"}}]) as stream:
        job_id = submit(http, "chatty", seconds=3)
        writes = 0
        while True:
            change = await stream.try_next()
            if change is None:
                continue
            if change["documentKey"]["_id"] != job_id:
                continue
            fields = change["updateDescription"]["updatedFields"]
            writes += any(k == "progress" or k.startswith("progress.") for k in fields)
            if fields.get("status") == "completed":
                break
    job = await store.get(job_id)
    assert job.result > writes  # the task called ctx.progress that many times (cost: bench/)
    # ~4 a second for 3 s, plus the claim (which clears it) and the last report.
    assert 3 <= writes <= 3 * 4 + 3, writes


def test_submit_wait_shows_progress_as_lines_off_a_terminal_and_a_bar_on_one(
    cluster: Cluster, settings: Settings
) -> None:
    cluster.api(**TASKS)
    cluster.dispatcher(**TASKS)
    payload = '{"steps": 8, "seconds": 2.5}'
    plain = cluster.cli("submit", "steps", "--payload", payload, "--wait", **TASKS)
    assert plain.returncode == 0 and plain.stdout.strip() == "8"  # stdout: the result alone
    lines = plain.stderr.splitlines()
    assert any(" running " in line and "% attempt 1 step" in line for line in lines), lines
    assert lines[-1].endswith("completed 100% attempt 1 step 8/8")

    primary, secondary = pty.openpty()  # stderr on a terminal: the rich bar
    try:
        bar = brook(
            settings, cluster.port, "submit", "steps", "--payload", payload, "--wait",
            stdout=subprocess.PIPE, stderr=secondary,
        )  # fmt: skip
        os.close(secondary)
        screen = _read_all(primary)
    finally:
        os.close(primary)
    assert bar.returncode == 0 and bar.stdout.strip() == "8"
    assert "steps completed" in screen and "100%" in screen and "━" in screen


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other end is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


async def test_a_zombie_attempts_progress_is_discarded(
    cluster: Cluster, http: httpx.Client, store: JobStore
) -> None:
    cluster.api(**TASKS)
    a = cluster.dispatcher(**TASKS)
    job_id = submit(http, "steps", steps=60, seconds=15, later_seconds=3)
    wait_until(lambda: (http.get(f"/jobs/{job_id}").json()["progress"] or {}).get("fraction"))
    a.signal(signal.SIGSTOP)  # its worker keeps running attempt 1 and reporting
    try:
        b = cluster.dispatcher(**TASKS)
        b.wait_for_event("job.claimed", timeout=30, where=lambda e: e["job_id"] == job_id)
    finally:
        a.signal(signal.SIGCONT)  # A wakes holding attempt 1's reports
    # A stops the worker of the lease it lost (it was frozen past it: fenced by its own
    # clock or told by its heartbeat, whichever comes first); the reports it held are
    # discarded by their fenced write, or go with the worker.
    a.wait_for_event("worker.killed", timeout=10, where=lambda e: e.get("job_id") == job_id)
    lost = [
        e
        for name in ("lease.lost", "lease.self_fenced")
        for e in a.events(name)
        if e["job_id"] == job_id
    ]
    assert [e["attempt"] for e in lost] == [1]
    for discarded in a.events("progress.discarded"):
        assert (discarded["job_id"], discarded["attempt"]) == (job_id, 1)
    # From attempt 2's claim on, no report of attempt 1 ever shows.
    observed: list[dict[str, Any]] = []
    while (job := await store.get(job_id)).status == "running":
        if job.progress is not None:
            observed.append(job.progress)
        await asyncio.sleep(0.05)
    assert observed and {p["attempt"] for p in observed} == {2}
    done = wait_terminal(http, job_id)
    assert done["status"] == "completed" and done["attempts"] == 2
    assert done["progress"]["attempt"] == 2 and done["progress"]["fraction"] == 1.0
