"""Every regular expression that validates a whole value is matched whole.

`re.match` with `^...$` takes `"valid\\n"`: `$` also matches before a trailing newline. So
each validating pattern of Brook's code (a compiled one, or a pydantic `pattern=`) is found
here by reading the source, must be used with `fullmatch` only, and is checked through the
validator that uses it: a good value passes, the same value with a trailing newline is
refused (or stripped, never kept). A new pattern fails the census until it has a check.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from fastapi import HTTPException
from pydantic import TypeAdapter, ValidationError

from brook.common.domain.bulk import validate_bulk
from brook.common.domain.errors import BrookError
from brook.common.domain.models import is_queue_name
from brook.common.domain.output import parse_position
from brook.common.domain.queues import validate_queue_update
from brook.common.domain.quota_specs import check_quota_name
from brook.common.domain.schedules import Schedule
from brook.common.domain.steps import check_signal_key
from brook.common.domain.triggers import Trigger
from brook.common.domain.validation import SubmitJob
from brook.common.runtime.settings import load_settings, parse_queues
from brook.ingest.fields import parse_include
from brook.ingest.routes.jobs import list_jobs
from brook.ingest.routes.quotas import get_quota

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("brook", "common", "ingest", "dispatcher", "executor")
Site = tuple[str, str]  # (file, the compiled pattern's name or the `pattern=` expression)


def _sources() -> list[Path]:
    links = {ROOT / "brook" / name for name in PACKAGES[1:]}
    files = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not any(link in path.parents for link in links):
                files.append(path)
    return files


def _compiled_names(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level `NAME = re.compile(<pattern>)`: name -> the pattern's expression."""
    names = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "re.compile"
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node.value.args[0]
    return names


def census() -> tuple[set[Site], list[str]]:
    """The validating sites, and every use of one that is not `fullmatch`."""
    sites: set[Site] = set()
    misuses: list[str] = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(), rel)
        compiled = _compiled_names(tree)
        for name, expr in compiled.items():
            if not isinstance(expr, ast.Constant) or str(expr.value).startswith("^"):
                sites.add((rel, name))  # anchored, or a named constant (QUEUE_NAME)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = ast.unparse(node.func)
            if func in ("re.match", "re.search"):
                misuses.append(f"{rel}:{node.lineno}: {func}")
            if (
                isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in compiled
                and node.func.attr in ("match", "search")
                and (rel, node.func.value.id) in sites
            ):
                misuses.append(f"{rel}:{node.lineno}: {func}")
            sites.update((rel, ast.unparse(kw.value)) for kw in node.keywords if kw.arg == "pattern")
    return sites, misuses


def _trigger(**fields: Any) -> Trigger:
    return Trigger.declare(
        **{"name": "t", "collection": "orders", "task": "noop", **fields}
    )


def _route_query(value: str) -> str:
    queue = get_type_hints(list_jobs, include_extras=True)["queue"]
    return str(TypeAdapter(queue).validate_python(value))


def _quota_path(value: str) -> str:
    name = get_type_hints(get_quota, include_extras=True)["name"]
    return str(TypeAdapter(name).validate_python(value))


def _position(value: str) -> str:
    found = parse_position(value)
    if found is None:
        raise ValueError(f"no position: {value!r}")
    return value


def _include(value: str) -> str:
    try:
        parse_include(value)
    except HTTPException as exc:  # the API's 400
        raise ValueError(exc.detail) from None
    return value


# Site -> (a validator that returns the value it accepted, a good value). A value with a
# newline among its characters on purpose (MongoDB allows it in a collection's name) is
# marked: there the check is a `$` instead.
CHECKS: dict[Site, tuple[Callable[[str], object], str]] = {
    ("common/domain/steps.py", "SIGNAL_KEY"): (check_signal_key, "order-42:paid"),
    ("common/domain/triggers.py", "NAME"): (lambda v: _trigger(name=v).name, "orders.paid"),
    ("common/domain/triggers.py", "COLLECTION"): (
        lambda v: (_trigger(collection=v).collection, _trigger(db=v).db),
        "orders",
    ),
    ("common/domain/schedules.py", "NAME"): (
        lambda v: Schedule.declare(v, "* * * * *", task="noop").name,
        "nightly",
    ),
    ("common/domain/models.py", "_QUEUE_NAME"): (
        lambda v: (
            v if is_queue_name(v) else None,
            _trigger(queue=v).queue,
            Schedule.declare("s", "* * * * *", task="noop", queue=v).queue,
        ),
        "emails",
    ),
    ("common/domain/queues.py", "_QUEUE_NAME"): (
        lambda v: (validate_queue_update(v, {"paused": True}), v)[1],
        "emails",
    ),
    ("common/runtime/settings.py", "_QUEUE_NAME"): (
        lambda v: list(parse_queues(f"{v}:2") or {}),
        "emails",
    ),
    ("common/runtime/settings.py", "'^[A-Za-z0-9_-]+$'"): (
        lambda v: load_settings(db=v).db,
        "brook",
    ),
    ("common/domain/bulk.py", "QUEUE_NAME"): (lambda v: validate_bulk({"queue": v})[0], "emails"),
    ("common/domain/validation.py", "QUEUE_NAME"): (
        lambda v: SubmitJob(task="noop", queue=v).queue,
        "emails",
    ),
    ("ingest/routes/jobs.py", "QUEUE_NAME"): (_route_query, "emails"),
    ("common/domain/output.py", "_POSITION"): (_position, "2-17"),
    ("common/domain/quota_specs.py", "_QUOTA_NAME"): (check_quota_name, "openai:gpt-4o"),
    ("ingest/routes/quotas.py", "QUOTA_NAME"): (_quota_path, "openai:gpt-4o"),
    ("ingest/fields.py", "_INCLUDE"): (_include, "payload, result"),
}
NEWLINE_ALLOWED = {("common/domain/triggers.py", "COLLECTION")}
REFUSED = (BrookError, ValueError, ValidationError)


def test_every_validating_pattern_is_matched_whole_and_has_a_check() -> None:
    sites, misuses = census()
    assert misuses == [], "use fullmatch for a pattern that validates a whole value"
    assert sites == set(CHECKS), "a validating pattern without its check here (or gone)"


def _kept(accepted: object, char: str) -> bool:
    """Whether `char` survived in what the validator accepted (strings, or tuples of them)."""
    return repr(char)[1:-1] in repr(accepted)


@pytest.mark.parametrize("site", sorted(CHECKS), ids=lambda s: f"{s[0]}:{s[1]}")
def test_a_good_value_passes_and_with_a_trailing_newline_it_is_refused(site: Site) -> None:
    validate, good = CHECKS[site]
    char = "$" if site in NEWLINE_ALLOWED else "\n"
    assert not _kept(validate(good), char)
    try:
        accepted = validate(good + char)
    except REFUSED:
        return
    assert not _kept(accepted, char), (site, accepted)

