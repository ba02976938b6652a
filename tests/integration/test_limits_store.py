"""The slot store on the real replica set: tickets, claims within `claim_by`, settling,
releases, pruning, the rate window, pause, adoption, and what the plain claim pays."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from brook import AsyncClient, InvalidInput
from common.models import JobSpec
from common.queues_store import QueueStore, Won
from common.settings import Settings
from common.store import CLAIM_SORT, JobStore, Lease, claim_filter, claim_index

OWNER = "d1"


def spec(queue: str = "fragile", task: str = "noop", **kw: object) -> JobSpec:
    return JobSpec(task=task, payload={}, queue=queue, **kw)  # type: ignore[arg-type]


async def pending(store: JobStore, n: int, queue: str = "fragile") -> list[str]:
    return [s.job.id for s in await store.submit_many([spec(queue)] * n)]


async def claim_through_slots(
    store: JobStore, queues: QueueStore, queue: str, n: int, owner: str = OWNER
) -> list[str]:
    """One limited claim, as a dispatcher makes it: ticket, claim, settle."""
    ids = await store.candidates(n, tasks={"noop"}, queue=queue)
    ticket = await queues.acquire(queue, owner=owner, tag=f"t{owner}{n}", jobs=ids, claim_window_s=5)
    if ticket is None:
        return []
    jobs = await store.claim_tagged(owner, 30, ids[: ticket.n], ticket.id, ticket.claim_by)
    won = [Won(job_id=j.id, attempt=j.attempts, started_at=j.started_at) for j in jobs if j.started_at]
    assert await queues.settle(queue, ticket, won)
    return [j.id for j in jobs]


async def test_racing_tickets_never_take_more_slots_than_the_concurrency(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 3})
    ids = await pending(store, 10)
    tickets = await asyncio.gather(
        *[
            queues.acquire("fragile", owner=f"d{i}", tag=f"t{i}", jobs=ids[:2], claim_window_s=5)
            for i in range(20)
        ]
    )
    assert sum(t.n for t in tickets if t is not None) == 3
    doc = await queues.read("fragile")
    assert doc is not None and doc.used == 3 and doc.blocked() == ("full", None)


async def test_a_claim_after_its_tickets_claim_by_takes_nothing(store: JobStore) -> None:
    [job_id] = await pending(store, 1)
    past = datetime.now(UTC) - timedelta(seconds=1)
    assert await store.claim_tagged(OWNER, 30, [job_id], "late", past) == []
    future = datetime.now(UTC) + timedelta(seconds=30)
    [job] = await store.claim_tagged(OWNER, 30, [job_id], "t1", future)
    assert job.status == "running" and job.attempts == 1
    assert (await store.jobs.find_one({"_id": job_id}) or {})["claim_tag"] == "t1"


async def test_settle_keeps_a_slot_per_job_won_and_gives_the_rest_back(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 5})
    ids = await pending(store, 3)
    ticket = await queues.acquire("fragile", owner=OWNER, tag="t1", jobs=ids, claim_window_s=5)
    assert ticket is not None and ticket.n == 3 and ticket.jobs == tuple(ids)
    await store.cancel(ids[2])  # gone before the claim: the ticket wins two of three
    jobs = await store.claim_tagged(OWNER, 30, ids, ticket.id, ticket.claim_by)
    assert {j.id for j in jobs} == set(ids[:2])
    won = [Won(job_id=j.id, attempt=j.attempts, started_at=j.started_at) for j in jobs if j.started_at]
    assert await queues.settle("fragile", ticket, won)
    assert not await queues.settle("fragile", ticket, won)  # once only
    doc = await queues.read("fragile")
    assert doc is not None and doc.tickets == () and {s.job for s in doc.slots} == set(ids[:2])
    assert doc.used == 2 and doc.starts == ()  # no rate: no starts kept
    assert await queues.release("fragile", ids[0], ticket.id)
    assert not await queues.release("fragile", ids[0], ticket.id)
    assert not await queues.release("fragile", ids[1], "another-claims-tag")
    doc = await queues.read("fragile")
    assert doc is not None and [s.job for s in doc.slots] == [ids[1]]


async def test_prune_frees_what_is_over_and_keeps_what_runs_or_may_still_be_claimed(
    store: JobStore,
) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 10})
    await pending(store, 2)
    running, finished = await claim_through_slots(store, queues, "fragile", 2)
    await store.complete_many(OWNER, [(Lease(job_id=finished, attempt=1), None)])
    # A dispatcher that died after its ticket: one job claimed under it, one never.
    stale_ids = await pending(store, 2)
    stale = await queues.acquire("fragile", owner="dead", tag="dead1", jobs=stale_ids, claim_window_s=0.3)
    assert stale is not None and stale.n == 2
    [taken] = await store.claim_tagged("dead", 30, stale_ids[:1], stale.id, stale.claim_by)
    fresh_ids = await pending(store, 1)
    fresh = await queues.acquire("fragile", owner="live", tag="live1", jobs=fresh_ids, claim_window_s=30)
    assert fresh is not None
    await asyncio.sleep(0.5)  # the dead ticket's claim_by has passed
    pruned = await queues.prune("fragile")
    assert [s.job for s in pruned.slots] == [finished]
    assert [t.id for t in pruned.tickets] == ["dead1"]
    assert pruned.freed == 2  # the finished attempt's slot, the unclaimed half of the ticket
    doc = await queues.read("fragile")
    assert doc is not None
    assert sorted(s.job for s in doc.slots) == sorted([running, taken.id])
    assert [t.id for t in doc.tickets] == ["live1"]  # may still be claimed: kept whole
    assert doc.used == 3
    assert (await queues.prune("fragile")).freed == 0


async def test_the_rate_counts_recorded_starts_and_tickets_in_flight(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("quota", {"rate": {"limit": 3, "per_seconds": 1.5}})
    ids = await pending(store, 5, "quota")
    first = await claim_through_slots(store, queues, "quota", 2)
    assert len(first) == 2
    in_flight = await queues.acquire("quota", owner="d2", tag="t2", jobs=ids[2:4], claim_window_s=5)
    assert in_flight is not None and in_flight.n == 1  # 2 starts + this one = the limit
    assert await queues.acquire("quota", owner="d3", tag="t3", jobs=ids[4:], claim_window_s=5) is None
    doc = await queues.read("quota")
    assert doc is not None
    reason, at = doc.blocked()
    # The ticket counts as a start at its claim_by (the latest it could start), so the
    # window frees when the first start leaves it (the rate is 3 per 1.5 s).
    assert reason == "rate" and at is not None
    assert at == min(doc.starts) + timedelta(seconds=1.5)
    usage = (await queues.usage())["quota"]
    assert usage.in_window == 3 and usage.in_use == 3


async def test_a_paused_queue_gives_no_slot_and_resumes_with_its_limits(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 2})
    await queues.set_limits("fragile", {"paused": True})
    ids = await pending(store, 1)
    assert await queues.acquire("fragile", owner=OWNER, tag="t", jobs=ids, claim_window_s=5) is None
    doc = await queues.read("fragile")
    assert doc is not None and doc.blocked() == ("paused", None)
    assert doc.limits.concurrency == 2  # a pause leaves the other limits alone
    resumed = await queues.set_limits("fragile", {"paused": False})
    assert resumed.limits.concurrency == 2 and not resumed.limits.paused
    assert await queues.acquire("fragile", owner=OWNER, tag="t", jobs=ids, claim_window_s=5)


async def test_a_new_concurrency_counts_the_jobs_already_running(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await pending(store, 4)
    jobs, _ = await store.claim_many(OWNER, 30, 3, tasks={"noop"}, queue="fragile")
    assert len(jobs) == 3
    await queues.set_limits("fragile", {"concurrency": 2})
    doc = await queues.read("fragile")
    assert doc is not None and doc.used == 3 and doc.blocked() == ("full", None)
    assert {s.job for s in doc.slots} == {j.id for j in jobs} and all(s.adopted for s in doc.slots)
    await queues.set_limits("fragile", {"concurrency": 3})  # adopting again adds nothing
    doc = await queues.read("fragile")
    assert doc is not None and doc.used == 3
    await store.complete_many(OWNER, [(Lease(job_id=j.id, attempt=1), None) for j in jobs[:2]])
    assert (await queues.prune("fragile")).freed == 2


async def test_clearing_every_limit_leaves_an_unlimited_queue(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 2, "rate": {"limit": 5, "per_seconds": 1}})
    cleared = await queues.set_limits("fragile", {"concurrency": None})
    assert cleared.limits.concurrency is None and cleared.limits.rate is not None
    cleared = await queues.set_limits("fragile", {"rate": None})
    assert not cleared.limits.limited
    assert "fragile" in await queues.limits() and not (await queues.limits())["fragile"].limits.limited


async def test_a_backlog_in_a_limited_queue_costs_the_plain_claim_nothing(
    store: JobStore,
) -> None:
    # 500 due jobs of a limited queue, all ahead of the one job the plain claim may take.
    await store.submit_many([spec("fragile", priority=5)] * 500)
    mine = (await store.submit(spec("default"))).job.id
    tasks = {"noop", "echo"}
    among = await store.pending_queues() - {"fragile"}
    assert among == {"default"}
    stats = await store.db.command(
        "explain",
        {
            "find": "jobs",
            "filter": claim_filter(tasks, None, {"fragile"}, among),
            "sort": dict(CLAIM_SORT),
            "hint": claim_index(tasks, None, among),
            "limit": 1,
        },
        verbosity="executionStats",
    )
    run = stats["executionStats"]
    # One scan per (queue, task) it may take from, merged: the backlog is never touched.
    assert run["totalDocsExamined"] <= 1 and run["totalKeysExamined"] <= 3, run
    plan = str(stats["queryPlanner"]["winningPlan"])
    assert "'claim_by_queue'" in plan and "SORT_MERGE" in plan and "'SORT'" not in plan
    job = await store.claim(OWNER, 30, tasks=tasks, exclude={"fragile"}, among=among)
    assert job is not None and job.id == mine
    after = datetime.now(UTC) - timedelta(seconds=1)
    assert await store.next_due(tasks=tasks, exclude={"fragile"}, after=after) is None
    distinct = await store.db.command(
        "explain", {"distinct": "jobs", "key": "queue", "query": {"status": "pending"}}
    )
    assert "DISTINCT_SCAN" in str(distinct["queryPlanner"]["winningPlan"])


async def test_the_queue_stream_names_each_change_and_the_fields_it_touched(
    store: JobStore,
) -> None:
    queues = QueueStore(store.db)
    async with await queues.changes(max_await_ms=500) as stream:
        await queues.set_limits("fragile", {"concurrency": 1})
        await pending(store, 1)
        [job_id] = await claim_through_slots(store, queues, "fragile", 1, owner="x")
        await queues.release("fragile", job_id, "tx1")
        seen = []
        for _ in range(10):
            change = await stream.try_next()
            if change is not None:
                seen.append((change["operationType"], sorted(change.get("keys") or [])))
            if len(seen) == 4:
                break
    assert seen[0][0] == "insert"
    assert seen[1] == ("update", ["tickets"])
    assert "slots" in seen[2][1] and "released_at" not in seen[2][1]  # all of the ticket won
    assert seen[3] == ("update", ["released_at", "slots"])


async def test_the_python_client_sets_limits_by_keyword_or_dict_and_lists_them(
    store: JobStore, settings: Settings
) -> None:
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        q = await client.set_queue("emails", concurrency=2, rate={"limit": 5, "per_seconds": 1})
        assert (q.concurrency, q.rate, q.paused, q.slots_in_use) == (
            2,
            {"limit": 5, "per_seconds": 1.0},
            False,
            0,
        )
        q = await client.set_queue("emails", {"paused": True}, concurrency=None)
        assert (q.concurrency, q.paused) == (None, True)
        with pytest.raises(InvalidInput):
            await client.set_queue("emails", concurrency=0)
        [listed] = [x for x in await client.queues() if x.name == "emails"]
        assert listed == q
