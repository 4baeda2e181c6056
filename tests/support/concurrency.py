"""Two tests at once, only where neither can tell: a pytest plugin for ``pytest -n 2``.

Why: much of the suite waits on one core (the builder's own Python, a server, a download) while
the other idles, and a fresh machine compiles for half an hour; two pytest-xdist workers use
both. Why not every test: some measure time or load (a latency budget, a drain, a tuner), some
count what the whole engine holds (no layer left behind, the same image set before and after),
and a second test beside them would change their answer. So each test is of one of three kinds:

* ``alongside``: neither times anything nor counts the engine; runs beside other ``alongside``
  tests. Modules marked so, or lying under a directory the ini option ``alongside_directories``
  names (unless marked otherwise).
* ``light``: times something, but what it times is sleeps and waits (a model that sleeps, a
  stream stepping every 0.2 s, a server restarting), so it loads the machine little; runs
  beside another ``light`` test, never beside the other kinds, whose compiles or loads would be
  in its timings.
* ``alone`` (any test not marked otherwise): runs with no other test beside it.

The workers take turns through the run's ledger of who runs what (:func:`_turn`: a JSON file
under an ``fcntl.flock``, and a gate taken first, so that a waiting test is not overtaken
forever). Tests are collected ``alongside`` first, then ``alone``, then ``light``: both workers
start on the shared part and end on the light tests, where they meet. A test whose kind differs
from its module's is scheduled with the tests like it, in a unit of its own (under ``--dist
loadgroup`` every other module stays whole in one worker): the ``alone`` tests of ``alongside``
modules run among the alone ones, after the shared part (waiting for its turn in the middle of
it, such a test held its worker idle while the other compiled: six minutes of one worker in a
fresh run, about 110 s of the machine), the ``alongside`` tests of other modules (one that waits
on a registry, say) in the shared part, and the ``light`` tests of each other module in a unit
of that module's, so that two of them can meet.

Session fixtures run once per worker under xdist: :func:`once_per_run` makes the first worker
build a shared image and the others read its name (pytest-xdist's documented recipe, with
``filelock``).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from filelock import FileLock

MARKER = "alongside"
LIGHT = "light"
ALONE = "alone"
KINDS = (MARKER, ALONE, LIGHT)
"""The kinds, in the order their tests are collected and handed out."""
T = TypeVar("T")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "alongside_directories", type="paths", default=[],
        help=f"directories whose modules are {MARKER} unless marked {ALONE} or {LIGHT} (tests "
             "that neither time nor count the engine, written so by default: the unit tests)")
    parser.addini(
        "unit_durations", default="",
        help="a JSON file of the seconds each unit of work took in a past run (its tests' "
             f"setup, call and teardown), as --record-unit-durations writes it: {ALONE} and "
             f"{LIGHT} units are handed out longest first (those it does not name first of all), "
             f"{MARKER} units under a minute last")
    parser.addini(
        "alongside_first_without", type="linelist", default=[],
        help=f"fixtures: the {MARKER} units none of whose tests uses one come first (they run "
             "while what those fixtures wait for is made beside them)")
    parser.addoption(
        "--record-unit-durations", metavar="PATH", default=None,
        help="write the seconds each unit of work took in this run to PATH (JSON, for the ini "
             "option unit_durations)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: may run beside another {MARKER} test under pytest -n (neither "
        "measures time or load, nor counts what the whole engine holds); every other test runs "
        "alone (tests/support/concurrency.py)")
    config.addinivalue_line(
        "markers", f"{ALONE}: runs alone though its module is marked {MARKER} or {LIGHT}, or lies "
        "in alongside_directories (it counts what the whole engine holds, or times something)")
    config.addinivalue_line(
        "markers", f"{LIGHT}: times sleeps and waits and loads the machine little: may run beside "
        f"another {LIGHT} test, never beside a test of another kind "
        "(tests/support/concurrency.py)")
    if _controller(config) and not config.option.testrunuid:
        config.option.testrunuid = uuid.uuid4().hex  # known here, to remove its directory
    record = config.getoption("record_unit_durations", None)
    if record and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_DurationRecorder(config, Path(record)))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller removes the run's directory once its workers are gone."""
    if _controller(config) and config.option.testrunuid:
        shutil.rmtree(_directory(config.option.testrunuid), ignore_errors=True)


def _controller(config: pytest.Config) -> bool:
    """Whether this process hands tests to xdist workers (it runs none itself)."""
    return (config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")
            and bool(config.getoption("numprocesses", None)))


