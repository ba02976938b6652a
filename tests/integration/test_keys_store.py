"""Per-key limits in the slot store on the real replica set: a key's slots under its
`key_concurrency` together with the queue's own concurrency, a key's starts under its
`key_rate`, the keys of a queue's pending jobs and each key's best jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from brook import AsyncClient
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.runtime.supervision import spawn_logged
from brook.common.store.jobs import BestDue, JobStore, Lease
from brook.common.store.jobs.candidates import firsts_of_keys
from brook.common.store.queues import QUEUES, QueueStore
from brook.dispatcher.claiming.holdings import Holdings
from brook.dispatcher.claiming.limits import Limits
from brook.dispatcher.wiring import Wiring
from tests.support.plans import explain_aggregate, keys_examined

OWNER = "d1"


def keyed(key: str | None, queue: str = "tenants", priority: int = 0) -> JobSpec:
    return JobSpec(task="noop", payload={}, queue=queue, key=key, priority=priority)


async def submit(
    store: JobStore, keys: Sequence[str | None], queue: str = "tenants"
) -> list[str]:
    return [s.job.id for s in await store.submit_many([keyed(k, queue) for k in keys])]


async def take(
    queues: QueueStore, ids: list[str], keys: dict[str, str | None], tag: str, want: int
) -> list[str]:
    taken = await queues.take(
        "tenants", owner=OWNER, tag=tag, jobs=ids, claim_window_s=5, want=want, keys=keys
    )
    return [s.job for s in taken.slots]


async def test_a_key_at_its_key_concurrency_gets_no_slot_and_other_keys_do(
    store: JobStore,
) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("tenants", {"key_concurrency": 2})
    ids = await submit(store, ["a", "a", "a", "b", "a", "b", "b", None])
    keys = {i: k for i, k in zip(ids, ["a", "a", "a", "b", "a", "b", "b", None], strict=True)}
    got = await take(queues, ids, keys, "t1", want=8)
    # Two of a, two of b, and the job without a key (held to no key limit).
    assert got == [ids[0], ids[1], ids[3], ids[5], ids[7]]
    # Nothing more for a or b while their slots are held, across claims.
    assert await take(queues, ids, keys, "t2", want=8) == []
    doc = await queues.read("tenants")
    assert doc is not None and doc.now is not None
    assert doc.key_waits(["a", "b", "c", None], doc.now) == {"a": None, "b": None}
    # One of a's slots given back (its job is over): one more of a.
    assert await queues.release("tenants", ids[0], "t1")
    assert await take(queues, ids[1:], keys, "t3", want=8) == [ids[2]]


async def test_the_key_limit_combines_with_the_queues_concurrency(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("tenants", {"key_concurrency": 2, "concurrency": 3})
    names: list[str | None] = ["a", "a", "a", "b", "b", "c"]
    ids = await submit(store, names)
    keys = dict(zip(ids, names, strict=True))
    assert await take(queues, ids, keys, "t1", want=6) == [ids[0], ids[1], ids[3]]
    assert await take(queues, ids, keys, "t2", want=6) == []  # the queue is full


async def test_racing_takes_never_give_a_key_more_than_its_limit(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("tenants", {"key_concurrency": 2})
    names: list[str | None] = [f"k{i % 3}" for i in range(30)]
    ids = await submit(store, names)
    keys = dict(zip(ids, names, strict=True))
    got = await asyncio.gather(*(take(queues, ids, keys, f"t{i}", want=30) for i in range(10)))
    taken = [job for slots in got for job in slots]
    assert len(taken) == len(set(taken)) == 6
    doc = await queues.read("tenants")
    assert doc is not None
    per_key = {k: sum(1 for s in doc.slots if s.key == k) for k in ("k0", "k1", "k2")}
    assert per_key == {"k0": 2, "k1": 2, "k2": 2}


async def test_a_key_rate_counts_each_keys_starts_and_claims_in_flight(store: JobStore) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("tenants", {"key_rate": {"limit": 2, "per_seconds": 60}})
    names: list[str | None] = ["a", "a", "a", "b"]
    ids = await submit(store, names)
    keys = dict(zip(ids, names, strict=True))
    assert await take(queues, ids, keys, "t1", want=1) == [ids[0]]
    # Settled with its real start: it counts as a start of a, no longer as a slot in flight.
    started = {ids[0]: datetime.now(UTC)}
    assert await queues.settle("tenants", "t1", started=started, keys=keys)
    assert await queues.release("tenants", ids[0], "t1")
    assert await take(queues, ids[1:], keys, "t2", want=4) == [ids[1], ids[3]]
    assert await take(queues, ids[1:], keys, "t3", want=4) == []  # a: 2 starts in its window
    doc = await queues.read("tenants")
    assert doc is not None and doc.now is not None
    waits = doc.key_waits(["a", "b"], doc.now)
    assert list(waits) == ["a"] and waits["a"] is not None and waits["a"] > doc.now


async def test_pending_keys_and_each_keys_best_jobs_come_from_the_key_index(
    store: JobStore,
) -> None:
    await store.ensure_indexes()
    ids = await submit(store, ["b", "a", "b", None, "a"])
    await store.submit_many([JobSpec(task="noop", payload={}, queue="tenants", key="b", priority=5)])
    assert await store.pending_keys("tenants") == [None, "a", "b"]
    found = await store.key_candidates("tenants", ["a", "b", None], 2, tasks={"noop"})
    assert [str(d["_id"]) for d in found["a"]] == [ids[1], ids[4]]
    assert found["b"][0]["priority"] == 5 and str(found["b"][1]["_id"]) == ids[0]
    assert [str(d["_id"]) for d in found[None]] == [ids[3]]
    plan = await store.jobs.find(
        {"status": "pending", "queue": "tenants", "key": "a"}, hint="claim_by_key"
    ).explain()
    assert "claim_by_key" in str(plan["queryPlanner"]["winningPlan"])


async def test_each_keys_first_job_is_one_distinct_scan_of_the_key_index(
    store: JobStore,
) -> None:
    """Many keys' candidates at once: each key's best pending job of the tasks asked for, a
    seek per key (not a plan per key, nor a read of every job of the keys)."""
    await store.ensure_indexes()
    ids = await submit(store, ["a", "a", "b"] + [f"k{i}" for i in range(40)] * 5)
    [urgent] = await store.submit_many([keyed("a", priority=5)])
    [other] = await store.submit_many(
        [JobSpec(task="other", payload={}, queue="tenants", key="b", priority=9)]
    )
    await store.submit_many([JobSpec(task="other", payload={}, queue="tenants", key="c")])
    keys = ["a", "b", "c", "nobody", *(f"k{i}" for i in range(40))]
    firsts = await store.first_of_keys("tenants", keys, tasks={"noop"})
    assert str(firsts["a"]["_id"]) == urgent.job.id and firsts["a"]["priority"] == 5
    assert str(firsts["b"]["_id"]) == ids[2]  # its noop job: the other task is not asked for
    assert "c" not in firsts and "nobody" not in firsts
    assert [str(firsts[f"k{i}"]["_id"]) for i in range(40)] == ids[3:43]
    assert str((await store.first_of_keys("tenants", ["b"], tasks=None))["b"]["_id"]) == (
        other.job.id
    )
    plan = await explain_aggregate(store, firsts_of_keys("tenants", keys, {"noop"}), "claim_by_key")
    assert "DISTINCT_SCAN" in plan and "'claim_by_key'" in plan, plan
    seen = keys_examined(plan)
    assert seen <= 2 * len(keys), seen  # 44 keys; not the 206 pending jobs


async def test_many_keys_are_claimed_one_job_each_and_a_key_whose_best_is_not_due_its_due_one(
    store: JobStore, settings: Settings
) -> None:
    await QueueStore(store.db).set_limits("tenants", {"key_concurrency": 2})
    later = datetime.now(UTC) + timedelta(hours=1)
    [future] = await store.submit_many(
        [JobSpec(task="noop", payload={}, queue="tenants", key="k0", priority=9, run_at=later)]
    )
    ids = await submit(store, [f"k{i}" for i in range(5)] * 2)
    limits = await dispatcher_limits(store, settings)
    frozenset({"noop"})
    claimed: list[str] = []
    for n in (2, 2, 1):  # more keys than half the candidates wanted (2n + 2) each time
        claimed += [j.id for j in (await limits.policy("tenants").claim(n)).jobs]
    assert sorted(claimed) == sorted(ids[:5])  # one job of each key, k0's due one
    assert (await store.get(future.job.id)).status == "pending"


async def test_the_python_client_sets_and_lists_key_limits(settings: Settings) -> None:
    async with AsyncClient(settings.mongo_uri, settings.db) as client:
        q = await client.set_queue(
            "tenants", key_concurrency=2, key_rate={"limit": 5, "per_seconds": 1}
        )
        assert q.key_concurrency == 2 and q.key_rate == {"limit": 5, "per_seconds": 1.0}
        assert q.fair is True
        job = await client.submit("noop", queue="tenants", key="acme")
        assert job.key == "acme"
        assert (await client.get(job.id)).key == "acme"
        cleared = await client.set_queue("tenants", key_concurrency=None, key_rate=None)
        assert cleared.fair is False and cleared.key_concurrency is None


async def dispatcher_limits(
    store: JobStore,
    settings: Settings,
    owner: str = OWNER,
    holdings: Holdings | None = None,
    spawned: list[asyncio.Task[None]] | None = None,
) -> Limits:
    """A dispatcher's view of the queues' limits, as it claims through them (the background
    writes it starts kept in `spawned`, when given)."""

    def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = spawn_logged(coro, name)
        if spawned is not None:
            spawned.append(task)
        return task

    wiring = Wiring(
        settings=settings,
        store=store,
        owner=owner,
        name=owner,
        tasks=frozenset({"noop"}),
        holdings=holdings or Holdings(),
        clock=store.clock,
        spawn=spawn,
    )
    limits = Limits(wiring, QueueStore(store.db))
    await limits.refresh()
    return limits


async def test_a_new_keys_job_is_claimed_out_of_turn_and_a_full_key_closes_nothing(
    store: JobStore, settings: Settings
) -> None:
    """The dispatcher's urgent claim of a key it has nothing of (`only`): that key's job,
    not the next in turn; a key with nothing due leaves the queue open for the others."""
    await QueueStore(store.db).set_limits("tenants", {"fair": True})
    a_jobs = await submit(store, ["a"] * 5)
    (b_job,) = await submit(store, ["b"])
    limits = await dispatcher_limits(store, settings)
    assert limits.keyed("tenants")
    frozenset({"noop"})
    # In turn, A's jobs came first (B's key was not heard of); out of turn, B's job.
    got = await limits.policy("tenants").claim(1, only=("b",))
    assert [j.id for j in got.jobs] == [b_job]
    # B has nothing more: no job, and the queue stays open for A.
    nothing = await limits.policy("tenants").claim(1, only=("b",))
    assert nothing.jobs == [] and not nothing.blocked and limits.may_claim("tenants")
    more = await limits.policy("tenants").claim(2)
    assert [j.id for j in more.jobs] == a_jobs[:2]


async def test_a_fair_queue_with_nothing_to_count_claims_by_turns_without_slots(
    store: JobStore, settings: Settings
) -> None:
    queues = QueueStore(store.db)
    await queues.set_limits("tenants", {"fair": True})
    a_jobs = await submit(store, ["a"] * 3)
    b_jobs = await submit(store, ["b"] * 3)
    limits = await dispatcher_limits(store, settings)
    frozenset({"noop"})
    got = await limits.policy("tenants").claim(4)
    # By turns: two of each key's best, not A's three first (submit order) ...
    assert sorted(j.id for j in got.jobs) == sorted(a_jobs[:2] + b_jobs[:2])
    # ... and no slot taken: nothing to count, nothing to give back.
    doc = await store.db[QUEUES].find_one({"_id": "tenants"})
    assert doc is not None and not doc.get("slots")
    # With a per-key limit and the queue's own, the same queue's claims go through its slots.
    await queues.set_limits("tenants", {"key_concurrency": 3, "concurrency": 10})
    await limits.refresh()
    more = await limits.policy("tenants").claim(2)
    assert sorted(j.id for j in more.jobs) == sorted([a_jobs[2], b_jobs[2]])
    doc = await store.db[QUEUES].find_one({"_id": "tenants"})
    assert doc is not None
    assert {j.id for j in more.jobs} <= {slot["job"] for slot in doc["slots"]}


async def slots_of(store: JobStore, ids: Sequence[str]) -> dict[str, str | None]:
    docs = await store.jobs.find({"_id": {"$in": list(ids)}}, {"key_slot": 1}).to_list()
    return {str(d["_id"]): d.get("key_slot") for d in docs}


async def test_a_key_limit_alone_holds_its_slots_on_the_running_jobs(
    store: JobStore, settings: Settings
) -> None:
    """`key_concurrency` and nothing else to count: each claimed job of a key holds one of
    the key's slots in its own document (`queue:index:key`, unique among running jobs);
    `brook_queues` holds none; the write that ends the attempt frees it with the status."""
    queues = QueueStore(store.db)
    await queues.set_limits("tenants", {"key_concurrency": 2})
    a_jobs = await submit(store, ["a"] * 3)
    b_jobs = await submit(store, ["b", None])
    limits = await dispatcher_limits(store, settings)
    frozenset({"noop"})
    got = await limits.policy("tenants").claim(10)
    # A's third job waits for one of A's two to end; a job without a key counts for none.
    assert sorted(j.id for j in got.jobs) == sorted(a_jobs[:2] + b_jobs)
    held = await slots_of(store, [j.id for j in got.jobs])
    assert sorted(s for s in held.values() if s) == ["tenants:0:a", "tenants:0:b", "tenants:1:a"]
    assert held[b_jobs[1]] is None
    doc = await store.db[QUEUES].find_one({"_id": "tenants"})
    assert doc is not None and not doc.get("slots")
    usage = await queues.usage()
    assert usage["tenants"].in_use == 3
    # Two running jobs can never hold one slot, whoever writes it.
    first = next(j for j in got.jobs if held[j.id] == "tenants:0:a")
    other = next(j for j in got.jobs if held[j.id] == "tenants:1:a")
    assert not await store.take_key_slot(OWNER, other.id, other.attempts, "tenants:0:a")
    nothing = await limits.policy("tenants").claim(10)
    assert nothing.jobs == []
    # One of A's jobs completes: its slot is free with its status, and A's third job runs.
    done = await store.complete_many(OWNER, [(Lease(job_id=first.id, attempt=1), None)])
    assert done.done == {first.id}
    limits.finished(first, over=True)
    third = await limits.policy("tenants").claim(10)
    assert [j.id for j in third.jobs] == [a_jobs[2]]
    assert (await slots_of(store, [a_jobs[2]]))[a_jobs[2]] == "tenants:0:a"
    assert (await queues.usage())["tenants"].in_use == 3


async def test_a_slot_held_by_another_dispatchers_job_stops_the_claim_at_that_key_only(
    store: JobStore, settings: Settings
) -> None:
    """Two dispatchers, a key limited to one: the second one's claim finds the key's slot
    held (a `DuplicateKeyError` of the `key_slots` index), keeps the jobs it claimed, and
    that key waits out of turn while the others are claimed; once the holder's attempt ends
    the key runs again. No key ever has two running jobs."""
    await QueueStore(store.db).set_limits("tenants", {"key_concurrency": 1})
    one = await dispatcher_limits(store, settings)
    (a1,) = await submit(store, ["a"])
    got = await one.policy("tenants").claim(1)
    assert [j.id for j in got.jobs] == [a1]
    a_more = await submit(store, ["a", "a"])
    others = await submit(store, ["b", "c", "d"])
    two = await dispatcher_limits(store, settings, owner="d2")
    frozenset({"noop"})
    claimed: list[str] = []
    for _ in range(4):
        claimed += [j.id for j in (await two.policy("tenants").claim(10)).jobs]
    assert sorted(claimed) == sorted(others)  # not A's: its one slot is held by `one`
    running = await store.jobs.count_documents({"key": "a", "status": "running"})
    assert running == 1
    done = await store.complete_many(OWNER, [(Lease(job_id=a1, attempt=1), None)])
    assert done.done == {a1}
    await asyncio.sleep(0.2)  # the key's wait (`KEY_HELD_ELSEWHERE_S`) is over
    after = await two.policy("tenants").claim(10)
    assert [j.id for j in after.jobs] == a_more[:1]


async def test_running_jobs_take_their_keys_slots_when_a_key_limit_comes(
    store: JobStore, settings: Settings
) -> None:
    """Jobs claimed before their queue had a per-key limit (the plain claim): when it comes,
    each takes a slot of its key while one is free (the one that finds none runs on, as it
    started before the limit); the key's next job then waits for a slot."""
    a_jobs = await submit(store, ["a"] * 3)
    holdings = Holdings()
    spawned: list[asyncio.Task[None]] = []
    limits = await dispatcher_limits(store, settings, holdings=holdings, spawned=spawned)
    for _ in range(2):
        job = (await store.claim(OWNER, 30, BestDue(tasks=frozenset({"noop"}), queue="tenants"))).job
        assert job is not None
        holdings.add(job)
    await QueueStore(store.db).set_limits("tenants", {"key_concurrency": 1})
    await limits.refresh()

    async def adopted() -> list[str | None]:
        return sorted((await slots_of(store, a_jobs[:2])).values(), key=str)

    adoptions = [t for t in spawned if t.get_name().startswith("adopt-slot:")]
    assert len(adoptions) == 1  # the one free slot is asked for once; the other runs on
    await asyncio.gather(*adoptions)  # its write has landed (or failed, and said so)
    assert await adopted() == [None, "tenants:0:a"]
    got = await limits.policy("tenants").claim(5)
    assert got.jobs == []
