"""Interrupts — Ctrl-C's SIGINT, the SIGTERM of a CI runner or an orchestrator — and the cleanup
they start.

Why: a build that is interrupted must remove what it made on the engine, and three things stand
in the way. Python dies of SIGTERM without running any cleanup; an interrupt that lands while
the engine is creating something (a container, a loaded image) leaves a thing cleanup cannot
know of yet; and a second interrupt, while cleanup runs, stops cleanup half-way.
:func:`take_interrupts` answers the first and the last (SIGTERM stops the build as Ctrl-C
does, and only the first interrupt stops it), :func:`deferred_interrupts` the second (the engine
call runs to its end, the interrupt is raised after it).

Signal handlers belong to the main thread: elsewhere no interrupt arrives, and both are no-ops.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C is: whatever handles KeyboardInterrupt handles it too."""


class _StopOnce:
    """A handler that raises on the first interrupt and from then on ignores the signals it
    handles: the process is on its way out, cleaning up, and a second Ctrl-C must not cut that
    short. Ignored at the operating system's level, because Python puts its own handlers back
    to the default as the interpreter exits, and a signal then would still end the process."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        for each in self.signals:
            signal.signal(each, signal.SIG_IGN)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def take_interrupts() -> Callable[[], None]:
    """From now on SIGINT and SIGTERM stop the process's work (``KeyboardInterrupt``,
    :class:`Terminated`) and later ones are ignored while it cleans up and exits; returns what
    puts the previous handlers back.

    Only handlers at Python's default are replaced: a signal the parent ignored (a job started
    in the background ignores SIGINT) stays ignored, a handler of the caller's stays theirs, and
    one taken before (the CLI's, around the job's) stays in charge.
    """
    if not _in_main_thread():
        return lambda: None
    handler = _StopOnce()
    replaced = {}
    for signum, default in ((signal.SIGINT, signal.default_int_handler),
                            (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) is default:
            replaced[signum] = signal.signal(signum, handler)
            handler.signals.append(signum)

    def give_back() -> None:
        for signum, previous in replaced.items():
            signal.signal(signum, previous)

    return give_back


@contextmanager
def interrupts_stop_once() -> Iterator[None]:
    """:func:`take_interrupts` while the block runs (a build called from a program that
    carries on afterwards)."""
    give_back = take_interrupts()
    try:
        yield
    finally:
        give_back()


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Run the block to its end even if interrupted meanwhile; the interrupt is raised after it.

    For engine calls that make something (create a container, load an image, set tags) and for
    cleanup: an interrupt inside the HTTP call would leave the engine making a thing the caller
    never hears of, or stop a removal half-way. Only Python handlers are held back; a signal
    whose action is the operating system's (SIGTERM where nothing installed a handler) acts at
    once, as it would anyway.
    """
    if not _in_main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous: dict[int, Callable[[int, FrameType | None], object]] = {}
    for signum in INTERRUPTS:
        installed = signal.getsignal(signum)
        if callable(installed):
            signal.signal(signum, hold)
            previous[signum] = installed
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if held:
            previous[held[0]](held[0], None)
