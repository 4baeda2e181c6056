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


class PipelineError(TritonBuilderError, ValueError):
    """A pipeline is malformed: unknown or unproduced column, duplicate output, cycle, ..."""


class SignatureError(PipelineError):
    """A value does not fit (or cannot become) a typed Triton tensor."""


class OperatorError(PipelineError):
    """An operator raised while the pipeline ran; the original exception is ``__cause__``."""


class SerializationError(PipelineError):
    """An operator cannot be captured into ``pipe.pickle``."""


class ExportError(PipelineError):
    """No format in ``format_priority`` could export a model operator."""


class RowDependenceError(PipelineError):
    """An operator that runs on batches answers a row differently beside other rows: served,
    a dynamic batch holds other requests' rows, so its answers would depend on them."""


class BuildError(PipelineError):
    """``build_pipeline_model`` could not write the repository (invalid options, I/O, ...)."""
