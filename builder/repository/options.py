"""What :func:`builder.repository.build_pipeline_model` is asked: :class:`RepositoryOptions`.

Each option is documented once, here: in its field's ``help`` where a command line offers it
(:mod:`builder.cli.command_options` reads it), in the docstring under the field otherwise.
:func:`repository_options` makes the object a build takes from ``options=`` and keywords.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from builder.errors import BuildError
from builder.repository.batching import MAX_BATCH_SIZE
from builder.repository.export import TOLERANCE


@dataclass(frozen=True)
class RepositoryOptions:
    """What :func:`builder.repository.build_pipeline_model` takes besides the pipeline, where it
    writes and its target (the build chooses those per platform)."""

    format_priority: tuple[str, ...] = field(default=("onnx",), metadata={"help": (
        "Export formats of the model operators, in order.")})
    """An operator's ``op_config`` may override it."""
    parallelism: int = field(default=1, metadata={"help": (
        "Instances of the pipeline model (each runs its Python operators on one "
        "core).")})
    name: str = "pipeline"
    """The pipeline model's name (a Triton model name; no model operator may have it)."""
    op_defaults: Mapping[str, Any] | None = None
    """An ``op_config`` applied to every model operator."""
    max_batch_size: int = MAX_BATCH_SIZE
    """The pipeline model's ``max_batch_size``."""
    dynamic_batching: Mapping[str, Any] | None = None
    """The pipeline model's ``dynamic_batching`` (default: by target, from
    :mod:`builder.repository.batching`; ``{}`` is Triton's defaults)."""
    export_tolerance: float = field(default=TOLERANCE, metadata={"help": (
        "The export's check of each model operator against torch, and of its "
        "rows' independence (tolerance is the verification's).")})
    in_process: bool | None = None
    """Whether the pipeline model runs its CPU ONNX model operators itself, in ONNX Runtime,
    instead of through BLS; by default it does unless the target is a GPU release: on the CPU
    base the ``onnxruntime`` backend is another python stub (see
    :mod:`builder.runtime.pipeline_model`). Every model operator keeps its own Triton model
    either way."""
    latency_budget_ms: float | None = field(default=None, metadata={"help": (
        "Latency budget of a request: what would wait longer in a queue is "
        "refused at once with UNAVAILABLE (queue policies).")})
    """The queue policy of the pipeline model and its model operators
    (:mod:`builder.repository.queue_policy`); each such model gets two instances at least."""
    max_queue_size: int | None = None
    """Bounds the pipeline model's queue."""
    max_request_bytes: int | None = field(default=None, metadata={"help": (
        "The largest request served; a larger one is answered INVALID_ARGUMENT / "
        "400 (default: 16 MiB, or 64 times the largest example).")})
    """See :mod:`builder.repository.request_limit`; one over it is refused before it is
    decoded."""
    model_settings: Mapping[str, Mapping[str, Any]] | None = None
    """A model operator's name → an ``op_config`` that overrides its own (a tuning file's
    settings, :mod:`builder.tune`); a name that is no model operator is refused."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "format_priority", tuple(self.format_priority))


def repository_options(options: RepositoryOptions | None,
                       keywords: Mapping[str, Any]) -> RepositoryOptions:
    """``options`` (default: :class:`RepositoryOptions`'s defaults) with ``keywords`` set on it;
    anything else given as ``options``, or a keyword that is no field, is refused (naming the
    keyword and the fields)."""
    if options is not None and not isinstance(options, RepositoryOptions):
        raise BuildError(f"options must be a RepositoryOptions, got {type(options).__name__}")
    known = [each.name for each in fields(RepositoryOptions)]
    for keyword in keywords:
        if keyword not in known:
            close = difflib.get_close_matches(keyword, known, n=3)
            raise BuildError(f"build_pipeline_model got an unknown keyword {keyword!r}"
                             + (f"; did you mean {', '.join(close)}?" if close else "")
                             + f" (its keywords: {', '.join(known)})")
    return replace(options or RepositoryOptions(), **keywords)
