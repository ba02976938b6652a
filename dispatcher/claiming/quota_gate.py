"""QuotaGate: the admission of jobs that draw on quotas (a provider's tokens and requests per
minute, its calls at once), shared by every queue and task, cluster-wide.

A job names its quotas with their costs (`quotas` at submit), or takes its task's default
(`@task(..., quotas=...)`, read here: the dispatchers import the task modules); a value given
at submit wins. Each job a claim policy won is asked about here before it may wait for a
worker: every quota it names is charged (its cost in units, one request, one hold of its
concurrency) in `brook_quotas`, or the job goes back to pending at once, due when the quota
that refused it should have room, saying so (`waiting_for: {"kind": "quota", "name"}`). A
job that draws on no quota is admitted without a round trip.

When an attempt ends its holds are released (the units stay charged: the provider may have
been called), and one job held back by the quota is woken, so a slot freed is used at once,
not at a timer. The hold of an attempt whose dispatcher died is dropped once its job shows
it over (`QuotaStore.prune`, when a quota is found full).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from pymongo.errors import PyMongoError

from brook.common.domain.errors import QuotaNotFound
from brook.common.domain.models import Job
from brook.common.domain.quotas import Quota, Refused, Start
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.store.jobs import Lease
from brook.common.store.quotas import QuotaStore
from brook.dispatcher.wiring import Wiring

# A job naming a quota that does not exist (a task's default with a typo, or a quota
# deleted since its submit) is looked at again this long after.
UNKNOWN_RECHECK_S = 30.0

# A quota holding this many attempts (more than its concurrency) is checked for holds of
# attempts that are over (a dead dispatcher's), which nothing else would release.
PRUNE_AT = 256

# A key refused from the cache is written as waiting at most this often per quota.
WAITING_EVERY_S = 0.5

Costs = Mapping[str, int]


class QuotaGate:
    def __init__(
        self, wiring: Wiring, store: QuotaStore, defaults: Mapping[str, Costs] | None = None
    ) -> None:
        self.store = store
        self.sweep_s = wiring.settings.sweep_seconds
        self.owner = wiring.owner
        self.spawn = wiring.spawn
        self.defaults = dict(defaults or {})
        # Set by the dispatcher: a job admitted waits for a worker (`start`); one that cannot
        # be held back is handed back (`refuse`).
        self.start: Callable[[Job, float], None] = lambda job, sent: None
        self.refuse: Callable[[Job, float], None] = lambda job, sent: None
        # One charge of a quota at a time here: a batch of claimed jobs would otherwise race
        # each other's writes on its one document. And a quota found full (or closed) is not
        # asked again before the moment it gave: the jobs claimed meanwhile wait at once.
        self._locks: dict[str, asyncio.Lock] = {}
        self._full: dict[str, Refused] = {}
        self._noted: dict[tuple[str, str], float] = {}  # (quota, key): last noted waiting

    def costs(self, job: Job) -> Costs:
        """The quotas a job draws on: its own, else its task's default."""
        if job.quotas is not None:
            return job.quotas
        return self.defaults.get(job.task, {})

    def take(self, job: Job, sent: float) -> None:
        """A job a claim policy won: started at once if it draws on no quota; else its
        quotas are charged first (`start`), or it is held back (if that write fails,
        `refuse`d: handed back the usual way)."""
        if not self.costs(job):
            self.start(job, sent)
            return
        self.spawn(self._admit(job, sent), f"quota:{job.id}")

    async def _admit(self, job: Job, sent: float) -> None:
        try:
            refused = await self._charge_all(job)
            if refused is None:
                self.start(job, sent)
                return
            name, why = refused
            # Scattered over the refusal's spread (a bucket of the window): the jobs held
            # back together are not let in together.
            jitter = random.uniform(0, max(why.spread, 0.05))
            until = datetime.fromtimestamp(why.retry_at + jitter, UTC)
            lease = Lease(job_id=job.id, attempt=job.attempts)
            await self.store.hold_back(lease, self.owner, name, why.reason, until)
            log_event(
                Event.QUOTA_HELD, **job_fields(job), quota=name, reason=why.reason, until=until
            )
        except PyMongoError as exc:
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="quota", error=str(exc)[:200])
            self.refuse(job, sent)

    async def _charge_all(self, job: Job) -> tuple[str, Refused] | None:
        """Charge every quota the job names, in name order (so two dispatchers never wait on
        each other's); on a refusal, the charges made already are refunded."""
        charged: list[str] = []
        for name, cost in sorted(self.costs(job).items()):
            s = Start(job=job.id, attempt=job.attempts, owner=self.owner, key=job.key, cost=cost)
            try:
                out = await self._charge(name, s)
            except QuotaNotFound:
                log_event(
                    Event.QUOTA_HELD, level="error", **job_fields(job), quota=name, reason="unknown"
                )
                out = Refused(reason="unknown", retry_at=_now() + UNKNOWN_RECHECK_S)
            if isinstance(out, Refused):
                for done in charged:
                    await self.store.refund(done, job.id, job.attempts)
                if out.reason in ("concurrency", "fair"):
                    await self.store.prune(name)
                if out.reason == "fair":
                    # The room this key may not take is another key's: wake one of theirs.
                    await self.store.wake(name, 1, not_key=job.key)
                return name, out
            charged.append(name)
            if len(out.holders) >= PRUNE_AT and len(out.holders) > (out.concurrency or 0):
                await self.store.prune(name)  # holds of dead dispatchers' attempts
        return None

    async def _charge(self, name: str, start: Start) -> Quota | Refused:
        full = self._full.get(name)
        if full is not None and full.retry_at > _now():
            await self._waits(name, start.key)
            return full
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            full = self._full.get(name)
            if full is not None and full.retry_at > _now():
                await self._waits(name, start.key)
                return full
            out = await self.store.charge(name, start)
        if isinstance(out, Refused) and out.reason in ("closed", "units", "requests"):
            self._full[name] = out
        return out

    async def _waits(self, name: str, key: str | None) -> None:
        """A keyed job refused from the cache still counts its key among those waiting for
        room (fair shares), written at most once in `WAITING_EVERY_S` per quota and key: a
        tenant whose jobs this dispatcher holds back unasked keeps its claim to a share."""
        if key is None:
            return
        now = _now()
        if now - self._noted.get((name, key), 0.0) < WAITING_EVERY_S:
            return
        if len(self._noted) > 10_000:
            self._noted.clear()  # many tenants: forget, at the price of a write each
        self._noted[(name, key)] = now
        await self.store.waiting(name, key)

    async def run(self) -> None:
        """Every sweep: drop the holds of attempts that are over by their jobs (a dispatcher
        was killed while its jobs held a quota; the watchdog requeued them), in each quota
        this dispatcher has charged, so that none stays counted as running."""
        while True:
            await asyncio.sleep(self.sweep_s)
            for name in list(self._locks):
                try:
                    await self.store.prune(name)
                except QuotaNotFound:
                    self._locks.pop(name, None)
                except PyMongoError as exc:
                    log_event(
                        Event.MONGO_UNAVAILABLE, level="warning", op="quota", error=str(exc)[:200]
                    )

    def ended(self, job: Job) -> None:
        """An attempt of `job` is over here: its holds go, and a job waiting on each quota
        is woken (a slot may be free)."""
        names = list(self.costs(job))
        if names:
            self.spawn(self._release(job, names), f"quota-release:{job.id}")

    async def _release(self, job: Job, names: list[str]) -> None:
        for name in names:
            try:
                self._full.pop(name, None)  # a usage report may have refunded units
                if await self.store.release(name, job.id, job.attempts):
                    await self.store.wake(name, 1)
            except PyMongoError as exc:
                # Left to `prune`: the job shows its attempt over.
                log_event(
                    Event.MONGO_UNAVAILABLE, level="warning", op="quota", error=str(exc)[:200]
                )


def _now() -> float:
    return datetime.now(UTC).timestamp()
