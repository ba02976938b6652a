"""The `interval` task, for fault runs on compose (docker/compose.faults.yaml).

Each attempt appends JSON lines to a log on a volume shared by every dispatcher (host
clock, so the times of different containers compare): `start`, a `tick` every
`TICK_S` while it runs, and `end` when its work is done. An attempt stopped by a kill
leaves no `end`; it ran until at most one tick after its last line. `check_intervals.py`
reads the log and tells whether two attempts of one job ever ran at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from typing import Any

from brook import TaskContext, task

TICK_S = 0.1
LOG = "BROOK_INTERVALS_LOG"  # the log's path (the volume of compose.faults.yaml)


def _write(line: dict[str, Any]) -> None:
    path = os.environ.get(LOG, "/var/log/brook-intervals/intervals.jsonl")
    # One short line per O_APPEND write: lines of concurrent writers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@task("interval")
async def interval(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Work for `seconds` (default 1), logging when this attempt ran."""
    seconds = float(payload.get("seconds", 1.0))
    me = {"job_id": ctx.job_id, "attempt": ctx.attempt, "host": socket.gethostname()}
    start = time.time()
    _write({**me, "event": "start", "t": start, "pid": os.getpid()})
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        await asyncio.sleep(min(TICK_S, left))
        _write({**me, "event": "tick", "t": time.time()})
    finished = time.time()
    _write({**me, "event": "end", "t": finished})
    return {"attempt": ctx.attempt, "start": start, "end": finished}
