"""Every change-stream pipeline Brook opens, and the oplog tail filter, in one place.

The jobs collection's streams: the dispatcher's wake-ups (`DISPATCHER_PIPELINE`), the
API's live events (`LIVE_PIPELINE`, `LEAN_PIPELINE`, `catch_up_pipeline`) and one job's
status changes (`job_status_pipeline`); the `brook_queues` collection's stream
(`QUEUE_CHANGES_PIPELINE`); and the filter of the primary's oplog that the dispatcher tails
for new pending jobs (`new_pending_oplog`). Pure: the stores open the streams.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from typing import Any

from brook.common.domain.status import TERMINAL
from brook.common.domain.triggers import MAX_JOB_BYTES

# Change-stream events after which a stream is over: reopen fresh (and sweep).
INVALIDATING = ("invalidate", "drop", "dropDatabase", "rename")
TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)

# -- the dispatcher: a wake-up for new or requeued work and for cancel requests --------------

# Its `$project` keeps every event a few hundred bytes, whatever the job holds. (No event of
# it can reach MongoDB's 16 MiB change-event limit anyway: it asks for no post-image, so an
# event carries one copy of at most one document, the inserted job or the fields an update
# set, and the server's limit leaves 16 KiB above the 16 MiB a document may hold.)

DISPATCHER_PIPELINE: list[dict[str, Any]] = [
    {
        "$match": {
            "$or": [
                {"operationType": "insert", "fullDocument.status": "pending"},
                # A waiting job with a bound of its own: the deadline timer waits for it.
                {
                    "operationType": "insert",
                    "fullDocument.status": "waiting",
                    "$or": [
                        {"fullDocument.start_by": {"$exists": True}},
                        {"fullDocument.deadline": {"$exists": True}},
                    ],
                },
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.status": "pending",
                },
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.cancel_requested": True,
                },
                # A signal woke a job waiting for it (`woken_by_signal`): due now.
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.woken_at": {"$exists": True},
                },
                {"operationType": {"$in": list(INVALIDATING)}},
            ]
        }
    },
    {
        "$project": {
            "operationType": 1,
            "documentKey": 1,
            "fullDocument.run_at": 1,
            "fullDocument.task": 1,
            "fullDocument.queue": 1,
            "fullDocument.priority": 1,
            "fullDocument.key": 1,
            "fullDocument.status": 1,
            "fullDocument.created_at": 1,
            "fullDocument.start_by": 1,
            "fullDocument.deadline": 1,
            "updateDescription.updatedFields.run_at": 1,
            "updateDescription.updatedFields.status": 1,
            "updateDescription.updatedFields.cancel_requested": 1,
        }
    },
]

# Saved resume tokens carry it: a token of another pipeline is never resumed from.
DISPATCHER_PIPELINE_VERSION = hashlib.sha1(
    json.dumps(DISPATCHER_PIPELINE, sort_keys=True).encode()
).hexdigest()[:12]

# -- the API's live events -------------------------------------------------------------------

# What live events leave out of the job (clients ask for `payload` and `result` per job,
# `?include=`; the API never shows a step's result), as a projection of a read.
EVENT_LEFT_OUT = ("payload", "result", "steps.result")
EVENT_PROJECTION: dict[str, int] = {name: 0 for name in EVENT_LEFT_OUT}

# Every insert and replacement, and every update that changes more than the lease or the
# clock (a lease renewal is not news to anyone watching), or the count of the job's output
# (its chunks are news to the readers of its output, not of its events).
#
# Cut down on the server to what an event is made of: the post-image without what events
# leave out, and of the update itself only what `Tally` reads. The cut is what keeps an
# event under MongoDB's 16 MiB: a completion carries its result twice (in the changed
# fields and in the post-image) beside the payload, and an event over the limit fails the
# stream at that change, every time it is resumed (6.0 has no
# `$changeStreamSplitLargeEvent`). It also keeps the payloads off the wire.
_QUIET_FIELDS = ["lease_expires_at", "updated_at", "output", "output.chunks", "output.bytes"]
_LIVE_MATCH: dict[str, Any] = {
    "$match": {
        "$or": [
            {"operationType": {"$in": ["insert", "replace", *INVALIDATING]}},
            {
                "operationType": "update",
                "$expr": {
                    "$gt": [
                        {
                            "$size": {
                                "$setDifference": [
                                    {
                                        "$map": {
                                            "input": {
                                                "$objectToArray": (
                                                    "$updateDescription.updatedFields"
                                                )
                                            },
                                            "in": "$$this.k",
                                        }
                                    },
                                    _QUIET_FIELDS,
                                ]
                            }
                        },
                        0,
                    ]
                },
            },
        ]
    }
}

LIVE_PIPELINE: list[dict[str, Any]] = [
    _LIVE_MATCH,
    {
        "$project": {
            "operationType": 1,
            "wallTime": 1,
            "documentKey": 1,
            "fullDocument": 1,
            "updateDescription.updatedFields.status": 1,
            "updateDescription.updatedFields.started_at": 1,
        }
    },
    {"$unset": [f"fullDocument.{name}" for name in EVENT_LEFT_OUT]},
]


# Without clients: a change that starts a job (sets `started_at`) or ends it, and only what
# `Tally` reads of it. The server filters and projects before computing any post-image.
LEAN_PIPELINE: list[dict[str, Any]] = [
    {
        "$match": {
            "$or": [
                {"operationType": {"$in": list(INVALIDATING)}},
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.status": {"$in": sorted(TERMINAL_VALUES)},
                },
                {
                    "operationType": "update",
                    "updateDescription.updatedFields.started_at": {"$type": "date"},
                },
            ]
        }
    },
    {
        "$project": {
            "operationType": 1,
            "wallTime": 1,
            "documentKey": 1,
            "updateDescription.updatedFields.status": 1,
            "updateDescription.updatedFields.started_at": 1,
            "fullDocument.run_at": 1,
        }
    },
]


def catch_up_pipeline(job_id: str | None) -> list[dict[str, Any]]:
    """`LIVE_PIPELINE`, for one job's changes only when `job_id` is given (a client's own
    catch-up stream)."""
    if job_id is None:
        return list(LIVE_PIPELINE)
    return [_LIVE_MATCH, {"$match": {"documentKey._id": job_id}}, *LIVE_PIPELINE[1:]]


# -- one job (a client waiting for its result) -----------------------------------------------


def job_status_pipeline(job_id: str) -> list[dict[str, Any]]:
    """One job's status changes and its deletion: wake-ups only (the job is read again)."""
    changed = "updateDescription.updatedFields.status"
    return [
        {
            "$match": {
                "documentKey._id": job_id,
                "$or": [
                    {"operationType": "update", changed: {"$exists": True}},
                    {"operationType": {"$in": ["replace", "delete", *INVALIDATING]}},
                ],
            }
        },
        {"$project": {"operationType": 1, "documentKey": 1}},
    ]


