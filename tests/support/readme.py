"""The README's code as the tests run it: its fenced blocks, and the "Your first image" file.

Why read it from the README: a test of a copy would pass while the README drifts from the API
(issue 33: its model operator example wrote a repository Triton refused). The tests run what a
reader copies.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tests.support.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
FIRST_IMAGE = "Your first image"


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, code, the ``##`` section it is in, and its line."""

    language: str
    code: str
    section: str
    line: int


def blocks(path: Path = README) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    found, section, fence = [], "", None
    lines: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if fence is None and line.startswith("## "):
            section = line[3:].strip()
        elif fence is None and line.startswith("```"):
            fence, lines = (line[3:].strip(), number), []
        elif fence is not None and line.startswith("```"):
            found.append(Block(fence[0], "\n".join(lines) + "\n", section, fence[1]))
            fence = None
        elif fence is not None:
            lines.append(line)
    return found


def python_blocks() -> list[Block]:
    return [block for block in blocks() if block.language == "python"]


def first_image_file() -> tuple[str, str]:
    """The walk-through's pipeline file: its name (from the block's first comment), its code."""
    (block,) = [b for b in python_blocks() if b.section == FIRST_IMAGE]
    first = block.code.splitlines()[0]
    assert first.startswith("# ") and first.endswith(".py"), first
    return first[2:].strip(), block.code


def first_image_commands() -> list[list[str]]:
    """The walk-through's commands, comments dropped, as argument lists."""
    (block,) = [b for b in blocks() if b.section == FIRST_IMAGE and b.language == "bash"]
    return [shlex.split(line, comments=True) for line in block.code.splitlines() if line.strip()]


def load_first_image(directory: Path) -> ModuleType:
    """Write the walk-through's file into ``directory`` and import it, as the CLI would (a
    module of its own, not an installed package: its code is pickled by value)."""
    filename, code = first_image_file()
    path = directory / filename
    path.write_text(code)
    name = f"readme_{path.stem}_{abs(hash(str(directory)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
