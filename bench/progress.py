"""What `ctx.progress(...)` costs a task: calls per second through the real reporter and a
real pipe (the dispatcher's end drained by another process), and how many reports cross it.

    .venv/bin/python -m bench.progress [--seconds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from multiprocessing.connection import Connection

from brook.common.protocol.runner import RunJob
from brook.executor.progress import INTERVAL_S, ProgressReporter


def _drain(conn: Connection) -> None:
    received = 0
    while True:
        msg = conn.recv()
        if msg == "done":
            conn.send(received)
            return
        received += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    ours, theirs = multiprocessing.get_context("spawn").Pipe(duplex=True)
    drainer = multiprocessing.get_context("spawn").Process(target=_drain, args=(theirs,))
    drainer.start()
    job = RunJob(job_id="bench", attempt=1, task="bench", payload={})
    reporter = ProgressReporter(ours.send, job)
    calls = 0
    start = time.perf_counter()
    deadline = start + args.seconds
    while (now := time.perf_counter()) < deadline:
        calls += 1
        reporter.report(0.5, f"call {calls}")
    elapsed = now - start
    reporter.close()
    ours.send("done")
    received = ours.recv()
    drainer.join()
    print(
        f"{calls / elapsed:,.0f} ctx.progress calls/s ({elapsed / calls * 1e6:.2f} µs each); "
        f"{received} reports crossed the pipe in {elapsed:.1f} s "
        f"(interval {INTERVAL_S} s: at most {int(elapsed / INTERVAL_S) + 2})"
    )


if __name__ == "__main__":
    main()
