"""The `jobcost` scenario's submitter for `--via client`: a process of its own, run by the
Python of the checkout being measured, that submits jobs with that checkout's
`brook.Client.submit`, so its CPU is the client's and no role's.

    PYTHON -P bench/jobcost_submit.py --rate 50 --task noop

It reads `BROOK_MONGO_URI` and `BROOK_DB` as `Client()` does, prints `{"ready": true}`
once connected (or `{"error": ...}` and exits 3 if the checkout has no `brook.Client`),
then serves one command a line on stdin: `PHASE N` submits N jobs at `--rate` jobs/s, open
loop (submission i leaves at t0 + i/rate whatever earlier ones do, from a pool of threads),
each with the payload `{"bench": PHASE}`, and prints one JSON line of what it saw; `quit`
or the end of stdin closes the client. It imports nothing from `bench`: the other
checkout has no such package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

THREADS = 32  # submits in flight at most: far above rate x round trip at the rates used


def _one(client: Any, task: str, phase: str, scheduled: float) -> tuple[float, float, str]:
    """(lag ms, round trip ms, "ok" or the error's type) of one `Client.submit`."""
    start = time.monotonic()
    try:
        client.submit(task, {"bench": phase})
        outcome = "ok"
    except Exception as exc:  # reported, counted: the harness decides what a failure means
        outcome = type(exc).__name__
    return (start - scheduled) * 1000, (time.monotonic() - start) * 1000, outcome


def open_loop(client: Any, task: str, phase: str, n: int, rate: float) -> dict[str, Any]:
    """Submit `n` jobs on the schedule t0 + i/rate; what each submit took, once all ended."""
    futures: list[Future[tuple[float, float, str]]] = []
    sends: list[float] = []
    with ThreadPoolExecutor(THREADS, thread_name_prefix="submit") as pool:
        t0 = time.monotonic() + 0.05
        for i in range(n):
            at = t0 + i / rate
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sends.append(time.monotonic())
            futures.append(pool.submit(_one, client, task, phase, at))
        results = [f.result() for f in futures]
    errors: dict[str, int] = {}
    for _, _, outcome in results:
        if outcome != "ok":
            errors[outcome] = errors.get(outcome, 0) + 1
    return {
        "phase": phase,
        "sent": n,
        "ok": n - sum(errors.values()),
        "errors": errors,
        "send_span_s": sends[-1] - sends[0] if sends else 0.0,
        "lag_ms": [round(r[0], 3) for r in results],
        "rtt_ms": [round(r[1], 3) for r in results],
    }


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--task", default="noop")
    args = p.parse_args()
    try:
        from brook import Client  # type: ignore[attr-defined, unused-ignore]
    except ImportError as exc:
        _emit({"error": f"this checkout has no brook.Client ({exc})"})
        return 3
    client = Client()
    try:
        _emit({"ready": True})
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            _emit(open_loop(client, args.task, words[0], int(words[1]), args.rate))
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
