"""The base: which ``nvcr.io/nvidia/tritonserver`` release serves a CUDA version (and
with which Python), and the image found, pulled or — for the CPU base — built here."""

from builder.base.ensure import (
    BaseImageUnavailableError,
    ensure_base_image,
    pin_platform_variant,
    platform_image,
)
from builder.base.releases import BaseOptions, Release, UnsupportedCudaError, resolve

__all__ = [
    "BaseImageUnavailableError",
    "BaseOptions",
    "Release",
    "UnsupportedCudaError",
    "ensure_base_image",
    "pin_platform_variant",
    "platform_image",
    "resolve",
]
