"""Functions written for a batch, as operators: ``@vectorized``.

Why: pre- and post-processing written over NumPy arrays with a leading batch axis gain from
Triton's dynamic batching as models do — the served pipeline calls such a function once for the
rows of a whole batch whose arguments agree in shape and dtype. In process a call is a batch of
one. Row ``i`` of the result must come from row ``i`` alone
(:mod:`builder.pipeline.row_independence` checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from builder.errors import PipelineError
from builder.pipeline.operators import operator_name


class Vectorized:
    """A function written for a batch, as an operator: see :func:`vectorized`."""

    def __init__(self, function: Callable[..., Any], batch: bool = True) -> None:
        if not callable(function):
            raise PipelineError(f"vectorized needs a function, got {type(function).__name__}")
        self.function = function
        self.batch = batch
        """``False``: one call per row, for a function whose rows depend on each other."""
        self.__qualname__ = operator_name(function)  # how errors and labels name it
        self.__doc__ = getattr(function, "__doc__", None)

    def __repr__(self) -> str:
        return f"vectorized({self.__qualname__})"

    def __call__(self, *args: Any) -> Any:
        return self.call_batch([args])[0]

    def call_batch(self, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        """One call of the function per group of rows whose arguments agree in shape and dtype."""
        results: list[Any] = [None] * len(rows)
        groups = _stacked_groups(rows) if self.batch else [
            ([index], [np.asarray(a)[None] for a in row]) for index, row in enumerate(rows)]
        for members, arrays in groups:
            outputs = self.function(*arrays)
            several = isinstance(outputs, tuple)
            columns = [np.asarray(o) for o in (outputs if several else (outputs,))]
            for column in columns:
                if column.ndim == 0 or column.shape[0] != len(members):
                    raise PipelineError(
                        f"vectorized operator {self.__qualname__!r} returned shape "
                        f"{list(column.shape)} for a batch of {len(members)}: every output "
                        "keeps the leading batch axis"
                    )
            for position, index in enumerate(members):
                row = tuple(column[position] for column in columns)
                results[index] = row if several else row[0]
        return results


def vectorized(function: Callable[..., Any] | None = None, *,
               batch: bool = True) -> Any:
    """Use ``function``, written for a batch, as a pipeline operator (a decorator:
    ``@vectorized``, or ``@vectorized(batch=False)``).

    ``function`` takes one NumPy array per input column, each with a leading batch axis, and
    returns one array (or a tuple, one per output column) with the same leading axis. The
    executor hands it every row of a dynamic batch at once, grouped by the shapes and dtypes of
    the arguments (rows that differ go in separate calls); in process, one call is a batch of
    one. Row ``i`` of the result must depend on row ``i`` of the arguments only: the build
    checks it and refuses a function whose rows depend on each other
    (:mod:`builder.pipeline.row_independence`); ``batch=False`` calls such a function on one
    row at a time, served too.
    """
    if function is None:
        return lambda wrapped: Vectorized(wrapped, batch)
    return Vectorized(function, batch)


def _stacked_groups(rows: Sequence[tuple[Any, ...]]) -> list[tuple[list[int], list[np.ndarray]]]:
    """Rows whose arguments agree in shape and dtype, each argument stacked on a batch axis."""
    if len(rows) == 1:  # a call in process: no grouping, nothing to copy
        return [([0], [np.asarray(a)[None] for a in rows[0]])]
    arrays = [[np.asarray(a) for a in row] for row in rows]
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(arrays):
        groups.setdefault(tuple([(a.shape, a.dtype) for a in row]), []).append(index)
    return [(members, [np.stack([arrays[i][k] for i in members])
                       for k in range(len(arrays[members[0]]))])
            for members in groups.values()]
