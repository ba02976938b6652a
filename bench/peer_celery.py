"""Celery's side of the `waits` scenario: Redis broker on 6390, the thread pool
(`celery -A bench.peer_celery worker -P threads -c 200`, from the peers' `venv`)."""

from __future__ import annotations

import time

import redis
from celery import Celery

from bench.waits_work import work_sync

BROKER = "redis://127.0.0.1:6390/8"
SIDE_URL = "redis://127.0.0.1:6390/9"
KEY = "waits:done"

app = Celery("peer_celery", broker=BROKER)
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
side = redis.Redis.from_url(SIDE_URL)


@app.task(name="wait")  # type: ignore[untyped-decorator]
def wait(mode: str, seconds: float, url: str) -> int:
    start = time.time()
    try:
        tokens = work_sync(mode, seconds, url)
    except Exception:  # recorded as failed (-1): the driver counts it, does not wait for it
        tokens = -1
    side.rpush(KEY, f"{start!r} {time.time()!r} {tokens}")
    return tokens
