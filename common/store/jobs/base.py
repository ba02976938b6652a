"""`JobsCollection`: the jobs collection and what every part of the jobs store shares (the
database, the default retention, the server clock), and the one way a fenced write of a
running attempt is run (`write_held`)."""

from __future__ import annotations

from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.errors import LeaseLost
from brook.common.domain.models import Doc, Job
from brook.common.runtime.settings import WEEK_S
from brook.common.store.clock import ServerClock, ServerTime
from brook.common.store.queries import Write

JOBS = "jobs"
# How long a listing, search or grouping read may run on the server (`BROOK_QUERY_MAX_MS`).
DEFAULT_QUERY_MAX_MS = 5_000


class JobsCollection:
    def __init__(
        self,
        db: AsyncDatabase[Doc],
        *,
        retention_s: float = WEEK_S,
        clock: ServerClock | None = None,
        query_max_ms: int = DEFAULT_QUERY_MAX_MS,
    ) -> None:
        self.db = db
        self.jobs: AsyncCollection[Doc] = db[JOBS]
        # How long a finished job without its own `retention_s` is kept (the TTL's input).
        self.retention_s = retention_s
        self.clock = clock if clock is not None else ServerClock(ServerTime(db.client))
        self.query_max_ms = query_max_ms

    async def write_held(self, write: Write, lost: str) -> Job:
        """Run one fenced write of a running attempt and return the job as it left it; no
        match raises `LeaseLost` (`lost` says whose)."""
        doc = await self.jobs.find_one_and_update(
            write.filter, write.update, return_document=ReturnDocument.AFTER
        )
        if doc is None:
            raise LeaseLost(lost)
        return Job.from_doc(doc)
