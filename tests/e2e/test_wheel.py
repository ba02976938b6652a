"""Brook as a user gets it: a wheel built from this checkout, installed in a fresh
virtualenv, used from an application folder whose own packages are called `common`,
`executor`, `dispatcher` and `ingest` (the names of Brook's role folders, which once were
import names of their own and broke such an application).

How the fresh virtualenv is made, cheaply and without the network:

- the wheel is built once for the module from a copy of the checkout (nothing is written
  into the checkout), with `pip wheel --no-deps --no-build-isolation --no-index`: the test
  run's own setuptools builds it (`setuptools>=77` is in the `test` extra), so no build
  environment is downloaded;
- `python -m venv --without-pip` makes a clean environment, and the test run's pip installs
  the wheel into it with `--no-deps` (`pip --python`); the console script `brook` is the
  wheel's own;
- Brook's third-party dependencies come from the test run's site-packages through one
  `.pth` file in the fresh environment. A path in a `.pth` file is appended to `sys.path`
  after the environment's own site-packages, and the `.pth` files inside that path are not
  run, so the test run's editable install of the checkout (an import hook that a `.pth`
  file there installs) is not active in the fresh environment: `brook` is imported from the
  wheel, which the tests assert (`brook.__file__` and `brook.common.__file__`). Installing
  the dependencies themselves would need the network or a wheelhouse of about 60 wheels.

All of it runs in one xdist worker (one build), in about 15 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from brook.common.runtime.settings import Settings
from tests.conftest import ROOT
from tests.e2e.conftest import free_port
from tests.support.http import TLS
from tests.support.procs import pid_alive, wait_until

pytestmark = [pytest.mark.xdist_group("wheel"), pytest.mark.timeout(300)]

# What a build copies of the checkout: everything but caches, environments, local state and
# earlier builds (a copy of all the rest, so a package the `include` list would let in is
# not hidden from the build).
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".brook", ".venv", "__pycache__", "build", "dist", "*.egg-info", ".*_cache"
)

# The application: its own packages named as Brook's role folders, each with a module Brook
# does not have, and a task module that registers a task and imports them.
APP = {
    "common/__init__.py": "",
    "common/domain.py": 'def greet(name):\n    return f"hello, {name}"\n',
    "executor/__init__.py": "",
    "executor/pool.py": "SIZE = 3\n",
    "dispatcher/__init__.py": "",
    "dispatcher/routes.py": 'ROUTES = ("a", "b")\n',
    "ingest/__init__.py": "",
    "ingest/feeds.py": 'FEEDS = ["rss"]\n',
    # Found only from the working directory; it fails on import, so a role stops at once.
    "found_here.py": 'raise RuntimeError("found in the application folder")\n',
    "tasks.py": '''\
import sys

import brook
from brook import Retry, task

import common.domain
import dispatcher.routes
import executor.pool
import ingest.feeds


@task("app.greet")
def greet(payload):
    if not payload.get("name"):
        raise Retry("no name yet")
    return {
        "greeting": common.domain.greet(payload["name"]),
        "routes": list(dispatcher.routes.ROUTES),
        "size": executor.pool.SIZE,
        "feeds": ingest.feeds.FEEDS,
        "modules": {
            name: sys.modules[name].__file__
            for name in ("common", "executor", "dispatcher", "ingest", "brook", "brook.common")
        },
    }
''',
}

IMPORTS = """\
import json, sys
from brook import Client, Retry, task
import brook, brook.common, common.domain, dispatcher.routes, executor.pool, ingest.feeds

print(json.dumps({
    "names": [Client.__name__, Retry.__name__, task.__name__],
    "greeting": common.domain.greet("app"),
    "modules": {
        name: sys.modules[name].__file__
        for name in ("common", "executor", "dispatcher", "ingest", "brook", "brook.common")
    },
}))
"""

SUBMIT = """\
import json
from brook import Client

with Client() as client:  # BROOK_MONGO_URI and BROOK_DB
    job = client.submit("app.greet", {"name": "wheel"})
    done = client.wait(job.id, timeout=60)
    print(json.dumps({"status": str(done.status), "result": done.result}))
