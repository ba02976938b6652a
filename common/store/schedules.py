"""`ScheduleStore`: the only code that touches the `brook_schedules` collection.

One document per schedule name: its definition as the dispatchers last declared it, and
the state they share: `paused` (set through the API), `last_tick` / `last_job_id` (the
newest tick whose job exists, only ever moved forward) and `resumed_at`. The jobs
themselves go through `JobStore.submit` like any other job.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pymongo import ASCENDING, ReturnDocument, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.errors import ScheduleNotFound
from brook.common.domain.models import Doc
from brook.common.domain.schedules import Schedule, ScheduleState

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
