"""Builders of new jobs: submitted, debounced, and a unique key released."""

from __future__ import annotations

from pymongo import UpdateOne

from brook.common.domain.models import JobSpec
from brook.common.store.fields import (
    NOW,
    P,
    after,
    lit,
    new_job,
)
from brook.common.store.queries.base import (
    Write,
)


def submitted(job_id: str, spec: JobSpec) -> Write:
    """A new job, as an upsert on a fresh `_id` (it always inserts): the server stamps its
    times (`$$NOW`) without a read of its clock."""
    return Write(filter={"_id": job_id}, update=[{"$set": new_job(spec)}])


def new_job_upsert(job_id: str, spec: JobSpec) -> UpdateOne:
    """`submitted` as a bulk request: usable inside a transaction too."""
    write = submitted(job_id, spec)
    return UpdateOne(write.filter, write.update, upsert=True)


def debounced(job_id: str, spec: JobSpec) -> Write:
    """Join the pending job of `spec.debounce_key`, or start it (an upsert under the fresh
    `job_id`; the unique index `debounce_pending` keeps one pending job per key, so racing
    submitters, in any API process, all end in the same job): the latest payload, due once
    no submit joined for `debounce_s`, never later than its `debounce_until` (the first
    submit plus the longest wait). A job already claimed is not pending: the next submit
    starts a new one."""
    if spec.debounce_key is None or spec.debounce_s is None:
        raise ValueError("not a debounced spec")
    fresh = {"$eq": [{"$type": "$created_at"}, "missing"]}
    first = {k: {"$cond": [fresh, v, f"${k}"]} for k, v in new_job(spec).items()}
    first["_id"] = {"$ifNull": ["$_id", lit(job_id)]}
    return Write(
        filter={"debounce_key": spec.debounce_key, "status": P, "debounce_open": True},
        update=[
            {"$set": first},
            {
                "$set": {
                    "payload": lit(spec.payload),
                    "run_at": {"$min": [after(spec.debounce_s * 1000), "$debounce_until"]},
                    "debounced": {"$add": [{"$ifNull": ["$debounced", 0]}, 1]},
                    "updated_at": NOW,
                }
            },
        ],
    )


def key_released(job_id: str, key: str | None) -> Write:
    """Free a key whose unique window is over (by the server's clock): the old job keeps it
    as `released_key`."""
    return Write(
        filter={"_id": job_id, "idempotency_key": key, "$expr": {"$lte": ["$unique_until", NOW]}},
        update=[
            {"$set": {"released_key": lit(key), "updated_at": NOW}},
            {"$unset": "idempotency_key"},
        ],
    )
