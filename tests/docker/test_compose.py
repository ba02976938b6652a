"""`docker compose up` for real, from nothing to `down -v` leaving nothing, and the faults
only containers can make in between.

One project serves the whole module, in order (bringing one up costs about a minute):
it comes up from nothing and runs a job submitted over HTTP; then four faults, each under a
stream of jobs whose `interval` task logs when every attempt ran (docker/faults/): a
dispatcher cut off from MongoDB, the primary cut off from everyone, the primary killed, the
API frozen. After each: every acknowledged submit is a job, every job completed exactly
once, and no two attempts of one job ever ran at the same time. The figures of each run
(jobs, faults, time to recover) are written to `.brook/docker-faults/<scenario>.json`.
Last, `down -v` leaves no container, network or volume.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.docker.conftest import FAULTS, ROOT, Images, Project, run

LEASE_S = 5.0

# The project comes up within the first test's time (and the app image is built then).
# One project, used in order: the whole module runs in one xdist worker (`--dist loadgroup`).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("docker-compose")]
FIGURES = ROOT / ".brook" / "docker-faults"


def _checker() -> ModuleType:
    path = ROOT / "docker" / "faults" / "check_intervals.py"
    spec = importlib.util.spec_from_file_location("check_intervals", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_intervals = _checker()


@pytest.fixture(scope="module")
def faulty(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    """Three members, the API and two dispatchers with 4 slots each and a 5 s lease, the
    `interval` task added (docker/compose.faults.yaml)."""
    tmp = tmp_path_factory.mktemp("faults")
    intervals = tmp / "intervals"
    intervals.mkdir()
    intervals.chmod(0o777)  # the app containers run as an unprivileged user
    p = Project(
        images=images,
        tmp=tmp,
        files=[ROOT / "compose.yaml", FAULTS],
        extra_env={
            "BROOK_INTERVALS_DIR": str(intervals),
            "BROOK_LEASE_SECONDS": str(LEASE_S),
            "BROOK_CONCURRENCY": "4",
        },
    )
    try:
        took = p.up(dispatchers=2)
        print(f"compose up from nothing to ready: {took:.1f}s")
        yield p
    finally:
        p.down()


@dataclass
class Stream:
    """Submits `count` interval jobs, one every `gap` s, each with its own idempotency key;
    a submit that fails or times out is retried with the same key (never a second job)."""

    project: Project
    run_id: str
    count: int
    seconds: float
    gap: float
    acked: dict[str, str] = field(default_factory=dict)  # key -> job id
    unanswered: int = 0
    thread: threading.Thread | None = None

    def start(self) -> Stream:
        self.thread = threading.Thread(target=self._submit_all, daemon=True)
        self.thread.start()
        return self

    def _submit_all(self) -> None:
        with self.project.http(timeout=3) as http:
            for i in range(self.count):
                key = f"{self.run_id}-{i}"
                while True:
                    try:
                        r = http.post(
                            "/jobs",
                            json={
                                "task": "interval",
                                "payload": {"seconds": self.seconds},
                                "idempotency_key": key,
                                "max_attempts": 25,
                            },
                        )
                        if r.status_code in (200, 202):
                            self.acked[key] = r.json()["id"]
                            break
                    except httpx.HTTPError:
                        pass
                    self.unanswered += 1
                    time.sleep(0.5)
                time.sleep(self.gap)

    def join(self, timeout: float) -> None:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the submit stream did not finish"


def probe_recovery(project: Project, since: float, timeout: float = 120) -> float:
    """Seconds from `since` until a job submitted now (and again until one does) completes."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []  # what each probe met, for the failure's account
    with project.http(timeout=3) as http:
        while time.monotonic() < deadline:
            at = f"{time.monotonic() - since:.1f}s"
            try:
                r = http.post("/jobs", json={"task": "noop", "max_attempts": 25})
                if r.status_code != 202:
                    seen.append(f"{at} submit {r.status_code} {r.text[:120]}")
                    time.sleep(0.3)
                    continue
                job_id = r.json()["id"]
                end = time.monotonic() + 30
                status = "?"
                while time.monotonic() < end:
                    status = http.get(f"/jobs/{job_id}").json()["status"]
                    if status == "completed":
                        return time.monotonic() - since
                    time.sleep(0.1)
                seen.append(f"{at} job {job_id} still {status} after 30 s")
            except httpx.HTTPError as exc:
                seen.append(f"{at} {exc!r}")
                time.sleep(0.3)
    pytest.fail("no job completed after the fault\n" + "\n".join(seen[-40:]) + outlook(project))


