"""The API's Prometheus metrics (prometheus-client), and the middleware that counts responses.

`/metrics` shows this app's registry (requests, uptime, SSE clients, jobs by queue and
status) followed by the process-wide one (`common.metrics`: change-stream resumes and
history losses, plus the process and GC collectors). Jobs by queue and status come from
one aggregation, cached for `BROOK_METRICS_CACHE_SECONDS`; concurrent scrapes (and
dashboards) share the aggregation in flight, so a scrape never costs more than one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.models import DEFAULT_QUEUE
from common.status import JobStatus
from common.store import JobStore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Depth = dict[str, dict[str, int]]  # queue → status → jobs

SSE_DROPPED = Counter("brook_sse_dropped", "SSE clients dropped for falling too far behind.")
SSE_RESETS = Counter(
    "brook_sse_resets", "SSE clients told their Last-Event-ID is no longer in the oplog."
)
SSE_CATCH_UPS = Counter(
    "brook_sse_catch_ups", "SSE resumes older than memory, read by a short-lived change stream."
)


class DepthCache:
    """Jobs by queue and status: one aggregation at most per `ttl` seconds, shared."""

    def __init__(
        self, store: JobStore, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self.latest: Depth = {}
        self.aggregations = 0  # how many were run (tests and the curious)
        self._at = -float("inf")
        self._inflight: asyncio.Future[Depth] | None = None

    async def get(self) -> Depth:
        if self.clock() - self._at < self.ttl:
            return self.latest
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._load())
        return await asyncio.shield(self._inflight)

    async def _load(self) -> Depth:
        try:
            self.aggregations += 1
            counts = await self.store.count_by_queue()
            self.latest, self._at = counts, self.clock()
            return counts
        finally:
            self._inflight = None


class _DepthCollector(Collector):
    def __init__(self, metrics: ApiMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "brook_queue_depth", "Jobs by queue and status.", labels=["queue", "status"]
        )
        depth = self.metrics.depth
        statuses = {s.value for s in JobStatus}.union(*depth.values())
        for queue in sorted({DEFAULT_QUEUE, *depth}):
            for status in sorted(statuses):
                family.add_metric([queue, status], depth.get(queue, {}).get(status, 0))
        yield family


class ApiMetrics:
    """This app's registry (one per app, so several apps may live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "brook_api_requests",
            "HTTP requests served, by method, route and status code.",
            ["method", "route", "code"],
            registry=self.registry,
        )
        started = time.monotonic()
        Gauge(
            "brook_api_up_seconds", "Seconds since the process started.", registry=self.registry
        ).set_function(lambda: time.monotonic() - started)
        self.sse_clients = Gauge(
            "brook_sse_clients", "Open event-stream clients.", registry=self.registry
        )
        self.depth: Depth = {}
        self.registry.register(_DepthCollector(self))

    def render(self, depth: Depth) -> bytes:
        self.depth = depth
        return generate_latest(self.registry) + generate_latest(REGISTRY)


class RequestCounter:
    """Counts responses by method, route and status (pure ASGI: no per-request task)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

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
            self.metrics.requests.labels(scope["method"], path, str(status)).inc()
