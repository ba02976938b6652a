"""Durable steps in the store, on the real replica set: a checkpoint is fenced like a
completion (a zombie past its lease records none), recorded once per name; a suspension
ends the attempt without using it up; a signal wakes only the jobs waiting on its key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from brook.common.domain.errors import LeaseLost
from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.signals import SignalStore
from tests.integration.test_store import expire_now

A, B = "dispatcher-a", "dispatcher-b"


async def claimed(store: JobStore, owner: str) -> Lease:
    job = (await store.claim(owner, 30)).job
    assert job is not None
    return Lease(job_id=job.id, attempt=job.attempts)


async def test_a_zombie_past_its_lease_cannot_record_a_checkpoint(store: JobStore) -> None:
    await store.submit(JobSpec(task="noop", payload={}))
    zombie = await claimed(store, A)
    assert await store.record_step(zombie, A, "one", 1, 16, 1.0) == "recorded"
    await expire_now(store, zombie.job_id)
    [expired] = await store.expired()
    await store.requeue_expired(expired, 0.0)
    live = await claimed(store, B)
    assert live.attempt == zombie.attempt + 1
    # The old attempt, past its lease, writes nothing: not a new step, not the same one.
    assert await store.record_step(zombie, A, "two", 2, 16, 1.0) == "lost"
    assert await store.record_step(live, B, "two", 22, 16, 1.0) == "recorded"
    assert await store.record_step(zombie, B, "three", 3, 16, 1.0) == "lost"  # wrong attempt
    job = await store.get(live.job_id)
    assert [(s["name"], s["result"], s["attempt"]) for s in job.steps] == [
        ("one", 1, zombie.attempt),
        ("two", 22, live.attempt),
    ]
    assert job.step_results() == {"one": 1, "two": 22}
    assert job.steps_bytes == 32


async def test_a_step_is_recorded_once_and_a_retried_write_of_it_is_not_lost(
    store: JobStore,
) -> None:
    await store.submit(JobSpec(task="noop", payload={}))
    lease = await claimed(store, A)
    assert await store.record_step(lease, A, "once", {"v": 1}, 20, 1.0) == "recorded"
    # The same write again (a reply lost to a failover, retried): it applied, so recorded.
    assert await store.record_step(lease, A, "once", {"v": 1}, 20, 1.0) == "recorded"
    assert len((await store.get(lease.job_id)).steps) == 1


async def test_a_suspension_ends_the_attempt_without_using_it_and_a_cancel_asked_wins(
    store: JobStore,
) -> None:
    [one, two] = [
        (await store.submit(JobSpec(task="noop", payload={}, max_attempts=2))).job.id
        for _ in range(2)
    ]
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    first = await claimed(store, A)
    done = await store.suspend(first, A, until, {"kind": "sleep", "step": "sleep#1"})
    assert done.status == "pending" and done.max_attempts == 3 and done.attempts == 1
    assert done.run_at == until and done.waiting_for is not None
    assert done.waiting_for["kind"] == "sleep" and done.owner is None
    with pytest.raises(LeaseLost):
        await store.suspend(first, A, until, {"kind": "sleep"})
    second = await claimed(store, A)
    assert {first.job_id, second.job_id} == {one, two}
    await store.cancel(second.job_id)  # running: a request
    cancelled = await store.suspend(second, A, until, {"kind": "sleep", "step": "sleep#1"})
    assert cancelled.status == "cancelled" and cancelled.error is not None


async def test_a_signal_wakes_only_the_jobs_waiting_on_its_key(store: JobStore) -> None:
    ids = [(await store.submit(JobSpec(task="noop", payload={}))).job.id for _ in range(3)]
    for key in ("k1", "k1", "k2"):
        lease = await claimed(store, A)
        await store.suspend(lease, A, None, {"kind": "signal", "key": key})
    signals = SignalStore(store.db)
    assert await signals.get("k1") == (False, None)
    await signals.put("k1", {"ok": True}, 60)
    assert await signals.get("k1") == (True, {"ok": True})
    assert await store.wake_signal_waiters("k1") == 2
    jobs = [await store.get(i) for i in ids]
    woken = [j for j in jobs if j.waiting_for and j.waiting_for.get("woken_at")]
    assert len(woken) == 2 and all(j.run_at.year < 9999 for j in woken)
    [still] = [j for j in jobs if j not in woken]
    assert still.waiting_for is not None and still.waiting_for["key"] == "k2"
    assert still.run_at.year == 9999  # no timeout: never due by the clock
    # The next claim takes a woken job and clears what it waited for.
    again = (await store.claim(A, 30)).job
    assert again is not None and again.id in {j.id for j in woken}
    assert (await store.get(again.id)).waiting_for is None
