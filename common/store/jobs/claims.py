"""Claiming jobs of the jobs collection: pending → running, leased to a dispatcher with a new
attempt number (the fencing token). One entry point, `JobClaims.claim`, takes what to claim
as one of four asks:

  `BestDue`        the best due jobs of these tasks (and queues): one `findOneAndUpdate`
                   for one job, a batch in one `update_many` (the plain claim, and a queue
                   claimed fairly with nothing to count)
  `OfKey`          the best due job of one key of a queue (a new key's, out of turn), with
                   the key slot it holds when the queue's per-key slots are on the jobs
  `Tagged`         these jobs by id, under the queue slots a claim took (only before their
                   `claim_by`), or claimed directly by turns or by priority aging
  `HoldingKeySlots` these jobs by id, each holding its key slot on itself

What a claim looks at first (candidates, due times, keys) is `candidates.py`'s."""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from brook.common.domain.models import Doc, Job, UnreadableJob
from brook.common.runtime.log_events import Event, log_event
from brook.common.store import queries
from brook.common.store.fields import R, as_claimed
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.queries import CLAIM_SORT, claim_filter, claim_index
from brook.common.store.records import Lease


@dataclass(frozen=True, kw_only=True)
class BestDue:
    """Up to `n` of the best due pending jobs (claim order: priority, then due time) of these
    `tasks` (None: any), in `queue` (None: any), leaving out the queues in `exclude`, and
    only from `among` (None: any queue)."""

    n: int = 1
    tasks: Collection[str] | None = None
    queue: str | None = None
    exclude: Collection[str] = ()
    among: Collection[str] | None = None


@dataclass(frozen=True, kw_only=True)
class OfKey:
    """The best due pending job of one key of `queue` (a new key's job, claimed out of turn):
    one `findOneAndUpdate` on `claim_by_key`, holding `key_slot` when given."""

    queue: str
    key: str | None
    tasks: Collection[str] | None = None
    key_slot: str | None = None


@dataclass(frozen=True, kw_only=True)
class Tagged:
    """These jobs (by id) if still due and pending, each marked with the claim's `tag` (the
    queue slots it took carry it too), only while the server's clock is before `before` (the
    slots' `claim_by`): after it the slots may have been freed, and no claim may use them."""

    ids: Sequence[str]
    tag: str
    before: datetime


@dataclass(frozen=True, kw_only=True)
class HoldingKeySlots:
    """These jobs (by id) if still due and pending, tagged with `tag`, each holding its
    `key_slot` (`queries.claimed_with_slots`; None: a job without a key holds none)."""

    slots: Mapping[str, str | None]
    tag: str


ClaimAsk = BestDue | OfKey | Tagged | HoldingKeySlots


@dataclass(frozen=True)
class Claimed:
    """What a claim won (in claim order); whether fewer jobs were due than it asked for
    (`dry`: a `BestDue` that ran out, as opposed to losing races); and the key slot it found
    held by another running job (`refused`: the claim stopped there), if any."""

    jobs: list[Job] = field(default_factory=list)
    dry: bool = False
    refused: str | None = None

    @property
    def job(self) -> Job | None:
        """The first job won (a claim of one job: the job, or None)."""
        return self.jobs[0] if self.jobs else None


def _held_slot(exc: DuplicateKeyError) -> str:
    """The `key_slot` a claim found taken; any other duplicate is not a claim's to explain."""
    slot = ((exc.details or {}).get("keyValue") or {}).get("key_slot")
    if not isinstance(slot, str):
        raise exc
    return slot


def in_claim_order(docs: list[Doc]) -> list[Doc]:
    """Jobs in the order a claim takes them: best priority, then earliest due."""
    return sorted(docs, key=_claim_order)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _claim_order(doc: Doc) -> tuple[int, datetime, str]:
    # A field of another type (a job written by hand) sorts as the default: the job is
    # then refused as unreadable (`JobClaims._readable`), not the whole claim.
    priority, run_at = doc.get("priority"), doc.get("run_at")
    return (
        -priority if type(priority) is int else 0,
        run_at if isinstance(run_at, datetime) else _EPOCH,
        str(doc["_id"]),
    )


