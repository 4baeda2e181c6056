"""Triton Builder: turn a data pipeline into an NVIDIA Triton Inference Server deployment.

The public face: write a pipeline (``pipe``, ``ModelOp``, ``vectorized``, ``rejects`` and
``InputError`` for input an operator refuses), build it
(``build_pipeline_model``, ``build_docker_image``, ``build_image_from_repository``; each
stage's options: ``BaseOptions``, ``BridgeOptions``, ``EnvironmentOptions``, ``ImageOptions``,
``VerifyOptions``), call what is served (``Client``,
``TritonRemoteModel``), and catch ``TritonBuilderError`` — every failure of ours derives from
it, beside its built-in category.
The stage packages (``pipeline``, ``base``, ``bridge``, ``repository``, ``environment``,
``image``, ``verify``, ``push``) hold the rest.
"""

from builder.base import BaseOptions
from builder.base.releases import UnsupportedCudaError
from builder.bridge import BridgeOptions
from builder.client import (
    AsyncClient,
    AsyncTritonRemoteModel,
    Client,
    RemoteInputError,
    RemoteModelError,
    RemoteTimeoutError,
    ServerUnavailableError,
    TritonRemoteModel,
)
from builder.engine import EngineError
from builder.engine.image_build import ImageBuildError
from builder.engine.reference import InvalidReferenceError
from builder.environment import EnvironmentOptions, requires
from builder.environment.errors import EnvironmentBuildError
from builder.errors import (
    BuildError,
    ExportError,
    InputError,
    OperatorError,
    PipelineError,
    RejectedInputError,
    SerializationError,
    SignatureError,
    TritonBuilderError,
    TuneError,
)
from builder.image import ImageOptions
from builder.job import (
    BuildOptions,
    ImageBuild,
    RepositoryOptions,
    build_docker_image,
    build_image_from_repository,
)
from builder.pipeline import (
    Array,
    List,
    ModelOp,
    Pipeline,
    TensorSpec,
    pipe,
    rejects,
    vectorized,
)
from builder.push import PushError
from builder.repository import BuildResult, build_pipeline_model
from builder.tune import Tuning, tune
from builder.verify import VerifyOptions
from builder.verify.verification import NothingToVerifyError, VerificationError

__all__ = [
    "Array",
    "AsyncClient",
    "AsyncTritonRemoteModel",
    "BaseOptions",
    "BridgeOptions",
    "BuildError",
    "BuildOptions",
    "BuildResult",
    "Client",
    "EngineError",
    "EnvironmentBuildError",
    "EnvironmentOptions",
    "ExportError",
    "ImageBuild",
    "ImageBuildError",
    "ImageOptions",
    "InputError",
    "InvalidReferenceError",
    "List",
    "ModelOp",
    "NothingToVerifyError",
    "OperatorError",
    "Pipeline",
    "PipelineError",
    "PushError",
    "RejectedInputError",
    "RemoteInputError",
    "RemoteModelError",
    "RemoteTimeoutError",
    "RepositoryOptions",
    "SerializationError",
    "ServerUnavailableError",
    "SignatureError",
    "TensorSpec",
    "TritonBuilderError",
    "TritonRemoteModel",
    "TuneError",
    "Tuning",
    "UnsupportedCudaError",
    "VerificationError",
    "VerifyOptions",
    "build_docker_image",
    "build_image_from_repository",
    "build_pipeline_model",
    "pipe",
    "rejects",
    "requires",
    "tune",
    "vectorized",
]
