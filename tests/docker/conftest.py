"""Brook on Docker, for real: compose projects of this checkout on a local Docker engine.

Every test here is marked `docker`. They need a Docker engine that answers `docker info`
(`.ci/run` installs and starts one); where none runs they FAIL, loudly, never skip.
Images: `BROOK_MONGO_IMAGE` and `BROOK_BASE_IMAGE` from the environment, else the local
stand-ins `docker/images/build.sh` (`make images`) builds or finds cached. The app image is
built once per session from the Dockerfile on that base.

Each project is named `brooktest<random>`, publishes the API on 127.0.0.1 only, and is
taken down with its volumes at the end; the tests talk to 127.0.0.1 and to the containers
of the compose network they made, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
FAULTS = ROOT / "docker" / "compose.faults.yaml"
BUILD_IMAGES = ROOT / "docker" / "images" / "build.sh"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.docker)


def run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} exited {proc.returncode}\n"
            f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
        )
    return proc


def compose_command() -> list[str]:
    """`docker compose` (v2) where the plugin exists, else `docker-compose` (1.29)."""
    if run(["docker", "compose", "version"], check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    found = shutil.which("docker-compose")
    if found is None:
        pytest.fail("neither `docker compose` nor `docker-compose` is installed")
    return [found]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Images:
    mongo: str
    base: str
    app: str


@pytest.fixture(scope="session")
def docker_engine() -> None:
    if shutil.which("docker") is None:
        pytest.fail("no docker client: these tests need a Docker engine (see .ci/run)")
    info = run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout=60)
    if info.returncode != 0:
        pytest.fail(f"the Docker engine does not answer `docker info`: {info.stderr.strip()}")


@pytest.fixture(scope="session")
def images(docker_engine: None) -> Images:
    mongo = os.environ.get("BROOK_MONGO_IMAGE")
    base = os.environ.get("BROOK_BASE_IMAGE")
    if not (mongo and base):
        out = run(["bash", str(BUILD_IMAGES)], timeout=1200).stdout.strip().splitlines()
        found = dict(line.split("=", 1) for line in out[-2:])
        mongo, base = found["BROOK_MONGO_IMAGE"], found["BROOK_BASE_IMAGE"]
    # One app image per checkout and base; the build cache makes a rebuild of unchanged
    # code a matter of seconds.
    tag = hashlib.sha256(f"{ROOT}:{base}".encode()).hexdigest()[:12]
    app = f"brook-test/app:{tag}"
    run(
        ["docker", "build", "--quiet", "--build-arg", f"BASE_IMAGE={base}", "-t", app, "."],
        timeout=900,
    )
    return Images(mongo=mongo, base=base, app=app)


@dataclass
class Project:
    """One compose project: its own containers, network and volumes."""

    images: Images
    tmp: Path
    files: list[Path] = field(default_factory=lambda: [COMPOSE])
    extra_env: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"brooktest{secrets.token_hex(4)}")
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        self.compose = compose_command()
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            **{k: v for k, v in os.environ.items() if k.startswith("DOCKER_")},
            "COMPOSE_PROJECT_NAME": self.name,
            "MONGO_ROOT_USER": "root",
            "MONGO_ROOT_PASSWORD": secrets.token_hex(16),
            "MONGO_BROOK_USER": "brook",
            "MONGO_BROOK_PASSWORD": secrets.token_hex(16),
            "BROOK_API_TOKEN": self.token,
            "BROOK_DEMO_TASKS": "1",  # the tests submit noop, echo and sleep jobs
            "BROOK_MONGO_IMAGE": self.images.mongo,
            "BROOK_BASE_IMAGE": self.images.base,
            "BROOK_APP_IMAGE": self.images.app,
            "BROOK_API_PUBLISHED_HOST": "127.0.0.1",
            "BROOK_API_PUBLISHED_PORT": str(self.port),
            **self.extra_env,
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def http(self, timeout: float = 10.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=timeout,
        )

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        files = [arg for f in self.files for arg in ("-f", str(f))]
        argv = [*self.compose, *files, "-p", self.name, *args]
        return run(argv, env=self.env, timeout=timeout, check=check).stdout

    def up(self, *, dispatchers: int = 1) -> float:
        """Bring it all up; the seconds it took until the API answered ready."""
        t0 = time.monotonic()
        self.run("up", "-d", "--no-build", "--scale", f"dispatcher={dispatchers}", timeout=600)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the API never became ready\n{self.run('logs', '--tail', '50')}")
            time.sleep(0.5)
        for index in range(1, dispatchers + 1):
            self.wait_for_log("dispatcher", "dispatcher.ready", index=index, timeout=120)
        return time.monotonic() - t0

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", "--timeout", "5", timeout=300)

    def containers(self, service: str | None = None, *, all: bool = True) -> list[str]:
        argv = ["docker", "ps", "-q", "--no-trunc"] + (["-a"] if all else [])
        argv += ["--filter", f"label=com.docker.compose.project={self.name}"]
        if service is not None:
            argv += ["--filter", f"label=com.docker.compose.service={service}"]
        return run(argv, timeout=60).stdout.split()

    def container(self, service: str, index: int = 1) -> str:
        out = run(
            [
                "docker",
                "ps",
                "-a",
                "-q",
                "--no-trunc",
                "--filter",
                f"label=com.docker.compose.project={self.name}",
                "--filter",
                f"label=com.docker.compose.service={service}",
                "--filter",
                f"label=com.docker.compose.container-number={index}",
            ],
            timeout=60,
        ).stdout.split()
        assert len(out) == 1, f"{service} #{index}: {out}"
        return out[0]

    @property
    def network(self) -> str:
        return f"{self.name}_brook"

    def events(
        self, service: str, index: int = 1, event: str | None = None
    ) -> list[dict[str, Any]]:
        """The JSON log lines of one container (`docker logs`), optionally of one event."""
        proc = run(["docker", "logs", self.container(service, index)], timeout=60)
        lines: list[dict[str, Any]] = []
        for raw in (proc.stdout + proc.stderr).splitlines():
            if raw.startswith("{"):
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if event is None or line.get("event") == event:
                    lines.append(line)
        return lines

    def wait_for_log(
        self, service: str, event: str, *, index: int = 1, timeout: float = 60
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.events(service, index, event)
            if found:
                return found[0]
            if time.monotonic() > deadline:
                pytest.fail(f"{service} #{index} never logged {event}")
            time.sleep(0.5)

    def mongosh(self, service: str, script: str) -> str:
        """Run `script` in mongosh inside a member (hello and such need no credentials)."""
        return run(
            ["docker", "exec", self.container(service), "mongosh", "--quiet", "--eval", script],
            timeout=60,
            check=False,
        ).stdout.strip()

    def primary(self, *, besides: str = "") -> str:
        """The service name of the member that is PRIMARY now ("" if none is), not
        counting `besides`: each member asked whether it is, all from one mongosh (a start
        costs about a CPU-second) in the first of them whose container runs."""
        others = [s for s in ("mongo1", "mongo2", "mongo3") if s != besides]
        script = (
            f"for (const h of {json.dumps(others)}) {{ try {{"
            " const c = new Mongo(`mongodb://${h}:27017/?directConnection=true"
            "&serverSelectionTimeoutMS=2000`);"
            " if (c.getDB('admin').runCommand({hello: 1}).isWritablePrimary) {"
            " print(h); break; }"
            " } catch (e) {} }"
        )
        for service in others:
            container = self.container(service)
            proc = run(
                ["docker", "exec", container, "mongosh", "--nodb", "--quiet", "--eval", script],
                timeout=60,
                check=False,
            )
            if proc.returncode == 0:  # its container runs: the answer is for all of them
                return proc.stdout.strip()
        return ""

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.name}"
        return {
            "containers": self.containers(),
            "networks": run(["docker", "network", "ls", "-q", "--filter", label]).stdout.split(),
            "volumes": run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.split(),
        }
