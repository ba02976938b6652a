"""A quota's hold-backs in the job store, on the real replica set: what a job held back
again and again tells in its history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

from brook.common.domain.models import JobSpec
from brook.common.domain.status import TRANSITIONS, JobStatus
from brook.common.store.jobs import JobStore, Lease
from brook.common.store.quotas import QuotaStore

OWNER = "d1"


async def claim_and_hold(store: JobStore, quotas: QuotaStore, name: str) -> None:
    job = (await store.claim(OWNER, 30)).job
    assert job is not None
    due = datetime.now(UTC) - timedelta(seconds=1)  # due again at once
    held = await quotas.hold_back(
        Lease(job_id=job.id, attempt=job.attempts), OWNER, name, "units", due
    )
    assert held


async def test_a_job_held_back_again_and_again_has_one_history_entry_for_it(
    store: JobStore,
) -> None:
    quotas = QuotaStore(store.db)
    [sent] = await store.submit_many([JobSpec(task="noop", payload={})])
    for _ in range(5):
        await claim_and_hold(store, quotas, "model")
    await claim_and_hold(store, quotas, "other")
    await claim_and_hold(store, quotas, "model")
    started = (await store.claim(OWNER, 30)).job
    assert started is not None and started.attempts == 1
    doc = await store.jobs.find_one({"_id": sent.job.id})
    assert doc is not None
    story = [(h["status"], h.get("quota"), h.get("holds")) for h in doc["history"]]
    # Each claim a quota held back and its hold are in the history, but the repeats of one
    # quota in a row are counted on the first hold: five holds, two entries.
    assert story == [
        ("pending", None, None),
        ("running", None, None),
        ("pending", "model", 5),
        ("running", None, None),
        ("pending", "other", None),
        ("running", None, None),
        ("pending", "model", None),
        ("running", None, None),
    ]
    counted = doc["history"][2]
    assert counted["last_at"] > counted["at"] and counted["attempt"] == 1
    assert not doc.get("history_truncated")
    statuses = [JobStatus(h["status"]) for h in doc["history"]]
    assert all(step in TRANSITIONS for step in pairwise(statuses))  # one state change each
