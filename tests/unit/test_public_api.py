"""`brook` is the one public import: task modules and applications need nothing else, it
sits above the internal packages (none of which imports it), and importing it starts
nothing."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import brook
import brook.executor
from brook.common.domain import errors

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = ("common", "ingest", "dispatcher", "executor")


def test_a_task_module_and_an_application_need_only_brook() -> None:
    from brook import (  # noqa: F401
        AsyncClient,
        Client,
        Job,
        JobStatus,
        Retry,
        SyncTaskContext,
        TaskContext,
        schedule,
        task,
        trigger,
    )

    for name in brook.executor.__all__:  # the same objects as the internal package's
        assert getattr(brook, name) is getattr(brook.executor, name)


def test_every_public_error_is_exported_by_brook() -> None:
    public = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.BrookError)
    }
    assert public <= set(brook.__all__), public - set(brook.__all__)
    assert all(getattr(brook, name) is getattr(errors, name) for name in public)


def _in_top(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "brook" and len(parts) > 1 and parts[1] not in INTERNAL


def _imports_brook(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "brook" or _in_top(n) for n in names):
            lines.append(node.lineno)
    return lines


def test_no_internal_package_imports_the_top() -> None:
    """The floors below the top import each other as `brook.common...` and so on, never the
    top itself (`brook`, `brook.client`, `brook.cli`, ...)."""
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for package in INTERNAL
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in _imports_brook(path)
    }
    assert not found, f"the floors below `brook` import it: {sorted(found)}"


def test_importing_brook_or_a_task_module_starts_nothing() -> None:
    """In a fresh interpreter, as a worker process would: a task module that imports
    `brook` loads without a cycle, and no thread (a MongoDB client's monitors) is started,
    nor the CLI, the API or the dispatcher imported."""
    probe = (
        "import sys, threading\n"
        "import tests.tasks.public_api, tests.tasks.basic, brook\n"
        "from brook.executor.registry import registered\n"
        "assert {'public_add', 'public_relay', 'flaky'} <= registered(), registered()\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "heavy = [m for m in ('brook.cli', 'brook.ingest.app', 'brook.dispatcher.dispatcher', 'uvicorn')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_every_package_is_installed_by_a_plain_pip_install() -> None:
    """The image runs `pip install .`: a package setuptools does not find, such as
    `brook.cli` once was, would leave the console script broken there."""
    import tomllib

    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    listed = set(find_packages(str(ROOT), include=include))
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "brook").rglob("__init__.py")}
    found |= {
        ".".join(("brook", *init.parent.relative_to(ROOT).parts))
        for top in INTERNAL
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert "brook.common.store.jobs" in found
    assert found <= listed, sorted(found - listed)
    assert {name.split(".")[0] for name in listed} == {"brook"}, sorted(listed)


def test_every_public_name_is_loaded_on_first_use_and_importing_brook_loads_none() -> None:
    import brook as package

    assert set(package.__all__) == set(package._HOME)
    code = (
        "import sys, brook, brook.cli; "
        "print(sorted(m for m in ('pymongo', 'brook.client', 'brook.executor.registry') if m in sys.modules)); "
        "from brook import Client, task, Job; print(Client.__module__, task.__module__, Job.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "brook.client brook.executor.registry Job"], out.stdout
    try:
        package.NoSuchThing  # noqa: B018
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("an unknown name must raise AttributeError")
