"""Showing a build as it happens: a rich progress bar on a terminal, plain lines elsewhere.

A build is minutes of silence otherwise. On a terminal the current ``Step N/M`` drives a bar (and
cached steps say so); in CI logs and pipes, where bars turn into noise, every line of the build
log is printed as it comes. Either way the caller gets an ``on_log`` callable for
:func:`builder.engine.image_build.build_image`.
"""

from __future__ import annotations

import contextlib
import re
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Log = Callable[[str], None]
"""How every step reports progress: one line at a time (``on_log=`` everywhere)."""

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


class BuildProgress:
    """``with BuildProgress("building x") as progress: build_image(..., on_log=progress)``."""

    def __init__(self, title: str, *, stream: IO[str] | None = None,
                 plain: bool | None = None) -> None:
        self.title = title
        self.console = Console(file=stream or sys.stderr, highlight=False)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.cached_steps = 0
        self.steps = 0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> BuildProgress:
        if self.plain:
            self.console.print(self.title, markup=False)
        else:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=self.console, transient=False)
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=None)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __call__(self, line: str) -> None:
        step = _STEP.match(line)
        if step:
            self.steps = int(step.group(2))
        if line.strip() == "---> Using cache":
            self.cached_steps += 1
        if self.plain or self._progress is None:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        if step:
            number, total, instruction = int(step.group(1)), int(step.group(2)), step.group(3)
            self._progress.update(self._task, total=total, completed=number - 1,
                                  description=f"{self.title}: {instruction[:60]}")


@contextmanager
def timed_step(title: str, on_log: Log | None = None) -> Iterator[None]:
    """Announce one step of a long job and, when it ends, how long it took."""
    emit = on_log or stderr_line
    started = time.monotonic()
    emit(f"> {title}")
    try:
        yield
    except BaseException:
        emit(f"x {title} failed after {time.monotonic() - started:.1f}s")
        raise
    emit(f"✓ {title} ({time.monotonic() - started:.1f}s)")


def peak_memory() -> int:
    """The most memory this process has held so far (its peak RSS), in bytes.

    A build holds each model operator's weights while it exports and checks them, so its peak
    grows with the largest model: a build of a 2.46 GB operator peaks near 7.7 GB, which a CI
    runner's memory limit must allow. Linux counts ``ru_maxrss`` in KiB, macOS in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def stderr_line(line: str) -> None:
    """The default ``on_log``: one line to standard error, at once."""
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def step_log(title: str, on_log: Log | None) -> Iterator[Log]:
    """The log of one step: the caller's ``on_log``, else a live :class:`BuildProgress` panel."""
    if on_log is not None:
        yield on_log
        return
    with BuildProgress(title) as progress:
        yield progress
