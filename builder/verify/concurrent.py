"""Verification with distinct requests in flight together: the server's batches mix them.

One request at a time, every dynamic batch on the server is one row, and an operator whose answer
depends on the other rows of its batch answers exactly as in process. Users send concurrently:
so, beside the one-at-a-time checks, the pipeline's calls and perturbed copies of them
(:func:`~builder.pipeline.row_independence.perturb`: each a different request the pipeline
answers in process) are sent from several threads at once over gRPC, every answer compared with
the in-process one. It is the served half of what the build checks before anything is written
(:mod:`builder.pipeline.row_independence`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from builder.client import Client
from builder.pipeline.row_independence import perturb, same_value
from builder.verify.container import ContainerEndpoint
from builder.verify.equality import check_same

THREADS = 8
COPIES = 3
"""Perturbed copies of each call tried (those the pipeline answers in process are sent)."""


def distinct_calls(pipe: Any, calls: Sequence[tuple[Any, ...]],
                   expected: Sequence[Any]) -> list[tuple[tuple[Any, ...], Any]]:
    """``calls`` with their answers, and perturbed copies of them that the pipeline answers
    in process (a copy it refuses, or one equal to a call already there, is left out)."""
    pairs = list(zip((tuple(c) for c in calls), expected))
    for k in range(1, COPIES + 1):
        for call in list(calls):
            copy = tuple(perturb(value, k) for value in call)
            if any(same_value(copy, known) for known, _ in pairs):
                continue
            try:
                pairs.append((copy, pipe(*copy)))
            except Exception:  # noqa: BLE001 - an input the pipeline refuses: not sent
                continue
    return pairs


def concurrent_check(model: str, pairs: Sequence[tuple[tuple[Any, ...], Any]], tolerance: float,
                     timeout: float) -> Any:
    """A verification check: every call of ``pairs`` sent at once from up to :data:`THREADS`
    threads (a client each) over gRPC, each answer equal to its in-process one within
    ``tolerance``."""

    def check(endpoint: ContainerEndpoint) -> None:
        url = f"grpc://{endpoint.grpc_url}/{model}"
        count = max(1, min(THREADS, len(pairs)))
        ready = threading.Barrier(count)
        failures: list[BaseException] = []

        def send(share: Sequence[tuple[tuple[Any, ...], Any]]) -> None:
            try:
                with Client(url, timeout=timeout) as client:
                    ready.wait(timeout)  # connected: then all send together
                    for call, reference in share:
                        check_same(client(*call), reference, tolerance, where=(
                            f"{model}{short_call(call)} over grpc, {count} requests in flight"))
            except BaseException as error:  # noqa: BLE001 - the first failure is raised below
                failures.append(error)
                ready.abort()

        # Daemon threads joined here: an interrupt of the build neither waits for their
        # requests to time out nor holds the interpreter's exit.
        threads = [threading.Thread(target=send, args=(pairs[start::count],), daemon=True,
                                    name=f"verify-concurrent-{start}") for start in range(count)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:
            ready.abort()
            raise
        if failures:
            raise failures[0]

    return check


def short_call(call: tuple[Any, ...]) -> str:
    """A call as a verification error quotes it."""
    text = repr(call)
    return text if len(text) <= 60 else text[:57] + "...)"
