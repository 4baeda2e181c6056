"""Every benchmark imports: a module moved or renamed in ``builder`` breaks ``nox -s bench``,
which CI does not run, so the imports are checked here."""

from __future__ import annotations

import importlib

import pytest

from tests.support.paths import REPO_ROOT

SCRIPTS = sorted(path.stem for path in (REPO_ROOT / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_benchmark_imports(script):
    module = importlib.import_module(f"benchmarks.{script}")
    assert callable(getattr(module, "main", None)), f"benchmarks/{script}.py has no main()"
