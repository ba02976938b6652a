"""The fenced code blocks of README.md and docs/*.md, for the tests that hold the docs true.

Three kinds of block claim an output, and a test runs each of them:

- ```` ```pycon ````: a Python session written as doctest (`>>>`, `...`, then the output);
- ```` ```console ````: shell commands, each on a line that starts with `$ ` (a line ending
  with `\\` goes on to the next), each followed by what it prints (stdout and stderr);
- in both, `...` in an output stands for any text (doctest's ELLIPSIS): ids, timestamps.

A ```` ```python file=NAME.py ```` block is a file the reader saves (a task module a
guide's dispatcher loads): the docs test writes each into the working folder of its
dispatcher, which imports those modules (`BROOK_TASKS`), so the blocks that use them run
against exactly the code the page shows.

Every other block only illustrates: ```` ```python ```` blocks must still parse, and no
other block may look like one that claims an output (a `$ ` prompt, a `>>>`).
"""

from __future__ import annotations

import doctest
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
CHECKER = doctest.OutputChecker()
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass(frozen=True, kw_only=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    file: str | None = None  # `python file=NAME.py`: a file the reader saves


    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True, kw_only=True)
class Command:
    line: int  # in the markdown file, 1-based
    command: str
    expected: str


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse_blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    opened: tuple[int, str, str, str, str | None] | None = None  # line, indent, fence, lang, file
    body: list[str] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if opened is None:
            if m:
                lang, *options = m["info"].split() or [""]
                files = [o.removeprefix("file=") for o in options if o.startswith("file=")]
                opened, body = (n, m["indent"], m["fence"], lang, files[0] if files else None), []
            continue
        start, indent, fence, lang, file = opened
        if m and m["fence"] == fence and not m["info"].strip():
            text = "\n".join(body) + "\n"
            found.append(Block(path=path, line=start, lang=lang, text=text, file=file))
            opened = None
        else:
            body.append(line.removeprefix(indent))
    if opened is not None:
        raise ValueError(f"{path.relative_to(ROOT)}:{opened[0]}: a code block is never closed")
    return found


def all_blocks(*langs: str) -> list[Block]:
    blocks = [b for path in doc_files() for b in parse_blocks(path)]
    return [b for b in blocks if not langs or b.lang in langs]


def saved_files() -> dict[str, Block]:
    """The files the docs have the reader save (`python file=NAME.py`), by name: each name
    once across the docs."""
    files: dict[str, Block] = {}
    for block in all_blocks("python"):
        if block.file is None:
            continue
        if block.file in files:
            raise ValueError(f"{block.where}: {block.file} is saved by {files[block.file].where}")
        if not block.file.endswith(".py") or not block.file[:-3].isidentifier():
            raise ValueError(f"{block.where}: file={block.file}: a module name, NAME.py")
        files[block.file] = block
    return files


def console_commands(block: Block) -> list[Command]:
    """The `$ ` commands of a console block, each with the output it claims."""
    commands: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"{block.where}: output before the first `$ ` command")
        start = i
        parts = [lines[i][2:]]
        while parts[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            parts.append(lines[i])
        i += 1
        out: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            out.append(lines[i])
            i += 1
        expected = "\n".join(out).strip("\n")
        commands.append(
            Command(
                line=block.line + 1 + start,
                command="\n".join(parts),
                expected=expected + "\n" if expected else "",
            )
        )
    return commands


def output_matches(expected: str, got: str) -> bool:
    return CHECKER.check_output(expected, got, OPTIONS)


def doctest_of(block: Block) -> doctest.DocTest:
    return doctest.DocTestParser().get_doctest(
        block.text, {}, block.where, str(block.path), block.line
    )
