"""The reads that list, search and group jobs, as pure builders: the index each reads
(named, so the plan never depends on the plan cache), its filter and the order the index
gives. The jobs store (`brook.common.store.jobs.reads`) runs them, each bounded by
`maxTimeMS`; the tests explain exactly these.

Every listing reads one index in its own order, newest first (`created_at`, then `_id`):
never a sort in memory, so a page costs the keys it reads, not the jobs that match. The
index is the one whose equality prefix the filters fill best; the other filters are
checked on the jobs it reads (a combination that leaves few of them may read many, and is
then stopped by its time bound: `SearchTooBroad`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from brook.common.domain.models import DEFAULT_QUEUE
from brook.common.domain.status import ACTIVE, JobStatus

ALL_STATUSES = sorted(s.value for s in JobStatus)
_ACTIVE = {s.value for s in ACTIVE}
LIST_SORT: list[tuple[str, int]] = [("created_at", -1), ("_id", -1)]
# What a listing leaves out unless asked (`include`): a job's data, up to megabytes each.
# A durable step's result is never shown by the API, so never read for a listing.
HEAVY_FIELDS = ("payload", "result")
# The error types one `error` prefix may name: each is a scan of `errors` per status (six),
# merged in order, and MongoDB merges at most 200 scans.
MAX_ERROR_TYPES = 30
HAS_ERROR = {"$type": "string"}  # what the partial index `errors` holds


@dataclass(frozen=True, kw_only=True)
class ListFilter:
    """A listing's filters, user values as they are (each goes in as an equality value)."""

    status: str | None = None
    task: str | None = None
    queue: str | None = None
    key: str | None = None
    error_types: tuple[str, ...] | None = None  # the types an `error` prefix names
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before
    after: tuple[datetime, str] | None = None  # (created_at, id) of the last job shown


@dataclass(frozen=True, kw_only=True)
class Find:
    """One `find`: filter, projection, the index it reads, the order and the most jobs."""

    filter: dict[str, Any]
    projection: dict[str, int]
    hint: str
    sort: list[tuple[str, int]]
    limit: int


@dataclass(frozen=True, kw_only=True)
class Aggregate:
    """One aggregation and the index it reads."""

    pipeline: list[dict[str, Any]]
    hint: str


def list_projection(include: frozenset[str] = frozenset()) -> dict[str, int]:
    """Every field but the heavy ones not asked for (and the steps' results)."""
    return {**{f: 0 for f in HEAVY_FIELDS if f not in include}, "steps.result": 0}


def list_index(f: ListFilter) -> str:
    """The index a listing reads: the one whose equality prefix its filters fill best. A
    key or error type names few jobs; a queue with a status is the whole prefix of
    `list_queue`; an active status (few jobs) before a task, a task before a finished
    status (most jobs)."""
    if f.key is not None:
        return "by_key"
    if f.error_types is not None:
        return "errors"
    if f.queue is not None and (f.status is not None or f.task is None):
        return "list_queue"
    if f.status in _ACTIVE:
        return "list_status"
    if f.task is not None:
        return "list_task"
    if f.status is not None:
        return "list_status"
    return "list_created"


def list_find(f: ListFilter, limit: int, include: frozenset[str] = frozenset()) -> Find:
    """A page of jobs newest first: `limit` + 1 read, the extra one telling whether there is
    a next page."""
    index = list_index(f)
    query: dict[str, Any] = {}
    for name, value in (("task", f.task), ("queue", f.queue)):
        if value is not None:
            query[name] = {"$eq": value}
    if f.key is not None:
        query["key"] = {"$eq": f.key, "$type": "string"}  # what `by_key` holds
    if f.error_types is not None:
        query["error.type"] = {"$in": list(f.error_types), **HAS_ERROR}
    if f.status is not None:
        query["status"] = {"$eq": f.status}
    elif index in ("by_key", "errors", "list_queue"):
        # Every status: one scan per status of the index, merged in its order.
        query["status"] = {"$in": ALL_STATUSES}
    created: dict[str, datetime] = {}
    if f.since is not None:
        created["$gte"] = f.since
    if f.until is not None:
        created["$lt"] = f.until
    if f.after is not None:
        at, job_id = f.after
        created["$lte"] = at
        query["$or"] = [{"created_at": {"$lt": at}}, {"_id": {"$lt": job_id}}]
    if created:
        query["created_at"] = created
    return Find(
        filter=query,
        projection=list_projection(include),
        hint=index,
        sort=LIST_SORT,
        limit=limit + 1,
    )


def prefix_range(prefix: str) -> dict[str, str]:
    """The strings that start with `prefix`, as a range of the server's (binary, UTF-8)
    string order: from `prefix` to `prefix` with its last character one higher. A range,
    not a regular expression: any text is a valid bound (a NUL byte is not valid in a
    pattern, which the server refuses)."""
    head = prefix.rstrip("\U0010ffff")
    if not head:
        return {"$gte": prefix}  # only the highest characters: everything after it
    nxt = ord(head[-1]) + 1
    if 0xD800 <= nxt <= 0xDFFF:  # surrogates are no characters of UTF-8
        nxt = 0xE000
    return {"$gte": prefix, "$lt": head[:-1] + chr(nxt)}


def error_type_after(prefix: str, last: str | None) -> Find:
    """The first error type after `last` that starts with `prefix` (case-sensitive): one
    seek in `errors`, read from its keys alone."""
    match: dict[str, Any] = {**HAS_ERROR, **prefix_range(prefix)}
    if last is not None:
        match["$gt"] = last
    return Find(
        filter={"error.type": match},
        projection={"_id": 0, "error.type": 1},
        hint="errors",
        sort=[("error.type", 1)],
        limit=1,
    )


_FAILURE_GROUP: dict[str, Any] = {
    "$group": {
        "_id": {"type": "$error.type", "task": "$task"},
        "n": {"$sum": 1},
        "latest": {
            "$top": {
                "sortBy": {"updated_at": -1},
                "output": {"id": "$_id", "error": "$error", "at": "$updated_at"},
            }
        },
    }
}


def failure_groups(kind: str, since: datetime | None = None) -> Aggregate:
    """Jobs with an error grouped by error type and task: how many, and the latest (by its
    last change). `failed`: failed jobs (finished at or after `since`), from `failures`;
    `retrying`: pending jobs with an error (waiting for their next attempt), from
    `errors`. Only the fields the groups need are read, and nothing is sorted but the
    groups."""
    if kind == "failed":
        match: dict[str, Any] = {"status": JobStatus.FAILED.value}
        if since is not None:
            match["finished_at"] = {"$gte": since}
        hint = "failures"
    elif kind == "retrying":
        match = {"error.type": HAS_ERROR, "status": JobStatus.PENDING.value}
        hint = "errors"
    else:
        raise ValueError(f"no failure group {kind!r}")
    project = {"$project": {"task": 1, "error": 1, "updated_at": 1}}
    return Aggregate(pipeline=[{"$match": match}, project, _FAILURE_GROUP], hint=hint)


def queue_counts() -> Aggregate:
    """Jobs per queue and status, read from the keys of `list_queue` alone."""
    queue = {"$ifNull": ["$queue", DEFAULT_QUEUE]}
    return Aggregate(
        pipeline=[{"$group": {"_id": {"queue": queue, "status": "$status"}, "n": {"$sum": 1}}}],
        hint="list_queue",
    )


def status_counts() -> Aggregate:
    """Jobs per status, read from the keys of `list_status` alone."""
    return Aggregate(
        pipeline=[{"$group": {"_id": "$status", "n": {"$sum": 1}}}], hint="list_status"
    )
