"""`QueueStore`: the only code that touches the `brook_queues` collection.

One document per queue that was ever given a limit (its `_id` is the queue's name):

    {concurrency: int|null, rate: {limit, per_seconds}|null, paused: bool,
     slots:  [{job, tag, owner, claim_by?} | {job, tag, attempt, adopted: true} | null],
     starts: [datetime],           # starts inside the rate window, when there is a rate
     updated_at, released_at}

A claim in a limited queue takes its slots first, then the jobs:

1. `take`: one write adds a slot for each of the best due jobs, as many as the queue
   allows now (not paused; room by its concurrency and by its rate window, on the
   server's clock), each with the claim's `tag` and `claim_by` (now + a few seconds).
2. `JobStore.claim` with a `Tagged` ask: the jobs are claimed only while `$$NOW < claim_by`,
   and get the claim's `tag` (`claim_tag`).
3. `settle`, only when needed: the slots of jobs another dispatcher won are given back,
   and with a rate, the real starts replace the `claim_by` each slot counted until then.
4. `release`: after a job's final write, its holder gives its slot back.

A slot given back becomes `null` where it stood (a *tombstone*), and the next `take` after
`COMPACT_AT` of them drops them all: each write then changes a few elements of `slots`,
and its oplog entry (and the secondaries' work) holds those elements, not the whole array,
which removing one from the front would rewrite. Every reader counts only the live slots.

So every running job of a limited queue holds a slot, at every instant: the slot is
written before the job starts and given back after it stopped. Nothing here expires on a
timer, so a slow heartbeat can never free a slot under a running job. What a dead
dispatcher leaves behind (a slot never released, a claim never made) is freed by
`prune`, which removes only slots the jobs themselves show are over: past `claim_by` (no
claim can use them any more) and not held by a running job. The jobs are read from the
primary (local read concern): a claim the primary has applied but not yet replicated must
count.
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

from brook.common.domain.models import Doc
from brook.common.domain.queues import RATE_START_MARGIN_S, QueueDoc, QueueSlot, slot_usage
from brook.common.store.fields import NOW, R, lit
from brook.common.store.jobs.base import JOBS
from brook.common.store.pipelines import QUEUE_CHANGES_PIPELINE

QUEUES = "brook_queues"
CONFIG_FIELDS = ("concurrency", "rate", "paused", "key_concurrency", "key_rate", "fair")
_DEFAULTS: dict[str, Any] = {
    "concurrency": None,
    "rate": None,
    "paused": False,
    "key_concurrency": None,
    "key_rate": None,
    "fair": False,
}


def _list(field: str) -> dict[str, Any]:
    return {"$ifNull": [f"${field}", []]}


# Tombstones (`null` where a slot was given back) a take drops, once there are this many:
# one rewrite of the array for so many small writes.
COMPACT_AT = 256
# A take's live slots: its pipeline sets `_live` to them once, reads `LIVE`, and unsets it.
LIVE = "$_live"

LIVE_SLOTS: dict[str, Any] = {
    "$filter": {"input": _list("slots"), "cond": {"$ne": ["$$this", None]}}
}


def _compacted() -> dict[str, Any]:
    """`slots` as a take leaves them before adding its own: as they stand (a small oplog
    diff), or without their tombstones once there are `COMPACT_AT` of them."""
    tombstones = {"$subtract": [{"$size": _list("slots")}, {"$size": LIVE}]}
    return {"$cond": [{"$gte": [tombstones, COMPACT_AT]}, LIVE, _list("slots")]}


def _named(held: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Whether `$$this` is one of the slots of `held` (`(job id, tag)` each)."""
    return {
        "$or": [
            {"$and": [{"$eq": ["$$this.job", job_id]}, {"$eq": ["$$this.tag", tag]}]}
            for job_id, tag in held
        ]
    }


def _given_back(named: dict[str, Any]) -> dict[str, Any]:
    """`slots` with those `named` (a condition on `$$this`) turned to tombstones, in place;
    `[]` when no live slot is left."""
    marked = {"$map": {"input": _list("slots"), "in": {"$cond": [named, None, "$$this"]}}}
    # A slot (an object) is true, a tombstone (`null`) false.
    return {"$cond": [{"$anyElementTrue": [marked]}, marked, []]}