def outlook(project: Project, tail: int = 25) -> str:
    """The last warnings and errors of the API and the dispatchers: a failure's account."""
    lines = []
    for service, index in (("api", 1), ("dispatcher", 1), ("dispatcher", 2)):
        loud = [e for e in project.events(service, index) if e.get("level") != "info"]
        lines.append(f"-- {service} {index}, last {tail} warnings and errors:")
        lines += [json.dumps(e, default=str)[:400] for e in loud[-tail:]]
    return "\n" + "\n".join(lines)


def settle_and_check(
    project: Project, stream: Stream, scenario: str, figures: dict[str, Any]
) -> dict[str, Any]:
    """Wait for every acknowledged job to end, then the four checks; record the figures."""
    stream.join(timeout=180)
    jobs: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 180
    with project.http(timeout=10) as http:
        for key, job_id in stream.acked.items():
            while True:
                try:
                    r = http.get(f"/jobs/{job_id}")
                except httpx.HTTPError as exc:  # the API may still be finding the new primary
                    assert time.monotonic() < deadline, f"{job_id}: {exc!r}"
                    time.sleep(0.3)
                    continue
                # No acknowledged submit is missing (a 503 says no primary answers yet).
                assert r.status_code in (200, 503), f"acknowledged job {job_id} ({key}) is gone"
                if r.status_code == 200:
                    job = r.json()
                    if job["status"] in ("completed", "failed", "cancelled"):
                        jobs[job_id] = job
                        break
                assert time.monotonic() < deadline, f"{job_id} still {r.text[:300]}"
                time.sleep(0.3)
    assert len(set(stream.acked.values())) == stream.count  # one job per idempotency key
    # 0 jobs lost: every one completed.
    assert Counter(j["status"] for j in jobs.values()) == {"completed": stream.count}
    # 0 completed twice: one `job.completed` line per job, over both dispatchers.
    completions = Counter(
        e["job_id"]
        for index in (1, 2)
        for e in project.events("dispatcher", index, "job.completed")
        if e.get("job_id") in jobs
    )
    odd = {job_id for job_id in jobs if completions[job_id] != 1}
    assert not odd, "not logged `job.completed` exactly once: " + story(project, odd, jobs)
    # No two attempts of one job ran at the same time; the completed one did its work.
    report = check_intervals.read(project.tmp / "intervals" / "intervals.jsonl")
    mine = {job_id: report.attempts.get(job_id, []) for job_id in jobs}
    problems = [p for p in report.problems() if p.split(":")[0] in jobs]
    overlapped = {p.split(":")[0] for p in problems}
    assert problems == [], "\n".join(problems) + "\n" + story(project, overlapped, jobs)
    for job_id, job in jobs.items():
        ended = [a.attempt for a in mine[job_id] if a.ended]
        assert job["result"]["attempt"] == job["attempts"] in ended, (job_id, ended, job)
    figures |= {
        "scenario": scenario,
        "jobs": stream.count,
        "acknowledged": len(stream.acked),
        "submits_unanswered_then_retried": stream.unanswered,
        "attempts": sum(len(a) for a in mine.values()),
        "attempts_stopped": sum(1 for a in mine.values() for x in a if not x.ended),
        "lost": 0,
        "completed_twice": 0,
        "overlaps": 0,
        "work_done_again": sum(1 for a in mine.values() if sum(x.ended for x in a) > 1),
        # These two count from the project's start, over every scenario so far.
        "self_fenced_so_far": sum(
            len(project.events("dispatcher", index, "lease.self_fenced")) for index in (1, 2)
        ),
        "leases_expired_requeued_so_far": sum(
            len(project.events("dispatcher", index, "lease.expired")) for index in (1, 2)
        ),
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{scenario}.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))
    return figures


