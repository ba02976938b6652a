"""Workflows against the real replica set: submitting DAGs, settling dependents when a
parent ends (from the completion, a failure, a cancel, the submit itself or the sweep),
the races between them, round trips, and retention of parents."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from brook import AsyncClient, Client, InvalidInput
from brook.common.client.dependents import settle
from brook.common.domain.models import Job
from brook.common.domain.status import JobStatus
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import BestDue, JobStore, Lease
from tests.support.commands import CommandCounter
from tests.support.failpoints import fail_commands, fail_nothing

OWNER = "test-owner"
W, P, C = JobStatus.WAITING, JobStatus.PENDING, JobStatus.CANCELLED


@pytest.fixture
async def aclient(settings: Settings) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        yield client


async def claim(store: JobStore, task: str) -> Job:
    job = (await store.claim(OWNER, 30, BestDue(tasks={task}))).job
    assert job is not None, f"no due {task} job"
    return job


def lease(job: Job) -> Lease:
    return Lease(job_id=job.id, attempt=job.attempts, has_dependents=job.has_dependents)


async def complete(store: JobStore, task: str, result: Any = None) -> Job:
    """Claim the due job of `task`, complete it and settle its dependents: a dispatcher."""
    job = await claim(store, task)
    written = await store.complete_many(OWNER, [(lease(job), result)])
    assert written.done == {job.id}
    await settle(store, written.parents, via="completion")
    return job


async def fail(store: JobStore, task: str) -> Job:
    job = await claim(store, task)
    failed = await store.fail_attempt(lease(job), OWNER, {"type": "Boom", "message": "x"}, 0, final=True)
    assert failed.status == JobStatus.FAILED
    if failed.has_dependents:
        await settle(store, [job.id], via="failure")
    return job


async def finish(store: JobStore, running: Job, result: Any) -> None:
    written = await store.complete_many(OWNER, [(lease(running), result)])
    await settle(store, written.parents, via="completion")


async def statuses(store: JobStore, *jobs: Job) -> list[JobStatus]:
    found = await store.get_many([j.id for j in jobs])
    return [found[j.id].status for j in jobs]


DIAMOND: list[dict[str, Any]] = [
    {"task": "a", "ref": "a"},
    {"task": "b", "ref": "b", "depends_on": ["a"]},
    {"task": "c", "ref": "c", "depends_on": ["a"]},
    {"task": "d", "ref": "d", "depends_on": ["b", "c"]},
]


async def test_a_diamond_in_one_batch_releases_d_only_after_b_and_c_and_d_reads_both(
    aclient: AsyncClient, store: JobStore
) -> None:
    a, b, c, d = await aclient.submit_many(DIAMOND)
    assert [a.status, b.status, c.status, d.status] == [P, W, W, W]
    assert d.depends_on == d.parents_left == [b.id, c.id] and d.ref == "d"
    assert (await store.get(a.id)).has_dependents and not (await store.get(d.id)).has_dependents
    await complete(store, "a", "ra")
    assert await statuses(store, b, c, d) == [P, P, W]
    await complete(store, "b", {"from": "b"})
    assert (await store.get(d.id)).parents_left == [c.id]
    await complete(store, "c", [1, 2])
    released = await store.get(d.id)
    assert released.status == P and released.parents_left == []
    assert released.run_at >= released.history[-1]["at"]  # due from its release
    assert [h["status"] for h in released.history] == ["waiting", "pending"]
    assert await aclient.parent_results(d.id) == {b.id: {"from": "b"}, c.id: [1, 2]}
    await complete(store, "d")
    assert await store.unsettled_parents() == []


async def test_a_failed_parent_cancels_its_dependents_down_the_graph(
    aclient: AsyncClient, store: JobStore
) -> None:
    _, b, c, d, e = await aclient.submit_many(
        [*DIAMOND, {"task": "e", "depends_on": ["d"]}]
    )
    await complete(store, "a")
    await fail(store, "b")
    found = await store.get_many([c.id, d.id, e.id])
    assert found[c.id].status == P  # not a dependent of b
    for job in (found[d.id], found[e.id]):
        assert job.status == C and job.finished_at is not None and job.expire_at is not None
        assert [h["status"] for h in job.history] == ["waiting", "cancelled"]
        assert job.history[-1]["error"] == "DependencyFailed"
    assert found[d.id].error == {"type": "DependencyFailed", "message": f"parent {b.id} failed"}
    assert found[e.id].error == {"type": "DependencyFailed", "message": f"parent {d.id} cancelled"}
    await complete(store, "c")  # c's completion finds d settled already: nothing changes
    assert (await store.get(d.id)).status == C


async def test_run_on_parent_failure_runs_once_every_parent_ended(
    aclient: AsyncClient, store: JobStore
) -> None:
    specs = [*DIAMOND[:3], {"task": "d", "depends_on": ["b", "c"], "run_on_parent_failure": True}]
    _, b, c, d = await aclient.submit_many(specs)
    await complete(store, "a")
    await fail(store, "b")
    assert (await store.get(d.id)).status == W  # c has not ended yet
    await complete(store, "c", "rc")
    assert (await store.get(d.id)).status == P
    assert await aclient.parent_results(d.id) == {b.id: None, c.id: "rc"}


async def test_a_child_attached_while_its_parent_runs_is_released_by_that_completion(
    aclient: AsyncClient, store: JobStore
) -> None:
    parent = await aclient.submit("a")
    running = await claim(store, "a")
    assert not running.has_dependents  # as the dispatcher saw it at its claim
    child = await aclient.submit("b", depends_on=[parent.id])
    assert child.status == W and (await store.get(parent.id)).has_dependents
    # The completion does not know of the child: fenced on "no dependents", it matches
    # nothing at first, and is written again knowing.
    written = await store.complete_many(OWNER, [(lease(running), "r")])
    assert written.done == written.parents == {parent.id} and not written.refused
    assert (await store.get(parent.id)).status == JobStatus.COMPLETED
    await settle(store, written.parents, via="completion")
    assert (await store.get(child.id)).status == P


async def test_a_child_submitted_while_its_parent_completes_is_never_left_waiting(
    aclient: AsyncClient, store: JobStore
) -> None:
    """However the submit and the completion interleave, the child is settled by one of
    them, without the sweep."""
    for i in range(20):
        parent = await aclient.submit("a", {"i": i})
        running = await claim(store, "a")

        child, _ = await asyncio.gather(
            aclient.submit("b", depends_on=[parent.id]), finish(store, running, i)
        )
        assert (await store.get(child.id)).status == P, i
    assert await store.unsettled_parents() == []


async def test_a_child_of_a_parent_that_already_ended_is_settled_at_submit(
    aclient: AsyncClient, store: JobStore
) -> None:
    done = await aclient.submit("a")
    await complete(store, "a", "r")
    failed = await aclient.submit("f", max_attempts=1)
    await fail(store, "f")
    cancelled = await aclient.cancel((await aclient.submit("x")).id)
    assert (await aclient.submit("b", depends_on=[done.id])).status == P
    orphan = await aclient.submit("b", depends_on=[done.id, failed.id])
    assert orphan.status == C and orphan.error is not None
    assert orphan.error["type"] == "DependencyFailed"
    assert (await aclient.submit("b", depends_on=[cancelled.id])).status == C
    tolerant = await aclient.submit("b", depends_on=[failed.id], run_on_parent_failure=True)
    assert tolerant.status == P


async def test_unknown_parents_are_refused_naming_the_spec_and_nothing_is_stored(
    aclient: AsyncClient, store: JobStore
) -> None:
    real = await aclient.submit("a")
    with pytest.raises(InvalidInput) as info:
        await aclient.submit_many(
            [{"task": "a", "ref": "x"}, {"task": "b", "depends_on": ["x", real.id, "nope"]}]
        )
    assert info.value.detail == [
        {
            "loc": ["jobs", 1, "depends_on", 2],
            "msg": "unknown parent 'nope': no job has this id, nor a ref of this batch",
            "type": "unknown_parent",
        }
    ]
    with pytest.raises(InvalidInput) as info:
        await aclient.submit("b", depends_on=["nope"])
    assert info.value.detail == [
        {"loc": ["depends_on", 0], "msg": "unknown parent 'nope': no job has this id", "type": "unknown_parent"}
    ]
    with pytest.raises(InvalidInput, match="dependency cycle: x -> y -> x"):
        await aclient.submit_many(
            [{"task": "a", "ref": "x", "depends_on": ["y"]}, {"task": "b", "ref": "y", "depends_on": ["x"]}]
        )
    assert await store.jobs.count_documents({}) == 1
    assert not (await store.get(real.id)).has_dependents


async def test_the_sweep_settles_a_parent_whose_settler_died_and_only_then_it_may_expire(
    aclient: AsyncClient, store: JobStore
) -> None:
    parent, child = await aclient.submit_many(
        [{"task": "a", "ref": "p", "retention_s": 60}, {"task": "b", "depends_on": ["p"]}]
    )
    job = await claim(store, "a")
    written = await store.complete_many(OWNER, [(lease(job), "r")])  # ... and the dispatcher dies
    assert written.parents == {parent.id}
    held = await store.get(parent.id)
    assert held.status == JobStatus.COMPLETED and held.expire_at is None  # its child may read it
    assert await store.unsettled_parents() == [parent.id]
    [settled] = await settle(store, await store.unsettled_parents(), via="sweep")
    assert settled.job_id == child.id and settled.status == P
    assert await store.unsettled_parents() == []
    kept = await store.get(parent.id)
    assert kept.expire_at is not None and kept.finished_at is not None
    assert 59 <= (kept.expire_at - kept.finished_at).total_seconds() < 75  # from the release
    assert await settle(store, [parent.id], via="sweep") == []  # idempotent


async def test_two_settlers_of_one_parent_change_each_child_once(
    aclient: AsyncClient, store: JobStore
) -> None:
    jobs = await aclient.submit_many(
        [{"task": "a", "ref": "p"}, *({"task": "b", "depends_on": ["p"]} for _ in range(50))]
    )
    job = await claim(store, "a")
    await store.complete_many(OWNER, [(lease(job), None)])
    first, second = await asyncio.gather(
        settle(store, [job.id], via="completion"), settle(store, [job.id], via="sweep")
    )
    assert sorted(c.job_id for c in first + second) == sorted(j.id for j in jobs[1:])
    assert await store.jobs.count_documents({"status": "pending"}) == 50


async def test_a_released_child_claimed_before_the_settle_reads_it_back_is_reported_released(
    aclient: AsyncClient, store: JobStore, settings: Settings
) -> None:
    """The settle reads its changes back by tag; by then a dispatcher may have claimed the
    child. It is reported as this settle left it (pending, attempt 0), not as it is now."""
    a, b = await aclient.submit_many(
        [{"task": "a", "ref": "a"}, {"task": "b", "depends_on": ["a"]}]
    )
    job = await claim(store, "a")
    await store.complete_many(OWNER, [(lease(job), None)])
    client = make_client(settings, appname="settle-test")
    try:
        # The settle's first finds (its ended parents, its page of children) pass; its
        # read-back is held.
        await fail_commands(
            client, "settle-test", ["find"], {"skip": 2}, blockConnection=True, blockTimeMS=2000
        )
        settler = JobStore(database(client, settings))
        settling = asyncio.create_task(settle(settler, [a.id], via="completion"))
        for _ in range(100):  # released within 1 s, its read-back held for 2 s
            if (await store.get(b.id)).status == P:
                break
            await asyncio.sleep(0.01)
        assert (await claim(store, "b")).id == b.id and not settling.done()
        [settled] = await settling
    finally:
        await fail_nothing(client)
        await client.close()
    assert (settled.job_id, settled.status, settled.attempt) == (b.id, P, 0)
    assert (await store.get(b.id)).status == JobStatus.RUNNING


async def test_cancelling_a_waiting_job_cancels_its_dependents(
    aclient: AsyncClient, store: JobStore
) -> None:
    _, b, _, d = await aclient.submit_many(DIAMOND)
    cancelled = await aclient.cancel(b.id)
    assert cancelled.status == C and [h["status"] for h in cancelled.history] == ["waiting", "cancelled"]
    orphan = await store.get(d.id)
    assert orphan.status == C and orphan.error is not None
    assert orphan.error["message"] == f"parent {b.id} cancelled"


async def test_a_deduplicated_parent_in_a_batch_is_the_job_holding_its_key(
    aclient: AsyncClient, store: JobStore
) -> None:
    existing = await aclient.submit("a", idempotency_key="k")
    parent, child = await aclient.submit_many(
        [{"task": "a", "ref": "p", "idempotency_key": "k"}, {"task": "b", "depends_on": ["p"]}]
    )
    assert parent.id == existing.id and child.depends_on == child.parents_left == [existing.id]
    assert (await store.get(existing.id)).has_dependents
    await complete(store, "a")
    assert (await store.get(child.id)).status == P


async def test_fan_out_and_fan_in_of_1000_cost_a_few_round_trips_per_parent(
    aclient: AsyncClient, settings: Settings
) -> None:
    counter = CommandCounter()
    client = make_client(settings, event_listeners=[counter])
    store = JobStore(database(client, settings))
    try:
        fan_out = await aclient.submit_many(
            [{"task": "a", "ref": "p"}, *({"task": "b", "depends_on": ["p"]} for _ in range(999))]
        )
        job = await claim(store, "a")
        await store.complete_many(OWNER, [(lease(job), "r")])
        counter.reset()
        released = await settle(store, [job.id], via="completion")
        assert len(released) == 999 and {c.status for c in released} == {P}
        assert sum(counter.counts.values()) == 5, counter.counts  # 3 reads, 2 writes
        assert counter.statements == [1, 1]  # one update_many for 999 children, one to unmark

        parents = await aclient.submit_many([{"task": "c"} for _ in range(1000)])
        child = await aclient.submit("d", depends_on=[p.id for p in parents])
        assert child.status == W
        per_parent: list[int] = []
        for _ in range(1000):
            parent = await claim(store, "c")
            written = await store.complete_many(OWNER, [(lease(parent), None)])
            counter.reset()
            await settle(store, written.parents, via="completion")
            per_parent.append(sum(counter.counts.values()))
        assert max(per_parent) <= 6
        assert (await store.get(child.id)).status == P
        assert len(fan_out) == 1000
    finally:
        await client.close()


async def test_retrying_a_failed_parent_then_its_cancelled_child_runs_the_child_after_it(
    aclient: AsyncClient, store: JobStore
) -> None:
    _, b, c, d = await aclient.submit_many(DIAMOND)
    await complete(store, "a")
    await fail(store, "b")
    await complete(store, "c", "rc")
    assert (await store.get(d.id)).status == C
    too_soon = await aclient.retry(d.id)  # b has not completed: d is cancelled again at once
    assert too_soon.status == C and [h["status"] for h in too_soon.history][-2:] == ["waiting", "cancelled"]
    assert (await aclient.retry(b.id)).status == P
    again = await aclient.retry(d.id)
    assert again.status == W and again.parents_left == [b.id]  # c completed already
    await complete(store, "b", "rb")
    released = await store.get(d.id)
    assert released.status == P and await aclient.parent_results(d.id) == {b.id: "rb", c.id: "rc"}
    assert (released.attempts, released.max_attempts) == (0, 3)  # it never ran: a full budget


async def test_a_parent_is_kept_until_its_dependents_are_settled_and_its_retention_after(
    aclient: AsyncClient, store: JobStore
) -> None:
    a, c = await aclient.submit_many(
        [{"task": "a", "ref": "a", "retention_s": 0}, {"task": "c", "depends_on": ["a"]}]
    )
    job = await claim(store, "a")
    written = await store.complete_many(OWNER, [(lease(job), "ra")])  # not settled yet
    await asyncio.sleep(1.5)  # the embedded set's TTL monitor runs every second
    kept = await store.get(a.id)
    assert kept.expire_at is None and kept.result == "ra"
    await settle(store, written.parents, via="completion")
    assert (await store.get(c.id)).status == P
    assert (await store.get(a.id)).expire_at is not None  # retention counts from the settle


def test_the_blocking_client_submits_a_dag_and_reads_parent_results(settings: Settings) -> None:
    with Client(settings.mongo_uri, settings.db) as client:
        a, b = client.submit_many([{"task": "a", "ref": "a"}, {"task": "b", "depends_on": ["a"]}])
        assert b.status == W and b.depends_on == [a.id]
        assert client.parent_results(b.id) == {a.id: None}  # a has not run: no result yet
        tolerant = client.submit("c", depends_on=[a.id, b.id], run_on_parent_failure=True)
        assert tolerant.parents_left == [a.id, b.id]
        assert client.cancel(a.id).status == C
        assert [client.get(j.id).status for j in (b, tolerant)] == [C, P]
