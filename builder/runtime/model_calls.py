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
from pathlib import Path
from typing import Any

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
