"""Group commit for completions.

The first finished job is written at once; jobs that finish while that write is in
flight are written together in the next one (a single `bulk_write`, a single majority
wait). At low load this adds nothing; under load it cuts MongoDB commands per job.
Each completion stays fenced by its own filter (`_id`, attempt, owner, running).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from common.store import JobStore, Lease

Verdict = Literal["applied", "lost", "refused", "deadline"]
Retrying = Callable[..., Awaitable[Any]]

MAX_BATCH = 256


class Completer:
    def __init__(self, store: JobStore, owner: str, retrying: Retrying, deadline: float) -> None:
        self.store = store
        self.owner = owner
        self.retrying = retrying
        self.deadline = deadline
        self._queue: list[tuple[Lease, Any, asyncio.Future[tuple[Verdict, str]]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def complete(self, lease: Lease, result: Any) -> tuple[Verdict, str]:
        fut: asyncio.Future[tuple[Verdict, str]] = asyncio.get_running_loop().create_future()
        self._queue.append((lease, result, fut))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            items = [(lease, result) for lease, result, _ in batch]
            try:
                written = await self.retrying(
                    "complete",
                    lambda items=items: self.store.complete_many(self.owner, items),
                    deadline=self.deadline,
                )
            except Exception as exc:  # not transient: hand it to every waiter
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for lease, _, fut in batch:
                if fut.done():
                    continue
                if written is None:
                    fut.set_result(("deadline", ""))
                    continue
                done, refused = written
                if lease.job_id in done:
                    fut.set_result(("applied", ""))
                elif lease.job_id in refused:
                    fut.set_result(("refused", refused[lease.job_id]))
                else:
                    fut.set_result(("lost", ""))
