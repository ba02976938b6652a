"""Builders of a rerun from a step: the new job's document, and the link written on the
job it reruns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from brook.common.domain.models import DEFAULT_QUEUE, Doc, JobSpec
from brook.common.domain.status import TERMINAL
from brook.common.store.fields import lit, new_job
from brook.common.store.queries.base import Write


def rerun_spec(source: Mapping[str, Any], payload: dict[str, Any] | None) -> JobSpec:
    """The new job's spec: the source's task, queue, key, priority, attempts as submitted,
    timeout and retention, and its payload unless a new one is given. Never its
    idempotency key (that names the source), its schedule or trigger (it is no tick and
    no change), nor `spawned_by` (no task submitted it)."""
    return JobSpec(
        task=source["task"],
        payload=dict(source.get("payload") or {}) if payload is None else payload,
        queue=source.get("queue") or DEFAULT_QUEUE,
        priority=int(source.get("priority", 0)),
        max_attempts=int(source.get("attempt_budget") or source.get("max_attempts") or 1),
        timeout_s=source.get("timeout_s"),
        retention_s=source.get("retention_s"),
        key=source.get("key"),
    )


def rerun_job(
    source: Mapping[str, Any],
    new_id: str,
    from_step: str,
    carried: Sequence[Mapping[str, Any]],
    payload: dict[str, Any] | None,
    now: datetime,
) -> Doc:
    """The rerun's document, pending and due now (`now`, the server's time): `rerun_of`
    the source, its parents kept (`depends_on`, all ended: `ctx.parent_results` reads
    them), and the `carried` steps as its own recorded steps, under attempt 0 with
    `carried_from` (as the output chunks carried with them)."""
    source_id = str(source["_id"])
    doc: Doc = {"_id": new_id, **new_job(rerun_spec(source, payload), now)}
    if source.get("depends_on"):
        doc["depends_on"] = list(source["depends_on"])
        if source.get("run_on_parent_failure"):  # a retry of the rerun waits as the job did
            doc["run_on_parent_failure"] = True
    doc["rerun_of"] = source_id
    doc["history"][0].update(rerun_of=source_id, from_step=from_step)
    if carried:
        doc["steps"] = [{**s, "attempt": 0, "carried_from": source_id} for s in carried]
        doc["steps_bytes"] = sum(int(s.get("size", 0)) for s in carried)
    return doc


def rerun_linked(source_id: str, rerun_id: str) -> Write:
    """The source names its rerun (`reruns`, oldest first), only while it is finished: a
    job retried meanwhile is not rerun."""
    return Write(
        filter={"_id": source_id, "status": {"$in": sorted(s.value for s in TERMINAL)}},
        update=[
            {"$set": {"reruns": {"$concatArrays": [{"$ifNull": ["$reruns", []]}, [lit(rerun_id)]]}}}
        ],
    )
