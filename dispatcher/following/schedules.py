"""Cron schedules: each tick's job is submitted when the tick comes, once for the cluster.

Every dispatcher runs every schedule it loaded; there is no leader to elect or lose. At
a tick each one submits the tick's job with the idempotency key
`schedule:{name}:{tick}`: the unique index lets exactly one insert win, and the others
get that job back. A dispatcher that dies takes nothing with it, since the others submit
every tick anyway. The job's `run_at` is the tick, so a dispatcher whose clock runs early
cannot start it early either.

The loop sleeps until the earliest next tick of its schedules (a timer on the server's
clock, re-armed at least every minute in case the local clock jumps), reads their shared
state in one query (a paused schedule submits nothing), submits what is due and records
the newest tick in `brook_schedules` (`last_tick`, `last_job_id`). A dispatcher held up
past several ticks of one schedule (a long failover) submits only the latest of them.

At start, ticks that passed since the schedule's last recorded tick (or its resume) are
missed: `catch_up="latest"` submits the most recent of them once, `"none"` skips them.
A schedule seen for the first time starts with its next tick.

A schedule whose `overlap` is not `allow` decides each tick once for the cluster before
its job, if any, is submitted (`overlap.py`); a caught-up tick is decided the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from brook.common.client.dependents import recheck
from brook.common.domain.deadlines import logged_bounds
from brook.common.domain.models import JobSpec
from brook.common.domain.schedules import Schedule, ScheduleState
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.store.clock import ServerClock
from brook.common.store.failover_retry import persist
from brook.common.store.jobs import JobStore, Submitted
from brook.common.store.schedules import ScheduleStore
from brook.dispatcher.following.overlap import Overlaps

MAX_SLEEP_S = 60.0



class ScheduleRunner:
    def __init__(
        self,
        schedules: Sequence[Schedule],
        jobs: JobStore,
        store: ScheduleStore,
        clock: ServerClock,
        owner: str,
    ) -> None:
        self.schedules = {s.name: s for s in schedules}
        self.jobs = jobs
        self.store = store
        self.clock = clock
        self.owner = owner
        self._next: dict[str, datetime] = {}  # name → its next tick not yet handled
        self.overlaps = Overlaps(jobs, store)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), UTC)

    async def run(self) -> None:
        if not self.schedules:
            return
        names = list(self.schedules)
        await persist(
            "schedules.declare",
            lambda: self.store.declare(list(self.schedules.values()), self.owner),
        )
        await persist("clock", self.clock.sync)
        states = await persist("schedules.read", lambda: self.store.states(names))
        await self._start(states, self._now())
        while True:
            delay = (min(self._next.values()) - self._now()).total_seconds()
            if delay > 0:
                await asyncio.sleep(min(delay, MAX_SLEEP_S))
                continue
            await self._tick(self._now())

    async def _start(self, states: dict[str, ScheduleState], now: datetime) -> None:
        """Catch up what was missed while no dispatcher ran, then arm every schedule."""
        late: list[tuple[Schedule, datetime]] = []
        for s in self.schedules.values():
            self._next[s.name] = s.next_tick(now)
            missed = self._missed(s, states.get(s.name), now)
            log_event(
                Event.SCHEDULE_DECLARED,
                schedule=s.name,
                cron=s.cron,
                tz=s.tz,
                task=s.task,
                catch_up=s.catch_up,
                next_run=self._next[s.name].isoformat(),
                missed=missed.isoformat() if missed else None,
            )
            if missed is None:
                continue
            if s.catch_up == "latest":
                late.append((s, missed))
            else:
                log_event(
                    Event.SCHEDULE_MISSED,
                    schedule=s.name,
                    catch_up=s.catch_up,
                    latest_missed=missed.isoformat(),
                )
        await asyncio.gather(
            *(self._submit(s, tick, states.get(s.name), catch_up=True) for s, tick in late)
        )

    @staticmethod
    def _missed(s: Schedule, state: ScheduleState | None, now: datetime) -> datetime | None:
        """The latest tick in (last recorded tick or resume, now], if any."""
        if state is None or state.paused:
            return None
        marks = [t for t in (state.last_tick, state.resumed_at) if t is not None]
        if not marks:
            return None  # never ticked: a new schedule starts with its next tick
        latest = s.latest_tick(now)
        return latest if latest is not None and latest > max(marks) else None

    async def _tick(self, now: datetime) -> None:
        due = [name for name, at in self._next.items() if at <= now]
        states = await persist("schedules.read", lambda: self.store.states(due))
        now = max(now, self._now())  # the read may have waited out a failover
        ticks: list[tuple[Schedule, datetime, ScheduleState | None]] = []
        for name in due:
            s = self.schedules[name]
            # Several ticks passed (a long failover, say): only the latest is submitted.
            tick = max(s.latest_tick(now) or self._next[name], self._next[name])
            self._next[name] = s.next_tick(tick)
            state = states.get(name)
            if state is None or not state.paused:
                ticks.append((s, tick, state))
        await asyncio.gather(*(self._submit(s, t, state, catch_up=False) for s, t, state in ticks))

    async def _submit(
        self, s: Schedule, tick: datetime, state: ScheduleState | None, *, catch_up: bool
    ) -> None:
        after: str | None = None
        if s.overlap != "allow":  # one decision for the cluster first (`overlap.py`)
            decided = await self.overlaps.decide(s, tick, state)
            if decided is None:
                return
            after = decided.after
        # `queue` stays in the schedule's document until jobs carry one (issue 8).
        spec = JobSpec(
            task=s.task,
            payload=s.payload,
            queue=s.queue,
            run_at=tick,
            idempotency_key=s.key(tick),
            schedule={"name": s.name, "tick": tick},
            # A buffered or replacing job starts once the run it follows has ended.
            depends_on=(after,) if after is not None else (),
            run_on_parent_failure=after is not None,
            start_within_s=s.start_within_s,
            deadline_s=s.deadline_s,
        )
        submitted = await persist("schedule.submit", lambda: self._insert(spec))
        job = submitted.job
        fields = job_fields(job) | {"schedule": s.name, "tick": tick.isoformat()}
        if not submitted.created:
            # Another dispatcher got there first: the usual case, and the point.
            log_event(Event.JOB_DEDUPLICATED, level="debug", **fields)
            return
        log_event(
            Event.JOB_SUBMITTED,
            **fields,
            catch_up=catch_up,
            run_at=job.run_at.isoformat(),
            **logged_bounds(job),
        )
        await persist("schedule.ticked", lambda: self.store.ticked(s.name, tick, job.id))

    async def _insert(self, spec: JobSpec) -> Submitted:
        if not spec.depends_on:
            return await self.jobs.submit(spec)
        # A workflow write: its parent is marked, and settled now if it ended meanwhile.
        [submitted] = await recheck(self.jobs, await self.jobs.submit_many([spec]), via="submit")
        return submitted
