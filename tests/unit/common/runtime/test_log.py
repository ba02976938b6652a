"""The log lines' format: one JSON object a line, times as ISO 8601."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import structlog

from brook.common.runtime.log import configure_logging


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    # configure_logging points the root logger at this test's captured stdout: put back
    # what the run had, for the tests after this one.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    config = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)
    structlog.contextvars.clear_contextvars()


def test_a_time_given_to_a_log_line_is_written_as_iso_8601_not_as_its_repr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("INFO", role="test")
    at = datetime(2026, 12, 5, 8, 31, 17, 397628, tzinfo=UTC)
    structlog.get_logger().info("quota.held", until=at, other=object())
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["until"] == "2026-12-05T08:31:17.397628+00:00"
    assert line["other"].startswith("<object object")
