"""`ctx.progress(...)` in a worker process: checked, coalesced, and sent to the dispatcher.

The worker never writes to the jobs collection; the dispatcher that holds the lease does,
fenced like every write of a running job. Reports are coalesced here, before the pipe: at
most one per `INTERVAL_S` per attempt, the newest wins, and the last one is sent when the
task ends, ahead of its result. A plain `def` task blocks the event loop while it runs, so
the trailing send is made by a timer thread, not a loop callback; a lock keeps it from
interleaving with the task's own sends.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from brook.common.protocol.runner import ProgressReport, RunJob

INTERVAL_S = 0.25  # at most ~4 progress writes a second per job
MAX_MESSAGE_CHARS = 1000


def check_progress(fraction: float, message: str | None) -> tuple[float, str | None]:
    """`fraction` a number in [0, 1], `message` a string or None (long ones are cut)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"progress fraction must be a number, not {type(fraction).__name__}")
    value = float(fraction)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"progress fraction must be between 0 and 1, not {fraction!r}")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"progress message must be a string or None, not {type(message).__name__}")
    return value, None if message is None else message[:MAX_MESSAGE_CHARS]


class ProgressReporter:
    """One attempt's progress channel: `report` from any thread, `close` when it ends."""

    def __init__(
        self,
        send: Callable[[ProgressReport], None],
        job: RunJob,
        interval: float = INTERVAL_S,
    ) -> None:
        self._send = send
        self._job = job
        self._interval = interval
        self._lock = threading.Lock()
        self._pending: ProgressReport | None = None
        self._last_sent = -math.inf
        self._timer: threading.Timer | None = None
        self._closed = False
        self._latest: ProgressReport | None = None  # sent or not
        self._held = False

    def report(self, fraction: float, message: str | None = None) -> None:
        value, text = check_progress(fraction, message)
        with self._lock:
            if self._closed:
                return  # the attempt is over (a thread the task left behind)
            job = self._job
            self._pending = ProgressReport(
                job_id=job.job_id, attempt=job.attempt, task=job.task, fraction=value, message=text
            )
            self._latest = self._pending
            if self._held:
                return
            wait = self._last_sent + self._interval - time.monotonic()
            if wait <= 0:
                self._send_pending()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._flush)
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        """Send what is pending and stop; later reports are ignored."""
        with self._lock:
            self._send_pending()
            self._closed = True

    def hold(self) -> None:
        """While the attempt's own transaction is open nothing else may write its job (see
        `brook.common.store.queries.transaction_opened`): keep reports here. The newest goes with
        the completion (`take_last`), or up the pipe if the transaction ends without it
        (`release`)."""
        with self._lock:
            self._held = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def release(self) -> None:
        with self._lock:
            self._held = False
            if not self._closed:
                self._send_pending()

    def take_last(self) -> dict[str, Any] | None:
        """Stop, sending nothing more, and return the newest report (sent or not) as the
        job's `progress` fields: a transactional task writes it with its completion, rather
        than send it up the pipe to race its own commit."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._pending = None
            self._closed = True
            latest = self._latest
        if latest is None:
            return None
        return {"fraction": latest.fraction, "message": latest.message, "attempt": latest.attempt}

    def _flush(self) -> None:
        with self._lock:
            if self._timer is not threading.current_thread():
                return  # cancelled after it fired: a direct send came first, and reset it
            self._timer = None
            if not self._closed and not self._held:
                self._send_pending()

    def _send_pending(self) -> None:
        """With the lock held. A send resets the interval: an armed timer is not needed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending is None:
            return
        report, self._pending = self._pending, None
        self._last_sent = time.monotonic()
        try:
            self._send(report)
        except OSError:  # the dispatcher is gone; this process is about to be
            self._closed = True
