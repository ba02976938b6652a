"""One backoff policy for every loop that waits before trying again.

`backoff_delay` spaces a job's retries (exponential, with jitter, so retries of many jobs
do not arrive together); `Backoff` spaces a loop's own retries (reconnects, respawns,
restarts): exponential without jitter, reset after a success.
"""

from __future__ import annotations

import random


def exponential(step: int, base: float, cap: float) -> float:
    """`min(cap, base * 2**step)` for step 0, 1, 2, …"""
    return float(min(cap, base * 2.0 ** max(step, 0)))


def backoff_delay(attempt: int, base: float, cap: float, rand: float | None = None) -> float:
    """A job's retry delay after `attempt`: in [d/2, d], d = min(cap, base * 2**(attempt-1))."""
    full = exponential(attempt - 1, base, cap)
    r = random.random() if rand is None else rand
    return full * (0.5 + r / 2.0)


class Backoff:
    """The delays of a loop that retries: `base`, `2·base`, … up to `cap`; `reset()` after
    a success starts again at `base`."""

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next(self) -> float:
        delay = exponential(self.failures, self.base, self.cap)
        self.failures += 1
        return delay

    def peek(self) -> float:
        return exponential(self.failures, self.base, self.cap)

    def reset(self) -> None:
        self.failures = 0
