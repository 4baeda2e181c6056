"""The pipeline model's warm-up: its examples run through the served pipeline in ``initialize``.

Copied beside the pipeline's ``model.py`` as ``triton_builder_warm_up.py``. Why: the first
request after ready paid every cold start of the pipeline's own process — a processor's lazy
imports, Pillow's plugins, a torch module's first run in Python, ONNX Runtime's first plan — up
to 13 times the next requests' time (issue 66). Triton marks the pipeline model ready when
``initialize`` returns, so what runs here is paid before any client is told it may send.

Two steps, both before ready. In ``initialize`` the examples (``pipe.examples``, the calls the
build typed and verified the pipeline with) run one at a time, as requests that come alone do,
then together, as a dynamic batch does, through the same executor that serves: every operator,
and every model call made in this process (the in-process ONNX Runtime sessions). Then Triton
sends the same examples as requests (the pipeline model's ``model_warmup``, written by
:mod:`builder.repository.model_warmup`; not for a streaming pipeline), which ``execute`` serves
as it serves every request: what the first request paid beyond the pipeline's code is the
stub's first request, its decoding and encoding (20 ms here against 1.2 ms after).

A model operator served over BLS cannot be called in either: Triton refuses inference until
every model of the repository has loaded ("Server not ready", ``InferenceServer::InferAsync``,
core r24.10), and the python backend does not support BLS in ``initialize``. Its model warms
itself (its own ``model_warmup``); an example's call stops at it (:class:`ServedLater`; a
warm-up sample so stopped is answered empty, which Triton accepts) and the operators after it
are reported as left cold. A call that fails otherwise fails the load, naming the operator (the
verification ran the same code on the same examples).

Where the image's server runs with explicit model control, its supervisor then sends the same
samples through Triton's HTTP front end before readiness opens
(:mod:`builder.runtime.supervisor.ready_gate`): the front end's first inference, and every call
over BLS, paid before ready too; those requests carry :data:`REQUEST_PARAMETER`.

``docker run -e TRITON_BUILDER_WARM_UP=0`` starts a replica without running the examples
(:data:`SWITCH`): Triton still sends its samples, answered at once, empty.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_EXAMPLES = 8
"""The examples a warm-up runs at most (the first ones): each is one call, and then all of them
one batch; a pipeline with many large examples should not start the slower for all of them."""


SWITCH = "TRITON_BUILDER_WARM_UP"
"""The environment variable that turns the warm-up off where it is ``0``."""


REQUEST_PARAMETER = "builder_warm_up"
"""The request parameter of the warm-up requests the image's supervisor sends through the
front end before it opens readiness (:mod:`builder.runtime.supervisor.ready_gate`). Not
``triton_…``: Triton refuses request parameters of that prefix (reserved)."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether this replica warms up (unless :data:`SWITCH` says ``0``)."""
    return environ.get(SWITCH, "1").strip() != "0"


def marked(parameters: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a batch is the warm-up's alone (every request marked with
    :data:`REQUEST_PARAMETER`): served as any batch, but left out of the metrics and traces,
    which count what clients sent."""
    return bool(parameters) and all(REQUEST_PARAMETER in each for each in parameters)


class WarmUpError(RuntimeError):
    """An example failed in the served pipeline: the model does not load."""


SERVED_LATER = "served over BLS, which Triton takes once the server is ready"


class ServedLater(RuntimeError):
    """A model call the warm-up cannot make: the model is served over BLS."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r}: {SERVED_LATER}")
        self.model = model


def stopped_at(message: str | None) -> str | None:
    """The BLS model a warm-up call stopped at, read from its error (the executor's, which
    names what the operator raised; an error response's message is the same text)."""
    found = re.search(rf"model '([^']+)': {SERVED_LATER}", message or "")
    return found.group(1) if found else None


class InProcessCalls:
    """The warm-up's model calls: the sessions of this process; any other model is served over
    BLS, which the warm-up cannot reach (:class:`ServedLater`)."""

    def __init__(self, calls: Any, sessions: dict[str, Any]) -> None:
        self.calls = calls
        self.sessions = sessions

    def __call__(self, target: Any, inputs: dict[str, Any]) -> list[Any]:
        if target.model_name not in self.sessions:
            raise ServedLater(target.model_name)
        return self.calls(target, inputs)


@dataclass
class WarmUpReport:
    """What the warm-up ran: examples, seconds, and the BLS models its calls stopped at."""

    examples: int = 0
    seconds: float = 0.0
    stopped_at: set[str] = field(default_factory=set)
    samples: int = 0
    """Triton's warm-up samples served (the examples as requests)."""

    def describe(self) -> str:
        text = (f"warmed up on {self.examples} example(s), alone and together in "
                f"{self.seconds * 1000:.0f} ms, then as {self.samples} request(s)")
        if self.stopped_at:
            text += (f"; the operators after the model(s) {sorted(self.stopped_at)} are left "
                     "cold (served over BLS, which Triton serves only once the server is ready; "
                     "those models warm themselves with their model_warmup)")
        return text


def warm_up(pipeline: Any, examples: Sequence[tuple]) -> WarmUpReport:
    """Run ``examples`` (``pipe.pickle`` keeps the first :data:`MAX_EXAMPLES`) through
    ``pipeline`` whose model operators are bound to :class:`InProcessCalls`, alone and then
    together."""
    chosen = [tuple(example) for example in examples]
    report = WarmUpReport(examples=len(chosen))
    started = time.perf_counter()
    rounds = [[position] for position in range(len(chosen))]
    if len(chosen) > 1:
        rounds.append(list(range(len(chosen))))
    for positions in rounds:
        results = pipeline.run([chosen[position] for position in positions])
        for position, result in zip(positions, results):
            if result.ok:
                continue
            later = stopped_at(str(result.error))
            if later is None:
                raise WarmUpError(f"the warm-up on example {position} failed: {result.error}")
            report.stopped_at.add(later)
    report.seconds = time.perf_counter() - started
    return report

