"""`QuotaStore`: the only code that touches `brook_quotas` and `brook_quota_ledger`.

One document per quota (its `_id` is the quota's name):

    {units: {limit, per_seconds}|null, requests: {limit, per_seconds}|null,
     concurrency: int|null, version: int,
     buckets: {units: [{t, n, keys: [{k, n}]}], requests: [...]},   # the windows' usage
     holders: [{job, attempt, owner, key, units, t, reported, estimate}],  # attempts holding it
     closed_until, factor, strikes, last_429, calm_since, waiting: [{k, at}],
     learned: {est, used},                                         # the usage ratio's sums
     created_at, updated_at}

Every change of a quota's state is computed by `brook.common.domain.quotas` from the document
as read (with the server's clock, `$$NOW`, read in the same round trip) and written only if
no other write came between (`version`): a lost race reads again. A charge names the attempt
and its owner. A usage report writes its job first, fenced by attempt and owner (an attempt
whose lease is lost charges nothing more), then the correction in one atomic update of the
quota (no read-compute-write: the reports of many jobs in flight do not race each other's
retries on the one document). Closing a quota on a 429 that loses every race is written
atomically too (`$max` of `closed_until`).

Its cost ledger is `QuotaLedger`'s (`quota_ledger.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.synchronous.database import Database

from brook.common.domain.errors import InvalidInput, LeaseLost, QuotaNotFound
from brook.common.domain.models import Doc
from brook.common.domain.quota_specs import NO_LIMIT, has_limit
from brook.common.domain.quotas import (
    Holder,
    Quota,
    Refused,
    Start,
    admit,
    learned,
    rate_limited,
    refunded,
    released,
    waiting_key,
)
from brook.common.store.fields import NOW
from brook.common.store.jobs.base import JOBS
from brook.common.store.queries import quotas as quota_queries
from brook.common.store.queries.base import running_fence
from brook.common.store.quota_ledger import QuotaLedger
from brook.common.store.records import Lease

QUOTAS = "brook_quotas"
LIMIT_FIELDS = ("units", "requests", "concurrency")
MAX_TRIES = 50  # writes lost to racing ones before a charge gives up (it is refused)


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


class QuotaStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.db = db
        self.quotas: AsyncCollection[Doc] = db[QUOTAS]
        self.ledger = QuotaLedger(db)
        self.jobs: AsyncCollection[Doc] = db[JOBS]

    # -- the limits --------------------------------------------------------------------------

    async def set_limits(self, name: str, changes: Mapping[str, Any]) -> Quota:
        """Set the limits given (the others keep their value); `InvalidInput` (nothing
        stored) if the quota would be left with none."""
        existing = await self.quotas.find_one(
            {"_id": name}, projection=dict.fromkeys(LIMIT_FIELDS, 1)
        )
        merged = {**{f: (existing or {}).get(f) for f in LIMIT_FIELDS}, **changes}
        if not has_limit(merged):
            raise InvalidInput(NO_LIMIT)
        await self.quotas.update_one(
            {"_id": name},
            {
                "$set": dict(changes),
                "$inc": {"version": 1},
                "$currentDate": {"updated_at": True},
                "$setOnInsert": {
                    **{f: None for f in LIMIT_FIELDS if f not in changes},
                    "created_at": datetime.now(UTC),
                    "factor": 1.0,
                    "holders": [],
                },
            },
            upsert=True,
        )
        quota = await self.read(name)
        assert quota is not None
        return quota

    async def delete(self, name: str) -> bool:
        res = await self.quotas.delete_one({"_id": name})
        return res.deleted_count == 1

    async def read(self, name: str, session: AsyncClientSession | None = None) -> Quota | None:
        """The quota with the server's clock (`now`) in one round trip."""
        docs = await (
            await self.quotas.aggregate(
                [{"$match": {"_id": name}}, {"$set": {"now": NOW}}], session=session
            )
        ).to_list()
        return Quota.from_doc(docs[0]) if docs else None

    async def all(self) -> list[Quota]:
        docs = await (
            await self.quotas.aggregate([{"$sort": {"_id": 1}}, {"$set": {"now": NOW}}])
        ).to_list()
        return [Quota.from_doc(d) for d in docs]

    async def named(self, names: Iterable[str]) -> dict[str, Quota]:
        """The quotas of these names that exist (their limits), by name."""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        docs = await self.quotas.find(
            {"_id": {"$in": wanted}}, projection=dict.fromkeys(LIMIT_FIELDS, 1)
        ).to_list()
        return {str(d["_id"]): Quota.from_doc(d) for d in docs}

    # -- state changes -----------------------------------------------------------------------

    async def _change(
        self,
        name: str,
        step: Callable[[Quota, datetime], Quota | Refused | None],
        session: AsyncClientSession | None = None,
    ) -> tuple[Quota, Quota | Refused | None]:
        """Read the quota, compute its next state (`step`: a `Quota` to write, else written
        nothing), write it unless another write came between, and try again if one did.
        Raises `QuotaNotFound`."""
        q: Quota | None = None
        now = datetime.now(UTC)
        for _ in range(MAX_TRIES):
            q = await self.read(name, session)
            if q is None or q.now is None:
                raise QuotaNotFound(name)
            now = _aware(q.now)
            out = step(q, now)
            if not isinstance(out, Quota):
                return q, out
            res = await self.quotas.update_one(
                {"_id": name, "version": q.version},
                {"$set": out.state_doc(), "$inc": {"version": 1}},
                session=session,
            )
            if res.matched_count == 1:
                return q, out
        assert q is not None
        return q, Refused(reason="busy", retry_at=now.timestamp() + 0.05)

    async def charge(self, name: str, start: Start) -> Quota | Refused:
        """Charge a start (its cost in units, one request, one hold), or say why not and
        until when; a refused key is counted as waiting (fair shares)."""
        before, out = await self._change(name, lambda q, now: admit(q, start, now))
        if isinstance(out, Quota):
            if len(out.holders) > len(before.holders):
                await self.ledger.book(name, start.key, before.now, float(start.cost), 1)
            return out
        assert isinstance(out, Refused)
        if start.key is not None and out.reason != "closed":
            await self._change(name, lambda q, now: waiting_key(q, start.key, now))
        return out

    async def waiting(self, name: str, key: str) -> None:
        """Count `key` among the keys refused room now (fair shares)."""
        await self._change(name, lambda q, now: waiting_key(q, key, now))

    async def release(self, name: str, job: str, attempt: int) -> bool:
        """An attempt's hold is over (its units stay charged); whether it held one."""
        res = await self.quotas.update_one(
            {"_id": name, "holders": {"$elemMatch": {"job": job, "attempt": attempt}}},
            {"$pull": {"holders": {"job": job, "attempt": attempt}}, "$inc": {"version": 1}},
        )
        return res.modified_count == 1

    async def refund(self, name: str, job: str, attempt: int) -> None:
        """A charge whose job did not start after all (another quota refused it)."""
        await self._change(name, lambda q, now: refunded(q, job, attempt, now))

    async def prune(self, name: str) -> int:
        """Drop the holds of attempts that are over by their jobs (a dispatcher died while
        its jobs held the quota): how many. Only holds the jobs show over, never a timer."""
        q = await self.read(name)
        if q is None or not q.holders:
            return 0
        ids = list({h.job for h in q.holders})
        running = {
            (d["_id"], d.get("attempts"))
            for d in await self.jobs.find(
                {"_id": {"$in": ids}, "status": "running"}, projection={"attempts": 1}
            ).to_list()
        }
        dead = [(h.job, h.attempt) for h in q.holders if (h.job, h.attempt) not in running]
        if not dead:
            return 0

        def step(q: Quota, now: datetime) -> Quota:
            for job, attempt in dead:
                q = released(q, job, attempt)
            return q

        await self._change(name, step)
        return len(dead)

    async def usage(
        self, name: str, lease: Lease, owner: str, total: float, said: float | None = None
    ) -> float:
        """An attempt's real usage so far (`ctx.usage`, called at `said` on this process's
        monotonic clock; None: now): the attempt's charge is moved to the window's bucket of
        that moment and corrected to `total`, and the usage ratio learns from it
        (`quota_queries.usage_reported`). Fenced: the job's own write (`quota_usage`, on
        its running attempt and owner) comes first, and `LeaseLost` if it matches nothing;
        then one atomic update of the quota, conditioned on what the attempt's hold was
        charged so far (a report racing another is read again). The difference; 0 if the
        attempt holds no charge of this quota."""
        job = await self.jobs.update_one(
            running_fence(lease, owner), {"$set": {f"quota_usage.{name}": total}}
        )
        if job.matched_count == 0:
            raise LeaseLost(f"job {lease.job_id} attempt {lease.attempt} is no longer held")
        for _ in range(MAX_TRIES):
            q = await self.quotas.find_one({"_id": name}, projection={"holders": 1})
            held = [
                h
                for h in (q or {}).get("holders") or ()
                if h.get("job") == lease.job_id and h.get("attempt") == lease.attempt
            ]
            if not held:
                return 0.0
            holder = Holder.from_doc(held[0])
            delta = total - holder.units
            est, used = learned(holder, total)
            ago_ms = 0 if said is None else max(int((time.monotonic() - said) * 1000), 0)
            write = quota_queries.usage_reported(name, holder, total, ago_ms, est, used)
            res = await self.quotas.update_one(write.filter, write.update)
            if res.matched_count == 1:
                if delta:
                    doc = await self.jobs.find_one({"_id": lease.job_id}, projection={"key": 1})
                    await self.ledger.book(name, (doc or {}).get("key"), None, delta, 0)
                return delta
        return 0.0

    async def rate_limited(
        self, name: str, delay_s: float, attempt: tuple[str, int] | None = None
    ) -> Quota:
        """A 429 (to `attempt`, a job and its attempt): the quota is closed for everyone
        until `delay_s` from now on the server's clock (the adaptive rule lowers its rate on
        repeats)."""
        before, out = await self._change(
            name, lambda q, now: rate_limited(q, delay_s, now, attempt)
        )
        if not isinstance(out, Quota):
            # Lost every race (a burst of 429s at once): close it all the same, atomically
            # (a later close wins); the adaptive rule counts this one with the others.
            assert before.now is not None
            until = _aware(before.now) + timedelta(seconds=delay_s)
            await self.quotas.update_one(
                {"_id": name}, {"$max": {"closed_until": until}, "$inc": {"version": 1}}
            )
            closed = _aware(before.closed_until) if before.closed_until else until
            out = replace(before, closed_until=max(until, closed))
        await self.ledger.book_429(name)
        return out

    # -- the jobs waiting for a quota ------------------------------------------------------

    async def hold_back(
        self, lease: Lease, owner: str, name: str, reason: str, until: datetime
    ) -> bool:
        """A claimed job this quota has no room for: back to pending, due `until`."""
        write = quota_queries.held_by_quota(lease, owner, name, reason, until)
        res = await self.jobs.update_one(write.filter, write.update)
        return res.modified_count == 1

    async def wake(self, name: str, n: int, not_key: str | None = None) -> int:
        """Make up to `n` jobs held back by `name` due now (best first): it has room again
        (with `not_key`: for the other keys than that one, which just had its share)."""
        if n <= 0:
            return 0
        query = quota_queries.quota_waiters(name)
        if not_key is not None:
            query["key"] = {"$ne": not_key}
        docs = await self.jobs.find(
            query,
            projection={"_id": 1},
            sort=[("priority", -1), ("run_at", 1)],
            limit=n,
        ).to_list()
        if not docs:
            return 0
        write = quota_queries.woken_for_quota(name, [d["_id"] for d in docs])
        res = await self.jobs.update_many(write.filter, write.update)
        return res.modified_count


def named_blocking(db: Database[Doc], names: Iterable[str]) -> dict[str, Quota]:
    """`QuotaStore.named` on a blocking client (a submit in a blocking caller's session)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    docs = db[QUOTAS].find({"_id": {"$in": wanted}}, projection=dict.fromkeys(LIMIT_FIELDS, 1))
    return {str(d["_id"]): Quota.from_doc(d) for d in docs}
