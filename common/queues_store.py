"""`QueueStore`: the only code that touches the `brook_queues` collection.

One document per queue that was ever given a limit (its `_id` is the queue's name):

    {concurrency: int|null, rate: {limit, per_seconds}|null, paused: bool,
     tickets: [{id, owner, n, jobs: [job ids], claim_by}],   # claims in flight
     slots:   [{job, attempt, tag, owner}],                  # held by running attempts
     starts:  [datetime],                                    # starts inside the rate window
     updated_at, released_at}

A claim in a limited queue takes its slots first, then the jobs:

1. `acquire`: one conditional write takes a **ticket** for up to `n` slots, for the jobs it
   names, if the queue is not paused and has room by its concurrency and its rate window
   (all on the server's clock). The ticket is valid until `claim_by`.
2. `JobStore.claim_tagged`: the jobs are claimed only while `$$NOW < claim_by`, and carry
   the ticket's id (`claim_tag`).
3. `settle`: the ticket becomes one slot per job it won, and their `started_at` join
   `starts`; the rest of the ticket is given back.
4. `release`: after a job's final write, its holder removes its slot.

So every running job of a limited queue is covered by a ticket or a slot, at every instant:
its slot is taken before it starts and given back after it stopped. Nothing here expires
on a timer, so a slow heartbeat can never free a slot under a running job. What a dead
dispatcher leaves behind (a ticket never settled, a slot never released) is freed by
`prune`, which frees only what the jobs themselves show is over: a slot whose job is no
longer running under it, a ticket past `claim_by` (no claim can use it any more) minus
the jobs it really claimed. The jobs are read from the primary (local read concern): a
claim the primary has applied but not yet replicated must count.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pymongo import ReturnDocument
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.read_concern import ReadConcern

from common.models import Doc
from common.queues import QueueDoc, SlotEntry, Ticket, live_slots, slot_ids, won_by
from common.store import JOBS

QUEUES = "brook_queues"
NOW = "$$NOW"
CONFIG_FIELDS = ("concurrency", "rate", "paused")
_DEFAULTS: dict[str, Any] = {"concurrency": None, "rate": None, "paused": False}


def _lit(value: Any) -> dict[str, Any]:
    return {"$literal": value}


def _list(field: str) -> dict[str, Any]:
    return {"$ifNull": [f"${field}", []]}


def _window_start() -> dict[str, Any]:
    """The start of the rate window ending now (null without a rate)."""
    return {"$subtract": [NOW, {"$toLong": {"$multiply": ["$rate.per_seconds", 1000]}}]}


def _room(n: int) -> dict[str, Any]:
    """How many of `n` slots the queue can give now: 0 while paused, else bounded by the
    concurrency (tickets and held slots count) and by the starts left in the rate window
    (recorded starts, and each ticket's `n` while its `claim_by` is in the window)."""
    since = _window_start()
    used = {"$add": [{"$size": _list("slots")}, {"$sum": "$tickets.n"}]}
    by_concurrency = {
        "$cond": [
            {"$eq": [{"$ifNull": ["$concurrency", None]}, None]},
            n,
            {"$subtract": ["$concurrency", used]},
        ]
    }
    in_window = {
        "$add": [
            {"$size": {"$filter": {"input": _list("starts"), "cond": {"$gt": ["$$this", since]}}}},
            {
                "$sum": {
                    "$map": {
                        "input": {
                            "$filter": {
                                "input": _list("tickets"),
                                "cond": {"$gt": ["$$this.claim_by", since]},
                            }
                        },
                        "in": "$$this.n",
                    }
                }
            },
        ]
    }
    by_rate = {
        "$cond": [
            {"$eq": [{"$ifNull": ["$rate", None]}, None]},
            n,
            {"$subtract": ["$rate.limit", in_window]},
        ]
    }
    return {
        "$cond": [
            {"$eq": ["$paused", True]},
            0,
            {"$max": [0, {"$min": [n, by_concurrency, by_rate]}]},
        ]
    }


@dataclass(frozen=True, kw_only=True)
class Won:
    """A job a ticket's claim took: the slot it holds and the start that counts."""

    job_id: str
    attempt: int
    started_at: datetime


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """What `prune` freed: slots of attempts that are over, and stale tickets."""

    slots: list[SlotEntry]
    tickets: list[Ticket]
    freed: int


@dataclass(frozen=True, kw_only=True)
class QueueUsage:
    """A limited queue now: its limits, slots in use, starts in the current rate window."""

    doc: QueueDoc
    in_use: int
    in_window: int


class QueueStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.queues: AsyncCollection[Doc] = db[QUEUES]
        # The slots' jobs are read from the primary as it is: a claim it has applied counts
        # even before it is majority-committed (see `prune`).
        self.jobs: AsyncCollection[Doc] = db[JOBS].with_options(read_concern=ReadConcern("local"))

    # -- limits ----------------------------------------------------------------------------

    async def set_limits(self, name: str, changes: Mapping[str, Any]) -> QueueDoc:
        """Set the limits given (the others keep their value), cluster-wide. Jobs of the queue
        already running when it gets a concurrency are counted from now on (`adopt`)."""
        update: dict[str, Any] = {
            "$currentDate": {"updated_at": True},
            "$setOnInsert": {
                **{k: v for k, v in _DEFAULTS.items() if k not in changes},
                "tickets": [],
                "slots": [],
                "starts": [],
            },
        }
        if changes:
            update["$set"] = dict(changes)
        doc = await self.queues.find_one_and_update(
            {"_id": name}, update, upsert=True, return_document=ReturnDocument.AFTER
        )
        assert doc is not None
        queue = QueueDoc.from_doc(doc)
        if queue.limits.concurrency is not None:
            running = await self.jobs.find(
                {"status": "running", "queue": name},
                projection={"attempts": 1},
                hint="lease_expiry",
            ).to_list()
            await self.adopt(
                name, [(str(d["_id"]), int(d["attempts"]), secrets.token_hex(8)) for d in running]
            )
        return queue

    async def limits(self) -> dict[str, QueueDoc]:
        """Every queue document's limits (no slots), by name: the dispatchers' view."""
        docs = await self.queues.find(
            {}, projection={field: 1 for field in CONFIG_FIELDS}
        ).to_list()
        return {str(d["_id"]): QueueDoc.from_doc(d) for d in docs}

    async def read(self, name: str) -> QueueDoc | None:
        """The queue's document with the server's clock (`now`) in one round trip."""
        docs = await (
            await self.queues.aggregate([{"$match": {"_id": name}}, {"$set": {"now": NOW}}])
        ).to_list()
        return QueueDoc.from_doc(docs[0]) if docs else None

    async def changes(self, *, max_await_ms: int) -> AsyncChangeStream[Doc]:
        """A change stream of the queue documents (open it with `async with`): each event
        names the queue and the top-level fields it changed (`keys`), nothing more."""
        updated = {"$ifNull": ["$updateDescription.updatedFields", {}]}
        return await self.queues.watch(
            [
                {
                    "$project": {
                        "operationType": 1,
                        "documentKey": 1,
                        "keys": {
                            "$map": {
                                "input": {"$objectToArray": updated},
                                "in": {"$arrayElemAt": [{"$split": ["$$this.k", "."]}, 0]},
                            }
                        },
                    }
                }
            ],
            max_await_time_ms=max_await_ms,
        )

    # -- a claim's slots -----------------------------------------------------------------------

    async def acquire(
        self, name: str, *, owner: str, tag: str, jobs: Sequence[str], claim_window_s: float
    ) -> Ticket | None:
        """Take a ticket for up to `len(jobs)` slots (at least one), or None: the queue is
        paused, full, out of starts for its rate window, or has no document."""
        room = _room(len(jobs))
        ticket = {
            "id": _lit(tag),
            "owner": _lit(owner),
            "n": room,
            "jobs": _lit(list(jobs)),
            "claim_by": {"$add": [NOW, int(claim_window_s * 1000)]},
        }
        doc = await self.queues.find_one_and_update(
            {"_id": name, "$expr": {"$gt": [room, 0]}},
            [{"$set": {"tickets": {"$concatArrays": [_list("tickets"), [ticket]]}}}],
            projection={"tickets": {"$elemMatch": {"id": tag}}},
            return_document=ReturnDocument.AFTER,
        )
        if doc is None or not doc.get("tickets"):
            return None
        return Ticket.from_doc(doc["tickets"][0])

    async def settle(
        self, name: str, ticket: Ticket, won: Sequence[Won], *, owner: str | None = None
    ) -> bool:
        """Turn the ticket into one slot per job it won (their starts join the rate window)
        and give the rest back; False if the ticket was settled already (by a `prune`)."""
        entries = [
            {
                "job": w.job_id,
                "attempt": w.attempt,
                "tag": ticket.id,
                "owner": owner or ticket.owner,
            }
            for w in won
        ]
        since = _window_start()
        fields: dict[str, Any] = {
            "tickets": {
                "$filter": {"input": _list("tickets"), "cond": {"$ne": ["$$this.id", ticket.id]}}
            },
            "slots": {"$concatArrays": [_list("slots"), _lit(entries)]},
            "starts": {
                "$cond": [
                    {"$eq": [{"$ifNull": ["$rate", None]}, None]},
                    [],
                    {
                        "$concatArrays": [
                            {
                                "$filter": {
                                    "input": _list("starts"),
                                    "cond": {"$gt": ["$$this", since]},
                                }
                            },
                            _lit([w.started_at for w in won]),
                        ]
                    },
                ]
            },
        }
        if len(won) < ticket.n:
            fields["released_at"] = NOW  # slots given back: a wake-up for waiting claimers
        res = await self.queues.update_one(
            {"_id": name, "tickets.id": ticket.id}, [{"$set": fields}]
        )
        return res.modified_count == 1

    async def release(self, name: str, job_id: str, tag: str) -> bool:
        """The holder gives back the slot of an attempt whose final write landed."""
        held = {"job": job_id, "tag": tag}
        res = await self.queues.update_one(
            {"_id": name, "slots": {"$elemMatch": held}},
            {"$pull": {"slots": held}, "$currentDate": {"released_at": True}},
        )
        return res.modified_count == 1

    async def adopt(self, name: str, jobs: Iterable[tuple[str, int, str]]) -> int:
        """Give running jobs that hold no slot one, each `(job id, attempt, tag)` (matched by
        attempt; the tag, unique, names the slot): jobs that started before the queue had a
        limit, or were claimed by a dispatcher that had not heard of it yet. Jobs a slot or
        ticket already names are left alone."""
        entries = [
            {"job": job_id, "attempt": attempt, "tag": tag, "adopted": True}
            for job_id, attempt, tag in jobs
        ]
        if not entries:
            return 0
        ticket_jobs = {
            "$reduce": {
                "input": {"$ifNull": ["$tickets.jobs", []]},
                "initialValue": [],
                "in": {"$concatArrays": ["$$value", "$$this"]},
            }
        }
        known = {"$concatArrays": [{"$ifNull": ["$slots.job", []]}, ticket_jobs]}
        new = {
            "$filter": {"input": _lit(entries), "cond": {"$not": [{"$in": ["$$this.job", known]}]}}
        }
        res = await self.queues.update_one(
            {"_id": name}, [{"$set": {"slots": {"$concatArrays": [_list("slots"), new]}}}]
        )
        return res.modified_count

    # -- what is really in use -------------------------------------------------------------

    async def _jobs(self, ids: Collection[str]) -> dict[str, Doc]:
        if not ids:
            return {}
        docs = await self.jobs.find(
            {"_id": {"$in": list(ids)}},
            projection={"status": 1, "attempts": 1, "claim_tag": 1, "started_at": 1},
        ).to_list()
        return {str(d["_id"]): d for d in docs}

    async def prune(self, name: str, doc: QueueDoc | None = None) -> Pruned:
        """Free what the jobs show is over: slots of attempts no longer running, and tickets
        past `claim_by` (settled here with the jobs they really claimed)."""
        doc = doc if doc is not None and doc.now is not None else await self.read(name)
        if doc is None or doc.now is None:
            return Pruned(slots=[], tickets=[], freed=0)
        jobs = await self._jobs(slot_ids(doc))
        _, dead, stale = live_slots(doc, jobs, doc.now)
        freed = 0
        if dead:
            res = await self.queues.update_one(
                {"_id": name},
                {
                    "$pull": {"slots": {"$or": [{"job": e.job, "tag": e.tag} for e in dead]}},
                    "$currentDate": {"released_at": True},
                },
            )
            freed += len(dead) if res.modified_count else 0
        settled: list[Ticket] = []
        for ticket in stale:
            won = [
                Won(job_id=str(j["_id"]), attempt=int(j["attempts"]), started_at=j["started_at"])
                for j in won_by(ticket, jobs)
            ]
            if await self.settle(name, ticket, won):
                freed += ticket.n - len(won)
                settled.append(ticket)
        return Pruned(slots=dead, tickets=settled, freed=freed)

    async def usage(self) -> dict[str, QueueUsage]:
        """Every queue document with its slots in use now, checked against the jobs."""
        docs = await (await self.queues.aggregate([{"$set": {"now": NOW}}])).to_list()
        queues = [QueueDoc.from_doc(d) for d in docs]
        jobs = await self._jobs({job_id for q in queues for job_id in slot_ids(q)})
        out: dict[str, QueueUsage] = {}
        for q in queues:
            assert q.now is not None
            in_use, _, _ = live_slots(q, jobs, q.now)
            out[q.name] = QueueUsage(doc=q, in_use=in_use, in_window=len(q.window_starts(q.now)))
        return out
