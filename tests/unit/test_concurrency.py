"""The suite's two workers (``tests/support/concurrency.py``), run for real: pytest-xdist with
two workers on generated modules that record when each test ran."""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.alone  # runs two workers of its own, timed

MODULE = """
import json, os, time
{mark}

def _record(name):
    started = time.monotonic()
    time.sleep(0.6)
    with open(os.environ["SPANS"], "a") as spans:
        spans.write(json.dumps([name, started, time.monotonic()]) + "\\n")

{tests}
"""


def _module(pytester: pytest.Pytester, name: str, alongside: bool | None, count: int = 2) -> None:
    """A module of ``count`` recorded tests, marked ``alongside`` (True), ``alone`` (False) or
    neither (None)."""
    mark = "" if alongside is None else \
        f"import pytest\npytestmark = pytest.mark.{'alongside' if alongside else 'alone'}"
    tests = "\n".join(f"def test_{i}():\n    _record('{name}.{i}')\n" for i in range(count))
    pytester.makepyfile(**{name: MODULE.format(mark=mark, tests=tests)})


def _spans(path: Path) -> dict[str, tuple[float, float]]:
    return {name: (start, end)
            for name, start, end in map(json.loads, path.read_text().splitlines())}


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _ran_alone(spans: dict[str, tuple[float, float]], name: str) -> bool:
    return not any(_overlap(spans[name], spans[other]) for other in spans if other != name)


def _shared_and_first(spans: dict[str, tuple[float, float]], one: str, other: str,
                      alone: str) -> None:
    """Modules ``one`` and ``other`` ran at once, both begun before module ``alone``."""
    assert any(_overlap(spans[f"{one}.{i}"], spans[f"{other}.{j}"])
               for i in range(2) for j in range(2)), spans
    first_alone = min(start for name, (start, _) in spans.items() if name.startswith(alone))
    assert spans[f"{one}.0"][0] < first_alone and spans[f"{other}.0"][0] < first_alone, spans


@pytest.fixture
def two_workers(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for outer in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID"):  # this suite's own workers
        monkeypatch.delenv(outer, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.setenv("SPANS", str(tmp_path / "spans.jsonl"))
    pytester.makeconftest('pytest_plugins = ["tests.support.concurrency"]\n')

    def run() -> dict[str, tuple[float, float]]:
        runs = Path(tempfile.gettempdir()).glob("triton-builder-tests-*")
        before = set(runs)
        result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup",
                                               "--no-loadscope-reorder", "-p", "no:cacheprovider")
        result.assert_outcomes(passed=sum(path.read_text().count("\ndef test_")
                                          for path in pytester.path.rglob("test_*.py")))
        left = set(Path(tempfile.gettempdir()).glob("triton-builder-tests-*")) - before
        assert not left, "the run's lock directory is removed when it ends"
        return _spans(tmp_path / "spans.jsonl")

    return run


def test_a_test_not_marked_alongside_runs_with_no_other_test_beside_it(pytester, two_workers):
    for name, alongside in (("test_a", True), ("test_b", None), ("test_c", None),
                            ("test_d", True)):
        _module(pytester, name, alongside)
    spans = two_workers()
    alone = [name for name in spans if name.startswith(("test_b", "test_c"))]
    assert alone and all(_ran_alone(spans, name) for name in alone), spans


def test_alongside_tests_run_at_once_and_first(pytester, two_workers):
    """Modules marked ``alongside`` are collected first, so both workers start on them, and two
    of them share the machine."""
    _module(pytester, "test_a", None)
    _module(pytester, "test_b", True)
    _module(pytester, "test_c", True)
    _shared_and_first(two_workers(), "test_b", "test_c", alone="test_a")


def test_once_per_run_makes_a_session_value_once_for_both_workers(pytester, two_workers,
                                                                 tmp_path):
    made = tmp_path / "made"
    for name in ("test_a", "test_b"):
        pytester.makepyfile(**{name: textwrap.dedent(f"""
            import os, time
            import pytest
            from tests.support.concurrency import once_per_run

            pytestmark = pytest.mark.alongside

            @pytest.fixture(scope="session")
            def shared():
                def make():
                    with open({str(made)!r}, "a") as log:
                        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
                    time.sleep(0.5)
                    return "built"
                return once_per_run("shared", make)

            def test_0(shared):
                assert shared == "built"
                with open(os.environ["SPANS"], "a") as spans:
                    spans.write('["{name}.0", 0, 0]\\n')

            def test_1(shared):
                assert shared == "built"
                with open(os.environ["SPANS"], "a") as spans:
                    spans.write('["{name}.1", 0, 0]\\n')
            """)})
    two_workers()
    assert len(made.read_text().split()) == 1


def test_a_test_marked_alone_in_an_alongside_module_runs_alone_after_its_module(
        pytester, two_workers):
    """It is handed out with the alone tests, after the alongside modules, not at the end of its
    module's turn: there its worker sat idle until the other worker's test ended, and no
    alongside test began in between (a fresh run lost six minutes of one worker so)."""
    _module(pytester, "test_a", True)
    pytester.makepyfile(test_b=MODULE.format(
        mark="import pytest\npytestmark = pytest.mark.alongside",
        tests="def test_0():\n    _record('test_b.0')\n\n"
              "@pytest.mark.alone\ndef test_1():\n    _record('test_b.1')\n\n"
              "def test_2():\n    _record('test_b.2')\n"))
    for name in ("test_c", "test_d", "test_e"):
        _module(pytester, name, True)
    _module(pytester, "test_f", None)
    spans = two_workers()
    assert _ran_alone(spans, "test_b.1"), spans
    between = [name for name, (start, _) in spans.items() if not name.startswith("test_b")
               and spans["test_b.2"][1] <= start < spans["test_b.1"][0]]
    assert any(not name.startswith("test_f") for name in between), spans


def test_a_test_marked_alongside_in_another_module_runs_with_the_alongside_tests(pytester,
                                                                                 two_workers):
    """Its module runs alone, after the shared part; it runs in the shared part, beside the
    other alongside tests, before any test of its module."""
    _module(pytester, "test_a", True)
    pytester.makepyfile(test_b=MODULE.format(
        mark="import pytest",
        tests="def test_0():\n    _record('test_b.0')\n\n"
              "@pytest.mark.alongside\ndef test_1():\n    _record('test_b.1')\n\n"
              "def test_2():\n    _record('test_b.2')\n"))
    spans = two_workers()
    assert any(_overlap(spans["test_b.1"], spans[f"test_a.{i}"]) for i in range(2)), spans
    assert spans["test_b.1"][1] <= min(spans["test_b.0"][0], spans["test_b.2"][0]), spans
    assert _ran_alone(spans, "test_b.0") and _ran_alone(spans, "test_b.2"), spans


def test_modules_of_an_alongside_directory_run_alongside_unless_marked_alone(pytester,
                                                                           two_workers):
    """``alongside_directories`` (the unit tests here): its modules need no mark to share the
    machine and come first; one marked ``alone`` there still runs alone."""
    pytester.makeini("[pytest]\nalongside_directories = shared\n")
    pytester.mkpydir("shared")
    _module(pytester, "test_a", None)
    _module(pytester, "shared/test_b", None)
    _module(pytester, "shared/test_c", None)
    _module(pytester, "shared/test_d", False)
    spans = two_workers()
    _shared_and_first(spans, "shared/test_b", "shared/test_c", alone="test_a")
    alone = [name for name in spans if name.startswith("shared/test_d")]
    assert alone and all(_ran_alone(spans, name) for name in alone), spans
