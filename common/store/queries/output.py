"""Builders of a job's output stream (`ctx.emit`): the fence a batch of an attempt's chunks
is read against, and the fenced write of the job's count of its output."""

from __future__ import annotations

from typing import Any

from brook.common.store.queries.base import Write, not_in_transaction, running_fence
from brook.common.store.records import Lease

# What a batch's transaction reads of each job: enough to tell `holds`.
FENCE_FIELDS = {"attempts": 1, "owner": 1, "status": 1, "tx": 1}


def holds(doc: dict[str, Any] | None, lease: Lease, owner: str) -> bool:
    """Whether the job as read (`FENCE_FIELDS`) is held by this attempt and owner: what
    `running_fence` asks of a write, asked of a read."""
    if doc is None:
        return False
    return all(doc.get(k) == v for k, v in running_fence(lease, owner).items() if k != "_id")


def output_counted(lease: Lease, owner: str, chunks: int, size: int) -> Write:
    """The job's count of its output (`output: {chunks, bytes}`, every attempt together),
    raised to `chunks` and `size` by the attempt that holds the job (fenced like a
    completion; never into the attempt's own open transaction). Never lowered: a count
    written late changes nothing."""
    return Write(
        filter={**running_fence(lease, owner), **not_in_transaction(lease.attempt)},
        update={"$max": {"output.chunks": chunks, "output.bytes": size}},
    )
