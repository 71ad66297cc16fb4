"""The README and the documentation pages: every Python snippet runs as written.

Each ```python block of README.md and docs/**/*.md runs on its own, in a fresh namespace (as
`__main__`) in a temporary directory. An HTML comment before a block (then a blank line, which
Markdown needs to end the comment) changes that:

* `<!-- snippet: partial -->`: a fragment on purpose (it names a model, a client or a server
  the reader has); it must still parse, and there are only a few of them;
* `<!-- snippet: needs MODULE... -->`: it runs where those modules import, and is skipped,
  with the reason, where they do not (an extra that is not installed).

The README's shell blocks run toolreg from the virtual environment they create
(`.venv/bin/...`), never through a bare `python` that may not have it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MOST_PARTIAL = 12  # deliberately partial snippets, over every page: keep them few
_FENCE = re.compile(r"^```(\w*)[ \t]*$")
_MARK = re.compile(r"^<!--\s*snippet:\s*(partial|needs\s+[\w. ]+?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # of its opening fence
    language: str
    code: str
    mark: str  # "", "partial" or "needs MODULE ..."

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, each with the snippet mark on the line before it."""
    found = []
    lines = page.read_text(encoding="utf-8").splitlines()
    number = 0
    while number < len(lines):
        fence = _FENCE.match(lines[number])
        if fence is None:
            number += 1
            continue
        end = number + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        before = [line.strip() for line in lines[:number] if line.strip()]
        previous = before[-1] if before else ""  # the mark, then a blank line, then the fence
        mark = _MARK.match(previous)
        code = "\n".join(lines[number + 1 : end]) + "\n"
        found.append(Block(page, number + 1, fence.group(1), code, mark.group(1) if mark else ""))
        number = end + 1
    return found


def python_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page) if block.language == "python"]


RUNNABLE = [block for block in python_blocks() if block.mark != "partial"]
PARTIAL = [block for block in python_blocks() if block.mark == "partial"]


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_each_python_snippet_runs_as_written(
    block: Block,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for module in block.mark.split()[1:]:  # "needs a b": skipped without a or b
        pytest.importorskip(module, reason=f"{block.where} needs {module} (an extra)")
    monkeypatch.chdir(tmp_path)  # a snippet may write files (a result log)
    code = compile(block.code, block.where, "exec")
    exec(code, {"__name__": "__main__"})
    capsys.readouterr()  # what it prints is for a reader


def test_partial_snippets_are_few_and_parse() -> None:
    assert len(PARTIAL) <= MOST_PARTIAL, [block.where for block in PARTIAL]
    for block in PARTIAL:  # a fragment may await at top level, as in an async function
        compile(block.code, block.where, "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)


def test_every_page_is_found_and_has_snippets() -> None:
    assert len(PAGES) > 10 and len(RUNNABLE) > 15
    marks = {block.mark.split()[0] for block in python_blocks() if block.mark}
    assert marks <= {"partial", "needs"}


def test_the_readme_opens_with_the_two_commands_then_a_short_quickstart() -> None:
    first_shell, quickstart = blocks(README)[:2]
    assert first_shell.language == "sh"
    commands = [line for line in first_shell.code.splitlines() if line and line[0] != "#"]
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m toolreg demo",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest",
    ]
    assert quickstart.language == "python" and not quickstart.mark
    assert len(quickstart.code.splitlines()) <= 20
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 260


_WORD = re.compile(r"[^\s'\"]*\b(?:python3?|pip)\b[^\s'\"]*")


def test_readme_shell_blocks_run_toolreg_from_their_virtual_environment() -> None:
    shell = [block for block in blocks(README) if block.language in ("sh", "bash", "console")]
    assert shell
    for block in shell:
        for line in block.code.splitlines():
            command = line.split("#", 1)[0]
            for word in _WORD.findall(command):
                venv = command.startswith("python3 -m venv") and word == "python3"
                assert venv or word.startswith(".venv/bin/"), f"{block.where}: {line}"


def test_every_install_line_names_the_distribution() -> None:
    # `toolreg` on the package index is somebody else's project.
    for page in [*PAGES, ROOT / "CHANGELOG.md"]:
        text = page.read_text(encoding="utf-8")
        wrong = re.findall(r"pip install (?:-[-\w]+ )*['\"]?toolreg(?![-\w])", text)
        assert not wrong, f"{page.relative_to(ROOT)}: {wrong}"
