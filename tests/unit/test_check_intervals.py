"""The fault runs' interval checker (docker/faults/check_intervals.py), on logs written here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    path = ROOT / "docker" / "faults" / "check_intervals.py"
    spec = importlib.util.spec_from_file_location("check_intervals", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


check = _checker()


def _log(tmp_path: Path, *lines: tuple[str, int, str, str, float]) -> Path:
    path = tmp_path / "intervals.jsonl"
    rows: list[dict[str, Any]] = [
        {"job_id": j, "attempt": a, "host": h, "event": e, "t": t} for j, a, h, e, t in lines
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_killed_attempt_counts_as_running_one_tick_past_its_last_line(tmp_path: Path) -> None:
    path = _log(
        tmp_path,
        ("a", 1, "d1", "start", 10.0),
        ("a", 1, "d1", "tick", 10.1),  # killed after this: ran until 10.2 at most
        ("a", 2, "d2", "start", 10.15),
        ("a", 2, "d2", "end", 11.0),
        ("b", 1, "d1", "start", 10.0),
        ("b", 1, "d1", "tick", 10.1),
        ("b", 2, "d2", "start", 10.3),
        ("b", 2, "d2", "end", 11.0),
    )
    report = check.read(path)
    assert [p.split(":")[0] for p in report.problems()] == ["a"]
    assert report.summary()["killed_attempts"] == 2
    assert check.main(["check_intervals.py", str(path)]) == 1


def test_work_done_again_after_a_lost_completion_is_counted_not_an_overlap(tmp_path: Path) -> None:
    path = _log(
        tmp_path,
        ("a", 1, "d1", "start", 10.0),
        ("a", 1, "d1", "end", 10.5),
        ("a", 2, "d2", "start", 16.0),
        ("a", 2, "d2", "end", 16.5),
    )
    report = check.read(path)
    assert report.problems() == [] and report.summary()["work_done_again"] == 1
    assert check.main(["check_intervals.py", str(path)]) == 0
