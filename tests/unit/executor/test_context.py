"""What a task's context shows of the worker's settings."""

from __future__ import annotations

import asyncio

from brook.common.runtime.settings import Settings
from brook.executor.context import SyncTaskContext, TaskContext

URI = "mongodb://brook:s3cret@m1:27017/?replicaSet=rs0"


def test_a_task_sees_the_settings_without_the_mongodb_password() -> None:
    loop = asyncio.new_event_loop()
    try:
        contexts = [
            TaskContext(job_id="j", attempt=1, task="noop", process_settings=Settings(mongo_uri=URI)),
            SyncTaskContext(
                job_id="j", attempt=1, task="noop", process_settings=Settings(mongo_uri=URI), loop=loop
            ),
        ]
        for ctx in contexts:
            assert ctx.settings.mongo_uri == "mongodb://brook:***@m1:27017/?replicaSet=rs0"
            assert ctx.settings.db == "brook"
            assert "s3cret" not in repr(ctx)
    finally:
        loop.close()
