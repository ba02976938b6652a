"""Listing, search and grouping at 200,000 jobs: each read's plan, as the server explains
the store's own query, reads its index in the index's order (no collection scan, no sort
in memory) and only about the keys of the page; a search too broad for its time bound is
stopped there and answered `422` `search_too_broad`; listing pages leave payloads and
results out unless asked. The jobs (`bench.explain_reads`, the same the bench explains)
are made once for the module, in a group of its own."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import PyMongoError

from bench.explain_reads import (
    aggregate_cases,
    explain_aggregate,
    explain_list,
    fill,
    list_cases,
)
from brook.common.domain.errors import SearchTooBroad
from brook.common.domain.models import Doc
from brook.common.store.jobs import JobStore
from tests.conftest import Mongo
from tests.e2e.conftest import Cluster

pytestmark = [pytest.mark.xdist_group("search-scale"), pytest.mark.timeout(300)]

JOBS = 200_000
NOW = datetime.now(UTC)
# The index each listing reads; it may examine the keys of its page of 51 and one more per
# scan merged (a scan per status and error type: 2 types here).
EXPECTED = {
    "no filter": "list_created",
    "status=pending": "list_status",
    "status=completed": "list_status",
    "task": "list_task",
    "queue": "list_queue",
    "queue, status": "list_queue",
    "key": "by_key",
    "key, status": "by_key",
    "error (prefix of 2 types)": "errors",
    "error, status": "errors",
    "since (last 5 min)": "list_created",
    "since, until (one hour, 20 h ago)": "list_created",
    "task, since": "list_task",
    "status=running, task": "list_status",
}
PAGE_KEYS = 51 + 2 * 6


@pytest.fixture(scope="module")
def scale_db(mongo_one: Mongo) -> Iterator[str]:
    name = f"scale_{uuid.uuid4().hex[:8]}"
    client: MongoClient[Doc] = MongoClient(mongo_one.uri)
    try:
        fill(client, name, JOBS)
        yield name
    finally:
        with contextlib.suppress(PyMongoError):
            client.drop_database(name)
        client.close()


@pytest.fixture
async def scale_store(mongo_one: Mongo, scale_db: str) -> AsyncIterator[JobStore]:
    client: AsyncMongoClient[Doc] = AsyncMongoClient(mongo_one.uri)
    try:
        yield JobStore(client[scale_db])
    finally:
        await client.close()


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_each_listing_and_search_reads_its_index_in_order_and_about_a_page(
    scale_store: JobStore, name: str
) -> None:
    plan = await explain_list(scale_store, list_cases(NOW)[name])
    assert plan.indexes == (EXPECTED[name],), plan
    assert "COLLSCAN" not in plan.stages and not plan.sorted_in_memory, plan
    assert plan.returned == 51, plan  # every case fills its page (and finds the next)
    assert plan.keys <= PAGE_KEYS, plan


async def test_the_failure_groups_and_the_job_counts_read_their_indexes_unsorted(
    scale_store: JobStore,
) -> None:
    plans = {name: await explain_aggregate(scale_store, a) for name, a in aggregate_cases().items()}
    failed, retrying = plans["/failures: failed jobs"], plans["/failures: retrying jobs"]
    counts = plans["/queues, /metrics: counts"]
    assert failed.indexes == ("failures",) and retrying.indexes == ("errors",), plans
    for plan in plans.values():
        assert "COLLSCAN" not in plan.stages and not plan.sorted_in_memory, plan
    # Retrying jobs: one seek per error type beyond the jobs themselves (3% pending, a third
    # of them with an error), not every job with an error.
    assert retrying.keys <= retrying.returned + 11 + 1, retrying
    # The counts come from the index's keys alone: no job is read.
    assert counts.indexes == ("list_queue",) and counts.docs == 0, counts
    groups = await scale_store.failure_groups(None, limit=500)
    assert sum(g["failed"] for g in groups) == JOBS * 4 // 100
    assert sum(g["retrying"] for g in groups) == retrying.returned


async def test_a_search_too_broad_for_its_time_bound_stops_with_search_too_broad(
    scale_store: JobStore,
) -> None:
    # task1's jobs are all in q1: `task1` in `q2` reads all 50,000 of them to find none.
    tight = JobStore(scale_store.db, query_max_ms=1)
    with pytest.raises(SearchTooBroad, match=r"too broad.*within 1 ms.*narrow it"):
        await tight.list_jobs(task="task1", queue="q2")
    # The same search with the default bound finishes: nothing matches.
    assert await scale_store.list_jobs(task="task1", queue="q2") == ([], None)


async def test_the_store_reads_no_payload_or_result_for_a_listing_unless_asked(
    scale_store: JobStore,
) -> None:
    plain = await scale_store.list_query(limit=3, include=frozenset())
    assert plain is not None
    docs = await scale_store.find_cursor(plain).to_list()
    assert len(docs) == 4 and not any({"payload", "result"} & set(d) for d in docs)
    asked = await scale_store.list_query(limit=3, include=frozenset({"payload"}))
    assert asked is not None
    docs = await scale_store.find_cursor(asked).to_list()
    assert all("payload" in d and "result" not in d for d in docs)


def test_the_api_answers_a_search_too_broad_for_its_bound_422_search_too_broad(
    cluster: Cluster, scale_db: str
) -> None:
    cluster.api(BROOK_DB=scale_db, BROOK_QUERY_MAX_MS="1")
    with httpx.Client(base_url=cluster.api_url, timeout=30) as http:
        broad = http.get("/jobs", params={"task": "task1", "queue": "q2"})
    assert broad.status_code == 422, broad.text
    assert broad.json()["code"] == "search_too_broad"
    assert "narrow it" in broad.json()["detail"]


def test_a_listing_leaves_payloads_and_results_out_unless_asked(
    cluster: Cluster, scale_db: str
) -> None:
    cluster.api(BROOK_DB=scale_db)
    with httpx.Client(base_url=cluster.api_url, timeout=30) as http:
        jobs: list[dict[str, Any]] = http.get("/jobs", params={"limit": 3}).json()["jobs"]
        asked = http.get("/jobs", params={"limit": 3, "include": "payload,result"}).json()
        only = http.get("/jobs", params={"limit": 1, "include": "payload"}).json()["jobs"][0]
        bad = http.get("/jobs", params={"include": "payload,secrets"})
        one = http.get(f"/jobs/{jobs[0]['id']}").json()
    assert len(jobs) == 3 and not any({"payload", "result"} & set(j) for j in jobs)
    assert [j["payload"] for j in asked["jobs"]] == [{"i": JOBS - n} for n in (1, 2, 3)]
    assert all("result" in j for j in asked["jobs"])
    assert "payload" in only and "result" not in only
    assert bad.status_code == 400 and "'secrets'" in bad.json()["detail"]
    assert one["payload"] == {"i": JOBS - 1} and "result" in one  # one job: in full
