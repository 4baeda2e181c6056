"""The pipeline model's calls of its model operators: BLS, or ONNX Runtime in its own process.

Copied beside the pipeline's ``model.py`` as ``triton_builder_model_calls.py``, which it imports.
Everything Triton comes through the ``api`` the pipeline model passes (its ``Any``), so this
runs, and is tested, without Triton; like the pipeline model it imports nothing from
``builder`` and loads on Python 3.8.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np


class BlsError(RuntimeError):
    """A model operator's BLS request failed; ``unavailable`` where the model could not take it
    now (its queue full, or its latency budget spent: Triton's ``UNAVAILABLE``), which the
    pipeline's own answer then says too, so that the client may send it again."""

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


IN_PROCESS_PARAMETER = "in_process_models"
"""The pipeline model's config parameter naming the model operators it runs itself: a JSON
object, model name → its ONNX file relative to the model repository."""


class ModelCalls:
    """One model call for a batch of rows: in this process where a session is open, else BLS.

    Why in process: on the CPU base the ``onnxruntime`` backend is itself a python backend, so a
    BLS call is a second stub process and two shared-memory round trips, which cost more CPU
    than these models' compute. The models stay in the repository for clients to call.
    """

    def __init__(self, api: Any, sessions: dict[str, Any] | None = None) -> None:
        self.api = api
        self.sessions = {} if sessions is None else sessions

    def route(self, target: Any) -> str:
        """How a call of ``target`` goes: ``"in_process"`` or ``"bls"`` (a trace's attribute)."""
        return "in_process" if target.model_name in self.sessions else "bls"

    def __call__(self, target: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        session = self.sessions.get(target.model_name)
        if session is None:
            return bls_call(self.api, target, inputs)
        try:
            return session.run(list(target.output_names), inputs)
        except Exception as error:  # noqa: BLE001 - reported like a failed BLS request
            raise BlsError(f"model {target.model_name!r} (in process): {error}") from None


def bls_call(api: Any, target: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """One BLS request to ``target``'s model, in the shapes its config declares: a tensor with
    only the batch axis (``target.reshaped``) travels as ``[batch, 1]`` (Triton reshapes it
    to ``[batch]`` for the model, and its outputs back)."""
    reshaped = target.reshaped
    if not reshaped:
        return api.infer(target.model_name, inputs, target.output_names)
    sent = {name: array.reshape(len(array), 1) if name in reshaped else array
            for name, array in inputs.items()}
    outputs = api.infer(target.model_name, sent, target.output_names)
    return [output.reshape(len(output)) if name in reshaped else output
            for name, output in zip(target.output_names, outputs)]


HEAVY_RUN_S = 0.01
"""A model whose example runs longer than this (on the half of the cores a session gets first)
is compute-bound: its session is opened again with every core of its instance. Measured on
BERT-base, 2 CPUs: one thread 20 rows/s, two 32; the small models of the examples run in well
under a millisecond and stay on one thread, which costs them less CPU per row."""


def open_sessions(repository: Path, parameter: str | None, instances: int, api: Any,
                  examples: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    """ONNX Runtime sessions for the models ``parameter`` names; ``{}`` without onnxruntime.

    Each session with an example runs it once before the model is ready: ONNX Runtime plans
    and allocates on a session's first run, which made the first request after ready several
    times slower than the next ones; and how long that run took says whether the model is
    heavy enough for every core (:data:`HEAVY_RUN_S`).
    """
    models = json.loads(parameter) if parameter else {}
    if not models:
        return {}
    try:
        import onnxruntime as ort
    except ImportError as error:
        api.log_warning(f"model operators {sorted(models)} go through BLS: onnxruntime cannot "
                        f"be imported in the pipeline model's environment ({error})")
        return {}
    sessions = {}
    for name, path in models.items():
        session = _session(ort, repository / path, instances, wide=False)
        feeds = (examples or {}).get(name)
        if feeds is not None and _warm(session, feeds, api, name) > HEAVY_RUN_S and (
                _threads(instances, wide=True) > _threads(instances, wide=False)):
            session = _session(ort, repository / path, instances, wide=True)
            _warm(session, feeds, api, name)
        sessions[name] = session
    return sessions


def _session(ort: Any, path: Path, instances: int, wide: bool) -> Any:
    return ort.InferenceSession(str(path), sess_options=cpu_session_options(ort, instances, wide),
                                providers=["CPUExecutionProvider"])


def _warm(session: Any, feeds: dict[str, np.ndarray], api: Any, name: str) -> float:
    """One run on the example: its seconds (0 where it failed, which is only logged: requests
    would fail the same way, with their own error)."""
    started = time.perf_counter()
    try:
        session.run(None, feeds)
    except Exception as error:  # noqa: BLE001 - see above
        api.log_warning(f"model operator {name!r}: warm-up run failed: {error}")
        return 0.0
    return time.perf_counter() - started


def _threads(instances: int, wide: bool) -> int:
    return max(1, (os.cpu_count() or 1) // ((1 if wide else 2) * max(1, instances)))


def cpu_session_options(ort: Any, instances: int, wide: bool = False) -> Any:
    """No spinning threads, and half the cores per instance for each model run (``wide``: all
    of them, for a heavy model, :data:`HEAVY_RUN_S`).

    Measured on 2 cores: spinning intra-op threads burn the CPU that the server, the stubs and
    a local client need, and one thread per run costs less CPU per row than two on these
    small models. The other half of the cores is left to Triton's own processes.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = _threads(instances, wide)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


if TYPE_CHECKING:  # Python 3.8 cannot subscript collections.abc.Callable at run time
    Observer = Callable[[Any, int, int, Sequence[int], int, str | None], None]


class BatchingRunner:
    """Runs model operators, one model call for the rows whose non-batch shapes agree.

    ``observe`` (a trace's, :mod:`triton_builder_tracing`) is told of each model call: its
    target, when it started and ended (``time.time_ns``), the positions of the rows it
    answered (among those the runner was given), its batch size, and its error (``None``
    where it answered)."""

    def __init__(self, call: Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]],
                 observe: Observer | None = None) -> None:
        self.observe = observe
        self.call: Callable[..., list[np.ndarray]] = (
            call if observe is None else self._observed(call, observe))

    @staticmethod
    def _observed(call: Callable[[Any, dict[str, np.ndarray]], list[np.ndarray]],
                  observe: Observer) -> Callable[..., list[np.ndarray]]:
        def observed(target: Any, inputs: dict[str, np.ndarray],
                     positions: Sequence[int] = (0,)) -> list[np.ndarray]:
            first = next(iter(inputs.values()), None)
            size = 0 if first is None else len(first)
            started = time.time_ns()
            try:
                outputs = call(target, inputs)
            except Exception as error:
                observe(target, started, time.time_ns(), positions, size, str(error))
                raise
            observe(target, started, time.time_ns(), positions, size, None)
            return outputs
        return observed

    def _call(self, target: Any, inputs: dict[str, np.ndarray],
              positions: Sequence[int]) -> list[np.ndarray]:
        return (self.call(target, inputs) if self.observe is None
                else self.call(target, inputs, positions))

    def infer(self, op: Any, rows: Sequence[tuple[np.ndarray, ...]]) -> list[tuple]:
        target = op.served
        if target.max_batch_size == 0:  # a model that must see one row at a time
            return [tuple(self._call(target, dict(zip(target.input_names, row)), (index,)))
                    for index, row in enumerate(rows)]
        if getattr(op, "pad_values", None) and len(rows) > 1:
            return self._padded(op, rows)
        if len(rows) == 1:  # a lone request: no grouping, no merging, no splitting
            (row,) = rows
            _check_row_size(row[0].shape[0], target.max_batch_size, op.name)
            return [tuple(self._call(target, dict(zip(target.input_names, row)), (0,)))]
        results: list[Any] = [None] * len(rows)
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            key = tuple([(a.shape[1:], a.dtype) for a in row])
            groups.setdefault(key, []).append(index)
        for members in groups.values():
            sizes = [rows[i][0].shape[0] for i in members]
            for chunk in _chunks(members, sizes, target.max_batch_size, op.name):
                merged = {
                    name: rows[chunk[0]][k] if len(chunk) == 1 else
                    np.concatenate([rows[i][k] for i in chunk])
                    for k, name in enumerate(target.input_names)
                }
                outputs = self._call(target, merged, chunk)
                for index, row_outputs in zip(chunk, _split_rows(outputs, rows, chunk)):
                    results[index] = row_outputs
        return results

    def _padded(self, op: Any, rows: Sequence[tuple[np.ndarray, ...]]) -> list[tuple]:
        """Rows whose fixed axes agree in one call, padded to the longest along the varying
        ones, and each row's outputs cut back to its own lengths (the operator pads: its code
        travels in ``pipe.pickle``)."""
        target = op.served
        results: list[Any] = [None] * len(rows)
        groups: dict[tuple, list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault(op.pad_key(row), []).append(index)
        for members in groups.values():
            for index in members:
                _check_row_size(rows[index][0].shape[0], target.max_batch_size, op.name)
            grouped = [rows[i] for i in members]
            for positions in op.pad_chunks(grouped, target.max_batch_size):
                chunk = [members[p] for p in positions]
                merged, lengths = op.pad([rows[i] for i in chunk])
                answered = self._call(target, dict(zip(target.input_names, merged)), chunk)
                cut = op.cut(answered, [rows[i][0].shape[0] for i in chunk], lengths)
                for index, row_outputs in zip(chunk, cut):
                    results[index] = row_outputs
        return results


def _split_rows(outputs: Sequence[np.ndarray], rows: Sequence[tuple],
                chunk: list[int]) -> list[tuple]:
    """The outputs of one model call, back into one tuple of arrays per row."""
    if all(rows[i][0].shape[0] == 1 for i in chunk):  # the usual case: slicing beats np.split
        return [tuple(output[p:p + 1] for output in outputs) for p in range(len(chunk))]
    bounds = np.cumsum([rows[i][0].shape[0] for i in chunk])[:-1]
    parts = [np.split(output, bounds) for output in outputs]
    return [tuple(part[p] for part in parts) for p in range(len(chunk))]


def _chunks(members: list[int], sizes: list[int], limit: int, name: str) -> list[list[int]]:
    """Consecutive rows whose batch sizes add up to at most the model's ``max_batch_size``."""
    chunks: list[list[int]] = []
    total = 0
    for index, size in zip(members, sizes):
        _check_row_size(size, limit, name)
        if not chunks or total + size > limit:
            chunks.append([])
            total = 0
        chunks[-1].append(index)
        total += size
    return chunks


def _check_row_size(size: int, limit: int, name: str) -> None:
    if size > limit:
        raise BlsError(
            f"model operator {name!r}: one row has batch size {size}, more than the "
            f"model's max_batch_size {limit}"
        )
