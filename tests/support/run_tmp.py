"""The test run's own temp dir, and the check that a passing run leaves nothing of its own
in the system temp dir.

The run's first process (the xdist controller, or the only process of a run without
workers) points `TMPDIR` at a folder of the run's own before pytest picks its base temp
dir and before xdist starts the workers: every process of the run inherits it, so all they
put in a temp dir lands there, whoever makes it:

- pytest's `tmp_path` folders (the replica sets some tests start there; a failed test's
  folder is kept, `tmp_path_retention_policy = "failed"`);
- multiprocessing's `pymp-*` folders: a dispatcher's fork-server listener lives in one,
  and a dispatcher that ends through `os._exit` (every one of them, on any signal) or a
  SIGKILL leaves it behind, one per dispatcher the run starts;
- Chromium's `org.chromium.Chromium.*` profile folders (the dashboard tests);
- pip's build folders (the wheel test), the CLI's captured output, anything else.

`mongod` does not read `TMPDIR`: it put a `mongodb-PORT.sock` in /tmp, which one killed
stays. The embedded set (`brook.replset`) runs with `--nounixsocket`.

The folder is `.brook/tmp/run-PORT-PID` (the run's BROOK_TEST_MONGO_PORT and its first
process), unless that path is too long for the Unix sockets made inside it (108 bytes,
multiprocessing's and Chromium's names included): then a folder of the run's own in the
system temp dir. A passing run removes it at the end; a failing one keeps it for a look,
until a later run starts (which leaves alone the folder of a run still going on).

At the end of a passing run, what the system temp dir gained is checked (`left_behind`):
a `mongodb-PORT.sock` of one of the run's ports is the run's own and fails it. Names the
run's tools make (`pymp-*`, `pytest-of-*`, Chromium's) cannot be told from another
program's by their names: they fail the run under CI (`CI` set, a machine of its own) or
with BROOK_TEST_TMP_CHECK=strict, and are listed otherwise (a shared machine, where other
runs make the same names).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from brook.replset import pid_alive

# A Unix socket's path holds 107 bytes. The longest names the run's processes bind in
# their temp dir: multiprocessing's "/pymp-XXXXXXXX/listener-XXXXXXXX" (32 bytes) and
# Chromium's "/.org.chromium.Chromium.XXXXXX/SingletonSocket" (45).
UNIX_PATH_MAX = 107
SOCKET_NAMES = 48

MONGOD_SOCKET = re.compile(r"mongodb-(\d+)\.sock")
# What the run's tools name the folders and files they make in a temp dir: multiprocessing,
# pytest, Chromium and chromedriver, pip, Brook's own (not `tmp*`: every program's).
TOOL_NAMES = re.compile(r"(pymp-|pytest-of-|\.?org\.chromium\.|scoped_dir|pip-|brook-)")


@dataclass
class RunTmp:
    path: Path  # the run's own temp dir (TMPDIR of every process of the run)
    system: Path  # the system temp dir
    ports: range  # the run's MongoDB ports (their sockets are the run's own)
    before: set[str] = field(default_factory=set)  # the system temp dir's names at the start
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def start(root: Path, base_port: int, workers: int) -> RunTmp:
    """Make the run's temp dir and point TMPDIR (this process's and its children's) at it."""
    system = Path(tempfile.gettempdir())
    home = root / ".brook" / "tmp"
    path = home / f"run-{base_port}-{os.getpid()}"
    if len(str(path)) + SOCKET_NAMES <= UNIX_PATH_MAX:
        _remove_finished_runs(home)
        path.mkdir(parents=True)
    else:
        path = Path(tempfile.mkdtemp(prefix=f"brook-test-{base_port}-", dir=system))
    before = set(os.listdir(system))
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = None  # computed again from TMPDIR: pytest's base temp dir goes there
    ports = range(base_port, base_port + 100 * max(workers, 1))
    return RunTmp(path=path, system=system, ports=ports, before=before)


def finish(run: RunTmp, *, strict: bool) -> None:
    """At the end of a passing run: remove the run's temp dir, then record in `problems`
    what the run left in the system temp dir (and in `notes` what it may have left)."""
    if not _remove(run.path):
        kept = sorted(str(p.relative_to(run.path)) for p in run.path.rglob("*"))[:20]
        run.problems.append(f"{run.path}: could not be removed, it holds {kept}")
    for name in left_behind(run):
        where = run.system / name
        if _is_ours(run, name):
            run.problems.append(f"{where}: a MongoDB socket of one of this run's ports")
        elif strict:
            run.problems.append(f"{where}: made during this run (CI or BROOK_TEST_TMP_CHECK=strict)")
        else:
            run.notes.append(str(where))


def left_behind(run: RunTmp) -> list[str]:
    """What the system temp dir gained during the run that the run may have made: sockets
    of MongoDB and the names its tools give to what they make. The rest (another program's)
    is not the run's business."""
    try:
        now = set(os.listdir(run.system))
    except OSError:
        return []
    new = now - run.before
    return sorted(n for n in new if MONGOD_SOCKET.fullmatch(n) or TOOL_NAMES.match(n))


def _is_ours(run: RunTmp, name: str) -> bool:
    match = MONGOD_SOCKET.fullmatch(name)
    return match is not None and int(match.group(1)) in run.ports


def _remove_finished_runs(home: Path) -> None:
    """The folders of failed runs that have ended (kept for a look until the next run); a
    run still going on (another run of the same checkout, say of the unit tests) keeps its
    folder."""
    for old in home.glob("run-*-*"):
        pid = old.name.rsplit("-", 1)[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def _remove(path: Path, attempts: int = 20) -> bool:
    """rmtree, again while a process that is dying still writes in it (for up to 2 s)."""
    for _ in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return True
        time.sleep(0.1)
    return False