# -- the queue documents (`brook_queues`) ----------------------------------------------------

_UPDATED = {"$ifNull": ["$updateDescription.updatedFields", {}]}
# Each event names the queue and the top-level fields it changed (`keys`), nothing more.
QUEUE_CHANGES_PIPELINE: list[dict[str, Any]] = [
    {
        "$project": {
            "operationType": 1,
            "documentKey": 1,
            "keys": {
                "$map": {
                    "input": {"$objectToArray": _UPDATED},
                    "in": {"$arrayElemAt": [{"$split": ["$$this.k", "."]}, 0]},
                }
            },
        }
    }
]


# -- the primary's oplog: new pending jobs, a replication round before the stream ------------

# What an oplog entry of a new job carries to the dispatcher.
NEW_PENDING_FIELDS: dict[str, int] = {
    "ts": 1,
    **{f"o.{k}": 1 for k in ("_id", "task", "queue", "run_at", "priority", "key")},
}


def new_pending_oplog(namespace: str, tasks: Collection[str], after: Any | None) -> dict[str, Any]:
    """The oplog entries of pending jobs of `tasks` inserted into `namespace` (`db.jobs`)
    after the timestamp `after` (None: from the start of what the cursor reads)."""
    query: dict[str, Any] = {
        "ns": namespace,
        "op": "i",
        "o.status": "pending",
        "o.task": {"$in": sorted(tasks)},
    }
    if after is not None:
        query["ts"] = {"$gt": after}
    return query


