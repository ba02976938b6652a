"""A cancel that reaches spawned jobs (`spawned_by`), on the real replica set: the tree
below a cancelled job, finished branches walked through, a detached job left alone, a dry
run, a finished parent, the listing by `spawned_by`, and a propagation cut short that a
dispatcher's sweep finishes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from pymongo.errors import OperationFailure

from brook import AsyncClient, JobConflict
from brook.common.client.spawned import sweep_spawned
from brook.common.domain.models import JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import JobStore, Lease, Tagged
from tests.support.failpoints import fail_commands, fail_nothing

OWNER = "d1"


@pytest.fixture
async def client(settings: Settings, store: JobStore) -> AsyncIterator[AsyncClient]:
    await store.ensure_indexes()
    async with AsyncClient(settings.mongo_uri, settings.db) as c:
        yield c


async def spawn(store: JobStore, parent: str | None, n: int = 1, **spec: object) -> list[str]:
    """`n` pending jobs spawned by `parent` (None: submitted from outside, or detached)."""
    one = JobSpec(task="noop", payload={}, spawned_by=parent, **spec)  # type: ignore[arg-type]
    return [s.job.id for s in await store.submit_many([one] * n)]


async def run(store: JobStore, ids: list[str]) -> None:
    """These pending jobs claimed: running, held by OWNER."""
    before = datetime.now(UTC) + timedelta(minutes=1)
    got = await store.claim(OWNER, 30, Tagged(ids=ids, tag="t", before=before))
    assert len(got.jobs) == len(ids)


async def complete(store: JobStore, job_id: str) -> None:
    await run(store, [job_id])
    await store.complete_many(OWNER, [(Lease(job_id=job_id, attempt=1), None)])


async def errors(store: JobStore, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    docs = await store.jobs.find({"_id": {"$in": ids}}).to_list()
    return {d["_id"]: (d["status"], (d.get("error") or {}).get("type")) for d in docs}


async def test_cancelling_a_running_parent_cancels_its_tree_and_leaves_a_detached_job(
    store: JobStore, client: AsyncClient
) -> None:
    [root] = await spawn(store, None)
    await run(store, [root])
    a, b = await spawn(store, root, 2)
    [done] = await spawn(store, root)
    await complete(store, done)  # finished: walked through, not changed
    [sleeper] = await spawn(store, root, run_at=datetime.now(UTC) + timedelta(hours=1))
    await run(store, [a])
    a1, a2 = await spawn(store, a, 2)
    [under_done] = await spawn(store, done)
    [detached] = await spawn(store, None)  # `ctx.submit(..., detach=True)` records no parent
    tree = [a, b, sleeper, a1, a2, under_done]
    listed = await client.get(root)
    assert listed.status.value == "running"
    dry = await client.cancel(root, dry_run=True)
    assert dry.spawned_cancelled == 6 and not dry.cancel_requested
    assert {s for s, _ in (await errors(store, tree)).values()} == {"pending", "running"}

    answer = await client.cancel(root)
    assert answer.cancel_requested and answer.spawned_cancelled == 6
    now = await errors(store, [*tree, done, detached])
    assert now[a] == ("running", None)  # asked to stop: its holder stops it
    for job in (b, sleeper, a1, a2, under_done):
        assert now[job] == ("cancelled", "ParentCancelled")
    assert now[done] == ("completed", None) and now[detached] == ("pending", None)
    stopped = await store.cancel_running(Lease(job_id=a, attempt=1), OWNER)
    assert stopped.error == {
        "type": "ParentCancelled",
        "message": f"cancelled with the job that spawned it, {root}",
    }
    assert (await client.cancel(root)).spawned_cancelled == 0  # sent again: nothing more


async def test_a_finished_parent_cancels_what_it_spawned_and_then_answers_409(
    store: JobStore, client: AsyncClient
) -> None:
    [root] = await spawn(store, None)
    await complete(store, root)
    child, other = await spawn(store, root, 2)
    jobs, nxt = await store.list_spawned(root)
    assert {j.id for j in jobs} == {child, other} and nxt is None
    assert all(j.spawned_by == root for j in jobs)
    page, nxt = await store.list_spawned(root, limit=1)
    assert [j.id for j in page] == [max(child, other)] and nxt == page[0].id
    answer = await client.cancel(root)
    assert answer.status.value == "completed" and answer.spawned_cancelled == 2
    with pytest.raises(JobConflict):
        await client.cancel(root, dry_run=True)
    with pytest.raises(JobConflict):
        await client.cancel(root)


async def test_a_propagation_cut_short_is_finished_by_a_dispatchers_sweep(
    store: JobStore, client: AsyncClient, settings: Settings
) -> None:
    [root] = await spawn(store, None)
    kids = await spawn(store, root, 3)
    grandkids = await spawn(store, kids[0], 2)
    # The mark goes in, the root is cancelled, then the first write below it fails: as if
    # the process propagating died there.
    admin = store.db.client
    await fail_commands(admin, "brook-client", ["update"], {"skip": 1}, errorCode=2)
    try:
        with pytest.raises(OperationFailure):
            await client.cancel(root)
    finally:
        await fail_nothing(admin)
    left = await errors(store, [root, *kids, *grandkids])
    assert left[root] == ("cancelled", None)
    assert {left[j] for j in kids + grandkids} == {("pending", None)}
    assert await sweep_spawned(store) == 1
    swept = await errors(store, kids + grandkids)
    assert set(swept.values()) == {("cancelled", "ParentCancelled")}
    assert await sweep_spawned(store) == 0  # the mark is gone


async def test_a_bulk_cancel_reaches_what_the_jobs_it_names_spawned(
    store: JobStore, client: AsyncClient
) -> None:
    roots = await spawn(store, None, 3, key="acme")
    await run(store, roots[:1])
    kids = [k for r in roots for k in await spawn(store, r, 2)]
    [grandkid] = await spawn(store, kids[0])
    [other] = await spawn(store, None, key="globex")
    body = {"key": "acme"}
    dry = await client.bulk_counts("cancel", {**body, "dry_run": True})
    assert (dry.count, dry.spawned_cancelled) == (3, 7)
    done = await client.bulk_counts("cancel", body)
    assert (done.count, done.spawned_cancelled) == (3, 7)
    now = await errors(store, [*kids, grandkid, other])
    assert {now[k] for k in [*kids, grandkid]} == {("cancelled", "ParentCancelled")}
    assert now[other] == ("pending", None)
    again = await client.bulk_counts("cancel", body)
    assert (again.count, again.spawned_cancelled) == (0, 0)
    # The root still running keeps its mark until it ends (the sweep passes it by).
    assert await sweep_spawned(store) == 0
    assert [d["_id"] for d in await store.jobs.find({"spawn_cancel": True}).to_list()] == [roots[0]]
