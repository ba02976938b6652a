"""Schedule overlap's store and decision on the real replica set: racing dispatchers
decide a tick once, a stale tick is told so, and a tick's decision follows the status of
the schedule's newest run (unfinished: a pending retry included)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from brook.common.domain.models import JobSpec
from brook.common.domain.schedules import Schedule
from brook.common.store.jobs import JobStore, Lease, Tagged
from brook.common.store.schedules import ScheduleStore
from brook.dispatcher.following.overlap import Overlaps

T0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
SECOND = timedelta(seconds=1)
SKIP = Schedule.declare("s-skip", "* * * * * *", task="noop", overlap="skip")


async def test_racing_dispatchers_decide_a_tick_once_and_an_older_tick_is_stale(
    store: JobStore,
) -> None:
    schedules = ScheduleStore(store.db)
    await schedules.declare([SKIP], "d1")
    kinds = ["skip", "run", "run", "skip", "run"]
    got = await asyncio.gather(*(schedules.decide("s-skip", T0, k, None) for k in kinds))  # type: ignore[arg-type]
    assert sum(d is not None and d.won for d in got) == 1
    assert len({d.kind for d in got if d is not None}) == 1  # everyone took the winner's
    assert await schedules.decide("s-skip", T0 - SECOND, "run", None) is None  # stale
    state = (await schedules.states(["s-skip"]))["s-skip"]
    won = next(d for d in got if d is not None and d.won)
    assert state.skipped == (1 if won.kind == "skip" else 0)
    assert (state.run_tick is None) == (won.kind == "skip")


async def test_a_tick_is_skipped_while_the_newest_run_is_unfinished_and_runs_after_it(
    store: JobStore,
) -> None:
    await store.ensure_indexes()
    schedules = ScheduleStore(store.db)
    await schedules.declare([SKIP], "d1")
    overlaps = Overlaps(store, schedules)
    first = await overlaps.decide(SKIP, T0, (await schedules.states(["s-skip"]))["s-skip"])
    assert first is not None and first.kind == "run"
    # The tick's job, failed once and due again later: a pending retry is unfinished.
    spec = JobSpec(task="noop", payload={}, idempotency_key=SKIP.key(T0))
    job = (await store.submit(spec)).job
    before = datetime.now(UTC) + timedelta(minutes=1)
    await store.claim("d1", 30, Tagged(ids=[job.id], tag="t", before=before))
    lease = Lease(job_id=job.id, attempt=1)
    await store.fail_attempt(lease, "d1", {"type": "E", "message": "x"}, 600)
    assert (await store.get(job.id)).status.value == "pending"
    state = (await schedules.states(["s-skip"]))["s-skip"]
    assert await overlaps.decide(SKIP, T0 + SECOND, state) is None  # skipped
    await store.cancel(job.id)  # ended: the next tick runs
    state = (await schedules.states(["s-skip"]))["s-skip"]
    second = await overlaps.decide(SKIP, T0 + 2 * SECOND, state)
    assert second is not None and second.kind == "run" and second.won
    assert (await schedules.states(["s-skip"]))["s-skip"].skipped == 1
