"""A job's output stream on real processes: emitted by async, plain `def` and shared tasks,
kept per attempt across a SIGKILLed worker, once across a replayed step, in order and
within its cap."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from brook import Job
from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from brook.common.store.output import OutputStore
from tests.e2e.conftest import Cluster
from tests.support.procs import BrookProcess

OUTPUT = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.output"}


async def submit(store: JobStore, task: str, payload: dict[str, Any], **kw: Any) -> str:
    return (await store.submit(JobSpec(task=task, payload=payload, **kw))).job.id


async def finished(store: JobStore, job_id: str, timeout: float = 60) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = await store.get(job_id)
        if job.status in ("completed", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job still {job.status}: {job}"
        await asyncio.sleep(0.1)


async def chunks(store: JobStore, job_id: str) -> list[tuple[int, int, Any]]:
    """(attempt, seq, data) of the job's output, in order."""
    docs = await OutputStore(store.db).read(job_id, limit=100_000)
    return [(d["attempt"], d["seq"], d["data"]) for d in docs]


def holding(proc: BrookProcess, job_id: str) -> int:
    event = proc.wait_for_event(
        "output.holding", timeout=30, where=lambda e: e.get("job_id") == job_id
    )
    return int(event["pid"])


async def test_async_plain_def_and_shared_tasks_emit_their_output_in_order_in_few_writes(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**OUTPUT)
    tasks = ["emit_tokens", "emit_tokens_sync", "emit_tokens_shared"]
    ids = [await submit(store, t, {"n": 100, "pause": 0.01}) for t in tasks]
    for job_id in ids:
        job = await finished(store, job_id)
        assert job.status == "completed" and job.result == 100, job
        got = await chunks(store, job_id)
        want = [(1, i + 1, f"t{i} ") for i in range(100)] + [(1, 101, {"done": 100, "attempt": 1})]
        assert got == want
        assert job.output is not None and job.output["chunks"] == 101
        [ended] = [e for e in disp.events("output.ended") if e.get("job_id") == job_id]
        assert ended["chunks"] == 101 and ended["written"] is True


async def test_a_worker_sigkilled_mid_stream_keeps_attempt_ones_output_apart_from_attempt_twos(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**OUTPUT)
    job_id = await submit(store, "emit_until_killed", {"n": 5, "later": 3})
    os.kill(holding(disp, job_id), signal.SIGKILL)
    job = await finished(store, job_id)
    assert job.status == "completed" and job.attempts == 2, job
    assert await chunks(store, job_id) == [
        *[(1, i + 1, f"a1-{i} ") for i in range(5)],
        *[(2, i + 6, f"a2-{i} ") for i in range(3)],
    ]


async def test_a_finished_steps_output_appears_once_when_the_step_is_replayed(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher(**OUTPUT)
    job_id = await submit(store, "emit_in_step", {})
    os.kill(holding(disp, job_id), signal.SIGKILL)
    job = await finished(store, job_id)
    assert job.status == "completed" and job.attempts == 2, job
    assert [(s["name"], s["attempt"]) for s in job.steps] == [("answer", 1)]
    docs = await OutputStore(store.db).read(job_id)
    assert [(d["attempt"], d["data"], d.get("step")) for d in docs] == [
        (1, "the ", "answer"),
        (1, "answer ", "answer"),
        (1, "is ", "answer"),
        (1, "42 ", "answer"),
        (2, {"attempt": 2, "after": "the step"}, None),
    ]


async def test_ten_thousand_chunks_arrive_in_order_and_the_cap_stops_the_next(
    cluster: Cluster, store: JobStore
) -> None:
    cluster.dispatcher(**OUTPUT, BROOK_OUTPUT_MAX_CHUNKS="10000")
    job_id = await submit(store, "emit_many", {"n": 10_001})
    job = await finished(store, job_id)
    assert job.status == "completed", job
    assert job.result["emitted"] == 10_000
    assert "limit is 10000 (BROOK_OUTPUT_MAX_CHUNKS)" in job.result["error"]
    got = await chunks(store, job_id)
    assert got == [(1, i + 1, i) for i in range(10_000)]
