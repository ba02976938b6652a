"""Prometheus text for `/metrics`, and the middleware that counts responses."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingest.state import RequestCounts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestCounter:
    """Counts responses by method, route and status (pure ASGI: no per-request task)."""

    def __init__(self, app: ASGIApp, counts: RequestCounts) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the client sees if the app raises before it responds

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.counts[(scope["method"], path, status)] += 1


def render(jobs_by_status: Mapping[str, int], requests: RequestCounts, up_seconds: float) -> str:
    lines = ["# HELP brook_jobs Jobs by status.", "# TYPE brook_jobs gauge"]
    lines += [f'brook_jobs{{status="{s}"}} {n}' for s, n in jobs_by_status.items()]
    lines += [
        "# HELP brook_api_requests_total HTTP requests served.",
        "# TYPE brook_api_requests_total counter",
    ]
    lines += [
        f'brook_api_requests_total{{method="{method}",route="{path}",code="{code}"}} {n}'
        for (method, path, code), n in sorted(requests.items())
    ]
    lines += [
        "# HELP brook_api_up_seconds Seconds since the process started.",
        "# TYPE brook_api_up_seconds gauge",
        f"brook_api_up_seconds {up_seconds:.3f}",
    ]
    return "\n".join(lines) + "\n"