def story(project: Project, job_ids: set[str], jobs: dict[str, dict[str, Any]]) -> str:
    """What the dispatchers logged of these jobs, and their history: the failure's account."""
    lines = [f"{len(job_ids)} jobs:"]
    for job_id in sorted(job_ids):
        lines.append(f"-- {job_id}: history {json.dumps(jobs[job_id].get('history'), default=str)}")
        for index in (1, 2):
            for e in project.events("dispatcher", index):
                if e.get("job_id") == job_id:
                    lines.append(f"   dispatcher {index}: {json.dumps(e, default=str)}")
    return "\n".join(lines)


def test_compose_comes_up_from_nothing_and_runs_a_job_submitted_over_http(
    faulty: Project,
) -> None:
    project = faulty
    # The one-shots ran and ended well: the keyfile, then rs.initiate and Brook's user.
    for one_shot in ("keyfile", "mongo-init"):
        state = project.run("ps", "-a", one_shot)
        assert "Exit 0" in state or "exited (0)" in state.lower(), state
    members = json.loads(project.mongosh("mongo1", "JSON.stringify(db.hello().hosts)") or "[]")
    assert sorted(members) == ["mongo1:27017", "mongo2:27017", "mongo3:27017"]
    assert project.primary() in {"mongo1", "mongo2", "mongo3"}
    root = f"{project.env['MONGO_ROOT_USER']}:{project.env['MONGO_ROOT_PASSWORD']}"
    expiry = project.mongosh(
        "mongo1",
        f"Number(connect('mongodb://{root}@localhost:27017/admin')"
        ".adminCommand({getClusterParameter: 'changeStreamOptions'})"
        ".clusterParameters[0].preAndPostImages.expireAfterSeconds)",  # not Long('3600')
    )
    assert expiry.strip() == "3600", expiry  # pre-images live an hour, not as long as the oplog

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
    assert logged["api"] and logged["dispatcher"]  # both dispatchers, interleaved
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
    password = project.env["MONGO_BROOK_PASSWORD"]
    answers = project.mongosh(
        "mongo1",
        f"const c = connect('mongodb://brook:{password}@localhost:27017/admin');"
        "const tries = {"
        " brook: () => c.getSiblingDB('brook').probe.insertOne({}).acknowledged,"
        " other: () => c.getSiblingDB('other').probe.insertOne({}).acknowledged,"
        " users: () => c.getSiblingDB('admin').system.users.countDocuments({}),"
        " config: () => c.adminCommand({replSetGetConfig: 1}).ok };"
        "const out = {};"
        "for (const [k, f] of Object.entries(tries)) {"
        " try { out[k] = f() } catch (e) { out[k] = e.codeName } }"
        "print(JSON.stringify(out))",
    )
    assert json.loads(answers.splitlines()[-1]) == {
        "brook": True,
        "other": "Unauthorized",
        "users": "Unauthorized",
        "config": "Unauthorized",
    }, answers


def running_on(project: Project, index: int, since: float) -> set[str]:
    """Jobs whose attempt started on dispatcher #`index` after `since` (by the log)."""
    host = run(
        ["docker", "inspect", "-f", "{{.Config.Hostname}}", project.container("dispatcher", index)]
    ).stdout.strip()
    path = project.tmp / "intervals" / "intervals.jsonl"
    if not path.exists():
        return set()
    out = set()
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        if line["host"] == host and line["event"] == "start" and line["t"] >= since:
            out.add(line["job_id"])
    return out


def test_a_dispatcher_cut_off_for_three_leases_stops_its_jobs_before_another_runs_them(
    faulty: Project,
) -> None:
    t0 = time.time()
    stream = Stream(faulty, "partition-dispatcher", count=12, seconds=8.0, gap=0.1).start()
    deadline = time.monotonic() + 60
    while len(running_on(faulty, 1, t0)) < 2:
        assert time.monotonic() < deadline, "dispatcher 1 never started jobs"
        time.sleep(0.2)
    taken = running_on(faulty, 1, t0)
    victim = faulty.container("dispatcher", 1)
    cut = time.monotonic()
    run(["docker", "network", "disconnect", faulty.network, victim])
    time.sleep(3 * LEASE_S)
    run(["docker", "network", "connect", faulty.network, victim])
    healed = time.monotonic()
    fenced = faulty.events("dispatcher", 1, "lease.self_fenced")
    assert {e["job_id"] for e in fenced} >= taken - {
        e["job_id"] for e in faulty.events("dispatcher", 1, "job.completed")
    }
    assert fenced, "the cut-off dispatcher fenced nothing"
    recovered = probe_recovery(faulty, cut)
    figures = settle_and_check(
        faulty,
        stream,
        "dispatcher_partitioned",
        {
            "fault": f"dispatcher 1 disconnected from the compose network {3 * LEASE_S:.0f}s"
            f" (3x its {LEASE_S:.0f}s lease), 8 s jobs",
            "partition_s": round(healed - cut, 1),
            "self_fenced_during_partition": len(fenced),
            "recovered_s": round(recovered, 1),
        },
    )
    # Each fenced attempt that had started was stopped before its end (a fenced job still
    # waiting for a worker here never started: nothing to stop), and at least one had.
    report = check_intervals.read(faulty.tmp / "intervals" / "intervals.jsonl")
    runs = {(a.job_id, a.attempt): a for runs in report.attempts.values() for a in runs}
    started = [runs[k] for e in fenced if (k := (e["job_id"], e["attempt"])) in runs]
    assert started and not [a for a in started if a.ended], started
    assert figures["attempts_stopped"] >= len(started)


