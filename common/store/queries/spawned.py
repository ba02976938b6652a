"""Builders of the cancel that reaches spawned jobs: the jobs a task submitted with
`ctx.submit` (`spawned_by`), and theirs, cancelled with `ParentCancelled`.

A job whose spawned jobs are being cancelled carries `spawn_cancel` (the cancelled job
itself, and every running spawned job asked to stop, whose task may still submit more):
the mark is taken off once the job has ended and a propagation from it went all the way
down, so a propagation cut short (its process died) is finished by a dispatcher's sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brook.common.domain.status import JobStatus
from brook.common.store.fields import NOW, P, R, W, expiry, history, lit
from brook.common.store.queries.base import ENDED, Write

PARENT_CANCELLED = "ParentCancelled"


def parent_cancelled_error() -> dict[str, Any]:
    """The error of a job cancelled because the job that spawned it (or one above it) was:
    it names the job that spawned it."""
    message = {"$concat": ["cancelled with the job that spawned it, ", "$spawned_by"]}
    return {"type": PARENT_CANCELLED, "message": message}


def spawn_cancel_marked(job_ids: Sequence[str]) -> Write:
    """Jobs whose spawned jobs are to be cancelled: marked before the propagation starts."""
    return Write(filter={"_id": {"$in": list(job_ids)}}, update={"$set": {"spawn_cancel": True}})


def spawned_cancelled(ids: Sequence[str], retention_s: float, tag: str) -> Write:
    """waiting / pending → cancelled with `ParentCancelled`: spawned jobs whose spawner was
    cancelled (a durable job sleeping or waiting for a signal is pending), marked with
    `tag` (`bulk_op`) to read back."""
    error = parent_cancelled_error()
    return Write(
        filter={"_id": {"$in": list(ids)}, "status": {"$in": [W, P]}},
        update=[
            {
                "$set": {
                    "status": JobStatus.CANCELLED.value,
                    "finished_at": NOW,
                    "expire_at": expiry(retention_s),
                    "updated_at": NOW,
                    "error": error,
                    "bulk_op": lit(tag),
                    **history(
                        {
                            "status": JobStatus.CANCELLED.value,
                            "at": NOW,
                            "attempt": "$attempts",
                            "error": PARENT_CANCELLED,
                        }
                    ),
                }
            }
        ],
    )


def spawned_cancel_requested(ids: Sequence[str], tag: str) -> Write:
    """A running spawned job is asked to stop (its holder stops it, and it ends cancelled
    with `cancel_error`, `ParentCancelled`), and marked `spawn_cancel`: what its task
    spawns until it stops is cancelled after it ended."""
    return Write(
        filter={"_id": {"$in": list(ids)}, "status": R, "cancel_requested": {"$ne": True}},
        update=[
            {
                "$set": {
                    "cancel_requested": True,
                    "cancel_error": parent_cancelled_error(),
                    "spawn_cancel": True,
                    "updated_at": NOW,
                    "bulk_op": lit(tag),
                }
            }
        ],
    )


def spawn_cancel_done(job_ids: Sequence[str]) -> Write:
    """The mark taken off these jobs once they ended (a running one keeps it: its task may
    still spawn)."""
    return Write(
        filter={"_id": {"$in": list(job_ids)}, "spawn_cancel": True, "status": {"$in": ENDED}},
        update={"$unset": {"spawn_cancel": ""}},
    )


def cancel_error_or(default: dict[str, Any]) -> dict[str, Any]:
    """The error of a running job ending cancelled: the one its cancel asked for
    (`cancel_error`, say `ParentCancelled`), else `default`."""
    return {"$ifNull": ["$cancel_error", lit(default)]}
