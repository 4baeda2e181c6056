"""Two processes calling the builder at the same moment: how the tests race a user's two builds.

Threads would not do: the builder's cache is shared between processes (a user's two builds, two
pytest-xdist workers), and what one process does to a directory another is writing in is what
the tests must see. Each call runs in a forked process, all released together by a barrier, so
their work overlaps as much as it can.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Callable, Sequence
from typing import Any


def at_once(call: Callable[..., Any], arguments: Sequence[tuple[Any, ...]],
            timeout: float = 120.0) -> list[Any]:
    """Run ``call(*args)`` for each ``args`` of ``arguments``, each in its own process, started
    together; return their results in order. A call that raises fails the test with its
    traceback (every failure, not only the first)."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(arguments))
    results = context.Queue()
    processes = [context.Process(target=_run, args=(barrier, results, index, call, args))
                 for index, args in enumerate(arguments)]
    for process in processes:
        process.start()
    answers: dict[int, tuple[bool, Any]] = {}
    try:
        for _ in processes:
            index, ok, value = results.get(timeout=timeout)
            answers[index] = (ok, value)
    except queue.Empty:
        raise AssertionError(f"no answer within {timeout:.0f}s from calls "
                             f"{sorted(set(range(len(arguments))) - set(answers))}") from None
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
    failures = [value for ok, value in answers.values() if not ok]
    assert not failures, "\n".join(failures)
    return [answers[index][1] for index in range(len(arguments))]


def _run(barrier: Any, results: Any, index: int, call: Callable[..., Any],
         args: tuple[Any, ...]) -> None:
    barrier.wait()
    try:
        results.put((index, True, call(*args)))
    except BaseException:
        results.put((index, False, f"call {index}:\n{traceback.format_exc()}"))
