"""Submitting jobs into the jobs collection: one job, a batch, a workflow (children that
wait for their parents), with idempotency keys that a job holds while it exists or until
its unique window ends."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

import bson
from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError

from brook.common.domain.errors import JobConflict
from brook.common.domain.models import Doc, Job, JobSpec
from brook.common.domain.workflows import external_parents, parent_ids
from brook.common.store import queries
from brook.common.store.db import is_transient_code
from brook.common.store.fields import new_job
from brook.common.store.jobs.workflows import JobWorkflows
from brook.common.store.records import Refused, Submitted

KEY_TRIES = 5  # a key freed and taken again by a peer, over and over: give up, say so
# A debounced job claimed and started again by peers between each of our tries.
DEBOUNCE_TRIES = 20


class JobSubmits(JobWorkflows):
    """Submits (a workflow's submit marks its parents: `JobWorkflows`)."""

    async def submit(self, spec: JobSpec) -> Submitted:
        """Insert a pending job, majority-acknowledged; a known idempotency key returns its job."""
        if spec.depends_on:
            return (await self.submit_many([spec]))[0]
        if spec.debounce_key is not None:
            return await self._submit_debounced(spec)
        for _ in range(KEY_TRIES):
            try:
                # An upsert on a fresh _id always inserts, and lets the server stamp the times.
                write = queries.submitted(str(ObjectId()), spec)
                doc = await self.jobs.find_one_and_update(
                    write.filter,
                    write.update,
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

    async def _submit_debounced(self, spec: JobSpec) -> Submitted:
        """Join the pending job of the spec's debounce key, or start it (`created`)."""
        for _ in range(DEBOUNCE_TRIES):
            job_id = str(ObjectId())
            write = queries.debounced(job_id, spec)
            try:
                doc = await self.jobs.find_one_and_update(
                    write.filter, write.update, upsert=True, return_document=ReturnDocument.AFTER
                )
            except DuplicateKeyError:
                continue  # a racing submit started it first: join that one
            assert doc is not None
            return Submitted(job=Job.from_doc(doc), created=doc["_id"] == job_id)
        raise JobConflict(f"debounce key {spec.debounce_key!r} keeps changing hands")

    async def submit_many(self, specs: Sequence[JobSpec]) -> list[Submitted]:
        """`submit` for many jobs in one write (one `insert_many`, one majority wait), in
        order. A job whose idempotency key exists (or repeats within the batch) returns the
        job holding it; only a key whose unique window ended meanwhile costs more round
        trips."""
        # One reading of the server's clock stamps the whole batch: an insert cannot evaluate
        # `$$NOW`, and an upsert per job costs the server several times more.
        if any(spec.debounce_key is not None for spec in specs):
            # Each debounced spec joins (or starts) its job on its own; the others go in
            # together.
            plain = [s for s in specs if s.debounce_key is None]
            done = iter(await self.submit_many(plain) if plain else [])
            return [
                await self._submit_debounced(s) if s.debounce_key is not None else next(done)
                for s in specs
            ]
        now = await self.clock.read()
        if any(spec.depends_on for spec in specs):
            return await self._submit_workflow(specs, now)
        docs = [{"_id": str(ObjectId()), **new_job(spec, now)} for spec in specs]
        return await self._insert_submitted(specs, docs)

    async def submit_or_refuse(
        self, specs: Sequence[JobSpec], max_bytes: int
    ) -> list[Submitted | Refused]:
        """`submit_many` for plain specs (no parents, no debounce key) made from data Brook
        did not check (a trigger's, from an application's documents), in one write: in spec
        order, each one's `Submitted`, or `Refused` with the reason for a job over
        `max_bytes` as BSON, one that cannot be encoded, or one MongoDB refuses for itself
        (nested too deeply, say). The others go in all the same."""
        now = await self.clock.read()
        refused: dict[int, str] = {}
        kept: list[int] = []
        docs: list[Doc] = []
        for i, spec in enumerate(specs):
            doc = {"_id": str(ObjectId()), **new_job(spec, now)}
            try:
                size = len(bson.encode(doc, codec_options=self.jobs.codec_options))
            except Exception as exc:  # bson raises several types for values it cannot encode
                refused[i] = f"cannot be stored: {type(exc).__name__}: {exc}"[:500]
                continue
            if size > max_bytes:
                refused[i] = f"too large: its job is {size} bytes as BSON; the limit is {max_bytes}"
                continue
            kept.append(i)
            docs.append(doc)
        server_refused: dict[int, str] = {}
        done = iter(await self._insert_submitted([specs[i] for i in kept], docs, server_refused))
        for j, reason in server_refused.items():
            refused[kept[j]] = f"refused by MongoDB: {reason}"[:500]
        return [
            Refused(reason=refused[i]) if i in refused else next(done) for i in range(len(specs))
        ]

    async def _insert_submitted(
        self,
        specs: Sequence[JobSpec],
        docs: Sequence[Doc],
        refused: dict[int, str] | None = None,
    ) -> list[Submitted]:
        """Insert these jobs; each one's `Submitted`, in order. With `refused`, a job MongoDB
        refuses is left out and put there (its index, the reason) instead of failing all."""
        duplicates = await self._insert_new(docs, refused)
        out: list[Submitted] = []
        for i, spec in enumerate(specs):
            if refused and i in refused:
                continue
            if i not in duplicates:
                out.append(Submitted(job=Job.from_doc(docs[i]), created=True))
                continue
            holder = await self._key_holder(spec)
            if holder is None:  # the key was freed meanwhile: this spec goes in on its own
                holder_spec = replace(spec, depends_on=tuple(docs[i].get("depends_on", ())))
                out.append(await self.submit(holder_spec))
            else:
                out.append(Submitted(job=holder, created=False))
        return out

    async def _submit_workflow(self, specs: Sequence[JobSpec], now: datetime) -> list[Submitted]:
        """Specs with parents: each child goes in `waiting` for its parents (ids, or refs
        resolved to the ids of this batch's jobs), and every parent is marked as having
        unsettled dependents. Parents named by id are marked before the insert (a submitter
        dying after the insert leaves them marked, so the sweep finds the children) and
        again after it (a settle that ran in between, and cleared the mark, missed them).
        The caller then re-checks the parents (`workflows`' `recheck`): one that ended
        before the second mark may have settled its dependents without these."""
        ids = [str(ObjectId()) for _ in specs]
        parents = parent_ids(specs, ids)
        external = external_parents(specs)
        if external:
            await self.attach_dependents(external)
        docs = [{"_id": ids[i], **new_job(spec, now, parents[i])} for i, spec in enumerate(specs)]
        named = {p for ps in parents for p in ps}
        token = secrets.token_hex(8)
        for doc in docs:
            if doc["_id"] in named:
                doc["has_dependents"] = True
                doc["unsettled"] = token
        out = await self._insert_submitted(specs, docs)
        # A parent of this batch that was deduplicated (its idempotency key names an
        # existing job) is that job: its children here are told so.
        adopted = {ids[i]: s.job.id for i, s in enumerate(out) if s.job.id != ids[i]}
        adopted = {new: old for new, old in adopted.items() if new in named}
        if adopted:
            out = await self._adopt_parents(adopted, out)
        if external or adopted:
            await self.attach_dependents([*external, *adopted.values()])
        return out

    async def _adopt_parents(
        self, adopted: Mapping[str, str], out: Sequence[Submitted]
    ) -> list[Submitted]:
        """Point the waiting children of never-inserted jobs (`adopted`: their id → the id
        of the job holding their idempotency key) at the jobs that hold the keys."""
        write = queries.parents_adopted(adopted)
        await self.jobs.update_many(write.filter, write.update)
        fresh = {
            d["_id"]: Job.from_doc(d)
            for d in await self.jobs.find({"_id": {"$in": [s.job.id for s in out]}}).to_list()
        }
        return [
            Submitted(job=fresh.get(s.job.id, s.job), created=s.created) if s.created else s
            for s in out
        ]

    async def _insert_new(
        self, docs: Sequence[Doc], refused: dict[int, str] | None = None
    ) -> set[int]:
        """Insert these new jobs (one unordered `insert_many`); return the indexes refused
        for an idempotency key that is already taken. With `refused`, the documents MongoDB
        refuses for themselves (the others went in) are put there with the reason, instead
        of raising."""
        if not docs:
            return set()
        try:
            await self.jobs.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            own = [e for e in errors if e.get("code") != 11000]
            if own and (
                refused is None
                or exc.details.get("writeConcernErrors")
                or any(is_transient_code(e.get("code")) for e in own)
            ):
                raise
            for err in own:
                assert refused is not None
                refused[int(err["index"])] = f"{err.get('code')}: {err.get('errmsg', '')}"
            return {int(err["index"]) for err in errors if err.get("code") == 11000}
        return set()

    async def by_idempotency_key(self, key: str) -> Job | None:
        """The job holding this idempotency key now, if any (a schedule's tick finds its
        run by it: `schedule:{name}:{tick}`)."""
        doc = await self.jobs.find_one({"idempotency_key": key})
        return Job.from_doc(doc) if doc is not None else None

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
            write = queries.key_released(doc["_id"], key)
            released = await self.jobs.update_one(write.filter, write.update)
            if released.modified_count:
                return None
            # Not released: its window is still open, or a peer released the key (and
            # maybe took it) meanwhile. Whoever holds it now is the answer.
            holder = await self.jobs.find_one({"idempotency_key": key})
            if holder is None or holder["_id"] == doc["_id"]:
                return Job.from_doc(holder) if holder is not None else None
        raise JobConflict(f"idempotency key {key!r} keeps changing hands")
