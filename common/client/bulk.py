"""Retry or cancel every job a filter names (`brook.common.domain.bulk`), written once for the
HTTP API (`POST /jobs/retry`, `POST /jobs/cancel`), the Python client (`retry_many`,
`cancel_many`) and the CLI, each naming the jobs with one `JobFilter`.

The jobs are changed in pages: each page is one read of up to `PAGE` ids and one
conditional write whose fence is the single-job operation's (a retry takes only failed or
cancelled jobs, a cancel only waiting or pending ones, and asks running ones to stop). A
changed job leaves the filter, so the next page is the next jobs, and the same request sent
again changes nothing more: the answer counts the jobs it changed (under `dry_run`, the
jobs it would change). Every job changed is one log line, as for the single-job calls;
a cancelled parent's dependents are settled, and the jobs a cancelled job spawned are
cancelled down the tree (`brook.common.client.spawned`); a job with parents is retried on
its own, to wait for those that have not completed.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from brook.common.client.dependents import settle
from brook.common.client.spawned import cancel_spawned
from brook.common.domain.bulk import BulkAction, JobFilter, validate_bulk
from brook.common.domain.errors import JobConflict, JobNotFound
from brook.common.domain.models import Doc, Job
from brook.common.runtime.log_events import Event, log_event, requested_by
from brook.common.store.jobs import JobStore


def _log(event: Event, doc: Doc) -> None:
    if structlog.is_configured():
        log_event(
            event,
            job_id=str(doc["_id"]),
            attempt=int(doc.get("attempts", 0)),
            task=doc.get("task"),
            via="bulk",
            by=requested_by.get(),
        )


@dataclass(frozen=True, kw_only=True)
class BulkCount:
    """What a bulk operation changed: `count`, the jobs its filter named, and
    `spawned_cancelled`, the jobs a cancel reached below them (spawned, `ParentCancelled`)."""

    count: int
    spawned_cancelled: int = 0


class BulkOperations:
    _store: JobStore

    async def retry(self, job_id: str) -> Job:
        raise NotImplementedError

    async def bulk(self, action: BulkAction, body: object) -> int:
        """Retry or cancel the jobs the body's filter names; the number changed (or, with
        `dry_run`, that would be). `InvalidInput` (the API's 422) for a bad body."""
        return (await self.bulk_counts(action, body)).count

    async def bulk_counts(self, action: BulkAction, body: object) -> BulkCount:
        """`bulk`, with the spawned jobs a cancel reached beside the count (a retry reaches
        none): every unfinished job that a job it cancelled spawned (`ctx.submit`), down the
        tree (`ParentCancelled`)."""
        f, dry_run = validate_bulk(body)
        if dry_run:
            count = await self._store.count_matching(f, action)
            if action == "retry" or not count:
                return BulkCount(count=count)
            roots = await self._store.matching_ids(f, action)
            spawned = await cancel_spawned(self._store, roots, via="bulk", dry_run=True)
            return BulkCount(count=count, spawned_cancelled=spawned)
        out = BulkCount(count=0)
        # Every job this operation changes is marked with its tag and not read again: a job
        # it retried that failed again before the next page is not retried twice (nor, with
        # jobs that fail at once, again and again).
        tag = secrets.token_hex(8)
        passed: list[str] = []  # jobs it could not change (a race), or changed untagged
        while page := await self._store.matching_page(f, action, passed, tag):
            ids = [str(d["_id"]) for d in page]
            untagged: set[str] = set()
            if action == "retry":
                done, untagged = await self._retry_page(page, tag)
                spawned = 0
            else:
                done, spawned = await self._cancel_page(page, tag)
            out = BulkCount(
                count=out.count + len(done),
                spawned_cancelled=out.spawned_cancelled + spawned,
            )
            passed += [i for i in ids if i not in done or i in untagged]
        return out

    async def _retry_page(self, page: Sequence[Doc], tag: str) -> tuple[set[str], set[str]]:
        """The jobs of `page` retried; and those of them retried one by one (a job with
        parents, which waits for them), which carry no tag."""
        ids = [str(d["_id"]) for d in page]
        done = await self._store.retry_page(ids, tag)
        for doc in done:
            _log(Event.JOB_RETRIED, doc)
        out = {str(d["_id"]) for d in done}
        alone: set[str] = set()
        for doc in page:
            if doc.get("depends_on") and str(doc["_id"]) not in out:
                try:
                    await self.retry(str(doc["_id"]))  # waits for its parents
                except (JobConflict, JobNotFound):
                    continue
                out.add(str(doc["_id"]))
                alone.add(str(doc["_id"]))
        return out, alone

    async def _cancel_page(self, page: Sequence[Doc], tag: str) -> tuple[set[str], int]:
        ids = [str(d["_id"]) for d in page]
        # Marked first: a propagation cut short is finished by a dispatcher's sweep.
        await self._store.mark_spawn_cancel(ids)
        done = await self._store.cancel_page(ids, tag)
        for doc in done:
            stopping = doc.get("status") == "running"
            _log(Event.JOB_CANCEL_REQUESTED if stopping else Event.JOB_CANCELLED, doc)
        parents = [
            str(d["_id"]) for d in done if d.get("has_dependents") and d["status"] != "running"
        ]
        if parents:
            await settle(self._store, parents, via="cancel")
        spawned = await cancel_spawned(self._store, ids, via="bulk")
        return {str(d["_id"]) for d in done}, spawned

    async def retry_many(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **fields: Any
    ) -> int:
        """Retry every failed or cancelled job the filter names: `where`, or its fields as
        keywords (`status`, `task`, `queue`, `key`, `error_type`, `created_since`/
        `created_until`, `finished_since`/`finished_until`: since inclusive, until
        exclusive); the number retried, or with `dry_run` that would be."""
        return await self.bulk("retry", _body(where, fields, dry_run))

    async def cancel_many(
        self, where: JobFilter | None = None, /, *, dry_run: bool = False, **fields: Any
    ) -> int:
        """Cancel every waiting or pending job the filter names, and ask the running ones to
        stop (the filter as `retry_many`'s); the number changed, or that would be. The
        jobs they spawned are cancelled too, down the tree, not counted here (the HTTP
        answer's `spawned_cancelled` counts them)."""
        return await self.bulk("cancel", _body(where, fields, dry_run))


def _body(where: JobFilter | None, fields: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    """A bulk call's filter, given as a `JobFilter` or as its fields, as the HTTP body."""
    if where is not None and fields:
        raise TypeError("give a JobFilter or its fields as keywords, not both")
    return {**(where or JobFilter(**fields)).given(), "dry_run": dry_run}
