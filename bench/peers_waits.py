"""The peers' side of the `waits` scenario, run by `bench/waits.py` under each peer's own
virtualenv (`$PEERS_HOME/venv-arq` for arq, `$PEERS_HOME/venv` for Celery):

    python -m bench.peers_waits arq|celery --jobs 1000 --seconds 2 --mode sleep|stream [--url U]

Starts the worker (arq: one process, `max_jobs=1000`; Celery: thread pool `-c 200`, Redis
broker on 6390), waits for a warm-up job, then enqueues `--jobs` jobs through the system's
one-job API (arq: `enqueue_job`, 100 at a time concurrently; Celery: `delay()` in a loop) and
waits until each has recorded its finish in a side-channel list (Redis db 9; a job whose
work raised records -1 tokens and counts as failed). Prints one JSON
object: wall from the first enqueue to the last finish, the worker tree's idle and peak PSS
and CPU-ms per job (`bench.procmeter`). Redis dbs 7-9 of port 6390 are its own (flushed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench.procmeter import TreeMeter, per_job, wait_until

ROOT = Path(__file__).resolve().parents[1]
SIDE_URL = "redis://127.0.0.1:6390/9"
KEY = "waits:done"


def _worker(system: str, log: Path) -> subprocess.Popen[bytes]:
    bindir = Path(sys.executable).parent
    if system == "arq":
        cmd = [str(bindir / "arq"), "bench.peer_arq.WorkerSettings"]
    else:
        cmd = [
            str(bindir / "celery"), "-A", "bench.peer_celery", "worker",
            "-P", "threads", "-c", "200", "--loglevel", "warning",
        ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _enqueue(system: str, jobs: int, args: tuple[str, float, str]) -> None:
    if system == "celery":
        from bench.peer_celery import wait

        for _ in range(jobs):
            wait.delay(*args)
        return

    async def arq_enqueue() -> None:
        from arq import create_pool

        from bench.peer_arq import REDIS

        pool = await create_pool(REDIS)
        try:
            for first in range(0, jobs, 100):
                n = min(100, jobs - first)
                await asyncio.gather(*(pool.enqueue_job("wait", *args) for _ in range(n)))
        finally:
            await pool.aclose()

    asyncio.run(arq_enqueue())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run(system: str, jobs: int, seconds: float, mode: str, url: str, log: Path) -> dict[str, Any]:
    for db in (7, 8, 9):
        redis.Redis(host="127.0.0.1", port=6390, db=db).flushdb()
    side = redis.Redis.from_url(SIDE_URL)
    proc = _worker(system, log)
    meter = TreeMeter(proc.pid).start()
    try:
        _enqueue(system, 1, ("sleep", 0.0, url))  # warm-up: the worker is up and consuming
        wait_until(lambda: side.llen(KEY) >= 1 or proc.poll() is not None, 60, "warm-up job")
        if proc.poll() is not None:
            raise RuntimeError(f"{system} worker exited: {log.read_text()[-2000:]}")
        side.delete(KEY)
        time.sleep(1.0)  # idle PSS after the warm-up
        meter.mark()
        t0 = time.time()
        _enqueue(system, jobs, (mode, seconds, url))
        enqueued = time.time() - t0
        wait_until(lambda: side.llen(KEY) >= jobs, 120 + 4 * seconds * jobs / 200, "all jobs")
        figs = per_job(meter.stop(), jobs)
    finally:
        _stop(proc)
    entries = side.lrange(KEY, 0, -1)
    rows = [(e.decode() if isinstance(e, bytes) else e).split() for e in entries]
    ends = [float(r[1]) for r in rows]
    starts = [float(r[0]) for r in rows]
    tokens = [int(r[2]) for r in rows if int(r[2]) >= 0]
    return {
        "system": system,
        "mode": mode,
        "jobs": jobs,
        "finished": len(tokens),
        "failed": len(rows) - len(tokens),
        "seconds": seconds,
        "wall_s": round(max(ends) - t0, 3),
        "enqueue_s": round(enqueued, 3),
        "first_start_s": round(min(starts) - t0, 3),
        "tokens_min": min(tokens, default=0),
        **figs,
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers_waits")
    p.add_argument("system", choices=["arq", "celery"])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--mode", choices=["sleep", "stream"], default="sleep")
    p.add_argument("--url", default="")
    p.add_argument("--log", default="/tmp/peers_waits.log")
    a = p.parse_args()
    out = run(a.system, a.jobs, a.seconds, a.mode, a.url, Path(a.log))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
