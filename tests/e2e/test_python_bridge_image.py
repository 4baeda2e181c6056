"""The bridge end to end: a pipeline written on this Python served by a Triton whose Python differs.

No NGC release can be pulled here, so the CPU base on Debian trixie (Python 3.13, Triton 2.51
from the ``nvidia-pytriton`` wheel) stands in for one: its own stub is Python 3.13, this builder
is Python 3.11. Every image is verified by ``build_docker_image`` itself — gRPC and HTTP answers
compared with the in-process pipeline — before it is tagged. The interpreter the environment
carries comes from the Debian bookworm OS image of the test bed (Python 3.11, glibc 2.36 <= 2.41),
which stands in for ``python:3.11-slim-trixie`` from Docker Hub.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile

import docker.errors
import pytest

from builder import build_docker_image
from builder.bridge import PythonBridgeError
from builder.bridge.stub_build import compile_stub
from builder.engine.image_files import read_image_files
from builder.image.sbom import SBOM_PATH
from tests.e2e.test_custom_operator import TEXTS, user_pipeline
from tests.e2e.test_stub_build import SOURCES, needs_sources
from tests.support.example_inputs import EXAMPLES
from tests.support.stub_digest import placed_stub_sha256

pytestmark = [pytest.mark.slow, pytest.mark.alongside]


@pytest.fixture(scope="module")
def bridged(docker_client, trixie_base_image, os_image):
    """Keyword arguments of a bridged build on the trixie base."""
    if sys.version_info[:2] == (3, 13):
        pytest.skip("this builder is Python 3.13, the trixie base's own: nothing to bridge")
    return {"cuda": "cpu", "base_python": "3.13", "interpreter_image": os_image,
            "client": docker_client}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_serve_through_the_bridge(name, bridged):
    pipeline, inputs = EXAMPLES[name]
    reference = f"triton-builder-test/bridged-{name.replace('_', '-')}:1"
    built = build_docker_image(pipeline, reference, verify_calls=[(x,) for x in inputs[:3]],
                               **bridged)
    try:
        assert built.release.python_version == "3.13"
        assert "pipeline" in built.verification.models
        stub_python = _stub_python(bridged["client"], reference)
        assert stub_python == "{}.{}".format(*sys.version_info[:2])
        if name == "text_embedding":
            _check_sbom(bridged["client"], reference, "pytriton-wheel")
    finally:
        bridged["client"].images.remove(reference, force=True)


@pytest.fixture
def custom_pipeline(tmp_path):
    """The custom operators of ``test_custom_operator_e2e`` (an ONNX model, a python-format one),
    from a module outside the project."""
    with user_pipeline(tmp_path, "bridge") as pipeline:
        yield pipeline


@pytest.mark.parametrize("base", ["bookworm-native", "trixie-bridged"])
def test_custom_operators_and_a_python_format_model_serve_on_both_cpu_bases(
        base, custom_pipeline, bridged, cpu_base_image):
    """``sharpen`` is served in the python format: its model.py needs torch from the
    environment, on the native base as on the bridged one."""
    options = bridged if base == "trixie-bridged" else {"client": bridged["client"]}
    reference = f"triton-builder-test/custom-{base}:1"
    built = build_docker_image(custom_pipeline, reference,
                               verify_calls=[(text,) for text in TEXTS[:4]], **options)
    try:
        assert {"pipeline", "scorer", "sharpen"} <= set(built.verification.models)
    finally:
        bridged["client"].images.remove(reference, force=True)


@needs_sources
def test_a_stub_compiled_against_the_interpreter_image_serves_through_the_bridge(
        bridged, python_source_image, trixie_base_image):
    """The compile route of a bridged image end to end. The trixie base packages no Python
    3.11, so the r24.10 stub is compiled on it against the headers and ``libpython`` of the
    interpreter image — Python 3.11 built from source on glibc 2.31, standing in for
    ``python:3.11-slim-bullseye`` as a 22.12 bridge uses it — whose interpreter the environment
    then carries. Verified over gRPC and HTTP by the build itself."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the interpreter stand-in is Python 3.11")
    pipeline, inputs = EXAMPLES["text_embedding"]
    reference = "triton-builder-test/bridged-compiled-stub:1"
    options = {**bridged, "interpreter_image": python_source_image}
    built = build_docker_image(pipeline, reference, compile_stub=True, triton_sources=SOURCES,
                               verify_calls=[(x,) for x in inputs[:3]], **options)
    client = bridged["client"]
    try:
        assert "pipeline" in built.verification.models
        assert _stub_python(client, reference) == "3.11"
        compiled = compile_stub(client, branch="r24.10", python_version="3.11",
                                build_image_name=trixie_base_image,
                                python_image=python_source_image, sources=SOURCES)
        served = client.containers.run(
            reference, ["python3", "-c", "import hashlib; print(hashlib.sha256(open("
                        "'/models/pipeline/triton_python_backend_stub', 'rb').read())"
                        ".hexdigest())"], remove=True)
        assert served.decode().strip() == placed_stub_sha256(compiled), \
            "the served stub is the compiled one with its RPATH into the environment"
        version = client.containers.run(
            reference, ["/models/pipeline/environment/bin/python3.11", "-c",
                        "import sys; print(sys.version.split()[0])"],
            environment={"LD_LIBRARY_PATH": "/models/pipeline/environment/lib"}, remove=True)
        assert version.decode().strip() == "3.11.2", "the carried interpreter is the image's"
        _check_sbom(client, reference, "compile")
    finally:
        client.images.remove(reference, force=True)


@pytest.mark.alone  # compares the whole engine's images before and after
def test_bridge_off_fails_before_anything_is_built(bridged, tmp_path, monkeypatch):
    pipeline, inputs = EXAMPLES["text_embedding"]
    client = bridged["client"]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    images = {image.id for image in client.images.list(all=True)}
    with pytest.raises(PythonBridgeError) as refused:
        build_docker_image(pipeline, "triton-builder-test/bridge-off:1", **bridged, bridge=False)
    message = str(refused.value)
    python = "{}.{}".format(*sys.version_info[:2])
    assert "bridge is turned off" in message and "Python 3.13" in message
    assert f"pickled by Python {python}" in message and "through the bridge on CUDA" in message
    assert {image.id for image in client.images.list(all=True)} == images
    assert not list(tmp_path.iterdir()), "nothing may be written"
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get("triton-builder-test/bridge-off:1")


def _stub_python(client, image: str) -> str:
    """The libpython the stub in the pipeline's model directory links."""
    output = client.containers.run(
        image, ["python3", "-c", "import re; data = open('/models/pipeline/"
                "triton_python_backend_stub', 'rb').read(); print(re.search(rb'libpython"
                "(3\\.\\d+)\\.so', data).group(1).decode())"], remove=True)
    return output.decode().strip()



def _check_sbom(client, image: str, route: str) -> None:
    """The bill of materials names the stub the image carries (its sha256) and the interpreter
    the environment carries (this builder's Python, as the interpreter image has it)."""
    stub_path = "/models/pipeline/triton_python_backend_stub"
    files = read_image_files(client, image, [SBOM_PATH, stub_path])
    components = {c["bom-ref"]: c for c in json.loads(files[SBOM_PATH])["components"]}
    stub = components["python-backend-stub"]
    assert {"name": "triton-builder:stub-route", "value": route} in stub["properties"]
    assert stub["hashes"] == [{"alg": "SHA-256",
                               "content": hashlib.sha256(files[stub_path]).hexdigest()}]
    interpreter = components["carried-interpreter"]
    assert interpreter["version"].startswith("{}.{}.".format(*sys.version_info[:2]))
