"""One bad record stops no dispatcher loop: jobs written by hand into Brook's own `jobs`
collection (outside the API and the Python client, which never write such fields) are
passed over by the change stream's wake-ups and by the watchdog's sweep, logged, and the
dispatcher goes on. (A trigger's poison changes: tests/e2e/test_triggers.py.)"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from brook.common.domain.models import JobSpec
from brook.common.store.jobs import JobStore
from tests.e2e.conftest import Cluster
from tests.support.poison import YEAR_10000

LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


def by_hand(job_id: str, **fields: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"_id": job_id, "status": "pending", "queue": "default", "priority": 0,
            "attempts": 0, "max_attempts": 3, "run_at": now, "created_at": now} | fields  # fmt: skip


async def completed(store: JobStore, job_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (doc := await store.jobs.find_one({"_id": job_id})) is None or doc["status"] not in (
        "completed",
        "failed",
    ):
        assert time.monotonic() < deadline, doc
        await asyncio.sleep(0.1)
    return doc


async def test_jobs_written_by_hand_with_odd_fields_stop_neither_the_stream_nor_the_sweep(
    cluster: Cluster, store: JobStore
) -> None:
    disp = cluster.dispatcher()
    disp.wait_for_event("dispatcher.ready", timeout=30)
    await store.jobs.insert_many(
        [
            # Wake-ups the stream cannot use: a task that is no name, a due time past year
            # 9999 (read as a `bson.DatetimeMS`).
            by_hand("odd-task", task={"odd": 1}),
            by_hand("far-run-at", task="noop", run_at=YEAR_10000),
            # Expired leases the sweep cannot requeue as they are: no holder; and one whose
            # requeued job has no `created_at` to read back.
            by_hand("no-owner", task="noop", status="running", lease_expires_at=LONG_AGO),
            {
                k: v
                for k, v in by_hand(
                    "no-created-at",
                    task="no-such-task",
                    status="running",
                    owner="ghost:1:abc",
                    attempts=1,
                    lease_expires_at=LONG_AGO,
                ).items()
                if k != "created_at"
            },
        ]
    )
    skipped = disp.wait_for_event("sweep.skipped", timeout=30)
    assert skipped["job_id"] == "no-created-at" and "KeyError" in skipped["error"]
    [odd] = disp.events("stream.change_skipped")
    assert odd["job_id"] == "odd-task" and odd["level"] == "error"
    # Two sweeps later, the dispatcher is the same process, and runs jobs as ever.
    await asyncio.sleep(2.5)
    submitted = await store.submit(JobSpec(task="noop", payload={}))
    done = await completed(store, submitted.job.id)
    assert done["status"] == "completed"
    assert disp.proc.poll() is None
    assert not disp.events("dispatcher.crashed") and not disp.events("background.crashed")
    far = await store.jobs.find_one({"_id": "far-run-at"})
    assert far is not None and far["status"] == "pending"  # never due
    requeued = await store.jobs.find_one({"_id": "no-created-at"})
    assert requeued is not None and requeued["status"] == "pending"  # the write went through


async def test_a_claim_that_takes_a_job_it_cannot_read_fails_that_job_and_goes_on(
    cluster: Cluster, store: JobStore
) -> None:
    # Pending jobs of a task the dispatcher runs, due, with fields Brook never writes: a due
    # time that is text (it sorts before every date: due at once), a priority that is text,
    # no creation time. Each is claimed (alone, or with the good ones around it) and, unread,
    # would take the claim loop down with it, on every dispatcher in turn.
    disp = cluster.dispatcher()
    disp.wait_for_event("dispatcher.ready", timeout=30)
    good = [await store.submit(JobSpec(task="noop", payload={"n": n})) for n in range(3)]
    await store.jobs.insert_many(
        [
            by_hand("text-run-at", task="noop", run_at="soon"),
            by_hand("text-priority", task="noop", priority="high"),
            {k: v for k, v in by_hand("no-created", task="noop").items() if k != "created_at"},
        ]
    )
    more = [await store.submit(JobSpec(task="noop", payload={"n": n})) for n in range(3, 6)]
    for s in good + more:
        assert (await completed(store, s.job.id))["status"] == "completed"
    for job_id in ("text-run-at", "text-priority", "no-created"):
        doc = await completed(store, job_id)
        assert doc["status"] == "failed" and doc["error"]["type"] == "UnreadableJob", doc
        assert doc["attempts"] == 1 and doc["owner"] is None
    said = {e["job_id"] for e in disp.events("claim.unreadable")}
    assert said == {"text-run-at", "text-priority", "no-created"}
    assert disp.proc.poll() is None
    assert not disp.events("dispatcher.crashed") and not disp.events("background.crashed")