def _window_start() -> dict[str, Any]:
    """The start of the rate window ending now (null without a rate), `RATE_START_MARGIN_S`
    longer than the rate's `per_seconds` (see there)."""
    window_ms = {"$multiply": [{"$add": ["$rate.per_seconds", RATE_START_MARGIN_S]}, 1000]}
    return {"$subtract": [NOW, {"$toLong": window_ms}]}


def _count(items: dict[str, Any] | str, cond: dict[str, Any]) -> dict[str, Any]:
    return {"$size": {"$filter": {"input": items, "cond": cond}}}


def _key_window_start() -> dict[str, Any]:
    """The start of the per-key rate window ending now, as `_window_start` for the queue's."""
    window_ms = {"$multiply": [{"$add": ["$key_rate.per_seconds", RATE_START_MARGIN_S]}, 1000]}
    return {"$subtract": [NOW, {"$toLong": window_ms}]}


def _unset(field: str) -> dict[str, Any]:
    return {"$eq": [{"$ifNull": [f"${field}", None]}, None]}


def _of_key(items: dict[str, Any], cond: dict[str, Any] | None = None) -> dict[str, Any]:
    """How many of `items` (slots or starts, each `$$s`) belong to the candidate's key
    (`$$this.key`, inside the `$reduce` of `_per_key`), and meet `cond`."""
    same = {"$eq": ["$$s.key", "$$this.key"]}
    return {
        "$size": {
            "$filter": {
                "input": items,
                "as": "s",
                "cond": same if cond is None else {"$and": [same, cond]},
            }
        }
    }


def _per_key(candidates: dict[str, Any], room: dict[str, Any]) -> dict[str, Any]:
    """The first of `candidates` (new slots, in order) the queue takes: at most `room`, and
    for each key, only while its slots (those held, and those taken before it here) stay
    under `key_concurrency` and its starts in the key rate's window (recorded starts, and
    slots not yet settled, at their `claim_by`) under `key_rate.limit`. A job without a key
    is held to neither. Inside `take`'s pipeline (the live slots are `LIVE`)."""
    held = {"$concatArrays": [LIVE, "$$value"]}
    since = _key_window_start()
    no_key = {"$eq": [{"$ifNull": ["$$this.key", None]}, None]}
    by_concurrency = {
        "$or": [no_key, _unset("key_concurrency"), {"$lt": [_of_key(held), "$key_concurrency"]}]
    }
    in_window = {
        "$add": [
            _of_key(_list("key_starts"), {"$gt": ["$$s.at", since]}),
            _of_key(held, {"$gt": ["$$s.claim_by", since]}),
        ]
    }
    by_rate = {"$or": [no_key, _unset("key_rate"), {"$lt": [in_window, "$key_rate.limit"]}]}
    fits = {"$and": [{"$lt": [{"$size": "$$value"}, room]}, by_concurrency, by_rate]}
    return {
        "$reduce": {
            "input": candidates,
            "initialValue": [],
            "in": {"$cond": [fits, {"$concatArrays": ["$$value", ["$$this"]]}, "$$value"]},
        }
    }


