"""A job's output in the CLI: `brook output ID [--follow]`, and the output that `brook submit
--wait` and `brook watch ID` show as it comes, against a real API and dispatcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx

from tests.e2e.conftest import Cluster
from tests.e2e.test_output import holding

TASKS = {"BROOK_TASKS": "tests.tasks.basic,tests.tasks.output", "BROOK_SSE_PING_SECONDS": "0.5"}
TOKENS = "".join(f"t{i} " for i in range(20)) + '{"done":20,"attempt":1}\n'


def words_between(text: str, job_id: str) -> list[str]:
    """The words of the output in `text`, the job's event lines taken out (an event line
    starts a line of its own: output it cut goes on on the next line)."""
    return " ".join(line for line in text.splitlines() if job_id not in line).split()


def test_output_follow_streams_a_running_jobs_chunks_and_marks_a_new_attempt(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**TASKS)
    disp = cluster.dispatcher(**TASKS)
    job_id = http.post("/jobs", json={"task": "emit_until_killed", "payload": {"n": 5}}).json()[
        "id"
    ]
    following = subprocess.Popen(
        [sys.executable, "-m", "brook.cli", "output", job_id, "--follow", "--json"],
        env=cluster.env(**TASKS),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert following.stdout is not None
        # Attempt 1 emitted 5 chunks and holds on: they are printed while it runs.
        first = [json.loads(following.stdout.readline()) for _ in range(5)]
        assert [(c["attempt"], c["seq"], c["data"]) for c in first] == [
            (1, i + 1, f"a1-{i} ") for i in range(5)
        ]
        assert http.get(f"/jobs/{job_id}").json()["status"] == "running"
        os.kill(holding(disp, job_id), signal.SIGKILL)
        out, err = following.communicate(timeout=60)
    finally:
        if following.poll() is None:
            following.kill()
            following.communicate()
    assert following.returncode == 0, err
    rest = [json.loads(line) for line in out.splitlines()]
    assert [(c["attempt"], c["seq"], c["data"]) for c in rest] == [
        (2, i + 6, f"a2-{i} ") for i in range(3)
    ]
    # As text: the chunks as they are, and on stderr where attempt 2's output begins.
    text = cluster.cli("output", job_id, "--follow", **TASKS)
    assert text.returncode == 0, text.stderr
    assert text.stdout == "a1-0 a1-1 a1-2 a1-3 a1-4 \na2-0 a2-1 a2-2 "
    assert text.stderr == "# attempt 2\n"
    so_far = cluster.cli("output", job_id, **TASKS)
    assert so_far.returncode == 0 and so_far.stdout == "a1-0 a1-1 a1-2 a1-3 a1-4 a2-0 a2-1 a2-2 "
    one = cluster.cli("output", job_id, "--attempt", "2", **TASKS)
    assert one.stdout == "a2-0 a2-1 a2-2 "
    resumed = cluster.cli("output", job_id, "--follow", "--after", "2-6", **TASKS)
    assert resumed.stdout == "a2-1 a2-2 ", resumed.stderr


def test_output_says_so_when_there_is_no_such_job_or_position(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**TASKS)
    missing = cluster.cli("output", "nope", **TASKS)
    assert missing.returncode == 1 and missing.stderr.strip() == "brook: error: 404 no job nope"
    followed = cluster.cli("output", "nope", "--follow", **TASKS)
    assert followed.returncode == 1 and followed.stderr.strip() == "brook: error: 404 no job nope"
    job_id = http.post("/jobs", json={"task": "noop"}).json()["id"]
    bad = cluster.cli("output", job_id, "--follow", "--after", "1-9", **TASKS)
    assert bad.returncode == 1
    assert bad.stderr.strip() == "brook: error: 400 this job's output never had position 1-9"


def test_submit_wait_shows_the_output_as_it_comes_and_prints_only_the_result(
    cluster: Cluster,
) -> None:
    cluster.api(**TASKS)
    cluster.dispatcher(**TASKS)
    payload = json.dumps({"n": 20, "pause": 0.05})
    out = cluster.cli("submit", "emit_tokens", "--payload", payload, "--wait", **TASKS)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == 20  # stdout: the result alone
    # stderr: the job's states, each on a line of its own, and its output, all of it before
    # its end.
    lines = out.stderr.splitlines()
    job_id = lines[0].split()[0]
    assert lines[0] == f"{job_id} pending" and lines[-1] == f"{job_id} completed", lines
    assert any(line.endswith('{"done":20,"attempt":1}') for line in lines[:-1]), lines
    assert words_between(out.stderr, job_id) == TOKENS.split()
    # Much output, written before the job's end: all of it is shown before that end.
    out = cluster.cli("submit", "emit_many", "--payload", '{"n": 5000}', "--wait", **TASKS)
    assert out.returncode == 0 and json.loads(out.stdout)["emitted"] == 5000, out.stderr
    lines = out.stderr.splitlines()
    job_id = lines[0].split()[0]
    assert lines[-1] == f"{job_id} completed", lines[-3:]
    assert [line for line in lines if job_id not in line] == [str(i) for i in range(5000)]


def test_watch_shows_one_jobs_output_between_its_events(
    cluster: Cluster, http: httpx.Client
) -> None:
    cluster.api(**TASKS)
    cluster.dispatcher(**TASKS)
    payload = {"n": 20, "pause": 0.05}
    job_id = http.post("/jobs", json={"task": "emit_tokens", "payload": payload}).json()["id"]
    watched = cluster.cli("watch", job_id, **TASKS)
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    assert lines[-1].split()[1:3] == [job_id, "completed"], lines
    # all of its output before its end (an event line may come between its chunks)
    assert any(line.endswith('{"done":20,"attempt":1}') for line in lines[:-1]), lines
    assert words_between(watched.stdout, job_id) == TOKENS.split()
    as_json = [
        json.loads(line)
        for line in cluster.cli("watch", job_id, "--json", **TASKS).stdout.splitlines()
    ]
    chunks = [line["chunk"] for line in as_json if "chunk" in line]
    assert [c["seq"] for c in chunks] == list(range(1, 22))
    assert as_json[-1]["status"] == "completed"
    # Much output, written before the job's end: watch shows all of it before that end.
    many = http.post("/jobs", json={"task": "emit_many", "payload": {"n": 5000}}).json()["id"]
    watched = cluster.cli("watch", many, **TASKS)
    lines = watched.stdout.splitlines()
    assert lines[-1].split()[1:3] == [many, "completed"], lines[-3:]
    assert [line for line in lines if many not in line] == [str(i) for i in range(5000)]
    quiet = cluster.cli("watch", job_id, "--no-output", **TASKS)
    assert "t0" not in quiet.stdout and len(quiet.stdout.splitlines()) == 1
