"""Choosing torch (and the packages built per CUDA version) for the release an image runs on.

:func:`resolve_cuda_packages` replaces the builder's own torch pin by a build for the release's
CUDA (:mod:`.choice`), read from the wheels' own metadata (:mod:`.wheel_metadata`).
"""

from builder.environment.torch_for_cuda.choice import (
    PICKLE_SOURCE,
    PYTHON_MODEL_SOURCE,
    PYTORCH_INDEX,
    CudaChoice,
    CudaResolution,
    resolve_cuda_packages,
)

__all__ = ["PICKLE_SOURCE", "PYTHON_MODEL_SOURCE", "PYTORCH_INDEX", "CudaChoice", "CudaResolution",
           "resolve_cuda_packages"]
