"""Leases: the heartbeat that renews ours, and the self-fencing of those it could not renew.

The heartbeat renews every lease this dispatcher holds in one write a third of the lease
length apart; a lease it no longer holds (it froze past expiry, say) kills that worker. A
lease it could not renew (MongoDB unreachable from here, a network partition) is over by
the server's clock `lease_seconds` after the last renewal it sent (or its claim was sent): the
dispatcher fences itself (`expiries`), stopping that worker before then by its own
monotonic clock, with room for that clock to run up to `CLOCK_DRIFT` slower than the
primary's and for the kill itself (`STOP_MARGIN_S`). So no attempt runs on where the
watchdog of another dispatcher may already have requeued the job (and a limited queue freed
its queue slot): a job never runs in two places at once, partitions included. Anyone's expired
leases are requeued by the watchdog (`watchdog.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pymongo
from prometheus_client import Counter
from pymongo.errors import PyMongoError

from brook.common.protocol.runner import KillReason
from brook.common.runtime.log_events import Event, job_fields, log_event
from brook.common.runtime.metrics import (
    LEASE_RENEWALS,
    LEASES_LOST,
    LEASES_SELF_FENCED,
)
from brook.common.store.jobs import Lease
from brook.dispatcher.wiring import Wiring

Kill = Callable[[str, KillReason], bool]


def _key(lease: Lease) -> tuple[str, int]:
    return (lease.job_id, lease.attempt)

# A lease runs out `lease_seconds` after the server applied the claim or the last renewal
# it confirmed: counted here from when that claim or renewal was sent, which was earlier
# (the answer may come back seconds later, a failover's majority commit say).
# Self-fencing counts the lease down on this host's monotonic clock while the server ends it
# by its own: allow this host's clock to run up to 1% slower than the primary's (real clock
# rates differ by parts per million; NTP slews by at most 0.05%), and the worker a moment
# to die (SIGKILL, then reaped). With a 5 s lease: stopped 4.8 s after the last renewal sent.
CLOCK_DRIFT = 0.01
STOP_MARGIN_S = 0.15


class LeaseKeeper:
    def __init__(self, wiring: Wiring, kill: Kill) -> None:
        self.settings = wiring.settings
        self.store = wiring.store
        self.owner = wiring.owner
        self.holdings = wiring.holdings
        self.clock = wiring.clock
        self.kill = kill
        # By (job id, attempt), so that nothing of an attempt carries over to a later one of
        # the same job held here: time.monotonic() of the last renewal sent, and the
        # attempts stopped for a lease not renewed in time.
        self._renewed: dict[tuple[str, int], float] = {}
        self._expired: set[tuple[str, int]] = set()

    def cancel(self, job_id: str) -> None:
        """Stop the worker of a held job whose cancel was requested."""
        job = self.holdings.job(job_id)
        log_event(Event.JOB_CANCEL_REQUESTED, **(job_fields(job) if job else {"job_id": job_id}))
        self.kill(job_id, "cancelled")

    def cancel_requested(self, job_id: str) -> None:
        """The stream saw a cancel request (possibly before our claim's answer)."""
        self.holdings.note_cancel(job_id)
        if self.holdings.is_running(job_id):
            self.cancel(job_id)

    # -- heartbeat -------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            await self.renew()

    async def renew(self) -> None:
        leases = self.holdings.running()
        held = {_key(lease) for lease in leases}
        self._renewed = {k: v for k, v in self._renewed.items() if k in held}
        if not leases:
            return
        sent = time.monotonic()
        try:
            # Bounded: after a partition heals, a renewal sent on a connection that died
            # with it would wait for TCP to give up (minutes) while every lease ran out and
            # was fenced; the next beat tries again on a fresh connection.
            with pymongo.timeout(self.settings.heartbeat_seconds):
                lost = await self.store.renew(self.owner, leases, self.settings.lease_seconds)
        except PyMongoError as exc:
            log_event(Event.MONGO_UNAVAILABLE, level="warning", op="renew", error=str(exc)[:200])
            return
        for lease in leases:
            if lease.job_id not in lost:
                self._renewed[_key(lease)] = sent
        LEASE_RENEWALS.inc(len(leases) - len(lost))
        for lease in leases:
            if lease.job_id not in lost or _key(lease) in self._expired:
                continue
            now_held = self.holdings.lease(lease.job_id)
            if now_held is None or now_held.attempt != lease.attempt:
                continue  # that attempt is no longer held here
            self._stop_attempt(lease, Event.LEASE_LOST, LEASES_LOST)

    # -- leases not renewed in time -----------------------------------------------------------

    def _expires_at(self, lease: Lease) -> float:
        """When, on `time.monotonic()`, to stop the job's worker: before its lease may be
        over by the server's clock, allowing for clock drift and the kill."""
        seconds = self.settings.lease_seconds
        renewed = self._renewed.get(_key(lease))
        if renewed is None:
            renewed = self.holdings.lease_since(lease.job_id)
        return renewed + seconds * (1 - CLOCK_DRIFT) - min(STOP_MARGIN_S, seconds / 10)

    async def expiries(self) -> None:
        """Self-fencing: stop the workers of leases that could not be renewed before they
        run out."""
        while True:
            now = time.monotonic()
            pending = [
                self._expires_at(lease)
                for lease in self.holdings.running()
                if _key(lease) not in self._expired
            ]
            soonest = min(pending, default=now + self.settings.heartbeat_seconds)
            await asyncio.sleep(min(max(soonest - now, 0.05), self.settings.heartbeat_seconds))
            self.expire_overdue()

    def expire_overdue(self) -> None:
        now = time.monotonic()
        held = set()
        for lease in self.holdings.running():
            held.add(_key(lease))
            if _key(lease) not in self._expired and self._expires_at(lease) <= now:
                self._fence(lease)
        self._expired &= held

    def fence_if_overdue(self, lease: Lease) -> bool:
        """A lease just claimed whose claim's answer came back so late (a partition, a
        failover) that the lease may be over by the server's clock already: stop it before
        its task starts. True if it was."""
        if self._expires_at(lease) > time.monotonic():
            return False
        self._fence(lease)
        return True

    def _fence(self, lease: Lease) -> None:
        self._stop_attempt(
            lease,
            Event.LEASE_SELF_FENCED,
            LEASES_SELF_FENCED,
            lease_seconds=self.settings.lease_seconds,
            reason="not renewed in time (MongoDB unreachable): stopped before the lease ends",
        )

    def _stop_attempt(self, lease: Lease, event: Event, counter: Counter, **fields: Any) -> None:
        """This attempt's lease is over (or may be): stop it once, saying why."""
        self._expired.add(_key(lease))
        job = self.holdings.job(lease.job_id)
        log_event(
            event,
            level="warning",
            **(job_fields(job) if job else {"job_id": lease.job_id}),
            owner=self.owner,
            **fields,
        )
        counter.inc()
        self.kill(lease.job_id, "lease_lost")
