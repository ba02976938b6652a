"""The quota benchmark: three dispatchers spend a model API's tokens-per-minute limit.

    .venv/bin/python -m bench.quotas --tpm 400000 --mode quota    # a quota of U = tpm
    .venv/bin/python -m bench.quotas --tpm 400000 --mode halve    # the provider halves its
                                                                  # limit midway, telling no one
    .venv/bin/python -m bench.quotas --tpm 400000 --mode rate     # a queue rate alone

The provider is the model API stand-in (`brook.testing.model_api`, a child process): a
sliding window of `--tpm` tokens a minute, `429` with `Retry-After` beyond it. Each job makes
one call whose real usage is 500-2,000 random tokens; with a quota, its estimate is 1,000
(`quotas={"bench-llm": 1000}`), corrected by `ctx.usage`, and a `429` raises `RateLimited`.
The `rate` mode has no quota: the default queue's `rate` is U / 1,250 starts a minute (the
mean usage), and a `429` raises `Retry` with its delay. Prints one JSON document: goodput
(tokens the provider accepted per minute of wall time / U), the share of calls answered
`429`, failed jobs, wall time, and with `halve` the goodput over each minute after the
halving against the new limit.

Goodput window by window (`windows`): the tokens the stand-in accepted in each whole minute
counted from the first call it received, / U (a partial last minute is left out). The
**steady-state goodput** (`steady_goodput`) is the mean of those minutes after the first
(the first starts from an empty window and ramps up), and only of minutes that end before
the last call, so while jobs still waited; it needs three such minutes (`--jobs 2000` at
U = 400,000 is about six windows of work). The goodput of the whole run divided by wall
time can pass 1 on a short run: an empty window takes U at once, and more as the first
minute's tokens age out.

A trace of the run is written to `bench/out/quotas-MODE-trace.json`: the stand-in's calls
(`GET /calls`: time, charge, what its window held, status, wait, the job and attempt) and
Brook's quota read every 0.1 s (units used, effective rate, usage ratio, holds), to tell
why each 429 came.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.harness import OUT, ROOT, free_port, replica_set, role, role_env, sync_client
from brook import Client
from brook.common.domain.quotas import Quota
from brook.testing.model_api import ModelAPI

QUOTA = "bench-llm"
ESTIMATE = 1000
ENDED = ["completed", "failed", "cancelled"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.quotas", description=__doc__.split("\n")[0])
    p.add_argument("--tpm", type=int, default=400_000, help="U: the provider's tokens a minute")
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--dispatchers", type=int, default=3)
    p.add_argument("--mode", choices=["quota", "halve", "rate"], default="quota")
    p.add_argument("--halve-after", type=float, default=60.0, help="seconds into the run")
    p.add_argument("--seconds", type=float, default=0.5, help="how long an answer takes")
    p.add_argument("--seed", type=int, default=45)
    return p.parse_args(argv)


def specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    quota = args.mode != "rate"
    out = []
    for _ in range(args.jobs):
        spec: dict[str, Any] = {
            "task": "bench_llm",
            "payload": {"tokens": rng.randint(500, 2000), "quota": quota},
            "max_attempts": 50,
        }
        if quota:
            spec["quotas"] = {QUOTA: ESTIMATE}
        out.append(spec)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    u = args.tpm
    db = f"bench_quotas_{int(time.time())}"
    with contextlib.ExitStack() as stack:
        deployment = stack.enter_context(replica_set(keep=False))
        model = stack.enter_context(
            ModelAPI(tokens=ESTIMATE, seconds=args.seconds, tpm=u).process()
        )
        env = role_env(deployment.uri, db, concurrency=2, api_port=free_port())
        env.update(BROOK_TASKS="bench.quota_tasks", MODEL_API_URL=model.url, PYTHONPATH=str(ROOT))
        client = stack.enter_context(contextlib.closing(Client(uri=deployment.uri, db=db)))
        if args.mode == "rate":
            client.set_queue("default", rate={"limit": max(u // 1250, 1), "per_seconds": 60})
        else:
            client.set_quota(QUOTA, units={"limit": u, "per_seconds": 60})
        OUT.mkdir(parents=True, exist_ok=True)
        for i in range(args.dispatchers):
            # Each its own metrics port, as three dispatchers on three hosts would have.
            own = dict(env, BROOK_METRICS_PORT=str(free_port()))
            stack.enter_context(role("dispatcher", own, OUT / f"quotas-{args.mode}-{i}.log"))
        warm = client.submit("noop")
        client.wait(warm.id, timeout=120)
        http = stack.enter_context(httpx.Client(base_url=model.url, timeout=10))
        http.post("/stats/reset")
        mongo = sync_client(deployment.uri)[db]
        with sampled(mongo["brook_quotas"]) as samples:
            out = measure(args, client, http, mongo["jobs"])
        trace = OUT / f"quotas-{args.mode}-trace.json"
        calls = http.get("/calls").json()["calls"]
        trace.write_text(json.dumps({"calls": calls, "brook": samples}))
        out.update(steady(calls, u))
        out["trace"] = str(trace)
        return out
    raise AssertionError("unreachable")


@contextlib.contextmanager
def sampled(quotas: Any, every_s: float = 0.1) -> Iterator[list[dict[str, Any]]]:
    """What Brook's quota holds, read every `every_s` while the block runs: to set beside the
    stand-in's calls (`GET /calls`) and tell why each 429 came."""
    samples: list[dict[str, Any]] = []
    admitted: dict[str, float] = {}  # job/attempt: when first seen holding the quota
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every_s):
            doc = quotas.find_one({"_id": QUOTA})
            if doc is None:
                continue
            q = Quota.from_doc(doc)
            now = datetime.now(UTC)
            closed = q.closed_until.replace(tzinfo=UTC) if q.closed_until else None
            samples.append(
                {
                    "at": now.timestamp(),
                    "used": q.used("units", now),
                    "factor": q.factor,
                    "ratio": q.usage_ratio(),
                    "closed": closed is not None and closed > now,
                    "holders": len(q.holders),
                    "unreported": sum(1 for h in q.holders if not h.reported),
                }
            )
            for h in q.holders:
                admitted.setdefault(f"{h.job}/{h.attempt}", now.timestamp())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(5)
        samples.append({"admitted": admitted})


