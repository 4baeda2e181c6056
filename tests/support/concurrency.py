"""Two tests at once, only where neither can tell: a pytest plugin for ``pytest -n 2``.

Why: much of the suite waits on one core (the builder's own Python, a server, a download) while
the other idles, and a fresh machine compiles for half an hour; two pytest-xdist workers use
both. Why not every test: some measure time or load (a latency budget, a drain, a tuner), some
count what the whole engine holds (no layer left behind, the same image set before and after),
and a second test beside them would change their answer. So a test runs *alone* unless its
module is marked ``alongside`` (and the test itself not ``alone``) or lies under a directory
named in the ini option ``alongside_directories`` (and the module is not marked ``alone``), and
the workers take turns
through one reader-writer lock (``fcntl.flock`` on a file of the run): an ``alongside`` test
holds it shared, any other test exclusively. A gate taken before either keeps a waiting
exclusive test from being overtaken forever. ``alongside`` tests are collected first, so both
workers start on them. A test whose mark differs from its module's is scheduled with the tests
like it, in a group of its own (under ``--dist loadgroup`` every other module stays whole in one
worker): the ``alone`` tests of ``alongside`` modules run among the alone ones, after the
shared part (waiting for its turn in the middle of it, such a test held its worker idle while
the other compiled: six minutes of one worker in a fresh run, about 110 s of the machine), and
the ``alongside`` tests of other modules (one that waits on a registry, say) in the shared part.

Session fixtures run once per worker under xdist: :func:`once_per_run` makes the first worker
build a shared image and the others read its name (pytest-xdist's documented recipe, with
``filelock``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from filelock import FileLock

MARKER = "alongside"
ALONE = "alone"
T = TypeVar("T")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "alongside_directories", type="paths", default=[],
        help=f"directories whose modules are {MARKER} unless marked {ALONE} (tests that "
             "neither time nor count the engine, written so by default: the unit tests)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: may run beside another {MARKER} test under pytest -n (neither "
        "measures time or load, nor counts what the whole engine holds); every other test runs "
        "alone (tests/support/concurrency.py)")
    config.addinivalue_line(
        "markers", f"{ALONE}: runs alone though its module is marked {MARKER} or lies in "
        "alongside_directories (it counts what the whole engine holds, or times something)")
    if _controller(config) and not config.option.testrunuid:
        config.option.testrunuid = uuid.uuid4().hex  # known here, to remove its directory


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

ALONE_GROUP, ALONGSIDE_GROUP = "alone", "alongside"
"""The groups of the tests marked otherwise than their modules: the ``alone`` tests of
``alongside`` modules, scheduled among the alone modules, and the ``alongside`` tests of other
modules, scheduled among the alongside ones."""


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

    groups_file = _directory(config.option.testrunuid) / GROUPS

    class ModulesAndGroups(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # the workers wrote it before reporting their collection
                self.groups = json.loads(groups_file.read_text()) if groups_file.is_file() else {}
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

    return ModulesAndGroups(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``alongside`` tests first, the rest after, each part in its collection order (a stable
    sort): with ``--dist loadgroup --no-loadscope-reorder`` both workers start on modules that
    can share the machine, each module whole in one worker but for the tests marked otherwise
    than it, which join the tests like them (:data:`ALONE_GROUP`, :data:`ALONGSIDE_GROUP`)."""
    directories = config.getini("alongside_directories")
    for module in {id(module): module for module in
                   (item.getparent(pytest.Module) for item in items) if module}.values():
        if (module.get_closest_marker(MARKER) is None and module.get_closest_marker(ALONE) is None
                and any(module.path.is_relative_to(directory) for directory in directories)):
            module.add_marker(MARKER)
    items.sort(key=lambda item: not _alongside(item))

    root = _run_directory()
    if root is not None:
        groups = {item.nodeid: ALONGSIDE_GROUP if _alongside(item) else ALONE_GROUP
                  for item in items if (module := item.getparent(pytest.Module)) is not None
                  and _alongside(module) != _alongside(item)}
        written = root / f"{GROUPS}.{os.getpid()}"
        written.write_text(json.dumps(groups))
        written.replace(root / GROUPS)  # each worker writes the same; none reads half of one


def _alongside(node: pytest.Item | pytest.Module) -> bool:
    return node.get_closest_marker(MARKER) is not None and node.get_closest_marker(ALONE) is None


def _run_directory() -> Path | None:
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


@contextmanager
def _turn(root: Path, alongside: bool) -> Iterator[None]:
    """Hold the run's test lock shared (``alongside``) or exclusively, through the gate."""
    with open(root / "gate", "a") as gate, open(root / "tests", "a") as tests:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_SH if alongside else fcntl.LOCK_EX)
        finally:
            if alongside:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each test's setup, call and teardown inside its turn (outside pytest-timeout's clock)."""
    root = _run_directory()
    if root is None:
        yield
        return
    with _turn(root, _alongside(item)):
        yield


def once_per_run(name: str, make: Callable[[], T]) -> T:
    """``make()`` once per run however many workers ask: the first builds under a lock and
    writes what it returned (JSON), the others read it. Without xdist, just ``make()``."""
    root = _run_directory()
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
    root = _run_directory()
    if root is None:
        yield
        return
    with _lock(root, name):
        yield