def oplog_insert_as_change(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An oplog entry of `new_pending_oplog` in the shape of the dispatcher stream's insert
    event, so one handler takes both."""
    job = entry["o"]
    return {"operationType": "insert", "documentKey": {"_id": job["_id"]}, "fullDocument": job}


# -- an application's collection, followed by a trigger --------------------------------------


# Set on a change whose document and update description together are over
# `MAX_JOB_BYTES` as BSON (their size), in place of both: its job would be too large anyway,
# and the event itself could pass MongoDB's 16 MiB limit (an update's description beside the
# whole document), which fails the stream's read (`BSONObjectTooLarge`) on every try, with
# no way past it before `$changeStreamSplitLargeEvent` (MongoDB 7.0).
OVERSIZE = "brook_oversize"
_CHANGE_BYTES = {
    "$add": [
        {"$bsonSize": {"$ifNull": ["$fullDocument", {}]}},
        {"$bsonSize": {"$ifNull": ["$updateDescription", {}]}},
    ]
}
_FITS = {"$eq": [{"$type": f"${OVERSIZE}"}, "missing"]}


def trigger_pipeline(operations: Collection[str], match: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The changes a trigger makes jobs of: its operations, filtered by its `match` on the
    change event; and the events that end a stream (a drop or rename of the collection).
    A change too large for a job comes without its document and update description, and
    with its size in `OVERSIZE` (after the `match`, which sees the whole change)."""
    wanted: list[dict[str, Any]] = [{"operationType": {"$in": sorted(operations)}}]
    if match:
        wanted.append(dict(match))
    return [
        {
            "$match": {
                "$or": [
                    {"operationType": {"$in": list(INVALIDATING)}},
                    {"$and": wanted},
                ]
            }
        },
        {
            "$set": {
                OVERSIZE: {
                    "$let": {
                        "vars": {"size": _CHANGE_BYTES},
                        "in": {"$cond": [{"$gt": ["$$size", MAX_JOB_BYTES]}, "$$size", "$$REMOVE"]},
                    }
                }
            }
        },
        {
            "$set": {
                "fullDocument": {"$cond": [_FITS, "$fullDocument", "$$REMOVE"]},
                "updateDescription": {"$cond": [_FITS, "$updateDescription", "$$REMOVE"]},
            }
        },
    ]


# -- the readers of output: each API process's one stream for all of them ------------------


def output_pipeline(output: str, jobs: str) -> list[dict[str, Any]]:
    """On the database: every chunk inserted into `output`, and every job of `jobs` that
    reached a terminal status (its stream's `end`); only what a reader needs."""
    return [
        {
            "$match": {
                "$or": [
                    {"ns.coll": output, "operationType": "insert"},
                    {
                        "ns.coll": jobs,
                        "operationType": "update",
                        "updateDescription.updatedFields.status": {
                            "$in": sorted(TERMINAL_VALUES)
                        },
                    },
                ]
            }
        },
        {
            "$project": {
                "ns.coll": 1,
                "documentKey": 1,
                "fullDocument._id": 1,
                "fullDocument.job": 1,
                "fullDocument.seq": 1,
                "fullDocument.attempt": 1,
                "fullDocument.kind": 1,
                "fullDocument.data": 1,
                "fullDocument.step": 1,
                "fullDocument.emitted_at": 1,
                "updateDescription.updatedFields.status": 1,
            }
        },
    ]
