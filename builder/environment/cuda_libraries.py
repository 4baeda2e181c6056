"""Before an image is built: do the CUDA libraries of an ONNX-on-GPU environment all load?

On the slim GPU base the ONNX model operators run on onnxruntime-gpu, whose CUDA provider needs
NVIDIA's wheels (cuBLAS, cuDNN, cuFFT, cuRAND, the runtime) and, on the GPU, the driver. With
one of those libraries missing ONNX Runtime runs on the CPU with a log line only; the backend
(:mod:`builder.runtime.backends.onnxruntime.model`) refuses that at load time on a GPU. The
libraries the environment carries can be checked on any machine, no GPU needed: its Python,
in the target image, loads them exactly as the backend does, minus the driver — with the same
function the backend runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from builder.environment.errors import EnvironmentBuildError
from builder.environment.target import EnvironmentTarget

IMAGE_BACKEND = "/opt/tritonserver/backends/onnxruntime"
"""Where a Triton image keeps the onnxruntime backend's ``model.py`` (the NGC layout)."""

_PROBE = (
    "import json, sys; sys.path.insert(0, {backend!r}); import model; "
    "print(json.dumps({{'problem': model.cuda_provider_problem(driver=False)}}))"
)


class CudaLibrariesError(EnvironmentBuildError):
    """The environment lacks a library ONNX Runtime's CUDA provider loads."""


def check_cuda_libraries(target: EnvironmentTarget, environment: Path,
                         backend: str = IMAGE_BACKEND) -> None:
    """Load ONNX Runtime's CUDA provider from the unpacked ``environment`` in ``target``'s
    image (the driver aside); raise :class:`CudaLibrariesError` naming what does not load."""
    python = environment / "bin" / "python"
    output = target.run([str(python), "-c", _PROBE.format(backend=backend)],
                        what="load ONNX Runtime's CUDA provider from the environment",
                        binds=[environment.resolve()])
    answer = json.loads(output.strip().splitlines()[-1])
    if answer["problem"]:
        raise CudaLibrariesError(
            f"the environment's ONNX Runtime cannot load its CUDA provider: {answer['problem']}."
            f" The ONNX model operators would run on the CPU on a GPU machine; their "
            f"environment needs onnxruntime-gpu with its 'cuda' and 'cudnn' extras")