GROUPS = "groups.json"
"""The run's file of the tests scheduled apart from their modules: node id -> group."""


def _written_groups(run: str) -> dict[str, str]:
    """The :data:`GROUPS` file the run's workers wrote (none yet: no groups)."""
    written = _directory(run) / GROUPS
    return json.loads(written.read_text()) if written.is_file() else {}


def _unit_of(nodeid: str, groups: dict[str, str]) -> str:
    """The unit of work a test is handed out in: its group, else its module."""
    return groups.get(nodeid) or _module_of(nodeid)


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _group(kind: str, module: str) -> str:
    """The unit of work of a test whose kind differs from its module's: one for every ``alone``
    test of the other modules (scheduled among the alone modules), one for every ``alongside``
    test (among the alongside ones), and one per module for its ``light`` tests, so that those
    of two modules can run at once."""
    return f"{LIGHT}:{module}" if kind == LIGHT else kind


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``--dist loadgroup``: a module a unit of work, as ``loadfile`` makes it, but for the
    tests the workers wrote to the run's :data:`GROUPS` file, a unit per group.

    Why not xdist's own groups (``xdist_group`` marks, node ids ending ``@group``): pytest-xdist
    3.8 renames a grouped test by setting ``item._nodeid``, which pytest 9 no longer reads
    (``Node.nodeid`` is built from ``_id``), so the marks were silently ignored and an ``alone``
    test ran in the middle of its module's shared part."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndGroups(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # the workers wrote it before reporting their collection
                self.groups = _written_groups(config.option.testrunuid)
            return _unit_of(nodeid, self.groups)

    return ModulesAndGroups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``alongside`` tests first, then ``alone``, then ``light`` (:data:`KINDS`): with ``--dist
    loadgroup --no-loadscope-reorder`` both workers start on modules that can share the machine
    and end on the light tests, each module whole in one worker but for the tests of another
    kind than it, which join the tests like them (:func:`_group`).

    The ``alone`` and ``light`` units go longest first, as the ini option ``unit_durations``
    has them (a unit it does not name first of all): a worker that takes a long unit last holds
    the run while the other idles. The ``alongside`` units keep their collection order, which
    mixes compiles with tests that wait on a server, an emulator or the network (handed out
    longest first, the compiles ran together and those waits together at the end, the machine
    a third idle: 3.4 minutes longer in a fresh run), but for two moves: those that use none of
    the fixtures ``alongside_first_without`` names come first (they need nothing that is made
    beside them as the run starts), and those under :data:`FILLER_S` last, to even out the two
    workers' ends."""
    directories = config.getini("alongside_directories")
    for module in {id(module): module for module in
                   (item.getparent(pytest.Module) for item in items) if module}.values():
        if (not any(module.get_closest_marker(kind) for kind in KINDS)
                and any(module.path.is_relative_to(directory) for directory in directories)):
            module.add_marker(MARKER)

    kinds = {item.nodeid: kind_of(item) for item in items}
    units = {item.nodeid: _unit(item, kinds[item.nodeid]) for item in items}
    members: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        members[units[item.nodeid]].append(item)
    seconds = _unit_durations(config)
    waited_for = set(config.getini("alongside_first_without"))
    order = {}
    for position, (unit, its) in enumerate(members.items()):
        kind = kinds[its[0].nodeid]
        early = kind == MARKER and bool(waited_for) and not any(
            waited_for.intersection(item.fixturenames) for item in its)
        took = seconds.get(unit, math.inf)
        order[unit] = ((KINDS.index(kind), not early, took < FILLER_S, position) if kind == MARKER
                       else (KINDS.index(kind), -took, position))
    items.sort(key=lambda item: order[units[item.nodeid]])

    groups = {nodeid: unit for nodeid, unit in units.items() if unit != _module_of(nodeid)}
    config.stash[_GROUPS_KEY] = groups
    root = run_directory()
    if root is not None:
        written = root / f"{GROUPS}.{os.getpid()}"
        written.write_text(json.dumps(groups))
        written.replace(root / GROUPS)  # each worker writes the same; none reads half of one


_GROUPS_KEY = pytest.StashKey[dict]()
FILLER_S = 60.0
"""An ``alongside`` unit shorter than this (as ``unit_durations`` has it) is handed out after
the longer ones: what the worker that ends first does while the other ends its long unit."""


def _unit(item: pytest.Item, kind: str) -> str:
    """The unit of work ``item`` is handed out in: its module, or :func:`_group`."""
    module = item.getparent(pytest.Module)
    if module is None:
        return _module_of(item.nodeid)
    return module.nodeid if kind_of(module) == kind else _group(kind, module.nodeid)


