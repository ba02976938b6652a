"""`JobStore`: the only code that touches the jobs collection.

Every method is one named operation. Every status change is one conditional write whose
filter names the expected status (and, for a running job, its owner and attempt); the
database decides, and a write that matches nothing means the caller lost a race.
Times that matter for leases and due dates come from the server clock (`$$NOW`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument, UpdateOne
from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, CollectionInvalid, DuplicateKeyError, OperationFailure

from common.errors import JobConflict, JobNotFound, LeaseLost
from common.models import Doc, Job, JobSpec
from common.status import TERMINAL, JobStatus

JOBS = "jobs"
STATE = "brook_state"
HISTORY_CAP = 50
DEFAULT_QUEUE = "default"  # the queue of a job stored without one

P, R = JobStatus.PENDING.value, JobStatus.RUNNING.value

CLAIM_SORT: list[tuple[str, int]] = [
    ("priority", DESCENDING),
    ("run_at", ASCENDING),
    ("_id", ASCENDING),
]

INDEXES = [
    # The queue indexes are partial: they hold only pending (or running) jobs, so they stay
    # small however many finished jobs the collection keeps, and a finished job costs them
    # nothing. Claim: pending, run_at <= now, best priority then earliest due (IXSCAN + bounds).
    IndexModel(
        [
            ("status", ASCENDING),
            ("priority", DESCENDING),
            ("run_at", ASCENDING),
            ("_id", ASCENDING),
        ],
        name="claim_order",
        partialFilterExpression={"status": P},
    ),
    # Next due time (the dispatcher's timer).
    IndexModel(
        [("status", ASCENDING), ("run_at", ASCENDING)],
        name="due",
        partialFilterExpression={"status": P},
    ),
    # Watchdog: running jobs whose lease expired.
    IndexModel(
        [("status", ASCENDING), ("lease_expires_at", ASCENDING)],
        name="lease_expiry",
        partialFilterExpression={"status": R},
    ),
    # Listing, newest first, by status or task.
    IndexModel([("status", ASCENDING), ("_id", DESCENDING)], name="list_status"),
    IndexModel([("task", ASCENDING), ("_id", DESCENDING)], name="list_task"),
    IndexModel(
        [("idempotency_key", ASCENDING)],
        name="idempotency_key_unique",
        unique=True,
        partialFilterExpression={"idempotency_key": {"$type": "string"}},
    ),
]

NOW = "$$NOW"

# Due pending jobs, by the server's clock; with CLAIM_SORT this is an IXSCAN on claim_order.
CLAIM_FILTER: dict[str, Any] = {"status": P, "$expr": {"$lte": ["$run_at", NOW]}}


def _lit(value: Any) -> dict[str, Any]:
    """User data inside an update pipeline must never be read as an expression or field path."""
    return {"$literal": value}


def _after(ms: float) -> dict[str, Any]:
    return {"$add": [NOW, int(ms)]}


def _history(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "$slice": [
            {"$concatArrays": [{"$ifNull": ["$history", []]}, [entry]]},
            -HISTORY_CAP,
        ]
    }


def _new_job(spec: JobSpec) -> dict[str, Any]:
    """A pending job's fields; the server stamps the times (`$$NOW`)."""
    fields: dict[str, Any] = {
        "task": _lit(spec.task),
        "payload": _lit(spec.payload),
        "status": P,
        "priority": spec.priority,
        "attempts": 0,
        "max_attempts": spec.max_attempts,
        "run_at": _lit(spec.run_at) if spec.run_at is not None else NOW,
        "created_at": NOW,
        "updated_at": NOW,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "error": None,
        "timeout_s": spec.timeout_s,
        "owner": None,
        "lease_expires_at": None,
        "cancel_requested": False,
        "history": [{"status": P, "at": NOW, "attempt": 0}],
    }
    if spec.idempotency_key is not None:
        fields["idempotency_key"] = _lit(spec.idempotency_key)
    return fields


def _claimed(owner: str, lease_seconds: float) -> dict[str, Any]:
    attempt = {"$add": ["$attempts", 1]}
    return {
        "status": R,
        "owner": _lit(owner),
        "attempts": attempt,
        "started_at": NOW,
        "updated_at": NOW,
        "lease_expires_at": _after(lease_seconds * 1000),
        "history": _history({"status": R, "at": NOW, "attempt": attempt, "owner": _lit(owner)}),
    }


