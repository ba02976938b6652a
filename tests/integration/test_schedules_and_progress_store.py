"""The stores behind schedules and progress, against the real replica set: one job per
tick under racing submitters, the shared schedule state, and fenced progress writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from brook.common.domain.errors import ScheduleNotFound
from brook.common.domain.models import JobSpec
from brook.common.domain.schedules import Schedule
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.schedules import ScheduleStore

OWNER = "test-owner"
EVERY_SECOND = Schedule.declare("s1", "* * * * * *", task="echo", payload={"x": 1})


@pytest.fixture
async def schedules(store: JobStore) -> AsyncIterator[ScheduleStore]:
    yield ScheduleStore(store.db)


def tick_spec(s: Schedule, tick: datetime) -> JobSpec:
    return JobSpec(
        task=s.task,
        payload=s.payload,
        run_at=tick,
        idempotency_key=s.key(tick),
        schedule={"name": s.name, "tick": tick},
    )


async def test_ten_racing_submitters_of_one_tick_make_one_job(store: JobStore) -> None:
    tick = datetime(2030, 1, 1, 12, 0, 5, tzinfo=UTC)
    results = await asyncio.gather(
        *[store.submit(tick_spec(EVERY_SECOND, tick)) for _ in range(10)]
    )
    assert sum(r.created for r in results) == 1
    assert len({r.job.id for r in results}) == 1
    job = results[0].job
    assert job.schedule == {"name": "s1", "tick": tick} and job.run_at == tick
    assert job.idempotency_key == "schedule:s1:2030-01-01T12:00:05+00:00"
    assert job.to_api()["schedule"] == {"name": "s1", "tick": tick}


async def test_a_declared_schedule_starts_active_and_keeps_its_state_when_redeclared(
    schedules: ScheduleStore,
) -> None:
    await schedules.declare([EVERY_SECOND], "d1")
    tick = datetime(2030, 1, 1, tzinfo=UTC)
    await schedules.ticked("s1", tick, "job-1")
    await schedules.set_paused("s1", True)
    changed = Schedule.declare("s1", "*/5 * * * *", task="noop", tz="Europe/Paris")
    await schedules.declare([changed], "d2")
    [state] = await schedules.list_all()
    assert (state.cron, state.task, state.tz) == ("*/5 * * * *", "noop", "Europe/Paris")
    assert state.paused and state.last_tick == tick and state.last_job_id == "job-1"
    assert state.declared_at is not None


async def test_last_tick_only_moves_forward(schedules: ScheduleStore) -> None:
    await schedules.declare([EVERY_SECOND], "d1")
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    await schedules.ticked("s1", t0 + timedelta(seconds=2), "later")
    await schedules.ticked("s1", t0 + timedelta(seconds=1), "earlier")  # a slow submitter
    state = (await schedules.states(["s1"]))["s1"]
    assert state.last_tick == t0 + timedelta(seconds=2) and state.last_job_id == "later"


async def test_resuming_a_paused_schedule_stamps_resumed_at_once(schedules: ScheduleStore) -> None:
    await schedules.declare([EVERY_SECOND], "d1")
    assert (await schedules.set_paused("s1", False)).resumed_at is None  # was not paused
    paused = await schedules.set_paused("s1", True)
    assert paused.paused and paused.resumed_at is None
    resumed = await schedules.set_paused("s1", False)
    assert not resumed.paused and resumed.resumed_at is not None
    again = await schedules.set_paused("s1", False)
    assert again.resumed_at == resumed.resumed_at
    with pytest.raises(ScheduleNotFound):
        await schedules.set_paused("nope", True)


async def test_progress_is_written_only_by_the_attempt_and_owner_holding_the_job(
    store: JobStore,
) -> None:
    sub = await store.submit(JobSpec(task="noop", payload={}))
    assert sub.job.progress is None
    first = (await store.claim(OWNER, 30)).job
    assert first is not None and first.attempts == 1
    lease1 = Lease(job_id=first.id, attempt=1)
    assert await store.set_progress_many(OWNER, [(lease1, 0.25, "a quarter")]) == {first.id}
    progress = (await store.get(first.id)).progress
    assert progress is not None
    assert (progress["fraction"], progress["message"], progress["attempt"]) == (
        0.25,
        "a quarter",
        1,
    )
    assert isinstance(progress["at"], datetime)
    assert await store.set_progress_many("someone-else", [(lease1, 0.5, None)]) == set()

    await store.release(lease1, OWNER)
    second = (await store.claim("other-owner", 30)).job
    assert second is not None and second.attempts == 1  # a release does not count
    # A new claim starts with no progress; the old owner's report is fenced out.
    assert second.progress is None
    assert await store.set_progress_many(OWNER, [(lease1, 0.9, "zombie")]) == set()
    lease2 = Lease(job_id=second.id, attempt=second.attempts)
    other = await store.submit(JobSpec(task="noop", payload={}))
    stale = Lease(job_id=other.job.id, attempt=1)  # pending: nobody may write its progress
    written = await store.set_progress_many(
        "other-owner", [(lease2, 0.5, "$notAField"), (stale, 1.0, None)]
    )
    assert written == {second.id}
    progress = (await store.get(second.id)).progress
    assert progress is not None and progress["message"] == "$notAField"  # stored literally
    assert (await store.get(other.job.id)).progress is None
