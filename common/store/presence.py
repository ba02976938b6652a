"""`PresenceStore`: the only code that touches the `brook_dispatchers` collection.

One document per running dispatcher (its `_id` is the dispatcher's owner id): the tasks it
runs, the queues it serves and `seen_at`, refreshed by its heartbeat on the server's clock.
Clients and the API check task names against the live ones (`live_filter`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.models import Doc
from brook.common.store.db import ensure_indexes
from brook.common.store.fields import NOW, lit

DISPATCHERS = "brook_dispatchers"
# A dispatcher is live while it was seen within this many of its lease lengths.
LIVE_LEASES = 3
# What is left of a dispatcher that vanished without retiring is deleted after a day.
PRESENCE_TTL_S = 86400

PRESENCE_INDEXES = [
    IndexModel([("seen_at", ASCENDING)], name="forget", expireAfterSeconds=PRESENCE_TTL_S),
]


@dataclass(frozen=True, kw_only=True)
class LiveDispatcher:
    """A live dispatcher as it published itself: the tasks it runs and the queues it serves
    (None: every queue)."""

    owner: str
    name: str
    tasks: frozenset[str]
    queues: dict[str, int] | None
    seen_at: datetime

    @classmethod
    def from_doc(cls, d: Doc) -> LiveDispatcher:
        return cls(
            owner=str(d["_id"]),
            name=str(d.get("name", "")),
            tasks=frozenset(d.get("tasks") or ()),
            queues=d.get("queues"),
            seen_at=d["seen_at"],
        )


def live_filter() -> dict[str, Any]:
    """Dispatchers seen within LIVE_LEASES of their lease length, by the server's clock."""
    window = {"$multiply": ["$lease_seconds", LIVE_LEASES * 1000]}
    return {"$expr": {"$gte": [{"$add": ["$seen_at", window]}, NOW]}}


def announced(
    *, name: str, tasks: Collection[str], queues: Mapping[str, int] | None, lease_seconds: float
) -> list[dict[str, Any]]:
    """A dispatcher's document as it publishes (or refreshes) itself."""
    return [
        {
            "$set": {
                "name": lit(name),
                "tasks": lit(sorted(tasks)),
                "queues": lit(dict(queues) if queues is not None else None),
                "lease_seconds": lease_seconds,
                "started_at": {"$ifNull": ["$started_at", NOW]},
                "seen_at": NOW,
            }
        }
    ]


class PresenceStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.dispatchers: AsyncCollection[Doc] = db[DISPATCHERS]

    async def ensure_indexes(self) -> None:
        await ensure_indexes(self.dispatchers, PRESENCE_INDEXES)

    async def announce(
        self,
        owner: str,
        *,
        name: str,
        tasks: Collection[str],
        queues: Mapping[str, int] | None,
        lease_seconds: float,
    ) -> None:
        """Publish (or refresh) what this dispatcher runs: clients and the API check task
        names against the live dispatchers' tasks."""
        await self.dispatchers.update_one(
            {"_id": owner},
            announced(name=name, tasks=tasks, queues=queues, lease_seconds=lease_seconds),
            upsert=True,
        )

    async def seen(self, owner: str) -> bool:
        """The dispatcher is alive (its heartbeat); False if its document is gone."""
        res = await self.dispatchers.update_one({"_id": owner}, [{"$set": {"seen_at": NOW}}])
        return res.matched_count == 1

    async def retire(self, owner: str) -> None:
        await self.dispatchers.delete_one({"_id": owner})

    async def live_dispatchers(self) -> list[LiveDispatcher]:
        """Dispatchers seen within LIVE_LEASES of their lease length, by the server's clock."""
        docs = await self.dispatchers.find(live_filter()).to_list()
        return [LiveDispatcher.from_doc(d) for d in docs]