def _completed(lease: Lease, result: Any) -> dict[str, Any]:
    return {
        "status": JobStatus.COMPLETED.value,
        "result": _lit(result),
        "error": None,
        "finished_at": NOW,
        "updated_at": NOW,
        "owner": None,
        "lease_expires_at": None,
        "history": _history(
            {"status": JobStatus.COMPLETED.value, "at": NOW, "attempt": lease.attempt}
        ),
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
class ExpiredLease:
    """A running job whose lease is over by the server's clock (the watchdog's find)."""

    job_id: str
    attempt: int
    task: str
    owner: str


class JobStore:
    def __init__(self, db: AsyncDatabase[Doc]) -> None:
        self.db = db
        self.jobs: AsyncCollection[Doc] = db[JOBS]
        self.state: AsyncCollection[Doc] = db[STATE]

    async def ensure_indexes(self) -> None:
        """Idempotent: an index that exists with the same spec is a no-op; one that exists
        under the same name with another spec (an older Brook) is rebuilt."""
        try:
            await self.jobs.create_indexes(INDEXES)
        except OperationFailure as exc:
            if exc.code not in (85, 86):  # IndexOptionsConflict, IndexKeySpecsConflict
                raise
            for model in INDEXES:
                await self._rebuild_index(model)

    async def _rebuild_index(self, model: IndexModel) -> None:
        # Several processes (API, dispatchers) may do this at once: a peer may drop or
        # recreate the index between our steps, so tolerate both and try again.
        for _ in range(5):
            try:
                await self.jobs.create_indexes([model])
                return
            except OperationFailure as exc:
                if exc.code not in (85, 86):
                    raise
            try:
                await self.jobs.drop_index(model.document["name"])
            except OperationFailure as exc:
                if exc.code != 27:  # IndexNotFound: a peer dropped it first
                    raise
        await self.jobs.create_indexes([model])

    # -- submit / read ---------------------------------------------------------------------

    async def submit(self, spec: JobSpec) -> Submitted:
        """Insert a pending job, majority-acknowledged; a known idempotency key returns its job."""
        try:
            # An upsert on a fresh _id always inserts, and lets the server stamp the times.
            doc = await self.jobs.find_one_and_update(
                {"_id": str(ObjectId())},
                [{"$set": _new_job(spec)}],
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:
            return Submitted(job=await self._by_key(spec), created=False)
        assert doc is not None
        return Submitted(job=Job.from_doc(doc), created=True)

    async def submit_many(self, specs: Sequence[JobSpec]) -> list[Submitted]:
        """`submit` for many jobs in one write (one majority wait), in order. A job whose
        idempotency key exists (or repeats within the batch) returns the existing job."""
        ids = [str(ObjectId()) for _ in specs]
        ops = [
            UpdateOne({"_id": job_id}, [{"$set": _new_job(spec)}], upsert=True)
            for job_id, spec in zip(ids, specs, strict=True)
        ]
        duplicates: set[int] = set()
        try:
            await self.jobs.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") != 11000 for err in errors):
                raise
            duplicates = {err["index"] for err in errors}
        docs = {
            d["_id"]: d
            for d in await self.jobs.find(
                {"_id": {"$in": [ids[i] for i in range(len(ids)) if i not in duplicates]}}
            ).to_list()
        }
        out: list[Submitted] = []
        for i, spec in enumerate(specs):
            if i in duplicates:
                out.append(Submitted(job=await self._by_key(spec), created=False))
            else:
                out.append(Submitted(job=Job.from_doc(docs[ids[i]]), created=True))
        return out

    async def _by_key(self, spec: JobSpec) -> Job:
        existing = await self.jobs.find_one({"idempotency_key": spec.idempotency_key})
        if existing is None:  # pragma: no cover - the key's unique index guarantees it
            raise JobNotFound(f"idempotency key {spec.idempotency_key!r}")
        return Job.from_doc(existing)

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
        limit: int = 50,
        after: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """Newest first; `after` is the `next` cursor of the previous page."""
        query: dict[str, Any] = {}
        if status is not None:
            query["status"] = status.value
        if task is not None:
            query["task"] = task
        if after is not None:
            query["_id"] = {"$lt": after}
        docs = await self.jobs.find(query).sort("_id", DESCENDING).limit(limit + 1).to_list()
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

    # -- dispatcher operations -------------------------------------------------------------

    async def claim(self, owner: str, lease_seconds: float) -> Job | None:
        """Lease the best due pending job to `owner`; `attempts` + 1 is the new fencing token."""
        doc = await self.jobs.find_one_and_update(
            CLAIM_FILTER,
            [{"$set": _claimed(owner, lease_seconds)}],
            sort=CLAIM_SORT,
            return_document=ReturnDocument.AFTER,
        )
        return Job.from_doc(doc) if doc is not None else None

    async def claim_many(
        self, owner: str, lease_seconds: float, limit: int
    ) -> tuple[list[Job], bool]:
        """Lease up to `limit` of the best due pending jobs with one write; also say whether
        fewer than `limit` were due (the queue ran dry, as opposed to losing races).

        Concurrent `findOneAndUpdate`s all race for the same first job (write conflicts the
        server retries); this picks the candidates, claims those still pending in a single
        `update_many` tagged with a fresh token, and reads back exactly what it won. Another
        dispatcher may win some of them; it never claims one twice.
        """
        candidates = await self.jobs.find(
            CLAIM_FILTER, projection={"_id": 1}, sort=CLAIM_SORT, limit=limit
        ).to_list()
        if not candidates:
            return [], True
        ids = [d["_id"] for d in candidates]
        tag = secrets.token_hex(8)
        await self.jobs.update_many(
            {"_id": {"$in": ids}, **CLAIM_FILTER},
            [{"$set": {**_claimed(owner, lease_seconds), "claim_tag": tag}}],
        )
        won = await self.jobs.find(
            {"_id": {"$in": ids}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        won.sort(key=lambda d: (-d["priority"], d["run_at"], d["_id"]))
        return [Job.from_doc(d) for d in won], len(candidates) < limit

    async def next_due(self) -> datetime | None:
        """The earliest `run_at` among pending jobs (the dispatcher's timer)."""
        doc = await self.jobs.find_one(
            {"status": P}, projection={"run_at": 1}, sort=[("run_at", ASCENDING)]
        )
        return doc["run_at"] if doc is not None else None

    async def server_now(self) -> datetime:
        hello = await self.db.client.admin.command("hello")
        now: datetime = hello["localTime"]
        return now

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
        self, owner: str, items: Sequence[tuple[Lease, Any]]
    ) -> tuple[set[str], dict[str, str]]:
        """Fenced completions in one round trip (one `bulk_write`, one majority wait).

        Returns the job ids this call (or an earlier try of it, cut off by a failover)
        completed, and the ids MongoDB refused with the reason (e.g. a document too large).
        A job in neither set had lost its lease: another attempt or owner holds it.
        """
        ops = [
            UpdateOne(
                {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
                [{"$set": _completed(lease, result)}],
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
    ) -> Job:
        """End a failed attempt: back to pending after `retry_delay_s` while attempts remain,
        else `failed`; a job whose cancel was requested becomes `cancelled`."""
        return await self._end_attempt(
            {"_id": lease.job_id, "attempts": lease.attempt, "owner": owner, "status": R},
            error,
            retry_delay_s,
            final=final,
        )

    async def cancel_running(self, lease: Lease, owner: str) -> Job:
        """The holder stopped the worker of a job whose cancel was requested."""
        return await self._fenced(
            lease,
            owner,
            {
                "status": JobStatus.CANCELLED.value,
                "finished_at": NOW,
                "updated_at": NOW,
                "owner": None,
                "lease_expires_at": None,
                "error": _lit({"type": "Cancelled", "message": "cancelled while running"}),
                "history": _history(
                    {"status": JobStatus.CANCELLED.value, "at": NOW, "attempt": lease.attempt}
                ),
            },
        )

    async def release(self, lease: Lease, owner: str) -> Job:
        """Graceful shutdown: hand a running job back at once. The interrupted attempt is not
        the job's fault, so it is not counted; the worker was stopped before this write."""
        cancelled = {"$eq": ["$cancel_requested", True]}
        status = {"$cond": [cancelled, JobStatus.CANCELLED.value, P]}
        return await self._fenced(
            lease,
            owner,
            {
                "status": status,
                "attempts": {"$cond": [cancelled, "$attempts", {"$add": ["$attempts", -1]}]},
                "run_at": NOW,
                "finished_at": {"$cond": [cancelled, NOW, None]},
                "updated_at": NOW,
                "owner": None,
                "lease_expires_at": None,
                "history": _history(
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
        """Watchdog: the holder of this lease died or froze; count the attempt and retry or fail."""
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
                            "updated_at": NOW,
                            "history": _history(
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
            current = await self.jobs.find_one({"_id": job_id}, projection={"status": 1})
            if current is None:
                raise JobNotFound(job_id)
            if JobStatus(current["status"]) in TERMINAL:
                raise JobConflict(f"job {job_id} is already {current['status']}")
        raise JobConflict(f"job {job_id} kept changing state; try again")  # pragma: no cover

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
    ) -> Job:
        cancelled = {"$eq": ["$cancel_requested", True]}
        retry = {"$and": [{"$not": [final]}, {"$lt": ["$attempts", "$max_attempts"]}]}
        doc = await self.jobs.find_one_and_update(
            query,
            [
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
                        "run_at": {
                            "$cond": [
                                {"$eq": ["$status", P]},
                                _after(retry_delay_s * 1000),
                                "$run_at",
                            ]
                        },
                        "finished_at": {"$cond": [{"$eq": ["$status", P]}, None, NOW]},
                        "updated_at": NOW,
                        "owner": None,
                        "lease_expires_at": None,
                        "history": _history(
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

    # -- live events ---------------------------------------------------------------------------
    # What the API's event streams and dashboard read: post-images on the change stream,
    # a job's raw document, the current state after a client lost its history, and the
    # counts by queue and status that /metrics and the dashboard share.

    async def enable_post_images(self) -> None:
        """Have the change stream carry each job as that change left it (a post-image), not
        as a later lookup finds it. Idempotent; creates the collection if need be."""
        try:
            await self.db.command("collMod", JOBS, changeStreamPreAndPostImages={"enabled": True})
        except OperationFailure as exc:
            if exc.code != 26:  # NamespaceNotFound
                raise
            options: dict[str, Any] = {"changeStreamPreAndPostImages": {"enabled": True}}
            try:
                await self.db.create_collection(JOBS, **options)
            except CollectionInvalid:  # a peer created it meanwhile
                await self.enable_post_images()

    async def job_doc(self, job_id: str) -> Doc | None:
        """The job's stored document, fields this version's `Job` does not know included."""
        return await self.jobs.find_one({"_id": job_id})

    async def changed_since(
        self,
        since: datetime,
        *,
        job_id: str | None = None,
        queue: str | None = None,
        task: str | None = None,
        status: JobStatus | None = None,
        limit: int = 500,
    ) -> list[Doc]:
        """Jobs changed at or after `since`, oldest change first (a client's catch-up after its
        history was lost; rare, and not indexed: it scans what the other filters leave)."""
        query: dict[str, Any] = {"updated_at": {"$gte": since}}
        if job_id is not None:
            query["_id"] = job_id
        if queue is not None:
            query["queue"] = {"$in": [queue, None]} if queue == DEFAULT_QUEUE else queue
        if task is not None:
            query["task"] = task
        if status is not None:
            query["status"] = status.value
        return await self.jobs.find(query).sort("updated_at", ASCENDING).limit(limit).to_list()

    async def count_by_queue_and_status(self) -> dict[tuple[str, str], int]:
        """Jobs per (queue, status), in one aggregation; jobs without a queue are `default`'s."""
        counts: dict[tuple[str, str], int] = {}
        pipeline: list[dict[str, Any]] = [
            {
                "$group": {
                    "_id": {"q": {"$ifNull": ["$queue", DEFAULT_QUEUE]}, "s": "$status"},
                    "n": {"$sum": 1},
                }
            }
        ]
        async for row in await self.jobs.aggregate(pipeline):
            counts[(str(row["_id"]["q"]), str(row["_id"]["s"]))] = int(row["n"])
        return counts
