"""The HTTP API: submit, read, list and cancel jobs; health, readiness and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from bson import ObjectId
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pymongo.errors import PyMongoError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.batching import GroupCommit
from common.db import database, make_client
from common.errors import JobConflict, JobNotFound
from common.events import Event, emit, job_fields
from common.models import Job, JobSpec
from common.settings import Settings
from common.status import JobStatus
from common.store import JobStore, Submitted
from ingest.validation import InvalidInput, SubmitJob, parse_submit

RETRY_AFTER_S = "2"
CLOSE_TIMEOUT_S = 1.0


class BodyTooLarge(Exception):
    pass


class RequestCounter:
    """Counts responses by method, route and status (pure ASGI: no per-request task)."""

    def __init__(self, app: ASGIApp, counts: Counter[tuple[str, str, int]]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.counts[(scope["method"], path, status["code"])] += 1


def _json(job: Job, status_code: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        jsonable_encoder(job.to_api(), custom_encoder={ObjectId: str, bytes: lambda b: b.hex()}),
        status_code=status_code,
        headers=headers,
    )


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _submit_batch(store: JobStore, specs: Sequence[JobSpec]) -> list[Submitted]:
    if len(specs) == 1:
        return [await store.submit(specs[0])]  # one round trip: the upsert returns the job
    return await store.submit_many(specs)


def create_app(settings: Settings, known_tasks: set[str]) -> FastAPI:  # noqa: C901 - routes are closures over one app's state
    state: dict[str, Any] = {}
    requests: Counter[tuple[str, str, int]] = Counter()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        client = make_client(
            settings,
            appname="brook-api",
            serverSelectionTimeoutMS=min(settings.server_selection_timeout_ms, 5000),
        )
        store = JobStore(database(client, settings))
        state["client"] = client
        state["store"] = store
        state["submits"] = GroupCommit(lambda specs: _submit_batch(store, specs))
        try:
            await asyncio.wait_for(store.ensure_indexes(), 30)
        except (PyMongoError, TimeoutError) as exc:
            # The API still starts: /readyz says 503 until a primary is reachable.
            emit(
                Event.MONGO_UNAVAILABLE, level="warning", op="ensure_indexes", error=str(exc)[:200]
            )
        emit(
            Event.API_STARTED,
            host=settings.api_host,
            port=settings.api_port,
            tasks=sorted(known_tasks),
            auth=settings.api_token is not None,
        )
        try:
            yield
        finally:
            # Closing ends the server sessions; an unreachable MongoDB must not stop the exit.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)

    app = FastAPI(
        title="Brook",
        version="0.1.0",
        lifespan=lifespan,
        description="Event-driven job engine on MongoDB.",
    )

    def store() -> JobStore:
        s: JobStore = state["store"]
        return s

    async def auth(request: Request) -> None:
        if settings.api_token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        expected = settings.api_token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise HTTPException(
                401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )

    app.add_middleware(RequestCounter, counts=requests)

    @app.exception_handler(PyMongoError)
    async def mongo_down(_: Request, exc: PyMongoError) -> JSONResponse:
        emit(Event.MONGO_UNAVAILABLE, level="warning", op="api", error=str(exc)[:200])
        return JSONResponse(
            {"detail": "database unavailable (no primary); retry shortly"},
            status_code=503,
            headers={"Retry-After": RETRY_AFTER_S},
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
            for e in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    protected = [Depends(auth)]
    submit_schema = SubmitJob.model_json_schema()

    @app.post(
        "/jobs",
        status_code=202,
        dependencies=protected,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": submit_schema}},
            }
        },
    )
    async def submit(request: Request) -> JSONResponse:
        """Submit a job. `202` with the new job, or `200` with the job an idempotency key names."""
        try:
            raw = await _read_body(request, settings.max_body_bytes)
        except BodyTooLarge:
            return JSONResponse(
                {"detail": f"body larger than {settings.max_body_bytes} bytes"}, status_code=413
            )
        try:
            body = parse_submit(raw)
        except InvalidInput as exc:
            return JSONResponse({"detail": exc.detail}, status_code=422)
        if body.task not in known_tasks:
            return JSONResponse(
                {
                    "detail": f"unknown task {body.task!r}; known tasks: "
                    f"{', '.join(sorted(known_tasks)) or '(none)'}"
                },
                status_code=422,
            )
        spec = JobSpec(
            task=body.task,
            payload=body.payload,
            priority=body.priority,
            run_at=body.run_at,
            max_attempts=body.max_attempts,
            timeout_s=body.timeout_s,
            idempotency_key=body.idempotency_key,
        )
        # Concurrent submits share one majority write (group commit).
        submitted: Submitted = await state["submits"].submit(spec)
        job = submitted.job
        headers = {"Location": f"/jobs/{job.id}"}
        if not submitted.created:
            emit(Event.JOB_DEDUPLICATED, **job_fields(job), idempotency_key=body.idempotency_key)
            return _json(job, 200, headers)
        emit(
            Event.JOB_SUBMITTED,
            **job_fields(job),
            priority=job.priority,
            run_at=job.run_at.isoformat(),
            max_attempts=job.max_attempts,
        )
        return _json(job, 202, headers)

    @app.get("/jobs/{job_id}", dependencies=protected)
    async def get_job(job_id: str) -> JSONResponse:
        try:
            return _json(await store().get(job_id))
        except JobNotFound:
            raise HTTPException(404, f"no job {job_id}") from None

    @app.get("/jobs", dependencies=protected)
    async def list_jobs(
        status: JobStatus | None = None,
        task: str | None = Query(default=None, max_length=200),
        limit: int = Query(default=50, ge=1, le=500),
        after: str | None = Query(default=None, max_length=64),
    ) -> JSONResponse:
        """Jobs newest first; pass `next` back as `after` for the following page."""
        jobs, nxt = await store().list_jobs(status=status, task=task, limit=limit, after=after)
        return JSONResponse(
            jsonable_encoder(
                {"jobs": [j.to_api() for j in jobs], "next": nxt},
                custom_encoder={ObjectId: str, bytes: lambda b: b.hex()},
            )
        )

    @app.post("/jobs/{job_id}/cancel", dependencies=protected)
    async def cancel(job_id: str) -> JSONResponse:
        """Pending → cancelled at once; running → its worker is stopped, then cancelled."""
        try:
            job = await store().cancel(job_id)
        except JobNotFound:
            raise HTTPException(404, f"no job {job_id}") from None
        except JobConflict as exc:
            raise HTTPException(409, str(exc)) from None
        if job.status == JobStatus.CANCELLED:
            emit(Event.JOB_CANCELLED, **job_fields(job), by="api")
        else:
            emit(Event.JOB_CANCEL_REQUESTED, **job_fields(job), by="api")
        return _json(job)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        try:
            hello = await asyncio.wait_for(state["client"].admin.command("ping"), 2.0)
            ok = bool(hello.get("ok"))
        except (PyMongoError, TimeoutError):
            ok = False
        if ok:
            return JSONResponse({"status": "ready"})
        return JSONResponse(
            {"status": "no primary"}, status_code=503, headers={"Retry-After": RETRY_AFTER_S}
        )

    @app.get("/metrics", dependencies=protected)
    async def metrics() -> PlainTextResponse:
        lines = ["# HELP brook_jobs Jobs by status.", "# TYPE brook_jobs gauge"]
        for status, count in (await store().count_by_status()).items():
            lines.append(f'brook_jobs{{status="{status}"}} {count}')
        lines += [
            "# HELP brook_api_requests_total HTTP requests served.",
            "# TYPE brook_api_requests_total counter",
        ]
        for (method, path, code), n in sorted(requests.items()):
            lines.append(
                f'brook_api_requests_total{{method="{method}",route="{path}",code="{code}"}} {n}'
            )
        lines += [
            "# HELP brook_api_up_seconds Seconds since the process started.",
            "# TYPE brook_api_up_seconds gauge",
            f"brook_api_up_seconds {time.monotonic() - started:.3f}",
        ]
        return PlainTextResponse(
            "\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    started = time.monotonic()
    return app