def _unit_durations(config: pytest.Config) -> dict[str, float]:
    name = config.getini("unit_durations")
    path = config.rootpath / name if name else None
    return json.loads(path.read_text()) if path and path.is_file() else {}


class _DurationRecorder:
    """Sums each unit's seconds from the test reports (under xdist, in the process that hands
    out the units, which receives every worker's) and writes them when the run ends; beside
    them (``<name>.timeline.json``), when each unit began and ended in which worker, in seconds
    from the run's first test: where a worker waited shows there, not in the durations."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config, self.path = config, path
        self.seconds: dict[str, float] = defaultdict(float)
        self.spans: dict[str, list] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        worker = getattr(getattr(report, "node", None), "gateway", None)
        span = self.spans.setdefault(report.nodeid, [worker and worker.id, report.start,
                                                     report.stop])
        span[1:] = min(span[1], report.start), max(span[2], report.stop)

    def pytest_sessionfinish(self) -> None:
        groups = self.config.stash.get(_GROUPS_KEY, None)
        if groups is None:  # the controller collects nothing: its workers wrote the groups
            groups = _written_groups(self.config.option.testrunuid)
        units: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.seconds.items():
            units[_unit_of(nodeid, groups)] += seconds
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({unit: round(seconds, 1) for unit, seconds in
                                         sorted(units.items())}, indent=1) + "\n")
        self.path.with_suffix(".timeline.json").write_text(
            json.dumps(self._timeline(groups), indent=1) + "\n")

    def _timeline(self, groups: dict[str, str]) -> list[list]:
        """``[worker, unit, began, ended]`` of each unit, by when it began."""
        first = min((start for _, start, _ in self.spans.values()), default=0.0)
        units: dict[tuple, list[float]] = {}
        for nodeid, (worker, start, stop) in self.spans.items():
            span = units.setdefault((worker, _unit_of(nodeid, groups)), [start, stop])
            span[:] = min(span[0], start), max(span[1], stop)
        return sorted(([worker, unit, round(began - first, 1), round(ended - first, 1)]
                       for (worker, unit), (began, ended) in units.items()),
                      key=lambda row: row[2])


def kind_of(node: pytest.Item | pytest.Module) -> str:
    """The kind the node's closest mark says (its own before its module's); ``alone`` unmarked."""
    for each in reversed(node.listchain()):
        for kind in (ALONE, LIGHT, MARKER):
            if any(mark.name == kind for mark in each.own_markers):
                return kind
    return ALONE


def run_directory() -> Path | None:
    """Where this run's workers keep their locks (one directory per run, named by xdist's id
    of the run); ``None`` outside an xdist worker."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return None
    root = _directory(run)
    root.mkdir(exist_ok=True)
    return root


def _directory(run: str) -> Path:
    return Path(tempfile.gettempdir(), f"triton-builder-tests-{run}")


def _lock(root: Path, name: str) -> FileLock:
    """The run's lock ``name`` (an image tag's ``/`` and ``:`` made ``_``)."""
    return FileLock(str(root / f"{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.lock"))


TURNS = "turns.json"
"""The run's ledger of the tests running now: ``[pid, kind]`` of each."""
POLL_S = 0.05


@contextmanager
def _turn(root: Path, kind: str) -> Iterator[None]:
    """Run the block once no test of another kind runs (nor any, for an ``alone`` test).

    Why a ledger and not a reader-writer lock: two kinds each shared among their own tests
    cannot be had from ``flock`` modes (a kind that shut out another would hold its lock
    exclusively, and so shut out its own tests too). The gate is held while waiting, so the
    other worker's next test cannot overtake this one; a holder that died is dropped."""
    with open(root / "gate", "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            while not _enter(root, kind):
                time.sleep(POLL_S)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        yield
    finally:
        with _ledger(root) as holders:
            holders.remove([os.getpid(), kind])


def _enter(root: Path, kind: str) -> bool:
    with _ledger(root) as holders:
        holders[:] = [holder for holder in holders if _alive(holder[0])]
        if holders and (kind == ALONE or any(other != kind for _, other in holders)):
            return False
        holders.append([os.getpid(), kind])
        return True


@contextmanager
def _ledger(root: Path) -> Iterator[list[list]]:
    """The ledger's holders, to read and change, under its lock."""
    with open(os.open(root / TURNS, os.O_RDWR | os.O_CREAT), "r+") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.seek(0)
        holders = json.loads(ledger.read() or "[]")
        yield holders
        ledger.seek(0)
        ledger.truncate()
        ledger.write(json.dumps(holders))


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a process that ended unreaped (a zombie) holds no turn."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@contextmanager
def beside_alongside_tests() -> Iterator[None]:
    """Hold a turn as an ``alongside`` test does, for work of the run that is no test (an
    image many tests share, made ahead of them): ``alone`` and ``light`` tests wait for it."""
    root = run_directory()
    if root is None:
        yield
        return
    with _turn(root, MARKER):
        yield


ALONE_DONE = "alone_done"
"""The run's record of its ``alone`` tests that have ended: a line each, appended."""
IDLE_S = 2.0
"""How long a ``light`` test waiting for the ``alone`` ones goes on waiting with no test of the
run holding or waiting for a turn: past it, the ``alone`` tests left are none that will come."""
_ALONE_TESTS_KEY = pytest.StashKey[int]()
"""How many ``alone`` tests this run's collection holds (those marked skip take no turn)."""


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_ALONE_TESTS_KEY] = sum(
        kind_of(item) == ALONE and item.get_closest_marker("skip") is None
        for item in session.items)


