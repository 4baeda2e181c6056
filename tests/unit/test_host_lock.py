"""The lock between the builder's processes, taken by real processes at the same moment: two
asking for one name take turns (an image tag, apt, dockerd), other names do not wait, and a
holder killed outright leaves nothing behind to wait for."""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

import builder.host_lock
from builder.host_lock import host_lock, image_lock, machine_lock_directory
from tests.support.at_once import at_once

pytestmark = pytest.mark.light  # two processes' lock holds must overlap in time

TAG = "triton-builder/tritonserver-cpu:2.51.0-py3.11"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _hold(name: str, seconds: float, times: int,
          directory: Path | None = None) -> list[tuple[float, float]]:
    """Take the lock ``times`` times, holding it ``seconds`` each: when it was held."""
    return _held(lambda: host_lock(name, directory), seconds, times)


def _held(lock: Callable[[], AbstractContextManager[None]], seconds: float,
          times: int) -> list[tuple[float, float]]:
    held = []
    for _ in range(times):
        with lock():
            start = time.monotonic()
            time.sleep(seconds)
            held.append((start, time.monotonic()))
    return held


@pytest.mark.parametrize("where", ["cache", "machine"])
def test_two_processes_never_hold_one_lock_at_once(where, tmp_path):
    """A tag's lock in the cache, apt's and dockerd's in the machine's directory."""
    directory = None
    if where == "machine":
        directory = tmp_path / "run-lock"
        directory.mkdir()
    first, second = at_once(_hold, [(f"image-{TAG}", 0.2, 3, directory)] * 2)
    spans = sorted(first + second)
    overlaps = [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]
    assert overlaps == []


def _hold_image(cache: Path, seconds: float, times: int) -> list[tuple[float, float]]:
    """:func:`_hold` of a base image's lock, by a build whose cache is ``cache``."""
    os.environ["TRITON_BUILDER_CACHE"] = str(cache)
    return _held(lambda: image_lock(TAG), seconds, times)


def test_builds_with_other_caches_take_turns_at_one_image(tmp_path, monkeypatch):
    """The engine is the machine's: two builds of one base image, each with its own
    ``TRITON_BUILDER_CACHE``, must not both build it."""
    monkeypatch.setattr(builder.host_lock, "MACHINE_LOCKS", tmp_path / "run-lock")
    (tmp_path / "run-lock").mkdir()
    first, second = at_once(_hold_image, [(tmp_path / "a", 0.2, 3), (tmp_path / "b", 0.2, 3)])
    spans = sorted(first + second)
    assert [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]] == []


def test_locks_of_other_names_do_not_wait_for_each_other():
    first, second = at_once(_hold, [(f"image-{TAG}", 0.5, 1), ("image-another:tag", 0.5, 1)])
    (start_a, end_a), (start_b, end_b) = first[0], second[0]
    assert max(start_a, start_b) < min(end_a, end_b), "one waited for the other"


def _hold_until_killed(name: str, held) -> None:
    with host_lock(name):
        held.set()
        time.sleep(300)


def test_a_holder_killed_outright_leaves_no_lock_to_wait_for():
    context = multiprocessing.get_context("fork")
    held = context.Event()
    holder = context.Process(target=_hold_until_killed, args=("apt", held))
    holder.start()
    assert held.wait(30)
    holder.kill()
    holder.join()
    assert holder.exitcode == -signal.SIGKILL
    assert at_once(_hold, [("apt", 0.0, 1)], timeout=10)


def test_machine_locks_are_in_run_lock_or_else_the_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(builder.host_lock, "MACHINE_LOCKS", tmp_path)
    assert machine_lock_directory() == tmp_path
    monkeypatch.setattr(builder.host_lock, "MACHINE_LOCKS", tmp_path / "absent")
    assert machine_lock_directory() == Path(tempfile.gettempdir())


def test_a_tag_too_long_for_a_file_name_still_names_a_lock(cache):
    tag = "registry.example.com:5000/" + "team/" * 60 + "pipeline:1.0"
    with host_lock(f"image-{tag}"):
        (lock,) = (cache / "locks").iterdir()
    assert len(lock.name) < 255 and lock.name.startswith("triton-builder-image-registry")
