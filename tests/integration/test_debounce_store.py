"""Debounce in the jobs store on the real replica set: racing submits of one key become one
job with the latest payload, due once quiet and never later than the longest wait; a job
already claimed is left alone and the next submit starts a new one; a claim that read a
job before a submit joined it does not run it with the payload it read."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brook.common.domain.models import Job, JobSpec
from brook.common.runtime.settings import Settings
from brook.common.store.db import database, make_client
from brook.common.store.jobs import BestDue, JobStore, Lease, Tagged
from tests.support.failpoints import fail_nothing


def debounced(
    n: int, key: str = "doc-7", quiet: float = 30, longest: float | None = None
) -> JobSpec:
    return JobSpec(
        task="noop", payload={"n": n}, debounce_key=key, debounce_s=quiet, debounce_max_s=longest
    )


async def test_a_hundred_racing_submits_of_one_key_make_one_job(store: JobStore) -> None:
    await store.ensure_indexes()
    out = await asyncio.gather(*(store.submit(debounced(i)) for i in range(100)))
    assert len({s.job.id for s in out}) == 1
    assert sum(s.created for s in out) == 1
    [doc] = await store.jobs.find({"debounce_key": "doc-7"}).to_list()
    assert doc["debounced"] == 100 and doc["status"] == "pending"
    # The payload of the submit whose write came last (each answer shows the job as its
    # own write left it: the one that saw 100 submits is the latest).
    [last] = [s for s in out if s.job.debounced == 100]
    assert doc["payload"] == last.job.payload
    # Due once quiet for 30 s after the last submit, within the first submit's 300 s.
    assert doc["run_at"] <= doc["debounce_until"]
    assert doc["run_at"] - doc["updated_at"] == timedelta(seconds=30)


async def test_a_debounced_job_runs_no_later_than_its_longest_wait(store: JobStore) -> None:
    await store.ensure_indexes()
    first = await store.submit(debounced(1, quiet=30, longest=30))
    await asyncio.sleep(0.05)
    again = await store.submit(debounced(2, quiet=30, longest=30))
    assert again.job.id == first.job.id and not again.created
    doc = await store.jobs.find_one({"_id": first.job.id})
    assert doc is not None
    assert doc["debounce_until"] - doc["created_at"] == timedelta(seconds=30)
    assert doc["run_at"] == doc["debounce_until"]  # quiet until +30 s would be later
    assert doc["payload"] == {"n": 2}


async def test_a_claimed_debounced_job_is_left_alone_and_the_next_submit_starts_anew(
    store: JobStore,
) -> None:
    await store.ensure_indexes()
    first = await store.submit(debounced(1, quiet=0.01))
    await asyncio.sleep(0.05)
    claimed = (await store.claim("d1", 30, BestDue(tasks={"noop"}))).job
    assert claimed is not None and claimed.id == first.job.id
    second = await store.submit(debounced(2, quiet=0.01))
    assert second.created and second.job.id != first.job.id
    assert (await store.get(first.job.id)).payload == {"n": 1}


async def test_debounced_specs_in_a_batch_join_their_keys_jobs_in_spec_order(
    store: JobStore,
) -> None:
    await store.ensure_indexes()
    plain = JobSpec(task="noop", payload={})
    out = await store.submit_many([debounced(1), plain, debounced(2), debounced(3, key="other")])
    assert out[0].job.id == out[2].job.id and out[2].job.payload == {"n": 2}
    assert out[1].created and out[1].job.debounce_key is None
    assert out[3].job.id not in (out[0].job.id, out[1].job.id)


ClaimAs = Callable[[JobStore], Coroutine[Any, Any, list[Job]]]


async def claim_many(claimer: JobStore) -> list[Job]:
    claimed = await claimer.claim("d1", 30, BestDue(n=2, tasks={"noop"}))
    jobs, _ = claimed.jobs, claimed.dry
    return jobs


async def claim_through_slots(claimer: JobStore) -> list[Job]:
    docs = await claimer.candidates(2, tasks={"noop"}, queue="default")
    ids = [str(d["_id"]) for d in docs]
    until = datetime.now(UTC) + timedelta(minutes=1)
    return (await claimer.claim("d1", 30, Tagged(ids=ids, tag="t1", before=until))).jobs


@pytest.mark.parametrize("claim", [claim_many, claim_through_slots])
async def test_a_submit_that_joins_a_job_a_claim_has_read_is_not_lost_to_that_claim(
    store: JobStore, settings: Settings, claim: ClaimAs
) -> None:
    """A claim of several jobs reads its candidates, then claims them. A debounced submit
    joins one in between (its longest wait over, so it stays due): the job runs with the
    latest payload, not the one read. (A plain batch claim, which uses what it read, leaves
    the job for the next claim; a limited queue's claim reads back what it won.)"""
    await store.ensure_indexes()
    first = await store.submit(debounced(1, quiet=0.01, longest=0.01))
    plain = await store.submit(JobSpec(task="noop", payload={}))
    await asyncio.sleep(0.1)  # both due
    client = make_client(settings, appname="claimer")
    try:
        # The claimer's write waits on the server while the submit joins.
        held = await client.admin.command(
            "configureFailPoint",
            "failCommand",
            mode={"times": 1},
            data={
                "failCommands": ["update"],
                "appName": f"claimer:{os.getpid()}",
                "blockConnection": True,
                "blockTimeMS": 1000,
            },
        )
        claiming = asyncio.create_task(claim(JobStore(database(client, settings))))
        await client.admin.command(
            "waitForFailPoint", "failCommand", timesEntered=held["count"] + 1, maxTimeMS=10_000
        )
        joined = await store.submit(debounced(2, quiet=0.01, longest=0.01))
        assert joined.job.id == first.job.id and not joined.created
        jobs = await claiming
    finally:
        await fail_nothing(client)
        await client.close()
    ran = {j.id: j.payload for j in jobs}
    if first.job.id not in ran:  # left for the next claim
        again = (await store.claim("d2", 30, BestDue(tasks={"noop"}))).job
        assert again is not None
        ran[again.id] = again.payload
    assert ran == {plain.job.id: {}, first.job.id: {"n": 2}}


async def test_a_debounced_job_back_to_pending_leaves_its_key_to_the_job_that_holds_it(
    store: JobStore,
) -> None:
    """Once claimed, a debounced job is no longer the one its key's submits join: an attempt
    that fails and is retried, a job handed back, or one retried by hand after a cancel,
    goes back to pending beside the job its key holds now (each was a DuplicateKeyError
    on `debounce_pending`: in a dispatcher's write, or a 500 from the API), and the key's
    next submit joins that one."""
    await store.ensure_indexes()
    first = await store.submit(debounced(1, quiet=0.01))
    claimed = None
    while claimed is None:  # due 10 ms after its submit
        claimed = (await store.claim("d1", 30, BestDue(tasks={"noop"}))).job
    assert claimed.id == first.job.id
    second = await store.submit(debounced(2))
    assert second.created
    lease = Lease(job_id=claimed.id, attempt=claimed.attempts)
    retried = await store.fail_attempt(lease, "d1", {"type": "E", "message": "m"}, 0.0)
    assert retried.status == "pending"
    again = (await store.claim("d1", 30, BestDue(tasks={"noop"}, n=1))).job
    assert again is not None
    await store.release(Lease(job_id=again.id, attempt=again.attempts), "d1")
    cancelled = await store.submit(debounced(3, key="other"))
    await store.cancel(cancelled.job.id)
    fresh = await store.submit(debounced(4, key="other"))
    assert (await store.retry(cancelled.job.id)).status == "pending"
    # The keys' submits join the jobs that hold them, not the ones back to pending.
    assert (await store.submit(debounced(5))).job.id == second.job.id
    assert (await store.submit(debounced(6, key="other"))).job.id == fresh.job.id
