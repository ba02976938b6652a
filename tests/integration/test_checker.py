"""The history checker itself can fail: each kind of broken history is reported."""

from __future__ import annotations

from typing import Any

import pytest

from brook.common.store.jobs import JobStore
from tests.support.checker import check_history

READY = {"event": "dispatcher.ready"}


def job(job_id: str, *statuses: str, attempts: int = 1) -> dict[str, Any]:
    return {
        "_id": job_id,
        "status": statuses[-1],
        "attempts": attempts,
        "max_attempts": 3,
        "history": [{"status": s} for s in statuses],
    }


def completed(job_id: str) -> dict[str, Any]:
    return {"event": "job.completed", "job_id": job_id}


async def problems(
    store: JobStore, docs: list[dict[str, Any]], logs: list[dict[str, Any]], **kw: Any
) -> list[str]:
    await store.jobs.insert_many(docs)
    report = await check_history(store, kw.pop("acknowledged", []), [READY, *logs], **kw)
    return report.problems


async def test_a_clean_history_passes(store: JobStore) -> None:
    docs = [job("a", "pending", "running", "completed"), job("b", "pending", "cancelled")]
    assert await problems(store, docs, [completed("a")], acknowledged=["a", "b"]) == []


async def test_a_lost_or_unfinished_or_illegal_history_is_reported(store: JobStore) -> None:
    docs = [
        job("stuck", "pending", "running"),
        job("twice", "pending", "running", "completed", "running", "completed"),
        job("skipped", "running", "completed"),
    ]
    logs = [completed("twice"), completed("skipped")]
    found = await problems(store, docs, logs, acknowledged=["lost", "stuck"])
    assert any("lost is missing" in p for p in found)
    assert any("stuck is running" in p for p in found)
    assert any("twice illegal transitions" in p for p in found)
    assert any("skipped history does not start pending" in p for p in found)


async def test_completion_logs_must_match_the_documents_one_to_one(store: JobStore) -> None:
    docs = [
        job("twice", "pending", "running", "completed"),
        job("silent", "pending", "running", "completed"),
        job("failed", "pending", "running", "failed"),
    ]
    logs = [completed("twice"), completed("twice"), completed("failed"), completed("ghost")]
    found = await problems(store, docs, logs)
    assert any("twice has 2 job.completed" in p for p in found)
    assert any("silent has 0 job.completed" in p for p in found)
    assert any("failed is failed but has 1 job.completed" in p for p in found)
    assert any("ghost has a job.completed log line but no document" in p for p in found)


async def test_a_repeated_or_missing_side_effect_is_reported(store: JobStore) -> None:
    await store.db["effects"].insert_many(
        [{"job_id": "a", "attempt": 1}, {"job_id": "a", "attempt": 1}]
    )
    docs = [
        job("a", "pending", "running", "completed"),
        job("b", "pending", "running", "completed"),
    ]
    found = await problems(store, docs, [completed("a"), completed("b")], effects=True)
    assert any("('a', 1) happened 2 times" in p for p in found)
    assert any("b completed without its attempt's side effect" in p for p in found)


async def test_the_checker_refuses_to_run_without_the_dispatchers_logs(store: JobStore) -> None:
    with pytest.raises(ValueError, match="needs the logs"):
        await check_history(store, [], [])
