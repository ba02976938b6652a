"""Rerun from a step in the store, on the real replica set: the new job carries the steps
recorded before that step, with their output, under attempt 0; the two are linked both
ways; a job that has not finished, one without steps, or an unknown step is refused and
nothing is made."""

from __future__ import annotations

import pytest

from brook.common.domain.errors import InvalidInput, JobConflict, JobNotFound
from brook.common.domain.models import JobSpec
from brook.common.domain.output import Chunk
from brook.common.domain.reruns import Rerun
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.output import AttemptOutput, OutputStore

A = "dispatcher-a"
ERROR = {"type": "RuntimeError", "message": "step 'four': failed", "step": "four"}


async def claimed(store: JobStore) -> Lease:
    job = (await store.claim(A, 30)).job
    assert job is not None
    return Lease(job_id=job.id, attempt=job.attempts)


def said(seq: int, step: str) -> Chunk:
    return Chunk(seq=seq, kind="text", data=f"{step}:{seq}", size=8, step=step)


async def failed_at_step_four(store: JobStore, spec: JobSpec | None = None) -> str:
    """A job that recorded steps one to three (each emitting a chunk, with one between
    steps two and three), then failed for good."""
    output = OutputStore(store.db)
    source = (await store.submit(spec or JobSpec(task="noop", payload={"n": 1}))).job.id
    lease = await claimed(store)
    for seq, name in enumerate(("one", "two", "three"), 1):
        await output.append([AttemptOutput(lease=lease, owner=A, chunks=[said(seq, name)])])
        assert await store.record_step(lease, A, name, {"from": name}, 20, 1.0) == "recorded"
    loose = Chunk(seq=4, kind="text", data="between", size=7)
    await output.append([AttemptOutput(lease=lease, owner=A, chunks=[loose])])
    await store.fail_attempt(lease, A, ERROR, 0.0, final=True)
    return source


async def test_a_rerun_carries_the_steps_before_its_step_with_their_output(
    store: JobStore,
) -> None:
    spec = JobSpec(task="noop", payload={"n": 1}, idempotency_key="k-1", key="acme", priority=5)
    source = await failed_at_step_four(store, spec)
    rerun = await store.rerun(source, Rerun(from_step="three"))
    assert rerun.id != source and rerun.status == "pending" and rerun.attempts == 0
    assert (rerun.task, rerun.payload, rerun.key, rerun.priority) == ("noop", {"n": 1}, "acme", 5)
    assert rerun.idempotency_key is None and rerun.rerun_of == source
    assert [(s["name"], s["result"], s["attempt"], s["carried_from"]) for s in rerun.steps] == [
        ("one", {"from": "one"}, 0, source),
        ("two", {"from": "two"}, 0, source),
    ]
    stored = await store.get(rerun.id)
    assert stored.steps == rerun.steps and stored.steps_bytes == 40
    assert stored.history[0]["from_step"] == "three"
    # Only the chunks the carried steps emitted, in order, as the new job's first ones.
    carried = await OutputStore(store.db).read(rerun.id)
    assert [(d["attempt"], d["seq"], d["data"]) for d in carried] == [
        (0, 1, "one:1"),
        (0, 2, "two:2"),
    ]
    assert stored.output == {"chunks": 2, "bytes": 16}
    assert (await store.get(source)).reruns == [rerun.id]
    # From the first step: nothing carried; a new payload replaces the old.
    again = await store.rerun(source, Rerun(from_step="one", payload={"n": 2}))
    assert again.steps == [] and again.payload == {"n": 2} and again.output is None
    assert (await store.get(source)).reruns == [rerun.id, again.id]
    # From the step it failed in (never recorded): every recorded step is carried.
    failed_one = await store.rerun(source, Rerun(from_step="four"))
    assert [s["name"] for s in failed_one.steps] == ["one", "two", "three"]


async def test_a_rerun_of_a_rerun_carries_the_steps_it_carried(store: JobStore) -> None:
    source = await failed_at_step_four(store)
    first = await store.rerun(source, Rerun(from_step="three"))
    await store.cancel(first.id)  # pending: cancelled at once
    second = await store.rerun(first.id, Rerun(from_step="two"))
    assert [(s["name"], s["carried_from"]) for s in second.steps] == [("one", first.id)]
    carried = await OutputStore(store.db).read(second.id)
    assert [(d["seq"], d["data"]) for d in carried] == [(1, "one:1")]


async def test_a_rerun_is_refused_for_a_job_not_finished_without_steps_or_an_unknown_step(
    store: JobStore,
) -> None:
    with pytest.raises(JobNotFound):
        await store.rerun("nope", Rerun(from_step="one"))
    source = await failed_at_step_four(store)
    with pytest.raises(
        InvalidInput,
        match=r"no recorded step 'five'; its steps: 'one', 'two', 'three', and 'four', the step it",
    ):
        await store.rerun(source, Rerun(from_step="five"))
    plain = (await store.submit(JobSpec(task="noop", payload={}))).job.id
    with pytest.raises(JobConflict, match="is pending: only a finished job"):
        await store.rerun(plain, Rerun(from_step="one"))
    await store.cancel(plain)
    with pytest.raises(InvalidInput, match="recorded no steps"):
        await store.rerun(plain, Rerun(from_step="one"))
    assert await store.jobs.count_documents({}) == 2  # nothing made
    assert (await store.get(source)).reruns == []
