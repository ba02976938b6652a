"""Completions by group commit: jobs that finish while a completion write is in flight are
written together in the next one (one fenced `bulk_write`, one majority wait). Each
completion stays fenced by its own filter (`_id`, attempt, owner, running)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from common.batching import GroupCommit
from common.store import JobStore, Lease

Verdict = tuple[Literal["applied", "lost", "refused", "deadline"], str]
Retrying = Callable[..., Awaitable[Any]]


class Completer:
    def __init__(self, store: JobStore, owner: str, retrying: Retrying, deadline: float) -> None:
        self.store = store
        self.owner = owner
        self.retrying = retrying
        self.deadline = deadline
        self._group: GroupCommit[tuple[Lease, Any], Verdict] = GroupCommit(self._write)

    async def complete(self, lease: Lease, result: Any) -> Verdict:
        return await self._group.submit((lease, result))

    async def _write(self, items: Sequence[tuple[Lease, Any]]) -> list[Verdict]:
        written = await self.retrying(
            "complete", lambda: self.store.complete_many(self.owner, items), deadline=self.deadline
        )
        if written is None:
            return [("deadline", "")] * len(items)
        done, refused = written
        verdicts: list[Verdict] = []
        for lease, _ in items:
            if lease.job_id in done:
                verdicts.append(("applied", ""))
            elif lease.job_id in refused:
                verdicts.append(("refused", refused[lease.job_id]))
            else:
                verdicts.append(("lost", ""))
        return verdicts
