"""Reading the jobs collection: one job, many, a page of a listing, counts, and the raw
documents the API's live events read (no writes here). Every listing, search and grouping
is built by `brook.common.store.queries.listing` and bounded by `query_max_ms`."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from datetime import datetime
from typing import Any

from bson import ObjectId, Timestamp
from pymongo import ASCENDING
from pymongo.asynchronous.cursor import AsyncCursor
from pymongo.errors import ExecutionTimeout

from brook.common.domain.errors import InvalidInput, JobNotFound, SearchTooBroad
from brook.common.domain.models import DEFAULT_QUEUE, Doc, Job
from brook.common.domain.status import JobStatus
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.queries.listing import (
    HEAVY_FIELDS,
    MAX_ERROR_TYPES,
    Aggregate,
    Find,
    ListFilter,
    error_type_after,
    failure_groups,
    list_find,
    queue_counts,
    status_counts,
)

# What a read stopped by its time bound tells the caller to do.
LIST_NARROWER = (
    "narrow it: a key, an error type, a queue, a task or a status, or a shorter"
    " since/until range"
)
FAILURES_NARROWER = "narrow it: a later since"
# The job counts (read in the background, kept in memory) get this many times the bound.
COUNT_FACTOR = 10


@contextlib.contextmanager
def _bounded(max_ms: int, narrower: str) -> Iterator[None]:
    """A read the server stopped at its `maxTimeMS` (MaxTimeMSExpired, code 50) raises
    `SearchTooBroad`, saying how to narrow it."""
    try:
        yield
    except ExecutionTimeout:
        raise SearchTooBroad(
            f"the search was too broad: it did not finish within {max_ms} ms"
            f" (BROOK_QUERY_MAX_MS); {narrower}"
        ) from None


class JobReads(JobsCollection):
    """Reads of jobs by id, by listing and by count."""

    async def get(self, job_id: str) -> Job:
        doc = await self.jobs.find_one({"_id": job_id})
        if doc is None:
            raise JobNotFound(job_id)
        return Job.from_doc(doc)

    async def get_many(self, job_ids: Collection[str]) -> dict[str, Job]:
        """The jobs of these ids that exist, by id."""
        docs = await self.jobs.find({"_id": {"$in": list(job_ids)}}).to_list()
        return {d["_id"]: Job.from_doc(d) for d in docs}

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        task: str | None = None,
        queue: str | None = None,
        limit: int = 50,
        after: str | None = None,
        key: str | None = None,
        error: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        include: frozenset[str] = frozenset(HEAVY_FIELDS),
    ) -> tuple[list[Job], str | None]:
        """Newest first; `after` is the `next` cursor of the previous page (the id of its
        last job). The search of the dashboard: `key`, `error` (the start of the error's
        type, case-sensitive) and `since`/`until` (created at or after / before). `payload`
        and `result` are read only if `include` names them (a job read without them has
        `{}` and `None` there). Too broad for `query_max_ms`: `SearchTooBroad`."""
        spec = await self.list_query(
            status=status,
            task=task,
            queue=queue,
            limit=limit,
            after=after,
            key=key,
            error=error,
            since=since,
            until=until,
            include=include,
        )
        if spec is None:
            return [], None
        with _bounded(self.query_max_ms, LIST_NARROWER):
            docs = await self.find_cursor(spec).to_list()
        jobs = [Job.from_doc(d) for d in docs[:limit]]
        nxt = jobs[-1].id if len(docs) > limit else None
        return jobs, nxt

    async def list_query(
        self,
        *,
        status: JobStatus | None = None,
        task: str | None = None,
        queue: str | None = None,
        limit: int = 50,
        after: str | None = None,
        key: str | None = None,
        error: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        include: frozenset[str] = frozenset(HEAVY_FIELDS),
    ) -> Find | None:
        """The `find` that `list_jobs` runs for these filters (None: nothing can match, as
        for an error prefix that names no type): an error prefix resolved to the types it
        names, the `after` cursor to its job's creation time."""
        types: tuple[str, ...] | None = None
        if error is not None:
            types = await self._error_types(error)
            if not types:
                return None
        f = ListFilter(
            status=None if status is None else status.value,
            task=task,
            queue=queue,
            key=key,
            error_types=types,
            since=since,
            until=until,
            after=None if after is None else await self._cursor(after),
        )
        return list_find(f, limit, include)

    def find_cursor(self, spec: Find) -> AsyncCursor[Doc]:
        """The cursor of one `find` of `queries.listing`, bounded by `query_max_ms` (a test
        explains exactly this)."""
        return (
            self.jobs.find(spec.filter, spec.projection)
            .sort(spec.sort)
            .hint(spec.hint)
            .limit(spec.limit)
            .max_time_ms(self.query_max_ms)
        )

    async def _error_types(self, prefix: str) -> tuple[str, ...]:
        """The error types that start with `prefix`, a seek each in `errors`; more than
        `MAX_ERROR_TYPES`: `SearchTooBroad`."""
        found: list[str] = []
        with _bounded(self.query_max_ms, LIST_NARROWER):
            while len(found) <= MAX_ERROR_TYPES:
                docs = await self.find_cursor(
                    error_type_after(prefix, found[-1] if found else None)
                ).to_list()
                if not docs:
                    return tuple(found)
                found.append(str(docs[0]["error"]["type"]))
        raise SearchTooBroad(
            f"the search was too broad: error={prefix!r} starts more than {MAX_ERROR_TYPES}"
            " error types; give more of the type"
        )

    async def _cursor(self, after: str) -> tuple[datetime, str]:
        """Where the page after job `after` starts: that job's creation time and id. A job
        deleted since (retention) is placed by the time in its id."""
        doc = await self.jobs.find_one({"_id": after}, {"created_at": 1})
        if doc is not None:
            return doc["created_at"], after
        if ObjectId.is_valid(after):
            return ObjectId(after).generation_time, after
        where: list[object] = ["query", "after"]
        msg = "not a job id (pass the `next` of the previous page)"
        raise InvalidInput([{"loc": where, "msg": msg, "type": "value_error"}])

    async def trace_contexts(self, job_ids: Collection[str]) -> list[dict[str, str]]:
        """The stored trace contexts of these jobs (those that have one), for span links."""
        docs = await self.jobs.find({"_id": {"$in": list(job_ids)}}, {"trace": 1}).to_list()
        return [d["trace"] for d in docs if d.get("trace")]


    async def failure_groups(self, since: datetime | None, limit: int = 50) -> list[Doc]:
        """Jobs with an error (failed, or pending for a retry), grouped by error type and
        task: how many of each (`failed`, `retrying`) and the latest one, newest groups
        first. Failed jobs are read through the `failures` index (`since`: finished at or
        after), jobs waiting for a retry through `errors`; too broad for `query_max_ms`:
        `SearchTooBroad`."""
        groups: dict[tuple[Any, Any], Doc] = {}
        for kind in ("failed", "retrying"):
            for row in await self.run_aggregate(failure_groups(kind, since), FAILURES_NARROWER):
                at = (row["_id"].get("type"), row["_id"].get("task"))
                group = groups.setdefault(
                    at, {"_id": row["_id"], "failed": 0, "retrying": 0, "latest": row["latest"]}
                )
                group[kind] = row["n"]
                if row["latest"]["at"] > group["latest"]["at"]:
                    group["latest"] = row["latest"]
        newest = sorted(groups.values(), key=lambda g: g["latest"]["at"], reverse=True)
        return newest[:limit]

    async def run_aggregate(self, spec: Aggregate, narrower: str | None = None) -> list[Doc]:
        """One aggregation of `queries.listing`, bounded by `query_max_ms`: stopped there,
        `SearchTooBroad` saying `narrower`. Without `narrower` (the job counts, read in the
        background), `COUNT_FACTOR` times as long, and the server's error as it is."""
        if narrower is None:
            cursor = await self.jobs.aggregate(
                spec.pipeline, hint=spec.hint, maxTimeMS=self.query_max_ms * COUNT_FACTOR
            )
            return await cursor.to_list()
        with _bounded(self.query_max_ms, narrower):
            cursor = await self.jobs.aggregate(
                spec.pipeline, hint=spec.hint, maxTimeMS=self.query_max_ms
            )
            return await cursor.to_list()

    async def count_by_status(self) -> dict[str, int]:
        """Jobs per status, in one aggregation over the keys of `list_status`."""
        counts = {s.value: 0 for s in JobStatus}
        for row in await self.run_aggregate(status_counts()):
            counts[str(row["_id"])] = int(row["n"])
        return counts

    async def count_by_queue(self) -> dict[str, dict[str, int]]:
        """Jobs per queue and status, in one aggregation over the keys of `list_queue`;
        queues in name order."""
        rows = await self.run_aggregate(queue_counts())
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            queue = str(row["_id"]["queue"])
            counts.setdefault(queue, {s.value: 0 for s in JobStatus})
            counts[queue][str(row["_id"]["status"])] = int(row["n"])
        return dict(sorted(counts.items()))

    async def job_doc(self, job_id: str, projection: Doc | None = None) -> Doc | None:
        """The job's stored document, fields this version's `Job` does not know included
        (cut by `projection` when given)."""
        return await self.jobs.find_one({"_id": job_id}, projection)

    async def job_doc_now(
        self, job_id: str, projection: Doc | None = None
    ) -> tuple[Doc | None, Timestamp | None]:
        """The job's stored document and the cluster time it was read at: every change up
        to that time is in it."""
        async with self.db.client.start_session(causal_consistency=True) as session:
            doc = await self.jobs.find_one({"_id": job_id}, projection, session=session)
            return doc, session.operation_time

    async def changed_since(
        self,
        since: datetime,
        *,
        job_id: str | None = None,
        queue: str | None = None,
        task: str | None = None,
        status: JobStatus | None = None,
        limit: int = 500,
        projection: Doc | None = None,
    ) -> list[Doc]:
        """Jobs changed at or after `since`, oldest change first (a client's catch-up after its
        history was lost; rare, and not indexed: it reads what the other filters leave, for
        `query_max_ms` at most, then `SearchTooBroad`)."""
        query: dict[str, Any] = {"updated_at": {"$gte": since}}
        if job_id is not None:
            query["_id"] = job_id
        if queue is not None:
            query["queue"] = {"$in": [queue, None]} if queue == DEFAULT_QUEUE else queue
        if task is not None:
            query["task"] = task
        if status is not None:
            query["status"] = status.value
        cursor = self.jobs.find(query, projection).max_time_ms(self.query_max_ms)
        with _bounded(self.query_max_ms, "watch one queue, task or status"):
            return await cursor.sort("updated_at", ASCENDING).limit(limit).to_list()
