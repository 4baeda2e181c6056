"""The compile route: a python backend stub built from python_backend sources in a Docker stage.

This machine reaches no source host, so the sources come from ``../shared/triton-sources`` beside
the repository checkout (``git archive`` tarballs of python_backend, common, core, backend,
pybind11 and dlpack for r24.10 and r22.12); the tests skip, saying so, where it is absent.
Stubs here are built with ``TRITON_ENABLE_GPU=OFF`` (GPU on: ``test_gpu_stub_build.py``, on
CUDA stand-ins) and cached by content.
"""

from __future__ import annotations

import re

import pytest

from builder import build_docker_image
from builder.base.releases import resolve
from builder.bridge import StubBuildError, plan_python
from builder.bridge.stub_build import (
    compile_stub,
    source_archives,
    stub_python,
)
from tests.support.example_inputs import EXAMPLES
from tests.support.paths import TRITON_SOURCES
from tests.support.stub_digest import placed_stub_sha256

pytestmark = pytest.mark.alongside

SOURCES = TRITON_SOURCES
needs_sources = pytest.mark.skipif(
    not (SOURCES / "python_backend-r24.10.tar.gz").is_file(),
    reason=f"no Triton source tarballs at {SOURCES} (../shared/triton-sources beside the "
           f"checkout): the compile route cannot be built offline without them")


@needs_sources
def test_the_sources_of_a_branch_are_found_with_the_pybind11_and_dlpack_it_pins():
    names = [path.name for path in source_archives(SOURCES, "r24.10")]
    assert names == ["python_backend-r24.10.tar.gz", "common-r24.10.tar.gz",
                     "core-r24.10.tar.gz", "backend-r24.10.tar.gz",
                     "pybind11-aa304c9.tar.gz", "dlpack-v0.8.tar.gz"]
    assert [path.name for path in source_archives(SOURCES, "r22.12")][-2:] == [
        "pybind11-v2.10.4.tar.gz", "dlpack-v0.7.tar.gz"]
    substituted = [path.name for path in source_archives(SOURCES, "r22.12",
                                                          pinned_pybind11=False)]
    assert substituted[-1] == "dlpack-v0.7.tar.gz" and not any(
        name.startswith("pybind11") for name in substituted)
    with pytest.raises(StubBuildError, match="lacks python_backend-r23.07.tar.gz"):
        source_archives(SOURCES, "r23.07")


@pytest.mark.slow
@needs_sources
def test_a_pipeline_serves_with_a_stub_compiled_from_r24_10(docker_client, cpu_base_image):
    """The CPU base is Triton 2.51 (r24.10) with Python 3.11: the compiled stub replaces the
    wheel's in the model directory, and the image is verified over gRPC and HTTP."""
    pipeline, inputs = EXAMPLES["text_embedding"]
    reference = "triton-builder-test/compiled-stub:1"
    built = build_docker_image(pipeline, reference, compile_stub=True, triton_sources=SOURCES,
                               verify_calls=[(text,) for text in inputs[:3]],
                               client=docker_client)
    try:
        assert "pipeline" in built.verification.models
        output = docker_client.containers.run(
            reference, ["python3", "-c", "import hashlib; print(hashlib.sha256(open("
                        "'/models/pipeline/triton_python_backend_stub', 'rb').read())"
                        ".hexdigest())"], remove=True)
        compiled = compile_stub(docker_client, branch="r24.10", python_version="3.11",
                                build_image_name=cpu_base_image, sources=SOURCES)
        assert output.decode().strip() == placed_stub_sha256(compiled), \
            "the served stub is the compiled one with its RPATH into the environment"
    finally:
        docker_client.images.remove(reference, force=True)


def r22_12_python_backend(client, glibc_2_31_image: str, python_image: str):
    """r22.12's stub for Python 3.11, compiled on the 22.12 stand-in (glibc 2.31) against the
    interpreter stand-in as a 22.12 bridge compiles it, with the branch's backend library
    beside it: the stub this module checks and the r22.12 python backend that
    ``test_python_backend_generations.py`` loads into the host Triton, compiled once for both
    (cached by content)."""
    return compile_stub(client, branch="r22.12", python_version="3.11",
                        build_image_name=glibc_2_31_image, python_image=python_image,
                        sources=SOURCES, backend=True)


@pytest.mark.slow
@needs_sources
@pytest.mark.parametrize("python, interpreter_image", [
    ("3.11", "python_source_image"), ("3.13", "python_3_13_source_image")])
def test_the_r22_12_stub_compiles_on_glibc_2_31_without_packages_of_its_python(
        python, interpreter_image, docker_client, glibc_2_31_release_image, request):
    """22.12 (CUDA 11.8) is Ubuntu 20.04: glibc 2.31, Python 3.8, no python3.11-dev, CMake 3.16.
    Stand-ins: Debian bullseye (glibc 2.31, no Python 3.11 or 3.13 package) for the release
    image and Python built from Debian's source on bullseye for ``python:X.Y-slim-bullseye``,
    whose headers and libpython the stub is compiled against (as a bridged 22.12 image is; CMake
    from PyPI). r22.12 pins pybind11 2.10, which stops at 3.11: the plan gives 3.13 PyPI's
    2.13.6. The stub cannot be served here (no 22.12 server), so the test stops at the binary:
    it links ``libpythonX.Y``, needs no glibc newer than 2.31 and has no run path baked in."""
    plan = plan_python(resolve("11.8", python_version=python), python, conda=False)
    assert plan.stub.pybind11 == (None if python == "3.11" else "2.13.6")
    python_image = request.getfixturevalue(interpreter_image)
    if python == "3.11":
        stub = r22_12_python_backend(docker_client, glibc_2_31_release_image, python_image)
        assert (stub.parent / "libtriton_python.so").is_file()
    else:
        stub = compile_stub(docker_client, branch="r22.12", python_version=python,
                            build_image_name=glibc_2_31_release_image, python_image=python_image,
                            pybind11=plan.stub.pybind11, sources=SOURCES)
    binary = stub.read_bytes()
    assert stub_python(stub) == python
    assert f"libpython{python}.so.1.0".encode() in binary
    newest = max(tuple(int(part) for part in version.split(b"."))
                 for version in re.findall(rb"GLIBC_(\d+\.\d+(?:\.\d+)?)", binary))
    assert newest <= (2, 31), f"the stub needs glibc {newest}, newer than Ubuntu 20.04's 2.31"
    assert b"/opt/python" not in binary, "the build's Python path leaked into the stub"
