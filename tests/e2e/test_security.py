"""Safe to expose: no request freezes the API, no open door by default, least privilege.

Real `brook api` processes, attacked the way an outsider would: hostile bodies while
another client times `/healthz`, tokens, foreign `Host`s and content types, forged event
ids, and more streams than the API allows.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx

from tests.e2e.conftest import Cluster

JSON = {"Content-Type": "application/json"}
MIB = 1024 * 1024


def hostile_bodies() -> dict[str, bytes]:
    """The body that froze the API (a string of escaped quotes, never closed), and 2 MiB
    variants of each kind of costly input."""
    n = 2 * MIB
    return {
        "escaped quotes": b'["' + b'\\"' * 300_000,
        "escaped quotes, 2 MiB": b'["' + b'\\"' * (n // 2 - 1),
        "deep nesting": b"[" * n,
        "deep nesting, closed": b"[" * (n // 2) + b"]" * (n // 2),
        "nesting in a payload": b'{"task": "noop", "payload": {"a": ' + b"[" * (n - 40) + b"}",
        # Each refused only once all of it was read: a NUL in a key, a `$` key at the end.
        "escapes in a key": b'{"task": "noop", "payload": {"'
        + b"\\u0000\\\\" * (n // 8 - 10)
        + b'": 1}}',
        "many keys": b'{"task": "noop", "payload": {'
        + b"".join(b'"k%d": 1, ' % i for i in range(n // 12))
        + b'"$last": 1}}',
        "huge integer": b'{"task": "noop", "payload": {"n": ' + b"9" * (n - 40) + b"}}",
        "huge float": b'{"task": "noop", "payload": {"n": 1.' + b"1" * (n - 40) + b"e999}}",
    }


def test_no_hostile_body_stalls_healthz_and_each_is_refused_within_a_second(
    cluster: Cluster,
) -> None:
    # A limit above the variants' size, so that every one of them is parsed and judged.
    cluster.api(BROOK_MAX_BODY_BYTES=str(4 * MIB))
    url = cluster.api_url
    answers: dict[str, tuple[int, float]] = {}
    done = threading.Event()

    def attack() -> None:
        with httpx.Client(base_url=url, timeout=120) as attacker:
            for name, body in hostile_bodies().items():
                t0 = time.monotonic()
                resp = attacker.post("/jobs", content=body, headers=JSON)
                answers[name] = (resp.status_code, time.monotonic() - t0)
        done.set()

    thread = threading.Thread(target=attack)
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as probe:
        probe.get("/healthz")  # the connection is open before the attack starts
        thread.start()
        while not done.is_set():
            t0 = time.monotonic()
            assert probe.get("/healthz").status_code == 200
            latencies.append(time.monotonic() - t0)
            time.sleep(0.01)
    thread.join()
    assert set(answers) == set(hostile_bodies())
    for name, (code, seconds) in answers.items():
        assert code in (413, 422), (name, code)
        # Generous: the point is seconds against the minutes the old check took.
        assert seconds < 1.5, (name, seconds)
    # Generous too (a shared machine): typically a few milliseconds.
    assert len(latencies) >= 5
    assert statistics.median(latencies) < 0.1, latencies
    assert max(latencies) < 0.5, latencies
