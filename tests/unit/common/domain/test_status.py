"""The status table: active and terminal statuses, and the transitions between them."""

from __future__ import annotations

from brook.common.domain.status import ACTIVE, ALLOWED, RETRIES, TERMINAL, TRANSITIONS, JobStatus


def test_statuses_split_into_active_and_terminal_and_terminal_is_final() -> None:
    assert set(JobStatus) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert not any(src in TERMINAL for src, _ in TRANSITIONS)


def test_waiting_is_an_active_status_that_leads_only_to_pending_cancelled_or_failed() -> None:
    assert JobStatus.WAITING in ACTIVE and JobStatus.WAITING not in TERMINAL
    assert {dst for src, dst in TRANSITIONS if src == JobStatus.WAITING} == {
        JobStatus.PENDING,
        JobStatus.CANCELLED,
        JobStatus.FAILED,  # its deadline passed
    }
    assert not any(dst == JobStatus.WAITING for _, dst in TRANSITIONS)  # a job starts there


def test_only_a_retry_leaves_a_terminal_status_and_only_for_failed_or_cancelled() -> None:
    assert not any(src in TERMINAL for src, _ in TRANSITIONS)
    assert {
        (JobStatus.FAILED, JobStatus.PENDING),
        (JobStatus.CANCELLED, JobStatus.PENDING),
        (JobStatus.FAILED, JobStatus.WAITING),  # a workflow job whose parents did not complete
        (JobStatus.CANCELLED, JobStatus.WAITING),
    } == RETRIES
    assert ALLOWED == TRANSITIONS | RETRIES
