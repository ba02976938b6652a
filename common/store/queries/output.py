"""Builders of a job's output stream (`ctx.emit`): the fenced write on the job that lets a
batch of an attempt's chunks in."""

from __future__ import annotations

from brook.common.store.queries.base import Write, not_in_transaction, running_fence
from brook.common.store.records import Lease


def output_appended(lease: Lease, owner: str, first_seq: int, chunks: int, size: int) -> Write:
    """A running attempt appends `chunks` chunks (`size` bytes) from `first_seq` on: fenced
    like a completion (attempt, owner, running; never into the attempt's own open
    transaction), and only right after the job's last chunk (`output.chunks`), so a batch
    is taken once and in order. Written in the transaction that inserts the chunks: a
    zombie attempt's batch matches nothing, and its chunks are never inserted."""
    return Write(
        filter={
            **running_fence(lease, owner),
            **not_in_transaction(lease.attempt),
            "$expr": {"$eq": [{"$ifNull": ["$output.chunks", 0]}, first_seq - 1]},
        },
        update={"$inc": {"output.chunks": chunks, "output.bytes": size}},
    )
