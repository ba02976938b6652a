"""The errors a caller sees."""

from __future__ import annotations

from brook.common.domain.errors import InvalidInput


def test_invalid_input_reads_as_one_line() -> None:
    error = InvalidInput([{"loc": ["jobs", 3, "priority"], "msg": "bad", "type": "t"}])
    assert str(error) == "jobs.3.priority: bad"
    assert str(InvalidInput("unknown task 'x'")) == "unknown task 'x'"