def _burst(faulty: Project, name: str) -> Stream:
    return Stream(faulty, name, count=120, seconds=0.3, gap=0.05).start()


def test_the_primary_cut_off_from_everyone_steps_down_and_writes_go_on(faulty: Project) -> None:
    wait_primary(faulty)
    stream = _burst(faulty, "partition-primary")
    time.sleep(2)
    old = wait_primary(faulty)
    container = faulty.container(old)
    cut = time.monotonic()
    run(["docker", "network", "disconnect", faulty.network, container])
    try:
        deadline = time.monotonic() + 60
        while not (new := faulty.primary(besides=old)):
            assert time.monotonic() < deadline, "no new primary was elected"
            time.sleep(0.5)
        elected = time.monotonic() - cut
        recovered = probe_recovery(faulty, cut)
        # Cut off from the majority, the old primary stepped down.
        deadline = time.monotonic() + 30
        while faulty.mongosh(old, "db.hello().isWritablePrimary") != "false":
            assert time.monotonic() < deadline, f"{old} still thinks it is primary"
            time.sleep(0.5)
    finally:
        run(["docker", "network", "connect", "--alias", old, faulty.network, container])
    settle_and_check(
        faulty,
        stream,
        "primary_partitioned",
        {
            "fault": f"primary {old} disconnected from the compose network (both secondaries"
            " and the app)",
            "new_primary": new,
            "elected_s": round(elected, 1),
            "recovered_s": round(recovered, 1),
        },
    )


def wait_primary(project: Project, timeout: float = 60) -> str:
    """The primary, once there is one (after a fault the set may still be electing, or the
    member with the higher priority taking over again)."""
    deadline = time.monotonic() + timeout
    while not (primary := project.primary()):
        assert time.monotonic() < deadline, "no primary"
        time.sleep(0.5)
    return primary


def test_the_primary_killed_mid_burst(faulty: Project) -> None:
    wait_primary(faulty)
    stream = _burst(faulty, "kill-primary")
    time.sleep(2)
    old = wait_primary(faulty)
    killed = time.monotonic()
    run(["docker", "kill", faulty.container(old)])
    try:
        recovered = probe_recovery(faulty, killed)
    finally:
        run(["docker", "start", faulty.container(old)])
    settle_and_check(
        faulty,
        stream,
        "primary_killed",
        {"fault": f"docker kill of primary {old} mid-burst", "recovered_s": round(recovered, 1)},
    )


def test_the_api_paused_for_twenty_seconds_mid_burst(faulty: Project) -> None:
    stream = _burst(faulty, "pause-api")
    time.sleep(2)
    api = faulty.container("api")
    paused = time.monotonic()
    run(["docker", "pause", api])
    time.sleep(20)
    run(["docker", "unpause", api])
    recovered = probe_recovery(faulty, paused)
    settle_and_check(
        faulty,
        stream,
        "api_paused",
        {
            "fault": "docker pause of the api container for 20 s mid-burst",
            "recovered_s": round(recovered, 1),
        },
    )


def test_compose_down_v_leaves_no_container_network_or_volume(faulty: Project) -> None:
    assert faulty.leftovers()["containers"], "nothing was up"
    faulty.down()
    assert faulty.leftovers() == {"containers": [], "networks": [], "volumes": []}
