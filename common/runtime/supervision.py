"""Background tasks that never die silently.

Every task a process starts outside its main `TaskGroup` (a per-job task, a group-commit
writer, a worker respawn) goes through a `Spawn`. The default one logs a crash loudly; a
`Supervisor` also fails its owner: `Supervisor.first_crash()`, run inside the owner's TaskGroup,
raises the first crash, which stops the process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from brook.common.runtime.log_events import Event, log_event

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


def _report(task: asyncio.Task[None]) -> BaseException | None:
    if task.cancelled():
        return None
    exc = task.exception()
    if exc is not None:
        log_event(
            Event.BACKGROUND_CRASHED,
            level="error",
            task=task.get_name(),
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
    return exc


def spawn_logged(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """Start `coro`; a crash is logged (`background.crashed`), never lost."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(_report)
    return task


class Supervisor:
    """Tracks background tasks; the first one that crashes fails `first_crash()`."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self._crashed: asyncio.Future[BaseException] | None = None

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        exc = _report(task)
        if exc is not None:
            crashed = self._future()
            if not crashed.done():
                crashed.set_result(exc)

    def _future(self) -> asyncio.Future[BaseException]:
        if self._crashed is None:
            self._crashed = asyncio.get_running_loop().create_future()
        return self._crashed

    async def first_crash(self) -> None:
        """Raise the first crash of a supervised task (run it in the owner's TaskGroup)."""
        exc = await self._future()
        raise RuntimeError(f"background task crashed: {type(exc).__name__}: {exc}") from exc

    async def wait(self, timeout: float) -> set[asyncio.Task[None]]:
        """Wait up to `timeout` for every task; return those still running."""
        if not self.tasks:
            return set()
        _, pending = await asyncio.wait(set(self.tasks), timeout=timeout)
        return pending

    def cancel_all(self) -> None:
        for task in self.tasks:
            task.cancel()
