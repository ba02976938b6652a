"""How the CLI shows a job: one line, and a line per change when not a terminal."""

from __future__ import annotations

import io
import re
from typing import Any

from brook.job_view import LineView, describe, job_view


def test_the_cli_describes_a_job_in_one_line() -> None:
    job: dict[str, Any] = {"id": "j1", "status": "running", "progress": None}
    assert describe(job) == "j1 running"
    job["progress"] = {"fraction": 0.4, "message": "step 4/10"}
    assert describe(job) == "j1 running 40% step 4/10"


def test_off_a_terminal_the_cli_prints_a_line_per_change() -> None:
    out = io.StringIO()
    view = job_view(out)
    assert isinstance(view, LineView)
    jobs: list[dict[str, Any]] = [
        {"id": "j1", "status": "pending"},
        {"id": "j1", "status": "running"},
        {"id": "j1", "status": "running"},
        {"id": "j1", "status": "running", "progress": {"fraction": 0.5, "message": None}},
        {"id": "j1", "status": "completed", "progress": {"fraction": 1, "message": "done"}},
    ]
    for job in jobs:
        view.update(job)
    view.close()
    assert out.getvalue().splitlines() == [
        "j1 pending",
        "j1 running",
        "j1 running 50%",
        "j1 completed 100% done",
    ]


class Terminal(io.StringIO):
    """What the CLI writes to a terminal, kept."""

    def isatty(self) -> bool:
        return True


def test_a_jobs_output_goes_between_its_state_lines_each_of_which_starts_a_line() -> None:
    out = io.StringIO()
    view = job_view(out)
    view.update({"id": "j1", "status": "running"})
    view.output("the ans")
    view.update({"id": "j1", "status": "running", "progress": {"fraction": 0.5}})
    view.output("wer\x1b[2J is\n")  # not a terminal: the output goes as it is
    view.output("42")
    view.update({"id": "j1", "status": "completed"})
    view.close()
    assert out.getvalue() == (
        "j1 running\nthe ans\nj1 running 50%\nwer\x1b[2J is\n42\nj1 completed\n"
    )


def test_on_a_terminal_the_output_is_printed_above_the_bar_in_whole_lines_made_safe() -> None:
    out = Terminal()
    view = job_view(out)
    view.update({"id": "j1", "task": "answer", "status": "running"})
    view.output("the answer")
    view.output(" is\x1b]0;pwned\x07 42\nand\tmore")
    view._bar.refresh()  # type: ignore[attr-defined]  # drawn now, not at the next tick
    assert "and\\x09more" in out.getvalue()  # the line being written, beside the bar
    view.update({"id": "j1", "task": "answer", "status": "completed"})
    view.close()
    screen = out.getvalue()
    assert "the answer is\\x1b]0;pwned\\x07 42" in screen  # shown escaped, never obeyed
    assert re.search(r"and\s+more", screen)  # the last line (a tab, expanded), at the close
    assert "\x1b]0;" not in screen and "\x07" not in screen
