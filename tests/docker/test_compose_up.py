"""`docker compose up` from nothing to a completed job, and `down -v` leaving nothing."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.docker.conftest import Project

# The session's first test builds the app image (and the stand-ins, if not given) too.
pytestmark = pytest.mark.timeout(1500)


def test_compose_brings_up_the_replica_set_and_runs_a_job_submitted_over_http(
    project: Project,
) -> None:
    took = project.up()
    print(f"compose up from nothing to ready: {took:.1f}s")
    # The one-shots ran and ended well: the keyfile, then rs.initiate and Brook's user.
    for one_shot in ("keyfile", "mongo-init"):
        state = project.run("ps", "-a", one_shot)
        assert "Exit 0" in state or "exited (0)" in state.lower(), state
    members = json.loads(project.mongosh("mongo1", "JSON.stringify(db.hello().hosts)") or "[]")
    assert sorted(members) == ["mongo1:27017", "mongo2:27017", "mongo3:27017"]
    assert project.primary() in {"mongo1", "mongo2", "mongo3"}

    with project.http() as http:
        # The token is required: the API is never open on the published port.
        assert httpx.get(f"{project.url}/jobs", timeout=10).status_code == 401
        assert httpx.get(f"{project.url}/healthz", timeout=10).status_code == 200
        made = http.post("/jobs", json={"task": "echo", "payload": {"hello": "compose"}})
        assert made.status_code == 202, made.text
        job_id = made.json()["id"]
        deadline = time.monotonic() + 60
        while (job := http.get(f"/jobs/{job_id}").json())["status"] != "completed":
            assert job["status"] in {"pending", "running"}, job
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["result"] == {"hello": "compose"} and job["attempts"] == 1

    # JSON logs come out of `docker compose logs`, one object a line, from both roles.
    logged: dict[str, list[dict[str, object]]] = {"api": [], "dispatcher": []}
    for raw in project.run("logs", "--no-color", "api", "dispatcher").splitlines():
        prefix, sep, rest = raw.partition("| ")
        if sep and rest.startswith("{"):
            # `api_1  | ` (1.29) or `api-1  | ` (v2): the project's name has no "dispatcher".
            service = "dispatcher" if "dispatcher" in prefix else "api"
            logged[service].append(json.loads(rest))
    assert logged["api"] and logged["dispatcher"]
    for line in logged["api"] + logged["dispatcher"]:
        assert {"timestamp", "level", "event"} <= line.keys(), line
    completed = [e for e in logged["dispatcher"] if e["event"] == "job.completed"]
    assert [e["job_id"] for e in completed] == [job_id]
    # Brook connects as its own user, which may read the oplog for insert hints...
    assert any(e["event"] == "hints.opened" for e in logged["dispatcher"])
    # ... and nothing of root's, nor any password, shows in what it logs.
    text = project.run("logs", "--no-color", "api", "dispatcher")
    for secret in ("MONGO_ROOT_PASSWORD", "MONGO_BROOK_PASSWORD", "BROOK_API_TOKEN"):
        assert project.env[secret] not in text, secret

    # Brook's user has the rights it needs on its database and nothing beyond.
    denied = project.mongosh(
        "mongo1",
        "const c = connect('mongodb://brook:' + "
        f"'{project.env['MONGO_BROOK_PASSWORD']}' + '@localhost:27017/admin');"
        "let r; try { r = c.adminCommand({listDatabases: 1}).ok } catch (e) { r = e.codeName }"
        " print(r)",
    )
    assert denied.splitlines()[-1] == "Unauthorized", denied

    project.down()
    assert project.leftovers() == {"containers": [], "networks": [], "volumes": []}
