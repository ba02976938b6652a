"""Operations: `/healthz` and `/readyz` (always open), `/metrics` (behind the token)."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from common.db import ping
from ingest.deps import State
from ingest.errors import RETRY_AFTER_S
from ingest.metrics import CONTENT_TYPE, render

READY_TIMEOUT_S = 2.0

probes = APIRouter(tags=["ops"])
router = APIRouter(tags=["ops"])


@probes.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@probes.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    """`200` only while a primary answers."""
    if await ping(state.client, READY_TIMEOUT_S):
        return JSONResponse({"status": "ready"})
    return JSONResponse(
        {"status": "no primary"}, status_code=503, headers={"Retry-After": RETRY_AFTER_S}
    )


@router.get("/metrics")
async def metrics(state: State) -> PlainTextResponse:
    """Prometheus text: jobs by status (counted in the background, `ingest.counts`),
    requests by route and code, uptime."""
    text = render(
        await state.counts.by_status(), state.requests, time.monotonic() - state.started
    )
    return PlainTextResponse(text, media_type=CONTENT_TYPE)
