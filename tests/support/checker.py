"""The history checker every fault test ends with.

Over the jobs collection (majority read) and the processes' JSON logs it checks: no
acknowledged job missing; every job terminal with a legal status history (a second
accepted completion would be `completed → …`, which the table forbids); nothing left
running; side effects never repeated for the same (job_id, attempt); no duplicate effect
rows (for a transactional task's rows: one per completed job, from its completing attempt,
and none for a job that did not complete); exactly one
`job.completed` log line per completed job and none for any other, so a completion
accepted twice, or reported without being stored, is caught in the logs too. The logs
are required: a check without them would skip half of this.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from brook.common.domain.status import TERMINAL, TRANSITIONS, JobStatus
from brook.common.store.jobs import JobStore


@dataclass
class Report:
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def by_status(self) -> Counter[str]:
        return Counter(doc["status"] for doc in self.jobs.values())


async def settled_logs(
    store: JobStore, read: Callable[[], list[dict[str, Any]]], timeout: float = 10.0
) -> list[dict[str, Any]]:
    """The logs, once every completed job's `job.completed` line is in them: a dispatcher
    logs it just after its write, so a reader that looks at once can be a moment early.
    After `timeout` they are returned as they are, and the checker reports what is missing."""
    deadline = time.monotonic() + timeout
    while True:
        logs = read()
        logged = {e.get("job_id") for e in logs if e.get("event") == "job.completed"}
        completed = {
            str(d["_id"])
            async for d in store.jobs.find({"status": "completed"}, projection={"_id": 1})
        }
        if completed <= logged or time.monotonic() > deadline:
            return logs
        await asyncio.sleep(0.1)


async def check_history(  # noqa: C901 - one flat list of independent checks
    store: JobStore,
    acknowledged: Iterable[str],
    logs: Iterable[dict[str, Any]],
    *,
    effects: bool = False,
    rows: str | None = None,
    row_tasks: Iterable[str] = ("order", "order_sync"),
) -> Report:
    report = Report()
    logs = list(logs)
    if not any(e.get("event") == "dispatcher.ready" for e in logs):
        raise ValueError("check_history needs the logs of every dispatcher involved")
    async for doc in store.jobs.find({}):
        report.jobs[str(doc["_id"])] = doc
    problems = report.problems
    for job_id in acknowledged:
        if job_id not in report.jobs:
            problems.append(f"acknowledged job {job_id} is missing")
    for job_id, doc in report.jobs.items():
        status = JobStatus(doc["status"])
        if status not in TERMINAL:
            problems.append(f"{job_id} is {status} (not terminal)")
        history = [JobStatus(h["status"]) for h in doc.get("history", [])]
        first = JobStatus.WAITING if doc.get("depends_on") else JobStatus.PENDING
        if not history or history[0] != first:
            problems.append(f"{job_id} history does not start {first}: {history}")
        if history and history[-1] != status:
            problems.append(f"{job_id} history ends {history[-1]} but status is {status}")
        illegal = [p for p in itertools.pairwise(history) if p not in TRANSITIONS]
        if illegal:
            problems.append(f"{job_id} illegal transitions {illegal}")
        if status == JobStatus.COMPLETED and doc["attempts"] > doc["max_attempts"]:
            problems.append(f"{job_id} ran {doc['attempts']} attempts of {doc['max_attempts']}")
    if effects:
        seen = Counter(
            (e["job_id"], e["attempt"]) for e in await store.db["effects"].find({}).to_list()
        )
        for key, n in seen.items():
            if n > 1:
                problems.append(f"side effect of {key} happened {n} times")
        for job_id, doc in report.jobs.items():
            if doc["status"] == "completed" and (job_id, doc["attempts"]) not in seen:
                problems.append(f"{job_id} completed without its attempt's side effect")
    if rows is not None:
        problems += await _effect_rows(store, report, rows, set(row_tasks))
    completed_logs = Counter(
        e["job_id"] for e in logs if e.get("event") == "job.completed" and "job_id" in e
    )
    for job_id, doc in report.jobs.items():
        n = completed_logs.get(job_id, 0)
        if doc["status"] == "completed" and n != 1:
            problems.append(f"{job_id} has {n} job.completed log lines")
        elif doc["status"] != "completed" and n:
            problems.append(f"{job_id} is {doc['status']} but has {n} job.completed log lines")
    for job_id in set(completed_logs) - set(report.jobs):
        problems.append(f"{job_id} has a job.completed log line but no document")
    return report


async def _effect_rows(
    store: JobStore, report: Report, collection: str, tasks: set[str]
) -> list[str]:
    """Rows a transactional task writes with its completion (`{job_id, attempt}` each):
    exactly one per completed job (of `tasks`), from the attempt that completed it; none
    for a job that did not complete."""
    problems: list[str] = []
    by_job: dict[str, list[int | None]] = {}
    for row in await store.db[collection].find({}).to_list():
        by_job.setdefault(str(row["job_id"]), []).append(row.get("attempt"))
    for job_id, attempts in by_job.items():
        if len(attempts) > 1:
            problems.append(f"{job_id} has {len(attempts)} effect rows in {collection}: {attempts}")
        doc = report.jobs.get(job_id)
        if doc is None or doc["status"] != "completed":
            status = None if doc is None else doc["status"]
            problems.append(f"{job_id} is {status} but has effect rows {attempts} in {collection}")
        elif attempts != [doc["attempts"]]:
            problems.append(
                f"{job_id} completed at attempt {doc['attempts']} but its rows are {attempts}"
            )
    for job_id, doc in report.jobs.items():
        if doc["status"] == "completed" and doc["task"] in tasks and job_id not in by_job:
            problems.append(f"{job_id} completed without its effect row in {collection}")
    return problems
