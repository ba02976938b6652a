"""Submit (one or a batch), read, list, cancel, retry and rerun jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import JSONResponse

from brook.common.domain.bulk import BulkBody
from brook.common.domain.errors import JobConflict, JobNotFound
from brook.common.domain.instants import Instant
from brook.common.domain.models import QUEUE_NAME, JobSpec
from brook.common.domain.reruns import RerunBody, validate_rerun
from brook.common.domain.status import JobStatus
from brook.common.domain.validation import MAX_BATCH, spec_schema
from brook.ingest.deps import Core, Store, batch_body, json_body, submit_body
from brook.ingest.encoding import job_response, json_response
from brook.ingest.fields import INCLUDABLE, INCLUDE_PATTERN, parse_include

router = APIRouter(tags=["jobs"])

# What a job id is (an ObjectId's hex), as the document says of `after`: any other text is
# a `422`.
JOB_ID_PATTERN = r"^[0-9a-fA-F]{24}$"

# Bodies are read by hand (size limit first, then depth, then parsing); their schemas are
# declared here so the OpenAPI document still shows them.
_SPEC_SCHEMA = spec_schema()
_SUBMIT_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": _SPEC_SCHEMA}},
    }
}
_BATCH_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "title": "SubmitBatch",
                    "type": "object",
                    "properties": {
                        "jobs": {
                            "type": "array",
                            "items": _SPEC_SCHEMA,
                            "minItems": 1,
                            "maxItems": MAX_BATCH,
                        }
                    },
                    "required": ["jobs"],
                    "additionalProperties": False,
                }
            }
        },
    }
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "no job has this id"},
    409: {"description": "the job's state does not allow this"},
}


@router.post(
    "/jobs",
    status_code=202,
    openapi_extra=_SUBMIT_OPENAPI,
    responses={
        200: {"description": "the job this `idempotency_key` already names"},
        413: {"description": "body over the limit"},
        422: {"description": "invalid spec or unknown task; nothing stored"},
    },
)
async def submit(spec: Annotated[JobSpec, Depends(submit_body)], core: Core) -> JSONResponse:
    """Submit a job. `202` with the new job, or `200` with the job an idempotency key names
    (within its `unique_for_s` window, if it has one). With `depends_on` (parent job ids)
    it is `waiting` until every parent completed; an unknown parent → `422`."""
    submitted = await core.submit_spec(spec)
    job = submitted.job
    headers = {"Location": f"/jobs/{job.id}"}
    return job_response(job, 202 if submitted.created else 200, headers)


@router.post(
    "/jobs/batch",
    status_code=202,
    openapi_extra=_BATCH_OPENAPI,
    responses={
        413: {"description": "body over the limit"},
        422: {"description": "a spec is invalid (`loc` names its index); nothing stored"},
    },
)
async def submit_batch(
    specs: Annotated[list[JobSpec], Depends(batch_body)], core: Core
) -> JSONResponse:
    """Submit up to 1,000 jobs in one write: `202 {"jobs": [...]}` in spec order. All or
    nothing: one invalid spec (or unknown task) → `422` naming its index, and nothing is
    stored. A spec whose idempotency key is taken gets the job holding it. Specs may depend
    on each other by `ref` (a whole DAG); a cycle or an unknown parent → `422`."""
    submitted = await core.submit_specs(specs)
    return json_response({"jobs": [s.job.to_api() for s in submitted]}, 202)


_BULK_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": BulkBody.model_json_schema()}},
    }
}
_BULK_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"description": "body over the limit"},
    422: {"description": "a bad filter, or none; nothing changed"},
}


@router.post("/jobs/retry", openapi_extra=_BULK_OPENAPI, responses=_BULK_ERRORS)
async def retry_many(body: Annotated[object, Depends(json_body)], core: Core) -> JSONResponse:
    """Retry every failed or cancelled job the filter names (`status`, `task`, `queue`,
    `key`, `error_type`, `created_since`/`created_until`, `finished_since`/`finished_until`),
    in pages: `{"count": n}`, the jobs retried (with `dry_run: true`, the jobs it would
    retry, changing nothing). Sent again, it retries nothing more."""
    return json_response({"count": await core.bulk("retry", body)})


@router.post("/jobs/cancel", openapi_extra=_BULK_OPENAPI, responses=_BULK_ERRORS)
async def cancel_many(body: Annotated[object, Depends(json_body)], core: Core) -> JSONResponse:
    """Cancel every waiting or pending job the filter names and ask the running ones to
    stop (the filter as for `POST /jobs/retry`): `{"count": n, "spawned_cancelled": m}`,
    the jobs changed (with `dry_run: true`, that would be), and below them the unfinished
    jobs they spawned (`ctx.submit`), cancelled down the tree with `ParentCancelled`. Sent
    again, it changes nothing more."""
    done = await core.bulk_counts("cancel", body)
    return json_response({"count": done.count, "spawned_cancelled": done.spawned_cancelled})


@router.get("/jobs/{job_id}", responses=_ERRORS)
async def get_job(job_id: str, store: Store) -> JSONResponse:
    try:
        return job_response(await store.get(job_id))
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None


_LIST_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "`include` names a field a listing cannot carry"},
    422: {
        "description": "a bad filter, or a search too broad to finish within"
        " `BROOK_QUERY_MAX_MS` (`code` `search_too_broad`)"
    },
}


@router.get("/jobs", responses=_LIST_ERRORS)
async def list_jobs(
    store: Store,
    status: JobStatus | None = None,
    task: Annotated[str | None, Query(max_length=200)] = None,
    queue: Annotated[str | None, Query(pattern=QUEUE_NAME)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: Annotated[
        str | None, Query(max_length=64, json_schema_extra={"pattern": JOB_ID_PATTERN})
    ] = None,
    key: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    error: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    since: Instant | None = None,
    until: Instant | None = None,
    include: Annotated[
        str | None, Query(max_length=100, json_schema_extra={"pattern": INCLUDE_PATTERN})
    ] = None,
    spawned_by: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> JSONResponse:
    """Jobs newest first, without `payload` and `result` unless `include` names them
    (`include=payload,result`); pass `next` back as `after` for the following page.
    Search by `key`, `error` (the start of the error's type, case-sensitive) and
    `since`/`until` (created at or after / before, ISO-8601). A search that cannot finish
    within `BROOK_QUERY_MAX_MS` → `422` `search_too_broad`. `spawned_by`: the jobs that
    job's task submitted with `ctx.submit`, with any of the other filters."""
    wanted = parse_include(include)
    left_out = sorted(INCLUDABLE - wanted)
    if spawned_by is not None:
        given = {"status": status.value if status else None, "task": task, "queue": queue}
        given["key"] = key  # with the others: `key` is an equality too
        filters = {k: v for k, v in given.items() if v is not None}
        jobs, nxt = await store.list_spawned(
            spawned_by,
            filters=filters,
            limit=limit,
            after=after,
            error=error,
            since=since,
            until=until,
        )
        page = [_without(j.to_api(), left_out) for j in jobs]
        return json_response({"jobs": page, "next": nxt})
    jobs, nxt = await store.list_jobs(
        status=status,
        task=task,
        queue=queue,
        limit=limit,
        after=after,
        key=key,
        error=error,
        since=since,
        until=until,
        include=wanted,
    )
    return json_response({"jobs": [_without(j.to_api(), left_out) for j in jobs], "next": nxt})


def _without(job: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    for name in fields:
        del job[name]
    return job


@router.get("/failures", responses={422: _LIST_ERRORS[422]})
async def failures(
    store: Store,
    since: Instant | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JSONResponse:
    """Jobs with an error, grouped by error type and task (the dashboard's failures view):
    `{"groups": [{"error_type", "task", "failed", "retrying", "latest": {"id", "error",
    "at"}}]}`, the most recent groups first; `since`: failed jobs finished at or after.
    Too broad to finish within `BROOK_QUERY_MAX_MS` → `422` `search_too_broad`."""
    groups = await store.failure_groups(since, limit)
    return json_response(
        {
            "groups": [
                {
                    "error_type": g["_id"].get("type"),
                    "task": g["_id"].get("task"),
                    "failed": g["failed"],
                    "retrying": g["retrying"],
                    "latest": g["latest"],
                }
                for g in groups
            ]
        }
    )


@router.post("/jobs/{job_id}/cancel", responses=_ERRORS)
async def cancel(job_id: str, core: Core, dry_run: bool = False) -> JSONResponse:
    """Waiting or pending → cancelled at once (its dependents too, `DependencyFailed`);
    running → its worker is stopped, then cancelled. Every unfinished job it spawned
    (`ctx.submit`), and theirs, is cancelled too (`ParentCancelled`), also for a job that
    had finished: the job, with `spawned_cancelled`, how many. Finished with none left →
    `409`. `?dry_run=true`: the same answer, counting, changing nothing."""
    try:
        return job_response(await core.cancel(job_id, dry_run=dry_run))
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    except JobConflict as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("/jobs/{job_id}/retry", responses=_ERRORS)
async def retry(job_id: str, core: Core) -> JSONResponse:
    """A failed or cancelled job back to `pending`, due now, with its attempt budget renewed
    (`max_attempts` grows by what it was submitted with; `attempts` keeps counting) and its
    history kept. Any other state → `409`. A job with parents that have not all completed
    goes back to `waiting` for them."""
    try:
        return job_response(await core.retry(job_id))
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    except JobConflict as exc:
        raise HTTPException(409, str(exc)) from None


_RERUN_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": RerunBody.model_json_schema()}},
    }
}


@router.post(
    "/jobs/{job_id}/rerun",
    status_code=202,
    openapi_extra=_RERUN_OPENAPI,
    responses={
        404: _ERRORS[404],
        413: {"description": "body over the limit"},
        422: {
            "description": "a job that has not finished, one without steps, an unknown step "
            "or a bad payload; nothing made"
        },
    },
)
async def rerun(
    job_id: str, body: Annotated[object, Depends(json_body)], core: Core
) -> JSONResponse:
    """Rerun a finished job (completed, failed or cancelled) from one of its recorded steps:
    body `{"from_step": "name", "payload": {...}?}`. `202` with a new job of the same task,
    queue, key and payload (or `payload`), which carries the steps recorded before
    `from_step`, with their output, and runs the rest; its `rerun_of` names the job, whose
    `reruns` names it. The idempotency key is not copied. `404` for an unknown job."""
    wanted = validate_rerun(body)
    try:
        job = await core.rerun(job_id, wanted.from_step, payload=wanted.payload)
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    return job_response(job, 202, {"Location": f"/jobs/{job.id}"})
