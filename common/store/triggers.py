"""`TriggerStore`: the only code that touches the `brook_triggers` collection, and the one
that opens a trigger's change stream on an application's collection.

One document per trigger name: its definition as the dispatchers last declared it, and
the state they share: the `follower` holding its lease (`lease_expires_at`, on the server's
clock), the saved resume `token` (with `handled_through`, the cluster time it stands
at), `jobs_made`, `skipped` / `last_skipped` (changes that could not become a job),
`paused`, `history_lost` / `history_lost_at`, and `start_at`, the
cluster time of its first declaration (where a trigger with no token yet starts, so the
changes made between its declaration and its first follower are not missed).

Every write a follower makes is fenced by `follower: owner`: a follower that froze past
its lease and wakes to find another in its place moves nothing. The named writes are pure
builders (`acquired`, `checkpointed`, ...) that unit tests read without a database.

The trigger's change stream hands each change over undecoded (`RawBSONDocument`), and
`read_change` decodes them one by one: a change that cannot be decoded (a string that is
not UTF-8) is then one change to skip, not an error that fails the stream's whole batch
on every read, forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import ASCENDING, ReturnDocument, UpdateOne
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.errors import TriggerNotFound
from brook.common.domain.models import Doc
from brook.common.domain.triggers import (
    MAX_JOB_BYTES,
    SkippedChange,
    Trigger,
    TriggerState,
    document_id,
)
from brook.common.store.db import CODEC
from brook.common.store.fields import NOW, lit
from brook.common.store.pipelines import OVERSIZE, trigger_pipeline

TRIGGERS = "brook_triggers"


@dataclass(frozen=True)
class TriggerWrite:
    filter: dict[str, Any]
    update: list[dict[str, Any]]


def _lease_until(lease_seconds: float) -> dict[str, Any]:
    return {"$add": [NOW, int(lease_seconds * 1000)]}


def acquired(name: str, owner: str, lease_seconds: float) -> TriggerWrite:
    """Take (or keep) the trigger's lease: it is free, expired by the server's clock, or
    `owner`'s already."""
    return TriggerWrite(
        filter={
            "_id": name,
            "$or": [
                {"follower": owner},
                {"follower": None},
                {"$expr": {"$lt": ["$lease_expires_at", NOW]}},
            ],
        },
        update=[
            {"$set": {"follower": lit(owner), "lease_expires_at": _lease_until(lease_seconds)}}
        ],
    )


def checkpointed(
    name: str,
    owner: str,
    lease_seconds: float,
    *,
    token: Mapping[str, Any] | None,
    handled_through: datetime | None,
    made: int,
    last_change_at: datetime | None,
    skipped: Sequence[SkippedChange] = (),
) -> TriggerWrite:
    """Renew the lease and, with `token`, save it: the jobs of every change up to it exist
    already (`made` of them), and the `skipped` ones never will (counted in `skipped`, the
    last one kept in `last_skipped`). Fenced by `owner`."""
    fields: dict[str, Any] = {
        "lease_expires_at": _lease_until(lease_seconds),
        "jobs_made": {"$add": [{"$ifNull": ["$jobs_made", 0]}, made]},
    }
    if skipped:
        fields["skipped"] = {"$add": [{"$ifNull": ["$skipped", 0]}, len(skipped)]}
        fields["last_skipped"] = {**{k: lit(v) for k, v in skipped[-1].to_doc().items()}, "at": NOW}
    if token is not None:
        fields["token"] = lit(dict(token))
        fields["saved_at"] = NOW
        if handled_through is not None:
            fields["handled_through"] = lit(handled_through)
    if last_change_at is not None:
        fields["last_change_at"] = lit(last_change_at)
    return TriggerWrite(filter={"_id": name, "follower": owner}, update=[{"$set": fields}])


def history_lost(name: str, owner: str) -> TriggerWrite:
    """The oplog no longer holds the saved token: count it, and start again from now (no
    token, no start time). Fenced by `owner`."""
    return TriggerWrite(
        filter={"_id": name, "follower": owner},
        update=[
            {
                "$set": {
                    "history_lost": {"$add": [{"$ifNull": ["$history_lost", 0]}, 1]},
                    "history_lost_at": NOW,
                    "token": None,
                    "start_at": None,
                }
            }
        ],
    )


def released(name: str, owner: str) -> TriggerWrite:
    """Give the lease up (a stopping follower): another takes over at once."""
    return TriggerWrite(
        filter={"_id": name, "follower": owner},
        update=[{"$set": {"follower": None, "lease_expires_at": None}}],
    )


# A trigger's change stream: each change as its bytes, decoded by `read_change` one by one
# (only the top level of a change is read before: its id, its operation, its times).
RAW_CODEC = CODEC.with_options(document_class=RawBSONDocument)


