"""Task options in the declaration: `shared=`."""

from __future__ import annotations

from typing import Any

import pytest

from brook.common.domain.errors import ConfigError
from brook.common.runtime.settings import Settings
from brook.executor import registry
from brook.executor.registry import load_tasks, shared_tasks, task


def test_an_async_task_declares_how_many_of_its_jobs_share_a_process() -> None:
    @task("unit-shared", shared=7)
    async def shared(payload: dict[str, Any]) -> None:
        return None

    try:
        assert registry.get_task("unit-shared").shared == 7
        assert shared_tasks(registry._REGISTRY)["unit-shared"] == 7
        assert "noop" not in shared_tasks(registry._REGISTRY)
    finally:
        registry._REGISTRY.pop("unit-shared")


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_a_shared_count_that_is_not_a_whole_number_of_at_least_one_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="shared= must be a whole number of at least 1"):
        task("unit-bad", shared=bad)


def test_shared_on_a_plain_def_task_fails_its_modules_import_with_a_clear_message() -> None:
    settings = Settings(tasks="tests.tasks.shared_plain_def", demo_tasks=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        load_tasks(settings)
    message = str(info.value)
    assert "tests.tasks.shared_plain_def" in message
    assert "task 'shared_plain': shared= needs an `async def` task" in message
    assert "shared_plain" not in registry._REGISTRY
