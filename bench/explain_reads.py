"""Every listing, search and grouping read of the API, explained at scale.

    .venv/bin/python -m bench.explain_reads [--jobs 200000] [--uri URI]

Builds `--jobs` jobs in a scratch database (on `--uri`, or on a fresh one-member embedded
set under `.brook/bench-explain`), then asks the server for the plan of each read exactly
as the jobs store builds it (`JobStore.list_query` and `find_cursor`, the aggregations of
`queries.listing`) and prints, per read, the index, the keys and documents examined, the
jobs returned and whether anything was sorted in memory. The jobs: a fifth of them with a
key (one of 100), four tasks, each in its own queue, 90% completed, 4% failed, 1%
cancelled, 3% pending (a third of those with an error: waiting for a retry), 1% running,
1% waiting; one created a second, the newest now. The test at scale
(`tests/e2e/test_search_scale.py`) explains the same reads on the same jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bson import ObjectId
from pymongo import AsyncMongoClient, MongoClient

from brook.common.domain.models import Doc
from brook.common.domain.status import JobStatus
from brook.common.store.jobs import INDEXES, JobStore
from brook.common.store.queries.listing import Aggregate, failure_groups, queue_counts

TASKS = 4
KEYS = 100
ERROR_TYPES = 11
# Per 100 jobs, by position: the statuses' shares.
_STATUSES = ["completed"] * 90 + ["failed"] * 4 + ["cancelled"] + ["pending"] * 3
_STATUSES += ["running", "waiting"]
BATCH = 20_000


def job_docs(n: int, now: datetime) -> Iterator[Doc]:
    """`n` jobs as the store writes them (small payloads and results), oldest first."""
    for i in range(n):
        created = now - timedelta(seconds=n - i)
        status = _STATUSES[(i * 7919) % 100]  # spread over the positions, not in runs
        ended = status in ("completed", "failed", "cancelled")
        with_error = status in ("failed", "cancelled") or (status == "pending" and i % 3 == 0)
        doc: Doc = {
            "_id": str(ObjectId.from_datetime(created))[:8] + f"{i:016x}",
            "task": f"task{i % TASKS}",
            "payload": {"i": i},
            "status": status,
            "queue": f"q{i % TASKS}",
            "priority": 0,
            "attempts": 1,
            "max_attempts": 3,
            "attempt_budget": 3,
            "run_at": created,
            "created_at": created,
            "updated_at": created + timedelta(seconds=1),
            "started_at": created,
            "finished_at": created + timedelta(seconds=1) if ended else None,
            "result": {"i": i} if status == "completed" else None,
            "error": (
                {"type": f"Error{i % ERROR_TYPES}", "message": f"boom {i % 101}"}
                if with_error
                else None
            ),
            "timeout_s": None,
            "owner": None,
            "lease_expires_at": None,
            "cancel_requested": False,
            "history": [{"status": status, "at": created, "attempt": 1}],
            "progress": None,
        }
        if i % 5 == 0:
            doc["key"] = f"k{i % KEYS}"
        yield doc


def fill(client: MongoClient[Doc], db: str, n: int) -> float:
    """`n` jobs into `db`'s jobs collection with the raw driver (unordered batches of
    `BATCH`), then its indexes (built once over them: faster than kept up per insert);
    seconds taken."""
    started = time.monotonic()
    jobs = client[db]["jobs"]
    batch: list[Doc] = []
    for doc in job_docs(n, datetime.now(UTC)):
        batch.append(doc)
        if len(batch) == BATCH:
            jobs.insert_many(batch, ordered=False)
            batch = []
    if batch:
        jobs.insert_many(batch, ordered=False)
    jobs.create_indexes(INDEXES)
    return time.monotonic() - started


# The listings and searches explained: what `GET /jobs` (and the dashboard's search) asks.
def list_cases(now: datetime) -> dict[str, dict[str, Any]]:
    return {
        "no filter": {},
        "status=pending": {"status": JobStatus.PENDING},
        "status=completed": {"status": JobStatus.COMPLETED},
        "task": {"task": "task1"},
        "queue": {"queue": "q2"},
        "queue, status": {"queue": "q2", "status": JobStatus.FAILED},
        "key": {"key": "k10"},
        "key, status": {"key": "k10", "status": JobStatus.FAILED},
        "error (prefix of 2 types)": {"error": "Error1"},
        "error, status": {"error": "Error1", "status": JobStatus.FAILED},
        "since (last 5 min)": {"since": now - timedelta(minutes=5)},
        "since, until (one hour, 20 h ago)": {
            "since": now - timedelta(hours=20),
            "until": now - timedelta(hours=19),
        },
        "task, since": {"task": "task1", "since": now - timedelta(minutes=10)},
        "status=running, task": {"status": JobStatus.RUNNING, "task": "task2"},
        # Every running job is of task2: this one reads all of them to find none.
        "status=running, task (none match)": {"status": JobStatus.RUNNING, "task": "task1"},
        "status=failed, task": {"status": JobStatus.FAILED, "task": "task1"},
    }


def aggregate_cases() -> dict[str, Aggregate]:
    return {
        "/failures: failed jobs": failure_groups("failed"),
        "/failures: retrying jobs": failure_groups("retrying"),
        "/queues, /metrics: counts": queue_counts(),
    }


@dataclass(frozen=True)
class Plan:
    indexes: tuple[str, ...]
    stages: tuple[str, ...]
    keys: int
    docs: int
    returned: int

    @property
    def sorted_in_memory(self) -> bool:
        return "SORT" in self.stages or "$sort" in self.stages

    def row(self, name: str) -> str:
        return (
            f"| {name} | `{', '.join(self.indexes) or '-'}` | {' ← '.join(self.stages)} |"
            f" {self.keys:,} | {self.docs:,} | {self.returned:,} |"
        )


def summary(explained: dict[str, Any]) -> Plan:
    """What an `explain("executionStats")` says the winning plan read (a find's or an
    aggregation's; the plans the planner tried and rejected are left out)."""
    if "stages" in explained:  # an aggregation whose later stages ran outside the query
        cursor = explained["stages"][0]["$cursor"]
        later = [n for stage in explained["stages"][1:] for n in stage if n.startswith("$")]
    else:
        cursor, later = explained, []
    plan = cursor["queryPlanner"]["winningPlan"]
    plan = plan.get("queryPlan", plan)  # the slot-based engine's plan, as stages
    stats = cursor["executionStats"]
    text = json.dumps(plan)
    return Plan(
        indexes=tuple(dict.fromkeys(re.findall(r'"indexName": "(\w+)"', text))),
        stages=(*reversed(later), *dict.fromkeys(re.findall(r'"stage": "([A-Z_]+)"', text))),
        keys=int(stats["totalKeysExamined"]),
        docs=int(stats["totalDocsExamined"]),
        returned=int(stats["nReturned"]),
    )


async def explain_list(store: JobStore, kwargs: dict[str, Any]) -> Plan:
    spec = await store.list_query(**kwargs)
    assert spec is not None
    return summary(await store.find_cursor(spec).explain())


async def explain_aggregate(store: JobStore, spec: Aggregate) -> Plan:
    explained = await store.db.command(
        "explain",
        {
            "aggregate": "jobs",
            "pipeline": spec.pipeline,
            "hint": spec.hint,
            "cursor": {},
            "maxTimeMS": store.query_max_ms,
        },
        verbosity="executionStats",
    )
    return summary(explained)


async def print_plans(uri: str, db: str) -> None:
    client: AsyncMongoClient[Doc] = AsyncMongoClient(uri)
    store = JobStore(client[db])
    try:
        print("| read | index | stages | keys examined | docs examined | returned |")
        print("|---|---|---|---|---|---|")
        for name, kwargs in list_cases(datetime.now(UTC)).items():
            print((await explain_list(store, kwargs)).row(f"`GET /jobs` {name}"))
        for name, spec in aggregate_cases().items():
            print((await explain_aggregate(store, spec)).row(name))
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--uri", help="a replica set to use (default: a fresh embedded one)")
    args = parser.parse_args()
    rs = None
    uri = args.uri
    if uri is None:
        from brook.replset import ReplicaSet

        home = Path(".brook/bench-explain")
        shutil.rmtree(home, ignore_errors=True)
        rs = ReplicaSet(home=home, base_port=27517, members=1)
        uri = rs.up()
    db = f"explain_{uuid.uuid4().hex[:8]}"
    sync: MongoClient[Doc] = MongoClient(uri)
    try:
        took = fill(sync, db, args.jobs)
        print(f"{args.jobs:,} jobs and their indexes in {took:.1f} s ({db})\n")
        asyncio.run(print_plans(uri, db))
    finally:
        sync.drop_database(db)
        sync.close()
        if rs is not None:
            rs.down()


if __name__ == "__main__":
    main()
