"""What the log says of an attempt's end (`Outcomes.record`'s verdict): one event per
outcome, and why an outcome was not written."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brook.common.domain.status import JobStatus
from brook.common.protocol.runner import RELEASES, Outcome
from brook.common.runtime.log_events import Event, log_event

if TYPE_CHECKING:
    from brook.dispatcher.attempts.outcomes import Verdict, VerdictKind

_REASONS: dict[VerdictKind, tuple[str, str]] = {
    "lost": ("warning", "lease lost: another attempt or owner holds the job"),
    "no_primary": ("error", "could not record before the deadline; the watchdog will requeue it"),
}


def outcome_label(verdict: Verdict, outcome: Outcome) -> str:
    """The `outcome` label of `brook_jobs_total` for an attempt's end."""
    if verdict.kind != "applied":
        return "discarded"
    done = verdict.job
    if done is None or done.status == JobStatus.COMPLETED:
        return "completed"
    if done.status == JobStatus.PENDING:
        if outcome.kind == "suspended":
            return "suspended"
        return "released" if outcome.kind in RELEASES else "retried"
    return done.status.value  # failed, cancelled


def _log_unapplied(verdict: Verdict, outcome: Outcome, fields: dict[str, Any]) -> None:
    """The outcome was not written: why, and what becomes of the job."""
    level, reason = _REASONS.get(verdict.kind, _REASONS["no_primary"])
    if outcome.kind in RELEASES and verdict.kind == "no_primary":
        log_event(
            Event.JOB_RELEASE_FAILED,
            level="warning",
            **fields,
            reason="no primary before the shutdown deadline; the lease expires and the"
            " watchdog requeues it",
        )
        return
    log_event(
        Event.JOB_RESULT_DISCARDED,
        level=level,
        **fields,
        outcome=outcome.kind,
        reason=reason,
    )


def log_outcome(verdict: Verdict, outcome: Outcome, fields: dict[str, Any]) -> None:
    """Say what became of an attempt's end: one log event per outcome."""
    if verdict.kind != "applied":
        _log_unapplied(verdict, outcome, fields)
        return
    done = verdict.job
    if done is None or done.status == JobStatus.COMPLETED:
        log_event(Event.JOB_COMPLETED, **fields)
    elif done.status == JobStatus.CANCELLED:
        error_type = (done.error or {}).get("type")
        log_event(
            Event.JOB_CANCELLED, **fields, **({"error_type": error_type} if error_type else {})
        )
    elif outcome.kind == "suspended" and done.status == JobStatus.PENDING:
        waiting = done.waiting_for or {}
        until = waiting.get("until")
        log_event(
            Event.JOB_SUSPENDED,
            **fields,
            waiting=waiting.get("kind"),
            key=waiting.get("key"),
            step=waiting.get("step"),
            until=until.isoformat() if until is not None else None,
        )
    elif outcome.kind == "shutdown":
        log_event(Event.JOB_RELEASED, **fields, reason="dispatcher shutting down")
    elif outcome.kind == "handed_back":
        log_event(
            Event.JOB_RELEASED,
            **fields,
            reason="no worker free soon enough after its claim for its queue's rate",
        )
    elif done.status == JobStatus.PENDING:
        log_event(
            Event.JOB_RETRY_SCHEDULED,
            level="warning",
            **fields,
            error_type=(done.error or {}).get("type"),
            run_at=done.run_at.isoformat(),
            max_attempts=done.max_attempts,
        )
    else:
        log_event(
            Event.JOB_FAILED,
            level="error",
            **fields,
            error_type=(done.error or {}).get("type"),
            error_message=(done.error or {}).get("message"),
        )
