"""Submit, read, list and cancel jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import JSONResponse

from common.errors import JobConflict, JobNotFound
from common.events import Event, emit, job_fields
from common.models import JobSpec
from common.status import JobStatus
from ingest.deps import State, Store, submit_body
from ingest.encoding import job_response, json_response
from ingest.validation import SubmitJob

router = APIRouter(tags=["jobs"])

# The body is read by hand (size limit first, then depth, then parsing); its schema is
# declared here so the OpenAPI document still shows it.
_SUBMIT_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": SubmitJob.model_json_schema()}},
    }
}


@router.post("/jobs", status_code=202, openapi_extra=_SUBMIT_OPENAPI)
async def submit(body: Annotated[SubmitJob, Depends(submit_body)], state: State) -> JSONResponse:
    """Submit a job. `202` with the new job, or `200` with the job an idempotency key names."""
    spec = JobSpec(
        task=body.task,
        payload=body.payload,
        priority=body.priority,
        run_at=body.run_at,
        max_attempts=body.max_attempts,
        timeout_s=body.timeout_s,
        idempotency_key=body.idempotency_key,
    )
    submitted = await state.submits.submit(spec)
    job = submitted.job
    headers = {"Location": f"/jobs/{job.id}"}
    if not submitted.created:
        emit(Event.JOB_DEDUPLICATED, **job_fields(job), idempotency_key=body.idempotency_key)
        return job_response(job, 200, headers)
    emit(
        Event.JOB_SUBMITTED,
        **job_fields(job),
        priority=job.priority,
        run_at=job.run_at.isoformat(),
        max_attempts=job.max_attempts,
    )
    return job_response(job, 202, headers)


@router.get("/jobs/{job_id}")
async def get_job(job_id: str, store: Store) -> JSONResponse:
    try:
        return job_response(await store.get(job_id))
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None


@router.get("/jobs")
async def list_jobs(
    store: Store,
    status: JobStatus | None = None,
    task: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> JSONResponse:
    """Jobs newest first; pass `next` back as `after` for the following page."""
    jobs, nxt = await store.list_jobs(status=status, task=task, limit=limit, after=after)
    return json_response({"jobs": [j.to_api() for j in jobs], "next": nxt})


@router.post("/jobs/{job_id}/cancel")
async def cancel(job_id: str, store: Store) -> JSONResponse:
    """Pending → cancelled at once; running → its worker is stopped, then cancelled."""
    try:
        job = await store.cancel(job_id)
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    except JobConflict as exc:
        raise HTTPException(409, str(exc)) from None
    event = Event.JOB_CANCELLED if job.status == JobStatus.CANCELLED else Event.JOB_CANCEL_REQUESTED
    emit(event, **job_fields(job), by="api")
    return job_response(job)
