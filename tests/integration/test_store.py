"""JobStore against the real replica set: leases, fencing, transitions, indexes."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from brook.common.client.dependents import settle
from brook.common.domain.errors import JobConflict, JobNotFound, LeaseLost
from brook.common.domain.models import Job, JobSpec
from brook.common.domain.status import TRANSITIONS, JobStatus
from brook.common.store.jobs import BestDue, JobStore, Lease, RunTimes
from brook.common.store.queries import CLAIM_FILTER, CLAIM_SORT

OWNER = "test-owner"
T = TypeVar("T")


def spec(task: str = "noop", **kw: Any) -> JobSpec:
    return JobSpec(task=task, payload=kw.pop("payload", {}), **kw)


async def expire_now(store: JobStore, job_id: str) -> None:
    """Put a lease in the past (a test-only write; the engine never does this)."""
    await store.jobs.update_one(
        {"_id": job_id}, {"$set": {"lease_expires_at": datetime(2000, 1, 1, tzinfo=UTC)}}
    )


async def profiled(store: JobStore, op: Awaitable[T]) -> tuple[T, dict[str, Any]]:
    """Run `op` with the profiler on; return its result and the one `findAndModify` it sent
    to the jobs collection, as the server received it."""
    await store.db.command("profile", 2)
    try:
        result = await op
    finally:
        await store.db.command("profile", 0)
    entries = (
        await store.db["system.profile"]
        .find({"ns": f"{store.db.name}.jobs", "command.findAndModify": "jobs"})
        .to_list()
    )
    assert len(entries) == 1, entries
    command: dict[str, Any] = entries[0]["command"]
    return result, command


def client_times(value: Any) -> list[datetime]:
    """Every date inside a command: a time the client stamped."""
    if isinstance(value, datetime):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in client_times(v)]
    if isinstance(value, list):
        return [t for v in value for t in client_times(v)]
    return []


async def test_submit_stores_a_pending_job_stamped_by_the_server(store: JobStore) -> None:
    sub, command = await profiled(
        store, store.submit(spec("echo", payload={"a": "$notAField", "b": [1, {"c": 2}]}))
    )
    job = await store.get(sub.job.id)
    assert sub.created and job.status == JobStatus.PENDING and job.attempts == 0
    assert job.payload == {"a": "$notAField", "b": [1, {"c": 2}]}  # stored literally
    assert job.run_at == job.created_at
    # The server's clock, not ours: the write carries `$$NOW` and no time of the client's.
    [stage] = command["update"]
    assert stage["$set"]["created_at"] == "$$NOW" and stage["$set"]["run_at"] == "$$NOW"
    assert stage["$set"]["history"][0]["at"] == "$$NOW"
    assert client_times(command) == []


async def test_claim_takes_the_highest_priority_then_the_earliest_due(store: JobStore) -> None:
    low = await store.submit(spec(priority=0))
    high = await store.submit(spec(priority=5))
    later = await store.submit(spec(priority=9, run_at=datetime.now(UTC) + timedelta(hours=1)))
    low2 = await store.submit(spec(priority=0))
    order = [(await store.claim(OWNER, 30)).job for _ in range(4)]
    assert [j.id if j else None for j in order] == [high.job.id, low.job.id, low2.job.id, None]
    assert (await store.get(later.job.id)).status == JobStatus.PENDING
    assert await store.next_due() == (await store.get(later.job.id)).run_at


async def test_claim_sets_lease_from_the_server_clock_and_bumps_the_attempt(
    store: JobStore,
) -> None:
    await store.submit(spec())
    claimed, command = await profiled(store, store.claim(OWNER, 30))
    job = claimed.job
    assert job is not None and job.status == JobStatus.RUNNING and job.attempts == 1
    assert job.owner == OWNER and job.lease_expires_at is not None
    claimed_at = job.history[-1]["at"]
    assert abs((job.lease_expires_at - claimed_at).total_seconds() - 30) < 0.01
    # A claim is a lease, not a start: the job may wait in its dispatcher's prefetch buffer.
    assert job.started_at is None

    # Due and leased by the server's clock: `$$NOW` in the filter and in the lease, and no
    # time of the client's anywhere in the command.
    assert command["query"]["$expr"] == {"$lte": ["$run_at", "$$NOW"]}
    [stage] = command["update"]
    assert stage["$set"]["started_at"] is None
    assert stage["$set"]["lease_expires_at"] == {"$add": ["$$NOW", 30000]}
    assert client_times(command) == []


async def test_a_batch_claim_returns_the_claimed_jobs_without_a_read_back(
    store: JobStore,
) -> None:
    ids = [(await store.submit(spec(priority=i))).job.id for i in range(3)]
    claimed = await store.claim(OWNER, 30, BestDue(n=5))
    jobs, dry = claimed.jobs, claimed.dry
    assert dry and [j.id for j in jobs] == ids[::-1]
    for job in jobs:
        stored = await store.get(job.id)
        assert (job.status, job.attempts, job.owner) == (stored.status, 1, OWNER)
        assert job.started_at is None and stored.started_at is None


async def test_an_attempt_records_its_tasks_real_start_and_end(store: JobStore) -> None:
    await store.submit(spec())
    await store.submit(spec())
    a = (await store.claim(OWNER, 30)).job
    b = (await store.claim(OWNER, 30)).job
    assert a and b and a.claimed_at and b.claimed_at
    await asyncio.sleep(0.6)
    t0 = max(a.claimed_at, b.claimed_at) + timedelta(milliseconds=100)
    ran = RunTimes(started_at=t0, finished_at=t0 + timedelta(milliseconds=250))
    await store.mark_started(OWNER, [(Lease(job_id=b.id, attempt=1), t0)])
    assert (await store.get(b.id)).started_at == t0  # a long task shows its start while running
    done = await store.complete_many(
        OWNER, [(Lease(job_id=a.id, attempt=1), 1)], ran={a.id: ran}
    )
    assert a.id in done.done
    completed = await store.get(a.id)
    assert (completed.started_at, completed.finished_at) == (ran.started_at, ran.finished_at)
    failed = await store.fail_attempt(
        Lease(job_id=b.id, attempt=1), OWNER, {"type": "E"}, 0, final=True, ran=ran
    )
    assert (failed.started_at, failed.finished_at) == (ran.started_at, ran.finished_at)
    # A late start mark for an attempt that already ended matches nothing.
    await store.mark_started(OWNER, [(Lease(job_id=a.id, attempt=1), t0 + timedelta(days=1))])
    assert (await store.get(a.id)).started_at == t0


async def test_run_times_stay_within_the_attempts_lease_on_the_servers_clock(
    store: JobStore,
) -> None:
    """A dispatcher's reading of the server clock errs by a round trip: the times it stamps
    are kept between the claim and the write, so that a queue's jobs never show more runs at
    once than the slots they held."""
    ids = [(await store.submit(spec())).job.id for _ in range(2)]
    a = (await store.claim(OWNER, 30)).job
    b = (await store.claim(OWNER, 30)).job
    assert a and b and a.claimed_at and b.claimed_at and {a.id, b.id} == set(ids)
    early = a.claimed_at - timedelta(seconds=5)
    late = datetime.now(UTC) + timedelta(hours=1)
    await store.mark_started(OWNER, [(Lease(job_id=b.id, attempt=1), early)])
    assert (await store.get(b.id)).started_at == b.claimed_at
    before = datetime.now(UTC)
    done = await store.complete_many(
        OWNER,
        [(Lease(job_id=a.id, attempt=1), None)],
        ran={a.id: RunTimes(started_at=early, finished_at=late)},
    )
    assert a.id in done.done
    job = await store.get(a.id)
    assert job.started_at == a.claimed_at
    assert job.finished_at is not None and job.finished_at < late
    assert job.finished_at >= before - timedelta(seconds=1)  # the write's $$NOW
    # Both in the future: the start is not after the end.
    c = (await store.submit(spec())).job.id
    claimed = (await store.claim(OWNER, 30)).job
    assert claimed is not None and claimed.id == c
    failed = await store.fail_attempt(
        Lease(job_id=c, attempt=1), OWNER, {"type": "E"}, 0, final=True,
        ran=RunTimes(started_at=late, finished_at=late + timedelta(seconds=1)),
    )
    assert failed.started_at is not None and failed.finished_at is not None
    assert claimed.claimed_at is not None
    assert claimed.claimed_at <= failed.started_at <= failed.finished_at < late
    # Both before the claim (a quick task, the dispatcher's reading of the clock a little
    # behind): neither is before the claim, so a job never shows a start before its run_at.
    d = (await store.submit(spec())).job.id
    quick = (await store.claim(OWNER, 30)).job
    assert quick is not None and quick.id == d and quick.claimed_at is not None
    done = await store.complete_many(
        OWNER,
        [(Lease(job_id=d, attempt=1), None)],
        ran={d: RunTimes(started_at=early, finished_at=early + timedelta(milliseconds=2))},
    )
    assert d in done.done
    job = await store.get(d)
    assert job.started_at == job.finished_at == quick.claimed_at


async def test_the_claim_query_is_an_index_scan(store: JobStore) -> None:
    for i in range(50):
        await store.submit(spec(priority=i % 3))
    plan = await store.db.command(
        "explain",
        {
            "findAndModify": "jobs",
            "query": CLAIM_FILTER,
            "sort": dict(CLAIM_SORT),
            "update": [{"$set": {"status": "running"}}],
            "new": True,
        },
        verbosity="queryPlanner",
    )
    text = str(plan["queryPlanner"]["winningPlan"])
    assert "IXSCAN" in text and "COLLSCAN" not in text and "'SORT'" not in text
    assert "claim_order" in text


async def test_an_attempt_ended_by_its_holder_is_told_from_one_the_watchdog_ended(
    store: JobStore,
) -> None:
    await store.submit(spec(max_attempts=3))
    first = (await store.claim(OWNER, 30)).job
    assert first is not None
    lease = Lease(job_id=first.id, attempt=first.attempts)
    assert await store.ended_by_holder(lease) is None  # still running
    await expire_now(store, first.id)
    [doc] = await store.expired()
    await store.requeue_expired(doc, retry_delay_s=0)
    assert await store.ended_by_holder(lease) is None  # the watchdog's, not the holder's
    second = (await store.claim(OWNER, 30)).job
    assert second is not None and second.attempts == 2
    again = Lease(job_id=second.id, attempt=second.attempts)
    await store.fail_attempt(again, OWNER, {"type": "Boom", "message": "x"}, 0)
    ended = await store.ended_by_holder(again)
    assert ended is not None and ended.status == JobStatus.PENDING
    assert await store.ended_by_holder(lease) is None  # attempt 1 is still the watchdog's


async def test_a_zombie_completion_from_a_stale_attempt_is_rejected(store: JobStore) -> None:
    sub = await store.submit(spec(max_attempts=3))
    first = (await store.claim(OWNER, 30)).job
    assert first is not None
    await expire_now(store, first.id)
    [doc] = await store.expired()
    requeued = await store.requeue_expired(doc, retry_delay_s=0)
    assert requeued.status == JobStatus.PENDING and requeued.error is not None
    assert requeued.error["type"] == "LeaseExpired"
    second = (await store.claim("other-owner", 30)).job
    assert second is not None and second.attempts == 2

    async def complete(attempt: int, owner: str, result: str) -> bool:
        lease = Lease(job_id=sub.job.id, attempt=attempt)
        written = await store.complete_many(owner, [(lease, result)])
        assert not written.refused
        return sub.job.id in written.done

    assert not await complete(1, OWNER, "stale")
    assert not await complete(2, OWNER, "stale")  # right attempt, wrong owner
    stale = Lease(job_id=sub.job.id, attempt=1)
    writes: list[Callable[[], Awaitable[Job]]] = [  # every other outcome write is fenced too
        lambda: store.fail_attempt(stale, OWNER, {"type": "E", "message": ""}, 0),
        lambda: store.cancel_running(stale, OWNER),
        lambda: store.release(stale, OWNER),
    ]
    for write in writes:
        with pytest.raises(LeaseLost):
            await write()
    assert (await store.get(sub.job.id)).status == JobStatus.RUNNING
    assert await complete(2, "other-owner", "fresh")
    await complete(2, "other-owner", "again")  # a completed job cannot be completed again
    done = await store.get(sub.job.id)
    assert done.status == JobStatus.COMPLETED and done.result == "fresh"


async def test_failed_attempts_retry_then_fail_when_attempts_run_out(store: JobStore) -> None:
    sub = await store.submit(spec(max_attempts=2))
    err = {"type": "Boom", "message": "x"}
    first = (await store.claim(OWNER, 30)).job
    assert first is not None
    retry = await store.fail_attempt(Lease(job_id=first.id, attempt=1), OWNER, err, 0.2)
    assert retry.status == JobStatus.PENDING and retry.run_at > retry.history[-2]["at"]
    assert (await store.claim(OWNER, 30)).job is None  # not due yet
    await asyncio.sleep(0.25)
    second = (await store.claim(OWNER, 30)).job
    assert second is not None and second.attempts == 2
    final = await store.fail_attempt(Lease(job_id=sub.job.id, attempt=2), OWNER, err, 0.2)
    assert final.status == JobStatus.FAILED and final.finished_at is not None
    assert final.error == err


async def test_renew_extends_held_leases_and_reports_lost_ones(store: JobStore) -> None:
    await store.submit(spec())
    await store.submit(spec())
    a = (await store.claim(OWNER, 5)).job
    b = (await store.claim(OWNER, 5)).job
    assert a and b
    await expire_now(store, b.id)
    [doc] = await store.expired()
    await store.requeue_expired(doc, 0)
    lost = await store.renew(
        OWNER, [Lease(job_id=a.id, attempt=1), Lease(job_id=b.id, attempt=1)], 60
    )
    assert lost == {b.id}
    renewed = await store.get(a.id)
    assert renewed.lease_expires_at is not None and a.lease_expires_at is not None
    assert renewed.lease_expires_at > a.lease_expires_at


async def test_cancel_pending_is_immediate_running_is_requested_finished_is_a_conflict(
    store: JobStore,
) -> None:
    pending = await store.submit(spec(run_at=datetime.now(UTC) + timedelta(hours=1)))
    cancelled = await store.cancel(pending.job.id)
    assert cancelled.status == JobStatus.CANCELLED and cancelled.finished_at is not None
    await store.submit(spec())
    running = (await store.claim(OWNER, 30)).job
    assert running is not None
    requested = await store.cancel(running.id)
    assert requested.status == JobStatus.RUNNING and requested.cancel_requested
    stopped = await store.cancel_running(Lease(job_id=running.id, attempt=1), OWNER)
    assert stopped.status == JobStatus.CANCELLED
    with pytest.raises(JobConflict):
        await store.cancel(running.id)
    with pytest.raises(JobNotFound):
        await store.cancel("nope")


async def test_a_cancel_requested_job_whose_attempt_fails_ends_cancelled(store: JobStore) -> None:
    await store.submit(spec(max_attempts=5))
    job = (await store.claim(OWNER, 30)).job
    assert job is not None
    await store.cancel(job.id)
    ended = await store.fail_attempt(
        Lease(job_id=job.id, attempt=1), OWNER, {"type": "X", "message": ""}, 0
    )
    assert ended.status == JobStatus.CANCELLED


async def test_release_hands_the_job_back_without_counting_the_attempt(store: JobStore) -> None:
    await store.submit(spec())
    job = (await store.claim(OWNER, 30)).job
    assert job is not None
    released = await store.release(Lease(job_id=job.id, attempt=1), OWNER)
    assert (
        released.status == JobStatus.PENDING and released.attempts == 0 and released.owner is None
    )
    again = (await store.claim("next-owner", 30)).job
    assert again is not None and again.id == job.id and again.attempts == 1


async def test_idempotency_key_gives_one_job_under_20_concurrent_submits(store: JobStore) -> None:
    results = await asyncio.gather(*[store.submit(spec(idempotency_key="k-1")) for _ in range(20)])
    assert sum(r.created for r in results) == 1
    assert len({r.job.id for r in results}) == 1
    assert await store.jobs.count_documents({}) == 1


async def test_every_transition_the_store_performs_is_in_the_table(store: JobStore) -> None:
    err = {"type": "E", "message": "m"}
    # complete after a retry
    await store.submit(spec(max_attempts=3))
    j = (await store.claim(OWNER, 30)).job
    assert j
    await store.fail_attempt(Lease(job_id=j.id, attempt=1), OWNER, err, 0)
    j = (await store.claim(OWNER, 30)).job
    assert j
    await store.complete_many(OWNER, [(Lease(job_id=j.id, attempt=2), 1)])
    # fail for good
    await store.submit(spec(max_attempts=1))
    j = (await store.claim(OWNER, 30)).job
    assert j
    await store.fail_attempt(Lease(job_id=j.id, attempt=1), OWNER, err, 0)
    # expire, release, cancel pending, cancel running
    await store.submit(spec())
    j = (await store.claim(OWNER, 30)).job
    assert j
    await expire_now(store, j.id)
    for expired in await store.expired():
        await store.requeue_expired(expired, 0)
    j = (await store.claim(OWNER, 30)).job
    assert j
    await store.release(Lease(job_id=j.id, attempt=j.attempts), OWNER)
    j = (await store.claim(OWNER, 30)).job
    assert j
    await store.cancel(j.id)
    await store.cancel_running(Lease(job_id=j.id, attempt=j.attempts), OWNER)
    p = await store.submit(spec())
    await store.cancel(p.job.id)
    # workflows: waiting → pending (its parent completed), waiting → cancelled
    family = await store.submit_many([spec(ref="p"), spec(depends_on=("p",)), spec(depends_on=("p",))])
    await store.cancel(family[2].job.id)
    j = (await store.claim(OWNER, 30)).job
    assert j and j.id == family[0].job.id and j.has_dependents
    written = await store.complete_many(OWNER, [(Lease(job_id=j.id, attempt=1, has_dependents=True), 0)])
    assert len(await settle(store, written.parents, via="completion")) == 1
    # deadlines: pending → failed, waiting → failed (the waiting one's parent never ends)
    past = datetime.now(UTC) - timedelta(seconds=1)
    late = await store.submit(spec(deadline=past))
    held = await store.submit(spec(run_at=datetime.now(UTC) + timedelta(hours=1)))
    stuck = await store.submit_many([spec(depends_on=(held.job.id,), deadline=past)])
    for job_id in (late.job.id, stuck[0].job.id):
        assert await store.end_past_bound(job_id, "deadline_exceeded", {}) is not None

    seen: set[tuple[JobStatus, JobStatus]] = set()
    async for doc in store.jobs.find({}):
        statuses = [JobStatus(h["status"]) for h in doc["history"]]
        pairs = set(itertools.pairwise(statuses))
        assert pairs <= TRANSITIONS, (doc["_id"], statuses)
        seen |= pairs
    assert seen == TRANSITIONS  # and every transition in the table is exercised


async def test_ensure_indexes_is_idempotent_and_rebuilds_an_index_with_an_old_spec(
    store: JobStore,
) -> None:
    await store.jobs.drop_index("due")
    await store.jobs.create_index([("status", 1), ("run_at", 1)], name="due")  # not partial
    await store.ensure_indexes()
    await store.ensure_indexes()
    info = await store.jobs.index_information()
    assert info["due"]["partialFilterExpression"] == {"status": "pending"}
    assert {"claim_order", "due", "lease_expiry", "list_status", "list_task"} <= set(info)


async def test_complete_many_completes_held_leases_and_reports_lost_and_refused_ones(
    store: JobStore,
) -> None:
    for _ in range(3):
        await store.submit(spec(payload={"pad": "p" * (6 * 1024 * 1024)}))
    a, b, c = [(await store.claim(OWNER, 30)).job for _ in range(3)]
    assert a and b and c
    await expire_now(store, b.id)
    [doc] = await store.expired()
    await store.requeue_expired(doc, 0)  # b's lease is gone
    big = "x" * (11 * 1024 * 1024)  # with the 6 MiB payload, over the 16 MiB document limit
    written = await store.complete_many(
        OWNER,
        [
            (Lease(job_id=a.id, attempt=1), {"ok": 1}),
            (Lease(job_id=b.id, attempt=1), "stale"),
            (Lease(job_id=c.id, attempt=1), big),
        ],
    )
    assert written.done == {a.id} and set(written.refused) == {c.id} and not written.parents
    assert (await store.get(a.id)).result == {"ok": 1}
    assert (await store.get(b.id)).status == JobStatus.PENDING
    assert (await store.get(c.id)).status == JobStatus.RUNNING  # untouched; the caller fails it
    again = await store.complete_many(OWNER, [(Lease(job_id=a.id, attempt=1), {"ok": 1})])
    assert again.done == {a.id}  # a retried batch recognises its own earlier write


async def test_one_completion_write_gives_each_job_its_own_values_and_fences_each_attempt(
    store: JobStore,
) -> None:
    """Several completions go in one write whose values are picked per job: each job gets
    its own result and run times, and each is fenced on its own attempt, owner and
    dependents, exactly as one write per job would."""
    err = {"type": "E", "message": "m"}
    ids = [(await store.submit(spec(max_attempts=3))).job.id for _ in range(6)]
    held = {j.id: j for j in [(await store.claim(OWNER, 30)).job for _ in ids] if j is not None}
    assert set(held) == set(ids)
    retried = ids[0]  # attempt 2 while the others are at 1
    await store.fail_attempt(Lease(job_id=retried, attempt=1), OWNER, err, 0)
    again = (await store.claim(OWNER, 30)).job
    assert again is not None and again.id == retried and again.attempts == 2
    stale = ids[1]  # completed with its old attempt number: matches nothing
    late = ids[2]  # a child attached after the claim: its lease does not know
    knowing = ids[3]  # its lease knows of its dependents
    await store.attach_dependents([late, knowing])
    t0 = max(j.claimed_at for j in held.values() if j.claimed_at) + timedelta(milliseconds=5)
    ran = {i: RunTimes(started_at=t0 + timedelta(milliseconds=n), finished_at=t0 + timedelta(milliseconds=10 * n + 20)) for n, i in enumerate(ids)}
    leases = {i: Lease(job_id=i, attempt=1) for i in ids}
    leases[retried] = Lease(job_id=retried, attempt=2)
    leases[stale] = Lease(job_id=stale, attempt=7)
    leases[knowing] = Lease(job_id=knowing, attempt=1, has_dependents=True)
    items = [(leases[i], {"n": n, "id": i}) for n, i in enumerate(ids)]
    await asyncio.sleep(0.3)  # the run times are in the past (a later one would be cut to now)
    written = await store.complete_many(OWNER, items, ran={i: ran[i] for i in ids if i != retried})
    assert written.done == set(ids) - {stale} and not written.refused
    assert written.parents == {late, knowing}  # the late one completed knowing, on the second try
    for n, i in enumerate(ids):
        job = await store.get(i)
        if i == stale:
            assert job.status == JobStatus.RUNNING and job.result is None
            continue
        assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, {"n": n, "id": i}, leases[i].attempt)
        assert job.history[-1]["attempt"] == leases[i].attempt
        if i != retried:  # its own start and end; the retried one's: the write's time
            assert (job.started_at, job.finished_at) == (ran[i].started_at, ran[i].finished_at)
        else:
            assert job.finished_at is not None and job.finished_at > t0


async def test_a_batch_claim_leases_the_best_due_jobs_once_each_under_a_race(store: JobStore) -> None:
    ids = [(await store.submit(spec(priority=i % 3))).job.id for i in range(30)]
    await store.submit(spec(priority=9, run_at=datetime.now(UTC) + timedelta(hours=1)))
    results: list[tuple[list[Job], bool]] = []

    async def worker(owner: str) -> None:
        while True:  # like a dispatcher: losing a race is not "the queue is dry"
            claimed = await store.claim(owner, 30, BestDue(n=8))
            jobs, dry = claimed.jobs, claimed.dry
            results.append((jobs, dry))
            if dry:
                return

    await asyncio.gather(*[worker(f"owner-{i}") for i in range(5)])
    won = [job for jobs, _ in results for job in jobs]
    assert len(won) == len({j.id for j in won}) == 30  # every due job once, the future one not
    assert {j.id for j in won} == set(ids)
    assert all(j.attempts == 1 and j.status == JobStatus.RUNNING for j in won)
    for jobs, _ in results:
        assert [j.priority for j in jobs] == sorted((j.priority for j in jobs), reverse=True)
        assert all(j.owner == jobs[0].owner for j in jobs)
    claimed = await store.claim("late", 30, BestDue(n=8))
    empty, dry = claimed.jobs, claimed.dry
    assert empty == [] and dry


async def test_submit_many_inserts_in_order_and_dedupes_idempotency_keys(store: JobStore) -> None:
    first = await store.submit(spec(idempotency_key="k-known"))
    specs = [
        spec(payload={"n": 1}, run_at=datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)),
        spec(idempotency_key="k-known"),
        spec(idempotency_key="k-new"),
        spec(idempotency_key="k-new"),
        spec(payload={"n": 2}),
    ]
    out = await store.submit_many(specs)
    assert [s.created for s in out] == [True, False, True, False, True]
    assert out[1].job.id == first.job.id and out[2].job.id == out[3].job.id
    assert out[0].job.payload == {"n": 1} and out[4].job.payload == {"n": 2}
    assert all(s.job.status == JobStatus.PENDING for s in out)
    assert await store.jobs.count_documents({}) == 4
    # Stamped on the server's clock as last read, times in whole milliseconds (a given
    # `run_at` too): each answer is the job as stored, and due the moment it landed.
    assert [s.job for s in out] == [await store.get(s.job.id) for s in out]
    due = {"$expr": {"$lte": ["$run_at", "$$NOW"]}}
    assert await store.jobs.count_documents(due) == 4


async def test_index_rebuild_is_safe_when_several_processes_start_at_once(store: JobStore) -> None:
    await store.jobs.drop_index("due")
    await store.jobs.create_index([("status", 1), ("run_at", 1)], name="due")  # an old spec
    await asyncio.gather(*[store.ensure_indexes() for _ in range(4)])
    info = await store.jobs.index_information()
    assert info["due"]["partialFilterExpression"] == {"status": "pending"}


async def test_an_expired_lease_on_a_job_never_started_does_not_use_up_its_attempts(
    store: JobStore,
) -> None:
    await store.submit(spec(max_attempts=1))
    await store.submit(spec(max_attempts=1))
    ahead = (await store.claim(OWNER, 30)).job  # claimed ahead: its task never started
    ran = (await store.claim(OWNER, 30)).job
    assert ahead and ran
    await store.mark_started(OWNER, [(Lease(job_id=ran.id, attempt=1), datetime.now(UTC))])
    for job in (ahead, ran):
        await expire_now(store, job.id)
    for lease in await store.expired():
        await store.requeue_expired(lease, retry_delay_s=0)
    retried = await store.get(ahead.id)
    assert retried.status == JobStatus.PENDING and retried.max_attempts == 2
    assert retried.attempts == 1  # the fencing token still moved on
    failed = await store.get(ran.id)  # its task had started: the attempt counts
    assert failed.status == JobStatus.FAILED and failed.error and failed.error["type"] == "LeaseExpired"
    again = (await store.claim("next-owner", 30)).job
    assert again is not None and again.id == ahead.id and again.attempts == 2
