"""Which limited queues this dispatcher may try to claim from now (`QueueGates`).

A queue whose claim got no slot is *closed* here until something can change that, so a
waiting queue never busy-loops: a full queue until a slot is released anywhere, a job is
requeued, or the next sweep; a queue out of starts until its rate window moves (a timer on
the server's clock); a paused one until it is resumed. Every event that may free a slot
bumps the queue's generation: a claim that started before such an event does not close it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

from brook.common.domain.queues import BlockReason

MAX_RATE_BACKOFF_S = 1.0


class Clock(Protocol):
    """The server's clock as seen from here (`brook.common.store.clock.ServerClock`)."""

    def now(self) -> float: ...


class QueueGates:
    """Which limited queues may be tried now. Every event that may free a slot bumps the
    queue's generation; a claim that started before such an event does not close it."""

    def __init__(self, clock: Clock, opened: Callable[[str], None]) -> None:
        self.clock = clock
        self.opened = opened
        self._closed: dict[str, BlockReason] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._gen: Counter[str] = Counter()
        self._misses: Counter[str] = Counter()

    def generation(self, queue: str) -> int:
        return self._gen[queue]

    def is_open(self, queue: str) -> bool:
        return queue not in self._closed

    def closed(self) -> frozenset[str]:
        return frozenset(self._closed)

    def close(self, queue: str, reason: BlockReason, at: float | None, gen: int) -> bool:
        """Close `queue` (for the rate, until the server time `at`); False if an event came
        while the claim was looking, in which case the caller should look again."""
        if gen != self._gen[queue]:
            return False
        self._closed[queue] = reason
        if reason == "rate" and at is not None:
            # A timer that fires early (the clock estimate is off) finds the window still
            # full and waits a little longer each time: never a tight loop.
            extra = min(0.002 * 2 ** self._misses[queue], MAX_RATE_BACKOFF_S)
            self._misses[queue] += 1
            delay = max(at - self.clock.now(), 0.0) + extra
            self._cancel_timer(queue)
            self._timers[queue] = asyncio.get_running_loop().call_later(delay, self.open, queue)
        return True

    def claimed(self, queue: str) -> None:
        self._misses.pop(queue, None)

    def open(self, queue: str) -> None:
        """Something may have freed a slot of `queue` (or changed its limits)."""
        self._gen[queue] += 1
        self._cancel_timer(queue)
        if self._closed.pop(queue, None) is not None:
            self.opened(queue)

    def open_waiting(self, reasons: Iterable[BlockReason] = ("full",)) -> None:
        for queue, reason in list(self._closed.items()):
            if reason in reasons:
                self.open(queue)

    def forget(self, queue: str) -> None:
        self._closed.pop(queue, None)
        self._cancel_timer(queue)

    def _cancel_timer(self, queue: str) -> None:
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()

