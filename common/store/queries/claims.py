"""Builders of claims: pending → running, leased to an owner."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from brook.common.domain.models import Doc
from brook.common.store.fields import (
    NOW,
    P,
    R,
    claimed_fields,
    lit,
)
from brook.common.store.queries.base import (
    CLAIM_FILTER,
    Write,
    claim_filter,
)


def claimed(
    owner: str,
    lease_seconds: float,
    *,
    tasks: Collection[str] | None = None,
    queue: str | None = None,
    exclude: Collection[str] = (),
    among: Collection[str] | None = None,
) -> Write:
    """pending → running: the best due pending job (sort `CLAIM_SORT`, hint `claim_index`),
    leased to `owner`; `attempts` + 1 is the new fencing token."""
    return Write(
        filter=claim_filter(tasks, queue, exclude, among),
        update=[{"$set": claimed_fields(owner, lease_seconds)}],
    )


def claimed_of_key(
    owner: str,
    lease_seconds: float,
    queue: str,
    key: str | None,
    tasks: Collection[str] | None,
    slot: str | None = None,
) -> Write:
    """pending → running in a queue claimed by turns across keys: the best due job of one
    key (sort `CLAIM_SORT`, hint `claim_by_key`; None: the jobs without a key), leased to
    `owner`; with `slot`, holding that `key_slot`."""
    fields = claimed_fields(owner, lease_seconds)
    if slot is not None:
        fields["key_slot"] = lit(slot)
    return Write(filter={**claim_filter(tasks, queue), "key": key}, update=[{"$set": fields}])


def as_read(doc: Doc) -> dict[str, Any]:
    """A candidate as a batch claim read it (whole): its id at that attempt number, not
    touched since (a debounced submit joining it moves `debounced` and `updated_at`, a
    signal waking it `updated_at`). A claim that matches this claims exactly the job that
    was read, so what was read, with the claim's fields, is what it won
    (`fields.as_claimed`): no read-back."""
    return {
        "_id": doc["_id"],
        "attempts": doc.get("attempts", 0),
        "debounced": doc.get("debounced"),  # None: matches a job never joined
        "updated_at": doc.get("updated_at"),
    }


def claimed_as_read(candidates: Sequence[Doc], owner: str, lease_seconds: float, tag: str) -> Write:
    """pending → running for a batch: each candidate as it was read (`as_read`: one claimed
    and handed back, or joined by a debounced submit, meanwhile is not taken), still due,
    tagged with `tag`."""
    return Write(
        filter={"$or": [as_read(d) for d in candidates], **CLAIM_FILTER},
        update=[{"$set": {**claimed_fields(owner, lease_seconds), "claim_tag": tag}}],
    )


def claimed_tagged(
    ids: Sequence[str], owner: str, lease_seconds: float, tag: str, before: datetime
) -> Write:
    """pending → running in a limited queue: these jobs if still due and pending, tagged
    with the claim's `tag` (its slots carry it too), only while the server's clock is before
    `before` (the slots' `claim_by`)."""
    due = {"$lte": ["$run_at", NOW]}
    in_time = {"$lt": [NOW, lit(before)]}
    return Write(
        filter={"_id": {"$in": list(ids)}, "status": P, "$expr": {"$and": [due, in_time]}},
        update=[{"$set": {**claimed_fields(owner, lease_seconds), "claim_tag": lit(tag)}}],
    )


def claimed_with_slots(
    slots: Mapping[str, str | None], owner: str, lease_seconds: float, tag: str
) -> Write:
    """pending → running in a queue whose per-key slots are held on the jobs: these jobs if
    still due and pending, tagged with `tag`, each holding its `key_slot` (None: a job
    without a key holds none). A slot another running job holds fails the write there
    (the `key_slots` index): what was claimed before it stays claimed."""
    ids = list(slots)
    due = {"$lte": ["$run_at", NOW]}
    held = {"$arrayElemAt": [lit(list(slots.values())), {"$indexOfArray": [lit(ids), "$_id"]}]}
    return Write(
        filter={"_id": {"$in": ids}, "status": P, "$expr": due},
        update=[
            {
                "$set": {
                    **claimed_fields(owner, lease_seconds),
                    "claim_tag": lit(tag),
                    "key_slot": held,
                }
            }
        ],
    )


def slot_taken(owner: str, job_id: str, attempt: int, slot: str) -> Write:
    """A running attempt of this owner takes `slot` (a job claimed before its queue's
    per-key limit was known here)."""
    return Write(
        filter={"_id": job_id, "attempts": attempt, "owner": owner, "status": R},
        update={"$set": {"key_slot": slot}},
    )
