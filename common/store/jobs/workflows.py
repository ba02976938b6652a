"""Workflows in the jobs collection: when a parent ends, its waiting dependents are settled.

A child is inserted `waiting` with `depends_on` (its parents, for good) and `parents_left`
(those not ended yet). A parent gets `has_dependents` (its completion settles its children)
and `unsettled` (a token: its children may still wait on it; the sweep's backstop, and it
keeps the parent from expiring). Settling a parent's children is one conditional
`update_many` per page of 1,000 children, whatever the fan-out, then one write that clears
the parents' `unsettled` tokens.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from typing import Any

from pymongo import UpdateOne

from brook.common.domain.errors import JobNotFound
from brook.common.domain.status import TERMINAL, JobStatus
from brook.common.store import queries
from brook.common.store.fields import W
from brook.common.store.jobs.base import JobsCollection
from brook.common.store.queries import ENDED
from brook.common.store.records import EndedParent, Settled

# How many waiting children one settling write handles (a larger fan-out takes more).
SETTLE_PAGE = 1000


class JobWorkflows(JobsCollection):
    """Parents, their waiting children, and settling them."""

    async def missing_jobs(self, job_ids: Collection[str]) -> set[str]:
        """Which of these ids name no job (unknown parents)."""
        if not job_ids:
            return set()
        found = await self.jobs.find(
            {"_id": {"$in": list(job_ids)}}, projection={"_id": 1}
        ).to_list()
        return set(job_ids) - {d["_id"] for d in found}

    async def attach_dependents(self, parent_ids: Collection[str]) -> None:
        """Mark these jobs as parents with dependents not settled yet. A parent that ended
        already loses its `expire_at` until they are (`mark_settled` sets it again)."""
        write = queries.dependents_attached(parent_ids, secrets.token_hex(8))
        await self.jobs.update_many(write.filter, write.update)

    async def ended_parents(self, parent_ids: Collection[str]) -> list[EndedParent]:
        """Which of these jobs have ended: finished (with their `unsettled` token), or gone
        (deleted), which their dependents take as a failure."""
        docs = await self.jobs.find(
            {"_id": {"$in": list(parent_ids)}}, projection={"status": 1, "unsettled": 1}
        ).to_list()
        found = {d["_id"] for d in docs}
        ended = [
            EndedParent(job_id=d["_id"], status=JobStatus(d["status"]), token=d.get("unsettled"))
            for d in docs
            if JobStatus(d["status"]) in TERMINAL
        ]
        gone = [
            EndedParent(job_id=i, status=None, token=None) for i in parent_ids if i not in found
        ]
        return ended + gone

    async def settle_children(self, ended: Sequence[EndedParent]) -> list[Settled]:
        """The waiting children of these ended parents forget them; a child left with no
        parent becomes `pending`, and one with a parent that did not complete becomes
        `cancelled` (`DependencyFailed`) unless it runs on parent failure. Returns the
        children whose status this call changed."""
        out: list[Settled] = []
        ids = [p.job_id for p in ended]
        while True:
            page = await self.jobs.find(
                {"parents_left": {"$in": ids}, "status": W},
                projection={"_id": 1},
                limit=SETTLE_PAGE,
                batch_size=SETTLE_PAGE,
                hint="waiting_on",
            ).to_list()
            if not page:
                return out
            children = [d["_id"] for d in page]
            tag = secrets.token_hex(8)
            write = queries.settled(children, ended, tag, self.retention_s)
            await self.jobs.update_many(write.filter, write.update)
            changed = await self.jobs.find(
                {"_id": {"$in": children}, "settled.tag": tag},
                projection={"task": 1, "settled": 1, "has_dependents": 1, "error": 1},
                batch_size=SETTLE_PAGE,
            ).to_list()
            out += [Settled.from_doc(d) for d in changed]
            if len(page) < SETTLE_PAGE:
                return out

    async def mark_settled(self, ended: Sequence[EndedParent]) -> None:
        """Clear the `unsettled` token of these finished parents, unless a child attached
        since it was read (a new token), and start their retention from now."""
        writes = [queries.marked_settled(p, self.retention_s) for p in ended if p.token is not None]
        ops = [UpdateOne(w.filter, w.update) for w in writes]
        if ops:
            await self.jobs.bulk_write(ops, ordered=False)

    async def unsettled_parents(self, limit: int = 1000) -> list[str]:
        """Finished parents whose dependents were not settled (say, the dispatcher that
        completed them died first): the sweep settles them."""
        docs = await self.jobs.find(
            {"unsettled": {"$exists": True}, "status": {"$in": ENDED}},
            projection={"_id": 1},
            limit=limit,
            hint="dependents_unsettled",
        ).to_list()
        return [d["_id"] for d in docs]

    async def parent_results(self, job_id: str) -> dict[str, Any]:
        """`{parent id: its result}` for this job's parents, in `depends_on` order (a parent
        deleted meanwhile is left out; one that failed has a null result)."""
        doc = await self.jobs.find_one({"_id": job_id}, projection={"depends_on": 1})
        if doc is None:
            raise JobNotFound(job_id)
        parents: list[str] = list(doc.get("depends_on") or [])
        if not parents:
            return {}
        found = await self.jobs.find({"_id": {"$in": parents}}, projection={"result": 1}).to_list()
        results = {d["_id"]: d.get("result") for d in found}
        return {p: results[p] for p in parents if p in results}
