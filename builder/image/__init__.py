"""The image: the serving Dockerfile, the layered build context (environment, repository,
runtime code, each its own layer), the SDK build and the image's labels."""
from builder.image.sbom import PythonRuntime
from builder.image.serving_image import (
    DRAIN_S,
    ImageOptions,
    ServingImage,
    WeightsChoiceError,
    build_serving_image,
)
from builder.image.startup import emulated_allowance

__all__ = [
    "DRAIN_S",
    "ImageOptions",
    "PythonRuntime",
    "ServingImage",
    "WeightsChoiceError",
    "build_serving_image",
    "emulated_allowance",
]