"""


@dataclass
class Installed:
    wheel: Path
    venv: Path
    site: Path  # the fresh environment's site-packages
    app: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """An environment as a user's shell in the application folder has: the fresh
        environment first on PATH, and nothing of the test run's (no PYTHONPATH, no
        BROOK_*)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("BROOK_", "PYTHON", "VIRTUAL_ENV"))
        }
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        env.update(extra)
        return env

    def run(self, *argv: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`ARGV...` in the application folder, run to its end, its output captured."""
        return subprocess.run(
            [str(a) for a in argv],
            cwd=self.app,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _check(argv: list[str | Path], **kwargs: Any) -> None:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=180, **kwargs
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tools = metadata.version("setuptools")
    if int(tools.split(".")[0]) < 77:
        pytest.fail(
            f"setuptools {tools} cannot build Brook (pyproject.toml needs >=77, for its"
            " license field): `make install` installs the test extra, which has it"
        )
    base = tmp_path_factory.mktemp("wheel")
    source, dist, venv, app = base / "source", base / "dist", base / "venv", base / "app"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_COPIED)
    pip = [sys.executable, "-m", "pip"]
    offline = ["--quiet", "--no-deps", "--no-index"]
    _check([*pip, "wheel", *offline, "--no-build-isolation", "--wheel-dir", dist, source])
    (wheel,) = dist.glob("brook-*.whl")
    _check([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    _check([*pip, "--python", python, "install", *offline, wheel])
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # The third-party dependencies, from the test run's environment (see the docstring).
    (site / "_brook_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for name, text in APP.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text)
    yield Installed(wheel=wheel, venv=venv, site=site, app=app)


def test_the_wheel_installs_one_import_package_brook_with_its_type_marker(
    installed: Installed,
) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = whl.namelist()
        (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        top_level = whl.read(f"{info}/top_level.txt").decode().split()
        record = [line.split(",")[0] for line in whl.read(f"{info}/RECORD").decode().splitlines()]
    assert top_level == ["brook"]
    outside = sorted({p.split("/")[0] for p in record if p.split("/")[0] not in ("brook", info)})
    assert outside == [], f"the wheel installs more than `brook`: {outside}"
    assert "brook/py.typed" in names
    # The role folders are in it, below `brook` (the links in brook/ were followed).
    for role in ("common", "ingest", "dispatcher", "executor"):
        assert f"brook/{role}/__init__.py" in names, role
    # What landed in the fresh site-packages: `brook`, its dist-info, and our .pth file.
    landed = sorted(p.name for p in installed.site.iterdir() if p.name != "__pycache__")
    assert landed == ["_brook_test_dependencies.pth", "brook", info], landed


def test_an_application_with_its_own_common_executor_dispatcher_and_ingest_imports_brook(
    installed: Installed,
) -> None:
    done = installed.run(installed.python, "-c", IMPORTS)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["names"] == ["Client", "Retry", "task"]
    assert out["greeting"] == "hello, app"
    _from_the_app_and_the_wheel(out["modules"], installed)


def test_brook_version_prints_the_wheels_version(installed: Installed) -> None:
    version = installed.wheel.name.split("-")[1]
    done = installed.run(installed.venv / "bin" / "brook", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"brook {version}"


def test_the_brook_script_imports_task_modules_from_its_working_directory(
    installed: Installed,
) -> None:
    """The console script's own process (`brook api`, `brook dispatcher`) finds BROOK_TASKS in
    the folder it starts in; `brook up`'s roles run as `python -m brook.cli`, which would
    find it anyway, so this is checked apart. The module raises once imported: the API
    stops before it connects to anything, naming it and the reason."""
    done = subprocess.run(
        [installed.venv / "bin" / "brook", "api"],
        cwd=installed.app,
        env=installed.env(
            BROOK_TASKS="found_here",
            BROOK_MONGO_URI="mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "brook: error: BROOK_TASKS: cannot import 'found_here': found in the application folder"
    )


@pytest.mark.timeout(240)  # its own waits: 60 + 60 + 90 + 40 s
def test_brook_up_in_the_application_folder_runs_its_task_and_ctrl_c_leaves_nothing(
    installed: Installed, settings: Settings, tmp_path: Path
) -> None:
    """`brook up` from the fresh environment, in the application folder, with
    BROOK_TASKS=tasks and the suite's replica set: a job submitted with the application's
    `Client` completes with the result of the folder's task, which imported the folder's
    own `common` (and the other three) in a worker process."""
    port = free_port()
    env = installed.env(
        BROOK_MONGO_URI=settings.mongo_uri or "",
        BROOK_DB=settings.db,
        BROOK_TASKS="tasks",
        BROOK_API_PORT=str(port),
        BROOK_HOME=str(tmp_path / "home"),
        BROOK_CONCURRENCY="1",
        BROOK_SHUTDOWN_GRACE_SECONDS="1",
        # A temp dir of its own, short enough for the fork server's socket (a deeper one
        # makes the workers start by `spawn`): what its processes leave there is seen below.
        TMPDIR=(temp := tempfile.mkdtemp(prefix="wheel-up-", dir="/tmp")),
    )
    log_path = tmp_path / "up.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below

    def events(name: str) -> list[dict[str, Any]]:
        lines = log_path.read_text(errors="replace").splitlines()
        found = (json.loads(x) for x in lines if x.startswith("{"))
        return [e for e in found if e.get("event") == name]

    up = subprocess.Popen(
        [installed.venv / "bin" / "brook", "up"],
        cwd=installed.app,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        try:
            wait_until(lambda: events("up.started"), timeout=60)
            wait_until(lambda: _ok(f"http://127.0.0.1:{port}/readyz"), timeout=60)
            # The dashboard and its assets come from the wheel's own package, not from a
            # folder of the application's that bears a role's name (it has an `ingest`).
            for path, marker in (("/", "<title>"), ("/static/app.js", "function")):
                page = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10, verify=TLS)
                assert page.status_code == 200 and marker in page.text, (path, page.text[:300])
            done = subprocess.run(
                [installed.python, "-c", SUBMIT],
                cwd=installed.app,
                env=env,
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert done.returncode == 0, done.stderr
            out = json.loads(done.stdout)
            assert out["status"] == "completed", out
            result = out["result"]
            assert result["greeting"] == "hello, wheel"
            assert (result["routes"], result["size"], result["feeds"]) == (["a", "b"], 3, ["rss"])
            _from_the_app_and_the_wheel(result["modules"], installed)
            assert events("worker.started"), "no worker started"
            family = _descendants(up.pid)
            assert len(family) >= 3, family  # the API, the dispatcher, its worker(s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n-- brook up's log:\n{_tail(log_path)}") from exc
        up.send_signal(signal.SIGINT)  # Ctrl-C
        assert up.wait(40) == 0, _tail(log_path)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        log.close()
    assert events("up.stopped")
    outlived = {p: _cmdline(p) for p in family if pid_alive(p)}
    assert not outlived, f"a child of brook up outlived it: {outlived}"
    stray = subprocess.run(["pgrep", "-af", str(installed.venv)], capture_output=True, text=True)
    assert stray.stdout.strip() == "", f"still running from the fresh environment:\n{stray.stdout}"
    # The fork server's folder (multiprocessing's `pymp-*`) went with the dispatcher.
    left = sorted(p.name for p in Path(temp).iterdir())
    shutil.rmtree(temp, ignore_errors=True)
    assert left == [], f"brook up left these in its temp dir: {left}"


def _from_the_app_and_the_wheel(modules: dict[str, str], installed: Installed) -> None:
    """The application's packages came from its folder, and Brook from the wheel."""
    for name in ("common", "executor", "dispatcher", "ingest"):
        assert Path(modules[name]) == installed.app / name / "__init__.py", (name, modules)
    assert Path(modules["brook"]) == installed.site / "brook" / "__init__.py", modules
    assert Path(modules["brook.common"]) == installed.site / "brook" / "common" / "__init__.py"


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        out = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True)
        kids = [int(p) for p in out.stdout.split()]
        found += kids
        todo += kids
    return found


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(line[:400] for line in path.read_text(errors="replace").splitlines()[-lines:])


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, verify=TLS).status_code == 200
    except httpx.HTTPError:
        return False


def _cmdline(pid: int) -> str:
    """What process `pid` runs, for a failure's message."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace")
