"""Prometheus metrics every Brook process may record, and the dispatcher's metrics endpoint.

The metric objects live here, in the process-wide default registry; the code records them
where the thing happens (a claim in `dispatcher/claiming/claimer.py`, an outcome in
`dispatcher/attempts/outcomes.py`, a renewal in `dispatcher/attempts/leases.py`, a resume
in a change stream follower). A dispatcher serves them on
`BROOK_METRICS_HOST:BROOK_METRICS_PORT` (default `127.0.0.1:9464`, `0` = off); the API serves
them on its own `/metrics`, with its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from brook.common.domain.models import DEFAULT_QUEUE
from brook.common.runtime.log_events import Event, log_event
from brook.common.runtime.settings import Settings

# One series per counter, not a second `_created` one per label set.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Seconds, from a millisecond to an hour: claims are fast, backlogs and tasks are not.
_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

JOB_WAIT = Histogram(
    "brook_job_wait_seconds",
    "From the moment a job was due (its submission, or its run_at) to the start of an attempt.",
    buckets=_BUCKETS,
)
JOB_DURATION = Histogram(
    "brook_job_duration_seconds",
    "How long an attempt ran in its worker, by task.",
    ["task"],
    buckets=_BUCKETS,
)
JOBS = Counter(
    "brook_jobs",
    "Attempts ended by this dispatcher, by task, queue and outcome (completed, retried, failed,"
    " cancelled, released, suspended, discarded, expired).",
    ["task", "queue", "outcome"],
)
STEPS = Counter(
    "brook_steps",
    "Durable steps by how they ended: run (its function ran and its checkpoint was written)"
    " or replayed (an earlier run's checkpoint returned without running it).",
    ["task", "how"],
)
CLAIMS = Counter("brook_claims", "Jobs this dispatcher claimed (leased).")
LEASE_RENEWALS = Counter("brook_lease_renewals", "Leases renewed by the heartbeat.")
LEASES_LOST = Counter(
    "brook_leases_lost", "Leases this dispatcher found it no longer held (it froze or was late)."
)
LEASES_SELF_FENCED = Counter(
    "brook_leases_self_fenced",
    "Leases this dispatcher could not renew (MongoDB unreachable), whose workers it stopped"
    " before they could run out on the server's clock.",
)
LEASES_EXPIRED = Counter(
    "brook_leases_expired", "Expired leases (of any dispatcher) the watchdog requeued."
)
STREAM_RESUMES = Counter(
    "brook_stream_resumes", "Change streams reopened from a resume token, by stream.", ["stream"]
)
STREAM_HISTORY_LOST = Counter(
    "brook_stream_history_lost",
    "Change streams whose resume token the oplog no longer held, by stream.",
    ["stream"],
)

TRIGGER_JOBS = Counter(
    "brook_trigger_jobs",
    "Jobs this dispatcher's trigger followers made from changes (new ones, not replays).",
    ["trigger"],
)
TRIGGER_SKIPPED = Counter(
    "brook_trigger_skipped",
    "Changes this dispatcher's trigger followers skipped, as they could not become a job "
    "(unreadable, too large, refused by MongoDB); each counted by the follower that saved "
    "the token past it.",
    ["trigger"],
)
TRIGGER_HISTORY_LOST = Counter(
    "brook_trigger_history_lost",
    "Times a trigger's saved resume token was no longer in the oplog (it resumed from now).",
    ["trigger"],
)
SHARED_IN_FLIGHT = Gauge(
    "brook_shared_jobs_in_flight",
    "Shared jobs (`@task(..., shared=N)`) running now in each shared worker process.",
    ["worker"],
)
LOOPS_BLOCKED = Counter(
    "brook_worker_loop_blocked",
    "Times a shared worker process's event loop was blocked past BROOK_LOOP_BLOCKED_SECONDS.",
)

# Queue names come from clients: each a label value, so each a set of series. A process
# gives its own label to the first MAX_QUEUE_LABELS queues it sees (the default one always);
# the rest are counted together as `other`.
MAX_QUEUE_LABELS = 50
OTHER_QUEUES = "other"
_labelled: set[str] = {DEFAULT_QUEUE}


def queue_label(queue: str) -> str:
    """The label value that counts jobs of `queue`: its name, or `other` past the cap."""
    if queue in _labelled:
        return queue
    if len(_labelled) < MAX_QUEUE_LABELS:
        _labelled.add(queue)
        return queue
    return OTHER_QUEUES


class Queued(Protocol):
    @property
    def task(self) -> str: ...


def queue_of(job: Queued) -> str:
    """The job's queue; jobs that predate queues (no `queue` attribute or field) are in
    the default one."""
    queue = getattr(job, "queue", None)
    return queue if isinstance(queue, str) and queue else DEFAULT_QUEUE


def count_outcome(job: Queued, outcome: str) -> None:
    JOBS.labels(task=job.task, queue=queue_label(queue_of(job)), outcome=outcome).inc()


@dataclass
class MetricsServer:
    """The dispatcher's `/metrics` endpoint (prometheus-client's own HTTP server, on a thread)."""

    port: int
    _server: Any

    def close(self) -> None:
        """Stop serving, without blocking the caller's event loop on the server's poll."""
        threading.Thread(target=self._stop, name="metrics-close", daemon=True).start()

    def _stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(settings: Settings) -> MetricsServer | None:
    """Serve this process's metrics on `BROOK_METRICS_PORT`; None when it is 0 (off) or the
    port is taken (logged: the dispatcher runs on without an endpoint rather than not at all)."""
    if settings.metrics_port == 0:
        return None
    try:
        server, _thread = start_http_server(settings.metrics_port, addr=settings.metrics_host)
    except OSError as exc:
        log_event(
            Event.METRICS_UNAVAILABLE,
            level="error",
            host=settings.metrics_host,
            port=settings.metrics_port,
            error=str(exc),
            hint="give each dispatcher on a host its own BROOK_METRICS_PORT",
        )
        return None
    log_event(Event.METRICS_LISTENING, host=settings.metrics_host, port=settings.metrics_port)
    return MetricsServer(port=settings.metrics_port, _server=server)
