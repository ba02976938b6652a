"""Deadlines without a database: what a spec may give, and which bound of a job has passed
(its own, or its task's default counted from its submit)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brook.common.domain.deadlines import TaskDeadlines, next_bound, passed
from brook.common.domain.errors import InvalidInput
from brook.common.domain.models import Job
from brook.common.domain.validation import validate_batch, validate_spec
from brook.executor import registry
from brook.executor.registry import get_task, task, task_deadlines

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SOON = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)


def message(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidInput) as info:
        validate_spec(data)
    detail = info.value.detail
    assert isinstance(detail, list)
    return str(detail[0]["msg"])


def test_a_spec_takes_each_bound_as_a_time_or_counted_from_the_submit() -> None:
    spec = validate_spec({"task": "noop", "start_by": SOON.isoformat(), "deadline_s": 60})
    assert (spec.start_by, spec.deadline_s, spec.start_within_s, spec.deadline) == (
        SOON,
        60,
        None,
        None,
    )
    spec = validate_spec({"task": "noop", "start_within_s": 5, "deadline": "2020-01-01T00:00"})
    assert spec.start_within_s == 5 and spec.deadline == datetime(2020, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ({"start_by": SOON.isoformat(), "start_within_s": 5}, "give start_by or start_within_s"),
        ({"deadline": SOON.isoformat(), "deadline_s": 5}, "give deadline or deadline_s"),
        (
            {"run_at": (SOON + timedelta(seconds=1)).isoformat(), "start_by": SOON.isoformat()},
            "run_at is later than start_by: the job could never start",
        ),
        ({"delay": 10, "start_within_s": 5}, "delay is later than start_within_s"),
        ({"delay": 7200, "start_by": SOON.isoformat()}, "delay is later than start_by"),
        (
            {"run_at": (SOON + timedelta(hours=1)).isoformat(), "start_within_s": 60},
            "run_at is later than start_within_s",
        ),
        ({"deadline_s": 0}, "greater than 0"),
        ({"start_within_s": -1}, "greater than 0"),
        ({"deadline_s": 366 * 86400}, "less than or equal to"),
        ({"start_by": "not a time"}, "ISO-8601"),
    ],
)
def test_bad_bounds_are_refused_with_a_clear_message(spec: dict[str, Any], text: str) -> None:
    assert text in message({"task": "noop", **spec})


def test_a_run_at_no_later_than_start_by_is_accepted_and_a_batch_names_the_bad_spec() -> None:
    validate_spec({"task": "noop", "run_at": SOON.isoformat(), "start_by": SOON.isoformat()})
    validate_spec({"task": "noop", "delay": 5, "start_within_s": 5})
    with pytest.raises(InvalidInput) as info:
        validate_batch(
            {"jobs": [{"task": "noop"}, {"task": "noop", "delay": 9, "start_within_s": 1}]}
        )
    assert info.value.detail[0]["loc"] == ["jobs", 1]  # type: ignore[index]


def job(**fields: Any) -> Job:
    doc = {"_id": "j", "task": "t", "status": "pending", "run_at": T0, "created_at": T0}
    return Job.from_doc({**doc, **fields})


def test_a_task_default_counts_from_the_submit_and_a_job_s_own_bound_wins() -> None:
    defaults = {"t": TaskDeadlines(start_within_s=10, deadline_s=100)}
    plain = job()
    assert next_bound(plain, defaults) == ("start_by_passed", T0 + timedelta(seconds=10))
    assert passed(plain, defaults, T0 + timedelta(seconds=9)) is None
    assert passed(plain, defaults, T0 + timedelta(seconds=10)) == "start_by_passed"
    assert passed(plain, defaults, T0 + timedelta(seconds=100)) == "deadline_exceeded"
    own = job(start_by=T0 + timedelta(seconds=50))
    assert passed(own, defaults, T0 + timedelta(seconds=20)) is None
    assert passed(plain, {}, T0 + timedelta(days=9)) is None


def test_start_by_covers_the_first_start_only() -> None:
    started = job(start_by=T0, first_started_at=T0 - timedelta(seconds=1))
    assert passed(started, {}, T0 + timedelta(hours=1)) is None
    assert next_bound(started, {}) is None
    rerun = dataclasses.replace(started, first_started_at=None, started_at=T0)
    assert passed(rerun, {}, T0 + timedelta(hours=1)) is None


def test_a_task_declares_default_bounds_that_reach_the_dispatchers() -> None:
    @task("deadline_default_unit", start_within_s=30, deadline_s=600)
    def declared(payload: dict[str, Any]) -> None: ...

    @task("deadline_none_unit")
    def undeclared(payload: dict[str, Any]) -> None: ...

    names = ("deadline_default_unit", "deadline_none_unit")
    try:
        assert task_deadlines({n: get_task(n) for n in names}) == {
            "deadline_default_unit": TaskDeadlines(start_within_s=30, deadline_s=600)
        }
    finally:
        for name in names:
            registry._REGISTRY.pop(name)
    with pytest.raises(ValueError, match="'bad_bound': deadline_s must be more than 0"):
        task("bad_bound", deadline_s=0)
