"""Caps on what one API process holds at once (event streams, catch-up cursors): a request
beyond a cap is told `503` with `Retry-After` at once, rather than queued."""

from __future__ import annotations


class Slots:
    """At most `limit` holders at once; `take` never waits."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    def take(self) -> bool:
        if self.full:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used = max(self.used - 1, 0)
