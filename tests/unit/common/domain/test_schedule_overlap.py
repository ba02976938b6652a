"""Schedule overlap, without a database: the decision a tick takes from its previous run's
status under each policy, and a bad policy refused at the declaration."""

from __future__ import annotations

import pytest

from brook.common.domain.schedules import Schedule, tick_decision
from brook.common.domain.status import ACTIVE, JobStatus

UNFINISHED = sorted(s.value for s in ACTIVE)


@pytest.mark.parametrize("overlap", ["allow", "skip", "buffer_one", "cancel_other"])
def test_a_tick_after_an_ended_run_or_none_makes_a_job_under_every_policy(overlap: str) -> None:
    assert tick_decision(overlap, None) == "run"


@pytest.mark.parametrize("previous", UNFINISHED)
def test_each_policy_decides_while_the_previous_run_is_unfinished(previous: str) -> None:
    assert tick_decision("allow", previous) == "run"
    assert tick_decision("skip", previous) == "skip"
    assert tick_decision("cancel_other", previous) == "replace"
    # buffer_one: one waits for the running one; a second finds it waiting and is skipped.
    buffered = "skip" if previous == JobStatus.WAITING.value else "buffer"
    assert tick_decision("buffer_one", previous) == buffered


def test_the_overlap_policy_is_checked_and_kept_in_the_definition() -> None:
    s = Schedule.declare("s1", "* * * * *", task="noop", overlap="skip")
    assert s.definition()["overlap"] == "skip"
    assert Schedule.declare("s2", "* * * * *", task="noop").overlap == "allow"
    with pytest.raises(ValueError, match="schedule 's3': overlap must be one of allow, skip"):
        Schedule.declare("s3", "* * * * *", task="noop", overlap="queue")
