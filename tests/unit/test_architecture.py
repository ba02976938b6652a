"""The import rule of docs/architecture.md, read from the code.

Brook is one import package, `brook`: the role folders at the repository's top level
(`common/`, `ingest/`, `dispatcher/`, `executor/`) are `brook.common` and so on (the links
in `brook/`), and nothing, product, tests or benchmarks, imports them by any other name. The
roles (`ingest`, `dispatcher`, `executor`) depend on `common` and never on each other, nothing
below the top (`brook` itself: the CLI, the client, the role wiring) imports it, and
`common`'s rooms stand on floors: `domain` at the bottom, then `runtime`, `store`,
`client`; `protocol` needs only `domain`. The dispatcher has three rooms of its own
(`claiming`, `attempts`, `following`) under its top (`dispatcher.py`, `hand_off.py`,
`wiring.py`): a room imports only itself and `wiring`, never another room nor the rest of the
top. An import that points up a floor (or a room that imports a role) fails here, naming the
file and the import."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What each room of `common` may import from `common` (besides itself).
COMMON_FLOORS = {
    "domain": set(),
    "runtime": {"domain"},
    "store": {"domain", "runtime"},
    "client": {"domain", "runtime", "store"},
    "protocol": {"domain"},
}
ROLES = {"ingest", "dispatcher", "executor"}
INTERNAL = ("common", *sorted(ROLES))


def imports_of(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def room_of(name: str) -> tuple[str, str] | None:
    """`brook.common.store.db` -> ("common", "store.db"); `brook.client` or `brook` ->
    ("brook", "client"); None for anything not Brook's."""
    if name != "brook" and not name.startswith("brook."):
        return None
    rest = name.split(".")[1:]
    if rest and rest[0] in INTERNAL:
        return rest[0], ".".join(rest[1:])
    return "brook", ".".join(rest)


def test_brook_is_the_only_name_brooks_code_is_imported_by() -> None:
    """`common`, `ingest`, `dispatcher` and `executor` are not import names of their own:
    installed, only `brook` exists, so an import of `common.x` would work in a checkout and
    break in the wheel (or load an application's own `common`)."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    wrong = [
        f"{path}: {name}"
        for path in tracked
        for name in imports_of(ROOT / path)
        if name.split(".")[0] in INTERNAL
    ]
    assert tracked and not wrong, wrong


def test_the_rooms_of_common_import_only_the_floors_below_them() -> None:
    wrong = []
    for room, allowed in COMMON_FLOORS.items():
        for path in sources(f"common/{room}"):
            for name in imports_of(path):
                where = room_of(name)
                if where is None:
                    continue
                top, rest = where
                upward = top == "common" and rest and rest.split(".")[0] not in {room, *allowed}
                if top != "common" or upward:
                    wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert not wrong, wrong


def test_every_room_of_common_is_on_a_floor() -> None:
    rooms = {p.parent.name for p in (ROOT / "common").glob("*/__init__.py")}
    assert rooms == set(COMMON_FLOORS)


def test_the_roles_never_import_each_other_nor_the_top() -> None:
    wrong = []
    for role in ROLES:
        for path in sources(role):
            for name in imports_of(path):
                where = room_of(name)
                if where is not None and where[0] not in {"common", role}:
                    wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert not wrong, wrong


# The dispatcher's rooms, and its top: the modules that compose the rooms (and may import
# them). A room may import itself and `wiring` (what its parts share), nothing else of the
# dispatcher's.
DISPATCHER_ROOMS = {"claiming", "attempts", "following"}
DISPATCHER_TOP = {"__init__", "dispatcher", "hand_off", "wiring"}
SHARED_BY_ROOMS = {"wiring"}


def test_every_module_of_the_dispatcher_is_in_a_room_or_at_its_top() -> None:
    root = ROOT / "dispatcher"
    rooms = {p.parent.name for p in root.glob("*/__init__.py")}
    assert rooms == DISPATCHER_ROOMS
    stray = [
        str(path.relative_to(ROOT))
        for path in sources("dispatcher")
        if (path.parent == root and path.stem not in DISPATCHER_TOP)
        or (path.parent != root and path.parent.parent != root)
    ]
    assert not stray, stray


def test_the_dispatchers_rooms_import_only_themselves_and_what_they_share() -> None:
    wrong = []
    for room in DISPATCHER_ROOMS:
        for path in sources(f"dispatcher/{room}"):
            for name in imports_of(path):
                where = room_of(name)
                if where is None or where[0] != "dispatcher":
                    continue
                first = where[1].split(".")[0]
                if first not in {room, *SHARED_BY_ROOMS}:
                    wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert not wrong, wrong


def test_the_dispatchers_top_is_what_nothing_in_a_room_imports() -> None:
    """`wiring` imports no room but for the jobs it holds (`claiming.holdings`), which every
    room reads through it; the rooms never import `dispatcher` or `hand_off`."""
    imported = {
        name
        for path in sources("dispatcher/claiming")
        + sources("dispatcher/attempts")
        + sources("dispatcher/following")
        for name in imports_of(path)
    }
    assert not {"brook.dispatcher.dispatcher", "brook.dispatcher.hand_off"} & imported
    wiring = {
        n for n in imports_of(ROOT / "dispatcher/wiring.py") if n.startswith("brook.dispatcher")
    }
    assert wiring <= {"brook.dispatcher.claiming.holdings"}, wiring


# The sizes a newcomer can read in one sitting (docs/development.md).
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 800
PRODUCT = ("common", "ingest", "dispatcher", "executor", "brook")


def test_no_product_function_class_or_module_outgrows_its_room() -> None:
    too_big: list[str] = []
    for package in PRODUCT:
        for path in sources(package):
            text = path.read_text()
            name = path.relative_to(ROOT)
            if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
                too_big.append(f"{name}: {lines} lines (module, at most {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(text, str(path))):
                if isinstance(node, ast.ClassDef):
                    kind, limit = "class", MAX_CLASS_LINES
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind, limit = "function", MAX_FUNCTION_LINES
                else:
                    continue
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit:
                    too_big.append(f"{name}:{node.lineno} {node.name}: {size} lines ({kind})")
    assert too_big == [], "\n".join(too_big)
