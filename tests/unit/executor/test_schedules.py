"""Schedules declared in task modules: an unknown task, a name declared twice."""

from __future__ import annotations

import pytest

from brook.common.domain.errors import ConfigError
from brook.executor.schedules import declared_schedules, schedule


def test_a_schedule_naming_an_unknown_task_is_one_config_error_line() -> None:
    schedule("unit-unknown-task", "* * * * *", task="no-such-task")
    try:
        with pytest.raises(ConfigError) as info:
            declared_schedules({"noop", "echo"})
        message = str(info.value)
        assert message == (
            "schedule 'unit-unknown-task' names unknown task 'no-such-task'; "
            "known tasks: echo, noop"
        )
    finally:
        from brook.executor import schedules as registry

        registry._SCHEDULES.pop("unit-unknown-task")


def test_declaring_the_same_name_twice_differently_is_refused() -> None:
    schedule("unit-twice", "* * * * *", task="noop")
    try:
        schedule("unit-twice", "* * * * *", task="noop")  # the same again: a re-import
        with pytest.raises(ValueError, match="already declared"):
            schedule("unit-twice", "0 * * * *", task="noop")
    finally:
        from brook.executor import schedules as registry

        registry._SCHEDULES.pop("unit-twice")