def measure(
    args: argparse.Namespace, client: Client, http: httpx.Client, jobs: Any
) -> dict[str, Any]:
    u = args.tpm
    all_specs = specs(args)
    t0 = time.monotonic()
    for i in range(0, len(all_specs), 500):
        client.submit_many(all_specs[i : i + 500])
    series: list[tuple[float, int]] = []  # (seconds since start, tokens the provider took)
    halved_at: float | None = None
    while True:
        now = time.monotonic() - t0
        stats = http.get("/stats").json()
        series.append((now, int(stats["tokens_charged"])))
        if args.mode == "halve" and halved_at is None and now >= args.halve_after:
            http.post("/limit", json={"tpm": u // 2})
            halved_at = now
        ended = jobs.count_documents({"status": {"$in": ENDED}, "task": "bench_llm"})
        if ended >= args.jobs:
            break
        time.sleep(1.0)
    wall = time.monotonic() - t0
    stats = http.get("/stats").json()
    failed = jobs.count_documents({"status": "failed", "task": "bench_llm"})
    out: dict[str, Any] = {
        "mode": args.mode,
        "U_tokens_per_minute": u,
        "jobs": args.jobs,
        "dispatchers": args.dispatchers,
        "wall_s": round(wall, 1),
        "tokens_accepted": stats["tokens_charged"],
        "goodput": round(stats["tokens_charged"] / (wall / 60) / u, 3),
        "calls": stats["requests"],
        "rate_limited": stats["rate_limited"],
        "share_429": round(stats["rate_limited"] / max(stats["requests"], 1), 4),
        "failed_jobs": failed,
    }
    if halved_at is not None:
        out["halved_at_s"] = round(halved_at, 1)
        out["goodput_after_halving_per_minute"] = per_minute(series, halved_at, u // 2)
    return out


def steady(calls: list[dict[str, Any]], u: int) -> dict[str, Any]:
    """Goodput window by window, from the stand-in's calls: the tokens it accepted in each
    whole minute from the first call on, / U (`windows`); and the steady state, the mean of
    those minutes after the first that end before the last call, while jobs still waited
    (`steady_goodput`; None if the run is under three minutes of calls)."""
    if not calls:
        return {"windows": [], "steady_goodput": None}
    first, last = calls[0]["at"], calls[-1]["at"]
    windows = []
    start = first
    while start + 60 <= last:
        taken = sum(
            c["charge"] for c in calls if c["status"] == 200 and start <= c["at"] < start + 60
        )
        windows.append(round(taken / u, 3))
        start += 60
    later = windows[1:]
    mean = round(sum(later) / len(later), 3) if len(later) >= 2 else None
    return {"windows": windows, "steady_goodput": mean}


def per_minute(series: list[tuple[float, int]], since: float, limit: int) -> list[float]:
    """Tokens taken in each whole minute from `since` on, / `limit`."""
    out = []
    start = since
    while True:
        inside = [tokens for t, tokens in series if start <= t <= start + 60]
        if len(inside) < 2 or series[-1][0] < start + 60:
            break
        out.append(round((inside[-1] - inside[0]) / limit, 3))
        start += 60
    return out


def main(argv: Sequence[str] | None = None) -> int:
    print(json.dumps(run(parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
