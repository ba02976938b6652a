"""`ScheduleStore`: the only code that touches the `brook_schedules` collection.

One document per schedule name: its definition as the dispatchers last declared it, and
the state they share: `paused` (set through the API), `last_tick` / `last_job_id` (the
newest tick whose job exists, only ever moved forward) and `resumed_at`; for a schedule
whose `overlap` is not `allow`, the decision of its newest decided tick (`decided_tick`,
`decision`), the tick of its newest run (`run_tick`) and the ticks it skipped (`skipped`). The jobs
themselves go through `JobStore.submit` like any other job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pymongo import ASCENDING, ReturnDocument, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.errors import ScheduleNotFound
from brook.common.domain.models import Doc
from brook.common.domain.schedules import Schedule, ScheduleState, TickDecision

SCHEDULES = "brook_schedules"


class ScheduleStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.schedules: AsyncCollection[Doc] = db[SCHEDULES]

    async def declare(self, schedules: Sequence[Schedule], by: str) -> None:
        """Upsert each schedule's definition; a new one starts active with no tick yet."""
        if not schedules:
            return
        ops = [
            UpdateOne(
                {"_id": s.name},
                {
                    "$set": {**s.definition(), "declared_by": by},
                    "$currentDate": {"declared_at": True},
                    "$setOnInsert": {"paused": False, "last_tick": None, "last_job_id": None},
                },
                upsert=True,
            )
            for s in schedules
        ]
        await self.schedules.bulk_write(ops, ordered=False)

    async def states(self, names: Sequence[str]) -> dict[str, ScheduleState]:
        docs = await self.schedules.find({"_id": {"$in": list(names)}}).to_list()
        return {str(d["_id"]): ScheduleState.from_doc(d) for d in docs}

    async def list_all(self) -> list[ScheduleState]:
        docs = await self.schedules.find({}).sort("_id", ASCENDING).to_list()
        return [ScheduleState.from_doc(d) for d in docs]

    async def set_paused(self, name: str, paused: bool) -> ScheduleState:
        """Pause or resume, cluster-wide; resuming a paused schedule stamps `resumed_at`,
        so the ticks it skipped while paused are never caught up."""
        resumed_at = (
            "$resumed_at"
            if paused
            else {"$cond": [{"$eq": ["$paused", True]}, "$$NOW", "$resumed_at"]}
        )
        doc = await self.schedules.find_one_and_update(
            {"_id": name},
            [{"$set": {"resumed_at": resumed_at}}, {"$set": {"paused": paused}}],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            raise ScheduleNotFound(name)
        return ScheduleState.from_doc(doc)

    async def ticked(self, name: str, tick: datetime, job_id: str) -> None:
        """Record that `tick`'s job exists, unless a later tick is recorded already."""
        await self.schedules.update_one(
            {"_id": name, "$or": [{"last_tick": None}, {"last_tick": {"$lt": tick}}]},
            {"$set": {"last_tick": tick, "last_job_id": job_id}},
        )

    async def decide(
        self, name: str, tick: datetime, decision: TickDecision, after: str | None
    ) -> Decided | None:
        """Record what `tick` does, once for the cluster (a schedule whose `overlap` is not
        `allow`): the first dispatcher to decide a tick later than the last decided one
        wins, by one conditional write that also moves `run_tick` (a job is made) or counts
        the skip. The others get the winner's decision for that tick, and None for a tick
        older than the last decided one (stale). `after`: the run the tick's job waits for."""
        kept = {"tick": tick, "kind": decision, "after": after}
        update: Doc = {"$set": {"decided_tick": tick, "decision": kept}}
        if decision == "skip":
            update["$inc"] = {"skipped": 1}
        else:
            update["$set"]["run_tick"] = tick
        won = await self.schedules.find_one_and_update(
            {"_id": name, "$or": [{"decided_tick": None}, {"decided_tick": {"$lt": tick}}]},
            update,
        )
        if won is not None:
            return Decided(kind=decision, after=after, won=True)
        doc = await self.schedules.find_one({"_id": name}, projection={"decision": 1})
        seen = (doc or {}).get("decision") or {}
        if seen.get("tick") is None or as_utc(seen["tick"]) != as_utc(tick):
            return None
        return Decided(kind=seen["kind"], after=seen.get("after"), won=False)


def as_utc(at: datetime) -> datetime:
    """A time read back from MongoDB (naive UTC, or aware) comparable with an aware one."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


@dataclass(frozen=True, kw_only=True)
class Decided:
    """What one tick does (`kind`), the run its job waits for (`after`), and whether this
    dispatcher's write decided it (`won`: it logs a skip, and cancels for `replace`)."""

    kind: TickDecision
    after: str | None
    won: bool
