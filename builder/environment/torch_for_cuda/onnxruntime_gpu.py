"""onnxruntime-gpu for the CUDA of a slim GPU image, and the CUDA libraries it loads.

On the slim GPU base (:func:`builder.base.releases.slim_release`) ONNX model operators run in
our Python-based onnxruntime backend with ONNX Runtime's CUDA execution provider, so the
environment needs an ``onnxruntime-gpu`` built for the image's CUDA major: PyPI's newest (1.31)
is a CUDA 13 build, CUDA 12 needs an older line. Which version is which is read from the
wheels' own metadata, as torch's is (:mod:`.choice`): since 1.21 each declares the CUDA wheels
its provider loads under its ``cuda`` and ``cudnn`` extras (``nvidia-cuda-runtime-cu12~=12.0``;
from 1.28 ``nvidia-cuda-runtime~=13.0``). The newest version whose runtime requirement admits
the requested CUDA is chosen, with those extras, so pip installs the libraries ONNX Runtime
itself names.

Those requirements are ranges (any 12.x); the libraries are pinned to the requested CUDA
release by NVIDIA's own meta-package, ``cuda-toolkit[cudart,cublas,...]==12.6.*`` (every
component of CUDA 12.6's last update; torch 2.13 requires its CUDA the same way), and cuDNN,
which no toolkit release names, to the one torch's build for that CUDA pins (read from that
wheel's metadata by :mod:`.choice`). Where torch is in the environment its own CUDA pins decide
instead — onnxruntime-gpu's ranges admit them, so pip installs one copy of each library for
both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from email.parser import Parser

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.base.releases import Release, version_key
from builder.environment.errors import IndexUnreachableError, SpecError
from builder.environment.index import PackageIndex
from builder.environment.torch_for_cuda.wheel_metadata import (
    WheelFile,
    compatible_wheels,
    list_wheels,
    marker_environment,
    read_metadata,
    ssl_context,
)

ONNXRUNTIME = "onnxruntime"
ONNXRUNTIME_GPU = "onnxruntime-gpu"
ONNXRUNTIME_GPU_EXTRAS = ("cuda", "cudnn")
"""The extras under which onnxruntime-gpu declares the CUDA wheels its provider loads."""
ONNX_OPERATOR_SOURCE = "ONNX model operators (the onnxruntime backend, CUDA execution provider)"
CUDA_TOOLKIT = "cuda-toolkit"
CUDA_TOOLKIT_EXTRAS = ("cublas", "cudart", "cufft", "curand", "nvjitlink", "nvrtc")
"""The components ONNX Runtime's CUDA provider loads: its ``cuda`` extra's runtime, NVRTC,
cuFFT and cuRAND, cuBLAS (which its ``cudnn`` extra's cuDNN requires) and nvJitLink (which
cuFFT requires unpinned: without it pip took 12.9's beside CUDA 12.6's cuFFT)."""
CUDA_LIBRARIES_SOURCE = "the CUDA libraries of onnxruntime-gpu, pinned to the image's CUDA"

_RUNTIME = re.compile(r"^nvidia-cuda-runtime(?:-cu(\d+))?$")


def declared_cuda(metadata: str, python_version: str, machine: str = "x86_64",
                  extras: Sequence[str] = ONNXRUNTIME_GPU_EXTRAS) -> tuple[str | None, str]:
    """The lowest CUDA ``X.Y`` whose runtime a wheel's ``METADATA`` requires with ``extras``
    (``~=12.0`` → ``12.0``, any 12.x from 12.0), and the line that says so; None: none declared
    (onnxruntime-gpu before 1.21)."""
    message = Parser().parsestr(metadata)
    for line in message.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if not _RUNTIME.match(canonicalize_name(requirement.name)):
            continue
        if requirement.marker is not None and not any(
                requirement.marker.evaluate(marker_environment(python_version, machine, extra))
                for extra in ("", *extras)):
            continue
        floors = [s.version for s in requirement.specifier
                  if s.operator in ("~=", "==", "===", ">=")]
        if floors:
            major, minor = (floors[0].split(".") + ["0"])[:2]
            text = line.split(";")[0].strip()
            return f"{int(major)}.{int(minor)}", f"requires {text}"
    return None, "declares no CUDA runtime"


def serves_cuda(declared: str | None, cuda: str) -> bool:
    """Whether a build declaring CUDA ``declared`` (its major, from that minor) serves ``cuda``."""
    if declared is None:
        return False
    own, wanted = version_key(declared), version_key(cuda)
    return own[0] == wanted[0] and own[1] <= wanted[1]


def choose_onnxruntime_gpu(requirement: Requirement, release: Release, python_version: str,
                           platforms: Sequence[str], index: PackageIndex,
                           where: str) -> tuple[str, str, str, str]:
    """The newest ``onnxruntime-gpu`` within ``requirement`` built for ``release``'s CUDA:
    (requirement line with its CUDA extras, wheel file name, declared CUDA, evidence).

    Versions are read newest first; a CUDA-13 line stops nothing (newer versions may serve a
    newer CUDA only), so the scan goes on down to the first that serves, and every version read
    is named when none does.
    """
    context = ssl_context(index.ca_bundle)
    simple = index.index_url or "https://pypi.org/simple"
    try:
        wheels = compatible_wheels(list_wheels(simple, ONNXRUNTIME_GPU, context=context),
                                   python_version, platforms)
    except IndexUnreachableError as error:
        raise SpecError(f"{requirement} ({where}): {simple} could not be reached ({error}): no "
                        f"onnxruntime-gpu can be chosen for CUDA {release.cuda}") from error
    by_version: dict[Version, WheelFile] = {}
    for wheel in wheels:
        by_version.setdefault(wheel.version, wheel)
    wanted = sorted((v for v in by_version
                     if not v.is_prerelease and requirement.specifier.contains(v)), reverse=True)
    seen: list[str] = []
    for version in wanted:
        metadata, how = read_metadata(by_version[version], context=context)
        cuda, evidence = declared_cuda(metadata, python_version)
        seen.append(f"{version}: {f'CUDA {cuda}' if cuda else 'no CUDA declared'}")
        if serves_cuda(cuda, str(release.cuda)):
            extras = ",".join(ONNXRUNTIME_GPU_EXTRAS)
            return (f"{ONNXRUNTIME_GPU}[{extras}]=={version}", by_version[version].filename,
                    str(cuda), f"{evidence} with its '{ONNXRUNTIME_GPU_EXTRAS[0]}' extra, from "
                               f"{how}")
        if cuda is None:
            break  # older versions declare nothing either: none of them can be shown to serve
    raise SpecError(
        f"{requirement} ({where}): no onnxruntime-gpu on {simple} for Python {python_version} "
        f"is built for CUDA {release.cuda} (read, newest first: {'; '.join(seen) or 'none'}). "
        f"Build for a CUDA version one of them serves, loosen the pin, or keep the ONNX model "
        f"operators on the NGC route (cuda='{release.cuda}' without slim), whose onnxruntime "
        f"backend is NGC's own")


def cuda_toolkit_requirement(release: Release) -> str:
    """NVIDIA's meta-package pinning each CUDA library ONNX Runtime loads to ``release``'s CUDA
    (its newest update: ``cuda-toolkit[...]==12.6.*``)."""
    return f"{CUDA_TOOLKIT}[{','.join(CUDA_TOOLKIT_EXTRAS)}]=={release.cuda}.*"
