"""``build_pipeline_model``: a pipeline → a complete Triton model repository.

The repository holds one pipeline model (python backend, :mod:`builder.runtime.pipeline_model`
with ``pipe.pickle``) and one model per model operator, exported in ``format_priority`` order.

Everything that can be checked is checked before anything is written — options, the DAG, the
types (by running the examples), whether each operator can be serialized — and each error names
the operator and column. The repository is then written to a temporary directory beside
``model_root`` and moved into place, so a failed build (an unexportable model, a full disk)
leaves the previous repository untouched.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.errors import BuildError, PipelineError
from builder.pipeline.dsl import PipeBuilder, Pipeline
from builder.pipeline.op_config import validate_op_config
from builder.pipeline.operators import BlsTarget, ModelOp
from builder.pipeline.row_independence import check_row_independence
from builder.pipeline.serialization import PIPELINE_FILE, VERSIONS_FILE, check_serializable, dumps
from builder.pipeline.serialization import versions_record as _versions_record
from builder.pipeline.signature import PipelineSignature
from builder.pipeline.signature_document import signature_parameter
from builder.repository.batching import MAX_BATCH_SIZE, default_batching, fitted_max_batch_size
from builder.repository.config_rules import check_config
from builder.repository.export import (
    EXPORT_FORMATS,
    ExportAttempt,
    check_formats,
    export_model,
    reference_outputs,
    row_bytes,
)
from builder.repository.model_config import (
    ModelConfigSpec,
    TensorConfig,
    build_config,
    write_config,
)
from builder.repository.model_warmup import operator_samples, pipeline_samples, write_samples
from builder.repository.options import RepositoryOptions, repository_options
from builder.repository.queue_policy import (
    MIN_INSTANCES,
    OPERATOR_SHARE,
    PIPELINE_SHARE,
    QueuePolicy,
    queue_policy,
)
from builder.repository.request_limit import MAX_REQUEST_PARAMETER, shm_size
from builder.repository.request_limit import max_request_bytes as max_request_bytes_for
from builder.runtime.warm_up import MAX_EXAMPLES as WARM_UP_EXAMPLES

if TYPE_CHECKING:
    from builder.base.releases import Release

PIPELINE_RUNTIME = Path(__file__).parents[1] / "runtime" / "pipeline_model.py"
RUNTIME_COMPANIONS = ("drain.py", "model_batching.py", "model_calls.py", "operator_metrics.py",
                      "request_size.py", "stream_serving.py", "stream_outbox.py", "tracing.py",
                      "warm_up.py")
"""The modules of :mod:`builder.runtime` the pipeline's ``model.py`` imports, copied beside it as
``triton_builder_<name>``: how it takes part in a replica's orderly stop (``drain``), batches
rows into model calls (``model_batching``) and calls its model operators (``model_calls``),
reports each operator (``operator_metrics``), bounds a request (``request_size``), serves a
streaming pipeline (``stream_serving``, whose items ``stream_outbox`` sends), traces its
requests (``tracing``) and runs its examples before it is ready (``warm_up``)."""
IN_PROCESS_PARAMETER = "in_process_models"
"""Read by :mod:`builder.runtime.pipeline_model` (which imports nothing from ``builder``)."""
DEFAULT_OP_CONFIG: dict[str, Any] = {
    "instance_count": 1,
    "max_batch_size": MAX_BATCH_SIZE,
}
"""Defaults for every model operator, under ``op_defaults`` and each ``op_config``; dynamic
batching by target, from :mod:`builder.repository.batching`."""

_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

log = logging.getLogger(__name__)


@dataclass
class BuiltModel:
    """One model of the built repository: its format and every format tried for it."""

    name: str
    format: str
    attempts: list[ExportAttempt] = field(default_factory=list)
    gpu: bool = False
    """Whether its instances are ``KIND_GPU``."""
    in_process: bool = False
    """Whether the pipeline model runs it itself (ONNX Runtime) rather than through BLS."""


@dataclass
class BuildResult:
    """What ``build_pipeline_model`` wrote."""

    model_root: Path
    pipeline_model: str
    signature: PipelineSignature
    models: list[BuiltModel]
    max_request_bytes: int | None = None
    """The largest request the pipeline model serves (its config's ``max_request_bytes``)."""

    @property
    def shm_size(self) -> str | None:
        """The ``docker run --shm-size`` its requests need; ``None``: Docker's default."""
        return None if self.max_request_bytes is None else shm_size(self.max_request_bytes)

    def report(self) -> str:
        """Human-readable summary, including why formats fell through."""
        lines = [f"{self.model_root}: pipeline model {self.pipeline_model!r}",
                 self.signature.describe()]
        for model in self.models:
            lines.append(f"model {model.name!r}: {model.format}")
            lines.extend(f"  {a.format} failed: {a.reason}" for a in model.attempts if not a.ok)
        return "\n".join(lines)


def build_pipeline_model(
    pipe: Pipeline,
    model_root: str | os.PathLike = "models",
    options: RepositoryOptions | None = None,
    *,
    target: Release | None = None,
    **keywords: Any,
) -> BuildResult:
    """Write the Triton model repository serving ``pipe`` to ``model_root``.

    ``options`` (a :class:`~builder.repository.options.RepositoryOptions`, where each option is
    documented) with ``keywords`` set on it — each keyword one of its fields; another is
    refused. ``target`` (a :class:`~builder.base.releases.Release`) places the model
    operators: on a GPU release they get ``KIND_GPU`` instances unless their ``op_config`` says
    ``"device": "cpu"``, on the CPU base ``KIND_CPU``; without a target only ``device_ids`` or
    ``"device": "gpu"`` make them GPU models. The pipeline model always runs on the CPU.

    Three steps: the options checked, everything decided (:class:`_Plan`), then written.
    Raises a :class:`PipelineError` subclass, before anything is written, for a bad pipeline or
    option.
    """
    chosen = repository_options(options, keywords)
    _validate(pipe, chosen)
    plan = _plan(pipe, chosen, target)
    root = Path(model_root).absolute()
    with _staging(root) as staging:
        built = _write(staging, pipe, plan, chosen.export_tolerance)
    result = BuildResult(root, chosen.name, plan.signature, built, max_request_bytes=plan.limit)
    log.info("%s", result.report())
    return result


@dataclass(frozen=True)
class _ModelPlan:
    """A model operator's part of the plan: its formats, and its config as far as it is decided
    before the export (which adds its tensors, backend and warm-up samples)."""

    op: ModelOp
    formats: list[str]
    spec: ModelConfigSpec
    batch_chosen: bool = True
    """Whether its ``max_batch_size`` (or a preferred batch size) was set, by ``op_config``,
    ``op_defaults`` or ``model_settings``; if not, the export fits it to the module's rows
    (:func:`~builder.repository.batching.fitted_max_batch_size`)."""


@dataclass(frozen=True)
class _Plan:
    """The repository, decided: what :func:`_write` writes, and nothing left to check."""

    signature: PipelineSignature
    limit: int
    models: Mapping[str, _ModelPlan]
    pipeline: ModelConfigSpec
    in_process: bool
    """Whether the pipeline model runs its CPU ONNX model operators itself."""


def _validate(pipe: Pipeline, options: RepositoryOptions) -> None:
    """The checks of the pipeline's kind and of the options that need nothing else."""
    if isinstance(pipe, PipeBuilder):
        raise BuildError("the pipeline is unfinished: end it with .output(...)")
    if not isinstance(pipe, Pipeline):
        raise BuildError(f"expected a Pipeline, got {type(pipe).__name__}")
    parallelism, max_batch_size = options.parallelism, options.max_batch_size
    if not isinstance(parallelism, int) or parallelism < 1:
        raise BuildError(f"parallelism must be a positive int, got {parallelism!r}")
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise BuildError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
    if not _MODEL_NAME.match(options.name):
        raise BuildError(f"{options.name!r} is not a valid Triton model name")
    check_formats(options.format_priority, "build_pipeline_model")


def _plan(pipe: Pipeline, options: RepositoryOptions, target: Release | None) -> _Plan:
    """Everything decided, and checked, before anything is written."""
    name = options.name
    budget = validate_op_config({key: value for key, value in (
        ("latency_budget_ms", options.latency_budget_ms),
        ("max_queue_size", options.max_queue_size)) if value is not None}, name)
    defaults = {**DEFAULT_OP_CONFIG,
                **validate_op_config(options.op_defaults or {}, "op_defaults")}
    batching = validate_op_config({"dynamic_batching": (
        default_batching(target, "pipeline") if options.dynamic_batching is None
        else options.dynamic_batching)}, name)["dynamic_batching"]
    signature = pipe.signature()
    limit = max_request_bytes_for(options.max_request_bytes, signature, pipe.examples)
    check_row_independence(pipe, options.export_tolerance)
    model_ops = pipe.model_ops()
    models = _model_plans(model_ops, defaults, options, target)
    if name in models:
        raise BuildError(
            f"model operator {name!r} has the same name as the pipeline model; rename one"
        )
    _check_serializable(pipe, model_ops)
    policy = queue_policy(budget.get("latency_budget_ms"), PIPELINE_SHARE,
                          budget.get("max_queue_size"))
    spec = _pipeline_spec(pipe, signature, options, limit, batching, policy)
    check_config(build_config(spec), name)
    return _Plan(signature, limit, models, spec, _in_process(options.in_process, target))


def _model_plans(model_ops: Sequence[ModelOp], defaults: dict[str, Any],
                 options: RepositoryOptions, target: Release | None) -> dict[str, _ModelPlan]:
    """Each model operator's formats and config (every operator's formats checked before any
    placement), then where it runs, its batching and its queue policy."""
    overrides = _model_settings(options.model_settings or {}, model_ops)
    configs = {op.name: _model_plan(op, defaults, options.format_priority,
                                    overrides.get(op.name, {})) for op in model_ops}
    placements = {name: placement(config, target, name) for name, (_, config) in configs.items()}
    plans = {}
    for op in model_ops:
        formats, config = configs[op.name]
        policy = queue_policy(config.get("latency_budget_ms", options.latency_budget_ms),
                              1.0 if "latency_budget_ms" in config else OPERATOR_SHARE,
                              config.get("max_queue_size"))
        gpu, device_ids = placements[op.name]
        plans[op.name] = _ModelPlan(op, formats, ModelConfigSpec(
            name=op.name, inputs=(), outputs=(), max_batch_size=config["max_batch_size"],
            instance_count=_instances(config["instance_count"], policy),
            gpu=gpu, device_ids=device_ids,
            dynamic_batching=config.get("dynamic_batching", default_batching(target, "model")),
            queue_policy=policy), _batch_chosen(config, op, options, overrides.get(op.name, {})))
    return plans


def _batch_chosen(config: Mapping[str, Any], op: ModelOp, options: RepositoryOptions,
                  override: Mapping[str, Any]) -> bool:
    chosen = (options.op_defaults or {}, op.op_config, override)
    return (any("max_batch_size" in source for source in chosen)
            or bool((config.get("dynamic_batching") or {}).get("preferred_batch_size")))


def _check_serializable(pipe: Pipeline, model_ops: Sequence[ModelOp]) -> None:
    """Every node can be pickled, its model operators standing in as BLS targets."""
    placeholders = {
        op.name: BlsTarget(op.name, "?", op.input_names, (), 1) for op in model_ops
    }
    for node in pipe.nodes:
        check_serializable(node.op, node.label, placeholders)


def _pipeline_spec(pipe: Pipeline, signature: PipelineSignature, options: RepositoryOptions,
                   limit: int, batching: Any, policy: QueuePolicy | None) -> ModelConfigSpec:
    """The pipeline model's config (its in-process models are added once exported)."""
    return ModelConfigSpec(
        name=options.name,
        inputs=_tensors(signature.inputs),
        outputs=_tensors(signature.outputs),
        max_batch_size=options.max_batch_size,
        backend="python",
        instance_count=_instances(options.parallelism, policy),
        dynamic_batching=batching,
        queue_policy=policy,
        parameters={**signature_parameter(signature),  # lets any client rebuild the values
                    MAX_REQUEST_PARAMETER: str(limit)},
        decoupled=pipe.streaming is not None,
        warmup=() if pipe.streaming is not None else pipeline_samples(
            signature, pipe.examples[:WARM_UP_EXAMPLES]),  # the examples pipe.pickle keeps
    )


def _write(staging: Path, pipe: Pipeline, plan: _Plan, tolerance: float) -> list[BuiltModel]:
    """The planned repository written into ``staging``: each model operator exported with its
    config, then the pipeline model."""
    built, targets = [], {}
    for model in plan.models.values():
        targets[model.op.name], written = _write_model(staging, model, tolerance)
        built.append(written)
    own = {}  # the model operators the pipeline model runs itself: model -> file
    for name, model in plan.models.items() if plan.in_process else ():
        record = EXPORT_FORMATS[targets[name].format]
        if record.in_process and not model.spec.gpu:
            own[name] = f"{name}/1/{record.model_file}"
    for each in built:
        each.in_process = each.name in own
    _write_pipeline_model(staging / plan.pipeline.name, pipe, plan.signature, targets, own,
                          replace(plan.pipeline, parameters={
                              **plan.pipeline.parameters,
                              **({IN_PROCESS_PARAMETER: json.dumps(own, sort_keys=True)}
                                 if own else {}),
                          }))
    return built


def _write_model(staging: Path, model: _ModelPlan,
                 tolerance: float) -> tuple[BlsTarget, BuiltModel]:
    """One model operator exported, its warm-up samples and config written beside it: how the
    pipeline model calls it, and what was built."""
    op, spec, version_dir = model.op, model.spec, staging / model.op.name / "1"
    reference = reference_outputs(op)
    if not model.batch_chosen:
        fitted = fitted_max_batch_size(row_bytes(reference), spec.max_batch_size)
        if fitted != spec.max_batch_size:
            log.info("model operator %r: max_batch_size %d (rows of %d bytes)", op.name, fitted,
                     row_bytes(reference))
        spec = replace(spec, max_batch_size=fitted)
    exported = export_model(op, version_dir, model.formats, tolerance,
                            max(1, spec.max_batch_size), reference=reference)
    inputs, outputs = _with_batch_dims(exported, spec.max_batch_size)
    warmup = operator_samples(op.name, inputs, op.example_arrays(), spec.max_batch_size,
                              spec.dynamic_batching)
    write_samples(staging / op.name, warmup)
    model_config = build_config(replace(spec, inputs=inputs, outputs=outputs,
                                        backend=exported.backend, platform=exported.platform,
                                        warmup=warmup))
    record = EXPORT_FORMATS[exported.format]
    if record.check_model is not None:
        record.check_model(model_config, version_dir / record.model_file)
    write_config(model_config, staging / op.name)
    target = BlsTarget(
        op.name, exported.format,
        tuple(t.name for t in inputs), tuple(t.name for t in outputs), spec.max_batch_size,
        reshaped=tuple(t.name for t in (*inputs, *outputs) if not t.dims),
    )
    return target, BuiltModel(op.name, exported.format, exported.attempts, gpu=spec.gpu)


def _with_batch_dims(exported: Any, max_batch_size: int) -> tuple[list[TensorConfig],
                                                                   list[TensorConfig]]:
    """The model's tensors as its config declares them: without the batch axis, which Triton
    adds, for a batching model; with it (``-1``) for one that takes one row per request
    (``max_batch_size`` 0, the opt-out of :mod:`builder.pipeline.row_independence`)."""
    if max_batch_size > 0:
        return exported.inputs, exported.outputs
    return ([replace(t, dims=(-1, *t.dims)) for t in exported.inputs],
            [replace(t, dims=(-1, *t.dims)) for t in exported.outputs])


def _instances(count: int, policy: QueuePolicy | None) -> int:
    """``count``, or :data:`MIN_INSTANCES` for a model under a queue policy (see
    :mod:`builder.repository.queue_policy`: one instance stalls requests there)."""
    return max(count, MIN_INSTANCES) if policy is not None else count


def _model_settings(settings: Mapping[str, Mapping[str, Any]],
                    model_ops: Sequence[ModelOp]) -> dict[str, dict[str, Any]]:
    known = sorted(op.name for op in model_ops)
    unknown = sorted(set(settings).difference(known))
    if unknown:
        raise BuildError(f"model_settings names {unknown}, which are no model operators of this "
                         f"pipeline (it has {known})")
    return {name: validate_op_config(config, f"model_settings[{name!r}]")
            for name, config in settings.items()}


def _model_plan(op: ModelOp, defaults: dict[str, Any], format_priority: Sequence[str],
                override: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    config = {**defaults, **op.op_config, **override}
    formats = check_formats(config.pop("format_priority", format_priority),
                            f"model operator {op.name!r}")
    return formats, config


def placement(config: Mapping[str, Any], target: Release | None,
              owner: str) -> tuple[bool, tuple[int, ...]]:
    """Where a model operator's instances run: (GPU?, pinned GPU ids) from ``op_config``.

    A GPU release puts every model on the GPUs (what the image is for) unless the operator asks
    for ``"device": "cpu"``; the CPU base has no GPU, so asking for one there is an error rather
    than a model that never loads.
    """
    device = config.get("device")
    device_ids = tuple(config.get("device_ids", ()))
    if device == "cpu":
        return False, ()
    if target is not None and not target.gpu:
        if device == "gpu" or device_ids:
            asked = f"GPUs {list(device_ids)}" if device_ids else "device 'gpu'"
            raise BuildError(
                f"model operator {owner!r} asks for {asked}, but {target.describe()} has no "
                f"GPU: build with cuda= a CUDA version, or drop the GPU request from its op_config"
            )
        return False, ()
    if device_ids:
        return True, device_ids
    return device == "gpu" or (target is not None and target.gpu), ()


def _tensors(specs: Mapping[str, Any]) -> list[TensorConfig]:
    return [TensorConfig(n, s.dtype, s.served_dims) for n, s in specs.items()]


def _in_process(wanted: bool | None, target: Release | None) -> bool:
    return (target is None or not target.gpu) if wanted is None else wanted


def _write_pipeline_model(directory: Path, pipe: Pipeline, signature: PipelineSignature,
                          targets: Mapping[str, BlsTarget], in_process: Mapping[str, str],
                          spec: ModelConfigSpec) -> None:
    version = directory / "1"
    version.mkdir(parents=True)
    served = copy.copy(pipe)
    served.examples = pipe.examples[:WARM_UP_EXAMPLES]  # what initialize warms up on
    served._signature = signature
    payload, referenced = dumps(served, targets)
    (version / PIPELINE_FILE).write_bytes(payload)
    (version / VERSIONS_FILE).write_text(
        json.dumps(_versions_record(referenced), indent=2, sort_keys=True) + "\n"
    )
    shutil.copyfile(PIPELINE_RUNTIME, version / "model.py")
    for companion in RUNTIME_COMPANIONS:
        shutil.copyfile(PIPELINE_RUNTIME.with_name(companion),
                        version / f"triton_builder_{companion}")
    write_samples(directory, spec.warmup)
    write_config(build_config(spec), directory)


class _staging:  # noqa: N801 - used as a context manager, reads like contextlib's
    """A temporary directory beside ``root`` that replaces ``root`` only if the block succeeds.

    The old repository is moved aside, the new one moved in, then the old one deleted; if the
    second move fails the old one is moved back. Parents created for the build are removed
    again when it fails.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.created: list[Path] = []
        self.path: Path | None = None

    def __enter__(self) -> Path:
        missing = []
        parent = self.root.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            directory.mkdir()
            self.created.append(directory)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.root.name}.building-",
                                          dir=self.root.parent))
        return self.path

    def __exit__(self, kind, error, traceback) -> None:
        assert self.path is not None
        if kind is not None:
            self._abandon(self.path)
            if isinstance(error, PipelineError):
                return
            if isinstance(error, OSError):
                raise BuildError(f"could not write the model repository: {error}") from error
            return
        try:
            self._replace(self.path)
        except OSError as failure:
            self._abandon(self.path)
            raise BuildError(f"could not move the model repository into place: {failure}") \
                from failure

    def _replace(self, staged: Path) -> None:
        if self.root.is_symlink() or self.root.is_file():
            raise BuildError(f"{self.root} exists and is not a directory")
        old = None
        if self.root.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.root.name}.old-", dir=self.root.parent))
            old.rmdir()
            os.rename(self.root, old)
        try:
            os.rename(staged, self.root)
        except OSError:
            if old is not None:
                os.rename(old, self.root)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _abandon(self, staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)
        for directory in reversed(self.created):
            try:
                directory.rmdir()
            except OSError:
                break
