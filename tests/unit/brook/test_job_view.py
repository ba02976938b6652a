"""How the CLI shows a job: one line, and a line per change when not a terminal."""

from __future__ import annotations

import io
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