def plain_token(token: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A resume token as a plain dict (a raw stream's are `RawBSONDocument`s)."""
    if token is None:
        return None
    if isinstance(token, RawBSONDocument):
        return bson.decode(token.raw, codec_options=CODEC)
    return dict(token)


def read_change(raw: RawBSONDocument) -> Doc | SkippedChange:
    """One change of a trigger's stream, decoded as Brook reads documents (`CODEC`); or, if
    it cannot be, or it came too large for a job (`OVERSIZE`), the change to skip."""
    change_id = str(raw["_id"]["_data"])
    operation = raw.get("operationType")
    try:
        change = bson.decode(raw.raw, codec_options=CODEC)
    except Exception as exc:  # bson raises several types (InvalidBSON, ...) for bad data
        reason = f"cannot be read: {type(exc).__name__}: {exc}"[:500]
        try:  # the document's key alone may still be readable
            key: Doc = {"documentKey": bson.decode(raw["documentKey"].raw, codec_options=CODEC)}
        except Exception:  # then it is not named
            key = {}
        return SkippedChange(
            change_id=change_id, operation=operation, document_id=document_id(key), reason=reason
        )
    size = change.get(OVERSIZE)
    if size is not None:
        return SkippedChange(
            change_id=change_id,
            operation=operation,
            document_id=document_id(change),
            reason=(
                f"too large: its document and update description are {size} bytes as BSON;"
                f" a trigger's job holds at most {MAX_JOB_BYTES}"
            ),
        )
    return change


class TriggerStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.db = db
        self.triggers: AsyncCollection[Doc] = db[TRIGGERS]

    async def declare(self, triggers: Sequence[Trigger], by: str) -> None:
        """Upsert each trigger's definition; a new one starts active, with no token, at the
        cluster time of this write."""
        if not triggers:
            return
        ops = [
            UpdateOne(
                {"_id": t.name},
                [
                    {
                        "$set": {
                            **{k: lit(v) for k, v in t.definition().items()},
                            "declared_by": lit(by),
                            "declared_at": NOW,
                            "paused": {"$ifNull": ["$paused", False]},
                            "jobs_made": {"$ifNull": ["$jobs_made", 0]},
                            "skipped": {"$ifNull": ["$skipped", 0]},
                            "history_lost": {"$ifNull": ["$history_lost", 0]},
                            "start_at": {
                                "$cond": [
                                    {"$eq": [{"$type": "$start_at"}, "missing"]},
                                    "$$CLUSTER_TIME",
                                    "$start_at",
                                ]
                            },
                        }
                    }
                ],
                upsert=True,
            )
            for t in triggers
        ]
        await self.triggers.bulk_write(ops, ordered=False)

    async def _apply(self, write: TriggerWrite) -> TriggerState | None:
        doc = await self.triggers.find_one_and_update(
            write.filter, write.update, return_document=ReturnDocument.AFTER
        )
        return TriggerState.from_doc(doc) if doc is not None else None

    async def acquire(self, name: str, owner: str, lease_seconds: float) -> TriggerState | None:
        """The trigger's state if `owner` holds its lease now, else None."""
        return await self._apply(acquired(name, owner, lease_seconds))

    async def checkpoint(
        self,
        name: str,
        owner: str,
        lease_seconds: float,
        *,
        token: Mapping[str, Any] | None = None,
        handled_through: datetime | None = None,
        made: int = 0,
        last_change_at: datetime | None = None,
        skipped: Sequence[SkippedChange] = (),
    ) -> TriggerState | None:
        """Renew and save (see `checkpointed`); None: `owner` lost the lease."""
        return await self._apply(
            checkpointed(
                name,
                owner,
                lease_seconds,
                token=token,
                handled_through=handled_through,
                made=made,
                last_change_at=last_change_at,
                skipped=skipped,
            )
        )

    async def lost_history(self, name: str, owner: str) -> TriggerState | None:
        return await self._apply(history_lost(name, owner))

    async def release(self, name: str, owner: str) -> None:
        write = released(name, owner)
        await self.triggers.update_one(write.filter, write.update)

    async def list_all(self) -> list[TriggerState]:
        docs = await self.triggers.find({}).sort("_id", ASCENDING).to_list()
        return [TriggerState.from_doc(d) for d in docs]

    async def get(self, name: str) -> TriggerState:
        doc = await self.triggers.find_one({"_id": name})
        if doc is None:
            raise TriggerNotFound(name)
        return TriggerState.from_doc(doc)

    async def set_paused(self, name: str, paused: bool) -> TriggerState:
        """Pause or resume, cluster-wide. The token stays: a resumed trigger makes the jobs
        of the changes made meanwhile (those the oplog still holds)."""
        doc = await self.triggers.find_one_and_update(
            {"_id": name}, {"$set": {"paused": paused}}, return_document=ReturnDocument.AFTER
        )
        if doc is None:
            raise TriggerNotFound(name)
        return TriggerState.from_doc(doc)

    async def changes(
        self,
        trigger: Trigger,
        *,
        start_after: Mapping[str, Any] | None,
        start_at: Any,
        max_await_ms: int,
    ) -> AsyncChangeStream[RawBSONDocument]:
        """The trigger's change stream on its collection (open it with `async with`): after
        `start_after` (a saved token, even an invalidating event's), else from the cluster
        time `start_at`, else from now. Its changes come undecoded: `read_change` each."""
        db = cast(
            "AsyncDatabase[RawBSONDocument]",
            self.db.client.get_database(
                trigger.db or self.db.name,
                codec_options=RAW_CODEC,
                read_concern=self.db.read_concern,
            ),
        )
        return await db[trigger.collection].watch(
            trigger_pipeline(trigger.operations, trigger.match),
            full_document=trigger.full_document,
            start_after=start_after,
            start_at_operation_time=start_at if start_after is None else None,
            max_await_time_ms=max_await_ms,
        )
