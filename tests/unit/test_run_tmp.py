"""The session-end check of tests/support/run_tmp.py, on a stand-in system temp dir: what a
passing run left there fails it when it is the run's own, and never what another program
made."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import run_tmp


def _run(tmp_path: Path) -> run_tmp.RunTmp:
    system = tmp_path / "system"
    (system / "old-thing").mkdir(parents=True)
    mine = tmp_path / "run"
    mine.mkdir()
    return run_tmp.RunTmp(
        path=mine, system=system, ports=range(30317, 30617), before={"old-thing"}
    )


def test_a_clean_run_removes_its_folder_and_has_nothing_to_say(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run.path / "pymp-abc").mkdir()
    (run.system / "bash_job_1").write_text("another program's")
    run_tmp.finish(run, strict=True)
    assert not run.path.exists()
    assert run.problems == [] and run.notes == []


def test_a_mongodb_socket_of_the_runs_ports_fails_it_anothers_does_not(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run.system / "mongodb-30499.sock").touch()
    (run.system / "mongodb-27017.sock").touch()  # not one of the run's ports
    run_tmp.finish(run, strict=False)
    assert [p.split(":")[0] for p in run.problems] == [str(run.system / "mongodb-30499.sock")]
    assert run.notes == [str(run.system / "mongodb-27017.sock")]


def test_the_names_the_runs_tools_make_fail_it_only_when_strict(tmp_path: Path) -> None:
    names = ["pymp-x1", "pytest-of-root", "org.chromium.Chromium.Ab12", "pip-build-1"]
    for strict in (False, True):
        run = _run(tmp_path / str(strict))
        for name in names:
            (run.system / name).mkdir()
        run_tmp.finish(run, strict=strict)
        listed = run.problems if strict else run.notes
        assert sorted(line.split(":")[0] for line in listed) == sorted(
            str(run.system / n) for n in names
        )
        assert (run.notes if strict else run.problems) == []


def test_a_later_run_removes_ended_runs_folders_not_one_still_going_on(tmp_path: Path) -> None:
    home = tmp_path / ".brook" / "tmp"
    going_on = home / f"run-30317-{os.getpid()}"
    gone = home / "run-30317-999999999"  # above any pid: a run that has ended
    for folder in (going_on, gone):
        folder.mkdir(parents=True)
    run_tmp._remove_finished_runs(home)
    assert going_on.exists() and not gone.exists()
