"""The docs without a database: every block parses, every block that claims an output is in a
form `tests/e2e/test_docs.py` runs, every example imports from `brook`, every link lands."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import brook
import brook.errors
from tests.support.docblocks import (
    ROOT,
    Block,
    all_blocks,
    console_commands,
    doc_files,
    doctest_of,
    parse_blocks,
)

# The names a reader may import from `brook`, the one public import.
PUBLIC = set(brook.__all__)
# An import of an internal package, by its old top-level name or under `brook`.
INTERNAL_IMPORT = (
    r"^\s*(?:>>> )?(?:from|import) (?:brook\.)?(?:executor|common|ingest|dispatcher)\b.*$"
)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def test_readme_stays_a_short_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_every_code_block_is_closed(path: Path) -> None:
    parse_blocks(path)  # raises, naming the line, when a fence is never closed


def test_there_are_blocks_that_claim_an_output() -> None:
    assert all_blocks("console") and all_blocks("pycon")


@pytest.mark.parametrize("block", all_blocks("python"), ids=lambda b: b.where)
def test_python_block_parses(block: Block) -> None:
    ast.parse(block.text, filename=block.where)
    assert ">>>" not in block.text, "a Python session claims its output: write it as pycon"


@pytest.mark.parametrize("block", all_blocks("pycon"), ids=lambda b: b.where)
def test_python_session_parses_and_claims_an_output(block: Block) -> None:
    test = doctest_of(block)
    assert test.examples, f"{block.where}: no `>>>` example"
    for example in test.examples:
        compile(example.source, block.where, "single")
    assert any(e.want.strip() for e in test.examples), f"{block.where}: claims no output"


@pytest.mark.parametrize("block", all_blocks("console"), ids=lambda b: b.where)
def test_console_block_claims_an_output_a_reader_can_check(block: Block) -> None:
    commands = console_commands(block)
    assert commands
    claimed = "".join(c.expected for c in commands)
    # Placeholders stand for ids and times; something real must be left to compare.
    assert claimed.replace("...", "").strip(), f"{block.where}: claims nothing but `...`"


@pytest.mark.parametrize(
    "block", [b for b in all_blocks() if b.lang not in ("console", "pycon")], ids=lambda b: b.where
)
def test_an_illustration_does_not_look_like_a_claimed_output(block: Block) -> None:
    lines = block.text.splitlines()
    assert not any(line.startswith(("$ ", ">>> ")) for line in lines), (
        f"{block.where}: a prompt claims an output: make it a console or pycon block"
    )


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_examples_import_the_public_api_from_brook(path: Path) -> None:
    text = path.read_text()
    assert "from executor import" not in text
    for names in re.findall(r"from brook import ([\w, ]+)", text):
        unknown = {n.strip() for n in names.split(",")} - PUBLIC - {""}
        assert not unknown, f"{path.name}: `brook` has no {sorted(unknown)}"
    for names in re.findall(r"from brook\.errors import ([\w, ]+)", text):
        unknown = {n.strip() for n in names.split(",")} - set(brook.errors.__all__) - {""}
        assert not unknown, f"{path.name}: `brook.errors` has no {sorted(unknown)}"
    internal = re.findall(INTERNAL_IMPORT, text, re.MULTILINE)
    assert not internal, f"{path.name}: an example imports Brook's internals: {internal}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    seen: dict[str, int] = {}
    anchors = set()
    in_block = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_every_link_lands_on_a_file_and_heading(path: Path) -> None:
    for m in LINK.finditer(path.read_text()):
        target = m["target"]
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to check
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        assert dest.exists(), f"{path.name}: link to a missing {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{path.name}: no heading `#{anchor}` in {dest.name}"
