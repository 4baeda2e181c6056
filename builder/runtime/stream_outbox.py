"""Where a stream's items wait to be sent, so that sending never holds the decoding loop.

Copied beside the pipeline's ``model.py`` as ``triton_builder_stream_outbox.py``.

A response sender's ``send`` is a round trip from the stub to the server (the python backend's
message queue), far longer than a small decoder's step. Sent from the loop that makes the items,
each send would stall every stream of the batch. So the loop only puts items here, and a thread
of the outbox sends them: a response carries every item its stream made since the last one was
sent (one item when sending keeps up, several when the loop is faster), a stream's items always
before its end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Outbox:
    """Items and ends of the streams of one batch, sent in order by a thread of their own.

    ``send_items(call, items)`` sends one response holding ``items`` (each one item's outputs,
    in the order made); ``send_end(call, response)`` ends a stream, with an error ``response``
    or ``None``. :meth:`close` returns once everything put here has been sent.
    """

    def __init__(self, send_items: Callable[[int, list[Any]], None],
                 send_end: Callable[[int, Any], None],
                 on_error: Callable[[str], None] = print) -> None:
        self._send_items = send_items
        self._send_end = send_end
        self._on_error = on_error
        self._items: dict[int, list[Any]] = {}
        self._ends: dict[int, Any] = {}
        self._closed = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="triton-builder-outbox",
                                        daemon=True)
        self._thread.start()

    def item(self, call: int, outputs: Any) -> None:
        with self._ready:
            self._items.setdefault(call, []).append(outputs)
            self._ready.notify()

    def end(self, call: int, response: Any = None) -> None:
        with self._ready:
            self._ends[call] = response
            self._ready.notify()

    def close(self) -> None:
        """Send what is left and stop the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not (self._items or self._ends or self._closed):
                    self._ready.wait()
                items, self._items = self._items, {}
                ends, self._ends = self._ends, {}
                closed = self._closed
            for call, batch in items.items():  # a stream's items before its end
                self._guarded(self._send_items, call, batch)
            for call, response in ends.items():
                self._guarded(self._send_end, call, response)
            if closed and not items and not ends:
                return

    def _guarded(self, send: Callable[[int, Any], None], call: int, value: Any) -> None:
        try:
            send(call, value)
        except Exception as error:  # noqa: BLE001 - one stream's failure; the others go on
            self._on_error(f"stream {call}: sending failed: {type(error).__name__}: {error}")
