"""`JobStore`: the only code that touches the jobs collection, in one module per concern.

Every method is one named operation, and every status change one conditional write built
by `brook.common.store.queries` (its filter names the expected status and, for a running job,
its owner and attempt): the database decides, and a write that matches nothing means the
caller lost a race. Times that matter for leases and due dates come from the server's
clock (`$$NOW`, or `ServerClock` where no write can read it).

The concerns, each a class over the same collection (`JobsCollection`):
`submits` (JobSubmits, with `workflows`: JobWorkflows), `claims` (JobClaims: one `claim`
for every kind of claim), `candidates` (JobCandidates: where a claim looks), `attempts`
(JobAttempts: leases, progress, starts, expired leases), `outcomes` (JobOutcomes),
`commands` (JobCommands: cancel, retry), `bulk` (JobBulk: retry and cancel by filter),
`reads` (JobReads), `changes` (JobChanges), `steps` (JobSteps: durable steps, sleeps and
signal wake-ups), `spawned` (JobSpawned: the jobs a task submitted, and a cancel that
reaches them), `reruns` (JobReruns: a new job from a finished one's steps) and `deadlines`
(JobDeadlines: jobs ended by their `start_by` or `deadline`).
A `JobStore` is all of them over one database, with handles on the two small collections
every Brook process uses beside it: `presence` (`brook_dispatchers`) and `tokens`
(`brook_state`), and the process's one `clock`.
"""

from __future__ import annotations

from pymongo.asynchronous.database import AsyncDatabase

from brook.common.domain.models import Doc
from brook.common.runtime.settings import WEEK_S
from brook.common.store.clock import ServerClock
from brook.common.store.db import ensure_indexes
from brook.common.store.jobs.attempts import JobAttempts
from brook.common.store.jobs.base import DEFAULT_QUERY_MAX_MS, JOBS, JobsCollection
from brook.common.store.jobs.bulk import JobBulk
from brook.common.store.jobs.candidates import JobCandidates
from brook.common.store.jobs.changes import JobChanges, buffered
from brook.common.store.jobs.claims import (
    BestDue,
    ClaimAsk,
    Claimed,
    HoldingKeySlots,
    JobClaims,
    OfKey,
    Tagged,
)
from brook.common.store.jobs.commands import JobCommands
from brook.common.store.jobs.deadlines import JobDeadlines
from brook.common.store.jobs.indexes import INDEXES
from brook.common.store.jobs.outcomes import JobOutcomes
from brook.common.store.jobs.reads import JobReads
from brook.common.store.jobs.reruns import JobReruns
from brook.common.store.jobs.spawned import JobSpawned
from brook.common.store.jobs.steps import JobSteps
from brook.common.store.jobs.submits import JobSubmits
from brook.common.store.presence import PresenceStore
from brook.common.store.records import (
    Completions,
    EndedParent,
    ExpiredLease,
    Lease,
    Refused,
    RunTimes,
    Settled,
    Submitted,
)
from brook.common.store.state import TokenStore

__all__ = [
    "INDEXES",
    "JOBS",
    "BestDue",
    "ClaimAsk",
    "Claimed",
    "Completions",
    "EndedParent",
    "ExpiredLease",
    "HoldingKeySlots",
    "JobStore",
    "JobsCollection",
    "Lease",
    "OfKey",
    "Refused",
    "RunTimes",
    "Settled",
    "Submitted",
    "Tagged",
    "buffered",
]


class JobStore(
    JobSubmits,
    JobClaims,
    JobCandidates,
    JobAttempts,
    JobOutcomes,
    JobCommands,
    JobBulk,
    JobReads,
    JobChanges,
    JobSteps,
    JobSpawned,
    JobReruns,
    JobDeadlines,
):
    """The jobs collection's operations, one class per concern, over one database."""

    def __init__(
        self,
        db: AsyncDatabase[Doc],
        *,
        retention_s: float = WEEK_S,
        clock: ServerClock | None = None,
        query_max_ms: int = DEFAULT_QUERY_MAX_MS,
    ) -> None:
        super().__init__(db, retention_s=retention_s, clock=clock, query_max_ms=query_max_ms)
        self.presence = PresenceStore(db)
        self.tokens = TokenStore(db)

    async def ensure_indexes(self) -> None:
        """Idempotent: an index that exists with the same spec is a no-op; one that exists
        under the same name with another spec (an older Brook) is rebuilt."""
        await ensure_indexes(self.jobs, INDEXES)
        await self.presence.ensure_indexes()
