"""SIGINT and SIGTERM as a build takes them, sent for real to this process: the first stops the
work, later ones are ignored while it cleans up, a deferred block runs to its end first, and a
signal the parent ignored stays ignored."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from builder.cache import build_scratch
from builder.interrupts import (
    Terminated,
    deferred_interrupts,
    interrupts_stop_once,
    take_interrupts,
)


@pytest.fixture(autouse=True)
def _python_defaults() -> Iterator[None]:
    """Each test starts from Python's own handlers and leaves them as it found them."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def _send(signum: int) -> None:
    """Deliver ``signum`` to this process and give Python the moment to run its handler."""
    assert signal.getsignal(signum) not in (signal.SIG_DFL, None), "it would end the test run"
    os.kill(os.getpid(), signum)
    time.sleep(0.2)


def test_sigterm_stops_the_work_as_ctrl_c_does():
    with interrupts_stop_once():
        with pytest.raises(Terminated) as raised:
            _send(signal.SIGTERM)
    assert isinstance(raised.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_only_the_first_interrupt_stops_the_work():
    cleaned = False
    with interrupts_stop_once():
        try:
            with pytest.raises(KeyboardInterrupt):
                _send(signal.SIGINT)
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # while cleaning up: ignored
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            cleaned = True
    assert cleaned
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_waits_until_a_deferred_block_has_run_to_its_end():
    steps = []
    with interrupts_stop_once(), pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            steps.append("created")
            _send(signal.SIGINT)
            steps.append("registered")
        steps.append("went on")
    assert steps == ["created", "registered"]


def test_a_deferred_block_inside_another_raises_at_the_outer_end():
    steps = []
    with interrupts_stop_once(), pytest.raises(Terminated):
        with deferred_interrupts():
            with deferred_interrupts():
                _send(signal.SIGTERM)
                steps.append("inner")
            steps.append("outer")
    assert steps == ["inner", "outer"]


def test_a_signal_the_parent_ignored_stays_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with interrupts_stop_once():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert callable(signal.getsignal(signal.SIGTERM))
        with deferred_interrupts():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_callers_own_handler_stays_in_charge():
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    give_back = take_interrupts()
    try:
        _send(signal.SIGTERM)
    finally:
        give_back()
    assert seen == [signal.SIGTERM]


def test_outside_the_main_thread_both_are_no_ops():
    errors = []

    def work() -> None:
        try:
            with interrupts_stop_once(), deferred_interrupts():
                pass
        except Exception as error:  # noqa: BLE001 - what the thread saw is the result
            errors.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_after_the_first_interrupt_a_callers_own_handler_is_still_theirs():
    seen = []
    signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    with interrupts_stop_once():
        with pytest.raises(Terminated):
            _send(signal.SIGTERM)
        _send(signal.SIGINT)
    assert seen == [signal.SIGINT]


def test_an_interrupt_while_a_builds_working_directory_is_removed_waits_for_the_removal(
        monkeypatch, tmp_path):
    """The interrupt lands inside the removal (as one does while a build's model repository,
    thousands of files, is removed): the directory still goes whole, then the build stops."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    removing = shutil.rmtree

    def interrupted_removal(path, *args, **kwargs):
        _send(signal.SIGINT)
        removing(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", interrupted_removal)
    with interrupts_stop_once(), pytest.raises(KeyboardInterrupt):
        with build_scratch() as scratch:
            (scratch / "models" / "pipeline").mkdir(parents=True)
            (scratch / "models" / "pipeline" / "config.pbtxt").write_text("name: 'pipeline'")
    assert not scratch.exists() and os.listdir(tmp_path) == []
