"""Priority aging (`BROOK_PRIORITY_AGING_SECONDS`): a waiting job's effective priority is its
priority plus one for each such interval it has waited since it was due, so a steady stream
of higher-priority work cannot starve it forever.

The claim order stays the indexed one (priority, then due time); aging is a bounded look
beside it. At most once per `min(interval, 1 s)`, before a plain claim, the dispatcher
reads the `AGED_LOOK` oldest due jobs it could claim (the `due` index, in due order) and
the best job by stored priority (the claim order's first, one index seek), and claims those
of the old ones whose effective priority is above that best job's priority, ahead of it.
Two small index reads per interval, whatever the backlog; nothing is rewritten.

The bound: a job of priority p, among the `AGED_LOOK` oldest due jobs, passes every job
of priority q due more than (q - p + 1) x interval after it: it starts no later than one
check interval after that point (and the tasks running then: once claimed, it goes to
the next free worker before the jobs claimed ahead by stored priority, `Holdings.aged`).
Jobs due before it, of any priority, still go first: they have aged as long as it has.
Limited queues (`dispatcher.claiming.limits`) are claimed in their own order, without aging.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Collection
from datetime import UTC, datetime, timedelta

from brook.common.domain.models import Doc, Job
from brook.common.store.jobs import Tagged
from brook.dispatcher.claiming.task_scope import tasks_now
from brook.dispatcher.wiring import Wiring

AGED_LOOK = 8


def effective(doc: Doc, now: datetime, interval: float) -> int:
    """A due job's priority plus one per `interval` waited since its `run_at`."""
    waited = max((now - doc["run_at"]).total_seconds(), 0.0)
    steps: int = math.floor(waited / interval)
    priority: int = doc.get("priority", 0)
    return priority + steps


class Aging:
    def __init__(self, wiring: Wiring, interval: float) -> None:
        self.store = wiring.store
        self.owner = wiring.owner
        self.clock = wiring.clock
        self.tasks = wiring.tasks
        self.lease_seconds = wiring.settings.lease_seconds
        self.interval = interval
        self.every = min(interval, 1.0)
        self._next = 0.0

    async def claim(
        self,
        room: int,
        *,
        queue: str | None,
        exclude: Collection[str],
        among: Collection[str] | None,
    ) -> list[Job]:
        """Up to `room` old jobs whose effective priority beats the best job's priority, if
        a check is due; none otherwise."""
        if room < 1 or time.monotonic() < self._next:
            return []
        self._next = time.monotonic() + self.every
        tasks = tasks_now(self.tasks)
        old = await self.store.oldest_due(
            AGED_LOOK, tasks=tasks, queue=queue, exclude=exclude, among=among
        )
        if not old:
            return []
        best = await self.store.best_priority(
            tasks=tasks, queue=queue, exclude=exclude, among=among
        )
        now = datetime.fromtimestamp(self.clock.now(), UTC)
        ahead = sorted(
            (d for d in old if best is None or effective(d, now, self.interval) > best),
            key=lambda d: -effective(d, now, self.interval),
        )
        if not ahead:
            return []
        ids = [str(d["_id"]) for d in ahead[:room]]
        before = now + timedelta(seconds=self.lease_seconds)
        ask = Tagged(ids=ids, tag=secrets.token_hex(8), before=before)
        return (await self.store.claim(self.owner, self.lease_seconds, ask)).jobs
