"""The root of every error Triton Builder raises, and the pipeline's own family.

Why a root: a script calling ``build_docker_image`` catches :class:`TritonBuilderError` and knows
the failure is ours, not a bug in its own code. Every error also derives from the built-in
category it belongs to (``ValueError`` for bad input, ``RuntimeError`` for a failed step,
``ConnectionError``/``TimeoutError`` for a server), as docker-py's do, so existing ``except``
clauses and the CLI's exit codes keep working. Each stage keeps its family beside its code
(``environment/errors.py``, ``bridge/errors.py``, ``client/errors.py``,
``ImageBuildError`` in ``engine/``, ``VerificationError`` in ``verify/``…); the
pipeline's family lives here because every stage reports pipeline faults.

Pipeline errors name the operator and the column involved, because "which step of my pipeline
is broken" is the question a user asks first.
"""

from __future__ import annotations


class TritonBuilderError(Exception):
    """Any failure Triton Builder reports (as opposed to a bug in the caller's code)."""


class InputError(TritonBuilderError, ValueError):
    """The input is the caller's mistake: a value that does not fit the model (found by the
    client before anything is sent), or one an operator refused.

    Served, an operator's refusal is answered gRPC ``INVALID_ARGUMENT`` / HTTP 400, never
    retried; the client raises it again (:class:`builder.client.errors.RemoteInputError`), so one
    ``except InputError`` catches bad input wherever it was found."""


class PipelineError(TritonBuilderError, ValueError):
    """A pipeline is malformed: unknown or unproduced column, duplicate output, cycle, ..."""


class SignatureError(PipelineError):
    """A value does not fit (or cannot become) a typed Triton tensor."""


class OperatorError(PipelineError):
    """An operator raised while the pipeline ran; the original exception is ``__cause__``."""

    attributed: bool = False
    """Whether the message names the operator already (the executor's own wording)."""


class RejectedInputError(OperatorError, InputError):
    """An operator refused its input: it raised :class:`InputError`, or an exception it
    declared with :func:`builder.pipeline.rejects`. ``operator`` and ``columns`` say which
    operator and which of its input columns; the original exception is ``__cause__``."""

    def __init__(self, message: str, operator: str = "", columns: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.operator = operator
        self.columns = columns


class SerializationError(PipelineError):
    """An operator cannot be captured into ``pipe.pickle``."""


class ExportError(PipelineError):
    """No format in ``format_priority`` could export a model operator."""


class RowDependenceError(PipelineError):
    """An operator that runs on batches answers a row differently beside other rows: served,
    a dynamic batch holds other requests' rows, so its answers would depend on them."""


class BuildError(PipelineError):
    """``build_pipeline_model`` could not write the repository (invalid options, I/O, ...)."""


class TuneError(TritonBuilderError, RuntimeError):
    """``tune`` could not find a setting within the latency budget, or could not measure one;
    the message says the best p99 it saw."""
