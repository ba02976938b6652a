"""Group commit: many callers, few round trips.

The first item is written at once; items that arrive while that write is in flight go
together in the next one. At low load this adds no latency; under load one MongoDB
command (and one majority wait) serves many callers. With `linger_s`, a write that finds
items waiting when it returns (load) lets `linger_s` pass before the next one, so that it
carries more of them: each write is a replication round that costs the replica set
about as much whatever it carries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from brook.common.runtime.supervision import Spawn, spawn_logged

In = TypeVar("In")
Out = TypeVar("Out")
R = TypeVar("R")


class GroupCommit(Generic[In, Out]):
    def __init__(
        self,
        write: Callable[[Sequence[In]], Awaitable[Sequence[Out]]],
        max_batch: int = 256,
        *,
        spawn: Spawn = spawn_logged,
        linger_s: float = 0.0,
    ) -> None:
        self._write = write
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._spawn = spawn
        self._queue: list[tuple[In, asyncio.Future[Out]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, item: In) -> Out:
        fut: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        if self._writer is None or self._writer.done():
            self._writer = self._spawn(self._drain(), "group-commit")
        return await fut

    async def carry(
        self, write: Callable[[Sequence[In]], Awaitable[tuple[R, Sequence[Out]]]]
    ) -> R:
        """Hand the items waiting for the next write (not those in flight) to another write
        that carries them too, one round trip for both: `write` gets them and returns its
        own result with one result per item. A failure fails those items as their own
        write would have."""
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        try:
            result, outs = await write([item for item, _ in batch])
        except BaseException as exc:
            for _, fut in batch:
                if fut.done():
                    continue
                if isinstance(exc, Exception):
                    fut.set_exception(exc)
                else:
                    fut.cancel()
            raise
        for (_, fut), out in zip(batch, outs, strict=True):
            if not fut.done():
                fut.set_result(out)
        return result

    async def _drain(self) -> None:
        first = True
        while self._queue:
            if not first and self._linger_s and len(self._queue) < self._max_batch:
                await asyncio.sleep(self._linger_s)
            first = False
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            try:
                results = await self._write([item for item, _ in batch])
            except Exception as exc:  # every caller in the batch sees the same failure
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
