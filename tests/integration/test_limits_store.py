"""The slot store on the real replica set: taking slots, claims within `claim_by`, settling,
releases, pruning, the rate window, pause, adoption, and what the plain claim pays."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import bson
import pytest

from brook import AsyncClient, InvalidInput
from brook.common.domain.models import JobSpec
from brook.common.domain.queues import RATE_START_MARGIN_S
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import BestDue, JobStore, Lease, Tagged
from brook.common.store.jobs.candidates import PENDING_QUEUES
from brook.common.store.queries import CLAIM_SORT, claim_filter, claim_index
from brook.common.store.queues import COMPACT_AT, QueueStore
from tests.support.plans import explain_aggregate, keys_examined

OWNER = "d1"


def spec(queue: str = "fragile", task: str = "noop", **kw: object) -> JobSpec:
    return JobSpec(task=task, payload={}, queue=queue, **kw)  # type: ignore[arg-type]


async def pending(store: JobStore, n: int, queue: str = "fragile") -> list[str]:
    return [s.job.id for s in await store.submit_many([spec(queue)] * n)]


def now() -> datetime:
    return datetime.now(UTC)


async def claim_through_slots(
    store: JobStore,
    queues: QueueStore,
    queue: str,
    n: int,
    owner: str = OWNER,
    rated: bool = False,
    window: float = 5,
) -> list[str]:
    """One limited claim, as a dispatcher makes it: slots, claim, and settle if need be."""
    ids = [str(d["_id"]) for d in await store.candidates(n, tasks={"noop"}, queue=queue)]
    tag = f"t-{owner}-{n}-{ids[0] if ids else ''}"
    taken = await queues.take(queue, owner=owner, tag=tag, jobs=ids, claim_window_s=window)
    if not taken.slots:
        return []
    asked = [s.job for s in taken.slots]
    jobs = (await store.claim(owner, 30, Tagged(ids=asked, tag=tag, before=taken.claim_by))).jobs
    started = {j.id: j.claimed_at for j in jobs if j.claimed_at is not None}
    lost = [j for j in asked if j not in started]
    await queues.settle(queue, tag, lost=lost, started=started if rated else None)
    return [j.id for j in jobs]


async def test_racing_claims_never_take_more_slots_than_the_concurrency(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 3})
    ids = await pending(store, 10)
    results = await asyncio.gather(
        *[
            queues.take("fragile", owner=f"d{i}", tag=f"t{i}", jobs=ids, want=2, claim_window_s=5)
            for i in range(20)
        ]
    )
    assert sum(len(r.slots) for r in results) == 3
    named = [s.job for r in results for s in r.slots]
    assert len(set(named)) == 3  # each racing claim took slots for jobs no other one holds
    refused = [r for r in results if not r.slots]
    assert refused and all(r.queue is not None and r.queue.used == 3 for r in refused)
    doc = await queues.read("fragile")
    assert doc is not None and doc.used == 3 and doc.blocked(now()) == ("full", None)


async def test_nothing_is_written_when_no_slot_is_taken(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 1})
    ids = await pending(store, 2)
    assert (await queues.take("fragile", owner=OWNER, tag="a", jobs=ids, claim_window_s=5)).slots
    async with await queues.changes(max_await_ms=300) as stream:
        refused = await queues.take("fragile", owner=OWNER, tag="b", jobs=ids, claim_window_s=5)
        assert not refused.slots and await stream.try_next() is None  # no event, no wake-up
    missing = await queues.take("nope", owner=OWNER, tag="c", jobs=ids, claim_window_s=5)
    assert missing.queue is None and not missing.slots


async def test_a_claim_after_its_slots_claim_by_takes_nothing(store: JobStore) -> None:
    [job_id] = await pending(store, 1)
    past = datetime.now(UTC) - timedelta(seconds=1)
    assert (await store.claim(OWNER, 30, Tagged(ids=[job_id], tag="late", before=past))).jobs == []
    future = datetime.now(UTC) + timedelta(seconds=30)
    [job] = (await store.claim(OWNER, 30, Tagged(ids=[job_id], tag="t1", before=future))).jobs
    assert job.status == "running" and job.attempts == 1
    assert (await store.jobs.find_one({"_id": job_id}) or {})["claim_tag"] == "t1"


async def test_settle_gives_back_lost_slots_and_records_real_starts(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits(
        "fragile", {"concurrency": 5, "rate": {"limit": 100, "per_seconds": 60}}
    )
    ids = await pending(store, 3)
    taken = await queues.take("fragile", owner=OWNER, tag="t1", jobs=ids, claim_window_s=5)
    assert [s.job for s in taken.slots] == ids and all(s.claim_by for s in taken.slots)
    await store.cancel(ids[2])  # gone before the claim: the claim wins two of three
    jobs = (await store.claim(OWNER, 30, Tagged(ids=ids, tag="t1", before=taken.claim_by))).jobs
    assert {j.id for j in jobs} == set(ids[:2])
    started = {j.id: j.claimed_at for j in jobs if j.claimed_at is not None}
    assert await queues.settle("fragile", "t1", lost=[ids[2]], started=started)
    doc = await queues.read("fragile")
    assert doc is not None and {s.job for s in doc.slots} == set(ids[:2])
    assert all(s.claim_by is None for s in doc.slots)  # settled: they count by their start
    assert sorted(doc.starts) == sorted(started.values()) and doc.used == 2
    assert await queues.release("fragile", ids[0], "t1")
    assert not await queues.release("fragile", ids[0], "t1")
    assert not await queues.release("fragile", ids[1], "another-claims-tag")
    doc = await queues.read("fragile")
    assert doc is not None and [s.job for s in doc.slots] == [ids[1]]


async def test_released_together_frees_exactly_the_slots_named_by_job_and_tag(
    store: JobStore,
) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 5})
    ids = await pending(store, 4)
    await queues.take("fragile", owner=OWNER, tag="t1", jobs=ids[:2], claim_window_s=5)
    await queues.take("fragile", owner=OWNER, tag="t2", jobs=ids[2:], claim_window_s=5)
    # One of t1's, one of t2's, and one named with the wrong claim's tag (kept).
    await queues.release_many("fragile", [(ids[0], "t1"), (ids[2], "t2"), (ids[3], "t1")])
    doc = await queues.read("fragile")
    assert doc is not None and sorted(s.job for s in doc.slots) == sorted([ids[1], ids[3]])
    await queues.release_many("fragile", [])  # nothing to give back: no write
    await queues.release_many("fragile", [(ids[1], "t1"), (ids[3], "t2")])
    doc = await queues.read("fragile")
    assert doc is not None and doc.slots == ()


async def test_a_slot_given_back_is_a_small_write_and_a_take_compacts_the_tombstones(
    store: JobStore,
) -> None:
    """A release turns its slots into `null` where they stood: the oplog entry (what every
    secondary applies) names those elements, not the whole array, as removing one from the
    front would. Readers count the live slots; a take drops the tombstones once there are
    `COMPACT_AT` of them."""
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 1000})
    ids = await pending(store, COMPACT_AT + 40)
    await queues.take("fragile", owner=OWNER, tag="t1", jobs=ids, claim_window_s=30)
    raw = store.db["brook_queues"]
    oplog = store.db.client["local"]["oplog.rs"]
    ns = f"{store.db.name}.brook_queues"
    assert await queues.release_many("fragile", [(ids[0], "t1")])
    entry = await oplog.find_one({"ns": ns}, sort=[("$natural", -1)])
    doc = await raw.find_one({"_id": "fragile"})
    assert entry is not None and doc is not None
    assert doc["slots"][0] is None and len(doc["slots"]) == len(ids)
    array = len(bson.encode({"slots": doc["slots"]}))
    assert len(bson.encode(entry["o"])) < 300 < array // 20
    read = await queues.read("fragile")
    assert read is not None and read.used == len(ids) - 1 and ids[0] not in {s.job for s in read.slots}
    # Tombstones up to COMPACT_AT - 1 stay where they are through a take...
    await queues.release_many("fragile", [(i, "t1") for i in ids[1 : COMPACT_AT - 1]])
    more = await pending(store, 2)
    await queues.take("fragile", owner=OWNER, tag="t2", jobs=more[:1], claim_window_s=30)
    doc = await raw.find_one({"_id": "fragile"})
    assert doc is not None and len(doc["slots"]) == len(ids) + 1
    # ...and the take that finds COMPACT_AT of them drops them all.
    await queues.release_many("fragile", [(ids[COMPACT_AT - 1], "t1")])
    await queues.take("fragile", owner=OWNER, tag="t3", jobs=more[1:], claim_window_s=30)
    doc = await raw.find_one({"_id": "fragile"})
    assert doc is not None and None not in doc["slots"]
    assert [s["job"] for s in doc["slots"]] == [*ids[COMPACT_AT:], *more]
    # Given back to the last one: no tombstones are left either.
    await queues.release_many("fragile", [(s["job"], s["tag"]) for s in doc["slots"]])
    doc = await raw.find_one({"_id": "fragile"})
    assert doc is not None and doc["slots"] == []


async def test_a_take_gives_back_the_slots_it_carries_first_and_counts_them_free(
    store: JobStore,
) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 2})
    ids = await pending(store, 4)
    await queues.take("fragile", owner=OWNER, tag="t1", jobs=ids[:2], claim_window_s=5)
    before = await store.db["brook_queues"].find_one({"_id": "fragile"})
    assert before is not None and "released_at" not in before
    # Full: a take alone gets nothing. Carrying the release of one of t1's slots (and one
    # named with another claim's tag, kept), it takes that slot again in the same write.
    assert (await queues.take("fragile", owner=OWNER, tag="t2", jobs=ids[2:], claim_window_s=5)).slots == []
    taken = await queues.take(
        "fragile",
        owner=OWNER,
        tag="t2",
        jobs=ids[2:],
        claim_window_s=5,
        release=[(ids[0], "t1"), (ids[1], "t9")],
    )
    assert [s.job for s in taken.slots] == [ids[2]]
    doc = await queues.read("fragile")
    assert doc is not None and sorted(s.job for s in doc.slots) == sorted([ids[1], ids[2]])
    after = await store.db["brook_queues"].find_one({"_id": "fragile"})
    assert after is not None and after["released_at"] is not None
    # Carrying only slots no longer held releases nothing and marks no release.
    await queues.take(
        "fragile", owner=OWNER, tag="t3", jobs=ids[3:], claim_window_s=5, release=[(ids[0], "t1")]
    )
    again = await store.db["brook_queues"].find_one({"_id": "fragile"})
    assert again is not None and again["released_at"] == after["released_at"]


async def test_prune_frees_what_is_over_and_keeps_what_runs_or_may_still_be_claimed(
    store: JobStore,
) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 10})
    await pending(store, 2)
    running, finished = await claim_through_slots(store, queues, "fragile", 2, window=0.3)
    await store.complete_many(OWNER, [(Lease(job_id=finished, attempt=1), None)])
    # A dispatcher that died after taking slots: one job claimed under them, one never.
    dead_ids = await pending(store, 2)
    dead = await queues.take("fragile", owner="dead", tag="dead", jobs=dead_ids, claim_window_s=0.3)
    [taken] = (await store.claim("dead", 30, Tagged(ids=dead_ids[:1], tag="dead", before=dead.claim_by))).jobs
    fresh_ids = await pending(store, 1)
    fresh = await queues.take(
        "fragile", owner="live", tag="live", jobs=fresh_ids, claim_window_s=30
    )
    assert fresh.slots
    await asyncio.sleep(0.5)  # the first two claims' claim_by has passed, not the fresh one's
    pruned = await queues.prune("fragile")
    assert sorted(s.job for s in pruned.slots) == sorted([finished, dead_ids[1]])
    doc = await queues.read("fragile")
    assert doc is not None
    assert sorted(s.job for s in doc.slots) == sorted([running, taken.id, fresh_ids[0]])
    assert doc.used == 3  # the fresh slot may still be claimed: kept
    assert (await queues.prune("fragile")).slots == []


async def test_the_rate_counts_recorded_starts_and_claims_in_flight(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("rated", {"rate": {"limit": 3, "per_seconds": 1.5}})
    ids = await pending(store, 5, "rated")
    first = await claim_through_slots(store, queues, "rated", 2, rated=True)
    assert len(first) == 2
    in_flight = await queues.take("rated", owner="d2", tag="t2", jobs=ids[2:4], claim_window_s=5)
    assert len(in_flight.slots) == 1  # 2 starts + this one = the limit
    refused = await queues.take("rated", owner="d3", tag="t3", jobs=ids[4:], claim_window_s=5)
    assert not refused.slots and refused.queue is not None
    reason, at = refused.queue.blocked(now())
    # The claim in flight counts as a start at its claim_by (the latest it could start), so
    # the window frees when the first recorded start leaves it (3 per 1.5 s, counted over
    # 1.5 s + RATE_START_MARGIN_S: a claimed job starts within that margin of its claim).
    window = timedelta(seconds=1.5 + RATE_START_MARGIN_S)
    assert reason == "rate" and at == min(refused.queue.starts) + window
    usage = (await queues.usage())["rated"]
    assert usage.in_window == 3 and usage.in_use == 3


async def test_a_paused_queue_gives_no_slot_and_resumes_with_its_limits(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 2})
    await queues.set_limits("fragile", {"paused": True})
    ids = await pending(store, 1)
    refused = await queues.take("fragile", owner=OWNER, tag="t", jobs=ids, claim_window_s=5)
    assert refused.queue is not None and refused.queue.blocked(now()) == ("paused", None)
    assert refused.queue.limits.concurrency == 2  # a pause leaves the other limits alone
    resumed = await queues.set_limits("fragile", {"paused": False})
    assert resumed.limits.concurrency == 2 and not resumed.limits.paused
    assert (await queues.take("fragile", owner=OWNER, tag="t", jobs=ids, claim_window_s=5)).slots


async def test_a_new_concurrency_counts_the_jobs_already_running(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await pending(store, 4)
    claimed = await store.claim(OWNER, 30, BestDue(n=3, tasks={"noop"}, queue="fragile"))
    jobs, _ = claimed.jobs, claimed.dry
    assert len(jobs) == 3
    await queues.set_limits("fragile", {"concurrency": 2})
    doc = await queues.read("fragile")
    assert doc is not None and doc.used == 3 and doc.blocked(now()) == ("full", None)
    assert {s.job for s in doc.slots} == {j.id for j in jobs} and all(s.adopted for s in doc.slots)
    await queues.set_limits("fragile", {"concurrency": 3})  # adopting again adds nothing
    doc = await queues.read("fragile")
    assert doc is not None and doc.used == 3
    await store.complete_many(OWNER, [(Lease(job_id=j.id, attempt=1), None) for j in jobs[:2]])
    assert len((await queues.prune("fragile")).slots) == 2


async def test_clearing_every_limit_leaves_an_unlimited_queue(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("fragile", {"concurrency": 2, "rate": {"limit": 5, "per_seconds": 1}})
    cleared = await queues.set_limits("fragile", {"concurrency": None})
    assert cleared.limits.concurrency is None and cleared.limits.rate is not None
    cleared = await queues.set_limits("fragile", {"rate": None})
    assert not cleared.limits.limited
    assert (
        "fragile" in await queues.limits() and not (await queues.limits())["fragile"].limits.limited
    )


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
    job = (await store.claim(OWNER, 30, BestDue(tasks=tasks, exclude={"fragile"}, among=among))).job
    assert job is not None and job.id == mine
    after = datetime.now(UTC) - timedelta(seconds=1)
    assert await store.next_due(tasks=tasks, exclude={"fragile"}, after=after) is None
    # The queues with pending jobs: a seek per queue on `claim_by_queue`, not a read of the
    # backlog (left to itself, the planner scanned `claim_order`: every pending job).
    plan = await explain_aggregate(store, list(PENDING_QUEUES), "claim_by_queue")
    assert "DISTINCT_SCAN" in plan and "'claim_by_queue'" in plan, plan
    keys = keys_examined(plan)
    assert keys <= 4, keys  # two queues; not the 501 pending jobs


async def test_the_queue_stream_names_each_change_and_the_fields_it_touched(
    store: JobStore,
) -> None:
    queues = QueueStore(store.db)
    async with await queues.changes(max_await_ms=500) as stream:
        await queues.set_limits("fragile", {"concurrency": 1})
        await pending(store, 1)
        [job_id] = await claim_through_slots(store, queues, "fragile", 1, owner="x")
        doc = await queues.read("fragile")
        assert doc is not None
        [slot] = doc.slots
        await queues.release("fragile", job_id, slot.tag)
        seen = []
        idle = 0
        while idle < 2:  # until the stream has been quiet twice
            change = await stream.try_next()
            if change is None:
                idle += 1
                continue
            seen.append((change["operationType"], sorted(change.get("keys") or [])))
    assert seen[0][0] == "insert"
    assert seen[1] == ("update", ["slots"])  # the slot taken
    assert seen[2] == ("update", ["released_at", "slots"])  # given back
    # The claim won its one job and the queue has no rate: nothing to settle, no write.
    assert len(seen) == 3


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
