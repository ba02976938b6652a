"""The end of an attempt, in the jobs collection: completed (many in one write), failed
(retried later, or failed for good), cancelled by its holder, released at shutdown, or
requeued by the watchdog when its lease expired. Each is one fenced write (`queries`); one
that matches nothing means the attempt was no longer held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import BulkWriteError, DocumentTooLarge, WriteConcernError, WriteError

from brook.common.domain.models import Doc, Job
from brook.common.domain.status import JobStatus
from brook.common.store import queries
from brook.common.store.fields import R
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.records import Completions, ExpiredLease, Lease, RunTimes


class JobOutcomes(JobsCollection):
    """The holder's (or the watchdog's) final write of an attempt."""

    async def complete_many(
        self,
        owner: str,
        items: Sequence[tuple[Lease, Any]],
        *,
        ran: Mapping[str, RunTimes] | None = None,
    ) -> Completions:
        """Fenced completions in one round trip (one `bulk_write`, one majority wait);
        `ran` gives the attempts' real start and end times by job id.

        Says which jobs this call (or an earlier try of it, cut off by a failover)
        completed, which ones MongoDB refused with the reason (e.g. a document too large),
        and which completed jobs have dependents to settle. A job in neither of the first
        two had lost its lease: another attempt or owner holds it.
        """
        # One causally consistent session: after a write-concern error (the write applied on
        # the primary but its majority wait failed) the read-back waits until the write is
        # majority-committed (or gone), instead of reading the old state and calling the
        # job lost when it is in fact completed.
        async with self.db.client.start_session(causal_consistency=True) as session:
            times = ran or {}
            refused = await self._write_completions(owner, items, times, session)
            if refused is None:
                done = {lease.job_id for lease, _ in items}
                parents = {lease.job_id for lease, _ in items if lease.has_dependents}
                return Completions(done=done, refused={}, parents=parents)
            docs = await self._completion_states(items, session)
            # A completion that did not know of dependents is fenced on there being none: a
            # child attached after the claim (its submitter saw this job still running) made
            # it match nothing. Complete those again, knowing; the caller settles the children.
            late = [
                (replace(lease, has_dependents=True), result)
                for lease, result in items
                if (d := docs.get(lease.job_id)) is not None
                and not lease.has_dependents
                and d.get("has_dependents") is True
                and (d["status"], d["attempts"], d.get("owner")) == (R, lease.attempt, owner)
            ]
            if late:
                refused.update(await self._write_completions(owner, late, times, session) or {})
                docs = await self._completion_states(items, session)
        # Which ones are ours? A completed job with our attempt number can only be ours:
        # every claim takes a new attempt number.
        wanted = {lease.job_id: lease.attempt for lease, _ in items}
        done = {
            job_id
            for job_id, d in docs.items()
            if d["status"] == JobStatus.COMPLETED.value and d["attempts"] == wanted[job_id]
        }
        return Completions(
            done=done,
            refused={k: v for k, v in refused.items() if k not in done},
            parents={job_id for job_id in done if docs[job_id].get("has_dependents") is True},
        )

    async def _write_completions(
        self,
        owner: str,
        items: Sequence[tuple[Lease, Any]],
        times: Mapping[str, RunTimes],
        session: AsyncClientSession,
    ) -> dict[str, str] | None:
        """Fenced completions in one write: None if every one matched, else the ids MongoDB
        refused, with the reason (an empty dict: some matched nothing, or the write's
        majority wait failed; the caller reads their states back).

        Several go in one `update_many` whose values are picked per job by `_id`: about
        half the server's work of as many single-document updates (a retryable write per
        document). One MongoDB refuses (too large, say) stops that write part-way: they are
        then written one statement each (those done already match nothing), to learn which."""
        if len(items) > 1:
            try:
                write = queries.completions_by_id(owner, items, self.retention_s, times)
                res = await self.jobs.update_many(write.filter, write.update, session=session)
                return None if res.matched_count == len(items) else {}
            except WriteConcernError:
                return {}
            except (WriteError, DocumentTooLarge):
                pass
        return await self._write_each_completion(owner, items, times, session)

    async def _write_each_completion(
        self,
        owner: str,
        items: Sequence[tuple[Lease, Any]],
        times: Mapping[str, RunTimes],
        session: AsyncClientSession,
    ) -> dict[str, str] | None:
        """One `bulk_write` of fenced completions, one statement each."""
        writes = [
            queries.completed(lease, owner, result, self.retention_s, times.get(lease.job_id))
            for lease, result in items
        ]
        ops = [UpdateOne(w.filter, w.update) for w in writes]
        refused: dict[str, str] = {}
        try:
            res = await self.jobs.bulk_write(ops, ordered=False, session=session)
            if res.matched_count == len(ops):
                return None
        except BulkWriteError as exc:
            for err in exc.details.get("writeErrors", []):
                refused[items[err["index"]][0].job_id] = str(err.get("errmsg", ""))[:2000]
        return refused

    async def _completion_states(
        self, items: Sequence[tuple[Lease, Any]], session: AsyncClientSession
    ) -> dict[str, Doc]:
        docs = await self.jobs.find(
            {"_id": {"$in": [lease.job_id for lease, _ in items]}},
            projection={"status": 1, "attempts": 1, "owner": 1, "has_dependents": 1},
            session=session,
        ).to_list()
        return {d["_id"]: d for d in docs}

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
        write = queries.attempt_failed(
            lease, owner, error, retry_delay_s, self.retention_s, final=final, ran=ran
        )
        return await self.write_held(
            write, f"job {lease.job_id} attempt {lease.attempt} is no longer held"
        )

    async def completed_by(self, lease: Lease) -> bool:
        """Whether this attempt completed the job itself (in its own transaction): every claim
        takes a new attempt number, so a job completed at this number was completed by it."""
        doc = await self.jobs.find_one(
            {"_id": lease.job_id, "attempts": lease.attempt, "status": JobStatus.COMPLETED.value},
            projection={"_id": 1},
        )
        return doc is not None

    async def cancel_running(self, lease: Lease, owner: str, *, ran: RunTimes | None = None) -> Job:
        """The holder stopped the worker of a job whose cancel was requested (`ran`: when its
        task started and was stopped), or dropped it before its task started (no `ran`)."""
        write = queries.cancelled_running(lease, owner, self.retention_s, ran)
        return await self.write_held(write, _not_held(lease, owner))

    async def release(self, lease: Lease, owner: str) -> Job:
        """Graceful shutdown: hand a running job back at once. The interrupted attempt is not
        the job's fault, so it is not counted; the worker was stopped before this write (or
        the job was only claimed ahead). It keeps its `run_at`: it was due when claimed, so
        it is due now, in its place in the claim order (and a scheduled job keeps its tick)."""
        write = queries.released(lease, owner, self.retention_s)
        return await self.write_held(write, _not_held(lease, owner))

    async def release_many(self, owner: str, leases: Sequence[Lease]) -> dict[str, Job]:
        """`release` of each of `leases` in one round trip (one majority wait: a dispatcher
        that stops hands hundreds of jobs back within its grace period); the jobs it handed
        back, by id. One no longer held is not there. Told by the history entry of the
        release (which a claim by another dispatcher right after it does not remove)."""
        writes = [queries.released(lease, owner, self.retention_s) for lease in leases]
        await self.jobs.bulk_write([UpdateOne(w.filter, w.update) for w in writes], ordered=False)
        attempt = {lease.job_id: lease.attempt for lease in leases}
        docs = await self.jobs.find({"_id": {"$in": list(attempt)}}).to_list()
        handed_back: dict[str, Job] = {}
        for doc in docs:
            entries = doc.get("history") or []
            if any(
                h.get("reason") == "released" and h.get("attempt") == attempt[doc["_id"]]
                for h in entries
            ):
                handed_back[doc["_id"]] = Job.from_doc(doc)
        return handed_back

    async def requeue_expired(self, lease: ExpiredLease, retry_delay_s: float) -> Job:
        """Watchdog: the holder of this lease died or froze; count the attempt and retry or
        fail. An attempt whose task is not known to have started (no `started_at`: it was
        claimed ahead, or started under MARK_AFTER_S before) keeps its number, the fencing
        token, but does not use up the job's attempts: `max_attempts` grows by one."""
        write = queries.requeued_expired(lease, retry_delay_s, self.retention_s)
        return await self.write_held(
            write, f"job {lease.job_id} attempt {lease.attempt} is no longer held"
        )

    async def ended_by_holder(self, lease: Lease) -> Job | None:
        """A fenced write that ends an attempt found it no longer held: the job, if that
        attempt was ended by its holder after all (an earlier try of the same write
        applied, and its reply was lost to a failover); None if the watchdog ended it, or
        nothing did. Only the holder and the watchdog end an attempt, and the watchdog's
        history entry says `LeaseExpired`."""
        doc = await self.jobs.find_one({"_id": lease.job_id})
        if doc is None:
            return None
        mine = [h for h in doc.get("history") or [] if h.get("attempt") == lease.attempt]
        if not mine or mine[-1].get("status") == R or mine[-1].get("error") == "LeaseExpired":
            return None
        return Job.from_doc(doc)


def _not_held(lease: Lease, owner: str) -> str:
    return f"job {lease.job_id} attempt {lease.attempt} is no longer held by {owner}"
