"""`brook submit --wait` and `brook watch` follow the event stream (never polling)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import time

import httpx

from tests.e2e.conftest import Cluster
from tests.e2e.test_events import LIVE, api, dispatcher, submit
from tests.support.metrics import value
from tests.support.procs import wait_until


def brook(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.cli(*args, **LIVE)


def test_submit_wait_streams_progress_as_plain_lines_and_prints_the_result(
    cluster: Cluster, http: httpx.Client
) -> None:
    api(cluster)
    dispatcher(cluster)
    out = brook(cluster, "submit", "steps", "--payload", '{"steps": 4, "seconds": 2}', "--wait")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == 4
    lines = [line.split(" ", 1)[1] for line in out.stderr.splitlines()]
    assert lines[0] == "pending" and lines[-1] == "completed 100% attempt 1 step 4/4", lines
    assert "running 50% attempt 1 step 2/4" in lines, lines
    # It followed the job's event stream, and never polled the job.
    requests = http.get("/metrics").text
    route = "brook_api_requests_total"
    assert value(requests, route, method="GET", route="/jobs/{job_id}/events", code="200") == 1
    assert value(requests, route, method="GET", route="/jobs/{job_id}", code="200") == 0


def test_submit_wait_draws_a_progress_bar_on_a_terminal(cluster: Cluster) -> None:
    api(cluster)
    dispatcher(cluster)
    controller, terminal = pty.openpty()
    try:
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        out = subprocess.run(
            [sys.executable, "-m", "brook.cli", "submit", "steps", "--wait",
             "--payload", '{"steps": 2, "seconds": 2}'],
            env=cluster.env(**LIVE),
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=60,
        )
        os.close(terminal)
        screen = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
    finally:
        os.close(controller)
    assert out.returncode == 0 and json.loads(out.stdout) == 2
    text = screen.decode(errors="replace")
    assert "━" in text and "50%" in text and "attempt 1 step 1/2" in text
    assert "steps completed" in text


def test_submit_wait_exits_1_with_the_error_of_a_failed_job(cluster: Cluster) -> None:
    api(cluster)
    dispatcher(cluster)
    out = brook(cluster, "submit", "fail", "--payload", '{"message": "boom"}', "--max-attempts", "1", "--wait")
    assert out.returncode == 1
    assert out.stderr.strip().endswith("failed: DemoFailure: boom")


def test_watch_follows_one_job_to_its_end_or_every_matching_job(
    cluster: Cluster, http: httpx.Client
) -> None:
    api(cluster)
    env = cluster.env(**LIVE)
    everything = subprocess.Popen(
        [sys.executable, "-m", "brook.cli", "watch", "--task", "echo", "--json", "--include", "result"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Connected before the first job, so its first event is the job's pending state.
        wait_until(lambda: value(http.get("/metrics").text, "brook_sse_clients") == 1, 30)
        [job_id] = submit(http, "echo", payload={"hello": "world"})
        dispatcher(cluster)
        one = brook(cluster, "watch", job_id)
        assert one.returncode == 0, one.stderr
        assert one.stdout.splitlines()[-1].split()[1:3] == [job_id, "completed"]
        assert everything.stdout is not None
        seen = [json.loads(everything.stdout.readline()) for _ in range(3)]
        assert [(j["id"], j["status"]) for j in seen] == [
            (job_id, "pending"),
            (job_id, "running"),
            (job_id, "completed"),
        ]
        assert seen[-1]["result"] == {"hello": "world"}  # asked for: events leave it out
        assert "payload" not in seen[-1]
    finally:
        everything.terminate()
        everything.wait(10)
        if everything.stdout is not None:
            everything.stdout.close()


def test_watch_says_so_when_there_is_no_such_job(cluster: Cluster) -> None:
    api(cluster)
    out = brook(cluster, "watch", "nope")
    assert out.returncode == 1 and out.stderr.strip() == "brook: error: 404 no job nope"


def test_submit_wait_rides_out_an_api_restart_without_missing_the_end(cluster: Cluster) -> None:
    first = api(cluster)
    dispatcher(cluster)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "brook.cli", "submit", "steps", "--wait",
         "--payload", '{"steps": 3, "seconds": 3}'],
        env=cluster.env(**LIVE),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Submitted, and following the job's stream: then the API dies.
    with httpx.Client(base_url=cluster.api_url, timeout=10) as http:
        wait_until(
            lambda: value(http.get("/metrics").text, "brook_sse_clients") == 1, timeout=30
        )
    first.signal(9)
    first.proc.wait()
    time.sleep(1.0)  # the job moves on while no API runs
    api(cluster)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert json.loads(out) == 3
    assert err.splitlines()[-1].endswith("completed 100% attempt 1 step 3/3")
