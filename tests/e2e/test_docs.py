"""The docs cannot drift: every block of README.md and docs/*.md that claims an output is run
against a real API and dispatcher on the test replica set, and its output compared.

The forms are in `tests/support/docblocks.py`. Console blocks address the API as the docs
do (`localhost:8000`, the default); the test points that at its own API process, and runs
`brook` and `python3` from the interpreter running the tests.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from brook.common.runtime.settings import Settings
from brook.testing.model_api import ModelAPI
from tests.conftest import set_of
from tests.e2e.conftest import Cluster
from tests.support.docblocks import (
    OPTIONS,
    Block,
    all_blocks,
    console_commands,
    doctest_of,
    output_matches,
    saved_files,
)

# Every block on one worker, in the order pytest collects them (console blocks, then Python
# sessions), against one cluster, as a reader runs them: a guide's later block may use what an
# earlier one set (a quota, a queue's limits), which a cluster on another worker would lack.
pytestmark = pytest.mark.xdist_group("docs")

DOCS_API = "localhost:8000"
MARK = "@@docs-command-{}@@"
MARK_RE = re.compile(r"@@docs-command-(\d+)@@\n")  # curl ends without a newline


@pytest.fixture(scope="module")
def docs_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One API and one dispatcher for every block, as a reader has one `make up` for all:
    the blocks are written so that one's jobs never change another's output."""
    tmp = tmp_path_factory.mktemp("docs")
    settings = Settings(
        mongo_uri=set_of(request).uri,
        db=f"t_docs_{uuid.uuid4().hex[:8]}",
        concurrency=2,
        lease_seconds=5.0,
        sweep_seconds=1.0,
        shutdown_grace_seconds=2.0,
        home=tmp / "home",
    )
    cluster = Cluster(settings, tmp)
    # The files the guides have the reader save, in the dispatcher's folder, and the model
    # API stand-in they call (a reader starts it as the guide says; here on a port of its own).
    app = tmp / "app"
    app.mkdir()
    files = saved_files()
    for name, block in files.items():
        (app / name).write_text(block.text)
    env = cluster.env()
    modules = [env["BROOK_TASKS"], *(name.removesuffix(".py") for name in sorted(files))]
    with ModelAPI(tokens=20, seconds=0.5, tpm=200_000).running() as model:
        try:
            cluster.api()
            cluster.dispatcher(
                BROOK_TASKS=",".join(modules),
                PYTHONPATH=os.pathsep.join([str(app), env["PYTHONPATH"]]),
                MODEL_API_URL=model.url,
            )
            yield cluster
        finally:
            cluster.close()


def run_console_block(block: Block, cluster: Cluster, cwd: Path) -> list[str]:
    """Run a console block's commands in one shell, as a reader would type them (so a
    variable set by one is seen by the next); return a report per mismatched output."""
    commands = console_commands(block)
    api = f"127.0.0.1:{cluster.port}"
    script = ["set -u"]
    for i, c in enumerate(commands):
        script += [f"printf '%s\\n' '{MARK.format(i)}'", f"{{ {c.command.replace(DOCS_API, api)}\n}}"]
    env = cluster.env()
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # what a terminal shows: both, in the order written
        text=True,
        timeout=120,
    )
    outputs: dict[int, str] = {}
    pieces = MARK_RE.split(done.stdout)[1:]  # index, output, index, output, ...
    for index, text in zip(pieces[::2], pieces[1::2], strict=True):
        outputs[int(index)] = text
    failures = []
    for i, c in enumerate(commands):
        got = outputs.get(i)
        if got is None:
            failures.append(f"{block.where}: line {c.line} never ran:\n{done.stdout}")
        elif not output_matches(c.expected, got):
            failures.append(
                f"{block.path.name}:{c.line}: $ {c.command}\n"
                f"--- the docs claim:\n{c.expected}--- it printed:\n{got}"
            )
    return failures


@pytest.mark.parametrize("block", all_blocks("console"), ids=lambda b: b.where)
def test_console_block_prints_what_the_docs_claim(
    block: Block, docs_cluster: Cluster, tmp_path: Path
) -> None:
    if "curl " in block.text and shutil.which("curl") is None:
        pytest.fail(f"{block.where} calls curl, which is not installed (apt-get install curl)")
    failures = run_console_block(block, docs_cluster, tmp_path)
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("block", all_blocks("pycon"), ids=lambda b: b.where)
def test_python_session_prints_what_the_docs_claim(
    block: Block, docs_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("BROOK_") and not name.startswith("BROOK_TEST_"):
            monkeypatch.delenv(name)
    # What `make up` gives a reader's `Client()`: Brook's deployment through the environment.
    monkeypatch.setenv("BROOK_MONGO_URI", docs_cluster.settings.mongo_uri or "")
    monkeypatch.setenv("BROOK_DB", docs_cluster.settings.db)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    # A reader's interpreter has not configured Brook's logging; a test run earlier in this
    # process may have, and then each submit would print its log line into the session.
    configured = structlog.get_config() if structlog.is_configured() else None
    structlog.reset_defaults()
    try:
        result = runner.run(doctest_of(block), out=report.append, clear_globs=True)
    finally:
        if configured is not None:
            structlog.configure(**configured)
    assert result.attempted > 0
    assert result.failed == 0, "".join(report)
