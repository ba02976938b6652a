"""The `brook_signals` collection: one document per signal key, the latest payload sent on
it, kept for `BROOK_SIGNAL_RETENTION_SECONDS` (a TTL index deletes it after; reads ignore
one past its time before the TTL monitor gets to it).

A signal wakes the jobs waiting on its key through the jobs collection
(`brook.common.store.queries.woken_by_signal`, run by the jobs store): the dispatchers hear of
it on their change stream. Sending stores the signal first, then wakes; a job that starts
to wait reads the signal after its suspension is written (`dispatcher.suspensions`). So
whichever of the two comes second sees the other: no wait misses a signal sent meanwhile.
"""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.models import Doc
from brook.common.store.db import ensure_indexes
from brook.common.store.fields import NOW, after, lit

SIGNALS = "brook_signals"

SIGNAL_INDEXES = [
    IndexModel([("expire_at", ASCENDING)], name="signal_retention", expireAfterSeconds=0),
]


def signal_stored(key: str, payload: Any, retention_s: float) -> tuple[dict[str, Any], Any]:
    """The upsert of a signal on `key`: its payload replaces any earlier one's."""
    return (
        {"_id": key},
        [
            {
                "$set": {
                    "payload": lit(payload),
                    "sent_at": NOW,
                    "expire_at": after(retention_s * 1000),
                    "count": {"$add": [{"$ifNull": ["$count", 0]}, 1]},
                }
            }
        ],
    )


def live_signal(key: str) -> dict[str, Any]:
    """The signal on `key`, if it is still kept (by the server's clock)."""
    return {"_id": key, "$expr": {"$gt": ["$expire_at", NOW]}}


class SignalStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.signals: AsyncCollection[Doc] = db[SIGNALS]
        self._indexed = False

    async def ensure_indexes(self) -> None:
        if not self._indexed:
            await ensure_indexes(self.signals, SIGNAL_INDEXES)
            self._indexed = True

    async def put(self, key: str, payload: Any, retention_s: float) -> None:
        """Store the signal, majority-written (the database's write concern)."""
        await self.ensure_indexes()
        query, update = signal_stored(key, payload, retention_s)
        await self.signals.update_one(query, update, upsert=True)

    async def get(self, key: str) -> tuple[bool, Any]:
        """(True, payload) if a signal on `key` is kept, else (False, None)."""
        doc = await self.signals.find_one(live_signal(key), projection={"payload": 1})
        if doc is None:
            return False, None
        return True, doc.get("payload")
