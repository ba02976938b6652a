"""Fair claiming across keys: the turn order of one queue's keys, as one dispatcher keeps it.

A queue with per-key limits (or `fair`) is claimed by turns, not in submit order: each
claim takes the best due jobs of the keys at the front of the order, interleaved (the first
job of each key, then the second of each, ...; higher priority still first), and the keys it
served go to the back. A key this dispatcher has not served yet (new, or seen again after
running dry) comes in at the front: it has waited longest. So a key with one job waits for
at most one claim behind a key with 10,000, never behind the 10,000.

Jobs without a key take their turn together, as the key `None`. The keys come from the
jobs' inserts as the dispatcher hears of them, and from one distinct scan of the queue's
pending keys when the order may be stale (a sweep, a requeue, a due timer); a key whose
look finds nothing due leaves the order until it is seen again.

A key that can start nothing now (at its `key_concurrency`, or out of starts by its
`key_rate`) waits out of turn: until a slot of the queue is released (the queue's gate
generation moves), or until its rate window frees. Pure: no database, no clock of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from brook.common.domain.models import Doc

Key = str | None


@dataclass(frozen=True)
class Wait:
    until: float | None  # the server time it may start again; None: when a slot is released
    generation: int  # the queue's gate generation when it began waiting


class KeyTurns:
    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()
        self._waits: dict[str, Wait] = {}
        self._seen_since: set[Key] = set()
        # Keys heard of since the current look began: a look that found them empty read
        # before their job was there, so it must not drop them.
        self._recent: set[Key] = set()
        self.stale = True

    def __len__(self) -> int:
        return len(self._order)

    def keys(self) -> list[Key]:
        return list(self._order)

    def saw(self, key: Key) -> None:
        """A job of `key` became pending: a key not in the order comes in at the front."""
        self._seen_since.add(key)
        self._recent.add(key)
        if key not in self._order:
            self._order[key] = None
            self._order.move_to_end(key, last=False)

    def look_started(self) -> None:
        self._recent = set()

    def refresh_started(self) -> None:
        self._seen_since = set()

    def refreshed(self, keys: Iterable[Key]) -> None:
        """The keys with pending jobs, as a distinct scan found them (plus those seen since
        it began): known keys keep their turn, new ones come in at the front."""
        fresh = set(keys) | self._seen_since | self._recent
        for key in [k for k in self._order if k not in fresh]:
            del self._order[key]
        for key in sorted((k for k in fresh if k not in self._order), key=str, reverse=True):
            self._order[key] = None
            self._order.move_to_end(key, last=False)
        self.stale = False

    def pick(self, n: int, now: float, generation: int) -> list[Key]:
        """Up to `n` keys from the front that may start a job now."""
        out: list[Key] = []
        for key in self._order:
            if len(out) >= n:
                break
            if key is not None and self._waiting(key, now, generation):
                continue
            out.append(key)
        return out

    def _waiting(self, key: str, now: float, generation: int) -> bool:
        wait = self._waits.get(key)
        if wait is None:
            return False
        over = wait.generation != generation if wait.until is None else wait.until <= now
        if over:
            del self._waits[key]
        return not over

    def any_other(self, besides: Container[Key], now: float, generation: int) -> bool:
        """Whether some key not in `besides` may start a job now (a look from the front
        that stops at the first: the keys just looked at are at the front)."""
        for key in self._order:
            if key in besides or (key is not None and self._waiting(key, now, generation)):
                continue
            return True
        return False

    def waiting(self, now: float, generation: int) -> bool:
        """Whether every key in the order waits (none may start a job now)."""
        return bool(self._order) and not self.pick(1, now, generation)

    def next_free(self) -> float | None:
        """The earliest moment a key waiting for its rate window may start (None: none)."""
        times = [w.until for w in self._waits.values() if w.until is not None]
        return min(times) if times else None

    def wait(self, waits: Mapping[str, float | None], generation: int) -> None:
        for key, until in waits.items():
            self._waits[key] = Wait(until, generation)

    def dry(self, keys: Iterable[Key]) -> None:
        """These keys had nothing due: out of the order until seen again (but for those
        heard of since the look began)."""
        for key in keys:
            if key not in self._recent:
                self._order.pop(key, None)

    def served(self, keys: Sequence[Key]) -> None:
        """These keys got jobs (in this order): to the back."""
        for key in dict.fromkeys(keys):
            if key in self._order:
                self._order.move_to_end(key)


def interleave(found: Mapping[Key, Sequence[Doc]]) -> list[Doc]:
    """The candidates of several keys (each key's list in claim order, the keys in turn
    order) as one list: the first of each key, then the second of each, ...; then by
    priority, highest first (a stable sort: turns break ties)."""
    out: list[Doc] = []
    lists = list(found.values())
    depth = max((len(v) for v in lists), default=0)
    for i in range(depth):
        out.extend(v[i] for v in lists if i < len(v))
    out.sort(key=lambda d: -int(d.get("priority") or 0))
    return out
