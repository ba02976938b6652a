"""Read the `interval` task's log; report attempts of one job that ran at the same time.

    python3 docker/faults/check_intervals.py PATH/intervals.jsonl

An attempt ran from its `start` line to its `end` line, or, when it was killed, until at
most one tick (`TICK_S`) after its last line. Exit status 1 when two attempts of one job
overlap; a summary on stdout. Work done again by a later attempt (an attempt whose work
ended but whose completion could not be written, a primary lost say, is retried: Brook runs
a job at least once) is counted, not an error: running at the same time is.
Standard library only, so it runs on any host.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICK_S = 0.1


@dataclass
class Attempt:
    job_id: str
    attempt: int
    host: str
    start: float
    last: float
    ended: bool = False

    @property
    def until(self) -> float:
        """The latest moment this attempt may have been running."""
        return self.last if self.ended else self.last + TICK_S


@dataclass
class Report:
    attempts: dict[str, list[Attempt]] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)
    done_again: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return self.overlaps

    def summary(self) -> dict[str, Any]:
        all_attempts = [a for runs in self.attempts.values() for a in runs]
        return {
            "jobs": len(self.attempts),
            "attempts": len(all_attempts),
            "killed_attempts": sum(1 for a in all_attempts if not a.ended),
            "jobs_done": sum(1 for runs in self.attempts.values() if any(a.ended for a in runs)),
            "overlaps": len(self.overlaps),
            "work_done_again": len(self.done_again),
        }


def read(path: Path) -> Report:
    attempts: dict[tuple[str, int], Attempt] = {}
    for raw in path.read_text().splitlines():
        if not raw.strip():
            continue
        line = json.loads(raw)
        key = (str(line["job_id"]), int(line["attempt"]))
        t = float(line["t"])
        a = attempts.get(key)
        if a is None:
            a = attempts[key] = Attempt(key[0], key[1], str(line.get("host")), t, t)
        if line["event"] == "start":
            a.start = min(a.start, t)
        a.last = max(a.last, t)
        a.ended = a.ended or line["event"] == "end"
    report = Report()
    by_job: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts.values():
        by_job[a.job_id].append(a)
    for job_id, runs in by_job.items():
        runs.sort(key=lambda a: a.start)
        report.attempts[job_id] = runs
        for before, after in itertools.pairwise(runs):
            if after.start <= before.until:
                report.overlaps.append(
                    f"{job_id}: attempt {after.attempt} on {after.host} started at"
                    f" {after.start:.3f}, attempt {before.attempt} on {before.host} ran until"
                    f" {before.until:.3f}"
                )
        ends = [a.attempt for a in runs if a.ended]
        if len(ends) > 1:
            report.done_again.append(f"{job_id}: the work of attempts {ends} all ended")
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    report = read(Path(argv[1]))
    print(json.dumps(report.summary()))
    for problem in report.problems():
        print(problem)
    return 1 if report.problems() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
