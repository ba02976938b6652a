"""The HTTP edge's validation: body depth, payload keys, numbers, and the same validator as
the Python client."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from brook.common.domain.errors import InvalidInput
from brook.common.domain.validation import check_document
from brook.ingest.validation import body_depth, parse_batch, parse_submit


def test_body_depth_counts_brackets_outside_strings() -> None:
    assert body_depth(b'{"a": [1, {"b": "[[[[{{{"}]}') == 3
    assert body_depth(b'"[[["') == 0
    assert body_depth(b'{"a": "\\"[[["}') == 1


@pytest.mark.parametrize(
    "payload",
    [{"$x": 1}, {"a": [{"$b": 1}]}, {"a\x00": 1}],
)
def test_payload_keys_that_mongodb_would_misread_are_rejected(payload: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        check_document(payload)


def test_payload_values_may_look_like_operators() -> None:
    check_document({"a": "$notAnOperator", "b": ["$x"]})


def test_nesting_of_32_is_accepted_and_33_rejected() -> None:
    def nest(n: int) -> dict[str, object]:
        d: dict[str, object] = {}
        for _ in range(n - 1):
            d = {"a": d}
        return d

    check_document(nest(32))
    with pytest.raises(ValueError, match="nesting deeper than 32"):
        check_document(nest(33))


def test_parse_submit_applies_defaults_and_normalises_run_at_to_utc() -> None:
    job = parse_submit(b'{"task": "noop", "run_at": "2026-01-01T12:00:00.123456+02:00"}')
    assert job.payload == {} and job.priority == 0 and job.max_attempts == 3
    assert job.run_at is not None and job.run_at.isoformat() == "2026-01-01T10:00:00.123000+00:00"
    with pytest.raises(InvalidInput):
        parse_submit(b'{"task": "noop", "max_attempts": "3"}')


@pytest.mark.parametrize(
    "body",
    [
        b'{"task": "noop", "payload": {"n": 18446744073709551616}}',
        b'{"task": "noop", "payload": {"n": [-9223372036854775809]}}',
        b'{"task": "noop", "payload": {"n": NaN}}',
        b'{"task": "noop", "payload": {"n": -Infinity}}',
    ],
)
def test_numbers_bson_or_json_cannot_hold_are_refused_at_the_edge(body: bytes) -> None:
    with pytest.raises(InvalidInput):
        parse_submit(body)


def test_the_widest_64_bit_integers_are_accepted() -> None:
    body = b'{"task": "noop", "payload": {"lo": -9223372036854775808, "hi": 9223372036854775807}}'
    assert parse_submit(body).payload == {"lo": -(2**63), "hi": 2**63 - 1}


def test_http_bodies_are_judged_by_the_same_validator() -> None:
    assert parse_submit(b'{"task": "noop", "queue": "q"}').queue == "q"
    assert [s.task for s in parse_batch(b'{"jobs": [{"task": "a"}, {"task": "b"}]}')] == ["a", "b"]
    deep = b'{"task": "noop", "payload": ' + b'{"a": ' * 33 + b"1" + b"}" * 33 + b"}"
    with pytest.raises(InvalidInput) as info:
        parse_submit(deep)
    assert "payload.a" in str(info.value) and "nesting deeper than 32" in str(info.value)
    with pytest.raises(InvalidInput, match="body: nesting deeper than 32"):
        parse_submit(b"[" * 5000 + b"]" * 5000)


def test_body_depth_is_linear_in_escapes_and_unterminated_strings() -> None:
    # A regex over strings rescanned to the end from every quote: minutes for this body.
    hostile = b'["' + b'\\"' * 300_000
    assert body_depth(hostile) == 1
    with pytest.raises(InvalidInput):
        parse_submit(hostile)
    assert body_depth(b'["\\\\", [["x"]]]') == 3  # an escaped backslash ends no string
    assert body_depth(b'["\\\\\\"[", [["x"]]]') == 3
    assert body_depth(b"[" * 70_000 + b"]" * 70_000) > 128  # counted across chunks
    assert body_depth(b"[]" * 70_000 + b"[[[]]]") == 3
    # Linear, measured: this process's CPU time for 4x the input is under 6x (a quadratic
    # path gives about 16x); a ratio within one run, so a busy machine moves both alike.
    for shape in (b'["' + b'\\"' * 50_000, b'["' + b"x" * 100_000):

        def depth_of(n: int, shape: bytes = shape) -> object:
            return body_depth(shape * n)

        assert cpu_ratio(depth_of, 1, 4) < 6, shape[:8]


def cpu_ratio(run: Callable[[int], object], small: int, large: int) -> float:
    """CPU time of `run(large)` over `run(small)`, each repeated until the small one took at
    least 0.05 s, the median of three tries."""
    repeat, started = 1, time.process_time()
    while time.process_time() - started < 0.05:
        repeat *= 2
        started = time.process_time()
        for _ in range(repeat):
            run(small)
    ratios = []
    for _ in range(3):
        costs = []
        for size in (small, large):
            started = time.process_time()
            for _ in range(repeat):
                run(size)
            costs.append(time.process_time() - started)
        ratios.append(costs[1] / costs[0])
    return sorted(ratios)[1]


def test_a_body_of_too_many_values_is_refused_before_parsing() -> None:
    body = b'{"task": "noop", "payload": {"a": [' + b"1," * 100_000 + b"1]}}"
    with pytest.raises(InvalidInput, match="more than 100000 values"):
        parse_submit(body)
    assert parse_submit(b'{"task": "noop", "payload": {"s": "' + b"," * 200_000 + b'"}}')
