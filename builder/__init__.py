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
from builder.operators import ModelOp
from builder.pipeline import Pipeline, pipe
from builder.pipeline_image import build_docker_image
from builder.repository import BuildResult, build_pipeline_model
from builder.signature import Array, List, TensorSpec

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
