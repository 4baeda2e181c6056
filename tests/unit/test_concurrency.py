"""The suite's two workers (``tests/support/concurrency.py``), run for real: pytest-xdist with
two workers on generated modules that record when each test ran."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.light  # two workers of its own, timed on sleeps

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


def _module(pytester: pytest.Pytester, name: str, alongside: bool | str | None,
            count: int = 2) -> None:
    """A module of ``count`` recorded tests, marked ``alongside`` (True), ``alone`` (False),
    with the kind named (a string) or unmarked (None)."""
    kind = alongside if isinstance(alongside, str) else "alongside" if alongside else "alone"
    mark = "" if alongside is None else f"import pytest\npytestmark = pytest.mark.{kind}"
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

    def run(*options: str) -> dict[str, tuple[float, float]]:
        runs = Path(tempfile.gettempdir()).glob("triton-builder-tests-*")
        before = set(runs)
        result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup",
                                               "--no-loadscope-reorder", "-p", "no:cacheprovider",
                                               *options)
        sources = [path.read_text() for path in pytester.path.rglob("test_*.py")]
        skipped = sum(source.count("@pytest.mark.skip(") for source in sources)
        result.assert_outcomes(passed=sum(source.count("\ndef test_") for source in sources)
                               - skipped, skipped=skipped)
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


def test_an_alone_modules_tests_run_one_after_another_with_nothing_between(pytester,
                                                                          two_workers):
    """A module's fixtures outlive its tests (a stack deployed once for three): the other
    worker's test must not run between two of them, beside what they left running."""
    for name in ("test_a", "test_b"):
        _module(pytester, name, False, count=3)
    spans = two_workers()
    for module, other in (("test_a", "test_b"), ("test_b", "test_a")):
        held = (spans[f"{module}.0"][0], spans[f"{module}.2"][1])
        between = [name for name in spans if name.startswith(other) and _overlap(held,
                                                                                 spans[name])]
        assert not between, f"{between} ran between {module}'s tests: {spans}"


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


def test_light_tests_run_beside_each_other_and_beside_no_test_of_another_kind(pytester,
                                                                            two_workers):
    """Two light modules meet at the end, each in one worker; neither ran beside an alongside
    or an alone test, and the alone module ran alone. A test marked ``light`` in an alone module
    joins them; the module's other tests stay alone."""
    _module(pytester, "test_a", True)
    _module(pytester, "test_b", "light")
    _module(pytester, "test_c", None)
    pytester.makepyfile(test_d=MODULE.format(
        mark="import pytest",
        tests="def test_0():\n    _record('test_d.0')\n\n"
              "@pytest.mark.light\ndef test_1():\n    _record('test_d.1')\n"))
    _module(pytester, "test_e", True)
    spans = two_workers("--record-unit-durations", str(pytester.path / "units.json"))
    light = ("test_b.0", "test_b.1", "test_d.1")
    assert any(_overlap(spans[one], spans[other]) for one in light for other in light
               if one != other), spans
    for name in light:
        assert not any(_overlap(spans[name], span) for other, span in spans.items()
                       if other not in light), (name, spans)
    assert all(_ran_alone(spans, name) for name in ("test_c.0", "test_c.1", "test_d.0")), spans
    units = json.loads((pytester.path / "units.json").read_text())
    assert set(units) == {"test_a.py", "test_b.py", "test_c.py", "test_d.py",
                          "light:test_d.py", "test_e.py"}, units
    assert 1.2 <= units["test_b.py"] < 3 and 0.6 <= units["light:test_d.py"] < 1.5, units
    timeline = json.loads((pytester.path / "units.timeline.json").read_text())
    assert {unit for _, unit, _, _ in timeline} == set(units), timeline
    assert {worker for worker, _, _, _ in timeline} == {"gw0", "gw1"}, timeline
    assert [began for _, _, began, _ in timeline] == sorted(began for _, _, began, _ in timeline)
    span = {unit: (began, ended) for _, unit, began, ended in timeline}
    assert span["test_b.py"][1] - span["test_b.py"][0] >= 1.1, timeline  # 2 x 0.6 s, rounded
    assert span["test_c.py"][1] <= span["light:test_d.py"][0] + 0.1 or \
        span["light:test_d.py"][1] <= span["test_c.py"][0] + 0.1, "alone beside light"


