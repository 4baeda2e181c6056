"""Running many calls at once with a bound on how many are in flight, results in input order.

Sending a thousand requests at once swamps the server's queue and the client's sockets; sending
them one by one leaves Triton's dynamic batcher nothing to batch. A bounded window is the middle:
enough requests in flight to fill batches, few enough to keep latency and memory in check. The
items are consumed lazily, so a long iterator is never materialised as pending requests.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_bounded(
    call: Callable[[T], R], items: Iterable[T], max_in_flight: int, executor: Executor
) -> Iterator[R]:
    """``call(item)`` for each item on ``executor``, at most ``max_in_flight`` at a time.

    Results come in the order of ``items``; the first failure is raised when its turn comes,
    after the calls already started have finished (none is left running unobserved).
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            if len(pending) >= max_in_flight:
                yield pending.popleft().result()
            pending.append(executor.submit(call, item))
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        for future in pending:
            if not future.cancelled():
                future.exception()  # wait for it


async def amap_bounded(
    call: Callable[[T], Awaitable[R]], items: Iterable[T], max_in_flight: int
) -> list[R]:
    """The asyncio form: ``await call(item)`` for each item, at most ``max_in_flight`` at once.

    On the first failure the calls still running are cancelled and the failure is raised.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
    source = enumerate(items)  # shared by the workers: each takes the next item when free
    results: dict[int, R] = {}

    async def worker() -> None:
        for index, item in source:
            results[index] = await call(item)

    workers = [asyncio.ensure_future(worker()) for _ in range(max_in_flight)]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    return [results[index] for index in range(len(results))]
