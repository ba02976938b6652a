"""The dashboard: one server-rendered page and its two assets (all in the package: no CDN,
no build step), and `GET /stats`, the figures it draws.

The page itself is open (a browser cannot send a bearer header when it navigates); it
holds no data. With `BROOK_API_TOKEN` set, it asks for the token once, keeps it in the
tab's `sessionStorage` (never in a URL), and sends it as `Authorization: Bearer` on every
call, event streams included (read with `fetch()`, which can send headers, rather than
`EventSource`, which cannot).
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel

from brook.common.domain.status import JobStatus
from brook.ingest.auth import ADMIN
from brook.ingest.deps import State

pages = APIRouter(include_in_schema=False)
router = APIRouter(tags=["dashboard"])

ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "swagger-init.js": "text/javascript; charset=utf-8",
}
# The page and its assets come from this origin only; its one image is a data: URL.
DASHBOARD_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


@cache
def _asset(name: str) -> str:
    return resources.files("brook.ingest").joinpath("static", name).read_text(encoding="utf-8")


@pages.get("/")
async def dashboard(state: State) -> HTMLResponse:
    page = _asset("index.html")
    fields = {
        "__AUTH__": "1" if state.settings.api_token is not None else "0",
        "__VERSION__": html.escape(str(_version())),
    }
    for marker, value in fields.items():
        page = page.replace(marker, value)
    return HTMLResponse(
        page, headers={"Cache-Control": "no-store", "Content-Security-Policy": DASHBOARD_CSP}
    )


@pages.get("/static/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPException(404, f"no asset {name}")
    return Response(_asset(name), media_type=ASSETS[name])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("brook")
    except PackageNotFoundError:
        return "dev"


class Series(BaseModel):
    """Per `step_s`-second bucket, oldest first, ending at `end` (Unix seconds)."""

    step_s: int
    end: int
    started: list[int]
    completed: list[int]
    failed: list[int]
    cancelled: list[int]
    wait_p50_ms: list[float | None]
    wait_p95_ms: list[float | None]


class Stats(BaseModel):
    counts: dict[str, int]  # by status, all queues
    queues: dict[str, dict[str, int]]  # queue → status → jobs
    series: Series  # throughput and submit→start latency, as this API process saw them
    sse_clients: int
    access: str  # "admin", or "read" for a read-only token (the page then offers no actions)


@router.get("/stats")
async def stats(state: State, request: Request) -> Stats:
    """What the dashboard draws: jobs by status and queue (the same cached aggregation as
    `/metrics`), and the last ten minutes of throughput and submit→start latency."""
    queues = await state.depth.get()
    counts = {s.value: 0 for s in JobStatus}
    for by_status in queues.values():
        for status, n in by_status.items():
            counts[status] = counts.get(status, 0) + n
    return Stats(
        counts=counts,
        queues=queues,
        series=Series(**state.stats.series()),
        sse_clients=state.hub.count(),
        access=getattr(request.state, "access", ADMIN),
    )
