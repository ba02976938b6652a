"""A claim's answer that comes back late, and a newer attempt of a job this dispatcher still
holds: a real dispatcher in process, on the test replica set, with a runner whose tasks end
when the test says so (`tests/integration/test_prefetch.py`). Neither may start a task where
another attempt of its job may run.

Seen in a compose fault run (a dispatcher cut off from the network, then let back): the
answer to a claim came back 15 s after the server applied it, long after the lease had run
out and another dispatcher's watchdog had requeued the job; the same dispatcher then claimed
the job again (attempt 2) and ran both attempts side by side for 8 s."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from structlog.testing import capture_logs

from brook.common.domain.models import JobSpec
from brook.common.protocol.runner import Outcome, ReservedWorker, RunJob
from brook.common.runtime.settings import Settings
from brook.common.store.jobs import Claimed, JobStore
from brook.common.store.records import ExpiredLease
from tests.integration.test_prefetch import HeldRunner, count_is, dispatcher, wait_for


class OverlapRunner(HeldRunner):
    """A HeldRunner that records every attempt it starts, and any start of a job whose
    earlier attempt it still runs."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.attempts: list[tuple[str, int]] = []
        self.overlaps: list[tuple[str, int]] = []

    async def run(self, reserved: ReservedWorker, job: RunJob, timeout: float | None) -> Outcome:
        if job.job_id in self.running:
            self.overlaps.append((job.job_id, job.attempt))
        self.attempts.append((job.job_id, job.attempt))
        return await super().run(reserved, job, timeout)


async def test_a_claim_answered_after_its_lease_ran_out_starts_nothing(
    settings: Settings, store: JobStore
) -> None:
    settings = settings.model_copy(update={"lease_seconds": 2.0, "sweep_seconds": 0.5})
    runner = OverlapRunner(2)
    runner.auto = True
    claim = store.claim
    late: list[str] = []

    async def answered_late(*args: Any, **kwargs: Any) -> Claimed:
        claimed = await claim(*args, **kwargs)
        if claimed.jobs and not late:
            # Applied by the server, its answer held back past the lease (a partition).
            late.append(claimed.jobs[0].id)
            await asyncio.sleep(settings.lease_seconds + 0.5)
        return claimed

    store.claim = answered_late  # type: ignore[method-assign]
    with capture_logs() as logs:
        async with dispatcher(settings, store, runner):
            job_id = (await store.submit(JobSpec(task="noop", payload={}))).job.id
            await wait_for(
                lambda: count_is(store, {"_id": job_id, "status": "completed"}, 1), timeout=20
            )
    assert late == [job_id]
    # Attempt 1 never started; the watchdog requeued it and attempt 2 ran, once.
    assert runner.attempts == [(job_id, 2)]
    fenced = [e for e in logs if e["event"] == "lease.self_fenced"]
    assert [(e["job_id"], e["attempt"]) for e in fenced] == [(job_id, 1)]
    doc = await store.get(job_id)
    assert doc.attempts == 2


async def test_a_newer_attempt_of_a_job_still_running_here_starts_once_the_older_is_stopped(
    settings: Settings, store: JobStore
) -> None:
    runner = OverlapRunner(2)
    async with dispatcher(settings, store, runner):
        job_id = (await store.submit(JobSpec(task="noop", payload={}))).job.id
        await wait_for(lambda: (job_id, 1) in runner.attempts)
        # As another dispatcher's watchdog would, once this one's lease looked over (it
        # froze past it, say): the job goes back to pending while attempt 1 still runs
        # here. This dispatcher hears of it and claims attempt 2 at once.
        past = datetime.now(UTC) - timedelta(seconds=1)
        await store.jobs.update_one({"_id": job_id}, {"$set": {"lease_expires_at": past}})
        doc = await store.get(job_id)
        assert doc.owner is not None
        await store.requeue_expired(
            ExpiredLease(job_id=job_id, attempt=1, task="noop", owner=doc.owner), 0.0
        )
        await wait_for(lambda: (job_id, 2) in runner.attempts)
        runner.finish(job_id)
        await wait_for(lambda: count_is(store, {"_id": job_id, "status": "completed"}, 1))
    assert runner.overlaps == []
    assert runner.attempts == [(job_id, 1), (job_id, 2)]
    assert (await store.get(job_id)).attempts == 2
