"""The `brook` argument parser: client options follow the API and `brook.common.domain.status`;
queue limits as the CLI reads them."""

from __future__ import annotations

import argparse

import pytest

from brook.cli import build_parser, parse_concurrency, parse_rate
from brook.common.domain.status import JobStatus


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


def test_the_cli_reads_concurrency_and_rate() -> None:
    assert parse_concurrency("3") == 3 and parse_concurrency("none") is None
    assert parse_rate("20/2") == {"limit": 20, "per_seconds": 2.0}
    assert parse_rate("100/60s") == {"limit": 100, "per_seconds": 60.0}
    assert parse_rate("None") is None
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_concurrency(bad)
    for bad in ("20", "x/2", "20/x", "/2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rate(bad)


@pytest.mark.parametrize("command", ["retry", "cancel"])
def test_a_bulk_filters_time_bound_that_is_not_iso_is_named_by_its_option(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(
        [command, "--since", "2026-12-03", "--until", "2026-12-03T10:00:00Z"]
    )
    assert (args.finished_since, args.finished_until) == ("2026-12-03", "2026-12-03T10:00:00Z")
    for option in ("--since", "--until", "--created-since", "--created-until"):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args([command, option, "notadate"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and option in err and "ISO 8601" in err


def test_brook_version_prints_the_installed_version() -> None:
    """The console script the install made, beside this interpreter."""
    import subprocess
    import sys
    from importlib import metadata
    from pathlib import Path

    script = Path(sys.executable).with_name("brook")
    done = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"brook {metadata.version('brook')}\n"


def test_the_package_ships_its_py_typed_marker() -> None:
    """PEP 561: with `py.typed` in the wheel, a user's type checker reads Brook's own types."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in data["package-data"]["brook"]
    assert (root / "brook" / "py.typed").is_file()