def test_units_are_handed_out_by_kind_fillers_last_longest_first_and_needing_nothing_first(
        pytester, monkeypatch):
    """``alongside`` units that use no fixture ``alongside_first_without`` names come first,
    and of each part those ``unit_durations`` has under a minute last, in collection order
    otherwise; ``alone`` and ``light`` units go longest first, one the file does not name first
    of all."""
    for outer in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID"):  # not this run's groups
        monkeypatch.delenv(outer, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    pytester.makeconftest('''
        import pytest
        pytest_plugins = ["tests.support.concurrency"]

        @pytest.fixture
        def engine():
            return "made beside"
    ''')
    pytester.makeini("[pytest]\nunit_durations = durations.json\n"
                     "alongside_first_without = engine\n")
    (pytester.path / "durations.json").write_text(json.dumps(
        {"test_a.py": 5, "test_b.py": 500, "test_c.py": 1, "test_d.py": 500, "test_e.py": 9,
         "light:test_f.py": 3, "test_g.py": 30}))
    alongside = "import pytest\npytestmark = pytest.mark.alongside\n"
    pytester.makepyfile(
        test_a=alongside + "def test_0(engine): pass\n",
        test_b=alongside + "def test_0(engine): pass\n",
        test_c=alongside + "def test_0(): pass\n",
        test_d=alongside + "def test_0(): pass\n",
        test_e="def test_0(): pass\n",
        test_f="import pytest\n@pytest.mark.light\ndef test_0(): pass\ndef test_1(): pass\n",
        test_g="import pytest\npytestmark = pytest.mark.light\ndef test_0(): pass\n",
        test_h=alongside + "def test_0(engine): pass\n")
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    order = [line.split("::")[0] for line in result.outlines if "::" in line]
    assert order == ["test_d.py", "test_c.py", "test_b.py", "test_h.py", "test_a.py",
                     "test_f.py", "test_e.py", "test_g.py", "test_f.py"], result.outlines


def test_work_beside_the_alongside_tests_holds_back_the_alone_ones(pytester, two_workers,
                                                                    tmp_path):
    """An ``alongside`` test starts a process that holds a turn as an ``alongside`` test does
    (:func:`beside_alongside_tests`, as the shared bases are made): the alone test waits for it."""
    held = tmp_path / "held"
    pytester.makepyfile(test_a=MODULE.format(mark="import pytest, subprocess, sys\n"
                                             "pytestmark = pytest.mark.alongside", tests=f'''
HOLD = """
import json, os, sys, time
from tests.support.concurrency import beside_alongside_tests
with beside_alongside_tests():
    started = time.monotonic()
    open({str(held)!r}, "w").close()
    time.sleep(1.5)
    with open(os.environ["SPANS"], "a") as spans:
        print(json.dumps(["held", started, time.monotonic()]), file=spans)
"""

def test_0():
    holder = subprocess.Popen([sys.executable, "-c", HOLD])
    deadline = time.monotonic() + 60
    while not os.path.exists({str(held)!r}):
        assert holder.poll() is None and time.monotonic() < deadline, "no turn was held"
        time.sleep(0.05)
    _record("test_a.0")
'''))
    _module(pytester, "test_b", None, count=1)
    _module(pytester, "test_c", True, count=1)  # the workers' first units: test_a and test_c
    spans = two_workers()
    assert spans["held"][1] <= spans["test_b.0"][0], spans


def test_a_test_marked_skip_waits_for_no_turn(pytester, two_workers):
    """An ``alone`` test marked skip at collection (a GPU test on a machine without one) runs
    nothing: it is reported while the other worker's test still runs, instead of holding its
    worker idle until the machine is free (a minute or more of the run's end, where a light
    module ran beside it)."""
    pytester.makepyfile(test_a=MODULE.format(
        mark="import pytest\npytestmark = pytest.mark.alongside",
        tests="def test_0():\n    time.sleep(2)\n    _record('test_a.0')\n"))
    _module(pytester, "test_c", True, count=1)
    _module(pytester, "test_d", True, count=1)
    pytester.makepyfile(test_e=(  # handed to the worker that ran test_c, as test_a runs
        "import pytest\n\n"
        "@pytest.mark.skip(reason='no GPU')\n"
        "def test_0():\n    pass\n"))
    with open(pytester.path / "conftest.py", "a") as conftest:
        conftest.write(textwrap.dedent("""
            import json, os, time

            def pytest_runtest_logfinish(nodeid, location):
                if nodeid.startswith("test_e.py"):
                    with open(os.environ["SPANS"], "a") as spans:
                        now = time.monotonic()
                        spans.write(json.dumps(["test_e.0", now, now]) + "\\n")
        """))
    spans = two_workers()
    assert spans["test_e.0"][1] < spans["test_a.0"][1], spans


def test_light_tests_begin_once_every_alone_test_has_ended(pytester, two_workers):
    """A worker that holds a light module while the other still has alone ones (here one
    takes ``test_b``, three tests, the other ``test_c`` and ``test_d``, and the first the light
    ``test_e``): the light tests begin after the last alone one."""
    _module(pytester, "test_b", False, count=3)
    _module(pytester, "test_c", False, count=2)
    _module(pytester, "test_d", False, count=1)
    _module(pytester, "test_e", "light", count=2)
    spans = two_workers()
    last_alone = max(end for name, (_, end) in spans.items() if not name.startswith("test_e"))
    first_light = min(start for name, (start, _) in spans.items() if name.startswith("test_e"))
    assert last_alone <= first_light, spans


def test_a_light_test_waits_outside_the_gate_until_the_alone_tests_have_ended(tmp_path):
    """The wait itself, on a run directory of its own: another process holds an ``alone`` turn
    and ends two alone tests one after the other; the light test's wait ends with the second,
    and meanwhile the gate stays free for the other worker's next alone test (taken here)."""
    from tests.support import concurrency

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from tests.support import concurrency
        root = Path({str(tmp_path)!r})
        for _ in range(2):
            with concurrency._turn(root, concurrency.ALONE):
                time.sleep(0.5)
                concurrency._ended_alone(root)
    """)], cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 30
        while not concurrency._turns_taken_or_awaited(tmp_path):
            assert time.monotonic() < deadline, "the other process took no turn"
            time.sleep(0.01)
        concurrency._after_the_alone_tests(tmp_path, alone_tests=2)
        assert (tmp_path / concurrency.ALONE_DONE).read_text().count("\n") == 2
    finally:
        assert holder.wait(30) == 0
