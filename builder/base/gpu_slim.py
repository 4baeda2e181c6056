"""The slim GPU base: NGC's server without NGC's image.

The ``nvidia-pytriton`` wheel's Triton 2.51 is a GPU build: ``libtritonserver`` links the
wheel's own CUDA 12.6 runtime (``libcudart-*.so.12.6.77``), the python backend carries the CUDA
IPC and CUDA memory-pool transfer code, and the wheel has a stub for every Python from 3.8 to
3.13. The NVIDIA container runtime brings the driver (``docker run --gpus=all``), and the python
models run in stub processes whose CUDA is their environment's own (torch's, onnxruntime-gpu's,
from NVIDIA's wheels). So this base is the Debian OS image with that server, our Python-based
onnxruntime backend and the variables the container runtime reads — about 150 MB over the OS,
where ``nvcr.io/nvidia/tritonserver:24.10-py3`` is over 15 GB — and the CUDA libraries come with
the environment, for the CUDA version the user asked for.

Unlike the CPU base it installs no Python packages: numpy and onnxruntime(-gpu) are the
environment's, which every python and ONNX model of a slim image runs in. The OS image's Python
is the builder's (:func:`builder.base.os_choice.os_image_for`: ``python:X.Y-slim-bookworm``, or the
image ``triton-builder base os`` made), so the wheel's
stub for that Python serves natively. Built once per content, like the CPU base.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import docker

from builder.base.cpu import base_labels, base_os_image_id
from builder.base.os_choice import os_image_for
from builder.cache import content_hash
from builder.engine.dockerfile import render, template_source
from builder.engine.image_build import BuiltImage, build_image, find_built
from builder.host_lock import image_lock
from builder.progress import Log
from builder.tritonserver.wheel import ONNXRUNTIME_BACKEND, TRITON_VERSION, triton_distribution

TEMPLATE = "tritonserver-gpu-slim.Dockerfile.j2"
SLIM_SERVER_CUDA = "12.6"
"""The CUDA runtime the wheel's server links: ``nvidia_pytriton.libs/libcudart-*.so.12.6.77`` of
``nvidia-pytriton`` 0.7.0 (REFERENCE.md, "The Triton in the nvidia-pytriton wheel is a GPU
build"; :attr:`builder.tritonserver.wheel.TritonDistribution.cuda_runtime` reads it)."""

_CHECK_PYTHON = (
    "import sys; v = '%d.%d' % sys.version_info[:2]; "
    "sys.exit(0 if v == '{0}' else 'the base OS image has Python ' + v + ', the slim GPU base "
    "is for Python {0} (the pipeline is pickled by it): pick an OS image with Python {0}')"
)


def slim_base_tag(python_version: str) -> str:
    return f"triton-builder/tritonserver-gpu-slim:{TRITON_VERSION}-py{python_version}"


def build_slim_base(
    client: docker.DockerClient,
    python_version: str,
    *,
    os_image: str | None = None,
    tag: str | None = None,
    rebuild: bool = False,
    on_log: Log | None = None,
) -> BuiltImage:
    """Build (or reuse) the slim GPU base for ``python_version`` and return it.

    ``rebuild`` builds it from scratch: no content-hash reuse, no layer cache. The look for
    a built one and the build hold the tag's lock (:func:`builder.host_lock.image_lock`), as the CPU
    base's do.
    """
    os_image = os_image or os_image_for(client, python_version)
    tag = tag or slim_base_tag(python_version)
    os_image_id = base_os_image_id(client, os_image)
    distribution = triton_distribution()
    dockerfile = render(TEMPLATE, os_image=os_image, triton_version=TRITON_VERSION,
                        server_cuda=SLIM_SERVER_CUDA,
                        check_python=_CHECK_PYTHON.format(python_version))
    digest = content_hash(dockerfile, template_source(TEMPLATE), os_image_id, python_version,
                          distribution.root.name, ONNXRUNTIME_BACKEND.read_text())
    with image_lock(tag):
        cached = None if rebuild else find_built(client, tag, digest)
        if cached is not None:
            return cached
        with tempfile.TemporaryDirectory(prefix="tritonserver-gpu-slim-") as workdir:
            context = Path(workdir)
            (context / "Dockerfile").write_text(dockerfile)
            distribution.install_layout(context / "tritonserver", python_version)
            labels = base_labels("tritonserver-gpu-slim", digest, python_version, os_image,
                                 os_image_id, {"ai.triton-builder.server-cuda": SLIM_SERVER_CUDA})
            return build_image(client, context, [tag], labels=labels, nocache=rebuild,
                               on_log=on_log)
