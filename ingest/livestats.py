"""Throughput and submit→start latency over the last minutes, from the live events.

Every API process sees every start and end of a job on its one change stream (lean while
nobody watches), so it can keep these figures in memory, in fixed time buckets, without
asking MongoDB anything. They start empty when the process starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from brook.ingest.live import Tally

STEP_S = 10
BUCKETS = 60  # ten minutes
SAMPLES_PER_BUCKET = 500  # wait times kept per bucket for its percentiles


@dataclass
class _Bucket:
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    started: int = 0
    waits_ms: list[float] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 2)


class LiveStats:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._buckets: dict[int, _Bucket] = {}

    def _bucket(self, at_s: float) -> _Bucket:
        index = int(at_s // STEP_S)
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = _Bucket()
            oldest = int(self.clock() // STEP_S) - BUCKETS
            for stale in [i for i in self._buckets if i <= oldest]:
                del self._buckets[stale]
        return bucket

    def observe(self, tally: Tally) -> None:
        bucket = self._bucket(tally.wall_ms / 1000)
        if tally.started:
            bucket.started += 1
            if tally.wait_ms is not None and len(bucket.waits_ms) < SAMPLES_PER_BUCKET:
                bucket.waits_ms.append(tally.wait_ms)
        if tally.ended in ("completed", "failed", "cancelled"):
            setattr(bucket, tally.ended, getattr(bucket, tally.ended) + 1)

    def series(self) -> dict[str, Any]:
        """The last `BUCKETS` buckets, oldest first; `end` is the end of the newest one."""
        last = int(self.clock() // STEP_S)
        rows = [self._buckets.get(i, _Bucket()) for i in range(last - BUCKETS + 1, last + 1)]
        return {
            "step_s": STEP_S,
            "end": (last + 1) * STEP_S,
            "started": [b.started for b in rows],
            "completed": [b.completed for b in rows],
            "failed": [b.failed for b in rows],
            "cancelled": [b.cancelled for b in rows],
            "wait_p50_ms": [_percentile(b.waits_ms, 0.5) for b in rows],
            "wait_p95_ms": [_percentile(b.waits_ms, 0.95) for b in rows],
        }
