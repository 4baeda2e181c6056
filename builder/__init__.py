"""Triton Builder: turn a data pipeline into an NVIDIA Triton Inference Server deployment."""

from builder.environment import requires
from builder.errors import (
    BuildError,
    ExportError,
    OperatorError,
    PipelineError,
    SerializationError,
    SignatureError,
)
from builder.job import build_docker_image
from builder.pipeline.dsl import Pipeline, pipe
from builder.pipeline.operators import ModelOp
from builder.pipeline.signature import Array, List, TensorSpec
from builder.repository.writer import BuildResult, build_pipeline_model

__all__ = [
    "Array",
    "BuildError",
    "BuildResult",
    "ExportError",
    "List",
    "ModelOp",
    "OperatorError",
    "Pipeline",
    "PipelineError",
    "SerializationError",
    "SignatureError",
    "TensorSpec",
    "build_docker_image",
    "build_pipeline_model",
    "pipe",
    "requires",
]
