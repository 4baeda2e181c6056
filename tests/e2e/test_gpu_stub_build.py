"""The compile route with ``TRITON_ENABLE_GPU=ON``: each CUDA family's stub, compiled here.

GPU releases compile their stub GPU on, in the Dockerfile stage a real build renders
(``dockerfiles/python-backend-stub.Dockerfile.j2``) on the release image. No NGC image can be
pulled here, so stand-ins take the release image's place in that stage's ``FROM`` — everything
else rendered is the real build's (checked below). Compiling needs no GPU. The stand-ins
(``tests/images/cuda-*-release.Dockerfile``, each saying what it does and does not reproduce):

* 22.12 (CUDA 11.8, Ubuntu 20.04): Debian bookworm + Debian's CUDA 11.8.89; GCC 12 by default,
  which nvcc 11.8 refuses (the stage must find the g++-11 beside it); Boost 1.74 (Ubuntu: 1.71);
  glibc 2.36, not 2.31 (the GPU-off glibc-2.31 test in ``test_stub_build.py`` covers that).
* 24.12 (CUDA 12.6, Ubuntu 24.04): Debian trixie + Debian's CUDA 12.4 (no 12.6 is packaged);
  GCC 14 by default, refused by nvcc 12.4 (g++-13 beside it, Ubuntu 24.04's default); Boost 1.83;
  glibc 2.41, whose sinpi/cospi declarations CUDA 12.4's headers contradict (patched in the
  stand-in only: 24.12's glibc 2.39 lacks them).
* 25.11 (CUDA 13.0, Ubuntu 24.04): Debian trixie + CUDA 13.0 from PyPI's wheels; GCC 14 (nvcc
  13.0 accepts it); Boost 1.83.

Each is compiled for Python 3.11 (this builder's), bridged: against the interpreter image
stand-in (Python 3.11 built from Debian's source on bullseye, as ``python:3.11-slim-bullseye``).
The stub must link that interpreter's ``libpython3.11`` and the CUDA runtime.
"""

from __future__ import annotations

import time

import pytest

from builder.base.releases import RELEASES
from builder.bridge import plan_python
from builder.bridge.stub_build import compile_stub, render_stub_dockerfile, stub_python
from tests.support.elf_dynamic import dynamic_section, needed_libraries
from tests.support.paths import TRITON_SOURCES

pytestmark = pytest.mark.alongside

SOURCES = TRITON_SOURCES
ROUTES = [  # release, its stand-in's fixture, the CUDA runtime the stub must link
    ("22.12", "cuda_11_8_release_image", "libcudart.so.11.0"),
    ("24.12", "cuda_12_4_release_image", "libcudart.so.12"),
    ("25.11", "cuda_13_0_release_image", "libcudart.so.13"),
]


def _release(version: str):
    return next(release for release in RELEASES if release.release == version)


@pytest.mark.slow
@pytest.mark.skipif(not (SOURCES / "python_backend-r25.11.tar.gz").is_file(),
                    reason=f"no Triton source tarballs at {SOURCES}")
@pytest.mark.parametrize("version, stand_in, cudart", ROUTES, ids=[r[0] for r in ROUTES])
def test_a_gpu_release_compiles_its_stub_gpu_on_linking_the_carried_python_and_cudart(
        version, stand_in, cudart, docker_client, python_source_image, request):
    release = _release(version)
    plan = plan_python(release, "3.11", conda=False)
    assert release.gpu and plan.bridged and plan.stub.kind == "compile"
    image = request.getfixturevalue(stand_in)
    arguments = dict(branch=str(plan.stub.branch), python_version="3.11",
                     python_image=python_source_image, pybind11=plan.stub.pybind11)
    real = render_stub_dockerfile(build_image_name=release.image, local_sources=True, gpu=True,
                                  **arguments)
    ours = render_stub_dockerfile(build_image_name=image, local_sources=True, gpu=True,
                                  **arguments)
    assert real.replace(release.image, image) == ours, "the stand-in must change the FROM only"
    started = time.monotonic()
    stub = compile_stub(docker_client, build_image_name=image, sources=SOURCES, gpu=release.gpu,
                        **arguments)
    print(f"\n{version} ({plan.stub.branch}) GPU-on stub on {image}: "
          f"{time.monotonic() - started:.0f} s")
    dynamic = dynamic_section(stub)
    needed = needed_libraries(dynamic)
    assert stub_python(stub) == "3.11"
    assert "libpython3.11.so.1.0" in needed, needed
    assert cudart in needed, f"the GPU-on stub links no {cudart}: {needed}"
    assert "RUNPATH" not in dynamic and "RPATH" not in dynamic

