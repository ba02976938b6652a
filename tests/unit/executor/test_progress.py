"""Progress in the worker: checked, coalesced, and held while the task's transaction is open."""

from __future__ import annotations

import math
import threading
import time

import pytest

from brook.common.protocol.runner import ProgressReport, RunJob
from brook.executor.progress import ProgressReporter, check_progress
from tests.support.procs import wait_until

JOB = RunJob(job_id="j1", attempt=2, task="t", payload={})


class Sent:
    def __init__(self) -> None:
        self.reports: list[ProgressReport] = []
        self.lock = threading.Lock()

    def __call__(self, report: ProgressReport) -> None:
        with self.lock:
            self.reports.append(report)

    def fractions(self) -> list[float]:
        with self.lock:
            return [r.fraction for r in self.reports]


@pytest.mark.parametrize(
    ("fraction", "message", "error"),
    [
        (1.5, None, ValueError),
        (-0.1, None, ValueError),
        (math.nan, None, ValueError),
        (True, None, TypeError),
        ("0.5", None, TypeError),
        (0.5, 3, TypeError),
    ],
)
def test_a_bad_progress_call_raises(fraction: object, message: object, error: type) -> None:
    with pytest.raises(error):
        check_progress(fraction, message)  # type: ignore[arg-type]


def test_progress_bounds_and_long_messages() -> None:
    assert check_progress(0, None) == (0.0, None)
    assert check_progress(1, "done") == (1.0, "done")
    assert check_progress(0.5, "x" * 5000)[1] == "x" * 1000


def test_the_first_report_goes_at_once_and_a_burst_is_coalesced_to_the_newest() -> None:
    sent = Sent()
    reporter = ProgressReporter(sent, JOB, interval=0.2)
    for i in range(1, 101):
        reporter.report(i / 100, f"step {i}")
    assert sent.fractions() == [0.01]  # the rest wait for the interval
    wait_until(lambda: len(sent.fractions()) == 2, timeout=5)  # the trailing send, by timer
    assert sent.reports[-1] == ProgressReport(
        job_id="j1", attempt=2, task="t", fraction=1.0, message="step 100"
    )
    reporter.close()
    assert len(sent.fractions()) == 2  # nothing was pending


def test_reporting_nonstop_sends_one_report_per_interval() -> None:
    sent = Sent()
    reporter = ProgressReporter(sent, JOB, interval=0.1)
    deadline = time.monotonic() + 1.0
    calls = 0
    while time.monotonic() < deadline:
        calls += 1
        reporter.report(0.5, f"call {calls}")
    reporter.close()
    assert 5 <= len(sent.fractions()) <= 12  # however many calls: one per 0.1 s, plus the last


def test_closing_sends_what_is_pending_and_later_reports_are_ignored() -> None:
    sent = Sent()
    reporter = ProgressReporter(sent, JOB, interval=60)
    reporter.report(0.1)
    reporter.report(0.9, "almost")
    assert sent.fractions() == [0.1]
    reporter.close()
    assert sent.fractions() == [0.1, 0.9]
    reporter.report(1.0)
    assert sent.fractions() == [0.1, 0.9]


def test_a_report_from_another_thread_is_sent_too() -> None:
    sent = Sent()
    reporter = ProgressReporter(sent, JOB, interval=0.01)
    thread = threading.Thread(target=lambda: reporter.report(0.3))
    thread.start()
    thread.join()
    reporter.close()
    assert sent.fractions() == [0.3]


def test_progress_is_held_while_a_transaction_is_open_and_goes_with_the_completion() -> None:
    sent: list[ProgressReport] = []
    job = RunJob(job_id="j", attempt=3, task="t", payload={})
    reporter = ProgressReporter(sent.append, job, interval=0.0)
    reporter.report(0.1)
    assert [r.fraction for r in sent] == [0.1]
    reporter.hold()
    reporter.report(0.5, "half")
    reporter.report(0.7, "more")
    assert [r.fraction for r in sent] == [0.1]
    assert reporter.take_last() == {"fraction": 0.7, "message": "more", "attempt": 3}
    reporter.close()
    assert [r.fraction for r in sent] == [0.1]


def test_held_progress_is_sent_when_the_transaction_ends_without_the_completion() -> None:
    sent: list[ProgressReport] = []
    reporter = ProgressReporter(sent.append, RunJob(job_id="j", attempt=1, task="t", payload={}))
    reporter.hold()
    reporter.report(0.4)
    reporter.release()
    assert [r.fraction for r in sent] == [0.4]
    reporter.close()
