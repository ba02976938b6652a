"""Debounce in the jobs store on the real replica set: racing submits of one key become one
job with the latest payload, due once quiet and never later than the longest wait; a job
already claimed is left alone and the next submit starts a new one."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from common.domain.models import JobSpec
from common.store.jobs import JobStore


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
    claimed = await store.claim("d1", 30, tasks={"noop"})
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
