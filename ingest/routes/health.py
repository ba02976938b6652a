"""Health: `/healthz` and `/readyz` (always open), `/metrics` (behind the token)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from brook.common.store.db import ping
from brook.ingest.deps import State
from brook.ingest.errors import RETRY_AFTER_S
from brook.ingest.metrics import CONTENT_TYPE

READY_TIMEOUT_S = 2.0

probes = APIRouter(tags=["health"])
router = APIRouter(tags=["health"])


@probes.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


_NO_PRIMARY = {
    "description": "No primary reachable; retry after `Retry-After` seconds.",
    "headers": {"Retry-After": {"schema": {"type": "string"}}},
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"status": {"type": "string"}}}
        }
    },
}


@probes.get("/readyz", responses={503: _NO_PRIMARY})
async def readyz(state: State) -> JSONResponse:
    """`200` only while a primary answers."""
    if await ping(state.client, READY_TIMEOUT_S):
        return JSONResponse({"status": "ready"})
    return JSONResponse(
        {"status": "no primary"}, status_code=503, headers={"Retry-After": RETRY_AFTER_S}
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics(state: State) -> Response:
    """Prometheus text: jobs by queue and status (one aggregation kept in memory, refreshed
    in the background), requests by route and code, event-stream clients, change-stream
    resumes, uptime; units counted per quota (`brook_quota_units_total`, from the quotas'
    ledger: every start's estimate and every correction by reported usage)."""
    state.metrics.quota_units = await state.core.quota_units()
    return Response(state.metrics.render(await state.depth.get()), media_type=CONTENT_TYPE)
