"""`JobStore`: the only code that touches the jobs collection.

Every method is one named operation. Every status change is one conditional write whose
filter names the expected status (and, for a running job, its owner and attempt); the
database decides, and a write that matches nothing means the caller lost a race.
Times that matter for leases and due dates come from the server clock (`$$NOW`).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument, UpdateOne
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure

from common.errors import JobConflict, JobNotFound, LeaseLost
from common.models import DEFAULT_QUEUE, Doc, Job, JobSpec
from common.settings import WEEK_S
from common.status import RETRYABLE, TERMINAL, JobStatus

JOBS = "jobs"
STATE = "brook_state"
DISPATCHERS = "brook_dispatchers"
HISTORY_CAP = 50
KEY_TRIES = 5  # a key freed and taken again by a peer, over and over: give up, say so

# MongoDB merges at most this many index scans to give a sort (internalQueryMaxScansToExplode);
# a routed claim over more tasks than this uses the general claim order instead.
MAX_MERGED_SCANS = 200
# How often `server_clock` measures the server clock's offset from this process's.
CLOCK_REFRESH_S = 10.0
# A dispatcher is live while it was seen within this many of its lease lengths.
LIVE_LEASES = 3
# What is left of a dispatcher that vanished without retiring is deleted after a day.
PRESENCE_TTL_S = 86400

P, R = JobStatus.PENDING.value, JobStatus.RUNNING.value

CLAIM_SORT: list[tuple[str, int]] = [
    ("priority", DESCENDING),
    ("run_at", ASCENDING),
    ("_id", ASCENDING),
]
_PENDING = {"status": P}

INDEXES = [
    # The queue indexes are partial: they hold only pending (or running) jobs, so they stay
    # small however many finished jobs the collection keeps, and a finished job costs them
    # nothing. Claims read them in claim order (best priority, then earliest due), so a
    # claim is an index scan that stops at the first match and never sorts in memory.
    # The general claim order; queue and task ride in the key so that a routed claim that
    # cannot use the two below (too many tasks to merge) filters on index keys alone.
    IndexModel(
        [("status", ASCENDING), *CLAIM_SORT, ("queue", ASCENDING), ("task", ASCENDING)],
        name="claim_order",
        partialFilterExpression=_PENDING,
    ),
    # A dispatcher serving every queue: one scan per task it runs, merged in claim order;
    # jobs of tasks it does not run (however many) cost it nothing.
    IndexModel(
        [("status", ASCENDING), ("task", ASCENDING), *CLAIM_SORT, ("queue", ASCENDING)],
        name="claim_by_task",
        partialFilterExpression=_PENDING,
    ),
    # A dispatcher claiming for one of its queues: one scan per task, in that queue only.
    IndexModel(
        [("status", ASCENDING), ("queue", ASCENDING), ("task", ASCENDING), *CLAIM_SORT],
        name="claim_by_queue",
        partialFilterExpression=_PENDING,
    ),
    # Next due time among the tasks a dispatcher runs (the dispatcher's timer).
    IndexModel(
        [("status", ASCENDING), ("task", ASCENDING), ("run_at", ASCENDING), ("queue", ASCENDING)],
        name="due",
        partialFilterExpression=_PENDING,
    ),
    # Watchdog: running jobs whose lease expired.
    IndexModel(
        [("status", ASCENDING), ("lease_expires_at", ASCENDING)],
        name="lease_expiry",
        partialFilterExpression={"status": R},
    ),
    # Listing, newest first, by status, task or queue.
    IndexModel([("status", ASCENDING), ("_id", DESCENDING)], name="list_status"),
    IndexModel([("task", ASCENDING), ("_id", DESCENDING)], name="list_task"),
    IndexModel([("queue", ASCENDING), ("_id", DESCENDING)], name="list_queue"),
    # An idempotency key is reserved while its job exists (or until its unique window ends).
    IndexModel(
        [("idempotency_key", ASCENDING)],
        name="idempotency_key_unique",
        unique=True,
        partialFilterExpression={"idempotency_key": {"$type": "string"}},
    ),
    # Retention: a finished job gets `expire_at` (its finish + its retention) at its terminal
    # write, and MongoDB's TTL monitor deletes it then. Active jobs have no `expire_at`.
    IndexModel(
        [("expire_at", ASCENDING)],
        name="retention",
        expireAfterSeconds=0,
        partialFilterExpression={"expire_at": {"$exists": True}},
    ),
]

PRESENCE_INDEXES = [
    IndexModel([("seen_at", ASCENDING)], name="forget", expireAfterSeconds=PRESENCE_TTL_S),
]

NOW = "$$NOW"

# Change-stream events after which a stream is over.
INVALIDATING = ("invalidate", "drop", "dropDatabase", "rename")

# Due pending jobs, by the server's clock; with CLAIM_SORT this is an IXSCAN on claim_order.
CLAIM_FILTER: dict[str, Any] = {"status": P, "$expr": {"$lte": ["$run_at", NOW]}}


def claim_filter(tasks: Collection[str] | None, queue: str | None) -> dict[str, Any]:
    """Due pending jobs of these tasks (None: any) in this queue (None: any queue)."""
    query = dict(CLAIM_FILTER)
    if tasks is not None:
        query["task"] = {"$in": sorted(tasks)}
    if queue is not None:
        query["queue"] = queue
    return query


def claim_index(tasks: Collection[str] | None, queue: str | None) -> str:
    """The index a claim reads, named (a hint) so the plan never depends on the cache."""
    if tasks is None or len(tasks) > MAX_MERGED_SCANS:
        return "claim_order"
    return "claim_by_queue" if queue is not None else "claim_by_task"


def _lit(value: Any) -> dict[str, Any]:
    """User data inside an update pipeline must never be read as an expression or field path."""
    return {"$literal": value}


def _after(ms: float) -> dict[str, Any]:
    return {"$add": [NOW, int(ms)]}


def _history(entry: dict[str, Any]) -> dict[str, Any]:
    """`history` plus `entry`, capped at HISTORY_CAP entries: the first (the submit) and the
    latest ones are kept, and `history_truncated` counts the entries dropped between."""
    grown = {"$concatArrays": [{"$ifNull": ["$history", []]}, [entry]]}
    over = {"$max": [0, {"$subtract": [{"$size": "$$grown"}, HISTORY_CAP]}]}
    capped = {
        "$cond": [
            {"$gt": [{"$size": "$$grown"}, HISTORY_CAP]},
            {
                "$concatArrays": [
                    {"$slice": ["$$grown", 1]},
                    {"$slice": ["$$grown", -(HISTORY_CAP - 1)]},
                ]
            },
            "$$grown",
        ]
    }
    return {
        "history": {"$let": {"vars": {"grown": grown}, "in": capped}},
        "history_truncated": {
            "$let": {
                "vars": {"grown": grown},
                "in": {"$add": [{"$ifNull": ["$history_truncated", 0]}, over]},
            }
        },
    }


def _expiry(default_retention_s: float) -> dict[str, Any]:
    """When a job finishing now is to be deleted: its own `retention_s`, else the default."""
    seconds = {"$ifNull": ["$retention_s", default_retention_s]}
    return {"$add": [NOW, {"$toLong": {"$multiply": [seconds, 1000]}}]}


def _new_job(spec: JobSpec, now: datetime | None = None) -> dict[str, Any]:
    """A pending job's fields. Without `now`: `$set` expressions for an update pipeline, the
    server stamping the times (`$$NOW`) and user data wrapped in `$literal`. With `now` (the
    server's time, read just before): the same fields as a document to insert as it is."""

    def lit(value: Any) -> Any:
        return _lit(value) if now is None else value

    def at(ms: float = 0) -> Any:
        if now is None:
            return _after(ms) if ms else NOW
        return now + timedelta(milliseconds=int(ms))

    run_at: Any = at()
    if spec.run_at is not None:
        run_at = lit(spec.run_at)
    elif spec.delay_s is not None:
        run_at = at(spec.delay_s * 1000)
    fields: dict[str, Any] = {
        "task": lit(spec.task),
        "payload": lit(spec.payload),
        "status": P,
        "queue": lit(spec.queue),
        "priority": spec.priority,
        "attempts": 0,
        "max_attempts": spec.max_attempts,
        "attempt_budget": spec.max_attempts,  # what a `retry` grants again
        "run_at": run_at,
        "created_at": at(),
        "updated_at": at(),
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
        "timeout_s": spec.timeout_s,
        "owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        "history": [{"status": P, "at": at(), "attempt": 0}],
        "progress": None,
    }
    if spec.idempotency_key is not None:
        fields["idempotency_key"] = lit(spec.idempotency_key)
    if spec.unique_for_s is not None:
        fields["unique_until"] = at(spec.unique_for_s * 1000)
    if spec.retention_s is not None:
        fields["retention_s"] = spec.retention_s
    if spec.schedule is not None:
        fields["schedule"] = lit(spec.schedule)
    return fields


def _claimed(owner: str, lease_seconds: float) -> dict[str, Any]:
    """A lease, not a start: a claimed job may wait in its dispatcher's prefetch buffer, so
    `started_at` stays null until its task really starts (see `RunTimes`)."""
    attempt = {"$add": ["$attempts", 1]}
    return {
        "status": R,
        "owner": _lit(owner),
        "attempts": attempt,
        "started_at": None,
        "updated_at": NOW,
        "lease_expires_at": _after(lease_seconds * 1000),
        **_history({"status": R, "at": NOW, "attempt": attempt, "owner": _lit(owner)}),
        "progress": None,  # a new attempt starts from nothing
    }


def _as_claimed(doc: Doc, owner: str) -> Job:
    """A pending job as `_claimed` left it (the fields a dispatcher reads of its claim)."""
    return Job.from_doc(
        {
            **doc,
            "status": R,
            "owner": owner,
            "attempts": int(doc.get("attempts", 0)) + 1,
            "started_at": None,
            "progress": None,
        }
    )


def _ran(ran: RunTimes | None) -> dict[str, Any]:
    """`started_at` / `finished_at` of an attempt that ran: the task's own start and end as
    its dispatcher measured them; without them, the time of this write."""
    if ran is None:
        return {"started_at": {"$ifNull": ["$started_at", NOW]}, "finished_at": NOW}
    return {"started_at": ran.started_at, "finished_at": ran.finished_at}


def _completed(
    lease: Lease, result: Any, retention_s: float, ran: RunTimes | None = None
) -> dict[str, Any]:
    return {
        "status": JobStatus.COMPLETED.value,
        "result": _lit(result),
        "error": None,
        **_ran(ran),
        "expire_at": _expiry(retention_s),
        "updated_at": NOW,
        "owner": None,
        "lease_expires_at": None,
        **_history({"status": JobStatus.COMPLETED.value, "at": NOW, "attempt": lease.attempt}),
    }


def _retried() -> dict[str, Any]:
    """A finished job back to pending, with as many attempts again as it was submitted with.
    `attempts` keeps counting: it is the fencing token, and must never be reused."""
    return {
        "status": P,
        "max_attempts": {
            "$add": ["$attempts", {"$ifNull": ["$attempt_budget", "$max_attempts"]}]
        },
        "run_at": NOW,
        "finished_at": None,
        "expire_at": "$$REMOVE",
        "updated_at": NOW,
        "owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        **_history({"status": P, "at": NOW, "attempt": "$attempts", "reason": "retry"}),
    }


@dataclass(frozen=True, kw_only=True)
class Submitted:
    job: Job
    created: bool


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a dispatcher holds: the job and the attempt number that fences its writes."""

    job_id: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class RunTimes:
    """When an attempt's task really started and ended, on the server's clock as its
    dispatcher reads it (its own clock plus a measured offset): a claimed job may wait in
    the prefetch buffer, and its outcome may be written a little after the task ended."""

    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True, kw_only=True)
class ExpiredLease:
    """A running job whose lease is over by the server's clock (the watchdog's find)."""

    job_id: str
    attempt: int
    task: str
    owner: str


@dataclass(frozen=True, kw_only=True)
class LiveDispatcher:
    """A live dispatcher as it published itself: the tasks it runs and the queues it serves
    (None: every queue)."""

    owner: str
    name: str
    tasks: frozenset[str]
    queues: dict[str, int] | None
    seen_at: datetime


class JobStore:
    def __init__(self, db: AsyncDatabase[Doc], *, retention_s: float = WEEK_S) -> None:
        self.db = db
        self.jobs: AsyncCollection[Doc] = db[JOBS]
        self.state: AsyncCollection[Doc] = db[STATE]
        self.dispatchers: AsyncCollection[Doc] = db[DISPATCHERS]
        # How long a finished job without its own `retention_s` is kept (the TTL's input).
        self.retention_s = retention_s
        self._clock_offset = 0.0  # server clock - local clock, seconds (see server_clock)
        self._clock_read_at = -math.inf

    async def ensure_indexes(self) -> None:
        """Idempotent: an index that exists with the same spec is a no-op; one that exists
        under the same name with another spec (an older Brook) is rebuilt."""
        for collection, models in ((self.jobs, INDEXES), (self.dispatchers, PRESENCE_INDEXES)):
            try:
                await collection.create_indexes(models)
            except OperationFailure as exc:
                if exc.code not in (85, 86):  # IndexOptionsConflict, IndexKeySpecsConflict
                    raise
                for model in models:
                    await self._rebuild_index(collection, model)

    async def _rebuild_index(self, collection: AsyncCollection[Doc], model: IndexModel) -> None:
        # Several processes (API, dispatchers) may do this at once: a peer may drop or
        # recreate the index between our steps, so tolerate both and try again.
        for _ in range(5):
            try:
                await collection.create_indexes([model])
                return
            except OperationFailure as exc:
                if exc.code not in (85, 86):
                    raise
            try:
                await collection.drop_index(model.document["name"])
            except OperationFailure as exc:
                if exc.code != 27:  # IndexNotFound: a peer dropped it first
                    raise
        await collection.create_indexes([model])

    # -- submit / read ---------------------------------------------------------------------

    async def submit(self, spec: JobSpec) -> Submitted:
        """Insert a pending job, majority-acknowledged; a known idempotency key returns its job."""
        for _ in range(KEY_TRIES):
            try:
                # An upsert on a fresh _id always inserts, and lets the server stamp the times.
                doc = await self.jobs.find_one_and_update(
                    {"_id": str(ObjectId())},
                    [{"$set": _new_job(spec)}],
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                holder = await self._key_holder(spec)
                if holder is not None:
                    return Submitted(job=holder, created=False)
                continue  # the key was freed meanwhile: insert again
            assert doc is not None
            return Submitted(job=Job.from_doc(doc), created=True)
        raise JobConflict(f"idempotency key {spec.idempotency_key!r} keeps changing hands")

    async def submit_many(self, specs: Sequence[JobSpec]) -> list[Submitted]:
        """`submit` for many jobs in one write (one `insert_many`, one majority wait), in
        order. A job whose idempotency key exists (or repeats within the batch) returns the
        job holding it; only a key whose unique window ended meanwhile costs more round
        trips."""
        # One reading of the server's clock stamps the whole batch: an insert cannot evaluate
        # `$$NOW`, and an upsert per job costs the server several times more.
        now = await self.server_clock()
        docs = [{"_id": str(ObjectId()), **_new_job(spec, now)} for spec in specs]
        duplicates = await self._insert_new(docs)
        out: list[Submitted] = []
        for i, spec in enumerate(specs):
            if i not in duplicates:
                out.append(Submitted(job=Job.from_doc(docs[i]), created=True))
                continue
            holder = await self._key_holder(spec)
            out.append(
                Submitted(job=holder, created=False) if holder else await self.submit(spec)
            )
        return out

    async def _insert_new(self, docs: Sequence[Doc]) -> set[int]:
        """Insert these new jobs (one unordered `insert_many`); return the indexes refused
        for an idempotency key that is already taken."""
        try:
            await self.jobs.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") != 11000 for err in errors):
                raise
            return {int(err["index"]) for err in errors}
        return set()

    async def _key_holder(self, spec: JobSpec) -> Job | None:
        """The job holding `spec`'s idempotency key, or None if the key is free again: its
        job is gone (retention), or its unique window is over, in which case the key is
        released from that job here, by one conditional write on the server's clock (the
        old job keeps existing, under `released_key`)."""
        key = spec.idempotency_key
        for _ in range(KEY_TRIES):
            doc = await self.jobs.find_one({"idempotency_key": key})
            if doc is None or doc.get("unique_until") is None:
                return Job.from_doc(doc) if doc is not None else None
            window_over = {"$expr": {"$lte": ["$unique_until", NOW]}}
            released = await self.jobs.update_one(
                {"_id": doc["_id"], "idempotency_key": key, **window_over},
                [
                    {"$set": {"released_key": _lit(key), "updated_at": NOW}},
                    {"$unset": "idempotency_key"},
                ],
            )
            if released.modified_count:
                return None
            # Not released: its window is still open, or a peer released the key (and
            # maybe took it) meanwhile. Whoever holds it now is the answer.
            holder = await self.jobs.find_one({"idempotency_key": key})
            if holder is None or holder["_id"] == doc["_id"]:
                return Job.from_doc(holder) if holder is not None else None
        raise JobConflict(f"idempotency key {key!r} keeps changing hands")

    async def get(self, job_id: str) -> Job:
        doc = await self.jobs.find_one({"_id": job_id})
        if doc is None:
            raise JobNotFound(job_id)
        return Job.from_doc(doc)

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        task: str | None = None,
        queue: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """Newest first; `after` is the `next` cursor of the previous page."""
        query: dict[str, Any] = {}
        if status is not None:
            query["status"] = status.value
        if task is not None:
            query["task"] = task
        if queue is not None:
            query["queue"] = queue
        if after is not None:
            query["_id"] = {"$lt": after}
        cursor = self.jobs.find(query).sort("_id", DESCENDING).limit(limit + 1)
        filters = [name for name in ("status", "task", "queue") if name in query]
        if len(filters) == 1:
            # Named, so the plan never depends on the cache: with a million pending jobs,
            # weighing the claim indexes (which hold them all) against this one, on every
            # replanning, is what would make the first page slow.
            cursor = cursor.hint(f"list_{filters[0]}")
        docs = await cursor.to_list()
        jobs = [Job.from_doc(d) for d in docs[:limit]]
        nxt = jobs[-1].id if len(docs) > limit else None
        return jobs, nxt

    async def count_by_status(self) -> dict[str, int]:
        """Jobs per status, in one aggregation."""
        counts = {s.value: 0 for s in JobStatus}
        async for row in await self.jobs.aggregate(
            [{"$group": {"_id": "$status", "n": {"$sum": 1}}}]
        ):
            counts[str(row["_id"])] = int(row["n"])
        return counts

    async def count_by_queue(self) -> dict[str, dict[str, int]]:
        """Jobs per queue and status, in one aggregation; queues in name order."""
        rows = await (
            await self.jobs.aggregate(
                [
                    {
                        "$group": {
                            "_id": {
                                "queue": {"$ifNull": ["$queue", DEFAULT_QUEUE]},
                                "status": "$status",
                            },
                            "n": {"$sum": 1},
                        }
                    }
                ]
            )
        ).to_list()
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            queue = str(row["_id"]["queue"])
            counts.setdefault(queue, {s.value: 0 for s in JobStatus})
            counts[queue][str(row["_id"]["status"])] = int(row["n"])
        return dict(sorted(counts.items()))

    # -- dispatcher operations -------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        lease_seconds: float,
        *,
        tasks: Collection[str] | None = None,
        queue: str | None = None,
    ) -> Job | None:
        """Lease the best due pending job (of these tasks, in this queue) to `owner`;
        `attempts` + 1 is the new fencing token."""
        doc = await self.jobs.find_one_and_update(
            claim_filter(tasks, queue),
            [{"$set": _claimed(owner, lease_seconds)}],
            sort=CLAIM_SORT,
            hint=claim_index(tasks, queue),
            return_document=ReturnDocument.AFTER,
        )
        return Job.from_doc(doc) if doc is not None else None

    async def claim_many(
        self,
        owner: str,
        lease_seconds: float,
        limit: int,
        *,
        tasks: Collection[str] | None = None,
        queue: str | None = None,
    ) -> tuple[list[Job], bool]:
        """Lease up to `limit` of the best due pending jobs with one write; also say whether
        fewer than `limit` were due (the queue ran dry, as opposed to losing races).

        Concurrent `findOneAndUpdate`s all race for the same first job (write conflicts the
        server retries); this picks the candidates, claims those still pending in a single
        `update_many` tagged with a fresh token, and reads back exactly what it won. Another
        dispatcher may win some of them; it never claims one twice.
        """
        candidates = await self.jobs.find(
            claim_filter(tasks, queue),
            sort=CLAIM_SORT,
            limit=limit,
            hint=claim_index(tasks, queue),
        ).to_list()
        if not candidates:
            return [], True
        ids = [d["_id"] for d in candidates]
        tag = secrets.token_hex(8)
        res = await self.jobs.update_many(
            {"_id": {"$in": ids}, **CLAIM_FILTER},
            [{"$set": {**_claimed(owner, lease_seconds), "claim_tag": tag}}],
        )
        dry = len(candidates) < limit
        if res.modified_count == len(ids):
            # Won them all (the usual case): every candidate was pending when the update
            # matched it, so its claim took attempt + 1; no read-back needed.
            return [_as_claimed(d, owner) for d in candidates], dry
        won = await self.jobs.find(
            {"_id": {"$in": ids}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        won.sort(key=lambda d: (-d["priority"], d["run_at"], d["_id"]))
        return [Job.from_doc(d) for d in won], dry

    async def next_due(
        self, *, tasks: Collection[str] | None = None, queues: Collection[str] | None = None
    ) -> datetime | None:
        """The earliest `run_at` among pending jobs of these tasks and queues (the
        dispatcher's timer; None: any)."""
        query: dict[str, Any] = {"status": P}
        if tasks is not None:
            query["task"] = {"$in": sorted(tasks)}
        if queues is not None:
            query["queue"] = {"$in": sorted(queues)}
        doc = await self.jobs.find_one(
            query, projection={"run_at": 1}, sort=[("run_at", ASCENDING)]
        )
        return doc["run_at"] if doc is not None else None

    async def server_now(self) -> datetime:
        hello = await self.db.client.admin.command("hello")
        now: datetime = hello["localTime"]
        return now

    async def server_clock(self) -> datetime:
        """The server's time now, read from this process's clock and an offset measured
        with one `hello` at most every CLOCK_REFRESH_S (not one per batch of inserts). It
        errs early, never late: the server read its clock at some moment of the round
        trip, so the offset taken is the smallest that reading allows, and a job stamped
        with it is due when it lands."""
        if time.monotonic() - self._clock_read_at > CLOCK_REFRESH_S:
            server = (await self.server_now()).replace(tzinfo=UTC)
            self._clock_offset = server.timestamp() - time.time()
            self._clock_read_at = time.monotonic()
        return datetime.fromtimestamp(time.time() + self._clock_offset, UTC)

    async def renew(self, owner: str, leases: Sequence[Lease], lease_seconds: float) -> set[str]:
        """Extend every lease `owner` still holds in one write; return the job ids it lost."""
        if not leases:
            return set()
        held = {
            "owner": owner,
            "status": R,
            "$or": [{"_id": lease.job_id, "attempts": lease.attempt} for lease in leases],
        }
        res = await self.jobs.update_many(
            held, [{"$set": {"lease_expires_at": _after(lease_seconds * 1000)}}]
        )
        if res.matched_count == len(leases):
            return set()
        still = await self.jobs.find(held, projection={"_id": 1}).to_list()
        kept = {d["_id"] for d in still}
        return {lease.job_id for lease in leases} - kept

    async def complete_many(
        self,
        owner: str,
        items: Sequence[tuple[Lease, Any]],
        *,
        ran: Mapping[str, RunTimes] | None = None,
    ) -> tuple[set[str], dict[str, str]]:
        """Fenced completions in one round trip (one `bulk_write`, one majority wait);
        `ran` gives the attempts' real start and end times by job id.

        Returns the job ids this call (or an earlier try of it, cut off by a failover)
        completed, and the ids MongoDB refused with the reason (e.g. a document too large).
        A job in neither set had lost its lease: another attempt or owner holds it.
        """
        times = ran or {}
        ops = [
            UpdateOne(
                {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
                [{"$set": _completed(lease, result, self.retention_s, times.get(lease.job_id))}],
            )
            for lease, result in items
        ]
        refused: dict[str, str] = {}
        try:
            res = await self.jobs.bulk_write(ops, ordered=False)
            if res.matched_count == len(ops):
                return {lease.job_id for lease, _ in items}, refused
        except BulkWriteError as exc:
            for err in exc.details.get("writeErrors", []):
                refused[items[err["index"]][0].job_id] = str(err.get("errmsg", ""))[:2000]
        # Which ones are ours? A completed job with our attempt number can only be ours:
        # every claim takes a new attempt number.
        wanted = {lease.job_id: lease.attempt for lease, _ in items}
        docs = await self.jobs.find(
            {"_id": {"$in": list(wanted)}}, projection={"status": 1, "attempts": 1}
        ).to_list()
        done = {
            d["_id"]
            for d in docs
            if d["status"] == JobStatus.COMPLETED.value and d["attempts"] == wanted[d["_id"]]
        }
        return done, {k: v for k, v in refused.items() if k not in done}

    async def fail_attempt(
        self,
        lease: Lease,
        owner: str,
        error: Mapping[str, Any],
        retry_delay_s: float,
        *,
        final: bool = False,
        ran: RunTimes | None = None,
    ) -> Job:
        """End a failed attempt: back to pending after `retry_delay_s` while attempts remain,
        else `failed`; a job whose cancel was requested becomes `cancelled`. `ran`: when its
        task really started and ended."""
        return await self._end_attempt(
            {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
            error,
            retry_delay_s,
            final=final,
            ran=ran,
        )

    async def cancel_running(self, lease: Lease, owner: str, *, ran: RunTimes | None = None) -> Job:
        """The holder stopped the worker of a job whose cancel was requested (`ran`: when its
        task started and was stopped), or dropped it before its task started (no `ran`)."""
        message = "cancelled while running" if ran else "cancelled before its task started"
        return await self._fenced(
            lease,
            owner,
            {
                "status": JobStatus.CANCELLED.value,
                **({"started_at": ran.started_at, "finished_at": ran.finished_at} if ran else {}),
                **({} if ran else {"finished_at": NOW}),
                "expire_at": _expiry(self.retention_s),
                "updated_at": NOW,
                "owner": None,
                "lease_expires_at": None,
                "error": _lit({"type": "Cancelled", "message": message}),
                **_history(
                    {"status": JobStatus.CANCELLED.value, "at": NOW, "attempt": lease.attempt}
                ),
            },
        )

    async def release(self, lease: Lease, owner: str) -> Job:
        """Graceful shutdown: hand a running job back at once. The interrupted attempt is not
        the job's fault, so it is not counted; the worker was stopped before this write (or
        the job was only claimed ahead). It keeps its `run_at`: it was due when claimed, so
        it is due now, in its place in the claim order (and a scheduled job keeps its tick)."""
        cancelled = {"$eq": ["$cancel_requested", True]}
        status = {"$cond": [cancelled, JobStatus.CANCELLED.value, P]}
        return await self._fenced(
            lease,
            owner,
            {
                "status": status,
                "attempts": {"$cond": [cancelled, "$attempts", {"$add": ["$attempts", -1]}]},
                "finished_at": {"$cond": [cancelled, NOW, None]},
                "expire_at": {"$cond": [cancelled, _expiry(self.retention_s), "$$REMOVE"]},
                "updated_at": NOW,
                "owner": None,
                "lease_expires_at": None,
                **_history(
                    {"status": status, "at": NOW, "attempt": lease.attempt, "reason": "released"}
                ),
            },
        )

    async def expired(self, limit: int = 100) -> list[ExpiredLease]:
        """Running jobs whose lease is over by the server's clock."""
        docs = await self.jobs.find(
            {"status": R, "$expr": {"$lt": ["$lease_expires_at", NOW]}},
            projection={"_id": 1, "attempts": 1, "owner": 1, "task": 1},
            limit=limit,
        ).to_list()
        return [
            ExpiredLease(
                job_id=str(d["_id"]), attempt=d["attempts"], task=d["task"], owner=d["owner"]
            )
            for d in docs
        ]

    async def requeue_expired(self, lease: ExpiredLease, retry_delay_s: float) -> Job:
        """Watchdog: the holder of this lease died or froze; count the attempt and retry or
        fail. An attempt whose task is not known to have started (no `started_at`: it was
        claimed ahead, or started under MARK_AFTER_S before) keeps its number, the fencing
        token, but does not use up the job's attempts: `max_attempts` grows by one."""
        return await self._end_attempt(
            {
                "_id": lease.job_id,
                "attempts": lease.attempt,
                "owner": lease.owner,
                "status": R,
                "$expr": {"$lt": ["$lease_expires_at", NOW]},
            },
            {"type": "LeaseExpired", "message": f"lease of {lease.owner} expired"},
            retry_delay_s,
            unstarted_free=True,
        )

    async def cancel_requested(self, owner: str, job_ids: Sequence[str]) -> list[str]:
        """Which of these jobs `owner` holds have a cancel request (a missed event's backup)."""
        if not job_ids:
            return []
        docs = await self.jobs.find(
            {"_id": {"$in": list(job_ids)}, "owner": owner, "cancel_requested": True},
            projection={"_id": 1},
        ).to_list()
        return [str(d["_id"]) for d in docs]

    # -- a caller's operations on one job --------------------------------------------------

    async def cancel(self, job_id: str) -> Job:
        """Pending → cancelled at once; running → `cancel_requested` (its holder stops it)."""
        for _ in range(5):
            doc = await self.jobs.find_one_and_update(
                {"_id": job_id, "status": P},
                [
                    {
                        "$set": {
                            "status": JobStatus.CANCELLED.value,
                            "finished_at": NOW,
                            "expire_at": _expiry(self.retention_s),
                            "updated_at": NOW,
                            **_history(
                                {
                                    "status": JobStatus.CANCELLED.value,
                                    "at": NOW,
                                    "attempt": "$attempts",
                                }
                            ),
                        }
                    }
                ],
                return_document=ReturnDocument.AFTER,
            )
            if doc is not None:
                return Job.from_doc(doc)
            doc = await self.jobs.find_one_and_update(
                {"_id": job_id, "status": R},
                [{"$set": {"cancel_requested": True, "updated_at": NOW}}],
                return_document=ReturnDocument.AFTER,
            )
            if doc is not None:
                return Job.from_doc(doc)
            await self._must_be_active(job_id)
        raise JobConflict(f"job {job_id} kept changing state; try again")  # pragma: no cover

    async def _must_be_active(self, job_id: str) -> None:
        current = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
        if current is None:
            raise JobNotFound(job_id)
        if JobStatus(current["status"]) in TERMINAL:
            raise JobConflict(f"job {job_id} is already {current['status']}")

    async def retry(self, job_id: str) -> Job:
        """A failed or cancelled job back to `pending`, due now, with its attempt budget
        renewed and its history kept; any other state is a conflict."""
        doc = await self.jobs.find_one_and_update(
            {"_id": job_id, "status": {"$in": sorted(s.value for s in RETRYABLE)}},
            [{"$set": _retried()}],
            return_document=ReturnDocument.AFTER,
        )
        if doc is not None:
            return Job.from_doc(doc)
        current = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
        if current is None:
            raise JobNotFound(job_id)
        raise JobConflict(
            f"job {job_id} is {current['status']}; only failed or cancelled jobs can be retried"
        )

    async def job_changes(self, job_id: str, *, max_await_ms: int) -> AsyncChangeStream[Doc]:
        """A change stream of one job's status changes and of its deletion (open it with
        `async with`). It carries only wake-ups: the job is read again after each."""
        changed = "updateDescription.updatedFields.status"
        return await self.jobs.watch(
            [
                {
                    "$match": {
                        "documentKey._id": job_id,
                        "$or": [
                            {"operationType": "update", changed: {"$exists": True}},
                            {"operationType": {"$in": ["replace", "delete", *INVALIDATING]}},
                        ],
                    }
                },
                {"$project": {"operationType": 1, "documentKey": 1}},
            ],
            max_await_time_ms=max_await_ms,
        )

    # -- change stream -------------------------------------------------------------------------

    async def changes(
        self,
        pipeline: Sequence[Mapping[str, Any]],
        *,
        resume_after: Mapping[str, Any] | None,
        max_await_ms: int,
        full_document: str | None = None,
    ) -> AsyncChangeStream[Doc]:
        """A change stream on the jobs collection (open it with `async with`)."""
        return await self.jobs.watch(
            list(pipeline),
            resume_after=resume_after,
            max_await_time_ms=max_await_ms,
            full_document=full_document,
        )

    # -- resume tokens -----------------------------------------------------------------------

    async def load_token(self, name: str, version: str) -> Mapping[str, Any] | None:
        doc = await self.state.find_one({"_id": f"stream:{name}"})
        if doc is None or doc.get("version") != version:
            return None
        token: Mapping[str, Any] | None = doc.get("token")
        return token

    async def save_token(self, name: str, version: str, token: Mapping[str, Any]) -> None:
        await self.state.update_one(
            {"_id": f"stream:{name}"},
            {"$set": {"token": token, "version": version}, "$currentDate": {"saved_at": True}},
            upsert=True,
        )

    async def drop_token(self, name: str) -> None:
        await self.state.delete_one({"_id": f"stream:{name}"})

    # -- dispatcher presence -------------------------------------------------------------------

    async def announce(
        self,
        owner: str,
        *,
        name: str,
        tasks: Collection[str],
        queues: Mapping[str, int] | None,
        lease_seconds: float,
    ) -> None:
        """Publish (or refresh) what this dispatcher runs: clients and the API check task
        names against the live dispatchers' tasks."""
        await self.dispatchers.update_one(
            {"_id": owner},
            [
                {
                    "$set": {
                        "name": _lit(name),
                        "tasks": _lit(sorted(tasks)),
                        "queues": _lit(dict(queues) if queues is not None else None),
                        "lease_seconds": lease_seconds,
                        "started_at": {"$ifNull": ["$started_at", NOW]},
                        "seen_at": NOW,
                    }
                }
            ],
            upsert=True,
        )

    async def seen(self, owner: str) -> bool:
        """The dispatcher is alive (its heartbeat); False if its document is gone."""
        res = await self.dispatchers.update_one({"_id": owner}, [{"$set": {"seen_at": NOW}}])
        return res.matched_count == 1

    async def retire(self, owner: str) -> None:
        await self.dispatchers.delete_one({"_id": owner})

    async def live_dispatchers(self) -> list[LiveDispatcher]:
        """Dispatchers seen within LIVE_LEASES of their lease length, by the server's clock."""
        window = {"$multiply": ["$lease_seconds", LIVE_LEASES * 1000]}
        docs = await self.dispatchers.find(
            {"$expr": {"$gte": [{"$add": ["$seen_at", window]}, NOW]}}
        ).to_list()
        return [
            LiveDispatcher(
                owner=str(d["_id"]),
                name=str(d.get("name", "")),
                tasks=frozenset(d.get("tasks") or ()),
                queues=d.get("queues"),
                seen_at=d["seen_at"],
            )
            for d in docs
        ]

    # -- internals -----------------------------------------------------------------------------

    async def _fenced(self, lease: Lease, owner: str, fields: dict[str, Any]) -> Job:
        doc = await self.jobs.find_one_and_update(
            {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
            [{"$set": fields}],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            raise LeaseLost(
                f"job {lease.job_id} attempt {lease.attempt} is no longer held by {owner}"
            )
        return Job.from_doc(doc)

    async def _end_attempt(
        self,
        query: dict[str, Any],
        error: Mapping[str, Any],
        retry_delay_s: float,
        *,
        final: bool = False,
        ran: RunTimes | None = None,
        unstarted_free: bool = False,
    ) -> Job:
        cancelled = {"$eq": ["$cancel_requested", True]}
        ended: Any = NOW if ran is None else ran.finished_at
        started = {} if ran is None else {"started_at": ran.started_at}
        retry = {"$and": [{"$not": [final]}, {"$lt": ["$attempts", "$max_attempts"]}]}
        again = {"$eq": ["$status", P]}
        free: list[dict[str, Any]] = []
        if unstarted_free:
            unstarted = {"$eq": [{"$ifNull": ["$started_at", None]}, None]}
            grown = {"$cond": [unstarted, {"$add": ["$max_attempts", 1]}, "$max_attempts"]}
            free = [{"$set": {"max_attempts": grown}}]
        doc = await self.jobs.find_one_and_update(
            query,
            [
                *free,
                {
                    "$set": {
                        "status": {
                            "$switch": {
                                "branches": [
                                    {"case": cancelled, "then": JobStatus.CANCELLED.value},
                                    {"case": retry, "then": P},
                                ],
                                "default": JobStatus.FAILED.value,
                            }
                        }
                    }
                },
                {
                    "$set": {
                        "error": _lit(dict(error)),
                        "run_at": {"$cond": [again, _after(retry_delay_s * 1000), "$run_at"]},
                        **started,
                        "finished_at": {"$cond": [again, None, ended]},
                        "expire_at": {"$cond": [again, "$$REMOVE", _expiry(self.retention_s)]},
                        "updated_at": NOW,
                        "owner": None,
                        "lease_expires_at": None,
                        **_history(
                            {
                                "status": "$status",
                                "at": NOW,
                                "attempt": "$attempts",
                                "error": _lit(error.get("type")),
                            }
                        ),
                    }
                },
            ],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            raise LeaseLost(f"job {query['_id']} attempt {query['attempts']} is no longer held")
        return Job.from_doc(doc)

    # -- progress (a running attempt reports how far it got) ---------------------------------

    async def set_progress_many(
        self, owner: str, items: Sequence[tuple[Lease, float, str | None]]
    ) -> set[str]:
        """Write each attempt's latest progress in one round trip, fenced like every other
        write of a running job (`_id`, attempt, owner, running): a stale attempt's progress
        matches nothing. Returns the job ids written."""
        ops = [
            UpdateOne(
                {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
                [
                    {
                        "$set": {
                            "progress": {
                                "fraction": _lit(fraction),
                                "message": _lit(message),
                                "at": NOW,
                                "attempt": lease.attempt,
                            }
                        }
                    }
                ],
            )
            for lease, fraction, message in items
        ]
        if not ops:
            return set()
        res = await self.jobs.bulk_write(ops, ordered=False)
        if res.matched_count == len(ops):
            return {lease.job_id for lease, _, _ in items}
        wanted = {lease.job_id: lease.attempt for lease, _, _ in items}
        held = await self.jobs.find(
            {"_id": {"$in": list(wanted)}, "owner": owner, "status": R},
            projection={"attempts": 1},
        ).to_list()
        return {d["_id"] for d in held if d["attempts"] == wanted[d["_id"]]}

    # -- a long task's start (a short one's is written with its outcome) ---------------------

    async def mark_started(self, owner: str, items: Sequence[tuple[Lease, datetime]]) -> None:
        """Record when these attempts' tasks started, in one round trip, fenced like every
        write of a running job; an attempt already ended or lost matches nothing."""
        ops = [
            UpdateOne(
                {
                    "_id": lease.job_id,
                    "attempts": lease.attempt,
                    "owner": owner,
                    "status": R,
                    "started_at": None,
                },
                {"$set": {"started_at": started_at}},
            )
            for lease, started_at in items
        ]
        if ops:
            await self.jobs.bulk_write(ops, ordered=False)
