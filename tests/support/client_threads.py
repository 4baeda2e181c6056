"""Clients sending from threads of their own while a test does something to the server: the
load the drain, heal, rolling-update and stop tests keep up and judge afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


class ClientThreads:
    """Threads started when the ``with`` block begins and stopped (``stop`` set, each joined
    within 60 s) when it ends; ``lock`` guards what they record. A subclass sets what its
    workers need, then passes them as (target, arguments) pairs."""

    def __init__(self, workers: Iterable[tuple[Callable[..., None], tuple[Any, ...]]]) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=target, args=args, daemon=True)
                        for target, args in workers]

    def __enter__(self) -> ClientThreads:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
