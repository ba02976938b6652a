"""Builders of workflows: dependents attached, parents adopted, children settled."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from brook.common.store.fields import (
    NOW,
    C,
    P,
    W,
    expiry,
    history,
    lit,
)
from brook.common.store.queries.base import (
    ENDED,
    Write,
)
from brook.common.store.records import EndedParent


def dependents_attached(parent_ids: Collection[str], token: str) -> Write:
    """These jobs become parents with dependents not settled yet (`unsettled`, a fresh
    token); one that ended already loses its `expire_at` until they are."""
    return Write(
        filter={"_id": {"$in": list(parent_ids)}},
        update={
            "$set": {"has_dependents": True, "unsettled": token},
            "$unset": {"expire_at": ""},
        },
    )


def parents_adopted(adopted: Mapping[str, str]) -> Write:
    """The waiting children of never-inserted jobs (`adopted`: their id → the id of the job
    holding their idempotency key) point at the jobs that hold the keys instead."""
    new, old = lit(list(adopted)), lit(list(adopted.values()))

    def swap(field: str) -> dict[str, Any]:
        at = {"$indexOfArray": [new, "$$p"]}
        one = {"$cond": [{"$lt": [at, 0]}, "$$p", {"$arrayElemAt": [old, at]}]}
        return {"$map": {"input": f"${field}", "as": "p", "in": one}}

    return Write(
        filter={"parents_left": {"$in": list(adopted)}, "status": W},
        update=[{"$set": {"depends_on": swap("depends_on"), "parents_left": swap("parents_left")}}],
    )


def settled(
    children: Sequence[str], ended: Sequence[EndedParent], tag: str, retention_s: float
) -> Write:
    """waiting → pending / cancelled / (still) waiting: these waiting children of these
    ended parents forget them; no parent left → pending (due at the latest of its `run_at`
    and now); a parent that did not complete → cancelled with `DependencyFailed`, unless
    `run_on_parent_failure`. A child whose status changes is tagged with `tag` and gets one
    history entry."""
    ids = [p.job_id for p in ended]
    return Write(
        filter={"_id": {"$in": list(children)}, "parents_left": {"$in": ids}, "status": W},
        update=_settled_pipeline(ended, tag, retention_s),
    )


def marked_settled(parent: EndedParent, retention_s: float) -> Write:
    """A finished parent's `unsettled` token cleared, unless a child attached since it was
    read (a new token), and its retention started from now."""
    return Write(
        filter={"_id": parent.job_id, "unsettled": parent.token, "status": {"$in": ENDED}},
        update=[{"$unset": "unsettled"}, {"$set": {"expire_at": expiry(retention_s)}}],
    )


def _settled_pipeline(
    ended: Sequence[EndedParent], tag: str, retention_s: float
) -> list[dict[str, Any]]:
    failed = [p for p in ended if not p.completed]
    failed_ids = lit([p.job_id for p in failed])
    hit = {"$setIntersection": ["$parents_left", failed_ids]}
    first = {"$arrayElemAt": [hit, 0]}
    messages = lit([p.failure() for p in failed])
    message = {"$arrayElemAt": [messages, {"$indexOfArray": [failed_ids, first]}]}
    runs_anyway = {"$eq": ["$run_on_parent_failure", True]}
    left = {"$setDifference": ["$parents_left", lit([p.job_id for p in ended])]}
    cancel = {"$and": [{"$not": [runs_anyway]}, {"$gt": [{"$size": hit}, 0]}]}
    status = {
        "$switch": {
            "branches": [
                {"case": cancel, "then": C},
                {"case": {"$eq": [{"$size": left}, 0]}, "then": P},
            ],
            "default": W,
        }
    }
    is_cancelled = {"$eq": ["$status", C]}
    is_released = {"$eq": ["$status", P]}
    changed = {"$ne": ["$status", W]}
    entry = {
        "status": "$status",
        "at": NOW,
        "attempt": "$attempts",
        "error": {"$cond": [is_cancelled, "DependencyFailed", "$$REMOVE"]},
    }
    error = {"type": "DependencyFailed", "message": message}
    outcome = {"tag": tag, "status": "$status", "attempt": "$attempts"}
    return [
        {"$set": {"error": {"$cond": [cancel, error, "$error"]}, "status": status}},
        {
            "$set": {
                "parents_left": left,
                "finished_at": {"$cond": [is_cancelled, NOW, "$finished_at"]},
                "expire_at": {"$cond": [is_cancelled, expiry(retention_s), "$$REMOVE"]},
                "run_at": {"$cond": [is_released, {"$max": ["$run_at", NOW]}, "$run_at"]},
                "updated_at": NOW,
                # What this settle made of it, read back by its tag: the child may be
                # claimed (or further) by the time it is read.
                "settled": {"$cond": [changed, outcome, "$settled"]},
                **{k: {"$cond": [changed, v, f"${k}"]} for k, v in history(entry).items()},
            }
        },
    ]
