"""The code that runs inside Triton loads on every stub Python of the release table (3.8 up).

No Python 3.8 can be installed on this machine (no interpreter downloads), so this is vermin's
static analysis of the minimum version each construct needs (syntax, library calls and their
keyword arguments such as ``zip(strict=)``); annotations are not evaluated at run time
(``from __future__ import annotations``), so they are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import builder.runtime
from builder.base.releases import RELEASES

RUNTIME = Path(builder.runtime.__file__).parent
VERMIN = str(Path(sys.executable).with_name("vermin"))


def test_the_runtime_needs_no_newer_python_than_the_oldest_stub():
    oldest = min((r.python_version for r in RELEASES), key=lambda v: tuple(map(int, v.split("."))))
    assert oldest == "3.8"
    result = subprocess.run(
        [VERMIN, f"-t={oldest}-", "--violations", "--no-tips",
         str(RUNTIME)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_vermin_catches_what_broke_the_runtime_on_3_8(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("pairs = list(zip([1], [2], strict=True))\n")
    result = subprocess.run([VERMIN, "-t=3.8-", "--violations",
                             "--no-tips", str(sample)], capture_output=True, text=True)
    assert result.returncode != 0 and "zip(strict)" in result.stdout


BUILTIN_GENERICS = {"dict", "list", "tuple", "set", "frozenset", "type"}


def test_builtin_generics_appear_only_in_annotations():
    """``dict[str, X]`` evaluated at run time needs 3.9; vermin checks annotations only."""
    for path in RUNTIME.rglob("*.py"):
        tree = ast.parse(path.read_text())
        annotations = set()
        for node in ast.walk(tree):
            for child in (getattr(node, "annotation", None), getattr(node, "returns", None)):
                if child is not None:
                    annotations.update(id(inner) for inner in ast.walk(child))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id in BUILTIN_GENERICS and id(node) not in annotations):
                raise AssertionError(f"{path.name}:{node.lineno}: {ast.unparse(node)} is "
                                     f"evaluated at run time (Python 3.9+)")