def _after_the_alone_tests(root: Path, alone_tests: int) -> None:
    """Wait until every ``alone`` test of the run has ended, outside the gate, where the other
    worker's ``alone`` tests take it. Why: the ``alone`` units are handed out before the
    ``light`` ones, but a worker can hold its ``light`` unit while the other still has
    ``alone`` ones; taking its turn first, the ``light`` test shut them out for its whole
    length, the other worker idle (92 s beside the light streaming module in a run here)."""
    quiet_since = time.monotonic()
    while _alone_left(root, alone_tests):
        if _turns_taken_or_awaited(root):
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > IDLE_S:
            return
        time.sleep(POLL_S)


def _alone_left(root: Path, alone_tests: int) -> bool:
    done = root / ALONE_DONE
    return (done.read_text().count("\n") if done.is_file() else 0) < alone_tests


def _turns_taken_or_awaited(root: Path) -> bool:
    with _ledger(root) as holders:
        if any(_alive(pid) for pid, _ in holders):
            return True
    with open(root / "gate", "a") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(gate, fcntl.LOCK_UN)
    return False


def _ended_alone(root: Path) -> None:
    with open(root / ALONE_DONE, "a") as done:
        done.write(f"{os.getpid()}\n")


_KEPT: list = []
"""The turn this worker keeps from one test to the next of its module: ``(kind, module,
ExitStack)``."""


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test's setup, call and teardown inside its turn (outside pytest-timeout's clock),
    which the worker keeps while its next test is of the same module and kind.

    Why keep it: a module's fixtures outlive its tests (a swarm stack deployed once for three),
    and with a turn per test the other worker's ``alone`` test ran between two of them, beside
    the stack's replicas: a tune of the same image then found their containers as its own."""
    root = run_directory()
    if root is None or item.get_closest_marker("skip") is not None:
        yield  # a test marked skip runs nothing: it waits for no turn (a GPU test here)
        return
    ours = (kind_of(item), _module_of(item.nodeid))
    turn = _KEPT.pop() if _KEPT else None
    if turn is not None and turn[:2] != ours:
        turn[2].close()
        turn = None
    if turn is None:
        if ours[0] == LIGHT:
            _after_the_alone_tests(root, item.config.stash.get(_ALONE_TESTS_KEY, 0))
        stack = ExitStack()
        stack.enter_context(_turn(root, ours[0]))
        turn = (*ours, stack)
    try:
        yield
    finally:
        if ours[0] == ALONE:
            _ended_alone(root)
        if nextitem is not None and (kind_of(nextitem), _module_of(nextitem.nodeid)) == ours:
            _KEPT.append(turn)
        else:
            turn[2].close()


def once_per_run(name: str, make: Callable[[], T]) -> T:
    """``make()`` once per run however many workers ask: the first builds under a lock and
    writes what it returned (JSON), the others read it. Without xdist, just ``make()``."""
    root = run_directory()
    if root is None:
        return make()
    made = root / f"{name}.json"
    with _lock(root, name):
        if made.is_file():
            return json.loads(made.read_text())
        value: Any = make()
        made.write_text(json.dumps(value))
        return value


@contextmanager
def one_at_a_time(name: str) -> Iterator[None]:
    """One worker at a time in the block (starting the engine, enabling emulation): what each
    worker needs for itself, but two at once would race."""
    root = run_directory()
    if root is None:
        yield
        return
    with _lock(root, name):
        yield