class JobClaims(JobsCollection):
    """Claims: pending → running."""

    async def claim(self, owner: str, lease_seconds: float, ask: ClaimAsk = BestDue()) -> Claimed:
        """Lease what `ask` names to `owner`; each job's `attempts` + 1 is its new fencing
        token. A key slot another running job holds stops the claim there (`refused`)."""
        match ask:
            case BestDue(n=1):
                write = queries.claimed(
                    owner,
                    lease_seconds,
                    tasks=ask.tasks,
                    queue=ask.queue,
                    exclude=ask.exclude,
                    among=ask.among,
                )
                job = await self._claim_best(write, claim_index(ask.tasks, ask.queue, ask.among))
                return Claimed([job], dry=False) if job is not None else Claimed(dry=True)
            case BestDue():
                return await self._claim_many(owner, lease_seconds, ask)
            case OfKey():
                write = queries.claimed_of_key(
                    owner, lease_seconds, ask.queue, ask.key, ask.tasks, ask.key_slot
                )
                try:
                    job = await self._claim_best(write, "claim_by_key")
                except DuplicateKeyError as exc:
                    return Claimed(refused=_held_slot(exc))
                return Claimed([job] if job is not None else [])
            case Tagged():
                write = queries.claimed_tagged(ask.ids, owner, lease_seconds, ask.tag, ask.before)
                return await self._claim_ids(write, ask.ids, owner, ask.tag)
            case HoldingKeySlots():
                write = queries.claimed_with_slots(ask.slots, owner, lease_seconds, ask.tag)
                return await self._claim_ids(write, list(ask.slots), owner, ask.tag)

    async def _claim_best(self, write: queries.Write, index: str) -> Job | None:
        """The first job of `write`'s filter in claim order (on `index`), claimed by it."""
        doc = await self.jobs.find_one_and_update(
            write.filter,
            write.update,
            sort=CLAIM_SORT,
            hint=index,
            return_document=ReturnDocument.AFTER,
        )
        jobs = await self._readable([doc]) if doc is not None else []
        return jobs[0] if jobs else None

    async def _claim_many(self, owner: str, lease_seconds: float, ask: BestDue) -> Claimed:
        """Lease up to `ask.n` of the best due pending jobs with one write; also say whether
        fewer than that were due (the queue ran dry, as opposed to losing races).

        Concurrent `findOneAndUpdate`s all race for the same first job (write conflicts the
        server retries); this picks the candidates, claims those still pending in a single
        `update_many` tagged with a fresh token, and reads back exactly what it won. Another
        dispatcher may win some of them; it never claims one twice.
        """
        tasks, queue, among = ask.tasks, ask.queue, ask.among
        candidates = await self.jobs.find(
            claim_filter(tasks, queue, ask.exclude, among),
            sort=CLAIM_SORT,
            limit=ask.n,
            hint=claim_index(tasks, queue, among),
        ).to_list()
        if not candidates:
            return Claimed(dry=True)
        ids = [d["_id"] for d in candidates]
        tag = secrets.token_hex(8)
        # Each candidate only as it was read (`queries.as_read`): one claimed and handed
        # back, or joined by a debounced submit, meanwhile is not taken here, so a full
        # match means every job is as read.
        write = queries.claimed_as_read(candidates, owner, lease_seconds, tag)
        res = await self.jobs.update_many(write.filter, write.update)
        dry = len(candidates) < ask.n
        if res.modified_count == len(ids):
            # Won them all (the usual case): every candidate was pending when the update
            # matched it, so its claim took attempt + 1; no read-back needed.
            return Claimed(await self._readable(candidates, owner), dry=dry)
        won = await self.jobs.find(
            {"_id": {"$in": ids}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        return Claimed(await self._readable(in_claim_order(won)), dry=dry)

    async def _claim_ids(
        self, write: queries.Write, ids: Sequence[str], owner: str, tag: str
    ) -> Claimed:
        """Run a claim of these jobs by id (`write` tags them with `tag`) and say what it won:
        one job in one retryable round trip; more in one `update_many`, then read back by
        the tag (the candidates were read without their payloads, and a job may have changed
        since: a debounced submit joined it). A `key_slot` another running job holds stops
        the write there (named)."""
        if not ids:
            return Claimed()
        if len(ids) == 1:
            try:
                doc = await self.jobs.find_one_and_update(
                    write.filter, write.update, return_document=ReturnDocument.AFTER
                )
            except DuplicateKeyError as exc:
                return Claimed(refused=_held_slot(exc))
            return Claimed(await self._readable([doc]) if doc is not None else [])
        refused = None
        try:
            await self.jobs.update_many(write.filter, write.update)
        except DuplicateKeyError as exc:
            refused = _held_slot(exc)
        won = await self.jobs.find(
            {"_id": {"$in": list(ids)}, "claim_tag": tag, "owner": owner, "status": R}
        ).to_list()
        return Claimed(await self._readable(in_claim_order(won)), refused=refused)

    async def _readable(self, docs: Sequence[Doc], as_read_by: str | None = None) -> list[Job]:
        """The claimed jobs of `docs` (as read back; or, `as_read_by` an owner, as read before
        that owner's claim). One whose fields Brook cannot read (written into `jobs` by hand)
        is not handed on: its attempt fails for good, `UnreadableJob`, fenced by the claim."""
        jobs: list[Job] = []
        for doc in docs:
            try:
                jobs.append(as_claimed(doc, as_read_by) if as_read_by else Job.from_doc(doc))
            except (UnreadableJob, KeyError, ValueError, TypeError) as exc:
                await self._refuse_unreadable(doc, as_read_by, exc)
        return jobs

    async def _refuse_unreadable(self, doc: Doc, as_read_by: str | None, exc: Exception) -> None:
        attempts = doc.get("attempts", 0)
        owner = as_read_by or doc.get("owner")
        if type(attempts) is not int or not isinstance(owner, str):
            return  # not claimed as Brook claims (its count is no number): left alone
        attempt = attempts + 1 if as_read_by else attempts
        error = {"type": "UnreadableJob", "message": str(exc)[:1000]}
        lease = Lease(job_id=str(doc["_id"]), attempt=attempt)
        write = queries.attempt_failed(lease, owner, error, 0.0, self.retention_s, final=True)
        await self.jobs.update_one(write.filter, write.update)
        log_event(
            Event.CLAIM_UNREADABLE,
            level="error",
            job_id=str(doc["_id"]),
            attempt=attempt,
            owner=owner,
            error=error["message"][:300],
        )

    async def take_key_slot(self, owner: str, job_id: str, attempt: int, slot: str) -> bool:
        """This owner's running attempt takes the key slot `slot` (False: another running job
        holds it, or the attempt is over)."""
        write = queries.slot_taken(owner, job_id, attempt, slot)
        try:
            res = await self.jobs.update_one(write.filter, write.update)
        except DuplicateKeyError as exc:
            _held_slot(exc)
            return False
        return res.modified_count == 1
