"""A dispatcher's workers when some of its tasks share processes: the `BROOK_CONCURRENCY`
processes that run one job each (`executor.pool`) beside the `BROOK_SHARED_PROCESSES`
shared ones (`executor.shared_pool`), as one `Runner`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from brook.common.protocol.runner import (
    KillReason,
    Outcome,
    ProgressReport,
    ReservedWorker,
    RunJob,
    StepAck,
    StepRecord,
)
from brook.common.runtime.settings import Settings
from brook.executor.pool import WorkerPool
from brook.executor.shared_pool import SeatReservation, SharedPool


class Runners:
    def __init__(self, settings: Settings, shared: Mapping[str, int]) -> None:
        """`shared`: the tasks whose jobs share processes, each with its `shared=` count."""
        self.pool = WorkerPool(settings, settings.worker_slots)
        self.shared_pool = SharedPool(settings, shared)
        self.shared: Mapping[str, int] = dict(shared)

    def _both(self, name: str, value: object) -> None:
        setattr(self.pool, name, value)
        setattr(self.shared_pool, name, value)

    @property
    def on_free(self) -> Callable[[], None]:
        return self.pool.on_free

    @on_free.setter
    def on_free(self, value: Callable[[], None]) -> None:
        self._both("on_free", value)

    @property
    def on_progress(self) -> Callable[[ProgressReport], None]:
        return self.pool.on_progress

    @on_progress.setter
    def on_progress(self, value: Callable[[ProgressReport], None]) -> None:
        self._both("on_progress", value)

    @property
    def on_step(self) -> Callable[[StepRecord, Callable[[StepAck], None]], None]:
        return self.pool.on_step

    @on_step.setter
    def on_step(self, value: Callable[[StepRecord, Callable[[StepAck], None]], None]) -> None:
        self._both("on_step", value)

    async def start(self) -> None:
        await asyncio.gather(self.pool.start(), self.shared_pool.start())

    async def close(self, timeout: float = 5.0) -> None:
        await asyncio.gather(self.pool.close(timeout), self.shared_pool.close(timeout))

    def free_workers(self) -> int:
        return self.pool.free_workers()

    def free_seats(self, task: str | None = None) -> int:
        return self.shared_pool.free_seats(task)

    def reserve(self, shared_task: str | None = None) -> ReservedWorker | None:
        if shared_task is None:
            return self.pool.reserve()
        return self.shared_pool.reserve(shared_task)

    def unreserve(self, reserved: ReservedWorker) -> None:
        if isinstance(reserved, SeatReservation):
            self.shared_pool.unreserve(reserved)
        else:
            self.pool.unreserve(reserved)

    async def run(self, reserved: ReservedWorker, job: RunJob, timeout: float | None) -> Outcome:
        if isinstance(reserved, SeatReservation):
            return await self.shared_pool.run(reserved, job, timeout)
        return await self.pool.run(reserved, job, timeout)

    def kill(self, job_id: str, reason: KillReason) -> bool:
        return self.shared_pool.kill(job_id, reason) or self.pool.kill(job_id, reason)
