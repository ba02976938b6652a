"""Rerun from a step, written once for the HTTP API (`POST /jobs/{id}/rerun`), the Python
clients (`rerun`) and the CLI (`brook rerun ID --from-step NAME`)."""

from __future__ import annotations

from typing import Any

import structlog

from brook.common.client.task_directory import TaskDirectory
from brook.common.domain.models import Job, JobSpec
from brook.common.domain.reruns import validate_rerun
from brook.common.runtime.log_events import Event, job_fields, log_event, requested_by
from brook.common.store.jobs import JobStore


class Reruns:
    _store: JobStore
    _directory: TaskDirectory

    async def rerun(self, job_id: str, from_step: str, *, payload: Any = None) -> Job:
        """A new job of a finished job's task, queue, key and payload (or `payload`), that
        carries the steps the job recorded before `from_step`, with their output, and runs
        `from_step` and the rest: pending, due now, without the job's idempotency key. Its
        `rerun_of` names the job, whose `reruns` names it. `JobNotFound` for an unknown
        job; `InvalidInput` (the API's 422) for a job that has not finished, one without
        steps, an unknown step, a bad payload, or a task no dispatcher runs."""
        rerun = validate_rerun({"from_step": from_step, "payload": payload})
        source = await self._store.get(job_id)
        await self._directory.check([JobSpec(task=source.task, payload={})], batch=False)
        job = await self._store.rerun(job_id, rerun)
        if structlog.is_configured():
            log_event(
                Event.JOB_RERUN,
                **job_fields(job),
                rerun_of=job_id,
                from_step=rerun.from_step,
                carried=len(job.steps),
                queue=job.queue,
                by=requested_by.get(),
            )
        return job
