"""The ready gate an image carries: readiness held closed until its pipeline has answered its
examples through Triton's front end (:mod:`builder.runtime.supervisor.ready_gate`, which opens
it). Written here, at build time, from the pipeline model's own configuration.

The gate is :data:`GATE_MODEL`, an ensemble of one step over the pipeline model, the pipeline's
inputs and outputs passed through: a model Triton loads without a process of its own. On disk
its version policy asks for version :data:`CLOSED_VERSION`, which does not exist, so its load
fails at start and the server is not ready; the supervisor then loads :data:`OPEN_CONFIG` (the
same ensemble, any version: ``1/``) and unloads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import BuildError
from builder.pipeline.signature_document import SIGNATURE_PARAMETER
from builder.repository.config_rules import ENSEMBLE_PLATFORM
from builder.repository.model_config import CONFIG_FILE, dumps_config, loads_config
from builder.runtime.supervisor.ready_gate import (
    CLOSED_VERSION,
    GATE_MODEL,
    OPEN_CONFIG,
    READY_GATE_DIR,
    WARM_MODELS,
)

VERSION_NOTE = "1/README"
VERSION_TEXT = ("The ready gate's only version. An ensemble has no files: this one keeps the "
                "directory in the image.\n")

__all__ = ["READY_GATE_DIR", "ready_gate_files"]


def ready_gate_files(repository: str | os.PathLike) -> dict[str, str]:
    """The gate's files (path under :data:`READY_GATE_DIR` → text) for the pipeline models of
    ``repository`` that have warm-up samples and answer once per request (a streaming pipeline,
    decoupled, has no samples); none when there is no such model. The gate stands on the
    first; the supervisor warms each."""
    warm = []
    for path in sorted(Path(repository).glob(f"*/{CONFIG_FILE}")):
        config = loads_config(path.read_text())
        name = config.name or path.parent.name
        if name == GATE_MODEL:
            raise BuildError(f"the model repository has a model named {GATE_MODEL!r}, the "
                             f"name of the image's ready gate: rename it")
        if (SIGNATURE_PARAMETER in config.parameters and config.model_warmup
                and not config.model_transaction_policy.decoupled):
            warm.append((name, config))
    if not warm:
        return {}
    opened = gate_config(*warm[0])
    closed = mc.ModelConfig()
    closed.CopyFrom(opened)
    closed.version_policy.specific.versions.append(CLOSED_VERSION)
    return {f"{GATE_MODEL}/{CONFIG_FILE}": dumps_config(closed, GATE_MODEL),
            f"{GATE_MODEL}/{VERSION_NOTE}": VERSION_TEXT,
            OPEN_CONFIG: json_format.MessageToJson(opened, indent=None),
            WARM_MODELS: json.dumps({"models": [name for name, _ in warm]})}


def gate_config(pipeline: str, config: mc.ModelConfig) -> mc.ModelConfig:
    """An ensemble of one step, ``pipeline``, with its inputs and outputs."""
    gate = mc.ModelConfig(name=GATE_MODEL, platform=ENSEMBLE_PLATFORM,
                          max_batch_size=config.max_batch_size)
    step = gate.ensemble_scheduling.step.add(model_name=pipeline, model_version=-1)
    for tensor in config.input:
        added = gate.input.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                               optional=tensor.optional)
        if tensor.HasField("reshape"):
            added.reshape.CopyFrom(tensor.reshape)
        step.input_map[tensor.name] = tensor.name
    for tensor in config.output:
        added = gate.output.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        if tensor.HasField("reshape"):
            added.reshape.CopyFrom(tensor.reshape)
        step.output_map[tensor.name] = tensor.name
    return gate
