"""The API's Prometheus metrics (prometheus-client), and the middleware that counts responses.

`/metrics` shows this app's registry (requests, uptime, SSE clients, jobs by queue and
status) followed by the process-wide one (`brook.common.runtime.metrics`: change-stream resumes and
history losses, plus the process and GC collectors). Jobs by queue and status come from
one aggregation kept in memory and refreshed in the background every
`BROOK_METRICS_CACHE_SECONDS` while requests come (and never more than a tenth of the
time: `DepthCache`); concurrent scrapes (and dashboards) share the aggregation in
flight, so a scrape never costs more than one, and it rarely waits on one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pymongo.errors import PyMongoError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brook.common.domain.models import DEFAULT_QUEUE
from brook.common.domain.status import JobStatus
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.metrics import MAX_QUEUE_LABELS, OTHER_QUEUES
from brook.common.store.jobs import JobStore

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
    """Jobs by queue and status: one aggregation, shared by every request, kept fresh in
    the background while someone asks.

    Counting is linear in the jobs collection (116 ms with 500,000 pending jobs when every
    request ran it), so requests do not wait on it: the first one starts a refresh loop that
    recounts every interval for as long as requests keep coming (until `KEEP_WARM_S` after
    the last), and they are answered from memory. The interval is `ttl`, and at least
    `COST_FACTOR` times what the last aggregation took, so however large the collection
    grows, counting costs MongoDB at most about a tenth of its time, and only while someone
    asks. A request waits for a count only when there is none yet, or the last is older
    than two intervals (the loop had stopped, or MongoDB is slow); with `ttl` 0, always.
    Requests that arrive meanwhile share the count in flight."""

    COST_FACTOR = 10.0
    KEEP_WARM_S = 60.0

    def __init__(
        self, store: JobStore, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self.latest: Depth = {}
        self.aggregations = 0  # how many were run (tests and the curious)
        self._at: float | None = None  # clock() when `latest` was counted
        self._took = 0.0
        self._asked = -float("inf")
        self._inflight: asyncio.Task[Depth] | None = None
        self._warm: asyncio.Task[None] | None = None

    def close(self) -> None:
        """Stop the refresh loop (the API is shutting down)."""
        for task in (self._warm, self._inflight):
            if task is not None:
                task.cancel()

    def interval(self) -> float:
        return max(self.ttl, self.COST_FACTOR * self._took)

    async def get(self) -> Depth:
        self._asked = self.clock()
        if self.ttl == 0:
            return await asyncio.shield(self._refreshing())
        if self._warm is None or self._warm.done():
            self._warm = asyncio.get_running_loop().create_task(self._keep_warm())
        if self._at is None or self.clock() - self._at > 2 * self.interval():
            return await asyncio.shield(self._refreshing())
        return self.latest

    async def _keep_warm(self) -> None:
        while self.clock() - self._asked < self.KEEP_WARM_S:
            with contextlib.suppress(PyMongoError):
                await asyncio.shield(self._refreshing())
            await asyncio.sleep(self.interval())

    def _refreshing(self) -> asyncio.Task[Depth]:
        if self._inflight is None:
            self._inflight = asyncio.get_running_loop().create_task(self._load())
            self._inflight.add_done_callback(self._landed)
        return self._inflight

    def _landed(self, task: asyncio.Task[Depth]) -> None:
        self._inflight = None
        error = None if task.cancelled() else task.exception()
        if error is not None:
            # The last figures stand until MongoDB answers.
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="count", error=str(error)[:200])

    async def _load(self) -> Depth:
        self.aggregations += 1
        started = self.clock()
        counts = await self.store.count_by_queue()
        self._took = self.clock() - started
        self.latest, self._at = counts, self.clock()
        return counts


def fold_queues(depth: Depth, most: int = MAX_QUEUE_LABELS) -> Depth:
    """At most `most` queue label values: the default queue and the queues holding the most
    jobs keep their own; the rest are summed as `other`."""
    if len(depth) <= most:
        return depth
    others = sorted(
        (q for q in depth if q != DEFAULT_QUEUE), key=lambda q: (-sum(depth[q].values()), q)
    )
    kept = {DEFAULT_QUEUE, *others[: most - 2]}
    folded: Depth = {q: counts for q, counts in depth.items() if q in kept}
    other = dict(folded.pop(OTHER_QUEUES, {}))  # a queue named "other" shares the label
    for queue in others[most - 2 :]:
        for status, n in depth[queue].items():
            other[status] = other.get(status, 0) + n
    folded[OTHER_QUEUES] = other
    return folded


class _DepthCollector(Collector):
    def __init__(self, metrics: ApiMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "brook_queue_depth", "Jobs by queue and status.", labels=["queue", "status"]
        )
        depth = fold_queues(self.metrics.depth)
        statuses = {s.value for s in JobStatus}.union(*depth.values())
        for queue in sorted({DEFAULT_QUEUE, *depth}):
            for status in sorted(statuses):
                family.add_metric([queue, status], depth.get(queue, {}).get(status, 0))
        yield family


class _QuotaCollector(Collector):
    def __init__(self, metrics: ApiMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "brook_quota_units",
            "Units counted against each quota, cluster-wide: the estimates charged at starts,"
            " corrected by the usage tasks reported (ctx.usage), from the quotas' ledger.",
            labels=["quota"],
        )
        for quota, units in sorted(self.metrics.quota_units.items()):
            family.add_metric([quota], units)
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
        self.quota_units: dict[str, float] = {}
        self.registry.register(_QuotaCollector(self))

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
