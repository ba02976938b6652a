"""Settling a parent's dependents once it ended, from wherever it ended.

Who settles: the dispatcher that completed or failed the parent (right after its write),
the client core that cancelled it, the submitter that attached a child to a parent that
had already ended, and every dispatcher's sweep, for a parent whose settler died first.
Settling is idempotent: each child's change is one conditional write (`waiting` in its
filter), so two settlers of the same parent change each child once, and it is logged by
the one whose write changed it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Literal

import structlog

from brook.common.domain.status import JobStatus
from brook.common.runtime.log_events import Event, log_event, requested_by
from brook.common.store.jobs import JobStore, Settled, Submitted

Via = Literal["completion", "failure", "cancel", "submit", "retry", "sweep"]
# What a caller asked for (its dependents' changes name who asked); the rest are the
# dispatchers' own.
ASKED: frozenset[Via] = frozenset({"cancel", "submit", "retry"})


async def settle(store: JobStore, parent_ids: Collection[str], *, via: Via) -> list[Settled]:
    """Settle the waiting children of whichever of these jobs have ended, then, for each
    child cancelled by it, that child's own children, and so on down the graph. Jobs that
    have not ended are left alone. Returns every child whose status changed."""
    out: list[Settled] = []
    frontier = list(dict.fromkeys(parent_ids))
    while frontier:
        # A finished parent without an `unsettled` token has no child left to settle (its
        # children were settled and it was unmarked, or it never had any): skip the search.
        ended = [p for p in await store.ended_parents(frontier) if p.token or p.status is None]
        if not ended:
            break
        settled = await store.settle_children(ended)
        # Only now: a settler that dies before this leaves the parents to the sweep.
        await store.mark_settled(ended)
        for child in settled:
            _log(child, via)
        out += settled
        cancelled = [c for c in settled if c.status == JobStatus.CANCELLED]
        frontier = [c.job_id for c in cancelled if c.has_dependents]
    return out


async def recheck(store: JobStore, submitted: Sequence[Submitted], *, via: Via) -> list[Submitted]:
    """After new waiting jobs went in (or came back, `retry`): settle them against parents
    that ended before they were attached, and return them as they are now."""
    parents = {
        parent
        for s in submitted
        if s.job.status == JobStatus.WAITING
        for parent in s.job.parents_left
    }
    if not parents:
        return list(submitted)
    settled = await settle(store, parents, via=via)
    changed = {c.job_id for c in settled} & {s.job.id for s in submitted}
    if not changed:
        return list(submitted)
    fresh = await store.get_many(changed)
    return [
        Submitted(job=fresh[s.job.id], created=s.created) if s.job.id in fresh else s
        for s in submitted
    ]


def _log(child: Settled, via: Via) -> None:
    # Brook's own processes configure logging; a program using the client logs Brook's
    # events only if it configured structlog itself.
    if not structlog.is_configured():
        return
    fields: dict[str, Any] = {
        "job_id": child.job_id,
        "attempt": child.attempt,
        "task": child.task,
        "via": via,
    }
    if via in ASKED:
        fields["by"] = requested_by.get()
    if child.status == JobStatus.PENDING:
        log_event(Event.JOB_UNBLOCKED, **fields)
    else:
        error = child.error or {}
        log_event(
            Event.JOB_DEPENDENCY_FAILED,
            level="warning",
            **fields,
            error_type=error.get("type"),
            error_message=error.get("message"),
        )
