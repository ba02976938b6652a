"""The shared job-spec validator, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brook.common.domain.errors import InvalidInput
from brook.common.domain.queues import validate_queue_update
from brook.common.domain.validation import check_document, validate_batch, validate_spec


def detail(data: object, *, batch: bool = False) -> Any:
    with pytest.raises(InvalidInput) as info:
        validate_batch(data) if batch else validate_spec(data)
    return info.value.detail


def test_a_spec_gets_the_contract_defaults() -> None:
    spec = validate_spec({"task": "noop"})
    assert (spec.queue, spec.priority, spec.max_attempts, spec.payload) == ("default", 0, 3, {})
    assert spec.run_at is None and spec.delay_s is None and spec.retention_s is None


def test_run_at_is_normalised_to_utc_milliseconds_and_excludes_delay() -> None:
    spec = validate_spec({"task": "noop", "run_at": "2026-01-01T12:00:00.123456+02:00"})
    assert spec.run_at == datetime(2026, 1, 1, 10, 0, 0, 123000, tzinfo=UTC)
    assert detail({"task": "noop", "run_at": "2026-01-01T00:00:00Z", "delay": 1}) == [
        {"loc": [], "msg": "Value error, give run_at or delay, not both", "type": "value_error"}
    ]


@pytest.mark.parametrize("queue", ["default", "emails", "a.b-c_1", "Q" * 64])
def test_queue_names_may_use_letters_digits_dots_dashes_and_underscores(queue: str) -> None:
    assert validate_spec({"task": "noop", "queue": queue}).queue == queue


@pytest.mark.parametrize("queue", ["", "has space", "a:b", "a,b", "-lead", "Q" * 65, 7])
def test_other_queue_names_are_refused(queue: object) -> None:
    [error] = detail({"task": "noop", "queue": queue})
    assert error["loc"] == ["queue"]


def test_unique_for_s_needs_an_idempotency_key() -> None:
    [error] = detail({"task": "noop", "unique_for_s": 10})
    assert error["msg"] == "Value error, unique_for_s needs an idempotency_key"
    spec = validate_spec({"task": "noop", "unique_for_s": 10, "idempotency_key": "k"})
    assert spec.unique_for_s == 10


def test_depends_on_takes_parent_names_each_once() -> None:
    spec = validate_spec({"task": "noop", "depends_on": ["a", "b", "a"]})
    assert spec.depends_on == ("a", "b") and not spec.run_on_parent_failure
    assert validate_spec({"task": "noop", "depends_on": []}).depends_on == ()
    [error] = detail({"task": "noop", "depends_on": [""]})
    assert error["loc"] == ["depends_on", 0]
    [error] = detail({"task": "noop", "run_on_parent_failure": "yes"})
    assert error["loc"] == ["run_on_parent_failure"]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"n": 2**63}, "payload.n: integer does not fit in 64 bits"),
        ({"when": datetime.now(UTC)}, "payload.when: a datetime is not a JSON value"),
        ({"s": {1, 2}}, "payload.s: a set is not a JSON value"),
        ({1: "x"}, "payload: key 1 is not a string"),
        ({"x": float("nan")}, "payload.x: nan is not a JSON number"),
    ],
)
def test_python_payloads_must_be_json_that_bson_can_store(
    payload: dict[Any, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_document(payload)


def test_tuples_are_json_arrays_and_big_but_valid_ints_pass() -> None:
    check_document({"t": (1, 2), "n": -(2**63), "m": 2**63 - 1, "f": 1.5, "b": True, "z": None})


def test_a_batch_names_the_index_of_each_bad_spec_and_holds_1_to_1000_specs() -> None:
    errors = detail({"jobs": [{"task": "noop"}, {"task": "noop", "priority": "x"}]}, batch=True)
    assert [e["loc"] for e in errors] == [["jobs", 1, "priority"]]
    assert detail({"jobs": [{"task": "noop"}, 5]}, batch=True)[0]["loc"] == ["jobs", 1]
    assert detail({"jobs": []}, batch=True)[0]["loc"] == ["jobs"]
    assert detail({"jobs": [{"task": "noop"}] * 1001}, batch=True)[0]["loc"] == ["jobs"]
    assert detail({"jobs": [], "more": 1}, batch=True)
    assert detail([1], batch=True) == "body must be a JSON object"
    assert len(validate_batch({"jobs": [{"task": "noop"}] * 1000})) == 1000


def test_a_message_about_a_long_key_quotes_it_cut_short() -> None:
    with pytest.raises(ValueError) as info:
        check_document({"k" * 100_000: [{"$x": 1}]})
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("run_at", "message"),
    [
        ("9999-12-31T23:59:59Z", "must be at most 365 days ahead"),
        ("9999-12-31T23:59:59-14:00", "is out of range"),  # was an OverflowError (a 500)
        ("0.5", "must be an ISO-8601 date and time"),  # pydantic read it as 1970 + 0.5 s
    ],
)
def test_run_at_is_bounded_to_a_year_ahead(run_at: str, message: str) -> None:
    [error] = detail({"task": "noop", "run_at": run_at})
    assert error["loc"] == ["run_at"] and message in error["msg"]
    soon = datetime.now(UTC).replace(microsecond=0) + timedelta(days=300)
    assert validate_spec({"task": "noop", "run_at": soon.isoformat()}).run_at == soon


@pytest.mark.parametrize(
    "run_at", ["0001-01-01T00:00:00+14:00", "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z"]
)
def test_a_run_at_before_1970_is_due_now_as_1970(run_at: str) -> None:
    # Past is due; the first of these was an OverflowError (a 500), then a 422.
    spec = validate_spec({"task": "noop", "run_at": run_at})
    assert spec.run_at == datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("name", ["default\n", "a\nb", "default\n\n"])
def test_a_queue_name_with_a_trailing_newline_is_refused_everywhere(name: str) -> None:
    [error] = detail({"task": "noop", "queue": name})
    assert error["loc"] == ["queue"]
    with pytest.raises(InvalidInput):
        validate_queue_update(name, {"paused": True})
