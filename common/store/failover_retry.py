"""Riding out a failover: retry a MongoDB operation while its failure is transient."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pymongo.errors import PyMongoError

from brook.common.runtime.backoff import Backoff
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.db import is_transient

T = TypeVar("T")


async def ride_out(op: str, fn: Callable[[], Awaitable[T]], *, until: float = math.inf) -> T | None:
    """Run `fn` until it succeeds; None once the monotonic time `until` has passed.

    A transient failure (no primary, network, election) is logged and retried after a
    backoff; any other MongoDB error is raised, since it would fail the same way again.
    With a finite `until`, no single try outlives it either: a call stuck in server
    selection is cut off there.
    """
    backoff = Backoff(0.1, 2.0)
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return None
        try:
            if math.isinf(until):
                return await fn()
            async with asyncio.timeout(left):
                return await fn()
        except TimeoutError:
            return None
        except PyMongoError as exc:
            if not is_transient(exc):
                raise
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op=op, error=str(exc)[:200])
            await asyncio.sleep(min(backoff.next(), max(until - time.monotonic(), 0.0)))


async def persist(op: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Run `fn` through failovers for as long as it takes (`ride_out` without a deadline),
    and return what it returned, None included."""

    async def boxed() -> tuple[T]:  # tells "returned None" from "gave up"
        return (await fn(),)

    result = await ride_out(op, boxed)
    assert result is not None, "ride_out without a deadline returns only on success"
    return result[0]
