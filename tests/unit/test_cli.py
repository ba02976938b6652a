"""The `brook` argument parser: client options follow the API and `common.domain.status`."""

from __future__ import annotations

import pytest

from brook.cli import build_parser
from common.domain.status import JobStatus


def test_ls_takes_the_cursor_the_more_hint_names() -> None:
    args = build_parser().parse_args(["ls", "--limit", "2", "--after", "abc123"])
    assert (args.limit, args.after) == (2, "abc123")
    assert build_parser().parse_args(["ls"]).after is None


@pytest.mark.parametrize("status", [s.value for s in JobStatus])
def test_ls_accepts_every_job_status(status: str) -> None:
    assert build_parser().parse_args(["ls", "--status", status]).status == status


def test_ls_refuses_a_status_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["ls", "--status", "bogus"])
    assert info.value.code == 2 and "invalid choice" in capsys.readouterr().err
