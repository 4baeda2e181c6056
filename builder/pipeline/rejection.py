"""Operators that refuse their input: which exceptions mean "the input is bad".

Why it matters: served, every other exception of an operator is a server fault (gRPC
``INTERNAL``, HTTP 500), which load balancers count against the replica, retry policies retry
and alerts page someone for. Bytes that are not an image are the client's mistake. An operator
says so by raising :class:`builder.InputError`, or by declaring the exceptions of the libraries
it calls that mean bad input (``@rejects(PIL.UnidentifiedImageError)``); the pipeline then
answers ``INVALID_ARGUMENT`` / 400 with a message naming the operator and its input columns,
in process and served alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from builder.errors import InputError, PipelineError, RejectedInputError

ATTRIBUTE = "triton_builder_rejects"
"""Where :func:`rejects` keeps the exception classes on the operator (pickled with it)."""

_ADDRESS = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")

Op = TypeVar("Op")


def rejects(*exceptions: type[BaseException]) -> Callable[[Op], Op]:
    """Declare the exceptions that mean the operator's input is bad (a decorator for a
    function, an operator class, or a :func:`~builder.pipeline.vectorized` function).

    ``@rejects(UnidentifiedImageError, ValueError)`` above ``def decode(image)``: when
    ``decode`` raises one of them (or a subclass), the call fails as the caller's mistake
    (:class:`~builder.errors.RejectedInputError`; served, ``INVALID_ARGUMENT`` / HTTP 400)
    instead of a server fault. Any other exception stays a failure of the operator.
    """
    if not exceptions or not all(
            isinstance(e, type) and issubclass(e, Exception) for e in exceptions):
        raise PipelineError(f"rejects takes exception classes, got {exceptions!r}")

    def declare(op: Op) -> Op:
        if not callable(op):
            raise PipelineError(f"rejects decorates an operator, got {type(op).__name__}")
        setattr(op, ATTRIBUTE, tuple(getattr(op, ATTRIBUTE, ())) + exceptions)
        return op

    return declare


def rejected(op: Any, error: BaseException) -> bool:
    """Whether ``error``, raised by ``op``, means its input is bad."""
    return isinstance(error, (InputError, *getattr(op, ATTRIBUTE, ())))


def rejection(label: str, columns: tuple[str, ...], error: BaseException) -> RejectedInputError:
    """The error a rejected call reports: the operator and its input columns, then what the
    exception said, without the object addresses a repr carries (``<_io.BytesIO object at
    0x7f…>``): they tell the client nothing and differ on every request."""
    said = _ADDRESS.sub(r"<\1>", str(error)).strip() or type(error).__name__
    named = ", ".join(repr(c) for c in columns)
    kind = "" if isinstance(error, InputError) else f" ({type(error).__name__})"
    return RejectedInputError(
        f"operator {label} rejected its input {named}: {said}{kind}", operator=label,
        columns=columns)
