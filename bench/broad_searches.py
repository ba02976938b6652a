"""Broad searches in parallel with the read-only token, against a real `brook api` over many
jobs: each is answered (a page, or `422 search_too_broad` at `BROOK_QUERY_MAX_MS`), and the
API keeps answering `/healthz` meanwhile.

    .venv/bin/python -m bench.broad_searches --jobs 1000000 --parallel 50

Builds the jobs as `bench.explain_reads` does (a fresh one-member embedded set unless
`--uri`), starts `brook api` on them with an admin and a read-only token, sends `--parallel`
searches at once (a mix of the widest filters: a task among 900,000 completed jobs that has
none, the same among the failed, the failure groups, an error-type prefix), and polls
`/healthz` every 0.2 s until they are all answered. Prints each search's status and time,
and the slowest `/healthz`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
from pymongo import MongoClient

from bench.explain_reads import fill
from brook.common.domain.models import Doc

SEARCHES = [
    "/jobs?status=completed&task=nosuchtask",
    "/jobs?status=failed&task=nosuchtask",
    "/jobs?status=completed&task=task1&since=2000-01-01T00:00:00Z",
    "/failures",
    "/jobs?error=Error",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def search(client: httpx.AsyncClient, path: str) -> tuple[str, int, float, str]:
    started = time.monotonic()
    reply = await client.get(path)
    code = reply.json().get("code", "") if reply.status_code != 200 else ""
    return path, reply.status_code, time.monotonic() - started, code


async def run(url: str, parallel: int) -> None:
    headers = {"Authorization": "Bearer read-token"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        health: list[float] = []
        done = asyncio.Event()

        async def poll() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=120) as plain:
                while not done.is_set():
                    t = time.monotonic()
                    reply = await plain.get("/healthz")
                    health.append(time.monotonic() - t)
                    assert reply.status_code == 200, reply.text
                    await asyncio.sleep(0.2)

        poller = asyncio.create_task(poll())
        started = time.monotonic()
        answers = await asyncio.gather(
            *(search(client, SEARCHES[i % len(SEARCHES)]) for i in range(parallel))
        )
        wall = time.monotonic() - started
        done.set()
        await poller
    by_path: dict[str, list[tuple[int, float, str]]] = {}
    for path, status, took, code in answers:
        by_path.setdefault(path, []).append((status, took, code))
    print(f"{parallel} searches at once, all answered in {wall:.1f} s\n")
    print("| search | answers | slowest |")
    print("|---|---|---|")
    for path, rows in by_path.items():
        kinds = Counter(f"{s} {c}".strip() for s, _, c in rows)
        said = ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))
        print(f"| `{path}` | {said} | {max(t for _, t, _ in rows):.2f} s |")
    print(f"\n/healthz meanwhile: {len(health)} answers, all 200, slowest {max(health):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--parallel", type=int, default=50)
    parser.add_argument("--uri", help="a replica set to use (default: a fresh embedded one)")
    args = parser.parse_args()
    rs = None
    uri = args.uri
    if uri is None:
        from brook.replset import ReplicaSet

        home = Path(".brook/bench-broad")
        shutil.rmtree(home, ignore_errors=True)
        rs = ReplicaSet(home=home, base_port=27527, members=1)
        uri = rs.up()
    db = f"broad_{os.getpid()}"
    sync: MongoClient[Doc] = MongoClient(uri)
    api = None
    try:
        took = fill(sync, db, args.jobs)
        print(f"{args.jobs:,} jobs and their indexes in {took:.1f} s\n")
        port = free_port()
        env = {
            **os.environ,
            "BROOK_MONGO_URI": uri,
            "BROOK_DB": db,
            "BROOK_API_PORT": str(port),
            "BROOK_API_TOKEN": "admin-token",
            "BROOK_API_READ_TOKEN": "read-token",
            "BROOK_LOG_LEVEL": "WARNING",
        }
        brook = str(Path(sys.executable).with_name("brook"))
        api = subprocess.Popen([brook, "api"], env=env)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("brook api did not become ready")
            time.sleep(0.2)
        asyncio.run(run(url, args.parallel))
    finally:
        if api is not None:
            api.terminate()
            api.wait(30)
        sync.drop_database(db)
        sync.close()
        if rs is not None:
            rs.down()


if __name__ == "__main__":
    main()
