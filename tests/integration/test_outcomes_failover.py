"""An outcome write that rode out a failover until its deadline, against the real replica
set: an earlier try of it may have applied (its reply lost), so the dispatcher reads the job
back once a primary answers, and the job's log tells what became of it. No primary is made
by the server's `failCommand` fail point, aimed at the dispatcher's client by its app name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from structlog.testing import capture_logs

from brook.common.domain.models import JobSpec
from brook.common.domain.status import JobStatus
from brook.common.protocol.runner import Outcome
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import spawn_logged
from brook.common.store.db import database, make_client
from brook.common.store.jobs import ExpiredLease, JobStore, Lease
from brook.dispatcher.attempts.dependents import Dependents
from brook.dispatcher.attempts.outcomes import Outcomes
from tests.support.failpoints import fail_commands, fail_nothing

OWNER = "failover-owner"
APP = "outcomes-failover"
LEASE_S = 1.0  # the outcome write's deadline is two leases away
NOT_PRIMARY = 10107


@pytest.fixture
async def dispatcher(settings: Settings) -> AsyncIterator[tuple[Settings, JobStore]]:
    """The dispatcher's own client and store, with a short lease."""
    settings = settings.model_copy(update={"lease_seconds": LEASE_S})
    client = make_client(settings, appname=APP)
    yield settings, JobStore(database(client, settings))
    await fail_nothing(client)
    await client.close()


async def claimed(store: JobStore) -> Lease:
    await store.submit(JobSpec(task="echo", payload={}))
    job = (await store.claim(OWNER, LEASE_S)).job
    assert job is not None
    return Lease(job_id=job.id, attempt=job.attempts)


async def record_through_an_outage(
    dispatcher: tuple[Settings, JobStore],
    store: JobStore,
    lease: Lease,
    outage_s: float,
    then: Callable[[], Awaitable[object]] | None = None,
) -> tuple[str, list[str]]:
    """Record a successful attempt while every write and read of the dispatcher's client
    fails as if no primary were there, for `outage_s` (past the write's deadline); `then`
    happens once it answers again, while the dispatcher still waits to learn the outcome."""
    settings, mine = dispatcher
    outcomes = Outcomes(
        settings, mine, OWNER, spawn_logged, Dependents(settings, store, spawn_logged)
    )
    job = await store.get(lease.job_id)
    await fail_commands(mine.db.client, APP, ["update", "find"], "alwaysOn", errorCode=NOT_PRIMARY)
    with capture_logs() as logs:
        recording = asyncio.create_task(
            outcomes.record(job, lease, Outcome(kind="ok", result={"ok": 1}), 0.1)
        )
        await asyncio.sleep(outage_s)
        assert not recording.done(), "the outcome was settled while no primary answered"
        await fail_nothing(mine.db.client)
        if then is not None:
            await asyncio.sleep(1.0)
            assert not recording.done(), "the outcome was settled while the job showed it running"
            await then()
        verdict = await asyncio.wait_for(recording, 30)
    return verdict.kind, [e["event"] for e in logs]


async def test_a_completion_whose_earlier_try_applied_is_logged_completed_after_the_deadline(
    dispatcher: tuple[Settings, JobStore], store: JobStore
) -> None:
    """The completion's first try committed and its reply was lost to the failover (done
    here by writing it before the outage); every later try and read fails until past the
    deadline. Once a primary answers, the job says this attempt completed it."""
    lease = await claimed(store)
    written = await store.complete_many(OWNER, [(lease, {"ok": 1})])
    assert written.done == {lease.job_id}
    kind, events = await record_through_an_outage(dispatcher, store, lease, 3 * LEASE_S)
    assert kind == "applied", events
    assert events.count("job.completed") == 1 and "job.result_discarded" not in events, events
    assert "mongo.unavailable" in events  # it did ride the outage out


async def test_a_completion_that_shows_only_later_is_logged_completed(
    dispatcher: tuple[Settings, JobStore], store: JobStore
) -> None:
    """Past the outage the job still shows the attempt running (a new primary's majority
    view may not show the write yet): the dispatcher reads again until it does."""
    lease = await claimed(store)

    async def shows() -> None:
        assert (await store.complete_many(OWNER, [(lease, {"ok": 1})])).done == {lease.job_id}

    kind, events = await record_through_an_outage(dispatcher, store, lease, 3 * LEASE_S, shows)
    assert kind == "applied", events
    assert events.count("job.completed") == 1 and "job.result_discarded" not in events, events


async def test_a_completion_that_never_applied_is_discarded_once_the_watchdog_requeued_it(
    dispatcher: tuple[Settings, JobStore], store: JobStore
) -> None:
    lease = await claimed(store)

    async def watchdog() -> None:
        expired = ExpiredLease(job_id=lease.job_id, attempt=lease.attempt, task="echo", owner=OWNER)
        await store.requeue_expired(expired, 0.0)

    kind, events = await record_through_an_outage(dispatcher, store, lease, 3 * LEASE_S, watchdog)
    assert kind == "no_primary", events
    assert "job.completed" not in events and events.count("job.result_discarded") == 1, events
    job = await store.get(lease.job_id)
    assert job.status == JobStatus.PENDING and job.attempts == lease.attempt
