"""Schedule overlap: what a tick does while the schedule's previous run is unfinished.

A schedule whose `overlap` is `allow` (the default) submits every tick's job, as it always
did. For the others, each tick gets exactly one decision for the cluster, recorded in the
schedule's document before anything else happens (`ScheduleStore.decide`): every
dispatcher reads the newest run (the job of `run_tick`, found by its idempotency key) and
computes the decision from its status (`tick_decision`); the first conditional write for
a tick later than the last decided one wins, and the others take the winner's decision.
So a tick is a job (every dispatcher that sees `run`, `buffer` or `replace` submits it with
the tick's idempotency key: one insert wins, and a winner that died before submitting
loses nothing) or a skip, logged once, by the winner (`schedule.skipped`). A buffered or
replacing job depends on the run it follows (`depends_on`, `run_on_parent_failure`): it
starts once that run has ended, however it ended. `cancel_other` cancels that run first
(the winner does, with the jobs it spawned).
"""

from __future__ import annotations

import contextlib
from datetime import datetime

from brook.common.client.spawned import cancel_with_spawned
from brook.common.domain.errors import JobNotFound
from brook.common.domain.models import Job
from brook.common.domain.schedules import Schedule, ScheduleState, tick_decision
from brook.common.domain.status import TERMINAL
from brook.common.runtime.log_events import Event, log_event
from brook.common.store.failover_retry import persist
from brook.common.store.jobs import JobStore
from brook.common.store.schedules import Decided, ScheduleStore, as_utc


class Overlaps:
    def __init__(self, jobs: JobStore, store: ScheduleStore) -> None:
        self.jobs = jobs
        self.store = store

    async def decide(
        self, s: Schedule, tick: datetime, state: ScheduleState | None
    ) -> Decided | None:
        """What `tick` does, decided once for the cluster; None: no job (skipped, or a
        tick older than the last decided one)."""
        previous = await self._unfinished_run(s, state)
        kind = tick_decision(s.overlap, previous.status.value if previous else None)
        after = previous.id if previous is not None and kind in ("buffer", "replace") else None
        decided = await persist(
            "schedule.decide", lambda: self.store.decide(s.name, tick, kind, after)
        )
        if decided is None:
            return None
        if decided.kind == "skip":
            if decided.won:
                log_event(
                    Event.SCHEDULE_SKIPPED,
                    schedule=s.name,
                    tick=tick.isoformat(),
                    overlap=s.overlap,
                    unfinished=previous.id if previous else None,
                )
            return None
        if decided.kind == "replace" and decided.won and decided.after is not None:
            other = decided.after
            with contextlib.suppress(JobNotFound):  # deleted meanwhile: nothing to cancel
                await persist(
                    "schedule.cancel_other",
                    lambda: cancel_with_spawned(self.jobs, other, via="schedule"),
                )
        return decided

    async def _unfinished_run(self, s: Schedule, state: ScheduleState | None) -> Job | None:
        """The schedule's newest run, if it is unfinished (any state but a terminal one:
        pending retries, durable sleeps and signal waits included)."""
        if state is None or state.run_tick is None:
            return None
        key = s.key(as_utc(state.run_tick))
        job = await persist("schedule.previous", lambda: self.jobs.by_idempotency_key(key))
        return job if job is not None and job.status not in TERMINAL else None