def _room(n: int) -> dict[str, Any]:
    """How many of `n` slots the queue can give now: 0 while paused, else bounded by the
    concurrency (every slot counts) and by the starts left in the rate window (recorded
    starts, and each unsettled slot at its `claim_by`). Inside `take`'s pipeline (the live
    slots are `LIVE`)."""
    since = _window_start()
    by_concurrency = {
        "$cond": [
            {"$eq": [{"$ifNull": ["$concurrency", None]}, None]},
            n,
            {"$subtract": ["$concurrency", {"$size": LIVE}]},
        ]
    }
    in_window = {
        "$add": [
            _count(_list("starts"), {"$gt": ["$$this", since]}),
            _count(LIVE, {"$gt": ["$$this.claim_by", since]}),
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


def _take_projection(tag: str) -> dict[str, Any]:
    """What `take` returns: the limits, the starts, how many slots there are, its own slots
    and, with a rate, the slots that count as a start in its window (to tell when it frees)."""
    keyed = {"$or": [{"$not": [_unset("key_concurrency")]}, {"$not": [_unset("key_rate")]}]}
    return {
        **{f: 1 for f in CONFIG_FIELDS},
        "starts": 1,
        "key_starts": {
            "$cond": [
                _unset("key_rate"),
                [],
                {
                    "$filter": {
                        "input": _list("key_starts"),
                        "cond": {"$gt": ["$$this.at", _key_window_start()]},
                    }
                },
            ]
        },
        "used": {"$size": LIVE_SLOTS},
        "slots": {
            "$filter": {
                "input": LIVE_SLOTS,
                "cond": {
                    "$or": [
                        keyed,  # with per-key limits, every slot: which keys are full
                        {"$eq": ["$$this.tag", tag]},
                        {
                            "$and": [
                                {"$ne": [{"$ifNull": ["$rate", None]}, None]},
                                {"$gt": ["$$this.claim_by", _window_start()]},
                            ]
                        },
                    ]
                },
            }
        },
    }


def _released(held: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """The pipeline stage that gives back the slots of `held` (`(job id, tag)` each), as
    tombstones, and marks `released_at` when it gave back any (none: no stage)."""
    if not held:
        return []
    named = _named(held)
    any_held = {"$anyElementTrue": [{"$map": {"input": _list("slots"), "in": named}}]}
    return [
        {
            "$set": {
                "released_at": {"$cond": [any_held, NOW, "$released_at"]},
                "slots": _given_back(named),
            }
        }
    ]


def _slot(job_id: str, tag: str, owner: str, key: str | None) -> dict[str, Any]:
    slot: dict[str, Any] = {"job": job_id, "tag": tag, "owner": owner}
    if key is not None:
        slot["key"] = key
    return slot


@dataclass(frozen=True, kw_only=True)
class Taken:
    """What `take` got: the slots it wrote (the first jobs asked for), or none and the
    queue as it stood (to tell why)."""

    slots: list[QueueSlot]
    queue: QueueDoc | None  # None: the queue has no document (no limits)

    @property
    def claim_by(self) -> datetime:
        by = self.slots[0].claim_by
        assert by is not None
        return by


@dataclass(frozen=True, kw_only=True)
class Pruned:
    """The slots `prune` freed: of attempts that are over, or claims that never landed."""

    slots: list[QueueSlot]


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
        if queue.limits.concurrency is not None or queue.limits.key_concurrency is not None:
            running = await self.jobs.find(
                {"status": "running", "queue": name},
                projection={"attempts": 1, "key": 1},
                hint="lease_expiry",
            ).to_list()
            await self.adopt(
                name,
                [
                    (str(d["_id"]), int(d["attempts"]), secrets.token_hex(8), d.get("key"))
                    for d in running
                ],
            )
        return queue

    async def limits(self) -> dict[str, QueueDoc]:
        """Every queue document's limits (no slots), by name: the dispatchers' view."""
        docs = await self.queues.find({}, projection={f: 1 for f in CONFIG_FIELDS}).to_list()
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
        return await self.queues.watch(QUEUE_CHANGES_PIPELINE, max_await_time_ms=max_await_ms)

    # -- a claim's slots -----------------------------------------------------------------------

    async def take(
        self,
        name: str,
        *,
        owner: str,
        tag: str,
        jobs: Sequence[str],
        claim_window_s: float,
        want: int | None = None,
        keys: Mapping[str, str | None] | None = None,
        release: Sequence[tuple[str, str]] = (),
    ) -> Taken:
        """Take a slot for each of the first of `jobs` (but those other slots already name),
        at most `want`, as many as the queue allows now, valid for a claim until `claim_by`
        = now + `claim_window_s`. With `keys` (job id → its key), each slot names its job's
        key, and a key at its `key_concurrency` or out of starts by its `key_rate` gets
        none. In the same write, first, the slots `release` names (`(job id, tag)`, as for
        `release_many`) are given back, and count no more.
        When it allows none (and releases none),
        nothing is written (and no change event goes out), and the queue as it stands
        comes back instead, to tell why."""
        room = _room(len(jobs) if want is None else min(want, len(jobs)))
        claim_by = {"$add": [NOW, int(claim_window_s * 1000)]}
        new = [_slot(job_id, tag, owner, (keys or {}).get(job_id)) for job_id in jobs]
        # Jobs another claim already holds slots for are left to it: racing dispatchers find
        # the same best jobs, and each takes slots for different ones.
        named = {"$in": ["$$this.job", {"$ifNull": ["$slots.job", []]}]}
        free = {"$filter": {"input": lit(new), "cond": {"$not": [named]}}}
        with_claim_by = {
            "$map": {
                "input": free,
                "in": {"$mergeObjects": ["$$this", {"claim_by": claim_by}]},
            }
        }
        taken = {"$cond": [{"$gt": [room, 0]}, _per_key(with_claim_by, room), []]}
        doc = await self.queues.find_one_and_update(
            {"_id": name},
            [
                *_released(release),
                {"$set": {"_live": LIVE_SLOTS}},
                {"$set": {"slots": {"$concatArrays": [_compacted(), taken]}}},
                {"$unset": "_live"},
            ],
            projection=_take_projection(tag),
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            return Taken(slots=[], queue=None)
        queue = QueueDoc.from_doc(doc)
        ours = [s for s in queue.slots if s.tag == tag]
        return Taken(slots=ours, queue=queue)

    async def settle(
        self,
        name: str,
        tag: str,
        *,
        lost: Collection[str] = (),
        started: Mapping[str, datetime] | None = None,
        keys: Mapping[str, str | None] | None = None,
    ) -> bool:
        """After a claim: give back the slots of `lost` jobs (another dispatcher won them),
        and record the `started` jobs' real starts in the rate window (their slots no longer
        count as a start at `claim_by`), and, with a key rate, in their keys' (`keys`: job
        id → key). False if nothing was left to change."""
        started = dict(started or {})
        keyed_starts = [
            {"key": key, "at": started[job]}
            for job, key in (keys or {}).items()
            if key is not None and job in started
        ]
        if not lost and not started:
            return False
        fields: dict[str, Any] = {
            "slots": _settled_slots(tag, lost, started),
            "starts": _starts_kept_with(list(started.values())),
            "key_starts": _key_starts_kept_with(keyed_starts),
        }
        if lost:
            fields["released_at"] = NOW  # slots given back: a wake-up for waiting claimers
        res = await self.queues.update_one({"_id": name, "slots.tag": tag}, [{"$set": fields}])
        return res.modified_count == 1

    async def release(self, name: str, job_id: str, tag: str) -> bool:
        """The holder gives back the slot of an attempt whose final write landed."""
        return await self.release_many(name, [(job_id, tag)])

    async def release_many(self, name: str, held: Sequence[tuple[str, str]]) -> bool:
        """`release` of several slots of one queue, each `(job id, tag)`, in one write (what a
        dispatcher's finished jobs give back while its last release was in flight); whether
        any was still held."""
        if not held:
            return False
        either = {"$or": [{"job": job_id, "tag": tag} for job_id, tag in held]}
        # Tombstones in place, not a `$pull`: the oplog entry names the elements changed.
        res = await self.queues.update_one(
            {"_id": name, "slots": {"$elemMatch": either}},
            [{"$set": {"slots": _given_back(_named(held)), "released_at": NOW}}],
        )
        return res.modified_count == 1

    async def adopt(self, name: str, jobs: Iterable[tuple[str, int, str, str | None]]) -> int:
        """Give running jobs that hold no slot one, each `(job id, attempt, tag, key)`
        (matched by attempt; the tag, unique, names the slot): jobs that started before the
        queue had a limit, or were claimed by a dispatcher that had not heard of it yet. Jobs
        a slot already names are left alone."""
        new = [
            {
                "job": job_id,
                "attempt": attempt,
                "tag": tag,
                "adopted": True,
                **({"key": key} if key is not None else {}),
            }
            for job_id, attempt, tag, key in jobs
        ]
        if not new:
            return 0
        known = {"$ifNull": ["$slots.job", []]}
        fresh = {"$filter": {"input": lit(new), "cond": {"$not": [{"$in": ["$$this.job", known]}]}}}
        res = await self.queues.update_one(
            {"_id": name}, [{"$set": {"slots": {"$concatArrays": [_list("slots"), fresh]}}}]
        )
        return res.modified_count

    # -- what is really in use -------------------------------------------------------------

    async def _jobs(self, ids: Collection[str]) -> dict[str, Doc]:
        if not ids:
            return {}
        docs = await self.jobs.find(
            {"_id": {"$in": list(ids)}},
            projection={"status": 1, "attempts": 1, "claim_tag": 1},
        ).to_list()
        return {str(d["_id"]): d for d in docs}

    async def prune(self, name: str) -> Pruned:
        """Free the slots the jobs show are over: past their `claim_by` and not held by a
        running job (its attempt ended, or the claim never landed)."""
        doc = await self.read(name)
        if doc is None or doc.now is None:
            return Pruned(slots=[])
        jobs = await self._jobs({s.job for s in doc.slots})
        _, dead = slot_usage(doc, jobs, doc.now)
        if not dead:
            return Pruned(slots=[])
        freed = await self.release_many(name, [(s.job, s.tag) for s in dead])
        return Pruned(slots=dead if freed else [])

    async def usage(self) -> dict[str, QueueUsage]:
        """Every queue document with its slots in use now, checked against the jobs."""
        docs = await (await self.queues.aggregate([{"$set": {"now": NOW}}])).to_list()
        queues = [QueueDoc.from_doc(d) for d in docs]
        jobs = await self._jobs({s.job for q in queues for s in q.slots})
        out: dict[str, QueueUsage] = {}
        on_jobs = [q.name for q in queues if q.limits.slots_on_jobs]
        held = await self._key_slots_held(on_jobs)
        for q in queues:
            assert q.now is not None
            in_use, _ = slot_usage(q, jobs, q.now)
            in_use += held.get(q.name, 0)  # slots held on the jobs themselves
            out[q.name] = QueueUsage(doc=q, in_use=in_use, in_window=len(q.window_starts(q.now)))
        return out

    async def _key_slots_held(self, queues: Collection[str]) -> dict[str, int]:
        """Per queue, the running jobs that hold a `key_slot` (the `key_slots` index)."""
        if not queues:
            return {}
        pipeline = [
            {
                "$match": {
                    "status": R,
                    "key_slot": {"$type": "string"},
                    "queue": {"$in": list(queues)},
                }
            },
            {"$group": {"_id": "$queue", "n": {"$sum": 1}}},
        ]
        docs = await (await self.jobs.aggregate(pipeline)).to_list()
        return {str(d["_id"]): int(d["n"]) for d in docs}


def _settled_slots(tag: str, lost: Collection[str], started: Mapping[str, datetime]) -> Any:
    """The slots of claim `tag`, less those of `lost` jobs (tombstones in place); a
    `started` job's slot no longer counts as a start at its `claim_by`."""
    mine = {"$eq": ["$$this.tag", tag]}
    gone = {"$and": [mine, {"$in": ["$$this.job", lit(list(lost))]}]}
    settled = {"$and": [mine, {"$in": ["$$this.job", lit(list(started))]}]}
    return {
        "$map": {
            "input": _list("slots"),
            "in": {
                "$switch": {
                    "branches": [
                        {"case": gone, "then": None},
                        {
                            "case": settled,
                            "then": {"$unsetField": {"field": "claim_by", "input": "$$this"}},
                        },
                    ],
                    "default": "$$this",
                }
            },
        }
    }


def _starts_kept_with(started: list[datetime]) -> Any:
    """A rated queue's starts still in its window, and these (none without a rate)."""
    since = _window_start()
    kept = {"$filter": {"input": _list("starts"), "cond": {"$gt": ["$$this", since]}}}
    return {
        "$cond": [
            {"$eq": [{"$ifNull": ["$rate", None]}, None]},
            [],
            {"$concatArrays": [kept, lit(started)]},
        ]
    }


def _key_starts_kept_with(keyed_starts: list[dict[str, Any]]) -> Any:
    """The key starts still in the key rate's window, and these (no field without one)."""
    since = _key_window_start()
    kept = {"$filter": {"input": _list("key_starts"), "cond": {"$gt": ["$$this.at", since]}}}
    return {"$cond": [_unset("key_rate"), "$$REMOVE", {"$concatArrays": [kept, lit(keyed_starts)]}]}
