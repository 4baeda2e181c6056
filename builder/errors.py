"""The errors a pipeline build reports.

Why a small hierarchy: callers (the CLI, tests, users' scripts) catch one base class,
:class:`PipelineError`, and still learn from the subclass what went wrong. Every message names the
operator and the column involved, because "which step of my pipeline is broken" is the question a
user asks first.
"""

from __future__ import annotations


class PipelineError(ValueError):
    """A pipeline is malformed: unknown or unproduced column, duplicate output, cycle, ..."""


class SignatureError(PipelineError):
    """A value does not fit (or cannot become) a typed Triton tensor."""


class OperatorError(PipelineError):
    """An operator raised while the pipeline ran; the original exception is ``__cause__``."""


class SerializationError(PipelineError):
    """An operator cannot be captured into ``pipe.pickle``."""


class ExportError(PipelineError):
    """No format in ``format_priority`` could export a model operator."""


class BuildError(PipelineError):
    """``build_pipeline_model`` could not write the repository (invalid options, I/O, ...)."""
