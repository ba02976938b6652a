"""The filter of a bulk retry or cancel: one type for the Python client, the HTTP body and
the CLI, checked when made."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from datetime import UTC, datetime

import pytest

from brook.common.domain.bulk import BulkBody, JobFilter, validate_bulk
from brook.common.domain.status import JobStatus
from brook.errors import InvalidInput


def test_a_filter_reads_statuses_and_times_into_their_types() -> None:
    f = JobFilter(status="failed", task="echo", finished_since="2026-12-01T10:00:00+01:00")
    assert f.status == (JobStatus.FAILED,)
    assert f.finished_since == datetime(2026, 12, 1, 9, tzinfo=UTC)
    naive = JobFilter(created_until=datetime(2026, 1, 1))
    assert naive.created_until == datetime(2026, 1, 1, tzinfo=UTC)  # naive reads as UTC
    assert JobFilter(status=["cancelled", "failed"]).statuses_for("retry") == [
        "cancelled",
        "failed",
    ]
    assert JobFilter(status="pending").statuses_for("retry") == []  # a retry takes none of them
    assert JobFilter(key="acme").statuses_for("cancel") == ["pending", "running", "waiting"]
    with pytest.raises(FrozenInstanceError):
        f.task = "other"  # type: ignore[misc]


def test_a_bad_filter_is_refused_when_made_as_the_api_refuses_it() -> None:
    with pytest.raises(InvalidInput) as bad:
        JobFilter(status="nonsense")
    detail = bad.value.detail
    assert isinstance(detail, list) and detail
    assert all(error["loc"][:2] == ["body", "status"] for error in detail)  # type: ignore[index]
    with pytest.raises(InvalidInput):
        JobFilter(queue="bad name!")
    with pytest.raises(InvalidInput):
        JobFilter(finished_until="yesterday")


def test_the_http_body_and_the_filter_name_the_same_fields() -> None:
    names = {f.name for f in fields(JobFilter)}
    assert names == set(BulkBody.model_fields) - {"dry_run"}
    f = JobFilter(status="failed", error_type="TimeoutError")
    assert f.given() == {"status": [JobStatus.FAILED], "error_type": "TimeoutError"}
    assert validate_bulk({**f.given(), "dry_run": True}) == (f, True)
    with pytest.raises(InvalidInput, match="at least one filter"):
        validate_bulk({"dry_run": True})
