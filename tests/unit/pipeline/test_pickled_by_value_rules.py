"""The rules for the builder's own code that ``pipe.pickle`` carries by value, read from the
modules it carries.

The serving environment has no ``builder`` installed: the pipeline's classes and functions
travel by value, with their modules' globals. So in those modules: torch is imported inside the
functions that run a module in process, never at module level (the served pipeline model needs
no torch); no module-level set (a set of strings pickles in an order that changes with each
process's hash seed, and two builds of one pipeline would make two images); no ``lru_cache`` /
``cache`` (a cached function pickles by reference, to a module that is not there).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import builder
from builder.pipeline.operators import BlsTarget
from builder.pipeline.serialization import dumps
from pipelines.image_classification import pipeline as image_classification
from pipelines.text_recognizer import pipeline as text_recognizer

ROOT = Path(builder.__file__).parent


def _carried_modules() -> list[str]:
    """The builder modules whose code the examples' ``pipe.pickle`` carries (their names
    appear in it; those of the pipeline package and the error root)."""
    found = set()
    for pipeline in (image_classification, text_recognizer):
        targets = {op.name: BlsTarget(op.name, "onnx", op.input_names, (), 8)
                   for op in pipeline.model_ops()}
        payload, _ = dumps(pipeline, targets)
        found.update(name.decode() for name in re.findall(rb"builder(?:\.[a-z_]+)+", payload))
    return sorted(name for name in found if name == "builder.errors" or (
        name.startswith("builder.pipeline.") and _path(name).exists()))


def _path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")


CARRIED = _carried_modules()


def test_the_modules_carried_are_found():
    assert {"builder.errors", "builder.pipeline.operators", "builder.pipeline.executor",
            "builder.pipeline.user_code", "builder.pipeline.rejection"} <= set(CARRIED)


def _violations(source: ast.Module) -> list[str]:
    found = []
    for statement in source.body:
        imports = ([alias.name for alias in statement.names] if isinstance(statement, ast.Import)
                   else [statement.module or ""] if isinstance(statement, ast.ImportFrom)
                   else [])
        if any(name == "torch" or name.startswith("torch.") for name in imports):
            found.append(f"line {statement.lineno}: torch imported at module level")
        value = (statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign))
                 else None)
        if isinstance(value, (ast.Set, ast.SetComp)) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("set", "frozenset")):
            found.append(f"line {statement.lineno}: a set at module level")
    for node in ast.walk(source):
        for decorator in getattr(node, "decorator_list", ()):
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in ("lru_cache", "cache", "cached_property"):
                found.append(f"line {decorator.lineno}: @{name}")
    return found


@pytest.mark.parametrize("module", CARRIED)
def test_code_pickled_by_value_follows_the_rules(module):
    assert _violations(ast.parse(_path(module).read_text())) == []


def test_the_rules_catch_what_they_forbid():
    bad = ast.parse("import torch\nNAMES = {'a', 'b'}\nKINDS = frozenset(('x',))\n"
                    "import functools\n@functools.lru_cache\ndef f():\n    import torch\n")
    assert _violations(bad) == ["line 1: torch imported at module level",
                                "line 2: a set at module level", "line 3: a set at module level",
                                "line 5: @lru_cache"]
