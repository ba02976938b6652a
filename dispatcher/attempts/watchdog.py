"""The watchdog: the slow path that makes no job depend on an event.

Every sweep (`BROOK_SWEEP_SECONDS`) it requeues expired leases, anyone's (a dead or frozen
holder; a transaction its attempt left open is ended first), stops the workers of held jobs
whose cancel request the stream missed, settles the dependents of parents whose settler
died, goes down again from cancelled jobs whose spawned jobs a cut-short propagation left
(or that spawned more before they stopped), then asks the claimer to look for due work
no event announced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pymongo.errors import PyMongoError

from brook.common.client.spawned import sweep_spawned
from brook.common.domain.errors import LeaseLost
from brook.common.runtime.backoff import backoff_delay
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.metrics import LEASES_EXPIRED, count_outcome
from brook.common.store.jobs import ExpiredLease
from brook.dispatcher.attempts.dependents import Dependents
from brook.dispatcher.attempts.leases import Kill
from brook.dispatcher.wiring import Wiring


class Watchdog:
    def __init__(
        self,
        wiring: Wiring,
        kill: Kill,
        cancel: Callable[[str], None],
        swept: Callable[[], None],
        dependents: Dependents,
    ) -> None:
        """`cancel` stops the worker of a held job whose cancel was requested; `swept` is
        told after each sweep (the claimer looks for due work)."""
        self.settings = wiring.settings
        self.store = wiring.store
        self.owner = wiring.owner
        self.holdings = wiring.holdings
        self.clock = wiring.clock
        self.kill = kill
        self.cancel = cancel
        self.swept = swept
        self.dependents = dependents

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_seconds)
            await self.try_sweep()

    async def try_sweep(self) -> None:
        """A sweep that rides over an unavailable MongoDB (the next one tries again)."""
        try:
            await self.sweep()
        except PyMongoError as exc:
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="sweep", error=str(exc)[:200])

    async def sweep(self) -> None:
        """Requeue expired leases, stop workers of cancelled jobs, settle the dependents of
        parents that ended without it (their settler died), finish the cancels of spawned
        jobs cut short (`spawn_cancel`), and claim due work."""
        await self.clock.sync()
        requeued = 0
        for lease in await self.store.expired():
            try:
                if await self._requeue(lease):
                    requeued += 1
            except PyMongoError:
                raise
            except Exception as exc:  # a job written by hand, with fields Brook cannot read
                log_event(
                    Event.SWEEP_SKIPPED,
                    level="error",
                    **job_fields(lease),
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
        held = [lease.job_id for lease in self.holdings.running()]
        for job_id in await self.store.cancel_requested(self.owner, held):
            self.cancel(job_id)
        self.holdings.forget_old_cancels()
        parents = await self.dependents.sweep()
        spawners = await sweep_spawned(self.store)
        if requeued or parents or spawners:
            log_event(
                Event.SWEEP_DONE,
                requeued=requeued,
                parents_settled=parents,
                spawn_cancels=spawners,
            )
        self.swept()

    async def _requeue(self, lease: ExpiredLease) -> bool:
        s = self.settings
        if lease.tx_session is not None:
            # The frozen or dead holder's attempt had a transaction open (`ctx.transaction()`,
            # with locks on what it wrote, maybe on this job): end it, so that nothing of it
            # can commit later and the next attempt does not wait out MongoDB's lifetime limit.
            try:
                await self.store.kill_sessions([lease.tx_session])
            except PyMongoError as exc:
                log_event(
                    Event.MONGO_UNAVAILABLE,
                    level="warning",
                    op="end_transaction",
                    error=str(exc)[:200],
                )
            else:
                log_event(Event.TRANSACTION_ENDED, **job_fields(lease), owner=lease.owner)
        delay = backoff_delay(lease.attempt, s.retry_base_seconds, s.retry_cap_seconds)
        try:
            job = await self.store.requeue_expired(lease, delay)
        except LeaseLost:
            return False  # renewed or finished meanwhile
        LEASES_EXPIRED.inc()
        count_outcome(lease, "expired")
        log_event(
            Event.LEASE_EXPIRED,
            level="warning",
            **job_fields(lease),
            owner=lease.owner,
            status=job.status.value,
        )
        if lease.owner == self.owner:
            self.kill(lease.job_id, "lease_lost")
        return True
